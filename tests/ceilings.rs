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
