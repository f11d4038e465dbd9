//! The request on its way to the upstream: its head written once as HTTP/1.1 bytes (or built
//! as hyper's request, for a WebSocket handshake), and its body framed and written as the client
//! sends it.

use super::error::UpstreamError;
use super::pool::{Io, UpstreamClient};
use crate::http::proxy::body::ProxyBody;
use crate::http::proxy::headers::{connection_named, skip_header, Framing};
use actix_web::http::header::{self, HeaderMap, HeaderValue};
use actix_web::HttpRequest;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::AsyncWrite;

/// Body chunks up to this size are copied behind the head (one write); larger ones are written
/// as they are.
const COPY_UP_TO: usize = 8 * 1024;
/// Request bytes taken from the client before the upstream has to take some.
const WRITE_AHEAD: usize = 64 * 1024;

/// The request's side of an exchange: its head, then its body as the client sends it (framed by
/// `Content-Length` or chunked), written on the exchange's connection.
pub(super) struct Outgoing {
    /// Request bytes to write: large body chunks as they came, in order, before `out`.
    queue: VecDeque<Bytes>,
    out: BytesMut,
    body: ProxyBody,
    framing: Framing,
    /// For a `Content-Length` body: the bytes the client still owes.
    owed: u64,
    body_done: bool,
    /// The whole request is written and flushed.
    sent: bool,
    /// The body has not been looked at yet.
    first: bool,
    /// The head waited for the body's first bytes.
    deferred: bool,
    /// The length of the head (what `out` holds before any of the body).
    head_len: usize,
    /// Request bytes written on this connection.
    written: u64,
}

impl Outgoing {
    pub(super) fn new(head: BytesMut, body: ProxyBody, framing: Framing) -> Self {
        let (body, owed) = match framing {
            // A body the framing does not carry is never read (as hyper's client).
            Framing::None => (ProxyBody::Empty, 0),
            Framing::Length(n) => (body, n),
            Framing::Chunked => (body, 0),
        };
        Self {
            queue: VecDeque::new(),
            first: true,
            deferred: false,
            head_len: head.len(),
            out: head,
            body_done: matches!(body, ProxyBody::Empty),
            body,
            framing,
            owed,
            sent: false,
            written: 0,
        }
    }

    /// Whether the whole request is written and flushed.
    pub(super) fn sent(&self) -> bool {
        self.sent
    }

    /// Request bytes written on this connection.
    pub(super) fn written(&self) -> u64 {
        self.written
    }

    fn buffered(&self) -> usize {
        self.out.len() + self.queue.iter().map(Bytes::len).sum::<usize>()
    }

    fn push_data(&mut self, data: Bytes) -> Result<(), UpstreamError> {
        let len = data.len();
        match self.framing {
            Framing::None => return Ok(()),
            Framing::Length(_) => {
                // More than the client declared cannot come (its reader holds it to the
                // length); should it, the request is not sent on.
                self.owed = self
                    .owed
                    .checked_sub(len as u64)
                    .ok_or(UpstreamError::Body)?;
            }
            Framing::Chunked => {
                use std::io::Write as _;
                let _ = write!((&mut self.out).writer(), "{len:x}\r\n");
            }
        }
        if len <= COPY_UP_TO {
            self.out.extend_from_slice(&data);
        } else {
            if !self.out.is_empty() {
                self.queue.push_back(self.out.split().freeze());
            }
            self.queue.push_back(data);
        }
        if self.framing == Framing::Chunked {
            self.out.extend_from_slice(b"\r\n");
        }
        Ok(())
    }

    fn end_body(&mut self) -> Result<(), UpstreamError> {
        self.body_done = true;
        match self.framing {
            Framing::Length(_) if self.owed != 0 => Err(UpstreamError::Body),
            Framing::Chunked => {
                self.out.extend_from_slice(b"0\r\n\r\n");
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Write what is buffered.
    fn poll_write_buffered(
        &mut self,
        conn: &mut Option<Io>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), UpstreamError>> {
        let Some(io) = conn.as_mut() else {
            return Poll::Ready(Err(UpstreamError::Closed));
        };
        // A head that waited for the body's first bytes: the connection may have been closed
        // by the upstream meanwhile; then the request goes on another one, nothing sent yet.
        if std::mem::replace(&mut self.deferred, false) && !io.idle_and_open() {
            return Poll::Ready(Err(UpstreamError::Closed));
        }
        loop {
            let from_queue = !self.queue.is_empty();
            let buf: &[u8] = match self.queue.front() {
                Some(b) => b,
                None if !self.out.is_empty() => &self.out,
                None => return Poll::Ready(Ok(())),
            };
            let n = match Pin::new(&mut *io).poll_write(cx, buf) {
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err(UpstreamError::Io(
                        std::io::ErrorKind::WriteZero.into(),
                    )))
                }
                Poll::Ready(Ok(n)) => n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(UpstreamError::Io(e))),
                Poll::Pending => return Poll::Pending,
            };
            self.written += n as u64;
            if from_queue {
                if let Some(front) = self.queue.front_mut() {
                    if n >= front.len() {
                        self.queue.pop_front();
                    } else {
                        front.advance(n);
                    }
                }
            } else if n >= self.out.len() {
                self.out.clear();
            } else {
                self.out.advance(n);
            }
        }
    }

    /// Send the request: its head, then its body as the client sends it. `Ready(Ok)` once all
    /// of it is written and flushed.
    pub(super) fn poll_send(
        &mut self,
        conn: &mut Option<Io>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), UpstreamError>> {
        if self.sent {
            return Poll::Ready(Ok(()));
        }
        // The first look at the body is made while the server may still be reading it: it
        // leaves no waker with the payload (the server polls this task again once it has read
        // more), and when nothing of the body has come yet, the head waits for it, so that
        // head and body leave in one write.
        let first = std::mem::replace(&mut self.first, false);
        loop {
            while !self.body_done && self.buffered() < WRITE_AHEAD {
                match self.body.poll_data(cx, first) {
                    Poll::Pending => break,
                    Poll::Ready(None) => self.end_body()?,
                    Poll::Ready(Some(Err(_))) => return Poll::Ready(Err(UpstreamError::Body)),
                    Poll::Ready(Some(Ok(data))) => {
                        if !data.is_empty() {
                            self.push_data(data)?;
                        }
                    }
                }
            }
            if first && self.written == 0 && !self.body_done && self.queue.is_empty() {
                let head_only = self.out.len() == self.head_len;
                if head_only {
                    self.deferred = true;
                    return Poll::Pending;
                }
            }
            if self.buffered() == 0 {
                let Some(io) = conn.as_mut() else {
                    return Poll::Ready(Err(UpstreamError::Closed));
                };
                match Pin::new(io).poll_flush(cx) {
                    Poll::Ready(Ok(())) => {}
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(UpstreamError::Io(e))),
                    Poll::Pending => return Poll::Pending,
                }
                if self.body_done {
                    self.sent = true;
                    return Poll::Ready(Ok(()));
                }
                return Poll::Pending;
            }
            match self.poll_write_buffered(conn, cx) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
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

/// The request head as it goes to the upstream, written once as HTTP/1.1 bytes: the method,
/// the prefixed path and query, the end-to-end headers (names lower-case, in the order of the
/// client's header table), `Host` when the client sent none, `X-Forwarded-For`, and the framing
/// of the body. `None` when the target holds a byte a request line cannot carry.
pub(in crate::http::proxy) fn request_head(
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
pub(in crate::http::proxy) fn upstream_request(
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
