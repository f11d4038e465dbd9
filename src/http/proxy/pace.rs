//! The pace a client's request body must keep, as pure arithmetic over durations.
//!
//! Two rules, after nginx's `client_body_timeout` and Kestrel's `MinRequestBodyDataRate`:
//!
//! - **silence**: the gateway waits at most `timeout` for the next chunk of the body;
//! - **rate**: once the gateway has waited `grace` in all, the body must have come at
//!   `min_rate` bytes per second or more, on average over that waiting.
//!
//! And a third for a request that holds one of admission control's slots while its body
//! arrives (`admission.body_hold`), so that a body sent slowly but above the minimum rate
//! cannot hold a slot for as long as it likes:
//!
//! - **hold**: the gateway waits at most `hold` in all for the whole body.
//!
//! All count only the time the gateway spends *waiting for the client*: from asking for the
//! next chunk to getting it. While the upstream is slow to take what the client already sent
//! (back-pressure), the client is not asked for more, so that time is never held against it;
//! the upstream's silence is the read timeout's business.

use crate::metrics::BodyTimeout;
use std::time::Duration;

/// How long the rate rule lets a body start slowly before it judges its average.
pub(crate) const GRACE: Duration = Duration::from_secs(5);

/// The rules one request body is held to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BodyRules {
    /// The longest single wait for the next chunk.
    pub timeout: Duration,
    /// The least average bytes per second after [`BodyRules::grace`]; 0 turns the rule off.
    pub min_rate: u64,
    /// The waiting time before the rate rule applies.
    pub grace: Duration,
    /// The most waiting in all, for a body whose request holds an admission slot.
    pub hold: Option<Duration>,
}

impl BodyRules {
    pub(crate) fn new(timeout: Duration, min_rate: u64) -> Self {
        Self {
            timeout,
            min_rate,
            grace: GRACE,
            hold: None,
        }
    }

    /// These rules, and the hold rule: at most `hold` of waiting in all.
    pub(crate) fn with_hold(self, hold: Duration) -> Self {
        Self {
            hold: Some(hold),
            ..self
        }
    }
}

/// Which rule a body broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Trip {
    /// Nothing came for the body timeout.
    Silence,
    /// The average fell below the minimum rate after the grace period.
    Rate,
    /// The body was still arriving after the hold of its admission slot.
    Hold,
}

impl Trip {
    #[cfg(test)]
    pub(crate) const ALL: [Trip; 3] = [Trip::Silence, Trip::Rate, Trip::Hold];

    /// The metric label and log field.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Trip::Silence => "silence",
            Trip::Rate => "rate",
            Trip::Hold => "hold",
        }
    }

    /// The rule as `fleet_limiter_client_body_timeouts_total` counts it; the hold rule is
    /// admission control's, counted as `ShedReason::BodyHold` instead.
    pub(crate) fn body_timeout(self) -> Option<BodyTimeout> {
        match self {
            Trip::Silence => Some(BodyTimeout::Silence),
            Trip::Rate => Some(BodyTimeout::Rate),
            Trip::Hold => None,
        }
    }
}

/// One body's progress: how long the gateway has waited for it in all (waits that ended with a
/// chunk) and how many bytes came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BodyPace {
    rules: BodyRules,
    waited: Duration,
    bytes: u64,
}

impl BodyPace {
    pub(crate) fn new(rules: BodyRules) -> Self {
        Self {
            rules,
            waited: Duration::ZERO,
            bytes: 0,
        }
    }

    /// A wait that lasted `waited` ended with a chunk of `len` bytes (`waited` is zero when the
    /// chunk was already there when asked for).
    pub(crate) fn chunk(&mut self, waited: Duration, len: u64) {
        self.waited = self.waited.saturating_add(waited);
        self.bytes = self.bytes.saturating_add(len);
    }

    /// How long the wait that starts now may last before a rule trips, and which one trips
    /// then. The rate rule trips at the first instant where the total waiting has reached the
    /// grace period and the bytes are fewer than `min_rate` times that total.
    pub(crate) fn allowance(&self) -> (Duration, Trip) {
        let paced = self.paced();
        match self.rules.hold {
            Some(hold) if hold.saturating_sub(self.waited) < paced.0 => {
                (hold.saturating_sub(self.waited), Trip::Hold)
            }
            _ => paced,
        }
    }

    /// The allowance of the silence and rate rules alone.
    fn paced(&self) -> (Duration, Trip) {
        let silence = self.rules.timeout;
        if self.rules.min_rate == 0 {
            return (silence, Trip::Silence);
        }
        // The total waiting at which the average falls below `min_rate`: just past
        // bytes / min_rate seconds, and never before the grace period ends.
        let nanos = u128::from(self.bytes) * 1_000_000_000 / u128::from(self.rules.min_rate) + 1;
        let below = Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX));
        let rate = below.max(self.rules.grace).saturating_sub(self.waited);
        if rate < silence {
            (rate, Trip::Rate)
        } else {
            (silence, Trip::Silence)
        }
    }

    /// The rule broken by a wait that has lasted `waiting` so far, if any.
    #[cfg(test)]
    pub(crate) fn tripped(&self, waiting: Duration) -> Option<Trip> {
        let (allowed, trip) = self.allowance();
        (waiting >= allowed).then_some(trip)
    }

    /// Bytes received so far.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Time spent waiting for the client so far, not counting a wait still under way.
    pub(crate) fn waited(&self) -> Duration {
        self.waited
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// A client that sends `len` bytes after each `gap` of waiting, `chunks` times, or until a
    /// rule trips: the chunk index and rule, or `None` when the whole body arrived.
    fn run(rules: BodyRules, gap: Duration, len: u64, chunks: u32) -> Option<(u32, Trip)> {
        let mut pace = BodyPace::new(rules);
        for i in 0..chunks {
            if let Some(t) = pace.tripped(gap) {
                return Some((i, t));
            }
            pace.chunk(gap, len);
        }
        None
    }

    #[test]
    fn a_trickle_of_one_byte_every_two_seconds_trips_the_rate_rule_after_the_grace_period() {
        let rules = BodyRules::new(30 * S, 240);
        // 0 s, 2 s: within the grace period; the third wait would reach 6 s with 2 bytes.
        assert_eq!(run(rules, 2 * S, 1, 100), Some((2, Trip::Rate)));
        let mut pace = BodyPace::new(rules);
        pace.chunk(2 * S, 1);
        pace.chunk(2 * S, 1);
        assert_eq!(
            pace.allowance(),
            (S, Trip::Rate),
            "4 s waited: 1 s of grace left"
        );
        assert_eq!(pace.tripped(ms(999)), None);
        assert_eq!(pace.tripped(S), Some(Trip::Rate));
    }

    #[test]
    fn the_same_trickle_without_the_rate_rule_passes_the_silence_rule() {
        let rules = BodyRules::new(30 * S, 0);
        assert_eq!(run(rules, 2 * S, 1, 1000), None);
        assert_eq!(BodyPace::new(rules).allowance(), (30 * S, Trip::Silence));
    }

    #[test]
    fn a_client_that_stops_trips_the_silence_rule_at_the_timeout() {
        let rules = BodyRules::new(2 * S, 0);
        let mut pace = BodyPace::new(rules);
        pace.chunk(Duration::ZERO, 65_536);
        assert_eq!(pace.tripped(ms(1999)), None);
        assert_eq!(pace.tripped(2 * S), Some(Trip::Silence));
        assert_eq!(pace.tripped(3600 * S), Some(Trip::Silence));
    }

    #[test]
    fn a_steady_upload_above_the_minimum_rate_passes_however_long_it_takes() {
        // 512 bytes every 250 ms is 2 KiB/s against a 1 KiB/s minimum, for an hour.
        let rules = BodyRules::new(2 * S, 1024);
        assert_eq!(run(rules, ms(250), 512, 4 * 3600), None);
    }

    #[test]
    fn a_steady_upload_below_the_minimum_rate_trips_once_its_average_falls_below() {
        // 100 bytes per second against 240: the grace period ends at 5 s of waiting, with 400
        // bytes in (the fifth chunk would come at that very instant: too late).
        let rules = BodyRules::new(30 * S, 240);
        assert_eq!(run(rules, S, 100, 100), Some((4, Trip::Rate)));
        // 300 bytes per second passes.
        assert_eq!(run(rules, S, 300, 1000), None);
    }

    #[test]
    fn a_fast_start_buys_time_in_proportion_to_the_bytes_sent() {
        // 24 000 bytes at once, then nothing: the average reaches 240 B/s at 100 s of waiting,
        // but the silence rule trips first; with a longer timeout, the rate rule does.
        let mut pace = BodyPace::new(BodyRules::new(30 * S, 240));
        pace.chunk(Duration::ZERO, 24_000);
        assert_eq!(pace.allowance(), (30 * S, Trip::Silence));
        let mut pace = BodyPace::new(BodyRules::new(3600 * S, 240));
        pace.chunk(Duration::ZERO, 24_000);
        let (allowed, trip) = pace.allowance();
        assert_eq!(trip, Trip::Rate);
        assert!(
            allowed > 100 * S && allowed < 100 * S + ms(1),
            "{allowed:?}"
        );
    }

    #[test]
    fn time_the_client_was_not_asked_for_data_does_not_count() {
        // A client that always had the next chunk ready (the upstream was the slow side)
        // never waited: no rule trips, however long the transfer took on the wall clock.
        let rules = BodyRules::new(S, 1_000_000);
        let mut pace = BodyPace::new(rules);
        for _ in 0..10_000 {
            assert_eq!(pace.tripped(Duration::ZERO), None);
            pace.chunk(Duration::ZERO, 1);
        }
        assert_eq!(pace.waited(), Duration::ZERO);
        assert_eq!(pace.bytes(), 10_000);
    }

    #[test]
    fn an_empty_wait_at_the_start_is_judged_by_silence_and_grace() {
        let pace = BodyPace::new(BodyRules::new(30 * S, 240));
        assert_eq!(pace.allowance(), (GRACE, Trip::Rate));
        let pace = BodyPace::new(BodyRules::new(2 * S, 240));
        assert_eq!(pace.allowance(), (2 * S, Trip::Silence));
    }

    #[test]
    fn huge_numbers_saturate_instead_of_overflowing() {
        let mut pace = BodyPace::new(BodyRules::new(Duration::MAX, 1));
        pace.chunk(Duration::MAX, u64::MAX);
        pace.chunk(Duration::MAX, u64::MAX);
        assert_eq!(pace.bytes(), u64::MAX);
        assert_eq!(pace.allowance(), (Duration::ZERO, Trip::Rate));
        assert_eq!(Trip::ALL.map(Trip::as_str), ["silence", "rate", "hold"]);
        let mut pace = BodyPace::new(BodyRules::new(Duration::MAX, 0).with_hold(Duration::MAX));
        pace.chunk(Duration::MAX, 1);
        assert_eq!(pace.allowance(), (Duration::ZERO, Trip::Hold));
    }

    #[test]
    fn a_trickle_above_the_minimum_rate_is_cut_off_at_the_hold() {
        // 300 bytes a second against a 240 B/s minimum passes the rate rule for ever; holding
        // a slot, it may keep the gateway waiting 60 s in all.
        let rules = BodyRules::new(30 * S, 240).with_hold(60 * S);
        assert_eq!(run(rules, S, 300, 59), None);
        // The sixtieth chunk would come at 60 s of waiting, that very instant: too late.
        assert_eq!(run(rules, S, 300, 1000), Some((59, Trip::Hold)));
        let mut pace = BodyPace::new(rules);
        for _ in 0..55 {
            pace.chunk(S, 300);
        }
        assert_eq!(
            pace.allowance(),
            (5 * S, Trip::Hold),
            "5 s of the hold left"
        );
        // Without the hold, the same trickle is never cut off.
        assert_eq!(run(BodyRules::new(30 * S, 240), S, 300, 10_000), None);
    }

    #[test]
    fn the_hold_counts_only_time_spent_waiting_for_the_client() {
        // A body the client had ready every time (the upstream was the slow side) never trips
        // the hold, however long the transfer took.
        let rules = BodyRules::new(S, 0).with_hold(S);
        let mut pace = BodyPace::new(rules);
        for _ in 0..10_000 {
            assert_eq!(pace.tripped(Duration::ZERO), None);
            pace.chunk(Duration::ZERO, 1);
        }
        // The silence and rate rules still trip first when they come sooner.
        let rules = BodyRules::new(2 * S, 0).with_hold(60 * S);
        assert_eq!(BodyPace::new(rules).allowance(), (2 * S, Trip::Silence));
        let rules = BodyRules::new(30 * S, 240).with_hold(60 * S);
        assert_eq!(BodyPace::new(rules).allowance(), (GRACE, Trip::Rate));
    }
}
