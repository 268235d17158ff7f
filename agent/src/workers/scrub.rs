//! The `scrub` worker: re-reads every shard of this node's store in the background, a
//! pass every `[scrub] interval` at most `[scrub] max_rate` (and the governor's scrub
//! budget, which shrinks while the GPUs are busy). Each shard is checked against the
//! store's block checksums and the checksum its stripe record holds. A corrupt shard, or
//! one whose reads fail twice with an I/O error — found by scrub, or by a read the shard
//! server answered and scrub checked again — is given up: its slot is
//! set to no node through Raft (compare-and-set: only while it still names this node),
//! then the local copy is deleted, and the repair worker rewrites it from the others.
//!
//! Where a pass is, and how many passes ran, survive restarts (`scrub.state` in the data
//! dir, saved at most every 10 s), so a long interval is kept across node reboots.
//!
//! A read that fails with an I/O error is tried again a second later; failing twice, the
//! shard is unreadable (a latent sector error) and treated as corrupt. From before the
//! give-up's proposal until the delete, the node refuses puts of that shard (simulator
//! seed 1014 of `disk`: a rebuild onto this node in between was deleted while the record
//! named it). Found shards stay queued (counted once) until the proposal succeeds. A pass
//! the governor throttles says `Throttled` and goes on from that shard.
//!
//! Metrics: `shoal_scrub_{shards,bytes,corrupt_found,corrupt_given_up}_total`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};
use shoal_agent_api::ScrubStatus;
use shoal_namespace::format::Timestamp;
use shoal_namespace::{Command, Outcome, Proposal, ShardMove};
use shoal_placement::{NodeId, StripeId};
use shoal_resource_guard::WorkClass;
use shoal_store::{NodeStore, ShardKey, ShardStore, StoreError};
use tracing::{debug, info, warn};

use crate::consensus::Group;
use crate::data::Stripes;
use crate::worker::{Step, Ticker, Worker};
use crate::{AgentError, Resources};

/// Shards checked per unit of work.
const PAGE: usize = 8;
/// How long to wait before reading a shard again after an I/O error.
const REREAD_AFTER: Duration = Duration::from_secs(1);
/// The pass position is saved at most this often.
const SAVE_EVERY: Duration = Duration::from_secs(10);
const STATE_FILE: &str = "scrub.state";
const STATE_VERSION: u8 = 1;

/// What survives a restart.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Saved {
    passes: u64,
    /// The pass under way: when it started (Unix ms) and the last shard it checked.
    pass_started_unix_ms: Option<u64>,
    after: Option<(u128, u8)>,
    last_pass_unix_ms: Option<u64>,
}

#[derive(Clone, Debug, Default)]
struct Progress {
    saved: Saved,
    shards_checked: u64,
    shards_total: u64,
    bytes_checked: u64,
    corrupt_found: u64,
}

#[derive(Default)]
struct ScrubMetrics {
    shards: Counter,
    bytes: Counter,
    corrupt_found: Counter,
    given_up: Counter,
}

/// The scrub worker's state shared with status.
pub struct ScrubShared {
    path: PathBuf,
    enabled: bool,
    interval: Duration,
    progress: Mutex<Progress>,
    metrics: ScrubMetrics,
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl ScrubShared {
    pub fn new(
        data_dir: &Path,
        enabled: bool,
        interval: Duration,
        registry: &mut Registry,
    ) -> Arc<ScrubShared> {
        let path = data_dir.join(STATE_FILE);
        let saved = match std::fs::read(&path) {
            Ok(bytes) => decode(&bytes).unwrap_or_else(|| {
                warn!(path = %path.display(), "scrub state unreadable; starting a new pass");
                Saved::default()
            }),
            Err(_) => Saved::default(),
        };
        let metrics = ScrubMetrics::default();
        let r = registry.sub_registry_with_prefix("shoal_scrub");
        r.register("shards", "Shards scrub checked", metrics.shards.clone());
        r.register("bytes", "Bytes scrub read", metrics.bytes.clone());
        r.register(
            "corrupt_found",
            "Corrupt shards found on this node, by scrub or by a read",
            metrics.corrupt_found.clone(),
        );
        r.register(
            "corrupt_given_up",
            "Corrupt shards this node gave up for repair to rewrite",
            metrics.given_up.clone(),
        );
        Arc::new(ScrubShared {
            path,
            enabled,
            interval,
            progress: Mutex::new(Progress {
                saved,
                ..Progress::default()
            }),
            metrics,
        })
    }

    /// What status shows.
    pub fn status(&self) -> ScrubStatus {
        let p = lock(&self.progress).clone();
        let next = match (p.saved.pass_started_unix_ms, p.saved.last_pass_unix_ms) {
            (None, Some(last)) if self.enabled => {
                Some(last.saturating_add(self.interval.as_millis() as u64))
            }
            _ => None,
        };
        ScrubStatus {
            enabled: self.enabled,
            passes: p.saved.passes,
            shards_checked: p.shards_checked,
            shards_total: p.shards_total,
            bytes_checked: p.bytes_checked,
            corrupt_found: p.corrupt_found,
            last_pass_unix_ms: p.saved.last_pass_unix_ms,
            next_pass_unix_ms: next,
        }
    }

    fn save(&self) {
        let saved = lock(&self.progress).saved.clone();
        let mut bytes = vec![STATE_VERSION];
        bytes.extend(postcard::to_allocvec(&saved).unwrap_or_default());
        if let Err(e) = crate::durable::replace_file(&self.path, &bytes) {
            warn!(error = %e, "could not save the scrub position");
        }
    }
}

fn decode(bytes: &[u8]) -> Option<Saved> {
    match bytes.split_first() {
        Some((&STATE_VERSION, body)) => postcard::from_bytes(body).ok(),
        _ => None,
    }
}

pub struct Scrub {
    group: Arc<Group>,
    stripes: Arc<Stripes>,
    store: Arc<NodeStore>,
    resources: Arc<Resources>,
    shared: Arc<ScrubShared>,
    interval: Duration,
    max_rate: u64,
    /// When the next byte may be read at `max_rate`.
    next_read: Instant,
    saved_at: Instant,
    ticker: Ticker,
    /// Corrupt shards found (and counted) but not given up yet: kept until given up, so a
    /// failed proposal is tried again instead of dropping the shard until the next pass.
    to_give_up: BTreeSet<ShardKey>,
}

impl Scrub {
    pub fn new(
        group: Arc<Group>,
        stripes: Arc<Stripes>,
        store: Arc<NodeStore>,
        resources: Arc<Resources>,
        shared: Arc<ScrubShared>,
        max_rate: u64,
    ) -> Scrub {
        let interval = shared.interval;
        Scrub {
            group,
            stripes,
            store,
            resources,
            shared,
            interval,
            max_rate: max_rate.max(1),
            next_read: Instant::now(),
            saved_at: Instant::now(),
            ticker: Ticker::every(Duration::from_secs(1)),
            to_give_up: BTreeSet::new(),
        }
    }

    /// Starts a pass when none is under way and the last one started `interval` ago.
    fn start_pass_if_due(&self) -> bool {
        let mut p = lock(&self.shared.progress);
        if p.saved.pass_started_unix_ms.is_some() {
            return true;
        }
        let now = unix_ms(shoal_agent_api::wall_clock::now());
        let due = p
            .saved
            .last_pass_unix_ms
            .is_none_or(|last| now.saturating_sub(last) >= self.interval.as_millis() as u64);
        if due {
            p.saved.pass_started_unix_ms = Some(now);
            p.saved.after = None;
            p.shards_checked = 0;
            p.bytes_checked = 0;
            p.shards_total = self.store.usage().shards;
        }
        due
    }

    /// Takes `bytes` of the governor's scrub budget (or says how long to wait for it),
    /// then waits until `max_rate` lets them be read.
    async fn pace(&mut self, bytes: u64) -> Result<(), Duration> {
        self.resources.take(WorkClass::Scrub, bytes, false)?;
        let now = Instant::now();
        if self.next_read > now {
            tokio::time::sleep(self.next_read - now).await;
        }
        self.next_read =
            self.next_read.max(now) + Duration::from_secs_f64(bytes as f64 / self.max_rate as f64);
        Ok(())
    }

    /// Checks one shard; true when it is corrupt or cannot be read. A read that fails
    /// with an I/O error is tried once more a second later; failing twice, the shard is
    /// unreadable (a latent sector error) and given up like a corrupt one. (Returning the
    /// error stopped the pass at that shard for good: every later unit read it again.)
    async fn check(&self, key: ShardKey) -> Result<bool, AgentError> {
        let mut read = self.store.get(key, 0, None).await;
        if matches!(read, Err(StoreError::Io { .. })) {
            tokio::time::sleep(REREAD_AFTER).await;
            read = self.store.get(key, 0, None).await;
            if let Err(e @ StoreError::Io { .. }) = &read {
                warn!(stripe = %StripeId(key.stripe), shard = key.index, error = %e, "shard cannot be read, twice");
                return Ok(true);
            }
        }
        match read {
            Ok(data) => {
                let Some(record) = self.group.store().live_stripe(StripeId(key.stripe))? else {
                    return Ok(false);
                };
                let expected = record
                    .shards
                    .get(usize::from(key.index))
                    .filter(|s| s.node == self.stripes.me())
                    .map(|s| s.crc32c);
                Ok(expected.is_some_and(|crc| crc32c::crc32c(&data) != crc))
            }
            Err(StoreError::Corrupt { .. }) => Ok(true),
            Err(StoreError::NotFound(_)) => Ok(false),
            Err(e) => Err(crate::data::StripeError::Store(e).into()),
        }
    }

    /// Counts a corrupt shard (once) and queues it to be given up.
    fn found(&mut self, key: ShardKey) {
        if self.to_give_up.insert(key) {
            lock(&self.shared.progress).corrupt_found += 1;
            self.shared.metrics.corrupt_found.inc();
        }
    }

    /// Gives up every queued shard; one that fails stays queued, with those after it.
    async fn give_up_found(&mut self) -> Result<(), AgentError> {
        while let Some(key) = self.to_give_up.first().copied() {
            self.give_up(key).await?;
            self.to_give_up.remove(&key);
        }
        Ok(())
    }

    /// Gives a corrupt shard up: its slot names no node from now on (only if it names this
    /// one), then the local copy goes. Repair rewrites it.
    async fn give_up(&self, key: ShardKey) -> Result<(), AgentError> {
        let me = self.stripes.me();
        let stripe = StripeId(key.stripe);
        let names_me = self
            .group
            .store()
            .live_stripe(stripe)?
            .and_then(|r| r.shards.get(usize::from(key.index)).map(|s| s.node == me))
            .unwrap_or(false);
        if !names_me {
            // Not this node's to give up (the sweeps of leftovers and orphans take it).
            debug!(%stripe, shard = key.index, "corrupt shard the records do not name here");
            return Ok(());
        }
        // From before the proposal until the delete, this node refuses puts of the shard:
        // once the slot names no node, repair may rebuild it here, and the delete below
        // would take the new copy while the record names this node (seed 1014 of `disk`).
        let _refusing = self.stripes.refuse_puts(&[(stripe, key.index)]);
        let outcome = self
            .group
            .propose_one(Proposal {
                id: None,
                now: Timestamp::now(),
                command: Command::RelocateShards {
                    stripe,
                    moves: vec![ShardMove {
                        index: key.index,
                        from: me,
                        to: NodeId::NONE,
                        crc32c: 0,
                    }],
                },
            })
            .await?;
        if outcome == Outcome::Done {
            self.store
                .delete(key)
                .await
                .map_err(crate::data::StripeError::Store)?;
            self.shared.metrics.given_up.inc();
            warn!(%stripe, shard = key.index, "corrupt shard given up; repair rewrites it from the others");
        }
        Ok(())
    }

    /// Checks the next page of the pass; ends the pass after the last shard. A shard the
    /// governor has no scrub budget for yet ends the page there: how long to wait for it.
    async fn scrub_page(&mut self) -> Result<Option<Duration>, AgentError> {
        let after = lock(&self.shared.progress)
            .saved
            .after
            .map(|(stripe, index)| ShardKey { stripe, index });
        let page = self.store.list_after(after, PAGE);
        for &(key, len) in &page {
            if let Err(wait) = self.pace(len).await {
                // Throttled: the pass goes on from this shard (saved as often as ever).
                self.save_if_due();
                return Ok(Some(wait));
            }
            if self.check(key).await? {
                self.found(key);
                self.give_up_found().await?;
            }
            let mut p = lock(&self.shared.progress);
            p.saved.after = Some((key.stripe, key.index));
            p.shards_checked += 1;
            p.bytes_checked += len;
            drop(p);
            self.shared.metrics.shards.inc();
            self.shared.metrics.bytes.inc_by(len);
        }
        if page.len() < PAGE {
            let mut p = lock(&self.shared.progress);
            p.saved.passes += 1;
            p.saved.pass_started_unix_ms = None;
            p.saved.after = None;
            p.saved.last_pass_unix_ms = Some(unix_ms(shoal_agent_api::wall_clock::now()));
            let (n, bytes) = (p.shards_checked, p.bytes_checked);
            drop(p);
            info!(shards = n, bytes, "scrub pass done");
            self.shared.save();
            self.saved_at = Instant::now();
        } else {
            self.save_if_due();
        }
        Ok(None)
    }

    /// Saves the pass's position when [`SAVE_EVERY`] has passed since the last save.
    fn save_if_due(&mut self) {
        if self.saved_at.elapsed() >= SAVE_EVERY {
            self.shared.save();
            self.saved_at = Instant::now();
        }
    }
}

impl Worker for Scrub {
    type Error = AgentError;

    fn name(&self) -> &'static str {
        "scrub"
    }

    async fn work(&mut self) -> Result<Step, AgentError> {
        // Reads this node's shard server answered with a corrupt or unreadable shard:
        // checked here first (an I/O error may have passed).
        for key in self.stripes.corrupt_reports().take() {
            if self.check(key).await? {
                self.found(key);
            }
        }
        self.give_up_found().await?;
        if !self.shared.enabled || !self.start_pass_if_due() {
            return Ok(Step::Idle);
        }
        if let Some(wait) = self.scrub_page().await? {
            return Ok(Step::Throttled {
                budget: WorkClass::Scrub,
                wait,
            });
        }
        let under_way = lock(&self.shared.progress)
            .saved
            .pass_started_unix_ms
            .is_some();
        Ok(if under_way { Step::Busy } else { Step::Idle })
    }

    async fn wait_for_work(&mut self) {
        let reports = self.stripes.corrupt_reports().clone();
        tokio::select! {
            _ = self.ticker.tick() => {}
            _ = reports.reported() => {}
        }
    }

    fn progress(&self) -> Option<String> {
        let p = lock(&self.shared.progress);
        p.saved.pass_started_unix_ms.map(|_| {
            format!(
                "pass {}: {} of {} shards, {} corrupt found",
                p.saved.passes + 1,
                p.shards_checked,
                p.shards_total,
                p.corrupt_found
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pass_position_survives_a_restart() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut registry = Registry::default();
        let shared = ScrubShared::new(dir.path(), true, Duration::from_secs(9), &mut registry);
        {
            let mut p = lock(&shared.progress);
            p.saved.passes = 3;
            p.saved.pass_started_unix_ms = Some(10);
            p.saved.after = Some((7, 2));
        }
        shared.save();
        let again = ScrubShared::new(
            dir.path(),
            true,
            Duration::from_secs(9),
            &mut Registry::default(),
        );
        let p = lock(&again.progress).saved.clone();
        assert_eq!(p.passes, 3);
        assert_eq!(p.after, Some((7, 2)));
        std::fs::write(dir.path().join(STATE_FILE), b"junk").expect("write");
        let fresh = ScrubShared::new(
            dir.path(),
            true,
            Duration::from_secs(9),
            &mut Registry::default(),
        );
        assert_eq!(lock(&fresh.progress).saved, Saved::default());
    }
}
