//! `shoal bench stripes`: write stripes of a chosen EC profile and size through the local
//! agent with N concurrent writers, read them back and verify every byte (like
//! `rados bench`). The records of the written stripes are kept in a file, so a later
//! `--read-only` run (e.g. after killing nodes) reads the same stripes.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use shoal_agent_api::{
    AgentClient, DEFAULT_SOCKET, EcProfile, Request, Response, SOCKET_ENV, StripeRecord,
};
use shoal_units::parse_size;

use crate::progress;

#[derive(clap::Args)]
pub struct BenchOptions {
    /// The agent's admin socket.
    #[arg(long, env = SOCKET_ENV, default_value = DEFAULT_SOCKET)]
    pub socket: PathBuf,
    /// Total data to write, e.g. 256MiB or 2GiB.
    #[arg(long, default_value = "256MiB", value_parser = parse_size)]
    pub size: u64,
    /// Bytes per stripe (default: k × 1 MiB, a full stripe).
    #[arg(long, value_parser = parse_size)]
    pub stripe_size: Option<u64>,
    /// EC profile, e.g. 4+2 (default: the agent's `storage.ec`).
    #[arg(long)]
    pub ec: Option<EcProfile>,
    /// Concurrent writers (and readers).
    #[arg(long, default_value_t = 4)]
    pub writers: usize,
    /// Where the written stripes' records are kept for `--read-only`.
    #[arg(long, default_value = "shoal-bench-stripes.json")]
    pub records: PathBuf,
    /// Skip writing: read back and verify the stripes in --records.
    #[arg(long)]
    pub read_only: bool,
    /// Accepted for clarity: every read is verified.
    #[arg(long)]
    pub verify: bool,
    /// Print the numbers as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize, Deserialize)]
struct RecordFile {
    seed: u64,
    stripe_size: u64,
    stripes: Vec<StripeRecord>,
}

#[derive(Serialize, Default)]
struct Phase {
    stripes: usize,
    bytes: u64,
    seconds: f64,
    mib_per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
    errors: usize,
}

#[derive(Serialize, Default)]
struct Report {
    ec: Option<String>,
    stripe_size: u64,
    writers: usize,
    write: Option<Phase>,
    read: Option<Phase>,
    /// Stripes whose read had to decode (missing, slow or corrupt shards).
    decoded: usize,
    /// Stripes whose bytes did not match what was written.
    mismatches: usize,
}

/// Deterministic bench content for stripe `i`: a splitmix64 stream.
pub(crate) fn content(seed: u64, i: usize, len: u64) -> Vec<u8> {
    let mut x = seed ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let mut out = Vec::with_capacity(len as usize + 8);
    while (out.len() as u64) < len {
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        out.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    out.truncate(len as usize);
    out
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

fn phase(
    stripes: usize,
    bytes: u64,
    elapsed: Duration,
    mut lat: Vec<Duration>,
    errors: usize,
) -> Phase {
    lat.sort();
    let seconds = elapsed.as_secs_f64();
    Phase {
        stripes,
        bytes,
        seconds,
        mib_per_sec: bytes as f64 / (1 << 20) as f64 / seconds.max(1e-9),
        p50_ms: percentile(&lat, 0.5),
        p99_ms: percentile(&lat, 0.99),
        errors,
    }
}

pub async fn run(o: BenchOptions) -> anyhow::Result<()> {
    if o.writers == 0 {
        bail!("--writers must be at least 1");
    }
    let mut report = Report {
        writers: o.writers,
        ..Report::default()
    };
    let file = if o.read_only {
        let text = std::fs::read_to_string(&o.records).with_context(|| {
            format!(
                "cannot read {} (run the write phase first)",
                o.records.display()
            )
        })?;
        serde_json::from_str::<RecordFile>(&text).context("bad records file")?
    } else {
        let k = o.ec.map_or(4, |e| e.k) as u64;
        let stripe_size = o.stripe_size.unwrap_or(k << 20);
        if stripe_size == 0 {
            bail!("--stripe-size must be above 0");
        }
        let count = o.size.div_ceil(stripe_size).max(1) as usize;
        let seed = rand::random();
        let (stripes, write) = write_phase(&o, seed, stripe_size, count).await?;
        report.write = Some(write);
        let file = RecordFile {
            seed,
            stripe_size,
            stripes,
        };
        std::fs::write(&o.records, serde_json::to_vec(&file)?)
            .with_context(|| format!("cannot write {}", o.records.display()))?;
        file
    };
    report.stripe_size = file.stripe_size;
    report.ec = file.stripes.first().map(|s| s.ec.to_string());
    let (read, decoded, mismatches) = read_phase(&o, &file).await?;
    report.read = Some(read);
    report.decoded = decoded;
    report.mismatches = mismatches;
    if o.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_report(&report, &o);
    }
    let errors = report.write.as_ref().map_or(0, |p| p.errors)
        + report.read.as_ref().map_or(0, |p| p.errors);
    if mismatches > 0 || errors > 0 {
        bail!("{mismatches} stripe(s) read back wrong, {errors} request(s) failed");
    }
    Ok(())
}

async fn write_phase(
    o: &BenchOptions,
    seed: u64,
    stripe_size: u64,
    count: usize,
) -> anyhow::Result<(Vec<StripeRecord>, Phase)> {
    let started = Instant::now();
    let bar = progress::count_on_stderr(count as u64, "stripes").with_prefix("write ");
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..o.writers {
        let socket = o.socket.clone();
        let (ec, writers, bar) = (o.ec, o.writers, bar.clone());
        tasks.spawn(async move {
            let mut client = AgentClient::connect(&socket).await?;
            let mut out = Vec::new();
            for i in (w..count).step_by(writers) {
                let data = content(seed, i, stripe_size);
                let t = Instant::now();
                let res = client.call(&Request::WriteStripe { data, ec }).await?;
                out.push((i, t.elapsed(), res));
                bar.inc(1);
            }
            anyhow::Ok(out)
        });
    }
    let mut records: Vec<Option<StripeRecord>> = vec![None; count];
    let mut lat = Vec::new();
    let mut errors = 0;
    let results = tasks.join_all().await;
    bar.finish_and_clear();
    for res in results {
        for (i, took, resp) in res? {
            match resp.into_result() {
                Ok(Response::StripeWritten(r)) => {
                    lat.push(took);
                    records[i] = Some(r);
                }
                Err(e) => {
                    if errors == 0 {
                        eprintln!("write error: {e}");
                    }
                    errors += 1;
                }
                Ok(other) => bail!("unexpected answer {other:?}"),
            }
        }
    }
    let records: Vec<StripeRecord> = records.into_iter().flatten().collect();
    let bytes = records.len() as u64 * stripe_size;
    Ok((records, phase(count, bytes, started.elapsed(), lat, errors)))
}

async fn read_phase(o: &BenchOptions, file: &RecordFile) -> anyhow::Result<(Phase, usize, usize)> {
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    let stripes = std::sync::Arc::new(file.stripes.clone());
    let bar = progress::count_on_stderr(stripes.len() as u64, "stripes").with_prefix("read  ");
    for w in 0..o.writers {
        let socket = o.socket.clone();
        let (stripes, writers, seed, bar) = (stripes.clone(), o.writers, file.seed, bar.clone());
        tasks.spawn(async move {
            let mut client = AgentClient::connect(&socket).await?;
            let mut out = Vec::new();
            for i in (w..stripes.len()).step_by(writers) {
                let record = stripes[i].clone();
                let len = record.len;
                let t = Instant::now();
                let resp = client
                    .call(&Request::ReadStripe {
                        record,
                        offset: 0,
                        len,
                    })
                    .await?;
                let took = t.elapsed();
                let outcome = match resp.into_result() {
                    Ok(Response::StripeRead(r)) => Ok((r.decoded, r.data == content(seed, i, len))),
                    Err(e) => Err(e.message),
                    Ok(other) => Err(format!("unexpected answer {other:?}")),
                };
                out.push((took, outcome));
                bar.inc(1);
            }
            anyhow::Ok(out)
        });
    }
    let (mut lat, mut errors, mut decoded, mut mismatches, mut bytes) = (Vec::new(), 0, 0, 0, 0u64);
    let results = tasks.join_all().await;
    bar.finish_and_clear();
    for res in results {
        for (took, outcome) in res? {
            match outcome {
                Ok((dec, same)) => {
                    lat.push(took);
                    decoded += dec as usize;
                    mismatches += (!same) as usize;
                    bytes += file.stripe_size;
                }
                Err(e) => {
                    if errors == 0 {
                        eprintln!("read error: {e}");
                    }
                    errors += 1;
                }
            }
        }
    }
    Ok((
        phase(file.stripes.len(), bytes, started.elapsed(), lat, errors),
        decoded,
        mismatches,
    ))
}

fn print_report(r: &Report, o: &BenchOptions) {
    println!(
        "stripes of {} ({}), {} concurrent clients",
        crate::status::bytes(r.stripe_size),
        r.ec.as_deref().unwrap_or("?"),
        r.writers
    );
    for (name, p) in [("write", &r.write), ("read", &r.read)] {
        if let Some(p) = p {
            println!(
                "{name:>5}: {} stripes, {:.1} MiB/s, p50 {:.1} ms, p99 {:.1} ms, {} errors",
                p.stripes, p.mib_per_sec, p.p50_ms, p.p99_ms, p.errors
            );
        }
    }
    println!(
        "verify: {} stripes read back, {} decoded (degraded), {} mismatched; records in {}",
        r.read.as_ref().map_or(0, |p| p.stripes - p.errors),
        r.decoded,
        r.mismatches,
        o.records.display()
    );
}
