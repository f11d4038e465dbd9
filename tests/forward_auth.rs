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

use common::{free_port, Gateway, PATIENCE};
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where the configurations operators copy live; the tests run them as written.
fn doc(name: &str) -> PathBuf {
    common::manifest_dir().join("docs/forward-auth").join(name)
}

/// Skip (printing why), or fail under `CI`.
fn unavailable(why: &str) -> bool {
    if std::env::var_os("CI").is_some() {
        panic!("required when CI is set: {why}");
    }
    eprintln!("skipping: {why}");
    false
}

fn binary(candidates: &[&str]) -> Option<PathBuf> {
    candidates
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .or_else(|| {
            let name = Path::new(candidates[0]).file_name()?;
            std::env::var_os("PATH").and_then(|paths| {
                std::env::split_paths(&paths)
                    .map(|d| d.join(name))
                    .find(|p| p.is_file())
            })
        })
}

/// A tiny upstream: answers every request with `upstream: <method> <target> xff=<X-Forwarded-For>`
/// and the names of the rate-limit headers it was sent (it should be sent none).
fn upstream() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind upstream");
    let addr = listener.local_addr().expect("addr");
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let _ = serve(conn);
            });
        }
    });
    format!("127.0.0.1:{}", addr.port())
}

fn serve(conn: TcpStream) -> std::io::Result<()> {
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

/// A proxy process, stopped when dropped.
struct Proxy {
    child: Child,
    addr: SocketAddr,
    dir: tempfile::TempDir,
    log: PathBuf,
}

impl Proxy {
    fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    fn wait(mut self, what: &str) -> Self {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "{what} exited with {status}: {}",
                    std::fs::read_to_string(&self.log).unwrap_or_default()
                );
            }
            if TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)).is_ok() {
                return self;
            }
            assert!(Instant::now() < deadline, "{what} never listened");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = &self.dir;
    }
}

/// nginx with `docs/forward-auth/nginx.conf`, its three addresses replaced.
fn nginx(decision: SocketAddr, upstream: &str) -> Option<Proxy> {
    let Some(bin) = binary(&["/usr/sbin/nginx"]) else {
        unavailable("nginx is not installed (apt-get install nginx-light)");
        return None;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let port = free_port();
    let site = std::fs::read_to_string(doc("nginx.conf"))
        .expect("docs/forward-auth/nginx.conf")
        .replace("127.0.0.1:7392", &decision.to_string())
        .replace("listen 80;", &format!("listen 127.0.0.1:{port};"))
        .replace("http://127.0.0.1:3000", &format!("http://{upstream}"));
    let d = dir.path().display();
    std::fs::write(dir.path().join("site.conf"), site).expect("write site");
    let main = format!(
        "worker_processes 1;\ndaemon off;\nerror_log {d}/error.log warn;\npid {d}/nginx.pid;\nevents {{}}\nhttp {{\n  access_log off;\n  client_body_temp_path {d}/t1;\n  proxy_temp_path {d}/t2;\n  fastcgi_temp_path {d}/t3;\n  uwsgi_temp_path {d}/t4;\n  scgi_temp_path {d}/t5;\n  include {d}/site.conf;\n}}\n"
    );
    std::fs::write(dir.path().join("nginx.conf"), main).expect("write nginx.conf");
    let log = dir.path().join("error.log");
    let child = Command::new(bin)
        .arg("-c")
        .arg(dir.path().join("nginx.conf"))
        .arg("-e")
        .arg(&log)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start nginx");
    Some(
        Proxy {
            child,
            addr: ([127, 0, 0, 1], port).into(),
            dir,
            log,
        }
        .wait("nginx"),
    )
}

/// Caddy with `docs/forward-auth/Caddyfile`, its three addresses replaced.
fn caddy(decision: SocketAddr, upstream: &str) -> Option<Proxy> {
    let Some(bin) = binary(&["/usr/bin/caddy"]) else {
        unavailable("caddy is not installed (apt-get install caddy)");
        return None;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let port = free_port();
    let d = dir.path().display();
    let site = std::fs::read_to_string(doc("Caddyfile"))
        .expect("docs/forward-auth/Caddyfile")
        .replace(":80 {", &format!("http://127.0.0.1:{port} {{"))
        .replace("127.0.0.1:7392", &decision.to_string())
        .replace("127.0.0.1:3000", upstream);
    let file =
        format!("{{\n\tadmin off\n\tauto_https off\n\tstorage file_system {d}/data\n}}\n{site}");
    std::fs::write(dir.path().join("Caddyfile"), file).expect("write Caddyfile");
    let log = dir.path().join("caddy.log");
    let out = std::fs::File::create(&log).expect("log file");
    let child = Command::new(bin)
        .arg("run")
        .arg("--config")
        .arg(dir.path().join("Caddyfile"))
        .arg("--adapter")
        .arg("caddyfile")
        .env("HOME", dir.path())
        .env("XDG_DATA_HOME", dir.path())
        .env("XDG_CONFIG_HOME", dir.path())
        .stdout(Stdio::null())
        .stderr(out)
        .spawn()
        .expect("start caddy");
    Some(
        Proxy {
            child,
            addr: ([127, 0, 0, 1], port).into(),
            dir,
            log,
        }
        .wait("caddy"),
    )
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
    let Some(proxy) = nginx(decision, &up) else {
        return;
    };
    behaves_like_the_gateway(&proxy, &gw, "nginx", 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_caddy_forward_auth_limits_like_the_gateway() {
    let up = upstream();
    let gw = limiter(&up);
    let decision = gw.decision_addr.expect("decision listener");
    let Some(proxy) = caddy(decision, &up) else {
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
