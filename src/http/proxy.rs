//! Streaming forwarding to the upstream API: method, query, headers and body go through
//! unchanged (less hop-by-hop headers, plus `X-Forwarded-For`), and the path is the canonical
//! one the limiter decided on (the middleware rewrote the request to it); the response streams
//! back.
//! Bodies are never buffered, so a large download passes with flat memory.
//!
//! The read timeout bounds silence, not size: the upstream must take a chunk of the request
//! body, send its answer's head after the body is complete, and send each next chunk of its
//! answer, within `read_timeout` of the last thing that moved. A long upload or download that
//! keeps moving is never cut off; one that stalls ends with a 504 (or a truncated answer, when
//! the stall comes after the head was sent), never a hang.
//!
//! The client's side is bounded the same way ([`pace`]): the gateway waits at most
//! `body_timeout` for each next chunk of the request body, and once it has waited the grace
//! period in all, the body must keep an average of `body_min_rate` bytes per second. A body that
//! breaks either rule is cut off: the upstream request is aborted (its connection closed, never
//! pooled) and the client gets a 408, or, when the upstream has already answered, the end of
//! that answer. Time spent waiting on the upstream to take the body never counts against the
//! client, and time spent waiting on the client never counts against the upstream.
//!
//! A WebSocket handshake (`Connection: upgrade`, `Upgrade: websocket`) goes its own way
//! (the [`upgrade`] module): a place among the open upgraded connections (in all and per client
//! address), a fresh upstream connection, and on `101` the two connections spliced.
//!
//! With admission control on, a request holding a slot may keep the gateway waiting for its
//! body for at most its group's `body_hold` in all (a third pace rule): a body trickled just
//! above the minimum rate is cut off then (408) and its slot given back.

pub mod pace;
pub mod upgrade;

use crate::admission::{Admission, Slot};
use crate::config::UpstreamUrl;
use crate::decision::Decider;
use crate::http::response::Problem;
use crate::metrics::{AdmissionMeter, Metrics, ShedReason};
use actix_web::body::{BodyStream, SizedStream};
use actix_web::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use actix_web::http::ConnectionType;
use actix_web::{web, HttpRequest, HttpResponse};
use bytes::Bytes;
use futures_util::future::{select, Either};
use futures_util::{Stream, StreamExt};
use http_body::{Body, Frame, SizeHint};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use pace::{BodyPace, BodyRules, Trip};
use rustls::pki_types::ServerName;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::{pin, Pin};
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// Where allowed requests go.
#[derive(Debug, Clone)]
pub struct Upstream {
    /// The upstream's URL: scheme, host, port and path prefix.
    pub base: UpstreamUrl,
    pub connect_timeout: Duration,
    pub read_timeout: Duration,
    /// The pace the client's request body must keep.
    pub body: BodyRules,
    /// For an `https://` base: how its certificate is checked.
    pub tls: Option<UpstreamTls>,
    /// Where the proxy counts upstream answers, failures, slow bodies and upgrades: the
    /// gateway's decider's metrics.
    pub metrics: Arc<Metrics>,
    /// Admission control (`[admission]`): the slots a request takes before it is forwarded;
    /// `None` forwards every allowed request at once.
    pub admission: Option<Arc<Admission>>,
    /// The places for upgraded (WebSocket) connections, shared by every worker.
    pub upgrades: Arc<upgrade::Upgrades>,
    /// Who a request's client is, for the caps per client address.
    pub clients: ClientAddresses,
}

/// Who a request's client is, for the caps per client address: the limiter's client IP (the
/// peer, or the rightmost untrusted hop behind the trusted proxies of the settings in force),
/// normalised as keys are ([`crate::client_share::client_address`]).
#[derive(Clone)]
pub struct ClientAddresses(Option<Arc<Decider>>);

impl std::fmt::Debug for ClientAddresses {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.0 {
            Some(_) => "ClientAddresses(the decider's trusted proxies)",
            None => "ClientAddresses(the peer)",
        })
    }
}

impl ClientAddresses {
    /// Read through `decider`'s settings (trusted proxies and IPv6 prefix), reloads included.
    pub fn new(decider: Arc<Decider>) -> Self {
        Self(Some(decider))
    }

    /// The peer itself, with the default IPv6 prefix: for an app with no trusted proxies.
    pub fn peer_only() -> Self {
        Self(None)
    }

    /// The client address of `req`.
    pub fn of(&self, req: &HttpRequest) -> std::net::IpAddr {
        let peer = req
            .peer_addr()
            .map_or(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), |a| {
                a.ip()
            });
        match &self.0 {
            None => crate::client_share::client_address(peer, crate::config::defaults::IPV6_PREFIX),
            Some(decider) => {
                let settings = decider.settings();
                let forwarded = req
                    .headers()
                    .get_all(settings.trusted.header.header_name())
                    .map(HeaderValue::as_bytes);
                let ip = crate::client_ip::client_ip(peer, forwarded, &settings.trusted);
                crate::client_share::client_address(ip, settings.ipv6_prefix)
            }
        }
    }
}

/// TLS to an `https://` upstream.
#[derive(Debug, Clone)]
pub struct UpstreamTls {
    /// Certificate verification ([`crate::tls::client_config`]) and ALPN `http/1.1` only.
    config: Arc<rustls::ClientConfig>,
    /// The name the certificate must hold: a DNS name, also sent as SNI; or an IP address,
    /// which is sent no SNI and must be one of the certificate's IP addresses.
    name: ServerName<'static>,
}

impl UpstreamTls {
    /// TLS for the `https://` URL `base`, verified by `client` (whose ALPN is replaced by
    /// `http/1.1`: the connection speaks HTTP/1.1 only).
    pub fn new(base: &UpstreamUrl, client: &rustls::ClientConfig) -> Result<Self, String> {
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

impl Upstream {
    /// The connection pool of one worker thread (connections are driven by that thread).
    pub fn client(&self) -> UpstreamClient {
        UpstreamClient {
            addr: self.base.address(),
            host: self.base.authority().to_owned(),
            prefix: self.base.path_prefix().to_owned(),
            connect_timeout: self.connect_timeout,
            tls: self.tls.clone(),
            idle: Rc::new(Pool::default()),
        }
    }
}

/// Idle connections a worker keeps for reuse; more are closed when they finish.
const MAX_IDLE_CONNECTIONS: usize = 1024;

/// HTTP/1.1 keep-alive connections to the upstream, for one worker thread. Each connection is
/// a task on the worker; a request takes the most recently used idle one or opens a new one,
/// and the connection goes back to the pool when the answer's body has been read to the end.
pub struct UpstreamClient {
    /// `host:port` to connect to.
    addr: String,
    /// `Host` for requests that arrived without one.
    host: String,
    /// The upstream's path prefix (may be empty).
    prefix: String,
    connect_timeout: Duration,
    tls: Option<UpstreamTls>,
    idle: Rc<Pool>,
}

/// Idle upstream connections, most recently used last.
#[derive(Default)]
struct Pool(RefCell<VecDeque<SendRequest<ProxyBody>>>);

/// How many idle connections a request looks at before it opens a new one.
const IDLE_PROBES: usize = 4;

impl Pool {
    /// A ready idle connection. Closed ones are dropped on the way; one that is open but not
    /// ready yet (its previous answer's end not yet processed) goes to the front.
    fn take(&self) -> Option<SendRequest<ProxyBody>> {
        let mut idle = self.0.borrow_mut();
        for _ in 0..IDLE_PROBES {
            let conn = idle.pop_back()?;
            if conn.is_ready() {
                return Some(conn);
            }
            if !conn.is_closed() {
                idle.push_front(conn);
            }
        }
        None
    }

    fn put_back(&self, conn: SendRequest<ProxyBody>) {
        let mut idle = self.0.borrow_mut();
        if idle.len() < MAX_IDLE_CONNECTIONS && !conn.is_closed() {
            idle.push_back(conn);
        }
    }
}

/// Why a request did not reach the upstream.
#[derive(Debug)]
enum UpstreamError {
    Connect(std::io::Error),
    ConnectTimeout,
    /// The TLS handshake failed (a certificate that does not verify, among others).
    Tls(std::io::Error),
    Http(hyper::Error),
    /// Nothing moved for the read timeout.
    Silent,
}

impl UpstreamError {
    fn timed_out(&self) -> bool {
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
            UpstreamError::Silent => f.write_str("no answer within the read timeout"),
        }
    }
}

impl UpstreamClient {
    async fn tcp(&self) -> Result<tokio::net::TcpStream, UpstreamError> {
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
    async fn tls(
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

    async fn connect(&self) -> Result<SendRequest<ProxyBody>, UpstreamError> {
        let stream = self.tcp().await?;
        match &self.tls {
            None => handshake(TokioIo::new(stream)).await,
            Some(tls) => match self.tls(tls, stream).await {
                Ok(s) => handshake(TokioIo::new(s)).await,
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
    pub async fn check_certificate(&self) -> Result<(), String> {
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

    /// Send on a pooled connection; when it turns out closed before the request was written,
    /// once more on a new one.
    /// The answer comes with its connection, for the pool once the answer's body is read.
    async fn send(&self, req: hyper::Request<ProxyBody>) -> Result<Answer, UpstreamError> {
        let mut req = req;
        for _ in 0..2 {
            let mut conn = match self.idle.take() {
                Some(c) => c,
                None => self.connect().await?,
            };
            match conn.try_send_request(req).await {
                Ok(res) => return Ok((res, Lease::new(&self.idle, conn))),
                Err(mut e) => match e.take_message() {
                    Some(unsent) => req = unsent,
                    None => return Err(UpstreamError::Http(e.into_error())),
                },
            }
        }
        // Two connections in a row closed under the request: open one and use it.
        let mut conn = self.connect().await?;
        let res = conn.send_request(req).await.map_err(UpstreamError::Http)?;
        Ok((res, Lease::new(&self.idle, conn)))
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

/// HTTP/1.1 over a connected stream (plain or TLS); the connection runs as a task of this worker.
async fn handshake<T>(io: T) -> Result<SendRequest<ProxyBody>, UpstreamError>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + 'static,
{
    let (sender, conn) = http1::handshake(io).await.map_err(UpstreamError::Http)?;
    actix_web::rt::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "upstream connection ended");
        }
    });
    Ok(sender)
}

type Answer = (hyper::Response<hyper::body::Incoming>, Lease);

/// A connection whose answer is still being read; it returns to its pool when the answer's body
/// ends, or when the body is dropped (a connection left mid-answer is closed by hyper, and the
/// pool skips it).
struct Lease(Option<(Rc<Pool>, SendRequest<ProxyBody>)>);

impl Lease {
    fn new(pool: &Rc<Pool>, conn: SendRequest<ProxyBody>) -> Self {
        Lease(Some((pool.clone(), conn)))
    }

    fn release(&mut self) {
        if let Some((pool, conn)) = self.0.take() {
            pool.put_back(conn);
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.release();
    }
}

/// Headers that describe one connection, not the message (RFC 9110 section 7.6.1).
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Whether a header must not be copied across the proxy. `Content-Length` is set again from
/// the body, and any header the `Connection` header names is connection-specific too.
fn skip_header(name: &str, connection_named: &[String]) -> bool {
    name == "content-length"
        || HOP_BY_HOP.contains(&name)
        || connection_named
            .iter()
            .any(|c| c.eq_ignore_ascii_case(name))
}

/// The header names a `Connection` header lists (its values, comma-separated).
fn connection_named<'a>(values: impl Iterator<Item = &'a [u8]>) -> Vec<String> {
    values
        .filter_map(|v| std::str::from_utf8(v).ok())
        .flat_map(|v| v.split(','))
        .map(|s| s.trim().to_ascii_lowercase())
        .filter(|s| !s.is_empty())
        .collect()
}

fn parse_length(value: Option<&[u8]>) -> Option<u64> {
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
        use std::io::Write as _;
        if !out.is_empty() {
            out.extend_from_slice(b", ");
        }
        let _ = write!(out, "{}", ip.to_canonical());
    }
    (!out.is_empty()).then_some(out)
}

/// The request as it goes to the upstream: same method, prefixed path and query, the
/// end-to-end headers, `X-Forwarded-For`, and the body streamed through.
fn upstream_request(
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

/// The gateway's default service: forward to the upstream and stream the answer back.
pub async fn forward(
    req: HttpRequest,
    payload: web::Payload,
    client: web::Data<UpstreamClient>,
    upstream: web::Data<Upstream>,
) -> HttpResponse {
    let path = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    if !path.starts_with('/') {
        // `OPTIONS *` and other non-origin forms name no upstream resource.
        return bad_request("The request target must be a path starting with `/`.");
    }
    let upgrading = upgrade::requested(&req);
    let by_client = upgrading
        || upstream
            .admission
            .as_ref()
            .is_some_and(|a| a.shares_by_client());
    let client_addr = if by_client {
        upstream.clients.of(&req)
    } else {
        std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)
    };
    // A handshake takes its place among the upgraded connections before anything else: a
    // refused one costs no admission slot and never reaches the upstream.
    let place = if upgrading {
        match upstream.upgrades.reserve(client_addr) {
            Ok(place) => Some(place),
            Err(reason) => return upgrade::refused(&upstream.upgrades, reason, &upstream.metrics),
        }
    } else {
        None
    };
    // The slot is taken after the limiter allowed the request (a refused one never gets here)
    // and held until the answer's body has been sent, or the client went away.
    let slot = match &upstream.admission {
        Some(admission) => match admission
            .enter(req.method().as_str(), req.path(), client_addr)
            .await
        {
            Ok(slot) => Some(slot),
            Err(shed) => return overloaded(&req, payload, admission, &shed).await,
        },
        None => None,
    };
    if let Some(place) = place {
        // A handshake holds its slot until the upstream answers it; an open WebSocket holds none.
        let res = upgrade::forward(&req, path, payload, &client, &upstream, place).await;
        drop(slot);
        return res;
    }
    let chunked = req
        .headers()
        .get(header::TRANSFER_ENCODING)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
    let length = parse_length(
        req.headers()
            .get(header::CONTENT_LENGTH)
            .map(|v| v.as_bytes()),
    );
    let watch = Rc::new(BodyWatch::new(upstream.metrics.clone()));
    // Holding a slot, the body may keep the gateway waiting at most the slot's hold in all.
    let (rules, hold_meter) = match &slot {
        Some(s) => (
            upstream.body.with_hold(s.body_hold()),
            Some(s.meter().clone()),
        ),
        None => (upstream.body, None),
    };
    let body = match length {
        Some(len) if len > 0 => {
            ProxyBody::stream(payload, Some(len), &watch, &req, rules, hold_meter)
        }
        _ if chunked => ProxyBody::stream(payload, None, &watch, &req, rules, hold_meter),
        _ => ProxyBody::Empty,
    };
    let Some(out) = upstream_request(&req, path, &client, body) else {
        return bad_request("The request method or target cannot be forwarded.");
    };
    let started = Instant::now();
    let silence = silent_for(watch.clone(), upstream.read_timeout);
    let sent = match select(pin!(client.send(out)), pin!(silence)).await {
        Either::Left((sent, _)) => sent,
        Either::Right(_) => Err(UpstreamError::Silent),
    };
    match (sent, watch.failed.get()) {
        (Ok((res, lease)), _) => {
            upstream
                .metrics
                .upstream_response(res.status().as_u16(), started.elapsed());
            answer(res, lease, slot, upstream.read_timeout)
        }
        // The upstream request failed because the client's body did: not the upstream's fault.
        (Err(_), Some(ClientFault::TooSlow(trip))) => closing(request_timeout(trip, &rules)),
        (Err(e), Some(ClientFault::Broken)) => {
            tracing::debug!(error = %e, "the client's request body failed; upstream request aborted");
            closing(bad_request_body())
        }
        (Err(e), None) => upstream_error(&upstream.metrics, &e),
    }
}

/// The 408 for a body that broke `trip`.
fn request_timeout(trip: Trip, rules: &BodyRules) -> HttpResponse {
    let detail = match trip {
        Trip::Silence => format!(
            "The request body stopped arriving for {} s.",
            rules.timeout.as_secs_f64()
        ),
        Trip::Rate => format!(
            "The request body arrived slower than {} bytes per second.",
            rules.min_rate
        ),
        Trip::Hold => format!(
            "The request body was still arriving after {} s of waiting for it, while the request held one of the slots admission control keeps for the upstream (admission.body_hold).",
            rules.hold.unwrap_or_default().as_secs_f64()
        ),
    };
    Problem::request_timeout(detail).into_response()
}

/// The answer to a body that ended early or was malformed (the client has most likely gone).
fn bad_request_body() -> HttpResponse {
    Problem {
        kind: "urn:fleet-limiter:problem:bad-request-body",
        title: "Bad Request",
        status: 400,
        detail: "The request body ended before it was complete, or was malformed.".to_owned(),
        retry_after: None,
    }
    .into_response()
}

/// `res`, and the client's connection closed after it: the rest of a body that stopped
/// half-way is never read.
fn closing(mut res: HttpResponse) -> HttpResponse {
    res.head_mut().set_connection_type(ConnectionType::Close);
    res
}

/// The upstream's answer as the client's: status, end-to-end headers, the body streamed.
fn answer(
    res: hyper::Response<hyper::body::Incoming>,
    lease: Lease,
    slot: Option<Slot>,
    read_timeout: Duration,
) -> HttpResponse {
    let status = actix_web::http::StatusCode::from_u16(res.status().as_u16())
        .unwrap_or(actix_web::http::StatusCode::BAD_GATEWAY);
    let mut back = HttpResponse::build(status);
    let named = connection_named(
        res.headers()
            .get_all(hyper::header::CONNECTION)
            .iter()
            .map(|v| v.as_bytes()),
    );
    for (name, value) in res.headers() {
        if skip_header(name.as_str(), &named) {
            continue;
        }
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name.as_str().as_bytes()),
            HeaderValue::from_bytes(value.as_bytes()),
        ) {
            back.append_header((n, v));
        }
    }
    let len = parse_length(
        res.headers()
            .get(hyper::header::CONTENT_LENGTH)
            .map(|v| v.as_bytes()),
    );
    let body = IdleTimeout::new(
        AnswerBody {
            body: res.into_body(),
            lease,
            slot,
        },
        read_timeout,
    );
    match len {
        Some(len) => back.body(SizedStream::new(len, body)),
        None => back.body(BodyStream::new(body)),
    }
}

/// The 503 for a request admission control turned away: `Retry-After`, problem+json, and the
/// body of a small request read so the connection can stay open (an upgrade's closes).
async fn overloaded(
    req: &HttpRequest,
    mut payload: web::Payload,
    admission: &Admission,
    shed: &crate::admission::Shed,
) -> HttpResponse {
    tracing::debug!(
        group = %shed.group,
        reason = shed.reason.as_str(),
        "admission control shed a request"
    );
    let wait = admission.retry_after();
    let mut res = Problem::overloaded(&shed.group, shed.reason, wait).into_response();
    res.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(wait));
    if upgrade::requested(req) {
        return closing(res);
    }
    crate::http::middleware::drain_small_body(&mut payload).await;
    res
}

fn bad_request(detail: &str) -> HttpResponse {
    Problem {
        kind: "urn:fleet-limiter:problem:bad-request-target",
        title: "Bad Request",
        status: 400,
        detail: detail.to_owned(),
        retry_after: None,
    }
    .into_response()
}

fn upstream_error(metrics: &Metrics, e: &UpstreamError) -> HttpResponse {
    let timed_out = e.timed_out();
    tracing::warn!(error = %e, timed_out, "upstream request failed");
    metrics.upstream_failed(timed_out);
    if timed_out {
        Problem::gateway_timeout("The upstream API did not answer in time.").into_response()
    } else {
        Problem::bad_gateway("The upstream API could not be reached.").into_response()
    }
}

/// What a request body tells the rest of its forwarding: what moved when, and how it failed.
struct BodyWatch {
    /// The last moment the request moved: sent, or a body chunk taken from the client.
    moved: Cell<Instant>,
    /// Whether the body is waiting on the client now (the upstream is not the slow side).
    waiting_on_client: Cell<bool>,
    /// How the client's body failed, if it did.
    failed: Cell<Option<ClientFault>>,
    /// Where a body cut off for its pace is counted.
    metrics: Arc<Metrics>,
}

impl BodyWatch {
    fn new(metrics: Arc<Metrics>) -> Self {
        Self {
            metrics,
            moved: Cell::new(Instant::now()),
            waiting_on_client: Cell::new(false),
            failed: Cell::new(None),
        }
    }
}

/// Why the client's body did not make it to the upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ClientFault {
    /// It broke a pace rule and was cut off.
    TooSlow(Trip),
    /// It ended early (the client went away) or was malformed.
    Broken,
}

/// A request body on its way to the upstream: none, or the client's, streamed as it arrives.
enum ProxyBody {
    Empty,
    Stream(Box<StreamBody>),
}

/// The client's body, streamed as it arrives and held to its pace.
struct StreamBody {
    payload: web::Payload,
    /// The declared length (`Content-Length`), or `None` for a chunked body.
    length: Option<u64>,
    watch: Rc<BodyWatch>,
    pace: BodyPace,
    /// The wait for the client under way: since when, until when, and which rule ends it.
    wait: Option<(tokio::time::Instant, tokio::time::Instant, Trip)>,
    /// Wakes the body at the end of a wait (made at the first wait).
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    /// For the log line when the body is cut off.
    peer: Option<std::net::IpAddr>,
    /// Where a body cut off at its admission slot's hold is counted (its slot's group).
    hold_meter: Option<AdmissionMeter>,
    done: bool,
}

impl ProxyBody {
    fn stream(
        payload: web::Payload,
        length: Option<u64>,
        watch: &Rc<BodyWatch>,
        req: &HttpRequest,
        rules: BodyRules,
        hold_meter: Option<AdmissionMeter>,
    ) -> Self {
        ProxyBody::Stream(Box::new(StreamBody {
            payload,
            length,
            watch: watch.clone(),
            pace: BodyPace::new(rules),
            wait: None,
            timer: None,
            peer: req.peer_addr().map(|a| a.ip()),
            hold_meter,
            done: false,
        }))
    }
}

/// The client's body failed: it went away, sent a malformed chunk, or was too slow.
#[derive(Debug)]
enum ClientBodyError {
    Broken(String),
    TooSlow(Trip),
}

impl std::fmt::Display for ClientBodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientBodyError::Broken(e) => write!(f, "request body: {e}"),
            ClientBodyError::TooSlow(trip) => {
                write!(f, "request body too slow ({})", trip.as_str())
            }
        }
    }
}

impl std::error::Error for ClientBodyError {}

impl StreamBody {
    fn poll_chunk(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, ClientBodyError>>> {
        if self.done {
            return Poll::Ready(None);
        }
        match self.payload.poll_next_unpin(cx) {
            Poll::Ready(Some(Ok(chunk))) => {
                let waited = self
                    .wait
                    .take()
                    .map_or(Duration::ZERO, |(since, _, _)| since.elapsed());
                self.pace.chunk(waited, chunk.len() as u64);
                self.watch.waiting_on_client.set(false);
                self.watch.moved.set(Instant::now());
                Poll::Ready(Some(Ok(chunk)))
            }
            Poll::Ready(Some(Err(e))) => {
                self.finish(ClientFault::Broken);
                Poll::Ready(Some(Err(ClientBodyError::Broken(e.to_string()))))
            }
            Poll::Ready(None) => {
                self.done = true;
                self.watch.waiting_on_client.set(false);
                Poll::Ready(None)
            }
            Poll::Pending => match self.poll_wait(cx) {
                Poll::Ready(trip) => Poll::Ready(Some(Err(ClientBodyError::TooSlow(trip)))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    /// The client has nothing for us: start or continue the wait, and end the body when a
    /// rule trips.
    fn poll_wait(&mut self, cx: &mut Context<'_>) -> Poll<Trip> {
        let (since, until, trip) = *self.wait.get_or_insert_with(|| {
            let now = tokio::time::Instant::now();
            let (allowed, trip) = self.pace.allowance();
            (now, later(now, allowed), trip)
        });
        self.watch.waiting_on_client.set(true);
        if tokio::time::Instant::now() < until {
            let timer = match &mut self.timer {
                Some(t) => {
                    if t.deadline() != until {
                        t.as_mut().reset(until);
                    }
                    t
                }
                None => self.timer.insert(Box::pin(tokio::time::sleep_until(until))),
            };
            if timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
        }
        self.finish(ClientFault::TooSlow(trip));
        let waited = self.pace.waited().saturating_add(since.elapsed());
        if trip == Trip::Hold {
            if let Some(meter) = &self.hold_meter {
                meter.shed(ShedReason::BodyHold);
            }
            tracing::warn!(
                rule = trip.as_str(),
                peer = self.peer.map(tracing::field::display),
                bytes_received = self.pace.bytes(),
                declared_length = self.length,
                waited_seconds = waited.as_secs_f64(),
                "request body still arriving after admission.body_hold while it holds an admission slot; cutting it off"
            );
        } else {
            self.watch.metrics.client_body_timeout(trip);
            tracing::warn!(
                rule = trip.as_str(),
                peer = self.peer.map(tracing::field::display),
                bytes_received = self.pace.bytes(),
                declared_length = self.length,
                waited_seconds = waited.as_secs_f64(),
                "request body too slow; cutting it off"
            );
        }
        Poll::Ready(trip)
    }

    fn finish(&mut self, fault: ClientFault) {
        self.done = true;
        self.wait = None;
        self.timer = None;
        self.watch.waiting_on_client.set(false);
        self.watch.failed.set(Some(fault));
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = ClientBodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ClientBodyError>>> {
        match self.get_mut() {
            ProxyBody::Empty => Poll::Ready(None),
            ProxyBody::Stream(s) => s.poll_chunk(cx).map(|c| c.map(|r| r.map(Frame::data))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ProxyBody::Empty => true,
            ProxyBody::Stream(s) => s.done,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ProxyBody::Empty => SizeHint::with_exact(0),
            ProxyBody::Stream(s) => match s.length {
                Some(n) => SizeHint::with_exact(n),
                None => SizeHint::default(),
            },
        }
    }
}

/// The upstream answer's body as a stream of data chunks (trailers are not forwarded); its
/// connection goes back to the pool when it ends.
struct AnswerBody {
    body: hyper::body::Incoming,
    lease: Lease,
    /// The admission slot, given back when the body ends or is dropped.
    slot: Option<Slot>,
}

impl Stream for AnswerBody {
    type Item = Result<Bytes, hyper::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            return match Pin::new(&mut self.body).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => Poll::Ready(Some(Ok(data))),
                    Err(_trailers) => continue,
                },
                Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e))),
                Poll::Ready(None) => {
                    self.lease.release();
                    self.slot = None;
                    Poll::Ready(None)
                }
                Poll::Pending => Poll::Pending,
            };
        }
    }
}

/// `t + d`, or about thirty years on when that is past the clock's range: a deadline that
/// never comes, from a timeout too long to add.
fn later(t: tokio::time::Instant, d: Duration) -> tokio::time::Instant {
    t.checked_add(d)
        .unwrap_or_else(|| t + Duration::from_secs(30 * 365 * 86_400))
}

/// Resolves once the upstream side has been silent for `limit`: nothing moved since the
/// instant in `watch.moved`, and the body is not waiting on the client (the client's silence
/// is the body timeout's business, never an upstream timeout).
async fn silent_for(watch: Rc<BodyWatch>, limit: Duration) {
    loop {
        let now = tokio::time::Instant::now();
        let from = if watch.waiting_on_client.get() {
            now
        } else {
            tokio::time::Instant::from_std(watch.moved.get())
        };
        let due = later(from, limit);
        if now >= due {
            return;
        }
        tokio::time::sleep_until(due).await;
    }
}

/// An upstream answer's body that fails when the upstream goes silent for `limit`.
struct IdleTimeout<S> {
    inner: S,
    limit: Duration,
    timer: Pin<Box<tokio::time::Sleep>>,
}

impl<S> IdleTimeout<S> {
    fn new(inner: S, limit: Duration) -> Self {
        Self {
            inner,
            limit,
            timer: Box::pin(tokio::time::sleep(limit)),
        }
    }
}

impl<S, E> Stream for IdleTimeout<S>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: Into<Box<dyn std::error::Error>>,
{
    type Item = Result<Bytes, Box<dyn std::error::Error>>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match self.inner.poll_next_unpin(cx) {
            Poll::Ready(Some(item)) => {
                let next = tokio::time::Instant::now() + self.limit;
                self.timer.as_mut().reset(next);
                Poll::Ready(Some(item.map_err(Into::into)))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => match self.timer.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    tracing::warn!(
                        "upstream went silent in the middle of an answer; cutting it off"
                    );
                    Poll::Ready(Some(Err("upstream answer timed out".into())))
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_urls_give_address_host_header_and_tls_name() {
        let up = |base: &str| Upstream {
            base: base.parse().expect("an upstream URL"),
            connect_timeout: Duration::from_secs(1),
            read_timeout: Duration::from_secs(1),
            body: BodyRules::new(Duration::from_secs(1), 0),
            tls: None,
            metrics: Arc::new(Metrics::new()),
            admission: None,
            upgrades: upgrade::Upgrades::new(
                crate::config::websocket::WebsocketConfig {
                    max_open: None,
                    max_per_client: None,
                    idle_timeout: Duration::from_secs(60),
                }
                .caps(None),
                Duration::from_secs(60),
            ),
            clients: ClientAddresses::peer_only(),
        };
        for (base, addr, host, prefix) in [
            ("http://api.internal", "api.internal:80", "api.internal", ""),
            (
                "https://api.internal",
                "api.internal:443",
                "api.internal",
                "",
            ),
            (
                "https://127.0.0.1:8443/v1",
                "127.0.0.1:8443",
                "127.0.0.1:8443",
                "/v1",
            ),
            ("https://[::1]/p", "[::1]:443", "[::1]", "/p"),
        ] {
            let c = up(base).client();
            assert_eq!(
                (c.addr.as_str(), c.host.as_str(), c.prefix.as_str()),
                (addr, host, prefix),
                "{base}"
            );
        }
        let client = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
        let name = |base: &str| {
            UpstreamTls::new(&base.parse().expect("an upstream URL"), &client).map(|t| {
                (
                    t.name.to_str().into_owned(),
                    t.config.alpn_protocols.clone(),
                )
            })
        };
        assert_eq!(
            name("https://api.internal:8443/v1"),
            Ok(("api.internal".to_owned(), vec![b"http/1.1".to_vec()]))
        );
        // An IP address is checked against the certificate's IP addresses (no SNI is sent).
        let url = |u: &str| u.parse::<UpstreamUrl>().expect("an upstream URL");
        let ip = UpstreamTls::new(&url("https://[::1]:8443"), &client).expect("an IP host");
        assert!(matches!(ip.name, ServerName::IpAddress(_)), "{:?}", ip.name);
        let ip = UpstreamTls::new(&url("https://10.0.0.5"), &client).expect("an IP host");
        assert!(matches!(ip.name, ServerName::IpAddress(_)), "{:?}", ip.name);
    }
}
