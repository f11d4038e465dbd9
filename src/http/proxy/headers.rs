//! The request the upstream gets: hop-by-hop headers removed, `X-Forwarded-For` appended, the
//! canonical path and the query, and the lengths read from the client's headers.

use super::body::ProxyBody;
use super::client::UpstreamClient;
use actix_web::http::header::{self, HeaderMap, HeaderValue};
use actix_web::http::Method;
use actix_web::HttpRequest;
use bytes::{BufMut, BytesMut};

/// Whether a header must not be copied across the proxy: one that describes one connection,
/// not the message (RFC 9110 section 7.6.1). `Content-Length` is set again from the body, and
/// any header the `Connection` header names is connection-specific too.
pub(super) fn skip_header(name: &str, connection_named: &[String]) -> bool {
    matches!(
        name,
        "content-length"
            | "connection"
            | "keep-alive"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "proxy-connection"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
    ) || connection_named
        .iter()
        .any(|c| c.eq_ignore_ascii_case(name))
}

/// The header names a `Connection` header lists (its values, comma-separated).
pub(super) fn connection_named<'a>(values: impl Iterator<Item = &'a [u8]>) -> Vec<String> {
    values
        .filter_map(|v| std::str::from_utf8(v).ok())
        .flat_map(|v| v.split(','))
        .map(|s| s.trim().to_ascii_lowercase())
        .filter(|s| !s.is_empty())
        .collect()
}

pub(super) fn parse_length(value: Option<&[u8]>) -> Option<u64> {
    std::str::from_utf8(value?).ok()?.trim().parse().ok()
}

/// `X-Forwarded-For` with the immediate peer appended to whatever arrived.
fn forwarded_for(headers: &HeaderMap, peer: Option<std::net::IpAddr>) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    for v in headers.get_all("x-forwarded-for") {
        if !out.is_empty() {
            out.extend_from_slice(b", ");
        }
        out.extend_from_slice(v.as_bytes());
    }
    if let Some(ip) = peer {
        if !out.is_empty() {
            out.extend_from_slice(b", ");
        }
        write_ip(&mut out, ip);
    }
    (!out.is_empty()).then_some(out)
}

/// An address as `X-Forwarded-For` carries it (an IPv4-mapped IPv6 address as IPv4), written
/// without the formatting machinery for IPv4.
fn write_ip(out: &mut impl BufMut, ip: std::net::IpAddr) {
    match ip.to_canonical() {
        std::net::IpAddr::V4(v4) => {
            let mut digits = itoa::Buffer::new();
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    out.put_u8(b'.');
                }
                out.put_slice(digits.format(octet).as_bytes());
            }
        }
        std::net::IpAddr::V6(v6) => {
            use std::io::Write as _;
            let _ = write!(out.writer(), "{v6}");
        }
    }
}

/// How the request's body is framed on the way to the upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Framing {
    /// No body: no `Content-Length`, no `Transfer-Encoding`, and the client's body (a chunked
    /// one on `GET`, `HEAD` or `CONNECT`) is not sent.
    None,
    /// `Content-Length`: exactly this many bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
}

impl Framing {
    /// The framing of `body` for `method`: a chunked body on a method that almost never has
    /// one is not sent at all (as hyper's client does).
    pub(super) fn of(method: &Method, body: &ProxyBody) -> Self {
        match body.declared() {
            None => Framing::None,
            Some(Some(n)) => Framing::Length(n),
            Some(None) if matches!(*method, Method::GET | Method::HEAD | Method::CONNECT) => {
                Framing::None
            }
            Some(None) => Framing::Chunked,
        }
    }
}

/// The request head as it goes to the upstream, written once as HTTP/1.1 bytes: the method,
/// the prefixed path and query, the end-to-end headers (names lower-case, in the order of the
/// client's header table), `Host` when the client sent none, `X-Forwarded-For`, and the framing
/// of the body. `None` when the target holds a byte a request line cannot carry.
pub(super) fn request_head(
    req: &HttpRequest,
    path: &str,
    client: &UpstreamClient,
    framing: Framing,
) -> Option<BytesMut> {
    let target_ok = |s: &str| s.bytes().all(|b| b > b' ' && b != 0x7f);
    if !target_ok(path) || !target_ok(&client.prefix) {
        return None;
    }
    let mut out = BytesMut::with_capacity(512);
    out.put_slice(req.method().as_str().as_bytes());
    out.put_u8(b' ');
    out.put_slice(client.prefix.as_bytes());
    out.put_slice(path.as_bytes());
    out.put_slice(b" HTTP/1.1\r\n");
    let headers = req.headers();
    let named = if headers.contains_key(header::CONNECTION) {
        connection_named(
            headers
                .get_all(header::CONNECTION)
                .map(HeaderValue::as_bytes),
        )
    } else {
        Vec::new()
    };
    let mut host = false;
    for (name, value) in headers {
        let n = name.as_str();
        if skip_header(n, &named) || n == "x-forwarded-for" {
            continue;
        }
        let v = value.as_bytes();
        if v.iter().any(|&b| b == b'\r' || b == b'\n' || b == 0) {
            continue;
        }
        host |= n == "host";
        out.put_slice(n.as_bytes());
        out.put_slice(b": ");
        out.put_slice(v);
        out.put_slice(b"\r\n");
    }
    if !host && !client.host.is_empty() && target_ok(&client.host) {
        out.put_slice(b"host: ");
        out.put_slice(client.host.as_bytes());
        out.put_slice(b"\r\n");
    }
    // `X-Forwarded-For`: what arrived, then the peer.
    let peer = req.peer_addr().map(|a| a.ip());
    let mut xff = headers.get_all(header::X_FORWARDED_FOR).peekable();
    if xff.peek().is_some() || peer.is_some() {
        out.put_slice(b"x-forwarded-for: ");
        let mut first = true;
        for v in xff {
            if !first {
                out.put_slice(b", ");
            }
            out.put_slice(v.as_bytes());
            first = false;
        }
        if let Some(ip) = peer {
            if !first {
                out.put_slice(b", ");
            }
            write_ip(&mut out, ip);
        }
        out.put_slice(b"\r\n");
    }
    match framing {
        Framing::None => {}
        Framing::Length(n) => {
            out.put_slice(b"content-length: ");
            out.put_slice(itoa::Buffer::new().format(n).as_bytes());
            out.put_slice(b"\r\n");
        }
        Framing::Chunked => out.put_slice(b"transfer-encoding: chunked\r\n"),
    }
    out.put_slice(b"\r\n");
    Some(out)
}

/// The request as it goes to the upstream: same method, prefixed path and query, the
/// end-to-end headers, `X-Forwarded-For`, and the body streamed through.
pub(super) fn upstream_request(
    req: &HttpRequest,
    path: &str,
    client: &UpstreamClient,
    body: ProxyBody,
) -> Option<hyper::Request<ProxyBody>> {
    let uri = if client.prefix.is_empty() {
        hyper::Uri::try_from(path).ok()?
    } else {
        hyper::Uri::try_from(format!("{}{path}", client.prefix)).ok()?
    };
    let mut out = hyper::Request::new(body);
    *out.method_mut() = hyper::Method::from_bytes(req.method().as_str().as_bytes()).ok()?;
    *out.uri_mut() = uri;
    let headers = out.headers_mut();
    headers.reserve(req.headers().len() + 2);
    let named = connection_named(
        req.headers()
            .get_all(header::CONNECTION)
            .map(HeaderValue::as_bytes),
    );
    for (name, value) in req.headers() {
        let n = name.as_str();
        if skip_header(n, &named) || n == "x-forwarded-for" {
            continue;
        }
        if let (Ok(n), Ok(v)) = (
            hyper::header::HeaderName::from_bytes(n.as_bytes()),
            hyper::header::HeaderValue::from_bytes(value.as_bytes()),
        ) {
            headers.append(n, v);
        }
    }
    if !headers.contains_key(hyper::header::HOST) {
        if let Ok(v) = hyper::header::HeaderValue::from_str(&client.host) {
            headers.insert(hyper::header::HOST, v);
        }
    }
    if let Some(xff) = forwarded_for(req.headers(), req.peer_addr().map(|a| a.ip())) {
        if let Ok(v) = hyper::header::HeaderValue::from_bytes(&xff) {
            headers.insert(hyper::header::HeaderName::from_static("x-forwarded-for"), v);
        }
    }
    Some(out)
}

/// Copy the upstream answer's end-to-end headers onto the client's answer: hop-by-hop ones and
/// those its `Connection` header names are dropped, and so is any the client's side cannot
/// carry.
pub(super) fn end_to_end_headers(
    upstream: &hyper::HeaderMap,
    back: &mut actix_web::HttpResponseBuilder,
) {
    let named = connection_named(
        upstream
            .get_all(hyper::header::CONNECTION)
            .iter()
            .map(|v| v.as_bytes()),
    );
    for (name, value) in upstream {
        if skip_header(name.as_str(), &named) {
            continue;
        }
        if let (Ok(n), Ok(v)) = (
            header::HeaderName::from_bytes(name.as_str().as_bytes()),
            HeaderValue::from_bytes(value.as_bytes()),
        ) {
            back.append_header((n, v));
        }
    }
}
