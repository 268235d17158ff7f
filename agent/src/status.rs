//! `shoal status`: membership as this agent sees it, with a live RPC ping of each peer.

use std::time::{Duration, Instant};

use shoal_agent_api::{MemberState, MemberStatus, StatusReport, StoreStatus};
use shoal_mesh::{MemberView, NodeId};
use shoal_store::ShardStore;
use tokio::task::JoinSet;

use crate::system_rpc::Ping;
use crate::{AGENT_VERSION, AgentError, Node};

const PING_TIMEOUT: Duration = Duration::from_millis(800);

pub(crate) async fn report(node: &Node) -> Result<StatusReport, AgentError> {
    let members = node.gossip.members().await?;
    let rtts = ping_peers(node, &members).await;
    let now = Instant::now();
    let nodes = members
        .into_iter()
        .map(|m| {
            let rtt = rtts
                .iter()
                .find(|(id, _)| *id == m.id.node)
                .and_then(|(_, r)| *r);
            to_status(m, rtt, now)
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
    }
}
