use std::path::{Path, PathBuf};

use tokio::net::UnixStream;

use crate::frame::{read_frame, write_frame};
use crate::{ApiError, Request, Response};

/// A connection to the local agent's Unix socket.
pub struct AgentClient {
    path: PathBuf,
    stream: UnixStream,
}

impl AgentClient {
    pub async fn connect(path: impl AsRef<Path>) -> Result<Self, ApiError> {
        let path = path.as_ref().to_owned();
        let stream = UnixStream::connect(&path)
            .await
            .map_err(|reason| ApiError::Connect {
                path: path.display().to_string(),
                reason,
            })?;
        Ok(AgentClient { path, stream })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Sends one request and waits for its response.
    pub async fn call(&mut self, request: &Request) -> Result<Response, ApiError> {
        write_frame(&mut self.stream, request).await?;
        read_frame(&mut self.stream).await?.ok_or_else(|| {
            ApiError::Io(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "agent closed the connection",
            ))
        })
    }
}
