//! HTTP/1.1 Upgrade passthrough (WebSocket).
//!
//! A handshake has already been metered like any request of its route (a refused one got its
//! 429 before it came here). It goes to the upstream with `Connection: upgrade` and `Upgrade`
//! kept, plus every end-to-end header (`Sec-WebSocket-*` among them), on a fresh connection of
//! its own: never one from the pool, and never returned to it.
//!
//! When the upstream switches protocols (`101`), the client gets a `101` with the upstream's
//! headers and the two connections are spliced both ways until either side closes. Bytes are
//! copied as they arrive and no frame is parsed, so a message costs what its bytes cost. Neither
//! the request body's pace rules nor the read timeout apply after the switch: an upgraded
//! connection may stay idle as long as both ends keep it open. Any other answer goes back as a
//! normal response, and the client's connection closes after it.
//!
//! Only `Upgrade: websocket` is passed through: it is the protocol for which actix-web hands the
//! client's raw bytes to the handler after the head. A request offering any other protocol is
//! forwarded as a plain request with its `Upgrade` header dropped, so the upstream answers it
//! over HTTP/1.1.

use super::{ProxyBody, Upstream, UpstreamClient, UpstreamError};
use crate::metrics::Metrics;
use actix_web::http::header::{self, HeaderName, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use bytes::{Bytes, BytesMut};
use futures_util::{Stream, StreamExt};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt, ReadHalf, WriteHalf};

/// The protocol passed through.
const WEBSOCKET: &str = "websocket";

/// The most one read from the upstream takes; what arrived is passed on at once, however small.
const READ_CHUNK: usize = 16 * 1024;

type Spliced = TokioIo<Upgraded>;

/// Whether the request asks to switch to WebSocket: a `Connection` header naming `upgrade`
/// and `Upgrade: websocket`.
pub(super) fn requested(req: &HttpRequest) -> bool {
    let headers = req.headers();
    let connection = super::connection_named(
        headers
            .get_all(header::CONNECTION)
            .map(HeaderValue::as_bytes),
    );
    connection.iter().any(|t| t == "upgrade")
        && headers.get_all(header::UPGRADE).any(|v| {
            v.to_str()
                .is_ok_and(|v| v.trim().eq_ignore_ascii_case(WEBSOCKET))
        })
}

/// Whether the request declares a body (a handshake has none).
fn declares_body(req: &HttpRequest) -> bool {
    let length = super::parse_length(
        req.headers()
            .get(header::CONTENT_LENGTH)
            .map(HeaderValue::as_bytes),
    );
    req.headers().contains_key(header::TRANSFER_ENCODING) || length.is_some_and(|n| n > 0)
}

/// Forward a WebSocket handshake on a fresh upstream connection; on `101`, splice the two
/// connections. Every answer but a `101` closes the client's connection after it: once a
/// handshake was read, actix-web takes whatever the client sends next as raw bytes.
pub(super) async fn forward(
    req: &HttpRequest,
    path: &str,
    payload: web::Payload,
    client: &UpstreamClient,
    upstream: &Upstream,
) -> HttpResponse {
    let read_timeout = upstream.read_timeout;
    let metrics = &upstream.metrics;
    if declares_body(req) {
        return super::closing(super::bad_request(
            "An upgrade request cannot carry a body.",
        ));
    }
    let Some(mut out) = super::upstream_request(req, path, client, ProxyBody::Empty) else {
        return super::closing(super::bad_request(
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
        Ok(Err(e)) => return super::closing(super::upstream_error(metrics, &e)),
        Err(_) => return super::closing(super::upstream_error(metrics, &UpstreamError::Silent)),
    };
    metrics.upstream_response(res.status().as_u16(), started.elapsed());
    if res.status() != hyper::StatusCode::SWITCHING_PROTOCOLS {
        metrics.upgrade(false);
        // The connection is this request's alone: it closes once the answer is read.
        drop(sender);
        return super::closing(super::answer(res, super::Lease(None), None, read_timeout));
    }
    let switched = tokio::time::timeout(read_timeout, hyper::upgrade::on(&mut res)).await;
    drop(sender);
    let io = match switched {
        Ok(Ok(io)) => io,
        Ok(Err(e)) => {
            return super::closing(super::upstream_error(metrics, &UpstreamError::Http(e)))
        }
        Err(_) => return super::closing(super::upstream_error(metrics, &UpstreamError::Silent)),
    };
    metrics.upgrade(true);
    let open = Rc::new(Open::new(req.peer_addr().map(|a| a.ip()), metrics.clone()));
    let (from_upstream, to_upstream) = tokio::io::split(TokioIo::new(io));
    let client_gone = Rc::new(ClientGone::default());
    actix_web::rt::spawn(client_to_upstream(
        payload,
        to_upstream,
        client_gone.clone(),
        open.clone(),
    ));
    let back = upstream_to_client(from_upstream, client_gone, read_timeout, open);
    switching_protocols(&res).streaming(back)
}

/// Set when the client's side has ended; the upstream then has the read timeout to close its own.
#[derive(Default)]
struct ClientGone {
    gone: std::cell::Cell<bool>,
    notify: tokio::sync::Notify,
}

impl ClientGone {
    fn set(&self) {
        self.gone.set(true);
        self.notify.notify_one();
    }

    /// Resolves once the client's side has ended and `linger` has passed since.
    async fn and_then(&self, linger: Duration) {
        if !self.gone.get() {
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
    let named = super::connection_named(
        res.headers()
            .get_all(hyper::header::CONNECTION)
            .iter()
            .map(|v| v.as_bytes()),
    );
    for (name, value) in res.headers() {
        if super::skip_header(name.as_str(), &named) {
            continue;
        }
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name.as_str().as_bytes()),
            HeaderValue::from_bytes(value.as_bytes()),
        ) {
            back.append_header((n, v));
        }
    }
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
/// closes its side, the upstream's side is closed too.
async fn client_to_upstream(
    mut payload: web::Payload,
    mut upstream: WriteHalf<Spliced>,
    client_gone: Rc<ClientGone>,
    _open: Rc<Open>,
) {
    while let Some(chunk) = payload.next().await {
        match chunk {
            Ok(bytes) => {
                if let Err(e) = upstream.write_all(&bytes).await {
                    tracing::debug!(error = %e, "upstream side of an upgraded connection closed");
                    break;
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "client side of an upgraded connection failed");
                break;
            }
        }
    }
    client_gone.set();
    let _ = upstream.shutdown().await;
}

/// What the upstream sends after the switch, to the client as it arrives; it ends when the
/// upstream closes (or fails), and the client's connection closes with it. Once the client's
/// side has ended, an upstream that keeps its side open but silent for `linger` is closed: a
/// peer that ignores the close never holds the connection.
fn upstream_to_client(
    upstream: ReadHalf<Spliced>,
    client_gone: Rc<ClientGone>,
    linger: Duration,
    open: Rc<Open>,
) -> impl Stream<Item = Result<Bytes, std::io::Error>> {
    futures_util::stream::unfold(
        (upstream, BytesMut::new(), client_gone, open),
        move |(mut upstream, mut buf, client_gone, open)| async move {
            buf.reserve(READ_CHUNK);
            let read = tokio::select! {
                read = upstream.read_buf(&mut buf) => read,
                () = client_gone.and_then(linger) => {
                    tracing::debug!("the client left an upgraded connection and the upstream did not close it; closing");
                    return None;
                }
            };
            match read {
                Ok(0) => None,
                Ok(_) => Some((Ok(buf.split().freeze()), (upstream, buf, client_gone, open))),
                Err(e) => {
                    tracing::debug!(error = %e, "upstream side of an upgraded connection failed");
                    None
                }
            }
        },
    )
}

/// One spliced connection, counted in `fleet_limiter_upgraded_connections` while either
/// direction still runs.
struct Open {
    peer: Option<std::net::IpAddr>,
    since: Instant,
    metrics: Arc<Metrics>,
}

impl Open {
    fn new(peer: Option<std::net::IpAddr>, metrics: Arc<Metrics>) -> Self {
        metrics.upgraded_opened();
        tracing::debug!(
            peer = peer.map(tracing::field::display),
            "connection upgraded"
        );
        Self {
            peer,
            since: Instant::now(),
            metrics,
        }
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.metrics.upgraded_closed();
        tracing::debug!(
            peer = self.peer.map(tracing::field::display),
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
}
