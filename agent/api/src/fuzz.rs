//! Entry points for the fuzz targets (`tests/fuzz`) and their corpus replay: the decoders of
//! bytes a local client sends the agent, and the agent's answers a mount reads. Each must
//! return, never panic, whatever the bytes.

use crate::frame::{OLDEST_API_VERSION, decode_body, only_data_frame};
use crate::{API_VERSION, Request, Response};

/// One frame body from the local socket (after its length), as the agent and a mount
/// decode it.
pub fn socket_frame(bytes: &[u8]) {
    let _ = decode_body::<Request>(bytes, OLDEST_API_VERSION..=API_VERSION);
    let _ = decode_body::<Response>(bytes, API_VERSION..=API_VERSION);
    // The head a mount peeks at to read file data straight into its buffer.
    let _ = only_data_frame::<Response>(bytes.get(1..).unwrap_or_default());
}
