//! The placement hash and score. **On-disk contract**: these functions decide where
//! every shard lives, so they must give the same answer on every platform and in every
//! release. Integer arithmetic only (no floats, no `std` hasher, no randomness). A change
//! moves data, so it can only come as a new, versioned placement algorithm beside this
//! one, never as an edit: the pinned vectors in the tests below must never change.
//!
//! For shard slot `s` of stripe `S` on node `N`:
//!
//! ```text
//! mix64(z)       = splitmix64 finalizer (Stafford "Mix13")
//! fold(a, b)     = lo64(a*b) ^ hi64(a*b)            (128-bit product, as in wyhash)
//! slot_key(S, s) = mix64(mix64(mix64(lo64(S) ^ STRIPE_SALT) ^ hi64(S)) ^ s)
//! node_key(N)    = mix64(N ^ NODE_SALT)
//! draw(S, s, N)  = mix64(fold(slot_key(S, s) ^ FOLD_A, node_key(N) ^ FOLD_B))
//! ```
//!
//! The draw `h` becomes `u = (h | 1) / 2^64` in (0, 1), and the node's score is
//! `weight / -log2(u)` (ordering-equivalent to the textbook `-weight / ln(u)`), compared
//! exactly as `w_a * L_b` against `w_b * L_a` in 128-bit integers, with `L = -log2(u)`
//! in fixed point with [`LOG_FRAC_BITS`] fractional bits.

const STRIPE_SALT: u64 = 0x7368_6f61_6c2d_7331; // "shoal-s1"
const NODE_SALT: u64 = 0x7368_6f61_6c2d_6e31; // "shoal-n1"
const FOLD_A: u64 = 0xa076_1d64_78bd_642f; // wyhash secret[0]
const FOLD_B: u64 = 0xe703_7ed1_a0b4_28db; // wyhash secret[1]

/// Fractional bits of the fixed-point `-log2(u)`.
pub(crate) const LOG_FRAC_BITS: u32 = 32;

/// splitmix64's output function: a bijection on u64 with full avalanche.
pub(crate) fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn fold(a: u64, b: u64) -> u64 {
    let p = u128::from(a) * u128::from(b);
    (p as u64) ^ ((p >> 64) as u64)
}

/// Per (stripe, slot) half of the draw; computed once per slot.
pub(crate) fn slot_key(stripe: u128, slot: u8) -> u64 {
    let lo = stripe as u64;
    let hi = (stripe >> 64) as u64;
    mix64(mix64(mix64(lo ^ STRIPE_SALT) ^ hi) ^ u64::from(slot))
}

/// Per node half of the draw; computed once per node.
pub(crate) fn node_key(node: u64) -> u64 {
    mix64(node ^ NODE_SALT)
}

/// The uniform 64-bit draw for one (stripe, slot, node).
pub(crate) fn draw(slot_key: u64, node_key: u64) -> u64 {
    mix64(fold(slot_key ^ FOLD_A, node_key ^ FOLD_B))
}

/// `-log2(u)` for `u = (h | 1) / 2^64`, in units of `2^-LOG_FRAC_BITS`; always >= 1.
///
/// Exact integer arithmetic, so every platform agrees bit for bit. With `x = h | 1 =
/// 2^e * M`, `M` in [1, 2): `log2(M) = -log2(R_i) + log2(M * R_i)`, where `R_i` is a
/// 64-bit reciprocal of the midpoint of `M`'s 1/128-wide bucket `i` (so `M * R_i = 1 + r`
/// with `|r| < 2^-8`), `-log2(R_i)` comes from a table built at compile time by repeated
/// squaring, and `log2(1 + r)` from five terms of the `ln(1 + r)` series times `log2(e)`.
/// Absolute error below `2^-31`.
pub(crate) fn neg_log2_fixed(h: u64) -> u64 {
    let x = h | 1;
    let lz = x.leading_zeros();
    let int_part = u64::from(63 - lz);
    let m = x << lz; // Q1.63: [2^63, 2^64) stands for [1, 2)
    let i = ((m >> (63 - TABLE_BITS)) as usize) & (TABLE_LEN - 1);
    // m * R_i in Q127, within 2^-8 of 1; r = m * R_i - 1 in signed Q64.
    let p = u128::from(m) * u128::from(RECIP[i]);
    let r = (p.wrapping_sub(1 << 127) as i128 >> 63) as i64;
    let log2_m = NEG_LOG2_RECIP[i] + (log2_1p_q64(r) >> (64 - TABLE_FRAC_BITS));
    let frac =
        (log2_m.clamp(0, (1 << TABLE_FRAC_BITS) - 1) as u64) >> (TABLE_FRAC_BITS - LOG_FRAC_BITS);
    // frac < 2^LOG_FRAC_BITS, so this is at least 1.
    (64 << LOG_FRAC_BITS) - ((int_part << LOG_FRAC_BITS) + frac)
}

const TABLE_BITS: u32 = 7;
const TABLE_LEN: usize = 1 << TABLE_BITS;
/// Fractional bits of the table and the intermediate sum.
const TABLE_FRAC_BITS: u32 = 40;
/// `floor(log2(e) * 2^62)`.
const LOG2_E_Q62: i64 = 0x5c55_1d94_ae0b_f85d;

/// `R_i = floor(2^72 / (257 + 2i))`: 1 / (1 + (i + 1/2) / 128) in Q64, in [2^63, 2^64).
const RECIP: [u64; TABLE_LEN] = {
    let mut t = [0u64; TABLE_LEN];
    let mut i = 0;
    while i < TABLE_LEN {
        t[i] = ((1u128 << 72) / (257 + 2 * i as u128)) as u64;
        i += 1;
    }
    t
};

/// `-log2(R_i / 2^64) = 1 - frac(log2(R_i))` in Q40.
const NEG_LOG2_RECIP: [i64; TABLE_LEN] = {
    let mut t = [0i64; TABLE_LEN];
    let mut i = 0;
    while i < TABLE_LEN {
        t[i] = ((1 << TABLE_FRAC_BITS) - log2_frac_by_squaring(RECIP[i], TABLE_FRAC_BITS)) as i64;
        i += 1;
    }
    t
};

/// Fractional part of `log2(m)` for `m` in [2^63, 2^64), `bits` bits, truncated: one bit
/// per squaring of the normalized mantissa.
const fn log2_frac_by_squaring(m: u64, bits: u32) -> u64 {
    let mut m = m as u128;
    let mut frac = 0u64;
    let mut b = 0;
    while b < bits {
        m = (m * m) >> 63;
        frac <<= 1;
        if m >= 1 << 64 {
            m >>= 1;
            frac |= 1;
        }
        b += 1;
    }
    frac
}

/// `log2(1 + r)` for `|r| < 2^-8`, both in signed Q64.
fn log2_1p_q64(r: i64) -> i64 {
    let mul = |a: i64, b: i64| ((i128::from(a) * i128::from(b)) >> 64) as i64;
    let r2 = mul(r, r);
    let r3 = mul(r2, r);
    let r4 = mul(r3, r);
    let r5 = mul(r4, r);
    let ln = r - r2 / 2 + r3 / 3 - r4 / 4 + r5 / 5;
    ((i128::from(ln) * i128::from(LOG2_E_Q62)) >> 62) as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The slow, obviously right `-log2(u)`: every fractional bit by squaring.
    fn neg_log2_by_squaring(h: u64) -> u64 {
        let x = h | 1;
        let lz = x.leading_zeros();
        let log2_x =
            (u64::from(63 - lz) << LOG_FRAC_BITS) | log2_frac_by_squaring(x << lz, LOG_FRAC_BITS);
        (64 << LOG_FRAC_BITS) - log2_x
    }

    #[test]
    fn neg_log2_agrees_with_bit_by_bit_squaring() {
        let mut h = 0u64;
        let mut worst = 0;
        for i in 0..50_000u64 {
            h = mix64(h ^ i);
            // Also walk every bucket edge and both ends of the mantissa range.
            let edge = (1u64 << 63) | ((i % 128) << 56) | (i & 1);
            for x in [
                h,
                h >> (i % 64),
                edge,
                edge.wrapping_sub(2),
                u64::MAX - (i % 3),
            ] {
                let diff = neg_log2_fixed(x).abs_diff(neg_log2_by_squaring(x));
                worst = worst.max(diff);
            }
        }
        assert!(
            worst <= 1,
            "worst difference {worst} units of 2^-{LOG_FRAC_BITS}"
        );
    }

    #[test]
    fn neg_log2_matches_floating_point_closely() {
        for h in [
            1u64,
            2,
            1 << 20,
            1 << 32,
            1 << 63,
            3 << 62,
            u64::MAX / 3,
            u64::MAX - (1 << 40),
            u64::MAX,
        ] {
            let exact = -(((h | 1) as f64) / 2f64.powi(64)).log2();
            let fixed = neg_log2_fixed(h) as f64 / 2f64.powi(LOG_FRAC_BITS as i32);
            assert!((exact - fixed).abs() < 1e-8, "h={h:#x}: {exact} vs {fixed}");
        }
        assert_eq!(neg_log2_fixed(1 << 63), 1 << LOG_FRAC_BITS);
        assert_eq!(neg_log2_fixed(1), 64 << LOG_FRAC_BITS);
        assert!(neg_log2_fixed(u64::MAX) >= 1);
    }

    /// These values are part of the on-disk contract: if this test fails, data would move.
    #[test]
    fn placement_hash_is_pinned() {
        // splitmix64 seeded with 0 outputs mix64(0x9e3779b97f4a7c15) first.
        assert_eq!(mix64(0x9e37_79b9_7f4a_7c15), 0xe220_a839_7b1d_cdaf);
        assert_eq!(mix64(1), PIN_MIX64_1);
        let sk = slot_key(0x0123_4567_89ab_cdef_fedc_ba98_7654_3210, 3);
        assert_eq!(sk, PIN_SLOT_KEY);
        assert_eq!(node_key(42), PIN_NODE_KEY);
        assert_eq!(draw(sk, node_key(42)), PIN_DRAW);
        assert_eq!(neg_log2_fixed(PIN_DRAW), PIN_NEG_LOG2);
    }

    const PIN_MIX64_1: u64 = 0x5692_161d_100b_05e5;
    const PIN_SLOT_KEY: u64 = 0x38f6_6537_639f_8d58;
    const PIN_NODE_KEY: u64 = 0x76f5_2afb_c0f3_51dd;
    const PIN_DRAW: u64 = 0x224c_5d65_9ac4_a5cf;
    const PIN_NEG_LOG2: u64 = 0x2_e662_2104;
}
