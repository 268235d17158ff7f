//! A node that comes back with an older copy of its data dir (a restored backup, a disk
//! reimaged from a stale image) brings back an old Raft vote and log: it could vote twice
//! in one term and drop entries it had acknowledged. The cluster records the generation
//! every node runs with (`RecordGenerations`, by the leader's steward); at start, before
//! it takes part in anything, a node with metadata state asks the peers its state knows
//! what the cluster recorded for it. A record above the generation of its data dir means
//! the state is stale: it is moved aside, the node starts with empty Raft state, refuses
//! every Raft message until the leader has taken it out of the group, and then joins
//! again as a learner that catches up by snapshot.
//!
//! The same answers tell a restarting node the highest generation membership knows for
//! it (a node renewed while running counts up in memory), so it starts above it.
//!
//! The stale `meta/` is moved to `meta.stale-<time>`; the leader is asked through any old
//! peer (`meta/rejoin`, by the `rejoin` worker); the steward then adds the node as a new
//! learner. The log says so (ERROR) and status shows it (`meta.notice`). Limits: a node
//! whose later life ended before the steward recorded it (about a second) is not
//! detected, and with no peer answering (a whole-cluster restart) nothing is checked.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use shoal_mesh::{Rpc, Transport};
use shoal_placement::NodeId;

use super::ConsensusError;
use super::net::ForwardRefused;

/// Asks an agent what the cluster knows of node `node`.
#[derive(Serialize, Deserialize)]
pub struct WhoAmI {
    pub node: NodeId,
}

/// What one agent knows of a node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Known {
    /// The generation its metadata replica has recorded for the node.
    pub recorded: Option<u64>,
    /// The highest generation its membership view holds for the node.
    pub gossip: Option<u64>,
}

impl Rpc for WhoAmI {
    const ENDPOINT: &'static str = "meta/who-am-i";
    type Response = Known;
}

/// Asks the leader to take a node whose Raft state was reset out of the group (it then
/// joins again as a new learner).
#[derive(Serialize, Deserialize)]
pub struct Rejoin {
    pub node: u64,
}

impl Rpc for Rejoin {
    const ENDPOINT: &'static str = "meta/rejoin";
    type Response = Result<(), ForwardRefused>;
}

/// What the start-up check found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The data dir is as new as anything the cluster recorded.
    Current,
    /// The cluster recorded a later life of this node than the data dir holds.
    Stale { recorded: u64, data_dir: u64 },
    /// No peer answered (the whole cluster starting, say): nothing to compare with.
    Unchecked,
}

/// Judges the data dir whose last generation is `data_dir_generation` against peers'
/// answers (pure).
pub fn judge(data_dir_generation: u64, answers: &[Known]) -> Verdict {
    if answers.is_empty() {
        return Verdict::Unchecked;
    }
    match answers.iter().filter_map(|a| a.recorded).max() {
        Some(recorded) if recorded > data_dir_generation => Verdict::Stale {
            recorded,
            data_dir: data_dir_generation,
        },
        _ => Verdict::Current,
    }
}

/// The lowest generation this run may use: above every generation the peers know.
pub fn min_generation(answers: &[Known]) -> u64 {
    answers
        .iter()
        .flat_map(|a| [a.recorded, a.gossip])
        .flatten()
        .max()
        .map_or(0, |g| g.saturating_add(1))
}

/// The RPC addresses of the group's other members as this node's metadata state last
/// applied them; empty for a node without metadata state.
pub fn known_peers(meta_dir: &Path, me: NodeId) -> Vec<SocketAddr> {
    let path = meta_dir.join("state.redb");
    if !path.exists() {
        return Vec::new();
    }
    let Ok(store) = shoal_namespace::NamespaceStore::open(&path) else {
        return Vec::new();
    };
    let Ok(Some(marker)) = store.applied() else {
        return Vec::new();
    };
    let Ok(marker) = postcard::from_bytes::<super::types::AppliedMarker>(&marker) else {
        return Vec::new();
    };
    marker
        .membership
        .membership()
        .nodes()
        .filter(|(id, _)| **id != me.0)
        .filter_map(|(_, n)| n.addr.parse().ok())
        .collect()
}

/// Asks every peer at once; the answers that came within `timeout`.
pub async fn ask_cluster(
    transport: &std::sync::Arc<Transport>,
    me: NodeId,
    peers: &[SocketAddr],
    timeout: Duration,
) -> Vec<Known> {
    let mut asks = tokio::task::JoinSet::new();
    for peer in peers.iter().copied() {
        let transport = transport.clone();
        asks.spawn(async move { transport.call(peer, &WhoAmI { node: me }, timeout).await });
    }
    asks.join_all()
        .await
        .into_iter()
        .filter_map(Result::ok)
        .collect()
}

/// Moves a stale metadata dir aside (kept for an operator to look at), leaving none.
pub fn set_aside(meta_dir: &Path) -> std::io::Result<PathBuf> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let aside = meta_dir.with_file_name(format!("meta.stale-{secs}"));
    std::fs::rename(meta_dir, &aside)?;
    if let Some(parent) = meta_dir.parent() {
        std::fs::File::open(parent)?.sync_all()?;
    }
    Ok(aside)
}

/// The `rejoin` worker: asks the leader, through the members the old state knew in
/// turn, until it answers, to take this node out of the group (its Raft state was reset);
/// then lets Raft messages in again, and is done.
pub struct Rejoiner {
    group: std::sync::Arc<super::Group>,
    peers: Vec<SocketAddr>,
    next: usize,
    pause: Duration,
}

impl Rejoiner {
    pub(super) fn new(group: std::sync::Arc<super::Group>, peers: Vec<SocketAddr>) -> Self {
        Rejoiner {
            group,
            peers,
            next: 0,
            pause: Duration::from_millis(200),
        }
    }
}

impl crate::worker::Worker for Rejoiner {
    type Error = ConsensusError;

    fn name(&self) -> &'static str {
        "rejoin"
    }

    async fn work(&mut self) -> Result<crate::worker::Step, ConsensusError> {
        use crate::worker::Step;
        let Some(peer) = self.peers.get(self.next % self.peers.len().max(1)).copied() else {
            return Ok(Step::Done);
        };
        self.next += 1;
        let result = self
            .group
            .transport()
            .call(
                peer,
                &Rejoin {
                    node: self.group.me,
                },
                Duration::from_secs(10),
            )
            .await
            .unwrap_or_else(|e| Err(ForwardRefused::Unavailable(e.to_string())));
        match result {
            Ok(()) => {
                self.group.rejoined();
                tracing::info!("out of the metadata group; joining again as a learner");
                Ok(Step::Done)
            }
            Err(e) => {
                tracing::debug!(%peer, error = ?e, "the leader has not taken this node out yet");
                Ok(Step::Idle)
            }
        }
    }

    async fn wait_for_work(&mut self) {
        tokio::time::sleep(self.pause).await;
        self.pause = (self.pause * 2).min(Duration::from_secs(2));
    }

    fn progress(&self) -> Option<String> {
        Some(format!(
            "asked {} times to be taken out of the group",
            self.next
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known(recorded: Option<u64>, gossip: Option<u64>) -> Known {
        Known { recorded, gossip }
    }

    #[test]
    fn a_data_dir_older_than_the_clusters_record_is_stale() {
        assert_eq!(judge(5, &[]), Verdict::Unchecked);
        assert_eq!(judge(5, &[known(Some(5), Some(7))]), Verdict::Current);
        assert_eq!(judge(5, &[known(Some(4), None)]), Verdict::Current);
        assert_eq!(
            judge(5, &[known(None, Some(9))]),
            Verdict::Current,
            "gossip is not a record"
        );
        assert_eq!(
            judge(5, &[known(Some(5), None), known(Some(7), None)]),
            Verdict::Stale {
                recorded: 7,
                data_dir: 5
            },
            "the highest record counts (a lagging replica may answer too)"
        );
    }

    #[test]
    fn a_restart_starts_above_every_generation_the_peers_know() {
        assert_eq!(min_generation(&[]), 0);
        assert_eq!(
            min_generation(&[known(Some(5), Some(8)), known(Some(6), None)]),
            9
        );
    }
}
