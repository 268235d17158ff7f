//! Kernel caches that stay coherent across nodes. The agent's change feed
//! (`FsRequest::Watch`) names what other nodes' requests changed, in apply order; the
//! watcher drops those names and attributes from the kernel (`notify_inval_entry`,
//! `notify_inval_inode`), so lookups and directory attributes can be cached for long.
//!
//! An invalidation reaches the kernel a little after the change committed, and a path the
//! kernel walked just before it may name what is no longer there. So an open first waits
//! until the watcher has delivered everything applied up to the open's read barrier, then
//! checks the names the kernel used to reach the inode ([`Names`]: what this mount told
//! it): if one of them changed since it was handed out, the open answers `ESTALE` and the
//! kernel walks the path again, looking every name up afresh.
//!
//! While the feed is not there (an older agent), names and attributes are cached for at
//! most [`UNWATCHED_TTL`], as before.
//!
//! Details: names and directory attributes are cached 60 s (`--entry-ttl-ms`,
//! `--attr-ttl-ms`). The watcher long-polls (`Watch`, at most 10 s, protocol 8) and drops
//! only what the kernel was given (`notify_inval_inode` with offset -1: the attributes, not
//! the pages); a batch with none of it only moves the watcher's position (measurement: 4
//! → 2 context switches per create in a directory other nodes fill). A mount that fell
//! out of the feed's ring, lost the feed, or met a snapshot install resets: every name it
//! handed out is dropped. On reconnect to its agent (maybe a new process) it marks every
//! name stale and drops them before the new connection serves anything; its watcher then
//! reads the new feed from its start (`FEED_START`).
//!
//! An open's answer (`OpenedIn`, protocol 9) carries the feed's epoch and position at its
//! barrier, short of the mount's own changes at the tail; the open waits up to 2 s
//! (`DELIVERY_WAIT_MS`) for the watcher to deliver that far. A lookup's answer (`EntryAt`)
//! carries the feed position read before the entry, so a change from a batch that ended at
//! or before it marks nothing, and a change marks an inode's name only while the inode
//! still has that name here. A lookup answered while its own name changed gets entry TTL
//! 0. Not covered: `opendir` and a stat by path through a directory another node renamed
//! in the few milliseconds before the invalidation lands (only opens of files check the
//! path).

use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::OsStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fuser::{INodeNo, Notifier};
use shoal_agent_api::{
    ChangeBatch, DELIVERY_WAIT_MS, FEED_START, FileAttr, FsRequest, FsResponse, Ino, MAX_WATCH_MS,
    ROOT_INO,
};
use tokio::sync::watch;

use super::agent::Agent;
use super::held::HeldFiles;

/// Longest the kernel keeps a name or a directory's attributes without the feed.
pub const UNWATCHED_TTL: Duration = Duration::from_secs(1);
/// Name changes remembered for lookups answered while they were delivered.
const RECENT: usize = 4096;
/// Longest walk from an inode towards the root (a loop guard).
const MAX_DEPTH: usize = 4096;

struct Record {
    parent: Ino,
    name: String,
    /// The name changed on another node after it was handed to the kernel.
    stale: bool,
}

/// A position in one of the agent's change feeds: an answer stamped with it reflects
/// every change of that feed before the position.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    pub epoch: u64,
    pub position: u64,
}

impl Stamp {
    /// Whether the answer stamped `self` already reflects every change of a feed batch that
    /// ended at `end` (its changes lie before `end.position`).
    fn covers(self, end: Option<Stamp>) -> bool {
        end.is_some_and(|e| e.epoch == self.epoch && e.position <= self.position)
    }
}

/// The names this mount handed to the kernel, and which changed since. Pure: the watcher
/// and the request handlers drive it; positions are the watcher's own count of name
/// changes delivered.
#[derive(Default)]
pub struct Names {
    by_child: HashMap<Ino, Record>,
    /// Each name handed out: its inode, and the stamp of the answer that handed it out.
    by_name: HashMap<(Ino, String), (Ino, Option<Stamp>)>,
    /// Every inode handed to the kernel and not forgotten since (it may cache their
    /// attributes), besides the root, which it always holds.
    held: HashSet<Ino>,
    /// The last name changes delivered, with their positions and where their feed batch
    /// ended.
    recent: VecDeque<(u64, Ino, String, Option<Stamp>)>,
    /// Name changes delivered so far.
    position: u64,
    /// Lookups sent before this position cannot be checked against `recent`.
    floor: u64,
}

impl Names {
    pub fn position(&self) -> u64 {
        self.position
    }

    /// The kernel is told `parent/name` is `ino`, by an answer to a request sent at
    /// `since` (stamped `stamp` by the agent, when it did). Whether it may cache that: not
    /// when the name changed while the request was under way (the answer may predate the
    /// change), unless the stamp shows the answer already reflects the change.
    pub fn entered(
        &mut self,
        parent: Ino,
        name: &str,
        ino: Ino,
        since: u64,
        stamp: Option<Stamp>,
    ) -> bool {
        let raced = since < self.floor
            || self
                .recent
                .iter()
                .rev()
                .take_while(|(at, _, _, _)| *at > since)
                .any(|(_, p, n, end)| {
                    *p == parent && n == name && !stamp.is_some_and(|s| s.covers(*end))
                });
        self.by_name.insert((parent, name.to_owned()), (ino, stamp));
        self.held.insert(ino);
        self.by_child.insert(
            ino,
            Record {
                parent,
                name: name.to_owned(),
                stale: raced,
            },
        );
        !raced
    }

    /// This mount renamed `from` to `to` (the kernel moved its entry itself).
    pub fn renamed(&mut self, from: (Ino, &str), to: (Ino, &str)) {
        let replaced = self
            .by_name
            .remove(&(to.0, to.1.to_owned()))
            .map(|(i, _)| i);
        if let Some((ino, stamp)) = self.by_name.remove(&(from.0, from.1.to_owned())) {
            self.by_name.insert((to.0, to.1.to_owned()), (ino, stamp));
            if let Some(r) = self.by_child.get_mut(&ino) {
                (r.parent, r.name) = (to.0, to.1.to_owned());
            }
        }
        if let Some(old) = replaced {
            self.by_child.remove(&old);
        }
    }

    /// This mount removed `parent/name`.
    pub fn removed(&mut self, parent: Ino, name: &str) {
        self.by_name.remove(&(parent, name.to_owned()));
    }

    /// The kernel forgot `ino`.
    pub fn forget(&mut self, ino: Ino) {
        self.held.remove(&ino);
        if let Some(r) = self.by_child.remove(&ino) {
            let key = (r.parent, r.name);
            if self.by_name.get(&key).map(|(i, _)| *i) == Some(ino) {
                self.by_name.remove(&key);
            }
        }
    }

    /// Whether the kernel may hold `ino` (and cache its attributes).
    pub fn holds(&self, ino: Ino) -> bool {
        ino == ROOT_INO || self.held.contains(&ino)
    }

    /// Another node changed `parent/name` (in a feed batch that ended at `end`); the inode
    /// it named here, if any, for the kernel to drop (when none, the kernel has no entry for
    /// the name: this mount answers a missing name with an error, which the kernel does not
    /// cache). The inode is marked stale, whatever name its record holds now (the kernel
    /// may still walk the old name to it). A name handed out by an answer that already
    /// reflects the change (its stamp is past the batch) is left as it is: nothing to drop.
    pub fn changed(&mut self, parent: Ino, name: &str, end: Option<Stamp>) -> Option<Ino> {
        self.position += 1;
        if self.recent.len() == RECENT
            && let Some((at, _, _, _)) = self.recent.pop_front()
        {
            self.floor = self.floor.max(at);
        }
        self.recent
            .push_back((self.position, parent, name.to_owned(), end));
        let key = (parent, name.to_owned());
        let (ino, stamp) = *self.by_name.get(&key)?;
        if stamp.is_some_and(|s| s.covers(end)) {
            return None;
        }
        self.by_name.remove(&key);
        if let Some(r) = self.by_child.get_mut(&ino) {
            r.stale = true;
        }
        Some(ino)
    }

    /// Anything may have changed: every name handed out is stale, and lookups under way
    /// are not cached. The names and inodes to drop from the kernel.
    pub fn reset(&mut self) -> (Vec<(Ino, String)>, Vec<Ino>) {
        self.position += 1;
        self.floor = self.position;
        self.recent.clear();
        let names = self.by_name.drain().map(|(k, _)| k).collect();
        let mut inodes = Vec::with_capacity(self.by_child.len());
        for (ino, r) in &mut self.by_child {
            r.stale = true;
            inodes.push(*ino);
        }
        (names, inodes)
    }

    /// Whether a name on the way from the root to `ino` changed since the kernel was told
    /// it; the marks are cleared (the kernel looks every name up again after `ESTALE`).
    pub fn stale_path(&mut self, ino: Ino) -> bool {
        let mut stale = false;
        let mut at = ino;
        for _ in 0..MAX_DEPTH {
            if at == ROOT_INO {
                break;
            }
            let Some(r) = self.by_child.get_mut(&at) else {
                break;
            };
            stale |= std::mem::take(&mut r.stale);
            at = r.parent;
        }
        stale
    }
}

/// What the kernel is told to drop after a batch of the feed.
#[derive(Debug, Default, PartialEq)]
struct Drops {
    names: Vec<(Ino, String)>,
    inodes: Vec<Ino>,
}

impl Drops {
    fn is_empty(&self) -> bool {
        self.names.is_empty() && self.inodes.is_empty()
    }
}

/// The feed's position as the watcher has delivered it: (feed epoch, next change).
type Delivered = (u64, u64);

/// The mount's side of the change feed.
pub struct Coherence {
    pub names: Mutex<Names>,
    delivered: watch::Sender<Delivered>,
    /// The agent serves the feed: long TTLs are safe.
    live: AtomicBool,
    /// Invalidations the kernel refused (not counting "not cached").
    failed: AtomicU64,
    /// The kernel, once the watcher runs (for what the mount drops outside the feed).
    kernel: std::sync::OnceLock<Notifier>,
    /// Resets made by [`Self::reconnected`] so far.
    resets: AtomicU64,
    /// Files whose attributes the agent answered under its directory lease (created or
    /// changed there, `FsResponse::Unsynced`): no other node has changed them since (the
    /// feed would have said so), so the kernel may keep their attributes as long as a
    /// directory's.
    held: HeldFiles,
}

impl Default for Coherence {
    fn default() -> Self {
        Coherence {
            names: Mutex::default(),
            delivered: watch::Sender::new((0, 0)),
            live: AtomicBool::new(false),
            failed: AtomicU64::new(0),
            kernel: std::sync::OnceLock::new(),
            resets: AtomicU64::new(0),
            held: HeldFiles::default(),
        }
    }
}

impl Coherence {
    fn names(&self) -> std::sync::MutexGuard<'_, Names> {
        self.names.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How long the kernel may keep a name or attributes it would keep for `wanted`.
    pub fn ttl(&self, wanted: Duration) -> Duration {
        if self.live.load(Ordering::Relaxed) {
            wanted
        } else {
            wanted.min(UNWATCHED_TTL)
        }
    }

    /// The agent answered a change of file `attr.ino` (or in directory `attr.ino`) under
    /// its directory lease, sent at change count `at` (see [`HeldFiles`]).
    pub fn hold(&self, attr: &FileAttr, at: Option<u64>) {
        self.held.hold(attr, at);
    }

    /// Whether file `ino`'s attributes may be cached like a directory's (see `held`).
    pub fn is_held(&self, ino: Ino) -> bool {
        self.live.load(Ordering::Relaxed) && self.held.contains(ino)
    }

    /// The attributes the agent holds for file or directory `ino` when this mount knows
    /// them without asking, the mount's change count being `now` (see [`HeldFiles::attr`]).
    pub fn held_attr(&self, ino: Ino, now: u64) -> Option<FileAttr> {
        if !self.live.load(Ordering::Relaxed) {
            return None;
        }
        self.held.attr(ino, now)
    }

    /// See [`HeldFiles::answered`].
    pub fn answered_held(&self, attr: &FileAttr, now: u64) {
        self.held.answered(attr, now);
    }

    /// Whether the agent serves the feed (and the requests of its protocol).
    pub fn is_live(&self) -> bool {
        self.live.load(Ordering::Relaxed)
    }

    /// Where the watcher is, for [`Self::entered`].
    pub fn position(&self) -> u64 {
        self.names().position()
    }

    /// See [`Names::entered`].
    pub fn entered(
        &self,
        parent: Ino,
        name: &str,
        ino: Ino,
        since: u64,
        stamp: Option<Stamp>,
    ) -> bool {
        self.names().entered(parent, name, ino, since, stamp)
    }

    /// The mount reconnected to its agent (which may have restarted): what changed while
    /// no agent answered is unknown, so every name handed out is stale, lookups under way
    /// are not cached, and the kernel drops what it cached. Called before the new
    /// connection serves anything.
    pub fn reconnected(&self) {
        self.resets.fetch_add(1, Ordering::AcqRel);
        self.held.clear();
        let (names, inodes) = self.names().reset();
        let drops = Drops { names, inodes };
        if let Some(kernel) = self.kernel.get()
            && !drops.is_empty()
        {
            let kernel = kernel.clone();
            // An invalidation can wait for a directory lock: never on this task. The
            // opens that follow check the marks, not the kernel.
            std::thread::spawn(move || {
                for (parent, name) in &drops.names {
                    let _ = kernel.inval_entry(INodeNo(*parent), OsStr::new(name));
                }
                for &ino in &drops.inodes {
                    let _ = kernel.inval_inode(INodeNo(ino), -1, 0);
                }
            });
        }
    }

    pub fn renamed(&self, from: (Ino, &str), to: (Ino, &str)) {
        self.names().renamed(from, to)
    }

    pub fn removed(&self, parent: Ino, name: &str) {
        self.names().removed(parent, name)
    }

    pub fn forget(&self, ino: Ino) {
        self.names().forget(ino)
    }

    /// Drops the kernel's attributes of `ino` (not its pages), so that its next stat or a
    /// read past the size it knew asks this mount again. An open calls it once its barrier
    /// made the local replica at least as fresh as the cluster: the kernel may hold a size
    /// a lookup answered from the replica before that, and a zero TTL still lets it keep
    /// those attributes until its clock ticks (up to 4 ms), long enough for the stat and
    /// the first read that follow the open. Cheap: no lock in the kernel, and nothing when
    /// it does not hold the inode.
    pub fn drop_attributes(&self, ino: Ino) {
        if let Some(kernel) = self.kernel.get() {
            self.count(kernel.inval_inode(INodeNo(ino), -1, 0));
        }
    }

    /// After an open whose barrier saw position `changes` (of feed `epoch`, when the agent
    /// said which): waits until the watcher delivered that far, then whether the path the
    /// kernel walked to `ino` may be stale. A position in another feed than the one the
    /// watcher follows says nothing: the open waits until the watcher has moved to the
    /// open's feed and caught up there.
    pub async fn open_is_stale(&self, ino: Ino, epoch: Option<u64>, changes: u64) -> bool {
        if !self.live.load(Ordering::Relaxed) {
            return false;
        }
        let mut delivered = self.delivered.subscribe();
        let watched = delivered.borrow().0;
        let reached = tokio::time::timeout(
            Duration::from_millis(DELIVERY_WAIT_MS),
            delivered.wait_for(|&(e, next)| match epoch {
                Some(want) => e == want && next >= changes,
                None => e != watched || next >= changes,
            }),
        )
        .await;
        if reached.is_err() {
            tracing::debug!(
                ino,
                changes,
                "changes not delivered in time; opening as walked"
            );
        }
        self.names().stale_path(ino)
    }

    /// Marks one batch from the feed; what the kernel must drop: the names it was given
    /// that changed, and the inodes it holds whose attributes changed (or, after a reset,
    /// everything it was given).
    fn mark(&self, batch: &ChangeBatch, renewed: bool) -> Drops {
        let mut names = self.names();
        let mut drops = Drops::default();
        if batch.reset || renewed {
            (drops.names, drops.inodes) = names.reset();
            self.held.clear();
        }
        // Changed on another node: cached for the files' TTL again.
        for &ino in &batch.inodes {
            self.held.remove(ino);
        }
        let end = Some(Stamp {
            epoch: batch.epoch,
            position: batch.next,
        });
        for (parent, name) in &batch.names {
            if let Some(ino) = names.changed(*parent, name, end) {
                drops.inodes.push(ino);
                drops.names.push((*parent, name.clone()));
            }
        }
        drops
            .inodes
            .extend(batch.inodes.iter().filter(|&&i| names.holds(i)));
        drops
    }

    /// Tells the kernel to drop `drops`.
    fn notify(&self, drops: &Drops, kernel: &Notifier) {
        for (parent, name) in &drops.names {
            self.count(kernel.inval_entry(INodeNo(*parent), OsStr::new(name)));
        }
        for &ino in &drops.inodes {
            // Offset -1: the attributes only; a file's pages are dropped at its next open.
            self.count(kernel.inval_inode(INodeNo(ino), -1, 0));
        }
    }

    fn count(&self, r: std::io::Result<()>) {
        if let Err(e) = r
            && self.failed.fetch_add(1, Ordering::Relaxed) == 0
        {
            tracing::warn!("the kernel refused a cache invalidation: {e}");
        }
    }

    /// The watcher: reads the feed and delivers it until the runtime ends. The kernel is
    /// told on a blocking thread (an invalidation can wait for a directory lock).
    pub async fn watch(self: Arc<Self>, agent: Arc<Agent>, kernel: Notifier) {
        let _ = self.kernel.set(kernel.clone());
        let (mut epoch, mut after) = (0u64, 0u64);
        // The feed was lost (no answer for `--retry-for`, or an agent without one): what
        // changed meanwhile is unknown.
        let mut lost = false;
        // Resets made by reconnections as of the last batch of the feed followed.
        let mut resets = self.resets.load(Ordering::Acquire);
        loop {
            let request = FsRequest::Watch {
                epoch,
                after,
                session: agent.session(),
                wait_ms: MAX_WATCH_MS,
            };
            match agent.fs(request).await {
                Ok(FsResponse::Changes(batch)) => {
                    if epoch != 0 && batch.epoch != epoch && batch.reset {
                        // A new feed: the agent restarted. The mount marked every name
                        // stale when it reconnected (here, if no reconnection did since
                        // the old feed's last batch); what the new agent changed since it
                        // started is in its feed from the start.
                        if self.resets.load(Ordering::Acquire) == resets {
                            self.reconnected();
                        }
                        resets = self.resets.load(Ordering::Acquire);
                        (epoch, after) = (batch.epoch, FEED_START);
                        continue;
                    }
                    resets = self.resets.load(Ordering::Acquire);
                    let renewed = std::mem::take(&mut lost);
                    (epoch, after) = (batch.epoch, batch.next);
                    let drops = self.mark(&batch, renewed);
                    if !drops.is_empty() {
                        let (me, k) = (self.clone(), kernel.clone());
                        let told = tokio::task::spawn_blocking(move || me.notify(&drops, &k));
                        if told.await.is_err() {
                            return;
                        }
                    }
                    self.delivered.send_replace((batch.epoch, batch.next));
                    if !self.live.swap(true, Ordering::Relaxed) {
                        tracing::info!("kernel caches follow the agent's change feed");
                    }
                }
                other => {
                    if self.live.swap(false, Ordering::Relaxed) || epoch == 0 {
                        tracing::info!(
                            answer = ?other.err(),
                            "the agent has no change feed; names and attributes are cached for {UNWATCHED_TTL:?}"
                        );
                    }
                    if !lost {
                        // Names handed out so far can no longer be checked.
                        self.reconnected();
                        lost = true;
                    }
                    (epoch, after) = (0, 0);
                    tokio::time::sleep(Duration::from_secs(5)).await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_changed_elsewhere_makes_paths_through_it_stale_once() {
        let mut n = Names::default();
        assert!(n.entered(ROOT_INO, "d", 10, 0, None));
        assert!(n.entered(10, "f", 11, 0, None));
        assert!(!n.stale_path(11));
        assert_eq!(
            n.changed(ROOT_INO, "d", None),
            Some(10),
            "d was renamed away"
        );
        assert!(n.stale_path(11), "d/f was reached through d");
        assert!(!n.stale_path(11), "the kernel looked everything up again");
    }

    #[test]
    fn a_lookup_answered_while_its_name_changed_is_not_cached() {
        let mut n = Names::default();
        let since = n.position();
        n.changed(ROOT_INO, "other", None);
        assert!(
            n.entered(ROOT_INO, "f", 5, since, None),
            "another name changed"
        );
        let since = n.position();
        n.changed(ROOT_INO, "g", None);
        assert!(
            !n.entered(ROOT_INO, "g", 6, since, None),
            "its own name changed meanwhile"
        );
        assert!(n.stale_path(6));
    }

    #[test]
    fn own_renames_and_removals_keep_the_records_right() {
        let mut n = Names::default();
        n.entered(ROOT_INO, "a", 5, 0, None);
        n.entered(ROOT_INO, "b", 6, 0, None);
        n.renamed((ROOT_INO, "a"), (ROOT_INO, "b"));
        assert_eq!(n.changed(ROOT_INO, "a", None), None, "a is gone here");
        assert_eq!(n.changed(ROOT_INO, "b", None), Some(5), "b is what a was");
        n.entered(ROOT_INO, "c", 7, n.position(), None);
        n.removed(ROOT_INO, "c");
        assert_eq!(n.changed(ROOT_INO, "c", None), None);
        n.forget(5);
        assert!(!n.stale_path(5), "forgotten: nothing to check");
    }

    #[test]
    fn a_reset_makes_everything_stale_and_lookups_under_way_uncached() {
        let mut n = Names::default();
        n.entered(ROOT_INO, "a", 5, 0, None);
        let since = n.position();
        let (names, inodes) = n.reset();
        assert_eq!(names, vec![(ROOT_INO, "a".to_string())]);
        assert_eq!(inodes, vec![5]);
        assert!(n.stale_path(5));
        assert!(
            !n.entered(ROOT_INO, "b", 6, since, None),
            "sent before the reset"
        );
        assert!(n.entered(ROOT_INO, "b", 6, n.position(), None));
    }

    fn batch(names: &[(Ino, &str)], inodes: &[Ino]) -> ChangeBatch {
        ChangeBatch {
            epoch: 1,
            next: 1,
            names: names.iter().map(|(p, n)| (*p, n.to_string())).collect(),
            inodes: inodes.to_vec(),
            ..ChangeBatch::default()
        }
    }

    #[test]
    fn the_kernel_is_told_only_what_it_was_given() {
        let c = Coherence::default();
        c.entered(ROOT_INO, "d", 10, 0, None);
        c.entered(10, "f", 11, 0, None);
        // Another node made d/g and changed inode 12: neither was handed to this kernel.
        let none = c.mark(&batch(&[(10, "g")], &[12]), false);
        assert_eq!(none, Drops::default(), "nothing to tell the kernel");
        // A change under the root, and to d's entry for f: the root and what it holds.
        let some = c.mark(&batch(&[(10, "f")], &[ROOT_INO, 10, 12]), false);
        assert_eq!(
            some,
            Drops {
                names: vec![(10, "f".to_string())],
                inodes: vec![11, ROOT_INO, 10],
            }
        );
        c.forget(10);
        let after = c.mark(&batch(&[], &[10]), false);
        assert_eq!(after, Drops::default(), "the kernel forgot d");
        // Unknown names still move the position: a lookup under way is not cached.
        let since = c.position();
        c.mark(&batch(&[(10, "h")], &[]), false);
        assert!(!c.entered(10, "h", 13, since, None));
    }

    #[test]
    fn lookups_older_than_the_remembered_changes_are_not_cached() {
        let mut n = Names::default();
        let since = n.position();
        for i in 0..RECENT + 1 {
            n.changed(ROOT_INO, &format!("x{i}"), None);
        }
        assert!(!n.entered(ROOT_INO, "y", 9, since, None));
        assert!(n.entered(ROOT_INO, "y", 9, n.position(), None));
    }

    fn at(epoch: u64, position: u64) -> Option<Stamp> {
        Some(Stamp { epoch, position })
    }

    #[test]
    fn a_change_delivered_after_a_lookup_that_already_saw_it_leaves_that_name_good() {
        let mut n = Names::default();
        // This mount looks /m140 up before its watcher delivers the rename that made it
        // (the agent had applied it: the answer is stamped after it).
        let since = n.position();
        assert!(n.entered(ROOT_INO, "m140", 53, since, at(7, 12)));
        n.entered(53, "f", 60, since, at(7, 12));
        // The rename arrives in a batch ending at 11: nothing to drop for this name.
        assert_eq!(n.changed(ROOT_INO, "m140", at(7, 11)), None);
        assert!(!n.stale_path(60), "the path was found after the rename");
        // The name stays known: a later change of it (a batch past the stamp) is dropped
        // from the kernel and makes it stale.
        assert_eq!(n.changed(ROOT_INO, "m140", at(7, 20)), Some(53));
        assert!(n.stale_path(60));
    }

    #[test]
    fn a_change_of_an_older_name_marks_the_inode_whatever_name_it_has_now() {
        let mut n = Names::default();
        // The kernel was given /a -> 5 long ago.
        n.entered(ROOT_INO, "a", 5, 0, at(7, 2));
        // Another node renames /a to /b and makes a new /a; this mount looks /b up first.
        n.entered(ROOT_INO, "b", 5, n.position(), at(7, 12));
        // The change of /a arrives: the kernel may still walk /a to 5.
        assert_eq!(n.changed(ROOT_INO, "a", at(7, 11)), Some(5));
        assert!(n.stale_path(5), "an open through the old /a answers ESTALE");
    }

    #[test]
    fn a_stamp_of_another_feed_covers_nothing() {
        let mut n = Names::default();
        n.entered(ROOT_INO, "a", 5, 0, at(1, 100));
        n.changed(ROOT_INO, "a", at(2, 3));
        assert!(
            n.stale_path(5),
            "positions of different feeds do not compare"
        );
        let since = n.position();
        n.changed(ROOT_INO, "b", at(2, 4));
        assert!(
            !n.entered(ROOT_INO, "b", 6, since, at(1, 100)),
            "raced: the stamp is of the old feed"
        );
        let since = n.position();
        n.changed(ROOT_INO, "c", at(2, 5));
        assert!(
            n.entered(ROOT_INO, "c", 7, since, at(2, 5)),
            "the answer was read after the change"
        );
    }

    #[tokio::test]
    async fn an_open_in_a_new_feed_waits_until_the_watcher_follows_that_feed() {
        let c = Arc::new(Coherence::default());
        c.live.store(true, Ordering::Relaxed);
        c.entered(ROOT_INO, "d", 10, 0, at(1, 50));
        c.entered(10, "f", 11, 0, at(1, 50));
        c.delivered.send_replace((1, 90));
        // The agent restarted: its new feed is at 3. Position 3 of feed 2 is no position
        // of feed 1, though 90 >= 3.
        let open = {
            let c = c.clone();
            tokio::spawn(async move { c.open_is_stale(11, Some(2), 3).await })
        };
        tokio::task::yield_now().await;
        assert!(!open.is_finished(), "waits for the watcher to reach feed 2");
        // The mount reconnected (marking every name), then the watcher read the new feed.
        c.reconnected();
        c.delivered.send_replace((2, 3));
        assert!(
            open.await.expect("open"),
            "a name handed out before the restart is stale"
        );
        // Looked up again from the new agent: good.
        c.entered(ROOT_INO, "d", 10, c.position(), at(2, 3));
        c.entered(10, "f", 11, c.position(), at(2, 3));
        assert!(!c.open_is_stale(11, Some(2), 3).await);
    }
}
