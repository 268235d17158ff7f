//! Writing cold data back to NVMe: the stripe's bytes, recalled from the bucket, become a
//! new erasure-coded stripe that replaces the cold one in the file (`WarmStripe`). Used by
//! `shoal tier prefetch` and when a cold stripe is read repeatedly.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use shoal_agent_api::{Ino, TierMoved};
use shoal_namespace::format::{ColdLocation, Timestamp};
use shoal_namespace::{Command, Outcome, Proposal};
use shoal_placement::StripeId;
use shoal_resource_guard::WorkClass;
use tracing::{debug, info, warn};

use super::{PrefetchState, Tier, lock};
use crate::AgentError;
use crate::consensus::ConsensusError;

impl Tier {
    /// Warms a stripe in the background, one at a time on this node.
    pub(super) fn warm_soon(self: &Arc<Self>, ino: Ino, stripe: StripeId, loc: ColdLocation) {
        let this = self.clone();
        tokio::spawn(async move {
            let Ok(_one) = this.warming.acquire().await else {
                return;
            };
            match this.warm(ino, stripe, loc).await {
                Ok(true) => debug!(stripe = %stripe, "cold stripe read repeatedly is hot again"),
                Ok(false) => {}
                Err(e) => {
                    warn!(stripe = %stripe, error = %e, "could not warm a cold stripe");
                    this.failed(&e);
                }
            }
        });
    }

    /// Writes cold stripe `stripe` of file `ino` back to NVMe. False when it was no
    /// longer cold in that file (the new stripe is then an orphan the shard sweep
    /// removes).
    pub(super) async fn warm(
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
        self.wait_for_budget(bytes.len() as u64).await;
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
