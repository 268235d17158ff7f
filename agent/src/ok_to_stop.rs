//! `shoal ok-to-stop NODE`: whether stopping a node now keeps every stripe it holds an
//! available shard of at k+1 available shards or more (one more loss would still leave it
//! readable) and the metadata voters at a quorum. The assessment ([`StripeRisk`],
//! [`verdict`]) is pure; [`assess`] feeds it the local replica's stripes and layout and
//! gossip's live set. Stripes the node holds nothing available of are not made worse by
//! the stop and do not count against it.

use std::collections::BTreeSet;

use shoal_agent_api::{OkToStop, StripeRecord};
use shoal_placement::{Layout, NodeId};

use crate::workers::repair::plan::Health;
use crate::{AgentError, Node};

/// Stripes read from the replica per page.
const PAGE: usize = 1024;

/// How the stripes would stand with the node stopped.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StripeRisk {
    pub total: u64,
    pub on_node: u64,
    pub at_k: u64,
    pub unreadable: u64,
    pub domains: BTreeSet<String>,
}

impl StripeRisk {
    /// Adds one stripe. `alive` is gossip's live set now, `after` the same without `node`.
    pub fn add(
        &mut self,
        record: &StripeRecord,
        layout: &Layout,
        alive: &BTreeSet<NodeId>,
        after: &BTreeSet<NodeId>,
        node: NodeId,
    ) {
        self.total += 1;
        if !record.shards.iter().any(|s| s.node == node) {
            return;
        }
        let now = Health::of(record, layout, alive);
        let then = Health::of(record, layout, after);
        if now.available.len() == then.available.len() {
            return;
        }
        self.on_node += 1;
        let k = usize::from(record.ec.k);
        match then.available.len() {
            n if n > k => return,
            n if n == k => self.at_k += 1,
            _ => self.unreadable += 1,
        }
        for s in &record.shards {
            if then.available.contains(&s.index) {
                continue;
            }
            let domain = layout.node(s.node).map_or_else(
                || "(unwritten)".to_owned(),
                |n| n.failure_domain.to_string(),
            );
            self.domains.insert(domain);
        }
    }
}

/// The answer: ok when no stripe would be left at k or below and a quorum of voters
/// would remain, with the reasons otherwise.
pub fn verdict(
    node: NodeId,
    name: &str,
    risk: StripeRisk,
    voters: &[NodeId],
    after: &BTreeSet<NodeId>,
) -> OkToStop {
    let voters_alive_after = voters.iter().filter(|v| after.contains(v)).count() as u32;
    let quorum = voters.len() as u32 / 2 + 1;
    let mut reasons = Vec::new();
    if risk.at_k + risk.unreadable > 0 {
        reasons.push(format!(
            "{} stripe(s) would be left with only k shards available and {} with fewer (unreadable); with it stopped, their missing shards would be in {}",
            risk.at_k,
            risk.unreadable,
            risk.domains.iter().cloned().collect::<Vec<_>>().join(", ")
        ));
    }
    if !voters.is_empty() && voters_alive_after < quorum {
        reasons.push(format!(
            "the metadata group would keep {voters_alive_after} of {} voters alive; it needs {quorum}",
            voters.len()
        ));
    }
    OkToStop {
        node: format!("{:016x}", node.0),
        name: name.to_owned(),
        ok: reasons.is_empty(),
        stripes_total: risk.total,
        stripes_on_node: risk.on_node,
        stripes_at_k: risk.at_k,
        stripes_unreadable: risk.unreadable,
        domains_at_risk: risk.domains.into_iter().collect(),
        voters: voters.len() as u32,
        voters_alive_after,
        reasons,
    }
}

/// Assesses stopping the node named `which` (a name or a 16-hex-digit id) from this
/// node's replica, caught up with the cluster first, and gossip view.
pub async fn assess(node: &Node, which: &str) -> Result<OkToStop, AgentError> {
    crate::drain::catch_up(node).await;
    let members = node.gossip.members().await?;
    let store = node.group.store();
    let layout = crate::drain::committed_layout(node)?;
    let target = crate::drain::find_node(&members, Some(&layout), which)?;
    let (id, name) = (target.id, target.name);
    let alive = crate::workers::repair::alive_of(&members);
    let mut after = alive.clone();
    after.remove(&id);
    let mut risk = StripeRisk::default();
    let mut cursor = None;
    loop {
        let page = store.stripes(cursor, PAGE)?;
        for r in &page {
            risk.add(r, &layout, &alive, &after, id);
        }
        cursor = page.last().map(|r| r.id);
        if page.len() < PAGE {
            break;
        }
    }
    let voters: Vec<NodeId> = node
        .group
        .status()
        .voters
        .iter()
        .filter_map(|v| u64::from_str_radix(v, 16).ok().map(NodeId))
        .collect();
    Ok(verdict(id, &name, risk, &voters, &after))
}

#[cfg(test)]
mod tests {
    use shoal_agent_api::ShardLocation;
    use shoal_placement::{EcProfile, LayoutNode, StripeId};

    use super::*;

    fn layout(n: u64) -> Layout {
        let nodes = (1..=n)
            .map(|i| LayoutNode::active(NodeId(i), format!("fd{i}").as_str(), 1))
            .collect();
        Layout::new(1, nodes).expect("layout")
    }

    /// A 4+2 stripe on nodes `on` (NONE where 0).
    fn stripe(id: u128, on: [u64; 6]) -> StripeRecord {
        StripeRecord {
            id: StripeId(id),
            len: 4 << 20,
            ec: EcProfile { k: 4, m: 2 },
            shard_len: 1 << 20,
            epoch: 1,
            shards: on
                .iter()
                .enumerate()
                .map(|(i, &n)| ShardLocation {
                    index: i as u8,
                    node: if n == 0 { NodeId::NONE } else { NodeId(n) },
                    crc32c: 0,
                })
                .collect(),
        }
    }

    fn ids(v: &[u64]) -> BTreeSet<NodeId> {
        v.iter().map(|&i| NodeId(i)).collect()
    }

    #[test]
    fn with_every_node_up_any_one_may_stop() {
        let l = layout(6);
        let alive = ids(&[1, 2, 3, 4, 5, 6]);
        let after = ids(&[1, 2, 3, 4, 5]);
        let mut risk = StripeRisk::default();
        risk.add(
            &stripe(1, [1, 2, 3, 4, 5, 6]),
            &l,
            &alive,
            &after,
            NodeId(6),
        );
        assert_eq!((risk.on_node, risk.at_k, risk.unreadable), (1, 0, 0));
        let v = verdict(
            NodeId(6),
            "n6",
            risk,
            &[NodeId(1), NodeId(2), NodeId(3)],
            &after,
        );
        assert!(v.ok, "{v:?}");
        assert_eq!(v.voters_alive_after, 3);
    }

    #[test]
    fn with_a_node_down_another_stop_would_leave_stripes_at_k() {
        let l = layout(6);
        let alive = ids(&[1, 2, 3, 4, 5]);
        let after = ids(&[1, 2, 3, 4]);
        let mut risk = StripeRisk::default();
        risk.add(
            &stripe(1, [1, 2, 3, 4, 5, 6]),
            &l,
            &alive,
            &after,
            NodeId(5),
        );
        // Written degraded while 6 was down: no shard there, one slot unwritten.
        risk.add(
            &stripe(2, [1, 2, 3, 4, 5, 0]),
            &l,
            &alive,
            &after,
            NodeId(5),
        );
        // Holds nothing on node 5: not made worse.
        risk.add(
            &stripe(3, [1, 2, 3, 4, 6, 0]),
            &l,
            &alive,
            &after,
            NodeId(5),
        );
        assert_eq!((risk.total, risk.on_node, risk.at_k), (3, 2, 2));
        assert_eq!(
            risk.domains.iter().map(String::as_str).collect::<Vec<_>>(),
            ["(unwritten)", "fd5", "fd6"]
        );
        let v = verdict(
            NodeId(5),
            "n5",
            risk,
            &[NodeId(1), NodeId(2), NodeId(3)],
            &after,
        );
        assert!(!v.ok);
        assert_eq!(v.reasons.len(), 1, "{:?}", v.reasons);
        assert!(v.reasons[0].contains("2 stripe(s)"), "{:?}", v.reasons);
    }

    #[test]
    fn a_node_already_down_may_stop_and_a_stop_that_would_unread_is_counted() {
        let l = layout(6);
        let alive = ids(&[1, 2, 3, 4]);
        let mut risk = StripeRisk::default();
        let down_already = ids(&[1, 2, 3, 4]);
        risk.add(
            &stripe(1, [1, 2, 3, 4, 5, 6]),
            &l,
            &alive,
            &down_already,
            NodeId(6),
        );
        assert_eq!(risk.on_node, 0, "stopping a stopped node changes nothing");
        let after = ids(&[1, 2, 3]);
        risk.add(
            &stripe(2, [1, 2, 3, 4, 5, 6]),
            &l,
            &alive,
            &after,
            NodeId(4),
        );
        assert_eq!((risk.on_node, risk.unreadable), (1, 1));
    }

    #[test]
    fn losing_the_voters_quorum_is_a_reason() {
        let after = ids(&[1, 4, 5]);
        let v = verdict(
            NodeId(2),
            "n2",
            StripeRisk::default(),
            &[NodeId(1), NodeId(2), NodeId(3)],
            &after,
        );
        assert!(!v.ok);
        assert_eq!((v.voters, v.voters_alive_after), (3, 1));
        assert!(v.reasons[0].contains("needs 2"), "{:?}", v.reasons);
    }
}
