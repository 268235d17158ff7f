//! [`Cluster`]: a simulated cluster. Each node runs the agent's real parts: the metadata
//! member [`Group`] (openraft with the log store and the replica, the leader's batcher,
//! forwarding to the leader, read-index rounds and the read lease) on its own
//! [`SimDisk`]; the real membership (SWIM over gossip datagrams); the stripe coordinator
//! ([`Stripes`]: placement, erasure coding, the shard RPCs) on its own in-memory shard
//! store; the filesystem service a mount calls ([`FsService`]); and the workers that
//! change what is stored: the steward (forms the group, adds learners, changes voters),
//! repair, and the collectors of orphan shards, freed stripes and orphan inodes. The
//! nodes talk over one [`SimNet`] with the real RPC framing. New machines join the running
//! cluster ([`Cluster::join`]) and removed ones go away ([`Cluster::retire`]).
//! A node is killed without warning: its disk is fenced first (a crash keeps what the
//! page cache held, a power cut only what was synced), then it leaves the network. Its
//! shard store keeps every shard whose put returned (a put is synced before it returns),
//! as the disk store does.
//!
//! The seams in detail: the shard store is `NodeStore::Mem`, which outlives the node's
//! crashes; `rot` changes a byte of a shard (read back without an error) and
//! `make_unreadable` fails its reads with EIO until it is deleted. The bucket is
//! `ObjectBackend::memory` under `Faulty` (outages, failed uploads, uploads that keep half
//! and say they succeeded). Each node's election timeout is one value drawn from the seed
//! (1 to 1.9 s). Settings: `[cluster] down_out_after` 20 s, orphan shard grace 40 s, a
//! scrub pass every 20 s. Workers not run here: `facts`, `gpu`, `metrics`, `revocations`
//! and `rejoin`.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::{Arc, Mutex};

use prometheus_client::registry::Registry;
use shoal_agent::consensus::ballast::Ballast;
use shoal_agent::consensus::metrics::MetaMetrics;
use shoal_agent::consensus::{Group, MetaConfig};
use shoal_agent::data::{ClusterView, StripeSettings, Stripes};
use shoal_agent::fs::{FsService, OpenHandles};
use shoal_agent::tier::{Tier, TierGc, TierHeat, TierMetrics, TierMover, TierWarm, TieringConfig};
use shoal_agent::worker::Workers;
use shoal_agent::workers::facts::Facts;
use shoal_agent::workers::gc;
use shoal_agent::workers::repair::{Repair, RepairShared};
use shoal_agent::workers::scrub::{Scrub, ScrubShared};
use shoal_agent::workers::steward::Steward;
use shoal_agent::{BackgroundConfig, Resources};
use shoal_disk::{Disk, SimDisk, SimFault, SplitMix64};
use shoal_mesh::membership_sim::sim_facts;
use shoal_mesh::{
    ClusterKey, GossipDriver, GossipHandle, MemberId, Membership, MembershipConfig, NodeFacts,
    NodeId, SimNet, Transport,
};
use shoal_placement::EcProfile;
use shoal_store::{MemStore, NodeStore, ShardKey, ShardStore};
use shoal_tiering::{ColdStore, Faulty, ObjectBackend};

use crate::trace::Trace;

const META: &str = "/meta";
/// A node down this long leaves the layout (`[cluster] down_out_after`).
const DOWN_OUT_AFTER: std::time::Duration = std::time::Duration::from_secs(20);
/// New stripes: 2 data and 2 parity shards, so the five nodes keep full redundancy with
/// one of them lost for good.
pub const EC: EcProfile = EcProfile { k: 2, m: 2 };
/// Each node's shard store holds this much.
const STORE_BYTES: u64 = 1 << 30;
/// Each node's simulated disk, as its facts tell it (the placement weight): the same at
/// the start and in every later publication of the `facts` worker, so no weight changes.
const DISK_BYTES: u64 = 1 << 40;
/// How long shards no stripe names wait before the collector takes them (the agent's
/// default is 600 s; a run is shorter).
pub const ORPHAN_SHARD_GRACE: std::time::Duration = std::time::Duration::from_secs(40);
/// A scrub pass starts this long after the last one began (`[scrub] interval`; the
/// agent's default is 14 days).
pub const SCRUB_INTERVAL: std::time::Duration = std::time::Duration::from_secs(20);

/// The cold tier's bucket, shared by every node, with the faults a family injects.
pub type Bucket = Arc<Faulty<ObjectBackend>>;

/// The cold tier of a simulated cluster: files untouched for 30 s go cold (the agent's
/// default is 7 days; a run is minutes), the mover looks every 5 s, and an object the
/// metadata never heard of is deleted after the shortest grace the agent allows.
fn tier_config() -> TieringConfig {
    TieringConfig {
        store: shoal_agent::tier::StoreKind::Dir,
        dir: None,
        s3: None,
        cold_after: "30s".into(),
        high_watermark: 0.85,
        low_watermark: 0.70,
        pinned: Vec::new(),
        recall_timeout: std::time::Duration::from_secs(10),
        object_size: "1MiB".into(),
        scan_interval: std::time::Duration::from_secs(5),
        orphan_object_grace: ORPHAN_OBJECT_GRACE,
    }
}

/// How long an object the metadata does not know waits before the tier's collector
/// fences it (the least `[tiering] orphan_object_grace` allows).
pub const ORPHAN_OBJECT_GRACE: std::time::Duration = std::time::Duration::from_secs(60);

/// What a running node serves its clients through.
#[derive(Clone)]
pub struct Running {
    pub group: Arc<Group>,
    /// What the node's mount calls.
    pub fs: Arc<FsService>,
    /// Its stripe coordinator.
    pub stripes: Arc<Stripes>,
    /// Its membership.
    pub gossip: GossipHandle,
    /// What its repair worker found in its last passes.
    pub repair: Arc<RepairShared>,
    /// Its cold tier, when the cluster runs one.
    pub tier: Option<Arc<Tier>>,
    /// Its workers (their states, as status shows them).
    pub workers: Arc<Workers>,
}

/// The nodes that run now, shared with the workload's clients.
#[derive(Clone, Default)]
pub struct Live(Arc<Mutex<BTreeMap<u64, Running>>>);

impl Live {
    fn map(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Running>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn get(&self, id: u64) -> Option<Arc<Group>> {
        self.map().get(&id).map(|r| r.group.clone())
    }

    pub fn fs(&self, id: u64) -> Option<Arc<FsService>> {
        self.map().get(&id).map(|r| r.fs.clone())
    }

    pub fn stripes(&self, id: u64) -> Option<Arc<Stripes>> {
        self.map().get(&id).map(|r| r.stripes.clone())
    }

    /// The cluster layout as the lowest running node's replica holds it.
    pub fn layout(&self) -> Option<shoal_placement::Layout> {
        let group = self.ids().first().and_then(|id| self.get(*id))?;
        group.store().cluster_layout().ok()?
    }

    /// How node `id`'s membership sees each member: "node:state" and "+facts" when it has
    /// the member's facts.
    pub async fn members_seen(&self, id: u64) -> String {
        let gossip = self.map().get(&id).map(|r| r.gossip.clone());
        let Some(gossip) = gossip else {
            return String::new();
        };
        match gossip.members().await {
            Ok(views) => views
                .iter()
                .map(|v| {
                    let facts = if v.facts.is_some() { "+facts" } else { "" };
                    format!(
                        "{}:{:?}(gen {}){facts}",
                        v.id.node.0, v.state, v.id.generation
                    )
                })
                .collect::<Vec<_>>()
                .join(" "),
            Err(e) => e.to_string(),
        }
    }

    pub fn ids(&self) -> Vec<u64> {
        self.map().keys().copied().collect()
    }

    /// Whether some running node's membership sees node `id` alive.
    pub async fn seen_alive(&self, id: u64) -> bool {
        let gossips: Vec<GossipHandle> = self.map().values().map(|r| r.gossip.clone()).collect();
        for gossip in gossips {
            let Ok(views) = gossip.members().await else {
                continue;
            };
            if views
                .iter()
                .any(|v| v.id.node.0 == id && v.state == shoal_mesh::MemberState::Alive)
            {
                return true;
            }
        }
        false
    }

    /// Node `id`'s cold tier, when it runs and the cluster has one.
    pub fn tier(&self, id: u64) -> Option<Arc<Tier>> {
        self.map().get(&id).and_then(|r| r.tier.clone())
    }

    /// Node `id`'s workers as `shoal status` shows them.
    pub fn workers(&self, id: u64) -> Option<Vec<shoal_agent_api::WorkerStatus>> {
        self.map().get(&id).map(|r| r.workers.status())
    }

    /// What node `id`'s repair worker found in its last passes.
    pub fn repair(&self, id: u64) -> Option<shoal_agent::workers::repair::RepairView> {
        self.map().get(&id).map(|r| r.repair.view())
    }
}

/// How a node stops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// kill -9: the page cache survives.
    Crash,
    /// The power: only what was synced survives (torn at a sector, at random).
    PowerCut,
}

struct Node {
    addr: SocketAddr,
    disk: SimDisk,
    /// The node's shard store: it outlives the node's crashes, as its disk does.
    store: Arc<NodeStore>,
    config: MetaConfig,
    /// Grows with every start (gossip refuses packets of a node's earlier lives).
    generation: u64,
    /// Feeds foca's randomness at each start.
    gossip_seed: u64,
    up: Option<Up>,
    /// Lost for good (the machine is gone): it never starts again.
    lost: bool,
    /// Its metadata disk fails or is full (it may not start until that ends).
    disk_fault: Option<SimFault>,
}

impl Node {
    /// Node `id` of a cluster formed by `expect` nodes, not started. Its disk and
    /// election timeout come from `rng`.
    fn new(id: u64, expect: usize, rng: &mut SplitMix64) -> Node {
        // One timeout per node, not a range: openraft draws within a range from the OS's
        // randomness. Every node's is below twice every other's, which the read lease
        // needs (see `lease.rs`).
        let election = 1000 + rng.below(900);
        let config = MetaConfig {
            bootstrap_expect: expect,
            election_ms: [election, election + 1],
            snapshot_every: 64,
            orphan_shard_grace_s: ORPHAN_SHARD_GRACE.as_secs(),
            ..MetaConfig::default()
        };
        Node {
            addr: addr(id),
            disk: SimDisk::new(rng.next_u64()),
            store: Arc::new(NodeStore::Mem(MemStore::new(STORE_BYTES))),
            config,
            generation: 0,
            gossip_seed: rng.next_u64(),
            up: None,
            lost: false,
            disk_fault: None,
        }
    }
}

struct Up {
    group: Arc<Group>,
    workers: Arc<Workers>,
    transport: Arc<Transport>,
    gossip: tokio::task::JoinHandle<()>,
}

pub struct Cluster {
    pub net: Arc<SimNet>,
    nodes: BTreeMap<u64, Node>,
    pub live: Live,
    trace: Trace,
    /// The nodes that formed the group (`[meta] bootstrap_expect` of every node).
    expect: usize,
    /// The id the next node to join gets (ids are never used twice).
    next_id: u64,
    /// Nodes that joined after the group formed.
    joined: usize,
    /// The cold tier's bucket, when the nodes run a cold tier.
    pub bucket: Option<Bucket>,
    /// Every node's `[background]` budget.
    background: BackgroundConfig,
    /// Stripes one of whose shards was damaged (one shard per stripe in a run).
    damaged: std::collections::BTreeSet<u128>,
    /// Where the nodes' scrub workers keep their pass position (`<dir>/<id>`).
    scratch: tempfile::TempDir,
}

impl Up {
    /// Everything the node runs stops at once, as at kill -9 (its disk is fenced first):
    /// a unit of work in progress too.
    async fn halt(self) {
        self.workers.abort();
        self.gossip.abort();
        self.transport.close().await;
        let _ = self.group.raft.shutdown().await;
    }

    /// The agent's own shutdown, in its order (`Node::shutdown`): membership ends, the
    /// workers stop (a unit in progress finishes within its deadline, the batcher last),
    /// then the metadata member and the network.
    async fn shut_down(self) {
        self.gossip.abort();
        self.workers.stop().await;
        let _ = self.group.raft.shutdown().await;
        self.transport.close().await;
    }
}

/// The address of node `id` on the simulated network.
pub fn addr(id: u64) -> SocketAddr {
    let last = u8::try_from(id).unwrap_or(u8::MAX);
    SocketAddr::from((Ipv4Addr::new(10, 0, 0, last), 7000))
}

/// Where node `id` gossips.
fn gossip_addr(id: u64) -> SocketAddr {
    SocketAddr::new(addr(id).ip(), 7001)
}

impl Cluster {
    /// Nodes `ids`, none started. Each node's disk and election timeout come from `rng`.
    pub fn new(ids: &[u64], rng: &mut SplitMix64, net: Arc<SimNet>, trace: Trace) -> Self {
        let nodes = ids
            .iter()
            .map(|&id| (id, Node::new(id, ids.len(), rng)))
            .collect();
        Cluster {
            net,
            nodes,
            live: Live::default(),
            trace,
            expect: ids.len(),
            next_id: ids.iter().max().map_or(1, |m| m + 1),
            joined: 0,
            bucket: None,
            background: BackgroundConfig::default(),
            damaged: Default::default(),
            scratch: tempfile::tempdir().expect("a scratch directory for the scrub state"),
        }
    }

    /// The nodes run a cold tier (its mover, recall and collector) on one bucket in
    /// memory.
    pub fn with_cold_tier(mut self) -> Self {
        self.bucket = Some(Arc::new(Faulty::new(ObjectBackend::memory())));
        self
    }

    /// Every node's `orphan_shard_grace_s` (before any starts): a write retries its
    /// stripes for a quarter of it at most, which the simulator's short grace keeps
    /// below one timed-out put and a retry.
    pub fn with_orphan_grace(mut self, grace: std::time::Duration) -> Self {
        for node in self.nodes.values_mut() {
            node.config.orphan_shard_grace_s = grace.as_secs();
        }
        self
    }

    /// Every node's `metadata_writeback_ms` (before any starts); 0: no directory leases
    /// for the mounts and no writeback worker (a test that drives `Leases` itself).
    pub fn with_writeback(mut self, ms: u64) -> Self {
        for node in self.nodes.values_mut() {
            node.config.metadata_writeback_ms = ms;
        }
        self
    }

    /// Every node's background budget (`[background] rate` and `repair_floor`, as the
    /// config writes them), before any starts.
    pub fn with_background(mut self, rate: &str, repair_floor: &str) -> Self {
        self.background = BackgroundConfig {
            rate: rate.into(),
            repair_floor: repair_floor.into(),
        };
        self
    }

    /// A new machine joins the running cluster (an empty disk and shard store); its id.
    pub async fn join(&mut self, rng: &mut SplitMix64) -> Result<u64, String> {
        let id = self.next_id;
        self.next_id += 1;
        self.joined += 1;
        self.nodes.insert(id, Node::new(id, self.expect, rng));
        self.trace.note(format_args!("node {id} joins"));
        self.start(id).await?;
        Ok(id)
    }

    /// How many nodes joined after the group formed.
    pub fn joined(&self) -> usize {
        self.joined
    }

    /// Node `id` (stopped) is gone for good after the layout let it go (drained, then
    /// removed): its machine is forgotten.
    pub fn retire(&mut self, id: u64) {
        if self.nodes.get(&id).is_some_and(|n| n.up.is_none()) {
            self.nodes.remove(&id);
            self.trace.note(format_args!("node {id} retired"));
        }
    }

    pub fn ids(&self) -> Vec<u64> {
        self.nodes.keys().copied().collect()
    }

    /// The leader as the lowest running node sees it.
    pub fn leader(&self) -> Option<u64> {
        let id = self.live.ids().first().copied()?;
        self.live.get(id)?.leader()
    }

    pub fn is_up(&self, id: u64) -> bool {
        self.nodes.get(&id).is_some_and(|n| n.up.is_some())
    }

    /// Starts node `id` on what its disk holds. An error is a violation: a member must
    /// open after any crash or power cut.
    pub async fn start(&mut self, id: u64) -> Result<(), String> {
        let seeds = self.nodes_addrs(gossip_addr);
        let background = self.background.clone();
        let bucket = self.bucket.clone();
        let Some(node) = self.nodes.get_mut(&id) else {
            return Err(format!("no node {id}"));
        };
        if node.up.is_some() || node.lost {
            return Ok(());
        }
        let disk: Arc<dyn Disk> = Arc::new(node.disk.clone());
        disk.create_dir_all(Path::new(META))
            .map_err(|e| format!("node {id}: {e}"))?;
        let transport = Transport::sim(&self.net, node.addr, NodeId(id));
        let started = Group::start_on(
            disk,
            Path::new(META),
            Arc::new(Ballast::absent()),
            id,
            node.config.clone(),
            transport.clone(),
            MetaMetrics::default(),
        )
        .await;
        let (group, workers_of_group) = match started {
            Ok(g) => g,
            // A disk that fails may well keep its member from starting: the node stays
            // down until the fault ends, as an agent that exits does under systemd.
            Err(e) if node.disk_fault.is_some() => {
                transport.close().await;
                self.trace.note(format_args!(
                    "node {id} does not start on its failing disk: {e}"
                ));
                return Ok(());
            }
            Err(e) => {
                transport.close().await;
                return Err(format!("node {id} does not start after a crash: {e}"));
            }
        };
        node.generation += 1;
        node.gossip_seed = node.gossip_seed.wrapping_add(1);
        let (gossip, gossip_task) = {
            let me = MemberId {
                node: NodeId(id),
                addr: gossip_addr(id),
                generation: node.generation,
            };
            let membership = Membership::new(
                me,
                facts(me, node.addr),
                &MembershipConfig::default(),
                node.gossip_seed,
            )
            .map_err(|e| format!("node {id}: membership: {e}"))?
            .0;
            let key = ClusterKey::derive(&[7; 32], b"sim");
            GossipDriver::start_sim(&self.net, membership, key, seeds)
        };
        let mut registry = Registry::default();
        let stripes = Arc::new(Stripes::new(
            NodeId(id),
            node.store.clone(),
            transport.clone(),
            ClusterView {
                gossip: gossip.clone(),
                namespace: group.store_arc(),
                book: group.address_book(),
            },
            StripeSettings {
                default_ec: EC,
                min_write_shards: None,
                buffer_budget_bytes: 256 << 20,
            },
            &mut registry,
        ));
        stripes.serve_on(&transport);
        let handles = Arc::new(OpenHandles::default());
        handles.serve(&transport);
        let resources = Resources::start(None, &background, &mut registry)
            .map_err(|e| format!("node {id}: {e}"))?;
        let tier = match &bucket {
            Some(bucket) => {
                let store: Arc<dyn ColdStore> = bucket.clone();
                let tier = Tier::new(
                    tier_config(),
                    store,
                    b"sim cluster",
                    group.clone(),
                    stripes.clone(),
                    resources.clone(),
                    gossip.clone(),
                    TierMetrics::register(&mut registry),
                )
                .map_err(|e| format!("node {id}: {e}"))?;
                Some(tier)
            }
            None => None,
        };
        let fs = Arc::new(FsService::new(
            group.clone(),
            stripes.clone(),
            gossip.clone(),
            handles.clone(),
            tier.clone(),
            transport.clone(),
        ));
        let workers = Arc::new(Workers::default());
        workers.spawn_last(workers_of_group.batcher);
        let writeback = std::time::Duration::from_millis(group.config.metadata_writeback_ms);
        if let Some(flush) = shoal_agent::fs::LeaseFlush::new(fs.leases().clone(), writeback) {
            workers.spawn(flush);
        }
        workers.spawn(shoal_agent::consensus::CoreWatch::new(
            group.clone(),
            gossip.clone(),
        ));
        let gossip_handle = gossip.clone();
        let store = node.store.clone();
        workers.spawn(Facts::new(
            node.store.clone(),
            gossip.clone(),
            Box::new(move || disk_figures(&store)),
            group.ballast.clone(),
        ));
        workers.spawn(Steward::new(group.clone(), gossip.clone(), DOWN_OUT_AFTER));
        workers.spawn(gc::OrphanShards::new(group.clone(), stripes.clone()));
        workers.spawn(gc::StripeGc::new(group.clone(), stripes.clone()));
        let scrub_dir = self.scratch.path().join(id.to_string());
        std::fs::create_dir_all(&scrub_dir).map_err(|e| format!("node {id}: {e}"))?;
        let scrub = ScrubShared::new(&scrub_dir, true, SCRUB_INTERVAL, &mut registry);
        workers.spawn(Scrub::new(
            group.clone(),
            stripes.clone(),
            node.store.clone(),
            resources.clone(),
            scrub,
            64 << 20,
        ));
        let repair = RepairShared::new(&mut registry);
        workers.spawn(Repair::new(
            group.clone(),
            stripes.clone(),
            gossip.clone(),
            resources,
            repair.clone(),
        ));
        workers.spawn(gc::OrphanPurge::new(
            group.clone(),
            gossip,
            transport.clone(),
            handles,
        ));
        if let Some(tier) = &tier {
            workers.spawn(TierHeat::new(tier.clone()));
            workers.spawn(TierGc::new(
                tier.clone(),
                std::time::Duration::from_secs(node.config.gc_interval_s),
            ));
            workers.spawn(TierMover::new(tier.clone()));
            workers.spawn(TierWarm::new(tier.clone()));
        }
        tokio::spawn(note_leaders(id, group.clone(), self.trace.clone()));
        self.live.map().insert(
            id,
            Running {
                group: group.clone(),
                fs,
                stripes: stripes.clone(),
                gossip: gossip_handle,
                repair,
                tier,
                workers: workers.clone(),
            },
        );
        node.up = Some(Up {
            group,
            workers,
            transport,
            gossip: gossip_task,
        });
        self.trace.note(format_args!("node {id} started"));
        Ok(())
    }

    /// Stops node `id` without warning.
    pub async fn stop(&mut self, id: u64, how: Stop) {
        let Some(node) = self.nodes.get_mut(&id) else {
            return;
        };
        match how {
            Stop::Crash => node.disk.crash(),
            Stop::PowerCut => node.disk.power_cut(),
        }
        self.live.map().remove(&id);
        if let Some(up) = node.up.take() {
            up.halt().await;
        }
        self.trace.note(format_args!("node {id} stopped: {how:?}"));
    }

    /// Stops node `id` as the agent does on SIGTERM (`Up::shut_down`: membership, then
    /// the workers, each unit in progress finishing within its deadline, then the rest).
    /// What it wrote stays on its disk (as at kill -9: nothing more is written after).
    pub async fn shut_down(&mut self, id: u64) {
        let Some(node) = self.nodes.get_mut(&id) else {
            return;
        };
        self.live.map().remove(&id);
        if let Some(up) = node.up.take() {
            up.shut_down().await;
        }
        node.disk.crash();
        self.trace.note(format_args!("node {id} shut down"));
    }

    /// Node `id`'s metadata disk fails (EIO), fills (ENOSPC on every write that grows
    /// it) or, with `None`, works again.
    pub fn disk_fault(&mut self, id: u64, fault: Option<SimFault>) {
        if let Some(node) = self.nodes.get_mut(&id) {
            node.disk.set_fault(fault);
            node.disk_fault = fault;
            self.trace.note(format_args!("node {id} disk: {fault:?}"));
        }
    }

    /// Node `id`'s shard store is full (it takes no new shard) or, with `false`, has
    /// room again.
    pub fn store_full(&mut self, id: u64, full: bool) {
        if let Some(node) = self.nodes.get(&id)
            && let NodeStore::Mem(store) = &*node.store
        {
            let limit = if full {
                shoal_store::ShardStore::usage(store).used_bytes
            } else {
                STORE_BYTES
            };
            store.set_limit(limit);
            self.trace
                .note(format_args!("node {id} shard store full: {full}"));
        }
    }

    /// One shard on node `id` is damaged where it lies (`pick` chooses which shard, how and
    /// where): a byte changes (bit rot, a misdirected write: reads return it without an
    /// error) or its reads fail with EIO (a latent sector error). Only a shard of a
    /// stripe with every slot named, none on a lost node (as a running node's replica
    /// says) and none damaged before in the run: such a stripe loses at most this shard
    /// and, later, a lost node's (2+2 keeps two). A stripe written degraded, then
    /// damaged, then on a lost node is lost for real (seed 198 of `repair` did that
    /// once: three faults, not a bug).
    pub fn damage(&mut self, id: u64, pick: u64) {
        let Some(node) = self.nodes.get(&id) else {
            return;
        };
        let NodeStore::Mem(store) = &*node.store else {
            return;
        };
        let Some(replica) = self.live.ids().first().and_then(|r| self.live.get(*r)) else {
            return;
        };
        let whole = |stripe: u128| {
            let record = replica
                .store()
                .live_stripe(shoal_placement::StripeId(stripe));
            record.ok().flatten().is_some_and(|r| {
                r.shards.len() == usize::from(EC.k + EC.m)
                    && r.shards
                        .iter()
                        .all(|s| s.node != NodeId::NONE && !self.is_lost(s.node.0))
            })
        };
        let fresh: Vec<ShardKey> = store
            .list()
            .into_iter()
            .map(|(k, _)| k)
            .filter(|k| !self.damaged.contains(&k.stripe) && whole(k.stripe))
            .collect();
        if fresh.is_empty() {
            return;
        }
        let key = fresh[(pick % fresh.len() as u64) as usize];
        let (done, how) = if pick & (1 << 31) == 0 {
            (store.rot(key, (pick >> 32) as usize), "rots")
        } else {
            (store.make_unreadable(key), "cannot be read (EIO)")
        };
        if done {
            self.damaged.insert(key.stripe);
            self.trace
                .note(format_args!("node {id}: shard {key} {how}"));
        }
    }

    /// What systemd does for an agent that exits: a node whose metadata member stopped
    /// on its own (a storage failure) is restarted (and stays down while its disk
    /// fails). The agent goes on for a while after the failure before it exits; here it
    /// is restarted at the schedule's next step.
    pub async fn restart_failed(&mut self) -> Result<(), String> {
        let failed: Vec<u64> = self
            .nodes
            .iter()
            .filter(|(_, n)| n.up.as_ref().is_some_and(|u| u.group.failure().is_some()))
            .map(|(id, _)| *id)
            .collect();
        for id in failed {
            self.trace.note(format_args!(
                "node {id}: its metadata member failed; the agent exits"
            ));
            self.stop(id, Stop::Crash).await;
            self.start(id).await?;
        }
        Ok(())
    }

    /// The nodes whose metadata disk fails or whose shard store is full.
    pub fn failing_disks(&self) -> Vec<u64> {
        self.nodes
            .iter()
            .filter(|(_, n)| {
                let full = match &*n.store {
                    NodeStore::Mem(m) => {
                        shoal_store::ShardStore::usage(m).limit_bytes < STORE_BYTES
                    }
                    NodeStore::Disk(_) => false,
                };
                n.disk_fault.is_some() || full
            })
            .map(|(id, _)| *id)
            .collect()
    }

    /// Node `id`'s disks work again (and it starts, if it was down).
    pub async fn disk_heals(&mut self, id: u64) -> Result<(), String> {
        self.disk_fault(id, None);
        self.store_full(id, false);
        self.start(id).await
    }

    /// Every disk fault ends.
    pub fn disks_heal(&mut self) {
        for id in self.failing_disks() {
            self.disk_fault(id, None);
            self.store_full(id, false);
        }
    }

    /// Node `id`'s machine is gone for good: its power is cut and it never starts again.
    pub async fn lose(&mut self, id: u64) {
        self.stop(id, Stop::PowerCut).await;
        if let Some(node) = self.nodes.get_mut(&id) {
            node.lost = true;
        }
        self.trace.note(format_args!("node {id} lost for good"));
    }

    pub fn is_lost(&self, id: u64) -> bool {
        self.nodes.get(&id).is_some_and(|n| n.lost)
    }

    /// The shard stores of the nodes that run now.
    pub fn running_stores(&self) -> BTreeMap<u64, Arc<NodeStore>> {
        self.nodes
            .iter()
            .filter(|(_, n)| n.up.is_some())
            .map(|(id, n)| (*id, n.store.clone()))
            .collect()
    }

    /// Stops every running node (kill -9), noting nothing in the trace.
    pub async fn stop_all(&mut self) {
        for node in self.nodes.values_mut() {
            node.disk.crash();
            if let Some(up) = node.up.take() {
                up.halt().await;
            }
        }
        self.live.map().clear();
    }

    fn nodes_addrs(&self, f: fn(u64) -> SocketAddr) -> Vec<SocketAddr> {
        self.nodes.keys().map(|id| f(*id)).collect()
    }

    /// Every node started; the steward forms the group once gossip has seen them all.
    pub async fn form(&mut self, within: std::time::Duration) -> Result<(), String> {
        for id in self.ids() {
            self.start(id).await?;
        }
        let waited = tokio::time::timeout(within, async {
            while self.leader().is_none() {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        })
        .await;
        if waited.is_err() {
            return Err(format!("no group formed within {within:?}"));
        }
        self.trace.note("group formed");
        Ok(())
    }
}

/// Notes in the trace each change of the leader as node `id` sees it, while it runs.
async fn note_leaders(id: u64, group: Arc<Group>, trace: Trace) {
    let mut metrics = group.raft.metrics();
    let mut last = None;
    loop {
        let now = {
            let m = metrics.borrow_and_update();
            (m.current_term, m.current_leader)
        };
        if last != Some(now) {
            let (term, leader) = now;
            match leader {
                Some(l) => trace.note(format_args!("node {id}: term {term}, leader node {l}")),
                None => trace.note(format_args!("node {id}: term {term}, no leader")),
            }
            last = Some(now);
        }
        if metrics.changed().await.is_err() {
            return;
        }
    }
}

/// The size and use of a node's simulated disk, which holds only its shard store (the
/// figures its `facts` worker publishes: the same on every machine).
fn disk_figures(store: &NodeStore) -> (u64, u64) {
    (DISK_BYTES, shoal_store::ShardStore::usage(store).used_bytes)
}

/// What node `id` (gossiping as `me`) tells the others about itself when it starts: a
/// simulated member's facts, in a failure domain of its own, serving RPC at `rpc_addr`,
/// running this release (as every node of a cluster does between upgrades).
fn facts(me: MemberId, rpc_addr: SocketAddr) -> NodeFacts {
    NodeFacts {
        failure_domain: format!("rack{}", me.node.0),
        rpc_addr,
        agent_version: shoal_agent::AGENT_VERSION.into(),
        capacity_bytes: DISK_BYTES,
        used_bytes: 0,
        store_room_bytes: STORE_BYTES,
        ..sim_facts(me)
    }
}
