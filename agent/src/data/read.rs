//! Reading a stripe: just the needed byte ranges of its data shards; on a missing, slow or
//! corrupt one, any k whole shards checked against the record and decoded. Which shards a
//! degraded read asks for is [`degraded_sources`] (pure).
//!
//! A record is checked (`StripeRecord::check`) before a read indexes into it. A shard whose
//! holder gossip does not count alive, or that a shard write just failed on, is read around
//! without being asked; when fewer than k holders are left that way, the degraded read asks
//! the others too, at their last gossiped addresses, or, for a node gossip has not heard of
//! yet (this agent just restarted), at its address in the metadata group (`last_known`):
//! gossip lags behind a healed partition by seconds, and a read that can succeed must not
//! fail on its word. A holder of a release without `GetChecked` is asked for the whole
//! shard, which is checked against the record and cut here. Corrupt shards are logged with
//! their stripe id and counted (`shoal_stripes_corrupt_shards_seen_total` here,
//! `shoal_store_corrupt_shards_total` on the holder), and so are degraded reads. A stripe
//! unreadable only because of corrupt or missing shards is not retried by the mount
//! (`StripeError::Unreadable` with `transient` false).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use shoal_agent_api::{ShardLocation, StripeRead, StripeRecord};
use shoal_placement::{DEFAULT_SHARD_SIZE, NodeId, ShardSlice, StripeGeometry, StripeId};
use shoal_store::CheckedRange;
use tokio::task::JoinSet;
use tracing::warn;

use super::erasure::{self, ErasureError};
use super::error::StripeError;
use super::peers::{Addrs, Peers};
use super::shard_rpc::{ShardFailure, ShardRequest, ShardResponse};
use super::stripes::Stripes;

/// A data shard slower than this is read around (degraded read).
const RANGE_TIMEOUT: Duration = Duration::from_secs(2);
pub(super) const WHOLE_TIMEOUT: Duration = Duration::from_secs(10);

/// The shards a degraded read fetches whole: every shard not already known bad or
/// missing (no node), data shards first (a read with all data shards needs no decoding).
/// An error when fewer than k are left: nothing to wait for.
pub(super) fn degraded_sources<'r>(
    record: &'r StripeRecord,
    bad: &[u8],
) -> Result<Vec<&'r ShardLocation>, ErasureError> {
    let mut left: Vec<&ShardLocation> = record
        .shards
        .iter()
        .filter(|l| !bad.contains(&l.index) && !l.node.is_none())
        .collect();
    left.sort_by_key(|l| (l.index >= record.ec.k, l.index));
    let need = usize::from(record.ec.k);
    if left.len() < need {
        return Err(ErasureError::TooFewShards {
            present: left.len(),
            total: record.shards.len(),
            need,
        });
    }
    Ok(left)
}

impl Stripes {
    /// Reads `[offset, offset+len)` of a stripe into one buffer.
    pub async fn read(
        self: &Arc<Self>,
        record: &StripeRecord,
        offset: u64,
        len: u64,
    ) -> Result<StripeRead, StripeError> {
        let read = self.read_parts(record, offset, len).await?;
        Ok(StripeRead {
            // One copy per part (a byte-wise `flatten` here took 70% of a reader's CPU).
            data: read.parts.concat(),
            decoded: read.decoded,
            bad_shards: read.bad_shards,
        })
    }

    /// Reads `[offset, offset+len)` of a stripe as the parts it arrived in (shard ranges,
    /// or decoded data shards), in order: a caller that gathers several stripes copies
    /// each byte once.
    pub async fn read_parts(
        self: &Arc<Self>,
        record: &StripeRecord,
        offset: u64,
        len: u64,
    ) -> Result<StripeParts, StripeError> {
        let ec = record.ec;
        record.check()?;
        let geometry = StripeGeometry::new(record.len, ec.k, DEFAULT_SHARD_SIZE)
            .map_err(StripeError::Geometry)?;
        let slices = geometry
            .shards_for_range(offset, len)
            .map_err(StripeError::Geometry)?;
        // Enough for a degraded read: every shard whole, plus the answer.
        let _buffers = self
            .reserve_buffers(record.shard_len * ec.total() as u64 * 2 + len)
            .await?;
        let peers = self.peers().await?;
        self.metrics.read.inc();
        let mut set = JoinSet::new();
        let mut bad = Vec::new();
        let mut unreached = false;
        for (n, s) in slices.iter().enumerate() {
            let loc = &record.shards[s.shard_index as usize];
            if loc.node.is_none() {
                // Written degraded or given up: repair has yet to fill it.
                bad.push(s.shard_index);
                continue;
            }
            let Some(addr) = peers.reach(loc.node) else {
                // Gossip does not count its holder alive: read around it (the degraded
                // read still asks it when nothing else will do).
                unreached = true;
                continue;
            };
            let this = self.clone();
            let (node, slice, crc) = (loc.node, *s, loc.crc32c);
            let (stripe, shard_len) = (record.id.0, record.shard_len);
            set.spawn(async move {
                let got = this
                    .fetch_checked(node, addr, stripe, slice, (crc, shard_len))
                    .await;
                (n, got)
            });
        }
        let mut parts: Vec<Option<Bytes>> = vec![None; slices.len()];
        let mut transient = unreached;
        for (n, resp) in set.join_all().await {
            match resp {
                ShardResponse::Data(d) if d.len() as u64 == slices[n].len => parts[n] = Some(d),
                other => {
                    transient |= may_pass(&other);
                    self.note_bad(record, slices[n].shard_index, &other);
                    bad.push(slices[n].shard_index);
                }
            }
        }
        if bad.is_empty() && !unreached {
            return Ok(StripeParts {
                parts: parts.into_iter().flatten().collect(),
                decoded: false,
                bad_shards: vec![],
            });
        }
        self.metrics.degraded_reads.inc();
        self.degraded(record, &peers, (bad, transient), offset, len)
            .await
    }

    /// One shard's part of a read, checked here against the shard's checksum from the
    /// record (not the holder's word), whichever lane it came by: a whole shard directly, a
    /// part through the holder's block table (which must combine to that checksum) and the
    /// blocks holding it. A holder that cannot answer `GetChecked` (an older release) is
    /// asked for the whole shard, checked, and the part cut from it. A mismatch comes back
    /// as `Data` of the wrong length (read around as corrupt, see `note_bad`).
    async fn fetch_checked(
        self: &Arc<Self>,
        node: NodeId,
        addr: Addrs,
        stripe: u128,
        s: ShardSlice,
        (crc, shard_len): (u32, u64),
    ) -> ShardResponse {
        let whole = s.offset_in_shard == 0 && s.len == shard_len;
        let addr = Some(addr);
        let get = ShardRequest::Get {
            stripe,
            index: s.shard_index,
            offset: s.offset_in_shard,
            len: Some(s.len),
        };
        if whole {
            return match self.call(node, addr, get, RANGE_TIMEOUT).await {
                ShardResponse::Data(d) if crc32c::crc32c(&d) != crc => {
                    ShardResponse::Data(Bytes::new())
                }
                other => other,
            };
        }
        let checked = ShardRequest::GetChecked {
            stripe,
            index: s.shard_index,
            offset: s.offset_in_shard,
            len: s.len,
        };
        match self.call(node, addr, checked, RANGE_TIMEOUT).await {
            ShardResponse::Checked {
                data_len,
                shift,
                first,
                blocks,
                table,
            } => {
                let range = CheckedRange {
                    data_len,
                    shift,
                    first,
                    blocks,
                    table,
                };
                match range.verify(crc, s.offset_in_shard, s.len) {
                    Ok(bytes) => ShardResponse::Data(bytes),
                    Err(why) => {
                        warn!(stripe = %StripeId(stripe), shard = s.shard_index, %node, %why, "a shard range did not match the record's checksum");
                        ShardResponse::Data(Bytes::new())
                    }
                }
            }
            ShardResponse::Failed {
                kind: ShardFailure::Unsupported,
                ..
            } => {
                // A holder of a release without `GetChecked`: the whole shard, so its bytes
                // are checked here against the record's checksum too.
                let whole = ShardRequest::Get {
                    stripe,
                    index: s.shard_index,
                    offset: 0,
                    len: Some(shard_len),
                };
                checked_slice(self.call(node, addr, whole, WHOLE_TIMEOUT).await, crc, s)
            }
            other => other,
        }
    }

    /// Where to ask `node` when gossip does not count it alive: its last address in
    /// gossip, else its address in the metadata group (gossip has not heard of it yet).
    fn last_known(&self, peers: &Peers, node: NodeId) -> Option<Addrs> {
        peers
            .last_known
            .get(&node)
            .copied()
            .or_else(|| (self.book)(node).map(|rpc| Addrs { rpc, bulk: None }))
    }

    fn note_bad(&self, record: &StripeRecord, index: u8, resp: &ShardResponse) {
        match resp {
            ShardResponse::Failed {
                kind: ShardFailure::Corrupt,
                message,
            } => {
                self.metrics.corrupt_seen.inc();
                warn!(stripe = %record.id, shard = index, %message, "corrupt shard; reading around it");
            }
            ShardResponse::Data(_) => {
                self.metrics.corrupt_seen.inc();
                warn!(stripe = %record.id, shard = index, answer = ?short(resp), "shard does not match its record; reading around it")
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
        bad: (Vec<u8>, bool),
        offset: u64,
        len: u64,
    ) -> Result<StripeParts, StripeError> {
        let (data_shards, bad) = self.data_shards(record, peers, bad.0, bad.1).await?;
        let parts = range_of(data_shards, offset, len).ok_or(StripeError::OutOfRange {
            stripe: record.id,
            offset,
            len,
            size: record.len,
        })?;
        Ok(StripeParts {
            parts,
            decoded: true,
            bad_shards: bad,
        })
    }

    /// The k data shards of a stripe from any k of its shards not in `bad`, fetched whole
    /// and checked against the record's checksums, decoded where needed; with every shard
    /// found unusable on the way (sorted). `transient`: some shard in `bad` is there for a
    /// reason that may pass (the error then says so).
    pub(super) async fn data_shards(
        self: &Arc<Self>,
        record: &StripeRecord,
        peers: &Peers,
        mut bad: Vec<u8>,
        mut transient: bool,
    ) -> Result<(Vec<Vec<u8>>, Vec<u8>), StripeError> {
        let unreadable = |source, transient| StripeError::Unreadable {
            stripe: record.id,
            source,
            transient,
        };
        let mut set = JoinSet::new();
        let sources = degraded_sources(record, &bad).map_err(|e| unreadable(e, transient))?;
        // Holders gossip does not count alive are asked too when the others are fewer than
        // k: gossip lags behind a healed partition, and has heard of nobody yet right after
        // this agent started; a read that can succeed must not fail on its word.
        let last_resort = sources
            .iter()
            .filter(|l| peers.reach(l.node).is_some())
            .count()
            < usize::from(record.ec.k);
        for loc in sources {
            let this = self.clone();
            let addr = match peers.reach(loc.node) {
                None if last_resort => self.last_known(peers, loc.node),
                reach => reach,
            };
            let req = ShardRequest::Get {
                stripe: record.id.0,
                index: loc.index,
                offset: 0,
                len: None,
            };
            let (node, index, crc) = (loc.node, loc.index, loc.crc32c);
            set.spawn(async move { (index, crc, this.call(node, addr, req, WHOLE_TIMEOUT).await) });
        }
        let mut have: Vec<Option<Bytes>> = vec![None; record.shards.len()];
        let mut got = 0;
        // Any k shards will do: stop waiting for slow or dead holders once k have answered.
        while let Some(joined) = set.join_next().await {
            let Ok((index, crc, resp)) = joined else {
                continue;
            };
            match resp {
                ShardResponse::Data(d) if crc32c::crc32c(&d) == crc => {
                    // `record.check()` made every index a slot of `have`.
                    if let Some(slot) = have.get_mut(usize::from(index)) {
                        *slot = Some(d);
                        got += 1;
                    }
                    if got == usize::from(record.ec.k) {
                        set.abort_all();
                        break;
                    }
                }
                other => {
                    transient |= may_pass(&other);
                    self.note_bad(record, index, &other);
                    bad.push(index);
                }
            }
        }
        let ec = record.ec;
        let shard_len = record.shard_len as usize;
        let data_shards =
            crate::sim_thread::blocking(move || erasure::decode(ec, shard_len, &have))
                .await?
                .map_err(|e| unreadable(e, transient))?;
        bad.sort_unstable();
        bad.dedup();
        Ok((data_shards, bad))
    }
}

/// Whether a shard answer that could not be used may be different a little later: its
/// holder did not answer (down, cut off, restarting, slow). Corrupt data, a checksum
/// mismatch and a shard the holder does not have are not.
fn may_pass(answer: &ShardResponse) -> bool {
    matches!(
        answer,
        ShardResponse::Failed {
            kind: ShardFailure::Other,
            ..
        }
    )
}

/// The part `s` of a whole shard answered by its holder, once the whole matched the
/// record's checksum `crc`; empty `Data` (read around as corrupt) when it did not, or
/// when it is too short for the part. Other answers pass through.
fn checked_slice(answer: ShardResponse, crc: u32, s: ShardSlice) -> ShardResponse {
    match answer {
        ShardResponse::Data(d) => {
            let (start, end) = (
                s.offset_in_shard as usize,
                (s.offset_in_shard + s.len) as usize,
            );
            if crc32c::crc32c(&d) != crc || end > d.len() {
                return ShardResponse::Data(Bytes::new());
            }
            ShardResponse::Data(d.slice(start..end))
        }
        other => other,
    }
}

/// A stripe range as read: its bytes in order, in the parts they came in.
pub struct StripeParts {
    pub parts: Vec<Bytes>,
    /// True when shards had to be decoded (a data shard was missing, slow or corrupt).
    pub decoded: bool,
    /// Shard indexes that could not be used.
    pub bad_shards: Vec<u8>,
}

/// `[offset, offset+len)` of the concatenation of `shards`, as slices of them (no copy);
/// `None` when the range goes past their end.
fn range_of(shards: Vec<Vec<u8>>, offset: u64, len: u64) -> Option<Vec<Bytes>> {
    let total: u64 = shards.iter().map(|s| s.len() as u64).sum();
    if offset.checked_add(len)? > total {
        return None;
    }
    let (mut at, end) = (offset, offset + len);
    let mut start = 0u64;
    let mut parts = Vec::new();
    for shard in shards {
        let shard_end = start + shard.len() as u64;
        if at < end && at < shard_end {
            let (from, to) = ((at - start) as usize, (end.min(shard_end) - start) as usize);
            parts.push(Bytes::from(shard).slice(from..to));
            at = end.min(shard_end);
        }
        start = shard_end;
    }
    Some(parts)
}

fn short(r: &ShardResponse) -> String {
    match r {
        ShardResponse::Failed { kind, message } => format!("{kind:?}: {message}"),
        ShardResponse::Data(d) => format!("{} bytes (wrong length or checksum)", d.len()),
        other => format!("{other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use shoal_placement::{EcProfile, NodeId, StripeId};

    use super::*;

    fn record(k: u8, m: u8) -> StripeRecord {
        StripeRecord {
            id: StripeId(9),
            len: 100,
            ec: EcProfile { k, m },
            shard_len: 50,
            epoch: 1,
            shards: (0..k + m)
                .map(|index| ShardLocation {
                    index,
                    node: NodeId(u64::from(index) + 10),
                    crc32c: 0,
                })
                .collect(),
        }
    }

    #[test]
    fn a_range_of_decoded_shards_is_sliced_from_them() {
        let shards = vec![vec![1, 2, 3], vec![4, 5, 6], vec![7, 8]];
        let cat = |p: Option<Vec<Bytes>>| p.map(|p| p.concat());
        assert_eq!(cat(range_of(shards.clone(), 0, 8)), Some((1..=8).collect()));
        assert_eq!(cat(range_of(shards.clone(), 2, 3)), Some(vec![3, 4, 5]));
        assert_eq!(cat(range_of(shards.clone(), 3, 3)), Some(vec![4, 5, 6]));
        assert_eq!(cat(range_of(shards.clone(), 7, 1)), Some(vec![8]));
        assert_eq!(cat(range_of(shards.clone(), 8, 0)), Some(vec![]));
        assert_eq!(range_of(shards.clone(), 4, 2).map(|p| p.len()), Some(1));
        assert_eq!(cat(range_of(shards.clone(), 7, 2)), None, "past the end");
        assert_eq!(cat(range_of(shards, u64::MAX, 2)), None);
    }

    #[test]
    fn a_degraded_read_asks_every_good_shard_data_first() {
        let r = record(4, 2);
        let asked: Vec<u8> = degraded_sources(&r, &[1])
            .expect("enough")
            .iter()
            .map(|l| l.index)
            .collect();
        assert_eq!(asked, [0, 2, 3, 4, 5]);
        let asked: Vec<u8> = degraded_sources(&r, &[5, 0])
            .expect("enough")
            .iter()
            .map(|l| l.index)
            .collect();
        assert_eq!(asked, [1, 2, 3, 4]);
    }

    #[test]
    fn a_degraded_read_never_asks_a_missing_shard() {
        let mut r = record(4, 2);
        r.shards[4].node = NodeId::NONE;
        let asked: Vec<u8> = degraded_sources(&r, &[1])
            .expect("enough")
            .iter()
            .map(|l| l.index)
            .collect();
        assert_eq!(asked, [0, 2, 3, 5]);
        assert!(degraded_sources(&r, &[1, 2]).is_err(), "3 left of 4+2");
    }

    #[test]
    fn a_degraded_read_with_fewer_than_k_good_shards_fails_at_once() {
        let r = record(4, 2);
        assert!(matches!(
            degraded_sources(&r, &[0, 1, 4]),
            Err(ErasureError::TooFewShards {
                present: 3,
                total: 6,
                need: 4
            })
        ));
    }

    #[test]
    fn a_range_from_a_holder_without_checked_reads_is_checked_against_the_record() {
        let whole = Bytes::from((0..200u8).collect::<Vec<u8>>());
        let crc = crc32c::crc32c(&whole);
        let part = ShardSlice {
            shard_index: 1,
            offset_in_shard: 50,
            len: 20,
        };
        match checked_slice(ShardResponse::Data(whole.clone()), crc, part) {
            ShardResponse::Data(d) => assert_eq!(&d[..], &whole[50..70]),
            other => panic!("{other:?}"),
        }
        // One flipped bit anywhere in the shard, even outside the part: refused.
        let mut bad = whole.to_vec();
        bad[150] ^= 1;
        match checked_slice(ShardResponse::Data(bad.into()), crc, part) {
            ShardResponse::Data(d) => assert!(d.is_empty(), "read around as corrupt"),
            other => panic!("{other:?}"),
        }
        let short = whole.slice(..60);
        let short_crc = crc32c::crc32c(&short);
        match checked_slice(ShardResponse::Data(short), short_crc, part) {
            ShardResponse::Data(d) => assert!(d.is_empty(), "too short for the part"),
            other => panic!("{other:?}"),
        }
    }
}
