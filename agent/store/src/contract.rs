//! The contract every [`ShardStore`] keeps; run against [`crate::DiskStore`] and
//! [`crate::MemStore`]. Each check panics with what broke. The store passed in must be empty
//! and have a limit of [`LIMIT`] bytes.

use bytes::Bytes;

use crate::{HEADER_LEN, ShardKey, ShardStore, StoreError};

/// The fill limit the suite expects the store under test to have.
pub const LIMIT: u64 = 1 << 20;

fn key(stripe: u128, index: u8) -> ShardKey {
    ShardKey { stripe, index }
}

fn bytes(n: usize, seed: u8) -> Bytes {
    Bytes::from(
        (0..n)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect::<Vec<_>>(),
    )
}

pub async fn run_all<S: ShardStore>(s: &S) {
    put_then_get_returns_the_bytes(s).await;
    ranges_and_bad_ranges(s).await;
    checked_ranges_verify_against_the_whole_checksum(s).await;
    same_bytes_twice_is_accepted_other_bytes_refused(s).await;
    delete_removes(s).await;
    a_walk_in_pages_sees_every_shard_once_in_order(s).await;
    full_store_refuses_and_keeps_what_it_has(s).await;
}

pub async fn a_walk_in_pages_sees_every_shard_once_in_order<S: ShardStore>(s: &S) {
    let mut want = Vec::new();
    for stripe in [5u128, 2, 9] {
        for index in [1u8, 0] {
            s.put(key(stripe, index), bytes(100, index))
                .await
                .expect("put");
            want.push(key(stripe, index));
        }
    }
    want.sort();
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let page = s.list_after(after, 4);
        assert!(page.len() <= 4);
        let Some(last) = page.last() else { break };
        after = Some(last.0);
        seen.extend(page.iter().map(|(k, len)| {
            assert_eq!(*len, 100);
            *k
        }));
    }
    assert_eq!(seen, want);
    assert_eq!(
        s.list_after(Some(key(5, 1)), 10),
        vec![(key(9, 0), 100), (key(9, 1), 100)]
    );
    for k in want {
        s.delete(k).await.expect("delete");
    }
}

pub async fn put_then_get_returns_the_bytes<S: ShardStore>(s: &S) {
    let data = bytes(70_000, 1);
    s.put(key(1, 0), data.clone()).await.expect("put");
    assert_eq!(s.get(key(1, 0), 0, None).await.expect("get"), data);
    assert!(matches!(
        s.get(key(1, 1), 0, None).await,
        Err(StoreError::NotFound(_))
    ));
    assert_eq!(s.list(), vec![(key(1, 0), 70_000)]);
    assert_eq!(s.usage().shards, 1);
    // Header and data, plus alignment padding where the store writes with O_DIRECT.
    let used = s.usage().used_bytes;
    let min = 70_000 + HEADER_LEN as u64;
    assert!(
        (min..min + 4096).contains(&used),
        "used {used} for one 70 000-byte shard"
    );
}

/// A checked range (blocks and table) verifies against the checksum of the whole data, as
/// a reader does with the record's, and yields the bytes asked for.
pub async fn checked_ranges_verify_against_the_whole_checksum<S: ShardStore>(s: &S) {
    let data = bytes(70_000, 1);
    let crc = crc32c::crc32c(&data);
    for (offset, len) in [(100, 50), (65_530, 20), (69_990, 10), (0, 70_000), (5, 0)] {
        let r = s
            .get_checked(key(1, 0), offset, len)
            .await
            .expect("checked range");
        let got = r.verify(crc, offset, len).expect("verifies");
        assert_eq!(got, data.slice(offset as usize..(offset + len) as usize));
    }
    assert!(matches!(
        s.get_checked(key(1, 0), 69_990, 11).await,
        Err(StoreError::OutOfRange { .. })
    ));
    assert!(matches!(
        s.get_checked(key(99, 0), 0, 1).await,
        Err(StoreError::NotFound(_))
    ));
}

pub async fn ranges_and_bad_ranges<S: ShardStore>(s: &S) {
    let data = bytes(70_000, 1);
    assert_eq!(
        s.get(key(1, 0), 100, Some(50)).await.expect("range"),
        data.slice(100..150)
    );
    assert_eq!(
        s.get(key(1, 0), 69_990, None).await.expect("tail"),
        data.slice(69_990..)
    );
    assert!(matches!(
        s.get(key(1, 0), 69_990, Some(11)).await,
        Err(StoreError::OutOfRange { .. })
    ));
    assert!(matches!(
        s.get(key(1, 0), u64::MAX, Some(2)).await,
        Err(StoreError::OutOfRange { .. })
    ));
}

pub async fn same_bytes_twice_is_accepted_other_bytes_refused<S: ShardStore>(s: &S) {
    s.put(key(1, 0), bytes(70_000, 1))
        .await
        .expect("idempotent put");
    assert!(matches!(
        s.put(key(1, 0), bytes(70_000, 2)).await,
        Err(StoreError::Conflict(_))
    ));
    assert_eq!(
        s.get(key(1, 0), 0, None).await.expect("get"),
        bytes(70_000, 1)
    );
}

pub async fn delete_removes<S: ShardStore>(s: &S) {
    assert!(s.delete(key(1, 0)).await.expect("delete"));
    assert!(!s.delete(key(1, 0)).await.expect("second delete"));
    assert!(matches!(
        s.get(key(1, 0), 0, None).await,
        Err(StoreError::NotFound(_))
    ));
    assert_eq!(s.usage().used_bytes, 0);
    assert!(s.list().is_empty());
}

pub async fn full_store_refuses_and_keeps_what_it_has<S: ShardStore>(s: &S) {
    let chunk = 200_000;
    let mut stored = Vec::new();
    for i in 0..10u128 {
        match s.put(key(100 + i, 0), bytes(chunk, i as u8)).await {
            Ok(()) => stored.push(i),
            Err(StoreError::Full { limit, .. }) => {
                assert_eq!(limit, LIMIT);
                break;
            }
            Err(e) => panic!("unexpected {e}"),
        }
    }
    assert_eq!(stored.len(), 5, "1 MiB holds five 200 kB shards");
    assert!(s.usage().used_bytes <= LIMIT);
    for i in stored {
        let got = s
            .get(key(100 + i, 0), 0, None)
            .await
            .expect("intact after full");
        assert_eq!(got, bytes(chunk, i as u8));
    }
}
