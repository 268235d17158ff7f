//! Model test: seeded random command sequences applied to a `NamespaceStore` and to a plain
//! in-memory model (BTreeMaps), with restarts and snapshot installs along the way; after
//! every apply everything a client can observe must match.
//!
//! A failure names its seed; replay one with `SHOAL_META_MODEL_SEED=<seed>`. More seeds:
//! `SHOAL_META_MODEL_SEEDS=<count>`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use shoal_agent_api::{Ino, NAME_MAX, ROOT_INO};
use shoal_namespace::format::{
    FileAttr, FileKind, FsError, Owner, RenameFlags, RequestId, SetAttr, SetTime, ShardLocation,
    StripeRecord, Timestamp,
};
use shoal_namespace::{
    Batch, Command, DirLease, LeasedChange, LeasedOp, NamespaceError, NamespaceStore, NewExtent,
    Outcome, Proposal,
};
use shoal_placement::{EcProfile, NodeId, StripeId};

// ---------------------------------------------------------------------------------------
// Randomness

/// splitmix64: small, seedable, good enough to pick operations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    fn pick<T: Clone>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize].clone()
    }
}

// ---------------------------------------------------------------------------------------
// The model

#[derive(Clone, Debug)]
struct Node {
    /// nlink of directories is derived (2 + subdirectories), not kept here.
    attr: FileAttr,
    target: String,
    inline: Vec<u8>,
    version: u64,
    /// File byte → (stripe, byte within the stripe).
    bytes: BTreeMap<u64, (u128, u64)>,
}

#[derive(Clone, Debug)]
struct Model {
    root_made: bool,
    nodes: BTreeMap<Ino, Node>,
    dirents: BTreeMap<(Ino, String), Ino>,
    orphans: BTreeMap<Ino, Timestamp>,
    /// Stripes some successful WriteExtents referenced.
    issued: BTreeMap<u128, StripeRecord>,
    /// Garbage stripes the store was told are freed.
    freed: BTreeSet<u128>,
    /// Stripes abandoned while unknown: a commit naming one is refused.
    abandoned: BTreeSet<u128>,
    next_ino: Ino,
    dedup: BTreeMap<RequestId, Outcome>,
    /// Directory → (holder, epoch) of its lease.
    leases: BTreeMap<Ino, (NodeId, u64)>,
    lease_epoch: u64,
    /// Holder → (its ranges of inode numbers, the lowest it may still create with).
    ranges: BTreeMap<NodeId, (Vec<(Ino, Ino)>, Ino)>,
}

fn check_name(name: &str) -> Result<(), FsError> {
    if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\0']) {
        return Err(FsError::Invalid);
    }
    if name.len() > NAME_MAX {
        return Err(FsError::NameTooLong);
    }
    Ok(())
}

fn root_node(now: Timestamp) -> Node {
    Node {
        attr: FileAttr {
            ino: ROOT_INO,
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
        },
        target: String::new(),
        inline: Vec::new(),
        version: 0,
        bytes: BTreeMap::new(),
    }
}

impl Model {
    fn new() -> Model {
        Model {
            root_made: false,
            nodes: BTreeMap::from([(ROOT_INO, root_node(Timestamp::default()))]),
            dirents: BTreeMap::new(),
            orphans: BTreeMap::new(),
            issued: BTreeMap::new(),
            freed: BTreeSet::new(),
            abandoned: BTreeSet::new(),
            next_ino: 2,
            dedup: BTreeMap::new(),
            leases: BTreeMap::new(),
            lease_epoch: 0,
            ranges: BTreeMap::new(),
        }
    }

    fn kind(&self, ino: Ino) -> Option<FileKind> {
        self.nodes.get(&ino).map(|n| n.attr.kind)
    }

    fn entries(&self, dir: Ino) -> Vec<(String, Ino)> {
        self.dirents
            .range((dir, String::new())..)
            .take_while(|((d, _), _)| *d == dir)
            .map(|((_, name), ino)| (name.clone(), *ino))
            .collect()
    }

    fn attr(&self, ino: Ino) -> FileAttr {
        let node = &self.nodes[&ino];
        let mut attr = node.attr.clone();
        if attr.kind == FileKind::Dir {
            let subdirs = self
                .entries(ino)
                .iter()
                .filter(|(_, child)| self.kind(*child) == Some(FileKind::Dir))
                .count();
            attr.nlink = 2 + subdirs as u32;
        }
        attr
    }

    /// The directory holding `dir`'s one name (the root's parent is the root).
    fn parent_of(&self, dir: Ino) -> Ino {
        if dir == ROOT_INO {
            return ROOT_INO;
        }
        self.dirents
            .iter()
            .find(|(_, ino)| **ino == dir)
            .map(|((parent, _), _)| *parent)
            .expect("a directory has a name")
    }

    fn is_within(&self, dir: Ino, ancestor: Ino) -> bool {
        let mut cur = dir;
        loop {
            if cur == ancestor {
                return true;
            }
            if cur == ROOT_INO {
                return false;
            }
            cur = self.parent_of(cur);
        }
    }

    fn directory(&self, ino: Ino) -> Result<(), FsError> {
        match self.kind(ino) {
            Some(FileKind::Dir) => Ok(()),
            Some(_) => Err(FsError::NotDir),
            None => Err(FsError::NotFound),
        }
    }

    fn node(&mut self, ino: Ino) -> &mut Node {
        self.nodes.get_mut(&ino).expect("model inode")
    }

    fn touch_dir(&mut self, dir: Ino, now: Timestamp) {
        let node = self.node(dir);
        node.attr.mtime = now;
        node.attr.ctime = now;
    }

    fn referenced(&self) -> BTreeSet<u128> {
        let bytes = self.nodes.values().flat_map(|n| n.bytes.values());
        bytes.map(|(stripe, _)| *stripe).collect()
    }

    fn garbage(&self) -> BTreeSet<u128> {
        let live = self.referenced();
        let ids = self.issued.keys().copied();
        ids.filter(|id| !live.contains(id) && !self.freed.contains(id))
            .collect()
    }

    fn apply(&mut self, proposal: &Proposal) -> Outcome {
        if let Some(id) = proposal.id
            && let Some(first) = self.dedup.get(&id)
        {
            return first.clone();
        }
        if !self.root_made {
            self.root_made = true;
            self.nodes.insert(ROOT_INO, root_node(proposal.now));
        }
        let outcome = match self.execute(proposal.now, &proposal.command) {
            Ok(outcome) => outcome,
            Err(e) => Outcome::Failed(e),
        };
        // A lease's refusal changed nothing and is not remembered: the same request is
        // asked again once the lease is recalled.
        if let Some(id) = proposal.id
            && !matches!(outcome, Outcome::Leased { .. })
        {
            self.dedup.insert(id, outcome.clone());
        }
        outcome
    }

    fn execute(&mut self, now: Timestamp, command: &Command) -> Result<Outcome, FsError> {
        if let Some((dir, holder)) = self.fenced_by(command) {
            return Ok(Outcome::Leased { dir, holder });
        }
        match command.clone() {
            Command::MkNode {
                parent,
                name,
                kind,
                perm,
                owner,
                rdev,
                target,
            } => self.mknode(now, parent, &name, kind, perm, owner, rdev, target, None),
            Command::Link {
                ino,
                new_parent,
                new_name,
            } => self.link(now, ino, new_parent, &new_name),
            Command::Unlink { parent, name } => self.unlink(now, parent, &name),
            Command::Rmdir { parent, name } => self.rmdir(now, parent, &name),
            Command::Rename {
                parent,
                name,
                new_parent,
                new_name,
                flags,
            } => self.rename(now, parent, &name, new_parent, &new_name, flags),
            Command::SetAttr { ino, set } => self.setattr(now, ino, &set),
            Command::WriteInline {
                ino,
                offset,
                data,
                max_inline,
            } => self.write_inline(now, ino, offset, &data, max_inline),
            Command::WriteExtents {
                ino,
                inline_version,
                extents,
            } => self.write_extents(now, ino, inline_version, &extents),
            Command::Purge { ino } => {
                if !self.nodes.contains_key(&ino) {
                    return Err(FsError::NotFound);
                }
                if self.orphans.remove(&ino).is_none() {
                    return Err(FsError::Invalid);
                }
                self.nodes.remove(&ino);
                Ok(Outcome::Done)
            }
            Command::StripesFreed { ids } => {
                let garbage = self.garbage();
                for id in ids {
                    if garbage.contains(&id.0) {
                        self.freed.insert(id.0);
                    }
                }
                Ok(Outcome::Done)
            }
            Command::AbandonStripes { ids } => {
                let live = self.referenced();
                let garbage = self.garbage();
                let mut fenced = Vec::new();
                for id in ids {
                    if !live.contains(&id.0) && !garbage.contains(&id.0) {
                        self.abandoned.insert(id.0);
                        fenced.push(id);
                    }
                }
                Ok(Outcome::Abandoned(fenced))
            }
            Command::TakeDirLease { dir, holder } => {
                self.directory(dir)?;
                match self.leases.get(&dir) {
                    Some(&(other, _)) if other != holder => {
                        Ok(Outcome::Leased { dir, holder: other })
                    }
                    _ => {
                        self.lease_epoch += 1;
                        self.leases.insert(dir, (holder, self.lease_epoch));
                        Ok(Outcome::DirLease {
                            epoch: self.lease_epoch,
                        })
                    }
                }
            }
            Command::ReturnDirLease { dir, epoch } => match self.leases.get(&dir) {
                Some(&(_, e)) if e == epoch => {
                    self.leases.remove(&dir);
                    Ok(Outcome::Done)
                }
                _ => Ok(Outcome::Conflict),
            },
            Command::TakeInos { holder, count } => {
                if count == 0 || count > shoal_namespace::MAX_INO_RANGE {
                    return Err(FsError::Invalid);
                }
                let start = self.next_ino;
                self.next_ino += count;
                let ranges = self.ranges.entry(holder).or_default();
                ranges.0.push((start, self.next_ino));
                Ok(Outcome::Inos {
                    start,
                    end: self.next_ino,
                })
            }
            Command::LeasedBatch { holder, ops } => {
                let mut outcomes = Vec::new();
                for op in &ops {
                    let outcome = match self.leased(holder, op) {
                        Ok(outcome) => outcome,
                        Err(e) => Outcome::Failed(e),
                    };
                    // Not applied as answered: the holder's leases on the directories the
                    // op names end.
                    if !matches!(outcome, Outcome::Attr(_) | Outcome::Done) {
                        let mut named = vec![(op.dir, op.epoch)];
                        if let LeasedChange::Rename {
                            new_dir, new_epoch, ..
                        } = op.change
                        {
                            named.push((new_dir, new_epoch));
                        }
                        for (dir, epoch) in named {
                            if self.holds(holder, dir, epoch) {
                                self.leases.remove(&dir);
                            }
                        }
                    }
                    outcomes.push(outcome);
                }
                Ok(Outcome::Batch(outcomes))
            }
            Command::SetLayout { .. }
            | Command::RecordGenerations { .. }
            | Command::RelocateShards { .. }
            | Command::RelocateShardsPlanned { .. }
            | Command::DisownShards { .. }
            | Command::ChangeNode { .. }
            | Command::TierStripes { .. }
            | Command::ObjectsDeleted { .. }
            | Command::RecordReads { .. }
            | Command::WarmStripe { .. }
            | Command::SetPin { .. }
            | Command::RevokeCertificates { .. }
            | Command::ObjectsOrphaned { .. } => {
                unreachable!("not generated (unit-tested beside their apply)")
            }
        }
    }

    /// The holder of a lease that refuses `command` (see `lease.rs`): a change of a
    /// leased directory's entries or attributes, or the removal of a leased directory.
    fn fenced_by(&self, command: &Command) -> Option<(Ino, NodeId)> {
        let leased = |dir: &Ino| self.leases.get(dir).map(|l| (*dir, l.0));
        let leased_subdir = |dir: &Ino, name: &String| {
            let child = self.dirents.get(&(*dir, name.clone()))?;
            leased(child)
        };
        match command {
            Command::MkNode { parent, .. } | Command::Unlink { parent, .. } => leased(parent),
            Command::Link { new_parent, .. } => leased(new_parent),
            Command::Rmdir { parent, name } => {
                leased(parent).or_else(|| leased_subdir(parent, name))
            }
            Command::Rename {
                parent,
                new_parent,
                new_name,
                flags,
                ..
            } => leased(parent).or_else(|| leased(new_parent)).or_else(|| {
                if flags.exchange {
                    None
                } else {
                    leased_subdir(new_parent, new_name)
                }
            }),
            Command::SetAttr { ino, .. } => leased(ino),
            _ => None,
        }
    }

    /// The holder's lease on `dir` at `epoch`, still.
    fn holds(&self, holder: NodeId, dir: Ino, epoch: u64) -> bool {
        self.leases.get(&dir) == Some(&(holder, epoch))
    }

    /// Entry `name` of `dir` if it is a directory leased: `Ok(Some(ino))` when `holder`
    /// holds it, `Err((ino, other))` when another node does.
    fn removable(
        &self,
        holder: NodeId,
        dir: Ino,
        name: &str,
    ) -> Result<Option<Ino>, (Ino, NodeId)> {
        let Some(&child) = self.dirents.get(&(dir, name.to_owned())) else {
            return Ok(None);
        };
        match self.leases.get(&child) {
            Some(&(h, _)) if h == holder => Ok(Some(child)),
            Some(&(other, _)) => Err((child, other)),
            None => Ok(None),
        }
    }

    fn leased(&mut self, holder: NodeId, op: &LeasedOp) -> Result<Outcome, FsError> {
        let (dir, now) = (op.dir, op.now);
        if !self.holds(holder, dir, op.epoch) {
            return Ok(Outcome::LeaseLost);
        }
        match op.change.clone() {
            LeasedChange::MkNode {
                ino,
                name,
                kind,
                perm,
                owner,
                rdev,
                target,
            } => {
                let (ranges, floor) = self.ranges.get(&holder).cloned().unwrap_or_default();
                let in_range = ranges.iter().any(|&(s, e)| (s..e).contains(&ino));
                if !in_range || ino < floor || self.nodes.contains_key(&ino) {
                    return Err(FsError::Invalid);
                }
                let made =
                    self.mknode(now, dir, &name, kind, perm, owner, rdev, target, Some(ino))?;
                let entry = self.ranges.entry(holder).or_default();
                entry.1 = ino + 1;
                entry.0.retain(|&(_, e)| e > ino + 1);
                if entry.0.is_empty() {
                    self.ranges.remove(&holder);
                }
                // A directory made under a lease is leased to its maker, at the same epoch.
                if kind == FileKind::Dir {
                    self.leases.insert(ino, (holder, op.epoch));
                }
                Ok(made)
            }
            LeasedChange::Link { ino, name } => self.link(now, ino, dir, &name),
            LeasedChange::Unlink { name } => self.unlink(now, dir, &name),
            LeasedChange::Rmdir { name } => {
                let child = match self.removable(holder, dir, &name) {
                    Ok(child) => child,
                    Err((dir, other)) => return Ok(Outcome::Leased { dir, holder: other }),
                };
                let outcome = self.rmdir(now, dir, &name)?;
                if let Some(child) = child {
                    self.leases.remove(&child);
                }
                Ok(outcome)
            }
            LeasedChange::Rename {
                name,
                new_dir,
                new_epoch,
                new_name,
                flags,
            } => {
                if !self.holds(holder, new_dir, new_epoch) {
                    return Ok(Outcome::LeaseLost);
                }
                let src = self.dirents.get(&(dir, name.clone())).copied();
                let over = if flags.exchange {
                    None
                } else {
                    match self.removable(holder, new_dir, &new_name) {
                        Ok(child) => child.filter(|c| Some(*c) != src),
                        Err((dir, other)) => return Ok(Outcome::Leased { dir, holder: other }),
                    }
                };
                let outcome = self.rename(now, dir, &name, new_dir, &new_name, flags)?;
                if let Some(child) = over {
                    self.leases.remove(&child);
                }
                Ok(outcome)
            }
            LeasedChange::SetAttr { ino, set } => {
                if ino != dir && self.kind(ino) == Some(FileKind::Dir) {
                    return Err(FsError::Invalid);
                }
                self.setattr(now, ino, &set)
            }
            LeasedChange::WriteInline {
                ino,
                offset,
                data,
                max_inline,
            } => self.write_inline(now, ino, offset, &data, max_inline),
            // The harness never stamps its batches: the cluster clock stays at 0, never
            // past an op's `commit_by_ms` (the lease tests cover that refusal).
            LeasedChange::WriteExtents {
                ino,
                inline_version,
                extents,
                ..
            } => self.write_extents(now, ino, inline_version, &extents),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn mknode(
        &mut self,
        now: Timestamp,
        parent: Ino,
        name: &str,
        kind: FileKind,
        perm: u16,
        owner: Owner,
        rdev: u32,
        target: Option<String>,
        ino: Option<Ino>,
    ) -> Result<Outcome, FsError> {
        self.directory(parent)?;
        check_name(name)?;
        if self.dirents.contains_key(&(parent, name.to_owned())) {
            return Err(FsError::Exists);
        }
        let target = match (kind, target) {
            (FileKind::Symlink, Some(t)) if !t.is_empty() => t,
            (FileKind::Symlink, _) => return Err(FsError::Invalid),
            _ => String::new(),
        };
        let parent_attr = self.attr(parent);
        let mut perm = perm & 0o7777;
        let mut gid = owner.gid;
        if parent_attr.perm & 0o2000 != 0 {
            gid = parent_attr.gid;
            if kind == FileKind::Dir {
                perm |= 0o2000;
            }
        }
        let ino = ino.unwrap_or_else(|| {
            self.next_ino += 1;
            self.next_ino - 1
        });
        let node = Node {
            attr: FileAttr {
                ino,
                kind,
                perm,
                nlink: 1,
                uid: owner.uid,
                gid,
                size: target.len() as u64,
                atime: now,
                mtime: now,
                ctime: now,
                rdev: if matches!(kind, FileKind::CharDevice | FileKind::BlockDevice) {
                    rdev
                } else {
                    0
                },
            },
            target,
            inline: Vec::new(),
            version: 0,
            bytes: BTreeMap::new(),
        };
        self.nodes.insert(ino, node);
        self.dirents.insert((parent, name.to_owned()), ino);
        self.touch_dir(parent, now);
        Ok(Outcome::Attr(self.attr(ino)))
    }

    fn link(
        &mut self,
        now: Timestamp,
        ino: Ino,
        new_parent: Ino,
        new_name: &str,
    ) -> Result<Outcome, FsError> {
        let Some(node) = self.nodes.get(&ino) else {
            return Err(FsError::NotFound);
        };
        if node.attr.kind == FileKind::Dir {
            return Err(FsError::NotPermitted);
        }
        if node.attr.nlink == 0 {
            return Err(FsError::NotFound);
        }
        self.directory(new_parent)?;
        check_name(new_name)?;
        if self
            .dirents
            .contains_key(&(new_parent, new_name.to_owned()))
        {
            return Err(FsError::Exists);
        }
        self.dirents.insert((new_parent, new_name.to_owned()), ino);
        let node = self.node(ino);
        node.attr.nlink += 1;
        node.attr.ctime = now;
        self.touch_dir(new_parent, now);
        Ok(Outcome::Attr(self.attr(ino)))
    }

    fn drop_name(&mut self, now: Timestamp, ino: Ino) {
        let node = self.node(ino);
        node.attr.nlink -= 1;
        node.attr.ctime = now;
        if node.attr.nlink == 0 {
            self.orphans.insert(ino, now);
        }
    }

    fn unlink(&mut self, now: Timestamp, parent: Ino, name: &str) -> Result<Outcome, FsError> {
        self.directory(parent)?;
        check_name(name)?;
        let key = (parent, name.to_owned());
        let Some(&ino) = self.dirents.get(&key) else {
            return Err(FsError::NotFound);
        };
        if self.kind(ino) == Some(FileKind::Dir) {
            return Err(FsError::IsDir);
        }
        self.dirents.remove(&key);
        self.drop_name(now, ino);
        self.touch_dir(parent, now);
        Ok(Outcome::Done)
    }

    fn rmdir(&mut self, now: Timestamp, parent: Ino, name: &str) -> Result<Outcome, FsError> {
        match name {
            "." => return Err(FsError::Invalid),
            ".." => return Err(FsError::NotEmpty),
            _ => {}
        }
        self.directory(parent)?;
        check_name(name)?;
        let key = (parent, name.to_owned());
        let Some(&ino) = self.dirents.get(&key) else {
            return Err(FsError::NotFound);
        };
        if self.kind(ino) != Some(FileKind::Dir) {
            return Err(FsError::NotDir);
        }
        if !self.entries(ino).is_empty() {
            return Err(FsError::NotEmpty);
        }
        self.dirents.remove(&key);
        self.nodes.remove(&ino);
        self.touch_dir(parent, now);
        Ok(Outcome::Done)
    }

    fn rename(
        &mut self,
        now: Timestamp,
        parent: Ino,
        name: &str,
        new_parent: Ino,
        new_name: &str,
        flags: RenameFlags,
    ) -> Result<Outcome, FsError> {
        if flags.exchange && flags.noreplace {
            return Err(FsError::Invalid);
        }
        self.directory(parent)?;
        self.directory(new_parent)?;
        check_name(name)?;
        check_name(new_name)?;
        let src_key = (parent, name.to_owned());
        let dst_key = (new_parent, new_name.to_owned());
        let Some(&src) = self.dirents.get(&src_key) else {
            return Err(FsError::NotFound);
        };
        let dst = self.dirents.get(&dst_key).copied();
        if flags.exchange && dst.is_none() {
            return Err(FsError::NotFound);
        }
        if dst == Some(src) {
            return Ok(Outcome::Done);
        }
        if dst.is_some() && flags.noreplace {
            return Err(FsError::Exists);
        }
        let src_dir = self.kind(src) == Some(FileKind::Dir);
        let dst_dir = dst.is_some_and(|d| self.kind(d) == Some(FileKind::Dir));
        if src_dir && self.is_within(new_parent, src) {
            return Err(FsError::Invalid);
        }
        if let Some(dst) = dst {
            if flags.exchange {
                if dst_dir && self.is_within(parent, dst) {
                    return Err(FsError::Invalid);
                }
            } else {
                match (src_dir, dst_dir) {
                    (true, false) => return Err(FsError::NotDir),
                    (false, true) => return Err(FsError::IsDir),
                    (true, true) if !self.entries(dst).is_empty() => {
                        return Err(FsError::NotEmpty);
                    }
                    _ => {}
                }
            }
        }
        if flags.exchange {
            let dst = dst.expect("checked");
            self.dirents.insert(src_key, dst);
            self.dirents.insert(dst_key, src);
            self.node(dst).attr.ctime = now;
        } else {
            if let Some(dst) = dst {
                if dst_dir {
                    self.nodes.remove(&dst);
                } else {
                    self.drop_name(now, dst);
                }
            }
            self.dirents.remove(&src_key);
            self.dirents.insert(dst_key, src);
        }
        self.node(src).attr.ctime = now;
        self.touch_dir(parent, now);
        self.touch_dir(new_parent, now);
        Ok(Outcome::Done)
    }

    fn setattr(&mut self, now: Timestamp, ino: Ino, set: &SetAttr) -> Result<Outcome, FsError> {
        let Some(kind) = self.kind(ino) else {
            return Err(FsError::NotFound);
        };
        if set.size.is_some() {
            match kind {
                FileKind::File => {}
                FileKind::Dir => return Err(FsError::IsDir),
                _ => return Err(FsError::Invalid),
            }
        }
        let node = self.node(ino);
        if let Some(size) = set.size {
            node.bytes.retain(|&offset, _| offset < size);
            node.inline.truncate(size as usize);
            node.attr.size = size;
            node.version += 1;
            node.attr.mtime = now;
        }
        if let Some(perm) = set.perm {
            node.attr.perm = perm & 0o7777;
        }
        if let Some(uid) = set.uid {
            node.attr.uid = uid;
        }
        if let Some(gid) = set.gid {
            node.attr.gid = gid;
        }
        let resolve = |t: SetTime| match t {
            SetTime::Now => now,
            SetTime::At(t) => t,
        };
        if let Some(atime) = set.atime {
            node.attr.atime = resolve(atime);
        }
        if let Some(mtime) = set.mtime {
            node.attr.mtime = resolve(mtime);
        }
        node.attr.ctime = now;
        Ok(Outcome::Attr(self.attr(ino)))
    }

    fn file(&self, ino: Ino) -> Result<(), FsError> {
        match self.kind(ino) {
            Some(FileKind::File) => Ok(()),
            Some(FileKind::Dir) => Err(FsError::IsDir),
            Some(_) => Err(FsError::Invalid),
            None => Err(FsError::NotFound),
        }
    }

    fn write_inline(
        &mut self,
        now: Timestamp,
        ino: Ino,
        offset: u64,
        data: &[u8],
        max_inline: u64,
    ) -> Result<Outcome, FsError> {
        self.file(ino)?;
        let node = self.node(ino);
        let end = offset + data.len() as u64;
        if end > max_inline || !node.bytes.is_empty() {
            return Ok(Outcome::NotInline {
                inline: node.inline.clone(),
                version: node.version,
            });
        }
        if node.inline.len() < end as usize {
            node.inline.resize(end as usize, 0);
        }
        node.inline[offset as usize..end as usize].copy_from_slice(data);
        node.attr.size = node.attr.size.max(end);
        node.version += 1;
        node.attr.mtime = now;
        node.attr.ctime = now;
        Ok(Outcome::Attr(self.attr(ino)))
    }

    fn write_extents(
        &mut self,
        now: Timestamp,
        ino: Ino,
        inline_version: Option<u64>,
        extents: &[NewExtent],
    ) -> Result<Outcome, FsError> {
        self.file(ino)?;
        if extents.iter().any(|e| e.len == 0 || e.len > e.stripe.len) {
            return Err(FsError::Invalid);
        }
        let node = self.nodes.get_mut(&ino).expect("file");
        // The writer's carried inline bytes: exactly the file's current ones, or none.
        let carried_ok = match inline_version {
            Some(v) => !node.inline.is_empty() && v == node.version,
            None => node.inline.is_empty(),
        };
        if !carried_ok {
            return Ok(Outcome::Conflict);
        }
        if let Some(e) = extents
            .iter()
            .find(|e| self.abandoned.contains(&e.stripe.id.0))
        {
            return Ok(Outcome::StripeAbandoned(e.stripe.id));
        }
        let node = self.nodes.get_mut(&ino).expect("file");
        node.inline.clear();
        for ext in extents {
            for i in 0..ext.len {
                node.bytes.insert(ext.offset + i, (ext.stripe.id.0, i));
            }
            node.attr.size = node.attr.size.max(ext.offset + ext.len);
            self.issued.insert(ext.stripe.id.0, ext.stripe.clone());
        }
        node.version += 1;
        node.attr.mtime = now;
        node.attr.ctime = now;
        Ok(Outcome::Attr(self.attr(ino)))
    }
}

// ---------------------------------------------------------------------------------------
// Generating commands

const NAMES: &[&str] = &["a", "b", "c", "d", "e", "f"];

struct Gen {
    rng: Rng,
    next_stripe: u128,
}

impl Gen {
    /// Extents (some invalid) and an inline version (mostly the file's own) for a write
    /// of `ino`.
    fn extents_for(&mut self, model: &Model, ino: Ino) -> (Option<u64>, Vec<NewExtent>) {
        let count = 1 + self.rng.below(3);
        let mut extents = Vec::new();
        for _ in 0..count {
            let len = self.rng.below(20) + u64::from(!self.rng.chance(3));
            let slack = if self.rng.chance(3) {
                0
            } else {
                self.rng.below(5)
            };
            let stripe = self.stripe(len + slack);
            let mut ext = NewExtent {
                offset: self.rng.below(64),
                len,
                stripe,
            };
            if self.rng.chance(2) {
                ext.stripe.len = len.saturating_sub(1);
            }
            extents.push(ext);
        }
        let version = model.nodes.get(&ino).map(|n| n.version);
        let inline_version = match self.rng.below(10) {
            0 => None,
            1 => version.map(|v| v + 1),
            _ => version,
        };
        (inline_version, extents)
    }

    fn name(&mut self) -> String {
        match self.rng.below(100) {
            0 => String::new(),
            1 => ".".into(),
            2 => "..".into(),
            3 => "x/y".into(),
            4 => "n".repeat(NAME_MAX + 1),
            _ => self.rng.pick(NAMES).to_owned(),
        }
    }

    fn dir(&mut self, model: &Model) -> Ino {
        let dirs: Vec<Ino> = model
            .nodes
            .iter()
            .filter(|(_, n)| n.attr.kind == FileKind::Dir)
            .map(|(ino, _)| *ino)
            .collect();
        if self.rng.chance(5) {
            return self.ino(model);
        }
        self.rng.pick(&dirs)
    }

    /// A (directory, name), mostly an existing entry whose inode's kind passes `want`.
    fn entry(&mut self, model: &Model, want: impl Fn(FileKind) -> bool) -> (Ino, String) {
        let entries: Vec<(Ino, String)> = model
            .dirents
            .iter()
            .filter(|(_, ino)| model.kind(**ino).is_some_and(&want))
            .map(|(key, _)| key.clone())
            .collect();
        if entries.is_empty() || self.rng.chance(30) {
            return (self.dir(model), self.name());
        }
        self.rng.pick(&entries)
    }

    /// Any inode, now and then one that does not exist.
    fn ino(&mut self, model: &Model) -> Ino {
        if self.rng.chance(5) {
            return model.next_ino + self.rng.below(3);
        }
        let inos: Vec<Ino> = model.nodes.keys().copied().collect();
        self.rng.pick(&inos)
    }

    fn file(&mut self, model: &Model) -> Ino {
        let files: Vec<Ino> = model
            .nodes
            .iter()
            .filter(|(_, n)| n.attr.kind == FileKind::File)
            .map(|(ino, _)| *ino)
            .collect();
        if files.is_empty() || self.rng.chance(10) {
            return self.ino(model);
        }
        self.rng.pick(&files)
    }

    fn stripe(&mut self, len: u64) -> StripeRecord {
        self.next_stripe += 1;
        StripeRecord {
            id: StripeId(self.next_stripe),
            len,
            ec: EcProfile { k: 2, m: 1 },
            shard_len: len.div_ceil(2),
            epoch: 1,
            shards: (0..3)
                .map(|index| ShardLocation {
                    index,
                    node: NodeId(u64::from(index) + 1),
                    crc32c: index.into(),
                })
                .collect(),
        }
    }

    /// A node that may hold leases.
    fn holder(&mut self) -> NodeId {
        NodeId(1 + self.rng.below(2))
    }

    /// A lease command: mostly with the epochs the model holds, now and then stale ones.
    fn lease_command(&mut self, model: &Model) -> Command {
        match self.rng.below(10) {
            0..=2 => Command::TakeDirLease {
                dir: self.dir(model),
                holder: self.holder(),
            },
            3..=4 => {
                let leases: Vec<(Ino, u64)> = model.leases.iter().map(|(d, l)| (*d, l.1)).collect();
                let (dir, epoch) = if leases.is_empty() || self.rng.chance(10) {
                    (self.dir(model), self.rng.below(model.lease_epoch + 2))
                } else {
                    self.rng.pick(&leases)
                };
                Command::ReturnDirLease { dir, epoch }
            }
            5 => Command::TakeInos {
                holder: self.holder(),
                count: self.rng.below(8),
            },
            _ => {
                let holder = self.holder();
                let ops = (0..1 + self.rng.below(4))
                    .map(|_| self.leased_op(model, holder))
                    .collect();
                Command::LeasedBatch { holder, ops }
            }
        }
    }

    /// One op of `holder`'s batch, mostly in a directory it holds.
    fn leased_op(&mut self, model: &Model, holder: NodeId) -> LeasedOp {
        let held: Vec<(Ino, u64)> = model
            .leases
            .iter()
            .filter(|(_, l)| l.0 == holder)
            .map(|(d, l)| (*d, l.1))
            .collect();
        let (dir, epoch) = if held.is_empty() || self.rng.chance(10) {
            (self.dir(model), self.rng.below(model.lease_epoch + 2))
        } else {
            self.rng.pick(&held)
        };
        let named = |g: &mut Gen, want: fn(FileKind) -> bool| {
            let names: Vec<String> = model
                .entries(dir)
                .into_iter()
                .filter(|(_, i)| model.kind(*i).is_some_and(want))
                .map(|(n, _)| n)
                .collect();
            if names.is_empty() || g.rng.chance(20) {
                g.name()
            } else {
                g.rng.pick(&names)
            }
        };
        let change = match self.rng.below(10) {
            0..=2 => {
                // A number handed out to the holder and not passed, or now and then any.
                let (ranges, floor) = model.ranges.get(&holder).cloned().unwrap_or_default();
                let free: Vec<Ino> = ranges
                    .iter()
                    .flat_map(|&(s, e)| s..e)
                    .filter(|&i| i >= floor && !model.nodes.contains_key(&i))
                    .take(3)
                    .collect();
                let ino = if free.is_empty() || self.rng.chance(10) {
                    self.ino(model)
                } else {
                    self.rng.pick(&free)
                };
                let kind =
                    [FileKind::File, FileKind::Dir, FileKind::Symlink][self.rng.below(3) as usize];
                LeasedChange::MkNode {
                    ino,
                    name: self.name(),
                    kind,
                    perm: 0o644,
                    owner: Owner { uid: 1, gid: 1 },
                    rdev: 0,
                    target: (kind == FileKind::Symlink).then(|| "t".into()),
                }
            }
            3 => LeasedChange::Link {
                ino: self.file(model),
                name: self.name(),
            },
            4 => LeasedChange::Unlink {
                name: named(self, |k| k != FileKind::Dir),
            },
            5 => LeasedChange::Rmdir {
                name: named(self, |k| k == FileKind::Dir),
            },
            6 => {
                let (new_dir, new_epoch) = if held.is_empty() || self.rng.chance(50) {
                    (dir, epoch)
                } else {
                    self.rng.pick(&held)
                };
                LeasedChange::Rename {
                    name: named(self, |_| true),
                    new_dir,
                    new_epoch,
                    new_name: self.name(),
                    flags: RenameFlags {
                        noreplace: self.rng.chance(10),
                        exchange: self.rng.chance(10),
                    },
                }
            }
            7 => {
                let ino = if self.rng.chance(20) {
                    dir
                } else {
                    self.ino(model)
                };
                LeasedChange::SetAttr {
                    ino,
                    set: SetAttr {
                        perm: Some(self.rng.below(0o10000) as u16),
                        size: self.rng.chance(30).then(|| self.rng.below(40)),
                        ..SetAttr::default()
                    },
                }
            }
            8 => {
                let ino = self.file(model);
                let (inline_version, extents) = self.extents_for(model, ino);
                LeasedChange::WriteExtents {
                    ino,
                    inline_version,
                    extents,
                    commit_by_ms: self.rng.below(1_000),
                }
            }
            _ => LeasedChange::WriteInline {
                ino: self.file(model),
                offset: self.rng.below(20),
                data: vec![9; self.rng.below(12) as usize],
                max_inline: 32,
            },
        };
        LeasedOp {
            dir,
            epoch,
            now: Timestamp {
                secs: 500 + self.rng.below(100) as i64,
                nanos: 0,
            },
            change,
        }
    }

    fn command(&mut self, model: &Model) -> Command {
        if self.rng.chance(15) {
            return self.lease_command(model);
        }
        let r = &mut self.rng;
        match r.below(100) {
            0..=21 => {
                let kind = match r.below(10) {
                    0..=3 => FileKind::File,
                    4..=6 => FileKind::Dir,
                    7 => FileKind::Symlink,
                    8 => FileKind::Fifo,
                    _ => FileKind::CharDevice,
                };
                let target = match kind {
                    FileKind::Symlink if !r.chance(5) => Some("t".repeat(1 + r.below(9) as usize)),
                    _ => None,
                };
                let perm = [0o644, 0o755, 0o2755, 0o1777][r.below(4) as usize];
                let owner = Owner {
                    uid: r.below(3) as u32,
                    gid: r.below(3) as u32,
                };
                let rdev = r.below(300) as u32;
                Command::MkNode {
                    parent: self.dir(model),
                    name: self.name(),
                    kind,
                    perm,
                    owner,
                    rdev,
                    target,
                }
            }
            22..=29 => Command::Link {
                ino: self.ino(model),
                new_parent: self.dir(model),
                new_name: self.name(),
            },
            30..=39 => {
                let (parent, name) = self.entry(model, |_| true);
                Command::Unlink { parent, name }
            }
            40..=46 => {
                let (parent, name) = self.entry(model, |k| k == FileKind::Dir);
                Command::Rmdir { parent, name }
            }
            47..=61 => {
                let flags = match self.rng.below(10) {
                    0 => RenameFlags {
                        noreplace: true,
                        exchange: false,
                    },
                    1 => RenameFlags {
                        noreplace: false,
                        exchange: true,
                    },
                    _ => RenameFlags::default(),
                };
                let (parent, name) = self.entry(model, |_| true);
                Command::Rename {
                    parent,
                    name,
                    new_parent: self.dir(model),
                    new_name: self.name(),
                    flags,
                }
            }
            62..=69 => {
                let ino = if r.chance(70) {
                    self.file(model)
                } else {
                    self.ino(model)
                };
                let r = &mut self.rng;
                let set = SetAttr {
                    perm: r.chance(30).then(|| r.below(0o10000) as u16),
                    uid: r.chance(10).then(|| r.below(5) as u32),
                    gid: r.chance(10).then(|| r.below(5) as u32),
                    size: r.chance(60).then(|| r.below(80)),
                    atime: r
                        .chance(20)
                        .then_some(SetTime::At(Timestamp { secs: 7, nanos: 1 })),
                    mtime: r.chance(20).then_some(SetTime::Now),
                };
                Command::SetAttr { ino, set }
            }
            70..=79 => {
                let ino = self.file(model);
                let r = &mut self.rng;
                let len = r.below(12) as usize;
                let fill = r.below(255) as u8 + 1;
                Command::WriteInline {
                    ino,
                    offset: r.below(40),
                    data: vec![fill; len],
                    max_inline: 32,
                }
            }
            80..=91 => {
                let ino = self.file(model);
                let (inline_version, extents) = self.extents_for(model, ino);
                Command::WriteExtents {
                    ino,
                    inline_version,
                    extents,
                }
            }
            92..=95 => {
                let orphans: Vec<Ino> = model.orphans.keys().copied().collect();
                let ino = if orphans.is_empty() || self.rng.chance(20) {
                    self.ino(model)
                } else {
                    self.rng.pick(&orphans)
                };
                Command::Purge { ino }
            }
            _ if self.rng.chance(50) => {
                // Known stripes (live or garbage), and ids this generator has issued or
                // will issue next: a later commit naming one of those is refused.
                let ids = (0..1 + self.rng.below(3))
                    .map(|_| StripeId(self.rng.below(self.next_stripe as u64 + 4).into()))
                    .collect();
                Command::AbandonStripes { ids }
            }
            _ => {
                let garbage: Vec<u128> = model.garbage().into_iter().collect();
                let mut ids: Vec<StripeId> = garbage
                    .iter()
                    .filter(|_| self.rng.chance(50))
                    .map(|id| StripeId(*id))
                    .collect();
                ids.push(StripeId(self.rng.below(self.next_stripe as u64 + 2).into()));
                Command::StripesFreed { ids }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Comparing

fn fs_err<T: std::fmt::Debug>(r: Result<T, NamespaceError>) -> FsError {
    match r {
        Err(NamespaceError::Fs(e)) => e.into(),
        other => panic!("expected a namespace error, got {other:?}"),
    }
}

fn check(store: &NamespaceStore, model: &Model, ctx: &str) {
    for (&ino, node) in &model.nodes {
        let attr = model.attr(ino);
        assert_eq!(
            store.getattr(ino).expect("getattr"),
            attr,
            "{ctx}: getattr {ino}"
        );
        match attr.kind {
            FileKind::Dir => {
                let want: Vec<(String, Ino, FileKind)> = model
                    .entries(ino)
                    .into_iter()
                    .map(|(name, child)| (name, child, model.kind(child).expect("child")))
                    .collect();
                let got: Vec<(String, Ino, FileKind)> = store
                    .readdir(ino)
                    .expect("readdir")
                    .into_iter()
                    .map(|e| (e.name, e.ino, e.kind.into()))
                    .collect();
                assert_eq!(got, want, "{ctx}: readdir {ino}");
                for (name, child, _) in &want {
                    let found = store.lookup(ino, name).expect("lookup");
                    assert_eq!(found, model.attr(*child), "{ctx}: lookup {ino}/{name}");
                }
                assert_eq!(
                    fs_err(store.lookup(ino, "zz")),
                    FsError::NotFound,
                    "{ctx}: lookup of a missing name"
                );
                let parent = store.parent_of(ino).expect("parent_of");
                assert_eq!(parent, model.parent_of(ino), "{ctx}: parent_of {ino}");
            }
            FileKind::Symlink => {
                let target = store.readlink(ino).expect("readlink");
                assert_eq!(target, node.target, "{ctx}: readlink {ino}");
            }
            FileKind::File => check_file(store, model, ino, ctx),
            _ => {}
        }
    }
    for ino in model.next_ino..model.next_ino + 2 {
        assert_eq!(
            fs_err(store.getattr(ino)),
            FsError::NotFound,
            "{ctx}: {ino}"
        );
    }
    let orphans: Vec<(Ino, Timestamp)> = model.orphans.iter().map(|(i, t)| (*i, *t)).collect();
    let stored: Vec<(Ino, Timestamp)> = store
        .orphans()
        .expect("orphans")
        .into_iter()
        .map(|(i, t)| (i, t.into()))
        .collect();
    assert_eq!(stored, orphans, "{ctx}: orphans");
    let garbage: Vec<u128> = store
        .garbage(None, usize::MAX)
        .expect("garbage")
        .into_iter()
        .map(|r| {
            assert_eq!(r, model.issued[&r.id.0], "{ctx}: garbage record");
            r.id.0
        })
        .collect();
    let want_garbage: Vec<u128> = model.garbage().into_iter().collect();
    assert_eq!(garbage, want_garbage, "{ctx}: garbage");
    for (&ino, node) in &model.nodes {
        if node.attr.kind == FileKind::Dir {
            let want = model
                .leases
                .get(&ino)
                .map(|&(holder, epoch)| DirLease { holder, epoch });
            assert_eq!(
                store.dir_lease(ino).expect("lease"),
                want,
                "{ctx}: lease of {ino}"
            );
        }
    }
    assert!(
        model.leases.keys().all(|d| model.nodes.contains_key(d)),
        "{ctx}: a lease outlived its directory"
    );
    let live = model.referenced();
    let stats = store.stats().expect("stats");
    assert_eq!(stats.inodes, model.nodes.len() as u64, "{ctx}: inode count");
    assert_eq!(stats.stripes, live.len() as u64, "{ctx}: stripe count");
    let bytes: u64 = live.iter().map(|id| model.issued[id].len).sum();
    assert_eq!(stats.stripe_bytes, bytes, "{ctx}: stripe bytes");
    for id in model.issued.keys() {
        let known = live.contains(id) || want_garbage.contains(id);
        let got = store.stripe_known(StripeId(*id)).expect("stripe_known");
        assert_eq!(got, known, "{ctx}: stripe_known {id}");
    }
}

/// Every inode and directory entry the apply changed is in the speculation's overlay.
fn check_overlay_complete(
    before: &Model,
    after: &Model,
    overlay: &shoal_namespace::Overlay,
    ctx: &str,
) {
    let keys: BTreeSet<&(Ino, String)> =
        before.dirents.keys().chain(after.dirents.keys()).collect();
    for key in keys {
        let now = after.dirents.get(key);
        if before.dirents.get(key) != now {
            let want = now.map(|&ino| (ino, after.kind(ino).expect("entry of an inode")));
            assert_eq!(
                overlay.entry(key.0, &key.1),
                Some(want),
                "{ctx}: entry {key:?}"
            );
        }
    }
    let inos: BTreeSet<&Ino> = before.nodes.keys().chain(after.nodes.keys()).collect();
    for &ino in inos {
        let was = before
            .nodes
            .get(&ino)
            .map(|n| (before.attr(ino), n.inline.clone()));
        let now = after
            .nodes
            .get(&ino)
            .map(|n| (after.attr(ino), n.inline.clone()));
        if was != now {
            let got = overlay
                .inode(ino)
                .map(|o| o.map(|o| (o.attr.clone(), o.inline.clone())));
            let now = now.map(|(attr, inline)| (attr.into(), inline));
            assert_eq!(got, Some(now), "{ctx}: inode {ino}");
        }
    }
}

/// What a speculation said it changed is what the apply left.
fn check_overlay(store: &NamespaceStore, overlay: &shoal_namespace::Overlay, ctx: &str) {
    for ino in 1..4096 {
        match overlay.inode(ino) {
            None => {}
            Some(None) => assert_eq!(
                fs_err(store.getattr(ino)),
                FsError::NotFound,
                "{ctx}: speculated deletion of {ino}"
            ),
            Some(Some(o)) => {
                assert_eq!(
                    store.getattr(ino).expect("getattr"),
                    o.attr,
                    "{ctx}: speculated {ino}"
                );
                if o.attr.kind == shoal_agent_api::FileKind::File {
                    let data = store.file_data(ino).expect("file_data");
                    assert_eq!(data.inline, o.inline, "{ctx}: speculated inline of {ino}");
                }
            }
        }
        let entries: Vec<(String, Option<(Ino, FileKind)>)> = overlay
            .entries_of(ino)
            .map(|(n, e)| (n.to_owned(), e))
            .collect();
        for (name, entry) in entries {
            assert_eq!(overlay.entry(ino, &name), Some(entry));
            match entry {
                Some((child, _)) => assert_eq!(
                    store.lookup(ino, &name).expect("lookup").ino,
                    child,
                    "{ctx}: speculated entry {ino}/{name}"
                ),
                None => assert!(
                    store.lookup(ino, &name).is_err(),
                    "{ctx}: speculated removal of {ino}/{name}"
                ),
            }
        }
    }
}

fn check_file(store: &NamespaceStore, model: &Model, ino: Ino, ctx: &str) {
    let node = &model.nodes[&ino];
    let data = store.file_data(ino).expect("file_data");
    assert_eq!(data.attr, model.attr(ino), "{ctx}: file_data attr {ino}");
    assert_eq!(data.inline, node.inline, "{ctx}: inline {ino}");
    assert_eq!(data.inline_version, node.version, "{ctx}: version {ino}");
    assert!(
        data.inline.is_empty() || data.extents.is_empty(),
        "{ctx}: both"
    );
    let mut bytes = BTreeMap::new();
    let mut end = 0;
    for ext in &data.extents {
        assert!(
            ext.offset >= end && ext.len > 0,
            "{ctx}: extents of {ino} overlap"
        );
        assert!(
            ext.stripe_offset + ext.len <= ext.stripe.len,
            "{ctx}: extent past stripe"
        );
        assert_eq!(
            ext.stripe, model.issued[&ext.stripe.id.0],
            "{ctx}: stripe record"
        );
        for i in 0..ext.len {
            bytes.insert(ext.offset + i, (ext.stripe.id.0, ext.stripe_offset + i));
        }
        end = ext.offset + ext.len;
    }
    assert!(
        end <= data.attr.size,
        "{ctx}: extent past the size of {ino}"
    );
    assert_eq!(bytes, node.bytes, "{ctx}: content of {ino}");
    let layout = store.file_layout(ino).expect("file_layout");
    assert_eq!(layout.extents, data.extents, "{ctx}: layout of {ino}");
    assert_eq!(
        layout.inline_len,
        data.inline.len() as u64,
        "{ctx}: inline_len"
    );
}

// ---------------------------------------------------------------------------------------
// Driving

/// Prints the seed when a run panics, so it can be replayed.
struct SeedReport(u64);

impl Drop for SeedReport {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "model test failed; replay with SHOAL_META_MODEL_SEED={}",
                self.0
            );
        }
    }
}

struct Harness {
    dir: tempfile::TempDir,
    path: PathBuf,
    generation: u32,
    store: Option<NamespaceStore>,
}

impl Harness {
    fn new() -> Harness {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("meta-0.redb");
        let store = Some(NamespaceStore::open(&path).expect("open"));
        Harness {
            dir,
            path,
            generation: 0,
            store,
        }
    }

    fn store(&self) -> &NamespaceStore {
        self.store.as_ref().expect("store open")
    }

    /// Drops the store and opens it again from its file.
    fn restart(&mut self) {
        self.store = None;
        self.store = Some(NamespaceStore::open(&self.path).expect("reopen"));
    }

    /// Moves to a fresh store installed from a snapshot of the current one.
    fn reinstall(&mut self) {
        let snap = self.store().snapshot().expect("snapshot");
        self.generation += 1;
        self.path = self
            .dir
            .path()
            .join(format!("meta-{}.redb", self.generation));
        let fresh = NamespaceStore::open(&self.path).expect("open");
        fresh.install(&snap).expect("install");
        assert_eq!(
            fresh.snapshot().expect("snapshot"),
            snap,
            "snapshot changed"
        );
        self.store = Some(fresh);
    }
}

fn run_seed(seed: u64, applies: usize) {
    let _report = SeedReport(seed);
    let mut ops = Gen {
        rng: Rng(seed),
        next_stripe: 0,
    };
    let mut model = Model::new();
    let mut h = Harness::new();
    let mut clock = 1_000i64;
    let mut seq = 0u64;
    let mut history: Vec<Proposal> = Vec::new();
    check(h.store(), &model, &format!("seed {seed} before any apply"));
    for step in 0..applies {
        let mut batches = Vec::new();
        for _ in 0..1 + ops.rng.below(2) {
            let mut proposals = Vec::new();
            for _ in 0..1 + ops.rng.below(4) {
                clock += 1;
                let repeat = !history.is_empty() && ops.rng.chance(5);
                let proposal = if repeat {
                    let mut old = ops.rng.pick(&history);
                    old.now = Timestamp {
                        secs: clock,
                        nanos: 0,
                    };
                    old
                } else {
                    let id = ops.rng.chance(50).then(|| {
                        seq += 1;
                        RequestId { client: 7, seq }
                    });
                    Proposal {
                        id,
                        now: Timestamp {
                            secs: clock,
                            nanos: 0,
                        },
                        command: ops.command(&model),
                    }
                };
                if proposal.id.is_some() && !repeat {
                    history.push(proposal.clone());
                }
                proposals.push(proposal);
            }
            batches.push(Batch::new(proposals));
        }
        let marker = step.to_le_bytes();
        let flat: Vec<Proposal> = batches.iter().flat_map(|b| b.proposals.clone()).collect();
        let speculation = h.store().speculate(&flat).expect("speculate");
        let before = model.clone();
        let got = h.store().apply(&batches, &marker).expect("apply");
        let applied: Vec<&Outcome> = got.iter().flatten().collect();
        for ((outcome, seen), (proposal, got)) in
            speculation.outcomes.iter().zip(flat.iter().zip(&applied))
        {
            assert_eq!(
                outcome, *got,
                "seed {seed} step {step}: speculated outcome of {proposal:?}"
            );
            // Only a repeat of a request applied before this step was applied already.
            let before = proposal.id.is_some_and(|id| model.dedup.contains_key(&id));
            assert_eq!(*seen, before, "seed {seed} step {step}: {proposal:?}");
        }
        check_overlay(
            h.store(),
            &speculation.overlay,
            &format!("seed {seed} step {step}"),
        );
        for (batch, outcomes) in batches.iter().zip(&got) {
            assert_eq!(
                batch.proposals.len(),
                outcomes.len(),
                "seed {seed} step {step}"
            );
            for (proposal, outcome) in batch.proposals.iter().zip(outcomes) {
                let want = model.apply(proposal);
                assert_eq!(
                    outcome, &want,
                    "seed {seed} step {step}: outcome of {proposal:?}"
                );
            }
        }
        let ctx = format!("seed {seed} step {step} after {batches:?}");
        check_overlay_complete(&before, &model, &speculation.overlay, &ctx);
        check(h.store(), &model, &ctx);
        match ops.rng.below(40) {
            0 => h.restart(),
            1 => h.reinstall(),
            _ => continue,
        }
        check(h.store(), &model, &format!("{ctx} (reopened)"));
        assert_eq!(h.store().applied().expect("applied"), Some(marker.to_vec()));
    }
}

#[test]
fn store_matches_model() {
    if let Ok(seed) = std::env::var("SHOAL_META_MODEL_SEED") {
        run_seed(seed.parse().expect("SHOAL_META_MODEL_SEED is a u64"), 400);
        return;
    }
    let seeds: u64 = std::env::var("SHOAL_META_MODEL_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    for seed in 0..seeds {
        run_seed(0x5a0a_1000 ^ seed, 200);
    }
}
