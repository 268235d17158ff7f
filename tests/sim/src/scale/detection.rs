//! How long the real SWIM membership takes to notice a dead node among many, and what
//! its gossip costs: `n` members of `shoal_mesh::Membership` on the simulated network.

use std::fmt;
use std::time::Duration;

use shoal_disk::SplitMix64;
use shoal_mesh::membership_sim::{MembershipSim, sim_node_id};
use shoal_mesh::{MemberEvent, MembershipConfig, MeshError};

/// One way latency of a packet, drawn uniformly (a LAN).
const LATENCY_MIN: Duration = Duration::from_micros(100);
const LATENCY_MAX: Duration = Duration::from_millis(1);
/// The longest the cluster may take to form through one seed.
const JOIN_LIMIT: Duration = Duration::from_secs(180);
/// Quiet gossip after forming, before the measured window.
const SETTLE: Duration = Duration::from_secs(10);
/// The window whose packets are counted.
const STEADY: Duration = Duration::from_secs(10);
/// The longest the members may take to declare the dead node down.
const DOWN_LIMIT: Duration = Duration::from_secs(60);
const STEP: Duration = Duration::from_millis(100);
/// How often a member republishes its facts when nothing changed (the agent's facts
/// worker, `REFRESH_EVERY`).
const FACTS_EVERY: Duration = Duration::from_secs(5);

/// What the membership run measured (virtual time).
#[derive(Clone, Debug, PartialEq)]
pub struct DetectionReport {
    pub members: usize,
    pub config: MembershipConfig,
    /// Until every member sees every other one, through one seed (`None`: not within the
    /// limit; `joined` says how many then did).
    pub joined_after: Option<Duration>,
    pub joined: usize,
    /// Gossip packets and payload bytes each member sends per second, steady state.
    pub packets_per_member_per_sec: f64,
    pub bytes_per_member_per_sec: f64,
    /// The member killed (kill -9, no goodbye).
    pub victim: usize,
    /// From the kill until the first survivor, 99% of them, all of them declare it down.
    pub first_down: Option<Duration>,
    pub p99_down: Option<Duration>,
    pub all_down: Option<Duration>,
    /// Survivors that declared it down within the limit.
    pub declared: usize,
    /// Down events about live members, from forming on (false positives).
    pub false_downs: usize,
    /// Packets the members refused (foca errors), from forming on.
    pub refused: u64,
}

/// The simulated network, advanced in steps, with each member republishing its facts
/// every [`FACTS_EVERY`] as the agent's facts worker does (staggered over the steps).
struct Gossip {
    net: MembershipSim,
    steps: usize,
}

impl Gossip {
    fn step(&mut self) -> Result<(), MeshError> {
        self.net.run_for(STEP)?;
        self.steps += 1;
        let slots = (FACTS_EVERY.as_millis() / STEP.as_millis()) as usize;
        for i in (self.steps % slots..self.net.len()).step_by(slots) {
            self.net.publish(i, |_| {})?;
        }
        Ok(())
    }

    /// Steps until `done` holds or `limit` passes: how long it took, if it did.
    fn until(
        &mut self,
        limit: Duration,
        mut done: impl FnMut(&MembershipSim) -> bool,
    ) -> Result<Option<Duration>, MeshError> {
        let begin = self.net.elapsed();
        loop {
            let took = self.net.elapsed() - begin;
            if done(&self.net) {
                return Ok(Some(took));
            }
            if took >= limit {
                return Ok(None);
            }
            self.step()?;
        }
    }

    fn run_for(&mut self, span: Duration) -> Result<(), MeshError> {
        self.until(span, |_| false).map(|_| ())
    }
}

/// Members that see every other member.
fn joined(net: &MembershipSim) -> usize {
    (0..net.len())
        .filter(|&i| {
            net.member(i)
                .is_some_and(|m| m.active_peers() + 1 == net.len())
        })
        .count()
}

/// Forms a cluster of `members`, measures its steady gossip, kills one member and times
/// how the others declare it down.
pub fn measure(members: usize, seed: u64) -> Result<DetectionReport, MeshError> {
    if members < 2 {
        let why = format!("{members} member(s): a kill needs one to die and one to notice");
        return Err(MeshError::Membership(why));
    }
    let config = MembershipConfig::default();
    let net = MembershipSim::new(members, config.clone(), seed, LATENCY_MIN..=LATENCY_MAX)?;
    let mut gossip = Gossip { net, steps: 0 };
    let joined_after = gossip.until(JOIN_LIMIT, |net| joined(net) == net.len())?;
    let joined = joined(&gossip.net);
    gossip.net.take_events();
    let refused_before = gossip.net.packets_refused();

    gossip.run_for(SETTLE)?;
    let (packets, bytes) = gossip.net.packets_sent();
    gossip.run_for(STEADY)?;
    let (packets_after, bytes_after) = gossip.net.packets_sent();
    let per_member = members as f64 * STEADY.as_secs_f64();

    let victim = SplitMix64(seed).below(members as u64) as usize;
    let killed_at = gossip.net.elapsed();
    gossip.net.crash(victim);
    let victim_id = sim_node_id(victim);
    let mut down_at = vec![None; members];
    let mut false_downs = gossip
        .net
        .take_events()
        .iter()
        .filter(|seen| matches!(seen.event, MemberEvent::Down(_)))
        .count();
    let mut declared = 0;
    while declared + 1 < members && gossip.net.elapsed() - killed_at < DOWN_LIMIT {
        gossip.step()?;
        for seen in gossip.net.take_events() {
            match seen.event {
                MemberEvent::Down(id)
                    if id.node == victim_id && down_at[seen.observer].is_none() =>
                {
                    down_at[seen.observer] = Some(seen.at.saturating_sub(killed_at));
                    declared += 1;
                }
                MemberEvent::Down(id) if id.node == victim_id => {}
                MemberEvent::Down(_) => false_downs += 1,
                _ => {}
            }
        }
    }
    let mut times: Vec<Duration> = down_at.into_iter().flatten().collect();
    times.sort_unstable();
    let survivors = members - 1;
    let nth = |count: usize| times.get(count.max(1) - 1).copied();
    Ok(DetectionReport {
        members,
        config,
        joined_after,
        joined,
        packets_per_member_per_sec: (packets_after - packets) as f64 / per_member,
        bytes_per_member_per_sec: (bytes_after - bytes) as f64 / per_member,
        victim,
        first_down: times.first().copied(),
        p99_down: nth((survivors * 99).div_ceil(100)),
        all_down: (declared == survivors).then(|| nth(survivors)).flatten(),
        declared,
        false_downs,
        refused: gossip.net.packets_refused() - refused_before,
    })
}

fn secs(d: Option<Duration>) -> String {
    d.map_or_else(
        || "never".to_owned(),
        |d| format!("{:.1} s", d.as_secs_f64()),
    )
}

impl fmt::Display for DetectionReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.config;
        writeln!(
            f,
            "membership: {} SWIM members (foca; probe {:?}, rtt {:?}, suspect→down {:?}; bound {:?})",
            self.members,
            c.probe_period,
            c.probe_rtt,
            c.suspect_to_down,
            c.detection_bound()
        )?;
        writeln!(
            f,
            "  formed through one seed       {} ({} of {} see all others)",
            secs(self.joined_after),
            self.joined,
            self.members
        )?;
        writeln!(
            f,
            "  gossip sent per member        {:.1} packets/s, {:.0} B/s (facts every {:?})",
            self.packets_per_member_per_sec, self.bytes_per_member_per_sec, FACTS_EVERY
        )?;
        writeln!(
            f,
            "  member {} killed: down at    first {}, 99% {}, all {} ({} of {} declared)",
            self.victim,
            secs(self.first_down),
            secs(self.p99_down),
            secs(self.all_down),
            self.declared,
            self.members - 1
        )?;
        writeln!(
            f,
            "  false downs, refused packets  {}, {}",
            self.false_downs, self.refused
        )
    }
}
