//! A small client of the agent's filesystem API (what `shoal mount` speaks), for tests
//! that drive the metadata service without a mount.

use shoal_agent_api::{
    AgentClient, FileKind, FsError, FsRequest, FsResponse, Owner, Request, RequestId, Response,
};

use crate::DevCluster;

/// One connection to one node's agent, with its own request ids.
pub struct Fs {
    pub client: AgentClient,
    id: u64,
    seq: u64,
}

impl Fs {
    pub async fn connect(c: &DevCluster, node: u8) -> Fs {
        Fs {
            client: AgentClient::connect(c.socket(node)).await.expect("connect"),
            id: rand_id(node),
            seq: 0,
        }
    }

    pub fn id(&mut self) -> RequestId {
        self.seq += 1;
        RequestId {
            client: self.id,
            seq: self.seq,
        }
    }

    /// Sends `r` and answers as the agent did; a change answered under a directory
    /// lease is synced first (`FsRequest::Sync`, as a mount's fsync), so what a test is
    /// answered is committed (a failed sync is the answer).
    pub async fn call(&mut self, r: FsRequest) -> FsResponse {
        let target = r.sync_target();
        let answer = self.send(r).await;
        match (answer, target) {
            (FsResponse::Unsynced(answer), Some(ino)) => {
                let session = self.id;
                match self.send(FsRequest::Sync { ino, session }).await {
                    FsResponse::Synced { .. } => answer.into_response(),
                    failed => failed,
                }
            }
            (answer, _) => answer.into_answer(),
        }
    }

    async fn send(&mut self, r: FsRequest) -> FsResponse {
        match self.client.call(&Request::Fs(r)).await.expect("call") {
            Response::Fs(r) => r,
            other => panic!("unexpected {other:?}"),
        }
    }

    pub async fn mknod(&mut self, parent: u64, name: &str, kind: FileKind) -> u64 {
        let id = self.id();
        let r = self
            .call(FsRequest::MkNode {
                id,
                parent,
                name: name.into(),
                kind,
                perm: 0o755,
                owner: Owner { uid: 0, gid: 0 },
                rdev: 0,
                target: None,
            })
            .await;
        match r {
            FsResponse::Entry(a) | FsResponse::EntryAt { attr: a, .. } => a.ino,
            other => panic!("mknod {name}: {other:?}"),
        }
    }

    pub async fn write(&mut self, ino: u64, offset: u64, data: Vec<u8>) -> u64 {
        let id = self.id();
        match self
            .call(FsRequest::Write {
                id,
                ino,
                offset,
                data,
            })
            .await
        {
            FsResponse::Attr(a) => a.size,
            other => panic!("write: {other:?}"),
        }
    }

    /// Makes the file `dir/name` and writes `data` into it; the file's inode, or the error
    /// the write failed with.
    pub async fn try_write_new(
        &mut self,
        dir: u64,
        name: &str,
        data: Vec<u8>,
    ) -> Result<u64, shoal_agent_api::FsError> {
        let ino = self.mknod(dir, name, shoal_agent_api::FileKind::File).await;
        let id = self.id();
        match self
            .call(FsRequest::Write {
                id,
                ino,
                offset: 0,
                data,
            })
            .await
        {
            FsResponse::Attr(_) => Ok(ino),
            FsResponse::Error(e) => Err(e),
            other => panic!("write {name}: {other:?}"),
        }
    }

    pub async fn read(&mut self, ino: u64, offset: u64, len: u32) -> Vec<u8> {
        match self.call(FsRequest::Read { ino, offset, len }).await {
            FsResponse::Data(d) => d,
            other => panic!("read: {other:?}"),
        }
    }

    pub async fn open(&mut self, ino: u64) {
        let r = self
            .call(FsRequest::Open {
                ino,
                session: self.id,
                handle: 1,
                synced: false,
            })
            .await;
        assert!(
            matches!(r, FsResponse::Opened { .. } | FsResponse::OpenedIn { .. }),
            "{r:?}"
        );
    }

    /// Announces handle 1 on `ino` again, as a mount does after reconnecting (the file may
    /// have no name left).
    pub async fn reopen(&mut self, ino: u64) {
        let r = self
            .call(FsRequest::Reopen {
                ino,
                session: self.id,
                handle: 1,
            })
            .await;
        assert!(matches!(r, FsResponse::Attr(_)), "{r:?}");
    }

    pub async fn lookup(&mut self, parent: u64, name: &str) -> Result<u64, FsError> {
        match self
            .call(FsRequest::Lookup {
                parent,
                name: name.into(),
            })
            .await
        {
            FsResponse::Entry(a) | FsResponse::EntryAt { attr: a, .. } => Ok(a.ino),
            FsResponse::Error(e) => Err(e),
            other => panic!("lookup: {other:?}"),
        }
    }
}

pub fn rand_id(node: u8) -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1);
    t ^ ((node as u64) << 56)
}

/// Deterministic test bytes.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1] ^ seed)
        .collect()
}
