//! The simulator's runtime: one thread, virtual time, every source of chance drawn from
//! the seed. tokio's clock is paused (it jumps to the next timer whenever every task
//! waits), its `select!` draws from the seeded runtime generator, the agent's blocking
//! work runs inline and its random numbers come from the seed (`sim_thread`), and the
//! wall clock timestamps are read from starts at [`WALL_START`] and follows virtual time.

use std::cell::Cell;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// The wall-clock time a run starts at (since the Unix epoch): 2026-01-01.
pub const WALL_START: Duration = Duration::from_secs(1_767_225_600);

thread_local! {
    /// The virtual instant the run started at.
    static STARTED: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// The simulated wall clock: [`WALL_START`] plus the virtual time since the run began.
fn wall() -> Duration {
    let since = STARTED
        .with(Cell::get)
        .map_or(Duration::ZERO, |s| s.elapsed());
    WALL_START + since
}

/// Real time a run may spend without its virtual clock moving a second: then some task
/// is waiting no time over and over (seed 1054 of `rebalance` found one), and the run
/// would never end.
const STUCK_AFTER: Duration = Duration::from_secs(120);

/// Watches a run from another thread: exits the process, naming the seed, when the run's
/// virtual clock stands still for [`STUCK_AFTER`] of real time. Stops when dropped.
struct Watchdog {
    done: Arc<AtomicBool>,
}

impl Watchdog {
    fn start(seed: u64, virtual_secs: Arc<AtomicU64>) -> Watchdog {
        let done = Arc::new(AtomicBool::new(false));
        let stop = done.clone();
        std::thread::spawn(move || {
            let mut last = (
                virtual_secs.load(Ordering::Relaxed),
                std::time::Instant::now(),
            );
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(200));
                let now = virtual_secs.load(Ordering::Relaxed);
                if now != last.0 {
                    last = (now, std::time::Instant::now());
                } else if last.1.elapsed() >= STUCK_AFTER {
                    eprintln!(
                        "seed {seed}: the virtual clock stood still at {now} s for {STUCK_AFTER:?} of real time: a task waits no time over and over; replay it with --seed {seed} and look at the stacks (gdb -p)"
                    );
                    std::process::exit(3);
                }
            }
        });
        Watchdog { done }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
    }
}

/// Runs `future` to its end on a fresh seeded runtime.
pub fn block_on<F: Future>(seed: u64, future: F) -> F::Output {
    let _seeded = shoal_agent::sim_thread::seed_this_thread(seed ^ 0x005e_ed0f_5aa1);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .rng_seed(tokio::runtime::RngSeed::from_bytes(&seed.to_le_bytes()))
        .build();
    match runtime {
        Ok(rt) => rt.block_on(async {
            STARTED.with(|s| s.set(Some(Instant::now())));
            let _wall = shoal_agent_api::wall_clock::set_for_this_thread(wall);
            let virtual_secs = Arc::new(AtomicU64::new(0));
            let _watchdog = Watchdog::start(seed, virtual_secs.clone());
            let beat = tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    virtual_secs.fetch_add(1, Ordering::Relaxed);
                }
            });
            let out = future.await;
            beat.abort();
            out
        }),
        // Building a current-thread runtime with no I/O driver allocates and nothing else.
        Err(e) => panic!("the simulator's runtime: {e}"),
    }
}

#[cfg(not(tokio_unstable))]
compile_error!(
    "the simulator needs `--cfg tokio_unstable` (set in .cargo/config.toml) to seed tokio's random source"
);
