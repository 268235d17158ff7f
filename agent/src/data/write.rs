//! Writing a stripe: encode once, place, send every shard at once, answer when all are
//! durable. What to do after a failed attempt is decided by [`after_failed_put`] (pure).

use std::sync::Arc;

use bytes::Bytes;
use shoal_agent_api::{ShardLocation, StripeRecord};
use shoal_placement::{EcProfile, NodeId, StripeGeometry, StripeId, place};
use tokio::task::JoinSet;

use super::erasure;
use super::error::{ShardFault, ShardFaults, StripeError};
use super::peers::Peers;
use super::shard_rpc::{ShardFailure, ShardRequest, ShardResponse};
use super::stripes::{PUT_TIMEOUT, Stripes};

/// Placement attempts of one stripe when nodes answer "full".
const PLACE_ATTEMPTS: usize = 4;

/// What a write does after an attempt where some shards were not stored (pure).
#[derive(Debug, PartialEq, Eq)]
pub(super) enum AfterFailure {
    /// Every failure was "full": place the stripe again without these nodes.
    PlaceAgainWithout(Vec<NodeId>),
    /// Anything else: give up with these failures (the caller may retry the write).
    GiveUp,
}

pub(super) fn after_failed_put(failed: &[ShardFault]) -> AfterFailure {
    if failed.iter().all(|f| f.kind == ShardFailure::Full) {
        AfterFailure::PlaceAgainWithout(failed.iter().map(|f| f.node).collect())
    } else {
        AfterFailure::GiveUp
    }
}

impl Stripes {
    /// Writes one stripe; returns its record once every shard is durable. A node that
    /// answers "full" is left out and the stripe placed again (on other nodes), so only a
    /// cluster without room for it fails with [`StripeError::NoSpace`].
    pub async fn write(
        self: &Arc<Self>,
        data: Vec<u8>,
        ec: Option<EcProfile>,
    ) -> Result<StripeRecord, StripeError> {
        let ec = ec.unwrap_or(self.default_ec);
        ec.validate().map_err(StripeError::Geometry)?;
        // The data, its k+m shards and their RPC copies.
        let in_flight = data.len() as u64 * (2 * ec.total() as u64 + ec.k as u64) / ec.k as u64;
        let _buffers = self.reserve_buffers(in_flight).await?;
        let geometry = StripeGeometry::with_default_shard_size(data.len() as u64, ec.k)
            .map_err(StripeError::Geometry)?;
        let shards =
            tokio::task::spawn_blocking(move || erasure::encode(&data, ec, &geometry)).await??;
        let shards: Vec<Bytes> = shards.into_iter().map(Bytes::from).collect();
        let crcs: Vec<u32> = shards.iter().map(|s| crc32c::crc32c(s)).collect();
        let mut full_seen: Vec<NodeId> = Vec::new();
        let mut last = None;
        for _ in 0..PLACE_ATTEMPTS {
            let peers = self.peers().await?;
            let id = StripeId(rand::random());
            let targets = match place(&peers.layout, id, ec) {
                Ok(t) => t,
                Err(reason) if !full_seen.is_empty() || !peers.full.is_empty() => {
                    let mut full = full_seen.clone();
                    full.extend(&peers.full);
                    return Err(StripeError::NoSpace {
                        ec,
                        full: peers.names_of(&full),
                        reason,
                    });
                }
                Err(e) => return Err(StripeError::Placement(e)),
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
            match after_failed_put(&failed) {
                AfterFailure::PlaceAgainWithout(nodes) => {
                    for n in nodes {
                        self.mark_full(n);
                        full_seen.push(n);
                    }
                    last = Some(failed);
                }
                AfterFailure::GiveUp => return Err(StripeError::NotStored(ShardFaults(failed))),
            }
        }
        Err(StripeError::NotStored(ShardFaults(
            last.unwrap_or_default(),
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
    ) -> Vec<ShardFault> {
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
            failed.push(ShardFault {
                index,
                node,
                name: peers.name(node),
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fault(node: u64, kind: ShardFailure) -> ShardFault {
        ShardFault {
            index: 0,
            node: NodeId(node),
            name: String::new(),
            kind,
            message: String::new(),
        }
    }

    #[test]
    fn only_full_nodes_make_a_write_place_again() {
        assert_eq!(
            after_failed_put(&[fault(1, ShardFailure::Full), fault(2, ShardFailure::Full)]),
            AfterFailure::PlaceAgainWithout(vec![NodeId(1), NodeId(2)])
        );
        assert_eq!(
            after_failed_put(&[fault(1, ShardFailure::Full), fault(2, ShardFailure::Other)]),
            AfterFailure::GiveUp,
            "an unreachable node is the caller's to retry (it is marked suspect)"
        );
        assert_eq!(
            after_failed_put(&[fault(3, ShardFailure::Corrupt)]),
            AfterFailure::GiveUp
        );
    }
}
