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
use crate::layout::{Layout, LayoutNode};
use crate::profile::EcProfile;
use shoal_ids::{NodeId, StripeId};

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
    let have = layout.placement_index().candidates.len();
    if have < need {
        return Err(PlacementError::NotEnoughNodes { need, have });
    }
    let slots: Vec<u8> = (0..need as u8).collect();
    place_slots(layout, stripe, &slots, &[], &[])
        .into_iter()
        .map(|t| t.ok_or(PlacementError::NotEnoughNodes { need, have }))
        .collect()
}

/// Like [`place`] when fewer than `k + m` nodes are eligible: the first slots (every data
/// shard, then parity) on as many nodes as there are, at least `min_shards`; the rest are
/// `None` (written later by repair). The slots placed are exactly where [`place`] would
/// put them under a layout with just these nodes. With enough nodes it is [`place`].
pub fn place_degraded(
    layout: &Layout,
    stripe: StripeId,
    profile: EcProfile,
    min_shards: usize,
) -> Result<Vec<Option<NodeId>>, PlacementError> {
    profile.validate()?;
    let need = profile.total();
    let have = layout.placement_index().candidates.len();
    if have < min_shards.min(need) {
        return Err(PlacementError::NotEnoughNodes {
            need: min_shards,
            have,
        });
    }
    let n = have.min(need);
    let slots: Vec<u8> = (0..n as u8).collect();
    let mut targets = place_slots(layout, stripe, &slots, &[], &[]);
    targets.resize(need, None);
    Ok(targets)
}

/// Targets for the `slots` of a stripe whose other shards are on `holders`: each slot's
/// contest among the eligible nodes that hold none of it and are not in `avoid`, the
/// holders' failure domains counted as already used. `None` for a slot no node can take.
pub fn place_repair(
    layout: &Layout,
    stripe: StripeId,
    slots: &[u8],
    holders: &[NodeId],
    avoid: &[NodeId],
) -> Vec<Option<NodeId>> {
    place_slots(layout, stripe, slots, holders, avoid)
}

/// The slot contests behind [`place`], [`place_degraded`] and [`place_repair`].
fn place_slots(
    layout: &Layout,
    stripe: StripeId,
    slots: &[u8],
    holders: &[NodeId],
    avoid: &[NodeId],
) -> Vec<Option<NodeId>> {
    let PlacementIndex {
        candidates,
        domain_count,
    } = layout.placement_index();
    let domain_count = *domain_count;
    let mut taken = vec![false; candidates.len()];
    let mut placed_in = vec![0usize; domain_count];
    let mut free_in = vec![0usize; domain_count];
    for c in candidates {
        free_in[c.domain] += 1;
    }
    for (i, c) in candidates.iter().enumerate() {
        if holders.contains(&c.id) {
            taken[i] = true;
            placed_in[c.domain] += 1;
            free_in[c.domain] -= 1;
        } else if avoid.contains(&c.id) {
            taken[i] = true;
            free_in[c.domain] -= 1;
        }
    }
    // Holders that are not eligible now (down, draining) still fill their domain.
    for h in holders {
        if candidates.iter().any(|c| c.id == *h) {
            continue;
        }
        let domain = layout
            .nodes()
            .iter()
            .find(|n| n.id == *h)
            .and_then(|n| {
                candidates
                    .iter()
                    .find(|c| layout_domain(layout, c.id) == Some(&n.failure_domain))
            })
            .map(|c| c.domain);
        if let Some(d) = domain {
            placed_in[d] += 1;
        }
    }
    let mut targets = Vec::with_capacity(slots.len());
    for &slot in slots {
        // Domains with a free node that hold the fewest shards so far are allowed.
        let level = (0..domain_count)
            .filter(|&d| free_in[d] > 0)
            .map(|d| placed_in[d])
            .min();
        let key = slot_key(stripe.0, slot);
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
        match best {
            Some((i, _)) => {
                taken[i] = true;
                placed_in[candidates[i].domain] += 1;
                free_in[candidates[i].domain] -= 1;
                targets.push(Some(candidates[i].id));
            }
            None => targets.push(None),
        }
    }
    targets
}

fn layout_domain(layout: &Layout, id: NodeId) -> Option<&crate::layout::FailureDomain> {
    layout
        .nodes()
        .iter()
        .find(|n| n.id == id)
        .map(|n| &n.failure_domain)
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
    fn a_degraded_placement_fills_data_slots_first_where_full_placement_would() {
        let five = layout(&[
            (1, "a", 1),
            (2, "b", 1),
            (3, "c", 1),
            (4, "d", 1),
            (5, "e", 1),
        ]);
        let six = layout(&[
            (1, "a", 1),
            (2, "b", 1),
            (3, "c", 1),
            (4, "d", 1),
            (5, "e", 1),
            (6, "f", 1),
        ]);
        let p = profile(4, 2);
        for stripe in 0..50u128 {
            let degraded = place_degraded(&five, StripeId(stripe), p, 5).expect("5 of 6");
            assert_eq!(degraded.len(), 6);
            assert_eq!(degraded[5], None, "the last parity slot waits for repair");
            let placed: Vec<NodeId> = degraded.iter().flatten().copied().collect();
            let mut distinct = placed.clone();
            distinct.sort();
            distinct.dedup();
            assert_eq!(distinct.len(), 5);
            // With every node up it is the full placement.
            let full = place(&six, StripeId(stripe), p).expect("six");
            let whole = place_degraded(&six, StripeId(stripe), p, 5).expect("six");
            assert_eq!(whole, full.iter().copied().map(Some).collect::<Vec<_>>());
        }
        assert_eq!(
            place_degraded(&five, StripeId(1), p, 6),
            Err(PlacementError::NotEnoughNodes { need: 6, have: 5 })
        );
    }

    #[test]
    fn repair_targets_avoid_the_holders_and_their_domains() {
        let l = layout(&[
            (1, "a", 1),
            (2, "b", 1),
            (3, "c", 1),
            (4, "a", 1),
            (5, "d", 1),
        ]);
        for stripe in 0..50u128 {
            let t = place_repair(&l, StripeId(stripe), &[2], &[NodeId(1), NodeId(2)], &[]);
            assert_eq!(t.len(), 1);
            let n = t[0].expect("a target");
            assert!(n == NodeId(3) || n == NodeId(5), "a new domain: {n}");
            let avoided = place_repair(
                &l,
                StripeId(stripe),
                &[2],
                &[NodeId(1), NodeId(2)],
                &[NodeId(3)],
            );
            assert_eq!(
                avoided,
                vec![Some(NodeId(5))],
                "a node to avoid is passed over"
            );
        }
        // No node left that holds nothing of the stripe.
        let holders: Vec<NodeId> = (1..=5).map(NodeId).collect();
        assert_eq!(
            place_repair(&l, StripeId(1), &[0], &holders, &[]),
            vec![None]
        );
        assert_eq!(
            place_repair(&l, StripeId(1), &[0], &holders[..4], &[NodeId(5)]),
            vec![None],
            "the only free node is one to avoid"
        );
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
