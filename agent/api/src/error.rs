use crate::FailureKind;

/// Failures talking to the local agent.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The socket could not be opened: the agent is not running, or the path is wrong.
    #[error("cannot connect to the agent at {path}: {reason}{}", connect_hint(.reason))]
    Connect {
        path: String,
        /// Not a `source`: the message already says it, and chains would print it twice.
        reason: std::io::Error,
    },
    /// The connection broke mid-request.
    #[error("agent connection failed: {0}")]
    Io(#[from] std::io::Error),
    /// A frame announced a body larger than the protocol allows.
    #[error("frame of {0} bytes exceeds the limit")]
    TooLarge(usize),
    /// The peer speaks another protocol version.
    #[error("agent protocol version {got}, this client speaks {want}")]
    Version { got: u8, want: u8 },
    /// Bytes that do not decode as the expected message.
    #[error("malformed message: {0}")]
    Decode(String),
    /// The agent answered something that does not fit the request.
    #[error("unexpected answer from the agent: {0}")]
    Unexpected(String),
}

/// What to do about a refused connection, where the reason alone does not say.
fn connect_hint(reason: &std::io::Error) -> &'static str {
    match reason.kind() {
        std::io::ErrorKind::PermissionDenied => {
            " (the socket is root's unless [admin] socket_mode and allow_other_users say otherwise: run as root)"
        }
        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => {
            " (is shoal-agent running? --socket or SHOAL_SOCKET name another agent's socket)"
        }
        _ => "",
    }
}

impl ApiError {
    /// Whether retrying (after reconnecting) may succeed, e.g. across an agent restart;
    /// not for a socket this user may not open.
    pub fn is_retryable(&self) -> bool {
        self.kind().is_retryable()
    }

    /// The kind of failure, as an agent's answer would carry it.
    pub fn kind(&self) -> FailureKind {
        match self {
            ApiError::Connect { reason, .. }
                if reason.kind() == std::io::ErrorKind::PermissionDenied =>
            {
                FailureKind::Invalid
            }
            ApiError::Connect { .. } | ApiError::Io(_) => FailureKind::Unavailable,
            ApiError::TooLarge(_) | ApiError::Version { .. } => FailureKind::Invalid,
            ApiError::Decode(_) | ApiError::Unexpected(_) => FailureKind::Internal,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn connect(kind: std::io::ErrorKind) -> ApiError {
        ApiError::Connect {
            path: "/run/shoal/agent.sock".into(),
            reason: kind.into(),
        }
    }

    #[test]
    fn an_agent_away_is_retried_and_a_socket_not_ours_is_not() {
        assert!(connect(std::io::ErrorKind::ConnectionRefused).is_retryable());
        assert!(connect(std::io::ErrorKind::NotFound).is_retryable());
        assert!(ApiError::Io(std::io::ErrorKind::UnexpectedEof.into()).is_retryable());
        let denied = connect(std::io::ErrorKind::PermissionDenied);
        assert!(
            !denied.is_retryable(),
            "running as root is not a matter of time"
        );
        assert_eq!(denied.kind(), FailureKind::Invalid);
        assert!(!ApiError::Version { got: 8, want: 10 }.is_retryable());
        assert_eq!(ApiError::Decode("x".into()).kind(), FailureKind::Internal);
    }
}
