//! Background work of the agent, in one shape: a [`Worker`] does one unit of work at a
//! time and says whether more is waiting; [`Workers`] runs each on its own task with a
//! cancellation token, keeps its state for `shoal status`, and stops them all before the
//! subsystems they use shut down. A unit in progress when they stop is given
//! [`UNIT_DEADLINE`] to finish (a rebuilt shard gets its commit instead of being left
//! for the orphan sweep), the workers others need (the batcher) stopping last; waits
//! between units end at once.
//!
//! Status shows each as `name`, `state`, `progress`, `last_error`, `last_error_unix_ms` and
//! `waiting_for`. A worker's error is logged once, by the runner, and kept for status.
//! `shoal_worker_rounds_total{worker}` counts how often each finished its waiting work and
//! went idle (whole passes for the scanning workers); tests wait on it instead of sleeping.
//! [`Step::Throttled`] waits at most [`THROTTLE_WAIT_MAX`] (1 s) before asking again. A
//! crash ([`Workers::abort`], the simulator's kill -9) ends a unit where it is.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use shoal_agent_api::WorkerStatus;
use shoal_resource_guard::WorkClass;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// What a unit of work left behind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// More is waiting: do the next unit at once.
    Busy,
    /// Nothing to do until [`Worker::wait_for_work`] says so.
    Idle,
    /// The next unit needs bytes of `budget` that the governor does not give yet: ask
    /// again after `wait` (at most [`THROTTLE_WAIT_MAX`]). Status shows the worker
    /// throttled and on which budget, not busy.
    Throttled { budget: WorkClass, wait: Duration },
    /// Another node does this work now (it runs on the metadata leader only): wait
    /// for work as after [`Step::Idle`]; status shows the worker standing by.
    Standby,
    /// Finished for good; the worker ends.
    Done,
}

/// What the runner needs of a unit's failure: its message (logged once, kept for status)
/// and whether trying again may pass. Each crate's error enum is one.
pub trait WorkError: std::fmt::Display + Send + 'static {
    fn is_retryable(&self) -> bool;
}

/// One kind of background work.
pub trait Worker: Send + 'static {
    /// Its failures: the error enum of the module it belongs to.
    type Error: WorkError;
    /// Stable name, shown by `shoal status` (`workers[].name`).
    fn name(&self) -> &'static str;
    /// Does one unit of work. Dropped (cancelled) only at shutdown.
    fn work(&mut self) -> impl Future<Output = Result<Step, Self::Error>> + Send;
    /// Waits until there may be work again (a timer, a queue). Cancel-safe.
    fn wait_for_work(&mut self) -> impl Future<Output = ()> + Send;
    /// What the worker is at ("12 of 40 stripes"), when it has something to say.
    fn progress(&self) -> Option<String> {
        None
    }
}

/// Where a worker is, as `shoal status` shows it (`workers[].state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkerState {
    /// Waiting for work.
    Idle,
    /// In a unit of work.
    Busy,
    /// Waiting for the governor's budget before its next unit.
    Throttled,
    /// Waiting while another node does this work (the leader's).
    Standby,
    /// Its last unit failed; it tries again when there is work.
    Error,
    /// Finished for good.
    Done,
    /// Stopped with the agent.
    Stopped,
}

impl WorkerState {
    /// The name status and its JSON use.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkerState::Idle => "idle",
            WorkerState::Busy => "busy",
            WorkerState::Throttled => "throttled",
            WorkerState::Standby => "standby",
            WorkerState::Error => "error",
            WorkerState::Done => "done",
            WorkerState::Stopped => "stopped",
        }
    }
}

/// The state of one worker as status shows it.
#[derive(Clone, Debug)]
struct Shared {
    state: WorkerState,
    /// Throttled: on which budget.
    waiting_for: Option<WorkClass>,
    progress: Option<String>,
    last_error: Option<(String, SystemTime)>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One started worker: its name, its state, and its task until it is stopped.
struct Running {
    name: &'static str,
    shared: Arc<Mutex<Shared>>,
    /// Cancelled when this worker is to stop (a child of [`Workers`]' own token).
    cancel: CancellationToken,
    /// When it is stopped among the others.
    stage: Stage,
    task: Option<JoinHandle<()>>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WorkerLabel {
    worker: &'static str,
}

/// A worker told to stop: its name, its state, its task.
type Told = (&'static str, Arc<Mutex<Shared>>, JoinHandle<()>);

/// Every worker of this node: started through [`Workers::spawn`], stopped together.
#[derive(Default)]
pub struct Workers {
    /// Cancelled by [`Workers::abort`] (every worker's token is a child of it).
    stop: CancellationToken,
    running: Mutex<Vec<Running>>,
    /// Per worker, how often it finished what was waiting and went idle.
    rounds: Family<WorkerLabel, Counter>,
}

impl Drop for Workers {
    /// Workers left running end at once, in the middle of a unit too: they must not
    /// outlive what they work on (a stop that lets units finish is [`Workers::stop`]).
    fn drop(&mut self) {
        self.abort();
    }
}

/// Longest a throttled worker waits before it asks the governor again (the budget grows
/// back when the GPUs go idle).
pub const THROTTLE_WAIT_MAX: Duration = Duration::from_secs(1);

/// How long a unit of work in progress when the workers stop may go on.
pub const UNIT_DEADLINE: Duration = Duration::from_secs(4);
/// How long a worker may take to stop (its unit's deadline and a margin) before its task
/// is aborted.
const STOP_WAIT: Duration = Duration::from_secs(5);

impl Workers {
    /// Shows the workers' counters on `registry` (the agent's `/metrics`).
    pub fn register_metrics(&self, registry: &mut Registry) {
        registry.register(
            "shoal_worker_rounds",
            "Times each worker finished the work waiting for it and went idle (for the scanning workers, repair, scrub, the collectors and the tier mover: whole passes)",
            self.rounds.clone(),
        );
    }

    /// Starts `worker` on a task of its own.
    pub fn spawn<W: Worker>(&self, worker: W) {
        self.start(worker, Stage::Middle);
    }

    /// Starts `worker`, which serves requests from outside (the admin socket, the metrics
    /// endpoint): [`Workers::stop_front`] stops it on its own, before the node leaves
    /// the cluster, and [`Workers::stop`] before the others.
    pub fn spawn_front<W: Worker>(&self, worker: W) {
        self.start(worker, Stage::Front);
    }

    /// Starts `worker`, which the others' units may need to finish (the leader's
    /// batcher commits them): [`Workers::stop`] stops it after all the others.
    pub fn spawn_last<W: Worker>(&self, worker: W) {
        self.start(worker, Stage::Last);
    }

    fn start<W: Worker>(&self, worker: W, stage: Stage) {
        let name = worker.name();
        let shared = Arc::new(Mutex::new(Shared {
            state: WorkerState::Idle,
            waiting_for: None,
            progress: None,
            last_error: None,
        }));
        let cancel = self.stop.child_token();
        let rounds = self
            .rounds
            .get_or_create(&WorkerLabel { worker: name })
            .clone();
        let task = tokio::spawn(run(worker, cancel.clone(), shared.clone(), rounds));
        lock(&self.running).push(Running {
            name,
            shared,
            cancel,
            stage,
            task: Some(task),
        });
    }

    /// The state of the worker named `name` (the first started under it).
    pub fn state_of(&self, name: &str) -> Option<WorkerState> {
        let running = lock(&self.running);
        let r = running.iter().find(|r| r.name == name)?;
        Some(lock(&r.shared).state)
    }

    /// Each worker's state, in start order.
    pub fn status(&self) -> Vec<WorkerStatus> {
        lock(&self.running)
            .iter()
            .map(|r| {
                let s = lock(&r.shared).clone();
                WorkerStatus {
                    name: r.name.to_owned(),
                    state: s.state.as_str().to_owned(),
                    progress: s.progress,
                    last_error: s.last_error.as_ref().map(|(e, _)| e.clone()),
                    last_error_unix_ms: s.last_error.as_ref().map(|(_, at)| {
                        at.duration_since(SystemTime::UNIX_EPOCH)
                            .map_or(0, |d| d.as_millis() as u64)
                    }),
                    waiting_for: s.waiting_for.map(|b| b.name().to_owned()),
                }
            })
            .collect()
    }

    /// Ends every worker at once, a unit in progress too, as a crash would (the
    /// simulator's kill -9 and power cut).
    pub fn abort(&self) {
        self.stop.cancel();
        for r in lock(&self.running).iter_mut() {
            if let Some(task) = r.task.take() {
                task.abort();
            }
            let mut s = lock(&r.shared);
            if s.state != WorkerState::Done {
                s.state = WorkerState::Stopped;
            }
        }
    }

    /// Stops the workers started with [`Workers::spawn_front`] (see [`Workers::stop`]).
    pub async fn stop_front(&self) {
        self.stop_stage(Stage::Front).await;
    }

    /// Stops every worker: a unit in progress is given [`UNIT_DEADLINE`] to finish, a wait
    /// between units ends at once. First those started with [`Workers::spawn_front`], then
    /// all those started with [`Workers::spawn`], told together (so a stop takes one
    /// deadline, not one per worker), then those started with [`Workers::spawn_last`],
    /// whose work the others' last units may need. A task not ended [`STOP_WAIT`] after it
    /// was told is aborted.
    pub async fn stop(&self) {
        for stage in [Stage::Front, Stage::Middle, Stage::Last] {
            self.stop_stage(stage).await;
        }
    }

    async fn stop_stage(&self, stage: Stage) {
        let told: Vec<Told> = lock(&self.running)
            .iter_mut()
            .rev()
            .filter(|r| r.stage == stage)
            .filter_map(|r| {
                let task = r.task.take()?;
                r.cancel.cancel();
                Some((r.name, r.shared.clone(), task))
            })
            .collect();
        let deadline = tokio::time::Instant::now() + STOP_WAIT;
        for (name, shared, mut task) in told {
            if tokio::time::timeout_at(deadline, &mut task).await.is_err() {
                warn!(worker = name, "worker did not stop in time; aborted");
                task.abort();
                lock(&shared).state = WorkerState::Stopped;
            }
        }
    }
}

/// When a worker stops among the others.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// Serves requests from outside: stopped first.
    Front,
    Middle,
    /// What the others' last units may need (the batcher): stopped after them.
    Last,
}

/// Runs one worker until it is done or cancelled.
async fn run<W: Worker>(
    mut worker: W,
    cancel: CancellationToken,
    shared: Arc<Mutex<Shared>>,
    rounds: Counter,
) {
    let name = worker.name();
    loop {
        // Told to stop between units: no new one starts.
        if cancel.is_cancelled() {
            break;
        }
        {
            let mut s = lock(&shared);
            s.state = WorkerState::Busy;
            s.waiting_for = None;
            s.progress = worker.progress();
        }
        let step = {
            let unit = worker.work();
            tokio::pin!(unit);
            tokio::select! {
                step = &mut unit => step,
                _ = cancel.cancelled() => {
                    // The unit in progress finishes (its effects committed, not half
                    // done), within a deadline.
                    match tokio::time::timeout(UNIT_DEADLINE, &mut unit).await {
                        // What it needed may be stopping too (membership has left).
                        Ok(Err(e)) => info!(worker = name, error = %e, "last unit of work failed while stopping"),
                        Ok(Ok(_)) => {}
                        Err(_) => warn!(worker = name, "unit of work not finished within the stop deadline; dropped"),
                    }
                    break;
                }
            }
        };
        let wait = match step {
            Ok(Step::Busy) => false,
            Ok(Step::Throttled { budget, wait }) => {
                {
                    let mut s = lock(&shared);
                    s.state = WorkerState::Throttled;
                    s.waiting_for = Some(budget);
                    s.progress = worker.progress();
                }
                tokio::select! {
                    biased;
                    _ = cancel.cancelled() => break,
                    _ = tokio::time::sleep(wait.min(THROTTLE_WAIT_MAX)) => {}
                }
                false
            }
            Ok(Step::Idle) => {
                rounds.inc();
                true
            }
            Ok(Step::Standby) => {
                // Counted like an idle round: a test waiting on a leader's worker that
                // lost the lead meanwhile still sees its rounds go by.
                rounds.inc();
                lock(&shared).state = WorkerState::Standby;
                true
            }
            Ok(Step::Done) => {
                lock(&shared).state = WorkerState::Done;
                info!(worker = name, "worker done");
                return;
            }
            Err(e) => {
                // Handled here: the worker tries again when there is work.
                warn!(worker = name, error = %e, retryable = e.is_retryable(), "background work failed");
                let mut s = lock(&shared);
                s.state = WorkerState::Error;
                s.last_error = Some((e.to_string(), SystemTime::now()));
                drop(s);
                true
            }
        };
        if wait {
            {
                let mut s = lock(&shared);
                if s.state == WorkerState::Busy {
                    s.state = WorkerState::Idle;
                }
                s.progress = worker.progress();
            }
            tokio::select! {
                biased;
                _ = cancel.cancelled() => break,
                _ = worker.wait_for_work() => {}
            }
        }
    }
    lock(&shared).state = WorkerState::Stopped;
}

/// A worker's pace: waits out `period` between units (the first unit at once), and never
/// runs two in a row faster than that.
pub struct Ticker(tokio::time::Interval);

impl Ticker {
    pub fn every(period: Duration) -> Ticker {
        let mut i = tokio::time::interval(period);
        i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Ticker(i)
    }

    pub async fn tick(&mut self) {
        self.0.tick().await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    /// A unit's failure in these tests.
    #[derive(Debug, thiserror::Error)]
    #[error("{0}")]
    struct Failed(&'static str);

    impl WorkError for Failed {
        fn is_retryable(&self) -> bool {
            false
        }
    }

    /// Counts units; fails the second; is done after five.
    struct Counter {
        units: Arc<AtomicU32>,
        ticker: Ticker,
    }

    impl Worker for Counter {
        fn name(&self) -> &'static str {
            "counter"
        }
        type Error = Failed;
        async fn work(&mut self) -> Result<Step, Failed> {
            let n = self.units.fetch_add(1, Ordering::SeqCst) + 1;
            match n {
                2 => Err(Failed("unit 2: failed")),
                5 => Ok(Step::Done),
                _ => Ok(Step::Idle),
            }
        }
        async fn wait_for_work(&mut self) {
            self.ticker.tick().await;
        }
        fn progress(&self) -> Option<String> {
            Some(format!("{} units", self.units.load(Ordering::SeqCst)))
        }
    }

    /// Never finishes a unit on its own.
    struct Stuck;

    impl Worker for Stuck {
        fn name(&self) -> &'static str {
            "stuck"
        }
        type Error = Failed;
        async fn work(&mut self) -> Result<Step, Failed> {
            std::future::pending().await
        }
        async fn wait_for_work(&mut self) {}
    }

    /// Stuck in its unit; says when its task let go of it.
    struct StuckUntilDropped(Option<tokio::sync::oneshot::Sender<()>>);

    impl Drop for StuckUntilDropped {
        fn drop(&mut self) {
            if let Some(tx) = self.0.take() {
                let _ = tx.send(());
            }
        }
    }

    impl Worker for StuckUntilDropped {
        fn name(&self) -> &'static str {
            "stuck"
        }
        type Error = Failed;
        async fn work(&mut self) -> Result<Step, Failed> {
            std::future::pending().await
        }
        async fn wait_for_work(&mut self) {}
    }

    #[tokio::test]
    async fn a_worker_runs_to_done_and_keeps_its_last_error() {
        let workers = Workers::default();
        let units = Arc::new(AtomicU32::new(0));
        workers.spawn(Counter {
            units: units.clone(),
            ticker: Ticker::every(Duration::from_millis(5)),
        });
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while workers.status()[0].state != "done" {
            assert!(
                std::time::Instant::now() < deadline,
                "{:?}",
                workers.status()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let s = &workers.status()[0];
        assert_eq!(s.name, "counter");
        assert_eq!(s.last_error.as_deref(), Some("unit 2: failed"));
        assert!(s.last_error_unix_ms.is_some());
        assert_eq!(units.load(Ordering::SeqCst), 5);
        workers.stop().await;
    }

    /// Throttled on the repair budget until `open` is set, then busy with units.
    struct Throttled {
        open: Arc<std::sync::atomic::AtomicBool>,
        units: Arc<AtomicU32>,
    }

    impl Worker for Throttled {
        fn name(&self) -> &'static str {
            "throttled"
        }
        type Error = Failed;
        async fn work(&mut self) -> Result<Step, Failed> {
            if !self.open.load(Ordering::SeqCst) {
                return Ok(Step::Throttled {
                    budget: WorkClass::Repair,
                    wait: Duration::from_millis(5),
                });
            }
            self.units.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(1)).await;
            Ok(Step::Busy)
        }
        async fn wait_for_work(&mut self) {}
    }

    async fn until(workers: &Workers, what: &str, f: impl Fn(&WorkerStatus) -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !f(&workers.status()[0]) {
            assert!(
                std::time::Instant::now() < deadline,
                "{what}: {:?}",
                workers.status()
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    #[tokio::test]
    async fn a_worker_waiting_for_its_budget_shows_throttled_on_it_then_works_on() {
        let workers = Workers::default();
        let open = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let units = Arc::new(AtomicU32::new(0));
        workers.spawn(Throttled {
            open: open.clone(),
            units: units.clone(),
        });
        until(&workers, "throttled on repair", |s| {
            s.state == "throttled" && s.waiting_for.as_deref() == Some("repair")
        })
        .await;
        assert_eq!(units.load(Ordering::SeqCst), 0, "no unit ran meanwhile");
        open.store(true, Ordering::SeqCst);
        until(&workers, "working again", |s| {
            s.state == "busy" && s.waiting_for.is_none()
        })
        .await;
        assert!(units.load(Ordering::SeqCst) > 0);
        // A stop while throttled does not wait for the budget.
        open.store(false, Ordering::SeqCst);
        until(&workers, "throttled again", |s| s.state == "throttled").await;
        let started = std::time::Instant::now();
        workers.stop().await;
        assert!(started.elapsed() < Duration::from_secs(1));
        assert_eq!(workers.status()[0].state, "stopped");
    }

    /// Its unit takes a second; says when one finished.
    struct Slow(Arc<AtomicU32>);

    impl Worker for Slow {
        fn name(&self) -> &'static str {
            "slow"
        }
        type Error = Failed;
        async fn work(&mut self) -> Result<Step, Failed> {
            tokio::time::sleep(Duration::from_secs(1)).await;
            self.0.fetch_add(1, Ordering::SeqCst);
            Ok(Step::Busy)
        }
        async fn wait_for_work(&mut self) {}
    }

    #[tokio::test(start_paused = true)]
    async fn stop_lets_the_unit_in_progress_finish_and_starts_no_other() {
        let workers = Workers::default();
        let finished = Arc::new(AtomicU32::new(0));
        workers.spawn(Slow(finished.clone()));
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(
            finished.load(Ordering::SeqCst),
            1,
            "one unit done, one begun"
        );
        assert_eq!(workers.status()[0].state, "busy");
        let asked = tokio::time::Instant::now();
        workers.stop().await;
        assert_eq!(
            finished.load(Ordering::SeqCst),
            2,
            "the unit in progress finished"
        );
        assert!(
            asked.elapsed() <= Duration::from_millis(600),
            "and no other began"
        );
        assert_eq!(workers.status()[0].state, "stopped");
    }

    #[tokio::test(start_paused = true)]
    async fn stop_drops_a_unit_that_outlasts_its_deadline() {
        let workers = Workers::default();
        workers.spawn(Stuck);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(workers.status()[0].state, "busy");
        let asked = tokio::time::Instant::now();
        workers.stop().await;
        let took = asked.elapsed();
        assert!(
            took >= UNIT_DEADLINE && took < STOP_WAIT,
            "dropped at the deadline: {took:?}"
        );
        assert_eq!(workers.status()[0].state, "stopped");
    }

    #[tokio::test(start_paused = true)]
    async fn the_workers_stop_together_and_a_last_one_after_them() {
        let workers = Workers::default();
        let committed = Arc::new(AtomicU32::new(0));
        // Like the batcher: what the others' last units may need.
        workers.spawn_last(Slow(committed.clone()));
        workers.spawn(Stuck);
        workers.spawn(Stuck);
        tokio::time::sleep(Duration::from_millis(20)).await;
        let asked = tokio::time::Instant::now();
        workers.stop().await;
        let took = asked.elapsed();
        assert!(
            took >= UNIT_DEADLINE && took < UNIT_DEADLINE + Duration::from_secs(2),
            "one deadline for both stuck workers, then the last one's unit: {took:?}"
        );
        assert!(
            committed.load(Ordering::SeqCst) >= 4,
            "the last worker went on while the others' units had their deadline"
        );
        assert!(workers.status().iter().all(|s| s.state == "stopped"));
    }

    #[tokio::test(start_paused = true)]
    async fn front_workers_stop_on_their_own_and_first() {
        let workers = Workers::default();
        let (front, middle) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
        workers.spawn(Slow(middle.clone()));
        workers.spawn_front(Slow(front.clone()));
        tokio::time::sleep(Duration::from_millis(1500)).await;
        workers.stop_front().await;
        let states = || {
            workers
                .status()
                .into_iter()
                .map(|s| s.state)
                .collect::<Vec<_>>()
        };
        assert_eq!(states(), ["busy", "stopped"], "only the front one stopped");
        let (front_done, middle_done) =
            (front.load(Ordering::SeqCst), middle.load(Ordering::SeqCst));
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(
            front.load(Ordering::SeqCst),
            front_done,
            "it starts no unit"
        );
        assert!(
            middle.load(Ordering::SeqCst) >= middle_done + 2,
            "the other works on"
        );
        workers.stop().await;
        assert_eq!(states(), ["stopped", "stopped"]);
    }

    #[tokio::test]
    async fn abort_ends_a_unit_at_once() {
        let workers = Workers::default();
        let (tx, rx) = tokio::sync::oneshot::channel();
        workers.spawn(StuckUntilDropped(Some(tx)));
        tokio::time::sleep(Duration::from_millis(20)).await;
        workers.abort();
        tokio::time::timeout(Duration::from_secs(2), rx)
            .await
            .expect("the unit was let go at once")
            .expect("sent");
        assert_eq!(workers.status()[0].state, "stopped");
    }

    #[tokio::test]
    async fn dropping_the_workers_stops_them_too() {
        let workers = Workers::default();
        let (tx, rx) = tokio::sync::oneshot::channel();
        workers.spawn(StuckUntilDropped(Some(tx)));
        drop(workers);
        tokio::time::timeout(Duration::from_secs(2), rx)
            .await
            .expect("the worker's task ended")
            .expect("the worker was dropped");
    }
}
