//! The metadata service of one agent: its Raft node, the proposal batcher on the leader,
//! forwarding from followers, linearizable read barriers, and the local replica for
//! queries.

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use openraft::error::{CheckIsLeaderError, ClientWriteError, RaftError};
use openraft::{BasicNode, ChangeMembers, Config, SnapshotPolicy};
use shoal_agent_api::{FsError, Ino};
use shoal_mesh::{Rpc, Transport};
use shoal_meta::{Batch, LeaderStamp, MetaStore, Outcome, Proposal};
use tokio::sync::{Semaphore, mpsc, oneshot};
use tracing::{debug, warn};

use super::ballast::Ballast;
use super::config::MetaConfig;
use super::log_store::LogStore;
use super::metrics::MetaMetrics;
use super::net::{
    Committed, Forward, ForwardRefused, HeldOpen, Hello, Network, RaftMessage, RaftReply, ReadIndex,
};
use super::rejoin::Rejoin;
use super::state_machine::StateMachine;
use super::types::Raft;
use crate::AgentError;

/// Most proposals in one log entry.
const MAX_BATCH: usize = 1024;
/// Most encoded bytes of proposals in one log entry (a proposal alone may be larger).
/// Replication sends entries in messages that must arrive within a heartbeat (see
/// `net::append_budget`), so entries stay small enough for two to fit one.
const MAX_BATCH_BYTES: usize = 1 << 20;
/// Log entries proposed but not yet applied, at most. While all are in flight, new
/// proposals queue and go out together in the next entry.
const IN_FLIGHT_ENTRIES: usize = 2;
/// How long a request waits for a leader (elections, restarts) before it fails.
const LEADER_WAIT: Duration = Duration::from_secs(60);
const RPC_TIMEOUT: Duration = Duration::from_secs(10);
/// How long after this agent starts its mounts have to re-announce their open handles
/// (they ping the agent every 5 s while files are open: three chances).
const REANNOUNCE_GRACE: Duration = Duration::from_secs(15);

/// Open handles of local mounts: (session, handle) → (inode, mount pid).
type Holds = HashMap<(u64, u64), (Ino, Option<i32>)>;

struct Pending {
    proposals: Vec<Proposal>,
    /// Encoded size of `proposals`.
    bytes: usize,
    reply: oneshot::Sender<Result<Committed, ForwardRefused>>,
}

/// Encoded size of a value, without encoding it into memory.
fn encoded_len<T: serde::Serialize>(value: &T) -> usize {
    postcard::serialize_with_flavor(value, postcard::ser_flavors::Size::default()).unwrap_or(0)
}

pub struct MetaService {
    pub raft: Raft,
    store: Arc<MetaStore>,
    pub me: u64,
    pub config: MetaConfig,
    transport: Arc<Transport>,
    batcher: mpsc::Sender<Pending>,
    pub metrics: MetaMetrics,
    started: Instant,
    /// When the last completed read-barrier round started (see [`Self::barrier`]).
    barrier_round: tokio::sync::Mutex<Option<Instant>>,
    /// Inodes the local mounts hold open: (mount session, handle) → (inode, the mount's
    /// pid when known).
    held: Mutex<Holds>,
    /// Space the metadata log can always write.
    pub ballast: Arc<Ballast>,
    /// Set while this node's Raft state was reset (a stale data dir) and the leader has
    /// not yet taken it out of the group: every Raft message is refused meanwhile.
    rejoining: std::sync::atomic::AtomicBool,
    /// Shown in status (see [`shoal_agent_api::MetaStatus::notice`]).
    notice: Option<String>,
}

fn meta_err(e: impl std::fmt::Display) -> AgentError {
    AgentError::Meta(e.to_string())
}

impl MetaService {
    /// Opens the log and state machine under `dir` and starts this node's Raft member.
    /// The group itself is formed later (see `steward`): a new node waits to be added.
    /// `rejoin`: this node's metadata state was found stale and set aside (the notice to
    /// show, and the peers its old state knew); it starts empty and asks the leader,
    /// through any of those peers, to take it out of the group first.
    pub async fn start(
        dir: &Path,
        me: u64,
        config: MetaConfig,
        transport: Arc<Transport>,
        metrics: MetaMetrics,
        rejoin: Option<(String, Vec<SocketAddr>)>,
    ) -> Result<Arc<MetaService>, AgentError> {
        std::fs::create_dir_all(dir).map_err(|source| AgentError::DataDir {
            path: dir.to_owned(),
            source,
        })?;
        let ballast = Arc::new(Ballast::open(dir));
        let log = LogStore::open(&dir.join("log.redb"), ballast.clone()).map_err(meta_err)?;
        let store = Arc::new(MetaStore::open(&dir.join("state.redb")).map_err(meta_err)?);
        let sm = StateMachine::new(store.clone(), dir);
        let raft_config = Config {
            cluster_name: "shoal-meta".into(),
            heartbeat_interval: config.heartbeat_ms,
            election_timeout_min: config.election_ms[0],
            election_timeout_max: config.election_ms[1],
            install_snapshot_timeout: 10_000,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(config.snapshot_every),
            max_in_snapshot_log_to_keep: config.snapshot_every.min(1_000),
            ..Default::default()
        }
        .validate()
        .map_err(meta_err)?;
        let network = Network {
            transport: transport.clone(),
            append_budget: super::net::append_budget(config.heartbeat_ms, MAX_BATCH_BYTES),
        };
        let raft = Raft::new(me, Arc::new(raft_config), network, log, sm)
            .await
            .map_err(meta_err)?;
        let (tx, rx) = mpsc::channel(4096);
        let service = Arc::new(MetaService {
            raft,
            store,
            me,
            config,
            transport: transport.clone(),
            batcher: tx,
            metrics: metrics.clone(),
            started: Instant::now(),
            barrier_round: tokio::sync::Mutex::new(None),
            held: Mutex::new(HashMap::new()),
            ballast,
            rejoining: std::sync::atomic::AtomicBool::new(rejoin.is_some()),
            notice: rejoin.as_ref().map(|(n, _)| n.clone()),
        });
        tokio::spawn(batch_proposals(service.raft.clone(), rx, metrics));
        service.register_handlers();
        if let Some((_, peers)) = rejoin {
            tokio::spawn(leave_group_for_rejoin(service.clone(), peers));
        }
        Ok(service)
    }

    fn is_rejoining(&self) -> bool {
        self.rejoining.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Takes `node` (whose Raft state was reset) out of the group, on the leader (another
    /// member forwards the request there), so its old progress is forgotten; the steward
    /// then adds it again as a new learner.
    async fn drop_member(&self, node: u64) -> Result<(), ForwardRefused> {
        match self.leader() {
            Some(l) if l == self.me => {}
            Some(l) => return self.ask_leader(l, &Rejoin { node }).await,
            None => return Err(ForwardRefused::NotLeader(None)),
        }
        let (is_voter, is_member) = {
            let metrics = self.raft.metrics();
            let m = metrics.borrow();
            let membership = m.membership_config.membership();
            (
                membership.voter_ids().any(|v| v == node),
                membership.nodes().any(|(id, _)| *id == node),
            )
        };
        let change = if is_voter {
            ChangeMembers::RemoveVoters(BTreeSet::from([node]))
        } else if is_member {
            ChangeMembers::RemoveNodes(BTreeSet::from([node]))
        } else {
            return Ok(());
        };
        warn!(node = %shoal_placement::NodeId(node), "taking a node with reset metadata state out of the group; it joins again as a learner");
        self.raft
            .change_membership(change, false)
            .await
            .map(|_| ())
            .map_err(|e| ForwardRefused::Failed(e.to_string()))
    }

    fn register_handlers(self: &Arc<Self>) {
        let this = self.clone();
        self.transport.register(move |_from, msg: RaftMessage| {
            let raft = this.raft.clone();
            let rejoining = this.is_rejoining();
            async move {
                if rejoining {
                    return Ok(RaftReply::NotServing);
                }
                Ok(match msg {
                    RaftMessage::Append(r) => RaftReply::Append(raft.append_entries(r).await),
                    RaftMessage::Vote(r) => RaftReply::Vote(raft.vote(r).await),
                    RaftMessage::Snapshot(r) => RaftReply::Snapshot(raft.install_snapshot(r).await),
                })
            }
        });
        let this = self.clone();
        self.transport.register(move |_from, msg: Forward| {
            let this = this.clone();
            async move { Ok(this.submit_local(msg.0).await) }
        });
        let this = self.clone();
        self.transport.register(move |_from, _: ReadIndex| {
            let this = this.clone();
            async move {
                Ok(match this.raft.get_read_log_id().await {
                    Ok((read, _)) => Ok(read.map_or(0, |l| l.index)),
                    Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f))) => {
                        Err(ForwardRefused::NotLeader(f.leader_id))
                    }
                    Err(e) => Err(ForwardRefused::Failed(e.to_string())),
                })
            }
        });
        let this = self.clone();
        self.transport.register(move |_from, msg: HeldOpen| {
            let this = this.clone();
            async move { Ok(this.held_among(&msg.0)) }
        });
        let this = self.clone();
        self.transport.register(move |_from, msg: Rejoin| {
            let this = this.clone();
            async move { Ok(this.drop_member(msg.node).await) }
        });
        let this = self.clone();
        self.transport.register(move |_from, _: Hello| {
            let this = this.clone();
            async move { Ok(this.raft.is_initialized().await.unwrap_or(false)) }
        });
    }

    /// The local replica (possibly a little behind the leader; see [`Self::barrier`]).
    pub fn store(&self) -> &MetaStore {
        &self.store
    }

    /// What `shoal status` shows about the group.
    pub fn status(&self) -> shoal_agent_api::MetaStatus {
        let hex = |id: u64| format!("{id:016x}");
        let metrics = self.raft.metrics();
        let m = metrics.borrow();
        let membership = m.membership_config.membership();
        let voters: Vec<u64> = membership.voter_ids().collect();
        shoal_agent_api::MetaStatus {
            leader: m.current_leader.map(hex),
            voters: voters.iter().copied().map(hex).collect(),
            learners: membership.learner_ids().map(hex).collect(),
            term: m.current_term,
            applied: m.last_applied.map(|l| l.index),
            layout_epoch: self
                .store
                .cluster_layout()
                .ok()
                .flatten()
                .map(|l| l.epoch()),
            inodes: self.store.stats().map(|s| s.inodes).unwrap_or(0),
            notice: self.notice.clone(),
        }
    }

    /// The local replica's applied index and state digest, read in one transaction.
    pub async fn digest(&self) -> Result<(Option<u64>, u64), AgentError> {
        let store = self.store.clone();
        let (marker, digest) = tokio::task::spawn_blocking(move || store.digest())
            .await
            .map_err(meta_err)?
            .map_err(meta_err)?;
        let applied = match marker {
            Some(bytes) => postcard::from_bytes::<super::types::AppliedMarker>(&bytes)
                .map_err(meta_err)?
                .last_applied
                .map(|l| l.index),
            None => None,
        };
        Ok((applied, digest))
    }

    /// The local replica, shared.
    pub fn store_arc(&self) -> Arc<MetaStore> {
        self.store.clone()
    }

    pub fn leader(&self) -> Option<u64> {
        self.raft.metrics().borrow().current_leader
    }

    pub fn is_leader(&self) -> bool {
        self.leader() == Some(self.me)
    }

    /// Sends `msg` to `leader`. A dead leader never answers: the call gives up as soon as
    /// this node sees another leader (or none), and the caller resends (same request ids).
    async fn ask_leader<M, T>(&self, leader: u64, msg: &M) -> Result<T, ForwardRefused>
    where
        M: Rpc<Response = Result<T, ForwardRefused>>,
    {
        let Some(addr) = self.member_addr(leader) else {
            return Err(ForwardRefused::NotLeader(None));
        };
        tokio::select! {
            r = self.transport.call(addr, msg, RPC_TIMEOUT) => {
                r.unwrap_or_else(|e| Err(ForwardRefused::Failed(e.to_string())))
            }
            _ = self.leader_changes_from(leader) => Err(ForwardRefused::NotLeader(None)),
        }
    }

    /// Resolves once this node sees a leader other than `leader` (or none).
    async fn leader_changes_from(&self, leader: u64) {
        let mut metrics = self.raft.metrics();
        loop {
            if metrics.borrow_and_update().current_leader != Some(leader) {
                return;
            }
            if metrics.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    }

    /// The RPC address of a member of the group.
    pub fn member_addr(&self, id: u64) -> Option<SocketAddr> {
        let metrics = self.raft.metrics();
        let m = metrics.borrow();
        m.membership_config
            .membership()
            .get_node(&id)
            .and_then(|n: &BasicNode| n.addr.parse().ok())
    }

    async fn submit_local(&self, proposals: Vec<Proposal>) -> Result<Committed, ForwardRefused> {
        let (reply, rx) = oneshot::channel();
        let bytes = encoded_len(&proposals);
        self.batcher
            .send(Pending {
                proposals,
                bytes,
                reply,
            })
            .await
            .map_err(|_| ForwardRefused::Failed("metadata service stopped".into()))?;
        rx.await
            .map_err(|_| ForwardRefused::Failed("metadata service stopped".into()))?
    }

    /// Commits `proposals` through the leader (this node or another) and returns one
    /// outcome each. Retries across elections; proposals with a request id are applied
    /// once however often they are sent.
    pub async fn propose(&self, proposals: Vec<Proposal>) -> Result<Vec<Outcome>, FsError> {
        self.propose_within(proposals, LEADER_WAIT).await
    }

    /// Like [`Self::propose`], waiting at most `wait` for a leader to commit them (the
    /// outcome is then unknown: they may still commit later).
    pub async fn propose_within(
        &self,
        proposals: Vec<Proposal>,
        wait: Duration,
    ) -> Result<Vec<Outcome>, FsError> {
        let deadline = Instant::now() + wait;
        let mut pause = Duration::from_millis(20);
        loop {
            let res = match self.leader() {
                Some(l) if l == self.me => self.submit_local(proposals.clone()).await,
                Some(l) => self.ask_leader(l, &Forward(proposals.clone())).await,
                None => Err(ForwardRefused::NotLeader(None)),
            };
            match res {
                Ok((outcomes, index)) if outcomes.len() == proposals.len() => {
                    // Read-your-writes: what this agent serves next must include them.
                    let applied = self
                        .raft
                        .wait(Some(LEADER_WAIT))
                        .applied_index_at_least(Some(index), "own proposal")
                        .await;
                    if let Err(e) = applied {
                        warn!(error = %e, "committed proposal not applied locally in time");
                    }
                    return Ok(outcomes);
                }
                Ok(_) => {
                    return Err(FsError::Io(
                        "leader answered the wrong number of outcomes".into(),
                    ));
                }
                Err(e) => {
                    if Instant::now() >= deadline {
                        return Err(FsError::Unavailable(format!("no metadata leader: {e:?}")));
                    }
                    debug!(error = ?e, "proposal not committed yet; retrying");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(500));
                }
            }
        }
    }

    /// One proposal.
    pub async fn propose_one(&self, proposal: Proposal) -> Result<Outcome, FsError> {
        let mut out = self.propose(vec![proposal]).await?;
        out.pop().ok_or_else(|| FsError::Io("no outcome".into()))
    }

    /// Waits until the local replica has applied everything committed before this call
    /// (a linearizable read point). Concurrent callers share rounds: a round that started
    /// after a caller arrived covers it (its read index is at least the commit index at
    /// the caller's arrival), so one round at a time serves every caller queued behind it.
    pub async fn barrier(&self) -> Result<(), FsError> {
        let arrived = Instant::now();
        let mut last_round = self.barrier_round.lock().await;
        if last_round.is_some_and(|started| started >= arrived) {
            return Ok(());
        }
        let started = Instant::now();
        self.read_index_round().await?;
        *last_round = Some(started);
        Ok(())
    }

    /// One read-index round: the leader's read index, then wait until applied here.
    async fn read_index_round(&self) -> Result<(), FsError> {
        let deadline = Instant::now() + LEADER_WAIT;
        let mut pause = Duration::from_millis(20);
        loop {
            let index = match self.leader() {
                Some(l) if l == self.me => match self.raft.ensure_linearizable().await {
                    Ok(_) => return Ok(()),
                    Err(e) => Err(ForwardRefused::Failed(e.to_string())),
                },
                Some(l) => self.ask_leader(l, &ReadIndex).await,
                None => Err(ForwardRefused::NotLeader(None)),
            };
            match index {
                Ok(index) => {
                    let waited = self
                        .raft
                        .wait(Some(RPC_TIMEOUT))
                        .applied_index_at_least(Some(index), "read barrier")
                        .await;
                    match waited {
                        Ok(_) => return Ok(()),
                        Err(e) => warn!(error = %e, "replica did not catch up for a read"),
                    }
                }
                Err(e) => debug!(error = ?e, "read barrier not served yet; retrying"),
            }
            if Instant::now() >= deadline {
                return Err(FsError::Unavailable("no metadata leader for a read".into()));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(500));
        }
    }

    /// Records an open handle (idempotent: a mount re-announces its handles after
    /// reconnecting).
    pub fn hold(&self, session: u64, handle: u64, ino: Ino, pid: Option<i32>) {
        self.held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((session, handle), (ino, pid));
    }

    pub fn release(&self, session: u64, handle: u64) {
        self.held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(session, handle));
    }

    /// Which of `inos` a live local mount holds open. Handles of a mount process that
    /// has exited are forgotten here (it cannot close them any more). Right after this
    /// agent started, mounts may not have re-announced their handles yet: then every
    /// inode counts as held.
    pub fn held_among(&self, inos: &[Ino]) -> Vec<Ino> {
        if self.started.elapsed() < REANNOUNCE_GRACE {
            return inos.to_vec();
        }
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.retain(|_, (_, pid)| pid.is_none_or(|p| Path::new(&format!("/proc/{p}")).exists()));
        inos.iter()
            .copied()
            .filter(|i| held.values().any(|(h, _)| h == i))
            .collect()
    }

    /// Asks every peer in `addrs` which of `inos` they hold open; unreachable peers count
    /// as holding all of them (their mounts may still read).
    pub async fn held_anywhere(&self, inos: &[Ino], addrs: &[SocketAddr]) -> Vec<Ino> {
        let mut held = self.held_among(inos);
        for addr in addrs {
            match self
                .transport
                .call(*addr, &HeldOpen(inos.to_vec()), RPC_TIMEOUT)
                .await
            {
                Ok(h) => held.extend(h),
                Err(_) => return inos.to_vec(),
            }
        }
        held.sort_unstable();
        held.dedup();
        held
    }

    /// Whether the agent at `addr` already belongs to an initialized group.
    pub async fn peer_initialized(&self, addr: SocketAddr) -> Option<bool> {
        self.transport.call(addr, &Hello, RPC_TIMEOUT).await.ok()
    }
}

/// Asks the leader (through the members the old state knew, in turn), until it answers,
/// to take this node out of the group (its Raft state was reset); then lets Raft messages
/// in again.
async fn leave_group_for_rejoin(meta: Arc<MetaService>, peers: Vec<SocketAddr>) {
    let mut pause = Duration::from_millis(200);
    for peer in peers.iter().cycle() {
        let result = meta
            .transport
            .call(*peer, &Rejoin { node: meta.me }, RPC_TIMEOUT)
            .await
            .unwrap_or_else(|e| Err(ForwardRefused::Failed(e.to_string())));
        match result {
            Ok(()) => {
                meta.rejoining
                    .store(false, std::sync::atomic::Ordering::Release);
                tracing::info!("out of the metadata group; joining again as a learner");
                return;
            }
            Err(e) => debug!(%peer, error = ?e, "the leader has not taken this node out yet"),
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(2));
    }
}

/// The leader's proposal batcher: everything that queued while earlier entries were in
/// flight goes out as one log entry (Raft costs one flush per entry, not per proposal), up
/// to [`MAX_BATCH`] proposals and [`MAX_BATCH_BYTES`]. Each entry carries this process's
/// [`LeaderStamp`], which drives the cluster clock.
async fn batch_proposals(raft: Raft, mut rx: mpsc::Receiver<Pending>, metrics: MetaMetrics) {
    let slots = Arc::new(Semaphore::new(IN_FLIGHT_ENTRIES));
    let run: u64 = rand::random();
    let origin = Instant::now();
    let mut carried: Option<Pending> = None;
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let first = match carried.take() {
            Some(p) => p,
            None => match rx.recv().await {
                Some(p) => p,
                None => return,
            },
        };
        let (mut count, mut bytes) = (first.proposals.len(), first.bytes);
        let mut group = vec![first];
        while count < MAX_BATCH {
            match rx.try_recv() {
                Ok(p) if bytes + p.bytes > MAX_BATCH_BYTES => {
                    carried = Some(p);
                    break;
                }
                Ok(p) => {
                    count += p.proposals.len();
                    bytes += p.bytes;
                    group.push(p);
                }
                Err(_) => break,
            }
        }
        let mut proposals = Vec::with_capacity(count);
        let mut waiters = Vec::with_capacity(group.len());
        for p in group {
            waiters.push((p.proposals.len(), p.reply));
            proposals.extend(p.proposals);
        }
        metrics.entries.inc();
        metrics.proposals.inc_by(proposals.len() as u64);
        let proposed = Instant::now();
        let stamp = LeaderStamp {
            run,
            millis: u64::try_from(origin.elapsed().as_millis()).unwrap_or(u64::MAX),
        };
        let batch = Batch {
            proposals,
            stamp: Some(stamp),
        };
        let receiver = raft.client_write_ff(batch).await;
        tokio::spawn(async move {
            let result: Result<Committed, ForwardRefused> = match receiver {
                Err(fatal) => Err(ForwardRefused::Failed(fatal.to_string())),
                Ok(rx) => match rx.await {
                    Err(_) => Err(ForwardRefused::Failed("proposal dropped".into())),
                    Ok(Ok(resp)) => Ok((resp.data, resp.log_id.index)),
                    Ok(Err(ClientWriteError::ForwardToLeader(f))) => {
                        Err(ForwardRefused::NotLeader(f.leader_id))
                    }
                    Ok(Err(e)) => Err(ForwardRefused::Failed(e.to_string())),
                },
            };
            drop(permit);
            debug!(
                elapsed_us = proposed.elapsed().as_micros() as u64,
                proposals = count,
                "entry committed"
            );
            match result {
                Ok((mut outcomes, index)) => {
                    for (n, reply) in waiters {
                        let rest = outcomes.split_off(n.min(outcomes.len()));
                        let _ = reply.send(Ok((std::mem::replace(&mut outcomes, rest), index)));
                    }
                }
                Err(e) => {
                    for (_, reply) in waiters {
                        let _ = reply.send(Err(e.clone()));
                    }
                }
            }
        });
    }
}
