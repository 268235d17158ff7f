//! The agent's one TOML config file (default `/etc/shoal/agent.toml`). Every key is
//! documented in `agent/agent.example.toml`; unknown keys and impossible values are errors
//! that name the key.

pub mod tiering;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use shoal_mesh::{MeshConfig, TlsConfig};
use shoal_resource_guard::ResourcesConfig;
use shoal_units::parse_size;

use crate::AgentError;

/// The whole agent config.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    pub node: NodeConfig,
    pub mesh: MeshConfig,
    pub tls: TlsConfig,
    #[serde(default)]
    pub storage: StorageConfig,
    #[serde(default)]
    pub cluster: ClusterConfig,
    #[serde(default)]
    pub scrub: ScrubConfig,
    #[serde(default)]
    pub background: BackgroundConfig,
    #[serde(default)]
    pub meta: crate::consensus::MetaConfig,
    /// The agent's CPU/RAM reservation; without it the agent runs unconfined (and says so).
    #[serde(default)]
    pub resources: Option<ResourcesConfig>,
    /// The cold tier; without it data stays on NVMe.
    #[serde(default)]
    pub tiering: Option<tiering::TieringConfig>,
    #[serde(default)]
    pub admin: AdminConfig,
    #[serde(default)]
    pub metrics: MetricsConfig,
    #[serde(default)]
    pub log: LogConfig,
}

/// `[node]`: who this node is.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeConfig {
    /// Human-readable name shown in status; defaults to the host name.
    #[serde(default)]
    pub name: Option<String>,
    /// Directory on the node's NVMe where the agent keeps its state. Must exist.
    pub data_dir: PathBuf,
    /// Failure domain (rack, power feed, ...): shards of one stripe are spread across them.
    pub failure_domain: String,
}

/// `[storage]`: this node's shard store and the default erasure-coding profile.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StorageConfig {
    /// Fill limit of the shard store: a size ("500GiB") or a share of the data dir's
    /// filesystem ("90%"). Writes that would cross it fail with "node full".
    #[serde(default = "default_capacity")]
    pub capacity: String,
    /// Erasure-coding profile of new stripes, "K+M".
    #[serde(default = "default_ec")]
    pub ec: shoal_placement::EcProfile,
    /// Write and read shard files with O_DIRECT (no page cache; files padded to 4 KiB).
    #[serde(default)]
    pub direct_io: bool,
    /// Space kept free on the data dir's filesystem whatever the fill limit says: a shard
    /// write that would leave less fails with "node full" (and the writer places it on
    /// another node). It leaves room for the metadata log and for other users of the
    /// filesystem.
    #[serde(default = "default_reserve")]
    pub reserve: String,
    /// Fewest shards a new stripe is written with when fewer than k+m nodes take shards
    /// (a node down): the missing ones are written later by repair. Between k+1 and k+m;
    /// None: k+1.
    #[serde(default)]
    pub min_write_shards: Option<u8>,
}

fn default_capacity() -> String {
    "90%".into()
}
fn default_reserve() -> String {
    "256MiB".into()
}
fn default_ec() -> shoal_placement::EcProfile {
    shoal_placement::EcProfile { k: 4, m: 2 }
}

impl Default for StorageConfig {
    fn default() -> Self {
        StorageConfig {
            capacity: default_capacity(),
            ec: default_ec(),
            direct_io: false,
            reserve: default_reserve(),
            min_write_shards: None,
        }
    }
}

impl StorageConfig {
    /// The fewest shards a stripe of profile `ec` is written with: `min_write_shards`
    /// (checked against the default profile) held between k+1 and k+m for any profile.
    pub fn min_write_shards(&self, ec: shoal_placement::EcProfile) -> usize {
        ec.min_write_shards(self.min_write_shards)
    }

    /// `reserve` in bytes.
    pub fn reserve_bytes(&self) -> Result<u64, AgentError> {
        parse_size(&self.reserve).map_err(|e| invalid("storage.reserve", e.to_string()))
    }

    /// The fill limit in bytes for a filesystem of `fs_bytes`.
    pub fn limit_bytes(&self, fs_bytes: u64) -> Result<u64, AgentError> {
        let text = self.capacity.trim();
        if let Some(pct) = text.strip_suffix('%') {
            let pct: f64 = pct.trim().parse().map_err(|_| {
                invalid(
                    "storage.capacity",
                    format!("{text:?} is not a share of the filesystem (\"90%\")"),
                )
            })?;
            if !(pct > 0.0 && pct <= 100.0) {
                return Err(invalid(
                    "storage.capacity",
                    format!("{pct}% must be above 0 and at most 100"),
                ));
            }
            return Ok((fs_bytes as f64 * pct / 100.0) as u64);
        }
        match parse_size(text) {
            Ok(0) => Err(invalid("storage.capacity", "must be above 0")),
            Ok(bytes) => Ok(bytes),
            Err(e) => Err(invalid(
                "storage.capacity",
                format!("{e}; or a share of the filesystem (\"90%\")"),
            )),
        }
    }
}

/// `[cluster]`: how the cluster treats its members.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// How long a node may be down before it is `out`: its shards are then rebuilt on the
    /// other nodes. A node back sooner gets nothing rebuilt (only the stripes written
    /// without it get their missing shards). A cluster setting: the metadata leader's
    /// value decides.
    #[serde(default = "default_down_out_after", with = "duration_text")]
    pub down_out_after: Duration,
}

fn default_down_out_after() -> Duration {
    Duration::from_secs(600)
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            down_out_after: default_down_out_after(),
        }
    }
}

/// `[scrub]`: re-reading every shard at rest to find bitrot before a reader does.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScrubConfig {
    /// Whether this node scrubs its shards.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// A pass over every local shard starts this long after the previous one started.
    #[serde(default = "default_scrub_interval", with = "duration_text")]
    pub interval: Duration,
    /// Most bytes a second scrub reads (also held to the governor's scrub budget).
    #[serde(default = "default_scrub_rate")]
    pub max_rate: String,
}

fn default_true() -> bool {
    true
}
fn default_scrub_interval() -> Duration {
    Duration::from_secs(14 * 86_400)
}
fn default_scrub_rate() -> String {
    "32MiB".into()
}

impl Default for ScrubConfig {
    fn default() -> Self {
        ScrubConfig {
            enabled: true,
            interval: default_scrub_interval(),
            max_rate: default_scrub_rate(),
        }
    }
}

impl ScrubConfig {
    /// `max_rate` in bytes per second.
    pub fn max_rate_bytes(&self) -> Result<u64, AgentError> {
        rate_bytes("scrub.max_rate", &self.max_rate)
    }
}

/// `[background]`: the governor's budget for background work (repair, scrub, rebalance,
/// tiering, GC), shared out by class and shrunk while the GPUs are busy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackgroundConfig {
    /// Bytes a second all background work may move while the GPUs idle.
    #[serde(default = "default_background_rate")]
    pub rate: String,
    /// Bytes a second repair of a stripe at its last spare always gets, however busy the
    /// GPUs are.
    #[serde(default = "default_repair_floor")]
    pub repair_floor: String,
}

fn default_background_rate() -> String {
    "1GiB".into()
}
fn default_repair_floor() -> String {
    "64MiB".into()
}

impl Default for BackgroundConfig {
    fn default() -> Self {
        BackgroundConfig {
            rate: default_background_rate(),
            repair_floor: default_repair_floor(),
        }
    }
}

impl BackgroundConfig {
    /// (`rate`, `repair_floor`) in bytes per second.
    pub fn rates(&self) -> Result<(u64, u64), AgentError> {
        Ok((
            rate_bytes("background.rate", &self.rate)?,
            rate_bytes("background.repair_floor", &self.repair_floor)?,
        ))
    }
}

/// A rate in bytes a second, written as a size ("64MiB"), above 0.
fn rate_bytes(key: &'static str, text: &str) -> Result<u64, AgentError> {
    match parse_size(text) {
        Ok(0) => Err(invalid(key, "must be above 0 (bytes a second)")),
        Ok(bytes) => Ok(bytes),
        Err(e) => Err(invalid(key, format!("{e} (bytes a second)"))),
    }
}

/// Durations written as text ("10m", "14d", "30s"; see `shoal_units::parse_duration`).
pub(crate) mod duration_text {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};
    use shoal_units::{format_duration, parse_duration};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format_duration(*d))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        parse_duration(&text).map_err(serde::de::Error::custom)
    }
}

/// `[admin]`: the local control socket used by `shoal` and `shoal mount`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    /// Path of the Unix socket.
    #[serde(default = "default_socket")]
    pub socket: PathBuf,
    /// Permission bits of the socket; 0o600 keeps it root-only. Whoever can connect can
    /// read and write every file of the cluster (the socket does not check POSIX
    /// permissions: the mount's kernel does), so bits for the group or others are refused
    /// unless `allow_other_users` is set.
    #[serde(default = "default_socket_mode")]
    pub socket_mode: u32,
    /// Lets `socket_mode` open the socket to the socket's group or to other users: each of
    /// them can then read and write every file of the cluster through the socket.
    #[serde(default)]
    pub allow_other_users: bool,
}

/// `[metrics]`: Prometheus text exposition.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// `ip:port` serving `GET /metrics`; leave out to disable.
    #[serde(default)]
    pub addr: Option<SocketAddr>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

/// `[log]`: tracing output on stderr.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogConfig {
    /// `text` or `json`.
    #[serde(default = "default_log_format")]
    pub format: LogFormat,
    /// A tracing filter such as `info` or `shoal_mesh=debug,info`; `RUST_LOG` overrides it.
    #[serde(default = "default_log_level")]
    pub level: String,
}

fn default_socket() -> PathBuf {
    PathBuf::from(shoal_agent_api::DEFAULT_SOCKET)
}
fn default_socket_mode() -> u32 {
    0o600
}
fn default_log_format() -> LogFormat {
    LogFormat::Text
}
fn default_log_level() -> String {
    "info".into()
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            socket: default_socket(),
            socket_mode: default_socket_mode(),
            allow_other_users: false,
        }
    }
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            format: default_log_format(),
            level: default_log_level(),
        }
    }
}

pub(crate) fn invalid(key: &str, reason: impl Into<String>) -> AgentError {
    AgentError::ConfigValue {
        key: key.to_owned(),
        reason: reason.into(),
    }
}

impl AgentConfig {
    /// Reads, parses and validates the config at `path`.
    pub fn load(path: &Path) -> Result<Self, AgentError> {
        let text = std::fs::read_to_string(path).map_err(|source| AgentError::ConfigRead {
            path: path.to_owned(),
            source,
        })?;
        let config = Self::parse(&text).map_err(|e| match e {
            AgentError::ConfigParse { message, .. } => AgentError::ConfigParse {
                path: path.to_owned(),
                message,
            },
            other => other,
        })?;
        config.validate()?;
        Ok(config)
    }

    /// Parses TOML text without checking values against the machine.
    pub fn parse(text: &str) -> Result<Self, AgentError> {
        toml::from_str(text).map_err(|e| AgentError::ConfigParse {
            path: PathBuf::new(),
            message: e.to_string(),
        })
    }

    /// Checks values that parsing cannot: ranges, and files and directories that must exist.
    pub fn validate(&self) -> Result<(), AgentError> {
        self.validate_values()?;
        if !self.node.data_dir.is_dir() {
            return Err(invalid(
                "node.data_dir",
                format!(
                    "{} does not exist or is not a directory",
                    self.node.data_dir.display()
                ),
            ));
        }
        self.tls.validate().map_err(AgentError::from_config)?;
        if let Some(r) = &self.resources {
            let machine = shoal_resource_guard::MachineInventory::probe()?;
            shoal_resource_guard::plan(r, &machine).map_err(AgentError::from_guard)?;
        }
        Ok(())
    }

    /// The checks that need nothing but the config itself.
    pub fn validate_values(&self) -> Result<(), AgentError> {
        if let Some(t) = &self.tiering {
            t.validate()?;
        }
        if self.node.failure_domain.trim().is_empty() {
            return Err(invalid("node.failure_domain", "must not be empty"));
        }
        if self
            .node
            .name
            .as_deref()
            .is_some_and(|n| n.trim().is_empty())
        {
            return Err(invalid("node.name", "must not be empty when given"));
        }
        if !self.node.data_dir.is_absolute() {
            return Err(invalid("node.data_dir", "must be an absolute path"));
        }
        if !self.admin.socket.is_absolute() {
            return Err(invalid("admin.socket", "must be an absolute path"));
        }
        if self.admin.socket_mode > 0o777 {
            return Err(invalid(
                "admin.socket_mode",
                "must be permission bits (at most 0o777)",
            ));
        }
        if self.admin.socket_mode & 0o077 != 0 && !self.admin.allow_other_users {
            return Err(invalid(
                "admin.socket_mode",
                format!(
                    "{:#o} lets other users connect, and whoever connects can read and write every file of the cluster; use 0o600, or set admin.allow_other_users = true to mean it",
                    self.admin.socket_mode
                ),
            ));
        }
        self.storage.limit_bytes(u64::MAX / 4)?;
        self.storage.reserve_bytes()?;
        let ec = self.storage.ec;
        if let Some(min) = self.storage.min_write_shards {
            let (low, high) = (u16::from(ec.k) + 1, u16::from(ec.k) + u16::from(ec.m));
            if !(low..=high).contains(&u16::from(min)) {
                return Err(invalid(
                    "storage.min_write_shards",
                    format!("{min} is outside k+1..=k+m ({low}..={high} for {ec})"),
                ));
            }
        }
        if self.cluster.down_out_after < Duration::from_secs(1) {
            return Err(invalid("cluster.down_out_after", "must be at least 1s"));
        }
        if self.scrub.interval < Duration::from_secs(1) {
            return Err(invalid("scrub.interval", "must be at least 1s"));
        }
        self.scrub.max_rate_bytes()?;
        self.background.rates()?;
        self.meta
            .validate()
            .map_err(|(key, reason)| invalid(key, reason))?;
        self.storage
            .ec
            .validate()
            .map_err(|e| invalid("storage.ec", e.to_string()))?;
        if self.metrics.addr.is_some_and(|a| a.port() == 0) {
            return Err(invalid("metrics.addr", "must name a fixed port"));
        }
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&self.log.level) {
            return Err(invalid("log.level", e.to_string()));
        }
        self.mesh.validate().map_err(AgentError::from_config)
    }

    /// The name shown for this node.
    pub fn node_name(&self) -> String {
        self.node.name.clone().unwrap_or_else(|| {
            nix::unistd::gethostname()
                .ok()
                .and_then(|h| h.into_string().ok())
                .unwrap_or_else(|| "unknown".into())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
[node]
data_dir = "/var/lib/shoal"
failure_domain = "rack-1"

[mesh]
addr = "10.0.0.11"
seeds = ["10.0.0.11:7946", "10.0.0.12:7946"]

[tls]
ca_cert = "/etc/shoal/tls/ca.pem"
node_cert = "/etc/shoal/tls/node.pem"
node_key = "/etc/shoal/tls/node.key"
cluster_key = "/etc/shoal/tls/cluster.key"
"#;

    fn key_of(result: Result<(), AgentError>) -> Option<String> {
        match result {
            Err(AgentError::ConfigValue { key, .. }) => Some(key),
            _ => None,
        }
    }

    #[test]
    fn minimal_config_gets_documented_defaults() {
        let c = AgentConfig::parse(MINIMAL).expect("parse");
        assert_eq!(c.mesh.gossip_port, 7946);
        assert_eq!(c.mesh.rpc_port, 7947);
        assert_eq!(c.admin.socket, PathBuf::from("/run/shoal/agent.sock"));
        assert_eq!(c.admin.socket_mode, 0o600);
        assert_eq!(c.metrics.addr, None);
        assert_eq!(c.log.format, LogFormat::Text);
        assert_eq!(c.cluster.down_out_after, Duration::from_secs(600));
        assert_eq!(c.scrub.interval, Duration::from_secs(14 * 86_400));
        assert_eq!(c.scrub.max_rate_bytes().ok(), Some(32 << 20));
        let ec = shoal_placement::EcProfile { k: 4, m: 2 };
        assert_eq!(c.storage.min_write_shards(ec), 5, "k+1");
        assert!(c.validate_values().is_ok());
    }

    #[test]
    fn a_socket_open_to_other_users_takes_an_explicit_setting() {
        let mut c = AgentConfig::parse(MINIMAL).expect("parse");
        for open in [0o660, 0o606, 0o666] {
            c.admin.socket_mode = open;
            c.admin.allow_other_users = false;
            assert_eq!(
                key_of(c.validate_values()).as_deref(),
                Some("admin.socket_mode"),
                "{open:#o}"
            );
            c.admin.allow_other_users = true;
            assert!(c.validate_values().is_ok(), "{open:#o} allowed");
        }
        c.admin.socket_mode = 0o600;
        c.admin.allow_other_users = false;
        assert!(c.validate_values().is_ok());
    }

    #[test]
    fn min_write_shards_stays_between_k_plus_one_and_k_plus_m() {
        let mut c = AgentConfig::parse(MINIMAL).expect("parse");
        for bad in [4, 7, 0] {
            c.storage.min_write_shards = Some(bad);
            assert_eq!(
                key_of(c.validate_values()).as_deref(),
                Some("storage.min_write_shards"),
                "{bad} for 4+2"
            );
        }
        c.storage.min_write_shards = Some(6);
        assert!(c.validate_values().is_ok());
        let narrow = shoal_placement::EcProfile { k: 2, m: 1 };
        assert_eq!(c.storage.min_write_shards(narrow), 3, "held to k+m");
        c.storage.min_write_shards = None;
        assert_eq!(c.storage.min_write_shards(narrow), 3, "k+1 = k+m");
    }

    #[test]
    fn durations_and_rates_are_text_with_units() {
        let text = format!(
            "{MINIMAL}\n[cluster]\ndown_out_after = \"30s\"\n[scrub]\ninterval = \"20s\"\nmax_rate = \"1MiB\"\n"
        );
        let c = AgentConfig::parse(&text).expect("parse");
        assert_eq!(c.cluster.down_out_after, Duration::from_secs(30));
        assert_eq!(c.scrub.interval, Duration::from_secs(20));
        assert!(c.validate_values().is_ok());
        let bad = text.replace("\"30s\"", "\"thirty\"");
        let err = AgentConfig::parse(&bad).expect_err("bad").to_string();
        assert!(err.contains("down_out_after"), "{err}");
        let mut c = c;
        c.scrub.max_rate = "0".into();
        assert_eq!(
            key_of(c.validate_values()).as_deref(),
            Some("scrub.max_rate")
        );
    }

    #[test]
    fn the_background_budget_is_bytes_a_second() {
        let text = format!("{MINIMAL}\n[background]\nrate = \"200MiB\"\nrepair_floor = \"8MiB\"\n");
        let mut c = AgentConfig::parse(&text).expect("parse");
        assert_eq!(c.background.rates().ok(), Some((200 << 20, 8 << 20)));
        assert_eq!(
            AgentConfig::parse(MINIMAL)
                .expect("parse")
                .background
                .rates()
                .ok(),
            Some((1 << 30, 64 << 20)),
            "defaults"
        );
        c.background.repair_floor = "fast".into();
        assert_eq!(
            key_of(c.validate_values()).as_deref(),
            Some("background.repair_floor")
        );
        c.background.repair_floor = "8MiB".into();
        c.background.rate = "0".into();
        assert_eq!(
            key_of(c.validate_values()).as_deref(),
            Some("background.rate")
        );
    }

    #[test]
    fn every_size_key_reads_the_one_size_grammar() {
        let mut c = AgentConfig::parse(MINIMAL).expect("parse");
        c.storage.reserve = "1.5MiB".into();
        c.storage.capacity = "2GB".into();
        c.scrub.max_rate = "0.5GiB".into();
        c.background.rate = "512M".into();
        assert_eq!(c.storage.reserve_bytes().ok(), Some(3 << 19));
        assert_eq!(c.storage.limit_bytes(1 << 40).ok(), Some(2_000_000_000));
        assert_eq!(c.scrub.max_rate_bytes().ok(), Some(1 << 29));
        assert_eq!(c.background.rates().ok(), Some((512 << 20, 64 << 20)));
        c.background.repair_floor = "8 parsecs".into();
        match c.validate_values() {
            Err(AgentError::ConfigValue { key, reason }) => {
                assert_eq!(key, "background.repair_floor");
                assert!(reason.contains("\"8 parsecs\" is not a size"), "{reason}");
                assert!(reason.contains("KiB, MiB, GiB"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn unknown_key_is_an_error_naming_it() {
        let text = MINIMAL.replace("[mesh]", "[mesh]\ngossip_prot = 1");
        let err = AgentConfig::parse(&text)
            .expect_err("must fail")
            .to_string();
        assert!(err.contains("gossip_prot"), "{err}");
        let text = format!("{MINIMAL}\n[surprise]\nx = 1\n");
        let err = AgentConfig::parse(&text)
            .expect_err("must fail")
            .to_string();
        assert!(err.contains("surprise"), "{err}");
    }

    #[test]
    fn mistyped_value_names_the_key() {
        let text = MINIMAL.replace("addr = \"10.0.0.11\"", "addr = \"not-an-ip\"");
        let err = AgentConfig::parse(&text)
            .expect_err("must fail")
            .to_string();
        assert!(err.contains("addr"), "{err}");
    }

    #[test]
    fn impossible_values_name_their_key() {
        let base = AgentConfig::parse(MINIMAL).expect("parse");
        let mut c = base.clone();
        c.node.failure_domain = " ".into();
        assert_eq!(
            key_of(c.validate_values()).as_deref(),
            Some("node.failure_domain")
        );
        let mut c = base.clone();
        c.node.data_dir = "relative/dir".into();
        assert_eq!(
            key_of(c.validate_values()).as_deref(),
            Some("node.data_dir")
        );
        let mut c = base.clone();
        c.mesh.rpc_port = 0;
        assert_eq!(
            key_of(c.validate_values()).as_deref(),
            Some("mesh.rpc_port")
        );
        let mut c = base.clone();
        c.log.level = "info,,=[".into();
        assert_eq!(key_of(c.validate_values()).as_deref(), Some("log.level"));
        let mut c = base;
        c.node.data_dir = "/definitely/not/here".into();
        assert_eq!(key_of(c.validate()).as_deref(), Some("node.data_dir"));
    }

    #[test]
    fn shipped_example_resources_and_tiering_sections_parse_when_uncommented() {
        let text = include_str!("../agent.example.toml");
        let uncommented: String = text
            .lines()
            .map(|l| match l.strip_prefix('#') {
                Some(rest)
                    if rest.starts_with("[resources]")
                        || rest.starts_with("[tiering")
                        || rest.contains(" = ") =>
                {
                    // Keep only one of the two CPU forms, as the agent requires.
                    if rest.starts_with("cpu_cores") {
                        String::new()
                    } else {
                        rest.to_owned()
                    }
                }
                _ => l.to_owned(),
            })
            .collect::<Vec<_>>()
            .join("\n");
        let c = AgentConfig::parse(&uncommented).expect("uncommented example must parse");
        let r = c.resources.expect("resources section");
        assert_eq!(r.cpus.as_deref(), Some("0-3"));
        assert_eq!(r.memory, "8GiB");
        assert_eq!(r.enforcement, shoal_resource_guard::Enforcement::Required);
        let t = c.tiering.expect("tiering section");
        t.validate()
            .expect("the example's tiering values are valid");
        assert_eq!(t.store, tiering::StoreKind::S3);
        assert_eq!(t.s3.expect("s3").bucket, "shoal-cold");
    }

    #[test]
    fn shipped_example_config_parses_and_validates() {
        let text = include_str!("../agent.example.toml");
        let c = AgentConfig::parse(text).expect("example config must parse");
        c.validate_values()
            .expect("example config values must be valid");
    }
}
