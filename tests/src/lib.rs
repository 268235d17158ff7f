//! The multi-node harness: real `shoal-agent` processes on 127.0.X.N, driven through the
//! real `shoal` CLI, with temp dirs that are cleaned up (agents stopped) on drop.
//!
//! Each test picks its own `/24` in the loopback range ([`DevCluster::up`]'s `subnet`), so
//! tests run in parallel without port clashes. The binaries must be built first
//! (`cargo build --workspace`); `.ci/run` does that.

pub mod fs_api;
pub mod garage;
pub mod launcher;
pub mod netfault;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
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
    /// Starts `dev-cluster up` and `down` holding no file of the test's mounts.
    launcher: std::sync::Mutex<launcher::Launcher>,
}

impl DevCluster {
    /// Starts `nodes` agents on 127.0.`subnet`.1 .. and waits until they see each other.
    pub fn up(nodes: u8, subnet: u8) -> Self {
        Self::up_with(nodes, subnet, &[])
    }

    /// A cluster's directory and settings, not started yet (to prepare node directories
    /// first); [`DevCluster::start`] starts it.
    pub fn prepare(nodes: u8, subnet: u8, extra: &[&str]) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("shoal-test-")
            .tempdir()
            .expect("tempdir");
        DevCluster {
            launcher: std::sync::Mutex::new(launcher::Launcher::start(dir.path())),
            dir,
            nodes,
            subnet,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// Like [`DevCluster::up`], with extra `dev-cluster up` arguments.
    pub fn up_with(nodes: u8, subnet: u8, extra: &[&str]) -> Self {
        let c = Self::prepare(nodes, subnet, extra);
        c.start();
        c.wait_stores_open();
        c
    }

    /// (Re)runs `dev-cluster up`: starts every node that is not running.
    pub fn start(&self) {
        let out = self.run_up();
        assert!(
            out.status.success(),
            "dev-cluster up failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Waits until every node sees every live member's store open (a write sooner may be
    /// placed around a store still opening: degraded).
    pub fn wait_stores_open(&self) {
        let limit = Duration::from_secs(30);
        let start = Instant::now();
        loop {
            let waiting: Vec<String> = (1..=self.nodes)
                .filter(|&i| !self.exited(i))
                .filter_map(|i| self.stores_not_open(i).map(|w| format!("node {i}: {w}")))
                .collect();
            if waiting.is_empty() {
                return;
            }
            assert!(
                start.elapsed() < limit,
                "timed out after {limit:?} waiting for every store open:\n{}\n{}",
                waiting.join("\n"),
                (1..=self.nodes)
                    .map(|i| format!("node {i} warnings:\n{}", self.log_warnings(i, 8)))
                    .collect::<Vec<_>>()
                    .join("\n")
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// What node `i` sees of stores not open yet (None once every alive member's is).
    fn stores_not_open(&self, i: u8) -> Option<String> {
        let Some(s) = self.status(i) else {
            return Some("status does not answer".into());
        };
        let waiting: Vec<String> = s["nodes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|m| m["state"] == "alive" && m["store_accepting"] != true)
            .map(|m| format!("{} {}", m["name"], m))
            .collect();
        (!waiting.is_empty()).then(|| waiting.join("; "))
    }

    /// Like [`DevCluster::start`], but says whether it worked instead of panicking (for
    /// drop guards).
    pub fn try_start(&self) -> bool {
        self.run_up().status.success()
    }

    /// Runs `dev-cluster up` and returns its output, succeeded or not.
    pub fn run_up(&self) -> Output {
        let nodes = self.nodes.to_string();
        let base_ip = self.ip(1).to_string();
        let dir = self.path().to_string_lossy();
        let mut args = vec![
            "dev-cluster",
            "up",
            "--nodes",
            &nodes,
            "--dir",
            &dir,
            "--base-ip",
            &base_ip,
        ];
        if !self.extra.iter().any(|a| a == "--timeout") {
            args.extend(["--timeout", "60"]);
        }
        args.extend(self.extra.iter().map(String::as_str));
        self.launch(&args)
    }

    /// Runs the `shoal` CLI from the launcher (see [`launcher`]).
    fn launch(&self, args: &[&str]) -> Output {
        self.launcher
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .run(&binaries().shoal, args)
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
    /// A zombie counts only once its last thread is gone: until then the process still
    /// holds its files and sockets (a restart would find its ports in use).
    pub fn exited(&self, i: u8) -> bool {
        let pid = self.pid(i);
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => true,
            Ok(s) => {
                let zombie = s
                    .rsplit(')')
                    .next()
                    .is_some_and(|r| r.trim_start().starts_with('Z'));
                let threads = std::fs::read_dir(format!("/proc/{pid}/task"))
                    .map(|d| d.count())
                    .unwrap_or(0);
                zombie && threads <= 1
            }
        }
    }

    /// `GET /metrics` from node `i`.
    pub fn metrics(&self, i: u8) -> String {
        http_get(&format!("{}:9464", self.ip(i)), "/metrics")
    }

    /// Node `i`'s metadata replica: (applied index, state digest), read together; None
    /// when the agent does not answer.
    pub fn meta_digest(&self, i: u8) -> Option<(Option<u64>, u64)> {
        use shoal_agent_api::{AgentClient, Request, Response};
        let socket = self.socket(i);
        // A thread of its own: callers may be inside a runtime already.
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            rt.block_on(async move {
                let mut client = AgentClient::connect(socket).await.ok()?;
                match client.call(&Request::MetaDigest).await.ok()? {
                    Response::MetaDigest { applied, digest } => Some((applied, digest)),
                    _ => None,
                }
            })
        })
        .join()
        .ok()
        .flatten()
    }

    /// Waits until every node's replica has applied the same index with the same digest,
    /// and returns it. Panics after `limit` with each node's last answer.
    pub fn wait_for_identical_replicas(&self, limit: Duration) -> (u64, u64) {
        let start = Instant::now();
        loop {
            let all: Vec<_> = (1..=self.nodes).map(|i| self.meta_digest(i)).collect();
            if let Some(Some((Some(index), digest))) = all.first().copied()
                && all.iter().all(|d| *d == Some((Some(index), digest)))
            {
                return (index, digest);
            }
            assert!(
                start.elapsed() < limit,
                "replicas never converged within {limit:?}: (applied, digest) per node: {all:?}"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    pub fn log(&self, i: u8) -> String {
        std::fs::read_to_string(self.node_dir(i).join("agent.log")).unwrap_or_default()
    }

    /// The last `n` WARN or ERROR lines of node `i`'s log.
    pub fn log_warnings(&self, i: u8, n: usize) -> String {
        let log = self.log(i);
        let lines: Vec<&str> = log
            .lines()
            .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
            .collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
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

/// Mounts (`dev-cluster up --mount`) and single agents stopped and killed.
impl DevCluster {
    /// Node `i`'s mountpoint (`nodeN/mnt`, mounted by `dev-cluster up --mount`).
    pub fn mnt(&self, i: u8) -> PathBuf {
        self.node_dir(i).join("mnt")
    }

    /// The pid of node `i`'s `shoal mount` process.
    pub fn mount_pid(&self, i: u8) -> Pid {
        let text =
            std::fs::read_to_string(self.node_dir(i).join("mount.pid")).expect("mount.pid file");
        Pid::from_raw(text.trim().parse().expect("pid"))
    }

    pub fn mount_log(&self, i: u8) -> String {
        std::fs::read_to_string(self.node_dir(i).join("mount.log")).unwrap_or_default()
    }

    /// SIGTERM to node `i`'s agent, and waits (up to 20 s) until it has exited.
    pub fn stop_agent(&self, i: u8) {
        self.signal(i, Signal::SIGTERM);
        wait_for(Duration::from_secs(20), "the agent to stop", || {
            self.exited(i).then_some(())
        });
    }

    /// SIGKILL to node `i`'s agent, and waits until it is gone.
    pub fn kill_agent(&self, i: u8) {
        self.signal(i, Signal::SIGKILL);
        wait_for(Duration::from_secs(10), "the agent to die", || {
            self.exited(i).then_some(())
        });
    }

    /// Stops node `i`'s agent (SIGTERM), rewrites its `agent.toml` with `edit`, and starts
    /// it again with that config (as `dev-cluster up` would, but a later `up` rewrites the
    /// config without restarting it). Waits until every node sees it alive again.
    pub fn restart_with_config(&self, i: u8, edit: impl FnOnce(String) -> String) {
        self.stop_agent(i);
        let nd = self.node_dir(i);
        let config = std::fs::read_to_string(nd.join("agent.toml")).expect("agent.toml");
        std::fs::write(nd.join("agent.toml"), edit(config)).expect("write agent.toml");
        self.respawn_agent(i);
    }

    /// Starts node `i`'s agent again (it must have exited) with its config, leaving the
    /// other nodes as they are; waits until every running node sees it alive.
    pub fn respawn_agent(&self, i: u8) {
        use std::os::unix::process::CommandExt;
        let nd = self.node_dir(i);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(nd.join("agent.log"))
            .expect("agent.log");
        let mut child = Command::new(binaries().agent)
            .arg("--config")
            .arg(nd.join("agent.toml"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .process_group(0)
            .spawn()
            .expect("run shoal-agent");
        std::fs::write(nd.join("agent.pid"), format!("{}\n", child.id())).expect("pid file");
        // Reaped when it exits, so it does not linger as a zombie of the test.
        std::thread::spawn(move || {
            let _ = child.wait();
        });
        let name = format!("node{i}");
        let seen_alive_by = |o: u8| {
            self.status(o).is_some_and(|s| {
                s["nodes"].as_array().is_some_and(|n| {
                    n.iter().any(|m| {
                        m["name"] == name.as_str()
                            && m["state"] == "alive"
                            && m["rpc_addr"].is_string()
                    })
                })
            })
        };
        let started = Instant::now();
        loop {
            let missing: Vec<u8> = (1..=self.nodes)
                .filter(|&o| o == i || !self.exited(o))
                .filter(|&o| !seen_alive_by(o))
                .collect();
            if missing.is_empty() {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "node{i} restarted but not seen alive by nodes {missing:?} after 60 s; its log ends:\n{}",
                self.log(i)
                    .lines()
                    .filter(|l| !l.starts_with(' '))
                    .rev()
                    .take(30)
                    .collect::<Vec<_>>()
                    .join("\n")
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// One more `shoal mount` of node `i` on `mountpoint` (created), with extra `args`
    /// (`--allow-other`, ...); unmounted and stopped on drop. Waits until it is mounted.
    pub fn mount_extra(&self, i: u8, mountpoint: &Path, args: &[&str]) -> ExtraMount {
        std::fs::create_dir_all(mountpoint).expect("create the mountpoint");
        let log = std::fs::File::create(self.node_dir(i).join("extra-mount.log")).expect("log");
        let child = Command::new(binaries().shoal)
            .arg("mount")
            .arg(mountpoint)
            .arg("--socket")
            .arg(self.socket(i))
            .args(args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("run shoal mount");
        let mut m = ExtraMount {
            path: mountpoint.to_owned(),
            child,
        };
        wait_for(Duration::from_secs(30), "the extra mount", || {
            if let Ok(Some(status)) = m.child.try_wait() {
                panic!(
                    "shoal mount exited ({status}):\n{}",
                    std::fs::read_to_string(self.node_dir(i).join("extra-mount.log"))
                        .unwrap_or_default()
                );
            }
            is_mounted(&m.path).then_some(())
        });
        m
    }
}

/// A `shoal mount` started by [`DevCluster::mount_extra`].
pub struct ExtraMount {
    pub path: PathBuf,
    child: Child,
}

impl Drop for ExtraMount {
    fn drop(&mut self) {
        for cmd in [&["umount"][..], &["umount", "-l"]] {
            let _ = Command::new(cmd[0])
                .args(&cmd[1..])
                .arg(&self.path)
                .stderr(Stdio::null())
                .status();
            if !is_mounted(&self.path) {
                break;
            }
        }
        let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGTERM);
        let _ = self.child.wait();
    }
}

/// Whether `path` is a FUSE mountpoint (by /proc/self/mountinfo).
pub fn is_mounted(path: &Path) -> bool {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let Some(path) = path.to_str() else {
        return false;
    };
    text.lines().any(|l| {
        let Some((left, right)) = l.split_once(" - ") else {
            return false;
        };
        left.split(' ').nth(4) == Some(path) && right.starts_with("fuse")
    })
}

/// Whether process `pid` is alive (not gone, not a zombie).
pub fn process_alive(pid: Pid) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => false,
        Ok(s) => !s
            .rsplit(')')
            .next()
            .is_some_and(|r| r.trim_start().starts_with('Z')),
    }
}

impl Drop for DevCluster {
    fn drop(&mut self) {
        let dir = self.path().to_string_lossy().into_owned();
        let args = ["dev-cluster", "down", "--dir", &dir];
        let mut launcher = self.launcher.lock().unwrap_or_else(|p| p.into_inner());
        if launcher.try_run(&binaries().shoal, &args).is_err() {
            let _ = shoal(&args);
        }
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

/// Deterministic test bytes with no short period: byte `p` of stream `seed` is byte `p % 8`
/// of a 64-bit mix of `(seed, p / 8)`, so a block read back from the wrong offset or the
/// wrong file never matches. `stream_bytes(s, off, n)` is bytes `off..off + n` of stream `s`.
pub fn stream_bytes(seed: u64, offset: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    let end = offset + len as u64;
    let mut p = offset;
    while p < end {
        let word = mix64(seed ^ (p / 8).wrapping_mul(0x9E37_79B9_7F4A_7C15)).to_le_bytes();
        let from = (p % 8) as usize;
        let take = ((end - p) as usize).min(8 - from);
        out.extend_from_slice(&word[from..from + take]);
        p += take as u64;
    }
    out
}

/// splitmix64's finaliser.
fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Panics naming `what` and the first differing offset unless `got == want` (without
/// printing megabytes of bytes).
pub fn assert_bytes_eq(got: &[u8], want: &[u8], what: &str) {
    if got == want {
        return;
    }
    let first = got
        .iter()
        .zip(want)
        .position(|(a, b)| a != b)
        .unwrap_or(got.len().min(want.len()));
    panic!(
        "{what}: {} bytes read, {} expected; first difference at offset {first}",
        got.len(),
        want.len()
    );
}

/// Closes `f` and returns what close(2) said (dropping a `File` ignores it; on a mount,
/// close reports whether the cluster committed the data).
pub fn close(f: std::fs::File) -> nix::Result<()> {
    nix::unistd::close(f)
}

/// create + write + fsync + close of `path` on a mount; the first error.
pub fn write_fsync(path: &Path, data: &[u8]) -> Result<(), String> {
    let mut f = std::fs::File::create(path).map_err(|e| format!("create: {e}"))?;
    f.write_all(data).map_err(|e| format!("write: {e}"))?;
    f.sync_all().map_err(|e| format!("fsync: {e}"))?;
    close(f).map_err(|e| format!("close: {e}"))
}

/// Healing: what the cluster's redundancy is and who may be stopped.
impl DevCluster {
    /// The `redundancy` object of node `i`'s status, once its first scan ended.
    pub fn redundancy(&self, i: u8) -> Option<Value> {
        let r = self.status(i)?["redundancy"].clone();
        (!r.is_null()).then_some(r)
    }

    /// How often worker `worker` of node `i` finished its waiting work and went idle
    /// (`shoal_worker_rounds_total`; whole passes for the scanning workers).
    pub fn worker_rounds(&self, i: u8, worker: &str) -> f64 {
        metric_sum(
            &self.metrics(i),
            "shoal_worker_rounds_total",
            &format!("worker=\"{worker}\""),
        )
    }

    /// Waits until worker `worker` of each of `nodes` has gone idle `rounds` more times
    /// than when this was called (for the collectors and movers: whole passes).
    pub fn wait_for_rounds(&self, nodes: &[u8], worker: &str, rounds: u32, limit: Duration) {
        let before: Vec<f64> = nodes
            .iter()
            .map(|&i| self.worker_rounds(i, worker))
            .collect();
        wait_for(
            limit,
            &format!("{rounds} more rounds of {worker} on {nodes:?}"),
            || {
                nodes
                    .iter()
                    .zip(&before)
                    .all(|(&i, b)| self.worker_rounds(i, worker) >= b + f64::from(rounds))
                    .then_some(())
            },
        );
    }

    /// Waits until node `observer`'s repair worker has ended `scans` whole passes that
    /// began after this call (one ends every few seconds); its redundancy summary then.
    pub fn wait_for_scans(&self, observer: u8, scans: usize, limit: Duration) -> Value {
        let started = Instant::now();
        // Passes seen ending after the call (the first may have begun before it), and
        // when the last of them ended, as time since `started`.
        let mut ended = 0;
        let mut last: Option<Duration> = None;
        loop {
            if let Some(r) = self.redundancy(observer)
                && let Some(ago) = r["scanned_ms_ago"].as_u64()
                && let Some(end) = started.elapsed().checked_sub(Duration::from_millis(ago))
            {
                if last.is_none_or(|l| end > l + Duration::from_millis(500)) {
                    ended += 1;
                    last = Some(end);
                }
                if ended > scans {
                    return r;
                }
            }
            assert!(
                started.elapsed() < limit,
                "node {observer}: {} repair passes ended within {limit:?}, not {scans}",
                ended.saturating_sub(1)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Waits until node `observer` reports every stripe healthy (at least `min_stripes`
    /// of them) in a scan that ended after this call began; returns the redundancy object.
    pub fn wait_until_healthy(&self, observer: u8, min_stripes: u64, limit: Duration) -> Value {
        let started = Instant::now();
        let mut last = Value::Null;
        loop {
            if let Some(r) = self.redundancy(observer) {
                let fresh = r["scanned_ms_ago"]
                    .as_u64()
                    .is_some_and(|ago| Duration::from_millis(ago) < started.elapsed());
                let total = r["stripes_total"].as_u64().unwrap_or(0);
                if fresh && total >= min_stripes && r["stripes_healthy"].as_u64() == Some(total) {
                    return r;
                }
                last = r;
            }
            assert!(
                started.elapsed() < limit,
                "stripes never all healthy within {limit:?}; last: {last}"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// The nodes (1-based) that are not metadata voters, as node `observer` sees it.
    /// Waits until `observer` knows a leader and its voters.
    pub fn non_voters(&self, observer: u8) -> Vec<u8> {
        let voters: Vec<String> = wait_for(Duration::from_secs(30), "the voters known", || {
            let status = self.status(observer)?;
            status["meta"]["leader"].as_str()?;
            let voters: Vec<String> = status["meta"]["voters"]
                .as_array()?
                .iter()
                .filter_map(|x| x.as_str().map(String::from))
                .collect();
            (!voters.is_empty()).then_some(voters)
        })
        .0;
        (1..=self.nodes)
            .filter(|&i| !voters.contains(&self.node_id(i)))
            .collect()
    }

    /// The sum over every running node of metric `name` (a counter's `_total`).
    pub fn metric_everywhere(&self, name: &str) -> f64 {
        (1..=self.nodes)
            .filter(|&i| !self.exited(i))
            .map(|i| metric_sum(&self.metrics(i), name, ""))
            .sum()
    }
}

/// A file written through a mount: its name, content seed and size.
pub struct Written {
    pub name: String,
    pub seed: u64,
    pub size: usize,
}

/// Writes files `f<seed>` of 1 to 3 MiB (striped) through node `node`'s mount, fsync'd.
pub fn write_files(c: &DevCluster, node: u8, seeds: std::ops::Range<u64>, out: &mut Vec<Written>) {
    for seed in seeds {
        let size = (1 << 20) + (seed as usize * 611_953) % (2 << 20);
        let name = format!("f{seed}");
        write_fsync(&c.mnt(node).join(&name), &stream_bytes(seed, 0, size))
            .unwrap_or_else(|e| panic!("{name} ({size} bytes): {e}"));
        out.push(Written { name, seed, size });
    }
}

/// Reads every file back through node `node`'s mount and compares every byte.
pub fn check_files(c: &DevCluster, node: u8, files: &[Written]) {
    for f in files {
        let got = std::fs::read(c.mnt(node).join(&f.name))
            .unwrap_or_else(|e| panic!("read {} through node {node}: {e}", f.name));
        assert_bytes_eq(&got, &stream_bytes(f.seed, 0, f.size), &f.name);
    }
}

/// Node `i`'s shard files (`<stripe>.<index>`), without writes in progress.
pub fn shard_files(c: &DevCluster, i: u8) -> Vec<PathBuf> {
    let dir = c.node_dir(i).join("data/store/shards");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.retain(|p| p.extension().is_some_and(|e| e != "tmp"));
    files.sort();
    files
}

impl DevCluster {
    /// Waits until node `observer` sees every node in the committed layout.
    pub fn wait_layout(&self, observer: u8) {
        wait_for(Duration::from_secs(30), "every node in the layout", || {
            let status = self.status(observer)?;
            let nodes = status["nodes"].as_array()?;
            (nodes.len() == usize::from(self.nodes)
                && nodes.iter().all(|m| m["layout_state"] == "active"))
            .then_some(())
        });
    }

    /// Node `id`'s `layout_state` as node `observer` sees it.
    pub fn layout_state(&self, observer: u8, id: &str) -> Option<String> {
        self.member(observer, id)?["layout_state"]
            .as_str()
            .map(String::from)
    }
}
