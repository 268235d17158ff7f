//! Prometheus view of the cold tier on this node: `shoal_tier_{get_requests,get_bytes,
//! put_requests,put_bytes,cache_hits,errors,warmed_stripes}_total` and
//! `shoal_tier_store_up`.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Default)]
pub struct TierMetrics {
    /// Ranged reads of cold data from the store, and their bytes.
    pub get_requests: Counter,
    pub get_bytes: Counter,
    /// Objects uploaded (verified), and their bytes.
    pub put_requests: Counter,
    pub put_bytes: Counter,
    /// Reads of cold data answered from the recall cache.
    pub cache_hits: Counter,
    /// Store requests that failed or timed out.
    pub errors: Counter,
    /// 1 while the store answers, 0 during an outage.
    pub store_up: Gauge,
    /// Cold stripes written back to NVMe.
    pub warmed_stripes: Counter,
}

impl TierMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = TierMetrics::default();
        m.store_up.set(1);
        let r = registry.sub_registry_with_prefix("shoal_tier");
        r.register(
            "get_requests",
            "Ranged reads of cold data from the object store",
            m.get_requests.clone(),
        );
        r.register(
            "get_bytes",
            "Bytes read from the object store",
            m.get_bytes.clone(),
        );
        r.register(
            "put_requests",
            "Objects uploaded to the object store (verified)",
            m.put_requests.clone(),
        );
        r.register(
            "put_bytes",
            "Bytes uploaded to the object store",
            m.put_bytes.clone(),
        );
        r.register(
            "cache_hits",
            "Reads of cold data answered from the recall cache",
            m.cache_hits.clone(),
        );
        r.register(
            "errors",
            "Object store requests that failed or timed out",
            m.errors.clone(),
        );
        r.register(
            "store_up",
            "1 while the object store answers, 0 during an outage",
            m.store_up.clone(),
        );
        r.register(
            "warmed_stripes",
            "Cold stripes written back to NVMe",
            m.warmed_stripes.clone(),
        );
        m
    }
}
