//! The Raft log, vote and commit index, kept in [`Wal`] segment files in `meta/log/`.
//!
//! Every call that openraft needs durable is synced before it returns (and before the
//! flush callback of `append` fires), as openraft's contract requires. The commit index is
//! the exception: openraft does not need it durable (a restarted member learns it from the
//! leader again), so it is written without a sync and becomes durable with the next synced
//! record. The other exception is a learner's appends: [`AppendSync`] says which it syncs.
//! Work that waits for the disk (a sync) or takes long (a read of more than
//! `INLINE_ENTRIES`, 4) runs on the blocking pool; an unsynced append of at most
//! `INLINE_BYTES` (64 KiB), or a read of up to 4 (the leader reads each entry it appended
//! once per follower), runs on the calling task: a `pwrite` or a read from the page cache,
//! less than the two thread switches of a hand-over (never a write that starts a new
//! segment: that syncs). Measurement: 148 → 108 context switches per create on the 6-node
//! dev cluster (with the redb log of then). A log an earlier release kept in
//! `meta/log.redb` is moved into the segments at the first start (`log_import.rs`).

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::Arc;

use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{ErrorSubject, ErrorVerb, LogId, LogState, RaftLogReader, Vote};
use serde::Serialize;
use serde::de::DeserializeOwned;

use shoal_disk::{Disk, OsDisk};

use super::append_sync::AppendSync;
use super::ballast::Ballast;
use super::metrics::LogCounters;
use super::types::{Entry, MetaRaft, StorageError, storage_error};
use super::wal::{Key, Wal};
/// Version byte in front of every value this file stores. Version 2: log entries carry
/// the leader's stamp in their batch; version 1 values (no stamp) are still read.
const FORMAT: u8 = 2;
const FORMAT_V1: u8 = 1;

/// Most entries a read makes on the calling task (more go to the blocking pool).
const INLINE_ENTRIES: u64 = 4;
/// Most bytes of entries an unsynced append commits on the calling task.
const INLINE_BYTES: usize = 64 << 10;

/// Where a write of `bytes` runs (pure): on the calling task (the Raft core's) only when it
/// waits for no disk: unsynced, small, and not starting a new segment (a roll syncs the
/// old segment, writes and syncs the new one's head, and syncs the directory).
fn write_place(synced: bool, bytes: usize, rolls: bool) -> Where {
    if !synced && bytes <= INLINE_BYTES && !rolls {
        Where::Here
    } else {
        Where::Blocking
    }
}

/// Where a piece of log work runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Where {
    /// On the calling task: short, and never waits for the disk.
    Here,
    /// On tokio's blocking pool.
    Blocking,
}

/// The log store; cheap to clone (one shared log).
#[derive(Clone)]
pub struct LogStore {
    wal: Arc<Wal>,
    /// Space the log can always write (given up before a write on a nearly full disk).
    ballast: Arc<Ballast>,
    /// Which appends are synced before they are acknowledged.
    sync: Arc<AppendSync>,
    /// Appends and syncs, for the metrics.
    counters: LogCounters,
}

pub(crate) fn encode<T: Serialize>(v: &T) -> Result<Vec<u8>, String> {
    let mut out = vec![FORMAT];
    out.extend(postcard::to_allocvec(v).map_err(|e| e.to_string())?);
    Ok(out)
}

/// Decodes a value of a type whose encoding did not change between versions 1 and 2
/// (vote, commit index, purge point).
pub(crate) fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    match bytes.split_first() {
        Some((&(FORMAT | FORMAT_V1), body)) => {
            postcard::from_bytes(body).map_err(|e| e.to_string())
        }
        Some((v, _)) => Err(format!("unknown log record version {v}")),
        None => Err("empty log record".into()),
    }
}

/// Decodes a log entry of either version.
pub(crate) fn decode_entry(bytes: &[u8]) -> Result<Entry, String> {
    match bytes.split_first() {
        Some((&FORMAT, body)) => postcard::from_bytes(body).map_err(|e| e.to_string()),
        Some((&FORMAT_V1, body)) => postcard::from_bytes::<v1::Entry>(body)
            .map(v1::Entry::upgrade)
            .map_err(|e| e.to_string()),
        Some((v, _)) => Err(format!("unknown log record version {v}")),
        None => Err("empty log record".into()),
    }
}

/// The log entry as version 1 stored it: openraft's `Entry` shape (log id, then the
/// payload enum) around a batch that was a bare list of proposals.
mod v1 {
    use openraft::{BasicNode, EntryPayload, LogId};
    use serde::Deserialize;
    use shoal_namespace::{Batch, Proposal};

    #[derive(Deserialize)]
    pub(super) struct Entry {
        log_id: LogId<u64>,
        payload: Payload,
    }

    #[derive(Deserialize)]
    enum Payload {
        Blank,
        Normal(Vec<Proposal>),
        Membership(openraft::Membership<u64, BasicNode>),
    }

    impl Entry {
        pub(super) fn upgrade(self) -> super::Entry {
            super::Entry {
                log_id: self.log_id,
                payload: match self.payload {
                    Payload::Blank => EntryPayload::Blank,
                    Payload::Normal(proposals) => EntryPayload::Normal(Batch::new(proposals)),
                    Payload::Membership(m) => EntryPayload::Membership(m),
                },
            }
        }
    }
}

impl LogStore {
    /// Opens (or creates) member `me`'s log in the metadata directory `dir`. The log's
    /// membership entries tell [`AppendSync`] what this member is before Raft starts.
    pub fn open(
        dir: &Path,
        me: u64,
        ballast: Arc<Ballast>,
        counters: LogCounters,
    ) -> std::io::Result<LogStore> {
        let wal_dir = dir.join("log");
        let old = dir.join("log.redb");
        if !wal_dir.exists() && old.exists() {
            super::log_import::import(&old, &wal_dir)?;
        }
        let store = LogStore::open_on(Arc::new(OsDisk), dir, me, ballast, counters)?;
        if old.exists() {
            std::fs::remove_file(&old)?;
            crate::durable::sync_dir(dir)?;
        }
        Ok(store)
    }

    /// [`Self::open`] on `disk` (no import of an earlier release's log).
    pub fn open_on(
        disk: Arc<dyn Disk>,
        dir: &Path,
        me: u64,
        ballast: Arc<Ballast>,
        counters: LogCounters,
    ) -> std::io::Result<LogStore> {
        let wal = Wal::open(disk, &dir.join("log"))?;
        let sync = AppendSync::new(me);
        let entries = LogStore::entries(&wal, Bound::Unbounded, Bound::Unbounded)
            .map_err(std::io::Error::other)?;
        for e in &entries {
            if let openraft::EntryPayload::Membership(m) = &e.payload {
                sync.in_log(e.log_id.index, m);
            }
        }
        Ok(LogStore {
            wal: Arc::new(wal),
            ballast,
            sync: Arc::new(sync),
            counters,
        })
    }

    /// The policy that decides which appends are synced (the state machine tells it its
    /// membership).
    pub fn append_sync(&self) -> Arc<AppendSync> {
        self.sync.clone()
    }

    /// Runs `f` where `place` says.
    async fn run<T, F>(&self, place: Where, f: F) -> Result<T, String>
    where
        T: Send + 'static,
        F: FnOnce(&Wal) -> Result<T, String> + Send + 'static,
    {
        let wal = self.wal.clone();
        let work = move || f(&wal);
        match place {
            Where::Here => work(),
            Where::Blocking => crate::sim_thread::blocking(work)
                .await
                .map_err(|e| e.to_string())?,
        }
    }

    /// Runs a write where `place` says, after the ballast's check for free space.
    async fn write<F>(&self, place: Where, f: F) -> Result<(), String>
    where
        F: FnOnce(&Wal) -> std::io::Result<()> + Send + 'static,
    {
        let ballast = self.ballast.clone();
        self.run(place, move |wal| {
            ballast.before_write();
            f(wal).map_err(|e| e.to_string())
        })
        .await
    }

    fn get_state<T: DeserializeOwned>(wal: &Wal, key: Key) -> Result<Option<T>, String> {
        wal.get(key).map(|v| decode(&v)).transpose()
    }

    fn entries(wal: &Wal, start: Bound<u64>, end: Bound<u64>) -> Result<Vec<Entry>, String> {
        wal.read(start, end)
            .map_err(|e| e.to_string())?
            .iter()
            .map(|b| decode_entry(b))
            .collect()
    }
}

fn log_err(verb: ErrorVerb, e: String) -> StorageError {
    storage_error(ErrorSubject::Logs, verb, e)
}

impl RaftLogReader<MetaRaft> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        let start = range.start_bound().cloned();
        let end = range.end_bound().cloned();
        // Replication reads the entries just appended, one read per follower.
        let few = match (start, end) {
            (Bound::Included(s), Bound::Included(e)) => e.saturating_sub(s) < INLINE_ENTRIES,
            (Bound::Included(s), Bound::Excluded(e)) => e.saturating_sub(s) <= INLINE_ENTRIES,
            _ => false,
        };
        let place = if few { Where::Here } else { Where::Blocking };
        self.run(place, move |wal| LogStore::entries(wal, start, end))
            .await
            .map_err(|e| log_err(ErrorVerb::Read, e))
    }

    /// What the leader's replication sends after the entry before `start`: only the run
    /// of entries from `start` on with none missing. openraft sends what this returns as
    /// following that entry; a purge between its choice and this read leaves entries
    /// out, and sending the ones after them gave a follower a log with a hole. Nothing
    /// (when `start` itself is gone) makes openraft send a heartbeat and look again; its
    /// next look finds the log purged and sends a snapshot. (The simulator, seed 103 of
    /// `gc`: a learner restarted after a power cut took entries past a hole and openraft's
    /// apply panicked.)
    async fn limited_get_log_entries(
        &mut self,
        start: u64,
        end: u64,
    ) -> Result<Vec<Entry>, StorageError> {
        let mut entries = self.try_get_log_entries(start..end).await?;
        let run = entries
            .iter()
            .zip(start..)
            .take_while(|(e, i)| e.log_id.index == *i)
            .count();
        entries.truncate(run);
        Ok(entries)
    }
}

impl RaftLogStorage<MetaRaft> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<MetaRaft>, StorageError> {
        self.run(Where::Blocking, |wal| {
            let purged: Option<LogId<u64>> = wal.purged().map(|v| decode(&v)).transpose()?;
            let last = match wal.last().map_err(|e| e.to_string())? {
                Some(bytes) => Some(decode_entry(&bytes)?.log_id),
                None => None,
            };
            Ok(LogState {
                last_purged_log_id: purged,
                last_log_id: last.or(purged),
            })
        })
        .await
        .map_err(|e| log_err(ErrorVerb::Read, e))
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<u64>) -> Result<(), StorageError> {
        let bytes =
            encode(vote).map_err(|e| storage_error(ErrorSubject::Vote, ErrorVerb::Write, e))?;
        self.counters.syncs.inc();
        self.write(Where::Blocking, move |wal| wal.set(Key::Vote, &bytes, true))
            .await
            .map_err(|e| storage_error(ErrorSubject::Vote, ErrorVerb::Write, e))
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<u64>>, StorageError> {
        LogStore::get_state(&self.wal, Key::Vote)
            .map_err(|e| storage_error(ErrorSubject::Vote, ErrorVerb::Read, e))
    }

    /// Written without a sync (see the module doc).
    async fn save_committed(&mut self, committed: Option<LogId<u64>>) -> Result<(), StorageError> {
        let err = |e: String| storage_error(ErrorSubject::Store, ErrorVerb::Write, e);
        let bytes = encode(&committed).map_err(err)?;
        let place = write_place(false, bytes.len(), self.wal.rolls_next());
        self.write(place, move |wal| wal.set(Key::Committed, &bytes, false))
            .await
            .map_err(err)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<u64>>, StorageError> {
        LogStore::get_state::<Option<LogId<u64>>>(&self.wal, Key::Committed)
            .map(Option::flatten)
            .map_err(|e| storage_error(ErrorSubject::Store, ErrorVerb::Read, e))
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<MetaRaft>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        let synced = self.sync.before_append(&entries);
        let rows: Result<Vec<(u64, Vec<u8>)>, String> = entries
            .iter()
            .map(|e| encode(e).map(|b| (e.log_id.index, b)))
            .collect();
        let rows = rows.map_err(|e| log_err(ErrorVerb::Write, e))?;
        let bytes: usize = rows.iter().map(|(_, b)| b.len()).sum();
        let place = write_place(synced, bytes, self.wal.rolls_next());
        self.counters.appends.inc();
        if synced {
            self.counters.syncs.inc();
        } else {
            self.counters.unsynced_appends.inc();
        }
        let started = std::time::Instant::now();
        let res = self
            .write(place, move |wal| wal.append(&rows, synced))
            .await;
        tracing::debug!(
            elapsed_us = started.elapsed().as_micros() as u64,
            synced,
            "log append"
        );
        match res {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.log_io_completed(Err(std::io::Error::other(e.clone())));
                Err(log_err(ErrorVerb::Write, e))
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId<u64>) -> Result<(), StorageError> {
        self.sync.truncated(log_id.index);
        self.counters.syncs.inc();
        self.write(Where::Blocking, move |wal| wal.truncate(log_id.index))
            .await
            .map_err(|e| log_err(ErrorVerb::Delete, e))
    }

    async fn purge(&mut self, log_id: LogId<u64>) -> Result<(), StorageError> {
        let bytes = encode(&log_id).map_err(|e| log_err(ErrorVerb::Delete, e))?;
        self.counters.syncs.inc();
        self.write(Where::Blocking, move |wal| wal.purge(log_id.index, &bytes))
            .await
            .map_err(|e| log_err(ErrorVerb::Delete, e))?;
        self.sync.purged(log_id.index);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use openraft::{CommittedLeaderId, EntryPayload, LogId};
    use shoal_agent_api::ROOT_INO;
    use shoal_namespace::format::{FileKind, Owner, Timestamp};
    use shoal_namespace::{Batch, Command, LeaderStamp, Proposal};

    use super::{Entry, decode_entry, encode};

    fn proposal() -> Proposal {
        Proposal {
            id: None,
            now: Timestamp { secs: 5, nanos: 6 },
            command: Command::MkNode {
                parent: ROOT_INO,
                name: "a".into(),
                kind: FileKind::File,
                perm: 0o644,
                owner: Owner { uid: 1, gid: 2 },
                rdev: 0,
                target: None,
            },
        }
    }

    #[test]
    fn only_small_unsynced_writes_that_start_no_segment_run_on_the_core_task() {
        use super::{INLINE_BYTES, Where, write_place};
        assert_eq!(write_place(false, 300, false), Where::Here);
        assert_eq!(write_place(true, 300, false), Where::Blocking, "a sync");
        assert_eq!(write_place(false, INLINE_BYTES + 1, false), Where::Blocking);
        assert_eq!(
            write_place(false, 300, true),
            Where::Blocking,
            "a roll syncs three times and the directory once"
        );
    }

    /// Bytes as the previous version wrote them: format 1, a batch without a stamp.
    const V1_ENTRY: &[u8] = &[
        1, // format
        3, 9,  // log id: term 3, node 9
        12, // index
        1,  // EntryPayload::Normal
        1,  // one proposal
        0,  // id: None
        10, 6, // now: secs 5 (zigzag), nanos 6
        0, // Command::MkNode
        1, // parent
        1, b'a', // name
        0,    // FileKind::File
        0xa4, 0x03, // perm 0o644
        1, 2, // owner
        0, // rdev
        0, // target: None
    ];

    /// What the leader's replication reads to send: only entries that follow on from the
    /// first one asked for. A purge between openraft choosing what to send and its read
    /// left the purged entries out, and the leader sent the entries after them as if they
    /// followed the previous one: the follower took them and kept a log with a hole (the
    /// simulator, seed 103 of `gc`: openraft's apply then panicked on the hole).
    #[tokio::test]
    async fn replication_reads_never_skip_entries_a_purge_took() {
        use openraft::RaftLogReader;
        use openraft::storage::RaftLogStorage;
        use openraft::testing::log_id;
        use std::sync::Arc;

        let dir = tempfile::tempdir().expect("tempdir");
        let ballast = Arc::new(super::Ballast::open(dir.path()));
        let mut log =
            super::LogStore::open(dir.path(), 1, ballast, Default::default()).expect("open");
        let entry = |i: u64| Entry {
            log_id: log_id(1, 1, i),
            payload: EntryPayload::Blank,
        };
        let rows: Vec<(u64, Vec<u8>)> = (1..10)
            .map(|i| (i, encode(&entry(i)).expect("encode")))
            .collect();
        log.wal.append(&rows, true).expect("append");
        log.purge(log_id(1, 1, 5)).await.expect("purge");
        let ids = |got: Vec<Entry>| got.iter().map(|e| e.log_id.index).collect::<Vec<_>>();
        let from_3 = log.limited_get_log_entries(3, 10).await.expect("read");
        assert_eq!(
            ids(from_3),
            Vec::<u64>::new(),
            "nothing that does not start where the follower's log ends"
        );
        let from_6 = log.limited_get_log_entries(6, 10).await.expect("read");
        assert_eq!(ids(from_6), vec![6, 7, 8, 9]);
    }

    /// What openraft reads back at start: the vote, the commit index, the log's ends.
    #[tokio::test]
    async fn the_log_comes_back_as_it_was_left() {
        use openraft::storage::RaftLogStorage;
        use openraft::testing::log_id;
        use openraft::{RaftLogReader, Vote};
        use std::sync::Arc;

        let dir = tempfile::tempdir().expect("tempdir");
        let ballast = || Arc::new(super::Ballast::open(dir.path()));
        let committed = LogId::new(CommittedLeaderId::new(1, 1), 4);
        let entry = |i: u64| Entry {
            log_id: log_id(1, 1, i),
            payload: EntryPayload::Blank,
        };
        {
            let mut log =
                super::LogStore::open(dir.path(), 1, ballast(), Default::default()).expect("open");
            log.save_vote(&Vote::new(1, 1)).await.expect("vote");
            let rows: Vec<(u64, Vec<u8>)> = (1..8)
                .map(|i| (i, encode(&entry(i)).expect("encode")))
                .collect();
            log.wal.append(&rows, true).expect("append");
            log.purge(log_id(1, 1, 2)).await.expect("purge");
            log.truncate(log_id(1, 1, 6)).await.expect("truncate");
            log.save_committed(Some(committed)).await.expect("save");
        }
        let mut log =
            super::LogStore::open(dir.path(), 1, ballast(), Default::default()).expect("reopen");
        assert_eq!(log.read_committed().await.expect("read"), Some(committed));
        assert_eq!(log.read_vote().await.expect("vote"), Some(Vote::new(1, 1)));
        let state = log.get_log_state().await.expect("state");
        assert_eq!(state.last_purged_log_id, Some(log_id(1, 1, 2)));
        assert_eq!(state.last_log_id, Some(log_id(1, 1, 5)));
        let got = log.try_get_log_entries(0..10).await.expect("read");
        let ids: Vec<u64> = got.iter().map(|e| e.log_id.index).collect();
        assert_eq!(ids, vec![3, 4, 5]);
    }

    /// Purged to its last entry, the log is empty and its last log id is the purge point,
    /// before and after a restart.
    #[tokio::test]
    async fn a_log_purged_to_its_end_reports_the_purge_point_as_its_last() {
        use openraft::storage::RaftLogStorage;
        use openraft::testing::log_id;
        use std::sync::Arc;

        let dir = tempfile::tempdir().expect("tempdir");
        let ballast = || Arc::new(super::Ballast::open(dir.path()));
        let rows: Vec<(u64, Vec<u8>)> = (1..4)
            .map(|i| {
                let e = Entry {
                    log_id: log_id(2, 1, i),
                    payload: EntryPayload::Blank,
                };
                (i, encode(&e).expect("encode"))
            })
            .collect();
        for round in 0..2 {
            let mut log =
                super::LogStore::open(dir.path(), 1, ballast(), Default::default()).expect("open");
            if round == 0 {
                log.wal.append(&rows, true).expect("append");
                log.purge(log_id(2, 1, 3)).await.expect("purge");
            }
            let state = log.get_log_state().await.expect("state");
            assert_eq!(
                state.last_purged_log_id,
                Some(log_id(2, 1, 3)),
                "round {round}"
            );
            assert_eq!(state.last_log_id, Some(log_id(2, 1, 3)), "round {round}");
        }
    }

    #[test]
    fn version_1_entries_still_decode() {
        let entry = decode_entry(V1_ENTRY).expect("decode v1");
        assert_eq!(entry.log_id, LogId::new(CommittedLeaderId::new(3, 9), 12));
        match entry.payload {
            EntryPayload::Normal(batch) => assert_eq!(batch, Batch::new(vec![proposal()])),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn entries_round_trip_with_their_stamp() {
        let entry = Entry {
            log_id: LogId::new(CommittedLeaderId::new(3, 9), 12),
            payload: EntryPayload::Normal(Batch {
                proposals: vec![proposal()],
                stamp: Some(LeaderStamp { run: 7, millis: 8 }),
            }),
        };
        let bytes = encode(&entry).expect("encode");
        assert_eq!(bytes[0], 2);
        let back = decode_entry(&bytes).expect("decode");
        assert_eq!(back.log_id, entry.log_id);
        assert_eq!(
            format!("{:?}", back.payload),
            format!("{:?}", entry.payload)
        );
    }
}
