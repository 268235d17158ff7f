//! `[tiering]`: the cold tier's store and policy. Without the section there is no cold
//! tier: data stays on NVMe. Every node of a cluster must name the same store.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use shoal_tiering::{ColdStore, ObjectBackend, S3Settings, policy::Policy};

use super::{duration_text, invalid};
use crate::AgentError;

/// Which kind of store holds the cold tier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    /// A local directory (`dir`): the embedded default for a cluster on one machine; on
    /// real servers a filesystem every node mounts.
    Dir,
    /// An S3-compatible bucket (`[tiering.s3]`).
    S3,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TieringConfig {
    pub store: StoreKind,
    /// The directory of a `dir` store.
    #[serde(default)]
    pub dir: Option<PathBuf>,
    #[serde(default)]
    pub s3: Option<S3Config>,
    /// Files not read or written for this long go to the cold tier; "off": only the
    /// watermarks and `shoal tier release` send data there.
    #[serde(default = "default_cold_after")]
    pub cold_after: String,
    /// NVMe fill (a share of the cluster's shard capacity) above which the least recently
    /// used files go, whatever their age, until the fill is at `low_watermark`.
    #[serde(default = "default_high")]
    pub high_watermark: f64,
    #[serde(default = "default_low")]
    pub low_watermark: f64,
    /// Paths (from the mount's root) that never go cold, with everything below them.
    #[serde(default)]
    pub pinned: Vec<String>,
    /// A read of cold data fails with EIO after this long without the store's answer.
    #[serde(default = "default_recall_timeout", with = "duration_text")]
    pub recall_timeout: Duration,
    /// Stripes are packed into objects of about this size.
    #[serde(default = "default_object_size")]
    pub object_size: String,
    /// The mover looks for cold files this often.
    #[serde(default = "default_scan_interval", with = "duration_text")]
    pub scan_interval: Duration,
    /// An object in the store that the metadata does not know (a mover that crashed
    /// between upload and commit) is deleted once it has been seen for this long.
    #[serde(default = "default_orphan_grace", with = "duration_text")]
    pub orphan_object_grace: Duration,
}

/// `[tiering.s3]`: the bucket.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct S3Config {
    /// `http(s)://host:port` of an S3-compatible server; absent for AWS itself.
    #[serde(default)]
    pub endpoint: Option<String>,
    #[serde(default = "default_region")]
    pub region: String,
    pub bucket: String,
    /// Path-style requests (`endpoint/bucket/key`), which most S3-compatible servers
    /// want. Default true.
    #[serde(default = "yes")]
    pub path_style: bool,
    /// Keys go under this prefix in the bucket.
    #[serde(default)]
    pub prefix: String,
    /// A TOML file with `access_key_id` and `secret_access_key`; without it they come
    /// from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY.
    #[serde(default)]
    pub credentials_file: Option<PathBuf>,
}

fn default_cold_after() -> String {
    "7d".into()
}
fn default_high() -> f64 {
    0.85
}
fn default_low() -> f64 {
    0.70
}
fn default_recall_timeout() -> Duration {
    Duration::from_secs(30)
}
fn default_object_size() -> String {
    "16MiB".into()
}
fn default_scan_interval() -> Duration {
    Duration::from_secs(60)
}
fn default_orphan_grace() -> Duration {
    Duration::from_secs(3600)
}
fn default_region() -> String {
    "us-east-1".into()
}
fn yes() -> bool {
    true
}

/// The credentials file's keys.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Credentials {
    access_key_id: String,
    secret_access_key: String,
}

impl TieringConfig {
    /// `cold_after` in milliseconds; None when "off".
    pub fn cold_after_ms(&self) -> Result<Option<u64>, AgentError> {
        let t = self.cold_after.trim();
        if t == "off" {
            return Ok(None);
        }
        let d = shoal_units::parse_duration(t)
            .map_err(|e| invalid("tiering.cold_after", format!("{e}; or \"off\"")))?;
        if d.is_zero() {
            return Err(invalid(
                "tiering.cold_after",
                "must be above 0 (or \"off\")",
            ));
        }
        Ok(Some(d.as_millis() as u64))
    }

    pub fn object_size_bytes(&self) -> Result<u64, AgentError> {
        let n = shoal_units::parse_size(&self.object_size)
            .map_err(|e| invalid("tiering.object_size", e.to_string()))?;
        if !(1 << 20..=1 << 30).contains(&n) {
            return Err(invalid(
                "tiering.object_size",
                "must be between 1MiB and 1GiB",
            ));
        }
        Ok(n)
    }

    pub fn policy(&self) -> Result<Policy, AgentError> {
        Ok(Policy {
            cold_after_ms: self.cold_after_ms()?,
            high_watermark: self.high_watermark,
            low_watermark: self.low_watermark,
        })
    }

    /// Checks every value without touching the store.
    pub fn validate(&self) -> Result<(), AgentError> {
        self.cold_after_ms()?;
        self.object_size_bytes()?;
        let (low, high) = (self.low_watermark, self.high_watermark);
        if !(high > 0.0 && high <= 1.0) {
            return Err(invalid(
                "tiering.high_watermark",
                format!("{high} must be above 0 and at most 1"),
            ));
        }
        if !(low >= 0.0 && low < high) {
            return Err(invalid(
                "tiering.low_watermark",
                format!("{low} must be at least 0 and below high_watermark ({high})"),
            ));
        }
        if self.recall_timeout.is_zero() {
            return Err(invalid("tiering.recall_timeout", "must be above 0"));
        }
        if self.orphan_object_grace < Duration::from_secs(60) {
            return Err(invalid(
                "tiering.orphan_object_grace",
                "must be at least 60s (an upload in progress is not an orphan)",
            ));
        }
        if self.scan_interval.is_zero() {
            return Err(invalid("tiering.scan_interval", "must be above 0"));
        }
        if let Some(p) = self.pinned.iter().find(|p| !p.starts_with('/')) {
            return Err(invalid(
                "tiering.pinned",
                format!("{p:?} must be a path from the mount's root (\"/datasets/x\")"),
            ));
        }
        match self.store {
            StoreKind::Dir if self.dir.is_none() => Err(invalid(
                "tiering.dir",
                "store = \"dir\" needs the directory (dir = \"/path\")",
            )),
            StoreKind::S3 => match &self.s3 {
                None => Err(invalid(
                    "tiering.s3",
                    "store = \"s3\" needs a [tiering.s3] section with the bucket",
                )),
                Some(s3) if s3.bucket.trim().is_empty() => {
                    Err(invalid("tiering.s3.bucket", "must not be empty"))
                }
                Some(s3) => match &s3.endpoint {
                    Some(e) if !(e.starts_with("http://") || e.starts_with("https://")) => {
                        Err(invalid(
                            "tiering.s3.endpoint",
                            format!("{e:?} must start with http:// or https://"),
                        ))
                    }
                    _ => Ok(()),
                },
            },
            StoreKind::Dir => Ok(()),
        }
    }

    /// Opens the store this section names (reading the credentials for S3).
    pub fn open_store(&self) -> Result<Arc<dyn ColdStore>, AgentError> {
        self.validate()?;
        let store = match (self.store, &self.dir, &self.s3) {
            (StoreKind::Dir, Some(dir), _) => ObjectBackend::dir(dir),
            (StoreKind::S3, _, Some(s3)) => {
                let (access_key_id, secret_access_key) = credentials(s3)?;
                ObjectBackend::s3(&S3Settings {
                    endpoint: s3.endpoint.clone(),
                    region: s3.region.clone(),
                    bucket: s3.bucket.clone(),
                    path_style: s3.path_style,
                    access_key_id,
                    secret_access_key,
                    prefix: s3.prefix.clone(),
                })
            }
            _ => unreachable!("validate() checked the store's settings"),
        };
        let store = store.map_err(|e| invalid("tiering", e.to_string()))?;
        Ok(Arc::new(store))
    }
}

/// The S3 credentials: from the file the config names, else from the environment.
fn credentials(s3: &S3Config) -> Result<(String, String), AgentError> {
    if let Some(path) = &s3.credentials_file {
        return read_credentials(path);
    }
    match (
        std::env::var("AWS_ACCESS_KEY_ID"),
        std::env::var("AWS_SECRET_ACCESS_KEY"),
    ) {
        (Ok(id), Ok(secret)) if !id.is_empty() && !secret.is_empty() => Ok((id, secret)),
        _ => Err(invalid(
            "tiering.s3.credentials_file",
            "no credentials: name a credentials file, or set AWS_ACCESS_KEY_ID and \
             AWS_SECRET_ACCESS_KEY in the agent's environment",
        )),
    }
}

fn read_credentials(path: &Path) -> Result<(String, String), AgentError> {
    let key = "tiering.s3.credentials_file";
    let text = std::fs::read_to_string(path)
        .map_err(|e| invalid(key, format!("cannot read {}: {e}", path.display())))?;
    // The error must not quote the file: it holds the secret.
    let c: Credentials = toml::from_str(&text).map_err(|_| {
        invalid(
            key,
            format!(
                "{} must hold access_key_id = \"...\" and secret_access_key = \"...\" and nothing else",
                path.display()
            ),
        )
    })?;
    Ok((c.access_key_id, c.secret_access_key))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<TieringConfig, String> {
        let c: TieringConfig = toml::from_str(text).map_err(|e| e.to_string())?;
        c.validate().map_err(|e| e.to_string())?;
        Ok(c)
    }

    #[test]
    fn a_dir_store_with_defaults() {
        let c = parse("store = \"dir\"\ndir = \"/var/lib/shoal/cold\"").expect("valid");
        assert_eq!(c.cold_after_ms().expect("ms"), Some(7 * 86_400_000));
        assert_eq!(c.object_size_bytes().expect("size"), 16 << 20);
        assert_eq!(c.recall_timeout, Duration::from_secs(30));
        let off = parse("store = \"dir\"\ndir = \"/x\"\ncold_after = \"off\"").expect("valid");
        assert_eq!(off.cold_after_ms().expect("ms"), None);
    }

    #[test]
    fn bad_values_name_their_key() {
        for (text, key) in [
            ("store = \"dir\"", "tiering.dir"),
            ("store = \"s3\"", "tiering.s3"),
            (
                "store = \"dir\"\ndir = \"/x\"\ncold_after = \"soon\"",
                "tiering.cold_after",
            ),
            (
                "store = \"dir\"\ndir = \"/x\"\ncold_after = \"0s\"",
                "tiering.cold_after",
            ),
            (
                "store = \"dir\"\ndir = \"/x\"\nobject_size = \"1KiB\"",
                "tiering.object_size",
            ),
            (
                "store = \"dir\"\ndir = \"/x\"\nhigh_watermark = 1.5",
                "tiering.high_watermark",
            ),
            (
                "store = \"dir\"\ndir = \"/x\"\nlow_watermark = 0.9",
                "tiering.low_watermark",
            ),
            (
                "store = \"dir\"\ndir = \"/x\"\npinned = [\"data\"]",
                "tiering.pinned",
            ),
            (
                "store = \"dir\"\ndir = \"/x\"\nrecall_timeout = \"0s\"",
                "tiering.recall_timeout",
            ),
            ("store = \"s3\"\n[s3]\nbucket = \"\"", "tiering.s3.bucket"),
            (
                "store = \"s3\"\n[s3]\nbucket = \"b\"\nendpoint = \"host:9000\"",
                "tiering.s3.endpoint",
            ),
        ] {
            let err = parse(text).expect_err(text);
            assert!(err.contains(key), "{text}: {err}");
        }
        assert!(parse("store = \"tape\"").is_err());
        assert!(parse("store = \"dir\"\ndir = \"/x\"\nspeed = 1").is_err());
    }

    #[test]
    fn credentials_come_from_the_file_and_never_appear_in_errors() {
        let dir = tempfile::tempdir().expect("tempdir");
        let good = dir.path().join("good");
        std::fs::write(
            &good,
            "access_key_id = \"AK\"\nsecret_access_key = \"SEKRIT\"\n",
        )
        .expect("write");
        assert_eq!(
            read_credentials(&good).expect("read"),
            ("AK".to_owned(), "SEKRIT".to_owned())
        );
        let bad = dir.path().join("bad");
        std::fs::write(&bad, "secret_access_key = \"SEKRIT\"\n").expect("write");
        let err = read_credentials(&bad).expect_err("missing key").to_string();
        assert!(!err.contains("SEKRIT"), "{err}");
        assert!(err.contains("tiering.s3.credentials_file"), "{err}");
    }
}
