//! Streaming forwarding to the upstream API: method, path, query, headers and body go through
//! unchanged (less hop-by-hop headers, plus `X-Forwarded-For`); the response streams back.
//! Bodies are never buffered, so a large download passes with flat memory.
//!
//! The read timeout bounds silence, not size: the upstream must take a chunk of the request
//! body, send its answer's head after the body is complete, and send each next chunk of its
//! answer, within `read_timeout` of the last thing that moved. A long upload or download that
//! keeps moving is never cut off; one that stalls ends with a 504 (or a truncated answer, when
//! the stall comes after the head was sent), never a hang.

use crate::http::response::Problem;
use actix_web::body::{BodyStream, SizedStream};
use actix_web::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use actix_web::{web, HttpRequest, HttpResponse};
use awc::error::{ConnectError, SendRequestError};
use bytes::Bytes;
use futures_util::future::{select, Either};
use futures_util::{Stream, StreamExt};
use std::cell::Cell;
use std::future::Future;
use std::pin::{pin, Pin};
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// Where allowed requests go.
#[derive(Debug, Clone)]
pub struct Upstream {
    /// `http://host:port` plus an optional path prefix, without a trailing slash.
    pub base: String,
    pub connect_timeout: Duration,
    pub read_timeout: Duration,
}

impl Upstream {
    /// An HTTP client for one worker thread (awc clients are per-thread).
    pub fn client(&self) -> awc::Client {
        let connector = awc::Connector::new()
            .timeout(self.connect_timeout)
            .limit(1024);
        awc::Client::builder()
            .connector(connector)
            .disable_timeout()
            .no_default_headers()
            .disable_redirects()
            .finish()
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
fn skip_header(name: &HeaderName, connection_named: &[String]) -> bool {
    let n = name.as_str();
    n == "content-length"
        || HOP_BY_HOP.contains(&n)
        || connection_named.iter().any(|c| c.eq_ignore_ascii_case(n))
}

fn connection_named(headers: &HeaderMap) -> Vec<String> {
    headers
        .get_all(header::CONNECTION)
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|s| s.trim().to_ascii_lowercase())
        .filter(|s| !s.is_empty())
        .collect()
}

fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// `X-Forwarded-For` with the immediate peer appended to whatever arrived.
fn forwarded_for(headers: &HeaderMap, peer: Option<std::net::IpAddr>) -> Option<HeaderValue> {
    let mut parts: Vec<String> = headers
        .get_all("x-forwarded-for")
        .filter_map(|v| v.to_str().ok())
        .map(str::to_owned)
        .collect();
    if let Some(ip) = peer {
        parts.push(crate::keys::canonical_ip(ip).to_string());
    }
    if parts.is_empty() {
        return None;
    }
    HeaderValue::from_str(&parts.join(", ")).ok()
}

/// The gateway's default service: forward to the upstream and stream the answer back.
pub async fn forward(
    req: HttpRequest,
    payload: web::Payload,
    client: web::Data<awc::Client>,
    upstream: web::Data<Upstream>,
) -> HttpResponse {
    let path = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    if !path.starts_with('/') {
        // `OPTIONS *` and other non-origin forms name no upstream resource.
        return Problem {
            kind: "urn:fleet-limiter:problem:bad-request-target",
            title: "Bad Request",
            status: 400,
            detail: "The request target must be a path starting with `/`.".to_owned(),
            retry_after: None,
        }
        .into_response();
    }
    let url = format!("{}{}", upstream.base, path);
    let mut out = client.request(req.method().clone(), url);
    let named = connection_named(req.headers());
    for (name, value) in req.headers() {
        if !skip_header(name, &named) && name != "x-forwarded-for" {
            out = out.append_header((name.clone(), value.clone()));
        }
    }
    if let Some(xff) = forwarded_for(req.headers(), req.peer_addr().map(|a| a.ip())) {
        out = out.insert_header((HeaderName::from_static("x-forwarded-for"), xff));
    }
    let chunked = req
        .headers()
        .get(header::TRANSFER_ENCODING)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
    let started = Instant::now();
    // The last moment the request moved: sent, or a body chunk taken by the upstream.
    let moved = Rc::new(Cell::new(Instant::now()));
    let tick = moved.clone();
    let body = payload.inspect(move |_| tick.set(Instant::now()));
    let send = async move {
        match content_length(req.headers()) {
            Some(len) if len > 0 => out.send_body(SizedStream::new(len, body)).await,
            _ if chunked => out.send_stream(body).await,
            _ => out.send().await,
        }
    };
    let silence = silent_for(moved, upstream.read_timeout);
    let sent = match select(pin!(send), pin!(silence)).await {
        Either::Left((sent, _)) => sent,
        Either::Right(_) => Err(SendRequestError::Timeout),
    };
    match sent {
        Ok(res) => {
            crate::metrics::global().upstream_response(res.status().as_u16(), started.elapsed());
            let mut back = HttpResponse::build(res.status());
            let named = connection_named(res.headers());
            for (name, value) in res.headers() {
                if !skip_header(name, &named) {
                    back.append_header((name.clone(), value.clone()));
                }
            }
            let len = content_length(res.headers());
            let res = IdleTimeout::new(res, upstream.read_timeout);
            match len {
                Some(len) => back.body(SizedStream::new(len, res)),
                None => back.body(BodyStream::new(res)),
            }
        }
        Err(e) => upstream_error(&e),
    }
}

fn upstream_error(e: &SendRequestError) -> HttpResponse {
    let timed_out = matches!(
        e,
        SendRequestError::Timeout | SendRequestError::Connect(ConnectError::Timeout)
    );
    tracing::warn!(error = %e, timed_out, "upstream request failed");
    crate::metrics::global().upstream_failed(timed_out);
    if timed_out {
        Problem::gateway_timeout("The upstream API did not answer in time.").into_response()
    } else {
        Problem::bad_gateway("The upstream API could not be reached.").into_response()
    }
}

/// Resolves once nothing has moved for `limit` since the instant in `moved`.
async fn silent_for(moved: Rc<Cell<Instant>>, limit: Duration) {
    loop {
        let due = moved.get() + limit;
        if Instant::now() >= due {
            return;
        }
        tokio::time::sleep_until(tokio::time::Instant::from_std(due)).await;
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
