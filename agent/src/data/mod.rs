//! The data coordinator: stripes written and read across the cluster's shard stores —
//! erasure coding (`erasure`), placement of new shards (`peers`: who can take them), the
//! shard RPCs between agents (`shard_rpc`), writes (`write`), reads and degraded reads
//! (`read`), rebuilding lost shards (`rebuild`), and its errors (`error`).
//!
//! Read [`Stripes`] first.

mod corrupt;
mod disowning;
pub mod erasure;
mod error;
mod peers;
mod read;
mod rebuild;
pub(crate) mod shard_rpc;
mod stripes;
mod write;

pub use corrupt::CorruptReports;
pub use disowning::DisowningGuard;
pub use error::{ShardFault, ShardFaults, StripeError};
pub use read::StripeParts;
pub use rebuild::{Rebuild, Rebuilt};
pub use shard_rpc::carries_payload;
pub use stripes::{AddressBook, ClusterView, StripeSettings, Stripes};

/// A store with less room than this takes no new shards (two of the largest shards); a
/// node whose facts give it less is full.
pub(crate) const MIN_ROOM: u64 = 2 * shoal_placement::DEFAULT_SHARD_SIZE + (64 << 10);
