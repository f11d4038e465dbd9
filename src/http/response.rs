//! What the client sees: the limit headers of the configured profile (the IETF drafts'
//! `RateLimit*` forms, `X-RateLimit-*`), `Retry-After`, and RFC 9457 problem documents. Every
//! number is read from the [`Outcome`] that made the decision.

use crate::config::headers::{HeaderProfile, LegacyReset, Standard};
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
use std::time::{SystemTime, UNIX_EPOCH};

pub(crate) const PROBLEM_JSON: &str = "application/problem+json";

/// Marks a response the gateway made itself (a refusal or an upstream failure), as opposed to
/// one the upstream sent; the CORS layer adds the allow-list's headers only to these.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GatewayMade;

/// An RFC 9457 problem document.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub(crate) struct Problem {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub title: &'static str,
    pub status: u16,
    pub detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after: Option<u64>,
}

impl Problem {
    pub(crate) fn rate_limited(retry_after: u64) -> Self {
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

    /// The store could not answer and a limiter with `on_store_error = "deny"` refused: the
    /// server's failure, not the caller's budget (that is [`Problem::rate_limited`]).
    pub(crate) fn store_unavailable(retry_after: u64) -> Self {
        let unit = if retry_after == 1 {
            "second"
        } else {
            "seconds"
        };
        Self {
            kind: "urn:fleet-limiter:problem:store-unavailable",
            title: "Service Unavailable",
            status: 503,
            detail: format!(
                "The rate limiter's store cannot answer, and this route is refused while it cannot (on_store_error = \"deny\"); this is not the client's budget; retry after {retry_after} {unit}."
            ),
            retry_after: Some(retry_after),
        }
    }

    /// Admission control turned the request away: every slot of its group was taken and the
    /// queue was full, or it waited the queue timeout for one (503); or its client address
    /// already held its share of the group's slots (429).
    pub(crate) fn overloaded(
        group: &str,
        reason: crate::metrics::ShedReason,
        retry_after: u64,
    ) -> Self {
        use crate::metrics::ShedReason;
        let unit = if retry_after == 1 {
            "second"
        } else {
            "seconds"
        };
        let why = match reason {
            ShedReason::QueueFull => "and the queue is full",
            ShedReason::QueueTimeout => "and none came free while it waited",
            ShedReason::ClientShare | ShedReason::BodyHold => {
                return Self {
                    kind: "urn:fleet-limiter:problem:client-share",
                    title: "Too Many Requests",
                    status: 429,
                    detail: format!(
                        "This client address already has as many requests in flight as one address may (admission group `{group}`, admission.client_share_percent); the others are being served; retry after {retry_after} {unit}."
                    ),
                    retry_after: Some(retry_after),
                }
            }
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

    /// A WebSocket handshake refused before the upstream saw it: as many upgraded connections
    /// are open as the gateway holds (503), or as this client address may hold (429).
    pub(crate) fn upgrade_refused(
        reason: crate::metrics::UpgradeRefusal,
        cap: usize,
        retry_after: u64,
    ) -> Self {
        use crate::metrics::UpgradeRefusal;
        match reason {
            UpgradeRefusal::MaxOpen => Self {
                kind: "urn:fleet-limiter:problem:websockets-full",
                title: "Service Unavailable",
                status: 503,
                detail: format!(
                    "The gateway has as many WebSockets open as it holds ({cap}, websocket.max_open); retry after {retry_after} seconds."
                ),
                retry_after: Some(retry_after),
            },
            UpgradeRefusal::MaxPerClient => Self {
                kind: "urn:fleet-limiter:problem:client-websockets",
                title: "Too Many Requests",
                status: 429,
                detail: format!(
                    "This client address has {cap} WebSockets open, as many as one address may (websocket.max_per_client); close one, or retry after {retry_after} seconds."
                ),
                retry_after: Some(retry_after),
            },
        }
    }

    pub(crate) fn bad_gateway(detail: impl Into<String>) -> Self {
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
    pub(crate) fn non_canonical_path(rejected: &crate::path::Rejected) -> Self {
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

    /// A body a `body:` limiter must read that cannot be read with certainty (see
    /// [`crate::keys::body::Unreadable`]).
    pub(crate) fn unreadable_body(
        why: crate::keys::body::Unreadable,
        field: &str,
        max_bytes: usize,
    ) -> Self {
        use crate::keys::body::Unreadable;
        let (kind, title) = match why {
            Unreadable::MediaType | Unreadable::Charset | Unreadable::Encoding => (
                "urn:fleet-limiter:problem:unreadable-body",
                "Unsupported Media Type",
            ),
            Unreadable::TooLarge => (
                "urn:fleet-limiter:problem:unreadable-body",
                "Content Too Large",
            ),
            Unreadable::TooSlow => (
                "urn:fleet-limiter:problem:unreadable-body",
                "Request Timeout",
            ),
            _ => ("urn:fleet-limiter:problem:unreadable-body", "Bad Request"),
        };
        Self {
            kind,
            title,
            status: why.status(),
            detail: why.detail(field, max_bytes),
            retry_after: None,
        }
    }

    /// A method the resource does not take; the caller adds `Allow`.
    pub(crate) fn method_not_allowed(detail: impl Into<String>) -> Self {
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
    pub(crate) fn unsupported_method(method: &str, allow: &str) -> Self {
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
    pub(crate) fn method_override(detail: String) -> Self {
        Self {
            kind: "urn:fleet-limiter:problem:method-override",
            title: "Bad Request",
            status: 400,
            detail,
            retry_after: None,
        }
    }

    pub(crate) fn gateway_timeout(detail: impl Into<String>) -> Self {
        Self {
            kind: "urn:fleet-limiter:problem:upstream-timeout",
            title: "Gateway Timeout",
            status: 504,
            detail: detail.into(),
            retry_after: None,
        }
    }

    /// The client's request body did not arrive in time (its pace is in `detail`).
    pub(crate) fn request_timeout(detail: impl Into<String>) -> Self {
        Self {
            kind: "urn:fleet-limiter:problem:request-timeout",
            title: "Request Timeout",
            status: 408,
            detail: detail.into(),
            retry_after: None,
        }
    }

    pub(crate) fn into_response(self) -> HttpResponse {
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
/// Every limit header any profile sends. Draft 7, 8 and 10 send the first two, draft 6 the
/// next four, the legacy headers the last three.
static NAMES: [HeaderName; 8] = [
    HeaderName::from_static("ratelimit"),
    HeaderName::from_static("ratelimit-policy"),
    HeaderName::from_static("ratelimit-limit"),
    HeaderName::from_static("ratelimit-remaining"),
    HeaderName::from_static("ratelimit-reset"),
    HeaderName::from_static("x-ratelimit-limit"),
    HeaderName::from_static("x-ratelimit-remaining"),
    HeaderName::from_static("x-ratelimit-reset"),
];
/// The seconds until the caller's own poll slot, on a route `[shaping]` names.
pub(crate) static X_POLL_INTERVAL: HeaderName = HeaderName::from_static("x-poll-interval");
const RATELIMIT: usize = 0;
const POLICY: usize = 1;
/// `RateLimit-Limit`, `-Remaining`, `-Reset` (draft 6) start here.
const DRAFT6: usize = 2;
/// `X-RateLimit-Limit`, `-Remaining`, `-Reset` start here.
const LEGACY: usize = 5;

/// Every limit header name any profile may send (lower-case), for what must pass them on or
/// expose them: the CORS layer, the proxies' configurations, the Express client.
pub fn limit_header_names() -> impl Iterator<Item = &'static str> {
    NAMES.iter().map(HeaderName::as_str)
}

/// The names `profile` sends: its standard's, then the legacy ones.
fn names_sent(profile: &HeaderProfile) -> [&'static [HeaderName]; 2] {
    let standard: &'static [HeaderName] = match profile.standard {
        Standard::Off => &[],
        Standard::Draft6 => &NAMES[POLICY..LEGACY],
        Standard::Draft7 | Standard::Draft8 | Standard::Draft10 => &NAMES[RATELIMIT..DRAFT6],
    };
    let legacy: &'static [HeaderName] = if profile.legacy {
        &NAMES[LEGACY..]
    } else {
        &[]
    };
    [standard, legacy]
}

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

/// A header value made before the buffer was frozen, or where in the buffer it is.
#[derive(Clone)]
enum Slot {
    Ready(HeaderValue),
    Range(usize, usize),
}

/// `n` as a header value: from the table of small numbers, or written into `buf`.
fn number(buf: &mut BytesMut, n: u64) -> Slot {
    match small_number(n) {
        Some(v) => Slot::Ready(v),
        None => {
            let start = buf.len();
            buf.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
            Slot::Range(start, buf.len())
        }
    }
}

/// Every limit header of `profile`, handed to `out` as it is made. `told`: the seconds an
/// answer's `Retry-After` says when it is not the outcome's own (a spread wait, an admission
/// 503): every reset sent says the same (on an outcome that was not refused, every limiter's).
/// `RateLimit-Policy` depends only on which limiters decided (and, in its draft-6/7 form, which
/// one the single-limit headers describe), so it is reused from the previous response on this
/// thread when those are the same; the other values are written into one buffer (one
/// allocation for all of them) and handed out as slices of it, or taken from a table of small
/// numbers.
fn render(
    outcome: &Outcome,
    profile: &HeaderProfile,
    decided_at: Option<SystemTime>,
    told: Option<u64>,
    mut out: impl FnMut(&'static HeaderName, HeaderValue),
) {
    // On a shaped route, whatever the limit headers' profile: when to come next.
    if let Some(secs) = outcome.poll_after_secs {
        out(&X_POLL_INTERVAL, HeaderValue::from(secs));
    }
    if !profile.sends_any() {
        return;
    }
    let Some(outcome) = disclosed(outcome) else {
        return;
    };
    let outcome = &*outcome;
    let Some(expiring) = expiring(outcome) else {
        return;
    };
    // On a refusal, the wait every reset speaks of: Retry-After's.
    let refused = outcome.refused();
    let wait = match told {
        Some(w) => Some(w),
        None if refused => outcome.retry_after_secs(),
        None => None,
    };
    // Told a wait on an outcome that refused nothing: every limiter's reset is that wait.
    let every = told.is_some() && !refused;
    let single_reset = wait.unwrap_or_else(|| reset_secs(expiring).unwrap_or(0));
    let limit = u64::from(expiring.verdict.limit);
    let remaining = u64::from(expiring.verdict.remaining);
    // Room for all this profile writes, so the buffer never grows: the counts of draft 6 and
    // the legacy headers (written once for both) and their reset take 20 digits at most when
    // they are not in the table of small numbers, and nothing when they are (with the
    // calibration's budgets they are, and a profile of only those allocates nothing).
    let written = |n: u64| if n < SMALL_NUMBERS { 0 } else { 20 };
    let mut buf = BytesMut::with_capacity(
        match profile.standard {
            Standard::Draft8 | Standard::Draft10 => 72 * outcome.results.len(),
            Standard::Draft7 => 48,
            Standard::Draft6 | Standard::Off => 0,
        } + if profile.standard == Standard::Draft6 || profile.legacy {
            written(limit) + written(remaining) + written(single_reset)
        } else {
            0
        } + if profile.reads_wall_clock() { 20 } else { 0 },
    );
    let mut values: SmallVec<[(usize, Slot); 8]> = SmallVec::new();
    // Draft 6 and the legacy headers carry the same limit and remaining, and with a reset in
    // seconds the same reset: each number is written once and its value sent under both names.
    let draft6 = profile.standard == Standard::Draft6;
    let counts =
        (draft6 || profile.legacy).then(|| (number(&mut buf, limit), number(&mut buf, remaining)));
    let reset_in_secs = (draft6 || (profile.legacy && profile.legacy_reset == LegacyReset::Delta))
        .then(|| number(&mut buf, single_reset));
    match profile.standard {
        Standard::Off => {}
        Standard::Draft10 | Standard::Draft8 => {
            values.push((
                POLICY,
                Slot::Ready(policy_value(outcome, PolicyForm::Named, usize::MAX)),
            ));
            let start = buf.len();
            write_service_limits(&mut buf, outcome, wait, every, profile.standard);
            values.push((RATELIMIT, Slot::Range(start, buf.len())));
        }
        Standard::Draft7 => {
            values.push((
                POLICY,
                Slot::Ready(policy_value(outcome, PolicyForm::Numbers, expiring.slot)),
            ));
            let start = buf.len();
            let mut digits = itoa::Buffer::new();
            buf.extend_from_slice(b"limit=");
            buf.extend_from_slice(digits.format(limit).as_bytes());
            buf.extend_from_slice(b", remaining=");
            buf.extend_from_slice(digits.format(remaining).as_bytes());
            buf.extend_from_slice(b", reset=");
            buf.extend_from_slice(digits.format(single_reset).as_bytes());
            values.push((RATELIMIT, Slot::Range(start, buf.len())));
        }
        Standard::Draft6 => {
            values.push((
                POLICY,
                Slot::Ready(policy_value(outcome, PolicyForm::Numbers, expiring.slot)),
            ));
            if let (Some((limit, remaining)), Some(reset)) = (&counts, &reset_in_secs) {
                values.push((DRAFT6, limit.clone()));
                values.push((DRAFT6 + 1, remaining.clone()));
                values.push((DRAFT6 + 2, reset.clone()));
            }
        }
    }
    if let (true, Some((limit, remaining))) = (profile.legacy, counts) {
        values.push((LEGACY, limit));
        values.push((LEGACY + 1, remaining));
        let reset = match (profile.legacy_reset, reset_in_secs) {
            (LegacyReset::Delta, Some(reset)) => reset,
            (LegacyReset::Delta, None) => number(&mut buf, single_reset),
            (LegacyReset::Unix, _) => {
                // Counted from the exact instant, rounded up: never a second before the
                // request could succeed (or the quota is whole).
                let ahead_ns = match wait {
                    Some(w) => w.saturating_mul(NANOS),
                    None if expiring.verdict.allowed => expiring.verdict.reset_after_ns,
                    None => single_reset.saturating_mul(NANOS),
                };
                let now_ns = decided_at
                    .unwrap_or_else(SystemTime::now)
                    .duration_since(UNIX_EPOCH)
                    .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
                    .unwrap_or(0);
                number(&mut buf, ceil_secs(now_ns.saturating_add(ahead_ns)))
            }
        };
        values.push((LEGACY + 2, reset));
    }
    let all = buf.freeze();
    // A range sent under two names is checked and made into a value once.
    let mut made: SmallVec<[(usize, usize, HeaderValue); 4]> = SmallVec::new();
    for (name, slot) in values {
        let v = match slot {
            Slot::Ready(v) => v,
            Slot::Range(a, b) => match made.iter().find(|(x, y, _)| (*x, *y) == (a, b)) {
                Some((_, _, v)) => v.clone(),
                None => match HeaderValue::from_maybe_shared(all.slice(a..b)) {
                    Ok(v) => {
                        made.push((a, b, v.clone()));
                        v
                    }
                    Err(_) => continue,
                },
            },
        };
        out(&NAMES[name], v);
    }
}

const NANOS: u64 = 1_000_000_000;

/// What the limit headers may speak of: the outcome less its limiters with `disclose = false`,
/// or `None` when a non-disclosing limiter refused the request. Then no limit header is sent at
/// all: one naming the other limiters would tell, by what it leaves out (a budget with room
/// left on a refusal), that a hidden one refused. So a refusal a hidden limiter takes part in
/// looks the same whichever limiter refused: `Retry-After`, from the buckets, and the generic
/// problem document. The outcome itself, borrowed, when every limiter discloses.
fn disclosed(outcome: &Outcome) -> Option<std::borrow::Cow<'_, Outcome>> {
    if outcome.results.iter().all(|r| r.spec.disclose) {
        return Some(std::borrow::Cow::Borrowed(outcome));
    }
    if outcome
        .results
        .iter()
        .any(|r| !r.spec.disclose && r.refuses())
    {
        return None;
    }
    Some(std::borrow::Cow::Owned(Outcome {
        client_ip: outcome.client_ip,
        results: outcome
            .results
            .iter()
            .filter(|r| r.spec.disclose)
            .cloned()
            .collect(),
        store_error: outcome.store_error.clone(),
        poll_after_secs: outcome.poll_after_secs,
    }))
}

/// The limiter the single-limit headers (draft 6 and 7, legacy) describe: on a refusal the
/// enforcing limiter that refused with the longest wait (the one `Retry-After` is from), else
/// the one closest to refusing; when only the store's failure refused, the limiter that refused
/// for it with the longest wait. `None` when no limiter decided and none refused (the store
/// failed for all, and they let the request through).
fn expiring(outcome: &Outcome) -> Option<&LimitResult> {
    let shown = shown(outcome);
    outcome
        .results
        .iter()
        .filter(|r| shown(r) && r.refuses())
        .max_by_key(|r| {
            (
                r.verdict.retry_after_ns,
                std::cmp::Reverse((r.verdict.remaining, r.verdict.limit)),
            )
        })
        .or_else(|| outcome.tightest())
}

/// Which limiters the limit headers describe: those that decided (the store answered, or a
/// `local` bucket did); and, when the store's failure alone refused the request, the limiters
/// that refused for it (nothing left now, back when `Retry-After` says).
fn shown(outcome: &Outcome) -> impl Fn(&LimitResult) -> bool {
    let store_down = outcome.store_unavailable();
    move |r: &LimitResult| !r.store_error || (store_down && r.refuses())
}

/// Seconds until a limiter's quota resets (is whole again), rounded up: the reset of draft 6,
/// 7 and 8 and of `X-RateLimit-Reset`. A verdict that said no (a shadow limiter's) resets, for
/// its client, when it would say yes: its wait, at least 1. `None` when the quota is whole.
fn reset_secs(r: &LimitResult) -> Option<u64> {
    let v = &r.verdict;
    if !v.allowed {
        return Some(crate::limiter::wait_secs(v.retry_after_ns));
    }
    if v.reset_after_ns == 0 || v.remaining >= v.limit {
        return None;
    }
    Some(ceil_secs(v.reset_after_ns))
}

/// The `RateLimit` value of draft 8 and 10: `"name";r=29;t=2;pk=:…:` for each limiter that
/// decided. On a refusal (`wait`), the limiters that refused carry `t` = `Retry-After` and the
/// others none (nothing was taken from them, and their own resets do not say when the request
/// can succeed). `every`: each limiter carries `t` = `wait` (an answer that refused what every
/// limiter allowed).
fn write_service_limits(
    buf: &mut BytesMut,
    outcome: &Outcome,
    wait: Option<u64>,
    every: bool,
    standard: Standard,
) {
    use base64::Engine;
    let mut num = itoa::Buffer::new();
    let shown = shown(outcome);
    let decided = outcome.results.iter().filter(|r| shown(r));
    for (i, r) in decided.enumerate() {
        if i > 0 {
            buf.extend_from_slice(b", ");
        }
        buf.extend_from_slice(b"\"");
        buf.extend_from_slice(r.spec.name.as_bytes());
        buf.extend_from_slice(b"\";r=");
        buf.extend_from_slice(num.format(r.verdict.remaining).as_bytes());
        let t = match wait {
            Some(w) => (every || r.refuses()).then_some(w),
            None if standard == Standard::Draft10 => more_quota_after_secs(&r.quota, &r.verdict),
            None => reset_secs(r),
        };
        if let Some(t) = t {
            buf.extend_from_slice(b";t=");
            buf.extend_from_slice(num.format(t).as_bytes());
        }
        // 8 bytes are 12 characters of base64 with their padding.
        let mut pk = [0u8; 12];
        if let Ok(n) = base64::engine::general_purpose::STANDARD.encode_slice(r.partition, &mut pk)
        {
            buf.extend_from_slice(b";pk=:");
            buf.extend_from_slice(&pk[..n]);
            buf.extend_from_slice(b":");
        }
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

/// How a `RateLimit-Policy` value is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PolicyForm {
    /// Draft 8 and 10: `"agent-device";q=30;w=60, ...`, one named item per limiter.
    Named,
    /// Draft 6 and 7: `30;w=60, ...`, integer items, no two with the same quota (the drafts
    /// forbid it): the limiter the single-limit headers describe first, so that its window can
    /// be read beside them, then each other limiter whose budget differs from those before it.
    Numbers,
}

/// The form, the limiters a `RateLimit-Policy` value names, the one it puts first
/// (`usize::MAX` for none), and the value.
type PolicyValue = (
    PolicyForm,
    SmallVec<[(Arc<LimiterSpec>, crate::limiter::Quota); 4]>,
    usize,
    HeaderValue,
);

thread_local! {
    /// The last `RateLimit-Policy` rendered on this thread. The specs are held (not just their
    /// addresses), so a reloaded configuration never matches.
    static LAST_POLICY: RefCell<Option<PolicyValue>> = const { RefCell::new(None) };
}

/// A window in whole seconds, rounded up, at least 1 (the drafts' `w` is a positive integer).
fn window_secs(quota: &crate::limiter::Quota) -> u64 {
    ceil_secs(quota.window_ns()).max(1)
}

/// `RateLimit-Policy` in `form` for the limiters that decided, `first` (a policy slot, for
/// [`PolicyForm::Numbers`]) leading.
fn policy_value(outcome: &Outcome, form: PolicyForm, first: usize) -> HeaderValue {
    let shown = shown(outcome);
    let decided = || outcome.results.iter().filter(|r| shown(r));
    // The limiters' budgets too: a plan or an override judges a bucket by another.
    let same = |f: PolicyForm, specs: &[(Arc<LimiterSpec>, crate::limiter::Quota)], at: usize| {
        f == form
            && at == first
            && specs.len() == decided().count()
            && specs
                .iter()
                .zip(decided())
                .all(|((a, q), r)| Arc::ptr_eq(a, &r.spec) && *q == r.quota)
    };
    let cached = LAST_POLICY.with_borrow(|last| match last {
        Some((f, specs, at, value)) if same(*f, specs, *at) => Some(value.clone()),
        _ => None,
    });
    if let Some(v) = cached {
        return v;
    }
    let mut buf = BytesMut::with_capacity(40 * outcome.results.len());
    let mut num = itoa::Buffer::new();
    match form {
        PolicyForm::Named => {
            for (i, r) in decided().enumerate() {
                if i > 0 {
                    buf.extend_from_slice(b", ");
                }
                buf.extend_from_slice(b"\"");
                buf.extend_from_slice(r.spec.name.as_bytes());
                buf.extend_from_slice(b"\";q=");
                buf.extend_from_slice(num.format(r.quota.limit()).as_bytes());
                buf.extend_from_slice(b";w=");
                buf.extend_from_slice(num.format(window_secs(&r.quota)).as_bytes());
            }
        }
        PolicyForm::Numbers => {
            let lead = decided().filter(|r| r.slot == first);
            let rest = decided().filter(|r| r.slot != first);
            let mut written: SmallVec<[u32; 4]> = SmallVec::new();
            for r in lead.chain(rest) {
                let q = r.quota.limit();
                if written.contains(&q) {
                    continue;
                }
                if !written.is_empty() {
                    buf.extend_from_slice(b", ");
                }
                written.push(q);
                buf.extend_from_slice(num.format(q).as_bytes());
                buf.extend_from_slice(b";w=");
                buf.extend_from_slice(num.format(window_secs(&r.quota)).as_bytes());
            }
        }
    }
    let value = HeaderValue::from_maybe_shared(buf.freeze())
        .unwrap_or_else(|_| HeaderValue::from_static(""));
    let specs = decided().map(|r| (r.spec.clone(), r.quota)).collect();
    LAST_POLICY.set(Some((form, specs, first, value.clone())));
    value
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
