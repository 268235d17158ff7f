//! Node maintenance on real agents: a drain under a live workload (a writer and a reader
//! through mounts on other nodes) ends with the node drained, nothing on it and its vote
//! moved; a drain whose agent is killed -9 mid-way resumes and finishes without orphans;
//! refusals say why before anything moves; undrain stops a drain mid-way; a maintenance
//! window keeps a stopped node from going out until it ends; a node that joins a loaded
//! cluster receives its share of shards. With fewer failure domains than k+m (7 or 6
//! nodes in 3 domains, 4+2) a drain that keeps every stripe's spread finishes, one that
//! would crowd a domain is refused saying so, and a node that joins still receives shards.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;
use shoal_tests::netfault::{self, Partition};
use shoal_tests::{DevCluster, Written, check_files, shard_files, shoal, wait_for, write_files};

/// A 2+1 cluster of `nodes` agents with mounts in `domains` failure domains, started
/// with `extra` arguments, once node 1 sees them all in the committed layout.
fn cluster(nodes: u8, subnet: u8, domains: u8, extra: &[&str]) -> DevCluster {
    let domains = domains.to_string();
    let mut args = vec!["--mount", "--failure-domains", &domains, "--ec", "2+1"];
    args.extend(extra);
    let c = DevCluster::up_with(nodes, subnet, &args);
    c.wait_layout(1);
    c
}

/// `shoal ARGS --socket <node i's>`: (exit code, stdout as JSON if it is, stdout, stderr).
fn cli(c: &DevCluster, i: u8, args: &[&str]) -> (i32, Value, String, String) {
    let socket = c.socket(i);
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--socket", socket.to_str().expect("socket path")]);
    let out = shoal(&all);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let json = serde_json::from_str(&stdout).unwrap_or(Value::Null);
    (
        out.status.code().unwrap_or(-1),
        json,
        stdout,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `shoal ARGS --socket <node i's>`, killed after `limit` (for `--wait`): (exit code,
/// stdout).
fn cli_within(c: &DevCluster, i: u8, args: &[&str], limit: Duration) -> (i32, String) {
    let out = std::process::Command::new("timeout")
        .arg(limit.as_secs().to_string())
        .arg(shoal_tests::binaries().shoal)
        .args(args)
        .arg("--socket")
        .arg(c.socket(i))
        .output()
        .expect("run shoal under timeout");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

/// The drain of node `id` as node `observer` reports it.
fn drain_status(c: &DevCluster, observer: u8, id: &str) -> Value {
    let (code, json, out, err) = cli(c, observer, &["drain", "status", id, "--json"]);
    assert_eq!(code, 0, "drain status: {out}{err}");
    json[0].clone()
}

fn wait_drained(c: &DevCluster, observer: u8, id: &str, limit: Duration) -> Value {
    let mut last = Value::Null;
    let started = Instant::now();
    loop {
        let d = drain_status(c, observer, id);
        if d["state"] == "drained" {
            return d;
        }
        assert_ne!(d["state"], "active", "the drain stopped: {d}");
        if d != last {
            eprintln!("drain: {d}");
            last = d;
        }
        assert!(
            started.elapsed() < limit,
            "not drained within {limit:?}: {last}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn voters(c: &DevCluster, observer: u8) -> Vec<String> {
    c.status(observer).expect("status")["meta"]["voters"]
        .as_array()
        .map(|v| {
            v.iter()
                .filter_map(|x| x.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// A writer through node `node`'s mount, writing files until `stop` is set.
fn background_writer(
    c: &DevCluster,
    node: u8,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Vec<Written>> {
    let mnt = c.mnt(node);
    std::thread::spawn(move || {
        let mut out = Vec::new();
        for seed in 1000.. {
            if stop.load(Ordering::SeqCst) {
                break;
            }
            let size = (1 << 20) + (seed as usize * 7_919) % (1 << 20);
            let name = format!("f{seed}");
            let data = shoal_tests::stream_bytes(seed, 0, size);
            shoal_tests::write_fsync(&mnt.join(&name), &data)
                .unwrap_or_else(|e| panic!("{name} written during the drain: {e}"));
            out.push(Written { name, seed, size });
        }
        out
    })
}

#[test]
fn a_node_drains_under_a_live_workload_and_every_file_reads_back() {
    let c = cluster(5, 57, 5, &["--meta", "orphan_shard_grace_s=5"]);
    // Drain a voter, so its vote has to move.
    let non_voters = c.non_voters(1);
    let drained = (1..=5).find(|i| !non_voters.contains(i)).expect("a voter");
    let others: Vec<u8> = (1..=5).filter(|&i| i != drained).collect();
    let (writer, reader) = (others[0], others[1]);
    let id = c.node_id(drained);
    let mut files = Vec::new();
    write_files(&c, writer, 0..10, &mut files);

    let (code, plan, out, err) = cli(&c, writer, &["drain", &id, "--dry-run", "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(plan["dry_run"], true, "{plan}");
    assert_eq!(plan["can_finish"], true, "{plan}");
    let to_move = plan["bytes"].as_u64().expect("bytes");
    assert!(plan["stripes"].as_u64() > Some(2), "{plan}");
    let per_target: u64 = plan["targets"]
        .as_array()
        .expect("targets")
        .iter()
        .map(|t| t["bytes"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(per_target, to_move, "every byte has a target: {plan}");
    assert_eq!(
        c.layout_state(writer, &id).as_deref(),
        Some("active"),
        "a dry run changes nothing"
    );

    let (code, started, out, err) = cli(&c, writer, &["drain", &id, "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(started["started"], true, "{started}");
    assert_eq!(started["bytes"], plan["bytes"], "{started}");
    let stop = Arc::new(AtomicBool::new(false));
    let during = background_writer(&c, writer, stop.clone());
    let read_stop = stop.clone();
    let reader_mnt = c.mnt(reader);
    let early: Vec<(String, u64, usize)> = files
        .iter()
        .map(|f| (f.name.clone(), f.seed, f.size))
        .collect();
    let reads = std::thread::spawn(move || {
        let mut rounds = 0;
        while !read_stop.load(Ordering::SeqCst) {
            for (name, seed, size) in &early {
                let got = std::fs::read(reader_mnt.join(name))
                    .unwrap_or_else(|e| panic!("read {name} during the drain: {e}"));
                shoal_tests::assert_bytes_eq(
                    &got,
                    &shoal_tests::stream_bytes(*seed, 0, *size),
                    name,
                );
            }
            rounds += 1;
        }
        rounds
    });

    let done = wait_drained(&c, reader, &id, Duration::from_secs(180));
    stop.store(true, Ordering::SeqCst);
    files.extend(during.join().expect("writer"));
    let rounds = reads.join().expect("reader");
    eprintln!(
        "drained: {done}; {} files written and {rounds} read rounds meanwhile",
        files.len() - 10
    );
    assert_eq!(done["stripes_left"], 0, "{done}");
    assert_eq!(done["bytes_total"], plan["bytes"], "{done}");
    let moved = c.metric_everywhere("shoal_repair_moved_bytes_total");
    assert_eq!(
        moved, to_move as f64,
        "the dry run said {to_move} bytes move; {moved} did"
    );
    assert!(!voters(&c, reader).contains(&id), "its vote moved off it");
    assert_eq!(c.layout_state(reader, &id).as_deref(), Some("drained"));
    wait_for(
        Duration::from_secs(60),
        "the drained node's copies swept",
        || shard_files(&c, drained).is_empty().then_some(()),
    );
    check_files(&c, reader, &files);

    // Removal: refused while its agent runs, done once it is stopped.
    let (code, _, out, err) = cli(&c, writer, &["remove", &id]);
    assert_ne!(code, 0, "{out}");
    assert!(err.contains("still running"), "{err}");
    c.stop_agent(drained);
    let (code, _, out, err) = cli(&c, writer, &["remove", &id]);
    assert_eq!(code, 0, "{out}{err}");
    wait_for(
        Duration::from_secs(10),
        "the node gone from the layout",
        || c.layout_state(writer, &id).is_none().then_some(()),
    );
    check_files(&c, reader, &files);
}

#[test]
fn a_drain_started_through_one_node_shows_in_another_nodes_status_at_once() {
    if !netfault::available() {
        eprintln!("SKIPPED: needs root and nftables");
        return;
    }
    let c = cluster(5, 64, 5, &[]);
    let non_voters = c.non_voters(1);
    let (observer, drained) = (non_voters[0], non_voters[1]);
    let starter = (1..=5).find(|i| !non_voters.contains(i)).expect("a voter");
    let id = c.node_id(drained);
    let mut files = Vec::new();
    write_files(&c, starter, 0..4, &mut files);
    // The observer misses the drain's commit while it is cut off (the voters commit it
    // without it)...
    {
        let _cut = Partition::isolate(c.ip(observer));
        let (code, _, out, err) = cli(&c, starter, &["drain", &id, "--json"]);
        assert_eq!(code, 0, "{out}{err}");
        // Long enough for the leader to back off from sending to it.
        std::thread::sleep(Duration::from_secs(3));
    }
    // ...and, asked the moment it is back, answers from everything committed before the
    // question, not from what its replica happens to have applied.
    let d = drain_status(&c, observer, &id);
    assert_ne!(
        d["state"], "active",
        "the drain started before the question: {d}"
    );
    let (code, _, out, err) = cli(&c, observer, &["undrain", &id]);
    assert_eq!(code, 0, "undrain through the observer: {out}{err}");
    check_files(&c, observer, &files);
}

#[test]
fn a_drain_whose_worker_is_killed_resumes_and_leaves_no_orphans() {
    // Moves paced to a few shards a second, so the kill lands mid-way.
    let c = cluster(
        5,
        58,
        5,
        &[
            "--set",
            "background.rate=\"1MiB\"",
            "--meta",
            "orphan_shard_grace_s=5",
        ],
    );
    let drained = *c.non_voters(1).first().expect("a non-voter");
    let id = c.node_id(drained);
    let writer = (1..=5).find(|&i| i != drained).expect("a writer");
    let mut files = Vec::new();
    write_files(&c, writer, 0..12, &mut files);
    let (code, plan, out, err) = cli(&c, writer, &["drain", &id, "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    let total = plan["stripes"].as_u64().expect("stripes");
    let leader = c.meta_leader(writer).expect("a leader");
    wait_for(Duration::from_secs(90), "the drain under way", || {
        let d = drain_status(&c, writer, &id);
        let left = d["stripes_left"].as_u64()?;
        (left < total && left > 0).then_some(())
    });
    c.kill_agent(leader);
    c.respawn_agent(leader);
    let observer = (1..=5)
        .find(|&i| i != drained && i != leader)
        .expect("an observer");
    // `--wait` on the drain under way shows its progress to the end (plain lines: not a
    // terminal).
    let (code, out) = cli_within(
        &c,
        observer,
        &["drain", &id, "--wait"],
        Duration::from_secs(240),
    );
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("already draining"), "{out}");
    assert!(out.contains("stripes") && out.contains("drained"), "{out}");
    let d = drain_status(&c, observer, &id);
    assert_eq!(d["state"], "drained", "{d}");
    assert_eq!(d["stripes_total"], total, "{d}");
    let stripes = c.wait_until_healthy(observer, files.len() as u64, Duration::from_secs(60))
        ["stripes_total"]
        .as_u64()
        .expect("stripes_total");
    // Every node holds exactly what the records name: the drained one nothing, the
    // others three shards per stripe between them (copies the killed agent stored but
    // never committed are swept).
    wait_for(Duration::from_secs(90), "no orphan shard left", || {
        let held: u64 = (1..=5).map(|i| shard_files(&c, i).len() as u64).sum();
        (held == stripes * 3 && shard_files(&c, drained).is_empty()).then_some(())
    });
    check_files(&c, observer, &files);
}

#[test]
fn refusals_say_why_and_undrain_stops_a_drain_mid_way() {
    let c = cluster(
        4,
        59,
        4,
        &[
            "--set",
            "background.rate=\"1MiB\"",
            "--meta",
            "orphan_shard_grace_s=5",
        ],
    );
    let mut files = Vec::new();
    write_files(&c, 1, 0..8, &mut files);
    let id = c.node_id(4);
    // Nothing to remove yet, nothing to undrain.
    let (code, _, _, err) = cli(&c, 1, &["remove", &id]);
    assert_ne!(code, 0);
    assert!(err.contains("only a drained or out node"), "{err}");
    let (code, _, _, err) = cli(&c, 1, &["undrain", &id]);
    assert_ne!(code, 0);
    assert!(err.contains("(the node is active)"), "{err}");
    let (code, _, _, err) = cli(&c, 1, &["drain", "no-such-node"]);
    assert_ne!(code, 0);
    assert!(err.contains("no node \"no-such-node\""), "{err}");

    // Start a slow drain, then undrain it mid-way.
    let (code, plan, out, err) = cli(&c, 1, &["drain", &id, "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    let total = plan["stripes"].as_u64().expect("stripes");
    let left = wait_for(Duration::from_secs(90), "the drain under way", || {
        let left = drain_status(&c, 1, &id)["stripes_left"].as_u64()?;
        (left < total).then_some(left)
    })
    .0;
    let (code, _, out, err) = cli(&c, 1, &["undrain", &id]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("active again"), "{out}");
    assert_eq!(c.layout_state(1, &id).as_deref(), Some("active"));
    eprintln!("undrained with {left} of {total} stripes left on node 4");
    // Nothing already moved is lost (rebalance may later move some back: node 4 is a
    // placement target again).
    check_files(&c, 2, &files);

    // With node 4 drained, 2+1 would keep only three failure domains: a drain of another
    // node is refused before anything moves, with the numbers, and exits 1.
    let (code, out) = cli_within(&c, 1, &["drain", &id, "--wait"], Duration::from_secs(240));
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("draining"), "{out}");
    let other = c.node_id(3);
    let (code, dry, out, _) = cli(&c, 1, &["drain", &other, "--dry-run", "--json"]);
    assert_eq!(code, 0, "a dry run answers: {out}");
    assert_eq!(dry["can_finish"], false, "{dry}");
    let (code, _, out, _) = cli(&c, 1, &["drain", &other]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("NOT draining"), "{out}");
    assert!(out.contains("failure domain"), "{out}");
    assert_eq!(c.layout_state(1, &other).as_deref(), Some("active"));
    check_files(&c, 2, &files);
}

#[test]
fn a_maintenance_window_keeps_a_stopped_node_from_going_out_until_it_ends() {
    let c = cluster(4, 60, 4, &["--set", "cluster.down_out_after=\"3s\""]);
    let node = *c.non_voters(1).first().expect("a non-voter");
    let observer = (1..=4).find(|&i| i != node).expect("an observer");
    let id = c.node_id(node);
    let mut files = Vec::new();
    write_files(&c, observer, 0..6, &mut files);
    let (code, _, out, err) = cli(&c, observer, &["maintenance", "enter", &id, "--for", "15s"]);
    assert_eq!(code, 0, "{out}{err}");
    let entered = Instant::now();
    assert_eq!(
        c.layout_state(observer, &id).as_deref(),
        Some("maintenance")
    );
    c.stop_agent(node);
    // Down well past down_out_after (3 s), inside the window: not out, nothing rebuilt.
    let (m, _) = wait_for(Duration::from_secs(30), "the node down for 9 s", || {
        let m = c.member(observer, &id)?;
        (m["down_for_ms"].as_u64()? >= 9_000).then_some(m)
    });
    assert_eq!(m["layout_state"], "maintenance", "{m}");
    assert!(m["maintenance_ends_in_ms"].as_i64() > Some(0), "{m}");
    assert_eq!(c.metric_everywhere("shoal_repair_stripes_total"), 0.0);
    let table = shoal(&[
        "status",
        "--socket",
        c.socket(observer).to_str().expect("socket"),
    ]);
    let table = String::from_utf8_lossy(&table.stdout).into_owned();
    assert!(table.contains("maintenance,"), "{table}");
    check_files(&c, observer, &files);
    // The window ends with the node still down: out, and its shards rebuilt.
    wait_for(
        Duration::from_secs(30),
        "the node out after its window",
        || (c.layout_state(observer, &id).as_deref() == Some("out")).then_some(()),
    );
    assert!(
        entered.elapsed() >= Duration::from_secs(15),
        "out before the window ended"
    );
    c.wait_until_healthy(observer, files.len() as u64, Duration::from_secs(120));
    check_files(&c, observer, &files);
}

#[test]
fn a_new_node_receives_its_share_and_reads_stay_correct() {
    let mut c = cluster(4, 62, 5, &["--meta", "orphan_shard_grace_s=5"]);
    let mut files = Vec::new();
    write_files(&c, 1, 0..16, &mut files);
    let stripes =
        c.wait_until_healthy(1, files.len() as u64, Duration::from_secs(60))["stripes_total"]
            .as_u64()
            .expect("stripes_total");
    // A fifth server joins (its own failure domain).
    c.nodes = 5;
    c.start();
    c.wait_layout(1);
    let r = wait_for(Duration::from_secs(180), "the rebalance done", || {
        let r = c.redundancy(2)?;
        let held = shard_files(&c, 5).len() as u64;
        (r["rebalance_bytes"] == 0 && held > 0 && r["stripes_healthy"] == r["stripes_total"])
            .then_some(r)
    })
    .0;
    let held = shard_files(&c, 5).len() as u64;
    eprintln!(
        "node 5 holds {held} of {} shards after the join: {r}",
        stripes * 3
    );
    // Its share is 3 of every 5 stripes (one shard each); the bounds only rule out
    // "nothing" and "everything".
    assert!(
        held * 5 >= stripes && held <= stripes,
        "node 5 holds {held} shards of {stripes} stripes"
    );
    let moved = c.metric_everywhere("shoal_repair_rebalanced_bytes_total");
    assert!(moved > 0.0, "rebalance counted its bytes");
    check_files(&c, 5, &files);
    check_files(&c, 2, &files);
    // Every node holds exactly what the records name once the moved-away copies are swept.
    wait_for(Duration::from_secs(90), "no orphan shard left", || {
        let all: u64 = (1..=5).map(|i| shard_files(&c, i).len() as u64).sum();
        (all == stripes * 3).then_some(())
    });
}

#[test]
fn a_drain_the_others_have_no_room_for_is_refused_with_the_numbers() {
    let c = cluster(4, 63, 4, &[]);
    let mut files = Vec::new();
    write_files(&c, 1, 0..9, &mut files);
    // Nodes 1 to 3 get a fill limit at about what they hold: no room for node 4's shards.
    for i in 1..=3 {
        c.restart_with_config(i, |config| {
            config.replace("capacity = \"90%\"", "capacity = \"7MiB\"")
        });
    }
    let id = c.node_id(4);
    let assess = || {
        let (code, dry, out, err) = cli(&c, 1, &["drain", &id, "--dry-run", "--json"]);
        assert_eq!(code, 0, "{out}{err}");
        (dry["can_finish"] == false).then_some(dry)
    };
    // The new limits reach the planner through the nodes' gossiped room.
    let dry = wait_for(Duration::from_secs(30), "the drain refused", assess).0;
    let reasons = dry["reasons"].to_string();
    assert!(reasons.contains("no node to go to"), "{dry}");
    assert!(
        reasons.contains("bytes of room on the other nodes"),
        "{dry}"
    );
    let (code, _, out, _) = cli(&c, 1, &["drain", &id]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("NOT draining"), "{out}");
    assert_eq!(c.layout_state(1, &id).as_deref(), Some("active"));
    check_files(&c, 2, &files);
}

/// A 4+2 cluster of `nodes` agents with mounts, in three failure domains (round robin:
/// node i in fd((i-1) % 3 + 1)): fewer domains than k+m, as with racks as domains.
fn three_domains(nodes: u8, subnet: u8) -> DevCluster {
    let c = DevCluster::up_with(
        nodes,
        subnet,
        &[
            "--mount",
            "--failure-domains",
            "3",
            "--ec",
            "4+2",
            "--meta",
            "orphan_shard_grace_s=5",
        ],
    );
    c.wait_layout(1);
    c
}

/// Writes files `s<seed>` of 256 to 512 KiB (one stripe each) through node `node`'s
/// mount, fsync'd.
fn write_one_stripe_files(
    c: &DevCluster,
    node: u8,
    seeds: std::ops::Range<u64>,
    out: &mut Vec<Written>,
) {
    for seed in seeds {
        let size = (256 << 10) + (seed as usize * 7_919) % (256 << 10);
        let name = format!("s{seed}");
        shoal_tests::write_fsync(
            &c.mnt(node).join(&name),
            &shoal_tests::stream_bytes(seed, 0, size),
        )
        .unwrap_or_else(|e| panic!("{name} ({size} bytes): {e}"));
        out.push(Written { name, seed, size });
    }
}

#[test]
fn a_drain_with_fewer_domains_than_k_plus_m_finishes_when_no_stripe_gets_worse() {
    // 7 nodes in 3 domains: fd1 holds nodes 1, 4, 7; fd2 nodes 2, 5; fd3 nodes 3, 6.
    // Every stripe holds two shards in each domain.
    let c = three_domains(7, 160);
    let mut files = Vec::new();
    write_one_stripe_files(&c, 1, 0..24, &mut files);
    let stripes =
        c.wait_until_healthy(1, files.len() as u64, Duration::from_secs(60))["stripes_total"]
            .as_u64()
            .expect("stripes_total");
    // Node 5's shards could only go to fd1 (fd2 would keep node 2 alone): three shards of
    // a stripe in one domain, whose loss would then lose the stripe. Refused, saying so.
    let (code, dry, out, err) = cli(&c, 1, &["drain", &c.node_id(5), "--dry-run", "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(dry["can_finish"], false, "{dry}");
    let reasons = dry["reasons"].to_string();
    eprintln!("node 5's drain refused: {reasons}");
    assert!(reasons.contains("3 shards in one failure domain"), "{dry}");
    assert!(reasons.contains("now at most 2"), "{dry}");
    // Node 7's go to the other fd1 node: each stripe as well spread as before.
    let id = c.node_id(7);
    let (code, dry, out, err) = cli(&c, 1, &["drain", &id, "--dry-run", "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(dry["can_finish"], true, "{dry}");
    let (code, out) = cli_within(&c, 1, &["drain", &id, "--wait"], Duration::from_secs(240));
    assert_eq!(code, 0, "{out}");
    assert_eq!(c.layout_state(1, &id).as_deref(), Some("drained"), "{out}");
    wait_for(Duration::from_secs(90), "node 7's copies swept", || {
        let held: u64 = (1..=6).map(|i| shard_files(&c, i).len() as u64).sum();
        (held == stripes * 6 && shard_files(&c, 7).is_empty()).then_some(())
    });
    c.wait_until_healthy(2, stripes, Duration::from_secs(60));
    check_files(&c, 2, &files);
    check_files(&c, 6, &files);
}

#[test]
fn a_node_joining_fewer_domains_than_k_plus_m_receives_its_share() {
    // 6 nodes in 3 domains (two each): every stripe has a shard on every node.
    let mut c = three_domains(6, 161);
    let mut files = Vec::new();
    write_one_stripe_files(&c, 1, 0..48, &mut files);
    let stripes =
        c.wait_until_healthy(1, files.len() as u64, Duration::from_secs(90))["stripes_total"]
            .as_u64()
            .expect("stripes_total");
    // A seventh server joins fd1, beside nodes 1 and 4: moves from them to it keep every
    // stripe's spread as it is.
    c.nodes = 7;
    c.start();
    c.wait_layout(1);
    let share = stripes * 6 / 7;
    let (held, took) = wait_for(
        Duration::from_secs(180),
        "node 7 holds half its share",
        || {
            let held = shard_files(&c, 7).len() as u64;
            (held * 2 >= share).then_some(held)
        },
    );
    eprintln!("node 7 holds {held} shards ({share} its weight share) {took:?} after the join");
    let since = Instant::now();
    let r = wait_for(Duration::from_secs(180), "the rebalance done", || {
        let r = c.redundancy(2)?;
        let fresh = r["scanned_ms_ago"]
            .as_u64()
            .is_some_and(|ago| Duration::from_millis(ago) < since.elapsed());
        (fresh && r["rebalance_bytes"] == 0 && r["stripes_healthy"] == r["stripes_total"])
            .then_some(r)
    })
    .0;
    eprintln!(
        "after the rebalance node 7 holds {} shards: {r}",
        shard_files(&c, 7).len()
    );
    check_files(&c, 7, &files);
    check_files(&c, 2, &files);
    wait_for(Duration::from_secs(90), "no orphan shard left", || {
        let all: u64 = (1..=7).map(|i| shard_files(&c, i).len() as u64).sum();
        (all == stripes * 6).then_some(())
    });
}
