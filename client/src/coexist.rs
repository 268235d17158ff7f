//! `shoal bench coexist`: what the storage side takes from the training job on the same
//! node. A CPU-bound training proxy (fixed compute steps, pinned to the cores the
//! reservation leaves to training) runs alone, then beside a storage write load on a dev
//! cluster without a reservation, then with one; step times and slowdowns are printed.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nix::sched::{CpuSet, sched_setaffinity};
use nix::unistd::Pid;
use serde::Serialize;
use shoal_agent_api::{AgentClient, EcProfile, Request, Response};

use crate::dev_cluster::{self, UpOptions};

#[derive(clap::Args)]
pub struct CoexistOptions {
    /// Scratch directory for the two dev clusters (127.0.90.x).
    #[arg(long, default_value = "/tmp/shoal-coexist")]
    pub dir: PathBuf,
    #[arg(long, default_value_t = 3)]
    pub nodes: u8,
    /// Training steps per run.
    #[arg(long, default_value_t = 30)]
    pub steps: usize,
    /// CPUs reserved for storage in the confined run, e.g. 0 or 0,1 (the rest go to training).
    #[arg(long, value_delimiter = ',', default_value = "0")]
    pub storage_cpus: Vec<usize>,
    /// Memory reserved per agent in the confined run.
    #[arg(long, default_value = "512MiB")]
    pub memory: String,
    /// The shoal-agent binary (default: next to this one, then PATH).
    #[arg(long)]
    pub agent_bin: Option<PathBuf>,
    /// Print the numbers as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct Run {
    name: &'static str,
    step_ms_median: f64,
    step_ms_p90: f64,
    storage_mib_per_sec: f64,
    agent_memory_peak_bytes: Option<u64>,
    agent_memory_limit_bytes: Option<u64>,
}

#[derive(Serialize)]
struct Report {
    training_cpus: Vec<usize>,
    storage_cpus: Vec<usize>,
    runs: Vec<Run>,
    slowdown_unconfined: f64,
    slowdown_confined: f64,
}

fn pin(cpus: &[usize]) -> anyhow::Result<()> {
    let mut set = CpuSet::new();
    for c in cpus {
        set.set(*c).context("cpu number")?;
    }
    sched_setaffinity(Pid::from_raw(0), &set).context("sched_setaffinity")
}

/// One fixed unit of compute (integer mixing; the optimiser cannot skip it).
fn step() -> u64 {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for i in 0..20_000_000u64 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x = x.wrapping_add(i);
    }
    std::hint::black_box(x)
}

/// Runs `steps` training steps on `cpus` in a thread; returns step times.
fn train(cpus: Vec<usize>, steps: usize) -> anyhow::Result<Vec<Duration>> {
    std::thread::spawn(move || {
        pin(&cpus)?;
        let mut times = Vec::with_capacity(steps);
        for _ in 0..steps {
            let t = Instant::now();
            step();
            times.push(t.elapsed());
        }
        Ok(times)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("training thread panicked"))?
}

fn stats(mut t: Vec<Duration>) -> (f64, f64) {
    t.sort();
    let at = |p: f64| t[((t.len() - 1) as f64 * p).round() as usize].as_secs_f64() * 1000.0;
    (at(0.5), at(0.9))
}

/// Writes full stripes through `socket` from a thread pinned to `cpus` (all CPUs when
/// None) until `stop`; returns bytes written.
fn storage_load(
    socket: PathBuf,
    ec: EcProfile,
    cpus: Option<Vec<usize>>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<anyhow::Result<u64>> {
    std::thread::spawn(move || {
        if let Some(c) = &cpus {
            pin(c)?;
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(async {
            let written = Arc::new(AtomicU64::new(0));
            let mut tasks = tokio::task::JoinSet::new();
            for w in 0..4 {
                let (socket, stop, written) = (socket.clone(), stop.clone(), written.clone());
                // Full stripes: k × 1 MiB.
                let stripe = u64::from(ec.k) << 20;
                tasks.spawn(async move {
                    let mut client = AgentClient::connect(&socket).await?;
                    let mut i = w;
                    while !stop.load(Ordering::Relaxed) {
                        let data = crate::bench::content(7, i, stripe);
                        let request = Request::WriteStripe { data, ec: Some(ec) };
                        match client.call(&request).await?.into_result() {
                            Ok(Response::StripeWritten(_)) => {
                                written.fetch_add(stripe, Ordering::Relaxed);
                            }
                            Err(e) => bail!("storage load failed: {e}"),
                            Ok(other) => bail!("unexpected answer {other:?}"),
                        }
                        i += 4;
                    }
                    anyhow::Ok(())
                });
            }
            for r in tasks.join_all().await {
                r?;
            }
            Ok(written.load(Ordering::Relaxed))
        })
    })
}

async fn agent_memory(socket: &Path) -> (Option<u64>, Option<u64>) {
    let Ok(mut c) = AgentClient::connect(socket).await else {
        return (None, None);
    };
    match c.call(&Request::Status).await {
        Ok(Response::Status(r)) => match &r.resources {
            Some(res) => (res.memory_peak_bytes, Some(res.memory_limit_bytes)),
            None => (None, None),
        },
        _ => (None, None),
    }
}

fn beside_storage(
    o: &CoexistOptions,
    name: &'static str,
    training: &[usize],
    reserved: bool,
) -> anyhow::Result<Run> {
    let dir = o.dir.join(name);
    let mut up = UpOptions::new(o.nodes, dir.clone());
    up.base_ip = std::net::Ipv4Addr::new(127, 0, 90, 1);
    up.agent_bin = o.agent_bin.clone();
    if reserved {
        let cpus: Vec<String> = o.storage_cpus.iter().map(|c| c.to_string()).collect();
        up.reserve_cpus = Some(cpus.join(","));
        up.reserve_memory = Some(o.memory.clone());
    }
    dev_cluster::up(&up)?;
    let socket = dev_cluster::node_dir(&dir, 1).join("agent.sock");
    let stop = Arc::new(AtomicBool::new(false));
    let load_cpus = reserved.then(|| o.storage_cpus.clone());
    // Shards of a stripe on distinct nodes: k+m = the cluster size, parity 1 or 2.
    let m = if o.nodes >= 5 { 2 } else { 1 };
    let ec = EcProfile {
        k: o.nodes.saturating_sub(m).max(1),
        m,
    };
    let load = storage_load(socket.clone(), ec, load_cpus, stop.clone());
    // Let the load reach steady state.
    std::thread::sleep(Duration::from_secs(2));
    let t = Instant::now();
    let times = train(training.to_vec(), o.steps);
    let elapsed = t.elapsed();
    stop.store(true, Ordering::Relaxed);
    let written = load
        .join()
        .map_err(|_| anyhow::anyhow!("load thread panicked"))?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (peak, limit) = rt.block_on(agent_memory(&socket));
    dev_cluster::down(&dir)?;
    let times = times?;
    let written = written?;
    let (median, p90) = stats(times);
    Ok(Run {
        name,
        step_ms_median: median,
        step_ms_p90: p90,
        storage_mib_per_sec: written as f64 / (1 << 20) as f64 / (elapsed.as_secs_f64() + 2.0),
        agent_memory_peak_bytes: peak,
        agent_memory_limit_bytes: limit,
    })
}

pub fn run(o: CoexistOptions) -> anyhow::Result<()> {
    let online = std::thread::available_parallelism()?.get();
    let training: Vec<usize> = (0..online)
        .filter(|c| !o.storage_cpus.contains(c))
        .collect();
    if training.is_empty() || o.storage_cpus.iter().any(|c| *c >= online) {
        bail!("--storage-cpus must leave at least one of this machine's {online} CPUs to training");
    }
    let (median, p90) = stats(train(training.clone(), o.steps)?);
    let alone = Run {
        name: "alone",
        step_ms_median: median,
        step_ms_p90: p90,
        storage_mib_per_sec: 0.0,
        agent_memory_peak_bytes: None,
        agent_memory_limit_bytes: None,
    };
    let unconfined = beside_storage(&o, "unconfined", &training, false)?;
    let confined = beside_storage(&o, "confined", &training, true)?;
    let report = Report {
        slowdown_unconfined: unconfined.step_ms_median / alone.step_ms_median,
        slowdown_confined: confined.step_ms_median / alone.step_ms_median,
        training_cpus: training,
        storage_cpus: o.storage_cpus.clone(),
        runs: vec![alone, unconfined, confined],
    };
    if o.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    println!(
        "training proxy on CPUs {:?}; storage reserved CPUs {:?}",
        report.training_cpus, report.storage_cpus
    );
    for r in &report.runs {
        let mem = match (r.agent_memory_peak_bytes, r.agent_memory_limit_bytes) {
            (Some(p), Some(l)) => format!(
                ", node1 agent peak {} of {}",
                crate::status::bytes(p),
                crate::status::bytes(l)
            ),
            _ => String::new(),
        };
        println!(
            "{:>10}: step median {:.1} ms, p90 {:.1} ms, storage {:.1} MiB/s{mem}",
            r.name, r.step_ms_median, r.step_ms_p90, r.storage_mib_per_sec
        );
    }
    println!(
        "slowdown beside storage: {:.2}x unconfined, {:.2}x with the reservation",
        report.slowdown_unconfined, report.slowdown_confined
    );
    Ok(())
}
