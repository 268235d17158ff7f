//! The agent's background workers, each in the one shape of `crate::worker`.
//!
//! The workers of an agent (names as `shoal status` shows them): `batcher` (the leader's
//! proposal batcher), `meta-core-watch` (a metadata member that failed) and `rejoin` (only
//! after a stale data dir's metadata was set aside) in `consensus`; `steward` (the group's
//! membership and the cluster layout); `facts` (this node's gossiped facts); `gpu` (GPU
//! readings for the governor); `metrics` (gauges); `repair` (redundancy summary; on the
//! leader rebuild, drain and rebalance moves); `scrub` (reads every local shard back
//! against its checksum); `stripe-gc` (shards of unreferenced stripes), `orphan-purge`
//! (unlinked inodes no mount holds) and `orphan-shards` (shards no stripe record names) in
//! `gc`; `revocations` (the revoked names, in `revoke`); `tier-heat`, `tier-mover`, `tier-
//! gc` and `tier-warm` (the cold tier, in `tier`); the front workers `admin-socket` (in
//! `node::admin`) and `metrics-http` (in `metrics_http`), which serve local clients. What
//! to do is decided by pure code beside each (`steward` uses `consensus::voters`, `repair`
//! the crate's `redundancy`, `gc` its `holders_to_ask`); the worker only carries it out.

pub mod facts;
pub mod gc;
pub mod gpu;
pub mod metrics;
pub mod repair;
pub mod scrub;
pub mod steward;
