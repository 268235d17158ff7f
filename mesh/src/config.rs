use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::MeshError;
use crate::bulk::BulkMode;
use crate::membership::MembershipConfig;
use crate::tls::TlsFiles;

/// `[mesh]`: how this node joins and talks to the cluster.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MeshConfig {
    /// The IP address other nodes reach this node at. Gossip and RPC bind to it; it must be
    /// a specific address, not 0.0.0.0.
    pub addr: IpAddr,
    /// UDP port of the SWIM gossip.
    #[serde(default = "default_gossip_port")]
    pub gossip_port: u16,
    /// UDP port of the QUIC RPC endpoint.
    #[serde(default = "default_rpc_port")]
    pub rpc_port: u16,
    /// TCP port of the bulk lane for shard payloads.
    #[serde(default = "default_bulk_port")]
    pub bulk_port: u16,
    /// How shard payloads travel between nodes: `secure` (TCP inside TLS), `crc` (TCP
    /// authenticated by a TLS handshake, then crc32c-checked plaintext frames; for a trusted
    /// storage network) or `off` (QUIC only). A cluster setting: every node must agree.
    #[serde(default = "default_bulk")]
    pub bulk: BulkMode,
    /// Gossip addresses (`ip:port`) of nodes to join through. This node's own address may
    /// be listed (it is skipped), so every node can share one list.
    #[serde(default)]
    pub seeds: Vec<SocketAddr>,
    /// SWIM probe period, in milliseconds.
    #[serde(default = "default_probe_period_ms")]
    pub probe_period_ms: u64,
    /// How long a probe waits for an answer before asking others to probe, in milliseconds.
    #[serde(default = "default_probe_rtt_ms")]
    pub probe_rtt_ms: u64,
    /// How long a suspected member has to refute before it is declared down, in milliseconds.
    #[serde(default = "default_suspect_to_down_ms")]
    pub suspect_to_down_ms: u64,
    /// Gossip of the previous release (envelope version 1, without replay protection),
    /// for a rolling upgrade: `speak` (send it, accept both: the first pass over the nodes),
    /// `accept` (send version 2, accept both: the second pass), `off` (version 2 only).
    #[serde(default)]
    pub legacy_gossip: LegacyGossip,
}

/// Whether this node speaks or accepts the previous release's gossip envelope.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LegacyGossip {
    /// Version 2 only: every packet is checked for replays.
    #[default]
    Off,
    /// Sends version 2; accepts version 1 too.
    Accept,
    /// Sends version 1 (understood by the previous release); accepts both.
    Speak,
}

impl LegacyGossip {
    pub fn accepts_v1(self) -> bool {
        self != LegacyGossip::Off
    }
}

/// `[tls]`: the node's credentials, created by `shoal cert init` / `shoal cert issue`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM certificate of the cluster CA.
    pub ca_cert: PathBuf,
    /// PEM certificate of this node, signed by the cluster CA.
    pub node_cert: PathBuf,
    /// PEM private key of this node.
    pub node_key: PathBuf,
    /// The cluster's shared gossip key (64 hex characters).
    pub cluster_key: PathBuf,
}

fn default_gossip_port() -> u16 {
    7946
}
fn default_rpc_port() -> u16 {
    7947
}
fn default_bulk_port() -> u16 {
    7948
}
fn default_bulk() -> BulkMode {
    BulkMode::Secure
}
fn default_probe_period_ms() -> u64 {
    1000
}
fn default_probe_rtt_ms() -> u64 {
    500
}
fn default_suspect_to_down_ms() -> u64 {
    3000
}

fn invalid(key: &'static str, reason: impl Into<String>) -> MeshError {
    MeshError::Config {
        key,
        reason: reason.into(),
    }
}

impl MeshConfig {
    /// A config for `addr` with every other key at its default.
    pub fn with_addr(addr: IpAddr) -> Self {
        MeshConfig {
            addr,
            gossip_port: default_gossip_port(),
            rpc_port: default_rpc_port(),
            bulk_port: default_bulk_port(),
            bulk: default_bulk(),
            seeds: Vec::new(),
            probe_period_ms: default_probe_period_ms(),
            probe_rtt_ms: default_probe_rtt_ms(),
            suspect_to_down_ms: default_suspect_to_down_ms(),
            legacy_gossip: LegacyGossip::Off,
        }
    }

    pub fn validate(&self) -> Result<(), MeshError> {
        if self.addr.is_unspecified() {
            return Err(invalid(
                "mesh.addr",
                format!(
                    "{} is not a specific address; give the IP other nodes reach this node at",
                    self.addr
                ),
            ));
        }
        if self.gossip_port == 0 {
            return Err(invalid("mesh.gossip_port", "must be a fixed port, not 0"));
        }
        if self.rpc_port == 0 {
            return Err(invalid("mesh.rpc_port", "must be a fixed port, not 0"));
        }
        if self.gossip_port == self.rpc_port {
            return Err(invalid(
                "mesh.rpc_port",
                "must differ from mesh.gossip_port",
            ));
        }
        if let Some(s) = self
            .seeds
            .iter()
            .find(|s| s.port() == 0 || s.ip().is_unspecified())
        {
            return Err(invalid(
                "mesh.seeds",
                format!("{s} is not a reachable gossip address"),
            ));
        }
        if !(10..=60_000).contains(&self.probe_period_ms) {
            return Err(invalid(
                "mesh.probe_period_ms",
                "must be between 10 and 60000",
            ));
        }
        if self.probe_rtt_ms == 0 || self.probe_rtt_ms >= self.probe_period_ms {
            return Err(invalid(
                "mesh.probe_rtt_ms",
                format!(
                    "must be above 0 and below mesh.probe_period_ms ({})",
                    self.probe_period_ms
                ),
            ));
        }
        if self.suspect_to_down_ms < self.probe_period_ms {
            return Err(invalid(
                "mesh.suspect_to_down_ms",
                format!(
                    "must be at least mesh.probe_period_ms ({})",
                    self.probe_period_ms
                ),
            ));
        }
        Ok(())
    }

    pub fn gossip_addr(&self) -> SocketAddr {
        SocketAddr::new(self.addr, self.gossip_port)
    }

    pub fn rpc_addr(&self) -> SocketAddr {
        SocketAddr::new(self.addr, self.rpc_port)
    }

    /// The bulk lane's address, when it is on.
    pub fn bulk_addr(&self) -> Option<SocketAddr> {
        (self.bulk != BulkMode::Off).then(|| SocketAddr::new(self.addr, self.bulk_port))
    }

    pub fn membership(&self) -> MembershipConfig {
        MembershipConfig {
            probe_period: Duration::from_millis(self.probe_period_ms),
            probe_rtt: Duration::from_millis(self.probe_rtt_ms),
            suspect_to_down: Duration::from_millis(self.suspect_to_down_ms),
            ..MembershipConfig::default()
        }
    }
}

impl TlsConfig {
    pub fn files(&self) -> TlsFiles {
        TlsFiles {
            ca_cert: self.ca_cert.clone(),
            node_cert: self.node_cert.clone(),
            node_key: self.node_key.clone(),
        }
    }

    /// Checks that every named file exists, naming the key of the first that does not.
    pub fn validate(&self) -> Result<(), MeshError> {
        for (key, path) in [
            ("tls.ca_cert", &self.ca_cert),
            ("tls.node_cert", &self.node_cert),
            ("tls.node_key", &self.node_key),
            ("tls.cluster_key", &self.cluster_key),
        ] {
            if !path.is_file() {
                return Err(invalid(
                    key,
                    format!("{} is not a readable file", path.display()),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_of(cfg: &MeshConfig) -> Option<&'static str> {
        match cfg.validate() {
            Err(MeshError::Config { key, .. }) => Some(key),
            _ => None,
        }
    }

    #[test]
    fn defaults_validate() {
        let cfg = MeshConfig::with_addr("10.0.0.1".parse().expect("ip"));
        assert!(cfg.validate().is_ok());
        assert!(cfg.membership().detection_bound() <= Duration::from_secs(6));
    }

    #[test]
    fn impossible_values_name_their_key() {
        let base = MeshConfig::with_addr("10.0.0.1".parse().expect("ip"));
        let mut c = base.clone();
        c.addr = "0.0.0.0".parse().expect("ip");
        assert_eq!(key_of(&c), Some("mesh.addr"));
        let mut c = base.clone();
        c.rpc_port = c.gossip_port;
        assert_eq!(key_of(&c), Some("mesh.rpc_port"));
        let mut c = base.clone();
        c.probe_rtt_ms = 5000;
        assert_eq!(key_of(&c), Some("mesh.probe_rtt_ms"));
        let mut c = base.clone();
        c.suspect_to_down_ms = 1;
        assert_eq!(key_of(&c), Some("mesh.suspect_to_down_ms"));
        let mut c = base;
        c.seeds = vec!["0.0.0.0:7946".parse().expect("addr")];
        assert_eq!(key_of(&c), Some("mesh.seeds"));
    }
}
