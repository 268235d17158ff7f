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
