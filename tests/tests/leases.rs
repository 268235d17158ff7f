//! Directory leases through real mounts (issue 37): a mount's changes in a directory only
//! its node works in are answered by its agent at once and committed in batches. What
//! must hold all the same: another node sees them at its next lookup, listing or open
//! (the holder commits first), `fsync` makes them durable, two nodes in one directory
//! both see everything, and a mount whose agent died with changes not synced hears so
//! at its next `fsync` (EIO), never nothing.

use std::collections::BTreeSet;
use std::fs;
use std::io::ErrorKind;
use std::path::Path;
use std::time::Duration;

use shoal_tests::{DevCluster, assert_bytes_eq, stream_bytes};

const EIO: i32 = 5;

fn names(dir: &Path) -> BTreeSet<String> {
    fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("list {}: {e}", dir.display()))
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect()
}

fn fsync_dir(dir: &Path) -> std::io::Result<()> {
    fs::File::open(dir)?.sync_all()
}

/// The agent's `lease-writeback` worker, as `shoal status` shows it.
fn writeback(c: &DevCluster, node: u8) -> serde_json::Value {
    let status = c.status(node).expect("status");
    status["workers"]
        .as_array()
        .and_then(|w| w.iter().find(|w| w["name"] == "lease-writeback").cloned())
        .expect("a lease-writeback worker")
}

#[test]
fn changes_under_a_lease_are_seen_by_another_node_at_once() {
    let c = DevCluster::up_with(3, 140, &["--mount"]);
    let (m1, m2) = (c.mnt(1), c.mnt(2));
    fs::create_dir(m1.join("d")).expect("mkdir on node 1");
    let files = 60u64;
    for i in 0..files {
        fs::write(
            m1.join(format!("d/f{i}")),
            stream_bytes(i, 0, 100 + i as usize * 50),
        )
        .expect("write on node 1");
    }
    // Node 1 answered those from its lease on d: node 2's listing recalls it.
    let progress = writeback(&c, 1)["progress"].clone();
    let want: BTreeSet<String> = (0..files).map(|i| format!("f{i}")).collect();
    assert_eq!(names(&m2.join("d")), want, "node 2 lists node 1's creates");
    for i in 0..files {
        assert_bytes_eq(
            &fs::read(m2.join(format!("d/f{i}"))).expect("read on node 2"),
            &stream_bytes(i, 0, 100 + i as usize * 50),
            &format!("d/f{i} on node 2"),
        );
    }
    // Node 1 takes the lease again (after a while: node 2 worked in d) and removes,
    // renames and makes more; node 2's next open and listing see it.
    std::thread::sleep(Duration::from_secs(3));
    for i in 0..10 {
        fs::remove_file(m1.join(format!("d/f{i}"))).expect("unlink on node 1");
    }
    for i in 10..15 {
        fs::rename(m1.join(format!("d/f{i}")), m1.join(format!("d/g{i}"))).expect("rename");
    }
    fs::create_dir(m1.join("d/sub")).expect("mkdir d/sub");
    fs::write(m1.join("d/sub/inner"), b"inner").expect("write d/sub/inner");
    match fs::read(m2.join("d/f3")) {
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        other => panic!("d/f3 unlinked on node 1 still reads on node 2: {other:?}"),
    }
    assert_bytes_eq(
        &fs::read(m2.join("d/g12")).expect("renamed file on node 2"),
        &stream_bytes(12, 0, 100 + 12 * 50),
        "d/g12 on node 2",
    );
    assert_eq!(
        fs::read(m2.join("d/sub/inner")).expect("a file in a directory made under the lease"),
        b"inner"
    );
    let mut want: BTreeSet<String> = (15..files).map(|i| format!("f{i}")).collect();
    want.extend((10..15).map(|i| format!("g{i}")));
    want.insert("sub".into());
    assert_eq!(names(&m2.join("d")), want, "node 2 lists node 1's changes");
    assert!(
        progress.as_str().is_some_and(|p| p.contains("leases held")),
        "node 1 held a lease while it created: {progress}"
    );
    let metrics = c.metrics(1);
    for counter in [
        "shoal_lease_grants_total",
        "shoal_lease_recalls_total",
        "shoal_lease_batches_total",
    ] {
        let value: f64 = metrics
            .lines()
            .find_map(|l| l.strip_prefix(counter)?.trim().parse().ok())
            .unwrap_or(0.0);
        assert!(value > 0.0, "{counter} on node 1 is {value}");
    }
}

#[test]
fn two_nodes_creating_in_one_directory_both_see_everything() {
    let c = DevCluster::up_with(3, 141, &["--mount"]);
    let (m1, m2) = (c.mnt(1), c.mnt(2));
    fs::create_dir(m1.join("shared")).expect("mkdir");
    let writers: Vec<_> = [(1u64, m1.clone()), (2, m2.clone())]
        .into_iter()
        .map(|(node, mnt)| {
            std::thread::spawn(move || {
                for i in 0..80u64 {
                    let name = mnt.join(format!("shared/n{node}-{i}"));
                    fs::write(&name, stream_bytes(node * 1000 + i, 0, 300))
                        .unwrap_or_else(|e| panic!("create {}: {e}", name.display()));
                }
            })
        })
        .collect();
    for w in writers {
        w.join().expect("writer");
    }
    let want: BTreeSet<String> = [1u64, 2]
        .iter()
        .flat_map(|n| (0..80u64).map(move |i| format!("n{n}-{i}")))
        .collect();
    for (node, mnt) in [(1, &m1), (2, &m2), (3, &c.mnt(3))] {
        assert_eq!(names(&mnt.join("shared")), want, "node {node} lists both");
    }
    for (n, i) in [(1u64, 79u64), (2, 0), (2, 79), (1, 40)] {
        assert_bytes_eq(
            &fs::read(c.mnt(3).join(format!("shared/n{n}-{i}"))).expect("read on node 3"),
            &stream_bytes(n * 1000 + i, 0, 300),
            &format!("n{n}-{i} on node 3"),
        );
    }
}

#[test]
fn fsync_makes_changes_durable_and_reports_those_an_agent_crash_may_have_lost() {
    let c = DevCluster::up_with(3, 142, &["--mount"]);
    let m1 = c.mnt(1);
    fs::create_dir(m1.join("kept")).expect("mkdir");
    for i in 0..20 {
        fs::write(m1.join(format!("kept/f{i}")), format!("kept {i}")).expect("write");
    }
    fsync_dir(&m1.join("kept")).expect("fsync of the directory");
    // Synced: survives the agent's kill -9 at once, seen from another node.
    fs::create_dir(m1.join("unsynced")).expect("mkdir");
    for i in 0..20 {
        fs::write(m1.join(format!("unsynced/f{i}")), format!("maybe {i}")).expect("write");
    }
    c.kill_agent(1);
    let want: BTreeSet<String> = (0..20).map(|i| format!("f{i}")).collect();
    assert_eq!(
        names(&c.mnt(2).join("kept")),
        want,
        "synced before the kill"
    );
    c.respawn_agent(1);
    // The mount reconnects to the new agent (its requests wait for it meanwhile); its
    // first fsync says that what the dead agent answered and nobody synced may be gone.
    let err = fsync_dir(&m1.join("kept")).expect_err("the first fsync after the agent died");
    assert_eq!(err.raw_os_error(), Some(EIO), "{err}");
    fsync_dir(&m1.join("kept")).expect("reported once");
    for i in 0..20 {
        assert_eq!(
            fs::read_to_string(m1.join(format!("kept/f{i}"))).expect("kept on node 1"),
            format!("kept {i}")
        );
    }
    // What survived of the unsynced directory is a prefix of what was answered, in
    // order: files f0..fk, each whole but maybe the last (its create committed, not yet
    // its bytes: a local filesystem's crash leaves the same).
    if let Ok(entries) = fs::read_dir(c.mnt(2).join("unsynced")) {
        let mut got: Vec<u32> = entries
            .map(|e| {
                let name = e.expect("entry").file_name().to_string_lossy().into_owned();
                name[1..].parse().expect("f<i>")
            })
            .collect();
        got.sort_unstable();
        assert_eq!(got, (0..got.len() as u32).collect::<Vec<_>>(), "a prefix");
        for &i in &got {
            let bytes = fs::read_to_string(c.mnt(2).join(format!("unsynced/f{i}"))).expect("read");
            let last = i + 1 == got.len() as u32;
            assert!(
                bytes == format!("maybe {i}") || (last && bytes.is_empty()),
                "unsynced/f{i} reads {bytes:?}"
            );
        }
    }
}
