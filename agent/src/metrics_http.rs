//! A minimal HTTP/1.1 endpoint serving the Prometheus text exposition at `GET /metrics`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tracing::debug;

use crate::AgentError;
use crate::worker::{Step, Worker};

const MAX_REQUEST: usize = 8192;

pub(crate) async fn bind(addr: SocketAddr) -> Result<TcpListener, AgentError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| AgentError::Listen {
            addr: addr.to_string(),
            source,
        })
}

/// The metrics endpoint's accept loop, as a worker (`metrics-http`): a unit starts
/// answering one request on a task of its own (10 s at most); those tasks end with it.
pub(crate) struct MetricsHttp {
    listener: TcpListener,
    registry: Arc<Registry>,
    requests: JoinSet<()>,
    /// What the last wait brought: a connection, or why accept failed.
    accepted: Option<std::io::Result<TcpStream>>,
    /// The last accept failed: the next waits a moment first.
    failed: bool,
}

impl MetricsHttp {
    pub(crate) fn new(listener: TcpListener, registry: Arc<Registry>) -> MetricsHttp {
        MetricsHttp {
            listener,
            registry,
            requests: JoinSet::new(),
            accepted: None,
            failed: false,
        }
    }
}

impl Worker for MetricsHttp {
    type Error = AgentError;

    fn name(&self) -> &'static str {
        "metrics-http"
    }

    async fn work(&mut self) -> Result<Step, AgentError> {
        while self.requests.try_join_next().is_some() {}
        self.failed = false;
        match self.accepted.take() {
            None => {}
            Some(Ok(stream)) => {
                let registry = self.registry.clone();
                self.requests.spawn(async move {
                    let answered = answer(stream, &registry);
                    let res = tokio::time::timeout(Duration::from_secs(10), answered).await;
                    if let Ok(Err(e)) = res {
                        debug!(error = %e, "metrics request failed");
                    }
                });
            }
            Some(Err(source)) => {
                self.failed = true;
                return Err(AgentError::Accept {
                    what: "metrics endpoint",
                    source,
                });
            }
        }
        Ok(Step::Idle)
    }

    /// Waits for a connection (cancel-safe).
    async fn wait_for_work(&mut self) {
        if self.failed {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.accepted = Some(self.listener.accept().await.map(|(s, _)| s));
    }
}

async fn answer(mut stream: TcpStream, registry: &Registry) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut chunk).await?;
        if n == 0 || buf.len() + n > MAX_REQUEST {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let request_line = buf.split(|b| *b == b'\r').next().unwrap_or_default();
    let mut parts = request_line.split(|b| *b == b' ');
    let (method, path) = (parts.next(), parts.next());
    let (status, content_type, body) = match (method, path) {
        (Some(b"GET"), Some(b"/metrics")) => {
            let mut text = String::new();
            match prometheus_client::encoding::text::encode(&mut text, registry) {
                Ok(()) => (
                    "200 OK",
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    text,
                ),
                Err(_) => (
                    "500 Internal Server Error",
                    "text/plain",
                    "encoding failed\n".into(),
                ),
            }
        }
        _ => ("404 Not Found", "text/plain", "try GET /metrics\n".into()),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}
