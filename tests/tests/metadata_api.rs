//! The filesystem API of the agent (what `shoal mount` speaks), end to end across real
//! agents: namespace changes through the Raft-replicated metadata, small files inline,
//! large files in erasure-coded stripes, reads from any node.

use shoal_agent_api::{FileKind, FsError, FsRequest, FsResponse, ROOT_INO, RenameFlags};
use shoal_tests::DevCluster;
use shoal_tests::fs_api::{Fs, pattern};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_and_data_are_shared_by_every_node() {
    let c = DevCluster::up(3, 34);
    let mut a = Fs::connect(&c, 1).await;
    let mut b = Fs::connect(&c, 3).await;

    let dir = a.mknod(ROOT_INO, "data", FileKind::Dir).await;
    let small = a.mknod(dir, "small", FileKind::File).await;
    let big = a.mknod(dir, "big", FileKind::File).await;

    // Small: inline, no stripes.
    let small_bytes = pattern(10_000, 1);
    assert_eq!(a.write(small, 0, small_bytes.clone()).await, 10_000);
    // Large: several stripes (a 3-node dev cluster writes 2+1 stripes of 2 MiB).
    let big_bytes = pattern(9 << 20, 2);
    let mut off = 0;
    for chunk in big_bytes.chunks(4 << 20) {
        off = a.write(big, off, chunk.to_vec()).await;
    }
    assert_eq!(off, 9 << 20);

    // Another node sees the names and reads identical bytes.
    assert_eq!(b.lookup(ROOT_INO, "data").await, Ok(dir));
    b.open(big).await;
    assert_eq!(b.read(small, 0, 20_000).await, small_bytes);
    let mut back = Vec::new();
    while back.len() < big_bytes.len() {
        back.extend(b.read(big, back.len() as u64, 1 << 20).await);
    }
    assert!(back == big_bytes, "big file differs when read on node 3");

    // An overwrite in the middle is copy-on-write and reads back merged.
    let patch = pattern(100_000, 3);
    a.write(big, 5_000_000, patch.clone()).await;
    // Close-to-open: the reader opens after the write returned. Without the open, node 3's
    // replica may not have applied the commit yet (the API promises no more than that).
    b.open(big).await;
    let got = b.read(big, 4_990_000, 120_000).await;
    assert_eq!(&got[..10_000], &big_bytes[4_990_000..5_000_000]);
    assert_eq!(&got[10_000..110_000], &patch[..]);
    assert_eq!(&got[110_000..], &big_bytes[5_100_000..5_110_000]);

    // Where the data lives.
    match b.call(FsRequest::Layout { ino: big }).await {
        FsResponse::Layout(l) => {
            assert_eq!(l.inline_len, 0);
            assert!(l.extents.len() >= 4, "{:?}", l.extents.len());
        }
        other => panic!("{other:?}"),
    }
    match b.call(FsRequest::Layout { ino: small }).await {
        FsResponse::Layout(l) => {
            assert_eq!(l.inline_len, 10_000);
            assert!(l.extents.is_empty());
        }
        other => panic!("{other:?}"),
    }

    // Rename on one node, seen on the other; a retried request is applied once.
    let id = b.id();
    let rename = FsRequest::Rename {
        id,
        parent: dir,
        name: "small".into(),
        new_parent: ROOT_INO,
        new_name: "moved".into(),
        flags: RenameFlags::default(),
    };
    assert_eq!(b.call(rename.clone()).await, FsResponse::Done);
    assert_eq!(
        b.call(rename).await,
        FsResponse::Done,
        "retry answers the same"
    );
    assert_eq!(a.lookup(ROOT_INO, "moved").await, Ok(small));
    assert_eq!(a.lookup(dir, "small").await, Err(FsError::NotFound));

    // Directory listings come in pages, in name order, each continuing after a name.
    let list = a.mknod(ROOT_INO, "list", FileKind::Dir).await;
    for i in (0..10).rev() {
        a.mknod(list, &format!("e{i}"), FileKind::File).await;
    }
    let mut after = None;
    let mut pages = Vec::new();
    loop {
        let req = FsRequest::ReadDir {
            ino: list,
            after: after.clone(),
            limit: 4,
        };
        let FsResponse::Entries { entries, more } = b.call(req).await else {
            panic!("readdir");
        };
        let names: Vec<String> = entries.into_iter().map(|e| e.name).collect();
        after = names.last().cloned();
        pages.push(names);
        if !more {
            break;
        }
    }
    let want: Vec<Vec<String>> = [0..4, 4..8, 8..10]
        .into_iter()
        .map(|r| r.map(|i| format!("e{i}")).collect())
        .collect();
    assert_eq!(pages, want);
    // A limit of 0 still makes progress; a huge one is capped.
    let req = |limit| FsRequest::ReadDir {
        ino: list,
        after: None,
        limit,
    };
    assert!(matches!(
        b.call(req(0)).await,
        FsResponse::Entries { ref entries, more: true } if entries.len() == 1
    ));
    assert!(matches!(
        b.call(req(u32::MAX)).await,
        FsResponse::Entries { ref entries, more: false } if entries.len() == 10
    ));
    // A directory emptied and removed while being listed: the listing just ends.
    for i in 0..10 {
        let id = a.id();
        let unlink = FsRequest::Unlink {
            id,
            parent: list,
            name: format!("e{i}"),
        };
        assert_eq!(a.call(unlink).await, FsResponse::Done);
    }
    let id = a.id();
    let rmdir = FsRequest::Rmdir {
        id,
        parent: ROOT_INO,
        name: "list".into(),
    };
    assert_eq!(a.call(rmdir).await, FsResponse::Done);
    assert_eq!(a.lookup(ROOT_INO, "list").await, Err(FsError::NotFound));
    let next_page = FsRequest::ReadDir {
        ino: list,
        after: Some("e3".into()),
        limit: 4,
    };
    assert_eq!(
        a.call(next_page).await,
        FsResponse::Entries {
            entries: Vec::new(),
            more: false
        }
    );
    assert_eq!(
        a.call(req(4)).await,
        FsResponse::Error(FsError::NotFound),
        "a listing from the start of a removed directory fails"
    );
}
