//! Agent-to-agent shard messages: put, get (a byte range, checked against the shard's
//! checksum), delete. Failures travel typed so the coordinator can tell "node full" from
//! "corrupt" from "missing".

use serde::{Deserialize, Serialize};
use shoal_mesh::Rpc;

#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum ShardRequest {
    Put {
        stripe: u128,
        index: u8,
        /// The shard (encoded as bytes, like `serde_bytes`); shared, not copied, when one
        /// stripe is sent to several placements.
        data: bytes::Bytes,
    },
    Get {
        stripe: u128,
        index: u8,
        offset: u64,
        len: Option<u64>,
    },
    Delete {
        stripe: u128,
        index: u8,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ShardFailure {
    NotFound,
    Corrupt,
    Full,
    Other,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum ShardResponse {
    Stored,
    Data(#[serde(with = "serde_bytes")] Vec<u8>),
    Deleted(bool),
    Failed { kind: ShardFailure, message: String },
}

impl Rpc for ShardRequest {
    const ENDPOINT: &'static str = "store/shard";
    type Response = ShardResponse;
}

pub fn failure(e: &shoal_store::StoreError) -> ShardResponse {
    use shoal_store::StoreError as E;
    let kind = match e {
        E::NotFound(_) => ShardFailure::NotFound,
        E::Corrupt { .. } => ShardFailure::Corrupt,
        E::Full { .. } | E::NoRoom { .. } => ShardFailure::Full,
        _ => ShardFailure::Other,
    };
    ShardResponse::Failed {
        kind,
        message: e.to_string(),
    }
}
