//! The multi-node harness: real `shoal-agent` processes on 127.0.X.N, driven through the
//! real `shoal` CLI, with temp dirs that are cleaned up (agents stopped) on drop.
//!
//! Each test picks its own `/24` in the loopback range ([`DevCluster::up`]'s `subnet`), so
//! tests run in parallel without port clashes. The binaries must be built first
//! (`cargo build --workspace`); `.ci/run` does that.

pub mod fs_api;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

/// Paths of the built binaries, found next to the test executable's target dir.
pub struct Binaries {
    pub shoal: PathBuf,
    pub agent: PathBuf,
}

pub fn binaries() -> Binaries {
    // target/<profile>/deps/<test>-<hash>  →  target/<profile>/
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test binary lives in target/<profile>/deps");
    let b = Binaries {
        shoal: dir.join("shoal"),
        agent: dir.join("shoal-agent"),
    };
    for p in [&b.shoal, &b.agent] {
        assert!(
            p.is_file(),
            "{} is missing: run `cargo build --workspace` before the tests",
            p.display()
        );
    }
    b
}

/// Runs `shoal ARGS...` and returns its output.
pub fn shoal(args: &[&str]) -> Output {
    Command::new(binaries().shoal)
        .args(args)
        .output()
        .expect("run shoal")
}

/// Polls `f` every 100 ms until it returns `Some`, or panics after `limit` naming `what`.
pub fn wait_for<T>(limit: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> (T, Duration) {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return (v, start.elapsed());
        }
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A dev cluster in a temp dir, stopped on drop.
pub struct DevCluster {
    pub dir: tempfile::TempDir,
    pub nodes: u8,
    pub subnet: u8,
    /// Extra `dev-cluster up` arguments (reservations, ...).
    pub extra: Vec<String>,
}

impl DevCluster {
    /// Starts `nodes` agents on 127.0.`subnet`.1 .. and waits until they see each other.
    pub fn up(nodes: u8, subnet: u8) -> Self {
        Self::up_with(nodes, subnet, &[])
    }

    /// Like [`DevCluster::up`], with extra `dev-cluster up` arguments.
    pub fn up_with(nodes: u8, subnet: u8, extra: &[&str]) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("shoal-test-")
            .tempdir()
            .expect("tempdir");
        let c = DevCluster {
            dir,
            nodes,
            subnet,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        c.start();
        c
    }

    /// (Re)runs `dev-cluster up`: starts every node that is not running.
    pub fn start(&self) {
        let nodes = self.nodes.to_string();
        let base_ip = self.ip(1).to_string();
        let mut args = vec![
            "dev-cluster",
            "up",
            "--nodes",
            &nodes,
            "--dir",
            self.path().to_str().expect("utf-8 path"),
            "--base-ip",
            &base_ip,
            "--timeout",
            "60",
        ];
        args.extend(self.extra.iter().map(String::as_str));
        let out = shoal(&args);
        assert!(
            out.status.success(),
            "dev-cluster up failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn ip(&self, i: u8) -> Ipv4Addr {
        Ipv4Addr::new(127, 0, self.subnet, i)
    }

    pub fn node_dir(&self, i: u8) -> PathBuf {
        self.path().join(format!("node{i}"))
    }

    pub fn socket(&self, i: u8) -> PathBuf {
        self.node_dir(i).join("agent.sock")
    }

    pub fn pid(&self, i: u8) -> Pid {
        let text = std::fs::read_to_string(self.node_dir(i).join("agent.pid")).expect("pid file");
        Pid::from_raw(text.trim().parse().expect("pid"))
    }

    /// `shoal status --json` against node `i`, or None if it does not answer.
    pub fn status(&self, i: u8) -> Option<Value> {
        let out = shoal(&["status", "--json", "--socket", self.socket(i).to_str()?]);
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }

    /// The `nodes` entry for node id `id` in node `observer`'s status.
    pub fn member(&self, observer: u8, id: &str) -> Option<Value> {
        let status = self.status(observer)?;
        status["nodes"]
            .as_array()?
            .iter()
            .find(|n| n["id"] == id)
            .cloned()
    }

    /// Node `i`'s own id, from its status.
    pub fn node_id(&self, i: u8) -> String {
        let status = self.status(i).expect("status");
        status["node"].as_str().expect("node id").to_owned()
    }

    pub fn signal(&self, i: u8, sig: Signal) {
        kill(self.pid(i), sig).expect("kill");
    }

    /// Whether node `i`'s agent process has exited (reaped or zombie).
    pub fn exited(&self, i: u8) -> bool {
        let pid = self.pid(i);
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => true,
            Ok(s) => s
                .rsplit(')')
                .next()
                .is_some_and(|r| r.trim_start().starts_with('Z')),
        }
    }

    /// `GET /metrics` from node `i`.
    pub fn metrics(&self, i: u8) -> String {
        http_get(&format!("{}:9464", self.ip(i)), "/metrics")
    }

    pub fn log(&self, i: u8) -> String {
        std::fs::read_to_string(self.node_dir(i).join("agent.log")).unwrap_or_default()
    }
}

impl DevCluster {
    /// `dev-cluster down`: stops every agent (and mount) gracefully.
    pub fn down(&self) {
        let out = shoal(&[
            "dev-cluster",
            "down",
            "--dir",
            self.path().to_str().unwrap_or(""),
        ]);
        assert!(
            out.status.success(),
            "dev-cluster down failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Which node (1-based) node `observer` sees as the metadata leader.
    pub fn meta_leader(&self, observer: u8) -> Option<u8> {
        let status = self.status(observer)?;
        let leader = status["meta"]["leader"].as_str()?.to_owned();
        (1..=self.nodes).find(|&i| self.status(i).is_some_and(|s| s["node"] == leader.as_str()))
    }
}

impl Drop for DevCluster {
    fn drop(&mut self) {
        let _ = shoal(&[
            "dev-cluster",
            "down",
            "--dir",
            self.path().to_str().unwrap_or(""),
        ]);
    }
}

/// Whether this process runs as root (cgroup tests need it).
pub fn is_root() -> bool {
    nix::unistd::Uid::effective().is_root()
}

/// The directory of process `pid`'s cgroup in the v1 `controller` hierarchy.
pub fn v1_cgroup_dir(pid: Pid, controller: &str) -> Option<PathBuf> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    text.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let _ = parts.next()?;
        let ctrls = parts.next()?;
        let path = parts.next()?;
        ctrls
            .split(',')
            .any(|c| c == controller)
            .then(|| PathBuf::from(format!("/sys/fs/cgroup/{controller}{}", path)))
    })
}

/// Sum of the values of every sample of `name` whose labels contain `label` ("" for any).
pub fn metric_sum(text: &str, name: &str, label: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter(|l| l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

pub fn http_get(addr: &str, path: &str) -> String {
    let mut s = TcpStream::connect(addr).expect("connect metrics");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("write");
    let mut body = String::new();
    s.read_to_string(&mut body).expect("read");
    body
}
