//! The crc32c of a whole shard from the crc32c of its blocks, fast.
//!
//! crc(A ‖ B) = crc(A) · x^(8·|B|) mod P  ⊕  crc(B) for the Castagnoli polynomial P (the
//! initial and final inversions cancel out). `crc32c::crc32c_combine` computes the power of x
//! anew on every call (about 10 µs here): 16 of them per 1 MiB shard on every write, every
//! whole-shard check and every checked range. Blocks of one size share one multiplier, so a
//! table folds with one multiplication per block; for the 4 KiB blocks of new files that is
//! four table lookups (`Multiplier`; tens of nanoseconds).

/// The Castagnoli polynomial, bit-reversed (the representation crc32c computes in: bit 31
/// is the coefficient of x^0).
const POLY: u32 = 0x82f6_3b78;

/// a · b mod P, both in the reversed representation.
fn multiply(a: u32, mut b: u32) -> u32 {
    let mut product = 0u32;
    let mut bit = 1u32 << 31;
    while bit != 0 {
        if a & bit != 0 {
            product ^= b;
        }
        bit >>= 1;
        b = if b & 1 != 0 { (b >> 1) ^ POLY } else { b >> 1 };
    }
    product
}

/// x^(8·bytes) mod P: what shifting a crc past `bytes` more bytes multiplies it by.
fn shift_by(bytes: u64) -> u32 {
    // Square-and-multiply over the bits of 8·bytes, starting from x^1.
    let mut power = 1u32 << 30; // x^1
    let mut result = 1u32 << 31; // x^0
    let mut n = bytes.saturating_mul(8);
    while n != 0 {
        if n & 1 != 0 {
            result = multiply(result, power);
        }
        power = multiply(power, power);
        n >>= 1;
    }
    result
}

/// Multiplication by one fixed factor, a byte of the other operand at a time: the product
/// is linear in that operand, so it is the XOR of four products looked up by byte.
struct Multiplier {
    tables: [[u32; 256]; 4],
}

impl Multiplier {
    fn new(factor: u32) -> Multiplier {
        let mut tables = [[0u32; 256]; 4];
        for (j, table) in tables.iter_mut().enumerate() {
            for bit in 0..8 {
                // In the reversed representation bit 31 is x^0: byte j's bit `bit` of a
                // u32 (a value `1 << (8j + bit)`) is x^(31 - 8j - bit).
                let product = multiply(1u32 << (8 * j + bit), factor);
                let at = 1usize << bit;
                for v in 0..at {
                    table[at | v] = table[v] ^ product;
                }
            }
        }
        Multiplier { tables }
    }

    fn times(&self, a: u32) -> u32 {
        let [b0, b1, b2, b3] = a.to_le_bytes();
        self.tables[0][usize::from(b0)]
            ^ self.tables[1][usize::from(b1)]
            ^ self.tables[2][usize::from(b2)]
            ^ self.tables[3][usize::from(b3)]
    }
}

/// The multiplier past one block of the size new shard files use, built once.
fn standard_block() -> &'static Multiplier {
    static TABLES: std::sync::OnceLock<Multiplier> = std::sync::OnceLock::new();
    TABLES.get_or_init(|| Multiplier::new(shift_by(1 << crate::header::BLOCK_SHIFT)))
}

/// The crc32c of the concatenation of blocks of `block` bytes (the last one `data_len`'s
/// remainder) whose crc32cs `crcs` yields in order.
pub(crate) fn fold(crcs: impl IntoIterator<Item = u32>, block: u64, data_len: u64) -> u32 {
    if block == 1 << crate::header::BLOCK_SHIFT {
        let tables = standard_block();
        fold_with(crcs, block, data_len, |crc| tables.times(crc))
    } else {
        let full = shift_by(block);
        fold_with(crcs, block, data_len, |crc| multiply(crc, full))
    }
}

/// [`fold`], with `past_block` multiplying a crc by x^(8·block).
fn fold_with(
    crcs: impl IntoIterator<Item = u32>,
    block: u64,
    data_len: u64,
    past_block: impl Fn(u32) -> u32,
) -> u32 {
    let mut whole = 0u32;
    let mut at = 0u64;
    for crc in crcs {
        let len = block.min(data_len.saturating_sub(at));
        let shifted = if len == block {
            past_block(whole)
        } else {
            multiply(whole, shift_by(len))
        };
        whole = shifted ^ crc;
        at += len;
    }
    whole
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folding_block_crcs_gives_the_crc_of_the_whole() {
        let data: Vec<u8> = (0..300_007u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
            .collect();
        for block in [1u64, 7, 512, 4096, 65_536, 1 << 20] {
            let crcs = data.chunks(block as usize).map(crc32c::crc32c);
            assert_eq!(
                fold(crcs, block, data.len() as u64),
                crc32c::crc32c(&data),
                "blocks of {block}"
            );
        }
        assert_eq!(fold([], 4096, 0), crc32c::crc32c(b""));
    }

    #[test]
    fn the_table_multiplier_agrees_with_the_bit_by_bit_one() {
        let mut x = 0x9e37_79b9u32;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x
        };
        for _ in 0..20 {
            let factor = next();
            let tables = Multiplier::new(factor);
            for a in [0, 1, 1 << 31, u32::MAX, next(), next(), next()] {
                assert_eq!(tables.times(a), multiply(a, factor), "{a:#x} · {factor:#x}");
            }
        }
    }

    #[test]
    fn it_agrees_with_the_crates_combine() {
        for (a, b, len) in [
            (0x1234_5678u32, 0x9abc_def0u32, 1u64),
            (7, 9, 4096),
            (1, 2, 65_535),
        ] {
            assert_eq!(
                multiply(a, shift_by(len)) ^ b,
                crc32c::crc32c_combine(a, b, len as usize)
            );
        }
    }
}
