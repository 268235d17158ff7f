//! An in-memory shard store with the same contract, for unit tests of callers.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;

use crate::header::HEADER_LEN;
use crate::{ShardKey, ShardStore, StoreError, StoreUsage, slice};

pub struct MemStore {
    limit: AtomicU64,
    shards: Mutex<BTreeMap<ShardKey, Bytes>>,
}

impl MemStore {
    pub fn new(limit: u64) -> Self {
        MemStore {
            limit: AtomicU64::new(limit),
            shards: Mutex::new(BTreeMap::new()),
        }
    }

    /// Holds at most `limit` bytes from now on (a disk that fills: puts beyond it fail
    /// with [`StoreError::Full`]; what it holds stays).
    pub fn set_limit(&self, limit: u64) {
        self.limit.store(limit, Ordering::Relaxed);
    }

    /// One byte of a stored shard changes where it lies (bit rot, a misdirected write):
    /// the byte at `at` (modulo the shard's length) flips its lowest bit, and reads
    /// return the changed bytes without an error, as a disk whose rot its block
    /// checksums miss would. Says whether the shard was there.
    pub fn rot(&self, key: ShardKey, at: usize) -> bool {
        let mut map = self.lock();
        let Some(data) = map.get_mut(&key) else {
            return false;
        };
        if data.is_empty() {
            return false;
        }
        let mut bytes = data.to_vec();
        let at = at % bytes.len();
        bytes[at] ^= 1;
        *data = Bytes::from(bytes);
        true
    }

    /// A stored shard's bytes, for checks that look at a store from outside.
    pub fn peek(&self, key: ShardKey) -> Option<Bytes> {
        self.lock().get(&key).cloned()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<ShardKey, Bytes>> {
        self.shards.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn used(map: &BTreeMap<ShardKey, Bytes>) -> u64 {
        map.values().map(|d| (HEADER_LEN + d.len()) as u64).sum()
    }
}

impl ShardStore for MemStore {
    async fn put(&self, key: ShardKey, data: Bytes) -> Result<(), StoreError> {
        let mut map = self.lock();
        if let Some(existing) = map.get(&key) {
            return if *existing == data {
                Ok(())
            } else {
                Err(StoreError::Conflict(key))
            };
        }
        let used = Self::used(&map);
        let need = (HEADER_LEN + data.len()) as u64;
        let limit = self.limit.load(Ordering::Relaxed);
        if used + need > limit {
            return Err(StoreError::Full { need, used, limit });
        }
        map.insert(key, data);
        Ok(())
    }

    async fn get(&self, key: ShardKey, offset: u64, len: Option<u64>) -> Result<Bytes, StoreError> {
        let data = self
            .lock()
            .get(&key)
            .cloned()
            .ok_or(StoreError::NotFound(key))?;
        slice(key, data, offset, len)
    }

    async fn delete(&self, key: ShardKey) -> Result<bool, StoreError> {
        Ok(self.lock().remove(&key).is_some())
    }

    fn list(&self) -> Vec<(ShardKey, u64)> {
        self.lock()
            .iter()
            .map(|(k, d)| (*k, d.len() as u64))
            .collect()
    }

    fn list_after(&self, after: Option<ShardKey>, limit: usize) -> Vec<(ShardKey, u64)> {
        use std::ops::Bound;
        let start = after.map_or(Bound::Unbounded, Bound::Excluded);
        self.lock()
            .range((start, Bound::Unbounded))
            .take(limit)
            .map(|(k, d)| (*k, d.len() as u64))
            .collect()
    }

    fn usage(&self) -> StoreUsage {
        let map = self.lock();
        StoreUsage {
            shards: map.len() as u64,
            used_bytes: Self::used(&map),
            limit_bytes: self.limit.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_rotten_shard_reads_back_changed_without_an_error() {
        let store = MemStore::new(1 << 20);
        let key = ShardKey {
            stripe: 7,
            index: 1,
        };
        store
            .put(key, Bytes::from_static(b"abcd"))
            .await
            .expect("put");
        assert!(store.rot(key, 6), "the shard is there");
        let got = store.get(key, 0, None).await.expect("read");
        assert_eq!(&got[..], b"abbd", "byte 6 mod 4 flipped its lowest bit");
        assert_eq!(store.peek(key).as_deref(), Some(&b"abbd"[..]));
        let other = ShardKey {
            stripe: 8,
            index: 0,
        };
        assert!(!store.rot(other, 0), "nothing to rot");
    }
}
