//! Erasure-coded stripes across real agents, driven by `shoal bench stripes`.

use std::path::Path;

use nix::sys::signal::Signal;
use serde_json::Value;
use shoal_tests::{DevCluster, metric_sum, shoal};

/// Runs `shoal bench stripes` against node 1; returns (success, JSON report or Null, stderr).
fn bench(c: &DevCluster, args: &[&str]) -> (bool, Value, String) {
    let sock = c.socket(1);
    let records = c.path().join("records.json");
    let mut all = vec![
        "bench",
        "stripes",
        "--socket",
        sock.to_str().expect("utf-8"),
        "--json",
        "--writers",
        "2",
    ];
    if !args.contains(&"--records") {
        all.extend(["--records", records.to_str().expect("utf-8")]);
    }
    all.extend(args);
    let out = shoal(&all);
    let report = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (
        out.status.success(),
        report,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn shard_files(c: &DevCluster, i: u8) -> Vec<std::path::PathBuf> {
    let dir = c.node_dir(i).join("data/store/shards");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    files.sort();
    files
}

fn is_data_shard(p: &Path) -> bool {
    p.extension()
        .and_then(|e| e.to_str())
        .and_then(|e| e.parse::<u8>().ok())
        .is_some_and(|i| i < 4)
}

#[test]
fn six_nodes_4_2_read_back_every_byte_with_two_nodes_killed() {
    // Shards travel the crc bulk lane here; the other tests use the default (secure).
    let c = DevCluster::up_with(6, 31, &["--bulk", "crc"]);
    let (ok, report, err) = bench(&c, &["--size", "48MiB", "--ec", "4+2"]);
    assert!(ok, "{err}\n{report}");
    assert_eq!(report["write"]["stripes"], 12, "{report}");
    assert_eq!(report["mismatches"], 0);
    assert_eq!(report["decoded"], 0, "all nodes up: no decoding");
    // Shards spread over all six nodes.
    for i in 1..=6 {
        assert!(!shard_files(&c, i).is_empty(), "node{i} holds no shard");
    }

    c.signal(3, Signal::SIGKILL);
    c.signal(5, Signal::SIGKILL);
    let (ok, report, err) = bench(&c, &["--read-only"]);
    assert!(ok, "{err}\n{report}");
    assert_eq!(report["read"]["stripes"], 12);
    assert_eq!(report["read"]["errors"], 0, "{report}");
    assert_eq!(report["mismatches"], 0, "{report}");
    assert!(
        report["decoded"].as_u64().unwrap_or(0) > 0,
        "two of six nodes gone, yet nothing decoded: {report}"
    );
}

#[test]
fn corrupt_shard_is_detected_counted_logged_and_read_around() {
    // Shard files written and read with O_DIRECT here.
    let c = DevCluster::up_with(6, 32, &["--direct-io"]);
    let (ok, report, err) = bench(&c, &["--size", "16MiB", "--ec", "4+2"]);
    assert!(ok, "{err}\n{report}");
    // Flip bytes in the middle of one data shard file.
    let (node, victim) = (1..=6)
        .find_map(|i| {
            shard_files(&c, i)
                .into_iter()
                .find(|p| is_data_shard(p))
                .map(|p| (i, p))
        })
        .expect("some node holds a data shard");
    let mut bytes = std::fs::read(&victim).expect("read shard");
    let mid = bytes.len() / 2;
    for b in &mut bytes[mid..mid + 16] {
        *b ^= 0xff;
    }
    std::fs::write(&victim, bytes).expect("write shard");
    let stripe = victim
        .file_stem()
        .and_then(|s| s.to_str())
        .expect("name")
        .to_owned();

    let (ok, report, err) = bench(&c, &["--read-only"]);
    assert!(ok, "{err}\n{report}");
    assert_eq!(report["mismatches"], 0, "{report}");
    assert!(report["decoded"].as_u64().unwrap_or(0) >= 1, "{report}");
    let counted: f64 = (1..=6)
        .map(|i| metric_sum(&c.metrics(i), "shoal_store_corrupt_shards_total", ""))
        .sum();
    assert!(counted >= 1.0, "corruption not counted in metrics");
    assert!(
        c.log(node).contains(&stripe),
        "node{node} log does not name stripe {stripe}"
    );
}

#[test]
fn full_node_refuses_writes_with_a_clear_error_and_keeps_its_data() {
    let c = DevCluster::up_with(6, 33, &["--store-capacity", "6MiB"]);
    let first = c.path().join("first.json");
    let first = first.to_str().expect("utf-8");
    let (ok, report, err) = bench(&c, &["--size", "8MiB", "--ec", "4+2", "--records", first]);
    assert!(ok, "{err}\n{report}");

    let (ok, report, err) = bench(&c, &["--size", "64MiB", "--ec", "4+2"]);
    assert!(
        !ok,
        "writing 64 MiB into 6 × 6 MiB stores succeeded: {report}"
    );
    assert!(err.contains("node full") && err.contains("node"), "{err}");
    assert!(report.is_null() || report["write"]["errors"].as_u64().unwrap_or(0) > 0);

    // Status says how full each store is, against its limit: some store is within two
    // shards of it (a refused shard's stripe may have had its other shards deleted since,
    // one of them on that store, by a writer giving the stripe up).
    let nearly_full = (1..=6).any(|i| {
        let st = &c.status(i).expect("status")["store"];
        let used = st["used_bytes"].as_u64().unwrap_or(0);
        st["limit_bytes"].as_u64() == Some(6 << 20) && used + (2 << 20) + 4096 > 6 << 20
    });
    assert!(nearly_full, "no node reports a nearly full store");
    assert_eq!(
        metric_sum(&c.metrics(2), "shoal_store_limit_bytes", ""),
        (6u64 << 20) as f64
    );

    let (ok, report, err) = bench(&c, &["--read-only", "--records", first]);
    assert!(
        ok,
        "data written before the store filled up is damaged: {err}\n{report}"
    );
    assert_eq!(report["mismatches"], 0);
    assert_eq!(report["decoded"], 0, "{report}");
}
