//! The audit's second ceilings against the real binary over HTTP: a lockout that refuses a key
//! for its whole length (memory and Redis, across a gateway restart), refusals that do not say
//! which limiter fired (`disclose = false`), and keys read from the request body
//! (`key = "body:<field>"`) with the body forwarded byte for byte.

mod common;
mod redis_support;

use common::{Gateway, Launch};
use std::time::Duration;
use wiremock::matchers::path;
use wiremock::{Mock, MockServer, ResponseTemplate};

/// `/auth/login` answers 401 (a wrong password) unless told otherwise; anything else 200.
async fn login_upstream() -> MockServer {
    let upstream = common::upstream().await;
    Mock::given(path("/auth/login"))
        .respond_with(ResponseTemplate::new(401))
        .with_priority(1)
        .mount(&upstream)
        .await;
    upstream
}

/// A limiter name no earlier run on a shared Redis used.
fn unique(prefix: &str) -> String {
    format!("{prefix}-{:08x}", rand::random::<u32>())
}

fn gateway(toml: &str, upstream: &str) -> Gateway {
    Launch::serve()
        .config_toml(toml)
        .upstream(upstream)
        .admin()
        .spawn()
}

/// Status and `Retry-After` (in seconds) of a POST of `body` to `p`.
async fn post(gw: &Gateway, p: &str, body: &str) -> (u16, Option<u64>) {
    let res = common::client()
        .post(gw.url(p))
        .header("content-type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .expect("request");
    let retry = res
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    (res.status().as_u16(), retry)
}

/// The audit's attempt ceiling keyed on the address: five wrong answers, then a lock.
fn attempts(name: &str, lockout: &str, store: &str) -> String {
    format!(
        "{store}\n[limiters.{name}]\nlimit = 5\nwindow = \"10m\"\nkey = \"ip\"\nroutes = [\"POST /auth/login\"]\ncount = \"failed\"\nlockout = \"{lockout}\"\n"
    )
}

/// Five failed answers pass; the sixth request is refused with the whole lockout as its wait,
/// and every request after it is refused, its wait counting down, never reset by the refusals.
async fn five_failures_then_a_lock(gw: &Gateway, upstream: &MockServer) {
    for i in 0..5 {
        assert_eq!(
            post(gw, "/auth/login", "{}").await,
            (401, None),
            "attempt {i}"
        );
    }
    let started = std::time::Instant::now();
    assert_eq!(
        post(gw, "/auth/login", "{}").await,
        (429, Some(600)),
        "the sixth locks for the whole lockout"
    );
    let mut last = 600;
    for i in 0..3 {
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let (status, retry) = post(gw, "/auth/login", "{}").await;
        let retry = retry.expect("a refusal carries Retry-After");
        let elapsed = started.elapsed().as_secs();
        assert_eq!(status, 429, "still locked ({i})");
        assert!(
            retry < last && retry <= 600 - elapsed && retry >= 599 - elapsed,
            "Retry-After counts the lock down: {retry} after {elapsed} s (before: {last})"
        );
        last = retry;
    }
    assert_eq!(
        common::received(upstream).await,
        5,
        "no refused attempt reaches the upstream"
    );
}

#[tokio::test]
async fn memory_five_failed_answers_lock_the_key_for_the_lockout() {
    let upstream = login_upstream().await;
    let gw = gateway(&attempts(&unique("login"), "10m", ""), &upstream.uri());
    five_failures_then_a_lock(&gw, &upstream).await;
}

#[tokio::test]
async fn a_lock_ends_with_a_full_bucket() {
    let upstream = login_upstream().await;
    let gw = gateway(&attempts(&unique("login"), "2s", ""), &upstream.uri());
    for i in 0..5 {
        assert_eq!(post(&gw, "/auth/login", "{}").await.0, 401, "attempt {i}");
    }
    let (status, retry) = post(&gw, "/auth/login", "{}").await;
    assert_eq!((status, retry), (429, Some(2)));
    // A GCRA budget of 5 per 10 minutes would give one attempt back after two minutes; the
    // lock ends after two seconds, and then the key has its whole budget.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    for i in 0..5 {
        assert_eq!(post(&gw, "/auth/login", "{}").await.0, 401, "again {i}");
    }
    assert_eq!(post(&gw, "/auth/login", "{}").await, (429, Some(2)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_lock_outlives_the_gateway_that_set_it() {
    let Some(redis) = redis_support::standalone() else {
        return;
    };
    let upstream = login_upstream().await;
    let store = format!("[store]\nurl = \"{}\"\ntimeout = \"2s\"", redis.url());
    let toml = attempts(&unique("login"), "10m", &store);
    let gw = gateway(&toml, &upstream.uri());
    five_failures_then_a_lock(&gw, &upstream).await;
    let locked_at = std::time::Instant::now();
    drop(gw);
    // A new gateway on the same Redis: the lock is there, counting down from where it was.
    let gw = gateway(&toml, &upstream.uri());
    let (status, retry) = post(&gw, "/auth/login", "{}").await;
    let retry = retry.expect("Retry-After");
    assert_eq!(status, 429);
    assert!(
        retry <= 597 && retry + locked_at.elapsed().as_secs() >= 590,
        "the lock outlived the gateway: Retry-After {retry}"
    );
    assert_eq!(common::received(&upstream).await, 5);
}

/// A refusal as the client sees it: status, every header but `date` (name and value, the
/// number of seconds in `retry-after` apart), and the body with its numbers blanked.
#[derive(Debug, PartialEq)]
struct Refusal {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
    retry_after: u64,
}

async fn refusal(res: reqwest::Response) -> Refusal {
    let status = res.status().as_u16();
    let mut retry_after = 0;
    let mut headers: Vec<(String, String)> = res
        .headers()
        .iter()
        .filter(|(n, _)| n.as_str() != "date")
        .map(|(n, v)| {
            let v = v.to_str().unwrap_or("?").to_owned();
            if n.as_str() == "retry-after" {
                retry_after = v.parse().unwrap_or(0);
                (n.to_string(), "N".to_owned())
            } else {
                (n.to_string(), v)
            }
        })
        .collect();
    headers.sort();
    let body = res.text().await.expect("body");
    let body: String = body
        .split(|c: char| c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join("N");
    Refusal {
        status,
        headers,
        body,
        retry_after,
    }
}

/// Source and target ceilings of one route, both anonymous, with the same budget: `src` keyed
/// on the address, `dst` on `key`.
fn two_ceilings(key: &str, disclose: bool) -> String {
    format!(
        "[client_ip]\ntrust_proxy = [\"127.0.0.1/32\"]\n[headers]\nstandard = \"draft-10\"\n\
         [limiters.src]\nlimit = 2\nwindow = \"1h\"\nkey = \"ip\"\nroutes = [\"POST /auth/email\"]\ndisclose = {disclose}\n\
         [limiters.dst]\nlimit = 2\nwindow = \"1h\"\nkey = \"{key}\"\nroutes = [\"POST /auth/email\"]\ndisclose = {disclose}\n"
    )
}

/// A POST to `/auth/email` from `source` (named by the trusted proxy) for `recipient` (in the
/// `X-Recipient` header the proxy sets, and as the JSON body's `email`).
async fn send(gw: &Gateway, source: &str, recipient: &str) -> reqwest::Response {
    common::client()
        .post(gw.url("/auth/email"))
        .header("x-forwarded-for", source)
        .header("x-recipient", recipient)
        .header("content-type", "application/json")
        .body(format!(r#"{{"email":"{recipient}"}}"#))
        .send()
        .await
        .expect("request")
}

/// The refusal when the source's ceiling fires (one source, fresh recipients), and when the
/// recipient's does (fresh sources, one recipient).
async fn refusals_of_each(gw: &Gateway) -> (Refusal, Refusal) {
    for i in 0..2 {
        let r = send(gw, "198.51.100.1", &format!("r{i}@example.com")).await;
        assert_eq!(r.status(), 200);
    }
    let by_source = refusal(send(gw, "198.51.100.1", "r9@example.com").await).await;
    for i in 0..2 {
        let r = send(gw, &format!("203.0.113.{i}"), "victim@example.com").await;
        assert_eq!(r.status(), 200);
    }
    let by_target = refusal(send(gw, "203.0.113.9", "victim@example.com").await).await;
    (by_source, by_target)
}

#[tokio::test]
async fn a_refusal_by_either_anonymous_ceiling_is_the_same_answer() {
    let upstream = common::upstream().await;
    let gw = gateway(&two_ceilings("header:x-recipient", false), &upstream.uri());
    let (by_source, by_target) = refusals_of_each(&gw).await;
    assert_eq!(by_source.status, 429);
    assert!(
        (1799..=1800).contains(&by_source.retry_after)
            && (1799..=1800).contains(&by_target.retry_after),
        "Retry-After from the buckets: {} and {}",
        by_source.retry_after,
        by_target.retry_after
    );
    let names: Vec<&str> = by_source.headers.iter().map(|(n, _)| n.as_str()).collect();
    assert!(
        !names.iter().any(|n| n.contains("ratelimit")),
        "no limit header: {names:?}"
    );
    assert!(!by_source.body.contains("src") && !by_source.body.contains("dst"));
    assert_eq!(
        Refusal {
            retry_after: 0,
            ..by_source
        },
        Refusal {
            retry_after: 0,
            ..by_target
        },
        "the same answer whichever ceiling refused"
    );
    // Allowed answers name neither.
    let ok = send(&gw, "192.0.2.1", "other@example.com").await;
    assert_eq!(ok.status(), 200);
    assert!(ok
        .headers()
        .keys()
        .all(|n| !n.as_str().contains("ratelimit")));
}

#[tokio::test]
async fn disclosing_ceilings_tell_which_refused() {
    // The control: with disclose on (the default), the two refusals differ by name.
    let upstream = common::upstream().await;
    let gw = gateway(&two_ceilings("header:x-recipient", true), &upstream.uri());
    let (by_source, by_target) = refusals_of_each(&gw).await;
    let limits = |r: &Refusal| {
        r.headers
            .iter()
            .find(|(n, _)| n == "ratelimit")
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    assert!(limits(&by_source).contains("\"src\";r=0"), "{by_source:?}");
    assert!(limits(&by_target).contains("\"dst\";r=0"), "{by_target:?}");
    assert_ne!(
        Refusal {
            retry_after: 0,
            ..by_source
        },
        Refusal {
            retry_after: 0,
            ..by_target
        }
    );
}
