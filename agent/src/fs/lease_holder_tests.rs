//! The holder's answers against a real replica; "the group" is an apply on that replica.

use shoal_agent_api::{FsError, Ino, ROOT_INO};
use shoal_namespace::format::{FileKind, Owner, RenameFlags, Timestamp};
use shoal_namespace::{
    Batch, Command, LeasedChange, NamespaceError, NamespaceStore, Outcome, Proposal,
};
use shoal_placement::NodeId;

use shoal_disk::SplitMix64;
use tokio::time::Instant;

use super::{LEASE_TERM, LeaseHolder, LostOp};

const ME: NodeId = NodeId(4);

fn at(secs: i64) -> Timestamp {
    Timestamp { secs, nanos: 0 }
}

struct Rig {
    _dir: tempfile::TempDir,
    store: NamespaceStore,
    holder: LeaseHolder,
    clock: i64,
    /// The monotonic clock every grant and answer reads: fixed, so no test depends on
    /// how fast it runs.
    mono: Instant,
}

impl Rig {
    fn new() -> Rig {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = NamespaceStore::open(&dir.path().join("meta.redb")).expect("open");
        Rig {
            _dir: dir,
            store,
            holder: LeaseHolder::new(ME, 77),
            clock: 100,
            mono: Instant::now(),
        }
    }

    /// Commits one command through "the group".
    fn commit(&mut self, command: Command) -> Outcome {
        self.clock += 1;
        let proposal = Proposal {
            id: None,
            now: at(self.clock),
            command,
        };
        self.commit_proposal(proposal)
    }

    fn commit_proposal(&mut self, proposal: Proposal) -> Outcome {
        let mut out = self
            .store
            .apply(&[Batch::new(vec![proposal])], b"m")
            .expect("apply");
        out.remove(0).remove(0)
    }

    fn mkdir(&mut self, parent: Ino, name: &str) -> Ino {
        match self.commit(Command::MkNode {
            parent,
            name: name.into(),
            kind: FileKind::Dir,
            perm: 0o755,
            owner: Owner { uid: 0, gid: 0 },
            rdev: 0,
            target: None,
        }) {
            Outcome::Attr(a) => a.ino,
            other => panic!("mkdir: {other:?}"),
        }
    }

    /// A directory leased to the holder, with inode numbers to create in it.
    fn leased_dir(&mut self, name: &str) -> Ino {
        let dir = self.mkdir(ROOT_INO, name);
        let take = self.holder.take_command(dir).expect("not held yet");
        let Outcome::DirLease { epoch } = self.commit(take) else {
            panic!("no lease")
        };
        self.holder.granted(dir, epoch, self.mono);
        if self.holder.inos_left() < 8 {
            let take = self.holder.inos_command(16);
            let Outcome::Inos { start, end } = self.commit(take) else {
                panic!("no numbers")
            };
            self.holder.add_inos(start, end);
        }
        dir
    }

    fn answer(&mut self, dir: Ino, change: LeasedChange) -> Outcome {
        self.clock += 1;
        self.holder
            .answer(&self.store, dir, change, at(self.clock), self.mono)
            .expect("answer")
    }

    /// Seals what was answered and commits it, as the flush does.
    fn flush(&mut self) {
        let Some(proposal) = self.holder.seal().cloned() else {
            return;
        };
        let outcome = self.commit_proposal(proposal);
        self.holder
            .committed(&self.store, &outcome)
            .expect("committed");
    }
}

fn create(name: &str) -> LeasedChange {
    LeasedChange::MkNode {
        ino: 0,
        name: name.into(),
        kind: FileKind::File,
        perm: 0o644,
        owner: Owner { uid: 5, gid: 5 },
        rdev: 0,
        target: None,
    }
}

fn rename(name: &str, new_dir: Ino, new_name: &str) -> LeasedChange {
    LeasedChange::Rename {
        name: name.into(),
        new_dir,
        new_epoch: 0,
        new_name: new_name.into(),
        flags: RenameFlags::default(),
    }
}

fn not_found(r: Result<shoal_agent_api::FileAttr, NamespaceError>) -> bool {
    matches!(r, Err(NamespaceError::Fs(FsError::NotFound)))
}

#[test]
fn changes_are_answered_at_once_and_committed_as_answered() {
    let mut rig = Rig::new();
    let dir = rig.leased_dir("d");
    let Outcome::Attr(a) = rig.answer(dir, create("a")) else {
        panic!("create")
    };
    // Answered from the holder's pending ops; the replica has none of it yet.
    assert!(not_found(rig.store.lookup(dir, "a")));
    assert_eq!(rig.holder.entry(dir, "a"), Some(Some(a.ino)));
    assert_eq!(rig.holder.attr(a.ino).flatten().map(|x| x.ino), Some(a.ino));
    let write = LeasedChange::WriteInline {
        ino: a.ino,
        offset: 0,
        data: b"abc".to_vec(),
        max_inline: 4096,
    };
    assert!(matches!(rig.answer(dir, write), Outcome::Attr(x) if x.size == 3));
    // Refused as the state machine would refuse it, and not sent.
    let left = rig.holder.inos_left();
    assert_eq!(
        rig.answer(dir, create("a")),
        Outcome::Failed(FsError::Exists.into())
    );
    assert_eq!(rig.holder.inos_left(), left, "the number goes back");
    assert_eq!(rig.answer(dir, rename("a", dir, "b")), Outcome::Done);
    assert_eq!(rig.holder.entry(dir, "a"), Some(None));
    assert!(rig.holder.pending_in(dir));
    rig.flush();
    assert!(!rig.holder.pending());
    assert!(rig.holder.take_failures().is_empty());
    let b = rig.store.lookup(dir, "b").expect("committed");
    assert_eq!((b.ino, b.size, b.uid), (a.ino, 3, 5));
    assert_eq!(rig.store.file_data(a.ino).expect("data").inline, b"abc");
    assert_eq!(rig.holder.entry(dir, "b"), None, "the replica answers now");
}

#[test]
fn ops_answered_while_a_batch_is_in_flight_build_on_it() {
    let mut rig = Rig::new();
    let dir = rig.leased_dir("d");
    rig.answer(dir, create("x"));
    let first = rig.holder.seal().cloned().expect("sealed");
    // Answered on top of the sealed batch, before it commits.
    assert_eq!(rig.answer(dir, rename("x", dir, "y")), Outcome::Done);
    // The replica applies the first batch before the holder hears its outcome: it is
    // recognised by its request id, not applied twice.
    let outcome = rig.commit_proposal(first.clone());
    assert!(matches!(rig.answer(dir, create("z")), Outcome::Attr(_)));
    assert_eq!(
        rig.answer(dir, create("y")),
        Outcome::Failed(FsError::Exists.into())
    );
    assert_eq!(rig.holder.next_to_commit(), Some(&first));
    // Not this batch's outcome (a caller's mistake): refused, and the batch stays.
    assert!(rig.holder.committed(&rig.store, &Outcome::Done).is_err());
    assert_eq!(rig.holder.next_to_commit(), Some(&first));
    rig.holder
        .committed(&rig.store, &outcome)
        .expect("committed");
    rig.flush();
    assert!(rig.holder.take_failures().is_empty());
    let names: Vec<String> = rig
        .store
        .readdir(dir)
        .expect("readdir")
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, ["y", "z"]);
}

#[test]
fn a_broken_lease_makes_its_pending_answers_failures() {
    let mut rig = Rig::new();
    let dir = rig.leased_dir("d");
    let epoch = rig.holder.epoch(dir).expect("held");
    let answered = rig.answer(dir, create("lost"));
    // Another node breaks the lease (the holder did not answer its recall) and creates
    // the same name.
    assert_eq!(
        rig.commit(Command::ReturnDirLease { dir, epoch }),
        Outcome::Done
    );
    rig.mkdir(dir, "lost");
    rig.flush();
    let failures = rig.holder.take_failures();
    assert_eq!(failures.len(), 1);
    let LostOp {
        op,
        answered: said,
        committed,
    } = &failures[0];
    assert_eq!(
        (op.dir, said, committed),
        (dir, &answered, &Outcome::LeaseLost)
    );
    assert_eq!(rig.holder.epoch(dir), None, "the lost lease is forgotten");
    assert!(matches!(
        rig.holder
            .answer(&rig.store, dir, create("again"), at(1), rig.mono),
        Err(NamespaceError::Fs(FsError::Unavailable(_)))
    ));
    assert_eq!(
        rig.store.lookup(dir, "lost").expect("theirs").kind,
        shoal_agent_api::FileKind::Dir
    );
}

#[test]
fn leased_directories_commit_in_one_order() {
    let mut rig = Rig::new();
    let from = rig.leased_dir("from");
    let to = rig.leased_dir("to");
    let sub = {
        let mut mkdir = create("sub");
        if let LeasedChange::MkNode { kind, .. } = &mut mkdir {
            *kind = FileKind::Dir;
        }
        let made = rig.answer(from, mkdir);
        let Outcome::Attr(a) = made else {
            panic!("{made:?}")
        };
        a.ino
    };
    // A directory made under a lease is held at once, at its parent's epoch, before its
    // mkdir commits; the group leases it so when it does.
    let from_epoch = rig.holder.epoch(from);
    assert_eq!(rig.holder.epoch(sub), from_epoch);
    assert_eq!(rig.holder.take_command(sub), None, "held already");
    rig.flush();
    let lease = rig.store.dir_lease(sub).expect("lease").expect("leased");
    assert_eq!(Some(lease.epoch), from_epoch);
    // Fill the subdirectory, move a file out of it into another leased directory, empty
    // it and remove it: every op depends on the ones before, across three directories.
    rig.answer(sub, create("f"));
    rig.answer(sub, create("g"));
    assert_eq!(rig.answer(sub, rename("f", to, "f")), Outcome::Done);
    assert_eq!(
        rig.answer(sub, LeasedChange::Unlink { name: "g".into() }),
        Outcome::Done
    );
    assert_eq!(
        rig.answer(from, LeasedChange::Rmdir { name: "sub".into() }),
        Outcome::Done
    );
    // Not in a leased directory: the caller takes the normal path.
    assert!(matches!(
        rig.holder
            .answer(&rig.store, ROOT_INO, create("r"), at(1), rig.mono),
        Err(NamespaceError::Fs(FsError::Unavailable(_)))
    ));
    rig.flush();
    assert!(rig.holder.take_failures().is_empty());
    assert!(rig.store.readdir(from).expect("from").is_empty());
    assert_eq!(rig.store.lookup(to, "f").expect("moved").nlink, 1);
    assert_eq!(rig.store.dir_lease(sub).expect("lease"), None);
    assert_eq!(rig.holder.epoch(sub), None, "ended with its directory");
    assert!(rig.holder.epoch(from).is_some() && rig.holder.epoch(to).is_some());
}

/// Everything a client can see of the tree under `dir`: names, attributes, inline bytes.
fn tree(store: &NamespaceStore, dir: Ino, out: &mut Vec<String>) {
    for e in store.readdir(dir).expect("readdir") {
        let attr = store.getattr(e.ino).expect("getattr");
        let inline = match attr.kind {
            shoal_agent_api::FileKind::File => store.file_data(e.ino).expect("data").inline,
            _ => Vec::new(),
        };
        out.push(format!("{dir}/{} {attr:?} {inline:?}", e.name));
        if attr.kind == shoal_agent_api::FileKind::Dir {
            tree(store, e.ino, out);
        }
    }
}

/// Ops answered by the holder, sealed, sent and committed at random moments (a batch
/// sometimes applied by the replica before the holder hears of it) end as the same tree
/// as the same ops applied one by one, at once, on another replica; and every answer the
/// holder gives from its pending ops (an entry, an inode's attributes) is what that other
/// replica says at the same moment.
#[test]
fn batched_answers_end_as_the_same_ops_applied_one_by_one() {
    for seed in 0..24u64 {
        let mut rng = SplitMix64(seed);
        let mut rig = Rig::new();
        let mut mirror = Rig::new();
        let names = ["a", "b", "c", "d"];
        // The same directories, leases and inode numbers on both.
        let mut dirs = Vec::new();
        for name in ["x", "y"] {
            let dir = rig.leased_dir(name);
            assert_eq!(mirror.leased_dir(name), dir);
            dirs.push(dir);
        }
        for r in [&mut rig, &mut mirror] {
            let take = r.holder.inos_command(1000);
            let Outcome::Inos { start, end } = r.commit(take) else {
                panic!("no numbers")
            };
            r.holder.add_inos(start, end);
        }
        let mut in_flight: Option<Proposal> = None;
        let mut applied: Option<Outcome> = None;
        for step in 0..120 {
            let ctx = format!("seed {seed} step {step}");
            match rng.below(10) {
                // The flush in three moves, each at a random moment: seal a batch and
                // send it; the replica applies it; the holder hears its outcome. Ops are
                // answered between any two of them.
                0 => match (&in_flight, &applied) {
                    (None, _) => {
                        rig.holder.seal();
                        in_flight = rig.holder.next_to_commit().cloned();
                    }
                    (Some(p), None) => applied = Some(rig.commit_proposal(p.clone())),
                    (Some(_), Some(outcome)) => {
                        rig.holder
                            .committed(&rig.store, outcome)
                            .expect("committed");
                        (in_flight, applied) = (None, None);
                    }
                },
                _ => {
                    let dir = dirs[rng.below(2) as usize];
                    let name = names[rng.below(4) as usize];
                    let change = match rng.below(6) {
                        0 | 1 => {
                            let mut c = create(name);
                            if rng.below(3) == 0
                                && let LeasedChange::MkNode { kind, .. } = &mut c
                            {
                                *kind = FileKind::Dir;
                            }
                            c
                        }
                        2 => LeasedChange::Unlink { name: name.into() },
                        3 => LeasedChange::Rmdir { name: name.into() },
                        4 => rename(
                            name,
                            dirs[rng.below(2) as usize],
                            names[rng.below(4) as usize],
                        ),
                        _ => match rig
                            .holder
                            .entry(dir, name)
                            .flatten()
                            .or_else(|| rig.store.lookup(dir, name).ok().map(|a| a.ino))
                        {
                            Some(ino) => LeasedChange::WriteInline {
                                ino,
                                offset: rng.below(8),
                                data: vec![step as u8; 1 + rng.below(6) as usize],
                                max_inline: 64,
                            },
                            None => create(name),
                        },
                    };
                    let now = at(1_000 + step);
                    let answer = rig
                        .holder
                        .answer(&rig.store, dir, change.clone(), now, rig.mono)
                        .expect("answer");
                    // The same op, with the number the holder gave it, alone and at once.
                    let mut one = change;
                    if let LeasedChange::MkNode { ino, .. } = &mut one {
                        *ino = match &answer {
                            Outcome::Attr(a) => a.ino,
                            // Refused: its number went back, to be the next one.
                            _ => rig.holder.peek_ino().expect("numbers left"),
                        };
                    }
                    if let LeasedChange::Rename {
                        new_dir, new_epoch, ..
                    } = &mut one
                    {
                        *new_epoch = mirror.holder.epoch(*new_dir).expect("leased");
                    }
                    let epoch = mirror.holder.epoch(dir).expect("leased");
                    let alone = Command::LeasedBatch {
                        holder: ME,
                        ops: vec![shoal_namespace::LeasedOp {
                            dir,
                            epoch,
                            now,
                            change: one,
                        }],
                    };
                    if matches!(answer, Outcome::Attr(_) | Outcome::Done) {
                        let alone = mirror.commit(alone);
                        assert_eq!(alone, Outcome::Batch(vec![answer.clone()]), "{ctx}");
                    } else {
                        // Refused and never sent; the other replica would refuse it too
                        // (asked without applying it: a refused op ends a lease there).
                        let asked = mirror
                            .store
                            .speculate(&[Proposal {
                                id: None,
                                now,
                                command: alone,
                            }])
                            .expect("speculate");
                        assert_eq!(
                            asked.outcomes[0].0,
                            Outcome::Batch(vec![answer.clone()]),
                            "{ctx}"
                        );
                    }
                }
            }
            // The holder's view of every name now is the mirror's.
            for &dir in &dirs {
                for name in names {
                    let holder = match rig.holder.entry(dir, name) {
                        Some(e) => e,
                        None => rig.store.lookup(dir, name).ok().map(|a| a.ino),
                    };
                    let want = mirror.store.lookup(dir, name).ok();
                    assert_eq!(holder, want.as_ref().map(|a| a.ino), "{ctx}: {dir}/{name}");
                    if let Some(want) = want {
                        let got = match rig.holder.attr(want.ino) {
                            Some(a) => a.expect("not deleted"),
                            None => rig.store.getattr(want.ino).expect("getattr"),
                        };
                        assert_eq!(got, want, "{ctx}: attributes of {dir}/{name}");
                    }
                }
            }
        }
        if let Some(p) = in_flight {
            let outcome = applied.unwrap_or_else(|| rig.commit_proposal(p));
            rig.holder
                .committed(&rig.store, &outcome)
                .expect("committed");
        }
        rig.flush();
        while let Some(p) = rig.holder.next_to_commit().cloned() {
            let outcome = rig.commit_proposal(p);
            rig.holder
                .committed(&rig.store, &outcome)
                .expect("committed");
        }
        assert!(!rig.holder.pending());
        assert!(rig.holder.take_failures().is_empty(), "seed {seed}");
        let (mut got, mut want) = (Vec::new(), Vec::new());
        tree(&rig.store, ROOT_INO, &mut got);
        tree(&mirror.store, ROOT_INO, &mut want);
        assert_eq!(got, want, "seed {seed}");
    }
}

#[test]
fn a_holder_answers_only_within_the_term_of_its_last_round() {
    let mut rig = Rig::new();
    let dir = rig.leased_dir("d");
    let granted = rig.mono;
    let late = granted + LEASE_TERM + std::time::Duration::from_millis(1);
    let refused = rig
        .holder
        .answer(&rig.store, dir, create("a"), at(1), late)
        .expect_err("past the term");
    assert!(matches!(
        refused,
        NamespaceError::Fs(FsError::Unavailable(_))
    ));
    assert!(!rig.holder.pending(), "nothing queued");
    // A round that began later renews it; an older one does not move it back.
    rig.holder.renewed(late - std::time::Duration::from_secs(1));
    rig.holder.renewed(granted);
    assert!(rig.holder.answering(late));
    assert!(matches!(
        rig.holder.answer(&rig.store, dir, create("a"), at(2), late),
        Ok(Outcome::Attr(_))
    ));
}

/// A batch is one log entry, which must fit one append message: inline writes of 60 KiB
/// each fill several batches, sealed as they fill, committed in order, none over the
/// limit (found by `metadata_catch_up`: a 4 MB entry could never reach a follower).
#[test]
fn a_batch_stays_under_its_byte_limit() {
    let mut rig = Rig::new();
    let dir = rig.leased_dir("big");
    let files: Vec<Ino> = (0..12)
        .map(|i| match rig.answer(dir, create(&format!("f{i}"))) {
            Outcome::Attr(a) => a.ino,
            other => panic!("create: {other:?}"),
        })
        .collect();
    for &ino in &files {
        let write = LeasedChange::WriteInline {
            ino,
            offset: 0,
            data: vec![7; 60 << 10],
            max_inline: 64 << 10,
        };
        assert!(matches!(rig.answer(dir, write), Outcome::Attr(a) if a.size == 60 << 10));
    }
    rig.holder.seal();
    let mut batches = 0;
    while let Some(proposal) = rig.holder.next_to_commit().cloned() {
        let Command::LeasedBatch { ops, .. } = &proposal.command else {
            panic!("not a batch: {proposal:?}")
        };
        let data: usize = ops
            .iter()
            .map(|op| match &op.change {
                LeasedChange::WriteInline { data, .. } => data.len(),
                _ => 0,
            })
            .sum();
        assert!(data <= super::MAX_BATCH_BYTES, "a batch of {data} bytes");
        let outcome = rig.commit_proposal(proposal);
        rig.holder
            .committed(&rig.store, &outcome)
            .expect("committed");
        batches += 1;
    }
    assert!(batches >= 2, "{batches} batches");
    assert!(rig.holder.take_failures().is_empty());
    for &ino in &files {
        assert_eq!(
            rig.store.file_data(ino).expect("data").inline.len(),
            60 << 10
        );
    }
}

#[test]
fn an_extent_write_of_a_file_made_under_the_lease_is_answered_and_committed_after_it() {
    use shoal_agent_api::{ShardLocation, StripeRecord};
    use shoal_namespace::NewExtent;
    use shoal_placement::{EcProfile, StripeId};
    let mut rig = Rig::new();
    let dir = rig.leased_dir("d");
    let Outcome::Attr(a) = rig.answer(dir, create("big")) else {
        panic!("create")
    };
    assert_eq!(rig.holder.inline_len(a.ino), Some(Some(0)));
    let stripe = StripeRecord {
        id: StripeId(9),
        len: 200_000,
        ec: EcProfile { k: 2, m: 1 },
        shard_len: 100_000,
        epoch: 1,
        shards: (0..3)
            .map(|index| ShardLocation {
                index,
                node: NodeId(u64::from(index) + 1),
                crc32c: 0,
            })
            .collect(),
    };
    let write = LeasedChange::WriteExtents {
        ino: a.ino,
        inline_version: None,
        extents: vec![NewExtent {
            offset: 0,
            len: 200_000,
            stripe: stripe.into(),
        }],
        commit_by_ms: u64::MAX,
    };
    assert!(matches!(rig.answer(dir, write), Outcome::Attr(x) if x.size == 200_000));
    assert_eq!(
        rig.holder.attr(a.ino).flatten().map(|x| x.size),
        Some(200_000)
    );
    rig.flush();
    assert!(rig.holder.take_failures().is_empty());
    let data = rig.store.file_data(a.ino).expect("committed");
    assert_eq!((data.attr.size, data.extents.len()), (200_000, 1));
}

#[test]
fn the_writeback_is_wanted_for_many_ops_or_a_full_batch_not_for_one_in_flight() {
    const WAKE_AT: usize = 4;
    let mut rig = Rig::new();
    let dir = rig.leased_dir("w");
    let sealed = rig.holder.sealed_count();
    rig.answer(dir, create("a"));
    assert!(!rig.holder.wants_writeback(sealed, WAKE_AT), "one op waits");
    // A batch in flight: what is answered meanwhile waits for the interval (before this,
    // each answer woke the writeback, and every round of the group carried a batch of
    // the few ops answered during the one before).
    rig.holder.seal().expect("sealed");
    for name in ["b", "c", "d"] {
        let sealed = rig.holder.sealed_count();
        rig.answer(dir, create(name));
        assert!(
            !rig.holder.wants_writeback(sealed, WAKE_AT),
            "{name}: a batch in flight is no reason"
        );
    }
    let sealed = rig.holder.sealed_count();
    rig.answer(dir, create("e"));
    assert!(
        rig.holder.wants_writeback(sealed, WAKE_AT),
        "wake_at ops open"
    );
    rig.holder.seal();
    while let Some(proposal) = rig.holder.next_to_commit().cloned() {
        let outcome = rig.commit_proposal(proposal);
        rig.holder
            .committed(&rig.store, &outcome)
            .expect("committed");
    }
    // An answer that seals a batch full wakes it.
    let file = match rig.answer(dir, create("big")) {
        Outcome::Attr(a) => a.ino,
        other => panic!("create: {other:?}"),
    };
    rig.flush();
    let mut woke = false;
    for round in 0..(super::MAX_BATCH_BYTES / (60 << 10) + 2) {
        let sealed = rig.holder.sealed_count();
        let write = LeasedChange::WriteInline {
            ino: file,
            offset: (round * (60 << 10)) as u64,
            data: vec![1; 60 << 10],
            max_inline: 1 << 30,
        };
        rig.answer(dir, write);
        if rig.holder.wants_writeback(sealed, usize::MAX) {
            woke = true;
            break;
        }
    }
    assert!(woke, "a batch sealed full wakes the writeback");
}
