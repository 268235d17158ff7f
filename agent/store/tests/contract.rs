//! The shard-store contract against the real disk store (io_uring + redb) and the fake.

use shoal_store::contract::{LIMIT, run_all};
use shoal_store::{DiskStore, MemStore, Ring};

#[tokio::test]
async fn disk_store_keeps_the_contract() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ring = Ring::start(64).expect("io_uring");
    let (store, recovery) = DiskStore::open(dir.path(), LIMIT, ring)
        .await
        .expect("open");
    assert_eq!(recovery, Default::default());
    run_all(&store).await;
}

#[tokio::test]
async fn mem_store_keeps_the_contract() {
    run_all(&MemStore::new(LIMIT)).await;
}

#[tokio::test]
async fn a_mem_store_whose_limit_drops_refuses_new_puts_and_keeps_what_it_holds() {
    use shoal_store::{ShardKey, ShardStore, StoreError};
    let store = MemStore::new(LIMIT);
    let key = |stripe| ShardKey { stripe, index: 0 };
    let data = bytes::Bytes::from(vec![3u8; 1000]);
    store.put(key(1), data.clone()).await.expect("put");
    store.set_limit(store.usage().used_bytes);
    match store.put(key(2), data.clone()).await {
        Err(StoreError::Full { .. }) => {}
        other => panic!("a put into a full store answered {other:?}"),
    }
    assert_eq!(store.get(key(1), 0, None).await.expect("get"), data);
    store.set_limit(LIMIT);
    store.put(key(2), data).await.expect("room again");
}

#[tokio::test]
async fn disk_store_with_direct_io_keeps_the_contract_and_reopens() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ring = Ring::start(64).expect("io_uring");
    let Ok((store, _)) = DiskStore::open_with(dir.path(), LIMIT * 2, ring.clone(), true).await
    else {
        // The suite is meant for a filesystem with O_DIRECT (ext4/xfs, as on NVMe nodes).
        panic!(
            "O_DIRECT refused on the test filesystem at {}",
            dir.path().display()
        );
    };
    use shoal_store::{ShardKey, ShardStore};
    let key = ShardKey {
        stripe: 5,
        index: 1,
    };
    let data = bytes::Bytes::from((0..100_001u32).map(|i| i as u8).collect::<Vec<_>>());
    store.put(key, data.clone()).await.expect("put");
    assert_eq!(store.get(key, 0, None).await.expect("get"), data);
    assert_eq!(
        store.get(key, 99_000, Some(1_001)).await.expect("tail"),
        data.slice(99_000..)
    );
    // Padded to 4 KiB on disk.
    let on_disk = std::fs::metadata(dir.path().join("shards").join(key.to_string()))
        .expect("stat")
        .len();
    assert_eq!(on_disk % 4096, 0);
    drop(store);
    let (store, recovery) = DiskStore::open_with(dir.path(), LIMIT * 2, ring, true)
        .await
        .expect("reopen");
    assert_eq!(recovery, Default::default());
    assert_eq!(
        store.get(key, 0, None).await.expect("get after reopen"),
        data
    );
    store.delete(key).await.expect("delete");
}

#[tokio::test]
async fn disk_store_with_direct_io_passes_the_whole_contract() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ring = Ring::start(64).expect("io_uring");
    let (store, _) = DiskStore::open_with(dir.path(), LIMIT, ring, true)
        .await
        .expect("open");
    run_all(&store).await;
}
