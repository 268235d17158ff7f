//! `shoal ok-to-stop NODE [NODE...]`, the gate for rolling work. On a 6-node 4+2 cluster:
//! yes for any node while all are up, no for two holders stopped together (their stripes
//! would be left at k shards); with one node down, no for another holder and yes for the
//! node already down; no where the metadata group would lose its quorum; an unknown node is
//! an error naming the known ones. On 3 nodes in 2 failure domains: each voter may stop
//! alone, the two voters of one domain not together (the batch a rolling restart stops).

use std::time::Duration;

use serde_json::Value;
use shoal_tests::{DevCluster, shoal, stream_bytes, wait_for, write_fsync};

/// (exit code, the JSON answer) of `shoal ok-to-stop NAME... --json` asked of node `i`.
fn ok_to_stop(c: &DevCluster, i: u8, names: &[&str]) -> (i32, Value) {
    let socket = c.socket(i);
    let mut args = vec!["ok-to-stop"];
    args.extend_from_slice(names);
    args.extend(["--json", "--socket", socket.to_str().expect("socket path")]);
    let out = shoal(&args);
    let code = out.status.code().unwrap_or(-1);
    let json = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
        panic!(
            "ok-to-stop {names:?}: exit {code}, stdout {:?}, stderr {:?}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (code, json)
}

/// The strings of JSON array `v`.
fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
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
        let (code, r) = ok_to_stop(&c, obs, &[&format!("node{i}")]);
        assert_eq!(code, 0, "all up: node{i} may stop: {r}");
        assert_eq!(r["ok"], true);
        assert!(r["stripes_on_nodes"].as_u64() > Some(0), "{r}");
    }
    // Two holders stopped together: every stripe with a shard on each is left at k.
    let (name_a, name_b) = (format!("node{a}"), format!("node{b}"));
    let (code, r) = ok_to_stop(&c, obs, &[&name_a, &name_b]);
    assert_eq!(code, 1, "two of six stopped together under 4+2: {r}");
    assert!(r["stripes_at_k"].as_u64() > Some(0), "{r}");
    assert!(
        r["stripes_at_risk"][0]["stripe"].is_string(),
        "the answer names the stripes: {r}"
    );
    assert_eq!(r["voters_alive_after"], 3, "two non-voters: {r}");
    let nodes: Vec<&str> = r["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .filter_map(|n| n["name"].as_str())
        .collect();
    assert_eq!(nodes, [name_a.as_str(), name_b.as_str()], "{r}");

    let a_id = c.node_id(a);
    c.kill_agent(a);
    wait_down(&c, obs, &a_id);
    let (code, r) = ok_to_stop(&c, obs, &[&format!("node{b}")]);
    assert_eq!(
        code, 1,
        "one node down under 4+2: another stop leaves k: {r}"
    );
    assert_eq!(r["ok"], false);
    assert!(r["stripes_at_k"].as_u64() > Some(0), "{r}");
    let domains = strings(&r["domains_at_risk"]);
    assert!(
        domains.contains(&format!("fd{a}").as_str())
            && domains.contains(&format!("fd{b}").as_str()),
        "the down node's and the asked node's domains: {r}"
    );
    // Asked by id, of another node: the same answer, once that node's membership view
    // has the down node down too (each node answers from its own gossip view; CI once
    // asked b while b still saw a alive, and b answered yes).
    wait_down(&c, b, &a_id);
    let b_id = c.node_id(b);
    let (code, by_id) = ok_to_stop(&c, b, &[&b_id]);
    assert_eq!((code, &by_id["stripes_at_k"]), (1, &r["stripes_at_k"]));
    let (code, r) = ok_to_stop(&c, obs, &[&format!("node{a}")]);
    assert_eq!(code, 0, "a node already down may stay stopped: {r}");

    // A voter down too: stopping another voter would leave one of three.
    let v1_id = c.node_id(voters[0]);
    c.kill_agent(voters[0]);
    wait_down(&c, obs, &v1_id);
    let (code, r) = ok_to_stop(&c, obs, &[&format!("node{}", voters[2])]);
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

#[test]
fn ok_to_stop_of_two_voters_in_one_domain_says_no() {
    // Nodes 1 and 3 in fd1, node 2 in fd2: three members, three voters, two in fd1.
    let c = DevCluster::up_with(3, 150, &["--failure-domains", "2"]);
    wait_for(Duration::from_secs(30), "three voters", || {
        let status = c.status(2)?;
        (status["meta"]["voters"].as_array()?.len() == 3).then_some(())
    });
    c.wait_layout(2);
    for i in 1..=3 {
        let (code, r) = ok_to_stop(&c, 2, &[&format!("node{i}")]);
        assert_eq!(code, 0, "node{i} alone may stop: {r}");
        assert_eq!(r["voters_alive_after"], 2, "{r}");
    }
    // The batch a rolling restart stops: fd1, asked of a node in it and of the other.
    for asked in [1, 2] {
        let (code, r) = ok_to_stop(&c, asked, &["node1", "node3"]);
        assert_eq!(
            code, 1,
            "fd1's two voters together, asked of node{asked}: {r}"
        );
        assert_eq!(r["ok"], false);
        assert_eq!(
            (&r["voters"], &r["voters_alive_after"]),
            (&3.into(), &1.into()),
            "{r}"
        );
        assert_eq!(strings(&r["voters_stopping"]), ["node1", "node3"], "{r}");
        let domains: Vec<&str> = r["nodes"]
            .as_array()
            .expect("nodes")
            .iter()
            .filter_map(|n| n["domain"].as_str())
            .collect();
        assert_eq!(domains, ["fd1", "fd1"], "{r}");
        let reasons = r["reasons"].to_string();
        assert!(
            reasons.contains("keep 1 of 3 voters") && reasons.contains("node1, node3"),
            "{reasons}"
        );
    }
    // The same node twice, by name and by id, is one stop.
    let id1 = c.node_id(1);
    let (code, r) = ok_to_stop(&c, 2, &["node1", &id1]);
    assert_eq!(code, 0, "node1 once: {r}");
    assert_eq!(r["nodes"].as_array().map(Vec::len), Some(1), "{r}");

    // Without --json: the words name the batch and the voters.
    let out = shoal(&[
        "ok-to-stop",
        "node3",
        "node1",
        "--socket",
        c.socket(2).to_str().expect("socket"),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("NOT ok to stop node3 (") && text.contains(" together:"),
        "{text}"
    );
    assert!(
        text.contains("stopping voters node3, node1 together"),
        "{text}"
    );
}
