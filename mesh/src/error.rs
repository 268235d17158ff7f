use std::net::SocketAddr;
use std::path::PathBuf;

/// Everything that can go wrong in membership and transport.
#[derive(Debug, thiserror::Error)]
pub enum MeshError {
    /// A configuration value is impossible; `key` is its full TOML path.
    #[error("config key {key}: {reason}")]
    Config { key: &'static str, reason: String },
    /// A key or certificate file could not be read.
    #[error("cannot read {path}: {source}")]
    ReadFile {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A key or certificate file was read but is not what it should be.
    #[error("invalid {what} in {path}: {reason}")]
    BadCredential {
        what: &'static str,
        path: PathBuf,
        reason: String,
    },
    /// TLS configuration was refused by rustls/quinn.
    #[error("TLS setup failed: {0}")]
    Tls(String),
    /// A socket could not be bound.
    #[error("cannot bind {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    /// The SWIM state machine rejected an input.
    #[error("membership: {0}")]
    Membership(String),
    /// The gossip task has stopped (the agent is shutting down).
    #[error("gossip task is not running")]
    GossipStopped,
    /// A gossip facts payload could not be decoded.
    #[error("bad node facts: {0}")]
    BadFacts(String),
    /// Could not reach or handshake with a peer's RPC endpoint.
    #[error("cannot connect to {peer}: {reason}")]
    RpcConnect { peer: SocketAddr, reason: String },
    /// The connection or stream failed mid-request.
    #[error("RPC {endpoint} to {peer} failed: {reason}")]
    RpcStream {
        endpoint: &'static str,
        peer: SocketAddr,
        reason: String,
    },
    /// No answer within the deadline.
    #[error("RPC {endpoint} to {peer} timed out")]
    RpcTimeout {
        endpoint: &'static str,
        peer: SocketAddr,
    },
    /// The peer refused the request; its class says whether to try again.
    #[error("RPC {endpoint} to {peer}: peer says ({class:?}): {message}")]
    RpcRemote {
        endpoint: &'static str,
        peer: SocketAddr,
        class: crate::FailureClass,
        message: String,
    },
    /// Bytes from the network did not decode as the expected message.
    #[error("malformed RPC message: {0}")]
    RpcDecode(String),
    /// The request is larger than any peer accepts; it was not sent. Sending it again
    /// fails the same way: the caller must send less.
    #[error("RPC {endpoint} request of {bytes} bytes is over the {max}-byte limit")]
    MessageTooLarge {
        endpoint: &'static str,
        bytes: usize,
        max: usize,
    },
}

impl MeshError {
    /// Whether trying the same operation again later may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            MeshError::RpcConnect { .. }
                | MeshError::RpcStream { .. }
                | MeshError::RpcTimeout { .. }
                | MeshError::RpcRemote {
                    class: crate::FailureClass::Retryable,
                    ..
                }
        )
    }
}
