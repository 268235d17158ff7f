//! One thread that owns an io_uring instance and performs the store's file I/O.
//!
//! Requests arrive over a channel; the thread submits everything that is waiting, waits for
//! completions, resubmits the rest of short reads and writes, and answers each request on
//! its own oneshot channel. The file and buffer of a request stay owned by the thread until
//! its completion arrives, which is what keeps the kernel's pointers valid.
#![allow(unsafe_code)]

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::mpsc;

use io_uring::{IoUring, opcode, squeue, types};
use tokio::sync::oneshot;
use tracing::error;

/// `buf[start..end]` is the part of the buffer an operation moves; `done` counts the bytes
/// already moved.
enum Op {
    Write {
        buf: Vec<u8>,
        start: usize,
        end: usize,
        done: usize,
        reply: oneshot::Sender<io::Result<()>>,
    },
    Read {
        buf: Vec<u8>,
        start: usize,
        end: usize,
        done: usize,
        reply: oneshot::Sender<io::Result<Vec<u8>>>,
    },
    Fsync {
        reply: oneshot::Sender<io::Result<()>>,
    },
}

struct Request {
    file: Arc<File>,
    offset: u64,
    op: Op,
}

/// Handle to the ring thread; cheap to clone. The thread ends when every handle is dropped.
#[derive(Clone)]
pub struct Ring {
    tx: mpsc::SyncSender<Request>,
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Ring")
    }
}

fn stopped() -> io::Error {
    io::Error::other("io_uring ring thread stopped")
}

impl Ring {
    /// Starts the ring thread with a submission queue of `entries`.
    pub fn start(entries: u32) -> io::Result<Ring> {
        let ring = IoUring::new(entries)?;
        let (tx, rx) = mpsc::sync_channel(entries as usize * 4);
        std::thread::Builder::new()
            .name("shoal-uring".into())
            .spawn(move || {
                if let Err(e) = run(ring, rx) {
                    error!(error = %e, "io_uring ring thread failed");
                }
            })?;
        Ok(Ring { tx })
    }

    fn send(&self, req: Request) -> io::Result<()> {
        self.tx.send(req).map_err(|_| stopped())
    }

    /// Writes all of `buf` at `offset`.
    pub async fn write_all(&self, file: Arc<File>, buf: Vec<u8>, offset: u64) -> io::Result<()> {
        let end = buf.len();
        self.write_range(file, buf, 0..end, offset).await
    }

    /// Writes `buf[range]` at `offset` (`range.start` lets O_DIRECT callers align the
    /// memory inside an over-allocated buffer).
    pub async fn write_range(
        &self,
        file: Arc<File>,
        buf: Vec<u8>,
        range: std::ops::Range<usize>,
        offset: u64,
    ) -> io::Result<()> {
        let (reply, rx) = oneshot::channel();
        let (start, end) = (range.start, range.end.min(buf.len()));
        let op = Op::Write {
            buf,
            start,
            end,
            done: 0,
            reply,
        };
        self.send(Request { file, offset, op })?;
        rx.await.map_err(|_| stopped())?
    }

    /// Reads up to `len` bytes at `offset`; fewer only at end of file.
    pub async fn read(&self, file: Arc<File>, len: usize, offset: u64) -> io::Result<Vec<u8>> {
        self.read_into(file, vec![0u8; len], 0, offset).await
    }

    /// Reads into `buf[start..]` at `offset`; returns what was read (fewer bytes only at end
    /// of file) without the first `start` bytes of `buf`.
    pub async fn read_into(
        &self,
        file: Arc<File>,
        buf: Vec<u8>,
        start: usize,
        offset: u64,
    ) -> io::Result<Vec<u8>> {
        let (reply, rx) = oneshot::channel();
        let end = buf.len();
        let op = Op::Read {
            buf,
            start,
            end,
            done: 0,
            reply,
        };
        self.send(Request { file, offset, op })?;
        rx.await.map_err(|_| stopped())?
    }

    /// Makes the file's data and metadata durable.
    pub async fn fsync(&self, file: Arc<File>) -> io::Result<()> {
        let (reply, rx) = oneshot::channel();
        self.send(Request {
            file,
            offset: 0,
            op: Op::Fsync { reply },
        })?;
        rx.await.map_err(|_| stopped())?
    }
}

/// The submission entry for the not-yet-done part of `req`.
fn entry(req: &mut Request, slot: usize) -> squeue::Entry {
    let fd = types::Fd(req.file.as_raw_fd());
    let e = match &mut req.op {
        Op::Write {
            buf,
            start,
            end,
            done,
            ..
        } => {
            let rest = &buf[*start + *done..*end];
            opcode::Write::new(fd, rest.as_ptr(), rest.len() as u32)
                .offset(req.offset + *done as u64)
                .build()
        }
        Op::Read {
            buf,
            start,
            end,
            done,
            ..
        } => {
            let rest = &mut buf[*start + *done..*end];
            opcode::Read::new(fd, rest.as_mut_ptr(), rest.len() as u32)
                .offset(req.offset + *done as u64)
                .build()
        }
        Op::Fsync { .. } => opcode::Fsync::new(fd).build(),
    };
    e.user_data(slot as u64)
}

fn push(ring: &mut IoUring, e: &squeue::Entry) -> io::Result<()> {
    loop {
        // SAFETY: the entry points into a buffer and file owned by a request stored in
        // `slots`, which is only released after the entry's completion has been reaped.
        if unsafe { ring.submission().push(e) }.is_ok() {
            return Ok(());
        }
        ring.submit()?;
    }
}

fn run(mut ring: IoUring, rx: mpsc::Receiver<Request>) -> io::Result<()> {
    let mut slots: Vec<Option<Request>> = Vec::new();
    let mut inflight = 0usize;
    loop {
        let mut incoming = Vec::new();
        if inflight == 0 {
            match rx.recv() {
                Ok(r) => incoming.push(r),
                Err(_) => return Ok(()),
            }
        }
        while let Ok(r) = rx.try_recv() {
            incoming.push(r);
        }
        for mut req in incoming {
            let slot = slots.iter().position(Option::is_none).unwrap_or_else(|| {
                slots.push(None);
                slots.len() - 1
            });
            let e = entry(&mut req, slot);
            slots[slot] = Some(req);
            push(&mut ring, &e)?;
            inflight += 1;
        }
        ring.submit_and_wait(1)?;
        let completions: Vec<(usize, i32)> = ring
            .completion()
            .map(|c| (c.user_data() as usize, c.result()))
            .collect();
        for (slot, res) in completions {
            let Some(mut req) = slots.get_mut(slot).and_then(Option::take) else {
                continue;
            };
            inflight -= 1;
            if complete(&mut req, res) {
                let e = entry(&mut req, slot);
                slots[slot] = Some(req);
                push(&mut ring, &e)?;
                inflight += 1;
            }
        }
    }
}

/// Applies one completion; true when the rest must be submitted again, false when the
/// request was answered.
fn complete(req: &mut Request, res: i32) -> bool {
    let failed = (res < 0).then(|| io::Error::from_raw_os_error(-res));
    let op = std::mem::replace(
        &mut req.op,
        Op::Fsync {
            reply: oneshot::channel().0,
        },
    );
    match op {
        Op::Write {
            buf,
            start,
            end,
            mut done,
            reply,
        } => {
            if let Some(e) = failed {
                let _ = reply.send(Err(e));
                return false;
            }
            if res == 0 {
                let _ = reply.send(Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    "write returned 0",
                )));
                return false;
            }
            done += res as usize;
            if start + done < end {
                req.op = Op::Write {
                    buf,
                    start,
                    end,
                    done,
                    reply,
                };
                return true;
            }
            let _ = reply.send(Ok(()));
            false
        }
        Op::Read {
            mut buf,
            start,
            end,
            mut done,
            reply,
        } => {
            if let Some(e) = failed {
                let _ = reply.send(Err(e));
                return false;
            }
            done += res as usize;
            if res > 0 && start + done < end {
                req.op = Op::Read {
                    buf,
                    start,
                    end,
                    done,
                    reply,
                };
                return true;
            }
            buf.truncate(start + done);
            buf.drain(..start);
            let _ = reply.send(Ok(buf));
            false
        }
        Op::Fsync { reply } => {
            let _ = reply.send(match failed {
                Some(e) => Err(e),
                None => Ok(()),
            });
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn write_fsync_read_round_trip_through_the_ring() {
        let ring = Ring::start(64).expect("io_uring available");
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("f");
        let file = Arc::new(
            std::fs::OpenOptions::new()
                .create(true)
                .truncate(true)
                .read(true)
                .write(true)
                .open(&path)
                .expect("open"),
        );
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        ring.write_all(file.clone(), data.clone(), 0)
            .await
            .expect("write");
        ring.fsync(file.clone()).await.expect("fsync");
        let back = ring
            .read(file.clone(), data.len() + 100, 0)
            .await
            .expect("read");
        assert_eq!(back, data, "short read at EOF must return exactly the file");
        let mid = ring.read(file, 10, 1000).await.expect("read");
        assert_eq!(mid, data[1000..1010]);
    }

    #[tokio::test]
    async fn many_concurrent_requests_complete() {
        let ring = Ring::start(8).expect("io_uring available");
        let dir = tempfile::tempdir().expect("tempdir");
        let mut tasks = Vec::new();
        for i in 0..64u8 {
            let ring = ring.clone();
            let path = dir.path().join(format!("f{i}"));
            tasks.push(tokio::spawn(async move {
                let f = Arc::new(
                    std::fs::OpenOptions::new()
                        .create(true)
                        .truncate(true)
                        .read(true)
                        .write(true)
                        .open(&path)
                        .expect("open"),
                );
                ring.write_all(f.clone(), vec![i; 70_000], 0)
                    .await
                    .expect("write");
                let back = ring.read(f, 70_000, 0).await.expect("read");
                assert!(back.iter().all(|b| *b == i));
            }));
        }
        for t in tasks {
            t.await.expect("task");
        }
    }
}
