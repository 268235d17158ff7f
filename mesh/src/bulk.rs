//! The bulk lane: pooled TCP connections for multi-megabyte payloads between the same
//! authenticated peers (QUIC moves several times less per core on these machines).
//!
//! Every connection opens with a TLS 1.3 handshake, both sides presenting certificates
//! signed by the cluster CA. The client then names the cluster's mode inside TLS:
//! - `secure`: everything stays inside TLS (encrypted and authenticated);
//! - `crc`: after the server's acknowledgement both sides take the TCP stream back and send
//!   plaintext frames, each with a crc32c: an authenticated connection with checksummed
//!   frames and no encryption, for a trusted storage network (as Ceph's messenger offers).
//!
//! Frames: `| length u32 BE | crc32c u32 BE | payload |`. One request at a time per
//! connection; concurrency comes from the pool.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Mutex;
use tokio_rustls::{TlsAcceptor, TlsConnector, TlsStream};
use tracing::{debug, warn};

use crate::MeshError;
use crate::tls::TlsMaterial;

pub(crate) const BULK_ALPN: &[u8] = b"shoal-bulk/1";
const MAX_FRAME: usize = 17 << 20;
const ACK: u8 = 0x06;
/// Longest a TLS handshake plus mode exchange may take.
const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// Idle connections kept per peer.
const POOL_PER_PEER: usize = 8;
/// Incoming connections served at once, at most (pools of every peer, with room).
const MAX_INCOMING: usize = 1024;

/// How shard payloads travel between nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BulkMode {
    /// TCP inside TLS: encrypted.
    Secure,
    /// TCP authenticated by a TLS handshake, then crc32c-checked plaintext frames.
    Crc,
    /// No bulk lane: everything over QUIC.
    Off,
}

impl BulkMode {
    fn wire(self) -> u8 {
        match self {
            BulkMode::Secure => 1,
            BulkMode::Crc => 2,
            BulkMode::Off => 0,
        }
    }
}

/// A connection after the handshake.
pub(crate) enum Conn {
    Secure(Box<TlsStream<TcpStream>>),
    Crc(TcpStream),
}

async fn write_frame<W: AsyncWrite + Unpin>(w: &mut W, payload: &[u8]) -> std::io::Result<()> {
    let mut head = [0u8; 8];
    head[..4].copy_from_slice(&(payload.len() as u32).to_be_bytes());
    head[4..].copy_from_slice(&crc32c::crc32c(payload).to_be_bytes());
    w.write_all(&head).await?;
    w.write_all(payload).await?;
    w.flush().await
}

async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> std::io::Result<Vec<u8>> {
    let mut head = [0u8; 8];
    r.read_exact(&mut head).await?;
    let len = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as usize;
    let crc = u32::from_be_bytes([head[4], head[5], head[6], head[7]]);
    if len > MAX_FRAME {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("bulk frame of {len} bytes"),
        ));
    }
    // The peer proved its cluster certificate at connect, so its length (at most
    // MAX_FRAME) is reserved at once: a shard arrives into one buffer, not through a
    // growing one that copies it at every doubling.
    let mut payload = Vec::with_capacity(len);
    if r.take(len as u64).read_to_end(&mut payload).await? < len {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    if crc32c::crc32c(&payload) != crc {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "bulk frame checksum mismatch",
        ));
    }
    Ok(payload)
}

impl Conn {
    pub(crate) async fn send(&mut self, payload: &[u8]) -> std::io::Result<()> {
        match self {
            Conn::Secure(s) => write_frame(s, payload).await,
            Conn::Crc(s) => write_frame(s, payload).await,
        }
    }

    pub(crate) async fn recv(&mut self) -> std::io::Result<Vec<u8>> {
        match self {
            Conn::Secure(s) => read_frame(s).await,
            Conn::Crc(s) => read_frame(s).await,
        }
    }
}

pub(crate) struct Bulk {
    mode: BulkMode,
    acceptor: TlsAcceptor,
    connector: TlsConnector,
    server_name: rustls::pki_types::ServerName<'static>,
    pool: Mutex<HashMap<SocketAddr, Vec<Conn>>>,
}

impl Bulk {
    pub(crate) fn new(
        mode: BulkMode,
        tls: &TlsMaterial,
        server_name: &str,
    ) -> Result<Self, MeshError> {
        let server_name = rustls::pki_types::ServerName::try_from(server_name.to_owned())
            .map_err(|e| MeshError::Tls(e.to_string()))?;
        Ok(Bulk {
            mode,
            acceptor: TlsAcceptor::from(Arc::new(tls.rustls_server(BULK_ALPN)?)),
            connector: TlsConnector::from(Arc::new(tls.rustls_client(BULK_ALPN)?)),
            server_name,
            pool: Mutex::new(HashMap::new()),
        })
    }

    /// Server half of the handshake.
    pub(crate) async fn accept(&self, tcp: TcpStream) -> std::io::Result<Conn> {
        tcp.set_nodelay(true)?;
        let mut tls = self.acceptor.accept(tcp).await?;
        let mut hello = [0u8; 1];
        tls.read_exact(&mut hello).await?;
        if hello[0] != self.mode.wire() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "peer asked for bulk mode {} but the cluster uses {:?}",
                    hello[0], self.mode
                ),
            ));
        }
        tls.write_all(&[ACK]).await?;
        tls.flush().await?;
        Ok(match self.mode {
            BulkMode::Crc => Conn::Crc(tls.into_inner().0),
            _ => Conn::Secure(Box::new(TlsStream::Server(tls))),
        })
    }

    /// Client half of the handshake.
    async fn dial(&self, peer: SocketAddr) -> std::io::Result<Conn> {
        let tcp = TcpStream::connect(peer).await?;
        tcp.set_nodelay(true)?;
        let mut tls = self
            .connector
            .connect(self.server_name.clone(), tcp)
            .await?;
        tls.write_all(&[self.mode.wire()]).await?;
        tls.flush().await?;
        let mut ack = [0u8; 1];
        tls.read_exact(&mut ack).await?;
        if ack[0] != ACK {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "bulk handshake refused",
            ));
        }
        // Nothing follows the acknowledgement until we speak, so no TLS record is left
        // buffered when `crc` takes the TCP stream back.
        Ok(match self.mode {
            BulkMode::Crc => Conn::Crc(tls.into_inner().0),
            _ => Conn::Secure(Box::new(TlsStream::Client(tls))),
        })
    }

    /// One request/response exchange with `peer` on a pooled connection.
    pub(crate) async fn exchange(
        &self,
        peer: SocketAddr,
        request: &[u8],
    ) -> std::io::Result<Vec<u8>> {
        let pooled = self.pool.lock().await.get_mut(&peer).and_then(Vec::pop);
        let mut conn = match pooled {
            Some(c) => c,
            None => self.dial(peer).await?,
        };
        conn.send(request).await?;
        let response = conn.recv().await?;
        let mut pool = self.pool.lock().await;
        let idle = pool.entry(peer).or_default();
        if idle.len() < POOL_PER_PEER {
            idle.push(conn);
        }
        Ok(response)
    }

    /// Drops every pooled connection to `peer` (after an error: it may have restarted).
    pub(crate) async fn forget(&self, peer: SocketAddr) {
        self.pool.lock().await.remove(&peer);
    }
}

/// Binds the bulk listener.
pub(crate) async fn bind(addr: SocketAddr) -> Result<TcpListener, MeshError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| MeshError::Bind { addr, source })
}

/// Accept loop: each connection serves requests one after another through `dispatch`.
pub(crate) async fn serve<F, Fut>(
    listener: TcpListener,
    bulk: Arc<Bulk>,
    dispatch: F,
    on_reject: impl Fn(SocketAddr, String) + Send + Sync + 'static,
) where
    F: Fn(Vec<u8>) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Vec<u8>> + Send,
{
    let on_reject = Arc::new(on_reject);
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_INCOMING));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let Ok((tcp, remote)) = listener.accept().await else {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            continue;
        };
        let (bulk, dispatch, on_reject) = (bulk.clone(), dispatch.clone(), on_reject.clone());
        tokio::spawn(async move {
            let _slot = slot;
            // A peer that connects and stalls the handshake must not hold a task forever.
            let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, bulk.accept(tcp)).await;
            let mut conn = match handshake {
                Ok(Ok(c)) => c,
                Ok(Err(e)) => return on_reject(remote, e.to_string()),
                Err(_) => return on_reject(remote, "handshake timed out".into()),
            };
            loop {
                let request = match conn.recv().await {
                    Ok(r) => r,
                    Err(e) => {
                        if e.kind() != std::io::ErrorKind::UnexpectedEof {
                            warn!(%remote, error = %e, "bulk connection dropped");
                        }
                        return;
                    }
                };
                let response = dispatch(request).await;
                if let Err(e) = conn.send(&response).await {
                    debug!(%remote, error = %e, "bulk response not sent");
                    return;
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_round_trip_and_damage_is_detected() {
        let mut buf = Vec::new();
        write_frame(&mut buf, b"payload").await.expect("write");
        let mut r = &buf[..];
        assert_eq!(read_frame(&mut r).await.expect("read"), b"payload");
        let mut bad = buf.clone();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        assert!(read_frame(&mut &bad[..]).await.is_err());
        let huge = [0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0];
        assert!(read_frame(&mut &huge[..]).await.is_err());
    }
}
