//! Agents of another cluster are kept out: gossip is authenticated by the cluster key bound
//! to the cluster CA, RPC by mutual TLS against that CA.

use std::process::{Command, Stdio};
use std::time::Duration;

use shoal_tests::{DevCluster, binaries, metric_sum, shoal, wait_for};

/// Writes a config for an outsider agent at 127.0.`subnet`.`host` that tries to join the
/// cluster `c` through its seeds, with the credentials in `tls`.
fn outsider_config(c: &DevCluster, host: u8, ca_dir: &str, tls: &str, data: &str) -> String {
    let seeds: Vec<String> = (1..=c.nodes)
        .map(|i| format!("\"{}:7946\"", c.ip(i)))
        .collect();
    format!(
        r#"
[node]
name = "outsider"
data_dir = "{data}"
failure_domain = "fd9"
[mesh]
addr = "{ip}"
seeds = [{seeds}]
[tls]
ca_cert = "{ca_dir}/ca.pem"
node_cert = "{tls}/node.pem"
node_key = "{tls}/node.key"
cluster_key = "{ca_dir}/cluster.key"
[admin]
socket = "{data}/agent.sock"
"#,
        ip = c.ip(host),
        seeds = seeds.join(", ")
    )
}

fn run_ok(args: &[&str]) {
    let out = shoal(args);
    assert!(
        out.status.success(),
        "shoal {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A temp dir holding a CA of its own (`ca/`), a node certificate for `name` at `ip` signed
/// by it (`tls/`), and an empty `data/`.
fn foreign_credentials(name: &str, ip: &str) -> tempfile::TempDir {
    let other = tempfile::tempdir().expect("tempdir");
    let p = |s: &str| other.path().join(s).to_str().expect("utf-8").to_owned();
    std::fs::create_dir_all(p("data")).expect("mkdir");
    run_ok(&["cert", "init", "--dir", &p("ca")]);
    run_ok(&[
        "cert",
        "issue",
        "--ca-dir",
        &p("ca"),
        "--name",
        name,
        "--ip",
        ip,
        "--out",
        &p("tls"),
    ]);
    other
}

#[test]
fn agent_of_another_cluster_cannot_join_and_is_counted() {
    let c = DevCluster::up(3, 24);
    let other = foreign_credentials("outsider", &c.ip(10).to_string());
    let p = |s: &str| other.path().join(s).to_str().expect("utf-8").to_owned();
    std::fs::write(
        p("agent.toml"),
        outsider_config(&c, 10, &p("ca"), &p("tls"), &p("data")),
    )
    .expect("write");

    let log = std::fs::File::create(p("agent.log")).expect("log");
    let _outsider = KillOnDrop(
        Command::new(binaries().agent)
            .args(["--config", &p("agent.toml")])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start outsider"),
    );

    // The cluster counts the outsider's packets as rejected ...
    wait_for(
        Duration::from_secs(20),
        "rejected gossip counted on node1",
        || {
            (metric_sum(
                &c.metrics(1),
                "shoal_mesh_gossip_packets_rejected_total",
                "bad_mac",
            ) >= 3.0)
                .then_some(())
        },
    );
    // ... and never lists it; the outsider sees nobody.
    for i in 1..=3 {
        let status = c.status(i).expect("status");
        assert_eq!(
            status["nodes"].as_array().map(Vec::len),
            Some(3),
            "{status}"
        );
    }
    let sock = p("data/agent.sock");
    let out = shoal(&["status", "--json", "--socket", &sock]);
    let seen: serde_json::Value = serde_json::from_slice(&out.stdout).expect("outsider status");
    assert_eq!(seen["nodes"].as_array().map(Vec::len), Some(1), "{seen}");

    // Rejections are logged once per source, not once per packet.
    let rejections = c.log(1).matches("rejected gossip packet").count();
    assert_eq!(rejections, 1, "node1 log:\n{}", c.log(1));
}

/// The outsider agent goes with the test, also when an assertion fails (it would hold
/// its addresses against a rerun).
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn agent_with_certificate_of_another_ca_refuses_to_start() {
    let c = DevCluster::up(1, 25);
    let other = foreign_credentials("outsider", &c.ip(11).to_string());
    let p = |s: &str| other.path().join(s).to_str().expect("utf-8").to_owned();
    // Trusts the real cluster CA and holds its cluster key, but the certificate is foreign.
    let real_ca = c.path().join("ca");
    let config = outsider_config(
        &c,
        11,
        real_ca.to_str().expect("utf-8"),
        &p("tls"),
        &p("data"),
    );
    std::fs::write(p("agent.toml"), config).expect("write");

    let out = Command::new(binaries().agent)
        .args(["--config", &p("agent.toml")])
        .output()
        .expect("run agent");
    assert!(
        !out.status.success(),
        "agent with a foreign certificate started"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("node certificate") && stderr.contains("not valid for this cluster"),
        "{stderr}"
    );
}

/// Copies one gossip packet node 1 sends node 2 off the loopback interface (a packet
/// socket, as anyone on the network could) and sends it to node 2 again `times` times.
/// Prints how many bytes the captured packet had.
const REPLAY: &str = r#"
import socket, struct, sys
src, dst, times = sys.argv[1], sys.argv[2], int(sys.argv[3])
sniff = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(0x0800))
sniff.bind(("lo", 0))
sniff.settimeout(20)
while True:
    ip = sniff.recv(70000)
    if ip[9] != 17:
        continue
    ihl = (ip[0] & 0x0f) * 4
    sport, dport, ulen = struct.unpack(">HHH", ip[ihl:ihl + 6])
    if socket.inet_ntoa(ip[12:16]) == src and socket.inet_ntoa(ip[16:20]) == dst and dport == 7946:
        payload = ip[ihl + 8:ihl + ulen]
        break
out = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(times):
    out.sendto(payload, (dst, 7946))
print(len(payload))
"#;

#[test]
fn a_replayed_gossip_packet_is_refused_and_counted() {
    if !shoal_tests::is_root() {
        eprintln!("SKIPPED: needs root (captures packets on the loopback interface)");
        return;
    }
    let c = DevCluster::up(2, 38);
    let replayed = |c: &DevCluster| {
        metric_sum(
            &c.metrics(2),
            "shoal_mesh_gossip_packets_rejected_total",
            "replayed",
        )
    };
    let before = replayed(&c);
    let out = Command::new("python3")
        .args([
            "-c",
            REPLAY,
            &c.ip(1).to_string(),
            &c.ip(2).to_string(),
            "5",
        ])
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "capture: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Authentic (sealed with the cluster key), so only its freshness can refuse it.
    wait_for(
        Duration::from_secs(10),
        "five replays counted on node2",
        || (replayed(&c) >= before + 5.0).then_some(()),
    );
    assert_eq!(
        metric_sum(
            &c.metrics(2),
            "shoal_mesh_gossip_packets_rejected_total",
            "bad_mac"
        ),
        0.0
    );
    // The members still see each other.
    for i in 1..=2 {
        let status = c.status(i).expect("status");
        let alive = status["nodes"]
            .as_array()
            .map(|n| n.iter().filter(|m| m["state"] == "alive").count());
        assert_eq!(alive, Some(2), "{status}");
    }
    c.down();
}
