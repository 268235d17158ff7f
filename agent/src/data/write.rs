//! Writing a stripe: encode once, place, send every shard at once, answer when all are
//! durable — or, while fewer than k+m nodes take shards, when at least
//! `min_write_shards` are (a degraded stripe: the missing slots name
//! [`NodeId::NONE`] and wait for repair). What to do after a failed attempt is
//! [`after_failed_put`] (pure).
//!
//! Degraded writes: with fewer than k+m nodes taking shards a stripe is placed on those
//! there are (`place_degraded`) as long as that is at least `[storage] min_write_shards`
//! (k+1 by default, held between k+1 and k+m). Below that the write fails at once and is
//! not retried ([`StripeError::TooFewNodes`]), unless nodes that may take shards in a
//! moment would make up the difference (suspects, stores still opening, layout nodes gossip
//! has not heard of since this agent started) or the agent started less than 15 s ago
//! (`VIEW_FORMING`): then the error is retryable. Full nodes are no reason to write
//! degraded: that is [`StripeError::NoSpace`] (ENOSPC).
//!
//! Once `min` shards are durable, a slow put is waited for while its node is alive for
//! gossip (looked at every 250 ms, `STRAGGLER_CHECK`), up to the put's own 10 s timeout; a
//! put whose node is no longer alive counts as failed and its node as suspect
//! ([`stop_waiting`]). When shards answer "full" (fill limit or `[storage] reserve`), the
//! stored ones are deleted and the stripe placed again without those nodes (4 placements
//! at most); any other failure deletes what was stored and names the node and reason.
//!
//! The buffer budget reserved per stripe write counts the data, its k+m shards and their
//! RPC copies: `len × (2(k+m) + k) / k`, in 1 MiB permits. Reads skip NONE slots like any
//! missing shard.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use bytes::Bytes;
use shoal_agent_api::{ShardLocation, StripeRecord};
use shoal_placement::{
    EcProfile, NodeId, PlacementError, StripeGeometry, StripeId, place_degraded,
};
use tokio::task::JoinSet;
use tracing::debug;

use super::erasure;
use super::error::{ShardFault, ShardFaults, StripeError};
use super::peers::Peers;
use super::shard_rpc::{ShardFailure, ShardRequest, ShardResponse};
use super::stripes::{PUT_TIMEOUT, Stripes};

/// Placement attempts of one stripe when nodes answer "full".
const PLACE_ATTEMPTS: usize = 4;
/// Once enough shards of a stripe are durable, how often a write looks whether the nodes
/// still writing the others are alive for gossip.
const STRAGGLER_CHECK: Duration = Duration::from_millis(250);
/// For this long after the agent starts, too few nodes is worth a retry, not an error:
/// gossip has not settled who is alive yet.
const VIEW_FORMING: Duration = Duration::from_secs(15);

/// What a write does after an attempt where some shards were not stored (pure).
#[derive(Debug, PartialEq, Eq)]
pub(super) enum AfterFailure {
    /// Enough shards are durable and the rest are unreachable: commit the stripe
    /// degraded, these slots missing.
    Degraded(Vec<u8>),
    /// Every failure was "full": place the stripe again without these nodes.
    PlaceAgainWithout(Vec<NodeId>),
    /// Anything else: give up with these failures (the caller may retry the write).
    GiveUp,
}

/// `stored` shards are durable, `failed` are not, `min` must be.
pub(super) fn after_failed_put(stored: usize, failed: &[ShardFault], min: usize) -> AfterFailure {
    if stored >= min && failed.iter().all(|f| f.kind == ShardFailure::Other) {
        AfterFailure::Degraded(failed.iter().map(|f| f.index).collect())
    } else if failed.iter().all(|f| f.kind == ShardFailure::Full) {
        AfterFailure::PlaceAgainWithout(failed.iter().map(|f| f.node).collect())
    } else {
        AfterFailure::GiveUp
    }
}

/// Whether a write with enough shards durable stops waiting for the others (pure): only
/// when no node still writing one is alive for gossip (suspect or down: a partition, a
/// crash). A node that answers gossip but writes slowly is waited for, up to the shard
/// write's own timeout: a stripe is committed with fewer than k+m shards only when a
/// holder is gone, never because one was slower than the others.
pub(super) fn stop_waiting(pending: &BTreeMap<u8, NodeId>, alive: impl Fn(NodeId) -> bool) -> bool {
    pending.values().all(|&n| !alive(n))
}

/// How one attempt's shards went.
struct Attempt {
    /// Slot → the node that holds it durably.
    stored: BTreeMap<u8, NodeId>,
    failed: Vec<ShardFault>,
}

impl Stripes {
    /// Writes one stripe; returns its record once at least `min_write_shards` shards are
    /// durable (all k+m while k+m nodes take shards). A node that answers "full" is left
    /// out and the stripe placed again (on other nodes), so only a cluster without room
    /// for it fails with [`StripeError::NoSpace`]; with fewer live nodes than
    /// `min_write_shards` it fails at once with [`StripeError::TooFewNodes`].
    pub async fn write(
        self: &Arc<Self>,
        data: Bytes,
        ec: Option<EcProfile>,
    ) -> Result<StripeRecord, StripeError> {
        let ec = ec.unwrap_or(self.default_ec);
        ec.validate().map_err(StripeError::Geometry)?;
        let min = ec.min_write_shards(self.min_write_shards);
        // The data, its k+m shards and their RPC copies.
        let in_flight = data.len() as u64 * (2 * ec.total() as u64 + ec.k as u64) / ec.k as u64;
        let _buffers = self.reserve_buffers(in_flight).await?;
        let geometry = StripeGeometry::with_default_shard_size(data.len() as u64, ec.k)
            .map_err(StripeError::Geometry)?;
        let shards =
            crate::sim_thread::blocking(move || erasure::encode(&data, ec, &geometry)).await??;
        let crcs: Vec<u32> = shards.iter().map(|s| crc32c::crc32c(s)).collect();
        let mut full_seen: Vec<NodeId> = Vec::new();
        let mut last = None;
        for _ in 0..PLACE_ATTEMPTS {
            let peers = self.peers().await?;
            let id = StripeId(crate::sim_thread::random_u128());
            let targets = self.targets(&peers, id, ec, min, &full_seen)?;
            let attempt = self.put_shards(id, &shards, &targets, &peers, min).await;
            let missing = if attempt.failed.is_empty() {
                Vec::new()
            } else {
                match after_failed_put(attempt.stored.len(), &attempt.failed, min) {
                    AfterFailure::Degraded(slots) => slots,
                    AfterFailure::PlaceAgainWithout(nodes) => {
                        self.delete_stored(id, &attempt.stored, &peers).await;
                        for n in nodes {
                            self.mark_full(n);
                            full_seen.push(n);
                        }
                        last = Some(attempt.failed);
                        continue;
                    }
                    AfterFailure::GiveUp => {
                        self.delete_stored(id, &attempt.stored, &peers).await;
                        return Err(StripeError::NotStored(ShardFaults(attempt.failed)));
                    }
                }
            };
            self.metrics.written.inc();
            if attempt.stored.len() < ec.total() {
                self.metrics.degraded_writes.inc();
                debug!(stripe = %id, shards = attempt.stored.len(), of = ec.total(), ?missing, "stripe written degraded");
            }
            return Ok(StripeRecord {
                id,
                len: geometry.len(),
                ec,
                shard_len: geometry.shard_len(),
                epoch: peers.layout.epoch(),
                shards: (0..ec.total())
                    .map(|i| {
                        let index = i as u8;
                        match attempt.stored.get(&index) {
                            Some(node) => ShardLocation {
                                index,
                                node: *node,
                                crc32c: crcs[i],
                            },
                            None => ShardLocation {
                                index,
                                node: NodeId::NONE,
                                crc32c: 0,
                            },
                        }
                    })
                    .collect(),
            });
        }
        Err(StripeError::NotStored(ShardFaults(
            last.unwrap_or_default(),
        )))
    }

    /// Where the shards of a new stripe go: every slot while k+m nodes take shards, else
    /// the first ones on the nodes there are (at least `min`).
    fn targets(
        &self,
        peers: &Peers,
        id: StripeId,
        ec: EcProfile,
        min: usize,
        full_seen: &[NodeId],
    ) -> Result<Vec<Option<NodeId>>, StripeError> {
        let mut full = full_seen.to_vec();
        full.extend(&peers.full);
        full.sort_unstable();
        full.dedup();
        let eligible = peers.layout.eligible_nodes().count();
        // Nodes without room are no reason to write with less redundancy: the cluster is
        // full for this stripe.
        if eligible < ec.total() && eligible + full.len() >= ec.total() {
            return Err(StripeError::NoSpace {
                ec,
                full: peers.names_of(&full),
                reason: PlacementError::NotEnoughNodes {
                    need: ec.total(),
                    have: eligible,
                },
            });
        }
        match place_degraded(&peers.layout, id, ec, min) {
            Ok(t) => Ok(t),
            // Suspects, stores still opening and nodes this agent has not heard of yet
            // (it just started) may take shards in a moment: worth a retry.
            // So may any node in the first seconds after this agent started, while its
            // view of the cluster is still forming.
            Err(PlacementError::NotEnoughNodes { need, have })
                if have + peers.suspects.len() + peers.opening.len() + peers.unknown.len()
                    < need
                    && self.started.elapsed() >= VIEW_FORMING =>
            {
                Err(StripeError::TooFewNodes {
                    ec,
                    need,
                    alive: have,
                })
            }
            Err(e) => Err(StripeError::Placement(e)),
        }
    }

    /// Sends shard `i` to `targets[i]`, all at once, and waits for every answer; once `min`
    /// are durable, for the others only while their nodes are alive for gossip (see
    /// [`stop_waiting`]).
    async fn put_shards(
        self: &Arc<Self>,
        id: StripeId,
        shards: &[Bytes],
        targets: &[Option<NodeId>],
        peers: &Peers,
        min: usize,
    ) -> Attempt {
        let started = Instant::now();
        let mut set = JoinSet::new();
        let mut pending: BTreeMap<u8, NodeId> = BTreeMap::new();
        for (i, (shard, node)) in shards.iter().zip(targets).enumerate() {
            let Some(node) = *node else { continue };
            let this = self.clone();
            let addr = peers.addrs.get(&node).copied();
            let req = ShardRequest::Put {
                stripe: id.0,
                index: i as u8,
                data: shard.clone(),
            };
            pending.insert(i as u8, node);
            set.spawn(
                async move { (i as u8, node, this.call(node, addr, req, PUT_TIMEOUT).await) },
            );
        }
        let mut attempt = Attempt {
            stored: BTreeMap::new(),
            failed: Vec::new(),
        };
        loop {
            let joined = if attempt.stored.len() >= min && !pending.is_empty() {
                match tokio::time::timeout(STRAGGLER_CHECK, set.join_next()).await {
                    Ok(j) => j,
                    Err(_) => {
                        let alive = self.alive_now().await;
                        let gone = |n| alive.as_ref().is_some_and(|a| !a.contains(&n));
                        if stop_waiting(&pending, |n| !gone(n)) {
                            break;
                        }
                        continue;
                    }
                }
            } else {
                set.join_next().await
            };
            let Some(joined) = joined else { break };
            let Ok((index, node, resp)) = joined else {
                continue;
            };
            pending.remove(&index);
            let (kind, message) = match resp {
                ShardResponse::Stored => {
                    attempt.stored.insert(index, node);
                    continue;
                }
                ShardResponse::Failed { kind, message } => (kind, message),
                other => (ShardFailure::Other, format!("unexpected answer {other:?}")),
            };
            if kind == ShardFailure::Other {
                self.suspect(node);
            }
            attempt.failed.push(ShardFault {
                index,
                node,
                name: peers.name(node),
                kind,
                message,
            });
        }
        set.abort_all();
        for (index, node) in pending {
            self.suspect(node);
            attempt.failed.push(ShardFault {
                index,
                node,
                name: peers.name(node),
                kind: ShardFailure::Other,
                message: format!(
                    "its node is no longer alive for gossip ({} ms after the write began)",
                    started.elapsed().as_millis()
                ),
            });
        }
        attempt
    }

    /// The nodes gossip counts alive now (this one always); None when gossip cannot say
    /// (then nobody is taken for gone).
    async fn alive_now(&self) -> Option<std::collections::BTreeSet<NodeId>> {
        let mut alive: std::collections::BTreeSet<NodeId> = self
            .gossip
            .members()
            .await
            .ok()?
            .into_iter()
            .filter(|m| m.state == shoal_mesh::MemberState::Alive)
            .map(|m| NodeId(m.id.node.0))
            .collect();
        alive.insert(self.me);
        Some(alive)
    }

    /// Deletes the shards of an attempt that will not be committed (nothing references
    /// them; what cannot be deleted now the orphan sweep finds later).
    async fn delete_stored(
        self: &Arc<Self>,
        id: StripeId,
        stored: &BTreeMap<u8, NodeId>,
        peers: &Peers,
    ) {
        for (&index, &node) in stored {
            let req = ShardRequest::Delete {
                stripe: id.0,
                index,
            };
            let _ = self
                .call(node, peers.addrs.get(&node).copied(), req, PUT_TIMEOUT)
                .await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fault(index: u8, node: u64, kind: ShardFailure) -> ShardFault {
        ShardFault {
            index,
            node: NodeId(node),
            name: String::new(),
            kind,
            message: String::new(),
        }
    }

    #[test]
    fn a_write_waits_for_slow_shards_while_their_nodes_are_alive() {
        let pending: BTreeMap<u8, NodeId> = [(4, NodeId(5)), (5, NodeId(6))].into();
        assert!(!stop_waiting(&pending, |_| true), "slow but alive: wait");
        assert!(
            !stop_waiting(&pending, |n| n == NodeId(6)),
            "one of them alive: wait for it"
        );
        assert!(
            stop_waiting(&pending, |_| false),
            "both gone: commit without"
        );
    }

    #[test]
    fn only_full_nodes_make_a_write_place_again() {
        assert_eq!(
            after_failed_put(
                4,
                &[
                    fault(0, 1, ShardFailure::Full),
                    fault(1, 2, ShardFailure::Full)
                ],
                5
            ),
            AfterFailure::PlaceAgainWithout(vec![NodeId(1), NodeId(2)])
        );
        assert_eq!(
            after_failed_put(
                4,
                &[
                    fault(0, 1, ShardFailure::Full),
                    fault(1, 2, ShardFailure::Other)
                ],
                5
            ),
            AfterFailure::GiveUp,
            "an unreachable node is the caller's to retry (it is marked suspect)"
        );
        assert_eq!(
            after_failed_put(5, &[fault(0, 3, ShardFailure::Corrupt)], 5),
            AfterFailure::GiveUp
        );
    }

    #[test]
    fn enough_durable_shards_and_unreachable_others_make_a_degraded_stripe() {
        assert_eq!(
            after_failed_put(5, &[fault(5, 6, ShardFailure::Other)], 5),
            AfterFailure::Degraded(vec![5])
        );
        assert_eq!(
            after_failed_put(
                4,
                &[
                    fault(4, 5, ShardFailure::Other),
                    fault(5, 6, ShardFailure::Other)
                ],
                5
            ),
            AfterFailure::GiveUp,
            "below min_write_shards"
        );
        assert_eq!(
            after_failed_put(5, &[fault(5, 6, ShardFailure::Full)], 5),
            AfterFailure::PlaceAgainWithout(vec![NodeId(6)]),
            "a full node is no reason for less redundancy"
        );
    }
}
