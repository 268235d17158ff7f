//! `shoal tier status` and `shoal stat`'s cold extents, from the local replica and this
//! node's mover.

use std::sync::Arc;
use std::time::SystemTime;

use shoal_agent_api::{ColdExtent, Ino, TierReport};
use shoal_tiering::pack::object_key;

use super::{Tier, lock};
use crate::AgentError;
use crate::worker::WorkerState;

/// The word `tier status` shows for the mover worker's state (`mover`): `moving` only
/// while it uploads, `backing off` only while it waits out a failed upload's backoff.
pub fn mover_word(state: Option<WorkerState>, backing_off: bool, uploading: bool) -> &'static str {
    match state {
        Some(WorkerState::Busy) if uploading => "moving",
        Some(WorkerState::Error) if backing_off => "backing off",
        Some(WorkerState::Busy | WorkerState::Error | WorkerState::Idle) | None => "idle",
        Some(WorkerState::Throttled) => "throttled",
        Some(WorkerState::Standby) => "standby",
        Some(WorkerState::Done | WorkerState::Stopped) => "stopped",
    }
}

impl Tier {
    /// This node's view of the tier; `mover` is its mover worker's state.
    pub async fn report(
        self: &Arc<Self>,
        mover: Option<WorkerState>,
    ) -> Result<TierReport, AgentError> {
        let store = self.group.store();
        let summary = store.tier_summary()?;
        let files = store.tier_files()?;
        let fill = self.fill().await;
        let s = lock(&self.state);
        let mut r = TierReport {
            store: self.store.describe(),
            hot_bytes: summary.hot_bytes,
            cold_bytes: summary.cold_bytes,
            moving_files: s.moving_files,
            moving_bytes: s.moving_bytes,
            objects: summary.objects,
            object_bytes: summary.object_bytes,
            garbage_objects: summary.garbage_objects,
            garbage_bytes: summary.garbage_bytes,
            mover: mover_word(mover, s.backing_off, s.moving_files > 0).to_owned(),
            store_ok: s.store_ok,
            last_error: s.last_error.as_ref().map(|(e, _)| e.clone()),
            last_error_unix_ms: s.last_error.as_ref().map(|(_, at)| {
                at.duration_since(SystemTime::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as u64)
            }),
            uploaded_bytes: s.uploaded_bytes,
            recall_requests: s.recall_requests,
            recall_bytes: s.recall_bytes,
            cold_after: self.config.cold_after.clone(),
            high_watermark: self.policy.high_watermark,
            low_watermark: self.policy.low_watermark,
            fill: fill.share(),
            ..TierReport::default()
        };
        if let Some(p) = s.prefetch {
            r.prefetch_files_total = p.files_total;
            r.prefetch_files_done = p.files_done;
            r.prefetch_bytes_total = p.bytes_total;
            r.prefetch_bytes_done = p.bytes_done;
            let secs = p.started.elapsed().as_secs_f64();
            if secs > 0.0 {
                r.prefetch_bytes_per_sec = (p.bytes_done as f64 / secs) as u64;
            }
        }
        drop(s);
        for f in &files {
            match (f.hot_bytes > 0, f.cold_bytes > 0) {
                (true, false) => r.hot_files += 1,
                (false, true) => r.cold_files += 1,
                (true, true) => r.partly_cold_files += 1,
                (false, false) => {}
            }
        }
        Ok(r)
    }

    /// Where file `ino`'s cold extents are.
    pub fn cold_extents(&self, ino: Ino) -> Result<Vec<ColdExtent>, AgentError> {
        let data = self.group.store().file_data(ino)?;
        Ok(data
            .extents
            .iter()
            .filter_map(|e| {
                data.cold.get(&e.stripe.id).map(|loc| ColdExtent {
                    stripe: e.stripe.id,
                    object: object_key(loc.object),
                    offset: loc.offset + e.stripe_offset,
                    len: e.len,
                })
            })
            .collect())
    }

    /// `shoal tier release`: these files (and every file below these directories) to the
    /// bucket now, whatever the policy says.
    pub async fn release(
        self: &Arc<Self>,
        inos: &[Ino],
    ) -> Result<shoal_agent_api::TierMoved, AgentError> {
        // Everything committed so far: a file closed through another node a moment ago
        // may not be on this replica yet, and would be skipped as if it had no data.
        self.group.barrier().await?;
        let files = self.group.store().files_below(inos)?;
        self.upload_files(&files).await
    }
}

impl Tier {
    /// `shoal tier pin` / `unpin`.
    pub async fn pin(&self, ino: Ino, pinned: bool) -> Result<String, AgentError> {
        if !self.cluster_on_this_release().await {
            return Err(AgentError::Refused(
                "pins need every node on this release; finish the upgrade first".into(),
            ));
        }
        let outcome = self
            .group
            .propose_one(shoal_namespace::Proposal {
                id: None,
                now: shoal_namespace::format::Timestamp::now(),
                command: shoal_namespace::Command::SetPin { ino, pinned },
            })
            .await?;
        match outcome {
            shoal_namespace::Outcome::Done => Ok(if pinned {
                format!("inode {ino} pinned: it stays on NVMe")
            } else {
                format!("inode {ino} unpinned: the policy may send it to the cold tier")
            }),
            shoal_namespace::Outcome::Failed(error) => Err(AgentError::Declined {
                what: format!("inode {ino}"),
                error: error.into(),
            }),
            other => {
                Err(crate::consensus::ConsensusError::UnexpectedOutcome(Box::new(other)).into())
            }
        }
    }
}

#[cfg(test)]
mod word_tests {
    use super::mover_word;
    use crate::worker::WorkerState;

    #[test]
    fn the_mover_says_moving_only_while_uploading_and_backing_off_only_in_a_backoff() {
        let word = |state, backing_off, uploading| mover_word(Some(state), backing_off, uploading);
        assert_eq!(word(WorkerState::Busy, false, true), "moving");
        assert_eq!(
            word(WorkerState::Busy, false, false),
            "idle",
            "a scan that moves nothing"
        );
        assert_eq!(word(WorkerState::Error, true, false), "backing off");
        assert_eq!(
            word(WorkerState::Error, false, false),
            "idle",
            "a failure not retried"
        );
        assert_eq!(word(WorkerState::Standby, false, false), "standby");
        assert_eq!(word(WorkerState::Throttled, false, false), "throttled");
        assert_eq!(word(WorkerState::Stopped, false, false), "stopped");
        assert_eq!(mover_word(None, false, false), "idle");
    }
}
