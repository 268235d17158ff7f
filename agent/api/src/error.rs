/// Failures talking to the local agent.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The socket could not be opened: the agent is not running, or the path is wrong.
    #[error("cannot connect to the agent at {path}: {source}")]
    Connect {
        path: String,
        source: std::io::Error,
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

impl ApiError {
    /// Whether retrying (after reconnecting) may succeed, e.g. across an agent restart.
    pub fn is_retryable(&self) -> bool {
        matches!(self, ApiError::Connect { .. } | ApiError::Io(_))
    }
}
