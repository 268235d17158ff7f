//! The store's own metrics: shards, bytes and fill limit, and shards found corrupt
//! (`shoal_store_{shards,used_bytes,limit_bytes}`, `shoal_store_corrupt_shards_total`).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::StoreUsage;

/// Gauges and counters of one store, registered under `shoal_store_*`.
#[derive(Clone, Debug, Default)]
pub struct StoreMetrics {
    shards: Gauge,
    used: Gauge,
    limit: Gauge,
    corrupt: Counter,
}

impl StoreMetrics {
    pub fn register(registry: &mut Registry) -> StoreMetrics {
        let m = StoreMetrics::default();
        let r = registry.sub_registry_with_prefix("shoal_store");
        r.register("shards", "Shards in this node's store", m.shards.clone());
        r.register(
            "used_bytes",
            "Bytes of shard files in this node's store",
            m.used.clone(),
        );
        r.register(
            "limit_bytes",
            "Fill limit of this node's store; writes past it fail with \"node full\"",
            m.limit.clone(),
        );
        r.register(
            "corrupt_shards",
            "Shards of this node's store found not to match their checksum",
            m.corrupt.clone(),
        );
        m
    }

    pub(crate) fn set_usage(&self, u: &StoreUsage) {
        self.shards.set(i64::try_from(u.shards).unwrap_or(i64::MAX));
        self.used
            .set(i64::try_from(u.used_bytes).unwrap_or(i64::MAX));
        self.limit
            .set(i64::try_from(u.limit_bytes).unwrap_or(i64::MAX));
    }

    pub(crate) fn count_corrupt(&self) {
        self.corrupt.inc();
    }
}
