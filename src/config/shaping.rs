//! `[shaping]`: poll slots. For each `[shaping.routes.<name>]`, every answer to a request on its
//! routes carries `X-Poll-Interval: <seconds>`, how long until the caller's own slot: a phase in
//! `interval` derived from who it is, so a fleet that arrives at once is told to come back
//! spread evenly across the interval (see `crate::shaping`). Off unless a route is named.

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

/// `[shaping]`, validated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShapingConfig {
    /// The shaped routes, in name order.
    pub routes: Vec<ShapedRoute>,
}

/// `[shaping.routes.<name>]`: routes whose callers are told their next slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShapedRoute {
    pub name: String,
    pub routes: Vec<RoutePattern>,
    /// How often a caller should come, in whole seconds.
    pub interval: Duration,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawShaping {
    #[serde(default)]
    routes: BTreeMap<String, RawShapedRoute>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawShapedRoute {
    routes: Option<Vec<String>>,
    interval: Option<DurationValue>,
}

/// `[shaping]` read and checked: each route's patterns and interval, and no two routes that
/// could both claim one request.
pub(super) fn build_shaping(raw: RawShaping, ctx: &Ctx) -> Result<ShapingConfig, ConfigError> {
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
        routes.push(shaped_route(name, r, ctx)?);
    }
    check_overlaps(&routes, ctx)?;
    Ok(ShapingConfig { routes })
}

/// One `[shaping.routes.<name>]`.
fn shaped_route(name: String, r: RawShapedRoute, ctx: &Ctx) -> Result<ShapedRoute, ConfigError> {
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
            "is empty; name the routes whose callers are told their slot, e.g. [\"POST /api/agent/heartbeat\"]",
        ));
    }
    if r.interval.is_none() {
        return Err(ctx.err(
            &at("interval"),
            "is missing; set how often a caller should come, e.g. interval = \"60s\" (the agents' own cadence)",
        ));
    }
    let interval = duration(ctx, &at("interval"), r.interval, "60s")?;
    if interval.subsec_nanos() != 0 {
        return Err(ctx.err(
            &at("interval"),
            format!("{interval:?} is not a whole number of seconds; X-Poll-Interval speaks in seconds, so use e.g. \"30s\""),
        ));
    }
    if !(MIN_INTERVAL..=MAX_INTERVAL).contains(&interval) {
        return Err(ctx.err(
            &at("interval"),
            format!(
                "{}s is out of range; use 2s to 86400s (1d)",
                interval.as_secs()
            ),
        ));
    }
    Ok(ShapedRoute {
        name,
        routes: patterns,
        interval,
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
        assert_eq!((r.name.as_str(), r.interval.as_secs()), ("heartbeat", 60));
        assert!(
            load("").unwrap().shaping.routes.is_empty(),
            "off by default"
        );
    }

    #[test]
    fn every_bad_shaped_route_names_its_field_and_the_fix() {
        let cases = [
            ("[shaping.routes.a]\ninterval = \"60s\"\n", "shaping.routes.a.routes: is empty"),
            ("[shaping.routes.a]\nroutes = [\"/x\"]\n", "shaping.routes.a.interval: is missing"),
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
