//! `shoal dev-cluster`: N agents on 127.0.0.x on one machine, for trying shoal and for tests.
//!
//! Layout under `DIR`: `ca/` (cluster CA and gossip secret), and per node `nodeN/` with
//! `agent.toml`, `tls/`, `data/`, `agent.log`, `agent.pid` and `agent.sock`.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use shoal_agent_api::{AgentClient, MemberState, Request, Response};

use crate::cert;

/// Options of `dev-cluster up`.
pub struct UpOptions {
    pub nodes: u8,
    pub dir: PathBuf,
    pub base_ip: Ipv4Addr,
    pub gossip_port: u16,
    pub rpc_port: u16,
    pub metrics_port: u16,
    pub failure_domains: u8,
    pub agent_bin: Option<PathBuf>,
    pub timeout: Duration,
    /// `[resources]` for every node, if any.
    pub reserve: Option<Reserve>,
    /// `[storage] capacity` of every node (the shard store's fill limit), if given.
    pub store_capacity: Option<String>,
    /// `mesh.bulk`: "secure", "crc" or "off".
    pub bulk: String,
    /// `[storage] direct_io`.
    pub direct_io: bool,
    pub bulk_port: u16,
}

/// A reservation for each dev-cluster node (all share the machine, so keep it small).
#[derive(Clone)]
pub struct Reserve {
    pub cpus: Option<String>,
    pub cpu_cores: Option<f64>,
    pub memory: String,
    pub best_effort: bool,
}

pub fn node_dir(dir: &Path, i: u8) -> PathBuf {
    dir.join(format!("node{i}"))
}

fn node_ip(base: Ipv4Addr, i: u8) -> anyhow::Result<Ipv4Addr> {
    let [a, b, c, d] = base.octets();
    let last = d
        .checked_add(i - 1)
        .filter(|l| *l < 255)
        .with_context(|| format!("--base-ip {base}: no room for {i} nodes in the last octet"))?;
    Ok(Ipv4Addr::new(a, b, c, last))
}

pub fn up(opts: &UpOptions) -> anyhow::Result<()> {
    if opts.nodes == 0 {
        bail!("--nodes must be at least 1");
    }
    if opts.failure_domains == 0 {
        bail!("--failure-domains must be at least 1");
    }
    let dir = std::path::absolute(&opts.dir)?;
    let agent_bin = find_agent_bin(opts.agent_bin.as_deref())?;
    let ca_dir = dir.join("ca");
    if !ca_dir.join(cert::CA_CERT).exists() {
        cert::init(&ca_dir, "dev-cluster")?;
    }
    let ips: Vec<Ipv4Addr> = (1..=opts.nodes)
        .map(|i| node_ip(opts.base_ip, i))
        .collect::<anyhow::Result<_>>()?;
    let seeds: Vec<String> = ips
        .iter()
        .map(|ip| format!("\"{ip}:{}\"", opts.gossip_port))
        .collect();
    let mut started = Vec::new();
    for (i, ip) in (1..=opts.nodes).zip(&ips) {
        let nd = node_dir(&dir, i);
        std::fs::create_dir_all(nd.join("data"))?;
        if !nd.join("tls").join(cert::NODE_CERT).exists() {
            cert::issue(
                &ca_dir,
                &format!("node{i}"),
                &[IpAddr::V4(*ip)],
                &nd.join("tls"),
            )?;
        }
        let config = render_config(opts, &dir, i, *ip, &seeds);
        std::fs::write(nd.join("agent.toml"), config)?;
        if running_pid(&nd).is_some() {
            println!("node{i}: already running");
            continue;
        }
        match spawn_agent(&agent_bin, &nd) {
            Ok(pid) => started.push((i, pid)),
            Err(e) => {
                stop_all(&dir, opts.nodes);
                return Err(e.context(format!("starting node{i}")));
            }
        }
    }
    if let Err(e) = wait_converged(&dir, opts.nodes, opts.timeout) {
        for i in 1..=opts.nodes {
            let log = node_dir(&dir, i).join("agent.log");
            let tail = std::fs::read_to_string(&log).unwrap_or_default();
            let tail: Vec<&str> = tail.lines().rev().take(5).collect();
            eprintln!("--- node{i} ({}) last lines:", log.display());
            for l in tail.iter().rev() {
                eprintln!("{l}");
            }
        }
        stop_all(&dir, opts.nodes);
        return Err(e);
    }
    println!(
        "shoal dev cluster of {} nodes is up in {} (nodes {}..{})",
        opts.nodes,
        dir.display(),
        ips[0],
        ips[ips.len() - 1]
    );
    println!(
        "  export SHOAL_SOCKET={}",
        node_dir(&dir, 1).join("agent.sock").display()
    );
    println!("  shoal status");
    println!("  shoal dev-cluster down --dir {}", dir.display());
    Ok(())
}

fn render_config(opts: &UpOptions, dir: &Path, i: u8, ip: Ipv4Addr, seeds: &[String]) -> String {
    let nd = node_dir(dir, i);
    let ca = dir.join("ca");
    let tls = nd.join("tls");
    let domain = (i - 1) % opts.failure_domains + 1;
    format!(
        r#"# Written by `shoal dev-cluster up`; rewritten at every `up`.
[node]
name = "node{i}"
data_dir = "{data}"
failure_domain = "fd{domain}"

[mesh]
addr = "{ip}"
gossip_port = {gossip}
rpc_port = {rpc}
bulk_port = {bulk_port}
bulk = "{bulk}"
seeds = [{seeds}]

[tls]
ca_cert = "{ca_cert}"
node_cert = "{node_cert}"
node_key = "{node_key}"
cluster_key = "{cluster_key}"

[admin]
socket = "{socket}"

[metrics]
addr = "{ip}:{metrics}"

[log]
format = "text"
level = "info"

[storage]
capacity = "{capacity}"
direct_io = {direct_io}
{resources}"#,
        data = nd.join("data").display(),
        gossip = opts.gossip_port,
        rpc = opts.rpc_port,
        bulk_port = opts.bulk_port,
        bulk = opts.bulk,
        seeds = seeds.join(", "),
        ca_cert = ca.join(cert::CA_CERT).display(),
        node_cert = tls.join(cert::NODE_CERT).display(),
        node_key = tls.join(cert::NODE_KEY).display(),
        cluster_key = ca.join(cert::CLUSTER_KEY).display(),
        socket = nd.join("agent.sock").display(),
        metrics = opts.metrics_port,
        resources = opts
            .reserve
            .as_ref()
            .map(|r| render_reserve(r, ip))
            .unwrap_or_default(),
        capacity = opts.store_capacity.as_deref().unwrap_or("90%"),
        direct_io = opts.direct_io,
    )
}

fn render_reserve(r: &Reserve, ip: Ipv4Addr) -> String {
    let mut text = String::from("\n[resources]\n");
    if let Some(c) = &r.cpus {
        text += &format!("cpus = \"{c}\"\n");
    }
    if let Some(c) = r.cpu_cores {
        text += &format!("cpu_cores = {c}\n");
    }
    text += &format!("memory = \"{}\"\n", r.memory);
    // Every dev node shares one machine: the floor is the machine's business, not theirs.
    text += "min_free_cores = 0.0\nmin_free_memory = \"0\"\n";
    // Unique per node, so clusters on other addresses never collide.
    text += &format!("cgroup = \"shoal-dev-{ip}\"\n");
    if r.best_effort {
        text += "enforcement = \"best-effort\"\n";
    }
    text
}

/// The agent binary: `--agent-bin`, else `SHOAL_AGENT_BIN`, else next to this executable,
/// else `shoal-agent` on PATH.
fn find_agent_bin(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(p) = explicit {
        return Ok(p.to_owned());
    }
    if let Some(p) = std::env::var_os("SHOAL_AGENT_BIN") {
        return Ok(PathBuf::from(p));
    }
    if let Ok(me) = std::env::current_exe() {
        let sibling = me.with_file_name("shoal-agent");
        if sibling.is_file() {
            return Ok(sibling);
        }
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join("shoal-agent"))
        .find(|p| p.is_file())
        .context("shoal-agent not found: pass --agent-bin or put it next to shoal or on PATH")
}

fn spawn_agent(bin: &Path, nd: &Path) -> anyhow::Result<i32> {
    use std::os::unix::process::CommandExt;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(nd.join("agent.log"))?;
    let child = Command::new(bin)
        .arg("--config")
        .arg(nd.join("agent.toml"))
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        // Own process group: a Ctrl-C in the terminal that ran `up` does not reach agents.
        .process_group(0)
        .spawn()
        .with_context(|| format!("cannot run {}", bin.display()))?;
    let pid = child.id() as i32;
    std::fs::write(nd.join("agent.pid"), format!("{pid}\n"))?;
    Ok(pid)
}

/// The pid in `nd/agent.pid` if that process is alive.
pub fn running_pid(nd: &Path) -> Option<Pid> {
    let text = std::fs::read_to_string(nd.join("agent.pid")).ok()?;
    let pid = Pid::from_raw(text.trim().parse().ok()?);
    kill(pid, None).ok().map(|_| pid)
}

fn wait_converged(dir: &Path, nodes: u8, timeout: Duration) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let deadline = Instant::now() + timeout;
    let mut missing: Vec<String>;
    loop {
        missing = Vec::new();
        for i in 1..=nodes {
            let sock = node_dir(dir, i).join("agent.sock");
            let alive = rt.block_on(alive_count(&sock));
            if alive != Some(nodes as usize) {
                missing.push(format!(
                    "node{i} sees {}",
                    alive.map_or("nothing (not answering)".into(), |n| format!("{n} alive"))
                ));
            }
        }
        if missing.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "cluster did not converge within {timeout:?}: {}",
                missing.join(", ")
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

async fn alive_count(sock: &Path) -> Option<usize> {
    let mut client = AgentClient::connect(sock).await.ok()?;
    match client.call(&Request::Status).await.ok()? {
        Response::Status(r) => Some(
            r.nodes
                .iter()
                .filter(|n| n.state == MemberState::Alive)
                .count(),
        ),
        _ => None,
    }
}

/// Stops every node of the cluster in `dir` (SIGTERM, then SIGKILL after 10 s).
pub fn down(dir: &Path) -> anyhow::Result<()> {
    let mut count = 0u8;
    let mut stopped = 0;
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))? {
        let name = entry?.file_name();
        let Some(i) = name
            .to_str()
            .and_then(|n| n.strip_prefix("node"))
            .and_then(|n| n.parse::<u8>().ok())
        else {
            continue;
        };
        count = count.max(i);
        if stop_node(&node_dir(dir, i)) {
            stopped += 1;
        }
    }
    if count == 0 {
        bail!("{} holds no dev cluster", dir.display());
    }
    println!("stopped {stopped} agent(s)");
    Ok(())
}

fn stop_all(dir: &Path, nodes: u8) {
    for i in 1..=nodes {
        stop_node(&node_dir(dir, i));
    }
}

/// Stops the agent of one node directory; true if one was running.
pub fn stop_node(nd: &Path) -> bool {
    let Some(pid) = running_pid(nd) else {
        let _ = std::fs::remove_file(nd.join("agent.pid"));
        return false;
    };
    let _ = kill(pid, Signal::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(10);
    while kill(pid, None).is_ok() && !is_zombie(pid) {
        if Instant::now() > deadline {
            let _ = kill(pid, Signal::SIGKILL);
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = std::fs::remove_file(nd.join("agent.pid"));
    true
}

/// A child of ours that exited but was not reaped still answers signal 0.
fn is_zombie(pid: Pid) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit(')')
                .next()
                .is_some_and(|rest| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(true)
}
