//! Keeps the metadata group and the cluster layout in step with membership: forms the
//! group when a new cluster starts, adds every agent as a learner, chooses voters across
//! failure domains, replaces a voter that stays down, and commits layout changes (new
//! nodes, nodes down and back) as new layout epochs. Acts only on the leader, except the
//! one-time bootstrap.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::{BasicNode, ChangeMembers};
use shoal_agent_api::Timestamp;
use shoal_mesh::{GossipHandle, MemberState, MemberView};
use shoal_meta::{Command, Outcome, Proposal};
use shoal_placement::{Layout, LayoutNode, NodeId, NodeState};
use tracing::{info, warn};

use super::service::MetaService;
use super::voters::{Candidate, choose_voters};

const TICK: Duration = Duration::from_secs(1);
/// Members must have been seen this long before a new cluster forms (gossip converges).
const BOOTSTRAP_SETTLE: Duration = Duration::from_secs(3);
/// A voter down this long is replaced.
const VOTER_REPLACE_AFTER: Duration = Duration::from_secs(30);

struct Member {
    id: u64,
    failure_domain: String,
    rpc: String,
    weight: u64,
}

fn alive_members(views: &[MemberView]) -> Vec<Member> {
    views
        .iter()
        .filter(|m| m.state == MemberState::Alive)
        .filter_map(|m| {
            let f = m.facts.as_ref()?;
            Some(Member {
                id: m.id.node.0,
                failure_domain: f.failure_domain.clone(),
                rpc: f.rpc_addr.to_string(),
                weight: f.capacity_bytes.max(1),
            })
        })
        .collect()
}

pub async fn run(meta: Arc<MetaService>, gossip: GossipHandle) {
    let started = Instant::now();
    let mut down_since: HashMap<u64, Instant> = HashMap::new();
    let mut tick = tokio::time::interval(TICK);
    loop {
        tick.tick().await;
        let Ok(views) = gossip.members().await else {
            return;
        };
        let alive = alive_members(&views);
        match meta.raft.is_initialized().await {
            Ok(false) => {
                if started.elapsed() >= BOOTSTRAP_SETTLE {
                    bootstrap(&meta, &alive).await;
                }
                continue;
            }
            Ok(true) => {}
            Err(_) => return,
        }
        if !meta.is_leader() {
            down_since.clear();
            continue;
        }
        let now = Instant::now();
        let alive_ids: BTreeSet<u64> = alive.iter().map(|m| m.id).collect();
        down_since.retain(|id, _| !alive_ids.contains(id));
        if let Err(e) = reconcile_members(&meta, &alive, &mut down_since, now).await {
            warn!(error = %e, "could not update the metadata group's membership");
        }
        if let Err(e) = reconcile_layout(&meta, &alive).await {
            warn!(error = %e, "could not update the cluster layout");
        }
        if let Err(e) = record_generations(&meta, &views).await {
            warn!(error = %e, "could not record the nodes' generations");
        }
    }
}

/// Records the generation each live member runs with (from its facts: the start count
/// in its data dir), where the replica has an older one. A node that later starts from an
/// older copy of its data dir finds itself below this record (see `rejoin`).
async fn record_generations(meta: &MetaService, views: &[MemberView]) -> Result<(), String> {
    let mut newer = Vec::new();
    for m in views.iter().filter(|m| m.state == MemberState::Alive) {
        let Some(f) = &m.facts else { continue };
        let known = meta
            .store()
            .node_generation(m.id.node)
            .map_err(|e| e.to_string())?;
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
        command: Command::RecordGenerations { generations: newer },
    })
    .await
    .map(|_| ())
    .map_err(|e| e.to_string())
}

/// Forms the group if this node has the lowest id among the agents it sees, enough of
/// them are up, and none of them belongs to a group already.
async fn bootstrap(meta: &MetaService, alive: &[Member]) {
    if alive.len() < meta.config.bootstrap_expect {
        return;
    }
    if alive.iter().map(|m| m.id).min() != Some(meta.me) {
        return;
    }
    for m in alive.iter().filter(|m| m.id != meta.me) {
        let Ok(addr) = m.rpc.parse() else { continue };
        if meta.peer_initialized(addr).await != Some(false) {
            // Either already in a group (it will add us) or not answering yet.
            return;
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
    if let Err(e) = meta.raft.initialize(nodes).await {
        warn!(error = %e, "could not form the metadata group");
    }
}

async fn reconcile_members(
    meta: &MetaService,
    alive: &[Member],
    down_since: &mut HashMap<u64, Instant>,
    now: Instant,
) -> Result<(), String> {
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
            .map_err(|e| e.to_string())?;
    }
    for v in &voters {
        if !alive.iter().any(|m| m.id == *v) {
            down_since.entry(*v).or_insert(now);
        }
    }
    // Voters still counted: alive ones, and down ones not yet past the grace period.
    let keep: BTreeSet<u64> = voters
        .iter()
        .copied()
        .filter(|v| {
            down_since
                .get(v)
                .is_none_or(|t| now - *t < VOTER_REPLACE_AFTER)
        })
        .collect();
    let mut candidates: Vec<Candidate> = alive
        .iter()
        .map(|m| Candidate {
            id: m.id,
            failure_domain: m.failure_domain.clone(),
        })
        .collect();
    // A voter inside its grace period keeps its seat as if alive.
    for v in keep.iter().filter(|v| !alive.iter().any(|m| m.id == **v)) {
        candidates.push(Candidate {
            id: *v,
            failure_domain: String::new(),
        });
    }
    let desired = choose_voters(&candidates, &keep);
    if desired != voters && desired.iter().all(|d| known.contains(d) || *d == meta.me) {
        info!(
            from = ?voters.iter().map(|v| format!("{v:016x}")).collect::<Vec<_>>(),
            to = ?desired.iter().map(|v| format!("{v:016x}")).collect::<Vec<_>>(),
            "changing metadata voters"
        );
        meta.raft
            .change_membership(ChangeMembers::ReplaceAllVoters(desired), true)
            .await
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// The layout the cluster should have now: every node ever seen stays (its shards are
/// still referenced), alive ones `Active`, the rest `Down`. Drained/out states set by an
/// operator are kept.
fn desired_layout(current: Option<&Layout>, alive: &[Member]) -> Vec<LayoutNode> {
    let mut nodes: BTreeMap<u64, LayoutNode> = BTreeMap::new();
    if let Some(l) = current {
        for n in l.nodes() {
            let mut n = n.clone();
            if n.state == NodeState::Active {
                n.state = NodeState::Down;
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
        if entry.state == NodeState::Down {
            entry.state = NodeState::Active;
        }
    }
    nodes.into_values().collect()
}

async fn reconcile_layout(meta: &MetaService, alive: &[Member]) -> Result<(), String> {
    let current = meta.store().cluster_layout().map_err(|e| e.to_string())?;
    let nodes = desired_layout(current.as_ref(), alive);
    if current
        .as_ref()
        .is_some_and(|l| l.nodes() == nodes.as_slice())
    {
        return Ok(());
    }
    let epoch = current.as_ref().map_or(1, |l| l.epoch() + 1);
    let layout = Layout::new(epoch, nodes).map_err(|e| e.to_string())?;
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
        Ok(other) => Err(format!("layout refused: {other:?}")),
        Err(e) => Err(e.to_string()),
    }
}
