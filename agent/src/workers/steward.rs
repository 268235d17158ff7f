//! Keeps the metadata group and the cluster layout in step with membership: forms the
//! group when a new cluster starts, adds every agent as a learner, chooses voters across
//! failure domains, replaces a voter that stays down, and commits layout changes (new
//! nodes, nodes down, `out` after `[cluster] down_out_after`, back) as new layout epochs;
//! ends maintenance windows that ran out, and moves voters off nodes being drained.
//! Acts only on the leader, except the one-time bootstrap.
//!
//! Forming: a new agent starts as a bare member. Once `bootstrap_expect` agents see each
//! other (3 s settle), the one with the lowest node id asks the others whether they belong
//! to a group already and, if none does, initializes it with voters across failure domains.
//! Until then the steward records what it waits for (shown as `meta.notice`), and a
//! proposal or read barrier that finds no leader fails at once with that reason
//! (`ConsensusError::NotMember`, retryable: a mount retries it for `--retry-for` and logs
//! it) instead of waiting 60 s.
//!
//! The layout the leader commits is authoritative; gossip is the hint. A node gossip sees
//! down for `[cluster] down_out_after` (10 min; the leader's value decides) is `out`; a
//! node that comes back is `active` again. Before `out` nothing of a down node is rebuilt:
//! only the stripes written degraded meanwhile get their missing shards. The layout waits
//! 5 s after the steward starts (`LAYOUT_SETTLE`) before marking down nodes it has not
//! heard. The first layout also holds the metadata group's members gossip cannot see, as
//! `Down` (`first_layout`). A member whose metadata member failed is kept out of the
//! voters only, not marked down in the layout.
//!
//! Maintenance: the node is `maintenance` (takes no new shards) until its window's end on
//! the cluster clock, and down inside the window it never goes `out`. When the window ends
//! the leader makes it `active` if it is back; if still down, `down_out_after` applies as
//! to any down node (status shows "OVER by …"). Windows are measured on
//! `Group::cluster_now_ms`: the last applied clock value plus the local time since this
//! node first saw it (never ahead of the leader).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use openraft::{BasicNode, ChangeMembers};
use shoal_mesh::{GossipHandle, MemberState, MemberView};
use shoal_namespace::format::Timestamp;
use shoal_namespace::nodes::NodeChange;
use shoal_namespace::{Command, Outcome, Proposal};
use shoal_placement::{Layout, LayoutNode, NodeId, NodeState};
use tracing::{debug, info, warn};

use crate::AgentError;
use crate::consensus::voters::{Candidate, VoterPlan, choose_voters};
use crate::consensus::{ConsensusError, Group};
use crate::worker::{Step, Ticker, Worker};

const TICK: Duration = Duration::from_secs(1);
/// Members must have been seen this long before a new cluster forms (gossip converges).
const BOOTSTRAP_SETTLE: Duration = Duration::from_secs(3);
/// How long this node's gossip has to hear the members after the steward starts before
/// the layout marks down the nodes it has not heard: a leader that just restarted would
/// otherwise mark every other node down for the second it takes (the simulator showed
/// it: each restart of the leader took the whole layout down and back).
const LAYOUT_SETTLE: Duration = Duration::from_secs(5);
/// A voter down this long is replaced.
const VOTER_REPLACE_AFTER: Duration = Duration::from_secs(30);

struct Member {
    id: u64,
    /// The node's configured name, for messages.
    name: String,
    failure_domain: String,
    rpc: String,
    weight: u64,
    /// Its metadata member failed (see `consensus/core_watch.rs`): not counted on as a
    /// voter (it would take a quorum's place while acknowledging nothing); its shard store
    /// is as alive as gossip says.
    meta_failed: bool,
}

fn alive_members(views: &[MemberView]) -> Vec<Member> {
    views
        .iter()
        .filter(|m| m.state == MemberState::Alive)
        .filter_map(member_of)
        .collect()
}

/// A member as its facts describe it (gossip has none yet: `None`).
fn member_of(view: &MemberView) -> Option<Member> {
    let f = view.facts.as_ref()?;
    Some(Member {
        id: view.id.node.0,
        name: f.name.clone(),
        failure_domain: f.failure_domain.clone(),
        rpc: f.rpc_addr.to_string(),
        weight: f.capacity_bytes.max(1),
        meta_failed: f.meta_failed,
    })
}

/// The metadata group's members that gossip does not see alive, as their facts describe
/// them (those gossip never heard of are left out).
fn absent_group_members(meta: &Group, views: &[MemberView], alive: &[Member]) -> Vec<Member> {
    meta.member_ids()
        .into_iter()
        .filter(|id| !alive.iter().any(|m| m.id == *id))
        .filter_map(|id| views.iter().find(|v| v.id.node.0 == id).and_then(member_of))
        .collect()
}

/// The `steward` worker: one round a second (see the module doc).
pub struct Steward {
    meta: Arc<Group>,
    gossip: GossipHandle,
    started: Instant,
    /// Voters not seen alive, since when.
    down_since: HashMap<u64, Instant>,
    /// Layout nodes not seen alive, since when (gossip's last packet from them when it
    /// has one, else when this leader first missed them).
    layout_down_since: HashMap<u64, Instant>,
    down_out_after: Duration,
    /// What this node waited for, outside any group, when it last said so.
    waiting: Option<String>,
    ticker: Ticker,
}

impl Steward {
    pub fn new(meta: Arc<Group>, gossip: GossipHandle, down_out_after: Duration) -> Steward {
        Steward {
            meta,
            gossip,
            started: Instant::now(),
            down_since: HashMap::new(),
            layout_down_since: HashMap::new(),
            down_out_after,
            waiting: None,
            ticker: Ticker::every(TICK),
        }
    }

    /// The nodes of the layout down for `down_out_after` or longer (they become `out`):
    /// active, down or draining ones, and those in maintenance whose window has ended
    /// (`windows_over`).
    fn long_down(
        &mut self,
        views: &[MemberView],
        alive: &BTreeSet<u64>,
        windows_over: &[u64],
        now: Instant,
    ) -> Vec<u64> {
        let Ok(Some(layout)) = self.meta.store().cluster_layout() else {
            return Vec::new();
        };
        self.layout_down_since.retain(|id, _| !alive.contains(id));
        let mut out = Vec::new();
        for n in layout.nodes() {
            let id = n.id.0;
            let may_go_out = match n.state {
                NodeState::Active | NodeState::Down | NodeState::Draining => true,
                NodeState::Maintenance => windows_over.contains(&id),
                NodeState::Drained | NodeState::Out => false,
            };
            if alive.contains(&id) || !may_go_out {
                continue;
            }
            let heard = views
                .iter()
                .find(|m| m.id.node == n.id)
                .and_then(|m| m.last_heard);
            let since = self.layout_down_since.entry(id).or_insert(now);
            if let Some(h) = heard {
                *since = (*since).min(Instant::from_std(h));
            }
            if now.saturating_duration_since(*since) >= self.down_out_after {
                out.push(id);
            }
        }
        out
    }
}

impl Worker for Steward {
    type Error = AgentError;

    fn name(&self) -> &'static str {
        "steward"
    }

    async fn work(&mut self) -> Result<Step, AgentError> {
        let meta = &self.meta;
        let views = self.gossip.members().await?;
        let alive = alive_members(&views);
        if !meta.is_initialized().await? {
            let ids: Vec<u64> = alive.iter().map(|m| m.id).collect();
            let why = match formation(&ids, meta.config.bootstrap_expect, meta.me) {
                Formation::Wait(why) => why,
                Formation::Form if self.started.elapsed() < BOOTSTRAP_SETTLE => format!(
                    "no metadata group yet: {} nodes seen; forming it once gossip settles",
                    ids.len()
                ),
                Formation::Form => bootstrap(meta, &alive).await,
            };
            if self.waiting.as_ref() != Some(&why) {
                info!("{why}");
                self.waiting = Some(why.clone());
            }
            meta.set_waiting_for_group(Some(why));
            return Ok(Step::Idle);
        }
        if self.waiting.take().is_some() {
            meta.set_waiting_for_group(None);
        }
        if !meta.is_leader() {
            self.down_since.clear();
            self.layout_down_since.clear();
            return Ok(Step::Idle);
        }
        let now = Instant::now();
        let alive_ids: BTreeSet<u64> = alive.iter().map(|m| m.id).collect();
        // A member whose metadata member failed stays down as a voter until replaced.
        self.down_since
            .retain(|id, _| !alive.iter().any(|m| m.id == *id && !m.meta_failed));
        let windows_over = end_maintenance(&self.meta, &alive_ids).await?;
        let long_down = self.long_down(&views, &alive_ids, &windows_over, now);
        let meta = &self.meta;
        reconcile_members(meta, &alive, &mut self.down_since, now).await?;
        if self.started.elapsed() >= LAYOUT_SETTLE {
            reconcile_layout(meta, &alive, &views, &long_down).await?;
        }
        record_generations(meta, &views).await?;
        Ok(Step::Idle)
    }

    async fn wait_for_work(&mut self) {
        self.ticker.tick().await;
    }
}

/// Ends the maintenance windows that ran out: a node alive again is `active`; one still
/// down stays in maintenance, now subject to `down_out_after` like any down node (its
/// window "ran over", which status shows). Returns the nodes whose window is over.
async fn end_maintenance(meta: &Group, alive: &BTreeSet<u64>) -> Result<Vec<u64>, AgentError> {
    let store = meta.store();
    let Some(layout) = store.cluster_layout()? else {
        return Ok(Vec::new());
    };
    let admins = store.node_admins()?;
    let now = meta.cluster_now_ms()?;
    let mut over = Vec::new();
    for n in layout
        .nodes()
        .iter()
        .filter(|n| n.state == NodeState::Maintenance)
    {
        let until = admins.get(&n.id.0).and_then(|a| a.maintenance_until_ms);
        if until.is_some_and(|u| u > now) {
            continue;
        }
        over.push(n.id.0);
        if alive.contains(&n.id.0) {
            info!(node = %n.id, "maintenance window over and the node is back: active");
            let outcome = meta
                .propose_one(Proposal {
                    id: None,
                    now: Timestamp::now(),
                    command: Command::ChangeNode {
                        node: n.id,
                        change: NodeChange::ExitMaintenance,
                    },
                })
                .await?;
            if let Outcome::Refused(why) = outcome {
                debug!(node = %n.id, why, "maintenance not ended (changed meanwhile)");
            }
        }
    }
    Ok(over)
}

/// Records the generation each live member runs with (from its facts: the start count
/// in its data dir), where the replica has an older one. A node that later starts from an
/// older copy of its data dir finds itself below this record (see `rejoin`).
async fn record_generations(meta: &Group, views: &[MemberView]) -> Result<(), AgentError> {
    let mut newer = Vec::new();
    for m in views.iter().filter(|m| m.state == MemberState::Alive) {
        let Some(f) = &m.facts else { continue };
        let known = meta.store().node_generation(m.id.node)?;
        if known.is_none_or(|k| k < f.generation) {
            newer.push((m.id.node, f.generation));
        }
    }
    if newer.is_empty() {
        return Ok(());
    }
    meta.propose_one(Proposal {
        id: None,
        now: Timestamp::now(),
        command: Command::RecordGenerations {
            generations: newer.clone(),
        },
    })
    .await?;
    for (node, generation) in newer {
        info!(%node, generation, "generation recorded: an older copy of the node's data dir is stale from now on");
    }
    Ok(())
}

/// What a node outside any group does this round.
#[derive(Debug, PartialEq)]
enum Formation {
    /// Wait, for the reason given (shown in status and answered to requests).
    Wait(String),
    /// Form the group, unless another agent it sees already belongs to one.
    Form,
}

/// Whether node `me` forms the group, given the ids of the agents it sees alive (itself
/// included) and `[meta] bootstrap_expect`: once enough are seen, the lowest id forms it.
fn formation(alive: &[u64], expect: usize, me: u64) -> Formation {
    if alive.len() < expect {
        return Formation::Wait(format!(
            "no metadata group yet: {} of {expect} nodes seen; bootstrap_expect = {expect}",
            alive.len()
        ));
    }
    match alive.iter().min() {
        Some(&lowest) if lowest != me => Formation::Wait(format!(
            "not in a metadata group yet: {} nodes seen; node {} (the lowest id) forms the group, or its leader adds this node",
            alive.len(),
            NodeId(lowest)
        )),
        _ => Formation::Form,
    }
}

/// Forms the group (this node has the lowest id among the agents it sees, and enough of
/// them are up), unless one of them belongs to a group already or does not answer yet.
/// Returns what this node waits for now.
async fn bootstrap(meta: &Group, alive: &[Member]) -> String {
    for m in alive.iter().filter(|m| m.id != meta.me) {
        let Ok(addr) = m.rpc.parse() else { continue };
        match meta.peer_initialized(addr).await {
            Some(false) => {}
            Some(true) => {
                return format!(
                    "not in a metadata group yet: {} belongs to one, whose leader adds this node",
                    m.name
                );
            }
            None => {
                return format!(
                    "no metadata group yet: {} does not answer at {} yet",
                    m.name, m.rpc
                );
            }
        }
    }
    let candidates: Vec<Candidate> = alive
        .iter()
        .map(|m| Candidate {
            id: m.id,
            failure_domain: m.failure_domain.clone(),
        })
        .collect();
    let voters = choose_voters(&candidates, &BTreeSet::new());
    let nodes: BTreeMap<u64, BasicNode> = alive
        .iter()
        .filter(|m| voters.contains(&m.id))
        .map(|m| (m.id, BasicNode::new(&m.rpc)))
        .collect();
    info!(voters = ?voters.iter().map(|v| format!("{v:016x}")).collect::<Vec<_>>(), "forming the metadata group");
    match meta.raft.initialize(nodes).await {
        Ok(()) => "forming the metadata group".into(),
        Err(e) => {
            warn!(error = %e, "could not form the metadata group");
            format!("no metadata group yet: forming it failed: {e}")
        }
    }
}

async fn reconcile_members(
    meta: &Group,
    alive: &[Member],
    down_since: &mut HashMap<u64, Instant>,
    now: Instant,
) -> Result<(), AgentError> {
    let (voters, known): (BTreeSet<u64>, BTreeSet<u64>) = {
        let metrics = meta.raft.metrics();
        let m = metrics.borrow();
        let membership = m.membership_config.membership();
        (
            membership.voter_ids().collect(),
            membership.nodes().map(|(id, _)| *id).collect(),
        )
    };
    for m in alive.iter().filter(|m| !known.contains(&m.id)) {
        info!(node = %NodeId(m.id), "adding agent to the metadata group as a learner");
        meta.raft
            .add_learner(m.id, BasicNode::new(&m.rpc), false)
            .await
            .map_err(|e| ConsensusError::membership("add learner", e))?;
    }
    let voting: Vec<&Member> = alive.iter().filter(|m| !m.meta_failed).collect();
    for v in &voters {
        if !voting.iter().any(|m| m.id == *v) {
            down_since.entry(*v).or_insert(now);
        }
    }
    let candidates: Vec<Candidate> = voting
        .iter()
        .map(|m| Candidate {
            id: m.id,
            failure_domain: m.failure_domain.clone(),
        })
        .collect();
    let leaving: BTreeSet<u64> = meta
        .store()
        .cluster_layout()?
        .map(|l| {
            l.nodes()
                .iter()
                .filter(|n| matches!(n.state, NodeState::Draining | NodeState::Drained))
                .map(|n| n.id.0)
                .collect()
        })
        .unwrap_or_default();
    let plan = VoterPlan {
        voters: &voters,
        known: &known,
        alive: &candidates,
        leaving: &leaving,
        down_since,
        now,
        me: meta.me,
        replace_after: VOTER_REPLACE_AFTER,
    };
    if let Some(desired) = plan.desired() {
        info!(
            from = ?voters.iter().map(|v| format!("{v:016x}")).collect::<Vec<_>>(),
            to = ?desired.iter().map(|v| format!("{v:016x}")).collect::<Vec<_>>(),
            "changing metadata voters"
        );
        meta.raft
            .change_membership(ChangeMembers::ReplaceAllVoters(desired), true)
            .await
            .map_err(|e| ConsensusError::membership("replace voters", e))?;
    }
    Ok(())
}

/// The layout the cluster should have now: every node ever seen stays (its shards are
/// still referenced), alive ones `Active`, the rest `Down`, and those in `long_down` (down
/// for `[cluster] down_out_after`) `Out`: their shards are rebuilt elsewhere. A node back
/// from `Down` or `Out` is `Active` again (what it still holds of slots moved away is
/// disowned and deleted). Draining, drained and maintenance states are kept, but a
/// draining node (or one whose maintenance window is over) in `long_down` is `Out` too.
fn desired_layout(
    current: Option<&Layout>,
    alive: &[Member],
    long_down: &[u64],
) -> Vec<LayoutNode> {
    let mut nodes: BTreeMap<u64, LayoutNode> = BTreeMap::new();
    if let Some(l) = current {
        for n in l.nodes() {
            let mut n = n.clone();
            if n.state == NodeState::Active {
                n.state = NodeState::Down;
            }
            let may_go_out = matches!(
                n.state,
                NodeState::Down | NodeState::Draining | NodeState::Maintenance
            );
            if may_go_out && long_down.contains(&n.id.0) {
                n.state = NodeState::Out;
            }
            nodes.insert(n.id.0, n);
        }
    }
    for m in alive {
        let entry = nodes.entry(m.id).or_insert_with(|| {
            LayoutNode::active(NodeId(m.id), m.failure_domain.as_str(), m.weight)
        });
        entry.failure_domain = m.failure_domain.as_str().into();
        entry.weight = m.weight;
        if matches!(entry.state, NodeState::Down | NodeState::Out) {
            entry.state = NodeState::Active;
        }
    }
    nodes.into_values().collect()
}

/// The cluster's first layout: the alive members `Active`, and the metadata group's
/// members gossip does not see alive (`absent`) `Down`. A node cut off before the first
/// layout may still serve its mounts' open files, and the orphan purge asks only the
/// layout's nodes (and live members) whether they hold an unlinked file open: a node in
/// no layout was never asked, and a file it held open was purged under its mount (the
/// simulator found it: seed 3018 of `partition`). Later layouts keep every node they ever
/// held, so only the first could miss one.
fn first_layout(alive: &[Member], absent: &[Member]) -> Vec<LayoutNode> {
    let mut nodes = desired_layout(None, alive, &[]);
    for m in absent {
        if !nodes.iter().any(|n| n.id.0 == m.id) {
            let mut n = LayoutNode::active(NodeId(m.id), m.failure_domain.as_str(), m.weight);
            n.state = NodeState::Down;
            nodes.push(n);
        }
    }
    nodes.sort_by_key(|n| n.id);
    nodes
}

/// `views`: every member gossip knows (the first layout also takes the group's members
/// it does not see alive; see [`first_layout`]).
async fn reconcile_layout(
    meta: &Group,
    alive: &[Member],
    views: &[MemberView],
    long_down: &[u64],
) -> Result<(), AgentError> {
    let current = meta.store().cluster_layout()?;
    let nodes = match &current {
        Some(_) => desired_layout(current.as_ref(), alive, long_down),
        None => first_layout(alive, &absent_group_members(meta, views, alive)),
    };
    if let Some(l) = &current {
        for n in &nodes {
            let before = l.node(n.id).map(|b| b.state);
            if before != Some(n.state) && n.state == NodeState::Out {
                warn!(node = %n.id, "node down past [cluster] down_out_after: out; its shards are rebuilt on the others");
            }
        }
    }
    if current
        .as_ref()
        .is_some_and(|l| l.nodes() == nodes.as_slice())
    {
        return Ok(());
    }
    let epoch = current.as_ref().map_or(1, |l| l.epoch() + 1);
    let layout = Layout::new(epoch, nodes).map_err(crate::data::StripeError::Placement)?;
    info!(
        epoch,
        nodes = layout.nodes().len(),
        "committing a new cluster layout"
    );
    match meta
        .propose_one(Proposal {
            id: None,
            now: Timestamp::now(),
            command: Command::SetLayout { layout },
        })
        .await
    {
        Ok(Outcome::Done) => Ok(()),
        // An operator's change took this epoch first: the next round starts from it.
        Ok(Outcome::Failed(_)) => {
            debug!(epoch, "layout changed meanwhile; trying again next round");
            Ok(())
        }
        Ok(other) => Err(ConsensusError::UnexpectedOutcome(Box::new(other)).into()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: u64, domain: &str, weight: u64) -> Member {
        Member {
            id,
            name: format!("node{id}"),
            failure_domain: domain.into(),
            rpc: format!("127.0.0.{id}:7947"),
            weight,
            meta_failed: false,
        }
    }

    #[test]
    fn a_node_outside_any_group_says_what_it_waits_for() {
        assert_eq!(
            formation(&[3, 1], 3, 1),
            Formation::Wait(
                "no metadata group yet: 2 of 3 nodes seen; bootstrap_expect = 3".into()
            )
        );
        let Formation::Wait(why) = formation(&[3, 1, 2], 3, 2) else {
            panic!("only the lowest id forms the group");
        };
        assert!(
            why.contains("node 0000000000000001 (the lowest id)"),
            "{why}"
        );
        assert_eq!(formation(&[3, 1, 2], 3, 1), Formation::Form);
        assert_eq!(formation(&[3, 1, 2, 4], 3, 1), Formation::Form);
    }

    fn states(nodes: &[LayoutNode]) -> Vec<(u64, NodeState)> {
        nodes.iter().map(|n| (n.id.0, n.state)).collect()
    }

    #[test]
    fn the_layout_keeps_every_node_ever_seen_and_marks_the_missing_down() {
        let first = desired_layout(None, &[member(1, "a", 10), member(2, "b", 10)], &[]);
        assert_eq!(
            states(&first),
            [(1, NodeState::Active), (2, NodeState::Active)]
        );
        let current = Layout::new(1, first).expect("layout");
        // Node 2 is gone, node 3 is new: 2 stays (its shards are still referenced), down.
        let next = desired_layout(
            Some(&current),
            &[member(1, "a", 10), member(3, "c", 10)],
            &[],
        );
        assert_eq!(
            states(&next),
            [
                (1, NodeState::Active),
                (2, NodeState::Down),
                (3, NodeState::Active)
            ]
        );
        // Back: active again, with its new weight and domain.
        let current = Layout::new(2, next).expect("layout");
        let back = desired_layout(Some(&current), &[member(2, "b2", 20)], &[]);
        let two = back.iter().find(|n| n.id.0 == 2).expect("node 2");
        assert_eq!((two.state, two.weight), (NodeState::Active, 20));
        assert_eq!(two.failure_domain.0, "b2");
    }

    #[test]
    fn the_first_layout_holds_the_group_members_gossip_cannot_see_as_down() {
        let first = first_layout(
            &[member(1, "a", 10), member(3, "c", 10)],
            &[member(2, "b", 10), member(3, "c", 10)],
        );
        assert_eq!(
            states(&first),
            [
                (1, NodeState::Active),
                (2, NodeState::Down),
                (3, NodeState::Active)
            ]
        );
        let two = first.iter().find(|n| n.id.0 == 2).expect("node 2");
        assert_eq!(two.failure_domain.0, "b");
    }

    #[test]
    fn a_node_down_long_enough_is_out_and_active_again_when_back() {
        let both = [member(1, "a", 10), member(2, "b", 10)];
        let current = Layout::new(1, desired_layout(None, &both, &[])).expect("layout");
        let down = desired_layout(Some(&current), &both[..1], &[]);
        assert_eq!(
            states(&down),
            [(1, NodeState::Active), (2, NodeState::Down)]
        );
        let current = Layout::new(2, down).expect("layout");
        let out = desired_layout(Some(&current), &both[..1], &[2]);
        assert_eq!(states(&out), [(1, NodeState::Active), (2, NodeState::Out)]);
        let current = Layout::new(3, out).expect("layout");
        let still = desired_layout(Some(&current), &both[..1], &[2]);
        assert_eq!(still, current.nodes(), "no new epoch while it stays out");
        let back = desired_layout(Some(&current), &both, &[]);
        assert_eq!(
            states(&back),
            [(1, NodeState::Active), (2, NodeState::Active)]
        );
    }

    #[test]
    fn an_operators_state_is_kept_whatever_gossip_says() {
        let mut nodes = desired_layout(None, &[member(1, "a", 10), member(2, "b", 10)], &[]);
        nodes[1].state = NodeState::Drained;
        let current = Layout::new(1, nodes).expect("layout");
        let next = desired_layout(
            Some(&current),
            &[member(1, "a", 10), member(2, "b", 10)],
            &[2],
        );
        assert_eq!(
            states(&next),
            [(1, NodeState::Active), (2, NodeState::Drained)]
        );
    }
}
