use crate::error::PlacementError;

/// Default largest shard: 1 MiB, so a stripe holds at most `k` MiB.
pub const DEFAULT_SHARD_SIZE: u64 = 1 << 20;

/// Every shard length is a multiple of this. The erasure coder (reed-solomon-simd)
/// needs even lengths; 64 keeps shards aligned for its SIMD paths.
pub const SHARD_ALIGN: u64 = 64;

/// How one stripe's bytes are cut into `k` equal data shards.
///
/// The shard length is `ceil(len / k)` rounded up to a multiple of [`SHARD_ALIGN`], at
/// least one alignment unit, never above the maximum shard size. Data shard `i` holds
/// stripe bytes `[i * shard_len, (i + 1) * shard_len)` clipped to the stripe; the rest of
/// the shard is zero padding (the last data shards may be partly or wholly padding).
///
/// Not serialized: it follows from the stripe record's length and EC profile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StripeGeometry {
    len: u64,
    k: u8,
    shard_len: u64,
}

/// The part of one data shard that a read needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardSlice {
    /// Which data shard (0..k).
    pub shard_index: u8,
    /// Where the needed bytes start inside that shard.
    pub offset_in_shard: u64,
    /// How many bytes.
    pub len: u64,
}

impl StripeGeometry {
    /// The geometry of a stripe of `len` bytes cut into `k` data shards of at most
    /// `max_shard_size` bytes (a non-zero multiple of [`SHARD_ALIGN`]).
    pub fn new(len: u64, k: u8, max_shard_size: u64) -> Result<Self, PlacementError> {
        if k == 0 {
            return Err(PlacementError::InvalidProfile {
                input: format!("k={k}"),
                problem: "k (data shards) must be at least 1".into(),
            });
        }
        if max_shard_size == 0 || !max_shard_size.is_multiple_of(SHARD_ALIGN) {
            return Err(PlacementError::InvalidShardSize {
                shard_size: max_shard_size,
                align: SHARD_ALIGN,
            });
        }
        let max = max_shard_size.saturating_mul(u64::from(k));
        if len > max {
            return Err(PlacementError::StripeTooLong { len, max });
        }
        // len <= k * max_shard_size and max_shard_size is aligned, so rounding up
        // never passes max_shard_size.
        let shard_len = len
            .div_ceil(u64::from(k))
            .next_multiple_of(SHARD_ALIGN)
            .max(SHARD_ALIGN);
        Ok(StripeGeometry { len, k, shard_len })
    }

    /// [`StripeGeometry::new`] with [`DEFAULT_SHARD_SIZE`].
    pub fn with_default_shard_size(len: u64, k: u8) -> Result<Self, PlacementError> {
        Self::new(len, k, DEFAULT_SHARD_SIZE)
    }

    /// The stripe's data length in bytes (without padding).
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True for a stripe of no bytes (all shards are padding).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Data shards.
    pub fn k(&self) -> u8 {
        self.k
    }

    /// Length of every shard, data and parity.
    pub fn shard_len(&self) -> u64 {
        self.shard_len
    }

    /// The stripe byte range `(offset, len)` that data shard `shard_index` holds; `len`
    /// is below [`StripeGeometry::shard_len`] (possibly 0) for shards that end in padding.
    pub fn data_range(&self, shard_index: u8) -> Result<(u64, u64), PlacementError> {
        if shard_index >= self.k {
            return Err(PlacementError::NotADataShard {
                index: shard_index,
                k: self.k,
            });
        }
        let start = (u64::from(shard_index) * self.shard_len).min(self.len);
        let end = (start + self.shard_len).min(self.len);
        Ok((start, end - start))
    }

    /// The data shard slices, in stripe order, that a read of stripe bytes
    /// `[offset, offset + len)` needs. An empty read needs none.
    pub fn shards_for_range(
        &self,
        offset: u64,
        len: u64,
    ) -> Result<Vec<ShardSlice>, PlacementError> {
        let out_of_bounds = PlacementError::RangeOutOfBounds {
            offset,
            len,
            stripe_len: self.len,
        };
        let end = offset
            .checked_add(len)
            .ok_or_else(|| out_of_bounds.clone())?;
        if end > self.len {
            return Err(out_of_bounds);
        }
        let mut slices = Vec::new();
        let mut pos = offset;
        while pos < end {
            let offset_in_shard = pos % self.shard_len;
            let take = (self.shard_len - offset_in_shard).min(end - pos);
            // pos < len <= k * shard_len, so the index is below k.
            let shard_index = u8::try_from(pos / self.shard_len).unwrap_or(u8::MAX);
            slices.push(ShardSlice {
                shard_index,
                offset_in_shard,
                len: take,
            });
            pos += take;
        }
        Ok(slices)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_len_is_rounded_up_to_sixty_four_bytes() -> Result<(), PlacementError> {
        assert_eq!(
            StripeGeometry::with_default_shard_size(1000, 4)?.shard_len(),
            256
        );
        assert_eq!(
            StripeGeometry::with_default_shard_size(1025, 4)?.shard_len(),
            320
        );
        assert_eq!(
            StripeGeometry::with_default_shard_size(1, 4)?.shard_len(),
            64
        );
        assert_eq!(
            StripeGeometry::with_default_shard_size(0, 4)?.shard_len(),
            64
        );
        Ok(())
    }

    #[test]
    fn full_stripe_uses_the_maximum_shard_size() -> Result<(), PlacementError> {
        let g = StripeGeometry::with_default_shard_size(4 * DEFAULT_SHARD_SIZE, 4)?;
        assert_eq!(g.shard_len(), DEFAULT_SHARD_SIZE);
        assert_eq!(
            g.data_range(3)?,
            (3 * DEFAULT_SHARD_SIZE, DEFAULT_SHARD_SIZE)
        );
        Ok(())
    }

    #[test]
    fn stripe_longer_than_k_shards_is_refused() {
        let err = StripeGeometry::with_default_shard_size(4 * DEFAULT_SHARD_SIZE + 1, 4);
        assert_eq!(
            err,
            Err(PlacementError::StripeTooLong {
                len: 4 * DEFAULT_SHARD_SIZE + 1,
                max: 4 * DEFAULT_SHARD_SIZE
            })
        );
    }

    #[test]
    fn unaligned_or_zero_shard_size_is_refused() {
        assert!(matches!(
            StripeGeometry::new(10, 2, 100),
            Err(PlacementError::InvalidShardSize { .. })
        ));
        assert!(matches!(
            StripeGeometry::new(10, 2, 0),
            Err(PlacementError::InvalidShardSize { .. })
        ));
        assert!(matches!(
            StripeGeometry::new(10, 0, 64),
            Err(PlacementError::InvalidProfile { .. })
        ));
    }

    #[test]
    fn last_data_shards_may_be_all_padding() -> Result<(), PlacementError> {
        // 100 bytes over 4 shards of 64: shard 0 full, shard 1 holds 36, shards 2-3 padding.
        let g = StripeGeometry::with_default_shard_size(100, 4)?;
        assert_eq!(g.data_range(0)?, (0, 64));
        assert_eq!(g.data_range(1)?, (64, 36));
        assert_eq!(g.data_range(2)?, (100, 0));
        assert_eq!(g.data_range(3)?, (100, 0));
        assert_eq!(
            g.data_range(4),
            Err(PlacementError::NotADataShard { index: 4, k: 4 })
        );
        Ok(())
    }

    #[test]
    fn read_across_a_shard_boundary_needs_two_slices() -> Result<(), PlacementError> {
        let g = StripeGeometry::with_default_shard_size(1000, 4)?; // shard_len 256
        let slices = g.shards_for_range(200, 100)?;
        assert_eq!(
            slices,
            vec![
                ShardSlice {
                    shard_index: 0,
                    offset_in_shard: 200,
                    len: 56
                },
                ShardSlice {
                    shard_index: 1,
                    offset_in_shard: 0,
                    len: 44
                },
            ]
        );
        assert_eq!(g.shards_for_range(1000, 0)?, vec![]);
        Ok(())
    }

    #[test]
    fn read_outside_the_stripe_is_refused() -> Result<(), PlacementError> {
        let g = StripeGeometry::with_default_shard_size(1000, 4)?;
        assert!(matches!(
            g.shards_for_range(990, 11),
            Err(PlacementError::RangeOutOfBounds { .. })
        ));
        assert!(matches!(
            g.shards_for_range(u64::MAX, 2),
            Err(PlacementError::RangeOutOfBounds { .. })
        ));
        Ok(())
    }
}
