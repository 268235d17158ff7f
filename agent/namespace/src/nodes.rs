//! Operator changes to a node of the layout: drain, undrain, drained, maintenance
//! windows, removal. Which change a node's state allows is decided here, on every replica
//! alike, so an operator and the leader's steward (or two operators) cannot race a node
//! into a state it may not reach. What the operator asked besides the state (when a drain
//! started and what the node held then, when a window ends) is kept per node in
//! [`NodeAdmin`] records beside the layout.
//!
//! Each change is a new layout epoch, so the steward's own `SetLayout` built on the epoch
//! before is refused and its next round starts from the new one. The state machine does
//! not check that a drain can finish (the agent's assessment does, `agent/src/drain.rs`):
//! two operators draining two nodes through two agents at the same moment can race past
//! it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use shoal_placement::{Layout, NodeId, NodeState};

use crate::tx::Tx;
use crate::{NamespaceError, Outcome};

/// What an operator asked of one node (the layout holds its state).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeAdmin {
    /// Set by a drain: when it started and what the node held then.
    pub drain: Option<DrainStart>,
    /// The end of its maintenance window (cluster clock, ms), set on entry.
    pub maintenance_until_ms: Option<u64>,
}

/// When a drain started (cluster clock, ms) and the stripes and bytes of shards the node
/// held then: a drain's progress is measured against these.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainStart {
    pub started_ms: u64,
    pub stripes: u64,
    pub bytes: u64,
}

/// Every node's [`NodeAdmin`], by node id.
pub type NodeAdmins = BTreeMap<u64, NodeAdmin>;

/// An operator change to one node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeChange {
    /// `active` or `maintenance` → `draining`, recording what the node holds now.
    Drain { stripes: u64, bytes: u64 },
    /// `draining` or `drained` → `active`.
    Undrain,
    /// `draining` → `drained`; refused while a live stripe names the node.
    Drained,
    /// `active`, `down` or `maintenance` → `maintenance` for `for_ms` from now.
    EnterMaintenance { for_ms: u64 },
    /// `maintenance` → `active` (the steward marks it down if gossip does not see it).
    ExitMaintenance,
    /// `drained` or `out` → gone from the layout; a drained node only while no live stripe
    /// names it.
    Remove,
}

/// The state `change` takes a node in state `from` to (`None`: removed from the layout),
/// or why it may not.
pub fn transition(from: NodeState, change: NodeChange) -> Result<Option<NodeState>, String> {
    use NodeState::*;
    let refuse = |what: &str| Err(format!("{what} (the node is {})", state_name(from)));
    match (change, from) {
        (NodeChange::Drain { .. }, Active | Maintenance) => Ok(Some(Draining)),
        (NodeChange::Drain { .. }, Down) => refuse(
            "a node that is down cannot be drained (its shards cannot be read); wait until it is back, or until it is out and rebuilt",
        ),
        (NodeChange::Drain { .. }, _) => refuse("only an active node can be drained"),
        (NodeChange::Undrain, Draining | Drained) => Ok(Some(Active)),
        (NodeChange::Undrain, _) => refuse("only a draining or drained node can be undrained"),
        (NodeChange::Drained, Draining) => Ok(Some(Drained)),
        (NodeChange::Drained, _) => refuse("only a draining node becomes drained"),
        (NodeChange::EnterMaintenance { .. }, Active | Down | Maintenance) => Ok(Some(Maintenance)),
        (NodeChange::EnterMaintenance { .. }, _) => {
            refuse("only an active or down node can enter maintenance")
        }
        (NodeChange::ExitMaintenance, Maintenance) => Ok(Some(Active)),
        (NodeChange::ExitMaintenance, _) => refuse("the node is not in maintenance"),
        (NodeChange::Remove, Drained | Out) => Ok(None),
        (NodeChange::Remove, _) => {
            refuse("only a drained or out node can be removed: drain it first")
        }
    }
}

/// A state as status shows it.
pub fn state_name(state: NodeState) -> &'static str {
    match state {
        NodeState::Active => "active",
        NodeState::Draining => "draining",
        NodeState::Drained => "drained",
        NodeState::Down => "down",
        NodeState::Out => "out",
        NodeState::Maintenance => "maintenance",
    }
}

/// Applies `change` to `node`: a new layout epoch and the node's admin record, or
/// [`Outcome::Refused`] with the reason (nothing changed).
pub(crate) fn change_node(
    tx: &mut Tx<'_>,
    node: NodeId,
    change: NodeChange,
) -> Result<Outcome, NamespaceError> {
    let Some(layout) = tx.layout()? else {
        return Ok(Outcome::Refused("the cluster has no layout yet".into()));
    };
    let Some(current) = layout.node(node) else {
        return Ok(Outcome::Refused(format!(
            "node {node} is not in the layout"
        )));
    };
    let to = match transition(current.state, change) {
        Ok(to) => to,
        Err(why) => return Ok(Outcome::Refused(why)),
    };
    let needs_empty = matches!(change, NodeChange::Drained)
        || (change == NodeChange::Remove && current.state == NodeState::Drained);
    if needs_empty {
        let (stripes, _) = tx.stripes_naming(node)?;
        if stripes > 0 {
            return Ok(Outcome::Refused(format!(
                "{stripes} live stripe(s) still have a shard on node {node}"
            )));
        }
    }
    let nodes = layout
        .nodes()
        .iter()
        .filter(|n| n.id != node || to.is_some())
        .map(|n| {
            let mut n = n.clone();
            if n.id == node
                && let Some(state) = to
            {
                n.state = state;
            }
            n
        })
        .collect();
    let next = Layout::new(layout.epoch() + 1, nodes)
        .map_err(|e| NamespaceError::Corrupt(format!("layout: {e}")))?;
    tx.set_layout(&next)?;
    let now = tx.clock_ms();
    let mut admins = tx.node_admins()?;
    let admin = admins.entry(node.0).or_default();
    match change {
        NodeChange::Drain { stripes, bytes } => {
            admin.drain = Some(DrainStart {
                started_ms: now,
                stripes,
                bytes,
            });
            admin.maintenance_until_ms = None;
        }
        NodeChange::Undrain => admin.drain = None,
        NodeChange::Drained => {}
        NodeChange::EnterMaintenance { for_ms } => {
            admin.maintenance_until_ms = Some(now.saturating_add(for_ms));
        }
        NodeChange::ExitMaintenance => admin.maintenance_until_ms = None,
        NodeChange::Remove => {
            admins.remove(&node.0);
        }
    }
    admins.retain(|_, a| *a != NodeAdmin::default());
    tx.set_node_admins(&admins)?;
    Ok(Outcome::Done)
}

#[cfg(test)]
mod tests {
    use shoal_placement::{LayoutNode, NodeState};

    use super::*;
    use crate::Command;
    use crate::testkit::Kit;

    fn state(kit: &Kit, id: u64) -> Option<NodeState> {
        let layout = kit.store.cluster_layout().expect("layout").expect("some");
        layout.node(NodeId(id)).map(|n| n.state)
    }

    fn change(kit: &mut Kit, id: u64, change: NodeChange) -> Outcome {
        kit.run(Command::ChangeNode {
            node: NodeId(id),
            change,
        })
    }

    fn kit_with_nodes() -> Kit {
        let mut kit = Kit::new();
        let nodes = (1..=3)
            .map(|i| LayoutNode::active(NodeId(i), format!("fd{i}").as_str(), 1))
            .collect();
        kit.run(Command::SetLayout {
            layout: Layout::new(1, nodes).expect("layout"),
        });
        kit
    }

    #[test]
    fn a_drain_goes_draining_then_drained_then_removed() {
        let mut kit = kit_with_nodes();
        let drain = NodeChange::Drain {
            stripes: 4,
            bytes: 400,
        };
        assert_eq!(change(&mut kit, 2, drain), Outcome::Done);
        assert_eq!(state(&kit, 2), Some(NodeState::Draining));
        let admin = kit.store.node_admins().expect("admins");
        let start = admin[&2].drain.expect("drain recorded");
        assert_eq!((start.stripes, start.bytes), (4, 400));
        assert!(matches!(change(&mut kit, 2, drain), Outcome::Refused(_)));
        assert_eq!(change(&mut kit, 2, NodeChange::Drained), Outcome::Done);
        assert_eq!(change(&mut kit, 2, NodeChange::Remove), Outcome::Done);
        assert_eq!(state(&kit, 2), None);
        assert!(kit.store.node_admins().expect("admins").is_empty());
        let layout = kit.store.cluster_layout().expect("layout").expect("some");
        assert_eq!(layout.epoch(), 4, "every change is a new epoch");
    }

    #[test]
    fn refusals_name_the_state_and_change_nothing() {
        let mut kit = kit_with_nodes();
        let Outcome::Refused(why) = change(&mut kit, 1, NodeChange::Remove) else {
            panic!("an active node cannot be removed");
        };
        assert!(why.contains("(the node is active)"), "{why}");
        assert!(matches!(
            change(&mut kit, 1, NodeChange::Undrain),
            Outcome::Refused(_)
        ));
        assert!(matches!(
            change(&mut kit, 9, NodeChange::Undrain),
            Outcome::Refused(_)
        ));
        let layout = kit.store.cluster_layout().expect("layout").expect("some");
        assert_eq!(layout.epoch(), 1);
    }

    #[test]
    fn undrain_returns_a_draining_node_to_active_and_forgets_the_drain() {
        let mut kit = kit_with_nodes();
        change(
            &mut kit,
            3,
            NodeChange::Drain {
                stripes: 1,
                bytes: 1,
            },
        );
        assert_eq!(change(&mut kit, 3, NodeChange::Undrain), Outcome::Done);
        assert_eq!(state(&kit, 3), Some(NodeState::Active));
        assert!(kit.store.node_admins().expect("admins").is_empty());
    }

    #[test]
    fn a_maintenance_window_ends_on_the_cluster_clock() {
        let mut kit = kit_with_nodes();
        let enter = NodeChange::EnterMaintenance { for_ms: 60_000 };
        assert_eq!(change(&mut kit, 1, enter), Outcome::Done);
        assert_eq!(state(&kit, 1), Some(NodeState::Maintenance));
        let now = kit.store.clock_ms().expect("clock");
        let until = kit.store.node_admins().expect("admins")[&1].maintenance_until_ms;
        assert_eq!(until, Some(now + 60_000));
        assert_eq!(
            change(&mut kit, 1, NodeChange::ExitMaintenance),
            Outcome::Done
        );
        assert_eq!(state(&kit, 1), Some(NodeState::Active));
        assert!(matches!(
            change(&mut kit, 1, NodeChange::ExitMaintenance),
            Outcome::Refused(_)
        ));
    }

    #[test]
    fn every_change_from_every_state_is_decided() {
        use NodeState::*;
        let changes = [
            NodeChange::Drain {
                stripes: 0,
                bytes: 0,
            },
            NodeChange::Undrain,
            NodeChange::Drained,
            NodeChange::EnterMaintenance { for_ms: 1 },
            NodeChange::ExitMaintenance,
            NodeChange::Remove,
        ];
        let allowed: Vec<(usize, NodeState)> = changes
            .iter()
            .enumerate()
            .flat_map(|(i, c)| {
                [Active, Draining, Drained, Down, Out, Maintenance]
                    .into_iter()
                    .filter(move |s| transition(*s, *c).is_ok())
                    .map(move |s| (i, s))
            })
            .collect();
        assert_eq!(
            allowed,
            [
                (0, Active),
                (0, Maintenance),
                (1, Draining),
                (1, Drained),
                (2, Draining),
                (3, Active),
                (3, Down),
                (3, Maintenance),
                (4, Maintenance),
                (5, Drained),
                (5, Out),
            ]
        );
    }
}
