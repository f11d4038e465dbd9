//! `[shaping]`: telling a fleet when to come instead of only refusing it.
//!
//! - `[shaping.routes.<name>]`: routes with an `interval` are poll slots: every answer to a
//!   request on them carries `X-Poll-Interval: <seconds>`, how long until the caller's own slot,
//!   a phase in the interval derived from who it is (see `crate::shaping`). A route's `priority`
//!   decides the order in which it is shed while the upstream misses its target, and
//!   `max_in_flight` caps one client address's requests on it at the upstream.
//! - `[shaping.upstream]`: the upstream's latency target. While it is missed, intervals stretch
//!   (never past a route's `max_interval`) and the lowest priorities are shed first.
//!
//! Off unless a route is named.

use super::fleet::FleetConfig;
use super::{duration, ConfigError, Ctx, DurationValue};
use crate::policy::RoutePattern;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// The shortest interval: a slot is at least half an interval away, and a header of whole
/// seconds cannot say less than one.
pub(crate) const MIN_INTERVAL: Duration = Duration::from_secs(2);
/// The longest interval: a day.
pub(crate) const MAX_INTERVAL: Duration = Duration::from_secs(86_400);
/// The most shaped routes (each is matched on every request).
pub(crate) const MAX_SHAPED: usize = 64;
/// The most requests one address may have in flight on a capped route.
pub(crate) const MAX_IN_FLIGHT: u64 = 65_536;
/// A latency target's bounds: shorter than 10 ms is noise, longer than a minute is no target.
pub(crate) const MIN_TARGET: Duration = Duration::from_millis(10);
pub(crate) const MAX_TARGET: Duration = Duration::from_secs(60);
/// How long the upstream must stay under its target before each step back (bounds).
pub(crate) const MIN_RECOVER: Duration = Duration::from_millis(500);
pub(crate) const MAX_RECOVER: Duration = Duration::from_secs(60);

/// The order in which routes are shed while the upstream misses its target: the lowest first,
/// and `critical` never.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Priority {
    /// Exports, dashboards: shed first.
    Low = 0,
    /// Every route `[shaping]` gives no priority.
    #[default]
    Normal = 1,
    High = 2,
    /// Heartbeats, enrollment: never shed.
    Critical = 3,
}

impl Priority {
    pub const ALL: [Priority; 4] = [
        Priority::Low,
        Priority::Normal,
        Priority::High,
        Priority::Critical,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Low => "low",
            Priority::Normal => "normal",
            Priority::High => "high",
            Priority::Critical => "critical",
        }
    }

    /// 0 (low) to 3 (critical).
    pub fn rank(self) -> u8 {
        self as u8
    }

    fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.as_str() == s)
    }
}

/// `[shaping]`, validated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShapingConfig {
    /// The shaped routes, in name order.
    pub routes: Vec<ShapedRoute>,
    /// The upstream's target (`[shaping.upstream]`); `None`: hints never stretch and nothing is
    /// shed by priority.
    pub upstream: Option<UpstreamTarget>,
}

/// `[shaping.routes.<name>]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShapedRoute {
    pub name: String,
    pub routes: Vec<RoutePattern>,
    /// How often a caller should come, in whole seconds; `None`: no poll slots on this route.
    pub interval: Option<Duration>,
    /// The longest hint, in whole seconds, however far the upstream's pressure stretches the
    /// interval; `None`: the interval never stretches.
    pub max_interval: Option<Duration>,
    pub priority: Priority,
    /// The most requests one principal may have at the upstream on these routes at once.
    pub max_in_flight: Option<u32>,
    /// Who that cap counts.
    pub in_flight_per: InFlightPer,
    /// Whether the upstream's answers on these routes count toward its pressure
    /// (`[shaping.upstream]`); `false` for routes slow by nature (reports, long polls).
    pub watched: bool,
}

/// Who a route's in-flight cap counts (`in_flight_per`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum InFlightPer {
    /// The client address (normalised as keys are).
    #[default]
    Address,
    /// The verified token's subject; the address for a request with no verified token.
    User,
}

impl InFlightPer {
    pub fn as_str(self) -> &'static str {
        match self {
            InFlightPer::Address => "address",
            InFlightPer::User => "user",
        }
    }
}

impl ShapedRoute {
    /// The longest `X-Poll-Interval` this route can send a caller that is not refused: its
    /// `max_interval`, else one and a half intervals (a slot is at least half an interval
    /// away); `None` without an interval.
    pub fn longest_hint(&self) -> Option<Duration> {
        let interval = self.interval?;
        Some(self.max_interval.unwrap_or(interval + interval / 2))
    }
}

/// `[shaping.upstream]`: what the upstream should keep to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpstreamTarget {
    /// The longest an answer's head (or the oldest request still waiting for one) may take.
    pub latency_target: Duration,
    /// The largest share of 5xx answers, in percent.
    pub errors_percent: u8,
    /// How long the upstream must stay under its target before each step back (one priority
    /// less shed).
    pub recover: Duration,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawShaping {
    #[serde(default)]
    routes: BTreeMap<String, RawShapedRoute>,
    upstream: Option<RawUpstream>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawShapedRoute {
    routes: Option<Vec<String>>,
    interval: Option<DurationValue>,
    max_interval: Option<DurationValue>,
    priority: Option<String>,
    max_in_flight: Option<i64>,
    in_flight_per: Option<String>,
    watched: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawUpstream {
    latency_target: Option<DurationValue>,
    errors_percent: Option<i64>,
    recover: Option<DurationValue>,
}

/// `[shaping]` read and checked: each route's patterns, interval, priority and cap, no two
/// routes that could both claim one request, the heartbeat's hints inside the fleet's
/// heartbeat timeout, and the upstream's target.
pub(super) fn build_shaping(
    raw: RawShaping,
    fleet: &FleetConfig,
    verifies: bool,
    heartbeat: (&str, &str),
    ctx: &Ctx,
) -> Result<ShapingConfig, ConfigError> {
    if raw.routes.len() > MAX_SHAPED {
        return Err(ctx.err(
            "shaping.routes",
            format!(
                "{} routes; at most {MAX_SHAPED} may be shaped (each is matched on every request)",
                raw.routes.len()
            ),
        ));
    }
    let mut routes = Vec::with_capacity(raw.routes.len());
    for (name, r) in raw.routes {
        routes.push(shaped_route(name, r, verifies, ctx)?);
    }
    check_overlaps(&routes, ctx)?;
    check_heartbeat(&routes, fleet, heartbeat, ctx)?;
    let upstream = raw.upstream.map(|u| upstream_target(u, ctx)).transpose()?;
    Ok(ShapingConfig { routes, upstream })
}

/// A duration in whole seconds within [`MIN_INTERVAL`, `MAX_INTERVAL`].
fn whole_seconds(ctx: &Ctx, at: &str, v: DurationValue) -> Result<Duration, ConfigError> {
    let d = duration(ctx, at, Some(v), "60s")?;
    if d.subsec_nanos() != 0 {
        return Err(ctx.err(
            at,
            format!("{d:?} is not a whole number of seconds; X-Poll-Interval speaks in seconds, so use e.g. \"30s\""),
        ));
    }
    if !(MIN_INTERVAL..=MAX_INTERVAL).contains(&d) {
        return Err(ctx.err(
            at,
            format!("{}s is out of range; use 2s to 86400s (1d)", d.as_secs()),
        ));
    }
    Ok(d)
}

/// One `[shaping.routes.<name>]`.
fn shaped_route(
    name: String,
    r: RawShapedRoute,
    verifies: bool,
    ctx: &Ctx,
) -> Result<ShapedRoute, ConfigError> {
    let at = |field: &str| format!("shaping.routes.{name}.{field}");
    let patterns = r
        .routes
        .unwrap_or_default()
        .iter()
        .map(|s| {
            s.parse::<RoutePattern>()
                .map_err(|e| ctx.err(&at("routes"), e))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if patterns.is_empty() {
        return Err(ctx.err(
            &at("routes"),
            "is empty; name the routes this entry shapes, e.g. [\"POST /api/agent/heartbeat\"]",
        ));
    }
    if r.interval.is_none()
        && r.priority.is_none()
        && r.max_in_flight.is_none()
        && r.watched.is_none()
    {
        return Err(ctx.err(
            &at("interval"),
            "is missing, and so are priority and max_in_flight, so the entry shapes nothing; set how often a caller should come, e.g. interval = \"60s\" (the agents' own cadence)",
        ));
    }
    let interval = r
        .interval
        .map(|v| whole_seconds(ctx, &at("interval"), v))
        .transpose()?;
    let max_interval = match (r.max_interval, interval) {
        (None, _) => None,
        (Some(_), None) => {
            return Err(ctx.err(
                &at("max_interval"),
                "is set without an interval; it bounds how far the interval stretches, so set interval too",
            ))
        }
        (Some(v), Some(interval)) => {
            let max = whole_seconds(ctx, &at("max_interval"), v)?;
            if max < interval {
                return Err(ctx.err(
                    &at("max_interval"),
                    format!(
                        "{}s is shorter than the interval ({}s); it is the longest the interval may stretch to, so use at least {}s",
                        max.as_secs(),
                        interval.as_secs(),
                        interval.as_secs()
                    ),
                ));
            }
            Some(max)
        }
    };
    let priority = match r.priority.as_deref() {
        None => Priority::Normal,
        Some(p) => Priority::parse(p).ok_or_else(|| {
            ctx.err(
                &at("priority"),
                format!("`{p}` is not a priority; use critical, high, normal or low (the lowest is shed first, critical never)"),
            )
        })?,
    };
    let max_in_flight = match r.max_in_flight {
        None => None,
        Some(n) if (1..=MAX_IN_FLIGHT as i64).contains(&n) => u32::try_from(n).ok(),
        Some(n) => {
            return Err(ctx.err(
                &at("max_in_flight"),
                format!(
                "{n} is out of range; use 1 to {MAX_IN_FLIGHT} requests at the upstream at once"
            ),
            ))
        }
    };
    let in_flight_per = match (r.in_flight_per.as_deref(), max_in_flight) {
        (None, _) => InFlightPer::Address,
        (Some(_), None) => {
            return Err(ctx.err(
                &at("in_flight_per"),
                "is set without max_in_flight; it says who the cap counts, so set max_in_flight too",
            ))
        }
        (Some("address"), Some(_)) => InFlightPer::Address,
        (Some("user"), Some(_)) => {
            if !verifies {
                return Err(ctx.err(
                    &at("in_flight_per"),
                    "is \"user\" but no token verifier is configured, so every request would count as its address; configure [identity] (jwks_url, jwt_public_key_pem or jwt_hs256_secret), or use \"address\"",
                ));
            }
            InFlightPer::User
        }
        (Some(other), Some(_)) => {
            return Err(ctx.err(
                &at("in_flight_per"),
                format!("`{other}` is not who a cap counts; use \"address\" (the client address) or \"user\" (the verified token's subject)"),
            ))
        }
    };
    Ok(ShapedRoute {
        name,
        routes: patterns,
        interval,
        max_interval,
        priority,
        max_in_flight,
        in_flight_per,
        watched: r.watched.unwrap_or(true),
    })
}

/// A request takes the slot of the route that names it most specifically; two routes whose
/// patterns of the same specificity can match one request leave no winner, which is an error.
fn check_overlaps(routes: &[ShapedRoute], ctx: &Ctx) -> Result<(), ConfigError> {
    let sets: Vec<(&str, &[RoutePattern])> = routes
        .iter()
        .map(|r| (r.name.as_str(), r.routes.as_slice()))
        .collect();
    match crate::policy::ambiguous_pair(&sets) {
        Some((b, rb, a, ra)) => Err(ctx.err(
            &format!("shaping.routes.{b}.routes"),
            format!(
                "route `{rb}` overlaps `{ra}` of shaped route `{a}` with the same specificity, so a request could take either interval; make one route more specific, or keep it in one place"
            ),
        )),
        None => Ok(()),
    }
}

/// The shaped route that claims the fleet's heartbeat must keep an agent that follows its hints
/// inside the heartbeat timeout with one heartbeat lost on the way: its longest hint is at most
/// half of `fleet.heartbeat_timeout_seconds` (90 s for the built-in 180 s).
fn check_heartbeat(
    routes: &[ShapedRoute],
    fleet: &FleetConfig,
    heartbeat: (&str, &str),
    ctx: &Ctx,
) -> Result<(), ConfigError> {
    let Some(route) = heartbeat_route(routes, heartbeat) else {
        return Ok(());
    };
    let Some(longest) = route.longest_hint() else {
        return Ok(());
    };
    let timeout = fleet.heartbeat_timeout_seconds.get();
    let bound = timeout / 2;
    if longest.as_secs() <= bound {
        return Ok(());
    }
    let field = if route.max_interval.is_some() {
        "max_interval"
    } else {
        "interval"
    };
    Err(ctx.err(
        &format!("shaping.routes.{}.{field}", route.name),
        format!(
            "hints of up to {}s on the heartbeat route would let an agent that follows them and loses one heartbeat go {}s without one, past fleet.heartbeat_timeout_seconds ({timeout}s); keep the longest hint at most {bound}s (set max_interval = \"{bound}s\")",
            longest.as_secs(),
            longest.as_secs() * 2
        ),
    ))
}

/// The shaped route that claims the fleet's heartbeat (`POST /api/agent/heartbeat`, or the
/// `agent` role's request when `[roles]` maps it), if one does.
pub(crate) fn heartbeat_route<'a>(
    routes: &'a [ShapedRoute],
    (method, path): (&str, &str),
) -> Option<&'a ShapedRoute> {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    crate::policy::most_specific(
        routes.iter().map(|r| (r.routes.as_slice(), r)),
        method,
        &segs,
    )
}

/// `[shaping.upstream]`.
fn upstream_target(u: RawUpstream, ctx: &Ctx) -> Result<UpstreamTarget, ConfigError> {
    const AT: &str = "shaping.upstream";
    let Some(target) = u.latency_target else {
        return Err(ctx.err(
            &format!("{AT}.latency_target"),
            "is missing; set the longest the upstream should take to answer, e.g. latency_target = \"250ms\"",
        ));
    };
    let latency_target = duration(ctx, &format!("{AT}.latency_target"), Some(target), "250ms")?;
    if !(MIN_TARGET..=MAX_TARGET).contains(&latency_target) {
        return Err(ctx.err(
            &format!("{AT}.latency_target"),
            format!("{latency_target:?} is out of range; use 10ms to 60s"),
        ));
    }
    let errors_percent = match u.errors_percent {
        None => 50,
        Some(n) if (1..=100).contains(&n) => n as u8,
        Some(n) => {
            return Err(ctx.err(
                &format!("{AT}.errors_percent"),
                format!("{n} is out of range; use 1 to 100 (the share of 5xx answers the upstream may give before it counts as missing its target)"),
            ))
        }
    };
    let recover = duration(ctx, &format!("{AT}.recover"), u.recover, "5s")?;
    if !(MIN_RECOVER..=MAX_RECOVER).contains(&recover) {
        return Err(ctx.err(
            &format!("{AT}.recover"),
            format!("{recover:?} is out of range; use 500ms to 60s"),
        ));
    }
    Ok(UpstreamTarget {
        latency_target,
        errors_percent,
        recover,
    })
}

#[cfg(test)]
mod tests {
    use crate::config::Loader;

    fn load(toml: &str) -> Result<crate::config::Config, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let path = dir.path().join("c.toml");
        std::fs::write(&path, toml).map_err(|e| e.to_string())?;
        Loader::new().file(&path).load().map_err(|e| e.to_string())
    }

    #[test]
    fn a_shaped_route_is_read_with_its_interval() {
        let cfg = load(
            "[shaping.routes.heartbeat]\nroutes = [\"POST /api/agent/heartbeat\"]\ninterval = \"60s\"\n",
        )
        .unwrap();
        let r = &cfg.shaping.routes[0];
        assert_eq!(
            (r.name.as_str(), r.interval.map(|i| i.as_secs())),
            ("heartbeat", Some(60))
        );
        assert!(
            load("").unwrap().shaping.routes.is_empty(),
            "off by default"
        );
    }

    #[test]
    fn every_bad_shaped_route_names_its_field_and_the_fix() {
        let cases = [
            ("[shaping.routes.a]\ninterval = \"60s\"\n", "shaping.routes.a.routes: is empty"),
            ("[shaping.routes.a]\nroutes = [\"/x\"]\n", "shaping.routes.a.interval: is missing, and so are priority"),
            ("[shaping.routes.a]\nroutes = [\"/x\"]\npriority = \"urgent\"\n", "shaping.routes.a.priority: `urgent` is not a priority"),
            ("[shaping.routes.a]\nroutes = [\"/x\"]\npriority = \"LOW\"\n", "shaping.routes.a.priority: `LOW` is not a priority"),
            ("[shaping.routes.a]\nroutes = [\"/x\"]\npriority = 1\n", "shaping.routes.a.priority"),
            ("[shaping.routes.a]\nroutes = [\"/x\"]\nmax_interval = \"90s\"\npriority = \"low\"\n", "shaping.routes.a.max_interval: is set without an interval"),
            ("[shaping.routes.a]\nroutes = [\"/x\"]\ninterval = \"60s\"\nmax_interval = \"30s\"\n", "shaping.routes.a.max_interval: 30s is shorter than the interval"),
            ("[shaping.routes.a]\nroutes = [\"/x\"]\ninterval = \"60s\"\nmax_interval = \"90500ms\"\n", "shaping.routes.a.max_interval: 90.5s is not a whole number"),
            ("[shaping.routes.a]\nroutes = [\"/x\"]\nmax_in_flight = 2\nin_flight_per = \"user\"\n", "shaping.routes.a.in_flight_per: is \"user\" but no token verifier is configured"),
            ("[shaping.routes.a]\nroutes = [\"/x\"]\nmax_in_flight = 2\nin_flight_per = \"agent\"\n", "shaping.routes.a.in_flight_per: `agent` is not who a cap counts"),
            ("[shaping.routes.a]\nroutes = [\"/x\"]\npriority = \"low\"\nin_flight_per = \"address\"\n", "shaping.routes.a.in_flight_per: is set without max_in_flight"),
            ("[shaping.routes.a]\nroutes = [\"/x\"]\nmax_in_flight = 0\n", "shaping.routes.a.max_in_flight: 0 is out of range"),
            ("[shaping.routes.a]\nroutes = [\"/x\"]\nmax_in_flight = -4\n", "shaping.routes.a.max_in_flight: -4 is out of range"),
            ("[shaping.routes.a]\nroutes = [\"/x\"]\nmax_in_flight = 9999999999\n", "out of range"),
            ("[shaping.routes.hb]\nroutes = [\"POST /api/agent/heartbeat\"]\ninterval = \"60s\"\nmax_interval = \"120s\"\n", "shaping.routes.hb.max_interval: hints of up to 120s on the heartbeat route would let an agent that follows them and loses one heartbeat go 240s without one, past fleet.heartbeat_timeout_seconds (180s)"),
            ("[shaping.routes.hb]\nroutes = [\"/api/agent/**\"]\ninterval = \"80s\"\n", "shaping.routes.hb.interval: hints of up to 120s on the heartbeat route"),
            ("[fleet]\nheartbeat_timeout_seconds = 120\n[shaping.routes.hb]\nroutes = [\"POST /api/agent/heartbeat\"]\ninterval = \"60s\"\n", "keep the longest hint at most 60s"),
            ("[shaping.upstream]\nerrors_percent = 50\n", "shaping.upstream.latency_target: is missing"),
            ("[shaping.upstream]\nlatency_target = \"1ms\"\n", "shaping.upstream.latency_target: 1ms is out of range"),
            ("[shaping.upstream]\nlatency_target = \"2m\"\n", "shaping.upstream.latency_target: 120s is out of range"),
            ("[shaping.upstream]\nlatency_target = \"250ms\"\nerrors_percent = 0\n", "shaping.upstream.errors_percent: 0 is out of range"),
            ("[shaping.upstream]\nlatency_target = \"250ms\"\nerrors_percent = 101\n", "shaping.upstream.errors_percent: 101 is out of range"),
            ("[shaping.upstream]\nlatency_target = \"250ms\"\nrecover = \"100ms\"\n", "shaping.upstream.recover: 100ms is out of range"),
            ("[shaping.upstream]\nlatency_target = \"250ms\"\ntarget = 1\n", "target"),
            ("[shaping.routes.a]\nroutes = [\"/x\"]\ninterval = \"1500ms\"\n", "not a whole number of seconds"),
            ("[shaping.routes.a]\nroutes = [\"/x\"]\ninterval = \"1s\"\n", "1s is out of range"),
            ("[shaping.routes.a]\nroutes = [\"/x\"]\ninterval = \"2d\"\n", "172800s is out of range"),
            ("[shaping.routes.a]\nroutes = [\"/x\"]\ninterval = 0\n", "must be longer than zero"),
            ("[shaping.routes.a]\nroutes = [\"/x\"]\ninterval = -5\n", "shaping.routes.a.interval"),
            ("[shaping.routes.a]\nroutes = [\"BREW /x\"]\ninterval = \"9s\"\n", "shaping.routes.a.routes"),
            ("[shaping.routes.a]\nroutes = [\"/x\"]\ninterval = \"60s\"\nburst = 1\n", "burst"),
            (
                "[shaping.routes.a]\nroutes = [\"/api/*\"]\ninterval = \"60s\"\n[shaping.routes.b]\nroutes = [\"/api/*\"]\ninterval = \"30s\"\n",
                "shaping.routes.b.routes: route `/api/*` overlaps `/api/*` of shaped route `a`",
            ),
        ];
        for (toml, want) in cases {
            let err = load(toml).expect_err(toml);
            assert!(err.contains(want), "{toml}\n=> {err}");
            assert!(err.contains("c.toml"), "names the file: {err}");
        }
    }
}
