//! The stripe coordinator: write = encode, place, send k+m shards in parallel, answer once
//! all are durable; read = fetch just the needed ranges of data shards, and on a missing,
//! slow or corrupt shard fetch any k whole shards and decode.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use shoal_agent_api::{ShardLocation, StripeRead, StripeRecord};
use shoal_mesh::{GossipHandle, MemberState, Transport};
use shoal_placement::{
    DEFAULT_SHARD_SIZE, EcProfile, Layout, LayoutNode, NodeId, NodeState, StripeGeometry, StripeId,
    place,
};
use shoal_store::{DiskStore, ShardKey, ShardStore};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tracing::warn;

use crate::AgentError;
use crate::erasure;
use crate::shard_rpc::{ShardFailure, ShardRequest, ShardResponse, failure};

const PUT_TIMEOUT: Duration = Duration::from_secs(10);
/// A data shard slower than this is read around (degraded read).
const RANGE_TIMEOUT: Duration = Duration::from_secs(2);
const WHOLE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long new stripes avoid a node a shard write just failed on.
const SUSPECT_FOR: Duration = Duration::from_secs(10);
/// How long new stripes avoid a node that just answered "full" (its gossiped facts say
/// so too within seconds, and say when it has room again).
const FULL_FOR: Duration = Duration::from_secs(30);
/// A store with less room than this takes no new shards (one full stripe's shard, and
/// some headroom for writes already placed there); a node whose facts give it less is full.
pub(crate) const MIN_ROOM: u64 = 8 << 20;
/// Placement attempts of one stripe when nodes answer "full".
const PLACE_ATTEMPTS: usize = 4;

#[derive(Clone, Default)]
struct StripeMetrics {
    written: Counter,
    read: Counter,
    degraded_reads: Counter,
    corrupt_shards: Counter,
    store_shards: Gauge,
    store_used: Gauge,
    store_limit: Gauge,
}

/// How to reach a node: QUIC for control, the bulk lane (when it runs one) for payloads.
#[derive(Clone, Copy)]
struct Addrs {
    rpc: SocketAddr,
    bulk: Option<SocketAddr>,
}

/// Who can hold shards now, and how to reach them.
struct Peers {
    layout: Layout,
    addrs: HashMap<NodeId, Addrs>,
    names: HashMap<NodeId, String>,
    /// Live nodes left out of placement for want of room (facts or a recent answer).
    full: Vec<NodeId>,
}

pub struct Stripes {
    me: NodeId,
    /// Bytes of stripe buffers in flight, in MiB permits: writes and reads wait here instead
    /// of growing the agent past its memory reservation.
    buffers: Arc<Semaphore>,
    buffer_permits: u32,
    /// Nodes a shard write just failed on (not "full"): new stripes avoid them for a
    /// while, so writes move on before membership declares a dead node down.
    suspects: std::sync::Mutex<HashMap<NodeId, std::time::Instant>>,
    /// Nodes that answered "full": new stripes go elsewhere for a while.
    full: std::sync::Mutex<HashMap<NodeId, std::time::Instant>>,
    store: Arc<DiskStore>,
    transport: Arc<Transport>,
    gossip: GossipHandle,
    /// The replicated metadata: its layout is where new shards go (gossip only says who
    /// is alive right now).
    meta: Arc<shoal_meta::MetaStore>,
    default_ec: EcProfile,
    metrics: StripeMetrics,
}

fn stripe_err(msg: impl Into<String>) -> AgentError {
    AgentError::Stripe(msg.into())
}

/// How a coordinator writes: the profile of new stripes and the buffer budget.
pub struct StripeSettings {
    pub default_ec: EcProfile,
    /// Bytes of stripe buffers allowed in flight.
    pub buffer_budget_bytes: u64,
}

impl Stripes {
    pub fn new(
        me: NodeId,
        store: Arc<DiskStore>,
        transport: Arc<Transport>,
        gossip: GossipHandle,
        meta: Arc<shoal_meta::MetaStore>,
        settings: StripeSettings,
        registry: &mut Registry,
    ) -> Self {
        let StripeSettings {
            default_ec,
            buffer_budget_bytes,
        } = settings;
        let buffer_permits = (buffer_budget_bytes >> 20).clamp(16, u32::MAX as u64 >> 4) as u32;
        let metrics = StripeMetrics::default();
        let r = registry.sub_registry_with_prefix("shoal_stripes");
        r.register(
            "written",
            "Stripes written by this coordinator",
            metrics.written.clone(),
        );
        r.register(
            "read",
            "Stripe reads served by this coordinator",
            metrics.read.clone(),
        );
        r.register(
            "degraded_reads",
            "Stripe reads that had to decode",
            metrics.degraded_reads.clone(),
        );
        let st = registry.sub_registry_with_prefix("shoal_store");
        st.register(
            "shards",
            "Shards in this node's store",
            metrics.store_shards.clone(),
        );
        st.register(
            "used_bytes",
            "Bytes of shard files in this node's store",
            metrics.store_used.clone(),
        );
        st.register(
            "limit_bytes",
            "Fill limit of this node's store; writes past it fail with \"node full\"",
            metrics.store_limit.clone(),
        );
        registry.register(
            "shoal_store_corrupt_shards",
            "Shards found not to match their checksum (on this node's store or seen by this coordinator)",
            metrics.corrupt_shards.clone(),
        );
        let stripes = Stripes {
            me,
            buffers: Arc::new(Semaphore::new(buffer_permits as usize)),
            buffer_permits,
            suspects: std::sync::Mutex::new(HashMap::new()),
            full: std::sync::Mutex::new(HashMap::new()),
            store,
            transport,
            gossip,
            meta,
            default_ec,
            metrics,
        };
        stripes.update_store_gauges();
        stripes
    }

    /// The layout new stripes are placed under: the committed layout, with nodes that
    /// gossip does not see alive right now, or that take no new shards (full, or their
    /// store failing: from their facts or a recent answer), marked down (new shards skip
    /// them; reads still reach them). Before the metadata group has committed a layout,
    /// one is derived from gossip (epoch 0).
    async fn peers(&self) -> Result<Peers, AgentError> {
        let members = self.gossip.members().await?;
        let mut gossip_nodes = Vec::new();
        let mut addrs = HashMap::new();
        let mut names = HashMap::new();
        let mut full = recent(&self.full, FULL_FOR);
        let mut refusing = Vec::new();
        for m in members
            .into_iter()
            .filter(|m| m.state == MemberState::Alive)
        {
            let Some(f) = m.facts else { continue };
            let id = m.id.node;
            if !f.store_accepting {
                if f.store_room_bytes < MIN_ROOM {
                    full.push(id);
                } else {
                    refusing.push(id);
                }
            }
            gossip_nodes.push(LayoutNode::active(
                id,
                f.failure_domain.as_str(),
                f.capacity_bytes.max(1),
            ));
            addrs.insert(
                id,
                Addrs {
                    rpc: f.rpc_addr,
                    bulk: f.bulk_addr,
                },
            );
            names.insert(id, f.name);
        }
        for n in recent(&self.suspects, SUSPECT_FOR) {
            addrs.remove(&n);
        }
        full.retain(|id| addrs.contains_key(id));
        let takes_shards =
            |id: &NodeId| addrs.contains_key(id) && !refusing.contains(id) && !full.contains(id);
        gossip_nodes.retain(|n| takes_shards(&n.id));
        let committed = self
            .meta
            .cluster_layout()
            .map_err(|e| stripe_err(format!("cannot read the cluster layout: {e}")))?;
        let layout = match committed {
            Some(l) => {
                let nodes = l
                    .nodes()
                    .iter()
                    .map(|n| {
                        let mut n = n.clone();
                        if !takes_shards(&n.id) && n.state == NodeState::Active {
                            n.state = NodeState::Down;
                        }
                        n
                    })
                    .collect();
                Layout::new(l.epoch(), nodes)
            }
            None => Layout::new(0, gossip_nodes),
        }
        .map_err(|e| stripe_err(e.to_string()))?;
        Ok(Peers {
            layout,
            addrs,
            names,
            full,
        })
    }

    fn suspect(&self, node: NodeId) {
        if node != self.me {
            lock(&self.suspects).insert(node, std::time::Instant::now());
        }
    }

    fn mark_full(&self, node: NodeId) {
        lock(&self.full).insert(node, std::time::Instant::now());
    }

    /// Deletes every shard of a stripe. Ok when no node holds one any more; an error
    /// names the first shard that could not be deleted (its node down, say) so the
    /// caller tries again later.
    pub async fn delete(self: &Arc<Self>, record: &StripeRecord) -> Result<(), AgentError> {
        let peers = self.peers().await?;
        let mut set = JoinSet::new();
        for shard in &record.shards {
            let this = self.clone();
            let addr = peers.addrs.get(&shard.node).copied();
            let (node, index) = (shard.node, shard.index);
            let req = ShardRequest::Delete {
                stripe: record.id.0,
                index,
            };
            set.spawn(async move { (node, index, this.call(node, addr, req, PUT_TIMEOUT).await) });
        }
        for (node, index, resp) in set.join_all().await {
            match resp {
                ShardResponse::Deleted(_)
                | ShardResponse::Failed {
                    kind: ShardFailure::NotFound,
                    ..
                } => {}
                other => {
                    return Err(stripe_err(format!(
                        "shard {index} of stripe {} on {node}: {other:?}",
                        record.id
                    )));
                }
            }
        }
        Ok(())
    }

    /// Stripe ids with at least one shard in this node's store.
    pub fn local_stripes(&self) -> Vec<StripeId> {
        let mut ids: Vec<StripeId> = self
            .store
            .list()
            .into_iter()
            .map(|(k, _)| StripeId(k.stripe))
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// Deletes every shard of `stripe` in this node's store; returns how many there were.
    pub async fn delete_local(&self, stripe: StripeId) -> Result<usize, AgentError> {
        let keys: Vec<ShardKey> = self
            .store
            .list()
            .into_iter()
            .map(|(k, _)| k)
            .filter(|k| k.stripe == stripe.0)
            .collect();
        for k in &keys {
            self.store.delete(*k).await?;
        }
        self.update_store_gauges();
        Ok(keys.len())
    }

    /// The erasure-coding profile of new stripes.
    pub fn default_ec(&self) -> EcProfile {
        self.default_ec
    }

    /// Serves one shard request against this node's store (local or from a peer).
    pub async fn serve_shard(&self, req: ShardRequest) -> ShardResponse {
        let changes_usage = !matches!(req, ShardRequest::Get { .. });
        let response = self.serve_shard_inner(req).await;
        if changes_usage {
            self.update_store_gauges();
        }
        response
    }

    fn update_store_gauges(&self) {
        let u = self.store.usage();
        self.metrics.store_shards.set(u.shards as i64);
        self.metrics.store_used.set(u.used_bytes as i64);
        self.metrics.store_limit.set(u.limit_bytes as i64);
    }

    async fn serve_shard_inner(&self, req: ShardRequest) -> ShardResponse {
        match req {
            ShardRequest::Put {
                stripe,
                index,
                data,
            } => match self.store.put(ShardKey { stripe, index }, data).await {
                Ok(()) => ShardResponse::Stored,
                Err(e) => failure(&e),
            },
            ShardRequest::Get {
                stripe,
                index,
                offset,
                len,
            } => {
                match self
                    .store
                    .get(ShardKey { stripe, index }, offset, len)
                    .await
                {
                    Ok(b) => ShardResponse::Data(b.to_vec()),
                    Err(e) => {
                        if matches!(e, shoal_store::StoreError::Corrupt { .. }) {
                            self.metrics.corrupt_shards.inc();
                            warn!(stripe = %StripeId(stripe), shard = index, error = %e, "corrupt shard on this node");
                        }
                        failure(&e)
                    }
                }
            }
            ShardRequest::Delete { stripe, index } => {
                match self.store.delete(ShardKey { stripe, index }).await {
                    Ok(existed) => ShardResponse::Deleted(existed),
                    Err(e) => failure(&e),
                }
            }
        }
    }

    async fn call(
        self: &Arc<Self>,
        node: NodeId,
        addr: Option<Addrs>,
        req: ShardRequest,
        timeout: Duration,
    ) -> ShardResponse {
        if node == self.me {
            return match tokio::time::timeout(timeout, self.serve_shard(req)).await {
                Ok(r) => r,
                Err(_) => ShardResponse::Failed {
                    kind: ShardFailure::Other,
                    message: "local store timed out".into(),
                },
            };
        }
        let Some(addr) = addr else {
            return ShardResponse::Failed {
                kind: ShardFailure::Other,
                message: format!("node {node} is not alive"),
            };
        };
        // Shard payloads take the bulk lane when both ends run one; deletes stay on QUIC.
        let res = match (addr.bulk, &req) {
            (Some(bulk), ShardRequest::Put { .. } | ShardRequest::Get { .. })
                if self.transport.has_bulk() =>
            {
                self.transport.call_bulk(bulk, &req, timeout).await
            }
            _ => self.transport.call(addr.rpc, &req, timeout).await,
        };
        match res {
            Ok(r) => r,
            Err(e) => ShardResponse::Failed {
                kind: ShardFailure::Other,
                message: e.to_string(),
            },
        }
    }

    /// Waits until `bytes` of buffer fit in the budget (back-pressure, never unbounded growth).
    async fn reserve_buffers(
        &self,
        bytes: u64,
    ) -> Result<tokio::sync::OwnedSemaphorePermit, AgentError> {
        let permits = (bytes.div_ceil(1 << 20) as u32).clamp(1, self.buffer_permits);
        self.buffers
            .clone()
            .acquire_many_owned(permits)
            .await
            .map_err(|_| stripe_err("agent is shutting down"))
    }

    /// Writes one stripe; returns its record once every shard is durable. A node that
    /// answers "full" is left out and the stripe placed again (on other nodes), so only a
    /// cluster without room for it fails with [`AgentError::NoSpace`].
    pub async fn write(
        self: &Arc<Self>,
        data: Vec<u8>,
        ec: Option<EcProfile>,
    ) -> Result<StripeRecord, AgentError> {
        let ec = ec.unwrap_or(self.default_ec);
        ec.validate().map_err(|e| stripe_err(e.to_string()))?;
        // The data, its k+m shards and their RPC copies.
        let in_flight = data.len() as u64 * (2 * ec.total() as u64 + ec.k as u64) / ec.k as u64;
        let _buffers = self.reserve_buffers(in_flight).await?;
        let geometry = StripeGeometry::with_default_shard_size(data.len() as u64, ec.k)
            .map_err(|e| stripe_err(e.to_string()))?;
        let shards = tokio::task::spawn_blocking(move || erasure::encode(&data, ec, &geometry))
            .await
            .map_err(|e| stripe_err(e.to_string()))?
            .map_err(stripe_err)?;
        let shards: Vec<Bytes> = shards.into_iter().map(Bytes::from).collect();
        let crcs: Vec<u32> = shards.iter().map(|s| crc32c::crc32c(s)).collect();
        let mut full_seen = Vec::new();
        for _ in 0..PLACE_ATTEMPTS {
            let peers = self.peers().await?;
            let id = StripeId(rand::random());
            let targets = match place(&peers.layout, id, ec) {
                Ok(t) => t,
                Err(e) if !full_seen.is_empty() || !peers.full.is_empty() => {
                    let mut full = full_seen.clone();
                    full.extend(&peers.full);
                    return Err(AgentError::NoSpace(format!(
                        "no room for a {ec} stripe: {e} ({} full)",
                        names_of(&peers, &full)
                    )));
                }
                Err(e) => return Err(stripe_err(e.to_string())),
            };
            let failed = self.put_shards(id, &shards, &targets, &peers).await;
            if failed.is_empty() {
                self.metrics.written.inc();
                return Ok(StripeRecord {
                    id,
                    len: geometry.len(),
                    ec,
                    shard_len: geometry.shard_len(),
                    epoch: peers.layout.epoch(),
                    shards: targets
                        .iter()
                        .enumerate()
                        .map(|(i, node)| ShardLocation {
                            index: i as u8,
                            node: *node,
                            crc32c: crcs[i],
                        })
                        .collect(),
                });
            }
            if failed.iter().all(|f| f.kind == ShardFailure::Full) {
                for f in &failed {
                    self.mark_full(f.node);
                    full_seen.push(f.node);
                }
                continue;
            }
            return Err(stripe_err(format!(
                "stripe write failed: {}",
                describe(&peers, &failed)
            )));
        }
        Err(AgentError::NoSpace(format!(
            "no room for a {ec} stripe after {PLACE_ATTEMPTS} placements ({} answered full)",
            full_seen.len()
        )))
    }

    /// Sends shard `i` to `targets[i]`, all at once. Returns what failed; when anything
    /// did, the shards that were stored are deleted again (nothing references them).
    async fn put_shards(
        self: &Arc<Self>,
        id: StripeId,
        shards: &[Bytes],
        targets: &[NodeId],
        peers: &Peers,
    ) -> Vec<FailedShard> {
        let mut set = JoinSet::new();
        for (i, (shard, node)) in shards.iter().zip(targets.iter().copied()).enumerate() {
            let this = self.clone();
            let addr = peers.addrs.get(&node).copied();
            let req = ShardRequest::Put {
                stripe: id.0,
                index: i as u8,
                data: shard.clone(),
            };
            set.spawn(
                async move { (i as u8, node, this.call(node, addr, req, PUT_TIMEOUT).await) },
            );
        }
        let mut failed = Vec::new();
        let mut stored = Vec::new();
        for (index, node, resp) in set.join_all().await {
            let (kind, message) = match resp {
                ShardResponse::Stored => {
                    stored.push((index, node));
                    continue;
                }
                ShardResponse::Failed { kind, message } => (kind, message),
                other => (ShardFailure::Other, format!("unexpected answer {other:?}")),
            };
            if kind == ShardFailure::Other {
                self.suspect(node);
            }
            failed.push(FailedShard {
                index,
                node,
                kind,
                message,
            });
        }
        if !failed.is_empty() {
            for (index, node) in stored {
                let req = ShardRequest::Delete {
                    stripe: id.0,
                    index,
                };
                let _ = self
                    .call(node, peers.addrs.get(&node).copied(), req, PUT_TIMEOUT)
                    .await;
            }
        }
        failed
    }

    /// Reads `[offset, offset+len)` of a stripe.
    pub async fn read(
        self: &Arc<Self>,
        record: &StripeRecord,
        offset: u64,
        len: u64,
    ) -> Result<StripeRead, AgentError> {
        let ec = record.ec;
        record.check().map_err(stripe_err)?;
        let geometry = StripeGeometry::new(record.len, ec.k, DEFAULT_SHARD_SIZE)
            .map_err(|e| stripe_err(e.to_string()))?;
        if geometry.shard_len() != record.shard_len {
            return Err(stripe_err("stripe record does not match its geometry"));
        }
        let slices = geometry
            .shards_for_range(offset, len)
            .map_err(|e| stripe_err(e.to_string()))?;
        // Enough for a degraded read: every shard whole, plus the answer.
        let _buffers = self
            .reserve_buffers(record.shard_len * ec.total() as u64 * 2 + len)
            .await?;
        let peers = self.peers().await?;
        self.metrics.read.inc();
        let mut set = JoinSet::new();
        for (n, s) in slices.iter().enumerate() {
            let loc = &record.shards[s.shard_index as usize];
            let this = self.clone();
            let addr = peers.addrs.get(&loc.node).copied();
            let req = ShardRequest::Get {
                stripe: record.id.0,
                index: s.shard_index,
                offset: s.offset_in_shard,
                len: Some(s.len),
            };
            let node = loc.node;
            set.spawn(async move { (n, this.call(node, addr, req, RANGE_TIMEOUT).await) });
        }
        let mut parts: Vec<Option<Vec<u8>>> = vec![None; slices.len()];
        let mut bad = Vec::new();
        for (n, resp) in set.join_all().await {
            match resp {
                ShardResponse::Data(d) if d.len() as u64 == slices[n].len => parts[n] = Some(d),
                other => {
                    self.note_bad(record, slices[n].shard_index, &other);
                    bad.push(slices[n].shard_index);
                }
            }
        }
        if bad.is_empty() {
            let data = parts.into_iter().flatten().flatten().collect();
            return Ok(StripeRead {
                data,
                decoded: false,
                bad_shards: vec![],
            });
        }
        self.metrics.degraded_reads.inc();
        self.degraded(record, &peers, bad, offset, len).await
    }

    fn note_bad(&self, record: &StripeRecord, index: u8, resp: &ShardResponse) {
        match resp {
            ShardResponse::Failed {
                kind: ShardFailure::Corrupt,
                message,
            } => {
                self.metrics.corrupt_shards.inc();
                warn!(stripe = %record.id, shard = index, %message, "corrupt shard; reading around it");
            }
            other => {
                warn!(stripe = %record.id, shard = index, answer = ?short(other), "shard unavailable; reading around it")
            }
        }
    }

    async fn degraded(
        self: &Arc<Self>,
        record: &StripeRecord,
        peers: &Peers,
        mut bad: Vec<u8>,
        offset: u64,
        len: u64,
    ) -> Result<StripeRead, AgentError> {
        let mut set = JoinSet::new();
        for loc in record.shards.iter().filter(|l| !bad.contains(&l.index)) {
            let this = self.clone();
            let addr = peers.addrs.get(&loc.node).copied();
            let req = ShardRequest::Get {
                stripe: record.id.0,
                index: loc.index,
                offset: 0,
                len: None,
            };
            let (node, index, crc) = (loc.node, loc.index, loc.crc32c);
            set.spawn(async move { (index, crc, this.call(node, addr, req, WHOLE_TIMEOUT).await) });
        }
        let mut have: Vec<Option<Vec<u8>>> = vec![None; record.shards.len()];
        let mut got = 0;
        // Any k shards will do: stop waiting for slow or dead holders once k have answered.
        while let Some(joined) = set.join_next().await {
            let Ok((index, crc, resp)) = joined else {
                continue;
            };
            match resp {
                ShardResponse::Data(d) if crc32c::crc32c(&d) == crc => {
                    have[index as usize] = Some(d);
                    got += 1;
                    if got == record.ec.k as usize {
                        set.abort_all();
                        break;
                    }
                }
                other => {
                    self.note_bad(record, index, &other);
                    bad.push(index);
                }
            }
        }
        let ec = record.ec;
        let shard_len = record.shard_len as usize;
        let data_shards =
            tokio::task::spawn_blocking(move || erasure::decode(ec, shard_len, &have))
                .await
                .map_err(|e| stripe_err(e.to_string()))?
                .map_err(|e| stripe_err(format!("stripe {} unreadable: {e}", record.id)))?;
        let joined = data_shards.concat();
        let end = (offset + len) as usize;
        let data = joined
            .get(offset as usize..end)
            .ok_or_else(|| stripe_err("range outside the stripe"))?
            .to_vec();
        bad.sort_unstable();
        bad.dedup();
        Ok(StripeRead {
            data,
            decoded: true,
            bad_shards: bad,
        })
    }
}

/// One shard a stripe write could not store.
struct FailedShard {
    index: u8,
    node: NodeId,
    kind: ShardFailure,
    message: String,
}

/// "shard 2 on node3 (…): failed: …; …" for an error message.
fn describe(peers: &Peers, failed: &[FailedShard]) -> String {
    let parts: Vec<String> = failed
        .iter()
        .map(|f| {
            let name = peers.names.get(&f.node).cloned().unwrap_or_default();
            let what = if f.kind == ShardFailure::Full {
                "node full"
            } else {
                "failed"
            };
            format!(
                "shard {} on {name} ({}): {what}: {}",
                f.index, f.node, f.message
            )
        })
        .collect();
    parts.join("; ")
}

/// The names of `nodes`, for an error message.
fn names_of(peers: &Peers, nodes: &[NodeId]) -> String {
    let mut names: Vec<String> = nodes
        .iter()
        .map(|n| peers.names.get(n).cloned().unwrap_or_else(|| n.to_string()))
        .collect();
    names.sort();
    names.dedup();
    names.join(", ")
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The nodes marked in `marks` within the last `window` (older marks are dropped).
fn recent(
    marks: &std::sync::Mutex<HashMap<NodeId, std::time::Instant>>,
    window: Duration,
) -> Vec<NodeId> {
    let mut m = lock(marks);
    m.retain(|_, at| at.elapsed() < window);
    m.keys().copied().collect()
}

fn short(r: &ShardResponse) -> String {
    match r {
        ShardResponse::Failed { kind, message } => format!("{kind:?}: {message}"),
        ShardResponse::Data(d) => format!("{} bytes (wrong length or checksum)", d.len()),
        other => format!("{other:?}"),
    }
}
