//! The fixed-layout header at the start of every shard file (little-endian):
//!
//! ```text
//!  0..4   magic "SHRD"          24     shard index
//!  4..6   version (1)           25..32 reserved (0)
//!  6..8   header length (48)    32..40 data length
//!  8..24  stripe id (u128)      40..44 crc32c of the data
//!                               44..48 crc32c of bytes 0..44
//! ```

use crate::ShardKey;

pub const MAGIC: [u8; 4] = *b"SHRD";
pub const VERSION: u16 = 1;
pub const HEADER_LEN: usize = 48;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardHeader {
    pub key: ShardKey,
    pub data_len: u64,
    pub data_crc: u32,
}

impl ShardHeader {
    pub fn for_data(key: ShardKey, data: &[u8]) -> Self {
        ShardHeader {
            key,
            data_len: data.len() as u64,
            data_crc: crc32c::crc32c(data),
        }
    }

    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC);
        b[4..6].copy_from_slice(&VERSION.to_le_bytes());
        b[6..8].copy_from_slice(&(HEADER_LEN as u16).to_le_bytes());
        b[8..24].copy_from_slice(&self.key.stripe.to_le_bytes());
        b[24] = self.key.index;
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
        let le32 = |r: std::ops::Range<usize>| {
            let mut a = [0u8; 4];
            a.copy_from_slice(&b[r]);
            u32::from_le_bytes(a)
        };
        if crc32c::crc32c(&b[0..44]) != le32(44..48) {
            return Err("header checksum mismatch".into());
        }
        let version = u16::from_le_bytes([b[4], b[5]]);
        if version != VERSION {
            return Err(format!("unknown header version {version}"));
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
            data_crc: le32(40..44),
        })
    }
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
        let h = ShardHeader::for_data(key, b"some shard bytes");
        assert_eq!(ShardHeader::decode(&h.encode()), Ok(h));
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
