//! QUIC RPC between real endpoints on loopback: mutual TLS lets cluster members talk and
//! keeps everyone else out.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    SanType,
};
use serde::{Deserialize, Serialize};
use shoal_mesh::{MeshError, MeshMetrics, NodeId, Rpc, TlsFiles, Transport};

const NAME: &str = "shoal-node";

#[derive(Serialize, Deserialize)]
struct Echo(String);

impl Rpc for Echo {
    const ENDPOINT: &'static str = "test/echo";
    type Response = String;
}

struct Ca {
    params: CertificateParams,
    key: KeyPair,
    pem: String,
}

fn new_ca(cn: &str) -> Ca {
    let key = KeyPair::generate().expect("key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
    params.distinguished_name.push(DnType::CommonName, cn);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let pem = params.self_signed(&key).expect("self-sign").pem();
    Ca { params, key, pem }
}

/// Writes a certificate for node `id` named `name`, signed by `signer`, and a trust root of
/// `trust` into `dir`.
fn node_files(dir: &Path, name: &str, id: u64, signer: &Ca, trust: &Ca) -> TlsFiles {
    node_files_issued(dir, name, id, 1_000, signer, trust)
}

fn node_files_issued(
    dir: &Path,
    name: &str,
    id: u64,
    issued_ms: u64,
    signer: &Ca,
    trust: &Ca,
) -> TlsFiles {
    let key = KeyPair::generate().expect("key");
    let mut params = CertificateParams::new(vec![NAME.to_owned()]).expect("params");
    params.distinguished_name.push(DnType::CommonName, name);
    params.subject_alt_names.push(SanType::URI(
        shoal_mesh::node_uri(NodeId(id), issued_ms)
            .try_into()
            .expect("ia5"),
    ));
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let issuer = Issuer::from_params(&signer.params, &signer.key);
    let cert = params.signed_by(&key, &issuer).expect("sign");
    let files = TlsFiles {
        ca_cert: dir.join(format!("{name}-ca.pem")),
        node_cert: dir.join(format!("{name}.pem")),
        node_key: dir.join(format!("{name}.key")),
    };
    std::fs::write(&files.ca_cert, &trust.pem).expect("write");
    std::fs::write(&files.node_cert, cert.pem()).expect("write");
    std::fs::write(&files.node_key, key.serialize_pem()).expect("write");
    files
}

fn serve(files: &TlsFiles, id: u64, metrics: MeshMetrics) -> std::sync::Arc<Transport> {
    let addr: SocketAddr = "127.0.0.1:0".parse().expect("addr");
    let t = Transport::bind(addr, files, NAME, NodeId(id), metrics).expect("bind");
    t.register(move |from: NodeId, Echo(text)| async move { Ok(format!("{id}<-{from}: {text}")) });
    t.serve();
    t
}

#[tokio::test]
async fn members_of_one_cluster_call_each_other() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = new_ca("cluster");
    let a = serve(
        &node_files(dir.path(), "a", 1, &ca, &ca),
        1,
        MeshMetrics::unregistered(),
    );
    let b = serve(
        &node_files(dir.path(), "b", 2, &ca, &ca),
        2,
        MeshMetrics::unregistered(),
    );
    let b_addr = b.local_addr().expect("addr");
    let got = a
        .call(b_addr, &Echo("hi".into()), Duration::from_secs(5))
        .await
        .expect("call");
    assert_eq!(got, format!("2<-{}: hi", NodeId(1)));
}

#[tokio::test]
async fn unknown_endpoint_is_a_remote_error() {
    #[derive(Serialize, Deserialize)]
    struct Nobody;
    impl Rpc for Nobody {
        const ENDPOINT: &'static str = "test/nobody";
        type Response = ();
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = new_ca("cluster");
    let a = serve(
        &node_files(dir.path(), "a", 1, &ca, &ca),
        1,
        MeshMetrics::unregistered(),
    );
    let b = serve(
        &node_files(dir.path(), "b", 2, &ca, &ca),
        2,
        MeshMetrics::unregistered(),
    );
    let err = a
        .call(
            b.local_addr().expect("addr"),
            &Nobody,
            Duration::from_secs(5),
        )
        .await
        .expect_err("no handler");
    assert!(matches!(err, MeshError::RpcRemote { .. }), "{err}");
    assert!(!err.is_retryable());
}

#[tokio::test]
async fn client_with_foreign_certificate_is_rejected_and_counted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = new_ca("cluster");
    let foreign = new_ca("elsewhere");
    let server_metrics = MeshMetrics::unregistered();
    let server = serve(
        &node_files(dir.path(), "s", 1, &ca, &ca),
        1,
        server_metrics.clone(),
    );
    // Trusts the cluster CA (so it would accept the server) but presents a foreign cert.
    let files = node_files(dir.path(), "x", 9, &foreign, &foreign);
    std::fs::write(&files.ca_cert, &ca.pem).expect("write");
    let addr: SocketAddr = "127.0.0.1:0".parse().expect("addr");
    // Its own start-up check refuses the certificate ...
    let err = Transport::bind(addr, &files, NAME, NodeId(9), MeshMetrics::unregistered())
        .err()
        .expect("foreign node certificate must be refused at bind");
    assert!(
        err.to_string().contains("not valid for this cluster"),
        "{err}"
    );
    // ... and a peer that skips the check is refused by the server's TLS.
    let intruder_files = node_files(dir.path(), "y", 9, &foreign, &foreign);
    let intruder = serve(&intruder_files, 9, MeshMetrics::unregistered());
    let res = intruder
        .call(
            server.local_addr().expect("addr"),
            &Echo("let me in".into()),
            Duration::from_secs(5),
        )
        .await;
    assert!(res.is_err(), "intruder got an answer");
    let rejected = || {
        server_metrics
            .rpc_connections_rejected
            .get_or_create(&shoal_mesh::ReasonLabel {
                reason: "handshake",
            })
            .get()
    };
    for _ in 0..50 {
        if rejected() > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        rejected() > 0,
        "server did not count the rejected handshake"
    );
}

async fn serve_bulk(
    files: &TlsFiles,
    id: u64,
    mode: shoal_mesh::BulkMode,
) -> (std::sync::Arc<Transport>, SocketAddr) {
    // Find a free TCP port on loopback for the bulk lane.
    let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("probe");
    let addr = probe.local_addr().expect("addr");
    drop(probe);
    (serve_bulk_at(files, id, mode, addr).await, addr)
}

async fn serve_bulk_at(
    files: &TlsFiles,
    id: u64,
    mode: shoal_mesh::BulkMode,
    addr: SocketAddr,
) -> std::sync::Arc<Transport> {
    let t = serve(files, id, MeshMetrics::unregistered());
    t.serve_on_bulk::<Echo>(|_| true);
    t.start_bulk(addr, mode).await.expect("bulk lane");
    t
}

#[tokio::test]
async fn bulk_lane_carries_calls_in_secure_and_crc_modes() {
    for mode in [shoal_mesh::BulkMode::Secure, shoal_mesh::BulkMode::Crc] {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = new_ca("cluster");
        let (a, _) = serve_bulk(&node_files(dir.path(), "a", 1, &ca, &ca), 1, mode).await;
        let (b, b_bulk) = serve_bulk(&node_files(dir.path(), "b", 2, &ca, &ca), 2, mode).await;
        let b_rpc = b.local_addr().expect("addr");
        let big = "x".repeat(3 << 20);
        for _ in 0..3 {
            // Several calls: the second and third reuse the pooled connection.
            let got = a
                .call_bulk(
                    NodeId(2),
                    b_rpc,
                    b_bulk,
                    &Echo(big.clone()),
                    Duration::from_secs(10),
                )
                .await
                .expect("bulk call");
            assert_eq!(
                got.len(),
                big.len() + format!("2<-{}: ", NodeId(1)).len(),
                "{mode:?}"
            );
        }
    }
}

#[tokio::test]
async fn a_bulk_call_after_the_peer_restarted_goes_through_on_a_fresh_connection() {
    for mode in [shoal_mesh::BulkMode::Secure, shoal_mesh::BulkMode::Crc] {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = new_ca("cluster");
        let (a, _) = serve_bulk(&node_files(dir.path(), "a", 1, &ca, &ca), 1, mode).await;
        let b_files = node_files(dir.path(), "b", 2, &ca, &ca);
        // The first life of b runs on a runtime of its own, so that ending it closes every
        // connection it holds, as a process exit would.
        let life = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let (b_rpc, b_bulk) = {
            let files = b_files.clone();
            life.spawn(async move {
                let (b, addr) = serve_bulk(&files, 2, mode).await;
                let rpc = b.local_addr().expect("addr");
                tokio::spawn(async move {
                    let _b = b;
                    std::future::pending::<()>().await
                });
                (rpc, addr)
            })
            .await
            .expect("first life")
        };
        let echo = Echo("shard".into());
        let expected = format!("2<-{}: shard", NodeId(1));
        let got = a
            .call_bulk(NodeId(2), b_rpc, b_bulk, &echo, Duration::from_secs(5))
            .await;
        assert_eq!(got.expect("call to the first life"), expected);
        // Ended (its listener and connections closed) before b binds the address again.
        tokio::task::spawn_blocking(move || life.shutdown_timeout(Duration::from_secs(5)))
            .await
            .expect("end the first life");
        // b comes back at the same address; a still pools the connection to the old one.
        let _b = serve_bulk_at(&b_files, 2, mode, b_bulk).await;
        let got = a
            .call_bulk(NodeId(2), b_rpc, b_bulk, &echo, Duration::from_secs(5))
            .await;
        let got = got.unwrap_or_else(|e| panic!("first call after the restart ({mode:?}): {e}"));
        assert_eq!(got, expected);
    }
}

#[tokio::test]
async fn bulk_lane_refuses_a_peer_of_another_cluster() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = new_ca("cluster");
    let foreign = new_ca("elsewhere");
    let (server, bulk_addr) = serve_bulk(
        &node_files(dir.path(), "s", 1, &ca, &ca),
        1,
        shoal_mesh::BulkMode::Crc,
    )
    .await;
    let rpc = server.local_addr().expect("addr");
    let (intruder, _) = serve_bulk(
        &node_files(dir.path(), "y", 9, &foreign, &foreign),
        9,
        shoal_mesh::BulkMode::Crc,
    )
    .await;
    let res = intruder
        .call_bulk(
            NodeId(1),
            rpc,
            bulk_addr,
            &Echo("let me in".into()),
            Duration::from_secs(5),
        )
        .await;
    assert!(res.is_err(), "intruder got through the bulk lane");
}

#[tokio::test]
async fn bulk_lane_refuses_a_peer_in_another_mode() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = new_ca("cluster");
    let (server, bulk_addr) = serve_bulk(
        &node_files(dir.path(), "s", 1, &ca, &ca),
        1,
        shoal_mesh::BulkMode::Secure,
    )
    .await;
    let rpc = server.local_addr().expect("addr");
    let (client, _) = serve_bulk(
        &node_files(dir.path(), "c", 2, &ca, &ca),
        2,
        shoal_mesh::BulkMode::Crc,
    )
    .await;
    let res = client
        .call_bulk(
            NodeId(1),
            rpc,
            bulk_addr,
            &Echo("plaintext please".into()),
            Duration::from_secs(5),
        )
        .await;
    assert!(res.is_err(), "a crc client talked to a secure-mode server");
}

#[tokio::test]
async fn a_call_that_times_out_leaves_the_others_to_that_peer_alone() {
    #[derive(Serialize, Deserialize)]
    struct Slow(u64);
    impl Rpc for Slow {
        const ENDPOINT: &'static str = "test/slow";
        type Response = u64;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = new_ca("cluster");
    let a = serve(
        &node_files(dir.path(), "a", 1, &ca, &ca),
        1,
        MeshMetrics::unregistered(),
    );
    let b = serve(
        &node_files(dir.path(), "b", 2, &ca, &ca),
        2,
        MeshMetrics::unregistered(),
    );
    b.register(|_: NodeId, Slow(ms)| async move {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        Ok(ms)
    });
    let peer = b.local_addr().expect("addr");
    // One connection to b, then a long call on it and a short-lived one beside it.
    a.call(peer, &Echo("hi".into()), Duration::from_secs(5))
        .await
        .expect("call");
    let long = {
        let a = a.clone();
        tokio::spawn(async move { a.call(peer, &Slow(600), Duration::from_secs(5)).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let err = a
        .call(peer, &Slow(2_000), Duration::from_millis(100))
        .await
        .expect_err("times out");
    assert!(matches!(err, MeshError::RpcTimeout { .. }), "{err}");
    let got = long.await.expect("task");
    assert_eq!(got.expect("the long call is not cut off"), 600);
}

fn refused(metrics: &MeshMetrics, reason: &'static str) -> u64 {
    metrics
        .rpc_requests_refused
        .get_or_create(&shoal_mesh::ReasonLabel { reason })
        .get()
}

#[tokio::test]
async fn a_request_claiming_another_node_than_its_certificate_is_refused_and_counted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = new_ca("cluster");
    let server_metrics = MeshMetrics::unregistered();
    let server = serve(
        &node_files(dir.path(), "s", 1, &ca, &ca),
        1,
        server_metrics.clone(),
    );
    // A valid certificate of node 2, used by a process that says it is node 5.
    let liar = serve(
        &node_files(dir.path(), "b", 2, &ca, &ca),
        5,
        MeshMetrics::unregistered(),
    );
    let err = liar
        .call(
            server.local_addr().expect("addr"),
            &Echo("I am node 5".into()),
            Duration::from_secs(5),
        )
        .await
        .expect_err("impersonation answered");
    assert!(err.to_string().contains("claims to be node"), "{err}");
    assert_eq!(refused(&server_metrics, "impersonation"), 1);
}

#[tokio::test]
async fn call_to_refuses_a_peer_that_is_not_the_node_asked_for() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = new_ca("cluster");
    let a = serve(
        &node_files(dir.path(), "a", 1, &ca, &ca),
        1,
        MeshMetrics::unregistered(),
    );
    let b = serve(
        &node_files(dir.path(), "b", 2, &ca, &ca),
        2,
        MeshMetrics::unregistered(),
    );
    let at = b.local_addr().expect("addr");
    let err = a
        .call_to(NodeId(3), at, &Echo("for 3".into()), Duration::from_secs(5))
        .await
        .expect_err("node 2 answered for node 3");
    assert!(err.to_string().contains("expected node"), "{err}");
    a.call_to(NodeId(2), at, &Echo("for 2".into()), Duration::from_secs(5))
        .await
        .expect("node 2 answers for itself");
}

#[tokio::test]
async fn a_revoked_certificate_is_refused_until_a_newer_one_is_shown() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = new_ca("cluster");
    let server_metrics = MeshMetrics::unregistered();
    let server = serve(
        &node_files(dir.path(), "s", 1, &ca, &ca),
        1,
        server_metrics.clone(),
    );
    let at = server.local_addr().expect("addr");
    let old = serve(
        &node_files_issued(dir.path(), "b", 2, 1_000, &ca, &ca),
        2,
        MeshMetrics::unregistered(),
    );
    old.call(at, &Echo("before".into()), Duration::from_secs(5))
        .await
        .expect("not revoked yet");
    server.revocations().set(vec![shoal_mesh::Revocation {
        name: "b".into(),
        node: NodeId(2),
        before_ms: 2_000,
    }]);
    // On the connection it already has: the request is refused.
    let err = old
        .call(at, &Echo("after".into()), Duration::from_secs(5))
        .await
        .expect_err("revoked answered");
    assert!(err.to_string().contains("revoked"), "{err}");
    assert_eq!(refused(&server_metrics, "revoked"), 1);
    assert!(server.revocations().silences(NodeId(2)));
    // A certificate issued after the revocation (a re-key of the same node) is taken.
    let again = tempfile::tempdir().expect("tempdir");
    let rekeyed = serve(
        &node_files_issued(again.path(), "b", 2, 3_000, &ca, &ca),
        2,
        MeshMetrics::unregistered(),
    );
    rekeyed
        .call(at, &Echo("new key".into()), Duration::from_secs(5))
        .await
        .expect("a re-keyed node");
    assert!(!server.revocations().silences(NodeId(2)));
}

#[tokio::test]
async fn the_bulk_lane_serves_only_what_it_is_told() {
    #[derive(Serialize, Deserialize)]
    struct Control(u8);
    impl Rpc for Control {
        const ENDPOINT: &'static str = "test/control";
        type Response = u8;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = new_ca("cluster");
    let mode = shoal_mesh::BulkMode::Crc;
    let (a, _) = serve_bulk(&node_files(dir.path(), "a", 1, &ca, &ca), 1, mode).await;
    let (b, b_bulk) = serve_bulk(&node_files(dir.path(), "b", 2, &ca, &ca), 2, mode).await;
    b.register(|_: NodeId, Control(x)| async move { Ok(x) });
    let err = a
        .call_bulk(
            NodeId(2),
            b.local_addr().expect("addr"),
            b_bulk,
            &Control(7),
            Duration::from_secs(5),
        )
        .await
        .expect_err("control on the bulk lane");
    assert!(
        err.to_string().contains("not served on the bulk lane"),
        "{err}"
    );
    // Over QUIC it is served.
    let got = a
        .call(
            b.local_addr().expect("addr"),
            &Control(7),
            Duration::from_secs(5),
        )
        .await
        .expect("quic");
    assert_eq!(got, 7);
}

/// What a man in the middle makes of the bytes a client sent.
type Tamper = fn(&[u8]) -> Vec<u8>;

/// A man in the middle of a `crc` bulk connection: forwards the TLS handshake and the
/// first request untouched, keeps every byte the client sent, then sends `tamper(stream)`
/// to the server on the same connection.
async fn man_in_the_middle(
    server: SocketAddr,
    tamper: Tamper,
) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let task = tokio::spawn(async move {
        let (mut client, _) = listener.accept().await.expect("accept");
        let mut upstream = tokio::net::TcpStream::connect(server)
            .await
            .expect("connect");
        let mut sent = Vec::new();
        let (mut buf, mut back) = (vec![0u8; 1 << 16], vec![0u8; 1 << 16]);
        let mut answered = false;
        // Relay until the server has answered the first request (a response frame ends
        // with a 32-byte tag after TLS: the first quiet moment after the client spoke).
        loop {
            tokio::select! {
                n = client.read(&mut buf) => {
                    let n = n.expect("read client");
                    if n == 0 { return; }
                    sent.extend_from_slice(&buf[..n]);
                    upstream.write_all(&buf[..n]).await.expect("forward");
                }
                n = upstream.read(&mut back) => {
                    let n = n.expect("read server");
                    if n == 0 { return; }
                    client.write_all(&back[..n]).await.expect("back");
                    answered = true;
                }
                _ = tokio::time::sleep(Duration::from_millis(300)), if answered => break,
            }
        }
        // Now inject, on the live connection, what `tamper` makes of the client's bytes.
        let _ = upstream.write_all(&tamper(&sent)).await;
        let _ = upstream.read(&mut buf).await;
    });
    (addr, task)
}

/// The last frame of a client's byte stream: `| length | payload | 32-byte tag |`.
fn last_frame(stream: &[u8]) -> Vec<u8> {
    let total = stream.len();
    let start = (0..total.saturating_sub(36))
        .rev()
        .find(|&p| {
            let len = u32::from_be_bytes([stream[p], stream[p + 1], stream[p + 2], stream[p + 3]]);
            p + 4 + len as usize + 32 == total
        })
        .expect("a frame at the end of the stream");
    stream[start..].to_vec()
}

#[tokio::test]
async fn frames_injected_or_replayed_on_a_crc_connection_are_refused_and_never_served() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let tampers: [(&str, Tamper); 3] = [
        ("replayed", last_frame),
        ("altered", |s| {
            let mut f = last_frame(s);
            let i = f.len() - 40;
            f[i] ^= 0x01;
            f
        }),
        ("forged", |s| {
            // A frame of the right shape whose tag the injector had to guess.
            let mut f = last_frame(s);
            let n = f.len();
            f[n - 32..].fill(0xab);
            f
        }),
    ];
    for (what, tamper) in tampers {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = new_ca("cluster");
        let mode = shoal_mesh::BulkMode::Crc;
        let (a, _) = serve_bulk(&node_files(dir.path(), "a", 1, &ca, &ca), 1, mode).await;
        let (b, b_bulk) = serve_bulk(&node_files(dir.path(), "b", 2, &ca, &ca), 2, mode).await;
        #[derive(Serialize, Deserialize)]
        struct Apply(String);
        impl Rpc for Apply {
            const ENDPOINT: &'static str = "test/apply";
            type Response = usize;
        }
        let applied = Arc::new(AtomicUsize::new(0));
        let seen = applied.clone();
        b.register(move |_: NodeId, Apply(_)| {
            let seen = seen.clone();
            async move { Ok(seen.fetch_add(1, Ordering::SeqCst) + 1) }
        });
        b.serve_on_bulk::<Apply>(|_| true);
        let (mitm, task) = man_in_the_middle(b_bulk, tamper).await;
        let got = a
            .call_bulk(
                NodeId(2),
                b.local_addr().expect("addr"),
                mitm,
                &Apply("once".into()),
                Duration::from_secs(5),
            )
            .await
            .expect("the genuine request");
        assert_eq!(got, 1);
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("injector done")
            .expect("injector");
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            applied.load(Ordering::SeqCst),
            1,
            "{what}: the injected frame was served"
        );
    }
}

/// A node serving `Echo` on a bulk lane (`secure`) with `limits`, counting into `metrics`.
async fn serve_bulk_limited(
    files: &TlsFiles,
    id: u64,
    metrics: MeshMetrics,
    limits: shoal_mesh::BulkLimits,
) -> (std::sync::Arc<Transport>, SocketAddr) {
    let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("probe");
    let addr = probe.local_addr().expect("addr");
    drop(probe);
    let t = serve(files, id, metrics);
    t.serve_on_bulk::<Echo>(|_| true);
    t.start_bulk_with(addr, shoal_mesh::BulkMode::Secure, limits)
        .await
        .expect("bulk lane");
    (t, addr)
}

/// A TCP connection from `from` to `to` that never says a word (a flooder's).
async fn idle_connection(from: [u8; 4], to: SocketAddr) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.bind(SocketAddr::from((from, 0))).expect("bind");
    socket.connect(to).await.expect("connect")
}

/// Waits until the server closes `conn` (30 s at most).
async fn closed_by_server(mut conn: tokio::net::TcpStream) {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(30), conn.read(&mut buf)).await;
    match read {
        Ok(Ok(0) | Err(_)) => {}
        Ok(Ok(n)) => panic!("the server sent {n} bytes to a silent connection"),
        Err(_) => panic!("the server kept a silent connection for 30 s"),
    }
}

fn bulk_refused(metrics: &MeshMetrics, reason: &'static str) -> u64 {
    metrics
        .bulk_connections_refused
        .get_or_create(&shoal_mesh::ReasonLabel { reason })
        .get()
}

/// Polls `f` every 20 ms until it holds (30 s at most).
async fn until(what: &str, f: impl Fn() -> bool) {
    for _ in 0..1_500 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test]
async fn a_flood_from_one_source_holds_only_its_share_and_peers_keep_the_bulk_lane() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = new_ca("cluster");
    let (a_metrics, b_metrics) = (MeshMetrics::unregistered(), MeshMetrics::unregistered());
    let limits = shoal_mesh::BulkLimits::default();
    let a_files = node_files(dir.path(), "a", 1, &ca, &ca);
    let (a, _) = serve_bulk_limited(&a_files, 1, a_metrics.clone(), limits).await;
    let b_files = node_files(dir.path(), "b", 2, &ca, &ca);
    let (b, b_bulk) = serve_bulk_limited(&b_files, 2, b_metrics.clone(), limits).await;
    // Three times its share of silent connections from one address.
    let share = limits.unauthenticated_per_source;
    let mut flood = Vec::new();
    for _ in 0..3 * share {
        flood.push(idle_connection([127, 0, 0, 2], b_bulk).await);
    }
    until("the connections over the source's share dropped", || {
        bulk_refused(&b_metrics, "source_limit") >= 2 * share as u64
    })
    .await;
    // a (another address) dials the bulk lane as ever: nothing went over QUIC.
    let b_rpc = b.local_addr().expect("addr");
    let got = a
        .call_bulk(
            NodeId(2),
            b_rpc,
            b_bulk,
            &Echo("shard".into()),
            Duration::from_secs(10),
        )
        .await
        .expect("bulk call during the flood");
    assert_eq!(got, format!("2<-{}: shard", NodeId(1)));
    assert_eq!(a_metrics.bulk_fallbacks.get(), 0, "the call went over QUIC");
    assert_eq!(bulk_refused(&b_metrics, "unauthenticated_limit"), 0);
    drop(flood);
}

#[tokio::test]
async fn a_silent_connection_is_dropped_at_the_handshake_deadline_and_frees_its_slot() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = new_ca("cluster");
    let metrics = MeshMetrics::unregistered();
    let limits = shoal_mesh::BulkLimits {
        unauthenticated_per_source: 2,
        handshake_timeout: Duration::from_millis(500),
        ..shoal_mesh::BulkLimits::default()
    };
    let files = node_files(dir.path(), "b", 2, &ca, &ca);
    let (_b, b_bulk) = serve_bulk_limited(&files, 2, metrics.clone(), limits).await;
    // Two rounds of as many silent connections as the source may hold: the second round
    // is admitted only if the first's slots came back when the deadline dropped them.
    for round in 1..=2u64 {
        let first = idle_connection([127, 0, 0, 3], b_bulk).await;
        let second = idle_connection([127, 0, 0, 3], b_bulk).await;
        closed_by_server(first).await;
        closed_by_server(second).await;
        until("both counted as timed out", || {
            bulk_refused(&metrics, "handshake_timeout") == 2 * round
        })
        .await;
        assert_eq!(bulk_refused(&metrics, "source_limit"), 0, "round {round}");
    }
}

#[tokio::test]
async fn when_the_bulk_lane_cannot_connect_the_call_goes_over_quic() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = new_ca("cluster");
    let (a_metrics, b_metrics, c_metrics) = (
        MeshMetrics::unregistered(),
        MeshMetrics::unregistered(),
        MeshMetrics::unregistered(),
    );
    // Room for four handshakes in all, held long enough for the test.
    let limits = shoal_mesh::BulkLimits {
        unauthenticated_per_source: 4,
        unauthenticated: 4,
        handshake_timeout: Duration::from_secs(120),
        ..shoal_mesh::BulkLimits::default()
    };
    let files = |name, id| node_files(dir.path(), name, id, &ca, &ca);
    let (a, _) = serve_bulk_limited(&files("a", 1), 1, a_metrics.clone(), limits).await;
    let (b, b_bulk) = serve_bulk_limited(&files("b", 2), 2, b_metrics.clone(), limits).await;
    let (c, _) = serve_bulk_limited(&files("c", 3), 3, c_metrics.clone(), limits).await;
    let b_rpc = b.local_addr().expect("addr");
    let echo = Echo("shard".into());
    let call = |t: std::sync::Arc<Transport>| {
        let echo = &echo;
        async move {
            t.call_bulk(NodeId(2), b_rpc, b_bulk, echo, Duration::from_secs(10))
                .await
        }
    };
    // a has a connection to b's lane before the flood.
    call(a.clone()).await.expect("before the flood");
    let mut flood = Vec::new();
    for last in 4..8 {
        flood.push(idle_connection([127, 0, 0, last], b_bulk).await);
    }
    let probe = idle_connection([127, 0, 0, 8], b_bulk).await;
    closed_by_server(probe).await;
    until("b counted the probe as over its limit", || {
        bulk_refused(&b_metrics, "unauthenticated_limit") == 1
    })
    .await;
    // The flood does not take a's authenticated connection from it.
    call(a.clone()).await.expect("on the pooled connection");
    assert_eq!(a_metrics.bulk_fallbacks.get(), 0);
    // c has none and cannot make one: its calls go over QUIC.
    for n in 1..=2 {
        let got = call(c.clone()).await.expect("over QUIC");
        assert_eq!(got, format!("2<-{}: shard", NodeId(3)));
        assert_eq!(c_metrics.bulk_fallbacks.get(), n);
    }
    assert!(bulk_refused(&b_metrics, "unauthenticated_limit") >= 2);
    drop(flood);
}

#[tokio::test]
async fn a_lane_serving_all_it_may_says_busy_and_the_caller_goes_over_quic() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = new_ca("cluster");
    let (b_metrics, c_metrics) = (MeshMetrics::unregistered(), MeshMetrics::unregistered());
    let limits = shoal_mesh::BulkLimits {
        authenticated: 1,
        ..shoal_mesh::BulkLimits::default()
    };
    let files = |name, id| node_files(dir.path(), name, id, &ca, &ca);
    let a_metrics = MeshMetrics::unregistered();
    let (a, _) = serve_bulk_limited(&files("a", 1), 1, a_metrics, limits).await;
    let (b, b_bulk) = serve_bulk_limited(&files("b", 2), 2, b_metrics.clone(), limits).await;
    let (c, _) = serve_bulk_limited(&files("c", 3), 3, c_metrics.clone(), limits).await;
    let b_rpc = b.local_addr().expect("addr");
    let echo = Echo("shard".into());
    // a's pooled connection takes b's one slot; c is told b is busy.
    a.call_bulk(NodeId(2), b_rpc, b_bulk, &echo, Duration::from_secs(10))
        .await
        .expect("a");
    let got = c
        .call_bulk(NodeId(2), b_rpc, b_bulk, &echo, Duration::from_secs(10))
        .await
        .expect("c over QUIC");
    assert_eq!(got, format!("2<-{}: shard", NodeId(3)));
    assert_eq!(c_metrics.bulk_fallbacks.get(), 1);
    until("b counted the busy refusal", || {
        bulk_refused(&b_metrics, "authenticated_limit") == 1
    })
    .await;
}
