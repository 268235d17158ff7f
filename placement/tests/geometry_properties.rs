//! Property tests of `StripeGeometry`: shard sizes, the data ranges tiling the stripe,
//! and range reads reassembled from shard slices.

use proptest::prelude::*;
use shoal_placement::{SHARD_ALIGN, StripeGeometry};

/// A stripe length, `k`, and a maximum shard size (kept small so buffers stay small).
fn arb_stripe() -> impl Strategy<Value = (u64, u8, u64)> {
    (1u8..=16, 1u64..=64).prop_flat_map(|(k, units)| {
        let max_shard = units * SHARD_ALIGN;
        (0..=u64::from(k) * max_shard, Just(k), Just(max_shard))
    })
}

/// The stripe bytes cut into `k` zero-padded data shards, as a writer would.
fn cut(data: &[u8], g: &StripeGeometry) -> Result<Vec<Vec<u8>>, TestCaseError> {
    (0..g.k())
        .map(|i| {
            let (off, len) = g
                .data_range(i)
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            let mut shard = data[off as usize..(off + len) as usize].to_vec();
            shard.resize(g.shard_len() as usize, 0);
            Ok(shard)
        })
        .collect()
}

proptest! {
    #[test]
    fn shard_len_is_aligned_minimal_and_bounded((len, k, max_shard) in arb_stripe()) {
        let g = StripeGeometry::new(len, k, max_shard).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let s = g.shard_len();
        prop_assert_eq!(s % SHARD_ALIGN, 0);
        prop_assert!(s >= SHARD_ALIGN && s <= max_shard);
        prop_assert!(s * u64::from(k) >= len, "{k} shards of {s} cannot hold {len}");
        // One alignment unit less would not hold the stripe (unless already at the minimum).
        prop_assert!(s == SHARD_ALIGN || (s - SHARD_ALIGN) * u64::from(k) < len);
    }

    #[test]
    fn data_ranges_tile_the_stripe_in_order((len, k, max_shard) in arb_stripe()) {
        let g = StripeGeometry::new(len, k, max_shard).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let mut next = 0;
        for i in 0..k {
            let (off, n) = g.data_range(i).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(off, next);
            prop_assert!(n <= g.shard_len());
            next = off + n;
        }
        prop_assert_eq!(next, len);
        prop_assert!(g.data_range(k).is_err());
    }

    #[test]
    fn range_read_reassembled_from_shards_equals_the_original(
        (len, k, max_shard) in arb_stripe(),
        seed in any::<u8>(),
        a in any::<prop::sample::Index>(),
        b in any::<prop::sample::Index>(),
    ) {
        let g = StripeGeometry::new(len, k, max_shard).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let data: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect();
        let shards = cut(&data, &g)?;
        let (x, y) = (a.index(len as usize + 1) as u64, b.index(len as usize + 1) as u64);
        let (offset, end) = (x.min(y), x.max(y));
        let slices = g.shards_for_range(offset, end - offset).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let mut read = Vec::new();
        for s in &slices {
            prop_assert!(s.len > 0 && s.offset_in_shard + s.len <= g.shard_len());
            let shard = &shards[usize::from(s.shard_index)];
            read.extend_from_slice(&shard[s.offset_in_shard as usize..(s.offset_in_shard + s.len) as usize]);
        }
        prop_assert_eq!(&read[..], &data[offset as usize..end as usize]);
        prop_assert!(g.shards_for_range(offset, len - offset + 1).is_err());
    }

    #[test]
    fn stripe_beyond_k_shards_is_refused(k in 1u8..=32, units in 1u64..=1024, extra in 1u64..1000) {
        let max_shard = units * SHARD_ALIGN;
        prop_assert!(StripeGeometry::new(u64::from(k) * max_shard + extra, k, max_shard).is_err());
    }
}
