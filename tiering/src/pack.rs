//! The layout of one object in the bucket: several stripes' bytes back to back, then an
//! index of what is where, then a fixed trailer. Reads never need the index (the metadata
//! holds each stripe's range); it is there so a bucket can be checked and understood on
//! its own.
//!
//! ```text
//! header  (16 B)  "SHOALOBJ" | version u16 | 0u16 | stripes u32
//! data            stripe bytes, in index order
//! index           postcard Vec<PackedStripe>
//! trailer (24 B)  index offset u64 | index length u64 | crc32c(index) u32 | "SHOB"
//! ```

use bytes::{BufMut, Bytes, BytesMut};
use serde::{Deserialize, Serialize};

use crate::TierError;

const MAGIC: &[u8; 8] = b"SHOALOBJ";
const TRAILER_MAGIC: &[u8; 4] = b"SHOB";
/// The object format this crate writes.
pub const OBJECT_VERSION: u16 = 1;
/// Where the first stripe's bytes start.
pub const HEADER_LEN: u64 = 16;
const TRAILER_LEN: usize = 24;

/// One stripe's place in an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PackedStripe {
    pub stripe: u128,
    pub offset: u64,
    pub len: u64,
    pub crc32c: u32,
}

/// The bucket key of object `id`.
pub fn object_key(id: u128) -> String {
    format!("objects/{id:032x}")
}

/// The object id a key names, if it is one of ours.
pub fn object_id(key: &str) -> Option<u128> {
    let hex = key.strip_prefix("objects/")?;
    (hex.len() == 32)
        .then(|| u128::from_str_radix(hex, 16).ok())
        .flatten()
}

/// Lays `stripes` (id, bytes) out as one object: its bytes and where each stripe is.
pub fn pack(stripes: &[(u128, Bytes)]) -> (Bytes, Vec<PackedStripe>) {
    let data: usize = stripes.iter().map(|(_, b)| b.len()).sum();
    let mut out = BytesMut::with_capacity(HEADER_LEN as usize + data + 64 * stripes.len() + 64);
    out.put_slice(MAGIC);
    out.put_u16_le(OBJECT_VERSION);
    out.put_u16_le(0);
    out.put_u32_le(stripes.len() as u32);
    let mut index = Vec::with_capacity(stripes.len());
    for (id, bytes) in stripes {
        index.push(PackedStripe {
            stripe: *id,
            offset: out.len() as u64,
            len: bytes.len() as u64,
            crc32c: crc32c::crc32c(bytes),
        });
        out.put_slice(bytes);
    }
    let index_at = out.len() as u64;
    let encoded = postcard::to_stdvec(&index).unwrap_or_default();
    out.put_slice(&encoded);
    out.put_u64_le(index_at);
    out.put_u64_le(encoded.len() as u64);
    out.put_u32_le(crc32c::crc32c(&encoded));
    out.put_slice(TRAILER_MAGIC);
    (out.freeze(), index)
}

fn damaged(key: &str, what: impl Into<String>) -> TierError {
    TierError::Damaged {
        key: key.to_owned(),
        what: what.into(),
    }
}

fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

/// Reads an object's index back and checks every stripe's bytes against it: what a
/// verify after upload runs on the bytes the store returns.
pub fn verify(key: &str, object: &[u8]) -> Result<Vec<PackedStripe>, TierError> {
    if object.len() < HEADER_LEN as usize + TRAILER_LEN || &object[..8] != MAGIC {
        return Err(damaged(key, "not a shoal object (header)"));
    }
    let version = u16::from_le_bytes([object[8], object[9]]);
    if version != OBJECT_VERSION {
        return Err(damaged(key, format!("unknown object version {version}")));
    }
    let t = &object[object.len() - TRAILER_LEN..];
    if &t[20..24] != TRAILER_MAGIC {
        return Err(damaged(key, "no trailer (cut short?)"));
    }
    let (at, len) = (le_u64(&t[0..8]), le_u64(&t[8..16]));
    let crc = u32::from_le_bytes([t[16], t[17], t[18], t[19]]);
    let end = at
        .checked_add(len)
        .filter(|&e| e as usize == object.len() - TRAILER_LEN)
        .ok_or_else(|| damaged(key, "index out of place"))?;
    let encoded = &object[at as usize..end as usize];
    if crc32c::crc32c(encoded) != crc {
        return Err(damaged(key, "index checksum mismatch"));
    }
    let index: Vec<PackedStripe> =
        postcard::from_bytes(encoded).map_err(|e| damaged(key, format!("index: {e}")))?;
    for p in &index {
        let bytes = p
            .offset
            .checked_add(p.len)
            .filter(|&e| p.offset >= HEADER_LEN && e <= at)
            .map(|e| &object[p.offset as usize..e as usize])
            .ok_or_else(|| damaged(key, format!("stripe {:032x} out of range", p.stripe)))?;
        if crc32c::crc32c(bytes) != p.crc32c {
            return Err(damaged(
                key,
                format!("stripe {:032x} checksum mismatch", p.stripe),
            ));
        }
    }
    Ok(index)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<(u128, Bytes)> {
        vec![
            (7, Bytes::from(vec![1u8; 1000])),
            (9, Bytes::from_static(b"")),
            (u128::MAX, Bytes::from((0..=255u8).collect::<Vec<_>>())),
        ]
    }

    #[test]
    fn a_packed_object_verifies_and_names_each_stripe_range() {
        let (obj, index) = pack(&sample());
        assert_eq!(verify("k", &obj).expect("verify"), index);
        for ((id, bytes), p) in sample().iter().zip(&index) {
            assert_eq!(p.stripe, *id);
            assert_eq!(
                &obj[p.offset as usize..(p.offset + p.len) as usize],
                &bytes[..]
            );
        }
        assert_eq!(index[0].offset, HEADER_LEN);
    }

    #[test]
    fn a_cut_or_altered_object_fails_verification() {
        let (obj, _) = pack(&sample());
        let half = &obj[..obj.len() / 2];
        assert!(matches!(verify("k", half), Err(TierError::Damaged { .. })));
        let mut flipped = obj.to_vec();
        flipped[HEADER_LEN as usize + 10] ^= 1;
        let err = verify("k", &flipped).expect_err("flipped byte");
        assert!(err.to_string().contains("checksum"), "{err}");
        assert!(verify("k", b"").is_err());
    }

    #[test]
    fn object_keys_round_trip() {
        for id in [0u128, 1, u128::MAX, 0xdead_beef] {
            assert_eq!(object_id(&object_key(id)), Some(id));
        }
        assert_eq!(object_id("objects/xyz"), None);
        assert_eq!(object_id("other/00000000000000000000000000000001"), None);
    }
}
