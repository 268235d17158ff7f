//! Writing cold data back to NVMe: the stripe's bytes, recalled from the bucket, become a
//! new erasure-coded stripe that replaces the cold one in the file (`WarmStripe`). Used by
//! `shoal tier prefetch` and, through the `tier-warm` worker, when a cold stripe is read
//! repeatedly.

use std::collections::{BTreeSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use shoal_agent_api::{Ino, TierMoved};
use shoal_namespace::format::{ColdLocation, Timestamp};
use shoal_namespace::{Command, Outcome, Proposal};
use shoal_placement::StripeId;
use shoal_resource_guard::WorkClass;
use tracing::{debug, info};

use super::{PrefetchState, Tier, lock};
use crate::AgentError;
use crate::consensus::ConsensusError;
use crate::worker::{Step, Worker};

/// Most stripes waiting to be warmed; one read again while this many wait is warmed
/// when it is read again after that.
const REWARM_QUEUE_MAX: usize = 64;

/// A cold stripe to warm: its file, its id, where it lies in the bucket.
type Rewarm = (Ino, StripeId, ColdLocation);

/// Cold stripes read repeatedly, for the `tier-warm` worker, each queued once.
#[derive(Default)]
pub(super) struct RewarmQueue {
    queue: Mutex<VecDeque<Rewarm>>,
    ready: Notify,
}

impl RewarmQueue {
    fn push(&self, item: Rewarm) {
        let mut q = lock(&self.queue);
        if q.len() < REWARM_QUEUE_MAX && !q.iter().any(|(_, id, _)| *id == item.1) {
            q.push_back(item);
            self.ready.notify_one();
        }
    }

    fn pop(&self) -> Option<Rewarm> {
        lock(&self.queue).pop_front()
    }

    fn push_front(&self, item: Rewarm) {
        lock(&self.queue).push_front(item);
    }

    fn is_empty(&self) -> bool {
        lock(&self.queue).is_empty()
    }
}

/// The `tier-warm` worker: writes cold stripes read repeatedly back to NVMe, one at a
/// time, on the governor's tiering budget (throttled while it has none).
pub struct TierWarm {
    tier: Arc<Tier>,
}

impl TierWarm {
    pub fn new(tier: Arc<Tier>) -> TierWarm {
        TierWarm { tier }
    }
}

impl Worker for TierWarm {
    type Error = AgentError;

    fn name(&self) -> &'static str {
        "tier-warm"
    }

    async fn work(&mut self) -> Result<Step, AgentError> {
        let rewarm = &self.tier.rewarm;
        let Some((ino, stripe, loc)) = rewarm.pop() else {
            return Ok(Step::Idle);
        };
        if let Err(wait) = self.tier.resources.take(WorkClass::Tiering, loc.len, false) {
            rewarm.push_front((ino, stripe, loc));
            return Ok(Step::Throttled {
                budget: WorkClass::Tiering,
                wait,
            });
        }
        match self.tier.warm_now(ino, stripe, loc).await {
            Ok(true) => debug!(stripe = %stripe, "cold stripe read repeatedly is hot again"),
            Ok(false) => {}
            Err(e) => {
                self.tier.failed(&e);
                return Err(e);
            }
        }
        Ok(if rewarm.is_empty() {
            Step::Idle
        } else {
            Step::Busy
        })
    }

    async fn wait_for_work(&mut self) {
        if self.tier.rewarm.is_empty() {
            self.tier.rewarm.ready.notified().await;
        }
    }
}

impl Tier {
    /// Queues a stripe for the `tier-warm` worker.
    pub(super) fn warm_soon(&self, ino: Ino, stripe: StripeId, loc: ColdLocation) {
        self.rewarm.push((ino, stripe, loc));
    }

    /// Writes cold stripe `stripe` of file `ino` back to NVMe once the governor lets its
    /// bytes through. False when it was no longer cold in that file (the new stripe is
    /// then an orphan the shard sweep removes).
    pub(super) async fn warm(
        self: &Arc<Self>,
        ino: Ino,
        stripe: StripeId,
        loc: ColdLocation,
    ) -> Result<bool, AgentError> {
        self.wait_for_budget(loc.len).await;
        self.warm_now(ino, stripe, loc).await
    }

    /// [`Self::warm`] with the budget taken already.
    async fn warm_now(
        self: &Arc<Self>,
        ino: Ino,
        stripe: StripeId,
        loc: ColdLocation,
    ) -> Result<bool, AgentError> {
        if !self.cluster_on_this_release().await {
            return Err(AgentError::Refused(
                "warming cold data needs every node on this release".into(),
            ));
        }
        let Some(record) = self.group.store().live_stripe(stripe)? else {
            return Ok(false);
        };
        let bytes = self.recall(None, stripe, loc).await?;
        let warm = self.stripes.write(bytes, Some(record.ec)).await?;
        let outcome = self
            .group
            .propose_one(Proposal {
                id: None,
                now: Timestamp::now(),
                command: Command::WarmStripe {
                    ino,
                    stripe,
                    warm: warm.into(),
                },
            })
            .await?;
        match outcome {
            Outcome::Done => {
                self.cache.forget(stripe);
                self.metrics.warmed_stripes.inc();
                Ok(true)
            }
            Outcome::Conflict | Outcome::StripeAbandoned(_) => Ok(false),
            Outcome::Failed(error) => Err(AgentError::Declined {
                what: format!("warming {stripe}"),
                error: error.into(),
            }),
            other => Err(ConsensusError::UnexpectedOutcome(Box::new(other)).into()),
        }
    }

    /// Waits until the governor lets `bytes` of tiering work through.
    pub(super) async fn wait_for_budget(&self, bytes: u64) {
        while let Err(wait) = self.resources.take(WorkClass::Tiering, bytes, false) {
            tokio::time::sleep(wait.min(Duration::from_secs(1))).await;
        }
    }

    /// `shoal tier prefetch`: every cold stripe of these files (and of every file below
    /// these directories) back on NVMe. Status shows the progress meanwhile.
    pub async fn prefetch(self: &Arc<Self>, inos: &[Ino]) -> Result<TierMoved, AgentError> {
        // As `release`: judged against everything committed so far.
        self.group.barrier().await?;
        let started = Instant::now();
        let mut work = Vec::new();
        let (mut files_total, mut bytes_total) = (0u64, 0u64);
        for ino in self.group.store().files_below(inos)? {
            let data = self.group.store().file_data(ino)?;
            let mut seen = BTreeSet::new();
            let cold: Vec<(StripeId, ColdLocation)> = data
                .extents
                .iter()
                .filter_map(|e| data.cold.get(&e.stripe.id).map(|l| (e.stripe.id, *l)))
                .filter(|(id, _)| seen.insert(*id))
                .collect();
            if !cold.is_empty() {
                files_total += 1;
                bytes_total += cold.iter().map(|(_, l)| l.len).sum::<u64>();
                work.push((ino, cold));
            }
        }
        lock(&self.state).prefetch = Some(PrefetchState {
            files_total,
            files_done: 0,
            bytes_total,
            bytes_done: 0,
            started,
        });
        let result = self.warm_all(&work).await;
        lock(&self.state).prefetch = None;
        let mut moved = result?;
        moved.millis = started.elapsed().as_millis() as u64;
        if moved.stripes > 0 {
            info!(
                files = moved.files,
                bytes = moved.bytes,
                "prefetched cold data to NVMe"
            );
        }
        Ok(moved)
    }

    async fn warm_all(
        self: &Arc<Self>,
        work: &[(Ino, Vec<(StripeId, ColdLocation)>)],
    ) -> Result<TierMoved, AgentError> {
        let mut moved = TierMoved::default();
        for (ino, stripes) in work {
            let mut warmed_any = false;
            for &(id, loc) in stripes {
                if self.warm(*ino, id, loc).await? {
                    moved.stripes += 1;
                    moved.bytes += loc.len;
                    warmed_any = true;
                }
                if let Some(p) = lock(&self.state).prefetch.as_mut() {
                    p.bytes_done += loc.len;
                }
            }
            moved.files += u64::from(warmed_any);
            if let Some(p) = lock(&self.state).prefetch.as_mut() {
                p.files_done += 1;
            }
        }
        Ok(moved)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(stripe: u128) -> Rewarm {
        let loc = ColdLocation {
            object: 7,
            offset: 0,
            len: 100,
            crc32c: 0,
        };
        (1, StripeId(stripe), loc)
    }

    #[test]
    fn a_stripe_waits_once_the_queue_is_bounded_and_a_throttled_one_goes_back_first() {
        let q = RewarmQueue::default();
        q.push(item(1));
        q.push(item(1));
        q.push(item(2));
        assert_eq!(q.pop().map(|i| i.1), Some(StripeId(1)));
        q.push_front(item(1));
        assert_eq!(q.pop().map(|i| i.1), Some(StripeId(1)), "back at the head");
        assert_eq!(q.pop().map(|i| i.1), Some(StripeId(2)));
        assert!(q.is_empty());
        for s in 0..(REWARM_QUEUE_MAX as u128 + 10) {
            q.push(item(s));
        }
        assert_eq!(lock(&q.queue).len(), REWARM_QUEUE_MAX);
    }
}
