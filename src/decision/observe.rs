//! What an operator sees of each decision: the metrics in [`crate::metrics`] and the log events.
//!
//! - One event per refused request (`fleet_limiter::refusal`): the limiter with the longest
//!   wait, its bucket's key digest (never the raw principal), the client IP and the wait.
//! - One event per request a shadow limiter would have refused (`fleet_limiter::shadow`).
//! - Store failures are logged once per burst: the first failure, then at most one summary every
//!   [`STORE_ERROR_LOG_EVERY`] while failures continue, then one line when the store answers again.

use super::outcome::{LimitResult, Outcome};
use crate::limiter::ceil_secs;
use crate::metrics::{LimiterFate, LimiterMeter, Metrics, RequestFate};
use crate::policy::Mode;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// While the store keeps failing, a summary line at most this often.
pub(crate) const STORE_ERROR_LOG_EVERY: Duration = Duration::from_secs(10);

/// Count one request's decision in `metrics` (each limiter's verdict on its handles in
/// `meters`, by [`LimitResult::slot`]) and log it.
pub(crate) fn decision(
    metrics: &Metrics,
    meters: &[LimiterMeter],
    outcome: &Outcome,
    elapsed: Duration,
) {
    count(metrics, meters, outcome, elapsed);
    log_decision(outcome);
    let error = outcome.store_error.as_ref().map(|e| e.message());
    if error.is_some() || STORE_LOG.is_failing() {
        STORE_LOG.observe(error, Instant::now());
    }
}

/// Hand the metrics the plain facts of one decision: the request's fate and each limiter's
/// outcome with what it left of its budget.
fn count(metrics: &Metrics, meters: &[LimiterMeter], outcome: &Outcome, elapsed: Duration) {
    let request = if outcome.results.is_empty() {
        RequestFate::Unmetered
    } else if outcome.store_unavailable() {
        RequestFate::StoreUnavailable
    } else if outcome.refused() {
        RequestFate::Refused
    } else {
        RequestFate::Forwarded
    };
    metrics.request(request, elapsed);
    for r in &outcome.results {
        if let Some(m) = meters.get(r.slot) {
            let fate = if r.local {
                LimiterFate::local(r.verdict.allowed)
            } else {
                LimiterFate::of(
                    r.verdict.allowed,
                    r.store_error,
                    r.spec.mode == Mode::Enforce,
                )
            };
            m.record(
                fate,
                r.verdict.remaining,
                r.verdict.limit,
                ceil_secs(r.verdict.retry_after_ns),
            );
        }
    }
}

fn log_decision(outcome: &Outcome) {
    // Rendered only when an event is written.
    let ip = || {
        outcome
            .client_ip
            .map(|ip| ip.to_string())
            .unwrap_or_default()
    };
    if outcome.refused() {
        if let Some(r) = longest_wait(outcome, |r| r.refuses()) {
            tracing::info!(
                target: "fleet_limiter::refusal",
                limiter = %r.spec.name,
                key = %r.key.digest_hex(),
                client_ip = %ip(),
                wait_seconds = crate::limiter::wait_secs(r.verdict.retry_after_ns),
                store_error = r.store_error,
                "request refused"
            );
        }
    }
    if let Some(r) = longest_wait(outcome, |r| {
        !r.verdict.allowed && r.spec.mode == Mode::Shadow
    }) {
        tracing::info!(
            target: "fleet_limiter::shadow",
            limiter = %r.spec.name,
            key = %r.key.digest_hex(),
            client_ip = %ip(),
            wait_seconds = crate::limiter::wait_secs(r.verdict.retry_after_ns),
            store_error = r.store_error,
            "shadow limiter would refuse; forwarded"
        );
    }
}

fn longest_wait(outcome: &Outcome, pick: impl Fn(&LimitResult) -> bool) -> Option<&LimitResult> {
    outcome
        .results
        .iter()
        .filter(|r| pick(r))
        .max_by_key(|r| r.verdict.retry_after_ns)
}

static STORE_LOG: StoreErrorLog = StoreErrorLog::new();

/// Logs store failures once per burst.
pub(crate) struct StoreErrorLog {
    failing: AtomicBool,
    burst: Mutex<Burst>,
}

struct Burst {
    since: Option<Instant>,
    last_logged: Option<Instant>,
    suppressed: u64,
    total: u64,
}

/// What [`StoreErrorLog::observe`] decided to write.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum StoreLogLine {
    /// The first failure of a burst.
    Started,
    /// Failures continue; this many were not logged since the last line.
    Continuing(u64),
    /// The store answered again after this many failures.
    Recovered(u64),
}

impl Default for StoreErrorLog {
    fn default() -> Self {
        Self::new()
    }
}

impl StoreErrorLog {
    pub(crate) const fn new() -> Self {
        Self {
            failing: AtomicBool::new(false),
            burst: Mutex::new(Burst {
                since: None,
                last_logged: None,
                suppressed: 0,
                total: 0,
            }),
        }
    }

    /// Whether a burst of failures is under way.
    pub(crate) fn is_failing(&self) -> bool {
        self.failing.load(Ordering::Relaxed)
    }

    /// Record one decision's store result; writes a log line only when the burst starts,
    /// every [`STORE_ERROR_LOG_EVERY`] while it lasts, and when it ends.
    pub(crate) fn observe(&self, error: Option<&str>, now: Instant) -> Option<StoreLogLine> {
        // The common case (the store answered and was answering) touches one atomic.
        if error.is_none() && !self.failing.load(Ordering::Relaxed) {
            return None;
        }
        let mut b = self.burst.lock();
        let line = match error {
            None => {
                b.since?;
                let total = b.total;
                *b = Burst {
                    since: None,
                    last_logged: None,
                    suppressed: 0,
                    total: 0,
                };
                self.failing.store(false, Ordering::Relaxed);
                tracing::warn!(target: "fleet_limiter::store", failures = total, "store answering again");
                StoreLogLine::Recovered(total)
            }
            Some(e) => {
                b.total += 1;
                if b.since.is_none() {
                    b.since = Some(now);
                    b.last_logged = Some(now);
                    self.failing.store(true, Ordering::Relaxed);
                    tracing::error!(target: "fleet_limiter::store", error = %e, "store failing; each limiter answers with its on_store_error setting");
                    StoreLogLine::Started
                } else if b
                    .last_logged
                    .is_some_and(|t| now.duration_since(t) >= STORE_ERROR_LOG_EVERY)
                {
                    let n = b.suppressed + 1;
                    b.suppressed = 0;
                    b.last_logged = Some(now);
                    tracing::error!(target: "fleet_limiter::store", error = %e, failures_since_last_report = n, "store still failing");
                    StoreLogLine::Continuing(n)
                } else {
                    b.suppressed += 1;
                    return None;
                }
            }
        };
        Some(line)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_failures_are_logged_once_per_burst() {
        let log = StoreErrorLog::new();
        let t0 = Instant::now();
        assert_eq!(log.observe(None, t0), None);
        assert_eq!(log.observe(Some("down"), t0), Some(StoreLogLine::Started));
        for i in 1..100 {
            assert_eq!(
                log.observe(Some("down"), t0 + Duration::from_millis(i)),
                None
            );
        }
        assert_eq!(
            log.observe(Some("down"), t0 + STORE_ERROR_LOG_EVERY),
            Some(StoreLogLine::Continuing(100))
        );
        assert_eq!(log.observe(Some("down"), t0 + STORE_ERROR_LOG_EVERY), None);
        assert_eq!(
            log.observe(None, t0 + STORE_ERROR_LOG_EVERY * 2),
            Some(StoreLogLine::Recovered(102))
        );
        assert_eq!(log.observe(None, t0 + STORE_ERROR_LOG_EVERY * 2), None);
        assert_eq!(
            log.observe(Some("down again"), t0 + STORE_ERROR_LOG_EVERY * 3),
            Some(StoreLogLine::Started)
        );
    }
}
