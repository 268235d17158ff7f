//! Answers of the maintenance requests (`shoal ok-to-stop`).

use serde::{Deserialize, Serialize};

/// What stopping one node now would do to the stripes it holds and to the metadata group.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OkToStop {
    /// The node asked about: its id (16 hex digits) and name.
    pub node: String,
    pub name: String,
    /// Stopping it keeps every stripe it holds an available shard of at k+1 available
    /// shards or more, and the metadata voters at a quorum.
    pub ok: bool,
    /// Stripes checked (every live stripe), and those with a shard available on the node.
    pub stripes_total: u64,
    pub stripes_on_node: u64,
    /// Of those, how many would be left with exactly k available shards (readable, no
    /// spare), and with fewer than k (unreadable until a node returns).
    pub stripes_at_k: u64,
    pub stripes_unreadable: u64,
    /// Failure domains of the shards those stripes would miss (the node's own among
    /// them); `(unwritten)` for slots written degraded.
    pub domains_at_risk: Vec<String>,
    /// Metadata voters, and how many of them would still be alive.
    pub voters: u32,
    pub voters_alive_after: u32,
    /// Why not, in words (empty when `ok`).
    pub reasons: Vec<String>,
}

/// What draining one node moves (`shoal drain NODE [--dry-run]`): the answer to a dry run,
/// and to a drain that started.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainPlan {
    /// The node: its id (16 hex digits) and name.
    pub node: String,
    pub name: String,
    /// Only assessed: nothing changed.
    pub dry_run: bool,
    /// The drain started (the node is `draining` now).
    pub started: bool,
    /// Live stripes with a shard on the node, and the bytes of those shards: what moves.
    pub stripes: u64,
    pub bytes: u64,
    /// Where the shards would go now, by target node.
    pub targets: Vec<DrainTarget>,
    /// Whether every shard has a target now (failure domains and room allowing).
    pub can_finish: bool,
    /// Why not, with the numbers (empty when it can).
    pub reasons: Vec<String>,
}

/// One target of a drain: how many shards and bytes it would receive.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainTarget {
    pub node: String,
    pub name: String,
    pub shards: u64,
    pub bytes: u64,
}

/// How one drain stands (`shoal drain status`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainProgress {
    pub node: String,
    pub name: String,
    /// `draining` or `drained`.
    pub state: String,
    /// What the node held when the drain started.
    pub stripes_total: u64,
    pub bytes_total: u64,
    /// What is still on it, as of this agent's last scan.
    pub stripes_left: u64,
    pub bytes_left: u64,
    /// How fast `bytes_left` fell over the last scans, and the time left at that rate
    /// (None while nothing moves).
    pub bytes_per_sec: u64,
    pub eta_seconds: Option<u64>,
    /// Milliseconds since the drain started (cluster clock).
    pub running_ms: u64,
}
