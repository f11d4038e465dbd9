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
        let routes = cfg
            .routes
            .iter()
            .map(|r| Route {
                name: Arc::from(r.name.as_str()),
                patterns: r.routes.clone(),
                interval: r.interval.map(ns),
                max: r.longest_hint().map(ns),
                priority: r.priority,
                in_flight: r.max_in_flight.map(|n| InFlight::new(n as usize)),
                in_flight_per: r.in_flight_per,
                meter: metrics.map_or_else(Default::default, |m| {
                    m.shaping_meter(&r.name, r.interval.is_some(), r.max_in_flight.is_some())
                }),
            })
            .collect();
        Some(Self {
            routes,
            upstream: cfg.upstream.as_ref().map(Rules::from),
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
    /// `agent` (valid, or none), at `now`, refused for `retry_after_secs` (if it was), with
    /// intervals stretched by `stretch`: `None` on a route with no interval.
    pub(crate) fn hint(
        &self,
        route: &Route,
        address: &str,
        agent: Option<&str>,
        now: Nanos,
        retry_after_secs: Option<u64>,
        stretch: f64,
    ) -> Option<u64> {
        let interval = route.interval?;
        let max = route.max.unwrap_or(u64::MAX);
        let at = slots::stretched(interval, stretch, max);
        let phase = slots::phase(address, agent, interval);
        // The phase keeps its place in the stretched interval.
        let phase = if at == interval {
            phase
        } else {
            (u128::from(phase) * u128::from(at) / u128::from(interval)) as u64
        };
        let at_least = retry_after_secs.unwrap_or(0).saturating_mul(1_000_000_000);
        Some(slots::capped_hint_secs(phase, at, now, at_least, max))
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
            }],
            upstream: None,
        })
        .expect("a route")
    }

    #[test]
    fn a_stretched_hint_never_passes_the_longest_and_keeps_the_fleet_spread() {
        let s = heartbeat(Some(90));
        let route = s.route("POST", "/api/agent/heartbeat").expect("the route");
        for stretch in [1.0, 1.2, 1.5, 3.0, 16.0] {
            let mut thirds = [0u32; 3];
            for i in 0..3000 {
                let agent = format!("agent-{i}");
                let now = 1_700_000_000 * S + (i as u64 % 97) * S / 7;
                let h = s
                    .hint(route, "198.51.100.7", Some(&agent), now, None, stretch)
                    .expect("a hint");
                assert!((1..=90).contains(&h), "stretch {stretch}: {h}");
                thirds[((h - 1) * 3 / 90).min(2) as usize] += 1;
            }
            if stretch >= 3.0 {
                // Stretched to its most, the fleet is told hints spread across the 88 s.
                assert!(thirds.iter().all(|&n| n > 600), "{stretch}: {thirds:?}");
            }
        }
        // Unstretched, the hint is the slot half an interval to one and a half away.
        let h = s
            .hint(
                route,
                "198.51.100.7",
                Some("a"),
                1_700_000_000 * S,
                None,
                1.0,
            )
            .expect("a hint");
        assert!((30..=90).contains(&h), "{h}");
        // A refusal's Retry-After is never cut short, cap or not.
        let h = s
            .hint(
                route,
                "198.51.100.7",
                Some("a"),
                1_700_000_000 * S,
                Some(120),
                16.0,
            )
            .expect("a hint");
        assert!(h >= 120, "{h}");
    }

    #[test]
    fn an_agent_that_follows_stretched_hints_comes_once_per_stretched_interval() {
        let s = heartbeat(Some(90));
        let route = s.route("POST", "/api/agent/heartbeat").expect("the route");
        let mut now = 1_700_000_003 * S;
        let mut gaps = Vec::new();
        for _ in 0..40 {
            let h = s
                .hint(route, "203.0.113.9", Some("agent-7"), now, None, 16.0)
                .expect("a hint");
            gaps.push(h);
            now += h * S + 80_000_000;
        }
        // After its first, every gap is the stretched interval (88 s) to the rounding.
        assert!(
            gaps[1..].iter().all(|&g| (87..=89).contains(&g)),
            "{gaps:?}"
        );
    }

    #[test]
    fn the_most_specific_route_decides_and_an_unnamed_route_has_none() {
        let s = heartbeat(None);
        assert_eq!(s.interval_of("POST", "/api/agent/heartbeat"), Some(60 * S));
        assert_eq!(s.interval_of("GET", "/api/agent/heartbeat"), None);
        assert!(s.route("POST", "/api/export/x").is_none());
    }
}
