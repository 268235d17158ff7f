//! The metadata service: a Raft group (openraft) whose log and state machine live in redb
//! files under `<data_dir>/meta`, the filesystem requests it serves, and the background
//! work that keeps it tidy (membership and layout steward, garbage collection).

pub mod ballast;
pub mod config;
pub mod fs;
pub mod gc;
mod log_store;
pub mod metrics;
pub mod net;
pub mod rejoin;
pub mod service;
mod state_machine;
pub mod steward;
mod types;
pub mod voters;

pub use config::MetaConfig;
pub use fs::FsService;
pub use service::MetaService;
