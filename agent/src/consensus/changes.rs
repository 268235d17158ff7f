//! [`ChangeFeed`]: the names and inodes this agent's replica changed, in apply order, for
//! its mounts to drop from their kernels' caches (`FsRequest::Watch`). The state machine
//! publishes every applied entry's [`Touched`]; a mount reads from where it stopped.
//!
//! Each change carries its origin (the request id's client: a mount's session); a mount
//! is not sent its own, which its kernel has seen happen. The feed keeps the last
//! [`CAPACITY`] (65,536) changes and has a random epoch per agent process. The state
//! machine publishes an entry's changes before its apply returns, so whoever sees the index
//! applied finds them in the feed. A mount that asks for older ones, or for another
//! process's feed (the agent restarted), or anything across a snapshot install, is told to
//! reset: drop everything it has cached.
//!
//! The feed also knows how far each mount has delivered (a watcher reads again only once
//! it delivered the batch before), so an open that answers `ESTALE` can wait until the
//! kernel's caches are clean before the kernel looks the path up again
//! ([`ChangeFeed::delivered`]).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use shoal_agent_api::{ChangeBatch, FEED_START, Ino};
use shoal_namespace::Touched;
use tokio::sync::watch;

/// Changes kept for mounts that are behind.
const CAPACITY: usize = 1 << 16;
/// Most changes handed out in one batch.
const MAX_BATCH: usize = 4096;

#[derive(Clone, Debug, PartialEq, Eq)]
enum Change {
    Name(u64, Ino, String),
    Inode(u64, Ino),
    /// A snapshot was installed: anything may have changed.
    Everything,
}

impl Change {
    /// The session whose request made it (none for a reset, which concerns everyone).
    fn origin(&self) -> Option<u64> {
        match self {
            Change::Name(o, _, _) | Change::Inode(o, _) => Some(*o),
            Change::Everything => None,
        }
    }
}

struct Ring {
    /// Sequence number of `changes[0]`; numbers start at 1.
    first: u64,
    changes: VecDeque<Change>,
    /// The origin of the newest change, and the position just after the newest change
    /// of another origin: what a reader of that origin needs is all before it.
    tail_origin: Option<u64>,
    foreign_end: u64,
}

impl Ring {
    fn next(&self) -> u64 {
        self.first + self.changes.len() as u64
    }

    fn push(&mut self, change: Change) {
        let origin = change.origin();
        if origin.is_none() || origin != self.tail_origin {
            self.foreign_end = self.next();
            self.tail_origin = origin;
        }
        if self.changes.len() == CAPACITY {
            self.changes.pop_front();
            self.first += 1;
        }
        self.changes.push_back(change);
    }

    /// The position up to which `session` needs the changes (those after it are its own).
    fn needed_by(&self, session: u64) -> u64 {
        if session != 0 && self.tail_origin == Some(session) {
            self.foreign_end
        } else {
            self.next()
        }
    }
}

pub struct ChangeFeed {
    epoch: u64,
    ring: Mutex<Ring>,
    /// The next sequence number, for waiters.
    next: watch::Sender<u64>,
    /// How far each session's mount has delivered: the position its last read started
    /// from (a watcher reads again only once it has delivered the batch before).
    read_from: watch::Sender<HashMap<u64, u64>>,
    /// Changes of one origin published as another's: this node's directory-lease batches
    /// as the changes of the mount they were answered for (which saw them happen).
    alias: Mutex<Option<(u64, u64)>>,
}

impl Default for ChangeFeed {
    fn default() -> Self {
        Self::new()
    }
}

impl ChangeFeed {
    pub fn new() -> Self {
        ChangeFeed {
            epoch: crate::sim_thread::random_u64() | 1,
            ring: Mutex::new(Ring {
                first: FEED_START,
                changes: VecDeque::new(),
                tail_origin: None,
                foreign_end: FEED_START,
            }),
            alias: Mutex::new(None),
            next: watch::Sender::new(FEED_START),
            read_from: watch::Sender::new(HashMap::new()),
        }
    }

    /// This feed's epoch (random per agent process).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The position after the last change published so far.
    pub fn position(&self) -> u64 {
        self.lock().next()
    }

    /// The position up to which `session`'s mount must have the changes to see every
    /// change published so far: the newest ones, when they are its own, it has seen.
    pub fn needed_by(&self, session: u64) -> u64 {
        self.lock().needed_by(session)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Ring> {
        self.ring.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// From now on, changes of origin `from` are published as `to`'s.
    pub fn alias(&self, from: u64, to: u64) {
        *self.alias.lock().unwrap_or_else(|e| e.into_inner()) = Some((from, to));
    }

    pub fn publish(&self, touched: &Touched) {
        if touched.is_empty() {
            return;
        }
        let alias = *self.alias.lock().unwrap_or_else(|e| e.into_inner());
        let origin = |o: u64| match alias {
            Some((from, to)) if o == from => to,
            _ => o,
        };
        let next = {
            let mut ring = self.lock();
            for (o, parent, name) in &touched.names {
                ring.push(Change::Name(origin(*o), *parent, name.clone()));
            }
            for (o, ino) in &touched.inodes {
                ring.push(Change::Inode(origin(*o), *ino));
            }
            ring.next()
        };
        self.next.send_replace(next);
    }

    /// Everything may have changed (a snapshot replaced the replica).
    pub fn publish_reset(&self) {
        let next = {
            let mut ring = self.lock();
            ring.push(Change::Everything);
            ring.next()
        };
        self.next.send_replace(next);
    }

    /// The changes after `after` of feed `epoch`, but those of `session`, without waiting.
    pub fn read(&self, epoch: u64, after: u64, session: u64) -> ChangeBatch {
        let ring = self.lock();
        let mut batch = ChangeBatch {
            epoch: self.epoch,
            next: ring.next(),
            ..ChangeBatch::default()
        };
        if epoch == 0 {
            // A new reader starts from now.
            return batch;
        }
        if epoch != self.epoch || after < ring.first || after > ring.next() {
            batch.reset = true;
            return batch;
        }
        let start = (after - ring.first) as usize;
        let end = (start + MAX_BATCH).min(ring.changes.len());
        for change in ring.changes.range(start..end) {
            match change {
                Change::Name(origin, _, _) | Change::Inode(origin, _)
                    if session != 0 && *origin == session => {}
                Change::Name(_, parent, name) => batch.names.push((*parent, name.clone())),
                Change::Inode(_, ino) => batch.inodes.push(*ino),
                Change::Everything => batch.reset = true,
            }
        }
        batch.next = ring.first + end as u64;
        batch
    }

    /// Like [`Self::read`], waiting up to `wait` for a change when there is none yet.
    pub async fn wait(&self, epoch: u64, after: u64, session: u64, wait: Duration) -> ChangeBatch {
        if epoch == self.epoch && session != 0 {
            self.read_from.send_modify(|from| {
                let p = from.entry(session).or_insert(after);
                *p = (*p).max(after);
            });
        }
        let mut next = self.next.subscribe();
        let batch = self.read(epoch, after, session);
        if epoch == 0 || batch.reset || batch.next > after {
            return batch;
        }
        let _ = tokio::time::timeout(wait, next.wait_for(|&n| n > after)).await;
        self.read(epoch, after, session)
    }

    /// Waits (up to `limit`) until `session`'s mount has delivered the changes up to
    /// `position` to its kernel; at once for a session that never read the feed.
    pub async fn delivered(&self, session: u64, position: u64, limit: Duration) {
        let mut from = self.read_from.subscribe();
        let done = |from: &HashMap<u64, u64>| from.get(&session).is_none_or(|&p| p >= position);
        let _ = tokio::time::timeout(limit, from.wait_for(done)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touched(names: &[(Ino, &str)], inodes: &[Ino]) -> Touched {
        Touched {
            names: names.iter().map(|(p, n)| (7, *p, n.to_string())).collect(),
            inodes: inodes.iter().map(|i| (7, *i)).collect(),
        }
    }

    #[test]
    fn a_reader_gets_what_was_published_after_its_position_in_order() {
        let feed = ChangeFeed::new();
        let start = feed.read(0, 0, 0);
        assert!(!start.reset && start.names.is_empty());
        feed.publish(&touched(&[(1, "a")], &[1]));
        feed.publish(&touched(&[(2, "b")], &[]));
        let b = feed.read(start.epoch, start.next, 0);
        assert_eq!(b.names, vec![(1, "a".into()), (2, "b".into())]);
        assert_eq!(b.inodes, vec![1]);
        assert!(!b.reset);
        let again = feed.read(b.epoch, b.next, 0);
        assert!(again.names.is_empty() && again.inodes.is_empty() && !again.reset);
        assert_eq!(again.next, b.next);
    }

    #[test]
    fn another_epoch_a_lost_position_or_a_snapshot_means_reset() {
        let feed = ChangeFeed::new();
        let start = feed.read(0, 0, 0);
        assert!(
            feed.read(start.epoch ^ 2, start.next, 0).reset,
            "another process's feed"
        );
        assert!(
            feed.read(start.epoch, start.next + 5, 0).reset,
            "a position never given"
        );
        for i in 0..CAPACITY as u64 + 10 {
            feed.publish(&touched(&[], &[i]));
        }
        assert!(
            feed.read(start.epoch, start.next, 0).reset,
            "fell out of the ring"
        );
        let now = feed.position();
        feed.publish_reset();
        let b = feed.read(start.epoch, now, 0);
        assert!(b.reset);
        assert_eq!(b.next, now + 1);
    }

    #[test]
    fn an_aliased_origin_is_its_sessions_own() {
        let feed = ChangeFeed::new();
        let epoch = feed.read(0, 0, 0).epoch;
        feed.alias(7, 9);
        feed.publish(&touched(&[(1, "leased")], &[1]));
        let got = feed.read(epoch, FEED_START, 9);
        assert!(got.names.is_empty() && got.inodes.is_empty(), "{got:?}");
        let other = feed.read(epoch, FEED_START, 5);
        assert_eq!(other.names, vec![(1, "leased".to_string())]);
    }

    #[test]
    fn a_session_is_not_sent_its_own_changes() {
        let feed = ChangeFeed::new();
        let start = feed.read(0, 0, 0);
        feed.publish(&touched(&[(1, "mine")], &[1]));
        let own = feed.read(start.epoch, start.next, 7);
        assert!(own.names.is_empty() && own.inodes.is_empty());
        assert_eq!(own.next, feed.position(), "skipped, not pending");
        let other = feed.read(start.epoch, start.next, 8);
        assert_eq!(other.names, vec![(1, "mine".into())]);
    }

    #[test]
    fn a_batch_is_bounded_and_the_rest_follows() {
        let feed = ChangeFeed::new();
        let start = feed.read(0, 0, 0);
        for i in 0..(MAX_BATCH as u64 + 3) {
            feed.publish(&touched(&[], &[i]));
        }
        let first = feed.read(start.epoch, start.next, 0);
        assert_eq!(first.inodes.len(), MAX_BATCH);
        let rest = feed.read(first.epoch, first.next, 0);
        assert_eq!(rest.inodes, vec![4096, 4097, 4098]);
    }

    #[tokio::test]
    async fn a_waiting_reader_wakes_on_a_change_and_times_out_without_one() {
        let feed = std::sync::Arc::new(ChangeFeed::new());
        let start = feed.read(0, 0, 0);
        let quiet = feed
            .wait(start.epoch, start.next, 0, Duration::from_millis(20))
            .await;
        assert!(quiet.inodes.is_empty() && !quiet.reset);
        let f = feed.clone();
        let waiter = tokio::spawn(async move {
            f.wait(start.epoch, start.next, 0, Duration::from_secs(10))
                .await
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        feed.publish(&touched(&[], &[42]));
        let got = tokio::time::timeout(Duration::from_secs(2), waiter)
            .await
            .expect("woken")
            .expect("joined");
        assert_eq!(got.inodes, vec![42]);
    }

    #[test]
    fn a_session_needs_the_changes_up_to_the_last_one_not_its_own() {
        let feed = ChangeFeed::new();
        feed.publish(&touched(&[(1, "a")], &[])); // origin 7
        let after_others = feed.position();
        let mine = Touched {
            names: vec![(9, 1, "b".into())],
            inodes: vec![(9, 1)],
        };
        feed.publish(&mine);
        feed.publish(&mine);
        assert_eq!(
            feed.needed_by(9),
            after_others,
            "its own tail is not waited for"
        );
        assert_eq!(feed.needed_by(7), feed.position());
        assert_eq!(feed.needed_by(0), feed.position());
        feed.publish_reset();
        assert_eq!(
            feed.needed_by(9),
            feed.position(),
            "a reset concerns everyone"
        );
    }

    #[tokio::test]
    async fn delivered_waits_for_the_sessions_next_read() {
        let feed = std::sync::Arc::new(ChangeFeed::new());
        let start = feed.read(0, 0, 0);
        // A session that never read the feed has nothing to wait for.
        tokio::time::timeout(
            Duration::from_secs(10),
            feed.delivered(5, 99, Duration::from_secs(600)),
        )
        .await
        .expect("at once");
        let f = feed.clone();
        let reader = tokio::spawn(async move {
            f.wait(start.epoch, start.next, 3, Duration::from_secs(600))
                .await
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        feed.publish(&touched(&[], &[1]));
        let needed = feed.needed_by(3);
        let f = feed.clone();
        let delivered =
            tokio::spawn(async move { f.delivered(3, needed, Duration::from_secs(600)).await });
        let batch = reader.await.expect("joined");
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !delivered.is_finished(),
            "the batch is read, not yet delivered"
        );
        // The watcher reads again from where the batch ended: delivered.
        let f = feed.clone();
        let again = tokio::spawn(async move {
            f.wait(batch.epoch, batch.next, 3, Duration::from_secs(600))
                .await
        });
        tokio::time::timeout(Duration::from_secs(10), delivered)
            .await
            .expect("delivered")
            .expect("joined");
        again.abort();
    }
}
