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

use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::OsStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fuser::{INodeNo, Notifier};
use shoal_agent_api::{
    ChangeBatch, DELIVERY_WAIT_MS, FsRequest, FsResponse, Ino, MAX_WATCH_MS, ROOT_INO,
};
use tokio::sync::watch;

use super::agent::Agent;

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

/// The names this mount handed to the kernel, and which changed since. Pure: the watcher
/// and the request handlers drive it; positions are the watcher's own count of name
/// changes delivered.
#[derive(Default)]
pub struct Names {
    by_child: HashMap<Ino, Record>,
    by_name: HashMap<(Ino, String), Ino>,
    /// Every inode handed to the kernel and not forgotten since (it may cache their
    /// attributes), besides the root, which it always holds.
    held: HashSet<Ino>,
    /// The last name changes delivered, with their positions.
    recent: VecDeque<(u64, Ino, String)>,
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
    /// `since`. Whether it may cache that: not when the name changed while the request
    /// was under way (the answer may predate the change).
    pub fn entered(&mut self, parent: Ino, name: &str, ino: Ino, since: u64) -> bool {
        let raced = since < self.floor
            || self
                .recent
                .iter()
                .rev()
                .take_while(|(at, _, _)| *at > since)
                .any(|(_, p, n)| *p == parent && n == name);
        self.by_name.insert((parent, name.to_owned()), ino);
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
        let replaced = self.by_name.remove(&(to.0, to.1.to_owned()));
        if let Some(ino) = self.by_name.remove(&(from.0, from.1.to_owned())) {
            self.by_name.insert((to.0, to.1.to_owned()), ino);
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
            if self.by_name.get(&key) == Some(&ino) {
                self.by_name.remove(&key);
            }
        }
    }

    /// Whether the kernel may hold `ino` (and cache its attributes).
    pub fn holds(&self, ino: Ino) -> bool {
        ino == ROOT_INO || self.held.contains(&ino)
    }

    /// Another node changed `parent/name`; the inode it named here, if any (when none, the
    /// kernel has no entry for the name: this mount answers a missing name with an error,
    /// which the kernel does not cache).
    pub fn changed(&mut self, parent: Ino, name: &str) -> Option<Ino> {
        self.position += 1;
        if self.recent.len() == RECENT
            && let Some((at, _, _)) = self.recent.pop_front()
        {
            self.floor = self.floor.max(at);
        }
        self.recent
            .push_back((self.position, parent, name.to_owned()));
        let ino = self.by_name.remove(&(parent, name.to_owned()))?;
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
}

impl Default for Coherence {
    fn default() -> Self {
        Coherence {
            names: Mutex::default(),
            delivered: watch::Sender::new((0, 0)),
            live: AtomicBool::new(false),
            failed: AtomicU64::new(0),
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

    /// Whether the agent serves the feed (and the requests of its protocol).
    pub fn is_live(&self) -> bool {
        self.live.load(Ordering::Relaxed)
    }

    /// Where the watcher is, for [`Self::entered`].
    pub fn position(&self) -> u64 {
        self.names().position()
    }

    /// See [`Names::entered`].
    pub fn entered(&self, parent: Ino, name: &str, ino: Ino, since: u64) -> bool {
        self.names().entered(parent, name, ino, since)
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

    /// After an open whose barrier saw feed position `changes`: waits until the watcher
    /// delivered that far, then whether the path the kernel walked to `ino` may be stale.
    pub async fn open_is_stale(&self, ino: Ino, changes: u64) -> bool {
        if !self.live.load(Ordering::Relaxed) {
            return false;
        }
        let mut delivered = self.delivered.subscribe();
        let epoch = delivered.borrow().0;
        let reached = tokio::time::timeout(
            Duration::from_millis(DELIVERY_WAIT_MS),
            delivered.wait_for(|&(e, next)| e != epoch || next >= changes),
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
        }
        for (parent, name) in &batch.names {
            if let Some(ino) = names.changed(*parent, name) {
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
        let (mut epoch, mut after) = (0u64, 0u64);
        loop {
            let request = FsRequest::Watch {
                epoch,
                after,
                session: agent.session(),
                wait_ms: MAX_WATCH_MS,
            };
            match agent.fs(request).await {
                Ok(FsResponse::Changes(batch)) => {
                    // A new epoch (the agent restarted): what happened meanwhile is
                    // unknown.
                    let renewed = epoch != 0 && batch.epoch != epoch;
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
        assert!(n.entered(ROOT_INO, "d", 10, 0));
        assert!(n.entered(10, "f", 11, 0));
        assert!(!n.stale_path(11));
        assert_eq!(n.changed(ROOT_INO, "d"), Some(10), "d was renamed away");
        assert!(n.stale_path(11), "d/f was reached through d");
        assert!(!n.stale_path(11), "the kernel looked everything up again");
    }

    #[test]
    fn a_lookup_answered_while_its_name_changed_is_not_cached() {
        let mut n = Names::default();
        let since = n.position();
        n.changed(ROOT_INO, "other");
        assert!(n.entered(ROOT_INO, "f", 5, since), "another name changed");
        let since = n.position();
        n.changed(ROOT_INO, "g");
        assert!(
            !n.entered(ROOT_INO, "g", 6, since),
            "its own name changed meanwhile"
        );
        assert!(n.stale_path(6));
    }

    #[test]
    fn own_renames_and_removals_keep_the_records_right() {
        let mut n = Names::default();
        n.entered(ROOT_INO, "a", 5, 0);
        n.entered(ROOT_INO, "b", 6, 0);
        n.renamed((ROOT_INO, "a"), (ROOT_INO, "b"));
        assert_eq!(n.changed(ROOT_INO, "a"), None, "a is gone here");
        assert_eq!(n.changed(ROOT_INO, "b"), Some(5), "b is what a was");
        n.entered(ROOT_INO, "c", 7, n.position());
        n.removed(ROOT_INO, "c");
        assert_eq!(n.changed(ROOT_INO, "c"), None);
        n.forget(5);
        assert!(!n.stale_path(5), "forgotten: nothing to check");
    }

    #[test]
    fn a_reset_makes_everything_stale_and_lookups_under_way_uncached() {
        let mut n = Names::default();
        n.entered(ROOT_INO, "a", 5, 0);
        let since = n.position();
        let (names, inodes) = n.reset();
        assert_eq!(names, vec![(ROOT_INO, "a".to_string())]);
        assert_eq!(inodes, vec![5]);
        assert!(n.stale_path(5));
        assert!(!n.entered(ROOT_INO, "b", 6, since), "sent before the reset");
        assert!(n.entered(ROOT_INO, "b", 6, n.position()));
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
        c.entered(ROOT_INO, "d", 10, 0);
        c.entered(10, "f", 11, 0);
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
        assert!(!c.entered(10, "h", 13, since));
    }

    #[test]
    fn lookups_older_than_the_remembered_changes_are_not_cached() {
        let mut n = Names::default();
        let since = n.position();
        for i in 0..RECENT + 1 {
            n.changed(ROOT_INO, &format!("x{i}"));
        }
        assert!(!n.entered(ROOT_INO, "y", 9, since));
        assert!(n.entered(ROOT_INO, "y", 9, n.position()));
    }
}
