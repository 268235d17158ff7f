//! A stand-in agent on a Unix socket, for tests of the mount's agent-facing code.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use shoal_agent_api::frame::{read_any_frame, read_frame, write_frame, write_frame_as};
use shoal_agent_api::{
    ApiError, FileAttr, FileKind, FsRequest, FsResponse, Ino, Request, Response, Timestamp,
};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::mpsc;

/// A fresh socket path in a directory of its own.
pub fn socket_path(name: &str) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "shoal-mount-test-{}-{name}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("test dir");
    dir.join("agent.sock")
}

pub fn attr(ino: Ino, size: u64) -> FileAttr {
    FileAttr {
        ino,
        kind: FileKind::File,
        perm: 0o644,
        nlink: 1,
        uid: 0,
        gid: 0,
        size,
        atime: Timestamp::default(),
        mtime: Timestamp::default(),
        ctime: Timestamp::default(),
        rdev: 0,
    }
}

/// `Attr` for requests about an inode, `Done` for the rest.
pub fn attr_answer(r: &Request) -> Response {
    match r {
        Request::Fs(
            FsRequest::Open { ino, .. }
            | FsRequest::Reopen { ino, .. }
            | FsRequest::GetAttr { ino }
            | FsRequest::SetAttr { ino, .. }
            | FsRequest::Write { ino, .. }
            | FsRequest::WriteThenSet { ino, .. },
        ) => Response::Fs(FsResponse::Attr(attr(*ino, 0))),
        Request::JoinReservation { .. } => Response::Joined(None),
        _ => Response::Fs(FsResponse::Done),
    }
}

/// Serves `path`, logging every request on `seen` and answering with `answer` (None:
/// drop the connection unanswered). Aborting the task stops the agent and its connections.
pub fn fake_agent<F>(
    path: PathBuf,
    seen: mpsc::UnboundedSender<Request>,
    answer: F,
) -> tokio::task::JoinHandle<()>
where
    F: Fn(&Request) -> Option<Response> + Clone + Send + Sync + 'static,
{
    serve(path, move |mut stream| {
        let (seen, answer) = (seen.clone(), answer.clone());
        async move {
            while let Ok(Some(req)) = read_frame::<_, Request>(&mut stream).await {
                let reply = answer(&req);
                let _ = seen.send(req);
                let Some(reply) = reply else { return };
                if write_frame(&mut stream, &reply).await.is_err() {
                    return;
                }
            }
        }
    })
}

/// Listens on `path` (replacing what was there) and runs `conn` on every connection, until
/// the task is aborted.
fn serve<F, Fut>(path: PathBuf, conn: F) -> tokio::task::JoinHandle<()>
where
    F: Fn(UnixStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).expect("bind");
    tokio::spawn(async move {
        let mut conns = tokio::task::JoinSet::new();
        while let Ok((stream, _)) = listener.accept().await {
            conns.spawn(conn(stream));
        }
    })
}

/// An agent of protocol `old` (an older release): a frame of another version is answered
/// with its refusal in its own version and the connection closed, as every release does;
/// requests of its version are logged on `seen` and answered as [`attr_answer`] does.
pub fn old_agent(
    path: PathBuf,
    old: u8,
    seen: mpsc::UnboundedSender<Request>,
) -> tokio::task::JoinHandle<()> {
    serve(path, move |mut stream| {
        let seen = seen.clone();
        async move {
            while let Ok(Some((version, req))) = read_any_frame::<_, Request>(&mut stream).await {
                if version != old {
                    let refusal = ApiError::Version {
                        got: version,
                        want: old,
                    };
                    let answer = Response::Error(refusal.to_string());
                    let _ = write_frame_as(&mut stream, old, &answer).await;
                    return;
                }
                let reply = attr_answer(&req);
                let _ = seen.send(req);
                if write_frame_as(&mut stream, old, &reply).await.is_err() {
                    return;
                }
            }
        }
    })
}
