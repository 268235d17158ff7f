//! Members of the real SWIM core ([`Membership`]) on a simulated network with a virtual
//! clock: no sockets, no sleeps, one thread.
//!
//! Packets and timers are events on one queue ordered by virtual time (then by the order
//! they were made). Each packet takes a latency drawn from a generator seeded by the
//! caller, and member `i`'s foca draws from `seed + i`, so one seed replays the same run.
//! The membership tests and the simulator's scale run (`shoal-sim`) drive it; production
//! drives [`Membership`] through the gossip driver.
//!
//! Unlike [`crate::SimNet`], which carries the real gossip driver's datagrams (envelope
//! included) between tasks on tokio's paused clock, this runs the sans-IO cores alone in
//! one loop: cheap enough for a thousand members.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::net::{Ipv4Addr, SocketAddr};
use std::ops::RangeInclusive;
use std::time::{Duration, Instant};

use bytes::Bytes;
use foca::Timer;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use crate::MeshError;
use crate::facts::{NodeFacts, NodeRole};
use crate::identity::{MemberId, NodeId};
use crate::membership::{
    Effect, MemberEvent, MemberState, MemberView, Membership, MembershipConfig,
};

/// The node id of member `i`.
pub fn sim_node_id(i: usize) -> NodeId {
    NodeId(100 + i as u64)
}

/// Where member `i` gossips: `10.0.0.1` for member 0, counting up (room for 2^24 members).
pub fn sim_gossip_addr(i: usize) -> SocketAddr {
    let ip = Ipv4Addr::from(0x0a00_0001u32.wrapping_add(i as u32));
    SocketAddr::from((ip, 7946))
}

/// Facts of a simulated member: three failure domains by node id, room to spare.
pub fn sim_facts(id: MemberId) -> NodeFacts {
    NodeFacts {
        node: id.node,
        generation: id.generation,
        seq: 0,
        name: format!("node{}", id.node.0),
        failure_domain: format!("fd{}", id.node.0 % 3),
        rpc_addr: SocketAddr::new(id.addr.ip(), 7947),
        bulk_addr: None,
        capacity_bytes: 1 << 40,
        used_bytes: 1 << 30,
        role: NodeRole::Active,
        agent_version: "sim".into(),
        store_accepting: true,
        store_room_bytes: 1 << 40,
        repair_bytes_per_sec: 0,
        store_opening: false,
        meta_failed: false,
    }
}

/// A [`MemberEvent`] a member reported, and when (virtual time since the start).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    pub at: Duration,
    pub observer: usize,
    pub event: MemberEvent,
}

/// What waits on the event queue.
enum Pending {
    Timer {
        member: usize,
        life: u64,
        timer: Timer<MemberId>,
    },
    Packet {
        from: usize,
        to: SocketAddr,
        payload: Bytes,
    },
}

/// `n` members on one simulated network (see the module doc).
pub struct MembershipSim {
    config: MembershipConfig,
    start: Instant,
    now: Instant,
    /// `None` while a member is crashed.
    members: Vec<Option<Membership>>,
    /// Bumped on every crash and restart so that timers of an older life are dropped.
    lives: Vec<u64>,
    /// Members whose packets are dropped both ways (a network partition).
    cut: Vec<bool>,
    by_addr: HashMap<SocketAddr, usize>,
    queue: BinaryHeap<Reverse<(Instant, u64)>>,
    pending: HashMap<u64, Pending>,
    next_event: u64,
    /// Member `i`'s foca draws from `seed + i` (in every life).
    seed: u64,
    latency: RangeInclusive<Duration>,
    rng: StdRng,
    observed: Vec<Observed>,
    packets_sent: u64,
    bytes_sent: u64,
    packets_refused: u64,
}

impl MembershipSim {
    /// Boots `n` members at virtual time zero; every member but the first announces to
    /// member 0, as agents announce to a seed. Packets take a latency drawn uniformly from
    /// `latency`; `seed` decides those draws and every member's foca randomness.
    pub fn new(
        n: usize,
        config: MembershipConfig,
        seed: u64,
        latency: RangeInclusive<Duration>,
    ) -> Result<Self, MeshError> {
        let start = Instant::now();
        let mut net = MembershipSim {
            config,
            start,
            now: start,
            members: (0..n).map(|_| None).collect(),
            lives: vec![0; n],
            cut: vec![false; n],
            by_addr: (0..n).map(|i| (sim_gossip_addr(i), i)).collect(),
            queue: BinaryHeap::new(),
            pending: HashMap::new(),
            next_event: 0,
            seed,
            latency,
            rng: StdRng::seed_from_u64(seed),
            observed: Vec::new(),
            packets_sent: 0,
            bytes_sent: 0,
            packets_refused: 0,
        };
        for i in 0..n {
            net.boot(i, 1)?;
        }
        Ok(net)
    }

    /// Number of members, crashed ones included.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// True when the network has no members.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    pub fn config(&self) -> &MembershipConfig {
        &self.config
    }

    /// Virtual time since the start.
    pub fn elapsed(&self) -> Duration {
        self.now - self.start
    }

    /// Packets sent so far (to crashed and cut-off members too), and their payload bytes.
    pub fn packets_sent(&self) -> (u64, u64) {
        (self.packets_sent, self.bytes_sent)
    }

    /// Packets a member refused (foca errors: stale or malformed); the network drops them.
    pub fn packets_refused(&self) -> u64 {
        self.packets_refused
    }

    /// Starts member `i` (again) with `generation`; all but member 0 announce to member 0.
    pub fn boot(&mut self, i: usize, generation: u64) -> Result<(), MeshError> {
        let id = MemberId {
            node: sim_node_id(i),
            addr: sim_gossip_addr(i),
            generation,
        };
        let foca_seed = self.seed.wrapping_add(i as u64);
        let (m, effects) = Membership::new(id, sim_facts(id), &self.config, foca_seed)?;
        self.lives[i] += 1;
        self.members[i] = Some(m);
        self.apply(i, effects);
        if i != 0
            && let Some(m) = self.members[i].as_mut()
        {
            let effects = m.announce(sim_gossip_addr(0))?;
            self.apply(i, effects);
        }
        Ok(())
    }

    /// Stops member `i` at once (kill -9): no goodbye, its timers die with it.
    pub fn crash(&mut self, i: usize) {
        self.members[i] = None;
        self.lives[i] += 1;
    }

    /// Member `i` leaves on purpose (publishes `Leaving`, then leaves the cluster).
    pub fn leave(&mut self, i: usize) -> Result<(), MeshError> {
        let Some(m) = self.members[i].as_mut() else {
            return Ok(());
        };
        let effects = m.leave()?;
        self.apply(i, effects);
        Ok(())
    }

    /// Member `i` publishes its facts again, changed by `update` (the agent's facts worker
    /// does so every few seconds).
    pub fn publish(
        &mut self,
        i: usize,
        update: impl FnOnce(&mut NodeFacts),
    ) -> Result<(), MeshError> {
        let Some(m) = self.members[i].as_mut() else {
            return Ok(());
        };
        let effects = m.publish(update)?;
        self.apply(i, effects);
        Ok(())
    }

    /// Cuts member `i` off the network (`true`) or heals it (`false`).
    pub fn set_cut(&mut self, i: usize, cut: bool) {
        self.cut[i] = cut;
    }

    /// Member `i`, unless crashed.
    pub fn member(&self, i: usize) -> Option<&Membership> {
        self.members[i].as_ref()
    }

    /// Every event the members reported since the last call, oldest first.
    pub fn take_events(&mut self) -> Vec<Observed> {
        std::mem::take(&mut self.observed)
    }

    /// Runs every event due within `span` of virtual time, then sets the clock to its end.
    pub fn run_for(&mut self, span: Duration) -> Result<(), MeshError> {
        let until = self.now + span;
        while let Some(&Reverse((at, id))) = self.queue.peek() {
            if at > until {
                break;
            }
            self.queue.pop();
            self.now = at;
            match self.pending.remove(&id) {
                Some(Pending::Timer {
                    member,
                    life,
                    timer,
                }) if life == self.lives[member] => {
                    if let Some(m) = self.members[member].as_mut() {
                        let effects = m.handle_timer(timer, self.now)?;
                        self.apply(member, effects);
                    }
                }
                Some(Pending::Packet { from, to, payload }) => self.deliver(from, to, &payload),
                _ => {}
            }
        }
        self.now = until;
        Ok(())
    }

    /// Runs in steps of 100 ms until `done` holds: the virtual time it took, or `None` if
    /// it did not within `limit`.
    pub fn run_until(
        &mut self,
        limit: Duration,
        mut done: impl FnMut(&MembershipSim) -> bool,
    ) -> Result<Option<Duration>, MeshError> {
        let begin = self.now;
        while !done(self) {
            if self.now - begin >= limit {
                return Ok(None);
            }
            self.run_for(Duration::from_millis(100))?;
        }
        Ok(Some(self.now - begin))
    }

    /// How member `observer` sees member `target` (`None` if the observer is crashed or
    /// has never heard of the target).
    pub fn view(&self, observer: usize, target: usize) -> Option<MemberView> {
        let node = sim_node_id(target);
        self.members[observer]
            .as_ref()?
            .members()
            .into_iter()
            .find(|v| v.id.node == node)
    }

    pub fn state(&self, observer: usize, target: usize) -> Option<MemberState> {
        self.view(observer, target).map(|v| v.state)
    }

    /// Every member sees every member alive (a quadratic check: for small networks).
    pub fn all_alive(&self) -> bool {
        let n = self.len();
        (0..n).all(|o| (0..n).all(|t| self.state(o, t) == Some(MemberState::Alive)))
    }

    fn apply(&mut self, i: usize, effects: Vec<Effect>) {
        for effect in effects {
            match effect {
                Effect::Send { to, payload } => {
                    self.packets_sent += 1;
                    self.bytes_sent += payload.len() as u64;
                    let after = self.draw_latency();
                    self.push(
                        after,
                        Pending::Packet {
                            from: i,
                            to,
                            payload,
                        },
                    );
                }
                Effect::Schedule { after, timer } => {
                    let life = self.lives[i];
                    self.push(
                        after,
                        Pending::Timer {
                            member: i,
                            life,
                            timer,
                        },
                    );
                }
                Effect::Event(event) => self.observed.push(Observed {
                    at: self.now - self.start,
                    observer: i,
                    event,
                }),
            }
        }
    }

    fn push(&mut self, after: Duration, what: Pending) {
        let id = self.next_event;
        self.next_event += 1;
        self.queue.push(Reverse((self.now + after, id)));
        self.pending.insert(id, what);
    }

    fn draw_latency(&mut self) -> Duration {
        let (min, max) = (*self.latency.start(), *self.latency.end());
        if max <= min {
            return min;
        }
        let span = (max - min).as_nanos().min(u128::from(u64::MAX)) as u64;
        min + Duration::from_nanos(self.rng.random_range(0..=span))
    }

    fn deliver(&mut self, from: usize, to: SocketAddr, payload: &[u8]) {
        let Some(&i) = self.by_addr.get(&to) else {
            return;
        };
        if self.cut[i] || self.cut[from] {
            return;
        }
        let now = self.now;
        let Some(m) = self.members[i].as_mut() else {
            return;
        };
        match m.handle_data(sim_gossip_addr(from), payload, now) {
            Ok(effects) => self.apply(i, effects),
            // Malformed or stale packets are foca errors; the network just drops them.
            Err(_) => self.packets_refused += 1,
        }
    }
}
