//! The simulator's runtime: one thread, virtual time, every source of chance drawn from
//! the seed. tokio's clock is paused (it jumps to the next timer whenever every task
//! waits), its `select!` draws from the seeded runtime generator, the agent's blocking
//! work runs inline and its random numbers come from the seed (`sim_thread`).

use std::future::Future;

/// Runs `future` to its end on a fresh seeded runtime.
pub fn block_on<F: Future>(seed: u64, future: F) -> F::Output {
    let _seeded = shoal_agent::sim_thread::seed_this_thread(seed ^ 0x005e_ed0f_5aa1);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .rng_seed(tokio::runtime::RngSeed::from_bytes(&seed.to_le_bytes()))
        .build();
    match runtime {
        Ok(rt) => rt.block_on(future),
        // Building a current-thread runtime with no I/O driver allocates and nothing else.
        Err(e) => panic!("the simulator's runtime: {e}"),
    }
}

#[cfg(not(tokio_unstable))]
compile_error!(
    "the simulator needs `--cfg tokio_unstable` (set in .cargo/config.toml) to seed tokio's random source"
);
