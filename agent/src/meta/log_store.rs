//! The Raft log, vote and commit index in a redb file.
//!
//! Every call commits one redb transaction with immediate durability before it returns
//! (and before the flush callback of `append` fires), as openraft's contract requires.
//! redb work runs on the blocking pool, never on the Raft core's async thread.

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::Arc;

use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{ErrorSubject, ErrorVerb, LogId, LogState, RaftLogReader, Vote};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::types::{Entry, MetaRaft, StorageError, storage_error};

const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");
const STATE: TableDefinition<&str, &[u8]> = TableDefinition::new("state");
const VOTE: &str = "vote";
const COMMITTED: &str = "committed";
const PURGED: &str = "last_purged";
/// Version byte in front of every value this file stores.
const FORMAT: u8 = 1;

/// The log store; cheap to clone (one shared database).
#[derive(Clone)]
pub struct LogStore {
    db: Arc<Database>,
}

fn encode<T: Serialize>(v: &T) -> Result<Vec<u8>, String> {
    let mut out = vec![FORMAT];
    out.extend(postcard::to_allocvec(v).map_err(|e| e.to_string())?);
    Ok(out)
}

fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    match bytes.split_first() {
        Some((&FORMAT, body)) => postcard::from_bytes(body).map_err(|e| e.to_string()),
        Some((v, _)) => Err(format!("unknown log record version {v}")),
        None => Err("empty log record".into()),
    }
}

impl LogStore {
    pub fn open(path: &Path) -> Result<LogStore, String> {
        let db = Database::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let txn = db.begin_write().map_err(|e| e.to_string())?;
        txn.open_table(LOG).map_err(|e| e.to_string())?;
        txn.open_table(STATE).map_err(|e| e.to_string())?;
        txn.commit().map_err(|e| e.to_string())?;
        Ok(LogStore { db: Arc::new(db) })
    }

    /// Runs `f` on the blocking pool.
    async fn blocking<T, F>(&self, f: F) -> Result<T, String>
    where
        T: Send + 'static,
        F: FnOnce(&Database) -> Result<T, String> + Send + 'static,
    {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || f(&db))
            .await
            .map_err(|e| e.to_string())?
    }

    fn get_state<T: DeserializeOwned>(db: &Database, key: &str) -> Result<Option<T>, String> {
        let txn = db.begin_read().map_err(|e| e.to_string())?;
        let table = txn.open_table(STATE).map_err(|e| e.to_string())?;
        match table.get(key).map_err(|e| e.to_string())? {
            Some(v) => decode(v.value()).map(Some),
            None => Ok(None),
        }
    }

    fn put_state<T: Serialize>(db: &Database, key: &str, value: &T) -> Result<(), String> {
        let bytes = encode(value)?;
        let txn = db.begin_write().map_err(|e| e.to_string())?;
        {
            let mut table = txn.open_table(STATE).map_err(|e| e.to_string())?;
            table
                .insert(key, bytes.as_slice())
                .map_err(|e| e.to_string())?;
        }
        txn.commit().map_err(|e| e.to_string())
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
            out.push(decode(v.value())?);
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
        self.blocking(move |db| LogStore::entries(db, start, end))
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
                Some((_, v)) => Some(decode::<Entry>(v.value())?.log_id),
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
        self.blocking(move |db| LogStore::put_state(db, VOTE, &vote))
            .await
            .map_err(|e| storage_error(ErrorSubject::Vote, ErrorVerb::Write, e))
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<u64>>, StorageError> {
        self.blocking(|db| LogStore::get_state(db, VOTE))
            .await
            .map_err(|e| storage_error(ErrorSubject::Vote, ErrorVerb::Read, e))
    }

    async fn save_committed(&mut self, committed: Option<LogId<u64>>) -> Result<(), StorageError> {
        self.blocking(move |db| LogStore::put_state(db, COMMITTED, &committed))
            .await
            .map_err(|e| storage_error(ErrorSubject::Store, ErrorVerb::Write, e))
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<u64>>, StorageError> {
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
        let rows: Result<Vec<(u64, Vec<u8>)>, String> = entries
            .into_iter()
            .map(|e| encode(&e).map(|b| (e.log_id.index, b)))
            .collect();
        let rows = rows.map_err(|e| log_err(ErrorVerb::Write, e))?;
        let started = std::time::Instant::now();
        let res = self
            .blocking(move |db| {
                let txn = db.begin_write().map_err(|e| e.to_string())?;
                {
                    let mut table = txn.open_table(LOG).map_err(|e| e.to_string())?;
                    for (index, bytes) in &rows {
                        table
                            .insert(*index, bytes.as_slice())
                            .map_err(|e| e.to_string())?;
                    }
                }
                txn.commit().map_err(|e| e.to_string())
            })
            .await;
        tracing::debug!(
            elapsed_us = started.elapsed().as_micros() as u64,
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
        self.blocking(move |db| {
            let txn = db.begin_write().map_err(|e| e.to_string())?;
            {
                let mut table = txn.open_table(LOG).map_err(|e| e.to_string())?;
                table
                    .retain_in(log_id.index.., |_, _| false)
                    .map_err(|e| e.to_string())?;
            }
            txn.commit().map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| log_err(ErrorVerb::Delete, e))
    }

    async fn purge(&mut self, log_id: LogId<u64>) -> Result<(), StorageError> {
        self.blocking(move |db| {
            let bytes = encode(&log_id)?;
            let txn = db.begin_write().map_err(|e| e.to_string())?;
            {
                let mut state = txn.open_table(STATE).map_err(|e| e.to_string())?;
                state
                    .insert(PURGED, bytes.as_slice())
                    .map_err(|e| e.to_string())?;
                let mut table = txn.open_table(LOG).map_err(|e| e.to_string())?;
                table
                    .retain_in(..=log_id.index, |_, _| false)
                    .map_err(|e| e.to_string())?;
            }
            txn.commit().map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| log_err(ErrorVerb::Delete, e))
    }
}
