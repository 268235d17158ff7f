//! The contract every [`CgroupFs`] must keep, run against the real cgroup v1 of the build
//! machines (`tests/cgroup_v1.rs`, as root), the real cgroup v2 of the lab's VM
//! (`tests/cgroup_v2.rs`, as root in a delegated cgroup: `ansible/tests/v2.sh`) and the v2 fake
//! (unit tests below). The file-level checks come first, then the guard's own lifecycle
//! ([`crate::apply`] and [`crate::AppliedGuard`]) with real processes standing in for agents
//! and mounts. Each check panics with what broke.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use super::{CgroupFs, CgroupLimits};
use crate::{
    AppliedGuard, Enforcement, GuardError, MachineInventory, ResourcesConfig, apply, plan,
};

/// What a contract run needs from its environment.
pub struct Subject<'a> {
    pub fs: Arc<dyn CgroupFs>,
    /// A group name no one else uses.
    pub name: String,
    /// A process that may be moved around (a real child process on a real kernel).
    pub pid: u32,
    /// A cpuset the parent allows, and its memory nodes.
    pub cpus: String,
    pub mems: String,
    /// The machine the reservations of the lifecycle checks are planned against.
    pub machine: MachineInventory,
    /// Puts a process that a check moved to the parent back where the environment keeps its
    /// processes: under v2 a leaf beside the groups (a parent holding a process cannot enable
    /// controllers for its children), elsewhere nothing.
    pub park: &'a dyn Fn(u32),
}

pub fn run_all(s: &Subject) {
    created_group_reads_back_its_limits(s);
    quota_reads_back(s);
    memory_limit_reads_back_in_whole_pages(s);
    quota_below_a_millisecond_is_refused(s);
    second_create_fails_and_keeps_the_first(s);
    impossible_limits_leave_nothing_behind(s);
    removing_a_missing_group_is_not_an_error(s);
    joined_process_is_listed_and_moved_out_on_remove(s);
    agent_is_joined_by_a_mount_which_stays_confined_for_the_next_agent(s);
    stale_group_of_a_crashed_agent_is_replaced_with_its_mount(s);
    group_held_by_a_live_agent_is_refused(s);
}

fn cleanup(s: &Subject) {
    let _ = s.fs.remove(&s.name);
}

pub fn created_group_reads_back_its_limits(s: &Subject) {
    let want = CgroupLimits {
        cpus: Some(s.cpus.clone()),
        mems: Some(s.mems.clone()),
        cpu_quota: None,
        memory_max: Some(256 << 20),
    };
    s.fs.create(&s.name, &want, &[]).expect("create");
    assert!(s.fs.exists(&s.name), "created group does not exist");
    let got = s.fs.limits(&s.name).expect("read back");
    assert_eq!(got.cpus, want.cpus, "cpuset read back");
    assert_eq!(got.mems, want.mems, "cpuset mems read back");
    assert_eq!(got.memory_max, want.memory_max, "memory limit read back");
    assert_eq!(got.cpu_quota, None, "no quota was asked for");
    s.fs.usage(&s.name).expect("usage readable");
    s.fs.remove(&s.name).expect("remove");
    assert!(!s.fs.exists(&s.name), "removed group still exists");
}

pub fn quota_reads_back(s: &Subject) {
    let want = CgroupLimits {
        cpu_quota: Some((50_000, 100_000)),
        memory_max: Some(128 << 20),
        ..CgroupLimits::default()
    };
    s.fs.create(&s.name, &want, &[]).expect("create");
    let got = s.fs.limits(&s.name).expect("read back");
    assert_eq!(got.cpu_quota, want.cpu_quota, "quota read back");
    assert_eq!(got.memory_max, want.memory_max);
    cleanup(s);
}

/// The kernel keeps memory limits in whole pages (rounded down); `plan` may give any byte
/// count ("1.5GB").
pub fn memory_limit_reads_back_in_whole_pages(s: &Subject) {
    let want = CgroupLimits {
        memory_max: Some((256 << 20) + 1000),
        ..CgroupLimits::default()
    };
    s.fs.create(&s.name, &want, &[]).expect("create");
    let got = s.fs.limits(&s.name).expect("read back").memory_max;
    assert_eq!(
        got,
        Some(256 << 20),
        "memory limit rounded down to whole pages"
    );
    cleanup(s);
}

/// The kernel refuses a CFS quota under 1 ms (`plan` never asks for less: 0.01 cores).
pub fn quota_below_a_millisecond_is_refused(s: &Subject) {
    let bad = CgroupLimits {
        cpu_quota: Some((500, 100_000)),
        memory_max: Some(128 << 20),
        ..CgroupLimits::default()
    };
    assert!(
        s.fs.create(&s.name, &bad, &[]).is_err(),
        "a 0.5 ms quota accepted"
    );
    assert!(
        !s.fs.exists(&s.name),
        "a failed create left the group behind"
    );
}

pub fn joined_process_is_listed_and_moved_out_on_remove(s: &Subject) {
    let limits = CgroupLimits {
        memory_max: Some(256 << 20),
        ..CgroupLimits::default()
    };
    s.fs.create(&s.name, &limits, &[s.pid])
        .expect("create and join");
    let procs = s.fs.procs(&s.name).expect("procs");
    assert!(procs.contains(&s.pid), "pid {} not in {procs:?}", s.pid);
    s.fs.remove(&s.name).expect("remove with a process inside");
    assert!(!s.fs.exists(&s.name));
    (s.park)(s.pid);
}

pub fn second_create_fails_and_keeps_the_first(s: &Subject) {
    let limits = CgroupLimits {
        memory_max: Some(256 << 20),
        ..CgroupLimits::default()
    };
    s.fs.create(&s.name, &limits, &[]).expect("create");
    let other = CgroupLimits {
        memory_max: Some(512 << 20),
        ..CgroupLimits::default()
    };
    assert!(
        s.fs.create(&s.name, &other, &[]).is_err(),
        "second create succeeded"
    );
    assert!(
        s.fs.exists(&s.name),
        "failed second create removed the first"
    );
    assert_eq!(
        s.fs.limits(&s.name).expect("limits").memory_max,
        Some(256 << 20)
    );
    cleanup(s);
}

pub fn impossible_limits_leave_nothing_behind(s: &Subject) {
    let bad = CgroupLimits {
        cpus: Some("4000-4001".into()),
        mems: Some(s.mems.clone()),
        memory_max: Some(256 << 20),
        cpu_quota: None,
    };
    assert!(
        s.fs.create(&s.name, &bad, &[s.pid]).is_err(),
        "absent CPUs accepted"
    );
    assert!(
        !s.fs.exists(&s.name),
        "a failed create left the group behind"
    );
}

pub fn removing_a_missing_group_is_not_an_error(s: &Subject) {
    s.fs.remove(&s.name).expect("remove of a missing group");
}

/// A real process standing in for an agent (`sleep`) or a mount (`tail`): the guard tells
/// them apart by program name. Killed when dropped.
pub struct Stand(Child);

impl Stand {
    pub fn agent() -> Self {
        Self::spawn("sleep", &["600"])
    }
    pub fn mount() -> Self {
        Self::spawn("tail", &["-f", "/dev/null"])
    }
    fn spawn(program: &str, args: &[&str]) -> Self {
        let child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {program}: {e}"));
        // spawn returns once the child is past the point of no return of exec, which can
        // be before the kernel gives it its new name; the guard identifies agents by name.
        let comm = format!("/proc/{}/comm", child.id());
        for _ in 0..1000 {
            if std::fs::read_to_string(&comm).is_ok_and(|c| c.trim() == program) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        Stand(child)
    }
    pub fn pid(&self) -> u32 {
        self.0.id()
    }
    /// kill -9, as a crash.
    pub fn crash(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Stand {
    fn drop(&mut self) {
        self.crash();
    }
}

fn reservation_config(s: &Subject) -> ResourcesConfig {
    ResourcesConfig {
        cpus: Some(s.cpus.clone()),
        cpu_cores: None,
        memory: "256MiB".into(),
        min_free_cores: 0.0,
        min_free_memory: "64MiB".into(),
        cgroup: s.name.clone(),
        enforcement: Enforcement::Required,
    }
}

fn confine(s: &Subject, pid: u32) -> Result<AppliedGuard, GuardError> {
    let fs: Box<dyn CgroupFs> = Box::new(s.fs.clone());
    apply(&reservation_config(s), &s.machine, Ok(fs), pid)
}

fn sorted(mut pids: Vec<u32>) -> Vec<u32> {
    pids.sort_unstable();
    pids
}

fn members(s: &Subject) -> Vec<u32> {
    sorted(s.fs.procs(&s.name).expect("procs"))
}

fn assert_reservation_in_force(s: &Subject) {
    let want = plan(&reservation_config(s), &s.machine)
        .expect("plan")
        .limits(Some(&s.machine.mems));
    let got = s.fs.limits(&s.name).expect("limits");
    assert_eq!(got.cpus, want.cpus, "cpuset in force");
    assert_eq!(got.memory_max, want.memory_max, "memory limit in force");
}

/// Ends a lifecycle check: the group gone, its processes parked and killed.
fn finish(s: &Subject, stands: &mut [&mut Stand]) {
    cleanup(s);
    for p in stands.iter_mut() {
        (s.park)(p.pid());
        p.crash();
    }
    assert!(!s.fs.exists(&s.name), "group left behind");
}

/// An agent confines itself, a mount joins; at a clean stop the agent leaves and the mount
/// stays in the group, which the next agent takes over with its limits.
pub fn agent_is_joined_by_a_mount_which_stays_confined_for_the_next_agent(s: &Subject) {
    let (mut agent, mut mount, mut next) = (Stand::agent(), Stand::mount(), Stand::agent());
    let g = confine(s, agent.pid()).expect("the agent confines itself");
    assert!(g.enforced());
    assert_eq!(
        members(s),
        vec![agent.pid()],
        "the agent alone in its group"
    );
    assert_reservation_in_force(s);
    g.attach(mount.pid()).expect("the mount joins");
    assert_eq!(members(s), sorted(vec![agent.pid(), mount.pid()]));
    g.usage().expect("usage readable");
    assert!(
        !g.release().expect("the agent leaves"),
        "group kept for the mount"
    );
    assert_eq!(members(s), vec![mount.pid()], "only the mount stays");
    (s.park)(agent.pid());
    let g2 = confine(s, next.pid()).expect("the next agent takes the group over");
    assert_eq!(members(s), sorted(vec![next.pid(), mount.pid()]));
    assert_reservation_in_force(s);
    drop(g2);
    finish(s, &mut [&mut agent, &mut mount, &mut next]);
}

/// An agent crashes (no release) with a mount in its group: the next agent replaces the
/// stale group, and the mount is confined with it.
pub fn stale_group_of_a_crashed_agent_is_replaced_with_its_mount(s: &Subject) {
    let (mut agent, mut mount, mut next) = (Stand::agent(), Stand::mount(), Stand::agent());
    let g = confine(s, agent.pid()).expect("the agent confines itself");
    g.attach(mount.pid()).expect("the mount joins");
    agent.crash();
    drop(g);
    assert_eq!(
        members(s),
        vec![mount.pid()],
        "the crash leaves the mount behind"
    );
    let g2 = confine(s, next.pid()).expect("the next agent replaces the stale group");
    assert!(g2.enforced());
    assert_eq!(members(s), sorted(vec![next.pid(), mount.pid()]));
    assert_reservation_in_force(s);
    finish(s, &mut [&mut agent, &mut mount, &mut next]);
}

/// A second agent with the same group name is refused while the first one lives, and the
/// first keeps its group as it was.
pub fn group_held_by_a_live_agent_is_refused(s: &Subject) {
    let (mut agent, mut second) = (Stand::agent(), Stand::agent());
    let _g = confine(s, agent.pid()).expect("the agent confines itself");
    match confine(s, second.pid()) {
        Err(GuardError::CgroupBusy { pid, .. }) => assert_eq!(pid, agent.pid(), "names the holder"),
        Err(e) => panic!("refused, but not as busy: {e}"),
        Ok(_) => panic!(
            "a second agent ({}) took over a live agent's ({}) group; members now {:?}",
            second.pid(),
            agent.pid(),
            members(s)
        ),
    }
    assert_eq!(
        members(s),
        vec![agent.pid()],
        "the first agent keeps its group"
    );
    assert_reservation_in_force(s);
    finish(s, &mut [&mut agent, &mut second]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FakeCgroupV2;
    use crate::cgroup::v2::V2Tree;

    #[test]
    fn fake_v2_keeps_the_contract() {
        let parent = "system.slice/shoal-agent.service";
        let fs = Arc::new(FakeCgroupV2::with_host_processes(parent, &[], "0-7"));
        // As on the real kernel: the test's processes live in a leaf beside the groups.
        fs.tree()
            .mkdir(&format!("{parent}/runner"))
            .expect("runner");
        let tree = fs.clone();
        let park = move |pid: u32| {
            let _ = tree
                .tree()
                .write(&format!("{parent}/runner/cgroup.procs"), &pid.to_string());
        };
        let moved = Stand::mount();
        run_all(&Subject {
            fs: fs.clone(),
            name: "shoal".into(),
            pid: moved.pid(),
            cpus: "0-1".into(),
            mems: "0".into(),
            machine: crate::inventory::test_machine(),
            park: &park,
        });
    }

    #[test]
    fn fake_v2_refuses_controllers_while_the_parent_holds_other_processes() {
        // The agent (1) and an unrelated process (2) share the service cgroup: the kernel
        // would refuse to enable controllers, and so does the fake.
        let fs = FakeCgroupV2::new("system.slice/x.service", &[1, 2], "0-3");
        let limits = CgroupLimits {
            memory_max: Some(1 << 30),
            ..CgroupLimits::default()
        };
        let err = fs.create("shoal", &limits, &[1]).expect_err("must refuse");
        assert!(err.to_string().contains("Delegate=yes"), "{err}");
        assert!(!fs.exists("shoal"));
        // The agent went back where it was.
        let procs = fs
            .tree()
            .read("system.slice/x.service/cgroup.procs")
            .expect("read");
        assert!(procs.contains('1'), "{procs}");
    }
}
