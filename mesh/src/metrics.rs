//! The mesh's metrics: `shoal_mesh_members{state}`,
//! `shoal_mesh_gossip_packets_{received,rejected}_total` (rejected by `reason`),
//! `shoal_mesh_rpc_connections_rejected_total{reason}`,
//! `shoal_mesh_rpc_requests_total{endpoint,side,outcome}`,
//! `shoal_mesh_rpc_requests_refused_total{reason}`,
//! `shoal_mesh_rpc_latency_seconds{endpoint}`,
//! `shoal_mesh_bulk_connections_refused_total{reason}`, `shoal_mesh_bulk_fallbacks_total`.
//! Counter names get `_total` from prometheus-client.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    pub state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RpcLabel {
    pub endpoint: &'static str,
    pub side: &'static str,
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndpointLabel {
    pub endpoint: &'static str,
}

type LatencyFamily = Family<EndpointLabel, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    // 50 µs .. ~1.6 s
    Histogram::new(exponential_buckets(0.000_05, 2.0, 16))
}

/// Counters and gauges of membership and transport, registered under `shoal_mesh_`.
#[derive(Clone, Debug)]
pub struct MeshMetrics {
    pub gossip_packets_received: Counter,
    pub gossip_packets_rejected: Family<ReasonLabel, Counter>,
    pub members: Family<StateLabel, Gauge>,
    pub rpc_connections_rejected: Family<ReasonLabel, Counter>,
    pub rpc_requests: Family<RpcLabel, Counter>,
    /// Requests refused before their handler: a peer speaking for another node, a revoked
    /// certificate, an endpoint the lane does not carry.
    pub rpc_requests_refused: Family<ReasonLabel, Counter>,
    pub rpc_latency_seconds: LatencyFamily,
    /// Bulk lane connections dropped before they were served, by the limit that dropped
    /// them (a failed handshake counts in `rpc_connections_rejected`).
    pub bulk_connections_refused: Family<ReasonLabel, Counter>,
    /// Requests that went over QUIC because the bulk lane to their peer could not connect.
    pub bulk_fallbacks: Counter,
}

impl MeshMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = MeshMetrics {
            gossip_packets_received: Counter::default(),
            gossip_packets_rejected: Family::default(),
            members: Family::default(),
            rpc_connections_rejected: Family::default(),
            rpc_requests: Family::default(),
            rpc_requests_refused: Family::default(),
            rpc_latency_seconds: Family::new_with_constructor(latency_histogram),
            bulk_connections_refused: Family::default(),
            bulk_fallbacks: Counter::default(),
        };
        let r = registry.sub_registry_with_prefix("shoal_mesh");
        r.register(
            "gossip_packets_received",
            "Gossip packets that passed authentication",
            m.gossip_packets_received.clone(),
        );
        r.register(
            "gossip_packets_rejected",
            "Gossip packets dropped before decoding (wrong cluster key, bad magic or version, truncated, a legacy envelope, or a replay)",
            m.gossip_packets_rejected.clone(),
        );
        r.register(
            "members",
            "Cluster members by state, as seen from this node (itself included)",
            m.members.clone(),
        );
        r.register(
            "rpc_connections_rejected",
            "QUIC and bulk lane connections that failed the mutual TLS handshake, by reason",
            m.rpc_connections_rejected.clone(),
        );
        r.register(
            "rpc_requests",
            "RPC requests by endpoint, side and outcome",
            m.rpc_requests.clone(),
        );
        r.register(
            "rpc_requests_refused",
            "RPC and bulk requests refused before their handler, by reason (impersonation: the request claims another node than its certificate names; revoked; lane: not served on the bulk lane)",
            m.rpc_requests_refused.clone(),
        );
        r.register(
            "rpc_latency_seconds",
            "Client-side RPC round-trip latency",
            m.rpc_latency_seconds.clone(),
        );
        r.register(
            "bulk_connections_refused",
            "Bulk lane connections dropped before they were served, by reason (source_limit: its source address had as many handshakes under way as it may; unauthenticated_limit: every source together had; handshake_timeout: no handshake within the deadline; authenticated_limit: the lane served as many connections as it may)",
            m.bulk_connections_refused.clone(),
        );
        r.register(
            "bulk_fallbacks",
            "Shard requests sent over QUIC because the bulk lane to their peer could not connect (or rested after such a failure)",
            m.bulk_fallbacks.clone(),
        );
        m
    }

    /// Metrics that go nowhere, for tests and tools that do not export them.
    pub fn unregistered() -> Self {
        Self::register(&mut Registry::default())
    }
}
