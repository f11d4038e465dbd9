//! The limit headers of every `[headers]` profile: the exact rendering of an allowed and a
//! refused outcome with two limiters, and the real binary's headers read with a structured-field
//! parser (RFC 9651) as each draft defines them, allowed and refused, every reset on a refusal
//! equal to `Retry-After`.

mod common;

use fleet_limiter::BucketKey;
use fleet_limiter::Config;
use fleet_limiter::Verdict;
use fleet_limiter::{apply_headers, limit_headers, too_many_requests};
use fleet_limiter::{HeaderProfile, LegacyReset, Standard};
use fleet_limiter::{LimitResult, Outcome};
use fleet_limiter::{Mode, Policy};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const S: u64 = 1_000_000_000;
/// The harness sets it (to draft 10) for the other suites; these tests set or unset it.
const STANDARD: &str = "FLEET_LIMITER_HEADERS_STANDARD";

fn profile(standard: Standard, legacy: bool, legacy_reset: LegacyReset) -> HeaderProfile {
    HeaderProfile {
        standard,
        legacy,
        legacy_reset,
    }
}

/// Every profile: each standard alone, and each with the legacy headers in both reset forms.
fn every_profile() -> Vec<HeaderProfile> {
    let mut all = Vec::new();
    for standard in Standard::ALL {
        all.push(profile(standard, false, LegacyReset::Unix));
        all.push(profile(standard, true, LegacyReset::Unix));
        all.push(profile(standard, true, LegacyReset::Delta));
    }
    all
}

/// The first 8 bytes of the name, as the limiter's partition (a recognisable `pk`).
fn partition_of(name: &str) -> [u8; 8] {
    let mut p = [0u8; 8];
    let n = name.len().min(8);
    p[..n].copy_from_slice(&name.as_bytes()[..n]);
    p
}

fn result(policy: &Policy, name: &str, verdict: Verdict, store_error: bool) -> LimitResult {
    let slot = policy
        .limiters()
        .iter()
        .position(|l| &*l.name == name)
        .expect("a built-in limiter");
    let spec = policy.limiters()[slot].clone();
    LimitResult {
        slot,
        quota: spec.quota,
        key: BucketKey::new(spec.name.clone(), "127.0.0.1:agent-1"),
        verdict,
        spec,
        store_error,
        local: false,
        units: std::num::NonZeroU32::MIN,
        partition: partition_of(name),
    }
}

fn limit_of(policy: &Policy, name: &str) -> u32 {
    policy
        .limiters()
        .iter()
        .find(|l| &*l.name == name)
        .expect("a built-in limiter")
        .quota
        .limit()
}

fn allowed(policy: &Policy, name: &str, remaining: u32, reset_after_ns: u64) -> LimitResult {
    let verdict = Verdict {
        allowed: true,
        limit: limit_of(policy, name),
        remaining,
        reset_after_ns,
        retry_after_ns: 0,
    };
    result(policy, name, verdict, false)
}

fn refused(policy: &Policy, name: &str, retry_after_ns: u64, reset_after_ns: u64) -> LimitResult {
    let verdict = Verdict {
        allowed: false,
        limit: limit_of(policy, name),
        remaining: 0,
        reset_after_ns,
        retry_after_ns,
    };
    result(policy, name, verdict, false)
}

fn outcome(results: Vec<LimitResult>) -> Outcome {
    Outcome {
        client_ip: None,
        results,
        store_error: None,
        poll_after_secs: None,
    }
}

/// 2023-11-14T22:13:20.25Z, when the test's decisions are made.
fn decided_at() -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(1_700_000_000 * S + S / 4)
}

fn rendered(o: &Outcome, p: &HeaderProfile) -> Vec<String> {
    limit_headers(o, p, Some(decided_at()))
        .into_iter()
        .map(|(n, v)| format!("{n}: {v}"))
        .collect()
}

/// Two limiters decided (a third's store failed): `ui` is the closest to refusing.
fn two_allowed(policy: &Policy) -> Outcome {
    let mut failed = allowed(policy, "api-key", 0, 0);
    failed.store_error = true;
    outcome(vec![
        allowed(policy, "agent-device", 29, 2 * S),
        allowed(policy, "ui", 5, 1_500_000_001),
        failed,
    ])
}

#[test]
fn each_profile_renders_an_allowed_answer_as_its_draft_defines() {
    let policy = Policy::new(Config::default().limiters);
    let o = two_allowed(&policy);
    let legacy_unix = [
        "x-ratelimit-limit: 1000",
        "x-ratelimit-remaining: 5",
        // 1 700 000 000.25 s + 1.500000001 s, rounded up.
        "x-ratelimit-reset: 1700000002",
    ];
    let cases: [(HeaderProfile, Vec<&str>); 6] = [
        (
            profile(Standard::Draft10, false, LegacyReset::Unix),
            vec![
                r#"ratelimit-policy: "agent-device";q=30;w=60, "ui";q=1000;w=900"#,
                // t: the next request's worth (agent-device: one every 2 s; ui: every 0.9 s).
                r#"ratelimit: "agent-device";r=29;t=2;pk=:YWdlbnQtZGU=:, "ui";r=5;t=1;pk=:dWkAAAAAAAA=:"#,
            ],
        ),
        (
            profile(Standard::Draft8, false, LegacyReset::Unix),
            vec![
                r#"ratelimit-policy: "agent-device";q=30;w=60, "ui";q=1000;w=900"#,
                // t: until the quota is whole again.
                r#"ratelimit: "agent-device";r=29;t=2;pk=:YWdlbnQtZGU=:, "ui";r=5;t=2;pk=:dWkAAAAAAAA=:"#,
            ],
        ),
        (
            profile(Standard::Draft7, false, LegacyReset::Unix),
            vec![
                // The limit the other header describes first.
                "ratelimit-policy: 1000;w=900, 30;w=60",
                "ratelimit: limit=1000, remaining=5, reset=2",
            ],
        ),
        (
            profile(Standard::Draft6, false, LegacyReset::Unix),
            vec![
                "ratelimit-policy: 1000;w=900, 30;w=60",
                "ratelimit-limit: 1000",
                "ratelimit-remaining: 5",
                "ratelimit-reset: 2",
            ],
        ),
        (
            profile(Standard::Off, true, LegacyReset::Delta),
            vec![
                "x-ratelimit-limit: 1000",
                "x-ratelimit-remaining: 5",
                "x-ratelimit-reset: 2",
            ],
        ),
        (
            profile(Standard::Off, true, LegacyReset::Unix),
            legacy_unix.to_vec(),
        ),
    ];
    for (p, want) in cases {
        assert_eq!(rendered(&o, &p), want, "{}", p.describe());
    }
    // A standard with the legacy headers: the standard's, then the legacy ones.
    let both = rendered(&o, &HeaderProfile::default());
    assert_eq!(both.len(), 7, "{both:?}");
    assert_eq!(&both[4..], legacy_unix);
    assert!(rendered(&o, &profile(Standard::Off, false, LegacyReset::Unix)).is_empty());
}

#[test]
fn on_a_refusal_every_reset_is_retry_after() {
    let policy = Policy::new(Config::default().limiters);
    // agent-device refused: its next request's worth is 1.5 s away (Retry-After 2), its bucket
    // whole in 60 s; ui would have allowed and was not charged.
    let o = outcome(vec![
        refused(&policy, "agent-device", 1_500_000_000, 60 * S),
        allowed(&policy, "ui", 6, 600_000_000),
    ]);
    assert_eq!(o.retry_after_secs(), Some(2));
    let want: [(HeaderProfile, Vec<&str>); 5] = [
        (
            profile(Standard::Draft10, true, LegacyReset::Delta),
            vec![
                r#"ratelimit-policy: "agent-device";q=30;w=60, "ui";q=1000;w=900"#,
                r#"ratelimit: "agent-device";r=0;t=2;pk=:YWdlbnQtZGU=:, "ui";r=6;pk=:dWkAAAAAAAA=:"#,
                "x-ratelimit-limit: 30",
                "x-ratelimit-remaining: 0",
                "x-ratelimit-reset: 2",
            ],
        ),
        (
            profile(Standard::Draft8, false, LegacyReset::Unix),
            vec![
                r#"ratelimit-policy: "agent-device";q=30;w=60, "ui";q=1000;w=900"#,
                r#"ratelimit: "agent-device";r=0;t=2;pk=:YWdlbnQtZGU=:, "ui";r=6;pk=:dWkAAAAAAAA=:"#,
            ],
        ),
        (
            profile(Standard::Draft7, true, LegacyReset::Unix),
            vec![
                "ratelimit-policy: 30;w=60, 1000;w=900",
                "ratelimit: limit=30, remaining=0, reset=2",
                "x-ratelimit-limit: 30",
                "x-ratelimit-remaining: 0",
                // 1 700 000 000.25 s + 2 s (Retry-After), rounded up.
                "x-ratelimit-reset: 1700000003",
            ],
        ),
        (
            profile(Standard::Draft6, false, LegacyReset::Unix),
            vec![
                "ratelimit-policy: 30;w=60, 1000;w=900",
                "ratelimit-limit: 30",
                "ratelimit-remaining: 0",
                "ratelimit-reset: 2",
            ],
        ),
        (profile(Standard::Off, false, LegacyReset::Unix), vec![]),
    ];
    for (p, want) in want {
        assert_eq!(rendered(&o, &p), want, "{}", p.describe());
        // The refusal itself: Retry-After beside them.
        let res = too_many_requests(&o, &p, Some(decided_at()));
        assert_eq!(res.status(), 429);
        assert_eq!(
            res.headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok()),
            Some("2"),
            "{}",
            p.describe()
        );
    }
}

/// Two limiters refuse, one for 1 s and one for 5 s: the request can succeed in 5 s, and every
/// reset says so; the single-limit forms describe the limiter that waits longest.
#[test]
fn stacked_refusals_report_the_longest_wait_everywhere() {
    let policy = Policy::new(Config::default().limiters);
    let o = outcome(vec![
        refused(&policy, "api-key", 4_200_000_000, 60 * S),
        refused(&policy, "ui", 800_000_000, 900 * S),
    ]);
    assert_eq!(o.retry_after_secs(), Some(5));
    let d10 = rendered(&o, &profile(Standard::Draft10, true, LegacyReset::Delta));
    assert_eq!(
        d10[1],
        r#"ratelimit: "api-key";r=0;t=5;pk=:YXBpLWtleQA=:, "ui";r=0;t=5;pk=:dWkAAAAAAAA=:"#
    );
    assert_eq!(
        &d10[2..],
        [
            "x-ratelimit-limit: 60",
            "x-ratelimit-remaining: 0",
            "x-ratelimit-reset: 5"
        ]
    );
    assert_eq!(
        rendered(&o, &profile(Standard::Draft7, false, LegacyReset::Unix)),
        [
            "ratelimit-policy: 60;w=60, 1000;w=900",
            "ratelimit: limit=60, remaining=0, reset=5"
        ]
    );
}

/// A shadow limiter that would have refused an allowed request: it is the closest to refusing,
/// and its reset is when it would allow again, never 0.
#[test]
fn a_shadow_refusal_reports_its_own_wait() {
    let policy = Policy::new(Config::default().limiters);
    let mut shadow = refused(&policy, "agent-device", 300_000_000, 60 * S);
    let mut spec = (*shadow.spec).clone();
    spec.mode = Mode::Shadow;
    shadow.spec = Arc::new(spec);
    let o = outcome(vec![shadow, allowed(&policy, "ui", 6, 600_000_000)]);
    assert!(!o.refused());
    assert_eq!(
        rendered(&o, &profile(Standard::Draft6, true, LegacyReset::Delta)),
        [
            "ratelimit-policy: 30;w=60, 1000;w=900",
            "ratelimit-limit: 30",
            "ratelimit-remaining: 0",
            "ratelimit-reset: 1",
            "x-ratelimit-limit: 30",
            "x-ratelimit-remaining: 0",
            "x-ratelimit-reset: 1"
        ]
    );
    let d10 = rendered(&o, &profile(Standard::Draft10, false, LegacyReset::Unix));
    assert_eq!(
        d10[1],
        r#"ratelimit: "agent-device";r=0;t=1;pk=:YWdlbnQtZGU=:, "ui";r=6;t=1;pk=:dWkAAAAAAAA=:"#
    );
}

/// Draft 6 and 7 forbid two policies with the same quota: the second limiter of a budget
/// already listed is left out, the one the other headers describe listed first.
#[test]
fn numbered_policies_never_repeat_a_quota() {
    let cfg = fleet_limiter::Loader::new()
        .env([
            ("FLEET_LIMITER_LIMITER_UI_LIMIT".to_owned(), "60".to_owned()),
            (
                "FLEET_LIMITER_LIMITER_UI_WINDOW".to_owned(),
                "1h".to_owned(),
            ),
        ])
        .load()
        .expect("config");
    let policy = Policy::new(cfg.limiters);
    let p = profile(Standard::Draft6, false, LegacyReset::Unix);
    // api-key (60 a minute) is the closer to refusing.
    let o = outcome(vec![
        allowed(&policy, "ui", 50, 60 * S),
        allowed(&policy, "api-key", 3, 57 * S),
    ]);
    assert_eq!(rendered(&o, &p)[0], "ratelimit-policy: 60;w=60");
    // ui (60 an hour) is.
    let o = outcome(vec![
        allowed(&policy, "ui", 1, 3540 * S),
        allowed(&policy, "api-key", 3, 57 * S),
    ]);
    assert_eq!(rendered(&o, &p)[0], "ratelimit-policy: 60;w=3600");
    // The named policies of draft 8 and 10 list both.
    let named = rendered(&o, &profile(Standard::Draft10, false, LegacyReset::Unix));
    assert_eq!(
        named[0],
        r#"ratelimit-policy: "ui";q=60;w=3600, "api-key";q=60;w=60"#
    );
}

/// Numbers past the table of small ones (a budget of millions, a wait of hours) are written
/// out in full, beside small ones from the table, in the same response.
#[test]
fn large_and_small_numbers_render_alike() {
    let cfg = fleet_limiter::Loader::new()
        .env([(
            "FLEET_LIMITER_LIMITER_UI_LIMIT".to_owned(),
            "5000000".to_owned(),
        )])
        .load()
        .expect("config");
    let policy = Policy::new(cfg.limiters);
    for (remaining, reset_ns, want) in [
        (4_999_999, 7_200 * S, ["5000000", "4999999", "7200"]),
        (4095, 4_095 * S, ["5000000", "4095", "4095"]),
        (4096, 1, ["5000000", "4096", "1"]),
    ] {
        let o = outcome(vec![allowed(&policy, "ui", remaining, reset_ns)]);
        for (p, prefix) in [
            (
                profile(Standard::Off, true, LegacyReset::Delta),
                "x-ratelimit-",
            ),
            (
                profile(Standard::Draft6, false, LegacyReset::Unix),
                "ratelimit-",
            ),
        ] {
            let numbers: Vec<String> = limit_headers(&o, &p, None)
                .into_iter()
                .filter(|(n, _)| n.as_str().starts_with(prefix) && n != "ratelimit-policy")
                .map(|(_, v)| v)
                .collect();
            assert_eq!(numbers, want, "remaining {remaining}, reset {reset_ns} ns");
        }
        // Draft 6 and the legacy headers together carry the same numbers, each header its own
        // (the reset too when both count seconds).
        for legacy_reset in [LegacyReset::Delta, LegacyReset::Unix] {
            let p = profile(Standard::Draft6, true, legacy_reset);
            let all = limit_headers(&o, &p, None);
            for prefix in ["ratelimit-", "x-ratelimit-"] {
                let numbers: Vec<&str> = all
                    .iter()
                    .filter(|(n, _)| n.as_str().starts_with(prefix) && n != "ratelimit-policy")
                    .map(|(_, v)| v.as_str())
                    .collect();
                let expected = if prefix == "x-ratelimit-" && legacy_reset == LegacyReset::Unix {
                    &want[..2]
                } else {
                    &want[..]
                };
                assert_eq!(
                    numbers.get(..expected.len()),
                    Some(expected),
                    "{prefix} of {}, remaining {remaining}",
                    p.describe()
                );
                assert_eq!(numbers.len(), 3, "{numbers:?}");
            }
        }
    }
}

#[test]
fn no_headers_when_every_limiter_failed_to_decide() {
    let policy = Policy::new(Config::default().limiters);
    let mut failed = allowed(&policy, "agent-device", 0, 0);
    failed.store_error = true;
    let o = outcome(vec![failed]);
    for p in every_profile() {
        assert!(limit_headers(&o, &p, None).is_empty(), "{}", p.describe());
    }
}

#[test]
fn the_upstreams_own_limit_headers_are_replaced_and_others_kept() {
    use actix_web::http::header::{HeaderMap, HeaderName, HeaderValue};
    let policy = Policy::new(Config::default().limiters);
    let o = outcome(vec![allowed(&policy, "agent-device", 29, 2 * S)]);
    // An upstream that limits too (express-rate-limit) sends its own numbers.
    let upstream = || {
        let mut headers = HeaderMap::new();
        for (n, v) in [
            ("ratelimit", "limit=1, remaining=1, reset=9"),
            ("ratelimit-remaining", "1"),
            ("x-ratelimit-remaining", "1"),
            ("x-ratelimit-remaining", "2"),
            ("content-type", "application/json"),
        ] {
            headers.append(HeaderName::from_static(n), HeaderValue::from_static(v));
        }
        headers
    };
    let all = |headers: &HeaderMap, n: &str| -> Vec<String> {
        headers
            .get_all(n)
            .map(|v| v.to_str().unwrap_or("?").to_owned())
            .collect()
    };
    let mut headers = upstream();
    apply_headers(&mut headers, &o, &HeaderProfile::default(), None);
    assert_eq!(all(&headers, "ratelimit-remaining"), ["29"]);
    assert_eq!(all(&headers, "x-ratelimit-remaining"), ["29"]);
    assert_eq!(all(&headers, "x-ratelimit-limit"), ["30"]);
    assert_eq!(all(&headers, "ratelimit-policy"), ["30;w=60"]);
    // A name this profile does not send is the upstream's business.
    assert_eq!(
        all(&headers, "ratelimit"),
        ["limit=1, remaining=1, reset=9"]
    );
    assert_eq!(all(&headers, "content-type"), ["application/json"]);

    let mut headers = upstream();
    let d10 = profile(Standard::Draft10, false, LegacyReset::Unix);
    apply_headers(&mut headers, &o, &d10, None);
    assert_eq!(
        all(&headers, "ratelimit"),
        [r#""agent-device";r=29;t=2;pk=:YWdlbnQtZGU=:"#]
    );
    assert_eq!(all(&headers, "x-ratelimit-remaining"), ["1", "2"]);
    assert_eq!(all(&headers, "ratelimit-remaining"), ["1"]);

    // Off: nothing added, nothing taken away.
    let mut headers = upstream();
    apply_headers(
        &mut headers,
        &o,
        &profile(Standard::Off, false, LegacyReset::Unix),
        None,
    );
    let listed = |h: &HeaderMap| -> Vec<(String, String)> {
        let mut all: Vec<(String, String)> = h
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("?").to_owned()))
            .collect();
        all.sort();
        all
    };
    assert_eq!(listed(&headers), listed(&upstream()));
}

// ---------------------------------------------------------------------------------------------
// The real binary, every profile.

/// A structured-field integer, or the test fails.
fn int(v: &sfv::BareItem, what: &str) -> i64 {
    i64::from(
        v.as_integer()
            .unwrap_or_else(|| panic!("{what}: {v:?} is not an integer")),
    )
}

/// The one field `name` carries, as text.
fn one(res: &reqwest::Response, name: &str) -> String {
    let all: Vec<_> = res.headers().get_all(name).iter().collect();
    assert_eq!(all.len(), 1, "one {name} field: {all:?}");
    all[0]
        .to_str()
        .unwrap_or_else(|_| panic!("{name} is ASCII"))
        .to_owned()
}

/// What a client of `profile` reads from one answer: the limit, what remains, the resets it
/// sends in seconds from now (the Unix one converted), and, for draft 8 and 10, each named
/// item's `(name, r, t, pk)`.
#[derive(Debug, Default)]
struct Reading {
    limit: Option<i64>,
    remaining: Option<i64>,
    resets: Vec<(String, f64)>,
    items: Vec<(String, i64, Option<i64>, Vec<u8>)>,
}

/// A `RateLimit-Policy` of integer items (draft 6 and 7): `(q, w)` each, no quota twice.
fn numbered_policy(value: &str) -> Vec<(i64, i64)> {
    let list: sfv::List = sfv::Parser::new(value)
        .parse()
        .unwrap_or_else(|e| panic!("{value:?} is not an SF list: {e}"));
    let items: Vec<(i64, i64)> = list
        .into_iter()
        .map(|entry| {
            let sfv::ListEntry::Item(item) = entry else {
                panic!("{value:?}: an inner list")
            };
            let q = int(&item.bare_item, value);
            let w = item
                .params
                .iter()
                .find(|(k, _)| k.as_str() == "w")
                .map(|(_, v)| int(v, value))
                .unwrap_or_else(|| panic!("{value:?}: no w"));
            assert!(q > 0 && w > 0, "{value:?}");
            (q, w)
        })
        .collect();
    for (i, (q, _)) in items.iter().enumerate() {
        assert!(
            !items[..i].iter().any(|(p, _)| p == q),
            "{value:?}: quota {q} twice"
        );
    }
    items
}

/// A list of named items whose parameters are among `allowed` (draft 8 and 10).
fn named_items(value: &str, allowed: &[&str]) -> Vec<(String, Vec<(String, sfv::BareItem)>)> {
    let list: sfv::List = sfv::Parser::new(value)
        .parse()
        .unwrap_or_else(|e| panic!("{value:?} is not an SF list: {e}"));
    list.into_iter()
        .map(|entry| {
            let sfv::ListEntry::Item(item) = entry else {
                panic!("{value:?}: an inner list")
            };
            let name = item
                .bare_item
                .as_string()
                .unwrap_or_else(|| panic!("{value:?}: an item that is not a string"))
                .as_str()
                .to_owned();
            let params = item
                .params
                .iter()
                .map(|(k, v)| {
                    assert!(allowed.contains(&k.as_str()), "{value:?}: parameter {k}");
                    (k.as_str().to_owned(), v.clone())
                })
                .collect();
            (name, params)
        })
        .collect()
}

fn param<'a>(params: &'a [(String, sfv::BareItem)], key: &str) -> Option<&'a sfv::BareItem> {
    params.iter().find(|(k, _)| k == key).map(|(_, v)| v)
}

/// Seconds since the Unix epoch, now.
fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs_f64()
}

/// Read an answer as `profile` defines it, checking that exactly its headers are there and
/// that each is well formed.
fn read(res: &reqwest::Response, p: &HeaderProfile) -> Reading {
    let has = |n: &str| res.headers().contains_key(n);
    let standard_names: &[&str] = match p.standard {
        Standard::Off => &[],
        Standard::Draft6 => &[
            "ratelimit-policy",
            "ratelimit-limit",
            "ratelimit-remaining",
            "ratelimit-reset",
        ],
        _ => &["ratelimit-policy", "ratelimit"],
    };
    let legacy_names: &[&str] = if p.legacy {
        &[
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset",
        ]
    } else {
        &[]
    };
    for n in fleet_limiter::limit_header_names() {
        let sent = standard_names.contains(&n) || legacy_names.contains(&n);
        assert_eq!(has(n), sent, "{}: {n} {:?}", p.describe(), res.headers());
    }
    let mut r = Reading::default();
    match p.standard {
        Standard::Off => {}
        Standard::Draft6 | Standard::Draft7 => {
            let policies = numbered_policy(&one(res, "ratelimit-policy"));
            let (limit, remaining, reset) = if p.standard == Standard::Draft6 {
                let item = |n: &str| -> i64 {
                    let v = one(res, n);
                    let item: sfv::Item = sfv::Parser::new(&v)
                        .parse()
                        .unwrap_or_else(|e| panic!("{n}: {v:?} is not an SF item: {e}"));
                    int(&item.bare_item, n)
                };
                (
                    item("ratelimit-limit"),
                    item("ratelimit-remaining"),
                    item("ratelimit-reset"),
                )
            } else {
                let v = one(res, "ratelimit");
                let dict: sfv::Dictionary = sfv::Parser::new(&v)
                    .parse()
                    .unwrap_or_else(|e| panic!("{v:?} is not an SF dictionary: {e}"));
                let key = |k: &str| match dict.get(k) {
                    Some(sfv::ListEntry::Item(i)) => int(&i.bare_item, k),
                    other => panic!("{v:?}: {k} is {other:?}"),
                };
                assert_eq!(dict.len(), 3, "{v:?}: limit, remaining and reset only");
                (key("limit"), key("remaining"), key("reset"))
            };
            // The policy of the limit described comes first.
            assert_eq!(policies[0].0, limit, "{policies:?}");
            assert!((0..=limit).contains(&remaining));
            assert!(reset >= 0);
            r.limit = Some(limit);
            r.remaining = Some(remaining);
            r.resets
                .push((p.standard.as_str().to_owned(), reset as f64));
        }
        Standard::Draft8 | Standard::Draft10 => {
            let policies = named_items(&one(res, "ratelimit-policy"), &["q", "w"]);
            let limits = named_items(&one(res, "ratelimit"), &["r", "t", "pk"]);
            assert_eq!(
                policies.iter().map(|(n, _)| n).collect::<Vec<_>>(),
                limits.iter().map(|(n, _)| n).collect::<Vec<_>>(),
                "the same policies, in the same order"
            );
            for ((name, pol), (_, lim)) in policies.iter().zip(&limits) {
                let q = int(param(pol, "q").expect("q"), "q");
                let w = int(param(pol, "w").expect("w"), "w");
                assert!(q > 0 && w > 0, "{name}: q {q}, w {w}");
                let rem = int(param(lim, "r").expect("r (required)"), "r");
                assert!((0..=q).contains(&rem), "{name}: r {rem} within q {q}");
                let t = param(lim, "t").map(|t| int(t, "t"));
                if let Some(t) = t {
                    assert!(t >= 0, "{name}: t {t}");
                    r.resets.push((name.clone(), t as f64));
                }
                let pk = param(lim, "pk")
                    .and_then(|v| v.as_byte_sequence())
                    .unwrap_or_else(|| panic!("{name}: pk is a byte sequence"))
                    .to_vec();
                assert_eq!(pk.len(), 8, "{name}: pk");
                r.items.push((name.clone(), rem, t, pk));
            }
        }
    }
    if p.legacy {
        let number = |n: &str| -> i64 { one(res, n).parse().unwrap_or_else(|_| panic!("{n}")) };
        let limit = number("x-ratelimit-limit");
        let remaining = number("x-ratelimit-remaining");
        if let (Some(l), Some(rem)) = (r.limit, r.remaining) {
            assert_eq!((limit, remaining), (l, rem), "the same limiter in both");
        }
        r.limit = Some(limit);
        r.remaining = Some(remaining);
        let reset = number("x-ratelimit-reset");
        let seconds = match p.legacy_reset {
            LegacyReset::Delta => reset as f64,
            LegacyReset::Unix => {
                assert!(reset > 1_000_000_000, "a Unix time: {reset}");
                reset as f64 - unix_now()
            }
        };
        r.resets.push(("x-ratelimit-reset".to_owned(), seconds));
    }
    r
}

/// `agent-device` (30 a minute, one back every 2 s) spent and refused through the real binary
/// under `p`: every answer read as its draft says, the refusal's resets all `Retry-After`.
async fn spend_agent_device(p: HeaderProfile) {
    let up = common::upstream().await;
    let mut launch = common::Gateway::serve()
        .upstream(&up.uri())
        .env(STANDARD, p.standard.as_str())
        .env("FLEET_LIMITER_HEADERS_LEGACY", p.legacy.to_string());
    if p.legacy {
        launch = launch.env(
            "FLEET_LIMITER_HEADERS_LEGACY_RESET",
            p.legacy_reset.as_str(),
        );
    }
    let gw = launch.spawn();
    let via = p.describe();
    let mut partitions: Vec<(String, Vec<u8>)> = Vec::new();
    for n in 1..=31i64 {
        let res = common::client()
            .get(gw.url("/api/agent/heartbeat"))
            .header("x-agent-id", "agent-1")
            .send()
            .await
            .expect("request");
        let reading = read(&res, &p);
        for (name, _, _, pk) in &reading.items {
            match partitions.iter().find(|(k, _)| k == name) {
                Some((_, seen)) => assert_eq!(seen, pk, "{via}: {name}'s partition is stable"),
                None => partitions.push((name.clone(), pk.clone())),
            }
        }
        // One limit is described unless only named items are sent.
        let single = p.legacy || matches!(p.standard, Standard::Draft6 | Standard::Draft7);
        assert_eq!(reading.limit, single.then_some(30), "{via}");
        let named = matches!(p.standard, Standard::Draft8 | Standard::Draft10);
        let device = reading
            .items
            .iter()
            .find(|(name, ..)| name == "agent-device");
        assert_eq!(device.is_some(), named, "{via}: {reading:?}");
        if n <= 30 {
            assert_eq!(res.status(), 200, "{via}: request {n}");
            assert!(!res.headers().contains_key("retry-after"));
            if single {
                assert_eq!(reading.remaining, Some(30 - n), "{via}: request {n}");
            }
            if let Some((_, r, _, _)) = device {
                assert_eq!(*r, 30 - n, "{via}");
            }
            for (what, secs) in &reading.resets {
                // Never more than the quota's 2 s per request taken, never (rounded) 0.
                assert!(
                    *secs > 0.0 && *secs <= (2 * n) as f64 + 1.0,
                    "{via}: request {n}: {what} = {secs}"
                );
            }
            if let (Standard::Draft10, Some((_, _, t, _))) = (p.standard, device) {
                // The next request's worth comes within 2 s.
                assert!(matches!(t, Some(1..=2)), "{via}: t {t:?}");
            }
        } else {
            assert_eq!(res.status(), 429, "{via}");
            let retry: f64 = one(&res, "retry-after").parse().expect("delay-seconds");
            assert!((1.0..=2.0).contains(&retry), "{via}: Retry-After {retry}");
            if single {
                assert_eq!(reading.remaining, Some(0), "{via}");
            }
            for (what, secs) in &reading.resets {
                let slack = if what == "x-ratelimit-reset" && p.legacy_reset == LegacyReset::Unix {
                    1.0
                } else {
                    0.0
                };
                assert!(
                    (secs - retry).abs() <= slack,
                    "{via}: {what} = {secs} disagrees with Retry-After {retry}"
                );
            }
            if let Some((_, r, t, _)) = device {
                assert_eq!((*r, *t), (0, Some(retry as i64)), "{via}");
            }
            // The other limiters took nothing and carry no reset.
            for (name, _, t, _) in &reading.items {
                if name != "agent-device" {
                    assert_eq!(*t, None, "{via}: {name}");
                }
            }
        }
    }
}

#[tokio::test]
async fn every_profile_through_the_real_binary() {
    for p in every_profile() {
        spend_agent_device(p).await;
    }
}

/// The default is draft 6 with the legacy headers, their reset a Unix time.
#[tokio::test]
async fn the_default_profile_is_draft_6_with_unix_legacy_headers() {
    assert_eq!(Config::default().headers, HeaderProfile::default());
    assert_eq!(
        HeaderProfile::default(),
        profile(Standard::Draft6, true, LegacyReset::Unix)
    );
    let up = common::upstream().await;
    let gw = common::Gateway::serve()
        .upstream(&up.uri())
        .unset(STANDARD)
        .spawn();
    let res = common::client()
        .get(gw.url("/api/agent/heartbeat"))
        .header("x-agent-id", "agent-1")
        .send()
        .await
        .expect("request");
    let reading = read(&res, &HeaderProfile::default());
    assert_eq!((reading.limit, reading.remaining), (Some(30), Some(29)));
}

/// Values a profile cannot take stop start-up with exit code 2, naming the setting and the fix.
#[test]
fn hostile_profile_settings_stop_start_up() {
    let cases: [(&str, &str, &str); 9] = [
        (
            "FLEET_LIMITER_HEADERS_STANDARD",
            "Draft-7",
            "headers.standard: `Draft-7` is not a header standard",
        ),
        (
            "FLEET_LIMITER_HEADERS_STANDARD",
            "draft7",
            "`draft7` is not a header standard",
        ),
        (
            "FLEET_LIMITER_HEADERS_STANDARD",
            "draft-9",
            "use \"draft-6\" (the default), \"draft-7\", \"draft-8\", \"draft-10\" or \"off\"",
        ),
        (
            "FLEET_LIMITER_HEADERS_STANDARD",
            "true",
            "express-rate-limit's `true` means \"draft-6\"",
        ),
        (
            "FLEET_LIMITER_HEADERS_STANDARD",
            "",
            "`` is not a header standard",
        ),
        (
            "FLEET_LIMITER_HEADERS_STANDARD",
            "draft-10\u{7f}",
            "`draft-10\\u{7f}` is not a header standard",
        ),
        (
            "FLEET_LIMITER_HEADERS_LEGACY",
            "maybe",
            "FLEET_LIMITER_HEADERS_LEGACY",
        ),
        (
            "FLEET_LIMITER_HEADERS_LEGACY_RESET",
            "seconds",
            "headers.legacy_reset: `seconds` is not a reset form; use \"unix\"",
        ),
        (
            "FLEET_LIMITER_HEADERS_LEGACY_RESET",
            &"x".repeat(100_000),
            "is not a reset form",
        ),
    ];
    for (var, value, wanted) in cases {
        let exited = common::Launch::serve()
            .env(var, value)
            .run(common::PATIENCE);
        assert_eq!(exited.code, Some(2), "{var}={value:.40}: {}", exited.stderr);
        assert!(
            exited.stderr.contains(wanted),
            "{var}={value:.40}: {}",
            exited.stderr
        );
        // An operator's long value is not repeated whole.
        assert!(exited.stderr.len() < 2_000, "{}", exited.stderr.len());
    }
    for (toml, wanted) in [
        (
            "[headers]\nstandard = true\n",
            "express-rate-limit's `true` means \"draft-6\"",
        ),
        ("[headers]\nstandard = 6\n", "headers.standard"),
        ("[headers]\nlegacy = \"yes\"\n", "headers.legacy"),
        ("[headers]\nstandards = \"draft-6\"\n", "standards"),
        (
            "[headers]\nstandard = \"draft-6\"\nstandard = \"draft-7\"\n",
            "duplicate key",
        ),
    ] {
        let exited = common::Launch::serve()
            .unset(STANDARD)
            .config_toml(toml)
            .run(common::PATIENCE);
        assert_eq!(exited.code, Some(2), "{toml}: {}", exited.stderr);
        assert!(exited.stderr.contains(wanted), "{toml}: {}", exited.stderr);
    }
}

/// The flags and the file say the same as the variables.
#[tokio::test]
async fn flags_and_the_file_choose_the_profile_too() {
    let up = common::upstream().await;
    let gw = common::Gateway::serve()
        .upstream(&up.uri())
        .config_toml("[headers]\nstandard = \"draft-10\"\nlegacy = true\n")
        .args([
            "--headers-standard",
            "draft-7",
            "--headers-legacy-reset",
            "delta",
        ])
        .spawn();
    let res = common::client()
        .get(gw.url("/api/agent/heartbeat"))
        .header("x-agent-id", "agent-1")
        .send()
        .await
        .expect("request");
    let reading = read(&res, &profile(Standard::Draft7, true, LegacyReset::Delta));
    assert_eq!(reading.remaining, Some(29));
}

/// A reload changes the profile live: the next answer has the new headers, and the buckets are
/// the same ones.
#[tokio::test]
async fn a_reload_changes_the_profile() {
    let up = common::upstream().await;
    let toml = |standard: &str| {
        format!(
            "[server]\nupstream = \"{}\"\n[headers]\nstandard = \"{standard}\"\nlegacy = false\n",
            up.uri()
        )
    };
    let gw = common::Launch::serve()
        .unset(STANDARD)
        .config_toml(toml("draft-10"))
        .admin()
        .spawn();
    let ask = || async {
        common::client()
            .get(gw.url("/api/agent/heartbeat"))
            .header("x-agent-id", "agent-1")
            .send()
            .await
            .expect("request")
    };
    let d10 = profile(Standard::Draft10, false, LegacyReset::Unix);
    let res = ask().await;
    read(&res, &d10);
    gw.rewrite_config(&toml("draft-7"));
    gw.signal("HUP");
    gw.wait_metric("fleet_limiter_config_reloads_total{result=\"ok\"}", |v| {
        v == 1.0
    })
    .await;
    let res = ask().await;
    let reading = read(&res, &profile(Standard::Draft7, false, LegacyReset::Unix));
    assert_eq!(
        reading.remaining,
        Some(28),
        "the same bucket, charged twice"
    );
}
