//! `dev-cluster up --mount`: one `shoal mount` per node at `nodeN/mnt`, logging to
//! `nodeN/mount.log`, its pid in `nodeN/mount.pid` (the same shape as the agents').

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::dev_cluster::{node_dir, running_pid_in, stop_process};
use crate::mountinfo::is_mounted;

pub const MOUNT_PID: &str = "mount.pid";

pub fn mountpoint(nd: &Path) -> PathBuf {
    nd.join("mnt")
}

/// Mounts every node's directory (those mounted already are kept); the mountpoints.
pub fn mount_all(dir: &Path, nodes: u8, timeout: Duration) -> anyhow::Result<Vec<PathBuf>> {
    let me = std::env::current_exe().context("cannot find the shoal executable")?;
    let mut waiting: Vec<(PathBuf, PathBuf, Child)> = Vec::new();
    let mut points = Vec::new();
    for i in 1..=nodes {
        let nd = node_dir(dir, i);
        let mnt = mountpoint(&nd);
        points.push(mnt.clone());
        if is_mounted(&mnt) {
            if running_pid_in(&nd, MOUNT_PID).is_some() {
                println!("node{i}: already mounted on {}", mnt.display());
                continue;
            }
            // Left behind by a mount process that died: its mountpoint answers ENOTCONN.
            unmount(&mnt);
        }
        std::fs::create_dir_all(&mnt)
            .with_context(|| format!("cannot create {}", mnt.display()))?;
        let child =
            spawn_mount(&me, &nd, &mnt, nodes).with_context(|| format!("mounting node{i}"))?;
        waiting.push((nd, mnt, child));
    }
    let deadline = Instant::now() + timeout;
    while !waiting.is_empty() {
        let mut still = Vec::new();
        for (nd, mnt, mut child) in waiting {
            if is_mounted(&mnt) {
                continue;
            }
            if let Ok(Some(status)) = child.try_wait() {
                bail!(
                    "shoal mount for {} exited ({status}); last lines of {}:\n{}",
                    mnt.display(),
                    nd.join("mount.log").display(),
                    log_tail(&nd.join("mount.log"), 10)
                );
            }
            still.push((nd, mnt, child));
        }
        waiting = still;
        if !waiting.is_empty() && Instant::now() > deadline {
            bail!(
                "{} did not appear as a mount within {timeout:?}",
                waiting[0].1.display()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(points)
}

/// Starts one node's mount, its runtime sized like the agents' (a dev cluster of `nodes`
/// shares this machine's cores).
fn spawn_mount(me: &Path, nd: &Path, mnt: &Path, nodes: u8) -> anyhow::Result<Child> {
    use std::os::unix::process::CommandExt;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(nd.join("mount.log"))?;
    let child = Command::new(me)
        .arg("mount")
        .arg(mnt)
        .arg("--socket")
        .arg(nd.join("agent.sock"))
        .envs(crate::dev_cluster::shared_worker_threads(nodes))
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        // Own process group, like the agents: a Ctrl-C for `up` does not reach it.
        .process_group(0)
        .spawn()
        .with_context(|| format!("cannot run {}", me.display()))?;
    std::fs::write(nd.join(MOUNT_PID), format!("{}\n", child.id()))?;
    Ok(child)
}

/// Unmounts every node's mountpoint and stops its mount process; how many were mounted.
pub fn unmount_all(dir: &Path, nodes: &[u8]) -> usize {
    let mut count = 0;
    for &i in nodes {
        let nd = node_dir(dir, i);
        let mnt = mountpoint(&nd);
        if is_mounted(&mnt) {
            unmount(&mnt);
            count += 1;
        }
        stop_process(&nd, MOUNT_PID);
    }
    count
}

/// Unmounts `mnt`: normally, else lazily (open files keep it alive until closed).
fn unmount(mnt: &Path) {
    let root = nix::unistd::geteuid().is_root();
    if root {
        // The syscall, not umount(8): the tool stats the mountpoint first, which waits on
        // the mount process, which waits (up to --retry-for) for an agent that may be gone.
        use nix::mount::{MntFlags, umount2};
        if umount2(mnt, MntFlags::empty()).is_ok()
            || umount2(mnt, MntFlags::MNT_DETACH).is_ok()
            || !is_mounted(mnt)
        {
            return;
        }
    }
    let (plain, lazy): (&[&str], &[&str]) = if root {
        (&["umount"], &["umount", "-l"])
    } else {
        (&["fusermount3", "-u"], &["fusermount3", "-u", "-z"])
    };
    for cmd in [plain, lazy] {
        let ok = Command::new(cmd[0])
            .args(&cmd[1..])
            .arg(mnt)
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok || !is_mounted(mnt) {
            return;
        }
    }
    eprintln!("warning: {} is still mounted", mnt.display());
}

fn log_tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().rev().take(n).collect();
    lines.into_iter().rev().collect::<Vec<_>>().join("\n")
}
