//! Rates in bytes per second: `240`, `"240"`, `"240B/s"`, `"1KiB"`, `"2 MB/s"`; `0` or
//! `"off"` for none.

use super::{ConfigError, Ctx};
use serde::Deserialize;

/// A rate as written in TOML: a whole number of bytes per second, or text with a unit.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub(super) enum RateValue {
    BytesPerSecond(i64),
    Text(String),
    /// Anything else (a float, a table): refused with the formats that work.
    Other(toml::Value),
}

/// Bytes per second from `"240"`, `"240B/s"`, `"1KiB"`, `"1 KiB/s"`, `"2MB"`, `"off"`, with the
/// units B, KB (1000), KiB (1024), MB (1000²) and MiB (1024²), case-insensitive; `0` and `off`
/// are 0.
pub(crate) fn parse_rate(s: &str) -> Result<u64, String> {
    let bad = || {
        format!("`{s}` is not a rate; use bytes per second as a whole number with an optional unit B, KB, KiB, MB or MiB (e.g. \"240\" or \"1KiB\"), or 0 to turn the rule off")
    };
    let t = s.trim();
    if t.eq_ignore_ascii_case("off") {
        return Ok(0);
    }
    let t = t.strip_suffix("/s").unwrap_or(t).trim_end();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| bad())?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" => 1000,
        "kib" => 1024,
        "mb" => 1_000_000,
        "mib" => 1024 * 1024,
        _ => return Err(bad()),
    };
    n.checked_mul(mult).ok_or_else(bad)
}

/// The rate at `path`, or `default` when it is not set.
pub(super) fn rate(
    ctx: &Ctx,
    path: &str,
    v: Option<RateValue>,
    default: &str,
) -> Result<u64, ConfigError> {
    match v {
        None => parse_rate(default).map_err(|e| ctx.err(path, e)),
        Some(RateValue::BytesPerSecond(n)) => u64::try_from(n).map_err(|_| {
            ctx.err(
                path,
                format!(
                    "{n} is negative; use bytes per second (e.g. 240), or 0 to turn the rule off"
                ),
            )
        }),
        Some(RateValue::Text(t)) => parse_rate(&t).map_err(|e| ctx.err(path, e)),
        Some(RateValue::Other(v)) => {
            Err(ctx.err(path, parse_rate(&v.to_string()).err().unwrap_or_default()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(parse_rate("240"), Ok(240));
        assert_eq!(parse_rate(" 240B/s "), Ok(240));
        assert_eq!(parse_rate("1KiB"), Ok(1024));
        assert_eq!(parse_rate("1 KiB/s"), Ok(1024));
        assert_eq!(parse_rate("1kib"), Ok(1024));
        assert_eq!(parse_rate("2KB"), Ok(2000));
        assert_eq!(parse_rate("3MB/s"), Ok(3_000_000));
        assert_eq!(parse_rate("1MiB"), Ok(1_048_576));
        assert_eq!(parse_rate("0"), Ok(0));
        assert_eq!(parse_rate("off"), Ok(0));
        assert_eq!(parse_rate("OFF"), Ok(0));
    }

    #[test]
    fn what_is_not_a_rate() {
        for bad in [
            "",
            "fast",
            "-1",
            "1.5KiB",
            "KiB",
            "240 bits",
            "1GiB",
            "240/m",
            "99999999999999MiB",
        ] {
            let e = parse_rate(bad).expect_err(bad);
            assert!(e.contains("is not a rate"), "{e}");
            assert!(e.contains("0 to turn the rule off"), "{e}");
        }
    }
}
