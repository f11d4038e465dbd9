//! HTTP/1.1 Upgrade passthrough (WebSocket).
//!
//! A handshake has already been metered like any request of its route (a refused one got its
//! 429 before it came here). Before anything is sent upstream it takes a place among the open
//! upgraded connections ([`Upgrades::reserve`]): at most `websocket.max_open` in all and
//! `websocket.max_per_client` per client address, or it is refused (503 or 429, `Retry-After`,
//! `Connection: close`). It goes to the upstream with `Connection: upgrade` and `Upgrade` kept,
//! plus every end-to-end header (`Sec-WebSocket-*` among them), on a fresh connection of its
//! own: never one from the pool, and never returned to it.
//!
//! When the upstream switches protocols (`101`), the client gets a `101` with the upstream's
//! headers and the two connections are spliced both ways until either side closes, or until no
//! byte has moved either way for `websocket.idle_timeout`, which closes both. Bytes are copied as
//! they arrive and no frame is parsed, so a message costs what its bytes cost. Neither the
//! request body's pace rules nor the read timeout apply after the switch. Any other answer goes
//! back as a normal response, and the client's connection closes after it.
//!
//! Only `Upgrade: websocket` is passed through: it is the protocol for which actix-web hands the
//! client's raw bytes to the handler after the head. A request offering any other protocol is
//! forwarded as a plain request with its `Upgrade` header dropped, so the upstream answers it
//! over HTTP/1.1.

use super::answers::{answer, bad_request, closing, upstream_error};
use super::body::{later, ProxyBody};
use super::client::{upstream_request, UpstreamClient, UpstreamError};
use super::headers::{connection_tokens, end_to_end_headers, parse_length};
use crate::client_share::{ClientHold, ClientShares};
use crate::config::websocket::Caps;
use crate::http::response::Problem;
use crate::metrics::{Metrics, UpgradeRefusal};
use actix_web::http::header::{self, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use bytes::{Bytes, BytesMut};
use futures_util::{Stream, StreamExt};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use std::cell::Cell;
use std::net::IpAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt, ReadHalf, WriteHalf};

/// The protocol passed through.
const WEBSOCKET: &str = "websocket";

/// The most one read from the upstream takes; what arrived is passed on at once, however small.
const READ_CHUNK: usize = 16 * 1024;

/// The `Retry-After` of a refused handshake, in seconds: a place comes free when some open
/// WebSocket closes, which no one can foresee; this keeps a reconnecting client from asking in
/// a tight loop.
pub(crate) const REFUSED_RETRY_AFTER: u64 = 5;

type Spliced = TokioIo<Upgraded>;

/// The places for upgraded connections, shared by every worker: how many are open (or being
/// opened) in all and per client address, and how long one may stay idle.
#[derive(Debug)]
pub(crate) struct Upgrades {
    max_open: usize,
    open: AtomicUsize,
    per_client: Arc<ClientShares>,
    idle_timeout: Duration,
}

/// One upgraded connection's place, from its handshake until both of its connections are
/// closed; given back when dropped.
#[derive(Debug)]
pub(crate) struct Place {
    upgrades: Arc<Upgrades>,
    _client: ClientHold,
}

impl Drop for Place {
    fn drop(&mut self) {
        self.upgrades.open.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Upgrades {
    /// Places under `caps`, each connection closed after `idle_timeout` with no byte either way.
    pub(crate) fn new(caps: Caps, idle_timeout: Duration) -> Arc<Self> {
        Arc::new(Self {
            max_open: caps.max_open.max(1),
            open: AtomicUsize::new(0),
            per_client: ClientShares::new(caps.max_per_client),
            idle_timeout,
        })
    }

    /// A place for one more upgraded connection from client address `addr`, or why there is
    /// none: the address holds its share already (checked first: that is the client's own
    /// doing, whatever the others hold), or every place is taken.
    pub(crate) fn reserve(self: &Arc<Self>, addr: IpAddr) -> Result<Place, UpgradeRefusal> {
        let Some(client) = self.per_client.take(addr) else {
            return Err(UpgradeRefusal::MaxPerClient);
        };
        let taken = self
            .open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max_open).then_some(n + 1)
            });
        if taken.is_err() {
            return Err(UpgradeRefusal::MaxOpen);
        }
        Ok(Place {
            upgrades: self.clone(),
            _client: client,
        })
    }

    /// Places taken now (connections open, or handshakes under way).
    #[cfg(test)]
    pub(crate) fn open_now(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    pub(crate) fn max_open(&self) -> usize {
        self.max_open
    }

    pub(crate) fn max_per_client(&self) -> usize {
        self.per_client.limit()
    }

    pub(crate) fn idle_timeout(&self) -> Duration {
        self.idle_timeout
    }
}

/// The answer to a handshake refused for `reason`, before the upstream saw it: 503 when every
/// place is taken, 429 when the client holds its share; the connection closes after it.
pub(super) fn refused(
    upgrades: &Upgrades,
    reason: UpgradeRefusal,
    metrics: &Metrics,
) -> HttpResponse {
    metrics.upgrade_refused(reason);
    let cap = match reason {
        UpgradeRefusal::MaxOpen => upgrades.max_open(),
        UpgradeRefusal::MaxPerClient => upgrades.max_per_client(),
    };
    tracing::debug!(reason = reason.as_str(), cap, "WebSocket handshake refused");
    let mut res = Problem::upgrade_refused(reason, cap, REFUSED_RETRY_AFTER).into_response();
    res.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(REFUSED_RETRY_AFTER));
    closing(res)
}

/// Whether the request asks to switch to WebSocket: a `Connection` header naming `upgrade`
/// and `Upgrade: websocket`.
pub(super) fn requested(req: &HttpRequest) -> bool {
    let headers = req.headers();
    connection_tokens(
        headers
            .get_all(header::CONNECTION)
            .map(HeaderValue::as_bytes),
    )
    .any(|t| t.eq_ignore_ascii_case("upgrade"))
        && headers.get_all(header::UPGRADE).any(|v| {
            v.to_str()
                .is_ok_and(|v| v.trim().eq_ignore_ascii_case(WEBSOCKET))
        })
}

/// Whether the request declares a body (a handshake has none).
fn declares_body(req: &HttpRequest) -> bool {
    let length = parse_length(
        req.headers()
            .get(header::CONTENT_LENGTH)
            .map(HeaderValue::as_bytes),
    );
    req.headers().contains_key(header::TRANSFER_ENCODING) || length.is_some_and(|n| n > 0)
}

/// Forward a WebSocket handshake on a fresh upstream connection; on `101`, splice the two
/// connections, which then hold `place` until both are closed. Every answer but a `101` closes
/// the client's connection after it (and gives the place back): once a handshake was read,
/// actix-web takes whatever the client sends next as raw bytes.
pub(super) async fn forward(
    req: &HttpRequest,
    path: &str,
    payload: web::Payload,
    client: &UpstreamClient,
    read_timeout: Duration,
    metrics: &Arc<Metrics>,
    place: Place,
) -> HttpResponse {
    if declares_body(req) {
        return closing(bad_request("An upgrade request cannot carry a body."));
    }
    let Some(mut out) = upstream_request(req, path, client, ProxyBody::Empty) else {
        return closing(bad_request(
            "The request method or target cannot be forwarded.",
        ));
    };
    // Hop-by-hop as they are, these two are what this request is for.
    let headers = out.headers_mut();
    headers.insert(
        hyper::header::CONNECTION,
        hyper::header::HeaderValue::from_static("upgrade"),
    );
    headers.insert(
        hyper::header::UPGRADE,
        hyper::header::HeaderValue::from_static(WEBSOCKET),
    );
    let started = Instant::now();
    // The read timeout bounds the handshake as it bounds any request's head.
    let (sender, mut res) = match tokio::time::timeout(read_timeout, handshake(client, out)).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(e)) => return closing(upstream_error(metrics, &e)),
        Err(_) => return closing(upstream_error(metrics, &UpstreamError::Silent)),
    };
    metrics.upstream_response(res.status().as_u16(), started.elapsed());
    if res.status() != hyper::StatusCode::SWITCHING_PROTOCOLS {
        metrics.upgrade(false);
        // The connection is this request's alone: it closes once the answer is read.
        drop(sender);
        return closing(answer(res, None, read_timeout));
    }
    let switched = tokio::time::timeout(read_timeout, hyper::upgrade::on(&mut res)).await;
    drop(sender);
    let io = match switched {
        Ok(Ok(io)) => io,
        Ok(Err(e)) => return closing(upstream_error(metrics, &UpstreamError::Http(e))),
        Err(_) => return closing(upstream_error(metrics, &UpstreamError::Silent)),
    };
    metrics.upgrade(true);
    let open = Rc::new(Open::new(
        req.peer_addr().map(|a| a.ip()),
        metrics.clone(),
        place,
    ));
    let idle_timeout = open.place.upgrades.idle_timeout();
    let (from_upstream, to_upstream) = tokio::io::split(TokioIo::new(io));
    let splice = Rc::new(Splice::new(idle_timeout, metrics.clone()));
    actix_web::rt::spawn(client_to_upstream(
        payload,
        to_upstream,
        splice.clone(),
        open.clone(),
    ));
    // The upstream's side is read by a task of its own, so that an idle connection is closed
    // even while the client reads nothing (and the answer's stream is not polled).
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    actix_web::rt::spawn(upstream_to_client(
        from_upstream,
        tx,
        splice,
        read_timeout,
        open.clone(),
    ));
    switching_protocols(&res).streaming(to_client(rx, open))
}

/// What both directions of one spliced connection share: when a byte last moved either way,
/// whether the client's side has ended, and whether the connection was closed for idling.
struct Splice {
    last: Cell<tokio::time::Instant>,
    idle_timeout: Duration,
    idled: Cell<bool>,
    client_gone: Cell<bool>,
    notify: tokio::sync::Notify,
    metrics: Arc<Metrics>,
}

impl Splice {
    fn new(idle_timeout: Duration, metrics: Arc<Metrics>) -> Self {
        Self {
            last: Cell::new(tokio::time::Instant::now()),
            idle_timeout,
            idled: Cell::new(false),
            client_gone: Cell::new(false),
            notify: tokio::sync::Notify::new(),
            metrics,
        }
    }

    /// Bytes moved (either way).
    fn moved(&self) {
        self.last.set(tokio::time::Instant::now());
    }

    /// Resolves once no byte has moved either way for the idle timeout, and counts the
    /// connection as closed for idling (once, whichever direction sees it first).
    async fn idle(&self) {
        loop {
            let due = later(self.last.get(), self.idle_timeout);
            if tokio::time::Instant::now() >= due {
                break;
            }
            tokio::time::sleep_until(due).await;
        }
        if !self.idled.replace(true) {
            self.metrics.upgraded_idle_closed();
            tracing::debug!(
                idle_seconds = self.idle_timeout.as_secs_f64(),
                "an upgraded connection carried nothing either way for websocket.idle_timeout; closing both sides"
            );
        }
    }

    /// The client's side has ended; the upstream then has the read timeout to close its own.
    fn client_left(&self) {
        self.client_gone.set(true);
        self.notify.notify_one();
    }

    /// Resolves once the client's side has ended and `linger` has passed since.
    async fn client_gone_for(&self, linger: Duration) {
        if !self.client_gone.get() {
            self.notify.notified().await;
        }
        tokio::time::sleep(linger).await;
    }
}

/// Open a connection for this handshake alone (never pooled) and send it.
async fn handshake(
    client: &UpstreamClient,
    req: hyper::Request<ProxyBody>,
) -> Result<
    (
        SendRequest<ProxyBody>,
        hyper::Response<hyper::body::Incoming>,
    ),
    UpstreamError,
> {
    // The same connection setup as the pool's (TLS for an `https://` upstream), but this
    // connection is never pooled: after a `101` it belongs to the splice.
    let stream = client.tcp().await?;
    match &client.tls {
        None => send_on(TokioIo::new(stream), req).await,
        Some(tls) => {
            let stream = client.tls(tls, stream).await?;
            send_on(TokioIo::new(stream), req).await
        }
    }
}

/// Send the handshake on a fresh connection whose driver keeps it open for an upgrade.
async fn send_on<T>(
    io: T,
    req: hyper::Request<ProxyBody>,
) -> Result<
    (
        SendRequest<ProxyBody>,
        hyper::Response<hyper::body::Incoming>,
    ),
    UpstreamError,
>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, conn) = http1::handshake(io).await.map_err(UpstreamError::Http)?;
    actix_web::rt::spawn(async move {
        // Ends once the connection is handed over to the splice (or closed).
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(error = %e, "upstream upgrade connection ended");
        }
    });
    let res = sender
        .send_request(req)
        .await
        .map_err(UpstreamError::Http)?;
    Ok((sender, res))
}

/// The client's `101`: the upstream's end-to-end headers and its `Upgrade`.
fn switching_protocols(
    res: &hyper::Response<hyper::body::Incoming>,
) -> actix_web::HttpResponseBuilder {
    let mut back = HttpResponse::build(StatusCode::SWITCHING_PROTOCOLS);
    end_to_end_headers(res.headers(), &mut back);
    let protocol = res
        .headers()
        .get(hyper::header::UPGRADE)
        .and_then(|v| HeaderValue::from_bytes(v.as_bytes()).ok())
        .unwrap_or(HeaderValue::from_static(WEBSOCKET));
    // `Connection: upgrade` and `Upgrade`; actix-web hands the client's connection over.
    back.upgrade(protocol);
    back
}

/// What the client sends after the switch, to the upstream as it arrives. When the client
/// closes its side, the upstream's side is closed too; when nothing has moved either way for
/// the idle timeout, this side stops (and the other with it).
async fn client_to_upstream(
    mut payload: web::Payload,
    mut upstream: WriteHalf<Spliced>,
    splice: Rc<Splice>,
    _open: Rc<Open>,
) {
    loop {
        let chunk = tokio::select! {
            chunk = payload.next() => chunk,
            () = splice.idle() => break,
        };
        match chunk {
            Some(Ok(bytes)) => {
                splice.moved();
                let written = tokio::select! {
                    written = upstream.write_all(&bytes) => written,
                    () = splice.idle() => break,
                };
                if let Err(e) = written {
                    tracing::debug!(error = %e, "upstream side of an upgraded connection closed");
                    break;
                }
                splice.moved();
            }
            Some(Err(e)) => {
                tracing::debug!(error = %e, "client side of an upgraded connection failed");
                break;
            }
            None => break,
        }
    }
    splice.client_left();
    let _ = upstream.shutdown().await;
}

/// What the upstream sends after the switch, handed on to the client's side as it arrives; it
/// ends when the upstream closes (or fails), when nothing has moved either way for the idle
/// timeout, or, once the client's side has ended, when the upstream keeps its side open but
/// silent for `linger`: a peer that ignores the close never holds the connection. The
/// upstream's connection closes when this ends (the other half is gone by then or soon).
async fn upstream_to_client(
    mut upstream: ReadHalf<Spliced>,
    to_client: tokio::sync::mpsc::Sender<Bytes>,
    splice: Rc<Splice>,
    linger: Duration,
    _open: Rc<Open>,
) {
    let mut buf = BytesMut::new();
    loop {
        buf.reserve(READ_CHUNK);
        let read = tokio::select! {
            read = upstream.read_buf(&mut buf) => read,
            () = splice.idle() => break,
            () = splice.client_gone_for(linger) => {
                tracing::debug!("the client left an upgraded connection and the upstream did not close it; closing");
                break;
            }
        };
        match read {
            Ok(0) => break,
            Ok(_) => {
                splice.moved();
                let sent = tokio::select! {
                    sent = to_client.send(buf.split().freeze()) => sent,
                    () = splice.idle() => break,
                };
                if sent.is_err() {
                    // The client's side is gone.
                    break;
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "upstream side of an upgraded connection failed");
                break;
            }
        }
    }
}

/// The client's side of the answer: what the upstream sent, until the upstream's side ends;
/// the client's connection closes with it.
fn to_client(
    rx: tokio::sync::mpsc::Receiver<Bytes>,
    open: Rc<Open>,
) -> impl Stream<Item = Result<Bytes, std::io::Error>> {
    futures_util::stream::unfold((rx, open), |(mut rx, open)| async move {
        let chunk = rx.recv().await?;
        Some((Ok(chunk), (rx, open)))
    })
}

/// One spliced connection, counted in `fleet_limiter_upgraded_connections` while either
/// direction, or the client's side of the answer, still runs; its place is given back then.
struct Open {
    peer: Option<IpAddr>,
    since: Instant,
    metrics: Arc<Metrics>,
    place: Place,
}

impl Open {
    fn new(peer: Option<IpAddr>, metrics: Arc<Metrics>, place: Place) -> Self {
        metrics.upgraded_opened();
        tracing::debug!(
            peer = peer.map(tracing::field::display),
            "connection upgraded"
        );
        Self {
            peer,
            since: Instant::now(),
            metrics,
            place,
        }
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.metrics.upgraded_closed();
        tracing::debug!(
            peer = self.peer.map(tracing::field::display),
            client = %self.place._client.addr(),
            open_seconds = self.since.elapsed().as_secs_f64(),
            "upgraded connection closed"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::test::TestRequest;

    #[test]
    fn websocket_handshakes_are_recognised() {
        let ws = |conn: &str, up: &str| {
            requested(
                &TestRequest::get()
                    .insert_header((header::CONNECTION, conn))
                    .insert_header((header::UPGRADE, up))
                    .to_http_request(),
            )
        };
        assert!(ws("Upgrade", "websocket"));
        assert!(ws("keep-alive, Upgrade", "WebSocket"));
        assert!(!ws("keep-alive", "websocket"), "no upgrade asked");
        assert!(!ws("upgrade", "h2c"), "only websocket passes");
        assert!(!requested(&TestRequest::get().to_http_request()));
    }

    #[test]
    fn places_are_bounded_per_client_first_then_in_all_and_come_back_when_dropped() {
        let caps = Caps {
            max_open: 3,
            max_per_client: 2,
            max_open_derived: false,
            max_per_client_derived: false,
        };
        let u = Upgrades::new(caps, Duration::from_secs(60));
        let ip = |s: &str| s.parse::<IpAddr>().expect("address");
        let (a, b, c) = (ip("192.0.2.1"), ip("192.0.2.2"), ip("2001:db8::1"));
        let a1 = u.reserve(a).expect("a's first");
        let _a2 = u.reserve(a).expect("a's second");
        assert_eq!(u.reserve(a).unwrap_err(), UpgradeRefusal::MaxPerClient);
        let _b1 = u.reserve(b).expect("b's first");
        assert_eq!(u.open_now(), 3);
        // Every place taken: b is within its share, and told the gateway is full.
        assert_eq!(u.reserve(b).unwrap_err(), UpgradeRefusal::MaxOpen);
        assert_eq!(u.reserve(c).unwrap_err(), UpgradeRefusal::MaxOpen);
        // The refused attempts took nothing: one place freed is one place to take.
        drop(a1);
        assert_eq!(u.open_now(), 2);
        let _c1 = u.reserve(c).expect("c takes the freed place");
        assert_eq!(u.reserve(b).unwrap_err(), UpgradeRefusal::MaxOpen);
        assert_eq!(u.open_now(), 3);
        assert_eq!((u.max_open(), u.max_per_client()), (3, 2));
    }
}
