//! One request as its limiters see it: the principal each keys on, the units it costs, and
//! the budget it is judged under (an override, the verified token's plan, or the limiter's
//! own); and the step every entry point shares once the store has answered: a refusal charges
//! nothing.

use super::{Chosen, RequestFacts, Settings};
use crate::identity::{self, Identity};
use crate::keys;
use crate::limiter::{Quota, Verdict};
use crate::overrides::{Index, Who};
use crate::policy::LimiterSpec;
use crate::store::Check;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::Arc;

/// One request, read once for all of its limiters.
pub(super) struct Asked<'a, 'r> {
    req: &'a RequestFacts<'r>,
    id: &'a Identity<'r>,
    ip_key: &'a str,
    /// The bearer token's digest, when a limiter keys on it (the raw value goes no further).
    credential: Option<String>,
    /// Whether the peer is a trusted proxy, when a limiter keys on a header it sets.
    from_proxy: bool,
    /// The overrides in force, if any, and the wall clock's seconds they expire by.
    index: Option<Arc<Index>>,
    unix_now: u64,
    who: Who<'a>,
    /// The time the buckets are decided on.
    now: crate::clock::Nanos,
}

impl<'a, 'r> Asked<'a, 'r> {
    /// `req` from `ip` (normalised: `ip_key`), identified as `id`, for `limiters`; `index` the
    /// overrides in force (`unix_now` their wall clock).
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub(super) fn new(
        settings: &Settings,
        req: &'a RequestFacts<'r>,
        id: &'a Identity<'r>,
        ip: IpAddr,
        ip_key: &'a str,
        limiters: &[Arc<LimiterSpec>],
        index: Option<Arc<Index>>,
        unix_now: u64,
        now: crate::clock::Nanos,
    ) -> Self {
        let credential = limiters
            .iter()
            .any(|l| l.key == keys::KeyKind::Credential)
            .then(|| req.authorization.and_then(identity::bearer_token))
            .flatten()
            .map(keys::credential_digest);
        let from_proxy = limiters.iter().any(|l| l.key.header().is_some())
            && settings.trusted.contains(req.peer);
        let who = Who {
            ip,
            agent_id: id.agent_id,
            user: id.user.as_deref(),
            claims: id.claims(),
            body: req.key_headers.bodies(),
        };
        Self {
            req,
            id,
            ip_key,
            credential,
            from_proxy,
            index,
            unix_now,
            who,
            now,
        }
    }

    /// The principal `l` keys on. A header key is read only from a trusted proxy, unless the
    /// limiter reads one clients send themselves.
    #[inline]
    pub(super) fn principal(&self, l: &LimiterSpec) -> keys::Principal<'_> {
        let header_allowed = self.from_proxy || l.key.header_from_any_client();
        keys::Principal {
            ip: self.ip_key,
            agent_id: self.id.agent_id,
            user: self.id.user.as_deref(),
            credential: self.credential.as_deref(),
            header: match (l.key.header(), header_allowed) {
                (Some(name), true) => self
                    .req
                    .key_headers
                    .get(name)
                    .and_then(keys::valid_key_header),
                _ => None,
            },
            body: l
                .key
                .body_field()
                .and_then(|f| self.req.key_headers.body(f)),
            claim: l.key.claim().and_then(|c| self.id.claims().get(c)),
            path: l.path_id(self.req.method, self.req.path.as_str()),
        }
    }

    /// What the request costs `l`.
    #[inline]
    pub(super) fn units(&self, l: &LimiterSpec) -> NonZeroU32 {
        l.cost
            .of(l.cost.header().and_then(|h| self.req.key_headers.get(h)))
    }

    /// An override for the principal, else the verified token's plan, else the limiter's own.
    #[inline]
    pub(super) fn chosen(&self, l: &LimiterSpec) -> Chosen {
        if let Some(o) = self
            .index
            .as_ref()
            .and_then(|ix| ix.find(&l.name, &self.who, self.unix_now))
        {
            return Chosen::Override(o.clone());
        }
        let claims = self.id.claims();
        match l.plans.as_ref().and_then(|p| {
            let plan = claims.get(&p.claim)?;
            p.quota(claims).map(|q| (plan, *q))
        }) {
            Some((plan, q)) => Chosen::Plan(plan.to_owned(), q),
            None => Chosen::Own,
        }
    }

    /// The budget and the bucket's name: an override keeps its principals' buckets apart. A
    /// calendar budget as it stands now: its window the period's own length.
    #[inline]
    pub(super) fn budget(&self, l: &LimiterSpec) -> (Quota, Arc<str>) {
        let (q, bucket) = if self.index.is_none() && l.plans.is_none() {
            (l.quota, l.name.clone())
        } else {
            match self.chosen(l) {
                Chosen::Override(o) => (o.quota(&l.quota), o.bucket.clone()),
                Chosen::Plan(_, q) => (q, l.name.clone()),
                Chosen::Own => (l.quota, l.name.clone()),
            }
        };
        (q.at(self.now), bucket)
    }
}

/// A refused request consumed nothing: when an enforcing check whose verdict counts
/// (`counted`) refuses, the counted buckets that allowed it are reported as they stand, not
/// as they would after a charge that never happened. Also whether it was refused.
#[inline]
pub(crate) fn charge_nothing_if_refused(
    verdicts: Vec<Verdict>,
    checks: &[Check],
    counted: impl Fn(usize) -> bool,
) -> (Vec<Verdict>, bool) {
    let refused = verdicts
        .iter()
        .zip(checks)
        .enumerate()
        .any(|(i, (v, c))| counted(i) && !v.allowed && !c.shadow);
    if !refused {
        return (verdicts, false);
    }
    let verdicts = verdicts
        .into_iter()
        .zip(checks)
        .enumerate()
        .map(|(i, (v, c))| {
            if counted(i) {
                crate::limiter::unconsumed_units(&c.quota, v, c.units)
            } else {
                v
            }
        })
        .collect();
    (verdicts, true)
}
