//! The cold tier against a real S3 server (Garage, started here): the store contract,
//! data going cold and coming back through another node's mount, an S3 outage during
//! uploads and during reads, prefetch, pins under watermark pressure, garbage objects,
//! and repair and drain leaving tiered stripes alone.
//!
//! Subnets 64–69, 80 and 81.

use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use serde_json::Value;
use shoal_tests::garage::{self, Garage};
use shoal_tests::{
    DevCluster, Written, assert_bytes_eq, check_files, metric_sum, shard_files, shoal,
    stream_bytes, wait_for, write_files, write_fsync,
};
use shoal_tiering::{ObjectBackend, S3Settings, contract};

fn settings(s3: &Garage, prefix: &str) -> S3Settings {
    S3Settings {
        endpoint: Some(s3.endpoint()),
        region: garage::REGION.into(),
        bucket: garage::BUCKET.into(),
        path_style: true,
        access_key_id: garage::KEY_ID.into(),
        secret_access_key: garage::SECRET.into(),
        prefix: prefix.into(),
    }
}

/// A 3-node cluster with mounts whose cold tier is `s3`, with these `--set tiering.*`
/// settings.
fn cluster(s3: &Garage, subnet: u8, nodes: u8, tiering: &[&str]) -> DevCluster {
    let mut args = s3.cluster_args();
    args.push("--mount".into());
    for t in tiering {
        args.push("--set".into());
        args.push(format!("tiering.{t}"));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    DevCluster::up_with(nodes, subnet, &args)
}

/// `shoal tier status --json` on node `i`.
fn tier(c: &DevCluster, i: u8) -> Value {
    let socket = c.socket(i);
    let out = shoal(&[
        "tier",
        "status",
        "--json",
        "--socket",
        socket.to_str().unwrap_or(""),
    ]);
    assert!(
        out.status.success(),
        "tier status: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("tier status JSON")
}

fn n(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_else(|| panic!("{key} in {v}"))
}

/// Runs `shoal tier ARGS --socket node i's`; (success, stdout + stderr).
fn tier_cmd(c: &DevCluster, i: u8, args: &[&str]) -> (bool, String) {
    let socket = c.socket(i);
    let mut all = vec!["tier"];
    all.extend_from_slice(args);
    all.extend(["--socket", socket.to_str().unwrap_or("")]);
    let out = shoal(&all);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Bytes of every node's shard files.
fn shard_bytes(c: &DevCluster) -> u64 {
    (1..=c.nodes)
        .flat_map(|i| shard_files(c, i))
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum()
}

fn wait_cold(c: &DevCluster, files: u64, limit: Duration) {
    wait_for(limit, "every file in the cold tier", || {
        let t = tier(c, 1);
        (n(&t, "cold_files") == files && n(&t, "hot_bytes") == 0).then_some(())
    });
}

#[tokio::test]
async fn garage_keeps_the_cold_store_contract() {
    let s3 = Garage::start(64);
    let store = ObjectBackend::s3(&settings(&s3, "")).expect("s3 store");
    contract::run(&store, "contract").await;
    // Under a prefix, keys stay apart from the bucket's other users.
    let prefixed = ObjectBackend::s3(&settings(&s3, "cluster-a")).expect("s3 store");
    contract::run(&prefixed, "contract").await;
}

#[test]
fn cold_data_leaves_nvme_and_reads_back_identical_through_another_mount() {
    let s3 = Garage::start(65);
    let c = cluster(&s3, 65, 3, &["cold_after=\"3s\"", "scan_interval=\"1s\""]);
    let mut files = Vec::new();
    write_files(&c, 1, 0..6, &mut files);
    // A large file: a small read of it once it is cold must not fetch the file.
    let big = 64usize << 20;
    write_fsync(&c.mnt(1).join("big"), &stream_bytes(99, 0, big)).expect("write big");
    files.push(Written {
        name: "big".into(),
        seed: 99,
        size: big,
    });
    let stored = shard_bytes(&c);
    assert!(stored > big as u64, "{stored} shard bytes before");

    wait_cold(&c, 7, Duration::from_secs(120));
    let t = tier(&c, 1);
    assert!(
        n(&t, "objects") >= 1 && n(&t, "cold_bytes") >= big as u64,
        "{t}"
    );
    // `shoal stat` names each cold extent's object and range.
    let (path, socket) = (c.mnt(1).join("big"), c.socket(1));
    let out = shoal(&[
        "stat",
        "--json",
        path.to_str().unwrap_or(""),
        "--socket",
        socket.to_str().unwrap_or(""),
    ]);
    let stat: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("stat --json: {}", String::from_utf8_lossy(&out.stderr)));
    let cold = stat["cold_extents"].as_array().expect("cold_extents");
    assert_eq!(
        cold.len(),
        stat["extents"].as_array().map_or(0, Vec::len),
        "{stat}"
    );
    assert!(cold.iter().all(|e| {
        e["object"]
            .as_str()
            .is_some_and(|o| o.starts_with("objects/"))
    }));
    // The shards are freed once the stripes are committed cold.
    wait_for(Duration::from_secs(90), "local shards freed", || {
        (shard_bytes(&c) < stored / 20).then_some(())
    });

    // A 4 KiB read on node 3 fetches about one stripe's range of one object.
    let got_before = metric_sum(&c.metrics(3), "shoal_tier_get_bytes_total", "");
    let at = (33u64 << 20) + 5;
    let f = std::fs::File::open(c.mnt(3).join("big")).expect("open big");
    let mut buf = vec![0u8; 4096];
    f.read_exact_at(&mut buf, at).expect("4 KiB read");
    assert_bytes_eq(&buf, &stream_bytes(99, at, 4096), "4 KiB of big");
    let fetched = metric_sum(&c.metrics(3), "shoal_tier_get_bytes_total", "") - got_before;
    assert!(
        fetched > 0.0 && fetched <= f64::from(4u32 << 20),
        "a 4 KiB read fetched {fetched} bytes of a {big}-byte file"
    );

    // Everything reads back identical through another node's mount.
    check_files(&c, 2, &files);

    // Read repeatedly, cold data comes back to NVMe: f0, read on node 3, is pushed out of
    // its 64 MiB recall cache by all of big, then read (and fetched) again.
    if shoal_tests::is_root() {
        let f0 = std::slice::from_ref(&files[0]);
        check_files(&c, 3, f0);
        check_files(&c, 3, &files[6..]);
        // The kernel's page cache must not answer the second read.
        std::fs::write("/proc/sys/vm/drop_caches", "3").expect("drop caches");
        check_files(&c, 3, f0);
        wait_for(
            Duration::from_secs(30),
            "a stripe read repeatedly warmed",
            || {
                (metric_sum(&c.metrics(3), "shoal_tier_warmed_stripes_total", "") > 0.0)
                    .then_some(())
            },
        );
        check_files(&c, 1, f0);
    }
}

#[test]
fn an_s3_outage_frees_nothing_early_and_the_mover_resumes() {
    let mut s3 = Garage::start(66);
    let c = cluster(&s3, 66, 3, &["cold_after=\"2s\"", "scan_interval=\"1s\""]);
    s3.stop();
    let mut files = Vec::new();
    write_files(&c, 1, 0..4, &mut files);
    let stored = shard_bytes(&c);
    // The mover (on the leader) tries, fails and backs off; nothing is cold, nothing freed.
    let (leader, _) = wait_for(Duration::from_secs(60), "the mover backing off", || {
        (1..=3).find(|&i| tier(&c, i)["mover"] == "backing off")
    });
    let t = tier(&c, leader);
    assert_eq!(t["store_ok"], false, "{t}");
    assert!(t["last_error"].is_string(), "{t}");
    assert_eq!(n(&t, "cold_bytes"), 0, "{t}");
    assert!(shard_bytes(&c) >= stored, "shards freed during the outage");
    let (ok, text) = tier_cmd(
        &c,
        2,
        &["release", c.mnt(2).join("f0").to_str().unwrap_or("")],
    );
    assert!(!ok, "a release during the outage succeeded: {text}");
    // Hot data is untouched by the outage.
    check_files(&c, 3, &files);

    s3.resume();
    wait_cold(&c, 4, Duration::from_secs(120));
    check_files(&c, 2, &files);
}

#[test]
fn reads_of_cold_data_fail_within_the_bound_during_an_outage_and_hot_data_works() {
    let mut s3 = Garage::start(67);
    let c = cluster(&s3, 67, 3, &["cold_after=\"off\"", "recall_timeout=\"3s\""]);
    let mut cold = Vec::new();
    write_files(&c, 1, 0..2, &mut cold);
    let (ok, text) = tier_cmd(&c, 1, &["release", c.mnt(1).to_str().unwrap_or("")]);
    assert!(ok, "release: {text}");
    assert_eq!(n(&tier(&c, 1), "cold_files"), 2);
    let mut hot = Vec::new();
    write_files(&c, 1, 10..12, &mut hot);

    s3.stop();
    let started = Instant::now();
    let mut f = std::fs::File::open(c.mnt(2).join("f0")).expect("open f0");
    let mut buf = Vec::new();
    let err = f
        .read_to_end(&mut buf)
        .expect_err("a cold read during the outage");
    let took = started.elapsed();
    assert_eq!(err.raw_os_error(), Some(libc_eio()), "{err}");
    assert!(
        took < Duration::from_secs(20),
        "the cold read took {took:?}"
    );
    check_files(&c, 2, &hot);
    let t = tier(&c, 2);
    assert_eq!(t["store_ok"], false, "{t}");

    s3.resume();
    // The same open file reads once the store is back.
    f.seek(SeekFrom::Start(0)).expect("seek");
    buf.clear();
    f.read_to_end(&mut buf).expect("read after the outage");
    assert_bytes_eq(&buf, &stream_bytes(cold[0].seed, 0, cold[0].size), "f0");
    check_files(&c, 3, &cold);
}

fn libc_eio() -> i32 {
    nix::errno::Errno::EIO as i32
}

#[test]
fn prefetch_warms_pins_hold_under_pressure_and_garbage_objects_go() {
    let s3 = Garage::start(68);
    // Every file is over the watermarks at once: the policy sends all but the pinned.
    let c = cluster(
        &s3,
        68,
        3,
        &[
            "cold_after=\"off\"",
            "high_watermark=0.001",
            "low_watermark=0.0",
            "scan_interval=\"1s\"",
        ],
    );
    let keep = c.mnt(1).join("keep");
    let (ok, text) = tier_cmd(&c, 1, &["pin", keep.to_str().unwrap_or("")]);
    assert!(!ok, "pinning a path that does not exist: {text}");
    std::fs::create_dir(&keep).expect("mkdir keep");
    let (ok, text) = tier_cmd(&c, 1, &["pin", keep.to_str().unwrap_or("")]);
    assert!(ok, "pin: {text}");
    let mut files = Vec::new();
    write_files(&c, 1, 0..3, &mut files);
    let pinned = stream_bytes(50, 0, 3 << 20);
    write_fsync(&keep.join("p"), &pinned).expect("write pinned");

    wait_for(Duration::from_secs(90), "unpinned files cold", || {
        let t = tier(&c, 1);
        (n(&t, "cold_files") == 3).then_some(())
    });
    // The pinned file stays hot under the pressure, several passes later (of the
    // leader's mover: the others' stand by).
    let (leader, _) = wait_for(Duration::from_secs(30), "a metadata leader", || {
        c.meta_leader(1)
    });
    c.wait_for_rounds(&[leader], "tier-mover", 3, Duration::from_secs(60));
    let t = tier(&c, 1);
    assert_eq!((n(&t, "cold_files"), n(&t, "hot_files")), (3, 1), "{t}");

    // Prefetch brings f0 back; reading it then makes no GET anywhere.
    let (ok, text) = tier_cmd(
        &c,
        2,
        &[
            "prefetch",
            "--wait",
            c.mnt(2).join("f0").to_str().unwrap_or(""),
        ],
    );
    assert!(ok && text.contains("warmed onto NVMe"), "prefetch: {text}");
    let gets = c.metric_everywhere("shoal_tier_get_requests_total");
    check_files(&c, 3, &files[..1]);
    assert_eq!(
        c.metric_everywhere("shoal_tier_get_requests_total"),
        gets,
        "a read of prefetched data went to the bucket"
    );

    // Overwrite one tiered file and delete the rest: no object is left once GC ran
    // (unpin first, so the pressure takes everything and nothing stays hot by pin).
    let (ok, text) = tier_cmd(&c, 1, &["unpin", keep.to_str().unwrap_or("")]);
    assert!(ok, "unpin: {text}");
    write_fsync(&c.mnt(1).join("f1"), b"small now").expect("overwrite f1");
    for f in ["f0", "f2", "keep/p"] {
        std::fs::remove_file(c.mnt(1).join(f)).expect("remove");
    }
    let store = ObjectBackend::s3(&settings(&s3, "")).expect("store");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    wait_for(
        Duration::from_secs(90),
        "no object left in the bucket",
        || {
            let t = tier(&c, 1);
            let listed = rt
                .block_on(shoal_tiering::ColdStore::list(&store, "objects"))
                .expect("list");
            (n(&t, "objects") == 0 && n(&t, "garbage_objects") == 0 && listed.is_empty())
                .then_some(())
        },
    );
    assert_eq!(
        std::fs::read(c.mnt(2).join("f1")).expect("f1"),
        b"small now"
    );
}

#[test]
fn repair_and_drain_leave_tiered_stripes_to_the_bucket() {
    let s3 = Garage::start(69);
    let c = cluster(&s3, 69, 4, &["cold_after=\"off\""]);
    c.wait_layout(1);
    let mut files = Vec::new();
    write_files(&c, 1, 0..4, &mut files);
    let (ok, text) = tier_cmd(&c, 1, &["release", c.mnt(1).to_str().unwrap_or("")]);
    assert!(ok, "release: {text}");
    // A drain of any node has nothing to move: every stripe is in the bucket.
    let socket = c.socket(1);
    let out = shoal(&[
        "drain",
        "node4",
        "--dry-run",
        "--json",
        "--socket",
        socket.to_str().unwrap_or(""),
    ]);
    let plan: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("drain --dry-run: {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!((n(&plan, "stripes"), n(&plan, "bytes")), (0, 0), "{plan}");
    // A node lost: no stripe counts as degraded and nothing needs repair.
    let id4 = c.node_id(4);
    c.kill_agent(4);
    wait_for(Duration::from_secs(60), "node 4 seen down", || {
        (c.member(1, &id4)?["state"] != "alive").then_some(())
    });
    // Two repair passes after the loss.
    let r = c.wait_for_scans(1, 2, Duration::from_secs(60));
    assert_eq!(
        (
            &r["stripes_degraded"],
            &r["stripes_unreadable"],
            &r["bytes_to_repair"]
        ),
        (&Value::from(0), &Value::from(0), &Value::from(0)),
        "{r}"
    );
    check_files(&c, 2, &files);
}

#[test]
fn a_bucket_claimed_by_another_cluster_is_refused() {
    let s3 = Garage::start(80);
    let a = cluster(&s3, 80, 3, &[]);
    assert!(tier(&a, 1)["store"].as_str().is_some());
    // Another cluster (its own CA) naming the same bucket and prefix: its agents refuse
    // to start, naming the reason, rather than collect the first cluster's objects.
    let mut args = s3.cluster_args();
    args.extend(["--ec".into(), "2+1".into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let b = DevCluster::prepare(3, 81, &args);
    let out = b.run_up();
    assert!(!out.status.success(), "the second cluster started");
    let log = b.log(1);
    assert!(
        log.contains("belongs to another shoal cluster"),
        "{}\n{log}",
        String::from_utf8_lossy(&out.stderr)
    );
}
