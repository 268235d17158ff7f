//! shoal's simulator: whole clusters in one process, on one seeded thread with virtual
//! time, where only the OS edges (disk, network, clock) are replaced. See ARCHITECTURE.md,
//! "The simulator".
