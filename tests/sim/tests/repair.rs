//! The repair worker (`workers/repair/mod.rs`: its scan, the planner's queue, rebuild and
//! copy, and the compare-and-set commit) on five simulated nodes: a node lost for good
//! (its shards rebuilt onto the others and committed), and a node drained (its shards
//! copied away as they are, then the node marked drained). The real steward, membership,
//! placement and stripes, on virtual time.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use shoal_agent::consensus::Group;
use shoal_agent_api::{FsResponse, Ino};
use shoal_namespace::format::Timestamp;
use shoal_namespace::nodes::NodeChange;
use shoal_namespace::{Command, Outcome, Proposal};
use shoal_placement::{NodeId, NodeState};
use shoal_sim::cluster::Cluster;
use shoal_store::{NodeStore, ShardKey, ShardStore};

use common::{NODES, STRIPE, create, data, file, fs, held, read_all, slots_of, voters, write};

/// Three files of one, two and three stripes through node `through`; their inodes and
/// bytes.
async fn three_files(c: &Cluster, through: u64) -> Vec<(Ino, Vec<u8>)> {
    three_files_named(c, through, "f").await
}

/// The same, named `{prefix}1` to `{prefix}3`.
async fn three_files_named(c: &Cluster, through: u64, prefix: &str) -> Vec<(Ino, Vec<u8>)> {
    let fs = fs(c, through);
    let mut files = Vec::new();
    for n in 1..=3 {
        let ino = create(&fs, &format!("{prefix}{n}")).await;
        let bytes = data(n * STRIPE - 1000, n as u64);
        assert!(matches!(
            write(&fs, 1, ino, 0, &bytes).await,
            FsResponse::Attr(_)
        ));
        files.push((ino, bytes));
    }
    files
}

/// (node, shard) of every slot the files' extents name, as node `id` sees them.
async fn slots(c: &Cluster, id: u64, files: &[(Ino, Vec<u8>)]) -> BTreeSet<(u64, ShardKey)> {
    let mut named = BTreeSet::new();
    for (ino, _) in files {
        named.extend(slots_of(file(c, id, *ino).await));
    }
    named
}

/// A node besides `leader` that holds one of `slots` (the leader's repair worker does
/// the work).
fn holder_besides(slots: &BTreeSet<(u64, ShardKey)>, leader: u64) -> u64 {
    slots
        .iter()
        .map(|(n, _)| *n)
        .find(|&n| n != leader)
        .expect("shards beyond the leader")
}

/// Waits up to `within` until every slot the files name is on a node of `on` (none
/// empty), as node `id` sees it; the slots then.
async fn until_all_slots_on(
    c: &Cluster,
    id: u64,
    files: &[(Ino, Vec<u8>)],
    on: &[u64],
    within: Duration,
) -> BTreeSet<(u64, ShardKey)> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let named = slots(c, id, files).await;
        if named.iter().all(|(n, _)| on.contains(n)) {
            return named;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "slots still off {on:?} after {within:?}: {:?}",
            named
                .iter()
                .filter(|(n, _)| !on.contains(n))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Every named slot's shard is in its node's store, and every file reads back whole.
async fn stored_and_readable(
    c: &Cluster,
    files: &[(Ino, Vec<u8>)],
    named: &BTreeSet<(u64, ShardKey)>,
) {
    let stores = c.running_stores();
    for (node, key) in named {
        let store = stores.get(node).expect("a running node");
        assert!(
            store.list().iter().any(|(k, _)| k == key),
            "node {node} holds the shard {key:?} the record names"
        );
    }
    for reader in c.live.ids() {
        for (ino, bytes) in files {
            assert!(
                read_all(c, reader, *ino).await == *bytes,
                "file {ino} through node {reader}"
            );
        }
    }
}

#[test]
fn a_lost_node_s_shards_are_rebuilt_on_the_others_and_committed() {
    common::on_five_nodes(
        21,
        |c| c,
        async |c| {
            let leader = voters(c)[0];
            let files = three_files(c, leader).await;
            let before = slots(c, leader, &files).await;
            let lost = holder_besides(&before, leader);
            let on_lost = before.iter().filter(|(n, _)| *n == lost).count();
            c.lose(lost).await;
            let left: Vec<u64> = NODES.into_iter().filter(|&n| n != lost).collect();
            // Declared down (seconds), out of the layout after 20 s, then rebuilt.
            let after =
                until_all_slots_on(c, leader, &files, &left, Duration::from_secs(180)).await;
            assert_eq!(after.len(), before.len(), "every slot filled again");
            let moved: Vec<_> = after.difference(&before).collect();
            assert_eq!(moved.len(), on_lost, "only the lost node's slots moved");
            stored_and_readable(c, &files, &after).await;
            let repair = c.live.repair(leader).expect("leader runs");
            assert_eq!(
                repair.repaired_stripes as usize, on_lost,
                "one stripe a slot here"
            );
            let summary = repair.summary.expect("a pass");
            assert_eq!(summary.unreadable, 0);
        },
    );
}

#[test]
fn a_drained_node_s_shards_are_copied_away_and_it_is_marked_drained() {
    common::on_five_nodes(
        22,
        |c| c,
        async |c| {
            let leader = voters(c)[0];
            let files = three_files(c, leader).await;
            let before = slots(c, leader, &files).await;
            let drained = holder_besides(&before, leader);
            let group = c.live.get(leader).expect("leader runs");
            // The steward installs the layout in the metadata a little after forming.
            let mut tries = 0;
            loop {
                let outcome = group
                    .propose_one(Proposal {
                        id: None,
                        now: Timestamp::now(),
                        command: Command::ChangeNode {
                            node: NodeId(drained),
                            change: NodeChange::Drain {
                                stripes: 0,
                                bytes: 0,
                            },
                        },
                    })
                    .await
                    .expect("committed");
                if outcome == Outcome::Done {
                    break;
                }
                tries += 1;
                assert!(tries < 60, "the drain is refused: {outcome:?}");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            let others: Vec<u64> = NODES.into_iter().filter(|&n| n != drained).collect();
            let after =
                until_all_slots_on(c, leader, &files, &others, Duration::from_secs(120)).await;
            assert_eq!(after.len(), before.len());
            stored_and_readable(c, &files, &after).await;
            // The next pass finds nothing left on it: drained.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
            loop {
                let layout = c.live.layout().expect("a layout");
                let state = layout
                    .nodes()
                    .iter()
                    .find(|n| n.id == NodeId(drained))
                    .map(|n| n.state);
                if state == Some(NodeState::Drained) {
                    break;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "node {drained} still {state:?}"
                );
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            let repair = c.live.repair(leader).expect("leader runs");
            assert!(repair.moved_shards > 0, "copied, not rebuilt: {repair:?}");
            assert_eq!(
                repair.repaired_stripes, 0,
                "nothing to rebuild: the node is up"
            );
        },
    );
}

/// (node, shard) of every slot the files' extents name in `group`'s replica as it is
/// (no barrier: the leader's own replica has applied every commit it made).
fn named_in(group: &Group, files: &[(Ino, Vec<u8>)]) -> BTreeSet<(u64, ShardKey)> {
    files
        .iter()
        .flat_map(|(ino, _)| slots_of(group.store().file_data(*ino).expect("file")))
        .collect()
}

#[test]
fn a_leader_shut_down_in_the_middle_of_a_repair_commits_what_it_rebuilt() {
    common::on_five_nodes(
        23,
        |c| c,
        async |c| {
            let leader = voters(c)[0];
            let mut files = three_files(c, leader).await;
            files.extend(three_files_named(c, leader, "g").await);
            let before = slots(c, leader, &files).await;
            let lost = holder_besides(&before, leader);
            c.lose(lost).await;
            let group = c.live.get(leader).expect("leader runs");
            let stores: BTreeMap<u64, Arc<NodeStore>> = c
                .running_stores()
                .into_iter()
                .filter(|(n, _)| *n != lost)
                .collect();
            // The moment a rebuilt shard is stored and not yet committed: the repair worker
            // is in the middle of a unit.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
            loop {
                let stray: Vec<_> = held(&stores)
                    .difference(&named_in(&group, &files))
                    .cloned()
                    .collect();
                if !stray.is_empty() {
                    break;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "no repair began within 120 s"
                );
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            c.shut_down(leader).await;
            let stray: Vec<_> = held(&stores)
                .difference(&named_in(&group, &files))
                .cloned()
                .collect();
            assert!(
                stray.is_empty(),
                "the unit in progress committed what it stored before the leader stopped: {stray:?}"
            );
        },
    );
}

#[test]
fn a_repair_short_of_budget_shows_throttled_on_it_and_still_finishes() {
    // A budget far below what the rebuild wants: its worker waits for it between
    // stripes, and says so, instead of showing busy.
    common::on_five_nodes(
        24,
        |c| c.with_background("256KiB", "64KiB"),
        async |c| {
            let leader = voters(c)[0];
            let files = three_files(c, leader).await;
            let before = slots(c, leader, &files).await;
            let lost = holder_besides(&before, leader);
            c.lose(lost).await;
            let left: Vec<u64> = NODES.into_iter().filter(|&n| n != lost).collect();
            let deadline = tokio::time::Instant::now() + Duration::from_secs(900);
            let mut seen_throttled = false;
            loop {
                let repair = c
                    .live
                    .workers(leader)
                    .expect("leader runs")
                    .into_iter()
                    .find(|w| w.name == "repair")
                    .expect("a repair worker");
                if repair.state == "throttled" {
                    assert_eq!(repair.waiting_for.as_deref(), Some("repair"));
                    seen_throttled = true;
                } else {
                    assert_eq!(repair.waiting_for, None, "{repair:?}");
                }
                let named = slots(c, leader, &files).await;
                if named.iter().all(|(n, _)| left.contains(n)) {
                    stored_and_readable(c, &files, &named).await;
                    break;
                }
                assert!(tokio::time::Instant::now() < deadline, "repair unfinished");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            assert!(seen_throttled, "the repair worker never showed throttled");
        },
    );
}
