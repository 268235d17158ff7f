//! Golden bytes of the log and snapshot formats: a change to any type the log or a
//! snapshot carries (this crate's own, or placement's) changes these bytes and fails here,
//! so it can only happen as a deliberate format change with a version bump.

use shoal_placement::{EcProfile, Layout, LayoutNode, NodeId, StripeId};

use crate::format::{
    ColdLocation, FileKind, Owner, RenameFlags, RequestId, SetAttr, SetTime, ShardLocation,
    StripeRecord, Timestamp,
};
use crate::{Batch, Command, LeaderStamp, LeasedChange, LeasedOp, NewExtent, Proposal, ShardMove};

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn at(secs: i64) -> Timestamp {
    Timestamp { secs, nanos: 7 }
}

fn cold() -> ColdLocation {
    ColdLocation {
        object: 0x0a0b,
        offset: 16,
        len: 100,
        crc32c: 0xfeed,
    }
}

/// One batch holding one of each kind of command, with a stamp.
fn every_command() -> Batch {
    let stripe = StripeRecord {
        id: StripeId(0x0102_0304),
        len: 100,
        ec: EcProfile { k: 2, m: 1 },
        shard_len: 50,
        epoch: 3,
        shards: (0..3)
            .map(|index| ShardLocation {
                index,
                node: NodeId(10 + u64::from(index)),
                crc32c: 0xdead_beef,
            })
            .collect(),
    };
    let layout = Layout::new(4, vec![LayoutNode::active(NodeId(10), "fd1", 5)]).expect("layout");
    let commands = vec![
        Command::MkNode {
            parent: 1,
            name: "a".into(),
            kind: FileKind::Symlink,
            perm: 0o755,
            owner: Owner { uid: 1, gid: 2 },
            rdev: 0,
            target: Some("t".into()),
        },
        Command::Link {
            ino: 2,
            new_parent: 1,
            new_name: "b".into(),
        },
        Command::Unlink {
            parent: 1,
            name: "b".into(),
        },
        Command::Rmdir {
            parent: 1,
            name: "d".into(),
        },
        Command::Rename {
            parent: 1,
            name: "a".into(),
            new_parent: 1,
            new_name: "c".into(),
            flags: RenameFlags {
                noreplace: true,
                exchange: false,
            },
        },
        Command::SetAttr {
            ino: 2,
            set: SetAttr {
                perm: Some(0o600),
                size: Some(9),
                mtime: Some(SetTime::At(at(5))),
                atime: Some(SetTime::Now),
                ..SetAttr::default()
            },
        },
        Command::WriteInline {
            ino: 2,
            offset: 0,
            data: vec![1, 2, 3],
            max_inline: 65536,
        },
        Command::WriteExtents {
            ino: 2,
            inline_version: Some(4),
            extents: vec![NewExtent {
                offset: 0,
                len: 100,
                stripe: stripe.clone(),
            }],
        },
        Command::Purge { ino: 2 },
        Command::StripesFreed {
            ids: vec![StripeId(5)],
        },
        Command::SetLayout { layout },
        Command::AbandonStripes {
            ids: vec![StripeId(6)],
        },
        Command::RecordGenerations {
            generations: vec![(NodeId(10), 8)],
        },
        Command::RelocateShards {
            stripe: StripeId(0x0102_0304),
            moves: vec![ShardMove {
                index: 2,
                from: NodeId(12),
                to: NodeId(13),
                crc32c: 0xdead_beef,
            }],
        },
        Command::DisownShards {
            node: NodeId(13),
            shards: vec![(StripeId(0x0102_0304), 2)],
        },
        Command::ChangeNode {
            node: NodeId(10),
            change: crate::nodes::NodeChange::Drain {
                stripes: 3,
                bytes: 300,
            },
        },
        Command::TierStripes {
            object: 0x0a0b,
            size: 4096,
            stripes: vec![(StripeId(0x0102_0304), cold())],
        },
        Command::ObjectsDeleted {
            objects: vec![0x0c0d],
        },
        Command::RecordReads { inos: vec![2, 3] },
        Command::SetPin {
            ino: 2,
            pinned: true,
        },
        Command::RevokeCertificates {
            name: "gpu7".into(),
            node: NodeId(0x0a0b),
            before_ms: 1_700_000_000_000,
        },
        Command::WarmStripe {
            ino: 2,
            stripe: StripeId(0x0102_0304),
            warm: StripeRecord {
                id: StripeId(0x0708),
                ..stripe.clone()
            },
        },
        Command::RelocateShardsPlanned {
            stripe: StripeId(0x0102_0304),
            moves: vec![ShardMove {
                index: 1,
                from: NodeId(11),
                to: NodeId(14),
                crc32c: 0xbeef,
            }],
            planned_at_ms: 86_400_000,
        },
    ];
    numbered(
        commands,
        1_000,
        Some(LeaderStamp {
            run: 77,
            millis: 88,
        }),
    )
}

/// `commands` as one batch, proposed as requests 0, 1, ... of client 9 at seconds
/// `from`, `from + 1`, ...
fn numbered(commands: Vec<Command>, from: i64, stamp: Option<LeaderStamp>) -> Batch {
    Batch {
        proposals: commands
            .into_iter()
            .enumerate()
            .map(|(i, command)| Proposal {
                id: Some(RequestId {
                    client: 9,
                    seq: i as u64,
                }),
                now: at(from + i as i64),
                command,
            })
            .collect(),
        stamp,
    }
}

#[test]
fn the_log_format_is_pinned() {
    let bytes = postcard::to_allocvec(&every_command()).expect("encode");
    assert_eq!(
        hex(&bytes),
        GOLDEN_BATCH,
        "the log format changed: bump the log record version"
    );
    let back: Batch = postcard::from_bytes(&bytes).expect("decode");
    assert_eq!(back, every_command());
}

#[test]
fn the_snapshot_format_is_pinned() {
    let mut kit = crate::testkit::Kit::stamped();
    let store = &kit.store;
    store.apply(&[every_command()], b"marker").expect("apply");
    kit.clock += 1;
    // A live stripe with a relocated shard and a disowned copy, so those rows are pinned.
    let f = kit.mkfile(shoal_agent_api::ROOT_INO, "f");
    kit.write_extents(f, vec![crate::testkit::extent(0, 10, 0x0506)]);
    kit.run(Command::RelocateShards {
        stripe: StripeId(0x0506),
        moves: vec![ShardMove {
            index: 1,
            from: NodeId(2),
            to: NodeId(7),
            crc32c: 9,
        }],
    });
    kit.run(Command::DisownShards {
        node: NodeId(2),
        shards: vec![(StripeId(0x0506), 1)],
    });
    // A cold stripe in an object, a garbage object and a recorded read.
    let g = kit.mkfile(shoal_agent_api::ROOT_INO, "g");
    kit.write_extents(g, vec![crate::testkit::extent(0, 100, 0x0102_0304)]);
    kit.run(Command::TierStripes {
        object: 0x0e0f,
        size: 4096,
        stripes: vec![(
            StripeId(0x0102_0304),
            ColdLocation {
                object: 0x0e0f,
                ..cold()
            },
        )],
    });
    kit.run(Command::TierStripes {
        object: 0x1011,
        size: 512,
        stripes: vec![],
    });
    kit.run(Command::RecordReads { inos: vec![f] });
    kit.run(Command::SetPin {
        ino: f,
        pinned: true,
    });
    kit.run(Command::RevokeCertificates {
        name: "gpu7".into(),
        node: NodeId(0x0a0b),
        before_ms: 1_700_000_000_000,
    });
    let snap = kit.store.snapshot().expect("snapshot");
    assert_eq!(
        hex(&snap),
        GOLDEN_SNAPSHOT,
        "the snapshot format changed: bump its version"
    );
}

/// One batch of each directory-lease command (each change of a leased batch once), with
/// request ids, so the snapshot below also pins their outcomes in the dedup rows.
fn lease_commands() -> Batch {
    let op = |epoch, change| LeasedOp {
        dir: 2,
        epoch,
        now: at(9),
        change,
    };
    let changes = vec![
        LeasedChange::MkNode {
            ino: 3,
            name: "f".into(),
            kind: FileKind::File,
            perm: 0o644,
            owner: Owner { uid: 1, gid: 2 },
            rdev: 0,
            target: None,
        },
        LeasedChange::Link {
            ino: 3,
            name: "h".into(),
        },
        LeasedChange::WriteInline {
            ino: 3,
            offset: 0,
            data: b"xy".to_vec(),
            max_inline: 64,
        },
        LeasedChange::SetAttr {
            ino: 3,
            set: SetAttr {
                perm: Some(0o600),
                ..SetAttr::default()
            },
        },
        LeasedChange::Rename {
            name: "h".into(),
            new_dir: 2,
            new_epoch: 1,
            new_name: "g".into(),
            flags: RenameFlags::default(),
        },
        LeasedChange::Unlink { name: "g".into() },
        LeasedChange::Rmdir {
            name: "none".into(),
        },
    ];
    let commands = vec![
        Command::MkNode {
            parent: 1,
            name: "d".into(),
            kind: FileKind::Dir,
            perm: 0o755,
            owner: Owner { uid: 1, gid: 2 },
            rdev: 0,
            target: None,
        },
        Command::TakeInos {
            holder: NodeId(10),
            count: 4,
        },
        Command::TakeDirLease {
            dir: 2,
            holder: NodeId(10),
        },
        Command::LeasedBatch {
            holder: NodeId(10),
            ops: changes.into_iter().map(|c| op(1, c)).collect(),
        },
        Command::TakeDirLease {
            dir: 1,
            holder: NodeId(11),
        },
        Command::ReturnDirLease { dir: 1, epoch: 2 },
    ];
    numbered(commands, 2_000, None)
}

#[test]
fn the_lease_formats_are_pinned() {
    let bytes = postcard::to_allocvec(&lease_commands()).expect("encode");
    assert_eq!(
        hex(&bytes),
        GOLDEN_LEASE_BATCH,
        "the log format changed: bump the log record version"
    );
    let back: Batch = postcard::from_bytes(&bytes).expect("decode");
    assert_eq!(back, lease_commands());
    let kit = crate::testkit::Kit::new();
    let out = kit
        .store
        .apply(&[lease_commands()], b"marker")
        .expect("apply");
    assert!(
        matches!(&out[0][3], crate::Outcome::Batch(o) if o.len() == 7),
        "{out:?}"
    );
    let snap = kit.store.snapshot().expect("snapshot");
    assert_eq!(snap[4], 8);
    assert_eq!(
        hex(&snap),
        GOLDEN_LEASE_SNAPSHOT,
        "the snapshot format changed: bump its version"
    );
}

/// A holder's extent write (`LeasedChange::WriteExtents`, added after the other ops: a
/// new variant index, the bytes above unchanged).
fn leased_extent_write() -> Batch {
    let stripe = StripeRecord {
        id: StripeId(0x0506),
        len: 100,
        ec: EcProfile { k: 2, m: 1 },
        shard_len: 50,
        epoch: 3,
        shards: (0..3)
            .map(|index| ShardLocation {
                index,
                node: NodeId(10 + u64::from(index)),
                crc32c: 0xabc0 + u32::from(index),
            })
            .collect(),
    };
    let ops = vec![LeasedOp {
        dir: 2,
        epoch: 1,
        now: at(9),
        change: LeasedChange::WriteExtents {
            ino: 3,
            inline_version: None,
            extents: vec![NewExtent {
                offset: 0,
                len: 100,
                stripe,
            }],
            commit_by_ms: 61_000,
        },
    }];
    let commands = vec![Command::LeasedBatch {
        holder: NodeId(10),
        ops,
    }];
    numbered(commands, 3_000, None)
}

#[test]
fn the_leased_extent_write_is_pinned() {
    let bytes = postcard::to_allocvec(&leased_extent_write()).expect("encode");
    assert_eq!(
        hex(&bytes),
        GOLDEN_LEASED_EXTENT_WRITE,
        "the log format changed: bump the log record version"
    );
    let back: Batch = postcard::from_bytes(&bytes).expect("decode");
    assert_eq!(back, leased_extent_write());
}

const GOLDEN_LEASED_EXTENT_WRITE: &str = "01010900f02e071b0a0102011207070300010064860a6403322b31320303000ac0d702010bc1d702020cc2d702c8dc0300";
const GOLDEN_LEASE_BATCH: &str = concat!(
    "06010900a01f070001016401ed0301020000010901a21f071a0a04010902a41f0718020a010903a6",
    "1f071b0a07020112070003016600a403010200000201120701030168020112070603000278794002",
    "0112070503018003000000000002011207040168020101670000020112070201670201120703046e",
    "6f6e65010904a81f0718010b010905aa1f0719010200",
);
const GOLDEN_LEASE_SNAPSHOT: &str = concat!(
    "53484d530801066d61726b65720700030101ed0303000000a01f07a01f07a01f0700000100000201",
    "ed0302010200a01f0712071207000001000003008003010102021207120712070001000002787902",
    "0101640201020166030000000000060900000201ed0302010200a01f07a01f07a01f070009010d03",
    "0709020b0109030e07000300a4030101020012071207120700000300a40302010200120712071207",
    "00000300a4030201020212071207120700000300800302010202120712071207000101040009040b",
    "020905010109000000000000000000000000000001030000000002010a01030704ffb568e6",
);
const GOLDEN_BATCH: &str = concat!(
    "17010900d00f070001016102ed03010200010174010901d20f070102010162010902d40f07020101",
    "62010903d60f0703010164010904d80f07040101610101630100010905da0f070502018003000001",
    "09010001010a07010906dc0f0706020003010203808004010907de0f070702010401006484868808",
    "6403322b31320303000aeffdb6f50d010beffdb6f50d020ceffdb6f50d010908e00f070802010909",
    "e20f0709010501090ae40f070a04010a03666431050001090be60f070b010601090ce80f070c010a",
    "0801090dea0f070d8486880801020c0deffdb6f50d01090eec0f070e0d01848688080201090fee0f",
    "070f0a0003ac02010910f00f07108b14802001848688088b141064edfd03010911f20f0711018d18",
    "010912f40f0712020203010913f60f07150201010914f80f071604677075378b1480d095ffbc3101",
    "0915fa0f07130284868808880e6403322b31320303000aeffdb6f50d010beffdb6f50d020ceffdb6",
    "f50d010916fc0f07178486880801010b0eeffd0280b89929014d58",
);
const GOLDEN_SNAPSHOT: &str = concat!(
    "53484d530701066d61726b6572050105010a036664310501040101ed0302000000d00f07d40100d4",
    "010000000100000202ed0301010201d00f07d00f07d80f070000000174000300a40301e807e8070a",
    "cc0100ce0100ce010000010000000400a40301e807e80764d40100d60100d6010000010000000301",
    "01630202010166030001016704000203000a00860a040064008486880802860a0a03322b31050103",
    "00010001070902030001848688086403322b31320103000000010000020000010000170900000202",
    "ed0301010201d00f07d00f07d00f07000901000202ed0302010201d00f07d00f07d20f0700090201",
    "0903040009040109050405090604050907040509080405090901090a01090b050106090c01090d04",
    "00090e0700090f01091009000911010912010913010914010915030916040001090000904e0180eb",
    "0601060000010a0801860a0102b81700010a010003ac020001848688088f1c1064edfd03018f1c80",
    "2001028b1480209120800403020003c03e0488270202030104677075378b1480d095ffbc319ca233",
    "1c",
);
