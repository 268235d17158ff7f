//! An in-memory shard store with the same contract, for unit tests of callers.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;

use crate::header::HEADER_LEN;
use crate::{ShardKey, ShardStore, StoreError, StoreUsage, slice};

pub struct MemStore {
    limit: AtomicU64,
    shards: Mutex<BTreeMap<ShardKey, Stored>>,
    /// Shards whose reads fail (see [`MemStore::make_unreadable`]).
    unreadable: Mutex<BTreeSet<ShardKey>>,
}

/// A shard as stored: its bytes, and the checksum of the bytes it was put with (what the
/// disk store's index keeps: a put of the same shard again is answered from it).
struct Stored {
    data: Bytes,
    crc: u32,
}

impl MemStore {
    pub fn new(limit: u64) -> Self {
        MemStore {
            limit: AtomicU64::new(limit),
            shards: Mutex::new(BTreeMap::new()),
            unreadable: Mutex::new(BTreeSet::new()),
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
        let Some(stored) = map.get_mut(&key) else {
            return false;
        };
        if stored.data.is_empty() {
            return false;
        }
        let mut bytes = stored.data.to_vec();
        let at = at % bytes.len();
        bytes[at] ^= 1;
        stored.data = Bytes::from(bytes);
        true
    }

    /// Reads of a stored shard fail with EIO from now on (a latent sector error) until
    /// it is deleted. Says whether the shard was there.
    pub fn make_unreadable(&self, key: ShardKey) -> bool {
        let there = self.lock().contains_key(&key);
        if there {
            lock(&self.unreadable).insert(key);
        }
        there
    }

    /// A shard's bytes, read at once as `get` reads them (for checks that look at a store
    /// from outside a runtime).
    pub fn read_now(&self, key: ShardKey) -> Result<Bytes, StoreError> {
        if lock(&self.unreadable).contains(&key) {
            return Err(StoreError::Io {
                op: "read",
                path: format!("memory/{key}").into(),
                source: std::io::Error::from_raw_os_error(5),
            });
        }
        self.lock()
            .get(&key)
            .map(|s| s.data.clone())
            .ok_or(StoreError::NotFound(key))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<ShardKey, Stored>> {
        lock(&self.shards)
    }

    fn used(map: &BTreeMap<ShardKey, Stored>) -> u64 {
        map.values()
            .map(|s| (HEADER_LEN + s.data.len()) as u64)
            .sum()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl ShardStore for MemStore {
    async fn put(&self, key: ShardKey, data: Bytes) -> Result<(), StoreError> {
        let mut map = self.lock();
        let crc = crc32c::crc32c(&data);
        if let Some(existing) = map.get(&key) {
            // As the disk store answers: from what was put, not from what lies there now
            // (a copy that rotted since stays).
            return if existing.data.len() == data.len() && existing.crc == crc {
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
        map.insert(key, Stored { data, crc });
        Ok(())
    }

    async fn get(&self, key: ShardKey, offset: u64, len: Option<u64>) -> Result<Bytes, StoreError> {
        slice(key, self.read_now(key)?, offset, len)
    }

    async fn delete(&self, key: ShardKey) -> Result<bool, StoreError> {
        lock(&self.unreadable).remove(&key);
        Ok(self.lock().remove(&key).is_some())
    }

    fn list(&self) -> Vec<(ShardKey, u64)> {
        self.lock()
            .iter()
            .map(|(k, s)| (*k, s.data.len() as u64))
            .collect()
    }

    fn list_after(&self, after: Option<ShardKey>, limit: usize) -> Vec<(ShardKey, u64)> {
        use std::ops::Bound;
        let start = after.map_or(Bound::Unbounded, Bound::Excluded);
        self.lock()
            .range((start, Bound::Unbounded))
            .take(limit)
            .map(|(k, s)| (*k, s.data.len() as u64))
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
        assert_eq!(store.read_now(key).ok().as_deref(), Some(&b"abbd"[..]));
        let other = ShardKey {
            stripe: 8,
            index: 0,
        };
        assert!(
            store.put(key, Bytes::from_static(b"abcd")).await.is_ok(),
            "a put again is answered from what was put, as on disk: the rotten copy stays"
        );
        assert_eq!(store.read_now(key).ok().as_deref(), Some(&b"abbd"[..]));
        assert!(!store.rot(other, 0), "nothing to rot");
    }

    #[tokio::test]
    async fn an_unreadable_shard_fails_its_reads_until_it_is_deleted() {
        let store = MemStore::new(1 << 20);
        let key = ShardKey {
            stripe: 7,
            index: 1,
        };
        let data = Bytes::from_static(b"abcd");
        store.put(key, data.clone()).await.expect("put");
        assert!(store.make_unreadable(key));
        assert!(matches!(
            store.get(key, 1, Some(2)).await,
            Err(StoreError::Io { .. })
        ));
        assert!(matches!(
            store.get_checked(key, 0, 4).await,
            Err(StoreError::Io { .. })
        ));
        assert_eq!(store.list().len(), 1, "still listed");
        assert!(store.delete(key).await.expect("delete"));
        store.put(key, data.clone()).await.expect("put again");
        assert_eq!(store.get(key, 0, None).await.expect("read"), data);
    }
}
