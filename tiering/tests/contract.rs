//! The cold-store contract against the local directory, memory and the fault-injecting wrapper,
//! and the wrapper's faults themselves. (The same suite runs against a real S3 server in
//! `tests/tests/tiering.rs`.)

use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use shoal_tiering::{ColdStore, Faulty, ObjectBackend, TierError, contract};

fn dir_store() -> (tempfile::TempDir, ObjectBackend) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = ObjectBackend::dir(&dir.path().join("cold")).expect("dir store");
    (dir, store)
}

#[tokio::test]
async fn the_directory_store_keeps_the_contract() {
    let (_dir, store) = dir_store();
    contract::run(&store, "one").await;
    // Runs in other scopes see nothing of each other.
    contract::run(&store, "two").await;
}

#[tokio::test]
async fn the_memory_store_keeps_the_contract() {
    let store = ObjectBackend::memory();
    contract::run(&store, "one").await;
    contract::run(&store, "two").await;
}

#[tokio::test]
async fn the_fault_wrapper_keeps_the_contract_while_its_faults_are_off() {
    let (_dir, store) = dir_store();
    let faulty = Faulty::new(store);
    contract::run(&faulty, "f").await;
    assert!(faulty.gets.load(Ordering::SeqCst) > 0);
}

#[tokio::test]
async fn injected_faults_fail_as_an_outage_does_and_partial_puts_are_short() {
    let (_dir, store) = dir_store();
    let faulty = Faulty::new(store);
    let data = Bytes::from(vec![5u8; 1000]);

    faulty.set_outage(true);
    let err = faulty.put("k", data.clone()).await.expect_err("outage");
    assert!(err.is_retryable(), "{err}");
    assert!(faulty.get_range("k", 0..1).await.is_err());
    faulty.set_outage(false);

    faulty.fail_puts(1);
    assert!(faulty.put("k", data.clone()).await.is_err());
    assert_eq!(
        faulty.size("k").await.expect("size"),
        None,
        "a failed put stores nothing"
    );

    faulty.truncate_puts(1);
    faulty
        .put("k", data.clone())
        .await
        .expect("a partial put reports success");
    assert_eq!(faulty.size("k").await.expect("size"), Some(500));
    faulty.put("k", data.clone()).await.expect("put");
    assert_eq!(faulty.size("k").await.expect("size"), Some(1000));

    faulty.set_latency(Duration::from_millis(50));
    let started = std::time::Instant::now();
    faulty.size("k").await.expect("size");
    assert!(started.elapsed() >= Duration::from_millis(50));
}

#[tokio::test]
async fn a_refusing_store_is_not_worth_retrying() {
    // A directory store cannot be created under a file.
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("f");
    std::fs::write(&file, b"x").expect("write");
    match ObjectBackend::dir(&file.join("sub")) {
        Err(e @ TierError::Config { .. }) => assert!(!e.is_retryable()),
        other => panic!("expected a config error, got {other:?}"),
    }
}
