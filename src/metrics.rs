//! Counters and histograms in the Prometheus text format, kept in atomics so recording never
//! waits: per-limiter decisions by outcome, near-limit decisions, decision, store and upstream
//! latency, upstream statuses, reloads. [`global`] is the process's registry; `/metrics` on the
//! admin listener renders it with the store's key gauges.

use crate::decision::{Outcome, Settings};
use crate::http::proxy::pace::Trip;
use crate::policy::Mode;
use crate::store::Store;
use parking_lot::RwLock;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// What one limiter said about one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecisionOutcome {
    /// Within budget.
    Allowed,
    /// Over budget, and the limiter enforces: the request got a 429.
    Refused,
    /// Over budget in shadow mode: counted and logged, the request went through.
    ShadowRefused,
    /// The store failed and `on_store_error = "allow"` let the request through.
    StoreErrorAllowed,
    /// The store failed and `on_store_error = "deny"` answered no.
    StoreErrorRefused,
}

impl DecisionOutcome {
    pub const ALL: [DecisionOutcome; 5] = [
        DecisionOutcome::Allowed,
        DecisionOutcome::Refused,
        DecisionOutcome::ShadowRefused,
        DecisionOutcome::StoreErrorAllowed,
        DecisionOutcome::StoreErrorRefused,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            DecisionOutcome::Allowed => "allowed",
            DecisionOutcome::Refused => "refused",
            DecisionOutcome::ShadowRefused => "shadow_refused",
            DecisionOutcome::StoreErrorAllowed => "store_error_allowed",
            DecisionOutcome::StoreErrorRefused => "store_error_refused",
        }
    }

    /// The outcome of one limiter's verdict.
    pub fn of(allowed: bool, store_error: bool, mode: Mode) -> Self {
        match (store_error, allowed, mode) {
            (true, true, _) => DecisionOutcome::StoreErrorAllowed,
            (true, false, _) => DecisionOutcome::StoreErrorRefused,
            (false, true, _) => DecisionOutcome::Allowed,
            (false, false, Mode::Enforce) => DecisionOutcome::Refused,
            (false, false, _) => DecisionOutcome::ShadowRefused,
        }
    }
}

/// Upper bounds, in nanoseconds, of the in-process latency buckets (10 µs to 250 ms).
const FAST_BOUNDS_NS: &[u64] = &[
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
];

/// Upper bounds, in nanoseconds, of the upstream latency buckets (5 ms to 30 s).
const UPSTREAM_BOUNDS_NS: &[u64] = &[
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
    30_000_000_000,
];

/// A fixed-bucket histogram of durations.
pub struct Histogram {
    bounds: &'static [u64],
    /// One count per bound (non-cumulative), plus one for `+Inf`.
    counts: Box<[AtomicU64]>,
    sum_ns: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [u64]) -> Self {
        Self {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_ns: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let i = self.bounds.partition_point(|&b| b < ns);
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        let mut cumulative = 0;
        for (i, b) in self.bounds.iter().enumerate() {
            cumulative += self.counts[i].load(Ordering::Relaxed);
            let le = *b as f64 / 1e9;
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels}{sep}le=\"{le}\"}} {cumulative}"
            );
        }
        cumulative += self.counts[self.bounds.len()].load(Ordering::Relaxed);
        let _ = writeln!(
            out,
            "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {cumulative}"
        );
        let sum = self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        let braces = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        let _ = writeln!(out, "{name}_sum{braces} {sum}");
        let _ = writeln!(out, "{name}_count{braces} {cumulative}");
    }
}

#[derive(Default)]
struct LimiterCounters {
    outcomes: [AtomicU64; 5],
    near_limit: AtomicU64,
}

/// Whole-request results.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestOutcome {
    /// Every enforcing limiter allowed (shadow refusals included).
    Forwarded,
    /// An enforcing limiter refused: 429.
    Refused,
    /// No limiter applies to the route (or limiting is switched off).
    Unmetered,
}

impl RequestOutcome {
    const ALL: [RequestOutcome; 3] = [
        RequestOutcome::Forwarded,
        RequestOutcome::Refused,
        RequestOutcome::Unmetered,
    ];

    fn as_str(self) -> &'static str {
        match self {
            RequestOutcome::Forwarded => "forwarded",
            RequestOutcome::Refused => "refused",
            RequestOutcome::Unmetered => "unmetered",
        }
    }
}

/// The registry.
pub struct Metrics {
    limiters: RwLock<BTreeMap<Arc<str>, Arc<LimiterCounters>>>,
    near_limit_percent: AtomicU8,
    requests: [AtomicU64; 3],
    decision_latency: Histogram,
    store_latency: Histogram,
    store_errors: AtomicU64,
    /// Responses by status code 100..=599 (index = code - 100).
    upstream_status: Box<[AtomicU64]>,
    upstream_latency: Histogram,
    upstream_timeouts: AtomicU64,
    upstream_unreachable: AtomicU64,
    /// Request bodies cut off for their pace, by rule (`Trip as usize`).
    client_body_timeouts: [AtomicU64; 2],
    reloads_ok: AtomicU64,
    reloads_failed: AtomicU64,
    last_reload_ok: AtomicBool,
    /// Requests refused with 400 for their path's spelling, by class (index: `Class::ALL`).
    paths_rejected: [AtomicU64; crate::path::Class::ALL.len()],
    /// Log lines dropped because the log output could not be written (its reader is gone).
    log_lines_dropped: AtomicU64,
    /// WebSocket handshakes the upstream answered: switched (101) and declined (anything else).
    upgrades: [AtomicU64; 2],
    /// Upgraded connections spliced to the upstream now.
    upgraded_open: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        Self {
            limiters: RwLock::new(BTreeMap::new()),
            near_limit_percent: AtomicU8::new(crate::config::ops::NEAR_LIMIT_PERCENT),
            requests: Default::default(),
            decision_latency: Histogram::new(FAST_BOUNDS_NS),
            store_latency: Histogram::new(FAST_BOUNDS_NS),
            store_errors: AtomicU64::new(0),
            upstream_status: (100..600).map(|_| AtomicU64::new(0)).collect(),
            upstream_latency: Histogram::new(UPSTREAM_BOUNDS_NS),
            upstream_timeouts: AtomicU64::new(0),
            upstream_unreachable: AtomicU64::new(0),
            client_body_timeouts: Default::default(),
            reloads_ok: AtomicU64::new(0),
            reloads_failed: AtomicU64::new(0),
            last_reload_ok: AtomicBool::new(true),
            paths_rejected: Default::default(),
            log_lines_dropped: AtomicU64::new(0),
            upgrades: Default::default(),
            upgraded_open: AtomicU64::new(0),
        }
    }

    /// Make every configured limiter appear (at zero) before its first decision, and take the
    /// near-limit threshold. Called at start and on every reload.
    pub fn configure<'a>(
        &self,
        limiter_names: impl IntoIterator<Item = &'a Arc<str>>,
        near_limit_percent: u8,
    ) {
        self.near_limit_percent
            .store(near_limit_percent.min(100), Ordering::Relaxed);
        let mut map = self.limiters.write();
        for name in limiter_names {
            map.entry(name.clone()).or_default();
        }
    }

    fn counters(&self, name: &Arc<str>) -> Arc<LimiterCounters> {
        if let Some(c) = self.limiters.read().get(name) {
            return c.clone();
        }
        self.limiters
            .write()
            .entry(name.clone())
            .or_default()
            .clone()
    }

    /// Count one request's decision and how long it took.
    pub fn observe(&self, outcome: &Outcome, elapsed: Duration) {
        let req = if outcome.results.is_empty() {
            RequestOutcome::Unmetered
        } else if outcome.refused() {
            RequestOutcome::Refused
        } else {
            RequestOutcome::Forwarded
        };
        self.requests[req as usize].fetch_add(1, Ordering::Relaxed);
        if outcome.results.is_empty() {
            return;
        }
        self.decision_latency.observe(elapsed);
        let pct = u64::from(self.near_limit_percent.load(Ordering::Relaxed));
        let record = |c: &LimiterCounters, r: &crate::decision::LimitResult| {
            let o = DecisionOutcome::of(r.verdict.allowed, r.store_error, r.spec.mode);
            c.outcomes[o as usize].fetch_add(1, Ordering::Relaxed);
            let limit = u64::from(r.verdict.limit);
            if o == DecisionOutcome::Allowed && u64::from(r.verdict.remaining) * 100 < pct * limit {
                c.near_limit.fetch_add(1, Ordering::Relaxed);
            }
        };
        let mut unseen = Vec::new();
        {
            let map = self.limiters.read();
            for r in &outcome.results {
                match map.get(&r.spec.name) {
                    Some(c) => record(c, r),
                    None => unseen.push(r),
                }
            }
        }
        for r in unseen {
            record(&self.counters(&r.spec.name), r);
        }
    }

    /// One store round trip, answered or failed.
    pub fn store_round_trip(&self, elapsed: Duration, ok: bool) {
        self.store_latency.observe(elapsed);
        if !ok {
            self.store_errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The upstream answered with `status` after `elapsed` (time to response headers).
    pub fn upstream_response(&self, status: u16, elapsed: Duration) {
        if let Some(c) = status
            .checked_sub(100)
            .and_then(|i| self.upstream_status.get(i as usize))
        {
            c.fetch_add(1, Ordering::Relaxed);
        }
        self.upstream_latency.observe(elapsed);
    }

    /// The upstream could not be reached (502) or did not answer in time (504).
    pub fn upstream_failed(&self, timed_out: bool) {
        if timed_out {
            self.upstream_timeouts.fetch_add(1, Ordering::Relaxed);
        } else {
            self.upstream_unreachable.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A request refused with 400 because its path has no canonical form.
    pub fn path_rejected(&self, class: crate::path::Class) {
        if let Some(c) = crate::path::Class::ALL
            .iter()
            .position(|k| *k == class)
            .and_then(|i| self.paths_rejected.get(i))
        {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A client's request body was cut off because it broke `rule`.
    pub fn client_body_timeout(&self, rule: Trip) {
        self.client_body_timeouts[rule as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// The upstream answered a WebSocket handshake: switched protocols (`101`) or not.
    pub fn upgrade(&self, switched: bool) {
        self.upgrades[usize::from(!switched)].fetch_add(1, Ordering::Relaxed);
    }

    /// An upgraded connection was spliced to the upstream.
    pub fn upgraded_opened(&self) {
        self.upgraded_open.fetch_add(1, Ordering::Relaxed);
    }

    /// An upgraded connection closed (each one opened closes once).
    pub fn upgraded_closed(&self) {
        let _ = self
            .upgraded_open
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }

    /// A log line could not be written and was dropped.
    pub fn log_line_dropped(&self) {
        self.log_lines_dropped.fetch_add(1, Ordering::Relaxed);
    }

    /// How many log lines were dropped so far.
    pub fn log_lines_dropped(&self) -> u64 {
        self.log_lines_dropped.load(Ordering::Relaxed)
    }

    pub fn reloaded(&self, ok: bool) {
        if ok {
            self.reloads_ok.fetch_add(1, Ordering::Relaxed);
        } else {
            self.reloads_failed.fetch_add(1, Ordering::Relaxed);
        }
        self.last_reload_ok.store(ok, Ordering::Relaxed);
    }

    /// How many decisions a limiter has counted with this outcome.
    pub fn decisions(&self, limiter: &str, outcome: DecisionOutcome) -> u64 {
        self.limiters
            .read()
            .get(limiter)
            .map_or(0, |c| c.outcomes[outcome as usize].load(Ordering::Relaxed))
    }

    /// Everything, in the Prometheus text exposition format (version 0.0.4).
    pub fn render(&self, store: Option<&dyn Store>, settings: Option<&Settings>) -> String {
        let mut out = String::with_capacity(16 * 1024);
        if let Some(s) = settings {
            // Configured limiters appear at zero before their first decision.
            let mut map = self.limiters.write();
            for l in s.policy.limiters() {
                map.entry(l.name.clone()).or_default();
            }
        }
        let limiters: Vec<(Arc<str>, Arc<LimiterCounters>)> = self
            .limiters
            .read()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();

        header(
            &mut out,
            "fleet_limiter_decisions_total",
            "counter",
            "Limiter decisions, by limiter and outcome.",
        );
        for (name, c) in &limiters {
            for o in DecisionOutcome::ALL {
                let v = c.outcomes[o as usize].load(Ordering::Relaxed);
                let labels = format!("limiter=\"{}\",outcome=\"{}\"", escape(name), o.as_str());
                sample(&mut out, "fleet_limiter_decisions_total", &labels, v);
            }
        }
        header(
            &mut out,
            "fleet_limiter_near_limit_total",
            "counter",
            "Allowed decisions that left less than the near-limit share of the budget.",
        );
        for (name, c) in &limiters {
            let v = c.near_limit.load(Ordering::Relaxed);
            let labels = format!("limiter=\"{}\"", escape(name));
            sample(&mut out, "fleet_limiter_near_limit_total", &labels, v);
        }
        header(
            &mut out,
            "fleet_limiter_near_limit_ratio",
            "gauge",
            "The near-limit threshold, as a share of the budget.",
        );
        let ratio = f64::from(self.near_limit_percent.load(Ordering::Relaxed)) / 100.0;
        sample(&mut out, "fleet_limiter_near_limit_ratio", "", ratio);

        header(
            &mut out,
            "fleet_limiter_requests_total",
            "counter",
            "Requests, by what limiting did with them.",
        );
        for r in RequestOutcome::ALL {
            let v = self.requests[r as usize].load(Ordering::Relaxed);
            let labels = format!("outcome=\"{}\"", r.as_str());
            sample(&mut out, "fleet_limiter_requests_total", &labels, v);
        }
        header(
            &mut out,
            "fleet_limiter_decision_duration_seconds",
            "histogram",
            "Time to decide one metered request (identity, policy, keys and store).",
        );
        self.decision_latency
            .render(&mut out, "fleet_limiter_decision_duration_seconds", "");

        let kind = store.map_or("none", |s| s.kind());
        header(
            &mut out,
            "fleet_limiter_store_duration_seconds",
            "histogram",
            "Store round trips, answered or failed.",
        );
        self.store_latency.render(
            &mut out,
            "fleet_limiter_store_duration_seconds",
            &format!("store=\"{kind}\""),
        );
        header(
            &mut out,
            "fleet_limiter_store_errors_total",
            "counter",
            "Store round trips that failed.",
        );
        let store_label = format!("store=\"{kind}\"");
        let errors = self.store_errors.load(Ordering::Relaxed);
        sample(
            &mut out,
            "fleet_limiter_store_errors_total",
            &store_label,
            errors,
        );
        if let Some(s) = store {
            header(
                &mut out,
                "fleet_limiter_tracked_keys",
                "gauge",
                "Buckets the store holds now.",
            );
            sample(
                &mut out,
                "fleet_limiter_tracked_keys",
                &store_label,
                s.tracked_keys(),
            );
            header(
                &mut out,
                "fleet_limiter_evicted_keys_total",
                "counter",
                "Buckets dropped to stay within the key cap while still active.",
            );
            sample(
                &mut out,
                "fleet_limiter_evicted_keys_total",
                &store_label,
                s.evicted_keys(),
            );
            if let Some(calls) = s.calls() {
                header(
                    &mut out,
                    "fleet_limiter_store_calls_total",
                    "counter",
                    "Calls sent to the store (concurrent requests share calls on a standalone Redis).",
                );
                sample(
                    &mut out,
                    "fleet_limiter_store_calls_total",
                    &store_label,
                    calls,
                );
            }
        }

        header(
            &mut out,
            "fleet_limiter_upstream_responses_total",
            "counter",
            "Upstream responses, by status code.",
        );
        for (i, c) in self.upstream_status.iter().enumerate() {
            let v = c.load(Ordering::Relaxed);
            if v > 0 {
                let labels = format!("status=\"{}\"", i + 100);
                sample(
                    &mut out,
                    "fleet_limiter_upstream_responses_total",
                    &labels,
                    v,
                );
            }
        }
        counters(
            &mut out,
            "fleet_limiter_upstream_errors_total",
            "Forwarded requests the upstream never answered: timeout (504) or unreachable (502).",
            &[
                ("kind=\"timeout\"", &self.upstream_timeouts),
                ("kind=\"unreachable\"", &self.upstream_unreachable),
            ],
        );
        header(
            &mut out,
            "fleet_limiter_upstream_duration_seconds",
            "histogram",
            "Time from forwarding a request to the upstream's response headers.",
        );
        self.upstream_latency
            .render(&mut out, "fleet_limiter_upstream_duration_seconds", "");
        let [silence, rate] = &self.client_body_timeouts;
        counters(
            &mut out,
            "fleet_limiter_client_body_timeouts_total",
            "Requests cut off because the client sent the body too slowly: silence (server.body_timeout) or rate (server.body_min_rate).",
            &[("rule=\"silence\"", silence), ("rule=\"rate\"", rate)],
        );

        let [switched, declined] = &self.upgrades;
        counters(
            &mut out,
            "fleet_limiter_upgrades_total",
            "WebSocket handshakes forwarded, by the upstream's answer: switched (101, connections spliced) or declined (any other answer, passed through).",
            &[("result=\"switched\"", switched), ("result=\"declined\"", declined)],
        );
        header(
            &mut out,
            "fleet_limiter_upgraded_connections",
            "gauge",
            "Upgraded (WebSocket) connections spliced to the upstream now.",
        );
        sample(
            &mut out,
            "fleet_limiter_upgraded_connections",
            "",
            self.upgraded_open.load(Ordering::Relaxed),
        );

        let labels: Vec<String> = crate::path::Class::ALL
            .iter()
            .map(|c| format!("class=\"{}\"", c.as_str()))
            .collect();
        let series: Vec<(&str, &AtomicU64)> = labels
            .iter()
            .map(String::as_str)
            .zip(self.paths_rejected.iter())
            .collect();
        counters(
            &mut out,
            "fleet_limiter_paths_rejected_total",
            "Requests refused with 400 before any limiter because their path has no canonical form, by class.",
            &series,
        );

        counters(
            &mut out,
            "fleet_limiter_config_reloads_total",
            "Configuration reloads, by result.",
            &[
                ("result=\"ok\"", &self.reloads_ok),
                ("result=\"error\"", &self.reloads_failed),
            ],
        );
        header(
            &mut out,
            "fleet_limiter_config_last_reload_successful",
            "gauge",
            "1 when the last reload took effect (or none was asked), 0 when the old configuration is still in use after a failed one.",
        );
        let ok = u8::from(self.last_reload_ok.load(Ordering::Relaxed));
        sample(
            &mut out,
            "fleet_limiter_config_last_reload_successful",
            "",
            ok,
        );

        counters(
            &mut out,
            "fleet_limiter_log_lines_dropped_total",
            "Log lines dropped because the log output (stderr) could not be written, e.g. its reader has exited.",
            &[("", &self.log_lines_dropped)],
        );

        if let Some(s) = settings {
            header(
                &mut out,
                "fleet_limiter_enabled",
                "gauge",
                "1 when limiting is on (FLEET_LIMITER_ENABLED).",
            );
            sample(&mut out, "fleet_limiter_enabled", "", u8::from(s.enabled));
            header(
                &mut out,
                "fleet_limiter_limiter_info",
                "gauge",
                "Each configured limiter: its mode, budget and window.",
            );
            for l in s.policy.limiters() {
                let mode = match l.mode {
                    Mode::Enforce => "enforce",
                    Mode::Shadow => "shadow",
                    Mode::Off => "off",
                };
                let _ = writeln!(
                    out,
                    "fleet_limiter_limiter_info{{limiter=\"{}\",mode=\"{mode}\",limit=\"{}\",window_seconds=\"{}\"}} 1",
                    escape(&l.name),
                    l.quota.limit,
                    l.quota.window.as_secs()
                );
            }
        }
        header(
            &mut out,
            "fleet_limiter_build_info",
            "gauge",
            "The running version.",
        );
        let version = format!("version=\"{}\"", env!("CARGO_PKG_VERSION"));
        sample(&mut out, "fleet_limiter_build_info", &version, 1);
        out
    }
}

/// One sample line: `name{labels} value`, or `name value` without labels.
fn sample(out: &mut String, name: &str, labels: &str, value: impl std::fmt::Display) {
    let _ = if labels.is_empty() {
        writeln!(out, "{name} {value}")
    } else {
        writeln!(out, "{name}{{{labels}}} {value}")
    };
}

/// A counter family: its header, then one sample per label set.
fn counters(out: &mut String, name: &str, help: &str, series: &[(&str, &AtomicU64)]) {
    header(out, name, "counter", help);
    for (labels, c) in series {
        sample(out, name, labels, c.load(Ordering::Relaxed));
    }
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// A label value with `\`, `"` and newlines escaped.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The process's registry.
pub fn global() -> &'static Metrics {
    static GLOBAL: OnceLock<Metrics> = OnceLock::new();
    GLOBAL.get_or_init(Metrics::new)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::LimitResult;
    use crate::keys::BucketKey;
    use crate::limiter::{Quota, Verdict};
    use crate::policy::{CredentialMatch, LimiterSpec, OnStoreError};

    fn spec(name: &str, mode: Mode) -> Arc<LimiterSpec> {
        Arc::new(LimiterSpec {
            name: Arc::from(name),
            quota: Quota::gcra(10, Duration::from_secs(60)),
            key: crate::keys::KeyKind::Ip,
            routes: vec!["/api/**".parse().expect("route")],
            except: vec![],
            group: Arc::from(name),
            credential: CredentialMatch::Any,
            mode,
            on_store_error: OnStoreError::Allow,
        })
    }

    fn result(
        spec: &Arc<LimiterSpec>,
        allowed: bool,
        remaining: u32,
        store_error: bool,
    ) -> LimitResult {
        LimitResult {
            spec: spec.clone(),
            key: BucketKey::new(spec.name.clone(), "ip:192.0.2.1"),
            verdict: Verdict {
                allowed,
                limit: 10,
                remaining,
                reset_after_ns: 0,
                retry_after_ns: if allowed { 0 } else { 1_000_000_000 },
            },
            store_error,
        }
    }

    fn line<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
        text.lines().find(|l| l.starts_with(prefix))
    }

    #[test]
    fn outcomes_near_limit_and_requests_are_counted() {
        let m = Metrics::new();
        let enforce = spec("a", Mode::Enforce);
        let shadow = spec("b", Mode::Shadow);
        m.configure([&enforce.name, &shadow.name], 20);
        let o = Outcome {
            results: vec![
                result(&enforce, true, 1, false),
                result(&shadow, false, 0, false),
            ],
            ..Outcome::default()
        };
        m.observe(&o, Duration::from_micros(30));
        let o = Outcome {
            results: vec![result(&enforce, false, 0, false)],
            ..Outcome::default()
        };
        m.observe(&o, Duration::from_micros(30));
        let o = Outcome {
            results: vec![result(&enforce, true, 0, true)],
            ..Outcome::default()
        };
        m.observe(&o, Duration::from_micros(30));
        m.observe(&Outcome::default(), Duration::ZERO);
        assert_eq!(m.decisions("a", DecisionOutcome::Allowed), 1);
        assert_eq!(m.decisions("a", DecisionOutcome::Refused), 1);
        assert_eq!(m.decisions("a", DecisionOutcome::StoreErrorAllowed), 1);
        assert_eq!(m.decisions("b", DecisionOutcome::ShadowRefused), 1);
        let text = m.render(None, None);
        assert_eq!(
            line(&text, "fleet_limiter_near_limit_total{limiter=\"a\"}"),
            Some("fleet_limiter_near_limit_total{limiter=\"a\"} 1")
        );
        assert_eq!(
            line(&text, "fleet_limiter_requests_total{outcome=\"forwarded\"}"),
            Some("fleet_limiter_requests_total{outcome=\"forwarded\"} 2")
        );
        assert_eq!(
            line(&text, "fleet_limiter_requests_total{outcome=\"unmetered\"}"),
            Some("fleet_limiter_requests_total{outcome=\"unmetered\"} 1")
        );
        assert_eq!(
            line(&text, "fleet_limiter_decision_duration_seconds_count"),
            Some("fleet_limiter_decision_duration_seconds_count 3")
        );
        assert_eq!(
            line(
                &text,
                "fleet_limiter_decision_duration_seconds_bucket{le=\"0.000025\"}"
            ),
            Some("fleet_limiter_decision_duration_seconds_bucket{le=\"0.000025\"} 0")
        );
        assert_eq!(
            line(
                &text,
                "fleet_limiter_decision_duration_seconds_bucket{le=\"0.00005\"}"
            ),
            Some("fleet_limiter_decision_duration_seconds_bucket{le=\"0.00005\"} 3")
        );
    }

    #[test]
    fn histogram_is_cumulative_and_bucket_edges_are_inclusive() {
        let h = Histogram::new(&[10, 20]);
        h.observe(Duration::from_nanos(10));
        h.observe(Duration::from_nanos(11));
        h.observe(Duration::from_nanos(1000));
        let mut s = String::new();
        h.render(&mut s, "x", "k=\"v\"");
        assert!(s.contains("x_bucket{k=\"v\",le=\"0.00000001\"} 1\n"), "{s}");
        assert!(s.contains("x_bucket{k=\"v\",le=\"0.00000002\"} 2\n"), "{s}");
        assert!(s.contains("x_bucket{k=\"v\",le=\"+Inf\"} 3\n"), "{s}");
        assert!(s.contains("x_count{k=\"v\"} 3\n"), "{s}");
        assert_eq!(h.count(), 3);
    }

    #[test]
    fn upstream_statuses_out_of_range_are_ignored() {
        let m = Metrics::new();
        m.upstream_response(204, Duration::from_millis(3));
        m.upstream_response(42, Duration::from_millis(3));
        m.upstream_response(999, Duration::from_millis(3));
        let text = m.render(None, None);
        assert!(text.contains("fleet_limiter_upstream_responses_total{status=\"204\"} 1\n"));
        assert!(!text.contains("status=\"42\""));
        assert!(text.contains("fleet_limiter_upstream_duration_seconds_count 3\n"));
    }

    #[test]
    fn exposition_page_of_the_default_calibration() {
        let cfg = crate::config::Config::default();
        let settings = Settings::from_config(&cfg);
        let m = Metrics::new();
        let agent = settings
            .policy
            .get("agent-device")
            .expect("built-in")
            .clone();
        let o = Outcome {
            results: vec![result(&agent, false, 0, false)],
            ..Outcome::default()
        };
        m.observe(&o, Duration::from_micros(40));
        m.store_round_trip(Duration::from_micros(3), true);
        m.upstream_response(200, Duration::from_millis(12));
        m.upstream_failed(true);
        m.client_body_timeout(Trip::Rate);
        m.upgrade(true);
        m.upgrade(false);
        m.upgraded_opened();
        m.upgraded_opened();
        m.upgraded_closed();
        m.reloaded(false);
        insta::with_settings!({snapshot_path => concat!(env!("CARGO_MANIFEST_DIR"), "/snapshots"), prepend_module_to_snapshot => false}, {
            insta::assert_snapshot!("metrics_page", m.render(None, Some(&settings)));
        });
    }

    #[test]
    fn every_outcome_has_a_stable_name() {
        let names: Vec<&str> = DecisionOutcome::ALL.iter().map(|o| o.as_str()).collect();
        assert_eq!(
            names,
            [
                "allowed",
                "refused",
                "shadow_refused",
                "store_error_allowed",
                "store_error_refused"
            ]
        );
        assert_eq!(escape("a\"b\\c"), "a\\\"b\\\\c");
    }
}
