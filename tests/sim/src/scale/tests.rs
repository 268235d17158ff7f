//! The scale run at a size a debug test affords: what it measures must be sane.

use std::time::Duration;

use super::*;

const NODES: usize = 50;
const SEED: u64 = 11;

#[test]
fn fifty_nodes_detect_a_kill_rebuild_it_once_each_and_move_about_one_nth() {
    let report = run(NODES, SEED);
    let d = report.detection.as_ref().expect("membership ran");
    assert!(d.joined_after.is_some(), "never formed: {d:?}");
    assert_eq!(
        d.declared,
        NODES - 1,
        "not every survivor declared the kill"
    );
    let all = d.all_down.expect("down everywhere");
    let first = d.first_down.expect("down somewhere");
    assert!(first <= all && all < Duration::from_secs(30), "{d:?}");
    assert!(
        first >= d.config.suspect_to_down,
        "down before suspicion ran out: {d:?}"
    );
    assert_eq!(d.false_downs, 0, "a live member declared down");
    assert!(d.packets_per_member_per_sec > 1.0, "{d:?}");

    let p = report.placement.as_ref().expect("placement ran");
    let r = &p.rebuild;
    let k = usize::from(p.profile.k) as u64;
    assert!(r.lost_shards > 0);
    assert_eq!(r.planned, r.lost_shards, "every lost shard is planned");
    assert_eq!(r.misplanned, 0, "{r:?}");
    assert_eq!((r.no_target, r.unreadable), (0, 0));
    // One lost shard per stripe (a node holds at most one), rebuilt from k survivors.
    assert_eq!(r.tasks as u64, r.lost_shards);
    assert_eq!(r.received.total, r.planned);
    assert_eq!(r.read.total, k * r.planned);
    assert_eq!(r.received.nodes, NODES - 1);
    assert!(
        r.received.nonzero > NODES / 2,
        "rebuild on few nodes: {r:?}"
    );

    let m = &p.movement;
    for change in [&m.join, &m.leave] {
        let x = change.over_ideal();
        assert!((0.5..2.0).contains(&x), "{change:?} moved x{x} the ideal");
        assert!(change.necessary > 0 && change.necessary <= change.moved);
    }
    assert_eq!(
        m.leave.necessary, r.lost_shards,
        "what the leaver held moves"
    );
    let moves = m.join.rebalance_moves.expect("join counts rebalance");
    assert!(
        moves >= m.join.necessary / 2 && moves <= m.join.moved,
        "{m:?}"
    );
}

#[test]
fn the_same_seed_prints_the_same_report() {
    let once = run(16, 3).to_string();
    assert_eq!(once, run(16, 3).to_string());
    assert_ne!(once, run(16, 4).to_string());
    assert!(!once.contains("failed"), "{once}");
}

#[test]
fn too_few_nodes_are_reported_not_a_panic() {
    let report = run(4, 1);
    assert!(report.placement.is_err());
    assert!(
        report
            .to_string()
            .contains("placement: failed: not enough nodes")
    );
}
