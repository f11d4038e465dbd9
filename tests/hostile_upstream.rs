//! An upstream that misframes its answers on purpose, against the real binary: what it sends
//! past the end of one answer never becomes another client's answer, an answer whose framing is
//! ambiguous or broken is a 502 (never a cut body, a header made by a bare LF, or a connection
//! closed without a status line).
//!
//! The upstream is plain sockets, one thread a connection, serving requests one after another
//! on a kept-alive connection as a buggy server would: `/attack/<kind>` misframes (a body
//! longer than its `Content-Length`, a body after a HEAD, 204 or 304, a late write after a
//! well-framed answer, an answer to a request whose body it never read), and after it the
//! bytes of a second answer (`X-Injected: 1`, body `injected`); `/victim/<n>` answers
//! `victim-<n>`; `/frame/<kind>` answers one malformed answer.

mod common;

use common::{parse_raw, Gateway, RawResponse};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The answer a misframing upstream sends after the one it meant.
const INJECTED: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\nX-Injected: 1\r\n\r\ninjected";

/// How late a "late write" comes after its answer.
const LATE: Duration = Duration::from_millis(10);
/// Late writes the upstream has made: the test waits for the late bytes to be written (then
/// they are in the gateway's socket, loopback), not for a time a loaded machine can outrun.
static LATE_WRITTEN: AtomicUsize = AtomicUsize::new(0);

/// How long after a HEAD's, 204's or 304's head the body it should not have comes.
const BODY_AFTER_HEAD: Duration = Duration::from_millis(5);

/// The kinds of misframed answer, each followed by [`INJECTED`].
const ATTACKS: [&str; 7] = [
    "short-length",
    "multibyte-length",
    "head-body",
    "no-content-body",
    "not-modified-body",
    "late-write",
    "unread-body",
];

/// One request off the wire: method, target, and the body its `Content-Length` frames (none
/// is read for `/attack/unread-body`: the upstream answers without reading it, and reads it as
/// the next request).
fn read_request(r: &mut BufReader<TcpStream>) -> Option<(String, String)> {
    let mut first = String::new();
    loop {
        first.clear();
        if r.read_line(&mut first).ok()? == 0 {
            return None;
        }
        if !first.trim().is_empty() {
            break;
        }
    }
    let mut parts = first.split_whitespace();
    let method = parts.next()?.to_owned();
    let target = parts.next()?.to_owned();
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).ok()? == 0 {
            return None;
        }
        if line == "\r\n" || line == "\n" {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                length = v.trim().parse().unwrap_or(0);
            }
        }
    }
    if length > 0 && target != "/attack/unread-body" {
        let mut body = vec![0; length];
        r.read_exact(&mut body).ok()?;
    }
    Some((method, target))
}

fn serve(conn: TcpStream) -> Option<()> {
    conn.set_nodelay(true).ok()?;
    let mut out = conn.try_clone().ok()?;
    let mut r = BufReader::new(conn);
    while let Some((method, target)) = read_request(&mut r) {
        let write = |out: &mut TcpStream, bytes: &[u8]| {
            out.write_all(bytes).ok()?;
            out.flush().ok()
        };
        if let Some(n) = target.strip_prefix("/victim/") {
            let body = format!("victim-{n}");
            let answer = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            write(&mut out, answer.as_bytes())?;
        } else if let Some(kind) = target.strip_prefix("/attack/") {
            match kind {
                // Two writes: the answer as its length frames it, then the rest of a body
                // longer than that, and an answer of its own.
                "short-length" => {
                    write(
                        &mut out,
                        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
                    )?;
                    let mut rest = b" world".to_vec();
                    rest.extend_from_slice(INJECTED);
                    write(&mut out, &rest)?;
                }
                // `str.length` of multibyte text: 5 characters, 7 bytes, in one write.
                "multibyte-length" => {
                    let mut all = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhéllö"
                        .as_bytes()
                        .to_vec();
                    all.extend_from_slice(INJECTED);
                    write(&mut out, &all)?;
                }
                "head-body" | "no-content-body" | "not-modified-body" => {
                    let head: &[u8] = match kind {
                        "head-body" if method == "HEAD" => {
                            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"
                        }
                        "no-content-body" => b"HTTP/1.1 204 No Content\r\n\r\n",
                        _ => b"HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n",
                    };
                    write(&mut out, head)?;
                    // The body it thinks it owes, written once the head is out (a server's
                    // `writeHead`, then its `end(body)`).
                    std::thread::sleep(BODY_AFTER_HEAD);
                    let mut rest = b"hello".to_vec();
                    rest.extend_from_slice(INJECTED);
                    write(&mut out, &rest)?;
                }
                "late-write" => {
                    write(&mut out, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")?;
                    std::thread::sleep(LATE);
                    let written = write(&mut out, INJECTED);
                    LATE_WRITTEN.fetch_add(1, Ordering::SeqCst);
                    written?;
                }
                // Answered at once; the body it never read is read as the next request
                // (`GET /attack/smuggled`), and answered.
                "unread-body" => {
                    write(&mut out, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")?;
                }
                "smuggled" => write(&mut out, INJECTED)?,
                _ => write(
                    &mut out,
                    b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n",
                )?,
            }
        } else if let Some(kind) = target.strip_prefix("/frame/") {
            let (now, later): (&[u8], &[u8]) = match kind {
                "te-and-length" => (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n5\r\nhello\r\n0\r\n\r\n", b""),
                "length-and-te" => (b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", b""),
                "bare-lf-header" => (b"HTTP/1.1 200 OK\r\nX-L: a\nSet-Cookie: evil=1\r\nContent-Length: 2\r\n\r\nok", b""),
                "bare-cr-header" => (b"HTTP/1.1 200 OK\r\nX-L: a\rSet-Cookie: evil=1\r\nContent-Length: 2\r\n\r\nok", b""),
                "bare-lf-status" => (b"HTTP/1.1 200 OK\nSet-Cookie: evil=1\r\nContent-Length: 2\r\n\r\nok", b""),
                "chunk-overflow" => (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1ffffffffffffffff\r\nhello\r\n0\r\n\r\n", b""),
                "chunk-negative" => (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-5\r\nhello\r\n0\r\n\r\n", b""),
                "chunk-bare-lf" => (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n", b""),
                // The head first, the broken chunk a moment later.
                "chunk-overflow-late" => (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", b"1ffffffffffffffff\r\nhello\r\n0\r\n\r\n"),
                "chunk-negative-late" => (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", b"-5\r\nhello\r\n0\r\n\r\n"),
                "chunk-bare-lf-late" => (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", b"5\nhello\r\n0\r\n\r\n"),
                "length-cut" => (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", b""),
                // Slow but within the read timeout at each step: the head after 2 s, its body
                // 2 s after the head.
                "slow" => {
                    std::thread::sleep(Duration::from_secs(2));
                    (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", b"whole")
                }
                _ => (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nwhole", b""),
            };
            write(&mut out, now)?;
            if !later.is_empty() {
                std::thread::sleep(if kind == "slow" {
                    Duration::from_secs(2)
                } else {
                    Duration::from_millis(50)
                });
                write(&mut out, later)?;
            }
            if kind == "length-cut" {
                return None;
            }
        } else {
            write(&mut out, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")?;
        }
    }
    None
}

fn spawn_upstream() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind upstream");
    let addr = listener.local_addr().expect("addr");
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            std::thread::spawn(move || serve(conn));
        }
    });
    format!("http://{addr}")
}

fn gateway(upstream: &str) -> Gateway {
    Gateway::serve()
        .upstream(upstream)
        .env("FLEET_LIMITER_ENABLED", "false")
        .env("FLEET_LIMITER_READ_TIMEOUT", "3s")
        .spawn()
}

/// One request on its own connection (closed after it); what came back, `None` when the
/// connection closed without a whole status line and head.
fn exchange(addr: SocketAddr, request: &[u8]) -> Option<RawResponse> {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    s.write_all(request).expect("write");
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    buf.windows(4)
        .any(|w| w == b"\r\n\r\n")
        .then(|| parse_raw(&buf))
}

fn get(method: &str, path: &str) -> Vec<u8> {
    format!("{method} {path} HTTP/1.1\r\nHost: api.example\r\nConnection: close\r\n\r\n")
        .into_bytes()
}

/// The attack's request: a HEAD for `head-body`, a POST with a body the upstream never reads
/// for `unread-body` (its body is a request of its own), a GET for the rest.
fn attack(kind: &str) -> Vec<u8> {
    match kind {
        "head-body" => get("HEAD", "/attack/head-body"),
        "unread-body" => {
            let body = "GET /attack/smuggled HTTP/1.1\r\nHost: x\r\n\r\n";
            format!(
                "POST /attack/unread-body HTTP/1.1\r\nHost: api.example\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )
            .into_bytes()
        }
        _ => get("GET", &format!("/attack/{kind}")),
    }
}

/// Bytes a misframing upstream sends after its answer never become the next client's answer:
/// 40 rounds of one misframed answer and then two victims' requests, each on its own client
/// connection, the victims' sent as soon as the attack's answer is in; every victim gets
/// `victim-<n>` and nothing else. After a late write the victim comes once the late bytes
/// have arrived (bytes that arrive after the next request was written cannot be told from its
/// answer, by this client or any other).
#[test]
fn no_victim_gets_bytes_that_were_not_its_own_answer() {
    let upstream = spawn_upstream();
    let gw = gateway(&upstream);
    // The gateway hands connections to its workers in turn, each with its own pool: two
    // victims after each attack, one of them on the attack's worker.
    let victims = 80;
    let mut wrong = Vec::new();
    for n in 0..victims {
        let kind = ATTACKS[(n / 2) % ATTACKS.len()];
        if n % 2 == 0 {
            let late_before = LATE_WRITTEN.load(Ordering::SeqCst);
            let _ = exchange(gw.addr, &attack(kind));
            if kind == "late-write" {
                let since = Instant::now();
                while LATE_WRITTEN.load(Ordering::SeqCst) == late_before
                    && since.elapsed() < Duration::from_secs(10)
                {
                    std::thread::sleep(Duration::from_millis(1));
                }
                std::thread::sleep(LATE);
            }
        }
        let got = exchange(gw.addr, &get("GET", &format!("/victim/{n}")));
        let want = format!("victim-{n}");
        match got {
            Some(r)
                if r.status == 200
                    && r.body == want.as_bytes()
                    && r.header("x-injected").is_none() => {}
            other => wrong.push(format!(
                "after {kind}: {:?}",
                other.map(|r| (
                    r.status,
                    r.headers,
                    String::from_utf8_lossy(&r.body).into_owned()
                ))
            )),
        }
    }
    eprintln!(
        "victims that got bytes not their own: {} of {victims}",
        wrong.len()
    );
    assert!(wrong.is_empty(), "{} of {victims}: {wrong:#?}", wrong.len());
}

/// An answer with both `Transfer-Encoding: chunked` and `Content-Length` is a 502 (never
/// `hel` of `hello` under `content-length: 3`), and the next answer is the next one's own.
#[test]
fn an_answer_with_chunked_and_a_length_is_a_502() {
    let upstream = spawn_upstream();
    let gw = gateway(&upstream);
    for kind in ["te-and-length", "length-and-te"] {
        let r = exchange(gw.addr, &get("GET", &format!("/frame/{kind}"))).expect("an answer");
        assert_eq!(r.status, 502, "{kind}: {r:?}");
        let next = exchange(gw.addr, &get("GET", "/victim/after")).expect("an answer");
        assert_eq!(next.body, b"victim-after", "after {kind}");
    }
}

/// A bare LF or CR inside the upstream's head makes no header: the answer is a 502 and no
/// `set-cookie` reaches the client.
#[test]
fn a_bare_lf_or_cr_in_the_answers_head_is_a_502() {
    let upstream = spawn_upstream();
    let gw = gateway(&upstream);
    for kind in ["bare-lf-header", "bare-cr-header", "bare-lf-status"] {
        let r = exchange(gw.addr, &get("GET", &format!("/frame/{kind}"))).expect("an answer");
        assert_eq!(r.status, 502, "{kind}: {r:?}");
        assert!(r.header("set-cookie").is_none(), "{kind}: {r:?}");
    }
}

/// An answer whose framing breaks before the client's head was sent (a chunk size that
/// overflows, is negative, or ends in a bare LF; a body cut short before any of it came) is a
/// 502 with its status line, whether the broken bytes came with the head or a moment later.
#[test]
fn an_answer_broken_before_the_head_was_sent_is_a_502() {
    let upstream = spawn_upstream();
    let gw = gateway(&upstream);
    for kind in [
        "chunk-overflow",
        "chunk-negative",
        "chunk-bare-lf",
        "chunk-overflow-late",
        "chunk-negative-late",
        "chunk-bare-lf-late",
        "length-cut",
    ] {
        let r = exchange(gw.addr, &get("GET", &format!("/frame/{kind}")))
            .unwrap_or_else(|| panic!("{kind}: the connection closed without a status line"));
        assert_eq!(r.status, 502, "{kind}: {r:?}");
    }
    // A well-framed answer still passes whole.
    let r = exchange(gw.addr, &get("GET", "/frame/whole")).expect("an answer");
    assert_eq!((r.status, r.body.as_slice()), (200, &b"whole"[..]));
    let started = Instant::now();
    let r = exchange(gw.addr, &get("GET", "/victim/last")).expect("an answer");
    assert_eq!(r.body, b"victim-last");
    assert!(started.elapsed() < Duration::from_secs(3));
}

/// The head waits for the first piece of the body, and the upstream's silence counts from the
/// head: a head 2 s after the request and its body 2 s after the head pass whole at a 3 s read
/// timeout.
#[test]
fn the_silence_before_the_first_piece_counts_from_the_head() {
    let upstream = spawn_upstream();
    let gw = gateway(&upstream);
    let r = exchange(gw.addr, &get("GET", "/frame/slow")).expect("an answer");
    assert_eq!((r.status, r.body.as_slice()), (200, &b"whole"[..]), "{r:?}");
}
