//! Directory leases, the state machine's part: which node holds the lease on a directory
//! and at which epoch, the fence that keeps every other change out of a leased directory,
//! inode numbers handed out ahead for the holder's creates, and the holder's batches.
//!
//! A node that holds a directory's lease answers the changes in it at once and commits
//! them later, in the order it answered them ([`Command::LeasedBatch`]). For that to be
//! safe the state machine guarantees two things:
//! - while a directory is leased, no other command changes its entries or its own
//!   attributes: such a command is refused with [`Outcome::Leased`] and its proposer must
//!   recall the lease (the holder commits what it answered and returns it) or, when the
//!   holder does not answer, break it with [`Command::ReturnDirLease`];
//! - an op applies only under the very grant it was answered under: every grant has an
//!   epoch no other grant had (a counter in the state), and an op whose epoch is not its
//!   directory's lease now is refused with [`Outcome::LeaseLost`]. So a holder cut off
//!   from the group, whose lease was broken, never changes the directory after another
//!   node acted on it, however late its batch arrives.
//!
//! The holder's view of a directory is its replica's plus what it answered since: exact,
//! because nothing else changes the entries. Attributes of the files are not fenced (a
//! setattr by inode number from another node applies in log order, as two setattrs do).

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
pub(crate) fn take_inos(tx: &mut Tx<'_>, count: u64) -> Result<Outcome, NamespaceError> {
    if count == 0 || count > MAX_INO_RANGE {
        return Err(FsError::Invalid.into());
    }
    let (start, end) = tx.allocate_inos(count);
    Ok(Outcome::Inos { start, end })
}

/// The leased directory that keeps `command` out, and its holder, if any: a change of a
/// leased directory's entries or attributes, or the removal of a leased directory (its
/// holder may have answered creates in it that are not committed yet).
pub(crate) fn fenced_by(
    tx: &mut Tx<'_>,
    command: &Command,
) -> Result<Option<(Ino, NodeId)>, NamespaceError> {
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
            if !tx.ino_allocated(*ino) || tx.inode(*ino)?.is_some() {
                return Err(FsError::Invalid.into());
            }
            namespace::mknode(
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
            )
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
            // A subdirectory's own attributes are its lease's, if it has one.
            if let Some(lease) = tx.dir_lease(*ino)?
                && lease.holder != holder
            {
                return Ok(Outcome::Leased {
                    dir: *ino,
                    holder: lease.holder,
                });
            }
            namespace::setattr(tx, now, *ino, set)
        }
        LeasedChange::WriteInline {
            ino,
            offset,
            data,
            max_inline,
        } => data::write_inline(tx, now, *ino, *offset, data, *max_inline),
    }
}

#[cfg(test)]
mod tests {
    use shoal_agent_api::ROOT_INO;
    use shoal_placement::NodeId;

    use crate::command::{Command, LeasedChange, LeasedOp};
    use crate::format::{FileKind, FsError, Ino, Owner, RenameFlags, SetAttr};
    use crate::testkit::{Kit, at, mknode_cmd};
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
        match kit.run(Command::TakeInos { count }) {
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
                // The same name twice: the second is refused as a create would be.
                op(dir, epoch, create(start + 2, "sub", FileKind::File)),
            ],
        );
        assert_eq!(out.len(), 5);
        let Outcome::Attr(f) = &out[0] else {
            panic!("{out:?}")
        };
        assert_eq!((f.ino, f.perm, f.uid, f.mtime), (start, 0o640, 7, at(50)));
        assert!(matches!(&out[1], Outcome::Attr(a) if a.size == 5));
        assert!(matches!(&out[2], Outcome::Attr(a) if a.ino == start + 1));
        assert_eq!(out[3], Outcome::Done);
        assert_eq!(out[4], Outcome::Failed(FsError::Exists));
        assert_eq!(kit.names(dir), ["g", "sub"]);
        assert_eq!(kit.store.lookup(dir, "g").expect("g").ino, start);
        assert_eq!(kit.nlink(dir), 3);
        // A number not handed out, or one used already, is refused.
        let out = batch(
            &mut kit,
            A,
            vec![
                op(dir, epoch, create(end + 100, "x", FileKind::File)),
                op(dir, epoch, create(start, "y", FileKind::File)),
            ],
        );
        assert_eq!(
            out,
            [
                Outcome::Failed(FsError::Invalid),
                Outcome::Failed(FsError::Invalid)
            ]
        );
        // Numbers handed out are never handed out again, by a range or a create.
        assert!(kit.mkfile(ROOT_INO, "after") >= end);
        let (again, _) = inos(&mut kit, 1);
        assert!(again > end);
        assert_eq!(kit.fail(Command::TakeInos { count: 0 }), FsError::Invalid);
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
        let epoch = take(&mut kit, dir, A);
        take(&mut kit, mine, A);
        take(&mut kit, theirs, B);
        let out = batch(
            &mut kit,
            A,
            vec![
                op(
                    dir,
                    epoch,
                    LeasedChange::Rmdir {
                        name: "theirs".into(),
                    },
                ),
                op(
                    dir,
                    epoch,
                    LeasedChange::SetAttr {
                        ino: theirs,
                        set: SetAttr {
                            perm: Some(0o700),
                            ..SetAttr::default()
                        },
                    },
                ),
                op(
                    dir,
                    epoch,
                    LeasedChange::Rmdir {
                        name: "mine".into(),
                    },
                ),
            ],
        );
        assert_eq!(
            out,
            [
                Outcome::Leased {
                    dir: theirs,
                    holder: B
                },
                Outcome::Leased {
                    dir: theirs,
                    holder: B
                },
                Outcome::Done
            ]
        );
        assert_eq!(kit.names(dir), ["over", "theirs"]);
        assert_eq!(kit.store.dir_lease(mine).expect("lease"), None);
        // A directory renamed over goes with its lease (same holder), not another's.
        let empty = {
            let (start, _) = inos(&mut kit, 1);
            let made = batch(
                &mut kit,
                A,
                vec![op(dir, epoch, create(start, "empty", FileKind::Dir))],
            );
            assert!(matches!(made[0], Outcome::Attr(_)), "{made:?}");
            start
        };
        take(&mut kit, over, A);
        let rename = |to: &str| {
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
        let out = batch(&mut kit, A, vec![rename("theirs"), rename("over")]);
        let refused = Outcome::Leased {
            dir: theirs,
            holder: B,
        };
        assert_eq!(out, [refused, Outcome::Done]);
        assert_eq!(kit.store.dir_lease(over).expect("lease"), None);
        assert_eq!(kit.store.lookup(dir, "over").expect("over").ino, empty);
        // Into another directory only under its lease too.
        let other = kit.mkdir(ROOT_INO, "other");
        let moved = op(
            dir,
            epoch,
            LeasedChange::Rename {
                name: "over".into(),
                new_dir: other,
                new_epoch: epoch,
                new_name: "x".into(),
                flags: RenameFlags::default(),
            },
        );
        assert_eq!(
            batch(&mut kit, A, vec![moved.clone()]),
            [Outcome::LeaseLost]
        );
        let other_epoch = take(&mut kit, other, A);
        let mut moved = moved;
        if let LeasedChange::Rename { new_epoch, .. } = &mut moved.change {
            *new_epoch = other_epoch;
        }
        assert_eq!(batch(&mut kit, A, vec![moved]), [Outcome::Done]);
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
