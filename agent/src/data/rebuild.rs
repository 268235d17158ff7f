//! Rebuilding lost shards of a stripe: decode from any k of the others (checked against
//! the record), encode again, store each rebuilt shard on its target. What to rebuild and
//! where is the repair planner's (`redundancy`); committing the new locations
//! is the repair worker's, once this has returned them durable.

use std::sync::Arc;

use bytes::Bytes;
use shoal_agent_api::StripeRecord;
use shoal_namespace::ShardMove;
use shoal_placement::{DEFAULT_SHARD_SIZE, NodeId, StripeGeometry};
use tokio::task::JoinSet;

use super::erasure;
use super::error::{ShardFault, StripeError};
use super::read::WHOLE_TIMEOUT;
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
        // A rebuild is retried by the repair worker whatever the cause.
        let (data_shards, bad) = self.data_shards(record, &peers, unusable, true).await?;
        let len = record.len as usize;
        let all = crate::sim_thread::blocking(move || {
            let mut data = data_shards.concat();
            data.truncate(len);
            erasure::encode(&data.into(), ec, &geometry)
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

impl Stripes {
    /// Copies shards as they are from their node (one being drained) to their new node:
    /// each read whole from `from` (the holder checks every block) and checked against the
    /// record's crc32c, then stored on `to`. The moves it returns are durable on their
    /// targets, ready to commit; a copy whose read or store failed is left out (a corrupt
    /// source is reported by its holder, which gives the shard up, and repair rebuilds it).
    pub async fn copy(
        self: &Arc<Self>,
        record: &StripeRecord,
        copies: &[Rebuild],
    ) -> Result<Rebuilt, StripeError> {
        record.check()?;
        let _buffers = self
            .reserve_buffers(record.shard_len * copies.len() as u64)
            .await?;
        let peers = self.peers().await?;
        let mut set = JoinSet::new();
        for c in copies {
            let Some(known) = record.shards.get(usize::from(c.index)).cloned() else {
                continue;
            };
            let this = self.clone();
            let peers_from = peers.addrs.get(&c.from).copied();
            let peers_to = peers.addrs.get(&c.to).copied();
            let (stripe, c) = (record.id, *c);
            set.spawn(async move {
                let get = ShardRequest::Get {
                    stripe: stripe.0,
                    index: c.index,
                    offset: 0,
                    len: None,
                };
                let data = match this.call(c.from, peers_from, get, WHOLE_TIMEOUT).await {
                    ShardResponse::Data(d) if crc32c::crc32c(&d) == known.crc32c => d,
                    ShardResponse::Data(_) => {
                        return (
                            c,
                            None,
                            Err("the copy read does not match the record's crc32c".to_owned()),
                        );
                    }
                    other => {
                        return (
                            c,
                            None,
                            Err(format!("read from the draining node: {other:?}")),
                        );
                    }
                };
                let put = ShardRequest::Put {
                    stripe: stripe.0,
                    index: c.index,
                    data,
                };
                let stored = this.call(c.to, peers_to, put, PUT_TIMEOUT).await;
                (c, Some(stored), Ok(known.crc32c))
            });
        }
        let mut out = Rebuilt::default();
        for (c, stored, read) in set.join_all().await {
            let fault = |kind, message| ShardFault {
                index: c.index,
                node: c.to,
                name: peers.name(c.to),
                kind,
                message,
            };
            match (read, stored) {
                (Ok(crc), Some(ShardResponse::Stored)) => out.moves.push(ShardMove {
                    index: c.index,
                    from: c.from,
                    to: c.to,
                    crc32c: crc,
                }),
                (Err(message), _) => {
                    out.bad_sources.push(c.index);
                    out.failed.push(ShardFault {
                        node: c.from,
                        name: peers.name(c.from),
                        ..fault(ShardFailure::Other, message)
                    });
                }
                (Ok(_), Some(ShardResponse::Failed { kind, message })) => {
                    if kind == ShardFailure::Full {
                        self.mark_full(c.to);
                    }
                    out.failed.push(fault(kind, message));
                }
                (Ok(_), other) => out.failed.push(fault(
                    ShardFailure::Other,
                    format!("unexpected answer {other:?}"),
                )),
            }
        }
        out.moves.sort_by_key(|m| m.index);
        Ok(out)
    }
}
