//! What each filesystem operation sends to the agent. Every function returns the answer
//! for the kernel or the errno it gets; `fs.rs` only moves replies.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use fuser::Errno;
use shoal_agent_api::{
    CREATE_SINCE, DirEntry, FileAttr, FileKind, FsRequest, FsResponse, FsStats, Ino, Owner,
    RenameFlags, SetAttr, WRITE_THEN_SET_SINCE,
};

use super::MountArgs;
use super::agent::Agent;
use super::attr;
use super::coherence::{Coherence, Stamp};
use super::dir::{Listed, Listing};
use super::files::OpenFiles;
use super::readahead::read_direct;

/// The most directory entries one readdir reply is built from: more than a kernel
/// readdir buffer holds, few enough that a huge directory is not copied whole per reply.
const READDIR_REPLY_MAX: usize = 1024;

/// The state behind the mount: shared by every request.
pub struct FsState {
    pub agent: Arc<Agent>,
    pub files: OpenFiles,
    dirs: Mutex<HashMap<u64, Arc<tokio::sync::Mutex<Listing>>>>,
    /// File and directory handles share one counter; never 0.
    next_handle: AtomicU64,
    /// Entries asked for per ReadDir request.
    readdir_page: u32,
    pub attr_ttl: Duration,
    /// Attribute TTL of regular files (0 by default: see `--file-attr-ttl-ms`).
    pub file_attr_ttl: Duration,
    entry_ttl: Duration,
    /// The change feed's side: which names the kernel was told, and the TTLs it allows.
    pub coherence: Arc<Coherence>,
    /// `--sync-close`: a close syncs like an fsync.
    sync_close: bool,
}

/// What a new node is.
pub struct NewNode {
    pub kind: FileKind,
    pub perm: u16,
    pub owner: Owner,
    pub rdev: u32,
    pub target: Option<String>,
}

impl FsState {
    pub fn new(agent: Arc<Agent>, args: &MountArgs, stripe: u64) -> Self {
        let coherence = Arc::new(Coherence::default());
        {
            let coherence = coherence.clone();
            agent.on_reconnect(move || coherence.reconnected());
        }
        {
            let coherence = coherence.clone();
            // Files for their attributes (`held`), directories for the kernel's stat after
            // each change in them (`getattr`).
            agent.on_unsynced(move |attr, at| {
                if matches!(attr.kind, FileKind::File | FileKind::Dir) {
                    coherence.hold(attr, at);
                }
            });
        }
        FsState {
            files: OpenFiles::new(agent.clone(), stripe, args.read_ahead, args.write_buffer),
            agent,
            dirs: Mutex::new(HashMap::new()),
            next_handle: AtomicU64::new(1),
            readdir_page: args.readdir_page,
            attr_ttl: Duration::from_millis(args.attr_ttl_ms),
            file_attr_ttl: Duration::from_millis(args.file_attr_ttl_ms),
            entry_ttl: Duration::from_millis(args.entry_ttl_ms),
            coherence,
            sync_close: args.sync_close,
        }
    }

    /// How long the kernel may keep `attr`: regular files change size on other nodes.
    pub fn attr_ttl_of(&self, attr: &FileAttr) -> Duration {
        if attr.kind == FileKind::File && !self.coherence.is_held(attr.ino) {
            self.file_attr_ttl
        } else {
            self.coherence.ttl(self.attr_ttl)
        }
    }

    /// How long the kernel may keep a name → inode answer.
    pub fn entry_ttl(&self) -> Duration {
        self.coherence.ttl(self.entry_ttl)
    }

    pub async fn lookup(&self, parent: Ino, name: String) -> Result<FileAttr, Errno> {
        Ok(self.lookup_stamped(parent, name).await?.0)
    }

    /// A lookup, with where in the agent's feed it was answered (an agent of protocol 9
    /// on says).
    pub async fn lookup_stamped(
        &self,
        parent: Ino,
        name: String,
    ) -> Result<(FileAttr, Option<Stamp>), Errno> {
        let (attr, stamp) = match self.agent.fs(FsRequest::Lookup { parent, name }).await? {
            FsResponse::EntryAt {
                attr,
                epoch,
                position,
            } => (attr, Some(Stamp { epoch, position })),
            other => (attr_of(other)?, None),
        };
        Ok((self.with_own_writes(attr).await?, stamp))
    }

    /// `by_path`: a stat of a name (the kernel names no open file), which must see what
    /// another node's close committed before it; an open file's attributes come from the
    /// local replica.
    pub async fn getattr(&self, ino: Ino, by_path: bool) -> Result<FileAttr, Errno> {
        // A directory this mount just changed under the agent's lease: the kernel asks
        // after each of its creates and unlinks (its permission check), and the agent's
        // answer to that change said what it would answer now (see `held`).
        if let Some(a) = self.coherence.held_attr(ino, self.agent.changes_sent())
            && a.kind == FileKind::Dir
        {
            return Ok(a);
        }
        if self.files.has_pending(ino) {
            self.files.flush_inode(ino).await;
        }
        let request = if by_path && self.coherence.is_live() {
            FsRequest::GetAttrFresh { ino }
        } else {
            FsRequest::GetAttr { ino }
        };
        attr_of(self.agent.fs(request).await?)
    }

    pub async fn setattr(&self, ino: Ino, set: SetAttr) -> Result<FileAttr, Errno> {
        if self.agent.speaks(WRITE_THEN_SET_SINCE)
            && let Some((end, held)) = self.files.hold_set(ino, &set).await
        {
            // A file held under the agent's lease, with nothing sent since its last answer:
            // that answer is the agent's view (cp -a's chown, utimes and chmod after the
            // data each save a round trip).
            let now = self.agent.changes_sent();
            let committed = match self.coherence.held_attr(ino, now) {
                Some(a) => a,
                None => attr_of(self.agent.fs(FsRequest::GetAttr { ino }).await?)?,
            };
            let answer = attr::held(&committed, &held, end);
            self.coherence.answered_held(&answer, now);
            return Ok(answer);
        }
        let truncates = set.size.is_some();
        if truncates || self.files.has_pending(ino) {
            self.files.flush_inode(ino).await;
        }
        let id = self.agent.next_id();
        let result = self.agent.fs(FsRequest::SetAttr { id, ino, set }).await;
        if truncates {
            self.files.invalidate(ino);
        }
        attr_of(result?)
    }

    pub async fn readlink(&self, ino: Ino) -> Result<String, Errno> {
        match self.agent.fs(FsRequest::ReadLink { ino }).await? {
            FsResponse::ReadLink(target) => Ok(target),
            other => Err(unexpected("readlink", &other)),
        }
    }

    pub async fn mknode(
        &self,
        parent: Ino,
        name: String,
        node: NewNode,
    ) -> Result<FileAttr, Errno> {
        let request = FsRequest::MkNode {
            id: self.agent.next_id(),
            parent,
            name,
            kind: node.kind,
            perm: node.perm & 0o7777,
            owner: node.owner,
            rdev: node.rdev,
            target: node.target,
        };
        attr_of(self.agent.fs(request).await?)
    }

    pub async fn link(
        &self,
        ino: Ino,
        new_parent: Ino,
        new_name: String,
    ) -> Result<FileAttr, Errno> {
        if self.files.has_pending(ino) {
            self.files.flush_inode(ino).await;
        }
        let request = FsRequest::Link {
            id: self.agent.next_id(),
            ino,
            new_parent,
            new_name,
        };
        attr_of(self.agent.fs(request).await?)
    }

    pub async fn unlink(&self, parent: Ino, name: String) -> Result<(), Errno> {
        let id = self.agent.next_id();
        let request = FsRequest::Unlink {
            id,
            parent,
            name: name.clone(),
        };
        self.remove(request, parent, &name).await
    }

    pub async fn rmdir(&self, parent: Ino, name: String) -> Result<(), Errno> {
        let id = self.agent.next_id();
        let request = FsRequest::Rmdir {
            id,
            parent,
            name: name.clone(),
        };
        self.remove(request, parent, &name).await
    }

    /// Sends an unlink or rmdir of `parent/name`; once done, the name is no longer one
    /// the kernel was told.
    async fn remove(&self, request: FsRequest, parent: Ino, name: &str) -> Result<(), Errno> {
        done(self.agent.fs(request).await?)?;
        self.coherence.removed(parent, name);
        Ok(())
    }

    pub async fn rename(
        &self,
        (parent, name): (Ino, String),
        (new_parent, new_name): (Ino, String),
        flags: RenameFlags,
    ) -> Result<(), Errno> {
        let request = FsRequest::Rename {
            id: self.agent.next_id(),
            parent,
            name: name.clone(),
            new_parent,
            new_name: new_name.clone(),
            flags,
        };
        done(self.agent.fs(request).await?)?;
        if flags.exchange {
            // Both names now name the other inode: let the kernel ask again.
            self.coherence.removed(parent, &name);
            self.coherence.removed(new_parent, &new_name);
        } else {
            self.coherence
                .renamed((parent, &name), (new_parent, &new_name));
        }
        Ok(())
    }

    /// Opens a file on the agent; the new handle.
    pub async fn open(&self, ino: Ino) -> Result<u64, Errno> {
        self.open_handle(ino, false).await
    }

    /// Opens `ino`; `synced` when this operation already read at a commit point through
    /// the agent (see [`FsRequest::Open`]).
    async fn open_handle(&self, ino: Ino, synced: bool) -> Result<u64, Errno> {
        let fh = self.next_handle.fetch_add(1, Ordering::Relaxed);
        let session = self.agent.session();
        self.agent.remember_handle(fh, ino).await;
        let request = FsRequest::Open {
            ino,
            session,
            handle: fh,
            synced,
        };
        match self.agent.fs(request).await {
            Ok(answer) => {
                let at = match answer {
                    FsResponse::Opened { changes, .. } => Some((None, changes)),
                    FsResponse::OpenedIn { epoch, changes, .. } => Some((Some(epoch), changes)),
                    _ => None,
                };
                if let Some((epoch, changes)) = at
                    && self.coherence.open_is_stale(ino, epoch, changes).await
                {
                    // The kernel reached the inode by a name that changed on another
                    // node: it looks the path up again.
                    self.release_on_agent(fh).await;
                    return Err(Errno::ESTALE);
                }
                if !synced {
                    // Close-to-open: the size the reader sees is the one at the barrier.
                    self.coherence.drop_attributes(ino);
                }
                self.files.open(fh, ino);
                Ok(fh)
            }
            Err(e) => {
                self.agent.forget_handle(fh).await;
                Err(e)
            }
        }
    }

    /// Creates (or, when it appeared meanwhile and the open is not exclusive, opens) a
    /// regular file; its attributes and the new handle.
    pub async fn create(
        &self,
        parent: Ino,
        name: String,
        node: NewNode,
        exclusive: bool,
        truncate: bool,
    ) -> Result<(FileAttr, u64), Errno> {
        let made = if self.agent.speaks(CREATE_SINCE) && node.kind == FileKind::File {
            match self.create_open(parent, name.clone(), &node).await {
                Ok(done) => return Ok(done),
                Err(e) => Err(e),
            }
        } else {
            self.mknode(parent, name.clone(), node).await
        };
        let attr = match made {
            Ok(attr) => attr,
            Err(e) if e == Errno::EEXIST && !exclusive => {
                let attr = self.lookup(parent, name).await?;
                if attr.kind == FileKind::Dir {
                    return Err(Errno::EISDIR);
                }
                if truncate && attr.size > 0 {
                    let set = SetAttr {
                        size: Some(0),
                        ..SetAttr::default()
                    };
                    self.setattr(attr.ino, set).await?
                } else {
                    attr
                }
            }
            Err(e) => return Err(e),
        };
        // The new name was committed through this agent, or the lookup just read at the
        // commit point: the open needs no read barrier of its own (the agent still takes
        // one if it does not find the inode).
        let fh = self.open_handle(attr.ino, true).await?;
        Ok((attr, fh))
    }

    /// A new regular file made and opened in one request (`FsRequest::Create`): its
    /// attributes and handle. The handle is remembered for a restarted agent once the
    /// file is there (a copy of the request sent to a restarted agent holds it anew).
    async fn create_open(
        &self,
        parent: Ino,
        name: String,
        node: &NewNode,
    ) -> Result<(FileAttr, u64), Errno> {
        let fh = self.next_handle.fetch_add(1, Ordering::Relaxed);
        let request = FsRequest::Create {
            id: self.agent.next_id(),
            parent,
            name,
            perm: node.perm & 0o7777,
            owner: node.owner,
            session: self.agent.session(),
            handle: fh,
        };
        let attr = match attr_of(self.agent.fs(request).await?) {
            Ok(attr) => attr,
            Err(e) => {
                self.release_on_agent(fh).await;
                return Err(e);
            }
        };
        self.agent.remember_handle(fh, attr.ino).await;
        self.files.open(fh, attr.ino);
        Ok((attr, fh))
    }

    pub async fn read(&self, fh: u64, ino: Ino, offset: u64, size: u32) -> Result<Bytes, Errno> {
        if self.files.has_pending(ino) {
            self.files.flush_inode(ino).await;
        }
        match self.files.get(fh) {
            Some(file) => self.files.read(&file, offset, size).await,
            None => read_direct(&self.agent, ino, offset, size).await,
        }
    }

    pub async fn write(&self, fh: u64, offset: u64, data: &[u8]) -> Result<u32, Errno> {
        let file = self.files.get(fh).ok_or(Errno::EBADF)?;
        self.files.write(&file, offset, data).await
    }

    /// flush (a close): every write of the handle committed; with `--sync-close`, and
    /// the file's metadata durable as with fsync.
    pub async fn flush(&self, fh: u64) -> Result<(), Errno> {
        let Some(file) = self.files.get(fh) else {
            return Ok(());
        };
        self.files.flush(&file).await?;
        if self.sync_close {
            self.agent.sync(file.ino).await?;
        }
        Ok(())
    }

    /// fsync waits for every buffered write of the file, whichever handle took it, then
    /// for the changes the agent answered before they were committed.
    pub async fn fsync(&self, fh: u64) -> Result<(), Errno> {
        match self.files.get(fh) {
            Some(file) => {
                self.files.fsync(&file).await?;
                self.agent.sync(file.ino).await
            }
            None => Ok(()),
        }
    }

    /// fsyncdir: the directory's changes durable.
    pub async fn fsyncdir(&self, ino: Ino) -> Result<(), Errno> {
        self.agent.sync(ino).await
    }

    pub async fn release(&self, fh: u64) -> Result<(), Errno> {
        let result = self.flush(fh).await;
        self.files.close(fh);
        self.release_on_agent(fh).await;
        result
    }

    /// The agent no longer keeps `fh`'s inode alive for this mount.
    async fn release_on_agent(&self, fh: u64) {
        self.agent.forget_handle(fh).await;
        let session = self.agent.session();
        let request = FsRequest::Release {
            session,
            handle: fh,
        };
        if let Err(e) = self.agent.fs(request).await {
            tracing::debug!(handle = fh, "release: {e:?}");
        }
    }

    /// The kernel is about to be told `parent/name` is `attr`, answering a request sent
    /// at feed position `since`: the entry TTL to give it (0 when the name changed on
    /// another node meanwhile).
    pub fn entered(
        &self,
        parent: Ino,
        name: &str,
        attr: &FileAttr,
        since: u64,
        stamp: Option<Stamp>,
    ) -> Duration {
        if self.coherence.entered(parent, name, attr.ino, since, stamp) {
            self.entry_ttl()
        } else {
            Duration::ZERO
        }
    }

    /// Opens a directory with its first page of entries (read at the leader's commit
    /// point: close-to-open for listings).
    pub async fn opendir(&self, ino: Ino) -> Result<u64, Errno> {
        let (entries, more) = self.read_dir_page(ino, None).await?;
        let fh = self.next_handle.fetch_add(1, Ordering::Relaxed);
        let listing = Listing::new(ino, ino, entries, more);
        lock(&self.dirs).insert(fh, Arc::new(tokio::sync::Mutex::new(listing)));
        Ok(fh)
    }

    /// The entries of open directory `fh` from `offset` on, fetching the next page first
    /// when the ones fetched end there (at most [`READDIR_REPLY_MAX`]; the kernel asks
    /// again for the rest).
    pub async fn readdir(&self, fh: u64, offset: u64) -> Result<Vec<Listed>, Errno> {
        let dir = lock(&self.dirs).get(&fh).cloned().ok_or(Errno::EBADF)?;
        let mut listing = dir.lock().await;
        if let Some(after) = listing.next_page_for(offset).map(str::to_owned) {
            let (page, more) = self.read_dir_page(listing.ino(), Some(after)).await?;
            listing.append(page, more);
        }
        Ok(listing.listing_at(offset, READDIR_REPLY_MAX))
    }

    async fn read_dir_page(
        &self,
        ino: Ino,
        after: Option<String>,
    ) -> Result<(Vec<DirEntry>, bool), Errno> {
        let req = FsRequest::ReadDir {
            ino,
            after,
            limit: self.readdir_page,
        };
        match self.agent.fs(req).await? {
            FsResponse::Entries { entries, more } => Ok((entries, more)),
            other => Err(unexpected("readdir", &other)),
        }
    }

    pub fn releasedir(&self, fh: u64) {
        lock(&self.dirs).remove(&fh);
    }

    pub async fn statfs(&self) -> Result<FsStats, Errno> {
        match self.agent.fs(FsRequest::StatFs).await? {
            FsResponse::StatFs(stats) => Ok(stats),
            other => Err(unexpected("statfs", &other)),
        }
    }

    /// The attributes with this mount's own pending writes committed first, so the size
    /// the kernel learns includes them.
    async fn with_own_writes(&self, attr: FileAttr) -> Result<FileAttr, Errno> {
        if !self.files.has_pending(attr.ino) {
            return Ok(attr);
        }
        self.getattr(attr.ino, false).await
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn attr_of(r: FsResponse) -> Result<FileAttr, Errno> {
    match r {
        FsResponse::Entry(a) | FsResponse::Attr(a) => Ok(a),
        other => Err(unexpected("attributes", &other)),
    }
}

fn done(r: FsResponse) -> Result<(), Errno> {
    match r {
        FsResponse::Done => Ok(()),
        other => Err(unexpected("done", &other)),
    }
}

fn unexpected(wanted: &str, got: &FsResponse) -> Errno {
    tracing::warn!("agent answered {} where {wanted} was expected", kind(got));
    Errno::EIO
}

/// The answer's kind, for logs (never its data).
pub fn kind(r: &FsResponse) -> &'static str {
    match r {
        FsResponse::Entry(_) => "Entry",
        FsResponse::Attr(_) => "Attr",
        FsResponse::Done => "Done",
        FsResponse::ReadLink(_) => "ReadLink",
        FsResponse::Entries { .. } => "Entries",
        FsResponse::Data(_) => "Data",
        FsResponse::StatFs(_) => "StatFs",
        FsResponse::Layout(_) => "Layout",
        FsResponse::Error(_) => "Error",
        FsResponse::Changes(_) => "Changes",
        FsResponse::Opened { .. } => "Opened",
        FsResponse::OpenedIn { .. } => "OpenedIn",
        FsResponse::EntryAt { .. } => "EntryAt",
        FsResponse::Unsynced(_) => "Unsynced",
        FsResponse::Synced { .. } => "Synced",
    }
}
