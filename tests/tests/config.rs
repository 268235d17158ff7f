//! The agent's config loader, exercised through the real binary.

use std::process::Command;

use shoal_tests::binaries;

#[test]
fn check_config_accepts_the_shipped_example_shape_and_names_bad_keys() {
    let dir = tempfile::tempdir().expect("tempdir");
    let example = include_str!("../../agent/agent.example.toml");
    // Point the example at files that exist here, keeping every key.
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).expect("mkdir");
    for f in ["ca.pem", "node.pem", "node.key", "cluster.key"] {
        std::fs::write(dir.path().join(f), "x").expect("write");
    }
    let text = example
        .replace("/var/lib/shoal", data.to_str().expect("utf-8"))
        .replace("/etc/shoal/tls", dir.path().to_str().expect("utf-8"));
    let path = dir.path().join("agent.toml");
    std::fs::write(&path, &text).expect("write");
    let check = |p: &std::path::Path| {
        Command::new(binaries().agent)
            .args(["--check-config", "--config"])
            .arg(p)
            .output()
            .expect("run")
    };
    let out = check(&path);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let bad = text.replace("gossip_port = 7946", "gossip_prot = 7946");
    std::fs::write(&path, bad).expect("write");
    let out = check(&path);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("gossip_prot"));

    let bad = text.replace("probe_rtt_ms = 500", "probe_rtt_ms = 5000");
    std::fs::write(&path, bad).expect("write");
    let out = check(&path);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("mesh.probe_rtt_ms"));
}
