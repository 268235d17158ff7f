//! The resource guard on this machine's real cgroup v1: agents confined to their
//! reservation, cleanup at stop and after a crash, refusal of impossible reservations.

use std::process::Command;
use std::time::Duration;

use nix::sys::signal::Signal;
use shoal_tests::{DevCluster, binaries, is_root, v1_cgroup_dir, wait_for};

fn read(path: &std::path::Path) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

#[test]
fn agent_runs_inside_its_reservation_and_removes_its_cgroup_at_stop() {
    if !is_root() {
        eprintln!("SKIPPED: needs root for cgroups");
        return;
    }
    // A stale group from a "crashed" earlier agent, with the name this node will use.
    let me = nix::unistd::Pid::this();
    let parent = v1_cgroup_dir(me, "memory").expect("memory cgroup of the test");
    let stale = parent.join("shoal-dev-127.0.26.1");
    std::fs::create_dir_all(&stale).expect("create stale cgroup");

    let c = DevCluster::up_with(
        1,
        26,
        &["--reserve-memory", "512MiB", "--reserve-cpus", "0"],
    );
    let pid = c.pid(1);
    let mem = v1_cgroup_dir(pid, "memory").expect("agent memory cgroup");
    let cpuset = v1_cgroup_dir(pid, "cpuset").expect("agent cpuset cgroup");
    assert!(mem.ends_with("shoal-dev-127.0.26.1"), "{}", mem.display());
    assert_eq!(
        read(&mem.join("memory.limit_in_bytes")),
        (512u64 << 20).to_string()
    );
    assert_eq!(read(&cpuset.join("cpuset.cpus")), "0");
    assert!(
        read(&mem.join("cgroup.procs"))
            .lines()
            .any(|l| l == pid.to_string())
    );

    // The GPU sampler's first sample may still be on its way right after start.
    let (status, _) = wait_for(Duration::from_secs(10), "the first GPU sample", || {
        c.status(1).filter(|s| !s["gpu"]["note"].is_null())
    });
    let r = &status["resources"];
    assert_eq!(r["enforced"], true, "{status}");
    assert_eq!(r["memory_limit_bytes"], 512u64 << 20);
    assert_eq!(r["cpus"], "0");
    assert!(r["memory_used_bytes"].as_u64().unwrap_or(0) > 0, "{r}");
    // No GPU on the build machines: said plainly.
    assert!(
        status["gpu"]["note"]
            .as_str()
            .unwrap_or("")
            .contains("no GPU"),
        "{status}"
    );
    assert_eq!(status["background"].as_array().map(Vec::len), Some(5));

    let metrics = c.metrics(1);
    assert!(
        metrics.contains("shoal_resources_memory_limit_bytes 536870912"),
        "{metrics}"
    );

    c.signal(1, Signal::SIGTERM);
    wait_for(Duration::from_secs(10), "agent exit", || {
        c.exited(1).then_some(())
    });
    assert!(
        !mem.exists(),
        "memory cgroup left behind: {}",
        mem.display()
    );
    assert!(
        !cpuset.exists(),
        "cpuset cgroup left behind: {}",
        cpuset.display()
    );
}

#[test]
fn impossible_reservation_is_refused_naming_the_key_and_leaves_no_cgroup() {
    if !is_root() {
        eprintln!("SKIPPED: needs root for cgroups");
        return;
    }
    let c = DevCluster::up(1, 27);
    let base = std::fs::read_to_string(c.node_dir(1).join("agent.toml")).expect("config");
    shoal_tests::shoal(&[
        "dev-cluster",
        "down",
        "--dir",
        c.path().to_str().expect("utf-8"),
    ]);
    let parent = v1_cgroup_dir(nix::unistd::Pid::this(), "memory").expect("memory cgroup");
    let cases = [
        (
            "cpus = \"0-63\"\nmemory = \"256MiB\"",
            "resources.cpus",
            "online CPUs",
        ),
        (
            "cpu_cores = 0.5\nmemory = \"100TiB\"",
            "resources.memory",
            "more than this machine",
        ),
        (
            "cpu_cores = 0.5\nmemory = \"256MiB\"\nmin_free_memory = \"100TiB\"",
            "resources.min_free_memory",
            "leaves",
        ),
    ];
    for (resources, key, words) in cases {
        let config = format!("{base}\n[resources]\n{resources}\ncgroup = \"shoal-refused-test\"\n");
        let path = c.node_dir(1).join("refused.toml");
        std::fs::write(&path, config).expect("write");
        let out = Command::new(binaries().agent)
            .arg("--config")
            .arg(&path)
            .output()
            .expect("run agent");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "agent accepted {resources}");
        assert!(
            stderr.contains(key) && stderr.contains(words),
            "{resources}: {stderr}"
        );
        assert!(
            !parent.join("shoal-refused-test").exists(),
            "cgroup left behind"
        );
    }
}

fn write_synced(path: &std::path::Path, data: &[u8]) {
    use std::io::Write;
    let mut f = std::fs::File::create(path).expect("create");
    f.write_all(data).expect("write");
    f.sync_all().expect("fsync");
}

fn procs_of(group: &std::path::Path) -> Vec<String> {
    read(&group.join("cgroup.procs"))
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_mount_joins_its_agents_reservation_and_survives_an_agent_crash() {
    if !is_root() {
        eprintln!("SKIPPED: needs root for cgroups and FUSE");
        return;
    }
    let c = DevCluster::up_with(1, 28, &["--reserve-memory", "512MiB", "--mount"]);
    let mount_pid: String = read(&c.node_dir(1).join("mount.pid"));
    let mem = v1_cgroup_dir(c.pid(1), "memory").expect("agent memory cgroup");
    wait_for(
        Duration::from_secs(10),
        "the mount in the reservation",
        || procs_of(&mem).contains(&mount_pid).then_some(()),
    );
    let mnt = c.node_dir(1).join("mnt");
    // Synced: a close alone may be answered under a directory lease and lost with a
    // killed agent (README, "Mount").
    write_synced(&mnt.join("before"), b"one");

    // The agent crashes with the mount inside its group: the next agent must start anyway
    // (a mount is not another agent), and the mount joins the new group.
    c.signal(1, Signal::SIGKILL);
    wait_for(Duration::from_secs(10), "agent exit", || {
        c.exited(1).then_some(())
    });
    c.start();
    assert_eq!(std::fs::read(mnt.join("before")).expect("read"), b"one");
    std::fs::write(mnt.join("after"), b"two").expect("write after the restart");
    let mem = v1_cgroup_dir(c.pid(1), "memory").expect("new agent memory cgroup");
    wait_for(
        Duration::from_secs(15),
        "the mount back in the reservation",
        || procs_of(&mem).contains(&mount_pid).then_some(()),
    );
    assert_eq!(
        read(&c.node_dir(1).join("mount.pid")),
        mount_pid,
        "same mount process"
    );
}
