//! One answer's limit headers, made step by step: the figures they speak of, one buffer sized
//! for them, the standard's values, the legacy ones, and each value handed out under its name.

use super::disclosed::{disclosed, expiring, reset_secs};
use super::names::{DRAFT6, LEGACY, NAMES, POLICY, RATELIMIT, X_POLL_INTERVAL};
use super::policy::{policy_value, PolicyForm};
use super::values::{number, write_service_limits, Slot, SMALL_NUMBERS};
use crate::config::headers::{HeaderProfile, LegacyReset, Standard};
use crate::decision::{LimitResult, Outcome};
use crate::limiter::ceil_secs;
use actix_web::http::header::{HeaderName, HeaderValue};
use bytes::{Bytes, BytesMut};
use smallvec::SmallVec;
use std::time::{SystemTime, UNIX_EPOCH};

const NANOS: u64 = 1_000_000_000;

/// The values made so far, each with the index of its name in [`NAMES`].
type Values = SmallVec<[(usize, Slot); 8]>;

/// What every limit header of one answer is read from.
struct Figures<'a> {
    /// The outcome less what may not be disclosed.
    outcome: &'a Outcome,
    /// The limiter the single-limit headers describe.
    expiring: &'a LimitResult,
    /// On a refusal, the wait every reset speaks of.
    wait: Option<u64>,
    /// Every limiter's reset is `wait`.
    every: bool,
    /// The reset of the single-limit headers.
    single_reset: u64,
    limit: u64,
    remaining: u64,
}

impl<'a> Figures<'a> {
    /// The figures of `outcome` (`told`: see [`render`]); `None` when no limiter is there to
    /// describe.
    fn of(outcome: &'a Outcome, told: Option<u64>) -> Option<Self> {
        let expiring = expiring(outcome)?;
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
        Some(Self {
            outcome,
            expiring,
            wait,
            every,
            single_reset,
            limit: u64::from(expiring.verdict.limit),
            remaining: u64::from(expiring.verdict.remaining),
        })
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
pub(super) fn render(
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
    let Some(f) = Figures::of(outcome, told) else {
        return;
    };
    let mut buf = BytesMut::with_capacity(capacity(profile, &f));
    let mut values = Values::new();
    // Draft 6 and the legacy headers carry the same limit and remaining, and with a reset in
    // seconds the same reset: each number is written once and its value sent under both names.
    let draft6 = profile.standard == Standard::Draft6;
    let counts = (draft6 || profile.legacy)
        .then(|| (number(&mut buf, f.limit), number(&mut buf, f.remaining)));
    let reset_in_secs = (draft6 || (profile.legacy && profile.legacy_reset == LegacyReset::Delta))
        .then(|| number(&mut buf, f.single_reset));
    standard_values(&mut buf, &mut values, profile, &f, &counts, &reset_in_secs);
    if let (true, Some(counts)) = (profile.legacy, counts) {
        legacy_values(
            &mut buf,
            &mut values,
            profile,
            &f,
            decided_at,
            counts,
            reset_in_secs,
        );
    }
    hand_out(&buf.freeze(), values, out);
}

/// Room for all this profile writes, so the buffer never grows: the counts of draft 6 and the
/// legacy headers (written once for both) and their reset take 20 digits at most when they are
/// not in the table of small numbers, and nothing when they are (with the calibration's budgets
/// they are, and a profile of only those allocates nothing).
fn capacity(profile: &HeaderProfile, f: &Figures<'_>) -> usize {
    let written = |n: u64| if n < SMALL_NUMBERS { 0 } else { 20 };
    let standard = match profile.standard {
        Standard::Draft8 | Standard::Draft10 => 72 * f.outcome.results.len(),
        Standard::Draft7 => 48,
        Standard::Draft6 | Standard::Off => 0,
    };
    let counts = if profile.standard == Standard::Draft6 || profile.legacy {
        written(f.limit) + written(f.remaining) + written(f.single_reset)
    } else {
        0
    };
    let clock = if profile.reads_wall_clock() { 20 } else { 0 };
    standard + counts + clock
}

/// The values of `profile`'s standard: `RateLimit-Policy`, then `RateLimit` (draft 7, 8 and
/// 10) or the draft-6 counts and reset (`counts` and `reset_in_secs`, shared with the legacy
/// headers).
fn standard_values(
    buf: &mut BytesMut,
    values: &mut Values,
    profile: &HeaderProfile,
    f: &Figures<'_>,
    counts: &Option<(Slot, Slot)>,
    reset_in_secs: &Option<Slot>,
) {
    match profile.standard {
        Standard::Off => {}
        Standard::Draft10 | Standard::Draft8 => {
            values.push((
                POLICY,
                Slot::Ready(policy_value(f.outcome, PolicyForm::Named, usize::MAX)),
            ));
            let start = buf.len();
            write_service_limits(buf, f.outcome, f.wait, f.every, profile.standard);
            values.push((RATELIMIT, Slot::Range(start, buf.len())));
        }
        Standard::Draft7 => {
            values.push((
                POLICY,
                Slot::Ready(policy_value(
                    f.outcome,
                    PolicyForm::Numbers,
                    f.expiring.slot,
                )),
            ));
            let start = buf.len();
            let mut digits = itoa::Buffer::new();
            buf.extend_from_slice(b"limit=");
            buf.extend_from_slice(digits.format(f.limit).as_bytes());
            buf.extend_from_slice(b", remaining=");
            buf.extend_from_slice(digits.format(f.remaining).as_bytes());
            buf.extend_from_slice(b", reset=");
            buf.extend_from_slice(digits.format(f.single_reset).as_bytes());
            values.push((RATELIMIT, Slot::Range(start, buf.len())));
        }
        Standard::Draft6 => {
            values.push((
                POLICY,
                Slot::Ready(policy_value(
                    f.outcome,
                    PolicyForm::Numbers,
                    f.expiring.slot,
                )),
            ));
            if let (Some((limit, remaining)), Some(reset)) = (counts, reset_in_secs) {
                values.push((DRAFT6, limit.clone()));
                values.push((DRAFT6 + 1, remaining.clone()));
                values.push((DRAFT6 + 2, reset.clone()));
            }
        }
    }
}

/// The legacy headers' values: the counts (shared with draft 6), then the reset in seconds
/// (shared too when draft 6 wrote it) or as a Unix time.
fn legacy_values(
    buf: &mut BytesMut,
    values: &mut Values,
    profile: &HeaderProfile,
    f: &Figures<'_>,
    decided_at: Option<SystemTime>,
    (limit, remaining): (Slot, Slot),
    reset_in_secs: Option<Slot>,
) {
    values.push((LEGACY, limit));
    values.push((LEGACY + 1, remaining));
    let reset = match (profile.legacy_reset, reset_in_secs) {
        (LegacyReset::Delta, Some(reset)) => reset,
        (LegacyReset::Delta, None) => number(buf, f.single_reset),
        (LegacyReset::Unix, _) => number(buf, unix_reset(f, decided_at)),
    };
    values.push((LEGACY + 2, reset));
}

/// `X-RateLimit-Reset` as a Unix time, from `decided_at` (or the clock now).
fn unix_reset(f: &Figures<'_>, decided_at: Option<SystemTime>) -> u64 {
    // Counted from the exact instant, rounded up: never a second before the
    // request could succeed (or the quota is whole).
    let ahead_ns = match f.wait {
        Some(w) => w.saturating_mul(NANOS),
        None if f.expiring.verdict.allowed => f.expiring.verdict.reset_after_ns,
        None => f.single_reset.saturating_mul(NANOS),
    };
    let now_ns = decided_at
        .unwrap_or_else(SystemTime::now)
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0);
    ceil_secs(now_ns.saturating_add(ahead_ns))
}

/// Each value handed to `out` under its name, a range as a slice of the frozen buffer `all`
/// (one that is not a valid header value is left out).
fn hand_out(all: &Bytes, values: Values, mut out: impl FnMut(&'static HeaderName, HeaderValue)) {
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
