//! The pure SWIM core: foca plus shoal's node facts, driven without I/O.
//!
//! Every input (a packet, a timer, an operator action) returns the [`Effect`]s to carry
//! out: packets to send, timers to set, events for the rest of the agent. The caller owns
//! the socket and the clock ([`crate::GossipDriver`] in production, a simulated network in
//! tests).
//!
//! Two rules on top of foca's, so a member cut off from all is alive in every view within
//! about 15 s of the cut healing (it took 30 to 120 s before; test
//! `a_member_cut_off_is_back_in_every_view_soon_after_the_cut_heals`):
//!
//! - it announces to 2 down members every 5 probe periods (foca's LAN default is once in
//!   65 s; after a long cut each side holds the other down and nothing else makes them
//!   talk);
//! - a member suspect at one incarnation for twice the detection bound is declared down
//!   here (`expire_suspicions`): foca forgets the timers that end suspicions when its node
//!   goes idle or is declared down. A member that is alive hears it is down and rejoins
//!   under a new generation (the metadata's generation record ignores that one: it
//!   records the data dir's start count, from the facts).
//!
//! A member that leaves on purpose (SIGTERM, SIGINT) publishes `Leaving`, then foca's
//! `leave_cluster`; once down it shows as `left`. Facts are republished when a member comes
//! up or renames (a restart) and when a known node starts a new life (`take_new_life`).
//!
//! Measurements: on loopback a kill -9 is down everywhere in about 3 to 4 s. At 1,000
//! members (the simulator's `--scale 1000`, seed 1) a killed member is down in every view
//! in 13.0 s; before the second rule, 24 of 999 never declared it within 60 s. Forming
//! 1,000 members through one seed still leaves 649 seeing all others after 180 s (foca is
//! configured for 16 here).

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::num::{NonZeroU32, NonZeroUsize};
use std::time::{Duration, Instant};

use bytes::Bytes;
use foca::{AccumulatingRuntime, Foca, OwnedNotification, PostcardCodec, Timer};
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde::{Deserialize, Serialize};

use crate::MeshError;
use crate::envelope;
use crate::facts::{FactsHandler, FactsTable, NodeFacts, NodeRole};
use crate::identity::{MemberId, NodeId, UNKNOWN_NODE};

/// SWIM timing. The defaults follow memberlist's LAN profile with a fixed suspicion
/// window: a dead node is declared down at most `probe_period + 2 × probe_rtt +
/// suspect_to_down` after it stops answering ([`MembershipConfig::detection_bound`]: 5 s
/// with the defaults).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MembershipConfig {
    pub probe_period: Duration,
    pub probe_rtt: Duration,
    pub suspect_to_down: Duration,
    /// Largest gossip payload foca may produce, before the envelope.
    pub max_packet_size: usize,
}

impl Default for MembershipConfig {
    fn default() -> Self {
        MembershipConfig {
            probe_period: Duration::from_millis(1000),
            probe_rtt: Duration::from_millis(500),
            suspect_to_down: Duration::from_millis(3000),
            max_packet_size: 1400 - envelope::OVERHEAD,
        }
    }
}

impl MembershipConfig {
    /// The longest a crashed node stays `alive` or `suspect` in everyone's view, in the
    /// absence of packet loss: one probe period to be probed, the direct and indirect
    /// probe round trips, then the suspicion window.
    pub fn detection_bound(&self) -> Duration {
        self.probe_period + self.probe_rtt * 2 + self.suspect_to_down
    }

    fn to_foca(&self) -> Result<foca::Config, MeshError> {
        let mut cfg = foca::Config::new_lan(NonZeroU32::MIN.saturating_add(15));
        cfg.probe_period = self.probe_period;
        cfg.probe_rtt = self.probe_rtt;
        cfg.suspect_to_down_after = self.suspect_to_down;
        cfg.periodic_announce_to_down_members = Some(foca::PeriodicParams {
            frequency: self.probe_period * 5,
            num_members: NonZeroUsize::MIN.saturating_add(1),
        });
        cfg.max_packet_size = NonZeroUsize::new(self.max_packet_size)
            .ok_or_else(|| MeshError::Membership("max_packet_size must be > 0".into()))?;
        Ok(cfg)
    }
}

/// Liveness of a member as the status view reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MemberState {
    Alive,
    Suspect,
    Down,
    /// Left the cluster on purpose (graceful shutdown or decommission).
    Left,
}

/// What the rest of the agent hears about membership changes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemberEvent {
    Up(MemberId),
    Down(MemberId),
    /// This node was declared down and rejoined under a new generation.
    Rejoined(MemberId),
    /// Every other member is gone; this node is alone.
    Alone,
}

/// An action the caller must carry out.
#[derive(Debug)]
pub enum Effect {
    Send {
        to: SocketAddr,
        payload: Bytes,
    },
    Schedule {
        after: Duration,
        timer: Timer<MemberId>,
    },
    Event(MemberEvent),
}

/// One member as seen from this node.
#[derive(Clone, Debug)]
pub struct MemberView {
    pub id: MemberId,
    pub state: MemberState,
    pub incarnation: u16,
    pub facts: Option<NodeFacts>,
    /// When a packet from this member last arrived (None for this node itself).
    pub last_heard: Option<Instant>,
    pub is_self: bool,
}

type Swim = Foca<MemberId, PostcardCodec, StdRng, FactsHandler>;

pub struct Membership {
    foca: Swim,
    runtime: AccumulatingRuntime<MemberId>,
    facts: FactsTable,
    own_facts: NodeFacts,
    /// Newest identity seen per node, kept after foca forgets a down member.
    known: BTreeMap<NodeId, MemberId>,
    last_heard: HashMap<SocketAddr, Instant>,
    /// Since when each member has been suspect at its incarnation (see `expire_suspicions`).
    suspect_since: HashMap<MemberId, (u16, Instant)>,
    /// How long a suspicion may stand before this node declares the member down itself.
    suspicion_limit: Duration,
}

impl Membership {
    /// Starts a member that knows only itself. `seed` feeds foca's randomness.
    pub fn new(
        me: MemberId,
        facts: NodeFacts,
        config: &MembershipConfig,
        seed: u64,
    ) -> Result<(Self, Vec<Effect>), MeshError> {
        let table = FactsTable::default();
        let foca = Foca::with_custom_broadcast(
            me,
            config.to_foca()?,
            StdRng::seed_from_u64(seed),
            PostcardCodec,
            FactsHandler {
                table: table.clone(),
            },
        );
        let mut m = Membership {
            foca,
            runtime: AccumulatingRuntime::new(),
            facts: table,
            own_facts: facts,
            known: BTreeMap::new(),
            last_heard: HashMap::new(),
            suspect_since: HashMap::new(),
            suspicion_limit: config.detection_bound() * 2,
        };
        let published = m.own_facts.clone();
        m.foca
            .add_broadcast(&published.encode())
            .map_err(|e| MeshError::Membership(e.to_string()))?;
        Ok((m, Vec::new()))
    }

    pub fn me(&self) -> MemberId {
        *self.foca.identity()
    }

    /// Number of other members currently alive or suspect.
    pub fn active_peers(&self) -> usize {
        self.foca.num_members()
    }

    /// Asks the node gossiping at `seed` to let us in.
    pub fn announce(&mut self, seed: SocketAddr) -> Result<Vec<Effect>, MeshError> {
        let placeholder = MemberId {
            node: UNKNOWN_NODE,
            addr: seed,
            generation: 0,
        };
        let res = self.foca.announce(placeholder, &mut self.runtime);
        self.finish(res)
    }

    /// Feeds one authenticated packet payload received from `from`.
    pub fn handle_data(
        &mut self,
        from: SocketAddr,
        payload: &[u8],
        now: Instant,
    ) -> Result<Vec<Effect>, MeshError> {
        self.last_heard.insert(from, now);
        let res = self.foca.handle_data(payload, &mut self.runtime);
        self.finish(res)
    }

    /// Feeds a timer that a previous [`Effect::Schedule`] asked for.
    pub fn handle_timer(
        &mut self,
        timer: Timer<MemberId>,
        now: Instant,
    ) -> Result<Vec<Effect>, MeshError> {
        let res = self.foca.handle_timer(timer, &mut self.runtime);
        let mut effects = self.finish(res)?;
        effects.extend(self.expire_suspicions(now)?);
        Ok(effects)
    }

    /// Declares down, here, each member suspect at one incarnation for longer than twice
    /// the detection bound. foca ends a suspicion with a timer it forgets whenever this
    /// node goes idle or is declared down itself (cut off from everyone): it comes back
    /// suspecting members that were never told, so they never refute, and it would keep
    /// them suspect (and a member that died meanwhile never down here). Down is what the
    /// lost timer would have said; a member that is alive hears it (foca tells a member
    /// it holds down when it hears from it, and announces to down members) and rejoins
    /// under a new generation.
    fn expire_suspicions(&mut self, now: Instant) -> Result<Vec<Effect>, MeshError> {
        let mut still = HashMap::new();
        let mut expired = Vec::new();
        for m in self.foca.iter_membership_state() {
            if m.state() != foca::State::Suspect {
                continue;
            }
            let key = (*m.id(), m.incarnation());
            let since = match self.suspect_since.get(m.id()) {
                Some(&(inc, since)) if inc == key.1 => since,
                _ => now,
            };
            if now.saturating_duration_since(since) > self.suspicion_limit {
                expired.push(key);
            } else {
                still.insert(key.0, (key.1, since));
            }
        }
        self.suspect_since = still;
        if expired.is_empty() {
            return Ok(Vec::new());
        }
        let down = expired
            .into_iter()
            .map(|(id, incarnation)| foca::Member::new(id, incarnation, foca::State::Down));
        let res = self.foca.apply_many(down, true, &mut self.runtime);
        self.finish(res)
    }

    /// Publishes a new version of this node's facts.
    pub fn publish(
        &mut self,
        update: impl FnOnce(&mut NodeFacts),
    ) -> Result<Vec<Effect>, MeshError> {
        update(&mut self.own_facts);
        self.own_facts.seq += 1;
        let encoded = self.own_facts.encode();
        self.foca
            .add_broadcast(&encoded)
            .map_err(|e| MeshError::Membership(e.to_string()))?;
        let res = self.foca.broadcast(&mut self.runtime);
        self.finish(res)
    }

    /// Tells the cluster this node is leaving on purpose, then leaves.
    pub fn leave(&mut self) -> Result<Vec<Effect>, MeshError> {
        let mut effects = self.publish(|f| f.role = NodeRole::Leaving)?;
        let res = self.foca.leave_cluster(&mut self.runtime);
        effects.extend(self.finish(res)?);
        Ok(effects)
    }

    /// Every member this node has heard of, itself included, sorted by node id.
    pub fn members(&self) -> Vec<MemberView> {
        let facts = self.facts.lock();
        let mut live: HashMap<NodeId, (MemberId, foca::State, u16)> = HashMap::new();
        for m in self.foca.iter_membership_state() {
            live.insert(m.id().node, (*m.id(), m.state(), m.incarnation()));
        }
        let me = self.me();
        let mut out: Vec<MemberView> = self
            .known
            .iter()
            .filter(|(node, _)| **node != me.node)
            .map(|(node, known)| {
                let (id, state, incarnation) =
                    live.get(node)
                        .copied()
                        .unwrap_or((*known, foca::State::Down, 0));
                let facts = facts.get(node).cloned();
                let leaving = facts.as_ref().is_some_and(|f| f.role == NodeRole::Leaving);
                let state = match state {
                    foca::State::Alive => MemberState::Alive,
                    foca::State::Suspect => MemberState::Suspect,
                    foca::State::Down if leaving => MemberState::Left,
                    foca::State::Down => MemberState::Down,
                };
                MemberView {
                    id,
                    state,
                    incarnation,
                    facts,
                    last_heard: self.last_heard.get(&id.addr).copied(),
                    is_self: false,
                }
            })
            .collect();
        out.push(MemberView {
            id: me,
            state: MemberState::Alive,
            incarnation: 0,
            facts: Some(self.own_facts.clone()),
            last_heard: None,
            is_self: true,
        });
        out.sort_by_key(|v| v.id.node);
        out
    }

    /// The facts this node currently publishes.
    pub fn own_facts(&self) -> &NodeFacts {
        &self.own_facts
    }

    /// Turns what foca accumulated into effects, reacting to membership changes.
    fn finish(&mut self, res: Result<(), foca::Error>) -> Result<Vec<Effect>, MeshError> {
        let mut effects = Vec::new();
        let mut republish = false;
        while let Some(note) = self.runtime.to_notify() {
            match note {
                OwnedNotification::MemberUp(id) => {
                    self.known.insert(id.node, id);
                    // A newcomer has none of our facts: publish a fresh copy.
                    republish = true;
                    effects.push(Effect::Event(MemberEvent::Up(id)));
                }
                OwnedNotification::MemberDown(id) => {
                    self.known.insert(id.node, id);
                    effects.push(Effect::Event(MemberEvent::Down(id)));
                }
                OwnedNotification::Rename(_, new) => {
                    self.known.insert(new.node, new);
                    // A member that restarted (a new generation) lost the facts it had
                    // heard: it is a newcomer to them.
                    republish = true;
                }
                OwnedNotification::Rejoin(id) => {
                    effects.push(Effect::Event(MemberEvent::Rejoined(id)));
                }
                OwnedNotification::Idle => effects.push(Effect::Event(MemberEvent::Alone)),
                OwnedNotification::Active | OwnedNotification::Defunct => {}
            }
        }
        while let Some((to, payload)) = self.runtime.to_send() {
            effects.push(Effect::Send {
                to: to.addr,
                payload,
            });
        }
        while let Some((after, timer)) = self.runtime.to_schedule() {
            effects.push(Effect::Schedule { after, timer });
        }
        res.map_err(|e| MeshError::Membership(e.to_string()))?;
        // A node's new life knows nobody's facts, even where membership saw no change.
        if self.facts.take_new_life() {
            republish = true;
        }
        if republish {
            effects.extend(self.publish(|_| {})?);
        }
        Ok(effects)
    }
}

#[cfg(test)]
#[path = "membership_sim_tests.rs"]
mod sim_tests;
