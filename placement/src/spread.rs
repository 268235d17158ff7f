//! How well a stripe's shards are spread, and the moves that bring a stripe toward its
//! placement without spreading it worse.
//!
//! A stripe's protection is its [`Spread`]: how many shards it has, over how many failure
//! domains, and the most it has in any one domain (what the loss of that domain costs).
//! A move is allowed when the stripe keeps its spread — no fewer shards, no fewer domains,
//! no more shards in one domain than today — so with fewer domains than `k + m` a shard
//! may still move, to another node of its own domain or to a domain that holds fewer.

use std::collections::BTreeMap;

use crate::layout::{FailureDomain, Layout};
use crate::profile::EcProfile;
use crate::rendezvous::place;
use shoal_ids::{NodeId, StripeId};

/// How a stripe's shards lie over failure domains (see the module doc).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Spread {
    /// Shards on nodes of the layout.
    pub shards: usize,
    /// Distinct failure domains those shards are in.
    pub domains: usize,
    /// The most shards in any one failure domain.
    pub most_in_one_domain: usize,
}

impl Spread {
    /// The spread of shards on `nodes` (one entry per shard; a node twice holds two)
    /// under the failure domains of `layout`, whatever the nodes' states. A node the
    /// layout does not have, or [`NodeId::NONE`], holds no shard that counts.
    pub fn of(layout: &Layout, nodes: impl IntoIterator<Item = NodeId>) -> Spread {
        let mut per_domain: BTreeMap<&FailureDomain, usize> = BTreeMap::new();
        for n in nodes {
            if let Some(node) = layout.node(n) {
                *per_domain.entry(&node.failure_domain).or_default() += 1;
            }
        }
        Spread {
            shards: per_domain.values().sum(),
            domains: per_domain.len(),
            most_in_one_domain: per_domain.values().copied().max().unwrap_or(0),
        }
    }

    /// Whether this spread protects at least as well as `before`: no fewer shards, no
    /// fewer failure domains, no more shards in one domain.
    pub fn keeps(&self, before: &Spread) -> bool {
        self.shards >= before.shards
            && self.domains >= before.domains
            && self.most_in_one_domain <= before.most_in_one_domain
    }
}

/// One shard to move: slot `slot` to node `to`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Move {
    pub slot: u8,
    pub to: NodeId,
}

/// Moves that bring a stripe whose slot `i` is on `holders[i]` toward where [`place`]
/// puts it under `layout`, never leaving it less well spread than it is
/// ([`Spread::keeps`]).
///
/// Each node placement wants for the stripe that holds none of it (in slot order) takes
/// the shard of one node placement no longer wants: the one in its own slot if that
/// keeps the spread, else one in its own failure domain, else any that keeps it (the
/// slot index stays with the shard: only the node changes). `may_take(slot, to)` rules
/// out a move (a target without room, one fenced for the slot). The moves come in the
/// order to make them: each prefix keeps the spread too. None when placement fails (too
/// few nodes) or a holder is not in the layout.
pub fn place_moves(
    layout: &Layout,
    stripe: StripeId,
    profile: EcProfile,
    holders: &[NodeId],
    mut may_take: impl FnMut(u8, NodeId) -> bool,
) -> Vec<Move> {
    let Ok(ideal) = place(layout, stripe, profile) else {
        return Vec::new();
    };
    if holders.len() != ideal.len() || holders.iter().any(|h| layout.node(*h).is_none()) {
        return Vec::new();
    }
    let domain = |n: NodeId| layout.node(n).map(|l| &l.failure_domain);
    let before = Spread::of(layout, holders.iter().copied());
    let mut now = holders.to_vec();
    let mut moves = Vec::new();
    for (s, &to) in ideal.iter().enumerate() {
        if holders.contains(&to) {
            continue;
        }
        // Shards on nodes placement no longer wants for the stripe, not moved yet.
        let mut from: Vec<usize> = (0..now.len())
            .filter(|&f| now[f] == holders[f] && !ideal.contains(&holders[f]))
            .collect();
        from.sort_by_key(|&f| (f != s, domain(holders[f]) != domain(to), f));
        for f in from {
            let slot = f as u8;
            if !may_take(slot, to) {
                continue;
            }
            let mut after = now.clone();
            after[f] = to;
            if Spread::of(layout, after.iter().copied()).keeps(&before) {
                now = after;
                moves.push(Move { slot, to });
                break;
            }
        }
    }
    moves
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::LayoutNode;

    /// Nodes `1..=n`, node `i` in domain `fd((i-1) % domains + 1)`, as `dev-cluster` does.
    fn round_robin(n: u64, domains: u64) -> Layout {
        let nodes = (1..=n)
            .map(|i| {
                LayoutNode::active(
                    NodeId(i),
                    format!("fd{}", (i - 1) % domains + 1).as_str(),
                    1,
                )
            })
            .collect();
        Layout::new(1, nodes).unwrap_or_else(|e| panic!("{e}"))
    }

    fn ids(ids: &[u64]) -> Vec<NodeId> {
        ids.iter().map(|&i| NodeId(i)).collect()
    }

    #[test]
    fn a_spread_counts_shards_domains_and_the_fullest_domain() {
        let l = round_robin(7, 3);
        let s = Spread::of(&l, ids(&[1, 4, 2, 5, 3, 0]));
        assert_eq!(
            s,
            Spread {
                shards: 5,
                domains: 3,
                most_in_one_domain: 2
            },
            "NONE holds nothing"
        );
        let worse = Spread::of(&l, ids(&[1, 4, 7, 2, 3, 6]));
        assert!(!worse.keeps(&Spread::of(&l, ids(&[1, 4, 2, 5, 3, 6]))));
        assert!(
            Spread::of(&l, ids(&[7, 4, 2, 5, 3, 6]))
                .keeps(&Spread::of(&l, ids(&[1, 4, 2, 5, 3, 6])))
        );
        let fewer_domains = Spread::of(&l, ids(&[1, 4, 2, 5]));
        assert!(!fewer_domains.keeps(&Spread::of(&l, ids(&[1, 4, 2, 3]))));
    }

    #[test]
    fn a_newcomer_takes_a_shard_of_its_own_domain_when_there_are_fewer_domains_than_shards() {
        // 4+2 on 6 nodes in 3 domains: every stripe on every node. Node 7 joins fd1.
        let (before, after) = (round_robin(6, 3), round_robin(7, 3));
        let p = EcProfile { k: 4, m: 2 };
        let (mut took, mut wanted) = (0, 0);
        for s in 0..300u128 {
            let holders = place(&before, StripeId(s), p).unwrap_or_else(|e| panic!("{e}"));
            let ideal = place(&after, StripeId(s), p).unwrap_or_else(|e| panic!("{e}"));
            let moves = place_moves(&after, StripeId(s), p, &holders, |_, _| true);
            wanted += usize::from(ideal.contains(&NodeId(7)));
            for m in &moves {
                assert_eq!(m.to, NodeId(7), "stripe {s}: {moves:?}");
                let from = holders[usize::from(m.slot)];
                assert!(from == NodeId(1) || from == NodeId(4), "from fd1: {from}");
            }
            took += moves.len();
            // Nothing moves when the target may not take it.
            assert!(
                place_moves(&after, StripeId(s), p, &holders, |_, to| to != NodeId(7)).is_empty()
            );
        }
        assert_eq!(
            took, wanted,
            "every stripe placement gives node 7 moves a shard to it"
        );
        assert!(took > 150, "about 2 in 3 stripes: {took}");
    }

    #[test]
    fn nothing_moves_for_a_stripe_where_placement_puts_it_or_a_holder_the_layout_lacks() {
        let l = round_robin(7, 3);
        let p = EcProfile { k: 4, m: 2 };
        let holders = place(&l, StripeId(9), p).unwrap_or_else(|e| panic!("{e}"));
        assert!(place_moves(&l, StripeId(9), p, &holders, |_, _| true).is_empty());
        let mut gone = holders.clone();
        gone[0] = NodeId(99);
        assert!(place_moves(&l, StripeId(9), p, &gone, |_, _| true).is_empty());
        assert!(place_moves(&round_robin(5, 3), StripeId(9), p, &holders, |_, _| true).is_empty());
    }
}
