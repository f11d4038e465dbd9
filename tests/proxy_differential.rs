//! What the upstream receives, byte for byte, for a corpus of requests sent through the gateway
//! binary, and what the client gets back for a corpus of upstream answers: held against
//! `tests/fixtures/proxy_differential.golden`.
//!
//! The upstream is plain sockets: it reads each request's head, then its body exactly as the
//! head frames it (`Transfer-Encoding: chunked` raw, chunk lines and trailers included, or
//! `Content-Length` bytes, or none), records the bytes, and answers what the request's query
//! (`resp=KIND`) asks for. Any byte the gateway adds, drops or reframes shows up as a
//! difference; a request smuggled inside another one's body shows up as an extra request; an
//! answer that leaks into the next exchange on a kept-alive connection shows up in the next
//! case's answer.
//!
//! Header lines of one message are compared sorted by name (the values of one name keep their
//! order): the gateway's header table does not promise an order between names.
//!
//! `FLEET_LIMITER_BLESS=1 cargo test --test proxy_differential` writes the golden file from
//! the build under test (done once, on the proxy built on hyper's client, before the proxy's
//! own client replaced it). Two answers differ from hyper's on purpose, stricter: an answer
//! with both `Transfer-Encoding: chunked` and `Content-Length` (hyper read the chunks and
//! passed the length on, cutting the body) and an answer whose first chunk line is broken
//! (hyper's gateway closed the client's connection without a status line) are 502s.

mod common;

use common::Gateway;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::Duration;

const GOLDEN: &str = "tests/fixtures/proxy_differential.golden";

/// One request as the upstream read it off the wire: head and body, framing included.
fn read_request(r: &mut BufReader<TcpStream>) -> Option<(Vec<u8>, Vec<u8>, String, String)> {
    let mut head = Vec::new();
    loop {
        let mut line = Vec::new();
        if r.read_until(b'\n', &mut line).ok()? == 0 {
            return None;
        }
        let end = line == b"\r\n";
        head.extend_from_slice(&line);
        if end {
            break;
        }
    }
    let text = String::from_utf8_lossy(&head).into_owned();
    let mut lines = text.split("\r\n");
    let request_line = lines.next().unwrap_or_default().to_owned();
    let mut method = request_line
        .split(' ')
        .next()
        .unwrap_or_default()
        .to_owned();
    let target = request_line
        .split(' ')
        .nth(1)
        .unwrap_or_default()
        .to_owned();
    let (mut chunked, mut length) = (false, None::<usize>);
    for l in lines {
        let Some((k, v)) = l.split_once(':') else {
            continue;
        };
        match k.to_ascii_lowercase().as_str() {
            "transfer-encoding" => {
                chunked = v.trim().to_ascii_lowercase().ends_with("chunked");
            }
            "content-length" => length = v.trim().parse().ok(),
            _ => {}
        }
    }
    let mut body = Vec::new();
    if chunked {
        loop {
            let mut line = Vec::new();
            r.read_until(b'\n', &mut line).ok()?;
            body.extend_from_slice(&line);
            let size = String::from_utf8_lossy(&line);
            let size = size.trim().split(';').next().unwrap_or_default().to_owned();
            let size = usize::from_str_radix(size.trim(), 16).ok()?;
            if size == 0 {
                loop {
                    let mut t = Vec::new();
                    r.read_until(b'\n', &mut t).ok()?;
                    body.extend_from_slice(&t);
                    if t == b"\r\n" || t.is_empty() {
                        break;
                    }
                }
                break;
            }
            let mut data = vec![0; size + 2];
            r.read_exact(&mut data).ok()?;
            body.extend_from_slice(&data);
        }
    } else if let Some(n) = length {
        let mut data = vec![0; n];
        r.read_exact(&mut data).ok()?;
        body = data;
    }
    method.make_ascii_uppercase();
    Some((head, body, method, target))
}

/// The answer the query's `resp=KIND` asks for, and whether the connection closes after it.
fn response(method: &str, target: &str) -> (Vec<u8>, bool) {
    let kind = target
        .split_once("resp=")
        .map(|(_, k)| k.split('&').next().unwrap_or_default())
        .unwrap_or("plain");
    let mut out: Vec<u8> = match kind {
        "chunked" => b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-T\r\nX-Up: chunked\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-T: 1\r\n\r\n".to_vec(),
        "close" => b"HTTP/1.1 200 OK\r\nX-Up: close\r\n\r\nuntil the connection closes".to_vec(),
        "informational" => b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\nHTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 3\r\nX-Up: 201\r\n\r\nnew".to_vec(),
        "no-content" => b"HTTP/1.1 204 No Content\r\nX-Up: 204\r\n\r\n".to_vec(),
        "not-modified" => b"HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\nX-Up: 304\r\n\r\n".to_vec(),
        "te-and-cl" => b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\nX-Up: te\r\n\r\n4\r\nabcd\r\n0\r\n\r\n".to_vec(),
        "two-lengths" => b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\nX-Up: two\r\n\r\nabcd".to_vec(),
        "same-lengths" => b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 3\r\nX-Up: same\r\n\r\nabc".to_vec(),
        "bad-length" => b"HTTP/1.1 200 OK\r\nContent-Length: +3\r\nX-Up: bad\r\n\r\nabc".to_vec(),
        "bad-chunk" => b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-Up: badchunk\r\n\r\nzz\r\nabc\r\n0\r\n\r\n".to_vec(),
        "hop" => b"HTTP/1.1 200 OK\r\nConnection: X-Named\r\nX-Named: 1\r\nKeep-Alive: timeout=5\r\nProxy-Connection: keep-alive\r\nUpgrade: h2c\r\nTrailer: X-T\r\nX-Up: hop\r\nX-Up-Multi: a\r\nX-Up-Multi: b\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\nContent-Length: 2\r\n\r\nok".to_vec(),
        "http10" => b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\nX-Up: 10\r\n\r\nok".to_vec(),
        "leak" => b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Up: leak\r\n\r\nokHTTP/1.1 200 OK\r\nContent-Length: 4\r\nX-Up: evil\r\n\r\nevil".to_vec(),
        "big" => {
            let body: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
            let mut out = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\nX-Up: big\r\n\r\n", body.len()).into_bytes();
            out.extend_from_slice(&body);
            out
        }
        "status" => b"HTTP/1.1 418 I'm a teapot\r\nContent-Length: 3\r\nX-Up: 418\r\n\r\ntea".to_vec(),
        "bad-status" => b"HTTP/1.1 20 OK\r\nContent-Length: 2\r\n\r\nok".to_vec(),
        "folded" => b"HTTP/1.1 200 OK\r\nX-Up: fold\r\n  ed\r\nContent-Length: 2\r\n\r\nok".to_vec(),
        _ => b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Up: plain\r\n\r\nok".to_vec(),
    };
    if method == "HEAD" {
        if let Some(end) = out.windows(4).position(|w| w == b"\r\n\r\n") {
            out.truncate(end + 4);
        }
    }
    (out, kind == "close" || kind == "http10")
}

/// The upstream: every request it reads, as bytes, down `seen`.
fn spawn_upstream() -> (String, mpsc::Receiver<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind upstream");
    let addr = listener.local_addr().expect("addr");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let tx = tx.clone();
            std::thread::spawn(move || {
                let Ok(mut out) = conn.try_clone() else {
                    return;
                };
                let mut r = BufReader::new(conn);
                while let Some((head, body, method, target)) = read_request(&mut r) {
                    let _ = tx.send(normalised(&head, &body));

                    let (answer, close) = response(&method, &target);
                    if out.write_all(&answer).is_err() || close {
                        return;
                    }
                }
            });
        }
    });
    (format!("http://{addr}"), rx)
}

/// A message's head with its header lines sorted by name (stable), then its body.
///
/// A chunked body is recorded as its data, then `<chunked>` and the last chunk and trailers
/// as sent: where one chunk ends and the next begins follows how the client's bytes arrived,
/// not what they say.
fn normalised(head: &[u8], body: &[u8]) -> Vec<u8> {
    let mut lines: Vec<&[u8]> = head.split(|&b| b == b'\n').collect();
    let first = lines.remove(0);
    lines.retain(|l| !l.is_empty() && *l != b"\r");
    lines.sort_by_key(|l| {
        let name = l.split(|&b| b == b':').next().unwrap_or_default();
        name.to_ascii_lowercase()
    });
    let mut out = first.to_vec();
    out.push(b'\n');
    for l in lines {
        out.extend_from_slice(l);
        out.push(b'\n');
    }
    out.extend_from_slice(b"\r\n");
    let chunked = out.split(|&b| b == b'\n').any(|l| {
        l.to_ascii_lowercase()
            .starts_with(b"transfer-encoding: chunked")
    });
    if chunked {
        let (data, last) = split_chunks(body);
        out.extend_from_slice(&data);
        out.extend_from_slice(b"<chunked>");
        out.extend_from_slice(last);
    } else {
        out.extend_from_slice(body);
    }
    out
}

/// A chunked body's data, and the rest from its last chunk on (as it came).
fn split_chunks(mut rest: &[u8]) -> (Vec<u8>, &[u8]) {
    let mut data = Vec::new();
    loop {
        let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") else {
            return (data, rest);
        };
        let size = String::from_utf8_lossy(&rest[..eol]);
        let Ok(size) = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16)
        else {
            return (data, rest);
        };
        if size == 0 || rest.len() < eol + 2 + size + 2 {
            return (data, rest);
        }
        data.extend_from_slice(&rest[eol + 2..eol + 2 + size]);
        rest = &rest[eol + 2 + size + 2..];
    }
}

/// What the client got: status, the upstream's headers (`x-up*`, `set-cookie`, `link`,
/// `trailer`, `content-type`, and the framing the gateway chose), the body decoded.
fn client_side(mut raw: &[u8]) -> String {
    // Interim answers (`100 Continue`) first: skipped.
    while raw.starts_with(b"HTTP/1.1 1") {
        let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
            break;
        };
        raw = &raw[end + 4..];
    }
    let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
        return format!("no answer: {}", raw.escape_ascii());
    };
    let head = String::from_utf8_lossy(&raw[..end]);
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .unwrap_or_default()
        .to_owned();
    let mut headers: Vec<(String, String)> = Vec::new();
    let mut framing = String::from("none");
    let mut chunked = false;
    for l in lines {
        let Some((k, v)) = l.split_once(':') else {
            continue;
        };
        let k = k.trim().to_ascii_lowercase();
        let v = v.trim().to_owned();
        match k.as_str() {
            "content-length" => framing = format!("length {v}"),
            "transfer-encoding" => {
                chunked = v.eq_ignore_ascii_case("chunked");
                framing = format!("transfer-encoding {v}");
            }
            _ if k.starts_with("x-up")
                || [
                    "set-cookie",
                    "link",
                    "trailer",
                    "x-named",
                    "keep-alive",
                    "upgrade",
                ]
                .contains(&k.as_str()) =>
            {
                headers.push((k, v));
            }
            _ => {}
        }
    }
    headers.sort_by(|a, b| a.0.cmp(&b.0));
    let rest = &raw[end + 4..];
    let body = if chunked {
        dechunk(rest)
    } else {
        rest.to_vec()
    };
    let mut out = format!("{status} ({framing})\n");
    for (k, v) in headers {
        let _ = writeln!(out, "{k}: {v}");
    }
    let _ = write!(out, "{}", body.escape_ascii());
    out
}

fn dechunk(mut rest: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") else {
            out.extend_from_slice(b"<unterminated>");
            return out;
        };
        let size = String::from_utf8_lossy(&rest[..eol]);
        let Ok(size) = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16)
        else {
            out.extend_from_slice(b"<bad chunk>");
            return out;
        };
        rest = &rest[eol + 2..];
        if size == 0 {
            return out;
        }
        if rest.len() < size + 2 {
            out.extend_from_slice(rest);
            out.extend_from_slice(b"<cut>");
            return out;
        }
        out.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}

/// The client's requests: `(name, bytes)`. Each is sent on its own connection and closes it.
fn corpus() -> Vec<(&'static str, Vec<u8>)> {
    let big: Vec<u8> = (0..70_000u32).map(|i| (i % 253) as u8).collect();
    let mut big_post =
        b"POST /api/upload HTTP/1.1\r\nHost: api.example\r\nContent-Type: application/octet-stream\r\nContent-Length: 70000\r\nConnection: close\r\n\r\n".to_vec();
    big_post.extend_from_slice(&big);
    let mut big_chunked = b"PUT /api/upload HTTP/1.1\r\nHost: api.example\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n".to_vec();
    for part in big.chunks(9_000) {
        big_chunked.extend_from_slice(format!("{:x}\r\n", part.len()).as_bytes());
        big_chunked.extend_from_slice(part);
        big_chunked.extend_from_slice(b"\r\n");
    }
    big_chunked.extend_from_slice(b"0\r\n\r\n");
    let r = |s: &str| s.as_bytes().to_vec();
    vec![
        ("get", r("GET /api/echo HTTP/1.1\r\nHost: api.example\r\nUser-Agent: t\r\nAccept: */*\r\nConnection: close\r\n\r\n")),
        ("get with query", r("GET /api/echo?a=1&b=%20x&resp=plain HTTP/1.1\r\nHost: api.example\r\nConnection: close\r\n\r\n")),
        ("get, HTTP/1.0 without Host", r("GET /api/echo HTTP/1.0\r\n\r\n")),
        ("get, canonical path", r("GET //api/./x/../echo HTTP/1.1\r\nHost: api.example\r\nConnection: close\r\n\r\n")),
        ("head", r("HEAD /api/echo HTTP/1.1\r\nHost: api.example\r\nConnection: close\r\n\r\n")),
        ("post with a length", r("POST /api/agent/heartbeat HTTP/1.1\r\nHost: api.example\r\nX-Agent-ID: agent-0001\r\nContent-Type: application/json\r\nContent-Length: 34\r\nConnection: close\r\n\r\n{\"status\":\"healthy\",\"uptime\":3600}")),
        ("post with length 0", r("POST /api/echo HTTP/1.1\r\nHost: api.example\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")),
        ("post without a body", r("POST /api/echo HTTP/1.1\r\nHost: api.example\r\nConnection: close\r\n\r\n")),
        ("post chunked", r("POST /api/echo HTTP/1.1\r\nHost: api.example\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5;name=v\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n0\r\nX-Trailer: t\r\n\r\n")),
        ("post chunked, empty", r("POST /api/echo HTTP/1.1\r\nHost: api.example\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n0\r\n\r\n")),
        ("delete chunked", r("DELETE /api/echo/1 HTTP/1.1\r\nHost: api.example\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3\r\nabc\r\n0\r\n\r\n")),
        ("get with a length body", r("GET /api/echo HTTP/1.1\r\nHost: api.example\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc")),
        ("get chunked", r("GET /api/echo HTTP/1.1\r\nHost: api.example\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3\r\nabc\r\n0\r\n\r\n")),
        ("a large body", big_post),
        ("a large chunked body", big_chunked),
        ("hop-by-hop headers", r("GET /api/echo HTTP/1.1\r\nHost: api.example\r\nConnection: close, X-Private\r\nX-Private: secret\r\nKeep-Alive: timeout=5\r\nTE: trailers\r\nTrailer: X-T\r\nProxy-Authorization: Basic abc\r\nProxy-Connection: keep-alive\r\nX-Forwarded-For: 198.51.100.1\r\nX-Forwarded-For: 198.51.100.2\r\nX-Multi: a\r\nX-Multi: b\r\nX-Original-URL: /api/agent/rotate-key\r\n\r\n")),
        ("header bytes beyond ASCII", b"GET /api/echo HTTP/1.1\r\nHost: api.example\r\nX-Latin: caf\xe9\r\nX-Tab: a\tb\r\nConnection: close\r\n\r\n".to_vec()),
        ("expect 100-continue", r("POST /api/echo HTTP/1.1\r\nHost: api.example\r\nExpect: 100-continue\r\nContent-Length: 4\r\nConnection: close\r\n\r\nbody")),
        ("custom method", r("PATCH /api/echo HTTP/1.1\r\nHost: api.example\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")),
        ("smuggling: length and chunked", r("POST /api/echo HTTP/1.1\r\nHost: api.example\r\nContent-Length: 6\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n")),
        ("smuggling: two lengths", r("POST /api/echo HTTP/1.1\r\nHost: api.example\r\nContent-Length: 4\r\nContent-Length: 40\r\nConnection: close\r\n\r\nbodyGET /smuggled HTTP/1.1\r\n\r\n")),
        ("smuggling: chunked not last", r("POST /api/echo HTTP/1.1\r\nHost: api.example\r\nTransfer-Encoding: chunked, identity\r\nConnection: close\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\n\r\n")),
        ("smuggling: obfuscated te", r("POST /api/echo HTTP/1.1\r\nHost: api.example\r\nTransfer-Encoding : chunked\r\nContent-Length: 4\r\nConnection: close\r\n\r\nbody")),
        ("smuggling: a request inside a body", r("POST /api/echo HTTP/1.1\r\nHost: api.example\r\nContent-Length: 35\r\nConnection: close\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n")),
        ("smuggling: a request inside a chunk", r("POST /api/echo HTTP/1.1\r\nHost: api.example\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n23\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n\r\n0\r\n\r\n")),
        ("smuggling: bare LF chunk", r("POST /api/echo HTTP/1.1\r\nHost: api.example\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3\nabc\n0\n\n")),
        ("answer chunked with trailers", r("GET /api/echo?resp=chunked HTTP/1.1\r\nHost: api.example\r\nConnection: close\r\n\r\n")),
        ("answer until close", r("GET /api/echo?resp=close HTTP/1.1\r\nHost: api.example\r\nConnection: close\r\n\r\n")),
        ("answer after 1xx", r("GET /api/echo?resp=informational HTTP/1.1\r\nHost: api.example\r\nConnection: close\r\n\r\n")),
        ("answer 204", r("GET /api/echo?resp=no-content HTTP/1.1\r\nHost: api.example\r\nConnection: close\r\n\r\n")),
        ("answer 304 with a length", r("GET /api/echo?resp=not-modified HTTP/1.1\r\nHost: api.example\r\nConnection: close\r\n\r\n")),
        ("after the 304", r("GET /api/echo HTTP/1.1\r\nHost: api.example\r\nConnection: close\r\n\r\n")),
        ("answer with chunked and a length", r("GET /api/echo?resp=te-and-cl HTTP/1.1\r\nHost: api.example\r\nConnection: close\r\n\r\n")),
        ("after chunked and a length", r("GET /api/echo HTTP/1.1\r\nHost: api.example\r\nConnection: close\r\n\r\n")),
        ("answer with two lengths", r("GET /api/echo?resp=two-lengths HTTP/1.1\r\nHost: api.example\r\nConnection: close\r\n\r\n")),
        ("answer with the same length twice", r("GET /api/echo?resp=same-lengths HTTP/1.1\r\nHost: api.example\r\nConnection: close\r\n\r\n")),
        ("answer with a signed length", r("GET /api/echo?resp=bad-length HTTP/1.1\r\nHost: api.example\r\nConnection: close\r\n\r\n")),
        ("answer with a bad chunk", r("GET /api/echo?resp=bad-chunk HTTP/1.1\r\nHost: api.example\r\nConnection: close\r\n\r\n")),
        ("answer with hop-by-hop headers", r("GET /api/echo?resp=hop HTTP/1.1\r\nHost: api.example\r\nConnection: close\r\n\r\n")),
        ("answer in HTTP/1.0", r("GET /api/echo?resp=http10 HTTP/1.1\r\nHost: api.example\r\nConnection: close\r\n\r\n")),
        ("answer with bytes after it", r("GET /api/echo?resp=leak HTTP/1.1\r\nHost: api.example\r\nConnection: close\r\n\r\n")),
        ("after the bytes after an answer", r("GET /api/echo HTTP/1.1\r\nHost: api.example\r\nConnection: close\r\n\r\n")),
        ("a large answer", r("GET /api/echo?resp=big HTTP/1.1\r\nHost: api.example\r\nConnection: close\r\n\r\n")),
        ("head of a large answer", r("HEAD /api/echo?resp=big HTTP/1.1\r\nHost: api.example\r\nConnection: close\r\n\r\n")),
        ("an unusual status", r("GET /api/echo?resp=status HTTP/1.1\r\nHost: api.example\r\nConnection: close\r\n\r\n")),
        ("a bad status line", r("GET /api/echo?resp=bad-status HTTP/1.1\r\nHost: api.example\r\nConnection: close\r\n\r\n")),
        ("a folded header", r("GET /api/echo?resp=folded HTTP/1.1\r\nHost: api.example\r\nConnection: close\r\n\r\n")),
        ("last", r("GET /api/last HTTP/1.1\r\nHost: api.example\r\nConnection: close\r\n\r\n")),
    ]
}

fn exchange(gw: &Gateway, request: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(gw.addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let _ = s.write_all(request);
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    buf
}

#[test]
fn the_upstream_and_the_client_see_what_the_golden_file_holds() {
    let (upstream, seen) = spawn_upstream();
    let upstream = upstream.as_str();
    let gw = Gateway::serve()
        .upstream(upstream)
        .env("FLEET_LIMITER_READ_TIMEOUT", "3s")
        .spawn();
    let mut report = String::new();
    for (name, request) in corpus() {
        let answer = exchange(&gw, &request);
        let mut upstream_saw = Vec::new();
        // Everything the upstream read for this request has been read once the answer is
        // complete; a short wait catches a request that should not have been sent at all.
        while let Ok(req) = seen.recv_timeout(Duration::from_millis(150)) {
            upstream_saw.push(req);
        }
        let _ = writeln!(report, "=== {name}");
        for req in &upstream_saw {
            let _ = writeln!(report, "--- upstream\n{}", req.escape_ascii());
        }
        if upstream_saw.is_empty() {
            let _ = writeln!(report, "--- upstream\n(nothing)");
        }
        let _ = writeln!(report, "--- client\n{}", client_side(&answer));
    }
    // The upstream's port changes from run to run (it is the `Host` of a request without one).
    let report = report.replace(upstream.trim_start_matches("http://"), "UPSTREAM");
    let path = common::manifest_dir().join(GOLDEN);
    if std::env::var_os("FLEET_LIMITER_BLESS").is_some() {
        std::fs::write(&path, &report).expect("write the golden file");
        return;
    }
    let golden = std::fs::read_to_string(&path).expect("the golden file");
    let cases = |text: &str| -> Vec<String> {
        text.split("=== ")
            .filter(|c| !c.is_empty())
            .map(str::to_owned)
            .collect()
    };
    let (want, got) = (cases(&golden), cases(&report));
    let mut diff = String::new();
    for i in 0..want.len().max(got.len()) {
        let (a, b) = (want.get(i), got.get(i));
        if a != b {
            let cut = |s: Option<&String>| {
                s.map_or_else(|| "(none)".to_owned(), |s| s.chars().take(600).collect())
            };
            let _ = writeln!(diff, "golden:\n{}\nnow:\n{}\n", cut(a), cut(b));
        }
    }
    assert!(
        diff.is_empty(),
        "the proxy's bytes differ from {GOLDEN}:\n{diff}"
    );
}
