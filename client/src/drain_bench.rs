//! `shoal bench drain`: what a drain costs the foreground. On a dev cluster with mounts,
//! data is written, then a foreground workload (writers of fsync'd files through node 1's
//! mount) runs alone; a node is drained and the same workload runs until it is drained.
//! Measured: foreground MiB/s alone and during the drain, the drain's MiB/s (shard bytes
//! moved off the node over the time it took). Twice, side by side: with the governor idle
//! and with a busy fake GPU (`SHOAL_FAKE_GPU_UTILIZATION`). Every byte written first is
//! read back and compared. The options are `shoal bench repair`'s.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::Serialize;
use shoal_agent_api::{Request, Response};

use crate::dev_cluster;
use crate::repair_bench::{
    Cluster, Foreground, RepairBenchOptions, baseline, both_runs, rate_between, start_cluster,
    verify,
};

#[derive(Serialize)]
struct Run {
    governor: String,
    /// The governor's drain budget on node 1 during the drain.
    drain_budget_bytes_per_sec: u64,
    foreground_alone_mib_per_sec: f64,
    foreground_during_drain_mib_per_sec: f64,
    /// Stripes and bytes of shards the drained node held (what moved).
    stripes: u64,
    moved_bytes: u64,
    /// From `shoal drain` to `drained`.
    drain_seconds: f64,
    drain_mib_per_sec: f64,
}

fn one_run(
    o: &RepairBenchOptions,
    governor: String,
    env: Vec<(String, String)>,
) -> anyhow::Result<Run> {
    let c = start_cluster(o, &format!("drain-{governor}"), env, 92)?;
    let result = measure(o, &c, governor);
    dev_cluster::down(&c.dir)?;
    result
}

fn measure(o: &RepairBenchOptions, c: &Cluster, governor: String) -> anyhow::Result<Run> {
    let (files, alone) = baseline(o, c, &governor)?;

    let (victim, victim_id) = c.victim()?;
    let fg = Foreground::start(&c.mnt(1).join("during"), o.writers, o.file_size)?;
    eprintln!("[{governor}] draining node{victim}");
    let started = Instant::now();
    let answer = c.call(
        1,
        &Request::Drain {
            node: victim_id.clone(),
            dry_run: false,
        },
    )?;
    let plan = match answer.into_result() {
        Ok(Response::Drain(p)) if p.started => p,
        Ok(Response::Drain(p)) => bail!("the drain did not start: {:?}", p.reasons),
        Err(e) => bail!("drain: {e}"),
        Ok(other) => bail!("unexpected answer {other:?}"),
    };
    let mut budget = 0;
    let drained_at = c.wait(Duration::from_secs(900), "the node drained", || {
        let s = c.status(1)?;
        budget = budget.max(
            s.background
                .iter()
                .find(|b| b.class == "drain")
                .map_or(0, |b| b.bytes_per_sec),
        );
        s.nodes
            .iter()
            .any(|m| m.id == victim_id && m.layout_state.as_deref() == Some("drained"))
            .then(Instant::now)
    })?;
    let done = fg.stop()?;
    let during = rate_between(&done, started, drained_at);
    let seconds = drained_at.duration_since(started).as_secs_f64();

    eprintln!("[{governor}] verifying every file written first through node{victim}'s peers");
    let reader = (2..=c.nodes)
        .find(|&i| i != victim)
        .context("no reader left")?;
    verify(&c.mnt(reader).join("data"), files, o.file_size)?;
    Ok(Run {
        governor,
        drain_budget_bytes_per_sec: budget,
        foreground_alone_mib_per_sec: alone,
        foreground_during_drain_mib_per_sec: during,
        stripes: plan.stripes,
        moved_bytes: plan.bytes,
        drain_seconds: seconds,
        drain_mib_per_sec: plan.bytes as f64 / (1 << 20) as f64 / seconds.max(1e-3),
    })
}

pub fn run(o: RepairBenchOptions) -> anyhow::Result<()> {
    let report = both_runs(&o, one_run)?;
    if o.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    use crate::status::bytes;
    println!(
        "{} nodes, {}, {} written, one node drained; foreground: {} writers of {} files (fsync) through node1's mount",
        report.nodes,
        report.ec,
        bytes(report.data_bytes),
        report.writers,
        bytes(report.file_size)
    );
    println!(
        "{:<14} {:>12} {:>11} {:>12} {:>6} {:>10} {:>11} {:>10}",
        "governor",
        "drain budget",
        "fg alone",
        "fg draining",
        "ratio",
        "moved",
        "drain rate",
        "drained in"
    );
    for r in &report.runs {
        println!(
            "{:<14} {:>10}/s {:>6.1} MiB/s {:>6.1} MiB/s {:>6.2} {:>10} {:>5.1} MiB/s {:>8.1} s",
            r.governor,
            bytes(r.drain_budget_bytes_per_sec),
            r.foreground_alone_mib_per_sec,
            r.foreground_during_drain_mib_per_sec,
            r.foreground_during_drain_mib_per_sec / r.foreground_alone_mib_per_sec.max(1e-9),
            bytes(r.moved_bytes),
            r.drain_mib_per_sec,
            r.drain_seconds
        );
    }
    Ok(())
}
