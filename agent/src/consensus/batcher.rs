//! The `batcher` worker: on the leader, everything that queued while earlier entries were
//! in flight goes out as one log entry (Raft costs one flush per entry, not per proposal),
//! up to [`MAX_BATCH`] proposals and [`MAX_BATCH_BYTES`]. Each entry carries this
//! process's [`LeaderStamp`], which drives the cluster clock.

use std::sync::Arc;
use tokio::time::Instant;

use openraft::error::ClientWriteError;
use shoal_namespace::{Batch, LeaderStamp, Proposal};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio::task::JoinSet;
use tracing::debug;

use super::ConsensusError;
use super::metrics::MetaMetrics;
use super::net::{Committed, ForwardRefused};
use super::types::Raft;
use crate::worker::{Step, Worker};

/// Most proposals in one log entry.
pub(super) const MAX_BATCH: usize = 1024;
/// Most encoded bytes of proposals in one log entry (a proposal alone may be larger).
/// Replication sends entries in messages that must arrive within a heartbeat (see
/// `net::append_budget`), so entries stay small enough for two to fit one.
pub(super) const MAX_BATCH_BYTES: usize = 1 << 20;
/// Log entries proposed but not yet applied, at most. While all are in flight, new
/// proposals queue and go out together in the next entry.
const IN_FLIGHT_ENTRIES: usize = 2;

/// Proposals waiting for the batcher, with where their outcomes go.
pub(super) struct Pending {
    pub proposals: Vec<Proposal>,
    /// Encoded size of `proposals`.
    pub bytes: usize,
    pub reply: oneshot::Sender<Result<Committed, ForwardRefused>>,
}

/// Encoded size of a value, without encoding it into memory.
pub(super) fn encoded_len<T: serde::Serialize>(value: &T) -> usize {
    postcard::serialize_with_flavor(value, postcard::ser_flavors::Size::default()).unwrap_or(0)
}

pub struct Batcher {
    raft: Raft,
    queue: mpsc::Receiver<Pending>,
    metrics: MetaMetrics,
    slots: Arc<Semaphore>,
    /// Drawn once per process: stamps of one run are comparable.
    run: u64,
    origin: Instant,
    /// The proposal that arrived while waiting, or did not fit the last entry.
    carried: Option<Pending>,
    /// Entries in flight, waiting for their commit to answer their proposers.
    answering: JoinSet<()>,
}

impl Batcher {
    pub(super) fn new(raft: Raft, queue: mpsc::Receiver<Pending>, metrics: MetaMetrics) -> Self {
        Batcher {
            raft,
            queue,
            metrics,
            slots: Arc::new(Semaphore::new(IN_FLIGHT_ENTRIES)),
            run: crate::sim_thread::random_u64(),
            origin: Instant::now(),
            carried: None,
            answering: JoinSet::new(),
        }
    }

    /// Everything queued now, up to the entry's limits, starting with `first`.
    fn gather(&mut self, first: Pending) -> Vec<Pending> {
        let (mut count, mut bytes) = (first.proposals.len(), first.bytes);
        let mut group = vec![first];
        while count < MAX_BATCH {
            match self.queue.try_recv() {
                Ok(p) if bytes + p.bytes > MAX_BATCH_BYTES => {
                    self.carried = Some(p);
                    break;
                }
                Ok(p) => {
                    count += p.proposals.len();
                    bytes += p.bytes;
                    group.push(p);
                }
                Err(_) => break,
            }
        }
        group
    }
}

impl Worker for Batcher {
    type Error = ConsensusError;

    fn name(&self) -> &'static str {
        "batcher"
    }

    async fn work(&mut self) -> Result<Step, ConsensusError> {
        while self.answering.try_join_next().is_some() {}
        let Some(first) = self.carried.take() else {
            return Ok(Step::Idle);
        };
        let Ok(permit) = self.slots.clone().acquire_owned().await else {
            return Ok(Step::Done);
        };
        let group = self.gather(first);
        let count: usize = group.iter().map(|p| p.proposals.len()).sum();
        let mut proposals = Vec::with_capacity(count);
        let mut waiters = Vec::with_capacity(group.len());
        for p in group {
            waiters.push((p.proposals.len(), p.reply));
            proposals.extend(p.proposals);
        }
        self.metrics.entries.inc();
        self.metrics.proposals.inc_by(proposals.len() as u64);
        let stamp = LeaderStamp {
            run: self.run,
            millis: u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX),
        };
        let batch = Batch {
            proposals,
            stamp: Some(stamp),
        };
        let proposed = Instant::now();
        let term = self.raft.metrics().borrow().current_term;
        let receiver = self.raft.client_write_ff(batch).await;
        let deposed = deposed(self.raft.clone(), term);
        self.answering.spawn(answer(
            receiver,
            waiters,
            Slot {
                permit,
                proposed,
                count,
            },
            deposed,
        ));
        Ok(if self.carried.is_some() {
            Step::Busy
        } else {
            Step::Idle
        })
    }

    async fn wait_for_work(&mut self) {
        if self.carried.is_none() {
            self.carried = self.queue.recv().await;
            if self.carried.is_none() {
                // Every sender is gone: the group is shutting down.
                std::future::pending::<()>().await;
            }
        }
    }
}

type Receiver = Result<
    oneshot::Receiver<
        Result<
            openraft::raft::ClientWriteResponse<super::types::MetaRaft>,
            ClientWriteError<u64, openraft::BasicNode>,
        >,
    >,
    openraft::error::Fatal<u64>,
>;

/// An entry in flight: its slot, when it was proposed, and how many proposals it carries.
struct Slot {
    permit: OwnedSemaphorePermit,
    proposed: Instant,
    count: usize,
}

/// Resolves once this member no longer leads in `term`.
async fn deposed(raft: Raft, term: u64) {
    let mut metrics = raft.metrics();
    let moved_on = metrics
        .wait_for(|m| m.current_term != term || m.current_leader != Some(m.id))
        .await
        .is_ok();
    if !moved_on {
        // Raft stopped: its responders are dropped, which answers the entry.
        std::future::pending::<()>().await;
    }
}

/// Waits for an entry's commit and hands each proposer its outcomes; frees its slot.
///
/// openraft answers an entry when it is applied, or when a new leader's log cuts it
/// off; but an entry a snapshot replaced (a deposed leader that fell behind) is never
/// answered. Its slot would be held for good, and with every slot held this member
/// proposes nothing when it leads again. So once this member no longer leads in the
/// entry's term, its proposers hear "not leader" (they send again through the leader;
/// proposals with a request id are applied once), and the slot is free. (The simulator,
/// seed 10045: a deposed leader's two slots stayed held.)
async fn answer(
    receiver: Receiver,
    waiters: Vec<(usize, oneshot::Sender<Result<Committed, ForwardRefused>>)>,
    slot: Slot,
    deposed: impl Future<Output = ()>,
) {
    let Slot {
        permit,
        proposed,
        count,
    } = slot;
    let result: Result<Committed, ForwardRefused> = match receiver {
        Err(fatal) => Err(ForwardRefused::Unavailable(fatal.to_string())),
        Ok(rx) => match tokio::select! {
            biased;
            answered = rx => Some(answered),
            () = deposed => None,
        } {
            None => Err(ForwardRefused::NotLeader(None)),
            Some(Err(_)) => Err(ForwardRefused::Unavailable("proposal dropped".into())),
            Some(Ok(Ok(resp))) => Ok((resp.data, resp.log_id.index)),
            Some(Ok(Err(ClientWriteError::ForwardToLeader(f)))) => {
                Err(ForwardRefused::NotLeader(f.leader_id))
            }
            Some(Ok(Err(e))) => Err(ForwardRefused::Unavailable(e.to_string())),
        },
    };
    drop(permit);
    debug!(
        elapsed_us = proposed.elapsed().as_micros() as u64,
        proposals = count,
        "entry committed"
    );
    match result {
        Ok((mut outcomes, index)) => {
            for (n, reply) in waiters {
                let rest = outcomes.split_off(n.min(outcomes.len()));
                let _ = reply.send(Ok((std::mem::replace(&mut outcomes, rest), index)));
            }
        }
        Err(e) => {
            for (_, reply) in waiters {
                let _ = reply.send(Err(e.clone()));
            }
        }
    }
}
