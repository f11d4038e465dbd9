//! The rate-limit math, as pure functions of (stored state, now, quota).
//!
//! Both stores call [`decide`]; the Redis Lua script mirrors it line for line.

pub(crate) mod calendar;
pub(crate) mod fixed_window;
pub(crate) mod gcra;

use crate::clock::Nanos;
use serde::{Deserialize, Serialize};
use std::num::NonZeroU32;
use std::time::Duration;

/// How a limiter counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Algorithm {
    /// Token bucket (GCRA): a burst of `limit`, refilling continuously at `limit` per `window`.
    #[default]
    Gcra,
    /// express-rate-limit's fixed window: `limit` per window, the window starting at a key's first hit.
    FixedWindow,
}

impl Algorithm {
    pub fn as_str(self) -> &'static str {
        match self {
            Algorithm::Gcra => "gcra",
            Algorithm::FixedWindow => "fixed-window",
        }
    }
}

/// A budget: `limit` requests per `window`, counted by `algorithm`. The limit is never 0: a
/// budget of nothing is not a limiter (switch it off with `mode = "off"`).
///
/// ```
/// use fleet_limiter::{nonzero, Algorithm, Quota};
/// use std::time::Duration;
///
/// let q = Quota::new(nonzero(30), Duration::from_secs(60), Algorithm::Gcra);
/// assert_eq!(q.limit(), 30);
/// assert_eq!(q.emission_interval_ns(), 2_000_000_000);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    limit: NonZeroU32,
    /// Never zero ([`Quota::new`] and [`Quota::with_window`] hold it).
    window: Duration,
    pub algorithm: Algorithm,
    /// `Some`: once the bucket refuses, its key is refused for this long (see [`State::Locked`]).
    lockout: Option<Duration>,
    /// `Some`: a fixed window that ends at the calendar's next boundary, not a window after it
    /// opened ([`Quota::calendar`]).
    calendar: Option<calendar::Calendar>,
}

/// `n` as a [`NonZeroU32`], for budgets written in code; in a `const` it fails to compile for
/// 0, elsewhere it panics (a budget of 0 is a bug in the program, not an input).
pub const fn nonzero(n: u32) -> NonZeroU32 {
    match NonZeroU32::new(n) {
        Some(n) => n,
        None => panic!("a budget is at least 1"),
    }
}

impl Quota {
    /// `limit` requests per `window`. The window is at least a nanosecond: a zero window is a
    /// bug in the program, not an input (the configuration refuses one, naming the field), and
    /// panics here, as [`nonzero`] does for a zero budget.
    pub fn new(limit: NonZeroU32, window: Duration, algorithm: Algorithm) -> Self {
        assert!(!window.is_zero(), "a window is longer than zero");
        Self {
            limit,
            window,
            algorithm,
            lockout: None,
            calendar: None,
        }
    }

    /// `limit` requests per calendar period: a fixed window that opens at the period's start
    /// and ends at its boundary, whenever the first request came. Its [`Quota::window`] is the
    /// longest such period (what `check` judges with); [`Quota::at`] gives the period's own.
    pub fn calendar(limit: NonZeroU32, calendar: calendar::Calendar) -> Self {
        Self {
            calendar: Some(calendar),
            ..Self::new(limit, calendar.unit.longest(), Algorithm::FixedWindow)
        }
    }

    /// The calendar window, if the budget is one.
    pub fn calendar_window(&self) -> Option<calendar::Calendar> {
        self.calendar
    }

    /// The budget as it stands at `now` (ns since the Unix epoch): a calendar window's
    /// [`Quota::window`] becomes the length of the period holding `now` (a 28-day February, a
    /// 23-hour day), what `RateLimit-Policy` states; any other budget is itself.
    pub fn at(self, now: Nanos) -> Self {
        match self.calendar {
            Some(c) => {
                let (start, end) = c.period(now);
                Self {
                    window: Duration::from_nanos((end - start).max(1)),
                    ..self
                }
            }
            None => self,
        }
    }

    /// When a fixed window opened at `now` ends: the calendar's next boundary, or a window
    /// later.
    pub fn window_end(&self, now: Nanos) -> Nanos {
        match self.calendar {
            Some(c) => c.next_boundary(now),
            None => now.saturating_add(self.window_ns()),
        }
    }

    /// The same budget, locking a key out for `lockout` from its first refusal (`None`, or a
    /// zero duration: no lockout). While locked every request of the key is refused, whatever
    /// the bucket holds, with the lock's remaining time as its wait; when the lock ends the key
    /// starts again with a full bucket.
    pub fn with_lockout(self, lockout: Option<Duration>) -> Self {
        Self {
            lockout: lockout.filter(|d| !d.is_zero()),
            ..self
        }
    }

    /// The lockout, if any (never zero).
    pub fn lockout(&self) -> Option<Duration> {
        self.lockout
    }

    /// The lockout in nanoseconds (at most `u64::MAX`), if any.
    pub fn lockout_ns(&self) -> Option<Nanos> {
        self.lockout
            .map(|d| d.as_nanos().min(u64::MAX as u128) as Nanos)
    }

    /// The window the budget refills over (never zero).
    pub fn window(&self) -> Duration {
        self.window
    }

    /// The same budget over another window (never zero; see [`Quota::new`]).
    pub fn with_window(self, window: Duration) -> Self {
        Self::new(self.limit, window, self.algorithm).with_lockout(self.lockout)
    }

    /// The same budget over a calendar window instead of its own.
    pub fn with_calendar(self, calendar: calendar::Calendar) -> Self {
        Self::calendar(self.limit, calendar).with_lockout(self.lockout)
    }

    pub fn gcra(limit: NonZeroU32, window: Duration) -> Self {
        Self::new(limit, window, Algorithm::Gcra)
    }

    /// Requests per window (at least 1).
    pub fn limit(&self) -> u32 {
        self.limit.get()
    }

    /// [`Quota::limit`], as the type that says so.
    pub fn nonzero_limit(&self) -> NonZeroU32 {
        self.limit
    }

    /// The same budget with another limit.
    pub fn with_limit(self, limit: NonZeroU32) -> Self {
        Self { limit, ..self }
    }

    /// The window in nanoseconds: at least 1, at most `u64::MAX`.
    pub fn window_ns(&self) -> Nanos {
        self.window.as_nanos().min(u64::MAX as u128) as Nanos
    }

    /// Time for one request's worth of budget to come back (GCRA's emission interval).
    pub fn emission_interval_ns(&self) -> Nanos {
        (self.window_ns() / u64::from(self.limit.get())).max(1)
    }
}

/// What a store keeps for one key, named by the algorithm that wrote it (16 bytes either way).
/// Either way the state stops mattering at [`State::expires_at`]: from then on, a missing key
/// decides the same. A state the other algorithm wrote (a limiter whose algorithm changed on
/// reload) counts as missing: the bucket starts again full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    /// GCRA: the theoretical arrival time of the next request.
    Gcra { tat: Nanos },
    /// Fixed window: the instant the window closes, and the hits counted in it.
    FixedWindow { ends_at: Nanos, count: u32 },
    /// A key locked out (a quota with a lockout refused it) until this instant: every request
    /// is refused until then, whichever algorithm the quota counts by; from then on the key is
    /// missing (a full bucket).
    Locked { until: Nanos },
}

/// The outcome of one limiter for one request, with everything the headers need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    pub allowed: bool,
    pub limit: u32,
    pub remaining: u32,
    /// Nanoseconds until the bucket is full again (the quota fully restored).
    pub reset_after_ns: Nanos,
    /// Nanoseconds until a refused request would be allowed; 0 when allowed.
    pub retry_after_ns: Nanos,
}

/// Decide one request. Returns the verdict and the state to store: `Some` when the
/// request was allowed (budget consumed) or when its refusal starts a lockout (a
/// [`State::Locked`], stored whether or not the request's other checks allowed), `None` when
/// nothing changes.
#[cfg(test)]
pub(crate) fn decide(quota: &Quota, state: Option<State>, now: Nanos) -> (Verdict, Option<State>) {
    decide_units(quota, state, now, NonZeroU32::MIN)
}

/// [`decide`] for a request that costs `units`: allowed only when all of them
/// fit, and then all of them are consumed; a refusal's `retry_after_ns` is the wait until they
/// all fit (for a fixed window, until it ends).
pub(crate) fn decide_units(
    quota: &Quota,
    state: Option<State>,
    now: Nanos,
    units: NonZeroU32,
) -> (Verdict, Option<State>) {
    let state = match state {
        Some(State::Locked { until }) if until > now => {
            let wait = until - now;
            let verdict = Verdict {
                allowed: false,
                limit: quota.limit(),
                remaining: 0,
                reset_after_ns: wait,
                retry_after_ns: wait,
            };
            return (verdict, None);
        }
        Some(State::Locked { .. }) => None,
        other => other,
    };
    let (verdict, new) = match quota.algorithm {
        Algorithm::Gcra => gcra::decide_units(quota, state, now, units),
        Algorithm::FixedWindow => fixed_window::decide_units(quota, state, now, units),
    };
    match quota.lockout_ns() {
        // The first refusal locks the key: the wait is the whole lockout.
        Some(lockout) if !verdict.allowed => (
            Verdict {
                reset_after_ns: lockout,
                retry_after_ns: lockout,
                ..verdict
            },
            Some(State::Locked {
                until: now.saturating_add(lockout),
            }),
        ),
        _ => (verdict, new),
    }
}

/// Whether a state `decide` returned is a lock, which a store keeps even when the request
/// was refused (a consumption it keeps only when the request was allowed).
pub(crate) fn is_lock(state: &State) -> bool {
    matches!(state, State::Locked { .. })
}

impl State {
    /// When this state stops mattering: from this instant on, a missing key decides the same.
    pub(crate) fn expires_at(&self) -> Nanos {
        match *self {
            State::Gcra { tat } => tat,
            State::FixedWindow { ends_at, .. } => ends_at,
            State::Locked { until } => until,
        }
    }
}

/// The state after giving back `units` that an allowed request consumed, when a later request
/// may have built on its write: GCRA moves the arrival time back by `units` emission intervals;
/// a fixed window counts them back (never below zero). The Redis store's `refund.lua` does the
/// same on its stored form.
pub(crate) fn give_back(quota: &Quota, state: State, units: NonZeroU32) -> State {
    let units = units.get();
    match state {
        State::Gcra { tat } => State::Gcra {
            tat: tat.saturating_sub(
                quota
                    .emission_interval_ns()
                    .saturating_mul(u64::from(units)),
            ),
        },
        State::FixedWindow { ends_at, count } => State::FixedWindow {
            ends_at,
            count: count.saturating_sub(units),
        },
        // A lock is not a charge: nothing to give back.
        State::Locked { .. } => state,
    }
}

/// The state after giving back an admitted request whose answer says it should not have
/// counted (`count = "failed"` or `"succeeded"`). `outstanding_ns` is what was left of the
/// decision's `reset_after_ns` when the answer came (`reset_after_ns` minus the time since):
/// the part of the request's charge the bucket still carries. `None` when nothing changes.
///
/// GCRA moves the arrival time back by `units` emission intervals, but never by more than is
/// still outstanding, so a request whose charge has already refilled gives nothing back twice. A
/// fixed window counts the units back only in the window that counted them (its end within half
/// a window of where the decision put it); a window that has closed since gives nothing back.
/// The Redis store's `refund.lua` does the same.
pub(crate) fn give_back_answered(
    quota: &Quota,
    state: State,
    units: NonZeroU32,
    outstanding_ns: Nanos,
    now: Nanos,
) -> Option<State> {
    if outstanding_ns == 0 {
        return None;
    }
    match state {
        State::Gcra { tat } if tat > now => {
            let back = quota
                .emission_interval_ns()
                .saturating_mul(u64::from(units.get()))
                .min(outstanding_ns);
            Some(State::Gcra {
                tat: tat.saturating_sub(back).max(now),
            })
        }
        State::Gcra { .. } => None,
        State::FixedWindow { ends_at, count } => {
            let expected = now.saturating_add(outstanding_ns);
            let same_window = ends_at > now && ends_at.abs_diff(expected) < quota.window_ns() / 2;
            (same_window && count > 0).then(|| give_back(quota, state, units))
        }
        State::Locked { .. } => None,
    }
}

/// What an allowed verdict reports when its request was refused by another limiter, so that
/// nothing was consumed: one more remaining and, for GCRA, one emission interval less to wait
/// until the bucket is full.
#[cfg(test)]
pub(crate) fn unconsumed(quota: &Quota, v: Verdict) -> Verdict {
    unconsumed_units(quota, v, NonZeroU32::MIN)
}

/// [`unconsumed`] for a check that would have consumed `units`.
pub(crate) fn unconsumed_units(quota: &Quota, v: Verdict, units: NonZeroU32) -> Verdict {
    if !v.allowed {
        return v;
    }
    let units = units.get();
    let remaining = v.remaining.saturating_add(units).min(v.limit);
    let reset_after_ns = match quota.algorithm {
        Algorithm::Gcra => v.reset_after_ns.saturating_sub(
            quota
                .emission_interval_ns()
                .saturating_mul(u64::from(units)),
        ),
        // A window with nothing counted in it was never opened.
        Algorithm::FixedWindow if remaining == v.limit => 0,
        Algorithm::FixedWindow => v.reset_after_ns,
    };
    Verdict {
        remaining,
        reset_after_ns,
        ..v
    }
}

/// Nanoseconds until additional quota is made available: the `t` of the `RateLimit` header
/// (draft-ietf-httpapi-ratelimit-headers-10, section 4.1.2), read from the same verdict that
/// decided. GCRA: until the remaining count next goes up by one (the next request's worth, at
/// most one emission interval away). Fixed window: until the window ends. On a refusal, the
/// refused request's wait (`retry_after_ns`). `None` when the quota is whole: no additional
/// quota can come.
pub(crate) fn more_quota_after_ns(quota: &Quota, v: &Verdict) -> Option<Nanos> {
    if !v.allowed {
        return Some(v.retry_after_ns);
    }
    if v.reset_after_ns == 0 || v.remaining >= v.limit {
        return None;
    }
    match quota.algorithm {
        Algorithm::Gcra => {
            // `remaining` is the whole emission intervals in the slack (burst - reset_after); the
            // next one is complete when the partial one is.
            let t = quota.emission_interval_ns();
            let burst = t.saturating_mul(u64::from(quota.limit()));
            let slack = burst.saturating_sub(v.reset_after_ns);
            Some(t - slack % t)
        }
        Algorithm::FixedWindow => Some(v.reset_after_ns),
    }
}

/// [`more_quota_after_ns`] in whole seconds, rounded up, and never 0 on a refusal (the same
/// figure `Retry-After` gives for that limiter).
pub(crate) fn more_quota_after_secs(quota: &Quota, v: &Verdict) -> Option<u64> {
    let secs = ceil_secs(more_quota_after_ns(quota, v)?);
    Some(if v.allowed { secs } else { secs.max(1) })
}

/// Whole seconds, rounded up: how headers speak of a wait. Never 0 for a positive wait.
pub(crate) fn ceil_secs(ns: Nanos) -> u64 {
    ns.div_ceil(1_000_000_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    use proptest::prelude::*;

    fn quota() -> impl Strategy<Value = Quota> {
        (
            1u32..=2_000,
            1u64..=7_200,
            prop_oneof![Just(Algorithm::Gcra), Just(Algorithm::FixedWindow)],
        )
            .prop_map(|(limit, secs, alg)| {
                Quota::new(nonzero(limit), Duration::from_secs(secs), alg)
            })
    }

    #[test]
    fn an_answered_give_back_restores_the_budget_it_took() {
        for alg in [Algorithm::Gcra, Algorithm::FixedWindow] {
            let q = Quota::new(nonzero(3), Duration::from_secs(60), alg);
            let mut st = None;
            // Ten requests whose answers are all given back 100 ms later: all allowed.
            for i in 0..10 {
                let now = i * S;
                let (v, new) = decide(&q, st, now);
                assert!(v.allowed, "{alg:?} request {i}");
                let later = now + S / 10;
                st = new.and_then(|s| {
                    give_back_answered(&q, s, NonZeroU32::MIN, v.reset_after_ns - S / 10, later)
                        .or(Some(s))
                });
            }
            // Three kept, then the fourth is refused.
            for i in 0..3 {
                let (v, new) = decide(&q, st, 20 * S + i);
                assert!(v.allowed, "{alg:?} kept {i}");
                st = new;
            }
            assert!(!decide(&q, st, 20 * S + 5).0.allowed, "{alg:?}");
        }
    }

    #[test]
    fn a_charge_already_refilled_or_a_closed_window_gives_nothing_back() {
        let g = Quota::new(nonzero(3), Duration::from_secs(60), Algorithm::Gcra);
        // Admitted at 0 (reset 20 s); answered 30 s later: the charge has refilled.
        let (v, s) = decide(&g, None, 0);
        let s = s.unwrap();
        assert_eq!(
            give_back_answered(
                &g,
                s,
                NonZeroU32::MIN,
                v.reset_after_ns.saturating_sub(30 * S),
                30 * S
            ),
            None
        );
        // Others used the bucket meanwhile: only what is left of this charge comes back.
        let busy = State::Gcra { tat: 50 * S };
        assert_eq!(
            give_back_answered(&g, busy, NonZeroU32::MIN, 5 * S, 15 * S),
            Some(State::Gcra { tat: 45 * S })
        );
        let f = Quota::new(nonzero(3), Duration::from_secs(60), Algorithm::FixedWindow);
        // The window that counted the request closed; a new one (ends at 130 s) does not pay.
        let next = State::FixedWindow {
            ends_at: 130 * S,
            count: 2,
        };
        assert_eq!(
            give_back_answered(&f, next, NonZeroU32::MIN, 0, 70 * S),
            None
        );
        assert_eq!(
            give_back_answered(&f, next, NonZeroU32::MIN, 1, 70 * S),
            None,
            "a window away"
        );
        assert_eq!(
            give_back_answered(&f, next, NonZeroU32::MIN, 60 * S, 70 * S),
            Some(State::FixedWindow {
                ends_at: 130 * S,
                count: 1
            })
        );
        let empty = State::FixedWindow {
            ends_at: 130 * S,
            count: 0,
        };
        assert_eq!(
            give_back_answered(&f, empty, NonZeroU32::MIN, 60 * S, 70 * S),
            None
        );
    }

    /// A bucket after `hits` requests at the given offsets (in ms) from 0.
    fn run(q: &Quota, hits: &[u64]) -> (Option<State>, Nanos) {
        let mut st = None;
        let mut now = 0;
        for dt in hits {
            now += dt * 1_000_000;
            if let (_, Some(s)) = decide(q, st, now) {
                st = Some(s);
            }
        }
        (st, now)
    }

    proptest! {
        #[test]
        fn remaining_never_exceeds_the_limit_and_waits_are_honest(
            q in quota(),
            hits in proptest::collection::vec(0u64..5_000, 0..300),
            dt in 0u64..10_000,
        ) {
            let (st, now) = run(&q, &hits);
            let now = now + dt * 1_000_000;
            let (v, new) = decide(&q, st, now);
            prop_assert!(v.remaining <= v.limit);
            prop_assert_eq!(v.limit, q.limit());
            prop_assert!(v.reset_after_ns <= q.window_ns().max(q.emission_interval_ns()) * 2);
            if v.allowed {
                prop_assert_eq!(v.retry_after_ns, 0);
                prop_assert!(new.is_some(), "an allowed request consumes");
            } else {
                prop_assert!(v.retry_after_ns > 0, "a refusal always has a wait");
                prop_assert_eq!(v.remaining, 0);
                // Waiting exactly the refusal's wait is enough.
                let (later, _) = decide(&q, st, now + v.retry_after_ns);
                prop_assert!(later.allowed);
            }
        }

        #[test]
        fn a_refusal_leaves_the_state_unchanged(
            q in quota(),
            hits in proptest::collection::vec(0u64..50, 0..300),
        ) {
            let (st, now) = run(&q, &hits);
            let (v, new) = decide(&q, st, now);
            if !v.allowed {
                prop_assert_eq!(new, None);
            }
        }

        #[test]
        fn giving_back_undoes_an_allow(
            q in quota(),
            hits in proptest::collection::vec(0u64..2_000, 0..200),
            later in 0u64..20_000,
        ) {
            let (before, now) = run(&q, &hits);
            let (v, after) = decide(&q, before, now);
            prop_assume!(v.allowed);
            let after = after.expect("an allowed request writes a state");
            let back = give_back(&q, after, NonZeroU32::MIN);
            // From now on the given-back bucket decides exactly as if the request never came.
            let t = now + later * 1_000_000;
            let (a, _) = decide(&q, Some(back), t);
            let (b, _) = decide(&q, before, t);
            prop_assert_eq!((a.allowed, a.remaining), (b.allowed, b.remaining));
            if q.algorithm == Algorithm::Gcra {
                prop_assert_eq!(a, b);
            }
        }
    }

    /// A bucket after requests at the given offsets (in ms) from 0, each of the given cost.
    fn run_costly(q: &Quota, hits: &[(u64, u32)]) -> (Option<State>, Nanos) {
        let mut st = None;
        let mut now = 0;
        for &(dt, units) in hits {
            now += dt * 1_000_000;
            let units = NonZeroU32::new(units.min(q.limit())).unwrap_or(NonZeroU32::MIN);
            if let (_, Some(s)) = decide_units(q, st, now, units) {
                st = Some(s);
            }
        }
        (st, now)
    }

    /// Units the bucket holds at `now`: what a one-unit request would leave, plus itself.
    fn capacity(q: &Quota, st: Option<State>, now: Nanos) -> u32 {
        let (v, _) = decide(q, st, now);
        if v.allowed {
            v.remaining + 1
        } else {
            0
        }
    }

    /// An allowed request of a cost the bucket holds (`pick` of what it holds), after `hits`.
    struct CostlyAllow {
        before: Option<State>,
        now: Nanos,
        units: NonZeroU32,
        verdict: Verdict,
        after: State,
    }

    fn costly_allow(q: &Quota, hits: &[(u64, u32)], pick: f64) -> Option<CostlyAllow> {
        let (before, now) = run_costly(q, hits);
        let held = capacity(q, before, now);
        let units = NonZeroU32::new(1 + (held.checked_sub(1)? as f64 * pick) as u32)?;
        let (verdict, after) = decide_units(q, before, now, units);
        Some(CostlyAllow {
            before,
            now,
            units,
            verdict,
            after: after?,
        })
    }

    /// A quota and a history of costly requests, each cost up to the quota's limit.
    fn costly() -> impl Strategy<Value = (Quota, Vec<(u64, u32)>, u32)> {
        quota().prop_flat_map(|q| {
            let l = q.limit();
            (
                Just(q),
                proptest::collection::vec((0u64..3_000, 1..=l), 0..200),
                1..=l,
            )
        })
    }

    proptest! {
        #[test]
        fn a_costly_request_is_all_or_nothing((q, hits, units) in costly(), dt in 0u64..10_000) {
            let (st, now) = run_costly(&q, &hits);
            let now = now + dt * 1_000_000;
            let held = capacity(&q, st, now);
            let u = NonZeroU32::new(units).expect("a cost is at least 1");
            let (v, new) = decide_units(&q, st, now, u);
            // Allowed exactly when every unit fits, and then every unit is taken.
            prop_assert_eq!(v.allowed, units <= held, "held {}, cost {}", held, units);
            if v.allowed {
                prop_assert_eq!(v.remaining, held - units);
                prop_assert!(new.is_some());
                // Nothing consumed (another limiter refused): the bucket as it was.
                let unused = unconsumed_units(&q, v, u);
                prop_assert_eq!(unused.remaining, held);
            } else {
                prop_assert_eq!(new, None, "a refusal charges nothing");
                prop_assert!(v.retry_after_ns > 0);
                // Waiting the refusal's own wait is enough for the same cost.
                let (later, _) = decide_units(&q, st, now + v.retry_after_ns, u);
                prop_assert!(later.allowed, "still refused after Retry-After");
            }
        }

        #[test]
        fn giving_back_a_costly_allow_undoes_it(
            (q, hits, _) in costly(),
            pick in 0.0f64..1.0,
            later in 0u64..20_000,
        ) {
            let allowed = costly_allow(&q, &hits, pick);
            prop_assume!(allowed.is_some(), "the bucket is empty: nothing to give back");
            let CostlyAllow { before, now, units: u, verdict: v, after } =
                allowed.expect("assumed");
            let t = now + later * 1_000_000;
            let back = give_back(&q, after, u);
            prop_assert_eq!(capacity(&q, Some(back), t), capacity(&q, before, t));
            // Given back while the whole charge is outstanding: the same.
            if let Some(answered) = give_back_answered(&q, after, u, v.reset_after_ns, now) {
                prop_assert_eq!(capacity(&q, Some(answered), t), capacity(&q, before, t));
            } else {
                prop_assert_eq!(v.reset_after_ns, 0, "nothing outstanding, nothing to give");
            }
        }

        #[test]
        fn an_answered_give_back_never_gives_more_than_was_taken(
            (q, hits, _) in costly(),
            pick in 0.0f64..1.0,
            taken_ago in 0u64..20_000,
            later in 0u64..20_000,
        ) {
            let allowed = costly_allow(&q, &hits, pick);
            prop_assume!(allowed.is_some(), "the bucket is empty: nothing to give back");
            let CostlyAllow { before, now, units: u, verdict: v, after } =
                allowed.expect("assumed");
            // The answer comes `taken_ago` ms after the decision.
            let answered_at = now + taken_ago * 1_000_000;
            let outstanding = v.reset_after_ns.saturating_sub(taken_ago * 1_000_000);
            let t = answered_at + later * 1_000_000;
            let back = give_back_answered(&q, after, u, outstanding, answered_at).unwrap_or(after);
            // Never more room than if the request had not come at all, never less than if it
            // had stayed charged.
            prop_assert!(capacity(&q, Some(back), t) <= capacity(&q, before, t));
            prop_assert!(capacity(&q, Some(back), t) >= capacity(&q, Some(after), t));
        }
    }

    #[test]
    #[should_panic(expected = "a window is longer than zero")]
    fn a_zero_window_is_a_bug_not_a_budget() {
        let _ = Quota::gcra(nonzero(1), Duration::ZERO);
    }

    #[test]
    fn a_quota_keeps_its_window_whatever_it_is_given_next() {
        let q = Quota::gcra(nonzero(30), Duration::from_secs(60));
        assert_eq!(q.window_ns(), 60_000_000_000);
        let wider = q.with_window(Duration::from_secs(120));
        assert_eq!(
            (wider.limit(), wider.window()),
            (30, Duration::from_secs(120))
        );
        assert_eq!(wider.emission_interval_ns(), 4_000_000_000);
    }

    #[test]
    fn a_lockout_refuses_for_its_whole_length_then_starts_afresh() {
        for alg in [Algorithm::Gcra, Algorithm::FixedWindow] {
            let q = Quota::new(nonzero(5), Duration::from_secs(600), alg)
                .with_lockout(Some(Duration::from_secs(600)));
            let mut st = None;
            for i in 0..5 {
                let (v, new) = decide(&q, st, i * S);
                assert!(v.allowed, "{alg:?} {i}");
                st = new;
            }
            // The sixth is refused and locks the key: the wait is the whole lockout.
            let (sixth, locked) = decide(&q, st, 5 * S);
            assert!(!sixth.allowed);
            assert_eq!((sixth.retry_after_ns, sixth.remaining), (600 * S, 0));
            assert_eq!(locked, Some(State::Locked { until: 605 * S }));
            assert!(locked.as_ref().is_some_and(is_lock));
            // No trickle: a GCRA bucket would have a request back after 120 s; the lock
            // refuses, counting down, and a refusal while locked does not extend it.
            for t in [6, 130, 300, 604] {
                let (v, again) = decide(&q, locked, t * S + S / 2);
                assert!(!v.allowed, "{alg:?} at {t}");
                assert_eq!(v.retry_after_ns, (605 - t) * S - S / 2);
                assert_eq!(ceil_secs(v.retry_after_ns), 605 - t);
                assert_eq!(again, None, "{alg:?}: the lock is not renewed");
            }
            // From its end the key starts again with a full bucket.
            let (v, _) = decide(&q, locked, 605 * S);
            assert!(v.allowed);
            assert_eq!(v.remaining, 4);
            // A lock holds nothing to give back.
            let lock = State::Locked { until: 605 * S };
            assert_eq!(give_back(&q, lock, NonZeroU32::MIN), lock);
            assert_eq!(
                give_back_answered(&q, lock, NonZeroU32::MIN, 100 * S, 10 * S),
                None
            );
            assert_eq!(lock.expires_at(), 605 * S);
        }
        // A zero lockout is none.
        let q = Quota::gcra(nonzero(1), Duration::from_secs(60)).with_lockout(Some(Duration::ZERO));
        assert_eq!(q.lockout(), None);
        let (_, st) = decide(&q, None, 0);
        assert_eq!(decide(&q, st, 0).1, None, "no lock without a lockout");
    }

    proptest! {
        #[test]
        fn a_lock_refuses_until_it_ends(
            q in quota(),
            lockout_s in 1u64..86_400,
            hits in proptest::collection::vec(0u64..5_000, 0..100),
        ) {
            let q = q.with_lockout(Some(Duration::from_secs(lockout_s)));
            let (mut st, mut now) = (None, 0);
            let mut locked_at = None;
            for dt in hits {
                now += dt * 1_000_000;
                let (v, new) = decide(&q, st, now);
                if let Some(until) = locked_at {
                    if now < until {
                        prop_assert!(!v.allowed);
                        prop_assert_eq!(v.retry_after_ns, until - now);
                    }
                }
                if let Some(State::Locked { until }) = new {
                    prop_assert!(!v.allowed);
                    prop_assert_eq!(until, now + lockout_s * S);
                    locked_at = Some(until);
                }
                if new.is_some() {
                    st = new;
                }
            }
        }
    }

    #[test]
    fn a_state_is_two_words() {
        assert_eq!(std::mem::size_of::<State>(), 16);
    }

    const S: u64 = 1_000_000_000;

    #[test]
    fn more_quota_comes_with_the_next_unit_not_the_whole_bucket() {
        // 30 a minute: one every 2 s.
        let q = Quota::gcra(nonzero(30), Duration::from_secs(60));
        let mut st = None;
        let mut last = None;
        for _ in 0..30 {
            let (v, s) = decide(&q, st, 100 * S);
            st = s;
            last = Some(v);
        }
        let spent = last.unwrap();
        assert_eq!((spent.remaining, spent.reset_after_ns), (0, 60 * S));
        assert_eq!(more_quota_after_ns(&q, &spent), Some(2 * S));
        // Refused half a unit later: t is the refusal's own wait.
        let (refused, _) = decide(&q, st, 100 * S + S / 2);
        assert!(!refused.allowed);
        assert_eq!(
            more_quota_after_ns(&q, &refused),
            Some(refused.retry_after_ns)
        );
        assert_eq!(more_quota_after_secs(&q, &refused), Some(2));
        // A partial unit pending: t is what is left of it.
        let (v, _) = decide(
            &q,
            Some(State::Gcra {
                tat: 100 * S + S / 2,
            }),
            100 * S,
        );
        assert_eq!(v.remaining, 28);
        assert_eq!(more_quota_after_ns(&q, &v), Some(S / 2));
        // A whole quota (an uncharged fresh bucket): nothing more can come.
        let (fresh, _) = decide(&q, None, 0);
        assert_eq!(more_quota_after_ns(&q, &unconsumed(&q, fresh)), None);
        // Fixed window: the window's end.
        let fw = Quota::new(nonzero(5), Duration::from_secs(900), Algorithm::FixedWindow);
        let (v, _) = decide(&fw, None, 0);
        assert_eq!(more_quota_after_ns(&fw, &v), Some(900 * S));
        assert_eq!(more_quota_after_ns(&fw, &unconsumed(&fw, v)), None);
        let (v, _) = decide(
            &fw,
            Some(State::FixedWindow {
                ends_at: 900 * S,
                count: 5,
            }),
            100 * S,
        );
        assert!(!v.allowed);
        assert_eq!(more_quota_after_secs(&fw, &v), Some(800));
    }

    #[test]
    fn unconsumed_is_the_state_before_the_request() {
        let q = Quota::gcra(nonzero(30), Duration::from_secs(60));
        let before = State::Gcra {
            tat: 10_000_000_000,
        };
        let now = 5_000_000_000;
        let (consumed, _) = decide(&q, Some(before), now);
        let (peek_as_if_one_less, _) = decide(&q, None, now);
        let back = unconsumed(&q, consumed);
        assert_eq!(back.remaining, consumed.remaining + 1);
        assert_eq!(
            back.reset_after_ns, 5_000_000_000,
            "the stored TAT minus now"
        );
        // A fresh bucket that was not charged is simply full.
        let fresh = unconsumed(&q, peek_as_if_one_less);
        assert_eq!((fresh.remaining, fresh.reset_after_ns), (30, 0));
        let fw = Quota::new(nonzero(5), Duration::from_secs(60), Algorithm::FixedWindow);
        let (v, _) = decide(&fw, None, 0);
        assert_eq!(unconsumed(&fw, v).remaining, 5);
        assert_eq!(unconsumed(&fw, v).reset_after_ns, 0);
        let (v2, _) = decide(
            &fw,
            Some(State::FixedWindow {
                ends_at: 60_000_000_000,
                count: 1,
            }),
            0,
        );
        assert_eq!(
            (
                unconsumed(&fw, v2).remaining,
                unconsumed(&fw, v2).reset_after_ns
            ),
            (4, 60_000_000_000)
        );
    }
}
