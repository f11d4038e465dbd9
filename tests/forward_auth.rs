//! The decision endpoint behind the proxies operators already run: the real nginx
//! (`auth_request`) and the real Caddy (`forward_auth`), each configured with the files in
//! `docs/forward-auth/` as written (only their addresses changed), in front of one test
//! upstream, next to the gateway on the same limiter. Clients come from distinct loopback
//! addresses (127.0.0.2, 127.0.0.3, ...), so the tests see each client keyed on its own address.
//! Traefik's and Envoy's request formats are tested directly against the endpoint.
//!
//! nginx (Debian's nginx-light) and caddy come from Debian (`.ci/run` installs them). A missing
//! one is skipped with the reason printed, unless `CI` is set: then the test fails.

mod common;
#[path = "support/proxies.rs"]
mod proxies;

use common::{Gateway, PATIENCE};
use proxies::{Proxy, ProxyKind};
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

/// Skip (printing why), or fail under `CI`: false, for `tool_works() || unavailable(..)`.
fn unavailable(why: &str) -> bool {
    common::unavailable(why);
    false
}

/// `kind` in front of `decision` and `upstream`, or `None` (skipped) when it is not installed.
fn proxy(kind: ProxyKind, decision: SocketAddr, upstream: &str) -> Option<Proxy> {
    if let Some(why) = proxies::missing(kind) {
        unavailable(&why);
        return None;
    }
    Some(Proxy::start(kind, decision, upstream))
}

/// A tiny upstream: answers every request with `upstream: <method> <target> xff=<X-Forwarded-For>`
/// and the names of the rate-limit headers it was sent (it should be sent none).
fn upstream() -> String {
    recording_upstream().0
}

/// Every request line an upstream received (`METHOD TARGET`), in order.
type Received = Arc<Mutex<Vec<String>>>;

/// [`upstream`], and what it received.
fn recording_upstream() -> (String, Received) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind upstream");
    let addr = listener.local_addr().expect("addr");
    let received = Received::default();
    let log = received.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let log = log.clone();
            std::thread::spawn(move || {
                let _ = serve(conn, &log);
            });
        }
    });
    (format!("127.0.0.1:{}", addr.port()), received)
}

fn serve(conn: TcpStream, log: &Mutex<Vec<String>>) -> std::io::Result<()> {
    let mut out = conn.try_clone()?;
    let mut r = BufReader::new(conn);
    loop {
        let mut head = Vec::new();
        loop {
            let mut line = String::new();
            if r.read_line(&mut line)? == 0 {
                return Ok(());
            }
            if line == "\r\n" {
                break;
            }
            head.push(line.trim_end().to_owned());
        }
        let first = head.first().cloned().unwrap_or_default();
        let mut xff = String::new();
        let mut leaked = Vec::new();
        let mut length = 0usize;
        for h in head.iter().skip(1) {
            let Some((k, v)) = h.split_once(':') else {
                continue;
            };
            let k = k.trim().to_ascii_lowercase();
            if k == "x-forwarded-for" {
                xff = v.trim().to_owned();
            }
            if k.starts_with("ratelimit") || k.starts_with("x-ratelimit") {
                leaked.push(k.clone());
            }
            if k == "content-length" {
                length = v.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0u8; length];
        r.read_exact(&mut body)?;
        let mut words = first.split_whitespace();
        let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
        if let Ok(mut l) = log.lock() {
            l.push(format!("{method} {target}"));
        }
        let text = format!("upstream: {method} {target} xff={xff} leaked={leaked:?}");
        write!(
            out,
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n{text}",
            text.len()
        )?;
        out.flush()?;
    }
}

/// The gateway (traffic listener and decision listener) in front of `upstream`; the proxies'
/// address (127.0.0.1) may ask and is trusted for the client address it forwards.
fn limiter(upstream: &str) -> Gateway {
    Gateway::serve()
        .upstream(&format!("http://{upstream}"))
        .decision()
        .env("FLEET_LIMITER_TRUST_PROXY", "127.0.0.1")
        .env("FLEET_LIMITER_DECISION_ALLOW_FROM", "127.0.0.1")
        .spawn()
}

/// A client whose connections come from `from` (a loopback address of its own).
fn client_from(from: [u8; 4]) -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .local_address(IpAddr::from(from))
        .pool_max_idle_per_host(0)
        .timeout(PATIENCE)
        .build()
        .expect("client")
}

/// What the client saw: status, the headers that matter here, and the body.
#[derive(Debug)]
struct Seen {
    status: u16,
    retry_after: Option<String>,
    ratelimit: Option<String>,
    policy: Option<String>,
    remaining: Option<String>,
    content_type: Option<String>,
    body: String,
}

async fn post(client: &reqwest::Client, url: &str, xff: Option<&str>) -> Seen {
    let mut req = client.post(url);
    if let Some(x) = xff {
        req = req.header("x-forwarded-for", x);
    }
    let res = req.send().await.expect("request");
    let h = |n: &str| {
        res.headers()
            .get(n)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    Seen {
        status: res.status().as_u16(),
        retry_after: h("retry-after"),
        ratelimit: h("ratelimit"),
        policy: h("ratelimit-policy"),
        remaining: h("x-ratelimit-remaining"),
        content_type: h("content-type"),
        body: res.text().await.expect("body"),
    }
}

const ROTATE: &str = "/api/agent/rotate-key";

/// The refusal as the client sees it: 429, problem+json, `Retry-After` equal to the body's
/// `retry_after`, and the RateLimit headers of the bucket that refused.
fn assert_refusal(seen: &Seen, via: &str) {
    assert_eq!(seen.status, 429, "{via}: {seen:?}");
    assert_eq!(
        seen.content_type.as_deref(),
        Some("application/problem+json"),
        "{via}: {seen:?}"
    );
    let body: Value = serde_json::from_str(&seen.body).expect("problem json");
    assert_eq!(
        body["type"], "urn:fleet-limiter:problem:rate-limited",
        "{via}"
    );
    assert_eq!(body["status"], 429, "{via}");
    let wait = body["retry_after"].as_u64().expect("retry_after");
    assert!(wait >= 1, "{via}: never a zero wait");
    assert_eq!(
        seen.retry_after.as_deref(),
        Some(wait.to_string().as_str()),
        "{via}"
    );
    assert_eq!(
        seen.policy.as_deref(),
        Some("\"key-rotation\";q=3;w=900"),
        "{via}"
    );
    let rl = seen.ratelimit.as_deref().unwrap_or("");
    assert!(rl.starts_with("\"key-rotation\";r=0;t="), "{via}: {rl}");
    assert_eq!(seen.remaining.as_deref(), Some("0"), "{via}");
}

/// Three rotations allowed (counting down), the fourth refused, all through `url`.
async fn spend_key_rotation(client: &reqwest::Client, url: &str, via: &str, who: &str) -> Seen {
    for left in (0..3).rev() {
        let seen = post(client, url, None).await;
        assert_eq!(seen.status, 200, "{via}: {seen:?}");
        assert_eq!(
            seen.remaining.as_deref(),
            Some(left.to_string().as_str()),
            "{via}: {seen:?}"
        );
        assert_eq!(
            seen.policy.as_deref(),
            Some("\"key-rotation\";q=3;w=900"),
            "{via}"
        );
        assert!(
            seen.body.contains(&format!("xff={who}")),
            "{via}: the upstream sees the client: {}",
            seen.body
        );
        assert!(
            seen.body.contains("leaked=[]"),
            "{via}: the limiter's headers are for the answer, not the upstream: {}",
            seen.body
        );
    }
    let refused = post(client, url, None).await;
    assert_refusal(&refused, via);
    refused
}

/// Both proxies' behaviours, against one running limiter.
async fn behaves_like_the_gateway(proxy: &Proxy, gw: &Gateway, via: &str, base: u8) {
    let url = proxy.url(ROTATE);
    let a = client_from([127, 0, 0, base]);
    let refused = spend_key_rotation(&a, &url, via, &format!("127.0.0.{base}")).await;

    // The gateway refuses the same way: same body but for the wait, same headers.
    let b = client_from([127, 0, 0, base + 1]);
    let direct = spend_key_rotation(
        &b,
        &gw.url(ROTATE),
        "gateway",
        &format!("127.0.0.{}", base + 1),
    )
    .await;
    let shape = |s: &Seen| {
        let mut v: Value = serde_json::from_str(&s.body).expect("json");
        v["retry_after"] = Value::Null;
        v["detail"] = Value::Null;
        v
    };
    assert_eq!(
        shape(&refused),
        shape(&direct),
        "{via}: the same problem document"
    );

    // Another client behind the same proxy has its own budget.
    let c = client_from([127, 0, 0, base + 2]);
    assert_eq!(
        post(&c, &url, None).await.status,
        200,
        "{via}: a second client"
    );

    // A client cannot pick its own address: a forged X-Forwarded-For changes nothing.
    let d = client_from([127, 0, 0, base + 3]);
    for i in 0..3 {
        let seen = post(&d, &url, Some(&format!("198.51.100.{i}"))).await;
        assert_eq!(seen.status, 200, "{via}: {seen:?}");
    }
    assert_refusal(&post(&d, &url, Some("198.51.100.99")).await, via);

    // One budget: what a client spends through the gateway is spent through the proxy too.
    let e = client_from([127, 0, 0, base + 4]);
    for _ in 0..2 {
        assert_eq!(post(&e, &gw.url(ROTATE), None).await.status, 200);
    }
    let last = post(&e, &url, None).await;
    assert_eq!(
        (last.status, last.remaining.as_deref()),
        (200, Some("0")),
        "{via}: {last:?}"
    );
    assert_refusal(&post(&e, &url, None).await, via);
    assert_refusal(
        &post(&e, &gw.url(ROTATE), None).await,
        "gateway after the proxy",
    );

    // A spelling the limiter will not read is refused before any limiter, as by the gateway.
    let odd = post(&e, &proxy.url("/api/agent/a%2Frotate-key"), None).await;
    assert_eq!(odd.status, 400, "{via}: {odd:?}");
    let body: Value = serde_json::from_str(&odd.body).expect("problem json");
    assert_eq!(
        body["type"], "urn:fleet-limiter:problem:non-canonical-path",
        "{via}"
    );

    // A request no limiter meters passes without rate-limit headers.
    let free = post(&e, &proxy.url("/not-metered"), None).await;
    assert_eq!(free.status, 200, "{via}: {free:?}");
    assert_eq!((free.policy, free.ratelimit), (None, None), "{via}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_nginx_auth_request_limits_like_the_gateway() {
    let up = upstream();
    let gw = limiter(&up);
    let decision = gw.decision_addr.expect("decision listener");
    let Some(proxy) = proxy(ProxyKind::Nginx, decision, &up) else {
        return;
    };
    behaves_like_the_gateway(&proxy, &gw, "nginx", 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_caddy_forward_auth_limits_like_the_gateway() {
    let up = upstream();
    let gw = limiter(&up);
    let decision = gw.decision_addr.expect("decision listener");
    let Some(proxy) = proxy(ProxyKind::Caddy, decision, &up) else {
        return;
    };
    behaves_like_the_gateway(&proxy, &gw, "caddy", 12).await;
}

/// A request straight to the decision endpoint, from `from`.
async fn ask(
    from: [u8; 4],
    decision: SocketAddr,
    method: reqwest::Method,
    path: &str,
    headers: &[(&str, &str)],
) -> reqwest::Response {
    let mut req = client_from(from).request(method, format!("http://{decision}{path}"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send().await.expect("request")
}

#[tokio::test]
async fn the_endpoint_answers_only_its_proxies_and_says_what_is_missing() {
    let gw = limiter(&upstream());
    let d = gw.decision_addr.expect("decision listener");
    let get = reqwest::Method::GET;
    let nginx_headers = [("x-original-method", "POST"), ("x-original-uri", ROTATE)];

    // Not a proxy in decision.allow_from: 403, whatever it asks.
    let res = ask([127, 0, 0, 9], d, get.clone(), "/nginx", &nginx_headers).await;
    assert_eq!(res.status(), 403);
    let body: Value = res.json().await.expect("json");
    assert_eq!(
        body["type"],
        "urn:fleet-limiter:problem:not-an-allowed-proxy"
    );

    // Unknown path: 404 naming the four.
    let res = ask([127, 0, 0, 1], d, get.clone(), "/ask", &[]).await;
    assert_eq!(res.status(), 404);
    assert!(res
        .text()
        .await
        .expect("body")
        .contains("/nginx, /caddy, /traefik, /forward or /envoy"));

    // nginx without its headers: 401 (what nginx passes on), the real status in a header.
    let res = ask([127, 0, 0, 1], d, get.clone(), "/nginx", &[]).await;
    assert_eq!(res.status(), 401);
    assert_eq!(res.headers()["x-fleetlimiter-status"], "400");
    let problem = res.headers()["x-fleetlimiter-problem"]
        .to_str()
        .expect("ascii");
    assert!(
        problem.contains("proxy_set_header X-Original-URI"),
        "{problem}"
    );

    // Caddy/Traefik without theirs: a plain 400.
    let res = ask([127, 0, 0, 1], d, get.clone(), "/caddy", &[]).await;
    assert_eq!(res.status(), 400);

    // Hostile originals: a method that is not one, a URI that is not a path, a huge URI.
    let huge = format!("/{}", "a".repeat(9000));
    for (m, u) in [
        ("PO ST", ROTATE),
        ("POST", "http://x/y"),
        ("POST", huge.as_str()),
        ("", ROTATE),
    ] {
        let res = ask(
            [127, 0, 0, 1],
            d,
            get.clone(),
            "/traefik",
            &[("x-forwarded-method", m), ("x-forwarded-uri", u)],
        )
        .await;
        assert_eq!(res.status(), 400, "{m:?} {}", &u[..u.len().min(20)]);
    }

    // Traefik's format: X-Forwarded-Method/-Uri, the client in X-Forwarded-For (trusted peer).
    let traefik = |xff: &'static str| {
        [
            ("x-forwarded-method", "POST"),
            ("x-forwarded-uri", "/api/agent/rotate-key?reason=scheduled"),
            ("x-forwarded-for", xff),
        ]
    };
    for left in (0..3).rev() {
        let res = ask(
            [127, 0, 0, 1],
            d,
            get.clone(),
            "/traefik",
            &traefik("192.0.2.50"),
        )
        .await;
        assert_eq!(res.status(), 200);
        assert_eq!(
            res.headers()["x-ratelimit-remaining"],
            left.to_string().as_str()
        );
    }
    let res = ask(
        [127, 0, 0, 1],
        d,
        get.clone(),
        "/traefik",
        &traefik("192.0.2.50"),
    )
    .await;
    assert_eq!(res.status(), 429);
    assert_eq!(res.headers()["content-type"], "application/problem+json");
    assert!(res.headers().contains_key("retry-after"));
    // Another client address, another budget.
    let res = ask(
        [127, 0, 0, 1],
        d,
        get.clone(),
        "/traefik",
        &traefik("192.0.2.51"),
    )
    .await;
    assert_eq!(res.status(), 200);

    // Envoy's format: the check request is the original, its path behind /envoy.
    let envoy = |path: &'static str, xff: &'static [(&'static str, &'static str)]| {
        ask([127, 0, 0, 1], d, reqwest::Method::POST, path, xff)
    };
    let client = &[("x-forwarded-for", "192.0.2.60")];
    let statuses = [
        envoy("/envoy/api/agent/rotate-key", client).await.status(),
        envoy("/envoy/api/agent/rotate-key", client).await.status(),
        envoy("/envoy/api/agent/rotate-key", client).await.status(),
        envoy("/envoy/api/agent/rotate-key", client).await.status(),
        envoy("/envoyapi/agent/rotate-key", &[]).await.status(),
    ];
    assert_eq!(statuses.map(|s| s.as_u16()), [200, 200, 200, 429, 400]);
}

#[tokio::test]
async fn with_no_upstream_it_serves_only_the_decision_endpoint() {
    let gw = Gateway::serve()
        .decision_only()
        .env("FLEET_LIMITER_TRUST_PROXY", "127.0.0.1")
        .env("FLEET_LIMITER_DECISION_ALLOW_FROM", "127.0.0.1")
        .spawn();
    let d = gw.decision_addr.expect("decision listener");
    let res = ask(
        [127, 0, 0, 1],
        d,
        reqwest::Method::GET,
        "/nginx",
        &[
            ("x-original-method", "POST"),
            ("x-original-uri", ROTATE),
            ("x-forwarded-for", "192.0.2.70"),
        ],
    )
    .await;
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["x-ratelimit-remaining"], "2");
}

#[tokio::test]
async fn sigterm_stops_the_gateway_and_the_decision_endpoint_together() {
    for only in [false, true] {
        let launch = Gateway::serve()
            .env("FLEET_LIMITER_TRUST_PROXY", "127.0.0.1")
            .env("FLEET_LIMITER_DECISION_ALLOW_FROM", "127.0.0.1");
        let mut gw = if only {
            launch.decision_only().spawn()
        } else {
            launch
                .upstream(&format!("http://{}", upstream()))
                .decision()
                .spawn()
        };
        gw.signal("TERM");
        let status = gw.wait_exit().await;
        assert_eq!(
            status.code(),
            Some(0),
            "decision only: {only}; {}",
            gw.stderr()
        );
    }
}

/// One raw HTTP/1.1 request (`Connection: close` added) from the loopback address `from`, for
/// targets a URL library would rewrite (`/a/../b`): what came back, parsed.
fn raw_from(
    from: [u8; 4],
    addr: SocketAddr,
    method: &str,
    target: &[u8],
    headers: &[(&str, &[u8])],
) -> common::RawResponse {
    let socket =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    socket
        .bind(&SocketAddr::from((from, 0)).into())
        .expect("bind a loopback address");
    socket.connect(&addr.into()).expect("connect");
    let mut s = TcpStream::from(socket);
    s.set_read_timeout(Some(PATIENCE)).expect("timeout");
    let mut req = Vec::new();
    req.extend_from_slice(method.as_bytes());
    req.push(b' ');
    req.extend_from_slice(target);
    req.extend_from_slice(b" HTTP/1.1\r\nHost: fleet.test\r\nContent-Length: 0\r\n");
    for (k, v) in headers {
        req.extend_from_slice(k.as_bytes());
        req.extend_from_slice(b": ");
        req.extend_from_slice(v);
        req.extend_from_slice(b"\r\n");
    }
    req.extend_from_slice(b"Connection: close\r\n\r\n");
    s.write_all(&req).expect("write");
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    let end = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no answer head: {:?}", String::from_utf8_lossy(&buf)));
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    common::RawResponse {
        status,
        headers: lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
            .collect(),
        body: buf[end + 4..].to_vec(),
    }
}

/// The problem document's `type` and `detail` of a client's answer (the body), or of an
/// `/nginx` answer (its `X-FleetLimiter-Problem` header).
fn problem_of(res: &common::RawResponse) -> (String, String) {
    let text = res
        .header("x-fleetlimiter-problem")
        .map(|h| h.as_bytes().to_vec())
        .unwrap_or_else(|| res.body.clone());
    let v: Value = serde_json::from_slice(&text).unwrap_or_else(|e| {
        panic!(
            "not a problem document ({e}): {} {:?}",
            res.status,
            String::from_utf8_lossy(&text)
        )
    });
    (
        v["type"].as_str().unwrap_or_default().to_owned(),
        v["detail"].as_str().unwrap_or_default().to_owned(),
    )
}

const NON_CANONICAL: &str = "urn:fleet-limiter:problem:non-canonical-path";
const BAD_QUESTION: &str = "urn:fleet-limiter:problem:bad-decision-request";

/// The client's view of a refusal of its target: 400 problem+json `non-canonical-path`
/// naming `class`.
fn assert_refused_as(res: &common::RawResponse, class: &str, via: &str) {
    assert_eq!(res.status, 400, "{via}: {res:?}");
    assert_eq!(
        res.header("content-type"),
        Some("application/problem+json"),
        "{via}"
    );
    let (kind, detail) = problem_of(res);
    assert_eq!(kind, NON_CANONICAL, "{via}: {detail}");
    assert!(detail.contains(&format!("({class})")), "{via}: {detail}");
}

/// Both proxies, started from the documented files in front of one limiter and one recording
/// upstream; `None` when either is not installed (skipped, or failing under `CI`).
fn both_proxies(decision: SocketAddr, up: &str) -> Option<[Proxy; 2]> {
    let nginx = proxy(ProxyKind::Nginx, decision, up)?;
    let caddy = proxy(ProxyKind::Caddy, decision, up)?;
    Some([nginx, caddy])
}

/// The issue's examples, through the real nginx and Caddy with the documented files: the proxy
/// forwards the target as sent, so a spelling the gateway would have rewritten is refused,
/// never metered as its canonical form and served as something else.
#[test]
fn a_target_the_proxy_forwards_unrewritten_is_refused_never_metered_as_another_path() {
    let (up, received) = recording_upstream();
    let gw = limiter(&up);
    let decision = gw.decision_addr.expect("decision listener");
    let Some(proxies) = both_proxies(decision, &up) else {
        return;
    };
    for (n, proxy) in proxies.iter().enumerate() {
        let via = proxy.kind.name();
        let client = [127, 0, 1, 10 + n as u8];
        // Key rotation allows 3 in 15 minutes; with no limiter, 20 of 20 went through.
        for _ in 0..20 {
            let res = raw_from(client, proxy.addr, "POST", b"//x/api/agent/rotate-key", &[]);
            assert_refused_as(&res, "empty-segment", via);
        }
        // Served by the download handler (Express, nginx and the Express client route on the
        // raw path), metered as `/api/cron`: 50 of 50 went through.
        for _ in 0..50 {
            let res = raw_from(
                client,
                proxy.addr,
                "GET",
                b"/api/agent/download/../../cron",
                &[],
            );
            assert_refused_as(&res, "dot-segment", via);
        }
        for (method, target, class) in [
            ("POST", &b"/api/agent/%72otate-key"[..], "escape-spelling"),
            ("POST", b"/api/agent/x/%2e%2e/rotate-key", "dot-segment"),
            ("POST", b"/api//agent/rotate-key", "empty-segment"),
            ("GET", b"/api/tasks/caf%c3%a9", "escape-spelling"),
            ("POST", b"/api/agent/a%2Frotate-key", "encoded-slash"),
        ] {
            let res = raw_from(client, proxy.addr, method, target, &[]);
            assert_refused_as(&res, class, via);
        }
        // A fragment: nginx passes `#` on as it is, Caddy escapes it (and the `..` after it
        // is then a dot segment); either way it is refused.
        let res = raw_from(
            client,
            proxy.addr,
            "POST",
            b"/api/agent/x#/../rotate-key",
            &[],
        );
        assert_eq!(res.status, 400, "{via}: {res:?}");
        assert_eq!(problem_of(&res).0, NON_CANONICAL, "{via}");
        // None of it reached the upstream, nor spent the client's key-rotation budget.
        assert_eq!(
            received.lock().map(|r| r.clone()).unwrap_or_default(),
            Vec::<String>::new(),
            "{via}: the upstream saw a refused request"
        );
        for left in ["2", "1", "0"] {
            let res = raw_from(client, proxy.addr, "POST", ROTATE.as_bytes(), &[]);
            assert_eq!(res.status, 200, "{via}: {res:?}");
            assert_eq!(res.header("x-ratelimit-remaining"), Some(left), "{via}");
        }
        let res = raw_from(client, proxy.addr, "POST", ROTATE.as_bytes(), &[]);
        assert_eq!(res.status, 429, "{via}: {res:?}");
        // The canonical spellings reached the upstream exactly as they were metered.
        let seen = received.lock().map(|r| r.clone()).unwrap_or_default();
        assert_eq!(
            seen,
            vec![format!("POST {ROTATE}"); 3],
            "{via}: only the three allowed rotations, as sent"
        );
        if let Ok(mut r) = received.lock() {
            r.clear();
        }
    }
}

/// A question with one proxy's original-request headers, naming a key rotation.
type Question = [(&'static str, &'static [u8]); 3];

/// nginx's question, from 192.0.2.80.
const NGINX_QUESTION: Question = [
    ("X-Original-Method", b"POST"),
    ("X-Original-URI", ROTATE.as_bytes()),
    ("X-Forwarded-For", b"192.0.2.80"),
];

/// Caddy's question, from 192.0.2.81.
const CADDY_QUESTION: Question = [
    ("X-Forwarded-Method", b"POST"),
    ("X-Forwarded-Uri", ROTATE.as_bytes()),
    ("X-Forwarded-For", b"192.0.2.81"),
];

/// A question asked straight at the decision endpoint `d`, from the proxies' address.
fn ask_as_the_proxy(
    d: SocketAddr,
    path: &str,
    method: &str,
    headers: &[(&str, &[u8])],
) -> common::RawResponse {
    let proxy_peer = [127, 0, 0, 1];
    raw_from(proxy_peer, d, method, path.as_bytes(), headers)
}

/// A refused question: `bad-decision-request`, its detail starting with `naming`.
fn assert_bad_question(res: &common::RawResponse, naming: &str, via: &str) {
    let (kind, detail) = problem_of(res);
    assert_eq!(kind, BAD_QUESTION, "{via}: {detail}");
    assert!(detail.starts_with(naming), "{via}: {detail}");
}

/// `question` with one more header.
fn with(
    question: &[(&'static str, &'static [u8])],
    extra: (&'static str, &'static [u8]),
) -> Vec<(&'static str, &'static [u8])> {
    let mut h = question.to_vec();
    h.push(extra);
    h
}

/// The issue's example: a second X-Original-URI naming another path.
fn assert_a_second_original_uri_refused(d: SocketAddr) {
    let mut two = NGINX_QUESTION.to_vec();
    two.insert(2, ("X-Original-URI", b"/api/tasks"));
    let res = ask_as_the_proxy(d, "/nginx", "GET", &two);
    assert_eq!(res.status, 401, "{res:?}");
    assert_eq!(res.header("x-fleetlimiter-status"), Some("400"));
    assert_bad_question(&res, "X-Original-URI is sent more than once", "/nginx");
}

/// Every original-request header, on both paths, even repeating the same value.
fn assert_every_header_sent_twice_refused(d: SocketAddr) {
    for (path, question) in [("/nginx", &NGINX_QUESTION), ("/caddy", &CADDY_QUESTION)] {
        for name in [
            "X-Original-Method",
            "X-Original-URI",
            "X-Forwarded-Method",
            "X-Forwarded-Uri",
        ] {
            let mut headers = question.to_vec();
            let value: &[u8] = if name.ends_with("Method") {
                b"POST"
            } else {
                ROTATE.as_bytes()
            };
            headers.push((name, value));
            headers.push((name, value));
            let res = ask_as_the_proxy(d, path, "GET", &headers);
            let expected = if path == "/nginx" { 401 } else { 400 };
            assert_eq!(res.status, expected, "{path} {name}: {res:?}");
            assert_bad_question(&res, &format!("{name} is sent more than once"), path);
        }
    }
}

/// The other kind's headers: the same request is fine, another one is refused.
fn assert_the_other_kind_naming_another_refused(d: SocketAddr) {
    let res = ask_as_the_proxy(
        d,
        "/nginx",
        "GET",
        &with(&NGINX_QUESTION, ("X-Forwarded-Uri", ROTATE.as_bytes())),
    );
    assert_eq!(res.status, 200, "{res:?}");
    let res = ask_as_the_proxy(
        d,
        "/nginx",
        "GET",
        &with(&NGINX_QUESTION, ("X-Forwarded-Uri", b"/api/tasks")),
    );
    assert_eq!(res.status, 401, "{res:?}");
    assert_bad_question(
        &res,
        "X-Forwarded-Uri names another target than X-Original-URI",
        "/nginx",
    );
    let res = ask_as_the_proxy(
        d,
        "/caddy",
        "GET",
        &with(&CADDY_QUESTION, ("X-Original-URI", b"/api/tasks")),
    );
    assert_eq!(res.status, 400, "{res:?}");
    assert_bad_question(
        &res,
        "X-Original-URI names another target than X-Forwarded-Uri",
        "/caddy",
    );
    let res = ask_as_the_proxy(
        d,
        "/caddy",
        "GET",
        &with(&CADDY_QUESTION, ("X-Original-Method", b"GET")),
    );
    assert_eq!(res.status, 400, "{res:?}");
    assert_bad_question(
        &res,
        "X-Original-Method names another method than X-Forwarded-Method",
        "/caddy",
    );
}

/// Envoy's check request is the original: a header naming another target is refused, one
/// naming it (query included) is not.
fn assert_envoy_header_naming_another_refused(d: SocketAddr) {
    let envoy = |uri: &'static [u8]| {
        ask_as_the_proxy(
            d,
            "/envoy/api/agent/rotate-key?r=1",
            "POST",
            &[("X-Forwarded-For", b"192.0.2.82"), ("X-Forwarded-Uri", uri)],
        )
    };
    assert_bad_question(
        &envoy(b"/api/agent/rotate-key?r=2"),
        "X-Forwarded-Uri names another target than the check request's own",
        "/envoy",
    );
    assert_eq!(envoy(b"/api/agent/rotate-key?r=1").status, 200);
}

/// None of the refused questions spent a budget: 192.0.2.80 still has its 3 rotations (one
/// spent by the agreeing question above).
fn assert_no_refused_question_spent_a_budget(d: SocketAddr) {
    for left in ["1", "0"] {
        let res = ask_as_the_proxy(d, "/nginx", "GET", &NGINX_QUESTION);
        assert_eq!(res.status, 200, "{res:?}");
        assert_eq!(res.header("x-ratelimit-remaining"), Some(left));
    }
    assert_eq!(
        ask_as_the_proxy(d, "/nginx", "GET", &NGINX_QUESTION).status,
        403
    );
}

/// Through the real proxies: each sets its own pair, replacing whatever the client sent, and
/// passes the other kind on from the client.
fn assert_each_proxy_replaces_its_own_headers(proxies: &[Proxy; 2]) {
    for (n, proxy) in proxies.iter().enumerate() {
        let via = proxy.kind.name();
        let (own, other): (&str, &str) = match proxy.kind {
            ProxyKind::Nginx => ("X-Original-URI", "X-Forwarded-Uri"),
            ProxyKind::Caddy => ("X-Forwarded-Uri", "X-Original-URI"),
        };
        let client = [127, 0, 2, 10 + n as u8];
        // The client's own copies of the proxy's header are replaced: metered as sent.
        let res = raw_from(
            client,
            proxy.addr,
            "POST",
            ROTATE.as_bytes(),
            &[(own, b"/api/tasks"), (own, b"/api/tasks")],
        );
        assert_eq!(res.status, 200, "{via}: {res:?}");
        assert_eq!(
            res.header("ratelimit-policy"),
            Some("\"key-rotation\";q=3;w=900"),
            "{via}"
        );
        // The other kind's header naming another path is refused.
        let res = raw_from(
            client,
            proxy.addr,
            "POST",
            ROTATE.as_bytes(),
            &[(other, b"/api/tasks")],
        );
        assert_eq!(res.status, 400, "{via}: {res:?}");
        let (kind, detail) = problem_of(&res);
        assert_eq!(kind, BAD_QUESTION, "{via}");
        assert!(
            detail.starts_with(&format!("{other} names another target")),
            "{via}: {detail}"
        );
    }
}

/// Two `X-Original-URI` headers: the first used to win. Each original-request header sent twice
/// is refused, so is one of the other proxy's kind naming another request, and a client cannot
/// add its own through nginx or Caddy.
#[test]
fn original_request_headers_sent_twice_or_contradicting_each_other_are_refused() {
    let (up, received) = recording_upstream();
    let gw = limiter(&up);
    let d = gw.decision_addr.expect("decision listener");

    // The issue's example: a second X-Original-URI naming another path.
    assert_a_second_original_uri_refused(d);
    // Every original-request header, on both paths, even repeating the same value.
    assert_every_header_sent_twice_refused(d);
    // The other kind's headers: the same request is fine, another one is refused.
    assert_the_other_kind_naming_another_refused(d);
    assert_envoy_header_naming_another_refused(d);
    // None of the refused questions spent a budget.
    assert_no_refused_question_spent_a_budget(d);

    // Through the real proxies: each sets its own pair, replacing whatever the client sent, and
    // passes the other kind on from the client.
    let Some(proxies) = both_proxies(d, &up) else {
        return;
    };
    assert_each_proxy_replaces_its_own_headers(&proxies);
    let seen = received.lock().map(|r| r.len()).unwrap_or_default();
    assert_eq!(
        seen, 2,
        "only the two replaced-header requests reached the upstream"
    );
}

/// Hostile original targets asked straight at the endpoint, on every path: each is refused with
/// the class named and counted under it, and a target that is its own canonical form is not.
#[tokio::test]
async fn the_endpoint_refuses_every_target_it_would_have_to_rewrite() {
    let gw = Gateway::serve()
        .decision_only()
        .admin()
        .env("FLEET_LIMITER_TRUST_PROXY", "127.0.0.1")
        .env("FLEET_LIMITER_DECISION_ALLOW_FROM", "127.0.0.1")
        .spawn();
    let d = gw.decision_addr.expect("decision listener");
    let cases: &[(&[u8], &str)] = &[
        (b"//x/api/agent/rotate-key", "empty-segment"),
        (b"///api/agent/rotate-key", "empty-segment"),
        (b"/api/agent//rotate-key", "empty-segment"),
        (b"/api/agent/download/../../cron", "dot-segment"),
        (b"/api/agent/./rotate-key", "dot-segment"),
        (b"/api/agent/rotate-key/..", "dot-segment"),
        (b"/api/agent/%2e%2e/agent/rotate-key", "dot-segment"),
        (b"/api/agent/.%2E/agent/rotate-key", "dot-segment"),
        (b"/api/agent/%72otate-key", "escape-spelling"),
        (b"/api/agent/rotate%2dkey", "escape-spelling"),
        (b"/api/tasks/caf%c3%a9", "escape-spelling"),
        (b"/api/tasks/a%2a", "escape-spelling"),
        (b"/api/agent/rotate-key#x", "fragment"),
        (b"/api/agent/x#/../rotate-key", "fragment"),
        (b"/api/agent/rotate-key?x#/../y", "fragment"),
        (b"http://fleet.test/api/agent/rotate-key", "not-origin-form"),
        (b"HTTP://FLEET.TEST/api/agent/rotate-key", "not-origin-form"),
        (b"*", "not-origin-form"),
        (b"api/agent/rotate-key", "not-origin-form"),
        (b"/api/agent/rotate|key", "unescaped"),
        (b"/api/agent/rotate key", "unescaped"),
        (b"/api/tasks/caf\xC3\xA9", "unescaped"),
        (b"/api/tasks/caf\xFF", "invalid-utf8"),
        (b"/api/tasks/caf\xC0\xAE", "invalid-utf8"),
        (b"/api/agent/rot\tate-key", "control"),
        (b"/api/agent/%FF/%2e%2e/rotate-key", "invalid-utf8"),
        (b"/api/agent/a%2Frotate-key", "encoded-slash"),
        (b"/api/agent/rotate-key;x=1", "semicolon"),
        (b"/api/agent/rotate-key.", "segment-edge"),
    ];
    let mut counted: std::collections::BTreeMap<&str, u32> = Default::default();
    for (uri, class) in cases {
        let shown = String::from_utf8_lossy(uri);
        for (path, m, u) in [
            ("/nginx", "X-Original-Method", "X-Original-URI"),
            ("/caddy", "X-Forwarded-Method", "X-Forwarded-Uri"),
            ("/forward", "X-Forwarded-Method", "X-Forwarded-Uri"),
        ] {
            let res = raw_from(
                [127, 0, 0, 1],
                d,
                "GET",
                path.as_bytes(),
                &[(m, b"POST"), (u, uri), ("X-Forwarded-For", b"192.0.2.90")],
            );
            if path == "/nginx" {
                assert_eq!(res.status, 401, "{path} {shown}: {res:?}");
                assert_eq!(res.header("x-fleetlimiter-status"), Some("400"));
            } else {
                assert_eq!(res.status, 400, "{path} {shown}: {res:?}");
            }
            let (kind, detail) = problem_of(&res);
            assert_eq!(kind, NON_CANONICAL, "{path} {shown}: {detail}");
            assert!(
                detail.contains(&format!("({class})")),
                "{path} {shown}: {detail}"
            );
            *counted.entry(class).or_default() += 1;
        }
    }
    // Envoy: the check request's own target, behind /envoy.
    for (target, class) in [
        (&b"/envoy//x/api/agent/rotate-key"[..], "empty-segment"),
        (b"/envoy/api/agent/download/../../cron", "dot-segment"),
        (b"/envoy/api/agent/%72otate-key", "escape-spelling"),
    ] {
        let res = raw_from([127, 0, 0, 1], d, "POST", target, &[]);
        assert_eq!(res.status, 400, "{res:?}");
        let (kind, detail) = problem_of(&res);
        assert_eq!(kind, NON_CANONICAL);
        assert!(detail.contains(&format!("({class})")), "{detail}");
        *counted.entry(class).or_default() += 1;
    }
    // Targets that are their own canonical form are decided on as they are.
    for uri in [
        &b"/api/agent/rotate-key"[..],
        b"/api/agent/rotate-key/",
        b"/api/agent/rotate-key?x=/../../y&z=%2e%2e",
        b"/api/tasks/caf%C3%A9",
        b"/api/tasks/a%2A%25%3F%23",
        b"/",
    ] {
        let res = raw_from(
            [127, 0, 0, 1],
            d,
            "GET",
            b"/caddy",
            &[
                ("X-Forwarded-Method", b"GET"),
                ("X-Forwarded-Uri", uri),
                ("X-Forwarded-For", b"192.0.2.91"),
            ],
        );
        assert_eq!(res.status, 200, "{}: {res:?}", String::from_utf8_lossy(uri));
    }
    // Each refusal counted under its class.
    let metrics = common::client()
        .get(gw.admin("/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    for (class, n) in counted {
        let sample = format!("fleet_limiter_paths_rejected_total{{class=\"{class}\"}}");
        assert_eq!(
            common::sample_value(&metrics, &sample),
            Some(f64::from(n)),
            "{sample}"
        );
    }
}

/// Headers with which some frameworks route a request to another path (`X-Original-URL`,
/// `X-Rewrite-URL`, in any spelling) cannot be removed from what the proxy forwards: the
/// endpoint refuses the question, straight and through the real proxies, and spends nothing.
#[test]
fn a_path_override_header_in_the_original_request_is_refused() {
    let (up, received) = recording_upstream();
    let gw = limiter(&up);
    let d = gw.decision_addr.expect("decision listener");
    let spellings: [(&str, &[u8]); 4] = [
        ("X-Original-URL", b"/api/agent/rotate-key"),
        ("x-rewrite-url", b"/api/agent/rotate-key"),
        ("X_Original_URL", b"/api/tasks"),
        ("X-REWRITE-URL", b""),
    ];
    for (name, value) in spellings {
        let res = raw_from(
            [127, 0, 0, 1],
            d,
            "GET",
            b"/caddy",
            &[
                ("X-Forwarded-Method", b"GET"),
                ("X-Forwarded-Uri", b"/api/tasks"),
                ("X-Forwarded-For", b"192.0.2.90"),
                (name, value),
            ],
        );
        assert_eq!(res.status, 400, "{name}: {res:?}");
        let (kind, detail) = problem_of(&res);
        assert_eq!(kind, BAD_QUESTION, "{name}");
        assert!(
            detail.starts_with("The original request carries"),
            "{name}: {detail}"
        );
    }
    let Some(proxies) = both_proxies(d, &up) else {
        return;
    };
    for (n, proxy) in proxies.iter().enumerate() {
        let via = proxy.kind.name();
        let client = [127, 0, 3, 10 + n as u8];
        let res = raw_from(
            client,
            proxy.addr,
            "GET",
            b"/api/tasks",
            &[("X-Original-URL", ROTATE.as_bytes())],
        );
        assert_eq!(res.status, 400, "{via}: {res:?}");
        let (kind, _) = problem_of(&res);
        assert_eq!(kind, BAD_QUESTION, "{via}");
        // Without it, the same request passes.
        let res = raw_from(client, proxy.addr, "GET", b"/api/tasks", &[]);
        assert_eq!(res.status, 200, "{via}: {res:?}");
    }
    let seen = received.lock().map(|r| r.len()).unwrap_or_default();
    assert_eq!(
        seen, 2,
        "only the requests without the header reached the upstream"
    );
}

/// Every limit header name of every profile, and the ones `standard`/`legacy` send.
const LIMIT_NAMES: [&str; 8] = [
    "ratelimit",
    "ratelimit-policy",
    "ratelimit-limit",
    "ratelimit-remaining",
    "ratelimit-reset",
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
];

fn names_sent(standard: &str, legacy: bool) -> Vec<&'static str> {
    let mut names = match standard {
        "off" => vec![],
        "draft-6" => vec![
            "ratelimit-policy",
            "ratelimit-limit",
            "ratelimit-remaining",
            "ratelimit-reset",
        ],
        _ => vec!["ratelimit", "ratelimit-policy"],
    };
    if legacy {
        names.extend([
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset",
        ]);
    }
    names
}

/// The limit headers of an answer (each name at most once) and its status, `Retry-After` and
/// body.
fn limit_headers_of(res: &common::RawResponse) -> Vec<(&'static str, String)> {
    LIMIT_NAMES
        .iter()
        .filter_map(|n| {
            let all: Vec<&str> = res
                .headers
                .iter()
                .filter(|(k, _)| k.eq_ignore_ascii_case(n))
                .map(|(_, v)| v.as_str())
                .collect();
            assert!(all.len() <= 1, "{n} sent {} times: {all:?}", all.len());
            all.first().map(|v| (*n, (*v).to_owned()))
        })
        .collect()
}

/// What remains and every reset the answer states, read as `standard` writes them (draft 8
/// and 10: the `key-rotation` item), the legacy reset as seconds from now.
fn remaining_and_resets(
    h: &[(&'static str, String)],
    standard: &str,
    unix: bool,
) -> (Vec<u64>, Vec<f64>) {
    let get = |n: &str| h.iter().find(|(k, _)| *k == n).map(|(_, v)| v.as_str());
    let mut remaining = Vec::new();
    let mut resets = Vec::new();
    let param = |item: &str, key: &str| -> Option<u64> {
        item.split(';')
            .find_map(|p| p.trim().strip_prefix(&format!("{key}=")))
            .map(|v| v.parse().expect("a number"))
    };
    match standard {
        "draft-6" => {
            remaining.push(get("ratelimit-remaining").unwrap().parse().unwrap());
            resets.push(get("ratelimit-reset").unwrap().parse().unwrap());
        }
        "draft-7" => {
            let v = get("ratelimit").unwrap();
            let key = |k: &str| -> u64 {
                v.split(',')
                    .find_map(|p| p.trim().strip_prefix(&format!("{k}=")))
                    .unwrap_or_else(|| panic!("{k} in {v}"))
                    .parse()
                    .unwrap()
            };
            remaining.push(key("remaining"));
            resets.push(key("reset") as f64);
        }
        "draft-8" | "draft-10" => {
            let v = get("ratelimit").unwrap();
            let item = v
                .split(',')
                .find(|i| i.trim().starts_with("\"key-rotation\""))
                .unwrap_or_else(|| panic!("key-rotation in {v}"));
            remaining.push(param(item, "r").expect("r"));
            if let Some(t) = param(item, "t") {
                resets.push(t as f64);
            }
        }
        _ => {}
    }
    if let Some(r) = get("x-ratelimit-remaining") {
        remaining.push(r.parse().unwrap());
        let reset: f64 = get("x-ratelimit-reset").unwrap().parse().unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        resets.push(if unix { reset - now } else { reset });
    }
    (remaining, resets)
}

/// Every `[headers]` profile through the real nginx and Caddy running the documented files:
/// the client gets exactly the limit headers the profile sends (no others, none empty, none
/// twice), the values the limiter gave, on allowed answers and on the refusal (where every
/// reset is `Retry-After`); the upstream gets none of them; and limit headers a client sends
/// itself never come back on the answer.
#[test]
fn every_header_profile_passes_through_both_proxies() {
    let (up, _) = recording_upstream();
    if ProxyKind::ALL
        .iter()
        .any(|k| proxies::missing(*k).is_some_and(|why| !unavailable(&why)))
    {
        return;
    }
    let mut round = 0u8;
    for standard in ["draft-10", "draft-8", "draft-7", "draft-6", "off"] {
        for (legacy, reset_form) in [(false, "unix"), (true, "unix"), (true, "delta")] {
            let profile = format!("{standard} legacy={legacy} reset={reset_form}");
            let gw = Gateway::serve()
                .upstream(&format!("http://{up}"))
                .decision()
                .env("FLEET_LIMITER_TRUST_PROXY", "127.0.0.1")
                .env("FLEET_LIMITER_DECISION_ALLOW_FROM", "127.0.0.1")
                .env("FLEET_LIMITER_HEADERS_STANDARD", standard)
                .env("FLEET_LIMITER_HEADERS_LEGACY", legacy.to_string())
                .env("FLEET_LIMITER_HEADERS_LEGACY_RESET", reset_form)
                .spawn();
            let decision = gw.decision_addr.expect("decision listener");
            let Some(proxies) = both_proxies(decision, &up) else {
                return;
            };
            let sent = names_sent(standard, legacy);
            for proxy in &proxies {
                round += 1;
                let via = format!("{} ({profile})", proxy.kind.name());
                let client = [127, 0, 2, round];
                for n in 1..=4u64 {
                    let res = raw_from(client, proxy.addr, "POST", ROTATE.as_bytes(), &[]);
                    let h = limit_headers_of(&res);
                    let names: Vec<&str> = h.iter().map(|(k, _)| *k).collect();
                    let mut want = sent.clone();
                    want.sort_unstable();
                    let mut got = names.clone();
                    got.sort_unstable();
                    assert_eq!(got, want, "{via}: request {n}: {h:?}");
                    assert!(h.iter().all(|(_, v)| !v.is_empty()), "{via}: {h:?}");
                    let (remaining, resets) =
                        remaining_and_resets(&h, standard, legacy && reset_form == "unix");
                    if n <= 3 {
                        assert_eq!(res.status, 200, "{via}: request {n}");
                        assert!(
                            String::from_utf8_lossy(&res.body).contains("leaked=[]"),
                            "{via}: the upstream got the limiter's headers"
                        );
                        assert!(remaining.iter().all(|r| *r == 3 - n), "{via}: {h:?}");
                    } else {
                        assert_eq!(res.status, 429, "{via}: {h:?}");
                        let retry: f64 = res
                            .header("retry-after")
                            .expect("Retry-After")
                            .parse()
                            .expect("delay-seconds");
                        assert!(remaining.iter().all(|r| *r == 0), "{via}: {h:?}");
                        for reset in &resets {
                            assert!(
                                (reset - retry).abs() <= 1.0,
                                "{via}: a reset of {reset} s beside Retry-After {retry}: {h:?}"
                            );
                        }
                    }
                }
                // Unmetered, with every limit header forged by the client: none comes back.
                // (What the upstream gets is the client's own request, as without a limiter.)
                let forged: Vec<(&str, &[u8])> =
                    LIMIT_NAMES.iter().map(|n| (*n, b"1".as_slice())).collect();
                let res = raw_from(client, proxy.addr, "GET", b"/not-metered", &forged);
                assert_eq!(res.status, 200, "{via}");
                assert_eq!(limit_headers_of(&res), [], "{via}");
            }
        }
    }
}

/// A `deny` limiter whose store cannot answer, through nginx and Caddy configured with the
/// files in `docs/forward-auth/`: each client gets the limiter's 503 `store-unavailable` (never
/// a 429; nginx turns the endpoint's 403 back into it), with the wait the gateway tells that
/// same client, and the upstream never sees the request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_both_proxies_a_store_that_cannot_answer_is_the_limiters_503() {
    let (up, received) = recording_upstream();
    let dead = common::dead_addr();
    let gw = Gateway::serve()
        .upstream(&format!("http://{up}"))
        .decision()
        .env("FLEET_LIMITER_TRUST_PROXY", "127.0.0.1")
        .env("FLEET_LIMITER_DECISION_ALLOW_FROM", "127.0.0.1")
        .env("FLEET_LIMITER_STORE_URL", format!("redis://{dead}"))
        .env("FLEET_LIMITER_LIMITER_KEY_ROTATION_ON_STORE_ERROR", "deny")
        .spawn();
    let decision = gw.decision_addr.expect("decision listener");
    for (kind, via, base) in [
        (ProxyKind::Nginx, "nginx", 40u8),
        (ProxyKind::Caddy, "caddy", 60),
    ] {
        let Some(proxy) = proxy(kind, decision, &up) else {
            continue;
        };
        let mut told = std::collections::BTreeSet::new();
        for i in 0..8u8 {
            let from = [127, 0, 0, base + i];
            let client = client_from(from);
            let through = post(&client, &proxy.url(ROTATE), None).await;
            let direct = post(&client, &gw.url(ROTATE), None).await;
            for (seen, what) in [(&through, via), (&direct, "gateway")] {
                assert_eq!(seen.status, 503, "{what}: {seen:?}\n{}", proxy.log());
                assert_eq!(
                    seen.content_type.as_deref(),
                    Some("application/problem+json"),
                    "{what}: {seen:?}"
                );
                let body: Value = serde_json::from_str(&seen.body).expect("problem json");
                assert_eq!(
                    body["type"], "urn:fleet-limiter:problem:store-unavailable",
                    "{what}: {seen:?}"
                );
                let wait = body["retry_after"].as_u64().expect("retry_after");
                // key-rotation, 3 in 15 minutes: w = 300 s.
                assert!((300..=600).contains(&wait), "{what}: {wait}");
                assert_eq!(
                    seen.retry_after.as_deref(),
                    Some(wait.to_string().as_str()),
                    "{what}"
                );
                assert_eq!(seen.remaining.as_deref(), Some("0"), "{what}: {seen:?}");
            }
            assert_eq!(
                through.retry_after, direct.retry_after,
                "{via}: the gateway tells this client the same wait"
            );
            told.insert(through.retry_after.clone());
        }
        assert!(told.len() >= 3, "{via}: {told:?}");
    }
    let seen = received.lock().map(|r| r.clone()).unwrap_or_default();
    assert!(
        !seen.iter().any(|r| r.contains("rotate-key")),
        "never forwarded: {seen:?}"
    );
}
