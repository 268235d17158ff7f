//! What the simulator (`tests/sim`) replaces on its one thread besides the disk and the
//! network: the blocking pool and the random source. On a thread it seeded with
//! [`seed_this_thread`], [`blocking`] runs its work inline (a blocking-pool thread would
//! finish at a moment no seed decides) and [`random_u64`] draws from the seed. On every
//! other thread they are tokio's blocking pool and the OS's randomness.

use std::cell::RefCell;

use shoal_disk::SplitMix64;

thread_local! {
    static SEEDED: RefCell<Option<SplitMix64>> = const { RefCell::new(None) };
}

/// This thread is the simulator's until the guard drops.
#[must_use = "the thread is seeded only while the guard lives"]
pub struct SeededThread(());

impl Drop for SeededThread {
    fn drop(&mut self) {
        SEEDED.with(|s| *s.borrow_mut() = None);
    }
}

/// Makes this thread the simulator's, drawing from `seed`.
pub fn seed_this_thread(seed: u64) -> SeededThread {
    SEEDED.with(|s| *s.borrow_mut() = Some(SplitMix64(seed)));
    SeededThread(())
}

fn seeded() -> bool {
    SEEDED.with(|s| s.borrow().is_some())
}

/// A random number: from the seed on the simulator's thread.
pub fn random_u64() -> u64 {
    SEEDED
        .with(|s| s.borrow_mut().as_mut().map(SplitMix64::next_u64))
        .unwrap_or_else(rand::random)
}

/// A random 128-bit number (a new stripe's id): from the seed on the simulator's thread.
pub fn random_u128() -> u128 {
    (u128::from(random_u64()) << 64) | u128::from(random_u64())
}

/// Runs `work`, which blocks, off the async task: on tokio's blocking pool, or inline on
/// the simulator's thread.
pub async fn blocking<T, F>(work: F) -> Result<T, tokio::task::JoinError>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    if seeded() {
        return Ok(work());
    }
    tokio::task::spawn_blocking(work).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seeded_thread_draws_the_same_numbers_again_and_the_os_after() {
        let draw = || {
            let _seeded = seed_this_thread(7);
            (random_u64(), random_u64())
        };
        assert_eq!(draw(), draw());
        assert!(!seeded(), "the guard unseeds the thread");
    }
}
