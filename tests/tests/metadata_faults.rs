//! The metadata group under failure, through the agent's filesystem API: the leader killed
//! in the middle of a write workload, and the whole cluster stopped and started again.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use shoal_agent_api::{FileKind, ROOT_INO, Request, Response};
use shoal_tests::fs_api::{Fs, pattern};
use shoal_tests::{DevCluster, wait_for};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_kill_during_writes_loses_no_acknowledged_write() {
    let c = DevCluster::up(5, 35);
    let (leader, _) = wait_for(Duration::from_secs(30), "a metadata leader", || {
        c.meta_leader(1)
    });
    let writer = (1..=5).find(|&i| i != leader).expect("a follower");
    let mut fs = Fs::connect(&c, writer).await;
    let dir = fs.mknod(ROOT_INO, "ckpt", FileKind::Dir).await;
    let mut acknowledged = Vec::new();
    let mut slowest = Duration::ZERO;
    for i in 0..30u8 {
        if i == 10 {
            c.signal(leader, Signal::SIGKILL);
        }
        let started = Instant::now();
        let name = format!("f{i}");
        let ino = fs.mknod(dir, &name, FileKind::File).await;
        // Past the inline limit: stripes, committed after every shard is durable.
        let data = pattern(300_000, i);
        assert_eq!(fs.write(ino, 0, data.clone()).await, 300_000);
        slowest = slowest.max(started.elapsed());
        acknowledged.push((name, data));
    }
    eprintln!("slowest create+write across the leader kill: {slowest:?}");
    let reader = (1..=5)
        .find(|&i| i != leader && i != writer)
        .expect("a third node");
    let mut r = Fs::connect(&c, reader).await;
    for (name, data) in &acknowledged {
        let ino = r.lookup(dir, name).await.expect(name);
        r.open(ino).await;
        assert!(
            r.read(ino, 0, 400_000).await == *data,
            "{name} differs after the leader was killed"
        );
    }
    let (new_leader, _) = wait_for(Duration::from_secs(10), "a new leader", || {
        c.meta_leader(reader)
    });
    assert_ne!(new_leader, leader);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_cluster_restart_keeps_namespace_and_data() {
    let c = DevCluster::up(3, 36);
    let small = pattern(5_000, 7);
    let big = pattern(5 << 20, 8);
    {
        let mut fs = Fs::connect(&c, 2).await;
        let dir = fs.mknod(ROOT_INO, "kept", FileKind::Dir).await;
        let s = fs.mknod(dir, "small", FileKind::File).await;
        fs.write(s, 0, small.clone()).await;
        let b = fs.mknod(dir, "big", FileKind::File).await;
        fs.write(b, 0, big.clone()).await;
    }
    c.down();
    c.start();
    let mut fs = Fs::connect(&c, 1).await;
    let dir = fs.lookup(ROOT_INO, "kept").await.expect("dir kept");
    let s = fs.lookup(dir, "small").await.expect("small kept");
    let b = fs.lookup(dir, "big").await.expect("big kept");
    fs.open(b).await;
    assert_eq!(fs.read(s, 0, 10_000).await, small);
    let mut back = Vec::new();
    while back.len() < big.len() {
        back.extend(fs.read(b, back.len() as u64, 1 << 20).await);
    }
    assert!(back == big, "big file differs after a full restart");
    // And the cluster takes new writes.
    let n = fs.mknod(dir, "after", FileKind::File).await;
    assert_eq!(fs.write(n, 0, pattern(100, 9)).await, 100);
}

fn shard_files_of(c: &DevCluster, stripe: &str) -> usize {
    (1..=c.nodes)
        .map(|i| {
            std::fs::read_dir(c.node_dir(i).join("data/store/shards"))
                .map(|d| {
                    d.filter_map(|e| e.ok())
                        .filter(|e| e.file_name().to_string_lossy().starts_with(stripe))
                        .count()
                })
                .unwrap_or(0)
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_never_committed_are_collected_and_committed_ones_kept() {
    let c = DevCluster::up_with(
        3,
        38,
        &[
            // Longer than any commit on a loaded machine (a committed stripe's shards are
            // unknown to a replica until it applies the commit), far below the default.
            "--meta",
            "orphan_shard_grace_s=8",
            "--meta",
            "gc_interval_s=1",
        ],
    );
    let mut fs = Fs::connect(&c, 1).await;
    // A stripe written outside the metadata: what a writer that crashed before its
    // commit leaves behind.
    let orphan = match fs
        .client
        .call(&Request::WriteStripe {
            data: pattern(1 << 20, 1),
            ec: None,
        })
        .await
        .expect("write stripe")
    {
        Response::StripeWritten(r) => r.id.to_string(),
        other => panic!("{other:?}"),
    };
    assert_eq!(shard_files_of(&c, &orphan), 3, "2+1 shards written");
    let ino = fs.mknod(ROOT_INO, "kept", FileKind::File).await;
    let data = pattern(300_000, 2);
    fs.write(ino, 0, data.clone()).await;
    wait_for(Duration::from_secs(30), "orphan shards collected", || {
        (shard_files_of(&c, &orphan) == 0).then_some(())
    });
    assert_eq!(fs.read(ino, 0, 400_000).await, data, "committed data kept");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_added_later_catches_up_from_a_snapshot() {
    let mut c = DevCluster::up_with(3, 37, &["--meta", "snapshot_every=20"]);
    let mut fs = Fs::connect(&c, 1).await;
    let dir = fs.mknod(ROOT_INO, "many", FileKind::Dir).await;
    for i in 0..80 {
        fs.mknod(dir, &format!("f{i}"), FileKind::File).await;
    }
    // The log behind the last snapshot is compacted: a new member needs the snapshot.
    c.nodes = 4;
    c.start();
    let mut late = Fs::connect(&c, 4).await;
    let (ino, _) = wait_for(
        Duration::from_secs(30),
        "node 4 to see the namespace",
        || futures_lookup(&mut late, dir),
    );
    assert!(ino > 0);
    assert!(
        c.log(4).contains("installed a metadata snapshot"),
        "node 4 caught up from a snapshot, not from the log"
    );
    // And it keeps up with new entries afterwards.
    fs.mknod(dir, "after", FileKind::File).await;
    wait_for(
        Duration::from_secs(10),
        "node 4 to apply new entries",
        || {
            let inodes = c.status(4)?["meta"]["inodes"].as_u64()?;
            (inodes >= 83).then_some(())
        },
    );
}

/// `lookup(dir, "f79")` from a sync `wait_for` closure.
fn futures_lookup(fs: &mut Fs, dir: u64) -> Option<u64> {
    tokio::task::block_in_place(|| {
        tokio::runtime::Handle::current().block_on(async { fs.lookup(dir, "f79").await.ok() })
    })
}

fn all_shard_files(c: &DevCluster) -> usize {
    shard_files_of(c, "")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overwritten_truncated_and_deleted_data_frees_its_shards() {
    let c = DevCluster::up_with(
        3,
        39,
        &["--meta", "gc_interval_s=1", "--meta", "orphan_grace_s=1"],
    );
    let mut fs = Fs::connect(&c, 2).await;
    let a = fs.mknod(ROOT_INO, "a", FileKind::File).await;
    let b = fs.mknod(ROOT_INO, "b", FileKind::File).await;
    // Two stripes of 2+1 each (3 shard files per stripe).
    fs.write(a, 0, pattern(4 << 20, 1)).await;
    fs.write(b, 0, pattern(4 << 20, 2)).await;
    assert_eq!(all_shard_files(&c), 4 * 3);
    // Overwrite all of `a`: copy-on-write leaves its old stripes unreferenced.
    fs.write(a, 0, pattern(4 << 20, 3)).await;
    // Truncate `b` to zero and unlink `a`: nothing references any stripe then but the
    // new ones of `a`, which go with `a` once the orphan is purged.
    let id = fs.id();
    let r = fs
        .call(shoal_agent_api::FsRequest::SetAttr {
            id,
            ino: b,
            set: shoal_agent_api::SetAttr {
                size: Some(0),
                ..Default::default()
            },
        })
        .await;
    assert!(matches!(r, shoal_agent_api::FsResponse::Attr(_)), "{r:?}");
    let id = fs.id();
    let r = fs
        .call(shoal_agent_api::FsRequest::Unlink {
            id,
            parent: ROOT_INO,
            name: "a".into(),
        })
        .await;
    assert_eq!(r, shoal_agent_api::FsResponse::Done);
    wait_for(Duration::from_secs(20), "the old stripes freed", || {
        (all_shard_files(&c) <= 2 * 3).then_some(())
    });
    // The unlinked file goes once no mount holds it (after the agents' first 15 s, in
    // which mounts re-announce their open files).
    wait_for(Duration::from_secs(40), "every shard freed", || {
        (all_shard_files(&c) == 0).then_some(())
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_every_agent_loses_nothing_committed() {
    let c = DevCluster::up(3, 40);
    let mut written = Vec::new();
    {
        let mut fs = Fs::connect(&c, 3).await;
        let dir = fs.mknod(ROOT_INO, "crash", FileKind::Dir).await;
        for i in 0..40u8 {
            let ino = fs.mknod(dir, &format!("f{i}"), FileKind::File).await;
            // Small files: inline, so every byte is in the (partly unflushed) metadata.
            let data = pattern(1_000 + i as usize * 100, i);
            fs.write(ino, 0, data.clone()).await;
            written.push((format!("f{i}"), data));
        }
    }
    for i in 1..=3 {
        c.signal(i, Signal::SIGKILL);
    }
    wait_for(Duration::from_secs(10), "every agent gone", || {
        (1..=3).all(|i| c.exited(i)).then_some(())
    });
    c.start();
    let mut fs = Fs::connect(&c, 1).await;
    let dir = fs.lookup(ROOT_INO, "crash").await.expect("dir survives");
    for (name, data) in &written {
        let ino = fs.lookup(dir, name).await.expect(name);
        // Close-to-open, as a mount reads: the open waits for the commit point, and the
        // read answers from this node's replica (a lookup found there needs no barrier).
        fs.open(ino).await;
        assert_eq!(fs.read(ino, 0, 10_000).await, *data, "{name}");
    }
}

/// A learner syncs only one log append in 64 (voters sync every one): a learner that loses
/// the others (a power cut) comes back with a shorter log than the leader heard it
/// acknowledge. Simulated by putting back an older copy of its metadata files while it is
/// down. The leader must send the missing entries again (it takes a shorter follower log
/// for a bug unless openraft's `loosen-follower-log-revert` is on), the learner must end at
/// the leader's state, and the group must go on committing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_learner_that_lost_its_unsynced_appends_catches_up() {
    let c = DevCluster::up(4, 85);
    let learner = *c
        .non_voters(1)
        .first()
        .expect("4 nodes: 3 voters and a learner");
    let (leader, _) = wait_for(Duration::from_secs(30), "a metadata leader", || {
        c.meta_leader(1)
    });
    let mut fs = Fs::connect(&c, leader).await;
    let dir = fs.mknod(ROOT_INO, "d", FileKind::Dir).await;
    for i in 0..20 {
        fs.mknod(dir, &format!("a{i}"), FileKind::File).await;
    }
    c.wait_for_identical_replicas(Duration::from_secs(30));
    // The learner's metadata files as they are now: what a power cut would leave if none
    // of the appends after this point had been synced.
    let meta = c.node_dir(learner).join("data/meta");
    c.stop_agent(learner);
    let old = c.path().join("meta-before");
    std::fs::create_dir_all(&old).expect("mkdir");
    copy_meta(&meta, &old);
    c.respawn_agent(learner);
    for i in 0..100 {
        fs.mknod(dir, &format!("b{i}"), FileKind::File).await;
    }
    // The leader has heard the learner acknowledge all of it.
    c.wait_for_identical_replicas(Duration::from_secs(60));
    c.kill_agent(learner);
    copy_meta(&old, &meta);
    c.respawn_agent(learner);
    for i in 0..20 {
        fs.mknod(dir, &format!("c{i}"), FileKind::File).await;
    }
    let (index, _) = c.wait_for_identical_replicas(Duration::from_secs(60));
    assert!(!c.exited(leader), "the leader is still running");
    assert!(
        c.log(leader).contains("follower log is reverted"),
        "the leader saw the learner's shorter log (else this test tested nothing)"
    );
    let mut l = Fs::connect(&c, learner).await;
    for name in ["a0", "b99", "c19"] {
        assert!(l.lookup(dir, name).await.is_ok(), "{name} on the learner");
    }
    eprintln!("all four replicas at index {index}");
}

/// A voter syncs every append it acknowledges, after a restart too (openraft's first
/// metrics, with an empty membership, once made a restarted voter take itself for a
/// learner that syncs one append in 64: a power cut of a majority after a rolling restart
/// could then lose committed entries).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_voter_syncs_every_append() {
    let c = DevCluster::up(3, 86);
    let (leader, _) = wait_for(Duration::from_secs(30), "a metadata leader", || {
        c.meta_leader(1)
    });
    let voter = (1..=3).find(|&i| i != leader).expect("a follower");
    c.stop_agent(voter);
    c.respawn_agent(voter);
    c.wait_for_identical_replicas(Duration::from_secs(60));
    let count = |name: &str| shoal_tests::metric_sum(&c.metrics(voter), name, "");
    let appends = count("shoal_meta_log_appends_total");
    let mut fs = Fs::connect(&c, leader).await;
    let dir = fs.mknod(ROOT_INO, "d", FileKind::Dir).await;
    // The leader may send a voter that is catching up (its replication backing off after
    // the restart) many entries in one append: create files until the voter has appended
    // often enough to have shown a rule that syncs one append in 64, or give up.
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let mut i = 0;
    let mut added = 0.0;
    while added < 10.0 && std::time::Instant::now() < deadline {
        for _ in 0..20 {
            fs.mknod(dir, &format!("f{i}"), FileKind::File).await;
            i += 1;
        }
        c.wait_for_identical_replicas(Duration::from_secs(60));
        added = count("shoal_meta_log_appends_total") - appends;
    }
    eprintln!("the voter appended {added} times for {i} creates");
    assert!(
        added >= 10.0,
        "the voter appended {added} times for {i} creates: tested nothing"
    );
    assert_eq!(
        count("shoal_meta_log_unsynced_appends_total"),
        0.0,
        "a voter acknowledged appends it had not synced ({added} appends since the restart)"
    );
}

/// Makes a file immutable until dropped (`chattr +i`): even root's writes to it fail, on
/// descriptors opened before too, as on a disk that fails its writes.
struct Immutable(std::path::PathBuf);

impl Immutable {
    fn new(path: std::path::PathBuf) -> Self {
        let ok = std::process::Command::new("chattr")
            .arg("+i")
            .arg(&path)
            .status()
            .expect("run chattr");
        assert!(ok.success(), "chattr +i {}", path.display());
        Immutable(path)
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        let _ = std::process::Command::new("chattr")
            .arg("-i")
            .arg(&self.0)
            .status();
    }
}

/// A voter whose log stops taking writes (its Raft core stops on the error): its status
/// says its metadata member failed and why, the leader replaces it as a voter, and the
/// agent exits non-zero for its supervisor to restart it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_voter_whose_log_fails_is_reported_and_replaced() {
    let c = DevCluster::up(4, 90);
    let (leader, _) = wait_for(Duration::from_secs(30), "a metadata leader", || {
        c.meta_leader(1)
    });
    let learner = *c.non_voters(1).first().expect("4 nodes: a learner");
    let victim = (1..=4)
        .find(|&i| i != leader && i != learner)
        .expect("a follower voter");
    let victim_id = c.node_id(victim);
    let log = c.node_dir(victim).join("data/meta/log");
    let mut segments: Vec<_> = std::fs::read_dir(&log)
        .expect("log dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "wal"))
        .collect();
    segments.sort();
    let _frozen = Immutable::new(segments.pop().expect("an active segment"));
    let mut fs = Fs::connect(&c, leader).await;
    let dir = fs.mknod(ROOT_INO, "d", FileKind::Dir).await;
    for i in 0..5 {
        fs.mknod(dir, &format!("f{i}"), FileKind::File).await;
    }
    let (failed, _) = wait_for(
        Duration::from_secs(30),
        "the victim to report its failure",
        || {
            c.status(victim)?["meta"]["failed"]
                .as_str()
                .map(str::to_owned)
        },
    );
    eprintln!("node {victim} says: {failed}");
    let voters = |i: u8| -> Option<Vec<String>> {
        let s = c.status(i)?;
        Some(
            s["meta"]["voters"]
                .as_array()?
                .iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect(),
        )
    };
    let (now, took) = wait_for(Duration::from_secs(90), "the failed voter replaced", || {
        voters(leader).filter(|v| v.len() == 3 && !v.contains(&victim_id))
    });
    eprintln!("voters {now:?} {took:?} after the failure was seen");
    // The group goes on with its new voters.
    for i in 0..5 {
        fs.mknod(dir, &format!("g{i}"), FileKind::File).await;
    }
    wait_for(
        Duration::from_secs(60),
        "the victim's agent to exit",
        || c.exited(victim).then_some(()),
    );
    assert!(
        c.log(victim).contains("metadata member failed"),
        "the agent said why it exited:\n{}",
        c.log_warnings(victim, 10)
    );
}

/// Copies a member's Raft log (its segment files) and replica from `from` to `to`,
/// replacing what `to` had.
fn copy_meta(from: &std::path::Path, to: &std::path::Path) {
    let (log_from, log_to) = (from.join("log"), to.join("log"));
    if log_to.exists() {
        std::fs::remove_dir_all(&log_to).expect("remove the log");
    }
    std::fs::create_dir_all(&log_to).expect("mkdir");
    for seg in std::fs::read_dir(&log_from).expect("list the log") {
        let seg = seg.expect("segment").path();
        let name = seg.file_name().expect("name");
        std::fs::copy(&seg, log_to.join(name)).expect("copy a segment");
    }
    std::fs::copy(from.join("state.redb"), to.join("state.redb")).expect("copy the replica");
}
