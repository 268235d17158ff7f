//! Followers that fall behind under a heavy write load catch up, by log or by snapshot,
//! to exactly the leader's state: a paused follower, then a node added while writes go
//! on, with 60 KiB inline writes. While the follower is paused, 64 clients write at once,
//! so entries hold many writes each and the follower lags by far more than one RPC
//! message holds; with no snapshot to rescue it, it must catch up by log. Then more writes
//! go through a mount (snapshots every 300 entries, the log kept 300 behind), and the new
//! node, which needs entries compacted by then, catches up by snapshot while writes go
//! on. Every replica must end at the same applied index with the same state digest.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use shoal_agent_api::{FileKind, ROOT_INO};
use shoal_tests::fs_api::Fs;
use shoal_tests::{DevCluster, close, stream_bytes, wait_for};

/// `clients` connections to node 1's agent each create and write `per_client` files of
/// `size` bytes into a new directory `name`, all at once.
fn write_through_the_api(
    c: &DevCluster,
    name: &str,
    clients: usize,
    per_client: usize,
    size: usize,
) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let dir = Fs::connect(c, 1)
            .await
            .mknod(ROOT_INO, name, FileKind::Dir)
            .await;
        let mut tasks = tokio::task::JoinSet::new();
        for client in 0..clients {
            let mut fs = Fs::connect(c, 1).await;
            tasks.spawn(async move {
                for n in 0..per_client {
                    let i = client * per_client + n;
                    let ino = fs.mknod(dir, &format!("f{i:05}"), FileKind::File).await;
                    fs.write(ino, 0, stream_bytes(i as u64, 0, size)).await;
                }
            });
        }
        while let Some(t) = tasks.join_next().await {
            t.expect("writer task");
        }
    });
}

/// Writes `count` files of `size` bytes into `dir` from `threads` threads at once; each
/// file is closed (committed) before it counts.
fn write_files(dir: &Path, first: usize, count: usize, size: usize, threads: usize) {
    let next = Arc::new(AtomicUsize::new(first));
    let end = first + count;
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let (next, dir) = (next.clone(), dir.to_owned());
            std::thread::spawn(move || {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= end {
                        return;
                    }
                    let path = dir.join(format!("f{i:05}"));
                    let mut f = std::fs::File::create(&path)
                        .unwrap_or_else(|e| panic!("create {}: {e}", path.display()));
                    std::io::Write::write_all(&mut f, &stream_bytes(i as u64, 0, size))
                        .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
                    close(f).unwrap_or_else(|e| panic!("close {}: {e}", path.display()));
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("writer thread");
    }
}

fn names(dir: &Path) -> Vec<String> {
    let mut n: Vec<String> = std::fs::read_dir(dir)
        .expect("list")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    n.sort();
    n
}

#[test]
fn paused_and_new_followers_catch_up_to_the_leaders_exact_state() {
    const SIZE: usize = 60 << 10;
    let mut c = DevCluster::up_with(5, 41, &["--mount", "--meta", "snapshot_every=300"]);
    // The group forms once all five agents answer; then every node is a replica.
    wait_for(Duration::from_secs(30), "a metadata group of five", || {
        (c.status(1)?["meta"]["learners"].as_array()?.len()
            + c.status(1)?["meta"]["voters"].as_array()?.len()
            == 5)
            .then_some(())
    });
    let started = Instant::now();
    c.signal(5, Signal::SIGSTOP);
    write_through_the_api(&c, "api", 64, 8, SIZE);
    eprintln!("512 writes with node 5 paused: {:?}", started.elapsed());
    c.signal(5, Signal::SIGCONT);
    let (Some(target), _) = c.meta_digest(1).expect("node 1") else {
        panic!("node 1 applied nothing");
    };
    wait_for(Duration::from_secs(60), "node 5 to catch up by log", || {
        c.meta_digest(5)
            .and_then(|(applied, _)| applied)
            .filter(|a| *a >= target)
    });
    eprintln!("node 5 caught up to {target}: {:?}", started.elapsed());
    let dir: PathBuf = c.mnt(1).join("load");
    std::fs::create_dir(&dir).expect("mkdir");
    write_files(&dir, 0, 500, SIZE, 32);
    eprintln!("500 more through the mount: {:?}", started.elapsed());
    // A sixth node joins while 250 more writes run.
    let more = {
        let dir = dir.clone();
        std::thread::spawn(move || write_files(&dir, 500, 250, SIZE, 16))
    };
    c.nodes = 6;
    c.start();
    more.join().expect("second writer");
    eprintln!("750 writes and a join: {:?}", started.elapsed());
    let (index, digest) = c.wait_for_identical_replicas(Duration::from_secs(120));
    eprintln!(
        "all six replicas at index {index}, digest {digest:08x}: {:?}",
        started.elapsed()
    );
    // What users see agrees too: every file, through the new node's mount.
    assert_eq!(
        names(&c.mnt(6).join("api")).len(),
        512,
        "files listed through node 6"
    );
    let listed = names(&c.mnt(6).join("load"));
    assert_eq!(listed.len(), 750, "files listed through node 6");
    for i in [0usize, 511] {
        let got = std::fs::read(c.mnt(6).join("api").join(format!("f{i:05}"))).expect("read");
        assert!(
            got == stream_bytes(i as u64, 0, SIZE),
            "api/f{i:05} differs"
        );
    }
    for i in [0usize, 333, 499, 500, 749] {
        let got = std::fs::read(c.mnt(6).join("load").join(format!("f{i:05}"))).expect("read");
        assert!(
            got == stream_bytes(i as u64, 0, SIZE),
            "f{i:05} differs through node 6"
        );
    }
}
