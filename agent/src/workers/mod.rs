//! Background work of the agent, in one shape: a [`Worker`] does one unit of work at a
//! time and says whether more is waiting; [`Workers`] runs each on its own task with a
//! cancellation token, keeps its state for `shoal status`, and stops them all, newest
//! first, before the subsystems they use shut down.
//!
//! The workers: `batcher` (the leader's proposal batcher), `facts` (this node's gossiped
//! facts), `gpu` (GPU readings for the governor), `metrics` (gauges), `steward` (the metadata group's membership and the cluster
//! layout), `stripe-gc` (shards of unreferenced stripes), `orphan-purge` (unlinked inodes
//! no mount holds), `orphan-shards` (shards no stripe record names). What to do is decided
//! by pure code beside each (`steward` uses `consensus::voters`, `gc` its
//! `holders_to_ask`); the worker only carries it out.

pub mod facts;
pub mod gc;
pub mod gpu;
pub mod metrics;
pub mod repair;
pub mod scrub;
pub mod steward;

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use shoal_agent_api::WorkerStatus;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::AgentError;

/// What a unit of work left behind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// More is waiting: do the next unit at once.
    Busy,
    /// Nothing to do until [`Worker::wait_for_work`] says so.
    Idle,
    /// Finished for good; the worker ends.
    Done,
}

/// One kind of background work.
pub trait Worker: Send + 'static {
    /// Stable name, shown by `shoal status` (`workers[].name`).
    fn name(&self) -> &'static str;
    /// Does one unit of work. Dropped (cancelled) only at shutdown.
    fn work(&mut self) -> impl Future<Output = Result<Step, AgentError>> + Send;
    /// Waits until there may be work again (a timer, a queue). Cancel-safe.
    fn wait_for_work(&mut self) -> impl Future<Output = ()> + Send;
    /// What the worker is at ("12 of 40 stripes"), when it has something to say.
    fn progress(&self) -> Option<String> {
        None
    }
}

/// The state of one worker as status shows it.
#[derive(Clone, Debug)]
struct Shared {
    state: &'static str,
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
    task: Option<JoinHandle<()>>,
}

/// Every worker of this node: started through [`Workers::spawn`], stopped together.
#[derive(Default)]
pub struct Workers {
    /// Cancelled by [`Workers::stop`], or when the `Workers` is dropped.
    stop: CancellationToken,
    running: Mutex<Vec<Running>>,
}

impl Drop for Workers {
    /// Workers left running stop as well: they must not outlive what they work on.
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// How long a worker may take to notice it should stop before it is aborted.
const STOP_WAIT: Duration = Duration::from_secs(5);

impl Workers {
    /// Starts `worker` on a task of its own.
    pub fn spawn<W: Worker>(&self, worker: W) {
        let name = worker.name();
        let shared = Arc::new(Mutex::new(Shared {
            state: "idle",
            progress: None,
            last_error: None,
        }));
        let task = tokio::spawn(run(worker, self.stop.clone(), shared.clone()));
        lock(&self.running).push(Running {
            name,
            shared,
            task: Some(task),
        });
    }

    /// Each worker's state, in start order.
    pub fn status(&self) -> Vec<WorkerStatus> {
        lock(&self.running)
            .iter()
            .map(|r| {
                let s = lock(&r.shared).clone();
                WorkerStatus {
                    name: r.name.to_owned(),
                    state: s.state.to_owned(),
                    progress: s.progress,
                    last_error: s.last_error.as_ref().map(|(e, _)| e.clone()),
                    last_error_unix_ms: s.last_error.as_ref().map(|(_, at)| {
                        at.duration_since(SystemTime::UNIX_EPOCH)
                            .map_or(0, |d| d.as_millis() as u64)
                    }),
                }
            })
            .collect()
    }

    /// Stops every worker, the last started first, each given [`STOP_WAIT`] to finish its
    /// unit of work before it is aborted.
    pub async fn stop(&self) {
        self.stop.cancel();
        let tasks: Vec<(&'static str, JoinHandle<()>)> = lock(&self.running)
            .iter_mut()
            .rev()
            .filter_map(|r| r.task.take().map(|t| (r.name, t)))
            .collect();
        for (name, mut task) in tasks {
            if tokio::time::timeout(STOP_WAIT, &mut task).await.is_err() {
                warn!(worker = name, "worker did not stop in time; aborted");
                task.abort();
            }
        }
    }
}

/// Runs one worker until it is done or cancelled.
async fn run<W: Worker>(mut worker: W, cancel: CancellationToken, shared: Arc<Mutex<Shared>>) {
    let name = worker.name();
    loop {
        {
            let mut s = lock(&shared);
            s.state = "busy";
            s.progress = worker.progress();
        }
        let step = tokio::select! {
            biased;
            _ = cancel.cancelled() => break,
            step = worker.work() => step,
        };
        let wait = match step {
            Ok(Step::Busy) => false,
            Ok(Step::Idle) => true,
            Ok(Step::Done) => {
                lock(&shared).state = "done";
                info!(worker = name, "worker done");
                return;
            }
            Err(e) => {
                // Handled here: the worker tries again when there is work.
                warn!(worker = name, error = %e, retryable = e.is_retryable(), "background work failed");
                let mut s = lock(&shared);
                s.state = "error";
                s.last_error = Some((e.to_string(), SystemTime::now()));
                drop(s);
                true
            }
        };
        if wait {
            {
                let mut s = lock(&shared);
                if s.state == "busy" {
                    s.state = "idle";
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
    lock(&shared).state = "stopped";
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

    /// Counts units; fails the second; is done after five.
    struct Counter {
        units: Arc<AtomicU32>,
        ticker: Ticker,
    }

    impl Worker for Counter {
        fn name(&self) -> &'static str {
            "counter"
        }
        async fn work(&mut self) -> Result<Step, AgentError> {
            let n = self.units.fetch_add(1, Ordering::SeqCst) + 1;
            match n {
                2 => Err(AgentError::Setup {
                    what: "unit 2",
                    source: std::io::Error::other("failed"),
                }),
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
        async fn work(&mut self) -> Result<Step, AgentError> {
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
        async fn work(&mut self) -> Result<Step, AgentError> {
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
        assert_eq!(
            s.last_error.as_deref(),
            Some("cannot set up unit 2: failed")
        );
        assert!(s.last_error_unix_ms.is_some());
        assert_eq!(units.load(Ordering::SeqCst), 5);
        workers.stop().await;
    }

    #[tokio::test]
    async fn stop_cancels_a_worker_in_the_middle_of_its_unit() {
        let workers = Workers::default();
        workers.spawn(Stuck);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(workers.status()[0].state, "busy");
        tokio::time::timeout(Duration::from_secs(2), workers.stop())
            .await
            .expect("stopped at once");
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
