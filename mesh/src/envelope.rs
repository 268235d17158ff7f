//! The authenticated, versioned wrapper around every gossip packet.
//!
//! ```text
//! version 2:
//! | magic "SHOG" (4) | 2 | sender node id (8) | sender epoch (8) | counter (8) | payload (..)
//!   | HMAC-SHA256(key, magic..payload) (32) |
//! version 1 (the previous release; refused unless `[mesh] legacy_gossip` says otherwise):
//! | magic "SHOG" (4) | 1 | payload (..) | HMAC-SHA256(key, magic..payload) (32) |
//! ```
//!
//! Integers are big-endian. The key is the cluster's shared secret ([`crate::ClusterKey`]).
//! A packet from outside the cluster (wrong key, wrong magic, unknown version, truncated)
//! is rejected before any of its payload is decoded.
//!
//! Freshness: every sender numbers its packets (`counter`, from 0 in each `epoch`, the
//! sender's generation, which grows with every start), and the MAC covers the sender, the
//! epoch and the counter. A receiver's [`ReplayGuard`] admits each (sender, epoch, counter)
//! once, within a window of the last [`WINDOW`] counters (UDP may reorder), and nothing
//! of an epoch older than the newest it saw from that sender: a captured packet replayed
//! later is refused. The key is shared, so this protects against anyone who can capture
//! and resend packets, not against a holder of the cluster key: rotate `cluster.key` after
//! a node's compromise. Revoking the node's certificate shuts it out of RPC and the bulk
//! lane and drops gossip that names it as the sender, but a holder of the key could name
//! another sender.
//!
//! The driver (`gossip.rs`) counts rejected packets
//! (`shoal_mesh_gossip_packets_rejected_total{reason}`) and logs them once per source
//! address; replays (`reason="replayed"`) are logged at debug only, since the network may
//! duplicate a datagram too.

use std::collections::HashMap;

use ring::hmac;

pub const MAGIC: [u8; 4] = *b"SHOG";
pub const VERSION: u8 = 2;
pub const VERSION_1: u8 = 1;
const HEADER_V1: usize = 5;
const HEADER_V2: usize = 5 + 3 * 8;
pub const TAG_LEN: usize = 32;
/// Bytes the envelope adds to a payload.
pub const OVERHEAD: usize = HEADER_V2 + TAG_LEN;
/// How far behind the newest counter of a sender a packet may arrive (reordered) and still
/// be admitted once.
pub const WINDOW: u64 = 64;
/// Senders a [`ReplayGuard`] remembers; past that the one heard from longest ago is
/// forgotten (far more nodes than a cluster has).
const MAX_SENDERS: usize = 4096;

/// Why a packet was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// Shorter than an empty envelope.
    Truncated,
    /// Not a shoal gossip packet at all.
    BadMagic,
    /// A shoal packet of a wire version this agent does not speak.
    UnknownVersion(u8),
    /// A version 1 packet (no freshness) while `legacy_gossip` is off.
    Legacy,
    /// The MAC does not verify: another cluster's key, or tampered bytes.
    BadMac,
    /// Seen before, or older than the window or the sender's epoch: a replay.
    Replayed,
    /// From a node whose certificate the cluster revoked (the receiver's decision: see
    /// `Revocations::silences`).
    Revoked,
}

impl Rejection {
    /// Short label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Rejection::Truncated => "truncated",
            Rejection::BadMagic => "bad_magic",
            Rejection::UnknownVersion(_) => "unknown_version",
            Rejection::Legacy => "legacy_version",
            Rejection::BadMac => "bad_mac",
            Rejection::Replayed => "replayed",
            Rejection::Revoked => "revoked",
        }
    }
}

/// Who sent a packet, and where it stands in the sender's sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sender {
    pub node: u64,
    /// Grows with every start of the sender (its generation then).
    pub epoch: u64,
    /// The packet's number within the epoch.
    pub counter: u64,
}

/// Wraps `payload` for sending (version 2).
pub fn seal(key: &hmac::Key, sender: &Sender, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + OVERHEAD);
    out.extend_from_slice(&MAGIC);
    out.push(VERSION);
    out.extend_from_slice(&sender.node.to_be_bytes());
    out.extend_from_slice(&sender.epoch.to_be_bytes());
    out.extend_from_slice(&sender.counter.to_be_bytes());
    out.extend_from_slice(payload);
    let tag = hmac::sign(key, &out);
    out.extend_from_slice(tag.as_ref());
    out
}

/// Wraps `payload` as the previous release did (version 1), for `legacy_gossip = "speak"`.
pub fn seal_v1(key: &hmac::Key, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + HEADER_V1 + TAG_LEN);
    out.extend_from_slice(&MAGIC);
    out.push(VERSION_1);
    out.extend_from_slice(payload);
    let tag = hmac::sign(key, &out);
    out.extend_from_slice(tag.as_ref());
    out
}

/// A packet that passed authentication.
#[derive(Debug, PartialEq, Eq)]
pub struct Opened<'a> {
    pub payload: &'a [u8],
    /// `None` for a version 1 packet (which names no sender).
    pub sender: Option<Sender>,
}

fn be_u64(bytes: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&bytes[..8]);
    u64::from_be_bytes(b)
}

/// Checks a received packet's authenticity and returns its payload and sender. Freshness
/// is the caller's [`ReplayGuard`]'s to judge. Version 1 packets open only with
/// `accept_v1`.
pub fn open<'a>(
    key: &hmac::Key,
    packet: &'a [u8],
    accept_v1: bool,
) -> Result<Opened<'a>, Rejection> {
    if packet.len() < HEADER_V1 + TAG_LEN {
        return Err(Rejection::Truncated);
    }
    if packet[..4] != MAGIC {
        return Err(Rejection::BadMagic);
    }
    let header = match packet[4] {
        VERSION => HEADER_V2,
        VERSION_1 if accept_v1 => HEADER_V1,
        VERSION_1 => return Err(Rejection::Legacy),
        v => return Err(Rejection::UnknownVersion(v)),
    };
    if packet.len() < header + TAG_LEN {
        return Err(Rejection::Truncated);
    }
    let (signed, tag) = packet.split_at(packet.len() - TAG_LEN);
    hmac::verify(key, signed, tag).map_err(|_| Rejection::BadMac)?;
    let sender = (header == HEADER_V2).then(|| Sender {
        node: be_u64(&signed[5..]),
        epoch: be_u64(&signed[13..]),
        counter: be_u64(&signed[21..]),
    });
    Ok(Opened {
        payload: &signed[header..],
        sender,
    })
}

/// What a receiver knows of one sender's sequence.
#[derive(Debug, Clone, Copy)]
struct Seen {
    epoch: u64,
    /// The highest counter admitted in `epoch`.
    highest: u64,
    /// Bit `i`: counter `highest - i` was admitted.
    bits: u64,
    /// When this sender was last admitted (a tick of the guard), for eviction.
    last: u64,
}

/// Admits each (sender, epoch, counter) once. Pure: no clock, no I/O.
#[derive(Debug, Default)]
pub struct ReplayGuard {
    seen: HashMap<u64, Seen>,
    ticks: u64,
}

impl ReplayGuard {
    /// Whether the packet is fresh; records it if so.
    pub fn admit(&mut self, s: &Sender) -> bool {
        self.ticks += 1;
        let tick = self.ticks;
        if !self.seen.contains_key(&s.node) && self.seen.len() >= MAX_SENDERS {
            let oldest = self
                .seen
                .iter()
                .min_by_key(|(_, w)| w.last)
                .map(|(n, _)| *n);
            if let Some(n) = oldest {
                self.seen.remove(&n);
            }
        }
        let fresh = Seen {
            epoch: s.epoch,
            highest: s.counter,
            bits: 1,
            last: tick,
        };
        let Some(w) = self.seen.get_mut(&s.node) else {
            self.seen.insert(s.node, fresh);
            return true;
        };
        if s.epoch > w.epoch {
            *w = fresh;
            return true;
        }
        if s.epoch < w.epoch {
            return false;
        }
        if s.counter > w.highest {
            let shift = s.counter - w.highest;
            w.bits = if shift >= WINDOW { 0 } else { w.bits << shift };
            w.bits |= 1;
            w.highest = s.counter;
            w.last = tick;
            return true;
        }
        let behind = w.highest - s.counter;
        if behind >= WINDOW || w.bits & (1 << behind) != 0 {
            return false;
        }
        w.bits |= 1 << behind;
        w.last = tick;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{RngExt, SeedableRng, rngs::StdRng};

    fn key(byte: u8) -> hmac::Key {
        hmac::Key::new(hmac::HMAC_SHA256, &[byte; 32])
    }

    fn from(node: u64, epoch: u64, counter: u64) -> Sender {
        Sender {
            node,
            epoch,
            counter,
        }
    }

    #[test]
    fn sealed_packet_opens_with_same_key_and_names_its_sender() {
        let k = key(1);
        let s = from(7, 3, 41);
        let packet = seal(&k, &s, b"hello");
        assert_eq!(
            open(&k, &packet, false),
            Ok(Opened {
                payload: b"hello",
                sender: Some(s)
            })
        );
    }

    #[test]
    fn golden_bytes_of_version_2() {
        let packet = seal(&key(9), &from(0x0102, 3, 4), b"p");
        assert_eq!(
            &packet[..HEADER_V2 + 1],
            &[
                b'S', b'H', b'O', b'G', 2, 0, 0, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0,
                0, 0, 0, 0, 4, b'p'
            ]
        );
        assert_eq!(packet.len(), HEADER_V2 + 1 + TAG_LEN);
    }

    #[test]
    fn other_cluster_key_is_rejected() {
        let packet = seal(&key(1), &from(1, 1, 1), b"hello");
        assert_eq!(open(&key(2), &packet, false), Err(Rejection::BadMac));
    }

    #[test]
    fn version_1_opens_only_when_legacy_gossip_allows_it() {
        let k = key(6);
        let packet = seal_v1(&k, b"old");
        assert_eq!(open(&k, &packet, false), Err(Rejection::Legacy));
        assert_eq!(
            open(&k, &packet, true),
            Ok(Opened {
                payload: b"old",
                sender: None
            })
        );
    }

    #[test]
    fn any_flipped_bit_is_rejected() {
        let k = key(3);
        let packet = seal(&k, &from(5, 6, 7), b"some gossip payload");
        for i in 0..packet.len() {
            for bit in 0..8 {
                let mut bad = packet.clone();
                bad[i] ^= 1 << bit;
                assert!(
                    open(&k, &bad, true).is_err(),
                    "flip at byte {i} bit {bit} accepted"
                );
            }
        }
    }

    #[test]
    fn unknown_version_is_named() {
        let k = key(4);
        let mut packet = seal(&k, &from(1, 1, 1), b"x");
        packet[4] = 9;
        assert_eq!(open(&k, &packet, true), Err(Rejection::UnknownVersion(9)));
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
                bytes[4] = if rng.random_bool(0.5) {
                    VERSION
                } else {
                    VERSION_1
                };
            }
            assert!(
                open(&k, &bytes, true).is_err(),
                "seed {seed}: random packet opened"
            );
        }
    }

    #[test]
    fn each_packet_is_admitted_once() {
        let mut g = ReplayGuard::default();
        assert!(g.admit(&from(1, 5, 0)));
        assert!(g.admit(&from(1, 5, 1)));
        assert!(!g.admit(&from(1, 5, 1)), "the same packet again");
        assert!(!g.admit(&from(1, 5, 0)));
        // Another sender's numbers are its own.
        assert!(g.admit(&from(2, 5, 1)));
    }

    #[test]
    fn reordered_packets_within_the_window_are_admitted_once() {
        let mut g = ReplayGuard::default();
        assert!(g.admit(&from(1, 1, 10)));
        assert!(g.admit(&from(1, 1, 12)));
        assert!(g.admit(&from(1, 1, 11)), "late but new");
        assert!(!g.admit(&from(1, 1, 11)));
        assert!(g.admit(&from(1, 1, 12 + WINDOW - 1)));
        assert!(!g.admit(&from(1, 1, 12)), "now outside the window");
        assert!(g.admit(&from(1, 1, 12 + WINDOW)), "the window moves on");
    }

    #[test]
    fn a_new_epoch_resets_and_older_epochs_are_refused() {
        let mut g = ReplayGuard::default();
        assert!(g.admit(&from(1, 4, 900)));
        assert!(g.admit(&from(1, 5, 0)), "the sender restarted");
        assert!(!g.admit(&from(1, 4, 901)), "its previous life");
        assert!(g.admit(&from(1, 5, 1)));
    }

    #[test]
    fn a_long_jump_forgets_the_old_window() {
        let mut g = ReplayGuard::default();
        assert!(g.admit(&from(1, 1, 3)));
        assert!(g.admit(&from(1, 1, 3 + 10 * WINDOW)));
        assert!(!g.admit(&from(1, 1, 3)));
        assert!(g.admit(&from(1, 1, 2 + 10 * WINDOW)));
    }

    #[test]
    fn the_guard_stays_bounded() {
        let mut g = ReplayGuard::default();
        for n in 0..(MAX_SENDERS as u64 + 10) {
            assert!(g.admit(&from(n, 1, 0)));
        }
        assert!(g.seen.len() <= MAX_SENDERS);
        // The newest are still remembered.
        assert!(!g.admit(&from(MAX_SENDERS as u64 + 9, 1, 0)));
    }

    /// Seeded random interleavings: whatever the order, nothing is admitted twice, and
    /// every packet within the window of the newest is admitted when first seen.
    #[test]
    fn never_twice_whatever_the_order() {
        let seed = 0xfee1_u64;
        let mut rng = StdRng::seed_from_u64(seed);
        for _ in 0..200 {
            let mut g = ReplayGuard::default();
            let mut admitted = std::collections::HashSet::new();
            for _ in 0..500 {
                let c = rng.random_range(0..300u64);
                let ok = g.admit(&from(1, 1, c));
                if ok {
                    assert!(admitted.insert(c), "seed {seed}: {c} admitted twice");
                }
            }
        }
    }
}
