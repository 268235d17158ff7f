//! The CgroupFs contract against a real cgroup v2 kernel: the lab's VM runs it
//! (`ansible/tests/v2.sh`) as root inside a delegated service cgroup, as the agent runs:
//!
//! ```sh
//! systemd-run --pipe --wait -p Delegate=yes -E SHOAL_TEST_CGROUP_V2=1 ./cgroup_v2-HASH
//! ```
//!
//! The test moves itself into a leaf `runner` of that cgroup and creates its groups beside
//! it, since a cgroup that enables controllers for its children may hold no process. Skipped
//! unless `SHOAL_TEST_CGROUP_V2=1`: it writes to the cgroup it was started in.

use std::process::{Command, Stdio};
use std::sync::Arc;

use shoal_resource_guard::contract::{Subject, run_all};
use shoal_resource_guard::{CgroupFs, CgroupV2, MachineInventory};

const ENV: &str = "SHOAL_TEST_CGROUP_V2";

#[test]
fn real_cgroup_v2_keeps_the_contract() {
    if std::env::var(ENV).as_deref() != Ok("1") {
        eprintln!(
            "SKIPPED: set {ENV}=1 and run as root in a delegated cgroup v2 (systemd-run -p Delegate=yes)"
        );
        return;
    }
    let own = std::fs::read_to_string("/proc/self/cgroup").expect("/proc/self/cgroup");
    let parent = own
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .expect("a cgroup v2 path")
        .trim()
        .to_owned();
    assert!(
        std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists(),
        "{ENV}=1 but /sys/fs/cgroup is not a cgroup v2 hierarchy"
    );
    assert_ne!(parent, "/", "run in a delegated cgroup, not the root");
    let dir = format!("/sys/fs/cgroup{parent}");
    let runner = format!("{dir}/runner");
    std::fs::create_dir_all(&runner).expect("mkdir runner");
    let park = |pid: u32| {
        let _ = std::fs::write(format!("{runner}/cgroup.procs"), pid.to_string());
    };
    park(std::process::id());
    let controllers =
        std::fs::read_to_string(format!("{dir}/cgroup.controllers")).expect("controllers");
    for c in ["cpu", "cpuset", "memory"] {
        assert!(
            controllers.split_whitespace().any(|x| x == c),
            "{c} not delegated to {parent} ({controllers:?}): Delegate=yes?"
        );
    }
    let fs = Arc::new(CgroupV2::below(&parent));
    let inv = MachineInventory::probe().expect("inventory");
    let last_cpu = *inv.cpus.0.iter().next_back().expect("a cpu");
    let mut child = Command::new("sleep")
        .arg("600")
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn sleep");
    let name = format!("shoal-contract-{}", std::process::id());
    let subject = Subject {
        fs: fs.clone(),
        name: name.clone(),
        pid: child.id(),
        cpus: last_cpu.to_string(),
        mems: inv.mems.clone(),
        machine: inv.clone(),
        park: &park,
    };
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_all(&subject)));
    let _ = fs.remove(&name);
    park(child.id());
    let alive = child.try_wait().expect("try_wait").is_none();
    let _ = child.kill();
    let _ = child.wait();
    if let Err(p) = outcome {
        std::panic::resume_unwind(p);
    }
    assert!(
        alive,
        "the test process died while being moved between cgroups"
    );
    assert!(!fs.exists(&name));
    // Nothing of ours is left enabled in the parent.
    let control =
        std::fs::read_to_string(format!("{dir}/cgroup.subtree_control")).unwrap_or_default();
    assert!(
        control.trim().is_empty(),
        "parent still enables {control:?}"
    );
}
