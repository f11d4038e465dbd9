//! Operating the real binary over HTTP: metrics, shadow mode, the global switch, live reload
//! (SIGHUP and POST /reload), rejected reloads, graceful shutdown, health, CORS headers.

mod ops_support;

use fleet_limiter::keys::{principal_key, BucketKey, KeyKind};
use ops_support::{client, Gateway};
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
"#
    )
}

async fn get(gw: &Gateway, p: &str) -> reqwest::Response {
    client().get(gw.url(p)).send().await.expect("request")
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
    let gw = Gateway::start(
        &config(&up.uri(), 2, "enforce", 5),
        &["--log-format", "json"],
    )
    .await;

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

    assert_eq!(gw.metric(A_ALLOWED).await, Some(2.0));
    assert_eq!(gw.metric(A_REFUSED).await, Some(1.0));
    assert_eq!(
        gw.metric(r#"fleet_limiter_decisions_total{limiter="test-b",outcome="allowed"}"#)
            .await,
        Some(1.0)
    );
    // After the second request 0 of 2 remain: under 20% of the budget.
    assert_eq!(
        gw.metric(r#"fleet_limiter_near_limit_total{limiter="test-a"}"#)
            .await,
        Some(1.0)
    );
    assert_eq!(
        gw.metric(r#"fleet_limiter_requests_total{outcome="refused"}"#)
            .await,
        Some(1.0)
    );
    assert_eq!(
        gw.metric(r#"fleet_limiter_requests_total{outcome="forwarded"}"#)
            .await,
        Some(3.0)
    );
    assert_eq!(
        gw.metric(r#"fleet_limiter_requests_total{outcome="unmetered"}"#)
            .await,
        Some(1.0)
    );
    assert_eq!(
        gw.metric("fleet_limiter_decision_duration_seconds_count")
            .await,
        Some(4.0)
    );
    assert_eq!(
        gw.metric(r#"fleet_limiter_store_duration_seconds_count{store="memory"}"#)
            .await,
        Some(4.0)
    );
    assert_eq!(
        gw.metric(r#"fleet_limiter_store_errors_total{store="memory"}"#)
            .await,
        Some(0.0)
    );
    assert_eq!(
        gw.metric(r#"fleet_limiter_tracked_keys{store="memory"}"#)
            .await,
        Some(2.0)
    );
    assert_eq!(
        gw.metric(r#"fleet_limiter_evicted_keys_total{store="memory"}"#)
            .await,
        Some(0.0)
    );
    assert_eq!(
        gw.metric(r#"fleet_limiter_upstream_responses_total{status="200"}"#)
            .await,
        Some(3.0)
    );
    assert_eq!(
        gw.metric(r#"fleet_limiter_upstream_responses_total{status="404"}"#)
            .await,
        Some(1.0)
    );
    assert_eq!(
        gw.metric("fleet_limiter_upstream_duration_seconds_count")
            .await,
        Some(4.0)
    );

    let page = client()
        .get(gw.admin("/metrics"))
        .send()
        .await
        .expect("metrics");
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
        !gw.logs().contains("agent-secret-4711"),
        "raw agent ids never reach the log"
    );
}

#[tokio::test]
async fn shadow_mode_never_refuses_but_counts_logs_and_reports() {
    let up = upstream().await;
    let gw = Gateway::start(
        &config(&up.uri(), 2, "shadow", 5),
        &["--log-format", "json"],
    )
    .await;
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

    assert_eq!(gw.metric(A_ALLOWED).await, Some(2.0));
    assert_eq!(gw.metric(A_SHADOW).await, Some(4.0));
    assert_eq!(gw.metric(A_REFUSED).await, Some(0.0));
    assert_eq!(
        gw.metric(r#"fleet_limiter_requests_total{outcome="refused"}"#)
            .await,
        Some(0.0)
    );
    assert_eq!(
        gw.metric(r#"fleet_limiter_limiter_info{limiter="test-a",mode="shadow",limit="2",window_seconds="3600"}"#).await,
        Some(1.0)
    );
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
    let gw = Gateway::start_env(
        &config(&up.uri(), 1, "enforce", 1),
        &[],
        &[("FLEET_LIMITER_ENABLED", "false")],
    )
    .await;
    for _ in 0..4 {
        let res = get(&gw, "/t/a/x").await;
        assert_eq!(res.status(), 200);
        assert!(res.headers().get("ratelimit").is_none());
    }
    assert_eq!(gw.metric("fleet_limiter_enabled").await, Some(0.0));
    assert_eq!(
        gw.metric(r#"fleet_limiter_requests_total{outcome="unmetered"}"#)
            .await,
        Some(4.0)
    );
    assert_eq!(gw.metric(A_ALLOWED).await, Some(0.0));
}

#[tokio::test]
async fn reload_by_sighup_and_post_changes_one_budget_and_keeps_every_bucket() {
    let up = upstream().await;
    let gw = Gateway::start(&config(&up.uri(), 10, "enforce", 3), &[]).await;
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
    let res = client()
        .post(gw.admin("/reload"))
        .send()
        .await
        .expect("reload");
    assert_eq!(res.status(), 200);
    let body: serde_json::Value = res.json().await.expect("json");
    assert_eq!(body["reloaded"], true);
    assert_eq!(body["changed"], serde_json::json!(["test-a"]));
    let res = get(&gw, "/t/a/x").await;
    assert!(header(&res, "ratelimit-policy").contains("\"test-a\";q=30;w=3600"));
    assert_eq!(get(&gw, "/t/b/x").await.status(), 429, "test-b still spent");
    assert_eq!(gw.metric(RELOADS_OK).await, Some(2.0));
    assert_eq!(
        gw.metric("fleet_limiter_config_last_reload_successful")
            .await,
        Some(1.0)
    );
    assert!(gw.logs().contains("configuration reloaded"));
}

#[tokio::test]
async fn an_invalid_reload_is_rejected_with_its_reason_and_the_old_config_stays() {
    let up = upstream().await;
    let gw = Gateway::start(&config(&up.uri(), 2, "enforce", 3), &[]).await;
    assert_eq!(get(&gw, "/t/a/x").await.status(), 200);

    gw.rewrite_config(&config(&up.uri(), 0, "enforce", 3));
    let res = client()
        .post(gw.admin("/reload"))
        .send()
        .await
        .expect("reload");
    assert_eq!(res.status(), 422);
    let body: serde_json::Value = res.json().await.expect("json");
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
    assert!(
        gw.logs().contains("configuration reload rejected"),
        "{}",
        gw.logs()
    );
    assert!(
        gw.logs().contains("limiters.test-a.limit"),
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
async fn sigterm_drains_an_in_flight_slow_request_then_exits_zero() {
    let up = upstream().await;
    let mut gw = Gateway::start(
        &config(&up.uri(), 5, "enforce", 5),
        &["--shutdown-grace", "20s"],
    )
    .await;
    let url = gw.url("/slow");
    let in_flight = tokio::spawn(async move { client().get(url).send().await });
    // Wait until the upstream holds the request, then ask the gateway to stop.
    let deadline = std::time::Instant::now() + ops_support::PATIENCE;
    while up.received_requests().await.map_or(0, |r| r.len()) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the request never reached the upstream"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    gw.signal("TERM");
    let res = in_flight
        .await
        .expect("task")
        .expect("the in-flight request completes");
    assert_eq!(res.status(), 200);
    assert_eq!(res.text().await.expect("body"), "slow answer");
    let status = gw.wait_exit().await;
    assert_eq!(status.code(), Some(0), "log:\n{}", gw.logs());
    assert!(gw.logs().contains("SIGTERM"));
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", gw.port)).is_err(),
        "nothing listens after exit"
    );
}

#[tokio::test]
async fn health_and_readiness() {
    let up = upstream().await;
    let gw = Gateway::start(&config(&up.uri(), 5, "enforce", 5), &[]).await;
    let res = client()
        .get(gw.admin("/healthz"))
        .send()
        .await
        .expect("healthz");
    assert_eq!(res.status(), 200);
    let res = client()
        .get(gw.admin("/readyz"))
        .send()
        .await
        .expect("readyz");
    assert_eq!(res.status(), 200);
    let body: serde_json::Value = res.json().await.expect("json");
    assert_eq!(body["ready"], true);
    assert_eq!(body["store"], "memory");
    // The admin listener is not the traffic port, and traffic paths are not admin paths.
    let res = client()
        .get(gw.admin("/t/a/x"))
        .send()
        .await
        .expect("admin 404");
    assert_eq!(res.status(), 404);
    let res = client()
        .get(gw.admin("/reload"))
        .send()
        .await
        .expect("GET reload");
    assert_ne!(res.status(), 200, "reload is POST only");
}

#[tokio::test]
async fn gateway_made_refusals_carry_cors_for_listed_origins_and_preflights_pass_unmetered() {
    let up = upstream().await;
    let toml = format!(
        "{}\n[cors]\nallowed_origins = [\"http://dash.test\"]\nallow_credentials = true\n",
        config(&up.uri(), 1, "enforce", 5)
    );
    let gw = Gateway::start(&toml, &[]).await;
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
    let res = client()
        .get(gw.url("/t/a/x"))
        .header("origin", "http://dash.test")
        .send()
        .await
        .expect("get");
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

    let res = client()
        .get(gw.url("/t/a/x"))
        .header("origin", "http://dash.test")
        .send()
        .await
        .expect("get");
    assert_eq!(res.status(), 429);
    assert_eq!(
        header(&res, "access-control-allow-origin"),
        "http://dash.test"
    );
    assert_eq!(header(&res, "access-control-allow-credentials"), "true");
    assert!(header(&res, "vary").contains("Origin"));
    assert!(header(&res, "access-control-expose-headers").contains("Retry-After"));
    assert!(!header(&res, "retry-after").is_empty());

    let res = client()
        .get(gw.url("/t/a/x"))
        .header("origin", "http://elsewhere.test")
        .send()
        .await
        .expect("get");
    assert_eq!(res.status(), 429);
    assert!(
        res.headers().get("access-control-allow-origin").is_none(),
        "unlisted origin"
    );
}

#[tokio::test]
async fn a_gateway_made_502_carries_cors_for_a_listed_origin() {
    let dead = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let dead_port = dead.local_addr().expect("addr").port();
    drop(dead);
    let toml = format!(
        "{}\n[cors]\nallowed_origins = [\"*\"]\n",
        config(&format!("http://127.0.0.1:{dead_port}"), 5, "enforce", 5)
    );
    let gw = Gateway::start(&toml, &[]).await;
    let res = client()
        .get(gw.url("/t/a/x"))
        .header("origin", "http://anywhere.test")
        .send()
        .await
        .expect("get");
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
    let mut gw = Gateway::start(&config(&up.uri(), 5, "enforce", 5), &[]).await;
    assert_eq!(get(&gw, "/t/a/x").await.status(), 200);
    gw.signal("INT");
    assert_eq!(gw.wait_exit().await.code(), Some(0), "log:\n{}", gw.logs());
    assert!(gw.logs().contains("SIGINT"));
}

#[tokio::test]
async fn the_grace_period_bounds_the_drain() {
    let up = upstream().await;
    let mut gw = Gateway::start(
        &config(&up.uri(), 5, "enforce", 5),
        &["--shutdown-grace", "1s"],
    )
    .await;
    let url = gw.url("/stuck");
    let in_flight = tokio::spawn(async move { client().get(url).send().await });
    let deadline = std::time::Instant::now() + ops_support::PATIENCE;
    while up.received_requests().await.map_or(0, |r| r.len()) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the request never reached the upstream"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    gw.signal("TERM");
    // The upstream holds the request for 20 s; the gateway gives up on it after 1 s and exits.
    assert_eq!(gw.wait_exit().await.code(), Some(0), "log:\n{}", gw.logs());
    let res = in_flight.await.expect("task");
    assert!(
        res.is_err(),
        "the request still running after the grace period is dropped: {res:?}"
    );
}
