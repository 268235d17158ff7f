//! `shoal ok-to-stop NODE`, the gate for rolling work, on a 6-node 4+2 cluster: yes for
//! any node while all are up; with one node down, no for another holder (its stripes
//! would be left at k shards) and yes for the node already down; no where the metadata
//! group would lose its quorum; an unknown node is an error naming the known ones.

use std::time::Duration;

use serde_json::Value;
use shoal_tests::{DevCluster, shoal, stream_bytes, wait_for, write_fsync};

/// (exit code, the JSON answer) of `shoal ok-to-stop NAME --json` asked of node `i`.
fn ok_to_stop(c: &DevCluster, i: u8, name: &str) -> (i32, Value) {
    let socket = c.socket(i);
    let out = shoal(&[
        "ok-to-stop",
        name,
        "--json",
        "--socket",
        socket.to_str().expect("socket path"),
    ]);
    let code = out.status.code().unwrap_or(-1);
    let json = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
        panic!(
            "ok-to-stop {name}: exit {code}, stdout {:?}, stderr {:?}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (code, json)
}

fn wait_down(c: &DevCluster, observer: u8, id: &str) {
    wait_for(Duration::from_secs(30), "the node seen down", || {
        (c.member(observer, id)?["state"] != "alive").then_some(())
    });
}

#[test]
fn ok_to_stop_says_whether_one_more_stop_keeps_every_stripe_at_k_plus_one() {
    let c = DevCluster::up_with(6, 56, &["--mount", "--failure-domains", "6"]);
    for i in 0..4u64 {
        write_fsync(
            &c.mnt(1).join(format!("f{i}")),
            &stream_bytes(i, 0, 6 << 20),
        )
        .expect("write");
    }
    let non_voters = c.non_voters(1);
    let (a, b) = (non_voters[0], non_voters[1]);
    let voters: Vec<u8> = (1..=6).filter(|i| !non_voters.contains(i)).collect();
    // Asked of a voter that stays up throughout, once it has applied the layout (on a
    // loaded machine a voter can still be catching up seconds after `up`; it then answers
    // that the cluster has no layout yet).
    let obs = voters[1];
    c.wait_layout(obs);
    for i in 1..=6 {
        let (code, r) = ok_to_stop(&c, obs, &format!("node{i}"));
        assert_eq!(code, 0, "all up: node{i} may stop: {r}");
        assert_eq!(r["ok"], true);
        assert!(r["stripes_on_node"].as_u64() > Some(0), "{r}");
    }

    let a_id = c.node_id(a);
    c.kill_agent(a);
    wait_down(&c, obs, &a_id);
    let (code, r) = ok_to_stop(&c, obs, &format!("node{b}"));
    assert_eq!(
        code, 1,
        "one node down under 4+2: another stop leaves k: {r}"
    );
    assert_eq!(r["ok"], false);
    assert!(r["stripes_at_k"].as_u64() > Some(0), "{r}");
    let domains: Vec<&str> = r["domains_at_risk"]
        .as_array()
        .expect("domains")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        domains.contains(&format!("fd{a}").as_str())
            && domains.contains(&format!("fd{b}").as_str()),
        "the down node's and the asked node's domains: {r}"
    );
    // Asked by id, of another node: the same answer.
    let b_id = c.node_id(b);
    let (code, by_id) = ok_to_stop(&c, b, &b_id);
    assert_eq!((code, &by_id["stripes_at_k"]), (1, &r["stripes_at_k"]));
    let (code, r) = ok_to_stop(&c, obs, &format!("node{a}"));
    assert_eq!(code, 0, "a node already down may stay stopped: {r}");

    // A voter down too: stopping another voter would leave one of three.
    let v1_id = c.node_id(voters[0]);
    c.kill_agent(voters[0]);
    wait_down(&c, obs, &v1_id);
    let (code, r) = ok_to_stop(&c, obs, &format!("node{}", voters[2]));
    assert_eq!(code, 1, "{r}");
    assert_eq!(r["voters_alive_after"], 1, "{r}");
    let reasons = r["reasons"].to_string();
    assert!(reasons.contains("metadata group"), "{reasons}");

    let out = shoal(&[
        "ok-to-stop",
        "nope",
        "--socket",
        c.socket(obs).to_str().expect("socket"),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no node \"nope\"") && err.contains(&format!("node{obs}")),
        "{err}"
    );
}
