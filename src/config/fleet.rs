//! `[fleet]`: what a healthy fleet looks like, the yardstick a calibration is judged against.
//! Every field is a positive whole number within a bound, checked at load; none can be zero.

use super::{defaults, ConfigError, Ctx};
use serde::Deserialize;
use std::num::NonZeroU64;

/// What a healthy fleet looks like; the calibration is checked against it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetConfig {
    /// Seconds between two heartbeats of a healthy agent.
    pub heartbeat_interval_seconds: NonZeroU64,
    /// Seconds between two task polls of a healthy agent.
    pub poll_interval_seconds: NonZeroU64,
    /// Seconds without a heartbeat after which the API marks an agent offline.
    pub heartbeat_timeout_seconds: NonZeroU64,
    /// The most agents behind one NAT address.
    pub max_site_endpoints: NonZeroU64,
    /// Seconds between two polls of an open dashboard.
    pub dashboard_poll_seconds: NonZeroU64,
    /// Dashboard users behind one NAT address.
    pub analysts_per_nat: NonZeroU64,
    /// The enrolled agents this instance must remember at once (the known-agents table's
    /// protected half is judged against it); at least `max_site_endpoints`.
    pub max_agents: NonZeroU64,
}

/// `n`, which a constant states is not zero.
const fn positive(n: u64) -> NonZeroU64 {
    match NonZeroU64::new(n) {
        Some(n) => n,
        None => panic!("a fleet default is zero"),
    }
}

impl FleetConfig {
    /// Seconds of the longest gap between two requests of a healthy agent: its heartbeat
    /// interval or its poll interval, whichever is longer.
    pub fn longest_gap_seconds(&self) -> u64 {
        self.heartbeat_interval_seconds
            .max(self.poll_interval_seconds)
            .get()
    }
}

impl Default for FleetConfig {
    fn default() -> Self {
        const DEFAULT: FleetConfig = FleetConfig {
            heartbeat_interval_seconds: positive(60),
            poll_interval_seconds: positive(30),
            heartbeat_timeout_seconds: positive(180),
            max_site_endpoints: positive(250),
            dashboard_poll_seconds: positive(10),
            analysts_per_nat: positive(20),
            max_agents: positive(defaults::MAX_AGENTS),
        };
        DEFAULT
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFleet {
    heartbeat_interval_seconds: Option<i64>,
    poll_interval_seconds: Option<i64>,
    heartbeat_timeout_seconds: Option<i64>,
    max_site_endpoints: Option<i64>,
    dashboard_poll_seconds: Option<i64>,
    analysts_per_nat: Option<i64>,
    max_agents: Option<i64>,
}

/// A day: the longest cadence a fleet may declare.
const DAY: u64 = 86_400;
/// A week: the longest an agent may go unheard before the API marks it offline.
const WEEK: u64 = 7 * DAY;
/// The most agents (or analysts) one address may stand for.
const MAX_PER_ADDRESS: u64 = 1_000_000;
/// The most agents one instance may be asked to remember.
const MAX_AGENTS: u64 = 100_000_000;

/// The value at `fleet.<field>`, or its default; within `least..=most`.
fn field(
    ctx: &Ctx,
    field: &str,
    given: Option<i64>,
    default: NonZeroU64,
    (least, most): (u64, u64),
    what: &str,
) -> Result<NonZeroU64, ConfigError> {
    let Some(n) = given else {
        return Ok(default);
    };
    u64::try_from(n)
        .ok()
        .filter(|n| (least..=most).contains(n))
        .and_then(NonZeroU64::new)
        .ok_or_else(|| {
            ctx.err(
                &format!("fleet.{field}"),
                format!("{n} is out of range; use {what}, {least} to {most} (default {default})"),
            )
        })
}

pub(super) fn build_fleet(raw: RawFleet, ctx: &Ctx) -> Result<FleetConfig, ConfigError> {
    let d = FleetConfig::default();
    let seconds = (1, DAY);
    let site = field(
        ctx,
        "max_site_endpoints",
        raw.max_site_endpoints,
        d.max_site_endpoints,
        (1, MAX_PER_ADDRESS),
        "the most agents behind one NAT address (it sizes the agent-ip ceiling)",
    )?;
    let max_agents = field(
        ctx,
        "max_agents",
        raw.max_agents,
        d.max_agents,
        (1, MAX_AGENTS),
        "the enrolled agents one instance must remember, at least fleet.max_site_endpoints",
    )?;
    if max_agents < site {
        return Err(ctx.err(
            "fleet.max_agents",
            format!(
                "{max_agents} is fewer than fleet.max_site_endpoints = {site}: a fleet holds at least its largest site; raise fleet.max_agents (default {})",
                d.max_agents
            ),
        ));
    }
    Ok(FleetConfig {
        heartbeat_interval_seconds: field(
            ctx,
            "heartbeat_interval_seconds",
            raw.heartbeat_interval_seconds,
            d.heartbeat_interval_seconds,
            seconds,
            "the seconds between two heartbeats of a healthy agent",
        )?,
        poll_interval_seconds: field(
            ctx,
            "poll_interval_seconds",
            raw.poll_interval_seconds,
            d.poll_interval_seconds,
            seconds,
            "the seconds between two task polls of a healthy agent",
        )?,
        heartbeat_timeout_seconds: field(
            ctx,
            "heartbeat_timeout_seconds",
            raw.heartbeat_timeout_seconds,
            d.heartbeat_timeout_seconds,
            (1, WEEK),
            "the seconds without a heartbeat after which the API marks an agent offline",
        )?,
        max_site_endpoints: site,
        dashboard_poll_seconds: field(
            ctx,
            "dashboard_poll_seconds",
            raw.dashboard_poll_seconds,
            d.dashboard_poll_seconds,
            seconds,
            "the seconds between two polls of an open dashboard",
        )?,
        analysts_per_nat: field(
            ctx,
            "analysts_per_nat",
            raw.analysts_per_nat,
            d.analysts_per_nat,
            (1, MAX_PER_ADDRESS),
            "the dashboard users behind one NAT address",
        )?,
        max_agents,
    })
}

#[cfg(test)]
mod tests {
    use crate::config::settings::SETTINGS;
    use crate::config::Loader;

    fn load(env: &[(&str, &str)]) -> Result<super::FleetConfig, String> {
        Loader::new()
            .env(env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())))
            .load()
            .map(|c| c.fleet)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn every_field_is_held_to_its_range_naming_the_field_and_the_fix() {
        let fields: Vec<_> = SETTINGS.iter().filter(|s| s.section() == "fleet").collect();
        assert_eq!(fields.len(), 7);
        for s in fields {
            for bad in ["0", "-1", "100000000000"] {
                let e = load(&[(s.variable, bad)]).expect_err(s.variable);
                let origin = format!("environment variable {}: {}: ", s.variable, s.path);
                assert!(e.starts_with(&origin), "{e}");
                assert!(e.contains(bad) && e.contains("(default "), "{e}");
            }
            let f = load(&[(s.variable, "300")]).expect(s.variable);
            let shown = format!("{f:?}");
            assert!(shown.contains("300"), "{}: {shown}", s.variable);
        }
    }

    #[test]
    fn bounds_and_the_largest_site() {
        let f = load(&[
            ("FLEET_LIMITER_HEARTBEAT_INTERVAL_SECONDS", "86400"),
            ("FLEET_LIMITER_HEARTBEAT_TIMEOUT_SECONDS", "604800"),
            ("FLEET_LIMITER_MAX_SITE_ENDPOINTS", "1"),
            ("FLEET_LIMITER_MAX_AGENTS", "1"),
        ])
        .expect("bounds are allowed");
        assert_eq!(f.heartbeat_interval_seconds.get(), 86_400);
        assert_eq!(f.max_agents.get(), 1);
        let e = load(&[("FLEET_LIMITER_HEARTBEAT_INTERVAL_SECONDS", "86401")]).unwrap_err();
        assert_eq!(e, "environment variable FLEET_LIMITER_HEARTBEAT_INTERVAL_SECONDS: fleet.heartbeat_interval_seconds: 86401 is out of range; use the seconds between two heartbeats of a healthy agent, 1 to 86400 (default 60)");
        let e = load(&[("FLEET_LIMITER_MAX_AGENTS", "249")]).unwrap_err();
        assert!(
            e.contains("249 is fewer than fleet.max_site_endpoints = 250"),
            "{e}"
        );
        let e = load(&[("FLEET_LIMITER_MAX_SITE_ENDPOINTS", "20000")]).unwrap_err();
        assert!(e.contains("fleet.max_agents"), "{e}");
        assert!(load(&[
            ("FLEET_LIMITER_MAX_SITE_ENDPOINTS", "20000"),
            ("FLEET_LIMITER_MAX_AGENTS", "20000")
        ])
        .is_ok());
    }
}
