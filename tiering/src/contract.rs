//! The contract every [`ColdStore`] keeps, as one suite: run against the local directory
//! and the fault-injecting wrapper here, and against a real S3 server in the multi-node
//! tests. Panics on the first broken promise. `scope` keeps runs on one store apart.

use bytes::Bytes;

use crate::{ColdStore, TierError};

/// Runs the whole contract on `store` under keys starting with `scope/`.
pub async fn run(store: &dyn ColdStore, scope: &str) {
    let key = |name: &str| format!("{scope}/{name}");
    let data: Bytes = (0..3 * 1024 * 1024u32)
        .map(|i| (i * 7 % 251) as u8)
        .collect();

    // Absent keys: no size, a read is NotFound, a delete succeeds.
    assert_eq!(store.size(&key("none")).await.expect("size"), None);
    match store.get_range(&key("none"), 0..10).await {
        Err(TierError::NotFound(_)) => {}
        other => panic!("a read of a missing key answered {other:?}"),
    }
    store
        .delete(&key("none"))
        .await
        .expect("delete of a missing key");

    // Put, then whole and ranged reads return exactly the bytes asked for.
    store.put(&key("a"), data.clone()).await.expect("put");
    assert_eq!(
        store.size(&key("a")).await.expect("size"),
        Some(data.len() as u64)
    );
    let len = data.len() as u64;
    for range in [0..len, 0..1, 4095..4097, len - 1..len, 1_000_000..2_500_000] {
        let got = store
            .get_range(&key("a"), range.clone())
            .await
            .expect("range");
        assert_eq!(
            &got[..],
            &data[range.start as usize..range.end as usize],
            "bytes {range:?}"
        );
    }
    assert!(
        store
            .get_range(&key("a"), 0..0)
            .await
            .expect("empty")
            .is_empty(),
        "an empty range"
    );
    // A range past the end is not silently short.
    assert!(
        store
            .get_range(&key("a"), len - 10..len + 10)
            .await
            .is_err(),
        "a range past the end must fail"
    );

    // A put replaces the whole object.
    store
        .put(&key("a"), Bytes::from_static(b"short"))
        .await
        .expect("overwrite");
    assert_eq!(store.size(&key("a")).await.expect("size"), Some(5));
    assert_eq!(
        &store.get_range(&key("a"), 0..5).await.expect("read")[..],
        b"short"
    );

    // Listing under a prefix finds what is there, with sizes, and nothing else.
    store
        .put(&key("dir/b"), data.slice(..100))
        .await
        .expect("put b");
    store
        .put(&key("dir/c"), data.slice(..200))
        .await
        .expect("put c");
    let mut listed = store.list(&key("dir")).await.expect("list");
    listed.sort();
    assert_eq!(
        listed,
        vec![(key("dir/b"), 100), (key("dir/c"), 200)],
        "listing of {scope}/dir"
    );

    // Deletes remove, and are idempotent.
    for k in ["a", "dir/b", "dir/c"] {
        store.delete(&key(k)).await.expect("delete");
        store.delete(&key(k)).await.expect("delete again");
        assert_eq!(
            store.size(&key(k)).await.expect("size"),
            None,
            "{k} deleted"
        );
    }
    assert!(store.list(&key("dir")).await.expect("list").is_empty());
    assert!(!store.describe().is_empty());
}
