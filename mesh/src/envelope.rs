//! The authenticated, versioned wrapper around every gossip packet.
//!
//! ```text
//! | magic "SHOG" (4) | version (1) | payload (..) | HMAC-SHA256(key, magic..payload) (32) |
//! ```
//!
//! The key is the cluster's shared secret ([`crate::ClusterKey`]). A packet from outside
//! the cluster (wrong key, wrong magic, unknown version, truncated) is rejected before any
//! of its payload is decoded.

use ring::hmac;

pub const MAGIC: [u8; 4] = *b"SHOG";
pub const VERSION: u8 = 1;
const HEADER_LEN: usize = 5;
pub const TAG_LEN: usize = 32;
/// Bytes the envelope adds to a payload.
pub const OVERHEAD: usize = HEADER_LEN + TAG_LEN;

/// Why a packet was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// Shorter than an empty envelope.
    Truncated,
    /// Not a shoal gossip packet at all.
    BadMagic,
    /// A shoal packet of a wire version this agent does not speak.
    UnknownVersion(u8),
    /// The MAC does not verify: another cluster's key, or tampered bytes.
    BadMac,
}

impl Rejection {
    /// Short label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Rejection::Truncated => "truncated",
            Rejection::BadMagic => "bad_magic",
            Rejection::UnknownVersion(_) => "unknown_version",
            Rejection::BadMac => "bad_mac",
        }
    }
}

/// Wraps `payload` for sending.
pub fn seal(key: &hmac::Key, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + OVERHEAD);
    out.extend_from_slice(&MAGIC);
    out.push(VERSION);
    out.extend_from_slice(payload);
    let tag = hmac::sign(key, &out);
    out.extend_from_slice(tag.as_ref());
    out
}

/// Checks a received packet and returns its payload.
pub fn open<'a>(key: &hmac::Key, packet: &'a [u8]) -> Result<&'a [u8], Rejection> {
    if packet.len() < OVERHEAD {
        return Err(Rejection::Truncated);
    }
    if packet[..4] != MAGIC {
        return Err(Rejection::BadMagic);
    }
    if packet[4] != VERSION {
        return Err(Rejection::UnknownVersion(packet[4]));
    }
    let (signed, tag) = packet.split_at(packet.len() - TAG_LEN);
    hmac::verify(key, signed, tag).map_err(|_| Rejection::BadMac)?;
    Ok(&signed[HEADER_LEN..])
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{RngExt, SeedableRng, rngs::StdRng};

    fn key(byte: u8) -> hmac::Key {
        hmac::Key::new(hmac::HMAC_SHA256, &[byte; 32])
    }

    #[test]
    fn sealed_packet_opens_with_same_key() {
        let k = key(1);
        let packet = seal(&k, b"hello");
        assert_eq!(open(&k, &packet), Ok(&b"hello"[..]));
    }

    #[test]
    fn other_cluster_key_is_rejected() {
        let packet = seal(&key(1), b"hello");
        assert_eq!(open(&key(2), &packet), Err(Rejection::BadMac));
    }

    #[test]
    fn any_flipped_bit_is_rejected() {
        let k = key(3);
        let packet = seal(&k, b"some gossip payload");
        for i in 0..packet.len() {
            for bit in 0..8 {
                let mut bad = packet.clone();
                bad[i] ^= 1 << bit;
                assert!(
                    open(&k, &bad).is_err(),
                    "flip at byte {i} bit {bit} accepted"
                );
            }
        }
    }

    #[test]
    fn unknown_version_is_named() {
        let k = key(4);
        let mut packet = seal(&k, b"x");
        packet[4] = 9;
        assert_eq!(open(&k, &packet), Err(Rejection::UnknownVersion(9)));
    }

    #[test]
    fn random_bytes_never_panic_and_never_open() {
        let seed = 0x5eed_u64;
        let mut rng = StdRng::seed_from_u64(seed);
        let k = key(5);
        for _ in 0..20_000 {
            let len = rng.random_range(0..200usize);
            let mut bytes = vec![0u8; len];
            rng.fill(&mut bytes[..]);
            if len >= 5 && rng.random_bool(0.5) {
                bytes[..4].copy_from_slice(&MAGIC);
                bytes[4] = VERSION;
            }
            assert!(
                open(&k, &bytes).is_err(),
                "seed {seed}: random packet opened"
            );
        }
    }
}
