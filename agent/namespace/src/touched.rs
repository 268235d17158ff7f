//! What an applied command changed that a mount's kernel may have cached: names whose
//! lookup may now answer differently, and inodes whose attributes changed. Every agent
//! applies every entry, so from these its mounts hear of other nodes' changes (and drop
//! those cache entries) instead of trusting short cache lifetimes.

use crate::format::Ino;

use crate::{Command, Outcome, Proposal};

/// Names and inodes one or more commands changed, in the order they were applied, each
/// with its origin: the `client` of the proposal's request id (0 when it had none). A
/// mount's own changes are in its kernel's caches already.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Touched {
    /// `(origin, parent, name)`: the name now resolves differently (made, removed,
    /// renamed).
    pub names: Vec<(u64, Ino, String)>,
    /// `(origin, inode)`: its attributes (size, times, mode, link count) changed.
    pub inodes: Vec<(u64, Ino)>,
}

impl Touched {
    pub fn is_empty(&self) -> bool {
        self.names.is_empty() && self.inodes.is_empty()
    }

    /// Adds what `proposal` changed, given the outcome it was applied with. A refused or
    /// failed command changed nothing.
    pub fn add(&mut self, proposal: &Proposal, outcome: &Outcome) {
        // A lease holder's batch: each op as the command it applies as.
        if let (Command::LeasedBatch { ops, .. }, Outcome::Batch(outcomes)) =
            (&proposal.command, outcome)
        {
            for (op, outcome) in ops.iter().zip(outcomes) {
                let one = Proposal {
                    id: proposal.id,
                    now: op.now,
                    command: op.command(),
                };
                self.add(&one, outcome);
            }
            return;
        }
        if !matches!(outcome, Outcome::Attr(_) | Outcome::Done) {
            return;
        }
        let origin = proposal.id.map_or(0, |id| id.client);
        let mut name = |parent: Ino, name: &String| self.names.push((origin, parent, name.clone()));
        let mut inodes = Vec::new();
        match &proposal.command {
            Command::MkNode {
                parent, name: n, ..
            }
            | Command::Unlink { parent, name: n }
            | Command::Rmdir { parent, name: n } => {
                name(*parent, n);
                inodes.push(*parent);
            }
            Command::Link {
                ino,
                new_parent,
                new_name,
            } => {
                name(*new_parent, new_name);
                inodes.extend([*ino, *new_parent]);
            }
            Command::Rename {
                parent,
                name: n,
                new_parent,
                new_name,
                ..
            } => {
                name(*parent, n);
                name(*new_parent, new_name);
                inodes.push(*parent);
                if new_parent != parent {
                    inodes.push(*new_parent);
                }
            }
            Command::SetAttr { ino, .. }
            | Command::WriteInline { ino, .. }
            | Command::WriteExtents { ino, .. } => inodes.push(*ino),
            // Everything else changes data placement or cluster state, not what a stat
            // or a lookup answers.
            _ => {}
        }
        self.inodes.extend(inodes.into_iter().map(|i| (origin, i)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{FsError, RenameFlags, RequestId, Timestamp};

    fn from(client: u64, command: Command) -> Proposal {
        Proposal {
            id: Some(RequestId { client, seq: 1 }),
            now: Timestamp::default(),
            command,
        }
    }

    fn rename(parent: Ino, new_parent: Ino) -> Proposal {
        from(
            5,
            Command::Rename {
                parent,
                name: "a".into(),
                new_parent,
                new_name: "b".into(),
                flags: RenameFlags::default(),
            },
        )
    }

    #[test]
    fn a_rename_touches_both_names_and_both_parents_once() {
        let mut t = Touched::default();
        t.add(&rename(1, 2), &Outcome::Done);
        assert_eq!(
            t.names,
            vec![(5, 1, "a".to_string()), (5, 2, "b".to_string())]
        );
        assert_eq!(t.inodes, vec![(5, 1), (5, 2)]);
        let mut same = Touched::default();
        same.add(&rename(1, 1), &Outcome::Done);
        assert_eq!(same.inodes, vec![(5, 1)]);
    }

    #[test]
    fn a_failed_command_touches_nothing() {
        let mut t = Touched::default();
        t.add(&rename(1, 2), &Outcome::Failed(FsError::NotFound));
        t.add(
            &from(
                5,
                Command::Unlink {
                    parent: 1,
                    name: "x".into(),
                },
            ),
            &Outcome::Conflict,
        );
        assert!(t.is_empty());
    }

    #[test]
    fn a_leased_batch_touches_what_each_op_applied_as_touches() {
        use crate::command::{LeasedChange, LeasedOp};
        let op = |change| LeasedOp {
            dir: 7,
            epoch: 1,
            now: Timestamp::default(),
            change,
        };
        let batch = from(
            4,
            Command::LeasedBatch {
                holder: shoal_placement::NodeId(1),
                ops: vec![
                    op(LeasedChange::Unlink { name: "f".into() }),
                    op(LeasedChange::Unlink {
                        name: "lost".into(),
                    }),
                    op(LeasedChange::Rename {
                        name: "a".into(),
                        new_dir: 8,
                        new_epoch: 2,
                        new_name: "b".into(),
                        flags: RenameFlags::default(),
                    }),
                ],
            },
        );
        let mut t = Touched::default();
        t.add(
            &batch,
            &Outcome::Batch(vec![Outcome::Done, Outcome::LeaseLost, Outcome::Done]),
        );
        assert_eq!(
            t.names,
            vec![
                (4, 7, "f".to_string()),
                (4, 7, "a".to_string()),
                (4, 8, "b".to_string())
            ]
        );
        assert_eq!(t.inodes, vec![(4, 7), (4, 7), (4, 8)]);
    }

    #[test]
    fn unlink_touches_the_name_and_its_directory_and_writes_the_inode() {
        let mut t = Touched::default();
        t.add(
            &from(
                3,
                Command::Unlink {
                    parent: 7,
                    name: "f".into(),
                },
            ),
            &Outcome::Done,
        );
        let write = Command::WriteExtents {
            ino: 9,
            inline_version: None,
            extents: Vec::new(),
        };
        t.add(
            &Proposal {
                id: None,
                now: Timestamp::default(),
                command: write,
            },
            &Outcome::Done,
        );
        assert_eq!(t.names, vec![(3, 7, "f".to_string())]);
        assert_eq!(t.inodes, vec![(3, 7), (0, 9)]);
    }
}
