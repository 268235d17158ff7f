//! The Raft type configuration of the metadata group, and the marker stored with the
//! state machine.

use std::io::Cursor;

use openraft::{BasicNode, LogId, StoredMembership};
use serde::{Deserialize, Serialize};
use shoal_namespace::{Batch, Outcome};

openraft::declare_raft_types!(
    /// The metadata Raft group: entries carry batches of namespace commands; node ids are
    /// shoal node ids; a node's address is its RPC (QUIC) address.
    pub MetaRaft:
        D = Batch,
        R = Vec<Outcome>,
        NodeId = u64,
        Node = BasicNode,
        SnapshotData = Cursor<Vec<u8>>,
);

pub type Raft = openraft::Raft<MetaRaft>;
pub type StorageError = openraft::StorageError<u64>;
pub type Entry = openraft::Entry<MetaRaft>;
pub type Membership = StoredMembership<u64, BasicNode>;

/// What the state machine stores beside the namespace: how far the log has been applied,
/// and the membership in force there. Versioned like every on-disk record.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct AppliedMarker {
    pub version: u8,
    pub last_applied: Option<LogId<u64>>,
    pub membership: Membership,
}

/// Wraps a storage failure the way openraft expects (it stops the node on any of them).
pub fn storage_error(
    subject: openraft::ErrorSubject<u64>,
    verb: openraft::ErrorVerb,
    e: impl std::fmt::Display,
) -> StorageError {
    StorageError::from_io_error(subject, verb, std::io::Error::other(e.to_string()))
}
