//! The wall clock timestamps are read from: the system's, or, on a thread the simulator
//! (`tests/sim`) set one on, its virtual clock, so a seed replays to the same mtimes and
//! the same replica digests.

use std::cell::Cell;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

thread_local! {
    static CLOCK: Cell<Option<fn() -> Duration>> = const { Cell::new(None) };
}

/// Timestamps read on this thread come from `clock` (time since the Unix epoch) until
/// the guard drops.
#[must_use = "the clock is set only while the guard lives"]
pub fn set_for_this_thread(clock: fn() -> Duration) -> ClockGuard {
    CLOCK.with(|c| c.set(Some(clock)));
    ClockGuard(())
}

pub struct ClockGuard(());

impl Drop for ClockGuard {
    fn drop(&mut self) {
        CLOCK.with(|c| c.set(None));
    }
}

/// Time since the Unix epoch, by this thread's clock.
pub fn since_epoch() -> Duration {
    match CLOCK.with(Cell::get) {
        Some(clock) => clock(),
        None => SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default(),
    }
}

/// Now, by this thread's clock.
pub fn now() -> SystemTime {
    UNIX_EPOCH + since_epoch()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_reads_the_clock_it_was_given_and_the_system_after() {
        fn fixed() -> Duration {
            Duration::from_secs(1_000)
        }
        {
            let _guard = set_for_this_thread(fixed);
            assert_eq!(since_epoch(), Duration::from_secs(1_000));
        }
        assert!(since_epoch() > Duration::from_secs(1_700_000_000));
    }
}
