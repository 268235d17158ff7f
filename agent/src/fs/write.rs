//! Writing file data: inline when the file is small enough, else as new stripes
//! (copy-on-write) committed as extents once every shard is durable. A stripe write that
//! failed in a way that may pass (a node just died and is not yet declared down) is
//! retried for a while; corruption or a caller's error is not.
//!
//! Stripes are retried for up to 30 s (a dead node leaves the layout meanwhile) and the
//! commit waits 60 s for a leader, each at most a quarter of `orphan_shard_grace_s`. A
//! file growing out of inline data carries its inline bytes into the first new stripe,
//! checked by the inode's data version, with at most 8 conflict retries
//! (`CONFLICT_RETRIES`). `WriteThenSet` (protocol 11): the data command and the setattr go
//! in one entry, in that order ([`with_set`]), so a copy's write, `futimens` and `fchmod`
//! are one commit instead of three.

use std::time::Duration;

use tokio::time::Instant;

use bytes::Bytes;
use shoal_agent_api::{FileAttr, FsError, FsResponse, Ino, RequestId, SetAttr, StripeRecord};
use shoal_namespace::format::Timestamp;
use shoal_namespace::{Command, LeasedChange, NewExtent, Outcome, Proposal};
use shoal_placement::DEFAULT_SHARD_SIZE;
use tokio::task::JoinSet;
use tracing::warn;

use super::service::{FsService, regular_file};
use crate::consensus::ConsensusError;
use crate::data::StripeError;

/// How often a write retries when the inline data it carried over changed under it.
const CONFLICT_RETRIES: u64 = 8;
/// How long a write keeps retrying stripes that could not be written (longer than
/// membership takes to declare a dead node down), at most.
const STRIPE_RETRY_FOR: Duration = Duration::from_secs(30);
/// How long a write's commit waits for a leader, at most.
const COMMIT_WAIT: Duration = Duration::from_secs(60);

/// The request id of attempt `n` of a write's extent commit: distinct from the id of its
/// inline attempt, and per retry, so a "conflict" answer is never replayed from the
/// deduplication table.
fn commit_id(id: RequestId, attempt: u64) -> RequestId {
    RequestId {
        client: id.client ^ 0x9e37_79b9_7f4a_7c15_u64.rotate_left(attempt as u32 + 1),
        seq: id.seq,
    }
}

/// The request id of the `setattr` that rides with attempt `n` of a write (0: the inline
/// attempt), distinct from the write's own ids.
fn set_id(id: RequestId, attempt: u64) -> RequestId {
    RequestId {
        client: id.client ^ 0x6a09_e667_f3bc_c908_u64.rotate_left(attempt as u32 + 1),
        seq: id.seq,
    }
}

/// A write's data proposal, and `set` of `ino` after it in the same entry.
fn with_set(data: Proposal, ino: Ino, set: Option<&SetAttr>, set_id: RequestId) -> Vec<Proposal> {
    let now = data.now;
    let mut proposals = vec![data];
    if let Some(set) = set {
        proposals.push(Proposal {
            id: Some(set_id.into()),
            now,
            command: Command::SetAttr {
                ino,
                set: set.clone().into(),
            },
        });
    }
    proposals
}

/// The outcome of a write's data proposal, and that of the `setattr` after it (if any).
fn data_outcome(mut outcomes: Vec<Outcome>) -> Result<(Outcome, Option<Outcome>), ConsensusError> {
    let set = (outcomes.len() > 1).then(|| outcomes.pop()).flatten();
    let data = outcomes
        .pop()
        .ok_or(ConsensusError::OutcomeCount { sent: 1, got: 0 })?;
    Ok((data, set))
}

/// The attributes after a committed write: those after its `setattr` when one rode with
/// it (whose failure, e.g. the file gone meanwhile, is the write's).
fn attr_after(
    data: shoal_namespace::format::FileAttr,
    set: Option<Outcome>,
) -> Result<FileAttr, FsError> {
    match set {
        None => Ok(data.into()),
        Some(Outcome::Attr(a)) => Ok(a.into()),
        Some(Outcome::Failed(e)) => Err(e.into()),
        Some(other) => Err(ConsensusError::UnexpectedOutcome(Box::new(other)).into()),
    }
}

impl FsService {
    /// How long a write may retry its stripes, and how long its commit may wait for a
    /// leader: each a quarter of `orphan_shard_grace_s` at most, so a write is always done
    /// (committed, or given up and written again) well before its shards could be taken
    /// for orphans. The abandon fence keeps a later commit safe anyway; this keeps it rare.
    fn write_patience(&self) -> (Duration, Duration) {
        let quarter = Duration::from_secs(self.group.config.orphan_shard_grace_s) / 4;
        (STRIPE_RETRY_FOR.min(quarter), COMMIT_WAIT.min(quarter))
    }

    /// Writes and commits `data` at `offset`: inline when the file is small enough, else
    /// as new stripes (copy-on-write) committed once every shard is durable. `then`
    /// (no size change) is committed in the same entry right after the data, so it lands
    /// on the data's time stamps; an attempt refused (inline data that must go to
    /// stripes, a conflict) may have applied it already, and the next attempt applies it
    /// again after its data.
    pub(super) async fn write(
        &self,
        id: RequestId,
        ino: Ino,
        offset: u64,
        data: Vec<u8>,
        then: Option<SetAttr>,
    ) -> Result<FileAttr, FsError> {
        let current = self.group.store().file_data(ino)?;
        regular_file(current.attr.kind)?;
        if data.is_empty() {
            return Ok(current.attr);
        }
        let end = offset
            .checked_add(data.len() as u64)
            .ok_or(FsError::TooBig)?;
        let max_inline = self.group.config.inline_max;
        let mut carried = (current.inline, current.inline_version);
        if current.extents.is_empty() && end <= max_inline {
            match self
                .write_inline(id, ino, offset, &data, max_inline, then.as_ref())
                .await?
            {
                Ok(attr) => return Ok(attr),
                Err(now) => carried = now,
            }
        }
        let data = Bytes::from(data);
        for attempt in 0..CONFLICT_RETRIES {
            let (inline, version) = &carried;
            let (retry_for, commit_wait) = self.write_patience();
            let extents = self
                .write_stripes_patiently(inline, offset, &data, retry_for)
                .await?;
            let records: Vec<StripeRecord> =
                extents.iter().map(|e| e.stripe.clone().into()).collect();
            let proposal = Proposal {
                id: Some(commit_id(id, attempt).into()),
                now: Timestamp::now(),
                command: Command::WriteExtents {
                    ino,
                    inline_version: (!inline.is_empty()).then_some(*version),
                    extents,
                },
            };
            let proposals = with_set(proposal, ino, then.as_ref(), set_id(id, attempt + 1));
            let outcome = self
                .group
                .propose_within(proposals, commit_wait)
                .await
                .and_then(data_outcome);
            match outcome {
                Ok((Outcome::Attr(a), set)) => return attr_after(a, set),
                Ok((Outcome::Conflict, _)) => {
                    self.discard(&records).await;
                    self.group.barrier().await?;
                    let now = self.group.store().file_data(ino)?;
                    carried = (now.inline, now.inline_version);
                }
                // This write took so long that a node gave its shards up for orphans (the
                // fence refused the commit): write the data again, to new stripes.
                Ok((Outcome::StripeAbandoned(stripe), _)) => {
                    warn!(%stripe, ino, "a stripe of this write was abandoned before its commit; writing again");
                    self.discard(&records).await;
                }
                Ok((Outcome::Failed(e), _)) => {
                    self.discard(&records).await;
                    return Err(e.into());
                }
                Ok((other, _)) => {
                    self.discard(&records).await;
                    return Err(ConsensusError::UnexpectedOutcome(Box::new(other)).into());
                }
                // Not known whether it committed: leave the shards to the orphan GC.
                Err(e) => return Err(e.into()),
            }
        }
        Err(FsError::Unavailable(
            "the file's inline data kept changing under this write".into(),
        ))
    }

    /// Tries the write as inline data (and `then` after it): the new attributes, or
    /// (inline refused: the file must go to stripes) its current inline bytes and version
    /// to carry over.
    async fn write_inline(
        &self,
        id: RequestId,
        ino: Ino,
        offset: u64,
        data: &[u8],
        max_inline: u64,
        then: Option<&SetAttr>,
    ) -> Result<Result<FileAttr, (Vec<u8>, u64)>, FsError> {
        let proposal = Proposal {
            id: Some(id.into()),
            now: Timestamp::now(),
            command: Command::WriteInline {
                ino,
                offset,
                data: data.to_vec(),
                max_inline,
            },
        };
        let proposals = with_set(proposal, ino, then, set_id(id, 0));
        let (outcome, set) = data_outcome(self.group.propose(proposals).await?)?;
        match outcome {
            Outcome::Attr(a) => Ok(Ok(attr_after(a, set)?)),
            Outcome::NotInline { inline, version } => Ok(Err((inline, version))),
            Outcome::Failed(e) => Err(e.into()),
            other => Err(ConsensusError::UnexpectedOutcome(Box::new(other)).into()),
        }
    }

    /// Like [`Self::write_stripes`], retrying for up to `retry_for` while the failure may
    /// pass (`StripeError::is_retryable`): a node that just died is still in the layout
    /// until gossip declares it down (a few seconds), after which new stripes skip it.
    /// The caller sees a stall, not an error.
    async fn write_stripes_patiently(
        &self,
        inline: &[u8],
        offset: u64,
        data: &Bytes,
        retry_for: Duration,
    ) -> Result<Vec<NewExtent>, FsError> {
        let deadline = Instant::now() + retry_for;
        let mut pause = Duration::from_millis(250);
        loop {
            match self.write_stripes(inline, offset, data).await {
                Err(e) if e.is_retryable() && Instant::now() < deadline => {
                    warn!(error = %e, "stripe write failed; retrying");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(2));
                }
                Err(e) => {
                    // The mount hears only an errno: the reason is said here.
                    warn!(error = %e, "stripe write failed; the writer gets an error");
                    return Err(FsError::from(e));
                }
                Ok(extents) => return Ok(extents),
            }
        }
    }

    /// Writes the carried-over inline bytes (if any) and `data` as stripes, in parallel;
    /// returns the extents in commit order. On a failure the stripes written are deleted.
    async fn write_stripes(
        &self,
        inline: &[u8],
        offset: u64,
        data: &Bytes,
    ) -> Result<Vec<NewExtent>, StripeError> {
        let ec = self.stripes.default_ec();
        let stripe_bytes = ec.k as usize * DEFAULT_SHARD_SIZE as usize;
        // Slices of the request's data, not copies.
        let mut pieces: Vec<(u64, Bytes)> = Vec::new();
        if !inline.is_empty() {
            pieces.push((0, Bytes::copy_from_slice(inline)));
        }
        for (i, at) in (0..data.len()).step_by(stripe_bytes).enumerate() {
            let end = (at + stripe_bytes).min(data.len());
            pieces.push((offset + (i * stripe_bytes) as u64, data.slice(at..end)));
        }
        let mut set = JoinSet::new();
        for (n, (at, bytes)) in pieces.into_iter().enumerate() {
            let stripes = self.stripes.clone();
            set.spawn(async move {
                let len = bytes.len() as u64;
                (n, at, len, stripes.write(bytes, None).await)
            });
        }
        let mut done: Vec<(usize, NewExtent)> = Vec::new();
        let mut failure = None;
        while let Some(joined) = set.join_next().await {
            match joined {
                Ok((n, offset, len, Ok(stripe))) => done.push((
                    n,
                    NewExtent {
                        offset,
                        len,
                        stripe: stripe.into(),
                    },
                )),
                Ok((_, _, _, Err(e))) => failure = Some(e),
                Err(e) => failure = Some(StripeError::Task(e)),
            }
        }
        done.sort_by_key(|(n, _)| *n);
        let extents: Vec<NewExtent> = done.into_iter().map(|(_, e)| e).collect();
        if let Some(e) = failure {
            let records: Vec<StripeRecord> = extents.into_iter().map(|e| e.stripe.into()).collect();
            self.discard(&records).await;
            return Err(e);
        }
        Ok(extents)
    }

    /// A write too big to be inline into file `ino` created under the lease on `dir`
    /// (held here): its stripes written, every shard durable, then the extents answered
    /// under the lease (`LeasedChange::WriteExtents`), committed with the holder's next
    /// batch after the file's create, with no round trip to the group now. Until that
    /// batch commits the shards are unreferenced; the op carries a deadline on the
    /// cluster clock (the replica's now plus this node's commit wait, a quarter of the
    /// orphan grace at most, as the committed path waits), past which the state machine
    /// refuses it: a lost op the next `fsync` reports, never extents whose shards were
    /// given up. `None` when the lease does not answer it: the file holds inline bytes
    /// (they would have to be carried, checked by version: the committed path does that),
    /// a stripe write failed once (the committed path retries it, patiently), or the
    /// lease ended meanwhile; the committed path writes it.
    pub(super) async fn leased_extents(
        &self,
        dir: Ino,
        ino: Ino,
        offset: u64,
        data: &[u8],
    ) -> Option<Result<FsResponse, FsError>> {
        if data.is_empty() || !self.leases.serves(dir) {
            return None;
        }
        let store = self.group.store();
        let holds_inline = match self.leases.inline_len(ino) {
            Some(Some(len)) => len > 0,
            Some(None) => return None,
            None => !store.file_data(ino).ok()?.inline.is_empty(),
        };
        if holds_inline {
            return None;
        }
        let (_, commit_wait) = self.write_patience();
        let commit_by_ms = store
            .clock_ms()
            .ok()?
            .saturating_add(u64::try_from(commit_wait.as_millis()).unwrap_or(u64::MAX));
        let data = Bytes::copy_from_slice(data);
        let extents = match self.write_stripes(&[], offset, &data).await {
            Ok(extents) => extents,
            Err(e) => {
                tracing::debug!(ino, error = %e, "a leased stripe write failed; the committed path retries it");
                return None;
            }
        };
        let records: Vec<StripeRecord> = extents.iter().map(|e| e.stripe.clone().into()).collect();
        let write = LeasedChange::WriteExtents {
            ino,
            inline_version: None,
            extents: extents.clone(),
            commit_by_ms,
        };
        match self.answered(dir, write) {
            Some(Ok(answer)) => Some(Ok(answer)),
            Some(Err(e)) => {
                self.discard(&records).await;
                Some(Err(e))
            }
            // The lease did not answer it after all (its term ran out while the stripes
            // were written, too many ops wait): the stripes are written, so they are
            // committed through the group, after what the leases answered.
            None => self.commit_written(ino, extents, &records).await,
        }
    }

    /// Extents of `ino` whose stripes are written (none carries inline bytes), committed
    /// through the group once what the leases answered is (the file's create among it).
    /// `None` when the commit refused them in a way a new write mends (inline bytes
    /// appeared, a stripe was given up): the committed path writes the data again.
    async fn commit_written(
        &self,
        ino: Ino,
        extents: Vec<NewExtent>,
        records: &[StripeRecord],
    ) -> Option<Result<FsResponse, FsError>> {
        if let Err(e) = self.leases.flush().await {
            self.discard(records).await;
            return Some(Err(e));
        }
        let (_, commit_wait) = self.write_patience();
        let proposal = Proposal {
            id: None,
            now: Timestamp::now(),
            command: Command::WriteExtents {
                ino,
                inline_version: None,
                extents,
            },
        };
        let outcome = self
            .group
            .propose_within(vec![proposal], commit_wait)
            .await
            .and_then(data_outcome);
        match outcome {
            Ok((Outcome::Attr(a), _)) => Some(Ok(FsResponse::Attr(a.into()))),
            Ok((Outcome::Failed(e), _)) => {
                self.discard(records).await;
                Some(Err(e.into()))
            }
            Ok(_) => {
                self.discard(records).await;
                None
            }
            // Not known whether it committed: the shards are left to the orphan GC.
            Err(e) => Some(Err(e.into())),
        }
    }

    /// Deletes stripes that were written but will never be committed.
    async fn discard(&self, records: &[StripeRecord]) {
        for r in records {
            if let Err(e) = self.stripes.delete(r).await {
                warn!(stripe = %r.id, error = %e, "could not delete an uncommitted stripe; the orphan collector will");
            }
        }
    }
}
