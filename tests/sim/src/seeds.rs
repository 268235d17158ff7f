//! Many seeds, and for a seed that finds a violation the shortest run that still shows
//! it: a seed's schedule is drawn step by step, so the first `k` steps of a run are the
//! same whatever comes after, and fewer steps replay a prefix of the same run.

use crate::scenario::{self, Family};

/// Fault steps in one run.
pub const STEPS: usize = 30;

/// What checking one seed found.
pub struct SeedReport {
    pub seed: u64,
    pub family: Family,
    pub digest: String,
    pub violations: Vec<String>,
    /// For a seed with violations: the fewest steps that still show one, and that run's
    /// trace.
    pub shortest: Option<(usize, Vec<String>)>,
}

/// Runs `seed` (its own family, or `family`) for `steps`; shrinks it when it fails.
pub fn check(seed: u64, family: Option<Family>, steps: usize) -> SeedReport {
    let family = family.unwrap_or_else(|| Family::of_seed(seed));
    let outcome = scenario::run(seed, family, steps);
    let shortest = if outcome.violations.is_empty() {
        None
    } else {
        Some(shortest(seed, family, steps, outcome.trace.clone()))
    };
    SeedReport {
        seed,
        family,
        digest: outcome.digest(),
        violations: outcome.violations,
        shortest,
    }
}

/// The fewest steps (found by bisection, `failing` steps known to fail) whose run still
/// violates an invariant, with its trace.
fn shortest(seed: u64, family: Family, failing: usize, trace: Vec<String>) -> (usize, Vec<String>) {
    let (mut lo, mut hi, mut best) = (0usize, failing, trace);
    // Invariant: a run of `hi` steps fails; every count below `lo` was seen to pass.
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        let outcome = scenario::run(seed, family, mid);
        if outcome.violations.is_empty() {
            lo = mid + 1;
        } else {
            hi = mid;
            best = outcome.trace;
        }
    }
    (hi, best)
}
