//! Agent-to-agent shard messages: put, get (a byte range, checked against the shard's
//! checksum), delete. Failures travel typed so the coordinator can tell "node full" from
//! "corrupt" from "missing".

use bytes::Bytes;
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

/// [`ShardRequest`] as it lies in a frame: a put's shard borrowed, not copied. The same
/// variants in the same order (a unit test holds them to it).
#[derive(Deserialize)]
enum ShardRequestRef<'a> {
    Put {
        stripe: u128,
        index: u8,
        data: &'a [u8],
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
    GetChecked {
        stripe: u128,
        index: u8,
        offset: u64,
        len: u64,
    },
}

/// Byte fields are encoded as bytes (like `serde_bytes`); an answer that arrives over the
/// mesh keeps them as slices of the frame it came in (see [`ShardResponseRef`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ShardResponse {
    Stored,
    Data(Bytes),
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
        blocks: Bytes,
        table: Bytes,
    },
}

/// [`ShardResponse`] as it lies in a frame: its byte fields borrowed, not copied. The same
/// variants in the same order (a unit test holds them to it).
#[derive(Deserialize)]
enum ShardResponseRef<'a> {
    Stored,
    Data(&'a [u8]),
    Deleted(bool),
    Failed {
        kind: ShardFailure,
        message: String,
    },
    Checked {
        data_len: u64,
        shift: u8,
        first: u64,
        blocks: &'a [u8],
        table: &'a [u8],
    },
}

impl Rpc for ShardRequest {
    const ENDPOINT: &'static str = "store/shard";
    type Response = ShardResponse;

    /// A put's shard stays where it arrived: a slice of the request's frame, written to
    /// the shard file from there.
    fn decode_request(body: Bytes) -> Result<ShardRequest, postcard::Error> {
        Ok(match postcard::from_bytes::<ShardRequestRef>(&body)? {
            ShardRequestRef::Put {
                stripe,
                index,
                data,
            } => ShardRequest::Put {
                stripe,
                index,
                data: body.slice_ref(data),
            },
            ShardRequestRef::Get {
                stripe,
                index,
                offset,
                len,
            } => ShardRequest::Get {
                stripe,
                index,
                offset,
                len,
            },
            ShardRequestRef::Delete { stripe, index } => ShardRequest::Delete { stripe, index },
            ShardRequestRef::GetChecked {
                stripe,
                index,
                offset,
                len,
            } => ShardRequest::GetChecked {
                stripe,
                index,
                offset,
                len,
            },
        })
    }

    /// A shard's bytes stay where they arrived: slices of the answer's frame.
    fn decode_response(body: Bytes) -> Result<ShardResponse, postcard::Error> {
        Ok(match postcard::from_bytes::<ShardResponseRef>(&body)? {
            ShardResponseRef::Stored => ShardResponse::Stored,
            ShardResponseRef::Data(d) => ShardResponse::Data(body.slice_ref(d)),
            ShardResponseRef::Deleted(existed) => ShardResponse::Deleted(existed),
            ShardResponseRef::Failed { kind, message } => ShardResponse::Failed { kind, message },
            ShardResponseRef::Checked {
                data_len,
                shift,
                first,
                blocks,
                table,
            } => ShardResponse::Checked {
                data_len,
                shift,
                first,
                blocks: body.slice_ref(blocks),
                table: body.slice_ref(table),
            },
        })
    }
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
    use super::{Bytes, ShardFailure, ShardRequest, ShardResponse, carries_payload};
    use shoal_mesh::Rpc;

    #[test]
    fn every_answer_decodes_from_its_frame_as_it_was_sent_and_bytes_are_not_copied() {
        let answers = [
            ShardResponse::Stored,
            ShardResponse::Data(Bytes::new()),
            ShardResponse::Data(Bytes::from(vec![7u8; 300_000])),
            ShardResponse::Deleted(true),
            ShardResponse::Failed {
                kind: ShardFailure::Corrupt,
                message: "block 3".into(),
            },
            ShardResponse::Checked {
                data_len: 9_000,
                shift: 12,
                first: 1,
                blocks: Bytes::from(vec![1u8; 4096]),
                table: Bytes::from(vec![2u8; 12]),
            },
        ];
        for sent in answers {
            // The frame as it arrives: something before the body, which is postcard's.
            let mut frame = vec![0xAA, 0xBB];
            frame.extend(postcard::to_allocvec(&sent).expect("encode"));
            let frame = Bytes::from(frame);
            let body = frame.slice(2..);
            let got = ShardRequest::decode_response(body.clone()).expect("decode");
            assert_eq!(got, sent);
            assert_eq!(
                got,
                postcard::from_bytes::<ShardResponse>(&body).expect("plain")
            );
            let inside = |b: &Bytes| b.is_empty() || frame.as_ptr_range().contains(&b.as_ptr());
            match &got {
                ShardResponse::Data(d) => assert!(inside(d), "data copied"),
                ShardResponse::Checked { blocks, table, .. } => {
                    assert!(inside(blocks) && inside(table), "blocks copied")
                }
                _ => {}
            }
        }
        // A cut-short answer is an error, never a panic.
        let full = postcard::to_allocvec(&ShardResponse::Data(Bytes::from_static(b"abc")))
            .expect("encode");
        for cut in 0..full.len() {
            assert!(ShardRequest::decode_response(Bytes::copy_from_slice(&full[..cut])).is_err());
        }
    }

    #[test]
    fn every_request_decodes_from_its_frame_as_it_was_sent_and_a_put_is_not_copied() {
        let requests = [
            ShardRequest::Put {
                stripe: u128::MAX - 5,
                index: 3,
                data: Bytes::from(vec![9u8; 300_000]),
            },
            ShardRequest::Put {
                stripe: 1,
                index: 0,
                data: Bytes::new(),
            },
            ShardRequest::Get {
                stripe: 7,
                index: 1,
                offset: 4096,
                len: Some(10),
            },
            ShardRequest::Get {
                stripe: 7,
                index: 1,
                offset: 0,
                len: None,
            },
            ShardRequest::Delete {
                stripe: 8,
                index: 5,
            },
            ShardRequest::GetChecked {
                stripe: 9,
                index: 2,
                offset: 65_536,
                len: 4096,
            },
        ];
        let enc = |r: &ShardRequest| postcard::to_allocvec(r).expect("encode");
        for sent in requests {
            let mut frame = vec![0xAA, 0xBB];
            frame.extend(enc(&sent));
            let frame = Bytes::from(frame);
            let body = frame.slice(2..);
            let got = ShardRequest::decode_request(body.clone()).expect("decode");
            assert_eq!(enc(&got), enc(&sent));
            let plain: ShardRequest = postcard::from_bytes(&body).expect("plain");
            assert_eq!(enc(&got), enc(&plain));
            if let ShardRequest::Put { data, .. } = &got {
                let inside = data.is_empty() || frame.as_ptr_range().contains(&data.as_ptr());
                assert!(inside, "put's shard copied");
            }
        }
        let full = enc(&ShardRequest::Put {
            stripe: 1,
            index: 1,
            data: Bytes::from_static(b"abc"),
        });
        for cut in 0..full.len() {
            assert!(ShardRequest::decode_request(Bytes::copy_from_slice(&full[..cut])).is_err());
        }
    }

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
