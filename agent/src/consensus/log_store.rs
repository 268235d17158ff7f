//! The Raft log, vote and commit index in a redb file.
//!
//! Every call that openraft needs durable commits one redb transaction with immediate
//! durability before it returns (and before the flush callback of `append` fires), as
//! openraft's contract requires. The commit index is the exception: openraft does not need
//! it durable (a restarted member learns it from the leader again), so it is kept in memory
//! and written by the next transaction that commits anyway, not by one of its own (that
//! was one fsync per entry on every member). The other exception is a learner's appends:
//! [`AppendSync`] says which it syncs. redb work that may wait for the disk (a synced
//! commit) or take long (a read of many entries) runs on the blocking pool; a commit
//! without sync of a few small entries, or a read of a few, runs on the calling task: it
//! costs microseconds, less than the two thread switches of a hand-over.

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::Arc;

use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{ErrorSubject, ErrorVerb, LogId, LogState, RaftLogReader, Vote};
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::append_sync::AppendSync;
use super::ballast::Ballast;
use super::types::{Entry, MetaRaft, StorageError, storage_error};

const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");
const STATE: TableDefinition<&str, &[u8]> = TableDefinition::new("state");
const VOTE: &str = "vote";
const COMMITTED: &str = "committed";
const PURGED: &str = "last_purged";
/// Version byte in front of every value this file stores. Version 2: log entries carry
/// the leader's stamp in their batch; version 1 values (no stamp) are still read.
const FORMAT: u8 = 2;
const FORMAT_V1: u8 = 1;

/// Most entries a read makes on the calling task (more go to the blocking pool).
const INLINE_ENTRIES: u64 = 4;
/// Most bytes of entries an unsynced append commits on the calling task.
const INLINE_BYTES: usize = 64 << 10;

/// Where a piece of redb work runs.
#[derive(Clone, Copy)]
enum Where {
    /// On the calling task: short, and never waits for the disk.
    Here,
    /// On tokio's blocking pool.
    Blocking,
}

/// The log store; cheap to clone (one shared database).
#[derive(Clone)]
pub struct LogStore {
    db: Arc<Database>,
    /// Space the log can always write (given up before a write on a nearly full disk).
    ballast: Arc<Ballast>,
    /// The commit index openraft last saved, not yet written (see the module doc).
    committed: Arc<std::sync::Mutex<Pending>>,
    /// Which appends are synced before they are acknowledged.
    sync: Arc<AppendSync>,
}

/// The commit index as openraft last saved it, and whether the file has it yet.
#[derive(Default)]
struct Pending {
    /// `None` until openraft saves one in this process.
    latest: Option<Option<LogId<u64>>>,
    written: bool,
}

fn encode<T: Serialize>(v: &T) -> Result<Vec<u8>, String> {
    let mut out = vec![FORMAT];
    out.extend(postcard::to_allocvec(v).map_err(|e| e.to_string())?);
    Ok(out)
}

/// Decodes a value of a type whose encoding did not change between versions 1 and 2
/// (vote, commit index, purge point).
fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
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
    /// Opens (or creates) member `me`'s log.
    pub fn open(path: &Path, me: u64, ballast: Arc<Ballast>) -> Result<LogStore, redb::Error> {
        let db = Database::create(path)?;
        let txn = db.begin_write()?;
        txn.open_table(LOG)?;
        txn.open_table(STATE)?;
        txn.commit()?;
        Ok(LogStore {
            db: Arc::new(db),
            ballast,
            committed: Arc::default(),
            sync: Arc::new(AppendSync::new(me)),
        })
    }

    /// The policy that decides which appends are synced (the group tells it what this
    /// member is at start).
    pub fn append_sync(&self) -> Arc<AppendSync> {
        self.sync.clone()
    }

    /// Runs `f` (a read) on the blocking pool.
    async fn blocking<T, F>(&self, f: F) -> Result<T, String>
    where
        T: Send + 'static,
        F: FnOnce(&Database) -> Result<T, String> + Send + 'static,
    {
        self.run(Where::Blocking, f).await
    }

    /// Runs `f` where `place` says.
    async fn run<T, F>(&self, place: Where, f: F) -> Result<T, String>
    where
        T: Send + 'static,
        F: FnOnce(&Database) -> Result<T, String> + Send + 'static,
    {
        let db = self.db.clone();
        let work = move || f(&db);
        match place {
            Where::Here => work(),
            Where::Blocking => tokio::task::spawn_blocking(work)
                .await
                .map_err(|e| e.to_string())?,
        }
    }

    /// Runs `f` in a write transaction on the blocking pool and commits it durably, with
    /// the commit index openraft saved since the last write.
    async fn write<F>(&self, f: F) -> Result<(), String>
    where
        F: FnOnce(&redb::WriteTransaction) -> Result<(), String> + Send + 'static,
    {
        self.write_with(Durability::Immediate, Where::Blocking, f)
            .await
    }

    /// [`Self::write`] with the given durability, run where `place` says.
    async fn write_with<F>(&self, durability: Durability, place: Where, f: F) -> Result<(), String>
    where
        F: FnOnce(&redb::WriteTransaction) -> Result<(), String> + Send + 'static,
    {
        let committed = self.committed.clone();
        let ballast = self.ballast.clone();
        self.run(place, move |db| {
            ballast.before_write();
            let mut txn = db.begin_write().map_err(|e| e.to_string())?;
            txn.set_durability(durability).map_err(|e| e.to_string())?;
            f(&txn)?;
            let carried = {
                let pending = committed.lock().unwrap_or_else(|p| p.into_inner());
                match (pending.written, pending.latest) {
                    (false, Some(c)) => Some(c),
                    _ => None,
                }
            };
            if let Some(c) = carried {
                let bytes = encode(&c)?;
                let mut state = txn.open_table(STATE).map_err(|e| e.to_string())?;
                state
                    .insert(COMMITTED, bytes.as_slice())
                    .map_err(|e| e.to_string())?;
            }
            txn.commit().map_err(|e| e.to_string())?;
            if let Some(c) = carried {
                let mut pending = committed.lock().unwrap_or_else(|p| p.into_inner());
                // A newer index may have been saved meanwhile: that one is still to write.
                if pending.latest == Some(c) {
                    pending.written = true;
                }
            }
            Ok(())
        })
        .await
    }

    fn get_state<T: DeserializeOwned>(db: &Database, key: &str) -> Result<Option<T>, String> {
        let txn = db.begin_read().map_err(|e| e.to_string())?;
        let table = txn.open_table(STATE).map_err(|e| e.to_string())?;
        match table.get(key).map_err(|e| e.to_string())? {
            Some(v) => decode(v.value()).map(Some),
            None => Ok(None),
        }
    }

    fn put_state<T: Serialize>(
        txn: &redb::WriteTransaction,
        key: &str,
        value: &T,
    ) -> Result<(), String> {
        let bytes = encode(value)?;
        let mut table = txn.open_table(STATE).map_err(|e| e.to_string())?;
        table
            .insert(key, bytes.as_slice())
            .map_err(|e| e.to_string())?;
        Ok(())
    }

    fn entries(db: &Database, start: Bound<u64>, end: Bound<u64>) -> Result<Vec<Entry>, String> {
        let txn = db.begin_read().map_err(|e| e.to_string())?;
        let table = txn.open_table(LOG).map_err(|e| e.to_string())?;
        let mut out = Vec::new();
        for row in table
            .range::<u64>((start, end))
            .map_err(|e| e.to_string())?
        {
            let (_, v) = row.map_err(|e| e.to_string())?;
            out.push(decode_entry(v.value())?);
        }
        Ok(out)
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
        self.run(place, move |db| LogStore::entries(db, start, end))
            .await
            .map_err(|e| log_err(ErrorVerb::Read, e))
    }
}

impl RaftLogStorage<MetaRaft> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<MetaRaft>, StorageError> {
        self.blocking(|db| {
            let purged: Option<LogId<u64>> = LogStore::get_state(db, PURGED)?;
            let txn = db.begin_read().map_err(|e| e.to_string())?;
            let table = txn.open_table(LOG).map_err(|e| e.to_string())?;
            let last = match table.last().map_err(|e| e.to_string())? {
                Some((_, v)) => Some(decode_entry(v.value())?.log_id),
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
        let vote = *vote;
        self.write(move |txn| LogStore::put_state(txn, VOTE, &vote))
            .await
            .map_err(|e| storage_error(ErrorSubject::Vote, ErrorVerb::Write, e))
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<u64>>, StorageError> {
        self.blocking(|db| LogStore::get_state(db, VOTE))
            .await
            .map_err(|e| storage_error(ErrorSubject::Vote, ErrorVerb::Read, e))
    }

    /// Kept for the next write (see the module doc): never a transaction of its own.
    async fn save_committed(&mut self, committed: Option<LogId<u64>>) -> Result<(), StorageError> {
        let mut pending = self.committed.lock().unwrap_or_else(|p| p.into_inner());
        if pending.latest != Some(committed) {
            *pending = Pending {
                latest: Some(committed),
                written: false,
            };
        }
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<u64>>, StorageError> {
        if let Some(c) = self
            .committed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .latest
        {
            return Ok(c);
        }
        self.blocking(|db| Ok(LogStore::get_state::<Option<LogId<u64>>>(db, COMMITTED)?.flatten()))
            .await
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
        let durability = if self.sync.before_append(&entries) {
            Durability::Immediate
        } else {
            Durability::None
        };
        let rows: Result<Vec<(u64, Vec<u8>)>, String> = entries
            .iter()
            .map(|e| encode(e).map(|b| (e.log_id.index, b)))
            .collect();
        let rows = rows.map_err(|e| log_err(ErrorVerb::Write, e))?;
        let bytes: usize = rows.iter().map(|(_, b)| b.len()).sum();
        let place = if matches!(durability, Durability::None) && bytes <= INLINE_BYTES {
            Where::Here
        } else {
            Where::Blocking
        };
        let started = std::time::Instant::now();
        let res = self
            .write_with(durability, place, move |txn| {
                let mut table = txn.open_table(LOG).map_err(|e| e.to_string())?;
                for (index, bytes) in &rows {
                    table
                        .insert(*index, bytes.as_slice())
                        .map_err(|e| e.to_string())?;
                }
                Ok(())
            })
            .await;
        tracing::debug!(
            elapsed_us = started.elapsed().as_micros() as u64,
            synced = matches!(durability, Durability::Immediate),
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
        self.sync.truncated();
        self.write(move |txn| {
            let mut table = txn.open_table(LOG).map_err(|e| e.to_string())?;
            table
                .retain_in(log_id.index.., |_, _| false)
                .map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| log_err(ErrorVerb::Delete, e))
    }

    async fn purge(&mut self, log_id: LogId<u64>) -> Result<(), StorageError> {
        self.write(move |txn| {
            LogStore::put_state(txn, PURGED, &log_id)?;
            let mut table = txn.open_table(LOG).map_err(|e| e.to_string())?;
            table
                .retain_in(..=log_id.index, |_, _| false)
                .map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| log_err(ErrorVerb::Delete, e))
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

    /// The commit index rides on the next durable write, never in a write of its own.
    #[tokio::test]
    async fn commit_index_is_written_with_the_next_write() {
        use openraft::storage::RaftLogStorage;
        use std::sync::Arc;

        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("log.redb");
        let ballast = || Arc::new(super::Ballast::open(dir.path()));
        let first = LogId::new(CommittedLeaderId::new(1, 1), 3);
        let second = LogId::new(CommittedLeaderId::new(1, 1), 4);
        {
            let mut log = super::LogStore::open(&path, 1, ballast()).expect("open");
            log.save_committed(Some(first)).await.expect("save");
            assert_eq!(log.read_committed().await.expect("read"), Some(first));
            log.save_vote(&openraft::Vote::new(1, 1))
                .await
                .expect("vote");
            // Saved after the last write: only in memory.
            log.save_committed(Some(second)).await.expect("save");
            assert_eq!(log.read_committed().await.expect("read"), Some(second));
        }
        let mut log = super::LogStore::open(&path, 1, ballast()).expect("reopen");
        assert_eq!(log.read_committed().await.expect("read"), Some(first));
        assert_eq!(
            log.read_vote().await.expect("vote"),
            Some(openraft::Vote::new(1, 1))
        );
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
