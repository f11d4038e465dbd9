//! Counters and histograms in the Prometheus text format, kept in atomics so recording never
//! waits: per-limiter decisions by outcome, near-limit decisions, decision, store and upstream
//! latency, upstream statuses, reloads. Each [`Metrics`] belongs to one decider (one gateway or
//! one embedded limiter) and is fed plain facts; `/metrics` on the admin listener renders it
//! with the store's key gauges and the current policy.

use crate::http::proxy::pace::Trip;
use crate::policy::{Mode, Policy};
use crate::store::{Store, StoreErrorKind};
use parking_lot::RwLock;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
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

/// One limiter's verdict on one request, as the metrics see it.
#[derive(Debug, Clone, Copy)]
pub struct LimiterFact<'a> {
    pub limiter: &'a Arc<str>,
    pub outcome: DecisionOutcome,
    /// What the verdict left of the budget.
    pub remaining: u32,
    /// The budget.
    pub limit: u32,
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
    /// Failed store round trips, by [`StoreErrorKind`] (in `StoreErrorKind::ALL` order).
    store_errors: [AtomicU64; StoreErrorKind::ALL.len()],
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
    /// WebSocket handshakes the upstream answered: switched (101) and declined (anything else).
    upgrades: [AtomicU64; 2],
    /// Upgraded connections spliced to the upstream now.
    upgraded_open: AtomicU64,
    /// Log lines dropped by the process-wide log sink ([`crate::log_sink::lines_dropped`]): one
    /// stderr for the whole process, so every registry shows the same count.
    log_lines_dropped: fn() -> u64,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("limiters", &self.limiters.read().len())
            .finish_non_exhaustive()
    }
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
            store_errors: Default::default(),
            upstream_status: (100..600).map(|_| AtomicU64::new(0)).collect(),
            upstream_latency: Histogram::new(UPSTREAM_BOUNDS_NS),
            upstream_timeouts: AtomicU64::new(0),
            upstream_unreachable: AtomicU64::new(0),
            client_body_timeouts: Default::default(),
            reloads_ok: AtomicU64::new(0),
            reloads_failed: AtomicU64::new(0),
            last_reload_ok: AtomicBool::new(true),
            paths_rejected: Default::default(),
            upgrades: Default::default(),
            upgraded_open: AtomicU64::new(0),
            log_lines_dropped: crate::log_sink::lines_dropped,
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

    /// Count one request by what limiting did with it; a metered one also counts how long its
    /// decision took.
    pub fn request(&self, outcome: RequestOutcome, elapsed: Duration) {
        self.requests[outcome as usize].fetch_add(1, Ordering::Relaxed);
        if outcome != RequestOutcome::Unmetered {
            self.decision_latency.observe(elapsed);
        }
    }

    /// Count one limiter's verdict on one request (see [`Metrics::limiter_decisions`]).
    pub fn limiter_decision(
        &self,
        limiter: &Arc<str>,
        outcome: DecisionOutcome,
        remaining: u32,
        limit: u32,
    ) {
        self.limiter_decisions([LimiterFact {
            limiter,
            outcome,
            remaining,
            limit,
        }]);
    }

    /// Count the verdicts of one request's limiters: each one's outcome, and whether an allowed
    /// request left less than the near-limit share of the budget. One read of the limiter map
    /// for them all; a limiter the configuration did not name is added after.
    pub fn limiter_decisions<'a>(&self, facts: impl IntoIterator<Item = LimiterFact<'a>>) {
        let pct = u64::from(self.near_limit_percent.load(Ordering::Relaxed));
        let record = |c: &LimiterCounters, f: &LimiterFact<'_>| {
            c.outcomes[f.outcome as usize].fetch_add(1, Ordering::Relaxed);
            if f.outcome == DecisionOutcome::Allowed
                && u64::from(f.remaining) * 100 < pct * u64::from(f.limit)
            {
                c.near_limit.fetch_add(1, Ordering::Relaxed);
            }
        };
        let mut unseen = Vec::new();
        {
            let map = self.limiters.read();
            for f in facts {
                match map.get(f.limiter) {
                    Some(c) => record(c, &f),
                    None => unseen.push(f),
                }
            }
        }
        for f in unseen {
            record(&self.counters(f.limiter), &f);
        }
    }

    /// One store round trip: answered (`None`), or failed with an error of this kind.
    pub fn store_round_trip(&self, elapsed: Duration, failed: Option<StoreErrorKind>) {
        self.store_latency.observe(elapsed);
        if let Some(kind) = failed {
            self.store_errors[kind.index()].fetch_add(1, Ordering::Relaxed);
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

    /// How many allowed decisions of a limiter left less than the near-limit share.
    pub fn near_limit(&self, limiter: &str) -> u64 {
        self.limiters
            .read()
            .get(limiter)
            .map_or(0, |c| c.near_limit.load(Ordering::Relaxed))
    }

    /// Everything, in the Prometheus text exposition format (version 0.0.4). `configured` is
    /// whether limiting is on and the policy in force, when known.
    pub fn render(&self, store: Option<&dyn Store>, configured: Option<(bool, &Policy)>) -> String {
        let mut out = String::with_capacity(16 * 1024);
        if let Some((_, policy)) = configured {
            // Configured limiters appear at zero before their first decision.
            let mut map = self.limiters.write();
            for l in policy.limiters() {
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
            "Store round trips that failed, by kind of failure.",
        );
        let store_label = format!("store=\"{kind}\"");
        for (k, n) in StoreErrorKind::ALL.iter().zip(&self.store_errors) {
            sample(
                &mut out,
                "fleet_limiter_store_errors_total",
                &format!("store=\"{kind}\",kind=\"{}\"", k.as_str()),
                n.load(Ordering::Relaxed),
            );
        }
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
            &[("", &AtomicU64::new((self.log_lines_dropped)()))],
        );

        if let Some((enabled, policy)) = configured {
            header(
                &mut out,
                "fleet_limiter_enabled",
                "gauge",
                "1 when limiting is on (FLEET_LIMITER_ENABLED).",
            );
            sample(&mut out, "fleet_limiter_enabled", "", u8::from(enabled));
            header(
                &mut out,
                "fleet_limiter_limiter_info",
                "gauge",
                "Each configured limiter: its mode, budget and window.",
            );
            for l in policy.limiters() {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn line<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
        text.lines().find(|l| l.starts_with(prefix))
    }

    #[test]
    fn outcomes_near_limit_and_requests_are_counted() {
        let m = Metrics::new();
        let (a, b): (Arc<str>, Arc<str>) = (Arc::from("a"), Arc::from("b"));
        m.configure([&a, &b], 20);
        let micros = Duration::from_micros(30);
        m.limiter_decision(&a, DecisionOutcome::Allowed, 1, 10);
        m.limiter_decision(&b, DecisionOutcome::ShadowRefused, 0, 10);
        m.request(RequestOutcome::Forwarded, micros);
        m.limiter_decision(&a, DecisionOutcome::Refused, 0, 10);
        m.request(RequestOutcome::Refused, micros);
        m.limiter_decision(&a, DecisionOutcome::StoreErrorAllowed, 0, 10);
        m.request(RequestOutcome::Forwarded, micros);
        m.request(RequestOutcome::Unmetered, Duration::ZERO);
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
        let policy = Policy::new(cfg.limiters.clone());
        // The page does not depend on what other tests in this process logged.
        let m = Metrics {
            log_lines_dropped: || 0,
            ..Metrics::new()
        };
        let agent = policy.get("agent-device").expect("built-in").name.clone();
        m.limiter_decision(&agent, DecisionOutcome::Refused, 0, 10);
        m.request(RequestOutcome::Refused, Duration::from_micros(40));
        m.store_round_trip(Duration::from_micros(3), None);
        m.store_round_trip(Duration::from_micros(9), Some(StoreErrorKind::Timeout));
        m.upstream_response(200, Duration::from_millis(12));
        m.upstream_failed(true);
        m.client_body_timeout(Trip::Rate);
        m.upgrade(true);
        m.upgrade(false);
        m.upgraded_opened();
        m.upgraded_opened();
        m.upgraded_closed();
        m.reloaded(false);
        snap!("metrics_page", m.render(None, Some((cfg.enabled, &policy))));
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
