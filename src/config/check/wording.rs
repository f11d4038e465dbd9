//! The sentences `check` writes: each [`Finding`] and each load in words.

use super::findings::Finding;
use super::fmt_secs;
use super::types::Workload;

/// A rate as `36/min` or `66.7/min`.
pub(crate) fn fmt_rate(per_min: f64) -> String {
    if (per_min - per_min.round()).abs() < 0.05 {
        format!("{}/min", per_min.round() as u64)
    } else {
        format!("{per_min:.1}/min")
    }
}

/// `per agent`, or `250 agents share`.
pub(super) fn per_bucket(sharers: u64, unit: &str) -> String {
    if sharers == 1 {
        format!("per {unit}")
    } else {
        format!("{sharers} {unit}s share")
    }
}

/// A steady load: `agent idle: 3/min per agent`, `dashboards: 720/min, 20 analysts on one IP`.
pub(super) fn steady(
    workload: Workload,
    amount: f64,
    sharers: u64,
    unit: &str,
    ip_fallback: bool,
) -> String {
    if sharers == 1 {
        format!(
            "{}: {} {}",
            workload.label(),
            fmt_rate(amount),
            per_bucket(sharers, unit)
        )
    } else if ip_fallback {
        format!(
            "{}: {}, {sharers} {unit}s on one IP",
            workload.label(),
            fmt_rate(amount)
        )
    } else {
        format!(
            "{}: {}, {}",
            workload.label(),
            fmt_rate(amount),
            per_bucket(sharers, unit)
        )
    }
}

/// A burst: `rollout: 250 at once, 250 endpoints share`, `new ids: 250 at once, …`.
pub(super) fn burst(
    workload: Workload,
    burst: u64,
    sharers: u64,
    per_bucket: &str,
    new_agents: bool,
) -> String {
    if new_agents && workload == Workload::AgentIdle {
        format!("new ids: {burst} at once, {per_bucket}")
    } else if sharers == 1 {
        format!("{}: {burst} {per_bucket}", workload.label())
    } else {
        format!("{}: {burst} at once, {per_bucket}", workload.label())
    }
}

/// A finding of a limiter in shadow mode.
pub(super) fn in_shadow(reason: &str) -> String {
    format!("in shadow mode, so not enforced; once enforced: {reason}")
}

impl Finding {
    /// The finding as `check` prints it after the limiter's name.
    pub(super) fn sentence(&self) -> String {
        match self {
            Finding::TableProtected {
                protected,
                capacity,
                max_agents,
            } => format!(
                "the known-agents table keeps {protected} agents seen twice (half of store.max_keys = {capacity}), fewer than fleet.max_agents = {max_agents}: once others crowd it, the rest are metered as new on every request; set store.max_keys to at least {}",
                max_agents.saturating_mul(2)
            ),
            Finding::TableProbation {
                probation,
                capacity,
                site,
            } => format!(
                "the known-agents table keeps {probation} first sightings (half of store.max_keys = {capacity}), room for fewer than two sites of max_site_endpoints = {site}: one other address minting new ids can crowd out a new site's; set store.max_keys to at least {}",
                site.saturating_mul(4)
            ),
            Finding::MaxKnown { max_known, site } => format!(
                "remembers {max_known} agents per IP, fewer than max_site_endpoints = {site}: the rest are metered as new on every request"
            ),
            Finding::NothingFits { cost, limit } => format!(
                "each request costs {cost}, more than limit = {limit}: no request can ever pass; lower the cost to at most the limit"
            ),
            Finding::KnownFor { known_for, gap } => format!(
                "forgets an agent after known_for = {}, not longer than its {gap}s between requests: healthy agents are metered as new on every request",
                fmt_secs(known_for.as_secs_f64())
            ),
            Finding::SharedIp {
                sharers,
                unit,
                amount,
                refill,
                workload,
            } => format!(
                "keyed on the IP: no token verifier is configured, so the {sharers} {unit}s behind one NAT share one bucket and ask {} of its refill of {} ({} each): their {label} will be refused once it runs dry. Configure [identity] (identity.jwks_url, identity.jwt_public_key_pem or identity.jwt_hs256_secret; FLEET_LIMITER_JWKS_URL, FLEET_LIMITER_JWT_PUBLIC_KEY_PEM or FLEET_LIMITER_JWT_HS256_SECRET) so each {unit} is a verified user with a budget of their own: docs/identity/",
                fmt_rate(*amount),
                fmt_rate(*refill),
                fmt_rate(amount / *sharers as f64),
                label = workload.label(),
            ),
            Finding::RefillTooSlow {
                refill,
                amount,
                workload,
                per_bucket,
            } => {
                let what = if *workload == Workload::AgentIdle {
                    "the agents' idle cadence"
                } else {
                    "the declared cadence"
                };
                format!(
                    "refills {} per bucket, slower than {what} of {} ({}, {per_bucket}): clients at that cadence are refused without end",
                    fmt_rate(*refill),
                    fmt_rate(*amount),
                    workload.label()
                )
            }
            Finding::HeartbeatGap {
                wait,
                gap,
                carries_heartbeat,
                timeout,
            } => {
                let how = if *carries_heartbeat {
                    format!(
                        "a refused agent can wait {} for its heartbeat, so {} can pass between heartbeats",
                        fmt_secs(*wait),
                        fmt_secs(*gap)
                    )
                } else {
                    format!("a refused agent can wait {}", fmt_secs(*wait))
                };
                format!(
                    "{how}, not under heartbeat_timeout_seconds = {timeout}: the backend would mark healthy agents offline"
                )
            }
            Finding::Discloses { key } => format!(
                "keyed on `{key}`, what a request targets rather than who sends it, and its answers name it (disclose is on): a client can tell its refusal from the address limiter's, and once the two budgets differ that tells which targets exist; set disclose = false"
            ),
            Finding::ThinHeadroom { headroom } => format!(
                "headroom over the agents' idle cadence is {headroom:.1}x, under {:.0}x: task-result bursts will meet refusals",
                super::MIN_IDLE_HEADROOM
            ),
            Finding::Burst {
                site,
                limit,
                burst,
                worst,
            } => format!(
                "cannot admit max_site_endpoints = {site} in one burst: the bucket holds {limit} of the {burst} requests, and the last waits {}",
                fmt_secs(*worst)
            ),
        }
    }
}
