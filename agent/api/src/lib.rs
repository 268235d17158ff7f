//! The language shared by the shoal agent and its local clients (`shoal` CLI, `shoal mount`).
//!
//! Read [`Request`] and [`Response`] first, then [`frame`] for how they travel over the
//! agent's Unix socket. This crate holds types and framing only: it must never depend on
//! the mesh, the metadata service or the storage engine.

mod client;
mod error;
mod failure;
pub mod frame;
mod fs;
#[doc(hidden)]
pub mod fuzz;
mod maintenance;
mod status;
mod stripe;
mod tier;
pub mod wall_clock;

pub use client::AgentClient;
pub use error::ApiError;
pub use failure::{Failure, FailureKind};
pub use fs::{
    ChangeBatch, DELIVERY_WAIT_MS, DirEntry, Extent, FEED_START, FileAttr, FileKind, FileLayout,
    FsError, FsRequest, FsResponse, FsStats, Ino, MAX_DIR_PAGE, MAX_READ, MAX_WATCH_MS, NAME_MAX,
    Owner, ROOT_INO, RenameFlags, RequestId, SetAttr, SetTime, Timestamp, UnsyncedAnswer,
};
pub use maintenance::{
    DrainPlan, DrainProgress, DrainTarget, MAX_STRIPES_NAMED, OkToStop, OkToStopNodes, StopNode,
    StripeAtRisk,
};
pub use shoal_placement::{EcProfile, NodeId, StripeId};
pub use status::{
    BackgroundBudget, GpuStatus, MemberState, MemberStatus, MetaStatus, MissingShards,
    RedundancyStatus, ResourceStatus, ScrubStatus, StatusReport, StoreStatus, WorkerStatus,
};
pub use stripe::{RecordError, ShardLocation, StripeRead, StripeRecord};
pub use tier::{ColdExtent, TierMoved, TierReport};

use serde::{Deserialize, Serialize};

/// Version of the admin/client protocol; carried in every frame. Versions 4, 5 and 6 added
/// fields to [`StatusReport`] (so an older client's `Status` is refused with a message);
/// version 4 added the `MetaDigest` request, 5 `OkToStop`, 6 the drain and maintenance
/// requests, 7 the cold-tier requests, 8 the mount's change feed (`FsRequest::Watch`, and
/// `FsResponse::Opened` for an open) and `RevokeCertificate`, 9 `OkToStopNodes` (several
/// nodes stopped together) and the feed's epoch and position on answers
/// (`FsResponse::OpenedIn` for an open, `FsResponse::EntryAt` for a lookup), 10 the kind of
/// a failure (`Response::Failed`; a client of 3 to 9 is answered `Response::Error`, the
/// message alone: see [`Response::in_version`]), 11 `FsRequest::WriteThenSet`, 12
/// `FsRequest::Sync` (a mount of 12 on may be answered changes under a directory lease
/// before they are committed, and syncs them on `fsync`) and `FsRequest::Create`, 13 the
/// directory's attributes with a change answered under its lease (`UnsyncedAnswer::DoneIn`,
/// `UnsyncedAnswer::EntryIn`). Every other
/// message is as in version 3, so mounts started with an earlier release keep working
/// across an agent upgrade.
pub const API_VERSION: u8 = 13;

/// The oldest agent protocol a client of this version still speaks when the agent refuses
/// this one ([`AgentClient::call`]): version 9 asks and answers as 13 does, except that a
/// failure comes as `Response::Error` without its kind, and 10 to 12 as 13 does; 9 and
/// 10 do not know `WriteThenSet`, none before 12 knows `Sync` (a mount asks
/// [`AgentClient::version`] before it sends one), and none before 13 answers a directory's
/// attributes with a change.
pub const OLDEST_ALIKE_VERSION: u8 = 9;

/// The version that brought [`Response::Failed`].
const FAILED_SINCE: u8 = 10;

/// The version that brought [`FsRequest::WriteThenSet`].
pub const WRITE_THEN_SET_SINCE: u8 = 11;

/// The version that brought [`FsRequest::Sync`]: the agent answers a mount of this
/// version on changes under its directory leases before they are committed.
pub const SYNC_SINCE: u8 = 12;

/// The version that brought [`FsRequest::Create`].
pub const CREATE_SINCE: u8 = 12;

/// The version that brought the directory's attributes with a change answered under its
/// lease ([`UnsyncedAnswer::DoneIn`], [`UnsyncedAnswer::EntryIn`]).
pub const PARENT_ATTRS_SINCE: u8 = 13;

/// DNS name that every node certificate carries and every agent verifies.
pub const NODE_TLS_NAME: &str = "shoal-node";

/// Where the agent listens by default, and the environment variable that overrides it for
/// the CLI.
pub const DEFAULT_SOCKET: &str = "/run/shoal/agent.sock";
pub const SOCKET_ENV: &str = "SHOAL_SOCKET";

/// A request from a local client to its agent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Request {
    /// Cluster membership as this agent sees it.
    Status,
    /// Erasure-code `data` into one stripe across the cluster (`ec`: e.g. "4+2"; the agent's
    /// default when None). Answered once every shard is durable.
    WriteStripe {
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
        ec: Option<shoal_placement::EcProfile>,
    },
    /// Read `len` bytes at `offset` of a stripe written before.
    ReadStripe {
        record: StripeRecord,
        offset: u64,
        len: u64,
    },
    /// A filesystem request from `shoal mount`.
    Fs(FsRequest),
    /// Moves process `pid` (the caller's `shoal mount`) into the agent's resource
    /// reservation, so the mount's buffers count against it.
    JoinReservation { pid: u32 },
    /// The local metadata replica's applied index and a digest of its state, read
    /// together: replicas at the same index must have the same digest.
    MetaDigest,
    /// Whether stopping node `node` (a name or a 16-hex-digit id) now keeps every stripe
    /// at k+1 available shards and the metadata group at a quorum: the one-node form of
    /// protocol 5 to 8, still answered (as `OkToStopNodes` of that one node).
    OkToStop { node: String },
    /// Drains node `node`: assesses what moves where and, unless `dry_run` or it cannot
    /// finish, marks it `draining`.
    Drain { node: String, dry_run: bool },
    /// Returns a draining or drained node to `active`.
    Undrain { node: String },
    /// Forgets a drained or out node.
    RemoveNode { node: String },
    /// Puts a node in maintenance for `for_ms` (`Some`), or ends its window (`None`).
    Maintenance { node: String, for_ms: Option<u64> },
    /// How the drains stand (every drain, or node `node`'s).
    DrainStatus { node: Option<String> },
    /// The cold tier's state.
    TierStatus,
    /// Sends these files (and everything below these directories) to the cold tier now.
    TierRelease { inos: Vec<Ino> },
    /// Brings these files (and everything below these directories) back to NVMe: before
    /// answering (`wait`), or in the background, answering at once.
    TierPrefetch { inos: Vec<Ino>, wait: bool },
    /// Keeps this file or directory (and everything below it) hot whatever the policy
    /// (`pinned`), or lets it go cold again.
    TierPin { ino: Ino, pinned: bool },
    /// Where a file's cold extents are.
    ColdExtents { ino: Ino },
    /// Revokes every certificate of the node named `name` issued before now, cluster-wide
    /// (answered with `Done`).
    RevokeCertificate { name: String },
    /// Whether stopping the nodes `nodes` (names or 16-hex-digit ids) together now keeps
    /// every stripe at k+1 available shards and the metadata group at a quorum.
    OkToStopNodes { nodes: Vec<String> },
}

/// The agent's answer to one [`Request`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Response {
    Status(Box<StatusReport>),
    StripeWritten(StripeRecord),
    StripeRead(StripeRead),
    Fs(FsResponse),
    /// JoinReservation: the cgroup the process now runs in, or None when the agent runs
    /// without a reservation.
    Joined(Option<String>),
    /// MetaDigest: the applied log index (None before the first apply) and the digest.
    MetaDigest {
        applied: Option<u64>,
        digest: u64,
    },
    /// A failure as protocol 3 to 9 answer it: the text for the operator alone. Sent only
    /// to clients of those versions (in place of `Failed`).
    Error(String),
    /// OkToStop: the assessment.
    OkToStop(Box<OkToStop>),
    /// Drain: what moves, and whether it started.
    Drain(Box<DrainPlan>),
    /// DrainStatus: every drain asked about.
    Drains(Vec<DrainProgress>),
    /// Undrain, RemoveNode, Maintenance, TierPin: done, in words.
    Done(String),
    /// TierStatus.
    Tier(Box<TierReport>),
    /// TierRelease, TierPrefetch: what moved.
    TierMoved(TierMoved),
    /// ColdExtents.
    ColdExtents(Vec<ColdExtent>),
    /// OkToStopNodes: the assessment.
    OkToStopNodes(Box<OkToStopNodes>),
    /// The request was understood but failed: why, as a kind and the text for the
    /// operator (protocol 10 on).
    Failed(Failure),
}

impl Request {
    /// The oldest protocol version that encodes this request and its answer as this
    /// version does (answers of a failure aside: [`Response::in_version`]): the status
    /// report only in this version (its fields grow with the versions); `MetaDigest` came
    /// with version 4, `OkToStop` with 5, the drain and maintenance requests with 6, the
    /// cold-tier requests with 7, `RevokeCertificate` with 8, `OkToStopNodes` with 9 and
    /// `FsRequest::WriteThenSet` with 11, `FsRequest::Sync` with 12; everything else is as version 3 had it. The agent refuses the request of an older
    /// client; a client falls back to an older agent's protocol only where it is alike.
    pub fn oldest_version(&self) -> u8 {
        match self {
            Request::Status => API_VERSION,
            Request::MetaDigest => 4,
            Request::OkToStop { .. } => 5,
            Request::Drain { .. }
            | Request::Undrain { .. }
            | Request::RemoveNode { .. }
            | Request::Maintenance { .. }
            | Request::DrainStatus { .. } => 6,
            Request::TierStatus
            | Request::TierRelease { .. }
            | Request::TierPrefetch { .. }
            | Request::TierPin { .. }
            | Request::ColdExtents { .. } => 7,
            Request::RevokeCertificate { .. } => 8,
            Request::OkToStopNodes { .. } => 9,
            Request::Fs(FsRequest::WriteThenSet { .. }) => WRITE_THEN_SET_SINCE,
            Request::Fs(FsRequest::Sync { .. }) => SYNC_SINCE,
            Request::WriteStripe { .. }
            | Request::ReadStripe { .. }
            | Request::Fs(_)
            | Request::JoinReservation { .. } => 3,
        }
    }
}

impl Response {
    /// This answer as a client of protocol `version` decodes it: a failure goes to a
    /// client of 3 to 9 as `Error`, its message alone.
    pub fn in_version(self, version: u8) -> Response {
        match self {
            Response::Failed(f) if version < FAILED_SINCE => Response::Error(f.message),
            other => other,
        }
    }

    /// The answer, or the failure it reports (of [`FailureKind::Unknown`] when an agent of
    /// protocol 9 or older sent it without a kind).
    pub fn into_result(self) -> Result<Response, Failure> {
        match self {
            Response::Failed(f) => Err(f),
            Response::Error(message) => Err(Failure::new(FailureKind::Unknown, message)),
            other => Ok(other),
        }
    }
}

impl frame::TrailingBytes for Request {
    fn split_trailing(&self) -> Option<(Self, &[u8])> {
        match self {
            Request::Fs(FsRequest::Write {
                id,
                ino,
                offset,
                data,
            }) => Some((
                Request::Fs(FsRequest::Write {
                    id: *id,
                    ino: *ino,
                    offset: *offset,
                    data: Vec::new(),
                }),
                data,
            )),
            Request::Fs(FsRequest::WriteThenSet {
                id,
                ino,
                set,
                offset,
                data,
            }) => Some((
                Request::Fs(FsRequest::WriteThenSet {
                    id: *id,
                    ino: *ino,
                    set: set.clone(),
                    offset: *offset,
                    data: Vec::new(),
                }),
                data,
            )),
            _ => None,
        }
    }
}

impl frame::TrailingBytes for Response {
    fn split_trailing(&self) -> Option<(Self, &[u8])> {
        match self {
            Response::Fs(FsResponse::Data(data)) => {
                Some((Response::Fs(FsResponse::Data(Vec::new())), data))
            }
            _ => None,
        }
    }

    fn only_data(data: Vec<u8>) -> Option<Self> {
        Some(Response::Fs(FsResponse::Data(data)))
    }

    fn only_data_prefix() -> Option<&'static [u8]> {
        static PREFIX: std::sync::OnceLock<Option<Vec<u8>>> = std::sync::OnceLock::new();
        PREFIX
            .get_or_init(|| frame::trailing_prefix(&Response::Fs(FsResponse::Data(Vec::new()))))
            .as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client of protocol 5 to 8 still asks `OkToStop` for one node and decodes the
    /// answer: its variant and the answer's fields keep their encoding.
    #[test]
    fn the_one_node_ok_to_stop_keeps_its_protocol_5_encoding() {
        let asked = postcard::to_allocvec(&Request::OkToStop { node: "n1".into() });
        assert_eq!(asked.expect("encode"), [6, 2, b'n', b'1']);
        let answer = Response::OkToStop(Box::new(OkToStop {
            node: "a".into(),
            name: "b".into(),
            ok: true,
            stripes_total: 1,
            ..OkToStop::default()
        }));
        assert_eq!(
            postcard::to_allocvec(&answer).expect("encode"),
            [7, 1, b'a', 1, b'b', 1, 1, 0, 0, 0, 0, 0, 0, 0]
        );
    }

    /// Clients of protocol 3 to 9 decode a failure as the text alone, at the place it
    /// always had; clients of 10 on get its kind too.
    #[test]
    fn a_failure_reaches_older_clients_as_its_text() {
        let failed = Response::Failed(Failure::new(FailureKind::NotFound, "no node \"x\""));
        assert_eq!(
            postcard::to_allocvec(&failed).expect("encode")[..2],
            [15, 0],
            "Failed, then the kind"
        );
        assert_eq!(failed.clone().in_version(API_VERSION), failed);
        for old in 3..FAILED_SINCE {
            let answer = failed.clone().in_version(old);
            assert_eq!(answer, Response::Error("no node \"x\"".into()), "{old}");
            assert_eq!(postcard::to_allocvec(&answer).expect("encode")[0], 6);
        }
        let done = Response::Done("ok".into());
        assert_eq!(done.clone().in_version(3), done);
    }

    /// A mount of protocol 12 decodes the lease answers it knows as they always were; the
    /// ones with the directory's attributes come after them (sent to 13 on only).
    #[test]
    fn lease_answers_keep_their_encoding_and_carry_the_directory_only_when_new() {
        let unsynced = |a: UnsyncedAnswer| {
            postcard::to_allocvec(&Response::Fs(FsResponse::Unsynced(a))).expect("encode")
        };
        let done = unsynced(UnsyncedAnswer::Done);
        let prefix = done[..done.len() - 1].to_vec();
        assert_eq!(done[done.len() - 1], 0, "Done is the first");
        let file = FileAttr {
            ino: 8,
            kind: FileKind::File,
            perm: 0o644,
            nlink: 1,
            uid: 0,
            gid: 0,
            size: 0,
            atime: Timestamp::default(),
            mtime: Timestamp::default(),
            ctime: Timestamp::default(),
            rdev: 0,
        };
        let dir = FileAttr {
            ino: 5,
            kind: FileKind::Dir,
            nlink: 3,
            ..file.clone()
        };
        let entry_in = UnsyncedAnswer::Entry(file.clone()).with_parent(dir.clone());
        assert_eq!(entry_in.parent(), Some(&dir));
        assert_eq!(
            entry_in.clone().into_response(),
            FsResponse::Entry(file.clone())
        );
        let done_in = UnsyncedAnswer::Done.with_parent(dir.clone());
        assert_eq!(done_in.clone().into_response(), FsResponse::Done);
        assert_eq!(UnsyncedAnswer::Entry(file.clone()).parent(), None);
        let attr = UnsyncedAnswer::Attr(file.clone());
        assert_eq!(
            attr.clone().with_parent(dir),
            attr,
            "a setattr's answer stays"
        );
        let done_in = unsynced(done_in);
        assert_eq!(done_in[..prefix.len()], prefix[..]);
        assert_eq!(done_in[prefix.len()], 3, "after Done, Attr and Entry");
        assert_eq!(unsynced(entry_in)[prefix.len()], 4);
    }

    #[test]
    fn an_answer_splits_into_success_or_failure() {
        let done = Response::Done("ok".into());
        assert_eq!(done.clone().into_result(), Ok(done));
        let kinded = Failure::new(FailureKind::Refused, "refused: still running");
        assert_eq!(Response::Failed(kinded.clone()).into_result(), Err(kinded));
        assert_eq!(
            Response::Error("old".into()).into_result(),
            Err(Failure::new(FailureKind::Unknown, "old"))
        );
    }
}
