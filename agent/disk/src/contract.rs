//! One contract for every [`Disk`]: the same tests run against the real filesystem and
//! the simulated disk. Then what only the simulated disk does: power cuts and crashes.

use std::path::{Path, PathBuf};

use crate::{Disk, OsDisk, SimDisk, SimFault, replace_file};

fn each(test: impl Fn(&dyn Disk, &Path)) {
    let tmp = tempfile::tempdir().expect("tmp");
    test(&OsDisk, tmp.path());
    let sim = SimDisk::new(7);
    let root = PathBuf::from("/sim");
    sim.create_dir_all(&root).expect("mkdir");
    test(&sim, &root);
}

#[test]
fn written_bytes_read_back_and_the_file_grows_with_zeros() {
    each(|disk, dir| {
        let f = disk.create(&dir.join("a")).expect("create");
        f.write_all_at(b"hello", 3).expect("write");
        assert_eq!(f.len().expect("len"), 8);
        assert_eq!(f.read_all().expect("read"), b"\0\0\0hello");
        let mut four = [0u8; 4];
        f.read_exact_at(&mut four, 4).expect("read");
        assert_eq!(&four, b"ello");
        assert!(f.read_exact_at(&mut four, 6).is_err(), "read past the end");
        f.set_len(10).expect("grow");
        assert_eq!(f.read_all().expect("read"), b"\0\0\0hello\0\0");
        f.set_len(4).expect("cut");
        assert_eq!(f.read_all().expect("read"), b"\0\0\0h");
        f.sync().expect("sync");
        let again = disk.open(&dir.join("a"), false).expect("open");
        assert_eq!(again.read_all().expect("read"), b"\0\0\0h");
    });
}

#[test]
fn names_are_created_listed_renamed_and_removed() {
    each(|disk, dir| {
        assert!(disk.open(&dir.join("x"), false).is_err(), "missing file");
        disk.open(&dir.join("x"), true).expect("create by open");
        disk.create_dir_all(&dir.join("sub/deeper")).expect("mkdir");
        let mut names = disk.list(dir).expect("list");
        names.sort();
        assert_eq!(names, ["sub", "x"]);
        replace_file(disk, &dir.join("y"), b"one").expect("replace");
        replace_file(disk, &dir.join("y"), b"two").expect("replace again");
        assert!(!disk.exists(&dir.join("y.tmp")));
        let y = disk.open(&dir.join("y"), false).expect("open");
        assert_eq!(y.read_all().expect("read"), b"two");
        disk.rename(&dir.join("y"), &dir.join("x"))
            .expect("rename over");
        assert!(!disk.exists(&dir.join("y")));
        let x = disk.open(&dir.join("x"), false).expect("open");
        assert_eq!(x.read_all().expect("read"), b"two");
        disk.remove_file(&dir.join("x")).expect("remove");
        assert!(!disk.exists(&dir.join("x")));
        assert!(disk.remove_file(&dir.join("x")).is_err());
        // An open handle still reads a removed file.
        assert_eq!(x.read_all().expect("read"), b"two");
        disk.sync_dir(dir).expect("sync dir");
    });
}

#[test]
fn create_truncates_an_existing_file() {
    each(|disk, dir| {
        let f = disk.create(&dir.join("t")).expect("create");
        f.write_all_at(b"old content", 0).expect("write");
        let g = disk.create(&dir.join("t")).expect("create again");
        assert!(g.is_empty().expect("len"));
    });
}

fn sim() -> (SimDisk, PathBuf) {
    let sim = SimDisk::new(11);
    let root = PathBuf::from("/d");
    sim.create_dir_all(&root).expect("mkdir");
    (sim, root)
}

#[test]
fn a_power_cut_keeps_what_was_synced() {
    let (disk, dir) = sim();
    let f = disk.create(&dir.join("f")).expect("create");
    disk.sync_dir(&dir).expect("sync dir");
    f.write_all_at(&[7u8; 4096], 0).expect("write");
    f.sync().expect("sync");
    disk.power_cut();
    let f = disk.open(&dir.join("f"), false).expect("still there");
    assert_eq!(f.read_all().expect("read"), vec![7u8; 4096]);
}

#[test]
fn a_power_cut_loses_or_tears_what_was_not_synced_and_nothing_else() {
    let mut torn = 0;
    let mut lost = 0;
    for seed in 0..64 {
        let disk = SimDisk::new(seed);
        let dir = PathBuf::from("/d");
        disk.create_dir_all(&dir).expect("mkdir");
        let f = disk.create(&dir.join("f")).expect("create");
        disk.sync_dir(&dir).expect("sync dir");
        f.write_all_at(&[1u8; 2048], 0).expect("write");
        f.sync().expect("sync");
        f.write_all_at(&[2u8; 2048], 2048).expect("unsynced write");
        disk.power_cut();
        let bytes = disk
            .open(&dir.join("f"), false)
            .expect("open")
            .read_all()
            .expect("read");
        assert_eq!(&bytes[..2048], &[1u8; 2048][..], "synced bytes kept");
        let tail = &bytes[2048..];
        // Whole sectors of the new write, or zeros where a sector never reached the disk.
        for sector in tail.chunks(512) {
            assert!(
                sector.iter().all(|&b| b == 2) || sector.iter().all(|&b| b == 0),
                "seed {seed}: a sector is the write's or nothing"
            );
        }
        if bytes.len() == 2048 {
            lost += 1;
        } else if tail.contains(&0) || tail.len() < 2048 {
            torn += 1;
        }
    }
    assert!(lost > 0 && torn > 0, "lost {lost}, torn {torn} of 64 seeds");
}

#[test]
fn a_power_cut_forgets_entries_of_unsynced_directories() {
    let (disk, dir) = sim();
    let kept = disk.create(&dir.join("kept")).expect("create");
    kept.sync().expect("sync");
    disk.sync_dir(&dir).expect("sync dir");
    let gone = disk.create(&dir.join("gone")).expect("create");
    gone.write_all_at(b"data", 0).expect("write");
    gone.sync().expect("file synced, its entry not");
    disk.rename(&dir.join("kept"), &dir.join("renamed"))
        .expect("rename");
    disk.power_cut();
    assert!(disk.exists(&dir.join("kept")), "the rename was not durable");
    assert!(!disk.exists(&dir.join("renamed")));
    assert!(!disk.exists(&dir.join("gone")));
}

#[test]
fn handles_from_before_a_crash_are_fenced_and_a_crash_loses_nothing() {
    let (disk, dir) = sim();
    let f = disk.create(&dir.join("f")).expect("create");
    f.write_all_at(b"page cache", 0).expect("write");
    disk.crash();
    assert!(f.write_all_at(b"late", 0).is_err(), "fenced");
    assert!(f.sync().is_err(), "fenced");
    let again = disk.open(&dir.join("f"), false).expect("still named");
    assert_eq!(again.read_all().expect("read"), b"page cache");
}

#[test]
fn injected_faults_fail_writes_until_cleared() {
    let (disk, dir) = sim();
    let f = disk.create(&dir.join("f")).expect("create");
    disk.set_fault(Some(SimFault::Eio));
    assert!(f.write_all_at(b"x", 0).is_err());
    assert!(f.sync().is_err());
    disk.set_fault(Some(SimFault::FullAt(10)));
    f.write_all_at(b"0123456789", 0).expect("fits");
    let full = f.write_all_at(b"more", 10).expect_err("full");
    assert_eq!(full.kind(), std::io::ErrorKind::StorageFull);
    f.write_all_at(b"over", 0)
        .expect("an overwrite takes no room");
    disk.set_fault(None);
    f.write_all_at(b"more", 10).expect("room again");
}

#[test]
fn redb_commits_on_the_simulated_disk_survive_a_power_cut() {
    use redb::{Database, Durability, ReadableDatabase, TableDefinition};
    const T: TableDefinition<u64, u64> = TableDefinition::new("t");
    for seed in 0..16 {
        let disk = SimDisk::new(seed);
        let dir = PathBuf::from("/r");
        disk.create_dir_all(&dir).expect("mkdir");
        let open = || {
            let file = disk.open(&dir.join("db"), true).expect("open");
            Database::builder()
                .create_with_backend(crate::RedbFile(file))
                .expect("redb")
        };
        disk.sync_dir(&dir).ok();
        let db = open();
        disk.sync_dir(&dir).expect("sync dir");
        for i in 0..20u64 {
            let mut tx = db.begin_write().expect("tx");
            if i >= 10 {
                tx.set_durability(Durability::None).expect("durability");
            }
            tx.open_table(T)
                .expect("table")
                .insert(i, i * 2)
                .expect("insert");
            tx.commit().expect("commit");
        }
        disk.power_cut();
        drop(db);
        let db = open();
        let read = db.begin_read().expect("read");
        let t = read.open_table(T).expect("table");
        for i in 0..10u64 {
            let v = t.get(i).expect("get").map(|v| v.value());
            assert_eq!(v, Some(i * 2), "seed {seed}: durable commit {i}");
        }
    }
}

#[test]
fn writes_a_failed_sync_dropped_are_read_until_the_cache_is_forgotten() {
    let (disk, dir) = sim();
    let f = disk.create(&dir.join("f")).expect("create");
    disk.sync_dir(&dir).expect("sync dir");
    f.write_all_at(b"durable", 0).expect("write");
    f.sync().expect("sync");
    f.write_all_at(b"LOST", 0).expect("write");
    disk.set_fault(Some(SimFault::Eio));
    assert!(f.sync().is_err());
    disk.set_fault(None);
    assert_eq!(
        f.read_all().expect("read"),
        b"LOSTble",
        "the cache still has them"
    );
    f.sync().expect("nothing left to write");
    f.forget_cached().expect("forget");
    assert_eq!(
        f.read_all().expect("read"),
        b"durable",
        "the disk never got them"
    );
}

#[test]
fn forgetting_the_cache_keeps_what_is_not_yet_synced() {
    each(|disk, dir| {
        let f = disk.create(&dir.join("c")).expect("create");
        f.write_all_at(b"dirty", 0).expect("write");
        f.forget_cached().expect("forget");
        assert_eq!(f.read_all().expect("read"), b"dirty");
    });
}
