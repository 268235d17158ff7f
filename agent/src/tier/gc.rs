//! The `tier-gc` worker (acts on the metadata leader): deletes from the bucket the objects
//! no cold stripe uses any more (their files were deleted, overwritten or warmed) and
//! forgets them (`ObjectsDeleted`); and, less often, lists the bucket for objects the
//! metadata never heard of (an upload whose commit was lost) and, once they have been
//! seen for `orphan_object_grace`, fences them through Raft as garbage (then deleted like
//! any other).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use shoal_namespace::format::Timestamp;
use shoal_namespace::{Command, Outcome, Proposal};
use shoal_tiering::pack::{object_id, object_key};
use tokio::time::Instant;
use tracing::{debug, info};

use super::Tier;
use crate::AgentError;
use crate::worker::{Step, Ticker, Worker};

/// Garbage objects deleted per unit of work, at most.
const PER_PASS: usize = 256;
/// How long one store request of the collector may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

pub struct TierGc {
    tier: Arc<Tier>,
    ticker: Ticker,
    /// Objects in the bucket the metadata does not know, and since when.
    unknown_since: HashMap<u128, Instant>,
    next_listing: Instant,
}

impl TierGc {
    pub fn new(tier: Arc<Tier>, every: Duration) -> TierGc {
        TierGc {
            tier,
            ticker: Ticker::every(every),
            unknown_since: HashMap::new(),
            next_listing: Instant::now(),
        }
    }

    /// How often the bucket is listed for orphans: a quarter of their grace.
    fn listing_every(&self) -> Duration {
        (self.tier.config.orphan_object_grace / 4).max(Duration::from_secs(1))
    }

    async fn delete_garbage(&mut self) -> Result<bool, AgentError> {
        let garbage = self.tier.group.store().object_garbage(PER_PASS)?;
        if garbage.is_empty() {
            return Ok(false);
        }
        let mut deleted = Vec::new();
        for (id, _) in &garbage {
            let key = object_key(*id);
            match self
                .tier
                .timed(REQUEST_TIMEOUT, self.tier.store.delete(&key))
                .await
            {
                Ok(()) => deleted.push(*id),
                Err(e) => {
                    debug!(object = %key, error = %e, "garbage object not deleted yet");
                    break;
                }
            }
        }
        if deleted.is_empty() {
            return Ok(false);
        }
        let n = deleted.len();
        self.tier
            .group
            .propose_one(Proposal {
                id: None,
                now: Timestamp::now(),
                command: Command::ObjectsDeleted { objects: deleted },
            })
            .await?;
        info!(
            objects = n,
            "deleted objects no file uses from the cold tier"
        );
        Ok(n == garbage.len() && n == PER_PASS)
    }

    /// Objects in the bucket the metadata does not know, seen for the grace, are fenced
    /// through Raft (`ObjectsOrphaned`) and so become garbage for `delete_garbage`. The log
    /// orders the fence after any commit of the same object already in it: a slow upload's
    /// commit either lands first (and the object is kept) or is refused afterwards.
    async fn fence_orphans(&mut self) -> Result<(), AgentError> {
        let listed = self
            .tier
            .timed(REQUEST_TIMEOUT, self.tier.store.list("objects"))
            .await?;
        let now = Instant::now();
        let grace = self.tier.config.orphan_object_grace;
        let store = self.tier.group.store();
        let mut still = HashMap::new();
        let mut due = Vec::new();
        for (key, size) in listed {
            let Some(id) = object_id(&key) else {
                continue;
            };
            if store.object_known(id)? {
                continue;
            }
            let since = self.unknown_since.get(&id).copied().unwrap_or(now);
            if now.duration_since(since) >= grace {
                due.push((id, size));
            } else {
                still.insert(id, since);
            }
        }
        self.unknown_since = still;
        if due.is_empty() {
            return Ok(());
        }
        let outcome = self
            .tier
            .group
            .propose_one(Proposal {
                id: None,
                now: Timestamp::now(),
                command: Command::ObjectsOrphaned { objects: due },
            })
            .await?;
        if let Outcome::Orphaned(ids) = outcome
            && !ids.is_empty()
        {
            info!(
                objects = ids.len(),
                "objects the metadata never knew (uploads whose commit was lost) are garbage now"
            );
        }
        Ok(())
    }
}

impl Worker for TierGc {
    type Error = AgentError;

    fn name(&self) -> &'static str {
        "tier-gc"
    }

    async fn work(&mut self) -> Result<Step, AgentError> {
        if !self.tier.group.is_leader() {
            return Ok(Step::Standby);
        }
        if !self.tier.cluster_on_this_release().await {
            return Ok(Step::Idle);
        }
        self.tier.claim().await?;
        let more = self.delete_garbage().await?;
        if Instant::now() >= self.next_listing {
            self.next_listing = Instant::now() + self.listing_every();
            self.fence_orphans().await?;
        }
        Ok(if more { Step::Busy } else { Step::Idle })
    }

    async fn wait_for_work(&mut self) {
        self.ticker.tick().await;
    }

    fn progress(&self) -> Option<String> {
        (!self.unknown_since.is_empty()).then(|| {
            format!(
                "{} objects the metadata does not know, within their grace",
                self.unknown_since.len()
            )
        })
    }
}
