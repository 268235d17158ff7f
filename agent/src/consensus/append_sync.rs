//! [`AppendSync`]: which log appends this member makes durable before it acknowledges them.
//!
//! A voter's acknowledgement counts towards a commit, so a voter syncs every append. A
//! learner's does not count, so a learner syncs only every [`LEARNER_SYNC_EVERY`]-th
//! append: the others are written to its log's segment without an `fdatasync` (made durable
//! by the next synced record, or by the kernel's writeback). A learner whose machine loses
//! power (a process kill loses nothing: the writes are in the page cache) may lose at most
//! those appends; its log is then shorter than the leader last heard, and the leader sends
//! the rest again (openraft's `loosen-follower-log-revert`: without it the leader takes a
//! shorter follower log for a bug). On one machine with six agents this halved the fsyncs
//! per metadata entry; on a real cluster it saves each learner's disk the same.
//!
//! Safety when a learner becomes a voter: openraft changes voters through a joint
//! configuration, and the append that brings the joint entry sees this member among its
//! voters, so it is synced, and with it every append before it (one `fdatasync` of the
//! segment covers every write before it, and a segment is synced before the next one
//! starts). Until that entry is acknowledged the new configuration commits nothing, and the
//! old one needs a majority of its own voters, all of which synced. When in doubt (after a
//! restart, before the group says what this member is, and after a truncation, which may
//! have removed the entry that made it a learner) every append is synced.

use std::sync::atomic::{AtomicU8, AtomicU32, Ordering};

use openraft::{EntryPayload, Membership};

use super::types::Entry;

/// A learner syncs one append in this many (and every append while in doubt).
pub const LEARNER_SYNC_EVERY: u32 = 64;

const UNKNOWN: u8 = 0;
const VOTER: u8 = 1;
const LEARNER: u8 = 2;

/// What this member is, as far as its own log says, and how many appends went unsynced.
#[derive(Debug)]
pub struct AppendSync {
    me: u64,
    role: AtomicU8,
    unsynced: AtomicU32,
}

impl AppendSync {
    pub fn new(me: u64) -> Self {
        AppendSync {
            me,
            role: AtomicU8::new(UNKNOWN),
            unsynced: AtomicU32::new(0),
        }
    }

    /// Whether the append of `entries` must be durable before it is acknowledged. The last
    /// membership entry among them decides what this member is from now on.
    pub fn before_append(&self, entries: &[Entry]) -> bool {
        let last_membership = entries.iter().rev().find_map(|e| match &e.payload {
            EntryPayload::Membership(m) => Some(m),
            _ => None,
        });
        if let Some(m) = last_membership {
            self.role.store(self.role_in(m), Ordering::SeqCst);
        }
        if self.role.load(Ordering::SeqCst) != LEARNER {
            return true;
        }
        if self.unsynced.fetch_add(1, Ordering::Relaxed) + 1 >= LEARNER_SYNC_EVERY {
            self.unsynced.store(0, Ordering::Relaxed);
            return true;
        }
        false
    }

    /// What the group's effective membership says at start; taken only while nothing else
    /// has decided (an append of a membership entry meanwhile knows better).
    pub fn started_as(&self, membership: &Membership<u64, openraft::BasicNode>) {
        let _ = self.role.compare_exchange(
            UNKNOWN,
            self.role_in(membership),
            Ordering::SeqCst,
            Ordering::SeqCst,
        );
    }

    /// The log lost its tail: the entry that made this member a learner may be gone.
    pub fn truncated(&self) {
        self.role.store(UNKNOWN, Ordering::SeqCst);
    }

    fn role_in(&self, membership: &Membership<u64, openraft::BasicNode>) -> u8 {
        if membership.voter_ids().any(|v| v == self.me) {
            VOTER
        } else {
            LEARNER
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use openraft::{BasicNode, CommittedLeaderId, LogId};

    use super::super::types::MetaRaft;
    use super::*;

    fn membership(configs: Vec<Vec<u64>>, learners: &[u64]) -> Membership<u64, BasicNode> {
        let mut nodes = BTreeMap::new();
        for id in configs.iter().flatten().chain(learners) {
            nodes.insert(*id, BasicNode::default());
        }
        let configs = configs
            .into_iter()
            .map(|c| c.into_iter().collect::<BTreeSet<_>>())
            .collect();
        Membership::new(configs, nodes)
    }

    fn entry(index: u64, payload: EntryPayload<MetaRaft>) -> Entry {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload,
        }
    }

    fn blank(index: u64) -> Entry {
        entry(index, EntryPayload::Blank)
    }

    fn changed(index: u64, m: Membership<u64, BasicNode>) -> Entry {
        entry(index, EntryPayload::Membership(m))
    }

    #[test]
    fn in_doubt_every_append_is_synced() {
        let s = AppendSync::new(4);
        for i in 0..LEARNER_SYNC_EVERY * 2 {
            assert!(s.before_append(&[blank(i as u64)]));
        }
    }

    #[test]
    fn a_learner_syncs_one_append_in_n_and_a_voter_every_one() {
        let s = AppendSync::new(4);
        s.started_as(&membership(vec![vec![1, 2, 3]], &[4]));
        let synced = (0..LEARNER_SYNC_EVERY * 3)
            .filter(|i| s.before_append(&[blank(*i as u64)]))
            .count();
        assert_eq!(synced, 3);
        let v = AppendSync::new(2);
        v.started_as(&membership(vec![vec![1, 2, 3]], &[4]));
        assert!((0..100).all(|i| v.before_append(&[blank(i)])));
    }

    #[test]
    fn the_append_that_makes_a_learner_a_voter_is_synced_and_so_is_every_later_one() {
        let s = AppendSync::new(4);
        s.started_as(&membership(vec![vec![1, 2, 3]], &[4]));
        assert!(!s.before_append(&[blank(1)]));
        // The joint configuration names 4 among the new voters.
        let joint = membership(vec![vec![1, 2, 3], vec![1, 2, 4]], &[3]);
        assert!(s.before_append(&[blank(2), changed(3, joint), blank(4)]));
        assert!((5..200).all(|i| s.before_append(&[blank(i)])));
        // Demoted again: back to one in n.
        let demoted = membership(vec![vec![1, 2, 3]], &[4]);
        let after: Vec<bool> = (0..LEARNER_SYNC_EVERY)
            .map(|i| s.before_append(&[changed(300, demoted.clone()), blank(301 + i as u64)]))
            .collect();
        assert_eq!(after.iter().filter(|d| **d).count(), 1);
    }

    #[test]
    fn the_start_does_not_override_what_an_append_said_and_a_truncation_brings_doubt() {
        let s = AppendSync::new(4);
        s.before_append(&[changed(1, membership(vec![vec![1, 2, 4]], &[]))]);
        s.started_as(&membership(vec![vec![1, 2, 3]], &[4]));
        assert!(s.before_append(&[blank(2)]), "still a voter");
        let l = AppendSync::new(4);
        l.started_as(&membership(vec![vec![1, 2, 3]], &[4]));
        assert!(!l.before_append(&[blank(1)]));
        l.truncated();
        assert!((2..200).all(|i| l.before_append(&[blank(i)])));
    }
}
