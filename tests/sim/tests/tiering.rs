//! The cold tier's upload and collector (`tier/upload.rs`, `tier/gc.rs`) on five simulated
//! nodes sharing one in-memory bucket under `Faulty`: a release that lands, one the bucket
//! refuses and one it keeps short while saying it succeeded. The real mount requests,
//! stripes, metadata and tier workers, on virtual time.

mod common;

use std::time::Duration;

use shoal_agent_api::{FsRequest, FsResponse, Ino};
use shoal_sim::cluster::{Bucket, Cluster};
use shoal_store::ShardStore;
use shoal_tiering::ColdStore;

use common::{NODES, PROTOCOL, create, data, fs, write};

/// Bytes of the test file: several stripes' worth would do, one is enough.
const SIZE: usize = 600_000;

fn on_five_nodes_with_a_bucket<T>(seed: u64, test: impl AsyncFnOnce(&mut Cluster) -> T) -> T {
    common::on_five_nodes(seed, Cluster::with_cold_tier, test)
}

fn bucket(c: &Cluster) -> Bucket {
    c.bucket.clone().expect("a cold tier")
}

/// Creates `name` in the root through node 1 and writes `SIZE` bytes into it; its inode
/// and bytes.
async fn file_with_data(c: &Cluster, name: &str) -> (Ino, Vec<u8>) {
    let fs = fs(c, 1);
    let ino = create(&fs, name).await;
    let data = data(SIZE, ino);
    let wrote = write(&fs, 77, ino, 0, &data).await;
    assert!(matches!(wrote, FsResponse::Attr(_)), "write: {wrote:?}");
    (ino, data)
}

/// Reads the file through node `through` after a read barrier there (as a mount's open
/// waits for the commit point).
async fn read(c: &Cluster, through: u64, ino: Ino) -> Vec<u8> {
    let group = c.live.get(through).expect("node runs");
    group.barrier().await.expect("a read barrier");
    let req = FsRequest::Read {
        ino,
        offset: 0,
        len: SIZE as u32,
    };
    match fs(c, through).handle(req, None, PROTOCOL).await {
        FsResponse::Data(d) => d,
        other => panic!("read through node {through}: {other:?}"),
    }
}

/// Whether every stripe of the file is cold, as node `id`'s replica says after a barrier.
async fn cold(c: &Cluster, id: u64, ino: Ino) -> bool {
    let group = c.live.get(id).expect("node runs");
    group.barrier().await.expect("a read barrier");
    let data = group.store().file_data(ino).expect("file data");
    !data.extents.is_empty()
        && data
            .extents
            .iter()
            .all(|e| data.cold.contains_key(&e.stripe.id))
}

async fn objects(b: &Bucket) -> usize {
    b.list("objects").await.expect("list").len()
}

/// Shards of any stripe the running nodes hold.
fn shards_held(c: &Cluster) -> usize {
    c.running_stores()
        .values()
        .map(|s| s.usage().shards as usize)
        .sum()
}

#[test]
fn a_released_file_reads_back_from_the_bucket_and_its_nvme_shards_go() {
    on_five_nodes_with_a_bucket(11, async |c| {
        let (ino, data) = file_with_data(c, "ckpt").await;
        assert!(shards_held(c) >= 4, "striped on NVMe first");
        let tier = c.live.tier(2).expect("a tier");
        let moved = tier.release(&[ino]).await.expect("released");
        assert!(moved.stripes >= 1, "{moved:?}");
        assert!(cold(c, 3, ino).await, "every stripe cold");
        assert_eq!(objects(&bucket(c)).await, 1, "one object for the file");
        for through in NODES {
            assert_eq!(read(c, through, ino).await, data, "through node {through}");
        }
        // The leftover sweeps let the NVMe shards go after their short grace.
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(shards_held(c), 0, "NVMe shards of a cold file freed");
        assert_eq!(read(c, 4, ino).await, data, "still read from the bucket");
    });
}

#[test]
fn with_the_bucket_unreachable_a_release_fails_and_the_file_stays_hot_and_readable() {
    on_five_nodes_with_a_bucket(12, async |c| {
        let (ino, data) = file_with_data(c, "hot").await;
        bucket(c).set_outage(true);
        let tier = c.live.tier(1).expect("a tier");
        let tried = tokio::time::timeout(Duration::from_secs(300), tier.release(&[ino])).await;
        if let Ok(Ok(moved)) = tried {
            assert_eq!(moved.stripes, 0, "nothing moved: {moved:?}");
        }
        assert!(!cold(c, 2, ino).await, "nothing committed cold");
        assert_eq!(read(c, 5, ino).await, data);
        assert!(shards_held(c) >= 4, "the NVMe shards stay");
    });
}

#[test]
fn a_claim_or_an_upload_the_bucket_keeps_short_is_never_taken_and_the_object_is_collected() {
    on_five_nodes_with_a_bucket(13, async |c| {
        let (ino, data) = file_with_data(c, "short").await;
        let b = bucket(c);
        let tier = c.live.tier(3).expect("a tier");
        // The bucket's first put, the claim, kept short: the release fails (and a short
        // claim was once taken for another cluster's, refusing the bucket for good).
        b.truncate_puts(1);
        let tried = tier.release(&[ino]).await;
        assert!(tried.is_err(), "a short claim is not taken: {tried:?}");
        tier.claim()
            .await
            .expect("the short claim is written over at the next try");
        // The object kept short: its read-back check fails, nothing is committed.
        b.truncate_puts(1);
        let tried = tokio::time::timeout(Duration::from_secs(300), tier.release(&[ino])).await;
        if let Ok(Ok(moved)) = tried {
            assert_eq!(moved.stripes, 0, "nothing moved: {moved:?}");
        }
        assert!(!cold(c, 1, ino).await, "a short object is never committed");
        assert_eq!(read(c, 2, ino).await, data);
        // The upload deletes the object that failed its check; were that delete lost, the
        // collector would fence and delete it as an orphan after its grace (60 s).
        let mut left = objects(&b).await;
        for _ in 0..60 {
            if left == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_secs(10)).await;
            left = objects(&b).await;
        }
        // The mover may have sent the file (untouched for 30 s) meanwhile, in an object of
        // its own that stays: every object left must be one the metadata uses.
        if left > 0 {
            assert!(cold(c, 1, ino).await, "{left} objects left, none in use");
            assert_eq!(left, 1);
        }
    });
}
