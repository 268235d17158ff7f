//! Files a [`FileClient`] unlinked while it held them open: the handle keeps the inode (a
//! purge asks every node's mounts first), it reads them through the handle later, and a
//! keepalive announces the handles again once after its node restarted (`Reopen`), as a
//! mount does when it reconnects (`client/src/mount/agent.rs`: every 5 s while files are
//! open, once per new connection).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use shoal_agent::fs::FsService;
use shoal_agent_api::{FsError, FsRequest, FsResponse};

use crate::cluster::Live;
use crate::file_client::{FileClient, PROTOCOL, READ_WAIT, read_len};
use crate::model::Model;
use crate::trace::Trace;

/// How often a mount pings its agent while it holds files open.
const KEEPALIVE: Duration = Duration::from_secs(5);

/// An unlinked file a client holds open.
pub struct Held {
    name: String,
    ino: u64,
    handle: u64,
    /// The event before its unlink: a read through the handle sees the file as then.
    began: u64,
    /// The node's service the handle was announced to (a restarted node's is another).
    on: Arc<FsService>,
}

/// A client's held files, shared with its keepalive.
pub type HeldFiles = Arc<HeldSet>;

#[derive(Default)]
pub struct HeldSet {
    files: Mutex<Vec<Held>>,
    /// Held while handles are announced, and by a release: as the mount holds its table
    /// of handles throughout a re-open, so a handle released meanwhile is not announced
    /// again after its `Release` (the model once did that, seed 198 of `tiering`, and
    /// the agent kept the released file from the purge for good).
    announcing: tokio::sync::Mutex<()>,
}

fn lock(held: &HeldFiles) -> std::sync::MutexGuard<'_, Vec<Held>> {
    held.files.lock().unwrap_or_else(|p| p.into_inner())
}

/// Who holds the files: what the keepalive and the checks need of the client.
#[derive(Clone)]
pub struct Holder {
    pub live: Live,
    pub home: u64,
    pub session: u64,
    pub held: HeldFiles,
    pub model: Model,
    pub trace: Trace,
}

impl Holder {
    /// The mount's keepalive: once the node's service is a new one (it restarted), every
    /// held handle is announced to it once, whatever the answer (as the mount does; the
    /// agent records the claim before anything that can fail).
    pub async fn keepalive(self, stop: Arc<AtomicBool>) {
        while !stop.load(Ordering::Acquire) {
            tokio::time::sleep(KEEPALIVE).await;
            if let Some(fs) = self.live.fs(self.home) {
                self.announce(&fs).await;
            }
        }
    }

    /// Announces to `fs` the handles not announced to it yet.
    pub async fn announce(&self, fs: &Arc<FsService>) {
        let _announcing = self.held.announcing.lock().await;
        let due: Vec<(u64, u64)> = lock(&self.held)
            .iter()
            .filter(|h| !Arc::ptr_eq(&h.on, fs))
            .map(|h| (h.ino, h.handle))
            .collect();
        for (ino, handle) in due {
            let reopen = FsRequest::Reopen {
                ino,
                session: self.session,
                handle,
            };
            let answer = tokio::time::timeout(READ_WAIT, fs.handle(reopen, None, PROTOCOL)).await;
            if let Ok(FsResponse::Error(FsError::NotFound)) = answer {
                self.gone(handle, "announced again after its agent restarted");
            } else if let Some(h) = lock(&self.held).iter_mut().find(|h| h.handle == handle) {
                h.on = fs.clone();
            }
        }
    }

    /// Held file `handle` is gone: a violation unless a layout took its node out since
    /// the unlink (a node out loses its mounts' claim: `holders_to_ask` in
    /// `workers/gc.rs`). The mount drops the handle.
    fn gone(&self, handle: u64, how: &str) {
        let removed = {
            let mut held = lock(&self.held);
            let i = held.iter().position(|h| h.handle == handle);
            i.map(|i| held.swap_remove(i))
        };
        let Some(h) = removed else { return };
        self.trace.note(format_args!(
            "file client through node {}: {how}: {} is gone",
            self.home, h.name
        ));
        if self.model.out_since(self.home, h.began) {
            return;
        }
        let v = format!(
            "node {}, file {}: purged while a mount held it open ({how})",
            self.home, h.name
        );
        self.trace.note(format_args!("VIOLATION {v}"));
        self.model.violation(v);
    }
}

impl FileClient {
    pub(crate) fn holder(&self) -> Holder {
        Holder {
            live: self.live.clone(),
            home: self.home,
            session: self.session(),
            held: self.held.clone(),
            model: self.model.clone(),
            trace: self.trace.clone(),
        }
    }

    /// Opens file `name`, unlinks it and keeps the handle (see [`Held`]).
    pub(crate) async fn unlink_held_open(&mut self, fs: &Arc<FsService>, name: &str) {
        let Some(ino) = self.model.file(name, false, |h, _| h.ino) else {
            return;
        };
        let handle = self.next_id().seq;
        let open = FsRequest::Open {
            ino,
            session: self.session(),
            handle,
            synced: false,
        };
        match tokio::time::timeout(READ_WAIT, fs.handle(open, None, PROTOCOL)).await {
            Ok(FsResponse::Opened { .. } | FsResponse::OpenedIn { .. } | FsResponse::Attr(_)) => {}
            _ => return self.unlink(fs, name).await,
        }
        // Kept before the unlink is sent, as the mount keeps a handle from its open on:
        // an agent that restarts while the unlink waits hears of the handle from the
        // keepalive, not only once the unlink is answered (seed 300843 of `power-loss`:
        // the unlink waited out the restart, the handle was announced after the new
        // agent's grace, and the purge had taken the file).
        let began = self.model.event();
        lock(&self.held).push(Held {
            name: name.to_owned(),
            ino,
            handle,
            began,
            on: fs.clone(),
        });
        self.unlink(fs, name).await;
    }

    /// One held file, picked by the client's seed.
    pub(crate) fn some_held(&mut self) -> Option<u64> {
        let held = lock(&self.held);
        let n = held.len() as u64;
        (n > 0).then(|| held[self.rng.below(n) as usize].handle)
    }

    /// Reads held file `handle` through its node and checks it; `release` closes it after
    /// a read that was answered.
    pub(crate) async fn read_held(&mut self, fs: &Arc<FsService>, handle: u64, release: bool) {
        let found = lock(&self.held)
            .iter()
            .find(|h| h.handle == handle)
            .map(|h| (h.name.clone(), h.ino, h.began));
        let Some((name, ino, began)) = found else {
            return;
        };
        let size = self
            .model
            .file(&name, false, |h, _| h.newest().len() as u64)
            .unwrap_or(0);
        let read = tokio::time::timeout(READ_WAIT, fs.read(ino, 0, read_len(size))).await;
        match read {
            Ok(Ok(parts)) => {
                let bytes: Vec<u8> = parts.iter().flat_map(|p| p.iter().copied()).collect();
                self.note(format_args!(
                    "read unlinked {name} held open: {} bytes",
                    bytes.len()
                ));
                if let Some(v) = self
                    .model
                    .check_file_read(&name, ino, began, &bytes, self.home)
                {
                    self.trace.note(format_args!("VIOLATION {v}"));
                }
            }
            Ok(Err(FsError::NotFound)) => {
                return self.holder().gone(handle, "read through its handle");
            }
            // Not answered now (no leader, a partition): read again later.
            Ok(Err(_)) | Err(_) => return,
        }
        if release {
            let _announcing = self.held.announcing.lock().await;
            lock(&self.held).retain(|h| h.handle != handle);
            let session = self.session();
            let _ = fs
                .handle(FsRequest::Release { session, handle }, None, PROTOCOL)
                .await;
        }
    }

    /// The mount closes what it still holds when it ends (a node that is down forgets
    /// them when it restarts).
    pub(crate) async fn release_all(&mut self) {
        let held = std::mem::take(&mut *lock(&self.held));
        let Some(fs) = self.live.fs(self.home) else {
            return;
        };
        let session = self.session();
        for h in held {
            let release = FsRequest::Release {
                session,
                handle: h.handle,
            };
            let _ = fs.handle(release, None, PROTOCOL).await;
        }
    }
}
