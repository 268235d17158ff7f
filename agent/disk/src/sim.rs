//! [`SimDisk`]: files in memory whose writes are volatile until synced, as a page cache
//! holds them, with power cuts, crashes and injected errors.
//!
//! Each file keeps its durable bytes and the writes and length changes since its last
//! sync, in order; reads see both. Each directory keeps its durable entries and its
//! current ones; [`Disk::sync_dir`] makes the current ones durable. At a
//! [`SimDisk::power_cut`] every directory goes back to its durable entries (files no
//! longer named are gone) and each file keeps a seeded choice of its unsynced changes
//! (see [`after_power_cut`]): each sector (512 bytes) independently reaches the disk as of
//! any of the writes to it or not at all, so a write can be torn and later writes can
//! survive earlier ones, as writeback reorders them; the length is any it had since the
//! sync. Bytes outside a write's range never change (redb's "powersafe overwrite"). A
//! [`SimDisk::crash`] (a process killed) loses nothing. Both fence every handle opened
//! before them: its calls fail from then on, so code that still holds one (redb flushes in
//! `Drop`) cannot write after the crash, which would make it a clean shutdown. EIO and
//! ENOSPC come on demand ([`SimFault`]).
//!
//! The replica opens on it in tests and the simulator (`NamespaceStore::open_on`); in
//! production it opens its redb file directly (`NamespaceStore::open`).

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::{Disk, DiskFile, parent};

/// The unit a power cut keeps or loses of a pending write.
pub const SECTOR: u64 = 512;

/// An error the disk answers with, until cleared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SimFault {
    /// Every write and sync fails with EIO.
    Eio,
    /// Writes that would hold more than this many bytes in all files fail with ENOSPC.
    FullAt(u64),
}

#[derive(Clone, Debug)]
enum Change {
    Write { offset: u64, data: Vec<u8> },
    SetLen(u64),
}

#[derive(Debug, Default)]
struct FileData {
    durable: Vec<u8>,
    /// Changes since the last sync, in order.
    pending: Vec<Change>,
    /// `durable` with `pending` applied: what reads see.
    current: Vec<u8>,
}

fn apply(bytes: &mut Vec<u8>, change: &Change) {
    match change {
        Change::Write { offset, data } => {
            let (start, end) = (*offset as usize, *offset as usize + data.len());
            if bytes.len() < end {
                bytes.resize(end, 0);
            }
            bytes[start..end].copy_from_slice(data);
        }
        Change::SetLen(len) => bytes.resize(*len as usize, 0),
    }
}

/// What a file holds after a power cut, given its durable bytes and the changes since its
/// last sync: its length is the one after any of the changes (or the durable one), and
/// each sector any of the changes touched holds its content as of any of those changes
/// (or its durable content), chosen independently per sector. A sector never holds a
/// later write's bytes without an earlier write's to the same sector, as writeback of
/// the page cache's pages guarantees.
fn after_power_cut(durable: &[u8], pending: &[Change], rng: &mut SplitMix64) -> Vec<u8> {
    let sector = SECTOR as usize;
    let mut cur = durable.to_vec();
    let mut lens = vec![durable.len()];
    let mut versions: BTreeMap<usize, Vec<Vec<u8>>> = BTreeMap::new();
    for change in pending {
        let before = cur.len();
        apply(&mut cur, change);
        lens.push(cur.len());
        let (from, to) = match change {
            Change::Write { offset, data } => (*offset as usize, *offset as usize + data.len()),
            Change::SetLen(len) => (before.min(*len as usize), before.max(*len as usize)),
        };
        let mut s = from / sector;
        while s * sector < to {
            let start = s * sector;
            let mut content = cur
                .get(start..(start + sector).min(cur.len()))
                .map_or_else(Vec::new, <[u8]>::to_vec);
            content.resize(sector, 0);
            versions.entry(s).or_default().push(content);
            s += 1;
        }
    }
    let len = lens[rng.below(lens.len() as u64) as usize];
    let mut out = durable.to_vec();
    out.resize(len.max(out.len()), 0);
    for (s, vs) in versions {
        let pick = rng.below(vs.len() as u64 + 1) as usize;
        let start = s * sector;
        if pick == 0 || start >= out.len() {
            continue;
        }
        let end = (start + sector).min(out.len());
        out[start..end].copy_from_slice(&vs[pick - 1][..end - start]);
    }
    out.truncate(len);
    out
}

/// SplitMix64: a small seeded generator, for the power cut's choices and for the seeded
/// tests that drive a simulated disk.
#[derive(Debug)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number below `n` (0 for `n` 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

#[derive(Debug)]
struct State {
    /// Bumped by every crash and power cut: handles of an older generation are fenced.
    generation: u64,
    files: BTreeMap<u64, FileData>,
    next_id: u64,
    /// Current entries: path → file id.
    names: BTreeMap<PathBuf, u64>,
    /// Entries as they are on disk.
    durable_names: BTreeMap<PathBuf, u64>,
    dirs: BTreeSet<PathBuf>,
    rng: SplitMix64,
    fault: Option<SimFault>,
}

impl State {
    fn used(&self) -> u64 {
        self.files.values().map(|f| f.current.len() as u64).sum()
    }

    fn check_write(&self, grows_by: u64) -> io::Result<()> {
        match self.fault {
            Some(SimFault::Eio) => Err(io::Error::other("simulated EIO")),
            Some(SimFault::FullAt(limit)) if grows_by > 0 && self.used() + grows_by > limit => Err(
                io::Error::new(io::ErrorKind::StorageFull, "simulated ENOSPC"),
            ),
            _ => Ok(()),
        }
    }

    /// Drops the files no entry names, current or durable (called once no handle can
    /// reach them: after a crash or power cut).
    fn forget_unnamed(&mut self) {
        let named: BTreeSet<u64> = self
            .names
            .values()
            .chain(self.durable_names.values())
            .copied()
            .collect();
        self.files.retain(|id, _| named.contains(id));
    }

    fn dir_exists(&self, dir: &Path) -> bool {
        dir == Path::new(".") || dir == Path::new("/") || self.dirs.contains(dir)
    }
}

/// An in-memory disk that loses what was not synced at a power cut (see the module doc).
#[derive(Clone, Debug)]
pub struct SimDisk {
    state: Arc<Mutex<State>>,
}

#[derive(Debug)]
struct SimFile {
    state: Arc<Mutex<State>>,
    id: u64,
    generation: u64,
}

fn stale() -> io::Error {
    io::Error::other("simulated disk: this handle was opened before a crash")
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{}: no such file", path.display()),
    )
}

impl SimDisk {
    /// An empty disk whose power cuts choose from `seed`.
    pub fn new(seed: u64) -> SimDisk {
        SimDisk {
            state: Arc::new(Mutex::new(State {
                generation: 0,
                files: BTreeMap::new(),
                next_id: 1,
                names: BTreeMap::new(),
                durable_names: BTreeMap::new(),
                dirs: BTreeSet::new(),
                rng: SplitMix64(seed),
                fault: None,
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The process died: nothing is lost (the page cache survives), but every handle
    /// opened before is fenced.
    pub fn crash(&self) {
        let mut s = self.lock();
        s.generation += 1;
        s.forget_unnamed();
    }

    /// The machine lost power: unsynced writes and directory entries are lost or torn
    /// (see the module doc), and every handle opened before is fenced.
    pub fn power_cut(&self) {
        let mut s = self.lock();
        s.generation += 1;
        s.names = s.durable_names.clone();
        s.forget_unnamed();
        let ids: Vec<u64> = s.files.keys().copied().collect();
        for id in ids {
            let Some(f) = s.files.get_mut(&id) else {
                continue;
            };
            let pending = std::mem::take(&mut f.pending);
            if pending.is_empty() {
                continue;
            }
            let durable = f.durable.clone();
            let mut rng = SplitMix64(s.rng.next_u64());
            let bytes = after_power_cut(&durable, &pending, &mut rng);
            if let Some(f) = s.files.get_mut(&id) {
                f.durable = bytes.clone();
                f.current = bytes;
            }
        }
    }

    /// Answers with `fault` from now on (`None`: works again).
    pub fn set_fault(&self, fault: Option<SimFault>) {
        self.lock().fault = fault;
    }

    fn handle(&self, id: u64, generation: u64) -> Arc<dyn DiskFile> {
        Arc::new(SimFile {
            state: self.state.clone(),
            id,
            generation,
        })
    }
}

impl SimFile {
    fn lock(&self) -> io::Result<MutexGuard<'_, State>> {
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.generation != self.generation {
            return Err(stale());
        }
        Ok(s)
    }

    fn change(&self, change: Change) -> io::Result<()> {
        let mut s = self.lock()?;
        let len = s.files.get(&self.id).map_or(0, |f| f.current.len() as u64);
        let new_len = match &change {
            Change::Write { offset, data } => len.max(offset + data.len() as u64),
            Change::SetLen(l) => *l,
        };
        s.check_write(new_len.saturating_sub(len))?;
        let f = s.files.get_mut(&self.id).ok_or_else(stale)?;
        apply(&mut f.current, &change);
        f.pending.push(change);
        Ok(())
    }
}

impl DiskFile for SimFile {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let s = self.lock()?;
        let f = s.files.get(&self.id).ok_or_else(stale)?;
        let start = usize::try_from(offset).map_err(io::Error::other)?;
        let src = start
            .checked_add(buf.len())
            .and_then(|end| f.current.get(start..end))
            .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "read past the end"))?;
        buf.copy_from_slice(src);
        Ok(())
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.change(Change::Write {
            offset,
            data: buf.to_vec(),
        })
    }

    fn len(&self) -> io::Result<u64> {
        let s = self.lock()?;
        Ok(s.files.get(&self.id).ok_or_else(stale)?.current.len() as u64)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.change(Change::SetLen(len))
    }

    fn sync(&self) -> io::Result<()> {
        let mut s = self.lock()?;
        let failed = s.fault == Some(SimFault::Eio);
        let f = s.files.get_mut(&self.id).ok_or_else(stale)?;
        // As Linux: after a failed sync the changes it could not write are dropped (their
        // pages marked clean) while reads still see them, until the cache is dropped; a
        // later sync does not write them either.
        let pending = std::mem::take(&mut f.pending);
        if failed {
            return Err(io::Error::other("simulated EIO"));
        }
        for change in &pending {
            apply(&mut f.durable, change);
        }
        Ok(())
    }

    fn forget_cached(&self) -> io::Result<()> {
        let mut s = self.lock()?;
        let f = s.files.get_mut(&self.id).ok_or_else(stale)?;
        let mut current = f.durable.clone();
        for change in &f.pending {
            apply(&mut current, change);
        }
        f.current = current;
        Ok(())
    }
}

impl Disk for SimDisk {
    fn open(&self, path: &Path, create: bool) -> io::Result<Arc<dyn DiskFile>> {
        let s = self.lock();
        if let Some(&id) = s.names.get(path) {
            let g = s.generation;
            drop(s);
            return Ok(self.handle(id, g));
        }
        if !create {
            return Err(not_found(path));
        }
        drop(s);
        self.create(path)
    }

    fn create(&self, path: &Path) -> io::Result<Arc<dyn DiskFile>> {
        let mut s = self.lock();
        if !s.dir_exists(parent(path)) {
            return Err(not_found(parent(path)));
        }
        s.check_write(0)?;
        let id = s.next_id;
        s.next_id += 1;
        s.files.insert(id, FileData::default());
        s.names.insert(path.to_owned(), id);
        let g = s.generation;
        drop(s);
        Ok(self.handle(id, g))
    }

    fn exists(&self, path: &Path) -> bool {
        let s = self.lock();
        s.names.contains_key(path) || s.dir_exists(path)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let s = self.lock();
        if !s.dir_exists(dir) {
            return Err(not_found(dir));
        }
        let children = s
            .names
            .keys()
            .map(PathBuf::as_path)
            .chain(s.dirs.iter().map(PathBuf::as_path))
            .filter(|p| p.parent() == Some(dir))
            .filter_map(|p| Some(p.file_name()?.to_string_lossy().into_owned()))
            .collect();
        Ok(children)
    }

    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        // Directories are kept across power cuts: the code under test syncs their
        // parents, and what it keeps in them is what the simulation is about.
        let mut s = self.lock();
        for d in dir.ancestors() {
            if !d.as_os_str().is_empty() {
                s.dirs.insert(d.to_owned());
            }
        }
        Ok(())
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let mut s = self.lock();
        s.check_write(0)?;
        s.names.remove(path).ok_or_else(|| not_found(path))?;
        Ok(())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut s = self.lock();
        s.check_write(0)?;
        if !s.dir_exists(parent(to)) {
            return Err(not_found(parent(to)));
        }
        let id = s.names.remove(from).ok_or_else(|| not_found(from))?;
        s.names.insert(to.to_owned(), id);
        Ok(())
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut s = self.lock();
        if s.fault == Some(SimFault::Eio) {
            return Err(io::Error::other("simulated EIO"));
        }
        let in_dir = |p: &Path| p.parent() == Some(dir);
        let current: Vec<(PathBuf, u64)> = s
            .names
            .iter()
            .filter(|(p, _)| in_dir(p))
            .map(|(p, id)| (p.clone(), *id))
            .collect();
        s.durable_names.retain(|p, _| !in_dir(p));
        s.durable_names.extend(current);
        Ok(())
    }
}
