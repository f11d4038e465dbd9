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
/// (code 1000, reason `bye`) when the first message arrives.
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
async fn serve(stream: TcpStream, seen: Arc<Seen>) {
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
