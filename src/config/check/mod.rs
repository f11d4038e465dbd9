//! The heartbeat-aware check: does each limiter carry the traffic a healthy fleet declares?
//!
//! The fleet settings declare four workloads. For each, the configured [`Policy`](crate::policy::Policy) says which
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
//!
//! The code follows the mechanisms: [`types`] holds what the report says, `workload` the
//! declared fleet and whose bucket each request lands in, `judge` the arithmetic of a verdict
//! and `wording` its sentences, `suggest` the smallest change the judge accepts, `admission` the rule `serve` and every reload apply.

mod admission;
mod findings;
mod judge;
mod line;
pub(crate) mod routes;
mod suggest;
pub(crate) mod traffic;
pub(crate) mod types;
mod wording;
mod workload;

pub(crate) use admission::{admit, Admitted, Refusal};
pub(crate) use types::{CheckReport, Dashboards, KnownTable, LimiterCheck, Status};
pub(crate) use wording::fmt_rate;

#[cfg(doc)]
use crate::config::identity::IdentityConfig;
use crate::config::Config;
use crate::policy::Mode;

/// Headroom over the agents' idle cadence under which `check` warns.
pub(crate) const MIN_IDLE_HEADROOM: f64 = 10.0;

/// Why limiter `l` judged by `quota` instead of its own would be unsafe for the declared
/// fleet (an override's or a plan's budget), or `None` when it would not be.
pub(crate) fn judge_quota(
    cfg: &Config,
    l: &crate::policy::LimiterSpec,
    quota: &crate::limiter::Quota,
) -> Option<String> {
    let model = workload::Model::new(cfg);
    let table = KnownTable::of(cfg);
    unsafe_with(l, quota, &model, &table)
}

fn unsafe_with(
    l: &crate::policy::LimiterSpec,
    quota: &crate::limiter::Quota,
    model: &workload::Model,
    table: &KnownTable,
) -> Option<String> {
    let mut variant = l.clone();
    variant.quota = *quota;
    let judged = line::line(&variant, model, table);
    (judged.status == Status::Unsafe).then(|| {
        judged
            .reasons
            .iter()
            .zip(&judged.reason_status)
            .filter(|(_, s)| **s == Status::Unsafe)
            .map(|(r, _)| r.as_str())
            .collect::<Vec<_>>()
            .join("; ")
    })
}

/// Run the check on a configuration.
pub(crate) fn check(cfg: &Config) -> CheckReport {
    let fleet = cfg.fleet.clone();
    let verified = cfg.identity.verifies();
    let model = workload::Model::new(cfg);
    let table = KnownTable::of(cfg);
    let mut limiters: Vec<LimiterCheck> = cfg
        .limiters
        .iter()
        .map(|l| line::line(l, &model, &table))
        .collect();
    // A budget an override or a plan puts in the limiter's place is judged as the limiter would
    // be: the principals it matches meet it instead.
    for (l, line) in cfg.limiters.iter().zip(limiters.iter_mut()) {
        let mut others: Vec<(String, crate::limiter::Quota)> = cfg
            .overrides
            .iter()
            .filter(|o| *o.limiter == *l.name)
            .map(|o| {
                (
                    format!("override {} ({})", o.id, o.matcher),
                    o.quota(&l.quota),
                )
            })
            .collect();
        if let Some(p) = &l.plans {
            others.extend(
                p.quotas
                    .iter()
                    .map(|(name, q)| (format!("plan {name} ({} = {name})", p.claim), *q)),
            );
        }
        for (what, q) in others {
            if let Some(why) = unsafe_with(l, &q, &model, &table) {
                line.reasons.push(format!(
                    "{what}: {} per {} would be unsafe: {why}",
                    q.limit(),
                    fmt_secs(q.window().as_secs_f64())
                ));
                line.reason_status.push(Status::Unsafe);
                line.status = Status::Unsafe;
            }
        }
    }
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
    let mut store_down = types::StoreDown::default();
    if cfg.store.backend == crate::config::StoreBackend::Redis {
        for l in cfg.limiters.iter().filter(|l| l.mode != Mode::Off) {
            let list = match l.on_store_error {
                crate::policy::OnStoreError::Allow => &mut store_down.allow,
                crate::policy::OnStoreError::Deny => &mut store_down.deny,
                crate::policy::OnStoreError::Local => &mut store_down.local,
            };
            list.push(l.name.to_string());
        }
    }
    CheckReport {
        config: cfg.source.clone(),
        enabled: cfg.enabled,
        store: cfg.store.describe(),
        store_down,
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
        shaping: types::ShapingCheck::of(cfg),
        rls: rls_rules(cfg),
        routes: routes::RouteMap::default(),
        route_warnings: Vec::new(),
    }
}

/// The RLS rules, each with how it is judged: a `fleet_limiter` rule is its limiter, judged in
/// the table like any; a rule of the YAML's own meters Envoy's descriptors, which no declared
/// workload of the fleet reaches, so there is nothing to judge it against.
fn rls_rules(cfg: &Config) -> Vec<types::RlsRuleCheck> {
    use crate::rls_rules::Limit;
    cfg.rls
        .domains
        .rules()
        .iter()
        .map(|r| {
            let (budget, key, fleet_limiter, judged) = match &r.limit {
                Limit::Unlimited => (
                    "unlimited".to_owned(),
                    "-".to_owned(),
                    None,
                    "always OK".to_owned(),
                ),
                Limit::Nothing(unit) => (
                    format!("0 / 1 {}", unit.as_str()),
                    "-".to_owned(),
                    None,
                    "always OVER_LIMIT".to_owned(),
                ),
                Limit::Limiter { spec, mapped, .. } => {
                    let budget = format!(
                        "{} / {} {}",
                        spec.quota.limit(),
                        fmt_secs(spec.quota.window().as_secs_f64()),
                        spec.quota.algorithm.as_str()
                    );
                    if *mapped {
                        (
                            budget,
                            spec.key.to_string(),
                            Some(spec.name.to_string()),
                            format!("as limiter {} above (one budget)", spec.name),
                        )
                    } else {
                        (
                            budget,
                            "descriptor".to_owned(),
                            None,
                            "not judged: Envoy's descriptors, no declared workload".to_owned(),
                        )
                    }
                }
            };
            types::RlsRuleCheck {
                rule: r.path.to_string(),
                budget,
                key,
                shadow: r.shadow,
                fleet_limiter,
                judged,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests;

/// A duration in seconds as `500ms`, `2s`, `1m30s`, `15m`, `2h5m`.
pub(crate) fn fmt_secs(secs: f64) -> String {
    if !secs.is_finite() {
        return "unbounded".to_owned();
    }
    if secs < 1.0 && secs > 0.0 {
        return format!("{}ms", (secs * 1000.0).round() as u64);
    }
    let s = secs.round() as u64;
    let (h, m, s) = (s / 3600, (s % 3600) / 60, s % 60);
    match (h, m, s) {
        (0, 0, s) => format!("{s}s"),
        (0, m, 0) => format!("{m}m"),
        (0, m, s) => format!("{m}m{s}s"),
        (h, 0, 0) => format!("{h}h"),
        (h, m, 0) => format!("{h}h{m}m"),
        (h, m, s) => format!("{h}h{m}m{s}s"),
    }
}
