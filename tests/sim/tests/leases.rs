//! Directory leases on five simulated nodes, through each node's own `Leases`
//! (`agent/src/fs/leases.rs`) on the real metadata group: a holder's answers commit in
//! order and reach every replica, and another node's change in the directory recalls the
//! lease first (`recall.rs`); a holder cut off stops answering within the lease term, the
//! other node breaks its lease after twice the term, and nothing the holder answered lands
//! after that; a power cut of the holder loses only what it had not committed.

mod common;

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use shoal_agent::fs::lease_holder::LEASE_TERM;
use shoal_agent::fs::leases::Leases;
use shoal_agent_api::{FileKind, FsError, FsRequest, FsResponse, Ino, Owner, ROOT_INO};
use shoal_namespace::format::{FileKind as Kind, Owner as NsOwner};
use shoal_namespace::{LeasedChange, Outcome};
use shoal_sim::cluster::{Cluster, Stop, addr};

use common::{NODES, fs, id, member};

fn ip(node: u64) -> IpAddr {
    addr(node).ip()
}

/// Makes directory `name` in the root through node `node`'s fs service.
async fn mkdir(c: &Cluster, node: u64, name: &str) -> Ino {
    match make(c, node, ROOT_INO, name, FileKind::Dir).await {
        FsResponse::Entry(a) | FsResponse::EntryAt { attr: a, .. } => a.ino,
        other => panic!("mkdir {name}: {other:?}"),
    }
}

/// A create through node `node`'s fs service, as a mount sends it, synced.
async fn make(c: &Cluster, node: u64, parent: Ino, name: &str, kind: FileKind) -> FsResponse {
    shoal_sim::file_client::change_synced(&fs(c, node), mknode(parent, name, kind), 9).await
}

/// A mount's create request of mount session 9.
fn mknode(parent: Ino, name: &str, kind: FileKind) -> FsRequest {
    FsRequest::MkNode {
        id: id(9),
        parent,
        name: name.into(),
        kind,
        perm: 0o755,
        owner: Owner { uid: 0, gid: 0 },
        rdev: 0,
        target: None,
    }
}

fn create(name: &str) -> LeasedChange {
    made(name, Kind::File)
}

/// A leased create of `kind` named `name` (its number is the holder's to fill in).
fn made(name: &str, kind: Kind) -> LeasedChange {
    LeasedChange::MkNode {
        ino: 0,
        name: name.into(),
        kind,
        perm: 0o644,
        owner: NsOwner { uid: 1, gid: 1 },
        rdev: 0,
        target: None,
    }
}

/// The names in `dir` as node `node`'s replica has them after a read barrier.
async fn names(c: &Cluster, node: u64, dir: Ino) -> BTreeSet<String> {
    let group = c.live.get(node).expect("node runs");
    group.barrier().await.expect("barrier");
    group
        .store()
        .readdir(dir)
        .expect("readdir")
        .into_iter()
        .map(|e| e.name)
        .collect()
}

/// Node `node`'s own leases (the ones its `meta/recall-lease` endpoint gives back).
fn leases_on(c: &Cluster, node: u64) -> Arc<Leases> {
    fs(c, node).leases().clone()
}

fn entry_ino(response: FsResponse) -> Ino {
    match response {
        FsResponse::Entry(a) | FsResponse::EntryAt { attr: a, .. } => a.ino,
        other => panic!("not an entry: {other:?}"),
    }
}

fn answered(outcome: Result<Outcome, FsError>) -> bool {
    matches!(outcome, Ok(Outcome::Attr(_) | Outcome::Done))
}

#[test]
fn a_holders_answers_commit_in_order_and_reach_every_replica() {
    common::on_five_nodes(
        71,
        // These drive the leases themselves: no writeback commits behind them.
        |c| c.with_writeback(0),
        async |c| {
            let dir = mkdir(c, 1, "d").await;
            let leases = leases_on(c, 1);
            leases.take(dir).await.expect("take").expect("granted");
            for i in 0..40 {
                assert!(answered(leases.answer(dir, create(&format!("f{i}")))));
            }
            assert!(answered(
                leases.answer(dir, LeasedChange::Unlink { name: "f3".into() })
            ));
            let rename = LeasedChange::Rename {
                name: "f4".into(),
                new_dir: dir,
                new_epoch: 0,
                new_name: "g4".into(),
                flags: Default::default(),
            };
            assert!(answered(leases.answer(dir, rename)));
            // Answered from the pending changes, before anything is committed.
            assert!(leases.entry(dir, "g4").is_some_and(|e| e.is_some()));
            assert_eq!(leases.entry(dir, "f3"), Some(None));
            assert!(names(c, 3, dir).await.is_empty(), "nothing committed yet");
            // Another node's change in the leased directory recalls the lease: the holder
            // commits what it answered and gives the lease back, then the change applies.
            let theirs = entry_ino(make(c, 3, dir, "theirs", FileKind::File).await);
            assert_eq!(leases.epoch(dir), None, "given back");
            assert!(!leases.pending());
            assert!(leases.take_failures().is_empty());
            let mut want: BTreeSet<String> = (0..40).map(|i| format!("f{i}")).collect();
            want.remove("f3");
            want.remove("f4");
            want.insert("g4".into());
            want.insert("theirs".into());
            for node in NODES {
                assert_eq!(names(c, node, dir).await, want, "node {node}");
            }
            let group = c.live.get(5).expect("node runs");
            assert_eq!(
                group.store().lookup(dir, "theirs").expect("theirs").ino,
                theirs
            );
        },
    );
}

#[test]
fn a_holder_cut_off_stops_answering_and_nothing_it_answered_lands_after_a_break() {
    common::on_five_nodes(
        72,
        // These drive the leases themselves: no writeback commits behind them.
        |c| c.with_writeback(0),
        async |c| {
            let dir = mkdir(c, 2, "d").await;
            let leases = leases_on(c, 2);
            leases.take(dir).await.expect("take").expect("granted");
            assert!(answered(leases.answer(dir, create("x"))));
            assert!(answered(leases.answer(dir, create("y"))));
            // Node 2 is cut off from every other node before it commits anything.
            for other in NODES.into_iter().filter(|&n| n != 2) {
                c.net.cut(ip(2), ip(other));
                c.net.cut(ip(other), ip(2));
            }
            tokio::time::sleep(LEASE_TERM + Duration::from_secs(1)).await;
            assert!(
                matches!(
                    leases.answer(dir, create("z")),
                    Err(FsError::Unavailable(_))
                ),
                "no answers from a lease past its term"
            );
            // Another node creates one of the same names: its recall goes unanswered, it
            // breaks the lease after twice the term, and its create applies.
            let asked = tokio::time::Instant::now();
            let theirs = entry_ino(make(c, 4, dir, "x", FileKind::Dir).await);
            assert!(
                asked.elapsed() >= LEASE_TERM * 2,
                "broken only after twice the term"
            );
            c.net.heal();
            member(c, 2).await;
            // The holder's batch lands after the break: refused whole, both answers lost.
            leases.flush().await.expect("flush");
            let lost = leases.take_failures();
            assert_eq!(lost.len(), 2, "{lost:?}");
            assert!(lost.iter().all(|l| l.committed == Outcome::LeaseLost));
            assert_eq!(leases.epoch(dir), None, "the broken lease is forgotten");
            for node in NODES {
                assert_eq!(
                    names(c, node, dir).await,
                    BTreeSet::from(["x".to_string()]),
                    "node {node}"
                );
            }
            let group = c.live.get(1).expect("node runs");
            assert_eq!(group.store().lookup(dir, "x").expect("x").ino, theirs);
        },
    );
}

#[test]
fn a_power_cut_of_the_holder_loses_only_what_it_had_not_committed() {
    common::on_five_nodes(
        73,
        // These drive the leases themselves: no writeback commits behind them.
        |c| c.with_writeback(0),
        async |c| {
            let dir = mkdir(c, 3, "d").await;
            let leases = leases_on(c, 3);
            leases.take(dir).await.expect("take").expect("granted");
            for name in ["a", "b", "c"] {
                assert!(answered(leases.answer(dir, create(name))));
            }
            leases.flush().await.expect("flush");
            for name in ["d", "e"] {
                assert!(answered(leases.answer(dir, create(name))));
            }
            drop(leases);
            c.stop(3, Stop::PowerCut).await;
            c.start(3).await.expect("restart");
            member(c, 3).await;
            let committed = BTreeSet::from(["a".into(), "b".into(), "c".into()]);
            for node in NODES {
                assert_eq!(names(c, node, dir).await, committed, "node {node}");
            }
            // The restarted node takes its lease again (a new epoch) and goes on.
            let leases = leases_on(c, 3);
            leases
                .take(dir)
                .await
                .expect("take")
                .expect("granted again");
            assert!(answered(leases.answer(dir, create("d"))));
            leases.flush().await.expect("flush");
            assert!(leases.take_failures().is_empty());
            assert!(names(c, 1, dir).await.contains("d"));
        },
    );
}

/// The index node `node`'s replica has applied.
fn applied(c: &Cluster, node: u64) -> u64 {
    let group = c.live.get(node).expect("node runs");
    let metrics = group.raft.metrics().borrow().clone();
    metrics.last_applied.map_or(0, |l| l.index)
}

#[test]
fn idle_leases_go_back_together_in_one_round() {
    common::on_five_nodes(
        73,
        |c| c.with_writeback(100),
        async |c| {
            let top = mkdir(c, 1, "top").await;
            let leases = leases_on(c, 1);
            leases.take(top).await.expect("take").expect("granted");
            // Directories made under the lease are leased with it, as `cp -a` makes them.
            let mut dirs = vec![top];
            for i in 0..20 {
                match leases.answer(top, made(&format!("d{i}"), Kind::Dir)) {
                    Ok(Outcome::Attr(a)) => dirs.push(a.ino),
                    other => panic!("mkdir d{i}: {other:?}"),
                }
            }
            // The writeback commits them and keeps every lease while it is used lately.
            tokio::time::sleep(Duration::from_millis(500)).await;
            assert!(!leases.pending());
            let held: Vec<Ino> = leases.held().into_iter().map(|(d, _)| d).collect();
            // The root's too: `top` was made under its lease.
            assert!(
                dirs.iter().all(|d| held.contains(d)),
                "kept while used lately"
            );
            let before = applied(c, 1);
            tokio::time::sleep(shoal_agent::fs::leases::IDLE_FOR + Duration::from_secs(1)).await;
            assert!(leases.held().is_empty(), "idle leases given back");
            let group = c.live.get(1).expect("node runs");
            group.barrier().await.expect("barrier");
            for dir in &held {
                assert_eq!(
                    group.store().dir_lease(*dir).expect("lease"),
                    None,
                    "{dir} returned"
                );
            }
            // One round for all (one log entry; a few more may be the cluster's own).
            let entries = applied(c, 1) - before;
            assert!(
                entries <= 3,
                "{entries} log entries to give back {} leases",
                held.len()
            );
            assert!(leases.take_failures().is_empty());
        },
    );
}

#[test]
fn a_take_takes_the_free_subdirectories_in_one_more_round() {
    common::on_five_nodes(
        74,
        |c| c.with_writeback(0),
        async |c| {
            let top = mkdir(c, 1, "top").await;
            let mut subs = Vec::new();
            for i in 0..10 {
                let made = make(c, 1, top, &format!("s{i}"), FileKind::Dir).await;
                subs.push(entry_ino(made));
            }
            make(c, 1, top, "file", FileKind::File).await;
            // Another node works in s0: its lease is not taken from there.
            let theirs = leases_on(c, 3);
            theirs.take(subs[0]).await.expect("take").expect("granted");
            let leases = leases_on(c, 1);
            let before = applied(c, 1);
            leases.take(top).await.expect("take").expect("granted");
            let entries = applied(c, 1) - before;
            assert!(entries <= 3, "{entries} log entries for one take");
            let held: BTreeSet<Ino> = leases.held().into_iter().map(|(d, _)| d).collect();
            let mut want: BTreeSet<Ino> = subs[1..].iter().copied().collect();
            want.insert(top);
            assert_eq!(held, want);
            assert!(theirs.epoch(subs[0]).is_some(), "s0 stays theirs");
            // A take refused (another node holds the directory) takes none of them: that
            // holder's pending rmdir or rename of one would be refused by it.
            let other = mkdir(c, 1, "other").await;
            let sub = entry_ino(make(c, 1, other, "sub", FileKind::Dir).await);
            theirs.take(other).await.expect("take").expect("granted");
            assert_eq!(leases.take(other).await.expect("take"), None);
            assert_eq!(leases.epoch(sub), None, "no subdirectory of a refused take");
            // Held for real: changes in a subdirectory are answered at once.
            assert!(answered(leases.answer(subs[4], create("x"))));
            leases.flush().await.expect("flush");
            assert!(names(c, 2, subs[4]).await.contains("x"));
            assert!(leases.take_failures().is_empty());
        },
    );
}

#[test]
fn a_leased_change_answers_its_directorys_attributes_as_they_commit() {
    common::on_five_nodes(
        75,
        |c| c.with_writeback(100),
        async |c| {
            let dir = mkdir(c, 1, "d").await;
            let service = fs(c, 1);
            let create = mknode(dir, "f", FileKind::File);
            let made = match service.handle(create, None, common::PROTOCOL).await {
                FsResponse::Unsynced(shoal_agent_api::UnsyncedAnswer::EntryIn { attr, parent }) => {
                    assert_eq!(parent.ino, dir);
                    (attr, parent)
                }
                other => panic!("create under the lease: {other:?}"),
            };
            let unlink = FsRequest::Unlink {
                id: id(9),
                parent: dir,
                name: "f".into(),
            };
            let after_unlink = match service.handle(unlink, None, common::PROTOCOL).await {
                FsResponse::Unsynced(shoal_agent_api::UnsyncedAnswer::DoneIn { parent }) => parent,
                other => panic!("unlink under the lease: {other:?}"),
            };
            // An older mount gets the answers it knows.
            let old = mknode(dir, "g", FileKind::Dir);
            let made_g = match service
                .handle(old, None, shoal_agent_api::CREATE_SINCE)
                .await
            {
                FsResponse::Unsynced(shoal_agent_api::UnsyncedAnswer::Entry(a)) => a,
                other => panic!("mkdir for protocol 12: {other:?}"),
            };
            // What each answer said of the directory is what the group applied.
            let group = c.live.get(1).expect("node runs");
            let sync = FsRequest::Sync {
                ino: dir,
                session: 9,
            };
            assert!(matches!(
                service.handle(sync, None, common::PROTOCOL).await,
                FsResponse::Synced { .. }
            ));
            let committed = group.store().getattr(dir).expect("dir");
            assert_eq!(committed.nlink, after_unlink.nlink + 1, "g made since");
            assert_eq!(made.1.nlink, after_unlink.nlink);
            assert!(made.1.mtime <= after_unlink.mtime);
            assert!(after_unlink.mtime <= committed.mtime);
            assert_eq!(committed.mtime, made_g.ctime, "g's make is the last change");
            let f = group.store().getattr(made.0.ino).map(|a| a.nlink);
            assert!(matches!(f, Ok(0) | Err(_)), "f unlinked: {f:?}");
        },
    );
}

#[test]
fn what_a_mount_was_answered_and_lost_reaches_its_change_feed() {
    common::on_five_nodes(
        76,
        |c| c.with_writeback(0),
        async |c| {
            let dir = mkdir(c, 2, "d").await;
            let leases = leases_on(c, 2);
            leases.take(dir).await.expect("take").expect("granted");
            assert!(answered(leases.answer(dir, create("x"))));
            for other in NODES.into_iter().filter(|&n| n != 2) {
                c.net.cut(ip(2), ip(other));
                c.net.cut(ip(other), ip(2));
            }
            tokio::time::sleep(LEASE_TERM + Duration::from_secs(1)).await;
            // Another node breaks the lease and makes the same name.
            make(c, 4, dir, "x", FileKind::Dir).await;
            c.net.heal();
            member(c, 2).await;
            let group = c.live.get(2).expect("node runs");
            // Node 4's mkdir applied here (and in the feed) first.
            group.barrier().await.expect("barrier");
            let feed = &group.changes;
            let (epoch, from) = (feed.epoch(), feed.position());
            // The writeback commits the batch (refused: the lease was broken) and
            // collects the loss: the mount's kernel must drop the name and the
            // directory's attributes it was answered, as for another node's change.
            leases.writeback().await.expect("writeback");
            let batch = feed.read(epoch, from, 12345);
            assert!(batch.names.contains(&(dir, "x".to_string())), "{batch:?}");
            assert!(batch.inodes.contains(&dir), "{batch:?}");
        },
    );
}
