//! A reader checks what a holder sends against the shard's checksum in the metadata, not
//! against the holder's word: a holder whose block and block-table entry were both altered
//! (so its own check passes) is caught on a range read and read around.

use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use shoal_tests::{DevCluster, metric_sum, shard_files, wait_for};

/// The shard file layout (agent/store/src/header.rs): a 48-byte header (byte 25: log2 of the
/// block size), a crc32c per block, then the data.
const HEADER: usize = 48;

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 % 253) as u8).collect()
}

#[test]
fn a_range_from_a_holder_that_lies_consistently_is_caught_and_read_around() {
    // 2+1 with 1 MiB shards: a 2 MiB file is one stripe, file MiB 1 is data shard 1.
    let c = DevCluster::up_with(3, 42, &["--mount"]);
    let data = pattern(2 << 20);
    std::fs::write(c.mnt(1).join("f"), &data).expect("write");
    let (holder, shard): (u8, PathBuf) = (1..=3)
        .find_map(|i| {
            shard_files(&c, i)
                .into_iter()
                .find(|p| p.extension().is_some_and(|e| e == "1"))
                .map(|p| (i, p))
        })
        .expect("a node holds data shard 1");

    // Alter block 1 of the shard and its table entry to match: the holder's block check
    // passes, only the whole shard's checksum (in the stripe record) tells.
    let mut bytes = std::fs::read(&shard).expect("read shard");
    let block = 1usize << bytes[25];
    let blocks = (1 << 20) / block; // a 1 MiB shard
    let start = HEADER + 4 * blocks + block;
    for b in &mut bytes[start + 100..start + 200] {
        *b ^= 0x5a;
    }
    let crc = crc32c(&bytes[start..start + block]);
    bytes[HEADER + 4..HEADER + 8].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&shard, &bytes).expect("write shard");

    // A small read of that block through a mount that never read the file (a range, not the
    // whole shard).
    let reader = if holder == 3 { 2 } else { 3 };
    let f = std::fs::File::open(c.mnt(reader).join("f")).expect("open");
    let at = (1 << 20) + block as u64 + 64;
    let mut got = vec![0u8; 1024];
    f.read_exact_at(&mut got, at).expect("read");
    assert!(
        got == data[at as usize..at as usize + got.len()],
        "the altered range was served"
    );
    let seen = metric_sum(
        &c.metrics(reader),
        "shoal_stripes_corrupt_shards_seen_total",
        "",
    );
    assert!(seen >= 1.0, "the mismatch was not counted");
    wait_for(
        std::time::Duration::from_secs(5),
        "the mismatch logged",
        || {
            c.log(reader)
                .contains("did not match the record's checksum")
                .then_some(())
        },
    );
    c.down();
}

/// crc32c (Castagnoli), bitwise: the test's own, independent of the agent's.
fn crc32c(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82f6_3b78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}
