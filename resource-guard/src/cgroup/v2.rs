//! cgroup v2: the unified hierarchy, written file by file.
//!
//! cgroups-rs creates a v2 group by enabling controllers in every ancestor's
//! `cgroup.subtree_control` *before* any process moves. Under systemd with `Delegate=yes`
//! the agent starts inside its service cgroup, and the kernel refuses to enable controllers
//! for the children of a cgroup that still holds processes (EBUSY). So the order here is:
//! create the child, move the joining processes into it, then enable the controllers in the
//! parent, then write the limits. The file operations go through [`V2Tree`], so the same
//! logic runs against the kernel ([`SysTree`]) and against the in-memory model of the kernel
//! used by the fake ([`crate::FakeCgroupV2`]).
//!
//! What real v2 and systemd showed (issue 17): a cgroup that enables controllers for its
//! children can hold no process, and systemd starts the unit's next process in the unit's
//! cgroup. So a clean stop turns the controllers off before the agent leaves (the mounts
//! stay in the group, unconfined until the next agent takes them over); after a crash the
//! unit's `ExecStopPost` (run in the unit's `.control` subgroup) does it, else systemd
//! fails every restart with 219/CGROUP. Moving a mount below the cpuset controller needs
//! CAP_SYS_NICE (the kernel's cpuset `can_attach`), so the unit keeps that one capability.
//! The kernel keeps `memory.max` in whole pages (rounded down) and CPU lists in its own
//! form ("0,1" reads "0-1"), and refuses a quota under 1 ms; the fake does the same
//! (`mark_privileged`/`set_sys_nice` model the EPERM). systemd ≥ 254's `DelegateSubgroup=`
//! would make the first two rules moot; RHEL 9 and Ubuntu 22.04 ship 252 and 249.

use std::io;
use std::path::PathBuf;

use super::{CgroupFs, CgroupLimits, CgroupUsage, CgroupVersion, parse_proc_cgroup};
use crate::GuardError;

/// File operations on a cgroup v2 tree; paths are relative to its root ("" is the root).
pub trait V2Tree: Send + Sync {
    fn read(&self, path: &str) -> io::Result<String>;
    fn write(&self, path: &str, value: &str) -> io::Result<()>;
    fn mkdir(&self, path: &str) -> io::Result<()>;
    fn rmdir(&self, path: &str) -> io::Result<()>;
    fn exists(&self, path: &str) -> bool;
}

/// The kernel's tree at `/sys/fs/cgroup`.
pub struct SysTree {
    root: PathBuf,
}

impl SysTree {
    fn at(&self, path: &str) -> PathBuf {
        self.root.join(path.trim_start_matches('/'))
    }
}

impl V2Tree for SysTree {
    fn read(&self, path: &str) -> io::Result<String> {
        std::fs::read_to_string(self.at(path))
    }
    fn write(&self, path: &str, value: &str) -> io::Result<()> {
        std::fs::write(self.at(path), value)
    }
    fn mkdir(&self, path: &str) -> io::Result<()> {
        std::fs::create_dir(self.at(path))
    }
    fn rmdir(&self, path: &str) -> io::Result<()> {
        std::fs::remove_dir(self.at(path))
    }
    fn exists(&self, path: &str) -> bool {
        self.at(path).is_dir()
    }
}

pub struct CgroupV2<T: V2Tree = SysTree> {
    tree: T,
    /// This process's cgroup at construction, relative to the root.
    parent: String,
}

impl CgroupV2<SysTree> {
    pub fn for_current_process() -> Result<Self, GuardError> {
        let text = std::fs::read_to_string("/proc/self/cgroup").map_err(|e| {
            GuardError::Unenforceable(format!("cannot read /proc/self/cgroup: {e}"))
        })?;
        let parent = parse_proc_cgroup(&text)
            .into_iter()
            .find(|(controllers, _)| controllers.is_empty())
            .map(|(_, p)| p)
            .ok_or_else(|| {
                GuardError::Unenforceable("this process has no cgroup v2 path".into())
            })?;
        Ok(Self::below(&parent))
    }

    /// Groups below `parent` (a path in the kernel's tree, e.g.
    /// "/system.slice/shoal-agent.service"), whatever cgroup this process is in.
    pub fn below(parent: &str) -> Self {
        Self::with_tree(
            SysTree {
                root: PathBuf::from("/sys/fs/cgroup"),
            },
            parent,
        )
    }
}

impl<T: V2Tree> CgroupV2<T> {
    pub fn with_tree(tree: T, parent: &str) -> Self {
        CgroupV2 {
            tree,
            parent: parent.trim_matches('/').to_owned(),
        }
    }

    pub fn tree(&self) -> &T {
        &self.tree
    }

    fn path(&self, name: &str) -> String {
        if self.parent.is_empty() {
            name.to_owned()
        } else {
            format!("{}/{name}", self.parent)
        }
    }

    fn file(&self, name: &str, file: &str) -> String {
        format!("{}/{file}", self.path(name))
    }

    fn parent_file(&self, file: &str) -> String {
        if self.parent.is_empty() {
            file.to_owned()
        } else {
            format!("{}/{file}", self.parent)
        }
    }

    fn err(&self, name: &str, what: &str, e: io::Error) -> GuardError {
        GuardError::cgroup(&self.describe(name), format!("{what}: {e}"))
    }

    fn apply(&self, name: &str, limits: &CgroupLimits, join: &[u32]) -> Result<(), GuardError> {
        self.tree
            .mkdir(&self.path(name))
            .map_err(|e| self.err(name, "mkdir", e))?;
        for pid in join {
            self.attach(name, *pid)?;
        }
        let mut wanted = vec!["+cpu", "+memory"];
        if limits.cpus.is_some() {
            wanted.push("+cpuset");
        }
        let enabled = self
            .tree
            .read(&self.parent_file("cgroup.subtree_control"))
            .unwrap_or_default();
        for c in wanted {
            if !enabled.split_whitespace().any(|e| e == &c[1..]) {
                self.tree
                    .write(&self.parent_file("cgroup.subtree_control"), c)
                    .map_err(|e| {
                        self.err(name, &format!("enabling {} for children of the parent cgroup (it must hold no other processes; use Delegate=yes)", &c[1..]), e)
                    })?;
            }
        }
        if let Some(cpus) = &limits.cpus {
            if let Some(mems) = &limits.mems {
                self.tree
                    .write(&self.file(name, "cpuset.mems"), mems)
                    .map_err(|e| self.err(name, "cpuset.mems", e))?;
            }
            self.tree
                .write(&self.file(name, "cpuset.cpus"), cpus)
                .map_err(|e| self.err(name, "cpuset.cpus", e))?;
        }
        if let Some((quota, period)) = limits.cpu_quota {
            self.tree
                .write(&self.file(name, "cpu.max"), &format!("{quota} {period}"))
                .map_err(|e| self.err(name, "cpu.max", e))?;
        }
        if let Some(max) = limits.memory_max {
            self.tree
                .write(&self.file(name, "memory.max"), &max.to_string())
                .map_err(|e| self.err(name, "memory.max", e))?;
        }
        Ok(())
    }

    /// Turns off the controllers `apply` enabled for the parent's children: a cgroup that
    /// enables them may hold no process. We are the parent's only user under Delegate=yes.
    fn stop_enabling_controllers(&self) {
        for c in ["-cpuset", "-cpu", "-memory"] {
            let _ = self
                .tree
                .write(&self.parent_file("cgroup.subtree_control"), c);
        }
    }

    fn read_u64(&self, name: &str, file: &str) -> Option<u64> {
        self.tree
            .read(&self.file(name, file))
            .ok()?
            .trim()
            .parse()
            .ok()
    }
}

impl<T: V2Tree> CgroupFs for CgroupV2<T> {
    fn version(&self) -> CgroupVersion {
        CgroupVersion::V2
    }

    fn describe(&self, name: &str) -> String {
        format!("/sys/fs/cgroup/{}", self.path(name))
    }

    fn exists(&self, name: &str) -> bool {
        self.tree.exists(&self.path(name))
    }

    fn create(&self, name: &str, limits: &CgroupLimits, join: &[u32]) -> Result<(), GuardError> {
        if self.exists(name) {
            return Err(GuardError::cgroup(&self.describe(name), "already exists"));
        }
        self.apply(name, limits, join).inspect_err(|_| {
            let _ = self.remove(name);
        })
    }

    fn limits(&self, name: &str) -> Result<CgroupLimits, GuardError> {
        if !self.exists(name) {
            return Err(GuardError::cgroup(&self.describe(name), "does not exist"));
        }
        let read = |f: &str| {
            self.tree
                .read(&self.file(name, f))
                .ok()
                .map(|s| s.trim().to_owned())
        };
        let cpus = read("cpuset.cpus").filter(|s| !s.is_empty());
        let mems = cpus
            .as_ref()
            .and(read("cpuset.mems"))
            .filter(|s| !s.is_empty());
        let cpu_quota = read("cpu.max").and_then(|s| {
            let (q, p) = s.split_once(' ')?;
            Some((q.parse().ok()?, p.parse().ok()?))
        });
        let memory_max = read("memory.max").and_then(|s| s.parse().ok());
        Ok(CgroupLimits {
            cpus,
            mems,
            cpu_quota,
            memory_max,
        })
    }

    fn attach(&self, name: &str, pid: u32) -> Result<(), GuardError> {
        self.tree
            .write(&self.file(name, "cgroup.procs"), &pid.to_string())
            .map_err(|e| {
                let why = if e.kind() == io::ErrorKind::PermissionDenied {
                    " (below the cpuset controller the kernel asks for CAP_SYS_NICE to move a process with capabilities the agent lacks: give the agent AmbientCapabilities=CAP_SYS_NICE)"
                } else {
                    ""
                };
                self.err(name, &format!("moving pid {pid}{why}"), e)
            })
    }

    fn procs(&self, name: &str) -> Result<Vec<u32>, GuardError> {
        let text = self
            .tree
            .read(&self.file(name, "cgroup.procs"))
            .map_err(|e| self.err(name, "cgroup.procs", e))?;
        Ok(text.lines().filter_map(|l| l.trim().parse().ok()).collect())
    }

    fn usage(&self, name: &str) -> Result<CgroupUsage, GuardError> {
        let cpu_usage_usec = self
            .tree
            .read(&self.file(name, "cpu.stat"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("usage_usec ")?.trim().parse().ok())
            })
            .unwrap_or(0);
        Ok(CgroupUsage {
            memory_bytes: self.read_u64(name, "memory.current").unwrap_or(0),
            memory_peak_bytes: self.read_u64(name, "memory.peak").unwrap_or(0),
            cpu_usage_usec,
        })
    }

    fn remove(&self, name: &str) -> Result<(), GuardError> {
        if !self.exists(name) {
            return Ok(());
        }
        let pids = self.procs(name).unwrap_or_default();
        if !pids.is_empty() {
            self.stop_enabling_controllers();
        }
        for pid in pids {
            // Back to the parent; a process that exited meanwhile is fine.
            let _ = self
                .tree
                .write(&self.parent_file("cgroup.procs"), &pid.to_string());
        }
        self.tree
            .rmdir(&self.path(name))
            .map_err(|e| self.err(name, "rmdir", e))
    }

    fn leave(&self, name: &str, pid: u32) -> Result<bool, GuardError> {
        if !self.exists(name) {
            return Ok(true);
        }
        self.stop_enabling_controllers();
        self.tree
            .write(&self.parent_file("cgroup.procs"), &pid.to_string())
            .map_err(|e| self.err(name, &format!("moving pid {pid} to the parent"), e))?;
        if !self.procs(name)?.is_empty() {
            return Ok(false);
        }
        self.tree
            .rmdir(&self.path(name))
            .map_err(|e| self.err(name, "rmdir", e))?;
        Ok(true)
    }
}
