//! Today's agents start on a data dir the previous release wrote (`tests/fixtures`: log
//! records v1, snapshot v2, the `clients` table, facts without the store fields) and serve
//! everything it held; the cluster then takes new writes.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use shoal_tests::{DevCluster, wait_for};

fn fixture() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/cluster-0.1-formats-v1.tgz")
}

#[test]
fn a_cluster_written_by_the_previous_release_starts_and_serves_its_data() {
    // The fixture's addresses are 127.0.90.1-3.
    let c = DevCluster::prepare(3, 90, &["--mount"]);
    let ok = Command::new("tar")
        .arg("xzf")
        .arg(fixture())
        .arg("-C")
        .arg(c.path())
        .status()
        .expect("tar");
    assert!(ok.success(), "cannot unpack the fixture");
    c.start();
    let mnt = c.mnt(2);
    let (_, took) = wait_for(Duration::from_secs(30), "the old namespace", || {
        std::fs::read_dir(mnt.join("dir")).ok().map(|_| ())
    });
    eprintln!("old namespace served after {took:?}");
    for i in 1..=30 {
        let got = std::fs::read_to_string(mnt.join(format!("dir/s{i}"))).expect("small file");
        assert_eq!(got, format!("small file {i}\n"));
    }
    let seq = Command::new("seq")
        .args(["1", "100000"])
        .output()
        .expect("seq");
    let big = std::fs::read(mnt.join("dir/big")).expect("big");
    assert_eq!(big.len(), seq.stdout.len());
    assert!(big == seq.stdout, "dir/big differs");
    assert_eq!(
        std::fs::read_link(mnt.join("link")).expect("link"),
        Path::new("dir/big")
    );
    // New writes, on top of the old state, through another node.
    std::fs::write(c.mnt(3).join("dir/new"), b"written by this release\n").expect("write");
    assert_eq!(
        std::fs::read(c.mnt(1).join("dir/new")).expect("read"),
        b"written by this release\n"
    );
    c.wait_for_identical_replicas(Duration::from_secs(30));
    // And a restart of the upgraded cluster finds it all again.
    c.down();
    c.start();
    assert_eq!(
        std::fs::read(c.mnt(1).join("dir/new")).expect("read after restart"),
        b"written by this release\n"
    );
    assert_eq!(
        std::fs::read_to_string(c.mnt(1).join("dir/s30")).expect("s30"),
        "small file 30\n"
    );
}
