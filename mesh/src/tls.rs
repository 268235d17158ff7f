//! Cluster credentials: the CA-signed node certificate for QUIC mutual TLS, and the shared
//! cluster key that authenticates gossip packets.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use ring::hmac;
use rustls::RootCertStore;
use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;

use crate::MeshError;

/// ALPN protocol of the agent-to-agent QUIC transport; bumps with the wire version.
pub(crate) const ALPN: &[u8] = b"shoal/1";

/// Where a node's TLS credentials live (PEM files).
#[derive(Clone, Debug)]
pub struct TlsFiles {
    pub ca_cert: PathBuf,
    pub node_cert: PathBuf,
    pub node_key: PathBuf,
}

pub(crate) struct TlsMaterial {
    roots: Arc<RootCertStore>,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
}

fn read(path: &Path) -> Result<Vec<u8>, MeshError> {
    std::fs::read(path).map_err(|source| MeshError::ReadFile {
        path: path.to_owned(),
        source,
    })
}

fn bad(what: &'static str, path: &Path, reason: impl ToString) -> MeshError {
    MeshError::BadCredential {
        what,
        path: path.to_owned(),
        reason: reason.to_string(),
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl TlsFiles {
    /// The node this node's certificate names.
    pub fn node_identity(&self) -> Result<crate::NodeCert, MeshError> {
        let bytes = read(&self.node_cert)?;
        let cert = CertificateDer::pem_slice_iter(&bytes)
            .next()
            .ok_or_else(|| {
                bad(
                    "node certificate",
                    &self.node_cert,
                    "no certificate in file",
                )
            })?
            .map_err(|e| bad("node certificate", &self.node_cert, e))?;
        crate::NodeCert::from_der(&cert).map_err(|e| bad("node certificate", &self.node_cert, e))
    }

    pub(crate) fn load(&self) -> Result<TlsMaterial, MeshError> {
        let certs = |path: &Path, what| -> Result<Vec<CertificateDer<'static>>, MeshError> {
            let bytes = read(path)?;
            let certs = CertificateDer::pem_slice_iter(&bytes)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| bad(what, path, e))?;
            if certs.is_empty() {
                return Err(bad(what, path, "no certificate in file"));
            }
            Ok(certs)
        };
        let mut roots = RootCertStore::empty();
        for ca in certs(&self.ca_cert, "CA certificate")? {
            roots
                .add(ca)
                .map_err(|e| bad("CA certificate", &self.ca_cert, e))?;
        }
        let chain = certs(&self.node_cert, "node certificate")?;
        let key_bytes = read(&self.node_key)?;
        let key = PrivateKeyDer::from_pem_slice(&key_bytes)
            .map_err(|e| bad("node key", &self.node_key, e))?;
        Ok(TlsMaterial {
            roots: Arc::new(roots),
            chain,
            key,
        })
    }
}

impl TlsMaterial {
    /// Checks that the node certificate chains to the cluster CA and carries
    /// `server_name`, so a node with a foreign certificate fails at start with a clear
    /// message instead of being refused by every peer.
    pub(crate) fn check_node_cert(
        &self,
        server_name: &str,
        files: &TlsFiles,
    ) -> Result<(), MeshError> {
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            self.roots.clone(),
            provider(),
        )
        .build()
        .map_err(|e| MeshError::Tls(e.to_string()))?;
        let name = rustls::pki_types::ServerName::try_from(server_name.to_owned())
            .map_err(|e| MeshError::Tls(e.to_string()))?;
        let (end_entity, intermediates) = self
            .chain
            .split_first()
            .ok_or_else(|| bad("node certificate", &files.node_cert, "empty chain"))?;
        verifier
            .verify_server_cert(
                end_entity,
                intermediates,
                &name,
                &[],
                rustls::pki_types::UnixTime::now(),
            )
            .map_err(|e| {
                bad(
                    "node certificate",
                    &files.node_cert,
                    format!(
                        "not valid for this cluster (CA {}): {e}",
                        files.ca_cert.display()
                    ),
                )
            })?;
        Ok(())
    }

    pub(crate) fn server_config(&self) -> Result<quinn::ServerConfig, MeshError> {
        let tls = |e: &dyn std::fmt::Display| MeshError::Tls(e.to_string());
        let crypto = self.rustls_server(ALPN)?;
        let quic = QuicServerConfig::try_from(crypto).map_err(|e| tls(&e))?;
        let mut config = quinn::ServerConfig::with_crypto(Arc::new(quic));
        config.transport_config(transport_config());
        Ok(config)
    }

    /// rustls server side: TLS 1.3, client certificates required and verified against the
    /// cluster CA, no session tickets (the bulk lane's `crc` mode takes the TCP stream back
    /// after the handshake and must find nothing queued behind it).
    pub(crate) fn rustls_server(&self, alpn: &[u8]) -> Result<rustls::ServerConfig, MeshError> {
        self.rustls_server_alpns(&[alpn])
    }

    /// [`Self::rustls_server`] offering several protocols, preferred first.
    pub(crate) fn rustls_server_alpns(
        &self,
        alpns: &[&[u8]],
    ) -> Result<rustls::ServerConfig, MeshError> {
        let tls = |e: &dyn std::fmt::Display| MeshError::Tls(e.to_string());
        let verifier = WebPkiClientVerifier::builder_with_provider(self.roots.clone(), provider())
            .build()
            .map_err(|e| tls(&e))?;
        let mut crypto = rustls::ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| tls(&e))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(self.chain.clone(), self.key.clone_key())
            .map_err(|e| tls(&e))?;
        crypto.alpn_protocols = alpns.iter().map(|a| a.to_vec()).collect();
        crypto.send_tls13_tickets = 0;
        Ok(crypto)
    }

    pub(crate) fn client_config(&self) -> Result<quinn::ClientConfig, MeshError> {
        let tls = |e: &dyn std::fmt::Display| MeshError::Tls(e.to_string());
        let crypto = self.rustls_client(ALPN)?;
        let quic = QuicClientConfig::try_from(crypto).map_err(|e| tls(&e))?;
        let mut config = quinn::ClientConfig::new(Arc::new(quic));
        config.transport_config(transport_config());
        Ok(config)
    }

    /// rustls client side: TLS 1.3, trusts only the cluster CA, presents the node cert.
    pub(crate) fn rustls_client(&self, alpn: &[u8]) -> Result<rustls::ClientConfig, MeshError> {
        self.rustls_client_alpns(&[alpn])
    }

    /// [`Self::rustls_client`] offering several protocols (the server picks).
    pub(crate) fn rustls_client_alpns(
        &self,
        alpns: &[&[u8]],
    ) -> Result<rustls::ClientConfig, MeshError> {
        let tls = |e: &dyn std::fmt::Display| MeshError::Tls(e.to_string());
        let mut crypto = rustls::ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| tls(&e))?
            .with_root_certificates(self.roots.clone())
            .with_client_auth_cert(self.chain.clone(), self.key.clone_key())
            .map_err(|e| tls(&e))?;
        crypto.alpn_protocols = alpns.iter().map(|a| a.to_vec()).collect();
        crypto.resumption = rustls::client::Resumption::disabled();
        Ok(crypto)
    }
}

fn transport_config() -> Arc<quinn::TransportConfig> {
    let mut t = quinn::TransportConfig::default();
    t.keep_alive_interval(Some(std::time::Duration::from_secs(5)));
    t.max_idle_timeout(quinn::IdleTimeout::try_from(std::time::Duration::from_secs(30)).ok());
    Arc::new(t)
}

/// The key that authenticates gossip: derived from the cluster's shared secret (32 bytes,
/// stored as 64 hex characters) and the cluster CA certificate, so that a node holding the
/// secret of one cluster but trusting another CA cannot gossip with it either.
#[derive(Clone)]
pub struct ClusterKey(pub(crate) hmac::Key);

impl std::fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterKey(..)")
    }
}

impl ClusterKey {
    /// Derives the gossip key from the shared secret and the CA certificate (DER).
    pub fn derive(secret: &[u8; 32], ca_cert_der: &[u8]) -> Self {
        let outer = hmac::Key::new(hmac::HMAC_SHA256, secret);
        let mut ctx = hmac::Context::with_key(&outer);
        ctx.update(b"shoal gossip key v1\0");
        ctx.update(ca_cert_der);
        ClusterKey(hmac::Key::new(hmac::HMAC_SHA256, ctx.sign().as_ref()))
    }

    /// Loads the secret at `secret_path` and binds it to the first CA certificate in
    /// `ca_cert_path`.
    pub fn load(secret_path: &Path, ca_cert_path: &Path) -> Result<Self, MeshError> {
        let text = read(secret_path)?;
        let text = std::str::from_utf8(&text).map_err(|e| bad("cluster key", secret_path, e))?;
        let secret = parse_hex(text.trim()).ok_or_else(|| {
            bad(
                "cluster key",
                secret_path,
                "expected 64 hexadecimal characters (32 bytes)",
            )
        })?;
        let ca = read(ca_cert_path)?;
        let ca = CertificateDer::pem_slice_iter(&ca)
            .next()
            .ok_or_else(|| bad("CA certificate", ca_cert_path, "no certificate in file"))?
            .map_err(|e| bad("CA certificate", ca_cert_path, e))?;
        Ok(Self::derive(&secret, &ca))
    }
}

fn parse_hex(text: &str) -> Option<[u8; 32]> {
    if text.len() != 64 || !text.is_ascii() {
        return None;
    }
    let mut bytes = [0u8; 32];
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gossip_key_depends_on_secret_and_ca() {
        let tag = |k: &ClusterKey| hmac::sign(&k.0, b"x").as_ref().to_vec();
        let a = ClusterKey::derive(&[1; 32], b"ca-one");
        assert_eq!(tag(&a), tag(&ClusterKey::derive(&[1; 32], b"ca-one")));
        assert_ne!(tag(&a), tag(&ClusterKey::derive(&[2; 32], b"ca-one")));
        assert_ne!(tag(&a), tag(&ClusterKey::derive(&[1; 32], b"ca-two")));
    }

    #[test]
    fn cluster_key_parses_only_64_hex_chars() {
        assert!(parse_hex(&"ab".repeat(32)).is_some());
        assert!(parse_hex(&"ab".repeat(31)).is_none());
        assert!(parse_hex(&"zz".repeat(32)).is_none());
        assert!(parse_hex(&"é".repeat(32)).is_none());
    }
}
