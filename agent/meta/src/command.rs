//! What the replicated log carries: a batch of [`Proposal`]s per entry, each one
//! namespace or layout change, and the [`Outcome`] the state machine gives back.
//!
//! Everything a command needs to apply deterministically is in the command: the time
//! (`now`, the proposer's clock), owners, stripe records. Applying the same log on any
//! replica gives the same state and the same outcomes.

use serde::{Deserialize, Serialize};
use shoal_agent_api::{
    FileAttr, FileKind, FsError, Ino, Owner, RenameFlags, RequestId, SetAttr, StripeRecord,
    Timestamp,
};
use shoal_placement::{Layout, StripeId};

/// One log entry: proposals batched by the leader, applied in order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Batch(pub Vec<Proposal>);

/// One command and who asked for it. A second proposal with the same `id` is not applied
/// again: the state machine answers with the outcome of the first.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Proposal {
    pub id: Option<RequestId>,
    pub now: Timestamp,
    pub command: Command,
}

/// A new extent to commit: `len` bytes at file `offset` are bytes `[0, len)` of `stripe`
/// (whose shards are already durable).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewExtent {
    pub offset: u64,
    pub len: u64,
    pub stripe: StripeRecord,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Command {
    /// Creates a file, directory, symlink (`target`), fifo, socket or device node.
    /// New directories get the parent's setgid bit and group when the parent has setgid.
    MkNode {
        parent: Ino,
        name: String,
        kind: FileKind,
        perm: u16,
        owner: Owner,
        rdev: u32,
        target: Option<String>,
    },
    Link {
        ino: Ino,
        new_parent: Ino,
        new_name: String,
    },
    /// Removes a non-directory name. An inode whose last name goes becomes an orphan: it
    /// stays readable by number until [`Command::Purge`].
    Unlink {
        parent: Ino,
        name: String,
    },
    Rmdir {
        parent: Ino,
        name: String,
    },
    Rename {
        parent: Ino,
        name: String,
        new_parent: Ino,
        new_name: String,
        flags: RenameFlags,
    },
    /// Changes attributes; a size change truncates (dropping extents past the end) or
    /// extends with a hole.
    SetAttr {
        ino: Ino,
        set: SetAttr,
    },
    /// Writes `data` at `offset` into the inode's inline data. Refused with
    /// [`Outcome::NotInline`] (nothing changed) when the file has extents or the result
    /// would be longer than `max_inline`.
    WriteInline {
        ino: Ino,
        offset: u64,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
        max_inline: u64,
    },
    /// Commits extents written to stripes, in order (a later one wins where they
    /// overlap); size grows to the end of the last byte written. If the inode holds inline
    /// data, `inline_version` must equal its current data version, and the inline bytes
    /// are dropped (the writer has put them in the first extent); otherwise the answer is
    /// [`Outcome::Conflict`] and nothing changes.
    WriteExtents {
        ino: Ino,
        inline_version: Option<u64>,
        extents: Vec<NewExtent>,
    },
    /// Deletes an orphan inode (no names left, no longer open anywhere) and releases its
    /// stripes.
    Purge {
        ino: Ino,
    },
    /// Forgets stripes whose shards the garbage collector has deleted.
    StripesFreed {
        ids: Vec<StripeId>,
    },
    /// Installs a new cluster layout; refused with `Invalid` unless its epoch is greater
    /// than the current one.
    SetLayout {
        layout: Layout,
    },
}

/// What applying one proposal gave.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Outcome {
    /// MkNode, Link: the new entry. SetAttr, WriteInline, WriteExtents: the inode after.
    Attr(FileAttr),
    /// Unlink, Rmdir, Rename, Purge, StripesFreed, SetLayout.
    Done,
    /// WriteInline refused: the data must go to stripes. `inline` is the inode's current
    /// inline data and version, for the writer to carry over.
    NotInline {
        #[serde(with = "serde_bytes")]
        inline: Vec<u8>,
        version: u64,
    },
    /// WriteExtents refused: the inline data changed since the writer read it.
    Conflict,
    /// The namespace refused the command (the errno for the caller).
    Failed(FsError),
}
