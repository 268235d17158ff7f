//! The seam between the guard and the kernel's cgroup filesystem.

pub mod contract;
pub mod fake;
pub mod v1;
pub mod v2;

use crate::GuardError;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CgroupVersion {
    V1,
    V2,
}

/// Limits of one cgroup, as written and as read back.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CgroupLimits {
    /// cpuset, in kernel list form ("0-3").
    pub cpus: Option<String>,
    /// Memory nodes for the cpuset (needed whenever `cpus` is set).
    pub mems: Option<String>,
    /// CFS quota and period in microseconds.
    pub cpu_quota: Option<(i64, u64)>,
    /// Memory limit in bytes.
    pub memory_max: Option<u64>,
}

/// What a cgroup uses now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CgroupUsage {
    pub memory_bytes: u64,
    /// Highest memory use seen (0 where the kernel does not track it).
    pub memory_peak_bytes: u64,
    /// CPU time used by every process of the group, in microseconds.
    pub cpu_usage_usec: u64,
}

/// Operations on cgroups below the cgroup this process was started in. Implementations
/// capture that parent at construction, so a process that later moves itself into a child
/// still addresses its children from the same place.
pub trait CgroupFs: Send + Sync {
    fn version(&self) -> CgroupVersion;
    /// Where group `name` lives, for logs and status.
    fn describe(&self, name: &str) -> String;
    fn exists(&self, name: &str) -> bool;
    /// Creates group `name`, moves the processes in `join` into it, and applies `limits`;
    /// fails if it exists. On failure nothing is left behind and `join` stays where it was.
    /// (Under v2 a delegated parent may hold only the processes that move down, since
    /// controllers can only be enabled for children of a cgroup without processes.)
    fn create(&self, name: &str, limits: &CgroupLimits, join: &[u32]) -> Result<(), GuardError>;
    /// Reads back the limits in force (the fields `create` was given).
    fn limits(&self, name: &str) -> Result<CgroupLimits, GuardError>;
    /// Moves process `pid` (all its threads) into the group.
    fn attach(&self, name: &str, pid: u32) -> Result<(), GuardError>;
    fn procs(&self, name: &str) -> Result<Vec<u32>, GuardError>;
    fn usage(&self, name: &str) -> Result<CgroupUsage, GuardError>;
    /// Moves remaining processes back to the parent and deletes the group. Removing a group
    /// that does not exist is not an error.
    fn remove(&self, name: &str) -> Result<(), GuardError>;
    /// Moves process `pid` out of the group, back to the parent, and deletes the group when
    /// no process is left in it (then `true`). Other members (mounts) stay in the group, for
    /// the next agent to take over. Under v2 the parent first stops enabling controllers for
    /// its children, since only then may it hold a process again (systemd starts the unit's
    /// next process there): members left behind are unconfined until the next agent.
    fn leave(&self, name: &str, pid: u32) -> Result<bool, GuardError>;
}

impl<F: CgroupFs + ?Sized> CgroupFs for std::sync::Arc<F> {
    fn version(&self) -> CgroupVersion {
        (**self).version()
    }
    fn describe(&self, name: &str) -> String {
        (**self).describe(name)
    }
    fn exists(&self, name: &str) -> bool {
        (**self).exists(name)
    }
    fn create(&self, name: &str, limits: &CgroupLimits, join: &[u32]) -> Result<(), GuardError> {
        (**self).create(name, limits, join)
    }
    fn limits(&self, name: &str) -> Result<CgroupLimits, GuardError> {
        (**self).limits(name)
    }
    fn attach(&self, name: &str, pid: u32) -> Result<(), GuardError> {
        (**self).attach(name, pid)
    }
    fn procs(&self, name: &str) -> Result<Vec<u32>, GuardError> {
        (**self).procs(name)
    }
    fn usage(&self, name: &str) -> Result<CgroupUsage, GuardError> {
        (**self).usage(name)
    }
    fn remove(&self, name: &str) -> Result<(), GuardError> {
        (**self).remove(name)
    }
    fn leave(&self, name: &str, pid: u32) -> Result<bool, GuardError> {
        (**self).leave(name, pid)
    }
}

/// The cgroup implementation for this machine: v2 when the unified hierarchy is mounted at
/// `/sys/fs/cgroup` with controllers, else v1 (cpu, cpuacct, cpuset and memory hierarchies).
pub fn detect() -> Result<Box<dyn CgroupFs>, GuardError> {
    if std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        return Ok(Box::new(v2::CgroupV2::for_current_process()?));
    }
    Ok(Box::new(v1::CgroupV1::for_current_process()?))
}

/// This process's path in each hierarchy, from `/proc/self/cgroup` text: `(controllers, path)`
/// where v2's line has an empty controller list.
pub(crate) fn parse_proc_cgroup(text: &str) -> Vec<(Vec<String>, String)> {
    text.lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let _id = parts.next()?;
            let controllers = parts.next()?;
            let path = parts.next()?;
            let names = controllers
                .split(',')
                .filter(|c| !c.is_empty())
                .map(str::to_owned)
                .collect();
            Some((names, path.to_owned()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_cgroup_lines_parse_for_v1_and_v2() {
        let text = "4:memory:/process_api/abc\n2:cpu,cpuacct:/\n0::/system.slice/shoal.service\n";
        let parsed = parse_proc_cgroup(text);
        assert_eq!(
            parsed[0],
            (vec!["memory".to_string()], "/process_api/abc".to_string())
        );
        assert_eq!(parsed[1].0, vec!["cpu".to_string(), "cpuacct".to_string()]);
        assert_eq!(
            parsed[2],
            (vec![], "/system.slice/shoal.service".to_string())
        );
    }
}
