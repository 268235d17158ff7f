//! `shoal bench repair`: the proof-of-concept check of self-healing. On a dev cluster with
//! mounts, data is written, then a foreground workload (writers of fsync'd files through
//! node 1's mount) runs alone; a node is killed, and once it is `out` the same workload
//! runs while the cluster rebuilds that node's shards. Measured: foreground MiB/s alone
//! and during the rebuild, the rebuild's MiB/s, and the time back to full redundancy.
//! Twice, side by side: with the governor idle and with a busy fake GPU
//! (`SHOAL_FAKE_GPU_UTILIZATION`). Every byte written first is read back and compared.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nix::sys::signal::{Signal, kill};
use serde::Serialize;
use shoal_agent_api::{AgentClient, Request, Response, StatusReport};
use shoal_units::parse_size;

use crate::bench::content;
use crate::dev_cluster::{self, UpOptions};

#[derive(clap::Args)]
pub struct RepairBenchOptions {
    /// Scratch directory for the dev clusters (127.0.91.x, one after the other).
    #[arg(long, default_value = "/tmp/shoal-bench-repair")]
    pub dir: PathBuf,
    #[arg(long, default_value_t = 6)]
    pub nodes: u8,
    /// Erasure-coding profile (k+m nodes must remain after the loss).
    #[arg(long, default_value = "2+1")]
    pub ec: String,
    /// Data written before the node is lost (repair rebuilds that node's share of it).
    #[arg(long, default_value = "512MiB", value_parser = parse_size)]
    pub size: u64,
    /// Foreground writer threads (fsync'd files through node 1's mount).
    #[arg(long, default_value_t = 2)]
    pub writers: usize,
    /// Size of each file written.
    #[arg(long, default_value = "8MiB", value_parser = parse_size)]
    pub file_size: u64,
    /// Seconds the foreground runs alone.
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// Utilisation of the busy fake GPU in the second run, percent.
    #[arg(long, default_value_t = 95.0)]
    pub busy_gpu: f64,
    /// The shoal-agent binary (default: next to this one, then PATH).
    #[arg(long)]
    pub agent_bin: Option<PathBuf>,
    /// Print the numbers as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct Run {
    governor: String,
    /// The governor's repair budget on node 1 during the rebuild.
    repair_budget_bytes_per_sec: u64,
    foreground_alone_mib_per_sec: f64,
    foreground_during_repair_mib_per_sec: f64,
    /// Bytes of the lost node's shards (what the rebuild writes).
    lost_shard_bytes: u64,
    /// Bytes of shards rebuilt and committed (the repair workers' count).
    rebuilt_bytes: u64,
    repaired_stripes: u64,
    /// From the first stripe repaired to the last.
    repair_seconds: f64,
    /// Shard bytes rebuilt a second.
    repair_mib_per_sec: f64,
    /// From `out` until a scan says every stripe is healthy (scans run every 5 s).
    restore_seconds: f64,
}

/// A benchmark's settings and its runs.
#[derive(Serialize)]
pub(crate) struct Report<R> {
    pub(crate) nodes: u8,
    pub(crate) ec: String,
    pub(crate) data_bytes: u64,
    pub(crate) writers: usize,
    pub(crate) file_size: u64,
    pub(crate) runs: Vec<R>,
}

/// What the foreground writers did: when each file was done, and its bytes.
type Done = Arc<Mutex<Vec<(Instant, u64)>>>;

pub(crate) struct Foreground {
    stop: Arc<AtomicBool>,
    done: Done,
    threads: Vec<std::thread::JoinHandle<anyhow::Result<()>>>,
}

impl Foreground {
    pub(crate) fn start(dir: &Path, writers: usize, file_size: u64) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("mkdir {}", dir.display()))?;
        let stop = Arc::new(AtomicBool::new(false));
        let done: Done = Arc::default();
        let threads = (0..writers)
            .map(|w| {
                let (stop, done, dir) = (stop.clone(), done.clone(), dir.to_owned());
                std::thread::spawn(move || {
                    let data = content(w as u64, 0, file_size);
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let path = dir.join(format!("w{w}-{n}"));
                        write_file(&path, &data)?;
                        lock(&done).push((Instant::now(), file_size));
                        n += 1;
                    }
                    Ok(())
                })
            })
            .collect();
        Ok(Foreground {
            stop,
            done,
            threads,
        })
    }

    pub(crate) fn stop(self) -> anyhow::Result<Vec<(Instant, u64)>> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join()
                .map_err(|_| anyhow::anyhow!("a foreground writer panicked"))??;
        }
        Ok(std::mem::take(&mut *lock(&self.done)))
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn write_file(path: &Path, data: &[u8]) -> anyhow::Result<()> {
    let mut f =
        std::fs::File::create(path).with_context(|| format!("create {}", path.display()))?;
    f.write_all(data)
        .and_then(|()| f.sync_all())
        .with_context(|| format!("write {}", path.display()))
}

/// MiB a second of the files finished between `from` and `to`.
pub(crate) fn rate_between(done: &[(Instant, u64)], from: Instant, to: Instant) -> f64 {
    let bytes: u64 = done
        .iter()
        .filter(|(at, _)| *at > from && *at <= to)
        .map(|(_, b)| b)
        .sum();
    let secs = to.saturating_duration_since(from).as_secs_f64();
    bytes as f64 / (1 << 20) as f64 / secs.max(1e-9)
}

/// One dev cluster's node `i` and its status.
pub(crate) struct Cluster {
    pub(crate) dir: PathBuf,
    pub(crate) nodes: u8,
    rt: tokio::runtime::Runtime,
}

impl Cluster {
    fn socket(&self, i: u8) -> PathBuf {
        dev_cluster::node_dir(&self.dir, i).join("agent.sock")
    }

    pub(crate) fn mnt(&self, i: u8) -> PathBuf {
        dev_cluster::node_dir(&self.dir, i).join("mnt")
    }

    pub(crate) fn status(&self, i: u8) -> Option<StatusReport> {
        self.rt.block_on(async {
            let mut c = AgentClient::connect(self.socket(i)).await.ok()?;
            match c.call(&Request::Status).await.ok()? {
                Response::Status(r) => Some(*r),
                _ => None,
            }
        })
    }

    /// The node an event happens to: the last one that is not a metadata voter (its loss
    /// is a data event), with its id.
    pub(crate) fn victim(&self) -> anyhow::Result<(u8, String)> {
        let s1 = self.status(1).context("node 1 does not answer")?;
        let ids: Vec<Option<String>> = (1..=self.nodes)
            .map(|i| self.status(i).map(|s| s.node))
            .collect();
        let victim = (2..=self.nodes)
            .rev()
            .find(|&i| {
                ids[usize::from(i) - 1]
                    .as_ref()
                    .is_some_and(|id| !s1.meta.voters.contains(id))
            })
            .context("no node other than node 1 is a non-voter")?;
        Ok((
            victim,
            ids[usize::from(victim) - 1].clone().unwrap_or_default(),
        ))
    }

    /// One request to node `i`'s agent.
    pub(crate) fn call(&self, i: u8, request: &Request) -> anyhow::Result<Response> {
        self.rt.block_on(async {
            let mut c = AgentClient::connect(self.socket(i)).await?;
            Ok(c.call(request).await?)
        })
    }

    pub(crate) fn wait<T>(
        &self,
        limit: Duration,
        what: &str,
        mut f: impl FnMut() -> Option<T>,
    ) -> anyhow::Result<T> {
        let started = Instant::now();
        loop {
            if let Some(v) = f() {
                return Ok(v);
            }
            if started.elapsed() > limit {
                bail!("gave up after {limit:?} waiting for {what}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// Writes `count` files of `o.file_size` into `dir` with `o.writers` threads.
pub(crate) fn fill(o: &RepairBenchOptions, dir: &Path, count: u64) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let threads: Vec<_> = (0..o.writers as u64)
        .map(|w| {
            let (dir, writers, size) = (dir.to_owned(), o.writers as u64, o.file_size);
            std::thread::spawn(move || -> anyhow::Result<()> {
                for i in (w..count).step_by(writers as usize) {
                    write_file(&dir.join(format!("f{i}")), &content(7, i as usize, size))?;
                }
                Ok(())
            })
        })
        .collect();
    for t in threads {
        t.join()
            .map_err(|_| anyhow::anyhow!("a fill writer panicked"))??;
    }
    Ok(())
}

pub(crate) fn verify(dir: &Path, count: u64, size: u64) -> anyhow::Result<()> {
    for i in 0..count {
        let path = dir.join(format!("f{i}"));
        let got = std::fs::read(&path).with_context(|| format!("read {}", path.display()))?;
        if got != content(7, i as usize, size) {
            bail!("{} read back different bytes", path.display());
        }
    }
    Ok(())
}

fn one_run(
    o: &RepairBenchOptions,
    governor: String,
    env: Vec<(String, String)>,
) -> anyhow::Result<Run> {
    let c = start_cluster(o, &governor, env, 91)?;
    let result = measure(o, &c, governor);
    dev_cluster::down(&c.dir)?;
    result
}

/// A fresh dev cluster for one run, on 127.0.`subnet`.x, with mounts, one failure domain
/// per node and `down_out_after` 5 s.
pub(crate) fn start_cluster(
    o: &RepairBenchOptions,
    governor: &str,
    env: Vec<(String, String)>,
    subnet: u8,
) -> anyhow::Result<Cluster> {
    let dir = o.dir.join(governor.replace([' ', '%'], "-"));
    let _ = dev_cluster::down(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    let mut up = UpOptions::new(o.nodes, dir.clone());
    up.base_ip = std::net::Ipv4Addr::new(127, 0, subnet, 1);
    up.agent_bin = o.agent_bin.clone();
    up.mount = true;
    up.failure_domains = o.nodes;
    up.ec = Some(o.ec.clone());
    up.set = vec![("cluster".into(), "down_out_after = \"5s\"".into())];
    up.agent_env = env;
    dev_cluster::up(&up)?;
    Ok(Cluster {
        dir,
        nodes: o.nodes,
        rt: tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?,
    })
}

/// The data every run starts from, then the foreground alone: the number of files written
/// (`data/f0` ...) and the foreground's MiB/s.
pub(crate) fn baseline(
    o: &RepairBenchOptions,
    c: &Cluster,
    governor: &str,
) -> anyhow::Result<(u64, f64)> {
    let files = o.size.div_ceil(o.file_size).max(1);
    eprintln!("[{governor}] writing {files} files of {}", o.file_size);
    fill(o, &c.mnt(1).join("data"), files)?;

    eprintln!("[{governor}] foreground alone for {} s", o.seconds);
    let fg = Foreground::start(&c.mnt(1).join("alone"), o.writers, o.file_size)?;
    let from = Instant::now();
    std::thread::sleep(Duration::from_secs(o.seconds));
    let to = Instant::now();
    let alone = rate_between(&fg.stop()?, from, to);
    Ok((files, alone))
}

fn measure(o: &RepairBenchOptions, c: &Cluster, governor: String) -> anyhow::Result<Run> {
    let (files, alone) = baseline(o, c, &governor)?;

    let (victim, victim_id) = c.victim()?;
    let pid = dev_cluster::running_pid(&dev_cluster::node_dir(&c.dir, victim))
        .context("the victim's agent is not running")?;
    eprintln!("[{governor}] killing node{victim}; waiting for it to be out");
    kill(pid, Signal::SIGKILL)?;
    let out_at = c.wait(Duration::from_secs(120), "the lost node out", || {
        let s = c.status(1)?;
        s.nodes
            .iter()
            .any(|m| m.id == victim_id && m.layout_state.as_deref() == Some("out"))
            .then(Instant::now)
    })?;

    let alive: Vec<u8> = (1..=c.nodes).filter(|&i| i != victim).collect();
    let repaired = || -> (u64, u64) {
        alive
            .iter()
            .filter_map(|&i| c.status(i)?.redundancy)
            .fold((0, 0), |(s, b), r| {
                (s + r.repaired_stripes, b + r.repaired_bytes)
            })
    };
    let fg = Foreground::start(&c.mnt(1).join("during"), o.writers, o.file_size)?;
    let (mut first, mut last, mut seen) = (None, None, (0, 0));
    let (mut lost_bytes, mut budget) = (0, 0);
    let restored_at = c.wait(Duration::from_secs(900), "full redundancy", || {
        let now = Instant::now();
        let r = repaired();
        if r.0 > seen.0 {
            first.get_or_insert(now);
            last = Some(now);
            seen = r;
        }
        let s = c.status(1)?;
        budget = budget.max(
            s.background
                .iter()
                .find(|b| b.class == "repair")
                .map_or(0, |b| b.bytes_per_sec),
        );
        let red = s.redundancy?;
        lost_bytes = lost_bytes.max(red.bytes_to_repair);
        let fresh = Duration::from_millis(red.scanned_ms_ago) < now.duration_since(out_at);
        (fresh && red.stripes_degraded == 0 && red.stripes_unreadable == 0).then_some(now)
    })?;
    let done = fg.stop()?;
    let (first, last) = (first.unwrap_or(out_at), last.unwrap_or(restored_at));
    let repair_seconds = last.duration_since(first).as_secs_f64();
    // The foreground while stripes were being rebuilt (at least the last second of it).
    let one = Duration::from_secs(1);
    let window_start = if last.duration_since(first) >= one {
        first
    } else {
        last.checked_sub(one).unwrap_or(out_at).max(out_at)
    };
    let during = rate_between(&done, window_start, last);

    eprintln!(
        "[{governor}] verifying every file written first through node{}",
        alive[1]
    );
    verify(&c.mnt(alive[1]).join("data"), files, o.file_size)?;
    Ok(Run {
        governor,
        repair_budget_bytes_per_sec: budget,
        foreground_alone_mib_per_sec: alone,
        foreground_during_repair_mib_per_sec: during,
        lost_shard_bytes: lost_bytes,
        rebuilt_bytes: seen.1,
        repaired_stripes: seen.0,
        repair_seconds,
        repair_mib_per_sec: seen.1 as f64 / (1 << 20) as f64 / repair_seconds.max(1e-3),
        restore_seconds: restored_at.duration_since(out_at).as_secs_f64(),
    })
}

/// Checks the options, then runs `one_run` twice, side by side: with the governor idle
/// and with a busy fake GPU.
pub(crate) fn both_runs<R>(
    o: &RepairBenchOptions,
    one_run: impl Fn(&RepairBenchOptions, String, Vec<(String, String)>) -> anyhow::Result<R>,
) -> anyhow::Result<Report<R>> {
    if o.writers == 0 || o.file_size == 0 {
        bail!("--writers and --file-size must be above 0");
    }
    if !(0.0..=100.0).contains(&o.busy_gpu) {
        bail!("--busy-gpu is a percent (0 to 100)");
    }
    let busy = format!("busy GPU {}%", o.busy_gpu);
    let env = vec![(
        "SHOAL_FAKE_GPU_UTILIZATION".to_owned(),
        o.busy_gpu.to_string(),
    )];
    let runs = vec![
        one_run(o, "idle".into(), Vec::new())?,
        one_run(o, busy, env)?,
    ];
    Ok(Report {
        nodes: o.nodes,
        ec: o.ec.clone(),
        data_bytes: o.size,
        writers: o.writers,
        file_size: o.file_size,
        runs,
    })
}

pub fn run(o: RepairBenchOptions) -> anyhow::Result<()> {
    let report = both_runs(&o, one_run)?;
    if o.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    print_report(&report);
    Ok(())
}

fn print_report(r: &Report<Run>) {
    use crate::status::bytes;
    println!(
        "{} nodes, {}, {} written, one node lost; foreground: {} writers of {} files (fsync) through node1's mount",
        r.nodes,
        r.ec,
        bytes(r.data_bytes),
        r.writers,
        bytes(r.file_size)
    );
    println!(
        "{:<14} {:>13} {:>11} {:>12} {:>6} {:>10} {:>11} {:>11}",
        "governor",
        "repair budget",
        "fg alone",
        "fg repairing",
        "ratio",
        "rebuilt",
        "repair rate",
        "restored in"
    );
    for run in &r.runs {
        println!(
            "{:<14} {:>11}/s {:>6.1} MiB/s {:>6.1} MiB/s {:>6.2} {:>10} {:>5.1} MiB/s {:>9.1} s",
            run.governor,
            bytes(run.repair_budget_bytes_per_sec),
            run.foreground_alone_mib_per_sec,
            run.foreground_during_repair_mib_per_sec,
            run.foreground_during_repair_mib_per_sec / run.foreground_alone_mib_per_sec.max(1e-9),
            bytes(run.rebuilt_bytes),
            run.repair_mib_per_sec,
            run.restore_seconds
        );
    }
}
