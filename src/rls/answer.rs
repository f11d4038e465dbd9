//! One `ShouldRateLimit` answered, step by step: the request checked against the bounds a
//! client cannot raise, each descriptor matched to its rule, one check per bucket planned,
//! the store asked once (a refusal charges nothing), and a status per descriptor with the limit
//! headers the gateway would send.

use super::proto::{self, Code, DescriptorStatus, RateLimit, RateLimitRequest, RateLimitResponse};
use super::{
    descriptor_label, joined_entries, mapped_key, no_limit, rate_of, unlimited_answer, Service,
    MAX_DESCRIPTORS, MAX_ENTRIES, MAX_VALUE_LEN,
};
use crate::decision::{LimitResult, Outcome, Settings};
use crate::keys::Principal;
use crate::limiter::Verdict;
use crate::policy::{LimiterSpec, Mode};
use crate::rls_rules::{self as rules, Domain, Limit, Rule, Unit};
use crate::store::Check;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::sync::Arc;

/// What one descriptor was matched to.
enum Matched {
    /// No rule (or a replaced one, or a limiter that is off): OK, no limit.
    None,
    Rule(Arc<Rule>),
    /// A `fleet_limiter` rule, with its limiter as the configuration now has it (a reload may
    /// have changed its quota or mode since the YAML was read).
    Mapped {
        rule: Arc<Rule>,
        spec: Arc<LimiterSpec>,
    },
    /// The descriptor's own `limit` (`rls.descriptor_limit`).
    Own {
        spec: Arc<LimiterSpec>,
        unit: Unit,
        rpu: u32,
    },
}

impl Service {
    /// Answer one `ShouldRateLimit`.
    pub(crate) async fn answer(
        &self,
        peer: Option<SocketAddr>,
        req: RateLimitRequest,
    ) -> Result<RateLimitResponse, tonic::Status> {
        let settings = self.decider.settings();
        if let Some(refused) = refusal(&settings, peer, &req) {
            return Err(refused);
        }
        let metrics = self.decider.metrics();
        let n = req.descriptors.len();
        let domain = match settings.rls_domains.domain(&req.domain) {
            Some(d) if settings.enabled => d,
            other => {
                let label = other.map_or("unknown", |d| &d.name);
                for _ in 0..n {
                    metrics.rls_decision(label, "none", "no_rule");
                }
                return Ok(unlimited_answer(n));
            }
        };
        let mut matched: Vec<Matched> = req
            .descriptors
            .iter()
            .map(|d| match_descriptor(&settings, domain, d))
            .collect();
        drop_replaced(&mut matched);
        let now = self.decider.now();
        let mut plan = Plan::of(&req, &matched, &settings, self.decider.key_digest(), now);
        let decided = self
            .decider
            .decide_with_probes(&plan.checks, &plan.specs, &plan.probes, &plan.probe_specs)
            .await;
        let (mut verdicts, errored, local) = (decided.verdicts, decided.errored, decided.local);
        // The check-only verdicts follow the charged ones.
        let charged = plan.checks.len();
        for (descriptor, j) in std::mem::take(&mut plan.probe_of) {
            if let Some(slot) = plan.check_of.get_mut(descriptor) {
                *slot = Some(charged + j);
            }
        }
        let mut checks = std::mem::take(&mut plan.checks);
        checks.extend(std::mem::take(&mut plan.probes));
        verdicts.extend(decided.probed);
        let mut statuses = Vec::with_capacity(n);
        let mut over = false;
        for (m, c) in matched.iter().zip(&plan.check_of) {
            let decided = c.and_then(|i| verdicts.get(i).zip(checks.get(i)));
            let Some((status, rule_label, outcome)) = status_of(m, c.is_some(), decided) else {
                statuses.push(no_limit(0));
                continue;
            };
            over |= status.code == Code::OverLimit as i32;
            metrics.rls_decision(&domain.name, rule_label, outcome);
            statuses.push(status);
        }
        // The limit headers the gateway would send, from the buckets that decided.
        let results: Vec<LimitResult> = checks
            .into_iter()
            .zip(std::mem::take(&mut plan.specs))
            .zip(verdicts)
            .enumerate()
            .map(|(i, ((check, spec), verdict))| {
                // A `local` limiter counted on this instance's bucket while the store failed.
                let local = local.get(i).copied().unwrap_or(false);
                if settings.top_talkers && (!errored || local) {
                    let refused = !verdict.allowed && !check.shadow;
                    self.decider
                        .top()
                        .record(&spec.name, &check.key, refused, now, || {
                            descriptor_label(
                                plan.descriptor_of.get(i).copied(),
                                settings.ipv6_prefix,
                            )
                        });
                }
                limit_result(check, spec, verdict, errored, local)
            })
            .collect();
        Ok(RateLimitResponse {
            overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
            statuses,
            response_headers_to_add: limit_headers(results, &settings),
            request_headers_to_add: Vec::new(),
        })
    }
}

/// The refusal of a request from an address not in `rls.allow_from`, or past the bounds a
/// client cannot raise (descriptors, entries, lengths), as envoyproxy/ratelimit words them.
fn refusal(
    settings: &Settings,
    peer: Option<SocketAddr>,
    req: &RateLimitRequest,
) -> Option<tonic::Status> {
    if !super::allows(&settings.rls_allow_from, peer) {
        tracing::warn!(peer = ?peer, "rls asked by an address not in rls.allow_from; refused");
        return Some(tonic::Status::permission_denied(
            "this address may not ask for rate-limit decisions; add it to rls.allow_from",
        ));
    }
    if req.domain.is_empty() {
        return Some(tonic::Status::invalid_argument(
            "rate limit domain must not be empty",
        ));
    }
    if req.descriptors.is_empty() {
        return Some(tonic::Status::invalid_argument(
            "rate limit descriptor list must not be empty",
        ));
    }
    if req.descriptors.len() > MAX_DESCRIPTORS {
        return Some(tonic::Status::invalid_argument(format!(
            "more than {MAX_DESCRIPTORS} descriptors in one request"
        )));
    }
    if req.domain.len() > MAX_VALUE_LEN {
        return Some(tonic::Status::invalid_argument(format!(
            "the domain is longer than {MAX_VALUE_LEN} bytes"
        )));
    }
    for d in &req.descriptors {
        if d.entries.len() > MAX_ENTRIES {
            return Some(tonic::Status::invalid_argument(format!(
                "a descriptor has more than {MAX_ENTRIES} entries"
            )));
        }
        if d.entries
            .iter()
            .any(|e| e.key.len() > MAX_VALUE_LEN || e.value.len() > MAX_VALUE_LEN)
        {
            return Some(tonic::Status::invalid_argument(format!(
                "a descriptor entry's key or value is longer than {MAX_VALUE_LEN} bytes"
            )));
        }
    }
    None
}

/// The rule one descriptor meets: its own `limit` when `rls.descriptor_limit` lets it count,
/// else the domain's rule, a `fleet_limiter` rule read with its limiter as configured now.
fn match_descriptor(
    settings: &Settings,
    domain: &Domain,
    d: &proto::RateLimitDescriptor,
) -> Matched {
    let own = d
        .limit
        .as_ref()
        .filter(|_| settings.rls_descriptor_limit)
        .and_then(|l| {
            let unit = Unit::from_proto(l.unit)?;
            let rpu = NonZeroU32::new(l.requests_per_unit)?;
            Some((unit, rpu))
        });
    let rule = domain.lookup(d.entries.iter().map(|e| (e.key.as_str(), e.value.as_str())));
    match (own, rule) {
        (Some((unit, rpu)), rule) => {
            let base = rule.map_or_else(
                || format!("rls:{}:override", domain.name),
                |r| format!("{}:override", r.path),
            );
            let quota = unit.quota(rpu, false);
            Matched::Own {
                spec: Arc::new(rules::rls_spec(
                    &base,
                    quota,
                    rule.is_some_and(|r| r.shadow),
                )),
                unit,
                rpu: rpu.get(),
            }
        }
        (None, Some(r)) => match &r.limit {
            Limit::Limiter {
                spec, mapped: true, ..
            } => {
                let live = settings
                    .policy
                    .limiters()
                    .iter()
                    .find(|l| l.name == spec.name)
                    .unwrap_or(spec);
                if live.mode == Mode::Off {
                    Matched::None
                } else {
                    Matched::Mapped {
                        rule: r.clone(),
                        spec: live.clone(),
                    }
                }
            }
            _ => Matched::Rule(r.clone()),
        },
        (None, None) => Matched::None,
    }
}

/// `replaces`: a rule that another matched rule replaces is not checked.
fn drop_replaced(matched: &mut [Matched]) {
    let replaced: Vec<String> = matched
        .iter()
        .filter_map(|m| match m {
            Matched::Rule(r) => Some(r.replaces.iter().cloned()),
            _ => None,
        })
        .flatten()
        .collect();
    if replaced.is_empty() {
        return;
    }
    for m in matched.iter_mut() {
        if let Matched::Rule(r) = m {
            if r.name
                .as_deref()
                .is_some_and(|n| replaced.iter().any(|x| x == n))
            {
                *m = Matched::None;
            }
        }
    }
}

/// The store calls one request needs: one check per bucket (descriptors naming the same
/// bucket add their costs), and the check-only probes of descriptors whose own `hits_addend`
/// is 0 (checked, never charged, as the reference does).
struct Plan<'r> {
    checks: Vec<Check>,
    specs: Vec<Arc<LimiterSpec>>,
    /// Per descriptor: its index among `checks` (or, once probes are appended, the probe's).
    check_of: Vec<Option<usize>>,
    /// The descriptor each check came from (its label in the top-talker lists).
    descriptor_of: Vec<&'r proto::RateLimitDescriptor>,
    probes: Vec<Check>,
    probe_specs: Vec<Arc<LimiterSpec>>,
    /// (descriptor, its index among `probes`).
    probe_of: Vec<(usize, usize)>,
}

impl<'r> Plan<'r> {
    fn of(
        req: &'r RateLimitRequest,
        matched: &[Matched],
        settings: &Settings,
        digest: &crate::keys::KeyDigest,
        now: crate::clock::Nanos,
    ) -> Self {
        let request_units = req.hits_addend.max(1);
        let mut plan = Plan {
            checks: Vec::new(),
            specs: Vec::new(),
            check_of: Vec::with_capacity(matched.len()),
            descriptor_of: Vec::new(),
            probes: Vec::new(),
            probe_specs: Vec::new(),
            probe_of: Vec::new(),
        };
        for (d, m) in req.descriptors.iter().zip(matched) {
            let (spec, mapped, yaml_shadow) = match m {
                Matched::Mapped { rule, spec } => (spec, true, rule.shadow),
                Matched::Rule(r) => match &r.limit {
                    Limit::Limiter { spec, .. } => (spec, false, r.shadow),
                    _ => {
                        plan.check_of.push(None);
                        continue;
                    }
                },
                Matched::Own { spec, .. } => (spec, false, false),
                Matched::None => {
                    plan.check_of.push(None);
                    continue;
                }
            };
            // The reference: a descriptor's own hits_addend as it is (0: check only), else the
            // request's, where 0 (unset) counts one.
            let own = d.hits_addend.as_ref().map(|h| h.value);
            let units = own.map_or(u64::from(request_units), |v| v.max(1));
            let units = NonZeroU32::new(u32::try_from(units).unwrap_or(u32::MAX))
                .unwrap_or(NonZeroU32::MIN);
            let key = if mapped {
                mapped_key(digest, spec, d, settings.ipv6_prefix)
            } else {
                let joined = joined_entries(d, settings.ipv6_prefix);
                let p = Principal {
                    header: Some(&joined),
                    ..Principal::default()
                };
                digest.bucket_of(spec.name.clone(), &spec.key, &p)
            };
            let check = Check {
                key,
                // A calendar budget as it stands now: its window the period's own length.
                quota: spec.quota.at(now),
                shadow: yaml_shadow || spec.mode != Mode::Enforce,
                units,
            };
            plan.add(d, spec, check, own == Some(0));
        }
        plan
    }

    /// Add one descriptor's check: a probe when it is `check_only`, else charged, into the
    /// check of the same bucket when there is one.
    fn add(
        &mut self,
        d: &'r proto::RateLimitDescriptor,
        spec: &Arc<LimiterSpec>,
        check: Check,
        check_only: bool,
    ) {
        if check_only {
            self.probe_of.push((self.check_of.len(), self.probes.len()));
            self.check_of.push(None);
            self.probes.push(check);
            self.probe_specs.push(spec.clone());
            return;
        }
        if let Some(i) = self.checks.iter().position(|c| c.key == check.key) {
            if let Some(c) = self.checks.get_mut(i) {
                c.units = c.units.saturating_add(check.units.get());
            }
            self.check_of.push(Some(i));
            return;
        }
        self.check_of.push(Some(self.checks.len()));
        self.checks.push(check);
        self.descriptor_of.push(d);
        self.specs.push(spec.clone());
    }
}

/// One descriptor's status, the rule it is counted under and its outcome's label; `None` when
/// it was checked (`checked`) but its verdict is missing (answered OK with no limit).
fn status_of<'m>(
    m: &'m Matched,
    checked: bool,
    decided: Option<(&Verdict, &Check)>,
) -> Option<(DescriptorStatus, &'m str, &'static str)> {
    Some(match (m, checked) {
        (Matched::None, _) => (no_limit(0), "none", "no_rule"),
        (Matched::Rule(r), _) if matches!(r.limit, Limit::Unlimited) => {
            (no_limit(u32::MAX), &*r.path, "unlimited")
        }
        (Matched::Rule(r), _) if matches!(r.limit, Limit::Nothing(_)) => nothing_status(r),
        (m, true) => {
            let (v, check) = decided?;
            bucket_status(m, v, check)
        }
        (_, false) => (no_limit(0), "none", "no_rule"),
    })
}

/// A rule of no requests at all (`requests_per_unit: 0`): over its limit, or OK in shadow.
fn nothing_status(r: &Rule) -> (DescriptorStatus, &str, &'static str) {
    let unit = match r.limit {
        Limit::Nothing(u) => u,
        _ => Unit::Second,
    };
    let code = if r.shadow { Code::Ok } else { Code::OverLimit };
    let status = DescriptorStatus {
        code: code as i32,
        current_limit: Some(RateLimit {
            name: r.name.clone().unwrap_or_default(),
            requests_per_unit: 0,
            unit: unit.proto(),
        }),
        limit_remaining: 0,
        duration_until_reset: Some(proto::Duration::from_nanos(unit.seconds() * 1_000_000_000)),
    };
    let outcome = if r.shadow {
        "shadow_over_limit"
    } else {
        "over_limit"
    };
    (status, &*r.path, outcome)
}

/// A descriptor its bucket decided: the limit as the rule states it, what remains, and the
/// wait until it resets (allowed) or may pass (refused).
fn bucket_status<'m>(
    m: &'m Matched,
    v: &Verdict,
    check: &Check,
) -> (DescriptorStatus, &'m str, &'static str) {
    let (name, label, unit, rpu, shadow) = match m {
        Matched::Rule(r) => {
            let unit = match r.limit {
                Limit::Limiter { unit, .. } => unit,
                _ => Unit::Second,
            };
            (
                r.name.clone().unwrap_or_default(),
                &*r.path,
                unit,
                r.requests_per_unit,
                r.shadow,
            )
        }
        Matched::Mapped { rule, spec } => {
            let (rpu, unit) = rate_of(&spec.quota);
            (
                String::new(),
                &*rule.path,
                unit,
                rpu,
                rule.shadow || spec.mode != Mode::Enforce,
            )
        }
        Matched::Own { spec, unit, rpu } => (
            String::new(),
            &*spec.name,
            *unit,
            *rpu,
            spec.mode != Mode::Enforce,
        ),
        Matched::None => (String::new(), "none", Unit::Second, 0, false),
    };
    let wait = if v.allowed {
        v.reset_after_ns
    } else {
        v.retry_after_ns
    };
    // Never 0: a bucket that reports none (a store failure's answer) still needs one request's
    // worth of refill.
    let wait = if wait == 0 {
        check.quota.emission_interval_ns()
    } else {
        wait
    };
    let code = if v.allowed || shadow {
        Code::Ok
    } else {
        Code::OverLimit
    };
    let outcome = match (v.allowed, shadow) {
        (true, _) => "ok",
        (false, true) => "shadow_over_limit",
        (false, false) => "over_limit",
    };
    let status = DescriptorStatus {
        code: code as i32,
        current_limit: Some(RateLimit {
            name,
            requests_per_unit: rpu,
            unit: unit.proto(),
        }),
        limit_remaining: v.remaining,
        duration_until_reset: Some(proto::Duration::from_nanos(wait)),
    };
    (status, label, outcome)
}

/// One bucket's result, as the gateway's headers read it.
fn limit_result(
    check: Check,
    spec: Arc<LimiterSpec>,
    verdict: Verdict,
    errored: bool,
    local: bool,
) -> LimitResult {
    let mut partition = [0u8; 8];
    partition.copy_from_slice(&check.key.digest[..8]);
    LimitResult {
        quota: check.quota,
        spec,
        slot: usize::MAX,
        key: check.key,
        verdict,
        store_error: errored && !local,
        local,
        units: check.units,
        partition,
    }
}

/// The limit headers the gateway would send for `results` (none when no bucket decided).
fn limit_headers(results: Vec<LimitResult>, settings: &Settings) -> Vec<proto::HeaderValue> {
    if results.is_empty() {
        return Vec::new();
    }
    let outcome = Outcome {
        client_ip: None,
        results,
        store_error: None,
        poll_after_secs: None,
    };
    crate::http::response::limit_headers(&outcome, &settings.headers, None)
        .into_iter()
        .map(|(k, v)| proto::HeaderValue {
            key: k.as_str().to_owned(),
            value: v,
        })
        .collect()
}
