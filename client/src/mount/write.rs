//! Write coalescing: the kernel's writes to one handle (1 MiB at most each) become
//! chunk-aligned pieces (a chunk is a few whole stripes) that the agent writes and commits
//! in one request.
//!
//! A handle buffers one contiguous range. A write that does not continue it sends the
//! buffer as it is; a buffer that reaches the next chunk boundary is sent at once. So a
//! sequential writer sends whole chunks, and a random writer sends each of its writes.

use std::ops::Range;

/// Bytes written at `offset`, not yet committed.
#[derive(Debug, PartialEq, Eq)]
pub struct Chunk {
    pub offset: u64,
    pub data: Vec<u8>,
}

impl Chunk {
    pub fn range(&self) -> Range<u64> {
        self.offset..self.end()
    }

    fn end(&self) -> u64 {
        self.offset.saturating_add(self.data.len() as u64)
    }
}

/// Whether two byte ranges share a byte.
pub fn overlaps(a: &Range<u64>, b: &Range<u64>) -> bool {
    a.start < a.end && b.start < b.end && a.start < b.end && b.start < a.end
}

/// The buffer of one open handle.
#[derive(Debug)]
pub struct Coalescer {
    chunk: u64,
    pending: Option<Chunk>,
}

/// A write of at least this much is taken for a streaming writer: its buffer is
/// allocated up to the chunk boundary at once instead of growing by doubling.
const STREAMING_WRITE: usize = 128 << 10;

impl Coalescer {
    /// `chunk`: the chunk size, whole stripes of the cluster (greater than zero).
    pub fn new(chunk: u64) -> Self {
        Coalescer {
            chunk: chunk.max(1),
            pending: None,
        }
    }

    /// Bytes buffered and not yet handed out.
    pub fn buffered(&self) -> usize {
        self.pending.as_ref().map_or(0, |p| p.data.len())
    }

    /// Takes a write; appends the chunks now ready to send to `ready`, in file order.
    pub fn push(&mut self, offset: u64, mut data: &[u8], ready: &mut Vec<Chunk>) {
        if self.pending.as_ref().is_some_and(|p| p.end() != offset)
            && let Some(p) = self.pending.take()
        {
            ready.push(p);
        }
        let mut at = offset;
        while !data.is_empty() {
            let boundary = self.next_boundary(at);
            let pending = self.pending.get_or_insert_with(|| {
                let room = usize::try_from(boundary - at).unwrap_or(usize::MAX);
                let capacity = if data.len() >= STREAMING_WRITE {
                    room
                } else {
                    data.len()
                };
                Chunk {
                    offset: at,
                    data: Vec::with_capacity(capacity),
                }
            });
            let room = usize::try_from(boundary - pending.end()).unwrap_or(usize::MAX);
            let n = room.min(data.len());
            pending.data.extend_from_slice(&data[..n]);
            data = &data[n..];
            at = at.saturating_add(n as u64);
            if pending.end() >= boundary
                && let Some(full) = self.pending.take()
            {
                ready.push(full);
            }
        }
    }

    /// The range buffered now.
    pub fn pending_range(&self) -> Option<Range<u64>> {
        self.pending.as_ref().map(Chunk::range)
    }

    /// The partial buffer, for flush, fsync and release.
    pub fn take(&mut self) -> Option<Chunk> {
        self.pending.take().filter(|p| !p.data.is_empty())
    }

    /// The first chunk boundary after `at` (`u64::MAX` at the very end).
    fn next_boundary(&self, at: u64) -> u64 {
        (at / self.chunk)
            .checked_add(1)
            .and_then(|n| n.checked_mul(self.chunk))
            .unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(n: usize, fill: u8) -> Vec<u8> {
        vec![fill; n]
    }

    fn ranges(chunks: &[Chunk]) -> Vec<Range<u64>> {
        chunks.iter().map(Chunk::range).collect()
    }

    #[test]
    fn sequential_writes_leave_as_whole_stripes() {
        let mut c = Coalescer::new(4096);
        let mut ready = Vec::new();
        for i in 0..9u64 {
            c.push(i * 1024, &bytes(1024, i as u8), &mut ready);
        }
        assert_eq!(ranges(&ready), vec![0..4096, 4096..8192]);
        assert_eq!(c.buffered(), 1024);
        assert_eq!(ready[1].data[0], 4);
        let rest = c.take().expect("partial buffer");
        assert_eq!(rest.range(), 8192..9216);
        assert!(c.take().is_none());
    }

    #[test]
    fn a_write_that_does_not_continue_the_buffer_sends_it() {
        let mut c = Coalescer::new(1 << 20);
        let mut ready = Vec::new();
        c.push(0, &bytes(100, 1), &mut ready);
        assert!(ready.is_empty());
        c.push(500, &bytes(10, 2), &mut ready);
        assert_eq!(ranges(&ready), vec![0..100]);
        c.push(0, &bytes(10, 3), &mut ready);
        assert_eq!(ranges(&ready), vec![0..100, 500..510]);
        assert_eq!(c.take().map(|c| c.range()), Some(0..10));
    }

    #[test]
    fn a_write_across_a_stripe_boundary_is_split_there() {
        let mut c = Coalescer::new(1000);
        let mut ready = Vec::new();
        c.push(900, &bytes(2300, 7), &mut ready);
        assert_eq!(ranges(&ready), vec![900..1000, 1000..2000, 2000..3000]);
        assert_eq!(c.take().map(|c| c.range()), Some(3000..3200));
    }

    #[test]
    fn empty_writes_and_the_end_of_the_offset_space_are_harmless() {
        let mut c = Coalescer::new(4096);
        let mut ready = Vec::new();
        c.push(10, &[], &mut ready);
        assert!(ready.is_empty() && c.take().is_none());
        c.push(u64::MAX - 4, &bytes(4, 1), &mut ready);
        assert_eq!(ranges(&ready), vec![u64::MAX - 4..u64::MAX]);
        assert_eq!(c.buffered(), 0);
    }

    #[test]
    fn overlap_needs_a_shared_byte() {
        assert!(overlaps(&(0..10), &(9..20)));
        assert!(!overlaps(&(0..10), &(10..20)));
        assert!(!overlaps(&(5..5), &(0..10)));
    }
}
