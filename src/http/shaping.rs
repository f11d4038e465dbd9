//! The middleware's shaping step (`[shaping]`), before any limiter and around the upstream:
//!
//! 1. a request whose route's priority is shed while the upstream misses its target is
//!    answered 503 at once, with a `Retry-After` of its own (the controller's wait spread over
//!    `[w, 2w]` by the caller's phase, see [`crate::spread`]), and on a route with an interval
//!    its slot (`X-Poll-Interval`, never sooner than that wait); no limiter is charged;
//! 2. a request on a route with `max_in_flight`, whose client address already has
//!    that many at the upstream, is answered 429 at once; no limiter is charged;
//! 3. a request let through is timed from the moment the upstream (the gateway's, or the app's
//!    handler) has the whole of it, its body read to the end, until its answer's head comes
//!    back, which feeds the controller (on a route that is `watched`); its place under the cap
//!    is held until its answer's body has been sent.
//!
//! Nothing here waits: every answer is at once, and the controller's state is two atomics and
//! one short lock.

use super::response::Problem;
use crate::clock::Clock;
use crate::config::shaping::InFlightPer;
use crate::config::shaping::Priority;
use crate::decision::{Decider, Settings};
use crate::shaping::in_flight::{Place, Principal};
use crate::shaping::{pressure::Waiting, Pressure, Rules};
use actix_web::body::{BodySize, BoxBody, EitherBody, MessageBody};
use actix_web::dev::{Payload, ServiceRequest, ServiceResponse};
use actix_web::error::PayloadError;
use actix_web::http::header::{
    HeaderName, HeaderValue, CONTENT_LENGTH, RETRY_AFTER, TRANSFER_ENCODING,
};
use actix_web::{HttpMessage, HttpResponse};
use bytes::Bytes;
use std::cell::RefCell;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};

/// `X-Poll-Interval`.
const X_POLL_INTERVAL: HeaderName = HeaderName::from_static("x-poll-interval");

/// What shaping keeps for a request it let through.
#[derive(Debug, Default)]
pub(super) struct Admitted {
    /// Its place under its route's in-flight cap, given back with the last byte of its answer.
    hold: Option<Place>,
    /// The upstream's target and who the caller is, when the answer is to be timed.
    timed: Option<(Rules, u64)>,
}

/// Step 1 and 2 for a request of `method` on the canonical `path`: `Ok` with what to keep,
/// or `Err` with the answer to send at once.
pub(super) async fn admit(
    decider: &Decider,
    session_cookie: Option<&str>,
    settings: &Settings,
    req: &ServiceRequest,
    path: &str,
) -> Result<Admitted, Box<HttpResponse>> {
    let Some(shaping) = &settings.shaping else {
        return Ok(Admitted::default());
    };
    let route = shaping.route(req.method().as_str(), path);
    let rules = shaping.upstream().copied();
    if let Some(rules) = &rules {
        let priority = route.map_or(Priority::Normal, |r| r.priority);
        if let Some(wait) = decider.pressure().shed(priority, decider.now(), rules) {
            decider.metrics().shaping_shed(priority);
            let (address, agent) = caller(req, settings);
            let mut wait =
                crate::spread::spread_secs(wait, &crate::spread::principal_bytes(&address, agent));
            // On a route with an interval, the caller's slot at least that far away.
            let slot = route.and_then(|r| {
                let h = shaping.hint(
                    r,
                    &address,
                    agent,
                    decider.now(),
                    Some(wait),
                    decider.pressure().step(),
                )?;
                r.meter.hint(h);
                Some(h)
            });
            if let Some(h) = slot {
                wait = wait.max(h);
            }
            tracing::debug!(
                priority = priority.as_str(),
                retry_after = wait,
                "shed: the upstream is missing its target"
            );
            let mut res = shed(priority, decider.pressure().shed_level(), wait);
            if let Some(h) = slot {
                res.headers_mut()
                    .insert(X_POLL_INTERVAL, HeaderValue::from(h));
            }
            return Err(Box::new(res));
        }
    }
    let hold = match route.filter(|r| r.capped()) {
        None => None,
        Some(route) => {
            let who = principal(decider, session_cookie, settings, req, route.in_flight_per).await;
            match route.take(who) {
                Some(hold) => hold,
                None => {
                    route.meter.capped();
                    let wait = decider.pressure().typical_wait_secs();
                    tracing::debug!(route = %route.name, "in-flight cap per address met");
                    return Err(Box::new(capped(
                        &route.name,
                        who.describe(),
                        route.cap().unwrap_or(0),
                        wait,
                    )));
                }
            }
        }
    };
    let timed = match rules {
        Some(rules) if route.is_none_or(|r| r.watched) => {
            let (address, agent) = caller(req, settings);
            let who = crate::spread::principal_bytes(&address, agent);
            Some((rules, crate::shaping::pressure::caller_of(&who)))
        }
        _ => None,
    };
    Ok(Admitted { hold, timed })
}

impl Admitted {
    /// The timing of the request's wait at the upstream, when it is timed: its clock starts
    /// when the upstream has the whole request (see [`start_when_whole`]).
    pub(super) fn timing(&self, decider: &crate::decision::Decider) -> Option<Rc<Timing>> {
        let (rules, caller) = self.timed?;
        Some(Rc::new(Timing {
            pressure: decider.pressure().clone(),
            clock: decider.clock().clone(),
            rules,
            caller,
            waiting: RefCell::new(None),
        }))
    }

    /// `res` with its place under the cap held until its body has been sent.
    pub(super) fn hold_until_sent<B: MessageBody + 'static>(
        self,
        res: ServiceResponse<B>,
    ) -> ServiceResponse<EitherBody<B>> {
        match self.hold {
            None => res.map_into_left_body(),
            Some(hold) => res.map_body(|_, body| {
                EitherBody::right(BoxBody::new(Held {
                    body: BoxBody::new(body),
                    hold: Some(hold),
                }))
            }),
        }
    }
}

/// One request's wait at the upstream, as the controller counts it: from when the upstream has
/// the whole request to its answer's head.
pub(super) struct Timing {
    pressure: Arc<Pressure>,
    clock: Arc<dyn Clock>,
    rules: Rules,
    caller: u64,
    waiting: RefCell<Option<Waiting>>,
}

impl Timing {
    /// The upstream has the whole request now.
    fn start(&self) {
        let now = self.clock.now();
        let w = self.pressure.sent(now, self.caller, &self.rules);
        *self.waiting.borrow_mut() = Some(w);
    }

    /// Its answer's head came back with `status`: timed if the upstream had the whole request,
    /// else only its status counts.
    pub(super) fn answered(&self, status: u16) {
        let now = self.clock.now();
        let waiting = self.waiting.borrow_mut().take();
        match waiting {
            Some(w) => self.pressure.answered(w, now, status, &self.rules),
            None => self
                .pressure
                .answered_early(now, self.caller, status, &self.rules),
        }
    }
}

/// Start `timing` when the upstream has the whole of `req`: now when it has no body, else when
/// its body has been read to the end (its declared length, or the end of a chunked body). A body
/// never finished never starts it: a client sending slowly is never the upstream's time.
pub(super) fn start_when_whole(req: &mut ServiceRequest, timing: Rc<Timing>) {
    let headers = req.headers();
    let chunked = headers.contains_key(TRANSFER_ENCODING);
    let length = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(0);
    if !chunked && length == 0 {
        timing.start();
        return;
    }
    let inner = req.take_payload();
    let whole = WholeBody {
        inner,
        left: (!chunked).then_some(length),
        timing: Some(timing),
    };
    req.set_payload(Payload::Stream {
        payload: Box::pin(whole),
    });
}

/// A request body that starts its timing once it has been read to the end.
struct WholeBody {
    inner: Payload,
    /// What is left of a declared length.
    left: Option<u64>,
    timing: Option<Rc<Timing>>,
}

impl WholeBody {
    fn whole(&mut self) {
        if let Some(t) = self.timing.take() {
            t.start();
        }
    }
}

impl futures_util::Stream for WholeBody {
    type Item = Result<Bytes, PayloadError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let next = Pin::new(&mut self.inner).poll_next(cx);
        match &next {
            Poll::Ready(Some(Ok(chunk))) => {
                let n = chunk.len() as u64;
                if let Some(left) = &mut self.left {
                    *left = left.saturating_sub(n);
                    if *left == 0 {
                        self.whole();
                    }
                }
            }
            Poll::Ready(None) => self.whole(),
            _ => {}
        }
        next
    }
}

/// Who a cap counts: the verified token's subject with `in_flight_per = "user"` when the
/// request carries a token that verifies, else its client address.
async fn principal(
    decider: &Decider,
    session_cookie: Option<&str>,
    settings: &Settings,
    req: &ServiceRequest,
    per: InFlightPer,
) -> Principal {
    if per == InFlightPer::User {
        let headers = req.headers();
        let peer = req
            .peer_addr()
            .map_or(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), |a| {
                a.ip()
            });
        let h = super::request::header_facts(headers, peer, &settings.trusted, session_cookie);
        let id = crate::identity::identify(
            decider.verifier().as_ref(),
            None,
            h.authorization,
            h.session_token,
        )
        .await;
        if let Some(sub) = id.user.as_deref() {
            return Principal::user(sub);
        }
    }
    Principal::address(super::request::client_address(
        req.peer_addr(),
        req.headers(),
        settings,
    ))
}

/// Who `req` is, as a spread wait, a slot and the controller read it: its client address
/// (trusted proxies applied, normalised) and its agent id when valid.
pub(super) fn caller<'r>(
    req: &'r ServiceRequest,
    settings: &Settings,
) -> (String, Option<&'r str>) {
    crate::spread::who(req.peer_addr(), req.headers(), settings)
}

/// The 503 of a request shed at `level`.
fn shed(priority: Priority, level: u8, wait: u64) -> HttpResponse {
    let shed: Vec<&str> = Priority::ALL
        .iter()
        .filter(|p| p.rank() < level)
        .map(|p| p.as_str())
        .collect();
    let unit = if wait == 1 { "second" } else { "seconds" };
    let mut res = Problem {
        kind: "urn:fleet-limiter:problem:shed",
        title: "Service Unavailable",
        status: 503,
        detail: format!(
            "The upstream API is missing its latency target, so requests of priority {} are answered at once while the rest are served; this one is `{}`; retry after {wait} {unit}.",
            shed.join(", "),
            priority.as_str()
        ),
        retry_after: Some(wait),
    }
    .into_response();
    res.headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from(wait));
    res
}

/// The 429 of a request whose address has `cap` in flight on shaped route `route`.
fn capped(route: &str, per: &str, cap: usize, wait: u64) -> HttpResponse {
    let unit = if wait == 1 { "second" } else { "seconds" };
    let mut res = Problem {
        kind: "urn:fleet-limiter:problem:in-flight-cap",
        title: "Too Many Requests",
        status: 429,
        detail: format!(
            "This client already has {cap} requests at the upstream on these routes, as many as one {per} may (shaping route `{route}`, max_in_flight); retry after {wait} {unit}."
        ),
        retry_after: Some(wait),
    }
    .into_response();
    res.headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from(wait));
    res
}

/// An answer's body holding its request's place under an in-flight cap; the place is given
/// back when the body ends or is dropped (the client went away).
struct Held {
    body: BoxBody,
    hold: Option<Place>,
}

impl MessageBody for Held {
    type Error = Box<dyn std::error::Error>;

    fn size(&self) -> BodySize {
        self.body.size()
    }

    fn poll_next(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, Self::Error>>> {
        let next = Pin::new(&mut self.body).poll_next(cx);
        if let Poll::Ready(None) = next {
            self.hold = None;
        }
        next
    }
}
