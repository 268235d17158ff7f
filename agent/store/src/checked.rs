//! A range of a shard as a holder sends it to a reader that checks it itself: the blocks
//! holding the range, and the shard's whole block table. The reader trusts only the shard's
//! checksum from the metadata (the stripe record): the table must combine to it, and each
//! block must match its entry, before any byte of the range is used.

use bytes::Bytes;

use crate::header::{BLOCK_SHIFT, block_count};

/// The blocks holding a range of a shard, and the shard's block table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckedRange {
    /// The shard's data length.
    pub data_len: u64,
    /// log2 of the block size.
    pub shift: u8,
    /// The index of the first block in `blocks`.
    pub first: u64,
    /// Whole blocks from `first` (the last block of the shard may be short).
    pub blocks: Bytes,
    /// The crc32c of every block of the shard, u32 little-endian each.
    pub table: Bytes,
}

impl CheckedRange {
    /// The blocks of `data` (a whole shard) that hold `[offset, end)`, with its table.
    pub fn of(data: &Bytes, offset: u64, end: u64) -> CheckedRange {
        let len = data.len() as u64;
        let block = 1u64 << BLOCK_SHIFT;
        let mut table = Vec::with_capacity(4 * block_count(len, BLOCK_SHIFT) as usize);
        for b in data.chunks(block as usize) {
            table.extend_from_slice(&crc32c::crc32c(b).to_le_bytes());
        }
        let from = (offset.min(len) >> BLOCK_SHIFT) << BLOCK_SHIFT;
        let to = end.max(from).next_multiple_of(block).min(len);
        CheckedRange {
            data_len: len,
            shift: BLOCK_SHIFT,
            first: from >> BLOCK_SHIFT,
            blocks: data.slice(from as usize..to as usize),
            table: Bytes::from(table),
        }
    }

    /// The table's entries combine to `whole_crc` (the shard's checksum from the metadata);
    /// each block matches its entry. Then the bytes `[offset, offset + len)` of the shard.
    pub fn verify(&self, whole_crc: u32, offset: u64, len: u64) -> Result<Bytes, String> {
        if !(9..=30).contains(&self.shift) {
            return Err(format!("block size 2^{} refused", self.shift));
        }
        let block = 1u64 << self.shift;
        let count = block_count(self.data_len, self.shift);
        if self.table.len() as u64 != 4 * count {
            return Err(format!(
                "block table of {} bytes for {count} blocks",
                self.table.len()
            ));
        }
        let entry = |i: u64| {
            let at = 4 * i as usize;
            u32::from_le_bytes([
                self.table[at],
                self.table[at + 1],
                self.table[at + 2],
                self.table[at + 3],
            ])
        };
        let whole = crate::combine::fold((0..count).map(entry), block, self.data_len);
        if whole != whole_crc {
            return Err("block table does not match the shard's checksum".into());
        }
        let start = self.first.saturating_mul(block);
        if start + self.blocks.len() as u64 > self.data_len {
            return Err("blocks beyond the end of the shard".into());
        }
        for (n, b) in self.blocks.chunks(block as usize).enumerate() {
            let i = self.first + n as u64;
            let full = block.min(self.data_len - i * block);
            if b.len() as u64 != full || crc32c::crc32c(b) != entry(i) {
                return Err(format!("block {i} does not match its checksum"));
            }
        }
        let end = offset.checked_add(len).ok_or("range overflows")?;
        if offset < start || end > start + self.blocks.len() as u64 {
            return Err(format!(
                "the blocks hold [{start}, {}), not [{offset}, {end})",
                start + self.blocks.len() as u64
            ));
        }
        Ok(self
            .blocks
            .slice((offset - start) as usize..(end - start) as usize))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(len: usize) -> Bytes {
        Bytes::from((0..len).map(|i| (i * 7 % 251) as u8).collect::<Vec<_>>())
    }

    #[test]
    fn a_range_checks_against_the_whole_checksum_and_comes_back() {
        let b = 1u64 << BLOCK_SHIFT;
        let data = shard(3 * b as usize + 100);
        let crc = crc32c::crc32c(&data);
        for (offset, len) in [
            (0, 10),
            (b + 7, 64),
            (b - 6, 20),
            (3 * b + 90, 8),
            (0, 3 * b + 100),
        ] {
            let r = CheckedRange::of(&data, offset, offset + len);
            let got = r.verify(crc, offset, len).expect("verify");
            assert_eq!(&got[..], &data[offset as usize..(offset + len) as usize]);
        }
    }

    #[test]
    fn anything_changed_on_the_way_is_refused() {
        let b = 1u64 << BLOCK_SHIFT;
        let data = shard(2 * b as usize + 3);
        let crc = crc32c::crc32c(&data);
        let (at, len) = (b + 10, 100);
        let good = CheckedRange::of(&data, at, at + len);
        // A flipped data bit, with or without its table entry changed to match.
        let mut blocks = good.blocks.to_vec();
        blocks[9] ^= 1;
        let mut bad = good.clone();
        bad.blocks = Bytes::from(blocks.clone());
        assert!(bad.verify(crc, at, len).is_err());
        let mut table = good.table.to_vec();
        table[4..8].copy_from_slice(&crc32c::crc32c(&blocks[..b as usize]).to_le_bytes());
        bad.table = Bytes::from(table);
        assert!(
            bad.verify(crc, at, len).is_err(),
            "table no longer combines"
        );
        // Another shard's checksum, a range outside the blocks, a short table.
        assert!(good.verify(crc ^ 1, at, len).is_err());
        assert!(good.verify(crc, 10, len).is_err());
        let mut short = good.clone();
        short.table = good.table.slice(..8);
        assert!(short.verify(crc, at, len).is_err());
        assert!(good.verify(crc, at, len).is_ok());
    }
}
