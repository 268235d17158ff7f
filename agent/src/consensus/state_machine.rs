//! openraft's state machine over [`NamespaceStore`]: applies committed batches, builds and
//! installs snapshots. The last snapshot is kept in a file beside the store so that
//! `get_current_snapshot` returns exactly what was built or installed.
//!
//! The applied log id and membership are stored in the same transaction as the commands
//! they cover; each apply starts from the marker the process last wrote (kept in memory).
//! Applies are made durable every 64th apply call ([`UNFLUSHED_APPLIES`]; one call may
//! cover several entries), after each snapshot export, and at a clean stop; a crash
//! replays the rest from the log. Up to 16 proposals of an unflushed apply run on the state
//! machine's task; a flush or a longer batch runs on the blocking pool.
//!
//! A snapshot is a `NamespaceStore::snapshot()` export: one read transaction whose applied
//! marker (the snapshot's `last_log_id`) is exactly what the exported rows reflect, since
//! openraft builds snapshots while applies go on. The export is made durable before the
//! log behind it may go and kept in `meta/snapshot.bin`, replaced durably (temporary file,
//! fsync, rename, directory fsync); the log is then compacted up to it, keeping
//! `min(1000, snapshot_every)` entries. `Request::MetaDigest` reads a replica's applied
//! index and a crc32c of its state in one transaction (tests compare replicas with it).

// The error type is openraft's (the trait methods return it); helpers return the same.
#![allow(clippy::result_large_err)]

use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use openraft::storage::RaftStateMachine;
use openraft::{
    EntryPayload, ErrorSubject, ErrorVerb, LogId, RaftSnapshotBuilder, Snapshot, SnapshotMeta,
};
use serde::{Deserialize, Serialize};
use shoal_namespace::{Batch, NamespaceStore, Outcome, Touched, snapshot_marker};

use shoal_disk::Disk;

use super::append_sync::AppendSync;
use super::changes::ChangeFeed;
use super::types::{AppliedMarker, Entry, Membership, MetaRaft, StorageError, storage_error};

const SNAPSHOT_FILE: &str = "snapshot.bin";
const MARKER_VERSION: u8 = 1;

/// Applies between two durable state-machine commits, at most. The log (always durable)
/// replays whatever a crash loses; a snapshot (after which the log is compacted) is only
/// built from a durable state.
const UNFLUSHED_APPLIES: u32 = 64;

/// Most proposals an unsynced apply commits on the state machine's task (more go to the
/// blocking pool).
const INLINE_PROPOSALS: usize = 16;

/// The state machine; cheap to clone.
#[derive(Clone)]
pub struct StateMachine {
    store: Arc<NamespaceStore>,
    /// Where `snapshot.bin` is kept (the disk seam: the simulator's disk in tests).
    disk: Arc<dyn Disk>,
    dir: PathBuf,
    /// Applies since the last durable commit.
    unflushed: Arc<std::sync::atomic::AtomicU32>,
    /// Where what each apply changed is published.
    changes: Arc<ChangeFeed>,
    /// The applied marker this process last wrote (`None`: read it from the store). Each
    /// apply starts from it: reading it back was a read transaction and a decode per apply
    /// on every member.
    marker: Arc<std::sync::Mutex<Option<AppliedMarker>>>,
    /// Told the membership of an installed snapshot (it decides which log appends are
    /// synced).
    append_sync: Arc<AppendSync>,
    /// Runs right after a snapshot's export (tests: applies in the build's window).
    #[cfg(test)]
    after_export: Option<Arc<dyn Fn() + Send + Sync>>,
}

#[derive(Serialize, Deserialize)]
struct SnapshotFile {
    version: u8,
    meta: SnapshotMeta<u64, openraft::BasicNode>,
    #[serde(with = "serde_bytes")]
    data: Vec<u8>,
}

fn sm_err(verb: ErrorVerb, e: impl std::fmt::Display) -> StorageError {
    storage_error(ErrorSubject::StateMachine, verb, e)
}

fn snap_err(verb: ErrorVerb, e: impl std::fmt::Display) -> StorageError {
    storage_error(ErrorSubject::Snapshot(None), verb, e)
}

impl StateMachine {
    /// The state machine over `store`; tells `append_sync` the membership it holds.
    pub fn new(
        store: Arc<NamespaceStore>,
        disk: Arc<dyn Disk>,
        dir: &Path,
        changes: Arc<ChangeFeed>,
        append_sync: Arc<AppendSync>,
    ) -> StateMachine {
        let sm = StateMachine {
            store,
            disk,
            dir: dir.to_owned(),
            unflushed: Arc::default(),
            changes,
            marker: Arc::default(),
            append_sync,
            #[cfg(test)]
            after_export: None,
        };
        match sm.marker() {
            Ok(m) => sm.append_sync.applied(&m.membership),
            // Unknown: every log append is synced.
            Err(e) => tracing::warn!(error = %e, "could not read the applied membership"),
        }
        sm
    }

    fn marker(&self) -> Result<AppliedMarker, StorageError> {
        if let Some(m) = self.cached_marker().clone() {
            return Ok(m);
        }
        match self
            .store
            .applied()
            .map_err(|e| sm_err(ErrorVerb::Read, e))?
        {
            Some(bytes) => postcard::from_bytes(&bytes).map_err(|e| sm_err(ErrorVerb::Read, e)),
            None => Ok(AppliedMarker::default()),
        }
    }

    fn cached_marker(&self) -> std::sync::MutexGuard<'_, Option<AppliedMarker>> {
        self.marker.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn encode_marker(
        last: Option<LogId<u64>>,
        membership: &Membership,
    ) -> Result<Vec<u8>, StorageError> {
        postcard::to_allocvec(&AppliedMarker {
            version: MARKER_VERSION,
            last_applied: last,
            membership: membership.clone(),
        })
        .map_err(|e| sm_err(ErrorVerb::Write, e))
    }

    fn save_snapshot_file(&self, file: &SnapshotFile) -> Result<(), StorageError> {
        let bytes = postcard::to_allocvec(file).map_err(|e| snap_err(ErrorVerb::Write, e))?;
        shoal_disk::replace_file(&*self.disk, &self.dir.join(SNAPSHOT_FILE), &bytes)
            .map_err(|e| snap_err(ErrorVerb::Write, e))
    }

    fn build(&self) -> Result<Snapshot<MetaRaft>, StorageError> {
        // openraft builds snapshots while applies go on: the marker must come from the
        // export's own read transaction, never from a later read (which would claim
        // entries the export does not hold).
        let data = self
            .store
            .snapshot()
            .map_err(|e| snap_err(ErrorVerb::Read, e))?;
        #[cfg(test)]
        if let Some(hook) = &self.after_export {
            hook();
        }
        // The log up to this snapshot may be discarded next: what it covers must be on
        // disk. A durable commit makes every earlier commit durable, the exported ones too.
        self.store
            .persist()
            .map_err(|e| snap_err(ErrorVerb::Write, e))?;
        self.unflushed
            .store(0, std::sync::atomic::Ordering::Relaxed);
        let marker = match snapshot_marker(&data).map_err(|e| snap_err(ErrorVerb::Read, e))? {
            Some(bytes) => postcard::from_bytes::<AppliedMarker>(&bytes)
                .map_err(|e| snap_err(ErrorVerb::Read, e))?,
            None => AppliedMarker::default(),
        };
        let meta = SnapshotMeta {
            last_log_id: marker.last_applied,
            last_membership: marker.membership.clone(),
            snapshot_id: format!(
                "{}-{}",
                marker.last_applied.map_or(0, |l| l.index),
                crate::sim_thread::random_u64() as u32
            ),
        };
        let file = SnapshotFile {
            version: MARKER_VERSION,
            meta: meta.clone(),
            data,
        };
        self.save_snapshot_file(&file)?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(file.data)),
        })
    }
}

impl RaftSnapshotBuilder<MetaRaft> for StateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<MetaRaft>, StorageError> {
        let this = self.clone();
        crate::sim_thread::blocking(move || this.build())
            .await
            .map_err(|e| snap_err(ErrorVerb::Write, e))?
    }
}

impl RaftStateMachine<MetaRaft> for StateMachine {
    type SnapshotBuilder = StateMachine;

    async fn applied_state(&mut self) -> Result<(Option<LogId<u64>>, Membership), StorageError> {
        let m = self.marker()?;
        Ok((m.last_applied, m.membership))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Vec<Outcome>>, StorageError>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let mut marker = self.marker()?;
        let mut batches: Vec<Batch> = Vec::new();
        // Per entry: Some(i) = the i-th batch's outcomes answer it; None = empty answer.
        let mut slots = Vec::new();
        for entry in entries {
            marker.last_applied = Some(entry.log_id);
            match entry.payload {
                EntryPayload::Blank => slots.push(None),
                EntryPayload::Normal(batch) => {
                    slots.push(Some(batches.len()));
                    batches.push(batch);
                }
                EntryPayload::Membership(m) => {
                    marker.membership = Membership::new(Some(entry.log_id), m);
                    slots.push(None);
                }
            }
        }
        if slots.is_empty() {
            return Ok(Vec::new());
        }
        let bytes = Self::encode_marker(marker.last_applied, &marker.membership)?;
        // Read from the store again if this apply fails.
        *self.cached_marker() = None;
        let store = self.store.clone();
        let started = std::time::Instant::now();
        let flush = self
            .unflushed
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1
            >= UNFLUSHED_APPLIES;
        if flush {
            self.unflushed
                .store(0, std::sync::atomic::Ordering::Relaxed);
        }
        let proposals: usize = batches.iter().map(|b| b.proposals.len()).sum();
        let work = move || {
            let outcomes = if flush {
                store.apply(&batches, &bytes)
            } else {
                store.apply_unflushed(&batches, &bytes)
            }?;
            let mut touched = Touched::default();
            for (batch, outcomes) in batches.iter().zip(&outcomes) {
                for (p, o) in batch.proposals.iter().zip(outcomes) {
                    touched.add(p, o);
                }
            }
            Ok::<_, shoal_namespace::NamespaceError>((outcomes, touched))
        };
        // A commit without sync of a few proposals costs microseconds, less than handing it
        // to the blocking pool and back; a synced one, or a long batch, goes there.
        let done = if !flush && proposals <= INLINE_PROPOSALS {
            work()
        } else {
            crate::sim_thread::blocking(work)
                .await
                .map_err(|e| sm_err(ErrorVerb::Write, e))?
        };
        let (mut outcomes, touched) = done.map_err(|e| sm_err(ErrorVerb::Write, e))?;
        *self.cached_marker() = Some(marker);
        // Published before the apply returns: whoever sees this index applied finds its
        // changes in the feed.
        self.changes.publish(&touched);
        tracing::debug!(
            elapsed_us = started.elapsed().as_micros() as u64,
            "state machine apply"
        );
        Ok(slots
            .into_iter()
            .map(|slot| {
                slot.map(|i| std::mem::take(&mut outcomes[i]))
                    .unwrap_or_default()
            })
            .collect())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<u64, openraft::BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let data = snapshot.into_inner();
        // The install replaces the marker: the next apply reads it from the store.
        *self.cached_marker() = None;
        let this = self.clone();
        let meta = meta.clone();
        crate::sim_thread::blocking(move || {
            this.store
                .install(&data)
                .map_err(|e| snap_err(ErrorVerb::Write, e))?;
            // The export carries the sender's marker; the snapshot meta is authoritative.
            let marker = Self::encode_marker(meta.last_log_id, &meta.last_membership)?;
            this.store
                .apply(&[], &marker)
                .map_err(|e| snap_err(ErrorVerb::Write, e))?;
            this.append_sync.applied(&meta.last_membership);
            let index = meta.last_log_id.map_or(0, |l| l.index);
            this.save_snapshot_file(&SnapshotFile {
                version: MARKER_VERSION,
                meta,
                data,
            })?;
            this.changes.publish_reset();
            tracing::info!(index, "installed a metadata snapshot from the leader");
            Ok(())
        })
        .await
        .map_err(|e| snap_err(ErrorVerb::Write, e))?
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<MetaRaft>>, StorageError> {
        let path = self.dir.join(SNAPSHOT_FILE);
        let bytes = match self.disk.open(&path, false).and_then(|f| f.read_all()) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(snap_err(ErrorVerb::Read, e)),
        };
        let file: SnapshotFile =
            postcard::from_bytes(&bytes).map_err(|e| snap_err(ErrorVerb::Read, e))?;
        if file.version != MARKER_VERSION {
            return Err(snap_err(
                ErrorVerb::Read,
                format!("unknown snapshot file version {}", file.version),
            ));
        }
        Ok(Some(Snapshot {
            meta: file.meta,
            snapshot: Box::new(Cursor::new(file.data)),
        }))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use openraft::storage::RaftStateMachine;
    use openraft::{CommittedLeaderId, EntryPayload, LogId, RaftSnapshotBuilder};
    use shoal_agent_api::ROOT_INO;
    use shoal_namespace::format::{FileKind, Owner, Timestamp};
    use shoal_namespace::{Batch, Command, NamespaceStore, Proposal};

    use super::StateMachine;
    use crate::consensus::types::Entry;

    fn entry(index: u64) -> Entry {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(Batch::new(vec![Proposal {
                id: None,
                now: Timestamp {
                    secs: 1_000 + index as i64,
                    nanos: 0,
                },
                command: Command::MkNode {
                    parent: ROOT_INO,
                    name: format!("f{index}"),
                    kind: FileKind::File,
                    perm: 0o644,
                    owner: Owner { uid: 0, gid: 0 },
                    rdev: 0,
                    target: None,
                },
            }])),
        }
    }

    fn machine(dir: &std::path::Path) -> (Arc<NamespaceStore>, StateMachine) {
        let store = Arc::new(NamespaceStore::open(&dir.join("state.redb")).expect("open"));
        let sm = StateMachine::new(
            store.clone(),
            Arc::new(shoal_disk::OsDisk),
            dir,
            Arc::default(),
            Arc::new(super::super::append_sync::AppendSync::new(1)),
        );
        (store, sm)
    }

    /// openraft builds a snapshot in a task of its own while entries keep being applied.
    /// Entries applied between the export and the end of the build must not be claimed by
    /// the snapshot: a learner that installs it applies them from the log afterwards and
    /// ends up with the leader's state.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_snapshot_built_while_applies_run_claims_only_what_it_holds() {
        let leader_dir = tempfile::tempdir().expect("tmp");
        let (leader, mut sm) = machine(leader_dir.path());
        sm.apply((1..=10).map(entry)).await.expect("apply");
        let applier = sm.clone();
        sm.after_export = Some(Arc::new(move || {
            let mut applier = applier.clone();
            tokio::runtime::Handle::current()
                .block_on(applier.apply((11..=20).map(entry)))
                .expect("apply during the build");
        }));
        let snapshot = sm.build_snapshot().await.expect("build");
        assert_eq!(
            snapshot.meta.last_log_id.map(|l| l.index),
            Some(10),
            "the snapshot claims what its export holds"
        );
        let learner_dir = tempfile::tempdir().expect("tmp");
        let (learner, mut lsm) = machine(learner_dir.path());
        lsm.install_snapshot(&snapshot.meta, snapshot.snapshot)
            .await
            .expect("install");
        let (applied, _) = lsm.applied_state().await.expect("applied");
        let next = applied.map_or(1, |l| l.index + 1);
        lsm.apply((next..=20).map(entry)).await.expect("catch up");
        let (leader_marker, leader_digest) = leader.digest().expect("digest");
        let (learner_marker, learner_digest) = learner.digest().expect("digest");
        assert_eq!(learner_marker, leader_marker);
        assert_eq!(
            learner_digest, leader_digest,
            "the learner's state is the leader's"
        );
        assert_eq!(learner.stats().expect("stats").inodes, 21);
    }
}
