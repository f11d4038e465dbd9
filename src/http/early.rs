//! The answers the middleware gives in place of the request, before or instead of the app: a
//! method or override refused, a path with no canonical form, a body that cannot be read for its
//! key, a key header sent twice, and a limiter's refusal. Each drains a small body so the
//! connection can stay open, or closes it where what follows would not be HTTP.

use crate::decision::{Decider, Outcome, Settings};
use crate::http::request::drain_small_body;
use crate::http::response::{self, Problem};
use crate::keys::body::Unreadable;
use crate::methods::{Refusal, RefusalReason};
use crate::path::Rejected;
use actix_web::body::EitherBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{HeaderMap, HeaderValue, ALLOW};
use actix_web::http::Method;
use actix_web::HttpResponse;
use std::sync::Arc;

/// Answer 501 with `Allow` for a method outside `methods.allowed`, before any limiter or the
/// app sees the request.
pub(super) async fn refuse_method<B>(
    decider: &Decider,
    settings: &Settings,
    req: ServiceRequest,
) -> ServiceResponse<EitherBody<B>> {
    decider.metrics().method_refused(RefusalReason::Method);
    tracing::debug!(method = %req.method(), "method not forwarded");
    let allow = settings.methods.allow();
    let mut res = Problem::unsupported_method(req.method().as_str(), allow).into_response();
    if let Ok(v) = HeaderValue::from_str(allow) {
        res.headers_mut().insert(ALLOW, v);
    }
    answer_early(req, res).await
}

/// Answer 400 for a method override refused, before any limiter or the app sees the request.
pub(super) async fn refuse_override<B>(
    decider: &Decider,
    settings: &Settings,
    req: ServiceRequest,
    why: &Refusal,
) -> ServiceResponse<EitherBody<B>> {
    decider.metrics().method_refused(why.reason());
    tracing::debug!(reason = why.reason().as_str(), "method override refused");
    let res = Problem::method_override(why.detail(&settings.methods)).into_response();
    answer_early(req, res).await
}

/// Send a gateway-made answer in place of the request. After a CONNECT (whose body runs until
/// the connection ends) or an upgrade, what the client sends next on this connection would not
/// be HTTP: it closes. Otherwise a small body is drained so the connection can stay open.
pub(super) async fn answer_early<B>(
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
pub(super) fn told_wait<B>(res: &ServiceResponse<B>) -> Option<u64> {
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
pub(super) async fn answer_refusal<B>(
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
pub(super) async fn refuse_body<B>(
    decider: &Decider,
    settings: &Settings,
    req: ServiceRequest,
    fields: &[Arc<str>],
    why: Unreadable,
) -> ServiceResponse<EitherBody<B>> {
    let field = fields.first().map_or("", |f| &**f);
    let max_bytes = settings.body_key_max_bytes;
    decider.metrics().body_refused(why);
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
pub(super) fn repeated_key_header(settings: &Settings, headers: &HeaderMap) -> Option<Arc<str>> {
    settings
        .policy
        .key_headers()
        .iter()
        .find(|name| headers.get_all(&***name).nth(1).is_some())
        .cloned()
}

/// Answer 400 for a key header sent more than once, before any limiter or the app sees it.
pub(super) async fn refuse_repeated_header<B>(
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
pub(super) async fn reject_path<B>(
    decider: &Decider,
    req: ServiceRequest,
    rejected: &Rejected,
) -> ServiceResponse<EitherBody<B>> {
    decider.metrics().path_rejected(rejected.class);
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
