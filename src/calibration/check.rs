//! The heartbeat-aware check: does each limiter carry the traffic a healthy fleet declares?
//!
//! The fleet settings declare four workloads. For each, the configured [`Policy`] says which
//! limiters meter its requests (the same routing the gateway uses), and the limiter's key says
//! how many clients share one bucket: an `ip+agent` bucket holds one agent, a `user-or-ip` bucket
//! one verified analyst, an `ip` bucket everyone behind the NAT. Analysts are verified users
//! only when a token verifier is configured (`[identity]`, [`IdentityConfig::verifies`]);
//! without one their dashboards are keyed as anonymous requests, on the NAT's IP, and all
//! `analysts_per_nat` of them share one `user-or-ip` bucket.
//!
//! | workload | requests | clients | rules |
//! |---|---|---|---|
//! | agent idle | heartbeat every `heartbeat_interval_seconds`, task poll every `poll_interval_seconds` | `max_site_endpoints` agents | refill at least the cadence; a refused agent is admitted again before `heartbeat_timeout_seconds` pass without a heartbeat; warn under 10x headroom |
//! | rollout | one download and one enrollment per endpoint, all at once | `max_site_endpoints` installers | the burst fits the budget |
//! | dashboards | [`traffic::DASHBOARD_REQUESTS_PER_POLL`] requests (the page's widgets and the notification bell) every `dashboard_poll_seconds`, with a verified token when `[identity]` is configured | `analysts_per_nat` analysts | refill at least the cadence; one IP-keyed bucket shared for want of a verifier that cannot carry them all is *at risk* |
//! | CLI login | device-flow token poll every 5 s (RFC 8628's default interval) | one CLI | refill at least the cadence |
//!
//! "Worst refusal run" is how long a client of the workload can be refused in a row when its
//! bucket has just been emptied (a burst of result posts, a retry storm): for a token bucket,
//! the time the bucket takes to give every client sharing it one request (`sharers x limit/window`);
//! for a fixed window, the windows that takes (each `window` long, the first one whole).
//!
//! Verdicts: *unsafe* findings stop `serve` (unless allowed); *at risk* marks dashboards that
//! share one IP bucket only because no token verifier is configured, which `serve` starts with
//! and warns about (the built-in configuration is at risk until `[identity]` is set), and
//! `check --fail-on-risk` fails on; *warnings* only inform.

use super::traffic;
#[cfg(doc)]
use crate::config::identity::IdentityConfig;
use crate::config::{Config, FleetConfig};
use crate::identity::Credential;
use crate::keys::KeyKind;
use crate::limiter::Algorithm;
use crate::path::CanonicalPath;
use crate::policy::{LimiterSpec, Mode, Policy, Remember};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Headroom over the agents' idle cadence under which `check` warns.
pub const MIN_IDLE_HEADROOM: f64 = 10.0;

/// How a limiter fares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
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
    pub fn as_str(self) -> &'static str {
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
pub enum Workload {
    AgentIdle,
    Rollout,
    Dashboards,
    CliLogin,
}

impl Workload {
    pub fn label(self) -> &'static str {
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
pub struct Load {
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
pub struct LimiterCheck {
    pub name: String,
    pub limit: u32,
    pub window_seconds: f64,
    pub algorithm: &'static str,
    /// Time for one request's worth of budget to return (a fixed window returns it all at its end).
    pub refill_interval_seconds: f64,
    pub key: &'static str,
    /// `enforce`, `shadow` (decides and reports but never refuses) or `off`.
    pub mode: &'static str,
    pub loads: Vec<Load>,
    pub status: Status,
    pub reasons: Vec<String>,
    /// The class of each reason, in step with `reasons` (a limiter can mix them).
    #[serde(skip)]
    pub reason_status: Vec<Status>,
}

impl LimiterCheck {
    /// The smallest headroom over any load.
    pub fn headroom(&self) -> Option<f64> {
        self.loads.iter().map(|l| l.headroom).min_by(f64::total_cmp)
    }

    /// The longest refusal run over any load (`Some(None)` = unbounded).
    pub fn worst_refused(&self) -> Option<Option<f64>> {
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

/// The whole check.
#[derive(Debug, Clone, Serialize)]
pub struct CheckReport {
    /// The configuration file, or `None` for the built-in calibration.
    pub config: Option<PathBuf>,
    /// `false` when limiting is switched off (`enabled = false`): nothing is enforced.
    pub enabled: bool,
    /// The store the buckets live in, as `serve` would use it (`memory`: each instance counts on
    /// its own; `redis redis://host:6379`: instances share one budget), password hidden.
    pub store: String,
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
}

/// The known-agents table against the declared fleet (see [`crate::known_agents`]).
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
    /// before it is the first to give way ([`crate::known_agents::grace`]).
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
            grace_seconds: crate::known_agents::grace(&cfg.fleet) / 1_000_000_000,
        }
    }
}

/// What one analyst's dashboard sends, and whose bucket it lands in.
#[derive(Debug, Clone, Serialize)]
pub struct Dashboards {
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
    pub fn is_safe(&self) -> bool {
        self.unsafe_limiters == 0
    }

    /// `limiter: reason` for every unsafe finding.
    pub fn problems(&self) -> Vec<String> {
        self.findings(Status::Unsafe)
    }

    /// `limiter: reason` for every warning.
    pub fn warning_lines(&self) -> Vec<String> {
        self.findings(Status::Warning)
    }

    /// `limiter: reason` for every at-risk finding.
    pub fn risk_lines(&self) -> Vec<String> {
        self.findings(Status::AtRisk)
    }

    /// Whether any limiter is at risk.
    pub fn is_at_risk(&self) -> bool {
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

/// One request of a workload: method, path, the credential it carries, whether it names an
/// agent or a verified user (its own bucket under `ip+agent` or `user-or-ip`), whether it
/// carries a dashboard token that would name a user if a verifier were configured, its rate.
struct Req {
    route: (&'static str, &'static str),
    credential: Credential,
    agent_id: bool,
    user: bool,
    token: bool,
    /// Requests per minute per client (steady), or requests per client (burst).
    amount: f64,
}

struct Spec {
    workload: Workload,
    clients: u64,
    steady: bool,
    unit: &'static str,
    reqs: Vec<Req>,
}

/// The declared workloads; `verified`: a token verifier is configured, so a dashboard's token
/// names its analyst (without one it verifies as nothing and the request is anonymous).
fn workloads(f: &FleetConfig, verified: bool) -> Vec<Spec> {
    let per_min = |secs: u64| 60.0 / secs as f64;
    let agent = |route, amount| Req {
        route,
        credential: Credential::None,
        agent_id: true,
        user: false,
        token: false,
        amount,
    };
    let anon = |route, credential, amount| Req {
        route,
        credential,
        agent_id: false,
        user: false,
        token: false,
        amount,
    };
    vec![
        Spec {
            workload: Workload::AgentIdle,
            clients: f.max_site_endpoints.get(),
            steady: true,
            unit: "agent",
            reqs: vec![
                agent(
                    traffic::HEARTBEAT,
                    per_min(f.heartbeat_interval_seconds.get()),
                ),
                agent(traffic::POLL, per_min(f.poll_interval_seconds.get())),
            ],
        },
        Spec {
            workload: Workload::Rollout,
            clients: f.max_site_endpoints.get(),
            steady: false,
            unit: "endpoint",
            reqs: vec![
                anon(traffic::DOWNLOAD, Credential::None, 1.0),
                anon(traffic::ENROLL, Credential::None, 1.0),
            ],
        },
        Spec {
            workload: Workload::Dashboards,
            clients: f.analysts_per_nat.get(),
            steady: true,
            unit: if verified {
                "verified analyst"
            } else {
                "analyst"
            },
            reqs: vec![Req {
                route: traffic::DASHBOARD,
                credential: if verified {
                    Credential::VerifiedUser
                } else {
                    Credential::None
                },
                agent_id: false,
                user: verified,
                token: true,
                amount: traffic::dashboard_per_minute(f.dashboard_poll_seconds),
            }],
        },
        Spec {
            workload: Workload::CliLogin,
            clients: 1,
            steady: true,
            unit: "CLI",
            reqs: vec![anon(
                traffic::DEVICE_POLL,
                Credential::None,
                per_min(traffic::DEVICE_POLL_SECONDS),
            )],
        },
    ]
}

/// Clients of a workload sharing one bucket of a limiter keyed `key`.
fn sharers(key: KeyKind, req: &Req, clients: u64) -> u64 {
    let own = match key {
        KeyKind::IpAgent => req.agent_id,
        KeyKind::UserOrIp => req.user,
        _ => false,
    };
    if own {
        1
    } else {
        clients.max(1)
    }
}

/// A rate as `36/min` or `66.7/min`.
pub(crate) fn fmt_rate(per_min: f64) -> String {
    if (per_min - per_min.round()).abs() < 0.05 {
        format!("{}/min", per_min.round() as u64)
    } else {
        format!("{per_min:.1}/min")
    }
}

/// What one workload asks of one limiter's bucket, before it is judged.
#[derive(Debug, Clone, Copy)]
struct Demand {
    amount: f64,
    sharers: u64,
    carries_heartbeat: bool,
    /// Shared only because no verifier names the users (see [`Load::ip_fallback`]).
    ip_fallback: bool,
}

/// Run the check on a configuration.
pub fn check(cfg: &Config) -> CheckReport {
    let fleet = cfg.fleet.clone();
    let verified = cfg.identity.verifies();
    let policy = Policy::new(cfg.limiters.clone());
    // limiter name -> workload -> demand on one bucket
    let mut demand: BTreeMap<String, BTreeMap<Workload, Demand>> = BTreeMap::new();
    let specs = workloads(&fleet, verified);
    for spec in &specs {
        for req in &spec.reqs {
            let (method, path) = req.route;
            for l in policy.applicable(method, &CanonicalPath::of_static(path), req.credential) {
                let n = sharers(l.key, req, spec.clients);
                let e = demand
                    .entry(l.name.to_string())
                    .or_default()
                    .entry(spec.workload)
                    .or_insert(Demand {
                        amount: 0.0,
                        sharers: n,
                        carries_heartbeat: false,
                        ip_fallback: false,
                    });
                e.amount += req.amount * n as f64;
                e.sharers = e.sharers.max(n);
                e.carries_heartbeat |= req.route == traffic::HEARTBEAT;
                e.ip_fallback |= l.key == KeyKind::UserOrIp && req.token && !req.user && n > 1;
            }
        }
    }
    let table = KnownTable::of(cfg);
    let limiters: Vec<LimiterCheck> = cfg
        .limiters
        .iter()
        .map(|l| {
            let loads = demand.remove(&*l.name).unwrap_or_default();
            judge(l, &fleet, &table, &specs, loads)
        })
        .collect();
    let known_agents = cfg
        .limiters
        .iter()
        .any(|l| l.new_agents.is_some() && l.mode != Mode::Off)
        .then_some(table);
    let unsafe_limiters = limiters
        .iter()
        .filter(|l| l.status == Status::Unsafe)
        .count();
    let warnings = limiters
        .iter()
        .filter(|l| l.status == Status::Warning)
        .count();
    let at_risk = limiters
        .iter()
        .filter(|l| l.status == Status::AtRisk)
        .count();
    CheckReport {
        config: cfg.source.clone(),
        enabled: cfg.enabled,
        store: cfg.store.describe(),
        dashboards: Dashboards {
            requests_per_poll: traffic::DASHBOARD_REQUESTS_PER_POLL,
            per_analyst_per_minute: traffic::dashboard_per_minute(fleet.dashboard_poll_seconds),
            verified_users: verified,
        },
        fleet,
        limiters,
        unsafe_limiters,
        warnings,
        at_risk,
        known_agents,
    }
}

/// A calibration [`admit`] lets in, with what the operator should hear about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admitted {
    /// `limiter: reason` for every warning (thin headroom, shadow mode …) and every at-risk
    /// finding (dashboards keyed on the IP for want of `[identity]`), at-risk first.
    pub warnings: Vec<String>,
    /// `limiter: reason` for every unsafe finding let in because the operator allowed it.
    pub overridden: Vec<String>,
}

/// A calibration [`admit`] keeps out: it could lock healthy agents out of the declared fleet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// `limiter: reason` for every unsafe finding.
    pub problems: Vec<String>,
    /// `limiter: reason` for every at-risk finding and every warning.
    pub warnings: Vec<String>,
}

impl std::fmt::Display for Refusal {
    /// One line, as a rejected reload reports it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the calibration is unsafe for the declared fleet: {}; run `fleet-limiter check`, or pass --allow-unsafe-calibration",
            self.problems.join("; ")
        )
    }
}

impl std::error::Error for Refusal {}

/// The one admission rule, for start-up and every reload: a calibration with an unsafe finding
/// is refused unless `allow_unsafe` (`--allow-unsafe-calibration`,
/// `FLEET_LIMITER_ALLOW_UNSAFE_CALIBRATION=true`). At-risk findings are let in as warnings:
/// the built-in configuration, with no `[identity]`, keys dashboards on the IP and must still
/// start. With limiting switched off nothing is enforced, so nothing can lock a client out and
/// everything is admitted. Returns the findings; the caller says them.
pub fn admit(cfg: &Config, allow_unsafe: bool) -> Result<Admitted, Refusal> {
    if !cfg.enabled {
        return Ok(Admitted {
            warnings: Vec::new(),
            overridden: Vec::new(),
        });
    }
    let report = check(cfg);
    let mut warnings = report.risk_lines();
    warnings.extend(report.warning_lines());
    let problems = report.problems();
    if problems.is_empty() || allow_unsafe {
        return Ok(Admitted {
            warnings,
            overridden: problems,
        });
    }
    Err(Refusal { problems, warnings })
}

/// What a `new-agents` ceiling must also give the declared fleet: room to remember every agent
/// of the largest site, a memory longer than a healthy agent's longest gap, and a table that
/// keeps the whole declared fleet and a new site's first sightings however others fill it.
fn new_agent_rules(
    r: Remember,
    fleet: &FleetConfig,
    table: &KnownTable,
    status: &mut Status,
    reasons: &mut Vec<(String, Status)>,
    raise: &impl Fn(&mut Status, Status, String, &mut Vec<(String, Status)>),
) {
    if table.protected < table.max_agents {
        raise(
            status,
            Status::Unsafe,
            format!(
                "the known-agents table keeps {} agents seen twice (half of store.max_keys = {}), fewer than fleet.max_agents = {}: once others crowd it, the rest are metered as new on every request; set store.max_keys to at least {}",
                table.protected,
                table.capacity,
                table.max_agents,
                table.max_agents.saturating_mul(2)
            ),
            reasons,
        );
    }
    if table.flooding_addresses < 1 {
        raise(
            status,
            Status::Unsafe,
            format!(
                "the known-agents table keeps {} first sightings (half of store.max_keys = {}), room for fewer than two sites of max_site_endpoints = {}: one other address minting new ids can crowd out a new site's; set store.max_keys to at least {}",
                table.probation,
                table.capacity,
                table.site,
                table.site.saturating_mul(4)
            ),
            reasons,
        );
    }
    if u64::from(r.max_known) < fleet.max_site_endpoints.get() {
        raise(
            status,
            Status::Unsafe,
            format!(
                "remembers {} agents per IP, fewer than max_site_endpoints = {}: the rest are metered as new on every request",
                r.max_known, fleet.max_site_endpoints
            ),
            reasons,
        );
    }
    let gap = fleet
        .heartbeat_interval_seconds
        .max(fleet.poll_interval_seconds)
        .get();
    if r.known_for.as_secs() <= gap {
        raise(
            status,
            Status::Unsafe,
            format!(
                "forgets an agent after known_for = {}, not longer than its {gap}s between requests: healthy agents are metered as new on every request",
                super::fmt_secs(r.known_for.as_secs_f64())
            ),
            reasons,
        );
    }
}

fn judge(
    l: &LimiterSpec,
    fleet: &FleetConfig,
    table: &KnownTable,
    specs: &[Spec],
    loads: BTreeMap<Workload, Demand>,
) -> LimiterCheck {
    // A fixed cost of N leaves the bucket room for limit / N requests. A cost read from a
    // header is judged at 1 a request: what clients send is not known here.
    let cost = match l.cost {
        crate::policy::Cost::Fixed(n) => n.get(),
        crate::policy::Cost::Header { .. } => 1,
    };
    let limit = (l.quota.limit() / cost).max(1);
    let window = l.quota.window.as_secs_f64();
    let fixed = l.quota.algorithm == Algorithm::FixedWindow;
    let emission = window / limit as f64;
    let refill_per_min = limit as f64 * 60.0 / window;
    let mut status = Status::Unloaded;
    let mut reasons = Vec::new();
    let mut out = Vec::new();
    let raise = |s: &mut Status, to: Status, why: String, reasons: &mut Vec<(String, Status)>| {
        *s = (*s).max(to);
        reasons.push((why, to));
    };
    for (workload, d) in loads {
        let Demand {
            amount,
            sharers,
            carries_heartbeat,
            ip_fallback,
        } = d;
        let Some(spec) = specs.iter().find(|s| s.workload == workload) else {
            continue;
        };
        status = status.max(Status::Ok);
        let per_bucket = if sharers == 1 {
            format!("per {}", spec.unit)
        } else {
            format!("{sharers} {}s share", spec.unit)
        };
        // A ceiling that meters new agent ids sees each idle agent once, all at once at worst
        // (a rollout, or every agent after the store forgot them); known agents skip it.
        let (steady, amount) = match l.new_agents {
            Some(r) if workload == Workload::AgentIdle => {
                new_agent_rules(r, fleet, table, &mut status, &mut reasons, &raise);
                (false, sharers as f64)
            }
            _ => (spec.steady, amount),
        };
        if steady {
            let headroom = refill_per_min / amount;
            // Time for an emptied bucket to give each sharer one request.
            let worst = if amount > refill_per_min {
                None
            } else if fixed {
                Some(window * (sharers as f64 / limit as f64).ceil())
            } else {
                Some(emission * sharers as f64)
            };
            let describe = if sharers == 1 {
                format!("{}: {} {per_bucket}", workload.label(), fmt_rate(amount))
            } else if ip_fallback {
                format!(
                    "{}: {}, {sharers} {}s on one IP",
                    workload.label(),
                    fmt_rate(amount),
                    spec.unit
                )
            } else {
                format!("{}: {}, {per_bucket}", workload.label(), fmt_rate(amount))
            };
            // Each client on a bucket of its own would fit: only the missing verifier shares it.
            let fits_alone = amount / sharers as f64 <= refill_per_min;
            if amount > refill_per_min && ip_fallback && fits_alone {
                raise(
                    &mut status,
                    Status::AtRisk,
                    format!(
                        "keyed on the IP: no token verifier is configured, so the {sharers} {unit}s behind one NAT share one bucket and ask {} of its refill of {} ({} each): their {label} will be refused once it runs dry. Configure [identity] (identity.jwks_url, identity.jwt_public_key_pem or identity.jwt_hs256_secret; FLEET_LIMITER_JWKS_URL, FLEET_LIMITER_JWT_PUBLIC_KEY_PEM or FLEET_LIMITER_JWT_HS256_SECRET) so each {unit} is a verified user with a budget of their own: docs/identity/",
                        fmt_rate(amount),
                        fmt_rate(refill_per_min),
                        fmt_rate(amount / sharers as f64),
                        unit = spec.unit,
                        label = workload.label(),
                    ),
                    &mut reasons,
                );
            } else if amount > refill_per_min {
                let what = if workload == Workload::AgentIdle {
                    "the agents' idle cadence"
                } else {
                    "the declared cadence"
                };
                raise(
                    &mut status,
                    Status::Unsafe,
                    format!(
                        "refills {} per bucket, slower than {what} of {} ({}, {per_bucket}): clients at that cadence are refused without end",
                        fmt_rate(refill_per_min),
                        fmt_rate(amount),
                        workload.label()
                    ),
                    &mut reasons,
                );
            } else if workload == Workload::AgentIdle {
                let w = worst.unwrap_or(f64::INFINITY);
                let timeout = fleet.heartbeat_timeout_seconds.get() as f64;
                let gap = if carries_heartbeat {
                    w + fleet.heartbeat_interval_seconds.get() as f64
                } else {
                    w
                };
                if gap >= timeout {
                    let how = if carries_heartbeat {
                        format!(
                            "a refused agent can wait {} for its heartbeat, so {} can pass between heartbeats",
                            super::fmt_secs(w),
                            super::fmt_secs(gap)
                        )
                    } else {
                        format!("a refused agent can wait {}", super::fmt_secs(w))
                    };
                    raise(
                        &mut status,
                        Status::Unsafe,
                        format!(
                            "{how}, not under heartbeat_timeout_seconds = {}: the backend would mark healthy agents offline",
                            fleet.heartbeat_timeout_seconds
                        ),
                        &mut reasons,
                    );
                } else if headroom < MIN_IDLE_HEADROOM {
                    raise(
                        &mut status,
                        Status::Warning,
                        format!(
                            "headroom over the agents' idle cadence is {headroom:.1}x, under {MIN_IDLE_HEADROOM:.0}x: task-result bursts will meet refusals"
                        ),
                        &mut reasons,
                    );
                }
            }
            out.push(Load {
                workload,
                sharers,
                per_minute: Some(amount),
                burst: None,
                carries_heartbeat,
                ip_fallback,
                headroom,
                worst_refused_seconds: worst,
                describe,
            });
        } else {
            let burst = amount.round() as u64;
            let headroom = limit as f64 / amount;
            let over = burst.saturating_sub(limit as u64);
            let worst = if over == 0 {
                0.0
            } else if fixed {
                window * (over as f64 / limit as f64).ceil()
            } else {
                emission * over as f64
            };
            if over > 0 {
                raise(
                    &mut status,
                    Status::Unsafe,
                    format!(
                        "cannot admit max_site_endpoints = {} in one burst: the bucket holds {limit} of the {burst} requests, and the last waits {}",
                        fleet.max_site_endpoints,
                        super::fmt_secs(worst)
                    ),
                    &mut reasons,
                );
            }
            out.push(Load {
                workload,
                sharers,
                per_minute: None,
                burst: Some(burst),
                carries_heartbeat,
                ip_fallback,
                headroom,
                worst_refused_seconds: Some(worst),
                describe: if l.new_agents.is_some() && workload == Workload::AgentIdle {
                    format!("new ids: {burst} at once, {per_bucket}")
                } else if sharers == 1 {
                    format!("{}: {burst} {per_bucket}", workload.label())
                } else {
                    format!("{}: {burst} at once, {per_bucket}", workload.label())
                },
            });
        }
    }
    let mode = l.mode.as_str();
    match l.mode {
        Mode::Off => {
            // Never consulted: nothing it would do is a finding.
            status = Status::Off;
            for (_, s) in &mut reasons {
                *s = Status::Off;
            }
        }
        Mode::Shadow if status >= Status::AtRisk => {
            status = Status::Warning;
            for (r, s) in &mut reasons {
                *r = format!("in shadow mode, so not enforced; once enforced: {r}");
                *s = Status::Warning;
            }
        }
        _ => {}
    }
    let (reasons, reason_status) = reasons.into_iter().unzip();
    LimiterCheck {
        name: l.name.to_string(),
        limit,
        window_seconds: window,
        algorithm: l.quota.algorithm.as_str(),
        refill_interval_seconds: if fixed { window } else { emission },
        key: l.key.as_str(),
        mode,
        loads: out,
        status,
        reasons,
        reason_status,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Loader;

    fn load(pairs: &[(&str, &str)]) -> Config {
        Loader::new()
            .env(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())))
            .load()
            .unwrap()
    }

    fn line<'a>(r: &'a CheckReport, name: &str) -> &'a LimiterCheck {
        r.limiters.iter().find(|l| l.name == name).unwrap()
    }

    /// A complete `[identity]` block as the OIDC recipe gives it (loading it fetches nothing).
    const OIDC: &[(&str, &str)] = &[
        (
            "FLEET_LIMITER_JWKS_URL",
            "https://sso.example.com/realms/acme/protocol/openid-connect/certs",
        ),
        (
            "FLEET_LIMITER_JWT_ISSUER",
            "https://sso.example.com/realms/acme",
        ),
        ("FLEET_LIMITER_JWT_AUDIENCE", "dashboard-api"),
    ];

    #[test]
    fn a_fixed_cost_shrinks_what_a_bucket_carries() {
        let cfg = crate::config::Loader::new()
            .env([(
                "FLEET_LIMITER_LIMITER_AGENT_DEVICE_COST".to_owned(),
                "30".to_owned(),
            )])
            .load()
            .unwrap();
        let r = check(&cfg);
        assert!(
            !r.is_safe(),
            "30 units a request leave agent-device one request a minute"
        );
        assert!(
            r.problems().iter().any(|p| p.starts_with("agent-device")),
            "{:?}",
            r.problems()
        );
    }

    #[test]
    fn default_calibration_is_safe_without_warnings() {
        let r = check(&Config::default());
        assert!(r.is_safe(), "{:?}", r.problems());
        assert_eq!(r.warnings, 0, "{:?}", r.warning_lines());
        let agent = line(&r, "agent-device");
        assert_eq!(agent.status, Status::Ok);
        assert_eq!(agent.headroom(), Some(10.0));
        assert_eq!(agent.worst_refused(), Some(Some(2.0)));
        assert_eq!(line(&r, "enrollment").loads[0].burst, Some(250));
        assert_eq!(line(&r, "key-rotation").status, Status::Unloaded);
    }

    #[test]
    fn one_dashboard_load_six_requests_every_ten_seconds() {
        assert_eq!(traffic::DASHBOARD_REQUESTS_PER_POLL, 6);
        let every = |s| std::num::NonZeroU64::new(s).expect("positive");
        assert_eq!(traffic::dashboard_per_minute(every(10)), 36.0);
        assert_eq!(traffic::dashboard_per_minute(every(15)), 24.0);
        assert_eq!(traffic::dashboard_per_minute(every(1)), 360.0);
        let r = check(&Config::default());
        assert_eq!(r.dashboards.requests_per_poll, 6);
        assert_eq!(r.dashboards.per_analyst_per_minute, 36.0);
        let r = check(&load(OIDC));
        assert_eq!(line(&r, "ui").loads[0].per_minute, Some(36.0));
    }

    #[test]
    fn without_a_verifier_the_analysts_share_one_ip_bucket_at_risk() {
        let cfg = Config::default();
        assert!(!cfg.identity.verifies());
        let r = check(&cfg);
        assert!(!r.dashboards.verified_users);
        let ui = line(&r, "ui");
        assert_eq!(ui.status, Status::AtRisk);
        let load = &ui.loads[0];
        assert_eq!(load.workload, Workload::Dashboards);
        assert_eq!((load.sharers, load.per_minute), (20, Some(720.0)));
        assert!(load.ip_fallback);
        assert_eq!(load.describe, "dashboards: 720/min, 20 analysts on one IP");
        // At risk, not unsafe: the report is safe, and `serve` admits it with a warning.
        assert!(r.is_safe() && r.is_at_risk());
        assert_eq!((r.unsafe_limiters, r.at_risk, r.warnings), (0, 1, 0));
        let risks = r.risk_lines();
        assert_eq!(risks.len(), 1, "{risks:?}");
        for needle in [
            "ui: keyed on the IP: no token verifier is configured",
            "the 20 analysts behind one NAT share one bucket and ask 720/min of its refill of 66.7/min (36/min each)",
            "[identity]",
            "FLEET_LIMITER_JWKS_URL",
            "docs/identity/",
        ] {
            assert!(risks[0].contains(needle), "{needle}: {}", risks[0]);
        }
        let admitted = admit(&cfg, false).unwrap();
        assert_eq!(admitted.warnings, risks);
        assert!(admitted.overridden.is_empty());
        // JSON: the verdict and the flag are additions beside the existing fields.
        let v: serde_json::Value =
            serde_json::from_str(&crate::calibration::report::json(&r)).unwrap();
        assert_eq!(v["at_risk"], 1);
        assert_eq!(v["unsafe_limiters"], 0);
        assert_eq!(v["dashboards"]["verified_users"], false);
        let ui = v["limiters"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["name"] == "ui")
            .unwrap();
        assert_eq!(ui["status"], "at-risk");
        assert_eq!(ui["loads"][0]["ip_fallback"], true);
    }

    #[test]
    fn with_a_verifier_each_analyst_has_their_own_bucket() {
        let cfg = load(OIDC);
        assert!(cfg.identity.verifies());
        let r = check(&cfg);
        assert!(r.dashboards.verified_users);
        let ui = line(&r, "ui");
        assert_eq!(ui.status, Status::Ok);
        let load = &ui.loads[0];
        assert_eq!((load.sharers, load.per_minute), (1, Some(36.0)));
        assert!(!load.ip_fallback);
        assert_eq!(load.describe, "dashboards: 36/min per verified analyst");
        assert!(!r.is_at_risk() && r.is_safe());
        assert_eq!(r.warnings, 0, "{:?}", r.warning_lines());
        assert!(admit(&cfg, false).unwrap().warnings.is_empty());
    }

    #[test]
    fn a_dashboard_its_own_bucket_cannot_carry_is_unsafe_either_way() {
        // One analyst alone asks 360/min of a refill of 40/min: a verifier would not help.
        let slow = [
            ("FLEET_LIMITER_DASHBOARD_POLL_SECONDS", "1"),
            ("FLEET_LIMITER_LIMITER_UI_LIMIT", "600"),
        ];
        let r = check(&load(&slow));
        assert_eq!(line(&r, "ui").status, Status::Unsafe);
        assert!(!r.is_at_risk());
        let with_oidc: Vec<_> = slow.iter().chain(OIDC).copied().collect();
        let r = check(&load(&with_oidc));
        assert_eq!(line(&r, "ui").status, Status::Unsafe);
        assert!(
            r.problems()[0].contains("slower than the declared cadence of 360/min"),
            "{:?}",
            r.problems()
        );
    }

    #[test]
    fn ip_keyed_dashboards_that_fit_or_are_not_enforced_are_not_at_risk() {
        // One analyst per NAT shares with nobody.
        let r = check(&load(&[("FLEET_LIMITER_ANALYSTS_PER_NAT", "1")]));
        assert_eq!(line(&r, "ui").status, Status::Ok);
        // A budget the whole NAT fits in.
        let r = check(&load(&[("FLEET_LIMITER_LIMITER_UI_LIMIT", "11000")]));
        assert_eq!(line(&r, "ui").status, Status::Ok);
        assert!(line(&r, "ui").loads[0].ip_fallback);
        // Shadow mode only warns; off is never consulted.
        let r = check(&load(&[("FLEET_LIMITER_LIMITER_UI_MODE", "shadow")]));
        let ui = line(&r, "ui");
        assert_eq!(ui.status, Status::Warning);
        assert!(ui.reasons[0]
            .starts_with("in shadow mode, so not enforced; once enforced: keyed on the IP"));
        assert_eq!((r.at_risk, r.warnings), (0, 1));
        let r = check(&load(&[("FLEET_LIMITER_LIMITER_UI_MODE", "off")]));
        assert_eq!(line(&r, "ui").status, Status::Off);
        assert!(r.risk_lines().is_empty() && r.problems().is_empty());
    }

    #[test]
    fn an_unsafe_limiter_keeps_its_at_risk_reason_apart() {
        // ui both at risk (shared IP) and unsafe (the CLI's device flow on the same limiter).
        let r = check(&load(&[
            ("FLEET_LIMITER_LIMITER_UI_ROUTES", "/api/**"),
            ("FLEET_LIMITER_LIMITER_UI_EXCEPT", "/api/agent/**"),
            ("FLEET_LIMITER_LIMITER_UI_KEY", "user-or-ip"),
            ("FLEET_LIMITER_LIMITER_UI_LIMIT", "10"),
            ("FLEET_LIMITER_LIMITER_UI_WINDOW", "1m"),
            ("FLEET_LIMITER_ANALYSTS_PER_NAT", "2"),
            ("FLEET_LIMITER_DASHBOARD_POLL_SECONDS", "60"),
        ]));
        let ui = line(&r, "ui");
        assert_eq!(ui.status, Status::Unsafe, "{:?}", ui.reasons);
        assert!(
            r.risk_lines().iter().all(|l| l.contains("keyed on the IP")),
            "{:?}",
            r.risk_lines()
        );
        assert!(
            r.problems().iter().all(|l| !l.contains("keyed on the IP")),
            "{:?}",
            r.problems()
        );
    }

    #[test]
    fn long_window_lockout_is_unsafe() {
        let r = check(&load(&[
            ("FLEET_LIMITER_LIMITER_AGENT_DEVICE_LIMIT", "100"),
            ("FLEET_LIMITER_LIMITER_AGENT_DEVICE_WINDOW", "15m"),
            (
                "FLEET_LIMITER_LIMITER_AGENT_DEVICE_ALGORITHM",
                "fixed-window",
            ),
        ]));
        let agent = line(&r, "agent-device");
        assert_eq!(agent.status, Status::Unsafe);
        assert!(
            agent.reasons[0].contains("heartbeat_timeout_seconds = 180"),
            "{:?}",
            agent.reasons
        );
        assert!(!r.is_safe());
    }

    #[test]
    fn ip_keyed_agent_budget_refills_slower_than_the_fleet() {
        let r = check(&load(&[("FLEET_LIMITER_LIMITER_AGENT_DEVICE_KEY", "ip")]));
        let agent = line(&r, "agent-device");
        assert_eq!(agent.status, Status::Unsafe);
        assert!(agent.reasons[0].contains("slower than the agents' idle cadence"));
        assert_eq!(agent.loads[0].sharers, 250);
    }

    #[test]
    fn small_enrollment_budget_cannot_take_a_rollout() {
        let r = check(&load(&[("FLEET_LIMITER_LIMITER_ENROLLMENT_LIMIT", "5")]));
        let e = line(&r, "enrollment");
        assert_eq!(e.status, Status::Unsafe);
        assert!(
            e.reasons[0].contains("cannot admit max_site_endpoints = 250"),
            "{:?}",
            e.reasons
        );
        // A smaller site fits.
        let r = check(&load(&[
            ("FLEET_LIMITER_LIMITER_ENROLLMENT_LIMIT", "5"),
            ("FLEET_LIMITER_MAX_SITE_ENDPOINTS", "5"),
        ]));
        assert_eq!(line(&r, "enrollment").status, Status::Ok);
    }

    #[test]
    fn extreme_fleet_settings_do_not_panic() {
        for v in [std::num::NonZeroU64::MIN, std::num::NonZeroU64::MAX] {
            let cfg = Config {
                fleet: FleetConfig {
                    heartbeat_interval_seconds: v,
                    poll_interval_seconds: v,
                    heartbeat_timeout_seconds: v,
                    max_site_endpoints: v,
                    dashboard_poll_seconds: v,
                    analysts_per_nat: v,
                    max_agents: v,
                },
                ..Config::default()
            };
            let r = check(&cfg);
            assert_eq!(r.limiters.len(), cfg.limiters.len());
            let _ = crate::calibration::report::check_table(&r);
            let _ = crate::calibration::report::json(&r);
        }
        // A heartbeat timeout of one second can never be met.
        let mut cfg = Config::default();
        cfg.fleet.heartbeat_timeout_seconds = std::num::NonZeroU64::MIN;
        assert!(!check(&cfg).is_safe());
    }

    #[test]
    fn shadow_mode_demotes_to_a_warning_and_off_is_reported() {
        let r = check(&load(&[
            ("FLEET_LIMITER_LIMITER_ENROLLMENT_LIMIT", "5"),
            ("FLEET_LIMITER_LIMITER_ENROLLMENT_MODE", "shadow"),
            ("FLEET_LIMITER_LIMITER_KEY_ROTATION_MODE", "off"),
        ]));
        assert!(r.is_safe());
        let e = line(&r, "enrollment");
        assert_eq!((e.status, e.mode), (Status::Warning, "shadow"));
        assert!(e.reasons[0]
            .starts_with("in shadow mode, so not enforced; once enforced: cannot admit"));
        assert_eq!(line(&r, "key-rotation").status, Status::Off);
    }

    #[test]
    fn disabled_limiting_starts_whatever_the_calibration() {
        let cfg = load(&[
            ("FLEET_LIMITER_LIMITER_ENROLLMENT_LIMIT", "5"),
            ("FLEET_LIMITER_ENABLED", "false"),
        ]);
        assert!(!check(&cfg).enabled);
        assert!(admit(&cfg, false).is_ok());
        let cfg = load(&[("FLEET_LIMITER_LIMITER_ENROLLMENT_LIMIT", "5")]);
        let refusal = admit(&cfg, false).unwrap_err();
        assert_eq!(refusal.problems.len(), 1, "{refusal:?}");
        assert!(
            refusal.problems[0].starts_with("enrollment: "),
            "{refusal:?}"
        );
        let admitted = admit(&cfg, true).unwrap();
        assert_eq!(admitted.overridden, refusal.problems);
    }

    #[test]
    fn thin_headroom_warns_but_passes() {
        let r = check(&load(&[("FLEET_LIMITER_LIMITER_AGENT_DEVICE_LIMIT", "12")]));
        assert!(r.is_safe());
        assert_eq!(line(&r, "agent-device").status, Status::Warning);
        // The agent-ip ceiling meters new agent ids: agent-device's budget does not thin it.
        assert_eq!(line(&r, "agent-ip").status, Status::Ok);
        assert_eq!(r.warnings, 1);
    }

    #[test]
    fn dashboard_and_device_poll_cadences_must_fit() {
        let r = check(&load(&[
            ("FLEET_LIMITER_LIMITER_UI_LIMIT", "60"),
            ("FLEET_LIMITER_LIMITER_CLI_DEVICE_POLL_LIMIT", "6"),
        ]));
        assert_eq!(line(&r, "ui").status, Status::Unsafe);
        assert_eq!(line(&r, "cli-device-poll").status, Status::Unsafe);
        assert_eq!(r.unsafe_limiters, 2);
    }
}
