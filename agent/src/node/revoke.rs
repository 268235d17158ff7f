//! Revoked certificates: `shoal cert revoke NAME` commits the revocation through Raft, and
//! the `revocations` worker hands the replica's list to this node's transport, which then
//! refuses every connection and request from a revoked certificate (and the gossip of the
//! node it named, until that node shows a newer certificate).
//!
//! `RevokeCertificates` names every certificate of NAME issued before now, with the node id
//! the name belongs to (snapshot v7). Both sides refuse (`reason="revoked"`; existing
//! connections are checked per request), and gossip sent as that node is dropped until it
//! shows a certificate issued after the revocation on a connection (a re-keyed node does,
//! with its first calls), so SWIM declares it down and the usual down/out rules apply. The
//! revoked node logs an ERROR: once from its own replica if the entry was committed there
//! before the others cut it off, and at most once a minute from its peers' refusals, which
//! close its QUIC connections with code 2
//! (`rpc_connections_rejected{reason="own_revoked"}`). Issue times come from the CA host's
//! clock and the revocation's from the agent's: re-key after revoking, with clocks in step
//! (`shoal cert issue --node-id $(cat DATA/node_id)`). Refused while an alive member runs
//! another release. A certificate without a node id (an older release's) is refused.
//! Measurement: every agent refused a revoked node 1.1 s after `revoke` returned
//! (`tests/tests/revocation.rs`).

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use shoal_mesh::{NodeCert, NodeId, Revocation, Transport};
use shoal_namespace::{Command, Outcome, Proposal};
use tracing::error;

use crate::consensus::Group;
use crate::worker::{Step, Ticker, Worker};
use crate::{AgentError, Node};

/// How often the worker reads the list: the bound within which every agent refuses a
/// newly revoked certificate (plus the commit's own latency, milliseconds).
pub const REFRESH: Duration = Duration::from_secs(1);

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Revokes every certificate of node `name` issued before now.
pub(crate) async fn revoke(node: &Node, name: &str) -> Result<String, AgentError> {
    if name.is_empty() {
        return Err(AgentError::Invalid("a node name is needed".into()));
    }
    let members = node.gossip.members().await?;
    let others = crate::releases::alive_on_other_releases(&members);
    if !others.is_empty() {
        return Err(AgentError::Refused(format!(
            "revocations need every node on this release ({}): {}; finish the upgrade first",
            crate::AGENT_VERSION,
            others.join(", ")
        )));
    }
    // The node the name belongs to, for gossip (which names nodes by id only).
    let id = members
        .iter()
        .find(|m| m.facts.as_ref().is_some_and(|f| f.name == name))
        .map_or(NodeId::NONE, |m| m.id.node);
    let before_ms = unix_ms();
    let outcome = node
        .group
        .propose_one(Proposal {
            id: None,
            now: shoal_namespace::format::Timestamp::now(),
            command: Command::RevokeCertificates {
                name: name.to_owned(),
                node: id,
                before_ms,
            },
        })
        .await?;
    match outcome {
        Outcome::Done => {}
        Outcome::Failed(error) => {
            return Err(AgentError::Declined {
                what: format!("not revoked ({name})"),
                error: error.into(),
            });
        }
        other => {
            return Err(
                crate::consensus::ConsensusError::UnexpectedOutcome(Box::new(other)).into(),
            );
        }
    }
    let within = REFRESH.as_secs() + 1;
    Ok(if id == NodeId::NONE {
        format!(
            "revoked every certificate of {name} (no member of that name is known here) issued before {before_ms} ms since the epoch; every agent refuses them within {within} s."
        )
    } else {
        format!(
            "revoked every certificate of {name} (node {id}) issued before {before_ms} ms since the epoch; every agent refuses them within {within} s. To let the node back, give it a new key with `shoal cert issue --ca-dir CA_DIR --name {name} --ip IP --node-id {id} --out DIR`, copy node.pem and node.key to its tls dir and restart its agent."
        )
    })
}

/// The `revocations` worker: keeps the transport's list equal to the replica's.
pub struct RevocationsRefresh {
    group: Arc<Group>,
    transport: Arc<Transport>,
    own: NodeCert,
    /// The list last handed over, to log changes once.
    last: Vec<shoal_namespace::RevokedName>,
    ticker: Ticker,
}

impl RevocationsRefresh {
    pub fn new(group: Arc<Group>, transport: Arc<Transport>, own: NodeCert) -> Self {
        RevocationsRefresh {
            group,
            transport,
            own,
            last: Vec::new(),
            ticker: Ticker::every(REFRESH),
        }
    }
}

impl Worker for RevocationsRefresh {
    type Error = AgentError;

    fn name(&self) -> &'static str {
        "revocations"
    }

    async fn work(&mut self) -> Result<Step, AgentError> {
        let list = self
            .group
            .store()
            .revoked_certificates()
            .map_err(crate::consensus::ConsensusError::from)?;
        if list == self.last {
            return Ok(Step::Idle);
        }
        self.transport.revocations().set(
            list.iter()
                .map(|r| Revocation {
                    name: r.name.clone(),
                    node: r.node,
                    before_ms: r.before_ms,
                })
                .collect(),
        );
        if self.transport.revocations().is_revoked(&self.own) {
            error!(
                name = %self.own.name,
                "this node's own certificate is revoked: every other agent refuses it; issue a new one with `shoal cert issue --node-id {}` and restart",
                self.own.node
            );
        }
        self.last = list;
        Ok(Step::Idle)
    }

    async fn wait_for_work(&mut self) {
        self.ticker.tick().await;
    }
}
