//! `shoal-agent`: the per-node daemon.

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use shoal_agent::{AgentConfig, LogFormat, Node, runtime_threads};
use tokio::signal::unix::{SignalKind, signal};
use tracing::info;
use tracing_subscriber::EnvFilter;

/// Multi-MiB buffers are reused instead of mapped afresh (see the workspace Cargo.toml).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "shoal-agent",
    version,
    about = "shoal storage agent (one per node)"
)]
struct Args {
    /// Path of the agent config.
    #[arg(
        long,
        short,
        default_value = "/etc/shoal/agent.toml",
        env = "SHOAL_CONFIG"
    )]
    config: PathBuf,
    /// Parse and validate the config, print the result, and exit (0 = valid).
    #[arg(long)]
    check_config: bool,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let config = AgentConfig::load(&args.config)?;
    if args.check_config {
        println!("{}: valid", args.config.display());
        return Ok(());
    }
    init_logging(&config)?;
    let online = std::thread::available_parallelism().map_or(1, |n| n.get());
    let reserved = config.resources.as_ref().and_then(|r| r.cores());
    let env = std::env::var(runtime_threads::ENV).ok();
    let (threads, why) = runtime_threads::worker_threads(env.as_deref(), reserved, online)
        .map_err(anyhow::Error::msg)?;
    info!(threads, reason = %why, "async runtime sized");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .thread_name("shoal-agent")
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(run(config))
}

async fn run(config: AgentConfig) -> anyhow::Result<()> {
    let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    let node = Node::start(config).await?;
    let which = tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
        reason = node.metadata_failed() => {
            node.shutdown().await;
            anyhow::bail!("exiting for a restart: this node's metadata member failed: {reason}");
        }
    };
    info!(signal = which, "shutting down");
    node.shutdown().await;
    Ok(())
}

fn init_logging(config: &AgentConfig) -> anyhow::Result<()> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(v) if !v.is_empty() => EnvFilter::try_new(v).context("RUST_LOG")?,
        // openraft narrates every vote and append at INFO; keep it to warnings unless
        // asked for through RUST_LOG.
        _ => EnvFilter::try_new(format!("{},openraft=warn", config.log.level))
            .context("log.level")?,
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match config.log.format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
    Ok(())
}
