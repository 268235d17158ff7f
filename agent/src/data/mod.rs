//! The data coordinator: stripes written and read across the cluster's shard stores —
//! erasure coding (`erasure`), placement of new shards (`peers`: who can take them), the
//! shard RPCs between agents (`shard_rpc`), writes (`write`), reads and degraded reads
//! (`read`), and its errors (`error`).
//!
//! Read [`Stripes`] first.

pub mod erasure;
mod error;
mod peers;
mod read;
pub(crate) mod shard_rpc;
mod stripes;
mod write;

pub use error::{ShardFault, ShardFaults, StripeError};
pub use stripes::{StripeSettings, Stripes};

/// A store with less room than this takes no new shards (two of the largest shards); a
/// node whose facts give it less is full.
pub(crate) const MIN_ROOM: u64 = 2 * shoal_placement::DEFAULT_SHARD_SIZE + (64 << 10);
