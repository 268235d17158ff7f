//! What the state machine keeps on disk: the redb tables and the records stored in them.
//!
//! Every table is keyed by inode first — `inodes(ino)`, `dirents((parent, name))`,
//! `extents((ino, offset))`, `orphans(ino)` — so a later split of the namespace into Raft
//! groups by `hash(ino)` is a key filter. A stripe (`stripes(id)`, `garbage(id)`,
//! `abandoned(id)`, `disowned((id, index, node))`) belongs to the group of the inode whose extents reference it.
//! `dedup((client, seq))`, `sessions(client)` and `state(name)` are per group.
//!
//! Every value is one version byte ([`RECORD_VERSION`]) followed by the postcard encoding
//! of the record, so a later format can be told apart from this one. The applied marker is
//! stored as the caller's bytes.

use redb::{ReadableTable, TableDefinition};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use shoal_agent_api::ROOT_INO;

use crate::format::{FileAttr, FileKind, Ino, StripeRecord, Timestamp};
use shoal_placement::StripeId;

use crate::NamespaceError;

/// The version byte in front of every record this crate writes.
pub(crate) const RECORD_VERSION: u8 = 1;

type Bytes = &'static [u8];

/// Inode number → [`InodeRecord`].
pub(crate) const INODES: TableDefinition<u64, Bytes> = TableDefinition::new("inodes");
/// (Directory inode, name) → [`DirentRecord`].
pub(crate) const DIRENTS: TableDefinition<(u64, &str), Bytes> = TableDefinition::new("dirents");
/// (File inode, file offset) → [`ExtentRecord`].
pub(crate) const EXTENTS: TableDefinition<(u64, u64), Bytes> = TableDefinition::new("extents");
/// Stripe id → [`StripeEntry`]: stripes some extent references.
pub(crate) const STRIPES: TableDefinition<u128, Bytes> = TableDefinition::new("stripes");
/// Stripe id → [`StripeRecord`]: stripes no extent references, waiting for shard deletion.
pub(crate) const GARBAGE: TableDefinition<u128, Bytes> = TableDefinition::new("garbage");
/// Inode number → [`Timestamp`] its last name went.
pub(crate) const ORPHANS: TableDefinition<u64, Bytes> = TableDefinition::new("orphans");
/// (Client, seq) → the [`crate::Outcome`] of the first application of that request.
pub(crate) const DEDUP: TableDefinition<(u64, u64), Bytes> = TableDefinition::new("dedup");
/// Client → the cluster clock (milliseconds, u64 record) at its latest request in
/// `dedup`: a client idle for [`crate::tx::CLIENT_IDLE_MS`] is forgotten with its
/// requests.
pub(crate) const SESSIONS: TableDefinition<u64, Bytes> = TableDefinition::new("sessions");
/// The same on proposers' wall clocks ([`Timestamp`] records), as written before the
/// cluster clock existed; migrated into `sessions` when the store opens.
pub(crate) const LEGACY_CLIENTS: TableDefinition<u64, Bytes> = TableDefinition::new("clients");
/// Stripe id → the cluster clock (milliseconds, u64 record) when it was abandoned: fenced
/// against a late commit, its shards deleted (see `Command::AbandonStripes`).
pub(crate) const ABANDONED: TableDefinition<u128, Bytes> = TableDefinition::new("abandoned");
/// (Stripe id, shard index, node) → the cluster clock (milliseconds, u64 record) when
/// that node disowned its copy of that shard: fenced against a late relocation of the
/// slot to it (see `Command::DisownShards`).
pub(crate) const DISOWNED: TableDefinition<(u128, u8, u64), Bytes> =
    TableDefinition::new("disowned");
/// Stripe id → [`crate::format::ColdLocation`]: a live (or garbage) stripe whose data is
/// in the cold tier; its shard slots name no node.
pub(crate) const COLD: TableDefinition<u128, Bytes> = TableDefinition::new("cold");
/// Object id → [`ObjectRecord`]: objects in the cold tier that some cold stripe uses.
pub(crate) const OBJECTS: TableDefinition<u128, Bytes> = TableDefinition::new("objects");
/// Object id → its size (u64 record): objects no stripe uses, to delete from the bucket.
pub(crate) const OBJECT_GARBAGE: TableDefinition<u128, Bytes> =
    TableDefinition::new("object_garbage");
/// Inode number → the cluster clock (milliseconds, u64 record) when its data was last
/// written or read (reads are recorded coarsely, see `Command::RecordReads`).
pub(crate) const HEAT: TableDefinition<u64, Bytes> = TableDefinition::new("heat");
/// Node id → the highest generation it was recorded running with (u64 record).
pub(crate) const GENERATIONS: TableDefinition<u64, Bytes> = TableDefinition::new("generations");
/// Directory inode → [`crate::DirLease`]: who may change its entries (see `lease.rs`).
pub(crate) const DIR_LEASES: TableDefinition<u64, Bytes> = TableDefinition::new("dir_leases");
/// Node → [`crate::lease::InoRanges`]: inode numbers handed out to that lease holder.
pub(crate) const INO_RANGES: TableDefinition<u64, Bytes> = TableDefinition::new("ino_ranges");
/// Name → value; the names are the `KEY_*` constants.
pub(crate) const STATE: TableDefinition<&str, Bytes> = TableDefinition::new("state");

/// `state` key: the next inode number to hand out (u64 record).
pub(crate) const KEY_NEXT_INO: &str = "next_ino";
/// `state` key: the cluster layout (Layout record).
pub(crate) const KEY_LAYOUT: &str = "layout";
/// `state` key: the caller's applied marker (raw bytes).
pub(crate) const KEY_APPLIED: &str = "applied";
/// `state` key: the sum of `len` over live stripes (u64 record).
pub(crate) const KEY_STRIPE_BYTES: &str = "stripe_bytes";
/// `state` key: the client the idle-client sweep looks at next (u64 record).
pub(crate) const KEY_CLIENT_SWEEP: &str = "client_sweep";
/// `state` key: the cluster clock ([`ClockRecord`]).
pub(crate) const KEY_CLOCK: &str = "clock";
/// `state` key: the abandoned stripe the expiry sweep looks at next (u128 record).
pub(crate) const KEY_ABANDON_SWEEP: &str = "abandon_sweep";
/// `state` key: the stripe whose disowned shards the expiry sweep looks at next (u128
/// record).
pub(crate) const KEY_DISOWN_SWEEP: &str = "disown_sweep";
/// `state` key: what operators asked of each node ([`crate::nodes::NodeAdmins`] record).
pub(crate) const KEY_NODE_ADMIN: &str = "node_admin";

/// `state` key: inodes kept out of the cold tier (a sorted `Vec<u64>` record).
pub(crate) const KEY_TIER_PINS: &str = "tier_pins";
/// `state` key: revoked certificates (a `Vec<RevokedName>` record, by name).
pub(crate) const KEY_REVOKED: &str = "revoked";

/// `state` key: the epoch of the last directory lease granted (u64 record; absent: 0).
pub(crate) const KEY_LEASE_EPOCH: &str = "lease_epoch";

/// The first inode number handed out after the root.
pub(crate) const FIRST_INO: Ino = 2;

/// One inode: its attributes and, by kind, its symlink target or inline data.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct InodeRecord {
    pub kind: FileKind,
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub atime: Timestamp,
    pub mtime: Timestamp,
    pub ctime: Timestamp,
    pub rdev: u32,
    /// Grows on every change of the file's data or size; guards inline → extent moves.
    pub data_version: u64,
    /// A directory's parent (the root's is the root); 0 for other kinds, which may have
    /// several names.
    pub parent: Ino,
    /// A symlink's target; empty otherwise.
    pub target: String,
    /// A file's inline data (a prefix of its content; the rest up to `size` reads as
    /// zeros). Never non-empty while the file has extents.
    #[serde(with = "serde_bytes")]
    pub inline: Vec<u8>,
}

impl InodeRecord {
    /// The root directory before anything was applied, or as created at `now`.
    pub(crate) fn root(now: Timestamp) -> Self {
        InodeRecord {
            kind: FileKind::Dir,
            perm: 0o755,
            nlink: 2,
            uid: 0,
            gid: 0,
            size: 0,
            atime: now,
            mtime: now,
            ctime: now,
            rdev: 0,
            data_version: 0,
            parent: ROOT_INO,
            target: String::new(),
            inline: Vec::new(),
        }
    }

    pub(crate) fn attr(&self, ino: Ino) -> FileAttr {
        FileAttr {
            ino,
            kind: self.kind,
            perm: self.perm,
            nlink: self.nlink,
            uid: self.uid,
            gid: self.gid,
            size: self.size,
            atime: self.atime,
            mtime: self.mtime,
            ctime: self.ctime,
            rdev: self.rdev,
        }
    }

    pub(crate) fn is_dir(&self) -> bool {
        self.kind == FileKind::Dir
    }
}

/// One name in a directory: the inode it names and that inode's kind (for readdir).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DirentRecord {
    pub ino: Ino,
    pub kind: FileKind,
}

/// `len` bytes of a file at the key's offset are bytes `[stripe_offset, stripe_offset +
/// len)` of stripe `stripe`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ExtentRecord {
    pub len: u64,
    pub stripe_offset: u64,
    pub stripe: StripeId,
}

/// A live stripe and how many extents reference it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StripeEntry {
    pub record: StripeRecord,
    pub refs: u64,
}

/// An object in the cold tier: its size and how many cold stripes use it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ObjectRecord {
    pub size: u64,
    pub stripes: u64,
}

/// The cluster clock: milliseconds of leader time since the group began (or since this
/// state was first written by a version that keeps it), and the last leader stamp seen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ClockRecord {
    pub now_ms: u64,
    pub run: u64,
    pub run_millis: u64,
}

impl ClockRecord {
    /// Advances by the time between the last stamp and `stamp` when both come from the
    /// same leader run; a stamp of another run only becomes the new reference.
    pub(crate) fn advance(&mut self, stamp: crate::LeaderStamp) {
        if stamp.run == self.run && stamp.millis > self.run_millis {
            self.now_ms = self.now_ms.saturating_add(stamp.millis - self.run_millis);
        }
        if stamp.run != self.run || stamp.millis > self.run_millis {
            self.run = stamp.run;
            self.run_millis = stamp.millis;
        }
    }
}

/// A record as stored: the version byte, then postcard.
pub(crate) fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, NamespaceError> {
    postcard::to_extend(value, vec![RECORD_VERSION]).map_err(|source| NamespaceError::Encode {
        what: "a record",
        source,
    })
}

/// Decodes a stored record; `what` names it in the error.
pub(crate) fn decode<T: DeserializeOwned>(bytes: &[u8], what: &str) -> Result<T, NamespaceError> {
    match bytes.split_first() {
        Some((&RECORD_VERSION, body)) => decode_exact(body, what),
        Some((v, _)) => Err(NamespaceError::Corrupt(format!(
            "{what} record has unknown version {v}"
        ))),
        None => Err(NamespaceError::Corrupt(format!("{what} record is empty"))),
    }
}

/// Decodes postcard bytes that must hold exactly one `T` (trailing bytes mean damage).
pub(crate) fn decode_exact<T: DeserializeOwned>(
    bytes: &[u8],
    what: &str,
) -> Result<T, NamespaceError> {
    match postcard::take_from_bytes(bytes) {
        Ok((value, [])) => Ok(value),
        Ok((_, rest)) => Err(NamespaceError::Corrupt(format!(
            "{what}: {} bytes after the end",
            rest.len()
        ))),
        Err(e) => Err(NamespaceError::Corrupt(format!("{what}: {e}"))),
    }
}

/// Reads and decodes one value of a table keyed by `K`.
macro_rules! read_fn {
    ($name:ident, $key:ty, $val:ty, $what:literal) => {
        pub(crate) fn $name(
            table: &impl ReadableTable<$key, Bytes>,
            key: $key,
        ) -> Result<Option<$val>, NamespaceError> {
            match table.get(key)? {
                Some(guard) => decode(guard.value(), $what).map(Some),
                None => Ok(None),
            }
        }
    };
}

read_fn!(read_inode, u64, InodeRecord, "inode");
read_fn!(read_stripe, u128, StripeEntry, "stripe");

pub(crate) fn read_dirent(
    table: &impl ReadableTable<(u64, &'static str), Bytes>,
    parent: Ino,
    name: &str,
) -> Result<Option<DirentRecord>, NamespaceError> {
    match table.get((parent, name))? {
        Some(guard) => decode(guard.value(), "dirent").map(Some),
        None => Ok(None),
    }
}

/// The inode as queries see it: before the first apply the root exists with zero times.
pub(crate) fn read_inode_or_root(
    table: &impl ReadableTable<u64, Bytes>,
    ino: Ino,
) -> Result<Option<InodeRecord>, NamespaceError> {
    let found = read_inode(table, ino)?;
    Ok(found.or_else(|| (ino == ROOT_INO).then(|| InodeRecord::root(Timestamp::default()))))
}

/// True when the directory has at least one entry.
pub(crate) fn dir_has_entries(
    table: &impl ReadableTable<(u64, &'static str), Bytes>,
    dir: Ino,
) -> Result<bool, NamespaceError> {
    match table.range((dir, "")..)?.next() {
        Some(item) => Ok(item?.0.value().0 == dir),
        None => Ok(false),
    }
}

/// Every extent of a file, in file order.
pub(crate) fn read_extents(
    table: &impl ReadableTable<(u64, u64), Bytes>,
    ino: Ino,
) -> Result<Vec<(u64, ExtentRecord)>, NamespaceError> {
    let mut out = Vec::new();
    for item in table.range((ino, 0)..=(ino, u64::MAX))? {
        let (key, value) = item?;
        out.push((key.value().1, decode(value.value(), "extent")?));
    }
    Ok(out)
}

/// True when the file has at least one extent.
pub(crate) fn has_extents(
    table: &impl ReadableTable<(u64, u64), Bytes>,
    ino: Ino,
) -> Result<bool, NamespaceError> {
    Ok(table.range((ino, 0)..=(ino, u64::MAX))?.next().is_some())
}

/// A u64 state value, `default` when absent.
pub(crate) fn read_state_u64(
    table: &impl ReadableTable<&'static str, Bytes>,
    key: &str,
    default: u64,
) -> Result<u64, NamespaceError> {
    Ok(read_state(table, key)?.unwrap_or(default))
}

/// A state value, if set.
pub(crate) fn read_state<T: DeserializeOwned>(
    table: &impl ReadableTable<&'static str, Bytes>,
    key: &str,
) -> Result<Option<T>, NamespaceError> {
    match table.get(key)? {
        Some(guard) => decode(guard.value(), key).map(Some),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LeaderStamp;

    #[test]
    fn the_cluster_clock_advances_only_within_one_leader_run() {
        let mut c = ClockRecord::default();
        let at = |run, millis| LeaderStamp { run, millis };
        c.advance(at(7, 1_000));
        assert_eq!(c.now_ms, 0, "the first stamp of a run is only a reference");
        c.advance(at(7, 1_500));
        assert_eq!(c.now_ms, 500);
        c.advance(at(7, 1_200));
        assert_eq!(c.now_ms, 500, "an older stamp of the run changes nothing");
        c.advance(at(7, 1_600));
        assert_eq!(c.now_ms, 600);
        // A new leader whose monotonic clock reads anything at all: no jump.
        c.advance(at(9, 99_000_000));
        assert_eq!(c.now_ms, 600);
        c.advance(at(9, 99_000_250));
        assert_eq!(c.now_ms, 850);
    }

    #[test]
    fn records_carry_a_version_and_nothing_after() {
        let rec = DirentRecord {
            ino: 7,
            kind: FileKind::Fifo,
        };
        let bytes = encode(&rec).expect("encode");
        assert_eq!(bytes[0], RECORD_VERSION);
        assert_eq!(decode::<DirentRecord>(&bytes, "t").expect("decode"), rec);
        let mut newer = bytes.clone();
        newer[0] = 2;
        let mut longer = bytes.clone();
        longer.push(0);
        for bad in [&[][..], &newer, &longer, &bytes[..1]] {
            assert!(matches!(
                decode::<DirentRecord>(bad, "t"),
                Err(NamespaceError::Corrupt(_))
            ));
        }
    }
}
