//! Membership over a simulated network with a virtual clock: no sockets, no sleeps.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use foca::Timer;

use super::*;
use crate::facts::{NodeFacts, NodeRole};
use crate::identity::{MemberId, NodeId};

fn gossip_addr(i: usize) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, i as u8 + 1], 7946))
}

fn facts_for(id: MemberId) -> NodeFacts {
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
        agent_version: "test".into(),
        store_accepting: true,
        store_room_bytes: 1 << 40,
        repair_bytes_per_sec: 0,
        store_opening: false,
        meta_failed: false,
    }
}

struct Sim {
    start: Instant,
    now: Instant,
    config: MembershipConfig,
    /// `None` while a node is crashed.
    nodes: Vec<Option<Membership>>,
    /// Bumped on every crash/restart so stale timers of an old life are dropped.
    lives: Vec<u64>,
    timers: BinaryHeap<Reverse<(Instant, u64)>>,
    pending: HashMap<u64, (usize, u64, Timer<MemberId>)>,
    next_timer: u64,
    packets: VecDeque<(SocketAddr, SocketAddr, Bytes)>,
    /// Nodes whose packets are dropped both ways (a network partition).
    cut: Vec<bool>,
}

impl Sim {
    fn new(n: usize) -> Self {
        let start = Instant::now();
        let mut sim = Sim {
            start,
            now: start,
            config: MembershipConfig::default(),
            nodes: (0..n).map(|_| None).collect(),
            lives: vec![0; n],
            timers: BinaryHeap::new(),
            pending: HashMap::new(),
            next_timer: 0,
            packets: VecDeque::new(),
            cut: vec![false; n],
        };
        for i in 0..n {
            sim.boot(i, 1);
        }
        sim
    }

    fn boot(&mut self, i: usize, generation: u64) {
        let id = MemberId {
            node: NodeId(100 + i as u64),
            addr: gossip_addr(i),
            generation,
        };
        let (m, effects) =
            Membership::new(id, facts_for(id), &self.config, 42 + i as u64).expect("new");
        self.lives[i] += 1;
        self.nodes[i] = Some(m);
        self.apply(i, effects);
        if i != 0 {
            let effects = self.node(i).announce(gossip_addr(0)).expect("announce");
            self.apply(i, effects);
        }
    }

    fn crash(&mut self, i: usize) {
        self.nodes[i] = None;
        self.lives[i] += 1;
    }

    fn node(&mut self, i: usize) -> &mut Membership {
        self.nodes[i].as_mut().expect("node is running")
    }

    fn apply(&mut self, i: usize, effects: Vec<Effect>) {
        for effect in effects {
            match effect {
                Effect::Send { to, payload } => {
                    self.packets.push_back((gossip_addr(i), to, payload))
                }
                Effect::Schedule { after, timer } => {
                    let id = self.next_timer;
                    self.next_timer += 1;
                    self.timers.push(Reverse((self.now + after, id)));
                    self.pending.insert(id, (i, self.lives[i], timer));
                }
                Effect::Event(_) => {}
            }
        }
    }

    fn deliver_packets(&mut self) {
        while let Some((from, to, payload)) = self.packets.pop_front() {
            let Some(i) = (0..self.nodes.len()).find(|&i| gossip_addr(i) == to) else {
                continue;
            };
            if self.cut[i] || (0..self.nodes.len()).any(|j| self.cut[j] && gossip_addr(j) == from) {
                continue;
            }
            let now = self.now;
            if let Some(node) = self.nodes[i].as_mut() {
                // Malformed or stale packets are foca errors; the network just drops them.
                if let Ok(effects) = node.handle_data(from, &payload, now) {
                    self.apply(i, effects);
                }
            }
        }
    }

    fn run_for(&mut self, span: Duration) {
        let until = self.now + span;
        loop {
            self.deliver_packets();
            let Some(&Reverse((at, id))) = self.timers.peek() else {
                break;
            };
            if at > until {
                break;
            }
            self.timers.pop();
            self.now = at;
            let Some((i, life, timer)) = self.pending.remove(&id) else {
                continue;
            };
            if life != self.lives[i] {
                continue;
            }
            if let Some(node) = self.nodes[i].as_mut() {
                let effects = node.handle_timer(timer).expect("timer");
                self.apply(i, effects);
            }
        }
        self.now = until;
    }

    /// Runs until `pred` holds, checking every 100 ms; returns the virtual time it took.
    fn run_until(&mut self, limit: Duration, mut pred: impl FnMut(&Sim) -> bool) -> Duration {
        let begin = self.now;
        while !pred(self) {
            assert!(
                self.now - begin < limit,
                "condition not reached within {limit:?}"
            );
            self.run_for(Duration::from_millis(100));
        }
        self.now - begin
    }

    fn view(&self, observer: usize, target: usize) -> Option<MemberView> {
        let m = self.nodes[observer].as_ref()?;
        m.members()
            .into_iter()
            .find(|v| v.id.node == NodeId(100 + target as u64))
    }

    fn state(&self, observer: usize, target: usize) -> Option<MemberState> {
        self.view(observer, target).map(|v| v.state)
    }

    fn all_alive(&self) -> bool {
        (0..self.nodes.len())
            .all(|o| (0..self.nodes.len()).all(|t| self.state(o, t) == Some(MemberState::Alive)))
    }
}

#[test]
fn five_nodes_find_each_other_through_one_seed() {
    let mut sim = Sim::new(5);
    let took = sim.run_until(Duration::from_secs(10), Sim::all_alive);
    assert!(took < Duration::from_secs(5), "join took {took:?}");
    // Facts travel with membership: everyone knows everyone's failure domain.
    let v = sim.view(4, 2).expect("view");
    assert_eq!(v.facts.expect("facts").failure_domain, "fd0");
    let _ = sim.start;
}

#[test]
fn crashed_node_is_down_within_the_detection_bound() {
    let mut sim = Sim::new(5);
    sim.run_until(Duration::from_secs(10), Sim::all_alive);
    sim.run_for(Duration::from_secs(3));
    sim.crash(3);
    let bound = sim.config.detection_bound() + sim.config.probe_period;
    let took = sim.run_until(Duration::from_secs(30), |s| {
        [0, 1, 2, 4]
            .iter()
            .all(|&o| s.state(o, 3) == Some(MemberState::Down))
    });
    assert!(took <= bound, "down after {took:?}, bound {bound:?}");
}

#[test]
fn restarted_node_rejoins_with_same_id_and_newer_generation() {
    let mut sim = Sim::new(4);
    sim.run_until(Duration::from_secs(10), Sim::all_alive);
    sim.crash(2);
    sim.run_until(Duration::from_secs(30), |s| {
        s.state(0, 2) == Some(MemberState::Down)
    });
    sim.boot(2, 2);
    sim.run_until(Duration::from_secs(10), Sim::all_alive);
    for o in [0, 1, 3] {
        let v = sim.view(o, 2).expect("view");
        assert_eq!(v.id.generation, 2, "observer {o} still sees the old life");
    }
}

#[test]
fn graceful_leave_is_reported_as_left_not_down() {
    let mut sim = Sim::new(4);
    sim.run_until(Duration::from_secs(10), Sim::all_alive);
    let effects = sim.node(1).leave().expect("leave");
    sim.apply(1, effects);
    sim.deliver_packets();
    sim.crash(1);
    let took = sim.run_until(Duration::from_secs(10), |s| {
        [0, 2, 3]
            .iter()
            .all(|&o| s.state(o, 1) == Some(MemberState::Left))
    });
    // A leave is announced, not detected: no suspicion window.
    assert!(took < Duration::from_secs(2), "leave took {took:?}");
}

#[test]
fn node_marked_down_by_mistake_renews_and_comes_back() {
    let mut sim = Sim::new(3);
    sim.run_until(Duration::from_secs(10), Sim::all_alive);
    // Cut node 2 off long enough to be declared down, then heal: it must rejoin by itself.
    sim.cut[2] = true;
    sim.run_until(Duration::from_secs(30), |s| {
        s.state(0, 2) == Some(MemberState::Down)
    });
    sim.cut[2] = false;
    sim.run_until(Duration::from_secs(200), Sim::all_alive);
    assert!(sim.view(0, 2).expect("view").id.generation > 1);
}
