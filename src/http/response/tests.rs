use super::*;
use crate::clock::ManualClock;
use crate::config::Loader;
use crate::decision::{Decider, KeyHeaders, RequestFacts};
use crate::identity::NoVerifier;
use crate::path::CanonicalPath;
use crate::store::memory::MemoryStore;
use actix_web::body::MessageBody;
use actix_web::http::StatusCode;
use std::sync::Arc;

fn decider(env: &[(&str, &str)]) -> Decider {
    let cfg = Loader::new()
        .env(env.iter().map(|(k, v)| (k.to_string(), v.to_string())))
        .load()
        .expect("config");
    let store = Arc::new(MemoryStore::new(1000, Arc::new(ManualClock::new(1))));
    Decider::new(&cfg, store, Arc::new(NoVerifier))
}

async fn rotate(d: &Decider) -> Outcome {
    d.decide(&RequestFacts {
        peer: "203.0.113.7".parse().expect("ip"),
        method: "POST",
        path: CanonicalPath::of_static("/auth/email"),
        forwarded: &[],
        agent_id: None,
        authorization: None,
        session_token: None,
        key_headers: KeyHeaders::default(),
    })
    .await
}

fn names(headers: &[(HeaderName, String)]) -> String {
    headers
        .iter()
        .map(|(n, v)| format!("{n}: {v}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Two limiters of `POST /auth/email`: `per-dst` (2 per 15 minutes) and `per-src` (250 a
/// minute).
fn two(env: &[(&str, &str)]) -> Decider {
    let mut all = vec![
        ("FLEET_LIMITER_LIMITER_PER_DST_LIMIT", "2"),
        ("FLEET_LIMITER_LIMITER_PER_DST_WINDOW", "15m"),
        ("FLEET_LIMITER_LIMITER_PER_DST_KEY", "ip"),
        ("FLEET_LIMITER_LIMITER_PER_DST_ROUTES", "POST /auth/email"),
        ("FLEET_LIMITER_LIMITER_PER_SRC_LIMIT", "250"),
        ("FLEET_LIMITER_LIMITER_PER_SRC_WINDOW", "1m"),
        ("FLEET_LIMITER_LIMITER_PER_SRC_KEY", "ip"),
        ("FLEET_LIMITER_LIMITER_PER_SRC_ROUTES", "POST /auth/email"),
    ];
    all.extend_from_slice(env);
    decider(&all)
}

/// per-dst hidden, per-src named, draft-10 headers.
const HIDDEN: &[(&str, &str)] = &[
    ("FLEET_LIMITER_LIMITER_PER_DST_DISCLOSE", "false"),
    ("FLEET_LIMITER_HEADERS_STANDARD", "draft-10"),
];

#[actix_rt::test]
async fn a_hidden_limiter_is_absent_from_every_limit_header() {
    let d = two(HIDDEN);
    let profile = d.settings().headers;
    let allowed = rotate(&d).await;
    assert!(!allowed.refused());
    assert_eq!(allowed.results.len(), 2, "both limiters decided");
    let shown = names(&limit_headers(&allowed, &profile, None));
    assert!(shown.contains("\"per-src\""), "{shown}");
    assert!(!shown.contains("per-dst"), "{shown}");
    // Neither named: no limit header at all.
    let d = two(&[
        HIDDEN[0],
        HIDDEN[1],
        ("FLEET_LIMITER_LIMITER_PER_SRC_DISCLOSE", "false"),
    ]);
    assert!(limit_headers(&rotate(&d).await, &profile, None).is_empty());
}

#[actix_rt::test]
async fn a_refusal_a_hidden_limiter_takes_part_in_carries_no_limit_header() {
    for legacy in ["true", "false"] {
        let d = two(&[
            HIDDEN[0],
            ("FLEET_LIMITER_HEADERS_STANDARD", "draft-7"),
            ("FLEET_LIMITER_HEADERS_LEGACY", legacy),
        ]);
        let profile = d.settings().headers;
        rotate(&d).await;
        rotate(&d).await;
        let refused = rotate(&d).await;
        assert!(refused.refused());
        assert!(limit_headers(&refused, &profile, None).is_empty());
        let res = too_many_requests(&refused, &profile, None);
        let retry = res
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            .expect("Retry-After");
        // From the bucket: 2 per 15 minutes gives one back after 450 s.
        assert_eq!(retry, 450);
        let mut shown: Vec<&str> = res.headers().keys().map(|k| k.as_str()).collect();
        shown.sort_unstable();
        assert_eq!(shown, ["content-type", "retry-after"]);
    }
    // A named limiter refusing beside a hidden one that allowed: only the named one shows.
    let d = two(&[
        HIDDEN[0],
        HIDDEN[1],
        ("FLEET_LIMITER_LIMITER_PER_SRC_LIMIT", "1"),
    ]);
    let profile = d.settings().headers;
    rotate(&d).await;
    let refused = rotate(&d).await;
    assert!(refused.refused());
    let shown = names(&limit_headers(&refused, &profile, None));
    assert!(shown.contains("\"per-src\";r=0;t="), "{shown}");
    assert!(!shown.contains("per-dst"), "{shown}");
}

/// `outcome` as a store that cannot answer would leave it: every limiter's verdict its
/// `on_store_error` answer, `deny` for all (refused, nothing left, one emission interval).
fn store_down(outcome: &Outcome) -> Outcome {
    let mut o = outcome.clone();
    for r in &mut o.results {
        r.store_error = true;
        r.verdict.allowed = false;
        r.verdict.remaining = 0;
        r.verdict.reset_after_ns = 0;
        r.verdict.retry_after_ns = r.quota.emission_interval_ns();
    }
    o.store_error = Some(crate::store::StoreError::new(
        crate::store::StoreErrorKind::Connection,
        "down",
    ));
    o
}

fn number(res: &HttpResponse, name: &str) -> Option<u64> {
    res.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

#[actix_rt::test]
async fn a_store_that_cannot_answer_is_a_503_with_a_wait_of_each_callers_own() {
    let d = two(&[("FLEET_LIMITER_HEADERS_LEGACY_RESET", "delta")]);
    let profile = d.settings().headers;
    let down = store_down(&rotate(&d).await);
    assert!(down.refused() && down.store_unavailable());
    // per-dst, 2 in 15 minutes: a 429 would say 450 s.
    assert_eq!(down.retry_after_secs(), Some(450));
    let mut told = std::collections::BTreeSet::new();
    for i in 0..50 {
        let who = crate::spread::principal_bytes(&format!("198.51.100.{i}"), Some("agent-1"));
        let res = refusal(&down, &profile, None, &who);
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
        let wait = number(&res, "retry-after").expect("Retry-After");
        assert!((450..=900).contains(&wait), "{wait}");
        assert_eq!(number(&res, "ratelimit-reset"), Some(wait), "{res:?}");
        assert_eq!(number(&res, "x-ratelimit-reset"), Some(wait), "{res:?}");
        assert_eq!(number(&res, "ratelimit-remaining"), Some(0), "{res:?}");
        let again = refusal(&down, &profile, None, &who);
        assert_eq!(
            number(&again, "retry-after"),
            Some(wait),
            "one caller, one wait"
        );
        let body = res.into_body().try_into_bytes().unwrap_or_default();
        let p: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        assert_eq!(
            p["type"], "urn:fleet-limiter:problem:store-unavailable",
            "{p}"
        );
        assert_eq!(p["status"], 503, "{p}");
        assert_eq!(p["retry_after"], wait, "{p}");
        let said = format!("retry after {wait} seconds");
        assert!(
            p["detail"].as_str().is_some_and(|s| s.contains(&said)),
            "{p}"
        );
        told.insert(wait);
    }
    assert!(told.len() >= 10, "{told:?}");
    // Draft 10: the refusing limiters' `t` is the spread wait too.
    let d10 = two(&[("FLEET_LIMITER_HEADERS_STANDARD", "draft-10")]);
    let res = refusal(&down, &d10.settings().headers, None, b"someone");
    let wait = number(&res, "retry-after").expect("Retry-After");
    let ratelimit = res
        .headers()
        .get("ratelimit")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    assert!(
        ratelimit.contains(&format!("\"per-dst\";r=0;t={wait};")),
        "{ratelimit}"
    );
}

#[actix_rt::test]
async fn a_spent_budget_is_a_429_even_while_the_store_fails_for_another_limiter() {
    let d = two(&[]);
    let profile = d.settings().headers;
    for _ in 0..2 {
        assert!(!rotate(&d).await.refused());
    }
    let spent = rotate(&d).await;
    assert!(spent.refused() && !spent.store_unavailable());
    // per-src's store failed and denied; per-dst's own budget is spent.
    let mut both = spent.clone();
    let src = both
        .results
        .iter_mut()
        .find(|r| &*r.spec.name == "per-src")
        .expect("per-src decided");
    src.store_error = true;
    src.verdict.allowed = false;
    src.verdict.retry_after_ns = src.quota.emission_interval_ns();
    assert!(!both.store_unavailable(), "a spent own budget is a 429");
    for o in [&spent, &both] {
        let res = refusal(o, &profile, None, b"anyone");
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(number(&res, "retry-after"), o.retry_after_secs());
        assert_eq!(number(&res, "ratelimit-reset"), o.retry_after_secs());
    }
}

#[actix_rt::test]
async fn an_answer_told_a_wait_says_it_in_every_reset() {
    let d = two(&[("FLEET_LIMITER_HEADERS_LEGACY_RESET", "delta")]);
    let allowed = rotate(&d).await;
    assert!(!allowed.refused());
    for standard in ["draft-6", "draft-7", "draft-10"] {
        let d = two(&[
            ("FLEET_LIMITER_HEADERS_STANDARD", standard),
            ("FLEET_LIMITER_HEADERS_LEGACY_RESET", "delta"),
        ]);
        let mut headers = HeaderMap::new();
        apply_headers_told(&mut headers, &allowed, &d.settings().headers, None, Some(7));
        let get = |n: &str| headers.get(n).and_then(|v| v.to_str().ok()).unwrap_or("");
        assert_eq!(get("x-ratelimit-reset"), "7", "{standard}: {headers:?}");
        match standard {
            "draft-6" => assert_eq!(get("ratelimit-reset"), "7", "{headers:?}"),
            "draft-7" => assert!(get("ratelimit").ends_with("reset=7"), "{headers:?}"),
            _ => {
                let v = get("ratelimit");
                assert_eq!(v.matches(";t=7;").count(), 2, "{v}");
            }
        }
    }
}
