//! The real stores, all through `object_store`: an S3-compatible bucket, a local
//! directory (the embedded default: every node of a one-machine cluster points at the same
//! folder; on real servers it must be a filesystem they all share), and memory (the
//! simulator's bucket: `object_store`'s own in-memory store, which never leaves the
//! calling thread, so it runs on a paused clock).

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::TryStreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::path::Path as ObjectPath;
use object_store::{
    BackoffConfig, ClientOptions, ObjectStore, ObjectStoreExt, PutPayload, RetryConfig,
};

use crate::{ColdStore, TierError};

/// Where an S3 bucket is and how to sign for it.
#[derive(Clone, PartialEq, Eq)]
pub struct S3Settings {
    /// `http(s)://host:port`; None for AWS itself (the region names the endpoint).
    pub endpoint: Option<String>,
    pub region: String,
    pub bucket: String,
    /// Path-style requests (`endpoint/bucket/key`), as most S3-compatible servers want.
    pub path_style: bool,
    pub access_key_id: String,
    pub secret_access_key: String,
    /// Keys are stored under this prefix in the bucket ("" for none).
    pub prefix: String,
}

impl std::fmt::Debug for S3Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Settings")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("bucket", &self.bucket)
            .field("path_style", &self.path_style)
            .field("access_key_id", &"<redacted>")
            .field("secret_access_key", &"<redacted>")
            .field("prefix", &self.prefix)
            .finish()
    }
}

/// A cold store on `object_store`.
#[derive(Debug)]
pub struct ObjectBackend {
    inner: Arc<dyn ObjectStore>,
    prefix: String,
    what: String,
}

/// Per request: long enough for a multi-MiB object on a slow link; the connect bound
/// makes an unreachable endpoint fail fast.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

impl ObjectBackend {
    /// A bucket on an S3-compatible server.
    pub fn s3(s: &S3Settings) -> Result<ObjectBackend, TierError> {
        // The workspace's one TLS provider (quinn uses ring too); already set is fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
        if s.bucket.trim().is_empty() {
            return Err(TierError::Config {
                key: "tiering.s3.bucket",
                message: "must not be empty".into(),
            });
        }
        let http = s
            .endpoint
            .as_deref()
            .is_some_and(|e| e.starts_with("http://"));
        // `with_client_options` replaces every client option: allow_http goes in here.
        let options = ClientOptions::new()
            .with_allow_http(http)
            .with_timeout(REQUEST_TIMEOUT)
            .with_connect_timeout(CONNECT_TIMEOUT);
        // A few quick retries of a failed request; longer outages are the caller's to
        // back off from (the mover), and a reader's wait is bounded by its own timeout.
        let retry = RetryConfig {
            backoff: BackoffConfig {
                init_backoff: Duration::from_millis(100),
                max_backoff: Duration::from_secs(2),
                base: 2.0,
            },
            max_retries: 3,
            retry_timeout: Duration::from_secs(10),
        };
        let mut b = AmazonS3Builder::new()
            .with_retry(retry)
            .with_region(&s.region)
            .with_bucket_name(&s.bucket)
            .with_access_key_id(&s.access_key_id)
            .with_secret_access_key(&s.secret_access_key)
            .with_virtual_hosted_style_request(!s.path_style)
            .with_client_options(options);
        if let Some(e) = &s.endpoint {
            b = b.with_endpoint(e);
        }
        let inner = b.build().map_err(|e| TierError::Config {
            key: "tiering.s3",
            message: e.to_string(),
        })?;
        let what = match &s.endpoint {
            Some(e) => format!("s3 bucket {} at {e}", s.bucket),
            None => format!("s3 bucket {} in {}", s.bucket, s.region),
        };
        Ok(ObjectBackend {
            inner: Arc::new(inner),
            prefix: s.prefix.trim_matches('/').to_owned(),
            what,
        })
    }

    /// A local directory (created if missing).
    pub fn dir(path: &Path) -> Result<ObjectBackend, TierError> {
        std::fs::create_dir_all(path).map_err(|e| TierError::Config {
            key: "tiering.dir",
            message: format!("cannot create {}: {e}", path.display()),
        })?;
        // Durable before the put returns, as a bucket's put is: the shards are freed once
        // the upload is committed.
        let inner = LocalFileSystem::new_with_prefix(path)
            .map_err(|e| TierError::Config {
                key: "tiering.dir",
                message: format!("{}: {e}", path.display()),
            })?
            .with_fsync(true);
        Ok(ObjectBackend {
            inner: Arc::new(inner),
            prefix: String::new(),
            what: format!("directory {}", PathBuf::from(path).display()),
        })
    }

    /// A bucket in this process's memory, shared by every clone of the `Arc` that holds
    /// it: the simulator's cold store (its nodes share one, as a cluster shares a bucket).
    pub fn memory() -> ObjectBackend {
        ObjectBackend {
            inner: Arc::new(InMemory::new()),
            prefix: String::new(),
            what: "memory".into(),
        }
    }

    fn path(&self, key: &str) -> ObjectPath {
        if self.prefix.is_empty() {
            ObjectPath::from(key)
        } else {
            ObjectPath::from(format!("{}/{key}", self.prefix))
        }
    }

    fn key_of(&self, path: &ObjectPath) -> String {
        let s = path.as_ref();
        match self.prefix.is_empty() {
            true => s.to_owned(),
            false => s
                .strip_prefix(&self.prefix)
                .map(|r| r.trim_start_matches('/').to_owned())
                .unwrap_or_else(|| s.to_owned()),
        }
    }
}

#[async_trait]
impl ColdStore for ObjectBackend {
    async fn put(&self, key: &str, data: Bytes) -> Result<(), TierError> {
        self.inner
            .put(&self.path(key), PutPayload::from_bytes(data))
            .await?;
        Ok(())
    }

    async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes, TierError> {
        let want = range.end.saturating_sub(range.start);
        if want == 0 {
            return Ok(Bytes::new());
        }
        let got = self.inner.get_range(&self.path(key), range.clone()).await?;
        if got.len() as u64 != want {
            return Err(TierError::Damaged {
                key: key.to_owned(),
                what: format!(
                    "asked for bytes {}..{}, got {} bytes",
                    range.start,
                    range.end,
                    got.len()
                ),
            });
        }
        Ok(got)
    }

    async fn size(&self, key: &str) -> Result<Option<u64>, TierError> {
        match self.inner.head(&self.path(key)).await {
            Ok(meta) => Ok(Some(meta.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    async fn delete(&self, key: &str) -> Result<(), TierError> {
        match self.inner.delete(&self.path(key)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(String, u64)>, TierError> {
        let under = self.path(prefix.trim_end_matches('/'));
        let metas: Vec<_> = self.inner.list(Some(&under)).try_collect().await?;
        Ok(metas
            .into_iter()
            .map(|m| (self.key_of(&m.location), m.size))
            .collect())
    }

    fn describe(&self) -> String {
        self.what.clone()
    }
}
