//! [`FsService`]: one request from a local mount in, one answer out. Queries are answered
//! from the local replica (`serve_query`), changes are committed through the group
//! (`serve_change`); file data is in `write.rs` and below.
//!
//! Read barriers (close-to-open): a lookup that finds nothing (every lookup for a mount
//! older than protocol 8), `open`, a stat by path (`GetAttrFresh`) of anything but a
//! directory, a listing from its start, and a getattr that finds nothing. The open inside a
//! create (`Open.synced`) skips it unless the inode is not found here. After it starts, the
//! agent answers nothing from its replica before one barrier ([`FsService::caught_up`]);
//! `Reopen` records the mount's claim on the inode before its barrier.
//!
//! A read's answer is the shard ranges (or decoded data shards) as they arrived, in order,
//! with zeros for holes (`lay_out`); the socket writes the `Data` frame's head and then
//! each part (`write_data_frame_as`), so the agent copies no file data into an answer
//! buffer. `StatFs`: total and free are the alive members' filesystems scaled by k/(k+m);
//! the block size is k × 1 MiB (the mount's stripe size).

use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes};
use shoal_agent_api::{
    DELIVERY_WAIT_MS, FileAttr, FileKind, FsError, FsRequest, FsResponse, FsStats, Ino,
    MAX_DIR_PAGE, MAX_READ, MAX_WATCH_MS, PARENT_ATTRS_SINCE, RequestId, UnsyncedAnswer,
};
use shoal_mesh::{GossipHandle, MemberState, Transport};
use shoal_namespace::format::Timestamp;
use shoal_namespace::{Command, NamespaceError, Outcome, Proposal};
use shoal_placement::DEFAULT_SHARD_SIZE;
use tokio::task::JoinSet;

use super::handles::OpenHandles;
use super::leases::{Leases, Prior};
use super::recall;
use super::turns::Turns;
use crate::consensus::{ConsensusError, Group};
use crate::data::Stripes;
use crate::tier::Tier;

/// How many times one change is asked again after a lease was recalled (another node
/// may take the lease again meanwhile).
const MAX_RECALLS: u32 = 8;

pub struct FsService {
    pub(super) group: Arc<Group>,
    pub(super) stripes: Arc<Stripes>,
    gossip: GossipHandle,
    handles: Arc<OpenHandles>,
    tier: Option<Arc<Tier>>,
    pub(super) transport: Arc<Transport>,
    /// This node's directory leases (`leased.rs`).
    pub(super) leases: Arc<Leases>,
    /// Whether the replica has caught up with the group once since this agent started
    /// (see [`FsService::caught_up`]).
    caught_up: std::sync::atomic::AtomicBool,
    /// Copies of one change request answered one after another (`turns.rs`).
    turns: Turns<RequestId>,
}

impl FsService {
    pub fn new(
        group: Arc<Group>,
        stripes: Arc<Stripes>,
        gossip: GossipHandle,
        handles: Arc<OpenHandles>,
        tier: Option<Arc<Tier>>,
        transport: Arc<Transport>,
    ) -> Self {
        let session = crate::sim_thread::random_u64();
        let leases = Arc::new(Leases::new(
            group.clone(),
            gossip.clone(),
            shoal_placement::NodeId(group.me),
            session,
        ));
        recall::serve(&leases, &transport);
        FsService {
            group,
            stripes,
            gossip,
            handles,
            tier,
            transport,
            leases,
            caught_up: std::sync::atomic::AtomicBool::new(false),
            turns: Turns::default(),
        }
    }

    /// Waits, once per agent start, until the local replica has caught up with the group
    /// (a read barrier). A restarted replica may be behind what this very node
    /// acknowledged before it stopped (after a power cut, the applies it had not flushed
    /// and the commit index it wrote without a sync are gone until the leader says
    /// again), and queries are answered from it without a barrier of their own: a read
    /// through a handle held across the restart saw a file's older bytes (found by the
    /// simulator, seed 421 of `power-loss`).
    async fn caught_up(&self) -> Result<(), FsError> {
        use std::sync::atomic::Ordering;
        if !self.caught_up.load(Ordering::Acquire) {
            match self.group.barrier().await {
                Ok(()) => self.caught_up.store(true, Ordering::Release),
                // Outside any group yet: nothing was acknowledged through this replica
                // (it is empty), and it is answered as it is (changes fail with the
                // reason).
                Err(ConsensusError::NotMember { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Serves one request from the local client with process id `pid` (from the socket's
    /// peer credentials), which speaks protocol `version`: from 6 on it understands
    /// [`FsError::Stale`] (an older mount is served an open of an inode without names as
    /// before), from 8 on [`FsResponse::Opened`].
    pub async fn handle(
        self: &Arc<Self>,
        req: FsRequest,
        pid: Option<i32>,
        version: u8,
    ) -> FsResponse {
        if let Some(session) = session_of(&req)
            && !self.handles.claim(session, pid)
        {
            return FsResponse::Error(FsError::NotPermitted);
        }
        if let Some(why) = self.group.failure() {
            // The replica is frozen where the metadata member stopped: nothing is answered
            // from it (the mount waits for the restarted agent).
            return FsResponse::Error(FsError::Unavailable(format!(
                "this node's metadata member failed: {why}"
            )));
        }
        // A release, a reopen (which records its claim before anything that can wait)
        // and the change feed do not read the replica's files.
        let reads_replica = !matches!(
            req,
            FsRequest::Release { .. }
                | FsRequest::Reopen { .. }
                | FsRequest::Watch { .. }
                | FsRequest::Sync { .. }
        );
        let answer = if let FsRequest::Create { .. } = req {
            self.serve_create(req, pid, version).await
        } else if is_change(&req) {
            self.change(req, version).await
        } else if let FsRequest::Sync { ino, session } = req {
            self.leases
                .sync(ino, session)
                .await
                .map(|()| FsResponse::Synced {
                    instance: self.leases.instance(),
                    clean_start: self.leases.clean_start(),
                })
        } else if reads_replica && let Err(e) = self.caught_up().await {
            Err(e)
        } else {
            match self.leased_query(&req, pid, version).await {
                Some(answer) => answer,
                None => self.serve_query(req, pid, version).await,
            }
        };
        answer.unwrap_or_else(FsResponse::Error)
    }

    /// `FsRequest::Create`: made as a `MkNode` is (its request id answers a copy sent
    /// again), then held open as an `Open` would be (a new file has its name: no staleness
    /// to check).
    async fn serve_create(
        &self,
        req: FsRequest,
        pid: Option<i32>,
        version: u8,
    ) -> Result<FsResponse, FsError> {
        let FsRequest::Create {
            id,
            parent,
            name,
            perm,
            owner,
            session,
            handle,
        } = req
        else {
            return Err(FsError::Invalid);
        };
        let mknode = FsRequest::MkNode {
            id,
            parent,
            name,
            kind: FileKind::File,
            perm,
            owner,
            rdev: 0,
            target: None,
        };
        let made = self.change(mknode, version).await;
        if let Ok(
            FsResponse::Entry(a)
            | FsResponse::Unsynced(
                UnsyncedAnswer::Entry(a) | UnsyncedAnswer::EntryIn { attr: a, .. },
            ),
        ) = &made
        {
            self.handles.hold(session, handle, a.ino, pid);
        }
        made
    }

    /// A change from a mount speaking `version`: answered from the leases when they answer
    /// its mount, else committed.
    ///
    /// A lease's answer to a mount of protocol 13 on carries the attributes of the
    /// directory it changed, after it: the kernel asks for them right after each of its
    /// creates and unlinks (its permission check), and the mount answers that from them.
    async fn change(&self, req: FsRequest, version: u8) -> Result<FsResponse, FsError> {
        if !self.answers_from_leases(session_of(&req), version) {
            return self.serve_change(req).await;
        }
        let dir = changed_dir(&req).filter(|_| version >= PARENT_ATTRS_SINCE);
        let answer = self.serve_change_leased(req).await;
        match (answer, dir) {
            (Ok(FsResponse::Unsynced(answer)), Some(dir)) => {
                Ok(FsResponse::Unsynced(match self.dir_attr_now(dir) {
                    Some(parent) => answer.with_parent(parent),
                    None => answer,
                }))
            }
            (answer, _) => answer,
        }
    }

    /// Directory `dir`'s attributes as this node has them now: the pending changes' when
    /// they touched it, else the replica's.
    fn dir_attr_now(&self, dir: Ino) -> Option<FileAttr> {
        match self.leases.attr(dir) {
            Some(attr) => attr,
            None => self.group.store().getattr(dir).ok(),
        }
        .filter(|a| a.kind == FileKind::Dir)
    }

    /// Requests answered from the local replica (and the stripes), with read barriers
    /// where close-to-open needs them.
    async fn serve_query(
        &self,
        req: FsRequest,
        pid: Option<i32>,
        version: u8,
    ) -> Result<FsResponse, FsError> {
        let store = self.group.store();
        Ok(match req {
            FsRequest::Lookup { parent, name } => {
                // A mount of protocol 8 follows the change feed and checks the names an
                // open was reached by after the open's barrier: a name found here is
                // answered at once (if another node changed it meanwhile, the open that
                // follows answers ESTALE and the kernel looks it up again).
                let feed = &self.group.changes;
                // The feed's position is read before the entry: every change before it
                // is in the answer.
                let entry = |attr, position| {
                    if version >= 9 {
                        FsResponse::EntryAt {
                            attr,
                            epoch: feed.epoch(),
                            position,
                        }
                    } else {
                        FsResponse::Entry(attr)
                    }
                };
                let position = feed.position();
                if version >= 8
                    && store.dir_lease(parent)?.is_none()
                    && let Ok(attr) = store.lookup(parent, &name)
                {
                    return Ok(entry(attr, position));
                }
                // At the leader's commit point: a name another node just created, removed
                // or renamed over must resolve as it does there now (the kernel then caches
                // the answer for the entry TTL). Concurrent lookups share one round. Under
                // another node's lease on the directory, what it answered there is
                // committed first (the barrier shows the lease: it was granted before the
                // holder answered anything under it).
                self.group.barrier().await?;
                self.recall_in(parent).await?;
                let position = feed.position();
                entry(store.lookup(parent, &name)?, position)
            }
            FsRequest::GetAttr { ino } => FsResponse::Attr(self.getattr_fresh(ino).await?),
            FsRequest::GetAttrFresh { ino } => {
                // A directory's attributes follow another node's changes through the
                // mount's change feed (its kernel keeps them for the long TTL); the stat
                // the kernel sends after its own create or unlink in the directory finds
                // that change applied here already. Only a file's size and mtime must be
                // the leader's (close-to-open), so only they wait for a read barrier.
                if let Ok(attr) = store.getattr(ino)
                    && attr.kind == FileKind::Dir
                {
                    return Ok(FsResponse::Attr(attr));
                }
                self.group.barrier().await?;
                self.recall_all().await?;
                FsResponse::Attr(store.getattr(ino)?)
            }
            FsRequest::ReadLink { ino } => FsResponse::ReadLink(store.readlink(ino)?),
            FsRequest::ReadDir { ino, after, limit } => {
                // A listing from the start is an open of the directory (close-to-open);
                // the pages after it come from a replica at least that fresh.
                if after.is_none() {
                    self.group.barrier().await?;
                    self.recall_in(ino).await?;
                }
                let limit = limit.clamp(1, MAX_DIR_PAGE) as usize;
                match store.readdir_page(ino, after.as_deref(), limit) {
                    Ok((entries, more)) => FsResponse::Entries { entries, more },
                    // Removed while being listed: it was empty (rmdir), so the listing
                    // ends, as on a local filesystem.
                    Err(NamespaceError::Fs(FsError::NotFound)) if after.is_some() => {
                        FsResponse::Entries {
                            entries: Vec::new(),
                            more: false,
                        }
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            FsRequest::Layout { ino } => FsResponse::Layout(store.file_layout(ino)?),
            FsRequest::Open {
                ino,
                session,
                handle,
                synced,
            } => {
                // A synced open still barriers when the inode is not here yet (its create
                // went through an agent that has restarted since, or the local apply was
                // slow).
                let attr = if synced {
                    self.getattr_fresh(ino).await?
                } else {
                    self.group.barrier().await?;
                    self.recall_all().await?;
                    store.getattr(ino)?
                };
                self.opened(attr, session, handle, pid, version).await?
            }
            FsRequest::Reopen {
                ino,
                session,
                handle,
            } => {
                // The claim first: it keeps the inode from a purge even when the barrier
                // fails (a group still electing after every node lost power), and the
                // mount announces each handle only once after it reconnects.
                self.handles.hold(session, handle, ino, pid);
                self.group.barrier().await?;
                match store.getattr(ino) {
                    Ok(attr) => FsResponse::Attr(attr),
                    Err(e) => {
                        if matches!(e, NamespaceError::Fs(FsError::NotFound)) {
                            self.handles.release(session, handle);
                        }
                        return Err(e.into());
                    }
                }
            }
            FsRequest::Release { session, handle } => {
                self.handles.release(session, handle);
                FsResponse::Done
            }
            // The local socket serves reads through `read` itself and writes the parts out
            // without joining them (admin.rs); this joined answer is for other callers.
            FsRequest::Read { ino, offset, len } => {
                FsResponse::Data(self.read(ino, offset, len).await?.concat())
            }
            FsRequest::StatFs => FsResponse::StatFs(self.statfs().await?),
            FsRequest::Watch {
                epoch,
                after,
                session,
                wait_ms,
            } => {
                let wait = Duration::from_millis(wait_ms.min(MAX_WATCH_MS) as u64);
                let changes = &self.group.changes;
                FsResponse::Changes(changes.wait(epoch, after, session, wait).await)
            }
            // `handle` sends changes to `serve_change`.
            _ => return Err(FsError::Invalid),
        })
    }

    /// A change from the mount answered from the leases: from a lease when one answers
    /// it (`FsResponse::Unsynced`), else committed. A request sent again (its connection
    /// broke) is answered as the first time, or goes the committed way again (whose
    /// request-id table answers it).
    async fn serve_change_leased(&self, req: FsRequest) -> Result<FsResponse, FsError> {
        let id = request_id(&req);
        let _turn = match id {
            Some(id) => Some(self.turns.take(id).await),
            None => None,
        };
        let prior = id.and_then(|id| self.leases.prior(id));
        let answer = match prior {
            Some(Prior::Answered(answer)) => Some(answer),
            Some(Prior::Committed) => None,
            None => self.leased_change(&req).await,
        };
        let prior = match answer {
            Some(answer) => Prior::Answered(answer),
            None => Prior::Committed,
        };
        // A failure the mount retries (`Unavailable`: a flush that found no leader) is
        // not an answer to give again: the copy sent again is served afresh.
        let retried = matches!(&prior, Prior::Answered(Err(FsError::Unavailable(_))));
        if let Some(id) = id
            && !retried
        {
            self.leases.remember(id, prior.clone());
        }
        match prior {
            Prior::Answered(answer) => answer.map(FsResponse::unsynced),
            Prior::Committed => self.serve_change(req).await,
        }
    }

    /// Requests that change the namespace or file data, committed through the group
    /// (after what the leases answered: this node's changes apply in order).
    async fn serve_change(&self, req: FsRequest) -> Result<FsResponse, FsError> {
        if self.leases.pending() {
            self.leases.flush().await?;
        }
        let (id, command) = match req {
            FsRequest::Write {
                id,
                ino,
                offset,
                data,
            } => {
                return Ok(FsResponse::Attr(
                    self.write(id, ino, offset, data, None).await?,
                ));
            }
            FsRequest::WriteThenSet {
                id,
                ino,
                set,
                offset,
                data,
            } => {
                if set.size.is_some() {
                    return Err(FsError::Invalid);
                }
                let attr = self.write(id, ino, offset, data, Some(set)).await?;
                return Ok(FsResponse::Attr(attr));
            }
            FsRequest::SetAttr { id, ino, set } => (
                id,
                Command::SetAttr {
                    ino,
                    set: set.into(),
                },
            ),
            FsRequest::MkNode {
                id,
                parent,
                name,
                kind,
                perm,
                owner,
                rdev,
                target,
            } => {
                let cmd = Command::MkNode {
                    parent,
                    name,
                    kind: kind.into(),
                    perm,
                    owner: owner.into(),
                    rdev,
                    target,
                };
                return Ok(entry(self.apply(id, cmd).await?));
            }
            FsRequest::Link {
                id,
                ino,
                new_parent,
                new_name,
            } => {
                let cmd = Command::Link {
                    ino,
                    new_parent,
                    new_name,
                };
                return Ok(entry(self.apply(id, cmd).await?));
            }
            FsRequest::Unlink { id, parent, name } => (id, Command::Unlink { parent, name }),
            FsRequest::Rmdir { id, parent, name } => (id, Command::Rmdir { parent, name }),
            FsRequest::Rename {
                id,
                parent,
                name,
                new_parent,
                new_name,
                flags,
            } => (
                id,
                Command::Rename {
                    parent,
                    name,
                    new_parent,
                    new_name,
                    flags: flags.into(),
                },
            ),
            // `handle` sends queries to `serve_query`.
            _ => return Err(FsError::Invalid),
        };
        self.apply(id, command).await
    }

    /// The answer to an open of `ino` (attributes `attr`) by handle `handle` of mount
    /// `session`: the handle keeps the inode alive from now on.
    pub(super) async fn opened(
        &self,
        attr: FileAttr,
        session: u64,
        handle: u64,
        pid: Option<i32>,
        version: u8,
    ) -> Result<FsResponse, FsError> {
        let ino = attr.ino;
        // Close-to-open: an inode with no name left was replaced or removed since
        // the kernel resolved the name (its entry cache is trusted for a second):
        // ESTALE makes the kernel look the name up again and open that.
        if version >= 6 && attr.nlink == 0 {
            if version >= 8 {
                // The kernel looks the name up again next: its mount must have
                // dropped what changed first, or a name changed before that lookup
                // but delivered after it would look changed since (ESTALE again).
                let changes = &self.group.changes;
                let needed = changes.needed_by(session);
                let limit = Duration::from_millis(DELIVERY_WAIT_MS);
                changes.delivered(session, needed, limit).await;
            }
            return Err(FsError::Stale);
        }
        self.handles.hold(session, handle, ino, pid);
        Ok(if version >= 8 {
            // The mount checks the names the open used once its watcher has
            // delivered this far (its own changes it is never sent).
            let changes = self.group.changes.needed_by(session);
            if version >= 9 {
                let epoch = self.group.changes.epoch();
                FsResponse::OpenedIn {
                    attr,
                    epoch,
                    changes,
                }
            } else {
                FsResponse::Opened { attr, changes }
            }
        } else {
            FsResponse::Attr(attr)
        })
    }

    /// This node's directory leases.
    pub fn leases(&self) -> &Arc<Leases> {
        &self.leases
    }

    /// Commits one command and turns its outcome into an answer. A command refused by
    /// another node's directory lease is asked again, with the same request id, once
    /// the lease is recalled or broken (`recall.rs`).
    pub(super) async fn apply(
        &self,
        id: RequestId,
        command: Command,
    ) -> Result<FsResponse, FsError> {
        command.precheck()?;
        let mut recalls = 0;
        let outcome = loop {
            let outcome = self
                .group
                .propose_one(Proposal {
                    id: Some(id.into()),
                    now: Timestamp::now(),
                    command: command.clone(),
                })
                .await?;
            match outcome {
                Outcome::Leased { dir, holder } if recalls < MAX_RECALLS => {
                    recalls += 1;
                    self.clear_lease(dir, holder).await?;
                }
                outcome => break outcome,
            }
        };
        match outcome {
            Outcome::Attr(a) => Ok(FsResponse::Attr(a.into())),
            Outcome::Done => Ok(FsResponse::Done),
            Outcome::Failed(e) => Err(e.into()),
            other => Err(ConsensusError::UnexpectedOutcome(Box::new(other)).into()),
        }
    }

    /// Gets `holder`'s lease on `dir` out of the way of a change it refused (`Leased`):
    /// this node's own is committed and given back (and not taken again for a while),
    /// another node's is recalled or broken (`recall.rs`). Ask again after it.
    pub async fn clear_lease(
        &self,
        dir: Ino,
        holder: shoal_placement::NodeId,
    ) -> Result<(), FsError> {
        if holder.0 == self.group.me {
            self.leases.contended(dir);
            self.leases.give_back(dir).await
        } else {
            recall::recall(&self.group, &self.transport, dir, holder).await
        }
    }

    pub(super) async fn getattr_fresh(&self, ino: Ino) -> Result<FileAttr, FsError> {
        match self.group.store().getattr(ino) {
            Err(NamespaceError::Fs(FsError::NotFound)) => {
                self.group.barrier().await?;
                Ok(self.group.store().getattr(ino)?)
            }
            other => Ok(other?),
        }
    }

    /// `len` bytes of file `ino` from `offset` (fewer at its end), in order, in the parts
    /// they were read in: the local socket writes them out one after another, so file data
    /// is not copied into one buffer first.
    pub async fn read(&self, ino: Ino, offset: u64, len: u32) -> Result<Vec<Bytes>, FsError> {
        if len > MAX_READ {
            return Err(FsError::Invalid);
        }
        self.caught_up().await?;
        // Written (or created) under a lease and not committed yet: committed first (the
        // local socket calls this without `handle`).
        if self.leases.attr(ino).is_some() {
            self.leases.flush().await?;
        }
        let len = u64::from(len);
        let data = self.group.store().file_range(ino, offset, len)?;
        regular_file(data.attr.kind)?;
        let end = offset.saturating_add(len).min(data.attr.size);
        if offset >= end {
            return Ok(Vec::new());
        }
        // Pieces of the answer: (file offset, bytes in parts), assembled in order at the end.
        let mut pieces: Vec<(u64, Vec<Bytes>)> = Vec::new();
        let inline_end = (data.inline.len() as u64).min(end);
        if offset < inline_end {
            pieces.push((
                offset,
                vec![Bytes::copy_from_slice(
                    &data.inline[offset as usize..inline_end as usize],
                )],
            ));
        }
        if let Some(tier) = &self.tier {
            tier.note_read(ino);
        }
        let mut reads = JoinSet::new();
        for e in data.extents {
            let (s, t) = (offset.max(e.offset), end.min(e.offset + e.len));
            if s >= t {
                continue;
            }
            let at = e.stripe_offset + (s - e.offset);
            match (data.cold.get(&e.stripe.id), &self.tier) {
                (Some(&loc), Some(tier)) => {
                    let tier = tier.clone();
                    reads.spawn(async move {
                        let r = tier.read_cold(ino, e.stripe.id, loc, at, t - s).await;
                        (s, t, r.map(|d| vec![Bytes::from(d)]))
                    });
                }
                (Some(_), None) => {
                    return Err(FsError::Io(
                        "this file's data is in the cold tier and this agent has no [tiering] store"
                            .into(),
                    ));
                }
                (None, _) => {
                    let stripes = self.stripes.clone();
                    reads.spawn(async move {
                        let r = stripes.read_parts(&e.stripe, at, t - s).await;
                        (s, t, r.map(|r| r.parts).map_err(FsError::from))
                    });
                }
            }
        }
        while let Some(joined) = reads.join_next().await {
            let (s, t, r) = joined.map_err(|e| FsError::Io(e.to_string()))?;
            pieces.push((s, clip(r?, t - s)));
        }
        Ok(lay_out(offset, end, pieces))
    }

    async fn statfs(&self) -> Result<FsStats, FsError> {
        let ec = self.stripes.default_ec();
        let members = self
            .gossip
            .members()
            .await
            .map_err(|e| FsError::Io(e.to_string()))?;
        let (mut total, mut used) = (0u64, 0u64);
        for m in members.iter().filter(|m| m.state == MemberState::Alive) {
            if let Some(f) = &m.facts {
                total += f.capacity_bytes;
                used += f.used_bytes.min(f.capacity_bytes);
            }
        }
        let usable = |b: u64| (b as u128 * ec.k as u128 / ec.total() as u128) as u64;
        let stats = self.group.store().stats()?;
        Ok(FsStats {
            total_bytes: usable(total),
            free_bytes: usable(total - used),
            files: stats.inodes,
            files_free: u32::MAX as u64,
            block_size: (ec.k as u64 * DEFAULT_SHARD_SIZE) as u32,
        })
    }
}

/// The bytes of `[offset, end)`, in order, from pieces at file offsets within it (each in
/// parts): holes and short pieces read as zeros, bytes past `end` are dropped. Nothing is
/// copied but the zeros.
fn lay_out(offset: u64, end: u64, mut pieces: Vec<(u64, Vec<Bytes>)>) -> Vec<Bytes> {
    let len = (end - offset) as usize;
    pieces.sort_by_key(|(at, _)| *at);
    let mut out = Vec::new();
    let mut filled = 0;
    let zeros = |n: usize| Bytes::from(vec![0; n]);
    for (at, parts) in pieces {
        let at = ((at - offset) as usize).min(len);
        if at > filled {
            out.push(zeros(at - filled));
            filled = at;
        }
        // Extents do not overlap; should two, the earlier one's bytes stay.
        let mut skip = filled - at;
        for mut part in parts {
            if skip >= part.len() {
                skip -= part.len();
                continue;
            }
            part.advance(skip);
            skip = 0;
            part.truncate(len - filled);
            filled += part.len();
            if !part.is_empty() {
                out.push(part);
            }
        }
    }
    if filled < len {
        out.push(zeros(len - filled));
    }
    out
}

/// The first `len` bytes of `parts`.
fn clip(mut parts: Vec<Bytes>, len: u64) -> Vec<Bytes> {
    let mut left = len as usize;
    for p in parts.iter_mut() {
        p.truncate(left);
        left -= p.len();
    }
    parts.retain(|p| !p.is_empty());
    parts
}

/// The directory whose entries `req` changes, when it changes one directory's (a
/// rename's two are left out).
fn changed_dir(req: &FsRequest) -> Option<Ino> {
    match req {
        FsRequest::MkNode { parent, .. }
        | FsRequest::Unlink { parent, .. }
        | FsRequest::Rmdir { parent, .. } => Some(*parent),
        FsRequest::Link { new_parent, .. } => Some(*new_parent),
        _ => None,
    }
}

/// The mount session a request acts for: its handles' or its request id's.
fn session_of(req: &FsRequest) -> Option<u64> {
    match req {
        FsRequest::Open { session, .. }
        | FsRequest::Create { session, .. }
        | FsRequest::Reopen { session, .. }
        | FsRequest::Release { session, .. } => Some(*session),
        _ => request_id(req).map(|id| id.client),
    }
}

/// The request id of a change.
fn request_id(req: &FsRequest) -> Option<RequestId> {
    match req {
        FsRequest::SetAttr { id, .. }
        | FsRequest::MkNode { id, .. }
        | FsRequest::Link { id, .. }
        | FsRequest::Unlink { id, .. }
        | FsRequest::Rmdir { id, .. }
        | FsRequest::Rename { id, .. }
        | FsRequest::Write { id, .. }
        | FsRequest::WriteThenSet { id, .. } => Some(*id),
        _ => None,
    }
}

/// Whether `req` changes the namespace or file data.
fn is_change(req: &FsRequest) -> bool {
    matches!(
        req,
        FsRequest::Write { .. }
            | FsRequest::WriteThenSet { .. }
            | FsRequest::SetAttr { .. }
            | FsRequest::MkNode { .. }
            | FsRequest::Link { .. }
            | FsRequest::Unlink { .. }
            | FsRequest::Rmdir { .. }
            | FsRequest::Rename { .. }
    )
}

/// File data is read and written only on regular files.
pub(super) fn regular_file(kind: FileKind) -> Result<(), FsError> {
    match kind {
        FileKind::File => Ok(()),
        FileKind::Dir => Err(FsError::IsDir),
        _ => Err(FsError::Invalid),
    }
}

fn entry(r: FsResponse) -> FsResponse {
    match r {
        FsResponse::Attr(a) => FsResponse::Entry(a),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::{clip, lay_out};

    fn one(b: &[u8]) -> Vec<Bytes> {
        vec![Bytes::copy_from_slice(b)]
    }

    fn assemble(offset: u64, end: u64, pieces: Vec<(u64, Vec<Bytes>)>) -> Vec<u8> {
        let parts = lay_out(offset, end, pieces);
        assert!(parts.iter().all(|p| !p.is_empty()), "{parts:?}");
        parts.concat()
    }

    #[test]
    fn one_piece_covering_the_range_is_the_answer() {
        assert_eq!(
            assemble(10, 14, vec![(10, one(&[1, 2, 3, 4]))]),
            [1, 2, 3, 4]
        );
        // Short: the rest reads as zeros.
        assert_eq!(assemble(10, 14, vec![(10, one(&[1, 2]))]), [1, 2, 0, 0]);
        // In parts, passed on as they are.
        let parts = vec![(10, [one(&[1]), one(&[2, 3]), one(&[4])].concat())];
        assert_eq!(lay_out(10, 14, parts.clone()), parts[0].1);
        assert_eq!(assemble(10, 14, parts), [1, 2, 3, 4]);
    }

    #[test]
    fn pieces_in_any_order_with_holes_between_them() {
        let pieces = vec![(16, one(&[7, 8])), (10, one(&[1, 2])), (13, one(&[4]))];
        assert_eq!(assemble(10, 18, pieces), [1, 2, 0, 4, 0, 0, 7, 8]);
        assert_eq!(assemble(10, 13, vec![]), [0, 0, 0]);
        assert_eq!(assemble(10, 13, vec![(12, one(&[9]))]), [0, 0, 9]);
        assert!(lay_out(10, 10, vec![]).is_empty());
    }

    #[test]
    fn overlapping_and_overlong_pieces_keep_the_earlier_bytes_and_the_length() {
        let pieces = vec![
            (10, [one(&[1, 2]), one(&[3])].concat()),
            (11, one(&[8, 9, 4, 5, 6])),
        ];
        assert_eq!(assemble(10, 15, pieces), [1, 2, 3, 4, 5]);
        assert_eq!(assemble(10, 12, vec![(11, one(&[5, 6, 7]))]), [0, 5]);
    }

    #[test]
    fn clip_keeps_the_first_bytes_of_the_parts() {
        let parts = [one(&[1, 2]), one(&[3, 4]), one(&[5])].concat();
        assert_eq!(clip(parts.clone(), 3).concat(), [1, 2, 3]);
        assert_eq!(clip(parts.clone(), 2).len(), 1);
        assert_eq!(clip(parts.clone(), 9).concat(), [1, 2, 3, 4, 5]);
        assert!(clip(parts, 0).is_empty());
    }
}
