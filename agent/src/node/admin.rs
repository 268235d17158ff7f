//! The local admin socket: `shoal` and `shoal mount` talk to the agent here.
//!
//! Whoever connects can read and write every file (the socket does not check POSIX
//! permissions; the mount's kernel does), hence `[admin] allow_other_users` before a
//! looser `socket_mode`. A mount session belongs to the first live process that uses it,
//! so no client can release another mount's handles or spend its request ids (EPERM). At
//! most 512 local clients are served at once. Which request came with which protocol
//! version is in `agent/api/src/lib.rs` (`API_VERSION`, `Request::oldest_version`).

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::sync::Arc;

use shoal_agent_api::frame::{read_any_frame, write_data_frame_as, write_frame, write_frame_as};
use shoal_agent_api::{
    API_VERSION, Failure, FailureKind, FsRequest, FsResponse, Request, Response,
};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tracing::debug;

use shoal_namespace::nodes::NodeChange;

use super::status;
use crate::worker::{Step, Worker};
use crate::{AdminConfig, AgentError, Node};

/// Binds the socket, replacing a stale one left by a crashed agent but never one that a
/// running agent still serves. The socket never exists at its path with looser permissions
/// than `socket_mode`: it is bound inside a fresh directory only the agent can enter, given
/// its mode there, and then renamed into place.
pub(crate) fn bind(config: &AdminConfig) -> Result<UnixListener, AgentError> {
    let path = &config.socket;
    let err = |reason: String| AgentError::AdminSocket {
        path: path.clone(),
        reason,
    };
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .ok_or_else(|| err("has no directory".into()))?;
    std::fs::create_dir_all(dir).map_err(|e| err(format!("cannot create its directory: {e}")))?;
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(AgentError::AdminSocketInUse { path: path.clone() });
        }
        std::fs::remove_file(path).map_err(|e| err(format!("cannot remove stale socket: {e}")))?;
    }
    let private = dir.join(format!(".agent.sock.{}", std::process::id()));
    // A leftover of a crashed start with the same pid.
    let _ = std::fs::remove_dir_all(&private);
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&private)
        .map_err(|e| err(format!("cannot create {}: {e}", private.display())))?;
    let staged = private.join("agent.sock");
    let bound = (|| {
        let listener = UnixListener::bind(&staged).map_err(|e| err(e.to_string()))?;
        std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(config.socket_mode))
            .map_err(|e| err(format!("cannot set permissions: {e}")))?;
        std::fs::rename(&staged, path).map_err(|e| err(format!("cannot move into place: {e}")))?;
        Ok(listener)
    })();
    let _ = std::fs::remove_dir_all(&private);
    bound
}

/// Local clients served at once, at most; more wait in the listen backlog. Each mount
/// keeps a small pool of connections.
const MAX_CLIENTS: usize = 512;

/// The admin socket's accept loop, as a worker (`admin-socket`): a unit starts serving one
/// local client on a task of its own; the clients' tasks end with it (their set is
/// dropped, which aborts them). Started first among the front workers, stopped before the
/// node leaves the cluster.
pub(crate) struct AdminSocket {
    listener: UnixListener,
    node: Arc<Node>,
    slots: Arc<Semaphore>,
    clients: JoinSet<()>,
    /// What the last wait brought: a client and its slot, or why accept failed.
    accepted: Option<std::io::Result<(UnixStream, OwnedSemaphorePermit)>>,
    /// The last accept failed: the next waits a moment first (out of descriptors, say).
    failed: bool,
}

impl AdminSocket {
    pub(crate) fn new(listener: UnixListener, node: Arc<Node>) -> AdminSocket {
        AdminSocket {
            listener,
            node,
            slots: Arc::new(Semaphore::new(MAX_CLIENTS)),
            clients: JoinSet::new(),
            accepted: None,
            failed: false,
        }
    }
}

impl Worker for AdminSocket {
    type Error = AgentError;

    fn name(&self) -> &'static str {
        "admin-socket"
    }

    async fn work(&mut self) -> Result<Step, AgentError> {
        while self.clients.try_join_next().is_some() {}
        self.failed = false;
        match self.accepted.take() {
            None => {}
            Some(Ok((stream, slot))) => {
                let node = self.node.clone();
                self.clients.spawn(async move {
                    serve_client(stream, node).await;
                    drop(slot);
                });
            }
            Some(Err(source)) => {
                self.failed = true;
                return Err(AgentError::Accept {
                    what: "admin socket",
                    source,
                });
            }
        }
        Ok(Step::Idle)
    }

    /// Waits for a free slot, then for a client. Cancel-safe: a slot taken is given back,
    /// and accept is cancel-safe.
    async fn wait_for_work(&mut self) {
        if self.failed {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        let Ok(slot) = self.slots.clone().acquire_owned().await else {
            return std::future::pending().await;
        };
        self.accepted = Some(self.listener.accept().await.map(|(s, _)| (s, slot)));
    }

    fn progress(&self) -> Option<String> {
        let serving = MAX_CLIENTS - self.slots.available_permits();
        (serving > 0).then(|| format!("{serving} local clients"))
    }
}

async fn serve_client(mut stream: UnixStream, node: Arc<Node>) {
    // The peer's pid: open handles of a mount that died without closing them are dropped.
    let pid = stream.peer_cred().ok().and_then(|c| c.pid());
    loop {
        let (version, request): (u8, Request) = match read_any_frame(&mut stream).await {
            Ok(Some(r)) => r,
            Ok(None) => return,
            Err(e) => {
                debug!(error = %e, "admin client sent a bad frame");
                let refused = Failure::new(FailureKind::Invalid, e.to_string());
                let _ = write_frame(&mut stream, &Response::Failed(refused)).await;
                return;
            }
        };
        let response = if version < request.oldest_version() {
            Response::Failed(Failure::new(
                FailureKind::Invalid,
                format!(
                    "this agent speaks protocol {API_VERSION}; the client speaks {version}: use the shoal binary of the agent's release"
                ),
            ))
        } else if let Request::Fs(FsRequest::Read { ino, offset, len }) = request {
            // File data goes out in the parts it was read in, not joined first.
            match node.fs.read(ino, offset, len).await {
                Ok(parts) => {
                    let sent =
                        write_data_frame_as::<_, Response, _>(&mut stream, version, &parts).await;
                    if sent.is_err() {
                        return;
                    }
                    continue;
                }
                Err(e) => Response::Fs(FsResponse::Error(e)),
            }
        } else {
            let what = match &request {
                Request::Fs(r) => r.name(),
                _ => "admin",
            };
            let began = std::time::Instant::now();
            let answer = handle(&node, request, pid, version).await;
            debug!(
                request = what,
                micros = began.elapsed().as_micros() as u64,
                "served"
            );
            answer
        };
        if write_frame_as(&mut stream, version, &response.in_version(version))
            .await
            .is_err()
        {
            return;
        }
    }
}

async fn handle(node: &Node, request: Request, pid: Option<i32>, version: u8) -> Response {
    // An operator's request about the namespace (pin, release, prefetch, drain...) sees
    // what this node's mount was answered under its directory leases: committed first.
    if !matches!(request, Request::Fs(_) | Request::Status)
        && node.fs.leases().pending()
        && let Err(e) = node.fs.leases().flush().await
    {
        return Response::Fs(FsResponse::Error(e));
    }
    match request {
        Request::Status => match status::report(node).await {
            Ok(r) => Response::Status(Box::new(r)),
            Err(e) => failed(e),
        },
        Request::WriteStripe { data, ec } => match node.stripes.write(data.into(), ec).await {
            Ok(r) => Response::StripeWritten(r),
            Err(e) => failed(e),
        },
        Request::ReadStripe {
            record,
            offset,
            len,
        } => match node.stripes.read(&record, offset, len).await {
            Ok(r) => Response::StripeRead(r),
            Err(e) => failed(e),
        },
        Request::Fs(r) => Response::Fs(node.fs.handle(r, pid, version).await),
        // Only a process's own pid: moving another process into the storage cgroup would
        // let any client confine (or starve) processes it does not own.
        Request::JoinReservation { pid: asked }
            if Some(asked) != pid.and_then(|p| u32::try_from(p).ok()) =>
        {
            Response::Failed(Failure::new(
                FailureKind::Refused,
                format!(
                    "refused: a process may only move itself into the reservation (asked for pid {asked}, the caller is {})",
                    pid.map_or("unknown".to_owned(), |p| format!("pid {p}"))
                ),
            ))
        }
        Request::JoinReservation { pid } => match &node.resources.guard {
            None => Response::Joined(None),
            Some(g) => match g.attach(pid) {
                Ok(()) => Response::Joined(Some(g.reservation().cgroup.clone())),
                // The cgroup could not be written: the reservation's fault, not the caller's.
                Err(e) => Response::Failed(Failure::new(
                    FailureKind::Internal,
                    format!("cannot move process {pid} into the reservation: {e}"),
                )),
            },
        },
        // The one-node form of protocol 5 to 8, answered in the form those clients decode.
        Request::OkToStop { node: which } => {
            match super::ok_to_stop::assess(node, std::slice::from_ref(&which)).await {
                Ok(r) => Response::OkToStop(Box::new(r.into_one())),
                Err(e) => failed(e),
            }
        }
        Request::OkToStopNodes { nodes } => match super::ok_to_stop::assess(node, &nodes).await {
            Ok(r) => Response::OkToStopNodes(Box::new(r)),
            Err(e) => failed(e),
        },
        Request::Drain {
            node: which,
            dry_run,
        } => match super::drain::drain(node, &which, dry_run).await {
            Ok(p) => Response::Drain(Box::new(p)),
            Err(e) => failed(e),
        },
        Request::Undrain { node: which } => {
            done(super::drain::change(node, &which, NodeChange::Undrain).await)
        }
        Request::RemoveNode { node: which } => {
            done(super::drain::change(node, &which, NodeChange::Remove).await)
        }
        Request::Maintenance {
            node: which,
            for_ms,
        } => {
            let change = match for_ms {
                Some(for_ms) => NodeChange::EnterMaintenance { for_ms },
                None => NodeChange::ExitMaintenance,
            };
            done(super::drain::change(node, &which, change).await)
        }
        Request::DrainStatus { node: which } => {
            match super::drain::status(node, which.as_deref()).await {
                Ok(d) => Response::Drains(d),
                Err(e) => failed(e),
            }
        }
        Request::MetaDigest => match node.group.digest().await {
            Ok((applied, digest)) => Response::MetaDigest { applied, digest },
            Err(e) => failed(e),
        },
        Request::TierStatus
        | Request::TierRelease { .. }
        | Request::TierPrefetch { .. }
        | Request::TierPin { .. }
        | Request::ColdExtents { .. } => tier_request(node, request).await,
        Request::RevokeCertificate { name } => done(super::revoke::revoke(node, &name).await),
    }
}

/// The cold-tier requests; refused where this agent has no `[tiering]`.
async fn tier_request(node: &Node, request: Request) -> Response {
    let Some(tier) = &node.tier else {
        return failed(AgentError::Invalid(
            "this agent has no cold tier: add a [tiering] section to its config".into(),
        ));
    };
    let answer = match request {
        Request::TierStatus => {
            let mover = node.workers.state_of("tier-mover");
            tier.report(mover)
                .await
                .map(|r| Response::Tier(Box::new(r)))
        }
        Request::TierRelease { inos } => tier.release(&inos).await.map(Response::TierMoved),
        Request::TierPrefetch { inos, wait: true } => {
            tier.prefetch(&inos).await.map(Response::TierMoved)
        }
        Request::TierPrefetch { inos, wait: false } => {
            let tier = tier.clone();
            tokio::spawn(async move {
                if let Err(e) = tier.prefetch(&inos).await {
                    tracing::warn!(error = %e, "prefetch failed");
                }
            });
            Ok(Response::Done(
                "prefetch started; `shoal tier status` shows the hot and cold bytes".into(),
            ))
        }
        Request::TierPin { ino, pinned } => tier.pin(ino, pinned).await.map(Response::Done),
        Request::ColdExtents { ino } => tier.cold_extents(ino).map(Response::ColdExtents),
        _ => {
            return Response::Failed(Failure::new(
                FailureKind::Internal,
                "not a cold-tier request",
            ));
        }
    };
    answer.unwrap_or_else(failed)
}

fn done(r: Result<String, AgentError>) -> Response {
    r.map_or_else(failed, Response::Done)
}

/// A failed request's answer: its kind from the error's cause, and the error's text.
fn failed(e: impl Into<AgentError>) -> Response {
    let e = e.into();
    Response::Failed(Failure::new(e.kind(), e.to_string()))
}
