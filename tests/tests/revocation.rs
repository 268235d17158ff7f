//! Node identity and revocation across real agents: `shoal cert revoke NAME` makes every
//! agent refuse that node's certificate within a stated bound (the `revocations` worker
//! reads the list every second; the commit itself takes milliseconds), its gossip goes
//! unheard so the others see it down, and a certificate issued afterwards for the same node
//! id lets it back in.

use std::time::Duration;

use shoal_tests::{DevCluster, metric_sum, shoal, wait_for};

/// The bound this test holds every agent to: the worker's 1 s refresh plus the commit,
/// with room for this 2-core machine.
const REFUSED_WITHIN: Duration = Duration::from_secs(3);

/// Requests and connections node `i` refused from revoked certificates so far.
fn refusals(c: &DevCluster, i: u8) -> f64 {
    let m = c.metrics(i);
    metric_sum(&m, "shoal_mesh_rpc_requests_refused_total", "revoked")
        + metric_sum(&m, "shoal_mesh_rpc_connections_rejected_total", "handshake")
}

/// Which members node `observer` could ping just now, by name.
fn reachable_from(c: &DevCluster, observer: u8) -> Vec<String> {
    let status = c.status(observer).expect("status");
    let mut names: Vec<String> = status["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .filter(|n| n["rpc_rtt_us"].is_u64())
        .map(|n| n["name"].as_str().unwrap_or("?").to_owned())
        .collect();
    names.sort();
    names
}

/// `shoal cert revoke NAME` through the agent at `socket`.
fn revoke(socket: &std::path::Path, name: &str) -> std::process::Output {
    shoal(&[
        "cert",
        "revoke",
        name,
        "--socket",
        socket.to_str().expect("utf-8"),
    ])
}

fn state_of(c: &DevCluster, observer: u8, name: &str) -> String {
    let status = c.status(observer).expect("status");
    status["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .find(|n| n["name"] == name)
        .and_then(|n| n["state"].as_str())
        .unwrap_or("?")
        .to_owned()
}

#[test]
fn a_revoked_node_is_refused_by_every_agent_and_a_new_certificate_lets_it_back() {
    let c = DevCluster::up(4, 39);
    let others = ["node1", "node2", "node3"];
    wait_for(Duration::from_secs(20), "node4 reaches every agent", || {
        (reachable_from(&c, 4) == others).then_some(())
    });
    let id4 = c.node_id(4);
    let before: Vec<f64> = (1..=3).map(|i| refusals(&c, i)).collect();

    let socket = c.socket(1);
    // A name no member carries is taken for a typo: refused, and nothing is revoked.
    let out = revoke(&socket, "node44");
    assert_eq!(out.status.code(), Some(2), "an unknown name was revoked");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("node1, node2, node3, node4") && said.contains("--force"),
        "{said}"
    );
    assert_eq!(refusals(&c, 1), before[0]);

    let out = revoke(&socket, "node4");
    assert!(
        out.status.success(),
        "revoke: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains(&id4), "{said}");

    // Every agent refuses node4 within the bound: its pings all fail, and each of the
    // others counted a refusal.
    let (_, took) = wait_for(REFUSED_WITHIN, "every agent refuses node4", || {
        let refused_everywhere = (1..=3).all(|i| refusals(&c, i) > before[i as usize - 1]);
        (reachable_from(&c, 4).is_empty() && refused_everywhere).then_some(())
    });
    eprintln!("node4 refused by every agent {took:?} after the revocation");
    // node4's log says so: from its own replica (if the entry was committed there before
    // the others cut it off), or from its peers closing its connections as revoked.
    let (_, told) = wait_for(
        Duration::from_secs(10),
        "node4's log says it is revoked",
        || {
            let log = c.log(4);
            (log.contains("own certificate is revoked")
                || log.contains("refuses this node's certificate as revoked"))
            .then_some(())
        },
    );
    eprintln!("node4 told {told:?} after every agent refused it");
    // Its gossip goes unheard: the others see it down (SWIM's detection bound).
    wait_for(Duration::from_secs(15), "node4 down everywhere", || {
        others
            .iter()
            .enumerate()
            .all(|(i, _)| state_of(&c, i as u8 + 1, "node4") == "down")
            .then_some(())
    });

    // A new key and certificate for the same node (issued after the revocation) lets it
    // back in once its agent restarts with it.
    let ca = c.path().join("ca");
    let tls = c.node_dir(4).join("tls");
    let ip = c.ip(4).to_string();
    let out = shoal(&[
        "cert",
        "issue",
        "--ca-dir",
        ca.to_str().expect("utf-8"),
        "--name",
        "node4",
        "--ip",
        &ip,
        "--node-id",
        &id4,
        "--out",
        tls.to_str().expect("utf-8"),
    ]);
    assert!(
        out.status.success(),
        "re-key: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    c.stop_agent(4);
    c.respawn_agent(4);
    wait_for(
        Duration::from_secs(30),
        "node4 reaches every agent again",
        || (reachable_from(&c, 4) == others).then_some(()),
    );
    assert_eq!(c.node_id(4), id4, "the same node came back");
    c.down();
}
