//! Property tests of `place`: determinism, spreading, balance by weight, movement on
//! join and leave; and of `place_moves`: never a worse spread, a newcomer's share with
//! fewer domains than k+m. Proptest prints a failing case and stores its seed under
//! `proptest-regressions/` so it replays on the next run.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use shoal_placement::{
    EcProfile, Layout, LayoutNode, NodeId, NodeState, PlacementError, Spread, StripeId, place,
    place_moves,
};

/// `count` well-spread stripe ids starting from `base`.
fn stripes(base: u128, count: usize) -> impl Iterator<Item = StripeId> {
    (0..count as u128).map(move |i| {
        StripeId(base.wrapping_add(i.wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835)))
    })
}

fn layout(nodes: Vec<LayoutNode>) -> Layout {
    Layout::new(1, nodes).unwrap_or_else(|e| panic!("{e}"))
}

fn targets(l: &Layout, s: StripeId, p: EcProfile) -> Vec<NodeId> {
    place(l, s, p).unwrap_or_else(|e| panic!("stripe {s}: {e}"))
}

/// Shards per node over the given stripes.
fn counts(l: &Layout, base: u128, n: usize, p: EcProfile) -> BTreeMap<NodeId, u64> {
    let mut c = BTreeMap::new();
    for s in stripes(base, n) {
        for t in targets(l, s, p) {
            *c.entry(t).or_insert(0) += 1;
        }
    }
    c
}

/// Checks `observed` against a share `p` of `total` within five standard deviations
/// (binomial), and returns the relative deviation.
fn within_five_sigma(what: &str, observed: u64, p: f64, total: u64) -> f64 {
    let expected = p * total as f64;
    let sigma = (expected * (1.0 - p)).sqrt();
    let dev = observed as f64 - expected;
    assert!(
        dev.abs() <= 5.0 * sigma,
        "{what}: {observed} shards, expected {expected:.0} ± {:.0} (5σ)",
        5.0 * sigma
    );
    dev / expected
}

fn arb_state() -> impl Strategy<Value = NodeState> {
    prop_oneof![
        6 => Just(NodeState::Active),
        1 => Just(NodeState::Draining),
        1 => Just(NodeState::Drained),
        1 => Just(NodeState::Down),
        1 => Just(NodeState::Out),
    ]
}

fn arb_weight() -> impl Strategy<Value = u64> {
    prop_oneof![1 => Just(0u64), 8 => 1u64..1000, 1 => any::<u64>()]
}

/// Up to 24 nodes with distinct ids, 1 to 8 domains, mixed states and weights.
fn arb_nodes() -> impl Strategy<Value = Vec<LayoutNode>> {
    proptest::collection::btree_map(any::<u64>(), (0u8..8, arb_weight(), arb_state()), 1..24)
        .prop_map(|m| {
            m.into_iter()
                .map(|(id, (d, weight, state))| LayoutNode {
                    id: NodeId(id),
                    failure_domain: format!("rack-{d}").as_str().into(),
                    weight,
                    state,
                })
                .collect()
        })
}

fn arb_profile() -> impl Strategy<Value = EcProfile> {
    (1u8..=8, 0u8..=4).prop_map(|(k, m)| EcProfile { k, m })
}

proptest! {
    #[test]
    fn placement_is_deterministic_and_ignores_node_order(
        nodes in arb_nodes().prop_shuffle(),
        stripe in any::<u128>(),
        profile in arb_profile(),
    ) {
        let a = layout(nodes.clone());
        let mut reversed = nodes;
        reversed.reverse();
        let b = layout(reversed);
        let first = place(&a, StripeId(stripe), profile);
        prop_assert_eq!(&first, &place(&a, StripeId(stripe), profile));
        prop_assert_eq!(&first, &place(&b, StripeId(stripe), profile));
    }

    #[test]
    fn targets_are_distinct_eligible_and_spread_over_domains(
        nodes in arb_nodes(),
        stripe in any::<u128>(),
        profile in arb_profile(),
    ) {
        let l = layout(nodes);
        let eligible: BTreeMap<NodeId, &str> =
            l.eligible_nodes().map(|n| (n.id, n.failure_domain.0.as_str())).collect();
        let mut eligible_per_domain: BTreeMap<&str, usize> = BTreeMap::new();
        for d in eligible.values() {
            *eligible_per_domain.entry(d).or_insert(0) += 1;
        }
        let need = profile.total();
        let t = match place(&l, StripeId(stripe), profile) {
            Err(e) => {
                prop_assert!(eligible.len() < need, "refused with {} eligible nodes: {e}", eligible.len());
                prop_assert_eq!(&e, &PlacementError::NotEnoughNodes { need, have: eligible.len() });
                let needs = format!("needs {need}");
                prop_assert!(e.to_string().contains(&needs), "{}", e);
                return Ok(());
            }
            Ok(t) => t,
        };
        prop_assert_eq!(t.len(), need);
        prop_assert_eq!(t.iter().collect::<BTreeSet<_>>().len(), need, "a node twice: {:?}", t);
        let mut per_domain: BTreeMap<&str, usize> = eligible_per_domain.keys().map(|d| (*d, 0)).collect();
        for n in &t {
            let d = eligible.get(n).ok_or_else(|| TestCaseError::fail(format!("{n} is not eligible")))?;
            *per_domain.entry(d).or_insert(0) += 1;
        }
        if eligible_per_domain.len() >= need {
            prop_assert!(per_domain.values().all(|&c| c <= 1), "two shards in one domain: {per_domain:?}");
        }
        // As even as the domains allow: a domain more than one shard behind another is full.
        for (a, &ca) in &per_domain {
            for (b, &cb) in &per_domain {
                prop_assert!(ca <= cb + 1 || cb == eligible_per_domain[b], "{a}: {ca}, {b}: {cb} of {}", eligible_per_domain[b]);
            }
        }
    }
}

/// `n` nodes, each in its own domain, with the given weights.
fn one_per_domain(weights: &[u64]) -> Vec<LayoutNode> {
    weights
        .iter()
        .enumerate()
        .map(|(i, &w)| LayoutNode::active(NodeId(0x1000 + i as u64), format!("d{i}").as_str(), w))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3, ..ProptestConfig::default() })]

    /// Each shard slot is its own weighted contest, so the first shard follows weight exactly.
    #[test]
    fn first_shard_follows_weight_with_one_node_per_domain(
        weights in proptest::collection::vec(50u64..=150, 10),
        base in any::<u128>(),
    ) {
        let l = layout(one_per_domain(&weights));
        let stripes_n = 40_000;
        let c = counts(&l, base, stripes_n, EcProfile { k: 1, m: 0 });
        let total_w: u64 = weights.iter().sum();
        for n in l.nodes() {
            within_five_sigma(&n.id.to_string(), c.get(&n.id).copied().unwrap_or(0), n.weight as f64 / total_w as f64, stripes_n as u64);
        }
    }

    /// With equal domain totals, every slot of 4+2 follows node weight.
    #[test]
    fn all_shards_follow_weight_with_equal_domains(
        split in proptest::collection::vec(30u64..=70, 6),
        base in any::<u128>(),
    ) {
        let nodes: Vec<LayoutNode> = split.iter().enumerate().flat_map(|(d, &w)| {
            let domain = format!("rack-{d}");
            [LayoutNode::active(NodeId(2 * d as u64 + 1), domain.as_str(), w),
             LayoutNode::active(NodeId(2 * d as u64 + 2), domain.as_str(), 100 - w)]
        }).collect();
        let l = layout(nodes);
        let profile = EcProfile { k: 4, m: 2 };
        let stripes_n = 20_000;
        let c = counts(&l, base, stripes_n, profile);
        let total = (stripes_n * profile.total()) as u64;
        for n in l.nodes() {
            within_five_sigma(&n.id.to_string(), c.get(&n.id).copied().unwrap_or(0), n.weight as f64 / 600.0, total);
        }
    }

    /// A node takes at most one shard per stripe, so over all k+m slots the shares of
    /// unequal nodes are pulled toward equal: each lies between its weight share and 1/N.
    #[test]
    fn all_shards_lie_between_weight_share_and_equal_share(
        weights in proptest::collection::vec(50u64..=150, 10),
        base in any::<u128>(),
    ) {
        let l = layout(one_per_domain(&weights));
        let profile = EcProfile { k: 2, m: 1 };
        let stripes_n = 20_000;
        let c = counts(&l, base, stripes_n, profile);
        let total = (stripes_n * profile.total()) as u64;
        let total_w: u64 = weights.iter().sum();
        for n in l.nodes() {
            let by_weight = n.weight as f64 / total_w as f64;
            let equal = 1.0 / weights.len() as f64;
            let share = c.get(&n.id).copied().unwrap_or(0) as f64 / total as f64;
            let slack = 5.0 * (share * (1.0 - share) / total as f64).sqrt();
            prop_assert!(share >= by_weight.min(equal) - slack && share <= by_weight.max(equal) + slack,
                "{}: share {share:.4}, by weight {by_weight:.4}, equal {equal:.4}", n.id);
        }
    }
}

/// Over `count` stripes: shard slots whose target differs between the two layouts,
/// and the shards `node` holds under `before` and under `after`.
fn movement(
    before: &Layout,
    after: &Layout,
    node: NodeId,
    base: u128,
    count: usize,
    p: EcProfile,
) -> (u64, u64, u64) {
    let (mut moved, mut held_before, mut held_after) = (0, 0, 0);
    for s in stripes(base, count) {
        let (a, b) = (targets(before, s, p), targets(after, s, p));
        moved += a.iter().zip(&b).filter(|(x, y)| x != y).count() as u64;
        held_before += a.iter().filter(|&&x| x == node).count() as u64;
        held_after += b.iter().filter(|&&x| x == node).count() as u64;
    }
    (moved, held_before, held_after)
}

const MOVE_STRIPES: usize = 5_000;

proptest! {
    #![proptest_config(ProptestConfig { cases: 4, ..ProptestConfig::default() })]

    /// One equal node joining N moves about 1/(N+1) of all shard slots.
    #[test]
    fn join_moves_about_one_over_n_plus_one(n in 8usize..=14, base in any::<u128>()) {
        let profile = EcProfile { k: 4, m: 2 };
        let before = layout(one_per_domain(&vec![100; n]));
        let after = layout(one_per_domain(&vec![100; n + 1]));
        let (moved, _, _) = movement(&before, &after, NodeId(0), base, MOVE_STRIPES, profile);
        let moved = moved as f64 / (MOVE_STRIPES * 6) as f64;
        let ideal = 1.0 / (n + 1) as f64;
        prop_assert!(moved <= 2.5 * ideal && moved >= 0.5 * ideal, "moved {moved:.4} of slots, ideal {ideal:.4}");
    }

    /// A node of any weight joining (its own domain or an existing one, while there are
    /// at least k+m domains) moves little beyond the slots it takes.
    #[test]
    fn join_moves_little_beyond_the_newcomers_slots(
        weights in proptest::collection::vec(50u64..=150, 8..=12),
        new_weight in 50u64..=150,
        new_domain in proptest::option::of(0usize..8),
        base in any::<u128>(),
    ) {
        let profile = EcProfile { k: 4, m: 2 };
        let before = one_per_domain(&weights);
        let domain = new_domain.map_or_else(|| "new".to_owned(), |d| format!("d{d}"));
        let mut after = before.clone();
        after.push(LayoutNode::active(NodeId(0xfff), domain.as_str(), new_weight));
        let (before, after) = (layout(before), layout(after));
        let (moved, _, taken) = movement(&before, &after, NodeId(0xfff), base, MOVE_STRIPES, profile);
        prop_assert!(moved >= taken && (moved as f64) <= 2.5 * taken as f64,
            "moved {moved} slots, the newcomer took {taken}");
    }

    /// A node leaving (or going down) moves its own shards and a bounded number of others.
    #[test]
    fn leave_moves_the_leavers_shards_and_a_bounded_rest(
        weights in proptest::collection::vec(50u64..=150, 8..=12),
        leaver in any::<prop::sample::Index>(),
        base in any::<u128>(),
    ) {
        let profile = EcProfile { k: 4, m: 2 };
        let before = one_per_domain(&weights);
        let mut after = before.clone();
        let gone = leaver.index(after.len());
        after[gone].state = NodeState::Down;
        let gone = after[gone].id;
        let (before, after) = (layout(before), layout(after));
        let (moved, held, _) = movement(&before, &after, gone, base, MOVE_STRIPES, profile);
        prop_assert!(moved >= held && (moved as f64) <= 2.5 * held as f64, "moved {moved} slots, the leaver held {held}");
    }
}

proptest! {
    /// Whatever changed in the layout (nodes joined, one went down), the moves toward the
    /// new placement keep the stripe's spread after every one of them, go only from nodes
    /// placement no longer wants to nodes it wants that held nothing of the stripe, move
    /// each slot at most once, skip what `may_take` refuses, and are deterministic.
    #[test]
    fn moves_toward_placement_never_spread_a_stripe_worse(
        nodes in arb_nodes(),
        joining in proptest::collection::vec((0u8..8, 1u64..1000), 0..4),
        down in proptest::option::of(any::<prop::sample::Index>()),
        refused in proptest::option::of(any::<prop::sample::Index>()),
        stripe in any::<u128>(),
        profile in arb_profile(),
    ) {
        let before = layout(nodes.clone());
        let Ok(holders) = place(&before, StripeId(stripe), profile) else {
            return Ok(());
        };
        let mut after_nodes = nodes;
        for (i, (d, weight)) in joining.into_iter().enumerate() {
            let id = NodeId(u64::MAX - i as u64);
            if after_nodes.iter().all(|n| n.id != id) {
                after_nodes.push(LayoutNode::active(id, format!("rack-{d}").as_str(), weight));
            }
        }
        if let Some(i) = down {
            let i = i.index(after_nodes.len());
            after_nodes[i].state = NodeState::Down;
        }
        let after = layout(after_nodes);
        let refused = refused.map(|i| after.nodes()[i.index(after.nodes().len())].id);
        let may_take = |_: u8, to: NodeId| Some(to) != refused;
        let moves = place_moves(&after, StripeId(stripe), profile, &holders, may_take);
        prop_assert_eq!(&moves, &place_moves(&after, StripeId(stripe), profile, &holders, may_take));
        if moves.is_empty() {
            return Ok(());
        }
        let ideal = place(&after, StripeId(stripe), profile)
            .map_err(|e| TestCaseError::fail(format!("moves without a placement: {e}")))?;
        let spread = Spread::of(&after, holders.iter().copied());
        let mut now = holders.clone();
        let mut slots = BTreeSet::new();
        for m in &moves {
            let slot = usize::from(m.slot);
            prop_assert!(slots.insert(m.slot), "slot {} twice: {:?}", m.slot, moves);
            prop_assert!(Some(m.to) != refused);
            prop_assert!(ideal.contains(&m.to) && !holders.contains(&m.to), "{:?}", m);
            prop_assert!(!ideal.contains(&holders[slot]), "moved off a wanted node: {:?}", m);
            now[slot] = m.to;
            let then = Spread::of(&after, now.iter().copied());
            prop_assert!(then.keeps(&spread), "{:?} -> {:?} after {:?}", spread, then, m);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// With fewer failure domains than k+m, each holding the same number of shards of
    /// every stripe, a node that joins one of them receives a shard of every stripe
    /// placement now gives it, each from a node of its own domain.
    #[test]
    fn a_newcomer_beside_fewer_domains_than_shards_gets_what_placement_gives_it(
        domains in 2u64..=4,
        per_domain in 2u64..=4,
        rounds in 2u64..=4,
        m in 1u8..=4,
        weights in proptest::collection::vec(50u64..=150, 16),
        joins in any::<prop::sample::Index>(),
        new_weight in 50u64..=150,
        base in any::<u128>(),
    ) {
        let rounds = rounds.min(per_domain);
        let total = (domains * rounds) as u8;
        prop_assume!(m < total);
        let profile = EcProfile { k: total - m, m };
        let domain_of = |id: u64| format!("rack-{}", id % domains);
        let nodes: Vec<LayoutNode> = (0..domains * per_domain)
            .map(|id| LayoutNode::active(NodeId(id), domain_of(id).as_str(), weights[id as usize]))
            .collect();
        let newcomer = NodeId(100);
        let domain = joins.index(domains as usize) as u64;
        let mut after = nodes.clone();
        after.push(LayoutNode::active(newcomer, domain_of(domain).as_str(), new_weight));
        let (before, after) = (layout(nodes), layout(after));
        let (mut took, mut wanted) = (0, 0);
        for s in stripes(base, 200) {
            let holders = targets(&before, s, profile);
            let moves = place_moves(&after, s, profile, &holders, |_, _| true);
            let gets = targets(&after, s, profile).contains(&newcomer);
            wanted += u64::from(gets);
            for mv in &moves {
                let from = holders[usize::from(mv.slot)];
                let same = domain_of(from.0) == after.node(mv.to).map(|n| n.failure_domain.0.clone()).unwrap_or_default();
                prop_assert!(same, "stripe {}: {:?} from {} leaves its domain", s, mv, from);
            }
            took += moves.iter().filter(|mv| mv.to == newcomer).count() as u64;
        }
        prop_assert_eq!(took, wanted);
    }
}
