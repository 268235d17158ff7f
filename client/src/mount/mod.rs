//! `shoal mount`: the FUSE adapter. It serves one mountpoint from the local agent over the
//! agent's Unix socket and nothing else; every node mounts the same cluster namespace.
//!
//! Read [`fs::ShoalFs`] (the kernel's requests) and [`ops`] (what each one sends to the
//! agent) first, then [`agent::Agent`] (the connection pool and the retry that carries a
//! request across an agent restart), [`files::OpenFiles`] (open handles, their write
//! buffers and read-ahead). The pure parts — [`write::Coalescer`], [`readahead::Window`],
//! [`dir::Listing`] and the `mount.shoal` argument parser — test without a kernel.
//!
//! fuser 0.18 with `--threads` FUSE threads (4), each request's reply moved into a task on
//! one tokio runtime; inode numbers are the cluster's. Why the mount options are what they
//! are (`default_permissions`, no writeback cache) is in the README's "Mount" section. At
//! start the process joins the agent's reservation cgroup (`JoinReservation`); once
//! mounted it raises the kernel's read-ahead on its device (`read_ahead_kb`, found through
//! `/proc/self/mountinfo`) to 1 MiB, so a sequential reader's requests arrive whole rather
//! than in 128 KiB pieces. Max write is 1 MiB.

mod agent;
mod attr;
mod coherence;
mod dir;
mod files;
mod fs;
mod fstab;
mod held;
mod ops;
mod readahead;
#[cfg(test)]
mod testkit;
mod write;

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use shoal_agent_api::{
    DEFAULT_SOCKET, Failure, FsRequest, FsResponse, MAX_DIR_PAGE, Request, Response, SOCKET_ENV,
};
use shoal_units::{parse_duration, parse_size};

pub use fstab::{helper_main, is_mount_helper};

/// The stripe size assumed when the agent cannot say (`StatFs` failed at mount time).
const DEFAULT_STRIPE: u64 = 4 << 20;
/// Largest write the kernel sends in one request.
pub const MAX_WRITE: u32 = 1 << 20;
/// Longest `--retry-for`: well inside the hour for which the metadata keeps a session's
/// request outcomes, so a retry is never applied twice.
const MAX_RETRY_FOR: Duration = Duration::from_secs(30 * 60);
/// Largest single read or write request the mount sends (the agent takes no more).
const MAX_REQUEST: u64 = shoal_agent_api::MAX_READ as u64;

/// Options of `shoal mount` (and, as `-o` options, of `mount.shoal`).
#[derive(clap::Args, Clone, Debug)]
pub struct MountArgs {
    /// Directory to mount the cluster's filesystem on.
    pub mountpoint: PathBuf,
    /// The local agent's socket.
    #[arg(long, env = SOCKET_ENV, default_value = DEFAULT_SOCKET)]
    pub socket: PathBuf,
    /// Let other users than the one mounting use the mount (non-root mounts need
    /// `user_allow_other` in /etc/fuse.conf).
    #[arg(long)]
    pub allow_other: bool,
    /// How long the kernel may cache attributes of directories, symlinks and other
    /// non-files, in milliseconds. The agent's change feed drops them when another node
    /// changes them (without a feed, from an older agent, at most 1000 ms).
    #[arg(long, default_value_t = 60_000)]
    pub attr_ttl_ms: u64,
    /// How long the kernel may cache a regular file's attributes, in milliseconds. 0 (the
    /// default) makes every open see the size another node committed before it
    /// (close-to-open); raise it only where files are not shared between nodes.
    #[arg(long, default_value_t = 0)]
    pub file_attr_ttl_ms: u64,
    /// How long the kernel may cache a name → inode lookup, in milliseconds. The agent's
    /// change feed drops a name when another node changes it, and an open reached by a
    /// name changed meanwhile is retried (without a feed, at most 1000 ms).
    #[arg(long, default_value_t = 60_000)]
    pub entry_ttl_ms: u64,
    /// Threads reading requests from the kernel.
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
    /// Bytes written but not yet committed by the cluster, across all open files; writers
    /// wait when it is full.
    #[arg(long, default_value = "256MiB", value_parser = parse_size)]
    pub write_buffer: u64,
    /// Bytes fetched ahead for a sequential reader (rounded up to whole stripes; 0 turns
    /// read-ahead off).
    #[arg(long, default_value = "8MiB", value_parser = parse_size)]
    pub read_ahead: u64,
    /// Directory entries fetched from the agent per request while listing (1 to 4096).
    #[arg(long, default_value_t = MAX_DIR_PAGE)]
    pub readdir_page: u32,
    /// How long a request waits for an unreachable agent or an unavailable cluster before
    /// it fails with EIO, e.g. "600s", "10m"; at most 30 minutes (the cluster remembers a
    /// mount's requests, to answer a retry with the first outcome, for an hour).
    #[arg(long, default_value = "600s", value_parser = parse_duration)]
    pub retry_for: Duration,
    /// Make a file's metadata changes durable when it is closed, as well as on fsync. By
    /// default a close does not wait: the agent commits what it answered within its
    /// `[meta] metadata_writeback_ms` (100 ms), another node's open or lookup of the file
    /// has it committed first, and fsync (of the file or its directory) makes it durable;
    /// a power cut of this node may lose up to that much of what nobody synced.
    #[arg(long)]
    pub sync_close: bool,
}

impl MountArgs {
    fn validate(&self) -> anyhow::Result<()> {
        if self.threads == 0 || self.threads > 64 {
            bail!("--threads must be between 1 and 64");
        }
        if self.retry_for > MAX_RETRY_FOR {
            bail!("--retry-for must be at most 30m");
        }
        if !(1..=MAX_DIR_PAGE).contains(&self.readdir_page) {
            bail!("--readdir-page must be between 1 and {MAX_DIR_PAGE}");
        }
        if self.read_ahead > MAX_REQUEST {
            bail!("--read-ahead must be at most {} MiB", MAX_REQUEST >> 20);
        }
        Ok(())
    }
}

/// Mounts and serves until the filesystem is unmounted or the process gets SIGINT or
/// SIGTERM (then it unmounts). `ready`, when given, receives one line once mounted:
/// `ok` (the `mount.shoal` parent waits for it).
pub fn run(args: MountArgs, ready: Option<OwnedFd>) -> anyhow::Result<()> {
    args.validate()?;
    init_logging();
    let mountpoint = std::path::absolute(&args.mountpoint)?;
    if !mountpoint.is_dir() {
        bail!("{} is not a directory", mountpoint.display());
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("shoal-mount")
        .build()?;
    let agent = Arc::new(agent::Agent::new(args.socket.clone(), args.retry_for));
    let stripe = rt.block_on(prepare(&agent))?;
    rt.spawn(agent.clone().keepalive());
    let state = Arc::new(ops::FsState::new(agent, &args, stripe));
    let filesystem = fs::ShoalFs::new(state.clone(), rt.handle().clone());
    let config = fs::session_config(&args);
    let mut session = fuser::Session::new(filesystem, &mountpoint, &config)
        .with_context(|| format!("cannot mount on {}", mountpoint.display()))?;
    tracing::info!(
        mountpoint = %mountpoint.display(),
        socket = %args.socket.display(),
        stripe,
        "mounted"
    );
    raise_kernel_read_ahead(&mountpoint);
    if let Some(fd) = ready {
        fstab::report(fd, Ok(()));
    }
    let notifier = session.notifier();
    rt.spawn(state.coherence.clone().watch(state.agent.clone(), notifier));
    let mut unmounter = session.unmount_callable();
    let (done_tx, mut done_rx) = tokio::sync::oneshot::channel();
    let serving = std::thread::Builder::new()
        .name("fuse-session".into())
        .spawn(move || {
            let result = session.run();
            let _ = done_tx.send(());
            result
        })?;
    if let Some(signal) = rt.block_on(wait_for_end(&mut done_rx))? {
        tracing::info!(signal, "unmounting");
        unmount(&mut unmounter, &mountpoint);
        if let Some(signal) = rt.block_on(wait_for_end(&mut done_rx))? {
            tracing::warn!(
                signal,
                "exiting with files still open: their users now get ENOTCONN"
            );
            rt.block_on(state.files.flush_everything());
            return Ok(());
        }
    }
    let result = serving
        .join()
        .map_err(|_| anyhow::anyhow!("the FUSE session thread panicked"))?;
    // Every file was released before the kernel ended the session, so this only finds
    // data when the session was torn down abruptly.
    rt.block_on(state.files.flush_everything());
    tracing::info!(mountpoint = %mountpoint.display(), "unmounted");
    result.context("FUSE session failed")
}

/// The kernel's own read-ahead on the mount, in KiB: one whole request of the largest size
/// the mount takes (its default, 128 KiB, splits a sequential read into eight times as
/// many requests, each a round trip through the mount).
const KERNEL_READ_AHEAD_KB: u64 = (MAX_WRITE as u64) >> 10;

/// Raises the kernel's read-ahead for the new mount (its backing device's
/// `read_ahead_kb`) to [`KERNEL_READ_AHEAD_KB`] when it is lower; a mount that may not
/// (not root) works as before, with smaller read requests.
fn raise_kernel_read_ahead(mountpoint: &std::path::Path) {
    let Some(device) = crate::mountinfo::fuse_device(mountpoint) else {
        tracing::debug!("mount not found in mountinfo; kernel read-ahead left as it is");
        return;
    };
    let knob = std::path::PathBuf::from(format!("/sys/class/bdi/{device}/read_ahead_kb"));
    let now = std::fs::read_to_string(&knob)
        .ok()
        .and_then(|t| t.trim().parse::<u64>().ok());
    if now.is_some_and(|kb| kb >= KERNEL_READ_AHEAD_KB) {
        return;
    }
    match std::fs::write(&knob, KERNEL_READ_AHEAD_KB.to_string()) {
        Ok(()) => tracing::debug!(
            device,
            kb = KERNEL_READ_AHEAD_KB,
            "kernel read-ahead raised"
        ),
        Err(e) => tracing::info!(
            device,
            error = %e,
            "kernel read-ahead left at its default (sequential reads send smaller requests)"
        ),
    }
}

/// Joins the agent's reservation and learns the stripe size.
async fn prepare(agent: &agent::Agent) -> anyhow::Result<u64> {
    let pid = std::process::id();
    match agent.call(&Request::JoinReservation { pid }).await {
        Ok(Response::Joined(Some(cgroup))) => tracing::info!(cgroup, "joined the reservation"),
        Ok(Response::Joined(None)) => {}
        Ok(Response::Error(e) | Response::Failed(Failure { message: e, .. })) => {
            tracing::warn!("agent did not take the mount into its reservation: {e}")
        }
        Ok(other) => tracing::warn!("unexpected answer to JoinReservation: {other:?}"),
        Err(e) => return Err(anyhow::anyhow!("{e}")).context("the agent is not reachable"),
    }
    let stripe = match agent.call(&Request::Fs(FsRequest::StatFs)).await {
        Ok(Response::Fs(FsResponse::StatFs(s))) if s.block_size > 0 => u64::from(s.block_size),
        Ok(other) => {
            tracing::warn!(
                "agent answered StatFs with {}; assuming {} MiB stripes",
                short(&other),
                DEFAULT_STRIPE >> 20
            );
            DEFAULT_STRIPE
        }
        Err(e) => return Err(anyhow::anyhow!("{e}")).context("the agent is not reachable"),
    };
    Ok(stripe.clamp(64 << 10, MAX_REQUEST))
}

/// A response for a log line, without dumping file data.
fn short(r: &Response) -> String {
    match r {
        Response::Error(e) => format!("error {e:?}"),
        Response::Failed(f) => format!("error ({}) {:?}", f.kind.name(), f.message),
        Response::Fs(FsResponse::Error(e)) => format!("error {e}"),
        _ => "an unexpected answer".into(),
    }
}

/// Unmounts; when files are still open, detaches the mount instead: it disappears from
/// the namespace and the session ends once the last file is closed.
fn unmount(unmounter: &mut fuser::SessionUnmounter, mountpoint: &std::path::Path) {
    if let Err(e) = unmounter.unmount() {
        tracing::warn!("unmount: {e}; detaching, open files are served until closed");
        if let Err(e) = nix::mount::umount2(mountpoint, nix::mount::MntFlags::MNT_DETACH) {
            tracing::warn!("detaching failed: {e}");
        }
    }
}

/// Waits until the session ends by itself (None) or a signal asks to unmount.
async fn wait_for_end(
    done: &mut tokio::sync::oneshot::Receiver<()>,
) -> anyhow::Result<Option<&'static str>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut int = signal(SignalKind::interrupt())?;
    let mut term = signal(SignalKind::terminate())?;
    Ok(tokio::select! {
        _ = done => None,
        _ = int.recv() => Some("SIGINT"),
        _ = term.recv() => Some("SIGTERM"),
    })
}

fn init_logging() {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;
    // fuser warns about every request it answers with ENOSYS by default, and about
    // unmounting a mount that is already gone: noise for an operator.
    let filter = EnvFilter::try_from_env("SHOAL_LOG")
        .or_else(|_| EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| EnvFilter::new("info,fuser=error"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_args_have_the_documented_defaults() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: MountArgs,
        }
        let cli = Cli::try_parse_from(["shoal", "/mnt/x", "--socket", "/s"]).expect("parse");
        let a = cli.args;
        assert_eq!(a.mountpoint, PathBuf::from("/mnt/x"));
        assert_eq!(a.write_buffer, 256 << 20);
        assert_eq!(a.read_ahead, 8 << 20);
        assert_eq!(a.retry_for, Duration::from_secs(600));
        assert_eq!(
            (a.attr_ttl_ms, a.entry_ttl_ms, a.threads),
            (60_000, 60_000, 4)
        );
        assert!(!a.allow_other);
        a.validate().expect("defaults are valid");
        for bad in [
            ["--retry-for", "31m"],
            ["--readdir-page", "0"],
            ["--readdir-page", "4097"],
        ] {
            let args = ["shoal", "/mnt/x"].into_iter().chain(bad);
            let a = Cli::try_parse_from(args).expect("parse").args;
            assert!(a.validate().is_err(), "{bad:?} accepted");
        }
    }

    /// Size and duration flags read the config file's grammar (`shoal_units`), decimals and
    /// the KB family included, and name the value they refuse.
    #[test]
    fn size_and_duration_flags_read_the_config_grammar() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: MountArgs,
        }
        let args = [
            "shoal",
            "/mnt/x",
            "--write-buffer",
            "1.5GiB",
            "--read-ahead",
            "2MB",
            "--retry-for",
            "10min",
        ];
        let a = Cli::try_parse_from(args).expect("parse").args;
        assert_eq!(a.write_buffer, 3 << 29);
        assert_eq!(a.read_ahead, 2_000_000);
        assert_eq!(a.retry_for, Duration::from_secs(600));
        let err = Cli::try_parse_from(["shoal", "/mnt/x", "--write-buffer", "1.5 parsecs"])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("\"1.5 parsecs\" is not a size"), "{err}");
    }
}
