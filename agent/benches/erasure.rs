//! EC encode rate in the agent's write path (`erasure::encode`: cut, pad, encode) against
//! the raw reed-solomon-simd call on the same buffers, measured side by side in one run.
//! Run: `cargo bench -p shoal-agent --bench erasure`.

use std::time::Instant;

use shoal_agent::data::erasure;
use shoal_placement::{EcProfile, StripeGeometry};

fn rate(bytes: usize, iters: usize, f: impl Fn()) -> f64 {
    f(); // warm up
    let t = Instant::now();
    for _ in 0..iters {
        f();
    }
    (bytes * iters) as f64 / t.elapsed().as_secs_f64() / (1u64 << 30) as f64
}

fn main() {
    for (k, m) in [(4u8, 2u8), (8, 3)] {
        let ec = EcProfile { k, m };
        let len = k as usize * (1 << 20);
        let data: bytes::Bytes = (0..len).map(|i| (i * 31 % 251) as u8).collect();
        let g = StripeGeometry::new(len as u64, k, 1 << 20).expect("geometry");
        let shards: Vec<&[u8]> = data.chunks(1 << 20).collect();
        let iters = 200;
        for round in 0..3 {
            let raw = rate(len, iters, || {
                let out = reed_solomon_simd::encode(k as usize, m as usize, shards.iter())
                    .expect("encode");
                std::hint::black_box(out);
            });
            let ours = rate(len, iters, || {
                let out = erasure::encode(&data, ec, &g).expect("encode");
                std::hint::black_box(out);
            });
            println!(
                "{k}+{m} 1 MiB shards, round {round}: raw library {raw:.2} GiB/s, write path {ours:.2} GiB/s, ratio {:.2}",
                ours / raw
            );
        }
    }
}
