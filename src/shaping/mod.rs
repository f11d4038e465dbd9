//! Shaping the fleet: telling each caller when to come, and what gives way first when the
//! upstream cannot keep up (`[shaping]`).
//!
//! - [`slots`]: poll slots. Every caller of a route with an `interval` has a phase in it,
//!   derived from who it is, and every answer tells it the seconds to its next slot
//!   (`X-Poll-Interval`). No state is shared: every instance derives the same slot.
//! - [`pressure`]: the upstream's latency and errors against `[shaping.upstream]`'s target,
//!   per instance. While it is missed, intervals stretch (never past a route's
//!   `max_interval`) and priorities are shed, the lowest first, `critical` never.
//! - Here: the routes as a request meets them: [`Shaping::route`] finds the route that names a
//!   request most specifically, with its interval, priority and in-flight cap per address.

pub(crate) mod in_flight;
pub(crate) mod pressure;
pub(crate) mod slots;

use crate::clock::Nanos;
use crate::config::shaping::{InFlightPer, Priority, ShapingConfig};
use crate::policy::RoutePattern;
use in_flight::{InFlight, Place, Principal};
use smallvec::SmallVec;
use std::sync::Arc;

pub(crate) use pressure::{Pressure, Rules};
pub(crate) use slots::address_of;

/// One `[shaping.routes.<name>]` as requests meet it.
#[derive(Debug)]
pub(crate) struct Route {
    pub name: Arc<str>,
    patterns: Vec<RoutePattern>,
    /// The interval and the longest hint, in ns.
    interval: Option<u64>,
    max: Option<u64>,
    /// Its stretch steps (empty: it does not stretch).
    ladder: Vec<slots::Step>,
    /// Whether its answers count toward the upstream's pressure (`watched`).
    pub watched: bool,
    pub priority: Priority,
    /// What each principal has at the upstream on this route, when it is capped.
    in_flight: Option<Arc<InFlight>>,
    /// Who the cap counts.
    pub in_flight_per: InFlightPer,
    /// Its hint and cap counters.
    pub meter: crate::metrics::ShapingMeter,
}

impl Route {
    /// A place at the upstream for a request of `who`, or `None` when it already has its cap
    /// in flight. `Some(None)`: the route has no cap.
    pub(crate) fn take(&self, who: Principal) -> Option<Option<Place>> {
        match &self.in_flight {
            None => Some(None),
            Some(table) => table.take(who).map(Some),
        }
    }

    /// Whether requests on this route are capped per address.
    pub(crate) fn capped(&self) -> bool {
        self.in_flight.is_some()
    }

    /// The cap per address, if any.
    pub(crate) fn cap(&self) -> Option<usize> {
        self.in_flight.as_ref().map(|s| s.limit())
    }
}

/// `[shaping]` in force.
#[derive(Debug)]
pub(crate) struct Shaping {
    routes: Vec<Route>,
    upstream: Option<Rules>,
    /// The slots told lately (only when a route has an interval).
    memory: Option<slots::SlotMemory>,
    /// Which route each (method, path) met took: matched once per distinct path.
    memo: crate::policy::RouteMemo<Option<u16>>,
}

impl Shaping {
    /// `[shaping]`; `None` when it names no route (nothing to match). Its routes count into
    /// nothing (the simulator's); [`Shaping::metered`] for a server's.
    pub(crate) fn of(cfg: &ShapingConfig) -> Option<Self> {
        Self::build(cfg, None)
    }

    /// [`Shaping::of`], each route counting into `metrics`.
    pub(crate) fn metered(cfg: &ShapingConfig, metrics: &crate::metrics::Metrics) -> Option<Self> {
        Self::build(cfg, Some(metrics))
    }

    fn build(cfg: &ShapingConfig, metrics: Option<&crate::metrics::Metrics>) -> Option<Self> {
        if cfg.routes.is_empty() {
            return None;
        }
        let ns = |d: std::time::Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let routes: Vec<Route> = cfg
            .routes
            .iter()
            .map(|r| Route {
                name: Arc::from(r.name.as_str()),
                patterns: r.routes.clone(),
                interval: r.interval.map(ns),
                max: r.longest_hint().map(ns),
                ladder: match (r.interval, r.longest_hint()) {
                    (Some(i), Some(m)) if r.max_interval.is_some() => slots::ladder(ns(i), ns(m)),
                    _ => Vec::new(),
                },
                watched: r.watched,
                priority: r.priority,
                in_flight: r.max_in_flight.map(|n| InFlight::new(n as usize)),
                in_flight_per: r.in_flight_per,
                meter: metrics.map_or_else(Default::default, |m| {
                    m.shaping_meter(&r.name, r.interval.is_some(), r.max_in_flight.is_some())
                }),
            })
            .collect();
        // Each stretch step is held for the longest interval at least: one cycle of every route.
        let hold = routes.iter().filter_map(|r| r.interval).max().unwrap_or(0);
        // The last step that changes some route's period.
        let max_step = routes
            .iter()
            .map(|r| {
                let mut last = 0u8;
                for (i, w) in r.ladder.iter().enumerate() {
                    let below = i.checked_sub(1).and_then(|j| r.ladder.get(j));
                    if below.is_none_or(|b| b.period != w.period) {
                        last = u8::try_from(i + 1).unwrap_or(u8::MAX);
                    }
                }
                last
            })
            .max()
            .unwrap_or(0);
        // A server's memory is keyed by a secret of the process; the simulator's by fixed keys,
        // so that its seeded runs repeat.
        let memory = routes.iter().any(|r| r.interval.is_some()).then(|| {
            if metrics.is_some() {
                slots::SlotMemory::new()
            } else {
                slots::SlotMemory::with_keys((0x5eed, 0x510f))
            }
        });
        Some(Self {
            routes,
            upstream: cfg.upstream.as_ref().map(|u| Rules::new(u, hold, max_step)),
            memory,
            memo: crate::policy::RouteMemo::default(),
        })
    }

    /// The route that names `method` on the canonical `path` most specifically, if one does.
    pub(crate) fn route(&self, method: &str, path: &str) -> Option<&Route> {
        let at = self.memo.get_or_insert(method, path, 0, || {
            let segs: SmallVec<[&str; 16]> = path.split('/').filter(|s| !s.is_empty()).collect();
            crate::policy::most_specific(
                self.routes
                    .iter()
                    .enumerate()
                    .map(|(i, r)| (r.patterns.as_slice(), i)),
                method,
                &segs,
            )
            .and_then(|i| u16::try_from(i).ok())
        })?;
        self.routes.get(usize::from(at))
    }

    /// The upstream's target, when `[shaping.upstream]` sets one.
    pub(crate) fn upstream(&self) -> Option<&Rules> {
        self.upstream.as_ref()
    }

    /// `X-Poll-Interval` for a request on `route` from `address` (normalised) with agent id
    /// `agent` (valid, or none), at `now`, refused for `retry_after_secs` (if it was), at stretch
    /// step `step`: `None` on a route with no interval.
    ///
    /// At stretch step 0 the hint is the caller's next slot at least half an interval away. At a
    /// higher step, the slots fall on a grid of the step (a whole fraction of the interval) and
    /// the hint is the last point of the caller's grid within the step's period: an agent that
    /// comes at its slot is sent one period on (90 s instead of 60 for the example's heartbeat),
    /// and any other caller is told a slot between the period less one grid and the period
    /// (60 to 90 s).
    ///
    /// The slot told is remembered: asked again, a caller is told the same slot while it is at
    /// least half an interval away (and the step has not moved); come at its slot, it is sent
    /// one period on. Otherwise the slot is derived afresh, as every instance derives it.
    pub(crate) fn hint(
        &self,
        route: &Route,
        address: &str,
        agent: Option<&str>,
        now: Nanos,
        retry_after_secs: Option<u64>,
        step: u8,
    ) -> Option<u64> {
        self.hint_followed(route, address, agent, now, retry_after_secs, step)
            .map(|(secs, _)| secs)
    }

    /// [`Shaping::hint`], and whether the caller came at its slot (the one it was told, or a
    /// point of its grid, to within a second): `None` for a caller asking again before its slot.
    pub(crate) fn hint_followed(
        &self,
        route: &Route,
        address: &str,
        agent: Option<&str>,
        now: Nanos,
        retry_after_secs: Option<u64>,
        step: u8,
    ) -> Option<(u64, Option<bool>)> {
        let interval = route.interval?;
        let max = route.max.unwrap_or(u64::MAX);
        let at_least = retry_after_secs.unwrap_or(0).saturating_mul(1_000_000_000);
        let step = if route.ladder.is_empty() {
            0
        } else {
            step.min(u8::try_from(route.ladder.len()).unwrap_or(u8::MAX))
        };
        let rung = step
            .checked_sub(1)
            .and_then(|i| route.ladder.get(usize::from(i)).copied());
        let period = rung.map_or(interval, |r| r.period);
        let least = (interval / 2).max(at_least);
        let most = max.max(at_least).saturating_add(slots::ON_TIME);
        let said = |slot: u64| {
            let secs = slots::secs_until(slot, now);
            if at_least == 0 {
                secs.min((max / 1_000_000_000).max(1))
            } else {
                secs
            }
        };
        let index = self
            .routes
            .iter()
            .position(|r| std::ptr::eq(r, route))
            .unwrap_or(usize::MAX);
        let memory = self
            .memory
            .as_ref()
            .map(|m| (m, m.key(index, address, agent)));
        let phase = slots::phase(address, agent, interval);
        let mut came = {
            let grid = rung.map_or(interval, |r| r.grid).max(1);
            let since = (now + grid - phase % grid) % grid;
            since <= slots::ON_TIME || grid - since <= slots::ON_TIME
        };
        if let Some((m, key)) = memory {
            if let Some((told, at_step)) = m.recall(key) {
                came |= told.abs_diff(now) <= slots::ON_TIME;
                let ahead = told.saturating_sub(now);
                if at_step == step && told > now && ahead >= least && ahead <= most {
                    return Some((said(told), None));
                }
                // The step moved: a slot that lies where the new step would put one is kept.
                let low = rung.map_or(least, |r| least.max(r.period.saturating_sub(r.grid) + 1));
                if at_step != step && told > now && ahead >= low && ahead <= most {
                    m.remember(key, step, told);
                    return Some((said(told), None));
                }
                // Come at the slot it was told while stretched: one period on. (Unstretched, the
                // next slot of its phase is that already, and a caller off its phase comes
                // back to it.)
                if step > 0 && told.abs_diff(now) <= slots::ON_TIME {
                    let next = told.saturating_add(period);
                    let ahead = next.saturating_sub(now);
                    if ahead >= least && ahead <= most {
                        m.remember(key, step, next);
                        return Some((said(next), Some(true)));
                    }
                }
            }
        }
        // Stretched, an agent that comes at its slot is sent one period on; any other caller is
        // told the last point of its grid within one period.
        let slot = match rung {
            None => slots::base_slot(phase, interval, now, at_least, max),
            Some(r) => slots::on_grid_next(phase, r, now)
                .filter(|&next| {
                    let ahead = next.saturating_sub(now);
                    ahead >= least && ahead <= most
                })
                .unwrap_or_else(|| slots::stepped_slot(phase, r, now, at_least)),
        };
        if let Some((m, key)) = memory {
            m.remember(key, step, slot);
        }
        Some((said(slot), Some(came)))
    }

    /// The interval (ns) of the route that names `method` on `path`, if it has one.
    pub(crate) fn interval_of(&self, method: &str, path: &str) -> Option<u64> {
        self.route(method, path).and_then(|r| r.interval)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::shaping::ShapedRoute;
    use std::time::Duration;

    const S: u64 = 1_000_000_000;

    fn heartbeat(max: Option<u64>) -> Shaping {
        Shaping::of(&ShapingConfig {
            routes: vec![ShapedRoute {
                name: "heartbeat".into(),
                routes: vec!["POST /api/agent/heartbeat".parse().expect("route")],
                interval: Some(Duration::from_secs(60)),
                max_interval: max.map(Duration::from_secs),
                priority: Priority::Critical,
                max_in_flight: None,
                in_flight_per: InFlightPer::Address,
                watched: true,
            }],
            upstream: None,
        })
        .expect("a route")
    }

    #[test]
    fn a_hint_stays_within_half_an_interval_and_the_longest_and_stretched_is_longer() {
        let s = heartbeat(Some(90));
        let route = s.route("POST", "/api/agent/heartbeat").expect("the route");
        for step in 0..=4u8 {
            let mut sum = 0u64;
            for i in 0..3000 {
                let agent = format!("agent-{i}");
                let now = 1_700_000_000 * S + (i as u64 % 97) * S / 7;
                let h = s
                    .hint(route, "198.51.100.7", Some(&agent), now, None, step)
                    .expect("a hint");
                assert!((30..=90).contains(&h), "step {step}: {h}");
                sum += h;
            }
            let mean = sum as f64 / 3000.0;
            if step == 0 {
                assert!((57.0..63.0).contains(&mean), "{mean}");
            } else {
                // Stretched, a caller asked at any moment is told 60 to 90 s.
                assert!((72.0..78.0).contains(&mean), "step {step}: {mean}");
            }
        }
        // A refusal's Retry-After is never cut short.
        let h = s
            .hint(
                route,
                "198.51.100.7",
                Some("a"),
                1_700_000_000 * S,
                Some(120),
                1,
            )
            .expect("a hint");
        assert!(h >= 120, "{h}");
    }

    #[test]
    fn an_agent_that_follows_its_hints_comes_once_a_period() {
        let s = heartbeat(Some(90));
        let route = s.route("POST", "/api/agent/heartbeat").expect("the route");
        for (step, period) in [(0u8, 60u64), (1, 90)] {
            let mut now = 1_700_000_003 * S;
            let mut gaps = Vec::new();
            for k in 0..30u64 {
                let h = s
                    .hint(route, "203.0.113.9", Some("agent-7"), now, None, step)
                    .expect("a hint");
                gaps.push(h);
                // 80 ms on the way, and a timer early or late by up to 300 ms.
                now += h * S + 80_000_000;
                now = if k % 2 == 0 {
                    now + 300_000_000
                } else {
                    now - 300_000_000
                };
            }
            assert!(
                gaps[1..].iter().all(|&g| g.abs_diff(period) <= 1),
                "step {step}: {gaps:?}"
            );
        }
    }

    #[test]
    fn asked_again_an_agent_is_told_the_same_slot_and_a_slot_moves_once_per_step() {
        let s = heartbeat(Some(90));
        let route = s.route("POST", "/api/agent/heartbeat").expect("the route");
        let t0 = 1_700_000_000 * S;
        let mut moved = 0;
        for i in 0..200 {
            let agent = format!("agent-{i}");
            let slot = |now: u64, step: u8| {
                now / S
                    + s.hint(route, "198.51.100.7", Some(&agent), now, None, step)
                        .expect("a hint")
            };
            let a = slot(t0 + 12 * S, 1);
            let b = slot(t0 + 15 * S, 1);
            assert!(a.abs_diff(b) <= 1, "{agent}: {a} then {b}");
            let mut seen = vec![slot(t0, 0), slot(t0 + 4 * S, 0)];
            seen.extend([slot(t0 + 8 * S, 1), slot(t0 + 12 * S, 1)]);
            seen.sort_unstable();
            seen.dedup_by(|x, y| x.abs_diff(*y) <= 1);
            if seen.len() > 2 {
                moved += 1;
            }
        }
        assert_eq!(moved, 0);
        // Every instance derives the same slot: a fresh one tells the first ask the same.
        let other = heartbeat(Some(90));
        let route2 = other
            .route("POST", "/api/agent/heartbeat")
            .expect("the route");
        for i in 0..50 {
            let agent = format!("agent-{i}");
            let now = t0 + 20 * S;
            let fresh = heartbeat(Some(90));
            let r = fresh.route("POST", "/api/agent/heartbeat").expect("route");
            assert_eq!(
                fresh.hint(r, "198.51.100.7", Some(&agent), now, None, 1),
                other.hint(route2, "198.51.100.7", Some(&agent), now, None, 1)
            );
        }
    }

    #[test]
    fn the_ladder_of_the_example_routes() {
        use slots::Step;
        let l = slots::ladder(60 * S, 90 * S);
        assert_eq!(l.len(), 4);
        assert!(
            l.iter().all(|&st| st
                == Step {
                    grid: 30 * S,
                    period: 90 * S
                }),
            "{l:?}"
        );
        let p: Vec<u64> = slots::ladder(30 * S, 120 * S)
            .iter()
            .map(|s| s.period / S)
            .collect();
        assert_eq!(p, [45, 60, 90, 120]);
        // No room to stretch.
        assert!(slots::ladder(60 * S, 60 * S).is_empty());
    }

    #[test]
    fn the_most_specific_route_decides_and_an_unnamed_route_has_none() {
        let s = heartbeat(None);
        assert_eq!(s.interval_of("POST", "/api/agent/heartbeat"), Some(60 * S));
        assert_eq!(s.interval_of("GET", "/api/agent/heartbeat"), None);
        assert!(s.route("POST", "/api/export/x").is_none());
    }
}
