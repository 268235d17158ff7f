//! Who can take new shards and how to reach every node: the committed layout, with the
//! nodes that cannot take shards right now marked down for placement (reads still reach
//! them), and the nodes' addresses from gossip.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use shoal_mesh::{MemberState, MemberView};
use shoal_placement::{Layout, LayoutNode, NodeId, NodeState};

use super::MIN_ROOM;
use super::error::StripeError;

/// How to reach a node: QUIC for control, the bulk lane (when it runs one) for payloads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Addrs {
    pub rpc: SocketAddr,
    pub bulk: Option<SocketAddr>,
}

/// Who can hold shards now, and how to reach them.
pub(crate) struct Peers {
    pub layout: Layout,
    pub addrs: HashMap<NodeId, Addrs>,
    /// The last addresses of nodes left out of `addrs` (gossip says suspect or down, or a
    /// shard write just failed on them): asked only when a read has no other way.
    pub last_known: HashMap<NodeId, Addrs>,
    pub names: HashMap<NodeId, String>,
    /// Live nodes left out of placement for want of room (facts or a recent answer).
    pub full: Vec<NodeId>,
    /// Live nodes left out because a shard write just failed on them.
    pub suspects: Vec<NodeId>,
    /// Live nodes whose store is still opening (they take shards in a moment).
    pub opening: Vec<NodeId>,
    /// Active nodes of the committed layout gossip has not heard of at all yet (this
    /// agent just started): not known to be down.
    pub unknown: Vec<NodeId>,
}

impl Peers {
    /// The names of `nodes`, for a message.
    pub fn names_of(&self, nodes: &[NodeId]) -> String {
        let mut names: Vec<String> = nodes
            .iter()
            .map(|n| self.names.get(n).cloned().unwrap_or_else(|| n.to_string()))
            .collect();
        names.sort();
        names.dedup();
        names.join(", ")
    }

    /// How to reach `node` now: while gossip counts it alive and no write just failed on it.
    pub fn reach(&self, node: NodeId) -> Option<Addrs> {
        self.addrs.get(&node).copied()
    }

    pub fn name(&self, node: NodeId) -> String {
        self.names.get(&node).cloned().unwrap_or_default()
    }
}

/// Nodes marked by recent answers (write failures, "full"), each for a while.
#[derive(Default)]
pub(crate) struct Marks(Mutex<HashMap<NodeId, Instant>>);

impl Marks {
    pub fn mark(&self, node: NodeId) {
        self.lock().insert(node, Instant::now());
    }

    /// The nodes marked within the last `window` (older marks are dropped).
    pub fn recent(&self, window: Duration) -> Vec<NodeId> {
        let mut m = self.lock();
        m.retain(|_, at| at.elapsed() < window);
        m.keys().copied().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<NodeId, Instant>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Builds the placement view (pure): `committed` is the layout in the metadata (None
/// before the group has one: then gossip's alive members, epoch 0), `members` gossip's
/// view, `suspects` nodes a shard write just failed on (unreachable for now), `full` nodes
/// that just answered "full".
pub(crate) fn peers(
    committed: Option<&Layout>,
    members: Vec<MemberView>,
    suspects: &[NodeId],
    mut full: Vec<NodeId>,
) -> Result<Peers, StripeError> {
    let mut gossip_nodes = Vec::new();
    let mut addrs = HashMap::new();
    let mut names = HashMap::new();
    let mut refusing = Vec::new();
    let mut opening = Vec::new();
    let mut last_known = HashMap::new();
    // A layout node may take shards in a moment while gossip's newest word on it is
    // nothing, "suspect", or "alive" without its facts yet (this agent just started, or
    // it just came back), or "alive" while the layout still says down (the steward has
    // not caught up).
    let coming = |n: &LayoutNode| {
        let newest = members
            .iter()
            .filter(|m| m.id.node == n.id)
            .max_by_key(|m| m.id.generation);
        match (n.state, newest) {
            (NodeState::Active, None) => true,
            (NodeState::Active | NodeState::Down, Some(m)) => match m.state {
                MemberState::Suspect => n.state == NodeState::Active,
                MemberState::Alive => m.facts.is_none() || n.state == NodeState::Down,
                _ => false,
            },
            _ => false,
        }
    };
    let unknown: Vec<NodeId> = committed
        .map(|l| {
            l.nodes()
                .iter()
                .filter(|n| coming(n))
                .map(|n| n.id)
                .collect()
        })
        .unwrap_or_default();
    for m in members {
        let Some(f) = m.facts else { continue };
        let id = m.id.node;
        let reach = Addrs {
            rpc: f.rpc_addr,
            bulk: f.bulk_addr,
        };
        if m.state != MemberState::Alive {
            last_known.insert(id, reach);
            continue;
        }
        if f.store_opening {
            opening.push(id);
        } else if !f.store_accepting {
            if f.store_room_bytes < MIN_ROOM {
                full.push(id);
            } else {
                refusing.push(id);
            }
        }
        gossip_nodes.push(LayoutNode::active(
            id,
            f.failure_domain.as_str(),
            f.capacity_bytes.max(1),
        ));
        addrs.insert(id, reach);
        names.insert(id, f.name);
    }
    // Several generations of a node may be listed: the alive one wins.
    last_known.retain(|id, _| !addrs.contains_key(id));
    let suspects: Vec<NodeId> = suspects
        .iter()
        .copied()
        .filter(|n| match addrs.remove(n) {
            Some(a) => {
                last_known.insert(*n, a);
                true
            }
            None => false,
        })
        .collect();
    full.retain(|id| addrs.contains_key(id));
    full.sort_unstable();
    full.dedup();
    let takes_shards = |id: &NodeId| {
        addrs.contains_key(id)
            && !refusing.contains(id)
            && !full.contains(id)
            && !opening.contains(id)
    };
    gossip_nodes.retain(|n| takes_shards(&n.id));
    let layout = match committed {
        Some(l) => {
            let nodes = l
                .nodes()
                .iter()
                .map(|n| {
                    let mut n = n.clone();
                    if !takes_shards(&n.id) && n.state == NodeState::Active {
                        n.state = NodeState::Down;
                    }
                    n
                })
                .collect();
            Layout::new(l.epoch(), nodes)
        }
        None => Layout::new(0, gossip_nodes),
    }
    .map_err(StripeError::Placement)?;
    Ok(Peers {
        layout,
        addrs,
        last_known,
        names,
        full,
        suspects,
        opening,
        unknown,
    })
}

#[cfg(test)]
mod tests {
    use shoal_mesh::{MemberId, NodeFacts, NodeRole};

    use super::*;

    fn member(id: u64, accepting: bool, room: u64) -> MemberView {
        let addr: SocketAddr = format!("127.0.0.{id}:7947").parse().expect("addr");
        MemberView {
            id: MemberId {
                node: NodeId(id),
                addr,
                generation: 1,
            },
            state: MemberState::Alive,
            incarnation: 0,
            last_heard: None,
            is_self: false,
            facts: Some(NodeFacts {
                node: NodeId(id),
                generation: 1,
                seq: 0,
                name: format!("n{id}"),
                failure_domain: format!("fd{id}"),
                rpc_addr: addr,
                bulk_addr: None,
                capacity_bytes: 100 << 30,
                used_bytes: 0,
                role: NodeRole::Active,
                agent_version: String::new(),
                store_accepting: accepting,
                store_room_bytes: room,
                repair_bytes_per_sec: 0,
                store_opening: false,
                meta_failed: false,
            }),
        }
    }

    fn layout(ids: &[u64]) -> Layout {
        let nodes = ids
            .iter()
            .map(|&i| LayoutNode::active(NodeId(i), format!("fd{i}").as_str(), 1))
            .collect();
        Layout::new(3, nodes).expect("layout")
    }

    fn states(p: &Peers) -> Vec<(u64, NodeState)> {
        p.layout.nodes().iter().map(|n| (n.id.0, n.state)).collect()
    }

    #[test]
    fn nodes_that_take_no_shards_are_down_for_placement_but_reachable() {
        let members = vec![
            member(1, true, 1 << 30),
            member(2, false, 0),
            member(3, false, 1 << 30),
            member(4, true, 1 << 30),
        ];
        let p = peers(
            Some(&layout(&[1, 2, 3, 4, 5])),
            members,
            &[NodeId(4)],
            vec![],
        )
        .expect("peers");
        assert_eq!(
            states(&p),
            [
                (1, NodeState::Active),
                (2, NodeState::Down),
                (3, NodeState::Down),
                (4, NodeState::Down),
                (5, NodeState::Down),
            ],
            "full, failing store, suspect, not alive"
        );
        assert_eq!(p.full, [NodeId(2)], "only the one without room is full");
        assert!(
            p.addrs.contains_key(&NodeId(2)),
            "a full node still serves reads"
        );
        assert!(
            !p.addrs.contains_key(&NodeId(4)),
            "a suspect is not reached"
        );
    }

    #[test]
    fn nodes_not_reached_keep_their_last_address_for_a_last_resort_read() {
        let mut down = member(2, true, 1 << 30);
        down.state = MemberState::Down;
        let mut old_generation = member(3, true, 1 << 30);
        old_generation.state = MemberState::Down;
        let members = vec![
            member(1, true, 1 << 30),
            down,
            old_generation,
            member(3, true, 1 << 30),
            member(4, true, 1 << 30),
        ];
        let p = peers(Some(&layout(&[1, 2, 3, 4])), members, &[NodeId(4)], vec![]).expect("peers");
        let addr = |id: u64| Some(member(id, true, 0).facts.expect("facts").rpc_addr);
        assert_eq!(p.reach(NodeId(2)), None, "down for gossip");
        assert_eq!(p.last_known.get(&NodeId(2)).map(|a| a.rpc), addr(2));
        assert_eq!(p.reach(NodeId(4)), None, "a shard write just failed on it");
        assert_eq!(p.last_known.get(&NodeId(4)).map(|a| a.rpc), addr(4));
        assert_eq!(p.reach(NodeId(3)).map(|a| a.rpc), addr(3), "alive again");
        assert!(!p.last_known.contains_key(&NodeId(3)));
        assert!(!p.last_known.contains_key(&NodeId(1)));
    }

    #[test]
    fn a_node_whose_store_is_opening_takes_no_shards_and_is_not_full() {
        let mut opening = member(2, false, 0);
        if let Some(f) = opening.facts.as_mut() {
            f.store_opening = true;
        }
        let members = vec![member(1, true, 1 << 30), opening];
        let p = peers(Some(&layout(&[1, 2])), members, &[], vec![]).expect("peers");
        assert_eq!(states(&p)[1], (2, NodeState::Down));
        assert!(p.full.is_empty(), "not full: it has not said yet");
        assert_eq!(p.opening, [NodeId(2)]);
    }

    #[test]
    fn layout_nodes_gossip_has_not_heard_of_yet_are_unknown_not_down() {
        let mut down = member(2, true, 1 << 30);
        down.state = MemberState::Down;
        let mut no_facts = member(4, true, 1 << 30);
        no_facts.facts = None;
        let mut suspect = member(5, true, 1 << 30);
        suspect.state = MemberState::Suspect;
        let members = vec![
            member(1, true, 1 << 30),
            down,
            no_facts,
            suspect,
            member(6, true, 1 << 30),
        ];
        let mut l = layout(&[1, 2, 3, 4, 5, 6]).nodes().to_vec();
        l[5].state = NodeState::Down;
        let l = Layout::new(4, l).expect("layout");
        let p = peers(Some(&l), members, &[], vec![]).expect("peers");
        assert_eq!(
            p.unknown,
            [NodeId(3), NodeId(4), NodeId(5), NodeId(6)],
            "2 is known to be down; 3 not heard of, 4 without facts, 5 suspect, 6 back before the layout says so"
        );
    }

    #[test]
    fn a_node_that_answered_full_is_full_for_a_while() {
        let members = vec![member(1, true, 1 << 30), member(2, true, 1 << 30)];
        let p = peers(Some(&layout(&[1, 2])), members, &[], vec![NodeId(2)]).expect("peers");
        assert_eq!(states(&p)[1], (2, NodeState::Down));
        assert_eq!(p.full, [NodeId(2)]);
        let marks = Marks::default();
        marks.mark(NodeId(7));
        assert_eq!(marks.recent(Duration::from_secs(10)), [NodeId(7)]);
        assert!(marks.recent(Duration::ZERO).is_empty());
    }

    #[test]
    fn before_a_committed_layout_gossip_decides() {
        let members = vec![member(1, true, 1 << 30), member(2, false, 0)];
        let p = peers(None, members, &[], vec![]).expect("peers");
        assert_eq!(p.layout.epoch(), 0);
        assert_eq!(states(&p), [(1, NodeState::Active)]);
    }
}
