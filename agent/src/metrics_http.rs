//! A minimal HTTP/1.1 endpoint serving the Prometheus text exposition at `GET /metrics`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tracing::debug;

use crate::AgentError;

const MAX_REQUEST: usize = 8192;

pub(crate) async fn bind(addr: SocketAddr) -> Result<TcpListener, AgentError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| AgentError::Listen {
            addr: addr.to_string(),
            source,
        })
}

pub(crate) async fn serve(listener: TcpListener, registry: Arc<Registry>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let registry = registry.clone();
        tokio::spawn(async move {
            let res =
                tokio::time::timeout(Duration::from_secs(10), answer(stream, &registry)).await;
            if let Ok(Err(e)) = res {
                debug!(error = %e, "metrics request failed");
            }
        });
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
