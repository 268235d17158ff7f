//! `shoal-sim`: runs seeds of the simulator. See the library's docs and ARCHITECTURE.md,
//! "The simulator".

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context, bail};
use clap::Parser;
use shoal_sim::scenario::Family;
use shoal_sim::seeds::{self, SeedReport};

#[derive(Parser)]
#[command(
    about = "Whole shoal clusters in one process: seeded runs with faults, checked against what was acknowledged"
)]
struct Args {
    /// Run this many seeds (from --first) and end with "N seeds, V violations".
    #[arg(long)]
    seeds: Option<u64>,
    /// The first seed of --seeds.
    #[arg(long, default_value_t = 0)]
    first: u64,
    /// Replay one seed and print "seed S: trace <digest>" (the same on every run).
    #[arg(long)]
    seed: Option<u64>,
    /// Print the whole trace of --seed.
    #[arg(long)]
    trace: bool,
    /// Run only this scenario family (default: each seed's own, seed mod the families).
    #[arg(long)]
    scenario: Option<String>,
    /// Fault steps per run.
    #[arg(long, default_value_t = seeds::STEPS)]
    steps: usize,
    /// Seeds run at once (one thread each; each run is single-threaded).
    #[arg(long)]
    jobs: Option<usize>,
    /// List the scenario families and exit.
    #[arg(long)]
    list_scenarios: bool,
    /// Scale on paper, made runnable: membership, placement and the repair planner at
    /// this many simulated nodes, no data path (see `scale.rs`; minutes at 1,000). Uses
    /// --seed (default 1).
    #[arg(long)]
    scale: Option<usize>,
}

/// Log lines stamped like the trace's: virtual milliseconds since the run began.
struct VirtualMs;

impl tracing_subscriber::fmt::time::FormatTime for VirtualMs {
    fn format_time(&self, w: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
        write!(w, "{:>8} ms", shoal_sim::trace::run_ms())
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // Silent unless RUST_LOG asks (e.g. RUST_LOG=openraft=debug with --seed S: what each
    // member's Raft core did, which found seed 103 of `gc`).
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("off")),
        )
        .with_writer(std::io::stderr)
        .with_timer(VirtualMs)
        .init();
    if args.list_scenarios {
        for f in Family::ALL {
            println!("{:<12} {}", f.name(), f.about());
        }
        return Ok(());
    }
    if let Some(nodes) = args.scale {
        println!("{}", shoal_sim::scale::run(nodes, args.seed.unwrap_or(1)));
        return Ok(());
    }
    let family = match &args.scenario {
        Some(name) => Some(Family::parse(name).with_context(|| {
            let names: Vec<&str> = Family::ALL.iter().map(|f| f.name()).collect();
            format!(
                "no scenario family {name:?} (there are: {})",
                names.join(", ")
            )
        })?),
        None => None,
    };
    match (args.seed, args.seeds) {
        (Some(seed), None) => {
            let report = seeds::check(seed, family, args.steps);
            if args.trace {
                let outcome = shoal_sim::scenario::run(seed, report.family, args.steps);
                for line in &outcome.trace {
                    println!("{line}");
                }
            }
            print_violations(&report);
            println!("seed {seed}: trace {}", report.digest);
            if !report.violations.is_empty() {
                std::process::exit(1);
            }
        }
        (None, Some(n)) => {
            let jobs = args
                .jobs
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
            let violations = run_many(args.first, n, family, args.steps, jobs.max(1));
            println!("{n} seeds, {violations} violations");
            if violations > 0 {
                std::process::exit(1);
            }
        }
        _ => bail!("give --seeds N, --seed S, --scale NODES or --list-scenarios"),
    }
    Ok(())
}

/// Long runs say how far they got this often (on stderr).
const PROGRESS_EVERY: u64 = 500;

/// Runs seeds `first..first + n` on `jobs` threads; returns how many found violations.
fn run_many(first: u64, n: u64, family: Option<Family>, steps: usize, jobs: usize) -> u64 {
    let next = AtomicU64::new(first);
    let failed = AtomicU64::new(0);
    let ran = AtomicU64::new(0);
    let out = Mutex::new(());
    std::thread::scope(|s| {
        for _ in 0..jobs {
            s.spawn(|| {
                loop {
                    let seed = next.fetch_add(1, Ordering::Relaxed);
                    if seed >= first + n {
                        return;
                    }
                    let report = seeds::check(seed, family, steps);
                    let done = ran.fetch_add(1, Ordering::Relaxed) + 1;
                    if done.is_multiple_of(PROGRESS_EVERY) {
                        let v = failed.load(Ordering::Relaxed);
                        eprintln!("{done} of {n} seeds run, {v} with violations so far");
                    }
                    if !report.violations.is_empty() {
                        failed.fetch_add(1, Ordering::Relaxed);
                        let _held = out.lock().unwrap_or_else(|p| p.into_inner());
                        print_violations(&report);
                    }
                }
            });
        }
    });
    failed.into_inner()
}

fn print_violations(report: &SeedReport) {
    const SHOWN: usize = 5;
    for v in report.violations.iter().take(SHOWN) {
        println!(
            "seed {} ({}): VIOLATION {v}",
            report.seed,
            report.family.name()
        );
    }
    if report.violations.len() > SHOWN {
        println!(
            "seed {} ({}): and {} more violations",
            report.seed,
            report.family.name(),
            report.violations.len() - SHOWN
        );
    }
    if let Some((steps, trace)) = &report.shortest {
        println!(
            "seed {} ({}): shortest run that shows it: {steps} steps; its trace:",
            report.seed,
            report.family.name()
        );
        for line in trace {
            println!("  {line}");
        }
    }
}
