//! What a node certificate says about its node, and which certificates the cluster revoked.
//!
//! A node certificate (signed by the cluster CA, made by `shoal cert issue`) names its node
//! twice: the subject's common name is the node's name, and a URI subject alternative name
//! `shoal://node/<node id, 16 hex digits>/<issued, unix milliseconds>` carries its id and
//! when it was issued. Every connection binds its peer to that identity: a request that
//! claims another node is refused, and so is any certificate the cluster revoked.
//!
//! Revocation is by name and time: `shoal cert revoke NAME` revokes every certificate of
//! NAME issued before that moment, so the stolen key and any older copy are refused while a
//! certificate issued afterwards (`shoal cert issue --node-id`, a re-key) is taken.

use std::collections::HashMap;
use std::sync::RwLock;

use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::identity::NodeId;

const URI_PREFIX: &str = "shoal://node/";

/// The node a certificate was issued to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeCert {
    pub node: NodeId,
    pub name: String,
    /// When it was issued (the CA host's clock), unix milliseconds.
    pub issued_ms: u64,
}

/// The subject alternative name that names node `node`, issued at `issued_ms`.
pub fn node_uri(node: NodeId, issued_ms: u64) -> String {
    format!("{URI_PREFIX}{node}/{issued_ms}")
}

fn parse_uri(uri: &str) -> Option<(NodeId, u64)> {
    let rest = uri.strip_prefix(URI_PREFIX)?;
    let (id, issued) = rest.split_once('/')?;
    if id.len() != 16 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let node = u64::from_str_radix(id, 16).ok().filter(|n| *n != 0)?;
    if issued.is_empty() || !issued.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((NodeId(node), issued.parse().ok()?))
}

impl NodeCert {
    /// Reads the identity out of a DER certificate (the chain's first). A certificate
    /// without exactly one node URI, or without a common name, names no node.
    pub fn from_der(der: &[u8]) -> Result<NodeCert, String> {
        let (_, cert) =
            X509Certificate::from_der(der).map_err(|e| format!("not a certificate: {e}"))?;
        let name = cert
            .subject()
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .ok_or("the certificate has no common name")?
            .to_owned();
        let sans = cert
            .subject_alternative_name()
            .map_err(|e| format!("bad subject alternative names: {e}"))?;
        let mut ids = sans
            .iter()
            .flat_map(|san| san.value.general_names.iter())
            .filter_map(|n| match n {
                GeneralName::URI(u) if u.starts_with(URI_PREFIX) => Some(*u),
                _ => None,
            });
        let (first, second) = (ids.next(), ids.next());
        let uri = match (first, second) {
            (Some(u), None) => u,
            (None, _) => {
                return Err(format!(
                    "the certificate of {name} names no node id (issued before certificates named their node: issue it again with `shoal cert issue --node-id`)"
                ));
            }
            (Some(_), Some(_)) => return Err("the certificate names two node ids".into()),
        };
        let (node, issued_ms) =
            parse_uri(uri).ok_or_else(|| format!("malformed node URI {uri:?}"))?;
        Ok(NodeCert {
            node,
            name,
            issued_ms,
        })
    }
}

/// One revocation: every certificate of `name` issued before `before_ms`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Revocation {
    pub name: String,
    /// The node the name belonged to when it was revoked (for gossip, which names nodes by
    /// id only).
    pub node: NodeId,
    pub before_ms: u64,
}

/// The cluster's revocations as this node last read them from the metadata, and the newest
/// certificate each node has shown on a connection here.
#[derive(Debug, Default)]
pub struct Revocations {
    revoked: RwLock<HashMap<String, Revocation>>,
    /// Node → the issue time of the newest valid certificate it presented.
    shown: RwLock<HashMap<NodeId, u64>>,
}

impl Revocations {
    /// Replaces the list (the agent reads it from its replica).
    pub fn set(&self, list: Vec<Revocation>) {
        let map = list.into_iter().map(|r| (r.name.clone(), r)).collect();
        *self.revoked.write().unwrap_or_else(|p| p.into_inner()) = map;
    }

    /// Whether `cert` is revoked.
    pub fn is_revoked(&self, cert: &NodeCert) -> bool {
        self.revoked
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&cert.name)
            .is_some_and(|r| cert.issued_ms < r.before_ms)
    }

    /// Records a certificate a peer presented and that is not revoked.
    pub fn shown(&self, cert: &NodeCert) {
        let mut shown = self.shown.write().unwrap_or_else(|p| p.into_inner());
        let e = shown.entry(cert.node).or_insert(cert.issued_ms);
        *e = (*e).max(cert.issued_ms);
    }

    /// Whether gossip from `node` is to be dropped: the node's name was revoked and it has
    /// not shown this node a certificate issued since (a re-keyed node shows one as soon
    /// as it calls or is called).
    pub fn silences(&self, node: NodeId) -> bool {
        let revoked = self.revoked.read().unwrap_or_else(|p| p.into_inner());
        let Some(before) = revoked
            .values()
            .filter(|r| r.node == node)
            .map(|r| r.before_ms)
            .max()
        else {
            return false;
        };
        let shown = self.shown.read().unwrap_or_else(|p| p.into_inner());
        shown.get(&node).is_none_or(|issued| *issued < before)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert(node: u64, name: &str, issued_ms: u64) -> NodeCert {
        NodeCert {
            node: NodeId(node),
            name: name.into(),
            issued_ms,
        }
    }

    #[test]
    fn node_uri_round_trips_and_malformed_ones_name_nothing() {
        let uri = node_uri(NodeId(0x00ab_cdef_0123_4567), 1_700_000_000_123);
        assert_eq!(uri, "shoal://node/00abcdef01234567/1700000000123");
        assert_eq!(
            parse_uri(&uri),
            Some((NodeId(0x00ab_cdef_0123_4567), 1_700_000_000_123))
        );
        for bad in [
            "shoal://node/00abcdef01234567",
            "shoal://node/00abcdef0123456/1",
            "shoal://node/0000000000000000/1",
            "shoal://node/00abcdef0123456g/1",
            "shoal://node/00abcdef01234567/",
            "shoal://node/00abcdef01234567/-1",
            "shoal://node/00abcdef01234567/1/2",
            "https://node/00abcdef01234567/1",
        ] {
            assert_eq!(parse_uri(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_revocation_covers_the_certificates_of_its_name_issued_before_it() {
        let r = Revocations::default();
        assert!(!r.is_revoked(&cert(1, "a", 5)));
        r.set(vec![Revocation {
            name: "a".into(),
            node: NodeId(1),
            before_ms: 10,
        }]);
        assert!(r.is_revoked(&cert(1, "a", 5)));
        assert!(
            r.is_revoked(&cert(2, "a", 9)),
            "any node id under that name"
        );
        assert!(!r.is_revoked(&cert(1, "a", 10)), "re-keyed");
        assert!(!r.is_revoked(&cert(3, "b", 1)), "another name");
    }

    #[test]
    fn gossip_of_a_revoked_node_is_silenced_until_it_shows_a_newer_certificate() {
        let r = Revocations::default();
        r.shown(&cert(1, "a", 5));
        assert!(!r.silences(NodeId(1)));
        r.set(vec![Revocation {
            name: "a".into(),
            node: NodeId(1),
            before_ms: 10,
        }]);
        assert!(r.silences(NodeId(1)));
        assert!(r.silences(NodeId(1)), "still, without a newer certificate");
        assert!(!r.silences(NodeId(2)));
        r.shown(&cert(1, "a", 11));
        assert!(!r.silences(NodeId(1)));
    }
}
