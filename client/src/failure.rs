//! How a failed command ends: the kind of its failure (the agent's, or the CLI's own), the
//! exit code it maps to, and what is printed (a line on stderr, or with `--json` one object
//! on stdout: `{"error": {"kind": ..., "message": ...}}`).
//!
//! Exit codes: 0 done (or "yes"), 1 the answer is no or not now (`ok-to-stop`, a drain
//! that cannot finish, a change the cluster's state refuses: kind `refused`), 2 an error
//! (any other kind: scripts tell "not now" from "could not ask"; `--json` says which).

use std::fmt::Display;
use std::process::ExitCode;

use shoal_agent_api::{ApiError, Failure, FailureKind};

/// The exit code of a failure of `kind`.
pub(crate) fn exit_code(kind: FailureKind) -> u8 {
    match kind {
        FailureKind::Refused => 1,
        FailureKind::NotFound
        | FailureKind::Invalid
        | FailureKind::Unavailable
        | FailureKind::NoSpace
        | FailureKind::Internal
        | FailureKind::Unknown => 2,
    }
}

/// The kind and the whole text of `e`: an agent's answer keeps its kind, a failure to
/// talk to the agent has the transport's, and anything the CLI did not classify is
/// internal.
pub(crate) fn failure_of(e: &anyhow::Error) -> Failure {
    let kind = if let Some(f) = e.downcast_ref::<Failure>() {
        f.kind
    } else if let Some(api) = e.downcast_ref::<ApiError>() {
        api.kind()
    } else {
        FailureKind::Internal
    };
    Failure::new(kind, format!("{e:#}"))
}

/// Prints `e` (on stdout as JSON with `json`, else on stderr) and returns its exit code.
pub(crate) fn report(e: &anyhow::Error, json: bool) -> ExitCode {
    let failure = failure_of(e);
    if json {
        println!("{}", json_object(&failure));
    } else {
        eprintln!("error: {}", failure.message);
    }
    ExitCode::from(exit_code(failure.kind))
}

/// `{"error": {"kind": ..., "message": ...}}`.
fn json_object(f: &Failure) -> serde_json::Value {
    serde_json::json!({ "error": { "kind": f.kind.name(), "message": f.message } })
}

/// A request the CLI refuses before asking (an argument that makes no sense, say).
pub(crate) fn invalid(message: impl Display) -> anyhow::Error {
    Failure::new(FailureKind::Invalid, message.to_string()).into()
}

/// A name the cluster does not have, found out by the CLI itself.
pub(crate) fn not_found(message: impl Display) -> anyhow::Error {
    Failure::new(FailureKind::NotFound, message.to_string()).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_refusal_exits_1() {
        assert_eq!(exit_code(FailureKind::Refused), 1);
        for kind in [
            FailureKind::NotFound,
            FailureKind::Invalid,
            FailureKind::Unavailable,
            FailureKind::NoSpace,
            FailureKind::Internal,
            FailureKind::Unknown,
        ] {
            assert_eq!(exit_code(kind), 2, "{kind:?}");
        }
    }

    #[test]
    fn a_failure_keeps_its_kind_through_context_and_prints_as_json() {
        let refused = Failure::new(FailureKind::Refused, "refused: node4 is still running");
        let e = anyhow::Error::from(refused).context("remove node4");
        let f = failure_of(&e);
        assert_eq!(f.kind, FailureKind::Refused);
        assert_eq!(f.message, "remove node4: refused: node4 is still running");
        assert_eq!(
            json_object(&f).to_string(),
            r#"{"error":{"kind":"refused","message":"remove node4: refused: node4 is still running"}}"#
        );
        // The names `--json` prints are the kinds' serde names.
        for kind in [FailureKind::NotFound, FailureKind::NoSpace] {
            assert_eq!(
                serde_json::to_value(kind).expect("json"),
                serde_json::Value::from(kind.name())
            );
        }
    }

    #[test]
    fn an_agent_not_running_is_unavailable_and_anything_else_internal() {
        let away: anyhow::Error = ApiError::Connect {
            path: "/run/shoal/agent.sock".into(),
            reason: std::io::ErrorKind::ConnectionRefused.into(),
        }
        .into();
        assert_eq!(failure_of(&away).kind, FailureKind::Unavailable);
        assert_eq!(
            failure_of(&anyhow::anyhow!("unexpected answer")).kind,
            FailureKind::Internal
        );
        assert_eq!(failure_of(&invalid("bad")).kind, FailureKind::Invalid);
        assert_eq!(failure_of(&not_found("no x")).kind, FailureKind::NotFound);
    }
}
