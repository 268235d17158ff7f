//! The `tier-mover` worker (acts on the metadata leader): every `scan_interval` it asks
//! the policy which files go cold (unused for `cold_after`, or the least recently used
//! while the NVMe fill is above the high watermark; never pinned ones) and uploads them a
//! few objects' worth at a time. While the store fails, it backs off (doubling, up to
//! five minutes) and tries again; nothing is freed before an upload is checked and
//! committed, so an outage costs time, never data.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use shoal_agent_api::Ino;
use shoal_namespace::format::Timestamp;
use shoal_tiering::policy::{self, Candidate, Fill};
use tracing::debug;

use super::{Tier, lock};
use crate::AgentError;
use crate::worker::{Step, Ticker, Worker};

const BACKOFF_FIRST: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(300);

impl Tier {
    /// The files the policy sends to the bucket now, in order.
    pub(super) async fn choose(&self) -> Result<Vec<(Ino, u64)>, AgentError> {
        let store = self.group.store();
        let files = store.tier_files()?;
        let now_ms = self.group.cluster_now_ms()?;
        let wall = Timestamp::now();
        let ec = self.stripes.default_ec();
        let overhead = f64::from(ec.total() as u32) / f64::from(ec.k);
        let mut hot = std::collections::HashMap::new();
        let candidates: Vec<Candidate> = files
            .into_iter()
            .filter(|f| f.hot_bytes > 0)
            .map(|f| {
                // Never used since heat was recorded: go by its mtime (wall clock).
                let last_used_ms = f.heat_ms.unwrap_or_else(|| {
                    let age_ms = (wall.secs - f.mtime.secs).max(0) as u64 * 1000;
                    now_ms.saturating_sub(age_ms)
                });
                let pinned = f.pinned
                    || f.paths
                        .iter()
                        .any(|p| policy::is_pinned(p, &self.config.pinned));
                hot.insert(f.ino, f.hot_bytes);
                Candidate {
                    ino: f.ino,
                    last_used_ms,
                    stored_bytes: (f.hot_bytes as f64 * overhead) as u64,
                    pinned,
                }
            })
            .collect();
        let fill = self.fill().await;
        Ok(policy::choose(&self.policy, now_ms, fill, &candidates)
            .into_iter()
            .map(|(ino, _)| (ino, hot.get(&ino).copied().unwrap_or(0)))
            .collect())
    }

    /// The NVMe fill across the alive nodes (their data filesystems).
    pub(super) async fn fill(&self) -> Fill {
        let members = self.gossip.members().await.unwrap_or_default();
        let mut fill = Fill {
            used: 0,
            capacity: 0,
        };
        for f in members
            .iter()
            .filter(|m| m.state == shoal_mesh::MemberState::Alive)
            .filter_map(|m| m.facts.as_ref())
        {
            fill.used += f.used_bytes;
            fill.capacity += f.capacity_bytes;
        }
        fill
    }
}

/// When the mover may try the store again after failures: the wait doubles with each
/// failure in a row, up to [`BACKOFF_MAX`], and one success forgets them.
#[derive(Debug)]
struct Backoff {
    next: Duration,
    retry_at: Option<Instant>,
}

impl Backoff {
    fn new() -> Backoff {
        Backoff {
            next: BACKOFF_FIRST,
            retry_at: None,
        }
    }

    /// Whether to try now. Once the wait is over the mover works on its scan interval
    /// again: the time to retry is past, not a wake-up that is due forever after (the
    /// mover spun on it, found by the simulator: seed 2 of `tiering`).
    fn ready(&mut self, now: Instant) -> bool {
        match self.retry_at {
            Some(at) if now < at => false,
            Some(_) => {
                self.retry_at = None;
                true
            }
            None => true,
        }
    }

    /// A failure at `now`: how long until the next try.
    fn failed(&mut self, now: Instant) -> Duration {
        let wait = self.next;
        self.retry_at = Some(now + wait);
        self.next = (self.next * 2).min(BACKOFF_MAX);
        wait
    }

    fn succeeded(&mut self) {
        *self = Backoff::new();
    }

    /// When a failed try may be retried, while it waits.
    fn retry_at(&self) -> Option<Instant> {
        self.retry_at
    }
}

/// The `tier-mover` worker.
pub struct TierMover {
    tier: Arc<Tier>,
    ticker: Ticker,
    backoff: Backoff,
}

impl TierMover {
    pub fn new(tier: Arc<Tier>) -> TierMover {
        let every = tier.config.scan_interval;
        TierMover {
            tier,
            ticker: Ticker::every(every),
            backoff: Backoff::new(),
        }
    }
}

impl TierMover {
    /// Tells `tier status` whether a backoff runs (it reads the tier's state, not this
    /// worker).
    fn show_backoff(&self) {
        lock(&self.tier.state).backing_off = self.backoff.retry_at().is_some();
    }
}

impl Worker for TierMover {
    type Error = AgentError;

    fn name(&self) -> &'static str {
        "tier-mover"
    }

    async fn work(&mut self) -> Result<Step, AgentError> {
        if !self.tier.group.is_leader() {
            // A deposed leader's backoff is not this node's to wait out (a wait that
            // stayed set would make every wait for work end at once).
            self.backoff.succeeded();
            self.show_backoff();
            return Ok(Step::Standby);
        }
        if !self.backoff.ready(Instant::now()) {
            return Ok(Step::Idle);
        }
        let chosen = self.tier.choose().await?;
        if chosen.is_empty() {
            return Ok(Step::Idle);
        }
        // A few objects' worth per unit, so a stop or a leader change is never far off.
        let budget = self.tier.object_size * 4;
        let mut batch = Vec::new();
        let mut bytes = 0u64;
        for (ino, hot) in &chosen {
            if !batch.is_empty() && bytes + hot > budget {
                break;
            }
            batch.push(*ino);
            bytes += hot;
        }
        let more = batch.len() < chosen.len();
        match self.tier.upload_files(&batch).await {
            Ok(moved) => {
                debug!(files = moved.files, bytes = moved.bytes, "mover pass");
                self.backoff.succeeded();
                self.show_backoff();
                Ok(if more { Step::Busy } else { Step::Idle })
            }
            Err(e) => {
                // The runner logs it and keeps it for status (the worker in state
                // `error`); an outage may pass, so the next try waits out the backoff
                // (`tier status` says backing off), anything else the next scan.
                if e.is_retryable() {
                    let retry_in = self.backoff.failed(Instant::now());
                    debug!(?retry_in, "cold-tier upload failed; backing off");
                }
                self.show_backoff();
                self.tier.failed(&e);
                Err(e)
            }
        }
    }

    async fn wait_for_work(&mut self) {
        match self.backoff.retry_at() {
            Some(at) if at > Instant::now() => tokio::time::sleep_until(at).await,
            _ => self.ticker.tick().await,
        }
    }

    fn progress(&self) -> Option<String> {
        let s = lock(&self.tier.state);
        (s.moving_files > 0).then(|| {
            format!(
                "{} files, {} bytes to the cold tier",
                s.moving_files, s.moving_bytes
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backoff_waits_longer_after_each_failure_and_forgets_them_on_success() {
        let t0 = Instant::now();
        let mut b = Backoff::new();
        assert!(b.ready(t0));
        assert_eq!(b.failed(t0), BACKOFF_FIRST);
        assert!(!b.ready(t0 + BACKOFF_FIRST / 2));
        assert_eq!(b.retry_at(), Some(t0 + BACKOFF_FIRST));
        let t1 = t0 + BACKOFF_FIRST;
        assert!(b.ready(t1));
        assert_eq!(b.failed(t1), BACKOFF_FIRST * 2);
        for _ in 0..20 {
            b.failed(t1);
        }
        assert_eq!(b.failed(t1), BACKOFF_MAX);
        b.succeeded();
        assert_eq!(b.failed(t1), BACKOFF_FIRST);
    }

    #[test]
    fn a_wait_that_is_over_is_not_a_wake_up_due_forever() {
        let t0 = Instant::now();
        let mut b = Backoff::new();
        b.failed(t0);
        // The next try comes after the wait and finds nothing to move (no success to
        // reset the backoff): the worker must go back to its scan interval.
        assert!(b.ready(t0 + BACKOFF_FIRST));
        assert_eq!(b.retry_at(), None, "a past retry time is not kept");
        // The doubling still holds for the next failure in a row.
        assert_eq!(b.failed(t0 + BACKOFF_FIRST), BACKOFF_FIRST * 2);
    }
}
