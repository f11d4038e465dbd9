//! A configured limiter, ready to match requests: whom it applies to, how it meters and counts,
//! what one request costs, and what it does when the store fails.

use super::routes::{RoutePattern, Specificity};
use crate::identity::Credential;
use crate::keys::KeyKind;
use crate::limiter::Quota;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::num::NonZeroU32;
use std::sync::Arc;

/// Which credentials a limiter applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum CredentialMatch {
    #[default]
    Any,
    ApiKey,
    CliToken,
}

impl CredentialMatch {
    pub fn admits(self, c: Credential) -> bool {
        match self {
            CredentialMatch::Any => true,
            CredentialMatch::ApiKey => c == Credential::ApiKey,
            CredentialMatch::CliToken => c == Credential::CliToken,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            CredentialMatch::Any => "any",
            CredentialMatch::ApiKey => "api-key",
            CredentialMatch::CliToken => "cli-token",
        }
    }
}

/// What a limiter does with its decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Refuse over-budget requests with 429.
    #[default]
    Enforce,
    /// Decide, count and report, but forward the request anyway.
    Shadow,
    /// Not consulted at all.
    Off,
}

impl Mode {
    /// The name configuration, metrics and reports use: `enforce`, `shadow`, `off`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Enforce => "enforce",
            Mode::Shadow => "shadow",
            Mode::Off => "off",
        }
    }
}

/// What a limiter meters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Meter {
    /// Every request it applies to.
    #[default]
    Requests,
    /// Only requests from agent ids it has not admitted at that IP within `known_for`
    /// (see `known_agents`); a known agent skips it. For `ip`-keyed ceilings.
    NewAgents,
}

impl Meter {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Meter::Requests => "requests",
            Meter::NewAgents => "new-agents",
        }
    }
}

/// How long a `new-agents` limiter remembers an admitted agent id, and how many it remembers
/// per address (an IPv4 address or an IPv6 /56, see `known_agents`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Remember {
    pub known_for: std::time::Duration,
    pub max_known: u32,
}

/// The answer when the store cannot decide.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum OnStoreError {
    /// Let the request through, unmetered.
    #[default]
    Allow,
    /// Refuse it (429, `Retry-After` of one emission interval).
    Deny,
    /// Decide on this instance's own buckets (the store's local ones, see
    /// `crate::store::Store::decide_locally`): the same quota, but each instance grants it alone.
    Local,
}

impl OnStoreError {
    /// The name configuration and `/readyz` use: `allow`, `deny`, `local`.
    pub fn as_str(self) -> &'static str {
        match self {
            OnStoreError::Allow => "allow",
            OnStoreError::Deny => "deny",
            OnStoreError::Local => "local",
        }
    }
}

/// Which answers a limiter counts. Every request is admitted against the bucket as usual; an
/// answer this says should not have counted is given back once its status is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Count {
    /// Every admitted request counts.
    #[default]
    All,
    /// Only answers whose status is in `failed_statuses` count (failed logins, bad keys).
    Failed,
    /// Only answers whose status is not in `failed_statuses` count.
    Succeeded,
}

impl Count {
    /// The name configuration and metrics use: `all`, `failed`, `succeeded`.
    pub fn as_str(self) -> &'static str {
        match self {
            Count::All => "all",
            Count::Failed => "failed",
            Count::Succeeded => "succeeded",
        }
    }
}

/// The statuses that make an answer failed: inclusive ranges of status codes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusRanges(pub Vec<(u16, u16)>);

impl Default for StatusRanges {
    /// 400 and above.
    fn default() -> Self {
        Self(vec![(400, 999)])
    }
}

impl StatusRanges {
    pub fn contains(&self, status: u16) -> bool {
        self.0.iter().any(|&(lo, hi)| lo <= status && status <= hi)
    }

    /// `400-499` or `503`: a status code from 100 to 999, or an inclusive range of them.
    pub fn parse_item(s: &str) -> Result<(u16, u16), String> {
        let code = |t: &str| -> Result<u16, String> {
            let t = t.trim();
            match t.parse::<u16>() {
                Ok(n) if (100..=999).contains(&n) && t.bytes().all(|b| b.is_ascii_digit()) => Ok(n),
                _ => Err(format!(
                    "`{s}` is not a status code; use a code from 100 to 999 (503) or a range (\"400-499\")"
                )),
            }
        };
        match s.split_once('-') {
            Some((a, b)) => {
                let (lo, hi) = (code(a)?, code(b)?);
                if lo > hi {
                    return Err(format!(
                        "`{s}` runs backwards; write the lower code first (\"{hi}-{lo}\")"
                    ));
                }
                Ok((lo, hi))
            }
            None => code(s).map(|c| (c, c)),
        }
    }
}

impl fmt::Display for StatusRanges {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (lo, hi)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            if lo == hi {
                write!(f, "{lo}")?;
            } else {
                write!(f, "{lo}-{hi}")?;
            }
        }
        Ok(())
    }
}

/// What one request costs a limiter's bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cost {
    /// Always this many units (`cost = N`; 1 by default).
    Fixed(NonZeroU32),
    /// What the request's header says (`cost_header`), capped at `max` (`cost_max`).
    Header { name: Arc<str>, max: NonZeroU32 },
}

impl Default for Cost {
    fn default() -> Self {
        Cost::Fixed(NonZeroU32::MIN)
    }
}

impl Cost {
    /// The units a request costs, given the value of the cost header (`None` when it was not
    /// sent). A header cost: absent, 1; a positive whole number (ASCII digits, surrounding
    /// spaces ignored), that number capped at `max`; anything else (empty, zero, negative, a
    /// sign, a fraction, non-ASCII, sent more than once), `max`: a client that says nothing
    /// sensible pays the most, never less than an honest one.
    pub fn of(&self, value: Option<&[u8]>) -> NonZeroU32 {
        match self {
            Cost::Fixed(n) => *n,
            Cost::Header { max, .. } => {
                let max = *max;
                let Some(v) = value else {
                    return NonZeroU32::MIN;
                };
                let v = v.trim_ascii();
                if v.is_empty() || !v.iter().all(u8::is_ascii_digit) {
                    return max;
                }
                let n = v.iter().fold(0u64, |n, d| {
                    n.saturating_mul(10).saturating_add(u64::from(d - b'0'))
                });
                let n = NonZeroU32::new(u32::try_from(n).unwrap_or(u32::MAX));
                n.map_or(max, |n| n.min(max))
            }
        }
    }

    /// The header a request's cost is read from, if any.
    pub fn header(&self) -> Option<&str> {
        match self {
            Cost::Fixed(_) => None,
            Cost::Header { name, .. } => Some(name),
        }
    }
}

/// One configured limiter, ready to match requests.
#[derive(Debug, Clone, PartialEq)]
pub struct LimiterSpec {
    pub name: Arc<str>,
    pub quota: Quota,
    pub key: KeyKind,
    pub routes: Vec<RoutePattern>,
    pub except: Vec<RoutePattern>,
    pub group: Arc<str>,
    pub credential: CredentialMatch,
    pub mode: Mode,
    pub on_store_error: OnStoreError,
    /// `Some` for a `meter = "new-agents"` limiter: known agents skip it.
    pub new_agents: Option<Remember>,
    /// What one request costs this limiter's bucket.
    pub cost: Cost,
    /// Which answers count; the others are given back.
    pub count: Count,
    /// The statuses `count` reads as failed.
    pub failed_statuses: StatusRanges,
    /// Whether answers name this limiter (`disclose`, on by default): its entries in the limit
    /// headers, and which limiter a refusal came from. Off, the limiter is absent from every
    /// limit header, and a refusal it takes part in carries `Retry-After` and the generic
    /// problem document only.
    pub disclose: bool,
    /// Budgets chosen by a claim of the verified token (`plan_claim`, `[limiters.<name>.plans]`).
    pub plans: Option<Arc<Plans>>,
}

/// A limiter's budgets by plan: the verified token's `claim` names the plan; a plan not listed,
/// or no verified token, keeps the limiter's own budget.
#[derive(Debug, Clone, PartialEq)]
pub struct Plans {
    pub claim: Arc<str>,
    pub quotas: Vec<(Box<str>, Quota)>,
}

impl Plans {
    /// The quota of the plan the claims name, if they name a listed one.
    pub fn quota(&self, claims: &crate::identity::TokenClaims) -> Option<&Quota> {
        let plan = claims.get(&self.claim)?;
        self.quotas
            .iter()
            .find(|(name, _)| &**name == plan)
            .map(|(_, q)| q)
    }
}

impl LimiterSpec {
    /// Whether an admitted request answered with `status` is given back: it should not have
    /// counted.
    pub fn gives_back(&self, status: u16) -> bool {
        match self.count {
            Count::All => false,
            Count::Failed => !self.failed_statuses.contains(status),
            Count::Succeeded => self.failed_statuses.contains(status),
        }
    }

    /// The specificity of this limiter's best route for the request, or `None` if it does not apply.
    pub(super) fn matches(
        &self,
        method: &str,
        segs: &[&str],
        cred: Credential,
    ) -> Option<Specificity> {
        if self.mode == Mode::Off || !self.credential.admits(cred) {
            return None;
        }
        if self.except.iter().any(|p| p.matches(method, segs)) {
            return None;
        }
        self.routes
            .iter()
            .filter(|p| p.matches(method, segs))
            .map(RoutePattern::specificity)
            .max()
    }

    /// The id an `ip+path:<name>` limiter keys a request of `method` on the canonical `path` on:
    /// the segment standing where `{name}` does in the most specific of its routes that matches,
    /// if it counts as an id ([`crate::keys::valid_path_id`]). `None` for another key kind, a
    /// path none of its routes matches, or a segment that is no id (the request then keys on
    /// its address).
    pub(crate) fn path_id<'p>(&self, method: &str, path: &'p str) -> Option<&'p str> {
        let name = self.key.path_param()?;
        let segs: smallvec::SmallVec<[&str; 16]> =
            path.split('/').filter(|s| !s.is_empty()).collect();
        let mut best: Option<(Specificity, &'p str)> = None;
        for r in &self.routes {
            if let Some(v) = r.param(name, method, &segs) {
                let spec = r.specificity();
                if best.is_none_or(|(b, _)| spec > b) {
                    best = Some((spec, v));
                }
            }
        }
        best.and_then(|(_, v)| crate::keys::valid_path_id(v))
    }
}
