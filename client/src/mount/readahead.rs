//! Read-ahead for sequential readers.
//!
//! A handle whose reads follow each other ([`RUN`] in a row) reads whole chunks
//! (`--read-ahead` rounded up to whole stripes, at chunk-aligned offsets) and serves the
//! kernel's reads from them; once a chunk has arrived in full, the next two are fetched in
//! the background, while the mount holds fewer than [`PREFETCHED_CHUNKS`] such chunks in
//! all. Random reads go straight to the agent. Any write to the inode through this mount
//! drops the chunks, and a read through the mount first commits its own pending writes.
//!
//! A read counts as following the previous one when it starts within 512 KiB of its end
//! ([`NEAR_SLACK`]; a random reader lands that near once in about a thousand reads of a
//! 1 GiB file). A read within one chunk is a slice of it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::{Bytes, BytesMut};
use fuser::Errno;
use shoal_agent_api::{FsRequest, FsResponse, Ino};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

use super::agent::Agent;

/// Detects sequential reading. Pure: reads in, a plan out.
#[derive(Debug)]
pub struct Window {
    chunk: u64,
    /// The end of the previous read, once there was one.
    next: Option<u64>,
    streak: u32,
}

/// How far from the previous read's end a read still counts as sequential (the kernel's
/// own read-ahead requests are at most a few hundred KiB apart).
const NEAR_SLACK: u64 = 512 << 10;

/// How many reads in a row must each land near the previous one for chunks to be used: a
/// random reader of a large file lands near its previous read now and then (one 4 KiB
/// read in about a thousand of a 1 GiB file), and each such read would fetch a chunk and
/// two more ahead (24 MiB by default) for 4 KiB; two in a row, about one in a million.
/// A sequential reader pays one more direct read at its start.
const RUN: u32 = 2;

/// How to serve one read.
#[derive(Debug, PartialEq, Eq)]
pub enum Plan {
    /// Ask the agent for exactly these bytes.
    Direct,
    /// Serve from chunks `first..=last` (chunk `i` holds `[i × chunk, (i + 1) × chunk)`).
    Chunks { first: u64, last: u64 },
}

impl Window {
    /// `chunk` 0 turns read-ahead off.
    pub fn new(chunk: u64) -> Self {
        Window {
            chunk,
            next: None,
            streak: 0,
        }
    }

    pub fn chunk(&self) -> u64 {
        self.chunk
    }

    pub fn plan(&mut self, offset: u64, len: u32) -> Plan {
        let end = offset.saturating_add(u64::from(len));
        // The kernel issues its own read-ahead asynchronously, so reads of one sequential
        // stream may arrive slightly out of order: "near the previous end" counts. Near is
        // at most NEAR_SLACK, not a whole chunk: a random reader landing within a chunk of
        // its previous read must not pay for fetching the chunk.
        let slack = self.chunk.clamp(1, NEAR_SLACK);
        let near = self.next.is_some_and(|next| offset.abs_diff(next) <= slack);
        self.streak = if near {
            self.streak.saturating_add(1)
        } else {
            0
        };
        self.next = Some(match self.next {
            Some(next) if near => next.max(end),
            _ => end,
        });
        if self.chunk == 0 || self.streak < RUN || len == 0 {
            return Plan::Direct;
        }
        Plan::Chunks {
            first: offset / self.chunk,
            last: (end - 1) / self.chunk,
        }
    }
}

type Fetched = Option<Result<Bytes, Errno>>;

struct Fetch {
    index: u64,
    result: watch::Receiver<Fetched>,
    /// A share of the mount's prefetch budget, for a chunk fetched ahead of its reader.
    _budget: Option<OwnedSemaphorePermit>,
}

/// Chunks fetched ahead across the whole mount (bounds read-ahead memory).
pub const PREFETCHED_CHUNKS: usize = 32;

/// A handle's chunks and its sequential-read detector.
pub struct ReadCache {
    window: Window,
    /// The inode's write generation the chunks were fetched under.
    generation: u64,
    chunks: Vec<Fetch>,
}

/// Chunks fetched ahead of the one being read, per handle: with two in flight, the next
/// fetch overlaps the one before instead of starting when the reader gets there.
const AHEAD: u64 = 2;
/// Chunks kept per handle: the one being read, those ahead, one behind for stragglers.
const MAX_CHUNKS: usize = AHEAD as usize + 2;

impl ReadCache {
    pub fn new(chunk: u64) -> Self {
        ReadCache {
            window: Window::new(chunk),
            generation: 0,
            chunks: Vec::new(),
        }
    }
}

/// Reads `[offset, offset + size)` of `ino` through the handle's cache. A read within one
/// chunk is a slice of it, not a copy.
pub async fn read(
    cache: &tokio::sync::Mutex<ReadCache>,
    generation: &AtomicU64,
    prefetch_budget: &Arc<Semaphore>,
    agent: &Arc<Agent>,
    ino: Ino,
    offset: u64,
    size: u32,
) -> Result<Bytes, Errno> {
    let mut c = cache.lock().await;
    let now = generation.load(Ordering::Acquire);
    if c.generation != now {
        c.chunks.clear();
        c.generation = now;
    }
    let (first, last) = match c.window.plan(offset, size) {
        Plan::Direct => {
            drop(c);
            return read_direct(agent, ino, offset, size).await;
        }
        Plan::Chunks { first, last } => (first, last),
    };
    let chunk = c.window.chunk();
    c.chunks.retain(|f| f.index + 1 >= first);
    let mut needed = Vec::new();
    for index in first..=last {
        let rx = match c.chunks.iter().find(|f| f.index == index) {
            Some(f) => f.result.clone(),
            None => fetch(&mut c, agent, ino, (index, chunk), None),
        };
        needed.push((index, rx));
    }
    drop(c);
    let end = offset.saturating_add(u64::from(size));
    let mut pieces = Vec::with_capacity(needed.len());
    let mut last_full = false;
    for (index, mut rx) in needed {
        let data = match rx.wait_for(Option::is_some).await.map(|r| r.clone()) {
            Ok(Some(Ok(data))) => data,
            Ok(Some(Err(e))) => {
                cache.lock().await.chunks.retain(|f| f.index != index);
                return Err(e);
            }
            _ => return Err(Errno::EIO),
        };
        let start = index * chunk;
        let from = (offset.max(start) - start) as usize;
        let to = ((end.min(start + chunk) - start) as usize).min(data.len());
        if from < to {
            pieces.push(data.slice(from..to));
        }
        last_full = data.len() as u64 == chunk;
        if (data.len() as u64) < chunk {
            break; // the file ends in this chunk
        }
    }
    if last_full {
        let mut c = cache.lock().await;
        if c.generation == now {
            for next in last + 1..=last + AHEAD {
                if c.chunks.iter().any(|f| f.index == next) {
                    continue;
                }
                let Ok(permit) = prefetch_budget.clone().try_acquire_owned() else {
                    break;
                };
                fetch(&mut c, agent, ino, (next, chunk), Some(permit));
            }
        }
        while c.chunks.len() > MAX_CHUNKS {
            c.chunks.remove(0);
        }
    }
    Ok(joined(pieces))
}

/// One piece as it is; several (a read across chunks) copied into one.
fn joined(mut pieces: Vec<Bytes>) -> Bytes {
    if pieces.len() <= 1 {
        return pieces.pop().unwrap_or_default();
    }
    let mut out = BytesMut::with_capacity(pieces.iter().map(Bytes::len).sum());
    for piece in &pieces {
        out.extend_from_slice(piece);
    }
    out.freeze()
}

/// Starts fetching chunk `index` (of `chunk` bytes) into the cache; its result.
fn fetch(
    c: &mut ReadCache,
    agent: &Arc<Agent>,
    ino: Ino,
    (index, chunk): (u64, u64),
    budget: Option<OwnedSemaphorePermit>,
) -> watch::Receiver<Fetched> {
    let (tx, rx) = watch::channel(None);
    let agent = agent.clone();
    let len = u32::try_from(chunk).unwrap_or(u32::MAX);
    tokio::spawn(async move {
        let result = read_direct(&agent, ino, index * chunk, len).await;
        let _ = tx.send(Some(result));
    });
    c.chunks.push(Fetch {
        index,
        result: rx.clone(),
        _budget: budget,
    });
    c.chunks.sort_by_key(|f| f.index);
    rx
}

/// One `Read` request; more bytes than asked for are cut off.
pub async fn read_direct(agent: &Agent, ino: Ino, offset: u64, len: u32) -> Result<Bytes, Errno> {
    match agent.fs(FsRequest::Read { ino, offset, len }).await? {
        FsResponse::Data(mut data) => {
            data.truncate(len as usize);
            Ok(Bytes::from(data))
        }
        other => {
            tracing::warn!(
                ino,
                "unexpected answer to read: {}",
                super::ops::kind(&other)
            );
            Err(Errno::EIO)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_within_one_chunk_is_that_chunk_and_pieces_join_in_order() {
        let chunk = Bytes::from(vec![7u8; 16]);
        let one = joined(vec![chunk.slice(4..8)]);
        assert_eq!(&one[..], &[7u8; 4]);
        // The same memory, not a copy.
        assert_eq!(one.as_ptr(), chunk[4..].as_ptr());
        let two = joined(vec![Bytes::from_static(b"ab"), Bytes::from_static(b"cd")]);
        assert_eq!(&two[..], b"abcd");
        assert!(joined(Vec::new()).is_empty());
    }

    #[test]
    fn the_first_two_reads_go_direct_and_the_third_of_a_run_uses_chunks() {
        let mut w = Window::new(1 << 20);
        assert_eq!(w.plan(0, 4096), Plan::Direct);
        assert_eq!(w.plan(4096, 4096), Plan::Direct);
        assert_eq!(w.plan(8192, 4096), Plan::Chunks { first: 0, last: 0 });
        assert_eq!(
            w.plan(8192, (1 << 20) - 8192 + 100),
            Plan::Chunks { first: 0, last: 1 }
        );
    }

    #[test]
    fn a_jump_resets_to_direct_reads() {
        let mut w = Window::new(1 << 20);
        w.plan(0, 4096);
        w.plan(4096, 4096);
        assert!(matches!(w.plan(8192, 4096), Plan::Chunks { .. }));
        assert_eq!(w.plan(500 << 20, 4096), Plan::Direct);
        assert_eq!(w.plan(10 << 20, 4096), Plan::Direct);
        assert_eq!(w.plan((10 << 20) + 4096, 4096), Plan::Direct);
        assert_eq!(
            w.plan((10 << 20) + 8192, 4096),
            Plan::Chunks {
                first: 10,
                last: 10
            }
        );
    }

    #[test]
    fn slightly_reordered_reads_still_count_as_sequential() {
        let mut w = Window::new(1 << 20);
        w.plan(0, 128 << 10);
        w.plan(256 << 10, 128 << 10);
        assert!(matches!(w.plan(128 << 10, 128 << 10), Plan::Chunks { .. }));
        assert!(matches!(w.plan(384 << 10, 128 << 10), Plan::Chunks { .. }));
    }

    #[test]
    fn random_reads_within_a_chunk_of_each_other_stay_direct() {
        let mut w = Window::new(8 << 20);
        assert_eq!(w.plan(0, 4096), Plan::Direct);
        assert_eq!(w.plan(3 << 20, 4096), Plan::Direct);
        assert_eq!(w.plan(1 << 20, 4096), Plan::Direct);
    }

    #[test]
    fn a_random_read_that_lands_near_the_one_before_stays_direct() {
        // One random 4 KiB read in about a thousand lands within NEAR_SLACK of the one
        // before it in a 1 GiB file; each must not fetch a chunk and two more ahead.
        let mut w = Window::new(8 << 20);
        assert_eq!(w.plan(0, 4096), Plan::Direct);
        assert_eq!(w.plan(700 << 20, 4096), Plan::Direct);
        assert_eq!(w.plan((700 << 20) + (200 << 10), 4096), Plan::Direct);
        assert_eq!(w.plan(50 << 20, 4096), Plan::Direct);
    }

    #[test]
    fn read_ahead_off_always_reads_direct() {
        let mut w = Window::new(0);
        for i in 0..4 {
            assert_eq!(w.plan(i * 4096, 4096), Plan::Direct);
        }
    }

    #[test]
    fn empty_reads_go_direct() {
        let mut w = Window::new(1 << 20);
        w.plan(0, 10);
        assert_eq!(w.plan(10, 0), Plan::Direct);
    }
}
