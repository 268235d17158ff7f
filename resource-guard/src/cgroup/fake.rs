//! An in-memory model of the cgroup v2 kernel interface, for machines without v2
//! controllers (like the build machines). It enforces the rules that bite in production:
//! controller files exist only where the parent enables the controller, a cgroup with
//! processes cannot enable controllers for its children (and vice versa), a non-empty
//! cgroup cannot be removed, and a cpuset must be a subset of the parent's. With
//! [`FakeCgroupV2::with_host_processes`] its pids are this machine's processes, and one that
//! exited drops out of its group as on the kernel.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use super::v2::{CgroupV2, V2Tree};
use crate::CpuList;

const CONTROLLERS: [&str; 3] = ["cpu", "cpuset", "memory"];

#[derive(Default, Clone)]
struct Node {
    procs: BTreeSet<u32>,
    subtree_control: BTreeSet<String>,
    files: BTreeMap<String, String>,
}

/// The in-memory tree. The root holds every process at start and offers every controller.
pub struct MemTree {
    nodes: Mutex<BTreeMap<String, Node>>,
    root_cpus: String,
    /// Pids are real processes: those without `/proc/PID` have exited and are not listed.
    host_processes: bool,
    /// Processes with capabilities the mover (the agent) lacks, such as a mount run as root.
    privileged: Mutex<BTreeSet<u32>>,
    /// Whether the mover has CAP_SYS_NICE.
    sys_nice: AtomicBool,
}

/// cgroup v2 over [`MemTree`]: the fake half of the [`super::CgroupFs`] contract.
pub type FakeCgroupV2 = CgroupV2<MemTree>;

impl FakeCgroupV2 {
    /// A fake where this process sits at `parent` (created, holding `procs`) on a machine
    /// with CPUs `cpus`.
    pub fn new(parent: &str, procs: &[u32], cpus: &str) -> Self {
        Self::build(parent, procs, cpus, false)
    }

    /// As [`FakeCgroupV2::new`], with pids that are this machine's processes: one that
    /// exited is no longer a member of any group (as on the kernel, where a crashed agent
    /// leaves its group at once).
    pub fn with_host_processes(parent: &str, procs: &[u32], cpus: &str) -> Self {
        Self::build(parent, procs, cpus, true)
    }

    fn build(parent: &str, procs: &[u32], cpus: &str, host_processes: bool) -> Self {
        let tree = MemTree {
            nodes: Mutex::new(BTreeMap::from([(String::new(), Node::default())])),
            root_cpus: cpus.to_owned(),
            host_processes,
            privileged: Mutex::new(BTreeSet::new()),
            sys_nice: AtomicBool::new(true),
        };
        let parent = parent.trim_matches('/');
        let mut path = String::new();
        for part in parent.split('/').filter(|p| !p.is_empty()) {
            // As systemd does for a delegated service: every ancestor enables the
            // controllers for its children.
            let control = if path.is_empty() {
                "cgroup.subtree_control".to_owned()
            } else {
                format!("{path}/cgroup.subtree_control")
            };
            let _ = tree.write(&control, "+cpu +cpuset +memory");
            path = if path.is_empty() {
                part.to_owned()
            } else {
                format!("{path}/{part}")
            };
            let _ = tree.mkdir(&path);
        }
        for pid in procs {
            let _ = tree.write(&format!("{path}/cgroup.procs"), &pid.to_string());
        }
        CgroupV2::with_tree(tree, parent)
    }
}

fn busy(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::ResourceBusy, what.to_owned())
}
fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, what.to_owned())
}
fn missing(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::NotFound, what.to_owned())
}

fn split(path: &str) -> (String, String) {
    let path = path.trim_matches('/');
    match path.rsplit_once('/') {
        Some((dir, file)) => (dir.to_owned(), file.to_owned()),
        None => (String::new(), path.to_owned()),
    }
}

fn parent_of(dir: &str) -> Option<String> {
    if dir.is_empty() {
        return None;
    }
    Some(
        dir.rsplit_once('/')
            .map(|(p, _)| p.to_owned())
            .unwrap_or_default(),
    )
}

impl MemTree {
    /// Marks `pid` as holding capabilities the mover lacks: moving it below the cpuset
    /// controller then needs CAP_SYS_NICE, as the kernel's cpuset `can_attach` asks
    /// (`security_task_setscheduler`).
    pub fn mark_privileged(&self, pid: u32) {
        self.privileged
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(pid);
    }

    /// Whether the mover has CAP_SYS_NICE (it has by default, as the agent's unit gives it).
    pub fn set_sys_nice(&self, has: bool) {
        self.sys_nice.store(has, Ordering::SeqCst);
    }

    /// The tree, with every process that exited dropped from its group.
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Node>> {
        let mut nodes = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
        if self.host_processes {
            for n in nodes.values_mut() {
                n.procs
                    .retain(|p| std::path::Path::new(&format!("/proc/{p}")).exists());
            }
        }
        nodes
    }

    /// Controllers available in `dir`: all at the root, else what the parent enables.
    fn available(nodes: &BTreeMap<String, Node>, dir: &str) -> BTreeSet<String> {
        match parent_of(dir) {
            None => CONTROLLERS.iter().map(|c| c.to_string()).collect(),
            Some(p) => nodes
                .get(&p)
                .map(|n| n.subtree_control.clone())
                .unwrap_or_default(),
        }
    }

    fn effective_cpus(&self, nodes: &BTreeMap<String, Node>, dir: &str) -> String {
        let mut cur = Some(dir.to_owned());
        while let Some(d) = cur {
            if let Some(c) = nodes.get(&d).and_then(|n| n.files.get("cpuset.cpus")) {
                return c.clone();
            }
            cur = parent_of(&d);
        }
        self.root_cpus.clone()
    }
}

impl V2Tree for MemTree {
    fn read(&self, path: &str) -> io::Result<String> {
        let (dir, file) = split(path);
        let nodes = self.lock();
        let node = nodes.get(&dir).ok_or_else(|| missing(path))?;
        let list = |s: &BTreeSet<String>| s.iter().cloned().collect::<Vec<_>>().join(" ");
        match file.as_str() {
            "cgroup.procs" => Ok(node.procs.iter().map(|p| format!("{p}\n")).collect()),
            "cgroup.subtree_control" => Ok(list(&node.subtree_control)),
            "cgroup.controllers" => Ok(list(&Self::available(&nodes, &dir))),
            "cpuset.cpus.effective" => Ok(self.effective_cpus(&nodes, &dir)),
            f => {
                let controller = f.split('.').next().unwrap_or_default();
                if !Self::available(&nodes, &dir).contains(controller) {
                    return Err(missing(path));
                }
                Ok(node.files.get(f).cloned().unwrap_or_else(|| match f {
                    "memory.max" => "max".into(),
                    "cpu.max" => "max 100000".into(),
                    "cpu.stat" => "usage_usec 0\n".into(),
                    "memory.current" | "memory.peak" => "0".into(),
                    _ => String::new(),
                }))
            }
        }
    }

    fn write(&self, path: &str, value: &str) -> io::Result<()> {
        let (dir, file) = split(path);
        let mut nodes = self.lock();
        if !nodes.contains_key(&dir) {
            return Err(missing(path));
        }
        match file.as_str() {
            "cgroup.procs" => {
                let pid: u32 = value.trim().parse().map_err(|_| invalid("pid"))?;
                let is_root = dir.is_empty();
                if !is_root && !nodes[&dir].subtree_control.is_empty() {
                    return Err(busy(
                        "no internal processes: this cgroup enables controllers for its children",
                    ));
                }
                let privileged = self
                    .privileged
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .contains(&pid);
                if privileged
                    && !self.sys_nice.load(Ordering::SeqCst)
                    && Self::available(&nodes, &dir).contains("cpuset")
                {
                    return Err(io::Error::from(io::ErrorKind::PermissionDenied));
                }
                for n in nodes.values_mut() {
                    n.procs.remove(&pid);
                }
                if let Some(n) = nodes.get_mut(&dir) {
                    n.procs.insert(pid);
                }
                Ok(())
            }
            "cgroup.subtree_control" => {
                let available = Self::available(&nodes, &dir);
                for token in value.split_whitespace() {
                    let (on, c) = match token.split_at(1) {
                        ("+", c) => (true, c),
                        ("-", c) => (false, c),
                        _ => return Err(invalid(token)),
                    };
                    if !available.contains(c) {
                        return Err(invalid(&format!("controller {c} not available")));
                    }
                    let node = nodes.get_mut(&dir).ok_or_else(|| missing(path))?;
                    if on && !dir.is_empty() && !node.procs.is_empty() {
                        return Err(busy("cgroup holds processes"));
                    }
                    if on {
                        node.subtree_control.insert(c.to_owned());
                    } else {
                        node.subtree_control.remove(c);
                    }
                }
                Ok(())
            }
            f => {
                let controller = f.split('.').next().unwrap_or_default();
                if !Self::available(&nodes, &dir).contains(controller) {
                    return Err(missing(path));
                }
                let v = value.trim();
                let ok = match f {
                    "memory.max" => v == "max" || v.parse::<u64>().is_ok(),
                    // The kernel's bounds: a quota of at least 1 ms, a period of 1 ms to 1 s.
                    "cpu.max" => v.split_once(' ').is_some_and(|(q, p)| {
                        (q == "max" || q.parse::<u64>().is_ok_and(|q| q >= 1000))
                            && p.parse::<u64>()
                                .is_ok_and(|p| (1000..=1_000_000).contains(&p))
                    }),
                    "cpuset.cpus" => {
                        let parent = parent_of(&dir).unwrap_or_default();
                        let allowed = CpuList::parse(&self.effective_cpus(&nodes, &parent));
                        match (CpuList::parse(v), allowed) {
                            (Some(want), Some(allowed)) => want.0.is_subset(&allowed.0),
                            _ => false,
                        }
                    }
                    "cpuset.mems" => CpuList::parse(v).is_some(),
                    _ => false,
                };
                if !ok {
                    return Err(invalid(&format!("{f} = {v:?}")));
                }
                // What the kernel keeps: whole pages of memory, CPU lists in its own form.
                let kept = match f {
                    "memory.max" => v
                        .parse::<u64>()
                        .map_or_else(|_| v.to_owned(), |b| (b / 4096 * 4096).to_string()),
                    "cpuset.cpus" | "cpuset.mems" => {
                        CpuList::parse(v).map_or_else(|| v.to_owned(), |l| l.to_string())
                    }
                    _ => v.to_owned(),
                };
                if let Some(n) = nodes.get_mut(&dir) {
                    n.files.insert(f.to_owned(), kept);
                }
                Ok(())
            }
        }
    }

    fn mkdir(&self, path: &str) -> io::Result<()> {
        let path = path.trim_matches('/').to_owned();
        let mut nodes = self.lock();
        if nodes.contains_key(&path) {
            return Err(io::Error::new(io::ErrorKind::AlreadyExists, path));
        }
        let parent = parent_of(&path).unwrap_or_default();
        if !nodes.contains_key(&parent) {
            return Err(missing(&parent));
        }
        nodes.insert(path, Node::default());
        Ok(())
    }

    fn rmdir(&self, path: &str) -> io::Result<()> {
        let path = path.trim_matches('/').to_owned();
        let mut nodes = self.lock();
        let node = nodes.get(&path).ok_or_else(|| missing(&path))?;
        let prefix = format!("{path}/");
        if !node.procs.is_empty() || nodes.keys().any(|k| k.starts_with(&prefix)) {
            return Err(busy("cgroup is not empty"));
        }
        nodes.remove(&path);
        Ok(())
    }

    fn exists(&self, path: &str) -> bool {
        self.lock().contains_key(path.trim_matches('/'))
    }
}
