//! The upstream's pressure, per instance: is it missing its target (`[shaping.upstream]`), and
//! what follows from it: which stretch step poll intervals are at and which priorities are shed.
//!
//! **What is timed.** A request counts from the moment the upstream has the whole of it (its
//! head and its body handed on) to its answer's head: time spent waiting on a client that sends
//! its body slowly never counts, and an answer that came before the body was whole is no latency
//! sample (its status still counts). Routes slow by nature (`watched = false`) count not at all.
//!
//! **The signal is the callers', not one caller's.** Answers are kept per caller (its address
//! and agent id, as a digest) in half-second slices. Over the last [`LATENCY_WINDOW`], each
//! caller's latency is the mean of its answers, a request still waiting counting as one answer of
//! the time it has waited so far. The signal is the latency that at least [`MIN_CALLERS`]
//! callers, and at least half of all callers, reach: one slow caller, or a few slow requests from
//! one caller, move nothing, however slow. Errors are read the same way over the longer
//! [`ERROR_WINDOW`], so a pilot at one request a second is seen: the upstream is failing when at
//! least [`MIN_ERRORS`] answers were 5xx and at least [`MIN_CALLERS`] callers, more than
//! `errors_percent` of all callers, saw more than `errors_percent` of their answers fail.
//!
//! **The controller reads a sustained miss, not a blip.** Every [`EVAL`]:
//! - the shed level rises to 1 (`low`) once the target has been missed for 1 s without a break,
//!   to 2 (`normal`) at 3 s and to 3 (`high`) at 6 s; `critical` is never shed. It falls by one
//!   for every `recover` the target is met, counted in time: a quiet upstream recovers whether or
//!   not a request arrives;
//! - the stretch step rises by one once the target has been missed for [`STRETCH_AFTER`] while
//!   a fleet follows its slots (at least a quarter of the hinted callers come at them: a herd
//!   back from an outage asks off its slots and
//!   is spread by the slots themselves: stretching it would bunch it), and moves again (up while
//!   it is missed, down once it has been met for `recover`) only after the step has been held
//!   for `hold` (the longest shaped interval): a slot moves at most once per step, and
//!   instances that see the same step tell an agent the same slot.
//!
//! Readers take atomics; the bookkeeping is one short lock per request start and answer, paid
//! only when `[shaping.upstream]` is set. Memory is bounded: at most [`MAX_CALLERS`] callers per
//! slice (a flood of fresh callers beyond that is not counted) and one entry per request in
//! flight. Nothing sleeps. The clock is the decider's, so the controller runs in virtual time in
//! tests and the simulator.

use crate::clock::{Clock, Nanos};
use crate::config::shaping::{Priority, UpstreamTarget};
use std::collections::{HashMap, VecDeque};
use std::hash::Hasher;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

const MS: Nanos = 1_000_000;
const S: Nanos = 1_000 * MS;
/// How often the controller moves.
pub(crate) const EVAL: Nanos = 250 * MS;
/// One slice of answers.
const SLICE: Nanos = 500 * MS;
/// How far back latencies are read.
pub(crate) const LATENCY_WINDOW: Nanos = 2 * S;
/// How far back errors are read.
pub(crate) const ERROR_WINDOW: Nanos = 10 * S;
/// The fewest callers whose answers can make a miss.
pub(crate) const MIN_CALLERS: usize = 3;
/// The fewest 5xx answers that can make a miss.
pub(crate) const MIN_ERRORS: u32 = 5;
/// The most callers one slice keeps.
pub(crate) const MAX_CALLERS: usize = 2048;
/// How long a miss lasts before the first stretch step.
pub(crate) const STRETCH_AFTER: Nanos = 5 * S;
/// How far back the share of hinted callers that came at their slots is read.
const FOLLOW_WINDOW: Nanos = 10 * S;
/// The fewest hints that can say a fleet is not following its slots.
const MIN_HINTS: u32 = 20;
/// How long a miss must last, without a break, for each shed level (1: `low`, 2: `normal`,
/// 3: `high`).
const SHED_AFTER: [Nanos; 3] = [S, 3 * S, 6 * S];
/// The highest shed level: every priority below `critical`.
pub(crate) const MAX_SHED: u8 = Priority::Critical as u8;
/// The stretch steps' nominal factors (step 0: none); each route's period at a step is its own
/// ([`crate::shaping::slots::ladder`]).
pub(crate) const STEPS: [f64; 5] = [1.0, 1.5, 2.0, 3.0, 4.0];
/// The highest stretch step.
pub(crate) const MAX_STEP: u8 = (STEPS.len() - 1) as u8;
/// The weight of each new answer in the typical latency.
const ALPHA: f64 = 0.2;

/// What [`Pressure`] reads, taken from the settings in force at each call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Rules {
    pub target: Nanos,
    pub errors: f64,
    pub recover: Nanos,
    /// The least time a stretch step is held (the longest shaped interval).
    pub hold: Nanos,
    /// The highest step any route stretches to (steps past it would change no hint).
    pub max_step: u8,
}

impl Rules {
    /// `[shaping.upstream]`, each stretch step held for `hold` at least, up to `max_step`.
    pub(crate) fn new(t: &UpstreamTarget, hold: Nanos, max_step: u8) -> Self {
        Self {
            target: u64::try_from(t.latency_target.as_nanos())
                .unwrap_or(u64::MAX)
                .max(1),
            errors: f64::from(t.errors_percent) / 100.0,
            recover: u64::try_from(t.recover.as_nanos())
                .unwrap_or(u64::MAX)
                .max(1),
            hold: hold.max(S),
            max_step: max_step.min(MAX_STEP),
        }
    }
}

/// A reading of the controller, for metrics and reports.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Reading {
    /// The callers' latency at the last evaluation (ns).
    pub signal: Nanos,
    /// The stretch step's nominal factor.
    pub stretch: f64,
    pub step: u8,
    pub shed: u8,
    pub missed: bool,
}

/// One caller's answers in one slice.
#[derive(Debug, Default, Clone, Copy)]
struct Stat {
    /// Answers timed, and their total time.
    timed: u32,
    took: u64,
    /// Answers, and of them 5xx.
    answers: u32,
    errors: u32,
}

#[derive(Debug)]
struct Slice {
    index: u64,
    callers: HashMap<u64, Stat>,
}

#[derive(Debug)]
struct State {
    /// Requests the upstream has whole and has not answered: id → (caller, since when).
    waiting: HashMap<u64, (u64, Nanos)>,
    next_id: u64,
    slices: VecDeque<Slice>,
    /// The typical time to an answer's head (ns).
    typical: f64,
    last_eval: Nanos,
    /// Since when the target has been missed, or met, without a break.
    miss_since: Option<Nanos>,
    met_since: Option<Nanos>,
    /// From when the next step down of the shed level counts.
    down_from: Nanos,
    shed: u8,
    step: u8,
    step_since: Nanos,
    signal: Nanos,
    missed: bool,
    /// The rules of the last call, for a reading between requests.
    rules: Option<Rules>,
    /// Hints told per evaluation over [`FOLLOW_WINDOW`]: when, to callers at their slot, and
    /// to others.
    follows: VecDeque<(Nanos, u32, u32)>,
}

/// The controller. One per gateway (it survives reloads; its rules are read at each call).
pub(crate) struct Pressure {
    state: Mutex<State>,
    step: AtomicU8,
    shed: AtomicU8,
    /// Hints told since the last evaluation: to callers that came at their slot, and to others.
    on_slot: AtomicU32,
    off_slot: AtomicU32,
    /// The time of the next evaluation: whoever passes it first moves the controller.
    next_eval: AtomicU64,
    /// The decider's clock, for a reading between requests (metrics).
    clock: Option<Arc<dyn Clock>>,
}

impl std::fmt::Debug for Pressure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pressure")
            .field("step", &self.step)
            .field("shed", &self.shed)
            .finish_non_exhaustive()
    }
}

impl Default for Pressure {
    fn default() -> Self {
        Self::new()
    }
}

impl crate::metrics::ReadPressure for Pressure {
    fn snapshot(&self) -> crate::metrics::PressureSnapshot {
        let r = self.reading();
        crate::metrics::PressureSnapshot {
            signal_ns: r.signal,
            stretch: r.stretch,
            shed: r.shed,
            missed: r.missed,
        }
    }
}

/// One request the upstream has whole, waiting for its answer's head; dropped without
/// [`Pressure::answered`] (the client went away), it leaves the waiting list with nothing
/// measured.
#[derive(Debug)]
pub(crate) struct Waiting {
    pressure: Arc<Pressure>,
    id: u64,
    caller: u64,
    at: Nanos,
    done: bool,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if !self.done {
            if let Ok(mut s) = self.pressure.state.lock() {
                s.waiting.remove(&self.id);
            }
        }
    }
}

/// A caller as the signal counts it: a digest of its principal bytes (its address and agent
/// id, see [`crate::spread::principal_bytes`]).
pub(crate) fn caller_of(principal: &[u8]) -> u64 {
    let mut h = siphasher::sip::SipHasher13::new_with_keys(0x666c_6565_742d_6c69, 0x6d69_7465_7220);
    h.write(principal);
    h.finish()
}

impl Pressure {
    pub(crate) fn new() -> Self {
        Self {
            state: Mutex::new(State {
                waiting: HashMap::new(),
                next_id: 0,
                slices: VecDeque::new(),
                typical: 0.0,
                last_eval: 0,
                miss_since: None,
                met_since: None,
                down_from: 0,
                shed: 0,
                step: 0,
                step_since: 0,
                signal: 0,
                missed: false,
                rules: None,
                follows: VecDeque::new(),
            }),
            step: AtomicU8::new(0),
            shed: AtomicU8::new(0),
            on_slot: AtomicU32::new(0),
            off_slot: AtomicU32::new(0),
            next_eval: AtomicU64::new(0),
            clock: None,
        }
    }

    /// A controller that reads `clock` when asked for a reading between requests.
    pub(crate) fn with_clock(clock: Arc<dyn Clock>) -> Self {
        Self {
            clock: Some(clock),
            ..Self::new()
        }
    }

    /// The stretch step now (0: none).
    pub(crate) fn step(&self) -> u8 {
        self.step.load(Ordering::Relaxed)
    }

    /// The stretch step's nominal factor now (1: not at all).
    pub(crate) fn stretch(&self) -> f64 {
        STEPS[usize::from(self.step().min(MAX_STEP))]
    }

    /// The shed level now: every priority whose rank is below it is shed.
    pub(crate) fn shed_level(&self) -> u8 {
        self.shed.load(Ordering::Relaxed)
    }

    /// Whether a request of `priority` is shed at `now`; if so, the whole seconds (at least 1)
    /// before the level could fall below it: one `recover` per level above it.
    pub(crate) fn shed(&self, priority: Priority, now: Nanos, rules: &Rules) -> Option<u64> {
        self.maybe_eval(now, rules);
        let level = self.shed_level();
        let rank = priority.rank();
        (rank < level).then(|| {
            let ns = u64::from(level - rank).saturating_mul(rules.recover);
            crate::limiter::wait_secs(ns)
        })
    }

    /// A hint was told to a caller that came at its slot (`on_slot`), or to another (new, back
    /// from an outage, off its slot). The stretch rises only while a quarter come at their slots:
    /// a herd asking off its slots is spread by the slots themselves, and stretching it would
    /// bunch it.
    pub(crate) fn hinted(&self, on_slot: bool) {
        let c = if on_slot {
            &self.on_slot
        } else {
            &self.off_slot
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// The upstream has the whole of a request of `caller` at `now`: its wait for the answer's
    /// head begins.
    pub(crate) fn sent(self: &Arc<Self>, now: Nanos, caller: u64, rules: &Rules) -> Waiting {
        self.maybe_eval(now, rules);
        let id = match self.state.lock() {
            Ok(mut s) => {
                let id = s.next_id;
                s.next_id = s.next_id.wrapping_add(1);
                s.waiting.insert(id, (caller, now));
                id
            }
            Err(_) => u64::MAX,
        };
        Waiting {
            pressure: self.clone(),
            id,
            caller,
            at: now,
            done: false,
        }
    }

    /// `w`'s answer head came at `now` with `status`.
    pub(crate) fn answered(&self, mut w: Waiting, now: Nanos, status: u16, rules: &Rules) {
        w.done = true;
        if let Ok(mut s) = self.state.lock() {
            s.waiting.remove(&w.id);
            let took = now.saturating_sub(w.at);
            s.typical += ALPHA * (took as f64 - s.typical);
            s.record(now, w.caller, Some(took), status);
        }
        self.maybe_eval(now, rules);
    }

    /// An answer with `status` to a request of `caller` that came at `now` before the upstream
    /// had the whole request: its status counts, its time does not.
    pub(crate) fn answered_early(&self, now: Nanos, caller: u64, status: u16, rules: &Rules) {
        if let Ok(mut s) = self.state.lock() {
            s.record(now, caller, None, status);
        }
        self.maybe_eval(now, rules);
    }

    /// How long the upstream takes to answer on average, in whole seconds (at least 1): the
    /// wait said to a request turned away at an in-flight cap, whose place comes free when
    /// one of its address's requests is answered.
    pub(crate) fn typical_wait_secs(&self) -> u64 {
        let ns = self.state.lock().map_or(0, |s| s.typical as u64);
        crate::limiter::wait_secs(ns)
    }

    /// The controller now: evaluated at the clock's time when it has one and has seen rules,
    /// else as the last evaluation left it.
    pub(crate) fn reading(&self) -> Reading {
        if let Some(clock) = &self.clock {
            let rules = self.state.lock().ok().and_then(|s| s.rules);
            if let Some(rules) = rules {
                self.maybe_eval(clock.now(), &rules);
            }
        }
        match self.state.lock() {
            Ok(s) => Reading {
                signal: s.signal,
                stretch: STEPS[usize::from(s.step.min(MAX_STEP))],
                step: s.step,
                shed: s.shed,
                missed: s.missed,
            },
            Err(_) => Reading {
                signal: 0,
                stretch: 1.0,
                step: 0,
                shed: 0,
                missed: false,
            },
        }
    }

    /// Move the controller if an evaluation is due at `now` (one caller moves it; the others
    /// go on).
    pub(crate) fn maybe_eval(&self, now: Nanos, rules: &Rules) {
        let due = self.next_eval.load(Ordering::Relaxed);
        if now < due {
            return;
        }
        if self
            .next_eval
            .compare_exchange(due, now + EVAL, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        let Ok(mut s) = self.state.lock() else {
            return;
        };
        s.rules = Some(*rules);
        let on = self.on_slot.swap(0, Ordering::Relaxed);
        let off = self.off_slot.swap(0, Ordering::Relaxed);
        s.follows.push_back((now, on, off));
        while s
            .follows
            .front()
            .is_some_and(|&(at, _, _)| at + FOLLOW_WINDOW < now)
        {
            s.follows.pop_front();
        }
        s.eval(now, rules);
        self.step.store(s.step, Ordering::Relaxed);
        self.shed.store(s.shed, Ordering::Relaxed);
    }
}

impl State {
    /// One answer of `caller` at `now`: its time (if it was timed) and its status.
    fn record(&mut self, now: Nanos, caller: u64, took: Option<Nanos>, status: u16) {
        let index = now / SLICE;
        let fresh = self.slices.back().is_none_or(|s| s.index < index);
        if fresh {
            self.slices.push_back(Slice {
                index,
                callers: HashMap::new(),
            });
            let keep = ERROR_WINDOW / SLICE + 1;
            while self.slices.front().is_some_and(|s| s.index + keep <= index) {
                self.slices.pop_front();
            }
        }
        let Some(slice) = self.slices.back_mut() else {
            return;
        };
        if slice.callers.len() >= MAX_CALLERS && !slice.callers.contains_key(&caller) {
            return;
        }
        let st = slice.callers.entry(caller).or_default();
        if let Some(took) = took {
            st.timed = st.timed.saturating_add(1);
            st.took = st.took.saturating_add(took);
        }
        st.answers = st.answers.saturating_add(1);
        if status >= 500 {
            st.errors = st.errors.saturating_add(1);
        }
    }

    /// The callers' latency now: the latency at least [`MIN_CALLERS`] callers, and at least
    /// half of them, reach (0 with fewer callers).
    fn latency_signal(&self, now: Nanos, target: Nanos) -> Nanos {
        let from = now.saturating_sub(LATENCY_WINDOW) / SLICE;
        let mut per: HashMap<u64, (u64, u64)> = HashMap::new();
        for slice in self.slices.iter().filter(|s| s.index >= from) {
            for (&caller, st) in &slice.callers {
                if st.timed > 0 {
                    let e = per.entry(caller).or_default();
                    e.0 += u64::from(st.timed);
                    e.1 = e.1.saturating_add(st.took);
                }
            }
        }
        // A request still waiting past the target counts as an answer of what it has waited.
        for &(caller, at) in self.waiting.values() {
            let waited = now.saturating_sub(at);
            if waited > target {
                let e = per.entry(caller).or_default();
                e.0 += 1;
                e.1 = e.1.saturating_add(waited);
            }
        }
        quorum(per.values().map(|&(n, sum)| sum / n.max(1)).collect())
    }

    /// Whether the upstream is failing: enough 5xx answers, from enough callers.
    fn failing(&self, now: Nanos, share: f64) -> bool {
        let from = now.saturating_sub(ERROR_WINDOW) / SLICE;
        let mut per: HashMap<u64, (u32, u32)> = HashMap::new();
        let mut errors = 0u32;
        for slice in self.slices.iter().filter(|s| s.index >= from) {
            for (&caller, st) in &slice.callers {
                let e = per.entry(caller).or_default();
                e.0 = e.0.saturating_add(st.answers);
                e.1 = e.1.saturating_add(st.errors);
                errors = errors.saturating_add(st.errors);
            }
        }
        if errors < MIN_ERRORS {
            return false;
        }
        let failing = per
            .values()
            .filter(|&&(answers, errs)| errs > 0 && f64::from(errs) > share * f64::from(answers))
            .count();
        failing >= MIN_CALLERS && failing as f64 > share * per.len() as f64
    }

    fn eval(&mut self, now: Nanos, rules: &Rules) {
        // After a gap with no request, what made the last miss has left the window by then.
        let gap_end = if self.last_eval > 0 && now.saturating_sub(self.last_eval) > 2 * EVAL {
            (self.last_eval + LATENCY_WINDOW).min(now)
        } else {
            now
        };
        self.last_eval = now;
        let signal = self.latency_signal(now, rules.target);
        let missed = signal > rules.target || self.failing(now, rules.errors);
        if missed {
            self.met_since = None;
            let since = *self.miss_since.get_or_insert(now);
            let lasted = now - since;
            let level = SHED_AFTER.iter().filter(|&&after| lasted >= after).count() as u8;
            if level > self.shed {
                self.shed = level.min(MAX_SHED);
            }
            if lasted >= STRETCH_AFTER
                && self.following()
                && self.step < rules.max_step
                && (self.step == 0 || now.saturating_sub(self.step_since) >= rules.hold)
            {
                self.step += 1;
                self.step_since = now;
            }
        } else {
            if self.miss_since.take().is_some() || self.met_since.is_none() {
                let since = if self.missed { gap_end } else { now };
                self.met_since = Some(since);
                self.down_from = since;
            }
            let met_since = self.met_since.unwrap_or(now);
            let steps = now.saturating_sub(self.down_from) / rules.recover;
            if steps > 0 && self.shed > 0 {
                let down = u8::try_from(steps).unwrap_or(u8::MAX);
                self.shed = self.shed.saturating_sub(down);
                self.down_from += steps * rules.recover;
            }
            if self.step > rules.max_step {
                self.step = rules.max_step;
                self.step_since = now;
            } else if self.step > 0
                && now.saturating_sub(met_since) >= rules.recover
                && now.saturating_sub(self.step_since) >= rules.hold
            {
                self.step -= 1;
                self.step_since = now;
            }
        }
        self.missed = missed;
        self.signal = signal;
    }
}

impl State {
    /// Whether at least a quarter of the callers hinted of late came at their slots (or too few
    /// were hinted to say otherwise).
    fn following(&self) -> bool {
        let (on, off) = self
            .follows
            .iter()
            .fold((0u32, 0u32), |(a, b), &(_, on, off)| {
                (a.saturating_add(on), b.saturating_add(off))
            });
        let total = on.saturating_add(off);
        total < MIN_HINTS || on.saturating_mul(4) >= total
    }
}

/// The latency at least [`MIN_CALLERS`] callers, and at least half of `latencies`' callers,
/// reach; 0 with fewer than [`MIN_CALLERS`] callers.
fn quorum(mut latencies: Vec<Nanos>) -> Nanos {
    if latencies.len() < MIN_CALLERS {
        return 0;
    }
    latencies.sort_unstable_by(|a, b| b.cmp(a));
    let k = MIN_CALLERS.max(latencies.len().div_ceil(2)) - 1;
    latencies[k]
}

#[cfg(test)]
mod tests;
