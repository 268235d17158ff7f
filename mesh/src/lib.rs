//! shoal's cluster mesh: who is in the cluster, and how agents talk to each other.
//!
//! - [`Membership`] is the pure SWIM core (foca driven sans-IO): bytes, timer events and
//!   `now` in; packets to send, timers to set and [`MemberEvent`]s out. It tests without a
//!   runtime. [`membership_sim::MembershipSim`] runs many of them on a simulated network
//!   with a virtual clock (the tests, and the simulator's scale run).
//! - [`GossipDriver`] is the one tokio task that owns the gossip UDP socket and the timer
//!   heap; every packet is wrapped in an authenticated, versioned [`envelope`].
//! - [`Transport`] is the QUIC endpoint (mutual TLS against the cluster CA) that carries
//!   typed request/response [`Rpc`] messages; in the simulator it rides a [`SimNet`]
//!   instead (the same framing and handlers, a seeded network in memory).
//!
//! The mesh knows nothing about files, stripes or placement; it must never depend on the
//! agent's storage or metadata crates.

mod bulk;
mod config;
pub mod envelope;
mod error;
mod facts;
#[doc(hidden)]
pub mod fuzz;
mod gossip;
mod identity;
mod membership;
pub mod membership_sim;
mod metrics;
mod node_cert;
mod rpc;
pub mod sim_net;
mod tls;

pub use bulk::{BulkLimits, BulkMode};
pub use config::{LegacyGossip, MeshConfig, TlsConfig};
pub use error::MeshError;
pub use facts::{NodeFacts, NodeRole};
pub use gossip::{GossipDriver, GossipHandle};
pub use identity::{MemberId, NodeId};
pub use membership::{Effect, MemberEvent, MemberState, MemberView, Membership, MembershipConfig};
pub use metrics::{MeshMetrics, ReasonLabel};
pub use node_cert::{NodeCert, Revocation, Revocations, node_uri};
pub use rpc::{BulkFilter, FailureClass, MAX_MESSAGE as MAX_RPC_MESSAGE, Refusal, Rpc, Transport};
pub use sim_net::{SimNet, SimSocket};
pub use tls::{ClusterKey, TlsFiles};
