//! `mount.shoal`: the helper mount(8) runs for fstab lines of type `shoal`
//! (`ln -s /usr/local/bin/shoal /sbin/mount.shoal`).
//!
//! mount(8) calls `mount.shoal SOURCE MOUNTPOINT [-sfnv] [-o OPTIONS]` and expects it to
//! return once the filesystem is mounted. The helper forks before anything else starts
//! (no threads, no runtime); the child mounts and serves, the parent waits on a pipe for
//! the child's one line — `ok` or the error — and exits 0 or 1.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::Parser;

use super::MountArgs;

/// The name the helper is installed under.
const HELPER_NAME: &str = "mount.shoal";

/// Options that mount(8), systemd or fstab conventions pass and that mean nothing here.
const IGNORED: &[&str] = &[
    "defaults",
    "_netdev",
    "rw",
    "nofail",
    "auto",
    "noauto",
    "user",
    "nouser",
    "users",
    "owner",
    "group",
    "async",
    "suid",
    "nosuid",
    "dev",
    "nodev",
    "exec",
    "noexec",
    "atime",
    "noatime",
    "relatime",
    "norelatime",
    "strictatime",
    "nostrictatime",
    "lazytime",
    "nolazytime",
    "diratime",
    "nodiratime",
    "silent",
    "loud",
    "nofail",
    "sync",
    "dirsync",
];

/// Options that take a value and become the `shoal mount` flag of the same name.
const VALUED: &[&str] = &[
    "socket",
    "attr_ttl_ms",
    "file_attr_ttl_ms",
    "entry_ttl_ms",
    "threads",
    "write_buffer",
    "read_ahead",
    "readdir_page",
    "retry_for",
];

/// Whether this process was started as `mount.shoal`.
pub fn is_mount_helper(argv0: &OsStr) -> bool {
    Path::new(argv0).file_name() == Some(OsStr::new(HELPER_NAME))
}

/// A parsed `mount.shoal` command line.
#[derive(Debug)]
pub struct HelperCall {
    pub args: MountArgs,
    /// `-f`: do everything but mount.
    pub fake: bool,
    /// `log=PATH`: where the background process writes its log (else stderr as inherited).
    pub log: Option<PathBuf>,
}

#[derive(clap::Parser)]
struct AsCli {
    #[command(flatten)]
    args: MountArgs,
}

/// Parses `mount.shoal SOURCE MOUNTPOINT [-sfnv] [-o OPTIONS] [-t TYPE]`.
pub fn parse_helper_args(argv: &[String]) -> anyhow::Result<HelperCall> {
    let mut positional = Vec::new();
    let mut options = Vec::new();
    let mut fake = false;
    let mut it = argv.iter().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "-o" => options.push(it.next().context("-o needs a value")?.clone()),
            "-t" => {
                it.next().context("-t needs a value")?;
            }
            "-N" => bail!("mount namespaces (-N) are not supported"),
            "-f" => fake = true,
            "-s" | "-n" | "-v" => {}
            s if s.starts_with("-o") => options.push(s[2..].to_owned()),
            s if s.starts_with('-') && s.len() > 1 => {
                // Combined short flags such as -fn.
                if s[1..].chars().any(|c| !"sfnv".contains(c)) {
                    bail!("unknown flag {s}");
                }
                fake |= s.contains('f');
            }
            _ => positional.push(arg.clone()),
        }
    }
    let [_source, mountpoint] = positional.as_slice() else {
        bail!("usage: mount.shoal SOURCE MOUNTPOINT [-o OPTIONS]");
    };
    let mut cli = vec!["mount.shoal".to_owned(), mountpoint.clone()];
    let mut log = None;
    for opt in options.iter().flat_map(|o| o.split(',')) {
        let (key, value) = match opt.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (opt, None),
        };
        match (key, value) {
            ("", None) => {}
            ("allow_other", None) => cli.push("--allow-other".into()),
            ("sync_close", None) => cli.push("--sync-close".into()),
            ("log", Some(path)) => log = Some(PathBuf::from(path)),
            ("ro", None) => bail!("read-only shoal mounts are not supported"),
            (k, Some(v)) if VALUED.contains(&k) => {
                cli.push(format!("--{}", k.replace('_', "-")));
                cli.push(v.to_owned());
            }
            (k, None) if IGNORED.contains(&k) => {}
            (k, _) if k.starts_with("x-") || k == "comment" || k == "user" => {}
            _ => bail!("unknown mount option {opt:?}"),
        }
    }
    let parsed =
        AsCli::try_parse_from(&cli).map_err(|e| anyhow::anyhow!("{}", e.to_string().trim()))?;
    Ok(HelperCall {
        args: parsed.args,
        fake,
        log,
    })
}

/// The whole life of `mount.shoal`.
pub fn helper_main() -> ExitCode {
    let argv: Vec<String> = std::env::args().collect();
    let call = match parse_helper_args(&argv) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("mount.shoal: {e:#}");
            return ExitCode::from(1);
        }
    };
    if call.fake {
        return ExitCode::SUCCESS;
    }
    match daemonize() {
        Ok(Side::Parent(outcome)) => match outcome {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("mount.shoal: {e}");
                ExitCode::from(1)
            }
        },
        Ok(Side::Child(ready)) => serve(call, ready),
        Err(e) => {
            eprintln!("mount.shoal: cannot start the mount process: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// In the child: mounts, serves, and reports a failure to mount to the waiting parent.
fn serve(call: HelperCall, ready: OwnedFd) -> ExitCode {
    if let Some(path) = &call.log
        && let Err(e) = redirect_stderr(path)
    {
        report(
            ready,
            Err(&format!("cannot open log {}: {e}", path.display())),
        );
        return ExitCode::from(1);
    }
    let spare = ready.try_clone().ok();
    match super::run(call.args, Some(ready)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let text = format!("{e:#}");
            // Before the mount the parent is waiting for this and prints it; after, the
            // parent is gone and only the log has it.
            if let Some(fd) = spare {
                report(fd, Err(&text));
            }
            tracing::error!("{text}");
            ExitCode::from(1)
        }
    }
}

/// Writes the one line the parent waits for.
pub fn report(fd: OwnedFd, outcome: Result<(), &str>) {
    let mut pipe = std::fs::File::from(fd);
    let line = match outcome {
        Ok(()) => "ok\n".to_owned(),
        Err(e) => format!("{}\n", e.replace('\n', " ")),
    };
    let _ = pipe.write_all(line.as_bytes());
}

enum Side {
    /// The parent, with what the child reported.
    Parent(Result<(), String>),
    /// The child, with the pipe to report on.
    Child(OwnedFd),
}

/// Forks; the parent waits for the child's report.
#[allow(unsafe_code)]
fn daemonize() -> anyhow::Result<Side> {
    use nix::unistd::{ForkResult, fork, pipe, setsid};
    let (read_end, write_end) = pipe()?;
    // SAFETY: called from `main` before any thread or runtime exists, so the child is a
    // complete copy of a single-threaded process and may do anything afterwards.
    match unsafe { fork() }? {
        ForkResult::Parent { .. } => {
            drop(write_end);
            let mut line = String::new();
            BufReader::new(std::fs::File::from(read_end)).read_line(&mut line)?;
            let line = line.trim();
            Ok(Side::Parent(match line {
                "ok" => Ok(()),
                "" => Err("the mount process exited before mounting".into()),
                e => Err(e.to_owned()),
            }))
        }
        ForkResult::Child => {
            drop(read_end);
            // Out of mount(8)'s session, so its terminal closing does not stop us.
            let _ = setsid();
            if let Ok(null) = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/null")
            {
                let _ = nix::unistd::dup2_stdin(&null);
                let _ = nix::unistd::dup2_stdout(&null);
            }
            Ok(Side::Child(write_end))
        }
    }
}

fn redirect_stderr(path: &Path) -> std::io::Result<()> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    nix::unistd::dup2_stderr(&file).map_err(std::io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn argv(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn helper_is_recognised_by_its_file_name() {
        assert!(is_mount_helper(OsStr::new("/sbin/mount.shoal")));
        assert!(is_mount_helper(OsStr::new("mount.shoal")));
        assert!(!is_mount_helper(OsStr::new("/usr/local/bin/shoal")));
    }

    #[test]
    fn fstab_line_options_become_mount_args() {
        let call = parse_helper_args(&argv(
            "/sbin/mount.shoal shoal /mnt/shoal -o defaults,_netdev,socket=/run/a.sock,allow_other,retry_for=30s,x-systemd.automount",
        ))
        .expect("parse");
        assert_eq!(call.args.mountpoint, PathBuf::from("/mnt/shoal"));
        assert_eq!(call.args.socket, PathBuf::from("/run/a.sock"));
        assert!(call.args.allow_other);
        assert_eq!(call.args.retry_for, Duration::from_secs(30));
        assert!(!call.fake);
        assert!(call.log.is_none());
    }

    #[test]
    fn flags_from_mount_are_accepted_and_fake_does_not_mount() {
        let call = parse_helper_args(&argv(
            "mount.shoal shoal /mnt/s -sfnv -o rw,nofail,log=/var/log/shoal-mount.log,read_ahead=16MiB",
        ))
        .expect("parse");
        assert!(call.fake);
        assert_eq!(call.args.read_ahead, 16 << 20);
        assert_eq!(call.log, Some(PathBuf::from("/var/log/shoal-mount.log")));
        let call =
            parse_helper_args(&argv("mount.shoal shoal /mnt/s -o rw -t shoal")).expect("parse");
        assert!(!call.fake);
    }

    #[test]
    fn unknown_or_unsupported_options_are_refused() {
        for bad in [
            "mount.shoal shoal /mnt/s -o frobnicate",
            "mount.shoal shoal /mnt/s -o ro",
            "mount.shoal shoal /mnt/s -o threads=many",
            "mount.shoal /mnt/s",
            "mount.shoal a b c",
            "mount.shoal shoal /mnt/s -N 12",
            "mount.shoal shoal /mnt/s -x",
        ] {
            assert!(parse_helper_args(&argv(bad)).is_err(), "{bad}");
        }
    }
}
