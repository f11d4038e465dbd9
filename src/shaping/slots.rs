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
#[cfg(test)]
pub(crate) fn capped_hint_secs(
    phase: u64,
    interval: u64,
    now: Nanos,
    at_least: u64,
    cap: u64,
) -> u64 {
    secs_until(base_slot(phase, interval, now, at_least, cap), now)
}

/// The slot (ns since the epoch) [`capped_hint_secs`] names.
pub(crate) fn base_slot(phase: u64, interval: u64, now: Nanos, at_least: u64, cap: u64) -> u64 {
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
    now.saturating_add(ahead)
}

/// One stretch step of a route: its callers' slots fall on a grid of `grid` (ns, a whole
/// fraction of the interval, so the grid holds every base slot), and the hint is the last grid
/// point at most `period` away. An agent that follows its hints comes once every `period`; an
/// agent asked at any moment is told a slot in `(period - grid, period]`, never less than half
/// the interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Step {
    pub grid: u64,
    pub period: u64,
}

/// The fewest grid points per interval tried: a grid is at least a third of the interval, so a
/// fleet asked at one moment under a stretch still lands across a third of it.
const MOST_GRID_PARTS: u64 = 3;

/// A route's stretch steps: for each nominal factor of [`super::pressure::STEPS`] past the
/// first, the longest period within `factor * interval` and `max` (ns) whose grid keeps every
/// hint at least half an interval away; a factor no longer period serves repeats the step below
/// it. Empty when the route cannot stretch (`max` within the interval).
pub(crate) fn ladder(interval: u64, max: u64) -> Vec<Step> {
    let mut out: Vec<Step> = Vec::new();
    for &factor in &super::pressure::STEPS[1..] {
        let want = ((interval as f64 * factor).min(u64::MAX as f64) as u64).min(max);
        let mut best: Option<Step> = None;
        for parts in 1..=MOST_GRID_PARTS {
            if !interval.is_multiple_of(parts * 1_000_000) {
                continue;
            }
            let grid = interval / parts;
            let period = want / grid * grid;
            let fits = period > interval && period - grid >= interval / 2;
            if fits && best.is_none_or(|b| period > b.period) {
                best = Some(Step { grid, period });
            }
        }
        match (best, out.last()) {
            (Some(step), _) => out.push(step),
            (None, Some(&below)) => out.push(below),
            (None, None) => {}
        }
    }
    // A ladder whose first factor found no step found none at all.
    if out.len() < super::pressure::STEPS.len() - 1 {
        out.clear();
    }
    out
}

/// Under `step`, the slot (ns since the epoch) of the caller of `phase` asked at `now`: the last
/// point of its grid at most `step.period` away, or where a refusal asks for `at_least`, the
/// first point at least that far.
pub(crate) fn stepped_slot(phase: u64, step: Step, now: Nanos, at_least: u64) -> u64 {
    let grid = step.grid.max(NANOS);
    let offset = phase % grid;
    let last = |x: u64| -> u64 {
        // The last point of the grid at or before x.
        x - (x + grid - offset) % grid
    };
    let slot = last(now.saturating_add(step.period));
    if slot.saturating_sub(now) >= at_least {
        slot
    } else {
        let want = now.saturating_add(at_least);
        let l = last(want);
        if l == want {
            l
        } else {
            l.saturating_add(grid)
        }
    }
}

/// Under `step`, the slot one period after the grid point the caller of `phase` came at, if
/// `now` is within [`ON_TIME`] of one: an agent that came at its slot.
pub(crate) fn on_grid_next(phase: u64, step: Step, now: Nanos) -> Option<u64> {
    let grid = step.grid.max(NANOS);
    let offset = phase % grid;
    let since = (now + grid - offset) % grid;
    let point = if since <= ON_TIME {
        now - since
    } else if grid - since <= ON_TIME {
        now + (grid - since)
    } else {
        return None;
    };
    Some(point.saturating_add(step.period))
}

/// Whole seconds from `now` to `slot`, rounded to the nearest, at least 1.
pub(crate) fn secs_until(slot: u64, now: Nanos) -> u64 {
    ((slot.saturating_sub(now) + NANOS / 2) / NANOS).max(1)
}

/// How close to its remembered slot an agent must come to count as having come at it.
pub(crate) const ON_TIME: u64 = NANOS;

/// The slots told lately, per caller and route, so that an agent asked again is told the slot
/// it was told, and an agent that comes at its slot is sent one period on: a fixed number of
/// entries (a caller whose entry another took is told the slot derived afresh, which every
/// instance derives alike).
pub(crate) struct SlotMemory {
    entries: Box<[parking_lot::Mutex<Remembered>]>,
    keys: (u64, u64),
}

#[derive(Debug, Default, Clone, Copy)]
struct Remembered {
    key: u64,
    slot: u64,
    step: u8,
}

/// Entries a memory holds.
pub(crate) const MEMORY_ENTRIES: usize = 1 << 16;

impl std::fmt::Debug for SlotMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotMemory")
            .field("entries", &self.entries.len())
            .finish_non_exhaustive()
    }
}

impl Default for SlotMemory {
    fn default() -> Self {
        Self::new()
    }
}

impl SlotMemory {
    /// A memory keyed by a secret of this process, so that no caller can aim at another's
    /// entry.
    pub(crate) fn new() -> Self {
        Self::with_keys((rand::random(), rand::random()))
    }

    /// A memory keyed by `keys`: the simulator's, so that a seeded run is told the same slots
    /// every time.
    pub(crate) fn with_keys(keys: (u64, u64)) -> Self {
        let entries = (0..MEMORY_ENTRIES)
            .map(|_| parking_lot::Mutex::new(Remembered::default()))
            .collect();
        Self { entries, keys }
    }

    /// The key of a caller on route number `route`.
    pub(crate) fn key(&self, route: usize, address: &str, agent: Option<&str>) -> u64 {
        use std::hash::Hasher;
        let mut h = siphasher::sip::SipHasher13::new_with_keys(self.keys.0, self.keys.1);
        h.write_usize(route);
        h.write(address.as_bytes());
        h.write_u8(0xff);
        if let Some(a) = agent {
            h.write(a.as_bytes());
        }
        // 0 marks an empty entry.
        h.finish().max(1)
    }

    fn entry(&self, key: u64) -> &parking_lot::Mutex<Remembered> {
        &self.entries[(key as usize) & (MEMORY_ENTRIES - 1)]
    }

    /// The slot told to `key`, and the stretch step it was told under, if it is remembered.
    pub(crate) fn recall(&self, key: u64) -> Option<(u64, u8)> {
        let e = *self.entry(key).lock();
        (e.key == key).then_some((e.slot, e.step))
    }

    /// Remember `slot` as told to `key` under `step`.
    pub(crate) fn remember(&self, key: u64, step: u8, slot: u64) {
        *self.entry(key).lock() = Remembered { key, slot, step };
    }
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
