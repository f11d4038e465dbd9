//! The forward-auth decision endpoint: the limiter for a proxy that stays in front (nginx
//! `auth_request`, Caddy `forward_auth`, Traefik `ForwardAuth`, Envoy `ext_authz`).
//!
//! The proxy asks before it forwards, and this answers from the same canonical path, trust
//! rules, identity, policy, keys and store as the gateway. Each proxy passes the original
//! request its own way, so each has its own path here:
//!
//! | path | original method and URI | refusal |
//! |---|---|---|
//! | `/nginx` | `X-Original-Method`, `X-Original-URI` | `403` (nginx passes only 401 and 403 on), with `X-FleetLimiter-Status: 429` and the problem document in `X-FleetLimiter-Problem` for the proxy to answer with |
//! | `/caddy`, `/traefik`, `/forward` | `X-Forwarded-Method`, `X-Forwarded-Uri` | `429` problem+json with `Retry-After`, which the proxy sends to the client as it is |
//! | `/envoy/<path>` | the check request's own method, and its path after `/envoy` | `429`, as above (a store that cannot answer too, with `X-FleetLimiter-Status: 503`: Envoy takes a 5xx for its own failure to ask) |
//!
//! Allowed: `200`, empty, with the `RateLimit*` headers for the proxy to copy onto its answer.
//!
//! The proxy forwards the original target as it was sent, and this cannot rewrite it, so only a
//! target that is its own canonical form is metered ([`CanonicalPath::exact`]): a path with no
//! canonical form, one the gateway would have rewritten (`//x/…`, `/a/../b`, `%72`, lower-case
//! hex, raw non-ASCII), a `#` and a target that is not a path are refused with `400`
//! `non-canonical-path` naming the class (`401` on `/nginx`, with `X-FleetLimiter-Status: 400`).
//! So is a question whose original-request headers are sent twice, or contradict each other
//! (`X-Original-URI` and `X-Forwarded-Uri` naming two targets).
//! A method outside `methods.allowed`: `501` with `Allow` (`/nginx`: `401`, status 400); a
//! method override in the original headers or query: metered as every method it names, or
//! `400` (see `methods_and_overrides`).
//! The client's address is read from the forwarding header exactly as the gateway reads it
//! (`client_ip.trust_proxy`); the other headers (`X-Agent-ID`, `Authorization`, the session
//! cookie) are the original request's, which every one of these proxies passes along.
//! Only the proxies in `decision.allow_from` are answered: anyone else gets `403`, so the
//! endpoint cannot be used to spend other clients' budgets.

use crate::config::headers::HeaderProfile;
use crate::config::Config;
use crate::decision::{Decider, Outcome, RequestFacts, Settings};
use crate::http::request::header_facts;
use crate::http::response::{self, Problem};
use crate::methods::{At, Named, Overrides, RefusalReason};
use crate::path::{CanonicalPath, Class, PathRules, Rejected};
use actix_web::body::MessageBody;
use actix_web::http::header::{
    HeaderMap, HeaderName, HeaderValue, ALLOW, CONTENT_TYPE, RETRY_AFTER,
};
use actix_web::http::StatusCode;
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use ipnet::IpNet;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

/// The status the client should get, where the proxy cannot pass it on itself (`/nginx`).
pub(crate) const STATUS_HEADER: HeaderName = HeaderName::from_static("x-fleetlimiter-status");
/// The problem document the client should get, where the proxy drops the answer's body.
pub(crate) const PROBLEM_HEADER: HeaderName = HeaderName::from_static("x-fleetlimiter-problem");
/// The longest original URI read; a longer one is refused as a bad request.
const MAX_URI_LEN: usize = 8 * 1024;

/// How a proxy passes the original request, and what it can pass back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flavour {
    /// nginx `auth_request`: only 2xx, 401 and 403 mean anything to it.
    Nginx,
    /// Caddy `forward_auth`, Traefik `ForwardAuth` and the Express client
    /// (`clients/express`): `X-Forwarded-Method`/`-Uri`.
    Forwarded,
    /// Envoy `ext_authz`: the check request is the original, its path behind a prefix.
    Envoy,
}

/// The endpoint's state: the shared decider, who may ask, and where session tokens live.
#[derive(Clone)]
pub(crate) struct Endpoint {
    decider: Arc<Decider>,
    allow_from: Arc<[IpNet]>,
    session_cookie: Option<Arc<str>>,
}

impl Endpoint {
    pub(crate) fn new(cfg: &Config, decider: Arc<Decider>) -> Self {
        Self {
            decider,
            allow_from: cfg.decision.allow_from.clone().into(),
            session_cookie: Some(cfg.identity.session_cookie.clone().into()),
        }
    }

    fn allows(&self, peer: IpAddr) -> bool {
        let peer = peer.to_canonical();
        self.allow_from.iter().any(|n| n.contains(&peer))
    }
}

/// The decision server on `decision.listen`, bound (its addresses logged) and ready to run.
pub(crate) fn bind(
    cfg: &Config,
    decider: Arc<Decider>,
) -> Result<Option<actix_web::dev::Server>, crate::error::Error> {
    use crate::http::listeners::{self, Role};
    let Some(listen) = cfg.decision.listen else {
        if listeners::handed(Role::Decision) {
            return Err(crate::error::Error::serve("LISTEN_FDS: a decision socket was handed over but decision.listen is not set; set decision.listen (FLEET_LIMITER_DECISION_LISTEN, the socket's address) to turn the decision endpoint on, or drop the socket from the .socket unit"));
        }
        return Ok(None);
    };
    let endpoint = Endpoint::new(cfg, decider);
    let server = HttpServer::new(move || {
        App::new()
            .app_data(web::Data::new(endpoint.clone()))
            .default_service(web::to(answer))
    })
    .disable_signals()
    .shutdown_timeout(cfg.ops.shutdown_grace.as_secs_f64().ceil() as u64);
    let server = listeners::listener(cfg, Role::Decision, listen)
        .and_then(|l| server.listen(l))
        .map_err(|e| {
            crate::error::ListenError::new(cfg, "decision.listen", "--decision-listen", listen, &e)
        })?;
    for addr in server.addrs() {
        tracing::info!(decision_listen = %addr, "decision listener started: /nginx /caddy /traefik /forward /envoy/<path>");
    }
    Ok(Some(server.run()))
}

/// Answer one proxy's question.
pub(crate) async fn answer(req: HttpRequest, endpoint: web::Data<Endpoint>) -> HttpResponse {
    let peer = req
        .peer_addr()
        .map(|a| a.ip())
        .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
    if !endpoint.allows(peer) {
        tracing::warn!(peer = %peer, "decision asked by an address not in decision.allow_from; refused");
        return Problem {
            kind: "urn:fleet-limiter:problem:not-an-allowed-proxy",
            title: "Forbidden",
            status: 403,
            detail: "This address may not ask for decisions; add it to decision.allow_from."
                .to_owned(),
            retry_after: None,
        }
        .into_response();
    }
    let own_path = req.path();
    let flavour = if own_path == "/nginx" {
        Flavour::Nginx
    } else if own_path == "/caddy" || own_path == "/traefik" || own_path == "/forward" {
        Flavour::Forwarded
    } else if let Some(rest) = own_path.strip_prefix("/envoy") {
        if !rest.starts_with('/') {
            return bad_request(Flavour::Envoy, "The Envoy path prefix is `/envoy`: set `path_prefix: /envoy` in the ext_authz http_service.".to_owned());
        }
        Flavour::Envoy
    } else {
        return Problem {
            kind: "urn:fleet-limiter:problem:unknown-decision-path",
            title: "Not Found",
            status: 404,
            detail: "Ask at /nginx, /caddy, /traefik, /forward or /envoy/<path>.".to_owned(),
            retry_after: None,
        }
        .into_response();
    };
    let headers = req.headers();
    let settings = endpoint.decider.settings();
    let (method, uri) = match original(&req, flavour) {
        Ok(o) => o,
        Err(Refusal::Question(detail)) => return bad_request(flavour, detail),
        Err(Refusal::Target(rejected)) => {
            return refuse_target(&endpoint, flavour, &rejected);
        }
    };
    if let Err(detail) = check_question(method, uri) {
        return bad_request(flavour, detail);
    }
    // Methods and method overrides (see `methods_and_overrides` below).
    let named = match methods_and_overrides(&endpoint, &settings, flavour, &req, method, uri) {
        Ok(named) => named,
        Err(res) => return *res,
    };
    // The proxy forwards the target as it was sent: only a target that is its own canonical
    // form is metered, so the path decided on is the path the upstream routes on.
    let path = match target_path(uri, settings.paths) {
        Ok(p) => p,
        Err(rejected) => return refuse_target(&endpoint, flavour, &rejected),
    };
    let h = header_facts(
        headers,
        peer,
        &settings.trusted,
        endpoint.session_cookie.as_deref(),
    );
    let lookup = |name: &str| crate::http::request::only_value(headers, name);
    let facts = RequestFacts {
        peer,
        method,
        path,
        forwarded: &h.forwarded,
        agent_id: h.agent_id,
        authorization: h.authorization,
        session_token: h.session_token,
        key_headers: crate::decision::KeyHeaders::new(&lookup),
    };
    let started = std::time::Instant::now();
    let also = named.methods(&settings.methods);
    let outcome = endpoint
        .decider
        .decide_overridden(&settings, &facts, &also)
        .await;
    endpoint
        .decider
        .observe(&settings, &outcome, started.elapsed());
    render(flavour, &outcome, &settings.headers, || {
        crate::spread::caller(req.peer_addr(), headers, &settings)
    })
}

/// Why a question is not answered with a decision.
enum Refusal {
    /// The question itself is malformed: a header missing, sent twice, or contradicted.
    Question(String),
    /// The original target is not one the limiter meters as the upstream will route it.
    Target(Rejected),
}

/// The headers that can name the original request: each proxy sets one pair, and may pass the
/// other pair on from its client.
const ORIGINAL_HEADERS: [(HeaderName, &str); 4] = [
    (X_ORIGINAL_METHOD, "X-Original-Method"),
    (X_ORIGINAL_URI, "X-Original-URI"),
    (X_FORWARDED_METHOD, "X-Forwarded-Method"),
    (X_FORWARDED_URI, "X-Forwarded-Uri"),
];
const X_ORIGINAL_METHOD: HeaderName = HeaderName::from_static("x-original-method");
const X_ORIGINAL_URI: HeaderName = HeaderName::from_static("x-original-uri");
const X_FORWARDED_METHOD: HeaderName = HeaderName::from_static("x-forwarded-method");
const X_FORWARDED_URI: HeaderName = HeaderName::from_static("x-forwarded-uri");

/// The original request's method and target as the proxy names them. Every header that can
/// name them is sent at most once (a second one did not come from the proxy, and which of the
/// two the upstream's request matches cannot be told), and a header of another proxy's kind,
/// when present, must name the same method or target as the one this path reads (it came from
/// the client or another hop; something downstream may act on it).
fn original(req: &HttpRequest, flavour: Flavour) -> Result<(&str, &str), Refusal> {
    let envoy = || {
        let target = req.uri().path_and_query().map_or("/", |pq| pq.as_str());
        envoy_original(req.method().as_str(), target)
    };
    original_of(req.headers(), flavour, envoy)
}

/// The check request is the original, its target behind `/envoy` (which `answer` has checked
/// is there).
fn envoy_original<'a>(method: &'a str, target: &'a str) -> (&'a str, &'a str) {
    (method, target.strip_prefix("/envoy").unwrap_or(target))
}

/// [`original`] from the question's headers; `envoy` gives the check request's own method and
/// target (behind `/envoy`), read only on that path.
fn original_of<'a>(
    headers: &'a HeaderMap,
    flavour: Flavour,
    envoy: impl FnOnce() -> (&'a str, &'a str),
) -> Result<(&'a str, &'a str), Refusal> {
    // The proxy forwards these as the client sent them, and some frameworks route on them
    // instead of the target: the request could reach a path no limiter decided on.
    if let Some(name) = headers
        .keys()
        .find(|name| crate::path::is_path_override_header(name.as_str()))
    {
        return Err(Refusal::Question(format!(
            "The original request carries {name}, with which some frameworks route a request to another path than its target; the gateway removes it, but what the proxy forwards cannot be changed here. Have the proxy clear it (nginx: `proxy_set_header X-Original-URL \"\";`) or drop it at the client."
        )));
    }
    for (header, name) in &ORIGINAL_HEADERS {
        if headers.get_all(header).nth(1).is_some() {
            return Err(Refusal::Question(format!(
                "{name} is sent more than once. The proxy sets it once; another one came from the client or another hop, and which of them names the request the upstream gets cannot be told."
            )));
        }
    }
    let (method, uri) = match flavour {
        Flavour::Nginx | Flavour::Forwarded => {
            let (m, u, missing) = if flavour == Flavour::Nginx {
                (X_ORIGINAL_METHOD, X_ORIGINAL_URI, "X-Original-Method or X-Original-URI is missing: in the auth_request location set `proxy_set_header X-Original-Method $request_method;` and `proxy_set_header X-Original-URI $request_uri;`.")
            } else {
                (X_FORWARDED_METHOD, X_FORWARDED_URI, "X-Forwarded-Method or X-Forwarded-Uri is missing: Caddy's forward_auth and Traefik's ForwardAuth set both.")
            };
            let (Some(method), Some(uri)) = (headers.get(m), headers.get(u)) else {
                return Err(Refusal::Question(missing.to_owned()));
            };
            let Ok(method) = method.to_str() else {
                return Err(Refusal::Question(
                    "The original method is not an HTTP method.".to_owned(),
                ));
            };
            let uri = std::str::from_utf8(uri.as_bytes()).map_err(|e| {
                Refusal::Target(Rejected {
                    class: Class::InvalidUtf8,
                    at: e.valid_up_to(),
                })
            })?;
            (method, uri)
        }
        Flavour::Envoy => envoy(),
    };
    // The pair this path reads: the first two of ORIGINAL_HEADERS for nginx, the last two for
    // the others; none for Envoy, whose check request is the original.
    let own = match flavour {
        Flavour::Nginx => Some(0),
        Flavour::Forwarded => Some(2),
        Flavour::Envoy => None,
    };
    for (i, (header, name)) in ORIGINAL_HEADERS.iter().enumerate() {
        if own.is_some_and(|o| (i & !1) == o) {
            continue;
        }
        let Some(value) = headers.get(header) else {
            continue;
        };
        let (read, what) = if i % 2 == 0 {
            (method, "method")
        } else {
            (uri, "target")
        };
        if value.as_bytes() != read.as_bytes() {
            let reader = own.map_or("the check request's own", |o| ORIGINAL_HEADERS[o + i % 2].1);
            return Err(Refusal::Question(format!(
                "{name} names another {what} than {reader}, which this path reads. It came from the client or another hop; the request is refused rather than metered on one reading while something downstream may act on the other."
            )));
        }
    }
    Ok((method, uri))
}

/// The original method and URI, once read, are ones a decision can be made on: a URI of at most
/// [`MAX_URI_LEN`] bytes and a method of letters. Otherwise what the proxy is told.
fn check_question(method: &str, uri: &str) -> Result<(), String> {
    if uri.len() > MAX_URI_LEN {
        return Err(format!(
            "The original URI is longer than {MAX_URI_LEN} bytes."
        ));
    }
    if method.is_empty() || !method.bytes().all(|b| b.is_ascii_alphabetic()) {
        return Err("The original method is not an HTTP method.".to_owned());
    }
    Ok(())
}

/// The path of the original URI, metered only when it is its own canonical form under `rules`
/// (see [`CanonicalPath::exact`]); a `#` (a fragment, which a client never sends) is refused.
fn target_path(uri: &str, rules: PathRules) -> Result<CanonicalPath<'_>, Rejected> {
    if let Some(at) = uri.find('#') {
        return Err(Rejected {
            class: Class::Fragment,
            at,
        });
    }
    let path = uri.split('?').next().unwrap_or("");
    CanonicalPath::exact(path, rules)
}

/// Refuse an original target that has no canonical form, or is not its own: `400`
/// `non-canonical-path` naming the class, counted with the gateway's.
fn refuse_target(endpoint: &Endpoint, flavour: Flavour, rejected: &Rejected) -> HttpResponse {
    endpoint.decider.metrics().path_rejected(rejected.class);
    tracing::debug!(
        class = rejected.class.as_str(),
        at = rejected.at,
        "original target refused"
    );
    for_proxy(
        flavour,
        Problem::non_canonical_path(rejected).into_response(),
    )
}

// ---------------------------------------------------------------------------------------------
// Methods and method overrides at the decision endpoint.
// ---------------------------------------------------------------------------------------------

/// The original request's method and method overrides, judged as the gateway judges them (see
/// [`crate::methods`]): a method outside `methods.allowed` is refused (501 with `Allow`; on
/// `/nginx`, which can pass on only 401 and 403, a 400 for its configuration to answer with),
/// and an override is metered as every method it names, or refused with 400. The override
/// headers are the original request's, which every proxy passes on; its query is in the
/// original URI. Nothing can be removed from what the proxy forwards, so `strip` refuses.
fn methods_and_overrides(
    endpoint: &Endpoint,
    settings: &Settings,
    flavour: Flavour,
    req: &HttpRequest,
    method: &str,
    uri: &str,
) -> Result<Named, Box<HttpResponse>> {
    let rules = &settings.methods;
    let metrics = endpoint.decider.metrics();
    if !rules.allows(method) {
        metrics.method_refused(RefusalReason::Method);
        let mut problem = Problem::unsupported_method(method, rules.allow());
        if flavour == Flavour::Nginx {
            problem.status = 400;
            problem.title = "Bad Request";
        }
        let mut res = problem.into_response();
        if let Ok(v) = HeaderValue::from_str(rules.allow()) {
            res.headers_mut().insert(ALLOW, v);
        }
        return Err(Box::new(for_proxy(flavour, res)));
    }
    let query = match flavour {
        Flavour::Envoy => req.uri().query(),
        _ => uri
            .split('#')
            .next()
            .and_then(|u| u.split_once('?'))
            .map(|(_, q)| q),
    };
    let headers = req
        .headers()
        .iter()
        .map(|(name, value)| (name.as_str(), value.as_bytes()));
    match rules.judge(headers, query, At::DecisionEndpoint) {
        Overrides::None => Ok(Named::default()),
        Overrides::Meter(named) => {
            metrics.method_override(false);
            Ok(named)
        }
        Overrides::Refuse(why) => {
            metrics.method_refused(why.reason());
            let res = Problem::method_override(why.detail(rules)).into_response();
            Err(Box::new(for_proxy(flavour, res)))
        }
        // Not given at the decision endpoint: a strip there is a refusal.
        Overrides::Strip => {
            metrics.method_refused(RefusalReason::OverrideUnstrippable);
            let why = crate::methods::Refusal::Unstrippable(crate::methods::Source::Param(
                rules.params().next().unwrap_or("_method").into(),
            ));
            let res = Problem::method_override(why.detail(rules)).into_response();
            Err(Box::new(for_proxy(flavour, res)))
        }
    }
}

/// The proxy's answer for an outcome, with the limit headers of `profile`: `429` for a spent
/// budget, `503` when only the store's failure refused (its wait spread by `who`, the original
/// client's address and agent id; see [`response::refusal`]). Envoy's `ext_authz` takes any 5xx
/// from this endpoint for its own failure to ask (a 403 to the client, or the request let
/// through under `failure_mode_allow`), so on `/envoy` that 503 goes back as `429`, its problem
/// document and `Retry-After` unchanged and `X-FleetLimiter-Status: 503` beside them: the refusal
/// `deny` asks for stays a refusal.
fn render(
    flavour: Flavour,
    outcome: &Outcome,
    profile: &HeaderProfile,
    who: impl FnOnce() -> Vec<u8>,
) -> HttpResponse {
    if outcome.refused() {
        let who = if outcome.store_unavailable() {
            who()
        } else {
            Vec::new()
        };
        let mut res = response::refusal(outcome, profile, None, &who);
        if flavour == Flavour::Envoy && res.status() == StatusCode::SERVICE_UNAVAILABLE {
            *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
            res.headers_mut()
                .insert(STATUS_HEADER, HeaderValue::from(503u16));
        }
        return for_proxy(flavour, res);
    }
    let mut res = HttpResponse::Ok().finish();
    response::apply_headers(res.headers_mut(), outcome, profile, None);
    res
}

fn bad_request(flavour: Flavour, detail: String) -> HttpResponse {
    let problem = Problem {
        kind: "urn:fleet-limiter:problem:bad-decision-request",
        title: "Bad Request",
        status: 400,
        detail,
        retry_after: None,
    };
    for_proxy(flavour, problem.into_response())
}

/// `res` as this proxy can pass it on. nginx treats anything but 2xx, 401 and 403 from an
/// `auth_request` as its own error (a 500 to the client), and drops the body: a refusal (a
/// spent budget's 429, a store that cannot answer's 503) goes back as 403 (a bad request as
/// 401) with the client's status and problem document in headers, for the nginx
/// configuration to answer with.
fn for_proxy(flavour: Flavour, res: HttpResponse) -> HttpResponse {
    if flavour != Flavour::Nginx {
        return res;
    }
    let status = res.status();
    let mut headers = res.headers().clone();
    let body = match res.into_body().try_into_bytes() {
        Ok(b) => b,
        Err(_) => bytes::Bytes::new(),
    };
    let refused = status == StatusCode::TOO_MANY_REQUESTS
        || (status == StatusCode::SERVICE_UNAVAILABLE && headers.contains_key(RETRY_AFTER));
    let carried = if refused {
        StatusCode::FORBIDDEN
    } else {
        StatusCode::UNAUTHORIZED
    };
    let mut out = HttpResponse::build(carried).finish();
    headers.remove(CONTENT_TYPE);
    for (name, value) in headers.iter() {
        out.headers_mut().append(name.clone(), value.clone());
    }
    out.headers_mut()
        .insert(STATUS_HEADER, HeaderValue::from(status.as_u16()));
    if let Ok(v) = HeaderValue::from_maybe_shared(body) {
        out.headers_mut().insert(PROBLEM_HEADER, v);
    }
    out
}

/// A question as the endpoint reads it (see `crate::fuzzing::forward_auth`): `flavour` 0 is
/// `/nginx`, 1 `/caddy` (and the other `X-Forwarded-*` paths), anything else `/envoy`, whose
/// check request's own method and target (`/envoy/...`) are `envoy`. The original method
/// and URI, and the path metered or the class refused (with its offset); `Err` for a question
/// answered with 400 before its target is looked at.
#[cfg(feature = "fuzzing")]
pub(crate) fn read_question<'a>(
    headers: &'a HeaderMap,
    flavour: u8,
    envoy: (&'a str, &'a str),
    rules: PathRules,
) -> Result<(&'a str, &'a str, Result<CanonicalPath<'a>, Rejected>), String> {
    let flavour = match flavour {
        0 => Flavour::Nginx,
        1 => Flavour::Forwarded,
        _ => Flavour::Envoy,
    };
    let (method, uri) = match original_of(headers, flavour, || envoy_original(envoy.0, envoy.1)) {
        Ok(o) => o,
        Err(Refusal::Question(detail)) => return Err(detail),
        Err(Refusal::Target(rejected)) => return Ok(("", "", Err(rejected))),
    };
    check_question(method, uri)?;
    Ok((method, uri, target_path(uri, rules)))
}
