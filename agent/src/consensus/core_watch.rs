//! [`CoreWatch`]: notices when this member's Raft core stopped on its own.
//!
//! openraft stops its core on a storage error (the log could not be written: EIO, a full
//! disk) and reports it only in its metrics (`running_state`), which then stay as they
//! were: without this worker the member would still look like a voter, and a former leader
//! like the leader, while every proposal went nowhere. The worker records the reason in
//! the group ([`Group::core_failed`]); from then on the member leads and serves nothing,
//! status and gossip say so (the steward replaces it as a voter as it would a down node),
//! and the agent exits non-zero once the others had time to do that.
//!
//! In detail: `leader()` is None, proposals and barriers fail at once with
//! `ConsensusError::MemberFailed`, and every filesystem request is answered `Unavailable`;
//! status shows the reason as `meta.failed` and gossip as `meta_failed`; the agent exits
//! 40 s later (`MEMBER_FAILED_EXIT_AFTER` in `node.rs`) for systemd to restart it.

use std::sync::Arc;

use shoal_mesh::GossipHandle;
use tokio::sync::watch;

use super::ConsensusError;
use super::group::Group;
use crate::worker::{Step, Worker};

/// The worker (see the module doc).
pub struct CoreWatch {
    group: Arc<Group>,
    gossip: GossipHandle,
    metrics: watch::Receiver<openraft::RaftMetrics<u64, openraft::BasicNode>>,
    /// The core dropped its metrics: it is gone.
    gone: bool,
}

impl CoreWatch {
    pub fn new(group: Arc<Group>, gossip: GossipHandle) -> Self {
        let metrics = group.raft.metrics();
        CoreWatch {
            group,
            gossip,
            metrics,
            gone: false,
        }
    }
}

/// Why a core with these metrics stopped, if it did.
fn stopped(m: &openraft::RaftMetrics<u64, openraft::BasicNode>) -> Option<String> {
    m.running_state.as_ref().err().map(ToString::to_string)
}

impl Worker for CoreWatch {
    type Error = ConsensusError;

    fn name(&self) -> &'static str {
        "meta-core-watch"
    }

    async fn work(&mut self) -> Result<Step, ConsensusError> {
        let reason = match stopped(&self.metrics.borrow_and_update()) {
            Some(reason) => reason,
            None if self.gone => "the Raft core ended without saying why".into(),
            None => return Ok(Step::Idle),
        };
        self.group.core_stopped(reason);
        if self.group.failure().is_some() {
            // The others stop counting on this member as a voter.
            self.gossip.publish(|f| f.meta_failed = true).await?;
        }
        Ok(Step::Done)
    }

    async fn wait_for_work(&mut self) {
        if self.gone {
            return std::future::pending().await;
        }
        if self.metrics.changed().await.is_err() {
            self.gone = true;
        }
    }
}
