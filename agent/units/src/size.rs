//! Sizes: "4096", "256MiB", "1.5GiB", "2GB".

use crate::UnitsError;

/// Reads a size in bytes: a number, whole ("512") or decimal ("1.5"), optionally followed by
/// a unit (spaces around and between are ignored):
///
/// - `KiB`, `MiB`, `GiB`, `TiB`, `PiB`, or the same as `K`, `M`, `G`, `T`, `P`: powers of 1024;
/// - `KB`, `MB`, `GB`, `TB`, `PB`: powers of 1000;
/// - `B`, or no unit: bytes.
///
/// Units are case-sensitive ("1gb" does not read). A decimal is rounded down to a whole byte.
pub fn parse_size(text: &str) -> Result<u64, UnitsError> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let not = || UnitsError::NotASize {
        text: text.to_owned(),
    };
    let unit = unit_bytes(unit.trim_start()).ok_or_else(not)?;
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
        return Err(not());
    }
    let too_large = || UnitsError::SizeTooLarge {
        text: text.to_owned(),
    };
    // `whole` is all digits here: the only failure left is overflow.
    let whole: u128 = match whole {
        "" => 0,
        digits => digits.parse().map_err(|_| too_large())?,
    };
    // Twenty digits of a fraction are more than a byte's worth at any unit; the rest would
    // only overflow the arithmetic.
    let fraction = &fraction[..fraction.len().min(20)];
    let fraction_bytes = match fraction {
        "" => 0,
        digits => {
            let numerator: u128 = digits.parse().map_err(|_| not())?;
            numerator * unit / 10u128.pow(digits.len() as u32)
        }
    };
    whole
        .checked_mul(unit)
        .and_then(|b| b.checked_add(fraction_bytes))
        .and_then(|b| u64::try_from(b).ok())
        .ok_or_else(too_large)
}

/// Bytes in one of `unit`, the text after the number.
fn unit_bytes(unit: &str) -> Option<u128> {
    Some(match unit {
        "" | "B" => 1,
        "K" | "KiB" => 1 << 10,
        "M" | "MiB" => 1 << 20,
        "G" | "GiB" => 1 << 30,
        "T" | "TiB" => 1 << 40,
        "P" | "PiB" => 1 << 50,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        "PB" => 1_000_000_000_000_000,
        _ => return None,
    })
}

/// A size in binary units with one decimal ("7.5GiB", "512B"), for people; [`parse_size`]
/// reads it back to within the decimal shown.
pub fn format_size(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n}B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1}{}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_in_binary_and_decimal_units() {
        for (text, want) in [
            ("4096", 4096),
            ("0", 0),
            ("512B", 512),
            ("8GiB", 8 << 30),
            ("8G", 8 << 30),
            ("512M", 512 << 20),
            ("64K", 64 << 10),
            ("2TiB", 2 << 40),
            ("1PiB", 1 << 50),
            ("2GB", 2_000_000_000),
            ("5KB", 5_000),
            ("3MB", 3_000_000),
            ("1TB", 1_000_000_000_000),
            (" 256 MiB ", 256 << 20),
        ] {
            assert_eq!(parse_size(text), Ok(want), "{text:?}");
        }
    }

    /// The CLI's parser used to refuse decimals and the KB family that configs took: both
    /// read everywhere now, to the same bytes.
    #[test]
    fn sizes_the_cli_once_refused_read_as_the_config_read_them() {
        for (text, want) in [
            ("1.5GiB", 3 << 29),
            ("1.5 GiB", 3 << 29),
            ("0.5M", 1 << 19),
            (".5K", 512),
            ("8.", 8),
            ("2GB", 2_000_000_000),
            ("1.25MB", 1_250_000),
        ] {
            assert_eq!(parse_size(text), Ok(want), "{text:?}");
        }
    }

    #[test]
    fn decimal_sizes_round_down_to_a_whole_byte() {
        assert_eq!(parse_size("1.5"), Ok(1));
        assert_eq!(parse_size("1.3KiB"), Ok(1331));
        assert_eq!(parse_size("0.1B"), Ok(0));
        // Exact where floating point would not be.
        assert_eq!(
            parse_size("8191.999999999999999999PiB"),
            Ok((8192 << 50) - 1)
        );
    }

    #[test]
    fn sizes_refuse_other_spellings_naming_the_text() {
        for bad in [
            "",
            "GiB",
            "8 parsecs",
            "-1G",
            "+1G",
            "1e400",
            "1.2.3G",
            ".",
            "1gb",
            "1kib",
            "1 G B",
            "1GiBs",
            "1_000",
            "90%",
            "ten MiB",
        ] {
            let e = parse_size(bad).expect_err(bad);
            assert_eq!(
                e,
                UnitsError::NotASize {
                    text: bad.to_owned()
                }
            );
            let message = e.to_string();
            assert!(message.contains(&format!("{bad:?}")), "{message}");
            assert!(message.contains("KiB, MiB, GiB"), "{message}");
        }
    }

    #[test]
    fn sizes_past_u64_are_refused_not_wrapped() {
        for big in [
            "16777216TiB",
            "18446744073709551616",
            "99999999999999999999999999999999999999999",
            "16384PiB",
        ] {
            assert_eq!(
                parse_size(big),
                Err(UnitsError::SizeTooLarge {
                    text: big.to_owned()
                }),
                "{big:?}"
            );
        }
        assert_eq!(parse_size("18446744073709551615"), Ok(u64::MAX));
    }

    #[test]
    fn printed_sizes_read_back() {
        for n in [0, 1000, 1 << 20, 3 << 29, 7 << 40, 5 << 50] {
            let text = format_size(n);
            let back = parse_size(&text).expect("reads back");
            assert!(back.abs_diff(n) <= n / 20, "{n} → {text} → {back}");
        }
        assert_eq!(format_size(3 << 29), "1.5GiB");
        assert_eq!(format_size(512), "512B");
    }
}
