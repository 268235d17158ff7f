//! [`FileClient`]: what a mount does through its own node's [`FsService`] (the agent's
//! side of the mount): it creates files, writes them (inline while small, then across
//! stripes: appends, overwrites of a range), truncates some, unlinks some (their stripes
//! are freed and
//! collected), some while it holds them open (it reads them through the handle later:
//! an unlinked file stays whole while a mount holds it), and opens and reads files any
//! client wrote, checking every byte against the model. Its requests are the mount's own.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use shoal_agent::fs::FsService;
use shoal_agent_api::{
    FileKind, FsRequest, FsResponse, Owner, ROOT_INO, RequestId, SetAttr, SetTime, Timestamp,
};
use shoal_disk::SplitMix64;

use crate::cluster::Live;
use crate::model::Model;
use crate::trace::Trace;

/// How long a mount waits for a create or a write before its outcome counts as unknown.
const WRITE_WAIT: Duration = Duration::from_secs(30);
/// How long a reader waits for an open or a read before it gives up.
pub(crate) const READ_WAIT: Duration = Duration::from_secs(3);
/// The protocol a mount of this build speaks.
pub(crate) const PROTOCOL: u8 = shoal_agent_api::API_VERSION;

/// Sends change `req` of mount `session` as a mount does; one answered under a directory
/// lease (`FsResponse::Unsynced`) is synced, as an fsync of its file or directory does,
/// before it counts: the model's acknowledged changes are durable ones. A sync that
/// fails leaves the change's outcome unknown (its answer is the failure).
pub async fn change_synced(fs: &Arc<FsService>, req: FsRequest, session: u64) -> FsResponse {
    let ino = req.sync_target().unwrap_or(ROOT_INO);
    match fs.handle(req, None, PROTOCOL).await {
        FsResponse::Unsynced(answer) => {
            match fs
                .handle(FsRequest::Sync { ino, session }, None, PROTOCOL)
                .await
            {
                FsResponse::Synced { .. } => answer.into_response(),
                failed => failed,
            }
        }
        answer => answer,
    }
}

pub struct FileClient {
    pub id: u64,
    pub home: u64,
    pub rng: SplitMix64,
    pub live: Live,
    pub model: Model,
    pub trace: Trace,
    /// Files this client created and may still write.
    pub mine: Vec<String>,
    pub seq: u64,
    /// Files it unlinked while holding them open.
    pub held: crate::held::HeldFiles,
    /// Unlinks and truncations in 20 of its operations on its own files (the rest
    /// writes): more of them make more garbage for the collectors.
    pub churn_in_20: u64,
}

/// Whether a file of `len` bytes is read through one request.
pub(crate) fn read_len(len: u64) -> u32 {
    u32::try_from(len.max(1)).unwrap_or(u32::MAX)
}

impl FileClient {
    /// The mount session (and request-id client) of this client.
    pub(crate) fn session(&self) -> u64 {
        1000 + self.id
    }

    pub(crate) fn next_id(&mut self) -> RequestId {
        self.seq += 1;
        RequestId {
            client: self.session(),
            seq: self.seq,
        }
    }

    pub async fn run(mut self, stop: Arc<AtomicBool>) {
        let keepalive = tokio::spawn(self.holder().keepalive(stop.clone()));
        while !stop.load(Ordering::Acquire) {
            let pause = 50 + self.rng.below(800);
            tokio::time::sleep(Duration::from_millis(pause)).await;
            let Some(fs) = self.live.fs(self.home) else {
                continue;
            };
            if self.rng.below(5) == 0
                && let Some(handle) = self.some_held()
            {
                let release = self.rng.below(5) == 0;
                self.read_held(&fs, handle, release).await;
                continue;
            }
            let own = self.rng.below(20);
            match self.rng.below(20) {
                0..=9 if !self.mine.is_empty() => {
                    let i = self.rng.below(self.mine.len() as u64) as usize;
                    let name = self.mine[i].clone();
                    if own >= self.churn_in_20 {
                        if !self.write(&fs, &name).await {
                            self.mine.swap_remove(i);
                        }
                    } else if own % 2 == 1 {
                        if !self.truncate(&fs, &name).await {
                            self.mine.swap_remove(i);
                        }
                    } else {
                        self.mine.swap_remove(i);
                        if self.rng.below(2) == 0 {
                            self.unlink_held_open(&fs, &name).await;
                        } else {
                            self.unlink(&fs, &name).await;
                        }
                    }
                }
                0..=13 => self.create(&fs).await,
                14 if self.mine.len() >= 2 => self.rename_over(&fs).await,
                _ => {
                    let rng = &mut self.rng;
                    if let Some((name, ino)) = self.model.some_file(|n| rng.below(n.max(1))) {
                        self.read(&fs, &name, ino, None).await;
                    }
                }
            }
        }
        let _ = keepalive.await;
        self.release_all().await;
    }

    async fn create(&mut self, fs: &Arc<FsService>) {
        let name = format!("f{}-{}", self.id, self.seq + 1);
        let id = self.next_id();
        let session = self.session();
        let owner = Owner { uid: 0, gid: 0 };
        // Every other create makes and opens the file in one request, as a mount of this
        // release does (and closes it after); the rest are a bare `MkNode`. No draw of its
        // own: the seeds' streams stay as they were.
        let opens = id.seq.is_multiple_of(2);
        let req = if opens {
            FsRequest::Create {
                id,
                parent: ROOT_INO,
                name: name.clone(),
                perm: 0o644,
                owner,
                session,
                handle: id.seq,
            }
        } else {
            FsRequest::MkNode {
                id,
                parent: ROOT_INO,
                name: name.clone(),
                kind: FileKind::File,
                perm: 0o644,
                owner,
                rdev: 0,
                target: None,
            }
        };
        let made = tokio::time::timeout(WRITE_WAIT, change_synced(fs, req, session)).await;
        if opens {
            let release = FsRequest::Release {
                session,
                handle: id.seq,
            };
            let _ = tokio::time::timeout(WRITE_WAIT, fs.handle(release, None, PROTOCOL)).await;
        }
        match made {
            Ok(FsResponse::Entry(attr) | FsResponse::EntryAt { attr, .. }) => {
                self.model.file_created(&name, attr.ino);
                self.mine.push(name.clone());
                self.note(format_args!("created {name} (inode {})", attr.ino));
            }
            Ok(other) => self.note(format_args!("create {name}: unknown ({other:?})")),
            Err(_) => self.note(format_args!("create {name}: unknown (timed out)")),
        }
    }

    /// Renames one of this client's files over another of them (`rename(2)` replacing
    /// the target, as editors and checkpoint writers do): the target's old file is
    /// unlinked, and the name now names the renamed file.
    async fn rename_over(&mut self, fs: &Arc<FsService>) {
        let i = self.rng.below(self.mine.len() as u64) as usize;
        let from = self.mine.swap_remove(i);
        let j = self.rng.below(self.mine.len() as u64) as usize;
        let to = self.mine[j].clone();
        let sure = self.model.renaming(&from, &to);
        let req = FsRequest::Rename {
            id: self.next_id(),
            parent: ROOT_INO,
            name: from.clone(),
            new_parent: ROOT_INO,
            new_name: to.clone(),
            flags: Default::default(),
        };
        let session = self.session();
        match tokio::time::timeout(WRITE_WAIT, change_synced(fs, req, session)).await {
            Ok(FsResponse::Done) => {
                self.model.renamed(&to, sure);
                self.note(format_args!("renamed {from} over {to}"));
            }
            Ok(other) => self.note(format_args!("rename {from} over {to}: unknown ({other:?})")),
            Err(_) => self.note(format_args!("rename {from} over {to}: unknown (timed out)")),
        }
    }

    /// Unlinks file `name`: from now on no read picks it, and the end does not check it.
    pub(crate) async fn unlink(&mut self, fs: &Arc<FsService>, name: &str) {
        self.model.file(name, false, |h, _| h.unlinked = true);
        let req = FsRequest::Unlink {
            id: self.next_id(),
            parent: ROOT_INO,
            name: name.to_owned(),
        };
        let session = self.session();
        match tokio::time::timeout(WRITE_WAIT, change_synced(fs, req, session)).await {
            Ok(FsResponse::Done) => self.note(format_args!("unlinked {name}")),
            Ok(other) => self.note(format_args!("unlink {name}: unknown ({other:?})")),
            Err(_) => self.note(format_args!("unlink {name}: unknown (timed out)")),
        }
    }

    /// Writes file `name` once: an append or an overwrite, of a size that keeps it inline
    /// or takes it to stripes. False once its outcome is unknown (the file is written no
    /// more).
    async fn write(&mut self, fs: &Arc<FsService>, name: &str) -> bool {
        let Some((ino, len)) = self
            .model
            .file(name, false, |h, _| (h.ino, h.newest().len() as u64))
        else {
            return false;
        };
        let size = match self.rng.below(10) {
            0..=4 => 1 + self.rng.below(4096),
            5..=7 => 4096 + self.rng.below(60 << 10),
            _ => (64 << 10) + self.rng.below(256 << 10),
        };
        let offset = if len > 0 && self.rng.below(3) == 0 {
            self.rng.below(len)
        } else {
            len
        };
        let mut data = vec![0u8; size as usize];
        for chunk in data.chunks_mut(8) {
            let word = self.rng.next_u64().to_le_bytes();
            chunk.copy_from_slice(&word[..chunk.len()]);
        }
        self.model
            .file(name, false, |h, _| h.writing(offset, &data));
        // Every fifth size (no draw of its own: the seeds' streams stay as they were)
        // carries a setattr in the same entry, as a mount sends a copy's times and mode.
        let id = self.next_id();
        let req = if size % 5 == 0 {
            let at = SetTime::At(Timestamp {
                secs: size as i64,
                nanos: 0,
            });
            let set = SetAttr {
                perm: Some(0o600 | (size as u16 & 0o77)),
                mtime: Some(at),
                ..SetAttr::default()
            };
            FsRequest::WriteThenSet {
                id,
                ino,
                set,
                offset,
                data,
            }
        } else {
            FsRequest::Write {
                id,
                ino,
                offset,
                data,
            }
        };
        let done = format!("wrote {name}: {size} bytes at {offset}");
        self.change(fs, req, name, "write", done).await
    }

    /// Sends `req`, a change of file `name` (`what` it is, `done` what it did, for the
    /// trace): acknowledged, the model's newest version is; otherwise its outcome is
    /// unknown, the file is written no more, and this says false.
    async fn change(
        &mut self,
        fs: &Arc<FsService>,
        req: FsRequest,
        name: &str,
        what: &str,
        done: String,
    ) -> bool {
        let session = self.session();
        match tokio::time::timeout(WRITE_WAIT, change_synced(fs, req, session)).await {
            Ok(FsResponse::Attr(_)) => {
                self.model.file(name, true, |h, at| h.acked(at));
                self.note(format_args!("{done}"));
                true
            }
            answer => {
                self.model.file(name, false, |h, _| h.settled = true);
                match answer {
                    Ok(other) => self.note(format_args!("{what} {name}: unknown ({other:?})")),
                    Err(_) => self.note(format_args!("{what} {name}: unknown (timed out)")),
                }
                false
            }
        }
    }

    /// Truncates file `name` to fewer bytes (the stripes past the cut are freed, and
    /// collected). False once its outcome is unknown (the file is written no more).
    async fn truncate(&mut self, fs: &Arc<FsService>, name: &str) -> bool {
        let Some((ino, len)) = self
            .model
            .file(name, false, |h, _| (h.ino, h.newest().len() as u64))
        else {
            return false;
        };
        let size = if self.rng.below(3) == 0 {
            0
        } else {
            self.rng.below(len.max(1))
        };
        self.model.file(name, false, |h, _| h.truncating(size));
        let req = FsRequest::SetAttr {
            id: self.next_id(),
            ino,
            set: SetAttr {
                size: Some(size),
                ..SetAttr::default()
            },
        };
        let done = format!("truncated {name} to {size} bytes");
        self.change(fs, req, name, "truncate", done).await
    }

    /// Reads file `name` back until a read succeeds or `deadline` passes (one try at
    /// least): it must be the newest acknowledged version or newer. False if no read
    /// succeeded.
    pub async fn read_back(
        &mut self,
        fs: &Arc<FsService>,
        name: &str,
        ino: u64,
        deadline: tokio::time::Instant,
    ) -> bool {
        loop {
            if self.read(fs, name, ino, Some(u64::MAX)).await {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Opens file `name` (inode `ino`) through this client's node, reads it whole and
    /// closes it, then checks what it read. `began`: the event the check counts from
    /// (None: now). False if it could not be read.
    async fn read(
        &mut self,
        fs: &Arc<FsService>,
        name: &str,
        ino: u64,
        began: Option<u64>,
    ) -> bool {
        let began = began.unwrap_or_else(|| self.model.event());
        let handle = self.next_id().seq;
        let session = self.session();
        let open = FsRequest::Open {
            ino,
            session,
            handle,
            synced: false,
        };
        let size = match tokio::time::timeout(READ_WAIT, fs.handle(open, None, PROTOCOL)).await {
            Ok(
                FsResponse::Opened { attr, .. }
                | FsResponse::OpenedIn { attr, .. }
                | FsResponse::Attr(attr),
            ) => attr.size,
            Ok(other) => {
                self.note(format_args!("open {name}: {other:?}"));
                return false;
            }
            Err(_) => return false,
        };
        let read = tokio::time::timeout(READ_WAIT, fs.read(ino, 0, read_len(size))).await;
        let release = FsRequest::Release { session, handle };
        let _ = fs.handle(release, None, PROTOCOL).await;
        let bytes: Vec<u8> = match read {
            Ok(Ok(parts)) => parts.iter().flat_map(|p| p.iter().copied()).collect(),
            Ok(Err(e)) => {
                self.note(format_args!("read {name}: failed ({e})"));
                return false;
            }
            Err(_) => return false,
        };
        self.note(format_args!("read {name}: {} bytes", bytes.len()));
        if let Some(v) = self
            .model
            .check_file_read(name, ino, began, &bytes, self.home)
        {
            self.trace.note(format_args!("VIOLATION {v}"));
        }
        true
    }

    pub(crate) fn note(&self, what: std::fmt::Arguments<'_>) {
        self.trace.note(format_args!(
            "file client {} through node {}: {what}",
            self.id, self.home
        ));
    }
}
