use shoal_agent_api::FsError;

/// What the metadata state machine can fail at.
#[derive(Debug, thiserror::Error)]
pub enum MetaError {
    /// The namespace's answer to a query or command (e.g. no such name).
    #[error(transparent)]
    Fs(#[from] FsError),
    /// The redb database failed; the state on disk is as of the last committed apply.
    #[error("metadata storage: {0}")]
    Storage(String),
    /// Bytes on disk or in a snapshot could not be decoded.
    #[error("metadata corrupt: {0}")]
    Corrupt(String),
}

impl MetaError {
    /// True for an answer of the namespace (the caller maps it to an errno), false for a
    /// failure of the store itself.
    pub fn is_namespace(&self) -> bool {
        matches!(self, MetaError::Fs(_))
    }
}

macro_rules! storage_from {
    ($($ty:ty),* $(,)?) => {
        $(impl From<$ty> for MetaError {
            fn from(e: $ty) -> Self {
                MetaError::Storage(e.to_string())
            }
        })*
    };
}

storage_from!(
    redb::Error,
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError,
    redb::SetDurabilityError,
);
