use super::*;
use crate::clock::ManualClock;
use crate::config::Loader;
use crate::decision::{Decider, KeyHeaders, RequestFacts};
use crate::identity::NoVerifier;
use crate::path::CanonicalPath;
use crate::store::memory::MemoryStore;

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
