use std::path::PathBuf;

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
    /// A file in the data dir is damaged.
    #[error("{path} is damaged: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    /// The admin socket could not be set up.
    #[error("admin socket {path}: {reason}")]
    AdminSocket { path: PathBuf, reason: String },
    /// A listening socket could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: String,
        source: std::io::Error,
    },
    /// The resource reservation was refused or could not be applied.
    #[error(transparent)]
    Guard(#[from] shoal_resource_guard::GuardError),
    /// Some other local resource (a thread) could not be set up.
    #[error("{0}")]
    Io(String),
    /// A stripe could not be written or read.
    #[error("{0}")]
    Stripe(String),
    /// A shard could not be written because its node is full.
    #[error("{0}")]
    NoSpace(String),
    /// The metadata service failed.
    #[error("metadata: {0}")]
    Meta(String),
    /// The shard store failed to open.
    #[error(transparent)]
    Store(#[from] shoal_store::StoreError),
    /// Membership or transport failed.
    #[error(transparent)]
    Mesh(#[from] shoal_mesh::MeshError),
}

impl AgentError {
    /// Maps a mesh config error to the agent's own, keeping the key name.
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
