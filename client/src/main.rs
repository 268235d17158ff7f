//! `shoal`: the operator CLI. It speaks `shoal-agent-api` to the local agent only.
//!
//! Commands: `status`, `cert init/issue/show/revoke`, `dev-cluster up/down [--mount]`,
//! `mount` (also installed as `mount.shoal` for fstab), `stat PATH`,
//! `bench stripes/repair/drain/coexist`, `ok-to-stop`, `drain [status]`, `undrain`,
//! `remove`, `maintenance enter/exit`, `tier …`. How a failure ends (exit codes, `--json`)
//! is in `failure.rs`.

mod bench;
mod cert;
mod coexist;
mod dev_cluster;
mod dev_mount;
mod drain_bench;
mod failure;
mod maintenance;
mod mount;
mod mountinfo;
mod progress;
mod repair_bench;
mod stat;
mod status;
mod tier;

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use shoal_agent_api::{AgentClient, DEFAULT_SOCKET, Request, Response, SOCKET_ENV};

/// Multi-MiB buffers are reused instead of mapped afresh (see the workspace Cargo.toml).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "shoal",
    version,
    about = "shoal: pooled, erasure-coded NVMe storage for GPU clusters"
)]
struct Cli {
    /// The agent's admin socket, for the commands that talk to the agent (before or
    /// after the command; before it, it wins over the command's own).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// JSON output, for the commands that have it (before or after the command).
    #[arg(long)]
    json: bool,
    #[command(subcommand)]
    command: Cmd,
}

impl Cli {
    /// Applies `--socket` and `--json` given before the command to the command (an error
    /// for a command without them).
    fn command(self) -> anyhow::Result<Cmd> {
        let (top_socket, top_json) = (self.socket, self.json);
        let mut cmd = self.command;
        let (socket, json) = cmd.socket_and_json();
        match (top_socket, socket) {
            (Some(top), Some(socket)) => *socket = top,
            (Some(_), None) => {
                return Err(failure::invalid("--socket does not apply to this command"));
            }
            (None, _) => {}
        }
        match json {
            Some(json) => *json |= top_json,
            None if top_json => {
                return Err(failure::invalid("--json does not apply to this command"));
            }
            None => {}
        }
        Ok(cmd)
    }
}

impl Cmd {
    /// The command's `--socket` and `--json`, where it has them.
    fn socket_and_json(&mut self) -> (Option<&mut PathBuf>, Option<&mut bool>) {
        match self {
            Cmd::Status { socket, json } => (Some(socket), Some(json)),
            Cmd::Stat { socket, json, .. } => (Some(socket), Some(json)),
            Cmd::OkToStop { socket, json, .. } => (Some(socket), Some(json)),
            Cmd::Drain(a) => (Some(&mut a.socket), Some(&mut a.json)),
            Cmd::Undrain { socket, json, .. } | Cmd::Remove { socket, json, .. } => {
                (Some(socket), Some(json))
            }
            Cmd::Maintenance(
                MaintenanceCmd::Enter { socket, json, .. }
                | MaintenanceCmd::Exit { socket, json, .. },
            ) => (Some(socket), Some(json)),
            Cmd::Mount(args) => (Some(&mut args.socket), None),
            Cmd::Bench(BenchCmd::Stripes(o)) => (Some(&mut o.socket), Some(&mut o.json)),
            Cmd::Bench(BenchCmd::Coexist(o)) => (None, Some(&mut o.json)),
            Cmd::Bench(BenchCmd::Repair(o) | BenchCmd::Drain(o)) => (None, Some(&mut o.json)),
            Cmd::Tier(t) => {
                let (socket, json) = t.socket_and_json();
                (Some(socket), json)
            }
            Cmd::Cert(CertCmd::Revoke { socket, .. }) => (Some(socket), None),
            Cmd::Cert(_) | Cmd::DevCluster(_) => (None, None),
        }
    }

    /// Whether the output is JSON (a failure's too).
    fn json(&mut self) -> bool {
        self.socket_and_json().1.is_some_and(|json| *json)
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// Show every cluster member as the local agent sees it.
    Status {
        /// The agent's admin socket.
        #[arg(long, env = SOCKET_ENV, default_value = DEFAULT_SOCKET)]
        socket: PathBuf,
        /// Print one JSON object with a `nodes` array instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Benchmarks through the local agent.
    #[command(subcommand)]
    Bench(BenchCmd),
    /// Create the cluster CA and node certificates.
    #[command(subcommand)]
    Cert(CertCmd),
    /// Mount the cluster's filesystem (FUSE) and serve it until unmounted.
    Mount(mount::MountArgs),
    /// Where a file on a shoal mount keeps its data: extents, stripes and shards.
    Stat {
        /// A file on a shoal mount.
        path: PathBuf,
        /// The local agent's socket.
        #[arg(long, env = SOCKET_ENV, default_value = DEFAULT_SOCKET)]
        socket: PathBuf,
        /// Print the layout as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Whether stopping the NODEs together now is safe: exits 0 when every stripe they
    /// hold keeps at least k+1 available shards and the metadata group keeps a quorum, 1
    /// otherwise (naming the stripes, failure domains and voters at risk). Name every node
    /// that stops at once (a rolling restart's whole batch): each alone may be safe when
    /// the batch is not.
    #[command(name = "ok-to-stop")]
    OkToStop {
        /// The nodes: names or 16-hex-digit ids.
        #[arg(required = true, value_name = "NODE")]
        nodes: Vec<String>,
        /// The agent's admin socket.
        #[arg(long, env = SOCKET_ENV, default_value = DEFAULT_SOCKET)]
        socket: PathBuf,
        /// Print the assessment as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Drain NODE: it takes no new shards, its shards are copied to other nodes and its
    /// metadata vote moves, then it is `drained`. `shoal drain status [NODE]` shows how
    /// drains stand.
    Drain(maintenance::DrainArgs),
    /// Return a draining or drained NODE to `active` (what already moved stays).
    Undrain {
        /// The node: its name or its 16-hex-digit id.
        node: String,
        #[arg(long, env = SOCKET_ENV, default_value = DEFAULT_SOCKET)]
        socket: PathBuf,
        /// Print `{"message": ...}`, or `{"error": {"kind": ..., "message": ...}}`.
        #[arg(long)]
        json: bool,
    },
    /// Forget a drained (or out) NODE whose agent is stopped.
    Remove {
        /// The node: its name or its 16-hex-digit id.
        node: String,
        #[arg(long, env = SOCKET_ENV, default_value = DEFAULT_SOCKET)]
        socket: PathBuf,
        /// Print `{"message": ...}`, or `{"error": {"kind": ..., "message": ...}}`.
        #[arg(long)]
        json: bool,
    },
    /// Maintenance windows: a node in one that goes down is not rebuilt until it ends.
    #[command(subcommand)]
    Maintenance(MaintenanceCmd),
    /// The cold tier: status, and sending paths to it or bringing them back.
    #[command(subcommand)]
    Tier(tier::TierCmd),
    /// Run a local multi-node cluster on 127.0.0.x (for trying shoal and for tests).
    #[command(subcommand, name = "dev-cluster")]
    DevCluster(DevClusterCmd),
}

#[derive(Subcommand)]
enum MaintenanceCmd {
    /// Put NODE in maintenance for a while (a reboot, a driver update).
    Enter {
        /// The node: its name or its 16-hex-digit id.
        node: String,
        /// How long the window lasts (`30m`, `2h`).
        #[arg(long = "for", default_value = "1h")]
        duration: String,
        #[arg(long, env = SOCKET_ENV, default_value = DEFAULT_SOCKET)]
        socket: PathBuf,
        /// Print `{"message": ...}`, or `{"error": {"kind": ..., "message": ...}}`.
        #[arg(long)]
        json: bool,
    },
    /// End NODE's maintenance window now.
    Exit {
        /// The node: its name or its 16-hex-digit id.
        node: String,
        #[arg(long, env = SOCKET_ENV, default_value = DEFAULT_SOCKET)]
        socket: PathBuf,
        /// Print `{"message": ...}`, or `{"error": {"kind": ..., "message": ...}}`.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum BenchCmd {
    /// Training-proxy step time alone, beside storage load unconfined, and with the
    /// reservation (needs root for the cgroups).
    Coexist(coexist::CoexistOptions),
    /// Write erasure-coded stripes, read them back and verify every byte.
    Stripes(bench::BenchOptions),
    /// Foreground throughput alone and while a lost node's shards are rebuilt, the repair
    /// rate and the time back to full redundancy; with the governor idle and with a busy
    /// fake GPU.
    Repair(repair_bench::RepairBenchOptions),
    /// Foreground throughput alone and while a node is drained, and the drain rate; with
    /// the governor idle and with a busy fake GPU (the options are `bench repair`'s).
    Drain(repair_bench::RepairBenchOptions),
}

#[derive(Subcommand)]
enum CertCmd {
    /// Create a new cluster CA (ca.pem, ca.key) and gossip secret (cluster.key) in DIR.
    Init {
        #[arg(long)]
        dir: PathBuf,
        /// Name recorded in the CA certificate.
        #[arg(long, default_value = "shoal")]
        cluster_name: String,
    },
    /// Issue a node certificate (node.pem, node.key) signed by the CA in --ca-dir. It names
    /// the node (its name and id); a new node gets a new id, taken by its agent at the
    /// first start.
    Issue {
        #[arg(long)]
        ca_dir: PathBuf,
        /// Node name (letters, digits, '-', '.').
        #[arg(long)]
        name: String,
        /// IP address the node is reached at (repeatable).
        #[arg(long = "ip")]
        ips: Vec<IpAddr>,
        /// The id of an existing node (16 hex digits, as `shoal status` shows it or its
        /// data dir's `node_id` holds): a new key and certificate for it (a re-key, e.g.
        /// after `shoal cert revoke`). Without it, a new node id.
        #[arg(long)]
        node_id: Option<String>,
        /// Output directory.
        #[arg(long)]
        out: PathBuf,
    },
    /// Show what a node certificate says: node name, id, when it was issued, until when it
    /// is valid, its addresses.
    Show {
        /// The certificate (PEM), e.g. /etc/shoal/tls/node.pem.
        cert: PathBuf,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Revoke every certificate of node NAME issued before now, cluster-wide: every agent
    /// refuses it within seconds (through the local agent; the list lives in the metadata).
    Revoke {
        /// The node's name.
        name: String,
        /// Revoke a name no member carries now (a node that left the cluster); without it,
        /// such a name is refused as a likely typo.
        #[arg(long)]
        force: bool,
        #[arg(long, env = SOCKET_ENV, default_value = DEFAULT_SOCKET)]
        socket: PathBuf,
    },
}

#[derive(Subcommand)]
enum DevClusterCmd {
    /// Start N agents in the background and wait until they all see each other.
    Up(Box<dev_cluster::UpOptions>),
    /// Unmount the mounts and stop the agents of the dev cluster in DIR (data is kept).
    Down {
        #[arg(long)]
        dir: PathBuf,
    },
}

fn main() -> ExitCode {
    // Installed as /sbin/mount.shoal, for fstab lines of type `shoal`.
    if std::env::args_os()
        .next()
        .is_some_and(|argv0| mount::is_mount_helper(&argv0))
    {
        return mount::helper_main();
    }
    // Exit codes (see `failure`): 0 done (or "ok"), 1 the answer is no or not now
    // (`ok-to-stop`, a drain that cannot finish: already printed; a refusal), 2 an error.
    let mut cmd = match Cli::parse().command() {
        Ok(cmd) => cmd,
        Err(e) => return failure::report(&e, false),
    };
    let json = cmd.json();
    match run(cmd) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.is::<maintenance::NotOk>() => ExitCode::from(1),
        Err(e) => failure::report(&e, json),
    }
}

fn run(cmd: Cmd) -> anyhow::Result<()> {
    match cmd {
        Cmd::Status { socket, json } => status_cmd(socket, json),
        Cmd::Mount(args) => mount::run(args, None),
        Cmd::OkToStop {
            nodes,
            socket,
            json,
        } => maintenance::ok_to_stop(&socket, &nodes, json),
        Cmd::Stat { path, socket, json } => stat::run(&path, &socket, json),
        Cmd::Drain(a) => maintenance::drain(&a),
        Cmd::Undrain { node, socket, json } => {
            maintenance::change(&socket, Request::Undrain { node }, json)
        }
        Cmd::Remove { node, socket, json } => {
            maintenance::change(&socket, Request::RemoveNode { node }, json)
        }
        Cmd::Maintenance(MaintenanceCmd::Enter {
            node,
            duration,
            socket,
            json,
        }) => {
            let d = shoal_units::parse_duration(&duration)
                .map_err(|e| failure::invalid(format!("--for: {e}")))?;
            if d.is_zero() {
                return Err(failure::invalid("--for must be longer than zero"));
            }
            let for_ms = Some(d.as_millis() as u64);
            maintenance::change(&socket, Request::Maintenance { node, for_ms }, json)
        }
        Cmd::Maintenance(MaintenanceCmd::Exit { node, socket, json }) => {
            let exit = Request::Maintenance { node, for_ms: None };
            maintenance::change(&socket, exit, json)
        }
        Cmd::Bench(BenchCmd::Coexist(o)) => coexist::run(o),
        Cmd::Bench(BenchCmd::Repair(o)) => repair_bench::run(o),
        Cmd::Bench(BenchCmd::Drain(o)) => drain_bench::run(o),
        Cmd::Bench(BenchCmd::Stripes(o)) => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            rt.block_on(bench::run(o))
        }
        Cmd::Cert(CertCmd::Init { dir, cluster_name }) => {
            cert::init(&dir, &cluster_name)?;
            println!("cluster CA and gossip key written to {}", dir.display());
            Ok(())
        }
        Cmd::Cert(CertCmd::Issue {
            ca_dir,
            name,
            ips,
            node_id,
            out,
        }) => {
            let node = match node_id {
                Some(id) => Some(cert::parse_node_id(&id)?),
                None => None,
            };
            let id = cert::issue(&ca_dir, &name, &ips, node, &out)?;
            println!(
                "certificate for {name} (node {id:016x}) written to {}",
                out.display()
            );
            Ok(())
        }
        Cmd::Cert(CertCmd::Show { cert: path, json }) => cert::show(&path, json),
        Cmd::Cert(CertCmd::Revoke {
            name,
            force,
            socket,
        }) => cert::revoke(&socket, name, force),
        Cmd::Tier(t) => tier::run(t),
        Cmd::DevCluster(DevClusterCmd::Up(o)) => dev_cluster::up(&o),
        Cmd::DevCluster(DevClusterCmd::Down { dir }) => dev_cluster::down(&dir),
    }
}

fn status_cmd(socket: PathBuf, json: bool) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let response = rt.block_on(async {
        let mut client = AgentClient::connect(&socket).await?;
        client.call(&Request::Status).await
    })?;
    let report = match response.into_result()? {
        Response::Status(r) => r,
        other => anyhow::bail!("unexpected answer from the agent: {other:?}"),
    };
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).context("encoding JSON")?
        );
    } else {
        print!("{}", status::render_table(&report));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn parse(args: &[&str]) -> anyhow::Result<Cmd> {
        Cli::try_parse_from(args)?.command()
    }

    #[test]
    fn socket_and_json_go_before_or_after_the_command() {
        let before = parse(&["shoal", "--socket", "/s", "--json", "status"]).expect("before");
        assert!(matches!(before, Cmd::Status { socket, json: true } if socket == Path::new("/s")));
        let after = parse(&["shoal", "status", "--socket", "/s", "--json"]).expect("after");
        assert!(matches!(after, Cmd::Status { socket, json: true } if socket == Path::new("/s")));
        let ok = parse(&["shoal", "--json", "ok-to-stop", "gpu07"]).expect("ok-to-stop");
        assert!(matches!(ok, Cmd::OkToStop { json: true, .. }));
        let batch = parse(&["shoal", "ok-to-stop", "gpu07", "gpu08", "--json"]).expect("batch");
        assert!(
            matches!(batch, Cmd::OkToStop { nodes, json: true, .. } if nodes == ["gpu07", "gpu08"])
        );
        assert!(
            parse(&["shoal", "ok-to-stop"]).is_err(),
            "at least one node"
        );
        let mount = parse(&["shoal", "--socket", "/s", "mount", "/mnt/x"]).expect("mount");
        assert!(matches!(mount, Cmd::Mount(a) if a.socket == Path::new("/s")));
    }

    #[test]
    fn socket_or_json_before_a_command_without_them_is_an_error() {
        let err = parse(&["shoal", "--json", "dev-cluster", "down", "--dir", "x"])
            .err()
            .map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some("--json does not apply to this command")
        );
        assert!(parse(&["shoal", "--socket", "/s", "cert", "init", "--dir", "x"]).is_err());
    }
}
