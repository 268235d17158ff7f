//! The kernel's side: fuser's `Filesystem`. Every handler moves its reply into a task on
//! the process's tokio runtime and returns, so the FUSE threads only read requests; the
//! work itself is in [`super::ops`].

use std::ffi::OsStr;
use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use fuser::{
    BsdFileFlags, Config, Errno, FileHandle, FopenFlags, Generation, INodeNo, InitFlags,
    IoctlFlags, KernelConfig, LockOwner, MountOption, OpenFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyOpen, ReplyStatfs, ReplyWrite,
    ReplyXattr, Request, SessionACL, TimeOrNow, WriteFlags,
};
use shoal_agent_api::{FileAttr, FileKind, Owner, RenameFlags, SetAttr};
use tokio::runtime::Handle;

use super::MountArgs;
use super::attr::{self, to_kernel};
use super::coherence::Stamp;
use super::ops::{FsState, NewNode};

/// Size of `statfs` blocks.
const STATFS_BLOCK: u64 = 4096;

/// The session options: see the README's "Mount" section for why each is set.
pub fn session_config(args: &MountArgs) -> Config {
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName("shoal".into()),
        MountOption::Subtype("shoal".into()),
        // The kernel checks permissions against the attributes we return.
        MountOption::DefaultPermissions,
    ];
    config.acl = if args.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    config.n_threads = Some(args.threads);
    config.clone_fd = args.threads > 1;
    config
}

/// The mounted filesystem.
pub struct ShoalFs {
    state: Arc<FsState>,
    rt: Handle,
}

impl ShoalFs {
    pub fn new(state: Arc<FsState>, rt: Handle) -> Self {
        ShoalFs { state, rt }
    }

    /// `parent/name` with the change feed's position now, for the answer's
    /// [`FsState::entered`] once the request is served.
    fn named(&self, parent: INodeNo, name: &str) -> (INodeNo, String, u64) {
        (parent, name.to_owned(), self.state.coherence.position())
    }

    /// Runs `work` on the runtime; its result goes to `answer` together with the state.
    fn spawn<T, F, Fut, A>(&self, work: F, answer: A)
    where
        F: FnOnce(Arc<FsState>) -> Fut + Send + 'static,
        Fut: Future<Output = T> + Send + 'static,
        T: Send + 'static,
        A: FnOnce(&FsState, T) + Send + 'static,
    {
        let state = self.state.clone();
        self.rt.spawn(async move {
            let result = work(state.clone()).await;
            answer(&state, result);
        });
    }
}

fn empty(reply: ReplyEmpty, result: Result<(), Errno>) {
    match result {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}

/// Answers a request that names `parent/name` (sent at feed position `since`) with its
/// inode, recording the name for the open-time check (see `coherence`).
fn entry_reply(
    state: &FsState,
    reply: ReplyEntry,
    key: (INodeNo, String, u64),
    result: Result<FileAttr, Errno>,
) {
    stamped_entry_reply(state, reply, key, result.map(|a| (a, None)));
}

/// [`entry_reply`] for an answer the agent stamped with its feed's position.
fn stamped_entry_reply(
    state: &FsState,
    reply: ReplyEntry,
    (parent, name, since): (INodeNo, String, u64),
    result: Result<(FileAttr, Option<Stamp>), Errno>,
) {
    match result {
        Ok((a, stamp)) => reply.entry_with_ttls(
            &state.attr_ttl_of(&a),
            &state.entered(parent.0, &name, &a, since, stamp),
            &to_kernel(&a),
            Generation(0),
        ),
        Err(e) => reply.error(e),
    }
}

fn attr_reply(state: &FsState, reply: ReplyAttr, result: Result<FileAttr, Errno>) {
    match result {
        Ok(a) => reply.attr(&state.attr_ttl_of(&a), &to_kernel(&a)),
        Err(e) => reply.error(e),
    }
}

fn owner(req: &Request) -> Owner {
    Owner {
        uid: req.uid(),
        gid: req.gid(),
    }
}

fn perm(mode: u32) -> u16 {
    (mode & 0o7777) as u16
}

impl fuser::Filesystem for ShoalFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        if let Err(nearest) = config.set_max_write(super::MAX_WRITE) {
            let _ = config.set_max_write(nearest);
        }
        let _ = config.set_max_background(64);
        let _ = config.set_congestion_threshold(48);
        // Several O_DIRECT requests of one file in flight at once (libaio at a queue depth
        // above one; without it the kernel sends them one at a time), and lookups and
        // listings in one directory in parallel (without it each takes the directory's
        // lock). Older kernels lack them: the mount works without, only slower.
        for flag in [InitFlags::FUSE_ASYNC_DIO, InitFlags::FUSE_PARALLEL_DIROPS] {
            let _ = config.add_capabilities(flag);
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let name = match attr::name(name) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        let key = self.named(parent, &name);
        self.spawn(
            move |s: Arc<FsState>| async move { s.lookup_stamped(parent.0, name).await },
            move |s, r| stamped_entry_reply(s, reply, key, r),
        );
    }

    // fuser's batch_forget calls this for each inode.
    fn forget(&self, _req: &Request, ino: INodeNo, _nlookup: u64) {
        self.state.coherence.forget(ino.0);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        self.spawn(
            move |s: Arc<FsState>| async move { s.getattr(ino.0, fh.is_none()).await },
            move |s, r| attr_reply(s, reply, r),
        );
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let set = SetAttr {
            perm: mode.map(perm),
            uid,
            gid,
            size,
            atime: atime.map(attr::set_time),
            mtime: mtime.map(attr::set_time),
        };
        self.spawn(
            move |s: Arc<FsState>| async move { s.setattr(ino.0, set).await },
            move |s, r| attr_reply(s, reply, r),
        );
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        self.spawn(
            move |s: Arc<FsState>| async move { s.readlink(ino.0).await },
            move |_, r| match r {
                Ok(target) => reply.data(target.as_bytes()),
                Err(e) => reply.error(e),
            },
        );
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let (name, kind) = match (attr::name(name), attr::kind_from_mode(mode)) {
            (Ok(n), Some(k)) => (n, k),
            (Err(e), _) => return reply.error(e),
            (_, None) => return reply.error(Errno::EINVAL),
        };
        let node = NewNode {
            kind,
            perm: perm(mode),
            owner: owner(req),
            rdev,
            target: None,
        };
        let key = self.named(parent, &name);
        self.spawn(
            move |s: Arc<FsState>| async move { s.mknode(parent.0, name, node).await },
            move |s, r| entry_reply(s, reply, key, r),
        );
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let name = match attr::name(name) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        let node = NewNode {
            kind: FileKind::Dir,
            perm: perm(mode),
            owner: owner(req),
            rdev: 0,
            target: None,
        };
        let key = self.named(parent, &name);
        self.spawn(
            move |s: Arc<FsState>| async move { s.mknode(parent.0, name, node).await },
            move |s, r| entry_reply(s, reply, key, r),
        );
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let name = match attr::name(name) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        self.spawn(
            move |s: Arc<FsState>| async move { s.unlink(parent.0, name).await },
            move |_, r| empty(reply, r),
        );
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let name = match attr::name(name) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        self.spawn(
            move |s: Arc<FsState>| async move { s.rmdir(parent.0, name).await },
            move |_, r| empty(reply, r),
        );
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let (name, target) = match (attr::name(link_name), target.to_str()) {
            (Ok(n), Some(t)) => (n, t.to_owned()),
            (Err(e), _) => return reply.error(e),
            (_, None) => return reply.error(Errno::EINVAL),
        };
        let node = NewNode {
            kind: FileKind::Symlink,
            perm: 0o777,
            owner: owner(req),
            rdev: 0,
            target: Some(target),
        };
        let key = self.named(parent, &name);
        self.spawn(
            move |s: Arc<FsState>| async move { s.mknode(parent.0, name, node).await },
            move |s, r| entry_reply(s, reply, key, r),
        );
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        let (name, newname) = match (attr::name(name), attr::name(newname)) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(e), _) | (_, Err(e)) => return reply.error(e),
        };
        let Some(flags) = rename_flags(flags.bits()) else {
            return reply.error(Errno::EINVAL);
        };
        self.spawn(
            move |s: Arc<FsState>| async move {
                s.rename((parent.0, name), (newparent.0, newname), flags)
                    .await
            },
            move |_, r| empty(reply, r),
        );
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let newname = match attr::name(newname) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        let key = self.named(newparent, &newname);
        self.spawn(
            move |s: Arc<FsState>| async move { s.link(ino.0, newparent.0, newname).await },
            move |s, r| entry_reply(s, reply, key, r),
        );
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.spawn(
            move |s: Arc<FsState>| async move { s.open(ino.0).await },
            move |_, r| match r {
                // No FOPEN_KEEP_CACHE: every open drops cached pages (close-to-open).
                Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
                Err(e) => reply.error(e),
            },
        );
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.spawn(
            move |s: Arc<FsState>| async move { s.read(fh.0, ino.0, offset, size).await },
            move |_, r| match r {
                Ok(data) => reply.data(&data),
                Err(e) => reply.error(e),
            },
        );
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let data = data.to_vec();
        self.spawn(
            move |s: Arc<FsState>| async move { s.write(fh.0, offset, &data).await },
            move |_, r| match r {
                Ok(n) => reply.written(n),
                Err(e) => reply.error(e),
            },
        );
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        self.spawn(
            move |s: Arc<FsState>| async move { s.flush(fh.0).await },
            move |_, r| empty(reply, r),
        );
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.spawn(
            move |s: Arc<FsState>| async move { s.release(fh.0).await },
            move |_, r| empty(reply, r),
        );
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.spawn(
            move |s: Arc<FsState>| async move { s.fsync(fh.0).await },
            move |_, r| empty(reply, r),
        );
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.spawn(
            move |s: Arc<FsState>| async move { s.opendir(ino.0).await },
            move |_, r| match r {
                Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
                Err(e) => reply.error(e),
            },
        );
    }

    fn readdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        self.spawn(
            move |s: Arc<FsState>| async move { s.readdir(fh.0, offset).await },
            move |_, r| match r {
                Ok(listed) => {
                    for e in listed {
                        if reply.add(INodeNo(e.ino), e.next, attr::file_type(e.kind), &e.name) {
                            break;
                        }
                    }
                    reply.ok();
                }
                Err(e) => reply.error(e),
            },
        );
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.state.releasedir(fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.spawn(
            move |s: Arc<FsState>| async move { s.fsyncdir(ino.0).await },
            move |_, r| empty(reply, r),
        );
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        self.spawn(
            move |s: Arc<FsState>| async move { s.statfs().await },
            move |_, r| match r {
                Ok(st) => {
                    let free = st.free_bytes / STATFS_BLOCK;
                    reply.statfs(
                        st.total_bytes / STATFS_BLOCK,
                        free,
                        free,
                        st.files,
                        st.files_free,
                        STATFS_BLOCK as u32,
                        shoal_agent_api::NAME_MAX as u32,
                        STATFS_BLOCK as u32,
                    )
                }
                Err(e) => reply.error(e),
            },
        );
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let name = match attr::name(name) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        let node = NewNode {
            kind: FileKind::File,
            perm: perm(mode),
            owner: owner(req),
            rdev: 0,
            target: None,
        };
        let exclusive = flags & O_EXCL != 0;
        let truncate = flags & O_TRUNC != 0;
        let (_, key, since) = self.named(parent, &name);
        self.spawn(
            move |s: Arc<FsState>| async move {
                s.create(parent.0, name, node, exclusive, truncate).await
            },
            move |s, r| match r {
                // One TTL for both the name and the attributes here: the file's (0 by
                // default), so another node's write is seen at the next open.
                Ok((a, fh)) => reply.created(
                    &s.entered(parent.0, &key, &a, since, None)
                        .min(s.attr_ttl_of(&a)),
                    &to_kernel(&a),
                    Generation(0),
                    FileHandle(fh),
                    FopenFlags::empty(),
                ),
                Err(e) => reply.error(e),
            },
        );
    }

    // Extended attributes are not stored. ENOSYS makes the kernel remember that and
    // answer EOPNOTSUPP for every later get/set/list/remove itself, so `ls -l` and
    // `cp -a` do not cost a round trip per file.

    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: ReplyXattr,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, _size: u32, reply: ReplyXattr) {
        reply.error(Errno::ENOSYS);
    }

    fn setxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn removexattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::ENOSYS);
    }

    /// No ioctls: ENOTTY, which is what isatty(3) expects to hear.
    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        reply.error(Errno::ENOTTY);
    }
}

const O_EXCL: i32 = 0o200;
const O_TRUNC: i32 = 0o1000;

/// renameat2 flags: RENAME_NOREPLACE (1) and RENAME_EXCHANGE (2); anything else is refused.
fn rename_flags(bits: u32) -> Option<RenameFlags> {
    const NOREPLACE: u32 = 1;
    const EXCHANGE: u32 = 2;
    if bits & !(NOREPLACE | EXCHANGE) != 0 || bits == NOREPLACE | EXCHANGE {
        return None;
    }
    Some(RenameFlags {
        noreplace: bits & NOREPLACE != 0,
        exchange: bits & EXCHANGE != 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rename_flags_take_noreplace_or_exchange_only() {
        assert_eq!(rename_flags(0), Some(RenameFlags::default()));
        assert_eq!(
            rename_flags(1),
            Some(RenameFlags {
                noreplace: true,
                exchange: false
            })
        );
        assert_eq!(
            rename_flags(2),
            Some(RenameFlags {
                noreplace: false,
                exchange: true
            })
        );
        assert_eq!(rename_flags(3), None);
        assert_eq!(rename_flags(4), None);
    }
}
