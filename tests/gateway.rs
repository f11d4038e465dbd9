//! The gateway end to end: the real binary, over real HTTP, in front of a `wiremock` upstream.
//!
//! No assertion depends on how fast the machine is. Where a bucket could refill while a test
//! runs, either the windows are stretched to 7 days (the budgets stay the built-in ones), or
//! the measured elapsed time only widens the accepted range.

mod common;

use common::{
    client, parse_policy, parse_ratelimit, raw_request, received, upstream, Gateway, Launch,
};
use reqwest::{Method, Response};
use std::sync::Arc;
use std::time::{Duration, Instant};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

/// One built-in limiter: (name, budget, window seconds, method, path, extra headers).
type Row = (
    &'static str,
    u64,
    u64,
    &'static str,
    &'static str,
    &'static [(&'static str, &'static str)],
);

/// The built-in calibration, and a request each limiter meters.
const TABLE: &[Row] = &[
    (
        "agent-device",
        30,
        60,
        "POST",
        "/api/agent/heartbeat",
        &[("x-agent-id", "agent-7")],
    ),
    ("enrollment", 300, 900, "POST", "/api/agent/enroll", &[]),
    (
        "download",
        300,
        900,
        "GET",
        "/api/agent/download/linux-x64",
        &[],
    ),
    ("key-rotation", 3, 900, "POST", "/api/agent/rotate-key", &[]),
    ("ui", 1000, 900, "GET", "/api/tasks", &[]),
    (
        "cli-bearer",
        60,
        60,
        "GET",
        "/api/tasks",
        &[("authorization", "Bearer sometoken")],
    ),
    (
        "api-key",
        60,
        60,
        "GET",
        "/api/tasks",
        &[("authorization", "Bearer pa_x")],
    ),
    (
        "cli-device-code",
        10,
        60,
        "POST",
        "/api/cli/auth/device/code",
        &[],
    ),
    (
        "cli-device-poll",
        60,
        60,
        "POST",
        "/api/cli/auth/device/token",
        &[],
    ),
    ("cli-refresh", 10, 60, "POST", "/api/cli/auth/refresh", &[]),
];

/// `FLEET_LIMITER_LIMITER_<NAME>_WINDOW=7d` for every built-in limiter: the budgets stay, but
/// nothing refills while a test runs.
fn stretched_windows(mut l: Launch) -> Launch {
    for (name, ..) in TABLE {
        let var = format!(
            "FLEET_LIMITER_LIMITER_{}_WINDOW",
            name.to_ascii_uppercase().replace('-', "_")
        );
        l = l.env(var, "7d");
    }
    l
}

const WEEK: u64 = 7 * 86_400;

fn trusting_loopback(l: Launch) -> Launch {
    l.args(["--trust-proxy", "127.0.0.1/32"])
}

async fn send(gw: &Gateway, method: &str, path: &str, headers: &[(&str, &str)]) -> Response {
    let mut req = client().request(Method::from_bytes(method.as_bytes()).unwrap(), gw.url(path));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send()
        .await
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

fn header<'a>(res: &'a Response, name: &str) -> Option<&'a str> {
    res.headers().get(name).and_then(|v| v.to_str().ok())
}

/// `RateLimit` entry of one limiter: (remaining, reset seconds).
fn limit_state(res: &Response, limiter: &str) -> Option<(u64, u64)> {
    parse_ratelimit(header(res, "ratelimit")?)
        .into_iter()
        .find(|(n, ..)| n == limiter)
        .map(|(_, r, t)| (r, t))
}

/// Checks a 429 and returns its `Retry-After`.
async fn assert_problem_429(res: Response) -> u64 {
    assert_eq!(res.status(), 429);
    assert_eq!(
        header(&res, "content-type"),
        Some("application/problem+json")
    );
    let retry: u64 = header(&res, "retry-after")
        .expect("Retry-After")
        .parse()
        .expect("whole seconds");
    assert!(retry >= 1, "Retry-After is never 0");
    assert!(header(&res, "ratelimit").is_some() && header(&res, "ratelimit-policy").is_some());
    let body: serde_json::Value = res.json().await.expect("problem+json body");
    assert_eq!(body["status"], 429);
    assert_eq!(body["title"], "Too Many Requests");
    assert!(body["type"].as_str().is_some_and(|t| !t.is_empty()));
    assert!(body["detail"]
        .as_str()
        .is_some_and(|d| d.contains(&retry.to_string())));
    assert_eq!(body["retry_after"], retry);
    retry
}

/// The cascade the `agent-ip` ceiling must not cause: one host at a site's NAT sends a fresh
/// agent id on every request, draining the ceiling, while the site's agents heartbeat on. The
/// ceiling meters new ids only: the known agents are never refused, and the rotating host gets
/// no more new ids than the ceiling's burst and refill allow.
#[tokio::test]
async fn a_client_rotating_agent_ids_never_takes_the_site_s_agents_offline() {
    let up = upstream().await;
    let gw = Gateway::serve().upstream(&up.uri()).spawn();
    let started = std::time::Instant::now();
    let agents: Vec<String> = (0..20).map(|i| format!("healthy-{i}")).collect();
    for a in &agents {
        let res = send(&gw, "POST", "/api/agent/heartbeat", &[("x-agent-id", a)]).await;
        assert_eq!(res.status(), 200, "{a}");
    }
    // Known now: a second heartbeat is metered by the agent's own budget only.
    let res = send(
        &gw,
        "POST",
        "/api/agent/heartbeat",
        &[("x-agent-id", "healthy-0")],
    )
    .await;
    assert_eq!(
        header(&res, "ratelimit-policy"),
        Some("\"agent-device\";q=30;w=60")
    );
    let (mut admitted, mut refused) = (0u64, 0u64);
    for i in 0..600 {
        let id = format!("rotating-{i:04}");
        match send(&gw, "GET", "/api/agent/poll", &[("x-agent-id", &id)])
            .await
            .status()
            .as_u16()
        {
            200 => admitted += 1,
            429 => refused += 1,
            other => panic!("rotating request {i}: {other}"),
        }
        if i % 50 == 0 {
            for a in &agents {
                let res = send(&gw, "POST", "/api/agent/heartbeat", &[("x-agent-id", a)]).await;
                assert_eq!(
                    res.status(),
                    200,
                    "{a} refused while the ceiling is drained"
                );
            }
        }
    }
    assert!(refused > 0, "the ceiling never refused the rotating host");
    // 250 new ids at once (20 of them the site's own), then 250 a minute.
    let refill = (started.elapsed().as_secs_f64() * 250.0 / 60.0).ceil() as u64;
    assert!(
        admitted <= 230 + refill + 1,
        "{admitted} admitted, refill {refill}"
    );
}

#[tokio::test]
async fn forwards_an_allowed_request_and_reports_its_limit() {
    let up = upstream().await;
    let gw = Gateway::serve().upstream(&up.uri()).spawn();
    let res = send(
        &gw,
        "GET",
        "/api/agent/heartbeat",
        &[("x-agent-id", "agent-1")],
    )
    .await;
    assert_eq!(res.status(), 200);
    assert_eq!(
        header(&res, "ratelimit-policy"),
        Some("\"agent-device\";q=30;w=60, \"agent-ip\";q=250;w=60")
    );
    // Each partition key is 8 bytes of its bucket's name in this process (keyed SipHash).
    let ratelimit = header(&res, "ratelimit").unwrap_or_default();
    let masked: Vec<String> = ratelimit
        .split(";pk=:")
        .enumerate()
        .map(|(i, part)| match (i, part.split_once(':')) {
            (0, _) => part.to_owned(),
            (_, Some((pk, rest))) => {
                assert_eq!(pk.len(), 12, "{ratelimit}");
                format!(";pk=:…:{rest}")
            }
            (_, None) => panic!("{ratelimit}"),
        })
        .collect();
    assert_eq!(
        masked.concat(),
        "\"agent-device\";r=29;t=2;pk=:…:, \"agent-ip\";r=249;t=1;pk=:…:"
    );
    assert_eq!(header(&res, "x-ratelimit-limit"), Some("30"));
    assert_eq!(header(&res, "x-ratelimit-remaining"), Some("29"));
    assert_eq!(res.text().await.unwrap(), "ok");
    assert_eq!(received(&up).await, 1);
}

#[tokio::test]
async fn the_31st_agent_request_is_refused_while_another_agent_on_the_ip_passes() {
    let up = upstream().await;
    let gw = Gateway::serve().upstream(&up.uri()).spawn();
    let agent = [("x-agent-id", "agent-a")];
    let start = Instant::now();
    let mut allowed = 0u64;
    let refusal = loop {
        let res = send(&gw, "POST", "/api/agent/heartbeat", &agent).await;
        if res.status() == 429 {
            break res;
        }
        assert_eq!(res.status(), 200);
        allowed += 1;
        assert!(allowed <= 100, "never refused");
    };
    let elapsed = start.elapsed().as_secs_f64();
    // One token comes back every 2 s; only a machine slower than that could see more than 30.
    assert!(allowed >= 30, "refused early, after {allowed}");
    assert!(
        allowed <= 30 + (elapsed / 2.0).floor() as u64,
        "{allowed} allowed in {elapsed:.2}s"
    );
    // The exact wait is 2 s minus the time since the first request: Retry-After is its ceiling.
    let retry = assert_problem_429(refusal).await;
    let lowest = (2.0 - elapsed).ceil().max(1.0) as u64;
    assert!(
        (lowest..=2).contains(&retry),
        "Retry-After {retry} after {elapsed:.2}s"
    );
    if elapsed < 1.0 {
        assert_eq!(retry, 2);
    }
    // The same IP with another agent id has a bucket of its own.
    let other = send(
        &gw,
        "POST",
        "/api/agent/heartbeat",
        &[("x-agent-id", "agent-b")],
    )
    .await;
    assert_eq!(other.status(), 200);
    assert_eq!(limit_state(&other, "agent-device").map(|s| s.0), Some(29));
    // Refused requests never reached the upstream.
    assert_eq!(received(&up).await as u64, allowed + 1);
}

#[tokio::test]
async fn every_default_limiter_refuses_exactly_at_its_budget() {
    let up = upstream().await;
    let gw = stretched_windows(trusting_loopback(Gateway::serve().upstream(&up.uri()))).spawn();
    let mut forwarded = 0u64;
    for (i, (name, limit, _, method, path, extra)) in TABLE.iter().enumerate() {
        let client_ip = format!("198.51.100.{}", i + 1);
        let mut headers: Vec<(&str, &str)> = extra.to_vec();
        headers.push(("x-forwarded-for", &client_ip));
        let start = Instant::now();
        for n in 1..=*limit {
            let res = send(&gw, method, path, &headers).await;
            assert_eq!(res.status(), 200, "{name}: request {n} of {limit}");
            assert_eq!(
                limit_state(&res, name).map(|s| s.0),
                Some(limit - n),
                "{name}: request {n}"
            );
        }
        let res = send(&gw, method, path, &headers).await;
        let elapsed = start.elapsed().as_secs();
        assert_eq!(
            res.status(),
            429,
            "{name}: request {} must be the first refusal",
            limit + 1
        );
        assert_eq!(
            limit_state(&res, name).map(|s| s.0),
            Some(0),
            "{name} is the one that refused"
        );
        let policy = parse_policy(header(&res, "ratelimit-policy").unwrap());
        assert!(
            policy.contains(&(name.to_string(), *limit, WEEK)),
            "{name}: {policy:?}"
        );
        // The wait is one emission interval (window / budget) less the time since the first
        // request, rounded up.
        let interval = WEEK.div_ceil(*limit);
        let retry = assert_problem_429(res).await;
        assert!(
            (interval.saturating_sub(elapsed + 1)..=interval).contains(&retry),
            "{name}: Retry-After {retry}, interval {interval}"
        );
        forwarded += limit;
        assert_eq!(
            received(&up).await as u64,
            forwarded,
            "{name}: a refusal reached the upstream"
        );
    }
}

#[tokio::test]
async fn default_windows_are_the_calibrated_ones() {
    let up = upstream().await;
    let gw = trusting_loopback(Gateway::serve().upstream(&up.uri())).spawn();
    for (i, (name, limit, window, method, path, extra)) in TABLE.iter().enumerate() {
        let client_ip = format!("198.51.100.{}", i + 1);
        let mut headers: Vec<(&str, &str)> = extra.to_vec();
        headers.push(("x-forwarded-for", &client_ip));
        let res = send(&gw, method, path, &headers).await;
        assert_eq!(res.status(), 200);
        let policy = parse_policy(header(&res, "ratelimit-policy").unwrap());
        assert!(
            policy.contains(&(name.to_string(), *limit, *window)),
            "{name}: {policy:?}"
        );
        // A full bucket less one request refills in one emission interval.
        let (r, t) = limit_state(&res, name).unwrap();
        assert_eq!(
            (r, t),
            (limit - 1, (window * 1000).div_ceil(limit * 1000)),
            "{name}"
        );
    }
}

/// Exhaust key-rotation (3 per 15 minutes: nothing refills during a test) for this client.
async fn exhaust_key_rotation(gw: &Gateway, headers: &[(&str, &str)]) {
    for n in 1..=3 {
        let res = send(gw, "POST", "/api/agent/rotate-key", headers).await;
        assert_eq!(res.status(), 200, "request {n} with {headers:?}");
    }
}

async fn key_rotation_status(gw: &Gateway, headers: &[(&str, &str)]) -> u16 {
    send(gw, "POST", "/api/agent/rotate-key", headers)
        .await
        .status()
        .as_u16()
}

#[tokio::test]
async fn ipv6_clients_in_one_56_share_a_bucket_and_the_next_56_does_not() {
    let up = upstream().await;
    let gw = trusting_loopback(Gateway::serve().upstream(&up.uri())).spawn();
    exhaust_key_rotation(&gw, &[("x-forwarded-for", "2001:db8:abcd:1200::1")]).await;
    let same_56 = [("x-forwarded-for", "2001:db8:abcd:12ff:ffff:ffff:ffff:fffe")];
    assert_eq!(key_rotation_status(&gw, &same_56).await, 429);
    let next_56 = [("x-forwarded-for", "2001:db8:abcd:1300::1")];
    assert_eq!(key_rotation_status(&gw, &next_56).await, 200);
}

#[tokio::test]
async fn ipv4_mapped_ipv6_and_ipv4_share_a_bucket() {
    let up = upstream().await;
    let gw = trusting_loopback(Gateway::serve().upstream(&up.uri())).spawn();
    exhaust_key_rotation(&gw, &[("x-forwarded-for", "::ffff:203.0.113.5")]).await;
    assert_eq!(
        key_rotation_status(&gw, &[("x-forwarded-for", "203.0.113.5")]).await,
        429
    );
    assert_eq!(
        key_rotation_status(&gw, &[("x-forwarded-for", "[::ffff:203.0.113.5]:443")]).await,
        429
    );
    assert_eq!(
        key_rotation_status(&gw, &[("x-forwarded-for", "203.0.113.6")]).await,
        200
    );
}

#[tokio::test]
async fn spoofed_forwarding_headers_from_an_untrusted_peer_change_nothing() {
    let up = upstream().await;
    // No trusted proxies at all, and trusted proxies that do not include the peer.
    for extra in [
        vec![],
        vec!["--trust-proxy", "10.0.0.0/8", "--trust-proxy", "::1"],
    ] {
        let gw = Gateway::serve()
            .upstream(&up.uri())
            .args(extra.clone())
            .spawn();
        spoofing_from(&gw).await;
    }
}

async fn spoofing_from(gw: &Gateway) {
    for (n, fake) in ["1.1.1.1", "2.2.2.2", "2001:db8::1"].iter().enumerate() {
        let res = send(
            gw,
            "POST",
            "/api/agent/rotate-key",
            &[("x-forwarded-for", fake)],
        )
        .await;
        assert_eq!(res.status(), 200, "request {}", n + 1);
    }
    for spoof in ["9.9.9.9", "3.3.3.3, 4.4.4.4"] {
        let headers = [("x-forwarded-for", spoof), ("forwarded", "for=5.5.5.5")];
        assert_eq!(key_rotation_status(gw, &headers).await, 429, "{spoof}");
    }
}

#[tokio::test]
async fn behind_a_trusted_proxy_the_rightmost_untrusted_hop_is_the_client() {
    let up = upstream().await;
    let gw = trusting_loopback(Gateway::serve().upstream(&up.uri())).spawn();
    exhaust_key_rotation(&gw, &[("x-forwarded-for", "203.0.113.9")]).await;
    // A client-supplied entry on the left cannot hide the address the proxy appended.
    assert_eq!(
        key_rotation_status(&gw, &[("x-forwarded-for", "6.6.6.6, 203.0.113.9")]).await,
        429
    );
    assert_eq!(
        key_rotation_status(&gw, &[("x-forwarded-for", "203.0.113.9, 6.6.6.7")]).await,
        200
    );
    // Trusted hops are skipped.
    assert_eq!(
        key_rotation_status(&gw, &[("x-forwarded-for", "203.0.113.9, 127.0.0.1")]).await,
        429
    );
}

#[tokio::test]
async fn the_rfc7239_forwarded_header_when_configured() {
    let up = upstream().await;
    let gw = trusting_loopback(Gateway::serve().upstream(&up.uri()))
        .args(["--forwarded-header", "forwarded"])
        .spawn();
    exhaust_key_rotation(
        &gw,
        &[("forwarded", "for=\"[2001:db8:1::1]:443\";proto=https")],
    )
    .await;
    let same_56 = [("forwarded", "for=6.6.6.6, for=\"[2001:db8:1:ff::2]\"")];
    assert_eq!(key_rotation_status(&gw, &same_56).await, 429);
    // X-Forwarded-For is not read in this mode.
    let xff = [
        ("forwarded", "for=\"[2001:db8:1::1]\""),
        ("x-forwarded-for", "7.7.7.7"),
    ];
    assert_eq!(key_rotation_status(&gw, &xff).await, 429);
    assert_eq!(
        key_rotation_status(&gw, &[("forwarded", "For=\"[2001:db8:1:100::1]\"")]).await,
        200
    );
    // Without a Forwarded header the trusted peer itself is the client.
    assert_eq!(
        key_rotation_status(&gw, &[("x-forwarded-for", "2001:db8:1::1")]).await,
        200
    );
}

#[tokio::test]
async fn unmetered_paths_are_never_limited_and_carry_no_headers() {
    let up = upstream().await;
    let gw = Gateway::serve().upstream(&up.uri()).spawn();
    for path in ["/healthz", "/static/a.js", "/", "/apix/tasks"] {
        for _ in 0..40 {
            let res = send(&gw, "POST", path, &[("authorization", "Bearer pa_x")]).await;
            assert_eq!(res.status(), 200, "{path}");
            for h in [
                "ratelimit",
                "ratelimit-policy",
                "x-ratelimit-limit",
                "retry-after",
            ] {
                assert!(res.headers().get(h).is_none(), "{path} carries {h}");
            }
        }
    }
    // More than the largest budget on /api/**: cron stays unmetered, whatever credential the
    // scheduler sends.
    for auth in ["", "Bearer cron-secret", "Bearer pa_cron"] {
        for _ in 0..1001 {
            let headers: &[(&str, &str)] = if auth.is_empty() {
                &[]
            } else {
                &[("authorization", auth)]
            };
            let res = send(&gw, "GET", "/api/cron/x", headers).await;
            assert_eq!(res.status(), 200, "{auth}");
            assert!(res.headers().get("ratelimit").is_none(), "{auth}");
        }
    }
}

fn pattern(len: usize) -> Vec<u8> {
    let mut x: u32 = 0x1234_5678;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

#[tokio::test]
async fn requests_arrive_upstream_unchanged_but_for_the_canonical_path() {
    let up = upstream().await;
    let gw = Gateway::serve().upstream(&up.uri()).spawn();
    let body = pattern(5 * 1024 * 1024 + 17);
    let res = client()
        .put(gw.url("/api/Tasks/%65x//y?b=2&a=%20x&a=1"))
        .header("content-type", "application/octet-stream")
        .header("x-custom", "one")
        .header("authorization", "Bearer pa_upload")
        .header("cookie", "a=1; b=2")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    for m in ["GET", "DELETE", "PATCH", "OPTIONS", "HEAD", "POST"] {
        let res = send(&gw, m, "/api/method-check", &[]).await;
        assert_eq!(res.status(), 200, "{m}");
    }
    let got = up.received_requests().await.unwrap();
    let first = &got[0];
    assert_eq!(first.method.as_str(), "PUT");
    // The path in canonical form (case kept), the query exactly as sent.
    assert_eq!(first.url.path(), "/api/Tasks/ex/y");
    assert_eq!(first.url.query(), Some("b=2&a=%20x&a=1"));
    assert_eq!(first.body.len(), body.len());
    assert!(first.body == body, "body bytes changed");
    let h = |n: &str| {
        first
            .headers
            .get(n)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    assert_eq!(
        h("content-type").as_deref(),
        Some("application/octet-stream")
    );
    assert_eq!(h("x-custom").as_deref(), Some("one"));
    assert_eq!(h("authorization").as_deref(), Some("Bearer pa_upload"));
    assert_eq!(h("cookie").as_deref(), Some("a=1; b=2"));
    assert_eq!(h("content-length"), Some(body.len().to_string()));
    assert_eq!(h("host"), Some(gw.addr.to_string()));
    let methods: Vec<&str> = got[1..].iter().map(|r| r.method.as_str()).collect();
    assert_eq!(
        methods,
        ["GET", "DELETE", "PATCH", "OPTIONS", "HEAD", "POST"]
    );
}

#[tokio::test]
async fn a_chunked_upload_arrives_whole() {
    let up = upstream().await;
    let gw = Gateway::serve().upstream(&up.uri()).spawn();
    let body = pattern(3 * 1024 * 1024 + 5);
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        body.chunks(64 * 1024 + 3).map(|c| Ok(c.to_vec())).collect();
    let res = client()
        .post(gw.url("/api/results"))
        .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
            chunks,
        )))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let got = up.received_requests().await.unwrap();
    assert_eq!(got.len(), 1);
    assert!(
        got[0].body == body,
        "chunked body changed: {} bytes arrived",
        got[0].body.len()
    );
}

#[tokio::test]
async fn upstream_status_headers_and_body_come_back_unchanged() {
    let up = upstream().await;
    Mock::given(method("GET"))
        .and(path("/api/teapot"))
        .respond_with(
            ResponseTemplate::new(418)
                .insert_header("x-up", "1")
                .append_header("set-cookie", "a=1")
                .append_header("set-cookie", "b=2")
                .set_body_bytes(pattern(100_000)),
        )
        .with_priority(1)
        .mount(&up)
        .await;
    let gw = Gateway::serve().upstream(&up.uri()).spawn();
    let res = send(&gw, "GET", "/api/teapot", &[]).await;
    assert_eq!(res.status(), 418);
    assert_eq!(header(&res, "x-up"), Some("1"));
    let cookies: Vec<&str> = res
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect();
    assert_eq!(cookies, ["a=1", "b=2"]);
    assert!(header(&res, "ratelimit").is_some());
    assert!(res.bytes().await.unwrap() == pattern(100_000));
}

#[tokio::test]
async fn hop_by_hop_and_path_override_headers_are_dropped_and_x_forwarded_for_appended() {
    let up = upstream().await;
    let gw = Gateway::serve().upstream(&up.uri()).spawn();
    let res = raw_request(
        gw.addr,
        b"GET /api/echo?x=1 HTTP/1.1\r\nHost: api.example\r\nConnection: close, X-Private\r\n\
          X-Private: secret\r\nKeep-Alive: timeout=5\r\nTE: trailers\r\nProxy-Authorization: Basic abc\r\n\
          Proxy-Connection: keep-alive\r\nX-Forwarded-For: 198.51.100.1\r\nX-Multi: a\r\nX-Multi: b\r\n\
          X-Original-URL: /api/agent/rotate-key\r\nX_Rewrite_URL: /api/cron/x\r\n\r\n",
    );
    assert_eq!(res.status, 200);
    let got = up.received_requests().await.unwrap();
    let h = &got[0].headers;
    for gone in [
        "x-private",
        "keep-alive",
        "te",
        "proxy-authorization",
        "proxy-connection",
        // Headers some frameworks route on instead of the path decided on.
        "x-original-url",
        "x_rewrite_url",
    ] {
        assert!(h.get(gone).is_none(), "{gone} was forwarded");
    }
    let connection = h
        .get("connection")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    assert!(!connection.to_ascii_lowercase().contains("x-private"));
    assert_eq!(h.get("x-forwarded-for").unwrap(), "198.51.100.1, 127.0.0.1");
    let multi: Vec<_> = h
        .get_all("x-multi")
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .collect();
    assert_eq!(multi, ["a", "b"]);
    assert_eq!(h.get("host").unwrap(), "api.example");
    // Without an incoming X-Forwarded-For, the peer starts one.
    send(&gw, "GET", "/api/echo", &[]).await;
    let got = up.received_requests().await.unwrap();
    assert_eq!(got[1].headers.get("x-forwarded-for").unwrap(), "127.0.0.1");
}

#[tokio::test]
async fn upstream_down_is_a_502_problem() {
    let gw = Gateway::serve()
        .upstream(&format!("http://{}", common::dead_addr()))
        .spawn();
    let res = send(&gw, "GET", "/api/tasks", &[]).await;
    assert_eq!(res.status(), 502);
    assert_eq!(
        header(&res, "content-type"),
        Some("application/problem+json")
    );
    let body: serde_json::Value = res.json().await.unwrap();
    assert_eq!(body["status"], 502);
    assert_eq!(body["title"], "Bad Gateway");
}

#[tokio::test]
async fn a_slow_upstream_is_a_504_problem_not_a_hang() {
    let up = MockServer::start().await;
    Mock::given(wiremock::matchers::any())
        .respond_with(ResponseTemplate::new(200).set_delay(Duration::from_secs(30)))
        .mount(&up)
        .await;
    let gw = Gateway::serve()
        .upstream(&up.uri())
        .args(["--read-timeout", "1s"])
        .spawn();
    let res = send(&gw, "GET", "/api/tasks", &[]).await;
    assert_eq!(res.status(), 504);
    assert_eq!(
        header(&res, "content-type"),
        Some("application/problem+json")
    );
    let body: serde_json::Value = res.json().await.unwrap();
    assert_eq!(body["status"], 504);
    assert_eq!(body["title"], "Gateway Timeout");
}

fn raw_get(gw: &Gateway, path: &str, headers: &[&[u8]]) -> common::RawResponse {
    let mut req =
        format!("POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 0\r\n")
            .into_bytes();
    for h in headers {
        req.extend_from_slice(h);
        req.extend_from_slice(b"\r\n");
    }
    req.extend_from_slice(b"\r\n");
    raw_request(gw.addr, &req)
}

#[tokio::test]
async fn malformed_headers_never_cause_a_500() {
    let up = upstream().await;
    let mut gw = stretched_windows(trusting_loopback(Gateway::serve().upstream(&up.uri()))).spawn();
    let long_id = format!("x-agent-id: {}", "a".repeat(129));
    let cases: Vec<Vec<&[u8]>> = vec![
        vec![b"x-agent-id: has space"],
        vec![long_id.as_bytes()],
        vec![b"x-agent-id: slash/no"],
        vec![b"x-agent-id:"],
        vec![b"x-agent-id: caf\xc3\xa9"],
        vec![b"x-agent-id: \xff\xfe"],
        vec![b"x-forwarded-for: unknown"],
        vec![b"x-forwarded-for: ,,,, garbage, [::1"],
        vec![b"x-forwarded-for: 999.1.1.1, 1.2.3.4.5, _hidden"],
        vec![b"x-forwarded-for: \xff\xfe, 1"],
        vec![b"forwarded: for=\"\xff\""],
        vec![b"authorization: Bearer \xff\xfe"],
        vec![b"authorization: Bearer"],
        vec![b"cookie: \xff=\xfe"],
        vec![b"x-other: \x80\x81\x82"],
        vec![b"x-agent-id: a", b"x-agent-id: b"],
    ];
    for headers in &cases {
        let res = raw_get(&gw, "/api/agent/heartbeat", headers);
        let shown: Vec<_> = headers.iter().map(|h| String::from_utf8_lossy(h)).collect();
        assert!(res.status < 500, "{shown:?} -> {}", res.status);
    }
    let huge = format!("x-huge: {}", "h".repeat(256 * 1024));
    let res = raw_get(&gw, "/api/agent/heartbeat", &[huge.as_bytes()]);
    assert!(
        (400..500).contains(&res.status),
        "huge header -> {}",
        res.status
    );
    let res = raw_get(&gw, "*", &[]);
    assert!(
        (400..500).contains(&res.status),
        "asterisk-form -> {}",
        res.status
    );
    assert!(gw.is_running(), "the gateway survived: {}", gw.stderr());
}

#[tokio::test]
async fn invalid_agent_ids_count_as_none() {
    let up = upstream().await;
    let gw = stretched_windows(Gateway::serve().upstream(&up.uri())).spawn();
    let long_id = format!("x-agent-id: {}", "a".repeat(129));
    let bad: [&[u8]; 5] = [
        b"x-agent-id: has space",
        long_id.as_bytes(),
        b"x-agent-id: slash/no",
        b"x-agent-id: caf\xc3\xa9",
        b"x-agent-id: \xff",
    ];
    for i in 0..30 {
        let res = raw_get(&gw, "/api/agent/heartbeat", &[bad[i % bad.len()]]);
        assert_eq!(res.status, 200, "request {}", i + 1);
    }
    // All of them were `<ip>:none`, and so is a request without the header.
    let res = raw_get(&gw, "/api/agent/heartbeat", &[]);
    assert_eq!(res.status, 429);
    let res = raw_get(&gw, "/api/agent/heartbeat", &[b"x-agent-id: good-agent"]);
    assert_eq!(res.status, 200);
}

#[tokio::test]
async fn path_spellings_hit_the_same_limiter() {
    let up = upstream().await;
    let gw = Gateway::serve().upstream(&up.uri()).spawn();
    for p in [
        "/api/agent/enroll",
        "/API/Agent/Enroll/",
        "/api//agent/%65nroll",
        "/api/x/../agent/./enroll",
    ] {
        let res = send(&gw, "POST", p, &[]).await;
        assert_eq!(res.status(), 200);
        let policy = parse_policy(header(&res, "ratelimit-policy").unwrap());
        assert!(
            policy.contains(&("enrollment".to_owned(), 300, 900)),
            "{p}: {policy:?}"
        );
    }
    for p in [
        "/api/agent/rotate-key",
        "/API/Agent/Rotate-Key/",
        "/api//agent/%72otate-key",
    ] {
        assert_eq!(send(&gw, "POST", p, &[]).await.status(), 200, "{p}");
    }
    assert_eq!(
        send(&gw, "POST", "/api/agent/./rotate-key", &[])
            .await
            .status(),
        429
    );
    // The upstream sees the path that was decided on, not the client's spelling.
    let got = up.received_requests().await.unwrap();
    assert_eq!(got[2].url.path(), "/api/agent/enroll");
    assert_eq!(got[3].url.path(), "/api/agent/enroll");
}

/// The limiters named in the `RateLimit-Policy` of a raw request's answer.
fn raw_limiters(gw: &Gateway, method: &str, path: &str) -> Vec<String> {
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
    );
    let res = raw_request(gw.addr, req.as_bytes());
    assert_eq!(res.status, 200, "{method} {path}");
    res.header("ratelimit-policy")
        .map(|v| parse_policy(v).into_iter().map(|(n, ..)| n).collect())
        .unwrap_or_default()
}

#[tokio::test]
async fn dot_segments_are_resolved_before_deciding() {
    let up = upstream().await;
    let gw = Gateway::serve().upstream(&up.uri()).spawn();
    // Each of these reaches the upstream as the path it resolves to, so it is metered as that.
    for (p, limiters) in [
        ("/api/agent/../cron/x", &[][..]),
        ("/api/agent/%2e%2e/cron/x", &[]),
        ("/api/agent/%2E%2E/%2e%2e/healthz", &[]),
        ("/api/x/../agent/heartbeat", &["agent-device", "agent-ip"]),
        (
            "/x/.%2e/api/agent/./heartbeat",
            &["agent-device", "agent-ip"],
        ),
    ] {
        assert_eq!(raw_limiters(&gw, "GET", p), limiters, "{p}");
    }
    assert_eq!(
        raw_limiters(&gw, "POST", "/api/x/../agent/enroll"),
        ["enrollment"]
    );
}

#[test]
fn the_upstream_receives_the_canonical_path_and_the_query_as_sent() {
    // wiremock parses URLs (resolving dot segments), so read the request line off a socket.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let upstream = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::{BufRead, BufReader, Write};
        for conn in listener.incoming().flatten() {
            let mut out = conn.try_clone().unwrap();
            let mut line = String::new();
            let mut r = BufReader::new(conn);
            let _ = r.read_line(&mut line);
            let mut rest = String::new();
            while r.read_line(&mut rest).map(|n| n > 2).unwrap_or(false) {
                rest.clear();
            }
            let _ =
                out.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
            let _ = tx.send(line.trim_end().to_owned());
        }
    });
    let gw = Gateway::serve().upstream(&upstream).spawn();
    for (target, forwarded) in [
        ("/api/agent/../cron/x?a=%20&b", "/api/cron/x?a=%20&b"),
        ("/api//agent/%65nroll/./x", "/api/agent/enroll/x"),
        ("/A/B/%7e%2a", "/A/B/~%2A"),
        ("/caf%c3%a9?q=%zz;x&r=../..", "/caf%C3%A9?q=%zz;x&r=../.."),
        ("/api/tasks/", "/api/tasks/"),
        ("/../../etc/passwd", "/etc/passwd"),
        ("http://other.example/api/x/../tasks?y", "/api/tasks?y"),
    ] {
        let req = format!("GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        assert_eq!(raw_request(gw.addr, req.as_bytes()).status, 200, "{target}");
        let line = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the upstream saw a request");
        assert_eq!(line, format!("GET {forwarded} HTTP/1.1"), "{target}");
    }
}

/// Spellings that HTTP servers and routers read differently: each is refused with 400 before
/// any limiter or the upstream sees it, and none gets past a limiter that already refuses the
/// plain spelling.
#[tokio::test]
async fn paths_with_no_canonical_form_are_refused_before_any_limiter() {
    let up = upstream().await;
    let gw = Gateway::serve().upstream(&up.uri()).admin().spawn();
    for _ in 0..3 {
        assert_eq!(raw_status(&gw, "POST", "/api/agent/rotate-key"), 200);
    }
    assert_eq!(raw_status(&gw, "POST", "/api/agent/rotate-key"), 429);
    let cases: &[(&str, &str)] = &[
        ("/api/agent/%FF/%2e%2e/rotate-key", "invalid-utf8"),
        ("/%FF/%2e%2e/api/tasks", "invalid-utf8"),
        ("/api/agent/%c0%ae%c0%ae/agent/rotate-key", "invalid-utf8"),
        ("/api/agent/%zz/../rotate-key", "invalid-escape"),
        ("/api/agent/rotate-key%", "invalid-escape"),
        ("/api%2Fagent%2Frotate-key", "encoded-slash"),
        ("/api%5cagent%5crotate-key", "encoded-slash"),
        ("/api\\agent\\rotate-key", "backslash"),
        ("/api/agent/rotate-key;x=1", "semicolon"),
        ("/api/agent/rotate-key%3B", "semicolon"),
        ("/api/agent/..;/agent/rotate-key", "semicolon"),
        ("/api/cli/auth/refresh;x", "semicolon"),
        ("/api/agent/rotate-key%00", "control"),
        ("/api/agent/rotate-key%0d%0a", "control"),
        ("/api/agent/rotate-key.", "segment-edge"),
        ("/api/agent/rotate-key%2E", "segment-edge"),
        ("/api/agent/rotate-key%20", "segment-edge"),
        ("/api/agent/rotate-key%C2%A0", "segment-edge"),
    ];
    for (target, class) in cases {
        for _ in 0..2 {
            let res = raw_send(&gw, "POST", target);
            assert_eq!(res.status, 400, "{target}");
            assert_eq!(
                res.header("content-type"),
                Some("application/problem+json"),
                "{target}"
            );
            let body: serde_json::Value = serde_json::from_slice(&res.body).unwrap();
            assert_eq!(
                body["type"], "urn:fleet-limiter:problem:non-canonical-path",
                "{target}"
            );
            assert!(
                body["detail"].as_str().unwrap().contains(class),
                "{target}: {body}"
            );
            assert!(res.header("ratelimit-policy").is_none(), "{target}");
        }
    }
    // Only the three plain rotations reached the upstream.
    assert_eq!(received(&up).await, 3);
    // Counted by class.
    let m = common::client()
        .get(gw.admin("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for class in ["invalid-utf8", "semicolon", "segment-edge"] {
        let n = cases.iter().filter(|(_, c)| *c == class).count() * 2;
        let sample = format!("fleet_limiter_paths_rejected_total{{class=\"{class}\"}}");
        assert_eq!(
            common::sample_value(&m, &sample),
            Some(n as f64),
            "{sample}"
        );
    }
    // The plain spelling is still refused: nothing above spent or reset its bucket.
    assert_eq!(raw_status(&gw, "POST", "/API/agent/%72otate-key/"), 429);
}

/// An API that really uses one of the refused spellings can allow it: the bytes are then
/// forwarded as sent, and the limiter matches exactly those bytes.
#[tokio::test]
async fn an_allowed_class_is_forwarded_as_sent_and_metered_as_forwarded() {
    let up = upstream().await;
    let gw = Gateway::serve()
        .upstream(&up.uri())
        .config_toml("[path]\nsemicolon = \"allow\"\n")
        .env("FLEET_LIMITER_PATH_ENCODED_SLASH", "allow")
        .spawn();
    assert_eq!(
        raw_limiters(&gw, "POST", "/api/agent/rotate-key;v=2"),
        ["agent-device", "agent-ip"]
    );
    assert_eq!(raw_limiters(&gw, "GET", "/api/files/a%2fb"), ["ui"]);
    // Dot segments around an allowed spelling are still resolved.
    assert_eq!(raw_limiters(&gw, "GET", "/api/x;y/../tasks"), ["ui"]);
    // Classes not allowed are still refused.
    assert_eq!(raw_status(&gw, "POST", "/api/agent/rotate-key."), 400);
    let got = up.received_requests().await.unwrap();
    let paths: Vec<&str> = got.iter().map(|r| r.url.path()).collect();
    assert_eq!(
        paths,
        [
            "/api/agent/rotate-key;v=2",
            "/api/files/a%2Fb",
            "/api/tasks"
        ]
    );
}

#[test]
fn a_path_setting_that_is_neither_reject_nor_allow_stops_start_up() {
    let out = Launch::serve()
        .upstream("http://127.0.0.1:9")
        .env("FLEET_LIMITER_PATH_BACKSLASH", "maybe")
        .run(Duration::from_secs(30));
    assert_eq!(out.code, Some(2), "stderr: {}", out.stderr);
    assert!(
        out.stderr.contains("FLEET_LIMITER_PATH_BACKSLASH")
            && out.stderr.contains("path.backslash"),
        "{}",
        out.stderr
    );
}

fn raw_send(gw: &Gateway, method: &str, target: &str) -> common::RawResponse {
    let req = format!(
        "{method} {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
    );
    raw_request(gw.addr, req.as_bytes())
}

fn raw_status(gw: &Gateway, method: &str, target: &str) -> u16 {
    raw_send(gw, method, target).status
}

#[test]
fn a_bad_config_file_stops_start_up_with_exit_code_2() {
    let out = Launch::serve()
        .upstream("http://127.0.0.1:9")
        .config_toml("[limiters.agent-device]\nlimit = 0\n")
        .run(Duration::from_secs(30));
    assert_eq!(out.code, Some(2), "stderr: {}", out.stderr);
    assert!(
        out.stderr.contains("fleet-limiter-test-"),
        "names the file: {}",
        out.stderr
    );
    assert!(
        out.stderr.contains("limiters.agent-device.limit"),
        "names the field: {}",
        out.stderr
    );
}

#[tokio::test]
async fn bodiless_upstream_answers_gain_no_headers() {
    let up = upstream().await;
    for (p, status) in [("/api/no-content", 204u16), ("/api/not-modified", 304)] {
        Mock::given(path(p))
            .respond_with(ResponseTemplate::new(status).insert_header("etag", "\"v1\""))
            .with_priority(1)
            .mount(&up)
            .await;
    }
    let gw = Gateway::serve().upstream(&up.uri()).spawn();
    for (p, status) in [("/api/no-content", 204u16), ("/api/not-modified", 304)] {
        let res = send(&gw, "GET", p, &[]).await;
        assert_eq!(res.status().as_u16(), status);
        assert_eq!(header(&res, "etag"), Some("\"v1\""));
        assert!(
            res.headers().get("content-type").is_none(),
            "{p}: {:?}",
            res.headers()
        );
        assert!(
            res.headers().get("transfer-encoding").is_none(),
            "{p}: {:?}",
            res.headers()
        );
        assert!(res.bytes().await.unwrap().is_empty());
    }
}

#[test]
fn every_flag_of_the_settings_table_is_a_serve_flag_and_reaches_its_setting() {
    use fleet_limiter::{SettingKind as Kind, SETTINGS};
    let limit = Duration::from_secs(30);
    let help = Launch::command(["serve", "--help"]).run(limit);
    assert_eq!(help.code, Some(0), "{}", help.stderr);
    let check = Launch::command(["check", "--help"]).run(limit);
    assert_eq!(check.code, Some(0), "{}", check.stderr);
    for c in [&help.stdout, &check.stdout] {
        assert!(c.contains("--config <FILE>"), "{c}");
    }
    let flagged: Vec<_> = SETTINGS.iter().filter(|s| s.flag.is_some()).collect();
    assert!(flagged.len() >= 25, "{}", flagged.len());
    for s in flagged {
        let f = s.flag.expect("a flag");
        let spelled = format!("--{} <{}>", f.name, f.value_name);
        assert!(
            help.stdout.contains(&spelled),
            "serve --help lacks {spelled}"
        );
        assert!(
            help.stdout.contains(s.help),
            "serve --help lacks the help of {spelled}"
        );
        assert!(
            !check.stdout.contains(&format!("--{} ", f.name)),
            "check takes no setting flag: {spelled}"
        );
        // A value no setting takes: refused, naming the flag and the setting. (Admission's
        // settings are read when admission control is on.)
        let mut launch = Launch::command([
            "serve".to_owned(),
            format!("--{}", f.name),
            "not valid!".to_owned(),
        ])
        .env("FLEET_LIMITER_UPSTREAM", "http://127.0.0.1:9");
        if s.section() == "admission" {
            launch = launch.env("FLEET_LIMITER_ADMISSION_MAX_IN_FLIGHT", "8");
        }
        let out = launch.run(limit);
        assert_eq!(out.code, Some(2), "--{}: {}", f.name, out.stderr);
        let path = if s.kind == Kind::Store {
            "store"
        } else {
            s.path
        };
        assert!(
            out.stderr
                .contains(&format!("configuration error: flag --{}: {path}: ", f.name)),
            "--{}: {}",
            f.name,
            out.stderr
        );
    }
}

#[test]
fn start_up_errors_exit_2_and_say_what_to_fix() {
    let limit = Duration::from_secs(30);
    let out = Launch::serve().run(limit);
    assert_eq!(out.code, Some(2), "no upstream: {}", out.stderr);
    assert!(
        out.stderr.contains("server.upstream") && out.stderr.contains("--upstream"),
        "{}",
        out.stderr
    );

    let out = Launch::serve()
        .upstream("http://127.0.0.1:9")
        .env("FLEET_LIMITER_LIMITER_AGENT_DEVICE_WINDOW", "soon")
        .run(limit);
    assert_eq!(out.code, Some(2));
    assert!(
        out.stderr
            .contains("environment variable FLEET_LIMITER_LIMITER_AGENT_DEVICE_WINDOW")
            && out.stderr.contains("limiters.agent-device.window"),
        "{}",
        out.stderr
    );

    let out = Launch::serve()
        .upstream("http://127.0.0.1:9")
        .config_toml("[limiters.agent-devise]\nlimit = 60\n")
        .run(limit);
    assert_eq!(out.code, Some(2));
    assert!(
        out.stderr.contains(".toml: limiters.agent-devise"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("is not a built-in limiter")
            && out.stderr.contains("add window, key, routes"),
        "{}",
        out.stderr
    );

    let out = Launch::serve()
        .upstream("http://127.0.0.1:9")
        .config_toml("[client_ip]\nipv6_prefix = 80\n")
        .run(limit);
    assert_eq!(out.code, Some(2));
    assert!(
        out.stderr
            .contains(".toml: client_ip.ipv6_prefix: 80 is out of range"),
        "{}",
        out.stderr
    );

    let out = Launch::serve()
        .upstream("http://127.0.0.1:9")
        .args(["--trust-proxy", "10.0.0.0/33"])
        .run(limit);
    assert_eq!(out.code, Some(2));
    assert!(
        out.stderr
            .contains("flag --trust-proxy: client_ip.trust_proxy"),
        "{}",
        out.stderr
    );
}

#[tokio::test]
async fn a_config_file_changes_the_running_calibration() {
    let up = upstream().await;
    let gw = Gateway::serve()
        .upstream(&up.uri())
        .config_toml(
            r#"
[limiters.key-rotation]
limit = 1

[limiters.reports]
limit = 2
window = "1h"
key = "ip"
routes = ["POST /api/reports"]
"#,
        )
        .spawn();
    assert_eq!(key_rotation_status(&gw, &[]).await, 200);
    assert_eq!(key_rotation_status(&gw, &[]).await, 429);
    for _ in 0..2 {
        let res = send(&gw, "POST", "/api/reports", &[]).await;
        assert_eq!(res.status(), 200);
        let policy = parse_policy(header(&res, "ratelimit-policy").unwrap());
        assert!(
            policy.contains(&("reports".to_owned(), 2, 3600)),
            "{policy:?}"
        );
    }
    assert_eq!(send(&gw, "POST", "/api/reports", &[]).await.status(), 429);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_requests_never_exceed_the_budget() {
    let up = upstream().await;
    let gw = Arc::new(stretched_windows(Gateway::serve().upstream(&up.uri())).spawn());
    let tasks: Vec<_> = (0..120)
        .map(|_| {
            let gw = gw.clone();
            tokio::spawn(async move {
                send(
                    &gw,
                    "POST",
                    "/api/agent/heartbeat",
                    &[("x-agent-id", "racer")],
                )
                .await
                .status()
                .as_u16()
            })
        })
        .collect();
    let mut allowed = 0;
    for t in tasks {
        match t.await.unwrap() {
            200 => allowed += 1,
            429 => {}
            other => panic!("unexpected status {other}"),
        }
    }
    assert_eq!(allowed, 30);
    assert_eq!(received(&up).await, 30);
}

/// A keep-alive upstream on plain sockets that counts the connections it accepts.
fn counting_upstream() -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    counting_upstream_closing_after(usize::MAX)
}

/// [`counting_upstream`], closing each connection after `answers` answers without saying so
/// (no `Connection: close`), as an upstream's idle timeout does.
fn counting_upstream_closing_after(
    answers: usize,
) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = count.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            std::thread::spawn(move || {
                let mut out = conn.try_clone().unwrap();
                let mut r = BufReader::new(conn);
                let mut answered = 0;
                while answered < answers {
                    let mut line = String::new();
                    if r.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    if line != "\r\n" {
                        continue;
                    }
                    if out
                        .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                        .is_err()
                    {
                        return;
                    }
                    answered += 1;
                }
                let _ = out.shutdown(std::net::Shutdown::Both);
            });
        }
    });
    (url, count)
}

#[test]
fn connections_are_kept_alive_on_both_sides() {
    use std::io::{Read, Write};
    let (url, upstream_connections) = counting_upstream();
    let gw = Gateway::serve().upstream(&url).spawn();
    // Twenty requests on one client connection, each answered on it.
    let mut conn = std::net::TcpStream::connect(gw.addr).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut buf = Vec::new();
    for i in 0..20 {
        conn.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut chunk = [0u8; 4096];
        loop {
            let n = conn.read(&mut chunk).unwrap();
            assert!(n > 0, "the gateway closed the connection after {i} answers");
            buf.extend_from_slice(&chunk[..n]);
            if buf.ends_with(b"\r\n\r\nok") {
                buf.clear();
                break;
            }
        }
    }
    // ... which reached the upstream over pooled connections, not one each.
    let opened = upstream_connections.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        (1..=2).contains(&opened),
        "{opened} upstream connections for 20 requests"
    );
}

#[tokio::test]
async fn an_upstream_that_closes_idle_connections_costs_no_request() {
    let (url, upstream_connections) = counting_upstream_closing_after(1);
    let gw = Gateway::serve().upstream(&url).spawn();
    for i in 0..10 {
        let res = send(&gw, "GET", "/api/tasks", &[]).await;
        assert_eq!(res.status(), 200, "request {i}");
        assert_eq!(res.text().await.unwrap(), "ok");
        if i % 2 == 1 {
            // Let the close arrive before the next request, too.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let opened = upstream_connections.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(opened, 10, "one upstream connection per answer");
}

#[tokio::test]
async fn an_upstream_path_prefix_is_put_in_front_of_every_path() {
    let up = upstream().await;
    let gw = Gateway::serve()
        .upstream(&format!("{}/v1/", up.uri()))
        .spawn();
    assert_eq!(send(&gw, "GET", "/api/tasks?x=1", &[]).await.status(), 200);
    let got = up.received_requests().await.unwrap();
    assert_eq!(got[0].url.path(), "/v1/api/tasks");
    assert_eq!(got[0].url.query(), Some("x=1"));
}

#[tokio::test]
async fn an_unknown_variable_is_named_with_the_nearest_setting_and_start_up_goes_on() {
    let up = upstream().await;
    let gw = Gateway::serve()
        .upstream(&up.uri())
        .env("FLEET_LIMITER_UPSTREM", "http://value-not-to-print:1")
        .env("FLEET_LIMITER_ZZZZZZZZZZZZ", "another-value-not-to-print")
        .spawn();
    let res = send(&gw, "GET", "/api/agent/heartbeat", &[("x-agent-id", "a")]).await;
    assert_eq!(res.status(), 200, "start-up went on");
    let err = gw.stderr();
    let line = |name: &str| {
        err.lines()
            .find(|l| l.contains(name))
            .unwrap_or_else(|| panic!("no log line names {name}:\n{err}"))
            .to_owned()
    };
    let typo = line("FLEET_LIMITER_UPSTREM");
    assert!(typo.contains("WARN"), "{typo}");
    assert!(typo.contains("FLEET_LIMITER_UPSTREAM"), "{typo}");
    let far = line("FLEET_LIMITER_ZZZZZZZZZZZZ");
    assert!(!far.contains("did you mean"), "{far}");
    assert!(!err.contains("value-not-to-print"), "{err}");
}

/// A flood of fresh paths, more than the route memo has slots, from several connections at
/// once, evicts remembered routes but never lets one path be metered as another: every flood
/// path gets its own limiters, and a heartbeat sent between the waves is metered by exactly its
/// own: both on its first request, then `agent-device` alone (the agent is known to the
/// `agent-ip` ceiling), its count going down by one each time.
#[tokio::test]
async fn a_flood_of_fresh_paths_never_meters_one_path_as_another() {
    let up = upstream().await;
    let gw = Arc::new(
        stretched_windows(Gateway::serve())
            .upstream(&up.uri())
            .spawn(),
    );
    let policy_of = |res: &Response| header(res, "ratelimit-policy").unwrap_or("").to_owned();
    let flood_policy = policy_of(&send(&gw, "GET", "/static/first", &[]).await);
    let first = "\"agent-device\";q=30;w=604800, \"agent-ip\";q=250;w=604800";
    let known = "\"agent-device\";q=30;w=604800";
    for wave in 0..6u64 {
        let mut tasks = Vec::new();
        for worker in 0..8u64 {
            let gw = gw.clone();
            tasks.push(tokio::spawn(async move {
                let mut policies = Vec::new();
                for i in 0..128u64 {
                    let p = format!("/static/{wave}/{worker}/{i}");
                    let res = send(&gw, "GET", &p, &[]).await;
                    policies.push((p, header(&res, "ratelimit-policy").unwrap_or("").to_owned()));
                }
                policies
            }));
        }
        for t in tasks {
            for (p, policy) in t.await.expect("flood task") {
                assert_eq!(policy, flood_policy, "{p}");
            }
        }
        let res = send(
            &gw,
            "POST",
            "/api/agent/heartbeat",
            &[("x-agent-id", "agent-under-flood")],
        )
        .await;
        assert_eq!(res.status(), 200, "wave {wave}");
        let heartbeat = if wave == 0 { first } else { known };
        assert_eq!(policy_of(&res), heartbeat, "wave {wave}");
        assert_eq!(
            limit_state(&res, "agent-device").map(|(r, _)| r),
            Some(29 - wave),
            "wave {wave}"
        );
    }
}
