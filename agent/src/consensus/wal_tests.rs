use std::ops::Bound;

use std::sync::Arc;

use shoal_disk::{Disk, OsDisk};

use super::{Key, MAGIC, Wal};

fn os() -> Arc<dyn Disk> {
    Arc::new(OsDisk)
}

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
    let wal = Wal::open_with(os(), dir.path(), 100).expect("open");
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
        let wal = Wal::open(os(), dir.path()).expect("open");
        assert!(all(&wal).is_empty());
        assert_eq!(wal.last().expect("last"), None);
        wal.append(&entries(1..4), true).expect("append");
        wal.append(&entries(4..6), false).expect("append");
        wal.set(Key::Vote, b"vote 1", true).expect("vote");
        wal.set(Key::Committed, b"c 3", false).expect("committed");
        assert_eq!(all(&wal), names(1..6));
    }
    let wal = Wal::open(os(), dir.path()).expect("reopen");
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
        let wal = Wal::open(os(), dir.path()).expect("open");
        wal.append(&entries(1..10), true).expect("append");
        wal.truncate(5).expect("truncate");
        assert_eq!(all(&wal), names(1..5));
        wal.append(&[(5, b"other 5".to_vec())], true)
            .expect("append");
    }
    let wal = Wal::open(os(), dir.path()).expect("reopen");
    let mut want = names(1..5);
    want.push("other 5".into());
    assert_eq!(all(&wal), want);
}

#[test]
fn a_purge_drops_entries_and_old_segments_but_keeps_the_state() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        // Segments of about 100 bytes: nearly one per append.
        let wal = Wal::open_with(os(), dir.path(), 100).expect("open");
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
    let wal = Wal::open_with(os(), dir.path(), 100).expect("reopen");
    assert_eq!(all(&wal), names(16..20));
    assert_eq!(wal.purged(), Some(b"purged 15".to_vec()));
    assert_eq!(wal.get(Key::Vote), Some(b"vote 7".to_vec()));
    // Purged to the end: the log is empty, its purge point kept.
    wal.purge(19, b"purged 19").expect("purge");
    drop(wal);
    let wal = Wal::open_with(os(), dir.path(), 100).expect("reopen");
    assert!(all(&wal).is_empty());
    assert_eq!(wal.purged(), Some(b"purged 19".to_vec()));
    assert_eq!(wal.get(Key::Vote), Some(b"vote 7".to_vec()));
}

#[test]
fn a_record_cut_short_at_the_end_is_dropped_and_the_log_goes_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let wal = Wal::open(os(), dir.path()).expect("open");
        wal.append(&entries(1..4), true).expect("append");
    }
    // A crash in the middle of the last record's write.
    cut_last_segment(dir.path(), 3);
    {
        let wal = Wal::open(os(), dir.path()).expect("reopen");
        assert_eq!(all(&wal), names(1..3));
        wal.append(&entries(3..5), true)
            .expect("append after the cut");
    }
    let wal = Wal::open(os(), dir.path()).expect("reopen");
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
    let err = Wal::open_with(os(), dir.path(), 100)
        .err()
        .expect("refused");
    assert!(err.to_string().contains("damaged record"), "{err}");
}

#[test]
fn a_file_that_is_not_a_segment_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    drop(Wal::open(os(), dir.path()).expect("open"));
    let seg = segments(dir.path()).pop().expect("a segment");
    let mut bytes = std::fs::read(&seg).expect("read");
    assert!(bytes.starts_with(MAGIC));
    bytes[0] = b'X';
    std::fs::write(&seg, &bytes).expect("write");
    assert!(Wal::open(os(), dir.path()).is_err());
}

#[test]
fn a_segment_whose_start_was_never_renamed_is_ignored() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let wal = Wal::open(os(), dir.path()).expect("open");
        wal.append(&entries(1..3), true).expect("append");
    }
    std::fs::write(dir.path().join("0000000000000002.wal.tmp"), b"shoal").expect("write");
    let wal = Wal::open(os(), dir.path()).expect("reopen");
    assert_eq!(all(&wal), names(1..3));
    assert!(!dir.path().join("0000000000000002.wal.tmp").exists());
}

/// An entry written again without a truncation lands in a newer segment than the
/// entries after it: those must not be deleted with the older segment.
#[test]
fn an_entry_written_again_keeps_the_segment_of_the_entries_after_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let wal = Wal::open_with(os(), dir.path(), 100).expect("open");
        wal.append(&entries(1..5), true).expect("append");
        wal.append(&entries(5..6), true).expect("append");
        wal.append(&[(1, b"entry 1".to_vec())], true)
            .expect("again");
        wal.purge(0, b"purged 0").expect("purge");
        assert_eq!(all(&wal), names(1..6));
    }
    let wal = Wal::open_with(os(), dir.path(), 100).expect("reopen");
    assert_eq!(all(&wal), names(1..6));
}

/// Damage at any byte of a segment: the open either replays what comes before it or
/// refuses, and never panics.
#[test]
fn damage_anywhere_in_a_segment_is_found_without_a_panic() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let wal = Wal::open(os(), dir.path()).expect("open");
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
            if let Ok(wal) = Wal::open(os(), dir.path()) {
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
        let wal = Wal::open(os(), dir.path()).expect("open");
        wal.append(&big(1..10), true).expect("append");
    }
    let seg = segments(dir.path()).pop().expect("a segment");
    let mut bytes = std::fs::read(&seg).expect("read");
    // A flipped bit in the third entry's body: bit rot, not an interrupted append.
    bytes[MAGIC.len() + 2 * (super::HEADER + 8 + 1000) + super::HEADER + 8 + 500] ^= 4;
    std::fs::write(&seg, &bytes).expect("write");
    let err = Wal::open(os(), dir.path()).err().expect("refused");
    assert!(err.to_string().contains("inside the last segment"), "{err}");
}

#[test]
fn a_page_never_written_back_ends_the_last_segment_there() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let wal = Wal::open(os(), dir.path()).expect("open");
        wal.append(&big(1..10), true).expect("append");
    }
    let seg = segments(dir.path()).pop().expect("a segment");
    let mut bytes = std::fs::read(&seg).expect("read");
    // The second 4 KiB page reads as zeros. Records are 1,025 bytes after the 8-byte
    // magic: entries 1 to 3 lie in the first page, entry 4 runs into the second.
    bytes[4096..8192].fill(0);
    std::fs::write(&seg, &bytes).expect("write");
    {
        let wal = Wal::open(os(), dir.path()).expect("reopen");
        let got = wal.read(Bound::Unbounded, Bound::Unbounded).expect("read");
        assert_eq!(got.len(), 3, "entries 1 to 3 lie in the first page");
        // The log goes on from there, and the cut is durable.
        wal.append(&big(4..7), true).expect("append");
    }
    let wal = Wal::open(os(), dir.path()).expect("reopen");
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
    let wal = Wal::open_with(os(), dir.path(), 100).expect("reopen");
    assert_eq!(all(&wal), names(1..11));
}

/// A truncation and the entries that replaced it span a roll; a purge then deletes
/// segments: nothing truncated comes back at the next start.
#[test]
fn truncated_entries_stay_gone_across_rolls_and_purges() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let wal = Wal::open_with(os(), dir.path(), 100).expect("open");
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
    let wal = Wal::open_with(os(), dir.path(), 100).expect("reopen");
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
    let wal = Wal::open_with(os(), dir.path(), 100).expect("reopen");
    assert!(!segs[0].exists(), "the segment before the gap is gone");
    let got = all(&wal);
    assert_eq!(got.last().map(String::as_str), Some("entry 11"));
    assert!(!got.contains(&"entry 1".to_string()), "{got:?}");
}

#[test]
fn an_entry_over_the_record_limit_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let wal = Wal::open(os(), dir.path()).expect("open");
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
    let wal = std::sync::Arc::new(Wal::open_with(os(), dir.path(), 300).expect("open"));
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
    // The last purge was at 1950: only the segments holding 1951 to 1999 (about 1.7 KB
    // in 300-byte segments) are left, and they replay to exactly that.
    let left = segments(dir.path());
    assert!(left.len() <= 8, "{left:?}");
    drop(wal);
    let wal = Wal::open_with(os(), dir.path(), 300).expect("reopen");
    assert_eq!(all(&wal), names(1951..2000));
}

/// An entry of 8 KiB of zeros (an inline write of a zero-filled file) holds whole zero
/// sectors, the shape of a write never made. Once a later record says the segment was
/// synced past it, a flipped bit in it is damage, and the start is refused, not cut.
#[test]
fn a_flipped_bit_in_a_synced_record_with_zero_sectors_refuses_the_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let wal = Wal::open(os(), dir.path()).expect("open");
        wal.append(&[(1, vec![0u8; 8192])], true).expect("append");
        wal.append(&entries(2..3), true).expect("append");
    }
    let seg = segments(dir.path()).pop().expect("a segment");
    let good = std::fs::read(&seg).expect("read");
    let first = good
        .windows(8)
        .position(|w| w == 1u64.to_le_bytes())
        .expect("entry 1's index");
    let mut bad = good.clone();
    bad[first + 100] ^= 0x10;
    std::fs::write(&seg, &bad).expect("write");
    let err = Wal::open(os(), dir.path()).err().expect("refused");
    assert!(err.to_string().contains("says it was synced"), "{err}");
    // The same record as the last one: nothing tells damage from a crash, it is cut.
    std::fs::write(&seg, &bad[..bad.len() - (super::HEADER + 8 + 7)]).expect("write");
    let wal = Wal::open(os(), dir.path()).expect("cut");
    assert!(all(&wal).is_empty());
}

/// A segment of the previous format is read, and new records go to a new segment.
#[test]
fn a_segment_of_the_previous_format_is_read_and_left_for_a_new_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut old = super::MAGIC_V1.to_vec();
    for (index, bytes) in entries(1..4) {
        let mut body = index.to_le_bytes().to_vec();
        body.extend_from_slice(&bytes);
        let crc = crc32c::crc32c_append(crc32c::crc32c(&[super::ENTRY]), &body);
        old.extend_from_slice(&(body.len() as u32).to_le_bytes());
        old.extend_from_slice(&crc.to_le_bytes());
        old.push(super::ENTRY);
        old.extend_from_slice(&body);
    }
    std::fs::write(dir.path().join("0000000000000001.wal"), &old).expect("write");
    {
        let wal = Wal::open(os(), dir.path()).expect("open");
        assert_eq!(all(&wal), names(1..4));
        wal.append(&entries(4..6), true).expect("append");
    }
    assert_eq!(segments(dir.path()).len(), 2);
    let wal = Wal::open(os(), dir.path()).expect("reopen");
    assert_eq!(all(&wal), names(1..6));
}

/// The log on a simulated disk, with power cuts at random points of random work: every
/// open succeeds, and what it replays is the log as some operation left it, no earlier
/// than the last synced one (nothing synced is lost, nothing half-applied appears).
#[test]
fn power_cuts_lose_only_what_was_not_synced() {
    use shoal_disk::SimDisk;
    use std::collections::BTreeMap;

    #[derive(Clone, Debug, PartialEq, Default)]
    struct Model {
        entries: BTreeMap<u64, Vec<u8>>,
        purged: Option<Vec<u8>>,
        vote: Option<Vec<u8>>,
    }
    let mut rng = shoal_disk::SplitMix64(0x5eed);
    let mut next = move || rng.next_u64();
    let dir = std::path::Path::new("/log");
    let mut cuts = 0;
    for seed in 0..60u64 {
        let disk = SimDisk::new(seed);
        let open = || Wal::open_with(Arc::new(disk.clone()), dir, 2048).expect("open after a cut");
        let read = |wal: &Wal| Model {
            entries: wal
                .read(Bound::Unbounded, Bound::Unbounded)
                .expect("read")
                .into_iter()
                .map(|b| (u64::from_le_bytes(b[..8].try_into().expect("index")), b))
                .collect(),
            purged: wal.purged(),
            vote: wal.get(Key::Vote),
        };
        let mut wal = open();
        let mut model = Model::default();
        // The states since the last sync: a power cut leaves one of them.
        let mut since_sync = vec![model.clone()];
        for step in 0..300u64 {
            let roll = next() % 100;
            let synced;
            if roll < 70 {
                let first = model.entries.keys().next_back().map_or(1, |l| l + 1);
                let n = 1 + next() % 3;
                let batch: Vec<(u64, Vec<u8>)> = (first..first + n)
                    .map(|i| {
                        let mut b = i.to_le_bytes().to_vec();
                        let len = (next() % 1500) as usize;
                        let fill = if next() % 3 == 0 {
                            0
                        } else {
                            (i % 251) as u8 + 1
                        };
                        b.resize(8 + len, fill);
                        (i, b)
                    })
                    .collect();
                synced = next() % 2 == 0;
                wal.append(&batch, synced).expect("append");
                // Each entry is a record of its own: a cut may keep part of a batch.
                for entry in batch {
                    model.entries.insert(entry.0, entry.1);
                    since_sync.push(model.clone());
                }
            } else if roll < 78 && model.entries.len() > 2 {
                let last = *model.entries.keys().next_back().expect("last");
                let from = last - next() % 2;
                wal.truncate(from).expect("truncate");
                model.entries.split_off(&from);
                synced = true;
            } else if roll < 85 && model.entries.len() > 4 {
                let first = *model.entries.keys().next().expect("first");
                let upto = first + next() % 3;
                let value = format!("purged {upto}").into_bytes();
                wal.purge(upto, &value).expect("purge");
                model.entries = model.entries.split_off(&(upto + 1));
                model.purged = Some(value);
                synced = true;
            } else if roll < 92 {
                let vote = format!("vote {step}").into_bytes();
                wal.set(Key::Vote, &vote, true).expect("vote");
                model.vote = Some(vote);
                synced = true;
            } else {
                cuts += 1;
                drop(wal);
                disk.power_cut();
                wal = open();
                let got = read(&wal);
                let brief = |m: &Model| {
                    let keys: Vec<u64> = m.entries.keys().copied().collect();
                    format!(
                        "{keys:?} purged {:?} vote {:?}",
                        m.purged
                            .as_ref()
                            .map(|p| String::from_utf8_lossy(p).into_owned()),
                        m.vote
                            .as_ref()
                            .map(|p| String::from_utf8_lossy(p).into_owned())
                    )
                };
                assert!(
                    since_sync.contains(&got),
                    "seed {seed} step {step}: the log after a power cut is no state it was \
                     left in since its last sync:\n got {}\n states {:#?}",
                    brief(&got),
                    since_sync.iter().map(brief).collect::<Vec<_>>()
                );
                model = got;
                since_sync = vec![model.clone()];
                continue;
            }
            if synced {
                since_sync.clear();
            }
            since_sync.push(model.clone());
        }
    }
    assert!(cuts > 100, "{cuts} power cuts");
}

/// The log says before a write whether that write starts a new segment (the log store
/// keeps such a write off the Raft core's task).
#[test]
fn the_log_says_which_write_starts_a_new_segment() {
    let dir = tempfile::tempdir().expect("tempdir");
    let wal = Wal::open_with(os(), dir.path(), 100).expect("open");
    assert!(!wal.rolls_next(), "a new segment has room");
    let before = segments(dir.path()).len();
    wal.append(&entries(1..5), false).expect("append");
    assert!(wal.rolls_next(), "past the limit: the next write rolls");
    wal.append(&entries(5..6), false).expect("append");
    assert_eq!(segments(dir.path()).len(), before + 1);
    assert!(!wal.rolls_next());
}

/// A flipped bit in a synced record's length (which its own header checksum covers) is
/// damage, found by a later record that vouches for it from anywhere after it.
#[test]
fn a_flipped_bit_in_a_synced_records_length_refuses_the_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let wal = Wal::open(os(), dir.path()).expect("open");
        wal.append(&entries(1..2), true).expect("append");
        wal.append(&entries(2..3), true).expect("append");
        wal.set(Key::Vote, b"vote 9", true).expect("vote");
    }
    let seg = segments(dir.path()).pop().expect("a segment");
    let mut bytes = std::fs::read(&seg).expect("read");
    // The first record's length: its end now lies past the end of the file.
    bytes[MAGIC.len() + 3] ^= 0x40;
    std::fs::write(&seg, &bytes).expect("write");
    let err = Wal::open(os(), dir.path()).err().expect("refused, not cut");
    assert!(err.to_string().contains("says it was synced"), "{err}");
}

/// After a sync failed (EIO), the records it could not write are gone from the disk but
/// still in the page cache; the agent restarts. The log is read from the disk, so a later
/// synced record never vouches for bytes the disk does not have, and a power cut after
/// that leaves a log that opens.
#[test]
fn a_log_reopened_after_a_failed_sync_reads_what_the_disk_has() {
    use shoal_disk::{SimDisk, SimFault};
    let disk = SimDisk::new(3);
    let dir = std::path::Path::new("/log");
    let open = || Wal::open(Arc::new(disk.clone()), dir).expect("open");
    {
        let wal = open();
        wal.append(&entries(1..3), true).expect("append");
        disk.set_fault(Some(SimFault::Eio));
        assert!(wal.append(&entries(3..4), true).is_err(), "EIO");
        disk.set_fault(None);
    }
    disk.crash();
    {
        let wal = open();
        assert_eq!(all(&wal), names(1..3), "entry 3 never reached the disk");
        wal.append(&entries(3..6), true).expect("append");
    }
    disk.power_cut();
    let wal = open();
    assert_eq!(all(&wal), names(1..6));
}
