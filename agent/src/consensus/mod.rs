//! The consensus glue: this node's member of the metadata Raft group (openraft), with its
//! log (`log_store`: segment files in `<data_dir>/meta/log/`, written by `wal`) and state
//! machine (`state_machine`, over `shoal-namespace`: the redb file
//! `<data_dir>/meta/state.redb`), its network (`net`: typed mesh RPCs), and what a member
//! needs beyond Raft itself: proposal batching, read barriers, the space the log can
//! always write (`ballast`), and the check for a stale data dir (`rejoin`).
//!
//! Read [`Group`] first. Background work on the group (the layout steward, garbage
//! collection) lives in `crate::workers`; the filesystem it serves in `crate::fs`.

mod append_sync;
pub mod ballast;
mod batcher;
pub mod changes;
pub mod config;
mod core_watch;
mod error;
#[doc(hidden)]
pub mod fuzz;
mod group;
mod lease;
mod log_import;
mod log_store;
pub mod metrics;
pub mod net;
mod read_rounds;
pub mod rejoin;
mod send_gate;
mod state_machine;
mod types;
pub mod voters;
mod wal;

pub use batcher::Batcher;
pub use changes::ChangeFeed;
pub use config::MetaConfig;
pub use core_watch::CoreWatch;
pub use error::{BoxError, ConsensusError};
pub use group::{Group, GroupWorkers};
pub use rejoin::Rejoiner;
