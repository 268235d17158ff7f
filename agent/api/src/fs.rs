//! The filesystem requests `shoal mount` sends to its local agent, and their answers.
//!
//! Inode numbers are the cluster's own (the root is [`ROOT_INO`]) and are used unchanged as
//! FUSE inode numbers. Every request that changes the namespace carries a [`RequestId`] so
//! that a retry after an agent restart is applied once.

use serde::{Deserialize, Serialize};

use crate::StripeRecord;

/// An inode number.
pub type Ino = u64;

/// The root directory's inode.
pub const ROOT_INO: Ino = 1;

/// Longest name in a directory, in bytes.
pub const NAME_MAX: usize = 255;

/// Identifies one mutating request: `client` is random per mount process, `seq` grows per
/// request. The metadata service remembers recent ids and answers a repeat with the
/// first answer instead of applying it twice.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RequestId {
    pub client: u64,
    pub seq: u64,
}

/// Seconds and nanoseconds since the Unix epoch.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub struct Timestamp {
    pub secs: i64,
    pub nanos: u32,
}

impl Timestamp {
    /// The current wall-clock time (see [`crate::wall_clock`]).
    pub fn now() -> Self {
        let d = crate::wall_clock::since_epoch();
        Timestamp {
            secs: d.as_secs() as i64,
            nanos: d.subsec_nanos(),
        }
    }
}

/// What an inode is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
}

/// The attributes of one inode, as `stat` shows them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileAttr {
    pub ino: Ino,
    pub kind: FileKind,
    /// Permission bits including setuid, setgid and sticky (`mode & 0o7777`).
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub atime: Timestamp,
    pub mtime: Timestamp,
    pub ctime: Timestamp,
    /// Device number of a character or block device; 0 otherwise.
    pub rdev: u32,
}

/// A time to set: the agent's clock now, or a given time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SetTime {
    Now,
    At(Timestamp),
}

/// Which attributes a `setattr` changes; `None` leaves one as it is. A `size` change
/// truncates or extends (with a hole) the file.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetAttr {
    pub perm: Option<u16>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<SetTime>,
    pub mtime: Option<SetTime>,
}

/// Who creates an inode: its owner and group. The kernel has applied the umask to the
/// mode and checked permissions already (the mount uses `default_permissions`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
}

/// The most bytes one [`FsRequest::Read`] or [`FsRequest::Write`] may move (half a frame).
pub const MAX_READ: u32 = 32 << 20;

/// The most entries one [`FsRequest::ReadDir`] answers with (names are at most 255 bytes,
/// so a page stays near 1 MiB).
pub const MAX_DIR_PAGE: u32 = 4096;

/// One name in a directory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirEntry {
    pub name: String,
    pub ino: Ino,
    pub kind: FileKind,
}

/// `rename` flags (renameat2).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenameFlags {
    /// Fail with "exists" instead of replacing the target.
    pub noreplace: bool,
    /// Swap the two names atomically; both must exist.
    pub exchange: bool,
}

/// One piece of a file's data: `len` bytes at file offset `offset` are bytes
/// `[stripe_offset, stripe_offset + len)` of `stripe`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Extent {
    pub offset: u64,
    pub len: u64,
    pub stripe_offset: u64,
    pub stripe: StripeRecord,
}

/// Where a file's data lives (`shoal stat PATH`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileLayout {
    pub attr: FileAttr,
    /// Bytes stored inline in the metadata (small files); 0 when the file has extents.
    pub inline_len: u64,
    /// Extents in file order; the gaps between them are holes that read as zeros.
    pub extents: Vec<Extent>,
}

/// Filesystem totals for `statfs` / `df`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsStats {
    /// Usable bytes (after erasure-coding overhead) across the cluster.
    pub total_bytes: u64,
    pub free_bytes: u64,
    pub files: u64,
    pub files_free: u64,
    /// Preferred I/O size: one full stripe.
    pub block_size: u32,
}

/// A filesystem request from `shoal mount` to its local agent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum FsRequest {
    Lookup {
        parent: Ino,
        name: String,
    },
    GetAttr {
        ino: Ino,
    },
    SetAttr {
        id: RequestId,
        ino: Ino,
        set: SetAttr,
    },
    /// Creates a file, directory, symlink (`target`), fifo, socket or device node.
    MkNode {
        id: RequestId,
        parent: Ino,
        name: String,
        kind: FileKind,
        perm: u16,
        owner: Owner,
        rdev: u32,
        target: Option<String>,
    },
    Link {
        id: RequestId,
        ino: Ino,
        new_parent: Ino,
        new_name: String,
    },
    Unlink {
        id: RequestId,
        parent: Ino,
        name: String,
    },
    Rmdir {
        id: RequestId,
        parent: Ino,
        name: String,
    },
    Rename {
        id: RequestId,
        parent: Ino,
        name: String,
        new_parent: Ino,
        new_name: String,
        flags: RenameFlags,
    },
    ReadLink {
        ino: Ino,
    },
    /// A directory's entries (without "." and "..") in name order: those after the name
    /// `after` (from the first when `None`), at most `limit` of them (the agent caps it
    /// at [`MAX_DIR_PAGE`]). A listing from the start reads at the leader's commit point.
    ReadDir {
        ino: Ino,
        after: Option<String>,
        limit: u32,
    },
    /// Opens a file: waits until this agent has applied everything committed before the
    /// open (close-to-open consistency) and keeps an unlinked file alive while open.
    /// `handle` is chosen by the mount and unique within its `session`. `synced` skips the
    /// wait unless the inode is not found: the open is part of an operation that already
    /// read at a commit point through this agent (a create, whose new name or lookup came
    /// just before).
    Open {
        ino: Ino,
        session: u64,
        handle: u64,
        synced: bool,
    },
    Release {
        session: u64,
        handle: u64,
    },
    /// Reads at most `len` bytes at `offset` (fewer only at the end of the file). `len`
    /// over [`MAX_READ`] is refused as invalid.
    Read {
        ino: Ino,
        offset: u64,
        len: u32,
    },
    /// Writes `data` at `offset` and commits it: answered once the data is durable on
    /// every shard and the extent is committed in the metadata.
    Write {
        id: RequestId,
        ino: Ino,
        offset: u64,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    StatFs,
    /// Where a file's data lives.
    Layout {
        ino: Ino,
    },
    /// Announces again a handle the mount opened before (after it reconnected to a
    /// restarted agent): like `Open` without `synced`, but the inode may have no name left
    /// (the file was unlinked while open) and is kept alive all the same.
    Reopen {
        ino: Ino,
        session: u64,
        handle: u64,
    },
    /// The namespace changes this agent applied after change `after` of feed `epoch`
    /// (`epoch` 0: from now on), but those `session`'s own requests made, waiting up to
    /// `wait_ms` (at most [`MAX_WATCH_MS`]) for one. Protocol 8 on.
    Watch {
        epoch: u64,
        after: u64,
        session: u64,
        wait_ms: u32,
    },
    /// Like `GetAttr`, read at the leader's commit point: a stat by path sees what another
    /// node's close committed before it. A directory is answered from the local replica
    /// (the change feed keeps its attributes coherent). Protocol 8 on.
    GetAttrFresh {
        ino: Ino,
    },
    /// `Write`, then `set` (which must not change the size) in the same metadata entry:
    /// the data's own time stamps come first and `set` lands on them, as when a copy
    /// sets its file's times and mode after writing it (the mount holds such a `setattr`
    /// with the file's buffered bytes instead of committing it on its own). Answered with
    /// the attributes after both. Protocol 11 on.
    WriteThenSet {
        id: RequestId,
        ino: Ino,
        set: SetAttr,
        offset: u64,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    /// Makes every change this agent answered for the mount durable: those in directory
    /// `ino` (its entries) or of inode `ino`, and with them everything answered before
    /// (the agent commits in order). A change answered but refused when it was committed
    /// fails the next `Sync` of the mount `session` it was answered for naming its file
    /// or directory (`FsError::Io`). The mount sends it on `fsync` and `fsyncdir`.
    /// Protocol 12 on.
    Sync {
        ino: Ino,
        session: u64,
    },
    /// A regular file made (as `MkNode`) and opened (as `Open`, with `handle` of mount
    /// `session`) in one request: a create costs one round trip, not two. Answered as
    /// `MkNode` is (`Entry`, or `Unsynced` under a directory lease); the handle is held
    /// once the file is made. Protocol 12 on.
    Create {
        id: RequestId,
        parent: Ino,
        name: String,
        perm: u16,
        owner: Owner,
        session: u64,
        handle: u64,
    },
}

impl FsRequest {
    /// What a `Sync` names to make this change durable once it was answered `Unsynced`:
    /// the directory whose entries it changes, or the inode it changes. `None` for a
    /// query.
    pub fn sync_target(&self) -> Option<Ino> {
        match self {
            FsRequest::MkNode { parent, .. }
            | FsRequest::Create { parent, .. }
            | FsRequest::Unlink { parent, .. }
            | FsRequest::Rmdir { parent, .. }
            | FsRequest::Rename { parent, .. } => Some(*parent),
            FsRequest::Link { new_parent, .. } => Some(*new_parent),
            FsRequest::Write { ino, .. }
            | FsRequest::WriteThenSet { ino, .. }
            | FsRequest::SetAttr { ino, .. } => Some(*ino),
            _ => None,
        }
    }

    /// The request's name, for logs (never its data).
    pub fn name(&self) -> &'static str {
        match self {
            FsRequest::Lookup { .. } => "lookup",
            FsRequest::GetAttr { .. } => "getattr",
            FsRequest::SetAttr { .. } => "setattr",
            FsRequest::MkNode { .. } => "mknode",
            FsRequest::Link { .. } => "link",
            FsRequest::Unlink { .. } => "unlink",
            FsRequest::Rmdir { .. } => "rmdir",
            FsRequest::Rename { .. } => "rename",
            FsRequest::ReadLink { .. } => "readlink",
            FsRequest::ReadDir { .. } => "readdir",
            FsRequest::Open { .. } => "open",
            FsRequest::Reopen { .. } => "reopen",
            FsRequest::Release { .. } => "release",
            FsRequest::Read { .. } => "read",
            FsRequest::Write { .. } => "write",
            FsRequest::WriteThenSet { .. } => "write-then-setattr",
            FsRequest::Sync { .. } => "sync",
            FsRequest::Create { .. } => "create",
            FsRequest::StatFs => "statfs",
            FsRequest::Watch { .. } => "watch",
            FsRequest::GetAttrFresh { .. } => "getattr",
            FsRequest::Layout { .. } => "layout",
        }
    }
}

impl FsResponse {
    /// The answer itself, whether or not it was made under a directory lease
    /// (`Unsynced`).
    pub fn into_answer(self) -> FsResponse {
        match self {
            FsResponse::Unsynced(answer) => answer.into_response(),
            answer => answer,
        }
    }

    /// This answer, made under a directory lease: `Unsynced` when it is one of the
    /// answers a change gives, else as it is.
    pub fn unsynced(self) -> FsResponse {
        match self {
            FsResponse::Done => FsResponse::Unsynced(UnsyncedAnswer::Done),
            FsResponse::Attr(a) => FsResponse::Unsynced(UnsyncedAnswer::Attr(a)),
            FsResponse::Entry(a) => FsResponse::Unsynced(UnsyncedAnswer::Entry(a)),
            other => other,
        }
    }
}

/// What a change answered under a directory lease says (`FsResponse::Unsynced`): one of
/// a change's answers, never nested (a decoder must not recurse on what a peer sends).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum UnsyncedAnswer {
    Done,
    Attr(FileAttr),
    Entry(FileAttr),
    /// `Done` of a change of a directory's entries (unlink, rmdir), with the directory's
    /// attributes after it, to clients of protocol 13 on ([`crate::PARENT_ATTRS_SINCE`]).
    DoneIn {
        parent: FileAttr,
    },
    /// `Entry` of a change that made an entry (create, mkdir, symlink, link), with the
    /// directory's attributes after it, to clients of protocol 13 on.
    EntryIn {
        attr: FileAttr,
        parent: FileAttr,
    },
}

impl UnsyncedAnswer {
    /// The answer as the committed path gives it.
    pub fn into_response(self) -> FsResponse {
        match self {
            UnsyncedAnswer::Done | UnsyncedAnswer::DoneIn { .. } => FsResponse::Done,
            UnsyncedAnswer::Attr(a) => FsResponse::Attr(a),
            UnsyncedAnswer::Entry(a) | UnsyncedAnswer::EntryIn { attr: a, .. } => {
                FsResponse::Entry(a)
            }
        }
    }

    /// The attributes of the directory the change was made in, after it, when the
    /// answer carries them.
    pub fn parent(&self) -> Option<&FileAttr> {
        match self {
            UnsyncedAnswer::DoneIn { parent } | UnsyncedAnswer::EntryIn { parent, .. } => {
                Some(parent)
            }
            _ => None,
        }
    }

    /// This answer with `parent`, the attributes of the directory it was made in (an
    /// answer of another kind stays as it is).
    pub fn with_parent(self, parent: FileAttr) -> UnsyncedAnswer {
        match self {
            UnsyncedAnswer::Done | UnsyncedAnswer::DoneIn { .. } => {
                UnsyncedAnswer::DoneIn { parent }
            }
            UnsyncedAnswer::Entry(attr) | UnsyncedAnswer::EntryIn { attr, .. } => {
                UnsyncedAnswer::EntryIn { attr, parent }
            }
            other => other,
        }
    }
}

/// The first position of every change feed: a mount that finds a new feed (its agent
/// restarted) reads it from here, so it misses nothing the new agent applied.
pub const FEED_START: u64 = 1;

/// Longest a [`FsRequest::Watch`] waits before it answers with no change.
pub const MAX_WATCH_MS: u32 = 10_000;

/// Longest an open waits for the mount's watcher to deliver the feed up to the open's
/// barrier: the mount before it checks the names an open used, the agent before it
/// answers an open of an inode with no name left `ESTALE`.
pub const DELIVERY_WAIT_MS: u64 = 2_000;

/// Names and inodes whose cached lookups and attributes a mount must drop, from the
/// agent's change feed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangeBatch {
    /// The feed: random per agent process. A new one means every earlier change is
    /// unknown (`reset`).
    pub epoch: u64,
    /// Ask for changes after this one next.
    pub next: u64,
    /// Changes were lost (the mount fell behind, the agent restarted, or a metadata
    /// snapshot was installed): drop everything cached.
    pub reset: bool,
    /// `(parent, name)` pairs that now resolve differently.
    pub names: Vec<(Ino, String)>,
    /// Inodes whose attributes changed.
    pub inodes: Vec<Ino>,
}

/// Why a filesystem request failed; each maps to one errno.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum FsError {
    #[error("no such file or directory")]
    NotFound,
    #[error("file exists")]
    Exists,
    #[error("not a directory")]
    NotDir,
    #[error("is a directory")]
    IsDir,
    #[error("directory not empty")]
    NotEmpty,
    #[error("invalid argument")]
    Invalid,
    #[error("file name too long")]
    NameTooLong,
    #[error("too many links")]
    TooManyLinks,
    #[error("no space left on the cluster")]
    NoSpace,
    #[error("operation not permitted")]
    NotPermitted,
    #[error("file too large")]
    TooBig,
    /// The cluster cannot serve the request now (no metadata quorum, too few nodes); the
    /// text says why.
    #[error("cluster unavailable: {0}")]
    Unavailable(String),
    /// Any other failure; the text is for the operator.
    #[error("I/O error: {0}")]
    Io(String),
    /// Open: the inode has no name left (another node replaced or removed the file since
    /// the kernel looked the name up); the kernel looks the name up again and opens what
    /// it names now. Sent to clients of protocol 6 and later.
    #[error("stale file handle")]
    Stale,
}

impl FsError {
    /// The errno the mount answers with.
    pub fn errno(&self) -> i32 {
        match self {
            FsError::NotFound => 2,        // ENOENT
            FsError::Exists => 17,         // EEXIST
            FsError::NotDir => 20,         // ENOTDIR
            FsError::IsDir => 21,          // EISDIR
            FsError::NotEmpty => 39,       // ENOTEMPTY
            FsError::Invalid => 22,        // EINVAL
            FsError::NameTooLong => 36,    // ENAMETOOLONG
            FsError::TooManyLinks => 31,   // EMLINK
            FsError::NoSpace => 28,        // ENOSPC
            FsError::NotPermitted => 1,    // EPERM
            FsError::TooBig => 27,         // EFBIG
            FsError::Unavailable(_) => 11, // EAGAIN
            FsError::Io(_) => 5,           // EIO
            FsError::Stale => 116,         // ESTALE
        }
    }
}

/// The agent's answer to one [`FsRequest`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum FsResponse {
    /// Lookup, MkNode, Link: the entry's attributes.
    Entry(FileAttr),
    /// GetAttr, SetAttr, Open, Write: the inode's attributes after the request.
    Attr(FileAttr),
    /// Unlink, Rmdir, Rename, Release.
    Done,
    ReadLink(String),
    /// ReadDir: one page of entries; `more` when the directory goes on after them.
    Entries {
        entries: Vec<DirEntry>,
        more: bool,
    },
    Data(#[serde(with = "serde_bytes")] Vec<u8>),
    StatFs(FsStats),
    Layout(FileLayout),
    Error(FsError),
    /// Watch.
    Changes(ChangeBatch),
    /// Open, to clients of protocol 8 on: the attributes, and the change feed's position
    /// once the open's read barrier was passed (a mount drops what changed up to there
    /// before it trusts the names the kernel resolved).
    Opened {
        attr: FileAttr,
        changes: u64,
    },
    /// Open, to clients of protocol 9 on: as `Opened`, with the feed the position is of
    /// (after an agent restart, a position in the new feed says nothing of the old one).
    OpenedIn {
        attr: FileAttr,
        epoch: u64,
        changes: u64,
    },
    /// Lookup, to clients of protocol 9 on: the entry, and the feed's position before it
    /// was read (every change before that position is reflected in the answer, so a mount
    /// that delivers such a change later does not take the name for changed since).
    EntryAt {
        attr: FileAttr,
        epoch: u64,
        position: u64,
    },
    /// The answer to a change made under a directory lease, to clients of protocol 12
    /// on: applied on this node, committed by the agent within its
    /// `metadata_writeback_ms`, durable after the next `Sync` naming it.
    Unsynced(UnsyncedAnswer),
    /// `Sync` done. `instance`: random per agent process. `clean_start`: the agent process
    /// before this one on the node committed everything it answered before it stopped
    /// (it was stopped, not killed), so a mount whose connection failed lost nothing it
    /// was answered.
    Synced {
        instance: u64,
        clean_start: bool,
    },
}
