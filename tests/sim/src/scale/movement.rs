//! How much data moves when one node joins or leaves, against the ideal `1/N`: every
//! stripe placed again by the real placement function under the new layout, and for a
//! join the moves the real rebalance planner makes toward it.

use std::fmt;

use shoal_agent::redundancy as plan;
use shoal_disk::SplitMix64;
use shoal_placement::{Layout, NodeId, NodeState, PlacementError, place};

use super::cluster::{Cluster, random_node};

/// Shards whose placement changed when one node joined or left.
#[derive(Clone, Debug, PartialEq)]
pub struct Change {
    pub node: NodeId,
    /// Shard slots whose target changed, of `shards`.
    pub moved: u64,
    pub shards: u64,
    /// Of the moved ones, those that go to the newcomer (join) or that were on the node
    /// that left: what has to move. The rest move only because those did.
    pub necessary: u64,
    /// The ideal share that moves: 1/N of the nodes after a join, before a leave.
    pub ideal: f64,
    /// Moves the rebalance planner makes toward the new placement (join only).
    pub rebalance_moves: Option<u64>,
}

impl Change {
    pub fn fraction(&self) -> f64 {
        self.moved as f64 / self.shards.max(1) as f64
    }

    /// Moved against the ideal (1.0: exactly the ideal).
    pub fn over_ideal(&self) -> f64 {
        self.fraction() / self.ideal
    }
}

/// One node joining (in a seeded rack), and separately `leaving` leaving.
#[derive(Clone, Debug, PartialEq)]
pub struct MovementReport {
    pub join: Change,
    pub leave: Change,
}

pub fn measure(
    cluster: &Cluster,
    leaving: NodeId,
    seed: u64,
) -> Result<MovementReport, PlacementError> {
    let n = cluster.layout.nodes().len();
    let mut rng = SplitMix64(seed ^ 0x0000_101e);
    let mut newcomer = random_node(&mut rng);
    while cluster.layout.node(newcomer).is_some() {
        newcomer = random_node(&mut rng);
    }
    let joined = cluster.with_new_node(newcomer, rng.below(cluster.racks as u64) as usize)?;
    let mut join = replace(cluster, &joined, |to, _| to == newcomer, true)?;
    join.node = newcomer;
    join.ideal = 1.0 / (n + 1) as f64;

    let left = cluster.with_state(leaving, NodeState::Out)?;
    // Rebalance leaves a stripe with a shard on a node that is not active alone: what
    // the leaver held is repair's (see `rebuild`).
    let mut leave = replace(cluster, &left, |_, from| from == leaving, false)?;
    leave.node = leaving;
    leave.ideal = 1.0 / n as f64;
    Ok(MovementReport { join, leave })
}

/// Places every stripe again under `after`; `necessary(to, from)` says which slot
/// changes had to happen. With `rebalance`, counts the rebalance planner's moves on the
/// changed stripes.
fn replace(
    cluster: &Cluster,
    after: &Layout,
    necessary: impl Fn(NodeId, NodeId) -> bool,
    rebalance: bool,
) -> Result<Change, PlacementError> {
    let mut change = Change {
        node: NodeId::NONE,
        moved: 0,
        shards: cluster.shards(),
        necessary: 0,
        ideal: 0.0,
        rebalance_moves: rebalance.then_some(0),
    };
    for record in &cluster.records {
        let targets = place(after, record.id, record.ec)?;
        let mut changed = false;
        for (shard, &to) in record.shards.iter().zip(&targets) {
            if shard.node != to {
                changed = true;
                change.moved += 1;
                if necessary(to, shard.node) {
                    change.necessary += 1;
                }
            }
        }
        if let Some(moves) = change.rebalance_moves.as_mut().filter(|_| changed) {
            *moves += plan::misplaced(record, after, |_, _| true).len() as u64;
        }
    }
    Ok(change)
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} of {} shards moved = {:.4}% (ideal {:.4}%, x{:.3}); necessary {}",
            self.moved,
            self.shards,
            100.0 * self.fraction(),
            100.0 * self.ideal,
            self.over_ideal(),
            self.necessary
        )?;
        if let Some(m) = self.rebalance_moves {
            write!(f, "; rebalance plans {m} moves")?;
        }
        Ok(())
    }
}

impl fmt::Display for MovementReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "  join  {}: {}", self.join.node, self.join)?;
        writeln!(f, "  leave {}: {}", self.leave.node, self.leave)
    }
}
