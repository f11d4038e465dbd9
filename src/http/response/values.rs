//! Header values written cheaply: small numbers from a table made once per process, others
//! as ranges of one buffer, and the `RateLimit` value of draft 8 and 10.

use super::disclosed::{reset_secs, shown};
use crate::config::headers::Standard;
use crate::decision::Outcome;
use crate::limiter::more_quota_after_secs;
use actix_web::http::header::HeaderValue;
use bytes::BytesMut;

/// A header value made before the buffer was frozen, or where in the buffer it is.
#[derive(Clone)]
pub(super) enum Slot {
    Ready(HeaderValue),
    Range(usize, usize),
}

/// `n` as a header value: from the table of small numbers, or written into `buf`.
pub(super) fn number(buf: &mut BytesMut, n: u64) -> Slot {
    match small_number(n) {
        Some(v) => Slot::Ready(v),
        None => {
            let start = buf.len();
            buf.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
            Slot::Range(start, buf.len())
        }
    }
}

/// The `RateLimit` value of draft 8 and 10: `"name";r=29;t=2;pk=:…:` for each limiter that
/// decided. On a refusal (`wait`), the limiters that refused carry `t` = `Retry-After` and the
/// others none (nothing was taken from them, and their own resets do not say when the request
/// can succeed). `every`: each limiter carries `t` = `wait` (an answer that refused what every
/// limiter allowed).
pub(super) fn write_service_limits(
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
pub(super) const SMALL_NUMBERS: u64 = 4096;

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
