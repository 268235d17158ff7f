//! The tiering crate's one error type.

/// What can go wrong talking to the cold tier or reading what it holds.
#[derive(Debug, thiserror::Error)]
pub enum TierError {
    /// The store could not be reached or answered with a server error: worth trying again.
    #[error("the object store is unavailable: {0}")]
    Unavailable(String),
    /// The store took longer than allowed.
    #[error("the object store did not answer within {0:?}")]
    TimedOut(std::time::Duration),
    /// The object is not there.
    #[error("object {0} is not in the store")]
    NotFound(String),
    /// The store answered, but what it returned is not what was asked for or stored.
    #[error("object {key}: {what}")]
    Damaged { key: String, what: String },
    /// The store refused the request (credentials, permissions, bad bucket): trying
    /// again changes nothing until the configuration does.
    #[error("the object store refused the request: {0}")]
    Refused(String),
    /// The store's configuration is unusable.
    #[error("{key}: {message}")]
    Config { key: &'static str, message: String },
}

impl TierError {
    /// True when the same request may succeed later (an outage, a timeout, a damaged
    /// transfer).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            TierError::Unavailable(_) | TierError::TimedOut(_) | TierError::Damaged { .. }
        )
    }
}

impl From<object_store::Error> for TierError {
    fn from(e: object_store::Error) -> Self {
        use object_store::Error as E;
        match e {
            E::NotFound { path, .. } => TierError::NotFound(path),
            E::PermissionDenied { .. } | E::Unauthenticated { .. } => {
                TierError::Refused(e.to_string())
            }
            E::InvalidPath { .. } | E::NotSupported { .. } | E::NotImplemented { .. } => {
                TierError::Refused(e.to_string())
            }
            _ => TierError::Unavailable(e.to_string()),
        }
    }
}
