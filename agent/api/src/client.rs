use std::path::{Path, PathBuf};

use tokio::net::UnixStream;

use crate::frame::{read_any_frame, read_frame, write_frame, write_frame_as};
use crate::{API_VERSION, ApiError, OLDEST_ALIKE_VERSION, Request, Response};

/// A connection to the local agent's Unix socket.
pub struct AgentClient {
    path: PathBuf,
    stream: UnixStream,
    /// The protocol this connection speaks: this client's, or an older agent's that asks
    /// and answers alike (from [`OLDEST_ALIKE_VERSION`]).
    version: u8,
}

impl AgentClient {
    pub async fn connect(path: impl AsRef<Path>) -> Result<Self, ApiError> {
        let path = path.as_ref().to_owned();
        let stream = open(&path).await?;
        Ok(AgentClient {
            path,
            stream,
            version: API_VERSION,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The protocol version this connection speaks.
    pub fn version(&self) -> u8 {
        self.version
    }

    /// Sends one request and waits for its response. An agent of an older release that
    /// refuses this client's version (it names its own: [`ApiError::Version`]) and closes
    /// the connection is asked again on a new one in its version, where that version asks
    /// and answers `request` as this one does ([`OLDEST_ALIKE_VERSION`],
    /// [`Request::oldest_version`]); its failures then come as `Response::Error`.
    pub async fn call(&mut self, request: &Request) -> Result<Response, ApiError> {
        if self.version != API_VERSION {
            return self.call_as(self.version, request).await;
        }
        write_frame(&mut self.stream, request).await?;
        // A frame of another version is refused before its body is decoded.
        match read_frame(&mut self.stream).await {
            Ok(Some(response)) => Ok(response),
            Ok(None) => Err(closed()),
            Err(ApiError::Version { got, .. })
                if (OLDEST_ALIKE_VERSION..API_VERSION).contains(&got)
                    && request.oldest_version() <= got =>
            {
                self.stream = open(&self.path).await?;
                self.version = got;
                self.call_as(got, request).await
            }
            Err(e) => Err(e),
        }
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

async fn open(path: &Path) -> Result<UnixStream, ApiError> {
    UnixStream::connect(path)
        .await
        .map_err(|reason| ApiError::Connect {
            path: path.display().to_string(),
            reason,
        })
}

fn closed() -> ApiError {
    ApiError::Io(std::io::Error::new(
        std::io::ErrorKind::UnexpectedEof,
        "agent closed the connection",
    ))
}

#[cfg(test)]
mod tests {
    use tokio::net::UnixListener;

    use super::*;
    use crate::FailureKind;

    /// An agent of protocol 9: a frame of another version is answered with its refusal,
    /// in its own version, and the connection closed (as every release did); `Undrain` is
    /// refused, every other request of version 9 answered `Done`.
    async fn agent_of_protocol_9(listener: UnixListener) {
        const OLD: u8 = 9;
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                loop {
                    let answer = match read_any_frame::<_, Request>(&mut stream).await {
                        Ok(Some((OLD, Request::Undrain { node }))) => {
                            Response::Error(format!("refused: {node} is active"))
                        }
                        Ok(Some((OLD, _))) => Response::Done("done".into()),
                        Ok(Some((v, _))) => {
                            let refusal = ApiError::Version { got: v, want: OLD };
                            let _ = write_frame_as(
                                &mut stream,
                                OLD,
                                &Response::Error(refusal.to_string()),
                            )
                            .await;
                            return;
                        }
                        _ => return,
                    };
                    if write_frame_as(&mut stream, OLD, &answer).await.is_err() {
                        return;
                    }
                }
            });
        }
    }

    #[tokio::test]
    async fn an_agent_of_protocol_9_is_asked_in_its_version_except_for_status() {
        let dir = std::env::temp_dir().join(format!("shoal-api-client-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let socket = dir.join("agent.sock");
        let _ = std::fs::remove_file(&socket);
        let listener = UnixListener::bind(&socket).expect("bind");
        tokio::spawn(agent_of_protocol_9(listener));

        let mut client = AgentClient::connect(&socket).await.expect("connect");
        let answer = client
            .call(&Request::Undrain { node: "n4".into() })
            .await
            .expect("answered in protocol 9");
        assert_eq!(client.version(), 9);
        let failure = answer.into_result().expect_err("a failure");
        assert_eq!(
            failure.kind,
            FailureKind::Unknown,
            "protocol 9 sends no kind"
        );
        assert_eq!(failure.message, "refused: n4 is active");
        // The connection goes on in version 9.
        let answer = client.call(&Request::TierStatus).await.expect("answered");
        assert_eq!(answer, Response::Done("done".into()));

        // The status report differs between the versions: not asked in version 9.
        let mut client = AgentClient::connect(&socket).await.expect("connect");
        assert!(matches!(
            client.call(&Request::Status).await,
            Err(ApiError::Version { got: 9, .. })
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
