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

/// Whether an encoded [`ShardRequest`] carries a shard's bytes (a put or a get), the only
/// requests the bulk lane serves: postcard encodes the variant's index first.
pub fn carries_payload(encoded: &[u8]) -> bool {
    matches!(encoded.first(), Some(0 | 1))
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

#[cfg(test)]
mod tests {
    use super::{ShardRequest, carries_payload};

    #[test]
    fn only_puts_and_gets_travel_on_the_bulk_lane() {
        let put = ShardRequest::Put {
            stripe: 1,
            index: 2,
            data: bytes::Bytes::from_static(b"x"),
        };
        let get = ShardRequest::Get {
            stripe: 1,
            index: 2,
            offset: 0,
            len: None,
        };
        let delete = ShardRequest::Delete {
            stripe: 1,
            index: 2,
        };
        let enc = |r: &ShardRequest| postcard::to_allocvec(r).expect("encode");
        assert!(carries_payload(&enc(&put)));
        assert!(carries_payload(&enc(&get)));
        assert!(!carries_payload(&enc(&delete)));
        assert!(!carries_payload(&[]));
    }
}
