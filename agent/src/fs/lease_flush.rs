//! [`LeaseFlush`]: the writeback of this node's directory leases. Every
//! `[meta] metadata_writeback_ms`, or sooner when many ops wait, it commits what the leases answered (in order, one
//! batch per round), collects the changes that did not commit as answered for the next
//! `Sync`, and gives back the leases unused for a while (`leases.rs`).

use std::sync::Arc;
use std::time::Duration;

use shoal_agent_api::FsError;

use super::leases::Leases;
use crate::worker::{Step, Worker};

pub struct LeaseFlush {
    leases: Arc<Leases>,
    every: Duration,
}

impl LeaseFlush {
    /// `None` when leases are off (`metadata_writeback_ms = 0`).
    pub fn new(leases: Arc<Leases>, every: Duration) -> Option<LeaseFlush> {
        (!every.is_zero()).then_some(LeaseFlush { leases, every })
    }
}

impl Worker for LeaseFlush {
    type Error = FsError;

    fn name(&self) -> &'static str {
        "lease-writeback"
    }

    async fn work(&mut self) -> Result<Step, FsError> {
        if self.leases.pending() || !self.leases.held().is_empty() {
            self.leases.writeback().await?;
        }
        Ok(Step::Idle)
    }

    async fn wait_for_work(&mut self) {
        tokio::select! {
            () = tokio::time::sleep(self.every) => {}
            () = self.leases.woken() => {}
        }
    }

    fn progress(&self) -> Option<String> {
        let held = self.leases.held().len();
        (held > 0).then(|| format!("{held} directory leases held"))
    }
}
