//! The filesystem service: serves `shoal mount`'s requests. Namespace changes go through
//! the metadata group; reads come from the local replica (after a read barrier where
//! close-to-open needs one); file data goes to and from erasure-coded stripes, or inline
//! for small files (`write`); the table of the mounts' open handles is `handles`.
//!
//! Read [`FsService`] first.

mod answers;
pub mod handles;
mod lease_flush;
pub mod lease_holder;
mod lease_metrics;
mod leased;
pub mod leases;
mod recall;
mod service;
mod turns;
mod write;

pub use handles::OpenHandles;
pub use lease_flush::LeaseFlush;
pub use lease_metrics::LeaseMetrics;
pub use service::FsService;
