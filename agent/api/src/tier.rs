//! Answers of the cold-tier requests (`shoal tier ...`, `shoal stat`).

use serde::{Deserialize, Serialize};

use crate::StripeId;

/// The cold tier as one agent sees it (`shoal tier status`). The counts come from the
/// metadata (the same on every node); the mover's state is this node's (the mover works on
/// the metadata leader).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TierReport {
    /// The store, in words (kind and location; never credentials).
    pub store: String,
    /// Bytes of file data on NVMe and in the bucket, and files by where their data is
    /// (a file with data in both counts as `partly_cold`).
    pub hot_bytes: u64,
    pub cold_bytes: u64,
    pub hot_files: u64,
    pub cold_files: u64,
    pub partly_cold_files: u64,
    /// What this node's mover is uploading right now.
    pub moving_files: u64,
    pub moving_bytes: u64,
    /// Objects in the bucket that cold stripes use, and their bytes.
    pub objects: u64,
    pub object_bytes: u64,
    /// Objects no stripe uses any more, waiting to be deleted from the bucket.
    pub garbage_objects: u64,
    pub garbage_bytes: u64,
    /// The `tier-mover` worker's state in words: `idle`, `moving`, `backing off` (its
    /// last upload failed), `standby` (not the leader), `throttled` or `stopped`.
    pub mover: String,
    /// The store answered the last request (false during an outage).
    pub store_ok: bool,
    pub last_error: Option<String>,
    pub last_error_unix_ms: Option<u64>,
    /// Totals since this agent started: bytes uploaded (verified and committed), and
    /// ranged reads of cold data and their bytes.
    pub uploaded_bytes: u64,
    pub recall_requests: u64,
    pub recall_bytes: u64,
    /// The policy: `cold_after` ("7d" or "off") and the watermarks, with the NVMe fill.
    pub cold_after: String,
    pub high_watermark: f64,
    pub low_watermark: f64,
    pub fill: f64,
    /// The prefetch under way on this node: files and bytes to warm, warmed so far, and
    /// the rate (all 0 when none runs).
    pub prefetch_files_total: u64,
    pub prefetch_files_done: u64,
    pub prefetch_bytes_total: u64,
    pub prefetch_bytes_done: u64,
    pub prefetch_bytes_per_sec: u64,
}

/// Where one cold extent's bytes are: its stripe, the object key and the byte range in it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ColdExtent {
    pub stripe: StripeId,
    pub object: String,
    pub offset: u64,
    pub len: u64,
}

/// What a release or prefetch did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TierMoved {
    pub files: u64,
    pub stripes: u64,
    pub bytes: u64,
    pub millis: u64,
}
