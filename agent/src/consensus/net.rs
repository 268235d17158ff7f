//! The metadata group's messages between agents, carried by the mesh's typed QUIC RPC:
//! Raft's own traffic, proposals forwarded to the leader, read-index requests and the
//! bootstrap question "do you belong to a group already?".
//!
//! openraft gives each append one heartbeat (200 ms by default) and resends a timed-out
//! one unchanged, so an append carries at most what 10 MB/s moves in a heartbeat (2 MB; at
//! least two full entries, at most the RPC limit less 64 KiB: [`append_budget`]). Past
//! that the network answers `PayloadTooLarge` with a hint and openraft sends fewer entries.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use openraft::BasicNode;
use openraft::error::{
    InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError, RemoteError,
    Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::{Deserialize, Serialize};
use shoal_mesh::{MeshError, Rpc, Transport};
use shoal_namespace::{Outcome, Proposal};

use super::send_gate::SendGate;
use super::types::MetaRaft;

/// Raft's own messages.
#[derive(Serialize, Deserialize)]
pub enum RaftMessage {
    Append(AppendEntriesRequest<MetaRaft>),
    Vote(VoteRequest<u64>),
    Snapshot(InstallSnapshotRequest<MetaRaft>),
}

#[derive(Serialize, Deserialize)]
pub enum RaftReply {
    Append(Result<AppendEntriesResponse<u64>, RaftError<u64>>),
    Vote(Result<VoteResponse<u64>, RaftError<u64>>),
    Snapshot(Result<InstallSnapshotResponse<u64>, RaftError<u64, InstallSnapshotError>>),
    /// This agent has no metadata service running (yet).
    NotServing,
}

impl Rpc for RaftMessage {
    const ENDPOINT: &'static str = "meta/raft";
    type Response = RaftReply;
}

/// Why a forwarded request was not served.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum ForwardRefused {
    /// Ask this node instead (None: no leader known right now).
    NotLeader(Option<u64>),
    /// The leader could not commit or serve now (it is stepping down, its Raft stopped,
    /// a membership change is under way): try again, here or at the next leader. The text
    /// is for the operator.
    Unavailable(String),
}

/// Proposals forwarded by a follower to the leader.
#[derive(Serialize, Deserialize)]
pub struct Forward(pub Vec<Proposal>);

/// The outcomes of committed proposals, and the log index of the entry that carried
/// them (a follower waits until its replica has applied it: read-your-writes).
pub type Committed = (Vec<Outcome>, u64);

impl Rpc for Forward {
    const ENDPOINT: &'static str = "meta/forward";
    type Response = Result<Committed, ForwardRefused>;
}

/// Asks the leader for the log index a linearizable read must wait for.
#[derive(Serialize, Deserialize)]
pub struct ReadIndex;

impl Rpc for ReadIndex {
    const ENDPOINT: &'static str = "meta/read-index";
    type Response = Result<u64, ForwardRefused>;
}

/// Asks an agent whether its metadata group is initialized (bootstrap).
#[derive(Serialize, Deserialize)]
pub struct Hello;

impl Rpc for Hello {
    const ENDPOINT: &'static str = "meta/hello";
    type Response = bool;
}

/// Bytes of entries one append message may carry, at most: the RPC limit less room for
/// the head and the rest of the request.
const MAX_APPEND_BYTES: usize = shoal_mesh::MAX_RPC_MESSAGE - (64 << 10);
/// The slowest transfer rate an append must still finish at, in bytes per millisecond
/// (10 MB/s: a loaded node on a busy network).
const SLOW_BYTES_PER_MS: usize = 10_000;

/// Bytes of entries one append message may carry when openraft gives each append
/// `heartbeat_ms` to finish (it resends a timed-out append unchanged, so a message that
/// cannot arrive in time stalls a lagging follower for good): what the slowest rate moves
/// in that time, never less than one full entry, never more than the RPC limit.
pub fn append_budget(heartbeat_ms: u64, max_entry_bytes: usize) -> usize {
    let timely = usize::try_from(heartbeat_ms)
        .unwrap_or(usize::MAX)
        .saturating_mul(SLOW_BYTES_PER_MS);
    timely.max(2 * max_entry_bytes).min(MAX_APPEND_BYTES)
}

/// `None` when all of `entries` fit in `budget` encoded bytes; otherwise how many of the
/// first ones do (at least one: a single entry is always smaller than the budget, since
/// the batcher caps entries far below it).
fn entries_that_fit<T: Serialize>(entries: &[T], budget: usize) -> Option<u64> {
    let mut total = 0usize;
    for (n, e) in entries.iter().enumerate() {
        total += postcard::serialize_with_flavor(e, postcard::ser_flavors::Size::default())
            .unwrap_or(usize::MAX);
        if total > budget {
            return Some((n as u64).max(1));
        }
    }
    None
}

/// Builds Raft clients for peers from their membership address.
pub struct Network {
    pub transport: Arc<Transport>,
    /// Bytes of entries per append message, at most ([`append_budget`]).
    pub append_budget: usize,
    /// Closed when the group stops, after the sends under way.
    pub gate: Arc<SendGate>,
}

pub struct PeerClient {
    transport: Arc<Transport>,
    append_budget: usize,
    gate: Arc<SendGate>,
    target: u64,
    addr: Result<SocketAddr, String>,
}

impl RaftNetworkFactory<MetaRaft> for Network {
    type Network = PeerClient;

    async fn new_client(&mut self, target: u64, node: &BasicNode) -> PeerClient {
        PeerClient {
            transport: self.transport.clone(),
            append_budget: self.append_budget,
            gate: self.gate.clone(),
            target,
            addr: node
                .addr
                .parse()
                .map_err(|e| format!("bad address {:?} for node {target:016x}: {e}", node.addr)),
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct PeerError(String);

impl PeerClient {
    async fn send<E: std::error::Error>(
        &self,
        msg: RaftMessage,
        timeout: Duration,
    ) -> Result<RaftReply, RPCError<u64, BasicNode, E>> {
        let addr = self
            .addr
            .clone()
            .map_err(|e| RPCError::Network(NetworkError::new(&PeerError(e))))?;
        let _sending = self.gate.enter().await;
        let target = shoal_mesh::NodeId(self.target);
        match self.transport.call_to(target, addr, &msg, timeout).await {
            Ok(RaftReply::NotServing) => Err(RPCError::Unreachable(Unreachable::new(&PeerError(
                "peer has no metadata service running".into(),
            )))),
            Ok(reply) => Ok(reply),
            // Sending it again cannot work: openraft sends fewer entries next time.
            Err(e @ MeshError::MessageTooLarge { .. }) => {
                let entries = match &msg {
                    RaftMessage::Append(r) => r.entries.len() as u64,
                    _ => 2,
                };
                Err(RPCError::PayloadTooLarge(
                    PayloadTooLarge::new_entries_hint((entries / 2).max(1))
                        .with_source_error(&PeerError(e.to_string())),
                ))
            }
            Err(e) => Err(RPCError::Unreachable(Unreachable::new(&PeerError(
                e.to_string(),
            )))),
        }
    }

    fn remote<E: std::error::Error>(&self, e: E) -> RPCError<u64, BasicNode, E> {
        RPCError::RemoteError(RemoteError::new(self.target, e))
    }

    fn unexpected<E: std::error::Error>(&self) -> RPCError<u64, BasicNode, E> {
        RPCError::Network(NetworkError::new(&PeerError("unexpected reply".into())))
    }
}

impl RaftNetwork<MetaRaft> for PeerClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<MetaRaft>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        if let Some(fit) = entries_that_fit(&rpc.entries, self.append_budget) {
            return Err(RPCError::PayloadTooLarge(
                PayloadTooLarge::new_entries_hint(fit),
            ));
        }
        match self
            .send(RaftMessage::Append(rpc), option.hard_ttl())
            .await?
        {
            RaftReply::Append(r) => r.map_err(|e| self.remote(e)),
            _ => Err(self.unexpected()),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<MetaRaft>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<u64>,
        RPCError<u64, BasicNode, RaftError<u64, InstallSnapshotError>>,
    > {
        match self
            .send(RaftMessage::Snapshot(rpc), option.hard_ttl())
            .await?
        {
            RaftReply::Snapshot(r) => r.map_err(|e| self.remote(e)),
            _ => Err(self.unexpected()),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        option: RPCOption,
    ) -> Result<VoteResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        match self.send(RaftMessage::Vote(rpc), option.hard_ttl()).await? {
            RaftReply::Vote(r) => r.map_err(|e| self.remote(e)),
            _ => Err(self.unexpected()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{append_budget, entries_that_fit};

    #[test]
    fn appends_are_sized_to_arrive_within_a_heartbeat() {
        assert_eq!(append_budget(200, 1 << 20), 2_000_000 + 97_152);
        assert_eq!(append_budget(1000, 1 << 20), 10_000_000);
        assert_eq!(append_budget(60_000, 1 << 20), (16 << 20) - (64 << 10));
    }

    #[test]
    fn appends_larger_than_the_budget_are_cut_to_what_fits() {
        let entries: Vec<Vec<u8>> = (0..10).map(|_| vec![7u8; 1000]).collect();
        assert_eq!(entries_that_fit(&entries, 20_000), None);
        // Each encodes to 1,002 bytes: three fit in 3,500.
        assert_eq!(entries_that_fit(&entries, 3_500), Some(3));
        assert_eq!(entries_that_fit(&entries, 10), Some(1), "never zero");
    }
}
