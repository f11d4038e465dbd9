//! The exact limit headers rendered for an outcome with two limiters, one of them the tightest.

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
    let spec = policy.get(name).cloned().expect("a built-in limiter");
    LimitResult {
        key: BucketKey::new(spec.name.clone(), "127.0.0.1:agent-1"),
        verdict: Verdict {
            allowed: true,
            limit: spec.quota.limit,
            remaining,
            reset_after_ns,
            retry_after_ns: 0,
        },
        spec,
        store_error,
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
            r#"ratelimit: "agent-device";r=29;t=2, "ui";r=5;t=2"#,
            "x-ratelimit-limit: 1000",
            "x-ratelimit-remaining: 5",
            "x-ratelimit-reset: 2",
        ]
    );
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
