//! A request body that trickles, stalls or is abandoned must not hold a connection and an
//! upstream request open: the real binary over real sockets, with a client that writes its body
//! by hand at a chosen pace and an upstream of plain sockets that reports how each request it
//! got ended (read in full, or cut off by the gateway).

mod common;

use common::{Gateway, Launch, PATIENCE};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

const RATE_TRIPS: &str = r#"fleet_limiter_client_body_timeouts_total{rule="rate"}"#;
const SILENCE_TRIPS: &str = r#"fleet_limiter_client_body_timeouts_total{rule="silence"}"#;
const UNREACHABLE: &str = r#"fleet_limiter_upstream_errors_total{kind="unreachable"}"#;
const UPSTREAM_TIMEOUTS: &str = r#"fleet_limiter_upstream_errors_total{kind="timeout"}"#;

/// How one request ended at the upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    path: String,
    /// Body bytes read.
    read: u64,
    /// The whole declared body arrived (and was answered); `false`: the gateway closed the
    /// connection before the body's end.
    complete: bool,
}

/// An upstream on plain sockets. Every request must have a `Content-Length`; it reads the body
/// and answers `200` with the number of bytes read, or, for `/early`, answers `200` with the
/// first part of a 1000-byte body at once and then reads. It reports each request's end.
fn spawn_upstream() -> (String, mpsc::UnboundedReceiver<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind upstream");
    let addr = listener.local_addr().expect("addr");
    let (tx, rx) = mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let tx = tx.clone();
            std::thread::spawn(move || {
                while let Some(seen) = serve_one(&conn) {
                    let complete = seen.complete;
                    let _ = tx.send(seen);
                    if !complete {
                        return;
                    }
                }
            });
        }
    });
    (format!("http://{addr}"), rx)
}

/// One request on a kept-alive connection; `None` when the connection ended between requests.
fn serve_one(conn: &TcpStream) -> Option<Seen> {
    let mut r = BufReader::new(conn.try_clone().ok()?);
    let mut out = conn.try_clone().ok()?;
    let mut path = String::new();
    let mut len = 0u64;
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).ok()? == 0 {
            return None;
        }
        if line == "\r\n" {
            break;
        }
        if path.is_empty() {
            path = line.split_whitespace().nth(1).unwrap_or("/").to_owned();
        } else if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            len = v.trim().parse().unwrap_or(0);
        }
    }
    let early = path == "/early";
    if early {
        out.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\nfirst part")
            .ok()?;
    }
    let mut read = 0u64;
    let mut buf = [0u8; 4096];
    while read < len {
        let want = (len - read).min(buf.len() as u64) as usize;
        match r.read(&mut buf[..want]) {
            Ok(0) | Err(_) => {
                return Some(Seen {
                    path,
                    read,
                    complete: false,
                })
            }
            Ok(n) => read += n as u64,
        }
    }
    if !early {
        let body = read.to_string();
        let _ = write!(
            out,
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
    }
    Some(Seen {
        path,
        read,
        complete: true,
    })
}

/// The next request end the upstream reports.
async fn next_seen(rx: &mut mpsc::UnboundedReceiver<Seen>) -> Seen {
    tokio::time::timeout(PATIENCE, rx.recv())
        .await
        .expect("the upstream saw the request end")
        .expect("upstream running")
}

/// What a hand-paced client got back.
#[derive(Debug)]
struct Answer {
    /// Everything read until the gateway closed the connection.
    bytes: Vec<u8>,
    /// The connection ended (end of stream or reset) rather than the client giving up.
    closed: bool,
    /// From the end of the request head to the end of the connection.
    elapsed: Duration,
}

impl Answer {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }

    fn status(&self) -> u16 {
        self.text()
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no status line in {:?}", self.text()))
    }

    fn header(&self, name: &str) -> Option<String> {
        let text = self.text();
        let head = text.split("\r\n\r\n").next().unwrap_or_default().to_owned();
        head.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_owned())
        })
    }

    fn body(&self) -> String {
        let text = self.text();
        text.split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default()
    }
}

/// How the client writes its body after the head.
#[derive(Debug, Clone, Copy)]
struct Pace {
    /// Bytes per write.
    chunk: usize,
    /// The pause before each write.
    gap: Duration,
    /// Writes before the client stops writing.
    writes: usize,
    /// After the last write: keep the connection open and read (`false`), or close it.
    hang_up: bool,
}

/// `POST path` with `Content-Length: declared`, its body written at `pace` on one thread while
/// this one reads whatever comes back until the gateway closes the connection (or `PATIENCE`).
fn paced_post(addr: SocketAddr, path: &str, declared: u64, pace: Pace) -> Answer {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(PATIENCE)).expect("read timeout");
    let head = format!("POST {path} HTTP/1.1\r\nHost: test\r\nContent-Length: {declared}\r\n\r\n");
    s.write_all(head.as_bytes()).expect("write head");
    let start = Instant::now();
    let mut w = s.try_clone().expect("clone");
    let writer = std::thread::spawn(move || {
        for _ in 0..pace.writes {
            std::thread::sleep(pace.gap);
            if w.write_all(&vec![b'x'; pace.chunk]).is_err() {
                return;
            }
        }
        if pace.hang_up {
            // Long enough for the gateway to have forwarded the head and what came of the body.
            std::thread::sleep(Duration::from_millis(500));
            let _ = w.shutdown(std::net::Shutdown::Both);
        }
    });
    if pace.hang_up {
        let _ = writer.join();
        return Answer {
            bytes: Vec::new(),
            closed: true,
            elapsed: start.elapsed(),
        };
    }
    let mut bytes = Vec::new();
    let mut buf = [0u8; 4096];
    let closed = loop {
        match s.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => bytes.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break true,
            Err(_) => break false,
        }
    };
    let elapsed = start.elapsed();
    drop(s);
    let _ = writer.join();
    Answer {
        bytes,
        closed,
        elapsed,
    }
}

async fn post(gw: &Gateway, path: &str, declared: u64, pace: Pace) -> Answer {
    let (addr, path) = (gw.addr, path.to_owned());
    tokio::task::spawn_blocking(move || paced_post(addr, &path, declared, pace))
        .await
        .expect("client thread")
}

/// The gateway in front of `upstream`, with its admin listener and these settings.
fn gateway(upstream: &str, env: &[(&str, &str)]) -> Gateway {
    Launch::serve()
        .upstream(upstream)
        .admin()
        .log("info")
        .envs(env.iter().copied())
        .spawn()
}

async fn metric(gw: &Gateway, sample: &str) -> f64 {
    gw.metric(sample)
        .await
        .unwrap_or_else(|| panic!("{sample} is on /metrics"))
}

#[tokio::test]
async fn a_trickling_body_gets_a_408_and_its_upstream_request_is_cut_off() {
    let (upstream, mut seen) = spawn_upstream();
    // The silence rule alone would let one byte every 2 s through; the rate rule (240 bytes
    // per second after 5 s of waiting) does not.
    let gw = gateway(
        &upstream,
        &[
            ("FLEET_LIMITER_BODY_TIMEOUT", "10s"),
            ("FLEET_LIMITER_BODY_MIN_RATE", "240"),
            ("FLEET_LIMITER_READ_TIMEOUT", "60s"),
        ],
    );
    assert_eq!(metric(&gw, RATE_TRIPS).await, 0.0, "listed before any trip");
    assert_eq!(metric(&gw, SILENCE_TRIPS).await, 0.0);
    let pace = Pace {
        chunk: 1,
        gap: Duration::from_secs(2),
        writes: 100,
        hang_up: false,
    };
    let answer = post(&gw, "/upload", 100, pace).await;
    assert!(
        answer.closed,
        "the gateway closed the connection: {answer:?}"
    );
    assert_eq!(answer.status(), 408, "{}", answer.text());
    assert_eq!(
        answer.header("content-type").as_deref(),
        Some("application/problem+json")
    );
    assert_eq!(answer.header("connection").as_deref(), Some("close"));
    let problem: serde_json::Value = serde_json::from_str(&answer.body()).expect("problem json");
    assert_eq!(problem["type"], "urn:fleet-limiter:problem:request-timeout");
    assert_eq!(problem["status"], 408);
    // 100 bytes at this pace take 200 s; the rule trips a few seconds after the grace period.
    assert!(
        answer.elapsed < Duration::from_secs(60),
        "the 408 came after {:?}",
        answer.elapsed
    );

    let up = next_seen(&mut seen).await;
    assert_eq!(up.path, "/upload");
    assert!(!up.complete, "the upstream request was cut off: {up:?}");
    assert!(up.read < 100, "{up:?}");

    assert_eq!(metric(&gw, RATE_TRIPS).await, 1.0);
    assert_eq!(metric(&gw, SILENCE_TRIPS).await, 0.0);
    assert_eq!(
        metric(&gw, UNREACHABLE).await,
        0.0,
        "not an upstream failure"
    );
    assert_eq!(metric(&gw, UPSTREAM_TIMEOUTS).await, 0.0);
    let log = gw.stderr();
    let line = log
        .lines()
        .find(|l| l.contains("request body too slow"))
        .unwrap_or_else(|| panic!("a warning in the log:\n{log}"));
    assert!(line.contains("WARN"), "{line}");
    assert!(line.contains(r#"rule="rate""#), "{line}");
    assert!(line.contains("peer=127.0.0.1"), "{line}");
    assert!(!line.contains("/upload"), "no request target in it: {line}");
}

#[tokio::test]
async fn a_body_that_stops_mid_way_gets_a_408_after_the_body_timeout() {
    let (upstream, mut seen) = spawn_upstream();
    let gw = gateway(
        &upstream,
        &[
            ("FLEET_LIMITER_BODY_TIMEOUT", "2s"),
            ("FLEET_LIMITER_BODY_MIN_RATE", "0"),
            ("FLEET_LIMITER_READ_TIMEOUT", "60s"),
        ],
    );
    // Half the body at once, then nothing, with the connection left open.
    let pace = Pace {
        chunk: 500,
        gap: Duration::ZERO,
        writes: 1,
        hang_up: false,
    };
    let answer = post(&gw, "/upload", 1000, pace).await;
    assert!(answer.closed, "{answer:?}");
    assert_eq!(answer.status(), 408, "{}", answer.text());
    assert_eq!(answer.header("connection").as_deref(), Some("close"));
    // Before this rule, only the 60 s read timeout ended it (as a 504).
    assert!(
        answer.elapsed < Duration::from_secs(30),
        "the 408 came after {:?}",
        answer.elapsed
    );
    let up = next_seen(&mut seen).await;
    assert_eq!((up.read, up.complete), (500, false), "{up:?}");
    assert_eq!(metric(&gw, SILENCE_TRIPS).await, 1.0);
    assert_eq!(metric(&gw, RATE_TRIPS).await, 0.0);
    assert_eq!(metric(&gw, UPSTREAM_TIMEOUTS).await, 0.0);
}

#[tokio::test]
async fn a_slow_but_steady_body_above_the_minimum_rate_passes_in_full() {
    let (upstream, mut seen) = spawn_upstream();
    let gw = gateway(
        &upstream,
        &[
            ("FLEET_LIMITER_BODY_TIMEOUT", "2s"),
            ("FLEET_LIMITER_BODY_MIN_RATE", "1KiB"),
        ],
    );
    // 512 bytes every 250 ms, about 2 KiB/s, for 7 s: past the grace period, under both rules.
    let pace = Pace {
        chunk: 512,
        gap: Duration::from_millis(250),
        writes: 28,
        hang_up: false,
    };
    let declared = 28 * 512;
    let answer = tokio::task::spawn_blocking({
        let addr = gw.addr;
        move || paced_post_keep_alive(addr, declared, pace)
    })
    .await
    .expect("client thread");
    assert_eq!(answer.status(), 200, "{}", answer.text());
    assert_eq!(
        answer.body(),
        declared.to_string(),
        "the upstream read it all"
    );
    let up = next_seen(&mut seen).await;
    assert_eq!((up.read, up.complete), (declared, true));
    assert_eq!(metric(&gw, RATE_TRIPS).await, 0.0);
    assert_eq!(metric(&gw, SILENCE_TRIPS).await, 0.0);
}

/// [`paced_post`] for a request that is answered on a kept-alive connection: reads one
/// response with a `Content-Length` instead of waiting for the connection to close.
fn paced_post_keep_alive(addr: SocketAddr, declared: u64, pace: Pace) -> Answer {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(PATIENCE)).expect("read timeout");
    let head = format!("POST /upload HTTP/1.1\r\nHost: test\r\nContent-Length: {declared}\r\n\r\n");
    s.write_all(head.as_bytes()).expect("write head");
    let start = Instant::now();
    for _ in 0..pace.writes {
        std::thread::sleep(pace.gap);
        s.write_all(&vec![b'y'; pace.chunk]).expect("write body");
    }
    let mut r = BufReader::new(s);
    let mut bytes = Vec::new();
    let mut len = 0usize;
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).expect("response head") == 0 {
            break;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            len = v.trim().parse().expect("length");
        }
        bytes.extend_from_slice(line.as_bytes());
        if line == "\r\n" {
            let mut body = vec![0u8; len];
            r.read_exact(&mut body).expect("response body");
            bytes.extend_from_slice(&body);
            break;
        }
    }
    Answer {
        bytes,
        closed: false,
        elapsed: start.elapsed(),
    }
}

#[tokio::test]
async fn a_client_that_hangs_up_mid_body_is_not_an_upstream_failure() {
    let (upstream, mut seen) = spawn_upstream();
    let gw = gateway(
        &upstream,
        &[("FLEET_LIMITER_LOG", "info,fleet_limiter::http::proxy=debug")],
    );
    let pace = Pace {
        chunk: 10,
        gap: Duration::ZERO,
        writes: 1,
        hang_up: true,
    };
    post(&gw, "/upload", 1000, pace).await;
    let up = next_seen(&mut seen).await;
    assert_eq!((up.read, up.complete), (10, false), "{up:?}");
    // Counters are taken when the gateway logs how the request ended.
    let deadline = Instant::now() + PATIENCE;
    while !["request body failed", "upstream request failed"]
        .iter()
        .any(|l| gw.stderr().contains(l))
    {
        assert!(Instant::now() < deadline, "log:\n{}", gw.stderr());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(metric(&gw, UNREACHABLE).await, 0.0, "log:\n{}", gw.stderr());
    assert_eq!(metric(&gw, UPSTREAM_TIMEOUTS).await, 0.0);
    assert_eq!(metric(&gw, RATE_TRIPS).await, 0.0);
    assert_eq!(metric(&gw, SILENCE_TRIPS).await, 0.0);
    assert!(
        !gw.stderr().contains("upstream request failed"),
        "log:\n{}",
        gw.stderr()
    );
}

#[tokio::test]
async fn a_body_that_trickles_after_the_upstream_answered_ends_the_answer() {
    let (upstream, mut seen) = spawn_upstream();
    let gw = gateway(
        &upstream,
        &[
            ("FLEET_LIMITER_BODY_TIMEOUT", "2s"),
            ("FLEET_LIMITER_BODY_MIN_RATE", "0"),
            ("FLEET_LIMITER_READ_TIMEOUT", "60s"),
        ],
    );
    let pace = Pace {
        chunk: 10,
        gap: Duration::ZERO,
        writes: 1,
        hang_up: false,
    };
    let answer = post(&gw, "/early", 1000, pace).await;
    assert!(answer.closed, "{answer:?}");
    assert_eq!(answer.status(), 200, "the head was already on its way");
    assert!(
        answer.body().len() < 1000,
        "the answer was cut off: {answer:?}"
    );
    let up = next_seen(&mut seen).await;
    assert_eq!((up.path.as_str(), up.complete), ("/early", false), "{up:?}");
    assert_eq!(metric(&gw, SILENCE_TRIPS).await, 1.0);
    assert_eq!(metric(&gw, UNREACHABLE).await, 0.0);
}

#[tokio::test]
async fn waiting_on_the_client_is_never_an_upstream_timeout() {
    let (upstream, mut seen) = spawn_upstream();
    // Each pause of the client is longer than the read timeout, and within the body rules.
    let gw = gateway(
        &upstream,
        &[
            ("FLEET_LIMITER_READ_TIMEOUT", "1s"),
            ("FLEET_LIMITER_BODY_TIMEOUT", "10s"),
            ("FLEET_LIMITER_BODY_MIN_RATE", "off"),
        ],
    );
    let pace = Pace {
        chunk: 1,
        gap: Duration::from_millis(1500),
        writes: 4,
        hang_up: false,
    };
    let answer = tokio::task::spawn_blocking({
        let addr = gw.addr;
        move || paced_post_keep_alive(addr, 4, pace)
    })
    .await
    .expect("client thread");
    assert_eq!(answer.status(), 200, "{}", answer.text());
    assert_eq!(answer.body(), "4");
    assert_eq!(next_seen(&mut seen).await.read, 4);
    assert_eq!(metric(&gw, UPSTREAM_TIMEOUTS).await, 0.0);
}
