//! The actix-web middleware: moves request facts into [`Decider`] and its outcome onto the
//! response. No limiting logic lives here.
//!
//! ```no_run
//! use actix_web::{web, App, HttpServer};
//! use fleet_limiter::{Config, FleetLimiter};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let limiter = FleetLimiter::from_config(&Config::default())?;
//! HttpServer::new(move || {
//!     App::new()
//!         .wrap(limiter.clone())
//!         .route("/api/agent/heartbeat", web::post().to(|| async { "ok" }))
//! })
//! .bind(("127.0.0.1", 8080))?
//! .run()
//! .await?;
//! # Ok(())
//! # }
//! ```

use crate::client_ip::{ForwardedHeader, TrustedProxies};
use crate::config::Config;
use crate::decision::{BodyValue, Decider, Outcome, RequestFacts, Settings};
use crate::http::request::{drain_small_body, only_value};
use crate::http::response::{self, Problem};
use crate::keys::body::Unreadable;
use crate::methods::{At, MethodRules, Named, Overrides, Refusal, RefusalReason, Source};
use crate::path::{CanonicalPath, Rejected};
use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{forward_ready, Service, ServiceRequest, ServiceResponse, Transform};
use actix_web::http::header::{
    HeaderMap, HeaderName, HeaderValue, ALLOW, AUTHORIZATION, COOKIE, FORWARDED,
};
use actix_web::http::uri::PathAndQuery;
use actix_web::http::{Method, Uri};
use actix_web::{Error, HttpMessage, HttpResponse};
use futures_util::future::{ready, LocalBoxFuture, Ready};
use smallvec::SmallVec;
use std::net::{IpAddr, Ipv4Addr};
use std::rc::Rc;
use std::sync::Arc;

pub(crate) const X_AGENT_ID: HeaderName = HeaderName::from_static("x-agent-id");
const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// The limiter as an actix-web middleware: `App::new().wrap(FleetLimiter::from_config(&cfg)?)`.
#[derive(Clone)]
pub struct FleetLimiter {
    decider: Arc<Decider>,
    session_cookie: Option<Arc<str>>,
    outcome_extension: bool,
}

impl FleetLimiter {
    pub fn new(decider: Arc<Decider>) -> Self {
        Self {
            decider,
            session_cookie: None,
            outcome_extension: true,
        }
    }

    /// Whether handlers find the decision in a [`Decided`] request extension (on by
    /// default). An app whose handlers never read it, such as the gateway's proxy, turns it off
    /// and saves the extension's allocation on every request.
    pub fn with_outcome_extension(mut self, on: bool) -> Self {
        self.outcome_extension = on;
        self
    }

    /// Read dashboard session tokens from this cookie as well as from `Authorization`.
    pub fn with_session_cookie(mut self, name: impl Into<Arc<str>>) -> Self {
        self.session_cookie = Some(name.into());
        self
    }

    /// This limiter's metrics (its own: another limiter in the process counts apart). Render
    /// them with [`crate::metrics::Metrics::render`] wherever the app exposes metrics.
    pub fn metrics(&self) -> &Arc<crate::metrics::Metrics> {
        self.decider.metrics()
    }

    /// A limiter on the configuration's store (memory; Redis where built with it) with the
    /// system clock.
    pub fn from_config(cfg: &Config) -> Result<Self, crate::error::Error> {
        let limiter = Self::new(Arc::new(crate::wiring::build_decider(cfg)?));
        Ok(limiter.with_session_cookie(cfg.identity.session_cookie.clone()))
    }

    pub fn decider(&self) -> &Arc<Decider> {
        &self.decider
    }

    /// The cookie dashboard session tokens are read from, if any.
    pub(crate) fn session_cookie(&self) -> Option<&str> {
        self.session_cookie.as_deref()
    }
}

/// What the limiter decided about this request, for handlers that want it (a request
/// extension).
#[derive(Clone)]
pub struct Decided(pub Arc<Outcome>);

impl<S, B> Transform<S, ServiceRequest> for FleetLimiter
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = Error> + 'static,
    B: MessageBody + 'static,
{
    type Response = ServiceResponse<EitherBody<B>>;
    type Error = Error;
    type Transform = FleetLimiterService<S>;
    type InitError = ();
    type Future = Ready<Result<Self::Transform, Self::InitError>>;

    fn new_transform(&self, service: S) -> Self::Future {
        ready(Ok(FleetLimiterService {
            service: Rc::new(service),
            limiter: self.clone(),
        }))
    }
}

pub struct FleetLimiterService<S> {
    service: Rc<S>,
    limiter: FleetLimiter,
}

impl<S, B> Service<ServiceRequest> for FleetLimiterService<S>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = Error> + 'static,
    B: MessageBody + 'static,
{
    type Response = ServiceResponse<EitherBody<B>>;
    type Error = Error;
    type Future = LocalBoxFuture<'static, Result<Self::Response, Self::Error>>;

    forward_ready!(service);

    fn call(&self, mut req: ServiceRequest) -> Self::Future {
        let service = self.service.clone();
        let limiter = self.limiter.clone();
        Box::pin(async move {
            let settings = limiter.decider.current();
            // A method no upstream route is there to serve is answered here, never forwarded.
            if !settings.methods.allows(req.method().as_str()) {
                return Ok(refuse_method(&limiter, &settings, req).await);
            }
            // A request that names another method by override is metered as that method too,
            // has the override removed, or is refused (`methods.override`).
            let named = match overrides(&settings, &req) {
                Overrides::None => Named::default(),
                Overrides::Meter(named) => {
                    limiter.decider.metrics().method_override(false);
                    named
                }
                Overrides::Strip => {
                    if let Err(why) = strip_overrides(&mut req, &settings.methods) {
                        return Ok(refuse_override(&limiter, &settings, req, &why).await);
                    }
                    limiter.decider.metrics().method_override(true);
                    Named::default()
                }
                Overrides::Refuse(why) => {
                    return Ok(refuse_override(&limiter, &settings, req, &why).await)
                }
            };
            // Headers that some frameworks route on instead of the target (`X-Original-URL`)
            // never reach what runs after the limiter: the path decided on is the path served.
            strip_path_overrides(&mut req);
            if named.is_empty() && crate::http::cors::is_preflight(req.method(), req.headers()) {
                return Ok(service.call(req).await?.map_into_left_body());
            }
            // The one path: made canonical here, decided on, and what the request carries on.
            let rewritten = match CanonicalPath::parse(req.path(), settings.paths) {
                Ok(p) if !p.is_rewritten() => None,
                Ok(p) => Some(p.into_owned()),
                Err(rejected) => return Ok(reject_path(&limiter, req, &rejected).await),
            };
            let path = match rewritten {
                Some(p) => {
                    if let Err(rejected) = rewrite_path(&mut req, p.as_str()) {
                        return Ok(reject_path(&limiter, req, &rejected).await);
                    }
                    p
                }
                None => CanonicalPath::checked(req.path()),
            };
            // A header a limiter keys on, sent twice, has no one value: keyed on the address
            // instead, a spent key beside a second one would pass where an upstream that reads
            // the first value serves the spent key. Refused, as two `Content-Length` are.
            if settings.enabled {
                if let Some(name) = repeated_key_header(&settings, req.headers()) {
                    return Ok(refuse_repeated_header(req, &name).await);
                }
            }
            // Shaping: a priority shed while the upstream misses its target, or an address at
            // its route's in-flight cap, is answered at once, before any limiter is charged.
            let shaped = match super::shaping::admit(&limiter, &settings, &req, path.as_str()).await
            {
                Ok(shaped) => shaped,
                Err(res) => return Ok(answer_early(req, *res).await),
            };
            // A route a `body:<field>` limiter meters: its body is read (bounded in size and
            // time) and put back as it came; every other request's body streams untouched.
            let fields = if settings.enabled {
                let also = named.methods(&settings.methods);
                settings
                    .policy
                    .body_fields(req.method().as_str(), &also, &path)
            } else {
                SmallVec::new()
            };
            let (path, body_values) = if fields.is_empty() {
                (path, Vec::new())
            } else {
                // The path stops borrowing the request while its body is read.
                let path = path.into_owned();
                match super::body_keys::read(&mut req, &settings, &fields).await {
                    Ok(values) => (path, values),
                    Err(why) => {
                        return Ok(refuse_body(&limiter, &settings, req, &fields, why).await)
                    }
                }
            };
            let started = std::time::Instant::now();
            let outcome = decide(&limiter, &settings, &req, path, named, &body_values).await;
            let decided_at = std::time::Instant::now();
            // The wall clock only when a header counts from it (a Unix-time reset).
            let decided_wall = settings
                .headers
                .reads_wall_clock()
                .then(std::time::SystemTime::now);
            limiter
                .decider
                .observe(&settings, &outcome, decided_at.duration_since(started));
            if outcome.refused() {
                return Ok(answer_refusal(&outcome, &settings, req, decided_wall).await);
            }
            let shared: Arc<Outcome>;
            let outcome: &Outcome = if limiter.outcome_extension {
                shared = Arc::new(outcome);
                req.extensions_mut().insert(Decided(shared.clone()));
                &shared
            } else {
                &outcome
            };
            let timing = shaped.timing(&limiter.decider);
            if let Some(t) = &timing {
                super::shaping::start_when_whole(&mut req, t.clone());
            }
            let answered = service.call(req).await;
            // The answer's status decides whether limiters counting only failed (or only
            // succeeded) answers give the request back; an error is a failed answer. The
            // give-back runs after the response, never in its way. A client that disconnects
            // before the answer drops this future: the request stays counted.
            let status = match &answered {
                Ok(res) => res.status().as_u16(),
                Err(e) => e.as_response_error().status_code().as_u16(),
            };
            if let Some(t) = timing {
                t.answered(status);
            }
            if let Some(work) = limiter
                .decider
                .give_back(&settings, outcome, status, || decided_at.elapsed())
            {
                actix_web::rt::spawn(work);
            }
            let mut res = answered?;
            let told = told_wait(&res);
            response::apply_headers_told(
                res.headers_mut(),
                outcome,
                &settings.headers,
                decided_wall,
                told,
            );
            Ok(shaped.hold_until_sent(res))
        })
    }
}

/// What to do about the method overrides `req` names (see [`crate::methods`]).
fn overrides(settings: &Settings, req: &ServiceRequest) -> Overrides {
    let headers = req
        .headers()
        .iter()
        .map(|(name, value)| (name.as_str(), value.as_bytes()));
    settings
        .methods
        .judge(headers, req.uri().query(), At::Gateway)
}

/// Remove the headers with which some frameworks route a request to another path
/// ([`crate::path::PATH_OVERRIDE_HEADERS`], in any spelling).
fn strip_path_overrides(req: &mut ServiceRequest) {
    let named = req
        .headers()
        .keys()
        .any(|name| crate::path::is_path_override_header(name.as_str()));
    if !named {
        return;
    }
    let names: SmallVec<[HeaderName; 2]> = req
        .headers()
        .keys()
        .filter(|name| crate::path::is_path_override_header(name.as_str()))
        .cloned()
        .collect();
    for name in names {
        req.headers_mut().remove(name);
    }
}

/// Remove every override header and query parameter from `req`, so that what runs after the
/// limiter (the gateway's proxy, or the app) never sees them.
fn strip_overrides(req: &mut ServiceRequest, rules: &MethodRules) -> Result<(), Refusal> {
    let names: SmallVec<[HeaderName; 2]> = req
        .headers()
        .keys()
        .filter(|name| rules.is_override_header(name.as_str()))
        .cloned()
        .collect();
    for name in names {
        req.headers_mut().remove(name);
    }
    let Some(query) = req.uri().query().and_then(|q| rules.strip_query(q)) else {
        return Ok(());
    };
    let pq = if query.is_empty() {
        req.path().to_owned()
    } else {
        format!("{}?{query}", req.path())
    };
    // The query is the request's own, less some parameters, so this cannot fail; if it did,
    // the request could not be forwarded without them, so it is refused.
    let unusable = || {
        let name = rules.params().next().unwrap_or("_method");
        Refusal::Unstrippable(Source::Param(name.into()))
    };
    let mut parts = req.uri().clone().into_parts();
    parts.path_and_query = Some(PathAndQuery::try_from(pq).map_err(|_| unusable())?);
    let uri = Uri::from_parts(parts).map_err(|_| unusable())?;
    req.match_info_mut().get_mut().update(&uri);
    req.head_mut().uri = uri;
    Ok(())
}

/// Answer 501 with `Allow` for a method outside `methods.allowed`, before any limiter or the
/// app sees the request.
async fn refuse_method<B>(
    limiter: &FleetLimiter,
    settings: &Settings,
    req: ServiceRequest,
) -> ServiceResponse<EitherBody<B>> {
    limiter
        .decider
        .metrics()
        .method_refused(RefusalReason::Method);
    tracing::debug!(method = %req.method(), "method not forwarded");
    let allow = settings.methods.allow();
    let mut res = Problem::unsupported_method(req.method().as_str(), allow).into_response();
    if let Ok(v) = HeaderValue::from_str(allow) {
        res.headers_mut().insert(ALLOW, v);
    }
    answer_early(req, res).await
}

/// Answer 400 for a method override refused, before any limiter or the app sees the request.
async fn refuse_override<B>(
    limiter: &FleetLimiter,
    settings: &Settings,
    req: ServiceRequest,
    why: &Refusal,
) -> ServiceResponse<EitherBody<B>> {
    limiter.decider.metrics().method_refused(why.reason());
    tracing::debug!(reason = why.reason().as_str(), "method override refused");
    let res = Problem::method_override(why.detail(&settings.methods)).into_response();
    answer_early(req, res).await
}

/// Send a gateway-made answer in place of the request. After a CONNECT (whose body runs until
/// the connection ends) or an upgrade, what the client sends next on this connection would not
/// be HTTP: it closes. Otherwise a small body is drained so the connection can stay open.
async fn answer_early<B>(
    req: ServiceRequest,
    mut res: HttpResponse,
) -> ServiceResponse<EitherBody<B>> {
    let (http_req, mut payload) = req.into_parts();
    if http_req.method() == Method::CONNECT || http_req.head().upgrade() {
        res.head_mut()
            .set_connection_type(actix_web::http::ConnectionType::Close);
    } else {
        drain_small_body(&mut payload).await;
    }
    ServiceResponse::new(http_req, res).map_into_right_body()
}

/// The `Retry-After` of a 503 the gateway made itself behind the limiter (admission control
/// shed the request): the limit headers' resets say the same.
fn told_wait<B>(res: &ServiceResponse<B>) -> Option<u64> {
    if res.status() != actix_web::http::StatusCode::SERVICE_UNAVAILABLE
        || !res
            .response()
            .extensions()
            .contains::<response::GatewayMade>()
    {
        return None;
    }
    res.headers()
        .get(actix_web::http::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

/// The answer to a request a limiter refused: 429 with the limit headers and `Retry-After` of
/// the outcome, or 503 when only the store's failure refused it (see [`response::refusal`]). A refused upgrade (a WebSocket handshake) has nothing to drain, and what the
/// client sends next on its connection would not be HTTP: it closes. Any other drains a small
/// body so its connection can stay open.
async fn answer_refusal<B>(
    outcome: &Outcome,
    settings: &Settings,
    req: ServiceRequest,
    decided_wall: Option<std::time::SystemTime>,
) -> ServiceResponse<EitherBody<B>> {
    let who = if outcome.store_unavailable() {
        crate::spread::caller(req.peer_addr(), req.headers(), settings)
    } else {
        Vec::new()
    };
    let mut res = response::refusal(outcome, &settings.headers, decided_wall, &who);
    let (http_req, mut payload) = req.into_parts();
    if http_req.head().upgrade() {
        res.head_mut()
            .set_connection_type(actix_web::http::ConnectionType::Close);
    } else {
        drain_small_body(&mut payload).await;
    }
    ServiceResponse::new(http_req, res).map_into_right_body()
}

/// A request on a `body:` route whose body cannot be read with certainty: refused with the
/// reason's status and a problem document naming it; no limiter is charged. Counted by reason
/// and logged at debug level (the body is the client's, never logged).
async fn refuse_body<B>(
    limiter: &FleetLimiter,
    settings: &Settings,
    req: ServiceRequest,
    fields: &[Arc<str>],
    why: Unreadable,
) -> ServiceResponse<EitherBody<B>> {
    let field = fields.first().map_or("", |f| &**f);
    let max_bytes = settings.body_key_max_bytes;
    limiter.decider().metrics().body_refused(why);
    tracing::debug!(
        reason = why.as_str(),
        field,
        "request body refused for a body key"
    );
    let res = Problem::unreadable_body(why, field, max_bytes).into_response();
    let (http_req, mut payload) = req.into_parts();
    if matches!(
        why,
        Unreadable::TooLarge | Unreadable::TooSlow | Unreadable::Broken
    ) {
        // What is left of a body too large or too slow is not waited for: the connection closes.
        let mut res = res;
        res.head_mut()
            .set_connection_type(actix_web::http::ConnectionType::Close);
        return ServiceResponse::new(http_req, res).map_into_right_body();
    }
    drain_small_body(&mut payload).await;
    ServiceResponse::new(http_req, res).map_into_right_body()
}

/// The first header a limiter keys on that `headers` holds more than once.
fn repeated_key_header(settings: &Settings, headers: &HeaderMap) -> Option<Arc<str>> {
    settings
        .policy
        .key_headers()
        .iter()
        .find(|name| headers.get_all(&***name).nth(1).is_some())
        .cloned()
}

/// Answer 400 for a key header sent more than once, before any limiter or the app sees it.
async fn refuse_repeated_header<B>(
    req: ServiceRequest,
    name: &str,
) -> ServiceResponse<EitherBody<B>> {
    tracing::debug!(
        header = name,
        "request refused: a key header sent more than once"
    );
    let res = Problem {
        kind: "urn:fleet-limiter:problem:repeated-key-header",
        title: "Bad Request",
        status: 400,
        detail: format!(
            "The `{name}` header was sent more than once. A rate limiter keys on it, and its values would be read differently here and upstream; send it once."
        ),
        retry_after: None,
    }
    .into_response();
    let (http_req, mut payload) = req.into_parts();
    drain_small_body(&mut payload).await;
    ServiceResponse::new(http_req, res).map_into_right_body()
}

/// Answer 400 for a path with no canonical form, before any limiter or the app sees it.
async fn reject_path<B>(
    limiter: &FleetLimiter,
    req: ServiceRequest,
    rejected: &Rejected,
) -> ServiceResponse<EitherBody<B>> {
    limiter.decider.metrics().path_rejected(rejected.class);
    tracing::debug!(
        class = rejected.class.as_str(),
        at = rejected.at,
        "path refused"
    );
    let res = Problem::non_canonical_path(rejected).into_response();
    let (http_req, mut payload) = req.into_parts();
    drain_small_body(&mut payload).await;
    ServiceResponse::new(http_req, res).map_into_right_body()
}

/// Give the request its canonical path (the query unchanged), so that what runs after the
/// limiter — the gateway's proxy, or the app's own routes — sees the path that was decided on.
fn rewrite_path(req: &mut ServiceRequest, path: &str) -> Result<(), Rejected> {
    let uri = req.uri();
    let pq = match uri.query() {
        Some(q) => format!("{path}?{q}"),
        None => path.to_owned(),
    };
    let mut parts = uri.clone().into_parts();
    // The canonical form is ASCII made of URI characters only, so this cannot fail; if it did,
    // the request could not be forwarded as decided, so it is refused rather than passed on.
    let unusable = Rejected {
        class: crate::path::Class::InvalidEscape,
        at: 0,
    };
    parts.path_and_query = Some(PathAndQuery::try_from(pq).map_err(|_| unusable)?);
    let uri = Uri::from_parts(parts).map_err(|_| unusable)?;
    req.match_info_mut().get_mut().update(&uri);
    req.head_mut().uri = uri;
    Ok(())
}

async fn decide(
    limiter: &FleetLimiter,
    settings: &Settings,
    req: &ServiceRequest,
    path: CanonicalPath<'_>,
    named: Named,
    body: &[BodyValue],
) -> Outcome {
    if !settings.enabled {
        return Outcome::default();
    }
    let headers = req.headers();
    let peer = req
        .peer_addr()
        .map(|a| a.ip())
        .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
    let h = header_facts(
        headers,
        peer,
        &settings.trusted,
        limiter.session_cookie.as_deref(),
    );
    let lookup = |name: &str| crate::http::middleware::only_value(headers, name);
    let facts = RequestFacts {
        peer,
        method: req.method().as_str(),
        path,
        forwarded: &h.forwarded,
        agent_id: h.agent_id,
        authorization: h.authorization,
        session_token: h.session_token,
        key_headers: crate::decision::KeyHeaders::new(&lookup).with_body(body),
    };
    let also = named.methods(&settings.methods);
    limiter
        .decider
        .decide_overridden(settings, &facts, &also)
        .await
}

/// What a decision reads from a request's headers, borrowed from them.
pub(crate) struct HeaderFacts<'a> {
    /// Every value of the configured forwarding header, only when the peer is a trusted proxy.
    pub forwarded: SmallVec<[&'a [u8]; 2]>,
    pub agent_id: Option<&'a [u8]>,
    pub authorization: Option<&'a [u8]>,
    /// The dashboard session token from the `session_cookie` cookie, when one was sent.
    pub session_token: Option<&'a str>,
}

/// The header facts of a request from `peer`: the same reading for the middleware and for the
/// decision endpoint (where the headers are the original request's, passed on by the proxy).
pub(crate) fn header_facts<'a>(
    headers: &'a HeaderMap,
    peer: IpAddr,
    trusted: &TrustedProxies,
    session_cookie: Option<&str>,
) -> HeaderFacts<'a> {
    // Forwarding headers count only from a trusted proxy: from anyone else they are not read.
    let forwarded = if trusted.contains(peer) {
        headers
            .get_all(forwarded_header(trusted.header))
            .map(|v| v.as_bytes())
            .collect()
    } else {
        SmallVec::new()
    };
    HeaderFacts {
        forwarded,
        agent_id: headers.get(X_AGENT_ID).map(|v| v.as_bytes()),
        authorization: headers.get(AUTHORIZATION).map(|v| v.as_bytes()),
        session_token: session_cookie
            .and_then(|name| cookie_value(headers.get_all(COOKIE).map(|v| v.as_bytes()), name)),
    }
}

fn forwarded_header(h: ForwardedHeader) -> HeaderName {
    match h {
        ForwardedHeader::XForwardedFor => X_FORWARDED_FOR,
        ForwardedHeader::Forwarded => FORWARDED,
    }
}

/// The value of cookie `name` among `Cookie` header values; malformed pairs are skipped.
pub(crate) fn cookie_value<'a>(
    values: impl Iterator<Item = &'a [u8]>,
    name: &str,
) -> Option<&'a str> {
    for v in values {
        let Ok(s) = std::str::from_utf8(v) else {
            continue;
        };
        for pair in s.split(';') {
            if let Some((k, val)) = pair.split_once('=') {
                if k.trim() == name {
                    let val = val.trim().trim_matches('"');
                    if !val.is_empty() {
                        return Some(val);
                    }
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::{test, web, App, HttpRequest, HttpResponse};

    /// The app behind the limiter says what it was given: method, target and override header.
    async fn echo(req: HttpRequest) -> HttpResponse {
        let overrides: Vec<String> = req
            .headers()
            .iter()
            .filter(|(n, _)| n.as_str().contains("method"))
            .map(|(n, v)| format!("{n}={}", v.to_str().unwrap_or("?")))
            .collect();
        HttpResponse::Ok().body(format!("{} {} {overrides:?}", req.method(), req.uri()))
    }

    fn limiter(env: &[(&str, &str)]) -> FleetLimiter {
        let cfg = crate::config::Loader::new()
            .env(env.iter().map(|(k, v)| (k.to_string(), v.to_string())))
            .load()
            .expect("config");
        FleetLimiter::from_config(&cfg).expect("limiter")
    }

    #[actix_rt::test]
    async fn the_app_behind_it_never_sees_a_stripped_override() {
        let app = test::init_service(
            App::new()
                .wrap(limiter(&[("FLEET_LIMITER_METHOD_OVERRIDE", "strip")]))
                .default_service(web::to(echo)),
        )
        .await;
        let req = test::TestRequest::post()
            .uri("/api/agent/download/linux?a=1&_method=GET&b=2")
            .insert_header(("X-HTTP-Method-Override", "GET"))
            .insert_header(("x_http_method", "GET"))
            .insert_header(("x-agent-id", "a-1"))
            .to_request();
        let res = test::call_service(&app, req).await;
        assert_eq!(res.status(), 200);
        let body = test::read_body(res).await;
        assert_eq!(body, "POST /api/agent/download/linux?a=1&b=2 []");
    }

    /// The app behind the limiter says what body it was given.
    async fn body_echo(body: web::Bytes) -> HttpResponse {
        HttpResponse::Ok().body(body)
    }

    #[actix_rt::test]
    async fn the_app_reads_the_body_the_limiter_read_for_its_key() {
        let env = [
            ("FLEET_LIMITER_LIMITER_DST_LIMIT", "1"),
            ("FLEET_LIMITER_LIMITER_DST_WINDOW", "1h"),
            ("FLEET_LIMITER_LIMITER_DST_KEY", "body:email"),
            ("FLEET_LIMITER_LIMITER_DST_ROUTES", "POST /auth/email"),
            ("FLEET_LIMITER_LIMITER_DST_DISCLOSE", "false"),
            ("FLEET_LIMITER_LIMITER_SRC_LIMIT", "100"),
            ("FLEET_LIMITER_LIMITER_SRC_WINDOW", "1h"),
            ("FLEET_LIMITER_LIMITER_SRC_KEY", "ip"),
            ("FLEET_LIMITER_LIMITER_SRC_ROUTES", "POST /auth/email"),
        ];
        let app = test::init_service(
            App::new()
                .wrap(limiter(&env))
                .default_service(web::to(body_echo)),
        )
        .await;
        let post = |body: &'static str| {
            test::TestRequest::post()
                .uri("/auth/email")
                .insert_header(("content-type", "application/json"))
                .set_payload(body)
                .to_request()
        };
        let first = r#"{ "email" : "Victim@Example.com" }"#;
        let res = test::call_service(&app, post(first)).await;
        assert_eq!(res.status(), 200);
        assert_eq!(
            test::read_body(res).await,
            first,
            "the app reads the body as sent"
        );
        // The same inbox, spelled otherwise: its budget of one is spent.
        let res = test::call_service(&app, post(r#"{"email":"victim+x@example.com"}"#)).await;
        assert_eq!(res.status(), 429);
        assert!(res
            .headers()
            .keys()
            .all(|k| !k.as_str().contains("ratelimit")));
        // Another inbox from the same address, and a body the limiter does not read.
        let other = r#"{"email":"someone@example.com"}"#;
        let res = test::call_service(&app, post(other)).await;
        assert_eq!(res.status(), 200);
        assert_eq!(test::read_body(res).await, other);
        let req = test::TestRequest::post()
            .uri("/auth/other")
            .insert_header(("content-type", "application/json"))
            .set_payload(first)
            .to_request();
        let res = test::call_service(&app, req).await;
        assert_eq!(test::read_body(res).await, first);
    }

    #[actix_rt::test]
    async fn methods_outside_the_list_never_reach_the_app() {
        let app =
            test::init_service(App::new().wrap(limiter(&[])).default_service(web::to(echo))).await;
        for m in ["CONNECT", "TRACE", "PROPFIND", "get"] {
            let req = test::TestRequest::default()
                .method(Method::from_bytes(m.as_bytes()).expect("method"))
                .uri("/api/agent/rotate-key")
                .to_request();
            let res = test::call_service(&app, req).await;
            assert_eq!(res.status(), 501, "{m}");
            assert_eq!(
                res.headers().get(ALLOW).and_then(|v| v.to_str().ok()),
                Some("GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS")
            );
        }
        // An override a metering limiter will not guess at is refused before the app.
        let req = test::TestRequest::post()
            .uri("/api/agent/rotate-key?_method=PROPFIND")
            .to_request();
        let res = test::call_service(&app, req).await;
        assert_eq!(res.status(), 400);
        // A CORS preflight that names an override is no longer a preflight: it is metered.
        let req = test::TestRequest::default()
            .method(Method::OPTIONS)
            .uri("/api/agent/rotate-key")
            .insert_header(("origin", "https://dash.example"))
            .insert_header(("access-control-request-method", "POST"))
            .insert_header(("x-http-method-override", "POST"))
            .to_request();
        let res = test::call_service(&app, req).await;
        assert_eq!(res.status(), 200);
        // The default headers (draft 6): agent-device's 30 a minute among the policies.
        assert!(
            res.headers().get("ratelimit-policy").is_some_and(|v| v
                .as_bytes()
                .split(|b| *b == b',')
                .any(|p| p.trim_ascii() == b"30;w=60")),
            "{:?}",
            res.headers()
        );
    }
}
