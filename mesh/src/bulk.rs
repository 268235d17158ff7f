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
//! The port answers anyone who can reach it, so what an unauthenticated connection may hold
//! is bounded ([`BulkLimits`], `admission`): a few handshakes per source address, a few
//! hundred in all, each dropped after a short deadline; authenticated connections are
//! counted apart. A caller whose dial fails that way (or finds the lane busy) is told the
//! lane is [`BulkFailure::Unavailable`], rests the lane to that peer for a few seconds and
//! sends its request over QUIC instead (`Transport::call_bulk`).
//!
//! Earlier releases' lanes, for a rolling upgrade: version 2 (`shoal-bulk/2`) is served and
//! offered beside version 3 (its `secure` frames carry a crc32c after the length, which
//! TLS's own authentication made redundant; its `crc` frames are version 3's); version 1
//! (`shoal-bulk/1`, crc32c-only plaintext frames in `crc`) is still served in `secure`
//! mode, where TLS protects it. The server picks the newest version both ends speak.
//!
//! Details: no TLS session tickets; the `crc` MAC keys are 64 bytes of the TLS exporter
//! (label `EXPORTER-shoal-bulk-mac-v2`), one half per direction, and the stream is taken
//! back after the acknowledgement in lock-step, so no TLS record is left buffered. Keyed
//! BLAKE3 because it ran 5.8 GiB/s on one core, against 2.9 for Poly1305 and 1.5 for
//! HMAC-SHA256 from ring. The server serves only requests the transport marks for the
//! lane (`Transport::serve_on_bulk`: shard puts and gets) and refuses the rest
//! (`reason="lane"`); deletes and control stay on QUIC. The pool keeps 8 idle connections
//! per peer; a pooled connection the peer closed (it restarted) is found when used, and the
//! request is sent once more on a fresh one (puts and gets may be sent twice). Dials leave
//! from the node's mesh address, so a peer's handshakes count against its own source.
//!
//! Refused connections are counted (`shoal_mesh_bulk_connections_refused_total{reason}`:
//! `source_limit`, `unauthenticated_limit`, `handshake_timeout`, `authenticated_limit`)
//! and logged once per source. A caller that falls back to QUIC counts
//! `shoal_mesh_bulk_fallbacks_total`, logs a WARN per failed dial and rests the lane to
//! that peer for 5 s. A dial refused after the handshake (another node, a revoked
//! certificate, another mode) and a failure after the request went are the call's error,
//! not a fallback. Measurement (`tests/tests/bulk_flood.rs`: 3,000 silent connections from
//! 60 addresses at up to 1,000 a second against one node of three, four writers of 6 MiB
//! files through another): every write went through in under a second; the lane before
//! these limits stalled them 26 s and failed some after 30 s.

mod admission;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{Mutex, OwnedSemaphorePermit, Semaphore};
use tokio_rustls::{TlsAcceptor, TlsConnector, TlsStream};
use tracing::{debug, warn};

use crate::MeshError;
use crate::identity::NodeId;
use crate::node_cert::{NodeCert, Revocations};
use crate::rpc::peer_node;
use crate::tls::TlsMaterial;
pub use admission::BulkLimits;
use admission::{Admission, Crowded};

pub(crate) const BULK_ALPN: &[u8] = b"shoal-bulk/3";
/// The previous release's lane: `secure` frames with a crc32c.
const BULK_ALPN_V2: &[u8] = b"shoal-bulk/2";
/// The release before that, served in `secure` mode only.
const BULK_ALPN_V1: &[u8] = b"shoal-bulk/1";
/// What this node offers when it dials, newest first.
const OFFERED: &[&[u8]] = &[BULK_ALPN, BULK_ALPN_V2];
const MAX_FRAME: usize = 17 << 20;
const ACK: u8 = 0x06;
/// The server's answer to the mode instead of [`ACK`] when it serves as many connections
/// as it may: the caller goes over QUIC (a previous release's caller fails the call).
const BUSY: u8 = 0x15;
const TAG_LEN: usize = 32;
/// The TLS exporter label of the `crc` frames' MAC keys (RFC 8446 section 7.5).
const MAC_LABEL: &[u8] = b"EXPORTER-shoal-bulk-mac-v2";
/// Idle connections kept per peer.
const POOL_PER_PEER: usize = 8;
/// How long a caller sends over QUIC to a peer whose bulk lane could not be connected to,
/// before it dials that lane again (its pooled connections are still used meanwhile).
const REST_AFTER_UNAVAILABLE: Duration = Duration::from_secs(5);

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

/// Why a request did not go over the bulk lane.
#[derive(Debug)]
pub(crate) enum BulkFailure {
    /// No connection could be made: the TCP connect failed, the connection was closed
    /// before its TLS handshake ended (a server over its limits does that), nothing
    /// answered within the deadline, the server said it is busy, or the lane to that
    /// peer is resting after one of these. Nothing was sent: the request may go over QUIC.
    Unavailable(std::io::Error),
    /// The peer was reached and refused this node after the handshake (another node, a
    /// revoked certificate, another mode), or the exchange failed after the request went.
    Failed(std::io::Error),
}

/// How a dial ended, when it did not end in a connection.
#[derive(Debug)]
enum DialError {
    /// Nobody completed a TLS handshake with us (see [`BulkFailure::Unavailable`]).
    Unreachable(std::io::Error),
    /// The peer was reached but the connection was refused.
    Refused(std::io::Error),
}

impl DialError {
    /// A failure of the TLS handshake itself: the connection closed under it is the lane
    /// being unreachable (a server over its limits closes it unread); anything else (a
    /// certificate refused) is a refusal.
    fn handshake(e: std::io::Error) -> Self {
        if closed_by_peer(&e) || e.kind() == std::io::ErrorKind::TimedOut {
            DialError::Unreachable(e)
        } else {
            DialError::Refused(e)
        }
    }
}

/// How the server's half of a handshake ended, when not in a connection.
pub(crate) enum AcceptError {
    /// Authenticated, but the lane serves as many connections as it may (told [`BUSY`]).
    Busy,
    /// The handshake failed.
    Io(std::io::Error),
}

impl From<std::io::Error> for AcceptError {
    fn from(e: std::io::Error) -> Self {
        AcceptError::Io(e)
    }
}

pub(crate) struct Bulk {
    mode: BulkMode,
    limits: BulkLimits,
    acceptor: TlsAcceptor,
    connector: TlsConnector,
    server_name: rustls::pki_types::ServerName<'static>,
    /// The address this node's dials come from (its mesh address), so that a server
    /// counts them as this node's, whatever route the kernel would pick.
    source: Option<IpAddr>,
    pool: Mutex<HashMap<SocketAddr, Vec<Conn>>>,
    /// Peers whose lane could not be connected to, and until when no new dial is tried.
    resting: std::sync::Mutex<HashMap<SocketAddr, Instant>>,
    revocations: Arc<Revocations>,
}

fn refused(why: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::PermissionDenied, why)
}

impl Bulk {
    pub(crate) fn new(
        mode: BulkMode,
        limits: BulkLimits,
        tls: &TlsMaterial,
        server_name: &str,
        source: Option<IpAddr>,
        revocations: Arc<Revocations>,
    ) -> Result<Self, MeshError> {
        let server_name = rustls::pki_types::ServerName::try_from(server_name.to_owned())
            .map_err(|e| MeshError::Tls(e.to_string()))?;
        // Version 1 only where TLS protects it.
        let served: &[&[u8]] = match mode {
            BulkMode::Secure => &[BULK_ALPN, BULK_ALPN_V2, BULK_ALPN_V1],
            _ => &[BULK_ALPN, BULK_ALPN_V2],
        };
        let mut lane = Self::speaking(mode, tls, server_name, revocations, served, OFFERED)?;
        lane.limits = limits;
        lane.source = source;
        Ok(lane)
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
            limits: BulkLimits::default(),
            acceptor: TlsAcceptor::from(Arc::new(tls.rustls_server_alpns(served)?)),
            connector: TlsConnector::from(Arc::new(tls.rustls_client_alpns(offered)?)),
            server_name,
            source: None,
            pool: Mutex::new(HashMap::new()),
            resting: std::sync::Mutex::new(HashMap::new()),
            revocations,
        })
    }

    /// Server half of the handshake; the connection holds one of `slots` while it is
    /// served (none left: the peer is told the lane is busy).
    pub(crate) async fn accept(
        &self,
        tcp: TcpStream,
        slots: &Arc<Semaphore>,
    ) -> Result<(Conn, OwnedSemaphorePermit), AcceptError> {
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
            return Err(AcceptError::Io(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "peer asked for bulk mode {} but the cluster uses {:?}",
                    hello[0], self.mode
                ),
            )));
        }
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tls.write_all(&[BUSY]).await?;
            tls.flush().await?;
            return Err(AcceptError::Busy);
        };
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
        let conn = Conn {
            framing,
            peer: Arc::new(peer),
        };
        Ok((conn, slot))
    }

    /// A TCP connection to `addr` from this node's address.
    async fn connect(&self, addr: SocketAddr) -> std::io::Result<TcpStream> {
        let socket = match addr {
            SocketAddr::V4(_) => TcpSocket::new_v4()?,
            SocketAddr::V6(_) => TcpSocket::new_v6()?,
        };
        if let Some(ip) = self.source.filter(|ip| ip.is_ipv4() == addr.is_ipv4()) {
            socket.bind(SocketAddr::new(ip, 0))?;
        }
        socket.connect(addr).await
    }

    /// Client half of the handshake, to the node `node` when the caller names it.
    async fn dial(&self, addr: SocketAddr, node: Option<NodeId>) -> Result<Conn, DialError> {
        let tcp = self.connect(addr).await.map_err(DialError::Unreachable)?;
        tcp.set_nodelay(true).map_err(DialError::Unreachable)?;
        let mut tls = self
            .connector
            .connect(self.server_name.clone(), tcp)
            .await
            .map_err(DialError::handshake)?;
        let peer = {
            let (_, session) = tls.get_ref();
            peer_node(session.peer_certificates(), &self.revocations)
                .map_err(|r| DialError::Refused(refused(r.reason)))?
        };
        if let Some(node) = node.filter(|n| *n != peer.node) {
            return Err(DialError::Refused(refused(format!(
                "expected node {node} at {addr}, its certificate is node {} ({})",
                peer.node, peer.name
            ))));
        }
        let mut ack = [0u8; 1];
        let exchanged = async {
            tls.write_all(&[self.mode.wire()]).await?;
            tls.flush().await?;
            tls.read_exact(&mut ack).await
        };
        // A server that dislikes the mode closes the connection: a refusal.
        exchanged.await.map_err(DialError::Refused)?;
        match ack[0] {
            ACK => {}
            BUSY => {
                return Err(DialError::Unreachable(std::io::Error::other(
                    "the peer's bulk lane serves as many connections as it may",
                )));
            }
            _ => {
                return Err(DialError::Refused(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "bulk handshake refused",
                )));
            }
        }
        // Nothing follows the acknowledgement until we speak, so no TLS record is left
        // buffered when `crc` takes the TCP stream back.
        let framing = match self.mode {
            BulkMode::Crc => {
                let (to_server, to_client) =
                    mac_keys(tls.get_ref().1).map_err(DialError::Refused)?;
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

    /// A fresh connection to `addr`, within the handshake deadline. A lane that cannot be
    /// connected to rests: no dial is tried for [`REST_AFTER_UNAVAILABLE`] (each would
    /// cost its caller up to the deadline before it goes over QUIC).
    async fn dial_or_rest(
        &self,
        addr: SocketAddr,
        node: Option<NodeId>,
    ) -> Result<Conn, BulkFailure> {
        let now = Instant::now();
        {
            let mut resting = self.resting.lock().unwrap_or_else(|p| p.into_inner());
            match resting.get(&addr) {
                Some(until) if *until > now => {
                    return Err(BulkFailure::Unavailable(std::io::Error::other(format!(
                        "the bulk lane to {addr} rests for {:?} after a failed dial",
                        *until - now
                    ))));
                }
                Some(_) => {
                    resting.remove(&addr);
                }
                None => {}
            }
        }
        let deadline = self.limits.handshake_timeout;
        let error = match tokio::time::timeout(deadline, self.dial(addr, node)).await {
            Ok(Ok(conn)) => return Ok(conn),
            Ok(Err(DialError::Refused(e))) => return Err(BulkFailure::Failed(e)),
            Ok(Err(DialError::Unreachable(e))) => e,
            Err(_) => std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no bulk handshake within {deadline:?}"),
            ),
        };
        // Handled here: the callers go over QUIC meanwhile.
        warn!(%addr, %error, "cannot connect to the peer's bulk lane; its shard requests go over QUIC for {REST_AFTER_UNAVAILABLE:?}");
        self.resting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(addr, now + REST_AFTER_UNAVAILABLE);
        Err(BulkFailure::Unavailable(error))
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
    ) -> Result<Vec<u8>, BulkFailure> {
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
                Err(e) => return Err(BulkFailure::Failed(e)),
            }
        }
        let mut conn = self.dial_or_rest(addr, node).await?;
        let response = conn
            .round_trip(request)
            .await
            .map_err(BulkFailure::Failed)?;
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

/// Why the accept loop dropped a connection before serving it.
pub(crate) enum Rejection {
    /// Closed unread: too many handshakes under way (from its source, or in all).
    Crowded(Crowded),
    /// No handshake within the deadline.
    Timeout,
    /// Authenticated, but the lane serves as many connections as it may.
    Busy,
    /// The handshake failed.
    Handshake(String),
}

/// Accept loop: each connection serves requests one after another through `dispatch`,
/// which is told the node the connection belongs to. Every connection is accepted at once
/// (a full backlog would stall peers' connects too) and dropped unread when its source,
/// or everyone, has as many handshakes under way as `limits` allow.
pub(crate) async fn serve<F, Fut>(
    listener: TcpListener,
    bulk: Arc<Bulk>,
    dispatch: F,
    on_reject: impl Fn(SocketAddr, Rejection) + Send + Sync + 'static,
) where
    F: Fn(Vec<u8>, Arc<NodeCert>) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Vec<u8>> + Send,
{
    let on_reject = Arc::new(on_reject);
    let admission = Admission::new(bulk.limits);
    let slots = Arc::new(Semaphore::new(bulk.limits.authenticated));
    loop {
        let Ok((tcp, remote)) = listener.accept().await else {
            // Out of descriptors, most likely: let some connections end first.
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let ticket = match admission.admit(remote.ip()) {
            Ok(t) => t,
            Err(crowded) => {
                drop(tcp);
                on_reject(remote, Rejection::Crowded(crowded));
                continue;
            }
        };
        let (bulk, dispatch) = (bulk.clone(), dispatch.clone());
        let (on_reject, slots) = (on_reject.clone(), slots.clone());
        tokio::spawn(async move {
            // A peer that connects and stalls the handshake holds its slot only this long.
            let deadline = bulk.limits.handshake_timeout;
            let handshake = tokio::time::timeout(deadline, bulk.accept(tcp, &slots)).await;
            drop(ticket);
            let (conn, slot) = match handshake {
                Ok(Ok(c)) => c,
                Ok(Err(AcceptError::Busy)) => return on_reject(remote, Rejection::Busy),
                Ok(Err(AcceptError::Io(e))) => {
                    return on_reject(remote, Rejection::Handshake(e.to_string()));
                }
                Err(_) => return on_reject(remote, Rejection::Timeout),
            };
            serve_connection(conn, remote, dispatch).await;
            drop(slot);
        });
    }
}

/// Serves one authenticated connection's requests until it ends.
async fn serve_connection<F, Fut>(mut conn: Conn, remote: SocketAddr, dispatch: F)
where
    F: Fn(Vec<u8>, Arc<NodeCert>) -> Fut,
    Fut: std::future::Future<Output = Vec<u8>>,
{
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
            let slots = Arc::new(Semaphore::new(1));
            let Ok((mut conn, _slot)) = server.accept(tcp, &slots).await else {
                panic!("server handshake");
            };
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
