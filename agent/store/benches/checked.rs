//! What checking a shard range costs a reader (`CheckedRange::verify`: the block table
//! folded to the shard's checksum, then the blocks holding the range), and what building
//! a new shard's header and block table costs a writer (`ShardHeader::for_data`).
//! Run: `cargo bench -p shoal-store --bench checked`; for stable counts on a noisy machine,
//! run the built binary under `valgrind --tool=callgrind` with `SHOAL_BENCH_ITERS=1000`.

use std::time::Instant;

use bytes::Bytes;
use shoal_store::{CheckedRange, ShardHeader, ShardKey};

fn per_op(iters: u32, f: impl Fn()) -> f64 {
    f(); // warm up
    let t = Instant::now();
    for _ in 0..iters {
        f();
    }
    t.elapsed().as_nanos() as f64 / f64::from(iters)
}

fn main() {
    let iters: u32 = std::env::var("SHOAL_BENCH_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    for shard_len in [256usize << 10, 1 << 20] {
        let data: Bytes = (0..shard_len).map(|i| (i * 31 % 251) as u8).collect();
        let crc = crc32c::crc32c(&data);
        let range = CheckedRange::of(&data, 8192, 8192 + 4096);
        let verify = per_op(iters, || {
            let got = range.verify(crc, 8192, 4096).expect("verify");
            std::hint::black_box(got);
        });
        let key = ShardKey {
            stripe: 7,
            index: 1,
        };
        let header = per_op(iters / 20, || {
            std::hint::black_box(ShardHeader::for_data(key, &data));
        });
        println!(
            "{} KiB shard: verify a 4 KiB range {:.2} µs, header and block table {:.1} µs",
            shard_len >> 10,
            verify / 1000.0,
            header / 1000.0
        );
    }
}
