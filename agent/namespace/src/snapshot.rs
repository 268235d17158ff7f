//! Whole-state snapshots for Raft: a consistent export and an atomic install.
//!
//! Format: the magic `SHMS`, one version byte ([`SNAPSHOT_VERSION`]), then the postcard
//! encoding of [`SnapshotV1`], then (version 8) of [`Tail`] — sessions on the cluster
//! clock, the clock itself, abandoned stripes, node generations ([`TailV3`]), disowned
//! shards ([`DisownedV4`]), operators' node records ([`NodesV5`]), the cold tier and file
//! heat ([`TierV6`]), revoked certificates ([`SecurityV7`]), directory leases
//! ([`LeasesV8`]) — and the crc32c of all the bytes before it (u32 little-endian) at the
//! end. A state that never had a directory lease is written as version 7 (without the last
//! part), so agents of the release before leases can install it during a rolling upgrade.
//! Each version appended one part to the
//! tail, so an older one installs with the later parts empty: version 7 ended after the
//! revoked certificates, version 6 after the
//! cold tier, version 5 after the node records, version 4 after
//! the disowned shards, version 3 after [`TailV3`]; version 2 carried [`ClientsV2`]
//! (sessions on proposers' wall clocks; installed as last seen at cluster time 0),
//! version 1 neither that nor a checksum. Records inside are decoded (and so checked) on
//! install.

use crate::format::{ColdLocation, Ino, RequestId, StripeRecord, Timestamp};
use redb::{
    Durability, ReadTransaction, ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction,
};
use serde::{Deserialize, Serialize};
use shoal_placement::Layout;

use crate::lease::{DirLease, InoRanges};
use crate::nodes::NodeAdmins;
use crate::record::{
    self, ABANDONED, COLD, ClockRecord, DEDUP, DIR_LEASES, DIRENTS, DISOWNED, DirentRecord,
    EXTENTS, ExtentRecord, FIRST_INO, GARBAGE, GENERATIONS, HEAT, INO_RANGES, INODES, InodeRecord,
    KEY_ABANDON_SWEEP, KEY_APPLIED, KEY_CLIENT_SWEEP, KEY_CLOCK, KEY_DISOWN_SWEEP, KEY_LAYOUT,
    KEY_LEASE_EPOCH, KEY_NEXT_INO, KEY_NODE_ADMIN, KEY_REVOKED, KEY_STRIPE_BYTES, KEY_TIER_PINS,
    LEGACY_CLIENTS, OBJECT_GARBAGE, OBJECTS, ORPHANS, ObjectRecord, SESSIONS, STATE, STRIPES,
    StripeEntry, decode, decode_exact, encode,
};
use crate::{NamespaceError, NamespaceStore, Outcome};

const MAGIC: &[u8; 4] = b"SHMS";
const SNAPSHOT_VERSION: u8 = 8;

/// Everything the state machine held in version 1 (later versions append a tail).
#[derive(Debug, Default, Serialize, Deserialize)]
struct SnapshotV1 {
    applied: Option<Vec<u8>>,
    next_ino: Ino,
    layout: Option<Layout>,
    inodes: Vec<(Ino, InodeRecord)>,
    dirents: Vec<(Ino, String, DirentRecord)>,
    extents: Vec<(Ino, u64, ExtentRecord)>,
    stripes: Vec<StripeEntry>,
    garbage: Vec<StripeRecord>,
    orphans: Vec<(Ino, Timestamp)>,
    dedup: Vec<(RequestId, Outcome)>,
}

/// Every row of a table, decoded.
fn rows<K, V, T>(
    table: &impl ReadableTable<K, &'static [u8]>,
    what: &str,
    mut row: impl FnMut(K::SelfType<'_>, V) -> T,
) -> Result<Vec<T>, NamespaceError>
where
    K: redb::Key + 'static,
    V: serde::de::DeserializeOwned,
{
    let mut out = Vec::new();
    for item in table.iter()? {
        let (key, value) = item?;
        out.push(row(key.value(), decode(value.value(), what)?));
    }
    Ok(out)
}

/// Every table, decoded, as of `txn`.
fn export(txn: &ReadTransaction) -> Result<(SnapshotV1, Tail), NamespaceError> {
    let state = txn.open_table(STATE)?;
    let layout = match state.get(KEY_LAYOUT)? {
        Some(guard) => Some(decode(guard.value(), "layout")?),
        None => None,
    };
    let snap = SnapshotV1 {
        applied: state.get(KEY_APPLIED)?.map(|g| g.value().to_vec()),
        next_ino: record::read_state_u64(&state, KEY_NEXT_INO, FIRST_INO)?,
        layout,
        inodes: rows(&txn.open_table(INODES)?, "inode", |k, v| (k, v))?,
        dirents: rows(&txn.open_table(DIRENTS)?, "dirent", |(d, n), v| {
            (d, n.to_owned(), v)
        })?,
        extents: rows(&txn.open_table(EXTENTS)?, "extent", |(i, o), v| (i, o, v))?,
        stripes: rows(&txn.open_table(STRIPES)?, "stripe", |_, v| v)?,
        garbage: rows(&txn.open_table(GARBAGE)?, "garbage", |_, v| v)?,
        orphans: rows(&txn.open_table(ORPHANS)?, "orphan", |k, v| (k, v))?,
        dedup: rows(&txn.open_table(DEDUP)?, "dedup", |(client, seq), v| {
            (RequestId { client, seq }, v)
        })?,
    };
    let tail = Tail {
        base: TailV3 {
            sessions: rows(&txn.open_table(SESSIONS)?, "session", |k, v| (k, v))?,
            sweep: record::read_state_u64(&state, KEY_CLIENT_SWEEP, 0)?,
            clock: record::read_state(&state, KEY_CLOCK)?.unwrap_or_default(),
            abandoned: rows(&txn.open_table(ABANDONED)?, "abandoned", |k, v| (k, v))?,
            abandon_sweep: record::read_state(&state, KEY_ABANDON_SWEEP)?.unwrap_or(0),
            generations: rows(&txn.open_table(GENERATIONS)?, "generation", |k, v| (k, v))?,
        },
        disowned: DisownedV4 {
            disowned: rows(&txn.open_table(DISOWNED)?, "disowned", |k, v| (k, v))?,
            disown_sweep: record::read_state(&state, KEY_DISOWN_SWEEP)?.unwrap_or(0),
        },
        nodes: NodesV5 {
            admins: record::read_state(&state, KEY_NODE_ADMIN)?.unwrap_or_default(),
        },
        tier: TierV6 {
            cold: rows(&txn.open_table(COLD)?, "cold", |k, v| (k, v))?,
            objects: rows(&txn.open_table(OBJECTS)?, "object", |k, v| (k, v))?,
            object_garbage: rows(
                &txn.open_table(OBJECT_GARBAGE)?,
                "object garbage",
                |k, v| (k, v),
            )?,
            heat: rows(&txn.open_table(HEAT)?, "heat", |k, v| (k, v))?,
            pins: record::read_state(&state, KEY_TIER_PINS)?.unwrap_or_default(),
        },
        security: SecurityV7 {
            revoked: record::read_state(&state, KEY_REVOKED)?.unwrap_or_default(),
        },
        leases: LeasesV8 {
            leases: rows(&txn.open_table(DIR_LEASES)?, "directory lease", |k, v| {
                (k, v)
            })?,
            epoch: record::read_state_u64(&state, KEY_LEASE_EPOCH, 0)?,
            ranges: rows(&txn.open_table(INO_RANGES)?, "inode ranges", |k, v| (k, v))?,
        },
    };
    Ok((snap, tail))
}

impl NamespaceStore {
    /// A consistent export of the whole state, including the applied marker: one read
    /// transaction, so the marker is exactly the position the exported rows reflect
    /// (read it back with [`snapshot_marker`]).
    pub fn snapshot(&self) -> Result<Vec<u8>, NamespaceError> {
        let txn = self.db.begin_read()?;
        let (snap, tail) = export(&txn)?;
        let mut out = MAGIC.to_vec();
        out.push(if tail.leases.is_empty() {
            7
        } else {
            SNAPSHOT_VERSION
        });
        let encoding = |source| NamespaceError::Encode {
            what: "the snapshot",
            source,
        };
        let out = postcard::to_extend(&snap, out).map_err(encoding)?;
        let out = postcard::to_extend(&tail, out).map_err(encoding)?;
        let mut out = tail.leases.extend(out).map_err(encoding)?;
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        Ok(out)
    }

    /// The applied marker and a digest (crc32c) of everything else, read in one
    /// transaction.
    /// Two replicas that applied the same log up to the same marker have the same digest;
    /// a replica that missed an entry (or installed a snapshot that claimed more than it
    /// held) has another one.
    pub fn digest(&self) -> Result<(Option<Vec<u8>>, u64), NamespaceError> {
        let txn = self.db.begin_read()?;
        let (mut snap, tail) = export(&txn)?;
        let applied = snap.applied.take();
        let encoding = |source| NamespaceError::Encode {
            what: "the state",
            source,
        };
        let bytes = postcard::to_extend(&snap, Vec::new()).map_err(encoding)?;
        let bytes = postcard::to_extend(&tail, bytes).map_err(encoding)?;
        let bytes = tail.leases.extend(bytes).map_err(encoding)?;
        Ok((applied, u64::from(crc32c::crc32c(&bytes))))
    }

    /// Replaces the whole state with `snapshot`, atomically. Bytes that are not a snapshot
    /// of a known version are refused with [`NamespaceError::Corrupt`] and change nothing.
    pub fn install(&self, snapshot: &[u8]) -> Result<(), NamespaceError> {
        let (snap, tail) = parse(snapshot)?;
        let mut txn = self.db.begin_write()?;
        txn.set_durability(Durability::Immediate)?;
        write_all(&txn, &snap, &tail)?;
        txn.commit()?;
        Ok(())
    }
}

/// The applied marker a snapshot carries (how far it covers the log), read without
/// decoding the rest: it is the first field of every version's body.
pub fn snapshot_marker(snapshot: &[u8]) -> Result<Option<Vec<u8>>, NamespaceError> {
    let (_, body) = body(snapshot)?;
    postcard::take_from_bytes::<Option<Vec<u8>>>(body)
        .map(|(marker, _)| marker)
        .map_err(|e| NamespaceError::Corrupt(format!("snapshot marker: {e}")))
}

/// Version 2's tail: sessions on the proposers' wall clocks, and the sweep's position.
#[derive(Debug, Default, Serialize, Deserialize)]
struct ClientsV2 {
    clients: Vec<(u64, Timestamp)>,
    sweep: u64,
}

/// The tail's first part (all of it in version 3): sessions on the cluster clock
/// (milliseconds), the idle-session sweep's position, the cluster clock, abandoned stripes
/// with their sweep position, node generations.
#[derive(Debug, Default, Serialize, Deserialize)]
struct TailV3 {
    sessions: Vec<(u64, u64)>,
    sweep: u64,
    clock: ClockRecord,
    abandoned: Vec<(u128, u64)>,
    abandon_sweep: u128,
    generations: Vec<(u64, u64)>,
}

/// Appended by version 4: disowned shards with their sweep position.
#[derive(Debug, Default, Serialize, Deserialize)]
struct DisownedV4 {
    disowned: Vec<((u128, u8, u64), u64)>,
    disown_sweep: u128,
}

/// Appended by version 5: what operators asked of each node.
#[derive(Debug, Default, Serialize, Deserialize)]
struct NodesV5 {
    admins: NodeAdmins,
}

/// Appended by version 6: cold stripes, the objects they are in, garbage objects (with
/// their sizes) and file heat.
#[derive(Debug, Default, Serialize, Deserialize)]
struct TierV6 {
    cold: Vec<(u128, ColdLocation)>,
    objects: Vec<(u128, ObjectRecord)>,
    object_garbage: Vec<(u128, u64)>,
    heat: Vec<(u64, u64)>,
    pins: Vec<u64>,
}

/// Appended by version 7: revoked certificates.
#[derive(Debug, Default, Serialize, Deserialize)]
struct SecurityV7 {
    revoked: Vec<crate::RevokedName>,
}

/// Appended by version 8: directory leases, the last epoch granted, and the inode
/// numbers handed out to lease holders.
#[derive(Debug, Default, Serialize, Deserialize)]
struct LeasesV8 {
    leases: Vec<(u64, DirLease)>,
    epoch: u64,
    ranges: Vec<(u64, InoRanges)>,
}

impl LeasesV8 {
    /// No lease was ever granted and no numbers handed out: the part is left out
    /// (version 7).
    fn is_empty(&self) -> bool {
        self.leases.is_empty() && self.epoch == 0 && self.ranges.is_empty()
    }

    /// `out` with this part appended, unless it is empty.
    fn extend(&self, out: Vec<u8>) -> Result<Vec<u8>, postcard::Error> {
        if self.is_empty() {
            Ok(out)
        } else {
            postcard::to_extend(self, out)
        }
    }
}

/// The tail as this version writes it: its parts one after another (postcard encodes a
/// struct as its fields in order, so each version's bytes begin with the previous one's).
/// The last part, `leases`, is encoded on its own, only when there is one (see
/// [`LeasesV8::extend`]).
#[derive(Debug, Default, Serialize, Deserialize)]
struct Tail {
    base: TailV3,
    disowned: DisownedV4,
    nodes: NodesV5,
    tier: TierV6,
    security: SecurityV7,
    #[serde(skip)]
    leases: LeasesV8,
}

impl From<ClientsV2> for Tail {
    fn from(v2: ClientsV2) -> Tail {
        Tail {
            base: TailV3 {
                sessions: v2.clients.into_iter().map(|(c, _)| (c, 0)).collect(),
                sweep: v2.sweep,
                ..TailV3::default()
            },
            ..Tail::default()
        }
    }
}

/// One part of a tail, and the bytes after it.
fn take_part<'b, T: serde::de::DeserializeOwned>(
    bytes: &'b [u8],
    what: &str,
) -> Result<(T, &'b [u8]), NamespaceError> {
    postcard::take_from_bytes(bytes).map_err(|e| NamespaceError::Corrupt(format!("{what}: {e}")))
}

/// A version 3 or later tail: the parts that version has, the later ones empty.
fn parse_tail(version: u8, bytes: &[u8]) -> Result<Tail, NamespaceError> {
    let (base, rest) = take_part(bytes, "snapshot tail")?;
    let (disowned, rest) = match version {
        3 => (DisownedV4::default(), rest),
        _ => take_part(rest, "snapshot disowned shards")?,
    };
    let (nodes, rest) = match version {
        3 | 4 => (NodesV5::default(), rest),
        _ => take_part(rest, "snapshot node records")?,
    };
    let (tier, rest) = match version {
        3..=5 => (TierV6::default(), rest),
        _ => take_part(rest, "snapshot cold tier")?,
    };
    let (security, rest) = match version {
        3..=6 => (SecurityV7::default(), rest),
        _ => take_part(rest, "snapshot revoked certificates")?,
    };
    let (leases, rest) = match version {
        3..=7 => (LeasesV8::default(), rest),
        _ => take_part(rest, "snapshot directory leases")?,
    };
    if !rest.is_empty() {
        return Err(NamespaceError::Corrupt(format!(
            "snapshot tail: {} bytes left over",
            rest.len()
        )));
    }
    Ok(Tail {
        base,
        disowned,
        nodes,
        tier,
        security,
        leases,
    })
}

/// The version byte and the body after it (checked against its checksum from version 2).
fn body(bytes: &[u8]) -> Result<(u8, &[u8]), NamespaceError> {
    let Some(rest) = bytes.strip_prefix(MAGIC.as_slice()) else {
        return Err(NamespaceError::Corrupt(
            "not a metadata snapshot (bad magic)".into(),
        ));
    };
    match rest.split_first() {
        Some((1, body)) => Ok((1, body)),
        Some((&v, body)) if (2..=SNAPSHOT_VERSION).contains(&v) => {
            let Some((body, crc)) = body.split_last_chunk::<4>() else {
                return Err(NamespaceError::Corrupt("snapshot truncated".into()));
            };
            let covered = &bytes[..bytes.len() - 4];
            if crc32c::crc32c(covered) != u32::from_le_bytes(*crc) {
                return Err(NamespaceError::Corrupt("snapshot checksum mismatch".into()));
            }
            Ok((v, body))
        }
        Some((v, _)) => Err(NamespaceError::Corrupt(format!(
            "snapshot version {v} unknown (this build reads 1 to {SNAPSHOT_VERSION})"
        ))),
        None => Err(NamespaceError::Corrupt("snapshot truncated".into())),
    }
}

fn parse(bytes: &[u8]) -> Result<(SnapshotV1, Tail), NamespaceError> {
    let (version, body) = body(bytes)?;
    if version == 1 {
        return Ok((decode_exact(body, "snapshot")?, Tail::default()));
    }
    let (snap, rest) = postcard::take_from_bytes(body)
        .map_err(|e| NamespaceError::Corrupt(format!("snapshot: {e}")))?;
    let tail = match version {
        2 => decode_exact::<ClientsV2>(rest, "snapshot clients")?.into(),
        v => parse_tail(v, rest)?,
    };
    Ok((snap, tail))
}

/// Reads a snapshot as `install` would, without writing anything.
pub(crate) fn check(bytes: &[u8]) -> Result<(), NamespaceError> {
    parse(bytes).map(|_| ())
}

/// Empties a table (deleting and recreating it).
fn clear<K: redb::Key + 'static>(
    txn: &WriteTransaction,
    table: TableDefinition<K, &'static [u8]>,
) -> Result<(), NamespaceError> {
    txn.delete_table(table)?;
    txn.open_table(table)?;
    Ok(())
}

fn write_all(txn: &WriteTransaction, snap: &SnapshotV1, tail: &Tail) -> Result<(), NamespaceError> {
    clear(txn, INODES)?;
    clear(txn, DIRENTS)?;
    clear(txn, EXTENTS)?;
    clear(txn, STRIPES)?;
    clear(txn, GARBAGE)?;
    clear(txn, ORPHANS)?;
    clear(txn, DEDUP)?;
    clear(txn, SESSIONS)?;
    clear(txn, ABANDONED)?;
    clear(txn, DISOWNED)?;
    clear(txn, GENERATIONS)?;
    clear(txn, COLD)?;
    clear(txn, OBJECTS)?;
    clear(txn, OBJECT_GARBAGE)?;
    clear(txn, HEAT)?;
    clear(txn, DIR_LEASES)?;
    clear(txn, INO_RANGES)?;
    clear(txn, STATE)?;
    txn.delete_table(LEGACY_CLIENTS)?;

    let mut t = txn.open_table(INODES)?;
    for (ino, rec) in &snap.inodes {
        t.insert(*ino, encode(rec)?.as_slice())?;
    }
    let mut t = txn.open_table(DIRENTS)?;
    for (dir, name, rec) in &snap.dirents {
        t.insert((*dir, name.as_str()), encode(rec)?.as_slice())?;
    }
    let mut t = txn.open_table(EXTENTS)?;
    for (ino, offset, rec) in &snap.extents {
        t.insert((*ino, *offset), encode(rec)?.as_slice())?;
    }
    let mut stripe_bytes = 0u64;
    let mut t = txn.open_table(STRIPES)?;
    for entry in &snap.stripes {
        stripe_bytes = stripe_bytes.saturating_add(entry.record.len);
        t.insert(entry.record.id.0, encode(entry)?.as_slice())?;
    }
    let mut t = txn.open_table(GARBAGE)?;
    for rec in &snap.garbage {
        t.insert(rec.id.0, encode(rec)?.as_slice())?;
    }
    let mut t = txn.open_table(ORPHANS)?;
    for (ino, since) in &snap.orphans {
        t.insert(*ino, encode(since)?.as_slice())?;
    }
    let mut t = txn.open_table(DEDUP)?;
    for (id, outcome) in &snap.dedup {
        t.insert((id.client, id.seq), encode(outcome)?.as_slice())?;
    }
    let (base, disowned) = (&tail.base, &tail.disowned);
    let mut t = txn.open_table(SESSIONS)?;
    for (client, last) in &base.sessions {
        t.insert(*client, encode(last)?.as_slice())?;
    }
    let mut t = txn.open_table(ABANDONED)?;
    for (id, at) in &base.abandoned {
        t.insert(*id, encode(at)?.as_slice())?;
    }
    let mut t = txn.open_table(GENERATIONS)?;
    for (node, generation) in &base.generations {
        t.insert(*node, encode(generation)?.as_slice())?;
    }
    let mut t = txn.open_table(DISOWNED)?;
    for (key, at) in &disowned.disowned {
        t.insert(*key, encode(at)?.as_slice())?;
    }
    let tier = &tail.tier;
    let mut t = txn.open_table(COLD)?;
    for (id, loc) in &tier.cold {
        t.insert(*id, encode(loc)?.as_slice())?;
    }
    let mut t = txn.open_table(OBJECTS)?;
    for (id, obj) in &tier.objects {
        t.insert(*id, encode(obj)?.as_slice())?;
    }
    let mut t = txn.open_table(OBJECT_GARBAGE)?;
    for (id, size) in &tier.object_garbage {
        t.insert(*id, encode(size)?.as_slice())?;
    }
    let mut t = txn.open_table(HEAT)?;
    for (ino, at) in &tier.heat {
        t.insert(*ino, encode(at)?.as_slice())?;
    }
    let mut t = txn.open_table(DIR_LEASES)?;
    for (dir, lease) in &tail.leases.leases {
        t.insert(*dir, encode(lease)?.as_slice())?;
    }
    let mut t = txn.open_table(INO_RANGES)?;
    for (node, ranges) in &tail.leases.ranges {
        t.insert(*node, encode(ranges)?.as_slice())?;
    }
    let mut t = txn.open_table(STATE)?;
    t.insert(KEY_NEXT_INO, encode(&snap.next_ino)?.as_slice())?;
    if tail.leases.epoch != 0 {
        t.insert(KEY_LEASE_EPOCH, encode(&tail.leases.epoch)?.as_slice())?;
    }
    t.insert(KEY_STRIPE_BYTES, encode(&stripe_bytes)?.as_slice())?;
    if base.sweep != 0 {
        t.insert(KEY_CLIENT_SWEEP, encode(&base.sweep)?.as_slice())?;
    }
    if base.clock != ClockRecord::default() {
        t.insert(KEY_CLOCK, encode(&base.clock)?.as_slice())?;
    }
    if base.abandon_sweep != 0 {
        t.insert(KEY_ABANDON_SWEEP, encode(&base.abandon_sweep)?.as_slice())?;
    }
    if disowned.disown_sweep != 0 {
        t.insert(KEY_DISOWN_SWEEP, encode(&disowned.disown_sweep)?.as_slice())?;
    }
    if !tail.nodes.admins.is_empty() {
        t.insert(KEY_NODE_ADMIN, encode(&tail.nodes.admins)?.as_slice())?;
    }
    if !tier.pins.is_empty() {
        t.insert(KEY_TIER_PINS, encode(&tier.pins)?.as_slice())?;
    }
    if !tail.security.revoked.is_empty() {
        t.insert(KEY_REVOKED, encode(&tail.security.revoked)?.as_slice())?;
    }
    if let Some(layout) = &snap.layout {
        t.insert(KEY_LAYOUT, encode(layout)?.as_slice())?;
    }
    if let Some(applied) = &snap.applied {
        t.insert(KEY_APPLIED, applied.as_slice())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::format::{FileKind, RequestId};
    use shoal_agent_api::ROOT_INO;
    use shoal_placement::{Layout, LayoutNode, NodeId};

    use crate::testkit::{Kit, extent, mknode_cmd};
    use crate::{Command, NamespaceError};

    fn populated() -> Kit {
        let mut kit = Kit::new();
        let d = kit.mkdir(ROOT_INO, "d");
        let f = kit.mkfile(d, "f");
        kit.write_extents(f, vec![extent(0, 10, 1), extent(5, 3, 2)]);
        let g = kit.mkfile(ROOT_INO, "g");
        kit.write_extents(g, vec![extent(0, 10, 3)]);
        kit.run(Command::SetAttr {
            ino: g,
            set: crate::format::SetAttr {
                size: Some(0),
                ..Default::default()
            },
        });
        kit.run(Command::Unlink {
            parent: d,
            name: "f".into(),
        });
        let layout = Layout::new(4, vec![LayoutNode::active(NodeId(1), "a", 1)]).expect("layout");
        kit.run(Command::SetLayout { layout });
        kit.run_with(
            Some(RequestId { client: 1, seq: 1 }),
            mknode_cmd(ROOT_INO, "s", FileKind::Symlink),
        );
        kit
    }

    #[test]
    fn snapshot_install_round_trip() {
        let kit = populated();
        let snap = kit.store.snapshot().expect("snapshot");
        assert_eq!(
            super::snapshot_marker(&snap).expect("marker"),
            kit.store.applied().expect("applied"),
            "the marker read from the export is the store's"
        );
        let mut other = Kit::new();
        other.mkfile(ROOT_INO, "to-be-replaced");
        other.store.install(&snap).expect("install");
        assert_eq!(other.store.snapshot().expect("snapshot"), snap);
        assert_eq!(
            other.store.applied().expect("applied"),
            kit.store.applied().expect("applied")
        );
        assert_eq!(other.names(ROOT_INO), ["d", "g", "s"]);
        assert_eq!(
            other.store.orphans().expect("o"),
            kit.store.orphans().expect("o")
        );
        assert_eq!(other.garbage_ids(), [3]);
        assert_eq!(
            other.store.stats().expect("s"),
            kit.store.stats().expect("s")
        );
        assert_eq!(
            other.store.cluster_layout().expect("l"),
            kit.store.cluster_layout().expect("l")
        );
        // The request table came along: the repeat is answered, not applied.
        let repeat = other.run_with(
            Some(RequestId { client: 1, seq: 1 }),
            mknode_cmd(ROOT_INO, "s", FileKind::Symlink),
        );
        assert!(matches!(repeat, crate::Outcome::Attr(_)));
        let fresh = other.mkfile(ROOT_INO, "new");
        assert_eq!(fresh, kit.store.lookup(ROOT_INO, "s").expect("s").ino + 1);
    }

    /// Today's export cut down to the bytes an older version wrote: the body without the
    /// tail, then (v2) the sessions on wall clocks, (v3) the tail before disowned shards,
    /// (v4) before node records, (v5) before the cold tier or (v6) before revoked
    /// certificates, and a checksum.
    fn older(kit: &Kit, version: u8) -> Vec<u8> {
        let now = kit.store.snapshot().expect("snapshot");
        let body = &now[5..now.len() - 4];
        let (_, rest): (super::SnapshotV1, &[u8]) = postcard::take_from_bytes(body).expect("body");
        let mut out = now[..now.len() - 4 - rest.len()].to_vec();
        out[4] = version;
        match version {
            2 => {
                let clients = super::ClientsV2 {
                    clients: vec![(1, crate::testkit::at(kit.clock))],
                    sweep: 0,
                };
                out = postcard::to_extend(&clients, out).expect("encode");
            }
            3..=6 => {
                let tail: super::Tail = postcard::from_bytes(rest).expect("tail");
                out = postcard::to_extend(&tail.base, out).expect("encode");
                if version >= 4 {
                    out = postcard::to_extend(&tail.disowned, out).expect("encode");
                }
                if version >= 5 {
                    out = postcard::to_extend(&tail.nodes, out).expect("encode");
                }
                if version == 6 {
                    out = postcard::to_extend(&tail.tier, out).expect("encode");
                }
            }
            _ => return out,
        }
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    #[test]
    fn a_version_3_snapshot_installs_without_disowned_shards() {
        let mut kit = populated();
        let f = kit.mkfile(ROOT_INO, "striped");
        kit.write_extents(f, vec![crate::testkit::extent(0, 10, 70)]);
        kit.run(Command::DisownShards {
            node: NodeId(9),
            shards: vec![(shoal_placement::StripeId(70), 0)],
        });
        let other = Kit::new();
        other.store.install(&older(&kit, 3)).expect("install");
        assert_eq!(other.names(ROOT_INO), ["d", "g", "s", "striped"]);
        assert_eq!(other.sessions(), kit.sessions());
        assert!(
            other
                .store
                .disowned(shoal_placement::StripeId(70))
                .expect("query")
                .is_empty()
        );
        let same = Kit::new();
        same.store
            .install(&kit.store.snapshot().expect("snapshot"))
            .expect("install");
        assert_eq!(
            same.store
                .disowned(shoal_placement::StripeId(70))
                .expect("query"),
            vec![(0, NodeId(9))]
        );
    }

    #[test]
    fn node_records_travel_in_snapshots_and_a_version_4_one_installs_without_them() {
        use crate::nodes::NodeChange;
        use shoal_placement::{Layout, LayoutNode};
        let mut kit = populated();
        let nodes = vec![
            LayoutNode::active(NodeId(1), "a", 1),
            LayoutNode::active(NodeId(2), "b", 1),
        ];
        kit.run(Command::SetLayout {
            layout: Layout::new(7, nodes).expect("layout"),
        });
        kit.run(Command::ChangeNode {
            node: NodeId(2),
            change: NodeChange::Drain {
                stripes: 3,
                bytes: 30,
            },
        });
        let want = kit.store.node_admins().expect("admins");
        assert_eq!(want.len(), 1);
        let same = Kit::new();
        same.store
            .install(&kit.store.snapshot().expect("snapshot"))
            .expect("install");
        assert_eq!(same.store.node_admins().expect("admins"), want);
        let old = Kit::new();
        old.store.install(&older(&kit, 4)).expect("install");
        assert!(old.store.node_admins().expect("admins").is_empty());
        assert_eq!(old.names(ROOT_INO), kit.names(ROOT_INO));
        assert_eq!(
            old.store.cluster_layout().expect("layout"),
            kit.store.cluster_layout().expect("layout")
        );
    }

    #[test]
    fn a_version_6_snapshot_installs_without_revoked_certificates() {
        let mut kit = populated();
        kit.run(Command::RevokeCertificates {
            name: "n".into(),
            node: NodeId(4),
            before_ms: 9,
        });
        let old = Kit::new();
        old.store.install(&older(&kit, 6)).expect("install");
        assert!(old.store.revoked_certificates().expect("list").is_empty());
        assert_eq!(old.names(ROOT_INO), kit.names(ROOT_INO));
        assert_eq!(
            old.store.cluster_layout().expect("layout"),
            kit.store.cluster_layout().expect("layout")
        );
    }

    #[test]
    fn version_1_and_2_snapshots_still_install() {
        let kit = populated();
        for version in [1, 2] {
            let mut other = Kit::new();
            other.store.install(&older(&kit, version)).expect("install");
            assert_eq!(other.names(ROOT_INO), ["d", "g", "s"], "v{version}");
            // The requests came along.
            let repeat = other.run_with(
                Some(RequestId { client: 1, seq: 1 }),
                mknode_cmd(ROOT_INO, "s", FileKind::Symlink),
            );
            assert!(matches!(repeat, crate::Outcome::Attr(_)), "v{version}");
            // Version 1 had no sessions; version 2's come on wall clocks and are taken
            // as last seen at cluster time 0.
            let want: &[(u64, u64)] = if version == 1 { &[] } else { &[(1, 0)] };
            assert_eq!(other.sessions(), want, "v{version}");
        }
    }

    #[test]
    fn corrupt_snapshot_is_an_error() {
        let kit = populated();
        let snap = kit.store.snapshot().expect("snapshot");
        let before = kit.store.snapshot().expect("snapshot");
        let mut bad_magic = snap.clone();
        bad_magic[0] = b'X';
        let mut bad_version = snap.clone();
        bad_version[4] = super::SNAPSHOT_VERSION + 1;
        let mut flipped = snap.clone();
        for byte in flipped.iter_mut().skip(5).step_by(7) {
            *byte ^= 0xa5;
        }
        let mut trailing = snap.clone();
        trailing.push(0);
        for bytes in [
            &trailing,
            &b""[..],
            &b"SHMS"[..],
            &bad_magic,
            &bad_version,
            &snap[..snap.len() / 2],
            &flipped,
        ] {
            match kit.store.install(bytes) {
                Err(NamespaceError::Corrupt(_)) => {}
                other => panic!("{} bytes: expected Corrupt, got {other:?}", bytes.len()),
            }
        }
        assert_eq!(kit.store.snapshot().expect("snapshot"), before);
        // Any one flipped bit after the version byte, even inside a name (which would
        // decode as another name), is caught by the checksum.
        for at in 5..snap.len() {
            let mut one = snap.clone();
            one[at] ^= 0x08;
            match kit.store.install(&one) {
                Err(NamespaceError::Corrupt(_)) => {}
                other => panic!("flip at {at} of {}: {other:?}", snap.len()),
            }
        }
        assert_eq!(kit.store.snapshot().expect("snapshot"), before);
    }
}
