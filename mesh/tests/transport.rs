//! QUIC RPC between real endpoints on loopback: mutual TLS lets cluster members talk and
//! keeps everyone else out.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
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

/// Writes a node certificate signed by `signer` and a trust root of `trust` into `dir`.
fn node_files(dir: &Path, name: &str, signer: &Ca, trust: &Ca) -> TlsFiles {
    let key = KeyPair::generate().expect("key");
    let mut params = CertificateParams::new(vec![NAME.to_owned()]).expect("params");
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
        &node_files(dir.path(), "a", &ca, &ca),
        1,
        MeshMetrics::unregistered(),
    );
    let b = serve(
        &node_files(dir.path(), "b", &ca, &ca),
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
        &node_files(dir.path(), "a", &ca, &ca),
        1,
        MeshMetrics::unregistered(),
    );
    let b = serve(
        &node_files(dir.path(), "b", &ca, &ca),
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
        &node_files(dir.path(), "s", &ca, &ca),
        1,
        server_metrics.clone(),
    );
    // Trusts the cluster CA (so it would accept the server) but presents a foreign cert.
    let files = node_files(dir.path(), "x", &foreign, &foreign);
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
    let intruder_files = node_files(dir.path(), "y", &foreign, &foreign);
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
    let t = serve(files, id, MeshMetrics::unregistered());
    // Find a free TCP port on loopback for the bulk lane.
    let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("probe");
    let addr = probe.local_addr().expect("addr");
    drop(probe);
    t.start_bulk(addr, mode).await.expect("bulk lane");
    (t, addr)
}

#[tokio::test]
async fn bulk_lane_carries_calls_in_secure_and_crc_modes() {
    for mode in [shoal_mesh::BulkMode::Secure, shoal_mesh::BulkMode::Crc] {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = new_ca("cluster");
        let (a, _) = serve_bulk(&node_files(dir.path(), "a", &ca, &ca), 1, mode).await;
        let (_b, b_bulk) = serve_bulk(&node_files(dir.path(), "b", &ca, &ca), 2, mode).await;
        let big = "x".repeat(3 << 20);
        for _ in 0..3 {
            // Several calls: the second and third reuse the pooled connection.
            let got = a
                .call_bulk(b_bulk, &Echo(big.clone()), Duration::from_secs(10))
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
async fn bulk_lane_refuses_a_peer_of_another_cluster() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = new_ca("cluster");
    let foreign = new_ca("elsewhere");
    let (_server, bulk_addr) = serve_bulk(
        &node_files(dir.path(), "s", &ca, &ca),
        1,
        shoal_mesh::BulkMode::Crc,
    )
    .await;
    let (intruder, _) = serve_bulk(
        &node_files(dir.path(), "y", &foreign, &foreign),
        9,
        shoal_mesh::BulkMode::Crc,
    )
    .await;
    let res = intruder
        .call_bulk(bulk_addr, &Echo("let me in".into()), Duration::from_secs(5))
        .await;
    assert!(res.is_err(), "intruder got through the bulk lane");
}

#[tokio::test]
async fn bulk_lane_refuses_a_peer_in_another_mode() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = new_ca("cluster");
    let (_server, bulk_addr) = serve_bulk(
        &node_files(dir.path(), "s", &ca, &ca),
        1,
        shoal_mesh::BulkMode::Secure,
    )
    .await;
    let (client, _) = serve_bulk(
        &node_files(dir.path(), "c", &ca, &ca),
        2,
        shoal_mesh::BulkMode::Crc,
    )
    .await;
    let res = client
        .call_bulk(
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
        &node_files(dir.path(), "a", &ca, &ca),
        1,
        MeshMetrics::unregistered(),
    );
    let b = serve(
        &node_files(dir.path(), "b", &ca, &ca),
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
