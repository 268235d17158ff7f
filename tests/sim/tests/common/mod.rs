//! What the focused tests on a simulated cluster share: a formed five-node cluster (2+2
//! stripes) with every node in the metadata group, and files made, written and read
//! through a node's `FsService` as a mount does. Each test binary uses part of it.
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use shoal_agent::fs::FsService;
use shoal_agent_api::{FileKind, FsRequest, FsResponse, Ino, Owner, ROOT_INO, RequestId};
use shoal_disk::SplitMix64;
use shoal_mesh::SimNet;
use shoal_namespace::FileData;
use shoal_sim::cluster::Cluster;
use shoal_sim::trace::Trace;
use shoal_store::{NodeStore, ShardKey, ShardStore};

pub const NODES: [u64; 5] = [1, 2, 3, 4, 5];
/// The protocol a mount of this build speaks.
pub const PROTOCOL: u8 = shoal_agent_api::API_VERSION;
/// Bytes of file data in one stripe of the simulator's 2+2 profile.
pub const STRIPE: usize = 2 << 20;

/// Runs `test` on a formed five-node cluster of `seed` (made by `setup` from the
/// nodes), once every node is in the metadata group (the learners join a little after
/// the group forms).
pub fn on_five_nodes<T>(
    seed: u64,
    setup: impl FnOnce(Cluster) -> Cluster,
    test: impl AsyncFnOnce(&mut Cluster) -> T,
) -> T {
    shoal_sim::runtime::block_on(seed, async move {
        let mut rng = SplitMix64(seed);
        let mut net_rng = SplitMix64(rng.next_u64());
        let net = SimNet::new(Box::new(move || net_rng.next_u64()));
        let mut cluster = setup(Cluster::new(&NODES, &mut rng, net, Trace::begin()));
        cluster.form(Duration::from_secs(60)).await.expect("formed");
        for id in NODES {
            member(&cluster, id).await;
        }
        test(&mut cluster).await
    })
}

/// Waits until node `id` answers a read barrier (it is in the group), 60 s at most.
pub async fn member(cluster: &Cluster, id: u64) {
    let group = cluster.live.get(id).expect("node runs");
    let joined = tokio::time::timeout(Duration::from_secs(60), async {
        while group.barrier().await.is_err() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    joined.unwrap_or_else(|_| panic!("node {id} in the metadata group within 60 s"));
}

/// `len` bytes drawn from `seed`.
pub fn data(len: usize, seed: u64) -> Vec<u8> {
    let mut rng = SplitMix64(seed);
    (0..len).map(|_| rng.next_u64() as u8).collect()
}

pub fn fs(cluster: &Cluster, id: u64) -> Arc<FsService> {
    cluster.live.fs(id).expect("node runs")
}

/// A request id of mount session `client`, distinct per call.
pub fn id(client: u64) -> RequestId {
    use std::sync::atomic::{AtomicU64, Ordering};
    static SEQ: AtomicU64 = AtomicU64::new(1);
    RequestId {
        client,
        seq: SEQ.fetch_add(1, Ordering::Relaxed),
    }
}

/// Creates file `name` in the root through `fs`; its inode.
pub async fn create(fs: &Arc<FsService>, name: &str) -> Ino {
    let req = FsRequest::MkNode {
        id: id(7),
        parent: ROOT_INO,
        name: name.into(),
        kind: FileKind::File,
        perm: 0o644,
        owner: Owner { uid: 0, gid: 0 },
        rdev: 0,
        target: None,
    };
    match shoal_sim::file_client::change_synced(fs, req, 7).await {
        FsResponse::Entry(a) | FsResponse::EntryAt { attr: a, .. } => a.ino,
        other => panic!("create {name}: {other:?}"),
    }
}

/// Writes `data` at `offset` of file `ino` through `fs` as mount session `client`.
pub async fn write(
    fs: &Arc<FsService>,
    client: u64,
    ino: Ino,
    offset: u64,
    data: &[u8],
) -> FsResponse {
    let req = FsRequest::Write {
        id: id(client),
        ino,
        offset,
        data: data.to_vec(),
    };
    shoal_sim::file_client::change_synced(fs, req, client).await
}

/// File `ino` as node `id`'s replica has it after a read barrier.
pub async fn file(cluster: &Cluster, id: u64, ino: Ino) -> FileData {
    let group = cluster.live.get(id).expect("node runs");
    group.barrier().await.expect("a read barrier");
    group.store().file_data(ino).expect("the file is there")
}

/// File `ino` read whole through node `id` (after a read barrier there, as a mount's
/// open waits for the commit point).
pub async fn read_all(cluster: &Cluster, id: u64, ino: Ino) -> Vec<u8> {
    let size = file(cluster, id, ino).await.attr.size;
    let parts = fs(cluster, id)
        .read(ino, 0, u32::try_from(size.max(1)).expect("small"))
        .await
        .expect("read");
    parts.iter().flat_map(|p| p.iter().copied()).collect()
}

/// The metadata group's three voters, the leader first (the other two nodes are
/// learners).
pub fn voters(cluster: &Cluster) -> Vec<u64> {
    let leader = cluster.leader().expect("leader");
    let group = cluster.live.get(leader).expect("leader runs");
    let mut voters: Vec<u64> = group
        .raft
        .metrics()
        .borrow()
        .membership_config
        .membership()
        .voter_ids()
        .collect();
    voters.sort_by_key(|&v| v != leader);
    assert_eq!(voters.len(), 3);
    voters
}

/// (node, shard) of every slot the extents of `file` name.
pub fn slots_of(file: FileData) -> impl Iterator<Item = (u64, ShardKey)> {
    file.extents.into_iter().flat_map(|e| {
        let stripe = e.stripe.id.0;
        e.stripe
            .shards
            .into_iter()
            .enumerate()
            .map(move |(index, slot)| {
                let index = index as u8;
                (slot.node.0, ShardKey { stripe, index })
            })
    })
}

/// (node, shard) of every shard the given stores hold.
pub fn held<'a>(
    stores: impl IntoIterator<Item = (&'a u64, &'a Arc<NodeStore>)>,
) -> BTreeSet<(u64, ShardKey)> {
    stores
        .into_iter()
        .flat_map(|(n, s)| s.list().into_iter().map(move |(k, _)| (*n, k)))
        .collect()
}
