//! The cold tier in the metadata: which stripes live in which object of the bucket, which
//! objects are in use or garbage, and how recently each file was used (its heat).
//!
//! A cold stripe stays a live stripe (extents reference it as before); `cold(id)` says
//! where its bytes are, and its shard slots name no node. It leaves the tier when it is
//! warmed back (`WarmStripe`) or freed (`StripesFreed`): then its object loses a user, and
//! an object with none left is garbage for the bucket's collector.
//!
//! The tables (`cold`, `objects`, `object_garbage`, `heat`, and the pins in `state`) are
//! described in `record.rs`; the snapshot carries them as `TierV6`. The page of stripes
//! that repair, drain, rebalance and ok-to-stop walk (`NamespaceStore::stripes`) leaves
//! cold stripes out, and `RelocateShards` answers `Conflict` for one. `WarmStripe` gives
//! the bytes a new stripe id rather than the old one: the holders that deleted the cold
//! stripe's shards disowned those slots, and the fences would refuse the old id there. A
//! file without heat (written before the tier existed) ages from its `mtime`.

use std::collections::{BTreeMap, VecDeque};

use redb::ReadableTable;
use shoal_agent_api::{FsError, ROOT_INO};
use shoal_placement::{NodeId, StripeId};

use crate::format::{ColdLocation, FileKind, Ino, StripeRecord, Timestamp};
use crate::record::{
    self, COLD, DIRENTS, DirentRecord, EXTENTS, ExtentRecord, HEAT, INODES, KEY_STRIPE_BYTES,
    KEY_TIER_PINS, OBJECT_GARBAGE, OBJECTS, ObjectRecord, STATE, decode, encode,
};
use crate::tx::Tx;
use crate::{NamespaceError, NamespaceStore, Outcome};

// --- applying ---

impl Tx<'_> {
    pub(crate) fn tier_pins(&self) -> Result<Vec<Ino>, NamespaceError> {
        Ok(record::read_state(&self.state, KEY_TIER_PINS)?.unwrap_or_default())
    }

    pub(crate) fn set_tier_pins(&mut self, pins: &[Ino]) -> Result<(), NamespaceError> {
        if pins.is_empty() {
            self.state.remove(KEY_TIER_PINS)?;
        } else {
            self.state
                .insert(KEY_TIER_PINS, encode(&pins.to_vec())?.as_slice())?;
        }
        Ok(())
    }

    pub(crate) fn cold(&self, id: StripeId) -> Result<Option<ColdLocation>, NamespaceError> {
        match self.cold.read()?.get(id.0)? {
            Some(v) => decode(v.value(), "cold").map(Some),
            None => Ok(None),
        }
    }

    /// Records that `ino`'s data was used now.
    pub(crate) fn touch(&mut self, ino: Ino) -> Result<(), NamespaceError> {
        let now = self.now_ms();
        self.heat.write()?.insert(ino, encode(&now)?.as_slice())?;
        Ok(())
    }

    pub(crate) fn forget_heat(&mut self, ino: Ino) -> Result<(), NamespaceError> {
        self.heat.write()?.remove(ino)?;
        Ok(())
    }

    /// Takes stripe `id` out of the cold tier, if it is there: its object loses a user.
    pub(crate) fn uncold(&mut self, id: StripeId) -> Result<(), NamespaceError> {
        let Some(loc) = self.cold(id)? else {
            return Ok(());
        };
        self.cold.write()?.remove(id.0)?;
        let found: Option<ObjectRecord> = match self.objects.read()?.get(loc.object)? {
            Some(v) => Some(decode(v.value(), "object")?),
            None => None,
        };
        let Some(mut obj) = found else {
            return Err(NamespaceError::Corrupt(format!(
                "cold stripe {id} is in object {:032x}, which is not recorded",
                loc.object
            )));
        };
        obj.stripes = obj.stripes.saturating_sub(1);
        if obj.stripes == 0 {
            self.objects.write()?.remove(loc.object)?;
            self.object_garbage
                .write()?
                .insert(loc.object, encode(&obj.size)?.as_slice())?;
        } else {
            self.objects
                .write()?
                .insert(loc.object, encode(&obj)?.as_slice())?;
        }
        Ok(())
    }
}

pub(crate) fn tier_stripes(
    tx: &mut Tx<'_>,
    object: u128,
    size: u64,
    stripes: &[(StripeId, ColdLocation)],
) -> Result<Outcome, NamespaceError> {
    // Object ids are never used twice; every location must be in this object.
    if tx.objects.read()?.get(object)?.is_some()
        || tx.object_garbage.read()?.get(object)?.is_some()
        || stripes.iter().any(|(_, l)| l.object != object)
    {
        return Err(FsError::Invalid.into());
    }
    let mut tiered = Vec::new();
    for &(id, loc) in stripes {
        let Some(mut entry) = tx.live_stripe(id)? else {
            continue;
        };
        if loc.len != entry.record.len || tx.cold(id)?.is_some() || tiered.contains(&id) {
            continue;
        }
        tx.cold.write()?.insert(id.0, encode(&loc)?.as_slice())?;
        for slot in &mut entry.record.shards {
            slot.node = NodeId::NONE;
        }
        tx.put_live_stripe(&entry)?;
        tiered.push(id);
    }
    if tiered.is_empty() {
        tx.object_garbage
            .write()?
            .insert(object, encode(&size)?.as_slice())?;
    } else {
        let rec = ObjectRecord {
            size,
            stripes: tiered.len() as u64,
        };
        tx.objects
            .write()?
            .insert(object, encode(&rec)?.as_slice())?;
    }
    Ok(Outcome::Tiered(tiered))
}

pub(crate) fn objects_deleted(
    tx: &mut Tx<'_>,
    objects: &[u128],
) -> Result<Outcome, NamespaceError> {
    for &o in objects {
        tx.object_garbage.write()?.remove(o)?;
    }
    Ok(Outcome::Done)
}

pub(crate) fn objects_orphaned(
    tx: &mut Tx<'_>,
    objects: &[(u128, u64)],
) -> Result<Outcome, NamespaceError> {
    let mut fenced = Vec::new();
    for &(id, size) in objects {
        if tx.objects.read()?.get(id)?.is_some() || tx.object_garbage.read()?.get(id)?.is_some() {
            continue;
        }
        tx.object_garbage
            .write()?
            .insert(id, encode(&size)?.as_slice())?;
        fenced.push(id);
    }
    Ok(Outcome::Orphaned(fenced))
}

pub(crate) fn record_reads(tx: &mut Tx<'_>, inos: &[Ino]) -> Result<Outcome, NamespaceError> {
    for &ino in inos {
        if tx.inode(ino)?.is_some() {
            tx.touch(ino)?;
        }
    }
    Ok(Outcome::Done)
}

pub(crate) fn warm_stripe(
    tx: &mut Tx<'_>,
    ino: Ino,
    stripe: StripeId,
    warm: &StripeRecord,
) -> Result<Outcome, NamespaceError> {
    let Some(entry) = tx.live_stripe(stripe)? else {
        return Ok(Outcome::Conflict);
    };
    if tx.cold(stripe)?.is_none() {
        return Ok(Outcome::Conflict);
    }
    if warm.len != entry.record.len || warm.id == stripe || tx.stripe_known(warm.id)? {
        return Err(FsError::Invalid.into());
    }
    if tx.is_abandoned(warm.id)? {
        return Ok(Outcome::StripeAbandoned(warm.id));
    }
    let uses: Vec<(u64, ExtentRecord)> = tx
        .extents_overlapping(ino, 0, u64::MAX)?
        .into_iter()
        .filter(|(_, e)| e.stripe == stripe)
        .collect();
    if uses.is_empty() {
        return Ok(Outcome::Conflict);
    }
    // The same bytes under a new id: every extent of the file that used the cold stripe
    // uses the warm one, at the same offsets; the cold one goes to garbage and its object
    // loses the user once it is freed.
    for (offset, ext) in &uses {
        tx.add_stripe_ref(warm)?;
        tx.put_extent(
            ino,
            *offset,
            ExtentRecord {
                stripe: warm.id,
                ..*ext
            },
        )?;
    }
    tx.change_stripe_refs(stripe, -(uses.len() as i64))?;
    // Warming is a use: the file is not cold again before `cold_after` from now.
    tx.touch(ino)?;
    Ok(Outcome::Done)
}

pub(crate) fn set_pin(tx: &mut Tx<'_>, ino: Ino, pinned: bool) -> Result<Outcome, NamespaceError> {
    if tx.inode(ino)?.is_none() {
        return Err(FsError::NotFound.into());
    }
    let mut pins = tx.tier_pins()?;
    match (pins.binary_search(&ino), pinned) {
        (Err(at), true) => pins.insert(at, ino),
        (Ok(at), false) => {
            pins.remove(at);
        }
        _ => {}
    }
    tx.set_tier_pins(&pins)?;
    Ok(Outcome::Done)
}

// --- queries ---

/// The cold tier as the metadata sees it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierSummary {
    /// Live stripes (and their bytes) on NVMe and in the bucket.
    pub hot_stripes: u64,
    pub hot_bytes: u64,
    pub cold_stripes: u64,
    pub cold_bytes: u64,
    /// Objects in use, and their bytes.
    pub objects: u64,
    pub object_bytes: u64,
    /// Objects no stripe uses, waiting to be deleted from the bucket.
    pub garbage_objects: u64,
    pub garbage_bytes: u64,
}

/// What the metadata says of the bucket (see `cold_inventory`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ColdInventory {
    /// Live cold stripes and where their bytes are.
    pub stripes: Vec<(StripeId, ColdLocation)>,
    /// Objects in use: id → size.
    pub objects: BTreeMap<u128, u64>,
    /// Objects no stripe uses, not deleted from the bucket yet.
    pub garbage: Vec<u128>,
}

/// A file with data in stripes, as the mover and `tier status` see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TierFile {
    pub ino: Ino,
    /// Its names, from the root (a file with hard links has several).
    pub paths: Vec<String>,
    /// Bytes of its extents on NVMe and in the bucket.
    pub hot_bytes: u64,
    pub cold_bytes: u64,
    /// The cluster clock when it was last written or read; None for a file not used since
    /// heat was first recorded (the mover goes by `mtime` then).
    pub heat_ms: Option<u64>,
    pub mtime: Timestamp,
    /// Pinned (`shoal tier pin`) itself or through a directory above one of its names.
    pub pinned: bool,
}

impl NamespaceStore {
    /// Where cold stripe `id`'s bytes are; None when it is on NVMe (or unknown).
    pub fn cold_location(&self, id: StripeId) -> Result<Option<ColdLocation>, NamespaceError> {
        let txn = self.read()?;
        match txn.open_table(COLD)?.get(id.0)? {
            Some(v) => decode(v.value(), "cold").map(Some),
            None => Ok(None),
        }
    }

    pub fn tier_summary(&self) -> Result<TierSummary, NamespaceError> {
        let txn = self.read()?;
        let mut s = TierSummary::default();
        let live = txn.open_table(crate::record::STRIPES)?;
        for item in txn.open_table(COLD)?.iter()? {
            let (id, value) = item?;
            // A cold stripe in garbage is no file's data any more.
            if live.get(id.value())?.is_none() {
                continue;
            }
            let loc: ColdLocation = decode(value.value(), "cold")?;
            s.cold_stripes += 1;
            s.cold_bytes += loc.len;
        }
        for item in txn.open_table(OBJECTS)?.iter()? {
            let obj: ObjectRecord = decode(item?.1.value(), "object")?;
            s.objects += 1;
            s.object_bytes += obj.size;
        }
        for item in txn.open_table(OBJECT_GARBAGE)?.iter()? {
            let size: u64 = decode(item?.1.value(), "object garbage")?;
            s.garbage_objects += 1;
            s.garbage_bytes += size;
        }
        let live = redb::ReadableTableMetadata::len(&live)?;
        let live_bytes = record::read_state_u64(&txn.open_table(STATE)?, KEY_STRIPE_BYTES, 0)?;
        s.hot_stripes = live.saturating_sub(s.cold_stripes);
        s.hot_bytes = live_bytes.saturating_sub(s.cold_bytes);
        Ok(s)
    }

    /// Everything the metadata says of the bucket, for an audit against what the bucket
    /// holds: where each live cold stripe's bytes are, the objects in use (id → size) and
    /// the garbage objects not deleted yet.
    pub fn cold_inventory(&self) -> Result<ColdInventory, NamespaceError> {
        let txn = self.read()?;
        let mut inv = ColdInventory::default();
        let live = txn.open_table(crate::record::STRIPES)?;
        for item in txn.open_table(COLD)?.iter()? {
            let (id, value) = item?;
            if live.get(id.value())?.is_some() {
                inv.stripes
                    .push((StripeId(id.value()), decode(value.value(), "cold")?));
            }
        }
        for item in txn.open_table(OBJECTS)?.iter()? {
            let (id, value) = item?;
            let obj: ObjectRecord = decode(value.value(), "object")?;
            inv.objects.insert(id.value(), obj.size);
        }
        for item in txn.open_table(OBJECT_GARBAGE)?.iter()? {
            inv.garbage.push(item?.0.value());
        }
        Ok(inv)
    }

    /// Up to `limit` garbage objects (id, size).
    pub fn object_garbage(&self, limit: usize) -> Result<Vec<(u128, u64)>, NamespaceError> {
        let txn = self.read()?;
        let mut out = Vec::new();
        for item in txn.open_table(OBJECT_GARBAGE)?.iter()?.take(limit) {
            let (k, v) = item?;
            out.push((k.value(), decode(v.value(), "object garbage")?));
        }
        Ok(out)
    }

    /// True when the metadata knows object `id` (in use or garbage): an object in the
    /// bucket it does not know was uploaded by a mover that never committed it.
    pub fn object_known(&self, id: u128) -> Result<bool, NamespaceError> {
        let txn = self.read()?;
        Ok(txn.open_table(OBJECTS)?.get(id)?.is_some()
            || txn.open_table(OBJECT_GARBAGE)?.get(id)?.is_some())
    }

    /// The regular files among `inos` and below the directories among them, each once.
    pub fn files_below(&self, inos: &[Ino]) -> Result<Vec<Ino>, NamespaceError> {
        let txn = self.read()?;
        let dirents = txn.open_table(DIRENTS)?;
        let inodes = txn.open_table(INODES)?;
        let mut out = std::collections::BTreeSet::new();
        let mut dirs = VecDeque::new();
        for &ino in inos {
            match record::read_inode_or_root(&inodes, ino)? {
                Some(node) if node.kind == FileKind::Dir => dirs.push_back(ino),
                Some(node) if node.kind == FileKind::File => {
                    out.insert(ino);
                }
                Some(_) => {}
                None => return Err(FsError::NotFound.into()),
            }
        }
        while let Some(dir) = dirs.pop_front() {
            for item in dirents.range((dir, "")..)? {
                let (key, value) = item?;
                if key.value().0 != dir {
                    break;
                }
                let entry: DirentRecord = decode(value.value(), "dirent")?;
                match entry.kind {
                    FileKind::Dir => dirs.push_back(entry.ino),
                    FileKind::File => {
                        out.insert(entry.ino);
                    }
                    _ => {}
                }
            }
        }
        Ok(out.into_iter().collect())
    }

    /// Every regular file with extents reachable from the root, with its names, hot and
    /// cold bytes and heat: one walk of the tree.
    pub fn tier_files(&self) -> Result<Vec<TierFile>, NamespaceError> {
        let txn = self.read()?;
        let dirents = txn.open_table(DIRENTS)?;
        let inodes = txn.open_table(INODES)?;
        let extents = txn.open_table(EXTENTS)?;
        let cold = txn.open_table(COLD)?;
        let heat = txn.open_table(HEAT)?;
        let pins: Vec<Ino> =
            record::read_state(&txn.open_table(STATE)?, KEY_TIER_PINS)?.unwrap_or_default();
        let pinned = |ino: Ino| pins.binary_search(&ino).is_ok();
        let mut files: BTreeMap<Ino, TierFile> = BTreeMap::new();
        let mut dirs = VecDeque::from([(ROOT_INO, String::new(), pinned(ROOT_INO))]);
        while let Some((dir, path, dir_pinned)) = dirs.pop_front() {
            for item in dirents.range((dir, "")..)? {
                let (key, value) = item?;
                let (parent, name) = key.value();
                if parent != dir {
                    break;
                }
                let entry: DirentRecord = decode(value.value(), "dirent")?;
                let child = format!("{path}/{name}");
                let child_pinned = dir_pinned || pinned(entry.ino);
                match entry.kind {
                    FileKind::Dir => dirs.push_back((entry.ino, child, child_pinned)),
                    FileKind::File => {
                        if let Some(f) = files.get_mut(&entry.ino) {
                            f.paths.push(child);
                            f.pinned |= child_pinned;
                            continue;
                        }
                        let Some(node) = record::read_inode(&inodes, entry.ino)? else {
                            continue;
                        };
                        let (mut hot_bytes, mut cold_bytes) = (0, 0);
                        for item in extents.range((entry.ino, 0)..=(entry.ino, u64::MAX))? {
                            let ext: ExtentRecord = decode(item?.1.value(), "extent")?;
                            if cold.get(ext.stripe.0)?.is_some() {
                                cold_bytes += ext.len;
                            } else {
                                hot_bytes += ext.len;
                            }
                        }
                        if hot_bytes + cold_bytes == 0 {
                            continue;
                        }
                        let heat_ms = match heat.get(entry.ino)? {
                            Some(v) => Some(decode(v.value(), "heat")?),
                            None => None,
                        };
                        files.insert(
                            entry.ino,
                            TierFile {
                                ino: entry.ino,
                                paths: vec![child],
                                hot_bytes,
                                cold_bytes,
                                heat_ms,
                                mtime: node.mtime,
                                pinned: child_pinned,
                            },
                        );
                    }
                    _ => {}
                }
            }
        }
        Ok(files.into_values().collect())
    }
}

/// The cold locations of `ids` that are cold, read in `txn`.
pub(crate) fn cold_of(
    txn: &redb::ReadTransaction,
    ids: impl Iterator<Item = StripeId>,
) -> Result<BTreeMap<StripeId, ColdLocation>, NamespaceError> {
    let table = txn.open_table(COLD)?;
    let mut out = BTreeMap::new();
    for id in ids {
        if let Some(v) = table.get(id.0)? {
            out.insert(id, decode(v.value(), "cold")?);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use shoal_agent_api::ROOT_INO;
    use shoal_placement::{NodeId, StripeId};

    use crate::format::ColdLocation;
    use crate::testkit::{Kit, extent, stripe};
    use crate::{Command, Outcome};

    fn loc(object: u128, offset: u64, len: u64) -> ColdLocation {
        ColdLocation {
            object,
            offset,
            len,
            crc32c: 7,
        }
    }

    fn tier(kit: &mut Kit, object: u128, stripes: Vec<(u128, ColdLocation)>) -> Vec<StripeId> {
        let stripes = stripes.into_iter().map(|(s, l)| (StripeId(s), l)).collect();
        match kit.run(Command::TierStripes {
            object,
            size: 1000,
            stripes,
        }) {
            Outcome::Tiered(ids) => ids,
            other => panic!("{other:?}"),
        }
    }

    /// Two files: f on stripes 1 and 2, g on stripe 3.
    fn two_files() -> (Kit, u64, u64) {
        let mut kit = Kit::stamped();
        let f = kit.mkfile(ROOT_INO, "f");
        kit.write_extents(f, vec![extent(0, 10, 1), extent(10, 10, 2)]);
        let g = kit.mkfile(ROOT_INO, "g");
        kit.write_extents(g, vec![extent(0, 10, 3)]);
        (kit, f, g)
    }

    #[test]
    fn tiered_stripes_name_no_node_and_reads_find_their_object() {
        let (mut kit, f, _) = two_files();
        let ids = tier(
            &mut kit,
            50,
            vec![(1, loc(50, 16, 10)), (3, loc(50, 26, 10))],
        );
        assert_eq!(ids, [StripeId(1), StripeId(3)]);
        let data = kit.store.file_data(f).expect("data");
        assert_eq!(data.cold.get(&StripeId(1)), Some(&loc(50, 16, 10)));
        assert!(!data.cold.contains_key(&StripeId(2)));
        let rec = kit
            .store
            .live_stripe(StripeId(1))
            .expect("q")
            .expect("live");
        assert!(rec.shards.iter().all(|s| s.node.is_none()));
        // Repair, drain and ok-to-stop page over hot stripes only.
        let hot: Vec<_> = kit
            .store
            .stripes(None, 10)
            .expect("page")
            .iter()
            .map(|r| r.id)
            .collect();
        assert_eq!(hot, [StripeId(2)]);
        let s = kit.store.tier_summary().expect("summary");
        assert_eq!(
            (s.cold_stripes, s.cold_bytes, s.hot_stripes, s.hot_bytes),
            (2, 20, 1, 10)
        );
        assert_eq!((s.objects, s.object_bytes, s.garbage_objects), (1, 1000, 0));
        // A repair commit for a cold stripe's slot is refused.
        let relocate = Command::RelocateShards {
            stripe: StripeId(1),
            moves: vec![crate::ShardMove {
                index: 0,
                from: NodeId::NONE,
                to: NodeId(5),
                crc32c: 0,
            }],
        };
        assert_eq!(kit.run(relocate), Outcome::Conflict);
    }

    #[test]
    fn an_object_is_garbage_once_its_last_stripe_is_freed_and_only_then() {
        let (mut kit, f, g) = two_files();
        tier(
            &mut kit,
            50,
            vec![(1, loc(50, 16, 10)), (3, loc(50, 26, 10))],
        );
        // Deleting g makes stripe 3 garbage; the object still has a user until it is
        // freed, and then still stripe 1.
        kit.run(Command::Unlink {
            parent: ROOT_INO,
            name: "g".into(),
        });
        kit.run(Command::Purge { ino: g });
        assert_eq!(kit.garbage_ids(), [3]);
        kit.run(Command::StripesFreed {
            ids: vec![StripeId(3)],
        });
        let s = kit.store.tier_summary().expect("summary");
        assert_eq!((s.cold_stripes, s.objects, s.garbage_objects), (1, 1, 0));
        let inv = kit.store.cold_inventory().expect("inventory");
        assert_eq!(inv.stripes, [(StripeId(1), loc(50, 16, 10))]);
        assert_eq!(inv.objects, BTreeMap::from([(50, 1000)]));
        assert!(inv.garbage.is_empty());
        // Overwriting f's first extent frees stripe 1: the object is garbage now.
        kit.write_extents(f, vec![extent(0, 10, 9)]);
        kit.run(Command::StripesFreed {
            ids: vec![StripeId(1)],
        });
        let s = kit.store.tier_summary().expect("summary");
        assert_eq!(
            (
                s.cold_stripes,
                s.objects,
                s.garbage_objects,
                s.garbage_bytes
            ),
            (0, 0, 1, 1000)
        );
        assert_eq!(kit.store.object_garbage(10).expect("q"), [(50, 1000)]);
        let inv = kit.store.cold_inventory().expect("inventory");
        assert!(inv.stripes.is_empty() && inv.objects.is_empty());
        assert_eq!(inv.garbage, [50]);
        assert!(kit.store.object_known(50).expect("q"));
        kit.run(Command::ObjectsDeleted { objects: vec![50] });
        assert!(kit.store.object_garbage(10).expect("q").is_empty());
        assert!(!kit.store.object_known(50).expect("q"));
    }

    #[test]
    fn an_upload_whose_stripes_all_went_meanwhile_is_garbage_at_once() {
        let (mut kit, _, _) = two_files();
        let ids = tier(&mut kit, 60, vec![(77, loc(60, 16, 10))]);
        assert!(ids.is_empty(), "stripe 77 is not live");
        assert_eq!(kit.store.object_garbage(10).expect("q"), [(60, 1000)]);
        // Object ids are never reused, and each location must be in the object named.
        let again = Command::TierStripes {
            object: 60,
            size: 1,
            stripes: vec![],
        };
        assert_eq!(kit.fail(again), crate::format::FsError::Invalid);
        let mixed = Command::TierStripes {
            object: 61,
            size: 1,
            stripes: vec![(StripeId(2), loc(62, 16, 10))],
        };
        assert_eq!(kit.fail(mixed), crate::format::FsError::Invalid);
        // A stripe already cold, or of another length, is not tiered again.
        tier(&mut kit, 63, vec![(2, loc(63, 16, 10))]);
        assert!(tier(&mut kit, 64, vec![(2, loc(64, 16, 10))]).is_empty());
        assert!(tier(&mut kit, 65, vec![(1, loc(65, 16, 11))]).is_empty());
    }

    #[test]
    fn an_orphaned_object_is_fenced_against_a_late_commit_and_a_committed_one_is_kept() {
        let (mut kit, _, _) = two_files();
        tier(&mut kit, 50, vec![(1, loc(50, 16, 10))]);
        let out = kit.run(Command::ObjectsOrphaned {
            objects: vec![(50, 1000), (70, 300)],
        });
        assert_eq!(out, Outcome::Orphaned(vec![70]), "50 is in use");
        assert_eq!(kit.store.object_garbage(10).expect("q"), [(70, 300)]);
        // The lost upload's commit arrives late: refused, nothing cold.
        let late = Command::TierStripes {
            object: 70,
            size: 300,
            stripes: vec![(StripeId(2), loc(70, 16, 10))],
        };
        assert_eq!(kit.fail(late), crate::format::FsError::Invalid);
        assert_eq!(kit.store.cold_location(StripeId(2)).expect("q"), None);
    }

    #[test]
    fn a_warmed_stripe_replaces_the_cold_one_in_the_file_and_frees_its_object() {
        let (mut kit, f, g) = two_files();
        tier(&mut kit, 50, vec![(1, loc(50, 16, 10))]);
        let warm = |ino, with: u128| Command::WarmStripe {
            ino,
            stripe: StripeId(1),
            warm: stripe(with, 10),
        };
        // Another file does not use stripe 1; the new stripe must be new and as long.
        assert_eq!(kit.run(warm(g, 40)), Outcome::Conflict);
        assert_eq!(kit.fail(warm(f, 2)), crate::format::FsError::Invalid);
        assert_eq!(kit.run(warm(f, 40)), Outcome::Done);
        let data = kit.store.file_data(f).expect("data");
        let ids: Vec<_> = data.extents.iter().map(|e| e.stripe.id).collect();
        assert_eq!(ids, [StripeId(40), StripeId(2)]);
        assert!(data.cold.is_empty());
        assert_eq!(kit.garbage_ids(), [1]);
        let s = kit.store.tier_summary().expect("summary");
        assert_eq!(
            (s.cold_stripes, s.cold_bytes, s.objects),
            (0, 0, 1),
            "garbage is not cold data"
        );
        // Warming it again finds it no longer live there.
        assert_eq!(kit.run(warm(f, 41)), Outcome::Conflict);
        kit.run(Command::StripesFreed {
            ids: vec![StripeId(1)],
        });
        let s = kit.store.tier_summary().expect("summary");
        assert_eq!((s.cold_stripes, s.objects, s.garbage_objects), (0, 0, 1));
    }

    #[test]
    fn heat_follows_writes_and_recorded_reads_on_the_cluster_clock() {
        let (mut kit, f, g) = two_files();
        let heat = |kit: &Kit, ino| {
            kit.store
                .tier_files()
                .expect("files")
                .into_iter()
                .find(|t| t.ino == ino)
                .and_then(|t| t.heat_ms)
        };
        let written = heat(&kit, g).expect("a write sets heat");
        assert!(heat(&kit, f).expect("heat") < written);
        kit.clock += 50;
        kit.run(Command::RecordReads { inos: vec![f, 999] });
        assert!(heat(&kit, f).expect("heat") > written);
        let files = kit.store.tier_files().expect("files");
        let names: Vec<_> = files.iter().map(|t| t.paths.clone()).collect();
        assert_eq!(names, [vec!["/f".to_owned()], vec!["/g".to_owned()]]);
        assert_eq!((files[0].hot_bytes, files[0].cold_bytes), (20, 0));
    }

    #[test]
    fn a_pinned_directory_pins_everything_below_it() {
        let mut kit = Kit::stamped();
        let d = kit.mkdir(ROOT_INO, "d");
        let e = kit.mkdir(d, "e");
        let a = kit.mkfile(e, "a");
        kit.write_extents(a, vec![extent(0, 10, 1)]);
        let b = kit.mkfile(ROOT_INO, "b");
        kit.write_extents(b, vec![extent(0, 10, 2)]);
        let pinned = |kit: &Kit| -> Vec<(String, bool)> {
            kit.store
                .tier_files()
                .expect("files")
                .into_iter()
                .map(|t| (t.paths[0].clone(), t.pinned))
                .collect()
        };
        assert_eq!(
            pinned(&kit),
            [("/d/e/a".into(), false), ("/b".into(), false)]
        );
        assert_eq!(
            kit.run(Command::SetPin {
                ino: d,
                pinned: true
            }),
            Outcome::Done
        );
        assert_eq!(
            pinned(&kit),
            [("/d/e/a".into(), true), ("/b".into(), false)]
        );
        kit.run(Command::SetPin {
            ino: b,
            pinned: true,
        });
        kit.run(Command::SetPin {
            ino: d,
            pinned: false,
        });
        assert_eq!(
            pinned(&kit),
            [("/d/e/a".into(), false), ("/b".into(), true)]
        );
        assert_eq!(
            kit.fail(Command::SetPin {
                ino: 999,
                pinned: true
            }),
            crate::format::FsError::NotFound
        );
    }

    #[test]
    fn the_tier_travels_in_snapshots() {
        let (mut kit, f, _) = two_files();
        tier(&mut kit, 50, vec![(1, loc(50, 16, 10))]);
        kit.run(Command::RecordReads { inos: vec![f] });
        kit.run(Command::SetPin {
            ino: f,
            pinned: true,
        });
        let other = Kit::new();
        other
            .store
            .install(&kit.store.snapshot().expect("snapshot"))
            .expect("install");
        assert_eq!(
            other.store.tier_summary().expect("s"),
            kit.store.tier_summary().expect("s")
        );
        assert_eq!(
            other.store.tier_files().expect("f"),
            kit.store.tier_files().expect("f")
        );
        assert_eq!(
            other.store.cold_location(StripeId(1)).expect("q"),
            Some(loc(50, 16, 10))
        );
    }
}
