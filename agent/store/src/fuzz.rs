//! Entry points for the fuzz targets (`tests/fuzz`) and their corpus replay: the decoders of
//! bytes this crate reads from disk. Each must return, never panic, whatever the bytes.

use crate::header::ShardHeader;

/// A whole shard file as the store reads it back: header, block table, data.
pub fn shard_file(bytes: &[u8]) {
    if let Ok(h) = ShardHeader::decode(bytes) {
        let _ = crate::disk::check(h.key, bytes);
        // A range read checks only some blocks: the table and data as they come.
        let start = (h.data_offset() as usize).min(bytes.len());
        let table = &bytes[crate::HEADER_LEN.min(start)..start];
        let first = u64::from(bytes.last().copied().unwrap_or(0) % 8);
        let _ = h.verify_blocks(table, first, &bytes[start..]);
    }
}
