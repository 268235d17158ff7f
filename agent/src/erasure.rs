//! Reed-Solomon encode/decode of stripes on the blocking pool (never on async workers).

use reed_solomon_simd::{ReedSolomonDecoder, ReedSolomonEncoder};
use shoal_placement::{EcProfile, StripeGeometry};

/// Cuts `data` into k zero-padded data shards of the geometry's shard length and appends
/// m parity shards: k+m shards, data first.
pub fn encode(
    data: &[u8],
    ec: EcProfile,
    geometry: &StripeGeometry,
) -> Result<Vec<Vec<u8>>, String> {
    let k = ec.k as usize;
    let shard_len = geometry.shard_len() as usize;
    let mut shards: Vec<Vec<u8>> = (0..k)
        .map(|i| {
            let mut s = vec![0u8; shard_len];
            let start = (i * shard_len).min(data.len());
            let end = ((i + 1) * shard_len).min(data.len());
            s[..end - start].copy_from_slice(&data[start..end]);
            s
        })
        .collect();
    if ec.m > 0 {
        let mut enc =
            ReedSolomonEncoder::new(k, ec.m as usize, shard_len).map_err(|e| e.to_string())?;
        for s in &shards {
            enc.add_original_shard(s).map_err(|e| e.to_string())?;
        }
        let out = enc.encode().map_err(|e| e.to_string())?;
        shards.extend(out.recovery_iter().map(<[u8]>::to_vec));
    }
    Ok(shards)
}

/// Rebuilds the missing data shards from any k of the k+m (`have[i]` is shard i, or None).
/// Returns all k data shards.
pub fn decode(
    ec: EcProfile,
    shard_len: usize,
    have: &[Option<Vec<u8>>],
) -> Result<Vec<Vec<u8>>, String> {
    let k = ec.k as usize;
    let present = have.iter().filter(|s| s.is_some()).count();
    if present < k {
        return Err(format!(
            "only {present} of {} shards available, {k} needed",
            have.len()
        ));
    }
    if have[..k].iter().all(Option::is_some) {
        return Ok(have[..k].iter().flatten().cloned().collect());
    }
    let mut dec =
        ReedSolomonDecoder::new(k, ec.m as usize, shard_len).map_err(|e| e.to_string())?;
    for (i, s) in have.iter().enumerate() {
        if let Some(s) = s {
            if i < k {
                dec.add_original_shard(i, s).map_err(|e| e.to_string())?;
            } else {
                dec.add_recovery_shard(i - k, s)
                    .map_err(|e| e.to_string())?;
            }
        }
    }
    let restored = dec.decode().map_err(|e| e.to_string())?;
    let mut out = Vec::with_capacity(k);
    for (i, shard) in have[..k].iter().enumerate() {
        match shard {
            Some(s) => out.push(s.clone()),
            None => out.push(
                restored
                    .restored_original(i)
                    .ok_or_else(|| format!("shard {i} not restored"))?
                    .to_vec(),
            ),
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
        let data: Vec<u8> = (0..1_000_003u32).map(|i| (i * 7 % 256) as u8).collect();
        let g = StripeGeometry::new(data.len() as u64, 4, 1 << 20).expect("geometry");
        let shards = encode(&data, ec, &g).expect("encode");
        assert_eq!(shards.len(), 6);
        for lost in [[0usize, 1], [2, 3], [0, 5], [4, 5], [1, 4]] {
            let have: Vec<Option<Vec<u8>>> = shards
                .iter()
                .enumerate()
                .map(|(i, s)| (!lost.contains(&i)).then(|| s.clone()))
                .collect();
            let back = decode(ec, g.shard_len() as usize, &have).expect("decode");
            let joined: Vec<u8> = back.concat();
            assert_eq!(&joined[..data.len()], &data[..], "lost {lost:?}");
        }
        let too_few: Vec<Option<Vec<u8>>> = shards
            .iter()
            .enumerate()
            .map(|(i, s)| (i < 3).then(|| s.clone()))
            .collect();
        assert!(decode(ec, g.shard_len() as usize, &too_few).is_err());
    }
}
