//! A node's directory leases with its metadata group: [`LeaseHolder`]'s answers, taken,
//! committed and given back through the group; the mount's requests reach it through
//! `leased.rs`, the batches go out from the [`LeaseFlush`](super::LeaseFlush) worker.
//!
//! When to hold one ([`Leases::lease_for`]): a change in a directory takes its lease
//! unless another node worked in it in the last [`CONTENDED_FOR`] (its lease was recalled
//! from here, or a take found it leased): two nodes in one directory take the committed
//! path, with no lease going back and forth. A lease unused for [`IDLE_FOR`] is given
//! back, so other nodes rarely need to recall one.
//!
//! Every round with the group goes through [`Group::propose`], which answers once this
//! node's replica has applied the entry, as [`LeaseHolder`] requires; each successful
//! round renews the holder's term from when it began. One flush at a time sends the
//! sealed batches in order, each only after the one before it is committed.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use shoal_agent_api::{FileAttr, FsError, FsResponse, Ino, RequestId};
use shoal_namespace::format::{FileKind, Timestamp};
use shoal_namespace::{Command, LeasedChange, Outcome, Proposal, Touched};
use shoal_placement::NodeId;
use tokio::time::Instant;

use super::lease_holder::{LeaseHolder, LostOp};
use crate::consensus::Group;

/// Inode numbers taken at a time, and how few left make the holder take more.
const INO_BATCH: u64 = 1024;
const INO_LOW: u64 = 64;

/// How long a directory another node worked in is left to the committed path.
pub const CONTENDED_FOR: Duration = Duration::from_secs(2);
/// How long a lease is kept without a change or lookup answered from it.
pub const IDLE_FOR: Duration = Duration::from_secs(2);
/// Failed ops kept for a `Sync` to report; older ones are only logged.
const MAX_FAILURES: usize = 4096;
/// Ops answered since the last batch that wake the writeback before its interval: each
/// answer speculates over every op not committed yet, so they are kept few.
const WAKE_AT: usize = 32;
/// Subdirectories whose leases a take takes with it, at most, and how many entries of
/// the directory it looks through for them.
const MAX_TAKEN_WITH: usize = 255;
const SUBDIR_SCAN: usize = 4096;
/// Leases given back in one round at most.
const MAX_RETURNS: usize = 256;
/// Request ids remembered with how they were answered.
const MAX_RECENT: usize = 4096;
/// Inodes created under a lease remembered (for their setattr and inline writes).
const MAX_CREATED: usize = 1 << 16;

/// When leases were used, and which directories are left alone.
#[derive(Default)]
struct Policy {
    /// Directory → when another node was last seen working in it.
    contended: HashMap<Ino, Instant>,
    /// Leased directory → when a change or lookup was last answered from its lease.
    used: HashMap<Ino, Instant>,
    /// Inode created under a lease (not a directory) → the directory it was created in.
    created: HashMap<Ino, Ino>,
    /// Ops whose commit did not go as answered, with the inodes they concern, for the
    /// next `Sync` naming one of them.
    failures: Vec<(LostOp, Vec<Ino>)>,
    /// The mount session answered from the leases: one at a time, so the change feed
    /// can leave that mount's own changes out (`ChangeFeed::alias`).
    owner: Option<u64>,
    /// How the last requests were answered, by request id, oldest first: a mount sends a
    /// request again (same id) when its connection broke before the answer came.
    recent: HashMap<RequestId, Prior>,
    recent_order: VecDeque<RequestId>,
}

/// How a request was answered before.
#[derive(Clone, Debug)]
pub enum Prior {
    /// From a lease, with this answer (sent as `FsResponse::Unsynced` when a success).
    Answered(Result<FsResponse, FsError>),
    /// Through the group (whose request-id table answers a repeat).
    Committed,
}

impl Policy {
    /// A change in `dir` was answered from its lease, making `made` (its inode, and
    /// whether a directory). A directory made under the lease is leased here with it
    /// (`LeaseHolder::answer`) and counts as used from now: given back at the next
    /// writeback instead, the first change inside it (`cp -a`, `mkdir -p`) would take it
    /// again, a round with the group for each directory.
    fn answered(&mut self, dir: Ino, made: Option<(Ino, bool)>, now: Instant) {
        self.used.insert(dir, now);
        match made {
            Some((ino, true)) => {
                self.used.insert(ino, now);
            }
            Some((ino, false)) => {
                self.created.insert(ino, dir);
            }
            None => {}
        }
    }

    /// Of the leases `held`, those unused for [`IDLE_FOR`] at `now` (and forgets when
    /// the ones not held any more were used).
    fn idle(&mut self, held: &[(Ino, u64)], now: Instant) -> Vec<Ino> {
        self.used
            .retain(|dir, _| held.iter().any(|(d, _)| d == dir));
        held.iter()
            .map(|(dir, _)| *dir)
            .filter(|dir| {
                self.used
                    .get(dir)
                    .is_none_or(|&at| now.saturating_duration_since(at) >= IDLE_FOR)
            })
            .collect()
    }

    fn contended(&mut self, dir: Ino, now: Instant) -> bool {
        match self.contended.get(&dir) {
            Some(&at) if now.saturating_duration_since(at) < CONTENDED_FOR => true,
            Some(_) => {
                self.contended.remove(&dir);
                false
            }
            None => false,
        }
    }
}

/// The inodes `lost` concerns: the directories it was answered in (or renamed into), the
/// inode it created, linked, changed or wrote, and the one its name named (`named`, for
/// an unlink or a rename that did not go through).
fn concerned(lost: &LostOp, named: Option<Ino>) -> Vec<Ino> {
    use shoal_namespace::LeasedChange as C;
    let mut inos = vec![lost.op.dir];
    match &lost.op.change {
        C::MkNode { ino, .. }
        | C::Link { ino, .. }
        | C::SetAttr { ino, .. }
        | C::WriteInline { ino, .. }
        | C::WriteExtents { ino, .. } => inos.push(*ino),
        C::Rename { new_dir, .. } => inos.push(*new_dir),
        C::Unlink { .. } | C::Rmdir { .. } => {}
    }
    inos.extend(named);
    inos
}

/// Adds to `touched` what the mount may have cached of `lost`: the names it made,
/// removed or moved, and the inodes it concerns (`inos`), with origin 0.
fn lost_touched(touched: &mut Touched, lost: &LostOp, inos: &[Ino]) {
    use shoal_namespace::LeasedChange as C;
    let dir = lost.op.dir;
    match &lost.op.change {
        C::MkNode { name, .. } | C::Link { name, .. } | C::Unlink { name } | C::Rmdir { name } => {
            touched.names.push((0, dir, name.clone()))
        }
        C::Rename {
            name,
            new_dir,
            new_name,
            ..
        } => {
            touched.names.push((0, dir, name.clone()));
            touched.names.push((0, *new_dir, new_name.clone()));
        }
        C::SetAttr { .. } | C::WriteInline { .. } | C::WriteExtents { .. } => {}
    }
    touched.inodes.extend(inos.iter().map(|&ino| (0, ino)));
}

pub struct Leases {
    group: Arc<Group>,
    /// For the release gate: the lease commands are new in the log.
    gossip: shoal_mesh::GossipHandle,
    /// The request-id client of this holder's batches.
    session: u64,
    holder: Mutex<LeaseHolder>,
    policy: Mutex<Policy>,
    /// Held by a flush: batches are sent one after another, in order.
    flushing: tokio::sync::Mutex<()>,
    /// Held by a take from its proposal until its grant is recorded, and by a return of
    /// a lease not held here (which must not return one being taken).
    taking: tokio::sync::Mutex<()>,
    /// Wakes the writeback when many ops wait.
    wake: tokio::sync::Notify,
    metrics: super::LeaseMetrics,
    /// Whether the agent before this one committed all it answered and stopped
    /// (`Leases::close`).
    clean_start: std::sync::atomic::AtomicBool,
}

impl Leases {
    /// `session` names this holder's batches in the request-id table: it must not repeat
    /// across the agent's starts (a repeat would be answered with an earlier start's
    /// outcomes), so it is drawn at random at each start.
    pub fn new(
        group: Arc<Group>,
        gossip: shoal_mesh::GossipHandle,
        node: NodeId,
        session: u64,
    ) -> Leases {
        Leases {
            group,
            gossip,
            session,
            holder: Mutex::new(LeaseHolder::new(node, session)),
            policy: Mutex::new(Policy::default()),
            flushing: tokio::sync::Mutex::new(()),
            taking: tokio::sync::Mutex::new(()),
            wake: tokio::sync::Notify::new(),
            metrics: super::LeaseMetrics::default(),
            clean_start: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn holder(&self) -> MutexGuard<'_, LeaseHolder> {
        self.holder.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn policy(&self) -> MutexGuard<'_, Policy> {
        self.policy.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How request `id` was answered before, if it is remembered.
    pub fn prior(&self, id: RequestId) -> Option<Prior> {
        self.policy().recent.get(&id).cloned()
    }

    /// Remembers how request `id` was answered.
    pub fn remember(&self, id: RequestId, prior: Prior) {
        let mut policy = self.policy();
        if policy.recent.insert(id, prior).is_none() {
            policy.recent_order.push_back(id);
        }
        while policy.recent_order.len() > MAX_RECENT {
            if let Some(old) = policy.recent_order.pop_front() {
                policy.recent.remove(&old);
            }
        }
    }

    /// Whether mount `session` is the one answered from the leases: it is, or it may take
    /// over (nothing is leased or pending for another).
    pub fn claim(&self, session: u64) -> bool {
        let mut policy = self.policy();
        if policy.owner == Some(session) {
            return true;
        }
        let holder = self.holder();
        if holder.pending() || !holder.held().is_empty() {
            return false;
        }
        if !policy.failures.is_empty() {
            tracing::warn!(
                failures = policy.failures.len(),
                "a new mount session takes the leases; the last one's unreported failures were logged above"
            );
            policy.failures.clear();
        }
        policy.owner = Some(session);
        self.group.changes.alias(self.session, session);
        true
    }

    /// Whether a change in `dir` is answered from its lease: held and answering (renewed
    /// by a barrier when its term ran out), or taken now, unless another node worked in
    /// `dir` lately. Everything answered before is committed before a take.
    pub async fn lease_for(&self, dir: Ino) -> bool {
        if self.serves(dir) {
            return true;
        }
        if self.policy().contended(dir, Instant::now()) {
            return false;
        }
        if self.epoch(dir).is_some() {
            // Held, its term run out: a barrier renews it if the group still has it.
            return self.renew(dir).await;
        }
        // The lease commands are new in the log: an agent of an older release could not
        // apply them.
        let on_this_release = match self.gossip.members().await {
            Ok(members) => crate::releases::alive_on_other_releases(&members).is_empty(),
            Err(_) => false,
        };
        if !on_this_release {
            return false;
        }
        // The directory may be one created (or moved) here and not committed yet.
        if self.holder().attr(dir).is_some() && self.flush().await.is_err() {
            return false;
        }
        match self.take(dir).await {
            Ok(Some(_)) => {
                self.policy().used.insert(dir, Instant::now());
                true
            }
            Ok(None) => {
                self.policy().contended.insert(dir, Instant::now());
                false
            }
            // Not a directory, gone, no leader: the committed path says which.
            Err(e) => {
                tracing::debug!(dir, error = %e, "no directory lease taken");
                false
            }
        }
    }

    /// Whether `dir`'s lease is held and answering now (and marks it used).
    pub fn serves(&self, dir: Ino) -> bool {
        let serves = {
            let holder = self.holder();
            holder.epoch(dir).is_some() && holder.answering(Instant::now())
        };
        if serves {
            self.policy().used.insert(dir, Instant::now());
        }
        serves
    }

    /// Renews the lease on `dir` by a barrier: true when the group still has it as this
    /// node's.
    async fn renew(&self, dir: Ino) -> bool {
        let began = Instant::now();
        if self.group.barrier().await.is_err() {
            return false;
        }
        let Some(epoch) = self.epoch(dir) else {
            return false;
        };
        let mine = shoal_namespace::DirLease {
            holder: NodeId(self.group.me),
            epoch,
        };
        match self.group.store().dir_lease(dir) {
            Ok(Some(lease)) if lease == mine => {
                self.holder().renewed(began);
                self.serves(dir)
            }
            _ => {
                self.holder().forget(dir);
                false
            }
        }
    }

    /// Another node works in `dir`: its lease was recalled from here.
    pub fn contended(&self, dir: Ino) {
        self.policy().contended.insert(dir, Instant::now());
    }

    /// The directory `ino` was created in under a lease still held there.
    pub fn created_in(&self, ino: Ino) -> Option<Ino> {
        let dir = *self.policy().created.get(&ino)?;
        self.holder().epoch(dir).map(|_| dir)
    }

    /// Attributes of `ino` as the pending changes left them: `Some(None)` deleted; `None`
    /// when they did not touch it (the replica answers).
    pub fn attr(&self, ino: Ino) -> Option<Option<FileAttr>> {
        self.holder().attr(ino)
    }

    /// Inline bytes `ino` holds as the pending changes left it: `Some(None)` deleted;
    /// `None` when they did not touch it (the replica answers).
    pub fn inline_len(&self, ino: Ino) -> Option<Option<usize>> {
        self.holder().inline_len(ino)
    }

    /// Whether changes of directory `dir`'s entries wait to be committed.
    pub fn pending_in(&self, dir: Ino) -> bool {
        self.holder().pending_in(dir)
    }

    /// The directories leased here and their epochs.
    pub fn held(&self) -> Vec<(Ino, u64)> {
        self.holder().held()
    }

    /// Commits everything answered so far; `Err(FsError::Io)` when a change answered for
    /// mount `session` concerning `ino` (the directory it was made in, the inode it made
    /// or changed, the one its name named) did not commit as it was answered. Reported
    /// once.
    pub async fn sync(&self, ino: Ino, session: u64) -> Result<(), FsError> {
        self.flush().await?;
        self.collect_failures();
        let mut policy = self.policy();
        if policy.owner != Some(session) {
            // Another mount's sync: everything is committed; the failures are the
            // owner's to hear.
            return Ok(());
        }
        let (mine, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut policy.failures)
            .into_iter()
            .partition(|(_, inos)| inos.contains(&ino));
        policy.failures = rest;
        match mine.first() {
            None => Ok(()),
            Some((lost, _)) => Err(FsError::Io(format!(
                "a change answered before was not committed as answered: {:?} gave {:?}",
                lost.op.change, lost.committed
            ))),
        }
    }

    /// Moves the holder's failures to those kept for `Sync`, logging each.
    fn collect_failures(&self) {
        let lost = self.holder().take_failures();
        if lost.is_empty() {
            return;
        }
        self.metrics.lost_ops.inc_by(lost.len() as u64);
        let store = self.group.store();
        let mut policy = self.policy();
        let mut touched = Touched::default();
        for l in lost {
            tracing::warn!(dir = l.op.dir, change = ?l.op.change, answered = ?l.answered,
                committed = ?l.committed, "a change answered under a directory lease did not commit as answered");
            // The inode a name of the op still names (it did not go through).
            let named = match &l.op.change {
                shoal_namespace::LeasedChange::Unlink { name }
                | shoal_namespace::LeasedChange::Rename { name, .. } => {
                    store.lookup(l.op.dir, name).ok().map(|a| a.ino)
                }
                _ => None,
            };
            let inos = concerned(&l, named);
            lost_touched(&mut touched, &l, &inos);
            policy.failures.push((l, inos));
        }
        // What the mount was answered of them is not what the group has: its kernel (and
        // the mount's held attributes) drop them through the change feed, as for another
        // node's change (origin 0 is no mount's own).
        self.group.changes.publish(&touched);
        let over = policy.failures.len().saturating_sub(MAX_FAILURES);
        policy.failures.drain(..over);
    }

    /// The writeback: commits what was answered, and gives back the leases unused for
    /// [`IDLE_FOR`].
    pub async fn writeback(&self) -> Result<(), FsError> {
        self.flush().await?;
        self.collect_failures();
        let now = Instant::now();
        // Under the policy lock: a lease granted (and marked used) between reading the
        // held ones and the idle check would lose its mark.
        let idle = {
            let mut policy = self.policy();
            let held = self.held();
            policy.idle(&held, now)
        };
        self.give_back_all(&idle).await?;
        let mut policy = self.policy();
        if policy.created.len() > MAX_CREATED || self.held().is_empty() {
            policy.created.clear();
        }
        Ok(())
    }

    /// One round with the group for all of `commands`, in order.
    async fn rounds(&self, commands: Vec<Command>) -> Result<Vec<Outcome>, FsError> {
        let began = Instant::now();
        let now = Timestamp::now();
        let proposals = commands
            .into_iter()
            .map(|command| Proposal {
                id: None,
                now,
                command,
            })
            .collect();
        let outcomes = self.group.propose(proposals).await?;
        self.holder().renewed(began);
        Ok(outcomes)
    }

    /// One round with the group; renews the term from its start when it succeeds.
    async fn round(&self, command: Command) -> Result<Outcome, FsError> {
        self.rounds(vec![command])
            .await?
            .pop()
            .ok_or_else(|| FsError::Io("a round with the group gave no outcome".into()))
    }

    /// Takes the lease on `dir` (and inode numbers when few are left). `Ok(None)` when
    /// another node holds it; the epoch otherwise (the one held already, if so).
    ///
    /// Then, in one more round, the leases of `dir`'s subdirectories that nobody holds
    /// (up to [`MAX_TAKEN_WITH`]): a tree is mostly worked through by one node (`rm -rf`,
    /// `chmod -R`), which would otherwise take one lease per directory, a round each. They
    /// count as used from now and go back together once idle, like any other.
    pub async fn take(&self, dir: Ino) -> Result<Option<u64>, FsError> {
        // One take at a time: two of one directory would each get an epoch, and the ops
        // answered under the first would be refused under the second.
        let _one = self.taking.lock().await;
        let take = {
            let holder = self.holder();
            match holder.take_command(dir) {
                Some(take) => take,
                None => return Ok(holder.epoch(dir)),
            }
        };
        let began = Instant::now();
        let epoch = match self.round(take).await? {
            Outcome::DirLease { epoch } => epoch,
            Outcome::Leased { .. } => return Ok(None),
            Outcome::Failed(e) => return Err(e.into()),
            other => return Err(FsError::Io(format!("a lease was answered {other:?}"))),
        };
        self.holder().granted(dir, epoch, began);
        self.metrics.grants.inc();
        self.take_subdirs(dir).await;
        if self.holder().inos_left() < INO_LOW {
            let take = self.holder().inos_command(INO_BATCH);
            match self.round(take).await? {
                Outcome::Inos { start, end } => self.holder().add_inos(start, end),
                other => return Err(FsError::Io(format!("inode numbers answered {other:?}"))),
            }
        }
        Ok(Some(epoch))
    }

    /// Takes the leases of `dir`'s free subdirectories in one round, once `dir`'s own
    /// lease is this node's: then no other holder has ops waiting in `dir` (an rmdir or
    /// a rename of a subdirectory) that a subdirectory's lease, taken first, would make
    /// the group refuse. Best effort: a failed round leaves them untaken (a lease the
    /// group granted all the same is given back when another node recalls it).
    async fn take_subdirs(&self, dir: Ino) {
        let free = self.free_subdirs(dir);
        let (subdirs, commands): (Vec<Ino>, Vec<Command>) = {
            let holder = self.holder();
            free.into_iter()
                .filter_map(|sub| Some((sub, holder.take_command(sub)?)))
                .unzip()
        };
        if commands.is_empty() {
            return;
        }
        let began = Instant::now();
        let outcomes = match self.rounds(commands).await {
            Ok(outcomes) => outcomes,
            Err(e) => {
                tracing::debug!(dir, error = %e, "the subdirectories' leases were not taken");
                return;
            }
        };
        let now = Instant::now();
        let granted: Vec<(Ino, u64)> = subdirs
            .into_iter()
            .zip(outcomes)
            .filter_map(|(sub, outcome)| match outcome {
                Outcome::DirLease { epoch } => Some((sub, epoch)),
                _ => None,
            })
            .collect();
        {
            let mut holder = self.holder();
            for &(sub, epoch) in &granted {
                holder.granted(sub, epoch, began);
            }
        }
        let mut policy = self.policy();
        for &(sub, _) in &granted {
            policy.used.insert(sub, now);
        }
        self.metrics.grants.inc_by(granted.len() as u64);
    }

    /// Subdirectories of `dir` (among its first [`SUBDIR_SCAN`] entries, as the replica
    /// has them) that no node holds a lease on, this one included, and no other node
    /// worked in lately: at most [`MAX_TAKEN_WITH`].
    fn free_subdirs(&self, dir: Ino) -> Vec<Ino> {
        let store = self.group.store();
        let Ok((entries, _)) = store.readdir_page(dir, None, SUBDIR_SCAN) else {
            return Vec::new();
        };
        let now = Instant::now();
        let mut policy = self.policy();
        entries
            .into_iter()
            .filter(|e| e.kind == FileKind::Dir)
            .map(|e| e.ino)
            .filter(|&d| !policy.contended(d, now))
            .filter(|&d| matches!(store.dir_lease(d), Ok(None)))
            .take(MAX_TAKEN_WITH)
            .collect()
    }

    /// Answers `change` in leased directory `dir` at once (see [`LeaseHolder::answer`]):
    /// `Err(FsError::Unavailable)` when it cannot be answered from a lease now.
    pub fn answer(&self, dir: Ino, change: LeasedChange) -> Result<Outcome, FsError> {
        let store = self.group.store();
        // What a create makes: `Some(true)` a directory (leased with it; its own
        // attributes go under its own lease, not its parent's), `Some(false)` another inode.
        let makes = match &change {
            LeasedChange::MkNode { kind, .. } => Some(*kind == FileKind::Dir),
            _ => None,
        };
        let (outcome, wake) = {
            let mut holder = self.holder();
            let sealed_before = holder.sealed_count();
            let outcome = holder
                .answer(store, dir, change, Timestamp::now(), Instant::now())
                .map_err(FsError::from)?;
            let wake = holder.wants_writeback(sealed_before, WAKE_AT);
            (outcome, wake)
        };
        if wake {
            self.wake.notify_one();
        }
        let made = match (&outcome, makes) {
            (Outcome::Attr(a), Some(dir)) => Some((a.ino, dir)),
            _ => None,
        };
        self.policy().answered(dir, made, Instant::now());
        Ok(outcome)
    }

    /// The entry `name` of `dir` as the pending changes left it (`Some(None)`: removed);
    /// `None` when the replica answers.
    pub fn entry(&self, dir: Ino, name: &str) -> Option<Option<Ino>> {
        self.holder().entry(dir, name)
    }

    /// Random per agent process (the holder's request-id client).
    pub fn instance(&self) -> u64 {
        self.session
    }

    /// Whether the agent process before this one committed all it answered before it
    /// stopped.
    pub fn clean_start(&self) -> bool {
        self.clean_start.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The agent found its predecessor's mark (see [`Leases::close`]).
    pub fn started_clean(&self, clean: bool) {
        self.clean_start
            .store(clean, std::sync::atomic::Ordering::Release);
    }

    /// At a clean stop, once no mount request comes any more: commits everything
    /// answered and gives back every lease. True when all of it went.
    pub async fn close(&self) -> bool {
        if let Err(e) = self.flush().await {
            tracing::warn!(error = %e, "could not commit the changes answered under directory leases");
            return false;
        }
        for (dir, _) in self.held() {
            if let Err(e) = self.give_back(dir).await {
                tracing::warn!(dir, error = %e, "could not give a directory lease back");
            }
        }
        self.collect_failures();
        !self.pending()
    }

    /// The leases' counters (`shoal_lease_*`).
    pub fn metrics(&self) -> &super::LeaseMetrics {
        &self.metrics
    }

    /// Waits until many ops wait for the writeback.
    pub async fn woken(&self) {
        self.wake.notified().await
    }

    /// Whether changes wait to be committed.
    pub fn pending(&self) -> bool {
        self.holder().pending()
    }

    /// The epoch of the lease held on `dir`.
    pub fn epoch(&self, dir: Ino) -> Option<u64> {
        self.holder().epoch(dir)
    }

    /// Commits every change answered so far, in order. A batch whose outcome is unknown
    /// (no leader in time) stays first and is sent again, with its request id, by the
    /// next flush.
    pub async fn flush(&self) -> Result<(), FsError> {
        let _one = self.flushing.lock().await;
        self.holder().seal();
        loop {
            let Some(batch) = self.holder().next_to_commit().cloned() else {
                return Ok(());
            };
            let began = Instant::now();
            let outcome = self.group.propose_one(batch).await?;
            if let Outcome::Batch(ops) = &outcome {
                self.metrics.batches.inc();
                self.metrics.batch_ops.inc_by(ops.len() as u64);
            }
            let mut holder = self.holder();
            holder.renewed(began);
            holder
                .committed(self.group.store(), &outcome)
                .map_err(FsError::from)?;
        }
    }

    /// Commits what was answered, then returns the lease on `dir` (a recall). The lease
    /// is forgotten even if the return fails (it may have been broken meanwhile).
    pub async fn give_back(&self, dir: Ino) -> Result<(), FsError> {
        // Forgotten first: nothing more is answered under it, and what was answered
        // commits (the group still has the lease) before it is returned.
        let returns = self.forget_held(&[dir]);
        self.flush().await?;
        if !returns.is_empty() {
            self.rounds(returns).await?;
            return Ok(());
        }
        // Not held here, but maybe still this node's in the group: granted to this agent
        // before it restarted. Nothing answered under it can commit any more.
        let _no_take = self.taking.lock().await;
        if self.epoch(dir).is_none()
            && let Some(lease) = self.group.store().dir_lease(dir)?
            && lease.holder == NodeId(self.group.me)
        {
            self.round(Command::ReturnDirLease {
                dir,
                epoch: lease.epoch,
            })
            .await?;
        }
        Ok(())
    }

    /// Gives back the leases on `dirs` held here, together: what was answered commits
    /// first, then the returns go in one round with the group (a `cp -a` leaves a lease on
    /// every directory it made, given back once idle: one round each was as many log
    /// entries again as its batches).
    pub async fn give_back_all(&self, dirs: &[Ino]) -> Result<(), FsError> {
        let returns = self.forget_held(dirs);
        if returns.is_empty() {
            return Ok(());
        }
        self.flush().await?;
        for chunk in returns.chunks(MAX_RETURNS) {
            self.rounds(chunk.to_vec()).await?;
        }
        Ok(())
    }

    /// Forgets the leases on `dirs` held here (nothing more is answered under them) and
    /// gives the commands that return them to the group.
    fn forget_held(&self, dirs: &[Ino]) -> Vec<Command> {
        let mut holder = self.holder();
        dirs.iter()
            .filter_map(|&dir| {
                let epoch = holder.epoch(dir)?;
                holder.forget(dir);
                Some(Command::ReturnDirLease { dir, epoch })
            })
            .collect()
    }

    /// Returns this node's lease on `dir` at `epoch` when it is not held here at that
    /// epoch (granted before this agent restarted): nothing answered under it can commit.
    /// The group returns it only at that epoch.
    pub async fn return_unheld(&self, dir: Ino, epoch: u64) -> Result<(), FsError> {
        let no_take = self.taking.lock().await;
        if self.epoch(dir) == Some(epoch) {
            drop(no_take);
            return self.give_back(dir).await;
        }
        // Forgotten here by a give-back still committing what was answered under it: that
        // goes first, or the return would make the group refuse it.
        if self.pending_in(dir) {
            self.flush().await?;
        }
        self.round(Command::ReturnDirLease { dir, epoch }).await?;
        Ok(())
    }

    /// Answered changes whose commit did not go as answered, since the last call.
    pub fn take_failures(&self) -> Vec<LostOp> {
        self.holder().take_failures()
    }
}

#[cfg(test)]
mod tests {
    use super::{IDLE_FOR, Policy};
    use std::time::Duration;
    use tokio::time::Instant;

    #[test]
    fn a_directory_made_under_a_lease_is_kept_as_used_as_its_parent() {
        let mut policy = Policy::default();
        let start = Instant::now();
        // Directory 10 is leased; a mkdir in it made 11 (leased with it), a create 12.
        policy.answered(10, Some((11, true)), start);
        policy.answered(10, Some((12, false)), start);
        let held = [(10, 3), (11, 3)];
        let soon = start + Duration::from_millis(100);
        assert!(
            policy.idle(&held, soon).is_empty(),
            "the new directory's lease is kept for the changes that follow it"
        );
        assert_eq!(policy.created.get(&12), Some(&10));
        assert!(!policy.created.contains_key(&11));
        // Unused for IDLE_FOR: both go back; one used again stays.
        policy.answered(11, None, start + IDLE_FOR);
        assert_eq!(policy.idle(&held, start + IDLE_FOR), [10]);
        // A lease given back is forgotten.
        assert!(policy.idle(&[], start + IDLE_FOR).is_empty());
        assert!(policy.used.is_empty());
    }
}
