//! How recently each file was read, as the mover needs it: every node notes the files its
//! mounts read, and the `tier-heat` worker records them through Raft (`RecordReads`) in
//! one proposal every few seconds, each file at most once per `granularity` — a tenth of
//! `cold_after`, so the record is never off by more than that and a busy file costs one
//! tiny proposal per interval, not one per read.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use shoal_agent_api::Ino;
use shoal_namespace::format::Timestamp;
use shoal_namespace::{Command, Proposal};

use super::{Tier, lock};
use crate::AgentError;
use crate::worker::{Step, Ticker, Worker};

/// How often noted reads are proposed.
const FLUSH_EVERY: Duration = Duration::from_secs(5);

/// The heat record's resolution for a `cold_after` (ms): a tenth of it, between 1 s and
/// 1 h.
pub(super) fn granularity(cold_after_ms: Option<u64>) -> Duration {
    let tenth = cold_after_ms.map_or(3_600_000, |ms| ms / 10);
    Duration::from_millis(tenth.clamp(1_000, 3_600_000))
}

/// Reads noted on this node and not yet recorded.
pub(super) struct HeatLog {
    granularity: Duration,
    inner: Mutex<HeatInner>,
}

#[derive(Default)]
struct HeatInner {
    /// When each file was last queued.
    queued_at: HashMap<Ino, Instant>,
    pending: Vec<Ino>,
}

impl HeatLog {
    pub(super) fn new(granularity: Duration) -> HeatLog {
        HeatLog {
            granularity,
            inner: Mutex::new(HeatInner::default()),
        }
    }

    /// A mount read file `ino`.
    pub(super) fn note(&self, ino: Ino, now: Instant) {
        let mut h = lock(&self.inner);
        match h.queued_at.get(&ino) {
            Some(at) if now.duration_since(*at) < self.granularity => {}
            _ => {
                h.queued_at.insert(ino, now);
                h.pending.push(ino);
            }
        }
    }

    /// The files to record now; forgets queue times older than the granularity.
    pub(super) fn take(&self, now: Instant) -> Vec<Ino> {
        let mut h = lock(&self.inner);
        let g = self.granularity;
        h.queued_at.retain(|_, at| now.duration_since(*at) < g);
        std::mem::take(&mut h.pending)
    }
}

impl Tier {
    /// A mount on this node read file `ino`.
    pub fn note_read(&self, ino: Ino) {
        self.heat.note(ino, Instant::now());
    }
}

/// The `tier-heat` worker: records this node's reads.
pub struct TierHeat {
    tier: Arc<Tier>,
    ticker: Ticker,
}

impl TierHeat {
    pub fn new(tier: Arc<Tier>) -> TierHeat {
        TierHeat {
            tier,
            ticker: Ticker::every(FLUSH_EVERY),
        }
    }
}

impl Worker for TierHeat {
    type Error = AgentError;

    fn name(&self) -> &'static str {
        "tier-heat"
    }

    async fn work(&mut self) -> Result<Step, AgentError> {
        let inos = self.tier.heat.take(Instant::now());
        if inos.is_empty() || !self.tier.cluster_on_this_release().await {
            return Ok(Step::Idle);
        }
        self.tier
            .group
            .propose_one(Proposal {
                id: None,
                now: Timestamp::now(),
                command: Command::RecordReads { inos },
            })
            .await?;
        Ok(Step::Idle)
    }

    async fn wait_for_work(&mut self) {
        self.ticker.tick().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_queued_once_per_granularity() {
        let log = HeatLog::new(Duration::from_secs(10));
        let t0 = Instant::now();
        log.note(1, t0);
        log.note(1, t0 + Duration::from_secs(3));
        log.note(2, t0 + Duration::from_secs(3));
        assert_eq!(log.take(t0 + Duration::from_secs(4)), [1, 2]);
        log.note(1, t0 + Duration::from_secs(5));
        assert!(log.take(t0 + Duration::from_secs(6)).is_empty());
        log.note(1, t0 + Duration::from_secs(11));
        assert_eq!(log.take(t0 + Duration::from_secs(12)), [1]);
    }

    #[test]
    fn granularity_is_a_tenth_of_cold_after_within_bounds() {
        assert_eq!(granularity(Some(600_000)), Duration::from_secs(60));
        assert_eq!(granularity(Some(5_000)), Duration::from_secs(1));
        assert_eq!(
            granularity(Some(30 * 86_400_000)),
            Duration::from_secs(3600)
        );
        assert_eq!(granularity(None), Duration::from_secs(3600));
    }
}
