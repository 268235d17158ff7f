//! [`Stripes`]: the coordinator's state, the shard RPCs it serves and sends, and the
//! buffer budget. Writes are in `write.rs`, reads in `read.rs`, the placement view in
//! `peers.rs`.
//!
//! `shoal bench stripes` writes stripes outside the metadata (`Request::WriteStripe`):
//! their shards are orphans, collected after `orphan_shard_grace_s`, and repair does not
//! know them. Metrics: `shoal_stripes_{written,read,degraded_reads,degraded_writes,
//! corrupt_shards_seen}_total`.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use shoal_agent_api::StripeRecord;
use shoal_mesh::{FailureClass, GossipHandle, MeshError, Transport};
use shoal_placement::{EcProfile, NodeId, StripeId};
use shoal_store::{NodeStore, ShardKey, ShardStore};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tracing::warn;

use super::error::{ShardFault, ShardFaults, StripeError};
use super::peers::{self, Addrs, Marks, Peers};
use super::shard_rpc::{ShardFailure, ShardRequest, ShardResponse, failure};

pub(super) const PUT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long new stripes avoid a node a shard write just failed on.
const SUSPECT_FOR: Duration = Duration::from_secs(10);
/// How long new stripes avoid a node that just answered "full" (its gossiped facts say
/// so too within seconds, and say when it has room again).
const FULL_FOR: Duration = Duration::from_secs(30);

#[derive(Clone, Default)]
pub(super) struct StripeMetrics {
    pub written: Counter,
    pub read: Counter,
    pub degraded_reads: Counter,
    /// Stripes written with fewer than k+m shards.
    pub degraded_writes: Counter,
    /// Corrupt shards this coordinator was answered with, or found by checksum.
    pub corrupt_seen: Counter,
}

/// The stripe coordinator of this node (see the module doc of `data`).
pub struct Stripes {
    pub(super) me: NodeId,
    /// Bytes of stripe buffers in flight, in MiB permits: writes and reads wait here instead
    /// of growing the agent past its memory reservation.
    buffers: Arc<Semaphore>,
    buffer_permits: u32,
    /// Nodes a shard write just failed on (not "full"): new stripes avoid them for a
    /// while, so writes move on before membership declares a dead node down.
    suspects: Marks,
    /// Nodes that answered "full": new stripes go elsewhere for a while.
    full: Marks,
    store: Arc<NodeStore>,
    transport: Arc<Transport>,
    pub(super) gossip: GossipHandle,
    /// The replicated metadata: its layout is where new shards go (gossip only says who
    /// is alive right now).
    namespace: Arc<shoal_namespace::NamespaceStore>,
    pub(super) default_ec: EcProfile,
    /// `[storage] min_write_shards`.
    pub(super) min_write_shards: Option<u8>,
    /// Shards of this node that reads found corrupt, for the scrub worker.
    corrupt: Arc<super::CorruptReports>,
    /// Shards of this node being disowned: puts of them are refused meanwhile.
    disowning: Arc<super::disowning::Disowning>,
    pub(super) metrics: StripeMetrics,
    /// When this coordinator started: for a while after, its view of who is alive is
    /// still forming.
    pub(super) started: tokio::time::Instant,
    /// Where a node was last known to listen when gossip has no word on it (the metadata
    /// group's member addresses): a read that cannot do without that node still asks it.
    pub(super) book: AddressBook,
}

/// How a coordinator sees the cluster: who is alive (gossip), where shards go (the
/// replicated layout) and where to ask a node gossip has not heard of.
pub struct ClusterView {
    pub gossip: GossipHandle,
    pub namespace: Arc<shoal_namespace::NamespaceStore>,
    pub book: AddressBook,
}

/// Whether a store error says the shard itself is damaged (corrupt, or its read failed
/// with an I/O error) rather than the store or the request: scrub checks such a shard.
fn is_damage(e: &shoal_store::StoreError) -> bool {
    matches!(
        e,
        shoal_store::StoreError::Corrupt { .. } | shoal_store::StoreError::Io { .. }
    )
}

/// A node's last known RPC address, from outside gossip (see [`Stripes`]).
pub type AddressBook = Arc<dyn Fn(NodeId) -> Option<std::net::SocketAddr> + Send + Sync>;

/// How a coordinator writes: the profile of new stripes and the buffer budget.
pub struct StripeSettings {
    pub default_ec: EcProfile,
    /// `[storage] min_write_shards` (None: k+1).
    pub min_write_shards: Option<u8>,
    /// Bytes of stripe buffers allowed in flight.
    pub buffer_budget_bytes: u64,
}

impl Stripes {
    pub fn new(
        me: NodeId,
        store: Arc<NodeStore>,
        transport: Arc<Transport>,
        view: ClusterView,
        settings: StripeSettings,
        registry: &mut Registry,
    ) -> Self {
        let ClusterView {
            gossip,
            namespace,
            book,
        } = view;
        let StripeSettings {
            default_ec,
            min_write_shards,
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
        r.register(
            "degraded_writes",
            "Stripes this coordinator wrote with fewer than k+m shards (the rest wait for repair)",
            metrics.degraded_writes.clone(),
        );
        r.register(
            "corrupt_shards_seen",
            "Corrupt shards this coordinator was answered with or found by checksum",
            metrics.corrupt_seen.clone(),
        );
        Stripes {
            book,
            started: tokio::time::Instant::now(),
            me,
            buffers: Arc::new(Semaphore::new(buffer_permits as usize)),
            buffer_permits,
            suspects: Marks::default(),
            full: Marks::default(),
            store,
            transport,
            gossip,
            namespace,
            default_ec,
            min_write_shards,
            corrupt: Arc::default(),
            disowning: Arc::default(),
            metrics,
        }
    }

    /// The placement view now (see `peers::peers`).
    pub(super) async fn peers(&self) -> Result<Peers, StripeError> {
        let members = self.gossip.members().await?;
        let committed = self.namespace.cluster_layout()?;
        peers::peers(
            committed.as_ref(),
            members,
            &self.suspects.recent(SUSPECT_FOR),
            self.full.recent(FULL_FOR),
        )
    }

    /// The layout as placement sees it now: only the nodes that take new shards
    /// (alive, with room, not suspect) eligible.
    pub async fn placement_layout(&self) -> Result<shoal_placement::Layout, StripeError> {
        Ok(self.peers().await?.layout)
    }

    pub(super) fn suspect(&self, node: NodeId) {
        if node != self.me {
            self.suspects.mark(node);
        }
    }

    pub(super) fn mark_full(&self, node: NodeId) {
        self.full.mark(node);
    }

    /// Deletes the shards of a stripe on every node that can be reached now. Ok when none
    /// of those holds one any more; an error names the shards they could not delete, so
    /// the caller tries again later. A holder that cannot be reached (down, cut off) keeps
    /// its shard: once the stripe is forgotten, that node's orphan sweep deletes it.
    pub async fn delete(self: &Arc<Self>, record: &StripeRecord) -> Result<(), StripeError> {
        let peers = self.peers().await?;
        let mut set = JoinSet::new();
        let reachable = |n: NodeId| n == self.me || peers.addrs.contains_key(&n);
        for shard in record.shards.iter().filter(|s| reachable(s.node)) {
            let this = self.clone();
            let addr = peers.addrs.get(&shard.node).copied();
            let (node, index) = (shard.node, shard.index);
            let req = ShardRequest::Delete {
                stripe: record.id.0,
                index,
            };
            set.spawn(async move { (node, index, this.call(node, addr, req, PUT_TIMEOUT).await) });
        }
        let mut faults = Vec::new();
        for (node, index, resp) in set.join_all().await {
            match resp {
                ShardResponse::Deleted(_)
                | ShardResponse::Failed {
                    kind: ShardFailure::NotFound,
                    ..
                } => {}
                ShardResponse::Failed { kind, message } => faults.push(ShardFault {
                    index,
                    node,
                    name: peers.name(node),
                    kind,
                    message,
                }),
                other => faults.push(ShardFault {
                    index,
                    node,
                    name: peers.name(node),
                    kind: ShardFailure::Other,
                    message: format!("unexpected answer {other:?}"),
                }),
            }
        }
        if faults.is_empty() {
            Ok(())
        } else {
            Err(StripeError::NotDeleted {
                stripe: record.id,
                faults: ShardFaults(faults),
            })
        }
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

    /// Every shard in this node's store, as (stripe, index), in key order.
    pub fn local_shards(&self) -> Vec<(StripeId, u8)> {
        self.store
            .list()
            .into_iter()
            .map(|(k, _)| (StripeId(k.stripe), k.index))
            .collect()
    }

    /// Deletes one shard from this node's store; says whether it was there.
    pub async fn delete_local_shard(
        &self,
        stripe: StripeId,
        index: u8,
    ) -> Result<bool, StripeError> {
        Ok(self
            .store
            .delete(ShardKey {
                stripe: stripe.0,
                index,
            })
            .await?)
    }

    /// Refuses puts of `shards` to this node until the guard drops: hold it from before
    /// this node proposes to disown them until it has deleted them (see
    /// `super::disowning`).
    pub fn refuse_puts(&self, shards: &[(StripeId, u8)]) -> super::DisowningGuard {
        self.disowning.hold(shards)
    }

    /// Deletes every shard of `stripe` in this node's store; returns how many there were.
    pub async fn delete_local(&self, stripe: StripeId) -> Result<usize, StripeError> {
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
        Ok(keys.len())
    }

    /// The shards of this node that reads found corrupt.
    pub fn corrupt_reports(&self) -> &Arc<super::CorruptReports> {
        &self.corrupt
    }

    /// This node's id.
    pub fn me(&self) -> NodeId {
        self.me
    }

    /// The erasure-coding profile of new stripes.
    pub fn default_ec(&self) -> EcProfile {
        self.default_ec
    }

    /// Serves the shard RPCs of `transport` from this node's store; shard payloads (puts
    /// and gets, never deletes) may come on the bulk lane too.
    pub fn serve_on(self: &Arc<Self>, transport: &Transport) {
        let handler = self.clone();
        transport.register(move |_from, req: ShardRequest| {
            let handler = handler.clone();
            async move { Ok(handler.serve_shard(req).await) }
        });
        transport.serve_on_bulk::<ShardRequest>(super::carries_payload);
    }

    /// Serves one shard request against this node's store (local or from a peer).
    async fn serve_shard(&self, req: ShardRequest) -> ShardResponse {
        match req {
            ShardRequest::Put { stripe, index, .. } if self.disowning.refuses(stripe, index) => {
                ShardResponse::Failed {
                    kind: ShardFailure::Other,
                    message: format!(
                        "shard {}.{index} is being deleted on this node (it disowned a copy); try again later",
                        StripeId(stripe)
                    ),
                }
            }
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
                    Ok(b) => ShardResponse::Data(b),
                    Err(e) => {
                        if is_damage(&e) {
                            warn!(stripe = %StripeId(stripe), shard = index, error = %e, "corrupt or unreadable shard on this node; scrub checks it and gives it up for repair");
                            self.corrupt.report(ShardKey { stripe, index });
                        }
                        failure(&e)
                    }
                }
            }
            ShardRequest::GetChecked {
                stripe,
                index,
                offset,
                len,
            } => {
                let key = ShardKey { stripe, index };
                match self.store.get_checked(key, offset, len).await {
                    Ok(r) => ShardResponse::Checked {
                        data_len: r.data_len,
                        shift: r.shift,
                        first: r.first,
                        blocks: r.blocks,
                        table: r.table,
                    },
                    Err(e) => {
                        if is_damage(&e) {
                            warn!(stripe = %StripeId(stripe), shard = index, error = %e, "corrupt or unreadable shard on this node; scrub checks it and gives it up for repair");
                            self.corrupt.report(key);
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

    /// Sends one shard request to `node` (served here when it is this node). Never fails:
    /// a transport failure is a `Failed { Other }` answer.
    pub(super) async fn call(
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
        // Shard payloads take the bulk lane when both ends run one (QUIC when it cannot
        // connect); deletes stay on QUIC.
        let res = match (addr.bulk, &req) {
            (
                Some(bulk),
                ShardRequest::Put { .. }
                | ShardRequest::Get { .. }
                | ShardRequest::GetChecked { .. },
            ) => {
                self.transport
                    .call_bulk(node, addr.rpc, bulk, &req, timeout)
                    .await
            }
            _ => self.transport.call_to(node, addr.rpc, &req, timeout).await,
        };
        match res {
            Ok(r) => r,
            // The holder could not decode the request: a release without it.
            Err(
                e @ MeshError::RpcRemote {
                    class: FailureClass::Invalid,
                    ..
                },
            ) => ShardResponse::Failed {
                kind: ShardFailure::Unsupported,
                message: e.to_string(),
            },
            Err(e) => ShardResponse::Failed {
                kind: ShardFailure::Other,
                message: e.to_string(),
            },
        }
    }

    /// Waits until `bytes` of buffer fit in the budget (back-pressure, never unbounded growth).
    pub(super) async fn reserve_buffers(
        &self,
        bytes: u64,
    ) -> Result<tokio::sync::OwnedSemaphorePermit, StripeError> {
        let permits = (bytes.div_ceil(1 << 20) as u32).clamp(1, self.buffer_permits);
        self.buffers
            .clone()
            .acquire_many_owned(permits)
            .await
            .map_err(|_| StripeError::Stopped)
    }
}
