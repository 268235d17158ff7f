//! The fixed-layout header at the start of every shard file (little-endian), then (from
//! version 2) a table with the crc32c of each block of data, then the data:
//!
//! ```text
//!  0..4   magic "SHRD"          24     shard index
//!  4..6   version (2)           25     log2 of the block size (12: 4 KiB; 16 before; 0 in v1)
//!  6..8   header length (48)    26..32 reserved (0)
//!  8..24  stripe id (u128)      32..40 data length
//!                               40..44 crc32c of the data
//!                               44..48 crc32c of bytes 0..44
//!  48..   version 2: crc32c of each block of data, u32 each; then the data
//! ```
//!
//! The block table lets a range read check only the blocks it returns. Version 1 files
//! (one checksum for the whole data, data right after the header) are still read.

use crate::ShardKey;

pub const MAGIC: [u8; 4] = *b"SHRD";
pub const VERSION: u16 = 2;
pub const HEADER_LEN: usize = 48;
/// Data is checksummed in blocks of `1 << BLOCK_SHIFT` bytes (4 KiB): a reader checks a
/// small range against the blocks holding it, so a 4 KiB read moves 4 KiB, not a block of
/// 64 KiB (the block size of files written before, which the header names and which are
/// still read).
pub const BLOCK_SHIFT: u8 = 12;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardHeader {
    pub key: ShardKey,
    pub data_len: u64,
    pub data_crc: u32,
    /// log2 of the checksummed block size; 0 for a version-1 file (no block table).
    pub block_shift: u8,
}

/// Blocks of `1 << shift` bytes that hold `data_len` bytes.
pub fn block_count(data_len: u64, shift: u8) -> u64 {
    data_len.div_ceil(1u64 << shift)
}

/// Where the data starts in a file written now: after the header and the block table.
pub fn data_offset(data_len: u64) -> u64 {
    HEADER_LEN as u64 + 4 * block_count(data_len, BLOCK_SHIFT)
}

impl ShardHeader {
    /// The header and block table of a new shard file holding `data`.
    pub fn for_data(key: ShardKey, data: &[u8]) -> (Self, Vec<u8>) {
        let mut table =
            Vec::with_capacity(4 * block_count(data.len() as u64, BLOCK_SHIFT) as usize);
        for block in data.chunks(1 << BLOCK_SHIFT) {
            table.extend_from_slice(&crc32c::crc32c(block).to_le_bytes());
        }
        let crcs = table.chunks_exact(4).map(le32);
        let whole = crate::combine::fold(crcs, 1 << BLOCK_SHIFT, data.len() as u64);
        let header = ShardHeader {
            key,
            data_len: data.len() as u64,
            data_crc: whole,
            block_shift: BLOCK_SHIFT,
        };
        (header, table)
    }

    /// Where the data starts in this file.
    pub fn data_offset(&self) -> u64 {
        if self.block_shift == 0 {
            HEADER_LEN as u64
        } else {
            HEADER_LEN as u64 + 4 * block_count(self.data_len, self.block_shift)
        }
    }

    /// Checks all of the data against the checksums: the whole-data one for a version-1
    /// file, every block's (which must combine to the whole-data one) for version 2.
    /// `table` is the bytes between the header and the data.
    pub fn verify_all(&self, table: &[u8], data: &[u8]) -> Result<(), String> {
        if self.block_shift == 0 {
            return match crc32c::crc32c(data) == self.data_crc {
                true => Ok(()),
                false => Err("data checksum mismatch".into()),
            };
        }
        self.verify_blocks(table, 0, data)?;
        let crcs = table.chunks_exact(4).map(le32);
        let whole = crate::combine::fold(crcs, 1 << self.block_shift, data.len() as u64);
        match whole == self.data_crc {
            true => Ok(()),
            false => Err("block table does not match the data checksum".into()),
        }
    }

    /// Checks `data`, the blocks from block `first` on (the last one may end the data),
    /// against the block table.
    pub fn verify_blocks(&self, table: &[u8], first: u64, data: &[u8]) -> Result<(), String> {
        if self.block_shift == 0 {
            return Err("version 1 shard has no block checksums".into());
        }
        let blocks = block_count(self.data_len, self.block_shift);
        if table.len() as u64 != 4 * blocks {
            return Err(format!(
                "block table of {} bytes for {blocks} blocks",
                table.len()
            ));
        }
        for (i, block) in data.chunks(1 << self.block_shift).enumerate() {
            let at = (first + i as u64) as usize * 4;
            let want = table.get(at..at + 4).map(le32);
            if want != Some(crc32c::crc32c(block)) {
                return Err(format!(
                    "data checksum mismatch in block {}",
                    first + i as u64
                ));
            }
        }
        Ok(())
    }

    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC);
        b[4..6].copy_from_slice(&VERSION.to_le_bytes());
        b[6..8].copy_from_slice(&(HEADER_LEN as u16).to_le_bytes());
        b[8..24].copy_from_slice(&self.key.stripe.to_le_bytes());
        b[24] = self.key.index;
        b[25] = self.block_shift;
        b[32..40].copy_from_slice(&self.data_len.to_le_bytes());
        b[40..44].copy_from_slice(&self.data_crc.to_le_bytes());
        let crc = crc32c::crc32c(&b[0..44]);
        b[44..48].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes and checks a header; the error says what is wrong.
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        let b: &[u8; HEADER_LEN] = bytes
            .get(..HEADER_LEN)
            .and_then(|s| s.try_into().ok())
            .ok_or_else(|| format!("{} bytes, shorter than a header", bytes.len()))?;
        if b[0..4] != MAGIC {
            return Err("bad magic".into());
        }
        if crc32c::crc32c(&b[0..44]) != le32(&b[44..48]) {
            return Err("header checksum mismatch".into());
        }
        let version = u16::from_le_bytes([b[4], b[5]]);
        let block_shift = b[25];
        match (version, block_shift) {
            (1, 0) => {}
            (2, 9..=30) => {}
            (1 | 2, _) => return Err(format!("block size 2^{block_shift} in version {version}")),
            _ => return Err(format!("unknown header version {version}")),
        }
        if u16::from_le_bytes([b[6], b[7]]) as usize != HEADER_LEN {
            return Err("unexpected header length".into());
        }
        let mut stripe = [0u8; 16];
        stripe.copy_from_slice(&b[8..24]);
        let mut len = [0u8; 8];
        len.copy_from_slice(&b[32..40]);
        Ok(ShardHeader {
            key: ShardKey {
                stripe: u128::from_le_bytes(stripe),
                index: b[24],
            },
            data_len: u64::from_le_bytes(len),
            data_crc: le32(&b[40..44]),
            block_shift,
        })
    }
}

fn le32(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[..4]);
    u32::from_le_bytes(a)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{RngExt, SeedableRng, rngs::StdRng};

    #[test]
    fn header_round_trips() {
        let key = ShardKey {
            stripe: u128::MAX - 7,
            index: 5,
        };
        let (h, table) = ShardHeader::for_data(key, b"some shard bytes");
        assert_eq!(ShardHeader::decode(&h.encode()), Ok(h));
        assert_eq!(table.len(), 4);
        assert_eq!(h.data_crc, crc32c::crc32c(b"some shard bytes"));
    }

    #[test]
    fn version_1_header_still_decodes() {
        let key = ShardKey {
            stripe: 9,
            index: 0,
        };
        let data = b"written by version 1";
        let mut b = ShardHeader::for_data(key, data).0.encode();
        b[4..6].copy_from_slice(&1u16.to_le_bytes());
        b[25] = 0;
        b[40..44].copy_from_slice(&crc32c::crc32c(data).to_le_bytes());
        let crc = crc32c::crc32c(&b[0..44]);
        b[44..48].copy_from_slice(&crc.to_le_bytes());
        let h = ShardHeader::decode(&b).expect("v1");
        assert_eq!((h.block_shift, h.data_offset()), (0, HEADER_LEN as u64));
        assert_eq!(h.verify_all(&[], data), Ok(()));
        assert!(h.verify_all(&[], b"written by version 2").is_err());
    }

    #[test]
    fn blocks_are_checked_one_by_one_and_together() {
        let key = ShardKey {
            stripe: 1,
            index: 2,
        };
        let block = 1usize << BLOCK_SHIFT;
        let data: Vec<u8> = (0..3 * block + 100).map(|i| (i % 251) as u8).collect();
        let (h, table) = ShardHeader::for_data(key, &data);
        assert_eq!(h.data_crc, crc32c::crc32c(&data), "combined = whole");
        assert_eq!(table.len(), 16, "four blocks, the last one short");
        assert_eq!(h.data_offset(), data_offset(data.len() as u64));
        assert_eq!(h.verify_all(&table, &data), Ok(()));
        assert_eq!(h.verify_blocks(&table, 3, &data[3 * block..]), Ok(()));
        let mut bad = data.clone();
        bad[2 * block + 5] ^= 1;
        assert_eq!(h.verify_blocks(&table, 0, &bad[..2 * block]), Ok(()));
        assert_eq!(h.verify_blocks(&table, 3, &bad[3 * block..]), Ok(()));
        let err = h.verify_blocks(&table, 2, &bad[2 * block..3 * block]);
        assert!(err.is_err_and(|e| e.contains("block 2")));
        assert!(h.verify_all(&table, &bad).is_err());
        // A damaged table entry is caught against its block, and by the whole checksum.
        let mut bad_table = table.clone();
        bad_table[5] ^= 1;
        assert!(h.verify_all(&bad_table, &data).is_err());
    }

    #[test]
    fn every_flipped_header_bit_is_detected() {
        let h = ShardHeader::for_data(
            ShardKey {
                stripe: 42,
                index: 1,
            },
            b"x",
        )
        .0
        .encode();
        for i in 0..HEADER_LEN {
            for bit in 0..8 {
                let mut bad = h;
                bad[i] ^= 1 << bit;
                assert!(
                    ShardHeader::decode(&bad).is_err(),
                    "flip at {i}.{bit} accepted"
                );
            }
        }
    }

    #[test]
    fn random_bytes_never_panic() {
        let seed = 0x5ba5e_u64;
        let mut rng = StdRng::seed_from_u64(seed);
        for _ in 0..50_000 {
            let len = rng.random_range(0..100usize);
            let mut bytes = vec![0u8; len];
            rng.fill(&mut bytes[..]);
            if len >= 4 && rng.random_bool(0.5) {
                bytes[..4].copy_from_slice(&MAGIC);
            }
            assert!(
                ShardHeader::decode(&bytes).is_err(),
                "seed {seed}: random header accepted"
            );
        }
    }
}
