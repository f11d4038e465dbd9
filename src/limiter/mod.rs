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
/// a fixed window counts them back (never below zero). The Redis store's refund script does the
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
/// The Redis store's refund script does the same.
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

/// A wait as `Retry-After` says it: whole seconds rounded up, and at least 1, since a refusal
/// that said 0 would invite the retry it refuses.
#[inline]
pub(crate) fn wait_secs(ns: Nanos) -> u64 {
    ceil_secs(ns).max(1)
}

#[cfg(test)]
mod tests;
