//! A node's directory leases with its metadata group: [`LeaseHolder`]'s answers, taken,
//! committed and given back through the group. What the mount's requests will call (not
//! wired to them yet: the simulator drives it, `tests/sim/tests/leases.rs`).
//!
//! Every round with the group goes through [`Group::propose`], which answers once this
//! node's replica has applied the entry, as [`LeaseHolder`] requires; each successful
//! round renews the holder's term from when it began. One flush at a time sends the
//! sealed batches in order, each only after the one before it is committed.

use std::sync::{Arc, Mutex, MutexGuard};

use shoal_agent_api::{FsError, Ino};
use shoal_namespace::format::Timestamp;
use shoal_namespace::{Command, LeasedChange, Outcome, Proposal};
use shoal_placement::NodeId;
use tokio::time::Instant;

use super::lease_holder::{LeaseHolder, LostOp};
use crate::consensus::Group;

/// Inode numbers taken at a time, and how few left make the holder take more.
const INO_BATCH: u64 = 1024;
const INO_LOW: u64 = 64;

pub struct Leases {
    group: Arc<Group>,
    holder: Mutex<LeaseHolder>,
    /// Held by a flush: batches are sent one after another, in order.
    flushing: tokio::sync::Mutex<()>,
}

impl Leases {
    /// `session` names this holder's batches in the request-id table: it must not repeat
    /// across the agent's starts (a repeat would be answered with an earlier start's
    /// outcomes), so it is drawn at random at each start.
    pub fn new(group: Arc<Group>, node: NodeId, session: u64) -> Leases {
        Leases {
            group,
            holder: Mutex::new(LeaseHolder::new(node, session)),
            flushing: tokio::sync::Mutex::new(()),
        }
    }

    fn holder(&self) -> MutexGuard<'_, LeaseHolder> {
        self.holder.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One round with the group; renews the term from its start when it succeeds.
    async fn round(&self, command: Command) -> Result<Outcome, FsError> {
        let began = Instant::now();
        let outcome = self
            .group
            .propose_one(Proposal {
                id: None,
                now: Timestamp::now(),
                command,
            })
            .await?;
        self.holder().renewed(began);
        Ok(outcome)
    }

    /// Takes the lease on `dir` (and inode numbers when few are left). `Ok(None)` when
    /// another node holds it; the epoch otherwise (the one held already, if so).
    pub async fn take(&self, dir: Ino) -> Result<Option<u64>, FsError> {
        let take = {
            let holder = self.holder();
            match holder.take_command(dir) {
                Some(take) => take,
                None => return Ok(holder.epoch(dir)),
            }
        };
        let began = Instant::now();
        let epoch = match self.round(take).await? {
            Outcome::DirLease { epoch } => epoch,
            Outcome::Leased { .. } => return Ok(None),
            Outcome::Failed(e) => return Err(e.into()),
            other => return Err(FsError::Io(format!("a lease was answered {other:?}"))),
        };
        self.holder().granted(dir, epoch, began);
        if self.holder().inos_left() < INO_LOW {
            let take = self.holder().inos_command(INO_BATCH);
            match self.round(take).await? {
                Outcome::Inos { start, end } => self.holder().add_inos(start, end),
                other => return Err(FsError::Io(format!("inode numbers answered {other:?}"))),
            }
        }
        Ok(Some(epoch))
    }

    /// Answers `change` in leased directory `dir` at once (see [`LeaseHolder::answer`]):
    /// `Err(FsError::Unavailable)` when it cannot be answered from a lease now.
    pub fn answer(&self, dir: Ino, change: LeasedChange) -> Result<Outcome, FsError> {
        let store = self.group.store();
        self.holder()
            .answer(store, dir, change, Timestamp::now(), Instant::now())
            .map_err(FsError::from)
    }

    /// The entry `name` of `dir` as the pending changes left it (`Some(None)`: removed);
    /// `None` when the replica answers.
    pub fn entry(&self, dir: Ino, name: &str) -> Option<Option<Ino>> {
        self.holder().entry(dir, name)
    }

    /// Whether changes wait to be committed.
    pub fn pending(&self) -> bool {
        self.holder().pending()
    }

    /// The epoch of the lease held on `dir`.
    pub fn epoch(&self, dir: Ino) -> Option<u64> {
        self.holder().epoch(dir)
    }

    /// Commits every change answered so far, in order. A batch whose outcome is unknown
    /// (no leader in time) stays first and is sent again, with its request id, by the
    /// next flush.
    pub async fn flush(&self) -> Result<(), FsError> {
        let _one = self.flushing.lock().await;
        self.holder().seal();
        loop {
            let Some(batch) = self.holder().next_to_commit().cloned() else {
                return Ok(());
            };
            let began = Instant::now();
            let outcome = self.group.propose_one(batch).await?;
            let mut holder = self.holder();
            holder.renewed(began);
            holder
                .committed(self.group.store(), &outcome)
                .map_err(FsError::from)?;
        }
    }

    /// Commits what was answered, then returns the lease on `dir` (a recall). The lease
    /// is forgotten even if the return fails (it may have been broken meanwhile).
    pub async fn give_back(&self, dir: Ino) -> Result<(), FsError> {
        self.flush().await?;
        let Some(epoch) = self.holder().epoch(dir) else {
            return Ok(());
        };
        self.holder().forget(dir);
        self.round(Command::ReturnDirLease { dir, epoch }).await?;
        Ok(())
    }

    /// Answered changes whose commit did not go as answered, since the last call.
    pub fn take_failures(&self) -> Vec<LostOp> {
        self.holder().take_failures()
    }
}
