//! Rebuilding lost shards of a stripe: decode from any k of the others (checked against
//! the record), encode again, store each rebuilt shard on its target. What to rebuild and
//! where is the repair planner's (`workers::repair::plan`); committing the new locations
//! is the repair worker's, once this has returned them durable.

use std::sync::Arc;

use bytes::Bytes;
use shoal_agent_api::StripeRecord;
use shoal_namespace::ShardMove;
use shoal_placement::{DEFAULT_SHARD_SIZE, NodeId, StripeGeometry};
use tokio::task::JoinSet;

use super::erasure;
use super::error::{ShardFault, StripeError};
use super::shard_rpc::{ShardFailure, ShardRequest, ShardResponse};
use super::stripes::{PUT_TIMEOUT, Stripes};

/// One shard to rebuild: its slot, the node the slot names now ([`NodeId::NONE`] or one
/// that is gone) and where the rebuilt shard goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rebuild {
    pub index: u8,
    pub from: NodeId,
    pub to: NodeId,
}

/// What a rebuild stored: the moves to commit, and the targets that failed.
#[derive(Debug, Default)]
pub struct Rebuilt {
    pub moves: Vec<ShardMove>,
    pub failed: Vec<ShardFault>,
    /// Slots found unusable while reading (corrupt or unreachable), besides `skip`.
    pub bad_sources: Vec<u8>,
}

impl Stripes {
    /// Rebuilds the shards in `rebuilds` from any k of the stripe's other shards (never
    /// reading the slots in `skip`: lost, or on nodes that are down) and stores each on
    /// its target. The moves it returns are durable on their targets, ready to commit.
    pub async fn rebuild(
        self: &Arc<Self>,
        record: &StripeRecord,
        rebuilds: &[Rebuild],
        skip: &[u8],
    ) -> Result<Rebuilt, StripeError> {
        record.check()?;
        let ec = record.ec;
        let geometry = StripeGeometry::new(record.len, ec.k, DEFAULT_SHARD_SIZE)
            .map_err(StripeError::Geometry)?;
        let _buffers = self
            .reserve_buffers(record.shard_len * (ec.total() as u64 * 2 + ec.k as u64))
            .await?;
        let peers = self.peers().await?;
        let mut unusable: Vec<u8> = skip.to_vec();
        unusable.extend(rebuilds.iter().map(|r| r.index));
        let (data_shards, bad) = self.data_shards(record, &peers, unusable).await?;
        let len = record.len as usize;
        let all = tokio::task::spawn_blocking(move || {
            let mut data = data_shards.concat();
            data.truncate(len);
            erasure::encode(&data, ec, &geometry)
        })
        .await??;
        let mut set = JoinSet::new();
        for r in rebuilds {
            let Some(shard) = all.get(usize::from(r.index)) else {
                continue;
            };
            let crc = crc32c::crc32c(shard);
            let known = &record.shards[usize::from(r.index)];
            if !known.node.is_none() && known.crc32c != crc {
                return Err(StripeError::RebuildMismatch {
                    stripe: record.id,
                    index: r.index,
                });
            }
            let this = self.clone();
            let addr = peers.addrs.get(&r.to).copied();
            let req = ShardRequest::Put {
                stripe: record.id.0,
                index: r.index,
                data: Bytes::copy_from_slice(shard),
            };
            let r = *r;
            set.spawn(async move { (r, crc, this.call(r.to, addr, req, PUT_TIMEOUT).await) });
        }
        let mut out = Rebuilt {
            bad_sources: bad.into_iter().filter(|i| !skip.contains(i)).collect(),
            ..Rebuilt::default()
        };
        out.bad_sources
            .retain(|i| rebuilds.iter().all(|r| r.index != *i));
        for (r, crc, resp) in set.join_all().await {
            match resp {
                ShardResponse::Stored => out.moves.push(ShardMove {
                    index: r.index,
                    from: r.from,
                    to: r.to,
                    crc32c: crc,
                }),
                ShardResponse::Failed { kind, message } => {
                    if kind == ShardFailure::Full {
                        self.mark_full(r.to);
                    }
                    out.failed.push(ShardFault {
                        index: r.index,
                        node: r.to,
                        name: peers.name(r.to),
                        kind,
                        message,
                    });
                }
                other => out.failed.push(ShardFault {
                    index: r.index,
                    node: r.to,
                    name: peers.name(r.to),
                    kind: ShardFailure::Other,
                    message: format!("unexpected answer {other:?}"),
                }),
            }
        }
        out.moves.sort_by_key(|m| m.index);
        Ok(out)
    }
}
