//! Applying a reservation to the running agent, and undoing it at a clean stop.

use tracing::{info, warn};

use crate::{
    CgroupFs, CgroupUsage, Enforcement, GuardError, MachineInventory, Reservation, ResourcesConfig,
    plan,
};

/// The reservation in force for this process.
pub struct AppliedGuard {
    reservation: Reservation,
    /// `None` when running unconfined under `enforcement = "best-effort"`.
    fs: Option<Box<dyn CgroupFs>>,
    /// The confined process (the agent).
    pid: u32,
    /// Why the reservation is not enforced, when it is not.
    pub unenforced_reason: Option<String>,
}

impl std::fmt::Debug for AppliedGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppliedGuard")
            .field("reservation", &self.reservation)
            .field("enforced", &self.fs.is_some())
            .finish()
    }
}

/// Plans `config` against `machine`, clears a stale group left by a crashed agent, creates
/// the agent's cgroup and moves process `pid` into it. An impossible reservation is always
/// refused; one that this machine cannot enforce is refused unless `enforcement` is
/// `best-effort`.
pub fn apply(
    config: &ResourcesConfig,
    machine: &MachineInventory,
    fs: Result<Box<dyn CgroupFs>, GuardError>,
    pid: u32,
) -> Result<AppliedGuard, GuardError> {
    let reservation = plan(config, machine)?;
    let unenforced = |reason: String| -> Result<AppliedGuard, GuardError> {
        match config.enforcement {
            Enforcement::Required => Err(GuardError::Unenforceable(format!(
                "{reason} (set resources.enforcement = \"best-effort\" to run unconfined)"
            ))),
            Enforcement::BestEffort => {
                warn!(%reason, "resource reservation NOT enforced (enforcement = best-effort)");
                Ok(AppliedGuard {
                    reservation: reservation.clone(),
                    fs: None,
                    pid,
                    unenforced_reason: Some(reason),
                })
            }
        }
    };
    let fs = match fs {
        Ok(fs) => fs,
        Err(e) => return unenforced(e.to_string()),
    };
    let name = reservation.cgroup.as_str();
    let mut join = vec![pid];
    if fs.exists(name) {
        // Busy only when another live instance of the same program (another agent) holds
        // it. Other members, such as a `shoal mount` that joined the reservation of an agent
        // that crashed or stopped, move into the new group with us: under v2 the stale
        // group's processes land in the parent when it is removed, and a parent holding a
        // process cannot enable controllers for the new group.
        let mine = program_of(pid);
        let members: Vec<u32> = fs
            .procs(name)
            .unwrap_or_default()
            .into_iter()
            .filter(|p| *p != pid)
            .collect();
        if let Some(busy) = members
            .iter()
            .find(|p| mine.is_some() && program_of(**p) == mine)
        {
            return Err(GuardError::CgroupBusy {
                group: fs.describe(name),
                pid: *busy,
            });
        }
        fs.remove(name)?;
        // Those that exited meanwhile are gone from the parent too.
        join.extend(members.iter().filter(|p| program_of(**p).is_some()));
        info!(group = %fs.describe(name), taken_over = ?&join[1..], "replaced a stale cgroup left by an earlier run");
    }
    let limits = reservation.limits(Some(&machine.mems));
    if let Err(e) = fs.create(name, &limits, &join) {
        return unenforced(e.to_string());
    }
    info!(
        group = %fs.describe(name),
        cpus = ?limits.cpus,
        cpu_quota = ?limits.cpu_quota,
        memory_bytes = reservation.memory_bytes,
        training_cores = reservation.training_cores,
        training_memory_bytes = reservation.training_memory_bytes,
        "agent confined to its reservation"
    );
    Ok(AppliedGuard {
        reservation,
        fs: Some(fs),
        pid,
        unenforced_reason: None,
    })
}

/// The program name of a live process (`/proc/PID/comm`), None when it is gone.
fn program_of(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|s| s.trim().to_owned())
}

impl AppliedGuard {
    pub fn reservation(&self) -> &Reservation {
        &self.reservation
    }

    pub fn enforced(&self) -> bool {
        self.fs.is_some()
    }

    /// Where the cgroup lives, when enforced.
    pub fn location(&self) -> Option<String> {
        self.fs
            .as_ref()
            .map(|fs| fs.describe(&self.reservation.cgroup))
    }

    /// What the confined processes use now.
    pub fn usage(&self) -> Option<CgroupUsage> {
        self.fs.as_ref()?.usage(&self.reservation.cgroup).ok()
    }

    /// Adds another process (e.g. a `shoal mount`) to the reservation.
    pub fn attach(&self, pid: u32) -> Result<(), GuardError> {
        match &self.fs {
            Some(fs) => fs.attach(&self.reservation.cgroup, pid),
            None => Ok(()),
        }
    }

    /// Moves the agent back to the parent and removes the cgroup, or keeps it while other
    /// processes (mounts) are still in it: the next agent takes them over (see
    /// [`CgroupFs::leave`]). Returns whether the group is gone.
    pub fn release(&self) -> Result<bool, GuardError> {
        match &self.fs {
            Some(fs) => fs.leave(&self.reservation.cgroup, self.pid),
            None => Ok(true),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FakeCgroupV2;

    use crate::inventory::test_machine as machine;

    fn config(enforcement: Enforcement) -> ResourcesConfig {
        ResourcesConfig {
            cpus: Some("0-1".into()),
            cpu_cores: None,
            memory: "8GiB".into(),
            min_free_cores: 1.0,
            min_free_memory: "1GiB".into(),
            cgroup: "shoal".into(),
            enforcement,
        }
    }

    fn fake() -> Box<dyn CgroupFs> {
        Box::new(FakeCgroupV2::new(
            "system.slice/shoal-agent.service",
            &[77],
            "0-7",
        ))
    }

    #[test]
    fn agent_is_moved_into_its_group_with_its_limits_and_released() {
        let g = apply(&config(Enforcement::Required), &machine(), Ok(fake()), 77).expect("apply");
        assert!(g.enforced());
        let fs = g.fs.as_ref().expect("fs");
        assert_eq!(fs.procs("shoal").expect("procs"), vec![77]);
        let limits = fs.limits("shoal").expect("limits");
        assert_eq!(limits.cpus.as_deref(), Some("0-1"));
        assert_eq!(limits.memory_max, Some(8 << 30));
        assert!(g.release().expect("release"), "the group is gone");
        assert!(!g.fs.as_ref().expect("fs").exists("shoal"));
    }

    #[test]
    fn unenforceable_reservation_is_refused_unless_best_effort() {
        let no_fs = || {
            Err(GuardError::Unenforceable(
                "controllers are read-only".into(),
            ))
        };
        let err =
            apply(&config(Enforcement::Required), &machine(), no_fs(), 77).expect_err("refuse");
        assert!(err.to_string().contains("best-effort"), "{err}");
        let g =
            apply(&config(Enforcement::BestEffort), &machine(), no_fs(), 77).expect("best effort");
        assert!(!g.enforced());
        assert!(
            g.unenforced_reason
                .as_deref()
                .is_some_and(|r| r.contains("read-only"))
        );
    }

    #[test]
    fn impossible_reservation_is_refused_even_best_effort() {
        let mut c = config(Enforcement::BestEffort);
        c.memory = "100GiB".into();
        let err = apply(&c, &machine(), Ok(fake()), 77).expect_err("refuse");
        assert!(
            matches!(
                err,
                GuardError::Config {
                    key: "resources.memory",
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn a_mount_with_more_capabilities_joins_only_with_cap_sys_nice() {
        let fs = FakeCgroupV2::new("system.slice/shoal-agent.service", &[77], "0-7");
        fs.tree().mark_privileged(88);
        fs.tree().set_sys_nice(false);
        let fs = std::sync::Arc::new(fs);
        let g = apply(
            &config(Enforcement::Required),
            &machine(),
            Ok(Box::new(fs.clone())),
            77,
        )
        .expect("apply");
        let err = g.attach(88).expect_err("EPERM without CAP_SYS_NICE");
        assert!(err.to_string().contains("CAP_SYS_NICE"), "{err}");
        fs.tree().set_sys_nice(true);
        g.attach(88).expect("joins with CAP_SYS_NICE");
    }

    #[test]
    fn stale_group_of_a_dead_agent_is_replaced() {
        let fs = FakeCgroupV2::new("system.slice/shoal-agent.service", &[], "0-7");
        fs.create("shoal", &crate::CgroupLimits::default(), &[])
            .expect("stale group");
        let g = apply(
            &config(Enforcement::Required),
            &machine(),
            Ok(Box::new(fs)),
            77,
        )
        .expect("apply");
        assert!(g.enforced());
    }
}
