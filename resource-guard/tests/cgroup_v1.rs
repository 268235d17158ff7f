//! The CgroupFs contract against this machine's real cgroup v1 (needs root and the cpu,
//! cpuacct, cpuset and memory hierarchies; CI runs as root on such a machine).

use std::process::{Command, Stdio};
use std::sync::Arc;

use shoal_resource_guard::contract::{Subject, run_all};
use shoal_resource_guard::{CgroupFs, CgroupV1, MachineInventory};

#[test]
fn real_cgroup_v1_keeps_the_contract() {
    if !nix_is_root() || !std::path::Path::new("/sys/fs/cgroup/memory").is_dir() {
        eprintln!("SKIPPED: needs root and cgroup v1 controllers");
        return;
    }
    let fs = Arc::new(CgroupV1::for_current_process().expect("v1 available"));
    let inv = MachineInventory::probe().expect("inventory");
    let first_cpu = *inv.cpus.0.iter().next().expect("a cpu");
    let mut child = Command::new("sleep")
        .arg("120")
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn sleep");
    let name = format!("shoal-contract-{}", std::process::id());
    let subject = Subject {
        fs: fs.clone(),
        name: name.clone(),
        pid: child.id(),
        cpus: first_cpu.to_string(),
        mems: inv.mems.clone(),
        machine: inv.clone(),
        // v1 has no rule against processes in a parent with child groups.
        park: &|_| {},
    };
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_all(&subject)));
    let _ = fs.remove(&name);
    // The moved process is alive and well after all the moves.
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
}

fn nix_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}
