//! Why a stripe could not be written, read or deleted, with whether trying again may help.

use shoal_agent_api::{FailureKind, RecordError};
use shoal_placement::{EcProfile, NodeId, PlacementError, StripeId};

use super::erasure::ErasureError;
use super::shard_rpc::ShardFailure;

/// One shard that could not be stored, deleted or read, and why (the holder's class).
#[derive(Clone, Debug)]
pub struct ShardFault {
    pub index: u8,
    pub node: NodeId,
    /// The node's name, for messages (empty when not known).
    pub name: String,
    pub kind: ShardFailure,
    pub message: String,
}

impl std::fmt::Display for ShardFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match self.kind {
            ShardFailure::Full => "node full",
            ShardFailure::Corrupt => "corrupt",
            ShardFailure::NotFound => "not found",
            ShardFailure::Other => "failed",
            ShardFailure::Unsupported => "not understood by that node's release",
        };
        write!(
            f,
            "shard {} on {} ({}): {what}: {}",
            self.index, self.name, self.node, self.message
        )
    }
}

/// A list of faults, shown one after the other.
#[derive(Clone, Debug)]
pub struct ShardFaults(pub Vec<ShardFault>);

impl std::fmt::Display for ShardFaults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = self.0.iter().map(ToString::to_string).collect();
        f.write_str(&parts.join("; "))
    }
}

/// What the stripe coordinator can fail at.
#[derive(Debug, thiserror::Error)]
pub enum StripeError {
    /// The profile or the data's size make no stripe (a caller's error).
    #[error("stripe geometry: {0}")]
    Geometry(PlacementError),
    /// Placement found too few nodes that take new shards (more may come back).
    #[error("stripe placement: {0}")]
    Placement(PlacementError),
    /// No k+m nodes with room for the stripe.
    #[error("cluster full: no room for a {ec} stripe (node full: {full}; {reason})")]
    NoSpace {
        ec: EcProfile,
        /// Names of the nodes without room.
        full: String,
        reason: PlacementError,
    },
    /// Fewer live nodes take shards than a stripe must be written with: waiting will not
    /// help until nodes come back.
    #[error(
        "a {ec} stripe needs at least {need} nodes that take shards ([storage] min_write_shards); {alive} are alive"
    )]
    TooFewNodes {
        ec: EcProfile,
        need: usize,
        alive: usize,
    },
    /// Some shards could not be stored; the stored ones were deleted again.
    #[error("stripe write failed: {0}")]
    NotStored(ShardFaults),
    /// A shard could not be deleted (its node down, say); tried again later.
    #[error("stripe {stripe} not deleted: {faults}")]
    NotDeleted {
        stripe: StripeId,
        faults: ShardFaults,
    },
    /// Fewer than k shards could be read.
    #[error("stripe {stripe} unreadable: {source}")]
    Unreadable {
        stripe: StripeId,
        source: ErasureError,
        /// Some shard could not be read for a reason that may pass (its holder did not
        /// answer); false when every missing shard is corrupt, missing or not found.
        transient: bool,
    },
    /// The record cannot be read as it says (from a damaged or hostile source).
    #[error(transparent)]
    BadRecord(#[from] RecordError),
    /// A range outside the stripe.
    #[error("range {offset}+{len} is outside stripe {stripe} of {size} bytes")]
    OutOfRange {
        stripe: StripeId,
        offset: u64,
        len: u64,
        size: u64,
    },
    /// A rebuilt shard does not match the checksum its record holds (the sources decoded
    /// to other bytes than were written): nothing is stored.
    #[error("stripe {stripe}: rebuilt shard {index} does not match its recorded checksum")]
    RebuildMismatch { stripe: StripeId, index: u8 },
    /// Encoding failed.
    #[error("erasure coding: {0}")]
    Erasure(#[from] ErasureError),
    /// Membership (who is alive) could not be read.
    #[error(transparent)]
    Mesh(#[from] shoal_mesh::MeshError),
    /// The local replica (the layout) could not be read.
    #[error("cluster layout: {0}")]
    Layout(#[from] shoal_namespace::NamespaceError),
    /// This node's own store failed.
    #[error(transparent)]
    Store(#[from] shoal_store::StoreError),
    /// A task of the coordinator failed, or the agent is stopping.
    #[error("stripe task: {0}")]
    Task(#[from] tokio::task::JoinError),
    /// The agent is shutting down.
    #[error("the agent is shutting down")]
    Stopped,
}

impl StripeError {
    /// Whether the same request may succeed a little later (nodes come back or are
    /// declared down, a leader is elected); never for corruption or a caller's error.
    pub fn is_retryable(&self) -> bool {
        match self {
            StripeError::Placement(e) => e.is_retryable(),
            StripeError::NotStored(f) | StripeError::NotDeleted { faults: f, .. } => {
                f.0.iter().all(|s| s.kind == ShardFailure::Other)
            }
            StripeError::Unreadable { transient, .. } => *transient,
            StripeError::Mesh(e) => e.is_retryable(),
            // A panic is not retried; a task cancelled by a stop is.
            StripeError::Task(e) => e.is_cancelled(),
            StripeError::Geometry(_)
            | StripeError::TooFewNodes { .. }
            | StripeError::NoSpace { .. }
            | StripeError::BadRecord(_)
            | StripeError::OutOfRange { .. }
            | StripeError::Erasure(_)
            | StripeError::RebuildMismatch { .. }
            | StripeError::Layout(_)
            | StripeError::Store(_)
            | StripeError::Stopped => false,
        }
    }

    /// Whether the cluster has no room (the mount answers ENOSPC).
    pub fn is_no_space(&self) -> bool {
        matches!(self, StripeError::NoSpace { .. })
    }

    /// The kind of failure an operator's request gets (`shoal bench stripes`, say).
    pub fn kind(&self) -> FailureKind {
        match self {
            StripeError::NoSpace { .. } => FailureKind::NoSpace,
            StripeError::Geometry(_)
            | StripeError::BadRecord(_)
            | StripeError::OutOfRange { .. } => FailureKind::Invalid,
            // Not retried by a mount (nodes must come back first), but a matter of the
            // cluster's state, not of the request.
            StripeError::TooFewNodes { .. } => FailureKind::Unavailable,
            StripeError::Layout(e) => crate::failure::namespace_kind(e),
            StripeError::Store(e) => crate::failure::store_kind(e),
            StripeError::Mesh(e) => crate::failure::mesh_kind(e),
            StripeError::Placement(_)
            | StripeError::NotStored(_)
            | StripeError::NotDeleted { .. }
            | StripeError::Unreadable { .. }
            | StripeError::Task(_)
            | StripeError::Erasure(_)
            | StripeError::RebuildMismatch { .. }
            | StripeError::Stopped => {
                if self.is_retryable() {
                    FailureKind::Unavailable
                } else {
                    FailureKind::Internal
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fault(kind: ShardFailure) -> ShardFault {
        ShardFault {
            index: 1,
            node: NodeId(2),
            name: "n2".into(),
            kind,
            message: "x".into(),
        }
    }

    #[test]
    fn only_transient_failures_are_retried() {
        let unreachable = StripeError::NotStored(ShardFaults(vec![fault(ShardFailure::Other)]));
        assert!(unreachable.is_retryable());
        let corrupt = StripeError::NotStored(ShardFaults(vec![
            fault(ShardFailure::Other),
            fault(ShardFailure::Corrupt),
        ]));
        assert!(
            !corrupt.is_retryable(),
            "corruption is not retried for 30 s"
        );
        let geometry = StripeError::Geometry(PlacementError::StripeTooLong { len: 9, max: 8 });
        assert!(!geometry.is_retryable());
        let few = StripeError::Placement(PlacementError::NotEnoughNodes { need: 6, have: 5 });
        assert!(few.is_retryable());
        let unreadable = |transient| StripeError::Unreadable {
            stripe: StripeId(1),
            source: ErasureError::TooFewShards {
                present: 1,
                total: 3,
                need: 2,
            },
            transient,
        };
        assert!(
            unreadable(true).is_retryable(),
            "holders may be back in a moment"
        );
        assert!(
            !unreadable(false).is_retryable(),
            "corrupt shards stay corrupt: not retried for --retry-for"
        );
        assert_eq!(
            fault(ShardFailure::Full).to_string(),
            "shard 1 on n2 (0000000000000002): node full: x"
        );
    }
}

#[cfg(test)]
mod class_tests {
    use shoal_agent_api::FailureKind;
    use shoal_mesh::MeshError;

    use super::StripeError;

    fn peer() -> std::net::SocketAddr {
        "127.0.0.1:7947".parse().expect("addr")
    }

    /// Membership or a peer's answer: retried exactly when the mesh says so.
    #[test]
    fn a_mesh_failure_is_retried_only_when_the_mesh_says_so() {
        let timeout = StripeError::Mesh(MeshError::RpcTimeout {
            endpoint: "shard",
            peer: peer(),
        });
        assert!(timeout.is_retryable());
        assert_eq!(timeout.kind(), FailureKind::Unavailable);
        for lasting in [
            MeshError::RpcDecode("garbage".into()),
            MeshError::MessageTooLarge {
                endpoint: "shard",
                bytes: 20 << 20,
                max: 16 << 20,
            },
            MeshError::RpcRemote {
                endpoint: "shard",
                peer: peer(),
                class: shoal_mesh::FailureClass::Corrupt,
                message: "bad shard".into(),
            },
        ] {
            assert!(!lasting.is_retryable(), "{lasting}");
            let e = StripeError::Mesh(lasting);
            assert!(!e.is_retryable(), "{e}");
            assert_eq!(e.kind(), FailureKind::Internal, "{e}");
        }
        let refused_for_now = StripeError::Mesh(MeshError::RpcRemote {
            endpoint: "shard",
            peer: peer(),
            class: shoal_mesh::FailureClass::Retryable,
            message: "busy".into(),
        });
        assert!(refused_for_now.is_retryable());
    }
}

#[cfg(test)]
mod task_tests {
    use super::StripeError;

    #[tokio::test]
    async fn a_panicked_task_is_not_retried_and_a_cancelled_one_is() {
        let panicked = tokio::spawn(async { panic!("a bug") })
            .await
            .expect_err("panicked");
        assert!(!StripeError::Task(panicked).is_retryable());
        let slow = tokio::spawn(std::future::pending::<()>());
        slow.abort();
        let cancelled = slow.await.expect_err("cancelled");
        assert!(StripeError::Task(cancelled).is_retryable());
    }
}
