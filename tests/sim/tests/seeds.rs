//! The seeds `cargo test` runs (CI keeps them under a few minutes; `SHOAL_SIM_SEEDS=N`
//! runs more), and the replay promise: one seed, one trace.

use shoal_sim::scenario::{self, Family};
use shoal_sim::seeds;

fn seed_count() -> u64 {
    std::env::var("SHOAL_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(12)
}

/// Seeds that found bugs, each with the family it found them in (a seed's own family is
/// seed mod the number of families, which grew; seed 0, a planted bug's, is among the
/// first twelve in its family): the planted bugs' seeds 25 and 56; 8, a resumed leader's
/// reused log ids; 10045, the batcher wedged by entries openraft never answered; 200,
/// stale inline bytes taken into a stripe; 421, a read through a handle held across a
/// restart answered before the replica caught up; 202 and 224, a slot fenced for a day on
/// the only node that could take it; 289, two drains at once started from a lagging
/// replica; 1054, a repair worker spinning on a budget wait that rounded to zero; 3018, a
/// file purged under a mount whose node was in no layout; 3032, a repair round that
/// failed at once planned again in a loop; 20081 and 20215, a purge decided by a leader
/// whose replica had no layout yet; 2 of `tiering`, the mover spinning on a retry time
/// long past; 198 of `tiering`, the simulator's mount announcing a released handle again;
/// 103 of `gc`, a leader sending entries past a hole a purge left in what it read; 90 of
/// `gc`, a node cut off coming back into the others' views only after 60 to 85 s; 51
/// and 55 of `repair`, a scrub that missed rotten shards and a reader that returned them
/// (planted); 25 of `repair`, a scrub stopped for good at an unreadable shard; 1014 of
/// `disk`, a give-up's delete taking the shard repair had just rebuilt on the same node
/// (see ARCHITECTURE.md, "The simulator"). A
/// code change reshapes every seed's run, so they are kept as cheap extra seeds, not as
/// proofs.
const FOUND: [(u64, &str); 22] = [
    (25, "power-loss"),
    (56, "partition"),
    (8, "drain"),
    (200, "power-loss"),
    (10045, "power-loss"),
    (421, "power-loss"),
    (202, "repair"),
    (224, "mixed"),
    (289, "mixed"),
    (1054, "rebalance"),
    (3018, "partition"),
    (3032, "repair"),
    (20081, "gc"),
    (20215, "mixed"),
    (2, "tiering"),
    (198, "tiering"),
    (103, "gc"),
    (90, "gc"),
    (51, "repair"),
    (55, "repair"),
    (25, "repair"),
    (1014, "disk"),
];

/// Threads the fixed seeds run on (each run is one thread's own runtime and clock).
const THREADS: usize = 2;

#[test]
fn every_family_keeps_what_it_acknowledged_over_the_fixed_seeds() {
    let runs: Vec<(u64, Option<Family>)> = (0..seed_count())
        .map(|s| (s, None))
        .chain(
            FOUND
                .iter()
                .map(|&(s, f)| (s, Some(Family::parse(f).expect("a family")))),
        )
        .collect();
    let failures: Vec<String> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                let mine: Vec<(u64, Option<Family>)> =
                    runs.iter().skip(t).step_by(THREADS).copied().collect();
                scope.spawn(move || {
                    mine.into_iter()
                        .filter_map(|(s, f)| failure(s, f))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        threads
            .into_iter()
            .flat_map(|t| t.join().expect("a seed's thread panicked"))
            .collect()
    });
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// What `seed` (in `family`, or its own) found, if it found a violation.
fn failure(seed: u64, family: Option<Family>) -> Option<String> {
    let report = seeds::check(seed, family, seeds::STEPS);
    if report.violations.is_empty() {
        return None;
    }
    let shortest = report
        .shortest
        .map(|(steps, trace)| format!("shortest: {steps} steps\n{}", trace.join("\n")));
    Some(format!(
        "seed {seed} ({}): {}\n{}",
        report.family.name(),
        report.violations.join("\n"),
        shortest.unwrap_or_default()
    ))
}

#[test]
fn a_seed_replays_to_the_same_trace() {
    for family in Family::ALL {
        let a = scenario::run(5, family, 8);
        let b = scenario::run(5, family, 8);
        assert!(
            a.trace.len() > 10,
            "{}: the run did something",
            family.name()
        );
        assert_eq!(
            a.trace,
            b.trace,
            "{}: the same seed ran differently",
            family.name()
        );
    }
}
