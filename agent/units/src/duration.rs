//! Durations: "500ms", "30s", "10m", "2h", "14d", or plain seconds.

use std::time::Duration;

use crate::UnitsError;

/// Reads a duration: a whole number, optionally followed by a unit (spaces around and
/// between are ignored):
///
/// - `ms`: milliseconds;
/// - `s`, or no unit: seconds;
/// - `m` or `min`: minutes; `h`: hours; `d`: days.
///
/// Units are case-sensitive, and one unit only ("1h30m" and "1.5h" do not read: write "90m").
pub fn parse_duration(text: &str) -> Result<Duration, UnitsError> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let not = || UnitsError::NotADuration {
        text: text.to_owned(),
    };
    if number.is_empty() {
        return Err(not());
    }
    let seconds_in: u64 = match unit.trim_start() {
        "ms" => 0,
        "" | "s" => 1,
        "m" | "min" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(not()),
    };
    let too_long = || UnitsError::DurationTooLong {
        text: text.to_owned(),
    };
    // All digits: the only failure left is overflow.
    let n: u64 = number.parse().map_err(|_| too_long())?;
    if seconds_in == 0 {
        return Ok(Duration::from_millis(n));
    }
    n.checked_mul(seconds_in)
        .map(Duration::from_secs)
        .ok_or_else(too_long)
}

/// A duration the way [`parse_duration`] reads it, in its largest whole unit ("10m");
/// sub-millisecond parts are dropped.
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
    fn durations_read_with_each_unit_or_as_plain_seconds() {
        for (text, want) in [
            ("250ms", Duration::from_millis(250)),
            ("600s", Duration::from_secs(600)),
            ("30", Duration::from_secs(30)),
            ("10m", Duration::from_secs(600)),
            ("10min", Duration::from_secs(600)),
            ("2h", Duration::from_secs(7200)),
            ("14d", Duration::from_secs(14 * 86_400)),
            (" 10 m ", Duration::from_secs(600)),
            ("0s", Duration::ZERO),
        ] {
            assert_eq!(parse_duration(text), Ok(want), "{text:?}");
        }
    }

    #[test]
    fn durations_refuse_other_spellings_naming_the_text() {
        for bad in [
            "", "ten", "5 days", "1h30m", "1.5h", "-1s", "10M", "10S", "s", "off", "1e3s",
        ] {
            let e = parse_duration(bad).expect_err(bad);
            assert_eq!(
                e,
                UnitsError::NotADuration {
                    text: bad.to_owned()
                }
            );
            let message = e.to_string();
            assert!(message.contains(&format!("{bad:?}")), "{message}");
            assert!(message.contains("ms, s, m (or min), h, d"), "{message}");
        }
    }

    #[test]
    fn durations_too_long_are_refused_not_wrapped() {
        for long in [
            "99999999999999999999d",
            "99999999999999999999",
            "307445734561825861m",
        ] {
            assert!(
                matches!(
                    parse_duration(long),
                    Err(UnitsError::DurationTooLong { .. })
                ),
                "{long:?}"
            );
        }
    }

    #[test]
    fn durations_print_in_their_largest_whole_unit_and_read_back() {
        for text in ["10m", "14d", "90s", "250ms", "2h", "0s", "1500ms"] {
            let d = parse_duration(text).expect("parses");
            assert_eq!(format_duration(d), text);
        }
    }
}
