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
