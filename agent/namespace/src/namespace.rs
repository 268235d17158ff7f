//! Namespace commands: create, link, unlink, rmdir, rename and setattr, with the POSIX
//! answers Linux local filesystems give. Permission and sticky-bit checks are the
//! kernel's (the mount uses `default_permissions`); these only keep the tree consistent.
//!
//! Each handler checks first and writes after, so a refused command changes nothing.

use std::collections::BTreeMap;

use shoal_agent_api::{FsError, NAME_MAX, ROOT_INO};

use crate::format::{FileKind, Ino, Owner, RenameFlags, SetAttr, SetTime, Timestamp};

use crate::data;
use crate::record::{DirentRecord, InodeRecord};
use crate::tx::Tx;
use crate::{NamespaceError, Outcome};

/// Most names one inode may have (and most subdirectories + 2 of a directory).
pub(crate) const LINK_MAX: u32 = 65000;

/// Longest symlink target, in bytes (Linux `PATH_MAX` less the NUL).
pub(crate) const SYMLINK_MAX: usize = 4095;

const S_ISGID: u16 = 0o2000;

/// Refuses names no directory may hold.
pub(crate) fn check_name(name: &str) -> Result<(), FsError> {
    if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\0']) {
        return Err(FsError::Invalid);
    }
    if name.len() > NAME_MAX {
        return Err(FsError::NameTooLong);
    }
    Ok(())
}

/// An inode some name or number points at; missing means the state is damaged.
fn existing(tx: &mut Tx<'_>, ino: Ino) -> Result<InodeRecord, NamespaceError> {
    tx.inode(ino)?.ok_or_else(|| {
        NamespaceError::Corrupt(format!(
            "a directory entry names inode {ino}, which is gone"
        ))
    })
}

/// The directory `ino`: NotFound if it does not exist, NotDir if it is something else.
fn directory(tx: &mut Tx<'_>, ino: Ino) -> Result<InodeRecord, NamespaceError> {
    match tx.inode(ino)? {
        Some(rec) if rec.is_dir() => Ok(rec),
        Some(_) => Err(FsError::NotDir.into()),
        None => Err(FsError::NotFound.into()),
    }
}

fn touch_dir(rec: &mut InodeRecord, now: Timestamp) {
    rec.mtime = now;
    rec.ctime = now;
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn mknode(
    tx: &mut Tx<'_>,
    now: Timestamp,
    parent: Ino,
    name: &str,
    kind: FileKind,
    perm: u16,
    owner: Owner,
    rdev: u32,
    target: Option<&str>,
    ino: Option<Ino>,
) -> Result<Outcome, NamespaceError> {
    let mut dir = directory(tx, parent)?;
    check_name(name)?;
    if tx.dirent(parent, name)?.is_some() {
        return Err(FsError::Exists.into());
    }
    let target = match (kind, target) {
        (FileKind::Symlink, Some("")) => return Err(FsError::Invalid.into()),
        (FileKind::Symlink, Some(t)) if t.len() > SYMLINK_MAX => {
            return Err(FsError::NameTooLong.into());
        }
        (FileKind::Symlink, Some(t)) => t.to_owned(),
        (FileKind::Symlink, None) => return Err(FsError::Invalid.into()),
        _ => String::new(),
    };
    let is_dir = kind == FileKind::Dir;
    if is_dir && dir.nlink >= LINK_MAX {
        return Err(FsError::TooManyLinks.into());
    }

    let mut perm = perm & 0o7777;
    let mut gid = owner.gid;
    if dir.perm & S_ISGID != 0 {
        gid = dir.gid;
        if is_dir {
            perm |= S_ISGID;
        }
    }
    let rec = InodeRecord {
        kind,
        perm,
        nlink: if is_dir { 2 } else { 1 },
        uid: owner.uid,
        gid,
        size: target.len() as u64,
        atime: now,
        mtime: now,
        ctime: now,
        rdev: match kind {
            FileKind::CharDevice | FileKind::BlockDevice => rdev,
            _ => 0,
        },
        data_version: 0,
        parent: if is_dir { parent } else { 0 },
        target,
        inline: Vec::new(),
    };
    let ino = ino.unwrap_or_else(|| tx.allocate_ino());
    tx.put_dirent(parent, name, DirentRecord { ino, kind })?;
    let attr = rec.attr(ino);
    tx.put_inode(ino, rec);
    if is_dir {
        dir.nlink += 1;
    }
    touch_dir(&mut dir, now);
    tx.put_inode(parent, dir);
    Ok(Outcome::Attr(attr))
}

pub(crate) fn link(
    tx: &mut Tx<'_>,
    now: Timestamp,
    ino: Ino,
    new_parent: Ino,
    new_name: &str,
) -> Result<Outcome, NamespaceError> {
    let Some(mut node) = tx.inode(ino)? else {
        return Err(FsError::NotFound.into());
    };
    if node.is_dir() {
        return Err(FsError::NotPermitted.into());
    }
    // An inode whose last name went cannot get a name back.
    if node.nlink == 0 {
        return Err(FsError::NotFound.into());
    }
    let mut dir = directory(tx, new_parent)?;
    check_name(new_name)?;
    if tx.dirent(new_parent, new_name)?.is_some() {
        return Err(FsError::Exists.into());
    }
    if node.nlink >= LINK_MAX {
        return Err(FsError::TooManyLinks.into());
    }

    tx.put_dirent(
        new_parent,
        new_name,
        DirentRecord {
            ino,
            kind: node.kind,
        },
    )?;
    node.nlink += 1;
    node.ctime = now;
    let attr = node.attr(ino);
    tx.put_inode(ino, node);
    touch_dir(&mut dir, now);
    tx.put_inode(new_parent, dir);
    Ok(Outcome::Attr(attr))
}

/// Takes one name away from a non-directory; the last one makes it an orphan.
fn drop_name(tx: &mut Tx<'_>, now: Timestamp, ino: Ino) -> Result<(), NamespaceError> {
    let mut node = existing(tx, ino)?;
    node.nlink = node.nlink.saturating_sub(1);
    node.ctime = now;
    if node.nlink == 0 {
        tx.add_orphan(ino, now)?;
    }
    tx.put_inode(ino, node);
    Ok(())
}

pub(crate) fn unlink(
    tx: &mut Tx<'_>,
    now: Timestamp,
    parent: Ino,
    name: &str,
) -> Result<Outcome, NamespaceError> {
    let mut dir = directory(tx, parent)?;
    check_name(name)?;
    let Some(entry) = tx.dirent(parent, name)? else {
        return Err(FsError::NotFound.into());
    };
    if entry.kind == FileKind::Dir {
        return Err(FsError::IsDir.into());
    }

    tx.remove_dirent(parent, name)?;
    drop_name(tx, now, entry.ino)?;
    touch_dir(&mut dir, now);
    tx.put_inode(parent, dir);
    Ok(Outcome::Done)
}

pub(crate) fn rmdir(
    tx: &mut Tx<'_>,
    now: Timestamp,
    parent: Ino,
    name: &str,
) -> Result<Outcome, NamespaceError> {
    match name {
        "." => return Err(FsError::Invalid.into()),
        ".." => return Err(FsError::NotEmpty.into()),
        _ => {}
    }
    let mut dir = directory(tx, parent)?;
    check_name(name)?;
    let Some(entry) = tx.dirent(parent, name)? else {
        return Err(FsError::NotFound.into());
    };
    if entry.kind != FileKind::Dir {
        return Err(FsError::NotDir.into());
    }
    if tx.dir_has_entries(entry.ino)? {
        return Err(FsError::NotEmpty.into());
    }

    tx.remove_dirent(parent, name)?;
    tx.delete_inode(entry.ino);
    dir.nlink = dir.nlink.saturating_sub(1);
    touch_dir(&mut dir, now);
    tx.put_inode(parent, dir);
    Ok(Outcome::Done)
}

/// True when `dir` is `ancestor` or lies below it (walking recorded parents to the root).
fn is_within(tx: &mut Tx<'_>, dir: Ino, ancestor: Ino) -> Result<bool, NamespaceError> {
    let mut cur = dir;
    loop {
        if cur == ancestor {
            return Ok(true);
        }
        if cur == ROOT_INO {
            return Ok(false);
        }
        let rec = existing(tx, cur)?;
        if rec.parent == cur || rec.parent == 0 {
            return Err(NamespaceError::Corrupt(format!(
                "directory {cur} has no valid parent"
            )));
        }
        cur = rec.parent;
    }
}

/// What a rename does once it is known to be allowed.
struct RenamePlan {
    src: DirentRecord,
    dst: Option<DirentRecord>,
    /// Change of each parent's link count (subdirectories moving in and out).
    nlink_delta: BTreeMap<Ino, i64>,
}

pub(crate) struct RenameArgs<'a> {
    pub parent: Ino,
    pub name: &'a str,
    pub new_parent: Ino,
    pub new_name: &'a str,
    pub flags: RenameFlags,
}

pub(crate) fn rename(
    tx: &mut Tx<'_>,
    now: Timestamp,
    args: &RenameArgs<'_>,
) -> Result<Outcome, NamespaceError> {
    let Some(plan) = plan_rename(tx, args)? else {
        return Ok(Outcome::Done);
    };
    let RenameArgs {
        parent,
        name,
        new_parent,
        new_name,
        flags,
    } = *args;
    let src_is_dir = plan.src.kind == FileKind::Dir;

    if flags.exchange {
        let dst = plan
            .dst
            .ok_or_else(|| NamespaceError::Corrupt("exchange planned without a target".into()))?;
        tx.put_dirent(parent, name, dst)?;
        tx.put_dirent(new_parent, new_name, plan.src)?;
        let mut node = existing(tx, dst.ino)?;
        node.ctime = now;
        if dst.kind == FileKind::Dir {
            node.parent = parent;
        }
        tx.put_inode(dst.ino, node);
    } else {
        if let Some(dst) = plan.dst {
            if dst.kind == FileKind::Dir {
                tx.delete_inode(dst.ino);
            } else {
                drop_name(tx, now, dst.ino)?;
            }
        }
        tx.remove_dirent(parent, name)?;
        tx.put_dirent(new_parent, new_name, plan.src)?;
    }
    let mut node = existing(tx, plan.src.ino)?;
    node.ctime = now;
    if src_is_dir {
        node.parent = new_parent;
    }
    tx.put_inode(plan.src.ino, node);

    for dir_ino in [parent, new_parent] {
        let mut dir = existing(tx, dir_ino)?;
        if let Some(delta) = plan.nlink_delta.get(&dir_ino) {
            dir.nlink = dir.nlink.saturating_add_signed(*delta as i32);
        }
        touch_dir(&mut dir, now);
        tx.put_inode(dir_ino, dir);
        if parent == new_parent {
            break;
        }
    }
    Ok(Outcome::Done)
}

/// Checks a rename; `None` when it changes nothing (both names are the same inode).
fn plan_rename(
    tx: &mut Tx<'_>,
    args: &RenameArgs<'_>,
) -> Result<Option<RenamePlan>, NamespaceError> {
    let RenameArgs {
        parent,
        name,
        new_parent,
        new_name,
        flags,
    } = *args;
    if flags.exchange && flags.noreplace {
        return Err(FsError::Invalid.into());
    }
    directory(tx, parent)?;
    let new_dir = directory(tx, new_parent)?;
    check_name(name)?;
    check_name(new_name)?;
    let Some(src) = tx.dirent(parent, name)? else {
        return Err(FsError::NotFound.into());
    };
    let dst = tx.dirent(new_parent, new_name)?;
    if flags.exchange && dst.is_none() {
        return Err(FsError::NotFound.into());
    }
    if dst.is_some_and(|d| d.ino == src.ino) {
        return Ok(None);
    }
    if dst.is_some() && flags.noreplace {
        return Err(FsError::Exists.into());
    }
    let src_is_dir = src.kind == FileKind::Dir;
    let dst_is_dir = dst.is_some_and(|d| d.kind == FileKind::Dir);
    if src_is_dir && is_within(tx, new_parent, src.ino)? {
        return Err(FsError::Invalid.into());
    }
    if let Some(dst) = dst {
        if flags.exchange {
            if dst_is_dir && is_within(tx, parent, dst.ino)? {
                return Err(FsError::Invalid.into());
            }
        } else {
            match (src_is_dir, dst_is_dir) {
                (true, false) => return Err(FsError::NotDir.into()),
                (false, true) => return Err(FsError::IsDir.into()),
                (true, true) if tx.dir_has_entries(dst.ino)? => {
                    return Err(FsError::NotEmpty.into());
                }
                _ => {}
            }
        }
    }

    let mut nlink_delta: BTreeMap<Ino, i64> = BTreeMap::new();
    if parent != new_parent {
        if src_is_dir {
            *nlink_delta.entry(parent).or_default() -= 1;
            *nlink_delta.entry(new_parent).or_default() += 1;
        }
        if flags.exchange && dst_is_dir {
            *nlink_delta.entry(new_parent).or_default() -= 1;
            *nlink_delta.entry(parent).or_default() += 1;
        }
    }
    if !flags.exchange && dst_is_dir {
        // The replaced (empty) directory goes away.
        *nlink_delta.entry(new_parent).or_default() -= 1;
    }
    for (&dir_ino, &delta) in &nlink_delta {
        if delta > 0 {
            let nlink = if dir_ino == new_parent {
                new_dir.nlink
            } else {
                existing(tx, dir_ino)?.nlink
            };
            if i64::from(nlink) + delta > i64::from(LINK_MAX) {
                return Err(FsError::TooManyLinks.into());
            }
        }
    }
    Ok(Some(RenamePlan {
        src,
        dst,
        nlink_delta,
    }))
}

fn resolve(time: SetTime, now: Timestamp) -> Timestamp {
    match time {
        SetTime::Now => now,
        SetTime::At(t) => t,
    }
}

pub(crate) fn setattr(
    tx: &mut Tx<'_>,
    now: Timestamp,
    ino: Ino,
    set: &SetAttr,
) -> Result<Outcome, NamespaceError> {
    let Some(mut node) = tx.inode(ino)? else {
        return Err(FsError::NotFound.into());
    };
    if let Some(size) = set.size {
        match node.kind {
            FileKind::File => {}
            FileKind::Dir => return Err(FsError::IsDir.into()),
            _ => return Err(FsError::Invalid.into()),
        }
        if size > data::MAX_FILE_SIZE {
            return Err(FsError::TooBig.into());
        }
    }

    if let Some(size) = set.size {
        data::resize(tx, ino, &mut node, size)?;
        node.data_version += 1;
        node.mtime = now;
    }
    if let Some(perm) = set.perm {
        node.perm = perm & 0o7777;
    }
    if let Some(uid) = set.uid {
        node.uid = uid;
    }
    if let Some(gid) = set.gid {
        node.gid = gid;
    }
    if let Some(atime) = set.atime {
        node.atime = resolve(atime, now);
    }
    if let Some(mtime) = set.mtime {
        node.mtime = resolve(mtime, now);
    }
    node.ctime = now;
    let attr = node.attr(ino);
    tx.put_inode(ino, node);
    Ok(Outcome::Attr(attr))
}

#[cfg(test)]
mod tests {
    use crate::format::{FileKind, FsError, Owner, RenameFlags, SetAttr, SetTime};
    use shoal_agent_api::ROOT_INO;

    use super::LINK_MAX;
    use crate::testkit::{Kit, at, mknode_cmd};
    use crate::{Batch, Command, Outcome, Proposal};

    const PLAIN: RenameFlags = RenameFlags {
        noreplace: false,
        exchange: false,
    };

    #[test]
    fn root_answers_before_anything_is_applied() {
        let kit = Kit::new();
        let root = kit.store.getattr(ROOT_INO).expect("root");
        assert_eq!(
            (FileKind::from(root.kind), root.perm, root.nlink),
            (FileKind::Dir, 0o755, 2)
        );
        assert_eq!(root.mtime, at(0));
        assert!(kit.names(ROOT_INO).is_empty());
        assert!(matches!(
            kit.store.lookup(ROOT_INO, "x"),
            Err(crate::NamespaceError::Fs(
                shoal_agent_api::FsError::NotFound
            ))
        ));
        assert!(kit.store.getattr(2).is_err());
        assert_eq!(kit.store.parent_of(ROOT_INO).expect("parent"), ROOT_INO);
    }

    #[test]
    fn first_proposal_creates_root_with_its_time() {
        let mut kit = Kit::new();
        let ino = kit.mkfile(ROOT_INO, "a");
        assert_eq!(ino, 2, "inode numbers start at 2");
        let root = kit.store.getattr(ROOT_INO).expect("root");
        assert_eq!(root.ctime, at(kit.clock));
        assert_eq!(root.atime, at(kit.clock));
    }

    #[test]
    fn create_sets_times_and_counts_subdirectories() {
        let mut kit = Kit::new();
        let d = kit.mkdir(ROOT_INO, "d");
        let made = kit.clock;
        assert_eq!(kit.root_nlink(), 3);
        assert_eq!(kit.nlink(d), 2);
        kit.mkfile(d, "f");
        assert_eq!(kit.nlink(d), 2, "files do not count in a directory's links");
        let dir = kit.store.getattr(d).expect("d");
        assert_eq!(dir.atime, at(made));
        assert_eq!(dir.mtime, at(kit.clock));
        assert_eq!(kit.store.parent_of(d).expect("parent"), ROOT_INO);
    }

    #[test]
    fn bad_names_are_refused() {
        let mut kit = Kit::new();
        kit.mkfile(ROOT_INO, "taken");
        for (name, want) in [
            ("", FsError::Invalid),
            (".", FsError::Invalid),
            ("..", FsError::Invalid),
            ("a/b", FsError::Invalid),
            ("a\0b", FsError::Invalid),
            ("taken", FsError::Exists),
        ] {
            assert_eq!(
                kit.fail(mknode_cmd(ROOT_INO, name, FileKind::File)),
                want,
                "{name:?}"
            );
        }
        let long = "x".repeat(256);
        assert_eq!(
            kit.fail(mknode_cmd(ROOT_INO, &long, FileKind::File)),
            FsError::NameTooLong
        );
        kit.mkfile(ROOT_INO, &"x".repeat(255));
    }

    #[test]
    fn create_needs_an_existing_directory() {
        let mut kit = Kit::new();
        let f = kit.mkfile(ROOT_INO, "f");
        assert_eq!(
            kit.fail(mknode_cmd(f, "x", FileKind::File)),
            FsError::NotDir
        );
        assert_eq!(
            kit.fail(mknode_cmd(99, "x", FileKind::File)),
            FsError::NotFound
        );
    }

    #[test]
    fn symlink_requires_target_and_sizes_to_it() {
        let mut kit = Kit::new();
        let mut cmd = mknode_cmd(ROOT_INO, "l", FileKind::Symlink);
        if let Command::MkNode { target, .. } = &mut cmd {
            *target = None;
        }
        assert_eq!(kit.fail(cmd), FsError::Invalid);
        let l = kit.mknode(ROOT_INO, "l", FileKind::Symlink);
        assert_eq!(l.size, "target".len() as u64);
        assert_eq!(kit.store.readlink(l.ino).expect("readlink"), "target");
        let f = kit.mkfile(ROOT_INO, "f");
        assert!(kit.store.readlink(f).is_err());
    }

    #[test]
    fn setgid_dir_passes_group_and_bit() {
        let mut kit = Kit::new();
        let d = kit.mkdir(ROOT_INO, "d");
        let set = SetAttr {
            perm: Some(0o2775),
            gid: Some(500),
            ..SetAttr::default()
        };
        kit.ok_attr(Command::SetAttr { ino: d, set });
        let sub = kit.mknode(d, "sub", FileKind::Dir);
        assert_eq!(sub.gid, 500);
        assert_eq!(sub.perm, 0o2644);
        let file = kit.mknode(d, "file", FileKind::File);
        assert_eq!(file.gid, 500);
        assert_eq!(file.perm, 0o644, "files do not inherit the setgid bit");
        let plain = kit.mknode(ROOT_INO, "plain", FileKind::Dir);
        assert_eq!((plain.gid, plain.perm), (1000, 0o644));
    }

    #[test]
    fn link_counts_names_and_refuses_directories() {
        let mut kit = Kit::new();
        let f = kit.mkfile(ROOT_INO, "f");
        let d = kit.mkdir(ROOT_INO, "d");
        let linked = kit.ok_attr(Command::Link {
            ino: f,
            new_parent: d,
            new_name: "g".into(),
        });
        assert_eq!(linked.nlink, 2);
        assert_eq!(linked.ctime, at(kit.clock));
        assert_eq!(kit.store.lookup(d, "g").expect("g").ino, f);
        let again = Command::Link {
            ino: f,
            new_parent: d,
            new_name: "g".into(),
        };
        assert_eq!(kit.fail(again), FsError::Exists);
        let dir_link = Command::Link {
            ino: d,
            new_parent: ROOT_INO,
            new_name: "d2".into(),
        };
        assert_eq!(kit.fail(dir_link), FsError::NotPermitted);
    }

    #[test]
    fn link_limit_is_too_many_links() {
        let mut kit = Kit::new();
        let f = kit.mkfile(ROOT_INO, "f");
        let proposals = (1..LINK_MAX)
            .map(|i| Proposal {
                id: None,
                now: at(1),
                command: Command::Link {
                    ino: f,
                    new_parent: ROOT_INO,
                    new_name: format!("l{i}"),
                },
            })
            .collect();
        let out = kit
            .store
            .apply(&[Batch::new(proposals)], b"m")
            .expect("apply");
        assert!(out[0].iter().all(|o| matches!(o, Outcome::Attr(_))));
        assert_eq!(kit.nlink(f), LINK_MAX);
        let one_more = Command::Link {
            ino: f,
            new_parent: ROOT_INO,
            new_name: "over".into(),
        };
        assert_eq!(kit.fail(one_more), FsError::TooManyLinks);
    }

    #[test]
    fn unlink_of_last_name_orphans_until_purge() {
        let mut kit = Kit::new();
        let f = kit.mkfile(ROOT_INO, "f");
        kit.run(Command::Link {
            ino: f,
            new_parent: ROOT_INO,
            new_name: "g".into(),
        });
        let unlink = |name: &str| Command::Unlink {
            parent: ROOT_INO,
            name: name.into(),
        };
        assert_eq!(kit.run(unlink("f")), Outcome::Done);
        assert!(kit.store.orphans().expect("orphans").is_empty());
        assert_eq!(kit.run(unlink("g")), Outcome::Done);
        let gone = kit.clock;
        assert_eq!(
            kit.store.orphans().expect("orphans"),
            vec![(f, at(gone).into())]
        );
        let attr = kit.store.getattr(f).expect("still readable by number");
        assert_eq!((attr.nlink, attr.ctime), (0, at(gone).into()));
        assert!(kit.store.file_data(f).is_ok());
        assert_eq!(kit.fail(unlink("g")), FsError::NotFound);
        let relink = Command::Link {
            ino: f,
            new_parent: ROOT_INO,
            new_name: "back".into(),
        };
        assert_eq!(kit.fail(relink), FsError::NotFound);
        assert_eq!(kit.run(Command::Purge { ino: f }), Outcome::Done);
        assert!(kit.store.getattr(f).is_err());
        assert!(kit.store.orphans().expect("orphans").is_empty());
        assert_eq!(kit.fail(Command::Purge { ino: f }), FsError::NotFound);
    }

    #[test]
    fn unlink_of_directory_is_isdir() {
        let mut kit = Kit::new();
        kit.mkdir(ROOT_INO, "d");
        let cmd = Command::Unlink {
            parent: ROOT_INO,
            name: "d".into(),
        };
        assert_eq!(kit.fail(cmd), FsError::IsDir);
    }

    #[test]
    fn rmdir_refuses_files_non_empty_and_dot_names() {
        let mut kit = Kit::new();
        let d = kit.mkdir(ROOT_INO, "d");
        kit.mkfile(d, "f");
        kit.mkfile(ROOT_INO, "file");
        let rmdir = |name: &str| Command::Rmdir {
            parent: ROOT_INO,
            name: name.into(),
        };
        assert_eq!(kit.fail(rmdir("d")), FsError::NotEmpty);
        assert_eq!(kit.fail(rmdir("file")), FsError::NotDir);
        assert_eq!(kit.fail(rmdir("nope")), FsError::NotFound);
        assert_eq!(kit.fail(rmdir(".")), FsError::Invalid);
        assert_eq!(kit.fail(rmdir("..")), FsError::NotEmpty);
        kit.run(Command::Unlink {
            parent: d,
            name: "f".into(),
        });
        assert_eq!(kit.root_nlink(), 3);
        assert_eq!(kit.run(rmdir("d")), Outcome::Done);
        assert_eq!(kit.root_nlink(), 2);
        assert!(
            kit.store.getattr(d).is_err(),
            "removed directories go at once"
        );
        let orphans = kit.store.orphans().expect("orphans");
        assert!(
            orphans.iter().all(|(ino, _)| *ino != d),
            "directories never orphan"
        );
    }

    #[test]
    fn rename_dir_into_own_subtree_is_invalid() {
        let mut kit = Kit::new();
        let a = kit.mkdir(ROOT_INO, "a");
        let b = kit.mkdir(a, "b");
        let c = kit.mkdir(b, "c");
        assert_eq!(
            kit.rename(ROOT_INO, "a", c, "a", PLAIN),
            Outcome::Failed(FsError::Invalid)
        );
        assert_eq!(
            kit.rename(ROOT_INO, "a", a, "x", PLAIN),
            Outcome::Failed(FsError::Invalid)
        );
        assert_eq!(
            kit.rename(a, "b", b, "x", PLAIN),
            Outcome::Failed(FsError::Invalid)
        );
        assert_eq!(kit.rename(b, "c", ROOT_INO, "c", PLAIN), Outcome::Done);
        assert_eq!(kit.store.parent_of(c).expect("parent"), ROOT_INO);
    }

    #[test]
    fn rename_moves_directory_between_parents() {
        let mut kit = Kit::new();
        let a = kit.mkdir(ROOT_INO, "a");
        let b = kit.mkdir(ROOT_INO, "b");
        let x = kit.mkdir(a, "x");
        assert_eq!(kit.rename(a, "x", b, "y", PLAIN), Outcome::Done);
        let now = kit.clock;
        assert_eq!((kit.nlink(a), kit.nlink(b)), (2, 3));
        assert_eq!(kit.store.parent_of(x).expect("parent"), b);
        assert!(kit.names(a).is_empty());
        assert_eq!(kit.names(b), ["y"]);
        for ino in [a, b, x] {
            assert_eq!(kit.store.getattr(ino).expect("attr").ctime, at(now));
        }
        assert_eq!(kit.store.getattr(a).expect("a").mtime, at(now));
    }

    #[test]
    fn rename_over_existing_file_orphans_it() {
        let mut kit = Kit::new();
        let f = kit.mkfile(ROOT_INO, "f");
        let g = kit.mkfile(ROOT_INO, "g");
        assert_eq!(
            kit.rename(ROOT_INO, "f", ROOT_INO, "g", PLAIN),
            Outcome::Done
        );
        assert_eq!(kit.names(ROOT_INO), ["g"]);
        assert_eq!(kit.store.lookup(ROOT_INO, "g").expect("g").ino, f);
        assert_eq!(
            kit.store.orphans().expect("orphans"),
            vec![(g, at(kit.clock).into())]
        );
        assert_eq!(kit.nlink(g), 0);
    }

    #[test]
    fn rename_over_empty_dir_deletes_it() {
        let mut kit = Kit::new();
        let a = kit.mkdir(ROOT_INO, "a");
        let b = kit.mkdir(ROOT_INO, "b");
        let t = kit.mkdir(b, "t");
        assert_eq!(kit.rename(ROOT_INO, "a", b, "t", PLAIN), Outcome::Done);
        assert!(kit.store.getattr(t).is_err());
        assert_eq!(kit.store.lookup(b, "t").expect("t").ino, a);
        assert_eq!((kit.root_nlink(), kit.nlink(b)), (3, 3));
        // Within one directory the replaced directory's link goes too.
        kit.mkdir(b, "u");
        assert_eq!(kit.rename(b, "t", b, "u", PLAIN), Outcome::Done);
        assert_eq!(kit.nlink(b), 3);
    }

    #[test]
    fn rename_refuses_mismatched_kinds_and_non_empty_targets() {
        let mut kit = Kit::new();
        let d = kit.mkdir(ROOT_INO, "d");
        let full = kit.mkdir(ROOT_INO, "full");
        kit.mkfile(full, "x");
        kit.mkfile(ROOT_INO, "f");
        let fail = |e| Outcome::Failed(e);
        assert_eq!(
            kit.rename(ROOT_INO, "d", ROOT_INO, "f", PLAIN),
            fail(FsError::NotDir)
        );
        assert_eq!(
            kit.rename(ROOT_INO, "f", ROOT_INO, "d", PLAIN),
            fail(FsError::IsDir)
        );
        assert_eq!(
            kit.rename(ROOT_INO, "d", ROOT_INO, "full", PLAIN),
            fail(FsError::NotEmpty)
        );
        assert_eq!(
            kit.rename(ROOT_INO, "no", ROOT_INO, "x", PLAIN),
            fail(FsError::NotFound)
        );
        let f = kit.store.lookup(ROOT_INO, "f").expect("f").ino;
        assert_eq!(
            kit.rename(ROOT_INO, "d", f, "x", PLAIN),
            fail(FsError::NotDir)
        );
        let noreplace = RenameFlags {
            noreplace: true,
            exchange: false,
        };
        assert_eq!(
            kit.rename(ROOT_INO, "f", d, "new", noreplace),
            Outcome::Done
        );
        kit.mkfile(ROOT_INO, "f");
        assert_eq!(
            kit.rename(ROOT_INO, "f", d, "new", noreplace),
            fail(FsError::Exists)
        );
    }

    #[test]
    fn rename_between_names_of_one_inode_changes_nothing() {
        let mut kit = Kit::new();
        let f = kit.mkfile(ROOT_INO, "f");
        kit.run(Command::Link {
            ino: f,
            new_parent: ROOT_INO,
            new_name: "g".into(),
        });
        let before = kit.store.getattr(f).expect("f");
        assert_eq!(
            kit.rename(ROOT_INO, "f", ROOT_INO, "g", PLAIN),
            Outcome::Done
        );
        assert_eq!(kit.names(ROOT_INO), ["f", "g"]);
        assert_eq!(kit.store.getattr(f).expect("f"), before);
    }

    #[test]
    fn rename_exchange_swaps_and_fixes_parents() {
        let mut kit = Kit::new();
        let a = kit.mkdir(ROOT_INO, "a");
        let sub = kit.mkdir(a, "sub");
        let f = kit.mkfile(ROOT_INO, "f");
        let exchange = RenameFlags {
            noreplace: false,
            exchange: true,
        };
        assert_eq!(
            kit.rename(a, "sub", ROOT_INO, "missing", exchange),
            Outcome::Failed(FsError::NotFound)
        );
        assert_eq!(kit.rename(a, "sub", ROOT_INO, "f", exchange), Outcome::Done);
        assert_eq!(kit.store.lookup(ROOT_INO, "f").expect("f").ino, sub);
        assert_eq!(kit.store.lookup(a, "sub").expect("sub").ino, f);
        assert_eq!(kit.store.parent_of(sub).expect("parent"), ROOT_INO);
        assert_eq!((kit.root_nlink(), kit.nlink(a)), (4, 2));
        let entries = kit.store.readdir(a).expect("readdir");
        assert_eq!(entries[0].kind, FileKind::File);
        // A directory cannot be swapped with its own ancestor.
        assert_eq!(
            kit.rename(ROOT_INO, "a", a, "sub", exchange),
            Outcome::Failed(FsError::Invalid)
        );
    }

    #[test]
    fn setattr_changes_times_and_refuses_size_of_non_files() {
        let mut kit = Kit::new();
        let d = kit.mkdir(ROOT_INO, "d");
        let l = kit.mknode(ROOT_INO, "l", FileKind::Symlink).ino;
        let size = SetAttr {
            size: Some(1),
            ..SetAttr::default()
        };
        assert_eq!(
            kit.fail(Command::SetAttr {
                ino: d,
                set: size.clone()
            }),
            FsError::IsDir
        );
        assert_eq!(
            kit.fail(Command::SetAttr { ino: l, set: size }),
            FsError::Invalid
        );
        let f = kit.mkfile(ROOT_INO, "f");
        let set = SetAttr {
            perm: Some(0o104_755),
            uid: Some(7),
            atime: Some(SetTime::At(at(5))),
            mtime: Some(SetTime::Now),
            ..SetAttr::default()
        };
        let attr = kit.ok_attr(Command::SetAttr { ino: f, set });
        assert_eq!((attr.perm, attr.uid, attr.gid), (0o4755, 7, 1000));
        assert_eq!(
            (attr.atime, attr.mtime, attr.ctime),
            (at(5), at(kit.clock), at(kit.clock))
        );
        let grow = SetAttr {
            size: Some(10),
            mtime: Some(SetTime::At(at(3))),
            ..SetAttr::default()
        };
        let attr = kit.ok_attr(Command::SetAttr { ino: f, set: grow });
        assert_eq!((attr.size, attr.mtime), (10, at(3)));
        let version = kit.store.file_data(f).expect("data").inline_version;
        assert_eq!(version, 1, "a size change is a data change");
    }

    #[test]
    fn refused_command_changes_nothing() {
        let mut kit = Kit::new();
        let d = kit.mkdir(ROOT_INO, "d");
        kit.mkfile(d, "x");
        let before = kit.store.snapshot().expect("snapshot");
        kit.fail(Command::Rmdir {
            parent: ROOT_INO,
            name: "d".into(),
        });
        kit.rename(ROOT_INO, "d", d, "d", PLAIN);
        kit.fail(Command::MkNode {
            parent: d,
            name: "x".into(),
            kind: FileKind::Dir,
            perm: 0o755,
            owner: Owner { uid: 0, gid: 0 },
            rdev: 0,
            target: None,
        });
        assert_eq!(kit.store.snapshot().expect("snapshot"), before);
    }
}
