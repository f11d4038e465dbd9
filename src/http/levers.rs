//! An operator's levers on the admin listener, JSON in and out:
//!
//! - `GET /overrides`, `POST /overrides`, `DELETE /overrides/<id>`: the overrides in force, and
//!   run-time ones added or removed (on the Redis store, every instance takes them within a
//!   second; they outlive restarts);
//! - `POST /reset`: forget one principal's bucket of one limiter (unblock it);
//! - `POST /explain`: what a request would meet now (the limiters, their keys described, their
//!   buckets, allowed or not), consuming nothing.
//!
//! Each needs `Authorization: Bearer <ops.admin_token>` when a token is set, and answers only
//! on a loopback admin listener when none is; every change is logged with who, what and until
//! when. An override that would leave a healthy agent refused too long is refused with `check`'s
//! reason.

use super::control::Control;
use crate::decision::{Chosen, KeyHeaders, RequestFacts};
use crate::overrides::{Override, Source, Wire};
use actix_web::http::header::{HeaderMap, HeaderName, HeaderValue, AUTHORIZATION};
use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::IpAddr;

/// The largest JSON body a lever reads.
pub(crate) const MAX_BODY: usize = 64 * 1024;
/// Most headers an explained request may carry.
const MAX_HEADERS: usize = 64;
/// Most body fields a request to explain or reset may name.
const MAX_BODY_FIELDS: usize = 8;
/// The longest override id taken; ids the gateway makes are 12 hex digits.
const MAX_ID_LEN: usize = 64;

fn answer(status: StatusCode, body: &impl Serialize) -> HttpResponse {
    HttpResponse::build(status)
        .content_type("application/json")
        .insert_header(("cache-control", "no-store"))
        .body(serde_json::to_string(body).unwrap_or_else(|_| "{}".to_owned()))
}

#[derive(Serialize)]
struct Problem<'a> {
    error: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    field: Option<&'a str>,
}

pub(crate) fn problem(status: StatusCode, error: &str, field: Option<&str>) -> HttpResponse {
    answer(status, &Problem { error, field })
}

/// Bytes equal in constant time (for the token).
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Whether the request may pull a lever: the token when one is set; else only when the admin
/// listener listens on loopback alone. `Err` is the answer to send instead.
pub(crate) fn authorized(control: &Control, req: &HttpRequest) -> Result<(), Box<HttpResponse>> {
    let ops = control.current_config().ops;
    match ops.admin_token {
        Some(t) => {
            let sent = req
                .headers()
                .get(AUTHORIZATION)
                .and_then(|v| crate::identity::bearer_token(v.as_bytes()));
            if sent.is_some_and(|s| same(s.as_bytes(), t.expose().as_bytes())) {
                Ok(())
            } else {
                Err(Box::new(
                    HttpResponse::build(StatusCode::UNAUTHORIZED)
                        .content_type("application/json")
                        .insert_header(("www-authenticate", "Bearer realm=\"fleet-limiter admin\""))
                        .body(r#"{"error":"this instance's levers need its ops.admin_token: send Authorization: Bearer <token> (the fleet-limiter command takes --token TOKEN or FLEET_LIMITER_ADMIN_TOKEN)"}"#),
                ))
            }
        }
        // The listener's configured address, not the connection's: a listener on 0.0.0.0 takes
        // loopback connections too, and the rest of the network's.
        None if ops.admin_listen.ip().is_loopback() => Ok(()),
        None => Err(Box::new(problem(
            StatusCode::FORBIDDEN,
            "the admin listener listens beyond loopback and ops.admin_token is not set, so its levers are off; set ops.admin_token (FLEET_LIMITER_ADMIN_TOKEN) and send it as Authorization: Bearer",
            None,
        ))),
    }
}

/// Who pulled a lever, for the log: the `by` the request gave, and its peer address.
fn who(req: &HttpRequest, by: Option<&str>) -> String {
    let peer = req
        .peer_addr()
        .map(|a| a.ip().to_string())
        .unwrap_or_else(|| "unknown".to_owned());
    match by {
        Some(b) => format!("{} from {peer}", crate::redact::printable(b, 128)),
        None => peer,
    }
}

#[derive(Serialize)]
struct List {
    overrides: Vec<Wire>,
}

pub(crate) async fn list(control: web::Data<Control>, req: HttpRequest) -> HttpResponse {
    if let Err(r) = authorized(&control, &req) {
        return *r;
    }
    let overrides = control
        .decider()
        .overrides()
        .list()
        .iter()
        .map(|o| o.to_wire())
        .collect();
    answer(StatusCode::OK, &List { overrides })
}

pub(crate) async fn add(
    control: web::Data<Control>,
    req: HttpRequest,
    body: web::Bytes,
) -> HttpResponse {
    if let Err(r) = authorized(&control, &req) {
        return *r;
    }
    let mut wire: Wire = match serde_json::from_slice(&body) {
        Ok(w) => w,
        Err(e) => {
            return problem(
                StatusCode::BAD_REQUEST,
                &format!("not an override: {e}; send {{\"limiter\", \"match\", \"limit\", \"window\"}} and optionally \"expires\" (RFC 3339, or a time from now: \"2h\") and \"by\""),
                None,
            )
        }
    };
    if wire.source.is_some() || wire.created.is_some() {
        return problem(
            StatusCode::BAD_REQUEST,
            "source and created are set by the gateway; leave them out",
            None,
        );
    }
    let cfg = control.current_config();
    let Some(spec) = cfg.limiters.iter().find(|l| *l.name == *wire.limiter) else {
        let names: Vec<&str> = cfg.limiters.iter().map(|l| &*l.name).collect();
        return problem(
            StatusCode::NOT_FOUND,
            &format!(
                "`{}` is not a configured limiter; name one of {}",
                crate::redact::printable(&wire.limiter, 64),
                names.join(", ")
            ),
            Some("limiter"),
        );
    };
    let levers = control.levers();
    let now = control.decider().overrides().unix_now();
    if let Some(t) = wire.expires.as_deref() {
        if crate::overrides::expiry::is_relative(t) {
            match crate::overrides::expiry::resolve(t, now) {
                Ok(at) => wire.expires = Some(crate::overrides::format_rfc3339(at)),
                Err(e) => return problem(StatusCode::BAD_REQUEST, &e, Some("expires")),
            }
        }
    }
    if wire.id.is_none() {
        wire.id = Some(crate::overrides::new_id());
    }
    let o = match Override::from_wire(&wire, Source::Admin, now) {
        Ok(o) => o,
        Err((field, e)) => return problem(StatusCode::BAD_REQUEST, &e, Some(&field)),
    };
    if control.decider().overrides().is_config(&o.id) {
        return problem(
            StatusCode::CONFLICT,
            "that id names an override of the configuration; choose another or leave id out",
            Some("id"),
        );
    }
    if o.expires.is_some_and(|e| e <= now) {
        return problem(
            StatusCode::BAD_REQUEST,
            "expires is in the past; give an instant to come, or leave it out for no end",
            Some("expires"),
        );
    }
    if let Some(why) = crate::config::check::judge_quota(&cfg, spec, &o.quota(&spec.quota)) {
        return problem(
            StatusCode::UNPROCESSABLE_ENTITY,
            &format!("this override would leave healthy agents refused too long: {why}"),
            Some("limit"),
        );
    }
    if let Err(e) = levers.add(o.clone()).await {
        return problem(StatusCode::SERVICE_UNAVAILABLE, &e.to_string(), None);
    }
    tracing::warn!(
        who = %who(&req, o.by.as_deref()),
        id = %o.id,
        limiter = %o.limiter,
        matches = %o.matcher,
        limit = o.limit.get(),
        window = %crate::duration::format_duration(o.window),
        until = %o.expires.map(crate::overrides::format_rfc3339).unwrap_or_else(|| "removed".to_owned()),
        "override added"
    );
    answer(StatusCode::CREATED, &o.to_wire())
}

pub(crate) async fn remove(
    control: web::Data<Control>,
    req: HttpRequest,
    id: web::Path<String>,
) -> HttpResponse {
    if let Err(r) = authorized(&control, &req) {
        return *r;
    }
    let id = id.into_inner();
    let well_formed = !id.is_empty()
        && id.len() <= MAX_ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if !well_formed {
        return problem(
            StatusCode::BAD_REQUEST,
            &format!(
                "not an override id ({} bytes); ids are 1-{MAX_ID_LEN} letters, digits, `-` and `_`, as `fleet-limiter override list` shows them",
                id.len()
            ),
            Some("id"),
        );
    }
    if control.decider().overrides().is_config(&id) {
        return problem(
            StatusCode::CONFLICT,
            "that override comes from the configuration; remove it from [[overrides]] and reload",
            None,
        );
    }
    match control.levers().remove(&id).await {
        Ok(true) => {
            tracing::warn!(who = %who(&req, None), id = %crate::redact::printable(&id, 64), "override removed");
            answer(StatusCode::OK, &serde_json::json!({ "removed": id }))
        }
        Ok(false) => problem(
            StatusCode::NOT_FOUND,
            "no run-time override has that id",
            None,
        ),
        Err(e) => problem(StatusCode::SERVICE_UNAVAILABLE, &e.to_string(), None),
    }
}

/// A request as `explain` and `reset` take it: the client's address, and the headers it sent.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Asked {
    #[serde(default)]
    method: Option<String>,
    #[serde(default)]
    path: Option<String>,
    ip: String,
    /// The peer the request came from, when a trusted proxy passed it on (its forwarding
    /// header then names `ip`); the client itself by default.
    #[serde(default)]
    peer: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    /// The fields of its body that `body:<field>` limiters read (`{"email": "…"}`), each a
    /// string or a whole number, normalised as the limiter normalises them.
    #[serde(default)]
    body: BTreeMap<String, serde_json::Value>,
    /// The limiter a reset applies to.
    #[serde(default)]
    limiter: Option<String>,
    #[serde(default)]
    by: Option<String>,
}

/// The request's facts, owned: an address, a header map and the body fields named.
struct Facts {
    peer: IpAddr,
    headers: HeaderMap,
    body: Vec<crate::decision::BodyValue>,
}

/// The body fields of a request to explain or reset, as the limiter keys them; a 400 naming
/// the field for one it would refuse.
fn body_values(
    body: &BTreeMap<String, serde_json::Value>,
) -> Result<Vec<crate::decision::BodyValue>, String> {
    if body.len() > MAX_BODY_FIELDS {
        return Err(format!(
            "{} body fields; name at most {MAX_BODY_FIELDS}",
            body.len()
        ));
    }
    let mut out = Vec::with_capacity(body.len());
    for (field, value) in body {
        let shown = crate::redact::printable(field, 64);
        if !crate::keys::body::valid_field(field) {
            return Err(format!(
                "`{shown}` is not a body field a limiter can read (1-64 of A-Z a-z 0-9 _ . -)"
            ));
        }
        let raw = match value {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Number(n) if n.is_u64() || n.is_i64() => n.to_string(),
            _ => {
                return Err(format!(
                "body.{shown}: send a string or a whole number, as the request's body carries it"
            ))
            }
        };
        let Some(value) = crate::keys::body::normalize(&raw) else {
            return Err(format!(
                "body.{shown}: the limiter refuses this value (empty, longer than 256 bytes, a control character, or a list of addresses), so it keys no bucket"
            ));
        };
        out.push(crate::decision::BodyValue {
            field: std::sync::Arc::from(field.as_str()),
            value,
        });
    }
    Ok(out)
}

fn facts(a: &Asked, settings: &crate::decision::Settings) -> Result<Facts, Box<HttpResponse>> {
    let bad = |e: String, f: &str| Box::new(problem(StatusCode::BAD_REQUEST, &e, Some(f)));
    let ip: IpAddr = a.ip.trim().parse().map_err(|_| {
        bad(
            format!(
                "`{}` is not an address",
                crate::redact::printable(&a.ip, 64)
            ),
            "ip",
        )
    })?;
    let peer: IpAddr = match &a.peer {
        Some(p) => p.trim().parse().map_err(|_| {
            bad(
                format!("`{}` is not an address", crate::redact::printable(p, 64)),
                "peer",
            )
        })?,
        None => ip,
    };
    if a.headers.len() > MAX_HEADERS {
        return Err(bad(
            format!("{} headers; send at most {MAX_HEADERS}", a.headers.len()),
            "headers",
        ));
    }
    let mut headers = HeaderMap::new();
    for (name, value) in &a.headers {
        let n = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
            bad(
                format!(
                    "`{}` is not a header name",
                    crate::redact::printable(name, 64)
                ),
                "headers",
            )
        })?;
        let v = HeaderValue::from_str(value).map_err(|_| {
            bad(
                format!("the value of `{n}` is not a header value"),
                "headers",
            )
        })?;
        headers.insert(n, v);
    }
    // The client's address reaches the decision as a trusted proxy would pass it on.
    if peer != ip && settings.trusted.contains(peer) {
        let name = match settings.trusted.header {
            crate::client_ip::ForwardedHeader::XForwardedFor => "x-forwarded-for",
            crate::client_ip::ForwardedHeader::Forwarded => "forwarded",
        };
        let value = match settings.trusted.header {
            crate::client_ip::ForwardedHeader::XForwardedFor => ip.to_string(),
            crate::client_ip::ForwardedHeader::Forwarded => match ip {
                IpAddr::V4(v4) => format!("for={v4}"),
                IpAddr::V6(v6) => format!("for=\"[{v6}]\""),
            },
        };
        if let Ok(v) = HeaderValue::from_str(&value) {
            headers.insert(HeaderName::from_static(name), v);
        }
    }
    let body = body_values(&a.body).map_err(|e| bad(e, "body"))?;
    Ok(Facts {
        peer,
        headers,
        body,
    })
}

#[derive(Serialize)]
struct LimiterExplained {
    limiter: String,
    key: String,
    /// `own`, `plan <name>` or `override <id>`.
    budget: String,
    limit: u32,
    window: String,
    mode: &'static str,
    remaining: u32,
    allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    retry_after_seconds: Option<u64>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    store_error: bool,
}

#[derive(Serialize)]
struct Explanation {
    method: String,
    path: String,
    client_ip: Option<String>,
    limiters: Vec<LimiterExplained>,
    allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    retry_after_seconds: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    store_error: Option<String>,
}

pub(crate) async fn explain(
    control: web::Data<Control>,
    req: HttpRequest,
    body: web::Bytes,
) -> HttpResponse {
    if let Err(r) = authorized(&control, &req) {
        return *r;
    }
    let asked: Asked = match serde_json::from_slice(&body) {
        Ok(a) => a,
        Err(e) => {
            return problem(
                StatusCode::BAD_REQUEST,
                &format!(
                "not a request to explain: {e}; send {{\"method\", \"path\", \"ip\", \"headers\", \"body\"}}"
            ),
                None,
            )
        }
    };
    let decider = control.decider();
    let settings = decider.settings();
    let f = match facts(&asked, &settings) {
        Ok(f) => f,
        Err(r) => return *r,
    };
    let method = asked.method.clone().unwrap_or_else(|| "GET".to_owned());
    let raw_path = asked.path.clone().unwrap_or_else(|| "/".to_owned());
    if method.is_empty() || method.len() > 32 || !method.bytes().all(|b| b.is_ascii_alphabetic()) {
        return problem(
            StatusCode::BAD_REQUEST,
            "a method is 1-32 letters, e.g. \"GET\"",
            Some("method"),
        );
    }
    let method = method.to_ascii_uppercase();
    let path_only = raw_path.split('?').next().unwrap_or("/");
    let path = match crate::path::CanonicalPath::parse(path_only, settings.paths) {
        Ok(p) => p,
        Err(r) => {
            return answer(
                StatusCode::OK,
                &serde_json::json!({
                    "method": method,
                    "path": crate::redact::printable(&raw_path, 256),
                    "allowed": false,
                    "refused_path": r.to_string(),
                }),
            )
        }
    };
    let session_cookie = control.current_config().identity.session_cookie.clone();
    let h = super::request::header_facts(
        &f.headers,
        f.peer,
        &settings.trusted,
        Some(session_cookie.as_str()),
    );
    let lookup = |name: &str| super::request::only_value(&f.headers, name);
    let facts = RequestFacts {
        peer: f.peer,
        method: &method,
        path,
        forwarded: &h.forwarded,
        agent_id: h.agent_id,
        authorization: h.authorization,
        session_token: h.session_token,
        key_headers: KeyHeaders::new(&lookup).with_body(&f.body),
    };
    let (outcome, explained) = decider.explain(&settings, &facts).await;
    let limiters = outcome
        .results
        .iter()
        .zip(explained)
        .map(|(r, e)| LimiterExplained {
            limiter: r.spec.name.to_string(),
            key: e.key,
            budget: match e.chosen {
                Chosen::Own => "own".to_owned(),
                Chosen::Plan(p, _) => format!("plan {p}"),
                Chosen::Override(o) => format!("override {}", o.id),
            },
            limit: r.quota.limit(),
            window: crate::duration::format_duration(r.quota.window()),
            mode: r.spec.mode.as_str(),
            remaining: r.verdict.remaining,
            allowed: r.verdict.allowed,
            retry_after_seconds: (!r.verdict.allowed)
                .then(|| crate::limiter::wait_secs(r.verdict.retry_after_ns)),
            store_error: r.store_error,
        })
        .collect();
    answer(
        StatusCode::OK,
        &Explanation {
            method: method.clone(),
            path: facts.path.as_str().to_owned(),
            client_ip: outcome.client_ip.map(|i| i.to_string()),
            limiters,
            allowed: !outcome.refused(),
            retry_after_seconds: outcome.retry_after_secs(),
            store_error: outcome.store_error.as_ref().map(ToString::to_string),
        },
    )
}

pub(crate) async fn reset(
    control: web::Data<Control>,
    req: HttpRequest,
    body: web::Bytes,
) -> HttpResponse {
    if let Err(r) = authorized(&control, &req) {
        return *r;
    }
    let asked: Asked = match serde_json::from_slice(&body) {
        Ok(a) => a,
        Err(e) => {
            return problem(
                StatusCode::BAD_REQUEST,
                &format!("not a reset: {e}; send {{\"limiter\", \"ip\", \"headers\", \"body\"}}"),
                None,
            )
        }
    };
    let Some(limiter) = asked.limiter.clone() else {
        return problem(
            StatusCode::BAD_REQUEST,
            "name the limiter whose bucket to forget",
            Some("limiter"),
        );
    };
    let decider = control.decider();
    let settings = decider.settings();
    let f = match facts(&asked, &settings) {
        Ok(f) => f,
        Err(r) => return *r,
    };
    let session_cookie = control.current_config().identity.session_cookie.clone();
    let h = super::request::header_facts(
        &f.headers,
        f.peer,
        &settings.trusted,
        Some(session_cookie.as_str()),
    );
    let lookup = |name: &str| super::request::only_value(&f.headers, name);
    let method = asked.method.clone().unwrap_or_else(|| "GET".to_owned());
    let facts = RequestFacts {
        peer: f.peer,
        method: &method,
        path: crate::path::CanonicalPath::root(),
        forwarded: &h.forwarded,
        agent_id: h.agent_id,
        authorization: h.authorization,
        session_token: h.session_token,
        key_headers: KeyHeaders::new(&lookup).with_body(&f.body),
    };
    let Some((keys, described)) = decider.bucket_of_named(&settings, &facts, &limiter).await else {
        let names: Vec<String> = settings
            .policy
            .limiters()
            .iter()
            .map(|l| l.name.to_string())
            .collect();
        return problem(
            StatusCode::NOT_FOUND,
            &format!(
                "`{}` is not a configured limiter; name one of {}",
                crate::redact::printable(&limiter, 64),
                names.join(", ")
            ),
            Some("limiter"),
        );
    };
    match control.levers().reset(&keys).await {
        Ok(held) => {
            tracing::warn!(who = %who(&req, asked.by.as_deref()), limiter = %limiter, key = %described, held = held > 0, "bucket reset");
            answer(
                StatusCode::OK,
                &serde_json::json!({ "limiter": limiter, "key": described, "reset": held > 0 }),
            )
        }
        Err(e) => problem(StatusCode::SERVICE_UNAVAILABLE, &e.to_string(), None),
    }
}
