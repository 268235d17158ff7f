//! Parsing and printing of sizes ("8GiB") and CPU lists ("0-3,6").

use std::collections::BTreeSet;
use std::fmt;

/// Parses a byte size: a plain number of bytes, or a number with a unit
/// (`K`/`KiB`, `M`/`MiB`, `G`/`GiB`, `T`/`TiB`: binary; `KB`, `MB`, `GB`, `TB`: decimal).
pub fn parse_bytes(text: &str) -> Option<u64> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num.parse().ok()?;
    let mult: f64 = match unit.trim() {
        "" | "B" => 1.0,
        "K" | "KiB" => 1024.0,
        "M" | "MiB" => 1024.0 * 1024.0,
        "G" | "GiB" => 1024.0 * 1024.0 * 1024.0,
        "T" | "TiB" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        "KB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "TB" => 1e12,
        _ => return None,
    };
    let bytes = value * mult;
    (bytes.is_finite() && bytes >= 0.0 && bytes < u64::MAX as f64).then_some(bytes as u64)
}

/// Bytes in binary units with one decimal ("7.5GiB").
pub fn format_bytes(n: u64) -> String {
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

/// A set of CPU numbers, written as the kernel writes them ("0-3,6").
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct CpuList(pub BTreeSet<u32>);

impl CpuList {
    pub fn parse(text: &str) -> Option<Self> {
        let mut set = BTreeSet::new();
        for part in text
            .trim()
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
        {
            match part.split_once('-') {
                Some((a, b)) => {
                    let (a, b): (u32, u32) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
                    if a > b || b - a > 65_536 {
                        return None;
                    }
                    set.extend(a..=b);
                }
                None => {
                    set.insert(part.parse().ok()?);
                }
            }
        }
        Some(CpuList(set))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Display for CpuList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut iter = self.0.iter().copied().peekable();
        while let Some(start) = iter.next() {
            let mut end = start;
            while iter.peek() == Some(&(end + 1)) {
                end += 1;
                iter.next();
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if start == end {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{end}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_in_binary_and_decimal_units() {
        assert_eq!(parse_bytes("8GiB"), Some(8 << 30));
        assert_eq!(parse_bytes("1.5 GiB"), Some(3 << 29));
        assert_eq!(parse_bytes("512M"), Some(512 << 20));
        assert_eq!(parse_bytes("2GB"), Some(2_000_000_000));
        assert_eq!(parse_bytes("4096"), Some(4096));
        for bad in ["", "GiB", "8 parsecs", "-1G", "1e400"] {
            assert_eq!(parse_bytes(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn cpu_lists_round_trip_in_kernel_form() {
        let l = CpuList::parse("0-3, 6,8-9").expect("parse");
        assert_eq!(l.len(), 7);
        assert_eq!(l.to_string(), "0-3,6,8-9");
        assert_eq!(CpuList::parse("5").expect("parse").to_string(), "5");
        for bad in ["3-1", "a", "1-", "0-99999999"] {
            assert!(CpuList::parse(bad).is_none(), "{bad:?}");
        }
    }
}
