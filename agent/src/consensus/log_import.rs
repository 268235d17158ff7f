//! Moves a metadata log kept by an earlier release (`meta/log.redb`, one redb table of
//! entries and one of state values) into the segment files of [`Wal`], once, at start.
//!
//! The values are copied as they are stored (the log store's versioned encodings did not
//! change). The new log is written into `meta/log.import/`, synced, and renamed to
//! `meta/log/`; only then is `log.redb` deleted. A crash before the rename leaves the old
//! file in charge (the next start imports again); after it, the next start finds both and
//! deletes the old file.

use std::io;
use std::path::Path;

use openraft::LogId;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use super::log_store::decode;
use super::wal::{Key, Wal};
use crate::durable::sync_dir;

const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");
const STATE: TableDefinition<&str, &[u8]> = TableDefinition::new("state");
/// Entries copied per write.
const CHUNK: usize = 256;

fn other(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

/// Copies the redb log at `old` into a new log at `wal_dir`.
pub(super) fn import(old: &Path, wal_dir: &Path) -> io::Result<()> {
    let tmp = wal_dir.with_extension("import");
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp)?;
    }
    let db = Database::open(old).map_err(other)?;
    let txn = db.begin_read().map_err(other)?;
    let wal = Wal::open(std::sync::Arc::new(shoal_disk::OsDisk), &tmp)?;
    let state = txn.open_table(STATE).map_err(other)?;
    let value = |key: &str| -> io::Result<Option<Vec<u8>>> {
        Ok(state.get(key).map_err(other)?.map(|v| v.value().to_vec()))
    };
    if let Some(purged) = value("last_purged")? {
        let log_id: LogId<u64> = decode(&purged).map_err(other)?;
        wal.purge(log_id.index, &purged)?;
    }
    if let Some(vote) = value("vote")? {
        wal.set(Key::Vote, &vote, false)?;
    }
    if let Some(committed) = value("committed")? {
        wal.set(Key::Committed, &committed, false)?;
    }
    let log = txn.open_table(LOG).map_err(other)?;
    let mut chunk = Vec::with_capacity(CHUNK);
    let mut count = 0usize;
    for row in log.iter().map_err(other)? {
        let (k, v) = row.map_err(other)?;
        chunk.push((k.value(), v.value().to_vec()));
        if chunk.len() == CHUNK {
            count += chunk.len();
            wal.append(&std::mem::take(&mut chunk), false)?;
        }
    }
    count += chunk.len();
    wal.append(&chunk, false)?;
    wal.sync()?;
    drop(wal);
    std::fs::rename(&tmp, wal_dir)?;
    if let Some(parent) = wal_dir.parent() {
        sync_dir(parent)?;
    }
    tracing::info!(
        from = %old.display(),
        to = %wal_dir.display(),
        entries = count,
        "moved the metadata log out of redb"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use openraft::storage::RaftLogStorage;
    use openraft::{CommittedLeaderId, EntryPayload, LogId, RaftLogReader, Vote};
    use std::sync::Arc;

    use super::{LOG, STATE};
    use crate::consensus::ballast::Ballast;
    use crate::consensus::log_store::{LogStore, encode};
    use crate::consensus::types::Entry;

    fn log_id(index: u64) -> LogId<u64> {
        LogId::new(CommittedLeaderId::new(2, 1), index)
    }

    /// A log as the previous release left it: entries 4..=9 after a purge at 3.
    fn write_old(path: &std::path::Path) {
        let db = redb::Database::create(path).expect("create");
        let txn = db.begin_write().expect("txn");
        {
            let mut log = txn.open_table(LOG).expect("log");
            for i in 4..10 {
                let e = Entry {
                    log_id: log_id(i),
                    payload: EntryPayload::Blank,
                };
                log.insert(i, encode(&e).expect("encode").as_slice())
                    .expect("insert");
            }
            let mut state = txn.open_table(STATE).expect("state");
            let put = |t: &mut redb::Table<&str, &[u8]>, k: &str, v: Vec<u8>| {
                t.insert(k, v.as_slice()).expect("insert");
            };
            put(
                &mut state,
                "vote",
                encode(&Vote::<u64>::new(2, 1)).expect("vote"),
            );
            put(
                &mut state,
                "committed",
                encode(&Some(log_id(8))).expect("c"),
            );
            put(&mut state, "last_purged", encode(&log_id(3)).expect("p"));
        }
        txn.commit().expect("commit");
    }

    #[tokio::test]
    async fn a_redb_log_is_moved_into_segments_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        write_old(&dir.path().join("log.redb"));
        let ballast = || Arc::new(Ballast::open(dir.path()));
        for round in 0..2 {
            let mut log =
                LogStore::open(dir.path(), 1, ballast(), Default::default()).expect("open");
            assert!(!dir.path().join("log.redb").exists(), "round {round}");
            let state = log.get_log_state().await.expect("state");
            assert_eq!(state.last_purged_log_id, Some(log_id(3)));
            assert_eq!(state.last_log_id, Some(log_id(9)));
            assert_eq!(log.read_vote().await.expect("vote"), Some(Vote::new(2, 1)));
            assert_eq!(log.read_committed().await.expect("c"), Some(log_id(8)));
            let entries = log.try_get_log_entries(0..100).await.expect("read");
            let ids: Vec<u64> = entries.iter().map(|e| e.log_id.index).collect();
            assert_eq!(ids, (4..10).collect::<Vec<_>>());
        }
    }

    /// A crash in the middle of an import leaves `log.import/` beside `log.redb`: the next
    /// start imports again from the start.
    #[tokio::test]
    async fn an_import_cut_short_is_done_again() {
        let dir = tempfile::tempdir().expect("tempdir");
        write_old(&dir.path().join("log.redb"));
        let half = super::Wal::open(
            std::sync::Arc::new(shoal_disk::OsDisk),
            &dir.path().join("log.import"),
        )
        .expect("half");
        half.append(&[(1, b"garbage".to_vec())], true)
            .expect("append");
        drop(half);
        let mut log = LogStore::open(
            dir.path(),
            1,
            Arc::new(Ballast::open(dir.path())),
            Default::default(),
        )
        .expect("open");
        assert!(!dir.path().join("log.import").exists());
        let entries = log.try_get_log_entries(0..100).await.expect("read");
        let ids: Vec<u64> = entries.iter().map(|e| e.log_id.index).collect();
        assert_eq!(ids, (4..10).collect::<Vec<_>>());
    }

    /// A crash after the rename and before the old file's deletion: the new log wins.
    #[tokio::test]
    async fn an_old_file_beside_an_imported_log_is_deleted() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ballast = || Arc::new(Ballast::open(dir.path()));
        {
            let mut log =
                LogStore::open(dir.path(), 1, ballast(), Default::default()).expect("open");
            log.save_vote(&Vote::new(5, 1)).await.expect("vote");
        }
        write_old(&dir.path().join("log.redb"));
        let mut log = LogStore::open(dir.path(), 1, ballast(), Default::default()).expect("open");
        assert!(!dir.path().join("log.redb").exists());
        assert_eq!(log.read_vote().await.expect("vote"), Some(Vote::new(5, 1)));
        assert_eq!(log.get_log_state().await.expect("state").last_log_id, None);
    }
}
