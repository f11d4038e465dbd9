//! The limiter embedded in an actix-web app of the user's own (`App::new().wrap(FleetLimiter)`),
//! served on a real loopback port and called over HTTP.

use actix_web::{web, App, HttpMessage, HttpRequest, HttpResponse, HttpServer};
use fleet_limiter::Cors;
use fleet_limiter::LimiterFate;
use fleet_limiter::Loader;
use fleet_limiter::{Decided, FleetLimiter};

async fn handler(req: HttpRequest) -> HttpResponse {
    let remaining = req
        .extensions()
        .get::<Decided>()
        .and_then(|o| o.0.tightest().map(|t| t.verdict.remaining));
    HttpResponse::Ok().body(format!("remaining={remaining:?}"))
}

#[actix_web::test]
async fn embedded_middleware_limits_reports_and_renders_cors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("c.toml");
    std::fs::write(
        &file,
        r#"
[limiters.embedded-a]
limit = 2
window = "1m"
key = "ip"
routes = ["/work/**"]

[cors]
allowed_origins = ["http://dash.test"]
"#,
    )
    .expect("write");
    let cfg = Loader::new().file(&file).load().expect("config");
    let limiter = FleetLimiter::from_config(&cfg).expect("limiter");
    let metrics = limiter.metrics().clone();
    let cors = Cors::new(&cfg.cors);
    let server = HttpServer::new(move || {
        App::new()
            .wrap(limiter.clone())
            .wrap(cors.clone())
            .route("/work/{x}", web::get().to(handler))
            .route("/free", web::get().to(handler))
    })
    .workers(1)
    .disable_signals()
    .bind("127.0.0.1:0")
    .expect("bind");
    let addr = server.addrs()[0];
    let server = server.run();
    let handle = server.handle();
    actix_web::rt::spawn(server);

    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client");
    let url = |p: &str| format!("http://{addr}{p}");
    let res = client.get(url("/work/1")).send().await.expect("first");
    assert_eq!(res.status(), 200);
    // The default profile: draft 6 and the legacy headers.
    assert_eq!(res.headers()["ratelimit-policy"], "2;w=60");
    assert_eq!(res.headers()["ratelimit-remaining"], "1");
    assert_eq!(res.headers()["x-ratelimit-remaining"], "1");
    assert_eq!(
        res.text().await.expect("body"),
        "remaining=Some(1)",
        "the handler sees the outcome"
    );
    assert_eq!(
        client
            .get(url("/work/2"))
            .send()
            .await
            .expect("second")
            .status(),
        200
    );
    let res = client
        .get(url("/work/3"))
        .header("origin", "http://dash.test")
        .send()
        .await
        .expect("third");
    assert_eq!(res.status(), 429);
    assert_eq!(res.headers()["content-type"], "application/problem+json");
    assert!(res.headers().contains_key("retry-after"));
    assert_eq!(
        res.headers()["access-control-allow-origin"],
        "http://dash.test"
    );
    let res = client.get(url("/free")).send().await.expect("unmetered");
    assert_eq!(res.status(), 200);
    assert_eq!(res.text().await.expect("body"), "remaining=None");

    let text = metrics.render();
    assert!(
        text.contains(
            "fleet_limiter_decisions_total{limiter=\"embedded-a\",outcome=\"refused\"} 1\n"
        ),
        "{text}"
    );
    handle.stop(true).await;
}

#[actix_web::test]
async fn without_the_outcome_extension_handlers_see_none_and_headers_stay() {
    use actix_web::test;
    let cfg = Loader::new().load().expect("config");
    let call = |on: bool| {
        let limiter = FleetLimiter::from_config(&cfg)
            .expect("limiter")
            .with_outcome_extension(on);
        async move {
            let app = test::init_service(
                App::new()
                    .wrap(limiter)
                    .route("/api/agent/heartbeat", web::post().to(handler)),
            )
            .await;
            let req = test::TestRequest::post()
                .uri("/api/agent/heartbeat")
                .peer_addr(([203, 0, 113, 9], 4000).into())
                .insert_header(("x-agent-id", "agent-0001"))
                .to_request();
            let res = test::call_service(&app, req).await;
            let limited = res.headers().contains_key("ratelimit-limit");
            let body = test::read_body(res).await;
            (limited, String::from_utf8_lossy(&body).into_owned())
        }
    };
    let (limited, body) = call(true).await;
    assert!(limited);
    assert_ne!(body, "remaining=None", "on by default: the handler sees it");
    let (limited, body) = call(false).await;
    assert!(limited, "the limit headers do not depend on the extension");
    assert_eq!(body, "remaining=None");
}

/// In an app of its own, the middleware gives the app the canonical path it decided on, and a
/// path with no canonical form never reaches the app's handlers.
#[actix_web::test]
async fn embedded_middleware_hands_the_app_the_canonical_path() {
    let cfg = Loader::new().load().expect("config");
    let limiter = FleetLimiter::from_config(&cfg).expect("limiter");
    let server = HttpServer::new(move || {
        App::new()
            .wrap(limiter.clone())
            .route(
                "/api/agent/rotate-key",
                web::post().to(|req: HttpRequest| async move {
                    HttpResponse::Ok().body(format!("{}?{}", req.path(), req.query_string()))
                }),
            )
            .default_service(web::to(|req: HttpRequest| async move {
                HttpResponse::NotFound().body(req.path().to_owned())
            }))
    })
    .workers(1)
    .disable_signals()
    .bind("127.0.0.1:0")
    .expect("bind");
    let addr = server.addrs()[0];
    let server = server.run();
    let handle = server.handle();
    actix_web::rt::spawn(server);

    let send = move |target: &str| {
        let req = format!(
            "POST {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
        );
        let mut s = std::net::TcpStream::connect(addr).expect("connect");
        std::io::Write::write_all(&mut s, req.as_bytes()).expect("write");
        let mut out = String::new();
        let _ = std::io::Read::read_to_string(&mut s, &mut out);
        out
    };
    let res = actix_web::rt::task::spawn_blocking(move || {
        [
            send("/api/x/../agent/%72otate-key?a=%2e%2e"),
            send("/api//agent/./rotate-key"),
            send("/api/agent/rotate-key"),
            send("/api/agent/rotate-key"),
            send("/api/agent/rotate-key;x=1"),
            send("/api/agent/%FF/%2e%2e/rotate-key"),
        ]
    })
    .await
    .expect("requests");
    assert!(res[0].starts_with("HTTP/1.1 200"), "{}", res[0]);
    assert!(
        res[0].ends_with("/api/agent/rotate-key?a=%2e%2e"),
        "{}",
        res[0]
    );
    assert!(res[1].ends_with("/api/agent/rotate-key?"), "{}", res[1]);
    assert!(res[2].starts_with("HTTP/1.1 200"), "{}", res[2]);
    // key-rotation allows three in 15 minutes, whatever the spelling.
    assert!(res[3].starts_with("HTTP/1.1 429"), "{}", res[3]);
    for r in &res[4..] {
        assert!(r.starts_with("HTTP/1.1 400"), "{r}");
        assert!(r.contains("non-canonical-path"), "{r}");
    }
    handle.stop(true).await;
}

/// Send `n` metered requests through an app wrapped in `limiter`.
async fn call_metered(limiter: FleetLimiter, n: usize) {
    use actix_web::test;
    let app = test::init_service(
        App::new()
            .wrap(limiter)
            .route("/work/{x}", web::get().to(handler)),
    )
    .await;
    for _ in 0..n {
        let req = test::TestRequest::get()
            .uri("/work/1")
            .peer_addr(([203, 0, 113, 7], 4000).into())
            .to_request();
        assert_eq!(test::call_service(&app, req).await.status(), 200);
    }
}

/// Each embedded limiter counts its own decisions, and takes its near-limit threshold from its
/// own configuration.
#[actix_web::test]
async fn embedded_limiters_count_apart_and_honour_the_near_limit_share() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("c.toml");
    std::fs::write(
        &file,
        r#"
[limiters.embedded-n]
limit = 10
window = "1m"
key = "ip"
routes = ["/work/**"]

[ops]
near_limit_percent = 95
"#,
    )
    .expect("write");
    let cfg = Loader::new().file(&file).load().expect("config");
    let first = FleetLimiter::from_config(&cfg).expect("first");
    let second = FleetLimiter::from_config(&cfg).expect("second");
    let (m1, m2) = (first.metrics().clone(), second.metrics().clone());
    call_metered(first, 2).await;
    call_metered(second, 1).await;
    assert_eq!(m1.decisions("embedded-n", LimiterFate::Allowed), 2);
    assert_eq!(m2.decisions("embedded-n", LimiterFate::Allowed), 1);
    // 9 of 10 left is under 95% of the budget: near the limit at this threshold only.
    assert_eq!(m1.near_limit("embedded-n"), 2);
    assert_eq!(m2.near_limit("embedded-n"), 1);
    let text = m1.render();
    assert!(
        text.contains("fleet_limiter_near_limit_ratio 0.95\n"),
        "{text}"
    );
}

/// The embedded middleware answers a `deny` limiter whose store cannot answer as the gateway
/// does: 503 `store-unavailable`, never 429, each caller (here: each agent id at one address)
/// told a wait of its own over [w, 2w], the same on every asking, every reset saying it.
#[actix_web::test]
async fn embedded_middleware_answers_a_store_that_cannot_answer_with_a_spread_503() {
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr")
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("c.toml");
    std::fs::write(
        &file,
        format!(
            r#"
[store]
backend = "redis"
url = "redis://{dead}"

[headers]
legacy_reset = "delta"

[limiters.embedded-closed]
limit = 2
window = "1m"
key = "ip"
routes = ["/work/**"]
on_store_error = "deny"
"#
        ),
    )
    .expect("write");
    let cfg = Loader::new().file(&file).load().expect("config");
    let limiter = FleetLimiter::from_config(&cfg).expect("limiter");
    let server = HttpServer::new(move || {
        App::new()
            .wrap(limiter.clone())
            .route("/work/{x}", web::get().to(handler))
    })
    .workers(1)
    .disable_signals()
    .bind("127.0.0.1:0")
    .expect("bind");
    let addr = server.addrs()[0];
    let server = server.run();
    let handle = server.handle();
    actix_web::rt::spawn(server);
    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client");
    let number = |res: &reqwest::Response, name: &str| -> Option<u64> {
        res.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
    };
    let mut told = std::collections::BTreeSet::new();
    for i in 0..20 {
        let mut waits = Vec::new();
        for _ in 0..2 {
            let res = client
                .get(format!("http://{addr}/work/x"))
                .header("x-agent-id", format!("agent-{i}"))
                .send()
                .await
                .expect("an answer");
            assert_eq!(res.status(), 503, "agent-{i}: never a 429");
            let wait = number(&res, "retry-after").expect("Retry-After");
            // 2 a minute: w = 30 s.
            assert!((30..=60).contains(&wait), "agent-{i}: {wait}");
            assert_eq!(number(&res, "ratelimit-reset"), Some(wait), "{res:?}");
            assert_eq!(number(&res, "x-ratelimit-reset"), Some(wait), "{res:?}");
            let body: serde_json::Value = res.json().await.expect("problem+json");
            assert_eq!(body["type"], "urn:fleet-limiter:problem:store-unavailable");
            assert_eq!(body["retry_after"], wait);
            waits.push(wait);
        }
        assert_eq!(waits[0], waits[1], "agent-{i}: one wait");
        told.insert(waits[0]);
    }
    assert!(told.len() >= 3, "{told:?}");
    handle.stop(true).await;
}
