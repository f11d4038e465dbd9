//! What the client sees: IETF `RateLimit` / `RateLimit-Policy` headers, `X-RateLimit-*`, and
//! RFC 9457 problem documents. Every number is read from the [`Outcome`] that made the decision.

use crate::decision::Outcome;
use crate::limiter::ceil_secs;
use actix_web::http::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use actix_web::http::StatusCode;
use actix_web::HttpResponse;
use serde::Serialize;

pub const PROBLEM_JSON: &str = "application/problem+json";

/// Marks a response the gateway made itself (a refusal or an upstream failure), as opposed to
/// one the upstream sent; the CORS layer adds the allow-list's headers only to these.
#[derive(Debug, Clone, Copy)]
pub struct GatewayMade;

/// An RFC 9457 problem document.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct Problem {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub title: &'static str,
    pub status: u16,
    pub detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after: Option<u64>,
}

impl Problem {
    pub fn rate_limited(retry_after: u64) -> Self {
        let unit = if retry_after == 1 {
            "second"
        } else {
            "seconds"
        };
        Self {
            kind: "urn:fleet-limiter:problem:rate-limited",
            title: "Too Many Requests",
            status: 429,
            detail: format!("Request rate limit exceeded; retry after {retry_after} {unit}."),
            retry_after: Some(retry_after),
        }
    }

    pub fn bad_gateway(detail: impl Into<String>) -> Self {
        Self {
            kind: "urn:fleet-limiter:problem:upstream-unavailable",
            title: "Bad Gateway",
            status: 502,
            detail: detail.into(),
            retry_after: None,
        }
    }

    pub fn gateway_timeout(detail: impl Into<String>) -> Self {
        Self {
            kind: "urn:fleet-limiter:problem:upstream-timeout",
            title: "Gateway Timeout",
            status: 504,
            detail: detail.into(),
            retry_after: None,
        }
    }

    pub fn into_response(self) -> HttpResponse {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = serde_json::to_string(&self).unwrap_or_default();
        let mut res = HttpResponse::build(status)
            .insert_header((CONTENT_TYPE, PROBLEM_JSON))
            .body(body);
        res.extensions_mut().insert(GatewayMade);
        res
    }
}

/// The limit headers for an outcome, as `(name, value)` pairs.
///
/// - `RateLimit-Policy: "agent-device";q=30;w=60, ...` for each limiter that decided.
/// - `RateLimit: "agent-device";r=29;t=2, ...`: remaining, and seconds until the bucket is full.
/// - `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset` for the tightest limiter.
pub fn limit_headers(outcome: &Outcome) -> Vec<(HeaderName, String)> {
    use std::fmt::Write as _;
    // Built in place: these two values are rendered on every metered response.
    let (mut policy, mut state) = (String::new(), String::new());
    for r in outcome.results.iter().filter(|r| !r.store_error) {
        if !policy.is_empty() {
            policy.push_str(", ");
            state.push_str(", ");
        }
        for s in [&mut policy, &mut state] {
            s.push('"');
            s.push_str(&r.spec.name);
            s.push('"');
        }
        let window = r.spec.quota.window.as_secs().max(1);
        let _ = write!(policy, ";q={};w={}", r.spec.quota.limit, window);
        let reset = ceil_secs(r.verdict.reset_after_ns);
        let _ = write!(state, ";r={};t={}", r.verdict.remaining, reset);
    }
    if policy.is_empty() {
        return Vec::new();
    }
    let mut out = vec![
        (HeaderName::from_static("ratelimit-policy"), policy),
        (HeaderName::from_static("ratelimit"), state),
    ];
    if let Some(t) = outcome.tightest() {
        out.push((
            HeaderName::from_static("x-ratelimit-limit"),
            t.verdict.limit.to_string(),
        ));
        out.push((
            HeaderName::from_static("x-ratelimit-remaining"),
            t.verdict.remaining.to_string(),
        ));
        out.push((
            HeaderName::from_static("x-ratelimit-reset"),
            ceil_secs(t.verdict.reset_after_ns).to_string(),
        ));
    }
    out
}

/// Add the limit headers to a response that is about to leave.
pub fn apply_headers(headers: &mut HeaderMap, outcome: &Outcome) {
    for (name, value) in limit_headers(outcome) {
        if let Ok(v) = HeaderValue::from_str(&value) {
            headers.insert(name, v);
        }
    }
}

/// The refusal: 429, problem+json, `Retry-After` from the bucket, and the limit headers.
pub fn too_many_requests(outcome: &Outcome) -> HttpResponse {
    let wait = outcome.retry_after_secs().unwrap_or(1).max(1);
    let mut res = Problem::rate_limited(wait).into_response();
    let headers = res.headers_mut();
    headers.insert(RETRY_AFTER, HeaderValue::from(wait));
    apply_headers(headers, outcome);
    res
}
