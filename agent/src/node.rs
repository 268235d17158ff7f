//! The composition root: one [`Node`] owns every subsystem of the agent.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use rand::RngExt;
use shoal_agent_api::NODE_TLS_NAME;
use shoal_mesh::{
    ClusterKey, GossipDriver, GossipHandle, MemberId, Membership, MeshMetrics, NodeFacts, NodeRole,
    Transport,
};
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::meta::metrics::{self as meta_metrics, MetaMetrics};
use crate::meta::{FsService, MetaService, gc, steward};
use crate::shard_rpc::ShardRequest;
use crate::stripes::{StripeSettings, Stripes};
use crate::system_rpc::{Ping, Pong};
use crate::{AGENT_VERSION, AgentConfig, AgentError, NodeIdentity, Resources, admin, metrics_http};
use shoal_store::{DiskStore, Recovery, Ring};

/// How often the node looks at its store and filesystem for its facts.
const FACTS_CHECK: Duration = Duration::from_secs(2);
/// How often the node re-publishes its facts when nothing worth telling changed.
const FACTS_REFRESH: Duration = Duration::from_secs(30);

/// One running agent.
pub struct Node {
    /// The validated configuration this node runs with.
    pub config: AgentConfig,
    /// Stable node id and this run's generation.
    pub identity: NodeIdentity,
    /// Membership: handle to the gossip task (SWIM over the authenticated UDP envelope).
    pub gossip: GossipHandle,
    /// QUIC endpoint (mutual TLS) for RPC to and from peers.
    pub transport: Arc<Transport>,
    /// This node's shard store (io_uring, checksummed files, redb index).
    pub store: Arc<DiskStore>,
    /// Stripe write/read coordination (erasure coding across the cluster).
    pub stripes: Arc<Stripes>,
    /// The metadata group member: namespace and cluster layout (Raft over redb).
    pub meta: Arc<MetaService>,
    /// The filesystem served to the local `shoal mount`.
    pub fs: Arc<FsService>,
    /// CPU/RAM reservation, GPU view and background-work governor.
    pub resources: Arc<Resources>,
    /// Everything exported at `/metrics`.
    pub registry: Arc<Registry>,
    /// Background tasks, aborted at shutdown.
    tasks: Mutex<Vec<JoinHandle<()>>>,
    /// Admin socket path, removed at shutdown.
    admin_socket: PathBuf,
}

impl Node {
    /// Builds every subsystem from `config` and starts serving. Sockets are bound before
    /// anything is spawned, so a bad address fails the start instead of a background task.
    pub async fn start(config: AgentConfig) -> Result<Arc<Node>, AgentError> {
        let identity = NodeIdentity::load_or_create(&config.node.data_dir)?;
        let mut registry = Registry::default();
        // First: everything after this runs inside the reservation.
        let resources =
            Resources::start(config.resources.as_ref(), &mut registry).map_err(|e| match e {
                AgentError::Guard(g) => AgentError::from_guard(g),
                other => other,
            })?;
        // A start that fails from here on must not leave the cgroup behind.
        match Self::start_confined(config, identity, registry, resources.clone()).await {
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
        mut registry: Registry,
        resources: Arc<Resources>,
    ) -> Result<Arc<Node>, AgentError> {
        let mesh_metrics = MeshMetrics::register(&mut registry);
        let info = Gauge::<i64>::default();
        info.set(1);
        registry.register("shoal_agent_up", "1 while the agent runs", info);

        let key = ClusterKey::load(&config.tls.cluster_key, &config.tls.ca_cert)?;
        let transport = Transport::bind(
            config.mesh.rpc_addr(),
            &config.tls.files(),
            NODE_TLS_NAME,
            identity.node,
            mesh_metrics.clone(),
        )?;
        let me_node = identity.node;
        transport.register(move |_from, ping: Ping| async move {
            Ok(Pong {
                nonce: ping.nonce,
                node: me_node,
                agent_version: AGENT_VERSION.to_owned(),
            })
        });

        let bulk_task = match config.mesh.bulk_addr() {
            Some(addr) => transport.start_bulk(addr, config.mesh.bulk).await?,
            None => None,
        };
        let admin_listener = admin::bind(&config.admin)?;
        let metrics_listener = match config.metrics.addr {
            Some(addr) => Some(metrics_http::bind(addr).await?),
            None => None,
        };

        // Before this node takes part in membership or Raft: is its metadata state as
        // new as the cluster's record of it, and which generation must it start above?
        let rejoin = check_against_cluster(&config, &transport, &mut identity).await?;
        let me = MemberId {
            node: identity.node,
            addr: config.mesh.gossip_addr(),
            generation: identity.generation,
        };
        let (capacity_bytes, used_bytes) = disk_usage(&config);
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
            // The store opens below; the first refresh says what it can take.
            store_accepting: false,
            store_room_bytes: 0,
        };
        let (membership, _) =
            Membership::new(me, facts, &config.mesh.membership(), rand::rng().random())?;
        let (gossip, gossip_task) =
            GossipDriver::start(membership, key, config.mesh.seeds.clone(), mesh_metrics).await?;

        let limit = config.storage.limit_bytes(capacity_bytes)?;
        let ring =
            Ring::start(256).map_err(|e| AgentError::Io(format!("cannot start io_uring: {e}")))?;
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
        let store = Arc::new(store);
        let meta = MetaService::start(
            &config.node.data_dir.join("meta"),
            identity.node.0,
            config.meta.clone(),
            transport.clone(),
            MetaMetrics::register(&mut registry),
            rejoin,
        )
        .await?;
        register_who_am_i(&transport, &meta, &gossip);
        let stripes = Arc::new(Stripes::new(
            identity.node,
            store.clone(),
            transport.clone(),
            gossip.clone(),
            meta.store_arc(),
            StripeSettings {
                default_ec: config.storage.ec,
                buffer_budget_bytes: stripe_buffer_budget(&resources),
            },
            &mut registry,
        ));
        let handler = stripes.clone();
        transport.register(move |_from, req: ShardRequest| {
            let handler = handler.clone();
            async move { Ok(handler.serve_shard(req).await) }
        });
        let fs = Arc::new(FsService::new(
            meta.clone(),
            stripes.clone(),
            gossip.clone(),
        ));

        info!(
            node = %identity.node,
            generation = identity.generation,
            gossip = %config.mesh.gossip_addr(),
            rpc = %config.mesh.rpc_addr(),
            failure_domain = %config.node.failure_domain,
            "agent started"
        );
        let node = Arc::new(Node {
            admin_socket: config.admin.socket.clone(),
            config,
            identity,
            gossip,
            transport: transport.clone(),
            store,
            stripes,
            meta: meta.clone(),
            fs,
            resources,
            registry: Arc::new(registry),
            tasks: Mutex::new(Vec::new()),
        });
        let mut tasks = vec![gossip_task, transport.serve()];
        tasks.extend(bulk_task);
        tasks.push(tokio::spawn(admin::serve(admin_listener, node.clone())));
        if let Some(listener) = metrics_listener {
            tasks.push(tokio::spawn(metrics_http::serve(
                listener,
                node.registry.clone(),
            )));
        }
        tasks.push(tokio::spawn(refresh_facts(node.clone())));
        tasks.push(tokio::spawn(meta_metrics::refresh(meta.clone())));
        tasks.push(tokio::spawn(steward::run(
            meta.clone(),
            node.gossip.clone(),
        )));
        tasks.push(tokio::spawn(gc::run(
            meta.clone(),
            node.stripes.clone(),
            node.gossip.clone(),
        )));
        *node.tasks.lock().unwrap_or_else(|p| p.into_inner()) = tasks;
        Ok(node)
    }

    /// Leaves the cluster gracefully and stops every task.
    pub async fn shutdown(&self) {
        match tokio::time::timeout(Duration::from_secs(2), self.gossip.leave()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => warn!(error = %e, "could not announce leave"),
            Err(_) => warn!("leave announcement timed out"),
        }
        if let Err(e) = self.meta.raft.shutdown().await {
            warn!(error = %e, "metadata service did not stop cleanly");
        }
        // Applies are flushed in groups; a clean stop flushes the rest (a crash replays
        // them from the log instead).
        if let Err(e) = self.meta.store().persist() {
            warn!(error = %e, "could not flush the metadata state");
        }
        if tokio::time::timeout(Duration::from_secs(2), self.transport.close())
            .await
            .is_err()
        {
            warn!("RPC connections did not close in time");
        }
        for task in self
            .tasks
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

/// Asks the peers this node's metadata state knew what the cluster recorded for it. A
/// record newer than the data dir means the state is a stale copy: it is moved aside and
/// the node rejoins with empty state (the notice and the peers to ask are returned). The
/// run's generation is raised above every generation the peers know either way.
async fn check_against_cluster(
    config: &AgentConfig,
    transport: &Arc<Transport>,
    identity: &mut NodeIdentity,
) -> Result<Option<(String, Vec<std::net::SocketAddr>)>, AgentError> {
    use crate::meta::rejoin::{self, Verdict};
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
fn register_who_am_i(transport: &Transport, meta: &Arc<MetaService>, gossip: &GossipHandle) {
    let (meta, gossip) = (meta.clone(), gossip.clone());
    transport.register(move |_from, ask: crate::meta::rejoin::WhoAmI| {
        let (meta, gossip) = (meta.clone(), gossip.clone());
        async move {
            let recorded = meta.store().node_generation(ask.node).ok().flatten();
            let gossip = gossip.members().await.ok().and_then(|m| {
                m.iter()
                    .filter(|v| v.id.node == ask.node)
                    .map(|v| v.id.generation)
                    .max()
            });
            Ok(crate::meta::rejoin::Known { recorded, gossip })
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

/// Size and use of the filesystem holding the data dir.
fn disk_usage(config: &AgentConfig) -> (u64, u64) {
    match nix::sys::statvfs::statvfs(&config.node.data_dir) {
        Ok(s) => {
            let frag = s.fragment_size();
            let total = s.blocks() * frag;
            let used = (s.blocks() - s.blocks_free()) * frag;
            (total, used)
        }
        Err(e) => {
            warn!(error = %e, "statvfs of the data dir failed");
            (0, 0)
        }
    }
}

/// What the node's facts say about its store: whether it takes new shards, and its room.
fn store_facts(node: &Node) -> (bool, u64) {
    let room = node.store.room();
    let ring_ok = matches!(
        node.store.ring_health(),
        shoal_store::RingHealth::Running { .. }
    );
    (ring_ok && room >= crate::stripes::MIN_ROOM, room)
}

/// Whether facts changed enough to tell the cluster now: the store stopped or started
/// taking shards, or its room moved by a sixteenth.
fn facts_changed(before: (bool, u64), now: (bool, u64)) -> bool {
    before.0 != now.0 || before.1.abs_diff(now.1) > before.1.max(now.1) / 16
}

async fn refresh_facts(node: Arc<Node>) {
    let mut tick = tokio::time::interval(FACTS_CHECK);
    let mut told: Option<(bool, u64)> = None;
    let mut told_at = std::time::Instant::now();
    loop {
        tick.tick().await;
        node.meta.ballast.restore();
        let store = store_facts(&node);
        if told.is_some_and(|t| !facts_changed(t, store)) && told_at.elapsed() < FACTS_REFRESH {
            continue;
        }
        if told.is_some_and(|t| t.0 && !store.0) {
            warn!(room = store.1, ring = ?node.store.ring_health(), "the shard store takes no new shards; writers place elsewhere");
        }
        let (capacity, used) = disk_usage(&node.config);
        let res = node
            .gossip
            .publish(move |f| {
                f.capacity_bytes = capacity;
                f.used_bytes = used;
                f.store_accepting = store.0;
                f.store_room_bytes = store.1;
            })
            .await;
        if res.is_err() {
            return;
        }
        told = Some(store);
        told_at = std::time::Instant::now();
    }
}

#[cfg(test)]
mod tests {
    use super::facts_changed;

    #[test]
    fn facts_are_republished_when_the_store_state_or_room_moves() {
        assert!(!facts_changed((true, 1600), (true, 1600)));
        assert!(!facts_changed((true, 1600), (true, 1550)));
        assert!(facts_changed((true, 1600), (true, 1400)));
        assert!(facts_changed((true, 1600), (false, 1600)));
        assert!(facts_changed((true, 0), (true, 1)));
    }
}
