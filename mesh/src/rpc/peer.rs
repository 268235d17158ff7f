//! Who is at the other end: the node a peer's certificate names, refused when it names
//! none or the cluster revoked it (and the QUIC close code that tells the peer why).

use std::time::Duration;

use crate::node_cert::{NodeCert, Revocations};

/// QUIC close code of a connection whose peer certificate was refused.
pub(super) const CLOSE_REFUSED: u32 = 1;
/// QUIC close code of a connection whose peer certificate is revoked: the peer learns why
/// (its own replica may never see the revocation, once every other node refuses it).
pub(super) const CLOSE_REVOKED: u32 = 2;
/// How often a node whose certificate its peers refuse as revoked says so in its log.
pub(super) const REVOKED_LOG_EVERY: Duration = Duration::from_secs(60);

/// Why a peer's certificate was refused, and the QUIC close code that tells the peer.
pub(crate) struct CertRefused {
    pub code: u32,
    pub reason: String,
}

/// The certificate chain a TLS peer presented, as the node it names; refused when it
/// names none or the cluster revoked it.
pub(crate) fn peer_node(
    chain: Option<&[rustls::pki_types::CertificateDer<'_>]>,
    revocations: &Revocations,
) -> Result<NodeCert, CertRefused> {
    let refused = |reason: String| CertRefused {
        code: CLOSE_REFUSED,
        reason,
    };
    let der = chain
        .and_then(|c| c.first())
        .ok_or_else(|| refused("the peer presented no certificate".into()))?;
    let cert = NodeCert::from_der(der).map_err(refused)?;
    if revocations.is_revoked(&cert) {
        return Err(CertRefused {
            code: CLOSE_REVOKED,
            reason: format!(
                "the certificate of {} (node {}, issued at {} ms) is revoked",
                cert.name, cert.node, cert.issued_ms
            ),
        });
    }
    revocations.shown(&cert);
    Ok(cert)
}

/// The node a QUIC connection's peer certificate names.
pub(super) fn quic_peer(
    conn: &quinn::Connection,
    revocations: &Revocations,
) -> Result<NodeCert, CertRefused> {
    let identity = conn.peer_identity();
    let chain = identity
        .as_ref()
        .and_then(|i| i.downcast_ref::<Vec<rustls::pki_types::CertificateDer<'static>>>());
    peer_node(chain.map(Vec::as_slice), revocations)
}
