//! Calendar arithmetic on the proleptic Gregorian calendar, in UTC, as pure functions of day
//! counts since 1970-01-01 (Howard Hinnant's algorithms): what an override's RFC 3339 expiry,
//! an access log's timestamps and an emitted log's dates are read and written with.

/// Days from 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's algorithm).
pub(crate) fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's algorithm).
pub(crate) fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn day_counts_and_dates_are_inverse_across_leap_years_and_centuries() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(
            days_from_civil(2024, 2, 29) + 1,
            days_from_civil(2024, 3, 1)
        );
        assert_eq!(
            days_from_civil(2100, 2, 28) + 1,
            days_from_civil(2100, 3, 1),
            "2100 is no leap year"
        );
        assert_eq!(days_from_civil(1969, 12, 31), -1);
        for z in (-800_000..800_000).step_by(997) {
            let (y, m, d) = civil_from_days(z);
            assert!(
                (1..=12).contains(&m) && (1..=31).contains(&d),
                "{z}: {y}-{m}-{d}"
            );
            assert_eq!(days_from_civil(y, m, d), z);
        }
    }
}
