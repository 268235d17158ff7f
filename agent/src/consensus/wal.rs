//! The Raft log's files: records appended to segment files in `meta/log/`, one
//! `fdatasync` per synced append.
//!
//! A durable redb commit rewrites the pages of every B-tree it touched, scattered over its
//! file (seven 4 KiB pages and a header for one log entry, measured), and one `fdatasync`
//! of those took 450–650 µs here; a record appended at the end of a file and synced takes
//! about 130 µs. The log is written in order and read back mostly where it was just
//! written, so it needs no tree: records go to the end of the active segment, and an index
//! in memory maps each log index to where its entry lies.
//!
//! A segment starts with [`MAGIC`], then records: `u32 LE body length | u32 LE crc32c of
//! kind, synced-to and body | kind | u64 LE synced-to | u32 LE crc32c of the header before
//! it | body`. Kinds: an entry (`u64 LE index | entry
//! bytes`), a truncation (`u64 LE index`: entries from it on are gone), a purge (`u64 LE
//! index | value`: entries up to it are gone, the value is the purge point as the caller
//! encodes it) and a state value (`key | value`: the vote, the commit index). Synced-to is
//! how far the segment was known durable when the record was written: everything before
//! that offset had been synced. Opening replays every segment in order.
//!
//! A record that does not parse at the end of the last segment was either cut by a crash
//! (an append is durable only once synced, and a sync covers every write before it) or
//! damaged after it was synced. It is taken for a crash's, and the file is cut there, when
//! no whole record anywhere after it says it was synced, and it has the shape an
//! interrupted append leaves: its header is not whole (or zeros), it runs past the end of
//! the file, or a 512-byte sector under it is all zeros (never written: the file's new
//! region reads as zeros). Anything
//! else (a later record's synced-to past it, or a written record failing its checksum)
//! refuses the start, and so does any damage before the last segment: cutting there could
//! drop records that were synced, a vote among them. Damage to the very last record after
//! its sync, in its header or in a sector that was zeros, cannot be told from a crash and
//! is cut.
//!
//! Segments of the previous format (`shoalwl1`: no synced-to) are still read; a log whose
//! newest segment is one starts a new segment at open.
//!
//! A segment is closed (synced) at [`SEGMENT_BYTES`], and the next one starts with the
//! current purge point and state values, so once the purge point has passed every entry in
//! a segment, nothing in it is needed and it is deleted. New segments are written with
//! [`replace_file`] (a temporary name, renamed once synced), so a segment file always has
//! its whole head.

use std::collections::BTreeMap;
use std::io;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use shoal_disk::{Disk, DiskFile, replace_file};

/// An open segment file.
type Segment = Arc<dyn DiskFile>;

/// First bytes of every segment: the format's name and version.
pub const MAGIC: &[u8; 8] = b"shoalwl2";
/// The previous format's: records without synced-to.
const MAGIC_V1: &[u8; 8] = b"shoalwl1";
/// A segment is closed once it holds this much.
pub const SEGMENT_BYTES: u64 = 64 << 20;
/// Record header: body length, checksum, kind, synced-to, and a checksum of those.
const HEADER: usize = 21;
/// The part of a header its own checksum covers.
const HEADER_COVERED: usize = 17;
/// The previous format's header: body length, checksum, kind.
const HEADER_V1: usize = 9;
/// The unit a torn write leaves unwritten (zeros) at worst.
const SECTOR: usize = 512;
/// The largest record body accepted when reading (an entry is at most a few MiB).
const MAX_BODY: u32 = 256 << 20;

const ENTRY: u8 = 1;
const TRUNCATE: u8 = 2;
const PURGE: u8 = 3;
const STATE: u8 = 4;

/// The state values the log keeps besides its entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Key {
    Vote = 1,
    Committed = 2,
}

impl Key {
    fn from_u8(b: u8) -> Option<Key> {
        match b {
            1 => Some(Key::Vote),
            2 => Some(Key::Committed),
            _ => None,
        }
    }
}

/// Where an entry's bytes lie.
#[derive(Clone)]
struct Loc {
    segment: u64,
    file: Segment,
    offset: u64,
    len: u32,
}

struct Inner {
    disk: Arc<dyn Disk>,
    dir: PathBuf,
    /// Every segment by its number; the last is the active one.
    segments: BTreeMap<u64, Segment>,
    active: u64,
    /// Bytes in the active segment (where the next record goes).
    end: u64,
    index: BTreeMap<u64, Loc>,
    purged: Option<(u64, Vec<u8>)>,
    state: BTreeMap<Key, Vec<u8>>,
    /// Size at which the active segment is closed.
    limit: u64,
    /// How far the active segment is known durable.
    synced: u64,
}

/// The log's records on disk, with the index of its entries.
pub struct Wal {
    inner: Mutex<Inner>,
}

fn segment_name(n: u64) -> String {
    format!("{n:016x}.wal")
}

fn corrupt(path: &Path, offset: u64, what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{}: {what} at offset {offset}", path.display()),
    )
}

/// One record.
fn single(kind: u8, synced_to: u64, parts: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    record(&mut out, kind, synced_to, parts);
    out
}

/// Appends one record to `out`.
fn record(out: &mut Vec<u8>, kind: u8, synced_to: u64, parts: &[&[u8]]) {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    let mut crc = crc32c::crc32c(&[kind]);
    crc = crc32c::crc32c_append(crc, &synced_to.to_le_bytes());
    for p in parts {
        crc = crc32c::crc32c_append(crc, p);
    }
    let head_at = out.len();
    out.extend_from_slice(&(len as u32).to_le_bytes());
    out.extend_from_slice(&crc.to_le_bytes());
    out.push(kind);
    out.extend_from_slice(&synced_to.to_le_bytes());
    let head_crc = crc32c::crc32c(&out[head_at..]);
    out.extend_from_slice(&head_crc.to_le_bytes());
    for p in parts {
        out.extend_from_slice(p);
    }
}

/// A segment's format.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Format {
    V1,
    V2,
}

impl Format {
    fn of(bytes: &[u8]) -> Option<Format> {
        if bytes.starts_with(MAGIC) {
            Some(Format::V2)
        } else if bytes.starts_with(MAGIC_V1) {
            Some(Format::V1)
        } else {
            None
        }
    }

    fn header(self) -> usize {
        match self {
            Format::V1 => HEADER_V1,
            Format::V2 => HEADER,
        }
    }
}

/// One record read back from a segment: its kind, body, where the body starts, and how
/// far the segment was synced when it was written (0 in the previous format).
struct Parsed<'a> {
    kind: u8,
    body: &'a [u8],
    body_at: u64,
    synced_to: u64,
}

/// Whether the header at `at` is whole: its own checksum matches (the previous format has
/// none: any header is taken as whole).
fn header_ok(bytes: &[u8], at: usize, format: Format) -> bool {
    match format {
        Format::V1 => bytes.get(at..at.saturating_add(HEADER_V1)).is_some(),
        Format::V2 => bytes.get(at..at.saturating_add(HEADER)).is_some_and(|h| {
            let want = u32::from_le_bytes([h[17], h[18], h[19], h[20]]);
            crc32c::crc32c(&h[..HEADER_COVERED]) == want
        }),
    }
}

/// The record at `at` in `bytes`, or `None` where the records end (cut short, or a
/// checksum that does not match).
fn parse(bytes: &[u8], at: usize, format: Format) -> Option<(Parsed<'_>, usize)> {
    if !header_ok(bytes, at, format) {
        return None;
    }
    let header = format.header();
    let head = bytes.get(at..at.checked_add(header)?)?;
    let len = u32::from_le_bytes(head[0..4].try_into().ok()?);
    let crc = u32::from_le_bytes(head[4..8].try_into().ok()?);
    let kind = head[8];
    if len > MAX_BODY {
        return None;
    }
    let start = at + header;
    let body = bytes.get(start..start + len as usize)?;
    let (synced_to, covered) = match format {
        Format::V1 => (0, crc32c::crc32c(&[kind])),
        Format::V2 => (
            u64::from_le_bytes(head[9..17].try_into().ok()?),
            crc32c::crc32c(&head[8..17]),
        ),
    };
    if crc32c::crc32c_append(covered, body) != crc {
        return None;
    }
    Some((
        Parsed {
            kind,
            body,
            body_at: start as u64,
            synced_to,
        },
        start + len as usize,
    ))
}

/// Whether the record at `at`, which did not parse, has the shape an append interrupted by
/// a crash leaves: its header not whole (or zeros), or cut short by the end of the file, or
/// lying over a sector never written (the file's new region reads as zeros until it is
/// written). A whole header over a whole body that fails its checksum is damage.
fn torn(bytes: &[u8], at: usize, format: Format) -> bool {
    let Some(head) = bytes.get(at..at + format.header()) else {
        return true;
    };
    if head.iter().all(|&b| b == 0) || !header_ok(bytes, at, format) {
        return true;
    }
    let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
    let end = at.saturating_add(format.header()).saturating_add(len);
    if end > bytes.len() {
        return true;
    }
    let mut sector = at / SECTOR * SECTOR;
    while sector < end {
        let span = &bytes[sector..(sector + SECTOR).min(bytes.len())];
        if span.iter().all(|&b| b == 0) {
            return true;
        }
        sector += SECTOR;
    }
    false
}

/// Whether any whole record after the damaged one at `at` says the segment was synced past
/// `at` (so the damaged record was durable: damage, not a crash). Every later offset is
/// tried (the damaged record's own length may be what is damaged); a header's own checksum
/// makes each try cheap. The previous format, without synced-to, never says so.
fn synced_past(bytes: &[u8], at: usize, format: Format) -> bool {
    if format == Format::V1 {
        return false;
    }
    (at + 1..bytes.len().saturating_sub(HEADER - 1)).any(|next| {
        header_ok(bytes, next, format)
            && parse(bytes, next, format).is_some_and(|(r, _)| r.synced_to > at as u64)
    })
}

fn split_index(body: &[u8]) -> Option<(u64, &[u8])> {
    let (head, rest) = body.split_at_checked(8)?;
    Some((u64::from_le_bytes(head.try_into().ok()?), rest))
}

impl Inner {
    /// Applies one replayed record.
    fn replay(&mut self, path: &Path, segment: u64, file: &Segment, r: Parsed) -> io::Result<()> {
        let bad = |what: &str| corrupt(path, r.body_at, what);
        match r.kind {
            ENTRY => {
                let (index, entry) = split_index(r.body).ok_or_else(|| bad("short entry"))?;
                self.index.insert(
                    index,
                    Loc {
                        segment,
                        file: file.clone(),
                        offset: r.body_at + 8,
                        len: entry.len() as u32,
                    },
                );
            }
            TRUNCATE => {
                let (index, _) = split_index(r.body).ok_or_else(|| bad("short truncation"))?;
                self.index.split_off(&index);
            }
            PURGE => {
                let (index, value) = split_index(r.body).ok_or_else(|| bad("short purge"))?;
                self.index = self.index.split_off(&index.saturating_add(1));
                self.purged = Some((index, value.to_vec()));
            }
            STATE => {
                let (&key, value) = r.body.split_first().ok_or_else(|| bad("empty state"))?;
                let key = Key::from_u8(key).ok_or_else(|| bad("unknown state key"))?;
                self.state.insert(key, value.to_vec());
            }
            other => return Err(bad(&format!("unknown record kind {other}"))),
        }
        Ok(())
    }

    /// The records that start a new segment: what the older ones would otherwise be
    /// needed for.
    fn head(&self) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        if let Some((index, value)) = &self.purged {
            record(&mut out, PURGE, 0, &[&index.to_le_bytes(), value]);
        }
        for (key, value) in &self.state {
            record(&mut out, STATE, 0, &[&[*key as u8], value]);
        }
        out
    }

    /// Syncs the active segment and starts segment `active + 1`.
    fn roll(&mut self) -> io::Result<()> {
        if let Some(file) = self.segments.get(&self.active) {
            file.sync()?;
        }
        let n = self.active + 1;
        let head = self.head();
        let path = self.dir.join(segment_name(n));
        replace_file(&*self.disk, &path, &head)?;
        let file = self.disk.open(&path, false)?;
        self.segments.insert(n, file);
        self.active = n;
        self.end = head.len() as u64;
        // The head was synced before its rename.
        self.synced = self.end;
        self.drop_unneeded();
        Ok(())
    }

    /// Deletes the segments before the oldest one holding an entry (their purge point and
    /// state values were written again at the start of every later segment).
    fn drop_unneeded(&mut self) {
        // Entries are appended in index order, but one appended again without a
        // truncation lands in a later segment than those after it: look at them all.
        let keep = self
            .index
            .values()
            .map(|l| l.segment)
            .min()
            .map_or(self.active, |s| s.min(self.active));
        let old: Vec<u64> = self.segments.range(..keep).map(|(n, _)| *n).collect();
        // Oldest first, stopping at a failure: the segments left are always the newest
        // ones, which replay to the same log.
        let deleted = !old.is_empty();
        for n in old {
            let path = self.dir.join(segment_name(n));
            if let Err(e) = self.disk.remove_file(&path) {
                tracing::warn!(path = %path.display(), error = %e, "could not delete a log segment");
                break;
            }
            self.segments.remove(&n);
        }
        if deleted && let Err(e) = self.disk.sync_dir(&self.dir) {
            tracing::warn!(dir = %self.dir.display(), error = %e, "could not sync the log's directory");
        }
    }

    /// Writes the records `make` builds (given how far the active segment is synced) at the
    /// end of the active segment, starting a new one first when this one is full. Returns
    /// the segment, its file and where the bytes start.
    fn write(&mut self, make: impl FnOnce(u64) -> Vec<u8>) -> io::Result<(u64, Segment, u64)> {
        if self.end >= self.limit {
            self.roll()?;
        }
        let file = self
            .segments
            .get(&self.active)
            .cloned()
            .ok_or_else(|| io::Error::other("no active log segment"))?;
        let bytes = make(self.synced);
        let at = self.end;
        file.write_all_at(&bytes, at)?;
        self.end += bytes.len() as u64;
        Ok((self.active, file, at))
    }
}

impl Wal {
    /// Opens the log in `dir` on `disk` (created if missing), replaying its segments.
    pub fn open(disk: Arc<dyn Disk>, dir: &Path) -> io::Result<Wal> {
        Wal::open_with(disk, dir, SEGMENT_BYTES)
    }

    /// [`Self::open`], closing segments at `limit` bytes.
    pub fn open_with(disk: Arc<dyn Disk>, dir: &Path, limit: u64) -> io::Result<Wal> {
        if !disk.exists(dir) {
            disk.create_dir_all(dir)?;
            disk.sync_dir(shoal_disk::parent(dir))?;
        }
        let mut numbers = Vec::new();
        for name in disk.list(dir)? {
            if name.ends_with(".tmp") {
                // A segment whose start was never synced and renamed: nothing refers to it.
                disk.remove_file(&dir.join(&name))?;
            } else if let Some(hex) = name.strip_suffix(".wal")
                && let Ok(n) = u64::from_str_radix(hex, 16)
            {
                numbers.push(n);
            }
        }
        numbers.sort_unstable();
        // Segments are deleted oldest first: one older than a gap was deleted too, only
        // not durably (its deletion was reordered after a later one's). Replaying it could
        // bring back entries a deleted segment's truncation removed.
        if let Some(gap) = numbers.windows(2).rposition(|w| w[1] != w[0] + 1) {
            for n in numbers.drain(..=gap) {
                let path = dir.join(segment_name(n));
                tracing::warn!(path = %path.display(), "deleting a log segment left before a gap");
                disk.remove_file(&path)?;
            }
            disk.sync_dir(dir)?;
        }
        let mut inner = Inner {
            disk: disk.clone(),
            dir: dir.to_owned(),
            segments: BTreeMap::new(),
            active: 0,
            end: 0,
            index: BTreeMap::new(),
            purged: None,
            state: BTreeMap::new(),
            limit,
            synced: 0,
        };
        let last = numbers.last().copied();
        let mut last_format = Format::V2;
        for n in numbers {
            let path = dir.join(segment_name(n));
            let file = disk.open(&path, false)?;
            // What the disk holds, not what the page cache kept of writes a failed sync
            // dropped (a restart after EIO): sync what is dirty, then drop the cache.
            file.sync()?;
            file.forget_cached()?;
            let bytes = file.read_all()?;
            let format =
                Format::of(&bytes).ok_or_else(|| corrupt(&path, 0, "not a shoal log segment"))?;
            let mut at = MAGIC.len();
            while let Some((r, next)) = parse(&bytes, at, format) {
                inner.replay(&path, n, &file, r)?;
                at = next;
            }
            if at < bytes.len() {
                if Some(n) != last {
                    return Err(corrupt(
                        &path,
                        at as u64,
                        "damaged record before the last segment",
                    ));
                }
                if synced_past(&bytes, at, format) {
                    return Err(corrupt(
                        &path,
                        at as u64,
                        "damaged record inside the last segment (a later record says it was synced)",
                    ));
                }
                if !torn(&bytes, at, format) {
                    return Err(corrupt(
                        &path,
                        at as u64,
                        "damaged record inside the last segment (not what an interrupted append leaves)",
                    ));
                }
                tracing::warn!(
                    path = %path.display(),
                    offset = at,
                    dropped = bytes.len() - at,
                    "the log ends in a record cut short (a crash during an append): cut there"
                );
                file.set_len(at as u64)?;
            }
            inner.segments.insert(n, file);
            inner.active = n;
            inner.end = at as u64;
            last_format = format;
        }
        if last.is_none() || last_format == Format::V1 {
            // Segment 1 is written like any later one: under a temporary name; and records
            // of this format never go into a segment of the previous one.
            inner.roll()?;
        } else if let Some(file) = inner.segments.get(&inner.active) {
            // What is in the active segment now (written back or not before a crash) is
            // made durable, so records written from here on can say so.
            file.sync()?;
            inner.synced = inner.end;
        }
        inner.drop_unneeded();
        Ok(Wal {
            inner: Mutex::new(inner),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes the records `make` builds (given the active segment's synced-to) at the end
    /// of the log and applies `update` (given the segment, its file and where the records
    /// start) under the same lock; with `sync`, makes them durable once the lock is
    /// released, so readers never wait for the disk.
    fn commit(
        &self,
        make: impl FnOnce(u64) -> Vec<u8>,
        sync: bool,
        update: impl FnOnce(&mut Inner, u64, &Segment, u64),
    ) -> io::Result<()> {
        let (segment, file, end) = {
            let mut inner = self.lock();
            let (segment, file, at) = inner.write(make)?;
            update(&mut inner, segment, &file, at);
            (segment, file, inner.end)
        };
        if sync {
            file.sync()?;
            let mut inner = self.lock();
            if inner.active == segment {
                inner.synced = inner.synced.max(end);
            }
        }
        Ok(())
    }

    /// Appends entries (log index, bytes) in order; with `sync`, returns once they (and
    /// everything before them) are on disk.
    pub fn append(&self, entries: &[(u64, Vec<u8>)], sync: bool) -> io::Result<()> {
        if let Some((index, bytes)) = entries
            .iter()
            .find(|(_, b)| b.len() + 8 > MAX_BODY as usize)
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "log entry {index} of {} bytes is over the record limit",
                    bytes.len()
                ),
            ));
        }
        // Where each entry's bytes start among the records (headers have one length).
        let mut offsets = Vec::with_capacity(entries.len());
        let mut total = 0;
        for (_, bytes) in entries {
            offsets.push(total + (HEADER + 8) as u64);
            total += (HEADER + 8 + bytes.len()) as u64;
        }
        let make = |synced_to| {
            let mut buf = Vec::with_capacity(total as usize);
            for (index, bytes) in entries {
                record(&mut buf, ENTRY, synced_to, &[&index.to_le_bytes(), bytes]);
            }
            buf
        };
        self.commit(make, sync, |inner, segment, file, at| {
            for ((index, bytes), offset) in entries.iter().zip(offsets) {
                let loc = Loc {
                    segment,
                    file: file.clone(),
                    offset: at + offset,
                    len: bytes.len() as u32,
                };
                inner.index.insert(*index, loc);
            }
        })
    }

    /// Removes the entries from `index` on, durably.
    pub fn truncate(&self, index: u64) -> io::Result<()> {
        let rec = |synced_to| single(TRUNCATE, synced_to, &[&index.to_le_bytes()]);
        self.commit(rec, true, |inner, _, _, _| {
            inner.index.split_off(&index);
        })
    }

    /// Removes the entries up to `index`, records `value` as the purge point, durably,
    /// and deletes the segments no longer needed.
    pub fn purge(&self, index: u64, value: &[u8]) -> io::Result<()> {
        let rec = |synced_to| single(PURGE, synced_to, &[&index.to_le_bytes(), value]);
        self.commit(rec, true, |inner, _, _, _| {
            inner.index = inner.index.split_off(&index.saturating_add(1));
            inner.purged = Some((index, value.to_vec()));
        })?;
        // Only once the purge point is durable may what it replaces go.
        self.lock().drop_unneeded();
        Ok(())
    }

    /// Sets a state value; with `sync`, durably.
    pub fn set(&self, key: Key, value: &[u8], sync: bool) -> io::Result<()> {
        let rec = |synced_to| single(STATE, synced_to, &[&[key as u8], value]);
        self.commit(rec, sync, |inner, _, _, _| {
            inner.state.insert(key, value.to_vec());
        })
    }

    pub fn get(&self, key: Key) -> Option<Vec<u8>> {
        self.lock().state.get(&key).cloned()
    }

    /// The purge point's value, as given to [`Self::purge`].
    pub fn purged(&self) -> Option<Vec<u8>> {
        self.lock().purged.as_ref().map(|(_, v)| v.clone())
    }

    /// The bytes of the last entry.
    pub fn last(&self) -> io::Result<Option<Vec<u8>>> {
        let loc = self.lock().index.values().next_back().cloned();
        loc.map(|l| read_at(&l)).transpose()
    }

    /// The bytes of the entries in the range, in index order (entries not held are
    /// left out).
    pub fn read(&self, start: Bound<u64>, end: Bound<u64>) -> io::Result<Vec<Vec<u8>>> {
        let locs: Vec<Loc> = self
            .lock()
            .index
            .range((start, end))
            .map(|(_, l)| l.clone())
            .collect();
        locs.iter().map(read_at).collect()
    }

    /// Makes everything written so far durable.
    pub fn sync(&self) -> io::Result<()> {
        let inner = self.lock();
        match inner.segments.get(&inner.active) {
            Some(f) => f.sync(),
            None => Ok(()),
        }
    }

    /// Whether the next write starts a new segment (a roll syncs and writes files: not
    /// work for the Raft core's task).
    pub fn rolls_next(&self) -> bool {
        let inner = self.lock();
        inner.end >= inner.limit
    }

    /// Segment files on disk (for tests).
    #[cfg(test)]
    fn segment_count(&self) -> usize {
        self.lock().segments.len()
    }
}

fn read_at(loc: &Loc) -> io::Result<Vec<u8>> {
    let mut out = vec![0u8; loc.len as usize];
    loc.file.read_exact_at(&mut out, loc.offset)?;
    Ok(out)
}

#[cfg(test)]
#[path = "wal_tests.rs"]
mod tests;
