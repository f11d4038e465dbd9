//! The upstream client: address and TLS name from the upstream URL, connecting (TCP, then TLS),
//! a pool of idle connections, and the exchange of one request and its answer on one of them,
//! HTTP/1.1 written and read here on the request's own task.

use super::body::ProxyBody;
use super::headers::{connection_named, parse_length, skip_header, Framing};
use crate::admission::Slot;
use crate::config::UpstreamUrl;
use actix_web::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures_util::Stream;
use rustls::pki_types::ServerName;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// TLS to an `https://` upstream.
#[derive(Debug, Clone)]
pub(crate) struct UpstreamTls {
    /// Certificate verification ([`crate::tls::client_config`]) and ALPN `http/1.1` only.
    pub(super) config: Arc<rustls::ClientConfig>,
    /// The name the certificate must hold: a DNS name, also sent as SNI; or an IP address,
    /// which is sent no SNI and must be one of the certificate's IP addresses.
    pub(super) name: ServerName<'static>,
}

impl UpstreamTls {
    /// TLS for the `https://` URL `base`, verified by `client` (whose ALPN is replaced by
    /// `http/1.1`: the connection speaks HTTP/1.1 only).
    pub(crate) fn new(base: &UpstreamUrl, client: &rustls::ClientConfig) -> Result<Self, String> {
        let host = base.host();
        let name = ServerName::try_from(host.to_owned())
            .map_err(|e| format!("`{host}` is not a host name TLS can verify: {e}"))?;
        let mut config = client.clone();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self {
            config: Arc::new(config),
            name,
        })
    }
}

/// Idle connections a worker keeps for reuse; more are closed when they finish.
const MAX_IDLE_CONNECTIONS: usize = 1024;

/// HTTP/1.1 keep-alive connections to the upstream, for one worker thread. A request takes the
/// most recently used idle connection or opens a new one, writes its head and body and reads
/// the answer on it inside its own task (no task per connection, no channel between them), and
/// the connection goes back to the pool when the request has been written whole and the
/// answer read to its end, with nothing after it.
pub(crate) struct UpstreamClient {
    /// `host:port` to connect to.
    pub(super) addr: String,
    /// `Host` for requests that arrived without one.
    pub(super) host: String,
    /// The upstream's path prefix (may be empty).
    pub(super) prefix: String,
    pub(super) connect_timeout: Duration,
    pub(super) tls: Option<UpstreamTls>,
    pub(super) idle: Rc<Pool>,
}

/// A byte stream to the upstream: plain TCP, or TLS over it.
pub(super) enum Io {
    Plain(tokio::net::TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>),
}

impl AsyncRead for Io {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Io {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

impl Io {
    /// Whether an idle connection is still open with nothing unasked-for on it. The socket is
    /// asked itself (a peek that must find nothing to read yet), not the runtime's record of
    /// readiness, which lags behind what has arrived until the worker next polls its events:
    /// bytes that arrived an instant ago count. The end of the stream (the upstream closed it),
    /// an error, bytes nobody asked for, or for TLS any record or plaintext not yet read all
    /// mean it cannot carry a request.
    pub(super) fn idle_and_open(&mut self) -> bool {
        match self {
            Io::Plain(s) => nothing_to_read(s),
            Io::Tls(s) => {
                let (tcp, conn) = s.get_mut();
                let quiet = conn.process_new_packets().is_ok_and(|state| {
                    state.plaintext_bytes_to_read() == 0 && !state.peer_has_closed()
                });
                quiet && nothing_to_read(tcp)
            }
        }
    }
}

/// One non-blocking peek at the socket finds nothing: `WouldBlock`. A byte, the end of the
/// stream or an error all say the connection is not idle.
fn nothing_to_read(s: &tokio::net::TcpStream) -> bool {
    let mut probe = [MaybeUninit::<u8>::uninit(); 1];
    match socket2::SockRef::from(s).peek(&mut probe) {
        Err(e) => e.kind() == std::io::ErrorKind::WouldBlock,
        Ok(_) => false,
    }
}

/// Idle upstream connections, most recently used last.
#[derive(Default)]
pub(super) struct Pool(RefCell<Vec<Io>>);

/// How many idle connections a request looks at before it opens a new one.
const IDLE_PROBES: usize = 4;

impl Pool {
    /// An idle connection still open; closed ones are dropped on the way.
    fn take(&self) -> Option<Io> {
        let mut idle = self.0.borrow_mut();
        for _ in 0..IDLE_PROBES {
            let mut conn = idle.pop()?;
            if conn.idle_and_open() {
                return Some(conn);
            }
        }
        None
    }

    fn put_back(&self, conn: Io) {
        let mut idle = self.0.borrow_mut();
        if idle.len() < MAX_IDLE_CONNECTIONS {
            idle.push(conn);
        }
    }
}

/// Why a request did not reach the upstream, or its answer did not come back whole.
#[derive(Debug)]
pub(super) enum UpstreamError {
    Connect(std::io::Error),
    ConnectTimeout,
    /// The TLS handshake failed (a certificate that does not verify, among others).
    Tls(std::io::Error),
    /// The WebSocket handshake's HTTP/1 client failed.
    Http(hyper::Error),
    /// Reading from or writing to the upstream failed.
    Io(std::io::Error),
    /// The upstream closed the connection before its answer was complete.
    Closed,
    /// The upstream's answer is not HTTP/1.1 that can be read safely.
    Protocol(&'static str),
    /// The client's body failed (the body's watch says how).
    Body,
    /// Nothing moved for the read timeout.
    Silent,
}

impl UpstreamError {
    pub(super) fn timed_out(&self) -> bool {
        matches!(self, UpstreamError::ConnectTimeout | UpstreamError::Silent)
    }
}

impl std::fmt::Display for UpstreamError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UpstreamError::Connect(e) => write!(f, "cannot connect: {e}"),
            UpstreamError::ConnectTimeout => f.write_str("connect timed out"),
            UpstreamError::Tls(e) => write!(f, "TLS handshake failed: {e}"),
            UpstreamError::Http(e) => match std::error::Error::source(e) {
                Some(cause) => write!(f, "{e}: {cause}"),
                None => write!(f, "{e}"),
            },
            UpstreamError::Io(e) => write!(f, "connection error: {e}"),
            UpstreamError::Closed => {
                f.write_str("connection closed before the answer was complete")
            }
            UpstreamError::Protocol(why) => write!(f, "invalid answer: {why}"),
            UpstreamError::Body => f.write_str("the request body failed"),
            UpstreamError::Silent => f.write_str("no answer within the read timeout"),
        }
    }
}

impl std::error::Error for UpstreamError {}

impl UpstreamClient {
    pub(super) async fn tcp(&self) -> Result<tokio::net::TcpStream, UpstreamError> {
        match tokio::time::timeout(
            self.connect_timeout,
            tokio::net::TcpStream::connect(&self.addr),
        )
        .await
        {
            Ok(Ok(s)) => {
                let _ = s.set_nodelay(true);
                Ok(s)
            }
            Ok(Err(e)) => Err(UpstreamError::Connect(e)),
            Err(_) => Err(UpstreamError::ConnectTimeout),
        }
    }

    /// TLS over `stream`, the handshake bounded by the connect timeout.
    pub(super) async fn tls(
        &self,
        tls: &UpstreamTls,
        stream: tokio::net::TcpStream,
    ) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, UpstreamError> {
        let connector = tokio_rustls::TlsConnector::from(tls.config.clone());
        match tokio::time::timeout(
            self.connect_timeout,
            connector.connect(tls.name.clone(), stream),
        )
        .await
        {
            Ok(Ok(s)) => Ok(s),
            Ok(Err(e)) => Err(UpstreamError::Tls(e)),
            Err(_) => Err(UpstreamError::ConnectTimeout),
        }
    }

    async fn connect(&self) -> Result<Io, UpstreamError> {
        let stream = self.tcp().await?;
        match &self.tls {
            None => Ok(Io::Plain(stream)),
            Some(tls) => match self.tls(tls, stream).await {
                Ok(s) => Ok(Io::Tls(Box::new(s))),
                Err(e) => {
                    if let UpstreamError::Tls(why) = &e {
                        tracing::warn!(service = "upstream", reason = %why, "TLS handshake with the upstream failed");
                    }
                    Err(e)
                }
            },
        }
    }

    /// For an `https://` upstream: connect and shake hands once, nothing sent. `Ok` when the
    /// upstream was not reached (that is for requests to find out), `Err` with the reason when
    /// it was and its certificate does not verify.
    pub(crate) async fn check_certificate(&self) -> Result<(), String> {
        let Some(tls) = &self.tls else {
            return Ok(());
        };
        let stream = match self.tcp().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(upstream = %self.addr, error = %e, "the upstream cannot be reached at start; starting anyway (requests get 502 until it answers)");
                return Ok(());
            }
        };
        match self.tls(tls, stream).await {
            Ok(_) => Ok(()),
            Err(UpstreamError::Tls(e)) if certificate_refused(&e) => Err(e.to_string()),
            Err(e) => {
                tracing::warn!(error = %e, "the TLS handshake with the upstream failed at start; starting anyway");
                Ok(())
            }
        }
    }

    /// Send `head` and `body` on a pooled connection (on another, or a new one, when one fails
    /// before it took a byte) and read the answer's head and the first piece of its body
    /// (`None`: it has none, or it ended). The rest of the answer's body is read
    /// by the [`Exchange`] that comes with it, which also sends what is left of the request's
    /// body and hands the connection back to the pool at the end.
    pub(super) async fn send(
        &self,
        head: BytesMut,
        body: ProxyBody,
        framing: Framing,
        method_is_head: bool,
        watch: &super::body::BodyWatch,
    ) -> Result<(Head, Exchange, Option<Bytes>), UpstreamError> {
        let mut x = Exchange::new(head, body, framing, method_is_head, self.idle.clone());
        for attempt in 0..3 {
            let pooled = if attempt < 2 { self.idle.take() } else { None };
            x.io = Some(match pooled {
                Some(io) => io,
                None => self.connect().await?,
            });
            match std::future::poll_fn(|cx| x.poll_head(cx)).await {
                Ok(head) => {
                    // The answer's head goes to the client with the first of its body (or its
                    // end): an answer whose framing breaks at once is a 502, not a status line
                    // the client never gets. The upstream's silence counts from the head.
                    watch.touch();
                    return match std::future::poll_fn(|cx| x.poll_first(cx)).await {
                        Ok(first) => Ok((head, x, first)),
                        Err(e) => {
                            x.abandon();
                            Err(e)
                        }
                    };
                }
                // A connection (pooled, or closed while the head waited for the body) that
                // failed before it took any of the request.
                Err(UpstreamError::Io(_) | UpstreamError::Closed) if x.written == 0 => {
                    x.abandon();
                }
                Err(e) => {
                    x.abandon();
                    return Err(e);
                }
            }
        }
        Err(UpstreamError::Closed)
    }
}

/// Whether a failed TLS handshake failed on the peer's certificate.
fn certificate_refused(e: &std::io::Error) -> bool {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        .is_some_and(|e| {
            matches!(
                e,
                rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented
            )
        })
}

/// The answer's head as the client gets it: the status and the end-to-end headers (in a
/// response from the server's own pool of heads), and the length it declares (the client's
/// framing).
pub(super) struct Head {
    pub(super) res: HttpResponse,
    /// The first `Content-Length` value, read as the client's framing reads it.
    pub(super) length: Option<u64>,
}

/// The most header lines an answer's head may carry (as hyper's client).
const MAX_HEADERS: usize = 100;
/// The most bytes an answer's head may take (as hyper's client: 8 KiB and 4 KiB a header).
const MAX_HEAD: usize = 8192 + 4096 * MAX_HEADERS;
/// The most bytes a chunk-size line (extensions included) or all the trailers may take.
const MAX_CHUNK_LINE: usize = 4096;
const MAX_TRAILERS: usize = 16 * 1024;
/// Body chunks up to this size are copied behind the head (one write); larger ones are written
/// as they are.
const COPY_UP_TO: usize = 8 * 1024;
/// Request bytes taken from the client before the upstream has to take some.
const WRITE_AHEAD: usize = 64 * 1024;
/// Bytes read at a time.
const READ_SIZE: usize = 8 * 1024;

/// How what is left of the answer's body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reading {
    /// This many bytes more.
    Length(u64),
    /// Chunked, at this point of the chunk framing.
    Chunked(Chunk),
    /// Until the upstream closes the connection.
    Close,
    /// The body has ended.
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// A chunk-size line.
    Size,
    /// This many bytes of a chunk's data.
    Data(u64),
    /// The CRLF after a chunk's data.
    DataEnd,
    /// Trailer lines, this many bytes so far, until an empty line.
    Trailers(usize),
}

/// One request on one upstream connection: the request's head and body written (the body as
/// the client sends it, framed by `Content-Length` or chunked), the answer read. Driven by the
/// request's own task: first by [`UpstreamClient::send`] until the answer's head, then by the
/// answer's body, which keeps sending what is left of the request while it reads.
pub(super) struct Exchange {
    io: Option<Io>,
    /// What was read and not yet used.
    read: BytesMut,
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
    method_is_head: bool,
    reading: Reading,
    /// The upstream keeps the connection open after this answer, and nothing about the
    /// answer leaves doubt where it ended: it is not a HEAD's, a 204 or a 304 (after which a
    /// buggy upstream may still send the body it thinks it owes), and it did not come before
    /// the request was written whole (an upstream that answers without reading the body may
    /// read that body as a request of its own and answer it too).
    keep_alive: bool,
    pool: Rc<Pool>,
}

impl Exchange {
    fn new(
        head: BytesMut,
        body: ProxyBody,
        framing: Framing,
        method_is_head: bool,
        pool: Rc<Pool>,
    ) -> Self {
        let (body, owed) = match framing {
            // A body the framing does not carry is never read (as hyper's client).
            Framing::None => (ProxyBody::Empty, 0),
            Framing::Length(n) => (body, n),
            Framing::Chunked => (body, 0),
        };
        Self {
            io: None,
            read: BytesMut::new(),
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
            method_is_head,
            reading: Reading::Done,
            keep_alive: false,
            pool,
        }
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
    fn poll_write_buffered(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), UpstreamError>> {
        let Some(io) = self.io.as_mut() else {
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
    fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), UpstreamError>> {
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
                let Some(io) = self.io.as_mut() else {
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
            match self.poll_write_buffered(cx) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    /// Read more of the answer: `Ready(Ok(0))` at the end of the stream.
    fn poll_fill(
        &mut self,
        cx: &mut Context<'_>,
        want: usize,
    ) -> Poll<Result<usize, UpstreamError>> {
        let Some(io) = self.io.as_mut() else {
            return Poll::Ready(Err(UpstreamError::Closed));
        };
        if self.read.capacity() - self.read.len() < want.min(READ_SIZE) {
            self.read.reserve(want);
        }
        match tokio_util::io::poll_read_buf(Pin::new(io), cx, &mut self.read) {
            Poll::Ready(Ok(n)) => Poll::Ready(Ok(n)),
            Poll::Ready(Err(e)) => Poll::Ready(Err(UpstreamError::Io(e))),
            Poll::Pending => Poll::Pending,
        }
    }

    /// Send the request and read the answer's head (informational answers skipped).
    fn poll_head(&mut self, cx: &mut Context<'_>) -> Poll<Result<Head, UpstreamError>> {
        match self.poll_send(cx) {
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            // Nothing asked yet: nothing to read.
            Poll::Pending if self.written == 0 => return Poll::Pending,
            _ => {}
        }
        loop {
            if !self.read.is_empty() {
                match self.parse_head()? {
                    Parsed::Head(head) => return Poll::Ready(Ok(head)),
                    Parsed::Informational => continue,
                    Parsed::Partial => {}
                }
            }
            if self.read.len() >= MAX_HEAD {
                return Poll::Ready(Err(UpstreamError::Protocol(
                    "the answer's head is too large",
                )));
            }
            match self.poll_fill(cx, READ_SIZE) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(UpstreamError::Closed)),
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    /// The answer's head, if the buffer holds all of it: its status and end-to-end headers,
    /// and how its body is delimited (RFC 9112 section 6.3, as hyper's client reads it).
    fn parse_head(&mut self) -> Result<Parsed, UpstreamError> {
        let mut slots = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
        let mut res = httparse::Response::new(&mut []);
        let used = match httparse::ParserConfig::default()
            .parse_response_with_uninit_headers(&mut res, &self.read, &mut slots)
        {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => return Ok(Parsed::Partial),
            Err(httparse::Error::TooManyHeaders) => {
                return Err(UpstreamError::Protocol("too many header lines"))
            }
            Err(_) => return Err(UpstreamError::Protocol("the answer's head does not parse")),
        };
        // Lines end in CRLF only: a bare LF that a lenient parser takes for a line break (and
        // so a header of the upstream's text: `X-L: a\nSet-Cookie: x`), or a bare CR, is refused.
        if !crlf_only(&self.read[..used]) {
            return Err(UpstreamError::Protocol(
                "a bare LF or CR in the answer's head",
            ));
        }
        let code = res.code.unwrap_or(0);
        let http10 = res.version == Some(0);
        match code {
            101 => {
                return Err(UpstreamError::Protocol(
                    "101 Switching Protocols to a request that asked for no upgrade",
                ))
            }
            100..=199 => {
                self.read.advance(used);
                return Ok(Parsed::Informational);
            }
            _ => {}
        }
        let status =
            StatusCode::from_u16(code).map_err(|_| UpstreamError::Protocol("invalid status"))?;
        // What frames the body, and whether the connection stays open.
        let (mut te, mut te_chunked, mut cl, mut cl_bad, mut first_cl) =
            (false, false, None::<u64>, false, None);
        let (mut close, mut keep_alive, mut connection) = (false, false, false);
        for h in res.headers.iter() {
            let name = h.name;
            if name.eq_ignore_ascii_case("transfer-encoding") {
                if !h
                    .value
                    .iter()
                    .all(|&b| b == b' ' || b == b'\t' || (0x21..=0x7e).contains(&b))
                {
                    // Read as text or as bytes, its codings are not one list.
                    return Err(UpstreamError::Protocol("an unreadable Transfer-Encoding"));
                }
                te = true;
                te_chunked = last_token_is(h.value, b"chunked");
            } else if name.eq_ignore_ascii_case("content-length") {
                if first_cl.is_none() {
                    first_cl = Some(parse_length(Some(h.value)));
                }
                for part in h.value.split(|&b| b == b',') {
                    match digits(trim(part)) {
                        Some(n) if cl.is_none_or(|c| c == n) => cl = Some(n),
                        _ => cl_bad = true,
                    }
                }
            } else if name.eq_ignore_ascii_case("connection") {
                connection = true;
                for token in h.value.split(|&b| b == b',') {
                    let token = trim(token);
                    close |= token.eq_ignore_ascii_case(b"close");
                    keep_alive |= token.eq_ignore_ascii_case(b"keep-alive");
                }
            }
        }
        if te && first_cl.is_some() {
            // Read as chunked, a length beside it would be the client's framing: it is the
            // answer that is wrong, so it goes no further (hyper reads the chunks and passes
            // the length on, cutting the body the client gets).
            return Err(UpstreamError::Protocol(
                "both Transfer-Encoding and Content-Length",
            ));
        }
        let bodiless = code == 204 || code == 304 || self.method_is_head;
        let reading = if bodiless {
            Reading::Done
        } else if te {
            if http10 {
                return Err(UpstreamError::Protocol("Transfer-Encoding in HTTP/1.0"));
            }
            if te_chunked {
                Reading::Chunked(Chunk::Size)
            } else {
                Reading::Close
            }
        } else if let (Some(n), false) = (cl, cl_bad) {
            Reading::Length(n)
        } else if first_cl.is_some() {
            return Err(UpstreamError::Protocol("invalid Content-Length"));
        } else {
            Reading::Close
        };
        self.keep_alive = if http10 { keep_alive } else { !close }
            && reading != Reading::Close
            && !bodiless
            && self.sent;
        self.reading = match reading {
            Reading::Length(0) => Reading::Done,
            r => r,
        };
        let named = if connection {
            connection_named(
                res.headers
                    .iter()
                    .filter(|h| h.name.eq_ignore_ascii_case("connection"))
                    .map(|h| h.value),
            )
        } else {
            Vec::new()
        };
        let mut back = HttpResponse::new(status);
        let headers = back.headers_mut();
        for h in res.headers.iter() {
            let Ok(name) = HeaderName::from_bytes(h.name.as_bytes()) else {
                continue;
            };
            if skip_header(name.as_str(), &named) {
                continue;
            }
            if let Ok(value) = HeaderValue::from_bytes(h.value) {
                headers.append(name, value);
            }
        }
        let head = Head {
            res: back,
            length: first_cl.flatten(),
        };
        self.read.advance(used);
        Ok(Parsed::Head(head))
    }

    /// The first piece of the answer's body (`None` when it has none), sending what is left of
    /// the request meanwhile.
    fn poll_first(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<Bytes>, UpstreamError>> {
        if let Poll::Ready(Err(e)) = self.poll_send(cx) {
            return Poll::Ready(Err(e));
        }
        match ready!(self.poll_data(cx)) {
            Some(Ok(data)) => Poll::Ready(Ok(Some(data))),
            Some(Err(e)) => Poll::Ready(Err(e)),
            None => Poll::Ready(Ok(None)),
        }
    }

    /// Whether the answer has been read to its end.
    pub(super) fn answered(&self) -> bool {
        self.reading == Reading::Done
    }

    /// The next piece of the answer's body; `None` at its end.
    fn poll_data(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, UpstreamError>>> {
        loop {
            match self.reading {
                Reading::Done => return Poll::Ready(None),
                Reading::Length(left) => {
                    if !self.read.is_empty() {
                        let n = left.min(self.read.len() as u64);
                        let data = self.read.split_to(n as usize).freeze();
                        self.reading = match left - n {
                            0 => Reading::Done,
                            left => Reading::Length(left),
                        };
                        return Poll::Ready(Some(Ok(data)));
                    }
                    let want = usize::try_from(left).unwrap_or(usize::MAX).min(64 * 1024);
                    match ready!(self.poll_fill(cx, want)) {
                        Ok(0) => return Poll::Ready(Some(Err(UpstreamError::Closed))),
                        Ok(_) => {}
                        Err(e) => return Poll::Ready(Some(Err(e))),
                    }
                }
                Reading::Close => {
                    if !self.read.is_empty() {
                        return Poll::Ready(Some(Ok(self.read.split().freeze())));
                    }
                    match ready!(self.poll_fill(cx, 64 * 1024)) {
                        Ok(0) => {
                            self.reading = Reading::Done;
                            return Poll::Ready(None);
                        }
                        Ok(_) => {}
                        Err(e) => return Poll::Ready(Some(Err(e))),
                    }
                }
                Reading::Chunked(chunk) => match self.step_chunked(chunk) {
                    Err(e) => return Poll::Ready(Some(Err(e))),
                    Ok(Some(data)) => return Poll::Ready(Some(Ok(data))),
                    Ok(None) if self.reading != Reading::Chunked(chunk) => {}
                    Ok(None) => match ready!(self.poll_fill(cx, READ_SIZE)) {
                        Ok(0) => return Poll::Ready(Some(Err(UpstreamError::Closed))),
                        Ok(_) => {}
                        Err(e) => return Poll::Ready(Some(Err(e))),
                    },
                },
            }
        }
    }

    /// One step of the chunked framing over what was read: data, or a move to the next
    /// state (`Ok(None)`, `self.reading` changed), or `Ok(None)` with nothing changed when more
    /// must be read.
    fn step_chunked(&mut self, chunk: Chunk) -> Result<Option<Bytes>, UpstreamError> {
        match chunk {
            Chunk::Size => {
                let Some(eol) = self.read.iter().position(|&b| b == b'\n') else {
                    return if self.read.len() > MAX_CHUNK_LINE {
                        Err(UpstreamError::Protocol("chunk-size line too long"))
                    } else {
                        Ok(None)
                    };
                };
                let size = chunk_size(&self.read[..eol])
                    .ok_or(UpstreamError::Protocol("invalid chunk-size line"))?;
                self.read.advance(eol + 1);
                self.reading = Reading::Chunked(match size {
                    0 => Chunk::Trailers(0),
                    n => Chunk::Data(n),
                });
                Ok(None)
            }
            Chunk::Data(left) => {
                if self.read.is_empty() {
                    return Ok(None);
                }
                let n = left.min(self.read.len() as u64);
                let data = self.read.split_to(n as usize).freeze();
                self.reading = Reading::Chunked(match left - n {
                    0 => Chunk::DataEnd,
                    left => Chunk::Data(left),
                });
                Ok(Some(data))
            }
            Chunk::DataEnd => {
                if self.read.len() < 2 {
                    return match self.read.first() {
                        Some(b'\r') | None => Ok(None),
                        Some(_) => Err(UpstreamError::Protocol("chunk data without its CRLF")),
                    };
                }
                if &self.read[..2] != b"\r\n" {
                    return Err(UpstreamError::Protocol("chunk data without its CRLF"));
                }
                self.read.advance(2);
                self.reading = Reading::Chunked(Chunk::Size);
                Ok(None)
            }
            Chunk::Trailers(seen) => {
                let Some(eol) = self.read.iter().position(|&b| b == b'\n') else {
                    return if seen + self.read.len() > MAX_TRAILERS {
                        Err(UpstreamError::Protocol("trailers too large"))
                    } else {
                        Ok(None)
                    };
                };
                let line = &self.read[..eol];
                if line.last() != Some(&b'\r') || line[..line.len() - 1].contains(&b'\r') {
                    return Err(UpstreamError::Protocol("trailer line without CRLF"));
                }
                let empty = eol == 1;
                if !empty && !trailer_field(&line[..line.len() - 1]) {
                    return Err(UpstreamError::Protocol(
                        "a trailer line that is not a field",
                    ));
                }
                self.read.advance(eol + 1);
                let seen = seen + eol + 1;
                if seen > MAX_TRAILERS {
                    return Err(UpstreamError::Protocol("trailers too large"));
                }
                self.reading = if empty {
                    Reading::Done
                } else {
                    Reading::Chunked(Chunk::Trailers(seen))
                };
                Ok(None)
            }
        }
    }

    /// Give the connection back to the pool if it can carry another request: the request
    /// written whole, the answer read to its end with nothing after it, and the upstream
    /// keeping it open. Otherwise it is closed.
    pub(super) fn finish(&mut self) {
        if let Some(mut io) = self.io.take() {
            if self.keep_alive
                && self.sent
                && self.reading == Reading::Done
                && self.read.is_empty()
                && io.idle_and_open()
            {
                self.pool.put_back(io);
            }
        }
    }

    /// Close the connection: it failed, or what is on it can no longer be trusted.
    fn abandon(&mut self) {
        self.io = None;
    }
}

impl Drop for Exchange {
    fn drop(&mut self) {
        self.finish();
    }
}

/// Status, the headers passed on (names lower case, in order), the declared length, the body.
#[cfg(any(test, feature = "fuzzing"))]
pub(super) type ReadAnswer = (u16, Vec<(String, Vec<u8>)>, Option<u64>, Vec<u8>);

/// An answer as this client reads it from `bytes` (everything the upstream sent, then the end
/// of the stream), to a request written whole: its status, the headers it passes on, the
/// length it declares to the client, its body; or why it is refused. For the differential
/// check against hyper's client ([`super::differential`]).
#[cfg(any(test, feature = "fuzzing"))]
pub(super) fn read_answer(bytes: &[u8], method_is_head: bool) -> Result<ReadAnswer, String> {
    let mut x = Exchange::new(
        BytesMut::new(),
        ProxyBody::Empty,
        Framing::None,
        method_is_head,
        Rc::new(Pool::default()),
    );
    x.sent = true;
    x.read.extend_from_slice(bytes);
    let head = loop {
        match x.parse_head().map_err(|e| e.to_string())? {
            Parsed::Head(head) => break head,
            Parsed::Informational => continue,
            Parsed::Partial => return Err("the head is incomplete".to_owned()),
        }
    };
    let status = head.res.status().as_u16();
    let headers = head
        .res
        .headers()
        .iter()
        .map(|(k, v)| (k.as_str().to_owned(), v.as_bytes().to_vec()))
        .collect();
    let mut body = Vec::new();
    if !matches!(status, 204 | 304) {
        let mut cx = Context::from_waker(futures_util::task::noop_waker_ref());
        loop {
            match x.poll_data(&mut cx) {
                Poll::Ready(Some(Ok(data))) => body.extend_from_slice(&data),
                Poll::Ready(None) => break,
                // The end of the stream ends an answer read until the connection closes.
                Poll::Ready(Some(Err(UpstreamError::Closed)))
                    if x.reading == Reading::Close && x.read.is_empty() =>
                {
                    break
                }
                Poll::Ready(Some(Err(e))) => return Err(e.to_string()),
                Poll::Pending => return Err("waits for more".to_owned()),
            }
        }
    }
    x.abandon();
    Ok((status, headers, head.length, body))
}

enum Parsed {
    Head(Head),
    Informational,
    Partial,
}

/// A trailer line (without its CRLF) that is a field: a name of token characters, a colon,
/// and a value of visible bytes, spaces and tabs (obsolete text above 0x7f allowed, as in a
/// head).
fn trailer_field(line: &[u8]) -> bool {
    let Some(colon) = line.iter().position(|&b| b == b':') else {
        return false;
    };
    let (name, value) = (&line[..colon], &line[colon + 1..]);
    !name.is_empty()
        && name
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
        && value
            .iter()
            .all(|&b| b == b'\t' || b == b' ' || (0x21..=0x7e).contains(&b) || b >= 0x80)
}

/// Whether every LF in `head` ends a CRLF and every CR begins one.
fn crlf_only(head: &[u8]) -> bool {
    let mut prev = 0u8;
    for (i, &b) in head.iter().enumerate() {
        match b {
            b'\n' if prev != b'\r' => return false,
            b'\r' if head.get(i + 1) != Some(&b'\n') => return false,
            _ => {}
        }
        prev = b;
    }
    true
}

/// `value` without leading and trailing spaces and tabs.
fn trim(mut value: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = value {
        value = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = value {
        value = rest;
    }
    value
}

/// Decimal digits only (no sign, no space), as a `u64`.
fn digits(value: &[u8]) -> Option<u64> {
    if value.is_empty() {
        return None;
    }
    value.iter().try_fold(0u64, |n, &b| {
        if b.is_ascii_digit() {
            n.checked_mul(10)?.checked_add(u64::from(b - b'0'))
        } else {
            None
        }
    })
}

/// Whether the last comma-separated token of `value` is `token` (any case).
fn last_token_is(value: &[u8], token: &[u8]) -> bool {
    value
        .rsplit(|&b| b == b',')
        .next()
        .is_some_and(|t| trim(t).eq_ignore_ascii_case(token))
}

/// A chunk-size line up to its LF: hex digits, optional spaces or tabs, optional extensions
/// after `;` (no control character but a tab), then CR.
fn chunk_size(line: &[u8]) -> Option<u64> {
    let line = line.strip_suffix(b"\r")?;
    let end = line
        .iter()
        .position(|b| !b.is_ascii_hexdigit())
        .unwrap_or(line.len());
    if end == 0 {
        return None;
    }
    let size = line[..end].iter().try_fold(0u64, |n, &b| {
        let d = (b as char).to_digit(16)?;
        n.checked_mul(16)?.checked_add(u64::from(d))
    })?;
    let rest = trim(&line[end..]);
    let ok = match rest {
        [] => true,
        [b';', ext @ ..] => ext.iter().all(|&b| b == b'\t' || (b >= b' ' && b != 0x7f)),
        _ => false,
    };
    ok.then_some(size)
}

/// The upstream's answer body, read on the request's own task, which also sends what is left
/// of the request's body; the admission slot is held until the body ends or is dropped.
pub(super) struct ExchangeBody {
    pub(super) x: Exchange,
    pub(super) slot: Option<Slot>,
    /// What was read of the body before the head went to the client.
    pub(super) first: Option<Bytes>,
    /// The client's socket and the read timeout: a client that does not take a piece within
    /// it has its connection ended ([`super::stall`]), watched from the first piece on.
    pub(super) stall: Option<(super::stall::ClientSocket, Duration)>,
    pub(super) taken: Option<Rc<super::stall::Taken>>,
}

impl ExchangeBody {
    /// A piece of the answer goes to the client's side: from now on it must be taken.
    fn give(&mut self, data: Bytes) -> Poll<Option<Result<Bytes, UpstreamError>>> {
        if self.taken.is_none() && !self.x.answered() {
            if let Some((socket, limit)) = self.stall {
                self.taken = Some(super::stall::watch(socket, limit));
            }
        }
        if let Some(t) = &self.taken {
            t.given();
        }
        Poll::Ready(Some(Ok(data)))
    }
}

impl Stream for ExchangeBody {
    type Item = Result<Bytes, UpstreamError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if let Some(t) = &this.taken {
            t.asked();
        }
        if let Some(first) = this.first.take() {
            return this.give(first);
        }
        if this.x.answered() {
            // Read to its end (the connection finished with) before the client took it all.
            this.x.finish();
            this.slot = None;
            this.taken = None;
            return Poll::Ready(None);
        }
        if let Poll::Ready(Err(e)) = this.x.poll_send(cx) {
            this.x.abandon();
            this.slot = None;
            return Poll::Ready(Some(Err(e)));
        }
        match this.x.poll_data(cx) {
            Poll::Ready(Some(Ok(data))) => this.give(data),
            Poll::Ready(Some(Err(e))) => {
                this.x.abandon();
                this.slot = None;
                this.taken = None;
                Poll::Ready(Some(Err(e)))
            }
            Poll::Ready(None) => {
                this.x.finish();
                this.slot = None;
                this.taken = None;
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
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
