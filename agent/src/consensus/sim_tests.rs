//! A whole metadata group in one process: three real openraft members, each with the
//! real log store and state machine on its own simulated disk (`shoal_disk::SimDisk`),
//! talking over an in-memory network. Workloads and faults a process test cannot make:
//! a rolling restart of every member, then a power cut of all of them at once; every
//! proposal the group acknowledged must be there afterwards.
//!
//! This is the first piece of the simulator (issue "Whole clusters in one process"): real
//! time, not yet seeded end to end (openraft's election timeouts and the blocking pool
//! are not), so it checks invariants over many runs rather than replaying one.

// The error type is openraft's (the network trait returns it).
#![allow(clippy::result_large_err)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{BasicNode, Config};
use shoal_agent_api::ROOT_INO;
use shoal_disk::{Disk, SimDisk, SplitMix64};
use shoal_namespace::format::{FileKind, Owner, Timestamp};
use shoal_namespace::{Batch, Command, NamespaceStore, Proposal};

use super::ballast::Ballast;
use super::changes::ChangeFeed;
use super::log_store::LogStore;
use super::state_machine::StateMachine;
use super::types::{MetaRaft, Raft};

/// Which members are up, reachable by the others.
#[derive(Default)]
struct Router {
    rafts: Mutex<BTreeMap<u64, Raft>>,
}

impl Router {
    fn get(&self, id: u64) -> Option<Raft> {
        self.rafts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .cloned()
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Down(String);

struct SimNet(Arc<Router>);

struct SimClient {
    router: Arc<Router>,
    target: u64,
}

impl SimClient {
    fn peer<E: std::error::Error>(&self) -> Result<Raft, RPCError<u64, BasicNode, E>> {
        self.router.get(self.target).ok_or_else(|| {
            RPCError::Unreachable(Unreachable::new(&Down(format!(
                "member {} is down",
                self.target
            ))))
        })
    }
}

impl RaftNetworkFactory<MetaRaft> for SimNet {
    type Network = SimClient;

    async fn new_client(&mut self, target: u64, _node: &BasicNode) -> SimClient {
        SimClient {
            router: self.0.clone(),
            target,
        }
    }
}

impl RaftNetwork<MetaRaft> for SimClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<MetaRaft>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        let raft = self.peer()?;
        raft.append_entries(rpc)
            .await
            .map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<MetaRaft>,
        _option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<u64>,
        RPCError<u64, BasicNode, RaftError<u64, InstallSnapshotError>>,
    > {
        let raft = self.peer()?;
        raft.install_snapshot(rpc)
            .await
            .map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        _option: RPCOption,
    ) -> Result<VoteResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        let raft = self.peer()?;
        raft.vote(rpc)
            .await
            .map_err(|e| RPCError::Network(NetworkError::new(&Down(e.to_string()))))
    }
}

/// One member: its disk (kept across restarts and power cuts) and, while up, its Raft and
/// replica.
struct Member {
    disk: SimDisk,
    ballast_dir: tempfile::TempDir,
    up: Option<(Raft, Arc<NamespaceStore>)>,
}

struct Cluster {
    router: Arc<Router>,
    members: BTreeMap<u64, Member>,
}

const META: &str = "/meta";

impl Cluster {
    fn new(ids: &[u64], seed: u64) -> Cluster {
        let members = ids
            .iter()
            .map(|&id| {
                let disk = SimDisk::new(seed.wrapping_mul(31).wrapping_add(id));
                disk.create_dir_all(Path::new(META)).expect("mkdir");
                let ballast_dir = tempfile::tempdir().expect("tempdir");
                (
                    id,
                    Member {
                        disk,
                        ballast_dir,
                        up: None,
                    },
                )
            })
            .collect();
        Cluster {
            router: Arc::default(),
            members,
        }
    }

    /// Members `ids` started, and the group formed by the first of them.
    async fn formed(ids: &[u64], seed: u64) -> Cluster {
        let mut c = Cluster::new(ids, seed);
        for &id in ids {
            c.start(id).await;
        }
        let members: BTreeMap<u64, BasicNode> =
            ids.iter().map(|&i| (i, BasicNode::default())).collect();
        c.members[&ids[0]]
            .up
            .as_ref()
            .expect("up")
            .0
            .initialize(members)
            .await
            .expect("initialize");
        c
    }

    /// Asserts that every create in `acked` is in the leader's replica.
    async fn assert_none_lost(&self, seed: u64, acked: &[String]) {
        let names = self.names_on_leader().await;
        let lost: Vec<&String> = acked.iter().filter(|a| !names.contains(*a)).collect();
        assert!(
            lost.is_empty(),
            "seed {seed}: {} of {} acknowledged creates lost: {lost:?}",
            lost.len(),
            acked.len()
        );
    }

    async fn start(&mut self, id: u64) {
        let m = self.members.get_mut(&id).expect("member");
        let disk: Arc<dyn Disk> = Arc::new(m.disk.clone());
        let dir = Path::new(META);
        let ballast = Arc::new(Ballast::open(m.ballast_dir.path()));
        let log = LogStore::open_on(disk.clone(), dir, id, ballast, Default::default())
            .expect("the log opens after any crash");
        let file = disk
            .open(&dir.join("state.redb"), true)
            .expect("state file");
        disk.sync_dir(dir).expect("sync dir");
        let store =
            Arc::new(NamespaceStore::open_on(file).expect("the replica opens after any crash"));
        let sm = StateMachine::new(
            store.clone(),
            disk,
            dir,
            Arc::new(ChangeFeed::new()),
            log.append_sync(),
        );
        let config = Config {
            cluster_name: "sim".into(),
            heartbeat_interval: 50,
            election_timeout_min: 200,
            election_timeout_max: 400,
            ..Default::default()
        }
        .validate()
        .expect("config");
        let raft = Raft::new(id, Arc::new(config), SimNet(self.router.clone()), log, sm)
            .await
            .expect("raft");
        self.router
            .rafts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, raft.clone());
        m.up = Some((raft, store));
    }

    /// Stops a member without warning: `power` also throws away what its disk did not
    /// sync. The disk is fenced first, so nothing the stopping member does reaches it.
    async fn kill(&mut self, id: u64, power: bool) {
        let m = self.members.get_mut(&id).expect("member");
        if power {
            m.disk.power_cut();
        } else {
            m.disk.crash();
        }
        self.router
            .rafts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
        if let Some((raft, _)) = m.up.take() {
            let _ = raft.shutdown().await;
        }
    }

    async fn leader(&self) -> (u64, Raft) {
        for _ in 0..200 {
            for m in self.members.values() {
                if let Some((raft, _)) = &m.up {
                    let metrics = raft.metrics().borrow().clone();
                    if let Some(l) = metrics.current_leader
                        && l == metrics.id
                    {
                        return (l, raft.clone());
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let states: Vec<String> = self
            .members
            .iter()
            .map(|(id, m)| match &m.up {
                Some((raft, _)) => {
                    let x = raft.metrics().borrow().clone();
                    format!(
                        "{id}: {:?} term {} vote {:?} last log {:?} applied {:?} {:?}",
                        x.state,
                        x.current_term,
                        x.vote,
                        x.last_log_index,
                        x.last_applied,
                        x.running_state
                    )
                }
                None => format!("{id}: down"),
            })
            .collect();
        panic!("no leader within 10 s:\n{}", states.join("\n"));
    }

    /// Proposes a create of `name`; true once the group acknowledged it.
    async fn create(&self, name: &str) -> bool {
        let (_, raft) = self.leader().await;
        let p = Proposal {
            id: None,
            now: Timestamp { secs: 1, nanos: 0 },
            command: Command::MkNode {
                parent: ROOT_INO,
                name: name.into(),
                kind: FileKind::File,
                perm: 0o644,
                owner: Owner { uid: 0, gid: 0 },
                rdev: 0,
                target: None,
            },
        };
        raft.client_write(Batch::new(vec![p])).await.is_ok()
    }

    /// The names in the root of the leader's replica, once it applied a fresh entry (so
    /// everything committed before is applied).
    async fn names_on_leader(&self) -> BTreeSet<String> {
        for attempt in 0..20 {
            if self.create(&format!("barrier-{attempt}")).await {
                let (id, _) = self.leader().await;
                let (_, store) = self.members[&id].up.as_ref().expect("up");
                let listing = store.readdir(ROOT_INO).expect("readdir");
                return listing.into_iter().map(|e| e.name).collect();
            }
        }
        panic!("the group committed nothing after the restart");
    }
}

/// Three voters, a rolling restart of each (kill -9 and start again), more creates, then
/// a power cut of all three at once: every acknowledged create is there. Before the sync
/// policy learned the member's role at start, the restarted voters synced one append in
/// 64, and the power cut lost acknowledged creates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_creates_survive_a_rolling_restart_then_a_power_cut_of_every_member() {
    for seed in 0..3u64 {
        let ids = [1u64, 2, 3];
        let mut c = Cluster::formed(&ids, seed).await;
        let mut acked = Vec::new();
        let mut n = 0;
        let mut create = async |c: &Cluster, acked: &mut Vec<String>, count: usize| {
            for _ in 0..count {
                n += 1;
                let name = format!("f{n}");
                if c.create(&name).await {
                    acked.push(name);
                }
            }
        };
        create(&c, &mut acked, 10).await;
        for id in ids {
            c.kill(id, false).await;
            c.start(id).await;
            create(&c, &mut acked, 10).await;
        }
        for id in ids {
            c.kill(id, true).await;
        }
        for id in ids {
            c.start(id).await;
        }
        c.assert_none_lost(seed, &acked).await;
        for id in ids {
            c.kill(id, false).await;
        }
    }
}

impl Cluster {
    fn up_ids(&self) -> Vec<u64> {
        self.members
            .iter()
            .filter(|(_, m)| m.up.is_some())
            .map(|(id, _)| *id)
            .collect()
    }

    /// Waits until every member applied the same index, and returns each one's digest.
    async fn digests_when_caught_up(&self) -> Vec<(u64, Option<Vec<u8>>, u64)> {
        for _ in 0..200 {
            let applied: BTreeSet<Option<u64>> = self
                .members
                .values()
                .filter_map(|m| m.up.as_ref())
                .map(|(raft, _)| raft.metrics().borrow().last_applied.map(|l| l.index))
                .collect();
            if applied.len() == 1 {
                return self
                    .members
                    .iter()
                    .filter_map(|(id, m)| m.up.as_ref().map(|(_, s)| (*id, s)))
                    .map(|(id, s)| {
                        let (marker, digest) = s.digest().expect("digest");
                        (id, marker, digest)
                    })
                    .collect();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the members never applied the same index");
    }
}

/// Creates while a seeded schedule kills (kill -9) and power-cuts single members, and now
/// and then every member at once; then everyone comes back. Every acknowledged create is
/// there, and the replicas that applied the same index hold the same state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_creates_survive_seeded_crashes_and_power_cuts() {
    let seeds: u64 = std::env::var("SHOAL_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4);
    for seed in 0..seeds {
        eprintln!("seed {seed}");
        let mut rng = SplitMix64(seed);
        let ids = [1u64, 2, 3];
        let mut c = Cluster::formed(&ids, seed).await;
        let mut acked = Vec::new();
        // Faults begin once every member holds the group's membership (before, a member
        // that never heard of the group cannot elect anyone).
        assert!(c.create("formed").await, "seed {seed}: a first create");
        c.digests_when_caught_up().await;
        for step in 0..40u64 {
            let up = c.up_ids();
            match rng.below(10) {
                // A member down: kill -9 or a power cut, never more than one at a time.
                0 | 1 if up.len() == ids.len() => {
                    let id = up[rng.below(up.len() as u64) as usize];
                    c.kill(id, rng.below(2) == 0).await;
                }
                // Every member's power at once.
                2 if up.len() == ids.len() && rng.below(3) == 0 => {
                    for id in ids {
                        c.kill(id, true).await;
                    }
                    for id in ids {
                        c.start(id).await;
                    }
                }
                3 | 4 if up.len() < ids.len() => {
                    for id in ids.iter().filter(|i| !up.contains(i)) {
                        c.start(*id).await;
                    }
                }
                _ => {
                    let name = format!("s{seed}-{step}");
                    if c.create(&name).await {
                        acked.push(name);
                    }
                }
            }
        }
        for id in ids
            .iter()
            .filter(|i| !c.up_ids().contains(i))
            .copied()
            .collect::<Vec<_>>()
        {
            c.start(id).await;
        }
        c.assert_none_lost(seed, &acked).await;
        let digests = c.digests_when_caught_up().await;
        let distinct: BTreeSet<u64> = digests.iter().map(|(_, _, d)| *d).collect();
        assert_eq!(
            distinct.len(),
            1,
            "seed {seed}: replicas at the same index differ: {digests:?}"
        );
        for id in ids {
            c.kill(id, false).await;
        }
    }
}
