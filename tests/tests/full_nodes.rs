//! Nodes that run out of room: a full node leaves new placements instead of failing
//! writes, "no space" reaches the user only when the cluster as a whole is full, and a
//! filesystem filled by someone else stops new shards on that node but not its metadata.

use std::time::Duration;

use shoal_agent_api::{FileKind, FsError, ROOT_INO};
use shoal_tests::fs_api::{Fs, pattern};
use shoal_tests::{DevCluster, wait_for};

/// Bytes of shard files in node `i`'s store.
fn store_bytes(c: &DevCluster, i: u8) -> u64 {
    std::fs::read_dir(c.node_dir(i).join("data/store/shards"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_node_leaves_placement_and_enospc_means_the_cluster_is_full() {
    let c = DevCluster::up_with(4, 43, &["--store-capacity", "40MiB"]);
    // Node 4 has room for about two shards only.
    c.restart_with_config(4, |t| {
        t.replace("capacity = \"40MiB\"", "capacity = \"3MiB\"")
    });
    let mut fs = Fs::connect(&c, 1).await;
    let dir = fs.mknod(ROOT_INO, "fill", FileKind::Dir).await;
    let mut written = Vec::new();
    // 24 MiB of 2+1 stripes: most of them would place a shard on node 4.
    for i in 0..12u8 {
        let data = pattern(2 << 20, i);
        let name = format!("f{i}");
        let ino = fs
            .try_write_new(dir, &name, data.clone())
            .await
            .unwrap_or_else(|e| panic!("{name} failed while three nodes have room: {e}"));
        written.push((ino, data));
    }
    assert!(
        store_bytes(&c, 4) <= 3 << 20,
        "node 4 holds more than its limit: {}",
        store_bytes(&c, 4)
    );
    // Now fill the rest: the cluster refuses only when no three nodes have room.
    let mut refused = None;
    for i in 12..80u8 {
        let data = pattern(2 << 20, i);
        match fs.try_write_new(dir, &format!("f{i}"), data.clone()).await {
            Ok(ino) => written.push((ino, data)),
            Err(e) => {
                refused = Some(e);
                break;
            }
        }
    }
    assert_eq!(refused, Some(FsError::NoSpace), "the cluster filled up");
    let used: u64 = (1..=3).map(|i| store_bytes(&c, i)).sum();
    assert!(
        used > 3 * (36 << 20),
        "ENOSPC while nodes 1-3 still had room: {used} bytes of {}",
        3 * (40 << 20)
    );
    for (ino, data) in &written {
        fs.open(*ino).await;
        assert!(
            fs.read(*ino, 0, 3 << 20).await == *data,
            "inode {ino} differs"
        );
    }
}

/// A tmpfs mounted on a node's data dir before the cluster starts, unmounted after.
struct SmallDisk(std::path::PathBuf);

impl SmallDisk {
    fn mount(dir: std::path::PathBuf, size: &str) -> SmallDisk {
        std::fs::create_dir_all(&dir).expect("mkdir");
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "shoal-test"])
            .arg(&dir)
            .status()
            .expect("mount");
        assert!(ok.success(), "cannot mount a tmpfs on {}", dir.display());
        SmallDisk(dir)
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filesystem_filled_by_others_stops_new_shards_there_but_not_the_metadata() {
    if !shoal_tests::is_root() {
        eprintln!("SKIPPED: needs root (tmpfs)");
        return;
    }
    let c = DevCluster::prepare(4, 44, &[]);
    let disk = SmallDisk::mount(c.node_dir(3).join("data"), "400M");
    c.start();
    let reserve = c.node_dir(3).join("data/meta/reserve.bin");
    assert!(reserve.exists(), "the metadata's reserve is set aside");
    // Someone else fills node 3's filesystem.
    let junk = c.node_dir(3).join("data/someone-elses-file");
    let ok = std::process::Command::new("dd")
        .args(["if=/dev/zero", "bs=1M", "count=320", "status=none"])
        .arg(format!("of={}", junk.display()))
        .status()
        .expect("dd");
    let _ = ok;
    wait_for(
        Duration::from_secs(20),
        "node 3 seen taking no new shards",
        || {
            let s = c.status(1)?;
            s["nodes"]
                .as_array()?
                .iter()
                .any(|n| n["name"] == "node3" && n["store_accepting"] == false)
                .then_some(())
        },
    );
    // Writes go on, placed on the other three nodes.
    let mut fs = Fs::connect(&c, 1).await;
    let dir = fs.mknod(ROOT_INO, "d", FileKind::Dir).await;
    let before = store_bytes(&c, 3);
    for i in 0..4u8 {
        fs.try_write_new(dir, &format!("f{i}"), pattern(3 << 20, i))
            .await
            .unwrap_or_else(|e| panic!("write {i}: {e}"));
    }
    assert_eq!(store_bytes(&c, 3), before, "no new shard on the full node");
    // The metadata on node 3 goes on: writes through it commit, it applies them.
    let mut on3 = Fs::connect(&c, 3).await;
    for i in 0..50 {
        on3.mknod(dir, &format!("m{i}"), FileKind::File).await;
    }
    assert!(
        !reserve.exists(),
        "the reserve was given up for the metadata"
    );
    assert!(c.log(3).contains("released its 64 MiB reserve"));
    c.wait_for_identical_replicas(Duration::from_secs(30));
    drop(c);
    drop(disk);
}
