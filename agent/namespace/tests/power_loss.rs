//! The replica on a disk that loses what was not synced: applies durable and unflushed,
//! then a power cut. What comes back is the state after some apply since the last durable
//! one (never older, never a half-applied batch), and the store opens every time.

use std::path::Path;

use shoal_agent_api::ROOT_INO;
use shoal_disk::{Disk, SimDisk};
use shoal_namespace::format::{FileKind, Owner, Timestamp};
use shoal_namespace::{Batch, Command, NamespaceStore, Proposal};

fn mknod(parent: u64, name: String, secs: i64) -> Proposal {
    Proposal {
        id: None,
        now: Timestamp { secs, nanos: 0 },
        command: Command::MkNode {
            parent,
            name,
            kind: FileKind::File,
            perm: 0o644,
            owner: Owner { uid: 0, gid: 0 },
            rdev: 0,
            target: None,
        },
    }
}

#[test]
fn a_power_cut_leaves_the_replica_as_some_apply_since_the_last_durable_one_left_it() {
    let path = Path::new("/meta/state.redb");
    let mut cuts = 0;
    for seed in 0..24u64 {
        let disk = SimDisk::new(seed);
        disk.create_dir_all(Path::new("/meta")).expect("mkdir");
        let open = || {
            let file = disk.open(path, true).expect("file");
            NamespaceStore::open_on(file).expect("the replica opens after a power cut")
        };
        let mut store = open();
        disk.sync_dir(Path::new("/meta")).expect("sync dir");
        let digest = |s: &NamespaceStore| s.digest().expect("digest");
        // The states since the last durable apply: a power cut leaves one of them.
        let mut since_durable = vec![digest(&store)];
        let mut applied = 0u64;
        for round in 0..40u64 {
            let n = 1 + (seed + round) % 5;
            let batch = Batch::new(
                (0..n)
                    .map(|i| mknod(ROOT_INO, format!("f{round}-{i}"), round as i64))
                    .collect(),
            );
            applied += 1;
            let marker = applied.to_le_bytes();
            let durable = (seed * 7 + round) % 3 == 0;
            if durable {
                store.apply(&[batch], &marker).expect("apply");
                since_durable.clear();
            } else {
                store.apply_unflushed(&[batch], &marker).expect("apply");
            }
            since_durable.push(digest(&store));
            if (seed + round) % 9 == 8 {
                cuts += 1;
                disk.power_cut();
                drop(store);
                store = open();
                let got = digest(&store);
                assert!(
                    since_durable.contains(&got),
                    "seed {seed} round {round}: after a power cut the replica is at {:?}, \
                     no state it was in since its last durable apply",
                    got.0
                );
                since_durable = vec![got];
            }
        }
    }
    assert!(cuts > 50, "{cuts} power cuts");
}
