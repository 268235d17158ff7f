//! The gossip driver: the one task that owns the gossip UDP socket and the SWIM timers.
//!
//! A node with no live peers re-announces to its seeds every second (`REANNOUNCE_EVERY`);
//! its own address in the seed list is skipped.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use foca::Timer;
use tokio::net::UdpSocket;
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::envelope::{self, ReplayGuard, Sender};
use crate::facts::NodeFacts;
use crate::identity::{MemberId, NodeId};
use crate::membership::{Effect, MemberEvent, MemberState, MemberView, Membership};
use crate::metrics::{MeshMetrics, ReasonLabel, StateLabel};
use crate::node_cert::Revocations;
use crate::sim_net::{SimNet, SimSocket};
use crate::tls::ClusterKey;
use crate::{LegacyGossip, MeshError};

type FactsUpdate = Box<dyn FnOnce(&mut NodeFacts) + Send>;

enum Command {
    Publish(FactsUpdate),
    Members(oneshot::Sender<Vec<MemberView>>),
    Leave(oneshot::Sender<()>),
}

/// How the rest of the agent talks to the gossip task.
#[derive(Clone)]
pub struct GossipHandle {
    commands: mpsc::Sender<Command>,
    events: broadcast::Sender<MemberEvent>,
}

impl GossipHandle {
    /// Every member this node knows of, itself included.
    pub async fn members(&self) -> Result<Vec<MemberView>, MeshError> {
        let (tx, rx) = oneshot::channel();
        self.send(Command::Members(tx)).await?;
        rx.await.map_err(|_| MeshError::GossipStopped)
    }

    /// Publishes a new version of this node's facts.
    pub async fn publish(
        &self,
        update: impl FnOnce(&mut NodeFacts) + Send + 'static,
    ) -> Result<(), MeshError> {
        self.send(Command::Publish(Box::new(update))).await
    }

    /// Leaves the cluster gracefully; the gossip task stops afterwards.
    pub async fn leave(&self) -> Result<(), MeshError> {
        let (tx, rx) = oneshot::channel();
        self.send(Command::Leave(tx)).await?;
        rx.await.map_err(|_| MeshError::GossipStopped)
    }

    /// Membership changes from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<MemberEvent> {
        self.events.subscribe()
    }

    async fn send(&self, cmd: Command) -> Result<(), MeshError> {
        self.commands
            .send(cmd)
            .await
            .map_err(|_| MeshError::GossipStopped)
    }
}

/// Rejected-packet sources already logged; later rejections are only counted.
const MAX_LOGGED_SOURCES: usize = 1024;
/// How often a node with no peers re-announces itself to the seeds.
const REANNOUNCE_EVERY: Duration = Duration::from_secs(1);

/// Where gossip's datagrams go: a UDP socket, or the simulator's network.
enum Socket {
    Udp(UdpSocket),
    Sim(SimSocket),
}

impl Socket {
    async fn recv_from(&mut self, buf: &mut [u8]) -> std::io::Result<(usize, SocketAddr)> {
        match self {
            Socket::Udp(s) => s.recv_from(buf).await,
            Socket::Sim(s) => s.recv_from(buf).await,
        }
    }

    fn try_send_to(&self, packet: &[u8], to: SocketAddr) -> std::io::Result<usize> {
        match self {
            Socket::Udp(s) => s.try_send_to(packet, to),
            Socket::Sim(s) => s.try_send_to(packet, to),
        }
    }
}

/// What a driver needs besides its socket and membership.
struct Parts {
    key: ClusterKey,
    seeds: Vec<SocketAddr>,
    metrics: MeshMetrics,
    legacy: LegacyGossip,
    revocations: Arc<Revocations>,
}

pub struct GossipDriver {
    socket: Socket,
    key: ClusterKey,
    membership: Membership,
    seeds: Vec<SocketAddr>,
    metrics: MeshMetrics,
    events: broadcast::Sender<MemberEvent>,
    timers: BinaryHeap<Reverse<(Instant, u64)>>,
    pending: HashMap<u64, Timer<MemberId>>,
    next_timer: u64,
    logged_sources: HashSet<IpAddr>,
    /// This node in its packets' envelopes; the counter grows with every packet.
    sender: Sender,
    /// Which senders' packets were seen, to refuse replays.
    replays: ReplayGuard,
    legacy: LegacyGossip,
    /// Whose gossip to drop: nodes whose certificate the cluster revoked.
    revocations: Arc<Revocations>,
}

impl GossipDriver {
    /// Binds the gossip socket at the member's address and starts the task.
    pub async fn start(
        membership: Membership,
        key: ClusterKey,
        seeds: Vec<SocketAddr>,
        metrics: MeshMetrics,
        legacy: LegacyGossip,
        revocations: Arc<Revocations>,
    ) -> Result<(GossipHandle, tokio::task::JoinHandle<()>), MeshError> {
        let addr = membership.me().addr;
        let socket = UdpSocket::bind(addr)
            .await
            .map_err(|source| MeshError::Bind { addr, source })?;
        let parts = Parts {
            key,
            seeds,
            metrics,
            legacy,
            revocations,
        };
        Ok(GossipDriver::launch(Socket::Udp(socket), membership, parts))
    }

    /// Like [`GossipDriver::start`], on the simulator's network.
    pub fn start_sim(
        net: &Arc<SimNet>,
        membership: Membership,
        key: ClusterKey,
        seeds: Vec<SocketAddr>,
    ) -> (GossipHandle, tokio::task::JoinHandle<()>) {
        let socket = Socket::Sim(net.bind_datagrams(membership.me().addr));
        let parts = Parts {
            key,
            seeds,
            metrics: MeshMetrics::register(&mut prometheus_client::registry::Registry::default()),
            legacy: LegacyGossip::default(),
            revocations: Arc::new(Revocations::default()),
        };
        GossipDriver::launch(socket, membership, parts)
    }

    /// Starts the driver's task on `socket`.
    fn launch(
        socket: Socket,
        membership: Membership,
        parts: Parts,
    ) -> (GossipHandle, tokio::task::JoinHandle<()>) {
        let Parts {
            key,
            seeds,
            metrics,
            legacy,
            revocations,
        } = parts;
        let me = membership.me();
        let addr = me.addr;
        // The epoch is the generation this process started with: it grows with every
        // start, so a receiver refuses packets of this node's earlier lives.
        let sender = Sender {
            node: me.node.0,
            epoch: me.generation,
            counter: 0,
        };
        let (cmd_tx, cmd_rx) = mpsc::channel(64);
        let (events, _) = broadcast::channel(256);
        let driver = GossipDriver {
            socket,
            key,
            membership,
            seeds: seeds.into_iter().filter(|s| *s != addr).collect(),
            metrics,
            events: events.clone(),
            timers: BinaryHeap::new(),
            pending: HashMap::new(),
            next_timer: 0,
            logged_sources: HashSet::new(),
            sender,
            replays: ReplayGuard::default(),
            legacy,
            revocations,
        };
        let task = tokio::spawn(driver.run(cmd_rx));
        let handle = GossipHandle {
            commands: cmd_tx,
            events,
        };
        (handle, task)
    }

    async fn run(mut self, mut commands: mpsc::Receiver<Command>) {
        let mut buf = vec![0u8; 65_536];
        let mut tick = tokio::time::interval(REANNOUNCE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let next = self.timers.peek().map(|Reverse((at, _))| *at);
            tokio::select! {
                recv = self.socket.recv_from(&mut buf) => match recv {
                    Ok((len, from)) => self.on_packet(from, len, &buf),
                    Err(e) => debug!(error = %e, "gossip recv failed"),
                },
                _ = sleep_until(next) => self.fire_due_timers(),
                _ = tick.tick() => self.on_tick(),
                cmd = commands.recv() => match cmd {
                    Some(Command::Publish(update)) => {
                        let res = self.membership.publish(update);
                        self.apply(res);
                    }
                    Some(Command::Members(reply)) => {
                        let _ = reply.send(self.membership.members());
                    }
                    Some(Command::Leave(reply)) => {
                        let res = self.membership.leave();
                        self.apply(res);
                        info!("left the cluster");
                        let _ = reply.send(());
                        return;
                    }
                    None => return,
                },
            }
        }
    }

    fn on_packet(&mut self, from: SocketAddr, len: usize, buf: &[u8]) {
        let packet = &buf[..len];
        let opened = envelope::open(&self.key.0, packet, self.legacy.accepts_v1()).and_then(|o| {
            match o.sender {
                Some(s) if !self.replays.admit(&s) => Err(envelope::Rejection::Replayed),
                Some(s) if self.revocations.silences(NodeId(s.node)) => {
                    Err(envelope::Rejection::Revoked)
                }
                _ => Ok(o.payload),
            }
        });
        match opened {
            Ok(payload) => {
                self.metrics.gossip_packets_received.inc();
                let res = self
                    .membership
                    .handle_data(from, payload, Instant::now().into_std());
                self.apply(res);
            }
            Err(rejection) => {
                self.metrics
                    .gossip_packets_rejected
                    .get_or_create(&ReasonLabel {
                        reason: rejection.label(),
                    })
                    .inc();
                if rejection == envelope::Rejection::Replayed {
                    // Sealed with the cluster's key, sent before: a replay (or, rarely, a
                    // datagram the network duplicated). Counted; not worth a warning each.
                    debug!(%from, "refused a replayed gossip packet");
                } else if self.logged_sources.len() < MAX_LOGGED_SOURCES
                    && self.logged_sources.insert(from.ip())
                {
                    warn!(%from, reason = rejection.label(),
                        "rejected gossip packet (logged once per source)");
                }
            }
        }
    }

    fn fire_due_timers(&mut self) {
        let now = Instant::now();
        while let Some(Reverse((at, id))) = self.timers.peek().copied() {
            if at > now {
                break;
            }
            self.timers.pop();
            if let Some(timer) = self.pending.remove(&id) {
                let res = self.membership.handle_timer(timer, now.into_std());
                self.apply(res);
            }
        }
    }

    fn on_tick(&mut self) {
        if self.membership.active_peers() == 0 {
            for seed in self.seeds.clone() {
                let res = self.membership.announce(seed);
                self.apply(res);
            }
        }
        // Suspicion changes emit no event: refresh the gauges every tick too.
        self.update_gauges();
    }

    fn update_gauges(&self) {
        let mut counts: HashMap<&'static str, i64> = ["alive", "suspect", "down", "left"]
            .into_iter()
            .map(|s| (s, 0))
            .collect();
        for m in self.membership.members() {
            *counts.entry(state_label(m.state)).or_default() += 1;
        }
        for (state, n) in counts {
            self.metrics
                .members
                .get_or_create(&StateLabel { state })
                .set(n);
        }
    }

    fn apply(&mut self, res: Result<Vec<Effect>, MeshError>) {
        match res {
            Ok(effects) => self.apply_now(effects),
            Err(e) => debug!(error = %e, "membership step failed"),
        }
    }

    fn apply_now(&mut self, effects: Vec<Effect>) {
        for effect in effects {
            match effect {
                Effect::Send { to, payload } => {
                    let packet = if self.legacy == LegacyGossip::Speak {
                        envelope::seal_v1(&self.key.0, &payload)
                    } else {
                        self.sender.counter += 1;
                        envelope::seal(&self.key.0, &self.sender, &payload)
                    };
                    // UDP send on a non-full socket completes at once; a full one drops the
                    // packet, which SWIM tolerates.
                    if let Err(e) = self.socket.try_send_to(&packet, to) {
                        debug!(%to, error = %e, "gossip send dropped");
                    }
                }
                Effect::Schedule { after, timer } => {
                    let id = self.next_timer;
                    self.next_timer += 1;
                    self.timers.push(Reverse((Instant::now() + after, id)));
                    self.pending.insert(id, timer);
                }
                Effect::Event(event) => {
                    match &event {
                        MemberEvent::Up(id) => {
                            info!(node = %id.node, addr = %id.addr, generation = id.generation, "member up")
                        }
                        MemberEvent::Down(id) => {
                            warn!(node = %id.node, addr = %id.addr, "member down")
                        }
                        MemberEvent::Rejoined(id) => warn!(
                            generation = id.generation,
                            "this node was declared down; rejoined under a new generation"
                        ),
                        MemberEvent::Alone => info!("no other members reachable"),
                    }
                    // Nobody listening is fine.
                    let _ = self.events.send(event);
                    self.update_gauges();
                }
            }
        }
    }
}

pub(crate) fn state_label(state: MemberState) -> &'static str {
    match state {
        MemberState::Alive => "alive",
        MemberState::Suspect => "suspect",
        MemberState::Down => "down",
        MemberState::Left => "left",
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
