//! `shoal dev-cluster`: N agents on 127.0.0.x on one machine, for trying shoal and for tests.
//!
//! Layout under `DIR`: `ca/` (cluster CA and gossip secret), and per node `nodeN/` with
//! `agent.toml`, `tls/`, `data/`, `agent.log`, `agent.pid` and `agent.sock`; with
//! `--mount` also `mnt/`, `mount.log` and `mount.pid`.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use shoal_agent_api::{AgentClient, MemberState, Request, Response};

use crate::{cert, dev_mount};

/// Options of `dev-cluster up`.
#[derive(clap::Args)]
pub struct UpOptions {
    #[arg(long, default_value_t = 3)]
    pub nodes: u8,
    #[arg(long)]
    pub dir: PathBuf,
    /// Address of node 1; node N gets the next addresses.
    #[arg(long, default_value = "127.0.0.1")]
    pub base_ip: Ipv4Addr,
    #[arg(long, default_value_t = 7946)]
    pub gossip_port: u16,
    #[arg(long, default_value_t = 7947)]
    pub rpc_port: u16,
    #[arg(long, default_value_t = 9464)]
    pub metrics_port: u16,
    /// Number of failure domains the nodes are spread over (round robin).
    #[arg(long, default_value_t = 3)]
    pub failure_domains: u8,
    /// The shoal-agent binary (default: next to this one, then PATH).
    #[arg(long)]
    pub agent_bin: Option<PathBuf>,
    /// Seconds to wait for the cluster to be ready: every node sees every other, knows the
    /// metadata leader and has the cluster layout.
    #[arg(long, default_value_t = 60)]
    pub timeout: u64,
    /// Confine each agent to this memory (e.g. "512MiB"); needs root and cgroups.
    #[arg(long)]
    pub reserve_memory: Option<String>,
    /// With --reserve-memory: pin each agent to this cpuset (e.g. "0").
    #[arg(
        long,
        requires = "reserve_memory",
        conflicts_with = "reserve_cpu_cores"
    )]
    pub reserve_cpus: Option<String>,
    /// With --reserve-memory: give each agent this CPU quota in cores (default 0.5).
    #[arg(long, requires = "reserve_memory")]
    pub reserve_cpu_cores: Option<f64>,
    /// With --reserve-memory: run unconfined (with a warning) where cgroups cannot be written.
    #[arg(long, requires = "reserve_memory")]
    pub best_effort: bool,
    /// Fill limit of each node's shard store, e.g. "64MiB" or "50%".
    #[arg(long)]
    pub store_capacity: Option<String>,
    /// How shard payloads travel: secure (TLS over TCP), crc (authenticated, checksummed,
    /// unencrypted TCP) or off (QUIC only).
    #[arg(long, default_value = "secure", value_parser = ["secure", "crc", "off"])]
    pub bulk: String,
    #[arg(long, default_value_t = 7948)]
    pub bulk_port: u16,
    /// Shard files with O_DIRECT (`[storage] direct_io`).
    #[arg(long)]
    pub direct_io: bool,
    /// Also mount the filesystem of every node on nodeN/mnt (`shoal mount`).
    #[arg(long)]
    pub mount: bool,
    /// Extra `[meta]` settings for every node, as TOML `KEY=VALUE` (repeatable), e.g.
    /// `--meta orphan_shard_grace_s=5` (`bootstrap_expect` is `--nodes` unless given).
    #[arg(long = "meta", value_name = "KEY=VALUE", value_parser = parse_meta_setting)]
    pub meta: Vec<String>,
    /// Erasure-coding profile of new stripes (default: 4+2 from 6 nodes, 2+1 from 3).
    #[arg(long)]
    pub ec: Option<String>,
    /// Extra settings of the `[storage]`, `[cluster]`, `[scrub]` or `[background]` sections for every
    /// node, as `SECTION.KEY=VALUE` with a TOML value (repeatable), e.g.
    /// `--set cluster.down_out_after='"20s"'`.
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE", value_parser = parse_section_setting)]
    pub set: Vec<(String, String)>,
    /// Where cold data goes: `dir` (DIR/cold, shared by every node: the default), `s3`
    /// (the bucket the --s3-* options name) or `off` (no cold tier).
    #[arg(long, default_value = "dir", value_parser = ["dir", "s3", "off"])]
    pub tiering: String,
    /// The S3-compatible server of `--tiering s3` (`http://host:port`).
    #[arg(long, required_if_eq("tiering", "s3"))]
    pub s3_endpoint: Option<String>,
    #[arg(long, default_value = "shoal")]
    pub s3_bucket: String,
    #[arg(long, default_value = "us-east-1")]
    pub s3_region: String,
    /// A TOML file with `access_key_id` and `secret_access_key` for the bucket (without
    /// it the agents read AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY).
    #[arg(long)]
    pub s3_credentials_file: Option<PathBuf>,
    /// Environment the agents start with (benchmarks: a fake GPU).
    #[arg(skip)]
    pub agent_env: Vec<(String, String)>,
}

/// The sections `--set` may add to.
const SET_SECTIONS: [&str; 5] = ["storage", "cluster", "scrub", "background", "tiering"];

/// Checks a `--set` setting's shape: (section, "key = value").
fn parse_section_setting(s: &str) -> Result<(String, String), String> {
    let (path, _) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not SECTION.KEY=VALUE"))?;
    let (section, key) = path
        .split_once('.')
        .ok_or_else(|| format!("{s:?}: the key must name its section (SECTION.KEY)"))?;
    if !SET_SECTIONS.contains(&section.trim()) {
        return Err(format!(
            "{s:?}: --set takes the sections {}",
            SET_SECTIONS.join(", ")
        ));
    }
    let line = parse_meta_setting(&s[section.len() + 1..])?;
    if key.trim().is_empty() {
        return Err(format!("{s:?} is not SECTION.KEY=VALUE"));
    }
    Ok((section.trim().to_owned(), line))
}

/// Checks a `--meta` setting's shape; the agent checks the key and value.
fn parse_meta_setting(s: &str) -> Result<String, String> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() && !v.trim().is_empty() => {
            Ok(format!("{} = {}", k.trim(), v.trim()))
        }
        _ => Err(format!("{s:?} is not KEY=VALUE")),
    }
}

impl UpOptions {
    /// The options of a cluster of `nodes` in `dir`, every other option at its default.
    pub fn new(nodes: u8, dir: PathBuf) -> Self {
        UpOptions {
            nodes,
            dir,
            base_ip: Ipv4Addr::LOCALHOST,
            gossip_port: 7946,
            rpc_port: 7947,
            metrics_port: 9464,
            failure_domains: 3,
            agent_bin: None,
            timeout: 60,
            reserve_memory: None,
            reserve_cpus: None,
            reserve_cpu_cores: None,
            best_effort: false,
            store_capacity: None,
            bulk: "secure".into(),
            bulk_port: 7948,
            direct_io: false,
            mount: false,
            meta: Vec::new(),
            ec: None,
            set: Vec::new(),
            tiering: "dir".into(),
            s3_endpoint: None,
            s3_bucket: "shoal".into(),
            s3_region: "us-east-1".into(),
            s3_credentials_file: None,
            agent_env: Vec::new(),
        }
    }
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
    start_nodes(opts, &dir, &agent_bin, &ips, &seeds)?;
    let timeout = Duration::from_secs(opts.timeout);
    if let Err(e) = wait_converged(&dir, opts.nodes, timeout) {
        print_log_tails(&dir, opts.nodes);
        stop_all(&dir, opts.nodes);
        return Err(e);
    }
    let mountpoints = if opts.mount {
        match dev_mount::mount_all(&dir, opts.nodes, timeout) {
            Ok(m) => m,
            Err(e) => {
                stop_all(&dir, opts.nodes);
                return Err(e);
            }
        }
    } else {
        Vec::new()
    };
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
    for m in &mountpoints {
        println!("  mounted: {}", m.display());
    }
    println!("  shoal dev-cluster down --dir {}", dir.display());
    Ok(())
}

/// Writes every node's certificate (once) and config (every time), and starts each node
/// that is not running; a node that cannot start stops them all.
fn start_nodes(
    opts: &UpOptions,
    dir: &Path,
    agent_bin: &Path,
    ips: &[Ipv4Addr],
    seeds: &[String],
) -> anyhow::Result<()> {
    let ca_dir = dir.join("ca");
    let env = agent_env(&opts.agent_env, shared_worker_threads(opts.nodes));
    for (i, ip) in (1..=opts.nodes).zip(ips) {
        let nd = node_dir(dir, i);
        std::fs::create_dir_all(nd.join("data"))?;
        ensure_node_cert(&ca_dir, &nd, &format!("node{i}"), *ip)?;
        let config = render_config(opts, dir, i, *ip, seeds);
        std::fs::write(nd.join("agent.toml"), config)?;
        if running_pid(&nd).is_some() {
            println!("node{i}: already running");
            continue;
        }
        if let Err(e) = spawn_agent(agent_bin, &nd, &env) {
            stop_all(dir, opts.nodes);
            return Err(e.context(format!("starting node{i}")));
        }
    }
    Ok(())
}

/// The variable that sizes the async runtimes of the agents (see the agent's
/// `runtime_threads`) and of the mounts (tokio reads it).
const WORKER_THREADS: &str = "TOKIO_WORKER_THREADS";

/// Runtime threads for each agent and mount of a dev cluster of `nodes`: this machine's
/// CPUs shared among the nodes, at least 1. Every dev node runs on this one machine: with a
/// runtime thread per CPU in each process, the threads mostly wake each other up to take
/// turns. Measured with 6 nodes on 2 CPUs, creates through one mount: a third fewer context
/// switches and 5–15% less CPU per create with one thread each.
fn core_share(online: usize, nodes: u8) -> usize {
    (online / usize::from(nodes.max(1))).max(1)
}

/// [`WORKER_THREADS`] for the processes of a dev cluster of `nodes`, unless the caller's
/// environment sets it (then they inherit that).
pub(crate) fn shared_worker_threads(nodes: u8) -> Option<(String, String)> {
    if std::env::var_os(WORKER_THREADS).is_some() {
        return None;
    }
    let online = std::thread::available_parallelism().map_or(1, |n| n.get());
    Some((WORKER_THREADS.into(), core_share(online, nodes).to_string()))
}

/// The agents' environment: `agent_env`, and `shared` unless `agent_env` sets the same.
fn agent_env(
    agent_env: &[(String, String)],
    shared: Option<(String, String)>,
) -> Vec<(String, String)> {
    let mut env = agent_env.to_vec();
    if let Some((k, v)) = shared
        && !env.iter().any(|(key, _)| *key == k)
    {
        env.push((k, v));
    }
    env
}

/// The last lines of every node's log, to say why a start failed.
fn print_log_tails(dir: &Path, nodes: u8) {
    for i in 1..=nodes {
        let log = node_dir(dir, i).join("agent.log");
        let tail = std::fs::read_to_string(&log).unwrap_or_default();
        let tail: Vec<&str> = tail.lines().rev().take(5).collect();
        eprintln!("--- node{i} ({}) last lines:", log.display());
        for l in tail.iter().rev() {
            eprintln!("{l}");
        }
    }
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
ec = "{ec}"
{storage}
[cluster]
{cluster}
[scrub]
{scrub}
[background]
{background}
[meta]
{bootstrap_expect}{meta}
{tiering}
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
        resources = render_reserve(opts, ip),
        capacity = opts.store_capacity.as_deref().unwrap_or("90%"),
        direct_io = opts.direct_io,
        ec = opts.ec.as_deref().unwrap_or(dev_ec(opts.nodes)),
        bootstrap_expect = render_bootstrap_expect(opts),
        meta = opts.meta.join("\n"),
        storage = section_lines(opts, "storage"),
        cluster = section_lines(opts, "cluster"),
        scrub = section_lines(opts, "scrub"),
        background = section_lines(opts, "background"),
        tiering = render_tiering(opts, dir),
    )
}

/// Issues node `name`'s certificate unless it has one that names the node its data dir
/// holds: a new node gets a new id, a node whose certificate names none (made by the
/// release before certificates named their node) or another one gets one for its own id.
fn ensure_node_cert(ca_dir: &Path, nd: &Path, name: &str, ip: Ipv4Addr) -> anyhow::Result<()> {
    let pem = nd.join("tls").join(cert::NODE_CERT);
    let data_id = std::fs::read_to_string(nd.join("data").join("node_id"))
        .ok()
        .and_then(|t| cert::parse_node_id(&t).ok());
    if pem.exists() {
        let named = cert::info(&pem)?
            .node_id
            .and_then(|t| cert::parse_node_id(&t).ok());
        if named.is_some() && (data_id.is_none() || named == data_id) {
            return Ok(());
        }
    }
    cert::issue(ca_dir, name, &[IpAddr::V4(ip)], data_id, &nd.join("tls"))?;
    Ok(())
}

/// `[tiering]` for every node: one store they all share.
fn render_tiering(opts: &UpOptions, dir: &Path) -> String {
    let lines = section_lines(opts, "tiering");
    match opts.tiering.as_str() {
        "dir" => format!(
            "[tiering]\nstore = \"dir\"\ndir = \"{}\"\n{lines}",
            dir.join("cold").display()
        ),
        "s3" => {
            let mut text = format!("[tiering]\nstore = \"s3\"\n{lines}\n[tiering.s3]\n");
            if let Some(e) = &opts.s3_endpoint {
                text += &format!("endpoint = \"{e}\"\n");
            }
            text += &format!(
                "bucket = \"{}\"\nregion = \"{}\"\n",
                opts.s3_bucket, opts.s3_region
            );
            if let Some(c) = &opts.s3_credentials_file {
                text += &format!("credentials_file = \"{}\"\n", c.display());
            }
            text
        }
        _ => String::new(),
    }
}

/// `bootstrap_expect = NODES`, unless a `--meta` setting gives it (a cluster that waits
/// for more nodes than this `up` starts).
fn render_bootstrap_expect(opts: &UpOptions) -> String {
    let given = opts.meta.iter().any(|l| {
        l.split_once('=')
            .is_some_and(|(k, _)| k.trim() == "bootstrap_expect")
    });
    if given {
        String::new()
    } else {
        format!("bootstrap_expect = {}\n", opts.nodes)
    }
}

/// The `--set` lines of one section, each ending its line.
fn section_lines(opts: &UpOptions, section: &str) -> String {
    opts.set
        .iter()
        .filter(|(s, _)| s == section)
        .map(|(_, line)| format!("{line}\n"))
        .collect()
}

/// The erasure-coding profile a dev cluster of `nodes` can place: every shard of a
/// stripe on its own node.
fn dev_ec(nodes: u8) -> &'static str {
    match nodes {
        6.. => "4+2",
        3..=5 => "2+1",
        _ => "1+0",
    }
}

/// `[resources]` for a node, when `--reserve-memory` is given. Every dev node shares one
/// machine, so the training floor is the machine's business, not theirs.
fn render_reserve(opts: &UpOptions, ip: Ipv4Addr) -> String {
    let Some(memory) = &opts.reserve_memory else {
        return String::new();
    };
    let mut text = String::from("\n[resources]\n");
    match (&opts.reserve_cpus, opts.reserve_cpu_cores) {
        (Some(c), _) => text += &format!("cpus = \"{c}\"\n"),
        (None, c) => text += &format!("cpu_cores = {}\n", c.unwrap_or(0.5)),
    }
    text += &format!("memory = \"{memory}\"\n");
    text += "min_free_cores = 0.0\nmin_free_memory = \"0\"\n";
    // Unique per node, so clusters on other addresses never collide.
    text += &format!("cgroup = \"shoal-dev-{ip}\"\n");
    if opts.best_effort {
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

fn spawn_agent(bin: &Path, nd: &Path, env: &[(String, String)]) -> anyhow::Result<i32> {
    use std::os::unix::process::CommandExt;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(nd.join("agent.log"))?;
    let child = Command::new(bin)
        .arg("--config")
        .arg(nd.join("agent.toml"))
        .envs(env.iter().map(|(k, v)| (k, v)))
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
    running_pid_in(nd, "agent.pid")
}

/// The pid in `nd/pid_file` if that process is alive (a killed process that nobody has
/// reaped yet is not).
pub fn running_pid_in(nd: &Path, pid_file: &str) -> Option<Pid> {
    let text = std::fs::read_to_string(nd.join(pid_file)).ok()?;
    let pid = Pid::from_raw(text.trim().parse().ok()?);
    (kill(pid, None).is_ok() && !is_zombie(pid)).then_some(pid)
}

/// Waits until every node sees every other alive with its facts, knows the metadata
/// leader and has the cluster layout: a cluster `up` returns from takes writes through
/// any node, and a node that dies now no longer keeps the group from forming. Says what
/// it waits for every few seconds, and in the error once `timeout` passed.
fn wait_converged(dir: &Path, nodes: u8, timeout: Duration) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let start = Instant::now();
    let mut said = start;
    loop {
        let missing: Vec<String> = (1..=nodes)
            .filter_map(|i| {
                let sock = node_dir(dir, i).join("agent.sock");
                rt.block_on(not_ready(&sock, nodes))
                    .map(|why| format!("node{i}: {why}"))
            })
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        if start.elapsed() > timeout {
            bail!(
                "the cluster was not ready within {timeout:?}:\n  {}",
                missing.join("\n  ")
            );
        }
        if said.elapsed() >= PROGRESS_EVERY {
            said = Instant::now();
            eprintln!("waiting for the cluster: {}", missing[0]);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// How often `up` says what it still waits for.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// What the agent at `sock` lacks before the cluster of `nodes` is ready (None: nothing):
/// an answer, every member alive with its gossiped facts (placement cannot use a member
/// without its RPC address and failure domain; facts follow membership by a gossip round
/// or two), a metadata leader and a committed layout in its replica.
async fn not_ready(sock: &Path, nodes: u8) -> Option<String> {
    let answer = async {
        let mut client = AgentClient::connect(sock).await.ok()?;
        match client.call(&Request::Status).await.ok()? {
            Response::Status(r) => Some(r),
            _ => None,
        }
    };
    let Some(r) = answer.await else {
        return Some("not answering".into());
    };
    let ready = r
        .nodes
        .iter()
        .filter(|n| {
            n.state == MemberState::Alive && n.rpc_addr.is_some() && n.failure_domain.is_some()
        })
        .count();
    let meta = &r.meta;
    if ready != usize::from(nodes) {
        Some(format!(
            "sees {ready} of {nodes} alive with their addresses and failure domains"
        ))
    } else if meta.leader.is_none() {
        Some(
            meta.notice.clone().unwrap_or_else(|| {
                "no metadata leader known yet (an election is under way)".into()
            }),
        )
    } else if meta.layout_epoch.is_none() {
        Some("no cluster layout committed yet".into())
    } else {
        None
    }
}

/// Unmounts the mounts and stops every node of the cluster in `dir` (SIGTERM, then
/// SIGKILL after 10 s).
pub fn down(dir: &Path) -> anyhow::Result<()> {
    let mut nodes = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))? {
        let name = entry?.file_name();
        if let Some(i) = name
            .to_str()
            .and_then(|n| n.strip_prefix("node"))
            .and_then(|n| n.parse::<u8>().ok())
        {
            nodes.push(i);
        }
    }
    if nodes.is_empty() {
        bail!("{} holds no dev cluster", dir.display());
    }
    // Mounts first: their buffered writes need the agents.
    let unmounted = dev_mount::unmount_all(dir, &nodes);
    if unmounted > 0 {
        println!("unmounted {unmounted} mount(s)");
    }
    let stopped = nodes
        .iter()
        .filter(|&&i| stop_node(&node_dir(dir, i)))
        .count();
    println!("stopped {stopped} agent(s)");
    Ok(())
}

fn stop_all(dir: &Path, nodes: u8) {
    let all: Vec<u8> = (1..=nodes).collect();
    dev_mount::unmount_all(dir, &all);
    for i in all {
        stop_node(&node_dir(dir, i));
    }
}

/// Stops the agent of one node directory; true if one was running.
pub fn stop_node(nd: &Path) -> bool {
    stop_process(nd, "agent.pid")
}

/// Stops the process whose pid is in `nd/pid_file`; true if one was running.
pub fn stop_process(nd: &Path, pid_file: &str) -> bool {
    let Some(pid) = running_pid_in(nd, pid_file) else {
        let _ = std::fs::remove_file(nd.join(pid_file));
        return false;
    };
    let _ = kill(pid, Signal::SIGTERM);
    let mut deadline = Instant::now() + Duration::from_secs(10);
    let mut killed = false;
    // Wait for the process to be gone after SIGKILL too (a restart must not find the old
    // agent still holding its database lock or ports), but not forever: a process stuck in
    // uninterruptible sleep does not die.
    while kill(pid, None).is_ok() && !is_zombie(pid) {
        if Instant::now() > deadline {
            if killed {
                break;
            }
            let _ = kill(pid, Signal::SIGKILL);
            killed = true;
            deadline = Instant::now() + Duration::from_secs(5);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = std::fs::remove_file(nd.join(pid_file));
    true
}

/// A child of ours that exited but was not reaped still answers signal 0.
/// Whether `pid` has exited but not been reaped, with its last thread gone (a zombie
/// leader whose other threads are still exiting holds the process's sockets: a new agent
/// could not bind its ports yet).
fn is_zombie(pid: Pid) -> bool {
    let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit(')')
                .next()
                .is_some_and(|rest| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(true);
    let threads = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| d.count())
        .unwrap_or(0);
    zombie && threads <= 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_share_the_machines_cores_unless_told_otherwise() {
        assert_eq!(core_share(2, 6), 1);
        assert_eq!(core_share(16, 6), 2);
        assert_eq!(core_share(64, 3), 21);
        assert_eq!(core_share(4, 0), 4);
        let share = Some((WORKER_THREADS.to_string(), "1".to_string()));
        let fake_gpu = ("SHOAL_FAKE_GPU".to_string(), "1".to_string());
        assert_eq!(
            agent_env(std::slice::from_ref(&fake_gpu), share.clone()),
            [fake_gpu.clone(), (WORKER_THREADS.into(), "1".into())]
        );
        let own = (WORKER_THREADS.to_string(), "4".to_string());
        assert_eq!(
            agent_env(std::slice::from_ref(&own), share),
            std::slice::from_ref(&own)
        );
        assert_eq!(agent_env(&[], None), []);
    }

    #[test]
    fn set_takes_a_section_a_key_and_a_toml_value() {
        assert_eq!(
            parse_section_setting("cluster.down_out_after=\"20s\""),
            Ok(("cluster".into(), "down_out_after = \"20s\"".into()))
        );
        assert!(parse_section_setting("down_out_after=1").is_err());
        assert!(parse_section_setting("node.name=\"x\"").is_err());
        assert!(parse_section_setting("scrub.=1").is_err());
        assert!(parse_section_setting("scrub.enabled").is_err());
        let mut opts = UpOptions::new(3, PathBuf::from("/tmp/c"));
        opts.set = vec![
            ("scrub".into(), "interval = \"5s\"".into()),
            ("storage".into(), "min_write_shards = 3".into()),
        ];
        opts.ec = Some("2+1".into());
        let text = render_config(&opts, Path::new("/tmp/c"), 1, Ipv4Addr::LOCALHOST, &[]);
        let doc: toml::Table = text.parse().expect("valid TOML");
        assert_eq!(doc["scrub"]["interval"].as_str(), Some("5s"));
        assert_eq!(doc["storage"]["min_write_shards"].as_integer(), Some(3));
        assert_eq!(doc["storage"]["ec"].as_str(), Some("2+1"));
    }

    #[test]
    fn bootstrap_expect_is_the_node_count_unless_meta_gives_it() {
        let config = |meta: Vec<String>| {
            let mut opts = UpOptions::new(2, PathBuf::from("/tmp/c"));
            opts.meta = meta;
            let text = render_config(&opts, Path::new("/tmp/c"), 1, Ipv4Addr::LOCALHOST, &[]);
            let doc: toml::Table = text.parse().expect("valid TOML");
            doc["meta"]["bootstrap_expect"].as_integer()
        };
        assert_eq!(config(Vec::new()), Some(2));
        let given = parse_meta_setting("bootstrap_expect=3").expect("setting");
        assert_eq!(config(vec![given]), Some(3));
    }
}
