//! shoal's simulator: whole clusters in one process, on one seeded thread with virtual
//! time, where only the OS edges are replaced: the disk ([`shoal_disk::SimDisk`], which
//! loses what was not synced), the network ([`shoal_mesh::SimNet`], the real RPC framing
//! with seeded delay, loss, duplicates and partitions), the clock (tokio's, paused) and
//! the blocking pool and random source (`shoal_agent::sim_thread`).
//!
//! Read first: [`scenario`] (one run: the workload, the fault schedule, the invariants),
//! then [`seeds`] (many runs, and the shortest failing run of a seed). ARCHITECTURE.md,
//! "The simulator", says how to run a seed and how to add a fault or an invariant.

pub mod audit;
pub mod cluster;
pub mod file_client;
pub mod held;
pub mod model;
pub mod runtime;
pub mod scale;
pub mod scenario;
pub mod seeds;
pub mod trace;
