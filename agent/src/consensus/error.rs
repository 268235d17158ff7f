//! What the metadata group member can fail at, with whether trying again may help.

use std::path::PathBuf;

use shoal_agent_api::FailureKind;
use shoal_namespace::{NamespaceError, Outcome};

use super::net::ForwardRefused;

/// An error from openraft, kept whole for its message and source chain.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, thiserror::Error)]
pub enum ConsensusError {
    /// The Raft log could not be opened (or moved out of an earlier release's file).
    #[error("metadata log {path}: {source}")]
    Log {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The member's directory in the data dir could not be used.
    #[error("data dir {path}: {source}")]
    DataDir {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Gossip or the transport failed (publishing this member's facts, say).
    #[error(transparent)]
    Mesh(#[from] shoal_mesh::MeshError),
    /// The local replica (the namespace state machine) failed.
    #[error(transparent)]
    Namespace(#[from] NamespaceError),
    /// openraft refused its configuration or could not start.
    #[error("metadata group setup: {0}")]
    Setup(BoxError),
    /// No leader committed the proposals (or served the read) within the wait: the group
    /// has no quorum, or is electing. They may still commit later.
    #[error("no metadata leader within {waited_s} s (last answer: {last:?})")]
    NoLeader {
        waited_s: u64,
        last: Option<ForwardRefused>,
    },
    /// This node belongs to no metadata group yet: the group has not formed (fewer agents
    /// than `bootstrap_expect` seen, say), or has not added this node. `why` says which.
    #[error("{why}")]
    NotMember { why: String },
    /// A change of the group's membership failed.
    #[error("changing the metadata group's members ({what}): {source}")]
    Membership {
        what: &'static str,
        source: BoxError,
    },
    /// This node's Raft failed an operation (it stopped, say).
    #[error("metadata raft {op}: {source}")]
    Raft { op: &'static str, source: BoxError },
    /// The leader answered with another number of outcomes than proposals.
    #[error("the leader answered {got} outcomes for {sent} proposals")]
    OutcomeCount { sent: usize, got: usize },
    /// A proposal came back with an outcome its caller did not expect.
    #[error("unexpected outcome {0:?}")]
    UnexpectedOutcome(Box<Outcome>),
    /// A stored applied marker did not decode.
    #[error("applied marker: {0}")]
    Marker(#[from] postcard::Error),
    /// A blocking task failed.
    #[error("metadata task: {0}")]
    Task(#[from] tokio::task::JoinError),
    /// This node's metadata member stopped on a storage failure (its log could not be
    /// written); the agent restarts it.
    #[error("this node's metadata member failed: {0}")]
    MemberFailed(String),
}

impl ConsensusError {
    /// Whether the same request may succeed a little later (after an election).
    pub fn is_retryable(&self) -> bool {
        match self {
            ConsensusError::NoLeader { .. }
            | ConsensusError::NotMember { .. }
            | ConsensusError::Membership { .. }
            | ConsensusError::MemberFailed(_) => true,
            // A panic is a bug, not worth the mount's `--retry-for`; a task cancelled by a
            // stop is retried (the agent comes back).
            ConsensusError::Task(e) => e.is_cancelled(),
            ConsensusError::Mesh(e) => e.is_retryable(),
            _ => false,
        }
    }

    /// The kind of failure an operator's request gets: the replica's own answers keep
    /// their class, what may pass is unavailable, anything else internal.
    pub fn kind(&self) -> FailureKind {
        match self {
            ConsensusError::Namespace(e) => crate::failure::namespace_kind(e),
            ConsensusError::Mesh(e) => crate::failure::mesh_kind(e),
            e if e.is_retryable() => FailureKind::Unavailable,
            _ => FailureKind::Internal,
        }
    }
}

impl crate::worker::WorkError for ConsensusError {
    fn is_retryable(&self) -> bool {
        ConsensusError::is_retryable(self)
    }
}

impl ConsensusError {
    pub(crate) fn raft(
        op: &'static str,
        e: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        ConsensusError::Raft {
            op,
            source: Box::new(e),
        }
    }

    pub(crate) fn membership(
        what: &'static str,
        e: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        ConsensusError::Membership {
            what,
            source: Box::new(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use shoal_agent_api::{FailureKind, FsError};

    use super::ConsensusError;

    #[tokio::test]
    async fn a_panicked_task_is_not_retried() {
        let panicked = tokio::spawn(async { panic!("a bug") })
            .await
            .expect_err("panicked");
        let e = ConsensusError::Task(panicked);
        assert!(!e.is_retryable());
        assert_eq!(
            e.kind(),
            FailureKind::Internal,
            "a panic is a bug to look at"
        );
    }

    #[tokio::test]
    async fn a_task_cancelled_by_a_stop_is_retried() {
        let slow = tokio::spawn(std::future::pending::<()>());
        slow.abort();
        let cancelled = slow.await.expect_err("cancelled");
        let e = ConsensusError::Task(cancelled);
        assert!(e.is_retryable(), "the agent comes back");
        assert_eq!(e.kind(), FailureKind::Unavailable);
    }

    #[test]
    fn no_leader_is_retried_and_the_replicas_answer_keeps_its_class() {
        let no_leader = ConsensusError::NoLeader {
            waited_s: 10,
            last: None,
        };
        assert!(no_leader.is_retryable());
        assert_eq!(no_leader.kind(), FailureKind::Unavailable);
        let missing = ConsensusError::Namespace(FsError::NotFound.into());
        assert!(!missing.is_retryable());
        assert_eq!(missing.kind(), FailureKind::NotFound);
        let count = ConsensusError::OutcomeCount { sent: 2, got: 1 };
        assert!(!count.is_retryable());
        assert_eq!(count.kind(), FailureKind::Internal);
    }

    #[test]
    fn outside_the_group_or_with_a_failed_member_is_retried() {
        // The group forms, or the leader adds this node, a little later.
        let outside = ConsensusError::NotMember {
            why: "not in a metadata group yet".into(),
        };
        assert!(outside.is_retryable());
        assert_eq!(outside.kind(), FailureKind::Unavailable);
        // The agent restarts a member that stopped on a storage failure.
        let failed = ConsensusError::MemberFailed("log write failed".into());
        assert!(failed.is_retryable());
        assert_eq!(failed.kind(), FailureKind::Unavailable);
        // A membership change refused now (another one under way) may pass later.
        let busy = ConsensusError::membership("add learner", std::io::Error::other("in progress"));
        assert!(busy.is_retryable());
        assert_eq!(busy.kind(), FailureKind::Unavailable);
    }

    #[test]
    fn a_broken_log_a_bad_marker_or_an_unexpected_answer_is_not_retried() {
        let log = ConsensusError::Log {
            path: "/data/meta/log".into(),
            source: std::io::Error::other("EIO"),
        };
        let raft = ConsensusError::raft("client_write", std::io::Error::other("stopped"));
        let marker = ConsensusError::Marker(postcard::Error::DeserializeUnexpectedEnd);
        let odd = ConsensusError::UnexpectedOutcome(Box::new(shoal_namespace::Outcome::Done));
        for e in [log, raft, marker, odd] {
            assert!(!e.is_retryable(), "{e}");
            assert_eq!(e.kind(), FailureKind::Internal, "{e}");
        }
    }
}
