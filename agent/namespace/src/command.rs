//! What the replicated log carries: a batch of [`Proposal`]s per entry, each one
//! namespace or layout change, and the [`Outcome`] the state machine gives back.
//!
//! Everything a command needs to apply deterministically is in the command: the time
//! (`now`, the proposer's clock, for file times), owners, stripe records. Applying the same
//! log on any replica gives the same state and the same outcomes. What must not depend on
//! any one agent's wall clock (when a mount session counts as idle, when a fence may be
//! forgotten) runs on the cluster clock instead, advanced by the leader's stamps.

use serde::{Deserialize, Serialize};
use shoal_agent_api as api;

use crate::format::{
    ColdLocation, FileAttr, FileKind, FsError, Ino, Owner, RenameFlags, RequestId, SetAttr,
    StripeRecord, Timestamp,
};
use shoal_placement::{Layout, NodeId, StripeId};

use crate::nodes::NodeChange;

/// One log entry: proposals batched by the leader, applied in order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Batch {
    pub proposals: Vec<Proposal>,
    /// The leader's monotonic clock when it made the entry; `None` in entries written
    /// before stamps existed (log record version 1) and in entries not made by a leader's
    /// batcher. See [`LeaderStamp`].
    pub stamp: Option<LeaderStamp>,
}

impl Batch {
    /// A batch without a stamp (it does not advance the cluster clock).
    pub fn new(proposals: Vec<Proposal>) -> Batch {
        Batch {
            proposals,
            stamp: None,
        }
    }
}

/// A reading of the proposing leader's monotonic clock. The cluster clock advances by the
/// difference between two stamps of the same leader `run` (one process lifetime of one
/// leader); a stamp of another run advances it by nothing. So no agent's wall clock,
/// however skewed, moves it, and every replica computes the same value from the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaderStamp {
    /// Random, drawn once per leader process.
    pub run: u64,
    /// Milliseconds on that process's monotonic clock.
    pub millis: u64,
}

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
    /// overlap); size grows to the end of the last byte written. `inline_version` says
    /// which inline bytes the writer put in its first extent: it must be the inode's data
    /// version if the inode holds inline data (which is then dropped), and `None` if it
    /// holds none; otherwise the answer is [`Outcome::Conflict`] and nothing changes.
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
    /// Fences stripes whose shards a node wants to delete because no extent references
    /// them (a writer that failed or crashed before its commit). Stripes the metadata knows
    /// (live or garbage) are left alone; the rest are recorded as abandoned, and a later
    /// [`Command::WriteExtents`] naming one is refused with
    /// [`Outcome::StripeAbandoned`]. Answered with [`Outcome::Abandoned`]: the ids whose
    /// shards may now be deleted.
    AbandonStripes {
        ids: Vec<StripeId>,
    },
    /// Records the generation (start count, kept in the node's data dir) each node runs
    /// with; a record only ever grows. A node that starts with a data dir whose last
    /// generation is below its record runs on a stale copy (a restored backup): it must
    /// not vote or acknowledge with that state.
    RecordGenerations {
        generations: Vec<(NodeId, u64)>,
    },
    /// Moves shards of a live stripe, each only if its slot still names `from`
    /// (compare-and-set): repair commits rebuilt shards this way once they are durable on
    /// `to`, and a node gives up a corrupt shard of its own with `to` = [`NodeId::NONE`].
    /// Refused with [`Outcome::Conflict`] (nothing changed) when a slot names another
    /// node, a target already holds another slot of the stripe, or a target was disowned
    /// for that slot (see [`Command::DisownShards`]; [`Command::RelocateShardsPlanned`]
    /// is refused only by fences it could not have seen); with `NotFound` when the stripe
    /// is not live.
    RelocateShards {
        stripe: StripeId,
        moves: Vec<ShardMove>,
    },
    /// `node` asks to delete shards it holds that the stripe records do not name there (a
    /// repair that stored them but never committed, or a slot moved away while the node
    /// was out). Shards whose slot does name `node` are kept; the others are fenced: a
    /// later [`Command::RelocateShards`] of that slot to `node` is refused (one planned
    /// before the fence, when it says when it was planned), so a late commit of an old
    /// repair cannot point at a deleted shard. Shards of stripes the
    /// metadata does not know are left to [`Command::AbandonStripes`]. Answered with
    /// [`Outcome::Disowned`]: the shards `node` may now delete.
    DisownShards {
        node: NodeId,
        shards: Vec<(StripeId, u8)>,
    },
    /// An operator change to a node of the layout (drain, maintenance, removal; see
    /// [`NodeChange`]): a new layout epoch, or [`Outcome::Refused`] with the reason.
    ChangeNode {
        node: NodeId,
        change: NodeChange,
    },
    /// The mover uploaded `object` (`size` bytes, verified) holding these stripes' bytes:
    /// each stripe still live and not cold becomes cold at its location and its shard
    /// slots name no node from now on (each holder then deletes its copy as a leftover).
    /// Answered with [`Outcome::Tiered`]: the stripes now cold. An object none of whose
    /// stripes became cold is recorded as garbage, to be deleted from the bucket.
    TierStripes {
        object: u128,
        size: u64,
        stripes: Vec<(StripeId, ColdLocation)>,
    },
    /// Garbage objects deleted from the bucket: forgotten.
    ObjectsDeleted {
        objects: Vec<u128>,
    },
    /// These inodes were read: their heat becomes the cluster time of this entry.
    RecordReads {
        inos: Vec<Ino>,
    },
    /// A cold stripe's bytes written back to NVMe (recall, prefetch) as the new stripe
    /// `warm`: every extent of `ino` that uses `stripe` uses `warm` from now on, and the
    /// cold one goes to garbage. [`Outcome::Conflict`] (nothing changed) when `stripe` is
    /// no longer cold or not used by `ino`; [`Outcome::StripeAbandoned`] when `warm` was
    /// abandoned.
    WarmStripe {
        ino: Ino,
        stripe: StripeId,
        warm: StripeRecord,
    },
    /// Objects found in the bucket that the metadata does not know (an upload whose commit
    /// was lost), with their sizes: each one still unknown when this applies becomes
    /// garbage, so a `TierStripes` naming it later is refused, and the collector may delete
    /// it. Known ones are left alone (their commit came first). Answered with
    /// [`Outcome::Orphaned`]: the objects now garbage.
    ObjectsOrphaned {
        objects: Vec<(u128, u64)>,
    },
    /// Keeps inode `ino` (a file, or a directory with everything below it) out of the
    /// cold tier (`pinned`), or lets it go again. `NotFound` for an inode that is gone.
    SetPin {
        ino: Ino,
        pinned: bool,
    },
    /// Revokes every certificate of node name `name` issued before `before_ms` (unix
    /// milliseconds, the proposer's clock); `node` is the node the name belonged to. A
    /// later revocation of a name moves its moment forward, never back.
    RevokeCertificates {
        name: String,
        node: NodeId,
        before_ms: u64,
    },
    /// [`Command::RelocateShards`] planned on a replica whose cluster clock read
    /// `planned_at_ms`: a fence on a target set before that (so the planner saw it, and
    /// the target's node refuses the slot's shard until it has deleted its copy; see
    /// `workers/gc.rs`) does not refuse it. Only a fence set at that clock or later does:
    /// that one may be for this very relocation's shard.
    RelocateShardsPlanned {
        stripe: StripeId,
        moves: Vec<ShardMove>,
        planned_at_ms: u64,
    },
    /// `holder` takes the lease on directory `dir` (see `lease.rs`): from now on only its
    /// [`Command::LeasedBatch`] ops change the directory's entries (and the directory's
    /// own attributes); every other command that would is refused with
    /// [`Outcome::Leased`]. Answered with [`Outcome::DirLease`] and the lease's epoch (a
    /// new one each time, a holder taking its own lease again included, so ops of an
    /// earlier grant are refused), or [`Outcome::Leased`] when another node holds it.
    TakeDirLease {
        dir: Ino,
        holder: NodeId,
    },
    /// Ends the lease on `dir` if its epoch is `epoch`: its holder returning it, or
    /// another node breaking it after a recall went unanswered. [`Outcome::Done`], or
    /// [`Outcome::Conflict`] (nothing changed) when the lease is another one or none.
    ReturnDirLease {
        dir: Ino,
        epoch: u64,
    },
    /// Hands out `count` inode numbers (1 to [`MAX_INO_RANGE`]) for lease holder
    /// `holder` to create inodes with, in increasing order: [`Outcome::Inos`]. No other
    /// command allocates them, and only that holder's creates may use them.
    TakeInos {
        holder: NodeId,
        count: u64,
    },
    /// A lease holder's changes, in the order it answered them: each op applies only if
    /// its directory's lease (and a rename's target directory's) is still `holder`'s at
    /// the op's epoch, and is refused with [`Outcome::LeaseLost`] otherwise (the fence: a
    /// holder cut off never changes a directory after another node acted on it). The
    /// holder sends only ops it answered as done, so an op that does not apply so (any
    /// outcome but `Attr` or `Done`) means its view was wrong: the holder's leases on the
    /// directories that op names end with it, and its later ops there are refused as
    /// lost. Answered with [`Outcome::Batch`], one outcome per op.
    ///
    /// The four lease commands are proposed only while every member runs a release that
    /// knows them.
    LeasedBatch {
        holder: NodeId,
        ops: Vec<LeasedOp>,
    },
}

/// The most inode numbers one [`Command::TakeInos`] hands out.
pub const MAX_INO_RANGE: u64 = 1 << 20;

/// One change a lease holder answered: in directory `dir`, under its lease of `epoch`,
/// at the holder's time `now` (file times are the holder's, as it answered them).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LeasedOp {
    pub dir: Ino,
    pub epoch: u64,
    pub now: Timestamp,
    pub change: LeasedChange,
}

impl LeasedOp {
    /// The command this op applies as (a create's inode number aside).
    pub fn command(&self) -> Command {
        let dir = self.dir;
        match self.change.clone() {
            LeasedChange::MkNode {
                name,
                kind,
                perm,
                owner,
                rdev,
                target,
                ..
            } => Command::MkNode {
                parent: dir,
                name,
                kind,
                perm,
                owner,
                rdev,
                target,
            },
            LeasedChange::Link { ino, name } => Command::Link {
                ino,
                new_parent: dir,
                new_name: name,
            },
            LeasedChange::Unlink { name } => Command::Unlink { parent: dir, name },
            LeasedChange::Rmdir { name } => Command::Rmdir { parent: dir, name },
            LeasedChange::Rename {
                name,
                new_dir,
                new_name,
                flags,
                ..
            } => Command::Rename {
                parent: dir,
                name,
                new_parent: new_dir,
                new_name,
                flags,
            },
            LeasedChange::SetAttr { ino, set } => Command::SetAttr { ino, set },
            LeasedChange::WriteInline {
                ino,
                offset,
                data,
                max_inline,
            } => Command::WriteInline {
                ino,
                offset,
                data,
                max_inline,
            },
            LeasedChange::WriteExtents {
                ino,
                inline_version,
                extents,
                ..
            } => Command::WriteExtents {
                ino,
                inline_version,
                extents,
            },
        }
    }
}

/// What a [`LeasedOp`] does; each is the command of the same name with `dir` as the
/// parent, and applies with the same rules.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum LeasedChange {
    /// A new inode numbered `ino`: one of the holder's [`Command::TakeInos`] numbers,
    /// above every number it created with before (else `Failed(Invalid)`). A new
    /// directory is leased to the holder at the op's epoch.
    MkNode {
        ino: Ino,
        name: String,
        kind: FileKind,
        perm: u16,
        owner: Owner,
        rdev: u32,
        target: Option<String>,
    },
    Link {
        ino: Ino,
        name: String,
    },
    Unlink {
        name: String,
    },
    /// A leased subdirectory goes only with its own lease held by the same holder (the
    /// lease ends with it).
    Rmdir {
        name: String,
    },
    /// Into `new_dir`, under its lease of `new_epoch` (`dir` and `epoch` again for a
    /// rename within the directory). A directory renamed over goes as with `Rmdir`.
    Rename {
        name: String,
        new_dir: Ino,
        new_epoch: u64,
        new_name: String,
        flags: RenameFlags,
    },
    /// Of a file of the directory, or of the directory itself (another directory's own
    /// attributes go under that directory's lease: `Failed(Invalid)`).
    SetAttr {
        ino: Ino,
        set: SetAttr,
    },
    /// Into a file of the directory.
    WriteInline {
        ino: Ino,
        offset: u64,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
        max_inline: u64,
    },
    /// Extents of a file of the directory, written to stripes (every shard durable)
    /// before the op was answered. Refused with [`Outcome::StripeAbandoned`] once the
    /// cluster clock is past `commit_by_ms`: a batch that late may find its shards given
    /// up for orphans, and once the abandon record itself has expired no fence would see
    /// it. The holder sets it from its replica's clock and its commit wait.
    WriteExtents {
        ino: Ino,
        inline_version: Option<u64>,
        extents: Vec<NewExtent>,
        commit_by_ms: u64,
    },
}

/// One shard of a stripe moving from one node to another: the shard's index, the node
/// its slot must name now, the node that holds it from now on (or [`NodeId::NONE`]) and
/// the checksum of its bytes there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardMove {
    pub index: u8,
    pub from: NodeId,
    pub to: NodeId,
    pub crc32c: u32,
}

impl Command {
    /// Refuses, before it is proposed, a command whose names or symlink target no
    /// directory may hold: the log should not carry (and replicate) what every replica
    /// would refuse anyway. Applying checks the same again.
    pub fn precheck(&self) -> Result<(), api::FsError> {
        use crate::namespace::{SYMLINK_MAX, check_name};
        let long = |name: &str| {
            if name.len() > shoal_agent_api::NAME_MAX {
                Err(api::FsError::NameTooLong)
            } else {
                Ok(())
            }
        };
        match self {
            Command::MkNode { name, target, .. } => {
                check_name(name)?;
                if target.as_ref().is_some_and(|t| t.len() > SYMLINK_MAX) {
                    return Err(api::FsError::NameTooLong);
                }
                Ok(())
            }
            Command::Link { new_name, .. } => check_name(new_name),
            Command::Unlink { name, .. } | Command::Rmdir { name, .. } => long(name),
            Command::Rename { name, new_name, .. } => {
                long(name)?;
                check_name(new_name)
            }
            Command::WriteInline {
                data, max_inline, ..
            } if data.len() as u64 > *max_inline => Err(api::FsError::Invalid),
            _ => Ok(()),
        }
    }
}

impl Outcome {
    /// Whether a repeat of the request is answered with this outcome: every outcome but a
    /// lease's refusal, which changed nothing (its proposer recalls the lease and asks
    /// again with the same request id).
    pub fn remembered(&self) -> bool {
        !matches!(self, Outcome::Leased { .. })
    }

    /// Whether an op of a lease holder's batch applied as the holder answered it.
    pub fn applied(&self) -> bool {
        matches!(self, Outcome::Attr(_) | Outcome::Done)
    }
}

/// What applying one proposal gave.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Outcome {
    /// MkNode, Link: the new entry. SetAttr, WriteInline, WriteExtents: the inode after.
    Attr(FileAttr),
    /// Unlink, Rmdir, Rename, Purge, StripesFreed, SetLayout, RelocateShards(Planned).
    Done,
    /// WriteInline refused: the data must go to stripes. `inline` is the inode's current
    /// inline data and version, for the writer to carry over.
    NotInline {
        #[serde(with = "serde_bytes")]
        inline: Vec<u8>,
        version: u64,
    },
    /// WriteExtents refused: the inline data changed since the writer read it.
    /// RelocateShards refused: a slot no longer names the node the move expected, or a
    /// target may not take the shard.
    Conflict,
    /// The namespace refused the command (the errno for the caller).
    Failed(FsError),
    /// AbandonStripes: the stripes now fenced (no longer writable into a file).
    Abandoned(Vec<StripeId>),
    /// WriteExtents refused: this stripe was abandoned (its shards may be gone); nothing
    /// changed. The writer writes its data to new stripes and commits again.
    StripeAbandoned(StripeId),
    /// DisownShards: the shards the asking node may now delete.
    Disowned(Vec<(StripeId, u8)>),
    /// ChangeNode refused, with the reason for the operator; nothing changed.
    Refused(String),
    /// TierStripes: the stripes now cold.
    Tiered(Vec<StripeId>),
    /// ObjectsOrphaned: the objects now garbage.
    Orphaned(Vec<u128>),
    /// TakeDirLease: the lease is the asking node's, with this epoch.
    DirLease { epoch: u64 },
    /// Refused, nothing changed: directory `dir` is leased to `holder`, whose lease must
    /// be recalled (or broken) first.
    Leased { dir: Ino, holder: NodeId },
    /// TakeInos: the numbers `[start, end)`.
    Inos { start: Ino, end: Ino },
    /// LeasedBatch: each op's outcome, in order.
    Batch(Vec<Outcome>),
    /// A leased op refused, nothing changed: the lease it was answered under has ended.
    LeaseLost,
}

#[cfg(test)]
mod tests {
    use shoal_agent_api::{FsError, NAME_MAX, ROOT_INO};

    use super::Command;
    use crate::format::{FileKind, RenameFlags};
    use crate::testkit::mknode_cmd;

    #[test]
    fn precheck_refuses_names_and_targets_too_long_to_hold() {
        let long = "n".repeat(NAME_MAX + 1);
        assert_eq!(
            mknode_cmd(ROOT_INO, &long, FileKind::File).precheck(),
            Err(FsError::NameTooLong)
        );
        assert_eq!(
            mknode_cmd(ROOT_INO, "a/b", FileKind::File).precheck(),
            Err(FsError::Invalid)
        );
        let mut link = mknode_cmd(ROOT_INO, "l", FileKind::Symlink);
        if let Command::MkNode { target, .. } = &mut link {
            *target = Some("t".repeat(4096));
        }
        assert_eq!(link.precheck(), Err(FsError::NameTooLong));
        let rename = Command::Rename {
            parent: ROOT_INO,
            name: "a".into(),
            new_parent: ROOT_INO,
            new_name: long.clone(),
            flags: RenameFlags::default(),
        };
        assert_eq!(rename.precheck(), Err(FsError::NameTooLong));
        let inline = Command::WriteInline {
            ino: 2,
            offset: 0,
            data: vec![0; 10],
            max_inline: 9,
        };
        assert_eq!(inline.precheck(), Err(FsError::Invalid));
        assert_eq!(
            mknode_cmd(ROOT_INO, &"n".repeat(NAME_MAX), FileKind::File).precheck(),
            Ok(())
        );
    }
}
