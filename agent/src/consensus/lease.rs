//! [`ReadLease`]: how long after a read-index round the leader may answer read index
//! without another one. A round that succeeded proves a quorum acknowledged this
//! leader's heartbeats sent after the round began; openraft's followers refuse to vote
//! for anyone else for `election_timeout_max` after such a heartbeat (the leader lease).
//! So for a part of that time no other leader can exist, and everything committed is in
//! this leader's log: its last log index is a valid read index.
//!
//! The lease lasts half of `election_timeout_min` after the round began (500 ms by
//! default) and only in the term it was won in. The leader answers read index from it for
//! itself and for followers (`shoal_meta_lease_reads_total`). A lease of four election
//! timeouts, planted in the simulator, gave stale reads (6 of 300 seeds).

use std::time::Duration;

use tokio::time::Instant;

/// The leader trusts a round for this fraction of `election_timeout_min` (which is below
/// the followers' lease of `election_timeout_max`): room for clocks that run at
/// different rates and for the time a read takes.
const LEASE_FRACTION: u32 = 2;

#[derive(Debug)]
pub struct ReadLease {
    length: Duration,
    /// Term and end of the current lease.
    held: Option<(u64, Instant)>,
}

impl ReadLease {
    pub fn new(election_timeout_min_ms: u64) -> Self {
        ReadLease {
            length: Duration::from_millis(election_timeout_min_ms) / LEASE_FRACTION,
            held: None,
        }
    }

    /// A round that began at `started` succeeded in `term`.
    pub fn renew(&mut self, term: u64, started: Instant) {
        let until = started + self.length;
        match self.held {
            Some((t, u)) if t == term && u >= until => {}
            _ => self.held = Some((term, until)),
        }
    }

    /// Whether this node, leader in `term`, may skip the round `now`.
    pub fn valid(&self, term: u64, now: Instant) -> bool {
        self.held.is_some_and(|(t, until)| t == term && now < until)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_holds_for_half_the_election_timeout_in_its_term_only() {
        let mut lease = ReadLease::new(1000);
        let t0 = Instant::now();
        assert!(!lease.valid(3, t0), "no round yet");
        lease.renew(3, t0);
        assert!(lease.valid(3, t0 + Duration::from_millis(499)));
        assert!(!lease.valid(3, t0 + Duration::from_millis(500)), "expired");
        assert!(!lease.valid(4, t0), "another term");
        // An older round does not shorten a newer one.
        lease.renew(3, t0 + Duration::from_millis(200));
        lease.renew(3, t0);
        assert!(lease.valid(3, t0 + Duration::from_millis(699)));
        // A new term replaces it.
        lease.renew(4, t0);
        assert!(!lease.valid(3, t0));
        assert!(lease.valid(4, t0));
    }
}
