//! Queries on the applied state, each in one read transaction. Before anything was
//! applied the root directory answers as an empty directory with zero times. Queries
//! answer in the agent API's types, converted here from the records.

use std::collections::BTreeMap;
use std::ops::Bound;

use redb::{ReadTransaction, ReadableDatabase, ReadableTable, ReadableTableMetadata};
use shoal_agent_api::{
    DirEntry, Extent, FileAttr, FileLayout, FsError, Ino, ROOT_INO, StripeRecord, Timestamp,
};
use shoal_placement::{Layout, NodeId, StripeId};

use crate::format::ColdLocation;
use crate::record::{
    self, DIR_LEASES, DIRENTS, DISOWNED, EXTENTS, GARBAGE, INODES, InodeRecord, KEY_LAYOUT,
    KEY_STRIPE_BYTES, ORPHANS, STATE, STRIPES, decode,
};
use crate::{NamespaceError, NamespaceStore};

/// A file's content as the reader needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileData {
    pub attr: FileAttr,
    /// Inline bytes: the start of the content (the rest up to `attr.size` reads as zeros).
    /// Empty when the file has extents.
    pub inline: Vec<u8>,
    /// The data version the inline bytes belong to; a writer moving them to a stripe
    /// passes it back in `WriteExtents`.
    pub inline_version: u64,
    /// Extents in file order; gaps between them read as zeros.
    pub extents: Vec<Extent>,
    /// Where the cold ones among the extents' stripes are (in the bucket, not on NVMe).
    pub cold: BTreeMap<StripeId, ColdLocation>,
}

/// Namespace totals.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NamespaceStats {
    /// Inodes, including orphans.
    pub inodes: u64,
    /// Live stripes (referenced by at least one extent).
    pub stripes: u64,
    /// Sum of `len` over live stripes.
    pub stripe_bytes: u64,
}

impl NamespaceStore {
    pub(crate) fn read(&self) -> Result<ReadTransaction, NamespaceError> {
        Ok(self.db.begin_read()?)
    }

    /// The entry `name` in directory `parent`.
    pub fn lookup(&self, parent: Ino, name: &str) -> Result<FileAttr, NamespaceError> {
        let txn = self.read()?;
        let inodes = txn.open_table(INODES)?;
        directory(&inodes, parent)?;
        if name.len() > shoal_agent_api::NAME_MAX {
            return Err(FsError::NameTooLong.into());
        }
        let dirents = txn.open_table(DIRENTS)?;
        let entry = record::read_dirent(&dirents, parent, name)?.ok_or(FsError::NotFound)?;
        let node = record::read_inode(&inodes, entry.ino)?.ok_or_else(|| dangling(entry.ino))?;
        Ok(node.attr(entry.ino).into())
    }

    pub fn getattr(&self, ino: Ino) -> Result<FileAttr, NamespaceError> {
        let txn = self.read()?;
        let inodes = txn.open_table(INODES)?;
        Ok(inode(&inodes, ino)?.attr(ino).into())
    }

    /// Every entry of a directory except "." and "..", sorted by name.
    pub fn readdir(&self, ino: Ino) -> Result<Vec<DirEntry>, NamespaceError> {
        Ok(self.readdir_page(ino, None, usize::MAX)?.0)
    }

    /// Up to `limit` entries of a directory (not "." and "..") in name order, those after
    /// the name `after` (from the first when `None`), and whether more follow.
    pub fn readdir_page(
        &self,
        ino: Ino,
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<DirEntry>, bool), NamespaceError> {
        let txn = self.read()?;
        directory(&txn.open_table(INODES)?, ino)?;
        let dirents = txn.open_table(DIRENTS)?;
        let start = match after {
            Some(name) => Bound::Excluded((ino, name)),
            None => Bound::Included((ino, "")),
        };
        let mut out = Vec::new();
        for item in dirents.range::<(u64, &str)>((start, Bound::Unbounded))? {
            let (key, value) = item?;
            let (dir, name) = key.value();
            if dir != ino {
                break;
            }
            if out.len() == limit {
                return Ok((out, true));
            }
            let entry: record::DirentRecord = decode(value.value(), "dirent")?;
            out.push(DirEntry {
                name: name.to_owned(),
                ino: entry.ino,
                kind: entry.kind.into(),
            });
        }
        Ok((out, false))
    }

    /// A directory's parent, for ".."; the root's parent is the root.
    pub fn parent_of(&self, dir: Ino) -> Result<Ino, NamespaceError> {
        let txn = self.read()?;
        Ok(directory(&txn.open_table(INODES)?, dir)?.parent)
    }

    /// A symlink's target; Invalid for other kinds.
    pub fn readlink(&self, ino: Ino) -> Result<String, NamespaceError> {
        let txn = self.read()?;
        let node = inode(&txn.open_table(INODES)?, ino)?;
        if node.kind != crate::format::FileKind::Symlink {
            return Err(FsError::Invalid.into());
        }
        Ok(node.target)
    }

    /// A file's attributes, inline bytes and extents (empty for other kinds).
    pub fn file_data(&self, ino: Ino) -> Result<FileData, NamespaceError> {
        let txn = self.read()?;
        let node = inode(&txn.open_table(INODES)?, ino)?;
        let extents = extents_of(&txn, ino)?;
        let cold = crate::tier::cold_of(&txn, extents.iter().map(|e| e.stripe.id))?;
        Ok(FileData {
            attr: node.attr(ino).into(),
            inline_version: node.data_version,
            inline: node.inline,
            extents,
            cold,
        })
    }

    /// Like [`NamespaceStore::file_data`], with only the extents that overlap
    /// `[offset, offset + len)`: a read of a large file does not load its whole map.
    pub fn file_range(&self, ino: Ino, offset: u64, len: u64) -> Result<FileData, NamespaceError> {
        let txn = self.read()?;
        let node = inode(&txn.open_table(INODES)?, ino)?;
        let end = offset.saturating_add(len);
        let stripes = txn.open_table(STRIPES)?;
        let table = txn.open_table(EXTENTS)?;
        let mut extents = Vec::new();
        // Extents never overlap: walking back from `end`, the first one that ends at or
        // before `offset` is where the range starts.
        for item in table.range((ino, 0)..(ino, end))?.rev() {
            let (key, value) = item?;
            let start = key.value().1;
            let ext: record::ExtentRecord = decode(value.value(), "extent")?;
            if start.saturating_add(ext.len) <= offset {
                break;
            }
            let entry = record::read_stripe(&stripes, ext.stripe.0)?.ok_or_else(|| {
                NamespaceError::Corrupt(format!(
                    "inode {ino} references stripe {}, which is not recorded",
                    ext.stripe
                ))
            })?;
            extents.push(Extent {
                offset: start,
                len: ext.len,
                stripe_offset: ext.stripe_offset,
                stripe: entry.record.into(),
            });
        }
        extents.reverse();
        let cold = crate::tier::cold_of(&txn, extents.iter().map(|e| e.stripe.id))?;
        Ok(FileData {
            attr: node.attr(ino).into(),
            inline_version: node.data_version,
            inline: node.inline,
            extents,
            cold,
        })
    }

    /// Where a file's data lives.
    pub fn file_layout(&self, ino: Ino) -> Result<FileLayout, NamespaceError> {
        let txn = self.read()?;
        let node = inode(&txn.open_table(INODES)?, ino)?;
        let extents = extents_of(&txn, ino)?;
        Ok(FileLayout {
            attr: node.attr(ino).into(),
            inline_len: node.inline.len() as u64,
            extents,
        })
    }

    /// The cluster clock in milliseconds (leader time the group has seen, replica-exact).
    pub fn clock_ms(&self) -> Result<u64, NamespaceError> {
        let txn = self.read()?;
        let clock: Option<crate::record::ClockRecord> =
            record::read_state(&txn.open_table(STATE)?, crate::record::KEY_CLOCK)?;
        Ok(clock.unwrap_or_default().now_ms)
    }

    pub fn stats(&self) -> Result<NamespaceStats, NamespaceError> {
        let txn = self.read()?;
        let inodes = txn.open_table(INODES)?;
        // Before the first apply the root answers without being stored.
        let unstored_root = u64::from(inodes.get(ROOT_INO)?.is_none());
        Ok(NamespaceStats {
            inodes: inodes.len()? + unstored_root,
            stripes: txn.open_table(STRIPES)?.len()?,
            stripe_bytes: record::read_state_u64(&txn.open_table(STATE)?, KEY_STRIPE_BYTES, 0)?,
        })
    }

    /// The highest generation `node` was recorded running with.
    pub fn node_generation(
        &self,
        node: shoal_placement::NodeId,
    ) -> Result<Option<u64>, NamespaceError> {
        let txn = self.read()?;
        let table = txn.open_table(crate::record::GENERATIONS)?;
        match table.get(node.0)? {
            Some(g) => decode(g.value(), "generation").map(Some),
            None => Ok(None),
        }
    }

    /// What operators asked of each node (drains, maintenance windows), by node id.
    pub fn node_admins(&self) -> Result<crate::nodes::NodeAdmins, NamespaceError> {
        let txn = self.read()?;
        let state = txn.open_table(STATE)?;
        Ok(record::read_state(&state, crate::record::KEY_NODE_ADMIN)?.unwrap_or_default())
    }

    /// The cluster layout, once one was set.
    pub fn cluster_layout(&self) -> Result<Option<Layout>, NamespaceError> {
        let txn = self.read()?;
        let state = txn.open_table(STATE)?;
        match state.get(KEY_LAYOUT)? {
            Some(guard) => decode(guard.value(), "layout").map(Some),
            None => Ok(None),
        }
    }

    /// Inodes with no names left, with the time their last name went.
    pub fn orphans(&self) -> Result<Vec<(Ino, Timestamp)>, NamespaceError> {
        let txn = self.read()?;
        let mut out = Vec::new();
        for item in txn.open_table(ORPHANS)?.iter()? {
            let (key, value) = item?;
            let at: crate::format::Timestamp = decode(value.value(), "orphan")?;
            out.push((key.value(), at.into()));
        }
        Ok(out)
    }

    /// Up to `limit` stripes no extent references any more, waiting for their shards to be
    /// deleted (then `StripesFreed`), in id order from the first after `after`.
    pub fn garbage(
        &self,
        after: Option<StripeId>,
        limit: usize,
    ) -> Result<Vec<StripeRecord>, NamespaceError> {
        let txn = self.read()?;
        stripe_page(
            &txn.open_table(GARBAGE)?,
            after,
            limit,
            |_| Ok(false),
            |value| {
                let record: crate::format::StripeRecord = decode(value, "garbage")?;
                Ok(record)
            },
        )
    }

    /// Up to `limit` live stripes on NVMe (some extent references them; cold ones, whose
    /// bytes are in the bucket, are left out: repair, drain and ok-to-stop have nothing of
    /// theirs to move or count), in id order from the first after `after`: a scan over
    /// every stripe goes page by page.
    pub fn stripes(
        &self,
        after: Option<StripeId>,
        limit: usize,
    ) -> Result<Vec<StripeRecord>, NamespaceError> {
        let txn = self.read()?;
        let cold = txn.open_table(crate::record::COLD)?;
        let is_cold = |id: u128| Ok(cold.get(id)?.is_some());
        stripe_page(&txn.open_table(STRIPES)?, after, limit, is_cold, |value| {
            let entry: crate::record::StripeEntry = decode(value, "stripe")?;
            Ok(entry.record)
        })
    }

    /// The node slot `index` of stripe `id` names, live or in garbage ([`NodeId::NONE`]
    /// for a missing shard); None when the metadata does not know the stripe.
    pub fn shard_holder(&self, id: StripeId, index: u8) -> Result<Option<NodeId>, NamespaceError> {
        let txn = self.read()?;
        let record: crate::format::StripeRecord =
            match record::read_stripe(&txn.open_table(STRIPES)?, id.0)? {
                Some(entry) => entry.record,
                None => match txn.open_table(GARBAGE)?.get(id.0)? {
                    Some(v) => decode(v.value(), "garbage")?,
                    None => return Ok(None),
                },
            };
        Ok(Some(
            record
                .shards
                .get(usize::from(index))
                .map_or(NodeId::NONE, |s| s.node),
        ))
    }

    /// Who holds the lease on directory `dir`, if anyone (see `lease.rs`).
    pub fn dir_lease(&self, dir: Ino) -> Result<Option<crate::DirLease>, NamespaceError> {
        let txn = self.read()?;
        match txn.open_table(DIR_LEASES)?.get(dir)? {
            Some(v) => decode(v.value(), "directory lease").map(Some),
            None => Ok(None),
        }
    }

    /// Every directory lease held (few: a holder gives back the ones it stopped using).
    pub fn dir_leases(&self) -> Result<Vec<(Ino, crate::DirLease)>, NamespaceError> {
        let txn = self.read()?;
        let table = txn.open_table(DIR_LEASES)?;
        let mut all = Vec::new();
        for row in table.iter()? {
            let (k, v) = row?;
            all.push((k.value(), decode(v.value(), "directory lease")?));
        }
        Ok(all)
    }

    /// The live stripe `id`, if some extent references it.
    pub fn live_stripe(&self, id: StripeId) -> Result<Option<StripeRecord>, NamespaceError> {
        let txn = self.read()?;
        Ok(record::read_stripe(&txn.open_table(STRIPES)?, id.0)?.map(|e| e.record.into()))
    }

    /// The shards of `stripe` disowned by a node (index, node): fenced, so a relocation of
    /// that slot to that node is refused for a while.
    pub fn disowned(&self, stripe: StripeId) -> Result<Vec<(u8, NodeId)>, NamespaceError> {
        Ok(self
            .fences(stripe)?
            .into_iter()
            .map(|(index, node, _)| (index, node))
            .collect())
    }

    /// The slots of `stripe` and the nodes a relocation planned at cluster clock
    /// `planned_at_ms` may not take them to (see [`Command::RelocateShardsPlanned`]).
    ///
    /// [`Command::RelocateShardsPlanned`]: crate::Command::RelocateShardsPlanned
    pub fn fenced_for(
        &self,
        stripe: StripeId,
        planned_at_ms: u64,
    ) -> Result<Vec<(u8, NodeId)>, NamespaceError> {
        Ok(self
            .fences(stripe)?
            .into_iter()
            .filter(|(_, _, at)| *at >= planned_at_ms)
            .map(|(index, node, _)| (index, node))
            .collect())
    }

    /// Every fence of `stripe`: (index, node, cluster clock when it was set).
    fn fences(&self, stripe: StripeId) -> Result<Vec<(u8, NodeId, u64)>, NamespaceError> {
        let txn = self.read()?;
        let table = txn.open_table(DISOWNED)?;
        let mut out = Vec::new();
        for item in table.range((stripe.0, 0, 0)..=(stripe.0, u8::MAX, u64::MAX))? {
            let (key, at) = item?;
            let (_, index, node) = key.value();
            out.push((index, NodeId(node), decode(at.value(), "fence")?));
        }
        Ok(out)
    }

    /// True when the stripe is live or in garbage: shards of unknown stripes are orphans
    /// the shard garbage collector may delete.
    pub fn stripe_known(&self, id: StripeId) -> Result<bool, NamespaceError> {
        let txn = self.read()?;
        Ok(txn.open_table(STRIPES)?.get(id.0)?.is_some()
            || txn.open_table(GARBAGE)?.get(id.0)?.is_some())
    }
}

/// Up to `limit` records of a stripe-keyed table, from the first id after `after`.
fn stripe_page(
    table: &impl ReadableTable<u128, &'static [u8]>,
    after: Option<StripeId>,
    limit: usize,
    skip: impl Fn(u128) -> Result<bool, NamespaceError>,
    record: impl Fn(&[u8]) -> Result<crate::format::StripeRecord, NamespaceError>,
) -> Result<Vec<StripeRecord>, NamespaceError> {
    let start = match after {
        Some(id) => Bound::Excluded(id.0),
        None => Bound::Unbounded,
    };
    let mut out = Vec::new();
    for item in table.range::<u128>((start, Bound::Unbounded))? {
        if out.len() >= limit {
            break;
        }
        let (key, value) = item?;
        if skip(key.value())? {
            continue;
        }
        out.push(record(value.value())?.into());
    }
    Ok(out)
}

fn dangling(ino: Ino) -> NamespaceError {
    NamespaceError::Corrupt(format!(
        "a directory entry names inode {ino}, which is gone"
    ))
}

fn inode(
    table: &impl ReadableTable<u64, &'static [u8]>,
    ino: Ino,
) -> Result<InodeRecord, NamespaceError> {
    record::read_inode_or_root(table, ino)?.ok_or_else(|| FsError::NotFound.into())
}

fn directory(
    table: &impl ReadableTable<u64, &'static [u8]>,
    ino: Ino,
) -> Result<InodeRecord, NamespaceError> {
    let node = inode(table, ino)?;
    if !node.is_dir() {
        return Err(FsError::NotDir.into());
    }
    Ok(node)
}

/// A file's extents with their stripe records, in file order.
fn extents_of(txn: &ReadTransaction, ino: Ino) -> Result<Vec<Extent>, NamespaceError> {
    let stripes = txn.open_table(STRIPES)?;
    let mut out = Vec::new();
    for (offset, ext) in record::read_extents(&txn.open_table(EXTENTS)?, ino)? {
        let entry = record::read_stripe(&stripes, ext.stripe.0)?.ok_or_else(|| {
            NamespaceError::Corrupt(format!(
                "inode {ino} references stripe {}, which is not recorded",
                ext.stripe
            ))
        })?;
        out.push(Extent {
            offset,
            len: ext.len,
            stripe_offset: ext.stripe_offset,
            stripe: entry.record.into(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use shoal_agent_api::ROOT_INO;

    use crate::NamespaceError;
    use crate::record::INODES;
    use crate::testkit::Kit;

    #[test]
    fn readdir_pages_follow_name_order_and_stop_at_the_directory_end() {
        let mut kit = Kit::new();
        let d = kit.mkdir(ROOT_INO, "d");
        for name in ["e", "a", "c", "b", "d"] {
            kit.mkfile(d, name);
        }
        // A neighbouring directory's entries are not part of d's listing.
        let after_d = kit.mkdir(ROOT_INO, "z");
        kit.mkfile(after_d, "0");
        let file = kit.mkfile(ROOT_INO, "f");
        let page = |after: Option<&str>, limit| {
            let (entries, more) = kit.store.readdir_page(d, after, limit).expect("page");
            let names: Vec<String> = entries.into_iter().map(|e| e.name).collect();
            (names, more)
        };
        assert_eq!(page(None, 2), (vec!["a".into(), "b".into()], true));
        assert_eq!(page(Some("b"), 2), (vec!["c".into(), "d".into()], true));
        assert_eq!(page(Some("d"), 2), (vec!["e".into()], false));
        assert_eq!(page(Some("e"), 2), (vec![], false));
        // Exactly the rest: no empty page needed to learn the end.
        assert_eq!(page(Some("c"), 2), (vec!["d".into(), "e".into()], false));
        // A name that is gone (or never was) still marks a position.
        assert_eq!(page(Some("bb"), 1), (vec!["c".into()], true));
        assert_eq!(page(None, usize::MAX).0.len(), 5);
        assert!(matches!(
            kit.store.readdir_page(file, None, 1),
            Err(NamespaceError::Fs(shoal_agent_api::FsError::NotDir))
        ));
    }

    #[test]
    fn damaged_record_on_disk_is_corrupt_not_a_panic() {
        let mut kit = Kit::new();
        let f = kit.mkfile(ROOT_INO, "f");
        let txn = kit.store.db.begin_write().expect("write");
        {
            let mut inodes = txn.open_table(INODES).expect("table");
            inodes.insert(f, &[1u8, 0xff, 0xff][..]).expect("insert");
        }
        txn.commit().expect("commit");
        assert!(matches!(
            kit.store.getattr(f),
            Err(NamespaceError::Corrupt(_))
        ));
        assert!(matches!(
            kit.store.lookup(ROOT_INO, "f"),
            Err(NamespaceError::Corrupt(_))
        ));
        let unlink = crate::Command::Unlink {
            parent: ROOT_INO,
            name: "f".into(),
        };
        let proposal = crate::Proposal {
            id: None,
            now: crate::testkit::at(1),
            command: unlink,
        };
        let before = kit.store.applied().expect("applied");
        let applied = kit
            .store
            .apply(&[crate::Batch::new(vec![proposal])], b"next");
        assert!(matches!(applied, Err(NamespaceError::Corrupt(_))));
        assert_eq!(
            kit.store.applied().expect("applied"),
            before,
            "nothing applied"
        );
        assert_eq!(kit.names(ROOT_INO), ["f"]);
    }
}
