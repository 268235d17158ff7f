//! The redundancy judgement (pure), shared by repair, drain, ok-to-stop and status: how
//! each stripe stands, what the cluster's redundancy is, what a drain or a stop would
//! weaken, and which shards to rebuild in which order, from which sources, onto which
//! targets.
//!
//! A slot is *available* when the node it names is in the layout, not `out`, and alive;
//! *waiting* when that node is down but not yet `out` (it may come back with its shards:
//! nothing is rebuilt for it); *lost* when it names no node ([`NodeId::NONE`]: written
//! degraded, or given up as corrupt) or a node that is `out` or gone from the layout. Lost
//! slots are rebuilt, the stripes with the fewest available shards first.
//!
//! A healthy stripe whose shards are not where placement would put them now (a node
//! joined since it was written, or it was written or repaired around a node) is
//! *misplaced*: a shard on a node placement no longer wants for it is copied to a node
//! placement wants that holds nothing of it, after every rebuild and move, on the
//! rebalance budget — only where the stripe keeps its spread (as many failure domains,
//! no more shards in one: [`Spread`]), so with fewer domains than k+m a shard still
//! moves to a newcomer of its own domain.
//!
//! A slot on a node being drained (`draining`, or `drained` and named by a stripe
//! committed late) that is alive is *moving*: available (it is read like any other) and
//! copied to a new target as it is, no decode needed. Moves come after every rebuild,
//! and only where they keep the stripe's spread: otherwise the shard stays (the drain
//! assessment refuses such a drain up front).
//!
//! Rebalance moves a shard only onto a node holding clearly fewer shards than its weight's
//! share ([`below_share`]: under 90% of it minus one shard, by the last pass's count), so
//! a joining node takes about its share of slots; an undrained node is a target again, and
//! some of its old shards may move back. Cost: while some node is below its share, one
//! placement per healthy stripe per pass on every node; none otherwise. Status shows
//! `rebalance_stripes`/`rebalance_bytes` left and `rebalanced_bytes` done.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use shoal_agent_api::StripeRecord;
use shoal_placement::{Layout, NodeId, NodeState, Spread, StripeId, place_moves, place_repair};

use crate::data::Rebuild;

/// How one slot of a stripe stands (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    Available,
    /// Available, and to be copied off its node (a drain).
    Moving,
    Waiting,
    Lost,
}

/// The state of `node`'s slot under the committed layout and gossip's live set.
pub fn slot(node: NodeId, layout: &Layout, alive: &BTreeSet<NodeId>) -> Slot {
    if node.is_none() {
        return Slot::Lost;
    }
    match layout.node(node) {
        None => Slot::Lost,
        Some(n) if n.state == NodeState::Out => Slot::Lost,
        Some(_) if !alive.contains(&node) => Slot::Waiting,
        Some(n) if matches!(n.state, NodeState::Draining | NodeState::Drained) => Slot::Moving,
        Some(_) => Slot::Available,
    }
}

/// How one stripe stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Health {
    /// Readable now (moving ones included).
    pub available: Vec<u8>,
    /// Available, to be copied off a node being drained.
    pub moving: Vec<u8>,
    pub waiting: Vec<u8>,
    pub lost: Vec<u8>,
}

impl Health {
    pub fn of(record: &StripeRecord, layout: &Layout, alive: &BTreeSet<NodeId>) -> Health {
        let mut h = Health {
            available: Vec::new(),
            moving: Vec::new(),
            waiting: Vec::new(),
            lost: Vec::new(),
        };
        for s in &record.shards {
            match slot(s.node, layout, alive) {
                Slot::Available => h.available.push(s.index),
                Slot::Moving => {
                    h.available.push(s.index);
                    h.moving.push(s.index);
                }
                Slot::Waiting => h.waiting.push(s.index),
                Slot::Lost => h.lost.push(s.index),
            }
        }
        h
    }

    /// Shards not available now.
    pub fn missing(&self) -> usize {
        self.waiting.len() + self.lost.len()
    }

    /// Whether the stripe has anything for the planner: shards to rebuild or to move.
    pub fn has_work(&self) -> bool {
        !self.lost.is_empty() || !self.moving.is_empty()
    }
}

/// The cluster's redundancy: stripes and bytes by how many shards they miss.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    pub stripes: u64,
    pub healthy: u64,
    /// Missing shards → (stripes, bytes of data in them), for stripes still readable.
    pub by_missing: BTreeMap<usize, (u64, u64)>,
    /// Stripes with fewer than k shards available.
    pub unreadable: u64,
    /// Bytes of lost shards to rebuild now.
    pub bytes_to_repair: u64,
    /// Bytes of shards on nodes that are down but not `out` (rebuilt if they become so).
    pub bytes_waiting: u64,
    /// Per node being drained: stripes and bytes of shards still on it (moving, or
    /// waiting while it is down).
    pub on_draining: BTreeMap<NodeId, (u64, u64)>,
    /// Healthy stripes with misplaced slots, and the bytes of those shards.
    pub misplaced_stripes: u64,
    pub misplaced_bytes: u64,
    /// Shards per node (every slot that names one).
    pub shards_per_node: BTreeMap<NodeId, u64>,
}

impl Summary {
    pub fn add(&mut self, record: &StripeRecord, h: &Health) {
        self.stripes += 1;
        for s in record.shards.iter().filter(|s| !s.node.is_none()) {
            *self.shards_per_node.entry(s.node).or_default() += 1;
        }
        let missing = h.missing();
        if h.available.len() < usize::from(record.ec.k) {
            self.unreadable += 1;
        } else if missing == 0 {
            self.healthy += 1;
        } else {
            let e = self.by_missing.entry(missing).or_default();
            e.0 += 1;
            e.1 += record.len;
        }
        self.bytes_to_repair += h.lost.len() as u64 * record.shard_len;
        self.bytes_waiting += h.waiting.len() as u64 * record.shard_len;
    }

    /// Counts a healthy stripe's misplaced slots (from [`misplaced`]).
    pub fn add_misplaced(&mut self, record: &StripeRecord, moves: &[Rebuild]) {
        if !moves.is_empty() {
            self.misplaced_stripes += 1;
            self.misplaced_bytes += moves.len() as u64 * record.shard_len;
        }
    }

    /// Counts `record`'s shards on nodes being drained (`draining` lists them).
    pub fn add_draining(&mut self, record: &StripeRecord, draining: &BTreeSet<NodeId>) {
        for s in record.shards.iter().filter(|s| draining.contains(&s.node)) {
            let e = self.on_draining.entry(s.node).or_default();
            e.0 += 1;
            e.1 += record.shard_len;
        }
    }

    /// Stripes missing one shard or more but readable.
    pub fn degraded(&self) -> u64 {
        self.by_missing.values().map(|(n, _)| n).sum()
    }
}

/// One stripe's repair: which shards to rebuild where, which slots not to read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Task {
    pub record: StripeRecord,
    pub rebuilds: Vec<Rebuild>,
    /// Shards copied as they are from a node being drained to their new node.
    pub copies: Vec<Rebuild>,
    /// Slots not to read from: lost, waiting, or being rebuilt.
    pub skip: Vec<u8>,
    /// The k available slots to read, data shards first (more are tried if one fails).
    pub sources: Vec<u8>,
    /// At most one spare shard left: repair goes on even when the budget is spent.
    pub urgent: bool,
    /// Copies misplaced shards (see [`Reason::Rebalance`]).
    pub rebalance: bool,
    /// Bytes moved: k shards read and the rebuilt ones written, each copy read and
    /// written.
    pub bytes: u64,
}

/// Why a task moves shards: it draws on that budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Rebuilds lost shards (and moves off draining nodes on the way).
    Repair,
    /// Only copies off draining nodes.
    Drain,
    /// Only copies of misplaced shards to their placement target.
    Rebalance,
}

impl Task {
    pub fn reason(&self) -> Reason {
        if !self.rebuilds.is_empty() {
            Reason::Repair
        } else if self.rebalance {
            Reason::Rebalance
        } else {
            Reason::Drain
        }
    }
}

/// Where placement puts shards for rebalancing: the committed layout with the nodes
/// gossip does not see alive taken out. Not the writers' view, which also leaves out nodes
/// for seconds after a failed write or a "full" answer: shards must not move away from a
/// node for a moment's hiccup (room is checked per target instead).
pub fn rebalance_layout(layout: &Layout, alive: &BTreeSet<NodeId>) -> Layout {
    let nodes = layout
        .nodes()
        .iter()
        .map(|n| {
            let mut n = n.clone();
            if n.state == NodeState::Active && !alive.contains(&n.id) {
                n.state = NodeState::Down;
            }
            n
        })
        .collect();
    Layout::new(layout.epoch(), nodes).unwrap_or_else(|_| layout.clone())
}

/// The slots of a healthy stripe (every slot available, none moving) to move toward where
/// placement puts it now, each with its target, that `may_take` allows (see the module
/// doc; [`place_moves`] chooses them), in the order to make them.
pub fn misplaced(
    record: &StripeRecord,
    placement: &Layout,
    may_take: impl FnMut(u8, NodeId) -> bool,
) -> Vec<Rebuild> {
    // A stripe with a shard on a node in maintenance (or otherwise not active) stays as
    // it is: that node keeps its shards.
    let all_active = record.shards.iter().all(|s| {
        placement
            .node(s.node)
            .is_some_and(|n| n.state == NodeState::Active)
    });
    let in_order = record
        .shards
        .iter()
        .enumerate()
        .all(|(i, s)| usize::from(s.index) == i);
    if !all_active || !in_order {
        return Vec::new();
    }
    let holders: Vec<NodeId> = record.shards.iter().map(|s| s.node).collect();
    place_moves(placement, record.id, record.ec, &holders, may_take)
        .into_iter()
        .map(|m| Rebuild {
            index: m.slot,
            from: holders[usize::from(m.slot)],
            to: m.to,
        })
        .collect()
}

/// Whether node `to` holds clearly fewer shards than its weight's share of all shards
/// (`counts`, from the last pass) among the eligible nodes of `placement`: below 90% of
/// it by more than one shard. Rebalance moves shards only onto such nodes (a node that
/// joined), so a stripe a repair placed a little off its ideal slots is not moved again.
pub fn below_share(counts: &BTreeMap<NodeId, u64>, placement: &Layout, to: NodeId) -> bool {
    let eligible: Vec<_> = placement
        .nodes()
        .iter()
        .filter(|n| n.is_eligible())
        .collect();
    let weights: u64 = eligible.iter().map(|n| n.weight).sum();
    let Some(target) = eligible.iter().find(|n| n.id == to) else {
        return false;
    };
    if weights == 0 {
        return false;
    }
    let total: u64 = eligible
        .iter()
        .map(|n| counts.get(&n.id).copied().unwrap_or(0))
        .sum();
    let share = total as f64 * target.weight as f64 / weights as f64;
    (counts.get(&to).copied().unwrap_or(0) as f64) < share * 0.9 - 1.0
}

/// Plans copies of misplaced shards (`stripes`: each with its moves from [`misplaced`]),
/// in stripe order, onto targets with room (each copy uses some). A stripe's moves are
/// taken in their order up to the first without room: only such a prefix is sure to keep
/// the stripe's spread.
pub fn plan_rebalance(stripes: &[(StripeRecord, Vec<Rebuild>)], room: &mut Room) -> Vec<Task> {
    let mut tasks = Vec::new();
    for (record, moves) in stripes {
        let copies: Vec<Rebuild> = moves
            .iter()
            .take_while(|m| {
                let fits = room.get(&m.to).is_none_or(|r| *r >= record.shard_len);
                if fits && let Some(r) = room.get_mut(&m.to) {
                    *r -= record.shard_len;
                }
                fits
            })
            .copied()
            .collect();
        if copies.is_empty() {
            continue;
        }
        tasks.push(Task {
            record: record.clone(),
            rebuilds: Vec::new(),
            bytes: 2 * record.shard_len * copies.len() as u64,
            copies,
            skip: Vec::new(),
            sources: Vec::new(),
            urgent: false,
            rebalance: true,
        });
    }
    tasks
}

/// What the planner made of a list of stripes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// In the order to run them: fewest available shards first.
    pub tasks: Vec<Task>,
    /// Stripes with lost slots that no node can take now (every other node holds a shard
    /// of the stripe, is down, full or fenced), with those slots.
    pub no_target: Vec<(StripeId, Vec<u8>)>,
    /// Stripes with lost slots but fewer than k available shards.
    pub unreadable: Vec<StripeId>,
    /// Stripes whose shards on draining nodes stay where they are: every target left
    /// would spread the stripe worse than it is now.
    pub weakened: Vec<Weakened>,
}

/// A stripe that copies off a draining node would leave less well spread than it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Weakened {
    pub stripe: StripeId,
    /// The slots that would move.
    pub slots: Vec<u8>,
    /// Its spread now (rebuilt shards included), and after the copies.
    pub now: Spread,
    pub then: Spread,
}

/// Whether `copies` (off draining nodes) would leave `record` less well spread than it
/// is once `rebuilds` are done; a rebuild only adds a shard, so it goes wherever there
/// is room, but a copy must keep the spread (shards, failure domains, the most in one).
fn weakened_by(
    record: &StripeRecord,
    h: &Health,
    placement: &Layout,
    rebuilds: &[Rebuild],
    copies: &[Rebuild],
) -> Option<Weakened> {
    if copies.is_empty() {
        return None;
    }
    let kept = record.shards.iter().filter(|s| !h.lost.contains(&s.index));
    let rebuilt = rebuilds.iter().map(|r| r.to);
    let now = Spread::of(
        placement,
        kept.clone().map(|s| s.node).chain(rebuilt.clone()),
    );
    let moved = kept.map(|s| {
        copies
            .iter()
            .find(|c| c.index == s.index)
            .map_or(s.node, |c| c.to)
    });
    let then = Spread::of(placement, moved.chain(rebuilt));
    (!then.keeps(&now)).then(|| Weakened {
        stripe: record.id,
        slots: copies.iter().map(|c| c.index).collect(),
        now,
        then,
    })
}

/// Where each node stands for new shards: room left (bytes) per eligible node.
pub type Room = HashMap<NodeId, u64>;

/// Plans the repair of `stripes` (each with its health): targets from `placement` (the
/// layout with only the nodes that take shards now eligible), never one in `room`
/// without space for the shard (each assignment uses some), never a node fenced for a
/// slot being placed (`fenced`: per stripe, the slot and node of each copy disowned at
/// or after the clock the plan says it was made at; the metadata refuses to move that
/// slot to that node, and only that slot).
pub fn plan(
    stripes: &[(StripeRecord, Health)],
    placement: &Layout,
    room: &mut Room,
    fenced: &HashMap<StripeId, Vec<(u8, NodeId)>>,
) -> Plan {
    let mut order: Vec<&(StripeRecord, Health)> =
        stripes.iter().filter(|(_, h)| h.has_work()).collect();
    order.sort_by_key(|(r, h)| (h.lost.is_empty(), h.available.len(), r.id));
    let mut out = Plan::default();
    for (record, h) in order {
        let k = usize::from(record.ec.k);
        if h.available.len() < k {
            if !h.lost.is_empty() {
                out.unreadable.push(record.id);
            }
            continue;
        }
        let placing: Vec<u8> = h.lost.iter().chain(&h.moving).copied().collect();
        let holders: Vec<NodeId> = record
            .shards
            .iter()
            .filter(|s| !placing.contains(&s.index))
            .map(|s| s.node)
            .collect();
        let mut avoid: Vec<NodeId> = fenced
            .get(&record.id)
            .into_iter()
            .flatten()
            .filter(|(slot, _)| placing.contains(slot))
            .map(|(_, node)| *node)
            .collect();
        avoid.extend(
            room.iter()
                .filter(|(_, r)| **r < record.shard_len)
                .map(|(n, _)| *n),
        );
        let targets = place_repair(placement, record.id, &placing, &holders, &avoid);
        let (mut rebuilds, mut copies) = (Vec::new(), Vec::new());
        let mut stuck = Vec::new();
        for (&index, target) in placing.iter().zip(targets) {
            match target {
                Some(to) if room.get(&to).is_none_or(|r| *r >= record.shard_len) => {
                    if let Some(r) = room.get_mut(&to) {
                        *r -= record.shard_len;
                    }
                    let step = Rebuild {
                        index,
                        from: record.shards[usize::from(index)].node,
                        to,
                    };
                    if h.moving.contains(&index) {
                        copies.push(step);
                    } else {
                        rebuilds.push(step);
                    }
                }
                _ => stuck.push(index),
            }
        }
        if !stuck.is_empty() {
            out.no_target.push((record.id, stuck));
        }
        if let Some(w) = weakened_by(record, h, placement, &rebuilds, &copies) {
            // The shards stay on the draining node: give back the room they took.
            for c in copies.drain(..) {
                if let Some(r) = room.get_mut(&c.to) {
                    *r += record.shard_len;
                }
            }
            out.weakened.push(w);
        }
        if rebuilds.is_empty() && copies.is_empty() {
            continue;
        }
        // Decode from shards that stay where they are, data shards first.
        let mut sources = h.available.clone();
        sources.sort_by_key(|i| (h.moving.contains(i), *i >= record.ec.k, *i));
        sources.truncate(k);
        let mut skip: Vec<u8> = h.lost.iter().chain(&h.waiting).copied().collect();
        skip.sort_unstable();
        let reads = if rebuilds.is_empty() { 0 } else { k };
        let bytes = record.shard_len * (reads + rebuilds.len() + 2 * copies.len()) as u64;
        out.tasks.push(Task {
            record: record.clone(),
            urgent: !rebuilds.is_empty() && h.available.len() <= k + 1,
            rebalance: false,
            rebuilds,
            copies,
            skip,
            sources,
            bytes,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use shoal_agent_api::ShardLocation;
    use shoal_placement::{EcProfile, LayoutNode, place};

    use super::*;

    fn layout(states: &[(u64, NodeState)]) -> Layout {
        let nodes = states
            .iter()
            .map(|&(id, state)| LayoutNode {
                state,
                ..LayoutNode::active(NodeId(id), format!("fd{id}").as_str(), 1)
            })
            .collect();
        Layout::new(1, nodes).expect("layout")
    }

    fn active(ids: std::ops::RangeInclusive<u64>) -> Layout {
        layout(&ids.map(|i| (i, NodeState::Active)).collect::<Vec<_>>())
    }

    /// A 2+1 stripe `id` of 100 bytes with shards on `nodes` (0 = missing).
    fn stripe(id: u128, nodes: [u64; 3]) -> StripeRecord {
        StripeRecord {
            id: StripeId(id),
            len: 100,
            ec: EcProfile { k: 2, m: 1 },
            shard_len: 50,
            epoch: 1,
            shards: nodes
                .iter()
                .enumerate()
                .map(|(i, &n)| ShardLocation {
                    index: i as u8,
                    node: NodeId(n),
                    crc32c: 0,
                })
                .collect(),
        }
    }

    /// A 4+2 stripe `id` of 100 bytes with shards on `nodes` (0 = missing).
    fn wide(id: u128, nodes: [u64; 6]) -> StripeRecord {
        StripeRecord {
            ec: EcProfile { k: 4, m: 2 },
            shard_len: 25,
            shards: nodes
                .iter()
                .enumerate()
                .map(|(i, &n)| ShardLocation {
                    index: i as u8,
                    node: NodeId(n),
                    crc32c: 0,
                })
                .collect(),
            ..stripe(id, [0; 3])
        }
    }

    /// Any target may take a move.
    fn any(_: u8, _: NodeId) -> bool {
        true
    }

    /// Nodes `1..=n` in three failure domains, node `i` in `fd((i-1) % 3 + 1)` as
    /// `dev-cluster` spreads them; `states` overrides some nodes' states.
    fn three_domains(n: u64, states: &[(u64, NodeState)]) -> Layout {
        let nodes = (1..=n)
            .map(|i| LayoutNode {
                state: states
                    .iter()
                    .find(|(id, _)| *id == i)
                    .map_or(NodeState::Active, |(_, s)| *s),
                ..LayoutNode::active(NodeId(i), format!("fd{}", (i - 1) % 3 + 1).as_str(), 1)
            })
            .collect();
        Layout::new(1, nodes).expect("layout")
    }

    /// A 4+2 stripe where `layout` places it.
    fn placed(id: u128, layout: &Layout) -> StripeRecord {
        let on = place(layout, StripeId(id), EcProfile { k: 4, m: 2 }).expect("place");
        wide(id, [on[0].0, on[1].0, on[2].0, on[3].0, on[4].0, on[5].0])
    }

    fn alive(ids: &[u64]) -> BTreeSet<NodeId> {
        ids.iter().map(|&i| NodeId(i)).collect()
    }

    fn assessed(records: &[StripeRecord], l: &Layout, up: &[u64]) -> Vec<(StripeRecord, Health)> {
        records
            .iter()
            .map(|r| (r.clone(), Health::of(r, l, &alive(up))))
            .collect()
    }

    #[test]
    fn a_down_node_waits_an_out_node_or_no_node_is_lost() {
        let l = layout(&[
            (1, NodeState::Active),
            (2, NodeState::Down),
            (3, NodeState::Out),
        ]);
        let up = alive(&[1]);
        assert_eq!(slot(NodeId(1), &l, &up), Slot::Available);
        assert_eq!(slot(NodeId(2), &l, &up), Slot::Waiting);
        assert_eq!(slot(NodeId(3), &l, &up), Slot::Lost);
        assert_eq!(slot(NodeId::NONE, &l, &up), Slot::Lost);
        assert_eq!(slot(NodeId(9), &l, &up), Slot::Lost, "gone from the layout");
        // Active in the layout but not alive: down for now, not lost.
        assert_eq!(slot(NodeId(1), &l, &alive(&[])), Slot::Waiting);
    }

    #[test]
    fn the_summary_counts_stripes_by_missing_shards_and_bytes_to_repair() {
        let l = layout(&[
            (1, NodeState::Active),
            (2, NodeState::Active),
            (3, NodeState::Active),
            (4, NodeState::Down),
            (5, NodeState::Out),
        ]);
        let records = [
            stripe(1, [1, 2, 3]),
            stripe(2, [1, 2, 4]),
            stripe(3, [1, 2, 0]),
            stripe(4, [1, 4, 5]),
        ];
        let mut s = Summary::default();
        for (r, h) in assessed(&records, &l, &[1, 2, 3]) {
            s.add(&r, &h);
        }
        assert_eq!((s.stripes, s.healthy, s.unreadable), (4, 1, 1));
        assert_eq!(s.by_missing, BTreeMap::from([(1, (2, 200))]));
        assert_eq!(s.degraded(), 2);
        assert_eq!(
            s.bytes_to_repair,
            2 * 50,
            "stripe 3's missing one, stripe 4's out one"
        );
        assert_eq!(s.bytes_waiting, 2 * 50);
    }

    #[test]
    fn the_most_endangered_stripes_go_first_from_k_sources_to_new_domains() {
        // 4+2 on 8 nodes; node 8 is out. Stripe 5 lost two shards (one to node 8, one
        // never written), stripe 9 one.
        let mut l: Vec<(u64, NodeState)> = (1..=7).map(|i| (i, NodeState::Active)).collect();
        l.push((8, NodeState::Out));
        let l = layout(&l);
        let records = [wide(9, [8, 1, 2, 3, 4, 5]), wide(5, [1, 2, 3, 8, 4, 0])];
        let placement = active(1..=7);
        let p = plan(
            &assessed(&records, &l, &[1, 2, 3, 4, 5, 6, 7]),
            &placement,
            &mut Room::new(),
            &HashMap::new(),
        );
        let order: Vec<StripeId> = p.tasks.iter().map(|t| t.record.id).collect();
        assert_eq!(order, [StripeId(5), StripeId(9)]);
        let first = &p.tasks[0];
        assert_eq!(first.sources, [0, 1, 2, 4], "k available slots, data first");
        assert_eq!(first.skip, [3, 5]);
        assert!(first.urgent, "4 left of 4+2");
        let targets: BTreeSet<NodeId> = first.rebuilds.iter().map(|r| r.to).collect();
        assert_eq!(
            targets,
            alive(&[6, 7]),
            "the two nodes holding nothing of it"
        );
        assert_eq!(
            first
                .rebuilds
                .iter()
                .map(|r| (r.index, r.from))
                .collect::<Vec<_>>(),
            [(3, NodeId(8)), (5, NodeId::NONE)]
        );
        assert_eq!(first.bytes, 25 * 6);
        assert!(p.tasks[1].urgent, "5 left of 4+2: its last spare");
        assert!(p.no_target.is_empty() && p.unreadable.is_empty());
    }

    #[test]
    fn no_target_domain_left_is_reported_not_forced() {
        // 2+1 on three nodes, node 3 out: no node holds nothing of the stripe.
        let l = layout(&[
            (1, NodeState::Active),
            (2, NodeState::Active),
            (3, NodeState::Out),
        ]);
        let p = plan(
            &assessed(&[stripe(1, [1, 2, 3])], &l, &[1, 2]),
            &active(1..=2),
            &mut Room::new(),
            &HashMap::new(),
        );
        assert!(p.tasks.is_empty());
        assert_eq!(p.no_target, [(StripeId(1), vec![2])]);
    }

    #[test]
    fn two_stripes_compete_for_the_last_free_node() {
        // Node 4 is the only one that holds neither stripe, and has room for one shard.
        let l = active(1..=4);
        let records = [stripe(1, [1, 2, 0]), stripe(2, [0, 1, 3])];
        let room = Room::from([
            (NodeId(1), 0),
            (NodeId(2), 0),
            (NodeId(3), 0),
            (NodeId(4), 60),
        ]);
        let p = plan(
            &assessed(&records, &l, &[1, 2, 3, 4]),
            &l,
            &mut room.clone(),
            &HashMap::new(),
        );
        assert_eq!(p.tasks.len(), 1, "{p:?}");
        assert_eq!(
            p.tasks[0].record.id,
            StripeId(1),
            "same health: lower id first"
        );
        assert_eq!(p.tasks[0].rebuilds[0].to, NodeId(4));
        assert_eq!(p.no_target, [(StripeId(2), vec![0])]);
    }

    #[test]
    fn a_fenced_node_is_never_a_target_for_that_slot() {
        let l = active(1..=4);
        let records = [stripe(1, [1, 2, 0])];
        let fenced = HashMap::from([(StripeId(1), vec![(2, NodeId(3))])]);
        let p = plan(
            &assessed(&records, &l, &[1, 2, 3, 4]),
            &l,
            &mut Room::new(),
            &fenced,
        );
        assert_eq!(p.tasks[0].rebuilds[0].to, NodeId(4));
    }

    /// The simulator found this (seed 100 of `repair`): a node that had disowned an old
    /// copy of slot 0 was avoided for every slot of the stripe, so the lost slot 2, whose
    /// only possible home it was, stayed lost for the fence's whole day.
    #[test]
    fn a_node_fenced_for_one_slot_still_takes_another() {
        let l = active(1..=3);
        let records = [stripe(1, [1, 2, 0])];
        let fenced = HashMap::from([(StripeId(1), vec![(0, NodeId(3))])]);
        let p = plan(
            &assessed(&records, &l, &[1, 2, 3]),
            &l,
            &mut Room::new(),
            &fenced,
        );
        assert_eq!(p.tasks[0].rebuilds[0].index, 2);
        assert_eq!(p.tasks[0].rebuilds[0].to, NodeId(3));
    }

    #[test]
    fn an_unreadable_stripe_is_not_planned() {
        let l = active(1..=4);
        let p = plan(
            &assessed(&[stripe(1, [1, 0, 0])], &l, &[1, 2, 3, 4]),
            &l,
            &mut Room::new(),
            &HashMap::new(),
        );
        assert!(p.tasks.is_empty());
        assert_eq!(p.unreadable, [StripeId(1)]);
    }

    #[test]
    fn a_waiting_slot_is_neither_rebuilt_nor_read() {
        // Node 5 is down (not out): its shard 4 waits; shard 5 was never written.
        let l = active(1..=7);
        let p = plan(
            &assessed(&[wide(1, [1, 2, 3, 4, 5, 0])], &l, &[1, 2, 3, 4, 6, 7]),
            &l,
            &mut Room::new(),
            &HashMap::new(),
        );
        let t = &p.tasks[0];
        assert_eq!(t.skip, [4, 5]);
        assert_eq!(t.rebuilds.iter().map(|r| r.index).collect::<Vec<_>>(), [5]);
        assert!(t.urgent, "four available of 4+2");
    }

    #[test]
    fn a_draining_node_s_shards_are_copied_after_every_rebuild() {
        // 2+1 on four nodes; node 2 drains. Stripe 1 has a shard on it, stripe 2 lost one.
        let l = layout(&[
            (1, NodeState::Active),
            (2, NodeState::Draining),
            (3, NodeState::Active),
            (4, NodeState::Active),
        ]);
        let up = alive(&[1, 2, 3, 4]);
        assert_eq!(slot(NodeId(2), &l, &up), Slot::Moving);
        assert_eq!(slot(NodeId(2), &l, &alive(&[1])), Slot::Waiting);
        let records = [stripe(1, [2, 1, 3]), stripe(2, [1, 3, 0])];
        let stripes = assessed(&records, &l, &[1, 2, 3, 4]);
        assert_eq!(
            stripes[0].1.available,
            [0, 1, 2],
            "a moving shard is readable"
        );
        let mut placement = active(1..=4);
        placement = Layout::new(
            2,
            placement
                .nodes()
                .iter()
                .map(|n| LayoutNode {
                    state: if n.id == NodeId(2) {
                        NodeState::Draining
                    } else {
                        NodeState::Active
                    },
                    ..n.clone()
                })
                .collect(),
        )
        .expect("layout");
        let p = plan(&stripes, &placement, &mut Room::new(), &HashMap::new());
        let order: Vec<StripeId> = p.tasks.iter().map(|t| t.record.id).collect();
        assert_eq!(order, [StripeId(2), StripeId(1)], "rebuilds first");
        let drain = &p.tasks[1];
        assert!(drain.reason() == Reason::Drain && !drain.urgent);
        assert_eq!(
            drain.copies,
            [Rebuild {
                index: 0,
                from: NodeId(2),
                to: NodeId(4)
            }],
            "the one node that holds nothing of it and takes shards"
        );
        assert_eq!(drain.bytes, 2 * 50, "one shard read and written");
        let mut s = Summary::default();
        for (r, _) in &stripes {
            s.add_draining(r, &alive(&[2]));
        }
        assert_eq!(s.on_draining, BTreeMap::from([(NodeId(2), (1, 50))]));
    }

    #[test]
    fn a_joining_node_receives_its_share_of_slots_and_nothing_else_moves() {
        // 2+1 written on three nodes; a fourth joins.
        let before = active(1..=3);
        let after = active(1..=4);
        let (mut moved, n) = (0, 400u128);
        for id in 0..n {
            let on = place(&before, StripeId(id), EcProfile { k: 2, m: 1 }).expect("place");
            let record = stripe(id, [on[0].0, on[1].0, on[2].0]);
            assert!(
                misplaced(&record, &before, any).is_empty(),
                "placed as placement says"
            );
            let moves = misplaced(&record, &after, any);
            assert!(moves.len() <= 1, "{moves:?}");
            for m in &moves {
                assert_eq!(m.to, NodeId(4), "only the newcomer takes slots: {m:?}");
                assert_eq!(m.from, record.shards[usize::from(m.index)].node);
            }
            moved += moves.len();
        }
        let counts = BTreeMap::from([(NodeId(1), 300), (NodeId(2), 300), (NodeId(3), 300)]);
        assert!(
            below_share(&counts, &after, NodeId(4)),
            "a newcomer is below its share"
        );
        assert!(!below_share(&counts, &after, NodeId(3)));
        let even = BTreeMap::from([
            (NodeId(1), 226),
            (NodeId(2), 225),
            (NodeId(3), 225),
            (NodeId(4), 224),
        ]);
        assert!(
            !below_share(&even, &after, NodeId(4)),
            "a node about at its share takes nothing"
        );
        let share = moved as f64 / n as f64;
        assert!(
            (0.6..=0.9).contains(&share),
            "about 3 of 4 stripes give the newcomer a slot: {share}"
        );
        // Room decides: a target without room for the shard takes nothing.
        let record = stripe(7, [1, 2, 3]);
        let stripes = vec![(
            record.clone(),
            vec![Rebuild {
                index: 0,
                from: NodeId(1),
                to: NodeId(4),
            }],
        )];
        let mut room = Room::from([(NodeId(4), 49)]);
        assert!(plan_rebalance(&stripes, &mut room).is_empty());
        let mut room = Room::from([(NodeId(4), 50)]);
        let tasks = plan_rebalance(&stripes, &mut room);
        assert_eq!(tasks.len(), 1);
        assert_eq!(tasks[0].reason(), Reason::Rebalance);
        assert_eq!(room[&NodeId(4)], 0);
    }

    #[test]
    fn a_drain_with_fewer_domains_than_shards_moves_within_the_domain() {
        // 4+2 on 7 nodes in 3 domains: fd1 = {1, 4, 7}, fd2 = {2, 5}, fd3 = {3, 6}; two
        // shards of every stripe in each domain. Node 7 drains: its shards go to the
        // other fd1 node, and every stripe stays two, two, two.
        let written = three_domains(7, &[]);
        let draining = three_domains(7, &[(7, NodeState::Draining)]);
        let up = [1, 2, 3, 4, 5, 6, 7];
        let records: Vec<StripeRecord> = (0..60).map(|id| placed(id, &written)).collect();
        let on_7 = records
            .iter()
            .filter(|r| r.shards.iter().any(|s| s.node == NodeId(7)))
            .count();
        assert!(on_7 > 20, "{on_7}");
        let p = plan(
            &assessed(&records, &draining, &up),
            &draining,
            &mut Room::new(),
            &HashMap::new(),
        );
        assert!(p.weakened.is_empty() && p.no_target.is_empty(), "{p:?}");
        assert_eq!(p.tasks.len(), on_7);
        for t in &p.tasks {
            let [c] = t.copies.as_slice() else {
                panic!("one copy: {t:?}")
            };
            assert_eq!(c.from, NodeId(7));
            assert!(c.to == NodeId(1) || c.to == NodeId(4), "{c:?}");
        }
    }

    #[test]
    fn a_drain_copy_that_would_crowd_a_domain_is_not_made() {
        // Node 5 drains: fd2 keeps node 2 alone, so its shards could only go to fd1,
        // which would then hold three shards of a stripe. They stay, and the plan says
        // why; a lost shard of the same stripe is still rebuilt.
        let written = three_domains(7, &[]);
        let draining = three_domains(7, &[(5, NodeState::Draining)]);
        let up = [1, 2, 3, 4, 5, 6, 7];
        let mut record = placed(3, &written);
        let lost = record
            .shards
            .iter()
            .position(|s| s.node == NodeId(3))
            .expect("every stripe has a shard on node 3");
        record.shards[lost].node = NodeId::NONE;
        let mut room = Room::from([(NodeId(1), 1000), (NodeId(4), 1000), (NodeId(7), 1000)]);
        let p = plan(
            &assessed(&[record.clone()], &draining, &up),
            &draining,
            &mut room,
            &HashMap::new(),
        );
        let [w] = p.weakened.as_slice() else {
            panic!("one stripe weakened: {p:?}")
        };
        assert_eq!(w.stripe, record.id);
        assert_eq!(
            (w.now.most_in_one_domain, w.then.most_in_one_domain),
            (2, 3)
        );
        assert_eq!(w.now.domains, 3);
        let [t] = p.tasks.as_slice() else {
            panic!("the rebuild goes on: {p:?}")
        };
        assert!(t.copies.is_empty(), "{t:?}");
        assert_eq!(t.rebuilds.len(), 1);
        let room_left: u64 = room.values().sum();
        assert_eq!(room_left, 3000, "the copy's room given back");
    }

    #[test]
    fn a_newcomer_beside_fewer_domains_than_shards_takes_shards_of_its_own_domain() {
        // 6 nodes in 3 domains hold every stripe; node 7 joins fd1.
        let before = three_domains(6, &[]);
        let after = three_domains(7, &[]);
        let mut moved = 0;
        for id in 0..300 {
            let record = placed(id, &before);
            let moves = misplaced(&record, &after, any);
            assert!(moves.len() <= 1, "{moves:?}");
            for m in &moves {
                assert_eq!(m.to, NodeId(7), "{m:?}");
                assert!(
                    m.from == NodeId(1) || m.from == NodeId(4),
                    "from fd1: {m:?}"
                );
                assert_eq!(m.from, record.shards[usize::from(m.index)].node);
            }
            moved += moves.len();
            let only_others = |_: u8, to: NodeId| to != NodeId(7);
            assert!(misplaced(&record, &after, only_others).is_empty());
        }
        assert!(
            (150..=250).contains(&moved),
            "about 2 in 3 stripes: {moved}"
        );
    }

    #[test]
    fn a_stripe_s_rebalance_moves_stop_at_the_first_without_room() {
        let record = wide(1, [1, 2, 3, 4, 5, 6]);
        let moves = vec![
            Rebuild {
                index: 0,
                from: NodeId(1),
                to: NodeId(7),
            },
            Rebuild {
                index: 1,
                from: NodeId(2),
                to: NodeId(8),
            },
            Rebuild {
                index: 2,
                from: NodeId(3),
                to: NodeId(9),
            },
        ];
        let mut room = Room::from([(NodeId(7), 25), (NodeId(8), 0), (NodeId(9), 25)]);
        let tasks = plan_rebalance(&[(record, moves.clone())], &mut room);
        let [t] = tasks.as_slice() else {
            panic!("{tasks:?}")
        };
        assert_eq!(t.copies, moves[..1], "not the third after the second");
        assert_eq!(room[&NodeId(9)], 25);
    }
}
