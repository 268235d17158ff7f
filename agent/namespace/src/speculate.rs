//! What a lease holder's changes give before they are committed: its proposals applied
//! to the replica's state by the same code that will apply them from the log, in a write
//! transaction that is then thrown away.
//!
//! A directory lease (`lease.rs`) keeps every other node's changes out of the directory's
//! entries, so for what the lease fences the outcome a speculation gives is the outcome
//! the committed batch will give: the holder answers its mount with it at once (what the
//! lease does not fence is listed in `lease.rs`). Like an apply of entries without leader
//! stamps, a speculation does not move the cluster clock, so a command whose outcome
//! depends on it is not speculated exactly. Proposals the replica has applied already
//! (their request id is in the request-id table) are not applied again: their first
//! outcome is given back, so a holder may pass everything it has not yet seen committed,
//! however far the replica's apply has gone meanwhile.
//!
//! The [`Overlay`] is what the speculation changed of the inodes and directory entries:
//! the holder answers lookups and attributes from it first, then from its replica, until
//! its changes are applied there.

use std::collections::{BTreeMap, BTreeSet};

use redb::Durability;
use shoal_agent_api as api;

use crate::format::{FileKind, Ino};
use crate::record::InodeRecord;
use crate::store::apply_one;
use crate::tx::Tx;
use crate::{NamespaceError, NamespaceStore, Outcome, Proposal};

/// The outcome of each proposal, and what they changed.
#[derive(Clone, Debug)]
pub struct Speculation {
    /// One per proposal, in order: its outcome, and whether the replica had applied it
    /// already (then this is its first outcome).
    pub outcomes: Vec<(Outcome, bool)>,
    pub overlay: Overlay,
}

/// An inode as the speculation left it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OverlayInode {
    pub attr: api::FileAttr,
    /// Its inline bytes (a file's).
    pub inline: Vec<u8>,
}

/// Inodes and directory entries a speculation changed (`None`: removed).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Overlay {
    entries: BTreeMap<(Ino, String), Option<(Ino, FileKind)>>,
    inodes: BTreeMap<Ino, Option<OverlayInode>>,
}

impl Overlay {
    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.inodes.is_empty()
    }

    /// Entry `name` of `dir`, when the changes decided it: `Some(None)` when they removed
    /// it; `None` when the replica answers.
    pub fn entry(&self, dir: Ino, name: &str) -> Option<Option<(Ino, FileKind)>> {
        self.entries.get(&(dir, name.to_owned())).copied()
    }

    /// Inode `ino`, when the changes decided it: `Some(None)` when they deleted it;
    /// `None` when the replica answers.
    pub fn inode(&self, ino: Ino) -> Option<Option<&OverlayInode>> {
        self.inodes.get(&ino).map(Option::as_ref)
    }

    /// The entries of `dir` the changes wrote or removed, in name order.
    pub fn entries_of(&self, dir: Ino) -> impl Iterator<Item = (&str, Option<(Ino, FileKind)>)> {
        self.entries
            .range((dir, String::new())..)
            .take_while(move |((d, _), _)| *d == dir)
            .map(|((_, name), e)| (name.as_str(), *e))
    }
}

fn overlay_inode(ino: Ino, rec: InodeRecord) -> OverlayInode {
    OverlayInode {
        attr: rec.attr(ino).into(),
        inline: rec.inline,
    }
}

impl NamespaceStore {
    /// Applies `proposals` to the replica's state as the log would, and throws the result
    /// away (see the module doc). Blocks the replica's own applies while it runs.
    pub fn speculate(&self, proposals: &[Proposal]) -> Result<Speculation, NamespaceError> {
        let mut txn = self.db.begin_write()?;
        txn.set_durability(Durability::None)?;
        let speculation = {
            let mut tx = Tx::open(&txn)?;
            tx.keep_writes();
            let mut outcomes = Vec::with_capacity(proposals.len());
            // Ids first applied here: a repeat of one is answered as the log would answer
            // it, but was not applied by the replica.
            let mut seen = BTreeSet::new();
            for proposal in proposals {
                let (outcome, repeat) = apply_one(&mut tx, proposal)?;
                let replica_had_it = repeat && proposal.id.is_some_and(|id| !seen.contains(&id));
                if !repeat && let Some(id) = proposal.id {
                    seen.insert(id);
                }
                outcomes.push((outcome, replica_had_it));
            }
            let (inodes, entries) = tx.into_writes();
            Speculation {
                outcomes,
                overlay: Overlay {
                    entries: entries
                        .into_iter()
                        .map(|(key, e)| (key, e.map(|e| (e.ino, e.kind))))
                        .collect(),
                    inodes: inodes
                        .into_iter()
                        .map(|(ino, rec)| (ino, rec.map(|r| overlay_inode(ino, r))))
                        .collect(),
                },
            }
        };
        txn.abort()?;
        Ok(speculation)
    }
}

#[cfg(test)]
mod tests {
    use shoal_agent_api::{FsError, ROOT_INO};
    use shoal_placement::NodeId;

    use crate::command::{Command, LeasedChange, LeasedOp};
    use crate::format::{FileKind, Owner, RequestId};
    use crate::testkit::{Kit, at};
    use crate::{Batch, NamespaceError, Outcome, Proposal};

    fn proposal(seq: u64, command: Command) -> Proposal {
        Proposal {
            id: Some(RequestId { client: 5, seq }),
            now: at(40),
            command,
        }
    }

    #[test]
    fn a_holders_batch_is_answered_before_it_is_committed_and_once_after() {
        let mut kit = Kit::new();
        let dir = kit.mkdir(ROOT_INO, "d");
        let Outcome::DirLease { epoch } = kit.run(Command::TakeDirLease {
            dir,
            holder: NodeId(3),
        }) else {
            panic!("no lease")
        };
        let Outcome::Inos { start, .. } = kit.run(Command::TakeInos {
            holder: NodeId(3),
            count: 2,
        }) else {
            panic!("no numbers")
        };
        let create = |ino, name: &str| LeasedOp {
            dir,
            epoch,
            now: at(41),
            change: LeasedChange::MkNode {
                ino,
                name: name.into(),
                kind: FileKind::File,
                perm: 0o600,
                owner: Owner { uid: 1, gid: 1 },
                rdev: 0,
                target: None,
            },
        };
        let first = proposal(
            1,
            Command::LeasedBatch {
                holder: NodeId(3),
                ops: vec![create(start, "f")],
            },
        );
        let digest = kit.store.digest().expect("digest");
        let spec = kit
            .store
            .speculate(std::slice::from_ref(&first))
            .expect("speculate");
        let Outcome::Batch(outcomes) = &spec.outcomes[0].0 else {
            panic!("{spec:?}")
        };
        let Outcome::Attr(attr) = &outcomes[0] else {
            panic!("{outcomes:?}")
        };
        assert_eq!(attr.ino, start);
        assert!(!spec.outcomes[0].1, "not applied by the replica");
        assert_eq!(
            spec.overlay.entry(dir, "f"),
            Some(Some((start, FileKind::File)))
        );
        assert_eq!(spec.overlay.entry(dir, "g"), None);
        let created = spec.overlay.inode(start).flatten().expect("created");
        assert_eq!(created.attr.ino, start);
        assert_eq!(created.attr.perm, 0o600);
        assert!(
            spec.overlay.inode(dir).flatten().is_some(),
            "the directory's times"
        );
        // The replica holds none of it.
        assert!(matches!(
            kit.store.lookup(dir, "f"),
            Err(NamespaceError::Fs(FsError::NotFound))
        ));
        assert_eq!(kit.store.digest().expect("digest"), digest);

        // Committed: given back as it applied, and the next one speculated on top.
        let applied = kit
            .store
            .apply(&[Batch::new(vec![first.clone()])], b"m")
            .expect("apply");
        assert_eq!(applied[0][0], spec.outcomes[0].0);
        let second = proposal(
            2,
            Command::LeasedBatch {
                holder: NodeId(3),
                ops: vec![create(start + 1, "g"), create(start + 1, "f")],
            },
        );
        let spec = kit
            .store
            .speculate(&[first.clone(), second.clone(), second])
            .expect("speculate");
        assert_eq!(spec.outcomes[0], (applied[0][0].clone(), true));
        let Outcome::Batch(outcomes) = &spec.outcomes[1].0 else {
            panic!("{spec:?}")
        };
        assert!(matches!(outcomes[0], Outcome::Attr(_)));
        assert_eq!(outcomes[1], Outcome::Failed(FsError::Invalid.into()));
        // A repeat inside the speculation is answered once, and was not the replica's.
        assert_eq!(spec.outcomes[2], (spec.outcomes[1].0.clone(), false));
        assert_eq!(spec.overlay.entry(dir, "f"), None, "already in the replica");
        assert_eq!(
            spec.overlay.entries_of(dir).collect::<Vec<_>>(),
            [("g", Some((start + 1, FileKind::File)))]
        );
    }
}
