//! Scale on paper, made runnable: membership, placement and the repair planner of a
//! cluster of many simulated nodes, with the real code and no data path.
//!
//! - [`detection`]: `n` real SWIM members on the simulated network
//!   (`shoal_mesh::membership_sim`); one is killed: how long until the first, 99% and all
//!   of the others declare it down, and what the gossip costs per member.
//! - [`rebuild`]: stripes of the default profile placed by `shoal_placement::place` on
//!   `n` nodes in racks; one node is `out`: how the real repair planner spreads its
//!   rebuild over the others (shards received, shards read).
//! - [`movement`]: one node joins, one leaves: the share of shards placement moves,
//!   against the ideal `1/N`.
//!
//! Everything is seeded: the same `(nodes, seed)` prints the same report.

mod cluster;
pub mod detection;
mod distribution;
pub mod movement;
pub mod rebuild;
#[cfg(test)]
mod tests;

use std::fmt;

use shoal_disk::SplitMix64;
use shoal_mesh::MeshError;
use shoal_placement::{EcProfile, PlacementError};

pub use cluster::STRIPES_PER_NODE;
pub use detection::DetectionReport;
pub use distribution::Distribution;
pub use movement::{Change, MovementReport};
pub use rebuild::RebuildReport;

/// Everything one scale run measured.
#[derive(Debug)]
pub struct ScaleReport {
    pub nodes: usize,
    pub seed: u64,
    pub detection: Result<DetectionReport, MeshError>,
    pub placement: Result<PlacementReport, PlacementError>,
}

/// The placement side: the cluster on paper, a lost node's rebuild, a join and a leave.
#[derive(Clone, Debug, PartialEq)]
pub struct PlacementReport {
    pub racks: usize,
    pub stripes: usize,
    pub profile: EcProfile,
    pub rebuild: RebuildReport,
    pub movement: MovementReport,
}

/// Runs every measurement at `nodes` nodes (see the module doc). Seconds in release at
/// 1,000 nodes; each part's error (too few nodes for a stripe, say) is kept in its place.
pub fn run(nodes: usize, seed: u64) -> ScaleReport {
    ScaleReport {
        nodes,
        seed,
        detection: detection::measure(nodes, seed),
        placement: placement(nodes, seed),
    }
}

fn placement(nodes: usize, seed: u64) -> Result<PlacementReport, PlacementError> {
    let cluster = cluster::Cluster::build(nodes, seed)?;
    let members = cluster.layout.nodes();
    let lost = members[SplitMix64(seed).below(members.len() as u64) as usize].id;
    Ok(PlacementReport {
        racks: cluster.racks,
        stripes: cluster.records.len(),
        profile: cluster.profile,
        rebuild: rebuild::measure(&cluster, lost)?,
        movement: movement::measure(&cluster, lost, seed)?,
    })
}

impl fmt::Display for ScaleReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "scale: {} nodes, seed {} (membership, placement, repair planner; no data path)",
            self.nodes, self.seed
        )?;
        match &self.detection {
            Ok(d) => write!(f, "{d}")?,
            Err(e) => writeln!(f, "membership: failed: {e}")?,
        }
        match &self.placement {
            Ok(p) => write!(f, "{p}"),
            Err(e) => writeln!(f, "placement: failed: {e}"),
        }
    }
}

impl fmt::Display for PlacementReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "rebuild: {} stripes of {} in {} racks, one node out, the repair planner's plan",
            self.stripes, self.profile, self.racks
        )?;
        write!(f, "{}", self.rebuild)?;
        writeln!(f, "moved data: every stripe placed again after one node")?;
        write!(f, "{}", self.movement)
    }
}
