//! Mounts under failure: the local agent restarted under a busy and an idle mount, the
//! metadata leader killed while a mount writes, and the whole cluster stopped and started
//! again. Checked on what users see: writes return success, bytes read back are the ones
//! written.

use std::fs::{self, File};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use shoal_tests::{
    DevCluster, assert_bytes_eq, close, is_mounted, process_alive, stream_bytes, wait_for,
    write_fsync,
};

/// One file a writer tried: its name, the seed and size of its bytes, and how it went.
struct Attempt {
    name: String,
    seed: u64,
    size: usize,
    result: Result<(), String>,
    took: Duration,
}

/// Writes files `f0`, `f1`, ... into `dir` (sizes alternating inline and striped) until
/// `stop` is set and at least `min` are done; `done` counts attempts.
fn writer(
    dir: PathBuf,
    seed_base: u64,
    min: usize,
    stop: Arc<AtomicBool>,
    done: Arc<AtomicUsize>,
) -> std::thread::JoinHandle<Vec<Attempt>> {
    std::thread::spawn(move || {
        let mut attempts = Vec::new();
        for i in 0.. {
            if stop.load(Ordering::SeqCst) && i >= min {
                break;
            }
            let name = format!("f{i}");
            let size = if i % 2 == 0 { 20_000 } else { 300_000 };
            let seed = seed_base + i as u64;
            let started = Instant::now();
            let result = write_fsync(&dir.join(&name), &stream_bytes(seed, 0, size));
            attempts.push(Attempt {
                name,
                seed,
                size,
                result,
                took: started.elapsed(),
            });
            done.fetch_add(1, Ordering::SeqCst);
        }
        attempts
    })
}

fn failures(attempts: &[Attempt]) -> Vec<String> {
    attempts
        .iter()
        .filter_map(|a| a.result.as_ref().err().map(|e| format!("{}: {e}", a.name)))
        .collect()
}

fn longest(attempts: &[Attempt]) -> Duration {
    attempts.iter().map(|a| a.took).max().unwrap_or_default()
}

/// Starts the cluster's stopped agents when dropped, before the cluster's own drop: a test
/// that fails while an agent is down would otherwise leave `dev-cluster down` waiting on
/// that node's mount (its `umount` stats the mountpoint, which waits for the agent up to
/// `--retry-for`, 600 s).
struct RestartOnDrop<'a>(&'a DevCluster);

impl Drop for RestartOnDrop<'_> {
    fn drop(&mut self) {
        self.0.try_start();
    }
}

fn wait_count(done: &AtomicUsize, n: usize, what: &str) {
    wait_for(Duration::from_secs(60), what, || {
        (done.load(Ordering::SeqCst) >= n).then_some(())
    });
}

#[test]
fn agent_restart_under_a_live_mount_fails_no_write() {
    let c = DevCluster::up_with(3, 77, &["--mount"]);
    let _restart = RestartOnDrop(&c);
    let mounts: Vec<_> = (1..=3).map(|i| c.mount_pid(i)).collect();
    let dir = c.mnt(2).join("restart");
    fs::create_dir(&dir).expect("mkdir");
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicUsize::new(0));
    let w = writer(dir.clone(), 770, 0, stop.clone(), done.clone());

    wait_count(&done, 5, "writes before the restart");
    c.stop_agent(2);
    let at_stop = done.load(Ordering::SeqCst);
    // A clean stop under a workload: workers stop before Raft, so nothing warns about
    // proposals or Raft after the stop began.
    let log = c.log(2);
    let after_stop = log.rsplit("shutting down").next().unwrap_or_default();
    let warnings: Vec<&str> = after_stop
        .lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        .collect();
    assert!(
        warnings.is_empty(),
        "warnings during a clean stop under writes:\n{}",
        warnings.join("\n")
    );
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        process_alive(c.mount_pid(2)) && is_mounted(&c.mnt(2)),
        "node 2's mount went away with its agent:\n{}",
        c.mount_log(2)
    );
    c.start();
    wait_count(&done, at_stop + 6, "writes after the restart");
    stop.store(true, Ordering::SeqCst);
    let attempts = w.join().expect("writer");
    eprintln!(
        "{} files written across node 2's agent restart, longest create+write+fsync {:?}",
        attempts.len(),
        longest(&attempts)
    );
    let failed = failures(&attempts);
    assert!(
        failed.is_empty(),
        "writes failed across the agent restart: {failed:?}\nmount.log:\n{}\nagent warnings:\n{}",
        c.mount_log(2),
        c.log(2)
            .lines()
            .filter(|l| l.contains("stripe write failed"))
            .collect::<Vec<_>>()
            .join("\n")
    );

    // An idle mount across its agent's restart.
    let m3 = c.mnt(3).join("restart");
    assert_eq!(
        fs::read_dir(&m3).expect("ls on node 3").count(),
        attempts.len()
    );
    c.stop_agent(3);
    c.start();
    let out = Command::new("ls")
        .arg("-l")
        .arg(&m3)
        .output()
        .expect("run ls");
    assert!(
        out.status.success(),
        "ls on node 3 after its agent restarted: {}\nmount.log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        c.mount_log(3)
    );
    // `ls -l` prints a "total" line first.
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).lines().count(),
        attempts.len() + 1
    );

    // The same mount processes throughout.
    for (i, pid) in (1..=3).zip(&mounts) {
        assert_eq!(c.mount_pid(i), *pid, "node {i}'s mount was restarted");
        assert!(process_alive(*pid), "node {i}'s mount process is gone");
    }
    for m in [c.mnt(1), c.mnt(3)] {
        for a in &attempts {
            let p = m.join("restart").join(&a.name);
            let got = fs::read(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()));
            assert_bytes_eq(
                &got,
                &stream_bytes(a.seed, 0, a.size),
                &p.display().to_string(),
            );
        }
    }
}

#[test]
fn leader_kill_under_mount_writes_loses_no_fsynced_file() {
    let c = DevCluster::up_with(5, 78, &["--mount"]);
    let _restart = RestartOnDrop(&c);
    let (leader, _) = wait_for(Duration::from_secs(30), "a metadata leader", || {
        c.meta_leader(1)
    });
    let writer_node = (1..=5).find(|&i| i != leader).expect("a follower");
    let reader = (1..=5)
        .find(|&i| i != leader && i != writer_node)
        .expect("a third node");
    let dir = c.mnt(writer_node).join("ckpt");
    fs::create_dir(&dir).expect("mkdir");
    let stop = Arc::new(AtomicBool::new(true));
    let done = Arc::new(AtomicUsize::new(0));
    let w = writer(dir, 780, 30, stop, done.clone());
    wait_count(&done, 10, "writes before the kill");
    // Lands in the middle of some file's write or fsync.
    std::thread::sleep(Duration::from_millis(70));
    c.kill_agent(leader);
    let attempts = w.join().expect("writer");
    eprintln!(
        "leader (node {leader}) killed under mount writes on node {writer_node}: longest \
         create+write+fsync {:?}",
        longest(&attempts)
    );
    let rdir = c.mnt(reader).join("ckpt");
    for a in attempts.iter().filter(|a| a.result.is_ok()) {
        let p = rdir.join(&a.name);
        let got = fs::read(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()));
        assert_bytes_eq(
            &got,
            &stream_bytes(a.seed, 0, a.size),
            &format!("{} on node {reader} after the leader was killed", a.name),
        );
    }
    let failed = failures(&attempts);
    assert!(
        failed.is_empty(),
        "writes failed across the leader kill: {failed:?}\nmount.log:\n{}",
        c.mount_log(writer_node)
    );
    let (new_leader, _) = wait_for(Duration::from_secs(10), "a new leader", || {
        c.meta_leader(reader)
    });
    assert_ne!(new_leader, leader);

    // The old leader comes back, and its mount (idle while its agent was dead) serves the
    // files written meanwhile.
    c.start();
    let p = c.mnt(leader).join("ckpt").join(&attempts[0].name);
    assert_bytes_eq(
        &fs::read(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display())),
        &stream_bytes(attempts[0].seed, 0, attempts[0].size),
        "through the restarted old leader's mount",
    );
}

#[test]
fn full_cluster_restart_with_mounts_keeps_everything() {
    let c = DevCluster::up_with(3, 79, &["--mount"]);
    let (m1, m2) = (c.mnt(1), c.mnt(2));
    fs::create_dir_all(m1.join("kept/a/b")).expect("mkdir");
    let files = [
        ("kept/small", 5_000, 1),
        ("kept/a/inline_max", 64 << 10, 2),
        ("kept/a/b/big", (5 << 20) + 3, 3),
        ("kept/empty", 0, 4),
    ];
    for (name, size, seed) in files {
        let mut f = File::create(m1.join(name)).expect("create");
        f.write_all(&stream_bytes(seed, 0, size)).expect("write");
        close(f).expect("close");
    }
    fs::set_permissions(m1.join("kept/small"), fs::Permissions::from_mode(0o600)).expect("chmod");
    symlink("a/b/big", m1.join("kept/link")).expect("symlink");
    fs::hard_link(m1.join("kept/small"), m1.join("kept/a/small_again")).expect("link");
    let mut f = File::create(m2.join("kept/from_node2")).expect("create");
    f.write_all(&stream_bytes(5, 0, 1_000_000)).expect("write");
    f.sync_all().expect("fsync");
    close(f).expect("close");

    c.down();
    for i in 1..=3 {
        assert!(!is_mounted(&c.mnt(i)), "node {i} still mounted after down");
    }
    c.start();
    for i in 1..=3 {
        assert!(is_mounted(&c.mnt(i)), "node {i} not mounted after up");
    }
    for m in [c.mnt(3), c.mnt(1)] {
        for (name, size, seed) in files {
            let p = m.join(name);
            let got = fs::read(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()));
            assert_bytes_eq(&got, &stream_bytes(seed, 0, size), name);
        }
        let p = m.join("kept/from_node2");
        assert_bytes_eq(
            &fs::read(&p).expect("read"),
            &stream_bytes(5, 0, 1_000_000),
            "from_node2",
        );
        assert_eq!(
            fs::read_link(m.join("kept/link")).expect("readlink"),
            Path::new("a/b/big")
        );
        assert_bytes_eq(
            &fs::read(m.join("kept/link")).expect("read through the link"),
            &stream_bytes(3, 0, (5 << 20) + 3),
            "through the link",
        );
        let small = fs::metadata(m.join("kept/small")).expect("stat");
        assert_eq!(small.mode() & 0o7777, 0o600);
        assert_eq!(small.nlink(), 2);
        assert_eq!(
            fs::metadata(m.join("kept/a/small_again"))
                .expect("stat")
                .ino(),
            small.ino()
        );
    }
    // And the mounts take new writes.
    let mut f = File::create(c.mnt(2).join("kept/after")).expect("create after the restart");
    f.write_all(b"after").expect("write");
    close(f).expect("close");
    assert_eq!(
        fs::read(c.mnt(1).join("kept/after")).expect("read"),
        b"after"
    );
}

/// Reads through a mount while its agent is killed and restarted, again and again: the
/// application sees no error (the restarted agent asks holders gossip has not heard of
/// yet at their metadata addresses, and what it cannot serve yet makes the mount wait).
#[test]
fn reads_through_a_mount_never_fail_while_its_agent_restarts() {
    use nix::fcntl::{PosixFadviseAdvice, posix_fadvise};
    use std::os::fd::AsFd;

    let c = DevCluster::up_with(4, 87, &["--mount"]);
    let _restart = RestartOnDrop(&c);
    let dir = c.mnt(1).join("data");
    fs::create_dir(&dir).expect("mkdir");
    let sizes = [4_096usize, 70_000, 300_000, 1 << 20, 2 << 20];
    let files: Vec<(PathBuf, u64, usize)> = (0..10u64)
        .map(|i| {
            (
                dir.join(format!("f{i}")),
                870 + i,
                sizes[i as usize % sizes.len()],
            )
        })
        .collect();
    for (path, seed, size) in &files {
        write_fsync(path, &stream_bytes(*seed, 0, *size)).expect("write");
    }
    let reader_dir = c.mnt(4).join("data");
    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicUsize::new(0));
    let reader = {
        let (stop, rounds) = (stop.clone(), rounds.clone());
        let files: Vec<(PathBuf, u64, usize)> = files
            .iter()
            .map(|(p, s, n)| (reader_dir.join(p.file_name().expect("name")), *s, *n))
            .collect();
        std::thread::spawn(move || {
            let (mut reads, mut errors) = (0usize, Vec::new());
            while !stop.load(Ordering::SeqCst) {
                for (path, seed, size) in &files {
                    let got = File::open(path).and_then(|f| {
                        let mut buf = Vec::new();
                        std::io::Read::read_to_end(&mut &f, &mut buf)?;
                        // The next round reads through the agent again, not the page cache.
                        posix_fadvise(f.as_fd(), 0, 0, PosixFadviseAdvice::POSIX_FADV_DONTNEED)
                            .map_err(std::io::Error::from)?;
                        Ok(buf)
                    });
                    reads += 1;
                    match got {
                        Ok(b) if b == stream_bytes(*seed, 0, *size) => {}
                        Ok(b) => {
                            errors.push(format!("{}: {} bytes, wrong", path.display(), b.len()))
                        }
                        Err(e) => errors.push(format!("{}: {e}", path.display())),
                    }
                }
                rounds.fetch_add(1, Ordering::SeqCst);
            }
            (reads, errors)
        })
    };
    wait_count(&rounds, 2, "reads before the first restart");
    for _ in 0..5 {
        c.kill_agent(4);
        c.respawn_agent(4);
        let now = rounds.load(Ordering::SeqCst);
        wait_count(&rounds, now + 2, "reads after a restart");
    }
    stop.store(true, Ordering::SeqCst);
    let (reads, errors) = reader.join().expect("reader");
    eprintln!("{reads} reads through node 4's mount across 5 restarts of its agent");
    assert!(
        errors.is_empty(),
        "{} of {reads} reads failed: {:?}\nmount.log:\n{}",
        errors.len(),
        &errors[..errors.len().min(10)],
        c.mount_log(4)
    );
}
