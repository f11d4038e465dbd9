//! Admission control through the real binary, against an upstream written here that counts the
//! requests it is serving at once: the cap holds under a burst, every request gets either 200 or
//! a 503 with `Retry-After` and problem+json, the shed counts match the 503s, a group's share
//! stays usable while the other routes are saturated, a waiting request is shed after the queue
//! timeout, a request refused by a limiter never takes a slot, and a slot is held until the
//! answer's body has been sent, and a WebSocket handshake holds one only until it is answered.
//! And no one client address can take the slots from the others: it holds at most its share
//! (429 past it, whatever it sends and however many connections it opens, behind a trusted
//! proxy by its forwarded address, an IPv6 /56 as one client), and a body trickled just above
//! the minimum rate is cut off once it has held its slot for `admission.body_hold`.

mod common;

use common::{client, Gateway, Launch, PATIENCE};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

/// A keep-alive HTTP/1.1 upstream for bodiless requests that counts what it serves:
///
/// - a path containing `/hold/` is answered once the test lets one go ([`Upstream::release`]);
/// - a path containing `/stream/` gets its answer's head and a first chunk at once, and the end
///   of its body once the test lets one go;
/// - a path containing `/upload/` is answered once its whole body (`Content-Length`) is read;
/// - any other path is held `delay` (the slow upstream), then answered `200 ok`.
///
/// A request counts as being served from its head's arrival until its answer has been written.
#[derive(Clone)]
struct Upstream {
    url: String,
    now: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
    seen: Arc<AtomicUsize>,
    release: Arc<Semaphore>,
}

impl Upstream {
    async fn start(delay: Duration) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let up = Upstream {
            url: format!("http://{}", listener.local_addr().expect("addr")),
            now: Arc::default(),
            most: Arc::default(),
            seen: Arc::default(),
            release: Arc::new(Semaphore::new(0)),
        };
        let server = up.clone();
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let up = server.clone();
                tokio::spawn(async move {
                    let _ = up.serve(conn, delay).await;
                });
            }
        });
        up
    }

    async fn serve(&self, mut conn: TcpStream, delay: Duration) -> std::io::Result<()> {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            let head_end = loop {
                if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    break i + 4;
                }
                let n = conn.read(&mut chunk).await?;
                if n == 0 {
                    return Ok(());
                }
                buf.extend_from_slice(&chunk[..n]);
            };
            let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
            buf.drain(..head_end);
            let path = head.split(' ').nth(1).unwrap_or("/").to_owned();
            self.seen.fetch_add(1, Ordering::SeqCst);
            let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
            self.most.fetch_max(n, Ordering::SeqCst);
            if path.contains("/ws/") {
                // Switch protocols, then keep the connection open and quiet until the client
                // closes it: an open WebSocket.
                self.now.fetch_sub(1, Ordering::SeqCst);
                conn.write_all(
                    b"HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n",
                )
                .await?;
                while conn.read(&mut chunk).await? > 0 {}
                return Ok(());
            }
            if path.contains("/upload/") {
                let length: usize = head
                    .lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case("content-length")
                            .then(|| v.trim().parse().ok())?
                    })
                    .unwrap_or(0);
                while buf.len() < length {
                    let n = conn.read(&mut chunk).await?;
                    if n == 0 {
                        self.now.fetch_sub(1, Ordering::SeqCst);
                        return Ok(());
                    }
                    buf.extend_from_slice(&chunk[..n]);
                }
                buf.drain(..length);
                self.now.fetch_sub(1, Ordering::SeqCst);
                conn.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                    .await?;
                continue;
            }
            if path.contains("/stream/") {
                conn.write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n")
                    .await?;
                self.wait_for_release().await;
                self.now.fetch_sub(1, Ordering::SeqCst);
                conn.write_all(b"0\r\n\r\n").await?;
                continue;
            }
            if path.contains("/hold/") {
                self.wait_for_release().await;
            } else {
                tokio::time::sleep(delay).await;
            }
            self.now.fetch_sub(1, Ordering::SeqCst);
            conn.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                .await?;
        }
    }

    async fn wait_for_release(&self) {
        if let Ok(permit) = self.release.acquire().await {
            permit.forget();
        }
    }

    /// Let `n` held requests (or streamed bodies) finish.
    fn release(&self, n: usize) {
        self.release.add_permits(n);
    }

    /// Wait until the upstream is serving exactly `n` requests at once.
    async fn wait_serving(&self, n: usize) {
        let deadline = Instant::now() + PATIENCE;
        while self.now.load(Ordering::SeqCst) != n {
            assert!(
                Instant::now() < deadline,
                "the upstream never served {n} at once (now {})",
                self.now.load(Ordering::SeqCst)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn gateway(upstream: &Upstream, toml: &str) -> Gateway {
    Launch::serve()
        .upstream(&upstream.url)
        .config_toml(toml)
        .admin()
        .spawn()
}

/// What a 503 from admission control must carry: `Retry-After` of at least one second, and a
/// problem document of the overloaded type.
async fn assert_shed(res: reqwest::Response) -> u64 {
    assert_eq!(res.status(), 503);
    let retry_after: u64 = res
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .expect("a Retry-After in whole seconds");
    assert!(retry_after >= 1, "Retry-After {retry_after}");
    assert_eq!(
        res.headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("application/problem+json")
    );
    let body: serde_json::Value = res.json().await.expect("problem+json");
    assert_eq!(body["type"], "urn:fleet-limiter:problem:overloaded");
    assert_eq!(body["title"], "Service Unavailable");
    assert_eq!(body["status"], 503);
    assert_eq!(body["retry_after"], retry_after);
    assert!(
        body["detail"].as_str().is_some_and(|d| !d.is_empty()),
        "{body}"
    );
    retry_after
}

async fn shed_total(gw: &Gateway, group: &str) -> f64 {
    let mut total = 0.0;
    for reason in ["queue_full", "queue_timeout"] {
        total += gw
            .metric(&format!(
                "fleet_limiter_admission_shed_total{{group=\"{group}\",reason=\"{reason}\"}}"
            ))
            .await
            .unwrap_or(f64::NAN);
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_on_a_slow_upstream_never_exceeds_the_cap_and_every_request_is_answered() {
    let upstream = Upstream::start(Duration::from_millis(300)).await;
    let gw = gateway(
        &upstream,
        // One client sends the whole burst: the cap is under test here, not the client share.
        "enabled = false\n[admission]\nmax_in_flight = 4\nqueue = 4\nqueue_timeout = \"1s\"\nclient_share_percent = 100\n",
    );
    let http = client();
    let requests: Vec<_> = (0..64)
        .map(|i| {
            let req = http.get(gw.url(&format!("/api/devices/{i}"))).send();
            tokio::spawn(req)
        })
        .collect();
    let (mut ok, mut shed) = (0u64, 0u64);
    for r in requests {
        let res = r.await.expect("joined").expect("an answer");
        match res.status().as_u16() {
            200 => {
                assert_eq!(res.text().await.expect("body"), "ok");
                ok += 1;
            }
            503 => {
                assert_shed(res).await;
                shed += 1;
            }
            other => panic!("status {other}"),
        }
    }
    assert_eq!(ok + shed, 64);
    let most = upstream.most.load(Ordering::SeqCst);
    eprintln!(
        "{ok} answered 200, {shed} shed with 503, the upstream served at most {most} at once"
    );
    assert!(most <= 4, "the upstream served {most} at once");
    assert!(ok >= 4, "{ok} answered");
    assert!(
        shed > 0,
        "a burst of 64 on 4 slots and 4 places shed nothing"
    );
    assert_eq!(upstream.seen.load(Ordering::SeqCst) as u64, ok);
    assert_eq!(shed_total(&gw, "default").await, shed as f64);
    gw.wait_metric(
        "fleet_limiter_admission_in_flight{group=\"default\"}",
        |v| v == 0.0,
    )
    .await;
    assert_eq!(
        gw.metric("fleet_limiter_admission_queued{group=\"default\"}")
            .await,
        Some(0.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_routes_keep_their_share_while_the_dashboard_saturates_its_own() {
    let upstream = Upstream::start(Duration::ZERO).await;
    let gw = gateway(
        &upstream,
        "enabled = false\n[admission]\nmax_in_flight = 3\nqueue = 0\nclient_share_percent = 100\n[admission.groups.agent]\nroutes = [\"/api/agent/**\"]\nmax_in_flight = 1\n",
    );
    let http = client();
    // The dashboard's two slots (three less the agent's one), taken and held.
    let held: Vec<_> = (0..2)
        .map(|i| tokio::spawn(http.get(gw.url(&format!("/api/dashboard/hold/{i}"))).send()))
        .collect();
    upstream.wait_serving(2).await;
    for i in 0..5 {
        let res = http
            .get(gw.url(&format!("/api/dashboard/devices/{i}")))
            .send()
            .await
            .expect("an answer");
        assert_shed(res).await;
    }
    for _ in 0..3 {
        let res = http
            .post(gw.url("/api/agent/heartbeat"))
            .send()
            .await
            .expect("an answer");
        assert_eq!(res.status(), 200, "the agent share was taken");
    }
    let sample = |group: &str, reason: &str| {
        format!("fleet_limiter_admission_shed_total{{group=\"{group}\",reason=\"{reason}\"}}")
    };
    assert_eq!(gw.metric(&sample("default", "queue_full")).await, Some(5.0));
    assert_eq!(gw.metric(&sample("agent", "queue_full")).await, Some(0.0));
    assert_eq!(
        gw.metric("fleet_limiter_admission_in_flight{group=\"default\"}")
            .await,
        Some(2.0)
    );
    upstream.release(2);
    for h in held {
        let res = h.await.expect("joined").expect("an answer");
        assert_eq!(res.status(), 200);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_request_is_shed_after_the_queue_timeout_and_a_limiter_refusal_takes_no_slot() {
    let upstream = Upstream::start(Duration::ZERO).await;
    let gw = gateway(
        &upstream,
        "[admission]\nmax_in_flight = 1\nqueue = 1\nqueue_timeout = \"200ms\"\n[limiters.reports]\nlimit = 1\nwindow = \"1h\"\nkey = \"ip\"\nroutes = [\"/api/reports/**\"]\n",
    );
    let http = client();
    let held = tokio::spawn(http.get(gw.url("/api/other/hold/1")).send());
    upstream.wait_serving(1).await;
    // Allowed by its limiter, then it waits for the one slot, and is shed when none comes free.
    let res = http
        .get(gw.url("/api/reports/weekly"))
        .send()
        .await
        .expect("an answer");
    let wait = assert_shed(res).await;
    assert!(
        (1..=2).contains(&wait),
        "200ms rounds up to one second, spread over [1, 2]: {wait}"
    );
    // Over its limiter's budget: 429 from the limiter, never a wait for a slot.
    let res = http
        .get(gw.url("/api/reports/weekly"))
        .send()
        .await
        .expect("an answer");
    assert_eq!(res.status(), 429);
    let sample = |reason: &str| {
        format!("fleet_limiter_admission_shed_total{{group=\"default\",reason=\"{reason}\"}}")
    };
    assert_eq!(gw.metric(&sample("queue_timeout")).await, Some(1.0));
    assert_eq!(gw.metric(&sample("queue_full")).await, Some(0.0));
    upstream.release(1);
    let res = held.await.expect("joined").expect("an answer");
    assert_eq!(res.status(), 200);
    assert_eq!(upstream.seen.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_is_held_until_the_answers_body_has_been_sent() {
    let upstream = Upstream::start(Duration::ZERO).await;
    let gw = gateway(
        &upstream,
        "enabled = false\n[admission]\nmax_in_flight = 1\nqueue = 0\n",
    );
    let http = client();
    // The head and a first chunk arrive; the rest of the body waits on the upstream.
    let mut streaming = http
        .get(gw.url("/api/export/stream/1"))
        .send()
        .await
        .expect("the head");
    assert_eq!(streaming.status(), 200);
    assert_eq!(
        streaming.chunk().await.expect("a chunk").as_deref(),
        Some(&b"ok"[..])
    );
    let res = http
        .get(gw.url("/api/devices"))
        .send()
        .await
        .expect("an answer");
    assert_shed(res).await;
    upstream.release(1);
    while streaming.chunk().await.expect("the body").is_some() {}
    gw.wait_metric(
        "fleet_limiter_admission_in_flight{group=\"default\"}",
        |v| v == 0.0,
    )
    .await;
    let res = http
        .get(gw.url("/api/devices"))
        .send()
        .await
        .expect("an answer");
    assert_eq!(res.status(), 200);
}

/// A WebSocket handshake over `addr`'s traffic port; returns the connection and the answer's
/// head.
async fn handshake(gw: &Gateway, path: &str) -> (TcpStream, String) {
    let addr = gw.url("").trim_start_matches("http://").to_owned();
    let mut conn = TcpStream::connect(&addr).await.expect("connect");
    let req = format!(
        "GET {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: upgrade\r\nupgrade: websocket\r\nsec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    );
    conn.write_all(req.as_bytes()).await.expect("send");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = conn.read(&mut byte).await.expect("read");
        assert_eq!(n, 1, "closed before the answer's head: {head:?}");
        head.push(byte[0]);
    }
    (conn, String::from_utf8_lossy(&head).to_ascii_lowercase())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_handshake_holds_a_slot_only_until_it_is_answered() {
    let upstream = Upstream::start(Duration::ZERO).await;
    let gw = gateway(
        &upstream,
        "enabled = false\n[admission]\nmax_in_flight = 1\nqueue = 0\n",
    );
    let http = client();
    // An open WebSocket: switched, and holding no slot, so a request still gets through.
    let (_open, head) = handshake(&gw, "/ws/live").await;
    assert!(head.starts_with("http/1.1 101"), "{head}");
    let res = http
        .get(gw.url("/api/devices"))
        .send()
        .await
        .expect("an answer");
    assert_eq!(res.status(), 200);
    // With the one slot taken, a handshake is shed, and its connection closed.
    let held = tokio::spawn(http.get(gw.url("/api/other/hold/1")).send());
    upstream.wait_serving(1).await;
    let (_shed, head) = handshake(&gw, "/ws/live").await;
    assert!(head.starts_with("http/1.1 503"), "{head}");
    // The queue timeout (1 s) spread over [1, 2] by the caller.
    assert!(
        head.contains("\r\nretry-after: 1\r\n") || head.contains("\r\nretry-after: 2\r\n"),
        "{head}"
    );
    assert!(head.contains("\r\nconnection: close\r\n"), "{head}");
    assert_eq!(
        gw.metric("fleet_limiter_admission_shed_total{group=\"default\",reason=\"queue_full\"}")
            .await,
        Some(1.0)
    );
    upstream.release(1);
    assert_eq!(
        held.await.expect("joined").expect("an answer").status(),
        200
    );
}

/// A client of the gateway whose connections come from `from` (any of 127.0.0.0/8 on Linux).
fn client_from(from: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .local_address(from.parse::<std::net::IpAddr>().expect("an address"))
        .timeout(PATIENCE)
        .build()
        .expect("client")
}

/// What a 429 from admission control must carry: `Retry-After`, and a problem document of the
/// client-share type.
async fn assert_client_share(res: reqwest::Response) {
    assert_eq!(res.status(), 429);
    assert!(res.headers().contains_key("retry-after"), "{res:?}");
    let body: serde_json::Value = res.json().await.expect("problem+json");
    assert_eq!(body["type"], "urn:fleet-limiter:problem:client-share");
    assert_eq!(body["status"], 429);
}

fn shed_sample(reason: &str) -> String {
    format!("fleet_limiter_admission_shed_total{{group=\"default\",reason=\"{reason}\"}}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_from_one_address_takes_its_share_and_leaves_the_rest_to_others() {
    let upstream = Upstream::start(Duration::ZERO).await;
    // The defaults: a quarter of the four slots per address, and a queue.
    let gw = gateway(
        &upstream,
        "enabled = false\n[admission]\nmax_in_flight = 4\nqueue = 8\nqueue_timeout = \"30s\"\n",
    );
    let greedy = client_from("127.0.0.2");
    let burst: Vec<_> = (0..64)
        .map(|i| tokio::spawn(greedy.get(gw.url(&format!("/api/x/hold/{i}"))).send()))
        .collect();
    upstream.wait_serving(1).await;
    gw.wait_metric(&shed_sample("client_share"), |v| v == 63.0)
        .await;
    // Three other addresses take every other slot at once; none of them waits or is shed.
    let served: Vec<_> = ["127.0.0.3", "127.0.0.4", "127.0.0.5"]
        .iter()
        .map(|from| tokio::spawn(client_from(from).get(gw.url("/api/y/hold/1")).send()))
        .collect();
    upstream.wait_serving(4).await;
    upstream.release(4);
    let mut statuses = Vec::new();
    for r in burst {
        let res = r.await.expect("joined").expect("an answer");
        if res.status() == 429 {
            assert_client_share(res).await;
            statuses.push(429);
        } else {
            statuses.push(res.status().as_u16());
        }
    }
    assert_eq!(statuses.iter().filter(|s| **s == 200).count(), 1);
    assert_eq!(statuses.iter().filter(|s| **s == 429).count(), 63);
    for r in served {
        assert_eq!(r.await.expect("joined").expect("an answer").status(), 200);
    }
    for reason in ["queue_full", "queue_timeout", "body_hold"] {
        assert_eq!(gw.metric(&shed_sample(reason)).await, Some(0.0), "{reason}");
    }
    assert_eq!(upstream.most.load(Ordering::SeqCst), 4);
}

/// A POST of a 10 MB body from `from`, trickled at 300 bytes a second (30 bytes every 100 ms,
/// above the default minimum of 240), until the gateway answers; returns the answer.
async fn trickle(gw: &Gateway, from: &str, path: &str) -> common::RawResponse {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind((from.parse::<std::net::IpAddr>().expect("address"), 0).into())
        .expect("bind");
    let mut conn = socket.connect(gw.addr).await.expect("connect");
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: {}\r\ncontent-type: application/octet-stream\r\ncontent-length: 10000000\r\n\r\n",
        gw.addr
    );
    conn.write_all(head.as_bytes()).await.expect("head");
    let (mut read, mut write) = conn.into_split();
    let sender = tokio::spawn(async move {
        let chunk = [b'x'; 30];
        while write.write_all(&chunk).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let mut answer = Vec::new();
    let read_all = async {
        let mut buf = [0u8; 4096];
        loop {
            match read.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
            }
        }
    };
    tokio::time::timeout(PATIENCE, read_all)
        .await
        .expect("an answer, and the connection closed, in time");
    sender.abort();
    common::parse_raw(&answer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_slow_uploads_from_one_address_hold_one_slot_and_are_cut_off_at_the_hold() {
    let upstream = Upstream::start(Duration::ZERO).await;
    // A hold longer than the rate rule's 5 s grace period: the rate rule could trip first, and
    // does not, as the trickle is above the minimum rate.
    let gw = gateway(
        &upstream,
        "enabled = false\n[admission]\nmax_in_flight = 4\nqueue = 2\nbody_hold = \"8s\"\n",
    );
    let paths: Vec<String> = (0..4).map(|i| format!("/api/upload/{i}")).collect();
    let uploads =
        futures_util::future::join_all(paths.iter().map(|p| trickle(&gw, "127.0.0.2", p)));
    let others = async {
        // While the uploads run: one holds a slot, three were refused their own.
        gw.wait_metric(&shed_sample("client_share"), |v| v == 3.0)
            .await;
        upstream.wait_serving(1).await;
        // Another client, a request at a time (its own share is one slot of four).
        let polite = client_from("127.0.0.3");
        let mut statuses = Vec::new();
        for i in 0..6 {
            let res = polite
                .get(gw.url(&format!("/api/devices/{i}")))
                .send()
                .await
                .expect("an answer");
            statuses.push(res.status().as_u16());
        }
        statuses
    };
    let (uploads, others) = tokio::join!(uploads, others);
    assert_eq!(others, [200; 6], "another client was served throughout");
    let mut statuses: Vec<u16> = uploads.iter().map(|r| r.status).collect();
    statuses.sort_unstable();
    assert_eq!(statuses, [408, 429, 429, 429]);
    let cut = uploads
        .iter()
        .find(|r| r.status == 408)
        .expect("the held one");
    let body: serde_json::Value = serde_json::from_slice(&cut.body).expect("problem+json");
    assert_eq!(body["type"], "urn:fleet-limiter:problem:request-timeout");
    assert!(
        body["detail"]
            .as_str()
            .is_some_and(|d| d.contains("admission.body_hold")),
        "{body}"
    );
    assert_eq!(cut.header("connection"), Some("close"));
    assert_eq!(gw.metric(&shed_sample("body_hold")).await, Some(1.0));
    assert_eq!(
        gw.metric("fleet_limiter_client_body_timeouts_total{rule=\"rate\"}")
            .await,
        Some(0.0)
    );
    gw.wait_metric(
        "fleet_limiter_admission_in_flight{group=\"default\"}",
        |v| v == 0.0,
    )
    .await;
    // The slot is back: the same address is served again.
    let res = client_from("127.0.0.2")
        .get(gw.url("/api/devices/again"))
        .send()
        .await
        .expect("an answer");
    assert_eq!(res.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_trusted_proxy_the_share_is_the_forwarded_clients_and_a_v6_56_is_one_client() {
    let upstream = Upstream::start(Duration::ZERO).await;
    let gw = Launch::serve()
        .upstream(&upstream.url)
        .config_toml("enabled = false\n[admission]\nmax_in_flight = 4\nqueue = 0\n")
        .args(["--trust-proxy", "127.0.0.1"])
        .admin()
        .spawn();
    let http = client();
    let from = |xff: &'static str, path: &str| {
        http.get(gw.url(path)).header("x-forwarded-for", xff).send()
    };
    let held = tokio::spawn(from("2001:db8:0:ab01::1", "/api/x/hold/1"));
    upstream.wait_serving(1).await;
    // Another host of the same /56 is the same client: its share is taken.
    assert_client_share(
        from("2001:db8:0:ab99::7", "/api/x/2")
            .await
            .expect("an answer"),
    )
    .await;
    // The next /56 is another client.
    let res = from("2001:db8:0:ac00::1", "/api/x/3")
        .await
        .expect("an answer");
    assert_eq!(res.status(), 200);
    // A peer that is not a trusted proxy is its own client, whatever it forwards.
    let untrusted = client_from("127.0.0.9");
    let held_untrusted = tokio::spawn(
        untrusted
            .get(gw.url("/api/z/hold/2"))
            .header("x-forwarded-for", "203.0.113.1")
            .send(),
    );
    upstream.wait_serving(2).await;
    for forged in ["203.0.113.2", "2001:db8::1"] {
        let res = untrusted
            .get(gw.url("/api/z/3"))
            .header("x-forwarded-for", forged)
            .send()
            .await
            .expect("an answer");
        assert_client_share(res).await;
    }
    assert_eq!(gw.metric(&shed_sample("client_share")).await, Some(3.0));
    upstream.release(2);
    assert_eq!(held.await.expect("joined").expect("answer").status(), 200);
    assert_eq!(
        held_untrusted
            .await
            .expect("joined")
            .expect("answer")
            .status(),
        200
    );
}

/// Four addresses at their share once held every slot, and a fifth client waited or was shed.
/// Now the last share of free slots is kept for addresses that hold none: the four hold 7 of
/// the 8 and a newcomer is served at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_addresses_at_their_share_leave_a_slot_for_a_newcomer() {
    let upstream = Upstream::start(Duration::ZERO).await;
    // 8 slots, a quarter (2) per address, no queue: what is not free now is shed.
    let gw = gateway(
        &upstream,
        "enabled = false\n[admission]\nmax_in_flight = 8\nqueue = 0\n",
    );
    let mut holding = Vec::new();
    let mut refused = 0;
    for (n, from) in ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"]
        .iter()
        .enumerate()
    {
        for i in 0..2 {
            let c = client_from(from);
            let req = tokio::spawn(c.get(gw.url(&format!("/api/x/hold/{n}{i}"))).send());
            // Wait until it is served, or answered at once.
            let deadline = Instant::now() + PATIENCE;
            loop {
                if upstream.now.load(Ordering::SeqCst) > holding.len() {
                    holding.push(req);
                    break;
                }
                if req.is_finished() {
                    let res = req.await.expect("joined").expect("an answer");
                    assert_client_share(res).await;
                    refused += 1;
                    break;
                }
                assert!(Instant::now() < deadline, "neither served nor answered");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
    assert_eq!(
        (holding.len(), refused),
        (7, 1),
        "the fourth address's second is refused"
    );
    // A newcomer is served while the four still hold theirs.
    let newcomer = tokio::spawn(client_from("127.0.0.6").get(gw.url("/api/y/hold/1")).send());
    upstream.wait_serving(8).await;
    upstream.release(8);
    assert_eq!(
        newcomer.await.expect("joined").expect("an answer").status(),
        200
    );
    for r in holding {
        assert_eq!(r.await.expect("joined").expect("an answer").status(), 200);
    }
    assert_eq!(gw.metric(&shed_sample("queue_full")).await, Some(0.0));
    assert_eq!(gw.metric(&shed_sample("client_share")).await, Some(1.0));
}

/// A full queue's 503 tells each client a wait of its own: the queue timeout `w` spread over
/// [w, 2w] by its address and agent id, the same one on every asking, the body's number and
/// every limit header's reset saying it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_tells_each_client_a_wait_of_its_own() {
    let upstream = Upstream::start(Duration::ZERO).await;
    // One slot and no queue: while one request is held, every other is shed at once. The
    // built-in `ui` limiter meters /api/** and allows them all.
    let gw = Launch::serve()
        .upstream(&upstream.url)
        .config_toml(
            "[admission]\nmax_in_flight = 1\nqueue = 0\nqueue_timeout = \"5s\"\nclient_share_percent = 100\n",
        )
        .args(["--trust-proxy", "127.0.0.1"])
        .env("FLEET_LIMITER_HEADERS_STANDARD", "draft-6")
        .env("FLEET_LIMITER_HEADERS_LEGACY_RESET", "delta")
        .admin()
        .spawn();
    let http = client();
    let held = tokio::spawn(http.get(gw.url("/api/x/hold/1")).send());
    upstream.wait_serving(1).await;
    let ask = |i: usize| {
        http.get(gw.url(&format!("/api/y/{i}")))
            .header("x-forwarded-for", format!("203.0.113.{i}"))
            .header("x-agent-id", format!("agent-{i}"))
            .send()
    };
    let header = |res: &reqwest::Response, name: &str| -> Option<u64> {
        res.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
    };
    let mut told = std::collections::BTreeMap::<u64, u32>::new();
    for i in 1..=60 {
        let mut seen = Vec::new();
        for _ in 0..2 {
            let res = ask(i).await.expect("an answer");
            let resets = (
                header(&res, "ratelimit-reset"),
                header(&res, "x-ratelimit-reset"),
            );
            let wait = assert_shed(res).await;
            assert!((5..=10).contains(&wait), "client {i}: {wait}");
            assert_eq!(
                resets,
                (Some(wait), Some(wait)),
                "client {i}: every reset is Retry-After"
            );
            seen.push(wait);
        }
        assert_eq!(
            seen[0], seen[1],
            "client {i}: the same wait on every asking"
        );
        *told.entry(seen[0]).or_default() += 1;
    }
    eprintln!("60 clients shed by a full queue were told {told:?} (seconds: clients)");
    assert!(told.len() >= 3, "{told:?}");
    assert!(told.values().all(|&n| n <= 30), "{told:?}");
    assert_eq!(gw.metric(&shed_sample("queue_full")).await, Some(120.0));
    upstream.release(1);
    let res = held.await.expect("joined").expect("an answer");
    assert_eq!(res.status(), 200);
}
