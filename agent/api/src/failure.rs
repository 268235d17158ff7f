//! Why a request failed, in a form a script can act on: the [`FailureKind`], decided by the
//! agent from the cause (never from the words), and the message for the operator.

use serde::{Deserialize, Serialize};

use crate::FsError;

/// The class of a failed request. The CLI turns it into its exit code and `--json`'s
/// `error.kind` (these names, in kebab case). A kind added in a later protocol is sent to
/// clients of earlier ones as the nearest kind they know.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FailureKind {
    /// The request names a node, file or inode the cluster does not have.
    NotFound,
    /// Understood and declined as things stand: a node that must be stopped first is
    /// running, an upgrade is unfinished, the node's state does not allow the change. It
    /// may be allowed once that changes.
    Refused,
    /// The request is wrong as asked (an argument missing or malformed, a feature this
    /// agent is not configured for, a client of another protocol): asked again the same
    /// way, it fails the same way.
    Invalid,
    /// The cluster cannot answer now (no metadata leader, too few nodes alive, peers
    /// unreachable, the agent stopping): the same request may succeed a little later.
    Unavailable,
    /// The cluster has no room for the data.
    NoSpace,
    /// The agent failed (damaged data, a local I/O error, a bug): a person must look.
    Internal,
    /// No kind was given: the answer of an agent of protocol 9 or older. No agent sends it.
    Unknown,
}

impl FailureKind {
    /// The name `--json` prints.
    pub fn name(self) -> &'static str {
        match self {
            FailureKind::NotFound => "not-found",
            FailureKind::Refused => "refused",
            FailureKind::Invalid => "invalid",
            FailureKind::Unavailable => "unavailable",
            FailureKind::NoSpace => "no-space",
            FailureKind::Internal => "internal",
            FailureKind::Unknown => "unknown",
        }
    }

    /// Whether the same request may succeed if sent again a little later.
    pub fn is_retryable(self) -> bool {
        self == FailureKind::Unavailable
    }
}

/// A failed request: its kind and the text for the operator.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct Failure {
    pub kind: FailureKind,
    pub message: String,
}

impl Failure {
    pub fn new(kind: FailureKind, message: impl Into<String>) -> Self {
        Failure {
            kind,
            message: message.into(),
        }
    }
}

impl FsError {
    /// The kind of failure this filesystem answer is, for an operator's command (e.g.
    /// `shoal stat` of a file removed meanwhile).
    pub fn kind(&self) -> FailureKind {
        match self {
            FsError::NotFound | FsError::Stale => FailureKind::NotFound,
            FsError::Exists | FsError::NotEmpty | FsError::NotPermitted => FailureKind::Refused,
            FsError::NotDir
            | FsError::IsDir
            | FsError::Invalid
            | FsError::NameTooLong
            | FsError::TooManyLinks
            | FsError::TooBig => FailureKind::Invalid,
            FsError::NoSpace => FailureKind::NoSpace,
            FsError::Unavailable(_) => FailureKind::Unavailable,
            FsError::Io(_) => FailureKind::Internal,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kind's place in the enum is its encoding: a kind is only ever appended.
    #[test]
    fn kinds_keep_their_encoding_and_names() {
        let all = [
            FailureKind::NotFound,
            FailureKind::Refused,
            FailureKind::Invalid,
            FailureKind::Unavailable,
            FailureKind::NoSpace,
            FailureKind::Internal,
            FailureKind::Unknown,
        ];
        for (i, kind) in all.into_iter().enumerate() {
            assert_eq!(postcard::to_allocvec(&kind).expect("encode"), [i as u8]);
            let back: FailureKind = postcard::from_bytes(&[i as u8]).expect("decode");
            assert_eq!(back, kind);
        }
        let names: Vec<&str> = all.iter().map(|k| k.name()).collect();
        assert_eq!(
            names,
            [
                "not-found",
                "refused",
                "invalid",
                "unavailable",
                "no-space",
                "internal",
                "unknown"
            ]
        );
        assert!(postcard::from_bytes::<FailureKind>(&[all.len() as u8]).is_err());
    }

    #[test]
    fn only_unavailable_is_worth_asking_again() {
        assert!(FailureKind::Unavailable.is_retryable());
        assert!(!FailureKind::Refused.is_retryable());
        assert!(!FailureKind::Internal.is_retryable());
        assert!(!FailureKind::Unknown.is_retryable());
    }

    #[test]
    fn a_filesystem_answer_keeps_its_class() {
        assert_eq!(FsError::NotFound.kind(), FailureKind::NotFound);
        assert_eq!(FsError::NoSpace.kind(), FailureKind::NoSpace);
        assert_eq!(
            FsError::Unavailable("no leader".into()).kind(),
            FailureKind::Unavailable
        );
        assert_eq!(FsError::Invalid.kind(), FailureKind::Invalid);
        assert_eq!(FsError::Io("disk".into()).kind(), FailureKind::Internal);
    }
}
