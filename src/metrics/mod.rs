//! The limiter's metrics, on the official client (`prometheus-client`): per-limiter decisions by
//! fate, near-limit decisions and `Retry-After`, decision, store and upstream latency, upstream
//! statuses, reloads. Each [`Metrics`] belongs to one decider (one gateway or one embedded
//! limiter) and is fed plain facts. Recording is one atomic add per counter, on the recording
//! thread's own stripe of it (`striped.rs`: workers never write a shared line): each limiter's
//! handles ([`LimiterMeter`]) are resolved once, when the settings are built, never looked up
//! per request. What the store and the settings hold now (tracked keys, limiter budgets) is read
//! at scrape time by collectors (`scrape.rs`).

mod histogram;
mod labels;
mod meter;
mod registry;
mod scrape;
mod striped;
#[cfg(test)]
mod tests;

use crate::keys::body::Unreadable;

pub(crate) use crate::config::ops::NEAR_LIMIT_PERCENT;
pub(crate) use histogram::Histogram;
use histogram::RetryAfterBuckets;

use crate::methods::RefusalReason;
use crate::path::Class;
use crate::policy::LimiterSpec;
use crate::store::StoreErrorKind;
pub use labels::LimiterFate;
pub(crate) use labels::{BodyTimeout, GiveBackResult, RequestFate, ShedReason, UpgradeRefusal};
use labels::{
    GroupLabel, GroupReasonLabels, LimiterLabel, LimiterOutcomeLabels, LimiterResultLabels,
};
pub(crate) use meter::{AdmissionMeter, LimiterMeter, ShapingMeter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
pub(crate) use scrape::{PressureSnapshot, ReadPressure};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use striped::Counter;

/// The `Content-Type` of `/metrics`: the Prometheus text format, version 0.0.4.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// One decider's metrics: the registry `/metrics` renders, and the handles that feed it.
pub struct Metrics {
    registry: Registry,
    decisions: Family<LimiterOutcomeLabels, Counter>,
    near_limit: Family<LimiterLabel, Counter>,
    give_backs: Family<LimiterResultLabels, Counter>,
    retry_after: Family<LimiterLabel, Histogram, RetryAfterBuckets>,
    /// By [`RequestFate`].
    requests: [Counter; RequestFate::ALL.len()],
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
    /// By [`Unreadable`], in `Unreadable::ALL` order.
    bodies_refused: [Counter; Unreadable::ALL.len()],
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
    rls_decisions: Family<labels::RlsLabels, Counter>,
    /// Poll hints, shedding by priority and in-flight caps (`[shaping]`).
    shaping: registry::ShapingFamilies,
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

impl Metrics {
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

    /// A request on a `body:` route refused because its body cannot be read with certainty.
    pub(crate) fn body_refused(&self, why: Unreadable) {
        if let Some(c) = Unreadable::ALL
            .iter()
            .position(|k| *k == why)
            .and_then(|i| self.bodies_refused.get(i))
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
    /// The counters of shaped route `route`: its series appear at zero from now on (the hint
    /// series when it has an interval, the capped series when it has a cap).
    pub(crate) fn shaping_meter(&self, route: &str, interval: bool, capped: bool) -> ShapingMeter {
        let label = labels::RouteLabel {
            route: route.to_owned(),
        };
        let mut m = ShapingMeter::default();
        if interval {
            m.hints = self.shaping.hints.get_or_create_owned(&label);
            m.hint_seconds = self.shaping.hint_seconds.get_or_create_owned(&label);
        }
        if capped {
            m.capped = self.shaping.capped.get_or_create_owned(&label);
        }
        m
    }

    /// A request of `priority` was shed: the upstream is missing its target.
    pub(crate) fn shaping_shed(&self, priority: crate::config::shaping::Priority) {
        self.shaping.shed[priority.rank() as usize].inc();
    }

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

    /// One descriptor answered by the Envoy rate-limit service: its domain (configured, or
    /// `unknown`), its rule (`none` when no rule matched) and its outcome (`ok`, `over_limit`,
    /// `shadow_over_limit`, `unlimited`, `no_rule`).
    pub fn rls_decision(&self, domain: &str, rule: &str, outcome: &'static str) {
        self.rls_decisions
            .get_or_create(&labels::RlsLabels {
                domain: domain.to_owned(),
                rule: rule.to_owned(),
                outcome,
            })
            .inc();
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
