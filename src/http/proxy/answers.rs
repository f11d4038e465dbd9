//! The answers: the upstream's answer streamed back (its body handing the connection back to
//! the pool when it ends), and what the gateway answers itself while forwarding: a 408
//! for a body that broke its pace, 400s, 502/504 for an upstream that failed, 503 when overloaded.

use super::body::IdleTimeout;
use super::client::{Exchange, ExchangeBody, Head, UpstreamError};
use super::headers::{end_to_end_headers, parse_length};
use super::pace::{BodyRules, Trip};
use super::stall::ClientSocket;
use crate::admission::{Admission, Slot};
use crate::http::response::Problem;
use crate::metrics::Metrics;
use actix_web::body::{BodyStream, SizedStream};
use actix_web::http::header::{self, HeaderValue};
use actix_web::http::ConnectionType;
use actix_web::{web, HttpResponse};
use bytes::Bytes;
use futures_util::Stream;
use http_body::Body;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

/// The 408 for a body that broke `trip`.
pub(super) fn request_timeout(trip: Trip, rules: &BodyRules) -> HttpResponse {
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
pub(super) fn bad_request_body() -> HttpResponse {
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
pub(super) fn closing(mut res: HttpResponse) -> HttpResponse {
    res.head_mut().set_connection_type(ConnectionType::Close);
    res
}

/// The upstream's answer as the client's: status, end-to-end headers, the body streamed as the
/// exchange reads it (and the connection back to its pool at its end).
pub(super) fn forwarded(
    head: Head,
    mut x: Exchange,
    first: Option<Bytes>,
    mut slot: Option<Slot>,
    read_timeout: Duration,
    client_socket: Option<ClientSocket>,
) -> HttpResponse {
    let back = head.res;
    if matches!(back.status().as_u16(), 204 | 304) {
        // No body, whatever the answer's headers say: the client's side writes none (a
        // streamed body would end in a chunk terminator the client never asked for, a
        // declared length in a body that never comes). The exchange is complete: its
        // connection is closed (a 204 or 304 never goes back to the pool), and the slot is
        // given back, here.
        drop((x, slot));
        return back;
    }
    if x.answered() {
        // Read whole already (a small answer): the connection and the slot are done with
        // before the client takes a byte of it.
        x.finish();
        slot = None;
    }
    let body = IdleTimeout::new(
        ExchangeBody {
            x,
            slot,
            first,
            stall: client_socket.map(|s| (s, read_timeout)),
            taken: None,
        },
        read_timeout,
    );
    match head.length {
        Some(len) => back
            .set_body(SizedStream::new(len, body))
            .map_into_boxed_body(),
        None => back.set_body(BodyStream::new(body)).map_into_boxed_body(),
    }
}

/// An upgrade's answer other than `101` as the client's: status, end-to-end headers, the body
/// streamed (its connection is its own, closed at the end).
pub(super) fn answer(
    res: hyper::Response<hyper::body::Incoming>,
    slot: Option<Slot>,
    read_timeout: Duration,
) -> HttpResponse {
    let status = actix_web::http::StatusCode::from_u16(res.status().as_u16())
        .unwrap_or(actix_web::http::StatusCode::BAD_GATEWAY);
    let mut back = HttpResponse::build(status);
    end_to_end_headers(res.headers(), &mut back);
    let len = parse_length(
        res.headers()
            .get(hyper::header::CONTENT_LENGTH)
            .map(|v| v.as_bytes()),
    );
    let body = IdleTimeout::new(
        AnswerBody {
            body: res.into_body(),
            slot,
        },
        read_timeout,
    );
    match len {
        Some(len) => back.body(SizedStream::new(len, body)),
        None => back.body(BodyStream::new(body)),
    }
}

/// The 503 for a request admission control turned away: `Retry-After` (the queue timeout,
/// spread over `[w, 2w]` by `who`, the caller's address and agent id; a client past its own
/// share, answered 429, is told `w`), problem+json, and the body of a small request read so
/// the connection can stay open (an upgrade's closes).
pub(super) async fn overloaded(
    upgrading: bool,
    mut payload: web::Payload,
    admission: &Admission,
    shed: &crate::admission::Shed,
    who: &[u8],
) -> HttpResponse {
    tracing::debug!(
        group = %shed.group,
        reason = shed.reason.as_str(),
        "admission control shed a request"
    );
    let wait = admission.retry_after();
    let wait = if shed.reason.is_overload() {
        crate::spread::spread_secs(wait, who)
    } else {
        wait
    };
    let mut res = Problem::overloaded(&shed.group, shed.reason, wait).into_response();
    res.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(wait));
    if upgrading {
        return closing(res);
    }
    crate::http::request::drain_small_body(&mut payload).await;
    res
}

pub(super) fn bad_request(detail: &str) -> HttpResponse {
    Problem {
        kind: "urn:fleet-limiter:problem:bad-request-target",
        title: "Bad Request",
        status: 400,
        detail: detail.to_owned(),
        retry_after: None,
    }
    .into_response()
}

pub(super) fn upstream_error(metrics: &Metrics, e: &UpstreamError) -> HttpResponse {
    let timed_out = e.timed_out();
    tracing::warn!(error = %e, timed_out, "upstream request failed");
    metrics.upstream_failed(timed_out);
    if timed_out {
        Problem::gateway_timeout("The upstream API did not answer in time.").into_response()
    } else if matches!(e, UpstreamError::Protocol(_)) {
        Problem::bad_gateway(
            "The upstream API's answer was malformed or ambiguous, and was not passed on.",
        )
        .into_response()
    } else {
        Problem::bad_gateway("The upstream API could not be reached.").into_response()
    }
}

/// An upgrade's answer body as a stream of data chunks (trailers are not forwarded).
pub(super) struct AnswerBody {
    body: hyper::body::Incoming,
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
                    self.slot = None;
                    Poll::Ready(None)
                }
                Poll::Pending => Poll::Pending,
            };
        }
    }
}
