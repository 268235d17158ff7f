//! The `facts` worker: tells the cluster, through gossip, what this node's store can take
//! (whether it takes new shards, its room) and how full its filesystem is, when that
//! changes and every 5 s; and sets the metadata's ballast aside again once there is room.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use shoal_mesh::GossipHandle;
use shoal_store::{NodeStore, RingHealth};
use tracing::warn;

use crate::AgentError;
use crate::consensus::ballast::Ballast;
use crate::worker::{Step, Ticker, Worker};

/// How often the worker looks at the store and the filesystem.
const CHECK_EVERY: Duration = Duration::from_secs(2);
/// How often facts are published when nothing worth telling changed. Gossip broadcasts
/// can be lost (a peer's receive buffer full under load): CI saw a peer still holding a
/// node's start-up facts ("store not open yet") 30 s later, so writers kept placing
/// around that node. A republication is one small broadcast.
const REFRESH_EVERY: Duration = Duration::from_secs(5);

/// What the facts say about the store: whether it takes new shards, and its room.
type StoreFacts = (bool, u64);

/// The size and use of the node's filesystem, in bytes: [`disk_usage`] of the data dir
/// in an agent, figures of its simulated disk in the simulator.
pub type DiskFigures = Box<dyn Fn() -> (u64, u64) + Send + Sync>;

pub struct Facts {
    pub store: Arc<NodeStore>,
    pub gossip: GossipHandle,
    disk: DiskFigures,
    pub ballast: Arc<Ballast>,
    told: Option<(StoreFacts, Instant)>,
    ticker: Ticker,
}

impl Facts {
    pub fn new(
        store: Arc<NodeStore>,
        gossip: GossipHandle,
        disk: DiskFigures,
        ballast: Arc<Ballast>,
    ) -> Facts {
        Facts {
            store,
            gossip,
            disk,
            ballast,
            told: None,
            ticker: Ticker::every(CHECK_EVERY),
        }
    }

    fn store_facts(&self) -> StoreFacts {
        let room = self.store.room();
        let ring_ok = matches!(self.store.ring_health(), RingHealth::Running { .. });
        (ring_ok && room >= crate::data::MIN_ROOM, room)
    }
}

/// Whether facts changed enough to tell the cluster now: the store stopped or started
/// taking shards, or its room moved by a sixteenth.
fn facts_changed(before: StoreFacts, now: StoreFacts) -> bool {
    before.0 != now.0 || before.1.abs_diff(now.1) > before.1.max(now.1) / 16
}

/// Size and use of the filesystem holding `dir`.
pub fn disk_usage(dir: &std::path::Path) -> (u64, u64) {
    match nix::sys::statvfs::statvfs(dir) {
        Ok(s) => {
            let frag = s.fragment_size();
            let total = s.blocks() * frag;
            let used = (s.blocks() - s.blocks_free()) * frag;
            (total, used)
        }
        Err(e) => {
            warn!(error = %e, "statvfs of the data dir failed");
            (0, 0)
        }
    }
}

impl Worker for Facts {
    type Error = AgentError;

    fn name(&self) -> &'static str {
        "facts"
    }

    async fn work(&mut self) -> Result<Step, AgentError> {
        self.ballast.restore();
        let store = self.store_facts();
        if let Some((told, at)) = self.told
            && !facts_changed(told, store)
            && at.elapsed() < REFRESH_EVERY
        {
            return Ok(Step::Idle);
        }
        if self.told.is_some_and(|(t, _)| t.0 && !store.0) {
            warn!(room = store.1, ring = ?self.store.ring_health(), "the shard store takes no new shards; writers place elsewhere");
        }
        let (capacity, used) = (self.disk)();
        self.gossip
            .publish(move |f| {
                f.capacity_bytes = capacity;
                f.used_bytes = used;
                f.store_accepting = store.0;
                f.store_room_bytes = store.1;
                f.store_opening = false;
            })
            .await?;
        self.told = Some((store, Instant::now()));
        Ok(Step::Idle)
    }

    async fn wait_for_work(&mut self) {
        self.ticker.tick().await;
    }
}

#[cfg(test)]
mod tests {
    use super::facts_changed;

    #[test]
    fn facts_are_republished_when_the_store_state_or_room_moves() {
        assert!(!facts_changed((true, 1600), (true, 1600)));
        assert!(!facts_changed((true, 1600), (true, 1550)));
        assert!(facts_changed((true, 1600), (true, 1400)));
        assert!(facts_changed((true, 1600), (false, 1600)));
        assert!(facts_changed((true, 0), (true, 1)));
    }
}
