//! Timestamps of access logs (nginx `$time_local`, ISO 8601, `$msec`) as Unix nanoseconds.

/// Nanoseconds since the Unix epoch.
pub(crate) type UnixNanos = i64;

const NS: i64 = 1_000_000_000;
/// Years a replayed log may be stamped with; anything outside is an absurd timestamp.
pub(crate) const YEARS: std::ops::RangeInclusive<i64> = 1990..=2200;

use crate::calendar::days_from_civil;

fn digits(b: &[u8]) -> Option<i64> {
    if b.is_empty() || b.len() > 9 {
        return None;
    }
    let mut n = 0i64;
    for &c in b {
        if !c.is_ascii_digit() {
            return None;
        }
        n = n * 10 + i64::from(c - b'0');
    }
    Some(n)
}

fn month(b: &[u8]) -> Option<i64> {
    const NAMES: [&[u8; 3]; 12] = [
        b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov",
        b"Dec",
    ];
    NAMES.iter().position(|n| n[..] == *b).map(|i| i as i64 + 1)
}

fn assemble(y: i64, mo: i64, d: i64, h: i64, mi: i64, s: i64, frac: i64) -> Option<UnixNanos> {
    // A year either side: an offset moves the instant by less than five days, and
    // `within_years` holds the range on the instant itself, in UTC.
    let years = YEARS.start() - 1..=YEARS.end() + 1;
    if !years.contains(&y) || !(1..=12).contains(&mo) || !(1..=31).contains(&d) {
        return None;
    }
    if h > 23 || mi > 59 || s > 60 {
        return None;
    }
    let secs = days_from_civil(y, mo, d) * 86_400 + h * 3_600 + mi * 60 + s;
    Some(secs * NS + frac)
}

/// `t` when it falls in [`YEARS`] in UTC, whatever offset it was written with: one range for
/// every form, so an instant one form takes is never refused when written in another.
fn within_years(t: UnixNanos) -> Option<UnixNanos> {
    let first = days_from_civil(*YEARS.start(), 1, 1) * 86_400 * NS;
    let end = days_from_civil(*YEARS.end() + 1, 1, 1) * 86_400 * NS;
    (first..end).contains(&t).then_some(t)
}

/// Offset `+hhmm`, `-hhmm`, `+hh:mm` or `Z`, in seconds east of UTC.
fn offset(b: &[u8]) -> Option<i64> {
    match b {
        b"Z" | b"z" => Some(0),
        [sign @ (b'+' | b'-'), rest @ ..] => {
            let rest: Vec<u8> = rest.iter().copied().filter(|&c| c != b':').collect();
            if rest.len() != 4 {
                return None;
            }
            let secs = digits(&rest[..2])? * 3_600 + digits(&rest[2..])? * 60;
            Some(if *sign == b'-' { -secs } else { secs })
        }
        _ => None,
    }
}

/// Fractional seconds `.123` as nanoseconds, and what follows them.
fn fraction(b: &[u8]) -> Option<(i64, &[u8])> {
    let Some(rest) = b.strip_prefix(b".") else {
        return Some((0, b));
    };
    let n = rest.iter().take_while(|c| c.is_ascii_digit()).count();
    if n == 0 {
        return None;
    }
    let mut ns = 0i64;
    for i in 0..9 {
        ns = ns * 10
            + rest
                .get(i)
                .filter(|_| i < n)
                .map_or(0, |c| i64::from(c - b'0'));
    }
    Some((ns, &rest[n..]))
}

/// nginx `$time_local` / CLF: `10/Oct/2000:13:55:36 -0700`.
pub(crate) fn clf(b: &[u8]) -> Option<UnixNanos> {
    if b.len() < 20 || b[2] != b'/' || b[6] != b'/' || b[11] != b':' {
        return None;
    }
    let d = digits(&b[0..2])?;
    let mo = month(&b[3..6])?;
    let y = digits(&b[7..11])?;
    let h = digits(&b[12..14])?;
    let mi = digits(&b[15..17])?;
    let s = digits(&b[18..20])?;
    let (frac, rest) = fraction(&b[20..])?;
    let off = match rest {
        [] => 0,
        [b' ', tz @ ..] => offset(tz)?,
        _ => return None,
    };
    within_years(assemble(y, mo, d, h, mi, s, frac)? - off * NS)
}

/// ISO 8601 / RFC 3339: `2000-10-10T20:55:36Z`, `2000-10-10T13:55:36.250-07:00`.
pub(crate) fn iso8601(b: &[u8]) -> Option<UnixNanos> {
    if b.len() < 19 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    let y = digits(&b[0..4])?;
    let mo = digits(&b[5..7])?;
    let d = digits(&b[8..10])?;
    let h = digits(&b[11..13])?;
    let mi = digits(&b[14..16])?;
    let s = digits(&b[17..19])?;
    let (frac, rest) = fraction(&b[19..])?;
    let off = if rest.is_empty() { 0 } else { offset(rest)? };
    within_years(assemble(y, mo, d, h, mi, s, frac)? - off * NS)
}

/// nginx `$msec`: seconds since the epoch with a fraction, `971211336.123`.
pub(crate) fn epoch(b: &[u8]) -> Option<UnixNanos> {
    let n = b.iter().take_while(|c| c.is_ascii_digit()).count();
    // Ten digits today (since 2001); up to twelve read, the year check refuses the absurd.
    if n == 0 || n > 12 {
        return None;
    }
    let secs = b[..n]
        .iter()
        .fold(0i64, |acc, &c| acc * 10 + i64::from(c - b'0'));
    let (frac, rest) = fraction(&b[n..])?;
    if !rest.is_empty() {
        return None;
    }
    within_years(secs.checked_mul(NS)? + frac)
}

/// Whichever of the three forms `b` is written in.
pub(crate) fn any(b: &[u8]) -> Option<UnixNanos> {
    match b.get(2) {
        Some(b'/') => clf(b),
        _ if b.get(4) == Some(&b'-') => iso8601(b),
        _ => epoch(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_three_forms_agree() {
        let want = 971_211_336 * NS;
        assert_eq!(clf(b"10/Oct/2000:13:55:36 -0700"), Some(want));
        assert_eq!(iso8601(b"2000-10-10T20:55:36Z"), Some(want));
        assert_eq!(iso8601(b"2000-10-10T13:55:36-07:00"), Some(want));
        assert_eq!(epoch(b"971211336.000"), Some(want));
        assert_eq!(any(b"971211336.5"), Some(want + NS / 2));
        // Ten digits: every timestamp since 2001-09-09.
        assert_eq!(epoch(b"1795996801.250"), Some(1_795_996_801 * NS + NS / 4));
        assert_eq!(any(b"2000-10-10T20:55:36.25Z"), Some(want + NS / 4));
    }

    #[test]
    fn the_years_are_read_in_utc_whatever_the_form() {
        // Found by fuzz/fuzz_targets/nginx.rs (a line printed back in UTC no longer read): the
        // range held the local date, and `$msec` an average year, so one instant was taken in
        // one form and refused in another.
        assert_eq!(clf(b"01/Jan/1990:00:30:00 +0100"), None, "1989 in UTC");
        assert_eq!(iso8601(b"1989-12-31T23:30:00Z"), None);
        assert_eq!(iso8601(b"2200-12-31T23:30:00-01:00"), None, "2201 in UTC");
        assert_eq!(epoch(b"7289654500"), None, "2201-01-01T00:01:40Z");
        let last = 7_289_654_399 * NS;
        assert_eq!(epoch(b"7289654399"), Some(last));
        assert_eq!(clf(b"31/Dec/2200:23:59:59 +0000"), Some(last));
        assert_eq!(iso8601(b"2201-01-01T00:59:59+01:00"), Some(last));
        let first = 631_152_000 * NS;
        assert_eq!(epoch(b"631152000"), Some(first));
        assert_eq!(epoch(b"631151999.999"), None);
        assert_eq!(clf(b"31/Dec/1989:23:00:00 -0100"), Some(first));
    }

    #[test]
    fn absurd_and_broken_timestamps_are_refused() {
        assert_eq!(clf(b"10/Oct/9999:13:55:36 -0700"), None);
        assert_eq!(clf(b"10/Foo/2000:13:55:36 -0700"), None);
        assert_eq!(clf(b"10/Oct/2000:25:55:36 -0700"), None);
        assert_eq!(clf(b"10/Oct/2000"), None);
        assert_eq!(iso8601(b"9999-01-01T00:00:00Z"), None);
        assert_eq!(epoch(b"253402300800"), None);
        assert_eq!(epoch(b""), None);
        assert_eq!(any(b"\0\0\0"), None);
    }
}
