//! The holder's side of directory leases (`agent/namespace/src/lease.rs` is the state
//! machine's): the changes this node answered in the directories it holds, not yet seen
//! committed, and how each one is answered.
//!
//! An op is answered by speculation (`NamespaceStore::speculate`): every batch not yet
//! seen committed and the ops since the last one, then the new op, applied to the
//! replica's state by the code that will apply them from the log, and thrown away. Under
//! the lease nothing else changes the directory's entries, so that answer is the one the
//! committed batch gives; an op the speculation refuses is answered with its error and
//! never sent. What the answered ops changed (the speculation's overlay) answers lookups
//! and attributes before the replica does.
//!
//! Exact for what the lease fences, which is all a holder answers by design; not for
//! what it does not: whether an unleased subdirectory is empty (for an `rmdir` or a
//! rename over it), the ancestors of a leased directory (it may be moved), the link count
//! of an inode linked in, or inline data another node moved to stripes. An answer those
//! make wrong comes back as a failure, and the state machine ends the holder's leases on
//! the directories that op named, so nothing after it applies with another meaning.
//!
//! Ops go to the group in the order they were answered, in every leased directory
//! together: one stream of batches ([`LeaseHolder::seal`]), each committed before the
//! next is sent (a rename between two leased directories, or an `rmdir` of a leased
//! subdirectory after the unlinks in it, depends on that order). A committed op whose
//! outcome is not the one answered (its lease was broken, or a change the lease does not
//! fence came first) is kept as a failure for the next `fsync` or `close` to report
//! ([`LeaseHolder::take_failures`]); a lease whose op was refused as lost is forgotten.
//!
//! What is answered here, by design (the mount's side is not wired yet): creates, links,
//! unlinks, rmdirs and renames of entries of a leased directory, and setattr and inline
//! writes of inodes created under a lease that have no name outside it. Anything else
//! that touches a leased directory commits the pending batches first.
//!
//! A holder answers from its leases only within [`LEASE_TERM`] of the start of its last
//! successful round with the group (a grant, a commit, a barrier: the caller says when
//! each began, [`LeaseHolder::renewed`]); a node that breaks a lease waits twice that after
//! its recall went unanswered, so a holder cut off from the group has stopped answering by
//! then. Its batches after a break are refused by the epoch fence whatever the clocks do:
//! the term only bounds how long a cut-off holder's mount is answered from a lease it may
//! have lost.
//!
//! Pure apart from the replica it speculates on: the caller passes the clock; no network,
//! no tasks.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use shoal_agent_api::{FileAttr, FileKind, FsError, Ino, RequestId};
use shoal_namespace::format::Timestamp;
use shoal_namespace::{
    Command, DirLease, LeasedChange, LeasedOp, NamespaceError, NamespaceStore, Outcome, Overlay,
    OverlayInode, Proposal,
};
use shoal_placement::NodeId;
use tokio::time::Instant;

/// Ops answered since the last batch: at most this many before one is sealed (each
/// answer speculates over everything pending: about 1.2 µs per op pending, measured).
pub const MAX_OPEN_OPS: usize = 256;

/// Bytes of ops (about: their data and names) in one batch, at most: a batch is one log
/// entry, and an entry must fit one append message to a follower (the batcher keeps its
/// entries under 1 MiB; a bigger one could never be replicated). An op that would pass it
/// seals the batch before it.
pub const MAX_BATCH_BYTES: usize = 512 << 10;

/// How long after the start of its last successful round with the group a holder answers
/// from its leases (see the module doc).
pub const LEASE_TERM: Duration = Duration::from_secs(5);

/// A batch sent (or to send) to the group, with what each of its ops was answered.
struct Sealed {
    proposal: Proposal,
    answers: Vec<Outcome>,
}

impl Sealed {
    fn ops(&self) -> &[LeasedOp] {
        match &self.proposal.command {
            Command::LeasedBatch { ops, .. } => ops,
            _ => &[],
        }
    }
}

/// An answered op whose commit did not go as answered.
#[derive(Clone, Debug, PartialEq)]
pub struct LostOp {
    pub op: LeasedOp,
    pub answered: Outcome,
    pub committed: Outcome,
}

/// This node's leases and its changes answered under them, not yet seen committed.
pub struct LeaseHolder {
    node: NodeId,
    /// The request-id client of this holder's batches (one per agent start).
    session: u64,
    next_seq: u64,
    /// Directory → epoch of the lease held on it.
    leases: BTreeMap<Ino, u64>,
    /// Inode numbers handed out to this node (`TakeInos`) and not used, as ranges in
    /// increasing order (the state machine takes each holder's numbers in that order).
    inos: VecDeque<(Ino, Ino)>,
    sealed: VecDeque<Sealed>,
    open: Vec<LeasedOp>,
    open_answers: Vec<Outcome>,
    /// About how many bytes the open ops take ([`op_bytes`]).
    open_bytes: usize,
    overlay: Overlay,
    failures: Vec<LostOp>,
    /// When the last successful round with the group began.
    renewed: Option<Instant>,
}

impl LeaseHolder {
    pub fn new(node: NodeId, session: u64) -> LeaseHolder {
        LeaseHolder {
            node,
            session,
            next_seq: 1,
            leases: BTreeMap::new(),
            inos: VecDeque::new(),
            sealed: VecDeque::new(),
            open: Vec::new(),
            open_answers: Vec::new(),
            open_bytes: 0,
            overlay: Overlay::default(),
            failures: Vec::new(),
            renewed: None,
        }
    }

    /// The proposal that takes the lease on `dir` for this node; `None` while it holds it
    /// (a new grant would refuse every op pending under the one it has).
    pub fn take_command(&self, dir: Ino) -> Option<Command> {
        (!self.leases.contains_key(&dir)).then_some(Command::TakeDirLease {
            dir,
            holder: self.node,
        })
    }

    /// The proposal that hands this node `count` more inode numbers.
    pub fn inos_command(&self, count: u64) -> Command {
        Command::TakeInos {
            holder: self.node,
            count,
        }
    }

    /// The lease on `dir` was granted at `epoch`, by a round that began at `began`. The
    /// replica must have applied the grant (a commit's answer comes from the leader's
    /// apply: wait for the local one first), or the speculations refuse every op under it.
    pub fn granted(&mut self, dir: Ino, epoch: u64, began: Instant) {
        self.leases.insert(dir, epoch);
        self.renewed(began);
    }

    /// A round with the group that began at `began` succeeded (a commit, a barrier).
    pub fn renewed(&mut self, began: Instant) {
        self.renewed = Some(self.renewed.map_or(began, |r| r.max(began)));
    }

    /// Whether the holder answers from its leases at `now` (see the module doc).
    pub fn answering(&self, now: Instant) -> bool {
        self.renewed
            .is_some_and(|r| now.saturating_duration_since(r) < LEASE_TERM)
    }

    /// The epoch of the lease held on `dir`.
    pub fn epoch(&self, dir: Ino) -> Option<u64> {
        self.leases.get(&dir).copied()
    }

    /// The directories leased and their epochs.
    pub fn held(&self) -> Vec<(Ino, u64)> {
        self.leases.iter().map(|(&d, &e)| (d, e)).collect()
    }

    /// Inode numbers `[start, end)` were handed out to this node.
    pub fn add_inos(&mut self, start: Ino, end: Ino) {
        if start < end {
            self.inos.push_back((start, end));
        }
    }

    /// How many handed-out inode numbers are left.
    pub fn inos_left(&self) -> u64 {
        self.inos.iter().map(|(s, e)| e - s).sum()
    }

    /// The number the next create would get.
    #[cfg(test)]
    fn peek_ino(&self) -> Option<Ino> {
        self.inos.front().map(|r| r.0)
    }

    fn next_ino(&mut self) -> Option<Ino> {
        let (start, end) = self.inos.pop_front()?;
        if start + 1 < end {
            self.inos.push_front((start + 1, end));
        }
        Some(start)
    }

    /// How many sealed batches wait to be committed (the one a flush is sending among
    /// them).
    pub fn sealed_count(&self) -> usize {
        self.sealed.len()
    }

    /// Whether the writeback should go now rather than at its interval, after an answer
    /// made while `sealed_before` batches were sealed: `wake_at` ops are open, or the
    /// answer sealed a batch full. A batch being committed is no reason: the ops answered
    /// meanwhile wait for the next interval (or for `wake_at` of them), so they go as one
    /// entry rather than one entry per round of the group.
    pub fn wants_writeback(&self, sealed_before: usize, wake_at: usize) -> bool {
        self.open.len() >= wake_at || self.sealed.len() > sealed_before
    }

    /// How many ops were answered since the last batch was sealed.
    pub fn open_ops(&self) -> usize {
        self.open.len()
    }

    /// Whether ops wait to be committed (answered, sealed or not).
    pub fn pending(&self) -> bool {
        !self.open.is_empty() || !self.sealed.is_empty()
    }

    /// Whether ops answered in `dir` wait to be committed.
    pub fn pending_in(&self, dir: Ino) -> bool {
        let in_dir = |op: &LeasedOp| {
            op.dir == dir
                || matches!(op.change, LeasedChange::Rename { new_dir, .. } if new_dir == dir)
        };
        self.open.iter().any(in_dir) || self.sealed.iter().any(|s| s.ops().iter().any(in_dir))
    }

    /// Answers `change` in leased directory `dir` at the holder's time `now` (a create's
    /// `ino` is filled in here, from the handed-out numbers). An answer that is not a
    /// success is not sent. `Err(FsError::Unavailable)` when no lease is held on `dir`
    /// (or a rename's target), no inode number is left, too many ops wait, or the lease
    /// term ran out at `clock`: the caller takes the normal path, or commits first.
    pub fn answer(
        &mut self,
        store: &NamespaceStore,
        dir: Ino,
        mut change: LeasedChange,
        now: Timestamp,
        clock: Instant,
    ) -> Result<Outcome, NamespaceError> {
        let unavailable = |why: &str| Err(NamespaceError::Fs(FsError::Unavailable(why.into())));
        let Some(epoch) = self.epoch(dir) else {
            return unavailable("no lease on the directory");
        };
        if !self.answering(clock) {
            return unavailable("no round with the metadata group within the lease term");
        }
        if let LeasedChange::Rename {
            new_dir, new_epoch, ..
        } = &mut change
        {
            match self.epoch(*new_dir) {
                Some(e) => *new_epoch = e,
                None => return unavailable("no lease on the rename's target directory"),
            }
        }
        if self.open.len() >= MAX_OPEN_OPS {
            return unavailable("too many changes wait to be sealed");
        }
        let new_dir =
            matches!(&change, LeasedChange::MkNode { kind, .. } if *kind == FileKind::Dir);
        let number = match &mut change {
            LeasedChange::MkNode { ino, .. } => {
                let Some(next) = self.next_ino() else {
                    return unavailable("no inode numbers left");
                };
                *ino = next;
                Some(next)
            }
            _ => None,
        };
        let bytes = op_bytes(&change);
        if !self.open.is_empty() && self.open_bytes + bytes > MAX_BATCH_BYTES {
            self.seal();
        }
        self.open_bytes += bytes;
        self.open.push(LeasedOp {
            dir,
            epoch,
            now,
            change,
        });
        let speculation = match store.speculate(&self.proposals()) {
            Ok(s) => s,
            Err(e) => {
                self.undo_last(number);
                return Err(e);
            }
        };
        let answer = match speculation.outcomes.last() {
            Some((Outcome::Batch(outcomes), _)) => outcomes.last().cloned(),
            _ => None,
        };
        let Some(answer) = answer else {
            self.undo_last(number);
            return Err(NamespaceError::Corrupt(
                "a speculation of the open batch gave no outcome for its last op".into(),
            ));
        };
        if answer.applied() {
            self.open_answers.push(answer.clone());
            self.overlay = speculation.overlay;
            // The group leases a directory made under a lease to its maker, at that
            // lease's epoch, when it commits the op (`lease.rs`).
            if new_dir && let Some(ino) = number {
                self.leases.insert(ino, epoch);
            }
        } else {
            self.undo_last(number);
        }
        Ok(answer)
    }

    fn undo_last(&mut self, number: Option<Ino>) {
        if let Some(op) = self.open.pop() {
            self.open_bytes -= op_bytes(&op.change);
        }
        if let Some(ino) = number {
            self.inos.push_front((ino, ino + 1));
        }
    }

    /// The batches not yet seen committed, and the open ops as one more (without a
    /// request id: it was never sent).
    fn proposals(&self) -> Vec<Proposal> {
        let mut all: Vec<Proposal> = self.sealed.iter().map(|s| s.proposal.clone()).collect();
        if !self.open.is_empty() {
            all.push(Proposal {
                id: None,
                now: self.open[self.open.len() - 1].now,
                command: Command::LeasedBatch {
                    holder: self.node,
                    ops: self.open.clone(),
                },
            });
        }
        all
    }

    /// Seals the ops answered since the last batch into one; `None` when there are none.
    /// Batches are committed in the order they are sealed: send the next only after
    /// [`LeaseHolder::committed`] took the previous one's outcome.
    pub fn seal(&mut self) -> Option<&Proposal> {
        if self.open.is_empty() {
            return None;
        }
        let ops = std::mem::take(&mut self.open);
        let answers = std::mem::take(&mut self.open_answers);
        self.open_bytes = 0;
        let id = RequestId {
            client: self.session,
            seq: self.next_seq,
        };
        self.next_seq += 1;
        self.sealed.push_back(Sealed {
            proposal: Proposal {
                id: Some(id.into()),
                now: ops[ops.len() - 1].now,
                command: Command::LeasedBatch {
                    holder: self.node,
                    ops,
                },
            },
            answers,
        });
        self.sealed.back().map(|s| &s.proposal)
    }

    /// The oldest sealed batch, to send (again, with the same request id, until its
    /// outcome is known).
    pub fn next_to_commit(&self) -> Option<&Proposal> {
        self.sealed.front().map(|s| &s.proposal)
    }

    /// The oldest sealed batch committed with `outcome` (its outcome from the log, never a
    /// failure to send it: that batch is sent again): ops that did not go as answered
    /// become failures, leases that ended are forgotten, and the overlay is what is still
    /// pending. `store` must have applied the batch (see [`LeaseHolder::granted`]). An
    /// outcome that is not this batch's leaves it pending and is an error.
    pub fn committed(
        &mut self,
        store: &NamespaceStore,
        outcome: &Outcome,
    ) -> Result<(), NamespaceError> {
        let Some(sealed) = self.sealed.front() else {
            return Ok(());
        };
        let committed = match outcome {
            Outcome::Batch(outcomes) if outcomes.len() == sealed.ops().len() => outcomes,
            other => {
                return Err(NamespaceError::Corrupt(format!(
                    "a batch of {} ops committed with {other:?}",
                    sealed.ops().len()
                )));
            }
        };
        let lost: Vec<LostOp> = (sealed.ops().iter().zip(&sealed.answers).zip(committed))
            .filter(|((_, answered), got)| answered != got)
            .map(|((op, answered), got)| LostOp {
                op: op.clone(),
                answered: answered.clone(),
                committed: got.clone(),
            })
            .collect();
        self.failures.extend(lost);
        self.sealed.pop_front();
        // Leases that ended (broken by another node, or a leased directory removed by
        // this batch) are forgotten: the replica has applied the batch.
        let mut ended = Vec::new();
        for (&dir, &epoch) in &self.leases {
            let mine = DirLease {
                holder: self.node,
                epoch,
            };
            if store.dir_lease(dir)? != Some(mine) {
                ended.push(dir);
            }
        }
        for dir in ended {
            self.leases.remove(&dir);
        }
        self.refresh(store)
    }

    /// The overlay again from what is pending (after a commit, or a replica that moved).
    pub fn refresh(&mut self, store: &NamespaceStore) -> Result<(), NamespaceError> {
        self.overlay = if self.pending() {
            store.speculate(&self.proposals())?.overlay
        } else {
            Overlay::default()
        };
        Ok(())
    }

    /// The lease on `dir` was returned or broken: forgotten. Its ops still pending will be
    /// refused as lost when they commit.
    pub fn forget(&mut self, dir: Ino) {
        self.leases.remove(&dir);
    }

    /// Answered ops whose commit did not go as answered, since the last call.
    pub fn take_failures(&mut self) -> Vec<LostOp> {
        std::mem::take(&mut self.failures)
    }

    /// Entry `name` of `dir` as the pending ops left it: `Some(None)` removed; `None`
    /// when they did not touch it (the replica answers).
    pub fn entry(&self, dir: Ino, name: &str) -> Option<Option<Ino>> {
        self.overlay.entry(dir, name).map(|e| e.map(|(ino, _)| ino))
    }

    /// How many inline bytes `ino` holds as the pending ops left it: `Some(None)`
    /// deleted; `None` when they did not touch it.
    pub fn inline_len(&self, ino: Ino) -> Option<Option<usize>> {
        self.overlay.inode(ino).map(|o| o.map(|o| o.inline.len()))
    }

    /// Attributes of `ino` as the pending ops left them: `Some(None)` deleted; `None`
    /// when they did not touch it.
    pub fn attr(&self, ino: Ino) -> Option<Option<FileAttr>> {
        self.overlay
            .inode(ino)
            .map(|o| o.map(|o: &OverlayInode| o.attr.clone()))
    }
}

/// About how many bytes `change` takes in a batch: its data and names, and a little for
/// the rest.
fn op_bytes(change: &LeasedChange) -> usize {
    const REST: usize = 128;
    REST + match change {
        LeasedChange::MkNode { name, target, .. } => {
            name.len() + target.as_ref().map_or(0, String::len)
        }
        LeasedChange::Link { name, .. }
        | LeasedChange::Unlink { name }
        | LeasedChange::Rmdir { name } => name.len(),
        LeasedChange::Rename { name, new_name, .. } => name.len() + new_name.len(),
        LeasedChange::SetAttr { .. } => 0,
        LeasedChange::WriteInline { data, .. } => data.len(),
        LeasedChange::WriteExtents { extents, .. } => extents
            .iter()
            .map(|e| REST + e.stripe.shards.len() * 32)
            .sum(),
    }
}

#[cfg(test)]
#[path = "lease_holder_tests.rs"]
mod tests;
