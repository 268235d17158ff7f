//! Typed request/response RPC over QUIC with mutual TLS.
//!
//! Each request is one bidirectional stream:
//!
//! ```text
//! request:  postcard(RequestHead { version, endpoint, from }) ++ postcard(message)
//! response: version (1) | status (1) | postcard(response)
//!           or, for status "error", class (1) | UTF-8 text (a [`Refusal`])
//! ```
//!
//! A handler refuses with a [`Refusal`]: a [`FailureClass`] travels with the text, so the
//! caller's retry loop decides from the class, never from the words.
//!
//! A feature defines its messages by implementing [`Rpc`] and registers one handler per
//! message type with [`Transport::register`].
//!
//! Both sides present a certificate of the cluster CA carrying the DNS name `shoal-node`;
//! the agent checks its own against the CA at start and refuses to run with a foreign one.
//! A request whose `from` claims another node than the peer's certificate is refused
//! (`shoal_mesh_rpc_requests_refused_total{reason="impersonation"}`), and callers that know
//! whom they call (`call_to`, `call_bulk`: shard RPCs, Raft, forwarding) refuse a peer
//! whose certificate names another node. Failed handshakes are counted
//! (`shoal_mesh_rpc_connections_rejected_total`) and logged once per source.
//!
//! One pooled connection per peer carries every call as its own stream. A call that times
//! out (or whose stream fails) takes that connection out of the pool, so the next call
//! dials afresh, without closing it: the calls still under way on it finish. A request is
//! sized before it is encoded, so its buffer never grows by copying, and shard bytes stay
//! slices of the frame they arrived in (`Rpc::decode_request`, `Rpc::decode_response`).

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tracing::{debug, warn};

use crate::MeshError;
use crate::bulk::{self, Bulk, BulkFailure, BulkLimits, BulkMode, Rejection};
use crate::identity::NodeId;
use crate::metrics::{EndpointLabel, MeshMetrics, ReasonLabel, RpcLabel};
use crate::node_cert::{NodeCert, Revocations};
use crate::sim_net::SimNet;
use crate::tls::TlsFiles;

/// Wire version of the RPC framing.
pub const RPC_VERSION: u8 = 1;
/// Largest request or response accepted (head and body). A caller sending more gets
/// [`MeshError::MessageTooLarge`] without anything being sent.
pub const MAX_MESSAGE: usize = 16 << 20;

/// A response frame starts with the RPC version and a status byte.
const RESPONSE_HEAD: usize = 2;
const STATUS_OK: u8 = 0;
const STATUS_ERROR: u8 = 1;
const STATUS_NO_HANDLER: u8 = 2;

/// `body` after room for a response head (filled in by `answer`).
fn with_head(body: Vec<u8>) -> Vec<u8> {
    let mut frame = Vec::with_capacity(RESPONSE_HEAD + body.len());
    frame.resize(RESPONSE_HEAD, 0);
    frame.extend_from_slice(&body);
    frame
}

/// A request message with its response type, addressed by a stable endpoint name.
pub trait Rpc: Serialize + DeserializeOwned + Send + 'static {
    const ENDPOINT: &'static str;
    type Response: Serialize + DeserializeOwned + Send + 'static;

    /// Decodes a response from `body`, a slice of the frame it arrived in. A response
    /// that carries bulk bytes may take them as slices of `body` instead of copies.
    fn decode_response(body: Bytes) -> Result<Self::Response, postcard::Error> {
        postcard::from_bytes(&body)
    }

    /// Decodes a request from `body`, a slice of the frame it arrived in; like
    /// [`Rpc::decode_response`], a request that carries bulk bytes may keep them there.
    fn decode_request(body: Bytes) -> Result<Self, postcard::Error> {
        postcard::from_bytes(&body)
    }
}

/// The size of `value`'s postcard encoding, without encoding it: a buffer of that size
/// takes the encoding without growing (and copying) on the way.
fn encoded_len<T: Serialize + ?Sized>(value: &T) -> Result<usize, postcard::Error> {
    postcard::serialize_with_flavor(value, postcard::ser_flavors::Size::default())
}

#[derive(Serialize, Deserialize)]
struct RequestHead {
    version: u8,
    endpoint: String,
    from: NodeId,
}

/// What kind of failure a refusal is: whether the caller may try again, and why not.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FailureClass {
    /// Try again later (the peer is busy, electing, not yet ready).
    Retryable,
    /// What was asked for is not there.
    NotFound,
    /// No room for it.
    NoSpace,
    /// The data is damaged.
    Corrupt,
    /// The peer will not do it (not allowed, or not its role).
    Refused,
    /// The request itself is malformed.
    Invalid,
}

impl FailureClass {
    const ALL: [FailureClass; 6] = [
        FailureClass::Retryable,
        FailureClass::NotFound,
        FailureClass::NoSpace,
        FailureClass::Corrupt,
        FailureClass::Refused,
        FailureClass::Invalid,
    ];

    fn wire(self) -> u8 {
        self as u8
    }

    fn from_wire(b: u8) -> Option<FailureClass> {
        FailureClass::ALL.get(usize::from(b)).copied()
    }
}

/// A handler's refusal of a request: its class and the text for the operator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub class: FailureClass,
    pub message: String,
}

impl Refusal {
    pub fn new(class: FailureClass, message: impl Into<String>) -> Refusal {
        Refusal {
            class,
            message: message.into(),
        }
    }

    fn encode(&self) -> Vec<u8> {
        let mut out = vec![self.class.wire()];
        out.extend_from_slice(self.message.as_bytes());
        out
    }

    /// Reads an error body. A peer of the release before classes sent bare text: that is
    /// a refusal (text never starts with a class byte, which are control characters).
    fn decode(body: &[u8]) -> Refusal {
        match body.split_first() {
            Some((&b, text)) if FailureClass::from_wire(b).is_some() => Refusal {
                class: FailureClass::from_wire(b).unwrap_or(FailureClass::Refused),
                message: String::from_utf8_lossy(text).into_owned(),
            },
            _ => Refusal::new(
                FailureClass::Refused,
                String::from_utf8_lossy(body).into_owned(),
            ),
        }
    }
}

/// A response frame: the body of an answer, or the peer's refusal; `Err` for a frame that
/// is neither.
pub(crate) fn split_response(response: &[u8]) -> Result<Result<&[u8], Refusal>, String> {
    match response {
        [RPC_VERSION, STATUS_OK, body @ ..] => Ok(Ok(body)),
        [RPC_VERSION, STATUS_NO_HANDLER, text @ ..] => Ok(Err(Refusal::new(
            FailureClass::Refused,
            String::from_utf8_lossy(text).into_owned(),
        ))),
        [RPC_VERSION, _, body @ ..] => Ok(Err(Refusal::decode(body))),
        [v, ..] => Err(format!("unsupported RPC version {v}")),
        [] => Err("empty response".into()),
    }
}

/// A request frame's head and the message bytes after it.
pub(crate) fn split_request(request: &[u8]) -> Result<(u8, String, NodeId, &[u8]), String> {
    let (head, body) = postcard::take_from_bytes::<RequestHead>(request)
        .map_err(|e| format!("malformed request head: {e}"))?;
    Ok((head.version, head.endpoint, head.from, body))
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;
/// A registered handler: the request's bytes in, the encoded response after
/// [`RESPONSE_HEAD`] bytes of room (or a refusal) out.
type Handler = Arc<dyn Fn(NodeId, Bytes) -> BoxFuture<Result<Vec<u8>, Refusal>> + Send + Sync>;

const MAX_LOGGED_SOURCES: usize = 1024;

/// Which requests of an endpoint the bulk lane serves, from the message's encoded bytes
/// (e.g. its enum variant).
pub type BulkFilter = fn(&[u8]) -> bool;

/// This node's QUIC endpoint: serves registered handlers and calls peers.
pub struct Transport {
    wire: Wire,
    server_name: String,
    me: NodeId,
    handlers: RwLock<HashMap<&'static str, (&'static str, Handler)>>,
    /// Endpoints the bulk lane serves (everything else is QUIC only).
    bulk_endpoints: RwLock<HashMap<&'static str, BulkFilter>>,
    /// Pooled connections, with the node their certificate names.
    connections: tokio::sync::Mutex<HashMap<SocketAddr, (quinn::Connection, Arc<NodeCert>)>>,
    metrics: MeshMetrics,
    logged_sources: Mutex<HashSet<IpAddr>>,
    /// Sources whose bulk connections were dropped for the lane's limits (logged once).
    bulk_logged_sources: Mutex<HashSet<IpAddr>>,
    tls: TlsFiles,
    /// The TCP bulk lane, once started.
    bulk: std::sync::OnceLock<Arc<Bulk>>,
    /// The cluster's revoked certificates, and the newest each peer showed.
    revocations: Arc<Revocations>,
    /// When a peer's refusal of this node's revoked certificate was last logged.
    revoked_logged: Mutex<Option<Instant>>,
}

/// QUIC close code of a connection whose peer certificate was refused.
const CLOSE_REFUSED: u32 = 1;
/// QUIC close code of a connection whose peer certificate is revoked: the peer learns why
/// (its own replica may never see the revocation, once every other node refuses it).
const CLOSE_REVOKED: u32 = 2;
/// How often a node whose certificate its peers refuse as revoked says so in its log.
const REVOKED_LOG_EVERY: Duration = Duration::from_secs(60);

/// Why a peer's certificate was refused, and the QUIC close code that tells the peer.
pub(crate) struct CertRefused {
    pub code: u32,
    pub reason: String,
}

/// The certificate chain a TLS peer presented, as the node it names; refused when it
/// names none or the cluster revoked it.
pub(crate) fn peer_node(
    chain: Option<&[rustls::pki_types::CertificateDer<'_>]>,
    revocations: &Revocations,
) -> Result<NodeCert, CertRefused> {
    let refused = |reason: String| CertRefused {
        code: CLOSE_REFUSED,
        reason,
    };
    let der = chain
        .and_then(|c| c.first())
        .ok_or_else(|| refused("the peer presented no certificate".into()))?;
    let cert = NodeCert::from_der(der).map_err(refused)?;
    if revocations.is_revoked(&cert) {
        return Err(CertRefused {
            code: CLOSE_REVOKED,
            reason: format!(
                "the certificate of {} (node {}, issued at {} ms) is revoked",
                cert.name, cert.node, cert.issued_ms
            ),
        });
    }
    revocations.shown(&cert);
    Ok(cert)
}

/// The node a QUIC connection's peer certificate names.
fn quic_peer(conn: &quinn::Connection, revocations: &Revocations) -> Result<NodeCert, CertRefused> {
    let identity = conn.peer_identity();
    let chain = identity
        .as_ref()
        .and_then(|i| i.downcast_ref::<Vec<rustls::pki_types::CertificateDer<'static>>>());
    peer_node(chain.map(Vec::as_slice), revocations)
}

/// What carries this endpoint's calls: QUIC, or the simulator's network.
enum Wire {
    Quic(quinn::Endpoint),
    Sim {
        net: Arc<SimNet>,
        addr: SocketAddr,
        closed: std::sync::atomic::AtomicBool,
    },
}

pub(crate) enum QuicFailure {
    Connect(MeshError),
    Stream(String),
}

/// Which lane a request arrived on.
#[derive(Clone, Copy)]
pub(crate) enum Lane {
    Quic,
    Bulk,
}

/// Where a call goes.
#[derive(Clone, Copy)]
enum Route {
    /// Over QUIC to this address.
    Quic(SocketAddr),
    /// Over the bulk lane to `bulk`; over QUIC to `quic` when that lane cannot connect.
    Bulk { bulk: SocketAddr, quic: SocketAddr },
}

impl Route {
    /// The address tried first (named in a timeout).
    fn first(self) -> SocketAddr {
        match self {
            Route::Quic(a) => a,
            Route::Bulk { bulk, .. } => bulk,
        }
    }
}

impl Transport {
    /// Binds the endpoint. `server_name` is the DNS name every node certificate carries.
    pub fn bind(
        addr: SocketAddr,
        tls: &TlsFiles,
        server_name: &str,
        me: NodeId,
        metrics: MeshMetrics,
    ) -> Result<Arc<Self>, MeshError> {
        let material = tls.load()?;
        material.check_node_cert(server_name, tls)?;
        let mut endpoint = quinn::Endpoint::server(material.server_config()?, addr)
            .map_err(|source| MeshError::Bind { addr, source })?;
        endpoint.set_default_client_config(material.client_config()?);
        Ok(Arc::new(Transport::new(
            Wire::Quic(endpoint),
            server_name,
            me,
            metrics,
            tls.clone(),
        )))
    }

    /// An endpoint on the simulator's network at `addr` (see [`SimNet`]): the same
    /// handlers, framing and checks, without QUIC, TLS or a bulk lane.
    pub fn sim(net: &Arc<SimNet>, addr: SocketAddr, me: NodeId) -> Arc<Self> {
        let wire = Wire::Sim {
            net: net.clone(),
            addr,
            closed: std::sync::atomic::AtomicBool::new(false),
        };
        let none = TlsFiles {
            ca_cert: Default::default(),
            node_cert: Default::default(),
            node_key: Default::default(),
        };
        let metrics = MeshMetrics::register(&mut prometheus_client::registry::Registry::default());
        let t = Arc::new(Transport::new(wire, "sim", me, metrics, none));
        net.attach(addr, &t);
        t
    }

    fn new(wire: Wire, server_name: &str, me: NodeId, metrics: MeshMetrics, tls: TlsFiles) -> Self {
        Transport {
            wire,
            server_name: server_name.to_owned(),
            me,
            handlers: RwLock::new(HashMap::new()),
            bulk_endpoints: RwLock::new(HashMap::new()),
            connections: tokio::sync::Mutex::new(HashMap::new()),
            metrics,
            logged_sources: Mutex::new(HashSet::new()),
            bulk_logged_sources: Mutex::new(HashSet::new()),
            tls,
            bulk: std::sync::OnceLock::new(),
            revocations: Arc::new(Revocations::default()),
            revoked_logged: Mutex::new(None),
        }
    }

    /// The node this endpoint speaks for.
    pub fn node(&self) -> NodeId {
        self.me
    }

    /// Starts the TCP bulk lane at `addr` in `mode` (nothing for [`BulkMode::Off`]), with
    /// the default limits on incoming connections.
    pub async fn start_bulk(
        self: &Arc<Self>,
        addr: SocketAddr,
        mode: BulkMode,
    ) -> Result<Option<tokio::task::JoinHandle<()>>, MeshError> {
        self.start_bulk_with(addr, mode, BulkLimits::default())
            .await
    }

    /// Like [`Transport::start_bulk`], with `limits` on incoming connections.
    pub async fn start_bulk_with(
        self: &Arc<Self>,
        addr: SocketAddr,
        mode: BulkMode,
        limits: BulkLimits,
    ) -> Result<Option<tokio::task::JoinHandle<()>>, MeshError> {
        if mode == BulkMode::Off {
            return Ok(None);
        }
        if let Wire::Sim { .. } = self.wire {
            return Err(MeshError::RpcConnect {
                peer: addr,
                reason: "the simulated network has no bulk lane".into(),
            });
        }
        // Dials leave from the QUIC endpoint's address: the node's own.
        let source = self.local_addr().map(|a| a.ip());
        let bulk = Arc::new(Bulk::new(
            mode,
            limits,
            &self.tls.load()?,
            &self.server_name,
            source.filter(|ip| !ip.is_unspecified()),
            self.revocations.clone(),
        )?);
        let listener = bulk::bind(addr).await?;
        let _ = self.bulk.set(bulk.clone());
        let (this, rejecter) = (self.clone(), self.clone());
        let dispatch = move |request: Vec<u8>, peer: Arc<NodeCert>| {
            let this = this.clone();
            async move { this.answer(request.into(), &peer, Lane::Bulk).await }
        };
        let on_reject = move |remote: SocketAddr, why: Rejection| rejecter.reject_bulk(remote, why);
        Ok(Some(tokio::spawn(bulk::serve(
            listener, bulk, dispatch, on_reject,
        ))))
    }

    /// Lets the bulk lane serve requests of `M` that `filter` accepts (by their encoded
    /// bytes); they must also be registered with [`Transport::register`]. Nothing else
    /// travels on the bulk lane: it carries payloads, not control.
    pub fn serve_on_bulk<M: Rpc>(&self, filter: BulkFilter) {
        self.bulk_endpoints
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(M::ENDPOINT, filter);
    }

    /// The cluster's revocations as this node knows them (the agent keeps them current).
    pub fn revocations(&self) -> &Arc<Revocations> {
        &self.revocations
    }

    /// Whether the bulk lane is running.
    pub fn has_bulk(&self) -> bool {
        self.bulk.get().is_some()
    }

    pub fn local_addr(&self) -> Option<SocketAddr> {
        match &self.wire {
            Wire::Quic(endpoint) => endpoint.local_addr().ok(),
            Wire::Sim { addr, .. } => Some(*addr),
        }
    }

    /// Serves requests of type `M` with `handler` (the caller's node id and the message in,
    /// the response or a refusal out).
    pub fn register<M, F, Fut>(&self, handler: F)
    where
        M: Rpc,
        F: Fn(NodeId, M) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<M::Response, Refusal>> + Send + 'static,
    {
        let handler = Arc::new(handler);
        let erased: Handler = Arc::new(move |from, body: Bytes| {
            let decoded = M::decode_request(body);
            let handler = handler.clone();
            Box::pin(async move {
                let msg = decoded.map_err(|e| {
                    Refusal::new(
                        FailureClass::Invalid,
                        format!("malformed {}: {e}", M::ENDPOINT),
                    )
                })?;
                let resp = handler(from, msg).await?;
                // Sized first, then encoded once into the frame after room for its head:
                // a shard in the answer is copied once here, not again into the frame nor at
                // every doubling of a growing buffer.
                let size = encoded_len(&resp)
                    .map_err(|e| Refusal::new(FailureClass::Refused, e.to_string()))?;
                let mut frame = Vec::with_capacity(RESPONSE_HEAD + size);
                frame.resize(RESPONSE_HEAD, 0);
                postcard::to_extend(&resp, frame)
                    .map_err(|e| Refusal::new(FailureClass::Refused, e.to_string()))
            })
        });
        self.handlers
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(M::ENDPOINT, (M::ENDPOINT, erased));
    }

    /// Accepts connections until the endpoint is closed.
    /// (On the simulated network, the network calls the handlers: nothing to accept.)
    pub fn serve(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        let Wire::Quic(endpoint) = &self.wire else {
            return tokio::spawn(async {});
        };
        let endpoint = endpoint.clone();
        tokio::spawn(async move {
            while let Some(incoming) = endpoint.accept().await {
                let this = this.clone();
                tokio::spawn(async move {
                    let remote = incoming.remote_address();
                    match incoming.await {
                        Ok(conn) => match quic_peer(&conn, &this.revocations) {
                            Ok(peer) => this.serve_connection(conn, Arc::new(peer)).await,
                            Err(refused) => {
                                conn.close(refused.code.into(), refused.reason.as_bytes());
                                this.reject(remote, &refused.reason);
                            }
                        },
                        Err(e) => {
                            this.reject(remote, &e.to_string());
                            this.note_revoked(remote, Some(&e));
                        }
                    }
                });
            }
        })
    }

    /// Counts a connection refused (`reason`: the metric's label).
    fn count_rejected(&self, reason: &'static str) {
        self.metrics
            .rpc_connections_rejected
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    fn reject(&self, remote: SocketAddr, reason: &str) {
        self.count_rejected("handshake");
        let mut logged = self
            .logged_sources
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if logged.len() < MAX_LOGGED_SOURCES && logged.insert(remote.ip()) {
            warn!(%remote, %reason, "rejected a QUIC or bulk connection (logged once per source)");
        }
    }

    /// Counts (and logs once per source) a bulk connection dropped before it was served.
    fn reject_bulk(&self, remote: SocketAddr, why: Rejection) {
        let reason = match why {
            Rejection::Handshake(e) => return self.reject(remote, &e),
            Rejection::Crowded(c) => c.reason(),
            Rejection::Timeout => "handshake_timeout",
            Rejection::Busy => "authenticated_limit",
        };
        self.metrics
            .bulk_connections_refused
            .get_or_create(&ReasonLabel { reason })
            .inc();
        let mut logged = self
            .bulk_logged_sources
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if logged.len() < MAX_LOGGED_SOURCES && logged.insert(remote.ip()) {
            warn!(%remote, reason, "dropped a bulk lane connection before it was served (logged once per source)");
        }
    }

    async fn serve_connection(self: Arc<Self>, conn: quinn::Connection, peer: Arc<NodeCert>) {
        loop {
            match conn.accept_bi().await {
                Ok((send, recv)) => {
                    let (this, peer) = (self.clone(), peer.clone());
                    tokio::spawn(async move { this.serve_stream(send, recv, &peer).await });
                }
                Err(e) => {
                    debug!(remote = %conn.remote_address(), error = %e, "connection closed");
                    self.note_revoked(conn.remote_address(), Some(&e));
                    return;
                }
            }
        }
    }

    async fn serve_stream(
        self: Arc<Self>,
        mut send: quinn::SendStream,
        mut recv: quinn::RecvStream,
        peer: &NodeCert,
    ) {
        let request = match recv.read_to_end(MAX_MESSAGE).await {
            Ok(r) => r,
            Err(e) => {
                debug!(error = %e, "request read failed");
                return;
            }
        };
        let frame = self.answer(request.into(), peer, Lane::Quic).await;
        if let Err(e) = send.write_all(&frame).await {
            debug!(error = %e, "response write failed");
            return;
        }
        let _ = send.finish();
        // Wait for the peer to read the response before the stream is dropped.
        let _ = send.stopped().await;
    }

    /// Serves one framed request from `peer` on `lane`: dispatch, count, and frame the
    /// response.
    pub(crate) async fn answer(&self, request: Bytes, peer: &NodeCert, lane: Lane) -> Vec<u8> {
        let (status, body, endpoint) = self.dispatch(request, peer, lane).await;
        if let Some(endpoint) = endpoint {
            let outcome = if status == STATUS_OK { "ok" } else { "error" };
            self.metrics
                .rpc_requests
                .get_or_create(&RpcLabel {
                    endpoint,
                    side: "server",
                    outcome,
                })
                .inc();
        }
        // A handler's answer comes with room for the head (it may be a shard, not copied
        // again here); the short refusals are copied behind one.
        let mut frame = if status == STATUS_OK {
            body
        } else {
            with_head(body)
        };
        if let Some(head) = frame.get_mut(..RESPONSE_HEAD) {
            head.copy_from_slice(&[RPC_VERSION, status]);
        }
        frame
    }

    /// Counts a request refused before its handler, and the refusal to send back.
    fn refuse(&self, reason: &'static str, message: String) -> (u8, Vec<u8>, Option<&'static str>) {
        self.metrics
            .rpc_requests_refused
            .get_or_create(&ReasonLabel { reason })
            .inc();
        debug!(reason, %message, "refused a request");
        (
            STATUS_ERROR,
            Refusal::new(FailureClass::Refused, message).encode(),
            None,
        )
    }

    /// The status and body of the answer to `request` (with `STATUS_OK`, the body after
    /// room for the response head), and the endpoint when one was found.
    async fn dispatch(
        &self,
        request: Bytes,
        peer: &NodeCert,
        lane: Lane,
    ) -> (u8, Vec<u8>, Option<&'static str>) {
        let (head, body) = match postcard::take_from_bytes::<RequestHead>(&request) {
            Ok((head, body)) => (head, request.slice_ref(body)),
            Err(e) => {
                let r = Refusal::new(
                    FailureClass::Invalid,
                    format!("malformed request head: {e}"),
                );
                return (STATUS_ERROR, r.encode(), None);
            }
        };
        if head.version != RPC_VERSION {
            let msg = format!("unsupported RPC version {}", head.version);
            return (
                STATUS_ERROR,
                Refusal::new(FailureClass::Invalid, msg).encode(),
                None,
            );
        }
        // The connection proved the peer's certificate; the request may speak only for
        // the node that certificate names, and only while the cluster has not revoked it.
        if head.from != peer.node {
            return self.refuse(
                "impersonation",
                format!(
                    "claims to be node {} but its certificate is node {} ({})",
                    head.from, peer.node, peer.name
                ),
            );
        }
        if self.revocations.is_revoked(peer) {
            return self.refuse(
                "revoked",
                format!("the certificate of {} is revoked", peer.name),
            );
        }
        if let Lane::Bulk = lane {
            let filter = self
                .bulk_endpoints
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .get(head.endpoint.as_str())
                .copied();
            if !filter.is_some_and(|allow| allow(&body)) {
                return self.refuse(
                    "lane",
                    format!("{} is not served on the bulk lane", head.endpoint),
                );
            }
        }
        let found = self
            .handlers
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(head.endpoint.as_str())
            .cloned();
        let Some((name, handler)) = found else {
            let msg = format!("no handler for {}", head.endpoint);
            return (STATUS_NO_HANDLER, msg.into_bytes(), None);
        };
        match handler(head.from, body).await {
            Ok(resp) => (STATUS_OK, resp, Some(name)),
            Err(refusal) => (STATUS_ERROR, refusal.encode(), Some(name)),
        }
    }

    /// Sends `msg` over QUIC to the peer at `peer` and waits up to `timeout` for its
    /// response.
    pub async fn call<M: Rpc>(
        &self,
        peer: SocketAddr,
        msg: &M,
        timeout: Duration,
    ) -> Result<M::Response, MeshError> {
        self.call_on(Route::Quic(peer), None, msg, timeout).await
    }

    /// Like [`Transport::call`], to the node `node` at `peer`: refused unless the peer's
    /// certificate names that node (an address gossip got wrong, or a node holding
    /// another's address, is never sent what was meant for `node`).
    pub async fn call_to<M: Rpc>(
        &self,
        node: NodeId,
        peer: SocketAddr,
        msg: &M,
        timeout: Duration,
    ) -> Result<M::Response, MeshError> {
        self.call_on(Route::Quic(peer), Some(node), msg, timeout)
            .await
    }

    /// Like [`Transport::call_to`], over the TCP bulk lane to the node's bulk address
    /// `bulk`; over QUIC to its RPC address `rpc` when this node runs no bulk lane, or
    /// when that lane cannot connect (its port refuses or drops the connection before the
    /// handshake ends, or says it is busy, or nothing answers within the handshake
    /// deadline: e.g. someone floods the port). A request already sent on the lane is not
    /// sent again over QUIC: its failure is the call's.
    pub async fn call_bulk<M: Rpc>(
        &self,
        node: NodeId,
        rpc: SocketAddr,
        bulk: SocketAddr,
        msg: &M,
        timeout: Duration,
    ) -> Result<M::Response, MeshError> {
        let route = if self.has_bulk() {
            Route::Bulk { bulk, quic: rpc }
        } else {
            Route::Quic(rpc)
        };
        self.call_on(route, Some(node), msg, timeout).await
    }

    async fn call_on<M: Rpc>(
        &self,
        route: Route,
        node: Option<NodeId>,
        msg: &M,
        timeout: Duration,
    ) -> Result<M::Response, MeshError> {
        let started = Instant::now();
        let call = self.call_inner(route, node, msg);
        let res = match tokio::time::timeout(timeout, call).await {
            Ok(r) => r,
            Err(_) => Err(MeshError::RpcTimeout {
                endpoint: M::ENDPOINT,
                peer: route.first(),
            }),
        };
        if let Err(MeshError::RpcTimeout { peer, .. } | MeshError::RpcStream { peer, .. }) = &res {
            // The peer may have restarted behind a connection that has not timed out yet:
            // the next call dials afresh.
            match (route, self.bulk.get()) {
                (Route::Bulk { bulk, .. }, Some(b)) if *peer == bulk => b.forget(bulk).await,
                _ => self.forget_peer(*peer).await,
            }
        }
        let outcome = if res.is_ok() { "ok" } else { "error" };
        self.metrics
            .rpc_requests
            .get_or_create(&RpcLabel {
                endpoint: M::ENDPOINT,
                side: "client",
                outcome,
            })
            .inc();
        if res.is_ok() {
            self.metrics
                .rpc_latency_seconds
                .get_or_create(&EndpointLabel {
                    endpoint: M::ENDPOINT,
                })
                .observe(started.elapsed().as_secs_f64());
        }
        res
    }

    async fn call_inner<M: Rpc>(
        &self,
        route: Route,
        node: Option<NodeId>,
        msg: &M,
    ) -> Result<M::Response, MeshError> {
        let stream_err = |peer: SocketAddr, reason: String| MeshError::RpcStream {
            endpoint: M::ENDPOINT,
            peer,
            reason,
        };
        let head = RequestHead {
            version: RPC_VERSION,
            endpoint: M::ENDPOINT.to_owned(),
            from: self.me,
        };
        // Sized first, then encoded once: a shard in the request is copied once, not again
        // at every doubling of a growing buffer.
        let sized = |e: postcard::Error| stream_err(route.first(), e.to_string());
        let size = encoded_len(&head).map_err(sized)? + encoded_len(msg).map_err(sized)?;
        let request = postcard::to_extend(&head, Vec::with_capacity(size)).map_err(sized)?;
        let request = postcard::to_extend(msg, request).map_err(sized)?;
        if request.len() > MAX_MESSAGE {
            return Err(MeshError::MessageTooLarge {
                endpoint: M::ENDPOINT,
                bytes: request.len(),
                max: MAX_MESSAGE,
            });
        }
        let request = &request[..];
        let quic = |peer: SocketAddr| async move {
            let answer = self.exchange(peer, node, request).await;
            let answer = answer.map_err(|e| match e {
                QuicFailure::Connect(e) => e,
                QuicFailure::Stream(reason) => stream_err(peer, reason),
            });
            answer.map(|r| (peer, r))
        };
        let (peer, response) = match (route, self.bulk.get()) {
            (Route::Bulk { bulk, quic: rpc }, Some(lane)) => {
                match lane.exchange(bulk, node, request).await {
                    Ok(r) => (bulk, r),
                    // Nothing was sent: the same request goes over QUIC (the lane logged
                    // why when it first failed).
                    Err(BulkFailure::Unavailable(e)) => {
                        self.metrics.bulk_fallbacks.inc();
                        debug!(%bulk, %rpc, error = %e, endpoint = M::ENDPOINT, "bulk lane unavailable; sending over QUIC");
                        quic(rpc).await?
                    }
                    Err(BulkFailure::Failed(e)) => return Err(stream_err(bulk, e.to_string())),
                }
            }
            (Route::Bulk { quic: rpc, .. }, None) | (Route::Quic(rpc), _) => quic(rpc).await?,
        };
        let response = Bytes::from(response);
        match split_response(&response) {
            Ok(Ok(body)) => M::decode_response(response.slice_ref(body))
                .map_err(|e| MeshError::RpcDecode(e.to_string())),
            Ok(Err(refusal)) => Err(MeshError::RpcRemote {
                endpoint: M::ENDPOINT,
                peer,
                class: refusal.class,
                message: refusal.message,
            }),
            Err(e) => Err(MeshError::RpcDecode(e)),
        }
    }

    /// One request to `peer` and its answer, on the wire this endpoint has.
    async fn exchange(
        &self,
        peer: SocketAddr,
        node: Option<NodeId>,
        request: &[u8],
    ) -> Result<Vec<u8>, QuicFailure> {
        match &self.wire {
            Wire::Quic(endpoint) => self.exchange_quic(endpoint, peer, node, request).await,
            Wire::Sim { net, addr, closed } => {
                if closed.load(std::sync::atomic::Ordering::Acquire) {
                    return Err(QuicFailure::Connect(MeshError::RpcConnect {
                        peer,
                        reason: "this endpoint is closed".into(),
                    }));
                }
                net.exchange(self.me, *addr, peer, node, request).await
            }
        }
    }

    /// One request on a fresh bidirectional stream of the pooled connection to `peer`.
    async fn exchange_quic(
        &self,
        endpoint: &quinn::Endpoint,
        peer: SocketAddr,
        node: Option<NodeId>,
        request: &[u8],
    ) -> Result<Vec<u8>, QuicFailure> {
        let (conn, cert) = self
            .connection(endpoint, peer)
            .await
            .map_err(QuicFailure::Connect)?;
        if let Some(node) = node.filter(|n| *n != cert.node) {
            return Err(QuicFailure::Connect(MeshError::RpcConnect {
                peer,
                reason: format!(
                    "expected node {node} there, its certificate is node {} ({})",
                    cert.node, cert.name
                ),
            }));
        }
        if self.revocations.is_revoked(&cert) {
            self.forget(peer, &conn).await;
            return Err(QuicFailure::Connect(MeshError::RpcConnect {
                peer,
                reason: format!("the certificate of {} is revoked", cert.name),
            }));
        }
        let (mut send, mut recv) = match conn.open_bi().await {
            Ok(s) => s,
            Err(e) => {
                self.forget(peer, &conn).await;
                self.note_revoked(peer, conn.close_reason().as_ref());
                return Err(QuicFailure::Stream(e.to_string()));
            }
        };
        let exchanged = async {
            send.write_all(request).await.map_err(|e| e.to_string())?;
            send.finish().map_err(|e| e.to_string())?;
            recv.read_to_end(MAX_MESSAGE)
                .await
                .map_err(|e| e.to_string())
        }
        .await;
        if exchanged.is_err() {
            self.note_revoked(peer, conn.close_reason().as_ref());
        }
        exchanged.map_err(QuicFailure::Stream)
    }

    /// When `peer` closed a connection (`closed`: why) because it refuses this node's
    /// certificate as revoked, says so in the log (at most every [`REVOKED_LOG_EVERY`]) and
    /// counts it.
    fn note_revoked(&self, peer: SocketAddr, closed: Option<&quinn::ConnectionError>) {
        let Some(quinn::ConnectionError::ApplicationClosed(close)) = closed else {
            return;
        };
        if close.error_code != quinn::VarInt::from_u32(CLOSE_REVOKED) {
            return;
        }
        self.count_rejected("own_revoked");
        let mut last = self
            .revoked_logged
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if last.is_some_and(|at| at.elapsed() < REVOKED_LOG_EVERY) {
            return;
        }
        *last = Some(Instant::now());
        tracing::error!(
            %peer,
            reason = %String::from_utf8_lossy(&close.reason),
            "a peer refuses this node's certificate as revoked: issue a new one with `shoal cert issue --node-id {}` and restart",
            self.me
        );
    }

    async fn connection(
        &self,
        endpoint: &quinn::Endpoint,
        peer: SocketAddr,
    ) -> Result<(quinn::Connection, Arc<NodeCert>), MeshError> {
        if let Some(c) = self
            .connections
            .lock()
            .await
            .get(&peer)
            .filter(|(c, _)| c.close_reason().is_none())
        {
            return Ok(c.clone());
        }
        // Dial without holding the table: a dead peer's handshake must not stall calls to
        // every other peer.
        let connect_err = |reason: String| MeshError::RpcConnect { peer, reason };
        let connecting = endpoint
            .connect(peer, &self.server_name)
            .map_err(|e| connect_err(e.to_string()))?;
        let conn = match connecting.await {
            Ok(c) => c,
            Err(e) => {
                self.note_revoked(peer, Some(&e));
                self.count_rejected("outgoing");
                return Err(connect_err(e.to_string()));
            }
        };
        let cert = match quic_peer(&conn, &self.revocations) {
            Ok(c) => Arc::new(c),
            Err(refused) => {
                conn.close(refused.code.into(), refused.reason.as_bytes());
                self.count_rejected("outgoing");
                return Err(connect_err(refused.reason));
            }
        };
        let mut conns = self.connections.lock().await;
        match conns.get(&peer).filter(|(c, _)| c.close_reason().is_none()) {
            // Another call connected meanwhile: use one connection per peer.
            Some(existing) => Ok(existing.clone()),
            None => {
                conns.insert(peer, (conn.clone(), cert.clone()));
                Ok((conn, cert))
            }
        }
    }

    /// Takes the pooled connection to `peer` out of the pool, so the next call dials
    /// afresh. It is not closed: other calls may still be under way on it (closing would
    /// cut them off with "connection lost"); it closes once the last of them drops it.
    async fn forget_peer(&self, peer: SocketAddr) {
        self.connections.lock().await.remove(&peer);
    }

    async fn forget(&self, peer: SocketAddr, conn: &quinn::Connection) {
        let mut conns = self.connections.lock().await;
        if conns
            .get(&peer)
            .is_some_and(|(c, _)| c.stable_id() == conn.stable_id())
        {
            conns.remove(&peer);
        }
    }

    /// Closes every connection and stops accepting new ones.
    /// The handlers are dropped: they hold what registered them (which may hold this
    /// endpoint), and nothing calls them any more.
    pub async fn close(&self) {
        self.handlers
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        match &self.wire {
            Wire::Quic(endpoint) => {
                endpoint.close(0u32.into(), b"shutdown");
                endpoint.wait_idle().await;
            }
            Wire::Sim { net, addr, closed } => {
                closed.store(true, std::sync::atomic::Ordering::Release);
                net.detach(*addr, self);
            }
        }
    }
}

#[cfg(test)]
mod refusal_tests {
    use super::*;

    #[test]
    fn a_refusal_keeps_its_class_across_the_wire() {
        for class in FailureClass::ALL {
            let r = Refusal::new(class, "no");
            assert_eq!(Refusal::decode(&r.encode()), r);
        }
        // The release before classes sent bare text.
        assert_eq!(
            Refusal::decode(b"malformed store/shard"),
            Refusal::new(FailureClass::Refused, "malformed store/shard")
        );
    }
}
