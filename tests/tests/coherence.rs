//! Close-to-open across nodes with the mounts' long cache lifetimes (60 s for names and
//! directory attributes by default): a change on one node's mount is seen by an open or a
//! stat on another right after, although that kernel had the old name cached. The agent's
//! change feed drops what changed, and an open reached by a name that changed meanwhile
//! answers ESTALE, so the kernel looks the path up again.

use std::fs;
use std::io::ErrorKind;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

use shoal_tests::{DevCluster, assert_bytes_eq, stream_bytes, wait_for};

fn write_close(path: &Path, data: &[u8]) {
    fs::write(path, data).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

fn read(path: &Path) -> Vec<u8> {
    fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

fn assert_gone(path: &Path, what: &str) {
    match fs::File::open(path) {
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => panic!(
            "{what}: open {} failed with {e}, not ENOENT",
            path.display()
        ),
        Ok(_) => panic!("{what}: {} still opens", path.display()),
    }
}

#[test]
fn names_changed_on_one_node_are_seen_by_an_open_on_another_right_after() {
    let c = DevCluster::up_with(3, 83, &["--mount"]);
    let (m1, m3) = (c.mnt(1), c.mnt(3));
    for round in 0..4u64 {
        // Unlink: node 3 read the file (its kernel caches the name), node 1 removes it.
        let gone = m1.join(format!("gone{round}"));
        let data = stream_bytes(round, 0, 10_000);
        write_close(&gone, &data);
        assert_bytes_eq(
            &read(&m3.join(format!("gone{round}"))),
            &data,
            "before unlink",
        );
        fs::remove_file(&gone).expect("unlink on node 1");
        assert_gone(&m3.join(format!("gone{round}")), "unlinked on node 1");

        // Rename (not over anything): the old name is gone, the new one opens.
        let (a, b) = (format!("a{round}"), format!("b{round}"));
        write_close(&m1.join(&a), &data);
        assert_bytes_eq(&read(&m3.join(&a)), &data, "before rename");
        fs::rename(m1.join(&a), m1.join(&b)).expect("rename on node 1");
        assert_gone(&m3.join(&a), "renamed away on node 1");
        assert_bytes_eq(&read(&m3.join(&b)), &data, "the new name on node 3");

        // Directory rename: node 3 walked d/f before; after node 1 renames d, the old
        // path is gone and the new one opens, although the file itself is still linked.
        let (d, e) = (format!("d{round}"), format!("e{round}"));
        fs::create_dir(m1.join(&d)).expect("mkdir");
        write_close(&m1.join(&d).join("f"), &data);
        assert_bytes_eq(&read(&m3.join(&d).join("f")), &data, "d/f before");
        fs::rename(m1.join(&d), m1.join(&e)).expect("rename the directory on node 1");
        assert_gone(&m3.join(&d).join("f"), "d renamed on node 1");
        assert_bytes_eq(&read(&m3.join(&e).join("f")), &data, "e/f on node 3");

        // Rename over (the checkpoint writers' atomic replace), into a directory node 3
        // has cached.
        let target = m1.join(&e).join("ckpt");
        write_close(&target, &stream_bytes(100 + round, 0, 50_000));
        read(&m3.join(&e).join("ckpt"));
        let new = stream_bytes(200 + round, 0, 70_000);
        write_close(&m1.join(&e).join("ckpt.tmp"), &new);
        fs::rename(m1.join(&e).join("ckpt.tmp"), &target).expect("rename over");
        assert_bytes_eq(
            &read(&m3.join(&e).join("ckpt")),
            &new,
            &format!("ckpt replaced on node 1 (round {round})"),
        );
    }
}

#[test]
fn a_stat_on_another_node_after_a_close_sees_the_new_size_and_mtime() {
    let c = DevCluster::up_with(3, 84, &["--mount"]);
    let (m1, m2) = (c.mnt(1), c.mnt(2));
    let (p1, p2) = (m1.join("grows"), m2.join("grows"));
    write_close(&p1, &stream_bytes(1, 0, 1000));
    assert_eq!(fs::metadata(&p2).expect("stat").len(), 1000);
    for round in 1..=5u64 {
        std::thread::sleep(Duration::from_millis(20));
        let len = 1000 + round * 3000;
        write_close(&p1, &stream_bytes(round, 0, len as usize));
        let here = fs::metadata(&p1).expect("stat on node 1");
        let there = fs::metadata(&p2).expect("stat on node 2");
        assert_eq!(
            there.len(),
            len,
            "size on node 2 right after the close (round {round})"
        );
        assert_eq!(
            (there.mtime(), there.mtime_nsec()),
            (here.mtime(), here.mtime_nsec()),
            "mtime on node 2 right after the close (round {round})"
        );
    }

    // A directory's attributes are cached for 60 s, and follow another node's change in
    // well under that.
    let dir1 = m1.join("shared");
    fs::create_dir(&dir1).expect("mkdir");
    let dir2 = m2.join("shared");
    assert_eq!(
        fs::metadata(&dir2).expect("stat").permissions().mode() & 0o777,
        0o755
    );
    fs::set_permissions(&dir1, fs::Permissions::from_mode(0o700)).expect("chmod on node 1");
    wait_for(
        Duration::from_secs(5),
        "the chmod to reach node 2's kernel",
        || {
            let mode = fs::metadata(&dir2).ok()?.permissions().mode() & 0o777;
            (mode == 0o700).then_some(())
        },
    );
}

/// Node 3's kernel caches `d/f`; its agent restarts while node 1 moves `f` aside (it stays
/// linked under another name) and puts a new `f` in its place. The next open of `d/f` on
/// node 3 gets the new file: the mount took every name it handed out before the restart
/// for stale, and waited for its watcher to follow the new agent's feed (a position in
/// the new feed says nothing about the old one).
#[test]
fn an_open_right_after_the_local_agent_restarted_follows_no_stale_name() {
    let c = DevCluster::up_with(3, 88, &["--mount"]);
    let (m1, m3) = (c.mnt(1), c.mnt(3));
    fs::create_dir(m1.join("d")).expect("mkdir");
    for round in 0..3u64 {
        let old = stream_bytes(880 + round, 0, 20_000);
        let new = stream_bytes(890 + round, 0, 30_000);
        write_close(&m1.join("d/f"), &old);
        assert_bytes_eq(
            &read(&m3.join("d/f")),
            &old,
            &format!("d/f on node 3 before its agent restarts (round {round})"),
        );
        c.stop_agent(3);
        fs::rename(m1.join("d/f"), m1.join(format!("d/aside{round}"))).expect("move aside");
        write_close(&m1.join("d/f"), &new);
        c.respawn_agent(3);
        assert_bytes_eq(
            &read(&m3.join("d/f")),
            &new,
            &format!("d/f on node 3 after its agent restarted (round {round})"),
        );
    }
}

/// One node renames directories while another opens paths below their new names right
/// after (close-to-open): never ESTALE or ENOENT for a path that exists at the open. The
/// reader's kernel holds the directories and files below by their inodes all along; the
/// watcher delivers each rename a little after the reader looked the new name up.
#[test]
fn directory_renames_on_one_node_never_fail_an_open_below_them_on_another() {
    let c = DevCluster::up_with(3, 89, &["--mount"]);
    let (m1, m3) = (c.mnt(1), c.mnt(3));
    let dirs = 4;
    for d in 0..dirs {
        let top = m1.join(format!("t{d}_0"));
        fs::create_dir_all(top.join("sub")).expect("mkdir");
        write_close(&top.join("sub/f"), &stream_bytes(d, 0, 100));
    }
    let mut failures = Vec::new();
    let rounds = 1000u64;
    for round in 0..rounds {
        let d = round % dirs;
        let generation = round / dirs;
        let (from, to) = (
            format!("t{d}_{generation}"),
            format!("t{d}_{}", generation + 1),
        );
        fs::rename(m1.join(&from), m1.join(&to)).expect("rename on node 1");
        let path = m3.join(&to).join("sub/f");
        match fs::read(&path) {
            Ok(b) if b == stream_bytes(d, 0, 100) => {}
            Ok(b) => failures.push(format!(
                "round {round}: {} read {} bytes",
                path.display(),
                b.len()
            )),
            Err(e) => failures.push(format!("round {round}: {}: {e}", path.display())),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {rounds} opens failed: {:?}",
        failures.len(),
        &failures[..failures.len().min(10)]
    );
}
