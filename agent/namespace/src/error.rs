use shoal_agent_api::FsError;

/// What the metadata state machine can fail at.
#[derive(Debug, thiserror::Error)]
pub enum NamespaceError {
    /// The namespace's answer to a query or command (e.g. no such name).
    #[error(transparent)]
    Fs(#[from] FsError),
    /// The redb database failed; the state on disk is as of the last committed apply.
    #[error("metadata storage: {0}")]
    Storage(#[from] redb::Error),
    /// A record or snapshot could not be encoded.
    #[error("encoding {what}: {source}")]
    Encode {
        what: &'static str,
        source: postcard::Error,
    },
    /// Bytes on disk or in a snapshot could not be decoded.
    #[error("metadata corrupt: {0}")]
    Corrupt(String),
}

impl NamespaceError {
    /// True for an answer of the namespace (the caller maps it to an errno), false for a
    /// failure of the store itself.
    pub fn is_namespace(&self) -> bool {
        matches!(self, NamespaceError::Fs(_))
    }
}

macro_rules! storage_from {
    ($($ty:ty),* $(,)?) => {
        $(impl From<$ty> for NamespaceError {
            fn from(e: $ty) -> Self {
                NamespaceError::Storage(e.into())
            }
        })*
    };
}

storage_from!(
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError,
    redb::SetDurabilityError,
);

/// How a failure reaches a mount: the namespace's own answers as they are, anything else
/// as an I/O error naming it.
impl From<NamespaceError> for FsError {
    fn from(e: NamespaceError) -> FsError {
        match e {
            NamespaceError::Fs(e) => e,
            other => FsError::Io(other.to_string()),
        }
    }
}
