//! Writes while a node is down: a 6-node 4+2 cluster loses one node and its writers go on
//! (stripes written degraded, on five nodes), every byte reads back through another node,
//! and when the node returns only the degraded stripes get their missing shards. With
//! fewer nodes than `min_write_shards`, a write fails at once, saying why.

use std::fs::{self, File};
use std::io::Write;
use std::process::Command;
use std::time::{Duration, Instant};

use shoal_tests::{DevCluster, assert_bytes_eq, stream_bytes, wait_for, write_fsync};

#[test]
fn a_writer_goes_on_with_a_node_down_and_the_node_gets_its_shards_back() {
    let c = DevCluster::up_with(6, 50, &["--mount"]);
    let bound = Duration::from_millis(
        c.status(1).expect("status")["detection_bound_ms"]
            .as_u64()
            .expect("bound"),
    );
    // A node that is not a metadata voter: its loss is a data-path event only.
    let lost = *c.non_voters(1).last().expect("three non-voters of six");
    let writer = (1..=6).find(|&i| i != lost).expect("a writer");
    let reader = (1..=6)
        .rev()
        .find(|&i| i != lost && i != writer)
        .expect("a reader");
    let dir = c.mnt(writer).join("w");
    fs::create_dir(&dir).expect("mkdir");
    let mut files = Vec::new();
    let write = |i: u64, files: &mut Vec<(String, u64, usize, Duration)>| {
        let size = (1 << 20) + (i as usize * 997_123) % (7 << 20);
        let name = format!("f{i}");
        let started = Instant::now();
        write_fsync(&dir.join(&name), &stream_bytes(i, 0, size))
            .unwrap_or_else(|e| panic!("{name} ({size} bytes): {e}"));
        files.push((name, i, size, started.elapsed()));
    };
    for i in 0..4 {
        write(i, &mut files);
    }

    c.kill_agent(lost);
    let killed = Instant::now();
    for i in 4..24 {
        write(i, &mut files);
    }
    let longest = files[4..].iter().map(|f| f.3).max().unwrap_or_default();
    assert!(
        longest < bound + Duration::from_secs(10),
        "a write paused {longest:?} with one node down (detection bound {bound:?}); {:?}",
        files.iter().map(|f| (&f.0, f.3)).collect::<Vec<_>>()
    );
    eprintln!(
        "20 files written in {:?} after the kill; longest {longest:?}",
        killed.elapsed()
    );
    let degraded_writes = c.metric_everywhere("shoal_stripes_degraded_writes_total");
    assert!(degraded_writes > 0.0, "stripes were written on five nodes");
    for (name, seed, size, _) in &files {
        let got = fs::read(c.mnt(reader).join("w").join(name)).expect("read");
        assert_bytes_eq(&got, &stream_bytes(*seed, 0, *size), name);
    }
    // Every stripe is missing a shard: the four first on the node that is down, the
    // others never written. None is rebuilt elsewhere: no sixth node to put it on.
    let r = wait_for(Duration::from_secs(30), "a scan that sees the loss", || {
        let r = c.redundancy(writer)?;
        (r["stripes_degraded"].as_u64()? > 0 && r["stripes_healthy"].as_u64()? == 0).then_some(r)
    })
    .0;
    assert!(r["bytes_to_repair"].as_u64().unwrap_or(0) > 0, "{r}");
    assert!(r["bytes_waiting"].as_u64().unwrap_or(0) > 0, "{r}");
    let member = c.member(writer, &c.node_id(writer)).expect("self");
    assert_eq!(member["layout_state"], "active");

    c.start();
    let r = c.wait_until_healthy(writer, 24, Duration::from_secs(120));
    eprintln!("healthy again: {r}");
    let repaired = c.metric_everywhere("shoal_repair_stripes_total");
    assert_eq!(
        repaired, degraded_writes,
        "only the stripes written without the node were repaired"
    );
    for (name, seed, size, _) in &files {
        let got = fs::read(c.mnt(lost).join("w").join(name)).expect("read");
        assert_bytes_eq(&got, &stream_bytes(*seed, 0, *size), name);
    }
}

#[test]
fn with_fewer_nodes_than_min_write_shards_a_write_fails_at_once_saying_why() {
    let c = DevCluster::up_with(6, 51, &["--mount"]);
    let non_voters = c.non_voters(1);
    let (a, b) = (non_voters[0], non_voters[1]);
    let writer = (1..=6).find(|&i| i != a && i != b).expect("a writer");
    c.kill_agent(a);
    c.kill_agent(b);
    wait_for(
        Duration::from_secs(30),
        "both down in the writer's view",
        || {
            let s = c.status(writer)?;
            let down = s["nodes"]
                .as_array()?
                .iter()
                .filter(|n| n["state"] != "alive")
                .count();
            (down == 2).then_some(())
        },
    );
    let started = Instant::now();
    // Written as a multithreaded application may: a child started meanwhile inherits the
    // descriptor and closes its copy at exec, which the mount hears as a flush of the
    // file. That flush must not take the failure away from the writer's own fsync.
    let written = (|| -> std::io::Result<()> {
        let mut f = File::create(c.mnt(writer).join("big"))?;
        f.write_all(&stream_bytes(1, 0, 3 << 20))?;
        Command::new("true").status()?;
        f.sync_all()
    })();
    let Err(err) = written else {
        panic!(
            "4 nodes cannot take a 4+2 stripe with min_write_shards 5, yet the write \
             succeeded after {:?}; node {writer}'s log ends:\n{}",
            started.elapsed(),
            c.log(writer)
                .lines()
                .rev()
                .take(12)
                .collect::<Vec<_>>()
                .join("\n"),
        )
    };
    let err = err.to_string();
    let took = started.elapsed();
    assert!(err.contains("Input/output error"), "{err}");
    assert!(
        took < Duration::from_secs(15),
        "failed after {took:?}: not at once"
    );
    let log = c.log(writer);
    assert!(
        log.contains("needs at least 5 nodes that take shards") && log.contains("4 are alive"),
        "the agent says how many nodes are alive and needed; its log ends:\n{}",
        log.lines().rev().take(20).collect::<Vec<_>>().join("\n")
    );
    // Small files are metadata only: they still work.
    write_fsync(&c.mnt(writer).join("small"), b"inline").expect("inline file");
}
