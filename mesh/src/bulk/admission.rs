//! Which incoming bulk connections get a handshake: a bound on connections still in their
//! TLS handshake, per source address and in all, so that anyone who can reach the port
//! (no credentials needed) cannot hold every slot; authenticated connections are counted
//! apart and never give their place to a newcomer.
//!
//! Pure: no sockets, no clock. The accept loop asks [`Admission::admit`] for each accepted
//! TCP connection and holds the [`Ticket`] until the handshake ends.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The bulk lane's limits on incoming connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BulkLimits {
    /// Connections from one source address still in their handshake, at most. A peer
    /// dials a handful at once (its pool fills on demand); a flooder gets no more.
    pub unauthenticated_per_source: usize,
    /// Connections still in their handshake, from every source together, at most.
    pub unauthenticated: usize,
    /// Authenticated connections served at once, at most (the pools of every peer, with
    /// room). One over it is told the lane is busy and its caller goes over QUIC.
    pub authenticated: usize,
    /// Longest a TLS handshake plus mode exchange may take before the connection is
    /// dropped. A peer on the storage network finishes in milliseconds.
    pub handshake_timeout: Duration,
}

impl Default for BulkLimits {
    fn default() -> Self {
        BulkLimits {
            unauthenticated_per_source: 16,
            unauthenticated: 256,
            authenticated: 1024,
            handshake_timeout: Duration::from_secs(3),
        }
    }
}

/// Why a connection was dropped before it could authenticate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Crowded {
    /// Its source address has as many handshakes under way as it may.
    Source,
    /// Every source together has as many handshakes under way as the lane takes.
    Everyone,
}

impl Crowded {
    /// The metric label.
    pub(crate) fn reason(self) -> &'static str {
        match self {
            Crowded::Source => "source_limit",
            Crowded::Everyone => "unauthenticated_limit",
        }
    }
}

#[derive(Default)]
struct Counts {
    per_source: HashMap<IpAddr, usize>,
    total: usize,
}

/// The handshakes under way, by source.
pub(crate) struct Admission {
    limits: BulkLimits,
    counts: Mutex<Counts>,
}

/// One admitted handshake; its slot frees when it is dropped.
pub(crate) struct Ticket {
    admission: Arc<Admission>,
    source: IpAddr,
}

impl Admission {
    pub(crate) fn new(limits: BulkLimits) -> Arc<Self> {
        Arc::new(Admission {
            limits,
            counts: Mutex::new(Counts::default()),
        })
    }

    /// A slot for a handshake from `source`, or why there is none.
    pub(crate) fn admit(self: &Arc<Self>, source: IpAddr) -> Result<Ticket, Crowded> {
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let from_source = counts.per_source.get(&source).copied().unwrap_or(0);
        if from_source >= self.limits.unauthenticated_per_source {
            return Err(Crowded::Source);
        }
        if counts.total >= self.limits.unauthenticated {
            return Err(Crowded::Everyone);
        }
        counts.total += 1;
        counts.per_source.insert(source, from_source + 1);
        Ok(Ticket {
            admission: self.clone(),
            source,
        })
    }

    /// Handshakes under way (from `source`, and in all).
    #[cfg(test)]
    fn under_way(&self, source: IpAddr) -> (usize, usize) {
        let counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let from = counts.per_source.get(&source).copied().unwrap_or(0);
        (from, counts.total)
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut counts = self
            .admission
            .counts
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        counts.total = counts.total.saturating_sub(1);
        // Forget a source with nothing under way, so the map holds only live handshakes.
        if let Some(n) = counts.per_source.get_mut(&self.source) {
            *n -= 1;
            if *n == 0 {
                counts.per_source.remove(&self.source);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    fn limits(per_source: usize, all: usize) -> BulkLimits {
        BulkLimits {
            unauthenticated_per_source: per_source,
            unauthenticated: all,
            ..BulkLimits::default()
        }
    }

    #[test]
    fn one_source_gets_its_share_and_no_more() {
        let gate = Admission::new(limits(3, 100));
        let held: Vec<_> = (0..3).map(|_| gate.admit(ip(1)).expect("admit")).collect();
        assert_eq!(gate.admit(ip(1)).err(), Some(Crowded::Source));
        // Another source is not held up by the first.
        let other = gate.admit(ip(2)).expect("another source");
        assert_eq!(gate.under_way(ip(1)), (3, 4));
        drop(held);
        drop(other);
        assert_eq!(gate.under_way(ip(1)), (0, 0));
        assert!(gate.admit(ip(1)).is_ok(), "the slots came back");
    }

    #[test]
    fn many_sources_together_are_bounded_and_slots_free_on_drop() {
        let gate = Admission::new(limits(2, 5));
        let mut held: Vec<_> = (1..=5).map(|i| gate.admit(ip(i)).expect("admit")).collect();
        assert_eq!(gate.admit(ip(9)).err(), Some(Crowded::Everyone));
        held.pop();
        assert!(gate.admit(ip(9)).is_ok());
        assert_eq!(gate.counts.lock().expect("lock").per_source.len(), 4);
    }

    #[test]
    fn the_default_deadline_is_short_and_a_peer_may_dial_its_pool_at_once() {
        let l = BulkLimits::default();
        assert!(l.handshake_timeout <= Duration::from_secs(3));
        assert!(l.unauthenticated_per_source >= super::super::POOL_PER_PEER);
        assert!(l.unauthenticated_per_source < l.unauthenticated);
    }
}
