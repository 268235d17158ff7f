//! A store in a temporary directory with one-line helpers, for the unit tests.

use shoal_agent_api::ROOT_INO;

use crate::format::{
    FileAttr, FileKind, FsError, Ino, Owner, RenameFlags, RequestId, ShardLocation, StripeRecord,
    Timestamp,
};
use shoal_placement::{EcProfile, NodeId, StripeId};

use crate::{Batch, Command, LeaderStamp, NamespaceStore, NewExtent, Outcome, Proposal};

pub(crate) struct Kit {
    pub dir: tempfile::TempDir,
    pub store: NamespaceStore,
    /// The time the next proposal carries; each apply advances it by one second.
    pub clock: i64,
    /// Whether applies carry a leader stamp of `clock` (so the cluster clock follows it);
    /// off by default, so refused commands leave the state byte-identical.
    pub stamped: bool,
}

pub(crate) fn at(secs: i64) -> Timestamp {
    Timestamp { secs, nanos: 0 }
}

pub(crate) fn stripe(id: u128, len: u64) -> StripeRecord {
    StripeRecord {
        id: StripeId(id),
        len,
        ec: EcProfile { k: 2, m: 1 },
        shard_len: len.div_ceil(2),
        epoch: 1,
        shards: (0..3)
            .map(|index| ShardLocation {
                index,
                node: NodeId(u64::from(index) + 1),
                crc32c: 0,
            })
            .collect(),
    }
}

pub(crate) fn extent(offset: u64, len: u64, stripe_id: u128) -> NewExtent {
    NewExtent {
        offset,
        len,
        stripe: stripe(stripe_id, len),
    }
}

impl Kit {
    pub(crate) fn new() -> Kit {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = NamespaceStore::open(&dir.path().join("meta.redb")).expect("open");
        Kit {
            dir,
            store,
            clock: 100,
            stamped: false,
        }
    }

    /// A kit whose applies drive the cluster clock with `clock`.
    pub(crate) fn stamped() -> Kit {
        Kit {
            stamped: true,
            ..Kit::new()
        }
    }

    /// Drops and reopens the store from its file.
    pub(crate) fn restart(self) -> Kit {
        let Kit {
            dir,
            store,
            clock,
            stamped,
        } = self;
        drop(store);
        let store = NamespaceStore::open(&dir.path().join("meta.redb")).expect("reopen");
        Kit {
            dir,
            store,
            clock,
            stamped,
        }
    }

    pub(crate) fn run_with(&mut self, id: Option<RequestId>, command: Command) -> Outcome {
        self.clock += 1;
        let proposal = Proposal {
            id,
            now: at(self.clock),
            command,
        };
        let batch = Batch {
            proposals: vec![proposal],
            stamp: self.stamped.then(|| self.stamp()),
        };
        let mut out = self.store.apply(&[batch], b"marker").expect("apply");
        out.remove(0).remove(0)
    }

    /// The leader stamp of the next apply: one leader run whose clock is `clock`.
    pub(crate) fn stamp(&self) -> LeaderStamp {
        LeaderStamp {
            run: 1,
            millis: u64::try_from(self.clock).expect("positive clock") * 1000,
        }
    }

    /// The sessions table: (client, cluster clock of its last request).
    pub(crate) fn sessions(&self) -> Vec<(u64, u64)> {
        use redb::{ReadableDatabase, ReadableTable};
        let txn = self.store.db.begin_read().expect("read");
        let table = txn.open_table(crate::record::SESSIONS).expect("sessions");
        table
            .iter()
            .expect("iter")
            .map(|row| {
                let (k, v) = row.expect("row");
                (
                    k.value(),
                    crate::record::decode(v.value(), "session").expect("decode"),
                )
            })
            .collect()
    }

    pub(crate) fn run(&mut self, command: Command) -> Outcome {
        self.run_with(None, command)
    }

    pub(crate) fn ok_attr(&mut self, command: Command) -> FileAttr {
        match self.run(command) {
            Outcome::Attr(attr) => attr,
            other => panic!("expected an attr, got {other:?}"),
        }
    }

    pub(crate) fn fail(&mut self, command: Command) -> FsError {
        match self.run(command) {
            Outcome::Failed(e) => e,
            other => panic!("expected a failure, got {other:?}"),
        }
    }

    pub(crate) fn mknode(&mut self, parent: Ino, name: &str, kind: FileKind) -> FileAttr {
        self.ok_attr(mknode_cmd(parent, name, kind))
    }

    pub(crate) fn mkdir(&mut self, parent: Ino, name: &str) -> Ino {
        self.mknode(parent, name, FileKind::Dir).ino
    }

    pub(crate) fn mkfile(&mut self, parent: Ino, name: &str) -> Ino {
        self.mknode(parent, name, FileKind::File).ino
    }

    pub(crate) fn rename(
        &mut self,
        parent: Ino,
        name: &str,
        new_parent: Ino,
        new_name: &str,
        flags: RenameFlags,
    ) -> Outcome {
        self.run(Command::Rename {
            parent,
            name: name.into(),
            new_parent,
            new_name: new_name.into(),
            flags,
        })
    }

    pub(crate) fn write_extents(&mut self, ino: Ino, extents: Vec<NewExtent>) -> Outcome {
        self.run(Command::WriteExtents {
            ino,
            inline_version: None,
            extents,
        })
    }

    pub(crate) fn names(&self, dir: Ino) -> Vec<String> {
        let entries = self.store.readdir(dir).expect("readdir");
        entries.into_iter().map(|e| e.name).collect()
    }

    pub(crate) fn nlink(&self, ino: Ino) -> u32 {
        self.store.getattr(ino).expect("getattr").nlink
    }

    pub(crate) fn root_nlink(&self) -> u32 {
        self.nlink(ROOT_INO)
    }

    /// Garbage stripe ids, in order.
    pub(crate) fn garbage_ids(&self) -> Vec<u128> {
        let garbage = self.store.garbage(None, usize::MAX).expect("garbage");
        garbage.into_iter().map(|r| r.id.0).collect()
    }
}

pub(crate) fn mknode_cmd(parent: Ino, name: &str, kind: FileKind) -> Command {
    Command::MkNode {
        parent,
        name: name.into(),
        kind,
        perm: 0o644,
        owner: Owner {
            uid: 1000,
            gid: 1000,
        },
        rdev: 0,
        target: (kind == FileKind::Symlink).then(|| "target".to_owned()),
    }
}
