//! What a script sees when an operator's command fails: the agent decides the kind from the
//! cause, `--json` prints it as `{"error": {"kind", "message"}}` on stdout, and the exit
//! code follows it: 1 for "no, not now" (a refusal), 2 for every other error. On one agent:
//! changes its node's state does not allow are refused, a name it does not have is not
//! found, a request wrong as asked is invalid, and an agent that is not running is
//! unavailable.

use serde_json::Value;
use shoal_tests::{DevCluster, shoal};

/// `shoal ARGS --json --socket <node 1's>`: (exit code, stdout as JSON, stderr).
fn cli_json(c: &DevCluster, args: &[&str]) -> (i32, Value, String) {
    let socket = c.socket(1);
    let mut all = args.to_vec();
    all.extend(["--json", "--socket", socket.to_str().expect("socket path")]);
    let out = shoal(&all);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let json = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("{args:?}: stdout is not JSON ({e}): {stdout:?}"));
    (
        out.status.code().unwrap_or(-1),
        json,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Asserts that `shoal ARGS --json` failed with `kind`, exit `code`, and a message holding
/// `says`.
fn assert_fails(c: &DevCluster, args: &[&str], kind: &str, code: i32, says: &str) {
    let (got, json, err) = cli_json(c, args);
    let error = &json["error"];
    assert_eq!(error["kind"], kind, "{args:?}: {json} {err}");
    assert_eq!(got, code, "{args:?}: {json}");
    let message = error["message"].as_str().unwrap_or_default();
    assert!(message.contains(says), "{args:?}: {message}");
}

#[test]
fn a_failed_command_says_its_kind_and_exits_by_it() {
    let c = DevCluster::up(1, 193);
    c.wait_layout(1);
    let id = c.node_id(1);

    // Not now: the node's state does not allow these changes.
    assert_fails(&c, &["undrain", &id], "refused", 1, "(the node is active)");
    assert_fails(
        &c,
        &["maintenance", "exit", &id],
        "refused",
        1,
        "not in maintenance",
    );
    // A name the cluster does not have.
    assert_fails(
        &c,
        &["drain", "no-such-node"],
        "not-found",
        2,
        "no node \"no-such-node\"",
    );
    assert_fails(
        &c,
        &["ok-to-stop", "nope"],
        "not-found",
        2,
        "no node \"nope\"",
    );
    // Wrong as asked: the agent's own judgement, and the CLI's before it asks.
    let socket = c.socket(1);
    let socket = socket.to_str().expect("socket");
    let out = shoal(&["cert", "revoke", "", "--force", "--socket", socket]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("a node name is needed"), "{err}");
    let tmp = std::env::temp_dir();
    let tmp = tmp.to_str().expect("temp dir");
    assert_fails(&c, &["stat", tmp], "invalid", 2, "is not on a shoal mount");

    // A change that is allowed answers with its message.
    let (code, json, err) = cli_json(&c, &["maintenance", "enter", &id, "--for", "10m"]);
    assert_eq!(code, 0, "{json} {err}");
    assert!(json["message"].as_str().is_some(), "{json}");
    let (code, json, err) = cli_json(&c, &["maintenance", "exit", &id]);
    assert_eq!(code, 0, "{json} {err}");

    // Without --json the message goes to stderr, and the exit code is the same.
    let out = shoal(&["undrain", &id, "--socket", socket]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with("error: refused: ") && err.contains("(the node is active)"),
        "{err}"
    );

    // No agent on the socket: it cannot be asked now.
    c.down();
    let (code, json, _) = cli_json(&c, &["status"]);
    assert_eq!(json["error"]["kind"], "unavailable", "{json}");
    assert_eq!(code, 2);
}
