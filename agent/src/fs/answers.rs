//! Failures as the mount hears them: the errno classes of [`FsError`]. This is the edge
//! where the agent's typed errors become the wire's; `Unavailable` makes the mount wait
//! and retry, anything else reaches the application.

use shoal_agent_api::FsError;

use crate::consensus::ConsensusError;
use crate::data::StripeError;

impl From<ConsensusError> for FsError {
    fn from(e: ConsensusError) -> FsError {
        match e {
            ConsensusError::Namespace(n) => n.into(),
            e if e.is_retryable() => FsError::Unavailable(e.to_string()),
            e => FsError::Io(e.to_string()),
        }
    }
}

impl From<StripeError> for FsError {
    fn from(e: StripeError) -> FsError {
        // What may succeed a little later (holders not reachable yet, as right after this
        // agent started, or a partition healing) makes the mount wait and send the
        // request again, up to its `--retry-for`; the application sees EIO only after.
        if e.is_no_space() {
            FsError::NoSpace
        } else if e.is_retryable() {
            FsError::Unavailable(e.to_string())
        } else {
            FsError::Io(e.to_string())
        }
    }
}

/// A failed lease writeback: tried again at the next round when it may pass.
impl crate::worker::WorkError for FsError {
    fn is_retryable(&self) -> bool {
        matches!(self, FsError::Unavailable(_))
    }
}
