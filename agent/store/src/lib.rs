//! The node-local shard store: each shard is one file of `header | data` under the data
//! dir, written and read through one io_uring ring thread, and indexed in redb.
//!
//! Read [`ShardStore`] (the contract), then [`DiskStore`] (the real one) and [`MemStore`]
//! (in memory, for unit tests and the simulator), and [`NodeStore`] (either, as a node
//! holds it); [`contract`] is the suite both pass; [`ShardHeader`] is the
//! versioned on-disk header. The store knows shards, not stripes' meaning: it must never
//! depend on the mesh, placement or metadata crates.

mod checked;
mod combine;
pub mod contract;
mod disk;
mod error;
#[doc(hidden)]
pub mod fuzz;
mod header;
mod mem;
mod metrics;
mod node_store;
mod open_shards;
mod ring;

pub use checked::CheckedRange;
pub use disk::{DiskStore, Recovery};
pub use error::StoreError;
pub use header::{BLOCK_SHIFT, HEADER_LEN, ShardHeader};
pub use mem::MemStore;
pub use metrics::StoreMetrics;
pub use node_store::NodeStore;
pub use ring::{Ring, RingHealth};

use std::future::Future;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// One shard: stripe id and the shard's index within the stripe (0..k data, k..k+m parity).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ShardKey {
    pub stripe: u128,
    pub index: u8,
}

impl std::fmt::Display for ShardKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:032x}.{}", self.stripe, self.index)
    }
}

/// Space accounting of a store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct StoreUsage {
    pub shards: u64,
    /// Bytes of shard files, headers included.
    pub used_bytes: u64,
    /// The fill limit; `put` refuses shards that would cross it.
    pub limit_bytes: u64,
}

/// A node's shard store. Shards are immutable: a key is written once.
pub trait ShardStore: Send + Sync + 'static {
    /// Stores `data` under `key`, durable when this returns. Writing the same bytes again is
    /// accepted; different bytes under an existing key are refused.
    fn put(
        &self,
        key: ShardKey,
        data: Bytes,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Reads `len` bytes at `offset` of the shard's data (to the end when `len` is None),
    /// after checking what it returns against the checksums (of the blocks holding the
    /// range, or of the whole shard).
    fn get(
        &self,
        key: ShardKey,
        offset: u64,
        len: Option<u64>,
    ) -> impl Future<Output = Result<Bytes, StoreError>> + Send;

    /// The blocks holding `[offset, offset+len)` of the shard and its block table, for a
    /// reader that checks them itself against the shard's checksum from the metadata
    /// ([`CheckedRange::verify`]); checked here as well, as `get` does.
    fn get_checked(
        &self,
        key: ShardKey,
        offset: u64,
        len: u64,
    ) -> impl Future<Output = Result<CheckedRange, StoreError>> + Send {
        async move {
            let data = self.get(key, 0, None).await?;
            let end = offset.checked_add(len).filter(|e| *e <= data.len() as u64);
            match end {
                Some(end) => Ok(CheckedRange::of(&data, offset, end)),
                None => Err(StoreError::OutOfRange {
                    key,
                    offset,
                    len: Some(len),
                    size: data.len() as u64,
                }),
            }
        }
    }

    /// Removes a shard; says whether it existed.
    fn delete(&self, key: ShardKey) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Every stored shard with its data length, in key order.
    fn list(&self) -> Vec<(ShardKey, u64)>;

    /// Up to `limit` stored shards after `after` (from the first when None), in key
    /// order: a walk over a large store, page by page.
    fn list_after(&self, after: Option<ShardKey>, limit: usize) -> Vec<(ShardKey, u64)>;

    fn usage(&self) -> StoreUsage;
}

/// The byte range `[offset, offset+len)` of `data`, or an error naming the shard.
pub(crate) fn slice(
    key: ShardKey,
    data: Bytes,
    offset: u64,
    len: Option<u64>,
) -> Result<Bytes, StoreError> {
    let size = data.len() as u64;
    let end = match len {
        Some(l) => offset.checked_add(l),
        None => Some(size),
    };
    match end {
        Some(end) if offset <= end && end <= size => Ok(data.slice(offset as usize..end as usize)),
        _ => Err(StoreError::OutOfRange {
            key,
            offset,
            len,
            size,
        }),
    }
}
