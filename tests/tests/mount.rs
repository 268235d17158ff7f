//! The filesystem through real mounts (`dev-cluster up --mount`: one `shoal mount` per node
//! on `nodeN/mnt`), driven with std::fs and the usual tools (`cp`, `diff`, `ls`), and
//! checked on what a user of another node's mount sees.

use std::collections::BTreeSet;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt, symlink};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use shoal_tests::{DevCluster, assert_bytes_eq, close, stream_bytes, wait_for};

/// Creates `path` with `data` and closes it, asserting that close succeeded.
fn write_close(path: &Path, data: &[u8]) {
    let mut f = File::create(path).unwrap_or_else(|e| panic!("create {}: {e}", path.display()));
    f.write_all(data)
        .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    close(f).unwrap_or_else(|e| panic!("close {}: {e}", path.display()));
}

/// The size `fstat` gives right after `open` (close-to-open: what another node closed).
fn size_at_open(path: &Path) -> u64 {
    let f = File::open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    f.metadata().expect("fstat").len()
}

fn read(path: &Path) -> Vec<u8> {
    fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// Reads `len` bytes at `offset` through an open file (short only at end of file).
fn read_at(f: &File, offset: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0; len];
    let mut got = 0;
    while got < len {
        let n = f
            .read_at(&mut buf[got..], offset + got as u64)
            .expect("read_at");
        if n == 0 {
            break;
        }
        got += n;
    }
    buf.truncate(got);
    buf
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().expect("run a command");
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn file_closed_on_one_node_reads_back_identical_on_another() {
    let c = DevCluster::up_with(3, 70, &["--mount"]);
    let (m1, m3) = (c.mnt(1), c.mnt(3));
    // Empty, one byte, the inline limit and one past it, and several stripes with a tail.
    let sizes = [0, 1, 4095, 64 << 10, (64 << 10) + 1, (9 << 20) + 12_345];
    for (seed, &size) in sizes.iter().enumerate() {
        let name = format!("f{size}");
        let data = stream_bytes(seed as u64, 0, size);
        write_close(&m1.join(&name), &data);
        assert_eq!(
            size_at_open(&m3.join(&name)),
            size as u64,
            "{name}: size seen by node 3"
        );
        assert_bytes_eq(&read(&m3.join(&name)), &data, &format!("{name} on node 3"));
    }
    // Overwritten right after node 3 read (and cached) the old contents: node 3 sees the
    // new bytes when it opens the file again (close-to-open), whether the file grew, shrank
    // or kept its size.
    for (seed, &size) in sizes.iter().enumerate().skip(1) {
        let name = format!("f{size}");
        for (k, new_size) in [size + 70_000, size / 2, size / 2].into_iter().enumerate() {
            let data = stream_bytes(100 + 10 * seed as u64 + k as u64, 0, new_size);
            write_close(&m1.join(&name), &data);
            assert_bytes_eq(
                &read(&m3.join(&name)),
                &data,
                &format!("{name} rewritten with {new_size} bytes, on node 3"),
            );
        }
    }
    // The same for a file node 3 has just seen empty.
    assert_eq!(read(&m3.join("f0")), b"");
    let data = stream_bytes(99, 0, 70_000);
    write_close(&m1.join("f0"), &data);
    assert_bytes_eq(
        &read(&m3.join("f0")),
        &data,
        "f0 (just read empty) rewritten with 70000 bytes, on node 3",
    );
}

/// One entry of a tree as `stat` shows it, for comparing two trees.
#[derive(Debug, PartialEq)]
struct Entry {
    kind: &'static str,
    mode: u32,
    uid: u32,
    gid: u32,
    size: Option<u64>,
    nlink: Option<u64>,
    mtime: (i64, i64),
    target: Option<std::path::PathBuf>,
}

fn entry(path: &Path) -> Entry {
    let m = fs::symlink_metadata(path).unwrap_or_else(|e| panic!("stat {}: {e}", path.display()));
    let ft = m.file_type();
    let kind = if ft.is_dir() {
        "dir"
    } else if ft.is_symlink() {
        "symlink"
    } else {
        "file"
    };
    Entry {
        kind,
        // A symlink's own mode is always 0777 on Linux; not worth comparing.
        mode: if ft.is_symlink() {
            0
        } else {
            m.mode() & 0o7777
        },
        uid: m.uid(),
        gid: m.gid(),
        // A directory's size and link count are the filesystem's own business.
        size: (!ft.is_dir()).then_some(m.len()),
        nlink: (!ft.is_dir()).then_some(m.nlink()),
        // `cp -a` keeps modification times, symlinks' included.
        mtime: (m.mtime(), m.mtime_nsec()),
        target: ft
            .is_symlink()
            .then(|| fs::read_link(path).expect("readlink")),
    }
}

/// Every path under `root`, relative, sorted.
fn walk(root: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).expect("read_dir") {
            let p = e.expect("dir entry").path();
            out.push(p.strip_prefix(root).expect("under root").to_owned());
            if fs::symlink_metadata(&p).expect("stat").is_dir() {
                stack.push(p);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn tree_copied_in_with_cp_a_is_identical_on_another_node() {
    let c = DevCluster::up_with(3, 71, &["--mount"]);
    let src_dir = tempfile::tempdir().expect("tempdir");
    let src = src_dir.path().join("tree");
    let sizes = [
        0,
        1,
        17,
        512,
        4096,
        30_000,
        64 << 10,
        (64 << 10) + 1,
        150_000,
    ];
    let mut n = 0u64;
    for d in 0..5 {
        for s in 0..4 {
            let dir = src.join(format!("d{d}")).join(format!("s{s}"));
            fs::create_dir_all(&dir).expect("mkdir");
            for f in 0..10 {
                let size = if n % 40 == 39 {
                    (1 << 20) + 3
                } else {
                    sizes[n as usize % sizes.len()]
                };
                let p = dir.join(format!("f{f}"));
                fs::write(&p, stream_bytes(n, 0, size)).expect("write");
                let mode = [0o600, 0o755, 0o644][n as usize % 3];
                fs::set_permissions(&p, fs::Permissions::from_mode(mode)).expect("chmod");
                n += 1;
            }
        }
    }
    fs::set_permissions(src.join("d1"), fs::Permissions::from_mode(0o700)).expect("chmod");
    fs::set_permissions(src.join("d2/s1"), fs::Permissions::from_mode(0o755)).expect("chmod");
    fs::create_dir_all(src.join("empty/dir")).expect("mkdir");
    write_close(&src.join("with space and ünïcode"), b"odd name\n");
    write_close(&src.join("x".repeat(255)), b"longest name\n");
    symlink("f0", src.join("d0/s0/to_f0")).expect("symlink");
    symlink("../../d3/s2/f5", src.join("d0/s1/to_other_dir")).expect("symlink");
    symlink("nowhere", src.join("dangling")).expect("symlink");
    symlink("/etc/hostname", src.join("absolute")).expect("symlink");
    symlink("d4", src.join("to_dir")).expect("symlink");
    fs::hard_link(src.join("d0/s0/f1"), src.join("d2/hard")).expect("link");

    let started = Instant::now();
    run(Command::new("cp")
        .arg("-a")
        .arg(&src)
        .arg(c.mnt(1).join("tree")));
    let copied = started.elapsed();
    let dst = c.mnt(2).join("tree");
    run(Command::new("diff")
        .args(["-r", "--no-dereference"])
        .arg(&src)
        .arg(&dst));
    let paths = walk(&src);
    assert!(paths.len() > 200, "{} paths", paths.len());
    assert_eq!(walk(&dst), paths, "names on node 2");
    for p in &paths {
        assert_eq!(entry(&dst.join(p)), entry(&src.join(p)), "{}", p.display());
    }
    let (a, b) = (
        fs::metadata(dst.join("d0/s0/f1")).expect("stat"),
        fs::metadata(dst.join("d2/hard")).expect("stat"),
    );
    assert_eq!(a.ino(), b.ino(), "the hard link is one inode on node 2");
    assert_eq!(a.nlink(), 2);
    eprintln!(
        "cp -a of {} paths took {copied:?}, compared in {:?}",
        paths.len(),
        started.elapsed() - copied
    );
}

/// A copy sets its file's times and mode after writing it, before close: the mount sends
/// them with the file's bytes (one commit, after the data). Both nodes see them; a write
/// after them stamps the time again, as on a local filesystem.
#[test]
fn times_and_mode_set_before_close_land_after_the_data_and_a_later_write_stamps_again() {
    let c = DevCluster::up_with(3, 80, &["--mount"]);
    let (here, there) = (c.mnt(1), c.mnt(2));
    let old = std::time::UNIX_EPOCH + Duration::from_secs(1_000_000);
    let times = fs::FileTimes::new().set_accessed(old).set_modified(old);

    let mut f = File::create(here.join("copied")).expect("create");
    f.write_all(b"ten bytes!").expect("write");
    f.set_times(times).expect("futimens");
    f.set_permissions(fs::Permissions::from_mode(0o640))
        .expect("fchmod");
    let m = f.metadata().expect("fstat before close");
    assert_eq!(
        (m.len(), m.mode() & 0o7777, m.mtime()),
        (10, 0o640, 1_000_000)
    );
    close(f).expect("close");
    let m = fs::metadata(there.join("copied")).expect("stat on node 2");
    assert_eq!(
        (m.len(), m.mode() & 0o7777, m.mtime()),
        (10, 0o640, 1_000_000)
    );
    assert_eq!(read(&there.join("copied")), b"ten bytes!");

    let mut f = File::create(here.join("touched")).expect("create");
    f.write_all(b"first").expect("write");
    f.set_times(times).expect("futimens");
    f.write_all(b" and second").expect("write after the times");
    close(f).expect("close");
    let m = fs::metadata(there.join("touched")).expect("stat on node 2");
    assert_eq!(m.len(), 16);
    assert!(
        m.mtime() > 1_000_000,
        "the write after futimens stamped the time again: {}",
        m.mtime()
    );
    assert_eq!(read(&there.join("touched")), b"first and second");
}

#[test]
fn open_files_survive_unlink_and_rename_until_closed() {
    // Unlinked inodes may be purged 2 s after the unlink, GC passes every second.
    let c = DevCluster::up_with(
        3,
        72,
        &[
            "--mount",
            "--meta",
            "orphan_grace_s=2",
            "--meta",
            "gc_interval_s=1",
        ],
    );
    let up = Instant::now();
    let (m1, m2, m3) = (c.mnt(1), c.mnt(2), c.mnt(3));
    let d1 = m1.join("open");
    fs::create_dir(&d1).expect("mkdir");
    let (d2, d3) = (m2.join("open"), m3.join("open"));
    let rw = |p: &Path| {
        OpenOptions::new()
            .read(true)
            .write(true)
            .open(p)
            .unwrap_or_else(|e| panic!("open {}: {e}", p.display()))
    };
    let gone = |p: &Path| {
        wait_for(
            Duration::from_secs(5),
            &format!("{} to be gone", p.display()),
            || (!p.exists()).then_some(()),
        );
    };

    // a: unlinked by the node that holds it open; written and fsynced afterwards.
    let mut a = stream_bytes(1, 0, 300_000);
    write_close(&d1.join("a"), &a);
    let fa = rw(&d1.join("a"));
    fs::remove_file(d1.join("a")).expect("unlink a");
    assert!(!d1.join("a").exists());
    gone(&d3.join("a"));
    assert_bytes_eq(
        &read_at(&fa, 0, 1 << 20),
        &a,
        "a through its fd after unlink",
    );
    let more = stream_bytes(2, 0, 100_000);
    fa.write_all_at(&more, a.len() as u64).expect("write a");
    fa.sync_all().expect("fsync an unlinked file");
    a.extend_from_slice(&more);
    assert_eq!(fa.metadata().expect("fstat").len(), a.len() as u64);
    assert_bytes_eq(&read_at(&fa, 0, 1 << 20), &a, "a after writing past unlink");

    // b: small (inline), unlinked by another node, then grown past the inline limit.
    let mut b = stream_bytes(3, 0, 5_000);
    write_close(&d1.join("b"), &b);
    let fb = rw(&d1.join("b"));
    fs::remove_file(d2.join("b")).expect("unlink b from node 2");
    gone(&d1.join("b"));
    assert_bytes_eq(&read_at(&fb, 0, 1 << 20), &b, "b after unlink on node 2");
    let more = stream_bytes(4, 0, 75_000);
    fb.write_all_at(&more, b.len() as u64).expect("write b");
    b.extend_from_slice(&more);
    assert_bytes_eq(&read_at(&fb, 0, 1 << 20), &b, "b grown after unlink");

    // c: renamed by another node while open; the writes through the fd land in the file
    // under its new name.
    let mut cc = stream_bytes(5, 0, 200_000);
    write_close(&d1.join("c"), &cc);
    let fc = rw(&d1.join("c"));
    fs::rename(d2.join("c"), d2.join("c2")).expect("rename c");
    let more = stream_bytes(6, 0, 50_000);
    fc.write_all_at(&more, 10_000).expect("write c");
    cc[10_000..60_000].copy_from_slice(&more);
    close(fc).expect("close c");
    assert_bytes_eq(&read(&d3.join("c2")), &cc, "c2 on node 3");
    gone(&d3.join("c"));

    // d: a file held open is replaced by a rename over it; the fd keeps the old contents,
    // the name gives the new ones.
    let old = stream_bytes(7, 0, 250_000);
    let new = stream_bytes(8, 0, 90_000);
    write_close(&d1.join("d"), &old);
    write_close(&d1.join("d_new"), &new);
    let fd = File::open(d1.join("d")).expect("open d");
    fs::rename(d1.join("d_new"), d1.join("d")).expect("rename over d");
    assert_bytes_eq(&read(&d3.join("d")), &new, "d replaced, on node 3");
    assert_bytes_eq(&read_at(&fd, 0, 1 << 20), &old, "the replaced d via its fd");

    // Past the orphan grace and a few GC passes, and past the first 15 s after the agents
    // started (when every inode counts as held, while mounts re-announce their handles):
    // files held open are not purged.
    let inodes = || {
        c.status(1).expect("status")["meta"]["inodes"]
            .as_u64()
            .expect("inode count")
    };
    let held = inodes();
    // The 15 s are a rule of the purge's own clock; the passes after it are counted.
    std::thread::sleep(Duration::from_secs(16).saturating_sub(up.elapsed()));
    c.wait_for_rounds(&[1, 2, 3], "orphan-purge", 3, Duration::from_secs(60));
    assert_eq!(inodes(), held, "inodes purged while open");
    // The purge runs on the metadata leader; `shoal status` shows the others standing by.
    let leader = c.meta_leader(1).expect("a metadata leader");
    for i in 1..=3u8 {
        let status = c.status(i).expect("status");
        let purge = status["workers"]
            .as_array()
            .and_then(|w| w.iter().find(|w| w["name"] == "orphan-purge"))
            .map(|w| w["state"].as_str().unwrap_or_default().to_owned())
            .expect("the orphan-purge worker in status");
        assert_eq!(
            purge == "standby",
            i != leader,
            "node {i} (leader {leader}): {purge}"
        );
    }
    assert_bytes_eq(&read_at(&fa, 0, 1 << 20), &a, "a past the orphan grace");
    assert_bytes_eq(&read_at(&fb, 0, 1 << 20), &b, "b past the orphan grace");
    assert_bytes_eq(
        &read_at(&fd, 0, 1 << 20),
        &old,
        "old d past the orphan grace",
    );
    for (name, f) in [("a", fa), ("b", fb), ("d", fd)] {
        close(f).unwrap_or_else(|e| panic!("close {name}: {e}"));
    }

    // Once closed they are purged (a, b and the replaced d), and the names stay gone.
    wait_for(
        Duration::from_secs(30),
        "the closed orphans to be purged",
        || (inodes() == held - 3).then_some(()),
    );
    for m in [&d1, &d2, &d3] {
        let names: BTreeSet<String> = fs::read_dir(m)
            .expect("read_dir")
            .map(|e| e.expect("entry").file_name().into_string().expect("utf-8"))
            .collect();
        assert_eq!(
            names,
            BTreeSet::from(["c2".to_owned(), "d".to_owned()]),
            "{}",
            m.display()
        );
        for gone in ["a", "b", "c", "d_new"] {
            assert!(
                !m.join(gone).exists(),
                "{gone} came back in {}",
                m.display()
            );
        }
    }
    assert_bytes_eq(&read(&d2.join("d")), &new, "d after the old one was purged");
    write_close(&d2.join("a"), b"a new a");
    assert_eq!(read(&d1.join("a")), b"a new a");
}

#[test]
fn sparse_files_and_truncate_read_back_across_holes() {
    let c = DevCluster::up_with(3, 73, &["--mount"]);
    let (m1, m2, m3) = (c.mnt(1), c.mnt(2), c.mnt(3));
    let rw = |p: &Path| {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(p)
            .unwrap_or_else(|e| panic!("open {}: {e}", p.display()))
    };

    // A write at 10 MiB into an empty file: zeros before it.
    let tail = stream_bytes(1, 0, 4096);
    let f = rw(&m1.join("sparse"));
    f.write_all_at(&tail, 10 << 20).expect("write at 10 MiB");
    close(f).expect("close");
    assert_eq!(size_at_open(&m2.join("sparse")), (10 << 20) + 4096);
    let mut want = vec![0u8; 10 << 20];
    want.extend_from_slice(&tail);
    assert_bytes_eq(&read(&m2.join("sparse")), &want, "sparse on node 2");

    // Data, then truncated down into it: the cut bytes do not come back when the file
    // grows again (truncate up from another node), and a write past the end leaves zeros.
    let head = stream_bytes(2, 0, 3 << 20);
    let f = rw(&m1.join("sparse"));
    f.write_all_at(&head, 0).expect("write head");
    f.set_len((2 << 20) + 7).expect("truncate down");
    close(f).expect("close");
    assert_bytes_eq(
        &read(&m2.join("sparse")),
        &head[..(2 << 20) + 7],
        "truncated down, on node 2",
    );
    let f = rw(&m2.join("sparse"));
    f.set_len(8 << 20).expect("truncate up");
    f.write_all_at(b"xyz", 6 << 20).expect("write in the hole");
    close(f).expect("close");
    let mut want = head[..(2 << 20) + 7].to_vec();
    want.resize(8 << 20, 0);
    want[6 << 20..(6 << 20) + 3].copy_from_slice(b"xyz");
    assert_bytes_eq(&read(&m3.join("sparse")), &want, "grown again, on node 3");

    // An inline file truncated up past the inline limit, then to zero.
    let small = stream_bytes(3, 0, 100);
    write_close(&m1.join("small"), &small);
    let f = rw(&m1.join("small"));
    f.set_len(200_000).expect("truncate up");
    close(f).expect("close");
    let mut want = small.clone();
    want.resize(200_000, 0);
    assert_bytes_eq(&read(&m3.join("small")), &want, "small grown, on node 3");
    let f = rw(&m3.join("small"));
    f.write_all_at(b"end", 199_997)
        .expect("write the last bytes");
    close(f).expect("close");
    want[199_997..].copy_from_slice(b"end");
    assert_bytes_eq(
        &read(&m2.join("small")),
        &want,
        "small with its end, on node 2",
    );
    let f = rw(&m2.join("small"));
    f.set_len(0).expect("truncate to zero");
    close(f).expect("close");
    assert_eq!(read(&m1.join("small")), b"", "small emptied, on node 1");

    // A write past the end of a small file: a hole between.
    write_close(&m1.join("gap"), &stream_bytes(4, 0, 1000));
    let f = rw(&m1.join("gap"));
    f.write_all_at(b"0123456789", (1 << 20) + 5)
        .expect("write past end");
    close(f).expect("close");
    let mut want = stream_bytes(4, 0, 1000);
    want.resize((1 << 20) + 5, 0);
    want.extend_from_slice(b"0123456789");
    assert_bytes_eq(&read(&m3.join("gap")), &want, "gap on node 3");
    // Read across the hole's edges through an open file on another node.
    let f = File::open(m2.join("gap")).expect("open");
    assert_bytes_eq(&read_at(&f, 990, 20), &want[990..1010], "the hole's start");
    assert_bytes_eq(
        &read_at(&f, (1 << 20) + 1, 100),
        &want[(1 << 20) + 1..],
        "the hole's end",
    );
    drop(f);

    // Last, a size changed by another node right after this node set the old one itself:
    // the next open here sees the new size (close-to-open).
    let data = stream_bytes(5, 0, 3 << 20);
    let f = rw(&m1.join("cto"));
    f.write_all_at(&data, 0).expect("write");
    f.set_len(1 << 20).expect("truncate down");
    close(f).expect("close");
    let f = rw(&m2.join("cto"));
    f.set_len(4 << 20).expect("truncate up on node 2");
    close(f).expect("close");
    let mut want = data[..1 << 20].to_vec();
    want.resize(4 << 20, 0);
    assert_bytes_eq(
        &read(&m1.join("cto")),
        &want,
        "grown on node 2 right after node 1 cut it, read on node 1",
    );
}

#[test]
fn two_thousand_files_in_one_directory() {
    let c = DevCluster::up_with(3, 74, &["--mount"]);
    let (m1, m2, m3) = (c.mnt(1), c.mnt(2), c.mnt(3));
    fs::create_dir(m1.join("many")).expect("mkdir");
    let content = |i: usize| format!("file {i}\n").repeat(i % 7).into_bytes();
    // Four writers at once, as `cp -r` with a few jobs or an unpacking tool would.
    let started = Instant::now();
    std::thread::scope(|s| {
        for t in 0..4 {
            let m1 = &m1;
            s.spawn(move || {
                for i in (t..2000).step_by(4) {
                    write_close(&m1.join(format!("many/f{i:04}")), &content(i));
                }
            });
        }
    });
    let created = started.elapsed();

    let dir2 = m2.join("many");
    let names: BTreeSet<String> = fs::read_dir(&dir2)
        .expect("read_dir")
        .map(|e| e.expect("entry").file_name().into_string().expect("utf-8"))
        .collect();
    assert_eq!(names.len(), 2000, "entries listed on node 2");
    assert_eq!(
        names,
        (0..2000)
            .map(|i| format!("f{i:04}"))
            .collect::<BTreeSet<_>>()
    );
    let ls = run(Command::new("ls").arg("-1").arg(&dir2));
    assert_eq!(ls.lines().count(), 2000, "ls on node 2");
    {
        // Listed in pages of 7 names (the default page, 4,096, holds them all).
        let small_pages = c.mount_extra(3, &c.path().join("paged"), &["--readdir-page", "7"]);
        let paged = run(Command::new("ls")
            .arg("-1")
            .arg(small_pages.path.join("many")));
        assert_eq!(paged, ls, "ls in pages of 7 on node 3");
    }
    for i in 0..2000 {
        let meta = fs::metadata(dir2.join(format!("f{i:04}"))).expect("stat");
        assert!(meta.is_file());
        assert_eq!(meta.len(), content(i).len() as u64, "f{i:04}");
    }
    for i in (0..2000).step_by(97) {
        assert_eq!(read(&dir2.join(format!("f{i:04}"))), content(i), "f{i:04}");
    }
    let listed = started.elapsed() - created;

    std::thread::scope(|s| {
        for t in 0..4 {
            let m3 = &m3;
            s.spawn(move || {
                for i in (t..2000).step_by(4) {
                    fs::remove_file(m3.join(format!("many/f{i:04}"))).expect("unlink");
                }
            });
        }
    });
    assert_eq!(fs::read_dir(m1.join("many")).expect("read_dir").count(), 0);
    fs::remove_dir(m1.join("many")).expect("rmdir the emptied directory");
    eprintln!(
        "2000 files: created in {created:?}, listed and stat'ed in {listed:?}, deleted in {:?}",
        started.elapsed() - created - listed
    );
}

#[test]
fn one_gib_file_streams_back_identical() {
    const SIZE: u64 = 1 << 30;
    const CHUNK: usize = 1 << 20;
    let c = DevCluster::up_with(3, 75, &["--mount"]);
    let started = Instant::now();
    let mut f = File::create(c.mnt(1).join("big")).expect("create");
    for off in (0..SIZE).step_by(CHUNK) {
        f.write_all(&stream_bytes(75, off, CHUNK)).expect("write");
    }
    f.sync_all().expect("fsync");
    close(f).expect("close");
    let written = started.elapsed();

    let mut f = File::open(c.mnt(2).join("big")).expect("open on node 2");
    assert_eq!(f.metadata().expect("fstat").len(), SIZE);
    let mut buf = vec![0u8; CHUNK];
    for off in (0..SIZE).step_by(CHUNK) {
        f.read_exact(&mut buf)
            .unwrap_or_else(|e| panic!("read at {off}: {e}"));
        assert_bytes_eq(
            &buf,
            &stream_bytes(75, off, CHUNK),
            &format!("the MiB at {off}"),
        );
    }
    assert_eq!(f.read(&mut buf).expect("read at the end"), 0);
    // The mount raised the kernel's read-ahead so that a sequential read comes in 1 MiB
    // requests, not 128 KiB ones.
    assert!(
        kernel_read_ahead_kb(&c.mnt(2)) >= 1024,
        "kernel read-ahead on node 2's mount"
    );
    eprintln!(
        "1 GiB: written (and fsynced) through node 1 in {written:?}, read back through node 2 in {:?}",
        started.elapsed() - written
    );
}

/// The kernel's read-ahead (KiB) for the mount on `mnt`, from its backing device.
fn kernel_read_ahead_kb(mnt: &Path) -> u64 {
    let device = run(Command::new("mountpoint").arg("-d").arg(mnt));
    let device = device.trim();
    let knob = format!("/sys/class/bdi/{device}/read_ahead_kb");
    std::fs::read_to_string(&knob)
        .unwrap_or_else(|e| panic!("{knob}: {e}"))
        .trim()
        .parse()
        .expect("a number")
}

/// Runs `sh -c script` as `uid`:`gid` (no supplementary groups); (success, stderr).
fn as_user(uid: u32, gid: u32, script: &str) -> (bool, String) {
    let out = Command::new("setpriv")
        .arg(format!("--reuid={uid}"))
        .arg(format!("--regid={gid}"))
        .args(["--clear-groups", "--", "sh", "-c", script])
        .output()
        .expect("setpriv");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[track_caller]
fn allowed(uid: u32, gid: u32, script: &str) {
    let (ok, err) = as_user(uid, gid, script);
    assert!(ok, "uid {uid} `{script}` was refused: {err}");
}

#[track_caller]
fn refused(uid: u32, gid: u32, script: &str, error: &str) {
    let (ok, err) = as_user(uid, gid, script);
    assert!(
        !ok && err.contains(error),
        "uid {uid} `{script}`: expected {error:?}, got success={ok} {err:?}"
    );
}

#[test]
fn posix_permissions_are_enforced_for_other_users() {
    const NOBODY: u32 = 65534;
    const OTHER: u32 = 4242;
    const GROUP: u32 = 4343;
    if !shoal_tests::is_root() {
        eprintln!("skipped: needs root (setpriv, chown)");
        return;
    }
    let c = DevCluster::up_with(3, 76, &["--mount"]);
    // `dev-cluster up --mount` mounts without --allow-other: only root may use those. The
    // users here go through one more mount of node 1 that allows them.
    fs::set_permissions(c.path(), fs::Permissions::from_mode(0o755)).expect("chmod");
    let shared = c.mount_extra(1, &c.path().join("shared"), &["--allow-other"]);
    let s = shared.path.to_str().expect("utf-8").to_owned();
    let m2 = c.mnt(2);
    let chown = |p: &Path, uid: u32, gid: u32| {
        nix::unistd::chown(
            p,
            Some(nix::unistd::Uid::from_raw(uid)),
            Some(nix::unistd::Gid::from_raw(gid)),
        )
        .expect("chown");
    };
    let chmod = |p: &Path, mode: u32| {
        fs::set_permissions(p, fs::Permissions::from_mode(mode)).expect("chmod");
    };
    // Root sets up through node 2's mount; the users work through node 1's.
    let private = m2.join("private");
    fs::create_dir(&private).expect("mkdir");
    chown(&private, NOBODY, NOBODY);
    chmod(&private, 0o700);
    let pubd = m2.join("pub");
    fs::create_dir(&pubd).expect("mkdir");
    write_close(&pubd.join("ro"), b"readable\n");
    chmod(&pubd.join("ro"), 0o644);
    write_close(&pubd.join("mine"), b"root's\n");
    chmod(&pubd.join("mine"), 0o600);
    let group = m2.join("group");
    fs::create_dir(&group).expect("mkdir");
    chown(&group, 0, GROUP);
    chmod(&group, 0o770);

    // The owner of a 0700 directory works in it; its files are the owner's.
    allowed(
        NOBODY,
        NOBODY,
        &format!("echo secret > {s}/private/note && cat {s}/private/note && ls {s}/private"),
    );
    let note = fs::metadata(private.join("note")).expect("stat on node 2");
    assert_eq!((note.uid(), note.gid()), (NOBODY, NOBODY));
    // Everyone else is kept out of it.
    let denied = "Permission denied";
    refused(OTHER, OTHER, &format!("ls {s}/private"), denied);
    refused(OTHER, OTHER, &format!("cat {s}/private/note"), denied);
    refused(OTHER, OTHER, &format!("touch {s}/private/mine"), denied);
    // Read-only and private files of root's, in a directory others may only read.
    allowed(
        OTHER,
        OTHER,
        &format!("test \"$(cat {s}/pub/ro)\" = readable"),
    );
    refused(OTHER, OTHER, &format!("echo x >> {s}/pub/ro"), denied);
    refused(OTHER, OTHER, &format!("cat {s}/pub/mine"), denied);
    refused(OTHER, OTHER, &format!("touch {s}/pub/new"), denied);
    refused(OTHER, OTHER, &format!("rm -f {s}/pub/ro"), denied);
    refused(OTHER, OTHER, &format!("mv {s}/pub/ro {s}/pub/ro2"), denied);
    refused(
        OTHER,
        OTHER,
        &format!("chmod 666 {s}/pub/ro"),
        "Operation not permitted",
    );
    assert_eq!(read(&pubd.join("ro")), b"readable\n", "ro is untouched");
    // Group permissions: a member of the group may write, others may not.
    allowed(
        OTHER,
        GROUP,
        &format!("echo g > {s}/group/f && cat {s}/group/f"),
    );
    refused(NOBODY, NOBODY, &format!("ls {s}/group"), denied);
    // A mode changed on node 2 holds on node 1 (within the attribute TTL).
    chmod(&private, 0o755);
    wait_for(
        Duration::from_secs(5),
        "chmod on node 2 to reach node 1",
        || {
            as_user(OTHER, OTHER, &format!("cat {s}/private/note"))
                .0
                .then_some(())
        },
    );
    refused(OTHER, OTHER, &format!("rm {s}/private/note"), denied);
}

#[test]
fn an_open_after_another_node_replaced_the_file_sees_the_new_one() {
    // The atomic-replace pattern of checkpoint writers: write a temporary file, rename it
    // over the old name. The reader's kernel still maps the name to the old inode for its
    // entry TTL (60 s); close-to-open says an open after the rename's close sees the new
    // file all the same.
    let c = DevCluster::up_with(3, 76, &["--mount"]);
    let (m1, m3) = (c.mnt(1), c.mnt(3));
    for round in 0..5u64 {
        let old = stream_bytes(100 + round, 0, 200_000);
        write_close(&m1.join("f9"), &old);
        assert_bytes_eq(&read(&m3.join("f9")), &old, "the first f9 on node 3");
        let new = stream_bytes(200 + round, 0, 150_000);
        write_close(&m1.join("f11"), &new);
        fs::rename(m1.join("f11"), m1.join("f9")).expect("rename f11 over f9");
        assert_bytes_eq(
            &read(&m3.join("f9")),
            &new,
            &format!("f9 opened on node 3 right after node 1 replaced it (round {round})"),
        );
    }
}

#[test]
fn every_byte_closed_on_one_node_is_read_at_once_on_another() {
    // Close-to-open without a pause: node 3's replica may not have applied the write yet
    // when its kernel looks the name up (answered at once from the replica), and the
    // kernel keeps a file's attributes for the rest of the tick even with a zero TTL; the
    // open's barrier must still decide the size the reader sees. New files and files
    // rewritten in place, inline and striped.
    let c = DevCluster::up_with(3, 77, &["--mount"]);
    let (m1, m3) = (c.mnt(1), c.mnt(3));
    for round in 0..60u64 {
        let len = if round % 3 == 0 {
            200_000
        } else {
            1_000 + 37 * round as usize
        };
        let new = stream_bytes(300 + round, 0, len);
        let name = format!("g{round}");
        write_close(&m1.join(&name), &new);
        assert_bytes_eq(
            &read(&m3.join(&name)),
            &new,
            &format!("new {name} on node 3"),
        );
        let again = stream_bytes(400 + round, 0, len + 4096);
        write_close(&m1.join("same"), &again);
        assert_bytes_eq(
            &read(&m3.join("same")),
            &again,
            &format!("'same' rewritten on node 1, read on node 3 (round {round})"),
        );
    }
}
