use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::PlacementError;
use crate::rendezvous::PlacementIndex;
use shoal_ids::NodeId;

/// Where a node can fail together with others (rack, power feed, switch). Shards of one
/// stripe go to different failure domains whenever the layout has enough of them.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct FailureDomain(pub String);

impl fmt::Display for FailureDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for FailureDomain {
    fn from(s: &str) -> Self {
        FailureDomain(s.to_owned())
    }
}

/// What a node in the layout is for. Only `Active` nodes receive new shards; the others
/// keep what they hold until the reconciler moves it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum NodeState {
    /// Serving and receiving new shards.
    Active,
    /// Being emptied on purpose; still serves what it holds.
    Draining,
    /// Emptied; holds nothing the cluster needs.
    Drained,
    /// Not reachable; its shards count as missing until it returns.
    Down,
    /// Removed from the cluster for good.
    Out,
    /// In a maintenance window set by an operator: it may go down (a reboot) without
    /// becoming `Out` until the window ends; takes no new shards meanwhile.
    Maintenance,
}

impl NodeState {
    /// True for the one state that receives new shards.
    pub fn receives_new_shards(self) -> bool {
        self == NodeState::Active
    }
}

/// One node as the layout sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayoutNode {
    pub id: NodeId,
    pub failure_domain: FailureDomain,
    /// Relative share of new shards, e.g. capacity in bytes. Zero means none.
    pub weight: u64,
    pub state: NodeState,
}

impl LayoutNode {
    /// An `Active` node.
    pub fn active(id: NodeId, failure_domain: impl Into<FailureDomain>, weight: u64) -> Self {
        LayoutNode {
            id,
            failure_domain: failure_domain.into(),
            weight,
            state: NodeState::Active,
        }
    }

    /// True when placement may put new shards here: `Active` with a non-zero weight.
    pub fn is_eligible(&self) -> bool {
        self.state.receives_new_shards() && self.weight > 0
    }
}

/// The cluster layout at one epoch: every known node, sorted by id, each id once.
///
/// Built only through [`Layout::new`] (deserializing runs the same checks), so a `Layout`
/// value always holds distinct ids. Two layouts with the same nodes in any input order
/// are equal and serialize identically.
#[derive(Clone, Serialize, Deserialize)]
#[serde(try_from = "LayoutParts")]
pub struct Layout {
    epoch: u64,
    nodes: Vec<LayoutNode>,
    /// Derived from `nodes`; not part of the value.
    #[serde(skip)]
    index: PlacementIndex,
}

impl PartialEq for Layout {
    fn eq(&self, other: &Self) -> bool {
        self.epoch == other.epoch && self.nodes == other.nodes
    }
}

impl Eq for Layout {}

impl fmt::Debug for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Layout")
            .field("epoch", &self.epoch)
            .field("nodes", &self.nodes)
            .finish()
    }
}

/// The unchecked wire shape of a [`Layout`].
#[derive(Deserialize)]
struct LayoutParts {
    epoch: u64,
    nodes: Vec<LayoutNode>,
}

impl TryFrom<LayoutParts> for Layout {
    type Error = PlacementError;
    fn try_from(parts: LayoutParts) -> Result<Self, Self::Error> {
        Layout::new(parts.epoch, parts.nodes)
    }
}

impl Layout {
    /// Checks and sorts the nodes; refuses a node id that appears twice.
    pub fn new(epoch: u64, mut nodes: Vec<LayoutNode>) -> Result<Self, PlacementError> {
        nodes.sort_by_key(|n| n.id);
        if let Some(pair) = nodes.windows(2).find(|w| w[0].id == w[1].id) {
            return Err(PlacementError::DuplicateNode(pair[0].id));
        }
        let index = PlacementIndex::build(&nodes);
        Ok(Layout {
            epoch,
            nodes,
            index,
        })
    }

    /// This layout with `node` in `state`, as epoch `epoch` (the same one for a layout
    /// only planned with, never committed).
    pub fn with_state(
        &self,
        node: NodeId,
        state: NodeState,
        epoch: u64,
    ) -> Result<Layout, PlacementError> {
        let nodes = self
            .nodes
            .iter()
            .map(|n| LayoutNode {
                state: if n.id == node { state } else { n.state },
                ..n.clone()
            })
            .collect();
        Layout::new(epoch, nodes)
    }

    /// The layout's epoch; every placement is made under one epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// All nodes, sorted by id.
    pub fn nodes(&self) -> &[LayoutNode] {
        &self.nodes
    }

    /// The node with this id, if the layout has it.
    pub fn node(&self, id: NodeId) -> Option<&LayoutNode> {
        self.nodes
            .binary_search_by_key(&id, |n| n.id)
            .ok()
            .map(|i| &self.nodes[i])
    }

    pub(crate) fn placement_index(&self) -> &PlacementIndex {
        &self.index
    }

    /// Nodes that may receive new shards (`Active`, non-zero weight), sorted by id.
    pub fn eligible_nodes(&self) -> impl Iterator<Item = &LayoutNode> {
        self.nodes.iter().filter(|n| n.is_eligible())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: u64, domain: &str) -> LayoutNode {
        LayoutNode::active(NodeId(id), domain, 100)
    }

    #[test]
    fn layout_refuses_a_duplicate_node_id() {
        let err = Layout::new(1, vec![node(3, "a"), node(1, "b"), node(3, "c")]);
        assert_eq!(err, Err(PlacementError::DuplicateNode(NodeId(3))));
        assert!(
            err.err()
                .is_some_and(|e| e.to_string().contains("0000000000000003"))
        );
    }

    #[test]
    fn layout_sorts_nodes_so_input_order_does_not_matter() -> Result<(), PlacementError> {
        let a = Layout::new(5, vec![node(2, "a"), node(1, "b")])?;
        let b = Layout::new(5, vec![node(1, "b"), node(2, "a")])?;
        assert_eq!(a, b);
        assert_eq!(a.nodes()[0].id, NodeId(1));
        assert_eq!(
            a.node(NodeId(2)).map(|n| n.failure_domain.0.as_str()),
            Some("a")
        );
        assert!(a.node(NodeId(9)).is_none());
        Ok(())
    }

    #[test]
    fn only_active_nodes_with_weight_are_eligible() -> Result<(), PlacementError> {
        let mut draining = node(2, "a");
        draining.state = NodeState::Draining;
        let empty = LayoutNode::active(NodeId(3), "a", 0);
        let layout = Layout::new(1, vec![node(1, "a"), draining, empty])?;
        let ids: Vec<_> = layout.eligible_nodes().map(|n| n.id).collect();
        assert_eq!(ids, vec![NodeId(1)]);
        Ok(())
    }

    #[test]
    fn deserializing_a_layout_runs_the_same_checks() -> Result<(), serde_json::Error> {
        let layout =
            Layout::new(7, vec![node(2, "a"), node(1, "b")]).map_err(serde::de::Error::custom)?;
        let json = serde_json::to_string(&layout)?;
        assert_eq!(serde_json::from_str::<Layout>(&json)?, layout);

        let dup = r#"{"epoch":1,"nodes":[
            {"id":1,"failure_domain":"a","weight":1,"state":"Active"},
            {"id":1,"failure_domain":"b","weight":1,"state":"Down"}]}"#;
        let err = serde_json::from_str::<Layout>(dup)
            .err()
            .map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.contains("more than once")));
        Ok(())
    }
}
