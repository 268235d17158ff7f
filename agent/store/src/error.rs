use std::path::PathBuf;

use crate::ShardKey;

/// What the shard store can fail at.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No such shard here.
    #[error("shard {0} not found")]
    NotFound(ShardKey),
    /// The shard exists with different content (shards are immutable).
    #[error("shard {0} already exists with different content")]
    Conflict(ShardKey),
    /// Writing would cross the store's fill limit.
    #[error("node full: {need} more bytes would exceed the fill limit ({used} of {limit} used)")]
    Full { need: u64, used: u64, limit: u64 },
    /// Writing would leave less than the reserve free on the store's filesystem (other
    /// users of the filesystem have filled it).
    #[error(
        "node full: {need} more bytes would leave less than the {reserve}-byte reserve free on the filesystem ({free} free)"
    )]
    NoRoom { need: u64, free: u64, reserve: u64 },
    /// The shard's bytes do not match its checksum, or its header is damaged.
    #[error("shard {key} is corrupt: {reason}")]
    Corrupt { key: ShardKey, reason: String },
    /// A read outside the shard's data.
    #[error("range {offset}+{len:?} is outside shard {key} of {size} bytes")]
    OutOfRange {
        key: ShardKey,
        offset: u64,
        len: Option<u64>,
        size: u64,
    },
    /// An I/O operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    /// The redb index failed.
    #[error("shard index: {0}")]
    Index(String),
    /// The io_uring ring thread is gone.
    #[error("io_uring ring thread stopped")]
    RingStopped,
}

impl StoreError {
    /// Whether the caller should try the shard elsewhere (a degraded read) rather than fail.
    pub fn is_shard_unavailable(&self) -> bool {
        matches!(
            self,
            StoreError::NotFound(_) | StoreError::Corrupt { .. } | StoreError::Io { .. }
        )
    }
}
