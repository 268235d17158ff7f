//! The bulk lane: pooled TCP connections for multi-megabyte payloads between the same
//! authenticated peers (QUIC moves several times less per core on these machines).
//!
//! Every connection opens with a TLS 1.3 handshake, both sides presenting certificates
//! signed by the cluster CA; the connection belongs to the node the peer's certificate
//! names (see `node_cert`). The client then names the cluster's mode inside TLS:
//! - `secure`: everything stays inside TLS (encrypted and authenticated);
//! - `crc`: after the server's acknowledgement both sides take the TCP stream back and send
//!   plaintext frames, each authenticated by a MAC (keyed BLAKE3) with a key per direction
//!   exported from the TLS session and the frame's sequence number: no encryption, for a
//!   trusted storage network (as Ceph's messenger offers), but a frame that was injected,
//!   altered, replayed, reordered or dropped ends the connection.
//!
//! Frames, lane version 3 (ALPN `shoal-bulk/3`):
//! - `secure`: `| length u32 BE | payload |` inside TLS, which authenticates every record;
//! - `crc`: `| length u32 BE | payload | BLAKE3(key, seq u64 BE ++ length ++ payload) (32) |`.
//!
//! One request at a time per connection; concurrency comes from the pool. The lane carries
//! only the requests the transport lets it (shard payloads), never control messages.
//!
//! Earlier releases' lanes, for a rolling upgrade: version 2 (`shoal-bulk/2`) is served and
//! offered beside version 3 (its `secure` frames carry a crc32c after the length, which
//! TLS's own authentication made redundant; its `crc` frames are version 3's); version 1
//! (`shoal-bulk/1`, crc32c-only plaintext frames in `crc`) is still served in `secure`
//! mode, where TLS protects it. The server picks the newest version both ends speak.

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
use crate::identity::NodeId;
use crate::node_cert::{NodeCert, Revocations};
use crate::rpc::peer_node;
use crate::tls::TlsMaterial;

pub(crate) const BULK_ALPN: &[u8] = b"shoal-bulk/3";
/// The previous release's lane: `secure` frames with a crc32c.
const BULK_ALPN_V2: &[u8] = b"shoal-bulk/2";
/// The release before that, served in `secure` mode only.
const BULK_ALPN_V1: &[u8] = b"shoal-bulk/1";
/// What this node offers when it dials, newest first.
const OFFERED: &[&[u8]] = &[BULK_ALPN, BULK_ALPN_V2];
const MAX_FRAME: usize = 17 << 20;
const ACK: u8 = 0x06;
const TAG_LEN: usize = 32;
/// The TLS exporter label of the `crc` frames' MAC keys (RFC 8446 section 7.5).
const MAC_LABEL: &[u8] = b"EXPORTER-shoal-bulk-mac-v2";
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
    /// TCP authenticated by a TLS handshake, then plaintext frames, each with a MAC keyed
    /// from the TLS session.
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

/// The MAC state of one direction of a `crc` connection.
struct Mac {
    key: [u8; 32],
    seq: u64,
}

impl Mac {
    /// The tag of the next frame, which it numbers.
    fn tag(&mut self, len: u32, payload: &[u8]) -> blake3::Hash {
        let mut h = blake3::Hasher::new_keyed(&self.key);
        h.update(&self.seq.to_be_bytes());
        h.update(&len.to_be_bytes());
        h.update(payload);
        self.seq += 1;
        h.finalize()
    }
}

/// The keys of a `crc` connection, one per direction, exported from its TLS session: both
/// ends compute the same, nobody without the session does.
fn mac_keys<C>(conn: &rustls::ConnectionCommon<C>) -> std::io::Result<(Mac, Mac)> {
    let out = conn
        .export_keying_material([0u8; 64], MAC_LABEL, None)
        .map_err(|e| std::io::Error::other(format!("TLS exporter: {e}")))?;
    let (mut to_server, mut to_client) = ([0u8; 32], [0u8; 32]);
    to_server.copy_from_slice(&out[..32]);
    to_client.copy_from_slice(&out[32..]);
    Ok((
        Mac {
            key: to_server,
            seq: 0,
        },
        Mac {
            key: to_client,
            seq: 0,
        },
    ))
}

/// How a connection's frames travel after the handshake.
enum Framing {
    /// Frames inside TLS; `crc`: each with a crc32c (lane versions 1 and 2).
    Secure {
        tls: Box<TlsStream<TcpStream>>,
        crc: bool,
    },
    /// Plaintext frames with a MAC each (`send`, `recv`: this end's two directions).
    Crc {
        tcp: TcpStream,
        send: Mac,
        recv: Mac,
    },
}

/// A connection after the handshake, with the node its peer's certificate names.
pub(crate) struct Conn {
    framing: Framing,
    pub(crate) peer: Arc<NodeCert>,
}

/// Whether a `secure` connection that agreed on `alpn` puts a crc32c in its frames.
fn secure_frames_have_crc(alpn: Option<&[u8]>) -> bool {
    alpn != Some(BULK_ALPN)
}

/// A `secure` frame: its length, with `crc` a crc32c of the payload, then the payload.
async fn write_secure_frame<W: AsyncWrite + Unpin>(
    w: &mut W,
    payload: &[u8],
    crc: bool,
) -> std::io::Result<()> {
    let mut head = [0u8; 8];
    head[..4].copy_from_slice(&(payload.len() as u32).to_be_bytes());
    let head = if crc {
        head[4..].copy_from_slice(&crc32c::crc32c(payload).to_be_bytes());
        &head[..]
    } else {
        &head[..4]
    };
    w.write_all(head).await?;
    w.write_all(payload).await?;
    w.flush().await
}

fn frame_len(len: u32) -> std::io::Result<usize> {
    let len = len as usize;
    if len > MAX_FRAME {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("bulk frame of {len} bytes"),
        ));
    }
    Ok(len)
}

/// Reads `len` bytes. The peer proved its cluster certificate at connect, so its length (at
/// most MAX_FRAME) is reserved at once: a shard arrives into one buffer, not through a
/// growing one that copies it at every doubling.
async fn read_exactly<R: AsyncRead + Unpin>(r: &mut R, len: usize) -> std::io::Result<Vec<u8>> {
    let mut payload = Vec::with_capacity(len);
    if r.take(len as u64).read_to_end(&mut payload).await? < len {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok(payload)
}

async fn read_secure_frame<R: AsyncRead + Unpin>(r: &mut R, crc: bool) -> std::io::Result<Vec<u8>> {
    let mut head = [0u8; 4];
    r.read_exact(&mut head).await?;
    let len = frame_len(u32::from_be_bytes(head))?;
    let mut want = None;
    if crc {
        r.read_exact(&mut head).await?;
        want = Some(u32::from_be_bytes(head));
    }
    let payload = read_exactly(r, len).await?;
    if want.is_some_and(|crc| crc32c::crc32c(&payload) != crc) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "bulk frame checksum mismatch",
        ));
    }
    Ok(payload)
}

async fn write_mac_frame<W: AsyncWrite + Unpin>(
    w: &mut W,
    mac: &mut Mac,
    payload: &[u8],
) -> std::io::Result<()> {
    let len = u32::try_from(payload.len()).map_err(|_| std::io::ErrorKind::InvalidInput)?;
    let tag = mac.tag(len, payload);
    w.write_all(&len.to_be_bytes()).await?;
    w.write_all(payload).await?;
    w.write_all(tag.as_bytes()).await?;
    w.flush().await
}

async fn read_mac_frame<R: AsyncRead + Unpin>(
    r: &mut R,
    mac: &mut Mac,
) -> std::io::Result<Vec<u8>> {
    let mut head = [0u8; 4];
    r.read_exact(&mut head).await?;
    let len32 = u32::from_be_bytes(head);
    let len = frame_len(len32)?;
    let payload = read_exactly(r, len).await?;
    let mut tag = [0u8; TAG_LEN];
    r.read_exact(&mut tag).await?;
    // blake3::Hash compares in constant time.
    if mac.tag(len32, &payload) != blake3::Hash::from_bytes(tag) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "bulk frame MAC mismatch (injected, altered, replayed or reordered)",
        ));
    }
    Ok(payload)
}

/// Reads frames of both kinds off `bytes` until one fails (for the fuzz targets).
pub(crate) async fn read_frames(mut bytes: &[u8]) {
    let copy = bytes;
    while read_secure_frame(&mut bytes, true).await.is_ok() {}
    let mut bytes = copy;
    while read_secure_frame(&mut bytes, false).await.is_ok() {}
    let mut mac = Mac {
        key: [7; 32],
        seq: 0,
    };
    let mut bytes = copy;
    while read_mac_frame(&mut bytes, &mut mac).await.is_ok() {}
}

impl Conn {
    pub(crate) async fn send(&mut self, payload: &[u8]) -> std::io::Result<()> {
        match &mut self.framing {
            Framing::Secure { tls, crc } => write_secure_frame(tls, payload, *crc).await,
            Framing::Crc { tcp, send, .. } => write_mac_frame(tcp, send, payload).await,
        }
    }

    pub(crate) async fn recv(&mut self) -> std::io::Result<Vec<u8>> {
        match &mut self.framing {
            Framing::Secure { tls, crc } => read_secure_frame(tls, *crc).await,
            Framing::Crc { tcp, recv, .. } => read_mac_frame(tcp, recv).await,
        }
    }

    async fn round_trip(&mut self, request: &[u8]) -> std::io::Result<Vec<u8>> {
        self.send(request).await?;
        self.recv().await
    }
}

/// Whether `e` says the other end had closed the connection (rather than a damaged frame,
/// a refusal or a timeout).
fn closed_by_peer(e: &std::io::Error) -> bool {
    use std::io::ErrorKind as K;
    matches!(
        e.kind(),
        K::UnexpectedEof | K::BrokenPipe | K::ConnectionReset | K::ConnectionAborted
    )
}

pub(crate) struct Bulk {
    mode: BulkMode,
    acceptor: TlsAcceptor,
    connector: TlsConnector,
    server_name: rustls::pki_types::ServerName<'static>,
    pool: Mutex<HashMap<SocketAddr, Vec<Conn>>>,
    revocations: Arc<Revocations>,
}

fn refused(why: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::PermissionDenied, why)
}

impl Bulk {
    pub(crate) fn new(
        mode: BulkMode,
        tls: &TlsMaterial,
        server_name: &str,
        revocations: Arc<Revocations>,
    ) -> Result<Self, MeshError> {
        let server_name = rustls::pki_types::ServerName::try_from(server_name.to_owned())
            .map_err(|e| MeshError::Tls(e.to_string()))?;
        // Version 1 only where TLS protects it.
        let served: &[&[u8]] = match mode {
            BulkMode::Secure => &[BULK_ALPN, BULK_ALPN_V2, BULK_ALPN_V1],
            _ => &[BULK_ALPN, BULK_ALPN_V2],
        };
        Self::speaking(mode, tls, server_name, revocations, served, OFFERED)
    }

    /// A lane that serves the versions `served` and offers `offered` when it dials, each
    /// newest first.
    fn speaking(
        mode: BulkMode,
        tls: &TlsMaterial,
        server_name: rustls::pki_types::ServerName<'static>,
        revocations: Arc<Revocations>,
        served: &[&[u8]],
        offered: &[&[u8]],
    ) -> Result<Self, MeshError> {
        Ok(Bulk {
            mode,
            acceptor: TlsAcceptor::from(Arc::new(tls.rustls_server_alpns(served)?)),
            connector: TlsConnector::from(Arc::new(tls.rustls_client_alpns(offered)?)),
            server_name,
            pool: Mutex::new(HashMap::new()),
            revocations,
        })
    }

    /// Server half of the handshake.
    pub(crate) async fn accept(&self, tcp: TcpStream) -> std::io::Result<Conn> {
        tcp.set_nodelay(true)?;
        let mut tls = self.acceptor.accept(tcp).await?;
        let peer = {
            let (_, session) = tls.get_ref();
            peer_node(session.peer_certificates(), &self.revocations)
                .map_err(|r| refused(r.reason))?
        };
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
        let framing = match self.mode {
            // (The previous release's lane is not offered in `crc` mode.)
            BulkMode::Crc => {
                let (to_server, to_client) = mac_keys(tls.get_ref().1)?;
                Framing::Crc {
                    tcp: tls.into_inner().0,
                    send: to_client,
                    recv: to_server,
                }
            }
            _ => Framing::Secure {
                crc: secure_frames_have_crc(tls.get_ref().1.alpn_protocol()),
                tls: Box::new(TlsStream::Server(tls)),
            },
        };
        Ok(Conn {
            framing,
            peer: Arc::new(peer),
        })
    }

    /// Client half of the handshake, to the node `node` when the caller names it.
    async fn dial(&self, addr: SocketAddr, node: Option<NodeId>) -> std::io::Result<Conn> {
        let tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        let mut tls = self
            .connector
            .connect(self.server_name.clone(), tcp)
            .await?;
        let peer = {
            let (_, session) = tls.get_ref();
            peer_node(session.peer_certificates(), &self.revocations)
                .map_err(|r| refused(r.reason))?
        };
        if let Some(node) = node.filter(|n| *n != peer.node) {
            return Err(refused(format!(
                "expected node {node} at {addr}, its certificate is node {} ({})",
                peer.node, peer.name
            )));
        }
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
        let framing = match self.mode {
            BulkMode::Crc => {
                let (to_server, to_client) = mac_keys(tls.get_ref().1)?;
                Framing::Crc {
                    tcp: tls.into_inner().0,
                    send: to_server,
                    recv: to_client,
                }
            }
            _ => Framing::Secure {
                crc: secure_frames_have_crc(tls.get_ref().1.alpn_protocol()),
                tls: Box::new(TlsStream::Client(tls)),
            },
        };
        Ok(Conn {
            framing,
            peer: Arc::new(peer),
        })
    }

    /// One request/response exchange with the node `node` at `addr` on a pooled
    /// connection. A pooled connection the peer has closed under it (the peer restarted,
    /// or dropped the connection) is found when it is used: the pool to that peer is
    /// dropped and the request sent once more on a fresh connection. The lane carries
    /// requests that may be sent twice (shard puts and reads).
    pub(crate) async fn exchange(
        &self,
        addr: SocketAddr,
        node: Option<NodeId>,
        request: &[u8],
    ) -> std::io::Result<Vec<u8>> {
        // A pooled connection is to the node it was when dialled: check it is still the one
        // asked for, and not revoked since.
        let pooled = self
            .pool
            .lock()
            .await
            .get_mut(&addr)
            .and_then(Vec::pop)
            .filter(|c| {
                node.is_none_or(|n| n == c.peer.node) && !self.revocations.is_revoked(&c.peer)
            });
        if let Some(mut conn) = pooled {
            match conn.round_trip(request).await {
                Ok(response) => {
                    self.keep(addr, conn).await;
                    return Ok(response);
                }
                Err(e) if closed_by_peer(&e) => {
                    debug!(%addr, error = %e, "pooled bulk connection was closed; dialling again");
                    self.forget(addr).await;
                }
                Err(e) => return Err(e),
            }
        }
        let mut conn = self.dial(addr, node).await?;
        let response = conn.round_trip(request).await?;
        self.keep(addr, conn).await;
        Ok(response)
    }

    /// Returns an idle connection to the pool (while it has room).
    async fn keep(&self, addr: SocketAddr, conn: Conn) {
        let mut pool = self.pool.lock().await;
        let idle = pool.entry(addr).or_default();
        if idle.len() < POOL_PER_PEER {
            idle.push(conn);
        }
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

/// Accept loop: each connection serves requests one after another through `dispatch`,
/// which is told the node the connection belongs to.
pub(crate) async fn serve<F, Fut>(
    listener: TcpListener,
    bulk: Arc<Bulk>,
    dispatch: F,
    on_reject: impl Fn(SocketAddr, String) + Send + Sync + 'static,
) where
    F: Fn(Vec<u8>, Arc<NodeCert>) -> Fut + Clone + Send + Sync + 'static,
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
                let response = dispatch(request, conn.peer.clone()).await;
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
    async fn secure_frames_round_trip_and_a_crc_finds_damage() {
        for crc in [true, false] {
            let mut buf = Vec::new();
            write_secure_frame(&mut buf, b"payload", crc)
                .await
                .expect("write");
            assert_eq!(buf.len(), 4 + usize::from(crc) * 4 + 7, "crc {crc}");
            let mut r = &buf[..];
            assert_eq!(
                read_secure_frame(&mut r, crc).await.expect("read"),
                b"payload"
            );
            let huge = [0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0];
            assert!(read_secure_frame(&mut &huge[..], crc).await.is_err());
        }
        let mut buf = Vec::new();
        write_secure_frame(&mut buf, b"payload", true)
            .await
            .expect("write");
        let last = buf.len() - 1;
        buf[last] ^= 1;
        assert!(read_secure_frame(&mut &buf[..], true).await.is_err());
    }

    /// A cluster CA and one node certificate signed by it, as files in `dir`.
    fn material(dir: &std::path::Path) -> TlsMaterial {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
        let ca_key = KeyPair::generate().expect("key");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("params");
        ca.distinguished_name.push(DnType::CommonName, "test CA");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_pem = ca.self_signed(&ca_key).expect("self-sign").pem();
        let key = KeyPair::generate().expect("key");
        let mut node = CertificateParams::new(vec!["shoal-node".to_owned()]).expect("params");
        let uri = crate::node_cert::node_uri(NodeId(1), 1_000);
        node.subject_alt_names
            .push(rcgen::SanType::URI(uri.try_into().expect("ia5")));
        let cert = node
            .signed_by(&key, &Issuer::from_params(&ca, &ca_key))
            .expect("sign");
        let files = crate::TlsFiles {
            ca_cert: dir.join("ca.pem"),
            node_cert: dir.join("node.pem"),
            node_key: dir.join("node.key"),
        };
        std::fs::write(&files.ca_cert, ca_pem).expect("write");
        std::fs::write(&files.node_cert, cert.pem()).expect("write");
        std::fs::write(&files.node_key, key.serialize_pem()).expect("write");
        files.load().expect("load")
    }

    fn lane(tls: &TlsMaterial, mode: BulkMode, served: &[&[u8]], offered: &[&[u8]]) -> Bulk {
        let name = rustls::pki_types::ServerName::try_from("shoal-node").expect("name");
        let revocations = Arc::new(Revocations::default());
        Bulk::speaking(mode, tls, name, revocations, served, offered).expect("lane")
    }

    /// One exchange from `client` to `server`: whether the frames carried a crc32c on
    /// either end, and the answer.
    async fn exchange(server: Bulk, client: Bulk) -> (bool, bool, Vec<u8>) {
        let listener = bind("127.0.0.1:0".parse().expect("addr"))
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let serving = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.expect("accept");
            let mut conn = server.accept(tcp).await.expect("server handshake");
            let request = conn.recv().await.expect("request");
            conn.send(&[&request[..], b" back"].concat())
                .await
                .expect("answer");
            matches!(conn.framing, Framing::Secure { crc: true, .. })
        });
        let mut conn = client.dial(addr, None).await.expect("client handshake");
        let answer = conn.round_trip(b"there").await.expect("round trip");
        let client_crc = matches!(conn.framing, Framing::Secure { crc: true, .. });
        (serving.await.expect("server"), client_crc, answer)
    }

    #[tokio::test]
    async fn lanes_of_this_and_the_previous_releases_agree_on_their_frames() {
        let dir = tempfile::tempdir().expect("tempdir");
        let tls = material(dir.path());
        let secure = BulkMode::Secure;
        let today = || {
            lane(
                &tls,
                secure,
                &[BULK_ALPN, BULK_ALPN_V2, BULK_ALPN_V1],
                OFFERED,
            )
        };
        // Version 3 on both ends: no crc32c inside TLS.
        let (s, c, answer) = exchange(today(), today()).await;
        assert_eq!((s, c, &answer[..]), (false, false, &b"there back"[..]));
        // A dialler of the previous releases (2, then 1) gets the crc32c frames it expects.
        for old in [BULK_ALPN_V2, BULK_ALPN_V1] {
            let caller = lane(&tls, secure, &[old], &[old]);
            let (s, c, answer) = exchange(today(), caller).await;
            assert_eq!((s, c, &answer[..]), (true, true, &b"there back"[..]));
        }
        // A server of the previous release answers today's dialler in version 2.
        let old_server = lane(&tls, secure, &[BULK_ALPN_V2, BULK_ALPN_V1], &[BULK_ALPN_V2]);
        let (s, c, answer) = exchange(old_server, today()).await;
        assert_eq!((s, c, &answer[..]), (true, true, &b"there back"[..]));
        // `crc` mode: versions 2 and 3 send the same MAC frames.
        let crc = BulkMode::Crc;
        let old_server = lane(&tls, crc, &[BULK_ALPN_V2], &[BULK_ALPN_V2]);
        let caller = lane(&tls, crc, &[BULK_ALPN, BULK_ALPN_V2], OFFERED);
        let (_, _, answer) = exchange(old_server, caller).await;
        assert_eq!(answer, b"there back");
    }

    fn mac(byte: u8) -> Mac {
        Mac {
            key: [byte; 32],
            seq: 0,
        }
    }

    #[tokio::test]
    async fn mac_frames_refuse_tampering_replay_reordering_and_another_key() {
        let mut wire = Vec::new();
        let mut tx = mac(1);
        write_mac_frame(&mut wire, &mut tx, b"first")
            .await
            .expect("write");
        let first = wire.clone();
        write_mac_frame(&mut wire, &mut tx, b"second")
            .await
            .expect("write");
        let second = wire[first.len()..].to_vec();

        let mut rx = mac(1);
        let mut r = &wire[..];
        assert_eq!(read_mac_frame(&mut r, &mut rx).await.expect("1"), b"first");
        assert_eq!(read_mac_frame(&mut r, &mut rx).await.expect("2"), b"second");

        // The first frame again, where the third belongs: a replay.
        assert!(read_mac_frame(&mut &first[..], &mut rx).await.is_err());
        // The second before the first: reordered.
        assert!(read_mac_frame(&mut &second[..], &mut mac(1)).await.is_err());
        // Another session's key.
        assert!(read_mac_frame(&mut &first[..], &mut mac(2)).await.is_err());
        // Any flipped bit.
        for i in 0..first.len() {
            let mut bad = first.clone();
            bad[i] ^= 0x10;
            assert!(
                read_mac_frame(&mut &bad[..], &mut mac(1)).await.is_err(),
                "byte {i}"
            );
        }
        // A length over the limit is refused before anything is read.
        let huge = [0xff, 0xff, 0xff, 0xff];
        assert!(read_mac_frame(&mut &huge[..], &mut mac(1)).await.is_err());
    }
}
