//! Who a member is in SWIM: [`MemberId`] = node id + gossip address + generation.
//!
//! foca's `Identity::Addr` is the gossip address, so a node can join through a seed whose
//! id it does not know. A higher generation wins an address conflict, and `renew()` bumps
//! it, so a node wrongly declared down rejoins by itself. The node id is the one the node's
//! certificate names (random, made by `shoal cert issue`; shown as 16 hex digits); the
//! agent keeps it and the generation in its data dir (`agent/src/identity_store.rs`).

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

/// A node's stable identity (from `shoal-ids`, which placement shares).
pub use shoal_ids::NodeId;

/// One life of a node in the SWIM protocol: the stable id, where it gossips, and a
/// generation that grows with every restart (and every rejoin after being declared
/// down), so that a returning node wins over its old self.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MemberId {
    pub node: NodeId,
    pub addr: SocketAddr,
    pub generation: u64,
}

/// Node id used when announcing to a seed whose id we do not know yet. Real ids are
/// random 64-bit values that `shoal cert issue` draws, never 0 (and a certificate naming 0
/// is not taken, `node_cert.rs`).
pub(crate) const UNKNOWN_NODE: NodeId = NodeId(0);

impl foca::Identity for MemberId {
    // Foca accepts an announce addressed to any identity with our `addr()`, which is how a
    // node joins through a seed whose node id it does not know: the gossip address.
    type Addr = SocketAddr;

    fn renew(&self) -> Option<Self> {
        Some(MemberId {
            generation: self.generation + 1,
            ..*self
        })
    }

    fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn win_addr_conflict(&self, adversary: &Self) -> bool {
        self.generation > adversary.generation
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use foca::Identity;

    #[test]
    fn node_id_round_trips_through_hex() {
        let id = NodeId(0x00ab_cdef_0123_4567);
        assert_eq!(id.to_string(), "00abcdef01234567");
        assert_eq!("00abcdef01234567".parse::<NodeId>().ok(), Some(id));
    }

    #[test]
    fn renewed_identity_wins_over_old_one() {
        let old = MemberId {
            node: NodeId(7),
            addr: "127.0.0.1:1".parse().expect("addr"),
            generation: 3,
        };
        let new = old.renew().expect("renew");
        assert_eq!(new.addr(), old.addr());
        assert!(new.win_addr_conflict(&old));
        assert!(!old.win_addr_conflict(&new));
    }
}
