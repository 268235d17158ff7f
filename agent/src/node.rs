//! The composition root: one [`Node`] owns every subsystem of the agent, builds them in
//! dependency order, and stops them in reverse: first what serves requests from outside,
//! then the background workers, then Raft, then the transport. Beside it, what an operator
//! asks of the whole node through the admin socket (`admin`): `status`, `drain` (and
//! undrain, remove), `ok_to_stop`, `revoke`. Nothing below the node depends on it.

mod admin;
mod drain;
mod ok_to_stop;
mod revoke;
mod status;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use rand::RngExt;
use shoal_agent_api::NODE_TLS_NAME;
use shoal_mesh::{
    ClusterKey, GossipDriver, GossipHandle, MemberId, Membership, MeshMetrics, NodeCert, NodeFacts,
    NodeRole, Revocations, Transport,
};
use shoal_store::{DiskStore, NodeStore, Recovery, Ring, StoreMetrics};
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::consensus::metrics::MetaMetrics;
use crate::consensus::{Group, GroupWorkers};
use crate::data::{ClusterView, StripeSettings, Stripes};
use crate::fs::{FsService, OpenHandles};
use crate::system_rpc::{Ping, Pong};
use crate::tier::{self, Tier, TierMetrics};
use crate::worker::Workers;
use crate::workers::repair::{self, RepairShared};
use crate::workers::scrub::{self, ScrubShared};
use crate::workers::{facts, gc, gpu, metrics, steward};
use crate::{AGENT_VERSION, AgentConfig, AgentError, NodeIdentity, Resources, metrics_http};

/// How long an agent whose metadata member failed goes on (status and gossip say so, and
/// the metadata leader replaces it as a voter after 30 s) before it exits.
/// A file in the data dir: the agent that wrote it at its stop had committed everything
/// it answered under directory leases (read and removed at the next start).
const LEASES_CLEAN: &str = "leases-clean";
const MEMBER_FAILED_EXIT_AFTER: std::time::Duration = std::time::Duration::from_secs(40);

/// One running agent.
pub struct Node {
    /// The validated configuration this node runs with.
    pub config: AgentConfig,
    /// Stable node id and this run's generation.
    pub identity: NodeIdentity,
    /// What this node's certificate says of it (id, name, when issued).
    pub certified: NodeCert,
    /// Membership: handle to the gossip task (SWIM over the authenticated UDP envelope).
    pub gossip: GossipHandle,
    /// QUIC endpoint (mutual TLS) for RPC to and from peers.
    pub transport: Arc<Transport>,
    /// This node's shard store (io_uring, checksummed files, redb index).
    pub store: Arc<NodeStore>,
    /// Stripe write/read coordination (erasure coding across the cluster).
    pub stripes: Arc<Stripes>,
    /// The metadata group member: namespace and cluster layout (Raft over redb).
    pub group: Arc<Group>,
    /// The local mounts' open handles.
    pub handles: Arc<OpenHandles>,
    /// The filesystem served to the local `shoal mount`.
    pub fs: Arc<FsService>,
    /// CPU/RAM reservation, GPU view and background-work governor.
    pub resources: Arc<Resources>,
    /// The repair worker's view of the cluster's redundancy.
    pub repair: Arc<RepairShared>,
    /// This node's scrub: progress and the corrupt shards reads found.
    pub scrub: Arc<ScrubShared>,
    /// The cold tier, when `[tiering]` configures one.
    pub tier: Option<Arc<Tier>>,
    /// When this agent started.
    pub started_at: std::time::Instant,
    /// Everything exported at `/metrics`.
    pub registry: Arc<Registry>,
    /// Background work (see `workers`).
    pub workers: Workers,
    /// Tasks that serve the cluster (RPC, bulk lane, gossip), in the order they are
    /// stopped (the local clients' are front workers).
    services: Mutex<Vec<(&'static str, JoinHandle<()>)>>,
    /// Admin socket path, removed at shutdown.
    admin_socket: PathBuf,
}

/// The listening sockets, bound before anything is spawned so a bad address fails the
/// start instead of a background task.
struct Listeners {
    admin: tokio::net::UnixListener,
    metrics: Option<tokio::net::TcpListener>,
    bulk: Option<JoinHandle<()>>,
}

impl Node {
    /// Builds every subsystem from `config` and starts serving.
    pub async fn start(mut config: AgentConfig) -> Result<Arc<Node>, AgentError> {
        // The node this node's certificate names: its id is the node id, its name the
        // node's name (a config naming another is refused).
        let certified = config.tls.files().node_identity()?;
        if config
            .node
            .name
            .as_ref()
            .is_some_and(|n| *n != certified.name)
        {
            return Err(crate::config::invalid(
                "node.name",
                format!(
                    "{:?} is not the name the node certificate carries ({:?}); leave it out, or issue the certificate for that name",
                    config.node.name.as_deref().unwrap_or_default(),
                    certified.name
                ),
            ));
        }
        config.node.name = Some(certified.name.clone());
        let identity = NodeIdentity::load_or_create(&config.node.data_dir, certified.node)?;
        let mut registry = Registry::default();
        // First: everything after this runs inside the reservation.
        let resources =
            Resources::start(config.resources.as_ref(), &config.background, &mut registry)
                .map_err(|e| match e {
                    AgentError::Guard(g) => AgentError::from_guard(g),
                    other => other,
                })?;
        // A start that fails from here on must not leave the cgroup behind.
        match Self::start_confined(config, identity, certified, registry, resources.clone()).await {
            Ok(node) => Ok(node),
            Err(e) => {
                resources.shutdown();
                Err(e)
            }
        }
    }

    async fn start_confined(
        config: AgentConfig,
        mut identity: NodeIdentity,
        certified: NodeCert,
        mut registry: Registry,
        resources: Arc<Resources>,
    ) -> Result<Arc<Node>, AgentError> {
        let mesh_metrics = MeshMetrics::register(&mut registry);
        let up = Gauge::<i64>::default();
        up.set(1);
        registry.register("shoal_agent_up", "1 while the agent runs", up);
        let (transport, listeners) = bind_patiently(&config, &identity, &mesh_metrics).await?;
        // Before this node takes part in membership or Raft: is its metadata state as
        // new as the cluster's record of it, and which generation must it start above?
        let rejoin = check_against_cluster(&config, &transport, &mut identity).await?;
        let (gossip, gossip_task) = start_membership(
            &config,
            &identity,
            mesh_metrics,
            transport.revocations().clone(),
        )
        .await?;
        let store = open_store(&config, &mut registry).await?;
        let (group, group_workers) = Group::start(
            &config.node.data_dir.join("meta"),
            identity.node.0,
            config.meta.clone(),
            transport.clone(),
            MetaMetrics::register(&mut registry),
            rejoin,
        )
        .await?;
        register_who_am_i(&transport, &group, &gossip);
        let stripes = Arc::new(Stripes::new(
            identity.node,
            store.clone(),
            transport.clone(),
            ClusterView {
                gossip: gossip.clone(),
                namespace: group.store_arc(),
                book: group.address_book(),
            },
            StripeSettings {
                default_ec: config.storage.ec,
                min_write_shards: config.storage.min_write_shards,
                buffer_budget_bytes: stripe_buffer_budget(&resources),
            },
            &mut registry,
        ));
        stripes.serve_on(&transport);
        let repair = RepairShared::new(&mut registry);
        let scrub = ScrubShared::new(
            &config.node.data_dir,
            config.scrub.enabled,
            config.scrub.interval,
            &mut registry,
        );
        let handles = Arc::new(OpenHandles::default());
        handles.serve(&transport);
        let tier = match &config.tiering {
            Some(t) => {
                let ca_pem =
                    std::fs::read(&config.tls.ca_cert).map_err(|e| AgentError::ConfigValue {
                        key: "tls.ca_cert".into(),
                        reason: format!("cannot read {}: {e}", config.tls.ca_cert.display()),
                    })?;
                let tier = Tier::new(
                    t.clone(),
                    t.open_store()?,
                    &ca_pem,
                    group.clone(),
                    stripes.clone(),
                    resources.clone(),
                    gossip.clone(),
                    TierMetrics::register(&mut registry),
                )?;
                info!(store = %tier.store.describe(), cold_after = %t.cold_after, "cold tier");
                // Another cluster's store is refused at start; an unreachable one only
                // delays the tier's work until it answers.
                match tier.claim().await {
                    Ok(()) => {}
                    Err(e @ AgentError::ConfigValue { .. }) => return Err(e),
                    Err(e) => warn!(error = %e, "cold tier store not reachable yet"),
                }
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
        fs.leases().metrics().register(&mut registry);
        // The last agent here stopped cleanly, all it answered under leases committed.
        fs.leases()
            .started_clean(std::fs::remove_file(config.node.data_dir.join(LEASES_CLEAN)).is_ok());
        info!(
            node = %identity.node,
            generation = identity.generation,
            gossip = %config.mesh.gossip_addr(),
            rpc = %config.mesh.rpc_addr(),
            failure_domain = %config.node.failure_domain,
            "agent started"
        );
        let workers = Workers::default();
        workers.register_metrics(&mut registry);
        let node = Arc::new(Node {
            admin_socket: config.admin.socket.clone(),
            config,
            identity,
            certified,
            gossip,
            transport: transport.clone(),
            store,
            stripes,
            group,
            handles,
            fs,
            resources,
            repair,
            scrub,
            tier,
            started_at: std::time::Instant::now(),
            registry: Arc::new(registry),
            workers,
            services: Mutex::new(Vec::new()),
        });
        node.start_workers(group_workers);
        node.start_services(listeners, gossip_task);
        Ok(node)
    }

    /// Starts every worker; the batcher stops after the others (their last units may
    /// commit through it).
    fn start_workers(&self, group: GroupWorkers) {
        let w = &self.workers;
        w.spawn_last(group.batcher);
        w.spawn(crate::consensus::CoreWatch::new(
            self.group.clone(),
            self.gossip.clone(),
        ));
        if let Some(rejoiner) = group.rejoiner {
            w.spawn(rejoiner);
        }
        let data_dir = self.config.node.data_dir.clone();
        w.spawn(facts::Facts::new(
            self.store.clone(),
            self.gossip.clone(),
            Box::new(move || facts::disk_usage(&data_dir)),
            self.group.ballast.clone(),
        ));
        w.spawn(gpu::GpuPoller::new(
            self.resources.clone(),
            Resources::gpu_probe(),
        ));
        w.spawn(metrics::MetricsRefresh::new(self.group.clone()));
        let writeback = Duration::from_millis(self.group.config.metadata_writeback_ms);
        if let Some(flush) = crate::fs::LeaseFlush::new(self.fs.leases().clone(), writeback) {
            w.spawn(flush);
        }
        w.spawn(revoke::RevocationsRefresh::new(
            self.group.clone(),
            self.transport.clone(),
            self.certified.clone(),
        ));
        w.spawn(steward::Steward::new(
            self.group.clone(),
            self.gossip.clone(),
            self.config.cluster.down_out_after,
        ));
        w.spawn(gc::OrphanShards::new(
            self.group.clone(),
            self.stripes.clone(),
        ));
        w.spawn(gc::StripeGc::new(self.group.clone(), self.stripes.clone()));
        w.spawn(scrub::Scrub::new(
            self.group.clone(),
            self.stripes.clone(),
            self.store.clone(),
            self.resources.clone(),
            self.scrub.clone(),
            self.config.scrub.max_rate_bytes().unwrap_or(32 << 20),
        ));
        w.spawn(repair::Repair::new(
            self.group.clone(),
            self.stripes.clone(),
            self.gossip.clone(),
            self.resources.clone(),
            self.repair.clone(),
        ));
        w.spawn(gc::OrphanPurge::new(
            self.group.clone(),
            self.gossip.clone(),
            self.transport.clone(),
            self.handles.clone(),
        ));
        if let Some(tier) = &self.tier {
            w.spawn(tier::TierHeat::new(tier.clone()));
            w.spawn(tier::TierGc::new(
                tier.clone(),
                Duration::from_secs(self.group.config.gc_interval_s),
            ));
            w.spawn(tier::TierMover::new(tier.clone()));
            w.spawn(tier::TierWarm::new(tier.clone()));
        }
    }

    /// Starts serving from outside: local clients (the admin socket, the metrics
    /// endpoint) as front workers, which stop first; then the cluster's traffic, in the
    /// order it stops.
    fn start_services(self: &Arc<Self>, listeners: Listeners, gossip_task: JoinHandle<()>) {
        self.workers
            .spawn_front(admin::AdminSocket::new(listeners.admin, self.clone()));
        if let Some(listener) = listeners.metrics {
            let registry = self.registry.clone();
            self.workers
                .spawn_front(metrics_http::MetricsHttp::new(listener, registry));
        }
        let mut services = vec![("rpc", self.transport.serve())];
        if let Some(bulk) = listeners.bulk {
            services.push(("bulk lane", bulk));
        }
        services.push(("gossip", gossip_task));
        *self.services.lock().unwrap_or_else(|p| p.into_inner()) = services;
    }

    /// Resolves once this node's metadata member stopped on its own (a storage failure)
    /// and the cluster had time to stop counting on it as a voter: then the agent exits
    /// non-zero, and its supervisor (systemd) starts it again.
    pub async fn metadata_failed(&self) -> String {
        let reason = self.group.core_failed().await;
        tokio::time::sleep(MEMBER_FAILED_EXIT_AFTER).await;
        reason
    }

    /// Leaves the cluster gracefully and stops everything, in dependency order: local
    /// clients (no new requests), membership (leave), the workers, Raft (its state
    /// flushed), the transport, and what is left of the services; last it leaves its
    /// cgroup.
    pub async fn shutdown(&self) {
        self.workers.stop_front().await;
        // No mount request comes any more: what the leases answered is committed, and a
        // mark tells the next agent that its mounts lost nothing.
        let closed = tokio::time::timeout(Duration::from_secs(10), self.fs.leases().close()).await;
        if closed == Ok(true) {
            let mark = self.config.node.data_dir.join(LEASES_CLEAN);
            if let Err(e) = std::fs::write(&mark, b"") {
                warn!(error = %e, "could not mark the directory leases closed");
            }
        } else {
            warn!("changes answered under directory leases were not all committed at the stop");
        }
        match tokio::time::timeout(Duration::from_secs(2), self.gossip.leave()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => warn!(error = %e, "could not announce leave"),
            Err(_) => warn!("leave announcement timed out"),
        }
        self.workers.stop().await;
        self.group.stop().await;
        if tokio::time::timeout(Duration::from_secs(2), self.transport.close())
            .await
            .is_err()
        {
            warn!("RPC connections did not close in time");
        }
        for (_, task) in self
            .services
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            task.abort();
        }
        if let Err(e) = std::fs::remove_file(&self.admin_socket) {
            warn!(path = %self.admin_socket.display(), error = %e, "could not remove admin socket");
        }
        self.resources.shutdown();
        info!("agent stopped");
    }
}

/// How long start-up waits for an address in use to be free.
const BIND_PATIENCE: Duration = Duration::from_secs(10);

/// Binds the endpoint and the listeners, trying again for up to [`BIND_PATIENCE`] while
/// an address is in use: after a crash the agent's previous instance holds its sockets
/// until its last thread has exited, and a supervisor may restart it sooner.
async fn bind_patiently(
    config: &AgentConfig,
    identity: &NodeIdentity,
    metrics: &MeshMetrics,
) -> Result<(Arc<Transport>, Listeners), AgentError> {
    let deadline = Instant::now() + BIND_PATIENCE;
    loop {
        let bound = match bind_transport(config, identity, metrics.clone()) {
            Ok(transport) => bind_listeners(config, &transport)
                .await
                .map(|listeners| (transport, listeners)),
            Err(e) => Err(e),
        };
        match bound {
            Err(e) if e.is_addr_in_use() && Instant::now() < deadline => {
                warn!(error = %e, "an address is still in use (the previous agent exiting?); trying again");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            other => return other,
        }
    }
}

/// The QUIC endpoint, with the ping every peer may send.
fn bind_transport(
    config: &AgentConfig,
    identity: &NodeIdentity,
    metrics: MeshMetrics,
) -> Result<Arc<Transport>, AgentError> {
    let transport = Transport::bind(
        config.mesh.rpc_addr(),
        &config.tls.files(),
        NODE_TLS_NAME,
        identity.node,
        metrics,
    )?;
    let me = identity.node;
    transport.register(move |_from, ping: Ping| async move {
        Ok(Pong {
            nonce: ping.nonce,
            node: me,
            agent_version: AGENT_VERSION.to_owned(),
        })
    });
    Ok(transport)
}

async fn bind_listeners(
    config: &AgentConfig,
    transport: &Arc<Transport>,
) -> Result<Listeners, AgentError> {
    let bulk = match config.mesh.bulk_addr() {
        Some(addr) => transport.start_bulk(addr, config.mesh.bulk).await?,
        None => None,
    };
    let admin = admin::bind(&config.admin)?;
    let metrics = match config.metrics.addr {
        Some(addr) => Some(metrics_http::bind(addr).await?),
        None => None,
    };
    Ok(Listeners {
        admin,
        metrics,
        bulk,
    })
}

/// Joins the cluster's membership (gossip), publishing this node's first facts.
async fn start_membership(
    config: &AgentConfig,
    identity: &NodeIdentity,
    metrics: MeshMetrics,
    revocations: Arc<Revocations>,
) -> Result<(GossipHandle, JoinHandle<()>), AgentError> {
    let key = ClusterKey::load(&config.tls.cluster_key, &config.tls.ca_cert)?;
    let me = MemberId {
        node: identity.node,
        addr: config.mesh.gossip_addr(),
        generation: identity.generation,
    };
    let (capacity_bytes, used_bytes) = facts::disk_usage(&config.node.data_dir);
    let facts = NodeFacts {
        node: identity.node,
        generation: identity.generation,
        seq: 0,
        name: config.node_name(),
        failure_domain: config.node.failure_domain.clone(),
        rpc_addr: config.mesh.rpc_addr(),
        bulk_addr: config.mesh.bulk_addr(),
        capacity_bytes,
        used_bytes,
        role: NodeRole::Active,
        agent_version: AGENT_VERSION.to_owned(),
        // The store opens next; the `facts` worker says what it can take.
        store_accepting: false,
        store_room_bytes: 0,
        repair_bytes_per_sec: 0,
        store_opening: true,
        meta_failed: false,
    };
    let (membership, _) =
        Membership::new(me, facts, &config.mesh.membership(), rand::rng().random())?;
    Ok(GossipDriver::start(
        membership,
        key,
        config.mesh.seeds.clone(),
        metrics,
        config.mesh.legacy_gossip,
        revocations,
    )
    .await?)
}

/// Opens (and recovers) this node's shard store.
async fn open_store(
    config: &AgentConfig,
    registry: &mut Registry,
) -> Result<Arc<NodeStore>, AgentError> {
    let (capacity_bytes, _) = facts::disk_usage(&config.node.data_dir);
    let limit = config.storage.limit_bytes(capacity_bytes)?;
    let ring = Ring::start(256).map_err(|source| AgentError::Setup {
        what: "the io_uring ring",
        source,
    })?;
    let (store, recovery) = DiskStore::open_with(
        &config.node.data_dir.join("store"),
        limit,
        ring,
        config.storage.direct_io,
    )
    .await?;
    if recovery != Recovery::default() {
        warn!(?recovery, "shard store recovered from an unclean stop");
    }
    store.set_reserve(config.storage.reserve_bytes()?);
    store.attach_metrics(StoreMetrics::register(registry));
    Ok(Arc::new(NodeStore::Disk(store)))
}

/// Asks the peers this node's metadata state knew what the cluster recorded for it. A
/// record newer than the data dir means the state is a stale copy: it is moved aside and
/// the node rejoins with empty state (the notice and the peers to ask are returned). The
/// run's generation is raised above every generation the peers know either way.
async fn check_against_cluster(
    config: &AgentConfig,
    transport: &Arc<Transport>,
    identity: &mut NodeIdentity,
) -> Result<Option<(String, Vec<std::net::SocketAddr>)>, AgentError> {
    use crate::consensus::rejoin::{self, Verdict};
    let meta_dir = config.node.data_dir.join("meta");
    let peers = rejoin::known_peers(&meta_dir, identity.node);
    if peers.is_empty() {
        return Ok(None);
    }
    let answers = rejoin::ask_cluster(transport, identity.node, &peers, WHO_AM_I_WAIT).await;
    identity.raise_generation(&config.node.data_dir, rejoin::min_generation(&answers))?;
    match rejoin::judge(identity.previous_generation, &answers) {
        Verdict::Current => Ok(None),
        Verdict::Unchecked => {
            info!(
                peers = peers.len(),
                "no peer answered; cannot check the metadata state against the cluster's record"
            );
            Ok(None)
        }
        Verdict::Stale { recorded, data_dir } => {
            let aside = rejoin::set_aside(&meta_dir).map_err(|source| AgentError::DataDir {
                path: meta_dir.clone(),
                source,
            })?;
            let notice = format!(
                "the data dir's metadata state was older than the cluster's record of this node (generation {data_dir}, recorded {recorded}): moved aside to {}; rejoined with fresh state as a learner",
                aside.display()
            );
            tracing::error!("{notice}");
            Ok(Some((notice, peers)))
        }
    }
}

/// How long a starting node waits for peers to say what they know of it.
const WHO_AM_I_WAIT: Duration = Duration::from_secs(3);

/// Answers "what does the cluster know of node N" from this node's replica and membership.
fn register_who_am_i(transport: &Transport, group: &Arc<Group>, gossip: &GossipHandle) {
    let (meta, gossip) = (group.clone(), gossip.clone());
    transport.register(move |_from, ask: crate::consensus::rejoin::WhoAmI| {
        let (meta, gossip) = (meta.clone(), gossip.clone());
        async move {
            let recorded = meta.store().node_generation(ask.node).ok().flatten();
            let gossip = gossip.members().await.ok().and_then(|m| {
                m.iter()
                    .filter(|v| v.id.node == ask.node)
                    .map(|v| v.id.generation)
                    .max()
            });
            Ok(crate::consensus::rejoin::Known { recorded, gossip })
        }
    });
}

/// Bytes of stripe buffers allowed in flight: a quarter of the memory reservation (the rest
/// is for the runtime, the store's index and caches), or 256 MiB for an unconfined agent.
fn stripe_buffer_budget(resources: &Resources) -> u64 {
    resources
        .guard
        .as_ref()
        .map_or(256 << 20, |g| g.reservation().memory_bytes / 4)
}
