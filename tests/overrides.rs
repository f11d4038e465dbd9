//! Limits that follow the customer, against the real binary: buckets per verified organisation
//! claim, plans chosen by a verified claim, overrides added at run time (on the memory store,
//! and on Redis shared by two instances within a second and surviving a restart), expiry, reset,
//! explain (which changes no bucket), the admin token, the commands, and `check` judging
//! overrides. Redis parts are skipped without redis-server, failed instead when `CI` is set.

mod common;
mod identity_support;
mod redis_support;

use common::{client, Gateway, Launch};
use identity_support::{claims, hs256, now};
use redis_support::{gateway, upstream, wait_for};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const SECRET: &str = "k3Jq8vT1xZp0Lw5Rb7Ny2Hc6Fd9Gs4Ma-overrides";
const TOKEN: &str = "9f1c2e7a4b8d0c6e3a5f7b9d1e2c4a6f";

/// A token for `sub` with these extra claims, signed with [`SECRET`].
fn token(sub: &str, extra: Value) -> String {
    let mut c = claims(sub);
    for (k, v) in extra.as_object().cloned().unwrap_or_default() {
        c[k] = v;
    }
    hs256(SECRET, &c)
}

/// The same token with its signature's last character changed.
fn tampered(t: &str) -> String {
    let mut s = t.to_owned();
    let last = s.pop().unwrap_or('A');
    s.push(if last == 'A' { 'B' } else { 'A' });
    s
}

#[derive(Debug, PartialEq, Eq)]
struct Seen {
    status: u16,
    limit: Option<u32>,
    remaining: Option<u32>,
}

async fn get(url: &str, headers: &[(&str, &str)]) -> Seen {
    let mut rb = client().get(url);
    for (k, v) in headers {
        rb = rb.header(*k, *v);
    }
    let r = rb.send().await.expect("the gateway answers");
    let num = |n: &str| {
        r.headers()
            .get(n)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
    };
    let seen = Seen {
        status: r.status().as_u16(),
        limit: num("x-ratelimit-limit"),
        remaining: num("x-ratelimit-remaining"),
    };
    assert!(seen.status < 500, "the limiter answered {seen:?}");
    seen
}

async fn admin_json(
    method: reqwest::Method,
    url: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> (u16, Value) {
    let mut rb = client().request(method, url);
    if let Some(t) = token {
        rb = rb.bearer_auth(t);
    }
    if let Some(b) = body {
        rb = rb.json(&b);
    }
    let r = rb.send().await.expect("the admin listener answers");
    let status = r.status().as_u16();
    let text = r.text().await.unwrap_or_default();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

const CLAIMS_CONFIG: &str = r#"
[limiters.org]
limit = 3
window = "1h"
key = "claim:org_id"
routes = ["/org/**"]

[limiters.reports]
limit = 2
window = "1h"
key = "user-or-ip"
routes = ["/reports/**"]
plan_claim = "plan"

[limiters.reports.plans.enterprise]
limit = 5
"#;

fn claims_gateway(up: &str) -> Gateway {
    Launch::serve()
        .config_toml(CLAIMS_CONFIG)
        .upstream(up)
        .admin()
        .env("FLEET_LIMITER_JWT_HS256_SECRET", SECRET)
        .spawn()
}

#[actix_rt::test]
async fn an_organisation_claim_keys_one_bucket_per_organisation_and_a_tampered_token_falls_back() {
    let up = upstream();
    let gw = claims_gateway(&up);
    let url = gw.url("/org/items");
    let a1 = format!("Bearer {}", token("alice", json!({"org_id": "org-a"})));
    let a2 = format!("Bearer {}", token("bob", json!({"org_id": "org-a"})));
    let b1 = format!("Bearer {}", token("carol", json!({"org_id": "org-b"})));
    // Alice and Bob share org-a's three requests.
    assert_eq!(
        get(&url, &[("authorization", &a1)]).await.remaining,
        Some(2)
    );
    assert_eq!(
        get(&url, &[("authorization", &a2)]).await.remaining,
        Some(1)
    );
    assert_eq!(
        get(&url, &[("authorization", &a1)]).await.remaining,
        Some(0)
    );
    assert_eq!(get(&url, &[("authorization", &a2)]).await.status, 429);
    // Carol's organisation has its own.
    assert_eq!(
        get(&url, &[("authorization", &b1)]).await.remaining,
        Some(2)
    );
    // A token whose signature does not verify names no organisation: the address's bucket,
    // not org-a's (refused) nor a fresh one per token.
    let forged = format!(
        "Bearer {}",
        tampered(&token("mallory", json!({"org_id": "org-a"})))
    );
    assert_eq!(
        get(&url, &[("authorization", &forged)]).await.remaining,
        Some(2)
    );
    let forged_b = format!(
        "Bearer {}",
        tampered(&token("mallory", json!({"org_id": "org-z"})))
    );
    assert_eq!(
        get(&url, &[("authorization", &forged_b)]).await.remaining,
        Some(1)
    );
    // A verified token without the claim keys on its user.
    let plain = format!("Bearer {}", token("dave", json!({})));
    assert_eq!(
        get(&url, &[("authorization", &plain)]).await.remaining,
        Some(2)
    );
    // Junk claim values (too long, spaces, nested) are no claim: the user again.
    for junk in [
        json!("x".repeat(200)),
        json!("org a"),
        json!({"id": "org-a"}),
    ] {
        let t = format!("Bearer {}", token("erin", json!({"org_id": junk})));
        let seen = get(&url, &[("authorization", &t)]).await;
        assert_eq!(seen.status, 200, "{seen:?}");
    }
}

#[actix_rt::test]
async fn a_plan_claim_raises_the_budget_only_when_verified() {
    let up = upstream();
    let gw = claims_gateway(&up);
    let url = gw.url("/reports/weekly");
    let ent = format!(
        "Bearer {}",
        token("ent-user", json!({"plan": "enterprise"}))
    );
    for left in (0..5).rev() {
        let seen = get(&url, &[("authorization", &ent)]).await;
        assert_eq!((seen.limit, seen.remaining), (Some(5), Some(left)));
    }
    assert_eq!(get(&url, &[("authorization", &ent)]).await.status, 429);
    // A plan not listed keeps the limiter's own budget.
    let free = format!("Bearer {}", token("free-user", json!({"plan": "free"})));
    assert_eq!(get(&url, &[("authorization", &free)]).await.limit, Some(2));
    // A forged enterprise token raises nothing: the address's own budget of 2.
    let forged = format!(
        "Bearer {}",
        tampered(&token("ent-user", json!({"plan": "enterprise"})))
    );
    let seen = get(&url, &[("authorization", &forged)]).await;
    assert_eq!((seen.limit, seen.remaining), (Some(2), Some(1)));
    assert_eq!(
        get(&url, &[("authorization", &forged)]).await.remaining,
        Some(0)
    );
    assert_eq!(get(&url, &[("authorization", &forged)]).await.status, 429);
}

/// Two limiters: an agent bucket (2 an hour) and a generous address ceiling.
const AGENT_CONFIG: &str = r#"
[limiters.device]
limit = 2
window = "1h"
key = "ip+agent"
routes = ["/dev/**"]

[limiters.device-ip]
limit = 1000
window = "1h"
key = "ip"
group = "device-ip"
routes = ["/dev/**"]
"#;

#[actix_rt::test]
async fn reset_unblocks_exactly_one_principal_and_explain_consumes_nothing() {
    let up = upstream();
    let gw = Launch::serve()
        .config_toml(AGENT_CONFIG)
        .upstream(&up)
        .admin()
        .log("info")
        .spawn();
    let url = gw.url("/dev/poll");
    for agent in ["host-1", "host-2"] {
        for _ in 0..2 {
            assert_eq!(get(&url, &[("x-agent-id", agent)]).await.status, 200);
        }
        assert_eq!(get(&url, &[("x-agent-id", agent)]).await.status, 429);
    }
    let explain = json!({"method": "GET", "path": "/dev/poll", "ip": "127.0.0.1",
                         "headers": {"X-Agent-ID": "host-1"}});
    let (status, before) = admin_json(
        reqwest::Method::POST,
        &gw.admin("/explain"),
        None,
        Some(explain.clone()),
    )
    .await;
    assert_eq!(status, 200, "{before}");
    assert_eq!(before["allowed"], false);
    assert_eq!(before["limiters"][0]["key"], "ip 127.0.0.1 + agent host-1");
    let (status, r) = admin_json(
        reqwest::Method::POST,
        &gw.admin("/reset"),
        None,
        Some(json!({"limiter": "device", "ip": "127.0.0.1", "headers": {"X-Agent-ID": "host-1"}, "by": "oncall"})),
    )
    .await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["reset"], true);
    assert_eq!(
        get(&url, &[("x-agent-id", "host-1")]).await.remaining,
        Some(1)
    );
    assert_eq!(get(&url, &[("x-agent-id", "host-2")]).await.status, 429);
    assert!(gw.stderr().contains("bucket reset"), "{}", gw.stderr());
    assert!(gw.stderr().contains("oncall"));
    // Many explains of many principals leave every bucket as it was.
    let snapshot = |v: &Value| -> Vec<(String, u64)> {
        v["limiters"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|l| {
                        (
                            l["limiter"].to_string(),
                            l["remaining"].as_u64().unwrap_or(99),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let (_, first) = admin_json(
        reqwest::Method::POST,
        &gw.admin("/explain"),
        None,
        Some(explain.clone()),
    )
    .await;
    for i in 0..40 {
        let agent = format!("host-{}", i % 4);
        let body = json!({"method": if i % 2 == 0 { "GET" } else { "POST" }, "path": "/dev/poll",
                          "ip": "127.0.0.1", "headers": {"X-Agent-ID": agent}});
        let (s, _) = admin_json(
            reqwest::Method::POST,
            &gw.admin("/explain"),
            None,
            Some(body),
        )
        .await;
        assert_eq!(s, 200);
    }
    let (_, again) = admin_json(
        reqwest::Method::POST,
        &gw.admin("/explain"),
        None,
        Some(explain),
    )
    .await;
    assert_eq!(snapshot(&first), snapshot(&again));
    assert_eq!(
        get(&url, &[("x-agent-id", "host-1")]).await.remaining,
        Some(0)
    );
    // Hostile explains: a clear 400, never a 5xx.
    for bad in [
        json!({"ip": "not-an-ip"}),
        json!({"ip": "127.0.0.1", "method": "G ET"}),
        json!({"ip": "127.0.0.1", "headers": {"bad name": "x"}}),
        json!({"ip": "127.0.0.1", "headers": {"x": "a\u{0}b"}}),
        json!({"ip": "127.0.0.1", "surprise": 1}),
        json!([1, 2]),
    ] {
        let (s, v) = admin_json(
            reqwest::Method::POST,
            &gw.admin("/explain"),
            None,
            Some(bad.clone()),
        )
        .await;
        assert_eq!(s, 400, "{bad} -> {v}");
    }
    let many: serde_json::Map<String, Value> =
        (0..100).map(|i| (format!("x-h{i}"), json!("v"))).collect();
    let (s, _) = admin_json(
        reqwest::Method::POST,
        &gw.admin("/explain"),
        None,
        Some(json!({"ip": "127.0.0.1", "headers": many})),
    )
    .await;
    assert_eq!(s, 400);
    let huge = "x".repeat(200 * 1024);
    let r = client()
        .post(gw.admin("/explain"))
        .header("content-type", "application/json")
        .body(huge)
        .send()
        .await
        .expect("answers");
    assert_eq!(r.status().as_u16(), 413);
    // Explain reports the path as the upstream would get it.
    let (s, v) = admin_json(
        reqwest::Method::POST,
        &gw.admin("/explain"),
        None,
        Some(json!({"ip": "127.0.0.1", "path": "/dev/%2e%2e/admin"})),
    )
    .await;
    assert_eq!(s, 200);
    assert_eq!(v["path"], "/admin", "{v}");
}

#[actix_rt::test]
async fn an_override_applies_at_once_and_stops_when_it_expires_or_is_removed() {
    let up = upstream();
    let gw = Launch::serve()
        .config_toml(AGENT_CONFIG)
        .upstream(&up)
        .admin()
        .log("info")
        .spawn();
    let url = gw.url("/dev/poll");
    for _ in 0..2 {
        assert_eq!(get(&url, &[("x-agent-id", "host-9")]).await.status, 200);
    }
    assert_eq!(get(&url, &[("x-agent-id", "host-9")]).await.status, 429);
    let expires = now() + 3;
    let t = |s: u64| {
        let out = std::process::Command::new("date")
            .args(["-u", "-d", &format!("@{s}"), "+%Y-%m-%dT%H:%M:%SZ"])
            .output()
            .expect("date");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    let (status, o) = admin_json(
        reqwest::Method::POST,
        &gw.admin("/overrides"),
        None,
        Some(
            json!({"limiter": "device", "match": "agent:host-*", "limit": 5, "window": "1h",
                    "expires": t(expires), "by": "rollout"}),
        ),
    )
    .await;
    assert_eq!(status, 201, "{o}");
    // The raised limit helps the refused client now: a bucket of 5 of its own.
    let seen = get(&url, &[("x-agent-id", "host-9")]).await;
    assert_eq!(
        (seen.status, seen.limit, seen.remaining),
        (200, Some(5), Some(4))
    );
    assert!(gw.stderr().contains("override added"));
    let (_, list) = admin_json(reqwest::Method::GET, &gw.admin("/overrides"), None, None).await;
    assert_eq!(
        list["overrides"].as_array().map(Vec::len),
        Some(1),
        "{list}"
    );
    // Past its expiry the limiter's own budget and bucket are back: still spent, so refused.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let seen = get(&url, &[("x-agent-id", "host-9")]).await;
        if seen.limit == Some(2) {
            assert_eq!(seen.status, 429);
            break;
        }
        assert!(Instant::now() < deadline, "the override never expired");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Lowering caps at once; removing restores.
    let (status, o) = admin_json(
        reqwest::Method::POST,
        &gw.admin("/overrides"),
        None,
        Some(json!({"limiter": "device", "match": "ip:127.0.0.0/8", "limit": 500, "window": "1h"})),
    )
    .await;
    assert_eq!(status, 201, "{o}");
    assert_eq!(
        get(&url, &[("x-agent-id", "host-9")]).await.limit,
        Some(500)
    );
    let id = o["id"].as_str().expect("an id").to_owned();
    let (status, _) = admin_json(
        reqwest::Method::DELETE,
        &gw.admin(&format!("/overrides/{id}")),
        None,
        None,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(get(&url, &[("x-agent-id", "host-9")]).await.status, 429);
    let (status, _) = admin_json(
        reqwest::Method::DELETE,
        &gw.admin(&format!("/overrides/{id}")),
        None,
        None,
    )
    .await;
    assert_eq!(status, 404);
    // Hostile overrides: each refused with the field named.
    for (bad, field) in [
        (
            json!({"limiter": "nope", "match": "ip:1.2.3.4", "limit": 1, "window": "1m"}),
            "limiter",
        ),
        (
            json!({"limiter": "device", "match": "ip:1.2.3.4/40", "limit": 1, "window": "1m"}),
            "match",
        ),
        (
            json!({"limiter": "device", "match": "agent:a*b", "limit": 1, "window": "1m"}),
            "match",
        ),
        (
            json!({"limiter": "device", "match": "ip:1.2.3.4", "limit": 0, "window": "1m"}),
            "limit",
        ),
        (
            json!({"limiter": "device", "match": "ip:1.2.3.4", "limit": 1, "window": "9d"}),
            "window",
        ),
        (
            json!({"limiter": "device", "match": "ip:1.2.3.4", "limit": 1, "window": "1m", "expires": "tomorrow"}),
            "expires",
        ),
        (
            json!({"limiter": "device", "match": "ip:1.2.3.4", "limit": 1, "window": "1m", "expires": "2001-01-01T00:00:00Z"}),
            "expires",
        ),
        (
            json!({"limiter": "device", "match": "ip:1.2.3.4", "limit": 1, "window": "1m", "id": "../../x"}),
            "id",
        ),
    ] {
        let (s, v) = admin_json(
            reqwest::Method::POST,
            &gw.admin("/overrides"),
            None,
            Some(bad.clone()),
        )
        .await;
        assert!(s == 400 || s == 404, "{bad} -> {s} {v}");
        assert_eq!(v["field"], field, "{bad} -> {v}");
    }
}

#[test]
fn check_and_serve_refuse_an_override_that_locks_agents_out() {
    let toml = r#"
[[overrides]]
limiter = "agent-device"
match = "agent:site-7-*"
limit = 1
window = "1h"
"#;
    let out = Launch::command(["check"])
        .config_toml(toml)
        .run(Duration::from_secs(30));
    assert_eq!(out.code, Some(1), "{}", out.stdout);
    assert!(out.stdout.contains("override cfg-"), "{}", out.stdout);
    assert!(out.stdout.contains("agent:site-7-*"), "{}", out.stdout);
    let served = Launch::serve()
        .unset("FLEET_LIMITER_ALLOW_UNSAFE_CALIBRATION")
        .config_toml(toml)
        .upstream("http://127.0.0.1:9")
        .run(Duration::from_secs(30));
    assert_ne!(served.code, Some(0));
    assert!(
        served.stderr.contains("agent:site-7-*"),
        "{}",
        served.stderr
    );
    // A configuration override naming no limiter is refused with the field and the fix.
    let bad = Launch::command(["check"])
        .config_toml("[[overrides]]\nlimiter = \"nope\"\nmatch = \"ip:1.2.3.4\"\nlimit = 5\nwindow = \"1m\"\n")
        .run(Duration::from_secs(30));
    assert_eq!(bad.code, Some(2), "{}", bad.stderr);
    assert!(
        bad.stderr.contains("overrides[0].limiter"),
        "{}",
        bad.stderr
    );
    // A generous one is fine.
    let ok = Launch::command(["check"])
        .config_toml("[[overrides]]\nlimiter = \"agent-device\"\nmatch = \"ip:203.0.113.0/24\"\nlimit = 300\nwindow = \"1m\"\n")
        .run(Duration::from_secs(30));
    assert_eq!(ok.code, Some(0), "{}", ok.stdout);
}

#[actix_rt::test]
async fn levers_need_the_token_beyond_loopback() {
    let up = upstream();
    let port = common::free_port();
    let gw = Launch::serve()
        .config_toml(AGENT_CONFIG)
        .upstream(&up)
        .arg("--admin-listen")
        .arg(format!("0.0.0.0:{port}"))
        .spawn();
    let admin = |p: &str| format!("http://127.0.0.1:{port}{p}");
    wait_for(
        || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(),
        "the admin listener",
    );
    let add = json!({"limiter": "device", "match": "ip:127.0.0.1", "limit": 9, "window": "1h"});
    let (s, v) = admin_json(
        reqwest::Method::POST,
        &admin("/overrides"),
        None,
        Some(add.clone()),
    )
    .await;
    assert_eq!(s, 403, "{v}");
    assert!(v["error"]
        .as_str()
        .unwrap_or("")
        .contains("ops.admin_token"));
    for (m, p) in [
        (reqwest::Method::GET, "/overrides"),
        (reqwest::Method::POST, "/reset"),
        (reqwest::Method::POST, "/explain"),
        (reqwest::Method::POST, "/reload"),
        (reqwest::Method::DELETE, "/overrides/abc"),
    ] {
        let (s, _) = admin_json(m.clone(), &admin(p), None, Some(json!({"ip": "127.0.0.1"}))).await;
        assert_eq!(s, 403, "{m} {p}");
    }
    let r = client()
        .get(admin("/metrics"))
        .send()
        .await
        .expect("metrics");
    assert_eq!(r.status().as_u16(), 200);
    drop(gw);

    let port = common::free_port();
    let gw = Launch::serve()
        .config_toml(AGENT_CONFIG)
        .upstream(&up)
        .arg("--admin-listen")
        .arg(format!("0.0.0.0:{port}"))
        .env("FLEET_LIMITER_ADMIN_TOKEN", TOKEN)
        .log("info")
        .spawn();
    let admin = |p: &str| format!("http://127.0.0.1:{port}{p}");
    wait_for(
        || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(),
        "the admin listener",
    );
    for t in [None, Some("wrong-token-wrong-token"), Some(&TOKEN[..31])] {
        let (s, _) = admin_json(
            reqwest::Method::POST,
            &admin("/overrides"),
            t,
            Some(add.clone()),
        )
        .await;
        assert_eq!(s, 401, "{t:?}");
    }
    let (s, v) = admin_json(
        reqwest::Method::POST,
        &admin("/overrides"),
        Some(TOKEN),
        Some(add),
    )
    .await;
    assert_eq!(s, 201, "{v}");
    assert_eq!(
        get(&gw.url("/dev/x"), &[("x-agent-id", "a")]).await.limit,
        Some(9)
    );
    assert!(!gw.stderr().contains(TOKEN), "the token reached the log");
    // A weak token stops the start, without echoing it.
    let weak = Launch::command(["check"])
        .env("FLEET_LIMITER_ADMIN_TOKEN", "changeme-changeme")
        .run(Duration::from_secs(30));
    assert_eq!(weak.code, Some(2), "{}", weak.stderr);
    assert!(weak.stderr.contains("ops.admin_token"), "{}", weak.stderr);
    assert!(
        !weak.stderr.contains("changeme-changeme"),
        "{}",
        weak.stderr
    );
}

#[actix_rt::test]
async fn the_commands_pull_the_levers_of_a_running_instance() {
    let up = upstream();
    let gw = Launch::serve()
        .config_toml(AGENT_CONFIG)
        .upstream(&up)
        .admin()
        .spawn();
    let admin = gw.admin("");
    // `<command> --admin URL <the rest>`: the admin flags go before a subcommand.
    let run = |args: &[&str]| {
        let mut argv = vec![args[0].to_owned(), "--admin".to_owned(), admin.clone()];
        argv.extend(args[1..].iter().map(|s| s.to_string()));
        Launch::command(argv).run(Duration::from_secs(30))
    };
    let added = run(&[
        "override",
        "add",
        "--limiter",
        "device",
        "--match",
        "agent:cli-*",
        "--limit",
        "7",
        "--window",
        "1h",
    ]);
    assert_eq!(added.code, Some(0), "{}", added.stderr);
    let v: Value = serde_json::from_str(&added.stdout).expect("JSON");
    let id = v["id"].as_str().expect("id").to_owned();
    let listed = run(&["override", "list"]);
    assert!(listed.stdout.contains(&id), "{}", listed.stdout);
    assert_eq!(
        get(&gw.url("/dev/a"), &[("x-agent-id", "cli-1")])
            .await
            .limit,
        Some(7)
    );
    let explained = run(&[
        "explain",
        "--path",
        "/dev/a",
        "--ip",
        "127.0.0.1",
        "-H",
        "X-Agent-ID: cli-1",
    ]);
    assert_eq!(explained.code, Some(0), "{}", explained.stderr);
    assert!(
        explained.stdout.contains(&format!("override {id}")),
        "{}",
        explained.stdout
    );
    assert!(
        explained.stdout.contains("\"remaining\": 5"),
        "{}",
        explained.stdout
    );
    let reset = run(&[
        "reset",
        "--limiter",
        "device",
        "--ip",
        "127.0.0.1",
        "-H",
        "X-Agent-ID: cli-1",
    ]);
    assert_eq!(reset.code, Some(0), "{}", reset.stderr);
    assert_eq!(
        get(&gw.url("/dev/a"), &[("x-agent-id", "cli-1")])
            .await
            .remaining,
        Some(6)
    );
    let removed = run(&["override", "remove", &id]);
    assert_eq!(removed.code, Some(0), "{}", removed.stderr);
    let again = run(&["override", "remove", &id]);
    assert_eq!(again.code, Some(1), "{}", again.stderr);
    let refused = run(&[
        "override",
        "add",
        "--limiter",
        "device",
        "--match",
        "ip:1.2.3.4",
        "--limit",
        "0",
        "--window",
        "1h",
    ]);
    assert_eq!(refused.code, Some(1));
    assert!(
        refused.stderr.contains("not a budget"),
        "{}",
        refused.stderr
    );
    let unreachable = Launch::command([
        "override",
        "list",
        "--admin",
        &format!("http://{}", common::dead_addr()),
    ])
    .run(Duration::from_secs(30));
    assert_eq!(unreachable.code, Some(2), "{}", unreachable.stderr);
}

/// Redis with two instances: an override added on one lifts a refused client on both within a
/// second, outlives a restart, and a reset on one unblocks on both.
#[actix_rt::test]
async fn on_redis_two_instances_share_overrides_and_resets() {
    let Some(redis) = redis_support::standalone() else {
        return;
    };
    let prefix = format!("ov{:06x}", rand::random::<u32>() & 0xff_ffff);
    let config = format!(
        r#"
[store]
url = "{url}"

[limiters.{prefix}]
limit = 2
window = "1h"
key = "ip+agent"
routes = ["/{prefix}/**"]

[limiters.{prefix}-ip]
limit = 1000
window = "1h"
key = "ip"
group = "{prefix}-ip"
routes = ["/{prefix}/**"]
"#,
        url = redis.url()
    );
    let up = upstream();
    let a = gateway(&config, &up, &[], &[]);
    let mut b = gateway(&config, &up, &[], &[]);
    let path = format!("/{prefix}/poll");
    let agent = [("x-agent-id", "shared-agent")];
    for _ in 0..2 {
        assert_eq!(get(&a.url(&path), &agent).await.status, 200);
    }
    assert_eq!(get(&a.url(&path), &agent).await.status, 429);
    assert_eq!(get(&b.url(&path), &agent).await.status, 429);
    let (s, o) = admin_json(
        reqwest::Method::POST,
        &a.admin("/overrides"),
        None,
        Some(json!({"limiter": prefix, "match": "agent:shared-*", "limit": 4, "window": "1h"})),
    )
    .await;
    assert_eq!(s, 201, "{o}");
    let seen = get(&a.url(&path), &agent).await;
    assert_eq!(
        (seen.status, seen.limit, seen.remaining),
        (200, Some(4), Some(3))
    );
    // B takes it within a second, on the one bucket both share (now 2 of 4 spent).
    let started = Instant::now();
    let seen = loop {
        let seen = get(&b.url(&path), &agent).await;
        if seen.limit == Some(4) {
            break seen;
        }
        assert_eq!(seen.status, 429, "{seen:?}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "instance B never took the override"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    println!("instance B took the override after {:?}", started.elapsed());
    assert_eq!((seen.status, seen.remaining), (200, Some(2)), "{seen:?}");
    assert_eq!(get(&a.url(&path), &agent).await.remaining, Some(1));
    assert_eq!(get(&b.url(&path), &agent).await.remaining, Some(0));
    assert_eq!(get(&a.url(&path), &agent).await.status, 429);
    // An agent the override does not match keeps the limiter's own budget.
    assert_eq!(
        get(&b.url(&path), &[("x-agent-id", "probe")]).await.limit,
        Some(2)
    );
    // A restarted instance reads the override back from Redis at start.
    drop(b);
    b = gateway(&config, &up, &[], &[]);
    let (_, list) = admin_json(reqwest::Method::GET, &b.admin("/overrides"), None, None).await;
    assert!(list.to_string().contains("agent:shared-*"), "{list}");
    // A reset on B unblocks A's refused agent too (A drops its cached refusal within a second).
    let (s, r) = admin_json(
        reqwest::Method::POST,
        &b.admin("/reset"),
        None,
        Some(json!({"limiter": prefix, "ip": "127.0.0.1", "headers": {"X-Agent-ID": "shared-agent"}})),
    )
    .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["reset"], true);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let seen = get(&a.url(&path), &agent).await;
        if seen.status == 200 {
            break;
        }
        if Instant::now() >= deadline {
            let body = json!({"method": "GET", "path": path, "ip": "127.0.0.1", "headers": {"X-Agent-ID": "shared-agent"}});
            let (_, e) = admin_json(
                reqwest::Method::POST,
                &a.admin("/explain"),
                None,
                Some(body),
            )
            .await;
            panic!("instance A never saw the reset: {e}\n{}", a.stderr());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Explain on Redis consumes nothing.
    let body = json!({"method": "GET", "path": path, "ip": "127.0.0.1", "headers": {"X-Agent-ID": "shared-agent"}});
    let (_, first) = admin_json(
        reqwest::Method::POST,
        &a.admin("/explain"),
        None,
        Some(body.clone()),
    )
    .await;
    for _ in 0..20 {
        let _ = admin_json(
            reqwest::Method::POST,
            &b.admin("/explain"),
            None,
            Some(body.clone()),
        )
        .await;
    }
    let (_, again) = admin_json(
        reqwest::Method::POST,
        &a.admin("/explain"),
        None,
        Some(body),
    )
    .await;
    assert_eq!(first["limiters"], again["limiters"], "{first} {again}");
    // Clean the shared table for the next run.
    let id = o["id"].as_str().unwrap_or_default().to_owned();
    let (s, _) = admin_json(
        reqwest::Method::DELETE,
        &a.admin(&format!("/overrides/{id}")),
        None,
        None,
    )
    .await;
    assert_eq!(s, 200);
}

/// Redis with two instances: an organisation's users share one bucket whichever instance
/// answers, a plan raises it only when verified, and a forged token keys on the address.
#[actix_rt::test]
async fn on_redis_an_organisation_and_its_plan_are_shared_by_two_instances() {
    let Some(redis) = redis_support::standalone() else {
        return;
    };
    let prefix = format!("org{:06x}", rand::random::<u32>() & 0xff_ffff);
    let config = format!(
        r#"
[store]
url = "{url}"

[limiters.{prefix}]
limit = 3
window = "1h"
key = "claim:org_id"
routes = ["/{prefix}/**"]
plan_claim = "plan"

[limiters.{prefix}.plans.enterprise]
limit = 6
"#,
        url = redis.url()
    );
    let up = upstream();
    let env = [("FLEET_LIMITER_JWT_HS256_SECRET", SECRET)];
    let a = gateway(&config, &up, &[], &env);
    let b = gateway(&config, &up, &[], &env);
    let path = format!("/{prefix}/items");
    let org = |sub: &str, org: &str, plan: &str| {
        format!(
            "Bearer {}",
            token(sub, json!({"org_id": org, "plan": plan}))
        )
    };
    // org-a on the free plan: 3 between both instances and both of its users.
    let (u1, u2) = (org("u1", "org-a", "free"), org("u2", "org-a", "free"));
    assert_eq!(
        get(&a.url(&path), &[("authorization", &u1)])
            .await
            .remaining,
        Some(2)
    );
    assert_eq!(
        get(&b.url(&path), &[("authorization", &u2)])
            .await
            .remaining,
        Some(1)
    );
    assert_eq!(
        get(&a.url(&path), &[("authorization", &u2)])
            .await
            .remaining,
        Some(0)
    );
    assert_eq!(
        get(&b.url(&path), &[("authorization", &u1)]).await.status,
        429
    );
    // org-b on the enterprise plan: 6, shared the same way.
    let e1 = org("e1", "org-b", "enterprise");
    for (i, gw) in [&a, &b, &a, &b, &a, &b].iter().enumerate() {
        let seen = get(&gw.url(&path), &[("authorization", &e1)]).await;
        assert_eq!(
            (seen.limit, seen.remaining),
            (Some(6), Some(5 - i as u32)),
            "{i}"
        );
    }
    assert_eq!(
        get(&a.url(&path), &[("authorization", &e1)]).await.status,
        429
    );
    // A forged enterprise token for org-a gets neither org-a's bucket nor the plan.
    let forged = format!(
        "Bearer {}",
        tampered(&token(
            "m",
            json!({"org_id": "org-a", "plan": "enterprise"})
        ))
    );
    let seen = get(&b.url(&path), &[("authorization", &forged)]).await;
    assert_eq!(
        (seen.status, seen.limit, seen.remaining),
        (200, Some(3), Some(2))
    );
}

/// `override add --expires 2h`: the instance resolves the time from now on its own clock and
/// answers the instant; hostile spellings are refused naming `expires`, an id given with `--id`
/// removes it, and a file's `[[overrides]]` with a time from now is refused at load.
#[actix_rt::test]
async fn an_override_added_with_a_time_from_now_expires_then() {
    let up = upstream();
    let gw = Launch::serve()
        .config_toml(AGENT_CONFIG)
        .upstream(&up)
        .admin()
        .spawn();
    let admin = gw.admin("");
    let run = |args: &[&str]| {
        let mut argv = vec![args[0].to_owned(), "--admin".to_owned(), admin.clone()];
        argv.extend(args[1..].iter().map(|s| s.to_string()));
        Launch::command(argv).run(Duration::from_secs(30))
    };
    let add = |expires: &str, id: &str| {
        run(&[
            "override",
            "add",
            "--limiter",
            "device",
            "--match",
            "agent:cli-*",
            "--limit",
            "7",
            "--window",
            "1h",
            "--expires",
            expires,
            "--id",
            id,
        ])
    };
    let before = now();
    let added = add("2h", "rollout-2h");
    assert_eq!(added.code, Some(0), "{}", added.stderr);
    let v: Value = serde_json::from_str(&added.stdout).expect("JSON");
    assert_eq!(v["id"], "rollout-2h", "{v}");
    let expires = v["expires"]
        .as_str()
        .expect("an instant is answered")
        .to_owned();
    let listed = run(&["override", "list"]);
    assert!(listed.stdout.contains(&expires), "{}", listed.stdout);
    // The instant is two hours after the request, on the instance's clock (the same host's).
    let (status, all) = admin_json(reqwest::Method::GET, &gw.admin("/overrides"), None, None).await;
    assert_eq!(status, 200, "{all}");
    let at = unix_of(&expires);
    assert!(
        (before + 7200..=now() + 7200).contains(&at),
        "{expires} is not two hours from {before}"
    );
    assert_eq!(
        get(&gw.url("/dev/a"), &[("x-agent-id", "cli-1")])
            .await
            .limit,
        Some(7)
    );
    for (bad, says) in [
        ("2026", "has no unit"),
        ("0s", "at least 1s"),
        ("367d", "further than 366d"),
        ("2w", "neither a time from now"),
        ("99999999999999999999d", "neither a time from now"),
    ] {
        let refused = add(bad, "refused-one");
        assert_eq!(refused.code, Some(1), "{bad}: {}", refused.stderr);
        assert!(refused.stderr.contains(says), "{bad}: {}", refused.stderr);
    }
    // Over HTTP the refusal names the field.
    for bad in ["2026", "-2h", "2h ago", ""] {
        let (status, body) = admin_json(
            reqwest::Method::POST,
            &gw.admin("/overrides"),
            None,
            Some(json!({"limiter": "device", "match": "agent:x", "limit": 7, "window": "1h", "expires": bad})),
        )
        .await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert_eq!(body["field"], "expires", "{bad}: {body}");
    }
    let removed = run(&["override", "remove", "rollout-2h"]);
    assert_eq!(removed.code, Some(0), "{}", removed.stderr);
    assert_eq!(
        get(&gw.url("/dev/a"), &[("x-agent-id", "cli-2")])
            .await
            .limit,
        Some(2)
    );
    let file = Launch::command(["check"])
        .config_toml(format!(
            "{AGENT_CONFIG}\n[[overrides]]\nlimiter = \"device\"\nmatch = \"agent:x\"\nlimit = 5\nwindow = \"1h\"\nexpires = \"2h\"\n"
        ))
        .run(Duration::from_secs(30));
    assert_eq!(file.code, Some(2), "{}", file.stderr);
    assert!(
        file.stderr
            .contains("a time from now, which would move at every reload"),
        "{}",
        file.stderr
    );
}

/// `YYYY-MM-DDTHH:MM:SSZ` as seconds since the Unix epoch.
fn unix_of(t: &str) -> u64 {
    let n = |r: std::ops::Range<usize>| -> i64 { t[r].parse().expect("a number") };
    let (y, m, d) = (n(0..4), n(5..7), n(8..10));
    // Days from 1970-01-01 to y-m-d (the proleptic Gregorian calendar).
    let (y, m) = if m <= 2 { (y - 1, m + 9) } else { (y, m - 3) };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * m + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    (days * 86_400 + n(11..13) * 3600 + n(14..16) * 60 + n(17..19)) as u64
}
