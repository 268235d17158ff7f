//! Garbage collection, as three workers. On every node, `orphan-shards` deletes local
//! shards no stripe record names (a writer that crashed before its commit). On the
//! metadata leader, `stripe-gc` deletes the shards of stripes no extent references any
//! more and then forgets them, and `orphan-purge` purges unlinked inodes once their grace
//! is over and no mount anywhere holds them open (who must be asked is
//! [`holders_to_ask`], pure).
//!
//! The fences these workers set (`AbandonStripes`, `DisownShards`) last a day of cluster
//! time; a `WriteExtents` naming an abandoned stripe is refused (`StripeAbandoned`: the
//! writer writes its data again to new stripes), so a commit appended but not committed
//! yet, or retried after a long outage, never points at deleted shards. `stripe-gc` asks
//! only reachable holders to delete, and the garbage record goes once every reachable
//! holder freed its shards.
//!
//! `orphan-purge`: after `orphan_grace_s` (10 s) the leader asks each holder, by its node
//! identity, whether a mount holds the inode open; a node gossip does not see alive, one
//! that cannot be reached, or one that started less than 15 s ago (its mounts re-announce
//! open files within 5 s) counts as holding everything. It takes a read barrier first and
//! purges nothing without a layout (simulator seeds 20081 of `gc`, 20215 of `mixed`).
//! Agents key the mounts' handles by the mount's pid from the socket's peer credentials,
//! so the handles of a mount that died are dropped (`fs/handles.rs`).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use shoal_mesh::{GossipHandle, MemberState, MemberView, Transport};
use shoal_namespace::format::Timestamp;
use shoal_namespace::{Command, Outcome, Proposal};
use shoal_placement::{Layout, NodeId, NodeState, StripeId};
use tracing::{debug, info};

use crate::AgentError;
use crate::consensus::{ConsensusError, Group};
use crate::data::Stripes;
use crate::fs::OpenHandles;
use crate::worker::{Step, Ticker, Worker};

/// Stripes freed per unit of work, at most.
const STRIPES_PER_PASS: usize = 256;

fn unexpected(outcome: Outcome) -> AgentError {
    ConsensusError::UnexpectedOutcome(Box::new(outcome)).into()
}

/// The `orphan-shards` worker: deletes this node's shards the metadata does not need
/// here, once that has held for `orphan_shard_grace_s` (the clock starts when this agent
/// first sees it, so a restart only delays collection). Two kinds:
///
/// - Shards of stripes the metadata does not know (never committed: their writer failed
///   or crashed before the commit). Unknown at the read index is not enough: a commit
///   naming the stripe may still be in the log or be retried later. So the stripes are
///   first abandoned through Raft (refused for any the log has committed by then, and
///   fencing the rest against later commits), and only the ones fenced are deleted.
/// - Leftovers: shards of known stripes whose record names another node for that slot (a
///   repair that stored a shard here and never committed it; a slot rebuilt elsewhere
///   while this node was out). They are disowned through Raft (refused for any slot that
///   names this node by then, fencing the rest against a late relocation here: one
///   planned before the fence), and only the disowned ones are deleted; from before the
///   proposal until the deletes, this node refuses puts of those shards (a relocation
///   planned after the fence may store its shard here once the old copy is gone).
///   Shards of a cold stripe (its bytes are in the bucket) are leftovers after a short
///   grace of their own (30 s).
pub struct OrphanShards {
    group: Arc<Group>,
    stripes: Arc<Stripes>,
    unknown_since: HashMap<StripeId, Instant>,
    leftover_since: HashMap<(StripeId, u8), Instant>,
    ticker: Ticker,
}

/// How long a shard of a cold stripe is kept after the stripe went cold.
const COLD_SHARD_GRACE: Duration = Duration::from_secs(30);

/// Most leftovers disowned in one proposal.
const LEFTOVERS_PER_PASS: usize = 1024;

/// What this node holds that the metadata does not need here.
#[derive(Default)]
struct Due {
    unknown: Vec<StripeId>,
    leftovers: Vec<(StripeId, u8)>,
}

impl OrphanShards {
    pub fn new(group: Arc<Group>, stripes: Arc<Stripes>) -> Self {
        let every = Duration::from_secs(group.config.gc_interval_s);
        OrphanShards {
            group,
            stripes,
            unknown_since: HashMap::new(),
            leftover_since: HashMap::new(),
            ticker: Ticker::every(every),
        }
    }

    fn grace(&self) -> Duration {
        Duration::from_secs(self.group.config.orphan_shard_grace_s)
    }

    /// The local shards not needed here for the whole grace (the others' clocks are kept).
    fn due(&mut self, now: Instant) -> Result<Due, AgentError> {
        let grace = self.grace();
        let me = self.stripes.me();
        let mut unknown = HashMap::new();
        let mut leftover = HashMap::new();
        let mut due = Due::default();
        for (stripe, index) in self.stripes.local_shards() {
            match self.group.store().shard_holder(stripe, index)? {
                Some(holder) if holder == me => {}
                // A cold stripe's bytes are in the bucket, committed: a short grace only,
                // for readers whose replica has not applied the commit yet.
                Some(_) if self.group.store().cold_location(stripe)?.is_some() => {
                    let since = self
                        .leftover_since
                        .get(&(stripe, index))
                        .copied()
                        .unwrap_or(now);
                    if now.duration_since(since) < COLD_SHARD_GRACE.min(grace) {
                        leftover.insert((stripe, index), since);
                    } else if due.leftovers.len() < LEFTOVERS_PER_PASS {
                        due.leftovers.push((stripe, index));
                    }
                }
                Some(_) => {
                    let since = self
                        .leftover_since
                        .get(&(stripe, index))
                        .copied()
                        .unwrap_or(now);
                    if now.duration_since(since) < grace {
                        leftover.insert((stripe, index), since);
                    } else if due.leftovers.len() < LEFTOVERS_PER_PASS {
                        due.leftovers.push((stripe, index));
                    }
                }
                None => {
                    let since = self.unknown_since.get(&stripe).copied().unwrap_or(now);
                    if now.duration_since(since) < grace {
                        unknown.insert(stripe, since);
                    } else if !due.unknown.contains(&stripe) {
                        due.unknown.push(stripe);
                    }
                }
            }
        }
        self.unknown_since = unknown;
        self.leftover_since = leftover;
        Ok(due)
    }

    /// Abandons the unknown stripes and deletes the shards of those fenced.
    async fn abandon(&mut self, ids: Vec<StripeId>, now: Instant) -> Result<(), AgentError> {
        let proposal = Proposal {
            id: None,
            now: Timestamp::now(),
            command: Command::AbandonStripes { ids: ids.clone() },
        };
        let fenced = match self.group.propose_one(proposal).await {
            Ok(Outcome::Abandoned(ids)) => ids,
            Ok(other) => return Err(unexpected(other)),
            Err(e) => {
                // Not known whether it applied: the next pass asks again (abandoning is
                // idempotent, and the shards stay until an answer says they may go).
                let due_again = now.checked_sub(self.grace()).unwrap_or(now);
                for id in ids {
                    self.unknown_since.insert(id, due_again);
                }
                return Err(e.into());
            }
        };
        for id in fenced {
            let n = self.stripes.delete_local(id).await?;
            info!(stripe = %id, shards = n, "deleted shards no file references (never committed)");
        }
        Ok(())
    }

    /// Disowns the leftovers and deletes those the metadata let go.
    async fn disown(
        &mut self,
        shards: Vec<(StripeId, u8)>,
        now: Instant,
    ) -> Result<(), AgentError> {
        // From before the proposal until the deletes: a relocation the metadata accepts
        // after the fence must not store its shard here in between (the delete would take
        // it).
        let _refusing = self.stripes.refuse_puts(&shards);
        let proposal = Proposal {
            id: None,
            now: Timestamp::now(),
            command: Command::DisownShards {
                node: self.stripes.me(),
                shards: shards.clone(),
            },
        };
        let disowned = match self.group.propose_one(proposal).await {
            Ok(Outcome::Disowned(d)) => d,
            Ok(other) => return Err(unexpected(other)),
            Err(e) => {
                let due_again = now.checked_sub(self.grace()).unwrap_or(now);
                for s in shards {
                    self.leftover_since.insert(s, due_again);
                }
                return Err(e.into());
            }
        };
        for &(stripe, index) in &disowned {
            self.stripes.delete_local_shard(stripe, index).await?;
        }
        if !disowned.is_empty() {
            info!(
                shards = disowned.len(),
                "deleted copies of shards the stripe records place on other nodes"
            );
        }
        Ok(())
    }
}

impl Worker for OrphanShards {
    type Error = AgentError;

    fn name(&self) -> &'static str {
        "orphan-shards"
    }

    async fn work(&mut self) -> Result<Step, AgentError> {
        if self.stripes.local_stripes().is_empty() {
            self.unknown_since.clear();
            self.leftover_since.clear();
            return Ok(Step::Idle);
        }
        // Judge against everything committed so far, not a lagging replica.
        self.group.barrier().await?;
        let now = Instant::now();
        let due = self.due(now)?;
        if !due.unknown.is_empty() {
            self.abandon(due.unknown, now).await?;
        }
        if !due.leftovers.is_empty() {
            self.disown(due.leftovers, now).await?;
        }
        Ok(Step::Idle)
    }

    async fn wait_for_work(&mut self) {
        self.ticker.tick().await;
    }

    fn progress(&self) -> Option<String> {
        let (unknown, leftovers) = (self.unknown_since.len(), self.leftover_since.len());
        (unknown + leftovers > 0).then(|| {
            format!("{unknown} unknown stripes and {leftovers} leftover shards within their grace")
        })
    }
}

/// The `stripe-gc` worker (acts on the leader): deletes the shards of garbage stripes and
/// records them freed. It walks the garbage with a cursor, so a stripe that cannot be
/// freed now (a reachable holder failing its delete) does not hold up the ones after it;
/// holders that cannot be reached are left to their own orphan sweep.
pub struct StripeGc {
    group: Arc<Group>,
    stripes: Arc<Stripes>,
    after: Option<StripeId>,
    ticker: Ticker,
}

impl StripeGc {
    pub fn new(group: Arc<Group>, stripes: Arc<Stripes>) -> Self {
        let every = Duration::from_secs(group.config.gc_interval_s);
        StripeGc {
            group,
            stripes,
            after: None,
            ticker: Ticker::every(every),
        }
    }
}

impl Worker for StripeGc {
    type Error = AgentError;

    fn name(&self) -> &'static str {
        "stripe-gc"
    }

    async fn work(&mut self) -> Result<Step, AgentError> {
        if !self.group.is_leader() {
            return Ok(Step::Standby);
        }
        let garbage = self.group.store().garbage(self.after, STRIPES_PER_PASS)?;
        // The next pass goes on after this page, or from the start after the last one.
        self.after = if garbage.len() == STRIPES_PER_PASS {
            garbage.last().map(|r| r.id)
        } else {
            None
        };
        if garbage.is_empty() {
            return Ok(Step::Idle);
        }
        let mut freed = Vec::new();
        for record in &garbage {
            match self.stripes.delete(record).await {
                Ok(()) => freed.push(record.id),
                Err(e) => debug!(stripe = %record.id, error = %e, "stripe not freed yet"),
            }
        }
        let more = if self.after.is_some() {
            Step::Busy
        } else {
            Step::Idle
        };
        if freed.is_empty() {
            return Ok(more);
        }
        let n = freed.len();
        let proposal = Proposal {
            id: None,
            now: Timestamp::now(),
            command: Command::StripesFreed { ids: freed },
        };
        self.group.propose_one(proposal).await?;
        info!(stripes = n, "freed unreferenced stripes");
        Ok(more)
    }

    async fn wait_for_work(&mut self) {
        self.ticker.tick().await;
    }
}

/// The `orphan-purge` worker (acts on the leader): purges unlinked inodes past their grace
/// that no mount holds open.
pub struct OrphanPurge {
    group: Arc<Group>,
    gossip: GossipHandle,
    transport: Arc<Transport>,
    handles: Arc<OpenHandles>,
    ticker: Ticker,
}

impl OrphanPurge {
    pub fn new(
        group: Arc<Group>,
        gossip: GossipHandle,
        transport: Arc<Transport>,
        handles: Arc<OpenHandles>,
    ) -> Self {
        let every = Duration::from_secs(group.config.gc_interval_s);
        OrphanPurge {
            group,
            gossip,
            transport,
            handles,
            ticker: Ticker::every(every),
        }
    }
}

impl Worker for OrphanPurge {
    type Error = AgentError;

    fn name(&self) -> &'static str {
        "orphan-purge"
    }

    async fn work(&mut self) -> Result<Step, AgentError> {
        if !self.group.is_leader() {
            return Ok(Step::Standby);
        }
        let cutoff = Timestamp::now().secs - self.group.config.orphan_grace_s as i64;
        let due: Vec<u64> = self
            .group
            .store()
            .orphans()?
            .into_iter()
            .filter(|(_, at)| at.secs <= cutoff)
            .map(|(ino, _)| ino)
            .collect();
        if due.is_empty() {
            return Ok(Step::Idle);
        }
        // Judge against everything committed, not a replica that lags (a leader cut off
        // before the first layout reached it asked nobody and purged a file a mount held
        // open: the simulator, seed 20081 of `gc`); and never without a layout, which
        // names the nodes whose mounts may hold the file.
        self.group.barrier().await?;
        let members = self.gossip.members().await?;
        let Some(layout) = self.group.store().cluster_layout()? else {
            return Ok(Step::Idle);
        };
        let peers = match holders_to_ask(Some(&layout), &members) {
            Ok(peers) => peers,
            Err(node) => {
                debug!(%node, inodes = due.len(), "not purging unlinked inodes: a node that may hold them open cannot be asked");
                return Ok(Step::Idle);
            }
        };
        let held = self
            .handles
            .held_anywhere(&self.transport, &due, &peers)
            .await;
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
            return Ok(Step::Idle);
        }
        let n = proposals.len();
        debug!(?due, ?held, peers = ?peers.iter().map(|p| p.0).collect::<Vec<_>>(), layout = ?layout.nodes().iter().map(|n| (n.id, n.state)).collect::<Vec<_>>(), epoch = layout.epoch(), "purging the unlinked inodes not held open");
        self.group.propose(proposals).await?;
        info!(inodes = n, "purged unlinked inodes");
        Ok(Step::Idle)
    }

    async fn wait_for_work(&mut self) {
        self.ticker.tick().await;
    }
}

/// Which agents must say whether a mount holds an orphan open before it is purged: every
/// node of the layout that is not `out`, and every live member not in the layout yet; each
/// with its address, asked only of the node it belongs to (the address gossip has may be
/// another node's by now).
/// `Err(node)` when one of them cannot be asked (not alive, or no address known): a node
/// cut off by a partition still serves its open files, so it counts as holding
/// everything until it is `out` or back (a restarted agent counts as holding everything
/// until its mounts have re-announced their handles).
fn holders_to_ask(
    layout: Option<&Layout>,
    members: &[MemberView],
) -> Result<Vec<(NodeId, SocketAddr)>, NodeId> {
    let reachable = |id: NodeId| {
        members
            .iter()
            .find(|m| m.id.node == id && !m.is_self)
            .filter(|m| m.state == MemberState::Alive)
            .and_then(|m| m.facts.as_ref().map(|f| (id, f.rpc_addr)))
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
            addrs.push((m.id.node, f.rpc_addr));
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
                repair_bytes_per_sec: 0,
                store_opening: false,
                meta_failed: false,
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
        assert_eq!(
            asked,
            vec![(NodeId(2), "127.0.0.2:7947".parse().expect("addr"))]
        );
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
            Ok(vec![(NodeId(2), "127.0.0.2:7947".parse().expect("addr"))])
        );
        assert_eq!(holders_to_ask(None, &members).map(|a| a.len()), Ok(1));
    }
}
