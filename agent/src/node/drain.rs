//! Operator changes to a node (`shoal drain`, `undrain`, `remove`, `maintenance`) and
//! how drains stand (`shoal drain status`). A drain is assessed first with the repair
//! planner itself, as if the node were draining already: what moves, where, and whether
//! every shard finds a target with room that leaves its stripe at least as well spread as
//! it is (as many shards and failure domains, no more shards in one domain); one that
//! cannot finish is refused, naming what would get worse, before anything changes. The
//! change is then one `ChangeNode` command, which the state machine checks again against
//! the node's state; the repair worker does the moving.
//!
//! Example: 7 nodes in 3 failure domains with 4+2 can drain a node of a three-node domain
//! but not one of a two-node domain ("N stripe(s) would hold up to 3 shards in one failure
//! domain (now at most 2)"). `--dry-run` stops after the assessment; a drain that cannot
//! finish is refused (exit 1). The drain's state is in Raft, so a kill -9 of any agent,
//! the leader doing the moves included, loses nothing. A draining node down past
//! `down_out_after` becomes `out`. `undrain` makes it `active` (nothing moves back);
//! `remove` forgets a `drained` or `out` node whose agent is stopped, refused while a
//! stripe cannot be read without it.
//!
//! Operator questions (`drain`, `undrain`, `maintenance`, `remove`, `drain status`,
//! `ok-to-stop`) first bring the local replica up to the cluster's commit point
//! ([`catch_up`]: a read barrier, at most 5 s, then the replica as it is). The simulator's
//! schedule does the same (seed 289 of `mixed`: it started two drains from a lagging
//! replica).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use shoal_agent_api::{DrainPlan, DrainProgress, DrainTarget};
use shoal_mesh::{MemberState, MemberView};
use shoal_namespace::format::Timestamp;
use shoal_namespace::nodes::{NodeChange, state_name, transition};
use shoal_namespace::{Command, Outcome, Proposal};
use shoal_placement::{Layout, NodeId, NodeState};

use crate::redundancy::{self as plan, Health, Room, Weakened};
use crate::{AgentError, Node};

/// Stripes read from the replica per page.
const PAGE: usize = 1024;

/// How long an operator's question waits for this node's replica to catch up with the
/// cluster before it is answered from the replica as it is.
const CATCH_UP_WAIT: Duration = Duration::from_secs(5);

/// Brings this node's replica up to everything the cluster committed before the call (a
/// read barrier), so that an answer includes a change made through another node a moment
/// ago. Without a leader within [`CATCH_UP_WAIT`] the answer comes from the replica as it
/// is (an operator still gets one during an outage), and the agent's log says so; a change
/// is checked again by the state machine when it applies, so it never rests on such a view.
pub(crate) async fn catch_up(node: &Node) {
    match tokio::time::timeout(CATCH_UP_WAIT, node.group.barrier()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "answering from the local replica, which may be behind")
        }
        Err(_) => tracing::warn!(
            waited_s = CATCH_UP_WAIT.as_secs(),
            "no read barrier in time; answering from the local replica, which may be behind"
        ),
    }
}

/// A node named by an operator: its id and name.
pub struct Named {
    pub id: NodeId,
    pub name: String,
}

/// Finds the node `which` names (a name gossip knows, or a 16-hex-digit id of a member or
/// a layout node), or says which nodes there are.
pub fn find_node(
    members: &[MemberView],
    layout: Option<&Layout>,
    which: &str,
) -> Result<Named, AgentError> {
    let name_of = |m: &MemberView| m.facts.as_ref().map(|f| f.name.clone());
    let by_member = members
        .iter()
        .find(|m| format!("{:016x}", m.id.node.0) == which || name_of(m).as_deref() == Some(which));
    if let Some(m) = by_member {
        return Ok(Named {
            id: m.id.node,
            name: name_of(m).unwrap_or_default(),
        });
    }
    if let Some(n) = layout
        .into_iter()
        .flat_map(|l| l.nodes())
        .find(|n| format!("{:016x}", n.id.0) == which)
    {
        return Ok(Named {
            id: n.id,
            name: String::new(),
        });
    }
    let mut known: Vec<String> = members.iter().filter_map(name_of).collect();
    known.sort();
    Err(AgentError::NoSuch(format!(
        "no node {which:?} in this cluster (nodes: {})",
        known.join(", ")
    )))
}

/// The committed layout, or an operator's error before there is one.
pub fn committed_layout(node: &Node) -> Result<Layout, AgentError> {
    node.group
        .store()
        .cluster_layout()?
        .ok_or_else(|| AgentError::NotYet("the cluster has no layout yet".into()))
}

/// The names gossip knows, by node.
fn names(members: &[MemberView]) -> HashMap<NodeId, String> {
    members
        .iter()
        .filter_map(|m| m.facts.as_ref().map(|f| (m.id.node, f.name.clone())))
        .collect()
}

/// `layout` with `node` in `state` (same epoch: only for planning).
fn with_state(layout: &Layout, node: NodeId, state: NodeState) -> Result<Layout, AgentError> {
    layout
        .with_state(node, state, layout.epoch())
        .map_err(|e| crate::data::StripeError::Placement(e).into())
}

/// A node an operator named for `change`: gossip's members as the request saw them, the
/// node, and how to call it in answers.
struct Asked {
    members: Vec<MemberView>,
    target: Named,
    who: String,
}

/// Finds the node `which` names and checks that its layout state allows `change`.
async fn ask(node: &Node, which: &str, change: NodeChange) -> Result<Asked, AgentError> {
    catch_up(node).await;
    let members = node.gossip.members().await?;
    let layout = node.group.store().cluster_layout()?;
    let target = find_node(&members, layout.as_ref(), which)?;
    let who = if target.name.is_empty() {
        format!("{}", target.id)
    } else {
        format!("{} ({})", target.name, target.id)
    };
    let state = layout
        .as_ref()
        .and_then(|l| l.node(target.id))
        .map(|n| n.state)
        .ok_or_else(|| AgentError::NotYet(format!("{who} is not in the layout yet")))?;
    transition(state, change).map_err(AgentError::Refused)?;
    Ok(Asked {
        members,
        target,
        who,
    })
}

/// What draining `target` would move where, from the local replica and gossip's
/// `members`: the repair planner run over every stripe with a shard on it, the node
/// counted as draining.
async fn assess(
    node: &Node,
    members: &[MemberView],
    target: &Named,
) -> Result<DrainPlan, AgentError> {
    let store = node.group.store();
    let layout = committed_layout(node)?;
    let alive = crate::workers::repair::alive_of(members);
    let as_draining = with_state(&layout, target.id, NodeState::Draining)?;
    let placement = with_state(
        &node.stripes.placement_layout().await?,
        target.id,
        NodeState::Draining,
    )?;
    let room: Room = crate::workers::repair::room_of(members);
    let mut candidates = Vec::new();
    let (mut stripes, mut bytes) = (0u64, 0u64);
    let mut cursor = None;
    loop {
        let page = store.stripes(cursor, PAGE)?;
        for r in &page {
            let held = r.shards.iter().filter(|s| s.node == target.id).count() as u64;
            if held == 0 {
                continue;
            }
            stripes += 1;
            bytes += held * r.shard_len;
            let mut h = Health::of(r, &as_draining, &alive);
            // Only what moves off the node: other lost slots are repair's.
            h.lost.clear();
            candidates.push((r.clone(), h));
        }
        cursor = page.last().map(|r| r.id);
        if page.len() < PAGE {
            break;
        }
    }
    let p = plan::plan(&candidates, &placement, &mut room.clone(), &HashMap::new());
    let names = names(members);
    let mut per_target: BTreeMap<NodeId, (u64, u64)> = BTreeMap::new();
    for t in &p.tasks {
        for c in &t.copies {
            let e = per_target.entry(c.to).or_default();
            e.0 += 1;
            e.1 += t.record.shard_len;
        }
    }
    let domains = domains_taking_shards(&placement, &alive);
    let mut reasons = weakened_reasons(&p.weakened, &domains);
    let waiting: u64 = candidates
        .iter()
        .filter(|(_, h)| h.moving.is_empty())
        .count() as u64;
    if waiting > 0 {
        reasons.push(format!(
            "{waiting} stripe(s) have their shard on the node while it is down: it must be up to be drained"
        ));
    }
    let stuck: u64 = p.no_target.iter().map(|(_, s)| s.len() as u64).sum();
    if stuck > 0 {
        let room_left: u64 = room
            .iter()
            .filter(|(n, _)| **n != target.id)
            .map(|(_, r)| r)
            .sum();
        reasons.push(format!(
            "{stuck} shard(s) have no node to go to (every other node holds a shard of their stripe, is down, or is full), so their stripes would keep fewer shards: {bytes} bytes to move, {room_left} bytes of room on the other nodes; {domains}"
        ));
    }
    Ok(DrainPlan {
        node: format!("{:016x}", target.id.0),
        name: target.name.clone(),
        dry_run: true,
        started: false,
        stripes,
        bytes,
        targets: per_target
            .into_iter()
            .map(|(n, (shards, bytes))| DrainTarget {
                node: format!("{:016x}", n.0),
                name: names.get(&n).cloned().unwrap_or_default(),
                shards,
                bytes,
            })
            .collect(),
        can_finish: reasons.is_empty(),
        reasons,
    })
}

/// The nodes that take shards (eligible and alive in `placement`), by failure domain, in
/// words: what an operator needs to see why a drain would spread stripes worse.
fn domains_taking_shards(placement: &Layout, alive: &BTreeSet<NodeId>) -> String {
    let mut per_domain: BTreeMap<String, usize> = BTreeMap::new();
    for n in placement
        .nodes()
        .iter()
        .filter(|n| n.is_eligible() && alive.contains(&n.id))
    {
        *per_domain.entry(n.failure_domain.to_string()).or_default() += 1;
    }
    let list: Vec<String> = per_domain.iter().map(|(d, n)| format!("{d} {n}")).collect();
    format!(
        "nodes that would take shards, by failure domain: {}",
        if list.is_empty() {
            "none".to_owned()
        } else {
            list.join(", ")
        }
    )
}

/// What would get worse for the stripes whose shards could move off the node only by
/// spreading them worse (`weakened`, from the planner), in words; `domains` says where
/// the nodes that would take shards are.
fn weakened_reasons(weakened: &[Weakened], domains: &str) -> Vec<String> {
    let crowded: Vec<&Weakened> = weakened
        .iter()
        .filter(|w| w.then.most_in_one_domain > w.now.most_in_one_domain)
        .collect();
    let narrowed: Vec<&Weakened> = weakened
        .iter()
        .filter(|w| w.then.domains < w.now.domains)
        .collect();
    let thinned = weakened
        .iter()
        .filter(|w| w.then.shards < w.now.shards)
        .count();
    let mut reasons = Vec::new();
    if !crowded.is_empty() {
        let then = crowded.iter().map(|w| w.then.most_in_one_domain).max();
        let now = crowded.iter().map(|w| w.now.most_in_one_domain).max();
        reasons.push(format!(
            "{} stripe(s) would hold up to {} shards in one failure domain (now at most {}): losing that domain would cost them more shards; {domains}",
            crowded.len(),
            then.unwrap_or(0),
            now.unwrap_or(0),
        ));
    }
    if !narrowed.is_empty() {
        let then = narrowed.iter().map(|w| w.then.domains).min();
        let now = narrowed.iter().map(|w| w.now.domains).max();
        reasons.push(format!(
            "{} stripe(s) would span fewer failure domains (as few as {}, now up to {}); {domains}",
            narrowed.len(),
            then.unwrap_or(0),
            now.unwrap_or(0),
        ));
    }
    if thinned > 0 {
        reasons.push(format!("{thinned} stripe(s) would keep fewer shards"));
    }
    reasons
}

/// `shoal drain NODE [--dry-run]`.
pub async fn drain(node: &Node, which: &str, dry_run: bool) -> Result<DrainPlan, AgentError> {
    let drain = NodeChange::Drain {
        stripes: 0,
        bytes: 0,
    };
    let Asked {
        members, target, ..
    } = ask(node, which, drain).await?;
    let mut plan = assess(node, &members, &target).await?;
    plan.dry_run = dry_run;
    if dry_run || !plan.can_finish {
        return Ok(plan);
    }
    change_node(
        node,
        &members,
        target.id,
        NodeChange::Drain {
            stripes: plan.stripes,
            bytes: plan.bytes,
        },
    )
    .await?;
    plan.started = true;
    Ok(plan)
}

/// Proposes `change` for `node`; a refusal comes back as [`AgentError::Refused`]. Refused
/// while an alive member runs another release: `ChangeNode` is new in the log, and an
/// agent of an older release could not apply it.
async fn change_node(
    node: &Node,
    members: &[MemberView],
    id: NodeId,
    change: NodeChange,
) -> Result<(), AgentError> {
    let others = crate::releases::alive_on_other_releases(members);
    if !others.is_empty() {
        return Err(AgentError::Refused(format!(
            "node changes need every node on this release ({}): {}; finish the upgrade first",
            crate::AGENT_VERSION,
            others.join(", ")
        )));
    }
    let outcome = node
        .group
        .propose_one(Proposal {
            id: None,
            now: Timestamp::now(),
            command: Command::ChangeNode { node: id, change },
        })
        .await?;
    match outcome {
        Outcome::Done => Ok(()),
        Outcome::Refused(why) => Err(AgentError::Refused(why)),
        other => Err(crate::consensus::ConsensusError::UnexpectedOutcome(Box::new(other)).into()),
    }
}

/// `shoal undrain`, `shoal remove`, `shoal maintenance enter/exit`: the change, and what
/// it did in words.
pub async fn change(node: &Node, which: &str, change: NodeChange) -> Result<String, AgentError> {
    let Asked {
        members,
        target,
        who,
    } = ask(node, which, change).await?;
    if change == NodeChange::Remove {
        let alive = members
            .iter()
            .any(|m| m.id.node == target.id && m.state == MemberState::Alive);
        if alive {
            return Err(AgentError::Refused(format!(
                "{who} is still running: stop its agent first (a running node would join the layout again)"
            )));
        }
        let needed = stripes_needing(node, target.id)?;
        if needed > 0 {
            return Err(AgentError::Refused(format!(
                "{needed} stripe(s) cannot be read without {who}'s shards: it holds the only copy of their data; bring it back or restore those files"
            )));
        }
    }
    change_node(node, &members, target.id, change).await?;
    Ok(match change {
        NodeChange::Undrain => {
            format!("{who} is active again; what was already moved stays where it is")
        }
        NodeChange::Remove => format!("{who} is removed from the layout"),
        NodeChange::EnterMaintenance { for_ms } => format!(
            "{who} is in maintenance for {}s: if it goes down it is not rebuilt until the window ends",
            for_ms / 1000
        ),
        NodeChange::ExitMaintenance => format!("{who} is out of maintenance: active"),
        NodeChange::Drain { .. } | NodeChange::Drained => format!("{who}: done"),
    })
}

/// Live stripes that name `id` and have fewer than k shards available elsewhere.
fn stripes_needing(node: &Node, id: NodeId) -> Result<u64, AgentError> {
    let store = node.group.store();
    let Some(layout) = store.cluster_layout()? else {
        return Ok(0);
    };
    // Which nodes are up matters little here: count what the others could give, up or not.
    let others: BTreeSet<NodeId> = layout
        .nodes()
        .iter()
        .map(|n| n.id)
        .filter(|n| *n != id)
        .collect();
    let mut needed = 0;
    let mut cursor = None;
    loop {
        let page = store.stripes(cursor, PAGE)?;
        for r in page
            .iter()
            .filter(|r| r.shards.iter().any(|s| s.node == id))
        {
            let h = Health::of(r, &layout, &others);
            let elsewhere = h
                .available
                .iter()
                .filter(|i| r.shards[usize::from(**i)].node != id)
                .count();
            if elsewhere < usize::from(r.ec.k) {
                needed += 1;
            }
        }
        cursor = page.last().map(|r| r.id);
        if page.len() < PAGE {
            break;
        }
    }
    Ok(needed)
}

/// `shoal drain status [NODE]`: every draining or drained node (or the one asked about):
/// its state as of the question, its progress as this agent's last scan saw it.
pub async fn status(node: &Node, which: Option<&str>) -> Result<Vec<DrainProgress>, AgentError> {
    catch_up(node).await;
    let members = node.gossip.members().await?;
    let store = node.group.store();
    let Some(layout) = store.cluster_layout()? else {
        return Ok(Vec::new());
    };
    let only = match which {
        Some(w) => Some(find_node(&members, Some(&layout), w)?.id),
        None => None,
    };
    let admins = store.node_admins()?;
    let clock = node.group.cluster_now_ms()?;
    let view = node.repair.view();
    let names = names(&members);
    let mut out = Vec::new();
    for n in layout.nodes() {
        let draining = matches!(n.state, NodeState::Draining | NodeState::Drained);
        if only.is_some_and(|o| o != n.id) || (!draining && only.is_none()) {
            continue;
        }
        let start = admins.get(&n.id.0).and_then(|a| a.drain);
        let seen = view.draining.get(&n.id);
        let (total_s, total_b) = start.map_or((0, 0), |s| (s.stripes, s.bytes));
        let (left_s, left_b) = match (n.state, seen) {
            (NodeState::Drained, _) => (0, 0),
            (_, Some(d)) => (d.stripes, d.bytes),
            (NodeState::Draining, None) => (total_s, total_b),
            _ => (0, 0),
        };
        let rate = seen.map_or(0, |d| d.bytes_per_sec);
        out.push(DrainProgress {
            node: format!("{:016x}", n.id.0),
            name: names.get(&n.id).cloned().unwrap_or_default(),
            state: state_name(n.state).to_owned(),
            stripes_total: total_s.max(left_s),
            bytes_total: total_b.max(left_b),
            stripes_left: left_s,
            bytes_left: left_b,
            bytes_per_sec: rate,
            eta_seconds: (rate > 0).then(|| left_b.div_ceil(rate)),
            running_ms: start.map_or(0, |s| clock.saturating_sub(s.started_ms)),
        });
    }
    if let (Some(id), true) = (only, out.is_empty()) {
        return Err(AgentError::NoSuch(format!(
            "node {id} is not in the layout"
        )));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use shoal_placement::{Spread, StripeId};

    use super::{Weakened, weakened_reasons};

    fn spread(shards: usize, domains: usize, most_in_one_domain: usize) -> Spread {
        Spread {
            shards,
            domains,
            most_in_one_domain,
        }
    }

    #[test]
    fn a_refusal_names_what_would_get_worse() {
        let weakened = |id, now, then| Weakened {
            stripe: StripeId(id),
            slots: vec![0],
            now,
            then,
        };
        let domains = "nodes that would take shards, by failure domain: fd1 3, fd2 1, fd3 2";
        let reasons = weakened_reasons(
            &[
                weakened(1, spread(6, 3, 2), spread(6, 3, 3)),
                weakened(2, spread(6, 3, 2), spread(6, 3, 3)),
                weakened(3, spread(3, 3, 1), spread(3, 2, 2)),
            ],
            domains,
        );
        assert_eq!(reasons.len(), 2, "{reasons:?}");
        assert!(
            reasons[0].starts_with(
                "3 stripe(s) would hold up to 3 shards in one failure domain (now at most 2)"
            ),
            "{reasons:?}"
        );
        assert!(reasons[0].ends_with(domains), "{reasons:?}");
        assert!(
            reasons[1].starts_with(
                "1 stripe(s) would span fewer failure domains (as few as 2, now up to 3)"
            ),
            "{reasons:?}"
        );
        assert!(weakened_reasons(&[], domains).is_empty());
    }
}
