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
//! old one needs a majority of its own voters, all of which synced.
//!
//! What this member is comes from the same place openraft takes it: the last membership
//! entry in the log, or, where the log holds none after it, the membership of the state
//! machine (applied, or installed with a snapshot). Both are known before Raft starts (the
//! log store reads its log's membership entries at open, the state machine its marker), so
//! a restarted voter syncs its first append; a snapshot that makes a learner a voter tells
//! this policy before the next append. A truncation drops the membership entries it
//! removed, so the one in force before them decides again. With nothing known (a new
//! member before its first membership entry) every append is synced.
//!
//! `shoal_meta_log_appends_total`, `shoal_meta_log_syncs_total` and
//! `shoal_meta_log_unsynced_appends_total` (never above 0 on a voter) show it.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use openraft::{EntryPayload, Membership};

use super::types::Entry;

/// A learner syncs one append in this many (and every append while in doubt).
pub const LEARNER_SYNC_EVERY: u32 = 64;

/// What a membership makes this member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Voter,
    Learner,
}

/// The memberships that decide this member's role.
#[derive(Debug, Default)]
struct Known {
    /// Membership entries in the log by index (of those up to the purge point, only the
    /// last is kept).
    log: BTreeMap<u64, Role>,
    /// The state machine's membership: the index of its entry, and the role.
    applied: Option<(u64, Role)>,
}

impl Known {
    /// The role in force: the newest membership's, log or state machine.
    fn role(&self) -> Option<Role> {
        let log = self.log.last_key_value().map(|(i, r)| (*i, *r));
        match (log, self.applied) {
            (Some(l), Some(a)) => Some(if l.0 >= a.0 { l.1 } else { a.1 }),
            (l, a) => l.or(a).map(|(_, r)| r),
        }
    }
}

/// What this member is, as far as its log and state machine say, and how many appends
/// went unsynced.
#[derive(Debug)]
pub struct AppendSync {
    me: u64,
    known: Mutex<Known>,
    unsynced: AtomicU32,
}

impl AppendSync {
    pub fn new(me: u64) -> Self {
        AppendSync {
            me,
            known: Mutex::default(),
            unsynced: AtomicU32::new(0),
        }
    }

    fn known(&self) -> std::sync::MutexGuard<'_, Known> {
        self.known.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What `membership` makes this member.
    pub fn role_in(&self, membership: &Membership<u64, openraft::BasicNode>) -> Role {
        if membership.voter_ids().any(|v| v == self.me) {
            Role::Voter
        } else {
            Role::Learner
        }
    }

    /// The role in force now (`None`: not known, every append is synced).
    #[cfg(test)]
    pub fn role(&self) -> Option<Role> {
        self.known().role()
    }

    /// Whether the append of `entries` must be durable before it is acknowledged: unless
    /// this member is a learner both before and after them. Their membership entries
    /// decide what this member is from now on.
    pub fn before_append(&self, entries: &[Entry]) -> bool {
        let (before, after) = {
            let mut known = self.known();
            let before = known.role();
            for e in entries {
                if let EntryPayload::Membership(m) = &e.payload {
                    known.log.insert(e.log_id.index, self.role_in(m));
                }
            }
            (before, known.role())
        };
        // The entries before a membership entry in the same append were sent while the
        // one before was in force: a voter until this append is still one for them.
        if before != Some(Role::Learner) || after != Some(Role::Learner) {
            return true;
        }
        if self.unsynced.fetch_add(1, Ordering::Relaxed) + 1 >= LEARNER_SYNC_EVERY {
            self.unsynced.store(0, Ordering::Relaxed);
            return true;
        }
        false
    }

    /// A membership entry found in the log at open.
    pub fn in_log(&self, index: u64, membership: &Membership<u64, openraft::BasicNode>) {
        let role = self.role_in(membership);
        self.known().log.insert(index, role);
    }

    /// The state machine's membership: read at open, or installed with a snapshot. One
    /// without a log id (a member that never had one) decides nothing.
    pub fn applied(&self, membership: &super::types::Membership) {
        let Some(at) = membership.log_id() else {
            return;
        };
        let role = self.role_in(membership.membership());
        let mut known = self.known();
        if known.applied.is_none_or(|(i, _)| i <= at.index) {
            known.applied = Some((at.index, role));
        }
    }

    /// The log lost its entries from `index` on: their memberships no longer count.
    pub fn truncated(&self, index: u64) {
        self.known().log.split_off(&index);
    }

    /// The log lost its entries up to `index`. The last membership among them still
    /// counts (it is in force until a newer one); older ones are forgotten.
    pub fn purged(&self, index: u64) {
        let mut known = self.known();
        let last = known.log.range(..=index).next_back().map(|(i, r)| (*i, *r));
        known.log = known.log.split_off(&index.saturating_add(1));
        if let Some((i, r)) = last {
            known.log.insert(i, r);
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

    fn stored(index: u64, m: Membership<u64, BasicNode>) -> super::super::types::Membership {
        openraft::StoredMembership::new(Some(LogId::new(CommittedLeaderId::new(1, 1), index)), m)
    }

    fn synced_of(s: &AppendSync, from: u64, n: u64) -> usize {
        (from..from + n)
            .filter(|i| s.before_append(&[blank(*i)]))
            .count()
    }

    #[test]
    fn in_doubt_every_append_is_synced() {
        let s = AppendSync::new(4);
        assert_eq!(synced_of(&s, 0, LEARNER_SYNC_EVERY as u64 * 2), 128);
        // A state machine that never had a membership decides nothing either.
        s.applied(&openraft::StoredMembership::default());
        assert_eq!(synced_of(&s, 200, 100), 100);
    }

    #[test]
    fn a_learner_syncs_one_append_in_n_and_a_voter_every_one() {
        let s = AppendSync::new(4);
        s.applied(&stored(1, membership(vec![vec![1, 2, 3]], &[4])));
        assert_eq!(synced_of(&s, 2, LEARNER_SYNC_EVERY as u64 * 3), 3);
        let v = AppendSync::new(2);
        v.applied(&stored(1, membership(vec![vec![1, 2, 3]], &[4])));
        assert_eq!(synced_of(&v, 2, 100), 100);
    }

    #[test]
    fn a_restarted_voter_syncs_from_its_first_append() {
        // What the log store finds in the log at open decides before Raft starts.
        let s = AppendSync::new(2);
        s.in_log(7, &membership(vec![vec![1, 2, 3]], &[]));
        assert_eq!(s.role(), Some(Role::Voter));
        assert_eq!(synced_of(&s, 8, 200), 200);
        // And where the log was purged past it, the state machine's membership decides.
        let p = AppendSync::new(2);
        p.applied(&stored(7, membership(vec![vec![1, 2, 3]], &[4])));
        assert_eq!(synced_of(&p, 8, 200), 200);
    }

    #[test]
    fn a_snapshot_that_makes_a_learner_a_voter_syncs_every_later_append() {
        let s = AppendSync::new(4);
        s.in_log(3, &membership(vec![vec![1, 2, 3]], &[4]));
        assert!(!s.before_append(&[blank(4)]));
        // The leader sends a snapshot whose membership names 4 a voter.
        s.applied(&stored(900, membership(vec![vec![1, 2, 4]], &[3])));
        s.purged(900);
        assert_eq!(synced_of(&s, 901, 200), 200);
    }

    #[test]
    fn the_newest_membership_decides_whether_log_or_state_machine() {
        let s = AppendSync::new(4);
        // An older applied membership does not override a newer entry in the log.
        s.in_log(10, &membership(vec![vec![1, 2, 4]], &[]));
        s.applied(&stored(5, membership(vec![vec![1, 2, 3]], &[4])));
        assert_eq!(s.role(), Some(Role::Voter));
        // An applied membership never goes back to an older one.
        s.applied(&stored(20, membership(vec![vec![1, 2, 3]], &[4])));
        s.applied(&stored(10, membership(vec![vec![1, 2, 4]], &[])));
        assert_eq!(s.role(), Some(Role::Learner));
    }

    #[test]
    fn the_append_that_makes_a_learner_a_voter_is_synced_and_so_is_every_later_one() {
        let s = AppendSync::new(4);
        s.applied(&stored(0, membership(vec![vec![1, 2, 3]], &[4])));
        assert!(!s.before_append(&[blank(1)]));
        // The joint configuration names 4 among the new voters.
        let joint = membership(vec![vec![1, 2, 3], vec![1, 2, 4]], &[3]);
        assert!(s.before_append(&[blank(2), changed(3, joint), blank(4)]));
        assert_eq!(synced_of(&s, 5, 195), 195);
        // Demoted again: back to one in n.
        let demoted = membership(vec![vec![1, 2, 3]], &[4]);
        let after: Vec<bool> = (0..LEARNER_SYNC_EVERY)
            .map(|i| s.before_append(&[changed(300, demoted.clone()), blank(301 + i as u64)]))
            .collect();
        // The demoting append itself is synced (a voter until then), then one in n.
        assert!(after[0]);
        assert!(after.iter().filter(|d| **d).count() <= 2, "{after:?}");
    }

    #[test]
    fn a_truncation_gives_the_decision_back_to_the_membership_before_it() {
        let s = AppendSync::new(4);
        s.in_log(3, &membership(vec![vec![1, 2, 4]], &[3]));
        // An uncommitted entry made 4 a learner; a new leader truncates it away.
        assert!(s.before_append(&[changed(9, membership(vec![vec![1, 2, 3]], &[4]))]));
        assert_eq!(s.role(), Some(Role::Learner));
        s.truncated(9);
        assert_eq!(s.role(), Some(Role::Voter));
        assert_eq!(synced_of(&s, 9, 200), 200);
    }
}
