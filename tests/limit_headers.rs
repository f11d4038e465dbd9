//! The limit headers: the exact rendering for an outcome with two limiters, one of them the
//! tightest, and the real binary's headers read with a structured-field parser (RFC 9651).

mod common;

use fleet_limiter::config::Config;
use fleet_limiter::decision::{LimitResult, Outcome};
use fleet_limiter::http::response::{apply_headers, limit_headers};
use fleet_limiter::keys::BucketKey;
use fleet_limiter::limiter::Verdict;
use fleet_limiter::policy::Policy;

fn result(
    policy: &Policy,
    name: &str,
    remaining: u32,
    reset_after_ns: u64,
    store_error: bool,
) -> LimitResult {
    let slot = policy
        .limiters()
        .iter()
        .position(|l| &*l.name == name)
        .expect("a built-in limiter");
    let spec = policy.limiters()[slot].clone();
    LimitResult {
        slot,
        key: BucketKey::new(spec.name.clone(), "127.0.0.1:agent-1"),
        verdict: Verdict {
            allowed: true,
            limit: spec.quota.limit(),
            remaining,
            reset_after_ns,
            retry_after_ns: 0,
        },
        spec,
        store_error,
        units: 1,
    }
}

#[test]
fn policy_state_and_tightest_headers() {
    let policy = Policy::new(Config::default().limiters);
    let outcome = Outcome {
        client_ip: None,
        results: vec![
            result(&policy, "agent-device", 29, 2_000_000_000, false),
            result(&policy, "ui", 5, 1_500_000_001, false),
            result(&policy, "api-key", 0, 0, true),
        ],
        store_error: None,
    };
    let rendered: Vec<String> = limit_headers(&outcome)
        .into_iter()
        .map(|(n, v)| format!("{n}: {v}"))
        .collect();
    assert_eq!(
        rendered,
        [
            r#"ratelimit-policy: "agent-device";q=30;w=60, "ui";q=1000;w=900"#,
            r#"ratelimit: "agent-device";r=29;t=2, "ui";r=5;t=1"#,
            "x-ratelimit-limit: 1000",
            "x-ratelimit-remaining: 5",
            // Seconds until the tightest quota is whole again, not until the next unit.
            "x-ratelimit-reset: 2",
        ]
    );
}

/// Numbers past the table of small ones (a budget of millions, a wait of hours) are written
/// out in full, beside small ones from the table, in the same response.
#[test]
fn large_and_small_numbers_render_alike() {
    let cfg = fleet_limiter::config::Loader::new()
        .env([(
            "FLEET_LIMITER_LIMITER_UI_LIMIT".to_owned(),
            "5000000".to_owned(),
        )])
        .load()
        .expect("config");
    let policy = Policy::new(cfg.limiters);
    for (remaining, reset_ns, want) in [
        (4_999_999, 7_200_000_000_000, ["5000000", "4999999", "7200"]),
        (4095, 4_095_000_000_000, ["5000000", "4095", "4095"]),
        (4096, 1, ["5000000", "4096", "1"]),
        (0, 0, ["5000000", "0", "0"]),
    ] {
        let outcome = Outcome {
            client_ip: None,
            results: vec![result(&policy, "ui", remaining, reset_ns, false)],
            store_error: None,
        };
        let numbers: Vec<String> = limit_headers(&outcome)
            .into_iter()
            .filter(|(n, _)| n.as_str().starts_with("x-ratelimit-"))
            .map(|(_, v)| v)
            .collect();
        assert_eq!(numbers, want, "remaining {remaining}, reset {reset_ns} ns");
    }
}

#[test]
fn no_headers_when_every_limiter_failed_to_decide() {
    let policy = Policy::new(Config::default().limiters);
    let outcome = Outcome {
        client_ip: None,
        results: vec![result(&policy, "agent-device", 0, 0, true)],
        store_error: None,
    };
    assert!(limit_headers(&outcome).is_empty());
}

#[test]
fn the_upstreams_own_limit_headers_are_replaced_and_others_kept() {
    use actix_web::http::header::{HeaderMap, HeaderName, HeaderValue};
    let policy = Policy::new(Config::default().limiters);
    let outcome = Outcome {
        client_ip: None,
        results: vec![result(&policy, "agent-device", 29, 2_000_000_000, false)],
        store_error: None,
    };
    let mut headers = HeaderMap::new();
    // An upstream that limits too (express-rate-limit) sends its own numbers.
    for (n, v) in [
        ("ratelimit", r#""upstream";r=1;t=9"#),
        ("x-ratelimit-remaining", "1"),
        ("x-ratelimit-remaining", "2"),
        ("content-type", "application/json"),
    ] {
        headers.append(HeaderName::from_static(n), HeaderValue::from_static(v));
    }
    apply_headers(&mut headers, &outcome);
    let all = |n: &str| -> Vec<String> {
        headers
            .get_all(n)
            .map(|v| v.to_str().unwrap_or("?").to_owned())
            .collect()
    };
    assert_eq!(all("ratelimit"), [r#""agent-device";r=29;t=2"#]);
    assert_eq!(all("x-ratelimit-remaining"), ["29"]);
    assert_eq!(all("x-ratelimit-limit"), ["30"]);
    assert_eq!(all("ratelimit-policy"), [r#""agent-device";q=30;w=60"#]);
    assert_eq!(all("content-type"), ["application/json"]);
    assert_eq!(headers.len(), 6);
}

/// One parsed list item: its name (an SF string) and its integer parameters.
#[derive(Debug)]
struct SfItem {
    name: String,
    params: Vec<(String, i64)>,
}

impl SfItem {
    fn param(&self, key: &str) -> Option<i64> {
        self.params.iter().find(|(k, _)| k == key).map(|(_, v)| *v)
    }
}

/// Parse a `RateLimit` or `RateLimit-Policy` value as an SF list of string items whose
/// parameters are all integers among `allowed`; anything else fails the test.
fn sf_list(value: &str, allowed: &[&str]) -> Vec<SfItem> {
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
                    let n = v
                        .as_integer()
                        .unwrap_or_else(|| panic!("{value:?}: {k} is not an integer"));
                    (k.as_str().to_owned(), i64::from(n))
                })
                .collect();
            SfItem { name, params }
        })
        .collect()
}

fn one<'a>(res: &'a reqwest::Response, name: &str) -> &'a str {
    let all: Vec<_> = res.headers().get_all(name).iter().collect();
    assert_eq!(all.len(), 1, "one {name} field");
    all[0]
        .to_str()
        .unwrap_or_else(|_| panic!("{name} is ASCII"))
}

/// Every item of `RateLimit` and `RateLimit-Policy`, checked against draft-10: the same
/// policies in both, `q` and `w` positive, `r` within `q`, and `t` (seconds until additional
/// quota is made available) present unless the quota is whole, never longer than the time one
/// request's worth of budget takes to come back. Returns `(name, r, t)` per policy.
fn checked_items(res: &reqwest::Response) -> Vec<(String, i64, Option<i64>)> {
    let policy = sf_list(one(res, "ratelimit-policy"), &["q", "w"]);
    let state = sf_list(one(res, "ratelimit"), &["r", "t"]);
    assert_eq!(
        policy.iter().map(|p| &p.name).collect::<Vec<_>>(),
        state.iter().map(|s| &s.name).collect::<Vec<_>>(),
        "the same policies, in the same order"
    );
    policy
        .iter()
        .zip(&state)
        .map(|(p, s)| {
            let q = p.param("q").expect("q");
            let w = p.param("w").expect("w");
            assert!(q > 0 && w > 0, "{p:?}");
            let r = s.param("r").expect("r");
            assert!((0..=q).contains(&r), "{s:?} within {p:?}");
            let t = s.param("t");
            match t {
                None => assert_eq!(r, q, "{s:?}: t left out only when the quota is whole"),
                Some(t) => {
                    assert!(
                        r < q,
                        "{s:?}: no additional quota can come to a whole quota"
                    );
                    // GCRA gives back one request every w/q seconds.
                    let interval = ((w + q - 1) / q).max(1);
                    assert!(
                        (1..=interval).contains(&t),
                        "{s:?}: the next request's worth comes within {interval} s ({p:?})"
                    );
                }
            }
            (s.name.clone(), r, t)
        })
        .collect()
}

async fn post_until_refused(
    gw: &common::Gateway,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    budget: usize,
) -> reqwest::Response {
    for n in 1..=budget + 1 {
        let mut req = common::client().request(
            reqwest::Method::from_bytes(method.as_bytes()).unwrap(),
            gw.url(path),
        );
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let res = req.send().await.unwrap_or_else(|e| panic!("{path}: {e}"));
        checked_items(&res);
        if n <= budget {
            assert_eq!(res.status(), 200, "request {n} of {budget} to {path}");
        } else {
            return res;
        }
    }
    unreachable!()
}

/// On a refusal, the refusing limiter's `t` is `Retry-After`: both from the bucket that
/// refused, rounded up, never 0.
fn assert_t_is_retry_after(res: &reqwest::Response, limiter: &str, at_most: i64) -> i64 {
    assert_eq!(res.status(), 429);
    let retry: i64 = one(res, "retry-after").parse().expect("delay-seconds");
    let items = checked_items(res);
    let (_, r, t) = items
        .iter()
        .find(|(n, ..)| n == limiter)
        .unwrap_or_else(|| panic!("{limiter} in {items:?}"));
    assert_eq!(*r, 0, "{limiter} refused");
    assert_eq!(*t, Some(retry), "{limiter}: t is Retry-After ({items:?})");
    assert!(
        (1..=at_most).contains(&retry),
        "{limiter}: Retry-After {retry}"
    );
    retry
}

#[tokio::test]
async fn agent_device_refusal_t_is_the_wait_for_the_next_request() {
    let up = common::upstream().await;
    let gw = common::Gateway::serve().upstream(&up.uri()).spawn();
    let headers = [("x-agent-id", "agent-1")];
    let res = post_until_refused(&gw, "GET", "/api/agent/heartbeat", &headers, 30).await;
    // 30 a minute: one comes back every 2 s.
    assert_t_is_retry_after(&res, "agent-device", 2);
    // X-RateLimit-Reset: seconds (not a timestamp) until the tightest limiter's quota is whole
    // again, here the full minute the 30 requests took from agent-device.
    assert_eq!(one(&res, "x-ratelimit-limit"), "30");
    assert_eq!(one(&res, "x-ratelimit-remaining"), "0");
    let reset: u64 = one(&res, "x-ratelimit-reset").parse().expect("seconds");
    assert!((58..=60).contains(&reset), "X-RateLimit-Reset {reset}");
}

#[tokio::test]
async fn key_rotation_refusal_t_is_the_wait_for_the_next_request() {
    let up = common::upstream().await;
    let gw = common::Gateway::serve().upstream(&up.uri()).spawn();
    let res = post_until_refused(&gw, "POST", "/api/agent/rotate-key", &[], 3).await;
    // 3 per 15 minutes: one comes back every 300 s.
    let retry = assert_t_is_retry_after(&res, "key-rotation", 300);
    assert!(retry > 240, "Retry-After {retry}");
    let reset: u64 = one(&res, "x-ratelimit-reset").parse().expect("seconds");
    assert!((840..=900).contains(&reset), "X-RateLimit-Reset {reset}");
}
