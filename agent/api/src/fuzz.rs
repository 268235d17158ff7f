//! Entry points for the fuzz targets (`tests/fuzz`) and their corpus replay: the decoders of
//! bytes a local client sends the agent, and the agent's answers a mount reads. Each must
//! return, never panic, whatever the bytes.

use crate::frame::{OLDEST_API_VERSION, decode_body};
use crate::{API_VERSION, Request, Response};

/// One frame body from the local socket (after its length), as the agent and a mount
/// decode it.
pub fn socket_frame(bytes: &[u8]) {
    let _ = decode_body::<Request>(bytes, OLDEST_API_VERSION..=API_VERSION);
    let _ = decode_body::<Response>(bytes, API_VERSION..=API_VERSION);
}
