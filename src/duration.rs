//! Durations as the configuration, the overrides and their interface write them: `"15m"`, `"90s"`.

use std::time::Duration;

/// `"500ms"`, `"30s"`, `"15m"`, `"1h"`, `"1d"`, or a bare number of seconds.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let bad = || {
        format!("`{s}` is not a duration; use a whole number with a unit: ms, s, m, h or d (e.g. \"15m\")")
    };
    let n: u64 = num.parse().map_err(|_| bad())?;
    let secs = |mult: u64| n.checked_mul(mult).map(Duration::from_secs).ok_or_else(bad);
    match unit.trim() {
        "ms" => Ok(Duration::from_millis(n)),
        "" | "s" => secs(1),
        "m" => secs(60),
        "h" => secs(3600),
        "d" => secs(86_400),
        _ => Err(bad()),
    }
}

/// A duration as [`parse_duration`] reads it, in the largest unit that writes it whole
/// (`"15m"`, `"90s"`, `"1d"`, `"250ms"`).
pub(crate) fn format_duration(d: Duration) -> String {
    if d.subsec_nanos() != 0 || d.is_zero() {
        return format!("{}ms", d.as_millis());
    }
    let s = d.as_secs();
    for (unit, n) in [("d", 86_400), ("h", 3600), ("m", 60)] {
        if s.is_multiple_of(n) {
            return format!("{}{unit}", s / n);
        }
    }
    format!("{s}s")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(parse_duration("15m"), Ok(Duration::from_secs(900)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("2d"), Ok(Duration::from_secs(172_800)));
        assert_eq!(parse_duration("42"), Ok(Duration::from_secs(42)));
        assert!(parse_duration("5 parsecs").is_err());
        assert!(parse_duration("m").is_err());
        assert!(parse_duration("-1m").is_err());
        assert!(parse_duration("99999999999999999999d").is_err());
    }

    #[test]
    fn formatted_durations_read_back() {
        for (d, text) in [
            (900, "15m"),
            (90, "90s"),
            (86_400, "1d"),
            (7200, "2h"),
            (1, "1s"),
        ] {
            assert_eq!(format_duration(Duration::from_secs(d)), text);
            assert_eq!(parse_duration(text), Ok(Duration::from_secs(d)));
        }
        assert_eq!(format_duration(Duration::from_millis(250)), "250ms");
    }
}
