//! A cold store that fails on purpose, for tests: a switchable outage, added latency, a
//! number of failing puts, and puts that keep only part of the data while reporting
//! success (what a verify after upload must catch). It counts what passes through.

use std::ops::Range;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;

use crate::{ColdStore, TierError};

/// Wraps `inner`; every fault starts off.
#[derive(Debug)]
pub struct Faulty<S> {
    inner: S,
    outage: AtomicBool,
    latency: Mutex<Duration>,
    failing_puts: AtomicU64,
    partial_puts: AtomicU64,
    /// Requests that reached `inner`, by kind.
    pub gets: AtomicU64,
    pub puts: AtomicU64,
    pub bytes_read: AtomicU64,
}

impl<S: ColdStore> Faulty<S> {
    pub fn new(inner: S) -> Faulty<S> {
        Faulty {
            inner,
            outage: AtomicBool::new(false),
            latency: Mutex::new(Duration::ZERO),
            failing_puts: AtomicU64::new(0),
            partial_puts: AtomicU64::new(0),
            gets: AtomicU64::new(0),
            puts: AtomicU64::new(0),
            bytes_read: AtomicU64::new(0),
        }
    }

    /// Every request fails with [`TierError::Unavailable`] while on.
    pub fn set_outage(&self, on: bool) {
        self.outage.store(on, Ordering::SeqCst);
    }

    /// Each request waits this long first.
    pub fn set_latency(&self, latency: Duration) {
        *self.latency.lock().unwrap_or_else(|p| p.into_inner()) = latency;
    }

    /// The next `n` puts fail (nothing stored).
    pub fn fail_puts(&self, n: u64) {
        self.failing_puts.store(n, Ordering::SeqCst);
    }

    /// The next `n` puts store only the first half of their data and report success.
    pub fn truncate_puts(&self, n: u64) {
        self.partial_puts.store(n, Ordering::SeqCst);
    }

    async fn enter(&self) -> Result<(), TierError> {
        let latency = *self.latency.lock().unwrap_or_else(|p| p.into_inner());
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        if self.outage.load(Ordering::SeqCst) {
            return Err(TierError::Unavailable("injected outage".into()));
        }
        Ok(())
    }
}

/// Takes one from a fault counter; true when it was above zero.
fn take(counter: &AtomicU64) -> bool {
    counter
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

#[async_trait]
impl<S: ColdStore> ColdStore for Faulty<S> {
    async fn put(&self, key: &str, data: Bytes) -> Result<(), TierError> {
        self.enter().await?;
        if take(&self.failing_puts) {
            return Err(TierError::Unavailable("injected put failure".into()));
        }
        self.puts.fetch_add(1, Ordering::SeqCst);
        if take(&self.partial_puts) {
            let half = data.slice(..data.len() / 2);
            return self.inner.put(key, half).await;
        }
        self.inner.put(key, data).await
    }

    async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes, TierError> {
        self.enter().await?;
        self.gets.fetch_add(1, Ordering::SeqCst);
        let got = self.inner.get_range(key, range).await?;
        self.bytes_read
            .fetch_add(got.len() as u64, Ordering::SeqCst);
        Ok(got)
    }

    async fn size(&self, key: &str) -> Result<Option<u64>, TierError> {
        self.enter().await?;
        self.inner.size(key).await
    }

    async fn delete(&self, key: &str) -> Result<(), TierError> {
        self.enter().await?;
        self.inner.delete(key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(String, u64)>, TierError> {
        self.enter().await?;
        self.inner.list(prefix).await
    }

    fn describe(&self) -> String {
        format!("faulty {}", self.inner.describe())
    }
}
