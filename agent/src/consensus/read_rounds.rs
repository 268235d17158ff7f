//! [`ReadRounds`]: how concurrent read barriers share read-index rounds.
//!
//! A round that started after a caller arrived covers that caller: its read index is at
//! least the leader's commit index at the caller's arrival. "After" is an order of events
//! (one counter draws both arrivals and starts), not of clock readings: two readings can
//! be equal, and a round that began at the same instant, before the caller, covers
//! nothing. So a caller joins a round in
//! flight that started after it arrived; otherwise it starts one at once, while fewer than
//! [`MAX_IN_FLIGHT`] are in flight, or waits for the oldest to end and looks again.
//!
//! With one round at a time, a caller that arrived during a round waited for the end of
//! that round (which cannot cover it) and then for its own: a round trip and a half on
//! average. Starting its round at once makes it one; a second round in flight costs one
//! more read-index request at most, and the callers that arrive while both are in flight
//! still share the next.

use std::future::Future;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::watch;

/// Read-index rounds in flight at most, on one agent.
pub const MAX_IN_FLIGHT: usize = 2;

/// The rounds in flight.
#[derive(Debug, Default)]
pub struct ReadRounds {
    in_flight: Mutex<Vec<Round>>,
    /// Draws arrivals and round starts, in the order they happen.
    events: AtomicU64,
}

#[derive(Debug)]
struct Round {
    /// Drawn when it started: greater than every arrival before it.
    id: u64,
    /// `Some(succeeded)` once it ended; closed without a value if its caller gave up.
    ended: watch::Receiver<Option<bool>>,
}

enum Next {
    Start(u64, watch::Sender<Option<bool>>),
    Join(watch::Receiver<Option<bool>>),
    AfterEnd(watch::Receiver<Option<bool>>),
}

/// Takes the round `id` out of the list when its caller is done with it (or dropped it).
struct Running<'a> {
    rounds: &'a ReadRounds,
    id: u64,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.rounds.lock().retain(|r| r.id != self.id);
    }
}

impl ReadRounds {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Round>> {
        self.in_flight.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Returns once a round that started after this call has succeeded. `round` runs one
    /// (when this caller starts it); `failed` is this caller's error when a round it joined
    /// failed.
    pub async fn covered<F, Fut, E>(&self, round: F, failed: impl Fn() -> E) -> Result<(), E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<(), E>>,
    {
        let arrived = self.event();
        let (id, ended) = loop {
            match self.next(arrived) {
                Next::Start(id, ended) => break (id, ended),
                Next::Join(mut ended) => match ended.wait_for(Option::is_some).await {
                    Ok(r) if *r == Some(true) => return Ok(()),
                    Ok(_) => return Err(failed()),
                    // Its caller gave up on it: look again.
                    Err(_) => continue,
                },
                Next::AfterEnd(mut ended) => {
                    let _ = ended.wait_for(Option::is_some).await;
                }
            }
        };
        let _running = Running { rounds: self, id };
        let result = round().await;
        let _ = ended.send(Some(result.is_ok()));
        result
    }

    fn event(&self) -> u64 {
        self.events.fetch_add(1, Ordering::SeqCst)
    }

    fn next(&self, arrived: u64) -> Next {
        let mut rounds = self.lock();
        if let Some(r) = rounds.iter().find(|r| r.id > arrived) {
            return Next::Join(r.ended.clone());
        }
        if rounds.len() >= MAX_IN_FLIGHT
            && let Some(oldest) = rounds.iter().min_by_key(|r| r.id)
        {
            return Next::AfterEnd(oldest.ended.clone());
        }
        let id = self.event();
        let (tx, rx) = watch::channel(None);
        rounds.push(Round { id, ended: rx });
        Next::Start(id, tx)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    use tokio::sync::Semaphore;

    use super::*;

    /// Rounds that end when the test adds a permit (failing while `fail` is set), counting
    /// how many started.
    #[derive(Clone)]
    struct Gate {
        started: Arc<AtomicUsize>,
        release: Arc<Semaphore>,
        fail: Arc<AtomicBool>,
    }

    type Caller = tokio::task::JoinHandle<Result<(), &'static str>>;

    impl Gate {
        fn new() -> Self {
            Gate {
                started: Arc::new(AtomicUsize::new(0)),
                release: Arc::new(Semaphore::new(0)),
                fail: Arc::new(AtomicBool::new(false)),
            }
        }

        fn caller(&self, rounds: &Arc<ReadRounds>) -> Caller {
            let (rounds, gate) = (rounds.clone(), self.clone());
            tokio::spawn(async move {
                let round = || async {
                    gate.started.fetch_add(1, Ordering::SeqCst);
                    gate.release.acquire().await.map(|p| p.forget()).ok();
                    match gate.fail.load(Ordering::SeqCst) {
                        true => Err("round failed"),
                        false => Ok(()),
                    }
                };
                rounds.covered(round, || "joined a failed round").await
            })
        }

        fn started(&self) -> usize {
            self.started.load(Ordering::SeqCst)
        }
    }

    async fn settle() {
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_caller_starts_its_round_at_once_and_later_callers_share_the_next() {
        let rounds = Arc::new(ReadRounds::default());
        let gate = Gate::new();
        let first = gate.caller(&rounds);
        settle().await;
        assert_eq!(gate.started(), 1);
        // Arrived during round 1, which cannot cover it: round 2 starts now, not after 1.
        let second = gate.caller(&rounds);
        settle().await;
        assert_eq!(gate.started(), 2, "a second round starts without waiting");
        // Two in flight: these wait for one to end and then share one round.
        let waiting: Vec<_> = (0..3).map(|_| gate.caller(&rounds)).collect();
        settle().await;
        assert_eq!(gate.started(), 2, "no third round while two are in flight");
        gate.release.add_permits(1);
        settle().await;
        assert_eq!(gate.started(), 3, "the three waiters share one round");
        assert_eq!(
            [first.is_finished(), second.is_finished()],
            [true, false],
            "a round ends only its own callers"
        );
        gate.release.add_permits(2);
        assert_eq!(done(first).await, Ok(()));
        assert_eq!(done(second).await, Ok(()));
        for w in waiting {
            assert_eq!(done(w).await, Ok(()));
        }
        assert_eq!(gate.started(), 3);
        assert!(rounds.lock().is_empty(), "ended rounds leave the list");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn callers_that_joined_a_failed_round_fail_with_it() {
        let rounds = Arc::new(ReadRounds::default());
        let gate = Gate::new();
        let busy = [gate.caller(&rounds), gate.caller(&rounds)];
        settle().await;
        let joined = [gate.caller(&rounds), gate.caller(&rounds)];
        settle().await;
        gate.release.add_permits(1);
        settle().await;
        assert_eq!(gate.started(), 3, "the two waiters share one round");
        gate.fail.store(true, Ordering::SeqCst);
        gate.release.add_permits(2);
        for b in busy {
            let _ = done(b).await;
        }
        let results: Vec<_> = futures_results(joined).await;
        assert!(
            results.iter().all(|r| r.is_err()),
            "both fail, the one that ran the round and the one that joined it: {results:?}"
        );
        assert!(
            results.contains(&Err("joined a failed round")),
            "{results:?}"
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_round_its_caller_gave_up_on_leaves_no_one_waiting() {
        let rounds = Arc::new(ReadRounds::default());
        let gate = Gate::new();
        let abandoned = gate.caller(&rounds);
        let other = gate.caller(&rounds);
        settle().await;
        let waiter = gate.caller(&rounds);
        settle().await;
        assert_eq!(gate.started(), 2);
        // The caller's request was dropped: its round goes with it, and the one waiting
        // for the oldest round to end starts its own.
        abandoned.abort();
        settle().await;
        assert_eq!(gate.started(), 3);
        gate.release.add_permits(2);
        assert_eq!(done(other).await, Ok(()));
        assert_eq!(done(waiter).await, Ok(()));
        assert!(rounds.lock().is_empty());
    }

    async fn done(caller: Caller) -> Result<(), &'static str> {
        caller.await.expect("the caller's task ends")
    }

    async fn futures_results(callers: [Caller; 2]) -> Vec<Result<(), &'static str>> {
        let mut out = Vec::new();
        for c in callers {
            out.push(done(c).await);
        }
        out
    }
}
