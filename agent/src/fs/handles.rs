//! The table of the local mounts' open handles, and the question "which of these inodes
//! does a mount hold open?" that the leader asks every agent before it purges an unlinked
//! inode (`meta/held-open`).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use serde::{Deserialize, Serialize};
use shoal_agent_api::Ino;
use shoal_mesh::{Rpc, Transport};

/// How long after this agent starts its mounts have to re-announce their open handles
/// (they ping the agent every 5 s while files are open: three chances).
const REANNOUNCE_GRACE: Duration = Duration::from_secs(15);
const RPC_TIMEOUT: Duration = Duration::from_secs(10);
/// Sessions remembered before those of exited processes are swept.
const MAX_SESSIONS: usize = 4096;

/// Asks an agent which of these inodes a local mount holds open.
#[derive(Serialize, Deserialize)]
pub struct HeldOpen(pub Vec<Ino>);

impl Rpc for HeldOpen {
    const ENDPOINT: &'static str = "meta/held-open";
    type Response = Vec<Ino>;
}

/// (mount session, handle) → (inode, the mount's pid when known, from the socket's peer
/// credentials).
type Holds = HashMap<(u64, u64), (Ino, Option<i32>)>;

/// Open handles of local mounts.
pub struct OpenHandles {
    held: Mutex<Holds>,
    /// Mount session → the pid of the process that uses it (see [`Self::claim`]).
    owners: Mutex<HashMap<u64, i32>>,
    started: Instant,
}

impl Default for OpenHandles {
    fn default() -> Self {
        OpenHandles {
            held: Mutex::new(HashMap::new()),
            owners: Mutex::new(HashMap::new()),
            started: Instant::now(),
        }
    }
}

fn alive(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

impl OpenHandles {
    fn lock(&self) -> std::sync::MutexGuard<'_, Holds> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the client process `pid` may act for mount `session`: a session belongs to
    /// the first live process that uses it, so one local client can neither release
    /// another mount's handles (letting its unlinked files be purged) nor spend its
    /// request ids. A session whose process has exited is free again.
    pub fn claim(&self, session: u64, pid: Option<i32>) -> bool {
        let Some(pid) = pid else {
            // No peer credentials (not a Unix socket client): nothing to check against.
            return true;
        };
        let mut owners = self.owners.lock().unwrap_or_else(|p| p.into_inner());
        match owners.get(&session) {
            Some(&owner) if owner == pid => true,
            Some(&owner) if alive(owner) => false,
            _ => {
                if owners.len() >= MAX_SESSIONS {
                    owners.retain(|_, p| alive(*p));
                }
                owners.insert(session, pid);
                true
            }
        }
    }

    /// Records an open handle (idempotent: a mount re-announces its handles after
    /// reconnecting).
    pub fn hold(&self, session: u64, handle: u64, ino: Ino, pid: Option<i32>) {
        self.lock().insert((session, handle), (ino, pid));
    }

    pub fn release(&self, session: u64, handle: u64) {
        self.lock().remove(&(session, handle));
    }

    /// Which of `inos` a live local mount holds open. Handles of a mount process that
    /// has exited are forgotten here (it cannot close them any more). Right after this
    /// agent started, mounts may not have re-announced their handles yet: then every
    /// inode counts as held.
    pub fn held_among(&self, inos: &[Ino]) -> Vec<Ino> {
        if self.started.elapsed() < REANNOUNCE_GRACE {
            return inos.to_vec();
        }
        let mut held = self.lock();
        held.retain(|_, (_, pid)| pid.is_none_or(alive));
        inos.iter()
            .copied()
            .filter(|i| held.values().any(|(h, _)| h == i))
            .collect()
    }

    /// Serves [`HeldOpen`] from this table.
    pub fn serve(self: &Arc<Self>, transport: &Transport) {
        let this = self.clone();
        transport.register(move |_from, msg: HeldOpen| {
            let this = this.clone();
            async move { Ok(this.held_among(&msg.0)) }
        });
    }

    /// Asks every node in `holders` (at its address, refused unless the peer's certificate
    /// names that node) which of `inos` its mounts hold open; one that does not answer
    /// counts as holding all of them (its mounts may still read).
    pub async fn held_anywhere(
        &self,
        transport: &Transport,
        inos: &[Ino],
        holders: &[(shoal_placement::NodeId, SocketAddr)],
    ) -> Vec<Ino> {
        let mut held = self.held_among(inos);
        for &(node, addr) in holders {
            // Asked of that node only: an answer from whoever holds its address now
            // would say nothing of that node's mounts.
            match transport
                .call_to(node, addr, &HeldOpen(inos.to_vec()), RPC_TIMEOUT)
                .await
            {
                Ok(h) => held.extend(h),
                Err(_) => return inos.to_vec(),
            }
        }
        held.sort_unstable();
        held.dedup();
        held
    }
}

#[cfg(test)]
mod tests {
    use super::OpenHandles;

    #[test]
    fn a_session_belongs_to_the_live_process_that_used_it_first() {
        let handles = OpenHandles::default();
        let me = std::process::id() as i32;
        assert!(handles.claim(7, Some(me)));
        assert!(handles.claim(7, Some(me)), "its owner again");
        // pid 1 is alive and is not the owner.
        assert!(!handles.claim(7, Some(1)), "another live process");
        assert!(handles.claim(8, Some(1)), "another session");
        // An owner that has exited frees its session.
        let mut child = std::process::Command::new("true").spawn().expect("spawn");
        let gone = child.id() as i32;
        child.wait().expect("wait");
        assert!(handles.claim(9, Some(gone)));
        assert!(
            handles.claim(9, Some(me)),
            "taken over from an exited process"
        );
    }
}
