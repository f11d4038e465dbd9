//! GCRA: the token bucket as one timestamp per key (the theoretical arrival time, TAT).
//!
//! With emission interval `T = window / limit` and burst `limit`, a request at `now` is allowed
//! when `max(tat, now) + T - now <= limit * T`; it then moves `tat` forward by `T`.

use super::{Quota, State, Verdict};
use crate::clock::Nanos;
use std::num::NonZeroU32;

/// [`decide_units`] for one unit.
#[cfg(test)]
pub(crate) fn decide(quota: &Quota, state: Option<State>, now: Nanos) -> (Verdict, Option<State>) {
    decide_units(quota, state, now, NonZeroU32::MIN)
}

/// [`decide`] for a request that costs `units`: allowed when all of them fit, moving `tat` by
/// `units` emission intervals; a refusal waits until they all fit.
pub(crate) fn decide_units(
    quota: &Quota,
    state: Option<State>,
    now: Nanos,
    units: NonZeroU32,
) -> (Verdict, Option<State>) {
    let t = quota.emission_interval_ns();
    let limit = quota.limit();
    let burst = t.saturating_mul(limit as u64);
    let tat = match state {
        Some(State::Gcra { tat }) => tat.max(now),
        _ => now,
    };
    let new_tat = tat.saturating_add(t.saturating_mul(u64::from(units.get())));
    let used = new_tat - now;
    if used > burst {
        let verdict = Verdict {
            allowed: false,
            limit,
            remaining: 0,
            reset_after_ns: tat - now,
            retry_after_ns: used - burst,
        };
        return (verdict, None);
    }
    let remaining = ((burst - used) / t).min(limit as u64) as u32;
    let verdict = Verdict {
        allowed: true,
        limit,
        remaining,
        reset_after_ns: used,
        retry_after_ns: 0,
    };
    (verdict, Some(State::Gcra { tat: new_tat }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::nonzero;
    use std::time::Duration;

    const S: u64 = 1_000_000_000;

    fn run(q: &Quota, state: &mut Option<State>, now: Nanos) -> Verdict {
        let (v, s) = decide(q, *state, now);
        if s.is_some() {
            *state = s;
        }
        v
    }

    #[test]
    fn burst_of_limit_then_refusal_with_exact_wait() {
        let q = Quota::gcra(nonzero(30), Duration::from_secs(60));
        let mut st = None;
        let now = 100 * S;
        for i in 0..30 {
            let v = run(&q, &mut st, now);
            assert!(v.allowed, "request {} should pass", i + 1);
            assert_eq!(v.remaining, 29 - i);
        }
        let v = run(&q, &mut st, now);
        assert!(!v.allowed);
        assert_eq!(v.retry_after_ns, 2 * S, "one token every 2 s");
        assert_eq!(v.reset_after_ns, 60 * S);
        // Half a token later: still refused, the wait has shrunk.
        let v = run(&q, &mut st, now + S);
        assert!(!v.allowed);
        assert_eq!(v.retry_after_ns, S);
        // Exactly at the wait: allowed, bucket empty again.
        let v = run(&q, &mut st, now + 2 * S);
        assert!(v.allowed);
        assert_eq!(v.remaining, 0);
    }

    #[test]
    fn first_request_reports_issue_example_headers() {
        let q = Quota::gcra(nonzero(30), Duration::from_secs(60));
        let (v, s) = decide(&q, None, 10 * S);
        assert!(v.allowed);
        assert_eq!(v.remaining, 29);
        assert_eq!(v.reset_after_ns, 2 * S);
        assert_eq!(s, Some(State::Gcra { tat: 12 * S }));
    }

    #[test]
    fn refills_continuously() {
        let q = Quota::gcra(nonzero(10), Duration::from_secs(10));
        let mut st = None;
        for _ in 0..10 {
            assert!(run(&q, &mut st, 0).allowed);
        }
        assert!(!run(&q, &mut st, 0).allowed);
        // After 5 s, five tokens are back.
        let mut allowed = 0;
        for _ in 0..10 {
            if run(&q, &mut st, 5 * S).allowed {
                allowed += 1;
            }
        }
        assert_eq!(allowed, 5);
    }

    #[test]
    fn refusal_does_not_change_state() {
        let q = Quota::gcra(nonzero(1), Duration::from_secs(60));
        let (_, s) = decide(&q, None, 0);
        let (v, s2) = decide(&q, s, 0);
        assert!(!v.allowed);
        assert_eq!(s2, None);
    }

    #[test]
    fn stale_state_is_a_full_bucket() {
        let q = Quota::gcra(nonzero(5), Duration::from_secs(5));
        let (v, _) = decide(&q, Some(State::Gcra { tat: 3 * S }), 1000 * S);
        assert!(v.allowed);
        assert_eq!(v.remaining, 4);
    }
}
