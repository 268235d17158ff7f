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
    pub agent_version: Option<String>,
    /// Milliseconds since a gossip packet from this member arrived (None for the answering
    /// agent itself, or a member never heard from directly).
    pub last_heard_ms: Option<u64>,
    /// Round trip of a QUIC RPC ping just now, in microseconds (None if it failed).
    pub rpc_rtt_us: Option<u64>,
    /// True for the agent that answered.
    pub is_self: bool,
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
}
