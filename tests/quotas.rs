//! Calendar quotas: `docs/examples/quotas.toml` in front of a real upstream, on the memory store
//! and on a real Redis; and the calendar's arithmetic through both stores on a fixed clock (a
//! leap February, a month's end, a day in a time zone that changes its clocks).

mod common;
mod redis_support;

use common::{Gateway, Launch};
use fleet_limiter::{nonzero, BucketKey, Calendar, CalendarUnit, Check, Quota, Store, Zone};
use fleet_limiter::{ManualClock, MemoryStore, RedisOptions, RedisStore, RedisTarget};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const EXAMPLE: &str = include_str!("../docs/examples/quotas.toml");

fn secs_to_utc_midnight() -> u64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    86_400 - now % 86_400
}

/// Far enough from midnight UTC that the day cannot turn during the test.
async fn away_from_midnight() {
    let left = secs_to_utc_midnight();
    if left < 60 {
        tokio::time::sleep(Duration::from_secs(left + 2)).await;
    }
}

async fn report(gw: &Gateway, key: &str) -> reqwest::Response {
    common::client()
        .get(gw.url("/api/reports/weekly"))
        .header("x-api-key", key)
        .send()
        .await
        .expect("request")
}

/// A key's three reports of the day pass, the fourth is refused until the next UTC midnight
/// (`Retry-After` and `RateLimit` to the second), and another key is served meanwhile.
async fn fourth_report_waits_for_midnight(gw: &Gateway) {
    away_from_midnight().await;
    let key = format!("pa_{:016x}", rand::random::<u64>());
    for i in 0..3 {
        let r = report(gw, &key).await;
        assert_eq!(r.status(), 200, "report {i} of the day");
        let policy = r.headers()["ratelimit-policy"].to_str().unwrap().to_owned();
        assert!(policy.contains("3;w=86400"), "{policy}");
    }
    let r = report(gw, &key).await;
    assert_eq!(r.status(), 429, "the fourth report of the day");
    let expected = secs_to_utc_midnight();
    let retry: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        retry.abs_diff(expected) <= 2,
        "Retry-After {retry} s runs to the next UTC midnight ({expected} s away)"
    );
    let h = r.headers();
    let reset: u64 = match h.get("ratelimit-reset") {
        Some(v) => v.to_str().unwrap().parse().unwrap(),
        None => {
            let v = h["ratelimit"].to_str().unwrap();
            let t = v.split(';').find_map(|p| p.trim().strip_prefix("t="));
            t.unwrap_or_else(|| panic!("{v}")).parse().unwrap()
        }
    };
    assert_eq!(reset, retry, "RateLimit says the same: {h:?}");
    let other = format!("pa_{:016x}", rand::random::<u64>());
    let r = report(gw, &other).await;
    assert_eq!(r.status(), 200, "another key is served");
    let h = r.headers();
    let remaining = h.get("ratelimit-remaining").map_or_else(
        || h["ratelimit"].to_str().unwrap().contains("r=2"),
        |v| v == "2",
    );
    assert!(remaining, "two reports left today: {h:?}");
}

#[tokio::test]
async fn a_keys_fourth_report_of_the_day_waits_for_utc_midnight_on_the_memory_store() {
    let upstream = common::upstream().await;
    let gw = Launch::serve()
        .config_toml(EXAMPLE)
        .upstream(&upstream.uri())
        .spawn();
    fourth_report_waits_for_midnight(&gw).await;
}

#[tokio::test]
async fn a_keys_fourth_report_of_the_day_waits_for_utc_midnight_on_redis() {
    let Some(redis) = redis_support::standalone() else {
        return;
    };
    let upstream = common::upstream().await;
    let url = redis.url();
    let gw = Launch::serve()
        .config_toml(EXAMPLE)
        .upstream(&upstream.uri())
        .args(["--store", url.as_str()])
        .spawn();
    fourth_report_waits_for_midnight(&gw).await;
}

#[tokio::test]
async fn a_client_choosing_a_fresh_key_per_request_meets_the_address_ceiling() {
    let upstream = common::upstream().await;
    let gw = Launch::serve()
        .config_toml(EXAMPLE)
        .upstream(&upstream.uri())
        .spawn();
    let mut codes = Vec::new();
    for i in 0..65 {
        codes.push(
            report(&gw, &format!("pa_fresh_{i}"))
                .await
                .status()
                .as_u16(),
        );
    }
    assert!(codes[..60].iter().all(|c| *c == 200), "{codes:?}");
    assert!(codes[60..].iter().all(|c| *c == 429), "{codes:?}");
}

#[test]
fn a_time_zone_the_database_lacks_is_refused_at_start_naming_the_field() {
    let toml = EXAMPLE.replace(
        "window = \"day\"",
        "window = \"day\"\ntime_zone = \"Mars/Olympus_Mons\"",
    );
    let out = Launch::command(["check"])
        .config_toml(toml)
        .run(Duration::from_secs(60));
    assert_ne!(out.code, Some(0));
    assert!(
        out.stderr
            .contains("limiters.reports-day.time_zone: `Mars/Olympus_Mons` is not a time zone"),
        "{}",
        out.stderr
    );
    let toml = EXAMPLE.replace("window = \"day\"", "window = \"day\"\nalgorithm = \"gcra\"");
    let out = Launch::command(["check"])
        .config_toml(toml)
        .run(Duration::from_secs(60));
    assert!(
        out.stderr.contains("limiters.reports-day.algorithm"),
        "{}",
        out.stderr
    );
    let toml = EXAMPLE.replace("window = \"1h\"", "window = \"1h\"\ntime_zone = \"UTC\"");
    let out = Launch::command(["check"])
        .config_toml(toml)
        .run(Duration::from_secs(60));
    assert!(
        out.stderr
            .contains("limiters.reports-ip.time_zone: applies only to a calendar window"),
        "{}",
        out.stderr
    );
}

const S: u64 = 1_000_000_000;

fn utc(y: i32, m: u32, d: u32, h: u64) -> u64 {
    // Days since the epoch by the same civil arithmetic the tests of the library check.
    let (y, m) = if m <= 2 { (y - 1, m + 9) } else { (y, m - 3) };
    let era = y.div_euclid(400);
    let yoe = (y - era * 400) as u64;
    let doy = (153 * u64::from(m) + 2) / 5 + u64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = (era as i64 * 146_097 + doe as i64 - 719_468) as u64;
    (days * 86_400 + h * 3600) * S
}

fn check(principal: &str, quota: Quota) -> Check {
    Check {
        key: BucketKey::new(Arc::from("reports-month"), principal),
        quota,
        shadow: false,
        units: std::num::NonZeroU32::MIN,
    }
}

/// Five a month through `store` on `clock`: spent in a leap February, refused on the 29th until
/// March 1st 00:00 exactly, whole again then; a Berlin day of 23 hours ends at local midnight.
async fn a_month_and_a_day_by_the_calendar(store: &dyn Store, clock: &ManualClock, tag: &str) {
    let month = Quota::calendar(nonzero(5), Calendar::utc(CalendarUnit::Month));
    let who = format!("key:{tag}-{:08x}", rand::random::<u32>());
    clock.set(utc(2028, 2, 3, 9));
    for _ in 0..5 {
        let v = store.decide(&[check(&who, month)]).await.expect("decide");
        assert!(v[0].allowed);
    }
    clock.set(utc(2028, 2, 29, 12));
    let v = store.decide(&[check(&who, month)]).await.expect("decide");
    assert!(!v[0].allowed, "{tag}: spent for February");
    assert_eq!(
        v[0].retry_after_ns,
        12 * 3600 * S,
        "{tag}: a leap year's February 29th waits for March 1st 00:00 UTC"
    );
    clock.set(utc(2028, 3, 1, 0));
    let v = store.decide(&[check(&who, month)]).await.expect("decide");
    assert!(v[0].allowed, "{tag}: March's budget");
    assert_eq!(v[0].remaining, 4);
    assert_eq!(
        v[0].reset_after_ns,
        31 * 86_400 * S,
        "{tag}: March runs 31 days"
    );

    let berlin = Zone::named("Europe/Berlin").expect("zone");
    let day = Quota::calendar(nonzero(1), Calendar::new(CalendarUnit::Day, berlin));
    let who = format!("key:{tag}-berlin-{:08x}", rand::random::<u32>());
    // 2028-03-26 is the spring change there: midnight CET is 23:00 UTC the day before.
    clock.set(utc(2028, 3, 26, 1));
    let v = store.decide(&[check(&who, day)]).await.expect("decide");
    assert!(v[0].allowed);
    let v = store.decide(&[check(&who, day)]).await.expect("decide");
    assert!(!v[0].allowed);
    assert_eq!(
        v[0].retry_after_ns,
        21 * 3600 * S,
        "{tag}: the 23-hour day ends at 22:00 UTC (midnight CEST)"
    );
}

#[tokio::test]
async fn the_memory_store_counts_by_the_calendar_on_a_fixed_clock() {
    let clock = ManualClock::new(1);
    let store = MemoryStore::new(1000, Arc::new(clock.clone()));
    a_month_and_a_day_by_the_calendar(&store, &clock, "memory").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_counts_by_the_calendar_on_a_fixed_clock() {
    let Some(redis) = redis_support::standalone() else {
        return;
    };
    let clock = ManualClock::new(1);
    let mut o = RedisOptions::new(Duration::from_secs(5));
    o.clock = Arc::new(clock.clone());
    o.time_from_clock = true;
    // Virtual time runs years ahead of Redis's own: keep keys long enough that expiry never
    // decides.
    o.ttl_pad = Duration::from_secs(3600);
    let store = RedisStore::new(RedisTarget::Standalone(redis.url()), o).expect("store");
    assert!(store.wait_connected(Duration::from_secs(10)), "connect");
    a_month_and_a_day_by_the_calendar(&store, &clock, "redis").await;
}
