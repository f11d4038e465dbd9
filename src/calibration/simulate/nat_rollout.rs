//! `nat-rollout`: the afternoon an operator lifts one NAT's enrollment budget. 2 000 endpoints
//! behind one NAT download and enroll as in `rollout` (starting within five minutes, retrying
//! after each `Retry-After`), once on the configuration as it is and once with an override for
//! that NAT: ten times the budget of every address-keyed limiter the rollout's requests meet,
//! expiring four hours after the rollout starts, as an operator would add with
//! `fleet-limiter override add --match ip:203.0.113.10 ... --expires ...`.

use super::rollout::{run_endpoints, RolloutReport};
use super::SITE_NAT;
use crate::calibration::traffic;
use crate::config::Config;
use crate::identity::Credential;
use crate::keys::KeyKind;
use crate::overrides::{Override, Source, Wire};
use crate::path::CanonicalPath;
use crate::policy::{Mode, Policy};
use serde::Serialize;

/// Endpoints behind the NAT.
pub(crate) const ENDPOINTS: usize = 2_000;
/// How much the override raises each budget.
pub(crate) const RAISE: u32 = 10;
/// How long after the rollout starts the override expires.
pub(crate) const EXPIRES_AFTER_SECONDS: u64 = 4 * 3600;

#[derive(Debug, Clone, Serialize)]
pub struct NatRolloutReport {
    pub scenario: &'static str,
    pub endpoints: u64,
    /// The overrides added for the NAT, as `override list` shows them.
    pub overrides: Vec<String>,
    /// The rollout on the configuration as it is.
    pub default_budget: RolloutReport,
    /// The same rollout with the overrides in force.
    pub with_override: RolloutReport,
}

/// The overrides for the NAT: one per enforcing address-keyed limiter the rollout's requests
/// meet, ten times its budget over the same window, until [`EXPIRES_AFTER_SECONDS`].
pub(crate) fn overrides_for_nat(cfg: &Config) -> Vec<Override> {
    let policy = Policy::new(cfg.limiters.clone());
    let mut names: Vec<usize> = Vec::new();
    for route in [traffic::DOWNLOAD, traffic::ENROLL] {
        let path = CanonicalPath::of_static(route.1);
        for i in policy
            .picked(route.0, &path, Credential::None)
            .iter()
            .copied()
        {
            if !names.contains(&i) {
                names.push(i);
            }
        }
    }
    let expires = super::SIM_EPOCH_UNIX + EXPIRES_AFTER_SECONDS;
    names
        .iter()
        .filter_map(|&i| policy.limiters().get(i))
        .filter(|l| l.mode == Mode::Enforce && l.key == KeyKind::Ip)
        .filter_map(|l| {
            let wire = Wire {
                id: Some(format!("nat-{}", l.name)),
                limiter: l.name.to_string(),
                matcher: format!("ip:{SITE_NAT}"),
                limit: u64::from(l.quota.limit().saturating_mul(RAISE)),
                window: crate::duration::format_duration(l.quota.window()),
                expires: Some(crate::overrides::format_rfc3339(expires)),
                source: None,
                by: Some("simulate".to_owned()),
                created: None,
            };
            Override::from_wire(&wire, Source::Admin, super::SIM_EPOCH_UNIX).ok()
        })
        .collect()
}

pub(crate) async fn run(cfg: &Config, seed: u64) -> NatRolloutReport {
    let default_budget = run_endpoints(cfg, seed, ENDPOINTS).await;
    let overrides = overrides_for_nat(cfg);
    let mut lifted = cfg.clone();
    lifted.overrides.extend(overrides.iter().cloned());
    let with_override = run_endpoints(&lifted, seed, ENDPOINTS).await;
    NatRolloutReport {
        scenario: "nat-rollout",
        endpoints: ENDPOINTS as u64,
        overrides: overrides
            .iter()
            .map(|o| {
                format!(
                    "{} {} {} per {} until {}",
                    o.limiter,
                    o.matcher,
                    o.limit,
                    crate::duration::format_duration(o.window),
                    o.expires
                        .map(crate::overrides::format_rfc3339)
                        .unwrap_or_default()
                )
            })
            .collect(),
        default_budget,
        with_override,
    }
}
