//! [`Group`]: this agent's member of the metadata Raft group — proposals (batched on the
//! leader by the `batcher` worker, forwarded by followers), linearizable read barriers,
//! and the local replica for queries.
//!
//! A follower forwards proposals (`meta/forward`) and then waits until its own replica has
//! applied the entry (read-your-writes). Proposals wait up to 60 s for a leader. A read
//! barrier asks the leader's read index (`meta/read-index`, openraft's `get_read_log_id`)
//! and waits until the replica applied it; concurrent barriers share rounds
//! (`read_rounds.rs`), and within its read lease the leader skips the round (`lease.rs`).
//! A member that led starts with its vote uncommitted ([`stand_down`]), so a restarted
//! leader leads again only by winning an election (a few seconds without a leader).

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use openraft::error::{CheckIsLeaderError, RaftError};
use openraft::{BasicNode, ChangeMembers, Config, SnapshotPolicy};
use shoal_mesh::{FailureClass, Refusal, Rpc, Transport};
use shoal_namespace::{NamespaceStore, Outcome, Proposal};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, warn};

use super::ballast::Ballast;
use super::batcher::{Batcher, MAX_BATCH_BYTES, Pending, encoded_len};
use super::config::MetaConfig;
use super::error::ConsensusError;
use super::lease::ReadLease;
use super::log_store::LogStore;
use super::metrics::MetaMetrics;
use super::net::{
    Committed, Forward, ForwardRefused, Hello, Network, RaftMessage, RaftReply, ReadIndex,
};
use super::read_rounds::ReadRounds;
use super::rejoin::{Rejoin, Rejoiner};
use super::send_gate::SendGate;
use super::state_machine::StateMachine;
use super::types::Raft;

/// How long a request waits for a leader (elections, restarts) before it fails.
const LEADER_WAIT: Duration = Duration::from_secs(60);
const RPC_TIMEOUT: Duration = Duration::from_secs(10);

/// This agent's member of the metadata group.
pub struct Group {
    pub raft: Raft,
    store: Arc<NamespaceStore>,
    pub me: u64,
    pub config: MetaConfig,
    transport: Arc<Transport>,
    batcher: mpsc::Sender<Pending>,
    pub metrics: MetaMetrics,
    /// What the local replica's applies changed, for the mounts' kernel caches.
    pub changes: Arc<super::ChangeFeed>,
    /// The read-index rounds in flight, shared by concurrent barriers.
    read_rounds: ReadRounds,
    /// While held, the leader answers read index without a round (see `lease.rs`).
    lease: std::sync::Mutex<ReadLease>,
    /// Space the metadata log can always write.
    pub ballast: Arc<Ballast>,
    /// Set while this node's Raft state was reset (a stale data dir) and the leader has
    /// not yet taken it out of the group: every Raft message is refused meanwhile.
    rejoining: std::sync::atomic::AtomicBool,
    /// Set when the node stops: requests from peers are refused from then on, so nothing
    /// reaches Raft after it shut down.
    stopping: std::sync::atomic::AtomicBool,
    /// Raft's sends to peers, closed by `stop` once they are done.
    sends: Arc<SendGate>,
    /// Shown in status (see [`shoal_agent_api::MetaStatus::notice`]).
    notice: Option<String>,
    /// While this node belongs to no group: what it waits for (set by the steward), shown
    /// in status and answered to requests instead of waiting for a leader that cannot come.
    waiting_for_group: std::sync::Mutex<Option<String>>,
    /// The cluster clock's value as last read, and when this node first saw it.
    clock_seen: std::sync::Mutex<(u64, Instant)>,
    /// Why this member's Raft core stopped (a storage failure), once it did: from then on
    /// it leads nothing and serves nothing, and the agent exits for its supervisor to
    /// restart it (see `core_watch.rs`).
    failed: tokio::sync::watch::Sender<Option<String>>,
}

/// The workers a started group needs run: the leader's batcher, and (after a stale data
/// dir) the one that asks to be taken out of the group.
pub struct GroupWorkers {
    pub batcher: Batcher,
    pub rejoiner: Option<Rejoiner>,
}

/// A member's log and replica, opened, and where they live.
struct Opened<'a> {
    log: LogStore,
    store: Arc<NamespaceStore>,
    disk: Arc<dyn shoal_disk::Disk>,
    dir: &'a Path,
    ballast: Arc<Ballast>,
}

/// A member that led when it stopped does not lead again at start in the same term.
/// openraft 0.9 resumes a leader whose vote is committed and its own, but the log behind
/// it may have lost entries it had already sent out before they were synced here (a
/// leader replicates before its own flush): resumed, it would write new entries under the
/// same log ids, two different entries under one id, which Raft's log matching cannot
/// tell apart; a follower holding the new one never takes the committed one (found by the
/// simulator, seed 8 of `drain`: a restarted leader's replica never applied an
/// acknowledged write). Its vote is kept, uncommitted: it stays voted for itself in that
/// term and stands for the next, as a candidate whose election did not finish.
async fn stand_down(log: &mut LogStore, me: u64) -> Result<(), openraft::StorageError<u64>> {
    use openraft::storage::RaftLogStorage;
    if let Some(vote) = log.read_vote().await?
        && vote.is_committed()
        && vote.leader_id().voted_for() == Some(me)
    {
        log.save_vote(&openraft::Vote::new(vote.leader_id().term, me))
            .await?;
    }
    Ok(())
}

fn setup(e: impl std::error::Error + Send + Sync + 'static) -> ConsensusError {
    ConsensusError::Setup(Box::new(e))
}

impl Group {
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
    ) -> Result<(Arc<Group>, GroupWorkers), ConsensusError> {
        let io = |source| ConsensusError::DataDir {
            path: dir.to_owned(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        let ballast = Arc::new(Ballast::open(dir));
        let log =
            LogStore::open(dir, me, ballast.clone(), metrics.log.clone()).map_err(|source| {
                ConsensusError::Log {
                    path: dir.join("log"),
                    source,
                }
            })?;
        let store =
            Arc::new(NamespaceStore::open(&dir.join("state.redb")).map_err(ConsensusError::from)?);
        // redb does not sync the directory of a file it creates: without this, a power cut
        // could forget `state.redb` after the log behind its first snapshot was purged.
        crate::durable::sync_dir(dir).map_err(io)?;
        let opened = Opened {
            log,
            store,
            disk: Arc::new(shoal_disk::OsDisk),
            dir,
            ballast,
        };
        Self::assemble(opened, me, config, transport, metrics, rejoin).await
    }

    /// Like [`Group::start`], with the member's state under `dir` on `disk` (the
    /// simulator's, which loses what was not synced at a power cut).
    pub async fn start_on(
        disk: Arc<dyn shoal_disk::Disk>,
        dir: &Path,
        ballast: Arc<Ballast>,
        me: u64,
        config: MetaConfig,
        transport: Arc<Transport>,
        metrics: MetaMetrics,
    ) -> Result<(Arc<Group>, GroupWorkers), ConsensusError> {
        let io = |source| ConsensusError::DataDir {
            path: dir.to_owned(),
            source,
        };
        disk.create_dir_all(dir).map_err(io)?;
        let log = LogStore::open_on(disk.clone(), dir, me, ballast.clone(), metrics.log.clone())
            .map_err(|source| ConsensusError::Log {
                path: dir.join("log"),
                source,
            })?;
        let file = disk.open(&dir.join("state.redb"), true).map_err(io)?;
        let store = Arc::new(NamespaceStore::open_on(file).map_err(ConsensusError::from)?);
        disk.sync_dir(dir).map_err(io)?;
        let opened = Opened {
            log,
            store,
            disk,
            dir,
            ballast,
        };
        Self::assemble(opened, me, config, transport, metrics, None).await
    }

    /// Starts Raft on an opened log and replica.
    async fn assemble(
        opened: Opened<'_>,
        me: u64,
        config: MetaConfig,
        transport: Arc<Transport>,
        metrics: MetaMetrics,
        rejoin: Option<(String, Vec<SocketAddr>)>,
    ) -> Result<(Arc<Group>, GroupWorkers), ConsensusError> {
        let Opened {
            mut log,
            store,
            disk,
            dir,
            ballast,
        } = opened;
        let changes = Arc::new(super::ChangeFeed::new());
        let sm = StateMachine::new(store.clone(), disk, dir, changes.clone(), log.append_sync());
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
        .map_err(setup)?;
        let sends = Arc::new(SendGate::new());
        let network = Network {
            transport: transport.clone(),
            append_budget: super::net::append_budget(config.heartbeat_ms, MAX_BATCH_BYTES),
            gate: sends.clone(),
        };
        stand_down(&mut log, me).await.map_err(setup)?;
        let raft = Raft::new(me, Arc::new(raft_config), network, log, sm)
            .await
            .map_err(setup)?;
        let (tx, rx) = mpsc::channel(4096);
        let lease = std::sync::Mutex::new(ReadLease::new(config.election_ms[0]));

        let group = Arc::new(Group {
            raft: raft.clone(),
            store,
            me,
            config,
            transport: transport.clone(),
            batcher: tx,
            changes,
            lease,
            metrics: metrics.clone(),
            read_rounds: ReadRounds::default(),
            ballast,
            rejoining: std::sync::atomic::AtomicBool::new(rejoin.is_some()),
            stopping: std::sync::atomic::AtomicBool::new(false),
            sends,
            notice: rejoin.as_ref().map(|(n, _)| n.clone()),
            waiting_for_group: std::sync::Mutex::new(None),
            clock_seen: std::sync::Mutex::new((0, Instant::now())),
            failed: tokio::sync::watch::Sender::new(None),
        });
        group.register_handlers();
        let workers = GroupWorkers {
            batcher: Batcher::new(raft, rx, metrics),
            rejoiner: rejoin.map(|(_, peers)| Rejoiner::new(group.clone(), peers)),
        };
        Ok((group, workers))
    }

    /// Why this member's Raft core stopped, once it did.
    pub fn failure(&self) -> Option<String> {
        self.failed.borrow().clone()
    }

    /// Resolves with the reason once this member's Raft core stopped.
    pub async fn core_failed(&self) -> String {
        let mut rx = self.failed.subscribe();
        match rx.wait_for(Option::is_some).await {
            Ok(reason) => reason.clone().unwrap_or_default(),
            Err(_) => std::future::pending().await,
        }
    }

    /// Records that the Raft core stopped (the first reason is kept). Not while the agent
    /// stops: a stopped core is then expected.
    pub(super) fn core_stopped(&self, reason: String) {
        if self.is_stopping() {
            return;
        }
        self.failed.send_if_modified(|f| {
            if f.is_some() {
                return false;
            }
            tracing::error!(%reason, "the metadata member stopped; it leads and serves nothing from now on, and the agent exits for its supervisor to restart it");
            *f = Some(reason);
            true
        });
    }

    fn member_failed(&self) -> Result<(), ConsensusError> {
        match self.failure() {
            Some(reason) => Err(ConsensusError::MemberFailed(reason)),
            None => Ok(()),
        }
    }

    fn is_rejoining(&self) -> bool {
        self.rejoining.load(std::sync::atomic::Ordering::Acquire)
    }

    fn is_stopping(&self) -> bool {
        self.stopping.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Stops this member: peers' requests are refused from now on, then Raft shuts down
    /// and the replica's last applies are flushed.
    pub async fn stop(&self) {
        self.stopping
            .store(true, std::sync::atomic::Ordering::Release);
        if let Err(e) = self.raft.shutdown().await {
            warn!(error = %e, "metadata service did not stop cleanly");
        }
        // Replication tasks outlive the core: let their last sends finish before the
        // connections close.
        if !self.sends.close(Duration::from_secs(2)).await {
            warn!("Raft messages to peers were still under way 2 s after the stop");
        }
        // Applies are flushed in groups; a clean stop flushes the rest (a crash replays
        // them from the log instead).
        if let Err(e) = self.store.persist() {
            warn!(error = %e, "could not flush the metadata state");
        }
    }

    /// Lets Raft messages in again (the leader has taken this node out of the group).
    pub(super) fn rejoined(&self) {
        self.rejoining
            .store(false, std::sync::atomic::Ordering::Release);
    }

    pub(super) fn transport(&self) -> &Transport {
        &self.transport
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
            .map_err(|e| ForwardRefused::Unavailable(e.to_string()))
    }

    fn register_handlers(self: &Arc<Self>) {
        let this = self.clone();
        self.transport.register(move |_from, msg: RaftMessage| {
            let raft = this.raft.clone();
            let refusing = this.is_rejoining() || this.is_stopping();
            async move {
                if refusing {
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
            async move {
                if this.is_stopping() {
                    return Ok(Err(ForwardRefused::Unavailable(
                        "this agent is stopping".into(),
                    )));
                }
                Ok(this.submit_local(msg.0).await)
            }
        });
        let this = self.clone();
        self.transport.register(move |_from, _: ReadIndex| {
            let this = this.clone();
            async move {
                if this.is_stopping() {
                    return Ok(Err(ForwardRefused::Unavailable(
                        "this agent is stopping".into(),
                    )));
                }
                Ok(this.leader_read_index().await)
            }
        });
        let this = self.clone();
        self.transport.register(move |_from, msg: Rejoin| {
            let this = this.clone();
            async move {
                if this.is_stopping() {
                    return Ok(Err(ForwardRefused::Unavailable(
                        "this agent is stopping".into(),
                    )));
                }
                Ok(this.drop_member(msg.node).await)
            }
        });
        let this = self.clone();
        self.transport.register(move |_from, _: Hello| {
            let this = this.clone();
            async move {
                // A stopping member must not look uninitialized to a peer deciding to
                // form a new group: it does not answer.
                if this.is_stopping() {
                    return Err(Refusal::new(
                        FailureClass::Retryable,
                        "this agent is stopping",
                    ));
                }
                Ok(this.raft.is_initialized().await.unwrap_or(false))
            }
        });
    }

    /// The local replica (possibly a little behind the leader; see [`Self::barrier`]).
    pub fn store(&self) -> &NamespaceStore {
        &self.store
    }

    /// The cluster clock now, in milliseconds: the replica's value (which moves only when
    /// entries are applied) plus the time since this node first saw that value, so it
    /// goes on while the cluster is idle. Never ahead of the leader's clock: the value may
    /// have been applied before this node looked.
    pub fn cluster_now_ms(&self) -> Result<u64, ConsensusError> {
        let value = self.store.clock_ms()?;
        let mut seen = self.clock_seen.lock().unwrap_or_else(|p| p.into_inner());
        if seen.0 != value {
            *seen = (value, Instant::now());
        }
        Ok(value + seen.1.elapsed().as_millis() as u64)
    }

    /// The local replica, shared.
    pub fn store_arc(&self) -> Arc<NamespaceStore> {
        self.store.clone()
    }

    /// What `shoal status` shows about the group.
    pub fn status(&self) -> shoal_agent_api::MetaStatus {
        let hex = |id: u64| format!("{id:016x}");
        let metrics = self.raft.metrics();
        let m = metrics.borrow();
        let membership = m.membership_config.membership();
        shoal_agent_api::MetaStatus {
            leader: m.current_leader.map(hex),
            voters: membership.voter_ids().map(hex).collect(),
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
            notice: match (self.waiting_for_group(), &self.notice) {
                (Some(waiting), Some(notice)) => Some(format!("{waiting}; {notice}")),
                (waiting, notice) => waiting.or_else(|| notice.clone()),
            },
            failed: self.failure(),
        }
    }

    /// Records what this node waits for while it belongs to no group (None once it does).
    pub fn set_waiting_for_group(&self, why: Option<String>) {
        *self
            .waiting_for_group
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = why;
    }

    fn waiting_for_group(&self) -> Option<String> {
        self.waiting_for_group
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The error for a request that found no leader: [`ConsensusError::NotMember`] while
    /// this node belongs to no group (no leader can come until it does), else None (an
    /// election may be under way: the caller waits).
    async fn outside_any_group(&self) -> Option<ConsensusError> {
        let why = self.waiting_for_group()?;
        // The steward looks once a second: the group may have added this node since.
        match self.raft.is_initialized().await {
            Ok(false) => Some(ConsensusError::NotMember { why }),
            _ => None,
        }
    }

    /// The local replica's applied index and state digest, read in one transaction.
    pub async fn digest(&self) -> Result<(Option<u64>, u64), ConsensusError> {
        let store = self.store.clone();
        let (marker, digest) = crate::sim_thread::blocking(move || store.digest()).await??;
        let applied = match marker {
            Some(bytes) => postcard::from_bytes::<super::types::AppliedMarker>(&bytes)?
                .last_applied
                .map(|l| l.index),
            None => None,
        };
        Ok((applied, digest))
    }

    /// The leader as this member knows it; none once its core stopped (its metrics are
    /// frozen as they were).
    pub fn leader(&self) -> Option<u64> {
        if self.failed.borrow().is_some() {
            return None;
        }
        self.raft.metrics().borrow().current_leader
    }

    pub fn is_leader(&self) -> bool {
        self.leader() == Some(self.me)
    }

    /// Whether this node belongs to an initialized group.
    pub async fn is_initialized(&self) -> Result<bool, ConsensusError> {
        self.raft
            .is_initialized()
            .await
            .map_err(|e| ConsensusError::raft("is_initialized", e))
    }

    /// Sends `msg` to `leader`. A dead leader never answers: the call gives up as soon as
    /// this node sees another leader (or none), and the caller resends (same request ids).
    pub(super) async fn ask_leader<M, T>(&self, leader: u64, msg: &M) -> Result<T, ForwardRefused>
    where
        M: Rpc<Response = Result<T, ForwardRefused>>,
    {
        let Some(addr) = self.member_addr(leader) else {
            return Err(ForwardRefused::NotLeader(None));
        };
        let leader_id = shoal_mesh::NodeId(leader);
        tokio::select! {
            r = self.transport.call_to(leader_id, addr, msg, RPC_TIMEOUT) => {
                r.unwrap_or_else(|e| Err(ForwardRefused::Unavailable(e.to_string())))
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

    /// Where each member of the group listens, as a lookup the stripe coordinator keeps
    /// (its `AddressBook`: where to ask a node gossip has not heard of).
    pub fn address_book(
        self: &Arc<Self>,
    ) -> Arc<dyn Fn(shoal_placement::NodeId) -> Option<SocketAddr> + Send + Sync> {
        let group = self.clone();
        Arc::new(move |node| group.member_addr(node.0))
    }

    /// The members of the group (voters and learners), as this member knows them.
    pub fn member_ids(&self) -> Vec<u64> {
        let metrics = self.raft.metrics();
        let m = metrics.borrow();
        m.membership_config
            .membership()
            .nodes()
            .map(|(id, _)| *id)
            .collect()
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
        let stopped = || ForwardRefused::Unavailable("metadata service stopped".into());
        self.batcher
            .send(Pending {
                proposals,
                bytes,
                reply,
            })
            .await
            .map_err(|_| stopped())?;
        rx.await.map_err(|_| stopped())?
    }

    /// Commits `proposals` through the leader (this node or another) and returns one
    /// outcome each. Retries across elections; proposals with a request id are applied
    /// once however often they are sent.
    pub async fn propose(&self, proposals: Vec<Proposal>) -> Result<Vec<Outcome>, ConsensusError> {
        self.propose_within(proposals, LEADER_WAIT).await
    }

    /// Like [`Self::propose`], waiting at most `wait` for a leader to commit them (the
    /// outcome is then unknown: they may still commit later).
    pub async fn propose_within(
        &self,
        proposals: Vec<Proposal>,
        wait: Duration,
    ) -> Result<Vec<Outcome>, ConsensusError> {
        let started = Instant::now();
        let mut pause = Duration::from_millis(20);
        loop {
            self.member_failed()?;
            let asked = Instant::now();
            let res = match self.leader() {
                Some(l) if l == self.me => self.submit_local(proposals.clone()).await,
                Some(l) => self.ask_leader(l, &Forward(proposals.clone())).await,
                None => Err(ForwardRefused::NotLeader(None)),
            };
            match res {
                Ok((outcomes, index)) if outcomes.len() == proposals.len() => {
                    let committed = asked.elapsed();
                    // Read-your-writes: what this agent serves next must include them.
                    let applied = self
                        .raft
                        .wait(Some(LEADER_WAIT))
                        .applied_index_at_least(Some(index), "own proposal")
                        .await;
                    if let Err(e) = applied {
                        warn!(error = %e, "committed proposal not applied locally in time");
                    }
                    debug!(
                        commit_us = committed.as_micros() as u64,
                        applied_us = asked.elapsed().as_micros() as u64,
                        "proposal committed and applied here"
                    );
                    return Ok(outcomes);
                }
                Ok((outcomes, _)) => {
                    return Err(ConsensusError::OutcomeCount {
                        sent: proposals.len(),
                        got: outcomes.len(),
                    });
                }
                Err(e) => {
                    if matches!(e, ForwardRefused::NotLeader(None))
                        && let Some(outside) = self.outside_any_group().await
                    {
                        return Err(outside);
                    }
                    if started.elapsed() >= wait {
                        return Err(ConsensusError::NoLeader {
                            waited_s: wait.as_secs(),
                            last: Some(e),
                        });
                    }
                    debug!(error = ?e, "proposal not committed yet; retrying");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(500));
                }
            }
        }
    }

    /// One proposal.
    pub async fn propose_one(&self, proposal: Proposal) -> Result<Outcome, ConsensusError> {
        let mut out = self.propose(vec![proposal]).await?;
        out.pop()
            .ok_or(ConsensusError::OutcomeCount { sent: 1, got: 0 })
    }

    /// Waits until the local replica has applied everything committed before this call
    /// (a linearizable read point). Concurrent callers share rounds: a round that started
    /// after a caller arrived covers it (its read index is at least the commit index at
    /// the caller's arrival); see [`ReadRounds`].
    pub async fn barrier(&self) -> Result<(), ConsensusError> {
        let failed = || match self.waiting_for_group() {
            Some(why) => ConsensusError::NotMember { why },
            None => ConsensusError::NoLeader {
                waited_s: LEADER_WAIT.as_secs(),
                last: None,
            },
        };
        self.read_rounds
            .covered(|| self.read_index_round(), failed)
            .await
    }

    /// One read-index round: the leader's read index, then wait until applied here.
    async fn read_index_round(&self) -> Result<(), ConsensusError> {
        let started = Instant::now();
        let mut pause = Duration::from_millis(20);
        loop {
            self.member_failed()?;
            let index = match self.leader() {
                Some(l) if l == self.me => self.leader_read_index().await,
                Some(l) => self.ask_leader(l, &ReadIndex).await,
                None => Err(ForwardRefused::NotLeader(None)),
            };
            let last = match index {
                Ok(index) => {
                    let waited = self
                        .raft
                        .wait(Some(RPC_TIMEOUT))
                        .applied_index_at_least(Some(index), "read barrier")
                        .await;
                    match waited {
                        Ok(_) => return Ok(()),
                        Err(e) => {
                            warn!(error = %e, "replica did not catch up for a read");
                            None
                        }
                    }
                }
                Err(e) => {
                    if matches!(e, ForwardRefused::NotLeader(None))
                        && let Some(outside) = self.outside_any_group().await
                    {
                        return Err(outside);
                    }
                    debug!(error = ?e, "read barrier not served yet; retrying");
                    Some(e)
                }
            };
            if started.elapsed() >= LEADER_WAIT {
                return Err(ConsensusError::NoLeader {
                    waited_s: LEADER_WAIT.as_secs(),
                    last,
                });
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(500));
        }
    }

    /// The read index this node serves as the leader: its last log index while it holds
    /// the read lease (everything committed is in its log), otherwise the outcome of a
    /// heartbeat round to a quorum, which renews the lease. openraft's read index is at
    /// least the first entry of the leader's term, so it covers everything committed
    /// before (a leader always wins its term by election: see `stand_down`).
    async fn leader_read_index(&self) -> Result<u64, ForwardRefused> {
        let (term, leader, last) = {
            let m = self.raft.metrics();
            let m = m.borrow();
            (m.current_term, m.current_leader, m.last_log_index)
        };
        let lease = || self.lease.lock().unwrap_or_else(|e| e.into_inner());
        if leader == Some(self.me) && lease().valid(term, Instant::now()) {
            self.metrics.lease_reads.inc();
            return Ok(last.unwrap_or(0));
        }
        let started = Instant::now();
        match self.raft.get_read_log_id().await {
            Ok((read, _)) => {
                // Leader all along in `term` when the term did not move meanwhile.
                if self.raft.metrics().borrow().current_term == term {
                    lease().renew(term, started);
                }
                Ok(read.map_or(0, |l| l.index))
            }
            Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f))) => {
                Err(ForwardRefused::NotLeader(f.leader_id))
            }
            Err(e) => Err(ForwardRefused::Unavailable(e.to_string())),
        }
    }

    /// Whether the agent at `addr` already belongs to an initialized group.
    pub async fn peer_initialized(&self, addr: SocketAddr) -> Option<bool> {
        self.transport.call(addr, &Hello, RPC_TIMEOUT).await.ok()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use openraft::Vote;
    use openraft::storage::RaftLogStorage;

    use super::super::ballast::Ballast;
    use super::{LogStore, stand_down};

    async fn vote_after_stand_down(me: u64, vote: Vote<u64>) -> Option<Vote<u64>> {
        let dir = tempfile::tempdir().expect("tempdir");
        let ballast = Arc::new(Ballast::open(dir.path()));
        let mut log = LogStore::open(dir.path(), me, ballast, Default::default()).expect("open");
        log.save_vote(&vote).await.expect("vote");
        stand_down(&mut log, me).await.expect("stand down");
        log.read_vote().await.expect("read")
    }

    /// openraft resumes a member whose vote is committed and its own as the leader of that
    /// term: the vote it starts on must not be.
    #[tokio::test]
    async fn a_member_that_led_starts_voted_for_itself_but_not_leading() {
        let mut led = Vote::new(7, 3);
        led.commit();
        let read = vote_after_stand_down(3, led).await.expect("a vote");
        assert_eq!(read, Vote::new(7, 3), "same term, voted for itself");
        assert!(!read.is_committed(), "not the leader of term 7 any more");
    }

    #[tokio::test]
    async fn another_members_leadership_or_an_open_vote_is_kept() {
        let mut other = Vote::new(7, 2);
        other.commit();
        assert_eq!(vote_after_stand_down(3, other).await, Some(other));
        let open = Vote::new(8, 3);
        assert_eq!(vote_after_stand_down(3, open).await, Some(open));
    }
}
