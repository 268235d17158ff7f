//! `shoal ok-to-stop NODE [NODE...]`: whether stopping those nodes together now keeps every
//! stripe they hold an available shard of at k+1 available shards or more (one more loss
//! would still leave it readable) and the metadata voters at a quorum. A rolling restart
//! stops a whole failure domain at once, so the nodes are judged as one stop: two shards of
//! a stripe, or two voters, in the same batch count together. The assessment
//! ([`StopSet`], [`StripeRisk`], [`verdict`]) is pure; [`assess`] feeds it the local
//! replica's stripes and layout and gossip's live set. Stripes the nodes hold nothing
//! available of are not made worse by the stop and do not count against it.
//!
//! A "no" (exit 1) names the stripes at k or unreadable (the first [`MAX_STRIPES_NAMED`],
//! 16, by id), the failure domains of their missing shards, the voters among the nodes and
//! the voters left. The batch is `OkToStopNodes` (protocol 9); the one-node `OkToStop` of
//! protocols 5 to 8 is still answered in its own form, and the CLI asks an agent of those
//! versions in that form when one node is named (a batch is then an error, exit 2).

use std::collections::BTreeSet;

use shoal_agent_api::{MAX_STRIPES_NAMED, OkToStopNodes, StopNode, StripeAtRisk, StripeRecord};
use shoal_placement::{Layout, NodeId};

use super::drain::Named;
use crate::redundancy::Health;
use crate::{AgentError, Node};

/// Stripes read from the replica per page.
const PAGE: usize = 1024;

/// Who is alive now, and who would be once the nodes asked about stop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StopSet {
    pub alive: BTreeSet<NodeId>,
    pub after: BTreeSet<NodeId>,
}

impl StopSet {
    /// `alive`: gossip's live set now; `stopping`: the nodes to stop together.
    pub fn new(alive: BTreeSet<NodeId>, stopping: &[NodeId]) -> StopSet {
        let after = alive
            .iter()
            .copied()
            .filter(|n| !stopping.contains(n))
            .collect();
        StopSet { alive, after }
    }
}

/// How the stripes would stand with the nodes stopped.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StripeRisk {
    pub total: u64,
    pub on_nodes: u64,
    pub at_k: u64,
    pub unreadable: u64,
    pub domains: BTreeSet<String>,
    /// The first stripes left at k or below, to name in the answer.
    pub named: Vec<StripeAtRisk>,
}

impl StripeRisk {
    /// Adds one stripe.
    pub fn add(&mut self, record: &StripeRecord, layout: &Layout, set: &StopSet) {
        self.total += 1;
        if !record
            .shards
            .iter()
            .any(|s| set.alive.contains(&s.node) && !set.after.contains(&s.node))
        {
            return;
        }
        let now = Health::of(record, layout, &set.alive);
        let then = Health::of(record, layout, &set.after);
        if now.available.len() == then.available.len() {
            return;
        }
        self.on_nodes += 1;
        let k = usize::from(record.ec.k);
        match then.available.len() {
            n if n > k => return,
            n if n == k => self.at_k += 1,
            _ => self.unreadable += 1,
        }
        if self.named.len() < MAX_STRIPES_NAMED {
            self.named.push(StripeAtRisk {
                stripe: record.id.to_string(),
                ec: record.ec.to_string(),
                available_now: now.available.len() as u32,
                available_after: then.available.len() as u32,
            });
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
/// would remain, with the reasons otherwise. `stopping` are the nodes asked about, each
/// once.
pub fn verdict(
    stopping: &[Named],
    layout: &Layout,
    risk: StripeRisk,
    voters: &[NodeId],
    set: &StopSet,
) -> OkToStopNodes {
    let voters_alive_after = voters.iter().filter(|v| set.after.contains(v)).count() as u32;
    let quorum = voters.len() as u32 / 2 + 1;
    let voters_stopping: Vec<String> = stopping
        .iter()
        .filter(|n| voters.contains(&n.id) && set.alive.contains(&n.id))
        .map(label)
        .collect();
    let mut reasons = Vec::new();
    if risk.at_k + risk.unreadable > 0 {
        reasons.push(stripes_reason(&risk, stopping.len()));
    }
    if !voters.is_empty() && voters_alive_after < quorum {
        let losing = match voters_stopping.as_slice() {
            [] => String::new(),
            [one] => format!(" (stopping voter {one})"),
            many => format!(" (stopping voters {} together)", many.join(", ")),
        };
        reasons.push(format!(
            "the metadata group would keep {voters_alive_after} of {} voters alive{losing}; it needs {quorum}",
            voters.len()
        ));
    }
    OkToStopNodes {
        nodes: stopping
            .iter()
            .map(|n| StopNode {
                node: format!("{:016x}", n.id.0),
                name: n.name.clone(),
                domain: layout
                    .node(n.id)
                    .map(|l| l.failure_domain.to_string())
                    .unwrap_or_default(),
                alive: set.alive.contains(&n.id),
            })
            .collect(),
        ok: reasons.is_empty(),
        stripes_total: risk.total,
        stripes_on_nodes: risk.on_nodes,
        stripes_at_k: risk.at_k,
        stripes_unreadable: risk.unreadable,
        stripes_at_risk: risk.named,
        domains_at_risk: risk.domains.into_iter().collect(),
        voters: voters.len() as u32,
        voters_alive_after,
        voters_stopping,
        reasons,
    }
}

/// A node's name, or its id where gossip knows no name.
fn label(n: &Named) -> String {
    if n.name.is_empty() {
        format!("{:016x}", n.id.0)
    } else {
        n.name.clone()
    }
}

/// The stripes that would be left at k or below, naming the first of them.
fn stripes_reason(risk: &StripeRisk, stopping: usize) -> String {
    const SHOWN: usize = 3;
    let shown: Vec<String> = risk
        .named
        .iter()
        .take(SHOWN)
        .map(|s| format!("{} ({}: {} available)", s.stripe, s.ec, s.available_after))
        .collect();
    let more = (risk.at_k + risk.unreadable).saturating_sub(shown.len() as u64);
    let more = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    let them = if stopping > 1 {
        "them stopped together"
    } else {
        "it stopped"
    };
    format!(
        "{} stripe(s) would be left with only k shards available and {} with fewer (unreadable), e.g. {}{more}; with {them}, their missing shards would be in {}",
        risk.at_k,
        risk.unreadable,
        shown.join(", "),
        risk.domains.iter().cloned().collect::<Vec<_>>().join(", ")
    )
}

/// Assesses stopping the nodes `which` (names or 16-hex-digit ids) together, from this
/// node's replica, caught up with the cluster first, and gossip view.
pub async fn assess(node: &Node, which: &[String]) -> Result<OkToStopNodes, AgentError> {
    if which.is_empty() {
        return Err(AgentError::Invalid(
            "ok-to-stop needs at least one node".into(),
        ));
    }
    super::drain::catch_up(node).await;
    let members = node.gossip.members().await?;
    let store = node.group.store();
    let layout = super::drain::committed_layout(node)?;
    let mut named: Vec<Named> = Vec::new();
    for w in which {
        let n = super::drain::find_node(&members, Some(&layout), w)?;
        if !named.iter().any(|m| m.id == n.id) {
            named.push(n);
        }
    }
    let ids: Vec<NodeId> = named.iter().map(|n| n.id).collect();
    let set = StopSet::new(crate::workers::repair::alive_of(&members), &ids);
    let mut risk = StripeRisk::default();
    let mut cursor = None;
    loop {
        let page = store.stripes(cursor, PAGE)?;
        for r in &page {
            risk.add(r, &layout, &set);
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
    Ok(verdict(&named, &layout, risk, &voters, &set))
}

#[cfg(test)]
mod tests {
    use shoal_agent_api::ShardLocation;
    use shoal_placement::{EcProfile, LayoutNode, StripeId};

    use super::*;

    /// Nodes 1..=n, node i in failure domain `domain_of(i)`.
    fn layout_in(n: u64, domain_of: impl Fn(u64) -> String) -> Layout {
        let nodes = (1..=n)
            .map(|i| LayoutNode::active(NodeId(i), domain_of(i).as_str(), 1))
            .collect();
        Layout::new(1, nodes).expect("layout")
    }

    /// Each node its own failure domain.
    fn layout(n: u64) -> Layout {
        layout_in(n, |i| format!("fd{i}"))
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

    fn named(v: &[u64]) -> Vec<Named> {
        v.iter()
            .map(|&i| Named {
                id: NodeId(i),
                name: format!("n{i}"),
            })
            .collect()
    }

    fn stop(alive: &[u64], stopping: &[u64]) -> StopSet {
        let stopping: Vec<NodeId> = stopping.iter().map(|&i| NodeId(i)).collect();
        StopSet::new(ids(alive), &stopping)
    }

    fn voters(v: &[u64]) -> Vec<NodeId> {
        v.iter().map(|&i| NodeId(i)).collect()
    }

    /// The whole judgement of stopping `stopping` together: stripes, then voters.
    fn judge(
        layout: &Layout,
        stripes: &[StripeRecord],
        voter_ids: &[u64],
        alive: &[u64],
        stopping: &[u64],
    ) -> OkToStopNodes {
        let set = stop(alive, stopping);
        let mut risk = StripeRisk::default();
        for r in stripes {
            risk.add(r, layout, &set);
        }
        verdict(&named(stopping), layout, risk, &voters(voter_ids), &set)
    }

    #[test]
    fn with_every_node_up_any_one_may_stop() {
        let l = layout(6);
        let all = [1, 2, 3, 4, 5, 6];
        let v = judge(&l, &[stripe(1, all)], &[1, 2, 3], &all, &[6]);
        assert!(v.ok, "{v:?}");
        assert_eq!((v.stripes_on_nodes, v.stripes_at_k), (1, 0));
        assert_eq!(v.voters_alive_after, 3);
        assert_eq!(v.nodes.len(), 1);
        assert_eq!(
            (v.nodes[0].name.as_str(), v.nodes[0].domain.as_str()),
            ("n6", "fd6")
        );
        assert!(v.nodes[0].alive);
        assert!(v.stripes_at_risk.is_empty() && v.voters_stopping.is_empty());
    }

    #[test]
    fn with_a_node_down_another_stop_would_leave_stripes_at_k() {
        let l = layout(6);
        let stripes = [
            stripe(1, [1, 2, 3, 4, 5, 6]),
            // Written degraded while 6 was down: no shard there, one slot unwritten.
            stripe(2, [1, 2, 3, 4, 5, 0]),
            // Holds nothing on node 5: not made worse.
            stripe(3, [1, 2, 3, 4, 6, 0]),
        ];
        let v = judge(&l, &stripes, &[1, 2, 3], &[1, 2, 3, 4, 5], &[5]);
        assert!(!v.ok);
        assert_eq!(
            (v.stripes_total, v.stripes_on_nodes, v.stripes_at_k),
            (3, 2, 2)
        );
        assert_eq!(v.domains_at_risk, ["(unwritten)", "fd5", "fd6"]);
        assert_eq!(v.reasons.len(), 1, "{:?}", v.reasons);
        assert!(v.reasons[0].contains("2 stripe(s)"), "{:?}", v.reasons);
    }

    #[test]
    fn a_node_already_down_may_stop_and_a_stop_that_would_unread_is_counted() {
        let l = layout(6);
        let alive = [1, 2, 3, 4];
        let v = judge(&l, &[stripe(1, [1, 2, 3, 4, 5, 6])], &[], &alive, &[6]);
        assert_eq!(
            v.stripes_on_nodes, 0,
            "stopping a stopped node changes nothing"
        );
        assert!(v.ok && !v.nodes[0].alive, "{v:?}");
        let v = judge(&l, &[stripe(2, [1, 2, 3, 4, 5, 6])], &[], &alive, &[4]);
        assert_eq!((v.stripes_on_nodes, v.stripes_unreadable), (1, 1));
        assert!(!v.ok);
    }

    #[test]
    fn losing_the_voters_quorum_is_a_reason() {
        let v = judge(&layout(5), &[], &[1, 2, 3], &[1, 2, 4, 5], &[2]);
        assert!(!v.ok);
        assert_eq!((v.voters, v.voters_alive_after), (3, 1));
        assert_eq!(v.voters_stopping, ["n2"]);
        assert!(v.reasons[0].contains("needs 2"), "{:?}", v.reasons);
    }

    #[test]
    fn two_voters_of_one_domain_may_each_stop_but_not_together() {
        // Nodes 1 and 3 in fd-a, 2 in fd-b: all three are voters.
        let l = layout_in(3, |i| if i == 2 { "fd-b".into() } else { "fd-a".into() });
        let all = [1, 2, 3];
        for alone in all {
            let v = judge(&l, &[], &all, &all, &[alone]);
            assert!(v.ok, "n{alone} alone: {v:?}");
        }
        let v = judge(&l, &[], &all, &all, &[1, 3]);
        assert!(!v.ok);
        assert_eq!((v.voters, v.voters_alive_after), (3, 1));
        assert_eq!(v.voters_stopping, ["n1", "n3"]);
        assert_eq!(
            v.nodes
                .iter()
                .map(|n| n.domain.as_str())
                .collect::<Vec<_>>(),
            ["fd-a", "fd-a"]
        );
        assert_eq!(v.reasons.len(), 1, "{:?}", v.reasons);
        assert!(
            v.reasons[0].contains("stopping voters n1, n3 together")
                && v.reasons[0].contains("keep 1 of 3"),
            "{:?}",
            v.reasons
        );
    }

    #[test]
    fn two_shards_of_a_stripe_in_one_domain_may_each_stop_but_not_together() {
        // Six nodes in three domains, two shards of every 4+2 stripe in each.
        let l = layout_in(6, |i| format!("fd{}", (i - 1) % 3 + 1));
        let all = [1, 2, 3, 4, 5, 6];
        let stripes = [stripe(7, all), stripe(8, [2, 3, 1, 5, 6, 4])];
        for alone in all {
            let v = judge(&l, &stripes, &[1, 2, 3], &all, &[alone]);
            assert!(v.ok, "n{alone} alone: {v:?}");
        }
        // fd1 is nodes 1 and 4.
        let v = judge(&l, &stripes, &[1, 2, 3], &all, &[1, 4]);
        assert!(!v.ok);
        assert_eq!((v.stripes_on_nodes, v.stripes_at_k), (2, 2));
        assert_eq!(
            v.voters_alive_after, 2,
            "one voter of three stops: a quorum stays"
        );
        assert_eq!(
            v.stripes_at_risk,
            [7u128, 8].map(|id| StripeAtRisk {
                stripe: StripeId(id).to_string(),
                ec: "4+2".into(),
                available_now: 6,
                available_after: 4,
            })
        );
        assert_eq!(v.domains_at_risk, ["fd1"]);
        assert_eq!(v.reasons.len(), 1, "{:?}", v.reasons);
        assert!(
            v.reasons[0].contains(&StripeId(7).to_string())
                && v.reasons[0].contains("them stopped together"),
            "{:?}",
            v.reasons
        );
    }

    #[test]
    fn the_answer_names_a_bounded_number_of_stripes_and_counts_them_all() {
        let l = layout(6);
        let all = [1, 2, 3, 4, 5, 6];
        let stripes: Vec<StripeRecord> = (0..40).map(|i| stripe(i, all)).collect();
        let v = judge(&l, &stripes, &[], &all, &[5, 6]);
        assert_eq!(v.stripes_at_k, 40);
        assert_eq!(v.stripes_at_risk.len(), MAX_STRIPES_NAMED);
        assert!(v.reasons[0].contains("and 37 more"), "{:?}", v.reasons);
    }

    #[test]
    fn the_one_node_answer_keeps_the_older_form() {
        let l = layout(6);
        let all = [1, 2, 3, 4, 5, 6];
        let v = judge(&l, &[stripe(1, all)], &[1, 2, 3], &all, &[2]);
        let one = v.clone().into_one();
        assert_eq!(
            (one.name.as_str(), one.node.as_str()),
            ("n2", "0000000000000002")
        );
        assert_eq!(
            (one.ok, one.stripes_on_node, one.voters_alive_after),
            (v.ok, v.stripes_on_nodes, v.voters_alive_after)
        );
    }
}
