//! Getting another node's directory lease out of the way of a change: a node whose
//! command was refused with `Leased { dir, holder }` asks the holder to commit what it
//! answered in the directory and give the lease back (`meta/recall-lease`), and asks
//! again with the same request id. A holder that does not answer within twice the lease
//! term has stopped answering from it by then (`lease_holder.rs`): the lease is broken
//! (`ReturnDirLease` with its epoch), and the holder's late batches are refused by the
//! epoch fence.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use shoal_agent_api::{FsError, Ino};
use shoal_mesh::{FailureClass, Refusal, Rpc, Transport};
use shoal_namespace::format::Timestamp;
use shoal_namespace::{Command, Outcome, Proposal};
use shoal_placement::NodeId;
use tokio::time::Instant;

use super::lease_holder::LEASE_TERM;
use super::leases::Leases;
use crate::consensus::Group;

/// Asks the holder of the lease on `dir` at `epoch` to commit and give it back.
#[derive(Serialize, Deserialize)]
pub struct RecallLease {
    pub dir: Ino,
    pub epoch: u64,
}

impl Rpc for RecallLease {
    const ENDPOINT: &'static str = "meta/recall-lease";
    type Response = ();
}

/// Serves [`RecallLease`] from this node's leases: commits what was answered and returns
/// the lease (or returns one this node held before its agent restarted).
pub fn serve(leases: &Arc<Leases>, transport: &Transport) {
    let leases = leases.clone();
    transport.register(move |_from, msg: RecallLease| {
        let leases = leases.clone();
        async move {
            // Another node works in the directory: not taken again for a while.
            leases.contended(msg.dir);
            leases.metrics().recalls.inc();
            // Held at that epoch: committed and given back. Not held here (granted
            // before this agent restarted): given back at that epoch, if still so.
            leases
                .return_unheld(msg.dir, msg.epoch)
                .await
                .map_err(|e| Refusal::new(FailureClass::Retryable, e.to_string()))
        }
    });
}

/// Gets the lease of `holder` on `dir` out of the way: recalled, or broken once the
/// holder has not answered for twice the lease term. Returns when the lease is gone, or
/// is another one (the caller asks again and sees).
pub async fn recall(
    group: &Group,
    transport: &Transport,
    dir: Ino,
    holder: NodeId,
) -> Result<(), FsError> {
    let started = Instant::now();
    // The refusal came from the leader's apply; this replica has applied it too (a
    // proposal is answered once it has).
    let Some(lease) = group.store().dir_lease(dir)? else {
        return Ok(());
    };
    if lease.holder != holder {
        return Ok(());
    }
    let patience = LEASE_TERM * 2;
    // The address the group has for it; the call checks that the peer is that node.
    if let Some(addr) = group.member_addr(holder.0) {
        let asked = RecallLease {
            dir,
            epoch: lease.epoch,
        };
        match transport.call_to(holder, addr, &asked, patience).await {
            Ok(()) => return Ok(()),
            Err(e) => tracing::debug!(%holder, dir, error = %e, "lease recall not answered"),
        }
    }
    tokio::time::sleep_until(started + patience).await;
    let broke = group
        .propose_one(Proposal {
            id: None,
            now: Timestamp::now(),
            command: Command::ReturnDirLease {
                dir,
                epoch: lease.epoch,
            },
        })
        .await?;
    if broke == Outcome::Done {
        tracing::info!(%holder, dir, epoch = lease.epoch, "broke a lease its holder did not return");
    }
    Ok(())
}
