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

mod client;
mod peer;
mod server;
mod wire;

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tracing::{debug, warn};

use crate::MeshError;
use crate::bulk::{self, Bulk, BulkFailure, BulkLimits, BulkMode, Rejection};
use crate::identity::NodeId;
use crate::metrics::{EndpointLabel, MeshMetrics, ReasonLabel, RpcLabel};
use crate::node_cert::{NodeCert, Revocations};
use crate::sim_net::SimNet;
use crate::tls::TlsFiles;

pub(crate) use peer::peer_node;
use peer::{CLOSE_REVOKED, REVOKED_LOG_EVERY, quic_peer};
use server::Handler;
pub use wire::{FailureClass, MAX_MESSAGE, RPC_VERSION, Refusal, Rpc};
use wire::{
    RESPONSE_HEAD, RequestHead, STATUS_ERROR, STATUS_NO_HANDLER, STATUS_OK, encoded_len, with_head,
};
pub(crate) use wire::{split_request, split_response};

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
