//! Top talkers against the real binary: after one address is refused 37 times and another 5,
//! `GET /top` lists the first with exactly 37 refusals and then the second; the page renders
//! them in a real Chromium (and a hostile label as text, never markup); `fleet-limiter top`
//! prints them; two instances on one Redis are summed; and the endpoint's hostile inputs (its
//! query, a missing token, a cross-site caller) are refused.

mod common;
mod redis_support;

use common::{Gateway, Launch};
use std::time::{Duration, Instant};

const TOKEN: &str = "0f3c2b9a8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a";

/// One request an hour per address on `/probe`, read from `X-Forwarded-For` (the test is the
/// trusted proxy); a tenant header a proxy sets, keyed on as given.
const CONFIG: &str = "[client_ip]\ntrust_proxy = [\"127.0.0.1/32\"]\n\
[limiters.probe]\nlimit = 1\nwindow = \"1h\"\nkey = \"ip\"\nroutes = [\"GET /probe\"]\n\
[limiters.tenant]\nlimit = 1\nwindow = \"1h\"\nkey = \"header:x-tenant\"\nroutes = [\"GET /tenant\"]\ngroup = \"tenant\"\ndisclose = false\n\
[limiters.tenant-ip]\nlimit = 1000\nwindow = \"1h\"\nkey = \"ip\"\nroutes = [\"GET /tenant\"]\ngroup = \"tenant-ip\"\n";

const A: &str = "203.0.113.37";
const B: &str = "198.51.100.5";

/// The gateway with [`CONFIG`] in front of `upstream`, its admin listener on.
fn launch(upstream: &wiremock::MockServer) -> Launch {
    Launch::serve()
        .config_toml(CONFIG)
        .upstream(&upstream.uri())
        .admin()
}

async fn hit(gw: &Gateway, path: &str, from: &str, n: usize) -> Vec<u16> {
    let client = common::client();
    let mut out = Vec::new();
    for _ in 0..n {
        let r = client
            .get(gw.url(path))
            .header("x-forwarded-for", from)
            .send()
            .await
            .expect("request");
        out.push(r.status().as_u16());
    }
    out
}

/// A refused 37 times (and allowed once), B 5 times.
async fn refuse_a_37_and_b_5(gw: &Gateway) {
    let a = hit(gw, "/probe", A, 38).await;
    assert_eq!(a.iter().filter(|s| **s == 429).count(), 37, "{a:?}");
    let b = hit(gw, "/probe", B, 6).await;
    assert_eq!(b.iter().filter(|s| **s == 429).count(), 5, "{b:?}");
}

async fn top_json(gw: &Gateway, query: &str, token: Option<&str>) -> (u16, serde_json::Value) {
    let mut rb = common::client().get(gw.admin(&format!("/top{query}")));
    if let Some(t) = token {
        rb = rb.bearer_auth(t);
    }
    let r = rb.send().await.expect("top");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or_default())
}

fn refused_of<'a>(v: &'a serde_json::Value, limiter: &str) -> Vec<&'a serde_json::Value> {
    v["limiters"]
        .as_array()
        .expect("limiters")
        .iter()
        .find(|l| l["limiter"] == limiter)
        .unwrap_or_else(|| panic!("{limiter} listed: {v}"))["refused"]
        .as_array()
        .expect("refused")
        .iter()
        .collect()
}

fn assert_a_then_b(v: &serde_json::Value) {
    let r = refused_of(v, "probe");
    assert_eq!(r.len(), 2, "{v}");
    assert_eq!(
        (
            r[0]["principal"].as_str(),
            r[0]["count"].as_u64(),
            r[0]["error"].as_u64()
        ),
        (Some(A), Some(37), Some(0)),
        "{v}"
    );
    assert_eq!(r[0]["address"], A);
    assert_eq!(
        (r[1]["principal"].as_str(), r[1]["count"].as_u64()),
        (Some(B), Some(5)),
        "{v}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_lists_the_address_refused_37_times_before_the_one_refused_5() {
    let upstream = common::upstream().await;
    let gw = launch(&upstream).spawn();
    refuse_a_37_and_b_5(&gw).await;
    for window in ["1m", "5m", "15m"] {
        let (status, v) = top_json(&gw, &format!("?window={window}"), None).await;
        assert_eq!(status, 200, "{v}");
        assert_a_then_b(&v);
    }
    // Asked most: A's 38 before B's 6.
    let (_, v) = top_json(&gw, "?limiter=probe&n=1", None).await;
    let l = &v["limiters"][0];
    assert_eq!(v["limiters"].as_array().map(Vec::len), Some(1));
    assert_eq!(l["requests"][0]["count"], 38);
    assert_eq!(l["requests"].as_array().map(Vec::len), Some(1), "n=1");

    // The command line prints the same.
    let admin = gw.admin("");
    let out = Launch::command([
        "top",
        "--admin",
        admin.trim_end_matches('/'),
        "--once",
        "--limiter",
        "probe",
    ])
    .run(Duration::from_secs(60));
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let lines: Vec<&str> = out
        .stdout
        .lines()
        .filter(|l| l.contains("refused"))
        .collect();
    assert_eq!(lines.len(), 2, "{}", out.stdout);
    assert!(
        lines[0].contains(A) && lines[0].split_whitespace().any(|w| w == "37"),
        "{}",
        out.stdout
    );
    assert!(
        lines[1].contains(B) && lines[1].split_whitespace().any(|w| w == "5"),
        "{}",
        out.stdout
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_query_the_token_and_cross_site_callers_are_refused() {
    let upstream = common::upstream().await;
    let gw = launch(&upstream)
        .env("FLEET_LIMITER_ADMIN_TOKEN", TOKEN)
        .spawn();
    hit(&gw, "/probe", A, 3).await;
    // The lists need the token; the page holds no data and asks for it.
    let (status, v) = top_json(&gw, "", None).await;
    assert_eq!(status, 401, "{v}");
    let (status, v) = top_json(&gw, "", Some("wrong")).await;
    assert_eq!(status, 401, "{v}");
    let (status, v) = top_json(&gw, "", Some(TOKEN)).await;
    assert_eq!(status, 200, "{v}");
    let page = common::client()
        .get(gw.admin("/top"))
        .header("accept", "text/html")
        .send()
        .await
        .expect("page");
    assert_eq!(page.status(), 200);
    let csp = page.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        csp.contains("default-src 'none'") && csp.contains("frame-ancestors 'none'"),
        "{csp}"
    );
    let html = page.text().await.unwrap();
    assert!(!html.contains(A), "the page carries no data");
    for (q, says) in [
        ("?window=2m", "window"),
        ("?n=1000", "n:"),
        ("?window=1m&window=5m", "twice"),
        ("?format=yaml", "format"),
        ("?who=me", "is not asked of /top"),
        ("?limiter=nope", "is not a configured limiter"),
    ] {
        let (status, v) = top_json(&gw, q, Some(TOKEN)).await;
        assert!(status == 400 || status == 404, "{q}: {status}");
        assert!(v["error"].as_str().unwrap_or("").contains(says), "{q}: {v}");
    }
    let long = format!("?limiter={}", "x".repeat(2000));
    let (status, _) = top_json(&gw, &long, Some(TOKEN)).await;
    assert_eq!(status, 400);
    // A page on another site, or a name that rebinds to loopback, gets nothing.
    let r = common::client()
        .get(gw.admin("/top"))
        .bearer_auth(TOKEN)
        .header("sec-fetch-site", "cross-site")
        .send()
        .await
        .expect("cross-site");
    assert_eq!(r.status(), 403);
    let r = common::client()
        .get(gw.admin("/top"))
        .bearer_auth(TOKEN)
        .header("host", "rebind.evil.example")
        .send()
        .await
        .expect("rebind");
    assert_eq!(r.status(), 421);
}

/// The DOM of `url` after its scripts ran for a while.
async fn dom(bin: &str, url: &str) -> String {
    let profile = tempfile::tempdir().expect("profile");
    let run = tokio::process::Command::new(bin)
        .args(common::CHROMIUM_FLAGS)
        .arg("--virtual-time-budget=5000")
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg("--dump-dom")
        .arg(url)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("chromium finished")
        .expect("chromium ran");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The rows of one list of one limiter as the page rendered them: (principal, count).
fn rendered(dom: &str, limiter: &str, list: &str) -> Vec<(String, String)> {
    let Some((_, section)) = dom.split_once(&format!("data-limiter=\"{limiter}\"")) else {
        return Vec::new();
    };
    let section = section.split("<section").next().unwrap_or("");
    let Some((_, table)) = section.split_once(&format!("<h3>{list}</h3>")) else {
        return Vec::new();
    };
    let table = table.split("</table>").next().unwrap_or("");
    table
        .split("<tr data-bucket=")
        .skip(1)
        .map(|row| {
            let cell = |class: &str| {
                row.split_once(&format!("class=\"{class}\">"))
                    .and_then(|(_, rest)| rest.split_once("</td>"))
                    .map(|(v, _)| v.to_owned())
                    .unwrap_or_default()
            };
            (cell("principal"), cell("n count"))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_renders_the_lists_in_chromium_and_a_hostile_label_as_text() {
    let Some(bin) = common::chromium() else {
        common::unavailable("no chromium on PATH (apt-get install chromium)");
        return;
    };
    let upstream = common::upstream().await;
    let gw = launch(&upstream).spawn();
    refuse_a_37_and_b_5(&gw).await;
    // A tenant a proxy passed on from a client: markup in a key's value.
    let hostile = "<img/src=x/onerror=document.title='owned'>";
    let client = common::client();
    for _ in 0..2 {
        client
            .get(gw.url("/tenant"))
            .header("x-tenant", hostile)
            .send()
            .await
            .expect("tenant");
    }
    let dom = dom(bin, &gw.admin("/top")).await;
    let rows = rendered(&dom, "probe", "refused most");
    assert_eq!(
        rows,
        vec![
            (A.to_owned(), "37".to_owned()),
            (B.to_owned(), "5".to_owned())
        ],
        "dom:\n{dom}"
    );
    assert!(
        dom.contains("<title>fleet-limiter: top talkers</title>"),
        "the title is the page's: {dom}"
    );
    assert!(
        !dom.contains("<img"),
        "a label is text, never markup: {dom}"
    );
    assert!(
        dom.contains("x-tenant: &lt;img/src=x/onerror=document.title='owned'&gt;"),
        "the hostile label shown as text: {dom}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_one_redis_are_summed() {
    let Some(redis) = redis_support::standalone() else {
        return;
    };
    let upstream = common::upstream().await;
    let url = redis.url();
    let spawn = || {
        Launch::serve()
            .config_toml(CONFIG)
            .upstream(&upstream.uri())
            .args(["--store", url.as_str()])
            .admin()
            .spawn()
    };
    let (one, two) = (spawn(), spawn());
    // A fresh address per run: a shared Redis may hold an earlier run's buckets.
    let who = format!("203.0.113.{}", 100 + rand::random::<u8>() % 100);
    let a = hit(&one, "/probe", &who, 21).await;
    let b = hit(&two, "/probe", &who, 17).await;
    let refused = a.iter().chain(&b).filter(|s| **s == 429).count() as u64;
    assert!(refused >= 37, "{a:?} {b:?}");
    // Each instance publishes every 5 s: both lists are summed within a few seconds.
    let start = Instant::now();
    loop {
        let (_, v) = top_json(&one, "?limiter=probe", None).await;
        let rows = refused_of(&v, "probe");
        let mine = rows.iter().find(|r| r["principal"] == who.as_str());
        if v["instances"] == 2 && mine.is_some_and(|r| r["count"].as_u64() == Some(refused)) {
            assert_eq!(mine.unwrap()["error"], 0, "{v}");
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "not summed: {v}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A page in a real Chromium, driven over the DevTools protocol: `eval` runs a script in it and
/// returns its value.
struct Browser {
    _child: tokio::process::Child,
    _profile: tempfile::TempDir,
    ws: tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
    id: u64,
}

impl Browser {
    async fn open(bin: &str, url: &str) -> Browser {
        let profile = tempfile::tempdir().expect("profile");
        let port = common::free_port();
        let child = tokio::process::Command::new(bin)
            .args(common::CHROMIUM_FLAGS)
            .arg(format!("--remote-debugging-port={port}"))
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg(url)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("chromium");
        let start = Instant::now();
        let ws_url = loop {
            let list = common::client()
                .get(format!("http://127.0.0.1:{port}/json/list"))
                .send()
                .await;
            if let Ok(r) = list {
                let targets: serde_json::Value = r.json().await.unwrap_or_default();
                let page = targets.as_array().and_then(|t| {
                    t.iter().find(|t| {
                        t["type"] == "page" && t["url"].as_str().is_some_and(|u| u.contains("/top"))
                    })
                });
                if let Some(u) = page.and_then(|p| p["webSocketDebuggerUrl"].as_str()) {
                    break u.to_owned();
                }
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "chromium's DevTools"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let (ws, _) = tokio_tungstenite::connect_async(ws_url.as_str())
            .await
            .expect("devtools websocket");
        Browser {
            _child: child,
            _profile: profile,
            ws,
            id: 0,
        }
    }

    async fn eval(&mut self, expression: &str) -> serde_json::Value {
        use futures_util::{SinkExt as _, StreamExt as _};
        self.id += 1;
        let msg = serde_json::json!({
            "id": self.id,
            "method": "Runtime.evaluate",
            "params": { "expression": expression, "returnByValue": true, "awaitPromise": true },
        });
        self.ws
            .send(tokio_tungstenite::tungstenite::Message::Text(
                msg.to_string().into(),
            ))
            .await
            .expect("send");
        loop {
            let m = tokio::time::timeout(Duration::from_secs(30), self.ws.next())
                .await
                .expect("devtools answered")
                .expect("open")
                .expect("message");
            let Ok(text) = m.into_text() else { continue };
            let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
            if v["id"] == self.id {
                return v["result"]["result"]["value"].clone();
            }
        }
    }

    /// `eval` until it answers `true`.
    async fn until(&mut self, expression: &str, what: &str) {
        let start = Instant::now();
        while self.eval(expression).await != serde_json::Value::Bool(true) {
            assert!(start.elapsed() < Duration::from_secs(30), "{what}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_resets_and_overrides_a_row_from_the_page_with_the_token() {
    let Some(bin) = common::chromium() else {
        common::unavailable("no chromium on PATH (apt-get install chromium)");
        return;
    };
    let upstream = common::upstream().await;
    let gw = launch(&upstream)
        .env("FLEET_LIMITER_ADMIN_TOKEN", TOKEN)
        .spawn();
    refuse_a_37_and_b_5(&gw).await;
    let mut page = Browser::open(bin, &gw.admin("/top")).await;
    // Without the token the page asks for it and shows no row.
    page.until(
        "!document.getElementById('login').hidden",
        "the page asks for the token",
    )
    .await;
    assert_eq!(
        page.eval("document.querySelectorAll('tr[data-bucket]').length")
            .await,
        0
    );
    page.eval(&format!(
        "document.getElementById('token').value = '{TOKEN}'; document.getElementById('use-token').click(); true"
    ))
    .await;
    let row_a = format!(
        "[...document.querySelectorAll('section[data-limiter=\"probe\"] tr[data-bucket]')].find(r => r.querySelector('.principal').textContent === '{A}')"
    );
    page.until(&format!("!!{row_a}"), "the page lists A").await;
    assert_eq!(
        hit(&gw, "/probe", A, 1).await,
        vec![429],
        "A is refused before the reset"
    );
    page.eval(&format!("{row_a}.querySelector('button').click(); true"))
        .await;
    page.until(
        "document.getElementById('acted').textContent.includes('done')",
        "the reset is done",
    )
    .await;
    assert_eq!(
        hit(&gw, "/probe", A, 1).await,
        vec![200],
        "A's bucket was reset from the page"
    );

    // An override for B's address: 50 an hour.
    let row_b = row_a.replace(A, B);
    page.until(&format!("!!{row_b}"), "the page lists B").await;
    page.eval(&format!(
        "const r = {row_b}; r.querySelector('input[type=number]').value = '50'; r.querySelectorAll('button')[1].click(); true"
    ))
    .await;
    page.until(
        &format!("document.getElementById('acted').textContent === 'override {B} on probe: done'"),
        "the override is done",
    )
    .await;
    let list: serde_json::Value = common::client()
        .get(gw.admin("/overrides"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("overrides")
        .json()
        .await
        .expect("json");
    let text = list.to_string();
    assert!(
        text.contains(&format!("ip:{B}")) && text.contains("\"limit\":50"),
        "{text}"
    );
    let b = hit(&gw, "/probe", B, 3).await;
    assert_eq!(b, vec![200, 200, 200], "B's override is in force");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_top_talkers_off_nothing_is_kept_and_top_says_so() {
    let upstream = common::upstream().await;
    let gw = launch(&upstream)
        .env("FLEET_LIMITER_TOP_TALKERS", "false")
        .spawn();
    hit(&gw, "/probe", A, 3).await;
    let (status, v) = top_json(&gw, "", None).await;
    assert_eq!(status, 404, "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap_or("")
            .contains("ops.top_talkers = false"),
        "{v}"
    );
    assert_eq!(
        gw.metric(r#"fleet_limiter_top_buckets{limiter="probe"}"#)
            .await,
        None,
        "no list was kept"
    );
    // Switched on, the same gateway's lists count (the metric shows it).
    let on = launch(&upstream).spawn();
    hit(&on, "/probe", A, 3).await;
    assert_eq!(
        on.metric(r#"fleet_limiter_top_buckets{limiter="probe"}"#)
            .await,
        Some(2.0),
        "one bucket asked, one refused"
    );
}
