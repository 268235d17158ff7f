//! One run of a scenario: five nodes form the metadata group; clients create names and
//! read them back through every node, and file clients (each a node's mount) create,
//! write and read files, while the family's fault schedule kills, power-cuts, restarts
//! and partitions; then every fault heals and the invariants are checked:
//!
//! - every acknowledged create is there on every node, after any crash of any set of
//!   nodes, power cuts of all of them included;
//! - a read sees every create acknowledged before it began, and nothing never created;
//! - every acknowledged write reads back byte for byte through every node, and a read
//!   returns the bytes of some version of the file no older than the newest
//!   acknowledged before it began (never torn, never stale);
//! - replicas that applied the same index hold the same state (digest);
//! - with the faults healed and every node up, a create through each node completes
//!   within [`LIVENESS`] of simulated time, the shards come to what the metadata says
//!   (redundancy full, nothing left behind), a drain that can finish finishes, and
//!   rebalancing finishes (no shard left to move onto a node below its share).
//!
//! Also: an unlinked file a mount holds open is never purged (unless its node went `out`);
//! each file's name names its inode once its rename was acknowledged; within 120 s of
//! healing the stores hold every live stripe's shards where the metadata says, each
//! matching its record's checksum, with no orphan shard, no freed stripe's shards and no
//! unlinked inode left, and, with a cold tier (within 240 s), the bucket holds every live
//! cold stripe's object and no unknown or garbage object. A check must tell "no such name"
//! from "cannot read": a read that raced a kill read a fenced replica, and the simulator
//! once took the I/O error for an absent name (seeds 21267 and 21438 looked like stale
//! reads).
//!
//! Settings: five nodes (three voters, two learners once formed), 2+2 stripes, three
//! clients per node plus one file client per node (`file_client.rs`: inline then striped
//! writes, appends, overwrites, truncates, renames over others, unlinks, half while held
//! open, `Reopen` after a restart), up to two joins. The families are [`Family::ALL`]
//! (`Family::about` describes each); a drain or a loss starts only when a replica caught
//! up by a read barrier shows no drain, as `shoal drain` asks. Not simulated yet: skewed
//! wall clocks per node (the cluster clock that fences and leases use advances by the
//! leader's monotonic stamps, not wall time), directories and renames across them.
//!
//! Everything is drawn from the seed: the schedule, the clients' choices, each node's
//! election timeout and disk, every message's delay and loss.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use shoal_agent_api::{FsError, ROOT_INO};
use shoal_disk::{SimFault, SplitMix64};
use shoal_mesh::SimNet;
use shoal_mesh::sim_net::Faults;
use shoal_namespace::format::{FileKind, Owner, RequestId, Timestamp};
use shoal_namespace::nodes::NodeChange;
use shoal_namespace::{Command, NamespaceError, Proposal};
use shoal_placement::{Layout, NodeId, NodeState};

use crate::audit::{audit, node_states};
use crate::cluster::{
    Bucket, Cluster, EC, Live, ORPHAN_OBJECT_GRACE, ORPHAN_SHARD_GRACE, Stop, addr,
};
use crate::file_client::FileClient;
use crate::model::Model;
use crate::trace::{Trace, digest};

/// How long a healed cluster may take to complete a create.
pub const LIVENESS: Duration = Duration::from_secs(60);
/// How long a client waits for a create before its outcome counts as unknown.
const OP_WAIT: Duration = Duration::from_secs(10);
/// How long a client waits for a read before it gives up and reads again (so a reader
/// stays busy through a partition).
const READ_WAIT: Duration = Duration::from_millis(1500);
/// Five nodes: the steward makes three of them voters, two learners.
const NODES: [u64; 5] = [1, 2, 3, 4, 5];
/// Clients on each node (as mounts are: a client works through its own node only): one
/// that mostly creates, one that only reads (it goes on while creates wait for a quorum),
/// one that does both.
const CLIENTS_PER_NODE: u64 = 3;
/// File clients on each node (a mount each).
const FILE_CLIENTS_PER_NODE: u64 = 1;
/// Most nodes that join one run.
const MAX_JOINS: usize = 2;

/// A family of fault schedules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    PowerLoss,
    Partition,
    Repair,
    Drain,
    Rebalance,
    Gc,
    Tiering,
    Disk,
    Mixed,
}

impl Family {
    pub const ALL: [Family; 9] = [
        Family::PowerLoss,
        Family::Partition,
        Family::Repair,
        Family::Drain,
        Family::Rebalance,
        Family::Gc,
        Family::Tiering,
        Family::Disk,
        Family::Mixed,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Family::PowerLoss => "power-loss",
            Family::Partition => "partition",
            Family::Repair => "repair",
            Family::Drain => "drain",
            Family::Rebalance => "rebalance",
            Family::Gc => "gc",
            Family::Tiering => "tiering",
            Family::Disk => "disk",
            Family::Mixed => "mixed",
        }
    }

    pub fn about(self) -> &'static str {
        match self {
            Family::PowerLoss => {
                "kill -9 and power cuts of one node, a minority and every node at once, under creates and reads"
            }
            Family::Partition => {
                "one-way and two-way partitions, a node isolated, lost, duplicated and slow messages, under creates and reads"
            }
            Family::Repair => {
                "a node lost for good under writes (repair restores full redundancy), shards that rot or cannot be read (reads never return them; scrub and repair rewrite them), with kill -9 and power cuts of the others"
            }
            Family::Drain => {
                "a node drained and undrained under writes (its shards move away; the drain must finish once faults heal), with kill -9 and power cuts of the others"
            }
            Family::Rebalance => {
                "new nodes join under writes (shards move onto them until none is below its share), a node drained and removed, with kill -9 and power cuts"
            }
            Family::Gc => {
                "files truncated and unlinked (some while held open) at a high rate, under kill -9, power cuts, an isolated node and a bad network: the collectors free what nothing needs, never what something does"
            }
            Family::Tiering => {
                "a cold tier: files untouched for 30 s go to the bucket, files released and warmed at random, under an unreachable bucket, failed and short uploads, kill -9, power cuts and a bad network: every acknowledged byte reads back, from NVMe or the bucket, and no object is left behind"
            }
            Family::Disk => {
                "metadata disks that fail (EIO) or fill (ENOSPC), shard stores that fill, shards that rot or cannot be read, under writes, kill -9, power cuts and a bad network; a node whose metadata member fails is restarted as systemd restarts its agent"
            }
            Family::Mixed => {
                "all of the above but the cold tier and failing disks in one schedule (its seeds stay the regression seeds they were)"
            }
        }
    }

    pub fn parse(name: &str) -> Option<Family> {
        Family::ALL.into_iter().find(|f| f.name() == name)
    }

    /// The family a seed runs when none is asked for.
    pub fn of_seed(seed: u64) -> Family {
        Family::ALL[(seed % Family::ALL.len() as u64) as usize]
    }
}

/// What one run found.
pub struct Outcome {
    pub trace: Vec<String>,
    pub violations: Vec<String>,
}

impl Outcome {
    pub fn digest(&self) -> String {
        digest(&self.trace)
    }
}

/// Runs `family` on `seed` for `steps` steps of its fault schedule.
pub fn run(seed: u64, family: Family, steps: usize) -> Outcome {
    crate::runtime::block_on(seed, run_here(seed, family, steps))
}

async fn run_here(seed: u64, family: Family, steps: usize) -> Outcome {
    let mut rng = SplitMix64(seed);
    let trace = Trace::begin();
    trace.note(format_args!("seed {seed}: {}", family.name()));
    let mut net_rng = SplitMix64(rng.next_u64());
    let net = SimNet::new(Box::new(move || net_rng.next_u64()));
    let mut cluster = Cluster::new(&NODES, &mut rng, net.clone(), trace.clone());
    if family == Family::Tiering {
        cluster = cluster.with_cold_tier();
    }
    let model = Model::default();
    if let Err(e) = cluster.form(LIVENESS).await {
        model.violation(e);
        return finish(&mut cluster, &trace, &model).await;
    }
    let stop = Arc::new(AtomicBool::new(false));
    tokio::spawn(note_layouts(
        cluster.live.clone(),
        trace.clone(),
        model.clone(),
        stop.clone(),
    ));
    let mut clients: Vec<_> = (0..CLIENTS_PER_NODE * NODES.len() as u64)
        .map(|c| {
            let client = Client {
                id: c,
                home: NODES[(c % NODES.len() as u64) as usize],
                creates_in_10: [8, 0, 5][(c / NODES.len() as u64) as usize % 3],
                rng: SplitMix64(rng.next_u64()),
                live: cluster.live.clone(),
                model: model.clone(),
                trace: trace.clone(),
                seq: 0,
            };
            tokio::spawn(client.run(stop.clone()))
        })
        .collect();
    for c in 0..FILE_CLIENTS_PER_NODE * NODES.len() as u64 {
        let client = FileClient {
            id: c,
            home: NODES[(c % NODES.len() as u64) as usize],
            rng: SplitMix64(rng.next_u64()),
            live: cluster.live.clone(),
            model: model.clone(),
            trace: trace.clone(),
            mine: Vec::new(),
            seq: 0,
            held: Default::default(),
            churn_in_20: if family == Family::Gc { 12 } else { 4 },
        };
        clients.push(tokio::spawn(client.run(stop.clone())));
    }
    let mut faults = Schedule {
        family,
        rng: SplitMix64(rng.next_u64()),
        net: net.clone(),
        trace: trace.clone(),
        unsure_drain: false,
        model: model.clone(),
    };
    for _ in 0..steps {
        // Most faults follow each other closely; some last long enough for an election
        // and the work after it.
        let pause = if faults.rng.below(10) < 7 {
            200 + faults.rng.below(1800)
        } else {
            2000 + faults.rng.below(6000)
        };
        tokio::time::sleep(Duration::from_millis(pause)).await;
        if let Err(e) = faults.step(&mut cluster).await {
            model.violation(e);
            break;
        }
    }
    stop.store(true, Ordering::Release);
    for c in clients {
        let _ = c.await;
    }
    heal(&mut cluster, &net, &trace, &model).await;
    finish(&mut cluster, &trace, &model).await
}

/// Every fault ends: the network heals and every node starts.
async fn heal(cluster: &mut Cluster, net: &SimNet, trace: &Trace, model: &Model) {
    net.heal();
    net.set_faults(Faults::default());
    if let Some(bucket) = &cluster.bucket {
        bucket.set_outage(false);
        bucket.fail_puts(0);
        bucket.truncate_puts(0);
    }
    cluster.disks_heal();
    trace.note("healed");
    if let Err(e) = cluster.restart_failed().await {
        model.violation(e);
    }
    for id in cluster.ids() {
        if let Err(e) = cluster.start(id).await {
            model.violation(e);
        }
    }
}

/// The checks at the end, then every node stops.
async fn finish(cluster: &mut Cluster, trace: &Trace, model: &Model) -> Outcome {
    let live = cluster.live.clone();
    for id in live.ids() {
        let Some(group) = live.get(id) else { continue };
        let mut client = Client {
            id: 100 + id,
            home: id,
            creates_in_10: 10,
            rng: SplitMix64(id),
            live: live.clone(),
            model: model.clone(),
            trace: trace.clone(),
            seq: 0,
        };
        let name = format!("after-{id}");
        let done = tokio::time::timeout(LIVENESS, async {
            loop {
                // Every attempt is the same request: one that timed out may have
                // committed, and its request id makes the next one answer as it did.
                if client.create_on(id, &group, &name, 1).await {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await;
        if done.is_err() {
            model.violation(format!(
                "no create completed through node {id} within {LIVENESS:?} of the cluster healing"
            ));
            note_raft_state(&live, trace);
            continue;
        }
        check_all_acked(id, &group, model).await;
        check_files(id, &live, trace, model).await;
    }
    check_digests(&live, trace, model).await;
    check_stored(cluster, trace, model).await;
    check_drained(cluster, trace, model).await;
    check_rebalanced(cluster, trace, model).await;
    let (proposed, acked) = model.counts();
    trace.note(format_args!(
        "end: {proposed} creates proposed, {acked} acknowledged"
    ));
    // Stopped, so nothing of this run outlives it (a running member and its endpoint
    // hold each other).
    cluster.stop_all().await;
    Outcome {
        trace: trace.take(),
        violations: model.violations(),
    }
}

/// Each running node's Raft state, into the trace (what a liveness failure shows).
fn note_raft_state(live: &Live, trace: &Trace) {
    for id in live.ids() {
        if let Some(g) = live.get(id) {
            let m = g.raft.metrics().borrow().clone();
            trace.note(format_args!(
                "node {id}: {:?} term {} leader {:?} last log {:?} applied {:?} membership {:?} replication {:?}",
                m.state,
                m.current_term,
                m.current_leader,
                m.last_log_index,
                m.last_applied.map(|l| l.index),
                m.membership_config.membership(),
                m.replication
            ));
        }
    }
}

/// After a read barrier on node `id`, every acknowledged create is in its replica.
async fn check_all_acked(id: u64, group: &shoal_agent::consensus::Group, model: &Model) {
    if let Err(e) = group.barrier().await {
        model.violation(format!("node {id}: no read barrier after healing: {e}"));
        return;
    }
    let lost: Vec<String> = model
        .acked_names()
        .into_iter()
        .filter(|n| group.store().lookup(ROOT_INO, n).is_err())
        .collect();
    // Every file's name (created, or renamed over another) names its inode.
    for (name, ino) in model.sure_names() {
        match group.store().lookup(ROOT_INO, &name) {
            Ok(attr) if attr.ino == ino => {}
            other => model.violation(format!(
                "node {id}: {name} should name inode {ino} (its create or rename was acknowledged), and its lookup answers {:?}",
                other.map(|a| a.ino)
            )),
        }
    }
    if !lost.is_empty() {
        let shown: Vec<&str> = lost.iter().take(8).map(String::as_str).collect();
        model.violation(format!(
            "node {id}: {} acknowledged creates lost: {}{}",
            lost.len(),
            shown.join(" "),
            if lost.len() > shown.len() { " …" } else { "" }
        ));
    }
}

/// Every file reads back through node `id` as its newest acknowledged version (or a
/// newer one whose write's outcome was unknown).
async fn check_files(id: u64, live: &Live, trace: &Trace, model: &Model) {
    let Some(fs) = live.fs(id) else { return };
    let mut reader = FileClient {
        id: 100 + id,
        home: id,
        rng: SplitMix64(id),
        live: live.clone(),
        model: model.clone(),
        trace: trace.clone(),
        mine: Vec::new(),
        seq: 0,
        held: Default::default(),
        churn_in_20: 0,
    };
    let deadline = tokio::time::Instant::now() + LIVENESS;
    let mut unread = Vec::new();
    for (name, ino) in model.files() {
        if !reader.read_back(&fs, &name, ino, deadline).await {
            unread.push(name);
        }
    }
    if !unread.is_empty() {
        let shown: Vec<&str> = unread.iter().take(8).map(String::as_str).collect();
        model.violation(format!(
            "node {id}: {} files cannot be read back within {LIVENESS:?} of the cluster healing: {}",
            unread.len(),
            shown.join(" ")
        ));
    }
}

/// With the faults healed, the shards come to what the metadata says within a bound:
/// every live stripe's shards on running nodes (repair done), no orphan shards, no freed
/// stripe's shards left (the collectors done).
async fn check_stored(cluster: &Cluster, trace: &Trace, model: &Model) {
    // With a cold tier, an object the metadata never heard of waits out its grace, and
    // files the last reads touched go cold again meanwhile.
    let bound = match cluster.bucket {
        Some(_) => ORPHAN_SHARD_GRACE * 3 + ORPHAN_OBJECT_GRACE * 2,
        None => ORPHAN_SHARD_GRACE * 3,
    };
    let started = tokio::time::Instant::now();
    loop {
        let stores = cluster.running_stores();
        let Some(group) = stores.keys().next().and_then(|id| cluster.live.get(*id)) else {
            return;
        };
        let objects = match &cluster.bucket {
            Some(bucket) => match bucket_objects(bucket).await {
                Ok(o) => Some(o),
                Err(e) => {
                    model.violation(format!("the bucket does not list after healing: {e}"));
                    return;
                }
            },
            None => None,
        };
        let found = match group.barrier().await {
            Ok(()) => audit(&group, &stores, objects.as_ref()),
            Err(e) => Err(e.to_string()),
        };
        match found {
            Ok(a) if a.clean() => {
                trace.note(format_args!(
                    "stored shards agree with the metadata: {} stripes",
                    a.stripes
                ));
                if cluster.bucket.is_some() {
                    trace.note(format_args!(
                        "the bucket agrees with the metadata: {} cold stripes",
                        a.cold_stripes
                    ));
                }
                return;
            }
            Ok(a) if started.elapsed() >= bound => {
                for id in cluster.live.ids() {
                    let seen = cluster.live.members_seen(id).await;
                    trace.note(format_args!("node {id} sees {seen}"));
                }
                model.violation(format!(
                    "{bound:?} after the cluster healed: {}",
                    a.describe()
                ));
                return;
            }
            Err(e) if started.elapsed() >= bound => {
                model.violation(format!("no audit of the shards within {bound:?}: {e}"));
                return;
            }
            _ => tokio::time::sleep(Duration::from_secs(1)).await,
        }
    }
}

/// The objects in the bucket: id → size.
async fn bucket_objects(
    bucket: &Bucket,
) -> Result<std::collections::BTreeMap<u128, u64>, shoal_tiering::TierError> {
    use shoal_tiering::ColdStore;
    Ok(bucket
        .list("objects")
        .await?
        .into_iter()
        .filter_map(|(key, size)| Some((shoal_tiering::pack::object_id(&key)?, size)))
        .collect())
}

/// A drain that can finish (the other nodes span enough failure domains for every
/// stripe: none lost) finishes once the faults heal: the node becomes drained.
async fn check_drained(cluster: &Cluster, trace: &Trace, model: &Model) {
    let Some(id) = draining(cluster) else { return };
    if cluster.ids().iter().any(|n| cluster.is_lost(*n)) {
        return;
    }
    let bound = LIVENESS * 2;
    let started = tokio::time::Instant::now();
    loop {
        let state = cluster
            .live
            .layout()
            .and_then(|l| l.node(NodeId(id)).map(|n| n.state));
        if state != Some(NodeState::Draining) {
            trace.note(format_args!("node {id}: {state:?}"));
            return;
        }
        if started.elapsed() >= bound {
            model.violation(format!(
                "the drain of node {id} did not finish within {bound:?} of the cluster healing"
            ));
            return;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// With the faults healed, rebalancing finishes: two passes in a row of the leader's
/// repair worker (the first pass after a start knows no shares yet) find no healthy
/// stripe with a shard to move onto a node below its share.
async fn check_rebalanced(cluster: &Cluster, trace: &Trace, model: &Model) {
    let bound = LIVENESS * 2;
    let started = tokio::time::Instant::now();
    // (leader, when its last pass ended, whether that pass found nothing to move).
    let mut last: Option<(u64, tokio::time::Instant, bool)> = None;
    let mut found = String::new();
    loop {
        let leader = cluster.leader();
        let view = leader.and_then(|l| Some((l, cluster.live.repair(l)?)));
        if let Some((leader, view)) = view
            && let (Some(summary), Some(at)) = (view.summary, view.scanned_at)
            && at > started
        {
            let done = summary.misplaced_stripes == 0;
            match last {
                Some((l, when, true)) if l == leader && when < at && done => {
                    let counts: Vec<String> = summary
                        .shards_per_node
                        .iter()
                        .map(|(n, c)| format!("{}:{c}", n.0))
                        .collect();
                    trace.note(format_args!(
                        "rebalanced: shards per node {}",
                        counts.join(" ")
                    ));
                    return;
                }
                Some((l, when, _)) if l == leader && when == at => {}
                _ => last = Some((leader, at, done)),
            }
            if !done {
                found = format!(
                    "{} stripes ({} bytes) with shards to move, shards per node {:?}",
                    summary.misplaced_stripes, summary.misplaced_bytes, summary.shards_per_node
                );
            }
        }
        if started.elapsed() >= bound {
            model.violation(format!(
                "rebalancing did not finish within {bound:?} of the cluster healing: {found}"
            ));
            return;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Once every node applied the same index, their replicas' digests are equal.
async fn check_digests(live: &Live, trace: &Trace, model: &Model) {
    for _ in 0..100 {
        let mut seen = Vec::new();
        for id in live.ids() {
            if let Some(g) = live.get(id)
                && let Ok(d) = g.digest().await
            {
                seen.push((id, d));
            }
        }
        let indexes: std::collections::BTreeSet<_> = seen.iter().map(|(_, (i, _))| *i).collect();
        if indexes.len() == 1 {
            let digests: std::collections::BTreeSet<_> =
                seen.iter().map(|(_, (_, d))| *d).collect();
            if digests.len() != 1 {
                model.violation(format!(
                    "replicas at the same applied index differ: {seen:?}"
                ));
            }
            trace.note(format_args!("replicas agree at index {indexes:?}"));
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    model.violation("the replicas never applied the same index".into());
}

/// Notes in the trace each change of the layout's node states, as the lowest running
/// node's replica holds them, until `stop`.
async fn note_layouts(live: Live, trace: Trace, model: Model, stop: Arc<AtomicBool>) {
    let mut last = String::new();
    // Per replica: the last layout seen in it.
    let mut seen: BTreeMap<u64, Layout> = BTreeMap::new();
    while !stop.load(Ordering::Acquire) {
        tokio::time::sleep(Duration::from_millis(250)).await;
        // Every replica's view: a node out in the leader's layout loses its mounts' claim
        // on unlinked files they hold open (`held.rs`).
        for id in live.ids() {
            let Some(layout) = live
                .get(id)
                .and_then(|g| g.store().cluster_layout().ok().flatten())
            else {
                continue;
            };
            for node in layout.nodes() {
                if node.state == NodeState::Out {
                    model.seen_out(node.id.0);
                }
            }
            // A layout that lived between two looks went unseen: a node not active on
            // either side of it may have been out in it (seed 302680 of `partition`: a
            // node back from a partition was out for a moment, and the purge decided then
            // dropped its mount's claim).
            if let Some(before) = seen.get(&id)
                && layout.epoch() > before.epoch() + 1
            {
                for node in before.nodes().iter().chain(layout.nodes()) {
                    if node.state != NodeState::Active {
                        model.seen_out(node.id.0);
                    }
                }
            }
            seen.insert(id, layout);
        }
        let Some(layout) = live.layout() else {
            continue;
        };
        let now = node_states(&layout);
        if now != last {
            trace.note(format_args!("layout epoch {}: {now}", layout.epoch()));
            last = now;
        }
    }
}

/// The node the layout (as the lowest running node's replica holds it) says is draining
/// or drained, if any.
/// The node the layout says is drained, if one is.
fn drained(cluster: &Cluster) -> Option<u64> {
    cluster
        .live
        .layout()?
        .nodes()
        .iter()
        .find(|n| n.state == NodeState::Drained)
        .map(|n| n.id.0)
}

fn draining(cluster: &Cluster) -> Option<u64> {
    cluster
        .live
        .layout()?
        .nodes()
        .iter()
        .find(|n| matches!(n.state, NodeState::Draining | NodeState::Drained))
        .map(|n| n.id.0)
}

/// The proposal that creates the file `name` in the root, as request `id`.
pub fn create(name: &str, id: RequestId) -> Proposal {
    Proposal {
        id: Some(id),
        now: Timestamp { secs: 1, nanos: 0 },
        command: Command::MkNode {
            parent: ROOT_INO,
            name: name.to_owned(),
            kind: FileKind::File,
            perm: 0o644,
            owner: Owner { uid: 0, gid: 0 },
            rdev: 0,
            target: None,
        },
    }
}

/// A client: creates names and reads names back through its node, while it runs.
struct Client {
    id: u64,
    home: u64,
    /// Of ten operations, how many are creates (the rest are reads).
    creates_in_10: u64,
    rng: SplitMix64,
    live: Live,
    model: Model,
    trace: Trace,
    seq: u64,
}

impl Client {
    async fn run(mut self, stop: Arc<AtomicBool>) {
        while !stop.load(Ordering::Acquire) {
            // Now and then a client rests a while: a node whose clients rest has nothing
            // waiting in its log, and reads are all it serves.
            let pause = if self.rng.below(15) == 0 {
                2000 + self.rng.below(6000)
            } else {
                10 + self.rng.below(300)
            };
            tokio::time::sleep(Duration::from_millis(pause)).await;
            let id = self.home;
            let Some(group) = self.live.get(id) else {
                continue;
            };
            if self.rng.below(10) < self.creates_in_10 {
                let name = format!("c{}-{}", self.id, self.seq + 1);
                self.seq += 1;
                self.create_on(id, &group, &name, self.seq).await;
            } else {
                self.read_on(id, &group).await;
            }
        }
    }

    /// Creates `name` through node `id` as this client's request `seq`; true once
    /// acknowledged.
    async fn create_on(
        &mut self,
        id: u64,
        group: &shoal_agent::consensus::Group,
        name: &str,
        seq: u64,
    ) -> bool {
        self.model.proposed(name);
        let proposal = create(
            name,
            RequestId {
                client: self.id + 1,
                seq,
            },
        );
        let answer = tokio::time::timeout(OP_WAIT, async {
            // A file client's mount may hold the root's lease: it is recalled (as the fs
            // service does) and the same request asked again.
            for _ in 0..8 {
                let outcomes = group
                    .propose_within(vec![proposal.clone()], OP_WAIT)
                    .await?;
                let Some(shoal_namespace::Outcome::Leased { dir, holder }) = outcomes.first()
                else {
                    return Ok(outcomes);
                };
                if let Some(fs) = self.live.fs(id) {
                    let _ = fs.clear_lease(*dir, *holder).await;
                }
            }
            group.propose_within(vec![proposal.clone()], OP_WAIT).await
        })
        .await;
        match answer {
            Ok(Ok(outcomes))
                if matches!(outcomes.first(), Some(shoal_namespace::Outcome::Attr(_))) =>
            {
                self.model.acked(name);
                self.trace.note(format_args!(
                    "client {} created {name} through node {id}",
                    self.id
                ));
                true
            }
            // The file clients' mounts hold the root's lease now and then: a proposal
            // that bypasses the fs service (which would recall it) is refused, and
            // nothing applies.
            Ok(Ok(outcomes))
                if matches!(
                    outcomes.first(),
                    Some(shoal_namespace::Outcome::Leased { .. })
                ) =>
            {
                self.trace.note(format_args!(
                    "client {} create {name} through node {id}: refused by a directory lease",
                    self.id
                ));
                false
            }
            Ok(Ok(outcomes)) => {
                self.model.violation(format!(
                    "create of a new name {name} through node {id} answered {outcomes:?}"
                ));
                false
            }
            Ok(Err(e)) => {
                self.trace.note(format_args!(
                    "client {} create {name} through node {id}: unknown ({e})",
                    self.id
                ));
                false
            }
            Err(_) => {
                self.trace.note(format_args!(
                    "client {} create {name} through node {id}: unknown (timed out)",
                    self.id
                ));
                false
            }
        }
    }

    /// Reads a name some client proposed through node `id`, after a read barrier.
    async fn read_on(&mut self, id: u64, group: &shoal_agent::consensus::Group) {
        // Half the reads ask for one of the newest names: what a deposed leader or a
        // lagging replica would miss.
        let last = (self.rng.below(2) == 0).then_some(8);
        let rng = &mut self.rng;
        let Some(name) = self.model.some_proposed(last, |n| rng.below(n.max(1))) else {
            return;
        };
        let began = self.model.event();
        match tokio::time::timeout(READ_WAIT, group.barrier()).await {
            Ok(Ok(())) => {}
            _ => return,
        }
        // Only "no such name" is an absent name: a replica that cannot be read (its node
        // was killed meanwhile, its disk fenced) says nothing about it.
        let found = match group.store().lookup(ROOT_INO, &name) {
            Ok(_) => true,
            Err(NamespaceError::Fs(FsError::NotFound)) => false,
            Err(e) => {
                self.trace.note(format_args!(
                    "client {} read {name} through node {id}: failed ({e})",
                    self.id
                ));
                return;
            }
        };
        self.trace.note(format_args!(
            "client {} read {name} through node {id}: {}",
            self.id,
            if found { "found" } else { "absent" }
        ));
        if let Some(v) = self.model.check_read(&name, began, found, id) {
            self.trace.note(format_args!("VIOLATION {v}"));
        }
    }
}

/// The fault schedule of a family.
struct Schedule {
    family: Family,
    rng: SplitMix64,
    net: Arc<SimNet>,
    trace: Trace,
    /// A drain was asked for and its answer never came: it may still apply, so no other
    /// node is drained or lost until a caught-up replica shows it.
    unsure_drain: bool,
    /// The files the clients made (what a release or a warm-up names).
    model: Model,
}

impl Schedule {
    /// Asks the metadata group (through some running node) for `change` of node `id`, as
    /// `shoal drain` and `shoal undrain` do; notes the answer, and says whether it was
    /// done (`None`: not known).
    async fn change_node(
        &mut self,
        cluster: &Cluster,
        id: u64,
        change: NodeChange,
    ) -> Option<bool> {
        let up = cluster.live.ids();
        let through = *up.get(self.rng.below(up.len().max(1) as u64) as usize)?;
        let group = cluster.live.get(through)?;
        let proposal = Proposal {
            id: None,
            now: Timestamp::now(),
            command: Command::ChangeNode {
                node: NodeId(id),
                change,
            },
        };
        let answer = tokio::time::timeout(OP_WAIT, group.propose_one(proposal)).await;
        let said = match &answer {
            Ok(Ok(outcome)) => format!("{outcome:?}"),
            Ok(Err(e)) => format!("unknown ({e})"),
            Err(_) => "unknown (timed out)".into(),
        };
        self.trace.note(format_args!(
            "{change:?} of node {id} through node {through}: {said}"
        ));
        match answer {
            Ok(Ok(outcome)) => Some(outcome == shoal_namespace::Outcome::Done),
            _ => None,
        }
    }

    /// Whether no node is being drained or drained, as a replica caught up with the
    /// cluster says (as `shoal drain` asks after a read barrier; a lagging replica let
    /// two drains start at once in seed 289 of `mixed`, which five nodes cannot finish).
    /// False when no replica catches up, or while a drain's answer is unknown.
    async fn none_draining(&mut self, cluster: &Cluster) -> bool {
        let Some(group) = cluster
            .live
            .ids()
            .first()
            .and_then(|id| cluster.live.get(*id))
        else {
            return false;
        };
        let caught_up = tokio::time::timeout(OP_WAIT, group.barrier()).await;
        if !matches!(caught_up, Ok(Ok(()))) {
            return false;
        }
        let Ok(Some(layout)) = group.store().cluster_layout() else {
            return false;
        };
        let any = layout
            .nodes()
            .iter()
            .any(|n| matches!(n.state, NodeState::Draining | NodeState::Drained));
        if any {
            self.unsure_drain = false;
        }
        !any && !self.unsure_drain
    }

    /// One fault (or its end), drawn from the family's choices.
    async fn step(&mut self, cluster: &mut Cluster) -> Result<(), String> {
        cluster.restart_failed().await?;
        let choices: &[u64] = match self.family {
            Family::PowerLoss => &[0, 1, 2, 3],
            Family::Partition => &[4, 5, 6, 7, 8, 3],
            Family::Repair => &[9, 9, 0, 1, 3, 21],
            Family::Drain => &[10, 10, 11, 0, 1, 3],
            Family::Rebalance => &[12, 12, 10, 13, 0, 1, 3],
            Family::Gc => &[0, 1, 3, 4, 6, 7],
            Family::Tiering => &[0, 1, 2, 3, 6, 7, 14, 14, 15, 16, 16, 17],
            Family::Disk => &[0, 1, 3, 6, 7, 18, 18, 19, 19, 20, 20, 21, 21],
            Family::Mixed => &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13],
        };
        let choice = choices[self.rng.below(choices.len() as u64) as usize];
        let ids = cluster.ids();
        let down: Vec<u64> = ids.iter().copied().filter(|i| !cluster.is_up(*i)).collect();
        let mut any = ids[self.rng.below(ids.len() as u64) as usize];
        // Half the partitions take the leader (as some node sees it) away.
        if choice >= 4 && self.rng.below(2) == 0 {
            any = cluster.leader().unwrap_or(any);
        }
        match choice {
            // A node lost for good (one per run, while no other is down), while none is
            // draining or drained: five nodes less a
            // lost one and a drained one cannot hold a 2+2 stripe's four slots (an
            // operator undrains first; seed 309 of `mixed` did both and could not heal).
            9 if down.is_empty() && self.none_draining(cluster).await => {
                let id = ids[self.rng.below(ids.len() as u64) as usize];
                cluster.lose(id).await;
            }
            // A drain of one node, while no other is draining or drained, none is lost and
            // the others are enough for a stripe's slots (as `shoal drain` refuses a drain
            // that cannot finish; seed 50165 of `mixed` drained one of four nodes left
            // after a removal); or its end.
            10 if ids.len() > usize::from(EC.k + EC.m)
                && !ids.iter().any(|i| cluster.is_lost(*i))
                && self.none_draining(cluster).await =>
            {
                let id = ids[self.rng.below(ids.len() as u64) as usize];
                let change = NodeChange::Drain {
                    stripes: 0,
                    bytes: 0,
                };
                if self.change_node(cluster, id, change).await.is_none() {
                    self.unsure_drain = true;
                }
            }
            11 => {
                if let Some(id) = draining(cluster) {
                    self.change_node(cluster, id, NodeChange::Undrain).await;
                }
            }
            // A new machine joins (two at most in a run).
            12 if cluster.joined() < MAX_JOINS => {
                cluster.join(&mut self.rng).await?;
            }
            // A drained node's agent stops; once no node sees it alive (as `shoal remove`
            // requires) the layout forgets it, and its machine goes away.
            13 => {
                if let Some(id) = drained(cluster) {
                    if cluster.is_up(id) {
                        cluster.stop(id, Stop::PowerCut).await;
                    } else if !cluster.live.seen_alive(id).await
                        && self.change_node(cluster, id, NodeChange::Remove).await == Some(true)
                    {
                        cluster.retire(id);
                    }
                }
            }
            // One node down (never more than a minority at a time).
            0 | 1 if down.len() < (ids.len() - 1) / 2 => {
                let up: Vec<u64> = ids.iter().copied().filter(|i| !down.contains(i)).collect();
                let any = up[self.rng.below(up.len() as u64) as usize];
                let how = if choice == 0 {
                    Stop::Crash
                } else {
                    Stop::PowerCut
                };
                cluster.stop(any, how).await;
            }
            // Every node's power at once, then all start again.
            2 if down.is_empty() => {
                for id in &ids {
                    cluster.stop(*id, Stop::PowerCut).await;
                }
                for id in &ids {
                    cluster.start(*id).await?;
                }
            }
            // The nodes that are down start again.
            0..=3 => {
                for id in down {
                    cluster.start(id).await?;
                }
            }
            // A node cut off both ways (the partition before it ends).
            4 => {
                self.net.heal();
                for other in ids.iter().filter(|o| **o != any) {
                    self.net.cut(addr(any).ip(), addr(*other).ip());
                    self.net.cut(addr(*other).ip(), addr(any).ip());
                }
                self.trace.note(format_args!("node {any} isolated"));
            }
            // One way only: a node hears the others, they do not hear it (or the reverse).
            5 => {
                self.net.heal();
                let outgoing = self.rng.below(2) == 0;
                for other in ids.iter().filter(|o| **o != any) {
                    if outgoing {
                        self.net.cut(addr(any).ip(), addr(*other).ip());
                    } else {
                        self.net.cut(addr(*other).ip(), addr(any).ip());
                    }
                }
                let way = if outgoing {
                    "sends nothing"
                } else {
                    "hears nothing"
                };
                self.trace.note(format_args!("node {any} {way}"));
            }
            // A bad network: messages lost, duplicated, slow.
            6 => {
                let faults = Faults {
                    delay_us: (100, 1000 + self.rng.below(50_000)),
                    lost_ppm: self.rng.below(100_000) as u32,
                    duplicated_ppm: self.rng.below(50_000) as u32,
                };
                self.net.set_faults(faults);
                self.trace.note(format_args!("network: {faults:?}"));
            }
            // The bucket fails: unreachable, or the next few uploads fail or keep only
            // part of what they were sent while saying they succeeded.
            14 => {
                if let Some(bucket) = &cluster.bucket {
                    let n = 1 + self.rng.below(3);
                    let how = match self.rng.below(3) {
                        0 => {
                            bucket.set_outage(true);
                            "unreachable".to_string()
                        }
                        1 => {
                            bucket.fail_puts(n);
                            format!("fails the next {n} uploads")
                        }
                        _ => {
                            bucket.truncate_puts(n);
                            format!("keeps half of the next {n} uploads")
                        }
                    };
                    self.trace.note(format_args!("bucket {how}"));
                }
            }
            15 => {
                if let Some(bucket) = &cluster.bucket {
                    bucket.set_outage(false);
                    self.trace.note("bucket back");
                }
            }
            // A file sent to the bucket now (`shoal tier release`), or warmed back onto
            // NVMe (`shoal tier prefetch`), through some node; it runs on while the
            // schedule goes on.
            16 | 17 => {
                let up = cluster.live.ids();
                let Some(&through) = up.get(self.rng.below(up.len().max(1) as u64) as usize) else {
                    return Ok(());
                };
                let rng = &mut self.rng;
                let file = self.model.some_file(|n| rng.below(n.max(1)));
                if let (Some(tier), Some((name, ino))) = (cluster.live.tier(through), file) {
                    let trace = self.trace.clone();
                    let release = choice == 16;
                    tokio::spawn(async move {
                        let what = if release { "release" } else { "prefetch" };
                        let done = tokio::time::timeout(OP_WAIT * 6, async {
                            if release {
                                tier.release(&[ino]).await
                            } else {
                                tier.prefetch(&[ino]).await
                            }
                        })
                        .await;
                        let said = match done {
                            Ok(Ok(moved)) => format!("{} stripes", moved.stripes),
                            Ok(Err(e)) => format!("failed ({e})"),
                            Err(_) => "timed out".into(),
                        };
                        trace.note(format_args!(
                            "{what} of {name} through node {through}: {said}"
                        ));
                    });
                }
            }
            // A node's metadata disk fails or fills, or its shard store fills (while
            // fewer than a minority of nodes are down; nodes whose disks fail already
            // are not counted, so a step may take a majority's disks before they heal).
            18 if down.len() < (ids.len() - 1) / 2 => {
                let id = ids[self.rng.below(ids.len() as u64) as usize];
                match self.rng.below(3) {
                    0 => cluster.disk_fault(id, Some(SimFault::Eio)),
                    1 => cluster.disk_fault(id, Some(SimFault::FullAt(0))),
                    _ => cluster.store_full(id, true),
                }
            }
            // A node's disk is replaced or freed: it works again (and starts, if it
            // was down).
            19 => {
                let failing = cluster.failing_disks();
                if let Some(&id) = failing.get(self.rng.below(failing.len().max(1) as u64) as usize)
                {
                    cluster.disk_heals(id).await?;
                }
            }
            // Every disk works again.
            20 => cluster.disks_heal(),
            // A shard rots or becomes unreadable on some node's disk (up or down): reads
            // must not return its bytes, and scrub or a read that finds it has it
            // rewritten.
            21 => {
                let id = ids[self.rng.below(ids.len() as u64) as usize];
                cluster.damage(id, self.rng.next_u64());
            }
            // The partitions and the bad network end.
            7 | 8 => {
                self.net.heal();
                self.net.set_faults(Faults::default());
                self.trace.note("network healed");
            }
            _ => {}
        }
        Ok(())
    }
}
