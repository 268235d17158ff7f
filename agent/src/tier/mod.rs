//! The cold tier at work in the agent: uploads of cold stripes (`upload`), reads of cold
//! data (`recall`), writing it back to NVMe (`warm`), and the workers that drive them —
//! `tier-mover` (what the policy says goes cold, on the metadata leader), `tier-gc`
//! (objects nothing uses, on the leader), `tier-heat` (this node's reads, recorded
//! coarsely through Raft) and `tier-warm` (cold stripes read repeatedly, written back to
//! NVMe). The store itself and the pure policy are in `shoal-tiering`.
//!
//! Defaults (`config.rs`): `cold_after` 7d, watermarks 0.85/0.70, `recall_timeout` 30 s,
//! `object_size` 16 MiB, `scan_interval` 60 s, `orphan_object_grace` 1 h. Why 16 MiB
//! objects: 1/16 of the PUTs of per-stripe objects, a small cost per deleted file while
//! part of an object is still used, far below a single PUT's 5 GiB limit. The `dir` store
//! (a directory every node shares; `dev-cluster` uses `DIR/cold`) fsyncs before a put
//! returns, as a bucket's put is durable when acknowledged. Shards of a cold stripe are
//! deleted by their holders 30 s after they see the commit (`workers/gc.rs`), not after the
//! 10 min grace of unknown shards. `shoal tier release` runs the mover's upload on the node
//! asked, and `prefetch` its warming, each after a read barrier.
//!
//! While an alive member gossips another `agent_version`, the mover, GC, heat, pins,
//! release and warming stand still or are refused (`Tier::cluster_on_this_release`): an
//! older agent could not apply their commands. Not yet: partly used objects are never
//! compacted (an object is deleted only when none of its stripes is used); `tier status`
//! counts come from the replica, but the mover's state is the local node's: its worker's
//! (`standby` off the leader, `backing off` after a failure).

mod claim;
mod gc;
mod heat;
mod metrics;
mod mover;
mod recall;
mod report;
mod upload;
mod warm;

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use shoal_mesh::GossipHandle;
use shoal_tiering::ColdStore;
use shoal_tiering::policy::Policy;

pub use crate::config::tiering::{StoreKind, TieringConfig};
pub use gc::TierGc;
pub use heat::TierHeat;
pub use metrics::TierMetrics;
pub use mover::TierMover;
pub use warm::TierWarm;

use crate::consensus::Group;
use crate::data::Stripes;
use crate::{AgentError, Resources};

/// What status shows of this node's tier work.
#[derive(Debug, Default)]
struct TierState {
    /// The mover waits out a backoff after a failed upload (an outage of the store).
    backing_off: bool,
    store_ok: bool,
    last_error: Option<(String, SystemTime)>,
    moving_files: u64,
    moving_bytes: u64,
    uploaded_bytes: u64,
    recall_requests: u64,
    recall_bytes: u64,
    /// The prefetch under way on this node (files and bytes to warm, and warmed).
    prefetch: Option<PrefetchState>,
}

#[derive(Debug, Clone, Copy)]
struct PrefetchState {
    files_total: u64,
    files_done: u64,
    bytes_total: u64,
    bytes_done: u64,
    started: tokio::time::Instant,
}

/// The cold tier of this node: the store, the policy, and what the workers share.
pub struct Tier {
    pub config: TieringConfig,
    pub store: Arc<dyn ColdStore>,
    policy: Policy,
    object_size: u64,
    group: Arc<Group>,
    stripes: Arc<Stripes>,
    resources: Arc<Resources>,
    gossip: GossipHandle,
    state: Mutex<TierState>,
    cache: recall::RecallCache,
    heat: heat::HeatLog,
    metrics: TierMetrics,
    /// Cold stripes read repeatedly, waiting for the `tier-warm` worker.
    rewarm: warm::RewarmQueue,
    /// This cluster's claim on the store, and whether it was checked.
    claim: String,
    claimed: std::sync::atomic::AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Tier {
    /// The tier on `store` (opened from `config` by the agent, the simulator's bucket in
    /// memory there); `config` gives the policy. `ca_pem`: the cluster CA certificate,
    /// which names the cluster in the store's claim.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        config: TieringConfig,
        store: Arc<dyn ColdStore>,
        ca_pem: &[u8],
        group: Arc<Group>,
        stripes: Arc<Stripes>,
        resources: Arc<Resources>,
        gossip: GossipHandle,
        metrics: TierMetrics,
    ) -> Result<Arc<Tier>, AgentError> {
        let policy = config.policy()?;
        let object_size = config.object_size_bytes()?;
        let granularity = heat::granularity(policy.cold_after_ms);
        Ok(Arc::new(Tier {
            store,
            policy,
            object_size,
            group,
            stripes,
            resources,
            gossip,
            state: Mutex::new(TierState {
                store_ok: true,
                ..TierState::default()
            }),
            cache: recall::RecallCache::new(recall::CACHE_BYTES),
            heat: heat::HeatLog::new(granularity),
            metrics,
            rewarm: warm::RewarmQueue::default(),
            claim: claim::claim_text(ca_pem),
            claimed: std::sync::atomic::AtomicBool::new(false),
            config,
        }))
    }

    /// The store answered (or failed to); status and metrics follow.
    fn store_answered(&self, result: Result<(), &shoal_tiering::TierError>) {
        let mut s = lock(&self.state);
        match result {
            Ok(()) => s.store_ok = true,
            Err(e) => {
                s.store_ok = !e.is_retryable();
                s.last_error = Some((e.to_string(), SystemTime::now()));
            }
        }
        self.metrics.store_up.set(i64::from(s.store_ok));
    }

    /// Some other failure worth showing.
    fn failed(&self, e: &AgentError) {
        lock(&self.state).last_error = Some((e.to_string(), SystemTime::now()));
    }

    /// Whether every alive member runs this release: the tier's commands are new in the
    /// log, and an agent of an older release could not apply them.
    async fn cluster_on_this_release(&self) -> bool {
        let Ok(members) = self.gossip.members().await else {
            return false;
        };
        crate::releases::alive_on_other_releases(&members).is_empty()
    }

    /// Runs `f` against the store within `limit`; a timeout is a retryable store error.
    async fn timed<T>(
        &self,
        limit: Duration,
        f: impl std::future::Future<Output = Result<T, shoal_tiering::TierError>>,
    ) -> Result<T, shoal_tiering::TierError> {
        let result = match tokio::time::timeout(limit, f).await {
            Ok(r) => r,
            Err(_) => Err(shoal_tiering::TierError::TimedOut(limit)),
        };
        self.store_answered(result.as_ref().map(|_| ()));
        if result.is_err() {
            self.metrics.errors.inc();
        }
        result
    }
}
