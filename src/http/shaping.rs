//! The middleware's shaping step (`[shaping]`), before any limiter and around the upstream:
//!
//! 1. a request whose route's priority is shed while the upstream misses its target is
//!    answered 503 at once, with the `Retry-After` of the controller's state (see
//!    [`crate::shaping::pressure`]); no limiter is charged;
//! 2. a request on a route with `max_in_flight`, whose client address already has
//!    that many at the upstream, is answered 429 at once; no limiter is charged;
//! 3. a request let through is timed from the moment it is handed on until its answer's head
//!    comes back (the gateway's upstream, or the app's handler), which feeds the controller;
//!    its place under the cap is held until its answer's body has been sent.
//!
//! Nothing here waits: every answer is at once, and the controller's state is two atomics and
//! one short lock.

use super::middleware::FleetLimiter;
use super::response::Problem;
use crate::config::shaping::InFlightPer;
use crate::config::shaping::Priority;
use crate::decision::Settings;
use crate::shaping::in_flight::{Place, Principal};
use crate::shaping::{pressure::Waiting, Rules};
use actix_web::body::{BodySize, BoxBody, EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{HeaderValue, RETRY_AFTER};
use actix_web::HttpResponse;
use bytes::Bytes;
use std::pin::Pin;
use std::task::{Context, Poll};

/// What shaping keeps for a request it let through.
#[derive(Debug, Default)]
pub(super) struct Admitted {
    /// Its place under its route's in-flight cap, given back with the last byte of its answer.
    hold: Option<Place>,
    /// The upstream's target, when the answer is to be timed.
    rules: Option<Rules>,
}

/// Step 1 and 2 for a request of `method` on the canonical `path`: `Ok` with what to keep,
/// or `Err` with the answer to send at once.
pub(super) async fn admit(
    limiter: &FleetLimiter,
    settings: &Settings,
    req: &ServiceRequest,
    path: &str,
) -> Result<Admitted, Box<HttpResponse>> {
    let Some(shaping) = &settings.shaping else {
        return Ok(Admitted::default());
    };
    let decider = limiter.decider();
    let route = shaping.route(req.method().as_str(), path);
    let rules = shaping.upstream().copied();
    if let Some(rules) = &rules {
        let priority = route.map_or(Priority::Normal, |r| r.priority);
        if let Some(wait) = decider.pressure().shed(priority, decider.now(), rules) {
            decider.metrics().shaping_shed(priority);
            tracing::debug!(
                priority = priority.as_str(),
                retry_after = wait,
                "shed: the upstream is missing its target"
            );
            let wait = crate::spread::spread_secs(wait, &caller(req, settings));
            return Err(Box::new(shed(
                priority,
                decider.pressure().shed_level(),
                wait,
            )));
        }
    }
    let hold = match route.filter(|r| r.capped()) {
        None => None,
        Some(route) => {
            let who = principal(limiter, settings, req, route.in_flight_per).await;
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
    Ok(Admitted { hold, rules })
}

impl Admitted {
    /// The request is handed on now: its wait for the answer's head begins (timed only with
    /// `[shaping.upstream]`; the clock is not read otherwise).
    pub(super) fn sent<'p>(&self, decider: &'p crate::decision::Decider) -> Option<Waiting<'p>> {
        self.rules
            .as_ref()
            .map(|r| decider.pressure().sent(decider.now(), r))
    }

    /// Its answer's head came back with `status`.
    pub(super) fn answered(
        &self,
        decider: &crate::decision::Decider,
        waiting: Option<Waiting<'_>>,
        status: u16,
    ) {
        if let (Some(w), Some(r)) = (waiting, &self.rules) {
            decider.pressure().answered(w, decider.now(), status, r);
        }
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

/// Who a cap counts: the verified token's subject with `in_flight_per = "user"` when the
/// request carries a token that verifies, else its client address.
async fn principal(
    limiter: &FleetLimiter,
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
        let h = super::middleware::header_facts(
            headers,
            peer,
            &settings.trusted,
            limiter.session_cookie(),
        );
        let id = crate::identity::identify(
            limiter.decider().verifier().as_ref(),
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

/// Who `req` is, as a spread wait reads it: its client address (trusted proxies applied,
/// normalised) and its agent id when valid.
pub(super) fn caller(req: &ServiceRequest, settings: &Settings) -> Vec<u8> {
    let ip = super::request::client_address(req.peer_addr(), req.headers(), settings);
    let address = crate::shaping::address_of(ip, settings.ipv6_prefix);
    let agent = req
        .headers()
        .get(super::middleware::X_AGENT_ID)
        .and_then(|v| crate::keys::valid_agent_id(v.as_bytes()));
    crate::spread::principal_bytes(&address, agent)
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
