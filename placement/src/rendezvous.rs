//! Weighted rendezvous placement with failure-domain spreading.
//!
//! Each shard slot `s` of a stripe runs its own highest-random-weight contest: every
//! eligible node gets a score `weight / -log2(u)` from a draw `u` keyed by (stripe, slot,
//! node) (see [`crate::hash`]), and the best allowed node wins. A node is allowed for a
//! slot when it holds no earlier slot of the stripe and its failure domain holds the
//! fewest shards among the domains that still have a free eligible node. So with at
//! least `k + m` domains every shard lands in its own domain; with fewer, the domains
//! fill round by round, as evenly as their sizes permit.
//!
//! Why one contest per slot rather than one ranking cut into slots: a shard's index is
//! part of what it holds, so targets must stay in their slots when nodes come and go.
//! With a single ranking, a node joining near the top would shift every lower slot to
//! another node. With per-slot contests (CRUSH calls this "indep"), a join takes a
//! slot with probability about the newcomer's weight share and disturbs the others
//! only through the rare cascade of a freed node winning a later slot.
//!
//! The slot order, the allowed-domain rule and the tie-break are part of the on-disk
//! contract along with the hash (`placement_is_pinned` below holds one result fixed).
//!
//! Weights are shares of each slot's contest. Over all `k + m` slots, a node heavier
//! than average gets somewhat less than its weight share (it can hold at most one shard
//! per stripe), a lighter one somewhat more; the property tests measure this.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use crate::error::PlacementError;
use crate::hash::{draw, neg_log2_fixed, node_key, slot_key};
use crate::ids::{NodeId, StripeId};
use crate::layout::{Layout, LayoutNode};
use crate::profile::EcProfile;

/// The eligible nodes of a layout with their hash keys and dense domain numbers,
/// built once with the layout so that each placement only scores.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct PlacementIndex {
    candidates: Vec<Candidate>,
    domain_count: usize,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Candidate {
    id: NodeId,
    key: u64,
    weight: u64,
    domain: usize,
}

impl PlacementIndex {
    pub(crate) fn build(nodes: &[LayoutNode]) -> Self {
        let mut domains = BTreeMap::new();
        let candidates = nodes
            .iter()
            .filter(|n| n.is_eligible())
            .map(|n| {
                let next = domains.len();
                let domain = *domains.entry(n.failure_domain.0.as_str()).or_insert(next);
                Candidate {
                    id: n.id,
                    key: node_key(n.id.0),
                    weight: n.weight,
                    domain,
                }
            })
            .collect();
        PlacementIndex {
            candidates,
            domain_count: domains.len(),
        }
    }
}

/// A candidate's score in one slot contest: `weight / neg_log2`, higher wins.
#[derive(Clone, Copy)]
struct Score {
    weight: u64,
    neg_log2: u64,
    draw: u64,
    id: NodeId,
}

impl Score {
    /// Total order, independent of the order nodes are listed in: score, then draw,
    /// then the lower node id.
    fn cmp(&self, other: &Score) -> Ordering {
        let lhs = u128::from(self.weight) * u128::from(other.neg_log2);
        let rhs = u128::from(other.weight) * u128::from(self.neg_log2);
        lhs.cmp(&rhs)
            .then(self.draw.cmp(&other.draw))
            .then(other.id.cmp(&self.id))
    }
}

/// The `k + m` nodes that should hold the shards of `stripe`, in shard order: element
/// `i` is the target of shard `i` (data shards first, then parity).
///
/// Deterministic in `(eligible nodes of layout, stripe, profile)`; only `Active` nodes
/// with non-zero weight take part. Never returns a node twice; no two targets share a
/// failure domain while at least `k + m` domains have eligible nodes.
pub fn place(
    layout: &Layout,
    stripe: StripeId,
    profile: EcProfile,
) -> Result<Vec<NodeId>, PlacementError> {
    profile.validate()?;
    let need = profile.total();
    let PlacementIndex {
        candidates,
        domain_count,
    } = layout.placement_index();
    let domain_count = *domain_count;
    if candidates.len() < need {
        return Err(PlacementError::NotEnoughNodes {
            need,
            have: candidates.len(),
        });
    }

    let mut taken = vec![false; candidates.len()];
    let mut placed_in = vec![0usize; domain_count];
    let mut free_in = vec![0usize; domain_count];
    for c in candidates {
        free_in[c.domain] += 1;
    }

    let mut targets = Vec::with_capacity(need);
    for slot in 0..need {
        // Domains with a free node that hold the fewest shards so far are allowed.
        let level = (0..domain_count)
            .filter(|&d| free_in[d] > 0)
            .map(|d| placed_in[d])
            .min();
        let key = slot_key(stripe.0, slot as u8);
        let mut best: Option<(usize, Score)> = None;
        for (i, c) in candidates.iter().enumerate() {
            if taken[i] || Some(placed_in[c.domain]) != level {
                continue;
            }
            let h = draw(key, c.key);
            let score = Score {
                weight: c.weight,
                neg_log2: neg_log2_fixed(h),
                draw: h,
                id: c.id,
            };
            if best
                .as_ref()
                .is_none_or(|(_, b)| score.cmp(b) == Ordering::Greater)
            {
                best = Some((i, score));
            }
        }
        // Unreachable with candidates.len() >= need, but never panic on a layout.
        let (i, _) = best.ok_or(PlacementError::NotEnoughNodes {
            need,
            have: targets.len(),
        })?;
        taken[i] = true;
        placed_in[candidates[i].domain] += 1;
        free_in[candidates[i].domain] -= 1;
        targets.push(candidates[i].id);
    }
    Ok(targets)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::NodeState;

    fn layout(nodes: &[(u64, &str, u64)]) -> Layout {
        let nodes = nodes
            .iter()
            .map(|&(id, d, w)| LayoutNode::active(NodeId(id), d, w))
            .collect();
        Layout::new(1, nodes).unwrap_or_else(|e| panic!("{e}"))
    }

    fn profile(k: u8, m: u8) -> EcProfile {
        EcProfile { k, m }
    }

    #[test]
    fn place_refuses_when_too_few_active_nodes() {
        let mut l = layout(&[(1, "a", 1), (2, "b", 1), (3, "c", 1), (4, "d", 0)]);
        assert_eq!(
            place(&l, StripeId(1), profile(2, 1)).map(|t| t.len()),
            Ok(3)
        );
        let err = place(&l, StripeId(1), profile(2, 2));
        assert_eq!(
            err,
            Err(PlacementError::NotEnoughNodes { need: 4, have: 3 })
        );
        assert!(
            err.err()
                .is_some_and(|e| e.is_retryable() && e.to_string().contains("needs 4"))
        );

        let mut nodes = l.nodes().to_vec();
        nodes[0].state = NodeState::Down;
        l = Layout::new(2, nodes).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            place(&l, StripeId(1), profile(2, 1)),
            Err(PlacementError::NotEnoughNodes { need: 3, have: 2 })
        );
    }

    #[test]
    fn place_refuses_an_invalid_profile() {
        let l = layout(&[(1, "a", 1)]);
        assert!(matches!(
            place(&l, StripeId(1), profile(0, 1)),
            Err(PlacementError::InvalidProfile { .. })
        ));
    }

    #[test]
    fn zero_weight_and_inactive_nodes_never_get_shards() {
        let mut nodes: Vec<LayoutNode> = (1..=8)
            .map(|i| LayoutNode::active(NodeId(i), "a", 10))
            .collect();
        nodes[0].weight = 0;
        nodes[1].state = NodeState::Draining;
        nodes[2].state = NodeState::Out;
        let l = Layout::new(1, nodes).unwrap_or_else(|e| panic!("{e}"));
        for s in 0..500 {
            let t = place(&l, StripeId(s), profile(3, 2)).unwrap_or_else(|e| panic!("{e}"));
            assert!(t.iter().all(|n| n.0 > 3), "{t:?}");
        }
    }

    #[test]
    fn fewer_domains_than_shards_fill_round_by_round() {
        // 3 domains of 3 nodes, 4+2: two shards per domain.
        let nodes: Vec<_> = (0..9u64)
            .map(|i| (i + 1, ["a", "b", "c"][(i % 3) as usize], 5))
            .collect();
        let l = layout(&nodes);
        for s in 0..300 {
            let t = place(&l, StripeId(s), profile(4, 2)).unwrap_or_else(|e| panic!("{e}"));
            let mut per = [0; 3];
            for n in &t {
                per[((n.0 - 1) % 3) as usize] += 1;
            }
            assert_eq!(per, [2, 2, 2], "stripe {s}: {t:?}");
        }
    }

    #[test]
    fn small_domain_is_filled_before_the_others_take_more() {
        // Domain "a" has one node; "b" has five. 2+2 needs 4: "a" gets 1, "b" gets 3.
        let l = layout(&[
            (1, "a", 1),
            (2, "b", 1),
            (3, "b", 1),
            (4, "b", 1),
            (5, "b", 1),
            (6, "b", 1),
        ]);
        for s in 0..200 {
            let t = place(&l, StripeId(s), profile(2, 2)).unwrap_or_else(|e| panic!("{e}"));
            assert!(t.contains(&NodeId(1)), "{t:?}");
        }
    }

    /// Part of the on-disk contract, like the pinned hash values.
    #[test]
    fn placement_is_pinned() {
        let l = layout(&[
            (1, "a", 1),
            (2, "b", 2),
            (3, "c", 3),
            (4, "d", 4),
            (5, "e", 5),
            (6, "f", 6),
            (7, "g", 7),
        ]);
        let t = place(&l, StripeId(0xfeed_beef), profile(3, 2)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(t.iter().map(|n| n.0).collect::<Vec<_>>(), PIN_TARGETS);
    }

    const PIN_TARGETS: [u64; 5] = [4, 5, 3, 6, 2];
}
