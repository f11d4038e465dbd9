//! A real browser on another origin reads the gateway's 429: headless Chromium loads a page
//! served from one loopback port whose script calls the gateway on another, and writes what it
//! saw (statuses, `Retry-After`, `RateLimit-Policy`, or the CORS error) into the DOM, which
//! `--dump-dom` prints.
//!
//! Needs Debian's `chromium` (`.ci/run` installs it). Without it the test is skipped, except when
//! `CI` is set: then it fails.

mod common;

use common::Launch;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::Path;
use std::time::Duration;
use wiremock::matchers::{method, path_regex};
use wiremock::{Mock, MockServer, ResponseTemplate};

/// Serve `html` to every GET on `listener`, from a background thread.
fn serve_page(listener: TcpListener, html: String) -> u16 {
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let Ok(read_half) = stream.try_clone() else {
                continue;
            };
            let mut reader = BufReader::new(read_half);
            let mut line = String::new();
            // Read the request head; the body of a GET is empty.
            while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                line.clear();
            }
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/html; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                html.len()
            );
            let _ = stream.write_all(head.as_bytes());
            let _ = stream.write_all(html.as_bytes());
        }
    });
    port
}

fn bind() -> TcpListener {
    TcpListener::bind("127.0.0.1:0").expect("bind page server")
}

/// A page whose script calls `url` twice with an `X-Agent-ID` header (so the browser sends a
/// preflight first) and records what it could read.
fn page(url: &str) -> String {
    format!(
        r#"<!doctype html><html><body><pre id="out">pending</pre><script>
async function call() {{
  try {{
    const r = await fetch("{url}", {{ headers: {{ "x-agent-id": "browser-agent-1" }} }});
    return {{ status: r.status, retryAfter: r.headers.get("retry-after"), policy: r.headers.get("ratelimit-policy") }};
  }} catch (e) {{
    return {{ error: String(e.name) }};
  }}
}}
(async () => {{
  const first = await call();
  const second = await call();
  document.getElementById("out").textContent = JSON.stringify({{ first, second }});
}})();
</script></body></html>"#
    )
}

/// Load `url` in headless Chromium and return what the page wrote into `#out`.
async fn browse(bin: &str, url: &str, profile: &Path) -> serde_json::Value {
    let run = tokio::process::Command::new(bin)
        .args(common::CHROMIUM_FLAGS)
        .arg("--virtual-time-budget=20000")
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg("--dump-dom")
        .arg(url)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("chromium finished")
        .expect("chromium ran");
    let dom = String::from_utf8_lossy(&out.stdout);
    let inner = dom
        .split_once("<pre id=\"out\">")
        .and_then(|(_, rest)| rest.split_once("</pre>"))
        .map(|(inner, _)| {
            inner
                .replace("&amp;", "&")
                .replace("&lt;", "<")
                .replace("&gt;", ">")
        })
        .unwrap_or_default();
    serde_json::from_str(&inner).unwrap_or_else(|_| {
        panic!(
            "the page did not finish; dom:\n{dom}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_on_another_origin_reads_retry_after_from_a_429() {
    let Some(bin) = common::chromium() else {
        common::unavailable("no chromium on PATH (apt-get install chromium)");
        return;
    };

    // The upstream allows every origin for its own answers, preflights included.
    let up = MockServer::start().await;
    Mock::given(method("OPTIONS"))
        .respond_with(
            ResponseTemplate::new(204)
                .insert_header("access-control-allow-origin", "*")
                .insert_header("access-control-allow-methods", "GET")
                .insert_header("access-control-allow-headers", "x-agent-id"),
        )
        .mount(&up)
        .await;
    Mock::given(path_regex("^/t/"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_string("ok")
                .insert_header("access-control-allow-origin", "*"),
        )
        .mount(&up)
        .await;

    // Pages on two other origins: one on the gateway's allow-list, one not. Their listeners
    // are bound first so the allow-list can name the listed one.
    let listed = bind();
    let listed_origin = format!(
        "http://127.0.0.1:{}",
        listed.local_addr().expect("addr").port()
    );
    let toml = format!(
        r#"
[server]
upstream = "{}"

[limiters.browser-a]
limit = 1
window = "1m"
key = "ip"
routes = ["/t/a/**"]

[limiters.browser-b]
limit = 1
window = "1m"
key = "ip"
routes = ["/t/b/**"]

[cors]
allowed_origins = ["{listed_origin}"]
"#,
        up.uri()
    );
    let gw = Launch::serve()
        .config_toml(toml)
        .admin()
        .log("info")
        .spawn();
    let listed_port = serve_page(listed, page(&gw.url("/t/a/x")));
    let unlisted_port = serve_page(bind(), page(&gw.url("/t/b/x")));

    let profile = tempfile::tempdir().expect("profile dir");
    let seen = browse(
        bin,
        &format!("http://127.0.0.1:{listed_port}/"),
        profile.path(),
    )
    .await;
    assert_eq!(seen["first"]["status"], 200, "{seen}");
    assert_eq!(seen["first"]["policy"], "\"browser-a\";q=1;w=60", "{seen}");
    assert_eq!(seen["second"]["status"], 429, "{seen}");
    let wait: u64 = seen["second"]["retryAfter"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("Retry-After readable: {seen}"));
    assert!((1..=60).contains(&wait), "{seen}");

    // Same gateway, an origin not on the allow-list: its 200 came from the upstream (readable),
    // the gateway's 429 carries no CORS headers, and the browser reports a network error.
    let profile = tempfile::tempdir().expect("profile dir");
    let seen = browse(
        bin,
        &format!("http://127.0.0.1:{unlisted_port}/"),
        profile.path(),
    )
    .await;
    assert_eq!(seen["first"]["status"], 200, "{seen}");
    assert_eq!(
        seen["first"]["policy"], "\"browser-b\";q=1;w=60",
        "exposed on proxied answers: {seen}"
    );
    assert_eq!(seen["second"]["error"], "TypeError", "{seen}");
    assert_eq!(
        gw.metric(r#"fleet_limiter_decisions_total{limiter="browser-b",outcome="refused"}"#)
            .await,
        Some(1.0),
        "the gateway did refuse it"
    );
}

/// A page on another origin that tries what a page can do to the admin listener without
/// asking: a `no-cors` `text/plain` POST of an override, and an auto-submitted `text/plain`
/// form shaped to spell the same JSON. Writes `done` when both were sent.
fn attack_page(admin: &str) -> String {
    let body =
        r#"{"limiter":"agent-device","match":"ip:0.0.0.0/0","limit":4294967295,"window":"1m"}"#;
    format!(
        r#"<!doctype html><html><body><pre id="out">pending</pre>
<iframe name="sink" style="display:none"></iframe>
<form id="f" method="POST" enctype="text/plain" action="{admin}/overrides" target="sink">
<input type="hidden" name='{{"limiter":"agent-device","match":"ip:0.0.0.0/0","limit":4294967295,"window":"1m","by":"' value='x"}}'>
</form>
<script>
(async () => {{
  let fetched;
  try {{
    const r = await fetch("{admin}/overrides", {{ method: "POST", mode: "no-cors", headers: {{ "content-type": "text/plain" }}, body: JSON.stringify({body}) }});
    fetched = "sent:" + r.type;
  }} catch (e) {{
    fetched = "error:" + e.name;
  }}
  document.getElementById("f").submit();
  await new Promise(r => setTimeout(r, 1500));
  document.getElementById("out").textContent = JSON.stringify({{ fetched, done: true }});
}})();
</script></body></html>"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_on_another_origin_cannot_create_an_override_on_the_admin_listener() {
    let Some(bin) = common::chromium() else {
        common::unavailable("no chromium on PATH (apt-get install chromium)");
        return;
    };
    // No admin token, on loopback: the levers are open to whoever runs on this host, and to
    // no web page.
    let gw = Launch::serve()
        .upstream("http://127.0.0.1:9")
        .admin()
        .log("info")
        .spawn();
    let admin = gw.admin("").trim_end_matches('/').to_owned();
    let port = serve_page(bind(), attack_page(&admin));
    let profile = tempfile::tempdir().expect("profile dir");
    let seen = browse(bin, &format!("http://127.0.0.1:{port}/"), profile.path()).await;
    assert_eq!(seen["done"], true, "{seen}");
    let list: serde_json::Value = common::client()
        .get(gw.admin("/overrides"))
        .send()
        .await
        .expect("list")
        .json()
        .await
        .expect("json");
    assert_eq!(list["overrides"], serde_json::json!([]), "{list}");
    // The browser did send both: the listener refused them (not the browser).
    let refused = gw
        .stderr()
        .matches("admin listener refused a request")
        .count();
    assert!(
        refused >= 2,
        "the listener saw and refused both: {}",
        gw.stderr()
    );
}
