//! What the client sees: the limit headers of the configured profile (the IETF drafts'
//! `RateLimit*` forms, `X-RateLimit-*`), `Retry-After`, and RFC 9457 problem documents. Every
//! number is read from the [`Outcome`] that made the decision. The entry points are here;
//! `render.rs` makes the headers from `names.rs`, `disclosed.rs`, `values.rs` and `policy.rs`,
//! and `problem.rs` holds the problem documents.

mod disclosed;
mod names;
mod policy;
mod problem;
mod render;
mod values;

pub use names::limit_header_names;
pub(crate) use problem::{GatewayMade, Problem};

use crate::config::headers::HeaderProfile;
use crate::decision::Outcome;
use actix_web::http::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use actix_web::HttpResponse;
use names::names_sent;
use render::render;
use std::time::SystemTime;

/// The limit headers `profile` gives an outcome, as `(name, value)` pairs, in the order they
/// are sent. `decided_at` is when the decision was made on the wall clock (the moment a Unix
/// `X-RateLimit-Reset` counts from; `None` reads the clock now, and only when that header is
/// sent).
///
/// What each profile sends (for a limiter `agent-device`, 30 a minute, after its first request;
/// see docs/configuration.md#headers):
///
/// - `draft-10`: `RateLimit-Policy: "agent-device";q=30;w=60` and
///   `RateLimit: "agent-device";r=29;t=2;pk=:…:`, one item per limiter that decided, `t` the
///   seconds until additional quota is made available, `pk` the bucket's partition key;
/// - `draft-8`: the same, `t` the seconds until the quota is whole again;
/// - `draft-7`: `RateLimit-Policy: 30;w=60` and `RateLimit: limit=30, remaining=29, reset=2`;
/// - `draft-6`: `RateLimit-Policy: 30;w=60`, `RateLimit-Limit: 30`, `RateLimit-Remaining: 29`,
///   `RateLimit-Reset: 2`;
/// - legacy: `X-RateLimit-Limit`, `X-RateLimit-Remaining` and `X-RateLimit-Reset`, the last a
///   Unix time or a number of seconds (`legacy_reset`).
///
/// The single-limit forms (draft 6 and 7, legacy) describe the limiter that refused with the
/// longest wait, or, when nothing refused, the one closest to refusing. On a refusal every reset
/// sent is `Retry-After`: the time the refused request could succeed.
pub fn limit_headers(
    outcome: &Outcome,
    profile: &HeaderProfile,
    decided_at: Option<SystemTime>,
) -> Vec<(HeaderName, String)> {
    let mut out = Vec::new();
    render(outcome, profile, decided_at, None, |name, v| {
        out.push((
            name.clone(),
            String::from_utf8_lossy(v.as_bytes()).into_owned(),
        ))
    });
    out
}

/// Add `profile`'s limit headers to a response that is about to leave (`decided_at`: see
/// [`limit_headers`]). Values the upstream set under the same names are replaced; the names
/// this profile does not send are left as the upstream set them. Most responses carry none of
/// these names: one pass over the handful of names present tells, and then `append` skips
/// both a lookup per limit header and the list of removed values that `insert` builds.
pub fn apply_headers(
    headers: &mut HeaderMap,
    outcome: &Outcome,
    profile: &HeaderProfile,
    decided_at: Option<SystemTime>,
) {
    apply_headers_told(headers, outcome, profile, decided_at, None);
}

/// [`apply_headers`] on an answer whose `Retry-After` says `told` seconds (a 503 the gateway
/// made: admission control's, a store that cannot answer): every reset sent says the same.
pub(crate) fn apply_headers_told(
    headers: &mut HeaderMap,
    outcome: &Outcome,
    profile: &HeaderProfile,
    decided_at: Option<SystemTime>,
    told: Option<u64>,
) {
    if !profile.sends_any() {
        return;
    }
    let [standard, legacy] = names_sent(profile);
    // Every limit header's name starts `ratelimit` or `x-ratelimit`: most names are told apart
    // by their first byte, before any comparison with the names sent.
    let clash = headers.keys().any(|k| {
        matches!(k.as_str().as_bytes().first(), Some(b'r' | b'x'))
            && (standard.contains(k) || legacy.contains(k))
    });
    render(outcome, profile, decided_at, told, |name, value| {
        if clash {
            headers.insert(name.clone(), value);
        } else {
            headers.append(name.clone(), value);
        }
    });
}

/// The refusal: 429, problem+json, `Retry-After` from the bucket, and `profile`'s limit
/// headers (`decided_at`: see [`limit_headers`]).
pub fn too_many_requests(
    outcome: &Outcome,
    profile: &HeaderProfile,
    decided_at: Option<SystemTime>,
) -> HttpResponse {
    let wait = outcome.retry_after_secs().unwrap_or(1).max(1);
    let mut res = Problem::rate_limited(wait).into_response();
    let headers = res.headers_mut();
    headers.insert(RETRY_AFTER, HeaderValue::from(wait));
    apply_headers(headers, outcome, profile, decided_at);
    res
}

/// The answer to a refused outcome, as the gateway, the middleware and the decision endpoint
/// give it: a spent budget is [`too_many_requests`]; a refusal only because the store could
/// not answer (see [`Outcome::store_unavailable`]) is `503` problem+json
/// (`urn:fleet-limiter:problem:store-unavailable`) whose `Retry-After` is the wait a `429`
/// would say (at least 1 s) spread over `[w, 2w]` by `who` (the caller's normalised address
/// and agent id), so that a fleet refused at once does not come back at once; every limit
/// header's reset says the same.
pub fn refusal(
    outcome: &Outcome,
    profile: &HeaderProfile,
    decided_at: Option<SystemTime>,
    who: &[u8],
) -> HttpResponse {
    if !outcome.store_unavailable() {
        return too_many_requests(outcome, profile, decided_at);
    }
    let w = outcome.retry_after_secs().unwrap_or(1).max(1);
    let wait = crate::spread::spread_secs(w, who);
    let mut res = Problem::store_unavailable(wait).into_response();
    let headers = res.headers_mut();
    headers.insert(RETRY_AFTER, HeaderValue::from(wait));
    apply_headers_told(headers, outcome, profile, decided_at, Some(wait));
    res
}

#[cfg(test)]
mod tests;
