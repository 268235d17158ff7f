//! Block checksums on a real disk store: a range read checks the blocks it returns, so
//! damage elsewhere in the shard does not fail it, and damage inside it always does.
//! Shard files of the first format (one checksum for the whole data) are still read.

use bytes::Bytes;
use shoal_store::{BLOCK_SHIFT, DiskStore, HEADER_LEN, Ring, ShardKey, ShardStore, StoreError};

const BLOCK: u64 = 1 << BLOCK_SHIFT;
const LIMIT: u64 = 64 << 20;

fn key() -> ShardKey {
    ShardKey {
        stripe: 0xb10c,
        index: 2,
    }
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 % 253) as u8).collect()
}

fn flip(path: &std::path::Path, at: u64) {
    let mut bytes = std::fs::read(path).expect("read shard file");
    bytes[at as usize] ^= 0x10;
    std::fs::write(path, bytes).expect("write shard file");
}

fn is_corrupt(r: Result<Bytes, StoreError>) -> Option<String> {
    match r {
        Err(StoreError::Corrupt { reason, .. }) => Some(reason),
        _ => None,
    }
}

/// A disk store on `dir`, and what its start-up recovery did.
async fn open(dir: &std::path::Path, direct: bool) -> (DiskStore, shoal_store::Recovery) {
    let ring = Ring::start(32).expect("io_uring");
    DiskStore::open_with(dir, LIMIT, ring, direct)
        .await
        .expect("open")
}

async fn range_reads_check_their_blocks(direct: bool) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, _) = open(dir.path(), direct).await;
    let data = pattern(16 * BLOCK as usize + 100);
    store
        .put(key(), Bytes::from(data.clone()))
        .await
        .expect("put");
    let get = |offset: u64, len: Option<u64>| store.get(key(), offset, len);
    let want = |from: u64, to: u64| Bytes::copy_from_slice(&data[from as usize..to as usize]);
    let n = data.len() as u64;
    // Undamaged: ranges inside one block, across blocks, and in the short last block.
    assert_eq!(get(5, Some(4096)).await.expect("a"), want(5, 4101));
    assert_eq!(
        get(BLOCK - 10, Some(BLOCK + 20)).await.expect("b"),
        want(BLOCK - 10, 2 * BLOCK + 10)
    );
    assert_eq!(get(n - 50, None).await.expect("c"), want(n - 50, n));
    assert_eq!(get(n, Some(0)).await.expect("empty"), Bytes::new());
    assert!(matches!(
        get(n - 1, Some(2)).await,
        Err(StoreError::OutOfRange { .. })
    ));

    // One flipped bit in block 3 (the data follows the header and a 17-entry table).
    let path = dir.path().join("shards").join(key().to_string());
    let data_at = HEADER_LEN as u64 + 4 * 17;
    flip(&path, data_at + 3 * BLOCK + 123);
    assert_eq!(
        get(0, Some(3 * BLOCK)).await.expect("blocks 0-2"),
        want(0, 3 * BLOCK)
    );
    assert_eq!(
        get(4 * BLOCK, None).await.expect("blocks 4-"),
        want(4 * BLOCK, n)
    );
    for (offset, len) in [
        (3 * BLOCK + 123, 1),
        (2 * BLOCK, BLOCK + 1),
        (3 * BLOCK, BLOCK),
    ] {
        let reason = is_corrupt(get(offset, Some(len)).await);
        assert!(
            reason.as_deref().is_some_and(|r| r.contains("block 3")),
            "{offset}+{len}: {reason:?}"
        );
    }
    assert!(is_corrupt(get(0, None).await).is_some(), "the whole shard");
    // A damaged table entry fails the whole shard, and the reads of its block once the
    // file is opened again (a file kept open since an earlier range read is read with the
    // table checked then).
    flip(&path, data_at + 3 * BLOCK + 123);
    flip(&path, HEADER_LEN as u64 + 4 * 5);
    assert!(is_corrupt(get(0, None).await).is_some(), "the whole shard");
    drop(store);
    let (store, _) = open(dir.path(), direct).await;
    let get = |offset: u64, len: Option<u64>| store.get(key(), offset, len);
    assert!(is_corrupt(get(5 * BLOCK, Some(10)).await).is_some());
    assert_eq!(
        get(6 * BLOCK, Some(10)).await.expect("block 6"),
        want(6 * BLOCK, 6 * BLOCK + 10)
    );
}

/// The files under `dir` this process holds open that were deleted.
fn deleted_open_files(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .map(|p| p.display().to_string())
        .filter(|p| p.ends_with(" (deleted)") && p.starts_with(&dir.display().to_string()))
        .collect()
}

/// A shard read by range is kept open; deleting it closes it (its space is freed), and the
/// key written again reads its new data.
#[tokio::test]
async fn a_shard_written_again_after_a_delete_reads_its_new_data() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, _) = open(dir.path(), false).await;
    let old = Bytes::from(pattern(4 * BLOCK as usize));
    let new: Bytes = old.iter().map(|b| b ^ 0xff).collect();
    store.put(key(), old.clone()).await.expect("put");
    let range = store.get(key(), BLOCK, Some(10)).await.expect("read");
    assert_eq!(range, old.slice(BLOCK as usize..BLOCK as usize + 10));
    assert!(store.delete(key()).await.expect("delete"));
    assert_eq!(deleted_open_files(dir.path()), Vec::<String>::new());
    assert!(matches!(
        store.get(key(), BLOCK, Some(10)).await,
        Err(StoreError::NotFound(_))
    ));
    store.put(key(), new.clone()).await.expect("put again");
    let range = store.get(key(), BLOCK, Some(10)).await.expect("read again");
    assert_eq!(range, new.slice(BLOCK as usize..BLOCK as usize + 10));
}

#[tokio::test]
async fn range_reads_check_only_their_blocks() {
    range_reads_check_their_blocks(false).await;
}

#[tokio::test]
async fn range_reads_check_only_their_blocks_with_direct_io() {
    range_reads_check_their_blocks(true).await;
}

/// A shard file as the first format wrote it: header version 1, no block table.
fn version_1_file(key: ShardKey, data: &[u8]) -> Vec<u8> {
    let mut h = [0u8; HEADER_LEN];
    h[0..4].copy_from_slice(b"SHRD");
    h[4..6].copy_from_slice(&1u16.to_le_bytes());
    h[6..8].copy_from_slice(&(HEADER_LEN as u16).to_le_bytes());
    h[8..24].copy_from_slice(&key.stripe.to_le_bytes());
    h[24] = key.index;
    h[32..40].copy_from_slice(&(data.len() as u64).to_le_bytes());
    h[40..44].copy_from_slice(&crc32c::crc32c(data).to_le_bytes());
    let crc = crc32c::crc32c(&h[0..44]);
    h[44..48].copy_from_slice(&crc.to_le_bytes());
    [&h[..], data].concat()
}

#[tokio::test]
async fn version_1_shard_files_are_still_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    let shards = dir.path().join("shards");
    std::fs::create_dir_all(&shards).expect("mkdir");
    let data = pattern(3 * BLOCK as usize + 5);
    let path = shards.join(key().to_string());
    std::fs::write(&path, version_1_file(key(), &data)).expect("write");
    let (store, recovery) = open(dir.path(), false).await;
    assert_eq!(recovery.reindexed, 1, "{recovery:?}");
    assert_eq!(store.get(key(), 0, None).await.expect("whole"), data);
    assert_eq!(
        store.get(key(), BLOCK, Some(10)).await.expect("range"),
        &data[BLOCK as usize..BLOCK as usize + 10]
    );
    // Damage anywhere fails every read of it: there is one checksum for all of it.
    flip(&path, HEADER_LEN as u64 + 2 * BLOCK);
    assert!(is_corrupt(store.get(key(), 0, Some(10)).await).is_some());
}

/// A shard file as the release before wrote it: header version 2 with blocks of 64 KiB.
fn blocks_of_64_kib_file(key: ShardKey, data: &[u8]) -> Vec<u8> {
    let old = 64 << 10;
    let mut table = Vec::new();
    for block in data.chunks(old) {
        table.extend_from_slice(&crc32c::crc32c(block).to_le_bytes());
    }
    let header = shoal_store::ShardHeader {
        key,
        data_len: data.len() as u64,
        data_crc: crc32c::crc32c(data),
        block_shift: 16,
    };
    [&header.encode()[..], &table, data].concat()
}

#[tokio::test]
async fn shard_files_of_64_kib_blocks_are_still_read_by_range_and_checked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let shards = dir.path().join("shards");
    std::fs::create_dir_all(&shards).expect("mkdir");
    let data = pattern((3 << 16) + 5);
    let path = shards.join(key().to_string());
    std::fs::write(&path, blocks_of_64_kib_file(key(), &data)).expect("write");
    let (store, recovery) = open(dir.path(), false).await;
    assert_eq!(recovery.reindexed, 1, "{recovery:?}");
    let at = (1 << 16) + 100;
    assert_eq!(
        store.get(key(), at, Some(10)).await.expect("range"),
        &data[at as usize..at as usize + 10]
    );
    let checked = store.get_checked(key(), at, 10).await.expect("checked");
    assert_eq!(checked.shift, 16);
    assert_eq!(
        checked
            .verify(crc32c::crc32c(&data), at, 10)
            .expect("verifies"),
        &data[at as usize..at as usize + 10]
    );
    // Damage in block 2 (of 64 KiB) fails a range in it, not one in block 1.
    let data_at = HEADER_LEN as u64 + 4 * 4;
    flip(&path, data_at + (2 << 16) + 7);
    assert!(is_corrupt(store.get(key(), (2 << 16) + 1, Some(4)).await).is_some());
    assert!(store.get(key(), at, Some(10)).await.is_ok());
}
