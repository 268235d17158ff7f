//! Garbage collection on the metadata leader: deletes the shards of stripes no extent
//! references any more, then forgets them; purges unlinked inodes once their grace period
//! is over and no mount anywhere holds them open.

use std::sync::Arc;
use std::time::Duration;

use shoal_agent_api::Timestamp;
use shoal_mesh::{GossipHandle, MemberState};
use shoal_meta::{Command, Proposal};
use tracing::{debug, info, warn};

use super::service::MetaService;
use crate::stripes::Stripes;

/// Stripes freed per pass, at most.
const STRIPES_PER_PASS: usize = 256;

pub async fn run(meta: Arc<MetaService>, stripes: Arc<Stripes>, gossip: GossipHandle) {
    let mut tick = tokio::time::interval(Duration::from_secs(meta.config.gc_interval_s));
    loop {
        tick.tick().await;
        if !meta.is_leader() {
            continue;
        }
        free_stripes(&meta, &stripes).await;
        purge_orphans(&meta, &gossip).await;
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
    let peers: Vec<_> = members
        .iter()
        .filter(|m| m.state == MemberState::Alive && !m.is_self)
        .filter_map(|m| m.facts.as_ref().map(|f| f.rpc_addr))
        .collect();
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
