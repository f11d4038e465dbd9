//! WebSockets through the real gateway binary: a tokio-tungstenite echo server as the upstream
//! on a free loopback port, a tokio-tungstenite client, and `fleet-limiter serve` between them.

mod common;

use common::{Gateway, PATIENCE};
use futures_util::{SinkExt, StreamExt};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

type Client = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// A handshake as the upstream saw it: the request target and the headers.
type Handshake = (String, Vec<(String, String)>);

/// What the echo upstream saw.
#[derive(Default)]
struct Seen {
    /// Handshakes that reached it (switched or declined): the request target and the headers.
    handshakes: Mutex<Vec<Handshake>>,
    /// Close frames that came from the client's side.
    closes: AtomicUsize,
    /// WebSocket connections that ended, whoever closed them.
    ended: AtomicUsize,
}

impl Seen {
    fn handshakes(&self) -> usize {
        self.handshakes.lock().expect("lock").len()
    }
}

/// A WebSocket echo server on a free loopback port: every text and binary message comes back.
/// `/ws/decline` answers `403` instead of switching protocols; on `/ws/bye` the server closes
/// (code 1000, reason `bye`) when the first message arrives. A request that is not a
/// WebSocket handshake gets `200 ok` and the connection closed.
async fn echo_upstream() -> (String, Arc<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local addr");
    let seen = Arc::new(Seen::default());
    let s = seen.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(serve(stream, s.clone()));
        }
    });
    (format!("http://{addr}"), seen)
}

// The handshake callback's error type is tungstenite's (a whole response).
#[allow(clippy::result_large_err)]
async fn serve(mut stream: TcpStream, seen: Arc<Seen>) {
    if !asks_to_upgrade(&stream).await {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") && stream.read_exact(&mut byte).await.is_ok() {
            head.push(byte[0]);
        }
        let _ = stream
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")
            .await;
        return;
    }
    let path = Arc::new(Mutex::new(String::new()));
    let p = path.clone();
    let s = seen.clone();
    let callback = move |req: &Request, res: Response| -> Result<Response, ErrorResponse> {
        let headers = req
            .headers()
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str().to_owned(),
                    v.to_str().unwrap_or_default().to_owned(),
                )
            })
            .collect();
        s.handshakes
            .lock()
            .expect("lock")
            .push((req.uri().to_string(), headers));
        *p.lock().expect("lock") = req.uri().path().to_owned();
        if req.uri().path() == "/ws/decline" {
            let body = "no live view here".to_owned();
            let declined = http::Response::builder()
                .status(403)
                .header("content-type", "text/plain")
                .header("content-length", body.len().to_string())
                .header("x-upstream", "declined")
                .body(Some(body))
                .expect("response");
            return Err(declined);
        }
        Ok(res)
    };
    let Ok(mut ws) = tokio_tungstenite::accept_hdr_async(stream, callback).await else {
        return;
    };
    let bye = *path.lock().expect("lock") == "/ws/bye";
    while let Some(msg) = ws.next().await {
        match msg {
            // The reply to the client's close goes out on the next read, which then ends.
            Ok(Message::Close(_)) => {
                seen.closes.fetch_add(1, SeqCst);
            }
            Ok(m) if bye && (m.is_text() || m.is_binary()) => {
                let frame = CloseFrame {
                    code: CloseCode::Normal,
                    reason: "bye".into(),
                };
                let _ = ws.close(Some(frame)).await;
            }
            Ok(m) if m.is_text() || m.is_binary() => {
                if ws.send(m).await.is_err() {
                    break;
                }
            }
            Ok(_) => {}
            Err(_) => break,
        }
    }
    seen.ended.fetch_add(1, SeqCst);
}

/// Whether the request head waiting on `stream` (peeked, not read) asks for a WebSocket.
async fn asks_to_upgrade(stream: &TcpStream) -> bool {
    let mut buf = vec![0u8; 16 * 1024];
    let deadline = Instant::now() + PATIENCE;
    while Instant::now() < deadline {
        let Ok(n) = stream.peek(&mut buf).await else {
            return false;
        };
        if n == 0 {
            return false;
        }
        if let Some(end) = buf[..n].windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            return head.contains("\r\nupgrade: websocket");
        }
        if n == buf.len() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    false
}

fn ws_url(gw: &Gateway, path: &str) -> String {
    format!("ws://{}{path}", gw.addr)
}

/// A WebSocket through the gateway; panics (with the gateway's log) unless it switched.
async fn connect(gw: &Gateway, path: &str) -> (Client, http::Response<Option<Vec<u8>>>) {
    let (ws, res) =
        tokio::time::timeout(PATIENCE, tokio_tungstenite::connect_async(ws_url(gw, path)))
            .await
            .expect("handshake in time")
            .unwrap_or_else(|e| {
                panic!("handshake through the gateway: {e}; log:\n{}", gw.stderr())
            });
    assert_eq!(res.status(), 101);
    (ws, res)
}

/// The next message.
async fn next(ws: &mut Client) -> Message {
    tokio::time::timeout(PATIENCE, ws.next())
        .await
        .expect("a message in time")
        .expect("the connection is open")
        .expect("a message")
}

/// Send a message and read its echo.
async fn echo(ws: &mut Client, msg: Message) {
    ws.send(msg.clone()).await.expect("send");
    assert_eq!(next(ws).await, msg);
}

/// Read until the connection has closed (the close handshake, then the end of the stream).
async fn until_closed(ws: &mut Client) {
    loop {
        match tokio::time::timeout(PATIENCE, ws.next())
            .await
            .expect("the connection closes in time")
        {
            None | Some(Err(_)) => return,
            Some(Ok(_)) => continue,
        }
    }
}

/// Wait until `done` holds (the other side of a connection notices a close asynchronously).
async fn wait_for(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !done() {
        assert!(Instant::now() < deadline, "still waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

const GAUGE: &str = "fleet_limiter_upgraded_connections";
const SWITCHED: &str = "fleet_limiter_upgrades_total{result=\"switched\"}";
const DECLINED: &str = "fleet_limiter_upgrades_total{result=\"declined\"}";

#[tokio::test]
async fn messages_echo_both_ways_and_a_client_close_reaches_the_upstream() {
    let (up, seen) = echo_upstream().await;
    let gw = Gateway::serve().upstream(&up).admin().spawn();
    let (mut ws, res) = connect(&gw, "/ws/live?view=fleet").await;
    // The default calibration leaves /ws/** unmetered.
    assert!(res.headers().get("ratelimit-policy").is_none());
    gw.wait_metric(GAUGE, |v| v == 1.0).await;
    for i in 0..5u8 {
        echo(&mut ws, Message::text(format!("text {i} ✓"))).await;
        echo(&mut ws, Message::binary(vec![i; 100 + usize::from(i)])).await;
    }
    // Many at once, in order.
    for i in 0..20 {
        ws.send(Message::text(format!("burst {i}")))
            .await
            .expect("send");
    }
    for i in 0..20 {
        assert_eq!(next(&mut ws).await, Message::text(format!("burst {i}")));
    }
    let big: Vec<u8> = (0..1024 * 1024).map(|i| (i % 251) as u8).collect();
    ws.send(Message::binary(big.clone())).await.expect("send");
    assert_eq!(next(&mut ws).await.into_data().as_ref(), &big[..]);

    let handshakes = seen.handshakes.lock().expect("lock").clone();
    assert_eq!(handshakes.len(), 1);
    let (target, headers) = &handshakes[0];
    assert_eq!(target, "/ws/live?view=fleet");
    let header = |n: &str| {
        headers
            .iter()
            .find(|(k, _)| k == n)
            .map(|(_, v)| v.as_str())
    };
    assert!(header("sec-websocket-key").is_some(), "{headers:?}");
    assert_eq!(header("sec-websocket-version"), Some("13"));
    assert_eq!(header("x-forwarded-for"), Some("127.0.0.1"));
    assert_eq!(gw.metric(SWITCHED).await, Some(1.0));
    assert_eq!(
        gw.metric("fleet_limiter_requests_total{outcome=\"unmetered\"}")
            .await,
        Some(1.0)
    );

    ws.close(None).await.expect("close");
    until_closed(&mut ws).await;
    wait_for("the upstream to see the close", || {
        seen.ended.load(SeqCst) == 1
    })
    .await;
    assert_eq!(seen.closes.load(SeqCst), 1, "the client's close frame");
    gw.wait_metric(GAUGE, |v| v == 0.0).await;
}

#[tokio::test]
async fn an_upstream_close_reaches_the_client() {
    let (up, seen) = echo_upstream().await;
    let gw = Gateway::serve().upstream(&up).admin().spawn();
    let (mut ws, _) = connect(&gw, "/ws/bye").await;
    ws.send(Message::text("hello")).await.expect("send");
    match next(&mut ws).await {
        Message::Close(Some(frame)) => {
            assert_eq!(frame.code, CloseCode::Normal);
            assert_eq!(frame.reason.as_str(), "bye");
        }
        other => panic!("expected the upstream's close, got {other:?}"),
    }
    until_closed(&mut ws).await;
    wait_for("the upstream connection to end", || {
        seen.ended.load(SeqCst) == 1
    })
    .await;
    gw.wait_metric(GAUGE, |v| v == 0.0).await;
}

#[tokio::test]
async fn a_handshake_over_budget_gets_429_and_never_reaches_the_upstream() {
    let (up, seen) = echo_upstream().await;
    let gw = Gateway::serve()
        .upstream(&up)
        .admin()
        .config_toml(
            r#"
[limiters.live]
limit = 2
window = "1h"
key = "ip"
routes = ["/api/live/**"]
"#,
        )
        .spawn();
    for i in 0..2 {
        let (mut ws, res) = connect(&gw, "/api/live/feed").await;
        let policy = res
            .headers()
            .get("ratelimit-policy")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        assert!(policy.contains("\"live\""), "{policy:?}");
        echo(&mut ws, Message::text(format!("allowed {i}"))).await;
        ws.close(None).await.expect("close");
        until_closed(&mut ws).await;
    }
    let asked = Instant::now();
    let refused = tokio::time::timeout(
        PATIENCE,
        tokio_tungstenite::connect_async(ws_url(&gw, "/api/live/feed")),
    )
    .await
    .expect("an answer in time");
    // At once: a refused request's body is drained for up to 1 s so its connection can be
    // reused, but a handshake has no body to wait for and its connection is not reused.
    let waited = asked.elapsed();
    assert!(waited < Duration::from_secs(1), "the 429 took {waited:?}");
    match refused {
        Err(WsError::Http(res)) => {
            assert_eq!(res.status(), 429);
            assert!(res.headers().contains_key("retry-after"));
            // Nothing after a refused handshake is HTTP: its connection closes.
            assert_eq!(
                res.headers()
                    .get("connection")
                    .and_then(|v| v.to_str().ok()),
                Some("close")
            );
        }
        Err(e) => panic!("expected a 429, got {e}"),
        Ok(_) => panic!("the third handshake switched protocols"),
    }
    assert_eq!(
        seen.handshakes(),
        2,
        "the refused handshake reached the upstream"
    );
    assert_eq!(gw.metric(SWITCHED).await, Some(2.0));
    assert_eq!(
        gw.metric("fleet_limiter_decisions_total{limiter=\"live\",outcome=\"refused\"}")
            .await,
        Some(1.0)
    );
}

#[tokio::test]
async fn a_declined_handshake_is_passed_through_as_a_response() {
    let (up, seen) = echo_upstream().await;
    let gw = Gateway::serve().upstream(&up).admin().spawn();
    let addr = gw.addr;
    let request = format!(
        "GET /ws/decline HTTP/1.1\r\nHost: {addr}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    );
    // Read to the end: the gateway closes the connection after the answer.
    let res = tokio::task::spawn_blocking(move || common::raw_request(addr, request.as_bytes()))
        .await
        .expect("raw request");
    assert_eq!(res.status, 403, "{res:?}");
    assert_eq!(res.body, b"no live view here");
    assert_eq!(res.header("x-upstream"), Some("declined"));
    assert_eq!(res.header("connection"), Some("close"));
    assert_eq!(seen.handshakes(), 1);
    assert_eq!(gw.metric(DECLINED).await, Some(1.0));
    assert_eq!(gw.metric(SWITCHED).await, Some(0.0));
    assert_eq!(gw.metric(GAUGE).await, Some(0.0));
}

#[tokio::test]
async fn an_idle_websocket_outlives_the_read_and_body_timeouts() {
    let (up, _seen) = echo_upstream().await;
    let gw = Gateway::serve()
        .upstream(&up)
        .args(["--read-timeout", "1s", "--body-timeout", "1s"])
        .spawn();
    let (mut ws, _) = connect(&gw, "/ws/live").await;
    echo(&mut ws, Message::text("before")).await;
    // Longer than both timeouts, and than the body rate's 5 s grace period.
    tokio::time::sleep(Duration::from_secs(6)).await;
    echo(&mut ws, Message::text("after")).await;
    ws.close(None).await.expect("close");
    until_closed(&mut ws).await;
}

#[tokio::test]
async fn sigterm_closes_open_websockets_after_the_grace_period_and_exits_0() {
    let (up, seen) = echo_upstream().await;
    let mut gw = Gateway::serve()
        .upstream(&up)
        .args(["--shutdown-grace", "2s"])
        .admin()
        .spawn();
    let (mut ws, _) = connect(&gw, "/ws/live").await;
    echo(&mut ws, Message::text("before")).await;
    gw.wait_metric(GAUGE, |v| v == 1.0).await;
    let signalled = Instant::now();
    gw.signal("TERM");
    // In the grace period the connection still carries messages.
    echo(&mut ws, Message::text("during the grace period")).await;
    until_closed(&mut ws).await;
    let status = gw.wait_exit().await;
    let took = signalled.elapsed();
    assert!(status.success(), "{status}; log:\n{}", gw.stderr());
    assert!(
        took < Duration::from_secs(2 + 8),
        "exited {took:?} after SIGTERM with a 2 s grace period"
    );
    wait_for("the upstream connection to end", || {
        seen.ended.load(SeqCst) == 1
    })
    .await;
}

/// An upstream that switches protocols on every handshake and then neither reads, writes nor
/// closes: a peer that ignores the close. Says how many handshakes it switched.
async fn deaf_upstream() -> (String, Arc<AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local addr");
    let switched = Arc::new(AtomicUsize::new(0));
    let s = switched.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((mut stream, _)) = listener.accept().await {
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                if stream.read_exact(&mut byte).await.is_err() {
                    break;
                }
                head.push(byte[0]);
            }
            let _ = stream
                .write_all(
                    b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n",
                )
                .await;
            s.fetch_add(1, SeqCst);
            held.push(stream);
        }
    });
    (format!("http://{addr}"), switched)
}

#[tokio::test]
async fn a_client_that_leaves_frees_its_connection_even_when_the_upstream_never_closes() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (up, switched) = deaf_upstream().await;
    let gw = Gateway::serve()
        .upstream(&up)
        .args(["--read-timeout", "1s"])
        .admin()
        .spawn();
    let mut client = TcpStream::connect(gw.addr).await.expect("connect");
    let handshake = format!(
        "GET /ws/live HTTP/1.1\r\nHost: {}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
        gw.addr
    );
    client
        .write_all(handshake.as_bytes())
        .await
        .expect("handshake");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        tokio::time::timeout(PATIENCE, client.read_exact(&mut byte))
            .await
            .expect("an answer in time")
            .expect("the answer's head");
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert_eq!(switched.load(SeqCst), 1);
    gw.wait_metric(GAUGE, |v| v == 1.0).await;
    // The client goes away; the upstream keeps its side open and says nothing.
    drop(client);
    gw.wait_metric(GAUGE, |v| v == 0.0).await;
}

/// A WebSocket through the gateway from the local address `from` (any of 127.0.0.0/8 on
/// Linux), with `headers` added to the handshake: the switched connection, or the error (a
/// refusal is `WsError::Http` with the answer).
async fn connect_from(
    gw: &Gateway,
    path: &str,
    from: std::net::IpAddr,
    headers: &[(&str, &str)],
) -> Result<Client, WsError> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind((from, 0).into())
        .expect("bind the client address");
    let stream = tokio::time::timeout(PATIENCE, socket.connect(gw.addr))
        .await
        .expect("connect in time")
        .expect("connect");
    let mut req = ws_url(gw, path).into_client_request().expect("request");
    for (name, value) in headers {
        req.headers_mut().insert(
            http::HeaderName::from_bytes(name.as_bytes()).expect("name"),
            http::HeaderValue::from_str(value).expect("value"),
        );
    }
    let handshake = tokio_tungstenite::client_async(req, MaybeTlsStream::Plain(stream));
    tokio::time::timeout(PATIENCE, handshake)
        .await
        .expect("an answer in time")
        .map(|(ws, res)| {
            assert_eq!(res.status(), 101);
            ws
        })
}

fn addr(s: &str) -> std::net::IpAddr {
    s.parse().expect("an address")
}

/// A refused handshake's answer: its status, `Retry-After`, `Connection: close`, and the
/// problem type.
fn refusal(e: WsError) -> (u16, String) {
    let WsError::Http(res) = e else {
        panic!("expected an HTTP refusal, got {e}");
    };
    let header = |n: &str| {
        res.headers()
            .get(n)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    assert_eq!(header("retry-after").as_deref(), Some("5"));
    assert_eq!(header("connection").as_deref(), Some("close"));
    assert_eq!(
        header("content-type").as_deref(),
        Some("application/problem+json")
    );
    let body: serde_json::Value =
        serde_json::from_slice(res.body().as_deref().unwrap_or_default()).expect("problem+json");
    assert_eq!(body["status"], res.status().as_u16());
    assert_eq!(body["retry_after"], 5);
    (
        res.status().as_u16(),
        body["type"].as_str().unwrap_or_default().to_owned(),
    )
}

const REFUSED_PER_CLIENT: &str = "fleet_limiter_upgrades_refused_total{reason=\"max_per_client\"}";
const REFUSED_MAX_OPEN: &str = "fleet_limiter_upgrades_refused_total{reason=\"max_open\"}";
const CLIENT_WEBSOCKETS: &str = "urn:fleet-limiter:problem:client-websockets";
const WEBSOCKETS_FULL: &str = "urn:fleet-limiter:problem:websockets-full";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_cannot_hold_every_websocket_on_a_stock_descriptor_limit() {
    if !common::prlimit() {
        return;
    }
    let (up, seen) = echo_upstream().await;
    // A stock machine: a soft limit of 256 the gateway may raise to 512.
    let gw = Gateway::serve()
        .upstream(&up)
        .nofile(256, 512)
        .log("info")
        .admin()
        .spawn();
    let log = gw.stderr();
    let caps = log
        .lines()
        .find(|l| l.contains("WebSocket caps"))
        .unwrap_or_else(|| panic!("no line saying the caps chosen:\n{log}"));
    for field in [
        "descriptors=512",
        "descriptors_at_start=256",
        "max_open=64",
        "max_open_from=derived",
        "max_per_client=8",
    ] {
        assert!(caps.contains(field), "{field} in {caps}");
    }
    assert_eq!(
        gw.metric("fleet_limiter_upgraded_connections_max").await,
        Some(64.0)
    );
    let (a, b) = (addr("127.0.0.2"), addr("127.0.0.3"));
    let mut held = Vec::new();
    let mut refused = Vec::new();
    for _ in 0..20 {
        match connect_from(&gw, "/ws/live", a, &[]).await {
            Ok(ws) => held.push(ws),
            Err(e) => refused.push(refusal(e)),
        }
    }
    assert_eq!(held.len(), 8, "one address holds websocket.max_per_client");
    assert_eq!(refused.len(), 12);
    assert!(
        refused
            .iter()
            .all(|(s, t)| *s == 429 && t == CLIENT_WEBSOCKETS),
        "{refused:?}"
    );
    assert_eq!(
        seen.handshakes(),
        8,
        "a refused handshake reached the upstream"
    );
    // Another client is served: a WebSocket and a plain request.
    let mut other = connect_from(&gw, "/ws/live", b, &[])
        .await
        .expect("another address has its own share");
    echo(&mut other, Message::text("still here")).await;
    let res = reqwest::Client::builder()
        .no_proxy()
        .local_address(b)
        .build()
        .expect("client")
        .get(gw.url("/api/anything"))
        .send()
        .await
        .expect("an answer");
    assert_eq!(res.status(), 200);
    assert_eq!(res.text().await.expect("body"), "ok");
    assert_eq!(gw.metric(REFUSED_PER_CLIENT).await, Some(12.0));
    assert_eq!(gw.metric(REFUSED_MAX_OPEN).await, Some(0.0));
    gw.wait_metric(GAUGE, |v| v == 9.0).await;
    // A closed WebSocket gives its place back to its client.
    let mut first = held.remove(0);
    first.close(None).await.expect("close");
    until_closed(&mut first).await;
    gw.wait_metric(GAUGE, |v| v == 8.0).await;
    let again = connect_from(&gw, "/ws/live", a, &[]).await;
    assert!(again.is_ok(), "the place came back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_cap_in_all_a_handshake_gets_503_before_the_upstream_is_asked() {
    let (up, seen) = echo_upstream().await;
    let gw = Gateway::serve()
        .upstream(&up)
        .args([
            "--websocket-max-open",
            "3",
            "--websocket-max-per-client",
            "2",
        ])
        .admin()
        .spawn();
    let (a, b, c) = (addr("127.0.0.2"), addr("127.0.0.3"), addr("127.0.0.4"));
    let mut a1 = connect_from(&gw, "/ws/live", a, &[])
        .await
        .expect("a's first");
    let _a2 = connect_from(&gw, "/ws/live", a, &[])
        .await
        .expect("a's second");
    let over = connect_from(&gw, "/ws/live", a, &[]).await;
    assert_eq!(
        refusal(over.expect_err("a holds its two")),
        (429, CLIENT_WEBSOCKETS.to_owned())
    );
    let _b1 = connect_from(&gw, "/ws/live", b, &[])
        .await
        .expect("b's first");
    for from in [b, c] {
        let full = connect_from(&gw, "/ws/live", from, &[]).await;
        assert_eq!(
            refusal(full.expect_err("three are open")),
            (503, WEBSOCKETS_FULL.to_owned())
        );
    }
    assert_eq!(seen.handshakes(), 3);
    assert_eq!(gw.metric(REFUSED_MAX_OPEN).await, Some(2.0));
    assert_eq!(gw.metric(REFUSED_PER_CLIENT).await, Some(1.0));
    a1.close(None).await.expect("close");
    until_closed(&mut a1).await;
    gw.wait_metric(GAUGE, |v| v == 2.0).await;
    let mut c1 = connect_from(&gw, "/ws/live", c, &[])
        .await
        .expect("a place came free");
    echo(&mut c1, Message::text("in")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_trusted_proxy_the_client_is_the_forwarded_address_and_a_v6_56_is_one_client() {
    let (up, _seen) = echo_upstream().await;
    let gw = Gateway::serve()
        .upstream(&up)
        .args([
            "--trust-proxy",
            "127.0.0.1",
            "--websocket-max-open",
            "50",
            "--websocket-max-per-client",
            "1",
        ])
        .admin()
        .spawn();
    let proxy = addr("127.0.0.1");
    let xff = |v: &'static str| [("x-forwarded-for", v)];
    let _one = connect_from(&gw, "/ws/live", proxy, &xff("2001:db8:0:ab01::1"))
        .await
        .expect("the first client behind the proxy");
    // Another host in the same /56 is the same client.
    let same = connect_from(&gw, "/ws/live", proxy, &xff("2001:db8:0:ab99::7")).await;
    assert_eq!(refusal(same.expect_err("same /56")).0, 429);
    // The IPv4-mapped spelling of an IPv4 client is that client.
    let _v4 = connect_from(&gw, "/ws/live", proxy, &xff("198.51.100.7"))
        .await
        .expect("an IPv4 client");
    let mapped = connect_from(&gw, "/ws/live", proxy, &xff("::ffff:198.51.100.7")).await;
    assert_eq!(refusal(mapped.expect_err("the same IPv4 client")).0, 429);
    // The next /56, and the proxy's own address, are other clients.
    let _next = connect_from(&gw, "/ws/live", proxy, &xff("2001:db8:0:ac00::1"))
        .await
        .expect("another /56");
    let _direct = connect_from(&gw, "/ws/live", proxy, &[])
        .await
        .expect("the proxy itself, with no forwarding header");
    // A peer that is not a trusted proxy is keyed on its own address, whatever it forwards:
    // rotating the header mints no new share.
    let untrusted = addr("127.0.0.9");
    let _u = connect_from(&gw, "/ws/live", untrusted, &xff("203.0.113.1"))
        .await
        .expect("the untrusted peer's one");
    for forged in ["203.0.113.2", "2001:db8:ffff::1", "garbage"] {
        let again = connect_from(&gw, "/ws/live", untrusted, &xff(forged)).await;
        assert_eq!(
            refusal(again.expect_err("still the peer")).0,
            429,
            "{forged}"
        );
    }
    assert_eq!(gw.metric(REFUSED_PER_CLIENT).await, Some(5.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_websocket_is_closed_on_both_sides_and_a_busy_one_is_not() {
    let (up, seen) = echo_upstream().await;
    let gw = Gateway::serve()
        .upstream(&up)
        .args(["--websocket-idle-timeout", "2s"])
        .admin()
        .spawn();
    // Busy for two and a half idle timeouts, a message every 100 ms: never closed.
    let (mut busy, _) = connect(&gw, "/ws/live").await;
    let started = Instant::now();
    let mut n = 0u32;
    while started.elapsed() < Duration::from_secs(5) {
        echo(&mut busy, Message::text(format!("tick {n}"))).await;
        n += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    busy.close(None).await.expect("close");
    until_closed(&mut busy).await;
    wait_for("the busy connection to end", || {
        seen.ended.load(SeqCst) == 1
    })
    .await;
    assert_eq!(
        gw.metric("fleet_limiter_upgraded_idle_closes_total").await,
        Some(0.0)
    );
    // Silent both ways: the gateway closes it, the client's side and the upstream's.
    let (mut idle, _) = connect(&gw, "/ws/live").await;
    echo(&mut idle, Message::text("once")).await;
    until_closed(&mut idle).await;
    wait_for("the upstream to see the idle connection end", || {
        seen.ended.load(SeqCst) == 2
    })
    .await;
    assert_eq!(
        seen.closes.load(SeqCst),
        1,
        "only the busy one sent a close frame"
    );
    gw.wait_metric("fleet_limiter_upgraded_idle_closes_total", |v| v == 1.0)
        .await;
    gw.wait_metric(GAUGE, |v| v == 0.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_clients_filling_every_place_leave_descriptors_for_other_requests() {
    if !common::prlimit() {
        return;
    }
    let (up, seen) = echo_upstream().await;
    // 256 descriptors and no way to raise them: 32 WebSockets, 4 per client.
    let gw = Gateway::serve()
        .upstream(&up)
        .nofile(256, 256)
        .admin()
        .spawn();
    let mut held = Vec::new();
    let mut refused = Vec::new();
    for n in 10..30u8 {
        for _ in 0..4 {
            match connect_from(&gw, "/ws/live", std::net::IpAddr::from([127, 0, 0, n]), &[]).await {
                Ok(ws) => held.push(ws),
                Err(e) => refused.push(refusal(e)),
            }
        }
    }
    assert_eq!(held.len(), 32);
    assert!(
        refused
            .iter()
            .all(|(s, t)| *s == 503 && t == WEBSOCKETS_FULL),
        "{refused:?}"
    );
    assert_eq!(refused.len(), 48);
    assert_eq!(seen.handshakes(), 32);
    // Fifty requests at once from someone else: every one answered by the upstream.
    let http = reqwest::Client::builder()
        .no_proxy()
        .local_address(addr("127.0.0.99"))
        .pool_max_idle_per_host(0)
        .timeout(PATIENCE)
        .build()
        .expect("client");
    let answers = futures_util::future::join_all(
        (0..50).map(|i| http.get(gw.url(&format!("/api/items/{i}"))).send()),
    )
    .await;
    for a in answers {
        let res = a.expect("an answer");
        assert_eq!(res.status(), 200, "{}", gw.stderr());
    }
    assert!(
        !gw.stderr().contains("Too many open files"),
        "{}",
        gw.stderr()
    );
    for ws in &mut held {
        echo(ws, Message::text("all still open")).await;
    }
}
