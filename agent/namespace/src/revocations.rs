//! Certificates the cluster revoked (`shoal cert revoke NAME`): every certificate of a node
//! name issued before a moment. The list lives in the replicated state so every agent
//! refuses the same certificates; the agent hands it to its transport.

use serde::{Deserialize, Serialize};
use shoal_placement::NodeId;

use crate::record::{self, KEY_REVOKED, STATE, encode};
use crate::tx::Tx;
use crate::{NamespaceError, NamespaceStore, Outcome};

/// Every certificate of `name` issued before `before_ms` (unix milliseconds) is revoked.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RevokedName {
    pub name: String,
    /// The node that name belonged to when it was revoked.
    pub node: NodeId,
    pub before_ms: u64,
}

impl Tx<'_> {
    fn revoked(&self) -> Result<Vec<RevokedName>, NamespaceError> {
        Ok(record::read_state(&self.state, KEY_REVOKED)?.unwrap_or_default())
    }
}

/// Applies `RevokeCertificates`: the name's revocation covers certificates issued before
/// `before_ms` (a later revocation of the same name moves the moment on, never back).
pub(crate) fn revoke(
    tx: &mut Tx<'_>,
    name: &str,
    node: NodeId,
    before_ms: u64,
) -> Result<Outcome, NamespaceError> {
    if name.is_empty() {
        return Err(shoal_agent_api::FsError::Invalid.into());
    }
    let mut list = tx.revoked()?;
    match list.iter_mut().find(|r| r.name == name) {
        Some(r) => {
            r.before_ms = r.before_ms.max(before_ms);
            r.node = node;
        }
        None => list.push(RevokedName {
            name: name.to_owned(),
            node,
            before_ms,
        }),
    }
    list.sort_by(|a, b| a.name.cmp(&b.name));
    tx.state.insert(KEY_REVOKED, encode(&list)?.as_slice())?;
    Ok(Outcome::Done)
}

impl NamespaceStore {
    /// The revoked names, by name.
    pub fn revoked_certificates(&self) -> Result<Vec<RevokedName>, NamespaceError> {
        let txn = self.read()?;
        Ok(record::read_state(&txn.open_table(STATE)?, KEY_REVOKED)?.unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use shoal_placement::NodeId;

    use crate::testkit::Kit;
    use crate::{Command, Outcome};

    fn revoke(name: &str, node: u64, before_ms: u64) -> Command {
        Command::RevokeCertificates {
            name: name.into(),
            node: NodeId(node),
            before_ms,
        }
    }

    #[test]
    fn a_revocation_only_moves_forward_and_travels_in_snapshots() {
        let mut kit = Kit::new();
        assert_eq!(kit.run(revoke("b", 2, 50)), Outcome::Done);
        assert_eq!(kit.run(revoke("a", 1, 100)), Outcome::Done);
        kit.run(revoke("a", 1, 70));
        let list = kit.store.revoked_certificates().expect("list");
        let got: Vec<_> = list
            .iter()
            .map(|r| (r.name.as_str(), r.before_ms))
            .collect();
        assert_eq!(got, [("a", 100), ("b", 50)]);
        kit.run(revoke("a", 1, 120));
        assert_eq!(
            kit.store.revoked_certificates().expect("list")[0].before_ms,
            120
        );
        let other = Kit::new();
        other
            .store
            .install(&kit.store.snapshot().expect("snapshot"))
            .expect("install");
        assert_eq!(
            other.store.revoked_certificates().expect("list"),
            kit.store.revoked_certificates().expect("list")
        );
    }

    #[test]
    fn a_revocation_needs_a_name() {
        let mut kit = Kit::new();
        assert_eq!(kit.fail(revoke("", 1, 5)), crate::format::FsError::Invalid);
    }
}
