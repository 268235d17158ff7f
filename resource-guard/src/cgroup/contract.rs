//! The contract every [`CgroupFs`] must keep, run against the real cgroup v1 of the build
//! machines (`tests/cgroup_v1.rs`, as root) and the v2 fake (unit tests below). Each check
//! panics with what broke.

use super::{CgroupFs, CgroupLimits};

/// What a contract run needs from its environment.
pub struct Subject<'a> {
    pub fs: &'a dyn CgroupFs,
    /// A group name no one else uses.
    pub name: String,
    /// A process that may be moved around (a real child process on a real kernel).
    pub pid: u32,
    /// A cpuset the parent allows, and its memory nodes.
    pub cpus: String,
    pub mems: String,
}

pub fn run_all(s: &Subject) {
    created_group_reads_back_its_limits(s);
    quota_reads_back(s);
    second_create_fails_and_keeps_the_first(s);
    impossible_limits_leave_nothing_behind(s);
    removing_a_missing_group_is_not_an_error(s);
    // Last: on v2 the process ends up in the parent, which then cannot enable controllers
    // for a group that it does not join.
    joined_process_is_listed_and_moved_out_on_remove(s);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FakeCgroupV2;
    use crate::cgroup::v2::V2Tree;

    #[test]
    fn fake_v2_keeps_the_contract() {
        let fs = FakeCgroupV2::new("system.slice/shoal-agent.service", &[], "0-7");
        run_all(&Subject {
            fs: &fs,
            name: "shoal".into(),
            pid: 4242,
            cpus: "0-1".into(),
            mems: "0".into(),
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
