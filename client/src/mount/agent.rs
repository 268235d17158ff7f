//! The mount's connections to its local agent: a small pool, and the retry that carries a
//! request across an agent restart.
//!
//! A request that fails because the socket is gone or broke, or that the agent answers
//! with `Unavailable`, is sent again — the same request, with the same [`RequestId`], so
//! the metadata service applies it once — until it succeeds or `--retry-for` has passed.
//! After a failure every new connection first sends `Reopen` for the handles still open,
//! then `JoinReservation` (a restarted agent has a new cgroup), so a restarted agent knows
//! them again before it serves anything else from this mount. An agent restart is thus a
//! stall, not an error: `--retry-for` is 10 min by default, 30 min at most.
//!
//! Pool: 16 connections, at most 12 carrying file data (a write waits until its stripe is
//! durable, and lookups must not queue behind it). While files are open the mount pings
//! its agent every 5 s, even when idle, so a restarted agent hears of them soon.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fuser::Errno;
use shoal_agent_api::{
    API_VERSION, AgentClient, ApiError, FileAttr, FsError, FsRequest, FsResponse, Ino, ROOT_INO,
    Request, RequestId, Response,
};
use tokio::sync::Semaphore;

/// What runs with the attributes of an answer made under a directory lease.
type OnUnsynced = Box<dyn Fn(&FileAttr, Option<u64>) + Send + Sync>;

/// Most connections the pool opens to the agent.
const MAX_CONNECTIONS: usize = 16;
/// Of those, most that carry file data (`Read`, `Write`): a write waits until its stripe is
/// durable, and lookups must not queue behind them.
const MAX_DATA_CONNECTIONS: usize = 12;
/// How often the mount pings its agent while files are open (see `Agent::keepalive`).
const KEEPALIVE: Duration = Duration::from_secs(5);
/// While the cluster stays unavailable, how often the mount says so again (with the
/// agent's latest reason).
const UNAVAILABLE_REMINDER: Duration = Duration::from_secs(30);
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// Why a request got no answer.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The agent stayed unreachable (or the cluster unavailable) for all of `--retry-for`.
    #[error("gave up after {0:?}: {1}")]
    GaveUp(Duration, String),
    /// A failure that retrying cannot fix (protocol mismatch, undecodable frame).
    #[error("{0}")]
    Fatal(ApiError),
}

struct Conn {
    client: AgentClient,
    /// The failure epoch this connection was opened in.
    epoch: u64,
}

/// The local agent, as the mount reaches it.
pub struct Agent {
    socket: PathBuf,
    /// Random per mount process: the `session` of every handle and the `client` of every
    /// [`RequestId`].
    session: u64,
    seq: AtomicU64,
    retry_for: Duration,
    idle: Mutex<Vec<Conn>>,
    slots: Semaphore,
    data_slots: Semaphore,
    /// Grows at every connection failure; connections of older epochs are not reused.
    epoch: AtomicU64,
    /// The newest epoch whose handles were re-opened.
    reopened: tokio::sync::Mutex<u64>,
    /// Open file handles (handle → inode), re-opened after a failure.
    handles: tokio::sync::Mutex<BTreeMap<u64, Ino>>,
    /// The protocol the agent last answered in.
    version: AtomicU8,
    reachable: AtomicBool,
    available: AtomicBool,
    /// While the cluster is unavailable: when the mount last said so.
    unavailable_said: Mutex<Option<Instant>>,
    /// Called when a new connection follows a failure, before it serves anything.
    on_reconnect: std::sync::OnceLock<Box<dyn Fn() + Send + Sync>>,
    /// Called with the attributes of every answer made under a directory lease.
    on_unsynced: std::sync::OnceLock<OnUnsynced>,
    /// Changes the agent answered before they were committed (`FsResponse::Unsynced`,
    /// protocol 12 on), and how many of them a `Sync` made durable.
    answered: AtomicU64,
    synced: AtomicU64,
    /// The connection failed while answered changes were not synced: the agent may have
    /// restarted and lost them. The next fsync asks, and says so (EIO) once when they
    /// may be gone.
    maybe_lost: AtomicBool,
    /// The agent process that answered the last `Sync` (`FsResponse::Synced`).
    synced_by: AtomicU64,
    /// Changes (requests with a `sync_target`) sent so far, counted as each is sent, and
    /// reconnects (see [`Agent::changes_sent`]).
    changes: AtomicU64,
    /// Changes sent and not answered yet.
    changes_open: AtomicU64,
}

/// A change counted open while its request is under way.
struct OpenChange<'a>(&'a AtomicU64);

impl Drop for OpenChange<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Agent {
    pub fn new(socket: PathBuf, retry_for: Duration) -> Self {
        Agent {
            socket,
            session: rand::random::<u64>() | 1,
            seq: AtomicU64::new(1),
            retry_for,
            idle: Mutex::new(Vec::new()),
            slots: Semaphore::new(MAX_CONNECTIONS),
            data_slots: Semaphore::new(MAX_DATA_CONNECTIONS),
            epoch: AtomicU64::new(0),
            reopened: tokio::sync::Mutex::new(0),
            handles: tokio::sync::Mutex::new(BTreeMap::new()),
            version: AtomicU8::new(API_VERSION),
            reachable: AtomicBool::new(true),
            available: AtomicBool::new(true),
            unavailable_said: Mutex::new(None),
            on_reconnect: std::sync::OnceLock::new(),
            on_unsynced: std::sync::OnceLock::new(),
            answered: AtomicU64::new(0),
            synced: AtomicU64::new(0),
            maybe_lost: AtomicBool::new(false),
            synced_by: AtomicU64::new(0),
            changes: AtomicU64::new(0),
            changes_open: AtomicU64::new(0),
        }
    }

    /// Makes durable what the agent answered for this mount in directory `ino` or of
    /// inode `ino` (and everything answered before): fsync and fsyncdir. EIO when a change
    /// was refused at its commit, or may have been lost with a restarted agent.
    pub async fn sync(&self, ino: Ino) -> Result<(), Errno> {
        if !self.speaks(shoal_agent_api::SYNC_SINCE) {
            return Ok(());
        }
        let upto = self.answered.load(Ordering::Acquire);
        let session = self.session;
        let answer = self.fs(FsRequest::Sync { ino, session }).await;
        let lost = self.maybe_lost.swap(false, Ordering::AcqRel);
        let (instance, clean_start) = match answer? {
            FsResponse::Synced {
                instance,
                clean_start,
            } => (instance, clean_start),
            _ => (0, false),
        };
        let before = self.synced_by.swap(instance, Ordering::AcqRel);
        // The same agent process as before, or one whose predecessor committed all it
        // answered before it stopped: nothing was lost.
        if lost && before != instance && !clean_start {
            tracing::warn!(
                ino,
                "the agent restarted without committing changes it had answered and nobody synced: reporting EIO"
            );
            return Err(Errno::EIO);
        }
        self.synced.fetch_max(upto, Ordering::AcqRel);
        Ok(())
    }

    /// Sets what runs when the mount reconnects after a failure (the agent may be a new
    /// process that knows nothing of what the old one told the mount).
    pub fn on_reconnect(&self, f: impl Fn() + Send + Sync + 'static) {
        let _ = self.on_reconnect.set(Box::new(f));
    }

    /// Sets what runs with the attributes of an answer made under a directory lease, and
    /// the change count when its request was sent ([`Agent::changes_sent`]) when the
    /// answer is the agent's latest view of the inode: no other change of this mount was
    /// under way when it was sent, and none was sent since (the agent answers concurrent
    /// requests in any order).
    pub fn on_unsynced(&self, f: impl Fn(&FileAttr, Option<u64>) + Send + Sync + 'static) {
        let _ = self.on_unsynced.set(Box::new(f));
    }

    /// Whether the agent, as it last answered, speaks protocol `version` or a later one.
    pub fn speaks(&self, version: u8) -> bool {
        self.version.load(Ordering::Relaxed) >= version
    }

    /// The agent's socket.
    #[cfg(test)]
    pub fn socket(&self) -> &std::path::Path {
        &self.socket
    }

    /// Closes the idle connections (the next request connects anew).
    #[cfg(test)]
    pub fn forget_connections(&self) {
        if let Ok(mut idle) = self.idle.lock() {
            idle.clear();
        }
    }

    pub fn session(&self) -> u64 {
        self.session
    }

    /// A fresh id for a mutating request.
    pub fn next_id(&self) -> RequestId {
        RequestId {
            client: self.session,
            seq: self.seq.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// Records an open handle (before its `Open` is sent), so that it is re-opened after
    /// an agent restart.
    pub async fn remember_handle(&self, handle: u64, ino: Ino) {
        self.handles.lock().await.insert(handle, ino);
    }

    /// While files are open, asks the agent something cheap every few seconds: after an
    /// agent restart this reconnects and re-announces the open handles even when no file
    /// operation comes (the agent keeps unlinked files alive only for announced handles).
    pub async fn keepalive(self: Arc<Self>) {
        let mut tick = tokio::time::interval(KEEPALIVE);
        loop {
            tick.tick().await;
            if self.handles.lock().await.is_empty() {
                continue;
            }
            let _ = self
                .call(&Request::Fs(FsRequest::GetAttr { ino: ROOT_INO }))
                .await;
        }
    }

    /// Forgets a handle (before its `Release` is sent).
    pub async fn forget_handle(&self, handle: u64) {
        self.handles.lock().await.remove(&handle);
    }

    /// How many changes (requests that change an inode or a directory) this mount has
    /// sent so far, and reconnects (the agent may be another process): an answer about an
    /// inode stays the agent's view of it only while this count does not move.
    pub fn changes_sent(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }

    /// Sends a filesystem request, retrying as the module doc says; the answer, or the
    /// errno the kernel gets.
    pub async fn fs(&self, request: FsRequest) -> Result<FsResponse, Errno> {
        let what = request.name();
        let _data_slot = match request {
            FsRequest::Read { .. } | FsRequest::Write { .. } | FsRequest::WriteThenSet { .. } => {
                Some(self.data_slots.acquire().await.map_err(|_| Errno::EIO)?)
            }
            _ => None,
        };
        let (at, alone, _open) = if request.sync_target().is_some() {
            let before = self.changes_open.fetch_add(1, Ordering::AcqRel);
            let open = OpenChange(&self.changes_open);
            let at = self.changes.fetch_add(1, Ordering::AcqRel) + 1;
            (at, before == 0, Some(open))
        } else {
            (self.changes_sent(), true, None)
        };
        let request = Request::Fs(request);
        match self.call(&request).await {
            Ok(Response::Fs(FsResponse::Error(e))) => {
                tracing::debug!(request = what, "agent: {e}");
                Err(Errno::from_i32(e.errno()))
            }
            Ok(Response::Fs(FsResponse::Unsynced(r))) => {
                // Answered under a directory lease: durable after the next `Sync`.
                self.answered.fetch_add(1, Ordering::AcqRel);
                let parent = r.parent().cloned();
                let r = r.into_response();
                if let Some(f) = self.on_unsynced.get() {
                    let latest = (alone && self.changes_sent() == at).then_some(at);
                    if let FsResponse::Entry(a) | FsResponse::Attr(a) = &r {
                        f(a, latest);
                    }
                    // The directory the change was made in, as the change left it.
                    if let Some(p) = &parent {
                        f(p, latest);
                    }
                }
                Ok(r)
            }
            Ok(Response::Fs(r)) => Ok(r),
            Ok(Response::Error(e)) => {
                tracing::warn!(request = what, "agent refused: {e}");
                Err(Errno::EIO)
            }
            Ok(Response::Failed(f)) => {
                tracing::warn!(
                    request = what,
                    kind = f.kind.name(),
                    "agent refused: {}",
                    f.message
                );
                Err(Errno::EIO)
            }
            Ok(_) => {
                tracing::warn!(
                    request = what,
                    "agent answered with a non-filesystem message"
                );
                Err(Errno::EIO)
            }
            Err(e) => {
                tracing::error!(request = what, "{e}");
                Err(Errno::EIO)
            }
        }
    }

    /// Sends one request and waits for its answer, retrying as the module doc says.
    pub async fn call(&self, request: &Request) -> Result<Response, CallError> {
        let start = Instant::now();
        let mut backoff = FIRST_BACKOFF;
        loop {
            let why = match self.try_once(request).await {
                Ok(Response::Fs(FsResponse::Error(FsError::Unavailable(why)))) => {
                    self.note_reachable();
                    self.note_unavailable(&why);
                    format!("cluster unavailable: {why}")
                }
                Ok(response) => {
                    self.note_reachable();
                    if !self.available.swap(true, Ordering::Relaxed) {
                        tracing::info!("cluster available again");
                    }
                    return Ok(response);
                }
                Err(e) if e.is_retryable() => {
                    self.epoch.fetch_add(1, Ordering::AcqRel);
                    // The agent may be gone with what it answered: no earlier answer is
                    // its view any more (nor one of the old connection still on its way).
                    self.changes.fetch_add(1, Ordering::AcqRel);
                    if self.reachable.swap(false, Ordering::Relaxed) {
                        tracing::warn!(
                            "agent unreachable, retrying for up to {:?}: {e}",
                            self.retry_for
                        );
                    }
                    e.to_string()
                }
                Err(e) => return Err(CallError::Fatal(e)),
            };
            let waited = start.elapsed();
            if waited >= self.retry_for {
                return Err(CallError::GaveUp(waited, why));
            }
            tokio::time::sleep(backoff.min(self.retry_for - waited)).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// Says that the cluster is unavailable and why: when it becomes so, then every
    /// [`UNAVAILABLE_REMINDER`] while it stays so (the reason may change meanwhile).
    fn note_unavailable(&self, why: &str) {
        let became = self.available.swap(false, Ordering::Relaxed);
        let Ok(mut said) = self.unavailable_said.lock() else {
            return;
        };
        let now = Instant::now();
        let due = became || said.is_none_or(|at| now.duration_since(at) >= UNAVAILABLE_REMINDER);
        if due {
            *said = Some(now);
            tracing::warn!(
                "cluster unavailable, requests wait up to {:?} (--retry-for) before they fail: {why}",
                self.retry_for
            );
        }
    }

    fn note_reachable(&self) {
        if !self.reachable.swap(true, Ordering::Relaxed) {
            tracing::info!("agent reachable again");
        }
    }

    async fn try_once(&self, request: &Request) -> Result<Response, ApiError> {
        let _slot = self
            .slots
            .acquire()
            .await
            .map_err(|_| ApiError::Unexpected("connection pool closed".into()))?;
        let mut conn = self.checkout().await?;
        let response = match conn.client.call(request).await {
            Ok(response) => response,
            Err(e) => {
                // An agent that refused this request for its protocol names its own.
                if let ApiError::Version { got, .. } = e {
                    self.version.store(got, Ordering::Relaxed);
                }
                return Err(e);
            }
        };
        self.version.store(conn.client.version(), Ordering::Relaxed);
        if let Ok(mut idle) = self.idle.lock() {
            idle.push(conn);
        }
        Ok(response)
    }

    /// An idle connection of the current epoch, or a new one (re-opening the handles
    /// first when a failure happened since they were last re-opened).
    async fn checkout(&self) -> Result<Conn, ApiError> {
        let epoch = self.epoch.load(Ordering::Acquire);
        if let Ok(mut idle) = self.idle.lock() {
            while let Some(conn) = idle.pop() {
                if conn.epoch == epoch {
                    return Ok(conn);
                }
            }
        }
        let mut conn = Conn {
            client: AgentClient::connect(&self.socket).await?,
            epoch,
        };
        if epoch > 0 {
            self.reopen(&mut conn).await?;
        }
        Ok(conn)
    }

    async fn reopen(&self, conn: &mut Conn) -> Result<(), ApiError> {
        let mut done = self.reopened.lock().await;
        if *done >= conn.epoch {
            return Ok(());
        }
        if let Some(f) = self.on_reconnect.get() {
            f();
        }
        if self.answered.load(Ordering::Acquire) > self.synced.load(Ordering::Acquire)
            && self.speaks(shoal_agent_api::SYNC_SINCE)
        {
            self.maybe_lost.store(true, Ordering::Release);
        }
        // Held throughout, so a handle released meanwhile is not opened again after its
        // Release.
        let handles = self.handles.lock().await;
        if !handles.is_empty() {
            tracing::info!(handles = handles.len(), "re-opening files on the agent");
        }
        for (&handle, &ino) in handles.iter() {
            // Not synced: a restarted agent's replica may be behind what the mount saw.
            let open = Request::Fs(FsRequest::Reopen {
                ino,
                session: self.session,
                handle,
            });
            match conn.client.call(&open).await? {
                Response::Fs(FsResponse::Attr(_)) => {}
                other => tracing::warn!(handle, ino, "re-open failed: {other:?}"),
            }
        }
        // The agent restarted: join its reservation again (a crashed agent's group was
        // replaced, with this process moved out).
        let join = Request::JoinReservation {
            pid: std::process::id(),
        };
        match conn.client.call(&join).await? {
            Response::Joined(_) => {}
            other => tracing::warn!("could not rejoin the agent's reservation: {other:?}"),
        }
        *done = conn.epoch;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn unreachable_agent_fails_after_retry_for() {
        let dir = std::env::temp_dir().join(format!("shoal-no-agent-{}", std::process::id()));
        let agent = Agent::new(dir.join("missing.sock"), Duration::from_millis(200));
        let start = Instant::now();
        let r = agent.call(&Request::Status).await;
        assert!(matches!(r, Err(CallError::GaveUp(..))), "{r:?}");
        assert!(start.elapsed() >= Duration::from_millis(200));
        assert_eq!(agent.fs(FsRequest::StatFs).await, Err(Errno::EIO));
    }

    use super::super::testkit::{attr, attr_answer, fake_agent, socket_path};
    use shoal_agent_api::{SetAttr, UnsyncedAnswer};
    use tokio::sync::mpsc;

    #[tokio::test]
    async fn a_restarted_agent_gets_open_handles_first_and_the_same_request_again() {
        let sock = socket_path("restart");
        let (tx, mut seen) = mpsc::unbounded_channel();
        // The first agent dies on SetAttr without answering.
        let first = fake_agent(sock.clone(), tx.clone(), |r| match r {
            Request::Fs(FsRequest::SetAttr { .. }) => None,
            r => Some(attr_answer(r)),
        });
        let agent = Arc::new(Agent::new(sock.clone(), Duration::from_secs(20)));
        agent.remember_handle(7, 42).await;
        let open = FsRequest::Open {
            ino: 42,
            session: agent.session(),
            handle: 7,
            synced: false,
        };
        assert!(matches!(
            agent.fs(open.clone()).await,
            Ok(FsResponse::Attr(_))
        ));
        assert_eq!(seen.recv().await, Some(Request::Fs(open.clone())));

        let id = agent.next_id();
        let setattr = FsRequest::SetAttr {
            id,
            ino: 42,
            set: SetAttr::default(),
        };
        let call = tokio::spawn({
            let agent = agent.clone();
            let setattr = setattr.clone();
            async move { agent.fs(setattr).await }
        });
        assert_eq!(seen.recv().await, Some(Request::Fs(setattr.clone())));
        first.abort();
        let _ = first.await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let _second = fake_agent(sock, tx, |r| Some(attr_answer(r)));
        assert!(matches!(call.await.expect("join"), Ok(FsResponse::Attr(_))));
        let reopen = FsRequest::Reopen {
            ino: 42,
            session: agent.session(),
            handle: 7,
        };
        assert_eq!(
            seen.recv().await,
            Some(Request::Fs(reopen)),
            "the handle announced again (its file may have no name left)"
        );
        assert_eq!(
            seen.recv().await,
            Some(Request::JoinReservation {
                pid: std::process::id()
            }),
            "the mount joins the new agent's reservation"
        );
        assert_eq!(seen.recv().await, Some(Request::Fs(setattr)));
    }

    /// A log sink for one test's `tracing` output.
    #[derive(Clone, Default)]
    struct CapturedLog(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for CapturedLog {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("log").extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_cluster_without_metadata_group_is_named_in_the_log_and_fails_after_retry_for() {
        let log = CapturedLog::default();
        let sink = log.clone();
        let _guard = tracing::subscriber::set_default(
            tracing_subscriber::fmt()
                .with_writer(move || sink.clone())
                .with_ansi(false)
                .finish(),
        );
        let why = "no metadata group yet: 2 of 3 nodes seen; bootstrap_expect = 3";
        let sock = socket_path("unformed");
        let (tx, mut seen) = mpsc::unbounded_channel();
        let _agent = fake_agent(sock.clone(), tx, move |_| {
            Some(Response::Fs(FsResponse::Error(FsError::Unavailable(
                why.into(),
            ))))
        });
        let agent = Agent::new(sock, Duration::from_millis(300));
        let lookup = FsRequest::Lookup {
            parent: ROOT_INO,
            name: "f".into(),
        };
        for _ in 0..3 {
            assert_eq!(agent.fs(lookup.clone()).await, Err(Errno::EIO));
        }
        let mut sent = 0;
        while seen.try_recv().is_ok() {
            sent += 1;
        }
        assert!(
            sent > 3,
            "each request is sent again until --retry-for passed"
        );
        let text = String::from_utf8(log.0.lock().expect("log").clone()).expect("utf-8");
        let warned: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("WARN") && l.contains(why))
            .collect();
        assert_eq!(warned.len(), 1, "said once, not per retry:\n{text}");
        assert!(warned[0].contains("300ms (--retry-for)"), "{text}");
        let failed = text
            .lines()
            .filter(|l| l.contains("ERROR") && l.contains("gave up") && l.contains(why))
            .count();
        assert_eq!(failed, 3, "each failed request names the reason:\n{text}");
    }

    #[test]
    fn request_ids_share_the_session_and_grow() {
        let agent = Agent::new("/nonexistent".into(), Duration::ZERO);
        let a = agent.next_id();
        let b = agent.next_id();
        assert_eq!(a.client, agent.session());
        assert_eq!(b.client, a.client);
        assert!(b.seq > a.seq);
    }

    #[tokio::test]
    async fn changes_are_counted_as_sent_and_an_unsynced_answer_carries_its_count() {
        let sock = socket_path("changes");
        let (tx, _seen) = mpsc::unbounded_channel();
        let _agent = fake_agent(sock.clone(), tx, |r| {
            Some(match attr_answer(r) {
                Response::Fs(FsResponse::Attr(a))
                    if matches!(r, Request::Fs(FsRequest::SetAttr { .. })) =>
                {
                    Response::Fs(FsResponse::Attr(a).unsynced())
                }
                other => other,
            })
        });
        let agent = Agent::new(sock, Duration::from_secs(5));
        let (hook, mut heard) = mpsc::unbounded_channel();
        agent.on_unsynced(move |a, at| {
            let _ = hook.send((a.ino, at));
        });
        assert_eq!(agent.changes_sent(), 0);
        agent
            .fs(FsRequest::GetAttr { ino: 9 })
            .await
            .expect("getattr");
        assert_eq!(agent.changes_sent(), 0, "a query is no change");
        let set = |ino| FsRequest::SetAttr {
            id: agent.next_id(),
            ino,
            set: SetAttr::default(),
        };
        agent.fs(set(9)).await.expect("setattr");
        agent.fs(set(10)).await.expect("setattr");
        assert_eq!(agent.changes_sent(), 2);
        assert_eq!(heard.recv().await, Some((9, Some(1))));
        assert_eq!(heard.recv().await, Some((10, Some(2))));
    }

    #[tokio::test]
    async fn an_answer_with_its_directorys_attributes_hands_both_on() {
        let sock = socket_path("parent");
        let (tx, _seen) = mpsc::unbounded_channel();
        let mut dir = attr(5, 0);
        dir.kind = shoal_agent_api::FileKind::Dir;
        let parent = dir.clone();
        let _agent = fake_agent(sock.clone(), tx, move |r| {
            Some(match r {
                Request::Fs(FsRequest::Unlink { .. }) => {
                    Response::Fs(FsResponse::Unsynced(UnsyncedAnswer::DoneIn {
                        parent: parent.clone(),
                    }))
                }
                Request::Fs(FsRequest::MkNode { .. }) => {
                    Response::Fs(FsResponse::Unsynced(UnsyncedAnswer::EntryIn {
                        attr: attr(8, 0),
                        parent: parent.clone(),
                    }))
                }
                other => attr_answer(other),
            })
        });
        let agent = Agent::new(sock, Duration::from_secs(5));
        let (hook, mut heard) = mpsc::unbounded_channel();
        agent.on_unsynced(move |a, at| {
            let _ = hook.send((a.ino, at));
        });
        let unlink = FsRequest::Unlink {
            id: agent.next_id(),
            parent: 5,
            name: "x".into(),
        };
        assert_eq!(agent.fs(unlink).await.expect("unlink"), FsResponse::Done);
        assert_eq!(heard.recv().await, Some((5, Some(1))));
        let mknode = FsRequest::MkNode {
            id: agent.next_id(),
            parent: 5,
            name: "y".into(),
            kind: shoal_agent_api::FileKind::File,
            perm: 0o644,
            owner: shoal_agent_api::Owner { uid: 0, gid: 0 },
            rdev: 0,
            target: None,
        };
        assert_eq!(
            agent.fs(mknode).await.expect("mknode"),
            FsResponse::Entry(attr(8, 0))
        );
        assert_eq!(heard.recv().await, Some((8, Some(2))), "the entry first");
        assert_eq!(heard.recv().await, Some((5, Some(2))), "then its directory");
    }
}
