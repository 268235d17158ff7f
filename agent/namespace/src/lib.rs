//! The metadata state machine: the namespace and the cluster layout.
//!
//! Read [`Command`] (what the replicated log carries) and [`NamespaceStore`] (the state machine,
//! persisted in redb) first. This crate applies commands and answers queries; it knows
//! nothing of Raft, the network or the clock (every command carries its own time). It
//! must never depend on tokio, the mesh or the agent.
//!
//! The state holds the namespace (inodes, entries, attributes, inline data, extent maps,
//! stripe records with reference counts, garbage, orphans, abandoned stripes), the cluster
//! layout with the operators' node records, node generations, the cluster clock, the cold
//! tier's tables, revoked certificates, directory leases (`lease.rs`), and a request-id table that answers a repeated
//! request with its first outcome (`tx.rs`). Tested by unit tests and a seeded model test
//! with restarts and snapshot installs (`tests/model.rs`).
//!
//! On disk every table is keyed by inode first (see `record.rs`), so the namespace can
//! later be split into Raft groups by `hash(ino)` with a key filter.

mod command;
mod data;
mod error;
pub mod format;
#[doc(hidden)]
pub mod fuzz;
mod lease;
mod namespace;
pub mod nodes;
mod query;
mod record;
mod revocations;
mod shards;
mod snapshot;
mod speculate;
mod store;
mod tier;
mod touched;
mod tx;

pub use command::{
    Batch, Command, LeaderStamp, LeasedChange, LeasedOp, MAX_INO_RANGE, NewExtent, Outcome,
    Proposal, ShardMove,
};
pub use error::NamespaceError;
pub use lease::DirLease;
pub use query::{FileData, NamespaceStats};
pub use revocations::RevokedName;
pub use snapshot::snapshot_marker;
pub use speculate::{Overlay, OverlayInode, Speculation};
pub use store::NamespaceStore;
pub use tier::{ColdInventory, TierFile, TierSummary};
pub use touched::Touched;

#[cfg(test)]
mod golden;
#[cfg(test)]
mod testkit;
