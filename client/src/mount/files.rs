//! Open files: their write buffers, the writes in flight to the agent, and read-ahead.
//!
//! Written data stays in this process (not in the agent) until the agent has committed it,
//! so an agent restart loses nothing: the write is sent again. A handle sends its buffer
//! in the background in chunks of four whole stripes (`WRITE_STRIPES`; one request and one
//! metadata commit each), up to [`LANES`] chunks at a time; the FUSE write returns once
//! the data is buffered. All buffered and in-flight bytes together hold permits of one
//! semaphore sized by `--write-buffer`. A chunk that overlaps a chunk in flight for the
//! same inode waits for it, so the later write lands last. A background failure is kept on
//! the handle: the next write of it fails, and every flush, until an fsync reports it once
//! (a flush does not clear it: the kernel sends one at every close of a copy of the
//! descriptor, and a child that inherited it closes its copy at exec); the fsync of
//! another handle of the file reports each failure once too.
//!
//! A `setattr` (times, mode, owner; not the size) of a file whose only uncommitted bytes
//! sit in one handle's buffer is held with those bytes ([`OpenFiles::hold_set`]) and
//! committed with them in one metadata entry, after them: a copy that writes a small file
//! and then sets its times and mode commits once, not three times. Whatever reads the
//! file's attributes through this mount commits its pending writes first, the held set
//! with them ([`OpenFiles::has_pending`]), and a write after a held set waits for it.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use fuser::Errno;
use shoal_agent_api::{FsRequest, FsResponse, Ino, SetAttr, WRITE_THEN_SET_SINCE};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

use super::agent::Agent;
use super::readahead::{self, ReadCache};
use super::write::{Chunk, Coalescer, overlaps};

/// Chunks in flight per handle.
const LANES: usize = 4;
/// Stripes per chunk a streaming writer sends: each chunk is one request and one metadata
/// commit (its stripes' extents together), and a commit costs the cluster about as much
/// CPU as a stripe's data does on this size of machine.
const WRITE_STRIPES: u64 = 4;

/// Every open file of the mount.
pub struct OpenFiles {
    agent: Arc<Agent>,
    /// Bytes a streaming writer's chunks hold: whole stripes.
    write_chunk: u64,
    read_chunk: u64,
    budget: Arc<Semaphore>,
    budget_total: usize,
    prefetch_budget: Arc<Semaphore>,
    next_write: AtomicU64,
    handles: Mutex<HashMap<u64, Arc<OpenFile>>>,
    inodes: Arc<Mutex<HashMap<Ino, InodeState>>>,
}

/// One open handle.
pub struct OpenFile {
    pub ino: Ino,
    /// The handle, as the kernel names it.
    fh: u64,
    /// Shared by the inode's handles; grows with every write through this mount, which
    /// tells read-ahead its chunks are stale.
    generation: Arc<AtomicU64>,
    writer: tokio::sync::Mutex<Writer>,
    buffered: AtomicUsize,
    lanes: Arc<Semaphore>,
    outcome: Arc<Outcome>,
    /// Other handles of the inode → their failures this handle's fsync has reported.
    reported: Mutex<HashMap<u64, u64>>,
    reader: tokio::sync::Mutex<ReadCache>,
}

struct Writer {
    coalescer: Coalescer,
    /// Budget held by the buffered bytes.
    permit: Option<OwnedSemaphorePermit>,
}

/// What the handle's background writes left behind.
#[derive(Default)]
struct Outcome {
    /// The first failure no fsync of the handle has reported yet.
    error: Mutex<Option<Errno>>,
    /// Whether a write has reported `error` already: one write fails for it, the later
    /// ones go on (flush and fsync still report it).
    told_write: AtomicBool,
    /// Failures so far: another handle's fsync reports each one once.
    failures: AtomicU64,
    in_flight: Mutex<Vec<watch::Receiver<bool>>>,
}

struct InodeState {
    handles: Vec<u64>,
    generation: Arc<AtomicU64>,
    in_flight: Vec<InFlight>,
    /// A `setattr` held for the next buffer the handle `.0` sends (see the module doc).
    held_set: Option<(u64, SetAttr)>,
}

impl InodeState {
    fn new(generation: Arc<AtomicU64>) -> Self {
        InodeState {
            handles: Vec::new(),
            generation,
            in_flight: Vec::new(),
            held_set: None,
        }
    }

    fn is_idle(&self) -> bool {
        self.handles.is_empty() && self.in_flight.is_empty() && self.held_set.is_none()
    }
}

struct InFlight {
    id: u64,
    range: Range<u64>,
    /// It carries a held setattr: every later write of the inode waits for it.
    carries_set: bool,
    done: watch::Receiver<bool>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl OpenFiles {
    /// `stripe`: the cluster's stripe size; `read_ahead`: `--read-ahead` (0: off);
    /// `write_buffer`: `--write-buffer`.
    pub fn new(agent: Arc<Agent>, stripe: u64, read_ahead: u64, write_buffer: u64) -> Self {
        let read_chunk = read_ahead.div_ceil(stripe) * stripe;
        // Room for one full buffer and one more write, whatever the option says, so a
        // writer can always make progress.
        let write_chunk = stripe.saturating_mul(WRITE_STRIPES);
        let floor = usize::try_from(write_chunk)
            .unwrap_or(usize::MAX)
            .saturating_add(super::MAX_WRITE as usize);
        let budget_total = usize::try_from(write_buffer)
            .unwrap_or(usize::MAX)
            .clamp(floor, Semaphore::MAX_PERMITS);
        OpenFiles {
            agent,
            write_chunk,
            read_chunk,
            budget: Arc::new(Semaphore::new(budget_total)),
            budget_total,
            prefetch_budget: Arc::new(Semaphore::new(readahead::PREFETCHED_CHUNKS)),
            next_write: AtomicU64::new(1),
            handles: Mutex::new(HashMap::new()),
            inodes: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// Registers a new handle.
    pub fn open(&self, fh: u64, ino: Ino) -> Arc<OpenFile> {
        let generation = {
            let mut inodes = lock(&self.inodes);
            let st = inodes
                .entry(ino)
                .or_insert_with(|| InodeState::new(Arc::new(AtomicU64::new(0))));
            st.handles.push(fh);
            st.generation.clone()
        };
        let file = Arc::new(OpenFile {
            ino,
            fh,
            generation,
            writer: tokio::sync::Mutex::new(Writer {
                coalescer: Coalescer::new(self.write_chunk),
                permit: None,
            }),
            buffered: AtomicUsize::new(0),
            lanes: Arc::new(Semaphore::new(LANES)),
            outcome: Arc::default(),
            reported: Mutex::default(),
            reader: tokio::sync::Mutex::new(ReadCache::new(self.read_chunk)),
        });
        lock(&self.handles).insert(fh, file.clone());
        file
    }

    pub fn get(&self, fh: u64) -> Option<Arc<OpenFile>> {
        lock(&self.handles).get(&fh).cloned()
    }

    /// Forgets a handle; call after [`OpenFiles::flush`].
    pub fn close(&self, fh: u64) -> Option<Arc<OpenFile>> {
        let file = lock(&self.handles).remove(&fh)?;
        let mut inodes = lock(&self.inodes);
        if let Some(st) = inodes.get_mut(&file.ino) {
            st.handles.retain(|h| *h != fh);
            if st.is_idle() {
                inodes.remove(&file.ino);
            }
        }
        Some(file)
    }

    /// Buffers a write; the bytes taken.
    pub async fn write(
        &self,
        file: &Arc<OpenFile>,
        offset: u64,
        data: &[u8],
    ) -> Result<u32, Errno> {
        // An earlier write of this handle failed: the next write hears of it (flush and
        // fsync still will).
        if let Err(e) = file.error()
            && !file.outcome.told_write.swap(true, Ordering::AcqRel)
        {
            return Err(e);
        }
        let len = u32::try_from(data.len()).map_err(|_| Errno::EINVAL)?;
        if len == 0 {
            return Ok(0);
        }
        // A held setattr lands on the bytes written before it: these come after.
        if self.holds_set(file.ino) {
            self.flush_inode(file.ino).await;
        }
        let permit = self.reserve(len).await?;
        file.generation.fetch_add(1, Ordering::AcqRel);
        self.send_overlapping_buffers(file, offset..offset.saturating_add(u64::from(len)))
            .await;
        let mut w = file.writer.lock().await;
        match &mut w.permit {
            Some(held) => held.merge(permit),
            None => w.permit = Some(permit),
        }
        let mut ready = Vec::new();
        w.coalescer.push(offset, data, &mut ready);
        for chunk in ready {
            let permit = split(&mut w.permit, chunk.data.len());
            self.dispatch(file, chunk, permit).await;
        }
        file.buffered
            .store(w.coalescer.buffered(), Ordering::Release);
        Ok(len)
    }

    /// Budget for `len` more bytes. When the budget is spent, every handle's partial buffer
    /// is sent first: partial buffers of idle handles must not starve writers.
    async fn reserve(&self, len: u32) -> Result<OwnedSemaphorePermit, Errno> {
        let len = len.min(u32::try_from(self.budget_total).unwrap_or(u32::MAX));
        if let Ok(p) = self.budget.clone().try_acquire_many_owned(len) {
            return Ok(p);
        }
        let all: Vec<_> = lock(&self.handles).values().cloned().collect();
        for f in all {
            if let Ok(mut w) = f.writer.try_lock() {
                self.send_buffer(&f, &mut w).await;
            }
        }
        self.budget
            .clone()
            .acquire_many_owned(len)
            .await
            .map_err(|_| Errno::EIO)
    }

    /// Sends the buffers of the inode's other handles that `range` overlaps, so that this
    /// write is committed after them.
    async fn send_overlapping_buffers(&self, file: &Arc<OpenFile>, range: Range<u64>) {
        for other in self.handles_of(file.ino) {
            if Arc::ptr_eq(&other, file) || other.buffered.load(Ordering::Acquire) == 0 {
                continue;
            }
            let mut w = other.writer.lock().await;
            if w.coalescer
                .pending_range()
                .is_some_and(|r| overlaps(&r, &range))
            {
                self.send_buffer(&other, &mut w).await;
            }
        }
    }

    /// Sends the handle's buffer, waits for all its writes, and returns the first failure
    /// no fsync has reported yet. Kept, not cleared: the kernel sends a flush at every
    /// close of a copy of the descriptor (a child that inherited it and exec'd closes
    /// its copy), and the close or fsync of the writer itself must still hear it.
    pub async fn flush(&self, file: &Arc<OpenFile>) -> Result<(), Errno> {
        self.send_and_wait(file).await;
        file.error()
    }

    /// fsync is per file, not per descriptor: sends the buffers of every handle of the
    /// inode, waits for all of the inode's writes, and fails if any of them failed. This
    /// handle's failure is reported and cleared here (once per open file, as the
    /// kernel's fsync does); another handle's is reported once to this handle, and kept
    /// for that handle's own fsync and close.
    pub async fn fsync(&self, file: &Arc<OpenFile>) -> Result<(), Errno> {
        self.flush_inode(file.ino).await;
        file.take_error()?;
        for other in self.handles_of(file.ino) {
            if Arc::ptr_eq(&other, file) {
                continue;
            }
            let Some(e) = *lock(&other.outcome.error) else {
                continue;
            };
            let failures = other.outcome.failures.load(Ordering::Acquire);
            let mut reported = lock(&file.reported);
            let seen = reported.entry(other.fh).or_insert(0);
            if *seen < failures {
                *seen = failures;
                return Err(e);
            }
        }
        Ok(())
    }

    /// Makes every write to `ino` buffered in this mount committed (read-your-writes),
    /// with its held setattr; failures stay on their handles.
    pub async fn flush_inode(&self, ino: Ino) {
        for f in self.handles_of(ino) {
            self.send_and_wait(&f).await;
        }
        let waits: Vec<_> = lock(&self.inodes)
            .get(&ino)
            .map(|st| st.in_flight.iter().map(|i| i.done.clone()).collect())
            .unwrap_or_default();
        for mut w in waits {
            let _ = w.wait_for(|done| *done).await;
        }
        // Its handle's buffer takes it along when sent; one held with no buffer left (it
        // went out another way) is sent alone. One held since this flush sent the
        // buffers waits for the bytes it was held with.
        if !self.any_buffered(ino)
            && let Some(set) = self.take_held_set(ino)
        {
            let request = FsRequest::SetAttr {
                id: self.agent.next_id(),
                ino,
                set,
            };
            if let Err(e) = self.agent.fs(request).await {
                tracing::warn!(ino, "a setattr held with the file's writes failed: {e:?}");
            }
        }
    }

    /// Holds `set` (not a size change) to be committed with the inode's buffered bytes,
    /// right after them, where those are the only writes to it this mount has not
    /// committed and they sit in one handle; merged with a set held already (the later
    /// one's fields win). Answers the size the file has with those bytes and the set now
    /// held, or `None` when `set` must be committed on its own.
    pub async fn hold_set(&self, ino: Ino, set: &SetAttr) -> Option<(u64, SetAttr)> {
        if set.size.is_some() {
            return None;
        }
        let mut holder = None;
        for f in self.handles_of(ino) {
            if f.buffered.load(Ordering::Acquire) > 0 {
                if holder.is_some() {
                    return None;
                }
                holder = Some(f);
            }
        }
        let holder = holder?;
        // Held throughout: this handle sends no buffer meanwhile.
        let w = holder.writer.lock().await;
        let end = w.coalescer.pending_range()?.end;
        let mut inodes = lock(&self.inodes);
        let st = inodes.get_mut(&ino)?;
        if !st.in_flight.is_empty() || st.held_set.as_ref().is_some_and(|(fh, _)| *fh != holder.fh)
        {
            return None;
        }
        let open = lock(&self.handles);
        let others_buffered = st.handles.iter().any(|fh| {
            open.get(fh)
                .is_some_and(|f| !Arc::ptr_eq(f, &holder) && f.buffered.load(Ordering::Acquire) > 0)
        });
        if others_buffered {
            return None;
        }
        let held = match st.held_set.take() {
            Some((_, earlier)) => merged(earlier, set),
            None => set.clone(),
        };
        st.held_set = Some((holder.fh, held.clone()));
        Some((end, held))
    }

    /// Whether a setattr of `ino` is held, or is on its way with a write not yet
    /// answered.
    fn holds_set(&self, ino: Ino) -> bool {
        lock(&self.inodes)
            .get(&ino)
            .is_some_and(|st| st.held_set.is_some() || st.in_flight.iter().any(|i| i.carries_set))
    }

    fn take_held_set(&self, ino: Ino) -> Option<SetAttr> {
        let mut inodes = lock(&self.inodes);
        let st = inodes.get_mut(&ino)?;
        let set = st.held_set.take().map(|(_, set)| set);
        if st.is_idle() {
            inodes.remove(&ino);
        }
        set
    }

    /// Whether a handle of `ino` has bytes buffered.
    fn any_buffered(&self, ino: Ino) -> bool {
        self.handles_of(ino)
            .iter()
            .any(|f| f.buffered.load(Ordering::Acquire) > 0)
    }

    /// Whether this mount holds writes to `ino` (or a setattr held with them) that the
    /// agent has not committed.
    pub fn has_pending(&self, ino: Ino) -> bool {
        let handles = {
            let inodes = lock(&self.inodes);
            let Some(st) = inodes.get(&ino) else {
                return false;
            };
            if !st.in_flight.is_empty() || st.held_set.is_some() {
                return true;
            }
            st.handles.clone()
        };
        let open = lock(&self.handles);
        handles.iter().any(|fh| {
            open.get(fh)
                .is_some_and(|f| f.buffered.load(Ordering::Acquire) > 0)
        })
    }

    /// Drops read-ahead chunks of `ino` (after a truncate).
    pub fn invalidate(&self, ino: Ino) {
        if let Some(st) = lock(&self.inodes).get(&ino) {
            st.generation.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Sends and waits for every buffered write (at unmount).
    pub async fn flush_everything(&self) {
        let all: Vec<_> = lock(&self.handles).values().cloned().collect();
        for f in all {
            self.send_and_wait(&f).await;
            if let Err(e) = f.take_error() {
                tracing::error!(ino = f.ino, "data written to this file was lost: {e:?}");
            }
        }
    }

    /// Reads through the handle's read-ahead.
    pub async fn read(&self, file: &OpenFile, offset: u64, size: u32) -> Result<Bytes, Errno> {
        readahead::read(
            &file.reader,
            &file.generation,
            &self.prefetch_budget,
            &self.agent,
            file.ino,
            offset,
            size,
        )
        .await
    }

    fn handles_of(&self, ino: Ino) -> Vec<Arc<OpenFile>> {
        let fhs = lock(&self.inodes)
            .get(&ino)
            .map(|st| st.handles.clone())
            .unwrap_or_default();
        let open = lock(&self.handles);
        fhs.iter().filter_map(|fh| open.get(fh).cloned()).collect()
    }

    async fn send_and_wait(&self, file: &Arc<OpenFile>) {
        {
            let mut w = file.writer.lock().await;
            self.send_buffer(file, &mut w).await;
        }
        // Every caller waits for all of them: a flush that took them away left a
        // concurrent one (a close beside a getattr's flush) nothing to wait for, and the
        // close returned before its write was committed.
        let waits: Vec<_> = lock(&file.outcome.in_flight).clone();
        for mut w in waits {
            let _ = w.wait_for(|done| *done).await;
        }
        lock(&file.outcome.in_flight).retain(|w| !*w.borrow());
    }

    async fn send_buffer(&self, file: &Arc<OpenFile>, w: &mut Writer) {
        if let Some(chunk) = w.coalescer.take() {
            let permit = split(&mut w.permit, chunk.data.len());
            self.dispatch(file, chunk, permit).await;
        }
        file.buffered.store(0, Ordering::Release);
    }

    /// Starts the background write of one chunk.
    async fn dispatch(
        &self,
        file: &Arc<OpenFile>,
        chunk: Chunk,
        budget: Option<OwnedSemaphorePermit>,
    ) {
        let Ok(lane) = file.lanes.clone().acquire_owned().await else {
            file.fail(Errno::EIO);
            return;
        };
        let (done_tx, done) = watch::channel(false);
        let write = self.next_write.fetch_add(1, Ordering::Relaxed);
        let range = chunk.range();
        let (earlier, held_set): (Vec<watch::Receiver<bool>>, _) = {
            let mut inodes = lock(&self.inodes);
            let st = inodes
                .entry(file.ino)
                .or_insert_with(|| InodeState::new(file.generation.clone()));
            let earlier = st
                .in_flight
                .iter()
                .filter(|i| i.carries_set || overlaps(&i.range, &range))
                .map(|i| i.done.clone())
                .collect();
            let held_set = match st.held_set.take() {
                Some((fh, set)) if fh == file.fh => Some(set),
                other => {
                    st.held_set = other;
                    None
                }
            };
            st.in_flight.push(InFlight {
                id: write,
                range,
                carries_set: held_set.is_some(),
                done: done.clone(),
            });
            (earlier, held_set)
        };
        lock(&file.outcome.in_flight).push(done);
        let agent = self.agent.clone();
        let inodes = self.inodes.clone();
        let outcome = file.outcome.clone();
        let generation = file.generation.clone();
        let ino = file.ino;
        tokio::spawn(async move {
            for mut w in earlier {
                let _ = w.wait_for(|done| *done).await;
            }
            match send_write(&agent, ino, chunk.offset, chunk.data, held_set).await {
                Ok(FsResponse::Attr(_) | FsResponse::Entry(_) | FsResponse::Done) => {}
                Ok(other) => {
                    tracing::warn!(
                        ino,
                        "unexpected answer to write: {}",
                        super::ops::kind(&other)
                    );
                    outcome.fail(Errno::EIO);
                }
                Err(e) => outcome.fail(e),
            }
            generation.fetch_add(1, Ordering::AcqRel);
            {
                let mut inodes = lock(&inodes);
                if let Some(st) = inodes.get_mut(&ino) {
                    st.in_flight.retain(|i| i.id != write);
                    if st.is_idle() {
                        inodes.remove(&ino);
                    }
                }
            }
            drop(budget);
            drop(lane);
            let _ = done_tx.send(true);
        });
    }
}

/// Sends `data` at `offset` of `ino`, and `set` after it: in one request to an agent of
/// protocol 11 on, as a write and a setattr to an older one (an agent rolled back while
/// the set was held: its refusal names its version, and the bytes are sent again).
async fn send_write(
    agent: &Agent,
    ino: Ino,
    offset: u64,
    data: Vec<u8>,
    set: Option<SetAttr>,
) -> Result<FsResponse, Errno> {
    let id = agent.next_id();
    let Some(set) = set else {
        return agent
            .fs(FsRequest::Write {
                id,
                ino,
                offset,
                data,
            })
            .await;
    };
    if agent.speaks(WRITE_THEN_SET_SINCE) {
        let request = FsRequest::WriteThenSet {
            id,
            ino,
            set: set.clone(),
            offset,
            data: data.clone(),
        };
        let answer = agent.fs(request).await;
        if answer.is_ok() || agent.speaks(WRITE_THEN_SET_SINCE) {
            return answer;
        }
        tracing::info!(
            ino,
            "the agent no longer takes a setattr with a write; sending them apart"
        );
    }
    let write = FsRequest::Write {
        id: agent.next_id(),
        ino,
        offset,
        data,
    };
    agent.fs(write).await?;
    let id = agent.next_id();
    agent.fs(FsRequest::SetAttr { id, ino, set }).await
}

/// `later` over `earlier`: the fields `later` sets win.
fn merged(earlier: SetAttr, later: &SetAttr) -> SetAttr {
    SetAttr {
        perm: later.perm.or(earlier.perm),
        uid: later.uid.or(earlier.uid),
        gid: later.gid.or(earlier.gid),
        size: later.size.or(earlier.size),
        atime: later.atime.or(earlier.atime),
        mtime: later.mtime.or(earlier.mtime),
    }
}

/// Takes `n` permits out of `held` (none when it holds fewer).
fn split(held: &mut Option<OwnedSemaphorePermit>, n: usize) -> Option<OwnedSemaphorePermit> {
    let p = held.as_mut()?;
    if p.num_permits() == n {
        return held.take();
    }
    p.split(n)
}

impl OpenFile {
    fn take_error(&self) -> Result<(), Errno> {
        self.outcome.take_error()
    }

    fn error(&self) -> Result<(), Errno> {
        match *lock(&self.outcome.error) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn fail(&self, e: Errno) {
        self.outcome.fail(e);
    }
}

impl Outcome {
    fn fail(&self, e: Errno) {
        let mut error = lock(&self.error);
        if error.is_none() {
            *error = Some(e);
            self.told_write.store(false, Ordering::Release);
        }
        self.failures.fetch_add(1, Ordering::AcqRel);
    }

    fn take_error(&self) -> Result<(), Errno> {
        match lock(&self.error).take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::{attr_answer, fake_agent, socket_path};
    use super::*;
    use shoal_agent_api::{FsError, Request, Response};
    use std::time::Duration;
    use tokio::sync::mpsc;

    const STRIPE: u64 = 64 << 10;

    fn files(name: &str, write_buffer: u64) -> (OpenFiles, mpsc::UnboundedReceiver<Request>) {
        files_answering(name, write_buffer, |r| Some(attr_answer(r)))
    }

    fn files_answering(
        name: &str,
        write_buffer: u64,
        answer: impl Fn(&Request) -> Option<Response> + Clone + Send + Sync + 'static,
    ) -> (OpenFiles, mpsc::UnboundedReceiver<Request>) {
        let sock = socket_path(name);
        let (tx, seen) = mpsc::unbounded_channel();
        fake_agent(sock.clone(), tx, answer);
        let agent = Arc::new(Agent::new(sock, Duration::from_secs(5)));
        (OpenFiles::new(agent, STRIPE, 0, write_buffer), seen)
    }

    /// The (offset, length) of every Write the agent got so far, in arrival order.
    fn writes(seen: &mut mpsc::UnboundedReceiver<Request>) -> Vec<(u64, usize)> {
        let mut out = Vec::new();
        while let Ok(r) = seen.try_recv() {
            if let Request::Fs(FsRequest::Write { offset, data, .. }) = r {
                out.push((offset, data.len()));
            }
        }
        out
    }

    #[tokio::test]
    async fn sequential_writes_reach_the_agent_as_chunks_of_whole_stripes_and_flush_sends_the_rest()
    {
        let (files, mut seen) = files("seq", 1 << 30);
        let f = files.open(1, 5);
        for i in 0..40u64 {
            let n = files.write(&f, i * (16 << 10), &[i as u8; 16 << 10]).await;
            assert_eq!(n, Ok(16 << 10));
        }
        assert!(files.has_pending(5));
        assert_eq!(files.flush(&f).await, Ok(()));
        assert!(!files.has_pending(5));
        let mut got = writes(&mut seen);
        got.sort();
        let chunk = (STRIPE * WRITE_STRIPES) as usize;
        assert_eq!(
            got,
            vec![
                (0, chunk),
                (chunk as u64, chunk),
                (2 * chunk as u64, chunk / 2)
            ]
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_flush_beside_another_waits_for_the_write_the_other_sent() {
        use std::sync::atomic::AtomicBool;
        let answered = Arc::new(AtomicBool::new(false));
        let flag = answered.clone();
        let (files, _seen) = files_answering("beside", 1 << 30, move |r| {
            if let Request::Fs(FsRequest::Write { .. }) = r {
                // The write stays in flight a while.
                std::thread::sleep(Duration::from_millis(300));
                flag.store(true, Ordering::Release);
            }
            Some(attr_answer(r))
        });
        let files = Arc::new(files);
        let f = files.open(1, 5);
        files.write(&f, 0, &[7; 100]).await.expect("write");
        // A getattr's flush sends the buffer and waits for it...
        let first = tokio::spawn({
            let files = files.clone();
            async move { files.flush_inode(5).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        // ...and the close's flush beside it must wait for that write too.
        assert_eq!(files.flush(&f).await, Ok(()));
        assert!(
            answered.load(Ordering::Acquire),
            "the flush returned before its handle's write was answered"
        );
        first.await.expect("joined");
    }

    /// What reached the agent, in arrival order: `W` a write (offset, length), `S` a
    /// write with a set riding on it, `A` a setattr alone.
    fn requests(seen: &mut mpsc::UnboundedReceiver<Request>) -> Vec<(char, u64, usize)> {
        let mut out = Vec::new();
        while let Ok(r) = seen.try_recv() {
            match r {
                Request::Fs(FsRequest::Write { offset, data, .. }) => {
                    out.push(('W', offset, data.len()))
                }
                Request::Fs(FsRequest::WriteThenSet { offset, data, .. }) => {
                    out.push(('S', offset, data.len()))
                }
                Request::Fs(FsRequest::SetAttr { .. }) => out.push(('A', 0, 0)),
                _ => {}
            }
        }
        out
    }

    fn times(secs: i64) -> SetAttr {
        let at = shoal_agent_api::SetTime::At(shoal_agent_api::Timestamp { secs, nanos: 0 });
        SetAttr {
            atime: Some(at),
            mtime: Some(at),
            ..SetAttr::default()
        }
    }

    #[tokio::test]
    async fn a_setattr_after_a_small_write_rides_with_its_bytes_and_merges_with_the_next() {
        let (files, mut seen) = files_answering("held", 1 << 30, |r| Some(attr_answer(r)));
        let f = files.open(1, 5);
        files.write(&f, 0, &[7; 100]).await.expect("write");
        let first = files.hold_set(5, &times(1_000)).await;
        assert_eq!(first, Some((100, times(1_000))));
        let mode = SetAttr {
            perm: Some(0o644),
            ..SetAttr::default()
        };
        let both = SetAttr {
            perm: Some(0o644),
            ..times(1_000)
        };
        assert_eq!(
            files.hold_set(5, &mode).await,
            Some((100, both)),
            "the set held is both merged: the answer shows the times too"
        );
        assert!(files.has_pending(5), "a held set is pending");
        assert!(
            requests(&mut seen).is_empty(),
            "nothing sent before the flush"
        );
        files.flush(&f).await.expect("flush");
        assert!(!files.has_pending(5));
        assert_eq!(requests(&mut seen), vec![('S', 0, 100)]);
        let held = lock(&files.inodes)
            .get(&5)
            .and_then(|st| st.held_set.clone());
        assert_eq!(held, None);
    }

    #[tokio::test]
    async fn the_set_that_rides_is_both_sets_merged_the_later_one_winning() {
        let (tx, mut got) = mpsc::unbounded_channel();
        let (files, _seen) = files_answering("merged", 1 << 30, move |r| {
            if let Request::Fs(FsRequest::WriteThenSet { set, .. }) = r {
                let _ = tx.send(set.clone());
            }
            Some(attr_answer(r))
        });
        let f = files.open(1, 5);
        files.write(&f, 0, &[7; 10]).await.expect("write");
        let first = SetAttr {
            perm: Some(0o600),
            ..times(5)
        };
        files.hold_set(5, &first).await.expect("held");
        let second = SetAttr {
            perm: Some(0o644),
            uid: Some(7),
            ..SetAttr::default()
        };
        files.hold_set(5, &second).await.expect("held");
        files.flush(&f).await.expect("flush");
        let sent = got.try_recv().expect("a set rode with the write");
        assert_eq!(
            sent,
            SetAttr {
                perm: Some(0o644),
                uid: Some(7),
                ..times(5)
            }
        );
    }

    #[tokio::test]
    async fn a_write_after_a_held_set_commits_the_set_first() {
        let (files, mut seen) = files("held-then-write", 1 << 30);
        let f = files.open(1, 5);
        files.write(&f, 0, &[7; 100]).await.expect("write");
        files.hold_set(5, &times(1)).await.expect("held");
        // Right after the buffered bytes: it must not join them under the set.
        files.write(&f, 100, &[8; 10]).await.expect("write");
        files.flush(&f).await.expect("flush");
        assert_eq!(requests(&mut seen), vec![('S', 0, 100), ('W', 100, 10)]);
    }

    /// A write after a held set that is already on its way (a stat's flush sent it)
    /// is committed after it, even where their bytes do not overlap.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_after_a_set_on_its_way_is_sent_after_it_is_answered() {
        let (files, mut seen) = files_answering("set-on-its-way", 1 << 30, |r| {
            if let Request::Fs(FsRequest::WriteThenSet { .. }) = r {
                std::thread::sleep(Duration::from_millis(300));
            }
            Some(attr_answer(r))
        });
        let files = Arc::new(files);
        let f = files.open(1, 5);
        files.write(&f, 0, &[7; 100]).await.expect("write");
        files.hold_set(5, &times(1)).await.expect("held");
        let stat = tokio::spawn({
            let files = files.clone();
            async move { files.flush_inode(5).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        files.write(&f, 4096, &[8; 10]).await.expect("write");
        files.flush(&f).await.expect("flush");
        stat.await.expect("joined");
        assert_eq!(requests(&mut seen), vec![('S', 0, 100), ('W', 4096, 10)]);
    }

    /// The agent was rolled back to protocol 10 while a set was held: the bytes and the
    /// set reach it as a write and a setattr, nothing is lost.
    #[tokio::test]
    async fn a_held_set_reaches_an_agent_rolled_back_to_protocol_10_as_a_write_and_a_setattr() {
        use super::super::testkit::old_agent;
        let (files, mut seen) = files("rolled-back", 1 << 30);
        let f = files.open(1, 5);
        files.write(&f, 0, &[7; 100]).await.expect("write");
        files.hold_set(5, &times(1)).await.expect("held");
        let sock = files.agent.socket().to_owned();
        let (tx, mut old_seen) = mpsc::unbounded_channel();
        let _old = old_agent(sock, 10, tx);
        // The new agent's connections are gone with it.
        files.agent.forget_connections();
        files.flush(&f).await.expect("nothing lost");
        assert!(requests(&mut seen).is_empty());
        assert_eq!(requests(&mut old_seen), vec![('W', 0, 100), ('A', 0, 0)]);
    }

    #[tokio::test]
    async fn a_setattr_is_not_held_without_one_handle_s_buffer_to_ride_with() {
        let (files, mut seen) = files("not-held", 1 << 30);
        let (a, b) = (files.open(1, 5), files.open(2, 5));
        assert_eq!(files.hold_set(5, &times(1)).await, None, "nothing buffered");
        files.write(&a, 0, &[1; 10]).await.expect("write a");
        files.write(&b, 100, &[2; 10]).await.expect("write b");
        assert_eq!(
            files.hold_set(5, &times(1)).await,
            None,
            "two handles buffer"
        );
        files.flush(&b).await.expect("flush b");
        let size = SetAttr {
            size: Some(0),
            ..SetAttr::default()
        };
        assert_eq!(files.hold_set(5, &size).await, None, "a truncate");
        assert_eq!(files.hold_set(5, &times(1)).await, Some((10, times(1))));
        files.flush(&a).await.expect("flush a");
        assert_eq!(requests(&mut seen), vec![('W', 100, 10), ('S', 0, 10)]);
    }

    #[tokio::test]
    async fn a_held_set_whose_buffer_went_out_another_way_is_sent_alone() {
        let (files, mut seen) = files("alone", 1 << 30);
        let f = files.open(1, 5);
        files.write(&f, 0, &[1; 10]).await.expect("write");
        files.hold_set(5, &times(1)).await.expect("held");
        // As if the buffer had been sent without taking the set along.
        let chunk = f.writer.lock().await.coalescer.take();
        assert!(chunk.is_some());
        f.buffered.store(0, Ordering::Release);
        files.flush_inode(5).await;
        assert_eq!(requests(&mut seen), vec![('A', 0, 0)]);
        assert!(!files.has_pending(5));
    }

    #[tokio::test]
    async fn a_failed_write_is_reported_by_the_next_write_and_every_flush_until_an_fsync() {
        let (files, _seen) = files_answering("fail", 1 << 30, |r| match r {
            Request::Fs(FsRequest::Write { .. }) => {
                Some(Response::Fs(FsResponse::Error(FsError::NoSpace)))
            }
            r => Some(attr_answer(r)),
        });
        let f = files.open(1, 5);
        assert_eq!(files.write(&f, 0, b"hello").await, Ok(5));
        // The flush of a child's copy of the descriptor (closed at its exec) hears of
        // it first; the writer's own fsync and close must still.
        assert_eq!(files.flush(&f).await, Err(Errno::ENOSPC));
        assert_eq!(files.write(&f, 5, b"more").await, Err(Errno::ENOSPC));
        assert_eq!(
            files.write(&f, 5, b"more").await,
            Ok(4),
            "one write hears of it, the next goes on"
        );
        assert_eq!(files.flush(&f).await, Err(Errno::ENOSPC));
        assert_eq!(files.fsync(&f).await, Err(Errno::ENOSPC));
        assert_eq!(files.fsync(&f).await, Ok(()), "reported once by fsync");
        assert_eq!(files.flush(&f).await, Ok(()));
    }

    #[tokio::test]
    async fn an_overlapping_write_on_another_handle_lands_after_the_buffered_one() {
        let (files, mut seen) = files("overlap", 1 << 30);
        let a = files.open(1, 5);
        let b = files.open(2, 5);
        files.write(&a, 0, &[1; 100]).await.expect("write a");
        files.write(&b, 50, &[2; 100]).await.expect("write b");
        files.flush(&b).await.expect("flush b");
        files.flush(&a).await.expect("flush a");
        assert_eq!(writes(&mut seen), vec![(0, 100), (50, 100)]);
    }

    #[tokio::test]
    async fn fsync_covers_writes_buffered_through_another_handle_of_the_file() {
        let (files, mut seen) = files("fsync", 1 << 30);
        let a = files.open(1, 5);
        let b = files.open(2, 5);
        let other = files.open(3, 6);
        files.write(&a, 0, &[1; 100]).await.expect("write a");
        files.write(&other, 0, &[3; 10]).await.expect("write other");
        assert_eq!(files.fsync(&b).await, Ok(()));
        assert_eq!(
            writes(&mut seen),
            vec![(0, 100)],
            "a's buffer, not the other file's"
        );
        assert!(!files.has_pending(5));
        assert!(files.has_pending(6));
    }

    #[tokio::test]
    async fn fsync_reports_a_failed_write_through_another_handle() {
        let (files, _seen) = files_answering("fsync-fail", 1 << 30, |r| match r {
            Request::Fs(FsRequest::Write { .. }) => {
                Some(Response::Fs(FsResponse::Error(FsError::NoSpace)))
            }
            r => Some(attr_answer(r)),
        });
        let a = files.open(1, 5);
        let b = files.open(2, 5);
        files.write(&a, 0, b"lost").await.expect("write a");
        assert_eq!(files.fsync(&b).await, Err(Errno::ENOSPC));
        assert_eq!(
            files.flush(&a).await,
            Err(Errno::ENOSPC),
            "a still hears of it"
        );
        assert_eq!(files.fsync(&b).await, Ok(()), "reported to b once");
        let c = files.open(3, 5);
        files
            .write(&a, 0, b"lost again")
            .await
            .expect_err("a hears of it");
        files.write(&a, 0, b"lost again").await.expect("a goes on");
        assert_eq!(files.fsync(&c).await, Err(Errno::ENOSPC), "a later failure");
        assert_eq!(files.fsync(&b).await, Err(Errno::ENOSPC), "a later failure");
        assert_eq!(files.fsync(&b).await, Ok(()));
        assert_eq!(files.fsync(&a).await, Err(Errno::ENOSPC));
    }

    #[tokio::test]
    async fn idle_partial_buffers_do_not_starve_a_writer_when_the_budget_is_spent() {
        let (files, _seen) = files("budget", 0);
        let handles: Vec<_> = (1..=20).map(|fh| files.open(fh, 100 + fh)).collect();
        let all = async {
            for f in &handles {
                files.write(f, 0, &[7; 60 << 10]).await.expect("write");
            }
        };
        tokio::time::timeout(Duration::from_secs(10), all)
            .await
            .expect("writers must not deadlock on the budget");
        for f in &handles {
            files.flush(f).await.expect("flush");
        }
    }
}
