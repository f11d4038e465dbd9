//! express-rate-limit's fixed window: `limit` hits per window, the window opening at a key's
//! first hit and closing `window` later, when the count starts again from zero.
//!
//! State: [`State::FixedWindow`], the instant the window closes and the hits counted in it.

use super::{Quota, State, Verdict};
use crate::clock::Nanos;
use std::num::NonZeroU32;

/// [`decide_units`] for one unit.
#[cfg(test)]
pub(crate) fn decide(quota: &Quota, state: Option<State>, now: Nanos) -> (Verdict, Option<State>) {
    decide_units(quota, state, now, NonZeroU32::MIN)
}

/// [`decide`] for a request that costs `units`: allowed when all of them fit in the window.
pub(crate) fn decide_units(
    quota: &Quota,
    state: Option<State>,
    now: Nanos,
    units: NonZeroU32,
) -> (Verdict, Option<State>) {
    let units = units.get();
    let limit = quota.limit();
    let (end, count) = match state {
        Some(State::FixedWindow { ends_at, count }) if now < ends_at => (ends_at, count),
        _ => (quota.window_end(now), 0),
    };
    let ends_in = end - now;
    if u64::from(count) + u64::from(units) > u64::from(limit) {
        let verdict = Verdict {
            allowed: false,
            limit,
            remaining: 0,
            reset_after_ns: ends_in,
            retry_after_ns: ends_in,
        };
        return (verdict, None);
    }
    let count = count + units;
    let verdict = Verdict {
        allowed: true,
        limit,
        remaining: limit - count,
        reset_after_ns: ends_in,
        retry_after_ns: 0,
    };
    (
        verdict,
        Some(State::FixedWindow {
            ends_at: end,
            count,
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::nonzero;
    use crate::limiter::Algorithm;
    use std::time::Duration;

    const S: u64 = 1_000_000_000;

    #[test]
    fn counts_to_limit_then_waits_for_window_end() {
        let q = Quota::new(nonzero(5), Duration::from_secs(900), Algorithm::FixedWindow);
        let mut st = None;
        for i in 0..5 {
            let (v, s) = decide(&q, st, 10 * S + i * S);
            assert!(v.allowed);
            assert_eq!(v.remaining as u64, 4 - i);
            st = s;
        }
        let (v, s) = decide(&q, st, 100 * S);
        assert!(!v.allowed);
        assert_eq!(s, None);
        assert_eq!(
            v.retry_after_ns,
            810 * S,
            "window opened at 10 s, closes at 910 s"
        );
        // The window closes: the count starts again.
        let (v, _) = decide(&q, st, 910 * S);
        assert!(v.allowed);
        assert_eq!(v.remaining, 4);
    }
}
