//! Maintenance commands: `shoal ok-to-stop`, `drain`, `undrain`, `remove`,
//! `maintenance enter/exit`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use indicatif::ProgressBar;
use shoal_agent_api::{
    AgentClient, ApiError, DEFAULT_SOCKET, DrainPlan, DrainProgress, Failure, FailureKind,
    OkToStopNodes, Request, Response, SOCKET_ENV,
};

use crate::failure::{invalid, not_found};
use crate::progress;
use crate::status::{bytes, span};

/// One request to the local agent, on a runtime of its own; the agent's failure as an
/// error of its kind.
pub(crate) fn call(socket: &Path, request: Request) -> anyhow::Result<Response> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let response = rt.block_on(async {
        let mut client = AgentClient::connect(socket).await?;
        client.call(&request).await
    })?;
    // A failure keeps its kind for the exit code and `--json` (`crate::failure`).
    Ok(response.into_result()?)
}

/// `shoal drain` arguments.
#[derive(clap::Args)]
pub struct DrainArgs {
    /// NODE (its name or 16-hex-digit id), or `status [NODE]`.
    #[arg(required = true, num_args = 1..=2, value_name = "NODE | status [NODE]")]
    pub args: Vec<String>,
    /// Only show what would move where, and whether the drain can finish.
    #[arg(long)]
    pub dry_run: bool,
    /// Wait until the node is drained, showing progress.
    #[arg(long)]
    pub wait: bool,
    #[arg(long, env = SOCKET_ENV, default_value = DEFAULT_SOCKET)]
    pub socket: PathBuf,
    /// JSON output.
    #[arg(long)]
    pub json: bool,
}

/// `shoal drain NODE [--dry-run] [--wait]` or `shoal drain status [NODE]`.
pub fn drain(a: &DrainArgs) -> anyhow::Result<()> {
    let (first, second) = (a.args[0].as_str(), a.args.get(1).cloned());
    if first == "status" {
        if a.dry_run || a.wait {
            return Err(invalid("drain status takes neither --dry-run nor --wait"));
        }
        let drains = drain_status(&a.socket, second)?;
        if a.json {
            println!("{}", serde_json::to_string_pretty(&drains)?);
        } else if drains.is_empty() {
            println!("no node is draining or drained");
        } else {
            for d in &drains {
                println!("{}", progress_line(d));
            }
        }
        return Ok(());
    }
    if second.is_some() {
        return Err(invalid("drain takes one NODE (or `status [NODE]`)"));
    }
    if a.wait && !a.dry_run {
        let now = drain_status(&a.socket, Some(first.to_owned()))?;
        if let Some(d) = now
            .iter()
            .find(|d| d.state == "draining" || d.state == "drained")
        {
            println!("{} is already {}", first, d.state);
            return wait_drained(&a.socket, &d.node, a.json);
        }
    }
    let response = call(
        &a.socket,
        Request::Drain {
            node: first.to_owned(),
            dry_run: a.dry_run,
        },
    )?;
    let Response::Drain(plan) = response else {
        anyhow::bail!("unexpected answer from the agent: {response:?}");
    };
    if a.json && !a.wait {
        println!("{}", serde_json::to_string_pretty(&plan)?);
    } else {
        print!("{}", render_plan(&plan));
    }
    if !plan.can_finish && !plan.dry_run {
        return Err(NotOk.into());
    }
    if a.wait && plan.started {
        return wait_drained(&a.socket, &plan.node, a.json);
    }
    Ok(())
}

fn drain_status(socket: &Path, node: Option<String>) -> anyhow::Result<Vec<DrainProgress>> {
    match call(socket, Request::DrainStatus { node })? {
        Response::Drains(d) => Ok(d),
        other => anyhow::bail!("unexpected answer from the agent: {other:?}"),
    }
}

/// Polls the drain of `node` until it is drained: an indicatif bar on a terminal, a plain
/// line every 5 s otherwise.
fn wait_drained(socket: &Path, node: &str, json: bool) -> anyhow::Result<()> {
    let bar = if json {
        ProgressBar::hidden()
    } else {
        progress::bar(1)
    };
    let plain = !json && bar.is_hidden();
    let mut lines = progress::Plain::every(Duration::from_secs(5));
    loop {
        let drains = drain_status(socket, Some(node.to_owned()))?;
        let Some(d) = drains.into_iter().next() else {
            return Err(not_found(format!("node {node} is no longer in the layout")));
        };
        match d.state.as_str() {
            "drained" => {
                if json {
                    println!("{}", serde_json::to_string_pretty(&d)?);
                } else if plain {
                    println!("{}", progress_line(&d));
                } else {
                    show_on_bar(&bar, &d);
                    bar.finish();
                }
                return Ok(());
            }
            "draining" => {}
            // Undrained meanwhile: a drain that cannot finish.
            other => {
                bar.abandon();
                return Err(Failure::new(
                    FailureKind::Refused,
                    format!("the drain of {node} ended: the node is {other} now"),
                )
                .into());
            }
        }
        if plain {
            if lines.due() {
                println!("{}", progress_line(&d));
            }
        } else {
            show_on_bar(&bar, &d);
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// The drain on the bar: bytes moved of the total, the figures beside it.
fn show_on_bar(bar: &ProgressBar, d: &DrainProgress) {
    let moved = d.bytes_total.saturating_sub(d.bytes_left);
    // An empty drain is a full bar.
    bar.set_length(d.bytes_total.max(1));
    bar.set_position(if d.bytes_total == 0 { 1 } else { moved });
    bar.set_prefix(format!("{}: ", drain_who(d)));
    bar.set_message(drain_figures(d));
}

/// The node as people know it: its name, else its id.
fn drain_who(d: &DrainProgress) -> &str {
    if d.name.is_empty() { &d.node } else { &d.name }
}

/// `12/40 stripes, 1.2GiB/4.0GiB moved, 80.0MiB/s, ETA 35s`.
fn drain_figures(d: &DrainProgress) -> String {
    let moved_b = d.bytes_total.saturating_sub(d.bytes_left);
    let moved_s = d.stripes_total.saturating_sub(d.stripes_left);
    let eta = match (d.state.as_str(), d.eta_seconds) {
        ("drained", _) => "drained".to_owned(),
        (_, Some(s)) => format!("ETA {}", span(s * 1000)),
        (_, None) => "ETA -".to_owned(),
    };
    format!(
        "{moved_s}/{} stripes, {}/{} moved, {}/s, {eta}",
        d.stripes_total,
        bytes(moved_b),
        bytes(d.bytes_total),
        bytes(d.bytes_per_sec),
    )
}

/// One line for `drain status` and for `--wait` off a terminal:
/// `name: 30%, 12/40 stripes, 1.2GiB/4.0GiB moved, 80.0MiB/s, ETA 35s`.
fn progress_line(d: &DrainProgress) -> String {
    let moved = d.bytes_total.saturating_sub(d.bytes_left);
    format!(
        "{}: {}%, {}",
        drain_who(d),
        progress::percent(moved, d.bytes_total),
        drain_figures(d)
    )
}

fn render_plan(p: &DrainPlan) -> String {
    let who = if p.name.is_empty() {
        p.node.clone()
    } else {
        format!("{} ({})", p.name, p.node)
    };
    let mut out = if p.started {
        format!("draining {who}: ")
    } else if p.dry_run {
        format!("drain of {who} (dry run): ")
    } else {
        format!("NOT draining {who}: ")
    };
    out.push_str(&format!(
        "{} stripe(s), {} of shards to move\n",
        p.stripes,
        bytes(p.bytes)
    ));
    for t in &p.targets {
        let name = if t.name.is_empty() { &t.node } else { &t.name };
        out.push_str(&format!(
            "  -> {name}: {} shard(s), {}\n",
            t.shards,
            bytes(t.bytes)
        ));
    }
    if p.can_finish {
        if p.dry_run {
            out.push_str("it can finish\n");
        }
    } else {
        out.push_str("it cannot finish:\n");
        for r in &p.reasons {
            out.push_str(&format!("  - {r}\n"));
        }
    }
    out
}

/// `shoal undrain`, `remove`, `maintenance enter/exit`: prints what the agent did (with
/// `json`, as `{"message": ...}`).
pub fn change(socket: &Path, request: Request, json: bool) -> anyhow::Result<()> {
    match call(socket, request)? {
        Response::Done(text) if json => {
            println!("{}", serde_json::json!({ "message": text }));
            Ok(())
        }
        Response::Done(text) => {
            println!("{text}");
            Ok(())
        }
        other => anyhow::bail!("unexpected answer from the agent: {other:?}"),
    }
}

/// The answer was "no" (not ok to stop, a drain that cannot finish): already printed; the
/// process exits 1 without an error line.
#[derive(Debug, thiserror::Error)]
#[error("refused")]
pub struct NotOk;

/// `shoal ok-to-stop NODE [NODE...]`: prints the assessment of stopping the nodes
/// together; `Err(NotOk)` when that is not safe.
pub fn ok_to_stop(socket: &Path, nodes: &[String], json: bool) -> anyhow::Result<()> {
    let r = ask_ok_to_stop(socket, nodes)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print!("{}", render(&r));
    }
    if r.ok { Ok(()) } else { Err(NotOk.into()) }
}

/// The agent's assessment. An agent of an older release, still running while a rolling
/// upgrade installs this CLI beside it, refuses this client's version: one of protocol 9
/// is asked the same in its version (by [`AgentClient::call`]); one of 5 to 8 is asked
/// in its own form when one node is named, and a batch is an error (it could only judge
/// each node as if it stopped alone).
fn ask_ok_to_stop(socket: &Path, nodes: &[String]) -> anyhow::Result<OkToStopNodes> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let asked = Request::OkToStopNodes {
        nodes: nodes.to_vec(),
    };
    let response = match rt
        .block_on(async { AgentClient::connect(socket).await?.call(&asked).await })
    {
        Err(ApiError::Version { got, .. }) if (OK_TO_STOP_ONE..OK_TO_STOP_NODES).contains(&got) => {
            let [node] = nodes else {
                return Err(invalid(format!(
                    "the agent speaks protocol {got}, which judges one node at a time: it cannot say whether {} may stop together (upgrade the agent first, or ask for one node)",
                    nodes.join(", ")
                )));
            };
            let one = Request::OkToStop { node: node.clone() };
            rt.block_on(async { AgentClient::connect(socket).await?.call_as(got, &one).await })?
        }
        other => other?,
    };
    match response.into_result()? {
        Response::OkToStopNodes(r) => Ok(*r),
        Response::OkToStop(r) => Ok((*r).into()),
        other => anyhow::bail!("unexpected answer from the agent: {other:?}"),
    }
}

/// The protocol versions that brought the one-node `OkToStop` and the batch.
const OK_TO_STOP_ONE: u8 = 5;
const OK_TO_STOP_NODES: u8 = 9;

fn render(r: &OkToStopNodes) -> String {
    let who = r
        .nodes
        .iter()
        .map(|n| {
            let state = if n.alive { "" } else { ", down already" };
            match n.domain.as_str() {
                "" => format!("{} ({}{state})", n.name, n.node),
                d => format!("{} ({} in {d}{state})", n.name, n.node),
            }
        })
        .collect::<Vec<_>>()
        .join(", ");
    let together = if r.nodes.len() > 1 { " together" } else { "" };
    let mut out = if r.ok {
        format!(
            "ok to stop {who}{together}: the {} stripe(s) with a shard on {} keep at least k+1 shards available; the metadata group keeps {} of {} voters\n",
            r.stripes_on_nodes,
            if r.nodes.len() > 1 { "them" } else { "it" },
            r.voters_alive_after,
            r.voters
        )
    } else {
        format!("NOT ok to stop {who}{together}:\n")
    };
    for reason in &r.reasons {
        out.push_str(&format!("  - {reason}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use shoal_agent_api::{OkToStop, StopNode};

    use super::*;

    fn stop_node(id: &str, name: &str, domain: &str) -> StopNode {
        StopNode {
            node: id.into(),
            name: name.into(),
            domain: domain.into(),
            alive: true,
        }
    }

    #[test]
    fn a_refusal_lists_its_reasons() {
        let r = OkToStopNodes {
            nodes: vec![stop_node("00000000000000a1", "gpu07", "")],
            ok: false,
            reasons: vec!["3 stripe(s) would be left with only k shards".into()],
            ..OkToStopNodes::default()
        };
        let text = render(&r);
        assert!(
            text.starts_with("NOT ok to stop gpu07 (00000000000000a1):"),
            "{text}"
        );
        assert!(text.contains("  - 3 stripe(s)"), "{text}");
    }

    #[test]
    fn a_batch_is_named_as_one_stop() {
        let r = OkToStopNodes {
            nodes: vec![
                stop_node("00000000000000a1", "gpu07", "rack-a"),
                stop_node("00000000000000a2", "gpu08", "rack-a"),
            ],
            ok: false,
            reasons: vec!["the metadata group would keep 1 of 3 voters alive".into()],
            ..OkToStopNodes::default()
        };
        let text = render(&r);
        assert!(
            text.starts_with(
                "NOT ok to stop gpu07 (00000000000000a1 in rack-a), gpu08 (00000000000000a2 in rack-a) together:"
            ),
            "{text}"
        );
    }

    /// An agent of protocol `old` refuses a frame of this client's version and answers in
    /// its own; the one-node form asked in version 8 it answers, and from version 9 the
    /// batch.
    async fn older_agent(listener: tokio::net::UnixListener, old: u8) {
        use shoal_agent_api::frame::{read_any_frame, write_frame_as};
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let answer = match read_any_frame::<_, Request>(&mut stream).await {
                Ok(Some((9, Request::OkToStopNodes { nodes }))) if old == 9 => {
                    let r = OkToStopNodes {
                        nodes: nodes
                            .iter()
                            .map(|n| stop_node("00000000000000a1", n, ""))
                            .collect(),
                        ok: false,
                        voters: 3,
                        voters_alive_after: 1,
                        ..OkToStopNodes::default()
                    };
                    Response::OkToStopNodes(Box::new(r))
                }
                Ok(Some((8, Request::OkToStop { node }))) if old == 8 => {
                    Response::OkToStop(Box::new(OkToStop {
                        node: "00000000000000a1".into(),
                        name: node,
                        ok: true,
                        voters: 3,
                        voters_alive_after: 2,
                        ..OkToStop::default()
                    }))
                }
                Ok(Some((v, _))) => {
                    Response::Error(format!("this agent speaks protocol {old}, the client {v}"))
                }
                _ => continue,
            };
            let _ = write_frame_as(&mut stream, old, &answer).await;
        }
    }

    /// The socket of a fake agent of protocol `old`, served on `rt`.
    fn serve_older_agent(rt: &tokio::runtime::Runtime, old: u8) -> PathBuf {
        let socket = std::env::temp_dir().join(format!(
            "shoal-older-agent-{old}-{}.sock",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&socket);
        let listener = rt
            .block_on(async { tokio::net::UnixListener::bind(&socket) })
            .expect("bind");
        rt.spawn(older_agent(listener, old));
        socket
    }

    #[test]
    fn an_agent_of_protocol_9_is_asked_the_batch_in_its_version() {
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        let socket = serve_older_agent(&rt, 9);
        let r = ask_ok_to_stop(&socket, &["gpu07".into(), "gpu08".into()]).expect("a batch");
        assert!(!r.ok && r.voters_alive_after == 1, "{r:?}");
        assert_eq!(r.nodes.len(), 2);
        // Its failures come without a kind: exit 2, as they always did.
        let e = call(&socket, Request::Undrain { node: "n".into() }).expect_err("refused");
        let f = crate::failure::failure_of(&e);
        assert_eq!(f.kind, FailureKind::Unknown);
        assert_eq!(crate::failure::exit_code(f.kind), 2);
        let _ = std::fs::remove_file(&socket);
    }

    #[test]
    fn an_older_agent_is_asked_about_one_node_in_its_form_and_refuses_a_batch() {
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        let socket = serve_older_agent(&rt, 8);
        let r = ask_ok_to_stop(&socket, &["gpu07".into()]).expect("one node");
        assert!(r.ok && r.voters_alive_after == 2, "{r:?}");
        assert_eq!(r.nodes[0].name, "gpu07");
        let err = ask_ok_to_stop(&socket, &["gpu07".into(), "gpu08".into()])
            .expect_err("a batch")
            .to_string();
        assert!(
            err.contains("protocol 8") && err.contains("gpu07, gpu08"),
            "{err}"
        );
        let _ = std::fs::remove_file(&socket);
    }

    #[test]
    fn a_drain_shows_moved_of_total_with_rate_and_eta() {
        let d = DrainProgress {
            node: "00000000000000a1".into(),
            name: "gpu07".into(),
            state: "draining".into(),
            stripes_total: 40,
            bytes_total: 40 << 20,
            stripes_left: 30,
            bytes_left: 30 << 20,
            bytes_per_sec: 1 << 20,
            eta_seconds: Some(30),
            running_ms: 10_000,
        };
        let line = progress_line(&d);
        assert!(line.starts_with("gpu07: 25%, "), "{line}");
        assert!(line.contains("10/40 stripes"), "{line}");
        assert!(line.contains("ETA 30s"), "{line}");
    }

    /// An agent whose drain of gpu07 moves 10 MiB of 40 a poll, then says drained (or
    /// undrained, when `undrain_at` is reached first).
    async fn draining_agent(listener: tokio::net::UnixListener, undrain_at: u64) {
        use shoal_agent_api::frame::{read_frame, write_frame};
        let mut polls = 0u64;
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let Ok(Some(Request::DrainStatus { .. })) = read_frame(&mut stream).await else {
                continue;
            };
            polls += 1;
            let left = 40u64.saturating_sub(polls * 10);
            let state = match (left, polls >= undrain_at) {
                (_, true) => "active",
                (0, _) => "drained",
                _ => "draining",
            };
            let d = DrainProgress {
                node: "00000000000000a1".into(),
                name: "gpu07".into(),
                state: state.into(),
                stripes_total: 40,
                bytes_total: 40 << 20,
                stripes_left: left,
                bytes_left: left << 20,
                bytes_per_sec: 10 << 20,
                eta_seconds: Some(left / 10),
                running_ms: polls * 1000,
            };
            let _ = write_frame(&mut stream, &Response::Drains(vec![d])).await;
        }
    }

    fn serve_draining_agent(rt: &tokio::runtime::Runtime, undrain_at: u64) -> PathBuf {
        let socket = std::env::temp_dir().join(format!(
            "shoal-draining-agent-{undrain_at}-{}.sock",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&socket);
        let listener = rt
            .block_on(async { tokio::net::UnixListener::bind(&socket) })
            .expect("bind");
        rt.spawn(draining_agent(listener, undrain_at));
        socket
    }

    /// `drain --wait` follows the drain to its end (on a terminal as a bar, here as plain
    /// lines), and a drain undone meanwhile is a refusal (exit 1).
    #[test]
    fn waiting_on_a_drain_follows_it_to_the_end_or_its_undoing() {
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        let socket = serve_draining_agent(&rt, u64::MAX);
        wait_drained(&socket, "gpu07", false).expect("drained");
        let _ = std::fs::remove_file(&socket);
        let socket = serve_draining_agent(&rt, 2);
        let e = wait_drained(&socket, "gpu07", false).expect_err("undrained");
        let f = crate::failure::failure_of(&e);
        assert_eq!(f.kind, FailureKind::Refused, "{e}");
        assert!(f.message.contains("the node is active now"), "{e}");
        let _ = std::fs::remove_file(&socket);
    }
}
