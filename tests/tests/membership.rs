//! Membership end to end: real agents, real sockets, through the `shoal` CLI.

use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::Value;
use shoal_tests::{DevCluster, metric_sum, shoal, wait_for};

fn states(status: &Value) -> Vec<String> {
    status["nodes"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|n| n["state"].as_str().unwrap_or("?").to_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn state_of(c: &DevCluster, observer: u8, id: &str) -> Option<String> {
    Some(c.member(observer, id)?["state"].as_str()?.to_owned())
}

/// The documented bound (status's `detection_bound_ms`) plus slack for a loaded CI machine.
fn detection_limit(c: &DevCluster) -> Duration {
    let status = c.status(1).expect("status");
    let bound = status["detection_bound_ms"].as_u64().expect("bound");
    Duration::from_millis(bound) + Duration::from_secs(10)
}

#[test]
fn five_agents_form_a_cluster_and_report_every_member() {
    let c = DevCluster::up(5, 21);
    for observer in 1..=5 {
        // Membership converges first; facts (failure domain, capacity, addresses) follow
        // as gossip broadcasts, a moment later on a loaded machine. Each status is one
        // sample: a probe or ping starved of CPU for a moment shows as suspect or as a
        // failed ping, so the sample is taken again until it is whole.
        let (status, _) = wait_for(Duration::from_secs(20), "every member's facts", || {
            let status = c.status(observer)?;
            let complete = status["nodes"].as_array()?.iter().all(|n| {
                !n["failure_domain"].is_null()
                    && !n["rpc_addr"].is_null()
                    && n["state"] == "alive"
                    && (n["is_self"] == true || n["rpc_rtt_us"].is_u64())
            });
            complete.then_some(status)
        });
        let nodes = status["nodes"].as_array().expect("nodes array");
        assert_eq!(nodes.len(), 5, "node{observer} sees {status}");
        assert!(states(&status).iter().all(|s| s == "alive"), "{status}");
        for n in nodes {
            for field in [
                "id",
                "addr",
                "state",
                "failure_domain",
                "agent_version",
                "name",
            ] {
                assert!(!n[field].is_null(), "field {field} missing in {n}");
            }
            assert!(n["capacity_bytes"].as_u64().unwrap_or(0) > 0, "{n}");
            if n["is_self"] == false {
                // The status ping went over authenticated QUIC to every peer.
                assert!(
                    n["rpc_rtt_us"].as_u64().is_some(),
                    "no RPC round trip in {n}"
                );
            }
        }
        // Three failure domains, round robin.
        let mut domains: Vec<&str> = nodes
            .iter()
            .filter_map(|n| n["failure_domain"].as_str())
            .collect();
        domains.sort();
        domains.dedup();
        assert_eq!(domains, ["fd1", "fd2", "fd3"]);
    }
    let (metrics, _) = wait_for(Duration::from_secs(5), "members gauge at 5 alive", || {
        let m = c.metrics(2);
        (metric_sum(&m, "shoal_mesh_members", "state=\"alive\"") == 5.0).then_some(m)
    });
    assert!(metric_sum(&metrics, "shoal_mesh_rpc_requests_total", "system/ping") > 0.0);
    assert!(metric_sum(&metrics, "shoal_mesh_rpc_latency_seconds_count", "") > 0.0);

    // The table form names every node too.
    let (table, _) = wait_for(
        Duration::from_secs(10),
        "the table to show 5/5 alive",
        || {
            let out = shoal(&["status", "--socket", c.socket(1).to_str().expect("path")]);
            assert!(out.status.success());
            let table = String::from_utf8_lossy(&out.stdout).into_owned();
            table.contains("5/5 alive").then_some(table)
        },
    );
    for i in 1..=5 {
        assert!(table.contains(&format!("node{i}")), "{table}");
    }
}

#[test]
fn killed_agent_is_marked_down_then_rejoins_with_same_id() {
    let c = DevCluster::up(5, 22);
    let victim = c.node_id(4);
    let generation = c.member(1, &victim).expect("member")["generation"]
        .as_u64()
        .expect("gen");
    let limit = detection_limit(&c);

    c.signal(4, Signal::SIGKILL);
    let (_, took) = wait_for(limit, "node4 marked down by every survivor", || {
        [1, 2, 3, 5]
            .iter()
            .all(|&o| state_of(&c, o, &victim).as_deref() == Some("down"))
            .then_some(())
    });
    eprintln!("kill -9 detected by all survivors after {took:?} (limit {limit:?})");

    c.start(); // restarts only the missing node
    wait_for(
        Duration::from_secs(30),
        "node4 alive again everywhere",
        || {
            [1, 2, 3, 5]
                .iter()
                .all(|&o| state_of(&c, o, &victim).as_deref() == Some("alive"))
                .then_some(())
        },
    );
    assert_eq!(c.node_id(4), victim, "restart must keep the node id");
    let member = c.member(1, &victim).expect("member");
    assert!(
        member["generation"].as_u64().expect("gen") > generation,
        "{member}"
    );
}

#[test]
fn sigterm_leaves_gracefully() {
    let c = DevCluster::up(4, 23);
    let leaver = c.node_id(2);
    c.signal(2, Signal::SIGTERM);
    wait_for(Duration::from_secs(10), "node2 to exit", || {
        c.exited(2).then_some(())
    });
    assert!(
        !c.socket(2).exists(),
        "a clean stop removes the admin socket"
    );
    // Reported as `left` (announced), never `down` (detected).
    wait_for(Duration::from_secs(10), "node2 reported as left", || {
        [1, 3, 4]
            .iter()
            .all(|&o| state_of(&c, o, &leaver).as_deref() == Some("left"))
            .then_some(())
    });
    assert!(c.log(2).contains("left the cluster"));
}
