//! The agent's local socket: root-only by default (its final mode from the moment it
//! exists), a client may move only itself into the reservation, and one client cannot act
//! for another mount's session (release its handles, spend its request ids).

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

use shoal_agent_api::{
    AgentClient, FailureKind, FileKind, FsError, FsRequest, FsResponse, Owner, ROOT_INO, Request,
    RequestId, Response,
};
use shoal_tests::{DevCluster, binaries, is_root};

const NOBODY: u32 = 65534;

/// Runs `shoal status` on `socket` as the unprivileged user `nobody`.
fn status_as_nobody(socket: &Path) -> std::process::Output {
    Command::new(binaries().shoal)
        .args(["status", "--socket"])
        .arg(socket)
        .uid(NOBODY)
        .gid(NOBODY)
        .output()
        .expect("run shoal as nobody")
}

/// Lets everyone traverse the directories down to the socket, so that only the socket's
/// own mode decides who may connect.
fn open_path_to(c: &DevCluster, socket: &Path) {
    let mut dir = socket.parent();
    while let Some(d) = dir {
        if !d.starts_with(c.path()) {
            break;
        }
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        dir = d.parent();
    }
}

#[test]
fn socket_is_root_only_unless_the_config_opens_it() {
    if !is_root() {
        eprintln!("SKIPPED: needs root (runs a client as another user)");
        return;
    }
    let c = DevCluster::up(1, 26);
    let socket = c.socket(1);
    open_path_to(&c, &socket);
    let mode = std::fs::metadata(&socket).expect("socket").mode() & 0o777;
    assert_eq!(mode, 0o600, "the socket's mode by default");

    let out = status_as_nobody(&socket);
    assert!(!out.status.success(), "nobody must not get a status");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("ermission denied"), "{err}");

    // Opening it to others takes an explicit setting; then another user gets in.
    c.restart_with_config(1, |cfg| {
        cfg.replace(
            "[admin]\n",
            "[admin]\nsocket_mode = 0o666\nallow_other_users = true\n",
        )
    });
    let mode = std::fs::metadata(&socket).expect("socket").mode() & 0o777;
    assert_eq!(mode, 0o666);
    let out = status_as_nobody(&socket);
    assert!(
        out.status.success(),
        "with allow_other_users: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    c.down();
}

/// Sends `request` to the agent at `socket` from another process (python3 speaking the
/// frame format: `u32 BE length | version | postcard`) and returns the answer.
fn call_from_another_process(socket: &Path, request: &Request) -> Response {
    let mut body = vec![shoal_agent_api::API_VERSION];
    body.extend(postcard::to_allocvec(request).expect("encode"));
    let mut frame = (body.len() as u32).to_be_bytes().to_vec();
    frame.extend(body);
    let hex: String = frame.iter().map(|b| format!("{b:02x}")).collect();
    let script = r#"
import socket, struct, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(bytes.fromhex(sys.argv[2]))
def take(n):
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            sys.exit("connection closed")
        out += chunk
    return out
(n,) = struct.unpack(">I", take(4))
sys.stdout.write(take(n).hex())
"#;
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(socket)
        .arg(hex)
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("hex");
    let bytes: Vec<u8> = (0..text.len() / 2)
        .map(|i| u8::from_str_radix(&text[2 * i..2 * i + 2], 16).expect("hex"))
        .collect();
    postcard::from_bytes(&bytes[1..]).expect("decode answer")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_moves_only_itself_and_acts_only_for_its_own_session() {
    let c = DevCluster::up(1, 191);
    let socket = c.socket(1);
    let mut client = AgentClient::connect(&socket).await.expect("connect");

    // JoinReservation: another process's pid is refused, the caller's own is taken.
    match client
        .call(&Request::JoinReservation { pid: 1 })
        .await
        .expect("call")
    {
        Response::Failed(f) => {
            assert_eq!(f.kind, FailureKind::Refused);
            assert!(f.message.contains("only move itself"), "{f:?}");
        }
        other => panic!("pid 1 was accepted: {other:?}"),
    }
    match client
        .call(&Request::JoinReservation {
            pid: std::process::id(),
        })
        .await
        .expect("call")
    {
        Response::Joined(_) => {}
        other => panic!("own pid refused: {other:?}"),
    }

    // This process (the "mount") creates and opens a file under its session.
    let session = 0x5e55_10d1;
    let created = client
        .call(&Request::Fs(FsRequest::MkNode {
            id: RequestId {
                client: session,
                seq: 1,
            },
            parent: ROOT_INO,
            name: "held".into(),
            kind: FileKind::File,
            perm: 0o644,
            owner: Owner { uid: 0, gid: 0 },
            rdev: 0,
            target: None,
        }))
        .await
        .expect("mknode");
    // Answered under a directory lease (`Unsynced`) or committed: the same entry.
    let ino = match created {
        Response::Fs(r) => match r.into_answer() {
            FsResponse::Entry(a) => a.ino,
            other => panic!("mknode: {other:?}"),
        },
        other => panic!("mknode: {other:?}"),
    };
    let open = FsRequest::Open {
        ino,
        session,
        handle: 1,
        synced: false,
    };
    match client.call(&Request::Fs(open)).await.expect("open") {
        Response::Fs(FsResponse::Opened { .. } | FsResponse::OpenedIn { .. }) => {}
        other => panic!("open: {other:?}"),
    }

    // Another process may neither release that handle nor spend the session's request ids.
    let release = Request::Fs(FsRequest::Release { session, handle: 1 });
    assert_eq!(
        call_from_another_process(&socket, &release),
        Response::Fs(FsResponse::Error(FsError::NotPermitted))
    );
    let unlink = Request::Fs(FsRequest::Unlink {
        id: RequestId {
            client: session,
            seq: 2,
        },
        parent: ROOT_INO,
        name: "held".into(),
    });
    assert_eq!(
        call_from_another_process(&socket, &unlink),
        Response::Fs(FsResponse::Error(FsError::NotPermitted))
    );
    // A session of its own works for that other process.
    let own = Request::Fs(FsRequest::Unlink {
        id: RequestId {
            client: 0x0dd_5e55,
            seq: 1,
        },
        parent: ROOT_INO,
        name: "missing".into(),
    });
    assert_eq!(
        call_from_another_process(&socket, &own),
        Response::Fs(FsResponse::Error(FsError::NotFound))
    );
    // The owner still can.
    match client.call(&release).await.expect("release") {
        Response::Fs(FsResponse::Done) => {}
        other => panic!("the owner's release: {other:?}"),
    }
    c.down();
}
