//! One request through the whole actix-web middleware, in process (no sockets): the same
//! trivial handler bare, behind `FleetLimiter` with budgets nothing exhausts, and behind it
//! with every request refused, and allowed with the top-talker lists off (`ops.top_talkers`).
//! The difference is the limiter's cost per request.

use actix_web::dev::Service;
use actix_web::{test, web, App};
use criterion::{criterion_group, criterion_main, Criterion};
use fleet_limiter::FleetLimiter;
use fleet_limiter::{Config, Loader};
use std::net::SocketAddr;
use std::time::Instant;

/// `agent-device` at `limit` per `window`; the `agent-ip` ceiling above it raised as far, as
/// `bench/run.sh` does, so that only `agent-device` can refuse.
fn config(limit: &str, window: &str) -> Config {
    config_with(limit, window, true)
}

/// [`config`], with the top-talker lists on or off (`ops.top_talkers`).
fn config_with(limit: &str, window: &str, top_talkers: bool) -> Config {
    let mut vars: Vec<(String, String)> = [
        ("AGENT_DEVICE_LIMIT", limit),
        ("AGENT_DEVICE_WINDOW", window),
        ("AGENT_IP_LIMIT", "1000000000"),
        ("AGENT_IP_WINDOW", "1m"),
    ]
    .map(|(k, v)| (format!("FLEET_LIMITER_LIMITER_{k}"), v.to_owned()))
    .to_vec();
    vars.push((
        "FLEET_LIMITER_TOP_TALKERS".to_owned(),
        top_talkers.to_string(),
    ));
    match Loader::new().env(vars).load() {
        Ok(c) => c,
        Err(e) => panic!("benchmark configuration: {e}"),
    }
}

const AGENTS: usize = 1_000;

/// Run `iters` heartbeats from 1 000 rotating agents through `app`; evaluates to the elapsed time.
/// (A macro: the request type of an initialised test service is not nameable from here.)
macro_rules! run {
    ($app:expr, $iters:expr, $ids:expr) => {{
        let peer: SocketAddr = ([127, 0, 0, 1], 40000).into();
        let ids: &[String] = $ids;
        let start = Instant::now();
        for i in 0..$iters {
            let req = test::TestRequest::post()
                .uri("/api/agent/heartbeat")
                .peer_addr(peer)
                .insert_header(("x-agent-id", ids[i as usize % ids.len()].as_str()))
                .to_request();
            let res = $app.call(req).await;
            criterion::black_box(res.map(|r| r.status()).ok());
        }
        start.elapsed()
    }};
}

fn bench(c: &mut Criterion) {
    let ids: Vec<String> = (0..AGENTS).map(|i| format!("agent-{i:04}")).collect();
    let sys = actix_rt::System::new();
    let mut g = c.benchmark_group("middleware_request");

    let bare = sys.block_on(test::init_service(
        App::new().route("/api/agent/heartbeat", web::post().to(|| async { "ok" })),
    ));
    g.bench_function("bare_handler", |b| {
        b.iter_custom(|n| sys.block_on(async { run!(bare, n, &ids) }))
    });

    let allowed = sys.block_on(async {
        let limiter = match FleetLimiter::from_config(&config("1000000000", "1m")) {
            Ok(l) => l,
            Err(e) => panic!("limiter: {e}"),
        };
        test::init_service(
            App::new()
                .wrap(limiter)
                .route("/api/agent/heartbeat", web::post().to(|| async { "ok" })),
        )
        .await
    });
    g.bench_function("fleet_limiter_allowed", |b| {
        b.iter_custom(|n| sys.block_on(async { run!(allowed, n, &ids) }))
    });

    let untracked = sys.block_on(async {
        let limiter = match FleetLimiter::from_config(&config_with("1000000000", "1m", false)) {
            Ok(l) => l,
            Err(e) => panic!("limiter: {e}"),
        };
        test::init_service(
            App::new()
                .wrap(limiter)
                .route("/api/agent/heartbeat", web::post().to(|| async { "ok" })),
        )
        .await
    });
    g.bench_function("fleet_limiter_allowed_top_talkers_off", |b| {
        b.iter_custom(|n| sys.block_on(async { run!(untracked, n, &ids) }))
    });

    let refused = sys.block_on(async {
        let limiter = match FleetLimiter::from_config(&config("1", "1h")) {
            Ok(l) => l,
            Err(e) => panic!("limiter: {e}"),
        };
        test::init_service(
            App::new()
                .wrap(limiter)
                .route("/api/agent/heartbeat", web::post().to(|| async { "ok" })),
        )
        .await
    });
    // Spend every agent's single request first: from then on each request is refused.
    sys.block_on(async { run!(refused, AGENTS as u64, &ids) });
    g.bench_function("fleet_limiter_refused", |b| {
        b.iter_custom(|n| sys.block_on(async { run!(refused, n, &ids) }))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
