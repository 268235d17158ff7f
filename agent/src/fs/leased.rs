//! The mount's requests and this node's directory leases (`leases.rs`).
//!
//! On the holder: a change in a directory it holds (or takes, [`Leases::lease_for`]) is
//! answered at once and committed by the writeback ([`super::LeaseFlush`]): creates,
//! links, unlinks, rmdirs and renames of its entries (a rename between two directories
//! needs both leases), and setattr and inline writes of files created under a lease. Its
//! lookups are answered from the pending changes and the replica, without a read
//! barrier: under the lease no other node changes the directory's entries. A request the
//! leases do not answer commits what is pending first when it may touch it (every change
//! does; a query of an inode or directory the pending changes touched does), so this
//! node's changes apply in the order its mount saw them.
//!
//! Only a mount of protocol 12 on (which syncs on `fsync`, `FsRequest::Sync`), and one
//! mount session at a time ([`Leases::claim`]), is answered from the leases; with
//! `[meta] metadata_writeback_ms = 0` none is.
//!
//! On every other node, close-to-open: a lookup in a directory another node leases, and
//! a listing of one from its start, recall the lease first (the holder commits, then
//! gives it back) and read after that; an open of a file and a stat by path recall every
//! lease another node holds (the agent does not know which directories the mount walked
//! to the file; leases are few, and given back when unused).

use shoal_agent_api::{FsError, FsRequest, FsResponse, Ino, SYNC_SINCE};
use shoal_namespace::{LeasedChange, Outcome};

use super::recall;
use super::service::FsService;

impl FsService {
    /// Whether mount `session` speaking `version` is answered from directory leases.
    pub(super) fn answers_from_leases(&self, session: Option<u64>, version: u8) -> bool {
        version >= SYNC_SINCE
            && self.group.config.metadata_writeback_ms > 0
            && session.is_some_and(|s| self.leases.claim(s))
    }

    /// A change answered from a lease; `None` when it takes the committed path.
    pub(super) async fn leased_change(
        &self,
        req: &FsRequest,
    ) -> Option<Result<FsResponse, FsError>> {
        let leases = &self.leases;
        let (dir, change) = match req {
            FsRequest::MkNode {
                parent,
                name,
                kind,
                perm,
                owner,
                rdev,
                target,
                ..
            } => (
                *parent,
                LeasedChange::MkNode {
                    ino: 0,
                    name: name.clone(),
                    kind: (*kind).into(),
                    perm: *perm,
                    owner: (*owner).into(),
                    rdev: *rdev,
                    target: target.clone(),
                },
            ),
            FsRequest::Link {
                ino,
                new_parent,
                new_name,
                ..
            } => (
                *new_parent,
                LeasedChange::Link {
                    ino: *ino,
                    name: new_name.clone(),
                },
            ),
            FsRequest::Unlink { parent, name, .. } => {
                (*parent, LeasedChange::Unlink { name: name.clone() })
            }
            FsRequest::Rmdir { parent, name, .. } => {
                (*parent, LeasedChange::Rmdir { name: name.clone() })
            }
            FsRequest::Rename {
                parent,
                name,
                new_parent,
                new_name,
                flags,
                ..
            } => {
                if *new_parent != *parent && !leases.lease_for(*new_parent).await {
                    return None;
                }
                (
                    *parent,
                    LeasedChange::Rename {
                        name: name.clone(),
                        new_dir: *new_parent,
                        new_epoch: 0,
                        new_name: new_name.clone(),
                        flags: (*flags).into(),
                    },
                )
            }
            FsRequest::SetAttr { ino, set, .. } => {
                let dir = self.lease_of_inode(*ino)?;
                let change = LeasedChange::SetAttr {
                    ino: *ino,
                    set: set.clone().into(),
                };
                return self.answered(dir, change);
            }
            FsRequest::Write {
                ino, offset, data, ..
            } => {
                let dir = self.lease_of_inode(*ino)?;
                return self.leased_write(dir, *ino, *offset, data).await;
            }
            FsRequest::WriteThenSet {
                ino,
                set,
                offset,
                data,
                ..
            } => {
                let dir = self.lease_of_inode(*ino)?;
                if set.size.is_some() {
                    return Some(Err(FsError::Invalid));
                }
                match self.leased_write(dir, *ino, *offset, data).await? {
                    Ok(_) => {}
                    Err(e) => return Some(Err(e)),
                }
                let change = LeasedChange::SetAttr {
                    ino: *ino,
                    set: set.clone().into(),
                };
                // The write is answered: a setattr the lease cannot answer now is
                // committed after it, through the group.
                return match self.answered(dir, change) {
                    Some(answer) => Some(answer),
                    None => Some(self.commit_set_after(req).await),
                };
            }
            _ => return None,
        };
        if !leases.lease_for(dir).await {
            return None;
        }
        let answer = self.answered(dir, change)?;
        Some(answer.map(|a| match (req, a) {
            (FsRequest::MkNode { .. } | FsRequest::Link { .. }, FsResponse::Attr(a)) => {
                FsResponse::Entry(a)
            }
            (_, a) => a,
        }))
    }

    /// The leased directory a setattr or write of `ino` is answered under: the one it was
    /// created in, or `ino` itself when it is a leased directory.
    fn lease_of_inode(&self, ino: Ino) -> Option<Ino> {
        let dir = match self.leases.epoch(ino) {
            Some(_) => ino,
            None => self.leases.created_in(ino)?,
        };
        self.leases.serves(dir).then_some(dir)
    }

    /// A write of `data` at `offset` into `ino`, answered under the lease on `dir`:
    /// inline when it fits, else to stripes ([`FsService::leased_extents`]).
    async fn leased_write(
        &self,
        dir: Ino,
        ino: Ino,
        offset: u64,
        data: &[u8],
    ) -> Option<Result<FsResponse, FsError>> {
        if let Some(answer) = self
            .inline(ino, offset, data)
            .and_then(|write| self.answered(dir, write))
        {
            return Some(answer);
        }
        self.leased_extents(dir, ino, offset, data).await
    }

    /// An inline write of `data` at `offset`, when it fits inline.
    fn inline(&self, ino: Ino, offset: u64, data: &[u8]) -> Option<LeasedChange> {
        let max_inline = self.group.config.inline_max;
        let end = offset.checked_add(data.len() as u64)?;
        (end <= max_inline && !data.is_empty()).then(|| LeasedChange::WriteInline {
            ino,
            offset,
            data: data.to_vec(),
            max_inline,
        })
    }

    /// `change` answered under the lease on `dir`; `None` when the lease cannot answer it
    /// (the committed path does, after what is pending).
    pub(super) fn answered(
        &self,
        dir: Ino,
        change: LeasedChange,
    ) -> Option<Result<FsResponse, FsError>> {
        match self.leases.answer(dir, change) {
            Ok(Outcome::Attr(a)) => Some(Ok(FsResponse::Attr(a.into()))),
            Ok(Outcome::Done) => Some(Ok(FsResponse::Done)),
            Ok(Outcome::Failed(e)) => Some(Err(e.into())),
            // Not for the lease to answer (inline data that must go to stripes, another
            // node's leased subdirectory, a lease that ended): the committed path does.
            Ok(_) | Err(FsError::Unavailable(_)) => None,
            Err(e) => Some(Err(e)),
        }
    }

    /// The setattr of a `WriteThenSet` whose write the lease answered, committed after
    /// what is pending.
    async fn commit_set_after(&self, req: &FsRequest) -> Result<FsResponse, FsError> {
        let FsRequest::WriteThenSet { id, ino, set, .. } = req else {
            return Err(FsError::Invalid);
        };
        self.leases.flush().await?;
        let command = shoal_namespace::Command::SetAttr {
            ino: *ino,
            set: set.clone().into(),
        };
        self.apply(*id, command).await
    }

    /// A query the holder answers from its pending changes; `None` when the replica
    /// answers it (after those changes are committed, when they touch it).
    pub(super) async fn leased_query(
        &self,
        req: &FsRequest,
        pid: Option<i32>,
        version: u8,
    ) -> Option<Result<FsResponse, FsError>> {
        let leases = &self.leases;
        match req {
            // The open inside a create of a file not committed yet (or one the pending
            // changes touched): from what they left.
            FsRequest::Open {
                ino,
                session,
                handle,
                ..
            } if self.pending_is_whole(*ino) => {
                let attr = leases.attr(*ino).flatten()?;
                Some(self.opened(attr, *session, *handle, pid, version).await)
            }
            FsRequest::Lookup { parent, name } if leases.serves(*parent) => {
                Some(self.leased_lookup(*parent, name, version))
            }
            FsRequest::GetAttr { ino } | FsRequest::GetAttrFresh { ino }
                if self.pending_is_whole(*ino) =>
            {
                match leases.attr(*ino)? {
                    Some(attr) => Some(Ok(FsResponse::Attr(attr))),
                    None => Some(Err(FsError::NotFound)),
                }
            }
            _ => {
                let touched = match req {
                    // Not answered from a lease: the inode found may be one the
                    // pending changes touched.
                    FsRequest::Lookup { .. } => leases.pending(),
                    FsRequest::ReadDir { ino, .. } => leases.pending_in(*ino),
                    FsRequest::Reopen { ino, .. }
                    | FsRequest::Open { ino, .. }
                    | FsRequest::GetAttr { ino }
                    | FsRequest::GetAttrFresh { ino }
                    | FsRequest::ReadLink { ino }
                    | FsRequest::Read { ino, .. }
                    | FsRequest::Layout { ino } => leases.attr(*ino).is_some(),
                    _ => false,
                };
                if touched && let Err(e) = leases.flush().await {
                    return Some(Err(e));
                }
                None
            }
        }
    }

    /// Whether the pending changes' attributes of `ino` are all there is to know of it:
    /// it was created under a lease held here (no other node knows it before its create
    /// commits), or is a directory leased here (no other node changes it). Another inode
    /// they touched (renamed, linked) may have been written by another node meanwhile.
    fn pending_is_whole(&self, ino: Ino) -> bool {
        self.leases.attr(ino).is_some_and(|a| a.is_some())
            && (self.leases.epoch(ino).is_some() || self.leases.created_in(ino).is_some())
    }

    /// `name` in `dir`, leased here: from the pending changes, else the replica (no
    /// other node changes the directory's entries under the lease).
    fn leased_lookup(&self, dir: Ino, name: &str, version: u8) -> Result<FsResponse, FsError> {
        let store = self.group.store();
        let feed = &self.group.changes;
        let position = feed.position();
        let attr = match self.leases.entry(dir, name) {
            Some(None) => return Err(FsError::NotFound),
            Some(Some(ino)) => match self.leases.attr(ino) {
                Some(Some(attr)) => attr,
                Some(None) => return Err(FsError::NotFound),
                None => store.getattr(ino)?,
            },
            // The entry as committed; the inode's attributes as the pending changes left
            // them, if they touched it (a chmod of a subdirectory answered under its own
            // lease).
            None => {
                let attr = store.lookup(dir, name)?;
                match self.leases.attr(attr.ino) {
                    Some(Some(pending)) => pending,
                    Some(None) => return Err(FsError::NotFound),
                    None => attr,
                }
            }
        };
        Ok(if version >= 9 {
            FsResponse::EntryAt {
                attr,
                epoch: feed.epoch(),
                position,
            }
        } else {
            FsResponse::Entry(attr)
        })
    }

    /// Recalls another node's lease on `dir`, if it has one, and reads at the commit
    /// point after. Call it after a read barrier (a replica that has not applied the
    /// grant yet does not know of the lease): what the holder answered in `dir` is seen here. This node's own is
    /// answered from (or committed first) by [`FsService::leased_query`].
    pub(super) async fn recall_in(&self, dir: Ino) -> Result<(), FsError> {
        let Some(lease) = self.group.store().dir_lease(dir)? else {
            return Ok(());
        };
        if lease.holder.0 == self.group.me {
            return Ok(());
        }
        recall::recall(&self.group, &self.transport, dir, lease.holder).await?;
        self.group.barrier().await?;
        Ok(())
    }

    /// Recalls every lease another node holds, and reads at the commit point after (call
    /// it after a read barrier, as [`FsService::recall_in`]).
    pub(super) async fn recall_all(&self) -> Result<(), FsError> {
        let others: Vec<_> = self
            .group
            .store()
            .dir_leases()?
            .into_iter()
            .filter(|(_, lease)| lease.holder.0 != self.group.me)
            .collect();
        if others.is_empty() {
            return Ok(());
        }
        for (dir, lease) in others {
            recall::recall(&self.group, &self.transport, dir, lease.holder).await?;
        }
        self.group.barrier().await?;
        Ok(())
    }
}
