//! Random operation sequences with restarts, checked against a BTreeMap; and crash
//! leftovers (half-written, unindexed, damaged files) handled at start.

use std::collections::BTreeMap;

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use shoal_store::{DiskStore, Ring, ShardKey, ShardStore, StoreError};

const LIMIT: u64 = 4 << 20;

async fn open(dir: &std::path::Path, ring: &Ring) -> DiskStore {
    DiskStore::open(dir, LIMIT, ring.clone())
        .await
        .expect("open")
        .0
}

#[tokio::test]
async fn random_operations_with_restarts_match_a_model() {
    let seed: u64 = std::env::var("SHOAL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5ea_5eed);
    eprintln!("model seed {seed} (replay with SHOAL_SEED={seed})");
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().expect("tempdir");
    let ring = Ring::start(32).expect("io_uring");
    let mut store = open(dir.path(), &ring).await;
    let mut model: BTreeMap<ShardKey, Bytes> = BTreeMap::new();
    for step in 0..400 {
        let key = ShardKey {
            stripe: rng.random_range(0..12u128),
            index: rng.random_range(0..3u8),
        };
        match rng.random_range(0..10) {
            0..=3 => {
                let len = rng.random_range(0..150_000usize);
                let fill: u8 = rng.random();
                let data = Bytes::from(vec![fill; len]);
                let got = store.put(key, data.clone()).await;
                match (model.get(&key), got) {
                    (Some(old), Ok(())) => {
                        assert_eq!(*old, data, "step {step}: overwrite accepted")
                    }
                    (Some(_), Err(StoreError::Conflict(_))) => {}
                    (None, Ok(())) => {
                        model.insert(key, data);
                    }
                    (None, Err(StoreError::Full { .. })) => {}
                    (m, r) => panic!(
                        "seed {seed} step {step}: model {:?} store {r:?}",
                        m.map(Bytes::len)
                    ),
                }
            }
            4..=6 => {
                let got = store.get(key, 0, None).await;
                match (model.get(&key), got) {
                    (Some(want), Ok(have)) => assert_eq!(*want, have, "seed {seed} step {step}"),
                    (None, Err(StoreError::NotFound(_))) => {}
                    (m, r) => panic!(
                        "seed {seed} step {step}: model {:?} store {:?}",
                        m.map(Bytes::len),
                        r.map(|b| b.len())
                    ),
                }
            }
            7..=8 => {
                let existed = store.delete(key).await.expect("delete");
                assert_eq!(
                    existed,
                    model.remove(&key).is_some(),
                    "seed {seed} step {step}"
                );
            }
            _ => {
                drop(store);
                store = open(dir.path(), &ring).await;
            }
        }
        let listed: Vec<ShardKey> = store.list().into_iter().map(|(k, _)| k).collect();
        let want: Vec<ShardKey> = model.keys().copied().collect();
        assert_eq!(listed, want, "seed {seed} step {step}: listing differs");
        assert!(store.usage().used_bytes <= LIMIT);
    }
}

#[tokio::test]
async fn crash_leftovers_are_detected_discarded_and_reported() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ring = Ring::start(32).expect("io_uring");
    let good = ShardKey {
        stripe: 7,
        index: 0,
    };
    let unindexed = ShardKey {
        stripe: 8,
        index: 1,
    };
    {
        let store = open(dir.path(), &ring).await;
        store
            .put(good, Bytes::from_static(b"durable shard"))
            .await
            .expect("put");
        store
            .put(
                unindexed,
                Bytes::from_static(b"renamed, index not committed"),
            )
            .await
            .expect("put");
    }
    let shards = dir.path().join("shards");
    // A crash between rename and index commit: the file exists, the index does not know it.
    let unindexed_bytes = std::fs::read(shards.join(unindexed.to_string())).expect("read");
    std::fs::remove_file(shards.join(unindexed.to_string())).expect("rm");
    {
        let store = open(dir.path(), &ring).await;
        store.delete(unindexed).await.expect("forget");
    }
    std::fs::write(shards.join(unindexed.to_string()), &unindexed_bytes).expect("restore file");
    // A crash mid-write leaves a partial temp file.
    std::fs::write(
        shards.join(format!(
            "{}.tmp",
            ShardKey {
                stripe: 9,
                index: 0
            }
        )),
        b"SHRD partial",
    )
    .expect("write");
    // A torn, unindexed file.
    let torn = ShardKey {
        stripe: 10,
        index: 2,
    };
    std::fs::write(shards.join(torn.to_string()), &unindexed_bytes[..20]).expect("write");

    let (store, recovery) = DiskStore::open(dir.path(), LIMIT, ring.clone())
        .await
        .expect("open");
    assert_eq!(recovery.discarded_partial.len(), 1, "{recovery:?}");
    assert_eq!(recovery.reindexed, 1, "{recovery:?}");
    assert_eq!(
        recovery.removed_corrupt,
        vec![torn.to_string()],
        "{recovery:?}"
    );
    assert_eq!(
        store.get(good, 0, None).await.expect("good"),
        Bytes::from_static(b"durable shard")
    );
    assert_eq!(
        store.get(unindexed, 0, None).await.expect("reindexed"),
        Bytes::from_static(b"renamed, index not committed")
    );
    assert!(matches!(
        store.get(torn, 0, None).await,
        Err(StoreError::NotFound(_))
    ));
}

#[tokio::test]
async fn flipped_bytes_on_disk_are_reported_as_corrupt() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ring = Ring::start(32).expect("io_uring");
    let store = open(dir.path(), &ring).await;
    let key = ShardKey {
        stripe: 0xabc,
        index: 3,
    };
    store
        .put(key, Bytes::from(vec![7u8; 100_000]))
        .await
        .expect("put");
    let path = dir.path().join("shards").join(key.to_string());
    let mut bytes = std::fs::read(&path).expect("read");
    bytes[5_000] ^= 0x40;
    std::fs::write(&path, bytes).expect("write");
    match store.get(key, 0, None).await {
        Err(StoreError::Corrupt { key: k, reason }) => {
            assert_eq!(k, key);
            assert!(reason.contains("checksum"), "{reason}");
        }
        other => panic!("corruption not detected: {other:?}"),
    }
}
