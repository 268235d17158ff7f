//! Reads of cold data. A read fetches its stripe's whole range from the object (one ranged
//! GET: a stripe is a few MiB at most, its checksum covers exactly that range, and a
//! sequential reader's next reads are then answered from memory — the read-ahead), checks
//! it, and keeps it in a small cache ([`CACHE_BYTES`], 64 MiB per node; it does not count
//! against the reservation's buffer budget). One fetch per stripe at a time. A stripe
//! fetched twice within `cold_after` (the cache lost it in between: the data is being read
//! repeatedly; at least ten minutes) is queued (at most 64, each once) for the `tier-warm`
//! worker, which writes it back to NVMe on the tiering budget, one at a time. A store that
//! does not answer within `recall_timeout` fails the read with EIO; hot data never waits
//! on it.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use bytes::Bytes;
use shoal_agent_api::{FsError, Ino};
use shoal_namespace::format::ColdLocation;
use shoal_placement::StripeId;
use shoal_tiering::TierError;
use shoal_tiering::pack::object_key;
use tracing::{debug, warn};

use super::{Tier, lock};

/// Bytes of recalled stripes kept in memory.
pub(super) const CACHE_BYTES: u64 = 64 << 20;
/// A stripe fetched twice within `cold_after`, or within this when it is shorter, counts
/// as read repeatedly.
const REWARM_WINDOW_MIN: Duration = Duration::from_secs(600);
/// Stripes whose last fetch is remembered, at most (a long cold scan forgets them all).
const FETCHES_KEPT: usize = 100_000;

/// Recently recalled stripes, least recently used first, and the fetches under way.
pub(super) struct RecallCache {
    limit: u64,
    inner: Mutex<CacheInner>,
}

#[derive(Default)]
struct CacheInner {
    bytes: u64,
    entries: VecDeque<(StripeId, Bytes)>,
    /// One fetch per stripe at a time: the others wait for it.
    fetching: HashMap<StripeId, Arc<tokio::sync::Mutex<()>>>,
    /// When each stripe was last fetched from the store (for re-warming).
    fetched: HashMap<StripeId, Instant>,
}

impl RecallCache {
    pub(super) fn new(limit: u64) -> RecallCache {
        RecallCache {
            limit,
            inner: Mutex::new(CacheInner::default()),
        }
    }

    fn get(&self, id: StripeId) -> Option<Bytes> {
        let mut c = lock(&self.inner);
        let at = c.entries.iter().position(|(s, _)| *s == id)?;
        let entry = c.entries.remove(at)?;
        let bytes = entry.1.clone();
        c.entries.push_back(entry);
        Some(bytes)
    }

    fn insert(&self, id: StripeId, bytes: Bytes) {
        let mut c = lock(&self.inner);
        if c.entries.iter().any(|(s, _)| *s == id) {
            return;
        }
        c.bytes += bytes.len() as u64;
        c.entries.push_back((id, bytes));
        while c.bytes > self.limit {
            match c.entries.pop_front() {
                Some((_, b)) => c.bytes -= b.len() as u64,
                None => break,
            }
        }
    }

    fn fetch_lock(&self, id: StripeId) -> Arc<tokio::sync::Mutex<()>> {
        lock(&self.inner).fetching.entry(id).or_default().clone()
    }

    fn fetch_done(&self, id: StripeId) {
        let mut c = lock(&self.inner);
        if c.fetching
            .get(&id)
            .is_some_and(|m| Arc::strong_count(m) <= 1)
        {
            c.fetching.remove(&id);
        }
    }

    /// Records a fetch from the store; true when the stripe was fetched before within
    /// `window` (it is read repeatedly).
    fn fetched_again(&self, id: StripeId, window: Duration) -> bool {
        let mut c = lock(&self.inner);
        let now = Instant::now();
        c.fetched.retain(|_, at| now.duration_since(*at) < window);
        if c.fetched.len() >= FETCHES_KEPT {
            c.fetched.clear();
        }
        c.fetched.insert(id, now).is_some()
    }

    /// Forgets a stripe (it was warmed: the next read goes to NVMe).
    pub(super) fn forget(&self, id: StripeId) {
        let mut c = lock(&self.inner);
        if let Some(at) = c.entries.iter().position(|(s, _)| *s == id)
            && let Some((_, b)) = c.entries.remove(at)
        {
            c.bytes -= b.len() as u64;
        }
        c.fetched.remove(&id);
    }
}

impl Tier {
    /// `[offset, offset + len)` of cold stripe `stripe` of file `ino`.
    pub async fn read_cold(
        self: &Arc<Self>,
        ino: Ino,
        stripe: StripeId,
        loc: ColdLocation,
        offset: u64,
        len: u64,
    ) -> Result<Vec<u8>, FsError> {
        let bytes = self.recall(Some(ino), stripe, loc).await.map_err(|e| {
            warn!(stripe = %stripe, error = %e, "read of cold data failed");
            FsError::Io(format!("cold tier: {e}"))
        })?;
        let end = offset.saturating_add(len);
        if end > bytes.len() as u64 {
            return Err(FsError::Io(format!(
                "cold stripe {stripe} holds {} bytes; bytes {offset}..{end} were asked for",
                bytes.len()
            )));
        }
        Ok(bytes[offset as usize..end as usize].to_vec())
    }

    /// The whole stripe's bytes: from the cache, or fetched and checked. A stripe of file
    /// `ino` fetched again within `cold_after` is warmed in the background.
    pub(super) async fn recall(
        self: &Arc<Self>,
        ino: Option<Ino>,
        stripe: StripeId,
        loc: ColdLocation,
    ) -> Result<Bytes, TierError> {
        if let Some(b) = self.cache.get(stripe) {
            self.metrics.cache_hits.inc();
            return Ok(b);
        }
        let fetch = self.cache.fetch_lock(stripe);
        let result = async {
            let _one = fetch.lock().await;
            if let Some(b) = self.cache.get(stripe) {
                self.metrics.cache_hits.inc();
                return Ok(b);
            }
            let bytes = self.fetch(stripe, loc).await?;
            self.cache.insert(stripe, bytes.clone());
            let window = Duration::from_millis(self.policy.cold_after_ms.unwrap_or(0))
                .max(REWARM_WINDOW_MIN);
            if let Some(ino) = ino
                && self.cache.fetched_again(stripe, window)
            {
                debug!(stripe = %stripe, "cold stripe read repeatedly: warming it");
                self.warm_soon(ino, stripe, loc);
            }
            Ok(bytes)
        }
        .await;
        drop(fetch);
        self.cache.fetch_done(stripe);
        result
    }

    /// One ranged GET of the stripe's bytes, checked against the recorded checksum.
    async fn fetch(
        self: &Arc<Self>,
        stripe: StripeId,
        loc: ColdLocation,
    ) -> Result<Bytes, TierError> {
        let key = object_key(loc.object);
        let range = loc.offset..loc.offset + loc.len;
        let limit = self.config.recall_timeout;
        let bytes = self.timed(limit, self.store.get_range(&key, range)).await?;
        self.metrics.get_requests.inc();
        self.metrics.get_bytes.inc_by(bytes.len() as u64);
        {
            let mut s = lock(&self.state);
            s.recall_requests += 1;
            s.recall_bytes += bytes.len() as u64;
        }
        if bytes.len() as u64 != loc.len || crc32c::crc32c(&bytes) != loc.crc32c {
            return Err(TierError::Damaged {
                key,
                what: format!("stripe {stripe} checksum mismatch"),
            });
        }
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(n: usize, fill: u8) -> Bytes {
        Bytes::from(vec![fill; n])
    }

    #[test]
    fn the_cache_keeps_the_most_recently_used_stripes_within_its_bytes() {
        let cache = RecallCache::new(300);
        cache.insert(StripeId(1), bytes(100, 1));
        cache.insert(StripeId(2), bytes(100, 2));
        cache.insert(StripeId(3), bytes(100, 3));
        // A hit makes stripe 1 the most recently used: 2 is the one to go.
        assert_eq!(cache.get(StripeId(1)), Some(bytes(100, 1)));
        cache.insert(StripeId(4), bytes(100, 4));
        assert_eq!(cache.get(StripeId(2)), None);
        for (id, fill) in [(1, 1), (3, 3), (4, 4)] {
            assert_eq!(
                cache.get(StripeId(id)),
                Some(bytes(100, fill)),
                "stripe {id}"
            );
        }
        // A stripe already there keeps its bytes (a second fetch of it is the same).
        cache.insert(StripeId(4), bytes(100, 9));
        assert_eq!(cache.get(StripeId(4)), Some(bytes(100, 4)));
        // One stripe larger than the whole cache is not kept at all.
        cache.insert(StripeId(5), bytes(301, 5));
        assert_eq!(cache.get(StripeId(5)), None);
        assert!(lock(&cache.inner).bytes <= 300);
    }

    #[test]
    fn a_forgotten_stripe_is_read_from_its_new_home_next() {
        let cache = RecallCache::new(1000);
        cache.insert(StripeId(1), bytes(100, 1));
        cache.forget(StripeId(1));
        assert_eq!(cache.get(StripeId(1)), None);
        assert_eq!(lock(&cache.inner).bytes, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stripe_fetched_twice_within_the_window_counts_as_read_repeatedly() {
        let cache = RecallCache::new(1000);
        let window = Duration::from_secs(600);
        assert!(!cache.fetched_again(StripeId(1), window), "first fetch");
        tokio::time::advance(Duration::from_secs(599)).await;
        assert!(
            cache.fetched_again(StripeId(1), window),
            "again within the window"
        );
        tokio::time::advance(Duration::from_secs(601)).await;
        assert!(
            !cache.fetched_again(StripeId(1), window),
            "the last fetch is too old"
        );
        // Warming it forgets its fetches too.
        cache.forget(StripeId(1));
        assert!(!cache.fetched_again(StripeId(1), window));
    }

    #[tokio::test]
    async fn one_fetch_lock_per_stripe_while_any_waits_on_it() {
        let cache = RecallCache::new(1000);
        let a = cache.fetch_lock(StripeId(1));
        let b = cache.fetch_lock(StripeId(1));
        assert!(
            Arc::ptr_eq(&a, &b),
            "the second reader waits on the first's fetch"
        );
        drop(a);
        cache.fetch_done(StripeId(1));
        assert!(
            lock(&cache.inner).fetching.contains_key(&StripeId(1)),
            "b still holds it"
        );
        drop(b);
        cache.fetch_done(StripeId(1));
        assert!(lock(&cache.inner).fetching.is_empty());
    }
}
