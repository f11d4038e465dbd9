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
use sha2::{Digest, Sha256};
use std::net::IpAddr;

const NANOS: u64 = 1_000_000_000;
/// How far below its longest hint a stretched interval stays, so that an agent a little early
/// for its slot is still sent to its next one.
const SLACK: u64 = 2 * NANOS;

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
#[cfg(test)]
pub(crate) fn hint_secs(phase: u64, interval: u64, now: Nanos, at_least: u64) -> u64 {
    capped_hint_secs(phase, interval, now, at_least, u64::MAX)
}

/// [`hint_secs`] never past `cap` (ns) unless `at_least` is: where the slot at least half an
/// interval away lies past the cap, the slot before it (sooner than half an interval) is said.
pub(crate) fn capped_hint_secs(
    phase: u64,
    interval: u64,
    now: Nanos,
    at_least: u64,
    cap: u64,
) -> u64 {
    let interval = interval.max(NANOS);
    let into = now % interval;
    let mut ahead = (phase % interval + interval - into) % interval;
    let least = (interval / 2).max(at_least);
    if ahead < least {
        let short = least - ahead;
        let pushed = ahead + short.div_ceil(interval) * interval;
        ahead = if pushed > cap && ahead >= at_least && ahead >= NANOS {
            ahead
        } else {
            pushed
        };
    }
    ((ahead + NANOS / 2) / NANOS).max(1)
}

/// The interval a route of `interval` (ns) runs at under `stretch`, never within [`SLACK`] of
/// its longest hint `max` (ns): the caller's phase keeps its place in it, scaled.
pub(crate) fn stretched(interval: u64, stretch: f64, max: u64) -> u64 {
    if stretch <= 1.0 || max <= interval + SLACK {
        return interval;
    }
    let want = (interval as f64 * stretch).min(u64::MAX as f64) as u64;
    want.min(max - SLACK).max(interval)
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
