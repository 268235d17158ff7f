//! Sending stripes to the bucket: read each stripe's bytes (from its data shards, or
//! decoded), pack several into one object, upload it, read it back and check every
//! stripe's checksum, and only then commit "this stripe lives at object O, range R"
//! through Raft. The local shards are freed after the commit, by each holder's leftover
//! sweep (the record names no node for them any more). A failed upload or check commits
//! nothing; an object whose commit is lost is fenced and deleted by `tier-gc` as an
//! orphan.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use bytes::Bytes;
use shoal_agent_api::{Ino, StripeRecord, TierMoved};
use shoal_namespace::format::{ColdLocation, Timestamp};
use shoal_namespace::{Command, Outcome, Proposal};
use shoal_placement::StripeId;
use shoal_tiering::pack::{self, object_key};
use tracing::{info, warn};

use super::{Tier, lock};
use crate::AgentError;
use crate::consensus::ConsensusError;

/// A whole object's upload (and its read-back) must finish within this.
const UPLOAD_TIMEOUT: Duration = Duration::from_secs(120);

impl Tier {
    /// Sends the hot stripes of these files to the bucket.
    pub(super) async fn upload_files(
        self: &Arc<Self>,
        inos: &[Ino],
    ) -> Result<TierMoved, AgentError> {
        if !self.cluster_on_this_release().await {
            return Err(AgentError::Refused(
                "the cold tier needs every node on this release; finish the upgrade first".into(),
            ));
        }
        self.claim().await?;
        let started = Instant::now();
        let mut files: Vec<(Ino, Vec<StripeRecord>)> = Vec::new();
        let mut seen = BTreeSet::new();
        for &ino in inos {
            let data = self.group.store().file_data(ino)?;
            let hot: Vec<StripeRecord> = data
                .extents
                .into_iter()
                .filter(|e| !data.cold.contains_key(&e.stripe.id))
                .map(|e| e.stripe)
                .filter(|s| seen.insert(s.id))
                .collect();
            if !hot.is_empty() {
                files.push((ino, hot));
            }
        }
        {
            let mut s = lock(&self.state);
            s.moving_files = files.len() as u64;
            s.moving_bytes = files.iter().flat_map(|(_, s)| s).map(|r| r.len).sum();
        }
        let result = self.upload_stripes(&files).await;
        {
            let mut s = lock(&self.state);
            s.moving_files = 0;
            s.moving_bytes = 0;
        }
        let tiered = result?;
        let mut moved = TierMoved::default();
        for (_, stripes) in &files {
            let cold: Vec<&StripeRecord> =
                stripes.iter().filter(|r| tiered.contains(&r.id)).collect();
            moved.files += u64::from(!cold.is_empty());
            moved.stripes += cold.len() as u64;
            moved.bytes += cold.iter().map(|r| r.len).sum::<u64>();
        }
        moved.millis = started.elapsed().as_millis() as u64;
        if moved.stripes > 0 {
            info!(
                files = moved.files,
                stripes = moved.stripes,
                bytes = moved.bytes,
                "moved data to the cold tier"
            );
        }
        Ok(moved)
    }

    /// Reads, packs and uploads the stripes, one object per `object_size`; the ids of
    /// those now cold.
    async fn upload_stripes(
        self: &Arc<Self>,
        files: &[(Ino, Vec<StripeRecord>)],
    ) -> Result<BTreeSet<StripeId>, AgentError> {
        let mut tiered = BTreeSet::new();
        let mut batch: Vec<(u128, Bytes)> = Vec::new();
        let mut batch_bytes = 0u64;
        for record in files.iter().flat_map(|(_, s)| s) {
            self.wait_for_budget(record.len).await;
            // One stripe that cannot be read now (too few shards) must not hold up the
            // rest: it stays hot, and a later pass tries it again.
            let read = match self.stripes.read(record, 0, record.len).await {
                Ok(r) => r,
                Err(e) => {
                    warn!(stripe = %record.id, error = %e, "stripe not readable; left on NVMe for now");
                    continue;
                }
            };
            batch_bytes += read.data.len() as u64;
            batch.push((record.id.0, Bytes::from(read.data)));
            if batch_bytes >= self.object_size {
                tiered.extend(self.upload_object(std::mem::take(&mut batch)).await?);
                batch_bytes = 0;
            }
        }
        if !batch.is_empty() {
            tiered.extend(self.upload_object(batch).await?);
        }
        Ok(tiered)
    }

    /// Uploads one object of `stripes`, checks it, and commits their new home.
    async fn upload_object(
        self: &Arc<Self>,
        stripes: Vec<(u128, Bytes)>,
    ) -> Result<Vec<StripeId>, AgentError> {
        let id = crate::sim_thread::random_u128();
        let key = object_key(id);
        let (object, index) = pack::pack(&stripes);
        let size = object.len() as u64;
        self.timed(UPLOAD_TIMEOUT, self.store.put(&key, object))
            .await?;
        let back = self
            .timed(UPLOAD_TIMEOUT, self.store.get_range(&key, 0..size))
            .await;
        let checked = back.and_then(|b| pack::verify(&key, &b));
        match checked {
            Ok(found) if found == index => {}
            other => {
                let why = match other {
                    Err(e) => e.to_string(),
                    Ok(_) => "its index differs from what was uploaded".into(),
                };
                warn!(object = %key, error = %why, "uploaded object failed its check; nothing freed");
                if let Err(e) = self.store.delete(&key).await {
                    warn!(object = %key, error = %e, "could not delete the failed object (tier-gc will)");
                }
                return Err(shoal_tiering::TierError::Damaged { key, what: why }.into());
            }
        }
        self.metrics.put_requests.inc();
        self.metrics.put_bytes.inc_by(size);
        let located = index
            .iter()
            .map(|p| {
                (
                    StripeId(p.stripe),
                    ColdLocation {
                        object: id,
                        offset: p.offset,
                        len: p.len,
                        crc32c: p.crc32c,
                    },
                )
            })
            .collect();
        let outcome = self
            .group
            .propose_one(Proposal {
                id: None,
                now: Timestamp::now(),
                command: Command::TierStripes {
                    object: id,
                    size,
                    stripes: located,
                },
            })
            .await;
        let store = self.group.store();
        match outcome {
            Ok(Outcome::Tiered(ids)) => {
                lock(&self.state).uploaded_bytes += size;
                Ok(ids)
            }
            // A proposal sent again after a lost answer is refused when its first try
            // applied: the object is known then, and its stripes are cold.
            _ if store.object_known(id)? => {
                lock(&self.state).uploaded_bytes += size;
                let mut ids = Vec::new();
                for p in &index {
                    let s = StripeId(p.stripe);
                    if store.cold_location(s)?.is_some_and(|l| l.object == id) {
                        ids.push(s);
                    }
                }
                Ok(ids)
            }
            Ok(other) => Err(ConsensusError::UnexpectedOutcome(Box::new(other)).into()),
            Err(e) => Err(e.into()),
        }
    }
}
