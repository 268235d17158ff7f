//! The agent's error type. Each crate has one `thiserror` enum, with `is_retryable()` where
//! callers retry (`AgentError`, `ConsensusError`, `StripeError` with per-shard faults and
//! their class, `MeshError`, `TierError`, `PlacementError`, `ApiError`). A wrapped error
//! keeps its inner class (`StripeError::Mesh` retries as the `MeshError` says); a panicked
//! task is never retried, a cancelled one (a stop) is. The write path retries a stripe
//! write only while `StripeError::is_retryable` (never corruption or a bad geometry).
//!
//! An operator's request that fails is answered `Failed` with a `FailureKind` from the
//! cause ([`AgentError::kind`]): `not-found`, `refused`, `invalid`, `unavailable`,
//! `no-space`, `internal` (`unknown` only in answers of agents of protocol 9 or older).

use std::path::PathBuf;

use shoal_agent_api::FailureKind;

use crate::failure::{mesh_kind, namespace_kind, store_kind, tier_kind};

/// Why the agent could not start or keep running.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The config file could not be read.
    #[error("cannot read config {path}: {source}")]
    ConfigRead {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The config file is not valid TOML for the agent's schema (unknown or mistyped key).
    #[error("invalid config {path}: {message}")]
    ConfigParse { path: PathBuf, message: String },
    /// A config value is impossible; `key` is its full TOML path.
    #[error("config key {key}: {reason}")]
    ConfigValue { key: String, reason: String },
    /// The data dir could not be used.
    #[error("data dir {path}: {source}")]
    DataDir {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The node certificate names another node than the data dir holds.
    #[error(
        "{} belongs to node {data}, but the node certificate ([tls] node_cert) is node {certified}'s: issue this node's certificate with `shoal cert issue --node-id {data}`",
        data_dir.display()
    )]
    CertificateOfAnotherNode {
        data_dir: PathBuf,
        data: shoal_mesh::NodeId,
        certified: shoal_mesh::NodeId,
    },
    /// A file in the data dir is damaged.
    #[error("{path} is damaged: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    /// The admin socket could not be set up.
    #[error("admin socket {path}: {reason}")]
    AdminSocket { path: PathBuf, reason: String },
    /// Another process answers on the admin socket.
    #[error("admin socket {path}: another agent is serving this socket")]
    AdminSocketInUse { path: PathBuf },
    /// A listening socket could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: String,
        source: std::io::Error,
    },
    /// A listening socket's accept failed (out of descriptors, say): the server tries
    /// again a moment later.
    #[error("{what}: accept failed: {source}")]
    Accept {
        what: &'static str,
        source: std::io::Error,
    },
    /// The resource reservation was refused or could not be applied.
    #[error(transparent)]
    Guard(#[from] shoal_resource_guard::GuardError),
    /// A thread or another local resource could not be set up.
    #[error("cannot set up {what}: {source}")]
    Setup {
        what: &'static str,
        source: std::io::Error,
    },
    /// A stripe could not be written, read or deleted.
    #[error(transparent)]
    Stripe(#[from] crate::data::StripeError),
    /// The metadata group could not serve.
    #[error(transparent)]
    Consensus(#[from] crate::consensus::ConsensusError),
    /// The local metadata replica failed.
    #[error("metadata replica: {0}")]
    Namespace(#[from] shoal_namespace::NamespaceError),
    /// The shard store failed.
    #[error(transparent)]
    Store(#[from] shoal_store::StoreError),
    /// Membership or transport failed.
    #[error(transparent)]
    Mesh(#[from] shoal_mesh::MeshError),
    /// The cold tier's store failed.
    #[error("cold tier: {0}")]
    Tier(#[from] shoal_tiering::TierError),
    /// An operator's request names something this cluster does not have.
    #[error("{0}")]
    NoSuch(String),
    /// An operator's change the node's state does not allow, or that could not finish;
    /// the text says why, with the numbers.
    #[error("refused: {0}")]
    Refused(String),
    /// An operator's request that is wrong as asked (an argument missing, a feature this
    /// agent is not configured for).
    #[error("{0}")]
    Invalid(String),
    /// The metadata declined an operator's command about `what` (an inode that is not
    /// there, say); `error` is its answer.
    #[error("{what}: {error}")]
    Declined {
        what: String,
        error: shoal_agent_api::FsError,
    },
    /// The cluster cannot serve an operator's request yet (it has no layout, the node
    /// named is not in it yet); it may a little later.
    #[error("{0}")]
    NotYet(String),
}

impl AgentError {
    /// Whether the failed operation may succeed if tried again a little later.
    pub fn is_retryable(&self) -> bool {
        match self {
            AgentError::Stripe(e) => e.is_retryable(),
            AgentError::Consensus(e) => e.is_retryable(),
            AgentError::Mesh(e) => e.is_retryable(),
            AgentError::Tier(e) => e.is_retryable(),
            AgentError::NotYet(_) | AgentError::Accept { .. } => true,
            _ => false,
        }
    }

    /// The kind of failure an operator's request gets for this error, from its cause (a
    /// wrapped error by its own class): what the admin socket answers with.
    pub fn kind(&self) -> FailureKind {
        match self {
            AgentError::NoSuch(_) => FailureKind::NotFound,
            AgentError::Refused(_) => FailureKind::Refused,
            AgentError::Invalid(_) => FailureKind::Invalid,
            AgentError::NotYet(_) => FailureKind::Unavailable,
            AgentError::Declined { error, .. } => error.kind(),
            AgentError::Stripe(e) => e.kind(),
            AgentError::Consensus(e) => e.kind(),
            AgentError::Namespace(e) => namespace_kind(e),
            AgentError::Store(e) => store_kind(e),
            AgentError::Mesh(e) => mesh_kind(e),
            AgentError::Tier(e) => tier_kind(e),
            AgentError::ConfigRead { .. }
            | AgentError::ConfigParse { .. }
            | AgentError::ConfigValue { .. }
            | AgentError::DataDir { .. }
            | AgentError::CertificateOfAnotherNode { .. }
            | AgentError::Corrupt { .. }
            | AgentError::AdminSocket { .. }
            | AgentError::AdminSocketInUse { .. }
            | AgentError::Listen { .. }
            | AgentError::Accept { .. }
            | AgentError::Guard(_)
            | AgentError::Setup { .. } => FailureKind::Internal,
        }
    }

    /// Whether a socket this agent binds is held by another process (for a moment after a
    /// crash, by this agent's previous instance while its last threads exit).
    pub fn is_addr_in_use(&self) -> bool {
        let in_use = |e: &std::io::Error| e.kind() == std::io::ErrorKind::AddrInUse;
        match self {
            AgentError::Mesh(shoal_mesh::MeshError::Bind { source, .. })
            | AgentError::Listen { source, .. } => in_use(source),
            AgentError::AdminSocketInUse { .. } => true,
            _ => false,
        }
    }

    /// Maps a resource-guard config error to the agent's own, keeping the key name.
    pub(crate) fn from_guard(e: shoal_resource_guard::GuardError) -> Self {
        match e {
            shoal_resource_guard::GuardError::Config { key, reason } => AgentError::ConfigValue {
                key: key.to_owned(),
                reason,
            },
            other => AgentError::Guard(other),
        }
    }

    pub(crate) fn from_config(e: shoal_mesh::MeshError) -> Self {
        match e {
            shoal_mesh::MeshError::Config { key, reason } => AgentError::ConfigValue {
                key: key.to_owned(),
                reason,
            },
            other => AgentError::Mesh(other),
        }
    }
}

impl crate::worker::WorkError for AgentError {
    fn is_retryable(&self) -> bool {
        AgentError::is_retryable(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_address_held_elsewhere_is_worth_binding_again() {
        let io = |kind| std::io::Error::from(kind);
        let listen = |kind| AgentError::Listen {
            addr: "127.0.0.1:9464".into(),
            source: io(kind),
        };
        assert!(listen(std::io::ErrorKind::AddrInUse).is_addr_in_use());
        assert!(!listen(std::io::ErrorKind::PermissionDenied).is_addr_in_use());
        let quic = AgentError::Mesh(shoal_mesh::MeshError::Bind {
            addr: "127.0.0.1:7947".parse().expect("addr"),
            source: io(std::io::ErrorKind::AddrInUse),
        });
        assert!(quic.is_addr_in_use());
        assert!(AgentError::AdminSocketInUse { path: "/s".into() }.is_addr_in_use());
        assert!(!AgentError::NoSuch("x".into()).is_addr_in_use());
    }

    #[test]
    fn an_operators_error_has_the_kind_of_its_cause() {
        use shoal_agent_api::FsError;
        let kinds = [
            (
                AgentError::NoSuch("no node \"x\"".into()),
                FailureKind::NotFound,
            ),
            (
                AgentError::Refused("still running".into()),
                FailureKind::Refused,
            ),
            (
                AgentError::Invalid("a node name is needed".into()),
                FailureKind::Invalid,
            ),
            (
                AgentError::NotYet("no layout yet".into()),
                FailureKind::Unavailable,
            ),
            (
                AgentError::Declined {
                    what: "inode 9".into(),
                    error: FsError::NotFound,
                },
                FailureKind::NotFound,
            ),
            (
                AgentError::Namespace(shoal_namespace::NamespaceError::Corrupt("x".into())),
                FailureKind::Internal,
            ),
            (
                AgentError::Tier(shoal_tiering::TierError::TimedOut(
                    std::time::Duration::from_secs(1),
                )),
                FailureKind::Unavailable,
            ),
            (
                AgentError::Tier(shoal_tiering::TierError::Refused("403".into())),
                FailureKind::Internal,
            ),
            (
                AgentError::Mesh(shoal_mesh::MeshError::GossipStopped),
                FailureKind::Internal,
            ),
            (
                AgentError::Consensus(crate::consensus::ConsensusError::NoLeader {
                    waited_s: 5,
                    last: None,
                }),
                FailureKind::Unavailable,
            ),
            (
                AgentError::Stripe(crate::data::StripeError::TooFewNodes {
                    ec: "4+2".parse().expect("ec"),
                    need: 5,
                    alive: 3,
                }),
                FailureKind::Unavailable,
            ),
        ];
        for (e, kind) in kinds {
            assert_eq!(e.kind(), kind, "{e}");
        }
        // Retried exactly where the kind says the cluster may answer later, and the
        // nested error's class is kept.
        assert!(AgentError::NotYet("no layout yet".into()).is_retryable());
        assert!(!AgentError::Refused("still running".into()).is_retryable());
        let mesh_lasting = AgentError::Stripe(crate::data::StripeError::Mesh(
            shoal_mesh::MeshError::RpcDecode("x".into()),
        ));
        assert!(!mesh_lasting.is_retryable());
        assert_eq!(mesh_lasting.kind(), FailureKind::Internal);
    }
}
