//! The RPC's wire format (see the module doc of `rpc`): the request head, the response
//! frame, and a refusal's class and text.

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::identity::NodeId;

/// Wire version of the RPC framing.
pub const RPC_VERSION: u8 = 1;
/// Largest request or response accepted (head and body). A caller sending more gets
/// [`MeshError::MessageTooLarge`] without anything being sent.
pub const MAX_MESSAGE: usize = 16 << 20;

/// A response frame starts with the RPC version and a status byte.
pub(super) const RESPONSE_HEAD: usize = 2;
pub(super) const STATUS_OK: u8 = 0;
pub(super) const STATUS_ERROR: u8 = 1;
pub(super) const STATUS_NO_HANDLER: u8 = 2;

/// `body` after room for a response head (filled in by `answer`).
pub(super) fn with_head(body: Vec<u8>) -> Vec<u8> {
    let mut frame = Vec::with_capacity(RESPONSE_HEAD + body.len());
    frame.resize(RESPONSE_HEAD, 0);
    frame.extend_from_slice(&body);
    frame
}

/// A request message with its response type, addressed by a stable endpoint name.
pub trait Rpc: Serialize + DeserializeOwned + Send + 'static {
    const ENDPOINT: &'static str;
    type Response: Serialize + DeserializeOwned + Send + 'static;

    /// Decodes a response from `body`, a slice of the frame it arrived in. A response
    /// that carries bulk bytes may take them as slices of `body` instead of copies.
    fn decode_response(body: Bytes) -> Result<Self::Response, postcard::Error> {
        postcard::from_bytes(&body)
    }

    /// Decodes a request from `body`, a slice of the frame it arrived in; like
    /// [`Rpc::decode_response`], a request that carries bulk bytes may keep them there.
    fn decode_request(body: Bytes) -> Result<Self, postcard::Error> {
        postcard::from_bytes(&body)
    }
}

/// The size of `value`'s postcard encoding, without encoding it: a buffer of that size
/// takes the encoding without growing (and copying) on the way.
pub(super) fn encoded_len<T: Serialize + ?Sized>(value: &T) -> Result<usize, postcard::Error> {
    postcard::serialize_with_flavor(value, postcard::ser_flavors::Size::default())
}

#[derive(Serialize, Deserialize)]
pub(super) struct RequestHead {
    pub version: u8,
    pub endpoint: String,
    pub from: NodeId,
}

/// What kind of failure a refusal is: whether the caller may try again, and why not.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FailureClass {
    /// Try again later (the peer is busy, electing, not yet ready).
    Retryable,
    /// What was asked for is not there.
    NotFound,
    /// No room for it.
    NoSpace,
    /// The data is damaged.
    Corrupt,
    /// The peer will not do it (not allowed, or not its role).
    Refused,
    /// The request itself is malformed.
    Invalid,
}

impl FailureClass {
    const ALL: [FailureClass; 6] = [
        FailureClass::Retryable,
        FailureClass::NotFound,
        FailureClass::NoSpace,
        FailureClass::Corrupt,
        FailureClass::Refused,
        FailureClass::Invalid,
    ];

    pub(super) fn wire(self) -> u8 {
        self as u8
    }

    pub(super) fn from_wire(b: u8) -> Option<FailureClass> {
        FailureClass::ALL.get(usize::from(b)).copied()
    }
}

/// A handler's refusal of a request: its class and the text for the operator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub class: FailureClass,
    pub message: String,
}

impl Refusal {
    pub fn new(class: FailureClass, message: impl Into<String>) -> Refusal {
        Refusal {
            class,
            message: message.into(),
        }
    }

    pub(super) fn encode(&self) -> Vec<u8> {
        let mut out = vec![self.class.wire()];
        out.extend_from_slice(self.message.as_bytes());
        out
    }

    /// Reads an error body. A peer of the release before classes sent bare text: that is
    /// a refusal (text never starts with a class byte, which are control characters).
    pub(super) fn decode(body: &[u8]) -> Refusal {
        match body.split_first() {
            Some((&b, text)) if FailureClass::from_wire(b).is_some() => Refusal {
                class: FailureClass::from_wire(b).unwrap_or(FailureClass::Refused),
                message: String::from_utf8_lossy(text).into_owned(),
            },
            _ => Refusal::new(
                FailureClass::Refused,
                String::from_utf8_lossy(body).into_owned(),
            ),
        }
    }
}

/// A response frame: the body of an answer, or the peer's refusal; `Err` for a frame that
/// is neither.
pub(crate) fn split_response(response: &[u8]) -> Result<Result<&[u8], Refusal>, String> {
    match response {
        [RPC_VERSION, STATUS_OK, body @ ..] => Ok(Ok(body)),
        [RPC_VERSION, STATUS_NO_HANDLER, text @ ..] => Ok(Err(Refusal::new(
            FailureClass::Refused,
            String::from_utf8_lossy(text).into_owned(),
        ))),
        [RPC_VERSION, _, body @ ..] => Ok(Err(Refusal::decode(body))),
        [v, ..] => Err(format!("unsupported RPC version {v}")),
        [] => Err("empty response".into()),
    }
}

/// A request frame's head and the message bytes after it.
pub(crate) fn split_request(request: &[u8]) -> Result<(u8, String, NodeId, &[u8]), String> {
    let (head, body) = postcard::take_from_bytes::<RequestHead>(request)
        .map_err(|e| format!("malformed request head: {e}"))?;
    Ok((head.version, head.endpoint, head.from, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_keeps_its_class_across_the_wire() {
        for class in FailureClass::ALL {
            let r = Refusal::new(class, "no");
            assert_eq!(Refusal::decode(&r.encode()), r);
        }
        // The release before classes sent bare text.
        assert_eq!(
            Refusal::decode(b"malformed store/shard"),
            Refusal::new(FailureClass::Refused, "malformed store/shard")
        );
    }
}
