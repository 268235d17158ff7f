//! Prometheus view of the metadata group, refreshed from openraft's metrics once a second.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::group::Group;

#[derive(Clone, Default)]
pub struct MetaMetrics {
    leader: Gauge,
    term: Gauge,
    applied: Gauge,
    voters: Gauge,
    inodes: Gauge,
    /// Proposals committed through this node's batcher, and the entries that carried them.
    pub proposals: Counter,
    pub entries: Counter,
    /// Read indexes this node answered as leader from its read lease (no round).
    pub lease_reads: Counter,
}

impl MetaMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = MetaMetrics::default();
        let r = registry.sub_registry_with_prefix("shoal_meta");
        r.register(
            "leader",
            "1 while this node leads the metadata group",
            m.leader.clone(),
        );
        r.register("term", "Raft term this node is in", m.term.clone());
        r.register(
            "applied_index",
            "Log index this node's replica has applied",
            m.applied.clone(),
        );
        r.register("voters", "Voters of the metadata group", m.voters.clone());
        r.register(
            "inodes",
            "Inodes in the namespace (local replica)",
            m.inodes.clone(),
        );
        r.register(
            "proposals",
            "Namespace commands this node handed to Raft (as leader, or refused when not)",
            m.proposals.clone(),
        );
        r.register(
            "entries",
            "Log entries this node proposed as leader (proposals are batched into them)",
            m.entries.clone(),
        );
        r.register(
            "lease_reads",
            "Read indexes answered as leader within the read lease, without a heartbeat round",
            m.lease_reads.clone(),
        );
        m
    }
}

impl Group {
    /// Sets the gauges from openraft's metrics and the local replica.
    pub fn refresh_metrics(&self) {
        let status = self.status();
        let m = &self.metrics;
        m.leader.set(i64::from(self.is_leader()));
        m.term.set(status.term as i64);
        m.applied.set(status.applied.unwrap_or(0) as i64);
        m.voters.set(status.voters.len() as i64);
        m.inodes.set(status.inodes as i64);
    }
}
