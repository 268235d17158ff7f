//! How a lost node's rebuild spreads over the others: the real repair planner
//! (`shoal_agent::redundancy`) over every stripe, once the node is `out`.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt;

use shoal_agent::redundancy::{self as plan, Health, Room};
use shoal_agent_api::StripeRecord;
use shoal_placement::{NodeId, NodeState, PlacementError};

use super::cluster::Cluster;
use super::distribution::Distribution;

/// What the planner made of one lost node.
#[derive(Clone, Debug, PartialEq)]
pub struct RebuildReport {
    pub lost: NodeId,
    /// Shards the lost node held, and the mean over all nodes.
    pub lost_shards: u64,
    pub mean_shards_per_node: f64,
    /// Shards planned for rebuild, in how many tasks (one per stripe).
    pub planned: u64,
    pub tasks: usize,
    /// Per live node: shards it receives, shards it is read for (the tasks' sources).
    pub received: Distribution,
    pub read: Distribution,
    /// Receivers expected if each rebuilt shard went to a live node drawn uniformly.
    pub receivers_if_uniform: f64,
    /// Mean shards received by a live node of the lost node's failure domain, and by
    /// one of another domain: the lost domain holds no other shard of these stripes, so
    /// its nodes are allowed for every one.
    pub received_in_lost_domain: f64,
    pub received_elsewhere: f64,
    /// Stripes the planner found no target for, or could not read.
    pub no_target: usize,
    pub unreadable: usize,
    /// Rebuilds that break the planner's promises: a slot not on the lost node, planned
    /// twice, or a target that is dead or already holds a shard of the stripe.
    pub misplanned: u64,
}

/// Marks `lost` out (down past `down_out_after`) and plans the repair of every stripe.
pub fn measure(cluster: &Cluster, lost: NodeId) -> Result<RebuildReport, PlacementError> {
    let layout = cluster.with_state(lost, NodeState::Out)?;
    let alive: BTreeSet<NodeId> = layout
        .nodes()
        .iter()
        .map(|n| n.id)
        .filter(|&n| n != lost)
        .collect();
    let candidates: Vec<(StripeRecord, Health)> = cluster
        .records
        .iter()
        .map(|r| (r.clone(), Health::of(r, &layout, &alive)))
        .filter(|(_, h)| h.has_work())
        .collect();
    let lost_shards = cluster
        .records
        .iter()
        .flat_map(|r| &r.shards)
        .filter(|s| s.node == lost)
        .count() as u64;
    // Room to spare everywhere: the spread is placement's, not the fill level's.
    let mut room: Room = alive.iter().map(|&n| (n, u64::MAX / 2)).collect();
    let planned = plan::plan(&candidates, &layout, &mut room, &HashMap::new());

    let mut received: HashMap<NodeId, u64> = alive.iter().map(|&n| (n, 0)).collect();
    let mut read = received.clone();
    let mut slots_seen = HashSet::new();
    let mut misplanned = 0;
    let mut rebuilds = 0;
    for task in &planned.tasks {
        let record = &task.record;
        for r in &task.rebuilds {
            rebuilds += 1;
            let on_lost = record.shards.get(usize::from(r.index)).map(|s| s.node) == Some(lost);
            let onto_holder = record.shards.iter().any(|s| s.node == r.to);
            let fresh = slots_seen.insert((record.id, r.index));
            if !on_lost || onto_holder || !fresh || !alive.contains(&r.to) {
                misplanned += 1;
            }
            *received.entry(r.to).or_default() += 1;
        }
        for &source in &task.sources {
            if let Some(s) = record.shards.get(usize::from(source)) {
                *read.entry(s.node).or_default() += 1;
            }
        }
    }
    let lost_domain = cluster.layout.node(lost).map(|n| &n.failure_domain);
    let (mut near, mut far) = ((0u64, 0u64), (0u64, 0u64));
    for (node, &count) in &received {
        let domain = layout.node(*node).map(|n| &n.failure_domain);
        let side = if domain == lost_domain {
            &mut near
        } else {
            &mut far
        };
        *side = (side.0 + count, side.1 + 1);
    }
    let live = alive.len() as f64;
    Ok(RebuildReport {
        receivers_if_uniform: live * (1.0 - (1.0 - 1.0 / live).powf(rebuilds as f64)),
        received_in_lost_domain: mean(near),
        received_elsewhere: mean(far),
        lost,
        lost_shards,
        mean_shards_per_node: cluster.shards() as f64 / cluster.layout.nodes().len() as f64,
        planned: rebuilds,
        tasks: planned.tasks.len(),
        received: Distribution::of(received.into_values()),
        read: Distribution::of(read.into_values()),
        no_target: planned.no_target.len(),
        unreadable: planned.unreadable.len(),
        misplanned,
    })
}

/// `sum / count` of a `(sum, count)` pair (0 for none).
fn mean((sum, count): (u64, u64)) -> f64 {
    if count == 0 {
        0.0
    } else {
        sum as f64 / count as f64
    }
}

impl fmt::Display for RebuildReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "  node {} out: {} shards (mean per node {:.1}); {} rebuilds planned in {} tasks",
            self.lost, self.lost_shards, self.mean_shards_per_node, self.planned, self.tasks
        )?;
        writeln!(
            f,
            "  received by {} of {} live nodes (uniformly random: ~{:.0}): {}",
            self.received.nonzero, self.received.nodes, self.receivers_if_uniform, self.received
        )?;
        writeln!(
            f,
            "  received per node in the lost node's domain {:.2}, elsewhere {:.2}",
            self.received_in_lost_domain, self.received_elsewhere
        )?;
        writeln!(
            f,
            "  read from   {} of {} live nodes: {}",
            self.read.nonzero, self.read.nodes, self.read
        )?;
        writeln!(
            f,
            "  no target {}, unreadable {}, misplanned {}",
            self.no_target, self.unreadable, self.misplanned
        )
    }
}
