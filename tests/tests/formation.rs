//! A new cluster's metadata group: `dev-cluster up` returns once it has formed, and while
//! it has not, requests through a mount fail after `--retry-for` with the reason in the
//! mount's log instead of hanging without a word.

use std::time::Duration;

use shoal_tests::{DevCluster, wait_for};

#[test]
fn dev_cluster_up_returns_with_a_leader_and_a_layout_on_every_node() {
    let c = DevCluster::prepare(3, 180, &[]);
    c.start();
    // At once, without waiting: a node killed from now on no longer keeps the group from
    // forming (every node is expected before it forms).
    for i in 1..=3 {
        let status = c.status(i).expect("status");
        let meta = &status["meta"];
        assert!(
            meta["leader"].is_string(),
            "node{i} knows no leader: {meta}"
        );
        assert!(
            meta["layout_epoch"].is_u64(),
            "node{i} has no layout: {meta}"
        );
    }
}

#[test]
fn a_mount_on_a_cluster_without_metadata_group_fails_with_the_reason() {
    let waiting = "no metadata group yet: 1 of 2 nodes seen; bootstrap_expect = 2";
    // One node of a cluster that expects two: the group never forms.
    let c = DevCluster::prepare(1, 181, &["--meta", "bootstrap_expect=2", "--timeout", "8"]);
    let out = c.run_up();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "up returned without a metadata group"
    );
    assert!(
        stderr.contains(waiting),
        "up did not say what it waits for:\n{stderr}"
    );

    // `up` stopped the node when it gave up; started alone, its status says what it
    // waits for.
    c.respawn_agent(1);
    wait_for(
        Duration::from_secs(30),
        "the status naming the wait",
        || {
            let status = c.status(1)?;
            status["meta"]["notice"]
                .as_str()
                .is_some_and(|n| n.contains(waiting))
                .then_some(())
        },
    );

    let mnt = c.mount_extra(1, &c.path().join("mnt"), &["--retry-for", "3s"]);
    let err = std::fs::write(mnt.path.join("f"), b"never stored").expect_err("write stored");
    assert_eq!(
        err.raw_os_error(),
        Some(nix::errno::Errno::EIO as i32),
        "{err}"
    );
    let log = std::fs::read_to_string(c.node_dir(1).join("extra-mount.log")).expect("log");
    assert!(
        log.lines()
            .any(|l| l.contains(" WARN ") && l.contains(waiting)),
        "the mount log does not name the reason:\n{log}"
    );
}
