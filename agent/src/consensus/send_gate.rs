//! Lets Raft's messages to peers finish before the agent closes its connections.
//!
//! openraft's replication tasks outlive `Raft::shutdown`: one may be half-way through an
//! append when the core stops, and closing the QUIC endpoint under it makes that append
//! fail with "connection lost" (logged as an error during a clean stop). The group stops
//! Raft, then closes this gate: the close waits for sends under way, and a send that
//! starts later waits for ever (the runtime drops it on exit) instead of failing.

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::{OwnedRwLockReadGuard, OwnedRwLockWriteGuard, RwLock};

pub struct SendGate {
    lock: std::sync::Arc<RwLock<()>>,
    /// Held once closed, so no send starts again.
    closed: Mutex<Option<OwnedRwLockWriteGuard<()>>>,
}

/// Held for the length of one send.
pub struct Sending {
    _held: OwnedRwLockReadGuard<()>,
}

impl SendGate {
    pub fn new() -> SendGate {
        SendGate {
            lock: std::sync::Arc::new(RwLock::new(())),
            closed: Mutex::new(None),
        }
    }

    /// Waits while the gate is open for a send to start; never returns once closed.
    pub async fn enter(&self) -> Sending {
        Sending {
            _held: self.lock.clone().read_owned().await,
        }
    }

    /// Closes the gate, waiting up to `patience` for the sends under way. Returns whether
    /// they all finished in time.
    pub async fn close(&self, patience: Duration) -> bool {
        match tokio::time::timeout(patience, self.lock.clone().write_owned()).await {
            Ok(guard) => {
                *self.closed.lock().unwrap_or_else(|p| p.into_inner()) = Some(guard);
                true
            }
            Err(_) => false,
        }
    }
}

impl Default for SendGate {
    fn default() -> Self {
        SendGate::new()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::SendGate;

    #[tokio::test]
    async fn close_waits_for_the_send_under_way_and_later_sends_never_start() {
        let gate = Arc::new(SendGate::new());
        let sending = gate.enter().await;
        let closer = tokio::spawn({
            let gate = gate.clone();
            async move { gate.close(Duration::from_secs(5)).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!closer.is_finished(), "closed under a send");
        drop(sending);
        assert!(closer.await.expect("closer"), "close gave up");
        let late = tokio::time::timeout(Duration::from_millis(50), gate.enter()).await;
        assert!(late.is_err(), "a send started after the close");
    }

    #[tokio::test]
    async fn close_gives_up_after_its_patience() {
        let gate = SendGate::new();
        let _stuck = gate.enter().await;
        assert!(!gate.close(Duration::from_millis(20)).await);
    }
}
