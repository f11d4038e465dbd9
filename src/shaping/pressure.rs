//! The upstream's pressure, per instance: is it missing its target (`[shaping.upstream]`), and
//! what follows from it: how far poll intervals stretch and which priorities are shed.
//!
//! The signal is the larger of two readings: a moving average of how long the upstream took to
//! send each answer's head, and how long the oldest request still waiting for its head has
//! waited (which sees a stall begin before any slow answer completes). The share of 5xx answers
//! is watched beside it. Every [`TICK`] the controller, like Envoy's adaptive concurrency, moves
//! by a gradient:
//! - the stretch factor is multiplied by `(signal / target)^¼`, the ratio held to ½..2, so it
//!   grows smoothly while the target is missed and shrinks back (to 1) once it is met;
//! - the shed level rises by one each tick the target is missed (priority `low` first, then
//!   `normal`, then `high`; `critical` never), and falls by one for every `recover` the upstream
//!   spends under its target.
//!
//! Readers take two atomics; the bookkeeping is one short lock per request start and finish,
//! paid only when `[shaping.upstream]` is set. Nothing sleeps. The clock is the decider's, so
//! the controller runs in virtual time in tests and the simulator.

use crate::clock::Nanos;
use crate::config::shaping::{Priority, UpstreamTarget};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;

/// How often the controller moves.
pub(crate) const TICK: Nanos = 100_000_000;
/// The most an interval stretches by pressure (a route's `max_interval` bounds it first).
pub(crate) const MAX_STRETCH: f64 = 16.0;
/// The highest shed level: every priority below `critical`.
pub(crate) const MAX_SHED: u8 = Priority::Critical as u8;
/// The weight of each new answer in the latency average.
const ALPHA: f64 = 0.2;
/// Without a new answer, the latency average halves every second (an upstream nobody asks is
/// no longer slow).
const HALF_LIFE: f64 = 1e9;
/// The most ticks one catch-up moves by.
const MAX_TICKS: u64 = 600;

/// What [`Pressure`] reads, taken from the settings in force at each call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Rules {
    pub target: Nanos,
    pub errors: f64,
    pub recover: Nanos,
}

impl From<&UpstreamTarget> for Rules {
    fn from(t: &UpstreamTarget) -> Self {
        Self {
            target: u64::try_from(t.latency_target.as_nanos())
                .unwrap_or(u64::MAX)
                .max(1),
            errors: f64::from(t.errors_percent) / 100.0,
            recover: u64::try_from(t.recover.as_nanos())
                .unwrap_or(u64::MAX)
                .max(1),
        }
    }
}

/// A reading of the controller, for metrics and reports.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Reading {
    /// The signal at the last tick (ns).
    pub signal: Nanos,
    pub stretch: f64,
    pub shed: u8,
    pub missed: bool,
}

#[derive(Debug)]
struct State {
    /// Requests waiting for their answer's head: id → when they were sent.
    waiting: BTreeMap<u64, Nanos>,
    next_id: u64,
    /// The average time to an answer's head (ns) and share of 5xx answers.
    latency: f64,
    errors: f64,
    /// When the last answer came.
    last_answer: Nanos,
    last_tick: Nanos,
    stretch: f64,
    shed: u8,
    /// When the shed level last moved, or the upstream went back under its target.
    since: Nanos,
    signal: Nanos,
    missed: bool,
}

/// The controller. One per gateway (it survives reloads; its rules are read at each call).
#[derive(Debug)]
pub(crate) struct Pressure {
    state: Mutex<State>,
    /// The stretch factor in thousandths, and the shed level, as the last tick left them.
    stretch_milli: AtomicU32,
    shed: AtomicU8,
    /// The time of the next tick: whoever passes it first moves the controller.
    next_tick: AtomicU64,
}

impl Default for Pressure {
    fn default() -> Self {
        Self::new()
    }
}

/// One request waiting for its answer's head; dropped without [`Pressure::answered`] (the
/// client went away), it leaves the waiting list with nothing measured.
#[derive(Debug)]
pub(crate) struct Waiting<'a> {
    pressure: &'a Pressure,
    id: u64,
    done: bool,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if !self.done {
            if let Ok(mut s) = self.pressure.state.lock() {
                s.waiting.remove(&self.id);
            }
        }
    }
}

impl Pressure {
    pub(crate) fn new() -> Self {
        Self {
            state: Mutex::new(State {
                waiting: BTreeMap::new(),
                next_id: 0,
                latency: 0.0,
                errors: 0.0,
                last_answer: 0,
                last_tick: 0,
                stretch: 1.0,
                shed: 0,
                since: 0,
                signal: 0,
                missed: false,
            }),
            stretch_milli: AtomicU32::new(1000),
            shed: AtomicU8::new(0),
            next_tick: AtomicU64::new(0),
        }
    }

    /// How far poll intervals stretch now (1: not at all).
    pub(crate) fn stretch(&self) -> f64 {
        f64::from(self.stretch_milli.load(Ordering::Relaxed)) / 1000.0
    }

    /// The shed level now: every priority whose rank is below it is shed.
    pub(crate) fn shed_level(&self) -> u8 {
        self.shed.load(Ordering::Relaxed)
    }

    /// Whether a request of `priority` is shed at `now`; if so, the whole seconds (at least 1)
    /// before the level could fall below it: one `recover` per level above it.
    pub(crate) fn shed(&self, priority: Priority, now: Nanos, rules: &Rules) -> Option<u64> {
        self.maybe_tick(now, rules);
        let level = self.shed_level();
        let rank = priority.rank();
        (rank < level).then(|| {
            let ns = u64::from(level - rank).saturating_mul(rules.recover);
            crate::limiter::wait_secs(ns)
        })
    }

    /// A request sent to the upstream at `now`.
    pub(crate) fn sent(&self, now: Nanos, rules: &Rules) -> Waiting<'_> {
        self.maybe_tick(now, rules);
        let id = match self.state.lock() {
            Ok(mut s) => {
                let id = s.next_id;
                s.next_id += 1;
                s.waiting.insert(id, now);
                id
            }
            Err(_) => u64::MAX,
        };
        Waiting {
            pressure: self,
            id,
            done: false,
        }
    }

    /// `w`'s answer head came at `now` with `status`.
    pub(crate) fn answered(&self, mut w: Waiting<'_>, now: Nanos, status: u16, rules: &Rules) {
        w.done = true;
        if let Ok(mut s) = self.state.lock() {
            if let Some(at) = s.waiting.remove(&w.id) {
                let took = now.saturating_sub(at) as f64;
                s.latency += ALPHA * (took - s.latency);
                let err = if status >= 500 { 1.0 } else { 0.0 };
                s.errors += ALPHA * (err - s.errors);
                s.last_answer = now;
            }
        }
        self.maybe_tick(now, rules);
    }

    /// How long the upstream takes to answer on average, in whole seconds (at least 1): the
    /// wait said to a request turned away at an in-flight cap, whose place comes free when
    /// one of its address's requests is answered.
    pub(crate) fn typical_wait_secs(&self) -> u64 {
        let ns = self.state.lock().map_or(0, |s| s.latency as u64);
        crate::limiter::wait_secs(ns)
    }

    /// The controller as the last tick left it.
    pub(crate) fn reading(&self) -> Reading {
        match self.state.lock() {
            Ok(s) => Reading {
                signal: s.signal,
                stretch: s.stretch,
                shed: s.shed,
                missed: s.missed,
            },
            Err(_) => Reading {
                signal: 0,
                stretch: 1.0,
                shed: 0,
                missed: false,
            },
        }
    }

    /// Move the controller if a tick is due at `now` (one caller moves it; the others go on).
    pub(crate) fn maybe_tick(&self, now: Nanos, rules: &Rules) {
        let due = self.next_tick.load(Ordering::Relaxed);
        if now < due {
            return;
        }
        if self
            .next_tick
            .compare_exchange(due, now + TICK, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        let Ok(mut s) = self.state.lock() else {
            return;
        };
        s.tick(now, rules);
        let milli = (s.stretch * 1000.0)
            .round()
            .clamp(1000.0, MAX_STRETCH * 1000.0);
        self.stretch_milli.store(milli as u32, Ordering::Relaxed);
        self.shed.store(s.shed, Ordering::Relaxed);
    }
}

impl State {
    fn tick(&mut self, now: Nanos, rules: &Rules) {
        let ticks = if self.last_tick == 0 {
            1
        } else {
            (now.saturating_sub(self.last_tick) / TICK).clamp(1, MAX_TICKS)
        };
        self.last_tick = now;
        // An upstream nobody has heard from for a while is no longer known to be slow.
        let quiet = now.saturating_sub(self.last_answer) as f64;
        if quiet > TICK as f64 && self.last_answer > 0 {
            let fade = 0.5f64.powf((quiet - TICK as f64).min(60e9) / HALF_LIFE);
            self.latency *= fade;
            self.errors *= fade;
            self.last_answer = now.saturating_sub(TICK);
        }
        let oldest = self
            .waiting
            .first_key_value()
            .map_or(0, |(_, &at)| now.saturating_sub(at));
        let signal = (self.latency as u64).max(oldest);
        let slow = signal > rules.target;
        let failing = self.errors > rules.errors;
        let missed = slow || failing;
        let mut ratio = (signal as f64 / rules.target as f64).clamp(0.5, 2.0);
        if failing {
            ratio = ratio.max(1.5);
        }
        let mut step = ratio.powf(0.25);
        if !missed {
            // Back under target: always on the way down, however close to it.
            step = step.min(0.97);
        }
        self.stretch = (self.stretch * step.powi(ticks as i32)).clamp(1.0, MAX_STRETCH);
        if missed {
            self.shed = (self.shed + 1).min(MAX_SHED);
        } else {
            if self.missed {
                self.since = now;
            }
            let steps = now.saturating_sub(self.since) / rules.recover;
            if steps > 0 && self.shed > 0 {
                let down = u8::try_from(steps).unwrap_or(u8::MAX);
                self.shed = self.shed.saturating_sub(down);
                self.since += steps * rules.recover;
            }
        }
        self.missed = missed;
        self.signal = signal;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Nanos = 1_000_000;
    const S: Nanos = 1_000 * MS;

    fn rules() -> Rules {
        Rules {
            target: 250 * MS,
            errors: 0.5,
            recover: 5 * S,
        }
    }

    /// Requests every 20 ms, each answered after `took(t)`, from `from` to `to`; returns what
    /// was shed by priority (low, normal, high, critical) and the highest stretch seen.
    fn run(p: &Pressure, from: Nanos, to: Nanos, took: impl Fn(Nanos) -> Nanos) -> ([u32; 4], f64) {
        let r = rules();
        let mut shed = [0u32; 4];
        let mut most: f64 = 1.0;
        let mut waiting: Vec<(Nanos, Waiting<'_>)> = Vec::new();
        let mut t = from;
        while t < to {
            for prio in Priority::ALL {
                if p.shed(prio, t, &r).is_some() {
                    shed[prio.rank() as usize] += 1;
                }
            }
            waiting.push((t + took(t), p.sent(t, &r)));
            let (done, rest): (Vec<_>, Vec<_>) = waiting.into_iter().partition(|(at, _)| *at <= t);
            waiting = rest;
            for (at, w) in done {
                p.answered(w, at, 200, &r);
            }
            most = most.max(p.stretch());
            t += 20 * MS;
        }
        for (at, w) in waiting {
            p.answered(w, at, 200, &r);
        }
        (shed, most)
    }

    #[test]
    fn a_healthy_upstream_stretches_nothing_and_sheds_nothing() {
        let p = Pressure::new();
        let (shed, most) = run(&p, S, 60 * S, |_| 30 * MS);
        assert_eq!(shed, [0; 4]);
        assert!((most - 1.0).abs() < 1e-9, "{most}");
    }

    #[test]
    fn a_stall_sheds_the_lowest_first_within_half_a_second_and_never_critical() {
        let p = Pressure::new();
        let r = rules();
        run(&p, S, 10 * S, |_| 30 * MS);
        // From 10 s every answer takes a second.
        let stall = 10 * S;
        let mut t = stall;
        let mut waiting = Vec::new();
        let mut low_shed_at = None;
        while t < 20 * S {
            if low_shed_at.is_none() && p.shed(Priority::Low, t, &r).is_some() {
                low_shed_at = Some(t - stall);
            }
            // No higher priority is shed while a lower one is served.
            let served: Vec<bool> = Priority::ALL
                .iter()
                .map(|&pr| p.shed(pr, t, &r).is_none())
                .collect();
            for w in served.windows(2) {
                assert!(!w[0] || w[1], "at {t}: {served:?}");
            }
            assert!(served[3], "critical is never shed");
            waiting.push((t + S, p.sent(t, &r)));
            let (done, rest): (Vec<_>, Vec<_>) = waiting.into_iter().partition(|(at, _)| *at <= t);
            waiting = rest;
            for (at, w) in done {
                p.answered(w, at, 200, &r);
            }
            t += 20 * MS;
        }
        let at = low_shed_at.expect("low is shed during the stall");
        assert!(at <= 500 * MS, "low shed {} ms into the stall", at / MS);
        assert_eq!(p.shed_level(), MAX_SHED);
        let stretched = p.stretch();
        assert!(stretched > 2.0, "the interval stretches: {stretched}");
        // Recovery: answers in 30 ms again; every priority flows within 30 s and the stretch
        // returns to 1.
        for (at, w) in waiting {
            p.answered(w, at, 200, &r);
        }
        let mut t = 20 * S;
        let mut flowing = None;
        while t < 60 * S {
            let w = p.sent(t, &r);
            p.answered(w, t + 30 * MS, 200, &r);
            if flowing.is_none() && p.shed(Priority::Low, t, &r).is_none() {
                flowing = Some(t - 20 * S);
            }
            t += 50 * MS;
        }
        let flowing = flowing.expect("low flows again");
        assert!(
            flowing <= 30 * S,
            "low flows {} s after recovery",
            flowing / S
        );
        assert!((p.stretch() - 1.0).abs() < 1e-9, "{}", p.stretch());
    }

    #[test]
    fn a_failing_upstream_counts_as_missing_its_target() {
        let p = Pressure::new();
        let r = rules();
        let mut t = S;
        while t < 3 * S {
            let w = p.sent(t, &r);
            p.answered(w, t + MS, 503, &r);
            t += 10 * MS;
        }
        assert!(p.shed(Priority::Low, t, &r).is_some());
        assert!(p.reading().missed);
    }

    #[test]
    fn a_client_that_goes_away_leaves_nothing_waiting_and_the_quiet_fades() {
        let p = Pressure::new();
        let r = rules();
        let w = p.sent(S, &r);
        drop(w);
        p.maybe_tick(2 * S, &r);
        assert_eq!(p.reading().signal, 0);
        // A slow answer, then silence: the signal fades under the target.
        let w = p.sent(3 * S, &r);
        p.answered(w, 5 * S, 200, &r);
        p.maybe_tick(5 * S + TICK, &r);
        assert!(p.reading().missed);
        p.maybe_tick(12 * S, &r);
        assert!(!p.reading().missed, "{:?}", p.reading());
    }

    #[test]
    fn the_wait_said_to_a_shed_request_counts_the_levels_above_it() {
        let p = Pressure::new();
        let r = rules();
        let w = p.sent(S, &r);
        for k in 1..=5 {
            p.maybe_tick(S + k * TICK + 300 * MS, &r);
        }
        drop(w);
        assert_eq!(p.shed_level(), MAX_SHED);
        let t = S + 900 * MS;
        assert_eq!(p.shed(Priority::Low, t, &r), Some(15));
        assert_eq!(p.shed(Priority::High, t, &r), Some(5));
        assert_eq!(p.shed(Priority::Critical, t, &r), None);
    }
}
