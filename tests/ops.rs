//! Operating the real binary over HTTP: metrics, shadow mode, the global switch, live reload
//! (SIGHUP and POST /reload), rejected reloads, graceful shutdown, health, CORS headers.

mod common;

use common::{unpooled_client as client, Gateway, Launch};
use fleet_limiter::{principal_key, BucketKey, KeyKind};
use std::sync::Arc;
use std::time::Duration;
use wiremock::matchers::{method, path, path_regex};
use wiremock::{Mock, MockServer, ResponseTemplate};

async fn upstream() -> MockServer {
    let server = MockServer::start().await;
    Mock::given(path("/slow"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_string("slow answer")
                .set_delay(Duration::from_secs(3)),
        )
        .mount(&server)
        .await;
    Mock::given(path("/stuck"))
        .respond_with(ResponseTemplate::new(200).set_delay(Duration::from_secs(20)))
        .mount(&server)
        .await;
    Mock::given(method("OPTIONS"))
        .respond_with(
            ResponseTemplate::new(204)
                .insert_header("access-control-allow-origin", "http://dash.test")
                .insert_header("access-control-allow-methods", "GET, POST")
                .insert_header("access-control-allow-headers", "x-agent-id"),
        )
        .mount(&server)
        .await;
    Mock::given(path_regex("^/t/"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_string("ok")
                .insert_header("access-control-allow-origin", "http://dash.test")
                .insert_header("access-control-expose-headers", "X-Request-Id"),
        )
        .mount(&server)
        .await;
    server
}

/// Two custom limiters on their own routes (the built-in ones only meter `/api/**`).
fn config(upstream: &str, a_limit: u32, a_mode: &str, b_limit: u32) -> String {
    format!(
        r#"
[server]
upstream = "{upstream}"

[limiters.test-a]
limit = {a_limit}
window = "1h"
key = "ip"
routes = ["/t/a/**"]
mode = "{a_mode}"

[limiters.test-b]
limit = {b_limit}
window = "1m"
key = "ip+agent"
routes = ["/t/b/**"]

[limiters.test-b-ip]
limit = 1000
window = "1m"
key = "ip"
meter = "new-agents"
routes = ["/t/b/**"]
"#
    )
}

/// The real binary with this configuration file, its admin listener on a known port, and its
/// log at info level.
fn launch(toml: &str) -> Launch {
    Launch::serve().config_toml(toml).admin().log("info")
}

/// A gateway in front of `up` with [`config`] and these extra flags.
fn start(up: &MockServer, a_limit: u32, a_mode: &str, b_limit: u32, extra: &[&str]) -> Gateway {
    launch(&config(&up.uri(), a_limit, a_mode, b_limit))
        .args(extra.iter().copied())
        .spawn()
}

async fn get(gw: &Gateway, p: &str) -> reqwest::Response {
    client().get(gw.url(p)).send().await.expect("request")
}

/// A GET on the gateway from a page on `origin`.
async fn get_from(gw: &Gateway, p: &str, origin: &str) -> reqwest::Response {
    client()
        .get(gw.url(p))
        .header("origin", origin)
        .send()
        .await
        .expect("get")
}

/// A GET on the admin listener.
async fn admin_get(gw: &Gateway, p: &str) -> reqwest::Response {
    client()
        .get(gw.admin(p))
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {p} on the admin listener: {e}"))
}

/// `POST /reload` on the admin listener: the status and the JSON answer.
async fn post_reload(gw: &Gateway) -> (u16, serde_json::Value) {
    let res = client()
        .post(gw.admin("/reload"))
        .send()
        .await
        .expect("reload");
    let status = res.status().as_u16();
    (status, res.json().await.expect("json"))
}

/// Each sample of `/metrics` has exactly its expected value.
async fn assert_metrics(gw: &Gateway, expected: &[(&str, f64)]) {
    for (sample, value) in expected {
        assert_eq!(gw.metric(sample).await, Some(*value), "{sample}");
    }
}

/// Start a GET of `p` in the background and wait until the upstream holds it.
async fn in_flight(
    gw: &Gateway,
    up: &MockServer,
    p: &str,
) -> tokio::task::JoinHandle<reqwest::Result<reqwest::Response>> {
    let url = gw.url(p);
    let task = tokio::spawn(async move { client().get(url).send().await });
    let deadline = std::time::Instant::now() + common::PATIENCE;
    while up.received_requests().await.map_or(0, |r| r.len()) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the request never reached the upstream"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    task
}

fn header<'a>(res: &'a reqwest::Response, name: &str) -> &'a str {
    res.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

const A_ALLOWED: &str = r#"fleet_limiter_decisions_total{limiter="test-a",outcome="allowed"}"#;
const A_REFUSED: &str = r#"fleet_limiter_decisions_total{limiter="test-a",outcome="refused"}"#;
const A_SHADOW: &str =
    r#"fleet_limiter_decisions_total{limiter="test-a",outcome="shadow_refused"}"#;
const RELOADS_OK: &str = r#"fleet_limiter_config_reloads_total{result="ok"}"#;
const RELOADS_ERR: &str = r#"fleet_limiter_config_reloads_total{result="error"}"#;

#[tokio::test]
async fn metrics_move_when_decisions_happen_and_refusals_are_logged_by_digest() {
    let up = upstream().await;
    let gw = start(&up, 2, "enforce", 5, &["--log-format", "json"]);

    assert_eq!(
        gw.metric(A_ALLOWED).await,
        Some(0.0),
        "configured limiters show up at zero"
    );
    assert_eq!(gw.metric(A_REFUSED).await, Some(0.0));
    let statuses = [
        get(&gw, "/t/a/1").await.status().as_u16(),
        get(&gw, "/t/a/2").await.status().as_u16(),
        get(&gw, "/t/a/3").await.status().as_u16(),
    ];
    assert_eq!(statuses, [200, 200, 429]);
    let agent = client()
        .get(gw.url("/t/b/x"))
        .header("x-agent-id", "agent-secret-4711")
        .send()
        .await
        .expect("request");
    assert_eq!(agent.status(), 200);
    assert_eq!(
        get(&gw, "/unmetered").await.status(),
        404,
        "wiremock answers 404 to unknown paths"
    );

    // After the second request 0 of 2 remain: under 20% of the budget, so near_limit is 1.
    assert_metrics(
        &gw,
        &[
            (A_ALLOWED, 2.0),
            (A_REFUSED, 1.0),
            (
                r#"fleet_limiter_decisions_total{limiter="test-b",outcome="allowed"}"#,
                1.0,
            ),
            (r#"fleet_limiter_near_limit_total{limiter="test-a"}"#, 1.0),
            (r#"fleet_limiter_requests_total{outcome="refused"}"#, 1.0),
            (r#"fleet_limiter_requests_total{outcome="forwarded"}"#, 3.0),
            (r#"fleet_limiter_requests_total{outcome="unmetered"}"#, 1.0),
            ("fleet_limiter_decision_duration_seconds_count", 4.0),
            (
                r#"fleet_limiter_store_duration_seconds_count{store="memory"}"#,
                4.0,
            ),
            (
                r#"fleet_limiter_store_errors_total{store="memory",kind="timeout"}"#,
                0.0,
            ),
            (
                r#"fleet_limiter_store_errors_total{store="memory",kind="connection"}"#,
                0.0,
            ),
            // test-a's bucket, the agent's test-b bucket and its address's test-b-ip bucket.
            (r#"fleet_limiter_tracked_keys{store="memory"}"#, 3.0),
            (r#"fleet_limiter_evicted_keys_total{store="memory"}"#, 0.0),
            (
                r#"fleet_limiter_upstream_responses_total{status="200"}"#,
                3.0,
            ),
            (
                r#"fleet_limiter_upstream_responses_total{status="404"}"#,
                1.0,
            ),
            ("fleet_limiter_upstream_duration_seconds_count", 4.0),
        ],
    )
    .await;

    let page = admin_get(&gw, "/metrics").await;
    assert_eq!(
        header(&page, "content-type"),
        "text/plain; version=0.0.4; charset=utf-8"
    );

    // One refusal event, keyed by digest, with the client IP and the wait.
    let digest = BucketKey::new(
        Arc::from("test-a"),
        &principal_key(KeyKind::Ip, "127.0.0.1", None, None),
    )
    .digest_hex();
    let logs = gw.json_logs();
    let refusals: Vec<_> = logs
        .iter()
        .filter(|e| e["target"] == "fleet_limiter::refusal")
        .collect();
    assert_eq!(refusals.len(), 1, "{logs:#?}");
    let e = refusals[0];
    assert_eq!(e["limiter"], "test-a");
    assert_eq!(e["key"], digest.as_str());
    assert_eq!(e["client_ip"], "127.0.0.1");
    assert!(
        e["wait_seconds"]
            .as_u64()
            .is_some_and(|w| (1..=3600).contains(&w)),
        "{e}"
    );
    assert!(
        !gw.stderr().contains("agent-secret-4711"),
        "raw agent ids never reach the log"
    );
}

#[tokio::test]
async fn shadow_mode_never_refuses_but_counts_logs_and_reports() {
    let up = upstream().await;
    let gw = start(&up, 2, "shadow", 5, &["--log-format", "json"]);
    for i in 0..5 {
        let res = get(&gw, &format!("/t/a/{i}")).await;
        assert_eq!(res.status(), 200, "shadow mode forwards request {i}");
        assert_eq!(
            res.text().await.expect("body"),
            "ok",
            "the upstream answered"
        );
    }
    let res = get(&gw, "/t/a/last").await;
    assert_eq!(res.status(), 200);
    assert!(
        header(&res, "ratelimit-policy").contains("\"test-a\";q=2;w=3600"),
        "headers still added"
    );
    assert!(header(&res, "ratelimit").contains("\"test-a\";r=0"));
    assert!(res.headers().get("retry-after").is_none());

    assert_metrics(
        &gw,
        &[
            (A_ALLOWED, 2.0),
            (A_SHADOW, 4.0),
            (A_REFUSED, 0.0),
            (r#"fleet_limiter_requests_total{outcome="refused"}"#, 0.0),
            (
                r#"fleet_limiter_limiter_info{limiter="test-a",mode="shadow",limit="2",window_seconds="3600"}"#,
                1.0,
            ),
        ],
    )
    .await;
    let shadow_events = gw
        .json_logs()
        .into_iter()
        .filter(|e| e["target"] == "fleet_limiter::shadow")
        .count();
    assert_eq!(shadow_events, 4);
}

#[tokio::test]
async fn the_global_switch_forwards_everything_unmetered() {
    let up = upstream().await;
    let gw = launch(&config(&up.uri(), 1, "enforce", 1))
        .env("FLEET_LIMITER_ENABLED", "false")
        .spawn();
    for _ in 0..4 {
        let res = get(&gw, "/t/a/x").await;
        assert_eq!(res.status(), 200);
        assert!(res.headers().get("ratelimit").is_none());
    }
    assert_metrics(
        &gw,
        &[
            ("fleet_limiter_enabled", 0.0),
            (r#"fleet_limiter_requests_total{outcome="unmetered"}"#, 4.0),
            (A_ALLOWED, 0.0),
        ],
    )
    .await;
}

#[tokio::test]
async fn reload_by_sighup_and_post_changes_one_budget_and_keeps_every_bucket() {
    let up = upstream().await;
    let gw = start(&up, 10, "enforce", 3, &[]);
    for _ in 0..4 {
        assert_eq!(get(&gw, "/t/a/x").await.status(), 200);
    }
    for _ in 0..3 {
        assert_eq!(get(&gw, "/t/b/x").await.status(), 200);
    }
    assert_eq!(get(&gw, "/t/b/x").await.status(), 429, "test-b is spent");

    // SIGHUP: test-a's budget doubles; test-b is unchanged.
    gw.rewrite_config(&config(&up.uri(), 20, "enforce", 3));
    gw.signal("HUP");
    gw.wait_metric(RELOADS_OK, |v| v == 1.0).await;
    let res = get(&gw, "/t/a/x").await;
    assert_eq!(res.status(), 200);
    assert!(
        header(&res, "ratelimit-policy").contains("\"test-a\";q=20;w=3600"),
        "{res:?}"
    );
    // 4 requests at 360 s each were spent (1440 s of debt); at 180 s per request under the new
    // budget that debt plus this request leaves 11, where a reset bucket would leave 19.
    assert_eq!(
        header(&res, "x-ratelimit-remaining"),
        "11",
        "test-a kept its state"
    );
    assert_eq!(
        get(&gw, "/t/b/x").await.status(),
        429,
        "test-b was not reset"
    );

    // POST /reload: the same path, answered with what changed.
    gw.rewrite_config(&config(&up.uri(), 30, "enforce", 3));
    let (status, body) = post_reload(&gw).await;
    assert_eq!(status, 200);
    assert_eq!(body["reloaded"], true);
    assert_eq!(body["changed"], serde_json::json!(["test-a"]));
    let res = get(&gw, "/t/a/x").await;
    assert!(header(&res, "ratelimit-policy").contains("\"test-a\";q=30;w=3600"));
    assert_eq!(get(&gw, "/t/b/x").await.status(), 429, "test-b still spent");
    assert_metrics(
        &gw,
        &[
            (RELOADS_OK, 2.0),
            ("fleet_limiter_config_last_reload_successful", 1.0),
        ],
    )
    .await;
    assert!(gw.stderr().contains("configuration reloaded"));
}

#[tokio::test]
async fn an_invalid_reload_is_rejected_with_its_reason_and_the_old_config_stays() {
    let up = upstream().await;
    let gw = start(&up, 2, "enforce", 3, &[]);
    assert_eq!(get(&gw, "/t/a/x").await.status(), 200);

    gw.rewrite_config(&config(&up.uri(), 0, "enforce", 3));
    let (status, body) = post_reload(&gw).await;
    assert_eq!(status, 422);
    assert_eq!(body["reloaded"], false);
    let reason = body["error"].as_str().unwrap_or_default().to_owned();
    assert!(reason.contains("limiters.test-a.limit"), "{reason}");

    gw.rewrite_config("[server\nthis is not toml");
    gw.signal("HUP");
    gw.wait_metric(RELOADS_ERR, |v| v == 2.0).await;
    assert_eq!(
        gw.metric("fleet_limiter_config_last_reload_successful")
            .await,
        Some(0.0)
    );
    let log = gw.stderr();
    assert!(log.contains("configuration reload rejected"), "{log}");
    assert!(
        log.contains("limiters.test-a.limit"),
        "the log names the reason"
    );

    // The old budget of 2 still holds, with its state.
    let res = get(&gw, "/t/a/x").await;
    assert_eq!(res.status(), 200);
    assert!(header(&res, "ratelimit-policy").contains("\"test-a\";q=2;w=3600"));
    assert_eq!(get(&gw, "/t/a/x").await.status(), 429);
    assert_eq!(gw.metric(RELOADS_OK).await, Some(0.0));
}

#[tokio::test]
async fn a_reload_that_could_lock_agents_out_is_refused_and_the_old_config_stays() {
    let up = upstream().await;
    let gw = launch(&config(&up.uri(), 2, "enforce", 3))
        .unset("FLEET_LIMITER_ALLOW_UNSAFE_CALIBRATION")
        .spawn();
    assert_eq!(get(&gw, "/t/a/x").await.status(), 200);

    // Five enrollments an hour cannot admit the declared fleet's rollout burst.
    let unsafe_enrollment = "\n[limiters.enrollment]\nlimit = 5\n";
    gw.rewrite_config(&(config(&up.uri(), 20, "enforce", 3) + unsafe_enrollment));
    let (status, body) = post_reload(&gw).await;
    assert_eq!(status, 422);
    assert_eq!(body["reloaded"], false);
    let reason = body["error"].as_str().unwrap_or_default().to_owned();
    assert!(
        reason.starts_with("the calibration is unsafe for the declared fleet: enrollment: "),
        "{reason}"
    );

    gw.signal("HUP");
    gw.wait_metric(RELOADS_ERR, |v| v == 2.0).await;
    let log = gw.stderr();
    assert!(log.contains("configuration reload rejected"), "{log}");
    assert!(
        log.contains("the calibration is unsafe for the declared fleet"),
        "the log names the reason: {log}"
    );

    // The old budget of 2 still holds, with its state.
    let res = get(&gw, "/t/a/x").await;
    assert!(header(&res, "ratelimit-policy").contains("\"test-a\";q=2;w=3600"));
    assert_eq!(get(&gw, "/t/a/x").await.status(), 429);
    assert_eq!(gw.metric(RELOADS_OK).await, Some(0.0));
}

#[tokio::test]
async fn sigterm_drains_an_in_flight_slow_request_then_exits_zero() {
    let up = upstream().await;
    let mut gw = start(&up, 5, "enforce", 5, &["--shutdown-grace", "20s"]);
    // Wait until the upstream holds the request, then ask the gateway to stop.
    let in_flight = in_flight(&gw, &up, "/slow").await;
    gw.signal("TERM");
    let res = in_flight
        .await
        .expect("task")
        .expect("the in-flight request completes");
    assert_eq!(res.status(), 200);
    assert_eq!(res.text().await.expect("body"), "slow answer");
    let status = gw.wait_exit().await;
    assert_eq!(status.code(), Some(0), "log:\n{}", gw.stderr());
    assert!(gw.stderr().contains("SIGTERM"));
    assert!(
        std::net::TcpStream::connect(gw.addr).is_err(),
        "nothing listens after exit"
    );
}

#[tokio::test]
async fn health_and_readiness() {
    let up = upstream().await;
    let gw = start(&up, 5, "enforce", 5, &[]);
    assert_eq!(admin_get(&gw, "/healthz").await.status(), 200);
    let res = admin_get(&gw, "/readyz").await;
    assert_eq!(res.status(), 200);
    let body: serde_json::Value = res.json().await.expect("json");
    assert_eq!(body["ready"], true);
    assert_eq!(body["store"], "memory");
    // The admin listener is not the traffic port, and traffic paths are not admin paths.
    assert_eq!(admin_get(&gw, "/t/a/x").await.status(), 404);
    assert_ne!(
        admin_get(&gw, "/reload").await.status(),
        200,
        "reload is POST only"
    );
}

#[tokio::test]
async fn gateway_made_refusals_carry_cors_for_listed_origins_and_preflights_pass_unmetered() {
    let up = upstream().await;
    let toml = format!(
        "{}\n[cors]\nallowed_origins = [\"http://dash.test\"]\nallow_credentials = true\n",
        config(&up.uri(), 1, "enforce", 5)
    );
    let gw = launch(&toml).spawn();
    for _ in 0..3 {
        let res = client()
            .request(reqwest::Method::OPTIONS, gw.url("/t/a/x"))
            .header("origin", "http://dash.test")
            .header("access-control-request-method", "GET")
            .send()
            .await
            .expect("preflight");
        assert_eq!(res.status(), 204, "the upstream answers preflights");
        assert!(
            res.headers().get("ratelimit").is_none(),
            "preflights are not metered"
        );
    }
    let res = get_from(&gw, "/t/a/x", "http://dash.test").await;
    assert_eq!(res.status(), 200, "the preflights spent nothing");
    assert_eq!(
        header(&res, "access-control-allow-origin"),
        "http://dash.test",
        "upstream's own"
    );
    let exposed = header(&res, "access-control-expose-headers");
    assert!(
        exposed.starts_with("X-Request-Id, Retry-After, RateLimit"),
        "{exposed}"
    );

    let res = get_from(&gw, "/t/a/x", "http://dash.test").await;
    assert_eq!(res.status(), 429);
    assert_eq!(
        header(&res, "access-control-allow-origin"),
        "http://dash.test"
    );
    assert_eq!(header(&res, "access-control-allow-credentials"), "true");
    assert!(header(&res, "vary").contains("Origin"));
    assert!(header(&res, "access-control-expose-headers").contains("Retry-After"));
    assert!(!header(&res, "retry-after").is_empty());

    let res = get_from(&gw, "/t/a/x", "http://elsewhere.test").await;
    assert_eq!(res.status(), 429);
    assert!(
        res.headers().get("access-control-allow-origin").is_none(),
        "unlisted origin"
    );
}

#[tokio::test]
async fn a_gateway_made_502_carries_cors_for_a_listed_origin() {
    let dead = common::dead_addr();
    let toml = format!(
        "{}\n[cors]\nallowed_origins = [\"*\"]\n",
        config(&format!("http://{dead}"), 5, "enforce", 5)
    );
    let gw = launch(&toml).spawn();
    let res = get_from(&gw, "/t/a/x", "http://anywhere.test").await;
    assert_eq!(res.status(), 502);
    assert_eq!(header(&res, "access-control-allow-origin"), "*");
    assert!(header(&res, "access-control-expose-headers").contains("RateLimit"));
    assert_eq!(
        gw.metric(r#"fleet_limiter_upstream_errors_total{kind="unreachable"}"#)
            .await,
        Some(1.0)
    );
}

#[tokio::test]
async fn sigint_stops_an_idle_gateway_with_exit_zero() {
    let up = upstream().await;
    let mut gw = start(&up, 5, "enforce", 5, &[]);
    assert_eq!(get(&gw, "/t/a/x").await.status(), 200);
    gw.signal("INT");
    assert_eq!(
        gw.wait_exit().await.code(),
        Some(0),
        "log:\n{}",
        gw.stderr()
    );
    assert!(gw.stderr().contains("SIGINT"));
}

#[tokio::test]
async fn the_grace_period_bounds_the_drain() {
    let up = upstream().await;
    let mut gw = start(&up, 5, "enforce", 5, &["--shutdown-grace", "1s"]);
    let in_flight = in_flight(&gw, &up, "/stuck").await;
    gw.signal("TERM");
    // The upstream holds the request for 20 s; the gateway gives up on it after 1 s and exits.
    assert_eq!(
        gw.wait_exit().await.code(),
        Some(0),
        "log:\n{}",
        gw.stderr()
    );
    let res = in_flight.await.expect("task");
    assert!(
        res.is_err(),
        "the request still running after the grace period is dropped: {res:?}"
    );
}

const LOG_LINES_DROPPED: &str = "fleet_limiter_log_lines_dropped_total";

/// A gateway whose log reader has gone away keeps refusing with full answers, keeps its admin
/// listener, and still stops on SIGTERM with exit code 0.
async fn serves_and_stops_without_a_log_reader(mut gw: Gateway) {
    for i in 0..2 {
        assert_eq!(get(&gw, "/t/a/x").await.status(), 200, "request {i}");
    }
    // Each refusal writes a log line into the closed pipe.
    for i in 0..5 {
        let res = get(&gw, "/t/a/x").await;
        assert_eq!(res.status(), 429, "refusal {i}");
        assert_eq!(header(&res, "content-type"), "application/problem+json");
        assert!(!header(&res, "retry-after").is_empty(), "refusal {i}");
        let body: serde_json::Value = res.json().await.expect("problem body");
        assert_eq!(body["type"], "urn:fleet-limiter:problem:rate-limited");
        assert_eq!(body["status"], 429);
    }
    assert_eq!(admin_get(&gw, "/healthz").await.status(), 200);
    gw.wait_metric(LOG_LINES_DROPPED, |v| v >= 5.0).await;
    assert_eq!(
        get(&gw, "/t/b/x").await.status(),
        200,
        "traffic still passes"
    );
    gw.signal("TERM");
    assert_eq!(gw.wait_exit().await.code(), Some(0), "SIGTERM exits 0");
}

#[tokio::test]
async fn a_log_reader_that_goes_away_never_stops_refusals_admin_or_shutdown() {
    let up = upstream().await;
    let mut gw = launch(&config(&up.uri(), 2, "enforce", 5))
        .piped_output()
        .spawn();
    assert_eq!(get(&gw, "/t/b/x").await.status(), 200);
    gw.close_output();
    serves_and_stops_without_a_log_reader(gw).await;
}

#[tokio::test]
async fn a_log_pipe_closed_from_the_start_still_serves() {
    let up = upstream().await;
    let gw = launch(&config(&up.uri(), 2, "enforce", 5))
        .closed_output()
        .spawn();
    serves_and_stops_without_a_log_reader(gw).await;
}

/// A listening socket on a free loopback port, held for the test (as Prometheus holds 9090).
fn occupied_port() -> std::net::TcpListener {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind a port to occupy")
}

/// A start-up that cannot listen: exit code 2, one message naming the origin, the setting,
/// the address and the way out, and no "gateway started" before it.
fn assert_cannot_listen(out: &common::Exited, origin: &str, setting: &str, addr: &str) {
    assert_eq!(out.code, Some(2), "stderr:\n{}", out.stderr);
    let line = out
        .stderr
        .lines()
        .find(|l| l.contains("configuration error"))
        .unwrap_or_else(|| panic!("no configuration error in:\n{}", out.stderr));
    assert!(
        line.contains(&format!("{origin}: {setting}: cannot listen on {addr}")),
        "{line}"
    );
    assert!(line.contains("port 0"), "says how to fix it: {line}");
    assert!(
        !out.stderr.contains("gateway started"),
        "nothing may claim the gateway started:\n{}",
        out.stderr
    );
}

#[test]
fn an_admin_address_in_use_is_a_configuration_error_before_start() {
    let taken = occupied_port();
    let addr = taken.local_addr().expect("addr").to_string();
    let limit = Duration::from_secs(30);
    let out = Launch::serve()
        .upstream("http://127.0.0.1:9")
        .log("info")
        .env("FLEET_LIMITER_ADMIN_LISTEN", &addr)
        .run(limit);
    assert_cannot_listen(
        &out,
        "environment variable FLEET_LIMITER_ADMIN_LISTEN",
        "ops.admin_listen",
        &addr,
    );
    assert!(out.stderr.contains("--admin-listen"), "{}", out.stderr);

    let out = Launch::serve()
        .upstream("http://127.0.0.1:9")
        .log("info")
        .args(["--admin-listen", &addr])
        .run(limit);
    assert_cannot_listen(&out, "flag --admin-listen", "ops.admin_listen", &addr);
}

#[test]
fn a_traffic_address_in_use_is_a_configuration_error_before_start() {
    let taken = occupied_port();
    let addr = taken.local_addr().expect("addr").to_string();
    let out = Launch::command(["serve"])
        .upstream("http://127.0.0.1:9")
        .log("info")
        .config_toml(format!("[server]\nlisten = \"{addr}\"\n"))
        .run(Duration::from_secs(30));
    assert_cannot_listen(&out, "fleet-limiter.toml", "server.listen", &addr);
    assert!(
        out.stderr.contains("--listen") && out.stderr.contains("FLEET_LIMITER_LISTEN"),
        "{}",
        out.stderr
    );
}

#[tokio::test]
async fn get_reload_is_405_with_allow_post() {
    let up = common::upstream().await;
    let gw = start(&up, 5, "enforce", 5, &[]);
    let res = admin_get(&gw, "/reload").await;
    assert_eq!(res.status().as_u16(), 405);
    let header = |n: &str| {
        res.headers()
            .get(n)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    assert_eq!(header("allow").as_deref(), Some("POST"));
    assert_eq!(
        header("content-type").as_deref(),
        Some("application/problem+json")
    );
    let body: serde_json::Value = res.json().await.expect("problem+json");
    assert_eq!(body["status"], 405);
    assert_eq!(body["title"], "Method Not Allowed");
    assert!(
        body["detail"].as_str().is_some_and(|d| d.contains("POST")),
        "{body}"
    );
    // The configuration was not reloaded by the GET.
    assert_metrics(&gw, &[(RELOADS_OK, 0.0), (RELOADS_ERR, 0.0)]).await;
}

/// Counts are kept per worker thread and summed when `/metrics` is read: many requests at
/// once, each on its own connection (so the gateway's workers share them), are each counted
/// exactly once, in every family a request records into.
#[tokio::test]
async fn counts_from_every_worker_add_up_exactly() {
    let up = upstream().await;
    let gw = Arc::new(start(&up, 1000, "enforce", 5, &[]));
    const N: usize = 200;
    let tasks: Vec<_> = (0..N)
        .map(|i| {
            let gw = gw.clone();
            tokio::spawn(async move { get(&gw, &format!("/t/a/{i}")).await.status().as_u16() })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.expect("task"), 200);
    }
    let n = N as f64;
    assert_metrics(
        &gw,
        &[
            (A_ALLOWED, n),
            (r#"fleet_limiter_requests_total{outcome="forwarded"}"#, n),
            ("fleet_limiter_decision_duration_seconds_count", n),
            (r#"fleet_limiter_upstream_responses_total{status="200"}"#, n),
            ("fleet_limiter_upstream_duration_seconds_count", n),
        ],
    )
    .await;
}
