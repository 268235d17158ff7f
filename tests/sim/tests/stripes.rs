//! The stripe coordinator (`data::Stripes`: write, read, rebuild, copy) on five simulated
//! nodes: the real placement, erasure coding, shard RPCs and shard stores, with shards
//! lost, rotten or unreadable and nodes down, on virtual time. Each test is one seed of
//! its own; the stripes are never committed, so each test ends well within the orphan
//! sweep's grace (40 s).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use shoal_agent::data::{Rebuild, StripeError, Stripes};
use shoal_agent_api::StripeRecord;
use shoal_disk::SplitMix64;
use shoal_mesh::SimNet;
use shoal_placement::NodeId;
use shoal_sim::cluster::{Cluster, Stop};
use shoal_sim::trace::Trace;
use shoal_store::{MemStore, NodeStore, ShardKey, ShardStore};

const NODES: [u64; 5] = [1, 2, 3, 4, 5];

/// Runs `test` on a formed five-node cluster (2+2 stripes) of `seed`.
fn on_five_nodes<T>(seed: u64, test: impl AsyncFnOnce(&mut Cluster) -> T) -> T {
    shoal_sim::runtime::block_on(seed, async move {
        let mut rng = SplitMix64(seed);
        let mut net_rng = SplitMix64(rng.next_u64());
        let net = SimNet::new(Box::new(move || net_rng.next_u64()));
        let mut cluster = Cluster::new(&NODES, &mut rng, net, Trace::begin());
        cluster.form(Duration::from_secs(60)).await.expect("formed");
        test(&mut cluster).await
    })
}

fn data(len: usize, seed: u64) -> Bytes {
    let mut rng = SplitMix64(seed);
    (0..len).map(|_| rng.next_u64() as u8).collect()
}

fn stripes(cluster: &Cluster, id: u64) -> Arc<Stripes> {
    cluster.live.stripes(id).expect("node runs")
}

/// Node `id`'s shard store.
fn store(cluster: &Cluster, id: u64) -> Arc<NodeStore> {
    cluster.running_stores().remove(&id).expect("node runs")
}

fn mem(store: &NodeStore) -> &MemStore {
    match store {
        NodeStore::Mem(m) => m,
        NodeStore::Disk(_) => panic!("the simulator's stores are in memory"),
    }
}

fn key(record: &StripeRecord, index: u8) -> ShardKey {
    ShardKey {
        stripe: record.id.0,
        index,
    }
}

/// The node slot `index` names.
fn holder(record: &StripeRecord, index: u8) -> u64 {
    record.shards[usize::from(index)].node.0
}

/// A node that holds no shard of `record`.
fn spare(record: &StripeRecord) -> u64 {
    NODES
        .into_iter()
        .find(|n| record.shards.iter().all(|s| s.node.0 != *n))
        .expect("five nodes, four slots")
}

/// Waits until node `observer`'s membership counts `down` as down.
async fn until_seen_down(cluster: &Cluster, observer: u64, down: &[u64]) {
    for _ in 0..600 {
        let seen = cluster.live.members_seen(observer).await;
        if down.iter().all(|d| seen.contains(&format!("{d}:Down"))) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("node {observer} never saw {down:?} down");
}

#[test]
fn a_stripe_reads_back_through_any_node_whole_and_in_ranges_and_with_m_shards_gone() {
    on_five_nodes(1, async |c| {
        let bytes = data(300_000, 1);
        let record = stripes(c, 1)
            .write(bytes.clone(), None)
            .await
            .expect("written");
        assert_eq!(record.shards.len(), 4);
        assert!(
            record.shards.iter().all(|s| s.node != NodeId::NONE),
            "every slot named with five nodes up"
        );
        for reader in NODES {
            let got = stripes(c, reader)
                .read(&record, 0, bytes.len() as u64)
                .await
                .expect("read");
            assert_eq!(got.data, bytes[..], "whole, through node {reader}");
            assert!(!got.decoded, "nothing to decode with every shard there");
            let got = stripes(c, reader)
                .read(&record, 149_990, 20)
                .await
                .expect("read");
            assert_eq!(got.data, bytes[149_990..150_010], "across the data shards");
        }
        // Two shards (m) gone: a data shard and a parity shard.
        for index in [0, 3] {
            let s = store(c, holder(&record, index));
            assert!(s.delete(key(&record, index)).await.expect("delete"));
        }
        let got = stripes(c, 2)
            .read(&record, 0, bytes.len() as u64)
            .await
            .expect("decoded");
        assert_eq!(got.data, bytes[..]);
        assert!(got.decoded);
        assert!(got.bad_shards.contains(&0), "{:?}", got.bad_shards);
    });
}

#[test]
fn a_read_never_returns_a_damaged_shard_it_reads_around_it_and_names_it() {
    on_five_nodes(2, async |c| {
        let bytes = data(200_000, 2);
        let record = stripes(c, 3)
            .write(bytes.clone(), None)
            .await
            .expect("written");
        let rotten = store(c, holder(&record, 0));
        assert!(mem(&rotten).rot(key(&record, 0), 77));
        let unreadable = store(c, holder(&record, 1));
        assert!(mem(&unreadable).make_unreadable(key(&record, 1)));
        for reader in NODES {
            for (offset, len) in [(0, bytes.len() as u64), (50_000, 10), (99_999, 2)] {
                let got = stripes(c, reader)
                    .read(&record, offset, len)
                    .await
                    .expect("read around");
                let range = offset as usize..(offset + len) as usize;
                assert_eq!(
                    got.data,
                    bytes[range.clone()],
                    "{range:?} through node {reader}"
                );
                assert!(got.decoded);
            }
        }
        let got = stripes(c, 4)
            .read(&record, 0, bytes.len() as u64)
            .await
            .expect("read");
        let mut bad = got.bad_shards.clone();
        bad.sort_unstable();
        assert_eq!(bad, vec![0, 1], "both damaged data shards named");
    });
}

#[test]
fn with_more_than_m_shards_gone_a_read_fails_and_never_returns_other_bytes() {
    on_five_nodes(3, async |c| {
        let bytes = data(100_000, 3);
        let record = stripes(c, 1)
            .write(bytes.clone(), None)
            .await
            .expect("written");
        assert!(mem(&store(c, holder(&record, 0))).rot(key(&record, 0), 5));
        assert!(mem(&store(c, holder(&record, 2))).make_unreadable(key(&record, 2)));
        let gone = store(c, holder(&record, 3));
        assert!(gone.delete(key(&record, 3)).await.expect("delete"));
        match stripes(c, 5).read(&record, 0, bytes.len() as u64).await {
            Ok(got) => panic!(
                "three of four shards damaged or gone, yet a read answered (equal: {})",
                got.data == bytes[..]
            ),
            Err(e) => assert!(
                matches!(e, StripeError::Unreadable { .. }),
                "unreadable, not some other failure: {e}"
            ),
        }
    });
}

#[test]
fn rebuild_restores_a_lost_shard_checked_reading_around_a_rotten_source() {
    on_five_nodes(4, async |c| {
        let bytes = data(250_000, 4);
        let record = stripes(c, 2)
            .write(bytes.clone(), None)
            .await
            .expect("written");
        let lost = store(c, holder(&record, 1));
        assert!(lost.delete(key(&record, 1)).await.expect("delete"));
        assert!(mem(&store(c, holder(&record, 0))).rot(key(&record, 0), 9));
        let to = spare(&record);
        let rebuilt = stripes(c, 3)
            .rebuild(
                &record,
                &[Rebuild {
                    index: 1,
                    from: NodeId(holder(&record, 1)),
                    to: NodeId(to),
                }],
                &[],
            )
            .await
            .expect("rebuilt");
        assert!(rebuilt.failed.is_empty(), "{:?}", rebuilt.failed);
        assert_eq!(rebuilt.moves.len(), 1);
        let moved = &rebuilt.moves[0];
        assert_eq!((moved.index, moved.to), (1, NodeId(to)));
        assert_eq!(
            moved.crc32c, record.shards[1].crc32c,
            "the same shard again"
        );
        assert!(
            rebuilt.bad_sources.contains(&0),
            "the rotten source found: {:?}",
            rebuilt.bad_sources
        );
        let stored = store(c, to)
            .get(key(&record, 1), 0, None)
            .await
            .expect("on its target, durable");
        assert_eq!(crc32c::crc32c(&stored), record.shards[1].crc32c);
    });
}

#[test]
fn copy_moves_a_sound_shard_and_leaves_out_a_rotten_one() {
    on_five_nodes(5, async |c| {
        let bytes = data(120_000, 5);
        let record = stripes(c, 4)
            .write(bytes.clone(), None)
            .await
            .expect("written");
        assert!(mem(&store(c, holder(&record, 2))).rot(key(&record, 2), 3));
        let to = spare(&record);
        let copies = [3, 2].map(|index| Rebuild {
            index,
            from: NodeId(holder(&record, index)),
            to: NodeId(to),
        });
        let copied = stripes(c, 1).copy(&record, &copies).await.expect("copied");
        let moved: Vec<u8> = copied.moves.iter().map(|m| m.index).collect();
        assert_eq!(moved, vec![3], "only the sound shard: {copied:?}");
        let target = store(c, to);
        assert!(target.get(key(&record, 3), 0, None).await.is_ok());
        assert!(
            target.get(key(&record, 2), 0, None).await.is_err(),
            "the rotten shard never reaches its target"
        );
    });
}

#[test]
fn a_write_with_two_of_five_nodes_down_is_durable_on_three_and_names_no_node_for_the_fourth() {
    on_five_nodes(6, async |c| {
        c.stop(4, Stop::Crash).await;
        c.stop(5, Stop::PowerCut).await;
        until_seen_down(c, 1, &[4, 5]).await;
        let bytes = data(180_000, 6);
        let record = stripes(c, 1)
            .write(bytes.clone(), None)
            .await
            .expect("a degraded write: k+1 shards durable");
        let empty: Vec<u8> = record
            .shards
            .iter()
            .filter(|s| s.node == NodeId::NONE)
            .map(|s| s.index)
            .collect();
        assert_eq!(empty.len(), 1, "{record:?}");
        for s in record.shards.iter().filter(|s| s.node != NodeId::NONE) {
            let held = store(c, s.node.0)
                .get(key(&record, s.index), 0, None)
                .await
                .expect("durable where the record says");
            assert_eq!(crc32c::crc32c(&held), s.crc32c);
        }
        let got = stripes(c, 3)
            .read(&record, 0, bytes.len() as u64)
            .await
            .expect("read");
        assert_eq!(got.data, bytes[..]);
        // One node more down: fewer live nodes than k+1, the write fails at once.
        c.stop(3, Stop::Crash).await;
        until_seen_down(c, 1, &[3]).await;
        let refused = stripes(c, 1).write(bytes, None).await;
        assert!(
            matches!(refused, Err(StripeError::TooFewNodes { .. })),
            "{refused:?}"
        );
    });
}

#[test]
fn a_store_that_fills_is_left_out_of_new_stripes_once_its_facts_say_so() {
    on_five_nodes(7, async |c| {
        let writer = stripes(c, 1);
        let places_on = async |node: u64| {
            let layout = writer.placement_layout().await.expect("layout");
            layout.eligible_nodes().any(|n| n.id.0 == node)
        };
        assert!(places_on(3).await, "node 3 takes shards at first");
        // No write asks node 3 meanwhile: only its facts can tell node 1.
        c.store_full(3, true);
        let mut waited = Duration::ZERO;
        while places_on(3).await {
            assert!(
                waited < Duration::from_secs(15),
                "node 1 still places on node 3's full store {waited:?} later"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
            waited += Duration::from_millis(100);
        }
        let record = writer.write(data(100_000, 7), None).await.expect("written");
        assert!(
            record
                .shards
                .iter()
                .all(|s| s.node.0 != 3 && s.node != NodeId::NONE),
            "every slot on the four nodes with room: {record:?}"
        );
        c.store_full(3, false);
        let mut waited = Duration::ZERO;
        while !places_on(3).await {
            assert!(
                waited < Duration::from_secs(15),
                "node 3 has room again, yet node 1 leaves it out {waited:?} later"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
            waited += Duration::from_millis(100);
        }
    });
}
