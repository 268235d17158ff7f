//! Agent-to-agent system messages: liveness over the RPC transport.

use serde::{Deserialize, Serialize};
use shoal_mesh::{NodeId, Rpc};

/// Asks a peer to answer; proves the authenticated QUIC path end to end.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Ping {
    pub nonce: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Pong {
    pub nonce: u64,
    pub node: NodeId,
    pub agent_version: String,
}

impl Rpc for Ping {
    const ENDPOINT: &'static str = "system/ping";
    type Response = Pong;
}
