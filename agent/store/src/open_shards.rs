//! [`OpenShards`]: shard files kept open after a range read, with their header and block
//! table, so the next range read of the same shard is one read of its blocks (no `open`,
//! no second read for the table, no `close`).
//!
//! A shard file is written once under its key and never changed in place; it is only
//! deleted (and a key written again after that names a new file). An entry is used only
//! while the index still holds the length and checksum its header was checked against.
//! Whoever removes a key from the index drops its entry under the same lock, so a deleted
//! file's space is never held by the cache. At most [`CAPACITY`] (1,024) files are kept.

use std::collections::HashMap;
use std::fs::File;
use std::sync::Arc;

use bytes::Bytes;

use crate::ShardKey;
use crate::header::ShardHeader;

/// Shard files kept open at most: far below the agent's open-file limit (the Ansible unit
/// sets 65,536). 1,024 shards of 4+2 stripes of 1 MiB hold 256 MiB; random reads over more
/// than that reopen some files.
pub const CAPACITY: usize = 1024;

/// One open shard file, its header checked against an index entry.
#[derive(Clone)]
pub struct OpenShard {
    pub file: Arc<File>,
    /// Its data length and crc32c are the index entry it matched.
    pub header: ShardHeader,
    /// The block table, as read from the file.
    pub table: Bytes,
}

#[derive(Default)]
pub struct OpenShards {
    files: HashMap<ShardKey, OpenShard>,
}

impl OpenShards {
    /// The open file of `key`, if it was checked against `entry` (length, crc32c).
    pub fn get(&self, key: ShardKey, entry: (u64, u32)) -> Option<OpenShard> {
        self.files
            .get(&key)
            .filter(|o| (o.header.data_len, o.header.data_crc) == entry)
            .cloned()
    }

    /// Keeps `shard` open; when full, closes one other file first (whichever the map
    /// yields first: random enough, and no bookkeeping per read).
    pub fn keep(&mut self, key: ShardKey, shard: OpenShard) {
        if self.files.len() >= CAPACITY && !self.files.contains_key(&key) {
            let other = self.files.keys().next().copied();
            if let Some(other) = other {
                self.files.remove(&other);
            }
        }
        self.files.insert(key, shard);
    }

    /// Closes `key`'s file (its index entry is going).
    pub fn drop_key(&mut self, key: ShardKey) {
        self.files.remove(&key);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.files.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(file: &Arc<File>, (data_len, data_crc): (u64, u32)) -> OpenShard {
        let (header, table) = ShardHeader::for_data(key(1), b"abc");
        OpenShard {
            file: file.clone(),
            header: ShardHeader {
                data_len,
                data_crc,
                ..header
            },
            table: Bytes::from(table),
        }
    }

    fn file() -> Arc<File> {
        Arc::new(tempfile::tempfile().expect("tempfile"))
    }

    fn key(stripe: u128) -> ShardKey {
        ShardKey { stripe, index: 0 }
    }

    #[test]
    fn a_file_is_used_only_for_the_entry_it_was_checked_against() {
        let mut open = OpenShards::default();
        open.keep(key(1), shard(&file(), (3, 7)));
        assert!(open.get(key(1), (3, 7)).is_some());
        assert!(open.get(key(1), (3, 8)).is_none(), "another checksum");
        assert!(open.get(key(2), (3, 7)).is_none(), "another key");
        open.drop_key(key(1));
        assert!(open.get(key(1), (3, 7)).is_none(), "dropped");
    }

    #[test]
    fn it_never_holds_more_than_its_capacity() {
        let (mut open, f) = (OpenShards::default(), file());
        for s in 0..(CAPACITY as u128 + 10) {
            open.keep(key(s), shard(&f, (3, 7)));
        }
        assert_eq!(open.len(), CAPACITY);
        let last = key(CAPACITY as u128 + 9);
        assert!(open.get(last, (3, 7)).is_some(), "the newest is kept");
        open.keep(last, shard(&f, (3, 7)));
        assert_eq!(
            open.len(),
            CAPACITY,
            "keeping a kept key again evicts nothing"
        );
    }
}
