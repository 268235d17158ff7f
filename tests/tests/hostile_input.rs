//! Malformed input from a local client reaches an agent as an error answer (of kind
//! `invalid`), never as a panic or an allocation the input chose: a stripe record with an
//! out-of-range shard index, a read of 4 GiB from a small file, a frame that claims more
//! than the limit.

use shoal_agent_api::{
    API_VERSION, AgentClient, FailureKind, FileKind, FsError, FsRequest, FsResponse, NodeId,
    ROOT_INO, Request, Response,
};
use shoal_tests::DevCluster;
use shoal_tests::fs_api::{Fs, pattern};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_are_refused_and_the_agent_serves_on() {
    let c = DevCluster::up(3, 192);
    let mut client = AgentClient::connect(c.socket(1)).await.expect("connect");
    let record = match client
        .call(&Request::WriteStripe {
            data: pattern(300_000, 3),
            ec: None,
        })
        .await
        .expect("write stripe")
    {
        Response::StripeWritten(r) => r,
        other => panic!("{other:?}"),
    };
    // Shard 0 on a node that does not exist (so the read decodes), and a location that
    // names shard 200 of a 2+1 stripe.
    let mut bad = record.clone();
    bad.shards[0].node = NodeId(0x1234_5678);
    bad.shards[2].index = 200;
    let answer = client
        .call(&Request::ReadStripe {
            record: bad,
            offset: 0,
            len: 1000,
        })
        .await
        .expect("an answer, not a dropped connection");
    assert!(
        matches!(&answer, Response::Failed(f)
            if f.kind == FailureKind::Invalid && f.message.contains("shard index 200")),
        "{answer:?}"
    );
    // A 4 GiB read of a 10-byte file is refused, not allocated.
    let mut fs = Fs::connect(&c, 1).await;
    let ino = fs.mknod(ROOT_INO, "small", FileKind::File).await;
    fs.write(ino, 0, pattern(10, 1)).await;
    let r = fs
        .call(FsRequest::Read {
            ino,
            offset: 0,
            len: u32::MAX,
        })
        .await;
    assert_eq!(r, FsResponse::Error(FsError::Invalid));
    // A frame that claims 64 MiB and a byte more is refused before its body.
    let mut raw = tokio::net::UnixStream::connect(c.socket(1))
        .await
        .expect("connect");
    raw.write_all(&((64u32 << 20) + 1).to_be_bytes())
        .await
        .expect("write");
    let mut reply = Vec::new();
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        raw.read_to_end(&mut reply),
    )
    .await;
    let refusal = reply
        .get(4..)
        .and_then(|body| shoal_agent_api::frame::decode_body(body, API_VERSION..=API_VERSION).ok());
    assert!(
        matches!(&refusal, Some((_, Response::Failed(f)))
            if f.kind == FailureKind::Invalid && f.message.contains("exceeds the limit")),
        "{reply:?}"
    );
    // And the agent still serves.
    assert!(matches!(
        client.call(&Request::Status).await.expect("status"),
        Response::Status(_)
    ));
    assert_eq!(fs.read(ino, 0, 100).await, pattern(10, 1));
}
