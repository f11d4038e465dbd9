//! The limit headers' names: every one any profile sends, `X-Poll-Interval`, and which a
//! profile sends.

use crate::config::headers::{HeaderProfile, Standard};
use actix_web::http::header::HeaderName;

// A static, not a const: a const array would be built and dropped again at every use.
/// Every limit header any profile sends. Draft 7, 8 and 10 send the first two, draft 6 the
/// next four, the legacy headers the last three.
pub(super) static NAMES: [HeaderName; 8] = [
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
pub(super) const RATELIMIT: usize = 0;
pub(super) const POLICY: usize = 1;
/// `RateLimit-Limit`, `-Remaining`, `-Reset` (draft 6) start here.
pub(super) const DRAFT6: usize = 2;
/// `X-RateLimit-Limit`, `-Remaining`, `-Reset` start here.
pub(super) const LEGACY: usize = 5;

/// Every limit header name any profile may send (lower-case), for what must pass them on or
/// expose them: the CORS layer, the proxies' configurations, the Express client.
pub fn limit_header_names() -> impl Iterator<Item = &'static str> {
    NAMES.iter().map(HeaderName::as_str)
}

/// The names `profile` sends: its standard's, then the legacy ones.
pub(super) fn names_sent(profile: &HeaderProfile) -> [&'static [HeaderName]; 2] {
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
