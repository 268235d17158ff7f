//! The cluster under network partitions made with nftables (root only): what a node cut
//! off from the others still serves must not be taken from it.

use std::time::Duration;

use shoal_agent_api::{FileKind, FsRequest, FsResponse, ROOT_INO};
use shoal_tests::fs_api::{Fs, pattern};
use shoal_tests::netfault::{self, Partition};
use shoal_tests::{DevCluster, wait_for};

/// All of `c`'s nodes see each other alive.
fn all_alive(c: &DevCluster) -> bool {
    (1..=c.nodes).all(|i| {
        c.status(i).is_some_and(|s| {
            s["nodes"].as_array().is_some_and(|n| {
                n.len() == c.nodes as usize && n.iter().all(|m| m["state"] == "alive")
            })
        })
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_unlinked_file_survives_its_node_being_cut_off() {
    if !netfault::available() {
        eprintln!("SKIPPED: needs root and nftables");
        return;
    }
    let c = DevCluster::up_with(
        3,
        42,
        &["--meta", "gc_interval_s=1", "--meta", "orphan_grace_s=1"],
    );
    let (leader, _) = wait_for(Duration::from_secs(30), "a metadata leader", || {
        c.meta_leader(1)
    });
    let holder = (1..=3).find(|&i| i != leader).expect("a follower");
    let other = (1..=3)
        .find(|&i| i != leader && i != holder)
        .expect("a third");
    // The holder's client opens a file (a mount's open handle), another node unlinks it.
    let mut held = Fs::connect(&c, holder).await;
    let ino = held.mknod(ROOT_INO, "tmp", FileKind::File).await;
    let data = pattern(3_000, 4);
    held.write(ino, 0, data.clone()).await;
    held.open(ino).await;
    let mut fs = Fs::connect(&c, other).await;
    let id = fs.id();
    let r = fs
        .call(FsRequest::Unlink {
            id,
            parent: ROOT_INO,
            name: "tmp".into(),
        })
        .await;
    assert_eq!(r, FsResponse::Done);
    {
        let _cut = Partition::isolate(c.ip(holder));
        wait_for(Duration::from_secs(20), "the holder seen down", || {
            let s = c.status(leader)?;
            let nodes = s["nodes"].as_array()?;
            nodes
                .iter()
                .any(|n| n["name"] == format!("node{holder}") && n["state"] == "down")
                .then_some(())
        });
        // Far past the orphan grace (1 s), many passes of the leader's collector.
        c.wait_for_rounds(&[leader], "orphan-purge", 8, Duration::from_secs(60));
    }
    wait_for(Duration::from_secs(60), "the partition healed", || {
        all_alive(&c).then_some(())
    });
    // The holder still reads its open file, at the cluster's current state (announcing its
    // handle again, as a mount that reconnected would: a new open of a file with no name
    // left is refused as stale).
    held.reopen(ino).await;
    assert_eq!(
        held.read(ino, 0, 10_000).await,
        data,
        "the open file was purged"
    );
    let orphans_purged = c.log(leader).contains("purged unlinked inodes");
    assert!(
        !orphans_purged,
        "the leader purged while the holder was cut off"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_back_from_a_partition_reads_before_gossip_sees_the_others_again() {
    if !netfault::available() {
        eprintln!("SKIPPED: needs root and nftables");
        return;
    }
    // 2+1 over four nodes: the non-voter is the reader, so its partition costs the
    // metadata group nothing.
    let c = DevCluster::up_with(4, 44, &["--ec", "2+1"]);
    c.wait_layout(1);
    let reader = *c.non_voters(1).first().expect("a non-voter");
    let writer = (1..=4).find(|&i| i != reader).expect("a writer");
    let mut fs = Fs::connect(&c, writer).await;
    let ino = fs.mknod(ROOT_INO, "f", FileKind::File).await;
    let data = pattern(300_000, 7);
    fs.write(ino, 0, data.clone()).await;
    // The reader's replica has the write before the cut (its read below asks no leader).
    c.wait_for_identical_replicas(Duration::from_secs(30));
    {
        let _cut = Partition::isolate(c.ip(reader));
        wait_for(
            Duration::from_secs(30),
            "the others down for the reader",
            || {
                let nodes = c.status(reader)?["nodes"].as_array()?.clone();
                nodes
                    .iter()
                    .filter(|n| n["state"] == "down")
                    .count()
                    .eq(&3)
                    .then_some(())
            },
        );
    }
    // Gossip takes a moment to hear the others again; the holders answer before it does.
    let mut fs = Fs::connect(&c, reader).await;
    assert_eq!(fs.read(ino, 0, 300_000).await, data);
}
