//! The simulator's runtime: one thread, virtual time, every source of chance drawn from
//! the seed. tokio's clock is paused (it jumps to the next timer whenever every task
//! waits), its `select!` draws from the seeded runtime generator, the agent's blocking
//! work runs inline and its random numbers come from the seed (`sim_thread`), and the
//! wall clock timestamps are read from starts at [`WALL_START`] and follows virtual time.

use std::cell::Cell;
use std::future::Future;
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
            future.await
        }),
        // Building a current-thread runtime with no I/O driver allocates and nothing else.
        Err(e) => panic!("the simulator's runtime: {e}"),
    }
}

#[cfg(not(tokio_unstable))]
compile_error!(
    "the simulator needs `--cfg tokio_unstable` (set in .cargo/config.toml) to seed tokio's random source"
);
