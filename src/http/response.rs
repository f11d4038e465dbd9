//! What the client sees: IETF `RateLimit` / `RateLimit-Policy` headers, `X-RateLimit-*`, and
//! RFC 9457 problem documents. Every number is read from the [`Outcome`] that made the decision.

use crate::decision::{LimitResult, Outcome};
use crate::limiter::{ceil_secs, more_quota_after_secs};
use crate::policy::LimiterSpec;
use actix_web::http::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use actix_web::http::StatusCode;
use actix_web::HttpResponse;
use bytes::BytesMut;
use serde::Serialize;
use smallvec::SmallVec;
use std::cell::RefCell;
use std::sync::Arc;

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

    /// Admission control turned the request away: every slot of its group was taken and the
    /// queue was full, or it waited the queue timeout for one.
    pub fn overloaded(group: &str, reason: crate::metrics::ShedReason, retry_after: u64) -> Self {
        let unit = if retry_after == 1 {
            "second"
        } else {
            "seconds"
        };
        let why = match reason {
            crate::metrics::ShedReason::QueueFull => "and the queue is full",
            crate::metrics::ShedReason::QueueTimeout => "and none came free while it waited",
        };
        Self {
            kind: "urn:fleet-limiter:problem:overloaded",
            title: "Service Unavailable",
            status: 503,
            detail: format!(
                "The upstream API has as many requests in flight as it takes (admission group `{group}`) {why}; retry after {retry_after} {unit}."
            ),
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

    /// A path with no canonical form (see [`crate::path`]), refused before any limiter; or, at
    /// the decision endpoint, a target that is not its own canonical form.
    pub fn non_canonical_path(rejected: &crate::path::Rejected) -> Self {
        let detail = if rejected.class.decision_only() {
            format!(
                "The request target contains {} (at byte {}). The proxy in front forwards the target as it was sent, and the upstream may route that spelling elsewhere than the path the rate limiter would read, so it is refused. Send the path in canonical form ({}).",
                rejected.class.describe(),
                rejected.at,
                rejected.class.as_str()
            )
        } else {
            format!(
                "The request path contains {} (at byte {}), which HTTP servers and routers read differently; this gateway does not forward it. Send the path without it ({}).",
                rejected.class.describe(),
                rejected.at,
                rejected.class.as_str()
            )
        };
        Self {
            kind: "urn:fleet-limiter:problem:non-canonical-path",
            title: "Bad Request",
            status: 400,
            detail,
            retry_after: None,
        }
    }

    /// A method the resource does not take; the caller adds `Allow`.
    pub fn method_not_allowed(detail: impl Into<String>) -> Self {
        Self {
            kind: "urn:fleet-limiter:problem:method-not-allowed",
            title: "Method Not Allowed",
            status: 405,
            detail: detail.into(),
            retry_after: None,
        }
    }

    /// A request whose method is not in `methods.allowed` (RFC 9110 §15.6.2: the service does
    /// not implement it for any resource). The caller adds `Allow`.
    pub fn unsupported_method(method: &str, allow: &str) -> Self {
        // A method is a token (the HTTP parser saw to it); only its length is the client's.
        let shown: String = method
            .chars()
            .take(crate::methods::MAX_METHOD_LEN)
            .collect();
        Self {
            kind: "urn:fleet-limiter:problem:unsupported-method",
            title: "Not Implemented",
            status: 501,
            detail: format!(
                "This gateway forwards only {allow} (methods.allowed); `{shown}` is not one of them, so the request was not forwarded."
            ),
            retry_after: None,
        }
    }

    /// A method override refused (see [`crate::methods`]).
    pub fn method_override(detail: String) -> Self {
        Self {
            kind: "urn:fleet-limiter:problem:method-override",
            title: "Bad Request",
            status: 400,
            detail,
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

    /// The client's request body did not arrive in time (its pace is in `detail`).
    pub fn request_timeout(detail: impl Into<String>) -> Self {
        Self {
            kind: "urn:fleet-limiter:problem:request-timeout",
            title: "Request Timeout",
            status: 408,
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

// A static, not a const: a const array would be built and dropped again at every use.
static LIMIT_HEADER_NAMES: [HeaderName; 5] = [
    HeaderName::from_static("ratelimit-policy"),
    HeaderName::from_static("ratelimit"),
    HeaderName::from_static("x-ratelimit-limit"),
    HeaderName::from_static("x-ratelimit-remaining"),
    HeaderName::from_static("x-ratelimit-reset"),
];

/// The limit headers for an outcome, as `(name, value)` pairs.
///
/// - `RateLimit-Policy: "agent-device";q=30;w=60, ...` for each limiter that decided.
/// - `RateLimit: "agent-device";r=29;t=2, ...`: remaining, and seconds until additional quota is
///   made available (draft-ietf-httpapi-ratelimit-headers-10); no `t` when the quota is whole.
/// - `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset` for the tightest limiter,
///   the last as seconds until its quota is whole again.
pub fn limit_headers(outcome: &Outcome) -> Vec<(HeaderName, String)> {
    let mut out = Vec::new();
    render(outcome, |name, v| {
        out.push((name, String::from_utf8_lossy(v.as_bytes()).into_owned()))
    });
    out
}

/// Every limit header, handed to `out` as it is made. `RateLimit-Policy` depends only on which
/// limiters decided, so it is reused from the previous response on this thread when those are
/// the same; the other values are written into one buffer (one allocation for all of them) and
/// handed out as slices of it.
fn render(outcome: &Outcome, mut out: impl FnMut(HeaderName, HeaderValue)) {
    let decided = || outcome.results.iter().filter(|r| !r.store_error);
    if decided().next().is_none() {
        return;
    }
    out(LIMIT_HEADER_NAMES[0].clone(), policy_value(outcome));
    // One buffer for the `RateLimit` value and any number too large for the table below, each
    // header value a slice of it.
    let mut buf = BytesMut::with_capacity(24 * outcome.results.len() + 32);
    write_items(&mut buf, decided(), [b";r=", b";t="], |r| {
        [
            Some(u64::from(r.verdict.remaining)),
            more_quota_after_secs(&r.spec.quota, &r.verdict),
        ]
    });
    let rate_end = buf.len();
    let mut numbers: [Option<Result<HeaderValue, (usize, usize)>>; 3] = [None, None, None];
    if let Some(t) = outcome.tightest() {
        let mut digits = itoa::Buffer::new();
        let values = [
            u64::from(t.verdict.limit),
            u64::from(t.verdict.remaining),
            ceil_secs(t.verdict.reset_after_ns),
        ];
        for (slot, n) in numbers.iter_mut().zip(values) {
            *slot = Some(match small_number(n) {
                Some(v) => Ok(v),
                None => {
                    let start = buf.len();
                    buf.extend_from_slice(digits.format(n).as_bytes());
                    Err((start, buf.len()))
                }
            });
        }
    }
    let all = buf.freeze();
    if let Ok(v) = HeaderValue::from_maybe_shared(all.slice(..rate_end)) {
        out(LIMIT_HEADER_NAMES[1].clone(), v);
    }
    for (name, n) in LIMIT_HEADER_NAMES[2..].iter().zip(numbers) {
        let v = match n {
            None => continue,
            Some(Ok(v)) => v,
            Some(Err((a, b))) => match HeaderValue::from_maybe_shared(all.slice(a..b)) {
                Ok(v) => v,
                Err(_) => continue,
            },
        };
        out(name.clone(), v);
    }
}

/// Numbers below this are written once per process and shared by every response.
const SMALL_NUMBERS: u64 = 4096;

/// A small number as a header value made once per process (the numbers most limit headers
/// carry: a budget, what is left of it, a wait in seconds), shared by every response that
/// sends it; `None` from [`SMALL_NUMBERS`] up.
fn small_number(n: u64) -> Option<HeaderValue> {
    static SMALL: std::sync::OnceLock<Box<[HeaderValue]>> = std::sync::OnceLock::new();
    if n >= SMALL_NUMBERS {
        return None;
    }
    let table = SMALL.get_or_init(|| {
        (0..SMALL_NUMBERS)
            .map(|i| {
                // Leaked once: 4 096 short strings, so each clone is a copy of a pointer.
                let s: &'static str = Box::leak(i.to_string().into_boxed_str());
                HeaderValue::from_static(s)
            })
            .collect()
    });
    table.get(n as usize).cloned()
}

/// The limiters a `RateLimit-Policy` value names, and the value.
type PolicyValue = (SmallVec<[Arc<LimiterSpec>; 4]>, HeaderValue);

thread_local! {
    /// The last `RateLimit-Policy` rendered on this thread. The specs are held (not just their
    /// addresses), so a reloaded configuration never matches.
    static LAST_POLICY: RefCell<Option<PolicyValue>> = const { RefCell::new(None) };
}

/// `RateLimit-Policy`: `"agent-device";q=30;w=60, ...` for each limiter that decided.
fn policy_value(outcome: &Outcome) -> HeaderValue {
    let decided = || outcome.results.iter().filter(|r| !r.store_error);
    let same = |specs: &[Arc<LimiterSpec>]| {
        specs.len() == decided().count()
            && specs
                .iter()
                .zip(decided())
                .all(|(a, r)| Arc::ptr_eq(a, &r.spec))
    };
    let cached = LAST_POLICY.with_borrow(|last| match last {
        Some((specs, value)) if same(specs) => Some(value.clone()),
        _ => None,
    });
    if let Some(v) = cached {
        return v;
    }
    let mut buf = BytesMut::with_capacity(40 * outcome.results.len());
    write_items(&mut buf, decided(), [b";q=", b";w="], |r| {
        [
            Some(u64::from(r.spec.quota.limit())),
            Some(r.spec.quota.window.as_secs().max(1)),
        ]
    });
    let value = HeaderValue::from_maybe_shared(buf.freeze())
        .unwrap_or_else(|_| HeaderValue::from_static(""));
    let specs = decided().map(|r| r.spec.clone()).collect();
    LAST_POLICY.set(Some((specs, value.clone())));
    value
}

/// `"name";k1=v1;k2=v2` for each result, comma-separated (the IETF headers' list form); a
/// parameter without a value is left out.
fn write_items<'a>(
    buf: &mut BytesMut,
    results: impl Iterator<Item = &'a LimitResult>,
    keys: [&[u8]; 2],
    values: impl Fn(&LimitResult) -> [Option<u64>; 2],
) {
    let mut num = itoa::Buffer::new();
    for (i, r) in results.enumerate() {
        if i > 0 {
            buf.extend_from_slice(b", ");
        }
        buf.extend_from_slice(b"\"");
        buf.extend_from_slice(r.spec.name.as_bytes());
        buf.extend_from_slice(b"\"");
        for (key, value) in keys.iter().zip(values(r)) {
            let Some(value) = value else { continue };
            buf.extend_from_slice(key);
            buf.extend_from_slice(num.format(value).as_bytes());
        }
    }
}

/// Add the limit headers to a response that is about to leave.
/// Values the upstream set under the same names are replaced. Most responses carry none of
/// these names: one pass over the handful of names present tells, and then `append` skips
/// both a lookup per limit header and the list of removed values that `insert` builds.
pub fn apply_headers(headers: &mut HeaderMap, outcome: &Outcome) {
    let clash = headers.keys().any(|k| LIMIT_HEADER_NAMES.contains(k));
    render(outcome, |name, value| {
        if clash {
            headers.insert(name, value);
        } else {
            headers.append(name, value);
        }
    });
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
