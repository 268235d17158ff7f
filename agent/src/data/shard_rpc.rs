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
    /// A range the reader checks itself against the shard's checksum from the metadata:
    /// answered with [`ShardResponse::Checked`] (the blocks holding it and the block
    /// table). A holder of the previous release cannot decode it; the reader then asks
    /// with `Get`.
    GetChecked {
        stripe: u128,
        index: u8,
        offset: u64,
        len: u64,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ShardFailure {
    NotFound,
    Corrupt,
    Full,
    Other,
    /// The holder could not decode the request (a release that lacks it). Never sent:
    /// made by the caller from the holder's refusal.
    Unsupported,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum ShardResponse {
    Stored,
    Data(#[serde(with = "serde_bytes")] Vec<u8>),
    Deleted(bool),
    Failed {
        kind: ShardFailure,
        message: String,
    },
    /// GetChecked: the blocks holding the range and the shard's block table.
    Checked {
        data_len: u64,
        shift: u8,
        first: u64,
        #[serde(with = "serde_bytes")]
        blocks: Vec<u8>,
        #[serde(with = "serde_bytes")]
        table: Vec<u8>,
    },
}

impl Rpc for ShardRequest {
    const ENDPOINT: &'static str = "store/shard";
    type Response = ShardResponse;
}

/// Whether an encoded [`ShardRequest`] carries a shard's bytes (a put or a get), the only
/// requests the bulk lane serves: postcard encodes the variant's index first.
pub fn carries_payload(encoded: &[u8]) -> bool {
    matches!(encoded.first(), Some(0 | 1 | 3))
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
        let checked = ShardRequest::GetChecked {
            stripe: 1,
            index: 2,
            offset: 0,
            len: 1,
        };
        let enc = |r: &ShardRequest| postcard::to_allocvec(r).expect("encode");
        assert!(carries_payload(&enc(&put)));
        assert!(carries_payload(&enc(&get)));
        assert!(carries_payload(&enc(&checked)));
        assert!(!carries_payload(&enc(&delete)));
        assert!(!carries_payload(&[]));
    }
}
