//! `shoal status`: renders the agent's [`StatusReport`] as a table or JSON.

use std::fmt::Write;

use shoal_agent_api::{MemberStatus, StatusReport};
/// Bytes for people, in binary units with one decimal ("1.5KiB").
pub use shoal_units::format_size as bytes;

pub fn render_table(report: &StatusReport) -> String {
    let header = [
        "ID",
        "NAME",
        "ADDR",
        "DOMAIN",
        "STATE",
        "LAYOUT",
        "GEN",
        "USED/CAPACITY",
        "VERSION",
        "HEARD",
        "RTT",
    ];
    let rows: Vec<[String; 11]> = report.nodes.iter().map(row).collect();
    let mut widths = header.map(str::len);
    for r in &rows {
        for (w, cell) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell.len());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &[String]| {
        let text: Vec<String> = cells
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        let _ = writeln!(out, "{}", text.join("  ").trim_end());
    };
    line(&header.map(String::from));
    for r in &rows {
        line(r);
    }
    let alive = report
        .nodes
        .iter()
        .filter(|n| n.state == shoal_agent_api::MemberState::Alive)
        .count();
    let _ = writeln!(
        out,
        "\n{alive}/{} alive (as seen by {}; a crashed node is marked down within {:.1} s)",
        report.nodes.len(),
        report.node,
        report.detection_bound_ms as f64 / 1000.0
    );
    render_node_resources(&mut out, report);
    out
}

fn render_node_resources(out: &mut String, report: &StatusReport) {
    render_reservation(out, report);
    let st = &report.store;
    let _ = writeln!(
        out,
        "store: {} shards, {} of {} fill limit",
        st.shards,
        bytes(st.used_bytes),
        bytes(st.limit_bytes)
    );
    render_meta(out, report);
    render_redundancy(out, report);
    render_scrub(out, report);
    render_gpu_and_budget(out, report);
    render_workers(out, &report.workers);
}

/// A duration in its two largest units ("2m10s", "1h05m", "45s").
pub fn span(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86_400 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{:02}h", s / 86_400, (s % 86_400) / 3600),
    }
}

fn render_redundancy(out: &mut String, report: &StatusReport) {
    let Some(r) = &report.redundancy else {
        let _ = writeln!(out, "redundancy: not scanned yet");
        return;
    };
    let buckets: Vec<String> = r
        .by_missing
        .iter()
        .map(|b| format!("-{}: {} ({})", b.missing, b.stripes, bytes(b.bytes)))
        .collect();
    let detail = if buckets.is_empty() {
        String::new()
    } else {
        format!(" [{}]", buckets.join(", "))
    };
    let _ = writeln!(
        out,
        "redundancy: {} stripes: {} healthy, {} degraded{detail}, {} unreadable",
        r.stripes_total, r.stripes_healthy, r.stripes_degraded, r.stripes_unreadable
    );
    if r.bytes_to_repair > 0 || r.bytes_waiting > 0 || r.repair_bytes_per_sec > 0 {
        let eta = r.eta_seconds.map_or("not repairing now".to_string(), |s| {
            format!("done in ~{}", span(s * 1000))
        });
        let mut line = format!(
            "  repair: {} to rebuild at {}/s, {eta}; {} on down nodes waits for them",
            bytes(r.bytes_to_repair),
            bytes(r.repair_bytes_per_sec),
            bytes(r.bytes_waiting)
        );
        if r.stripes_no_target > 0 {
            line.push_str(&format!(
                "; {} stripes have no node to rebuild on",
                r.stripes_no_target
            ));
        }
        let _ = writeln!(out, "{line}");
    }
    if r.rebalance_bytes > 0 {
        let _ = writeln!(
            out,
            "  rebalance: {} stripes have {} of shards to move to their placement target",
            r.rebalance_stripes,
            bytes(r.rebalance_bytes)
        );
    }
}

fn render_scrub(out: &mut String, report: &StatusReport) {
    let s = &report.scrub;
    if !s.enabled {
        let _ = writeln!(out, "scrub: off ([scrub] enabled = false)");
        return;
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let at = match (s.next_pass_unix_ms, s.last_pass_unix_ms) {
        (Some(next), _) => format!("next pass in {}", span(next.saturating_sub(now))),
        (None, _) => format!(
            "pass {} under way: {} of {} shards ({})",
            s.passes + 1,
            s.shards_checked,
            s.shards_total,
            bytes(s.bytes_checked)
        ),
    };
    let _ = writeln!(
        out,
        "scrub: {} passes done, {at}; {} corrupt shards found",
        s.passes, s.corrupt_found
    );
}

fn render_reservation(out: &mut String, report: &StatusReport) {
    let Some(r) = &report.resources else {
        let _ = writeln!(
            out,
            "reservation: none ([resources] not configured; the agent is unconfined)"
        );
        return;
    };
    let cpu = match &r.cpus {
        Some(c) => format!("cpus {c}"),
        None => format!("{:.2} cores", r.reserved_cores),
    };
    let used = match (r.memory_used_bytes, r.memory_peak_bytes) {
        (Some(u), Some(p)) => format!(", using {} (peak {})", bytes(u), bytes(p)),
        _ => String::new(),
    };
    let _ = writeln!(
        out,
        "reservation: {cpu}, memory {}{used}; training keeps {:.2} cores, {}",
        bytes(r.memory_limit_bytes),
        r.training_cores,
        bytes(r.training_memory_bytes)
    );
    match (&r.cgroup, &r.note) {
        (Some(cg), _) => {
            let _ = writeln!(out, "  enforced in {cg}");
        }
        (None, Some(note)) => {
            let _ = writeln!(out, "  NOT enforced (best-effort): {note}");
        }
        (None, None) => {}
    }
}

fn render_meta(out: &mut String, report: &StatusReport) {
    let meta = &report.meta;
    let _ = writeln!(
        out,
        "metadata: leader {}, term {}, applied {}, {} voters, {} learners, layout epoch {}, {} inodes",
        meta.leader.as_deref().unwrap_or("none"),
        meta.term,
        meta.applied.map_or("-".into(), |a| a.to_string()),
        meta.voters.len(),
        meta.learners.len(),
        meta.layout_epoch.map_or("-".into(), |e| e.to_string()),
        meta.inodes
    );
    if let Some(failed) = &meta.failed {
        let _ = writeln!(
            out,
            "metadata member FAILED (not counted on as a voter; the agent restarts): {failed}"
        );
    }
    if let Some(notice) = &meta.notice {
        let _ = writeln!(out, "metadata notice: {notice}");
    }
}

fn render_gpu_and_budget(out: &mut String, report: &StatusReport) {
    let gpu = &report.gpu;
    match (&gpu.note, gpu.utilization_percent) {
        (Some(note), _) => {
            let _ = writeln!(out, "gpu: {note}");
        }
        (None, util) => {
            let _ = writeln!(
                out,
                "gpu: {} GPU(s), {:.0}% busy, memory {}/{}",
                gpu.count,
                util.unwrap_or(0.0),
                bytes(gpu.memory_used_bytes),
                bytes(gpu.memory_total_bytes)
            );
        }
    }
    let budgets: Vec<String> = report
        .background
        .iter()
        .map(|b| {
            format!(
                "{} {}/s x{}",
                b.class,
                bytes(b.bytes_per_sec),
                b.concurrency
            )
        })
        .collect();
    let _ = writeln!(
        out,
        "background budget ({:.0}% of idle): {}",
        report.background_factor * 100.0,
        budgets.join(", ")
    );
}

/// One line per worker: its name and state, what it is at, and its last error.
fn render_workers(out: &mut String, workers: &[shoal_agent_api::WorkerStatus]) {
    if workers.is_empty() {
        return;
    }
    let _ = writeln!(out, "workers:");
    let width = workers.iter().map(|w| w.name.len()).max().unwrap_or(0);
    for w in workers {
        let mut line = format!("  {:<width$}  {}", w.name, w.state);
        if let Some(budget) = &w.waiting_for {
            line.push_str(&format!(" (waiting for the {budget} budget)"));
        }
        if let Some(p) = &w.progress {
            line.push_str(&format!(", {p}"));
        }
        if let Some(e) = &w.last_error {
            line.push_str(&format!(" (last error: {e})"));
        }
        let _ = writeln!(out, "{line}");
    }
}

fn row(n: &MemberStatus) -> [String; 11] {
    let dash = || "-".to_string();
    let id = if n.is_self {
        format!("{}*", n.id)
    } else {
        n.id.clone()
    };
    let capacity = match (n.used_bytes, n.capacity_bytes) {
        (Some(u), Some(c)) => format!("{}/{}", bytes(u), bytes(c)),
        _ => dash(),
    };
    // A store that takes no new shards says so: writers place around it.
    let capacity = match n.store_accepting {
        Some(false) => format!("{capacity} (no new shards)"),
        _ => capacity,
    };
    let heard = match (n.is_self, n.last_heard_ms) {
        (true, _) => "self".into(),
        (false, Some(ms)) => format!("{:.1}s ago", ms as f64 / 1000.0),
        (false, None) => dash(),
    };
    let rtt = n
        .rpc_rtt_us
        .map(|us| format!("{:.2}ms", us as f64 / 1000.0))
        .unwrap_or_else(dash);
    let state = match n.down_for_ms {
        Some(ms) => format!("{} {}", n.state.as_str(), span(ms)),
        None => n.state.as_str().into(),
    };
    let window = match n.maintenance_ends_in_ms {
        Some(ms) if ms >= 0 => format!(", {} left", span(ms as u64)),
        Some(ms) => format!(", OVER by {}", span(ms.unsigned_abs())),
        None => String::new(),
    };
    let layout = match (&n.layout_state, n.out_in_ms) {
        (Some(l), Some(ms)) => format!("{l}{window}, out in {}", span(ms)),
        (Some(l), None) => format!("{l}{window}"),
        (None, _) => dash(),
    };
    [
        id,
        if n.name.is_empty() {
            dash()
        } else {
            n.name.clone()
        },
        n.addr.clone(),
        n.failure_domain.clone().unwrap_or_else(dash),
        state,
        layout,
        n.generation.to_string(),
        capacity,
        n.agent_version.clone().unwrap_or_else(dash),
        heard,
        rtt,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_throttled_worker_says_which_budget_it_waits_for() {
        let workers = vec![
            shoal_agent_api::WorkerStatus {
                name: "repair".into(),
                state: "throttled".into(),
                progress: Some("3 stripes queued".into()),
                waiting_for: Some("repair".into()),
                ..Default::default()
            },
            shoal_agent_api::WorkerStatus {
                name: "scrub".into(),
                state: "idle".into(),
                ..Default::default()
            },
        ];
        let mut out = String::new();
        render_workers(&mut out, &workers);
        assert_eq!(
            out,
            "workers:\n  repair  throttled (waiting for the repair budget), 3 stripes queued\n  scrub   idle\n"
        );
    }

    #[test]
    fn spans_show_their_two_largest_units() {
        assert_eq!(span(42_000), "42s");
        assert_eq!(span(130_000), "2m10s");
        assert_eq!(span(3_900_000), "1h05m");
        assert_eq!(span(90_000_000), "1d01h");
    }

    #[test]
    fn bytes_are_human_readable() {
        assert_eq!(bytes(512), "512B");
        assert_eq!(bytes(1536), "1.5KiB");
        assert_eq!(bytes(3 << 30), "3.0GiB");
    }
}
