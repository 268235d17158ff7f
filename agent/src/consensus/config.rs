//! `[meta]`: the metadata service (Raft group) and the filesystem it serves.

use serde::{Deserialize, Serialize};

/// `[meta]` in the agent config.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetaConfig {
    /// A new cluster forms once this many agents see each other: the one with the lowest
    /// node id then creates the metadata group. Set it to the number of nodes in the first
    /// rollout (Ansible and `shoal dev-cluster` do).
    #[serde(default = "default_bootstrap_expect")]
    pub bootstrap_expect: usize,
    /// Files up to this many bytes live inline in the metadata (no stripes).
    #[serde(default = "default_inline_max")]
    pub inline_max: u64,
    /// Raft heartbeat interval in milliseconds.
    #[serde(default = "default_heartbeat_ms")]
    pub heartbeat_ms: u64,
    /// Raft election timeout range in milliseconds: `[min, max]`. Failover after a leader
    /// dies takes about `max` plus a random part of the range.
    #[serde(default = "default_election_ms")]
    pub election_ms: [u64; 2],
    /// Log entries between two snapshots of the state machine; the log is then compacted
    /// up to the snapshot, keeping `min(1000, snapshot_every)` entries behind it for
    /// followers that lag a little. A member further behind receives the snapshot.
    #[serde(default = "default_snapshot_every")]
    pub snapshot_every: u64,
    /// Seconds between garbage-collection passes (freed stripes, orphan inodes).
    #[serde(default = "default_gc_interval_s")]
    pub gc_interval_s: u64,
    /// Seconds an unlinked inode is kept before it may be purged (when no mount holds it
    /// open).
    #[serde(default = "default_orphan_grace_s")]
    pub orphan_grace_s: u64,
    /// Seconds a shard whose stripe the metadata does not know must stay unknown before
    /// this node deletes it (a writer that crashed between writing shards and committing
    /// them leaves such shards). The node first commits `AbandonStripes`, so a late commit
    /// is refused rather than pointing at deleted shards; writes give up (and are retried)
    /// after a quarter of it, so they are done long before.
    #[serde(default = "default_orphan_shard_grace_s")]
    pub orphan_shard_grace_s: u64,
    /// Milliseconds a change answered under a directory lease may wait before it is
    /// committed (the mount's creates, unlinks and renames in a directory only its node
    /// works in are answered at once and committed in batches this often). A node that
    /// loses power loses at most this much of what it answered and nobody synced, always
    /// the newest part. 0: every change is committed before it is answered (no leases).
    #[serde(default = "default_metadata_writeback_ms")]
    pub metadata_writeback_ms: u64,
}

fn default_bootstrap_expect() -> usize {
    1
}
fn default_inline_max() -> u64 {
    64 << 10
}
fn default_heartbeat_ms() -> u64 {
    200
}
fn default_election_ms() -> [u64; 2] {
    [1000, 2000]
}
fn default_snapshot_every() -> u64 {
    5_000
}
fn default_gc_interval_s() -> u64 {
    5
}
fn default_orphan_grace_s() -> u64 {
    10
}
fn default_orphan_shard_grace_s() -> u64 {
    600
}
fn default_metadata_writeback_ms() -> u64 {
    100
}

impl Default for MetaConfig {
    fn default() -> Self {
        MetaConfig {
            bootstrap_expect: default_bootstrap_expect(),
            inline_max: default_inline_max(),
            heartbeat_ms: default_heartbeat_ms(),
            election_ms: default_election_ms(),
            snapshot_every: default_snapshot_every(),
            gc_interval_s: default_gc_interval_s(),
            orphan_grace_s: default_orphan_grace_s(),
            orphan_shard_grace_s: default_orphan_shard_grace_s(),
            metadata_writeback_ms: default_metadata_writeback_ms(),
        }
    }
}

impl MetaConfig {
    /// Checks the values; the error names the key.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if self.bootstrap_expect == 0 {
            return Err(("meta.bootstrap_expect", "must be at least 1".into()));
        }
        if self.inline_max > 1 << 20 {
            return Err(("meta.inline_max", "must be at most 1 MiB".into()));
        }
        if self.heartbeat_ms == 0 {
            return Err(("meta.heartbeat_ms", "must be positive".into()));
        }
        let [min, max] = self.election_ms;
        if min <= self.heartbeat_ms || max <= min {
            return Err((
                "meta.election_ms",
                format!(
                    "must be [min, max] with heartbeat_ms ({}) < min < max",
                    self.heartbeat_ms
                ),
            ));
        }
        if self.orphan_shard_grace_s < self.gc_interval_s {
            return Err((
                "meta.orphan_shard_grace_s",
                format!("must be at least gc_interval_s ({})", self.gc_interval_s),
            ));
        }
        if self.snapshot_every == 0 {
            return Err(("meta.snapshot_every", "must be positive".into()));
        }
        if self.gc_interval_s == 0 {
            return Err(("meta.gc_interval_s", "must be positive".into()));
        }
        Ok(())
    }
}
