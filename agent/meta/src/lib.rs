//! The metadata state machine: the namespace and the cluster layout.
//!
//! Read [`Command`] (what the replicated log carries) and [`MetaStore`] (the state machine,
//! persisted in redb) first. This crate applies commands and answers queries; it knows
//! nothing of Raft, the network or the clock (every command carries its own time). It
//! must never depend on tokio, the mesh or the agent.

mod command;

pub use command::{Batch, Command, NewExtent, Outcome, Proposal};
