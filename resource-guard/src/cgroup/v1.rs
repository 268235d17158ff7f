//! cgroup v1 through cgroups-rs: one group per controller hierarchy (cpu, cpuacct, cpuset,
//! memory), each below this process's path in that hierarchy. Only those hierarchies are
//! touched (never `name=systemd`).

use std::collections::HashMap;
use std::path::PathBuf;

use cgroups_rs::CgroupPid;
use cgroups_rs::fs::Cgroup;
use cgroups_rs::fs::cpu::CpuController;
use cgroups_rs::fs::cpuacct::CpuAcctController;
use cgroups_rs::fs::cpuset::CpuSetController;
use cgroups_rs::fs::hierarchies::V1;
use cgroups_rs::fs::memory::MemController;

use super::{CgroupFs, CgroupLimits, CgroupUsage, CgroupVersion, parse_proc_cgroup};
use crate::GuardError;

const CPU: &str = "cpu";
const CPUACCT: &str = "cpuacct";
const CPUSET: &str = "cpuset";
const MEMORY: &str = "memory";

pub struct CgroupV1 {
    /// This process's path in each hierarchy at construction.
    parents: HashMap<String, String>,
}

impl CgroupV1 {
    pub fn for_current_process() -> Result<Self, GuardError> {
        let text = std::fs::read_to_string("/proc/self/cgroup").map_err(|e| {
            GuardError::Unenforceable(format!("cannot read /proc/self/cgroup: {e}"))
        })?;
        let mut parents = HashMap::new();
        for (controllers, path) in parse_proc_cgroup(&text) {
            for c in controllers {
                parents.insert(c, path.clone());
            }
        }
        for c in [CPU, CPUACCT, CPUSET, MEMORY] {
            if !parents.contains_key(c) {
                return Err(GuardError::Unenforceable(format!(
                    "no cgroup v1 {c} hierarchy for this process"
                )));
            }
            let dir = PathBuf::from("/sys/fs/cgroup").join(c);
            if !dir.is_dir() {
                return Err(GuardError::Unenforceable(format!(
                    "{} is not mounted",
                    dir.display()
                )));
            }
        }
        Ok(CgroupV1 { parents })
    }

    fn path(&self, controller: &str, name: &str) -> String {
        let parent = self
            .parents
            .get(controller)
            .map(String::as_str)
            .unwrap_or("/");
        let parent = parent.trim_matches('/');
        if parent.is_empty() {
            name.to_owned()
        } else {
            format!("{parent}/{name}")
        }
    }

    fn group(&self, controller: &str, name: &str) -> Cgroup {
        Cgroup::load_with_specified_controllers(
            Box::new(V1::new()),
            self.path(controller, name),
            vec![controller.to_owned()],
        )
    }

    /// The controllers a group with these limits lives in. The cpuset hierarchy is only
    /// joined when a cpuset is reserved (an empty v1 cpuset accepts no tasks).
    fn controllers(limits_cpus: bool) -> Vec<&'static str> {
        let mut c = vec![CPU, CPUACCT, MEMORY];
        if limits_cpus {
            c.push(CPUSET);
        }
        c
    }

    fn present(&self, name: &str) -> Vec<(&'static str, Cgroup)> {
        [CPU, CPUACCT, CPUSET, MEMORY]
            .into_iter()
            .map(|c| (c, self.group(c, name)))
            .filter(|(_, g)| g.exists())
            .collect()
    }

    fn apply(&self, name: &str, limits: &CgroupLimits) -> Result<(), GuardError> {
        let err = |e: cgroups_rs::fs::error::Error| GuardError::cgroup(&self.describe(name), e);
        for c in Self::controllers(limits.cpus.is_some()) {
            self.group(c, name).create().map_err(err)?;
        }
        if let Some(cpus) = &limits.cpus {
            let g = self.group(CPUSET, name);
            let cs: &CpuSetController = g.controller_of().ok_or_else(|| missing(name, CPUSET))?;
            cs.set_mems(limits.mems.as_deref().unwrap_or("0"))
                .map_err(err)?;
            cs.set_cpus(cpus).map_err(err)?;
        }
        if let Some((quota, period)) = limits.cpu_quota {
            let g = self.group(CPU, name);
            let cpu: &CpuController = g.controller_of().ok_or_else(|| missing(name, CPU))?;
            cpu.set_cfs_quota_and_period(Some(quota), Some(period))
                .map_err(err)?;
        }
        if let Some(max) = limits.memory_max {
            let g = self.group(MEMORY, name);
            let mem: &MemController = g.controller_of().ok_or_else(|| missing(name, MEMORY))?;
            mem.set_limit(max as i64).map_err(err)?;
        }
        Ok(())
    }
}

fn missing(name: &str, controller: &str) -> GuardError {
    GuardError::cgroup(
        name,
        format!("the {controller} controller is not available"),
    )
}

fn ranges(r: &[(u64, u64)]) -> String {
    r.iter()
        .map(|(a, b)| {
            if a == b {
                a.to_string()
            } else {
                format!("{a}-{b}")
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

impl CgroupFs for CgroupV1 {
    fn version(&self) -> CgroupVersion {
        CgroupVersion::V1
    }

    fn describe(&self, name: &str) -> String {
        format!(
            "/sys/fs/cgroup/{{cpu,cpuacct,cpuset,memory}}/…/{name} (memory: /{})",
            self.path(MEMORY, name)
        )
    }

    fn exists(&self, name: &str) -> bool {
        !self.present(name).is_empty()
    }

    fn create(&self, name: &str, limits: &CgroupLimits, join: &[u32]) -> Result<(), GuardError> {
        if self.exists(name) {
            return Err(GuardError::cgroup(&self.describe(name), "already exists"));
        }
        let res = self
            .apply(name, limits)
            .and_then(|()| join.iter().try_for_each(|pid| self.attach(name, *pid)));
        res.inspect_err(|_| {
            let _ = self.remove(name);
        })
    }

    fn limits(&self, name: &str) -> Result<CgroupLimits, GuardError> {
        let mut out = CgroupLimits::default();
        let g = self.group(CPUSET, name);
        if let Some(cs) = g.controller_of::<CpuSetController>().filter(|_| g.exists()) {
            let set = cs.cpuset();
            out.cpus = Some(ranges(&set.cpus));
            out.mems = Some(ranges(&set.mems));
        }
        let g = self.group(CPU, name);
        if let Some(cpu) = g.controller_of::<CpuController>() {
            let quota = cpu.cfs_quota().map_err(|e| GuardError::cgroup(name, e))?;
            let period = cpu.cfs_period().map_err(|e| GuardError::cgroup(name, e))?;
            out.cpu_quota = (quota > 0).then_some((quota, period));
        }
        let g = self.group(MEMORY, name);
        if let Some(mem) = g.controller_of::<MemController>() {
            let limit = mem.memory_stat().limit_in_bytes;
            // The kernel reports "no limit" as a huge page-aligned number.
            out.memory_max = (limit > 0 && limit < i64::MAX / 2).then_some(limit as u64);
        }
        Ok(out)
    }

    fn attach(&self, name: &str, pid: u32) -> Result<(), GuardError> {
        let present = self.present(name);
        if present.is_empty() {
            return Err(GuardError::cgroup(&self.describe(name), "does not exist"));
        }
        for (_, g) in present {
            g.add_task_by_tgid(CgroupPid::from(pid as u64))
                .map_err(|e| GuardError::cgroup(&self.describe(name), e))?;
        }
        Ok(())
    }

    fn procs(&self, name: &str) -> Result<Vec<u32>, GuardError> {
        let g = self.group(MEMORY, name);
        if !g.exists() {
            return Err(GuardError::cgroup(&self.describe(name), "does not exist"));
        }
        Ok(g.procs().into_iter().map(|p| p.pid as u32).collect())
    }

    fn usage(&self, name: &str) -> Result<CgroupUsage, GuardError> {
        let mut u = CgroupUsage::default();
        let g = self.group(MEMORY, name);
        if let Some(mem) = g.controller_of::<MemController>() {
            let stat = mem.memory_stat();
            u.memory_bytes = stat.usage_in_bytes;
            u.memory_peak_bytes = stat.max_usage_in_bytes;
        }
        let g = self.group(CPUACCT, name);
        if let Some(acct) = g.controller_of::<CpuAcctController>() {
            u.cpu_usage_usec = acct.cpuacct().usage / 1000;
        }
        Ok(u)
    }

    fn remove(&self, name: &str) -> Result<(), GuardError> {
        for (_, g) in self.present(name) {
            for pid in g.procs() {
                // A process that exited meanwhile is fine.
                let _ = g.move_task_to_parent_by_tgid(pid);
            }
            g.delete()
                .map_err(|e| GuardError::cgroup(&self.describe(name), e))?;
        }
        Ok(())
    }

    fn leave(&self, name: &str, pid: u32) -> Result<bool, GuardError> {
        for (_, g) in self.present(name) {
            // Not a member (any more) is fine.
            let _ = g.move_task_to_parent_by_tgid(CgroupPid::from(pid as u64));
        }
        if self.exists(name) && !self.procs(name)?.is_empty() {
            return Ok(false);
        }
        self.remove(name)?;
        Ok(true)
    }
}
