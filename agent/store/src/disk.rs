//! The real shard store: `ROOT/shards/<stripe>.<index>` files written through the ring
//! thread, and `ROOT/index.redb` mapping each shard to its length and checksum.
//!
//! A write goes to `<name>.tmp`, is fsync'd, renamed into place, the directory fsync'd, and
//! only then indexed. Start-up recovery discards `.tmp` files (a crash mid-write), indexes
//! valid shard files the index missed (a crash between rename and index commit), removes
//! damaged unindexed files, and drops index entries whose file is gone.
//!
//! Limits: a fill limit (`[storage] capacity`, default 90% of the filesystem) and a
//! filesystem reserve (`[storage] reserve`, 256 MiB, kept free whatever else fills the
//! filesystem: [`StoreError::NoRoom`]); both are answered to a writer as "full". With
//! `[storage] direct_io` shard files are O_DIRECT (aligned buffers, files padded to 4 KiB,
//! probed at open). New files checksum 4 KiB blocks (`BLOCK_SHIFT` 12); files of earlier
//! releases have 64 KiB blocks, which their header names.
//!
//! A put writes the header and block table in one write and the data in a second, straight
//! from the buffer it arrived in (a slice of the RPC frame); only under O_DIRECT are the
//! three assembled in one aligned buffer. A range read reads the header and table and the
//! blocks holding the range at once (two reads), then keeps the file open with its checked
//! header and table (`open_shards.rs`), so later range reads of that shard are one read. A
//! whole-shard read checks every block and that the blocks combine to the header's crc32c.
//! The contract suite runs on this store buffered and with O_DIRECT; `tests/model.rs` runs
//! random operations with restarts.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use tracing::warn;

use crate::CheckedRange;
use crate::header::{self, BLOCK_SHIFT, HEADER_LEN, ShardHeader};
use crate::open_shards::{OpenShard, OpenShards};
use crate::{Ring, ShardKey, ShardStore, StoreError, StoreUsage, slice};

/// (stripe, index) → (data length, data crc32c).
const SHARDS: TableDefinition<(u128, u8), (u64, u32)> = TableDefinition::new("shards");

/// What start-up recovery found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Half-written shard files discarded.
    pub discarded_partial: Vec<String>,
    /// Complete shard files the index had missed, now indexed.
    pub reindexed: u64,
    /// Damaged unindexed files removed.
    pub removed_corrupt: Vec<String>,
    /// Index entries whose file was gone, removed.
    pub dropped_index_entries: u64,
}

#[derive(Default)]
struct State {
    index: BTreeMap<ShardKey, (u64, u32)>,
    used: u64,
    /// Bytes of writes in progress, counted against the limit.
    reserved: u64,
    writing: BTreeSet<ShardKey>,
    /// Files kept open after a range read; an entry goes with its index entry.
    open: OpenShards,
}

pub struct DiskStore {
    /// Shard files use O_DIRECT.
    direct: bool,
    shards: PathBuf,
    db: Arc<Database>,
    ring: Ring,
    limit: u64,
    /// Bytes of the filesystem left free for everything else on it (the metadata among
    /// them): a write that would leave less fails like one past the fill limit.
    reserve: std::sync::atomic::AtomicU64,
    state: Mutex<State>,
    metrics: std::sync::OnceLock<crate::StoreMetrics>,
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> StoreError + 'a {
    move |source| StoreError::Io {
        op,
        path: path.to_owned(),
        source,
    }
}

fn index_err(e: impl std::fmt::Display) -> StoreError {
    StoreError::Index(e.to_string())
}

/// O_DIRECT needs buffers, offsets and lengths aligned to this.
const DIRECT_ALIGN: usize = 4096;

/// Bytes a shard file takes: header, block table and data, padded to [`DIRECT_ALIGN`]
/// under O_DIRECT.
fn file_size(data_len: u64, direct: bool) -> u64 {
    let raw = header::data_offset(data_len) + data_len;
    if direct {
        raw.next_multiple_of(DIRECT_ALIGN as u64)
    } else {
        raw
    }
}

/// A zeroed buffer of `len + DIRECT_ALIGN` bytes and the offset inside it where `len`
/// aligned bytes start.
fn aligned_buffer(len: usize) -> (Vec<u8>, usize) {
    let buf = vec![0u8; len + DIRECT_ALIGN];
    let start = buf.as_ptr().align_offset(DIRECT_ALIGN);
    (buf, start)
}

fn open_flags(direct: bool) -> i32 {
    if direct {
        nix::fcntl::OFlag::O_DIRECT.bits()
    } else {
        0
    }
}

/// The index as stored (creating its table on a new store).
fn read_index(db: &Database) -> Result<BTreeMap<ShardKey, (u64, u32)>, StoreError> {
    let tx = db.begin_write().map_err(index_err)?;
    tx.open_table(SHARDS).map_err(index_err)?;
    tx.commit().map_err(index_err)?;
    let tx = db.begin_read().map_err(index_err)?;
    let table = tx.open_table(SHARDS).map_err(index_err)?;
    let mut index = BTreeMap::new();
    for row in table.iter().map_err(index_err)? {
        let (k, v) = row.map_err(index_err)?;
        let (stripe, idx) = k.value();
        index.insert(ShardKey { stripe, index: idx }, v.value());
    }
    Ok(index)
}

/// Start-up recovery over the shard files: discards half-written ones, checks the ones the
/// index missed (valid ones are returned to be indexed, damaged ones removed). Returns
/// the keys of every shard file and the entries to add.
#[allow(clippy::type_complexity)]
fn scan_shards(
    shards: &Path,
    index: &BTreeMap<ShardKey, (u64, u32)>,
    recovery: &mut Recovery,
) -> Result<(BTreeSet<ShardKey>, Vec<(ShardKey, (u64, u32))>), StoreError> {
    let mut on_disk = BTreeSet::new();
    let mut add = Vec::new();
    for entry in std::fs::read_dir(shards).map_err(io_err("list", shards))? {
        let entry = entry.map_err(io_err("list", shards))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if name.ends_with(".tmp") {
            std::fs::remove_file(&path).map_err(io_err("remove", &path))?;
            warn!(file = %name, "discarded a shard half-written at crash");
            recovery.discarded_partial.push(name);
            continue;
        }
        let Some(key) = parse_name(&name) else {
            continue;
        };
        on_disk.insert(key);
        if index.contains_key(&key) {
            continue;
        }
        let bytes = std::fs::read(&path).map_err(io_err("read", &path))?;
        match check(key, &bytes) {
            Ok(h) => {
                add.push((key, (h.data_len, h.data_crc)));
                recovery.reindexed += 1;
            }
            Err(reason) => {
                std::fs::remove_file(&path).map_err(io_err("remove", &path))?;
                warn!(file = %name, %reason, "removed a damaged unindexed shard file");
                recovery.removed_corrupt.push(name);
            }
        }
    }
    Ok((on_disk, add))
}

/// Indexes `add` and drops `gone` in one commit.
fn fix_index(
    db: &Database,
    add: &[(ShardKey, (u64, u32))],
    gone: &[ShardKey],
) -> Result<(), StoreError> {
    if add.is_empty() && gone.is_empty() {
        return Ok(());
    }
    let tx = db.begin_write().map_err(index_err)?;
    {
        let mut table = tx.open_table(SHARDS).map_err(index_err)?;
        for (k, v) in add {
            table.insert((k.stripe, k.index), *v).map_err(index_err)?;
        }
        for k in gone {
            table.remove((k.stripe, k.index)).map_err(index_err)?;
        }
    }
    tx.commit().map_err(index_err)?;
    for k in gone {
        warn!(shard = %k, "dropped an index entry whose shard file is gone");
    }
    Ok(())
}

fn parse_name(name: &str) -> Option<ShardKey> {
    let (stripe, index) = name.split_once('.')?;
    if stripe.len() != 32 {
        return None;
    }
    Some(ShardKey {
        stripe: u128::from_str_radix(stripe, 16).ok()?,
        index: index.parse().ok()?,
    })
}

impl DiskStore {
    /// Reports this store's usage and corrupt shards through `metrics` from now on.
    pub fn attach_metrics(&self, metrics: crate::StoreMetrics) {
        metrics.set_usage(&self.usage());
        let _ = self.metrics.set(metrics);
    }

    fn report_usage(&self) {
        if let Some(m) = self.metrics.get() {
            m.set_usage(&self.usage());
        }
    }

    /// Counts `res` if it found the shard corrupt, and passes it on.
    fn note<T>(&self, res: Result<T, StoreError>) -> Result<T, StoreError> {
        if let (Err(StoreError::Corrupt { .. }), Some(m)) = (&res, self.metrics.get()) {
            m.count_corrupt();
        }
        res
    }

    /// Keeps `bytes` of the store's filesystem free: writes that would leave less fail
    /// with [`StoreError::NoRoom`] (0, the default, checks only the fill limit).
    pub fn set_reserve(&self, bytes: u64) {
        self.reserve
            .store(bytes, std::sync::atomic::Ordering::Relaxed);
    }

    fn reserve(&self) -> u64 {
        self.reserve.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Bytes free on the store's filesystem for an unprivileged writer (0 if unknown).
    fn fs_free(&self) -> u64 {
        nix::sys::statvfs::statvfs(&self.shards)
            .map(|s| s.blocks_available() * s.fragment_size())
            .unwrap_or(0)
    }

    /// Bytes of new shard files the store can take now: what the fill limit and the
    /// filesystem's free space (less the reserve) both allow.
    pub fn room(&self) -> u64 {
        let by_limit = {
            let st = self.lock();
            self.limit.saturating_sub(st.used + st.reserved)
        };
        let reserve = self.reserve();
        if reserve == 0 {
            return by_limit;
        }
        by_limit.min(self.fs_free().saturating_sub(reserve))
    }

    /// How the store's I/O ring is doing.
    pub fn ring_health(&self) -> crate::RingHealth {
        self.ring.health()
    }

    /// Opens (creating if needed) the store under `root`, refusing writes past `limit`
    /// bytes, and recovers from a crash.
    pub async fn open(root: &Path, limit: u64, ring: Ring) -> Result<(Self, Recovery), StoreError> {
        Self::open_with(root, limit, ring, false).await
    }

    /// Like [`DiskStore::open`]; with `direct_io` shard files are written and read with
    /// O_DIRECT (bypassing the page cache the training job lives on), padded to 4 KiB.
    pub async fn open_with(
        root: &Path,
        limit: u64,
        ring: Ring,
        direct_io: bool,
    ) -> Result<(Self, Recovery), StoreError> {
        let root = root.to_owned();
        tokio::task::spawn_blocking(move || Self::open_blocking(&root, limit, ring, direct_io))
            .await
            .map_err(|e| StoreError::Index(format!("open task failed: {e}")))?
    }

    fn open_blocking(
        root: &Path,
        limit: u64,
        ring: Ring,
        direct: bool,
    ) -> Result<(Self, Recovery), StoreError> {
        let shards = root.join("shards");
        std::fs::create_dir_all(&shards).map_err(io_err("create", &shards))?;
        if direct {
            probe_direct_io(&shards)?;
        }
        let db = Database::create(root.join("index.redb")).map_err(index_err)?;
        let mut index = read_index(&db)?;
        let mut recovery = Recovery::default();
        let (on_disk, add) = scan_shards(&shards, &index, &mut recovery)?;
        let gone: Vec<ShardKey> = index
            .keys()
            .filter(|k| !on_disk.contains(k))
            .copied()
            .collect();
        recovery.dropped_index_entries = gone.len() as u64;
        fix_index(&db, &add, &gone)?;
        for (k, v) in add {
            index.insert(k, v);
        }
        for k in gone {
            index.remove(&k);
        }
        let used = index.values().map(|(len, _)| file_size(*len, direct)).sum();
        let store = DiskStore {
            direct,
            shards,
            db: Arc::new(db),
            ring,
            limit,
            reserve: std::sync::atomic::AtomicU64::new(0),
            metrics: std::sync::OnceLock::new(),
            state: Mutex::new(State {
                index,
                used,
                ..State::default()
            }),
        };
        Ok((store, recovery))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn path(&self, key: ShardKey) -> PathBuf {
        self.shards.join(key.to_string())
    }

    async fn index_update(
        &self,
        key: ShardKey,
        value: Option<(u64, u32)>,
    ) -> Result<(), StoreError> {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || {
            let tx = db.begin_write().map_err(index_err)?;
            {
                let mut table = tx.open_table(SHARDS).map_err(index_err)?;
                match value {
                    Some(v) => {
                        table
                            .insert((key.stripe, key.index), v)
                            .map_err(index_err)?;
                    }
                    None => {
                        table.remove((key.stripe, key.index)).map_err(index_err)?;
                    }
                }
            }
            tx.commit().map_err(index_err)
        })
        .await
        .map_err(|e| StoreError::Index(format!("index task failed: {e}")))?
    }

    /// Writes a shard file's header, block table and data. Under O_DIRECT they go out
    /// as one aligned, padded buffer; otherwise as two writes, the data straight from the
    /// buffer it arrived in (copying each shard into a fresh file-sized buffer cost a
    /// page-zeroing and a copy per byte written).
    async fn write_contents(
        &self,
        file: &Arc<File>,
        head: &ShardHeader,
        table: &[u8],
        data: &Bytes,
    ) -> std::io::Result<()> {
        let prefix = HEADER_LEN + table.len();
        debug_assert_eq!(prefix as u64, header::data_offset(data.len() as u64));
        if self.direct {
            let size = file_size(data.len() as u64, true) as usize;
            let (mut buf, start) = aligned_buffer(size);
            buf[start..start + HEADER_LEN].copy_from_slice(&head.encode());
            buf[start + HEADER_LEN..start + prefix].copy_from_slice(table);
            buf[start + prefix..start + prefix + data.len()].copy_from_slice(data);
            return self
                .ring
                .write_range(file.clone(), buf, start..start + size, 0)
                .await;
        }
        let mut first = Vec::with_capacity(prefix);
        first.extend_from_slice(&head.encode());
        first.extend_from_slice(table);
        let head_write = self.ring.write_all(file.clone(), first, 0);
        let data_write = self
            .ring
            .write_all(file.clone(), data.clone(), prefix as u64);
        tokio::try_join!(head_write, data_write).map(|_| ())
    }

    async fn write_file(
        &self,
        key: ShardKey,
        head: &ShardHeader,
        table: &[u8],
        data: &Bytes,
    ) -> Result<(), StoreError> {
        let tmp = self.shards.join(format!("{key}.tmp"));
        let file = File::options()
            .create(true)
            .truncate(true)
            .write(true)
            .custom_flags(open_flags(self.direct))
            .open(&tmp)
            .map_err(io_err("create", &tmp))?;
        let file = Arc::new(file);
        let res = async {
            self.write_contents(&file, head, table, data)
                .await
                .map_err(io_err("write", &tmp))?;
            self.ring.fsync(file).await.map_err(io_err("fsync", &tmp))?;
            let dest = self.path(key);
            std::fs::rename(&tmp, &dest).map_err(io_err("rename", &dest))?;
            // Through the ring too: an fsync on the runtime thread stops every task on it
            // (with one runtime thread, the whole agent) until the disk answers.
            let dir = File::open(&self.shards).map_err(io_err("open", &self.shards))?;
            self.ring
                .fsync(Arc::new(dir))
                .await
                .map_err(io_err("fsync", &self.shards))
        }
        .await;
        if res.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        res
    }

    /// A range read that checks only the blocks it returns; `None` for a version-1 file
    /// (no block table: the caller reads and checks all of it).
    async fn get_blocks(
        &self,
        key: ShardKey,
        entry: (u64, u32),
        offset: u64,
        len: Option<u64>,
    ) -> Result<Option<Bytes>, StoreError> {
        let end = range_end(key, entry.0, offset, len)?;
        if offset == end {
            return Ok(Some(Bytes::new()));
        }
        Ok(self.read_blocks(key, entry, offset, end).await?.map(|r| {
            let skip = (offset - (r.first << r.shift)) as usize;
            r.blocks.slice(skip..skip + (end - offset) as usize)
        }))
    }

    /// The blocks holding `[offset, end)` and the block table, checked; `None` for a
    /// version-1 file (no block table), which is read whole instead. A shard read before
    /// is still open with its table ([`OpenShards`]): one read. Otherwise the header and
    /// table are read together with the blocks, laid out as this release's block size
    /// would have them; a file of an earlier release's block size (its header says which)
    /// is read again with its own.
    async fn read_blocks(
        &self,
        key: ShardKey,
        (data_len, crc): (u64, u32),
        offset: u64,
        end: u64,
    ) -> Result<Option<CheckedRange>, StoreError> {
        let corrupt = |reason: String| StoreError::Corrupt { key, reason };
        let kept = self.lock().open.get(key, (data_len, crc));
        if let Some(open) = kept {
            let (from, to) = block_span(offset, end, open.header.block_shift, data_len);
            let blocks = self
                .read_at(
                    open.file.clone(),
                    open.header.data_offset() + from,
                    to - from,
                )
                .await
                .map_err(io_err("read", &self.path(key)))?;
            return checked_range(&open.header, open.table, from, to, blocks)
                .map(Some)
                .map_err(corrupt);
        }
        let (file, path) = self.open_shard(key)?;
        let mut shift = BLOCK_SHIFT;
        loop {
            let start = HEADER_LEN as u64 + 4 * header::block_count(data_len, shift);
            let (from, to) = block_span(offset, end, shift, data_len);
            let (head, blocks) = tokio::try_join!(
                self.read_at(file.clone(), 0, start),
                self.read_at(file.clone(), start + from, to - from),
            )
            .map_err(io_err("read", &path))?;
            let h = ShardHeader::decode(&head).map_err(corrupt)?;
            if h.key != key {
                return Err(corrupt(format!("header names shard {}", h.key)));
            }
            if h.data_len != data_len || h.data_crc != crc {
                return Err(corrupt("shard differs from its index entry".into()));
            }
            if h.block_shift == 0 {
                return Ok(None);
            }
            if h.block_shift != shift {
                if !(9..=30).contains(&h.block_shift) || shift != BLOCK_SHIFT {
                    return Err(corrupt(format!("block size 2^{}", h.block_shift)));
                }
                shift = h.block_shift;
                continue;
            }
            if head.len() as u64 != start {
                return Err(corrupt("shard file is shorter than its header says".into()));
            }
            let table = head.slice(HEADER_LEN..);
            let range = checked_range(&h, table.clone(), from, to, blocks).map_err(corrupt)?;
            self.keep_open(key, file, h, table);
            return Ok(Some(range));
        }
    }

    /// Keeps a checked shard file open, unless its index entry changed meanwhile (a
    /// delete drops the entry under the same lock: nothing keeps a deleted file).
    fn keep_open(&self, key: ShardKey, file: Arc<File>, header: ShardHeader, table: Bytes) {
        let mut st = self.lock();
        if st.index.get(&key) == Some(&(header.data_len, header.data_crc)) {
            let open = OpenShard {
                file,
                header,
                table,
            };
            st.open.keep(key, open);
        }
    }

    /// A shard's file, opened for reading, and its path.
    fn open_shard(&self, key: ShardKey) -> Result<(Arc<File>, PathBuf), StoreError> {
        let path = self.path(key);
        let file = File::options()
            .read(true)
            .custom_flags(open_flags(self.direct))
            .open(&path)
            .map_err(io_err("open", &path))?;
        Ok((Arc::new(file), path))
    }

    /// `len` bytes of `file` at `pos` (fewer at its end), read through an aligned buffer
    /// under O_DIRECT.
    async fn read_at(&self, file: Arc<File>, pos: u64, len: u64) -> std::io::Result<Bytes> {
        let align = if self.direct { DIRECT_ALIGN as u64 } else { 1 };
        let from = pos - pos % align;
        let size = ((pos + len).next_multiple_of(align) - from) as usize;
        let (mut buf, start) = if self.direct {
            aligned_buffer(size)
        } else {
            (vec![0u8; size], 0)
        };
        buf.truncate(start + size);
        let read = if self.direct {
            self.ring.read_into(file, buf, start, from).await?
        } else {
            self.ring
                .read_into_cached_first(file, buf, start, from)
                .await?
        };
        let bytes = Bytes::from(read);
        let skip = ((pos - from) as usize).min(bytes.len());
        let got = (bytes.len() - skip).min(len as usize);
        Ok(bytes.slice(skip..skip + got))
    }
}

/// The whole blocks of 2^`shift` bytes holding `[offset, end)` of a shard of `data_len`
/// bytes: where they start and end.
fn block_span(offset: u64, end: u64, shift: u8, data_len: u64) -> (u64, u64) {
    let from = (offset >> shift) << shift;
    (from, end.next_multiple_of(1 << shift).min(data_len))
}

/// `blocks`, read for `[from, to)` of the shard, checked against `header`'s block `table`.
fn checked_range(
    header: &ShardHeader,
    table: Bytes,
    from: u64,
    to: u64,
    blocks: Bytes,
) -> Result<CheckedRange, String> {
    if blocks.len() as u64 != to - from {
        return Err("shard file is shorter than its header says".into());
    }
    let shift = header.block_shift;
    header.verify_blocks(&table, from >> shift, &blocks)?;
    Ok(CheckedRange {
        data_len: header.data_len,
        shift,
        first: from >> shift,
        blocks,
        table,
    })
}

/// Fails clearly where the filesystem refuses O_DIRECT (tmpfs, some overlays).
fn probe_direct_io(dir: &Path) -> Result<(), StoreError> {
    let probe = dir.join(".direct-io-probe");
    let res = File::options()
        .create(true)
        .truncate(true)
        .write(true)
        .custom_flags(open_flags(true))
        .open(&probe)
        .and_then(|mut f| {
            use std::io::Write;
            let (buf, start) = aligned_buffer(DIRECT_ALIGN);
            f.write_all(&buf[start..start + DIRECT_ALIGN])
        });
    let _ = std::fs::remove_file(&probe);
    res.map_err(|source| StoreError::Io {
        op: "use O_DIRECT (storage.direct_io) in",
        path: dir.to_owned(),
        source,
    })
}

/// Decodes and verifies a whole shard file.
/// The end of `[offset, offset+len)` (to the end of the data when `len` is None), or an
/// error when it is not within the shard's `data_len` bytes.
fn range_end(
    key: ShardKey,
    data_len: u64,
    offset: u64,
    len: Option<u64>,
) -> Result<u64, StoreError> {
    let end = match len {
        Some(l) => offset.checked_add(l),
        None => Some(data_len),
    };
    end.filter(|&e| offset <= e && e <= data_len)
        .ok_or(StoreError::OutOfRange {
            key,
            offset,
            len,
            size: data_len,
        })
}

pub(crate) fn check(key: ShardKey, bytes: &[u8]) -> Result<ShardHeader, String> {
    let h = ShardHeader::decode(bytes)?;
    if h.key != key {
        return Err(format!("header names shard {}", h.key));
    }
    let start = h.data_offset();
    let end = start.saturating_add(h.data_len);
    // Files written with O_DIRECT carry zero padding up to the next 4 KiB.
    if (bytes.len() as u64) < end || bytes.len() as u64 >= end.saturating_add(DIRECT_ALIGN as u64) {
        return Err(format!(
            "{} bytes in file, header says {} data bytes",
            bytes.len(),
            h.data_len
        ));
    }
    h.verify_all(
        &bytes[HEADER_LEN..start as usize],
        &bytes[start as usize..end as usize],
    )?;
    Ok(h)
}

impl ShardStore for DiskStore {
    async fn put(&self, key: ShardKey, data: Bytes) -> Result<(), StoreError> {
        let res = self.put_shard(key, data).await;
        self.report_usage();
        res
    }

    async fn get(&self, key: ShardKey, offset: u64, len: Option<u64>) -> Result<Bytes, StoreError> {
        let res = self.get_shard(key, offset, len).await;
        self.note(res)
    }

    async fn get_checked(
        &self,
        key: ShardKey,
        offset: u64,
        len: u64,
    ) -> Result<CheckedRange, StoreError> {
        let entry = *self
            .lock()
            .index
            .get(&key)
            .ok_or(StoreError::NotFound(key))?;
        let end = range_end(key, entry.0, offset, Some(len))?;
        // An empty range still comes with a block around it (none in an empty shard).
        let upto = if end == offset {
            (offset + 1).min(entry.0)
        } else {
            end
        };
        let read = if offset == upto {
            Ok(None)
        } else {
            self.read_blocks(key, entry, offset, upto).await
        };
        let res = match read {
            Ok(Some(r)) => Ok(r),
            // A version-1 file (no block table): read whole and checked, then cut.
            Ok(None) => self
                .get_shard(key, 0, None)
                .await
                .map(|data| CheckedRange::of(&data, offset, end)),
            Err(e) => Err(e),
        };
        self.note(res)
    }

    async fn delete(&self, key: ShardKey) -> Result<bool, StoreError> {
        let res = self.delete_shard(key).await;
        self.report_usage();
        res
    }

    fn list(&self) -> Vec<(ShardKey, u64)> {
        self.lock()
            .index
            .iter()
            .map(|(k, (len, _))| (*k, *len))
            .collect()
    }

    fn list_after(&self, after: Option<ShardKey>, limit: usize) -> Vec<(ShardKey, u64)> {
        use std::ops::Bound;
        let start = after.map_or(Bound::Unbounded, Bound::Excluded);
        self.lock()
            .index
            .range((start, Bound::Unbounded))
            .take(limit)
            .map(|(k, (len, _))| (*k, *len))
            .collect()
    }

    fn usage(&self) -> StoreUsage {
        let st = self.lock();
        StoreUsage {
            shards: st.index.len() as u64,
            used_bytes: st.used,
            limit_bytes: self.limit,
        }
    }
}

impl DiskStore {
    async fn put_shard(&self, key: ShardKey, data: Bytes) -> Result<(), StoreError> {
        let size = file_size(data.len() as u64, self.direct);
        let (head, table) = ShardHeader::for_data(key, &data);
        let crc = head.data_crc;
        {
            let mut st = self.lock();
            if let Some(&(len, known)) = st.index.get(&key) {
                return if len == data.len() as u64 && known == crc {
                    Ok(())
                } else {
                    Err(StoreError::Conflict(key))
                };
            }
            if st.writing.contains(&key) {
                return Err(StoreError::Conflict(key));
            }
            let committed = st.used + st.reserved;
            if committed + size > self.limit {
                return Err(StoreError::Full {
                    need: size,
                    used: committed,
                    limit: self.limit,
                });
            }
            let reserve = self.reserve();
            if reserve > 0 {
                // Other users of the filesystem count too: the limit alone does not see them.
                let free = self.fs_free().saturating_sub(st.reserved);
                if free < size.saturating_add(reserve) {
                    return Err(StoreError::NoRoom {
                        need: size,
                        free,
                        reserve,
                    });
                }
            }
            st.reserved += size;
            st.writing.insert(key);
        }
        let res = match self.write_file(key, &head, &table, &data).await {
            Ok(()) => self.index_update(key, Some((data.len() as u64, crc))).await,
            Err(e) => Err(e),
        };
        let mut st = self.lock();
        st.reserved -= size;
        st.writing.remove(&key);
        if res.is_ok() {
            st.index.insert(key, (data.len() as u64, crc));
            st.used += size;
        }
        res
    }

    async fn get_shard(
        &self,
        key: ShardKey,
        offset: u64,
        len: Option<u64>,
    ) -> Result<Bytes, StoreError> {
        let (data_len, crc) = *self
            .lock()
            .index
            .get(&key)
            .ok_or(StoreError::NotFound(key))?;
        let whole = offset == 0 && len.is_none_or(|l| l >= data_len);
        if !whole && let Some(bytes) = self.get_blocks(key, (data_len, crc), offset, len).await? {
            return Ok(bytes);
        }
        let (file, path) = self.open_shard(key)?;
        let bytes = self
            .read_at(file, 0, file_size(data_len, self.direct))
            .await
            .map_err(io_err("read", &path))?;
        let corrupt = |reason: String| StoreError::Corrupt { key, reason };
        let h = check(key, &bytes).map_err(corrupt)?;
        if h.data_len != data_len || h.data_crc != crc {
            return Err(corrupt("shard differs from its index entry".into()));
        }
        let start = h.data_offset() as usize;
        let data = bytes.slice(start..start + data_len as usize);
        slice(key, data, offset, len)
    }

    async fn delete_shard(&self, key: ShardKey) -> Result<bool, StoreError> {
        let Some((len, _)) = self.lock().index.get(&key).copied() else {
            return Ok(false);
        };
        self.index_update(key, None).await?;
        let path = self.path(key);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err("remove", &path)(e)),
        }
        let mut st = self.lock();
        st.open.drop_key(key);
        if st.index.remove(&key).is_some() {
            st.used -= file_size(len, self.direct);
        }
        Ok(true)
    }
}
