//! File data commands: inline writes, extent commits, truncation and purging, with the
//! stripe reference counts they move.
//!
//! A file keeps its data either inline (a prefix of its content in the inode record) or
//! in extents, never both. Each live stripe counts the extents that point into it; when
//! the count reaches zero the stripe moves to the garbage table, where the garbage
//! collector finds it, deletes its shards and sends `StripesFreed`.

use shoal_agent_api::FsError;

use crate::format::{FileKind, Ino, Timestamp};
use shoal_placement::StripeId;

use crate::record::{ExtentRecord, InodeRecord};
use crate::tx::Tx;
use crate::{NamespaceError, NewExtent, Outcome};

/// Largest file size (Linux `loff_t`).
pub(crate) const MAX_FILE_SIZE: u64 = i64::MAX as u64;

/// A regular file: IsDir for a directory, Invalid for other kinds.
fn regular_file(tx: &mut Tx<'_>, ino: Ino) -> Result<InodeRecord, NamespaceError> {
    match tx.inode(ino)? {
        Some(rec) if rec.kind == FileKind::File => Ok(rec),
        Some(rec) if rec.kind == FileKind::Dir => Err(FsError::IsDir.into()),
        Some(_) => Err(FsError::Invalid.into()),
        None => Err(FsError::NotFound.into()),
    }
}

/// The end of `[offset, offset + len)`, refused when past the largest file size.
fn end_of(offset: u64, len: u64) -> Result<u64, FsError> {
    match offset.checked_add(len) {
        Some(end) if end <= MAX_FILE_SIZE => Ok(end),
        _ => Err(FsError::TooBig),
    }
}

pub(crate) fn write_inline(
    tx: &mut Tx<'_>,
    now: Timestamp,
    ino: Ino,
    offset: u64,
    data: &[u8],
    max_inline: u64,
) -> Result<Outcome, NamespaceError> {
    let mut node = regular_file(tx, ino)?;
    let end = end_of(offset, data.len() as u64)?;
    if end > max_inline || tx.has_extents(ino)? {
        return Ok(Outcome::NotInline {
            inline: node.inline,
            version: node.data_version,
        });
    }
    // `end <= max_inline`, which the caller sizes to fit in memory.
    let (start, end_idx) = (offset as usize, end as usize);
    if node.inline.len() < end_idx {
        node.inline.resize(end_idx, 0);
    }
    node.inline[start..end_idx].copy_from_slice(data);
    node.size = node.size.max(end);
    node.data_version += 1;
    node.mtime = now;
    node.ctime = now;
    let attr = node.attr(ino);
    tx.put_inode(ino, node);
    tx.touch(ino)?;
    Ok(Outcome::Attr(attr))
}

pub(crate) fn write_extents(
    tx: &mut Tx<'_>,
    now: Timestamp,
    ino: Ino,
    inline_version: Option<u64>,
    extents: &[NewExtent],
) -> Result<Outcome, NamespaceError> {
    let mut node = regular_file(tx, ino)?;
    let mut size = node.size;
    for ext in extents {
        if ext.len == 0 || ext.len > ext.stripe.len {
            return Err(FsError::Invalid.into());
        }
        size = size.max(end_of(ext.offset, ext.len)?);
    }
    // The inline bytes the writer put in its first extent must be the file's own, now:
    // none when it holds none (a writer whose replica was behind may carry bytes another
    // writer has moved to a stripe and overwritten since), else of this very version.
    let holds = (!node.inline.is_empty()).then_some(node.data_version);
    if inline_version != holds {
        return Ok(Outcome::Conflict);
    }
    for ext in extents {
        if tx.is_abandoned(ext.stripe.id)? {
            return Ok(Outcome::StripeAbandoned(ext.stripe.id));
        }
    }

    node.inline = Vec::new();
    for ext in extents {
        // Reference the new stripe before cutting old extents, so a stripe rewritten
        // over itself never passes through garbage.
        tx.add_stripe_ref(&ext.stripe)?;
        punch(tx, ino, ext.offset, ext.offset + ext.len)?;
        tx.put_extent(
            ino,
            ext.offset,
            ExtentRecord {
                len: ext.len,
                stripe_offset: 0,
                stripe: ext.stripe.id,
            },
        )?;
    }
    node.size = size;
    node.data_version += 1;
    node.mtime = now;
    node.ctime = now;
    let attr = node.attr(ino);
    tx.put_inode(ino, node);
    tx.touch(ino)?;
    Ok(Outcome::Attr(attr))
}

/// Removes `[start, end)` from the file's extents: extents inside go, extents crossing an
/// end are cut (one cut in the middle becomes two pieces), and the stripe reference counts
/// follow the number of pieces.
fn punch(tx: &mut Tx<'_>, ino: Ino, start: u64, end: u64) -> Result<(), NamespaceError> {
    for (offset, ext) in tx.extents_overlapping(ino, start, end)? {
        let ext_end = offset + ext.len;
        tx.remove_extent(ino, offset)?;
        let mut pieces = 0i64;
        if offset < start {
            tx.put_extent(
                ino,
                offset,
                ExtentRecord {
                    len: start - offset,
                    ..ext
                },
            )?;
            pieces += 1;
        }
        if ext_end > end {
            tx.put_extent(
                ino,
                end,
                ExtentRecord {
                    len: ext_end - end,
                    stripe_offset: ext.stripe_offset + (end - offset),
                    stripe: ext.stripe,
                },
            )?;
            pieces += 1;
        }
        tx.change_stripe_refs(ext.stripe, pieces - 1)?;
    }
    Ok(())
}

/// Sets a file's size: shrinking drops or trims the extents and inline bytes past the
/// end; growing leaves a hole.
pub(crate) fn resize(
    tx: &mut Tx<'_>,
    ino: Ino,
    node: &mut InodeRecord,
    size: u64,
) -> Result<(), NamespaceError> {
    if size < node.size {
        punch(tx, ino, size, u64::MAX)?;
        if (node.inline.len() as u64) > size {
            node.inline.truncate(size as usize);
        }
    }
    node.size = size;
    Ok(())
}

pub(crate) fn purge(tx: &mut Tx<'_>, ino: Ino) -> Result<Outcome, NamespaceError> {
    if tx.inode(ino)?.is_none() {
        return Err(FsError::NotFound.into());
    }
    if !tx.is_orphan(ino)? {
        return Err(FsError::Invalid.into());
    }
    punch(tx, ino, 0, u64::MAX)?;
    tx.remove_orphan(ino)?;
    tx.delete_inode(ino);
    tx.forget_heat(ino)?;
    Ok(Outcome::Done)
}

pub(crate) fn stripes_freed(tx: &mut Tx<'_>, ids: &[StripeId]) -> Result<Outcome, NamespaceError> {
    for &id in ids {
        tx.forget_garbage(id)?;
        // A cold stripe's object loses a user once the stripe is gone for good (not when
        // it became garbage: a garbage stripe referenced again is live with its data).
        if tx.live_stripe(id)?.is_none() {
            tx.uncold(id)?;
        }
    }
    Ok(Outcome::Done)
}

/// Fences the stripes the metadata does not know; answers which ones (their shards may go).
pub(crate) fn abandon_stripes(
    tx: &mut Tx<'_>,
    ids: &[StripeId],
) -> Result<Outcome, NamespaceError> {
    let mut fenced = Vec::new();
    for &id in ids {
        if tx.stripe_known(id)? {
            continue;
        }
        tx.abandon(id)?;
        fenced.push(id);
    }
    tx.expire_abandoned()?;
    Ok(Outcome::Abandoned(fenced))
}

#[cfg(test)]
mod tests {
    use crate::format::{FsError, SetAttr};
    use shoal_agent_api::ROOT_INO;

    use crate::testkit::{Kit, extent};
    use crate::{Command, Outcome};

    /// (offset, len, stripe_offset, stripe id) of every extent of `ino`.
    fn extents(kit: &Kit, ino: u64) -> Vec<(u64, u64, u64, u128)> {
        let data = kit.store.file_data(ino).expect("file_data");
        data.extents
            .iter()
            .map(|e| (e.offset, e.len, e.stripe_offset, e.stripe.id.0))
            .collect()
    }

    fn truncate(size: u64) -> SetAttr {
        SetAttr {
            size: Some(size),
            ..SetAttr::default()
        }
    }

    fn abandon(kit: &mut Kit, ids: &[u128]) -> Vec<u128> {
        let ids = ids.iter().map(|&i| shoal_placement::StripeId(i)).collect();
        match kit.run(Command::AbandonStripes { ids }) {
            Outcome::Abandoned(fenced) => fenced.into_iter().map(|i| i.0).collect(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_commit_naming_an_abandoned_stripe_is_refused_and_changes_nothing() {
        let mut kit = Kit::new();
        let f = kit.mkfile(ROOT_INO, "f");
        assert_eq!(abandon(&mut kit, &[7]), [7]);
        let before = kit.store.digest().expect("digest").1;
        assert_eq!(
            kit.write_extents(f, vec![extent(0, 100, 8), extent(100, 10, 7)]),
            Outcome::StripeAbandoned(shoal_placement::StripeId(7))
        );
        assert_eq!(
            kit.store.digest().expect("digest").1,
            before,
            "nothing applied"
        );
        assert!(extents(&kit, f).is_empty());
        // Other stripes still commit.
        assert!(matches!(
            kit.write_extents(f, vec![extent(0, 100, 8)]),
            Outcome::Attr(_)
        ));
    }

    #[test]
    fn stripes_the_metadata_knows_are_never_abandoned() {
        let mut kit = Kit::new();
        let f = kit.mkfile(ROOT_INO, "f");
        kit.write_extents(f, vec![extent(0, 100, 1)]);
        kit.write_extents(f, vec![extent(0, 100, 2)]);
        assert_eq!(kit.garbage_ids(), [1]);
        // 1 is garbage (its shards are the collector's), 2 is live, 3 unknown.
        assert_eq!(abandon(&mut kit, &[1, 2, 3]), [3]);
        assert_eq!(extents(&kit, f), [(0, 100, 0, 2)]);
        assert_eq!(abandon(&mut kit, &[3]), [3], "idempotent");
    }

    #[test]
    fn abandoned_stripes_are_forgotten_after_a_day_of_cluster_time() {
        let mut kit = Kit::stamped();
        abandon(&mut kit, &[5]);
        let f = kit.mkfile(ROOT_INO, "f");
        kit.clock += (crate::tx::ABANDON_KEEP_MS / 1000) as i64 + 10;
        abandon(&mut kit, &[6]);
        assert_eq!(
            kit.write_extents(f, vec![extent(0, 10, 6)]),
            Outcome::StripeAbandoned(shoal_placement::StripeId(6))
        );
        assert!(
            matches!(
                kit.write_extents(f, vec![extent(0, 10, 5)]),
                Outcome::Attr(_)
            ),
            "5's fence expired"
        );
    }

    #[test]
    fn overwrite_splits_extent_and_counts_references() {
        let mut kit = Kit::new();
        let f = kit.mkfile(ROOT_INO, "f");
        kit.write_extents(f, vec![extent(0, 100, 1)]);
        let attr = match kit.write_extents(f, vec![extent(40, 20, 2)]) {
            Outcome::Attr(attr) => attr,
            other => panic!("{other:?}"),
        };
        assert_eq!(attr.size, 100);
        assert_eq!(
            extents(&kit, f),
            [(0, 40, 0, 1), (40, 20, 0, 2), (60, 40, 60, 1)]
        );
        // Stripe 1 has two references now: dropping one piece keeps it live.
        kit.write_extents(f, vec![extent(0, 40, 3)]);
        assert!(kit.garbage_ids().is_empty());
        kit.write_extents(f, vec![extent(60, 40, 4)]);
        assert_eq!(kit.garbage_ids(), [1]);
        assert!(
            kit.store
                .stripe_known(shoal_placement::StripeId(1))
                .expect("known")
        );
        let stats = kit.store.stats().expect("stats");
        assert_eq!((stats.stripes, stats.stripe_bytes), (3, 20 + 40 + 40));
    }

    #[test]
    fn file_range_returns_only_overlapping_extents() {
        let mut kit = Kit::new();
        let f = kit.mkfile(ROOT_INO, "f");
        kit.write_extents(
            f,
            vec![extent(0, 10, 1), extent(10, 10, 2), extent(30, 10, 3)],
        );
        let starts = |offset, len| -> Vec<u64> {
            let d = kit.store.file_range(f, offset, len).expect("range");
            d.extents.iter().map(|e| e.offset).collect()
        };
        assert_eq!(starts(0, 5), [0]);
        assert_eq!(starts(5, 10), [0, 10]);
        assert_eq!(starts(20, 10), Vec::<u64>::new(), "a hole");
        assert_eq!(starts(15, 100), [10, 30]);
        assert_eq!(starts(39, 1), [30]);
        assert_eq!(starts(40, 10), Vec::<u64>::new());
        let all = kit.store.file_data(f).expect("data").extents;
        assert_eq!(
            kit.store.file_range(f, 0, u64::MAX).expect("r").extents,
            all
        );
    }

    #[test]
    fn later_extents_in_one_command_win() {
        let mut kit = Kit::new();
        let f = kit.mkfile(ROOT_INO, "f");
        kit.write_extents(
            f,
            vec![extent(0, 10, 1), extent(5, 10, 2), extent(100, 1, 3)],
        );
        assert_eq!(
            extents(&kit, f),
            [(0, 5, 0, 1), (5, 10, 0, 2), (100, 1, 0, 3)]
        );
        assert_eq!(kit.store.getattr(f).expect("f").size, 101);
    }

    #[test]
    fn truncate_releases_stripes_to_garbage() {
        let mut kit = Kit::new();
        let f = kit.mkfile(ROOT_INO, "f");
        kit.write_extents(
            f,
            vec![extent(0, 10, 1), extent(10, 10, 2), extent(20, 10, 3)],
        );
        kit.ok_attr(Command::SetAttr {
            ino: f,
            set: truncate(15),
        });
        assert_eq!(extents(&kit, f), [(0, 10, 0, 1), (10, 5, 0, 2)]);
        assert_eq!(kit.garbage_ids(), [3]);
        let attr = kit.ok_attr(Command::SetAttr {
            ino: f,
            set: truncate(1000),
        });
        assert_eq!(attr.size, 1000);
        assert_eq!(extents(&kit, f).len(), 2, "growing leaves a hole");
        kit.ok_attr(Command::SetAttr {
            ino: f,
            set: truncate(0),
        });
        assert!(extents(&kit, f).is_empty());
        assert_eq!(kit.garbage_ids(), [1, 2, 3]);
        kit.run(Command::StripesFreed {
            ids: vec![shoal_placement::StripeId(2), shoal_placement::StripeId(77)],
        });
        assert_eq!(kit.garbage_ids(), [1, 3]);
        assert!(
            !kit.store
                .stripe_known(shoal_placement::StripeId(2))
                .expect("known")
        );
        assert_eq!(kit.store.stats().expect("stats").stripe_bytes, 0);
    }

    #[test]
    fn inline_write_merges_and_refuses_past_max() {
        let mut kit = Kit::new();
        let f = kit.mkfile(ROOT_INO, "f");
        let write = |offset, data: &[u8]| Command::WriteInline {
            ino: f,
            offset,
            data: data.to_vec(),
            max_inline: 16,
        };
        let attr = kit.ok_attr(write(4, b"abcd"));
        assert_eq!(attr.size, 8);
        kit.ok_attr(write(0, b"xy"));
        let data = kit.store.file_data(f).expect("data");
        assert_eq!(data.inline, b"xy\0\0abcd");
        assert_eq!(data.inline_version, 2);
        assert_eq!(
            kit.run(write(10, b"0123456789")),
            Outcome::NotInline {
                inline: b"xy\0\0abcd".to_vec(),
                version: 2
            }
        );
        kit.ok_attr(Command::SetAttr {
            ino: f,
            set: truncate(3),
        });
        let data = kit.store.file_data(f).expect("data");
        assert_eq!((data.inline.as_slice(), data.attr.size), (&b"xy\0"[..], 3));
        let d = kit.mkdir(ROOT_INO, "d");
        let to_dir = Command::WriteInline {
            ino: d,
            offset: 0,
            data: vec![1],
            max_inline: 16,
        };
        assert_eq!(kit.fail(to_dir), FsError::IsDir);
    }

    #[test]
    fn extents_replace_inline_data_of_the_same_version() {
        let mut kit = Kit::new();
        let f = kit.mkfile(ROOT_INO, "f");
        kit.ok_attr(Command::WriteInline {
            ino: f,
            offset: 0,
            data: b"hello".to_vec(),
            max_inline: 16,
        });
        let stale = Command::WriteExtents {
            ino: f,
            inline_version: Some(0),
            extents: vec![extent(0, 100, 1)],
        };
        assert_eq!(kit.run(stale), Outcome::Conflict);
        assert_eq!(kit.store.file_data(f).expect("data").inline, b"hello");
        let current = Command::WriteExtents {
            ino: f,
            inline_version: Some(1),
            extents: vec![extent(0, 100, 1)],
        };
        assert!(matches!(kit.run(current), Outcome::Attr(_)));
        let data = kit.store.file_data(f).expect("data");
        assert!(data.inline.is_empty());
        assert_eq!((data.extents.len(), data.attr.size), (1, 100));
        let inline_again = Command::WriteInline {
            ino: f,
            offset: 0,
            data: b"x".to_vec(),
            max_inline: 16,
        };
        assert!(matches!(kit.run(inline_again), Outcome::NotInline { .. }));
        let layout = kit.store.file_layout(f).expect("layout");
        assert_eq!((layout.inline_len, layout.extents.len()), (0, 1));
    }

    /// A writer whose replica was behind carries inline bytes another writer has already
    /// moved to a stripe and overwritten: its extents would put the old bytes back (found
    /// by the simulator, seed 200 of `power-loss`: a restarted node's writer carried
    /// version 1 after versions 2 and 3 were acknowledged).
    #[test]
    fn extents_carrying_inline_bytes_the_file_no_longer_holds_conflict() {
        let mut kit = Kit::new();
        let f = kit.mkfile(ROOT_INO, "f");
        kit.ok_attr(Command::WriteInline {
            ino: f,
            offset: 0,
            data: b"hello".to_vec(),
            max_inline: 16,
        });
        let moved = Command::WriteExtents {
            ino: f,
            inline_version: Some(1),
            extents: vec![extent(0, 100, 1)],
        };
        assert!(matches!(kit.run(moved), Outcome::Attr(_)));
        let stale = Command::WriteExtents {
            ino: f,
            inline_version: Some(1),
            extents: vec![extent(0, 100, 2)],
        };
        assert_eq!(kit.run(stale), Outcome::Conflict);
        let data = kit.store.file_data(f).expect("data");
        assert_eq!(data.extents.len(), 1);
        assert_eq!(
            data.extents[0].stripe.id,
            extent(0, 100, 1).stripe.id,
            "the first writer's stripe"
        );
    }

    #[test]
    fn extent_empty_or_longer_than_its_stripe_is_invalid() {
        let mut kit = Kit::new();
        let f = kit.mkfile(ROOT_INO, "f");
        let mut long = extent(0, 10, 1);
        long.stripe.len = 5;
        assert_eq!(
            kit.write_extents(f, vec![extent(0, 10, 2), long]),
            Outcome::Failed(FsError::Invalid)
        );
        assert_eq!(
            kit.write_extents(f, vec![extent(0, 0, 3)]),
            Outcome::Failed(FsError::Invalid)
        );
        assert!(
            !kit.store
                .stripe_known(shoal_placement::StripeId(2))
                .expect("known")
        );
    }

    #[test]
    fn purge_releases_stripes_and_refuses_named_inodes() {
        let mut kit = Kit::new();
        let f = kit.mkfile(ROOT_INO, "f");
        kit.write_extents(f, vec![extent(0, 10, 1), extent(10, 10, 2)]);
        assert_eq!(kit.fail(Command::Purge { ino: f }), FsError::Invalid);
        kit.run(Command::Unlink {
            parent: ROOT_INO,
            name: "f".into(),
        });
        assert!(kit.garbage_ids().is_empty(), "an orphan keeps its data");
        assert_eq!(kit.run(Command::Purge { ino: f }), Outcome::Done);
        assert_eq!(kit.garbage_ids(), [1, 2]);
        assert_eq!(kit.store.stats().expect("stats").stripes, 0);
    }
}
