//! The limiter's metrics, on the official client (`prometheus-client`): per-limiter decisions by
//! fate, near-limit decisions and `Retry-After`, decision, store and upstream latency, upstream
//! statuses, reloads. Each [`Metrics`] belongs to one decider (one gateway or one embedded
//! limiter) and is fed plain facts. Recording is one atomic add per counter: each limiter's
//! handles ([`LimiterMeter`]) are resolved once, when the settings are built, never looked up
//! per request. What the store and the settings hold now (tracked keys, limiter budgets) is read
//! at scrape time by collectors ([`scrape`]).

mod histogram;
mod scrape;

pub use histogram::Histogram;

use crate::known_agents::KnownAgents;
use crate::methods::RefusalReason;
use crate::path::Class;
use crate::policy::LimiterSpec;
use crate::store::{Store, StoreErrorKind};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// The `Content-Type` of `/metrics`: the Prometheus text format, version 0.0.4.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// What one limiter's verdict came to: the `outcome` label of `fleet_limiter_decisions_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimiterFate {
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

impl LimiterFate {
    pub const ALL: [LimiterFate; 5] = [
        LimiterFate::Allowed,
        LimiterFate::Refused,
        LimiterFate::ShadowRefused,
        LimiterFate::StoreErrorAllowed,
        LimiterFate::StoreErrorRefused,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            LimiterFate::Allowed => "allowed",
            LimiterFate::Refused => "refused",
            LimiterFate::ShadowRefused => "shadow_refused",
            LimiterFate::StoreErrorAllowed => "store_error_allowed",
            LimiterFate::StoreErrorRefused => "store_error_refused",
        }
    }

    /// The fate of one limiter's verdict: `allowed`, whether the store failed, and whether the
    /// limiter enforces (an over-budget verdict of a limiter that does not is a shadow refusal).
    pub fn of(allowed: bool, store_error: bool, enforces: bool) -> Self {
        match (store_error, allowed, enforces) {
            (true, true, _) => LimiterFate::StoreErrorAllowed,
            (true, false, _) => LimiterFate::StoreErrorRefused,
            (false, true, _) => LimiterFate::Allowed,
            (false, false, true) => LimiterFate::Refused,
            (false, false, false) => LimiterFate::ShadowRefused,
        }
    }
}

/// What limiting did with a whole request: the `outcome` label of `fleet_limiter_requests_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestFate {
    /// Every enforcing limiter allowed (shadow refusals included).
    Forwarded,
    /// An enforcing limiter refused: 429.
    Refused,
    /// No limiter applies to the route (or limiting is switched off).
    Unmetered,
}

impl RequestFate {
    const ALL: [RequestFate; 3] = [
        RequestFate::Forwarded,
        RequestFate::Refused,
        RequestFate::Unmetered,
    ];

    fn as_str(self) -> &'static str {
        match self {
            RequestFate::Forwarded => "forwarded",
            RequestFate::Refused => "refused",
            RequestFate::Unmetered => "unmetered",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LimiterLabel {
    limiter: String,
}

/// What became of one give-back (a `count = "failed"` or `"succeeded"` limiter returning an
/// admitted request): the `result` label of `fleet_limiter_give_backs_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GiveBackResult {
    /// The store took it back.
    Done,
    /// The store could not (an error or a timeout): the request stays counted.
    Failed,
    /// Too many give-backs were already under way: dropped, the request stays counted.
    Dropped,
}

impl GiveBackResult {
    pub const ALL: [GiveBackResult; 3] = [
        GiveBackResult::Done,
        GiveBackResult::Failed,
        GiveBackResult::Dropped,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            GiveBackResult::Done => "done",
            GiveBackResult::Failed => "failed",
            GiveBackResult::Dropped => "dropped",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LimiterResultLabels {
    limiter: String,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GroupLabel {
    group: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GroupReasonLabels {
    group: String,
    reason: &'static str,
}

/// Why admission control turned a request away or cut it off: the `reason` label of
/// `fleet_limiter_admission_shed_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShedReason {
    /// Every slot was taken and the queue was full: refused at once (503).
    QueueFull,
    /// It waited in the queue for `queue_timeout` and no slot came free (503).
    QueueTimeout,
    /// Its client address already held or waited for its share of the group's slots (429).
    ClientShare,
    /// It held a slot and was still sending its body after `body_hold` of waiting for it:
    /// cut off (408), its slot given back.
    BodyHold,
}

impl ShedReason {
    pub const ALL: [ShedReason; 4] = [
        ShedReason::QueueFull,
        ShedReason::QueueTimeout,
        ShedReason::ClientShare,
        ShedReason::BodyHold,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ShedReason::QueueFull => "queue_full",
            ShedReason::QueueTimeout => "queue_timeout",
            ShedReason::ClientShare => "client_share",
            ShedReason::BodyHold => "body_hold",
        }
    }
}

/// Which pace rule a client's request body broke when it was cut off: the `rule` label of
/// `fleet_limiter_client_body_timeouts_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyTimeout {
    /// Nothing came for `server.body_timeout`.
    Silence,
    /// The average fell below `server.body_min_rate` after the grace period.
    Rate,
}

/// Why a WebSocket handshake was refused before the upstream saw it: the `reason` label of
/// `fleet_limiter_upgrades_refused_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpgradeRefusal {
    /// As many upgraded connections were open as `websocket.max_open` allows (503).
    MaxOpen,
    /// The client address held `websocket.max_per_client` of them (429).
    MaxPerClient,
}

impl UpgradeRefusal {
    pub const ALL: [UpgradeRefusal; 2] = [UpgradeRefusal::MaxOpen, UpgradeRefusal::MaxPerClient];

    pub fn as_str(self) -> &'static str {
        match self {
            UpgradeRefusal::MaxOpen => "max_open",
            UpgradeRefusal::MaxPerClient => "max_per_client",
        }
    }
}

/// One admission group's gauges and counters, resolved once when the gate is built: entering,
/// waiting and shedding are one atomic operation each. Clones share their values.
#[derive(Clone, Debug, Default)]
pub struct AdmissionMeter {
    in_flight: Gauge,
    queued: Gauge,
    /// By [`ShedReason`], in `ShedReason::ALL` order.
    shed: [Counter; ShedReason::ALL.len()],
}

impl AdmissionMeter {
    /// A request took a slot (`+1`) or gave it back (`-1`).
    pub fn in_flight(&self, delta: i64) {
        self.in_flight.inc_by(delta);
    }

    /// A request started (`+1`) or stopped (`-1`) waiting in the queue.
    pub fn queued(&self, delta: i64) {
        self.queued.inc_by(delta);
    }

    /// A request was answered 503 for `reason`.
    pub fn shed(&self, reason: ShedReason) {
        self.shed[reason as usize].inc();
    }

    /// Requests in flight now.
    pub fn in_flight_now(&self) -> i64 {
        self.in_flight.get()
    }

    /// Requests waiting now.
    pub fn queued_now(&self) -> i64 {
        self.queued.get()
    }

    /// Requests shed for `reason` so far.
    pub fn shed_count(&self, reason: ShedReason) -> u64 {
        self.shed[reason as usize].get()
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LimiterOutcomeLabels {
    limiter: String,
    outcome: &'static str,
}

/// One label, `name="value"`, for families whose series are all known up front.
type OneLabel = [(&'static str, &'static str); 1];
/// Two labels, the same.
type TwoLabels = [(&'static str, &'static str); 2];

#[derive(Clone)]
struct RetryAfterBuckets;

impl MetricConstructor<Histogram> for RetryAfterBuckets {
    fn new_metric(&self) -> Histogram {
        Histogram::seconds(histogram::RETRY_AFTER_S)
    }
}

/// One limiter's counters, resolved once per settings: recording a verdict is an atomic add per
/// counter, with no lookup by name. Clones share their counts.
#[derive(Clone, Debug)]
pub struct LimiterMeter {
    /// By [`LimiterFate`], in `LimiterFate::ALL` order.
    fates: [Counter; 5],
    near_limit: Counter,
    retry_after: Histogram,
    /// An allowed verdict that leaves less than this share of the budget is near the limit.
    near_limit_percent: u8,
    /// By [`GiveBackResult`]; only for a limiter that gives back (`count` other than `all`).
    give_backs: Option<[Counter; 3]>,
}

impl LimiterMeter {
    /// Count one give-back of this limiter.
    pub fn give_back(&self, result: GiveBackResult) {
        if let Some(c) = self
            .give_backs
            .as_ref()
            .and_then(|c| c.get(result as usize))
        {
            c.inc();
        }
    }

    /// Count one verdict: its fate, whether an allowed one left less than the near-limit share
    /// of the budget, and the wait an over-budget one asked for (whole seconds, at least 1).
    pub fn record(&self, fate: LimiterFate, remaining: u32, limit: u32, retry_after_secs: u64) {
        if let Some(c) = self.fates.get(fate as usize) {
            c.inc();
        }
        match fate {
            LimiterFate::Allowed => {
                if u64::from(remaining) * 100
                    < u64::from(self.near_limit_percent) * u64::from(limit)
                {
                    self.near_limit.inc();
                }
            }
            LimiterFate::Refused | LimiterFate::ShadowRefused => {
                self.retry_after.observe(retry_after_secs.max(1));
            }
            LimiterFate::StoreErrorAllowed | LimiterFate::StoreErrorRefused => {}
        }
    }
}

/// One decider's metrics: the registry `/metrics` renders, and the handles that feed it.
pub struct Metrics {
    registry: Registry,
    decisions: Family<LimiterOutcomeLabels, Counter>,
    near_limit: Family<LimiterLabel, Counter>,
    give_backs: Family<LimiterResultLabels, Counter>,
    retry_after: Family<LimiterLabel, Histogram, RetryAfterBuckets>,
    /// By [`RequestFate`].
    requests: [Counter; 3],
    decision_latency: Histogram,
    store_latency: Histogram,
    /// By [`StoreErrorKind`], in `StoreErrorKind::ALL` order.
    store_errors: [Counter; StoreErrorKind::ALL.len()],
    upstream_status: scrape::StatusCounts,
    upstream_latency: Histogram,
    /// Timeout, unreachable.
    upstream_errors: [Counter; 2],
    /// By [`BodyTimeout`]: silence, rate.
    client_body_timeouts: [Counter; 2],
    /// Ok, error.
    reloads: [Counter; 2],
    last_reload_ok: Gauge,
    /// By [`Class`], in `Class::ALL` order.
    paths_rejected: [Counter; Class::ALL.len()],
    /// By [`RefusalReason`], in `RefusalReason::ALL` order.
    method_refusals: [Counter; RefusalReason::ALL.len()],
    /// Metered, stripped.
    method_overrides: [Counter; 2],
    /// Switched, declined.
    upgrades: [Counter; 2],
    upgraded_open: Gauge,
    /// By [`UpgradeRefusal`], in `UpgradeRefusal::ALL` order.
    upgrades_refused: [Counter; UpgradeRefusal::ALL.len()],
    upgraded_idle_closes: Counter,
    upgraded_max: Gauge,
    admission_in_flight: Family<GroupLabel, Gauge>,
    admission_queued: Family<GroupLabel, Gauge>,
    admission_shed: Family<GroupReasonLabels, Counter>,
    settings: Arc<scrape::SettingsView>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// `prometheus-client` ends each help text with a full stop of its own: the texts given to
/// `register` here leave theirs out.
///
/// Register a family whose series are all known now, and return its handles in order.
fn series<const N: usize, L: Copy>(
    registry: &mut Registry,
    name: &str,
    help: &str,
    labels: [L; N],
    label: impl Fn(L) -> TwoLabels,
) -> [Counter; N] {
    let family = Family::<TwoLabels, Counter>::default();
    registry.register(name, help, family.clone());
    labels.map(|l| family.get_or_create_owned(&label(l)))
}

/// The same, with one label per series.
fn series1<const N: usize, L: Copy>(
    registry: &mut Registry,
    name: &str,
    help: &str,
    labels: [L; N],
    label: impl Fn(L) -> OneLabel,
) -> [Counter; N] {
    let family = Family::<OneLabel, Counter>::default();
    registry.register(name, help, family.clone());
    labels.map(|l| family.get_or_create_owned(&label(l)))
}

impl Metrics {
    /// Metrics for an app with no store (an upstream or admin side on its own).
    pub fn new() -> Self {
        Self::build(None, crate::log_sink::lines_dropped)
    }

    /// Metrics for a decider over `store`: its key gauges are read at scrape time.
    pub fn for_store(store: Arc<dyn Store>) -> Self {
        Self::build(Some(store), crate::log_sink::lines_dropped)
    }

    /// Metrics for a decider over `store` with its known-agents table: the store's key gauges
    /// and the table's counts are read at scrape time.
    pub fn for_decider(store: Arc<dyn Store>, known: Arc<KnownAgents>) -> Self {
        let mut m = Self::build(Some(store), crate::log_sink::lines_dropped);
        m.registry
            .register_collector(Box::new(scrape::KnownAgentsGauges::new(known)));
        m
    }

    fn build(store: Option<Arc<dyn Store>>, log_lines_dropped: fn() -> u64) -> Self {
        let mut r = Registry::default();
        let store_kind: &'static str = store.as_ref().map_or("none", |s| s.kind());

        let decisions = Family::<LimiterOutcomeLabels, Counter>::default();
        r.register(
            "fleet_limiter_decisions",
            "Limiter decisions, by limiter and outcome",
            decisions.clone(),
        );
        let near_limit = Family::<LimiterLabel, Counter>::default();
        r.register(
            "fleet_limiter_near_limit",
            "Allowed decisions that left less than the near-limit share of the budget",
            near_limit.clone(),
        );
        let give_backs = Family::<LimiterResultLabels, Counter>::default();
        r.register(
            "fleet_limiter_give_backs",
            "Admitted requests given back because their answer should not count (limiters with count = failed or succeeded), by limiter and result: done, failed (the store could not), dropped (too many under way)",
            give_backs.clone(),
        );
        let retry_after = Family::new_with_constructor(RetryAfterBuckets);
        r.register(
            "fleet_limiter_retry_after_seconds",
            "The wait an over-budget decision asked for (refused and shadow-refused), by limiter",
            retry_after.clone(),
        );
        let requests = series1(
            &mut r,
            "fleet_limiter_requests",
            "Requests, by what limiting did with them",
            RequestFate::ALL,
            |f| [("outcome", f.as_str())],
        );
        let decision_latency = Histogram::nanos(histogram::FAST_NS);
        r.register(
            "fleet_limiter_decision_duration_seconds",
            "Time to decide one metered request (identity, policy, keys and store)",
            decision_latency.clone(),
        );
        let store_latency = Histogram::nanos(histogram::FAST_NS);
        let durations = Family::<OneLabel, Histogram, _>::new_with_constructor({
            let h = store_latency.clone();
            move || h.clone()
        });
        let _ = durations.get_or_create(&[("store", store_kind)]);
        r.register(
            "fleet_limiter_store_duration_seconds",
            "Store round trips, answered or failed",
            durations,
        );
        let store_errors = series(
            &mut r,
            "fleet_limiter_store_errors",
            "Store round trips that failed, by kind of failure",
            StoreErrorKind::ALL,
            |k| [("store", store_kind), ("kind", k.as_str())],
        );
        if let Some(store) = store {
            r.register_collector(Box::new(scrape::StoreGauges::new(store)));
        }
        let upstream_status = scrape::StatusCounts::default();
        r.register(
            "fleet_limiter_upstream_responses",
            "Upstream responses, by status code",
            upstream_status.clone(),
        );
        let upstream_errors = series1(
            &mut r,
            "fleet_limiter_upstream_errors",
            "Forwarded requests the upstream never answered: timeout (504) or unreachable (502)",
            ["timeout", "unreachable"],
            |k| [("kind", k)],
        );
        let upstream_latency = Histogram::nanos(histogram::UPSTREAM_NS);
        r.register(
            "fleet_limiter_upstream_duration_seconds",
            "Time from forwarding a request to the upstream's response headers",
            upstream_latency.clone(),
        );
        let client_body_timeouts = series1(
            &mut r,
            "fleet_limiter_client_body_timeouts",
            "Requests cut off because the client sent the body too slowly: silence (server.body_timeout) or rate (server.body_min_rate)",
            ["silence", "rate"],
            |k| [("rule", k)],
        );
        let upgrades = series1(
            &mut r,
            "fleet_limiter_upgrades",
            "WebSocket handshakes forwarded, by the upstream's answer: switched (101, connections spliced) or declined (any other answer, passed through)",
            ["switched", "declined"],
            |k| [("result", k)],
        );
        let upgraded_open = Gauge::default();
        r.register(
            "fleet_limiter_upgraded_connections",
            "Upgraded (WebSocket) connections spliced to the upstream now",
            upgraded_open.clone(),
        );
        let upgrades_refused = series1(
            &mut r,
            "fleet_limiter_upgrades_refused",
            "WebSocket handshakes refused before the upstream saw them, by reason: max_open (503: as many open as websocket.max_open allows) or max_per_client (429: the client address holds websocket.max_per_client)",
            UpgradeRefusal::ALL,
            |k| [("reason", k.as_str())],
        );
        let upgraded_idle_closes = Counter::default();
        r.register(
            "fleet_limiter_upgraded_idle_closes",
            "Upgraded (WebSocket) connections closed on both sides after websocket.idle_timeout with no byte either way",
            upgraded_idle_closes.clone(),
        );
        let upgraded_max = Gauge::default();
        r.register(
            "fleet_limiter_upgraded_connections_max",
            "The most upgraded (WebSocket) connections open at once (websocket.max_open, set or derived from the descriptor limit at start)",
            upgraded_max.clone(),
        );
        let admission_in_flight = Family::<GroupLabel, Gauge>::default();
        r.register(
            "fleet_limiter_admission_in_flight",
            "Requests holding an admission slot now (forwarded to the upstream, answer not yet finished), by admission group",
            admission_in_flight.clone(),
        );
        let admission_queued = Family::<GroupLabel, Gauge>::default();
        r.register(
            "fleet_limiter_admission_queued",
            "Requests waiting for an admission slot now, by admission group",
            admission_queued.clone(),
        );
        let admission_shed = Family::<GroupReasonLabels, Counter>::default();
        r.register(
            "fleet_limiter_admission_shed",
"Requests admission control turned away or cut off, by admission group and reason: queue_full (503: no slot and no room to wait), queue_timeout (503: waited admission.queue_timeout), client_share (429: the client address held its share of the group's slots, admission.client_share_percent) or body_hold (408: its body still arriving after admission.body_hold while it held a slot)",
            admission_shed.clone(),
        );
        let paths_rejected = series1(
            &mut r,
            "fleet_limiter_paths_rejected",
            "Requests refused with 400 before any limiter because their path has no canonical form (at the decision endpoint: because the original target is not its own canonical form), by class",
            Class::ALL,
            |c| [("class", c.as_str())],
        );
        let method_refusals = series1(
            &mut r,
            "fleet_limiter_method_refusals",
            "Requests the gateway answered itself for their method, by reason: method_not_allowed (501: not in methods.allowed) or an override refused with 400 (override_refused, override_unstrippable, override_not_a_method, override_not_allowed, override_too_many)",
            RefusalReason::ALL,
            |c| [("reason", c.as_str())],
        );
        let method_overrides = series1(
            &mut r,
            "fleet_limiter_method_overrides",
            "Requests that named a method override and were not refused for it, by action: metered (charged as their own method and as every method named; a limiter may still refuse them) or stripped (the override removed before the upstream saw it)",
            ["metered", "stripped"],
            |k| [("action", k)],
        );
        let reloads = series1(
            &mut r,
            "fleet_limiter_config_reloads",
            "Configuration reloads, by result",
            ["ok", "error"],
            |k| [("result", k)],
        );
        let last_reload_ok = Gauge::default();
        last_reload_ok.set(1);
        r.register(
            "fleet_limiter_config_last_reload_successful",
            "1 when the last reload took effect (or none was asked), 0 when the old configuration is still in use after a failed one",
            last_reload_ok.clone(),
        );
        let settings = Arc::new(scrape::SettingsView::default());
        r.register_collector(Box::new(scrape::Process {
            settings: settings.clone(),
            log_lines_dropped,
        }));
        Self {
            registry: r,
            decisions,
            near_limit,
            give_backs,
            retry_after,
            requests,
            decision_latency,
            store_latency,
            store_errors,
            upstream_status,
            upstream_latency,
            upstream_errors,
            client_body_timeouts,
            reloads,
            last_reload_ok,
            paths_rejected,
            method_refusals,
            method_overrides,
            upgrades,
            upgraded_open,
            upgrades_refused,
            upgraded_idle_closes,
            upgraded_max,
            admission_in_flight,
            admission_queued,
            admission_shed,
            settings,
        }
    }

    /// Take a configuration's settings: whether limiting is on, its limiters (each appears at
    /// zero before its first decision, and `/metrics` describes it), and the near-limit
    /// threshold. Returns each limiter's handles, in the order given. Called at start and on
    /// every reload; a limiter's counts carry over a reload that keeps its name.
    pub fn configure(
        &self,
        enabled: bool,
        limiters: &[Arc<LimiterSpec>],
        near_limit_percent: u8,
    ) -> Box<[LimiterMeter]> {
        let near_limit_percent = near_limit_percent.min(100);
        self.settings.set(enabled, limiters, near_limit_percent);
        limiters
            .iter()
            .map(|l| {
                let limiter = || LimiterLabel {
                    limiter: l.name.to_string(),
                };
                LimiterMeter {
                    fates: LimiterFate::ALL.map(|f| {
                        self.decisions.get_or_create_owned(&LimiterOutcomeLabels {
                            limiter: l.name.to_string(),
                            outcome: f.as_str(),
                        })
                    }),
                    near_limit: self.near_limit.get_or_create_owned(&limiter()),
                    retry_after: self.retry_after.get_or_create_owned(&limiter()),
                    near_limit_percent,
                    give_backs: (l.count != crate::policy::Count::All).then(|| {
                        GiveBackResult::ALL.map(|r| {
                            self.give_backs.get_or_create_owned(&LimiterResultLabels {
                                limiter: l.name.to_string(),
                                result: r.as_str(),
                            })
                        })
                    }),
                }
            })
            .collect()
    }

    /// Count one request by what limiting did with it; a metered one also counts how long its
    /// decision took.
    pub fn request(&self, fate: RequestFate, elapsed: Duration) {
        if let Some(c) = self.requests.get(fate as usize) {
            c.inc();
        }
        if fate != RequestFate::Unmetered {
            self.decision_latency.observe_duration(elapsed);
        }
    }

    /// One store round trip: answered (`None`), or failed with an error of this kind.
    pub fn store_round_trip(&self, elapsed: Duration, failed: Option<StoreErrorKind>) {
        self.store_latency.observe_duration(elapsed);
        if let Some(c) = failed.and_then(|k| self.store_errors.get(k.index())) {
            c.inc();
        }
    }

    /// The upstream answered with `status` after `elapsed` (time to response headers).
    pub fn upstream_response(&self, status: u16, elapsed: Duration) {
        self.upstream_status.count(status);
        self.upstream_latency.observe_duration(elapsed);
    }

    /// The upstream could not be reached (502) or did not answer in time (504).
    pub fn upstream_failed(&self, timed_out: bool) {
        self.upstream_errors[usize::from(!timed_out)].inc();
    }

    /// A request refused with 400 because its path has no canonical form.
    pub fn path_rejected(&self, class: Class) {
        if let Some(c) = Class::ALL
            .iter()
            .position(|k| *k == class)
            .and_then(|i| self.paths_rejected.get(i))
        {
            c.inc();
        }
    }

    /// A request answered by the gateway for its method or its method override.
    pub fn method_refused(&self, reason: RefusalReason) {
        if let Some(c) = RefusalReason::ALL
            .iter()
            .position(|k| *k == reason)
            .and_then(|i| self.method_refusals.get(i))
        {
            c.inc();
        }
    }

    /// A request that named a method override went on: metered as every method it named
    /// (`stripped == false`), or with the override removed.
    pub fn method_override(&self, stripped: bool) {
        self.method_overrides[usize::from(stripped)].inc();
    }

    /// A client's request body was cut off because it broke `rule`. The hold rule is admission
    /// control's, and counted there (`ShedReason::BodyHold`), not here.
    pub fn client_body_timeout(&self, rule: BodyTimeout) {
        let i = match rule {
            BodyTimeout::Silence => 0,
            BodyTimeout::Rate => 1,
        };
        self.client_body_timeouts[i].inc();
    }

    /// The upstream answered a WebSocket handshake: switched protocols (`101`) or not.
    pub fn upgrade(&self, switched: bool) {
        self.upgrades[usize::from(!switched)].inc();
    }

    /// An upgraded connection was spliced to the upstream.
    pub fn upgraded_opened(&self) {
        self.upgraded_open.inc();
    }

    /// A WebSocket handshake was refused before the upstream saw it.
    pub fn upgrade_refused(&self, reason: UpgradeRefusal) {
        self.upgrades_refused[reason as usize].inc();
    }

    /// An upgraded connection was closed for having been idle both ways.
    pub fn upgraded_idle_closed(&self) {
        self.upgraded_idle_closes.inc();
    }

    /// The cap on upgraded connections in force.
    pub fn upgraded_connections_max(&self, max: usize) {
        self.upgraded_max
            .set(i64::try_from(max).unwrap_or(i64::MAX));
    }

    /// An upgraded connection closed (each one opened closes once).
    pub fn upgraded_closed(&self) {
        let _ =
            self.upgraded_open
                .inner()
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                    (n > 0).then(|| n - 1)
                });
    }

    /// The handles of admission group `group`: its series appear (at zero) now. Called once per
    /// group when the gateway is built.
    pub fn admission_meter(&self, group: &str) -> AdmissionMeter {
        let label = || GroupLabel {
            group: group.to_owned(),
        };
        AdmissionMeter {
            in_flight: self.admission_in_flight.get_or_create_owned(&label()),
            queued: self.admission_queued.get_or_create_owned(&label()),
            shed: ShedReason::ALL.map(|reason| {
                self.admission_shed.get_or_create_owned(&GroupReasonLabels {
                    group: group.to_owned(),
                    reason: reason.as_str(),
                })
            }),
        }
    }

    /// A reload was asked for: it took effect, or the old configuration stays.
    pub fn reloaded(&self, ok: bool) {
        self.reloads[usize::from(!ok)].inc();
        self.last_reload_ok.set(i64::from(ok));
    }

    /// How many decisions a limiter has counted with this fate.
    pub fn decisions(&self, limiter: &str, fate: LimiterFate) -> u64 {
        self.decisions
            .get(&LimiterOutcomeLabels {
                limiter: limiter.to_owned(),
                outcome: fate.as_str(),
            })
            .map_or(0, |c| c.get())
    }

    /// How many allowed decisions of a limiter left less than the near-limit share.
    pub fn near_limit(&self, limiter: &str) -> u64 {
        self.near_limit
            .get(&LimiterLabel {
                limiter: limiter.to_owned(),
            })
            .map_or(0, |c| c.get())
    }

    /// Everything, in the Prometheus text exposition format (version 0.0.4).
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(16 * 1024);
        if let Err(e) =
            prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry)
        {
            tracing::warn!(error = %e, "metrics page could not be rendered in full");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Policy;

    fn line<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
        text.lines().find(|l| l.starts_with(prefix))
    }

    fn two_limiters() -> Vec<Arc<LimiterSpec>> {
        let cfg = crate::config::Config::default();
        cfg.limiters.iter().take(2).cloned().map(Arc::new).collect()
    }

    #[test]
    fn fates_near_limit_retry_after_and_requests_are_counted() {
        let m = Metrics::new();
        let specs = two_limiters();
        let (a, b) = (specs[0].name.to_string(), specs[1].name.to_string());
        let meters = m.configure(true, &specs, 20);
        let micros = Duration::from_micros(30);
        meters[0].record(LimiterFate::Allowed, 1, 10, 0);
        meters[1].record(LimiterFate::ShadowRefused, 0, 10, 7);
        m.request(RequestFate::Forwarded, micros);
        meters[0].record(LimiterFate::Refused, 0, 10, 0);
        m.request(RequestFate::Refused, micros);
        meters[0].record(LimiterFate::StoreErrorAllowed, 0, 10, 0);
        m.request(RequestFate::Forwarded, micros);
        m.request(RequestFate::Unmetered, Duration::ZERO);
        assert_eq!(m.decisions(&a, LimiterFate::Allowed), 1);
        assert_eq!(m.decisions(&a, LimiterFate::Refused), 1);
        assert_eq!(m.decisions(&a, LimiterFate::StoreErrorAllowed), 1);
        assert_eq!(m.decisions(&b, LimiterFate::ShadowRefused), 1);
        assert_eq!(m.near_limit(&a), 1);
        let text = m.render();
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
                "fleet_limiter_decision_duration_seconds_bucket{le=\"2.5e-05\"}"
            ),
            Some("fleet_limiter_decision_duration_seconds_bucket{le=\"2.5e-05\"} 0")
        );
        assert_eq!(
            line(
                &text,
                "fleet_limiter_decision_duration_seconds_bucket{le=\"5e-05\"}"
            ),
            Some("fleet_limiter_decision_duration_seconds_bucket{le=\"5e-05\"} 3")
        );
        // The refusal asked for no wait yet counts as 1 s; the shadow refusal asked for 7 s.
        let bucket = |limiter: &str, le: &str| {
            let p = format!(
                "fleet_limiter_retry_after_seconds_bucket{{limiter=\"{limiter}\",le=\"{le}\"}} "
            );
            line(&text, &p).map(|l| l[p.len()..].to_owned())
        };
        assert_eq!(bucket(&a, "1").as_deref(), Some("1"));
        assert_eq!(bucket(&b, "5").as_deref(), Some("0"));
        assert_eq!(bucket(&b, "10").as_deref(), Some("1"));
    }

    #[test]
    fn counts_carry_over_a_reload_that_keeps_the_limiter() {
        let m = Metrics::new();
        let specs = two_limiters();
        let name = specs[0].name.to_string();
        m.configure(true, &specs, 20)[0].record(LimiterFate::Allowed, 5, 10, 0);
        m.configure(true, &specs[..1], 50)[0].record(LimiterFate::Allowed, 4, 10, 0);
        assert_eq!(m.decisions(&name, LimiterFate::Allowed), 2);
        assert_eq!(m.near_limit(&name), 1, "only the second is under 50%");
        assert!(m.render().contains("fleet_limiter_near_limit_ratio 0.5\n"));
    }

    #[test]
    fn upstream_statuses_out_of_range_are_ignored() {
        let m = Metrics::new();
        m.upstream_response(204, Duration::from_millis(3));
        m.upstream_response(42, Duration::from_millis(3));
        m.upstream_response(999, Duration::from_millis(3));
        let text = m.render();
        assert!(text.contains("fleet_limiter_upstream_responses_total{status=\"204\"} 1\n"));
        assert!(!text.contains("status=\"42\""));
        assert!(text.contains("fleet_limiter_upstream_duration_seconds_count 3\n"));
    }

    #[test]
    fn exposition_page_of_the_default_calibration() {
        let cfg = crate::config::Config::default();
        let policy = Policy::new(cfg.limiters.clone());
        // The page does not depend on what other tests in this process logged.
        let m = Metrics::build(None, || 0);
        let meters = m.configure(cfg.enabled, policy.limiters(), cfg.ops.near_limit_percent);
        let agent = policy
            .limiters()
            .iter()
            .position(|l| &*l.name == "agent-device")
            .expect("built-in");
        meters[agent].record(LimiterFate::Refused, 0, 10, 3);
        m.request(RequestFate::Refused, Duration::from_micros(40));
        m.store_round_trip(Duration::from_micros(3), None);
        m.store_round_trip(Duration::from_micros(9), Some(StoreErrorKind::Timeout));
        m.upstream_response(200, Duration::from_millis(12));
        m.upstream_failed(true);
        m.client_body_timeout(BodyTimeout::Rate);
        m.upgrade(true);
        m.upgrade(false);
        m.upgraded_opened();
        m.upgraded_opened();
        m.upgraded_closed();
        m.upgrade_refused(UpgradeRefusal::MaxPerClient);
        m.upgraded_idle_closed();
        m.upgraded_connections_max(128);
        m.reloaded(false);
        snap!("metrics_page", sorted_series(&m.render()));
    }

    /// The page with each family's series in order of their labels (`prometheus-client` writes
    /// a family's series in hash order, which Prometheus does not mind and a snapshot does); a
    /// histogram's buckets keep their order.
    fn sorted_series(page: &str) -> String {
        fn without_le(l: &str) -> String {
            match l.find("le=\"") {
                Some(i) => {
                    let end = l[i + 4..].find('"').map_or(l.len(), |j| i + 5 + j);
                    format!("{}{}", &l[..i], &l[end..])
                }
                None => l.to_owned(),
            }
        }
        let mut out = String::new();
        let mut block: Vec<&str> = Vec::new();
        let flush = |block: &mut Vec<&str>, out: &mut String| {
            block.sort_by_key(|l| without_le(l));
            block.drain(..).for_each(|b| out.extend([b, "\n"]));
        };
        for l in page.lines() {
            if l.starts_with('#') {
                flush(&mut block, &mut out);
                out.extend([l, "\n"]);
            } else {
                block.push(l);
            }
        }
        flush(&mut block, &mut out);
        out
    }

    #[test]
    fn every_fate_has_a_stable_name() {
        let names: Vec<&str> = LimiterFate::ALL.iter().map(|o| o.as_str()).collect();
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
    }

    #[test]
    fn label_values_are_escaped() {
        let m = Metrics::new();
        let mut spec = (*two_limiters()[0]).clone();
        spec.name = Arc::from("a\"b\\c\nd");
        m.configure(true, &[Arc::new(spec)], 20)[0].record(LimiterFate::Allowed, 9, 10, 0);
        let text = m.render();
        assert!(
            text.contains("fleet_limiter_near_limit_total{limiter=\"a\\\"b\\\\c\\nd\"} 0\n"),
            "{text}"
        );
    }
}
