//! What the fuzz targets share: printing timestamps back in the forms the access-log parsers
//! read, and splitting a fuzz input into text lines.

/// Nanoseconds per second.
const NS: i64 = 1_000_000_000;

const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

/// The proleptic Gregorian date of a day number (days since 1970-01-01; Howard Hinnant's
/// `civil_from_days`), independent of the parser's own `days_from_civil`.
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

struct Parts {
    y: i64,
    mo: i64,
    d: i64,
    h: i64,
    mi: i64,
    s: i64,
    frac: i64,
}

fn parts(nanos: i64) -> Parts {
    let secs = nanos.div_euclid(NS);
    let frac = nanos.rem_euclid(NS);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, mo, d) = civil_from_days(days);
    Parts {
        y,
        mo,
        d,
        h: rem / 3_600,
        mi: rem / 60 % 60,
        s: rem % 60,
        frac,
    }
}

fn fraction(frac: i64) -> String {
    if frac == 0 {
        String::new()
    } else {
        format!(".{frac:09}")
    }
}

/// nginx `$time_local` in UTC: `10/Oct/2000:20:55:36 +0000` (with `.nnnnnnnnn` when the
/// instant has a fraction of a second).
pub fn clf(nanos: i64) -> String {
    let p = parts(nanos);
    format!(
        "{:02}/{}/{:04}:{:02}:{:02}:{:02}{} +0000",
        p.d,
        MONTHS[(p.mo - 1) as usize],
        p.y,
        p.h,
        p.mi,
        p.s,
        fraction(p.frac)
    )
}

/// ISO 8601 in UTC: `2000-10-10T20:55:36Z` (with a fraction when there is one).
pub fn iso8601(nanos: i64) -> String {
    let p = parts(nanos);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}{}Z",
        p.y,
        p.mo,
        p.d,
        p.h,
        p.mi,
        p.s,
        fraction(p.frac)
    )
}

/// nginx `$msec`: `971211336.000000000`.
pub fn msec(nanos: i64) -> String {
    format!("{}.{:09}", nanos.div_euclid(NS), nanos.rem_euclid(NS))
}

/// The first line of `data` and the rest (after its `\n`); the whole of `data` and nothing when
/// it has no newline.
pub fn first_line(data: &[u8]) -> (&[u8], &[u8]) {
    match data.iter().position(|&b| b == b'\n') {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[]),
    }
}

/// A 64-bit FNV-1a hash: a marker no input can spell except by chance.
pub fn fnv(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}
