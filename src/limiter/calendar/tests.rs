use super::*;

const S: Nanos = 1_000_000_000;

/// ns since the epoch of a UTC date and time.
fn utc(y: i64, m: i64, d: i64, h: u64, min: u64, s: u64) -> Nanos {
    let days = crate::calendar::days_from_civil(y, m, d) as u64;
    (days * 86_400 + h * 3600 + min * 60 + s) * S
}

#[test]
fn a_utc_day_ends_at_the_next_midnight() {
    let c = Calendar::utc(CalendarUnit::Day);
    let now = utc(2026, 12, 4, 13, 37, 5);
    assert_eq!(c.next_boundary(now), utc(2026, 12, 5, 0, 0, 0));
    assert_eq!(c.period(now).0, utc(2026, 12, 4, 0, 0, 0));
    // The boundary itself opens the next day.
    let midnight = utc(2026, 12, 5, 0, 0, 0);
    assert_eq!(c.next_boundary(midnight), utc(2026, 12, 6, 0, 0, 0));
    assert_eq!(c.next_boundary(midnight - 1), midnight);
}

#[test]
fn months_have_their_own_lengths_and_february_its_leap_years() {
    let c = Calendar::utc(CalendarUnit::Month);
    for (y, m, days) in [
        (2026, 1, 31),
        (2026, 2, 28),
        (2024, 2, 29),
        (2000, 2, 29),
        (2100, 2, 28),
        (2026, 4, 30),
        (2026, 12, 31),
    ] {
        let (start, end) = c.period(utc(y, m, 15, 12, 0, 0));
        assert_eq!(start, utc(y, m, 1, 0, 0, 0), "{y}-{m}");
        assert_eq!((end - start) / (86_400 * S), days, "{y}-{m}");
    }
    // December rolls into January of the next year.
    assert_eq!(
        c.next_boundary(utc(2026, 12, 31, 23, 59, 59)),
        utc(2027, 1, 1, 0, 0, 0)
    );
}

#[test]
fn an_iso_week_runs_monday_to_monday() {
    let c = Calendar::utc(CalendarUnit::Week);
    // 2026-12-04 is a Friday; its week began on Monday 2026-11-30.
    let (start, end) = c.period(utc(2026, 12, 4, 10, 0, 0));
    assert_eq!(start, utc(2026, 11, 30, 0, 0, 0));
    assert_eq!(end, utc(2026, 12, 7, 0, 0, 0));
    // A Sunday night is still the same week; Monday's midnight is the next.
    assert_eq!(c.next_boundary(utc(2026, 12, 6, 23, 59, 59)), end);
    assert_eq!(c.period(end).0, end);
    // Across a year's end (2026-12-31 is a Thursday).
    assert_eq!(
        c.next_boundary(utc(2026, 12, 31, 0, 0, 0)),
        utc(2027, 1, 4, 0, 0, 0)
    );
}

#[test]
fn a_day_in_a_time_zone_is_23_or_25_hours_across_a_clock_change() {
    let berlin = Zone::named("Europe/Berlin").unwrap();
    let c = Calendar::new(CalendarUnit::Day, berlin);
    // 2026-03-29: clocks go from 02:00 CET to 03:00 CEST; the day is 23 hours.
    let (start, end) = c.period(utc(2026, 3, 29, 12, 0, 0));
    assert_eq!(
        start,
        utc(2026, 3, 28, 23, 0, 0),
        "midnight CET is 23:00 UTC"
    );
    assert_eq!(
        end,
        utc(2026, 3, 29, 22, 0, 0),
        "midnight CEST is 22:00 UTC"
    );
    assert_eq!((end - start) / (3600 * S), 23);
    // 2026-10-25: back from CEST to CET; the day is 25 hours.
    let (start, end) = c.period(utc(2026, 10, 25, 12, 0, 0));
    assert_eq!((end - start) / (3600 * S), 25);
    assert_eq!(end, utc(2026, 10, 25, 23, 0, 0));
    // A month in the zone starts at its local midnight.
    let m = Calendar::new(CalendarUnit::Month, berlin);
    assert_eq!(
        m.next_boundary(utc(2026, 12, 31, 22, 59, 59)),
        utc(2026, 12, 31, 23, 0, 0),
        "Berlin's new year is at 23:00 UTC"
    );
}

#[test]
fn a_boundary_in_a_gap_is_the_first_instant_after_it() {
    // America/Havana moves its clocks at midnight: 2026-03-08 00:00 does not exist there.
    let havana = Zone::named("America/Havana").unwrap();
    let c = Calendar::new(CalendarUnit::Day, havana);
    let (start, end) = c.period(utc(2026, 3, 8, 12, 0, 0));
    assert!(end > start);
    assert_eq!(
        (end - start) / (3600 * S),
        23,
        "the day lost its first hour"
    );
}

#[test]
fn zones_are_named_by_the_database_and_kept_once() {
    let a = Zone::named("Europe/Berlin").unwrap();
    let b = Zone::named("Europe/Berlin").unwrap();
    assert!(std::ptr::eq(a, b));
    assert!(std::ptr::eq(Zone::named("utc").unwrap(), Zone::utc()));
    for bad in [
        "",
        "Mars/Olympus",
        "Europe/Berlin/../../etc/passwd",
        &"A".repeat(200),
    ] {
        let e = Zone::named(bad).unwrap_err();
        assert!(e.contains("time zone"), "{bad}: {e}");
    }
}

#[test]
fn units_are_read_as_written() {
    assert_eq!(CalendarUnit::parse("Month"), Some(CalendarUnit::Month));
    assert_eq!(CalendarUnit::parse(" day "), Some(CalendarUnit::Day));
    assert_eq!(CalendarUnit::parse("1d"), None);
    assert_eq!(
        Calendar::new(CalendarUnit::Week, Zone::named("Asia/Tokyo").unwrap()).describe(),
        "calendar week (Asia/Tokyo)"
    );
}
