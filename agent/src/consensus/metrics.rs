//! Prometheus view of the metadata group, refreshed from openraft's metrics once a second:
//! `shoal_meta_{leader,term,applied_index,voters,inodes}` and
//! `shoal_meta_{proposals,entries,lease_reads,log_appends,log_syncs,
//! log_unsynced_appends}_total`.

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
    /// The log's appends and syncs.
    pub log: LogCounters,
}

/// What the log store counts: whether every append a voter acknowledges was synced can be
/// watched from outside.
#[derive(Clone, Debug, Default)]
pub struct LogCounters {
    /// Appends of entries to the log.
    pub appends: Counter,
    /// Durable writes of the log: synced appends, votes, truncations and purges.
    pub syncs: Counter,
    /// Appends acknowledged before they were synced (a learner's; never a voter's).
    pub unsynced_appends: Counter,
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
        r.register(
            "log_appends",
            "Appends of entries to this node's metadata log",
            m.log.appends.clone(),
        );
        r.register(
            "log_syncs",
            "Durable writes of this node's metadata log (synced appends, votes, truncations, purges)",
            m.log.syncs.clone(),
        );
        r.register(
            "log_unsynced_appends",
            "Log appends acknowledged before they were synced (a learner's; a voter syncs every one)",
            m.log.unsynced_appends.clone(),
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
