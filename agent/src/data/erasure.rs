//! Reed-Solomon encode/decode of stripes on the blocking pool (never on async workers).

use std::cell::RefCell;

use bytes::Bytes;

use reed_solomon_simd::{ReedSolomonDecoder, ReedSolomonEncoder};
use shoal_placement::{EcProfile, StripeGeometry};

thread_local! {
    // One encoder and one decoder per blocking-pool thread, reset for each stripe: their
    // work buffers are allocated once, not per stripe.
    static ENCODER: RefCell<Option<ReedSolomonEncoder>> = const { RefCell::new(None) };
    static DECODER: RefCell<Option<ReedSolomonDecoder>> = const { RefCell::new(None) };
}

/// Why a stripe could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
pub enum ErasureError {
    /// reed-solomon-simd refused the shards (sizes, counts).
    #[error("reed-solomon: {0}")]
    Codec(#[from] reed_solomon_simd::Error),
    /// Fewer than k shards are at hand.
    #[error("only {present} of {total} shards available, {need} needed")]
    TooFewShards {
        present: usize,
        total: usize,
        need: usize,
    },
    /// The decoder did not give back a shard it should have restored.
    #[error("shard {0} not restored")]
    NotRestored(usize),
}

/// Cuts `data` into k data shards of the geometry's shard length (slices of `data`; the
/// last one zero-padded, a copy, when `data` falls short) and appends m parity shards:
/// k+m shards, data first.
pub fn encode(
    data: &Bytes,
    ec: EcProfile,
    geometry: &StripeGeometry,
) -> Result<Vec<Bytes>, ErasureError> {
    let (k, m) = (ec.k as usize, ec.m as usize);
    let shard_len = geometry.shard_len() as usize;
    let mut shards: Vec<Bytes> = (0..k)
        .map(|i| {
            let start = (i * shard_len).min(data.len());
            let end = ((i + 1) * shard_len).min(data.len());
            if end - start == shard_len {
                return data.slice(start..end);
            }
            let mut s = Vec::with_capacity(shard_len);
            s.extend_from_slice(&data[start..end]);
            s.resize(shard_len, 0);
            Bytes::from(s)
        })
        .collect();
    if m == 0 {
        return Ok(shards);
    }
    let parity = ENCODER.with_borrow_mut(|slot| -> Result<Vec<Bytes>, ErasureError> {
        let enc = match slot {
            Some(enc) => {
                enc.reset(k, m, shard_len)?;
                enc
            }
            None => slot.insert(ReedSolomonEncoder::new(k, m, shard_len)?),
        };
        for s in &shards {
            enc.add_original_shard(s)?;
        }
        let out = enc.encode()?;
        Ok(out.recovery_iter().map(Bytes::copy_from_slice).collect())
    })?;
    shards.extend(parity);
    Ok(shards)
}

/// Rebuilds the missing data shards from any k of the k+m (`have[i]` is shard i, or None).
/// Returns all k data shards.
pub fn decode<B: AsRef<[u8]>>(
    ec: EcProfile,
    shard_len: usize,
    have: &[Option<B>],
) -> Result<Vec<Vec<u8>>, ErasureError> {
    let (k, m) = (ec.k as usize, ec.m as usize);
    let present = have.iter().filter(|s| s.is_some()).count();
    if present < k {
        return Err(ErasureError::TooFewShards {
            present,
            total: have.len(),
            need: k,
        });
    }
    if have[..k].iter().all(Option::is_some) {
        return Ok(have[..k]
            .iter()
            .flatten()
            .map(|s| s.as_ref().to_vec())
            .collect());
    }
    let mut restored =
        DECODER.with_borrow_mut(|slot| -> Result<Vec<(usize, Vec<u8>)>, ErasureError> {
            let dec = match slot {
                Some(dec) => {
                    dec.reset(k, m, shard_len)?;
                    dec
                }
                None => slot.insert(ReedSolomonDecoder::new(k, m, shard_len)?),
            };
            for (i, s) in have.iter().enumerate() {
                match s {
                    Some(s) if i < k => dec.add_original_shard(i, s.as_ref())?,
                    Some(s) => dec.add_recovery_shard(i - k, s.as_ref())?,
                    None => {}
                }
            }
            let out = dec.decode()?;
            Ok(out
                .restored_original_iter()
                .map(|(i, s)| (i, s.to_vec()))
                .collect())
        })?;
    let mut out = Vec::with_capacity(k);
    for (i, shard) in have[..k].iter().enumerate() {
        match shard {
            Some(s) => out.push(s.as_ref().to_vec()),
            None => {
                let at = restored
                    .iter()
                    .position(|(r, _)| *r == i)
                    .ok_or(ErasureError::NotRestored(i))?;
                out.push(restored.swap_remove(at).1);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_k_of_k_plus_m_shards_rebuild_the_data() {
        let ec = EcProfile { k: 4, m: 2 };
        let data: Bytes = (0..1_000_003u32).map(|i| (i * 7 % 256) as u8).collect();
        let g = StripeGeometry::new(data.len() as u64, 4, 1 << 20).expect("geometry");
        let shards = encode(&data, ec, &g).expect("encode");
        assert_eq!(shards.len(), 6);
        for lost in [[0usize, 1], [2, 3], [0, 5], [4, 5], [1, 4]] {
            let have: Vec<Option<Vec<u8>>> = shards
                .iter()
                .enumerate()
                .map(|(i, s)| (!lost.contains(&i)).then(|| s.to_vec()))
                .collect();
            let back = decode(ec, g.shard_len() as usize, &have).expect("decode");
            let joined: Vec<u8> = back.concat();
            assert_eq!(&joined[..data.len()], &data[..], "lost {lost:?}");
        }
        let too_few: Vec<Option<Vec<u8>>> = shards
            .iter()
            .enumerate()
            .map(|(i, s)| (i < 3).then(|| s.to_vec()))
            .collect();
        assert!(decode(ec, g.shard_len() as usize, &too_few).is_err());
    }
}
