//! Durations as the config file and the command line write them.

use std::time::Duration;

/// Parses "500ms", "600s", "10m", "1h", "14d" or a plain number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{text:?} is not a duration"))?;
    let secs = |mult: u64| {
        n.checked_mul(mult)
            .map(Duration::from_secs)
            .ok_or_else(|| format!("{text:?} is too long"))
    };
    match unit.trim() {
        "ms" => Ok(Duration::from_millis(n)),
        "" | "s" => secs(1),
        "m" | "min" => secs(60),
        "h" => secs(3600),
        "d" => secs(86_400),
        _ => Err(format!("{text:?}: unknown unit (use ms, s, m, h, d)")),
    }
}

/// A duration the way [`parse_duration`] reads it, in its largest whole unit ("10m").
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if !ms.is_multiple_of(1000) {
        return format!("{ms}ms");
    }
    let s = d.as_secs();
    for (unit, size) in [("d", 86_400), ("h", 3600), ("m", 60)] {
        if s >= size && s.is_multiple_of(size) {
            return format!("{}{unit}", s / size);
        }
    }
    format!("{s}s")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_or_without_a_unit() {
        assert_eq!(parse_duration("600s"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("14d"), Ok(Duration::from_secs(14 * 86_400)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
        assert!(parse_duration("ten").is_err());
        assert!(parse_duration("5 days").is_err());
        assert!(parse_duration("99999999999999999999d").is_err());
    }

    #[test]
    fn durations_print_in_their_largest_whole_unit() {
        for text in ["10m", "14d", "90s", "250ms", "2h", "0s"] {
            let d = parse_duration(text).expect("parses");
            assert_eq!(format_duration(d), text);
        }
    }
}
