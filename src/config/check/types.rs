//! What `check` reports: each limiter's line, its loads and verdict, and the whole report.

#[cfg(doc)]
use super::traffic;
use crate::config::{Config, FleetConfig};
use serde::Serialize;
use std::path::PathBuf;

/// How a limiter fares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Status {
    /// `mode = "off"`: never consulted.
    Off,
    /// No declared workload reaches it: an abuse guard.
    Unloaded,
    Ok,
    Warning,
    /// Dashboards keyed on the IP for want of a token verifier, more than their shared bucket
    /// carries: refused once it runs dry, but `serve` still starts.
    AtRisk,
    Unsafe,
}

impl Status {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Status::Off => "off",
            Status::Unloaded => "guard",
            Status::Ok => "ok",
            Status::Warning => "warning",
            Status::AtRisk => "AT RISK",
            Status::Unsafe => "UNSAFE",
        }
    }
}

/// Which declared workload a load comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Workload {
    AgentIdle,
    Rollout,
    Dashboards,
    CliLogin,
}

impl Workload {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Workload::AgentIdle => "agent idle",
            Workload::Rollout => "rollout",
            Workload::Dashboards => "dashboards",
            Workload::CliLogin => "CLI login",
        }
    }
}

/// What one workload asks of one limiter's bucket.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Load {
    pub workload: Workload,
    /// Clients sharing one bucket of this limiter.
    pub sharers: u64,
    /// A steady demand on one bucket, in requests per minute (absent for a burst).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub per_minute: Option<f64>,
    /// A one-off demand on one bucket, in requests (absent for a steady cadence).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub burst: Option<u64>,
    /// Whether the agents' heartbeat is among the requests.
    pub carries_heartbeat: bool,
    /// The clients share one bucket only because no token verifier is configured: a
    /// `user-or-ip` limiter falling back to the IP for dashboards (present only when `true`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub ip_fallback: bool,
    /// Capacity over demand: refill over cadence, or budget over burst.
    pub headroom: f64,
    /// Longest run of refusals for a client of this workload, in seconds; `None` if unbounded.
    pub worst_refused_seconds: Option<f64>,
    /// Human wording of the demand, e.g. `3/min per agent`.
    pub describe: String,
}

/// One limiter's line of the report.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct LimiterCheck {
    pub name: String,
    /// The configured `limit`, in cost units.
    pub limit: u32,
    /// Requests the bucket holds as judged: `limit` over a fixed `cost` (a cost read from a
    /// header is judged at 1 a request).
    pub requests_per_window: u32,
    pub window_seconds: f64,
    pub algorithm: &'static str,
    /// A calendar window: `day`, `week` or `month` and its time zone (`window_seconds` is then
    /// the longest such period).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub calendar: Option<String>,
    /// Time for one request's worth of budget to return (a fixed window returns it all at its end).
    pub refill_interval_seconds: f64,
    /// As configured: `ip`, `ip+agent`, `user-or-ip`, `credential`, `global`, `header:<name>`.
    pub key: String,
    /// `requests` (every request it applies to) or `new-agents` (agent ids it does not know).
    pub meter: &'static str,
    /// Which answers count: `all`, `failed` or `succeeded` (the others are given back).
    pub count: &'static str,
    /// The statuses `count` reads as failed, e.g. `400-499, 503` (absent when `count` is `all`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failed_statuses: Option<String>,
    /// What one request costs the bucket.
    pub cost: CostShown,
    /// `enforce`, `shadow` (decides and reports but never refuses) or `off`.
    pub mode: &'static str,
    pub loads: Vec<Load>,
    pub status: Status,
    pub reasons: Vec<String>,
    /// The class of each reason, in step with `reasons` (a limiter can mix them).
    #[serde(skip)]
    pub reason_status: Vec<Status>,
    /// For an unsafe or at-risk limiter, the smallest change `check` judges safe: the limit
    /// with the window kept, else the window with the limit kept, else the key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub suggestion: Option<Fix>,
    /// The other single changes that also make it safe (the window, the key).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub alternatives: Vec<Fix>,
    /// Why no limit, window or key within the configuration's ranges makes it safe.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub no_fix: Option<String>,
}

/// A limiter's cost per request: `{"units": 1}`, or `{"header": "x-batch-size", "max": 50}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub(crate) enum CostShown {
    Fixed { units: u32 },
    Header { header: String, max: u32 },
}

impl std::fmt::Display for CostShown {
    /// `1`, `30`, or `x-batch-size max 50`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CostShown::Fixed { units } => write!(f, "{units}"),
            CostShown::Header { header, max } => write!(f, "{header} max {max}"),
        }
    }
}

/// One change to a limiter's table that `check`'s own judge accepts: the budget, window and
/// key it leaves, and the lines to set under `[limiters.NAME]`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Fix {
    /// What changes: `limit`, `window` or `key`.
    pub change: &'static str,
    pub limit: u32,
    /// As configuration writes it (`1m`, `90s`).
    pub window: String,
    pub key: String,
    /// The lines to set, e.g. `[limiters.agent-device]\nlimit = 750\n`.
    pub toml: String,
    /// The limiter's status with the change: `ok`, or `warning` (thin headroom).
    pub status: Status,
}

impl LimiterCheck {
    #[cfg(test)]
    /// The smallest headroom over any load.
    pub(crate) fn headroom(&self) -> Option<f64> {
        self.loads.iter().map(|l| l.headroom).min_by(f64::total_cmp)
    }

    #[cfg(test)]
    /// The longest refusal run over any load (`Some(None)` = unbounded).
    pub(crate) fn worst_refused(&self) -> Option<Option<f64>> {
        let mut worst: Option<Option<f64>> = None;
        for l in &self.loads {
            worst = Some(match (worst, l.worst_refused_seconds) {
                (Some(None), _) | (_, None) => None,
                (Some(Some(a)), Some(b)) => Some(a.max(b)),
                (None, Some(b)) => Some(b),
            });
        }
        worst
    }
}

/// The limiters by their `on_store_error` answer.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub(crate) struct StoreDown {
    /// Pass unmetered.
    pub allow: Vec<String>,
    /// Refuse their routes.
    pub deny: Vec<String>,
    /// Count on each instance's own buckets: up to one budget per instance meanwhile.
    pub local: Vec<String>,
}

/// The whole check.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct CheckReport {
    /// The configuration file, or `None` for the built-in calibration.
    pub config: Option<PathBuf>,
    /// `false` when limiting is switched off (`enabled = false`): nothing is enforced.
    pub enabled: bool,
    /// The store the buckets live in, as `serve` would use it (`memory`: each instance counts on
    /// its own; `redis redis://host:6379`: instances share one budget), password hidden.
    pub store: String,
    /// The limiters (not `off`) by what they answer while a Redis store does not; empty lists
    /// on the memory store, which cannot fail.
    pub store_down: StoreDown,
    #[serde(serialize_with = "fleet_json")]
    pub fleet: FleetConfig,
    /// The dashboard load and how dashboards are keyed.
    pub dashboards: Dashboards,
    pub limiters: Vec<LimiterCheck>,
    pub unsafe_limiters: usize,
    pub warnings: usize,
    /// Limiters at risk: dashboards sharing one IP bucket for want of a token verifier.
    pub at_risk: usize,
    /// The known-agents table a `new-agents` ceiling remembers agents in, against the fleet
    /// (absent when no such ceiling is on).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub known_agents: Option<KnownTable>,
    /// The rules of Envoy's rate-limit service (`rls.config`), when it has any.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rls: Vec<RlsRuleCheck>,
    /// `[shaping]`, when it names a route: each entry, and the heartbeat's longest hint against
    /// the heartbeat timeout.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shaping: Option<ShapingCheck>,
    /// Which limiters meter each route pattern and each declared request, as `fleet-limiter
    /// routes` prints them (filled by [`CheckReport::with_routes`]: the admission at start-up
    /// has no use for it).
    pub routes: super::routes::RouteMap,
    /// Routes that reach nothing: a role left with no route, a pattern that can match no
    /// request. They inform; the verdict does not count them.
    pub route_warnings: Vec<String>,
}

impl CheckReport {
    /// The report with the route map and the route warnings of `cfg`, as `check` prints it.
    pub(crate) fn with_routes(mut self, cfg: &crate::config::Config) -> Self {
        self.routes = super::routes::route_map(cfg);
        self.route_warnings = super::routes::route_warnings(cfg);
        self
    }
}

/// `[shaping]` as `check` proves it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ShapingCheck {
    pub routes: Vec<ShapedRouteCheck>,
    /// The entry that claims `POST /api/agent/heartbeat`, if one does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub heartbeat_route: Option<String>,
    /// The longest hint an agent following them is told on the heartbeat route (s).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub longest_heartbeat_hint_seconds: Option<u64>,
    /// Half of `fleet.heartbeat_timeout_seconds`: the most the heartbeat's hint may be.
    pub heartbeat_hint_bound_seconds: u64,
    /// `[shaping.upstream]`'s latency target (ms), if set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency_target_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub errors_percent: Option<u8>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recover_ms: Option<u64>,
}

/// One `[shaping.routes.<name>]` as `check` lists it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ShapedRouteCheck {
    pub name: String,
    pub routes: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interval_seconds: Option<u64>,
    /// The longest hint (s): `max_interval`, else one and a half intervals.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub longest_hint_seconds: Option<u64>,
    pub priority: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_in_flight: Option<u32>,
    /// Who that cap counts: `address` or `user`.
    pub in_flight_per: &'static str,
}

impl ShapingCheck {
    /// `cfg`'s `[shaping]`, or `None` when it names no route.
    pub(crate) fn of(cfg: &crate::config::Config) -> Option<Self> {
        let s = &cfg.shaping;
        if s.routes.is_empty() {
            return None;
        }
        let (m, p) = crate::config::roles::heartbeat(&cfg.roles, &cfg.limiters);
        let heartbeat = crate::config::shaping::heartbeat_route(&s.routes, (&m, &p));
        let ms = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        Some(Self {
            routes: s
                .routes
                .iter()
                .map(|r| ShapedRouteCheck {
                    name: r.name.clone(),
                    routes: r.routes.iter().map(ToString::to_string).collect(),
                    interval_seconds: r.interval.map(|i| i.as_secs()),
                    longest_hint_seconds: r.longest_hint().map(|d| d.as_secs()),
                    priority: r.priority.as_str(),
                    max_in_flight: r.max_in_flight,
                    in_flight_per: r.in_flight_per.as_str(),
                })
                .collect(),
            heartbeat_route: heartbeat.map(|r| r.name.clone()),
            longest_heartbeat_hint_seconds: heartbeat
                .and_then(|r| r.longest_hint())
                .map(|d| d.as_secs()),
            heartbeat_hint_bound_seconds: cfg.fleet.heartbeat_timeout_seconds.get() / 2,
            latency_target_ms: s.upstream.map(|u| ms(u.latency_target)),
            errors_percent: s.upstream.map(|u| u.errors_percent),
            recover_ms: s.upstream.map(|u| ms(u.recover)),
        })
    }
}

/// One rule of the Envoy rate-limit service's YAML, as `check` lists it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RlsRuleCheck {
    /// Its descriptor path: `rls:<domain>:<key>=<value>/<key>`.
    pub rule: String,
    /// `2 / 1m gcra`, `unlimited`, or `nothing` (`requests_per_unit: 0`).
    pub budget: String,
    /// `descriptor` (its buckets keyed on the descriptor's entries) or the key of the
    /// calibration limiter it names.
    pub key: String,
    pub shadow: bool,
    /// The calibration limiter whose budget it spends (`fleet_limiter`), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fleet_limiter: Option<String>,
    /// How it is judged.
    pub judged: String,
}

/// The known-agents table against the declared fleet (see `known_agents`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct KnownTable {
    /// Ids in all: `store.max_keys`.
    pub capacity: u64,
    /// The most ids kept for agents seen twice: half the table.
    pub protected: u64,
    /// The room always left for first sightings: the other half.
    pub probation: u64,
    /// `fleet.max_agents`: the agents the protected half must keep.
    pub max_agents: u64,
    /// `fleet.max_site_endpoints`: the first sightings of a new site.
    pub site: u64,
    /// First sightings other addresses may hold, minted within the grace and each address
    /// counted up to `site`, while a new site keeps every one of its own until its second
    /// requests: `probation - site`.
    pub others_first_sightings: u64,
    /// The same bound in addresses, whatever each of them mints: `probation / site - 1`.
    pub flooding_addresses: u64,
    /// Protected places others may hold, renewed within the grace and each address counted up
    /// to `site`, while every agent of the declared fleet keeps its own: `protected -
    /// max_agents`.
    pub others_protected: u64,
    /// How long a first sighting is guaranteed a place, and a protected id may go unseen
    /// before it is the first to give way (`known_agents::grace`).
    pub grace_seconds: u64,
}

impl KnownTable {
    pub fn of(cfg: &Config) -> Self {
        let capacity = cfg.store.max_keys as u64;
        let (protected, probation) = crate::known_agents::split(capacity);
        let site = cfg.fleet.max_site_endpoints.get();
        Self {
            capacity,
            protected,
            probation,
            max_agents: cfg.fleet.max_agents.get(),
            site,
            others_first_sightings: probation.saturating_sub(site),
            flooding_addresses: (probation / site).saturating_sub(1),
            others_protected: protected.saturating_sub(cfg.fleet.max_agents.get()),
            grace_seconds: crate::known_agents::grace(cfg.fleet.longest_gap_seconds())
                / 1_000_000_000,
        }
    }
}

/// What one analyst's dashboard sends, and whose bucket it lands in.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Dashboards {
    /// Requests an open dashboard sends every `dashboard_poll_seconds`: its page's widgets and
    /// the notification bell ([`traffic::DASHBOARD_REQUESTS_PER_POLL`]).
    pub requests_per_poll: u64,
    /// The dashboard load of one analyst, requests per minute ([`traffic::dashboard_per_minute`]).
    pub per_analyst_per_minute: f64,
    /// Whether a token verifier is configured (`[identity]`): then each analyst is a verified
    /// user with their own `user-or-ip` bucket; else the `analysts_per_nat` analysts behind one
    /// NAT share its IP's bucket.
    pub verified_users: bool,
}

impl CheckReport {
    pub(crate) fn is_safe(&self) -> bool {
        self.unsafe_limiters == 0
    }

    /// `limiter: reason` for every unsafe finding.
    pub(crate) fn problems(&self) -> Vec<String> {
        self.findings(Status::Unsafe)
    }

    /// `limiter: reason` for every warning.
    pub(crate) fn warning_lines(&self) -> Vec<String> {
        self.findings(Status::Warning)
    }

    /// `limiter: reason` for every at-risk finding.
    pub(crate) fn risk_lines(&self) -> Vec<String> {
        self.findings(Status::AtRisk)
    }

    /// Whether any limiter is at risk.
    pub(crate) fn is_at_risk(&self) -> bool {
        self.at_risk > 0
    }

    fn findings(&self, status: Status) -> Vec<String> {
        self.limiters
            .iter()
            .flat_map(|l| {
                l.reasons
                    .iter()
                    .zip(&l.reason_status)
                    .filter(move |(_, s)| **s == status)
                    .map(move |(r, _)| format!("{}: {r}", l.name))
            })
            .collect()
    }
}

fn fleet_json<S: serde::Serializer>(f: &FleetConfig, s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeStruct;
    let mut st = s.serialize_struct("fleet", 7)?;
    st.serialize_field("heartbeat_interval_seconds", &f.heartbeat_interval_seconds)?;
    st.serialize_field("poll_interval_seconds", &f.poll_interval_seconds)?;
    st.serialize_field("heartbeat_timeout_seconds", &f.heartbeat_timeout_seconds)?;
    st.serialize_field("max_site_endpoints", &f.max_site_endpoints)?;
    st.serialize_field("dashboard_poll_seconds", &f.dashboard_poll_seconds)?;
    st.serialize_field("analysts_per_nat", &f.analysts_per_nat)?;
    st.serialize_field("max_agents", &f.max_agents)?;
    st.end()
}
