//! One apply's view of the state: the open tables of a write transaction, with a
//! write-back cache of inodes (a batch often touches the same directory many times) and
//! the counters kept in the `state` table.
//!
//! Command handlers check everything first and only then write, so a refused command
//! leaves nothing behind; every write goes through this type.
//!
//! Request ids: every mutating request from a mount carries a `RequestId` (mount session,
//! sequence), and a repeat is answered with the first outcome, so a retry after an agent
//! restart or a leader change is applied once. The `dedup` table keeps the last
//! [`DEDUP_WINDOW`] outcomes per session; each request-carrying proposal checks
//! [`CLIENT_SWEEP_STEP`] sessions and forgets those idle for [`CLIENT_IDLE_MS`] (an hour of
//! cluster time), so the table is bounded by the sessions active in the last hour. A mount
//! retries for `--retry-for`: 10 min by default, 30 min at most.

use std::collections::BTreeMap;

use std::cell::OnceCell;

use redb::{ReadableTable, Table, TableDefinition, WriteTransaction};
use shoal_agent_api::ROOT_INO;

use crate::format::{Ino, RequestId, StripeRecord, Timestamp};
use shoal_placement::{Layout, NodeId, StripeId};

use crate::lease::{DirLease, InoRanges};
use crate::record::{
    self, ABANDONED, COLD, ClockRecord, DEDUP, DIR_LEASES, DIRENTS, DISOWNED, DirentRecord,
    EXTENTS, ExtentRecord, FIRST_INO, GARBAGE, GENERATIONS, HEAT, INO_RANGES, INODES, InodeRecord,
    KEY_ABANDON_SWEEP, KEY_APPLIED, KEY_CLIENT_SWEEP, KEY_CLOCK, KEY_DISOWN_SWEEP, KEY_LAYOUT,
    KEY_LEASE_EPOCH, KEY_NEXT_INO, KEY_NODE_ADMIN, KEY_STRIPE_BYTES, OBJECT_GARBAGE, OBJECTS,
    ORPHANS, SESSIONS, STATE, STRIPES, StripeEntry, decode, encode,
};
use crate::{LeaderStamp, NamespaceError, Outcome};

/// How many recent request ids per client keep their outcome.
pub(crate) const DEDUP_WINDOW: u64 = 4096;

/// A client (a mount session) with no request for this long is forgotten, with the
/// outcomes kept for it: a mount retries a request for minutes at most, and without this
/// every mount session ever started would keep up to [`DEDUP_WINDOW`] rows. Measured on
/// the cluster clock (leader stamps), so no agent's wall clock can shorten it.
pub(crate) const CLIENT_IDLE_MS: u64 = 3_600_000;

/// How long an abandoned stripe stays fenced: far longer than any commit can be delayed
/// (a proposal waits a minute for a leader at most).
pub(crate) const ABANDON_KEEP_MS: u64 = 24 * 3_600_000;

/// How many abandoned stripes one AbandonStripes apply checks for expiry.
const ABANDON_SWEEP_STEP: usize = 16;

/// How many clients one request-carrying proposal checks for idleness. Clients only
/// appear through proposals, so the sweep keeps pace with their arrival.
const CLIENT_SWEEP_STEP: usize = 2;

type Bytes = &'static [u8];

/// An inode as this apply sees it; `dirty` ones are written back at the end.
struct Cached {
    record: Option<InodeRecord>,
    dirty: bool,
}

/// A table of the transaction, opened at its first use: an apply touches a few of the
/// tables, and opening one is a lookup in redb's table tree and a definition decoded and
/// checked (all sixteen were about a sixth of a create's apply in a profile).
pub(crate) struct Lazy<'t, K: redb::Key + 'static, V: redb::Value + 'static> {
    txn: &'t WriteTransaction,
    def: TableDefinition<'static, K, V>,
    table: OnceCell<Table<'t, K, V>>,
}

impl<'t, K: redb::Key + 'static, V: redb::Value + 'static> Lazy<'t, K, V> {
    fn new(txn: &'t WriteTransaction, def: TableDefinition<'static, K, V>) -> Self {
        Lazy {
            txn,
            def,
            table: OnceCell::new(),
        }
    }

    /// The table, for reading.
    pub(crate) fn read(&self) -> Result<&Table<'t, K, V>, NamespaceError> {
        if let Some(t) = self.table.get() {
            return Ok(t);
        }
        let t = self.txn.open_table(self.def)?;
        Ok(self.table.get_or_init(|| t))
    }

    /// The table, for writing.
    pub(crate) fn write(&mut self) -> Result<&mut Table<'t, K, V>, NamespaceError> {
        if self.table.get().is_none() {
            let t = self.txn.open_table(self.def)?;
            let _ = self.table.set(t);
        }
        self.table
            .get_mut()
            .ok_or_else(|| NamespaceError::Corrupt("a table opened just before is missing".into()))
    }
}

pub(crate) struct Tx<'t> {
    inodes: Lazy<'t, u64, Bytes>,
    dirents: Lazy<'t, (u64, &'static str), Bytes>,
    extents: Lazy<'t, (u64, u64), Bytes>,
    stripes: Lazy<'t, u128, Bytes>,
    garbage: Lazy<'t, u128, Bytes>,
    orphans: Lazy<'t, u64, Bytes>,
    dedup: Lazy<'t, (u64, u64), Bytes>,
    sessions: Lazy<'t, u64, Bytes>,
    abandoned: Lazy<'t, u128, Bytes>,
    disowned: Lazy<'t, (u128, u8, u64), Bytes>,
    generations: Lazy<'t, u64, Bytes>,
    pub(crate) cold: Lazy<'t, u128, Bytes>,
    pub(crate) objects: Lazy<'t, u128, Bytes>,
    pub(crate) object_garbage: Lazy<'t, u128, Bytes>,
    pub(crate) heat: Lazy<'t, u64, Bytes>,
    dir_leases: Lazy<'t, u64, Bytes>,
    ino_ranges: Lazy<'t, u64, Bytes>,
    pub(crate) state: Table<'t, &'static str, Bytes>,
    cache: BTreeMap<Ino, Cached>,
    next_ino: Ino,
    stripe_bytes: u64,
    clock: ClockRecord,
    /// Directory entries written and removed, kept when the apply is a speculation
    /// (`speculate.rs`).
    entry_writes: Option<BTreeMap<(Ino, String), Option<DirentRecord>>>,
}

impl<'t> Tx<'t> {
    pub(crate) fn open(txn: &'t WriteTransaction) -> Result<Self, NamespaceError> {
        let state = txn.open_table(STATE)?;
        let next_ino = record::read_state_u64(&state, KEY_NEXT_INO, FIRST_INO)?;
        let stripe_bytes = record::read_state_u64(&state, KEY_STRIPE_BYTES, 0)?;
        let clock = record::read_state(&state, KEY_CLOCK)?.unwrap_or_default();
        Ok(Tx {
            inodes: Lazy::new(txn, INODES),
            dirents: Lazy::new(txn, DIRENTS),
            extents: Lazy::new(txn, EXTENTS),
            stripes: Lazy::new(txn, STRIPES),
            garbage: Lazy::new(txn, GARBAGE),
            orphans: Lazy::new(txn, ORPHANS),
            dedup: Lazy::new(txn, DEDUP),
            sessions: Lazy::new(txn, SESSIONS),
            abandoned: Lazy::new(txn, ABANDONED),
            disowned: Lazy::new(txn, DISOWNED),
            generations: Lazy::new(txn, GENERATIONS),
            cold: Lazy::new(txn, COLD),
            objects: Lazy::new(txn, OBJECTS),
            object_garbage: Lazy::new(txn, OBJECT_GARBAGE),
            heat: Lazy::new(txn, HEAT),
            dir_leases: Lazy::new(txn, DIR_LEASES),
            ino_ranges: Lazy::new(txn, INO_RANGES),
            state,
            cache: BTreeMap::new(),
            next_ino,
            stripe_bytes,
            clock,
            entry_writes: None,
        })
    }

    /// Keeps the directory entries this apply writes, for [`Tx::into_writes`].
    pub(crate) fn keep_writes(&mut self) {
        self.entry_writes = Some(BTreeMap::new());
    }

    /// What this apply changed of the inodes (`None`: deleted) and, when
    /// [`Tx::keep_writes`] was called first, of the directory entries; nothing is written.
    #[allow(clippy::type_complexity)]
    pub(crate) fn into_writes(
        self,
    ) -> (
        BTreeMap<Ino, Option<InodeRecord>>,
        BTreeMap<(Ino, String), Option<DirentRecord>>,
    ) {
        let inodes = self
            .cache
            .into_iter()
            .filter(|(_, c)| c.dirty)
            .map(|(ino, c)| (ino, c.record))
            .collect();
        (inodes, self.entry_writes.unwrap_or_default())
    }

    /// Writes the cached inodes, the counters and the applied marker.
    pub(crate) fn finish(mut self, applied: &[u8]) -> Result<(), NamespaceError> {
        for (ino, cached) in std::mem::take(&mut self.cache) {
            if !cached.dirty {
                continue;
            }
            match cached.record {
                Some(rec) => {
                    self.inodes.write()?.insert(ino, encode(&rec)?.as_slice())?;
                }
                None => {
                    self.inodes.write()?.remove(ino)?;
                }
            }
        }
        self.state
            .insert(KEY_NEXT_INO, encode(&self.next_ino)?.as_slice())?;
        self.state
            .insert(KEY_STRIPE_BYTES, encode(&self.stripe_bytes)?.as_slice())?;
        self.state
            .insert(KEY_CLOCK, encode(&self.clock)?.as_slice())?;
        self.state.insert(KEY_APPLIED, applied)?;
        Ok(())
    }

    // --- the cluster clock ---

    /// The cluster clock as of the entry being applied (milliseconds).
    pub(crate) fn now_ms(&self) -> u64 {
        self.clock.now_ms
    }

    /// Takes the stamp of the entry being applied.
    pub(crate) fn advance_clock(&mut self, stamp: Option<LeaderStamp>) {
        if let Some(stamp) = stamp {
            self.clock.advance(stamp);
        }
    }

    // --- inodes ---

    pub(crate) fn inode(&mut self, ino: Ino) -> Result<Option<InodeRecord>, NamespaceError> {
        if let Some(cached) = self.cache.get(&ino) {
            return Ok(cached.record.clone());
        }
        let record = record::read_inode(self.inodes.read()?, ino)?;
        self.cache.insert(
            ino,
            Cached {
                record: record.clone(),
                dirty: false,
            },
        );
        Ok(record)
    }

    pub(crate) fn put_inode(&mut self, ino: Ino, record: InodeRecord) {
        self.cache.insert(
            ino,
            Cached {
                record: Some(record),
                dirty: true,
            },
        );
    }

    pub(crate) fn delete_inode(&mut self, ino: Ino) {
        self.cache.insert(
            ino,
            Cached {
                record: None,
                dirty: true,
            },
        );
    }

    /// Creates the root directory at `now` unless it exists.
    pub(crate) fn ensure_root(&mut self, now: Timestamp) -> Result<(), NamespaceError> {
        if self.inode(ROOT_INO)?.is_none() {
            self.put_inode(ROOT_INO, InodeRecord::root(now));
        }
        Ok(())
    }

    /// A fresh inode number (never reused).
    pub(crate) fn allocate_ino(&mut self) -> Ino {
        self.allocate_inos(1).0
    }

    /// The numbers `[start, start + count)`, never handed out again.
    pub(crate) fn allocate_inos(&mut self, count: u64) -> (Ino, Ino) {
        let start = self.next_ino;
        self.next_ino = start.saturating_add(count);
        (start, self.next_ino)
    }

    /// The inode numbers handed out to lease holder `node` and not passed yet.
    pub(crate) fn ino_ranges(&self, node: NodeId) -> Result<InoRanges, NamespaceError> {
        match self.ino_ranges.read()?.get(node.0)? {
            Some(v) => decode(v.value(), "inode ranges"),
            None => Ok(InoRanges::default()),
        }
    }

    pub(crate) fn put_ino_ranges(
        &mut self,
        node: NodeId,
        ranges: &InoRanges,
    ) -> Result<(), NamespaceError> {
        if ranges.is_empty() {
            self.ino_ranges.write()?.remove(node.0)?;
        } else {
            self.ino_ranges
                .write()?
                .insert(node.0, encode(ranges)?.as_slice())?;
        }
        Ok(())
    }

    // --- directory leases ---

    /// Whether any directory is leased (a count kept in the table's header).
    pub(crate) fn any_dir_leases(&self) -> Result<bool, NamespaceError> {
        use redb::ReadableTableMetadata;
        Ok(!self.dir_leases.read()?.is_empty()?)
    }

    pub(crate) fn dir_lease(&self, dir: Ino) -> Result<Option<DirLease>, NamespaceError> {
        match self.dir_leases.read()?.get(dir)? {
            Some(v) => decode(v.value(), "directory lease").map(Some),
            None => Ok(None),
        }
    }

    pub(crate) fn put_dir_lease(
        &mut self,
        dir: Ino,
        lease: DirLease,
    ) -> Result<(), NamespaceError> {
        self.dir_leases
            .write()?
            .insert(dir, encode(&lease)?.as_slice())?;
        Ok(())
    }

    pub(crate) fn remove_dir_lease(&mut self, dir: Ino) -> Result<(), NamespaceError> {
        self.dir_leases.write()?.remove(dir)?;
        Ok(())
    }

    /// A lease epoch no grant had before.
    pub(crate) fn next_lease_epoch(&mut self) -> Result<u64, NamespaceError> {
        let epoch = record::read_state_u64(&self.state, KEY_LEASE_EPOCH, 0)? + 1;
        self.state
            .insert(KEY_LEASE_EPOCH, encode(&epoch)?.as_slice())?;
        Ok(epoch)
    }

    // --- directory entries ---

    pub(crate) fn dirent(
        &self,
        parent: Ino,
        name: &str,
    ) -> Result<Option<DirentRecord>, NamespaceError> {
        record::read_dirent(self.dirents.read()?, parent, name)
    }

    pub(crate) fn put_dirent(
        &mut self,
        parent: Ino,
        name: &str,
        entry: DirentRecord,
    ) -> Result<(), NamespaceError> {
        self.dirents
            .write()?
            .insert((parent, name), encode(&entry)?.as_slice())?;
        if let Some(writes) = &mut self.entry_writes {
            writes.insert((parent, name.to_owned()), Some(entry));
        }
        Ok(())
    }

    pub(crate) fn remove_dirent(&mut self, parent: Ino, name: &str) -> Result<(), NamespaceError> {
        self.dirents.write()?.remove((parent, name))?;
        if let Some(writes) = &mut self.entry_writes {
            writes.insert((parent, name.to_owned()), None);
        }
        Ok(())
    }

    pub(crate) fn dir_has_entries(&self, dir: Ino) -> Result<bool, NamespaceError> {
        record::dir_has_entries(self.dirents.read()?, dir)
    }

    // --- orphans ---

    pub(crate) fn is_orphan(&self, ino: Ino) -> Result<bool, NamespaceError> {
        Ok(self.orphans.read()?.get(ino)?.is_some())
    }

    pub(crate) fn add_orphan(&mut self, ino: Ino, since: Timestamp) -> Result<(), NamespaceError> {
        self.orphans
            .write()?
            .insert(ino, encode(&since)?.as_slice())?;
        Ok(())
    }

    pub(crate) fn remove_orphan(&mut self, ino: Ino) -> Result<(), NamespaceError> {
        self.orphans.write()?.remove(ino)?;
        Ok(())
    }

    // --- extents and stripe references ---

    pub(crate) fn has_extents(&self, ino: Ino) -> Result<bool, NamespaceError> {
        record::has_extents(self.extents.read()?, ino)
    }

    /// The extents of `ino` that overlap `[start, end)`, in file order.
    pub(crate) fn extents_overlapping(
        &self,
        ino: Ino,
        start: u64,
        end: u64,
    ) -> Result<Vec<(u64, ExtentRecord)>, NamespaceError> {
        let mut out = Vec::new();
        if start > 0
            && let Some(item) = self
                .extents
                .read()?
                .range((ino, 0)..(ino, start))?
                .next_back()
        {
            let (key, value) = item?;
            let offset = key.value().1;
            let ext: ExtentRecord = decode(value.value(), "extent")?;
            if offset.saturating_add(ext.len) > start {
                out.push((offset, ext));
            }
        }
        if start < end {
            for item in self.extents.read()?.range((ino, start)..(ino, end))? {
                let (key, value) = item?;
                out.push((key.value().1, decode(value.value(), "extent")?));
            }
        }
        Ok(out)
    }

    pub(crate) fn put_extent(
        &mut self,
        ino: Ino,
        offset: u64,
        extent: ExtentRecord,
    ) -> Result<(), NamespaceError> {
        self.extents
            .write()?
            .insert((ino, offset), encode(&extent)?.as_slice())?;
        Ok(())
    }

    pub(crate) fn remove_extent(&mut self, ino: Ino, offset: u64) -> Result<(), NamespaceError> {
        self.extents.write()?.remove((ino, offset))?;
        Ok(())
    }

    /// Adds one reference to a stripe, recording it if it is new.
    pub(crate) fn add_stripe_ref(&mut self, stripe: &StripeRecord) -> Result<(), NamespaceError> {
        let id = stripe.id.0;
        let entry = match record::read_stripe(self.stripes.read()?, id)? {
            Some(mut entry) => {
                entry.refs += 1;
                entry
            }
            None => {
                // A stripe referenced again before its shards were deleted is live again,
                // with the locations its garbage record holds (repair may have moved
                // shards since the writer saw it).
                let record = match self.garbage.write()?.remove(id)? {
                    Some(v) => decode(v.value(), "garbage")?,
                    None => stripe.clone(),
                };
                self.stripe_bytes = self.stripe_bytes.saturating_add(record.len);
                StripeEntry { record, refs: 1 }
            }
        };
        self.stripes
            .write()?
            .insert(id, encode(&entry)?.as_slice())?;
        Ok(())
    }

    /// Changes a live stripe's reference count by `delta`; at zero it moves to garbage.
    pub(crate) fn change_stripe_refs(
        &mut self,
        id: StripeId,
        delta: i64,
    ) -> Result<(), NamespaceError> {
        if delta == 0 {
            return Ok(());
        }
        let Some(mut entry) = record::read_stripe(self.stripes.read()?, id.0)? else {
            return Err(NamespaceError::Corrupt(format!(
                "an extent references stripe {id}, which is not recorded"
            )));
        };
        let refs = entry.refs.checked_add_signed(delta).ok_or_else(|| {
            NamespaceError::Corrupt(format!("stripe {id} reference count underflow"))
        })?;
        if refs == 0 {
            self.stripes.write()?.remove(id.0)?;
            self.stripe_bytes = self.stripe_bytes.saturating_sub(entry.record.len);
            self.garbage
                .write()?
                .insert(id.0, encode(&entry.record)?.as_slice())?;
        } else {
            entry.refs = refs;
            self.stripes
                .write()?
                .insert(id.0, encode(&entry)?.as_slice())?;
        }
        Ok(())
    }

    pub(crate) fn forget_garbage(&mut self, id: StripeId) -> Result<(), NamespaceError> {
        self.garbage.write()?.remove(id.0)?;
        Ok(())
    }

    // --- layout ---

    pub(crate) fn layout(&self) -> Result<Option<Layout>, NamespaceError> {
        match self.state.get(KEY_LAYOUT)? {
            Some(guard) => decode(guard.value(), "layout").map(Some),
            None => Ok(None),
        }
    }

    pub(crate) fn set_layout(&mut self, layout: &Layout) -> Result<(), NamespaceError> {
        self.state.insert(KEY_LAYOUT, encode(layout)?.as_slice())?;
        Ok(())
    }

    pub(crate) fn node_admins(&self) -> Result<crate::nodes::NodeAdmins, NamespaceError> {
        Ok(record::read_state(&self.state, KEY_NODE_ADMIN)?.unwrap_or_default())
    }

    pub(crate) fn set_node_admins(
        &mut self,
        admins: &crate::nodes::NodeAdmins,
    ) -> Result<(), NamespaceError> {
        if admins.is_empty() {
            self.state.remove(KEY_NODE_ADMIN)?;
        } else {
            self.state
                .insert(KEY_NODE_ADMIN, encode(admins)?.as_slice())?;
        }
        Ok(())
    }

    /// The cluster clock as this apply sees it (milliseconds).
    pub(crate) fn clock_ms(&self) -> u64 {
        self.clock.now_ms
    }

    /// Live stripes with a slot naming `node`, and the bytes of those shards: a scan of
    /// every stripe record (operator changes only).
    pub(crate) fn stripes_naming(&self, node: NodeId) -> Result<(u64, u64), NamespaceError> {
        let (mut stripes, mut bytes) = (0, 0);
        for item in self.stripes.read()?.iter()? {
            let (_, value) = item?;
            let entry: StripeEntry = decode(value.value(), "stripe")?;
            let held = entry
                .record
                .shards
                .iter()
                .filter(|s| s.node == node)
                .count() as u64;
            if held > 0 {
                stripes += 1;
                bytes += held * entry.record.shard_len;
            }
        }
        Ok((stripes, bytes))
    }

    // --- request dedup ---

    /// The outcome stored for a request already applied.
    pub(crate) fn dedup_get(&self, id: RequestId) -> Result<Option<Outcome>, NamespaceError> {
        match self.dedup.read()?.get((id.client, id.seq))? {
            Some(guard) => decode(guard.value(), "dedup").map(Some),
            None => Ok(None),
        }
    }

    /// Remembers a request's outcome, applied now (cluster clock), and forgets the client's
    /// requests that fell out of the window (seq below the highest seen minus
    /// [`DEDUP_WINDOW`]).
    pub(crate) fn dedup_put(
        &mut self,
        id: RequestId,
        outcome: &Outcome,
    ) -> Result<(), NamespaceError> {
        self.dedup
            .write()?
            .insert((id.client, id.seq), encode(outcome)?.as_slice())?;
        let now = self.clock.now_ms;
        self.sessions
            .write()?
            .insert(id.client, encode(&now)?.as_slice())?;
        let highest = match self
            .dedup
            .read()?
            .range((id.client, 0)..=(id.client, u64::MAX))?
            .next_back()
        {
            Some(item) => item?.0.value().1,
            None => return Ok(()),
        };
        let Some(floor) = highest.checked_sub(DEDUP_WINDOW) else {
            return Ok(());
        };
        let mut stale = Vec::new();
        for item in self
            .dedup
            .read()?
            .range((id.client, 0)..(id.client, floor))?
        {
            stale.push(item?.0.value().1);
        }
        for seq in stale {
            self.dedup.write()?.remove((id.client, seq))?;
        }
        Ok(())
    }

    /// Checks the next few clients (in id order, wrapping around) and forgets those idle
    /// for [`CLIENT_IDLE_MS`] of cluster time, with every outcome kept for them.
    pub(crate) fn expire_idle_clients(&mut self) -> Result<(), NamespaceError> {
        let start = record::read_state_u64(&self.state, KEY_CLIENT_SWEEP, 0)?;
        let mut seen: Vec<(u64, u64)> = Vec::with_capacity(CLIENT_SWEEP_STEP);
        for item in self
            .sessions
            .read()?
            .range(start..)?
            .take(CLIENT_SWEEP_STEP)
        {
            let (client, at) = item?;
            seen.push((client.value(), decode(at.value(), "session")?));
        }
        let next = match seen.last() {
            Some(&(client, _)) if seen.len() == CLIENT_SWEEP_STEP => client.saturating_add(1),
            _ => 0,
        };
        if next != start {
            self.state
                .insert(KEY_CLIENT_SWEEP, encode(&next)?.as_slice())?;
        }
        let now = self.clock.now_ms;
        for (client, last) in seen {
            if now.saturating_sub(last) < CLIENT_IDLE_MS {
                continue;
            }
            let mut seqs = Vec::new();
            for item in self.dedup.read()?.range((client, 0)..=(client, u64::MAX))? {
                seqs.push(item?.0.value().1);
            }
            for seq in seqs {
                self.dedup.write()?.remove((client, seq))?;
            }
            self.sessions.write()?.remove(client)?;
        }
        Ok(())
    }

    // --- node generations ---

    /// Raises `node`'s recorded generation to `generation` (never lowers it).
    pub(crate) fn record_generation(
        &mut self,
        node: u64,
        generation: u64,
    ) -> Result<(), NamespaceError> {
        let known: u64 = match self.generations.read()?.get(node)? {
            Some(g) => decode(g.value(), "generation")?,
            None => 0,
        };
        if generation > known {
            self.generations
                .write()?
                .insert(node, encode(&generation)?.as_slice())?;
        }
        Ok(())
    }

    // --- abandoned stripes ---

    pub(crate) fn is_abandoned(&self, id: StripeId) -> Result<bool, NamespaceError> {
        Ok(self.abandoned.read()?.get(id.0)?.is_some())
    }

    /// Whether the metadata knows the stripe: referenced, or garbage awaiting deletion.
    pub(crate) fn stripe_known(&self, id: StripeId) -> Result<bool, NamespaceError> {
        Ok(self.stripes.read()?.get(id.0)?.is_some() || self.garbage.read()?.get(id.0)?.is_some())
    }

    pub(crate) fn abandon(&mut self, id: StripeId) -> Result<(), NamespaceError> {
        let now = self.clock.now_ms;
        self.abandoned
            .write()?
            .insert(id.0, encode(&now)?.as_slice())?;
        Ok(())
    }

    /// Checks the next few abandoned stripes (wrapping around) and forgets those fenced
    /// for [`ABANDON_KEEP_MS`] of cluster time.
    pub(crate) fn expire_abandoned(&mut self) -> Result<(), NamespaceError> {
        let now = self.clock.now_ms;
        expire_some(
            self.abandoned.write()?,
            &mut self.state,
            KEY_ABANDON_SWEEP,
            |stripe| stripe,
            |id| *id,
            now,
        )
    }

    // --- shard locations ---

    /// The live stripe `id` with its reference count.
    pub(crate) fn live_stripe(&self, id: StripeId) -> Result<Option<StripeEntry>, NamespaceError> {
        record::read_stripe(self.stripes.read()?, id.0)
    }

    /// Writes back a live stripe whose record changed (same id, same length).
    pub(crate) fn put_live_stripe(&mut self, entry: &StripeEntry) -> Result<(), NamespaceError> {
        self.stripes
            .write()?
            .insert(entry.record.id.0, encode(entry)?.as_slice())?;
        Ok(())
    }

    /// The record of a stripe waiting in garbage.
    pub(crate) fn garbage_stripe(
        &self,
        id: StripeId,
    ) -> Result<Option<StripeRecord>, NamespaceError> {
        match self.garbage.read()?.get(id.0)? {
            Some(v) => decode(v.value(), "garbage").map(Some),
            None => Ok(None),
        }
    }

    /// When (cluster clock) `node` disowned its copy of the slot, while the fence holds.
    pub(crate) fn disowned_at(
        &self,
        stripe: StripeId,
        index: u8,
        node: NodeId,
    ) -> Result<Option<u64>, NamespaceError> {
        match self.disowned.read()?.get((stripe.0, index, node.0))? {
            Some(at) => decode(at.value(), "fence").map(Some),
            None => Ok(None),
        }
    }

    pub(crate) fn disown(
        &mut self,
        stripe: StripeId,
        index: u8,
        node: NodeId,
    ) -> Result<(), NamespaceError> {
        let now = self.clock.now_ms;
        self.disowned
            .write()?
            .insert((stripe.0, index, node.0), encode(&now)?.as_slice())?;
        Ok(())
    }

    /// Checks the next few disowned shards (wrapping around) and forgets those fenced for
    /// [`ABANDON_KEEP_MS`] of cluster time.
    pub(crate) fn expire_disowned(&mut self) -> Result<(), NamespaceError> {
        let now = self.clock.now_ms;
        expire_some(
            self.disowned.write()?,
            &mut self.state,
            KEY_DISOWN_SWEEP,
            |stripe| (stripe, 0, 0),
            |key| key.0,
            now,
        )
    }
}

/// One step of a fence table's expiry sweep: reads the next [`ABANDON_SWEEP_STEP`] fences
/// from the stripe cursor kept in `state` under `cursor` (wrapping to the start after the
/// last), moves the cursor past them, and forgets those set [`ABANDON_KEEP_MS`] or more
/// of cluster time before `now`. `first_key` is the smallest key of a stripe, `stripe_of`
/// a key's stripe.
fn expire_some<K>(
    table: &mut Table<'_, K, Bytes>,
    state: &mut Table<'_, &'static str, Bytes>,
    cursor: &'static str,
    first_key: impl Fn(u128) -> K,
    stripe_of: impl Fn(&K) -> u128,
    now: u64,
) -> Result<(), NamespaceError>
where
    K: redb::Key + Copy + 'static + for<'a> redb::Value<SelfType<'a> = K>,
{
    let start: u128 = record::read_state(state, cursor)?.unwrap_or(0);
    let mut seen: Vec<(K, u64)> = Vec::with_capacity(ABANDON_SWEEP_STEP);
    for item in table.range(first_key(start)..)?.take(ABANDON_SWEEP_STEP) {
        let (key, at) = item?;
        seen.push((key.value(), decode(at.value(), "fence")?));
    }
    let next = match seen.last() {
        Some((key, _)) if seen.len() == ABANDON_SWEEP_STEP => stripe_of(key).saturating_add(1),
        _ => 0,
    };
    state.insert(cursor, encode(&next)?.as_slice())?;
    for (key, at) in seen {
        if now.saturating_sub(at) >= ABANDON_KEEP_MS {
            table.remove(key)?;
        }
    }
    Ok(())
}
