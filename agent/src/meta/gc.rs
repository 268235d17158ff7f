//! Garbage collection on the metadata leader: deletes the shards of stripes no extent
//! references any more, then forgets them; purges unlinked inodes once their grace period
//! is over and no mount anywhere holds them open.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use shoal_agent_api::Timestamp;
use std::net::SocketAddr;

use shoal_mesh::{GossipHandle, MemberState, MemberView};
use shoal_meta::{Command, Outcome, Proposal};
use shoal_placement::{Layout, NodeId, NodeState, StripeId};
use tracing::{debug, info, warn};

use super::service::MetaService;
use crate::stripes::Stripes;

/// Stripes freed per pass, at most.
const STRIPES_PER_PASS: usize = 256;

pub async fn run(meta: Arc<MetaService>, stripes: Arc<Stripes>, gossip: GossipHandle) {
    let mut tick = tokio::time::interval(Duration::from_secs(meta.config.gc_interval_s));
    let mut unknown_since: HashMap<StripeId, Instant> = HashMap::new();
    loop {
        tick.tick().await;
        // Every node sweeps its own store; the leader also frees and purges cluster-wide.
        collect_orphan_shards(&meta, &stripes, &mut unknown_since).await;
        if !meta.is_leader() {
            continue;
        }
        free_stripes(&meta, &stripes).await;
        purge_orphans(&meta, &gossip).await;
    }
}

/// Deletes local shards of stripes the metadata has not known for the whole grace period
/// (never committed: their writer failed or crashed before the commit). The clock starts
/// when this agent first sees a stripe unknown, so a restart only delays collection.
///
/// Unknown at the read index is not enough: a commit naming the stripe may still be in
/// the log, not yet committed, or be retried later. So the stripes are first abandoned
/// through Raft (refused for any the log has committed by then, and fencing the rest
/// against later commits), and only the ones the state machine fenced are deleted.
async fn collect_orphan_shards(
    meta: &MetaService,
    stripes: &Stripes,
    unknown_since: &mut HashMap<StripeId, Instant>,
) {
    let local = stripes.local_stripes();
    if local.is_empty() {
        unknown_since.clear();
        return;
    }
    // Judge against everything committed so far, not a lagging replica.
    if meta.barrier().await.is_err() {
        return;
    }
    let grace = Duration::from_secs(meta.config.orphan_shard_grace_s);
    let now = Instant::now();
    let mut still_unknown = HashMap::new();
    let mut due = Vec::new();
    for id in local {
        match meta.store().stripe_known(id) {
            Ok(true) => {}
            Ok(false) => {
                let since = unknown_since.get(&id).copied().unwrap_or(now);
                if now.duration_since(since) < grace {
                    still_unknown.insert(id, since);
                } else {
                    due.push(id);
                }
            }
            Err(e) => {
                warn!(error = %e, "cannot check stripes against the metadata");
                return;
            }
        }
    }
    *unknown_since = still_unknown;
    if due.is_empty() {
        return;
    }
    let proposal = Proposal {
        id: None,
        now: Timestamp::now(),
        command: Command::AbandonStripes { ids: due.clone() },
    };
    let fenced = match meta.propose_one(proposal).await {
        Ok(Outcome::Abandoned(ids)) => ids,
        Ok(other) => {
            warn!(answer = ?other, "unexpected answer to abandoning stripes");
            return;
        }
        Err(e) => {
            // Not known whether it applied: the next pass asks again (abandoning is
            // idempotent, and the shards stay until an answer says they may go).
            debug!(error = %e, "could not abandon unreferenced stripes yet");
            for id in due {
                unknown_since.insert(id, now.checked_sub(grace).unwrap_or(now));
            }
            return;
        }
    };
    for id in fenced {
        match stripes.delete_local(id).await {
            Ok(n) => {
                info!(stripe = %id, shards = n, "deleted shards no file references (never committed)")
            }
            Err(e) => warn!(stripe = %id, error = %e, "could not delete orphan shards"),
        }
    }
}

async fn free_stripes(meta: &MetaService, stripes: &Arc<Stripes>) {
    let garbage = match meta.store().garbage(STRIPES_PER_PASS) {
        Ok(g) => g,
        Err(e) => {
            warn!(error = %e, "cannot list unreferenced stripes");
            return;
        }
    };
    if garbage.is_empty() {
        return;
    }
    let mut freed = Vec::new();
    for record in &garbage {
        match stripes.delete(record).await {
            Ok(()) => freed.push(record.id),
            Err(e) => debug!(stripe = %record.id, error = %e, "stripe not freed yet"),
        }
    }
    if freed.is_empty() {
        return;
    }
    let n = freed.len();
    let proposal = Proposal {
        id: None,
        now: Timestamp::now(),
        command: Command::StripesFreed { ids: freed },
    };
    match meta.propose_one(proposal).await {
        Ok(_) => info!(stripes = n, "freed unreferenced stripes"),
        Err(e) => warn!(error = %e, "could not record freed stripes"),
    }
}

async fn purge_orphans(meta: &MetaService, gossip: &GossipHandle) {
    let orphans = match meta.store().orphans() {
        Ok(o) => o,
        Err(e) => {
            warn!(error = %e, "cannot list orphan inodes");
            return;
        }
    };
    let cutoff = Timestamp::now().secs - meta.config.orphan_grace_s as i64;
    let due: Vec<u64> = orphans
        .into_iter()
        .filter(|(_, at)| at.secs <= cutoff)
        .map(|(ino, _)| ino)
        .collect();
    if due.is_empty() {
        return;
    }
    let Ok(members) = gossip.members().await else {
        return;
    };
    let layout = match meta.store().cluster_layout() {
        Ok(l) => l,
        Err(e) => {
            warn!(error = %e, "cannot read the cluster layout");
            return;
        }
    };
    let peers = match holders_to_ask(layout.as_ref(), &members) {
        Ok(peers) => peers,
        Err(node) => {
            debug!(%node, inodes = due.len(), "not purging unlinked inodes: a node that may hold them open cannot be asked");
            return;
        }
    };
    let held = meta.held_anywhere(&due, &peers).await;
    let proposals: Vec<Proposal> = due
        .iter()
        .filter(|ino| !held.contains(ino))
        .map(|&ino| Proposal {
            id: None,
            now: Timestamp::now(),
            command: Command::Purge { ino },
        })
        .collect();
    if proposals.is_empty() {
        return;
    }
    let n = proposals.len();
    match meta.propose(proposals).await {
        Ok(_) => info!(inodes = n, "purged unlinked inodes"),
        Err(e) => warn!(error = %e, "could not purge unlinked inodes"),
    }
}

/// Which agents must say whether a mount holds an orphan open before it is purged: every
/// node of the layout that is not `out`, and every live member not in the layout yet.
/// `Err(node)` when one of them cannot be asked (not alive, or no address known): a node
/// cut off by a partition still serves its open files, so it counts as holding
/// everything until it is `out` or back (a restarted agent counts as holding everything
/// until its mounts have re-announced their handles).
fn holders_to_ask(
    layout: Option<&Layout>,
    members: &[MemberView],
) -> Result<Vec<SocketAddr>, NodeId> {
    let reachable = |id: NodeId| {
        members
            .iter()
            .find(|m| m.id.node == id && !m.is_self)
            .filter(|m| m.state == MemberState::Alive)
            .and_then(|m| m.facts.as_ref().map(|f| f.rpc_addr))
    };
    let me = members.iter().find(|m| m.is_self).map(|m| m.id.node);
    let mut addrs = Vec::new();
    let mut in_layout = Vec::new();
    for node in layout.map(Layout::nodes).unwrap_or_default() {
        in_layout.push(node.id);
        if node.state == NodeState::Out || Some(node.id) == me {
            continue;
        }
        addrs.push(reachable(node.id).ok_or(node.id)?);
    }
    for m in members
        .iter()
        .filter(|m| !m.is_self && m.state == MemberState::Alive)
        .filter(|m| !in_layout.contains(&m.id.node))
    {
        if let Some(f) = &m.facts {
            addrs.push(f.rpc_addr);
        }
    }
    Ok(addrs)
}

#[cfg(test)]
mod tests {
    use shoal_mesh::{MemberId, MemberState, MemberView, NodeFacts, NodeRole};
    use shoal_placement::{Layout, LayoutNode, NodeId, NodeState};

    use super::holders_to_ask;

    fn member(id: u64, state: MemberState, is_self: bool) -> MemberView {
        let addr = format!("127.0.0.{id}:7947").parse().expect("addr");
        MemberView {
            id: MemberId {
                node: NodeId(id),
                addr,
                generation: 1,
            },
            state,
            incarnation: 0,
            last_heard: None,
            is_self,
            facts: Some(NodeFacts {
                node: NodeId(id),
                generation: 1,
                seq: 0,
                name: format!("n{id}"),
                failure_domain: "fd".into(),
                rpc_addr: addr,
                bulk_addr: None,
                capacity_bytes: 1,
                used_bytes: 0,
                role: NodeRole::Active,
                agent_version: String::new(),
                store_accepting: true,
                store_room_bytes: 1,
            }),
        }
    }

    fn layout(states: &[(u64, NodeState)]) -> Layout {
        let nodes = states
            .iter()
            .map(|&(id, state)| LayoutNode {
                state,
                ..LayoutNode::active(NodeId(id), "fd", 1)
            })
            .collect();
        Layout::new(1, nodes).expect("layout")
    }

    #[test]
    fn a_node_that_cannot_be_asked_holds_every_orphan_until_it_is_out() {
        let members = [
            member(1, MemberState::Alive, true),
            member(2, MemberState::Alive, false),
            member(3, MemberState::Suspect, false),
        ];
        let l = layout(&[
            (1, NodeState::Active),
            (2, NodeState::Active),
            (3, NodeState::Active),
        ]);
        assert_eq!(holders_to_ask(Some(&l), &members), Err(NodeId(3)));
        let down = layout(&[
            (1, NodeState::Active),
            (2, NodeState::Active),
            (3, NodeState::Down),
        ]);
        assert_eq!(holders_to_ask(Some(&down), &members), Err(NodeId(3)));
        // A node in the layout that gossip does not know at all is not asked either.
        let four = layout(&[
            (1, NodeState::Active),
            (2, NodeState::Active),
            (4, NodeState::Active),
        ]);
        assert_eq!(holders_to_ask(Some(&four), &members[..2]), Err(NodeId(4)));
        let out = layout(&[
            (1, NodeState::Active),
            (2, NodeState::Active),
            (3, NodeState::Out),
        ]);
        let asked = holders_to_ask(Some(&out), &members).expect("askable");
        assert_eq!(asked, vec!["127.0.0.2:7947".parse().expect("addr")]);
    }

    #[test]
    fn live_members_not_in_the_layout_yet_are_asked_too() {
        let members = [
            member(1, MemberState::Alive, true),
            member(2, MemberState::Alive, false),
        ];
        let l = layout(&[(1, NodeState::Active)]);
        assert_eq!(
            holders_to_ask(Some(&l), &members),
            Ok(vec!["127.0.0.2:7947".parse().expect("addr")])
        );
        assert_eq!(holders_to_ask(None, &members).map(|a| a.len()), Ok(1));
    }
}
