//! The shoal agent: one long-lived process per node.
//!
//! [`Node`] is the composition root: it owns every subsystem as a named field and is built
//! explicitly at start from an [`AgentConfig`]. Read those two first. Subsystems live in
//! their own crates (`shoal-mesh` for membership and transport); this crate wires them,
//! serves the local admin socket and the metrics endpoint.
//!
//! It must never be depended on by the CLI: clients speak `shoal-agent-api` only.
//!
//! Background work (repair, scrub, the collectors, the tier, the steward, the batcher…)
//! runs as [`worker::Worker`]s (how they run and stop); `workers` lists every one of them.

mod config;
pub mod consensus;
pub mod data;
mod durable;
mod error;
mod failure;
pub mod fs;
mod identity_store;
mod metrics_http;
mod node;
pub mod redundancy;
mod releases;
mod resources;
pub mod runtime_threads;
pub mod sim_thread;
mod system_rpc;
pub mod tier;
pub mod worker;
pub mod workers;

pub use config::{
    AdminConfig, AgentConfig, BackgroundConfig, LogConfig, LogFormat, MetricsConfig, NodeConfig,
    StorageConfig,
};
pub use error::AgentError;
pub use identity_store::NodeIdentity;
pub use node::Node;
pub use resources::Resources;
pub use system_rpc::Ping;

/// This agent's version, as gossiped to peers and shown by `shoal status`.
pub const AGENT_VERSION: &str = env!("CARGO_PKG_VERSION");
