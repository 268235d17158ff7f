//! Serves `shoal mount`'s filesystem requests: namespace changes go through the metadata
//! group, reads come from the local replica (after a read barrier where close-to-open
//! needs one), file data goes to and from erasure-coded stripes (or inline, for small
//! files).

use std::sync::Arc;
use std::time::Duration;

use shoal_agent_api::{
    FileAttr, FileKind, FsError, FsRequest, FsResponse, FsStats, Ino, MAX_DIR_PAGE, MAX_READ,
    RequestId, Timestamp,
};
use shoal_mesh::{GossipHandle, MemberState};
use shoal_meta::{Command, MetaError, NewExtent, Outcome, Proposal};
use shoal_placement::DEFAULT_SHARD_SIZE;
use tokio::task::JoinSet;
use tracing::warn;

use super::service::MetaService;
use crate::AgentError;
use crate::stripes::Stripes;

/// How often a write retries when the inline data it carried over changed under it.
const CONFLICT_RETRIES: u64 = 8;
/// How long a write keeps retrying stripes that could not be written (longer than
/// membership takes to declare a dead node down), at most.
const STRIPE_RETRY_FOR: Duration = Duration::from_secs(30);
/// How long a write's commit waits for a leader, at most.
const COMMIT_WAIT: Duration = Duration::from_secs(60);

pub struct FsService {
    pub meta: Arc<MetaService>,
    stripes: Arc<Stripes>,
    gossip: GossipHandle,
}

fn from_meta(e: MetaError) -> FsError {
    match e {
        MetaError::Fs(e) => e,
        other => FsError::Io(other.to_string()),
    }
}

fn from_agent(e: AgentError) -> FsError {
    match e {
        AgentError::NoSpace(_) => FsError::NoSpace,
        other => FsError::Io(other.to_string()),
    }
}

/// The request id of attempt `n` of a write's extent commit: distinct from the id of its
/// inline attempt, and per retry, so a "conflict" answer is never replayed from the
/// deduplication table.
fn commit_id(id: RequestId, attempt: u64) -> RequestId {
    RequestId {
        client: id.client ^ 0x9e37_79b9_7f4a_7c15_u64.rotate_left(attempt as u32 + 1),
        seq: id.seq,
    }
}

impl FsService {
    pub fn new(meta: Arc<MetaService>, stripes: Arc<Stripes>, gossip: GossipHandle) -> Self {
        FsService {
            meta,
            stripes,
            gossip,
        }
    }

    /// How long a write may retry its stripes, and how long its commit may wait for a
    /// leader: each a quarter of `orphan_shard_grace_s` at most, so a write is always done
    /// (committed, or given up and written again) well before its shards could be taken
    /// for orphans. The abandon fence keeps a later commit safe anyway; this keeps it rare.
    fn write_patience(&self) -> (Duration, Duration) {
        let quarter = Duration::from_secs(self.meta.config.orphan_shard_grace_s) / 4;
        (STRIPE_RETRY_FOR.min(quarter), COMMIT_WAIT.min(quarter))
    }

    /// Serves one request from the local client with process id `pid` (from the socket's
    /// peer credentials).
    pub async fn handle(self: &Arc<Self>, req: FsRequest, pid: Option<i32>) -> FsResponse {
        match self.serve(req, pid).await {
            Ok(r) => r,
            Err(e) => FsResponse::Error(e),
        }
    }

    async fn serve(
        self: &Arc<Self>,
        req: FsRequest,
        pid: Option<i32>,
    ) -> Result<FsResponse, FsError> {
        let store = self.meta.store();
        Ok(match req {
            FsRequest::Lookup { parent, name } => {
                // At the leader's commit point: a name another node just created, removed
                // or renamed over must resolve as it does there now (the kernel then caches
                // the answer for the entry TTL). Concurrent lookups share one round.
                self.meta.barrier().await?;
                FsResponse::Entry(store.lookup(parent, &name).map_err(from_meta)?)
            }
            FsRequest::GetAttr { ino } => FsResponse::Attr(self.getattr_fresh(ino).await?),
            FsRequest::ReadLink { ino } => {
                FsResponse::ReadLink(store.readlink(ino).map_err(from_meta)?)
            }
            FsRequest::ReadDir { ino, after, limit } => {
                // A listing from the start is an open of the directory (close-to-open);
                // the pages after it come from a replica at least that fresh.
                if after.is_none() {
                    self.meta.barrier().await?;
                }
                let limit = limit.clamp(1, MAX_DIR_PAGE) as usize;
                match store.readdir_page(ino, after.as_deref(), limit) {
                    Ok((entries, more)) => FsResponse::Entries { entries, more },
                    // Removed while being listed: it was empty (rmdir), so the listing
                    // ends, as on a local filesystem.
                    Err(MetaError::Fs(FsError::NotFound)) if after.is_some() => {
                        FsResponse::Entries {
                            entries: Vec::new(),
                            more: false,
                        }
                    }
                    Err(e) => return Err(from_meta(e)),
                }
            }
            FsRequest::Layout { ino } => {
                FsResponse::Layout(store.file_layout(ino).map_err(from_meta)?)
            }
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
                    self.meta.barrier().await?;
                    store.getattr(ino).map_err(from_meta)?
                };
                self.meta.hold(session, handle, ino, pid);
                FsResponse::Attr(attr)
            }
            FsRequest::Release { session, handle } => {
                self.meta.release(session, handle);
                FsResponse::Done
            }
            FsRequest::Read { ino, offset, len } => {
                if len > MAX_READ {
                    return Err(FsError::Invalid);
                }
                FsResponse::Data(self.read(ino, offset, len as u64).await?)
            }
            FsRequest::Write {
                id,
                ino,
                offset,
                data,
            } => FsResponse::Attr(self.write(id, ino, offset, data).await?),
            FsRequest::StatFs => FsResponse::StatFs(self.statfs().await?),
            FsRequest::SetAttr { id, ino, set } => {
                self.apply(Some(id), Command::SetAttr { ino, set }).await?
            }
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
                    kind,
                    perm,
                    owner,
                    rdev,
                    target,
                };
                entry(self.apply(Some(id), cmd).await?)
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
                entry(self.apply(Some(id), cmd).await?)
            }
            FsRequest::Unlink { id, parent, name } => {
                self.apply(Some(id), Command::Unlink { parent, name })
                    .await?
            }
            FsRequest::Rmdir { id, parent, name } => {
                self.apply(Some(id), Command::Rmdir { parent, name })
                    .await?
            }
            FsRequest::Rename {
                id,
                parent,
                name,
                new_parent,
                new_name,
                flags,
            } => {
                let cmd = Command::Rename {
                    parent,
                    name,
                    new_parent,
                    new_name,
                    flags,
                };
                self.apply(Some(id), cmd).await?
            }
        })
    }

    /// Commits one command and turns its outcome into an answer.
    async fn apply(&self, id: Option<RequestId>, command: Command) -> Result<FsResponse, FsError> {
        command.precheck()?;
        let outcome = self
            .meta
            .propose_one(Proposal {
                id,
                now: Timestamp::now(),
                command,
            })
            .await?;
        match outcome {
            Outcome::Attr(a) => Ok(FsResponse::Attr(a)),
            Outcome::Done => Ok(FsResponse::Done),
            Outcome::Failed(e) => Err(e),
            other => Err(FsError::Io(format!("unexpected outcome {other:?}"))),
        }
    }

    async fn getattr_fresh(&self, ino: Ino) -> Result<FileAttr, FsError> {
        match self.meta.store().getattr(ino) {
            Err(MetaError::Fs(FsError::NotFound)) => {
                self.meta.barrier().await?;
                self.meta.store().getattr(ino).map_err(from_meta)
            }
            other => other.map_err(from_meta),
        }
    }

    async fn read(&self, ino: Ino, offset: u64, len: u64) -> Result<Vec<u8>, FsError> {
        let data = self
            .meta
            .store()
            .file_range(ino, offset, len)
            .map_err(from_meta)?;
        regular_file(data.attr.kind)?;
        let end = offset.saturating_add(len).min(data.attr.size);
        if offset >= end {
            return Ok(Vec::new());
        }
        let mut out = vec![0u8; (end - offset) as usize];
        let inline_end = (data.inline.len() as u64).min(end);
        if offset < inline_end {
            out[..(inline_end - offset) as usize]
                .copy_from_slice(&data.inline[offset as usize..inline_end as usize]);
        }
        let mut reads = JoinSet::new();
        for e in data.extents {
            let (s, t) = (offset.max(e.offset), end.min(e.offset + e.len));
            if s >= t {
                continue;
            }
            let stripes = self.stripes.clone();
            reads.spawn(async move {
                let r = stripes
                    .read(&e.stripe, e.stripe_offset + (s - e.offset), t - s)
                    .await;
                (s, r)
            });
        }
        while let Some(joined) = reads.join_next().await {
            let (s, r) = joined.map_err(|e| FsError::Io(e.to_string()))?;
            let r = r.map_err(from_agent)?;
            let at = (s - offset) as usize;
            let n = r.data.len().min(out.len() - at);
            out[at..at + n].copy_from_slice(&r.data[..n]);
        }
        Ok(out)
    }

    /// Writes and commits `data` at `offset`: inline when the file is small enough, else
    /// as new stripes (copy-on-write) committed once every shard is durable.
    async fn write(
        &self,
        id: RequestId,
        ino: Ino,
        offset: u64,
        data: Vec<u8>,
    ) -> Result<FileAttr, FsError> {
        let store = self.meta.store();
        let current = store.file_data(ino).map_err(from_meta)?;
        regular_file(current.attr.kind)?;
        if data.is_empty() {
            return Ok(current.attr);
        }
        let end = offset
            .checked_add(data.len() as u64)
            .ok_or(FsError::TooBig)?;
        let max_inline = self.meta.config.inline_max;
        let mut carried = (current.inline, current.inline_version);
        if current.extents.is_empty() && end <= max_inline {
            let outcome = self
                .meta
                .propose_one(Proposal {
                    id: Some(id),
                    now: Timestamp::now(),
                    command: Command::WriteInline {
                        ino,
                        offset,
                        data: data.clone(),
                        max_inline,
                    },
                })
                .await?;
            match outcome {
                Outcome::Attr(a) => return Ok(a),
                Outcome::NotInline { inline, version } => carried = (inline, version),
                Outcome::Failed(e) => return Err(e),
                other => return Err(FsError::Io(format!("unexpected outcome {other:?}"))),
            }
        }
        let data = Arc::new(data);
        for attempt in 0..CONFLICT_RETRIES {
            let (inline, version) = &carried;
            let (retry_for, commit_wait) = self.write_patience();
            let extents = self
                .write_stripes_patiently(inline, offset, &data, retry_for)
                .await?;
            let records: Vec<_> = extents.iter().map(|e| e.stripe.clone()).collect();
            let proposal = Proposal {
                id: Some(commit_id(id, attempt)),
                now: Timestamp::now(),
                command: Command::WriteExtents {
                    ino,
                    inline_version: (!inline.is_empty()).then_some(*version),
                    extents,
                },
            };
            let outcome = self
                .meta
                .propose_within(vec![proposal], commit_wait)
                .await
                .and_then(|mut o| o.pop().ok_or_else(|| FsError::Io("no outcome".into())));
            match outcome {
                Ok(Outcome::Attr(a)) => return Ok(a),
                Ok(Outcome::Conflict) => {
                    self.discard(&records).await;
                    self.meta.barrier().await?;
                    let now = store.file_data(ino).map_err(from_meta)?;
                    carried = (now.inline, now.inline_version);
                }
                // This write took so long that a node gave its shards up for orphans (the
                // fence refused the commit): write the data again, to new stripes.
                Ok(Outcome::StripeAbandoned(stripe)) => {
                    warn!(%stripe, ino, "a stripe of this write was abandoned before its commit; writing again");
                    self.discard(&records).await;
                }
                Ok(Outcome::Failed(e)) => {
                    self.discard(&records).await;
                    return Err(e);
                }
                Ok(other) => {
                    self.discard(&records).await;
                    return Err(FsError::Io(format!("unexpected outcome {other:?}")));
                }
                // Not known whether it committed: leave the shards to the orphan GC.
                Err(e) => return Err(e),
            }
        }
        Err(FsError::Unavailable(
            "the file's inline data kept changing under this write".into(),
        ))
    }

    /// Like [`Self::write_stripes`], retrying for a while when a shard cannot be written:
    /// a node that just died is still in the layout until gossip declares it down (a few
    /// seconds), after which new stripes skip it. The caller sees a stall, not an error.
    async fn write_stripes_patiently(
        &self,
        inline: &[u8],
        offset: u64,
        data: &Arc<Vec<u8>>,
        retry_for: Duration,
    ) -> Result<Vec<NewExtent>, FsError> {
        let deadline = std::time::Instant::now() + retry_for;
        let mut pause = std::time::Duration::from_millis(250);
        loop {
            match self.write_stripes(inline, offset, data).await {
                Err(FsError::Io(e)) if std::time::Instant::now() < deadline => {
                    warn!(error = %e, "stripe write failed; retrying");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(std::time::Duration::from_secs(2));
                }
                other => return other,
            }
        }
    }

    /// Writes the carried-over inline bytes (if any) and `data` as stripes, in parallel;
    /// returns the extents in commit order.
    async fn write_stripes(
        &self,
        inline: &[u8],
        offset: u64,
        data: &Arc<Vec<u8>>,
    ) -> Result<Vec<NewExtent>, FsError> {
        let ec = self.stripes.default_ec();
        let stripe_bytes = ec.k as usize * DEFAULT_SHARD_SIZE as usize;
        let mut pieces: Vec<(u64, Vec<u8>)> = Vec::new();
        if !inline.is_empty() {
            pieces.push((0, inline.to_vec()));
        }
        for (i, chunk) in data.chunks(stripe_bytes).enumerate() {
            pieces.push((offset + (i * stripe_bytes) as u64, chunk.to_vec()));
        }
        let mut set = JoinSet::new();
        for (n, (at, bytes)) in pieces.into_iter().enumerate() {
            let stripes = self.stripes.clone();
            set.spawn(async move {
                let len = bytes.len() as u64;
                (n, at, len, stripes.write(bytes, None).await)
            });
        }
        let mut done: Vec<(usize, NewExtent)> = Vec::new();
        let mut failure = None;
        while let Some(joined) = set.join_next().await {
            match joined {
                Ok((n, offset, len, Ok(stripe))) => done.push((
                    n,
                    NewExtent {
                        offset,
                        len,
                        stripe,
                    },
                )),
                Ok((_, _, _, Err(e))) => failure = Some(from_agent(e)),
                Err(e) => failure = Some(FsError::Io(e.to_string())),
            }
        }
        done.sort_by_key(|(n, _)| *n);
        let extents: Vec<NewExtent> = done.into_iter().map(|(_, e)| e).collect();
        if let Some(e) = failure {
            let records: Vec<_> = extents.into_iter().map(|e| e.stripe).collect();
            self.discard(&records).await;
            return Err(e);
        }
        Ok(extents)
    }

    /// Deletes stripes that were written but will never be committed.
    async fn discard(&self, records: &[shoal_agent_api::StripeRecord]) {
        for r in records {
            if let Err(e) = self.stripes.delete(r).await {
                warn!(stripe = %r.id, error = %e, "could not delete an uncommitted stripe; the orphan collector will");
            }
        }
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
        let stats = self.meta.store().stats().map_err(from_meta)?;
        Ok(FsStats {
            total_bytes: usable(total),
            free_bytes: usable(total - used),
            files: stats.inodes,
            files_free: u32::MAX as u64,
            block_size: (ec.k as u64 * DEFAULT_SHARD_SIZE) as u32,
        })
    }
}

/// File data is read and written only on regular files.
fn regular_file(kind: FileKind) -> Result<(), FsError> {
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
