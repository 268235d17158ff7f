use std::path::{Path, PathBuf};

use tokio::net::UnixStream;

use crate::frame::{read_any_frame, read_frame, write_frame, write_frame_as};
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
        read_frame(&mut self.stream).await?.ok_or_else(closed)
    }

    /// Sends one request as protocol `version` speaks it, to an agent of an older release
    /// (its refusal of this client's version names the version it speaks:
    /// [`ApiError::Version`]). Messages only ever gained variants at the end, so its answer
    /// decodes as today's [`Response`].
    pub async fn call_as(&mut self, version: u8, request: &Request) -> Result<Response, ApiError> {
        write_frame_as(&mut self.stream, version, request).await?;
        match read_any_frame(&mut self.stream).await? {
            Some((v, response)) if v == version => Ok(response),
            Some((got, _)) => Err(ApiError::Version { got, want: version }),
            None => Err(closed()),
        }
    }
}

fn closed() -> ApiError {
    ApiError::Io(std::io::Error::new(
        std::io::ErrorKind::UnexpectedEof,
        "agent closed the connection",
    ))
}
