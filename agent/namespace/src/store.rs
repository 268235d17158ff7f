//! [`NamespaceStore`]: the state machine in one redb file — opening it and applying the log.
//! Queries are in `query.rs`, snapshots in `snapshot.rs`.

use std::path::Path;

use crate::format::Timestamp;
use redb::{Database, Durability, ReadableDatabase};

use crate::namespace::{self, RenameArgs};
use crate::record::{
    ABANDONED, COLD, DEDUP, DIR_LEASES, DIRENTS, DISOWNED, EXTENTS, GARBAGE, GENERATIONS, HEAT,
    INO_RANGES, INODES, KEY_APPLIED, LEGACY_CLIENTS, OBJECT_GARBAGE, OBJECTS, ORPHANS, SESSIONS,
    STATE, STRIPES, encode,
};
use crate::tx::Tx;
use crate::{Batch, Command, NamespaceError, Outcome, Proposal, data, lease, shards};
use shoal_agent_api::FsError;

/// The metadata state machine: the namespace (inodes, directory entries, extents, stripe
/// records, orphans), the cluster layout, recent request outcomes and the applied marker,
/// all in one redb file.
///
/// Every replica that applies the same batches in the same order holds the same state and
/// gives the same outcomes. Each [`NamespaceStore::apply`] is one durable write transaction;
/// each query is one read transaction, so queries see whole applies only.
pub struct NamespaceStore {
    pub(crate) db: Database,
}

impl NamespaceStore {
    /// Opens or creates the state machine at `path` (a redb file). A new store holds
    /// nothing; its root directory is created by the first applied proposal.
    pub fn open(path: &Path) -> Result<NamespaceStore, NamespaceError> {
        NamespaceStore::with_database(Database::create(path)?)
    }

    /// Opens or creates the state machine in `file` of a [`shoal_disk::Disk`] (the
    /// simulator's disk, which loses what was not synced at a power cut).
    pub fn open_on(
        file: std::sync::Arc<dyn shoal_disk::DiskFile>,
    ) -> Result<NamespaceStore, NamespaceError> {
        let db = Database::builder().create_with_backend(shoal_disk::RedbFile(file))?;
        NamespaceStore::with_database(db)
    }

    fn with_database(db: Database) -> Result<NamespaceStore, NamespaceError> {
        let txn = db.begin_write()?;
        // Create every table, so read transactions always find them.
        txn.open_table(INODES)?;
        txn.open_table(DIRENTS)?;
        txn.open_table(EXTENTS)?;
        txn.open_table(STRIPES)?;
        txn.open_table(GARBAGE)?;
        txn.open_table(ORPHANS)?;
        txn.open_table(DEDUP)?;
        txn.open_table(SESSIONS)?;
        txn.open_table(ABANDONED)?;
        txn.open_table(DISOWNED)?;
        txn.open_table(GENERATIONS)?;
        txn.open_table(COLD)?;
        txn.open_table(OBJECTS)?;
        txn.open_table(OBJECT_GARBAGE)?;
        txn.open_table(HEAT)?;
        txn.open_table(DIR_LEASES)?;
        txn.open_table(INO_RANGES)?;
        txn.open_table(STATE)?;
        migrate_legacy_clients(&txn)?;
        txn.commit()?;
        Ok(NamespaceStore { db })
    }

    /// Applies `batches` in order in one durable write transaction, storing `applied` (the
    /// caller's marker: log position and membership) with them. Returns one outcome per
    /// proposal, grouped per batch. A refused command ([`Outcome::Failed`]) changes
    /// nothing; an error means nothing of this call was applied.
    pub fn apply(
        &self,
        batches: &[Batch],
        applied: &[u8],
    ) -> Result<Vec<Vec<Outcome>>, NamespaceError> {
        self.apply_with(batches, applied, Durability::Immediate)
    }

    /// Like [`NamespaceStore::apply`], but not flushed to disk: a crash may lose it, up to the
    /// last durable commit (an `apply` or [`NamespaceStore::persist`]). For a replica whose log
    /// can replay what was lost; it must `persist` before the log behind it is discarded.
    pub fn apply_unflushed(
        &self,
        batches: &[Batch],
        applied: &[u8],
    ) -> Result<Vec<Vec<Outcome>>, NamespaceError> {
        self.apply_with(batches, applied, Durability::None)
    }

    /// Makes every earlier commit durable.
    pub fn persist(&self) -> Result<(), NamespaceError> {
        let mut txn = self.db.begin_write()?;
        txn.set_durability(Durability::Immediate)?;
        txn.commit()?;
        Ok(())
    }

    fn apply_with(
        &self,
        batches: &[Batch],
        applied: &[u8],
        durability: Durability,
    ) -> Result<Vec<Vec<Outcome>>, NamespaceError> {
        let mut txn = self.db.begin_write()?;
        txn.set_durability(durability)?;
        let mut out = Vec::with_capacity(batches.len());
        {
            let mut tx = Tx::open(&txn)?;
            for batch in batches {
                tx.advance_clock(batch.stamp);
                let mut outcomes = Vec::with_capacity(batch.proposals.len());
                for proposal in &batch.proposals {
                    outcomes.push(apply_one(&mut tx, proposal)?.0);
                }
                out.push(outcomes);
            }
            tx.finish(applied)?;
        }
        txn.commit()?;
        Ok(out)
    }

    /// The marker stored by the last apply or install; `None` for a new store.
    pub fn applied(&self) -> Result<Option<Vec<u8>>, NamespaceError> {
        let txn = self.db.begin_read()?;
        let state = txn.open_table(STATE)?;
        Ok(state.get(KEY_APPLIED)?.map(|g| g.value().to_vec()))
    }
}

/// Moves the rows of the `clients` table (proposers' wall clocks, written before the
/// cluster clock existed) into `sessions`, as last seen at cluster time 0: they expire an
/// hour of cluster time after the upgrade unless they are heard from again.
fn migrate_legacy_clients(txn: &redb::WriteTransaction) -> Result<(), NamespaceError> {
    use redb::{ReadableTable, ReadableTableMetadata};
    let legacy = txn.open_table(LEGACY_CLIENTS)?;
    if legacy.is_empty()? {
        return Ok(());
    }
    let mut sessions = txn.open_table(SESSIONS)?;
    for item in legacy.iter()? {
        let (client, _) = item?;
        if sessions.get(client.value())?.is_none() {
            sessions.insert(client.value(), encode(&0u64)?.as_slice())?;
        }
    }
    drop(legacy);
    txn.delete_table(LEGACY_CLIENTS)?;
    Ok(())
}

/// One proposal as the log applies it (and a speculation, `speculate.rs`): a request id
/// seen before is answered with its first outcome (`true`: nothing applied now);
/// otherwise the command applies and its outcome is kept for its id, when it is one a
/// repeat is answered with.
pub(crate) fn apply_one(
    tx: &mut Tx<'_>,
    proposal: &Proposal,
) -> Result<(Outcome, bool), NamespaceError> {
    if let Some(id) = proposal.id
        && let Some(first) = tx.dedup_get(id)?
    {
        return Ok((first, true));
    }
    tx.ensure_root(proposal.now)?;
    let outcome = match execute(tx, proposal.now, &proposal.command) {
        Ok(outcome) => outcome,
        Err(NamespaceError::Fs(e)) => Outcome::Failed(e.into()),
        Err(e) => return Err(e),
    };
    if let Some(id) = proposal.id
        && outcome.remembered()
    {
        tx.dedup_put(id, &outcome)?;
        tx.expire_idle_clients()?;
    }
    Ok((outcome, false))
}

/// Applies one command. A namespace refusal comes back as `Err(NamespaceError::Fs)` before
/// anything was written.
fn execute(tx: &mut Tx<'_>, now: Timestamp, command: &Command) -> Result<Outcome, NamespaceError> {
    if let Some((dir, holder)) = lease::fenced_by(tx, command)? {
        return Ok(Outcome::Leased { dir, holder });
    }
    match command {
        Command::MkNode {
            parent,
            name,
            kind,
            perm,
            owner,
            rdev,
            target,
        } => namespace::mknode(
            tx,
            now,
            *parent,
            name,
            *kind,
            *perm,
            *owner,
            *rdev,
            target.as_deref(),
            None,
        ),
        Command::Link {
            ino,
            new_parent,
            new_name,
        } => namespace::link(tx, now, *ino, *new_parent, new_name),
        Command::Unlink { parent, name } => namespace::unlink(tx, now, *parent, name),
        Command::Rmdir { parent, name } => namespace::rmdir(tx, now, *parent, name),
        Command::Rename {
            parent,
            name,
            new_parent,
            new_name,
            flags,
        } => namespace::rename(
            tx,
            now,
            &RenameArgs {
                parent: *parent,
                name,
                new_parent: *new_parent,
                new_name,
                flags: *flags,
            },
        ),
        Command::SetAttr { ino, set } => namespace::setattr(tx, now, *ino, set),
        Command::WriteInline {
            ino,
            offset,
            data,
            max_inline,
        } => data::write_inline(tx, now, *ino, *offset, data, *max_inline),
        Command::WriteExtents {
            ino,
            inline_version,
            extents,
        } => data::write_extents(tx, now, *ino, *inline_version, extents),
        Command::Purge { ino } => data::purge(tx, *ino),
        Command::StripesFreed { ids } => data::stripes_freed(tx, ids),
        Command::SetLayout { layout } => {
            if tx
                .layout()?
                .is_some_and(|cur| cur.epoch() >= layout.epoch())
            {
                return Err(FsError::Invalid.into());
            }
            tx.set_layout(layout)?;
            Ok(Outcome::Done)
        }
        Command::AbandonStripes { ids } => data::abandon_stripes(tx, ids),
        Command::RecordGenerations { generations } => {
            for (node, generation) in generations {
                tx.record_generation(node.0, *generation)?;
            }
            Ok(Outcome::Done)
        }
        Command::RelocateShards { stripe, moves } => {
            shards::relocate_shards(tx, *stripe, moves, None)
        }
        Command::RelocateShardsPlanned {
            stripe,
            moves,
            planned_at_ms,
        } => shards::relocate_shards(tx, *stripe, moves, Some(*planned_at_ms)),
        Command::DisownShards { node, shards } => shards::disown_shards(tx, *node, shards),
        Command::ChangeNode { node, change } => crate::nodes::change_node(tx, *node, *change),
        Command::TierStripes {
            object,
            size,
            stripes,
        } => crate::tier::tier_stripes(tx, *object, *size, stripes),
        Command::ObjectsDeleted { objects } => crate::tier::objects_deleted(tx, objects),
        Command::RecordReads { inos } => crate::tier::record_reads(tx, inos),
        Command::SetPin { ino, pinned } => crate::tier::set_pin(tx, *ino, *pinned),
        Command::ObjectsOrphaned { objects } => crate::tier::objects_orphaned(tx, objects),
        Command::WarmStripe { ino, stripe, warm } => {
            crate::tier::warm_stripe(tx, *ino, *stripe, warm)
        }
        Command::RevokeCertificates {
            name,
            node,
            before_ms,
        } => crate::revocations::revoke(tx, name, *node, *before_ms),
        Command::TakeDirLease { dir, holder } => lease::take(tx, *dir, *holder),
        Command::ReturnDirLease { dir, epoch } => lease::give_back(tx, *dir, *epoch),
        Command::TakeInos { holder, count } => lease::take_inos(tx, *holder, *count),
        Command::LeasedBatch { holder, ops } => lease::apply_batch(tx, *holder, ops),
    }
}

#[cfg(test)]
mod tests {
    use crate::format::{FileKind, FsError, RequestId};
    use shoal_agent_api::ROOT_INO;

    use crate::NamespaceStore;
    use shoal_placement::{Layout, LayoutNode, NodeId};

    use crate::testkit::{Kit, at, mknode_cmd};
    use crate::tx::DEDUP_WINDOW;
    use crate::{Batch, Command, Outcome, Proposal};

    fn id(seq: u64) -> Option<RequestId> {
        Some(RequestId { client: 9, seq })
    }

    #[test]
    fn repeated_request_id_applies_once() {
        let mut kit = Kit::new();
        let first = kit.run_with(id(1), mknode_cmd(ROOT_INO, "a", FileKind::File));
        let Outcome::Attr(attr) = &first else {
            panic!("{first:?}");
        };
        let again = kit.run_with(id(1), mknode_cmd(ROOT_INO, "a", FileKind::File));
        assert_eq!(again, first, "the repeat gets the first answer, not Exists");
        // A different command under the same id is not applied either.
        let other = kit.run_with(id(1), mknode_cmd(ROOT_INO, "b", FileKind::File));
        assert_eq!(other, first);
        assert_eq!(kit.names(ROOT_INO), ["a"]);
        assert_eq!(kit.store.getattr(attr.ino).expect("a").ctime, attr.ctime);
        // A failure is remembered as well.
        let failed = kit.run_with(id(2), mknode_cmd(ROOT_INO, "a", FileKind::File));
        assert_eq!(failed, Outcome::Failed(FsError::Exists));
        kit.run(Command::Unlink {
            parent: ROOT_INO,
            name: "a".into(),
        });
        let repeat = kit.run_with(id(2), mknode_cmd(ROOT_INO, "a", FileKind::File));
        assert_eq!(repeat, Outcome::Failed(FsError::Exists));
    }

    #[test]
    fn dedup_forgets_requests_older_than_the_window() {
        let mut kit = Kit::new();
        kit.run_with(id(1), mknode_cmd(ROOT_INO, "a", FileKind::File));
        kit.run_with(
            id(1 + DEDUP_WINDOW),
            mknode_cmd(ROOT_INO, "b", FileKind::File),
        );
        let kept = kit.run_with(id(1), mknode_cmd(ROOT_INO, "a", FileKind::File));
        assert!(matches!(kept, Outcome::Attr(_)), "still inside the window");
        kit.run_with(
            id(2 + DEDUP_WINDOW),
            mknode_cmd(ROOT_INO, "c", FileKind::File),
        );
        let forgotten = kit.run_with(id(1), mknode_cmd(ROOT_INO, "a", FileKind::File));
        assert_eq!(forgotten, Outcome::Failed(FsError::Exists));
    }

    #[test]
    fn idle_clients_are_forgotten_with_their_requests() {
        use crate::record::{DEDUP, SESSIONS};
        use crate::tx::CLIENT_IDLE_MS;
        const CLIENT_IDLE_SECS: i64 = (CLIENT_IDLE_MS / 1000) as i64;
        use redb::{ReadableDatabase, ReadableTableMetadata};

        let mut kit = Kit::stamped();
        let req = |client, seq| Some(RequestId { client, seq });
        let rows = |kit: &Kit| {
            let txn = kit.store.db.begin_read().expect("read");
            let dedup = txn.open_table(DEDUP).expect("dedup").len().expect("len");
            let clients = txn
                .open_table(SESSIONS)
                .expect("sessions")
                .len()
                .expect("len");
            (dedup, clients)
        };
        let gone = kit.run_with(req(7, 1), mknode_cmd(ROOT_INO, "gone", FileKind::File));
        kit.run_with(req(7, 2), mknode_cmd(ROOT_INO, "gone2", FileKind::File));
        kit.clock += CLIENT_IDLE_SECS / 2;
        let kept = kit.run_with(req(8, 1), mknode_cmd(ROOT_INO, "kept", FileKind::File));
        assert_eq!(rows(&kit), (3, 2));
        // Client 7 has now been idle for longer than the limit, client 8 not.
        kit.clock += CLIENT_IDLE_SECS / 2 + 10;
        for seq in 1..=3 {
            let name = format!("n{seq}");
            kit.run_with(req(9, seq), mknode_cmd(ROOT_INO, &name, FileKind::File));
        }
        assert_eq!(rows(&kit), (4, 2), "client 7 and its two requests are gone");
        let again = kit.run_with(req(8, 1), mknode_cmd(ROOT_INO, "kept", FileKind::File));
        assert_eq!(again, kept, "a client inside the limit is still answered");
        let again = kit.run_with(req(7, 1), mknode_cmd(ROOT_INO, "gone", FileKind::File));
        assert_ne!(again, gone);
        assert_eq!(again, Outcome::Failed(FsError::Exists), "applied anew");
        // The state survives a restart, and the sweep goes on from where it was.
        let mut kit = kit.restart();
        kit.clock += CLIENT_IDLE_SECS + 10;
        for seq in 4..=8 {
            let name = format!("n{seq}");
            kit.run_with(req(9, seq), mknode_cmd(ROOT_INO, &name, FileKind::File));
        }
        assert_eq!(rows(&kit), (8, 1), "only client 9 is left");
    }

    #[test]
    fn a_proposer_with_a_skewed_clock_does_not_expire_other_sessions() {
        let mut kit = Kit::stamped();
        let req = |client, seq| Some(RequestId { client, seq });
        let first = kit.run_with(req(1, 1), mknode_cmd(ROOT_INO, "a", FileKind::File));
        // An agent two hours fast proposes for its own mount: the `now` it carries is its
        // own clock; the leader's stamps move on by seconds only.
        let skewed = |kit: &mut Kit, seq: u64, name: &str| {
            kit.clock += 1;
            let batch = Batch {
                proposals: vec![Proposal {
                    id: req(2, seq),
                    now: at(kit.clock + 7_200),
                    command: mknode_cmd(ROOT_INO, name, FileKind::File),
                }],
                stamp: Some(kit.stamp()),
            };
            kit.store.apply(&[batch], b"m").expect("apply");
        };
        for seq in 1..=4 {
            skewed(&mut kit, seq, &format!("s{seq}"));
        }
        let again = kit.run_with(req(1, 1), mknode_cmd(ROOT_INO, "a", FileKind::File));
        assert_eq!(again, first, "session 1 is still remembered");
    }

    #[test]
    fn recorded_generations_only_grow() {
        let mut kit = Kit::new();
        let record = |kit: &mut Kit, g: &[(u64, u64)]| {
            let generations = g.iter().map(|&(n, g)| (NodeId(n), g)).collect();
            assert_eq!(
                kit.run(Command::RecordGenerations { generations }),
                Outcome::Done
            );
        };
        record(&mut kit, &[(1, 5), (2, 3)]);
        record(&mut kit, &[(1, 4), (2, 6)]);
        assert_eq!(kit.store.node_generation(NodeId(1)).expect("g"), Some(5));
        assert_eq!(kit.store.node_generation(NodeId(2)).expect("g"), Some(6));
        assert_eq!(kit.store.node_generation(NodeId(3)).expect("g"), None);
        // A snapshot carries them.
        let other = Kit::new();
        other
            .store
            .install(&kit.store.snapshot().expect("snapshot"))
            .expect("install");
        assert_eq!(other.store.node_generation(NodeId(2)).expect("g"), Some(6));
    }

    #[test]
    fn one_apply_answers_per_batch_and_proposal() {
        let kit = Kit::new();
        let proposal = |name: &str| Proposal {
            id: None,
            now: at(1),
            command: mknode_cmd(ROOT_INO, name, FileKind::File),
        };
        let out = kit
            .store
            .apply(
                &[
                    Batch::new(vec![proposal("a"), proposal("a")]),
                    Batch::new(vec![]),
                    Batch::new(vec![proposal("b")]),
                ],
                b"m1",
            )
            .expect("apply");
        assert_eq!(out.iter().map(Vec::len).collect::<Vec<_>>(), [2, 0, 1]);
        assert_eq!(out[0][1], Outcome::Failed(FsError::Exists));
        assert_eq!(
            kit.store.applied().expect("applied").as_deref(),
            Some(&b"m1"[..])
        );
    }

    #[test]
    fn unflushed_applies_are_visible_and_persist_on_demand() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("m.redb");
        {
            let store = NamespaceStore::open(&path).expect("open");
            store
                .apply_unflushed(
                    &[Batch::new(vec![Proposal {
                        id: None,
                        now: at(1),
                        command: mknode_cmd(ROOT_INO, "x", FileKind::File),
                    }])],
                    b"m1",
                )
                .expect("apply");
            assert!(store.lookup(ROOT_INO, "x").is_ok(), "visible at once");
            store.persist().expect("persist");
        }
        let store = NamespaceStore::open(&path).expect("reopen");
        assert!(store.lookup(ROOT_INO, "x").is_ok(), "durable after persist");
        assert_eq!(store.applied().expect("m").as_deref(), Some(&b"m1"[..]));
    }

    #[test]
    fn state_survives_restart() {
        let mut kit = Kit::new();
        assert_eq!(kit.store.applied().expect("applied"), None);
        let d = kit.mkdir(ROOT_INO, "d");
        kit = kit.restart();
        assert_eq!(
            kit.store.applied().expect("applied").as_deref(),
            Some(&b"marker"[..])
        );
        assert_eq!(kit.store.lookup(ROOT_INO, "d").expect("d").ino, d);
        assert_eq!(kit.mkfile(d, "f"), d + 1, "the inode counter persists");
    }

    #[test]
    fn layout_needs_a_newer_epoch() {
        let mut kit = Kit::new();
        let layout = |epoch| {
            Layout::new(epoch, vec![LayoutNode::active(NodeId(1), "a", 1)]).expect("layout")
        };
        assert_eq!(kit.store.cluster_layout().expect("layout"), None);
        assert_eq!(
            kit.run(Command::SetLayout { layout: layout(2) }),
            Outcome::Done
        );
        assert_eq!(
            kit.fail(Command::SetLayout { layout: layout(2) }),
            FsError::Invalid
        );
        assert_eq!(
            kit.fail(Command::SetLayout { layout: layout(1) }),
            FsError::Invalid
        );
        assert_eq!(kit.store.cluster_layout().expect("layout"), Some(layout(2)));
        kit.run(Command::SetLayout { layout: layout(3) });
        assert_eq!(
            kit.store
                .cluster_layout()
                .expect("layout")
                .map(|l| l.epoch()),
            Some(3)
        );
    }

    #[test]
    fn large_directory_lists_every_entry() {
        let kit = Kit::new();
        const N: usize = 100_000;
        for chunk in 0..10 {
            let proposals = (0..N / 10)
                .map(|i| Proposal {
                    id: None,
                    now: at(1),
                    command: mknode_cmd(
                        ROOT_INO,
                        &format!("f{:06}", chunk * N / 10 + i),
                        FileKind::File,
                    ),
                })
                .collect();
            kit.store
                .apply(&[Batch::new(proposals)], b"m")
                .expect("apply");
        }
        let entries = kit.store.readdir(ROOT_INO).expect("readdir");
        assert_eq!(entries.len(), N);
        assert!(entries.windows(2).all(|w| w[0].name < w[1].name));
        assert_eq!(
            kit.store.lookup(ROOT_INO, "f054321").expect("lookup").ino,
            54_321 + 2
        );
        assert_eq!(kit.store.stats().expect("stats").inodes, N as u64 + 1);
    }
}
