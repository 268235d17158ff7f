//! A node that comes back with an older copy of its data dir (a restored backup) must not
//! vote or acknowledge with the stale Raft state: it sets the state aside, says so, and
//! rejoins with fresh state; nothing acknowledged is lost.

use std::process::Command;
use std::time::Duration;

use shoal_agent_api::{FileKind, ROOT_INO};
use shoal_tests::fs_api::{Fs, pattern};
use shoal_tests::{DevCluster, wait_for};

fn cp_a(from: &std::path::Path, to: &std::path::Path) {
    let ok = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .expect("cp");
    assert!(ok.success(), "cp -a {} {}", from.display(), to.display());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restored_from_an_old_backup_rejoins_with_fresh_state() {
    let c = DevCluster::up(4, 45);
    let (leader, _) = wait_for(Duration::from_secs(30), "a metadata leader", || {
        c.meta_leader(1)
    });
    let voters = |i: u8| -> Vec<String> {
        c.status(i)
            .and_then(|s| {
                s["meta"]["voters"].as_array().map(|v| {
                    v.iter()
                        .filter_map(|x| x.as_str().map(String::from))
                        .collect()
                })
            })
            .unwrap_or_default()
    };
    let (stale, _) = wait_for(
        Duration::from_secs(30),
        "a voter that is not the leader",
        || {
            let v = voters(leader);
            (1..=4).find(|&i| i != leader && v.contains(&c.node_id(i)))
        },
    );
    let stale_id = c.node_id(stale);
    let writer = (1..=4).find(|&i| i != stale).expect("another node");
    let mut fs = Fs::connect(&c, writer).await;
    let dir = fs.mknod(ROOT_INO, "d", FileKind::Dir).await;
    let mut files = Vec::new();
    for i in 0..10u8 {
        let ino = fs.mknod(dir, &format!("before{i}"), FileKind::File).await;
        fs.write(ino, 0, pattern(1000, i)).await;
        files.push((format!("before{i}"), pattern(1000, i)));
    }
    // A backup of the node's data dir, taken while it is stopped.
    c.stop_agent(stale);
    let backup = c.path().join("backup");
    cp_a(&c.node_dir(stale).join("data"), &backup);
    // It runs on: a later life the cluster records, votes and acknowledgements.
    let recorded = || {
        (1..=4)
            .map(|i| {
                c.log(i)
                    .lines()
                    .filter(|l| l.contains("generation recorded") && l.contains(&stale_id))
                    .count()
            })
            .sum::<usize>()
    };
    let before = recorded();
    c.start();
    wait_for(Duration::from_secs(30), "the later life recorded", || {
        (recorded() > before).then_some(())
    });
    for i in 0..20u8 {
        let ino = fs.mknod(dir, &format!("after{i}"), FileKind::File).await;
        fs.write(ino, 0, pattern(2000, i)).await;
        files.push((format!("after{i}"), pattern(2000, i)));
    }
    c.wait_for_identical_replicas(Duration::from_secs(30));
    // Then the disk is restored from the backup.
    c.stop_agent(stale);
    std::fs::remove_dir_all(c.node_dir(stale).join("data")).expect("rm data");
    cp_a(&backup, &c.node_dir(stale).join("data"));
    c.start();
    // The group goes on and the node catches up to exactly the others' state.
    c.wait_for_identical_replicas(Duration::from_secs(60));
    let notice = wait_for(Duration::from_secs(30), "the stale state noticed", || {
        c.status(stale)?["meta"]["notice"]
            .as_str()
            .map(String::from)
    })
    .0;
    assert!(
        notice.contains("older than the cluster's record"),
        "{notice}"
    );
    assert!(c.log(stale).contains("moved aside"));
    let mut on_stale = Fs::connect(&c, stale).await;
    for (name, data) in &files {
        let ino = on_stale.lookup(dir, name).await.expect(name);
        on_stale.open(ino).await;
        assert_eq!(on_stale.read(ino, 0, 10_000).await, *data, "{name}");
    }
    let ino = on_stale
        .mknod(dir, "through-the-rejoined-node", FileKind::File)
        .await;
    on_stale.write(ino, 0, pattern(10, 1)).await;
    c.wait_for_identical_replicas(Duration::from_secs(30));
}
