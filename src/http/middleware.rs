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

use super::early::{
    answer_early, answer_refusal, refuse_body, refuse_method, refuse_override,
    refuse_repeated_header, reject_path, repeated_key_header, told_wait,
};
use super::request::{header_facts, only_value};
use super::response;
use super::rewrite::{overrides, rewrite_path, strip_overrides, strip_path_overrides};
use super::shaping::{Admitted, Timing};
use crate::config::Config;
use crate::decision::{BodyValue, Decider, Outcome, RequestFacts, Settings};
use crate::methods::{Named, Overrides};
use crate::path::CanonicalPath;
use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{forward_ready, Service, ServiceRequest, ServiceResponse, Transform};
use actix_web::{Error, HttpMessage};
use futures_util::future::{ready, LocalBoxFuture, Ready};
use smallvec::SmallVec;
use std::net::{IpAddr, Ipv4Addr};
use std::rc::Rc;
use std::sync::Arc;

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

    fn call(&self, req: ServiceRequest) -> Self::Future {
        Box::pin(limit(self.limiter.clone(), self.service.clone(), req))
    }
}

/// One request through the limiter, step by step: its methods and path judged, its shaping
/// admitted, its body keys read, the decision taken, then refused or passed on to the app.
async fn limit<S, B>(
    limiter: FleetLimiter,
    service: Rc<S>,
    mut req: ServiceRequest,
) -> Result<ServiceResponse<EitherBody<B>>, Error>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = Error>,
    B: MessageBody + 'static,
{
    let limiter = &limiter;
    let service = &*service;
    let settings = limiter.decider.current();
    let decider = &*limiter.decider;
    let named = match judge_methods(decider, &settings, &mut req) {
        Ok(named) => named,
        Err(early) => return Ok(early.answer(decider, &settings, req).await),
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
        Err(rejected) => return Ok(reject_path(decider, req, &rejected).await),
    };
    let path = match rewritten {
        Some(p) => {
            if let Err(rejected) = rewrite_path(&mut req, p.as_str()) {
                return Ok(reject_path(decider, req, &rejected).await);
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
    let cookie = limiter.session_cookie();
    let shaped = match super::shaping::admit(decider, cookie, &settings, &req, path.as_str()).await
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
            Err(why) => return Ok(refuse_body(decider, &settings, req, &fields, why).await),
        }
    };
    let started = std::time::Instant::now();
    let outcome = decide(limiter, &settings, &req, path, named, &body_values).await;
    let decided = DecidedAt::now(&settings);
    decider.observe(&settings, &outcome, decided.at.duration_since(started));
    if outcome.refused() {
        return Ok(answer_refusal(&outcome, &settings, req, decided.wall).await);
    }
    let (kept, timing) = before_app(limiter, &mut req, outcome, &shaped);
    let answered = service.call(req).await;
    after_app(
        limiter, &settings, &kept, answered, timing, &decided, shaped,
    )
}

/// A method override refused or a method not forwarded: answered before anything else.
enum EarlyMethod {
    Method,
    Override(crate::methods::Refusal),
}

impl EarlyMethod {
    async fn answer<B>(
        self,
        decider: &Decider,
        settings: &Settings,
        req: ServiceRequest,
    ) -> ServiceResponse<EitherBody<B>> {
        match self {
            Self::Method => refuse_method(decider, settings, req).await,
            Self::Override(why) => refuse_override(decider, settings, req, &why).await,
        }
    }
}

/// The request's method and the methods it names by override: a method no upstream route is
/// there to serve is answered here, never forwarded; a request that names another method by
/// override is metered as that method too, has the override removed, or is refused
/// (`methods.override`).
#[inline]
fn judge_methods(
    decider: &Decider,
    settings: &Settings,
    req: &mut ServiceRequest,
) -> Result<Named, EarlyMethod> {
    if !settings.methods.allows(req.method().as_str()) {
        return Err(EarlyMethod::Method);
    }
    match overrides(settings, req) {
        Overrides::None => Ok(Named::default()),
        Overrides::Meter(named) => {
            decider.metrics().method_override(false);
            Ok(named)
        }
        Overrides::Strip => {
            strip_overrides(req, &settings.methods).map_err(EarlyMethod::Override)?;
            decider.metrics().method_override(true);
            Ok(Named::default())
        }
        Overrides::Refuse(why) => Err(EarlyMethod::Override(why)),
    }
}

/// When the decision was taken: the monotonic instant, and the wall clock only when a header
/// counts from it (a Unix-time reset).
struct DecidedAt {
    at: std::time::Instant,
    wall: Option<std::time::SystemTime>,
}

impl DecidedAt {
    fn now(settings: &Settings) -> Self {
        Self {
            at: std::time::Instant::now(),
            wall: settings
                .headers
                .reads_wall_clock()
                .then(std::time::SystemTime::now),
        }
    }
}

/// The decision, kept for the answer: shared with the app through a request extension when
/// asked for, else owned here.
enum Kept {
    Shared(Arc<Outcome>),
    Owned(Outcome),
}

impl Kept {
    fn get(&self) -> &Outcome {
        match self {
            Self::Shared(o) => o,
            Self::Owned(o) => o,
        }
    }
}

/// An allowed request, before the app: the decision put in its extensions (when asked for)
/// and its wait at the upstream timed (when shaped).
fn before_app(
    limiter: &FleetLimiter,
    req: &mut ServiceRequest,
    outcome: Outcome,
    shaped: &Admitted,
) -> (Kept, Option<Rc<Timing>>) {
    let kept = if limiter.outcome_extension {
        let shared = Arc::new(outcome);
        req.extensions_mut().insert(Decided(shared.clone()));
        Kept::Shared(shared)
    } else {
        Kept::Owned(outcome)
    };
    let timing = shaped.timing(&limiter.decider);
    if let Some(t) = &timing {
        super::shaping::start_when_whole(req, t.clone());
    }
    (kept, timing)
}

/// The app's answer: limiters counting only some answers given back after it (an error is a
/// failed answer), and the limit headers put on it.
fn after_app<B>(
    limiter: &FleetLimiter,
    settings: &Settings,
    kept: &Kept,
    answered: Result<ServiceResponse<B>, Error>,
    timing: Option<Rc<Timing>>,
    decided: &DecidedAt,
    shaped: Admitted,
) -> Result<ServiceResponse<EitherBody<B>>, Error>
where
    B: MessageBody + 'static,
{
    let outcome = kept.get();
    // The answer's status decides whether limiters counting only failed (or only
    // succeeded) answers give the request back. The give-back runs after the response,
    // never in its way. A client that disconnects before the answer drops the request's
    // future: the request stays counted.
    let status = match &answered {
        Ok(res) => res.status().as_u16(),
        Err(e) => e.as_response_error().status_code().as_u16(),
    };
    if let Some(t) = timing {
        t.answered(status);
    }
    let at = decided.at;
    if let Some(work) = limiter
        .decider
        .give_back(settings, outcome, status, || at.elapsed())
    {
        actix_web::rt::spawn(work);
    }
    let mut res = answered?;
    let told = told_wait(&res);
    response::apply_headers_told(
        res.headers_mut(),
        outcome,
        &settings.headers,
        decided.wall,
        told,
    );
    Ok(shaped.hold_until_sent(res))
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
    let lookup = |name: &str| only_value(headers, name);
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

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::http::header::ALLOW;
    use actix_web::http::Method;
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
