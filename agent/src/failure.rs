//! The failure class ([`FailureKind`]) of the errors of the crates the agent builds on:
//! each error enum of the agent keeps its cause's class through these (an operator's
//! answer and the mount's retries follow it; see `error.rs`).

use shoal_agent_api::FailureKind;

/// The local replica's failures: its own answers (no such inode) keep their class; a
/// failure of its storage is internal.
pub fn namespace_kind(e: &shoal_namespace::NamespaceError) -> FailureKind {
    match e {
        shoal_namespace::NamespaceError::Fs(e) => e.kind(),
        _ => FailureKind::Internal,
    }
}

/// Membership and transport: what may pass (a peer unreachable or busy) is unavailable, a
/// peer without room no space, anything else internal.
pub fn mesh_kind(e: &shoal_mesh::MeshError) -> FailureKind {
    use shoal_mesh::{FailureClass, MeshError};
    match e {
        e if e.is_retryable() => FailureKind::Unavailable,
        MeshError::RpcRemote {
            class: FailureClass::NoSpace,
            ..
        } => FailureKind::NoSpace,
        _ => FailureKind::Internal,
    }
}

/// This node's shard store: full is no space, anything else internal.
pub fn store_kind(e: &shoal_store::StoreError) -> FailureKind {
    match e {
        shoal_store::StoreError::Full { .. } | shoal_store::StoreError::NoRoom { .. } => {
            FailureKind::NoSpace
        }
        _ => FailureKind::Internal,
    }
}

/// The cold tier's store: an outage may pass, a missing object is not found, a refusal
/// (credentials, bucket) or a bad configuration needs a person.
pub fn tier_kind(e: &shoal_tiering::TierError) -> FailureKind {
    match e {
        e if e.is_retryable() => FailureKind::Unavailable,
        shoal_tiering::TierError::NotFound(_) => FailureKind::NotFound,
        _ => FailureKind::Internal,
    }
}
