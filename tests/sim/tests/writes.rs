//! The file write path (`fs/write.rs`: inline data, stripes, the extent commit and its
//! retries) on five simulated nodes, through each node's `FsService` as a mount calls it:
//! a file that outgrows inline, a write whose inline bytes change under it, a write
//! through a node that is cut off mid-way, one that cannot find enough nodes, and a
//! setattr that rides with a write's commit. After
//! each, the shard stores hold exactly the shards the committed extents name: a write
//! deletes what it will never commit itself (the orphan collector, 40 s away, is not
//! waited for).

mod common;

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::Duration;

use shoal_agent_api::{FsError, FsRequest, FsResponse, Ino, SetAttr, SetTime, Timestamp};
use shoal_sim::cluster::{Cluster, Stop, addr};

use common::{NODES, STRIPE, create, data, file, fs, held, read_all, slots_of, voters, write};

/// Runs `test` on five formed nodes with the production's orphan grace (the simulator's
/// own is short, and a write's patience with stripes is a quarter of it: its first
/// timed-out put would use it all up).
fn on_five_nodes<T>(seed: u64, test: impl AsyncFnOnce(&mut Cluster) -> T) -> T {
    common::on_five_nodes(
        seed,
        |c| c.with_orphan_grace(Duration::from_secs(600)),
        test,
    )
}

/// The shards the committed extents of `files` name, and the shards each running node
/// in `nodes` holds: they must be the same on those nodes.
async fn stores_hold_only_committed(cluster: &Cluster, files: &[Ino], nodes: &[u64]) {
    let group = cluster.live.get(nodes[0]).expect("node runs");
    group.barrier().await.expect("barrier");
    let mut named = BTreeSet::new();
    for &ino in files {
        let file = group.store().file_data(ino).expect("file");
        named.extend(slots_of(file).filter(|(n, _)| nodes.contains(n)));
    }
    let stores = cluster.running_stores();
    let held = held(stores.iter().filter(|(n, _)| nodes.contains(n)));
    assert_eq!(
        held, named,
        "the stores hold the shards the committed extents name, no others"
    );
}

fn ip(id: u64) -> IpAddr {
    addr(id).ip()
}

#[test]
fn a_file_that_outgrows_inline_keeps_its_inline_bytes_ahead_of_its_stripes() {
    on_five_nodes(11, async |c| {
        let node1 = fs(c, 1);
        let ino = create(&node1, "grows").await;
        let head = data(1000, 1);
        assert!(matches!(
            write(&node1, 1, ino, 0, &head).await,
            FsResponse::Attr(a) if a.size == 1000
        ));
        let stored = file(c, 1, ino).await;
        assert_eq!(
            (stored.inline.len(), stored.extents.len()),
            (1000, 0),
            "inline while small"
        );
        // Past a stripe's worth, at an offset that leaves a hole before it.
        let tail = data(STRIPE + 300_000, 2);
        let at = 5000;
        match write(&node1, 1, ino, at, &tail).await {
            FsResponse::Attr(a) => assert_eq!(a.size, at + tail.len() as u64),
            other => panic!("write: {other:?}"),
        }
        let mut expected = head.clone();
        expected.resize(at as usize, 0);
        expected.extend_from_slice(&tail);
        for reader in NODES {
            let got = read_all(c, reader, ino).await;
            assert!(got == expected, "the whole file through node {reader}");
        }
        let stored = file(c, 1, ino).await;
        assert!(
            stored.inline.is_empty(),
            "no inline bytes once it has extents"
        );
        let spans: Vec<(u64, u64)> = stored.extents.iter().map(|e| (e.offset, e.len)).collect();
        assert_eq!(
            spans,
            vec![
                (0, 1000),
                (at, STRIPE as u64),
                (at + STRIPE as u64, 300_000)
            ],
            "the inline bytes in a stripe of their own first, then the write's"
        );
        stores_hold_only_committed(c, &[ino], &NODES).await;
    });
}

#[test]
fn a_write_whose_inline_bytes_change_under_it_carries_the_new_ones() {
    on_five_nodes(12, async |c| {
        let node1 = fs(c, 1);
        let node2 = fs(c, 2);
        let ino = create(&node1, "raced").await;
        let a = vec![b'a'; 100];
        assert!(matches!(
            write(&node1, 1, ino, 0, &a).await,
            FsResponse::Attr(_)
        ));
        // A striped write (it carries the 100 inline bytes over) and, while its shards
        // are being stored, an inline overwrite of the start through another node.
        let big = data(STRIPE / 2, 3);
        let striped = tokio::spawn({
            let node1 = node1.clone();
            let big = big.clone();
            async move { write(&node1, 1, ino, 100, &big).await }
        });
        tokio::time::sleep(Duration::from_millis(1)).await;
        let b = vec![b'b'; 50];
        assert!(matches!(
            write(&node2, 2, ino, 0, &b).await,
            FsResponse::Attr(_)
        ));
        assert!(matches!(
            striped.await.expect("joined"),
            FsResponse::Attr(_)
        ));
        // Whichever committed first, both writes are in the file, each whole.
        let mut expected = b.clone();
        expected.extend_from_slice(&a[50..]);
        expected.extend_from_slice(&big);
        for reader in NODES {
            let got = read_all(c, reader, ino).await;
            assert!(got == expected, "both writes through node {reader}");
        }
        let conflicts = file(c, 1, ino).await;
        assert!(conflicts.inline.is_empty());
        stores_hold_only_committed(c, &[ino], &NODES).await;
    });
}

#[test]
fn a_write_through_two_cut_off_nodes_stalls_then_lands_and_leaves_no_stray_shards() {
    on_five_nodes(13, async |c| {
        let voters = voters(c);
        let writer = voters[0];
        let node = fs(c, writer);
        let ino = create(&node, "stalled").await;
        // The two learners hear nothing and say nothing: still in the layout until
        // membership declares them down. A stripe placed on both stores two shards, too
        // few (k+1 = 3); one placed on one of them is stored degraded. So a write of
        // several stripes fails with some of its stripes stored, and is retried.
        let learners: Vec<u64> = NODES.into_iter().filter(|n| !voters.contains(n)).collect();
        for &l in &learners {
            for &v in &voters {
                c.net.cut(ip(v), ip(l));
                c.net.cut(ip(l), ip(v));
            }
        }
        let bytes = data(4 * STRIPE, 4);
        match write(&node, 1, ino, 0, &bytes).await {
            FsResponse::Attr(a) => assert_eq!(a.size, bytes.len() as u64),
            other => panic!("the write stalls, then lands: {other:?}"),
        }
        let stored = file(c, writer, ino).await;
        assert!(
            stored.extents.iter().all(|e| e
                .stripe
                .shards
                .iter()
                .all(|s| !learners.contains(&s.node.0))),
            "no committed shard on the nodes cut off"
        );
        assert!(read_all(c, voters[2], ino).await == bytes);
        // The stripes the failed attempts stored on the reachable nodes are gone already.
        stores_hold_only_committed(c, &[ino], &voters).await;
        c.net.heal();
    });
}

#[test]
fn a_write_without_enough_nodes_fails_and_leaves_nothing_behind() {
    on_five_nodes(14, async |c| {
        // The two learners stop: the three voters store a 2+2 stripe degraded (k+1).
        let leader = c.leader().expect("leader");
        let voters = voters(c);
        for n in NODES.into_iter().filter(|n| !voters.contains(n)) {
            c.stop(n, Stop::Crash).await;
        }
        let node = fs(c, leader);
        let ino = create(&node, "fails").await;
        let acked = data(STRIPE / 4, 5);
        assert!(
            matches!(write(&node, 1, ino, 0, &acked).await, FsResponse::Attr(_)),
            "with three nodes a stripe is written degraded"
        );
        // One more voter cut off: the metadata keeps its quorum, the stripes have two
        // nodes for k+1 = 3 shards.
        let cut = *voters.iter().find(|&&n| n != leader).expect("a voter");
        for &n in &voters {
            if n != cut {
                c.net.cut(ip(n), ip(cut));
                c.net.cut(ip(cut), ip(n));
            }
        }
        let bytes = data(2 * STRIPE, 6);
        let answer =
            tokio::time::timeout(Duration::from_secs(120), write(&node, 1, ino, 0, &bytes))
                .await
                .expect("the write gives up within its patience");
        assert!(
            matches!(answer, FsResponse::Error(_)),
            "no write with two nodes for a 2+2 stripe: {answer:?}"
        );
        let left: Vec<u64> = voters.iter().copied().filter(|&n| n != cut).collect();
        // The file still holds what was acknowledged before.
        assert!(
            read_all(c, leader, ino).await == acked,
            "the acknowledged bytes are the file's"
        );
        stores_hold_only_committed(c, &[ino], &left).await;
        c.net.heal();
    });
}

/// `WriteThenSet` through node `node` as mount session 1: `data` at `offset`, then `set`.
async fn write_then_set(
    node: &std::sync::Arc<shoal_agent::fs::FsService>,
    id: shoal_agent_api::RequestId,
    ino: Ino,
    offset: u64,
    data: &[u8],
    set: SetAttr,
) -> FsResponse {
    let req = FsRequest::WriteThenSet {
        id,
        ino,
        set,
        offset,
        data: data.to_vec(),
    };
    node.handle(req, None, common::PROTOCOL).await
}

fn at(secs: i64) -> SetTime {
    SetTime::At(Timestamp { secs, nanos: 0 })
}

#[test]
fn a_set_that_rides_with_a_write_lands_after_its_bytes_inline_or_striped_and_once() {
    on_five_nodes(15, async |c| {
        let node1 = fs(c, 1);
        let ino = create(&node1, "copied").await;
        // Inline: the data, then times and mode, in one entry.
        let head = data(100, 6);
        let set = SetAttr {
            perm: Some(0o600),
            atime: Some(at(1_000)),
            mtime: Some(at(1_000)),
            ..SetAttr::default()
        };
        let first = common::id(1);
        match write_then_set(&node1, first, ino, 0, &head, set.clone()).await {
            FsResponse::Attr(a) => {
                assert_eq!((a.size, a.perm, a.mtime.secs), (100, 0o600, 1_000));
            }
            other => panic!("inline write then set: {other:?}"),
        }
        let stored = file(c, 3, ino).await;
        assert_eq!(stored.inline, head);
        assert_eq!(
            (
                stored.attr.perm,
                stored.attr.mtime.secs,
                stored.attr.atime.secs
            ),
            (0o600, 1_000, 1_000),
            "the set landed after the data's own time stamps"
        );
        // A later write stamps the time again; the first request sent once more (a
        // mount's resend after its agent restarted) changes nothing.
        assert!(matches!(
            write(&node1, 1, ino, 100, b"tail").await,
            FsResponse::Attr(_)
        ));
        let stamped = file(c, 1, ino).await.attr.mtime;
        assert!(stamped.secs > 1_000);
        assert!(matches!(
            write_then_set(&node1, first, ino, 0, &head, set).await,
            FsResponse::Attr(_)
        ));
        let again = file(c, 2, ino).await;
        assert_eq!(
            again.attr.mtime, stamped,
            "the resent set was not applied again"
        );
        assert_eq!(again.attr.size, 104);
        // Past inline: the stripes' extent commit, then the set.
        let big = data(STRIPE + 1000, 7);
        let set = SetAttr {
            mtime: Some(at(2_000)),
            uid: Some(42),
            ..SetAttr::default()
        };
        match write_then_set(&node1, common::id(1), ino, 104, &big, set).await {
            FsResponse::Attr(a) => {
                assert_eq!(
                    (a.size, a.uid, a.mtime.secs),
                    (104 + big.len() as u64, 42, 2_000)
                );
            }
            other => panic!("striped write then set: {other:?}"),
        }
        let stored = file(c, 4, ino).await;
        assert!(!stored.extents.is_empty());
        assert_eq!((stored.attr.uid, stored.attr.mtime.secs), (42, 2_000));
        let mut expected = head.clone();
        expected.extend_from_slice(b"tail");
        expected.extend_from_slice(&big);
        assert!(read_all(c, 5, ino).await == expected);
        // A size change does not ride: it is a setattr of its own.
        let truncate = SetAttr {
            size: Some(0),
            ..SetAttr::default()
        };
        assert!(matches!(
            write_then_set(&node1, common::id(1), ino, 0, b"x", truncate).await,
            FsResponse::Error(FsError::Invalid)
        ));
        stores_hold_only_committed(c, &[ino], &NODES).await;
    });
}
