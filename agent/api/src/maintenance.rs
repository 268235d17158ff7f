//! Answers of the maintenance requests (`shoal ok-to-stop`, `shoal drain`).

use serde::{Deserialize, Serialize};

/// What stopping one node now would do to the stripes it holds and to the metadata group:
/// the answer to [`crate::Request::OkToStop`] (protocol 5 to 8), kept as it was for the
/// clients of those versions. Today's clients ask [`crate::Request::OkToStopNodes`].
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

/// What stopping a set of nodes together now would do to the stripes and to the metadata
/// group (`shoal ok-to-stop NODE [NODE...]`; a rolling restart stops a whole failure domain
/// at once).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OkToStopNodes {
    /// The nodes asked about, each once, in the order asked.
    pub nodes: Vec<StopNode>,
    /// Stopping them together keeps every stripe they hold an available shard of at k+1
    /// available shards or more, and the metadata voters at a quorum.
    pub ok: bool,
    /// Stripes checked (every live stripe), and those with a shard available on any of
    /// the nodes.
    pub stripes_total: u64,
    pub stripes_on_nodes: u64,
    /// Of those, how many would be left with exactly k available shards (readable, no
    /// spare), and with fewer than k (unreadable until a node returns).
    pub stripes_at_k: u64,
    pub stripes_unreadable: u64,
    /// The first of those stripes ([`MAX_STRIPES_NAMED`] at most), by id.
    pub stripes_at_risk: Vec<StripeAtRisk>,
    /// Failure domains of the shards those stripes would miss (the nodes' own among
    /// them); `(unwritten)` for slots written degraded.
    pub domains_at_risk: Vec<String>,
    /// Metadata voters, and how many of them would still be alive.
    pub voters: u32,
    pub voters_alive_after: u32,
    /// The voters among the nodes asked about that are alive now: the votes the stop
    /// takes away (names, or ids where a node has no name).
    pub voters_stopping: Vec<String>,
    /// Why not, in words (empty when `ok`).
    pub reasons: Vec<String>,
}

/// Most stripes an [`OkToStopNodes`] names; the counts cover all of them.
pub const MAX_STRIPES_NAMED: usize = 16;

/// One node asked about in `shoal ok-to-stop`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StopNode {
    /// Its id (16 hex digits) and name (empty where gossip does not know it).
    pub node: String,
    pub name: String,
    /// Its failure domain in the layout (empty when it is not in the layout).
    pub domain: String,
    /// Alive now: stopping a node that is already down changes nothing.
    pub alive: bool,
}

/// One stripe that the stop would leave at k available shards or fewer.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StripeAtRisk {
    /// Its id (32 hex digits) and erasure code ("4+2").
    pub stripe: String,
    pub ec: String,
    /// Available shards now, and with the nodes stopped.
    pub available_now: u32,
    pub available_after: u32,
}

impl OkToStopNodes {
    /// The answer for one node in the form of protocol 5 to 8 ([`OkToStop`]).
    pub fn into_one(self) -> OkToStop {
        let node = self.nodes.into_iter().next().unwrap_or_default();
        OkToStop {
            node: node.node,
            name: node.name,
            ok: self.ok,
            stripes_total: self.stripes_total,
            stripes_on_node: self.stripes_on_nodes,
            stripes_at_k: self.stripes_at_k,
            stripes_unreadable: self.stripes_unreadable,
            domains_at_risk: self.domains_at_risk,
            voters: self.voters,
            voters_alive_after: self.voters_alive_after,
            reasons: self.reasons,
        }
    }
}

impl From<OkToStop> for OkToStopNodes {
    /// An older agent's answer for one node, without what it does not say (the stripes
    /// by id, the node's domain and state, the voters it holds).
    fn from(r: OkToStop) -> Self {
        OkToStopNodes {
            nodes: vec![StopNode {
                node: r.node,
                name: r.name,
                domain: String::new(),
                alive: true,
            }],
            ok: r.ok,
            stripes_total: r.stripes_total,
            stripes_on_nodes: r.stripes_on_node,
            stripes_at_k: r.stripes_at_k,
            stripes_unreadable: r.stripes_unreadable,
            stripes_at_risk: Vec::new(),
            domains_at_risk: r.domains_at_risk,
            voters: r.voters,
            voters_alive_after: r.voters_alive_after,
            voters_stopping: Vec::new(),
            reasons: r.reasons,
        }
    }
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
