//! Directory leases, the state machine's part: which node holds the lease on a directory
//! and at which epoch, the fence that keeps every other change out of a leased directory,
//! inode numbers handed out ahead for the holder's creates, and the holder's batches.
//!
//! A node that holds a directory's lease answers the changes in it at once and commits
//! them later, in the order it answered them ([`Command::LeasedBatch`]). For that to be
//! safe the state machine guarantees two things:
//! - while a directory is leased, no other command changes its entries or its own
//!   attributes (but the ctime and parent a move of the directory itself sets): such a
//!   command is refused with [`Outcome::Leased`], which is not kept for its request id,
//!   and its proposer recalls the lease (the holder commits what it answered and returns
//!   it) or, when the holder does not answer, breaks it with [`Command::ReturnDirLease`],
//!   and asks again;
//! - an op applies only under the very grant it was answered under: every grant has an
//!   epoch no other grant had (a counter in the state), and an op whose epoch is not its
//!   directory's lease now is refused with [`Outcome::LeaseLost`]. So a holder cut off
//!   from the group, whose lease was broken, never changes the directory after another
//!   node acted on it, however late its batch arrives.
//!
//! The holder's view of a directory is its replica's plus what it answered since: exact
//! for the entries, which nothing else changes. Not fenced, and so not exact: attributes
//! of the files (a setattr by inode number from another node applies in log order, as two
//! setattrs do), whether an unleased subdirectory is empty, the directory's ancestors,
//! the link count of an inode linked in. The holder sends only ops it answered as done,
//! so an op that does not apply so shows its view was wrong there: the holder's leases on
//! the directories the op names end with it, and its later ops in them are refused as
//! lost (never applied with another meaning, such as an unlink of a name a refused rename
//! was to replace).
//!
//! Inode numbers: each holder's ranges are recorded, and a holder creates with its own
//! numbers in increasing order only, so no number is used twice, even once its inode was
//! purged.

use serde::{Deserialize, Serialize};
use shoal_agent_api::FsError;
use shoal_placement::NodeId;

use crate::command::{Command, LeasedChange, LeasedOp, MAX_INO_RANGE};
use crate::format::{FileKind, Ino};
use crate::namespace::{self, RenameArgs};
use crate::tx::Tx;
use crate::{NamespaceError, Outcome, data};

/// Who holds a directory's lease, and the grant's epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirLease {
    pub holder: NodeId,
    pub epoch: u64,
}

/// Inode numbers handed out to one lease holder: its ranges (in the order handed out, so
/// increasing) and the lowest number it may still create with. A holder creates with its
/// numbers in increasing order, so a number is never used twice, even after its inode
/// was purged.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InoRanges {
    pub ranges: Vec<(Ino, Ino)>,
    pub floor: Ino,
}

impl InoRanges {
    pub(crate) fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Whether the holder may create with `ino` now.
    fn allows(&self, ino: Ino) -> bool {
        ino >= self.floor && self.ranges.iter().any(|&(s, e)| (s..e).contains(&ino))
    }

    /// `ino` was created with: it and every number below it are passed.
    fn used(&mut self, ino: Ino) {
        self.floor = ino + 1;
        let floor = self.floor;
        self.ranges.retain(|&(_, e)| e > floor);
    }
}

/// [`Command::TakeDirLease`].
pub(crate) fn take(tx: &mut Tx<'_>, dir: Ino, holder: NodeId) -> Result<Outcome, NamespaceError> {
    match tx.inode(dir)? {
        Some(rec) if rec.is_dir() => {}
        Some(_) => return Err(FsError::NotDir.into()),
        None => return Err(FsError::NotFound.into()),
    }
    if let Some(lease) = tx.dir_lease(dir)?
        && lease.holder != holder
    {
        return Ok(Outcome::Leased {
            dir,
            holder: lease.holder,
        });
    }
    let epoch = tx.next_lease_epoch()?;
    tx.put_dir_lease(dir, DirLease { holder, epoch })?;
    Ok(Outcome::DirLease { epoch })
}

/// [`Command::ReturnDirLease`].
pub(crate) fn give_back(tx: &mut Tx<'_>, dir: Ino, epoch: u64) -> Result<Outcome, NamespaceError> {
    match tx.dir_lease(dir)? {
        Some(lease) if lease.epoch == epoch => {
            tx.remove_dir_lease(dir)?;
            Ok(Outcome::Done)
        }
        _ => Ok(Outcome::Conflict),
    }
}

/// [`Command::TakeInos`].
pub(crate) fn take_inos(
    tx: &mut Tx<'_>,
    holder: NodeId,
    count: u64,
) -> Result<Outcome, NamespaceError> {
    if count == 0 || count > MAX_INO_RANGE {
        return Err(FsError::Invalid.into());
    }
    let (start, end) = tx.allocate_inos(count);
    let mut ranges = tx.ino_ranges(holder)?;
    ranges.ranges.push((start, end));
    tx.put_ino_ranges(holder, &ranges)?;
    Ok(Outcome::Inos { start, end })
}

/// The leased directory that keeps `command` out, and its holder, if any: a change of a
/// leased directory's entries or attributes, or the removal of a leased directory (its
/// holder may have answered creates in it that are not committed yet).
pub(crate) fn fenced_by(
    tx: &mut Tx<'_>,
    command: &Command,
) -> Result<Option<(Ino, NodeId)>, NamespaceError> {
    // Every namespace command passes here: with no lease anywhere (the usual case) it
    // costs one look at the table's header, not the lookups below.
    if !tx.any_dir_leases()? {
        return Ok(None);
    }
    let leased = |tx: &mut Tx<'_>, dir: Ino| {
        Ok::<_, NamespaceError>(tx.dir_lease(dir)?.map(|l| (dir, l.holder)))
    };
    let holder = match command {
        Command::MkNode { parent, .. } | Command::Unlink { parent, .. } => leased(tx, *parent)?,
        Command::Link { new_parent, .. } => leased(tx, *new_parent)?,
        Command::Rmdir { parent, name } => match leased(tx, *parent)? {
            Some(h) => Some(h),
            None => subdir_lease(tx, *parent, name)?.map(|(d, l)| (d, l.holder)),
        },
        Command::Rename {
            parent,
            new_parent,
            new_name,
            flags,
            ..
        } => match (leased(tx, *parent)?, leased(tx, *new_parent)?) {
            (Some(h), _) | (None, Some(h)) => Some(h),
            (None, None) if !flags.exchange => {
                subdir_lease(tx, *new_parent, new_name)?.map(|(d, l)| (d, l.holder))
            }
            (None, None) => None,
        },
        Command::SetAttr { ino, .. } => leased(tx, *ino)?,
        _ => None,
    };
    Ok(holder)
}

/// Entry `name` of `dir` when it is a leased directory: its inode and lease.
fn subdir_lease(
    tx: &mut Tx<'_>,
    dir: Ino,
    name: &str,
) -> Result<Option<(Ino, DirLease)>, NamespaceError> {
    match tx.dirent(dir, name)? {
        Some(entry) if entry.kind == FileKind::Dir => {
            Ok(tx.dir_lease(entry.ino)?.map(|lease| (entry.ino, lease)))
        }
        _ => Ok(None),
    }
}

/// [`Command::LeasedBatch`]: each op in order, with its own outcome.
pub(crate) fn apply_batch(
    tx: &mut Tx<'_>,
    holder: NodeId,
    ops: &[LeasedOp],
) -> Result<Outcome, NamespaceError> {
    let mut outcomes = Vec::with_capacity(ops.len());
    for op in ops {
        let outcome = match apply_op(tx, holder, op) {
            Ok(outcome) => outcome,
            Err(NamespaceError::Fs(e)) => Outcome::Failed(e.into()),
            Err(e) => return Err(e),
        };
        if !outcome.applied() {
            // The holder answered this op as done: its view of the directories the op
            // names was wrong, and its later ops there would apply with another meaning
            // (an unlink of a name a refused rename was to replace). Its leases on them
            // end; those ops are refused as lost.
            let mut named = vec![(op.dir, op.epoch)];
            if let LeasedChange::Rename {
                new_dir, new_epoch, ..
            } = op.change
            {
                named.push((new_dir, new_epoch));
            }
            for (dir, epoch) in named {
                if holds(tx, dir, holder, epoch)? {
                    tx.remove_dir_lease(dir)?;
                }
            }
        }
        outcomes.push(outcome);
    }
    Ok(Outcome::Batch(outcomes))
}

fn holds(tx: &mut Tx<'_>, dir: Ino, holder: NodeId, epoch: u64) -> Result<bool, NamespaceError> {
    Ok(tx.dir_lease(dir)? == Some(DirLease { holder, epoch }))
}

/// Whether the directory entry `name` of `dir` may be removed by `holder`: not a leased
/// directory, or one leased to `holder` (`Ok(Some(ino))`: its lease ends with it).
/// `Err(refusal)`: leased to another node.
fn removable(
    tx: &mut Tx<'_>,
    dir: Ino,
    name: &str,
    holder: NodeId,
) -> Result<Result<Option<Ino>, Outcome>, NamespaceError> {
    Ok(match subdir_lease(tx, dir, name)? {
        None => Ok(None),
        Some((ino, lease)) if lease.holder == holder => Ok(Some(ino)),
        Some((ino, lease)) => Err(Outcome::Leased {
            dir: ino,
            holder: lease.holder,
        }),
    })
}

fn apply_op(tx: &mut Tx<'_>, holder: NodeId, op: &LeasedOp) -> Result<Outcome, NamespaceError> {
    let LeasedOp {
        dir,
        epoch,
        now,
        change,
    } = op;
    let (dir, now) = (*dir, *now);
    if !holds(tx, dir, holder, *epoch)? {
        return Ok(Outcome::LeaseLost);
    }
    match change {
        LeasedChange::MkNode {
            ino,
            name,
            kind,
            perm,
            owner,
            rdev,
            target,
        } => {
            let mut ranges = tx.ino_ranges(holder)?;
            if !ranges.allows(*ino) || tx.inode(*ino)?.is_some() {
                return Err(FsError::Invalid.into());
            }
            let outcome = namespace::mknode(
                tx,
                now,
                dir,
                name,
                *kind,
                *perm,
                *owner,
                *rdev,
                target.as_deref(),
                Some(*ino),
            )?;
            ranges.used(*ino);
            tx.put_ino_ranges(holder, &ranges)?;
            // A directory made under a lease is leased to its maker at the same epoch (the
            // pair is new: inode numbers are never reused), so the holder goes on in it
            // without a grant of its own.
            if *kind == FileKind::Dir {
                tx.put_dir_lease(
                    *ino,
                    DirLease {
                        holder,
                        epoch: *epoch,
                    },
                )?;
            }
            Ok(outcome)
        }
        LeasedChange::Link { ino, name } => namespace::link(tx, now, *ino, dir, name),
        LeasedChange::Unlink { name } => namespace::unlink(tx, now, dir, name),
        LeasedChange::Rmdir { name } => {
            let child = match removable(tx, dir, name, holder)? {
                Ok(child) => child,
                Err(refusal) => return Ok(refusal),
            };
            let outcome = namespace::rmdir(tx, now, dir, name)?;
            if let Some(child) = child {
                tx.remove_dir_lease(child)?;
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
            if !holds(tx, *new_dir, holder, *new_epoch)? {
                return Ok(Outcome::LeaseLost);
            }
            let src = tx.dirent(dir, name)?.map(|e| e.ino);
            let over = if flags.exchange {
                None
            } else {
                match removable(tx, *new_dir, new_name, holder)? {
                    // A directory renamed onto itself stays, with its lease.
                    Ok(child) => child.filter(|c| Some(*c) != src),
                    Err(refusal) => return Ok(refusal),
                }
            };
            let outcome = namespace::rename(
                tx,
                now,
                &RenameArgs {
                    parent: dir,
                    name,
                    new_parent: *new_dir,
                    new_name,
                    flags: *flags,
                },
            )?;
            if let Some(child) = over {
                tx.remove_dir_lease(child)?;
            }
            Ok(outcome)
        }
        LeasedChange::SetAttr { ino, set } => {
            // Another directory's own attributes are its lease's, at its epoch.
            if *ino != dir && tx.inode(*ino)?.is_some_and(|rec| rec.is_dir()) {
                return Err(FsError::Invalid.into());
            }
            namespace::setattr(tx, now, *ino, set)
        }
        LeasedChange::WriteInline {
            ino,
            offset,
            data,
            max_inline,
        } => data::write_inline(tx, now, *ino, *offset, data, *max_inline),
        LeasedChange::WriteExtents {
            ino,
            inline_version,
            extents,
            commit_by_ms,
        } => {
            if tx.now_ms() > *commit_by_ms
                && let Some(first) = extents.first()
            {
                return Ok(Outcome::StripeAbandoned(first.stripe.id));
            }
            data::write_extents(tx, now, *ino, *inline_version, extents)
        }
    }
}

#[cfg(test)]
mod tests {
    use shoal_agent_api::ROOT_INO;
    use shoal_placement::NodeId;

    use crate::command::{Command, LeasedChange, LeasedOp};
    use crate::format::{FileKind, FsError, Ino, Owner, RenameFlags, SetAttr};
    use crate::testkit::{Kit, at, extent, mknode_cmd};
    use crate::{DirLease, Outcome};

    const A: NodeId = NodeId(1);
    const B: NodeId = NodeId(2);

    fn take(kit: &mut Kit, dir: Ino, holder: NodeId) -> u64 {
        match kit.run(Command::TakeDirLease { dir, holder }) {
            Outcome::DirLease { epoch } => epoch,
            other => panic!("lease not granted: {other:?}"),
        }
    }

    fn inos(kit: &mut Kit, count: u64) -> (Ino, Ino) {
        match kit.run(Command::TakeInos { holder: A, count }) {
            Outcome::Inos { start, end } => (start, end),
            other => panic!("no inode numbers: {other:?}"),
        }
    }

    fn op(dir: Ino, epoch: u64, change: LeasedChange) -> LeasedOp {
        LeasedOp {
            dir,
            epoch,
            now: at(50),
            change,
        }
    }

    fn create(ino: Ino, name: &str, kind: FileKind) -> LeasedChange {
        LeasedChange::MkNode {
            ino,
            name: name.into(),
            kind,
            perm: 0o640,
            owner: Owner { uid: 7, gid: 8 },
            rdev: 0,
            target: None,
        }
    }

    fn batch(kit: &mut Kit, holder: NodeId, ops: Vec<LeasedOp>) -> Vec<Outcome> {
        match kit.run(Command::LeasedBatch { holder, ops }) {
            Outcome::Batch(outcomes) => outcomes,
            other => panic!("not a batch outcome: {other:?}"),
        }
    }

    #[test]
    fn a_holders_extent_write_applies_under_its_lease_and_only_there() {
        let mut kit = Kit::new();
        let dir = kit.mkdir(ROOT_INO, "d");
        let epoch = take(&mut kit, dir, A);
        let (ino, _) = inos(&mut kit, 4);
        let write = |offset, len, id| LeasedChange::WriteExtents {
            ino,
            inline_version: None,
            extents: vec![extent(offset, len, id)],
            commit_by_ms: 60_000,
        };
        let out = batch(
            &mut kit,
            A,
            vec![
                op(dir, epoch, create(ino, "f", FileKind::File)),
                op(dir, epoch, write(0, 100_000, 40)),
                op(dir, epoch, write(100_000, 50_000, 41)),
            ],
        );
        assert!(
            matches!(&out[1], Outcome::Attr(a) if a.size == 100_000),
            "{out:?}"
        );
        assert!(
            matches!(&out[2], Outcome::Attr(a) if a.size == 150_000),
            "{out:?}"
        );
        let data = kit.store.file_data(ino).expect("file");
        assert_eq!(data.extents.len(), 2);
        assert_eq!(data.attr.mtime, at(50), "the holder's time, as it answered");
        // A stripe a node gave up for an orphan (the batch came too late): refused, and
        // the lease ends with it (the holder's later ops are lost, never applied).
        let abandoned = shoal_placement::StripeId(42);
        kit.run(Command::AbandonStripes {
            ids: vec![abandoned],
        });
        let out = batch(
            &mut kit,
            A,
            vec![
                op(dir, epoch, write(0, 10, 42)),
                op(dir, epoch, write(0, 10, 43)),
            ],
        );
        assert_eq!(
            out,
            [Outcome::StripeAbandoned(abandoned), Outcome::LeaseLost]
        );
        assert_eq!(kit.store.file_data(ino).expect("file").attr.size, 150_000);
    }

    #[test]
    fn a_holders_extent_write_committed_past_its_time_is_refused() {
        let mut kit = Kit::stamped();
        let dir = kit.mkdir(ROOT_INO, "d");
        let epoch = take(&mut kit, dir, A);
        let (ino, _) = inos(&mut kit, 4);
        let now = kit.store.clock_ms().expect("clock");
        let write = |commit_by_ms| LeasedChange::WriteExtents {
            ino,
            inline_version: None,
            extents: vec![extent(0, 10, 50)],
            commit_by_ms,
        };
        let out = batch(
            &mut kit,
            A,
            vec![
                op(dir, epoch, create(ino, "f", FileKind::File)),
                op(dir, epoch, write(now + 60_000)),
            ],
        );
        assert!(
            matches!(&out[1], Outcome::Attr(a) if a.size == 10),
            "{out:?}"
        );
        // The cluster clock moves a second per apply here: a batch that comes too late
        // is refused, and the lease ends with it.
        let out = batch(&mut kit, A, vec![op(dir, epoch, write(now))]);
        assert_eq!(
            out,
            [Outcome::StripeAbandoned(shoal_placement::StripeId(50))]
        );
        assert_eq!(kit.store.dir_lease(dir).expect("lease"), None);
    }

    #[test]
    fn a_holder_creates_with_its_own_numbers_at_its_own_times_in_order() {
        let mut kit = Kit::new();
        let dir = kit.mkdir(ROOT_INO, "d");
        let epoch = take(&mut kit, dir, A);
        let (start, end) = inos(&mut kit, 4);
        assert_eq!(end - start, 4);
        let out = batch(
            &mut kit,
            A,
            vec![
                op(dir, epoch, create(start, "f", FileKind::File)),
                op(
                    dir,
                    epoch,
                    LeasedChange::WriteInline {
                        ino: start,
                        offset: 0,
                        data: b"hello".to_vec(),
                        max_inline: 4096,
                    },
                ),
                op(dir, epoch, create(start + 1, "sub", FileKind::Dir)),
                op(
                    dir,
                    epoch,
                    LeasedChange::Rename {
                        name: "f".into(),
                        new_dir: dir,
                        new_epoch: epoch,
                        new_name: "g".into(),
                        flags: RenameFlags::default(),
                    },
                ),
            ],
        );
        assert_eq!(out.len(), 4);
        let Outcome::Attr(f) = &out[0] else {
            panic!("{out:?}")
        };
        assert_eq!((f.ino, f.perm, f.uid, f.mtime), (start, 0o640, 7, at(50)));
        assert!(matches!(&out[1], Outcome::Attr(a) if a.size == 5));
        assert!(matches!(&out[2], Outcome::Attr(a) if a.ino == start + 1));
        assert_eq!(out[3], Outcome::Done);
        assert_eq!(kit.names(dir), ["g", "sub"]);
        assert_eq!(kit.store.lookup(dir, "g").expect("g").ino, start);
        assert_eq!(kit.nlink(dir), 3);
        // An op refused as a plain command would be (the same name twice) ends the lease:
        // the holder's view was wrong, and its later ops in the directory are lost.
        let out = batch(
            &mut kit,
            A,
            vec![
                op(dir, epoch, create(start + 2, "sub", FileKind::File)),
                op(dir, epoch, create(start + 3, "later", FileKind::File)),
            ],
        );
        assert_eq!(out, [Outcome::Failed(FsError::Exists), Outcome::LeaseLost]);
        assert_eq!(kit.store.dir_lease(dir).expect("lease"), None);
        // A number not the holder's, passed already, or below one it created with, is
        // refused (each ends the lease again).
        let (other, _) = match kit.run(Command::TakeInos {
            holder: B,
            count: 1,
        }) {
            Outcome::Inos { start, end } => (start, end),
            o => panic!("{o:?}"),
        };
        for ino in [end + 100, start, start + 1, other] {
            let epoch = take(&mut kit, dir, A);
            let out = batch(
                &mut kit,
                A,
                vec![op(dir, epoch, create(ino, "x", FileKind::File))],
            );
            assert_eq!(out, [Outcome::Failed(FsError::Invalid)], "number {ino}");
        }
        // The next number up is fine: numbers go up, each used once.
        let epoch = take(&mut kit, dir, A);
        let out = batch(
            &mut kit,
            A,
            vec![op(dir, epoch, create(start + 3, "x", FileKind::File))],
        );
        assert!(
            matches!(&out[0], Outcome::Attr(a) if a.ino == start + 3),
            "{out:?}"
        );
        // Numbers handed out are never handed out again, by a range or a create.
        assert!(kit.mkfile(ROOT_INO, "after") >= end);
        let (again, _) = inos(&mut kit, 1);
        assert!(again > end);
        assert_eq!(
            kit.fail(Command::TakeInos {
                holder: A,
                count: 0
            }),
            FsError::Invalid
        );
    }

    #[test]
    fn no_other_command_changes_a_leased_directory() {
        let mut kit = Kit::new();
        let dir = kit.mkdir(ROOT_INO, "d");
        let file = kit.mkfile(dir, "f");
        let other = kit.mkdir(ROOT_INO, "o");
        let sub = kit.mkdir(other, "sub");
        take(&mut kit, dir, A);
        take(&mut kit, sub, A);
        let leased = |dir| Outcome::Leased { dir, holder: A };
        for command in [
            mknode_cmd(dir, "new", FileKind::File),
            Command::Unlink {
                parent: dir,
                name: "f".into(),
            },
            Command::Link {
                ino: kit.mkfile(ROOT_INO, "l"),
                new_parent: dir,
                new_name: "l".into(),
            },
            Command::Rename {
                parent: dir,
                name: "f".into(),
                new_parent: ROOT_INO,
                new_name: "f".into(),
                flags: RenameFlags::default(),
            },
            Command::Rename {
                parent: ROOT_INO,
                name: "l".into(),
                new_parent: dir,
                new_name: "l".into(),
                flags: RenameFlags::default(),
            },
            Command::SetAttr {
                ino: dir,
                set: SetAttr {
                    perm: Some(0o700),
                    ..SetAttr::default()
                },
            },
        ] {
            assert_eq!(kit.run(command.clone()), leased(dir), "{command:?}");
        }
        // A leased directory is not removed or replaced by another command.
        let rmdir = Command::Rmdir {
            parent: other,
            name: "sub".into(),
        };
        assert_eq!(kit.run(rmdir), leased(sub));
        kit.mkdir(ROOT_INO, "empty");
        assert_eq!(
            kit.rename(ROOT_INO, "empty", other, "sub", RenameFlags::default()),
            leased(sub)
        );
        assert_eq!(kit.names(dir), ["f"]);
        // The files' own attributes and data are not the lease's, nor are other
        // directories.
        assert!(matches!(
            kit.run(Command::SetAttr {
                ino: file,
                set: SetAttr {
                    perm: Some(0o600),
                    ..SetAttr::default()
                },
            }),
            Outcome::Attr(_)
        ));
        assert_eq!(
            kit.rename(ROOT_INO, "empty", other, "moved", RenameFlags::default()),
            Outcome::Done
        );
        // Moving the leased directory itself does not touch its entries.
        assert_eq!(
            kit.rename(ROOT_INO, "d", other, "d", RenameFlags::default()),
            Outcome::Done
        );
    }

    #[test]
    fn a_request_refused_by_a_lease_is_applied_when_asked_again_after_the_recall() {
        use crate::format::RequestId;
        let mut kit = Kit::new();
        let dir = kit.mkdir(ROOT_INO, "d");
        let epoch = take(&mut kit, dir, A);
        let id = Some(RequestId { client: 3, seq: 1 });
        let mkdir = mknode_cmd(dir, "x", FileKind::Dir);
        assert_eq!(
            kit.run_with(id, mkdir.clone()),
            Outcome::Leased { dir, holder: A }
        );
        assert_eq!(
            kit.run(Command::ReturnDirLease { dir, epoch }),
            Outcome::Done
        );
        let again = kit.run_with(id, mkdir.clone());
        assert!(matches!(again, Outcome::Attr(_)), "{again:?}");
        // And that outcome is the one kept for the request.
        assert_eq!(kit.run_with(id, mkdir), again);
    }

    #[test]
    fn ops_of_an_ended_or_earlier_grant_are_refused() {
        let mut kit = Kit::new();
        let dir = kit.mkdir(ROOT_INO, "d");
        let (start, _) = inos(&mut kit, 8);
        let first = take(&mut kit, dir, A);
        // Another node cannot take it; the holder taking it again gets a new epoch.
        assert_eq!(
            kit.run(Command::TakeDirLease { dir, holder: B }),
            Outcome::Leased { dir, holder: A }
        );
        let second = take(&mut kit, dir, A);
        assert_ne!(first, second);
        let late = batch(
            &mut kit,
            A,
            vec![op(dir, first, create(start, "late", FileKind::File))],
        );
        assert_eq!(late, [Outcome::LeaseLost]);
        // Broken by another node (a stale epoch breaks nothing).
        assert_eq!(
            kit.run(Command::ReturnDirLease { dir, epoch: first }),
            Outcome::Conflict
        );
        assert_eq!(
            kit.run(Command::ReturnDirLease { dir, epoch: second }),
            Outcome::Done
        );
        assert_eq!(kit.store.dir_lease(dir).expect("lease"), None);
        let cut_off = batch(
            &mut kit,
            A,
            vec![
                op(dir, second, create(start + 1, "cut", FileKind::File)),
                op(dir, second, LeasedChange::Unlink { name: "x".into() }),
            ],
        );
        assert_eq!(cut_off, [Outcome::LeaseLost, Outcome::LeaseLost]);
        // The other node works in it; then takes the lease, and the old holder's ops of
        // the same epoch number as before still apply nowhere.
        kit.mkfile(dir, "theirs");
        let third = take(&mut kit, dir, B);
        assert_eq!(
            kit.store.dir_lease(dir).expect("lease"),
            Some(DirLease {
                holder: B,
                epoch: third
            })
        );
        let stale = batch(
            &mut kit,
            A,
            vec![op(
                dir,
                second,
                LeasedChange::Unlink {
                    name: "theirs".into(),
                },
            )],
        );
        assert_eq!(stale, [Outcome::LeaseLost]);
        assert_eq!(kit.names(dir), ["theirs"]);
        // Not a directory, or none.
        assert_eq!(
            kit.fail(Command::TakeDirLease {
                dir: kit.store.lookup(dir, "theirs").expect("file").ino,
                holder: A,
            }),
            FsError::NotDir
        );
        assert_eq!(
            kit.fail(Command::TakeDirLease {
                dir: 999_999,
                holder: A,
            }),
            FsError::NotFound
        );
    }

    #[test]
    fn a_leased_subdirectory_goes_only_with_its_own_holders_lease() {
        let mut kit = Kit::new();
        let dir = kit.mkdir(ROOT_INO, "d");
        let mine = kit.mkdir(dir, "mine");
        let theirs = kit.mkdir(dir, "theirs");
        let over = kit.mkdir(dir, "over");
        take(&mut kit, mine, A);
        take(&mut kit, theirs, B);
        let refused_by_theirs = Outcome::Leased {
            dir: theirs,
            holder: B,
        };
        let set = SetAttr {
            perm: Some(0o700),
            ..SetAttr::default()
        };
        // Each refusal ends the holder's lease on the directory: take it again each time.
        for (change, refused) in [
            (
                LeasedChange::Rmdir {
                    name: "theirs".into(),
                },
                refused_by_theirs.clone(),
            ),
            // A subdirectory's own attributes go under its own lease, at its epoch.
            (
                LeasedChange::SetAttr {
                    ino: theirs,
                    set: set.clone(),
                },
                Outcome::Failed(FsError::Invalid),
            ),
            (
                LeasedChange::SetAttr {
                    ino: mine,
                    set: set.clone(),
                },
                Outcome::Failed(FsError::Invalid),
            ),
        ] {
            let epoch = take(&mut kit, dir, A);
            assert_eq!(batch(&mut kit, A, vec![op(dir, epoch, change)]), [refused]);
            assert_eq!(kit.store.dir_lease(dir).expect("lease"), None);
        }
        let mine_epoch = kit
            .store
            .dir_lease(mine)
            .expect("lease")
            .expect("held")
            .epoch;
        let chmod = op(mine, mine_epoch, LeasedChange::SetAttr { ino: mine, set });
        assert!(matches!(&batch(&mut kit, A, vec![chmod])[0], Outcome::Attr(a) if a.perm == 0o700));
        let epoch = take(&mut kit, dir, A);
        let out = batch(
            &mut kit,
            A,
            vec![op(
                dir,
                epoch,
                LeasedChange::Rmdir {
                    name: "mine".into(),
                },
            )],
        );
        assert_eq!(out, [Outcome::Done]);
        assert_eq!(kit.names(dir), ["over", "theirs"]);
        assert_eq!(kit.store.dir_lease(mine).expect("lease"), None);
        // A directory renamed over goes with its lease (same holder), not another's.
        let (start, _) = inos(&mut kit, 1);
        let made = batch(
            &mut kit,
            A,
            vec![op(dir, epoch, create(start, "empty", FileKind::Dir))],
        );
        assert!(matches!(made[0], Outcome::Attr(_)), "{made:?}");
        take(&mut kit, over, A);
        let rename = |epoch, to: &str| {
            op(
                dir,
                epoch,
                LeasedChange::Rename {
                    name: "empty".into(),
                    new_dir: dir,
                    new_epoch: epoch,
                    new_name: to.into(),
                    flags: RenameFlags::default(),
                },
            )
        };
        let out = batch(
            &mut kit,
            A,
            vec![rename(epoch, "theirs"), rename(epoch, "over")],
        );
        assert_eq!(out, [refused_by_theirs, Outcome::LeaseLost]);
        let epoch = take(&mut kit, dir, A);
        assert_eq!(
            batch(&mut kit, A, vec![rename(epoch, "over")]),
            [Outcome::Done]
        );
        assert_eq!(kit.store.dir_lease(over).expect("lease"), None);
        assert_eq!(kit.store.lookup(dir, "over").expect("over").ino, start);
        // Into another directory only under its lease too.
        let other = kit.mkdir(ROOT_INO, "other");
        let moved = |new_epoch| {
            op(
                dir,
                epoch,
                LeasedChange::Rename {
                    name: "over".into(),
                    new_dir: other,
                    new_epoch,
                    new_name: "x".into(),
                    flags: RenameFlags::default(),
                },
            )
        };
        assert_eq!(batch(&mut kit, A, vec![moved(epoch)]), [Outcome::LeaseLost]);
        let epoch = take(&mut kit, dir, A);
        let other_epoch = take(&mut kit, other, A);
        let mut move_it = moved(other_epoch);
        move_it.epoch = epoch;
        assert_eq!(batch(&mut kit, A, vec![move_it]), [Outcome::Done]);
        assert_eq!(kit.names(other), ["x"]);
    }

    #[test]
    fn leases_survive_a_restart_and_a_snapshot_and_a_state_without_any_stays_version_7() {
        let mut kit = Kit::new();
        let dir = kit.mkdir(ROOT_INO, "d");
        let plain = kit.store.snapshot().expect("snapshot");
        assert_eq!(plain[4], 7, "no lease ever: the format before leases");
        let epoch = take(&mut kit, dir, A);
        let mut kit = kit.restart();
        assert_eq!(
            kit.store.dir_lease(dir).expect("lease"),
            Some(DirLease { holder: A, epoch })
        );
        let snap = kit.store.snapshot().expect("snapshot");
        assert_eq!(snap[4], 8);
        let copy = Kit::new();
        copy.store.install(&snap).expect("install");
        assert_eq!(
            copy.store.dir_lease(dir).expect("lease"),
            Some(DirLease { holder: A, epoch })
        );
        assert_eq!(
            copy.store.digest().expect("digest").1,
            kit.store.digest().expect("digest").1
        );
        // The epoch counter goes on from the snapshot's: a returned lease's epoch is
        // never granted again.
        assert_eq!(
            kit.run(Command::ReturnDirLease { dir, epoch }),
            Outcome::Done
        );
        let snap = kit.store.snapshot().expect("snapshot");
        assert_eq!(snap[4], 8, "the counter is kept once a lease was granted");
        let mut copy = copy;
        copy.store.install(&snap).expect("install");
        assert!(take(&mut copy, dir, B) > epoch);
    }
}
