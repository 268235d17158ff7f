//! The seam between shoal and its cold tier: a flat key → bytes store with ranged reads.
//! Every implementation (S3, a local directory, the fault-injecting wrapper) passes the
//! same contract suite (`tests/contract.rs` here, and against a real S3 server in the
//! multi-node tests).

use std::ops::Range;

use async_trait::async_trait;
use bytes::Bytes;

use crate::TierError;

/// An object store holding shoal's cold data. Keys are relative to the store's own prefix
/// (`objects/…`); a put is atomic (readers see all of it or nothing) and a delete of a key
/// that is not there succeeds.
#[async_trait]
pub trait ColdStore: Send + Sync + std::fmt::Debug {
    /// Stores `data` under `key`, replacing what was there.
    async fn put(&self, key: &str, data: Bytes) -> Result<(), TierError>;
    /// Bytes `range` of `key`; [`TierError::Damaged`] when fewer come back.
    async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes, TierError>;
    /// The size of `key`, or None when it is not there.
    async fn size(&self, key: &str) -> Result<Option<u64>, TierError>;
    /// Deletes `key`; succeeds when it is already gone.
    async fn delete(&self, key: &str) -> Result<(), TierError>;
    /// Every key under `prefix` with its size, in no particular order.
    async fn list(&self, prefix: &str) -> Result<Vec<(String, u64)>, TierError>;
    /// What this store is, for status and logs: kind and location, never credentials.
    fn describe(&self) -> String;
}
