//! [`NodeStore`]: the shard store a node runs — the disk store in an agent, the in-memory
//! one in the simulator (`tests/sim`), where a node's store outlives its crashes as a
//! disk does. Callers hold this instead of a concrete store, so the coordinator and the
//! workers run unchanged on either.

use bytes::Bytes;

use crate::{
    CheckedRange, DiskStore, MemStore, RingHealth, ShardKey, ShardStore, StoreError, StoreUsage,
};

pub enum NodeStore {
    Disk(DiskStore),
    Mem(MemStore),
}

impl NodeStore {
    /// Bytes of new shards the store can take now.
    pub fn room(&self) -> u64 {
        match self {
            NodeStore::Disk(s) => s.room(),
            NodeStore::Mem(s) => {
                let u = s.usage();
                u.limit_bytes.saturating_sub(u.used_bytes)
            }
        }
    }

    /// How the store's I/O is doing (the in-memory store is always serving).
    pub fn ring_health(&self) -> RingHealth {
        match self {
            NodeStore::Disk(s) => s.ring_health(),
            NodeStore::Mem(_) => RingHealth::Running { restarts: 0 },
        }
    }
}

impl ShardStore for NodeStore {
    async fn put(&self, key: ShardKey, data: Bytes) -> Result<(), StoreError> {
        match self {
            NodeStore::Disk(s) => s.put(key, data).await,
            NodeStore::Mem(s) => s.put(key, data).await,
        }
    }

    async fn get(&self, key: ShardKey, offset: u64, len: Option<u64>) -> Result<Bytes, StoreError> {
        match self {
            NodeStore::Disk(s) => s.get(key, offset, len).await,
            NodeStore::Mem(s) => s.get(key, offset, len).await,
        }
    }

    async fn get_checked(
        &self,
        key: ShardKey,
        offset: u64,
        len: u64,
    ) -> Result<CheckedRange, StoreError> {
        match self {
            NodeStore::Disk(s) => s.get_checked(key, offset, len).await,
            NodeStore::Mem(s) => s.get_checked(key, offset, len).await,
        }
    }

    async fn delete(&self, key: ShardKey) -> Result<bool, StoreError> {
        match self {
            NodeStore::Disk(s) => s.delete(key).await,
            NodeStore::Mem(s) => s.delete(key).await,
        }
    }

    fn list(&self) -> Vec<(ShardKey, u64)> {
        match self {
            NodeStore::Disk(s) => s.list(),
            NodeStore::Mem(s) => s.list(),
        }
    }

    fn list_after(&self, after: Option<ShardKey>, limit: usize) -> Vec<(ShardKey, u64)> {
        match self {
            NodeStore::Disk(s) => s.list_after(after, limit),
            NodeStore::Mem(s) => s.list_after(after, limit),
        }
    }

    fn usage(&self) -> StoreUsage {
        match self {
            NodeStore::Disk(s) => s.usage(),
            NodeStore::Mem(s) => s.usage(),
        }
    }
}
