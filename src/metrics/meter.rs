//! The handles resolved once and recorded into on the request path: one limiter's counters
//! (`LimiterMeter`) and one admission group's gauges and counters (`AdmissionMeter`).

use super::histogram::Histogram;
use super::labels::{GiveBackResult, LimiterFate, ShedReason};
use super::striped::Counter;
use prometheus_client::metrics::gauge::Gauge;

/// One admission group's gauges and counters, resolved once when the gate is built: entering,
/// waiting and shedding are one atomic operation each. Clones share their values.
#[derive(Clone, Debug, Default)]
pub struct AdmissionMeter {
    pub(super) in_flight: Gauge,
    pub(super) queued: Gauge,
    /// By [`ShedReason`], in `ShedReason::ALL` order.
    pub(super) shed: [Counter; ShedReason::ALL.len()],
}

impl AdmissionMeter {
    /// A request took a slot (`+1`) or gave it back (`-1`).
    pub fn in_flight(&self, delta: i64) {
        self.in_flight.inc_by(delta);
    }

    /// A request started (`+1`) or stopped (`-1`) waiting in the queue.
    pub fn queued(&self, delta: i64) {
        self.queued.inc_by(delta);
    }

    /// A request was answered 503 for `reason`.
    pub fn shed(&self, reason: ShedReason) {
        self.shed[reason as usize].inc();
    }

    /// Requests in flight now.
    pub fn in_flight_now(&self) -> i64 {
        self.in_flight.get()
    }

    /// Requests waiting now.
    pub fn queued_now(&self) -> i64 {
        self.queued.get()
    }

    /// Requests shed for `reason` so far.
    pub fn shed_count(&self, reason: ShedReason) -> u64 {
        self.shed[reason as usize].get()
    }
}

/// One shaped route's counters (`[shaping.routes.<name>]`), resolved once per settings: a hint
/// is two atomic adds, with no lookup by name. The default counts nowhere (a route outside a
/// registry, as the simulator builds them).
#[derive(Clone, Debug, Default)]
pub(crate) struct ShapingMeter {
    pub(super) hints: Counter,
    pub(super) hint_seconds: Counter,
    pub(super) capped: Counter,
}

impl ShapingMeter {
    /// An answer told its caller to come in `secs` seconds.
    pub(crate) fn hint(&self, secs: u64) {
        self.hints.inc();
        self.hint_seconds.inc_by(secs);
    }

    /// A request found its principal at the route's in-flight cap.
    pub(crate) fn capped(&self) {
        self.capped.inc();
    }
}

/// One limiter's counters, resolved once per settings: recording a verdict is an atomic add per
/// counter, with no lookup by name. Clones share their counts.
#[derive(Clone, Debug)]
pub struct LimiterMeter {
    /// By [`LimiterFate`], in `LimiterFate::ALL` order.
    pub(super) fates: [Counter; LimiterFate::ALL.len()],
    pub(super) near_limit: Counter,
    pub(super) retry_after: Histogram,
    /// An allowed verdict that leaves less than this share of the budget is near the limit.
    pub(super) near_limit_percent: u8,
    /// By [`GiveBackResult`]; only for a limiter that gives back (`count` other than `all`).
    pub(super) give_backs: Option<[Counter; 3]>,
}

impl LimiterMeter {
    /// Count one give-back of this limiter.
    pub fn give_back(&self, result: GiveBackResult) {
        if let Some(c) = self
            .give_backs
            .as_ref()
            .and_then(|c| c.get(result as usize))
        {
            c.inc();
        }
    }

    /// Count one verdict: its fate, whether an allowed one left less than the near-limit share
    /// of the budget, and the wait an over-budget one asked for (whole seconds, at least 1).
    pub fn record(&self, fate: LimiterFate, remaining: u32, limit: u32, retry_after_secs: u64) {
        if let Some(c) = self.fates.get(fate as usize) {
            c.inc();
        }
        match fate {
            LimiterFate::Allowed | LimiterFate::LocalAllowed => {
                if u64::from(remaining) * 100
                    < u64::from(self.near_limit_percent) * u64::from(limit)
                {
                    self.near_limit.inc();
                }
            }
            LimiterFate::Refused | LimiterFate::ShadowRefused | LimiterFate::LocalRefused => {
                self.retry_after.observe(retry_after_secs.max(1));
            }
            LimiterFate::StoreErrorAllowed | LimiterFate::StoreErrorRefused => {}
        }
    }
}
