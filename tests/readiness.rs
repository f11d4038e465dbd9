//! `/readyz` against the real binary: a store that does not answer (a real `redis-server`,
//! stopped) leaves the instance ready and is reported on its own; a signal to stop makes it
//! unready at once while the listeners still serve for the drain delay; a key set that cannot
//! be fetched at start is reported as verified identity unavailable. Skipped without
//! redis-server (failed instead when `CI` is set).

mod common;
mod identity_support;
mod redis_support;

use common::{unpooled_client as client, Gateway, Launch, PATIENCE};
use std::time::{Duration, Instant};
use wiremock::matchers::path;
use wiremock::{Mock, MockServer, ResponseTemplate};

const HEARTBEAT: &str = "/api/agent/heartbeat";
const ROTATE: &str = "/api/agent/rotate-key";
/// A dashboard route: `ui`, keyed on the verified user, or on the IP without one.
const UI: &str = "/api/agents";

/// `/readyz` as its status code and JSON body.
async fn readyz(gw: &Gateway) -> (u16, serde_json::Value) {
    let res = client()
        .get(gw.admin("/readyz"))
        .send()
        .await
        .expect("GET /readyz");
    let status = res.status().as_u16();
    (status, res.json().await.expect("/readyz is JSON"))
}

async fn store_healthz(gw: &Gateway) -> (u16, serde_json::Value) {
    let res = client()
        .get(gw.admin("/healthz/store"))
        .send()
        .await
        .expect("GET /healthz/store");
    let status = res.status().as_u16();
    (status, res.json().await.expect("/healthz/store is JSON"))
}

/// Ask `/readyz` until `done` holds for its answer, and return that answer.
async fn readyz_until(
    gw: &Gateway,
    what: &str,
    done: impl Fn(u16, &serde_json::Value) -> bool,
) -> (u16, serde_json::Value) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let (status, body) = readyz(gw).await;
        if done(status, &body) {
            return (status, body);
        }
        assert!(
            Instant::now() < deadline,
            "{what}: /readyz still answers {status} {body}; log:\n{}",
            gw.stderr()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn send(gw: &Gateway, method: reqwest::Method, p: &str) -> u16 {
    client()
        .request(method, gw.url(p))
        .header("x-agent-id", "agent-ready-1")
        .send()
        .await
        .expect("request through the gateway")
        .status()
        .as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_stopped_and_the_default_answer_readyz_is_200_and_says_the_store_is_down() {
    let Some(mut redis) = redis_support::own_server() else {
        return;
    };
    let up = redis_support::upstream();
    let gw = Launch::serve()
        .upstream(&up)
        .admin()
        .log("info")
        .env("FLEET_LIMITER_STORE_URL", redis.url())
        .spawn();
    let (status, ready) = readyz(&gw).await;
    assert_eq!(status, 200, "{ready}");
    assert_eq!(ready["ready"], true, "{ready}");
    assert_eq!(ready["store"], "redis", "{ready}");
    assert_eq!(ready["store_up"], true, "{ready}");
    assert_eq!(ready["store_error"], serde_json::Value::Null, "{ready}");
    assert_eq!(ready["draining"], false, "{ready}");
    assert!(
        ready["on_store_error"]["deny"]
            .as_array()
            .is_some_and(Vec::is_empty),
        "every built-in limiter allows while the store is down: {ready}"
    );
    assert_eq!(store_healthz(&gw).await.0, 200);

    redis.stop();
    let (status, ready) = readyz_until(&gw, "the store reported down", |_, b| {
        b["store_up"] == false
    })
    .await;
    assert_eq!(status, 200, "a store outage is not the instance's: {ready}");
    assert_eq!(ready["ready"], true, "{ready}");
    let why = ready["store_error"].as_str().unwrap_or_default();
    assert!(why.contains("redis"), "the reason is given: {ready}");
    assert_eq!(ready["error"], serde_json::Value::Null, "{ready}");
    let (status, store) = store_healthz(&gw).await;
    assert_eq!(status, 503, "{store}");
    assert_eq!(store["up"], false, "{store}");
    assert_eq!(store["store"], "redis", "{store}");
    // What readiness says is what happens: the instance serves, unmetered.
    for _ in 0..3 {
        assert_eq!(send(&gw, reqwest::Method::POST, HEARTBEAT).await, 200);
    }
    assert!(
        gw.metric(
            r#"fleet_limiter_decisions_total{limiter="agent-device",outcome="store_error_allowed"}"#
        )
        .await
        .is_some_and(|v| v >= 3.0),
        "the requests were answered by on_store_error"
    );

    redis.start();
    let (status, ready) = readyz_until(&gw, "the store reported up again", |_, b| {
        b["store_up"] == true
    })
    .await;
    assert_eq!(status, 200, "{ready}");
    assert_eq!(ready["store_error"], serde_json::Value::Null, "{ready}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_never_reached_with_a_deny_limiter_is_a_refusal_not_unreadiness() {
    // Nothing listens at the store's address: the gateway starts, and has never connected.
    let dead = common::dead_addr();
    let up = redis_support::upstream();
    let gw = Launch::serve()
        .upstream(&up)
        .admin()
        .env("FLEET_LIMITER_STORE_URL", format!("redis://{dead}"))
        .env("FLEET_LIMITER_LIMITER_KEY_ROTATION_ON_STORE_ERROR", "deny")
        .spawn();
    let (status, ready) = readyz(&gw).await;
    assert_eq!(status, 200, "{ready}");
    assert_eq!(ready["ready"], true, "{ready}");
    assert_eq!(ready["store_up"], false, "{ready}");
    assert!(
        ready["store_error"]
            .as_str()
            .is_some_and(|e| e.contains("not connected")),
        "{ready}"
    );
    assert_eq!(
        ready["on_store_error"]["deny"],
        serde_json::json!(["key-rotation"]),
        "{ready}"
    );
    assert!(ready["on_store_error"]["allow"]
        .as_array()
        .is_some_and(|a| a.iter().any(|n| n == "agent-device")));
    // The deny limiter refuses its own route, as configured, with a 503 (the server's failure,
    // not the client's budget); every other route is served.
    assert_eq!(send(&gw, reqwest::Method::POST, ROTATE).await, 503);
    assert_eq!(send(&gw, reqwest::Method::POST, HEARTBEAT).await, 200);
    assert_eq!(store_healthz(&gw).await.0, 503);
}

/// One answer of a `deny` limiter whose store is down, as a client reads it.
#[derive(Debug, PartialEq, Eq)]
struct StoreDown {
    retry_after: u64,
    /// `RateLimit-Reset` (draft 6) and `X-RateLimit-Reset` (in seconds).
    resets: (Option<u64>, Option<u64>),
    remaining: Option<u64>,
    problem: serde_json::Value,
}

fn number(res: &reqwest::Response, name: &str) -> Option<u64> {
    res.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

/// Read a 503 of a store that cannot answer; fails on anything else.
async fn store_down(res: reqwest::Response, who: &str) -> StoreDown {
    assert_eq!(
        res.status(),
        503,
        "{who}: never a 429 for a store's failure"
    );
    let retry_after = number(&res, "retry-after").expect("Retry-After in seconds");
    let resets = (
        number(&res, "ratelimit-reset"),
        number(&res, "x-ratelimit-reset"),
    );
    let remaining = number(&res, "ratelimit-remaining");
    let problem: serde_json::Value = res.json().await.expect("problem+json");
    StoreDown {
        retry_after,
        resets,
        remaining,
        problem,
    }
}

/// `on_store_error = "deny"` with the store down is the server's failure: 503 with a problem
/// of its own, never 429; each client is told a wait of its own over [w, 2w] (w = the
/// emission interval a 429 would say: key-rotation's 3 in 15 minutes, 300 s), the same one on
/// every asking, and every reset the limit headers send says it. The decision endpoint tells
/// a client the same wait the gateway does (nginx's path carries it as 403, Envoy's as 429,
/// each with the status in a header), and the metrics count these apart from spent budgets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deny_limiter_with_its_store_down_answers_each_client_503_with_a_wait_of_its_own() {
    let dead = common::dead_addr();
    let up = redis_support::upstream();
    let gw = Launch::serve()
        .upstream(&up)
        .admin()
        .decision()
        .args(["--trust-proxy", "127.0.0.1"])
        .env("FLEET_LIMITER_DECISION_ALLOW_FROM", "127.0.0.1")
        .env("FLEET_LIMITER_STORE_URL", format!("redis://{dead}"))
        .env("FLEET_LIMITER_LIMITER_KEY_ROTATION_ON_STORE_ERROR", "deny")
        .env("FLEET_LIMITER_HEADERS_STANDARD", "draft-6")
        .env("FLEET_LIMITER_HEADERS_LEGACY_RESET", "delta")
        .spawn();
    let http = client();
    let ask = |i: usize| {
        http.post(gw.url(ROTATE))
            .header("x-forwarded-for", format!("198.51.100.{i}"))
            .header("x-agent-id", format!("agent-{i}"))
            .send()
    };
    let mut told = std::collections::BTreeMap::<u64, u32>::new();
    let mut waits = Vec::new();
    for i in 1..=100 {
        let who = format!("client {i}");
        let first = store_down(ask(i).await.expect("an answer"), &who).await;
        assert!((300..=600).contains(&first.retry_after), "{who}: {first:?}");
        assert_eq!(
            first.resets,
            (Some(first.retry_after), Some(first.retry_after)),
            "{who}: every reset is Retry-After: {first:?}"
        );
        assert_eq!(first.remaining, Some(0), "{who}: {first:?}");
        let p = &first.problem;
        assert_eq!(
            p["type"], "urn:fleet-limiter:problem:store-unavailable",
            "{p}"
        );
        assert_eq!(p["title"], "Service Unavailable", "{p}");
        assert_eq!(p["status"], 503, "{p}");
        assert_eq!(p["retry_after"], first.retry_after, "{p}");
        let said = format!("retry after {} seconds", first.retry_after);
        assert!(
            p["detail"].as_str().is_some_and(|d| d.contains(&said)),
            "{p}"
        );
        let again = store_down(ask(i).await.expect("an answer"), &who).await;
        assert_eq!(again, first, "{who}: the same wait on every asking");
        *told.entry(first.retry_after).or_default() += 1;
        waits.push(first.retry_after);
    }
    eprintln!(
        "100 clients were told {} distinct waits, from {:?} to {:?} s",
        told.len(),
        told.keys().next(),
        told.keys().last()
    );
    assert!(told.len() >= 3, "{told:?}");
    // No one wait is told to most of the fleet.
    assert!(told.values().all(|&n| n <= 10), "{told:?}");
    // The decision endpoint, asked about the same clients, tells each the gateway's wait.
    let decision = gw.decision_addr.expect("the decision listener");
    for (i, want) in waits.iter().enumerate().take(10).map(|(i, w)| (i + 1, *w)) {
        let res = http
            .get(format!("http://{decision}/caddy"))
            .header("x-forwarded-method", "POST")
            .header("x-forwarded-uri", ROTATE)
            .header("x-forwarded-for", format!("198.51.100.{i}"))
            .header("x-agent-id", format!("agent-{i}"))
            .send()
            .await
            .expect("the decision endpoint answers");
        let got = store_down(res, &format!("/caddy, client {i}")).await;
        assert_eq!(got.retry_after, want, "client {i}");
        let res = http
            .get(format!("http://{decision}/nginx"))
            .header("x-original-method", "POST")
            .header("x-original-uri", ROTATE)
            .header("x-forwarded-for", format!("198.51.100.{i}"))
            .header("x-agent-id", format!("agent-{i}"))
            .send()
            .await
            .expect("the decision endpoint answers");
        assert_eq!(res.status(), 403, "nginx passes on only 401 and 403");
        assert_eq!(res.headers()["x-fleetlimiter-status"], "503");
        assert_eq!(number(&res, "retry-after"), Some(want), "client {i}");
        // Envoy's ext_authz takes a 5xx for its own failure (403, or let through under
        // failure_mode_allow): the refusal goes back as 429, saying 503 beside it.
        let res = http
            .post(format!("http://{decision}/envoy{ROTATE}"))
            .header("x-forwarded-for", format!("198.51.100.{i}"))
            .header("x-agent-id", format!("agent-{i}"))
            .send()
            .await
            .expect("the decision endpoint answers");
        assert_eq!(res.status(), 429, "client {i}");
        assert_eq!(res.headers()["x-fleetlimiter-status"], "503");
        assert_eq!(number(&res, "retry-after"), Some(want), "client {i}");
        assert_eq!(number(&res, "ratelimit-reset"), Some(want), "client {i}");
        let p: serde_json::Value = res.json().await.expect("problem+json");
        assert_eq!(
            p["type"], "urn:fleet-limiter:problem:store-unavailable",
            "{p}"
        );
    }
    assert_eq!(
        gw.metric(r#"fleet_limiter_requests_total{outcome="store_unavailable"}"#)
            .await,
        Some(230.0)
    );
    assert_eq!(
        gw.metric(r#"fleet_limiter_requests_total{outcome="refused"}"#)
            .await,
        Some(0.0)
    );
    assert_eq!(
        gw.metric(
            r#"fleet_limiter_decisions_total{limiter="key-rotation",outcome="store_error_refused"}"#
        )
        .await,
        Some(230.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn from_sigterm_readyz_is_503_while_the_listeners_keep_serving_for_the_drain_delay() {
    let up = redis_support::upstream();
    // A delay far longer than the test: the listeners are open for all of it, and a second
    // SIGTERM cuts it short.
    let mut gw = Launch::serve()
        .upstream(&up)
        .admin()
        .log("info")
        .args(["--drain-delay", "10m"])
        .spawn();
    assert_eq!(readyz(&gw).await.0, 200);
    gw.signal("TERM");
    let (status, ready) = readyz_until(&gw, "draining", |s, _| s == 503).await;
    assert_eq!(status, 503);
    assert_eq!(ready["ready"], false, "{ready}");
    assert_eq!(ready["draining"], true, "{ready}");
    assert!(
        ready["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("draining")),
        "{ready}"
    );
    // Still alive, and still serving new connections and requests.
    let health = client()
        .get(gw.admin("/healthz"))
        .send()
        .await
        .expect("GET /healthz");
    assert_eq!(
        health.status(),
        200,
        "liveness does not fail while draining"
    );
    for _ in 0..3 {
        assert_eq!(send(&gw, reqwest::Method::POST, HEARTBEAT).await, 200);
    }
    assert!(gw.is_running());
    gw.signal("TERM");
    let status = gw.wait_exit().await;
    assert_eq!(status.code(), Some(0), "log:\n{}", gw.stderr());
    let log = gw.stderr();
    assert!(log.contains("drain delay cut short"), "{log}");
    assert!(log.contains("/readyz answers 503"), "{log}");
}

/// An upstream whose `/slow` answers after 15 s, and which says when a request has arrived.
async fn slow_upstream() -> MockServer {
    let server = MockServer::start().await;
    Mock::given(path("/slow"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_string("slow answer")
                .set_delay(Duration::from_secs(15)),
        )
        .mount(&server)
        .await;
    server
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn during_the_grace_readyz_is_503_the_listeners_are_closed_and_in_flight_requests_finish() {
    let up = slow_upstream().await;
    let mut gw = Launch::serve()
        .upstream(&up.uri())
        .admin()
        .args(["--drain-delay", "1s", "--shutdown-grace", "1m"])
        .spawn();
    let url = gw.url("/slow");
    let in_flight = tokio::spawn(async move { client().get(url).send().await });
    let deadline = Instant::now() + PATIENCE;
    while common::received(&up).await == 0 {
        assert!(
            Instant::now() < deadline,
            "the request never reached the upstream"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    gw.signal("TERM");
    readyz_until(&gw, "draining", |s, b| s == 503 && b["draining"] == true).await;
    // After the delay the traffic listener closes; the admin listener still says why.
    let deadline = Instant::now() + PATIENCE;
    while std::net::TcpStream::connect(gw.addr).is_ok() {
        assert!(
            Instant::now() < deadline,
            "the traffic listener never closed; log:\n{}",
            gw.stderr()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, ready) = readyz(&gw).await;
    assert_eq!(status, 503, "{ready}");
    let res = in_flight
        .await
        .expect("task")
        .expect("the in-flight request completes");
    assert_eq!(res.status(), 200);
    assert_eq!(res.text().await.expect("body"), "slow answer");
    assert_eq!(gw.wait_exit().await.code(), Some(0), "{}", gw.stderr());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_drain_delay_is_logged_and_sigint_skips_it() {
    let up = redis_support::upstream();
    let mut gw = Launch::serve()
        .upstream(&up)
        .admin()
        .log("info")
        .unset("FLEET_LIMITER_DRAIN_DELAY")
        .spawn();
    gw.signal("TERM");
    readyz_until(&gw, "draining", |s, _| s == 503).await;
    assert_eq!(gw.wait_exit().await.code(), Some(0), "{}", gw.stderr());
    let log = gw.stderr();
    assert!(log.contains("drain_delay_seconds=5"), "{log}");

    // SIGINT (someone at a terminal) closes the listeners at once: no delay is logged.
    let mut gw = Launch::serve()
        .upstream(&up)
        .admin()
        .log("info")
        .unset("FLEET_LIMITER_DRAIN_DELAY")
        .spawn();
    gw.signal("INT");
    assert_eq!(gw.wait_exit().await.code(), Some(0), "{}", gw.stderr());
    let log = gw.stderr();
    assert!(!log.contains("drain_delay_seconds"), "{log}");
    assert!(log.contains("SIGINT"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_decision_endpoint_alone_is_unready_from_sigterm_too() {
    let mut gw = Launch::serve()
        .decision_only()
        .admin()
        .env("FLEET_LIMITER_TRUST_PROXY", "127.0.0.1")
        .env("FLEET_LIMITER_DECISION_ALLOW_FROM", "127.0.0.1")
        .args(["--drain-delay", "10m"])
        .spawn();
    assert_eq!(readyz(&gw).await.0, 200);
    gw.signal("TERM");
    readyz_until(&gw, "draining", |s, _| s == 503).await;
    let asked = client()
        .get(gw.url("/forward"))
        .header("x-forwarded-method", "POST")
        .header("x-forwarded-uri", HEARTBEAT)
        .header("x-forwarded-for", "203.0.113.9")
        .header("x-agent-id", "agent-ready-2")
        .send()
        .await
        .expect("ask the decision endpoint while draining");
    assert_eq!(asked.status(), 200, "still answering during the delay");
    gw.signal("INT");
    assert_eq!(gw.wait_exit().await.code(), Some(0), "{}", gw.stderr());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_set_not_fetched_at_start_is_an_error_and_identity_unavailable_until_it_is() {
    // The key set's address is taken now and served later.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    let up = redis_support::upstream();
    let gw = Launch::serve()
        .upstream(&up)
        .admin()
        .log("info")
        .env("FLEET_LIMITER_JWKS_URL", format!("http://{addr}/jwks.json"))
        .env("FLEET_LIMITER_JWKS_REFRESH_INTERVAL", "1s")
        .env("FLEET_LIMITER_LIMITER_UI_LIMIT", "1")
        .env("FLEET_LIMITER_LIMITER_UI_ALGORITHM", "fixed-window")
        .spawn();
    let log = gw.stderr();
    let line = log
        .lines()
        .find(|l| l.contains("could not be fetched at start"))
        .unwrap_or_else(|| panic!("no start-up error line:\n{log}"));
    assert!(line.contains("ERROR"), "logged at error level: {line}");
    assert!(line.contains("identity.jwks_url"), "{line}");
    let (status, ready) = readyz(&gw).await;
    assert_eq!(status, 200, "degraded, not down: {ready}");
    assert_eq!(ready["identity"], "unavailable", "{ready}");
    assert!(
        ready["identity_error"]
            .as_str()
            .is_some_and(|e| !e.is_empty()),
        "{ready}"
    );
    // Dashboard requests are keyed on the IP meanwhile: with the IP's bucket of one spent, a
    // token of the issuer does not verify and is refused from it.
    let http = client();
    let token = identity_support::sign(
        Some("key-a"),
        identity_support::RSA_A,
        &identity_support::claims("user_alice"),
    );
    let cookie = identity_support::Via::Cookie("__session");
    let anonymous = identity_support::Via::Nothing;
    assert_eq!(
        identity_support::get(&http, &gw.url(UI), "", anonymous).await,
        200
    );
    assert_eq!(
        identity_support::get(&http, &gw.url(UI), &token, cookie).await,
        429
    );

    // The issuer comes up on that address: the key set is fetched without a token asking.
    let listener = std::net::TcpListener::bind(addr).expect("bind the key set's address again");
    let jwks = MockServer::builder().listener(listener).start().await;
    identity_support::publish(&jwks, &["a"]).await;
    let (status, ready) = readyz_until(&gw, "identity available", |_, b| {
        b["identity"] == "available"
    })
    .await;
    assert_eq!(status, 200, "{ready}");
    assert_eq!(ready["identity_error"], serde_json::Value::Null, "{ready}");
    assert!(identity_support::jwks_hits(&jwks).await >= 1);
    assert!(
        gw.stderr().contains("verified identity is available again"),
        "{}",
        gw.stderr()
    );
    // Now the token verifies: a user of its own, not the spent IP bucket.
    assert_eq!(
        identity_support::get(&http, &gw.url(UI), &token, cookie).await,
        200
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_is_off_without_a_key_source_and_available_with_a_fetched_key_set() {
    let up = redis_support::upstream();
    let gw = Launch::serve().upstream(&up).admin().spawn();
    let (_, ready) = readyz(&gw).await;
    assert_eq!(ready["identity"], "off", "{ready}");
    drop(gw);
    let jwks = MockServer::start().await;
    identity_support::publish(&jwks, &["a"]).await;
    let gw = Launch::serve()
        .upstream(&up)
        .admin()
        .env(
            "FLEET_LIMITER_JWKS_URL",
            format!("{}/jwks.json", jwks.uri()),
        )
        .spawn();
    let (status, ready) = readyz(&gw).await;
    assert_eq!(status, 200, "{ready}");
    assert_eq!(ready["identity"], "available", "{ready}");
    assert_eq!(
        identity_support::jwks_hits(&jwks).await,
        1,
        "fetched at start"
    );
}

/// `store.require = true`: with nothing listening at `store.url`, `serve` exits 2 naming the
/// setting, the file and both ways on (without it, the same gateway starts and stays ready);
/// with a real Redis, `/readyz` answers 503 while it is stopped and 200 again once it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_store_require_serve_refuses_to_start_without_redis_and_readyz_follows_it() {
    let up = redis_support::upstream();
    let nowhere = format!("redis://{}", common::dead_addr());
    let required = format!("[store]\nurl = \"{nowhere}\"\nrequire = true\n");
    let refused = match Launch::serve()
        .upstream(&up)
        .admin()
        .config_toml(required)
        .try_spawn()
    {
        Ok(gw) => panic!("started without its required store:\n{}", gw.stderr()),
        Err(exited) => exited,
    };
    assert_eq!(refused.code, Some(2), "{}", refused.stderr);
    for says in [
        "fleet-limiter.toml: store.url: the Redis store",
        "cannot be reached",
        "store.require = true (set in ",
        "start Redis or correct store.url, or remove store.require",
    ] {
        assert!(refused.stderr.contains(says), "{says}: {}", refused.stderr);
    }
    // The same store, not required: the gateway starts, ready, the store reported down.
    let gw = Launch::serve()
        .upstream(&up)
        .admin()
        .config_toml(format!("[store]\nurl = \"{nowhere}\"\n"))
        .spawn();
    let (status, ready) = readyz(&gw).await;
    assert_eq!(status, 200, "{ready}");
    assert_eq!(ready["store_up"], false, "{ready}");
    drop(gw);

    let Some(mut redis) = redis_support::own_server() else {
        return;
    };
    let gw = Launch::serve()
        .upstream(&up)
        .admin()
        .config_toml(format!(
            "[store]\nurl = \"{}\"\nrequire = true\n",
            redis.url()
        ))
        .spawn();
    let (status, ready) = readyz(&gw).await;
    assert_eq!(status, 200, "{ready}");
    assert_eq!(ready["ready"], true, "{ready}");
    redis.stop();
    let (status, ready) =
        readyz_until(&gw, "unready while the store is down", |s, _| s == 503).await;
    assert_eq!(ready["ready"], false, "{ready}");
    assert_eq!(ready["store_up"], false, "{ready}");
    assert_eq!(ready["draining"], false, "{ready}");
    let why = ready["error"].as_str().unwrap_or_default();
    assert!(why.contains("store.require = true"), "{ready}");
    assert_eq!(status, 503);
    redis.start();
    let (_, ready) = readyz_until(&gw, "ready again once the store answers", |s, _| s == 200).await;
    assert_eq!(ready["store_up"], true, "{ready}");
    assert_eq!(ready["error"], serde_json::Value::Null, "{ready}");
}
