//! Garbage collection on the metadata leader: deletes the shards of stripes no extent
//! references any more, then forgets them; purges unlinked inodes once their grace period
//! is over and no mount anywhere holds them open.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use shoal_agent_api::Timestamp;
use shoal_mesh::{GossipHandle, MemberState};
use shoal_meta::{Command, Proposal};
use shoal_placement::StripeId;
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
    for id in local {
        match meta.store().stripe_known(id) {
            Ok(true) => {}
            Ok(false) => {
                let since = unknown_since.get(&id).copied().unwrap_or(now);
                if now.duration_since(since) < grace {
                    still_unknown.insert(id, since);
                    continue;
                }
                match stripes.delete_local(id).await {
                    Ok(n) => {
                        info!(stripe = %id, shards = n, "deleted shards no file references (never committed)")
                    }
                    Err(e) => warn!(stripe = %id, error = %e, "could not delete orphan shards"),
                }
            }
            Err(e) => {
                warn!(error = %e, "cannot check stripes against the metadata");
                return;
            }
        }
    }
    *unknown_since = still_unknown;
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
