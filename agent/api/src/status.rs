use serde::{Deserialize, Serialize};

/// Liveness of a member.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MemberState {
    Alive,
    Suspect,
    Down,
    Left,
}

impl MemberState {
    pub fn as_str(&self) -> &'static str {
        match self {
            MemberState::Alive => "alive",
            MemberState::Suspect => "suspect",
            MemberState::Down => "down",
            MemberState::Left => "left",
        }
    }
}

/// One cluster member as seen by the answering agent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MemberStatus {
    /// Stable node id, 16 hex digits.
    pub id: String,
    pub name: String,
    /// Gossip address.
    pub addr: String,
    /// QUIC RPC address, once the member's facts are known.
    pub rpc_addr: Option<String>,
    pub failure_domain: Option<String>,
    pub state: MemberState,
    /// Grows with every restart of the member.
    pub generation: u64,
    /// SWIM incarnation (grows when the member refutes a suspicion).
    pub incarnation: u16,
    /// Size of the filesystem holding the member's data dir.
    pub capacity_bytes: Option<u64>,
    pub used_bytes: Option<u64>,
    /// Whether the member's shard store takes new shards (false: full, or its I/O
    /// failing), from its facts.
    pub store_accepting: Option<bool>,
    /// Bytes of new shards its store can take, from its facts.
    pub store_room_bytes: Option<u64>,
    pub agent_version: Option<String>,
    /// Milliseconds since a gossip packet from this member arrived (None for the answering
    /// agent itself, or a member never heard from directly).
    pub last_heard_ms: Option<u64>,
    /// Round trip of a QUIC RPC ping just now, in microseconds (None if it failed).
    pub rpc_rtt_us: Option<u64>,
    /// True for the agent that answered.
    pub is_self: bool,
    /// The member's state in the committed cluster layout: `active`, `down`, `out`,
    /// `draining`, `drained`, `maintenance` (None before it is in the layout).
    pub layout_state: Option<String>,
    /// For a member not alive: how long since it was last heard from (or since this agent
    /// started, if never).
    pub down_for_ms: Option<u64>,
    /// For a member down but not yet `out`: how long until it is (`[cluster]
    /// down_out_after`, as this agent is configured) and its shards are rebuilt.
    pub out_in_ms: Option<u64>,
    /// For a member in maintenance: milliseconds until its window ends (negative once it
    /// ran over: the node is still down after the window).
    pub maintenance_ends_in_ms: Option<i64>,
}

/// What `shoal status` shows.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StatusReport {
    /// Id of the answering agent.
    pub node: String,
    pub agent_version: String,
    /// Upper bound, in milliseconds, on how long a crashed member stays alive/suspect in
    /// this view (no packet loss assumed).
    pub detection_bound_ms: u64,
    pub nodes: Vec<MemberStatus>,
    /// This node's reservation (None: no `[resources]` section, the agent is unconfined).
    pub resources: Option<ResourceStatus>,
    pub gpu: GpuStatus,
    /// Fraction of the idle background budget in force (1 = GPUs idle or absent).
    pub background_factor: f64,
    pub background: Vec<BackgroundBudget>,
    /// This node's shard store.
    pub store: StoreStatus,
    /// The metadata group as this node sees it.
    pub meta: MetaStatus,
    /// This node's background workers, in start order.
    pub workers: Vec<WorkerStatus>,
    /// The cluster's redundancy as of the last scan of this node's metadata replica (None
    /// before the first scan ends).
    pub redundancy: Option<RedundancyStatus>,
    /// This node's scrub.
    pub scrub: ScrubStatus,
}

/// Live stripes by how many of their shards are missing, and the repair under way.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RedundancyStatus {
    pub stripes_total: u64,
    /// Every shard available.
    pub stripes_healthy: u64,
    /// Missing one shard or more (on a down or `out` node, or never written), still
    /// readable.
    pub stripes_degraded: u64,
    /// Fewer than k shards available.
    pub stripes_unreadable: u64,
    /// Degraded stripes by shards missing, fewest first.
    pub by_missing: Vec<MissingShards>,
    /// Bytes of lost shards (on `out` nodes, or never written) to rebuild.
    pub bytes_to_repair: u64,
    /// Bytes of shards on nodes down but not yet `out` (rebuilt if they become so).
    pub bytes_waiting: u64,
    /// Stripes with lost shards that no node can take now (too few nodes or room).
    pub stripes_no_target: u64,
    /// Bytes a second rebuilt across the cluster lately.
    pub repair_bytes_per_sec: u64,
    /// `bytes_to_repair` at that rate (None while nothing is being rebuilt).
    pub eta_seconds: Option<u64>,
    /// How long ago the scan behind these numbers ended.
    pub scanned_ms_ago: u64,
    /// Stripes and bytes this node has repaired since it started.
    pub repaired_stripes: u64,
    pub repaired_bytes: u64,
    /// Rebalance: healthy stripes with shards not where placement puts them now (a node
    /// joined since), the bytes of those shards, and the bytes this node has moved to
    /// their targets since it started.
    pub rebalance_stripes: u64,
    pub rebalance_bytes: u64,
    pub rebalanced_bytes: u64,
}

/// Stripes missing this many shards.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MissingShards {
    pub missing: u32,
    pub stripes: u64,
    /// Bytes of data in them.
    pub bytes: u64,
}

/// This node's scrub: passes over its shards checking them against their checksums.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ScrubStatus {
    pub enabled: bool,
    /// Passes finished (kept across restarts).
    pub passes: u64,
    /// In the pass under way: shards checked, and how many the store held at its start.
    pub shards_checked: u64,
    pub shards_total: u64,
    pub bytes_checked: u64,
    /// Corrupt shards found on this node (by scrub or by a read), since this agent started.
    pub corrupt_found: u64,
    /// When the last pass finished (Unix milliseconds).
    pub last_pass_unix_ms: Option<u64>,
    /// When the next pass starts, while none is under way (Unix milliseconds).
    pub next_pass_unix_ms: Option<u64>,
}

/// One background worker of the answering node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerStatus {
    pub name: String,
    /// `idle`, `busy`, `throttled` (its next unit waits for the governor's budget),
    /// `standby` (another node does this work: the leader's), `error` (its last unit
    /// failed), `done` or `stopped`.
    pub state: String,
    /// What it is at, when it has something to say.
    pub progress: Option<String>,
    /// Its last failure (kept after it recovers), and when (Unix milliseconds).
    pub last_error: Option<String>,
    pub last_error_unix_ms: Option<u64>,
    /// Throttled: the budget it waits for (`repair`, `drain`, `rebalance`, `scrub`,
    /// `tiering`). Protocol 11 on.
    pub waiting_for: Option<String>,
}

/// The metadata (Raft) group as one node sees it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MetaStatus {
    /// Node id of the leader, when one is known.
    pub leader: Option<String>,
    pub voters: Vec<String>,
    pub learners: Vec<String>,
    pub term: u64,
    /// Log index this node's replica has applied.
    pub applied: Option<u64>,
    /// Epoch of the committed cluster layout (None before the first).
    pub layout_epoch: Option<u64>,
    /// Inodes in the namespace.
    pub inodes: u64,
    /// Something an operator should know about this replica (e.g. that it found its data
    /// dir older than the cluster's record and rejoined with fresh state).
    pub notice: Option<String>,
    /// Why this node's metadata member stopped (a storage failure), once it did: it is no
    /// longer counted on as a voter, and the agent restarts.
    pub failed: Option<String>,
}

/// Space in this node's shard store.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StoreStatus {
    pub shards: u64,
    /// Bytes of shard files.
    pub used_bytes: u64,
    /// The fill limit (`[storage] capacity`); writes past it fail with "node full".
    pub limit_bytes: u64,
}

/// The agent's CPU/RAM reservation and what it uses.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ResourceStatus {
    /// False when running unconfined under `enforcement = "best-effort"`.
    pub enforced: bool,
    /// Why the reservation is not enforced, when it is not.
    pub note: Option<String>,
    /// Where the agent's cgroup lives.
    pub cgroup: Option<String>,
    /// Reserved cpuset, when the reservation is a cpuset.
    pub cpus: Option<String>,
    pub reserved_cores: f64,
    pub memory_limit_bytes: u64,
    /// What the reservation leaves for training.
    pub training_cores: f64,
    pub training_memory_bytes: u64,
    pub memory_used_bytes: Option<u64>,
    pub memory_peak_bytes: Option<u64>,
    pub cpu_usage_seconds: Option<f64>,
}

/// The node's GPUs as NVML reports them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuStatus {
    pub count: u32,
    pub utilization_percent: Option<f64>,
    pub memory_used_bytes: u64,
    pub memory_total_bytes: u64,
    /// "no GPU (...)" where there is none.
    pub note: Option<String>,
}

/// The budget one class of background work has now.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BackgroundBudget {
    pub class: String,
    pub bytes_per_sec: u64,
    pub concurrency: u32,
}
