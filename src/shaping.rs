//! Poll slots: when each caller of a shaped route should come next.
//!
//! Every caller has a phase in its route's interval, derived from who it is (the agent id and
//! its address, else the address): a SHA-256 of those, so every instance derives the same
//! phase with no shared state, and a fleet's phases fall evenly across the interval. The hint,
//! `X-Poll-Interval: <seconds>`, is the time from now to the caller's next slot at least half an
//! interval away (so an agent a little early or late for its slot is sent to the next one, not
//! told to come back at once), and never sooner than a refusal's `Retry-After`. An agent that
//! follows its hints arrives at its own slot every interval; 240 agents back from an outage in
//! the same second are told 240 slots spread across the interval.

use crate::clock::Nanos;
use crate::config::shaping::ShapingConfig;
use crate::policy::RoutePattern;
use sha2::{Digest, Sha256};
use smallvec::SmallVec;
use std::net::IpAddr;

const NANOS: u64 = 1_000_000_000;

/// The shaped routes, each with its interval in nanoseconds.
#[derive(Debug, Default)]
pub(crate) struct PollSlots {
    routes: Vec<(Vec<RoutePattern>, u64)>,
}

impl PollSlots {
    /// The routes `[shaping]` names; `None` when it names none (nothing to match).
    pub(crate) fn of(cfg: &ShapingConfig) -> Option<Self> {
        if cfg.routes.is_empty() {
            return None;
        }
        let routes = cfg
            .routes
            .iter()
            .map(|r| {
                let ns = u64::try_from(r.interval.as_nanos()).unwrap_or(u64::MAX);
                (r.routes.clone(), ns)
            })
            .collect();
        Some(Self { routes })
    }

    /// The interval of the shaped route that names `method` on the canonical `path` most
    /// specifically, if one does.
    pub(crate) fn interval_of(&self, method: &str, path: &str) -> Option<u64> {
        let segs: SmallVec<[&str; 16]> = path.split('/').filter(|s| !s.is_empty()).collect();
        crate::policy::most_specific(
            self.routes.iter().map(|(p, i)| (p.as_slice(), *i)),
            method,
            &segs,
        )
    }

    /// `X-Poll-Interval` for a request of `method` on `path` from `address` (normalised) with
    /// agent id `agent` (valid, or none), at `now`, refused for `retry_after_secs` (if it was):
    /// `None` on a route no `[shaping]` route names.
    pub(crate) fn hint(
        &self,
        method: &str,
        path: &str,
        address: &str,
        agent: Option<&str>,
        now: Nanos,
        retry_after_secs: Option<u64>,
    ) -> Option<u64> {
        let interval = self.interval_of(method, path)?;
        let phase = phase(address, agent, interval);
        let at_least = retry_after_secs.unwrap_or(0).saturating_mul(NANOS);
        Some(hint_secs(phase, interval, now, at_least))
    }
}

/// A caller's phase in `interval` (ns): where in every interval its slot falls.
pub(crate) fn phase(address: &str, agent: Option<&str>, interval: u64) -> u64 {
    let mut h = Sha256::new();
    h.update(b"fleet-limiter poll slot\0");
    match agent {
        Some(id) => {
            h.update(b"agent\0");
            h.update(address.as_bytes());
            h.update(b"\0");
            h.update(id.as_bytes());
        }
        None => {
            h.update(b"address\0");
            h.update(address.as_bytes());
        }
    }
    let d = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&d[..8]);
    // Whole milliseconds: the slot is said in seconds, finer phases only add rounding.
    let ms = (interval / 1_000_000).max(1);
    (u64::from_be_bytes(first) % ms) * 1_000_000
}

/// Seconds from `now` to the next slot of `phase` in `interval` that is at least half an
/// interval and `at_least` away, rounded to the nearest second (at least 1). Rounding to the
/// nearest keeps an agent that follows its hints within half a second of its slot: late by a
/// little, it is told a little less next time.
pub(crate) fn hint_secs(phase: u64, interval: u64, now: Nanos, at_least: u64) -> u64 {
    let interval = interval.max(NANOS);
    let into = now % interval;
    let mut ahead = (phase + interval - into) % interval;
    let least = (interval / 2).max(at_least);
    if ahead < least {
        let short = least - ahead;
        ahead += short.div_ceil(interval) * interval;
    }
    ((ahead + NANOS / 2) / NANOS).max(1)
}

/// The normalised address of `ip` as a poll slot reads it (the limiters' IPv6 prefix).
pub(crate) fn address_of(ip: IpAddr, ipv6_prefix: u8) -> String {
    crate::keys::normalize_ip(ip, ipv6_prefix)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = NANOS;

    #[test]
    fn a_slot_is_at_least_half_an_interval_away_and_at_most_one_and_a_half() {
        let interval = 60 * S;
        for phase_s in [0u64, 1, 29, 30, 31, 59] {
            for now_s in 0..240u64 {
                let h = hint_secs(phase_s * S, interval, 1_700_000_000 * S + now_s * S, 0);
                assert!((30..=90).contains(&h), "phase {phase_s} now {now_s}: {h}");
                // The slot it names is the caller's own.
                let at = (1_700_000_000 + now_s + h) % 60;
                assert_eq!(at, phase_s % 60, "phase {phase_s} now {now_s}: {h}");
            }
        }
    }

    #[test]
    fn an_agent_that_follows_its_hints_keeps_its_slot_and_a_refusal_is_never_cut_short() {
        let interval = 60 * S;
        let phase = 17_250 * 1_000_000; // 17.25 s into each minute
        let mut now = 1_700_000_003 * S;
        let mut slots = Vec::new();
        for _ in 0..50 {
            // 80 ms on the way each time.
            now += hint_secs(phase, interval, now, 0) * S + 80_000_000;
            let into = (now % interval) as i64 - phase as i64;
            assert!(into.abs() < 600_000_000, "drifted {into} ns from its slot");
            slots.push(now / interval);
        }
        slots.dedup();
        assert_eq!(
            slots.len(),
            50,
            "one arrival per interval, none skipped or doubled"
        );
        let h = hint_secs(phase, interval, now, 100 * S);
        assert!(h >= 100, "never sooner than Retry-After: {h}");
        assert_eq!((now / S + h) % 60, 17, "and still its own slot");
    }

    #[test]
    fn a_herd_is_spread_evenly_across_the_interval() {
        let interval = 60 * S;
        let mut sixths = [0u32; 6];
        for i in 0..2400 {
            let p = phase("198.51.100.7", Some(&format!("agent-{i:05}")), interval);
            sixths[(p / (10 * S)) as usize] += 1;
        }
        let share = 2400 / 6;
        assert!(
            sixths
                .iter()
                .all(|&n| n * 10 <= share * 13 && n * 10 >= share * 7),
            "{sixths:?}"
        );
        // Derived alike by every instance, and apart for another address.
        assert_eq!(
            phase("198.51.100.7", Some("a"), interval),
            phase("198.51.100.7", Some("a"), interval)
        );
        assert_ne!(
            phase("198.51.100.7", Some("a"), interval),
            phase("198.51.100.8", Some("a"), interval)
        );
    }
}
