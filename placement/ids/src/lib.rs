//! The ids every shoal crate shares: a node's ([`NodeId`]) and a stripe's ([`StripeId`]).
//! Placement computes with them and the mesh names its members by them; neither depends on
//! the other for that.

use std::fmt;
use std::num::ParseIntError;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A node's stable identity: a random non-zero `u64` created on the node's first start.
/// Shown as 16 lowercase hex digits; parsed from hex (surrounding whitespace ignored).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NodeId(pub u64);

impl NodeId {
    /// No node: where a stripe record names it, that shard is missing (written degraded,
    /// or given up as corrupt) and waits for repair. No node ever has this id.
    pub const NONE: NodeId = NodeId(0);

    /// True for [`NodeId::NONE`].
    pub fn is_none(self) -> bool {
        self == NodeId::NONE
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl FromStr for NodeId {
    type Err = ParseIntError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        u64::from_str_radix(s.trim(), 16).map(NodeId)
    }
}

/// A stripe's 128-bit id. Shown as 32 lowercase hex digits; parsed from hex.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct StripeId(pub u128);

impl fmt::Display for StripeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl FromStr for StripeId {
    type Err = ParseIntError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        u128::from_str_radix(s.trim(), 16).map(StripeId)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_id_shows_sixteen_hex_digits_and_parses_back() {
        let id = NodeId(0xab);
        assert_eq!(id.to_string(), "00000000000000ab");
        assert_eq!("00000000000000ab".parse::<NodeId>(), Ok(id));
        assert_eq!(
            " ffffffffffffffff\n".parse::<NodeId>(),
            Ok(NodeId(u64::MAX))
        );
        assert!("xyz".parse::<NodeId>().is_err());
        assert!("1ffffffffffffffff".parse::<NodeId>().is_err());
    }

    #[test]
    fn stripe_id_shows_thirty_two_hex_digits_and_parses_back() {
        let id = StripeId(u128::MAX - 1);
        assert_eq!(id.to_string(), "fffffffffffffffffffffffffffffffe");
        assert_eq!(id.to_string().parse::<StripeId>(), Ok(id));
        assert_eq!(StripeId(1).to_string().len(), 32);
        assert!("".parse::<StripeId>().is_err());
    }

    #[test]
    fn ids_serialize_as_plain_integers() {
        assert_eq!(serde_json::to_string(&NodeId(7)).ok().as_deref(), Some("7"));
        assert_eq!(
            serde_json::to_string(&StripeId(9)).ok().as_deref(),
            Some("9")
        );
    }
}
