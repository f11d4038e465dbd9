//! `calibration = "none"`, agent ids read from the path (`key = "ip+path:<name>"`), and the
//! presets built on them (`docs/examples/elastic-fleet.toml`, `docs/examples/fleetdm.toml`):
//! the real binary in front of a real upstream.

mod common;

use common::{Gateway, Launch};
use std::time::Duration;

const ELASTIC: &str = include_str!("../docs/examples/elastic-fleet.toml");
const FLEETDM: &str = include_str!("../docs/examples/fleetdm.toml");
const LIMIT: Duration = Duration::from_secs(120);

fn gateway(toml: &str, upstream: &str) -> Gateway {
    Launch::serve().config_toml(toml).upstream(upstream).spawn()
}

async fn post(gw: &Gateway, path: &str, xff: Option<&str>) -> reqwest::Response {
    let mut req = common::client().post(gw.url(path)).body("{}");
    if let Some(ip) = xff {
        req = req.header("x-forwarded-for", ip);
    }
    req.send().await.expect("request")
}

fn limit_headers(r: &reqwest::Response) -> Vec<String> {
    r.headers()
        .keys()
        .map(|k| k.as_str().to_owned())
        .filter(|k| k.contains("ratelimit"))
        .collect()
}

/// Starting from no built-in limiter: the heartbeat route no limiter of the file names passes
/// unmetered, with no limit headers, while the file's own limiter meters its route.
#[tokio::test]
async fn with_no_calibration_the_heartbeat_passes_unmetered() {
    let upstream = common::upstream().await;
    let gw = gateway(
        "calibration = \"none\"\n[limiters.reports]\nlimit = 3\nwindow = \"1h\"\nkey = \"ip\"\nroutes = [\"POST /api/reports/**\"]\n",
        &upstream.uri(),
    );
    for i in 0..100 {
        let r = post(&gw, "/api/agent/heartbeat", None).await;
        assert_eq!(r.status(), 200, "heartbeat {i}");
        assert!(limit_headers(&r).is_empty(), "{:?}", r.headers());
    }
    for _ in 0..3 {
        let r = post(&gw, "/api/reports/x", None).await;
        assert_eq!(r.status(), 200);
        assert!(!limit_headers(&r).is_empty(), "the file's limiter speaks");
    }
    assert_eq!(post(&gw, "/api/reports/x", None).await.status(), 429);
    assert_eq!(common::received(&upstream).await, 103);
}

fn start_error(toml: &str) -> String {
    let out = Launch::serve().config_toml(toml).run(LIMIT);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    out.stderr
}

#[test]
fn an_unknown_calibration_is_refused_with_the_nearest_name() {
    let e = start_error("calibration = \"agnet-fleet\"\n");
    assert!(
        e.contains(
            "calibration: `agnet-fleet` is not a calibration; did you mean \"agent-fleet\"?"
        ),
        "{e}"
    );
    let e = start_error("calibration = \"nothing-at-all\"\n");
    assert!(
        e.contains("calibration: `nothing-at-all` is not a calibration; use \"agent-fleet\""),
        "{e}"
    );
    assert!(!e.contains("did you mean"), "{e}");
}

#[test]
fn with_no_calibration_a_built_in_name_defines_a_new_limiter_whole() {
    let e = start_error("calibration = \"none\"\n[limiters.agent-device]\nlimit = 60\n");
    assert!(
        e.contains("limiters.agent-device.window: calibration = \"none\" starts from no built-in limiter, so [limiters.agent-device] defines a new limiter, which needs limit, window, key and routes; add window, key, routes"),
        "{e}"
    );
}

/// A per-id limiter without an address ceiling over the same routes is refused, as a header
/// key would be; a route without the `{id}` segment too.
#[test]
fn a_path_key_needs_its_segment_and_an_address_ceiling() {
    let e = start_error("calibration = \"none\"\n[limiters.checkin]\nlimit = 5\nwindow = \"1m\"\nkey = \"ip+path:id\"\nroutes = [\"POST /agents/{id}/checkin\"]\n");
    assert!(e.contains("limiters.checkin.key: `ip+path:id` keys on an id in the request's path, which the client chooses"), "{e}");
    let e = start_error("calibration = \"none\"\n[limiters.checkin]\nlimit = 5\nwindow = \"1m\"\nkey = \"ip+path:id\"\nroutes = [\"POST /agents/*/checkin\"]\n");
    assert!(
        e.contains("limiters.checkin.routes: `POST /agents/*/checkin` names no `{id}` segment"),
        "{e}"
    );
    let e = start_error("calibration = \"none\"\n[limiters.checkin]\nlimit = 5\nwindow = \"1m\"\nkey = \"path:id\"\nroutes = [\"POST /agents/{id}/checkin\"]\n");
    assert!(e.contains("key = \"ip+path:id\""), "{e}");
    let e = start_error("[limiters.x]\nlimit = 5\nwindow = \"1m\"\nkey = \"ip\"\nroutes = [\"POST /agents/{Id}/checkin\"]\n");
    assert!(e.contains("`{Id}` is not a path parameter"), "{e}");
    let e = start_error("[limiters.x]\nlimit = 5\nwindow = \"1m\"\nkey = \"ip\"\nroutes = [\"POST /agents/**/{id}\"]\n");
    assert!(e.contains("`{id}` follows `**`"), "{e}");
}

const SMALL: &str = "calibration = \"none\"\n[limiters.checkin]\nlimit = 2\nwindow = \"1h\"\nkey = \"ip+path:id\"\nroutes = [\"POST /agents/{id}/checkin\"]\n[limiters.agents-ip]\nlimit = 1000\nwindow = \"1h\"\nkey = \"ip\"\nroutes = [\"POST /agents/{id}/checkin\"]\n";

/// Hostile spellings of the id: each is refused before any limiter (400), or read as the id
/// the upstream receives, or keys on the address, where all of them share one bucket.
#[tokio::test]
async fn hostile_path_ids_mint_no_bucket() {
    let upstream = common::upstream().await;
    let gw = gateway(SMALL, &upstream.uri());
    let st = |p: String| {
        let gw = &gw;
        async move { post(gw, &p, None).await.status().as_u16() }
    };
    // An escaped unreserved character is the id the upstream receives: one bucket.
    assert_eq!(st("/agents/agent-1/checkin".into()).await, 200);
    assert_eq!(st("/agents/ag%65nt-1/checkin".into()).await, 200);
    assert_eq!(st("/agents/agent-1/checkin".into()).await, 429);
    // Another case is another id, as the upstream reads it.
    assert_eq!(st("/agents/AGENT-1/checkin".into()).await, 200);
    // A slash, NUL or a trailing dot inside the segment: refused before any limiter.
    for p in [
        "/agents/a%2Fb/checkin",
        "/agents/a%00b/checkin",
        "/agents/agent-1./checkin",
    ] {
        assert_eq!(st(p.into()).await, 400, "{p}");
    }
    // Not an id: the address's one bucket for all of them (two pass, then refused).
    let long = "a".repeat(129);
    let junk = [
        format!("/agents/{long}/checkin"),
        "/agents/caf%C3%A9/checkin".to_owned(),
        "/agents/a%20b/checkin".to_owned(),
        "/agents/a%40b/checkin".to_owned(),
    ];
    let mut seen = Vec::new();
    for p in &junk {
        seen.push(st(p.clone()).await);
    }
    assert_eq!(seen, [200, 200, 429, 429], "one bucket for every junk id");
    // A dot segment is resolved before routing: not the check-in route at all.
    let r = post(&gw, "/agents/x/../checkin", None).await;
    assert_eq!(r.status(), 200);
    assert!(limit_headers(&r).is_empty());
    // The longest id is an id.
    let max = "b".repeat(128);
    assert_eq!(st(format!("/agents/{max}/checkin")).await, 200);
    assert_eq!(st(format!("/agents/{max}/checkin")).await, 200);
    assert_eq!(st(format!("/agents/{max}/checkin")).await, 429);
}

#[tokio::test]
async fn elastic_250_agents_behind_one_address_each_check_in() {
    let upstream = common::upstream().await;
    let gw = gateway(ELASTIC, &upstream.uri());
    for i in 0..250 {
        let id = format!("6f1c2a7e-0000-4000-8000-{i:012}");
        let path = format!("/api/fleet/agents/{id}/checkin");
        assert_eq!(
            post(&gw, &path, None).await.status(),
            200,
            "agent {i} checks in"
        );
        let acks = format!("/api/fleet/agents/{id}/acks");
        assert_eq!(post(&gw, &acks, None).await.status(), 200, "agent {i} acks");
        assert_eq!(
            post(&gw, &path, None).await.status(),
            200,
            "agent {i} again"
        );
    }
    assert_eq!(common::received(&upstream).await, 750);
}

#[tokio::test]
async fn elastic_one_agent_in_a_check_in_loop_is_refused() {
    let upstream = common::upstream().await;
    let gw = gateway(ELASTIC, &upstream.uri());
    let path = "/api/fleet/agents/7d3e0b52-aaaa-4bbb-8ccc-000000000001/checkin";
    let mut refused = None;
    for i in 0..40 {
        let r = post(&gw, path, None).await;
        if r.status() == 429 {
            refused.get_or_insert((i, r));
        } else {
            assert_eq!(r.status(), 200);
        }
    }
    let (first, r) = refused.expect("40 check-ins in a minute meet the per-agent budget");
    assert_eq!(first, 20, "its burst of 20 passed");
    let wait: u64 = r
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .expect("Retry-After");
    assert!((1..=30).contains(&wait), "{wait}");
    // Another agent at the same address is not held by it.
    let other = "/api/fleet/agents/7d3e0b52-aaaa-4bbb-8ccc-000000000002/checkin";
    assert_eq!(post(&gw, other, None).await.status(), 200);
}

#[tokio::test]
async fn elastic_fresh_ids_from_one_address_meet_the_ceiling() {
    let upstream = common::upstream().await;
    let gw = Launch::serve()
        .config_toml(ELASTIC)
        .upstream(&upstream.uri())
        .env("FLEET_LIMITER_TRUST_PROXY", "127.0.0.1")
        .spawn();
    let flooder = Some("198.51.100.66");
    let mut refused = None;
    for i in 0..3000 {
        let path = format!("/api/fleet/agents/fresh-{i}/checkin");
        let r = post(&gw, &path, flooder).await;
        if r.status() == 429 {
            refused = Some((i, r));
            break;
        }
        assert_eq!(r.status(), 200);
    }
    let (i, r) = refused.expect("the address ceiling refuses a flood of fresh ids");
    // Its burst of 2 000, and what it earned back (200 a minute) while the flood ran.
    assert!(i >= 2000, "refused after {i} fresh ids");
    assert!(r.headers().get("retry-after").is_some());
    let named = r
        .headers()
        .iter()
        .any(|(_, v)| v.to_str().unwrap_or("").contains("fleet-agents-ip"));
    assert!(named, "the address ceiling refused: {:?}", r.headers());
    // An agent at another address checks in.
    let r = post(
        &gw,
        "/api/fleet/agents/agent-elsewhere/checkin",
        Some("203.0.113.9"),
    )
    .await;
    assert_eq!(r.status(), 200);
}

#[test]
fn the_presets_pass_check() {
    for (name, toml) in [
        ("elastic-fleet", ELASTIC),
        ("fleetdm", FLEETDM),
        ("no limiter at all", "calibration = \"none\"\n"),
    ] {
        let out = Launch::command(["check"])
            .config_toml(toml)
            .unset("FLEET_LIMITER_ALLOW_UNSAFE_CALIBRATION")
            .run(LIMIT);
        assert_eq!(out.code, Some(0), "{name}: {}\n{}", out.stdout, out.stderr);
    }
}

#[test]
fn the_route_map_names_the_path_keys_of_the_elastic_preset() {
    let out = Launch::command(["routes"]).config_toml(ELASTIC).run(LIMIT);
    assert_eq!(out.code, Some(0), "{}\n{}", out.stdout, out.stderr);
    let line = |route: &str| {
        out.stdout
            .lines()
            .find(|l| l.starts_with(route))
            .unwrap_or_else(|| panic!("no line for {route}:\n{}", out.stdout))
            .to_owned()
    };
    let checkin = line("POST /api/fleet/agents/{id}/checkin ");
    assert!(
        checkin.contains("fleet-checkin (ip+path:id)") && checkin.contains("fleet-agents-ip (ip)"),
        "{checkin}"
    );
    assert!(line("GET /api/fleet/artifacts/** ").contains("fleet-artifacts (ip)"));
    // Starting from no calibration, no route serves a built-in role.
    assert!(!out.stdout.contains("agent-device"), "{}", out.stdout);
}

async fn osquery(gw: &Gateway, path: &str, node_key: &str) -> u16 {
    common::client()
        .post(gw.url(path))
        .header("content-type", "application/json")
        .body(format!("{{\"node_key\":\"{node_key}\"}}"))
        .send()
        .await
        .expect("request")
        .status()
        .as_u16()
}

#[tokio::test]
async fn fleetdm_keys_each_host_on_its_node_key() {
    let upstream = common::upstream().await;
    let gw = gateway(FLEETDM, &upstream.uri());
    assert_eq!(osquery(&gw, "/api/v1/osquery/enroll", "").await, 200);
    for _ in 0..30 {
        assert_eq!(
            osquery(&gw, "/api/v1/osquery/config", "host-a-key").await,
            200
        );
        assert_eq!(
            osquery(&gw, "/api/v1/osquery/distributed/read", "host-a-key").await,
            200
        );
    }
    assert_eq!(
        osquery(&gw, "/api/v1/osquery/config", "host-a-key").await,
        429
    );
    assert_eq!(
        osquery(&gw, "/api/v1/osquery/config", "host-b-key").await,
        200
    );
    // Results and logs are metered on the address, whatever their size.
    let big = format!(
        "{{\"node_key\":\"host-a-key\",\"data\":\"{}\"}}",
        "x".repeat(64 * 1024)
    );
    let r = common::client()
        .post(gw.url("/api/v1/osquery/log"))
        .header("content-type", "application/json")
        .body(big)
        .send()
        .await
        .expect("request");
    assert_eq!(r.status(), 200);
}

/// The start-up check holds the file's own limiters as it holds the built-ins: with no
/// calibration, an IP-keyed budget over the agents' routes that would lock a site out is
/// refused, and the same budget per agent starts.
#[test]
fn with_no_calibration_the_start_up_check_holds_the_files_limiters() {
    let agents = |key: &str| {
        format!("calibration = \"none\"\n[limiters.agents]\nlimit = 100\nwindow = \"15m\"\nkey = \"{key}\"\nroutes = [\"/api/agent/**\"]\nexcept = [\"POST /api/agent/enroll\", \"GET /api/agent/download/**\"]\n")
    };
    let out = Launch::serve()
        .config_toml(agents("ip"))
        .upstream("http://127.0.0.1:9")
        .unset("FLEET_LIMITER_ALLOW_UNSAFE_CALIBRATION")
        .run(LIMIT);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("unsafe: agents:"), "{}", out.stderr);
    let out = Launch::command(["check"])
        .config_toml(format!("{}[limiters.agents-ip]\nlimit = 25000\nwindow = \"15m\"\nkey = \"ip\"\nroutes = [\"/api/agent/**\"]\n", agents("ip+agent")))
        .unset("FLEET_LIMITER_ALLOW_UNSAFE_CALIBRATION")
        .run(LIMIT);
    assert_eq!(out.code, Some(0), "{}\n{}", out.stdout, out.stderr);
}
