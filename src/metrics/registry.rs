//! The registry a decider's metrics render from: every family registered once, with the
//! collectors that read the store, the known agents and the log sink at scrape time.

use super::histogram::{self, Histogram, RetryAfterBuckets};
use super::labels::{
    GroupLabel, GroupReasonLabels, LimiterLabel, LimiterOutcomeLabels, LimiterResultLabels,
    OneLabel, RequestFate, RouteLabel, TwoLabels, UpgradeRefusal,
};
use super::scrape;
use super::striped::Counter;
use super::Metrics;
use crate::config::shaping::Priority;
use crate::known_agents::KnownAgents;
use crate::methods::RefusalReason;
use crate::path::Class;
use crate::store::{Store, StoreErrorKind};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::Arc;

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
    pub(crate) fn for_decider(
        store: Arc<dyn Store>,
        known: Arc<KnownAgents>,
        top: Arc<crate::top::TopTalkers>,
        pressure: Arc<dyn scrape::ReadPressure>,
    ) -> Self {
        let mut m = Self::build(Some(store), crate::log_sink::lines_dropped);
        m.registry
            .register_collector(Box::new(scrape::PressureGauges::new(pressure)));
        m.registry
            .register_collector(Box::new(scrape::KnownAgentsGauges::new(known)));
        m.registry
            .register_collector(Box::new(scrape::TopGauges::new(top)));
        m
    }

    /// Every family registered once, group by group, with the store's gauges (when there is a
    /// store) and the process collector reading `log_lines_dropped` at scrape time.
    pub(super) fn build(store: Option<Arc<dyn Store>>, log_lines_dropped: fn() -> u64) -> Self {
        let mut r = Registry::default();
        let DecisionFamilies {
            decisions,
            near_limit,
            give_backs,
            retry_after,
            requests,
            decision_latency,
        } = DecisionFamilies::register(&mut r);
        let StoreFamilies {
            store_latency,
            store_errors,
        } = StoreFamilies::register(&mut r, store);
        let UpstreamFamilies {
            upstream_status,
            upstream_errors,
            upstream_latency,
            client_body_timeouts,
        } = UpstreamFamilies::register(&mut r);
        let UpgradeFamilies {
            upgrades,
            upgraded_open,
            upgrades_refused,
            upgraded_idle_closes,
            upgraded_max,
        } = UpgradeFamilies::register(&mut r);
        let AdmissionFamilies {
            admission_in_flight,
            admission_queued,
            admission_shed,
        } = AdmissionFamilies::register(&mut r);
        let rls_decisions = register_rls_decisions(&mut r);
        let shaping = ShapingFamilies::register(&mut r);
        let RefusalFamilies {
            paths_rejected,
            method_refusals,
            bodies_refused,
            method_overrides,
        } = RefusalFamilies::register(&mut r);
        let ReloadFamilies {
            reloads,
            last_reload_ok,
            settings,
        } = ReloadFamilies::register(&mut r, log_lines_dropped);
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
            bodies_refused,
            method_overrides,
            upgrades,
            upgraded_open,
            upgrades_refused,
            upgraded_idle_closes,
            upgraded_max,
            admission_in_flight,
            admission_queued,
            admission_shed,
            rls_decisions,
            shaping,
            settings,
        }
    }
}

/// `[shaping]`: the poll hints said, the requests shed by priority and the requests turned
/// away at a route's in-flight cap.
pub(super) struct ShapingFamilies {
    pub(super) hints: Family<RouteLabel, Counter>,
    pub(super) hint_seconds: Family<RouteLabel, Counter>,
    /// By priority, in `Priority::ALL` order.
    pub(super) shed: [Counter; Priority::ALL.len()],
    pub(super) capped: Family<RouteLabel, Counter>,
}

impl ShapingFamilies {
    /// Registers the shaping families in `r`.
    fn register(r: &mut Registry) -> Self {
        let hints = Family::<RouteLabel, Counter>::default();
        r.register(
            "fleet_limiter_poll_hints",
            "Answers that carried X-Poll-Interval, by shaped route ([shaping.routes.<name>])",
            hints.clone(),
        );
        let hint_seconds = Family::<RouteLabel, Counter>::default();
        r.register(
            "fleet_limiter_poll_hint_seconds",
            "The seconds those hints said, summed, by shaped route: over fleet_limiter_poll_hints_total, the mean hint (it grows while the upstream's pressure stretches the interval)",
            hint_seconds.clone(),
        );
        let shed = series1(
            r,
            "fleet_limiter_shaping_shed",
            "Requests answered 503 at once because the upstream missed [shaping.upstream]'s target, by the route's priority (low first, then normal, then high; critical never)",
            Priority::ALL,
            |p| [("priority", p.as_str())],
        );
        let capped = Family::<RouteLabel, Counter>::default();
        r.register(
            "fleet_limiter_shaping_in_flight_capped",
            "Requests answered 429 at once because their principal (client address, or verified user with in_flight_per = \"user\") already had max_in_flight requests at the upstream on the route, by shaped route",
            capped.clone(),
        );
        Self {
            hints,
            hint_seconds,
            shed,
            capped,
        }
    }
}

/// The limiters' decisions: outcomes, near-limit allows, give-backs, waits asked for, request
/// fates and the time to decide.
struct DecisionFamilies {
    decisions: Family<LimiterOutcomeLabels, Counter>,
    near_limit: Family<LimiterLabel, Counter>,
    give_backs: Family<LimiterResultLabels, Counter>,
    retry_after: Family<LimiterLabel, Histogram, RetryAfterBuckets>,
    requests: [Counter; RequestFate::ALL.len()],
    decision_latency: Histogram,
}

impl DecisionFamilies {
    /// Registers the decision families in `r`.
    fn register(r: &mut Registry) -> Self {
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
            r,
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
        Self {
            decisions,
            near_limit,
            give_backs,
            retry_after,
            requests,
            decision_latency,
        }
    }
}

/// The store's round trips and failures, and its key gauges read at scrape time.
struct StoreFamilies {
    store_latency: Histogram,
    store_errors: [Counter; StoreErrorKind::ALL.len()],
}

impl StoreFamilies {
    /// Registers the store families in `r`, labelled with the kind of `store` (`none` without one).
    fn register(r: &mut Registry, store: Option<Arc<dyn Store>>) -> Self {
        let store_kind: &'static str = store.as_ref().map_or("none", |s| s.kind());
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
            r,
            "fleet_limiter_store_errors",
            "Store round trips that failed, by kind of failure",
            StoreErrorKind::ALL,
            |k| [("store", store_kind), ("kind", k.as_str())],
        );
        if let Some(store) = store {
            r.register_collector(Box::new(scrape::StoreGauges::new(store)));
        }
        Self {
            store_latency,
            store_errors,
        }
    }
}

/// The upstream's answers, failures and latency, and the client bodies cut off on the way.
struct UpstreamFamilies {
    upstream_status: scrape::StatusCounts,
    upstream_errors: [Counter; 2],
    upstream_latency: Histogram,
    client_body_timeouts: [Counter; 2],
}

impl UpstreamFamilies {
    /// Registers the upstream families in `r`.
    fn register(r: &mut Registry) -> Self {
        let upstream_status = scrape::StatusCounts::default();
        r.register(
            "fleet_limiter_upstream_responses",
            "Upstream responses, by status code",
            upstream_status.clone(),
        );
        let upstream_errors = series1(
            r,
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
            r,
            "fleet_limiter_client_body_timeouts",
            "Requests cut off because the client sent the body too slowly: silence (server.body_timeout) or rate (server.body_min_rate)",
            ["silence", "rate"],
            |k| [("rule", k)],
        );
        Self {
            upstream_status,
            upstream_errors,
            upstream_latency,
            client_body_timeouts,
        }
    }
}

/// WebSocket upgrades: handshakes forwarded and refused, connections open, idle closes and the
/// most allowed open.
struct UpgradeFamilies {
    upgrades: [Counter; 2],
    upgraded_open: Gauge,
    upgrades_refused: [Counter; UpgradeRefusal::ALL.len()],
    upgraded_idle_closes: Counter,
    upgraded_max: Gauge,
}

impl UpgradeFamilies {
    /// Registers the upgrade families in `r`.
    fn register(r: &mut Registry) -> Self {
        let upgrades = series1(
            r,
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
            r,
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
        Self {
            upgrades,
            upgraded_open,
            upgrades_refused,
            upgraded_idle_closes,
            upgraded_max,
        }
    }
}

/// Admission control: slots held, requests waiting, and requests turned away, by group.
struct AdmissionFamilies {
    admission_in_flight: Family<GroupLabel, Gauge>,
    admission_queued: Family<GroupLabel, Gauge>,
    admission_shed: Family<GroupReasonLabels, Counter>,
}

impl AdmissionFamilies {
    /// Registers the admission families in `r`.
    fn register(r: &mut Registry) -> Self {
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
        Self {
            admission_in_flight,
            admission_queued,
            admission_shed,
        }
    }
}

/// Registers in `r` the descriptors the Envoy rate-limit service answered.
fn register_rls_decisions(r: &mut Registry) -> Family<super::labels::RlsLabels, Counter> {
    let rls_decisions = Family::<super::labels::RlsLabels, Counter>::default();
    r.register(
        "fleet_limiter_rls_decisions",
        "Descriptors answered by the Envoy rate-limit service (rls.listen), by domain (a configured one, or unknown), rule (the descriptor path in the YAML, or none) and outcome: ok, over_limit, shadow_over_limit (over the limit in shadow mode, answered OK), unlimited, no_rule (no rule matched: OK, as the reference answers)",
        rls_decisions.clone(),
    );
    rls_decisions
}

/// Requests the gateway answers itself before any limiter: paths with no canonical form,
/// refused methods and unreadable bodies; and the method overrides it let through.
struct RefusalFamilies {
    paths_rejected: [Counter; Class::ALL.len()],
    method_refusals: [Counter; RefusalReason::ALL.len()],
    bodies_refused: [Counter; crate::keys::body::Unreadable::ALL.len()],
    method_overrides: [Counter; 2],
}

impl RefusalFamilies {
    /// Registers the refusal and override families in `r`.
    fn register(r: &mut Registry) -> Self {
        let paths_rejected = series1(
            r,
            "fleet_limiter_paths_rejected",
            "Requests refused with 400 before any limiter because their path has no canonical form (at the decision endpoint: because the original target is not its own canonical form), by class",
            Class::ALL,
            |c| [("class", c.as_str())],
        );
        let method_refusals = series1(
            r,
            "fleet_limiter_method_refusals",
            "Requests the gateway answered itself for their method, by reason: method_not_allowed (501: not in methods.allowed) or an override refused with 400 (override_refused, override_unstrippable, override_not_a_method, override_not_allowed, override_too_many)",
            RefusalReason::ALL,
            |c| [("reason", c.as_str())],
        );
        let bodies_refused = series1(
            r,
            "fleet_limiter_bodies_refused",
            "Requests on a route a body: limiter meters, refused before any limiter because their body cannot be read with certainty, by reason: media-type, charset, encoding (415), too-large (413), malformed, too-deep, ambiguous, value, broken (400), too-slow (408)",
            crate::keys::body::Unreadable::ALL,
            |c| [("reason", c.as_str())],
        );
        let method_overrides = series1(
            r,
            "fleet_limiter_method_overrides",
            "Requests that named a method override and were not refused for it, by action: metered (charged as their own method and as every method named; a limiter may still refuse them) or stripped (the override removed before the upstream saw it)",
            ["metered", "stripped"],
            |k| [("action", k)],
        );
        Self {
            paths_rejected,
            method_refusals,
            bodies_refused,
            method_overrides,
        }
    }
}

/// Configuration reloads and the settings in force, with the process collector (settings and
/// the log sink's dropped lines) read at scrape time.
struct ReloadFamilies {
    reloads: [Counter; 2],
    last_reload_ok: Gauge,
    settings: Arc<scrape::SettingsView>,
}

impl ReloadFamilies {
    /// Registers the reload families and the process collector in `r`.
    fn register(r: &mut Registry, log_lines_dropped: fn() -> u64) -> Self {
        let reloads = series1(
            r,
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
            reloads,
            last_reload_ok,
            settings,
        }
    }
}
