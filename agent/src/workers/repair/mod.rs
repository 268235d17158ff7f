//! The `repair` worker. On every node it scans the local metadata replica page by page
//! and keeps the cluster's redundancy summary (what `shoal status` shows: stripes and
//! bytes by missing shards). On the metadata leader it also rebuilds lost shards, the most
//! endangered stripes first, as the pure planner ([`plan`]) decides: decode from any k
//! survivors, store each rebuilt shard on its target, then commit the new locations with
//! one compare-and-set `RelocateShards` per stripe. A stripe is committed only once its
//! rebuilt shards are durable, so a crash at any point leaves either the old record (the
//! next leader plans it again; shards stored without their commit are disowned and
//! deleted by their nodes' `orphan-shards` worker) or the new one.
//!
//! Rebuilding draws on the governor's repair budget, which shrinks while the GPUs are
//! busy; a stripe at its last spare shard also draws on a floor that never does.

pub mod plan;

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use shoal_agent_api::StripeRecord;
use shoal_mesh::{GossipHandle, MemberState};
use shoal_namespace::format::Timestamp;
use shoal_namespace::{Command, Outcome, Proposal};
use shoal_placement::{NodeId, StripeId};
use shoal_resource_guard::WorkClass;
use tokio::task::JoinSet;
use tracing::{debug, info, warn};

use self::plan::{Health, Plan, Room, Summary, Task};
use super::{Step, Ticker, Worker};
use crate::consensus::Group;
use crate::data::Stripes;
use crate::{AgentError, Resources};

/// Stripe records read per unit of scanning.
const PAGE: usize = 1024;
/// A new pass starts this long after the last one ended (at once when the layout changes).
const SCAN_EVERY: Duration = Duration::from_secs(5);
/// Most stripes one pass queues for repair (the most endangered); the next pass finds the
/// rest.
const QUEUE_MAX: usize = 1024;
/// Most stripes rebuilt at once, whatever the budget allows.
const PARALLEL_MAX: u32 = 4;
/// The repair rate is measured over this window.
const RATE_WINDOW: Duration = Duration::from_secs(20);
/// One unit of repair work starts new stripes for at most this long.
const UNIT: Duration = Duration::from_secs(2);

/// What the repair worker knows now, for status and metrics.
#[derive(Clone, Debug, Default)]
pub struct RepairView {
    /// The summary of the last whole pass.
    pub summary: Option<Summary>,
    /// When that pass ended.
    pub scanned_at: Option<Instant>,
    /// Bytes a second rebuilt lately (on this node).
    pub bytes_per_sec: u64,
    /// Since this agent started.
    pub repaired_stripes: u64,
    pub repaired_bytes: u64,
    /// Stripes of the last plan whose lost shards no node can take now.
    pub no_target: u64,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MissingLabel {
    /// "0", "1", "2", … or "unreadable".
    missing: String,
}

#[derive(Default)]
struct RepairMetrics {
    stripes: Family<MissingLabel, Gauge>,
    bytes_to_repair: Gauge,
    repaired_bytes: Counter,
    repaired_stripes: Counter,
    bytes_per_sec: Gauge,
    conflicts: Counter,
}

/// The repair worker's state shared with status and the metrics endpoint.
pub struct RepairShared {
    view: Mutex<RepairView>,
    metrics: RepairMetrics,
}

impl RepairShared {
    pub fn new(registry: &mut Registry) -> Arc<RepairShared> {
        let metrics = RepairMetrics::default();
        let r = registry.sub_registry_with_prefix("shoal_redundancy");
        r.register(
            "stripes",
            "Live stripes by shards missing (down or lost nodes, never written), as of the last scan",
            metrics.stripes.clone(),
        );
        r.register(
            "bytes_to_repair",
            "Bytes of lost shards waiting to be rebuilt, as of the last scan",
            metrics.bytes_to_repair.clone(),
        );
        let r = registry.sub_registry_with_prefix("shoal_repair");
        r.register(
            "bytes",
            "Bytes of shards this node rebuilt and committed",
            metrics.repaired_bytes.clone(),
        );
        r.register(
            "stripes",
            "Stripes this node repaired",
            metrics.repaired_stripes.clone(),
        );
        r.register(
            "bytes_per_sec",
            "Bytes a second this node rebuilt over the last 20 s",
            metrics.bytes_per_sec.clone(),
        );
        r.register(
            "conflicts",
            "Repairs not committed because the stripe changed meanwhile",
            metrics.conflicts.clone(),
        );
        Arc::new(RepairShared {
            view: Mutex::new(RepairView::default()),
            metrics,
        })
    }

    pub fn view(&self) -> RepairView {
        lock(&self.view).clone()
    }

    fn publish_summary(&self, summary: Summary, no_target: u64) {
        let m = &self.metrics;
        m.stripes.clear();
        let set = |label: String, n: u64| {
            m.stripes
                .get_or_create(&MissingLabel { missing: label })
                .set(n as i64);
        };
        set("0".into(), summary.healthy);
        for (missing, (n, _)) in &summary.by_missing {
            set(missing.to_string(), *n);
        }
        set("unreadable".into(), summary.unreadable);
        m.bytes_to_repair.set(summary.bytes_to_repair as i64);
        let mut v = lock(&self.view);
        v.summary = Some(summary);
        v.scanned_at = Some(Instant::now());
        v.no_target = no_target;
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A pass over the stripe records, page by page.
#[derive(Default)]
struct Pass {
    after: Option<StripeId>,
    summary: Summary,
    /// The most endangered stripes with lost slots: (available, id) → record.
    candidates: Vec<(StripeRecord, Health)>,
}

pub struct Repair {
    group: Arc<Group>,
    stripes: Arc<Stripes>,
    gossip: GossipHandle,
    resources: Arc<Resources>,
    shared: Arc<RepairShared>,
    pass: Option<Pass>,
    last_pass_end: Option<Instant>,
    last_epoch: Option<u64>,
    queue: VecDeque<Task>,
    /// (when, bytes) of recent commits, for the rate.
    recent: VecDeque<(Instant, u64)>,
    told_rate: Option<(u64, Instant)>,
    ticker: Ticker,
}

impl Repair {
    pub fn new(
        group: Arc<Group>,
        stripes: Arc<Stripes>,
        gossip: GossipHandle,
        resources: Arc<Resources>,
        shared: Arc<RepairShared>,
    ) -> Repair {
        Repair {
            group,
            stripes,
            gossip,
            resources,
            shared,
            pass: None,
            last_pass_end: None,
            last_epoch: None,
            queue: VecDeque::new(),
            recent: VecDeque::new(),
            told_rate: None,
            ticker: Ticker::every(Duration::from_secs(1)),
        }
    }

    /// Whether a new pass should start: never run, the layout changed, or due.
    fn pass_due(&mut self) -> Result<bool, AgentError> {
        let epoch = self.group.store().cluster_layout()?.map(|l| l.epoch());
        let changed = epoch != self.last_epoch;
        self.last_epoch = epoch;
        Ok(changed
            || self
                .last_pass_end
                .is_none_or(|at| at.elapsed() >= SCAN_EVERY))
    }

    /// Scans one page; at the end of the pass publishes the summary and (on the leader)
    /// plans the repairs.
    async fn scan_page(&mut self) -> Result<(), AgentError> {
        let store = self.group.store();
        let Some(layout) = store.cluster_layout()? else {
            self.pass = None;
            return Ok(());
        };
        let members = self.gossip.members().await?;
        let alive: BTreeSet<NodeId> = members
            .iter()
            .filter(|m| m.state == MemberState::Alive)
            .map(|m| m.id.node)
            .collect();
        let pass = self.pass.get_or_insert_with(Pass::default);
        let page = store.stripes(pass.after, PAGE)?;
        pass.after = page.last().map(|r| r.id);
        for record in page.iter() {
            let h = Health::of(record, &layout, &alive);
            pass.summary.add(record, &h);
            if !h.lost.is_empty() {
                pass.candidates.push((record.clone(), h));
            }
        }
        // Keep the most endangered only.
        if pass.candidates.len() > 2 * QUEUE_MAX {
            trim(&mut pass.candidates);
        }
        if page.len() == PAGE {
            return Ok(());
        }
        let mut pass = self.pass.take().unwrap_or_default();
        trim(&mut pass.candidates);
        self.last_pass_end = Some(Instant::now());
        let mut no_target = 0;
        if self.group.is_leader() && !pass.candidates.is_empty() {
            let plan = self.plan(&pass.candidates, &members).await?;
            no_target = plan.no_target.len() as u64;
            if !plan.unreadable.is_empty() {
                warn!(
                    stripes = plan.unreadable.len(),
                    first = %plan.unreadable[0],
                    "stripes with lost shards and fewer than k shards available: cannot rebuild them until nodes come back"
                );
            }
            if no_target > 0 {
                debug!(
                    stripes = no_target,
                    "lost shards no node can take now (too few nodes, full, or fenced)"
                );
            }
            self.queue = plan.tasks.into();
        } else {
            self.queue.clear();
        }
        self.shared.publish_summary(pass.summary, no_target);
        Ok(())
    }

    async fn plan(
        &self,
        candidates: &[(StripeRecord, Health)],
        members: &[shoal_mesh::MemberView],
    ) -> Result<Plan, AgentError> {
        let placement = self.stripes.placement_layout().await?;
        let room: Room = members
            .iter()
            .filter(|m| m.state == MemberState::Alive)
            .filter_map(|m| m.facts.as_ref().map(|f| (m.id.node, f.store_room_bytes)))
            .map(|(n, room)| (n, room.saturating_sub(crate::data::MIN_ROOM)))
            .collect();
        let mut fenced: HashMap<StripeId, Vec<NodeId>> = HashMap::new();
        for (r, _) in candidates {
            let nodes: Vec<NodeId> = self
                .group
                .store()
                .disowned(r.id)?
                .into_iter()
                .map(|(_, n)| n)
                .collect();
            if !nodes.is_empty() {
                fenced.insert(r.id, nodes);
            }
        }
        Ok(plan::plan(candidates, &placement, &room, &fenced))
    }

    /// Repairs the next stripes of the queue, as many at once as the budget allows: a
    /// new one starts as soon as one ends, for at most [`UNIT`] (then the ones under way
    /// finish), so a stop or a new scan never waits long.
    async fn repair_some(&mut self) -> Result<(), AgentError> {
        let started = Instant::now();
        let mut set = JoinSet::new();
        loop {
            let budget = self.resources.budget(WorkClass::Repair);
            let parallel = budget.concurrency.clamp(1, PARALLEL_MAX) as usize;
            while set.len() < parallel && started.elapsed() < UNIT {
                let Some(task) = self.queue.pop_front() else {
                    break;
                };
                self.wait_for_budget(&task).await;
                let (group, stripes) = (self.group.clone(), self.stripes.clone());
                set.spawn(async move { repair_one(&group, &stripes, task).await });
            }
            let Some(done) = set.join_next().await else {
                return Ok(());
            };
            match done {
                Ok(Ok(Some(bytes))) => self.repaired(bytes),
                Ok(Ok(None)) => {
                    self.shared.metrics.conflicts.inc();
                }
                Ok(Err(e)) => debug!(error = %e, "stripe not repaired this time"),
                Err(e) => debug!(error = %e, "a repair task failed"),
            }
        }
    }

    /// Waits until the governor lets this task's bytes move.
    async fn wait_for_budget(&self, task: &Task) {
        while let Err(wait) = self
            .resources
            .take(WorkClass::Repair, task.bytes, task.urgent)
        {
            tokio::time::sleep(wait.min(Duration::from_secs(1))).await;
        }
    }

    fn repaired(&mut self, bytes: u64) {
        let m = &self.shared.metrics;
        m.repaired_bytes.inc_by(bytes);
        m.repaired_stripes.inc();
        self.recent.push_back((Instant::now(), bytes));
        let mut v = lock(&self.shared.view);
        v.repaired_bytes += bytes;
        v.repaired_stripes += 1;
    }

    /// The rate over the last [`RATE_WINDOW`], published to metrics, status and gossip.
    async fn update_rate(&mut self) -> Result<(), AgentError> {
        let now = Instant::now();
        while self
            .recent
            .front()
            .is_some_and(|(at, _)| now.duration_since(*at) > RATE_WINDOW)
        {
            self.recent.pop_front();
        }
        let bytes: u64 = self.recent.iter().map(|(_, b)| b).sum();
        let span = self
            .recent
            .front()
            .map_or(RATE_WINDOW, |(at, _)| now.duration_since(*at))
            .max(Duration::from_secs(1));
        let rate = (bytes as f64 / span.as_secs_f64()) as u64;
        self.shared.metrics.bytes_per_sec.set(rate as i64);
        lock(&self.shared.view).bytes_per_sec = rate;
        let tell = match self.told_rate {
            None => rate > 0,
            Some((told, at)) => {
                (told == 0) != (rate == 0)
                    || (at.elapsed() >= Duration::from_secs(2) && told.abs_diff(rate) > told / 8)
            }
        };
        if tell {
            self.gossip
                .publish(move |f| f.repair_bytes_per_sec = rate)
                .await?;
            self.told_rate = Some((rate, now));
        }
        Ok(())
    }
}

/// Keeps the [`QUEUE_MAX`] most endangered candidates (fewest available shards first).
fn trim(candidates: &mut Vec<(StripeRecord, Health)>) {
    candidates.sort_by_key(|(r, h)| (h.available.len(), r.id));
    candidates.truncate(QUEUE_MAX);
}

/// Rebuilds one stripe and commits it. `Some(bytes rebuilt)` when committed, `None` when
/// the stripe changed since it was planned (the next pass plans it again).
async fn repair_one(
    group: &Group,
    stripes: &Arc<Stripes>,
    task: Task,
) -> Result<Option<u64>, AgentError> {
    let id = task.record.id;
    // Planned from a pass that may be seconds old: act on the record as it is now.
    match group.store().live_stripe(id)? {
        Some(now) if now.shards == task.record.shards => {}
        _ => return Ok(None),
    }
    let rebuilt = stripes
        .rebuild(&task.record, &task.rebuilds, &task.skip)
        .await?;
    for f in &rebuilt.failed {
        debug!(stripe = %id, fault = %f, "rebuilt shard not stored");
    }
    if rebuilt.moves.is_empty() {
        return Ok(None);
    }
    let n = rebuilt.moves.len() as u64;
    let outcome = group
        .propose_one(Proposal {
            id: None,
            now: Timestamp::now(),
            command: Command::RelocateShards {
                stripe: id,
                moves: rebuilt.moves,
            },
        })
        .await?;
    match outcome {
        Outcome::Done => {
            debug!(stripe = %id, shards = n, "stripe repaired");
            Ok(Some(n * task.record.shard_len))
        }
        Outcome::Conflict | Outcome::Failed(_) => Ok(None),
        other => Err(crate::consensus::ConsensusError::UnexpectedOutcome(Box::new(other)).into()),
    }
}

impl Worker for Repair {
    fn name(&self) -> &'static str {
        "repair"
    }

    async fn work(&mut self) -> Result<Step, AgentError> {
        self.update_rate().await?;
        if self.pass.is_some() || (self.queue.is_empty() && self.pass_due()?) {
            self.scan_page().await?;
            return Ok(if self.pass.is_some() || !self.queue.is_empty() {
                Step::Busy
            } else {
                Step::Idle
            });
        }
        if self.queue.is_empty() {
            return Ok(Step::Idle);
        }
        if !self.group.is_leader() {
            self.queue.clear();
            return Ok(Step::Idle);
        }
        let before = lock(&self.shared.view).repaired_stripes;
        self.repair_some().await?;
        if self.queue.is_empty() {
            let done = lock(&self.shared.view).repaired_stripes - before;
            if done > 0 {
                info!(stripes = done, "repair round done; scanning again");
            }
            // Scan again at once to see what is left.
            self.last_pass_end = None;
        }
        Ok(Step::Busy)
    }

    async fn wait_for_work(&mut self) {
        self.ticker.tick().await;
    }

    fn progress(&self) -> Option<String> {
        let v = lock(&self.shared.view);
        let s = v.summary.as_ref()?;
        let queued = self.queue.len();
        Some(if queued > 0 {
            format!(
                "{queued} stripes queued, {} repaired, {} bytes/s",
                v.repaired_stripes, v.bytes_per_sec
            )
        } else {
            format!(
                "{} stripes: {} healthy, {} degraded, {} unreadable",
                s.stripes,
                s.healthy,
                s.degraded(),
                s.unreadable
            )
        })
    }
}
