//! `shoal status`: membership as this agent sees it, with a live RPC ping of each peer,
//! each member's layout state and down time, and the cluster's redundancy.

use std::time::{Duration, Instant};

use shoal_agent_api::{
    MemberState, MemberStatus, MissingShards, RedundancyStatus, StatusReport, StoreStatus,
};
use shoal_mesh::{MemberView, NodeId};
use shoal_namespace::nodes::state_name;
use shoal_placement::NodeState;
use shoal_store::ShardStore;
use tokio::task::JoinSet;

use crate::system_rpc::Ping;
use crate::{AGENT_VERSION, AgentError, Node};

const PING_TIMEOUT: Duration = Duration::from_millis(800);

pub(crate) async fn report(node: &Node) -> Result<StatusReport, AgentError> {
    let members = node.gossip.members().await?;
    let rtts = ping_peers(node, &members).await;
    let now = Instant::now();
    let layout = node.group.store().cluster_layout().ok().flatten();
    let admins = node.group.store().node_admins().unwrap_or_default();
    let clock_ms = node.group.cluster_now_ms().unwrap_or_default();
    let redundancy = redundancy(node, &members);
    let nodes = members
        .into_iter()
        .map(|m| {
            let rtt = rtts
                .iter()
                .find(|(id, _)| *id == m.id.node)
                .and_then(|(_, r)| *r);
            let layout_state = layout
                .as_ref()
                .and_then(|l| l.node(m.id.node))
                .map(|n| n.state);
            let window_left = (layout_state == Some(NodeState::Maintenance))
                .then(|| admins.get(&m.id.node.0))
                .flatten()
                .and_then(|a| a.maintenance_until_ms)
                .map(|until| until as i64 - clock_ms as i64);
            let mut s = to_status(m, rtt, now);
            s.maintenance_ends_in_ms = window_left;
            down_times(
                &mut s,
                layout_state,
                now.saturating_duration_since(node.started_at),
                node.config.cluster.down_out_after,
            );
            s.layout_state = layout_state.map(|st| state_name(st).to_owned());
            s
        })
        .collect();
    let (background_factor, background) = node.resources.background();
    Ok(StatusReport {
        resources: node.resources.status(),
        gpu: node.resources.gpu_status(),
        background_factor,
        background,
        store: {
            let u = node.store.usage();
            StoreStatus {
                shards: u.shards,
                used_bytes: u.used_bytes,
                limit_bytes: u.limit_bytes,
            }
        },
        meta: node.group.status(),
        workers: node.workers.status(),
        redundancy,
        scrub: node.scrub.status(),
        node: node.identity.node.to_string(),
        agent_version: AGENT_VERSION.to_owned(),
        detection_bound_ms: node.config.mesh.membership().detection_bound().as_millis() as u64,
        nodes,
    })
}

/// Pings every live peer over QUIC in parallel; `None` where the ping failed.
async fn ping_peers(node: &Node, members: &[MemberView]) -> Vec<(NodeId, Option<u64>)> {
    let mut set = JoinSet::new();
    for m in members {
        let live = matches!(
            m.state,
            shoal_mesh::MemberState::Alive | shoal_mesh::MemberState::Suspect
        );
        let Some(facts) = m.facts.as_ref().filter(|_| live && !m.is_self) else {
            continue;
        };
        let transport = node.transport.clone();
        let (id, addr) = (m.id.node, facts.rpc_addr);
        set.spawn(async move {
            let started = Instant::now();
            let nonce = rand::random();
            let ok = transport
                .call(addr, &Ping { nonce }, PING_TIMEOUT)
                .await
                .is_ok_and(|pong| pong.nonce == nonce && pong.node == id);
            (id, ok.then(|| started.elapsed().as_micros() as u64))
        });
    }
    set.join_all().await
}

fn to_status(m: MemberView, rpc_rtt_us: Option<u64>, now: Instant) -> MemberStatus {
    let state = match m.state {
        shoal_mesh::MemberState::Alive => MemberState::Alive,
        shoal_mesh::MemberState::Suspect => MemberState::Suspect,
        shoal_mesh::MemberState::Down => MemberState::Down,
        shoal_mesh::MemberState::Left => MemberState::Left,
    };
    let facts = m.facts.as_ref();
    MemberStatus {
        id: m.id.node.to_string(),
        name: facts.map(|f| f.name.clone()).unwrap_or_default(),
        addr: m.id.addr.to_string(),
        rpc_addr: facts.map(|f| f.rpc_addr.to_string()),
        failure_domain: facts.map(|f| f.failure_domain.clone()),
        state,
        generation: m.id.generation,
        incarnation: m.incarnation,
        capacity_bytes: facts.map(|f| f.capacity_bytes),
        used_bytes: facts.map(|f| f.used_bytes),
        store_accepting: facts.map(|f| f.store_accepting),
        store_room_bytes: facts.map(|f| f.store_room_bytes),
        agent_version: facts.map(|f| f.agent_version.clone()),
        last_heard_ms: m
            .last_heard
            .map(|t| now.saturating_duration_since(t).as_millis() as u64),
        rpc_rtt_us,
        is_self: m.is_self,
        layout_state: None,
        down_for_ms: None,
        out_in_ms: None,
        maintenance_ends_in_ms: None,
    }
}

/// For a member not alive: how long it has been down (since it was last heard, or at
/// least as long as this agent has run) and, until it is `out`, how long until it is (a
/// node in maintenance not before its window ends; a drained one never).
fn down_times(
    s: &mut MemberStatus,
    layout_state: Option<NodeState>,
    running: Duration,
    down_out_after: Duration,
) {
    if s.is_self || s.state == MemberState::Alive {
        return;
    }
    let down_for = s.last_heard_ms.map_or(running, Duration::from_millis);
    s.down_for_ms = Some(down_for.as_millis() as u64);
    let left = down_out_after.saturating_sub(down_for).as_millis() as u64;
    s.out_in_ms = match layout_state {
        Some(NodeState::Out | NodeState::Drained) => None,
        Some(NodeState::Maintenance) => {
            let window = s.maintenance_ends_in_ms.unwrap_or(0).max(0) as u64;
            Some(left.max(window))
        }
        _ => Some(left),
    };
}

/// The redundancy summary of the repair worker's last scan, with the cluster's repair
/// rate (every live member's, from gossip) and the time left at that rate.
fn redundancy(node: &Node, members: &[MemberView]) -> Option<RedundancyStatus> {
    let view = node.repair.view();
    let summary = view.summary?;
    let others: u64 = members
        .iter()
        .filter(|m| !m.is_self && m.state == shoal_mesh::MemberState::Alive)
        .filter_map(|m| m.facts.as_ref().map(|f| f.repair_bytes_per_sec))
        .sum();
    let rate = others + view.bytes_per_sec;
    let degraded = summary.degraded();
    Some(RedundancyStatus {
        stripes_total: summary.stripes,
        stripes_healthy: summary.healthy,
        stripes_degraded: degraded,
        stripes_unreadable: summary.unreadable,
        by_missing: summary
            .by_missing
            .iter()
            .map(|(missing, (stripes, bytes))| MissingShards {
                missing: *missing as u32,
                stripes: *stripes,
                bytes: *bytes,
            })
            .collect(),
        bytes_to_repair: summary.bytes_to_repair,
        bytes_waiting: summary.bytes_waiting,
        stripes_no_target: view.no_target,
        repair_bytes_per_sec: rate,
        eta_seconds: (rate > 0).then(|| summary.bytes_to_repair.div_ceil(rate)),
        scanned_ms_ago: view
            .scanned_at
            .map_or(0, |at| at.elapsed().as_millis() as u64),
        repaired_stripes: view.repaired_stripes,
        repaired_bytes: view.repaired_bytes,
        rebalance_stripes: summary.misplaced_stripes,
        rebalance_bytes: summary.misplaced_bytes,
        rebalanced_bytes: view.rebalanced_bytes,
    })
}
