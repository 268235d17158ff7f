//! Entry points for the fuzz targets (`tests/fuzz`) and their corpus replay: the decoders of
//! bytes a replica takes from the network or its disk (snapshots, log batches, stored
//! records). Each must return, never panic, whatever the bytes.

/// A snapshot as `install` reads it (every version), without writing anything, and its
/// applied marker.
pub fn snapshot(bytes: &[u8]) {
    let _ = crate::snapshot::check(bytes);
    let _ = crate::snapshot_marker(bytes);
}

/// A log entry's batch of proposals, and the answers the state machine stores.
pub fn batch(bytes: &[u8]) {
    let _ = postcard::from_bytes::<crate::Batch>(bytes);
    let _ = postcard::from_bytes::<crate::Outcome>(bytes);
}
