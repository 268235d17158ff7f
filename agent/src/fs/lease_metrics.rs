//! [`LeaseMetrics`]: how this node's directory leases are used (`shoal_lease_*`).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;

/// Counters of the leases; clones share them.
#[derive(Clone, Default)]
pub struct LeaseMetrics {
    /// Leases granted to this node.
    pub grants: Counter,
    /// Leases given back because another node asked (a recall).
    pub recalls: Counter,
    /// Batches committed, and the ops in them (their ratio is the mean batch size).
    pub batches: Counter,
    pub batch_ops: Counter,
    /// Ops answered under a lease that did not commit as answered.
    pub lost_ops: Counter,
}

impl LeaseMetrics {
    /// Registers these counters under `shoal_lease_`.
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("shoal_lease");
        r.register(
            "grants",
            "Directory leases granted to this node",
            self.grants.clone(),
        );
        r.register(
            "recalls",
            "Directory leases given back because another node asked",
            self.recalls.clone(),
        );
        r.register(
            "batches",
            "Batches of lease ops committed",
            self.batches.clone(),
        );
        r.register(
            "batch_ops",
            "Ops in the batches committed",
            self.batch_ops.clone(),
        );
        r.register(
            "lost_ops",
            "Ops answered under a lease that did not commit as answered",
            self.lost_ops.clone(),
        );
    }
}
