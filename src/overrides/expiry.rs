//! An override's expiry written as a time from now (`"30m"`, `"2h"`, `"7d"`), as the
//! `override add` command and the admin interface take it: the instant it names on the
//! instance's own clock. A configuration file writes RFC 3339 instants only: a time from now
//! would move at every reload.

use std::time::Duration;

/// The longest time from now an expiry may name.
pub(crate) const MAX_RELATIVE: Duration = Duration::from_secs(366 * 86_400);

/// Whether `s` is written as a time from now rather than an instant: digits, then a unit.
pub(crate) fn is_relative(s: &str) -> bool {
    let t = s.trim();
    t.starts_with(|c: char| c.is_ascii_digit())
        && !t.contains(['-', ':', 'T', 't'])
        && t.len() <= 24
}

/// The instant, in seconds since the epoch, that `s` (a time from now) names from `now`.
pub(crate) fn resolve(s: &str, now: u64) -> Result<u64, String> {
    let t = s.trim();
    if t.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "`{t}` has no unit; write a time from now with one (\"30m\", \"2h\", \"7d\") or an RFC 3339 instant (\"2026-12-01T18:00:00Z\")"
        ));
    }
    let d = crate::duration::parse_duration(t).map_err(|_| {
        format!(
            "`{t}` is neither a time from now (\"30m\", \"2h\", \"7d\": a whole number and s, m, h or d) nor an RFC 3339 instant (\"2026-12-01T18:00:00Z\")"
        )
    })?;
    if d < Duration::from_secs(1) {
        return Err(format!(
            "`{t}` ends the override as it starts; give at least 1s, or leave expires out for no end"
        ));
    }
    if d > MAX_RELATIVE {
        return Err(format!(
            "`{t}` is further than 366d from now; give a shorter time, an RFC 3339 instant, or leave expires out for no end"
        ));
    }
    Ok(now.saturating_add(d.as_secs()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_from_now_name_the_instant_on_the_given_clock() {
        for (s, secs) in [
            ("30m", 1800),
            ("2h", 7200),
            ("7d", 604_800),
            ("90s", 90),
            (" 1h ", 3600),
        ] {
            assert!(is_relative(s), "{s}");
            assert_eq!(resolve(s, 1_000), Ok(1_000 + secs), "{s}");
        }
    }

    #[test]
    fn instants_are_not_times_from_now() {
        for s in [
            "2026-12-01T18:00:00Z",
            "2026-12-01 18:00:00+01:00",
            "tomorrow",
            "",
            "-2h",
        ] {
            assert!(!is_relative(s), "{s}");
        }
    }

    #[test]
    fn hostile_times_from_now_are_refused_with_the_spelling_to_use() {
        for (s, says) in [
            ("2026", "has no unit"),
            ("0s", "at least 1s"),
            ("500ms", "at least 1s"),
            ("367d", "further than 366d"),
            ("99999999999999999999d", "neither a time from now"),
            ("2 weeks", "neither a time from now"),
            ("2w", "neither a time from now"),
            ("1h30m", "neither a time from now"),
        ] {
            let e = resolve(s, 1_000).expect_err(s);
            assert!(e.contains(says), "{s}: {e}");
        }
        assert_eq!(resolve("366d", u64::MAX), Ok(u64::MAX));
    }
}
