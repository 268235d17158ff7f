use std::ops::Bound;

use super::{Key, MAGIC, Wal};

fn entries(range: std::ops::Range<u64>) -> Vec<(u64, Vec<u8>)> {
    range
        .map(|i| (i, format!("entry {i}").into_bytes()))
        .collect()
}

fn all(wal: &Wal) -> Vec<String> {
    wal.read(Bound::Unbounded, Bound::Unbounded)
        .expect("read")
        .into_iter()
        .map(|b| String::from_utf8(b).expect("utf8"))
        .collect()
}

fn names(range: std::ops::Range<u64>) -> Vec<String> {
    range.map(|i| format!("entry {i}")).collect()
}

/// A log of entries 1 to 11, one append each, in segments of about 100 bytes (4 entries).
fn eleven_entries_in_small_segments() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let wal = Wal::open_with(dir.path(), 100).expect("open");
    for i in 1..12 {
        wal.append(&entries(i..i + 1), true).expect("append");
    }
    dir
}

/// Drops the last `bytes` bytes of the newest segment.
fn cut_last_segment(dir: &std::path::Path, bytes: u64) {
    let seg = segments(dir).pop().expect("a segment");
    let len = std::fs::metadata(&seg).expect("stat").len();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&seg)
        .expect("open");
    f.set_len(len - bytes).expect("cut");
}

fn segments(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out: Vec<_> = std::fs::read_dir(dir)
        .expect("list")
        .map(|e| e.expect("entry").path())
        .collect();
    out.sort();
    out
}

#[test]
fn entries_and_state_come_back_after_a_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let wal = Wal::open(dir.path()).expect("open");
        assert!(all(&wal).is_empty());
        assert_eq!(wal.last().expect("last"), None);
        wal.append(&entries(1..4), true).expect("append");
        wal.append(&entries(4..6), false).expect("append");
        wal.set(Key::Vote, b"vote 1", true).expect("vote");
        wal.set(Key::Committed, b"c 3", false).expect("committed");
        assert_eq!(all(&wal), names(1..6));
    }
    let wal = Wal::open(dir.path()).expect("reopen");
    assert_eq!(all(&wal), names(1..6));
    assert_eq!(
        wal.read(Bound::Included(2), Bound::Excluded(4))
            .expect("read"),
        vec![b"entry 2".to_vec(), b"entry 3".to_vec()]
    );
    assert_eq!(wal.last().expect("last"), Some(b"entry 5".to_vec()));
    assert_eq!(wal.get(Key::Vote), Some(b"vote 1".to_vec()));
    assert_eq!(wal.get(Key::Committed), Some(b"c 3".to_vec()));
    assert_eq!(wal.purged(), None);
}

#[test]
fn a_truncation_and_what_replaced_it_survive_a_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let wal = Wal::open(dir.path()).expect("open");
        wal.append(&entries(1..10), true).expect("append");
        wal.truncate(5).expect("truncate");
        assert_eq!(all(&wal), names(1..5));
        wal.append(&[(5, b"other 5".to_vec())], true)
            .expect("append");
    }
    let wal = Wal::open(dir.path()).expect("reopen");
    let mut want = names(1..5);
    want.push("other 5".into());
    assert_eq!(all(&wal), want);
}

#[test]
fn a_purge_drops_entries_and_old_segments_but_keeps_the_state() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        // Segments of about 100 bytes: nearly one per append.
        let wal = Wal::open_with(dir.path(), 100).expect("open");
        wal.set(Key::Vote, b"vote 7", true).expect("vote");
        for i in 1..20 {
            wal.append(&entries(i..i + 1), true).expect("append");
        }
        assert!(
            segments(dir.path()).len() >= 4,
            "{:?}",
            segments(dir.path())
        );
        wal.purge(15, b"purged 15").expect("purge");
        assert_eq!(all(&wal), names(16..20));
        assert!(wal.segment_count() <= 3, "{}", wal.segment_count());
        assert_eq!(segments(dir.path()).len(), wal.segment_count());
    }
    let wal = Wal::open_with(dir.path(), 100).expect("reopen");
    assert_eq!(all(&wal), names(16..20));
    assert_eq!(wal.purged(), Some(b"purged 15".to_vec()));
    assert_eq!(wal.get(Key::Vote), Some(b"vote 7".to_vec()));
    // Purged to the end: the log is empty, its purge point kept.
    wal.purge(19, b"purged 19").expect("purge");
    drop(wal);
    let wal = Wal::open_with(dir.path(), 100).expect("reopen");
    assert!(all(&wal).is_empty());
    assert_eq!(wal.purged(), Some(b"purged 19".to_vec()));
    assert_eq!(wal.get(Key::Vote), Some(b"vote 7".to_vec()));
}

#[test]
fn a_record_cut_short_at_the_end_is_dropped_and_the_log_goes_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let wal = Wal::open(dir.path()).expect("open");
        wal.append(&entries(1..4), true).expect("append");
    }
    // A crash in the middle of the last record's write.
    cut_last_segment(dir.path(), 3);
    {
        let wal = Wal::open(dir.path()).expect("reopen");
        assert_eq!(all(&wal), names(1..3));
        wal.append(&entries(3..5), true)
            .expect("append after the cut");
    }
    let wal = Wal::open(dir.path()).expect("reopen");
    assert_eq!(all(&wal), names(1..5));
}

#[test]
fn damage_before_the_last_segment_refuses_the_start() {
    let dir = eleven_entries_in_small_segments();
    let segs = segments(dir.path());
    assert!(segs.len() >= 3, "{segs:?}");
    // A flipped bit in an older segment's record: an error, never skipped.
    let mut bytes = std::fs::read(&segs[0]).expect("read");
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&segs[0], &bytes).expect("write");
    let err = Wal::open_with(dir.path(), 100).err().expect("refused");
    assert!(err.to_string().contains("damaged record"), "{err}");
}

#[test]
fn a_file_that_is_not_a_segment_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    drop(Wal::open(dir.path()).expect("open"));
    let seg = segments(dir.path()).pop().expect("a segment");
    let mut bytes = std::fs::read(&seg).expect("read");
    assert!(bytes.starts_with(MAGIC));
    bytes[0] = b'X';
    std::fs::write(&seg, &bytes).expect("write");
    assert!(Wal::open(dir.path()).is_err());
}

#[test]
fn a_segment_whose_start_was_never_renamed_is_ignored() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let wal = Wal::open(dir.path()).expect("open");
        wal.append(&entries(1..3), true).expect("append");
    }
    std::fs::write(dir.path().join("0000000000000002.wal.tmp"), b"shoal").expect("write");
    let wal = Wal::open(dir.path()).expect("reopen");
    assert_eq!(all(&wal), names(1..3));
    assert!(!dir.path().join("0000000000000002.wal.tmp").exists());
}

/// An entry written again without a truncation lands in a newer segment than the
/// entries after it: those must not be deleted with the older segment.
#[test]
fn an_entry_written_again_keeps_the_segment_of_the_entries_after_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let wal = Wal::open_with(dir.path(), 100).expect("open");
        wal.append(&entries(1..5), true).expect("append");
        wal.append(&entries(5..6), true).expect("append");
        wal.append(&[(1, b"entry 1".to_vec())], true)
            .expect("again");
        wal.purge(0, b"purged 0").expect("purge");
        assert_eq!(all(&wal), names(1..6));
    }
    let wal = Wal::open_with(dir.path(), 100).expect("reopen");
    assert_eq!(all(&wal), names(1..6));
}

/// Damage at any byte of a segment: the open either replays what comes before it or
/// refuses, and never panics.
#[test]
fn damage_anywhere_in_a_segment_is_found_without_a_panic() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let wal = Wal::open(dir.path()).expect("open");
        wal.set(Key::Vote, b"vote", true).expect("vote");
        wal.append(&entries(1..4), true).expect("append");
        wal.truncate(3).expect("truncate");
        wal.purge(1, b"p").expect("purge");
    }
    let seg = segments(dir.path()).pop().expect("a segment");
    let good = std::fs::read(&seg).expect("read");
    for at in 0..good.len() {
        for flip in [0x01u8, 0x80, 0xff] {
            let mut bad = good.clone();
            bad[at] ^= flip;
            std::fs::write(&seg, &bad).expect("write");
            if let Ok(wal) = Wal::open(dir.path()) {
                // What replayed is the records before the damage, each whole.
                let got = all(&wal);
                assert!(
                    got.iter().all(|e| names(1..4).contains(e)),
                    "damage at {at}: {got:?}"
                );
            }
        }
    }
}

/// Bytes of `n` entries of about 1 KiB each, so that a few pages hold them.
fn big(range: std::ops::Range<u64>) -> Vec<(u64, Vec<u8>)> {
    range
        .map(|i| (i, vec![b'a' + (i % 26) as u8; 1000]))
        .collect()
}

#[test]
fn a_written_record_failing_its_checksum_refuses_the_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let wal = Wal::open(dir.path()).expect("open");
        wal.append(&big(1..10), true).expect("append");
    }
    let seg = segments(dir.path()).pop().expect("a segment");
    let mut bytes = std::fs::read(&seg).expect("read");
    // A flipped bit in the third entry's body: bit rot, not an interrupted append.
    bytes[MAGIC.len() + 2 * (9 + 8 + 1000) + 9 + 8 + 500] ^= 4;
    std::fs::write(&seg, &bytes).expect("write");
    let err = Wal::open(dir.path()).err().expect("refused");
    assert!(err.to_string().contains("inside the last segment"), "{err}");
}

#[test]
fn a_page_never_written_back_ends_the_last_segment_there() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let wal = Wal::open(dir.path()).expect("open");
        wal.append(&big(1..10), true).expect("append");
    }
    let seg = segments(dir.path()).pop().expect("a segment");
    let mut bytes = std::fs::read(&seg).expect("read");
    // The second 4 KiB page reads as zeros. Records are 1,017 bytes after the 8-byte
    // magic: entries 1 to 4 lie in the first page, entry 5 runs into the second.
    bytes[4096..8192].fill(0);
    std::fs::write(&seg, &bytes).expect("write");
    {
        let wal = Wal::open(dir.path()).expect("reopen");
        let got = wal.read(Bound::Unbounded, Bound::Unbounded).expect("read");
        assert_eq!(got.len(), 4, "entries 1 to 4 lie in the first page");
        // The log goes on from there, and the cut is durable.
        wal.append(&big(5..7), true).expect("append");
    }
    let wal = Wal::open(dir.path()).expect("reopen");
    let got = wal.read(Bound::Unbounded, Bound::Unbounded).expect("read");
    assert_eq!(
        got,
        big(1..7).into_iter().map(|(_, b)| b).collect::<Vec<_>>()
    );
}

#[test]
fn a_cut_tail_after_older_segments_keeps_them() {
    let dir = eleven_entries_in_small_segments();
    cut_last_segment(dir.path(), 2);
    let wal = Wal::open_with(dir.path(), 100).expect("reopen");
    assert_eq!(all(&wal), names(1..11));
}

/// A truncation and the entries that replaced it span a roll; a purge then deletes
/// segments: nothing truncated comes back at the next start.
#[test]
fn truncated_entries_stay_gone_across_rolls_and_purges() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let wal = Wal::open_with(dir.path(), 100).expect("open");
        for i in 1..10 {
            wal.append(&entries(i..i + 1), true).expect("append");
        }
        wal.truncate(4).expect("truncate");
        for i in 4..8 {
            wal.append(&[(i, format!("other {i}").into_bytes())], true)
                .expect("append");
        }
        wal.purge(5, b"p5").expect("purge");
    }
    let wal = Wal::open_with(dir.path(), 100).expect("reopen");
    assert_eq!(all(&wal), vec!["other 6".to_string(), "other 7".into()]);
    assert_eq!(wal.purged(), Some(b"p5".to_vec()));
}

/// Segments are deleted oldest first; one left before a gap is deleted at the start.
#[test]
fn a_segment_left_before_a_gap_is_deleted() {
    let dir = eleven_entries_in_small_segments();
    let segs = segments(dir.path());
    assert!(segs.len() >= 3, "{segs:?}");
    // The second segment's deletion was durable, the first's was not.
    std::fs::remove_file(&segs[1]).expect("remove");
    let wal = Wal::open_with(dir.path(), 100).expect("reopen");
    assert!(!segs[0].exists(), "the segment before the gap is gone");
    let got = all(&wal);
    assert_eq!(got.last().map(String::as_str), Some("entry 11"));
    assert!(!got.contains(&"entry 1".to_string()), "{got:?}");
}

#[test]
fn an_entry_over_the_record_limit_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let wal = Wal::open(dir.path()).expect("open");
    let huge = vec![0u8; super::MAX_BODY as usize];
    let err = wal.append(&[(1, huge)], true).expect_err("refused");
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    assert!(all(&wal).is_empty());
}

/// Replication reads while the log appends, rolls and purges: a reader gets whole
/// entries, in order, even from a segment deleted after it looked the entries up.
#[test]
fn readers_get_whole_entries_while_purges_delete_segments() {
    let dir = tempfile::tempdir().expect("tempdir");
    let wal = std::sync::Arc::new(Wal::open_with(dir.path(), 300).expect("open"));
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (wal, done) = (wal.clone(), done.clone());
        std::thread::spawn(move || {
            let mut reads = 0u32;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let got = all(&wal);
                let numbers: Vec<u64> = got
                    .iter()
                    .map(|e| {
                        e.strip_prefix("entry ")
                            .and_then(|n| n.parse().ok())
                            .unwrap_or_else(|| panic!("not a whole entry: {e:?}"))
                    })
                    .collect();
                assert!(
                    numbers.windows(2).all(|w| w[1] == w[0] + 1),
                    "a gap or a reordering: {numbers:?}"
                );
                reads += 1;
            }
            reads
        })
    };
    for i in 1..2000u64 {
        wal.append(&entries(i..i + 1), false).expect("append");
        if i % 40 == 0 {
            wal.purge(i - 10, b"p").expect("purge");
        }
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let reads = reader.join().expect("the reader saw only whole entries");
    assert!(reads > 0);
    // The last purge was at 1950: only the segments holding 1951 to 1999 (about 1.3 KB
    // in 300-byte segments) are left, and they replay to exactly that.
    let left = segments(dir.path());
    assert!(left.len() <= 6, "{left:?}");
    drop(wal);
    let wal = Wal::open_with(dir.path(), 300).expect("reopen");
    assert_eq!(all(&wal), names(1951..2000));
}
