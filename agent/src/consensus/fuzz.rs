//! Entry points for the fuzz targets (`tests/fuzz`) and their corpus replay: the decoders of
//! Raft's bytes, from the network (the group's RPC messages and replies) and from disk (log
//! records). Each must return, never panic, whatever the bytes.

use super::net::{Forward, ForwardRefused, RaftMessage, RaftReply};

/// A Raft message, reply or forwarded proposal as the RPC handlers decode it.
pub fn raft_rpc(bytes: &[u8]) {
    let _ = postcard::from_bytes::<RaftMessage>(bytes);
    let _ = postcard::from_bytes::<RaftReply>(bytes);
    let _ = postcard::from_bytes::<Forward>(bytes);
    let _ =
        postcard::from_bytes::<Result<(Vec<shoal_namespace::Outcome>, u64), ForwardRefused>>(bytes);
}

/// A log record as the log store reads it back (either version).
pub fn log_record(bytes: &[u8]) {
    let _ = super::log_store::decode_entry(bytes);
}
