//! What `/metrics` reads at scrape time rather than counts as it goes: the store's key gauges,
//! the limiters the settings in force describe, the process-wide log sink, and the upstream
//! status counts (kept as a plain array of atomics, shown only for statuses seen).

use crate::known_agents::KnownAgents;
use crate::policy::{LimiterSpec, Mode};
use crate::store::Store;
use parking_lot::RwLock;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::{MetricType, TypedMetric};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Write one metric with no labels.
fn one(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    metric: &impl EncodeMetric,
) -> Result<(), std::fmt::Error> {
    let m = encoder.encode_descriptor(name, help, None, metric.metric_type())?;
    metric.encode(m)
}

/// Write one metric with one label.
fn labelled(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    label: (&str, &str),
    metric: &impl EncodeMetric,
) -> Result<(), std::fmt::Error> {
    let mut m = encoder.encode_descriptor(name, help, None, metric.metric_type())?;
    metric.encode(m.encode_family(&[label])?)
}

/// The store's gauges, read from the store when scraped.
pub(super) struct StoreGauges(Arc<dyn Store>);

impl StoreGauges {
    pub(super) fn new(store: Arc<dyn Store>) -> Self {
        Self(store)
    }
}

impl std::fmt::Debug for StoreGauges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("StoreGauges").field(&self.0.kind()).finish()
    }
}

impl Collector for StoreGauges {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let store = ("store", self.0.kind());
        labelled(
            &mut encoder,
            "fleet_limiter_tracked_keys",
            "Buckets the store holds now.",
            store,
            &ConstGauge::new(i64::try_from(self.0.tracked_keys()).unwrap_or(i64::MAX)),
        )?;
        labelled(
            &mut encoder,
            "fleet_limiter_evicted_keys",
            "Buckets dropped to stay within the key cap while still active.",
            store,
            &ConstCounter::new(self.0.evicted_keys()),
        )?;
        if let Some(calls) = self.0.calls() {
            labelled(
                &mut encoder,
                "fleet_limiter_store_calls",
                "Calls sent to the store (concurrent requests share calls on a standalone Redis).",
                store,
                &ConstCounter::new(calls),
            )?;
        }
        if let Some(n) = self.0.failovers() {
            labelled(
                &mut encoder,
                "fleet_limiter_store_failovers",
                "Switches to another Redis primary named by the Sentinels (Sentinel only).",
                store,
                &ConstCounter::new(n),
            )?;
        }
        Ok(())
    }
}

/// The known-agents table's counts, read from the table when scraped.
pub(super) struct KnownAgentsGauges(Arc<KnownAgents>);

impl KnownAgentsGauges {
    pub(super) fn new(known: Arc<KnownAgents>) -> Self {
        Self(known)
    }
}

impl std::fmt::Debug for KnownAgentsGauges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("KnownAgentsGauges").finish_non_exhaustive()
    }
}

/// The top-talker sketches' size and evictions, read at scrape time.
pub(super) struct TopGauges(Arc<crate::top::TopTalkers>);

impl TopGauges {
    pub(super) fn new(top: Arc<crate::top::TopTalkers>) -> Self {
        Self(top)
    }
}

impl std::fmt::Debug for TopGauges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("TopGauges").finish_non_exhaustive()
    }
}

impl Collector for TopGauges {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let counts = self.0.counts();
        let mut m = encoder.encode_descriptor(
            "fleet_limiter_top_buckets",
            "Buckets the top-talker lists (GET /top) hold now, by limiter: at most 15 minutes x 2 lists x 128.",
            None,
            MetricType::Gauge,
        )?;
        for (limiter, rows, _) in &counts {
            ConstGauge::new(i64::try_from(*rows).unwrap_or(i64::MAX))
                .encode(m.encode_family(&[("limiter", limiter.as_ref())])?)?;
        }
        let mut m = encoder.encode_descriptor(
            "fleet_limiter_top_evictions",
            "Buckets the top-talker lists let go to make room, by limiter: while it rises, /top's counts carry an error (stated per row).",
            None,
            MetricType::Counter,
        )?;
        for (limiter, _, evictions) in &counts {
            ConstCounter::new(*evictions)
                .encode(m.encode_family(&[("limiter", limiter.as_ref())])?)?;
        }
        Ok(())
    }
}

/// What the upstream's pressure (`[shaping.upstream]`) reads now: a plain snapshot, taken at
/// each scrape from whatever watches the upstream.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct PressureSnapshot {
    /// The callers' latency signal (ns).
    pub signal_ns: u64,
    /// The stretch step's nominal factor (1: not stretched).
    pub stretch: f64,
    /// Priorities shed now (0 none … 3 all but critical).
    pub shed: u8,
    /// Whether the upstream misses its target now.
    pub missed: bool,
}

/// What the metrics read the upstream's pressure from, at each scrape.
pub(crate) trait ReadPressure: Send + Sync {
    fn snapshot(&self) -> PressureSnapshot;
}

/// The upstream's pressure (`[shaping.upstream]`), as read at the scrape.
pub(super) struct PressureGauges(Arc<dyn ReadPressure>);

impl PressureGauges {
    pub(super) fn new(pressure: Arc<dyn ReadPressure>) -> Self {
        Self(pressure)
    }
}

impl std::fmt::Debug for PressureGauges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("PressureGauges").finish_non_exhaustive()
    }
}

impl Collector for PressureGauges {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let r = self.0.snapshot();
        one(
            &mut encoder,
            "fleet_limiter_upstream_pressure_seconds",
            "The upstream's latency signal on this instance: the latency that at least three callers, and at least half of all callers, reached over the last 2 s, from when the upstream had the whole request to its answer's head (a request still waiting counts what it has waited); 0 with fewer than three callers ([shaping.upstream] compares it with latency_target)",
            &ConstGauge::new(r.signal_ns as f64 / 1e9),
        )?;
        one(
            &mut encoder,
            "fleet_limiter_upstream_target_missed",
            "1 while the upstream misses [shaping.upstream]'s target (latency or 5xx share) on this instance, else 0",
            &ConstGauge::new(i64::from(r.missed)),
        )?;
        one(
            &mut encoder,
            "fleet_limiter_shaping_stretch",
            "The nominal factor of the stretch step poll intervals are at now (1: not stretched; 1.5, 2, 3, 4: steps 1 to 4); each route's period at a step stays within its max_interval",
            &ConstGauge::new(r.stretch),
        )?;
        one(
            &mut encoder,
            "fleet_limiter_shaping_shed_level",
            "Priorities shed now: 0 none, 1 low, 2 low and normal, 3 every priority but critical",
            &ConstGauge::new(i64::from(r.shed)),
        )
    }
}

impl Collector for KnownAgentsGauges {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let c = self.0.counts();
        let gauge = |n: u64| ConstGauge::new(i64::try_from(n).unwrap_or(i64::MAX));
        let segments = ["probation", "protected"];
        let mut m = encoder.encode_descriptor(
            "fleet_limiter_known_agents",
            "Agent ids the new-agents ceiling knows now, by segment: probation (seen once) or protected (seen again while known).",
            None,
            MetricType::Gauge,
        )?;
        for (seg, n) in segments.iter().zip([c.probation, c.protected]) {
            gauge(n).encode(m.encode_family(&[("segment", *seg)])?)?;
        }
        one(
            &mut encoder,
            "fleet_limiter_known_agents_capacity",
            "The most agent ids the known-agents table holds (store.max_keys); protected ids fill at most half.",
            &gauge(c.capacity),
        )?;
        let mut m = encoder.encode_descriptor(
            "fleet_limiter_known_agents_not_remembered",
            "Admitted agent ids the known-agents table did not remember, so the ceiling meters their next request again, by reason: address (it held max_known ids) or table (full, and no other address held more first sightings).",
            None,
            MetricType::Counter,
        )?;
        for (reason, n) in [
            ("address", c.not_remembered_address),
            ("table", c.not_remembered_table),
        ] {
            ConstCounter::new(n).encode(m.encode_family(&[("reason", reason)])?)?;
        }
        let mut m = encoder.encode_descriptor(
            "fleet_limiter_known_agents_evicted",
            "Agent ids dropped from the known-agents table before they expired to make room, by segment and reason: stale (not seen within twice the fleet's longest gap between requests) or share (still within it, from the address holding the most).",
            None,
            MetricType::Counter,
        )?;
        for (i, seg) in segments.iter().enumerate() {
            for (reason, n) in [("stale", c.evicted_stale[i]), ("share", c.evicted_share[i])] {
                ConstCounter::new(n)
                    .encode(m.encode_family(&[("segment", *seg), ("reason", reason)])?)?;
            }
        }
        one(
            &mut encoder,
            "fleet_limiter_known_agents_not_promoted",
            "Agent ids seen again that stayed first sightings (still known) because the protected half was full and nobody had to give way.",
            &ConstCounter::new(c.not_promoted),
        )
    }
}

/// One configured limiter as `/metrics` describes it.
#[derive(Debug, Clone)]
struct LimiterInfo {
    name: String,
    mode: &'static str,
    limit: String,
    window_seconds: String,
    /// `day UTC`, `month Europe/Berlin` for a calendar window; empty otherwise.
    calendar: String,
}

/// The settings in force, as last configured: plain facts, copied at configure time.
#[derive(Debug, Default)]
pub(super) struct SettingsView(RwLock<Option<Settings>>);

#[derive(Debug)]
struct Settings {
    enabled: bool,
    near_limit_percent: u8,
    limiters: Vec<LimiterInfo>,
}

impl SettingsView {
    pub(super) fn set(&self, enabled: bool, limiters: &[Arc<LimiterSpec>], near_limit_percent: u8) {
        let limiters = limiters
            .iter()
            .map(|l| LimiterInfo {
                name: l.name.to_string(),
                mode: match l.mode {
                    Mode::Enforce => "enforce",
                    Mode::Shadow => "shadow",
                    Mode::Off => "off",
                },
                limit: l.quota.limit().to_string(),
                window_seconds: l.quota.window().as_secs().to_string(),
                calendar: l
                    .quota
                    .calendar_window()
                    .map(|c| format!("{} {}", c.unit.as_str(), c.zone.name()))
                    .unwrap_or_default(),
            })
            .collect();
        *self.0.write() = Some(Settings {
            enabled,
            near_limit_percent,
            limiters,
        });
    }
}

/// The process and settings gauges.
#[derive(Debug)]
pub(super) struct Process {
    pub(super) settings: Arc<SettingsView>,
    /// Log lines dropped by the process-wide log sink: one stderr for the whole process, so
    /// every registry shows the same count.
    pub(super) log_lines_dropped: fn() -> u64,
}

impl Collector for Process {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let settings = self.settings.0.read();
        let percent = settings
            .as_ref()
            .map_or(super::NEAR_LIMIT_PERCENT, |s| s.near_limit_percent);
        one(
            &mut encoder,
            "fleet_limiter_near_limit_ratio",
            "The near-limit threshold, as a share of the budget.",
            &ConstGauge::new(f64::from(percent) / 100.0),
        )?;
        one(
            &mut encoder,
            "fleet_limiter_log_lines_dropped",
            "Log lines dropped because the log output (stderr) could not be written, e.g. its reader has exited.",
            &ConstCounter::new((self.log_lines_dropped)()),
        )?;
        if let Some(s) = settings.as_ref() {
            one(
                &mut encoder,
                "fleet_limiter_enabled",
                "1 when limiting is on (FLEET_LIMITER_ENABLED).",
                &ConstGauge::new(i64::from(s.enabled)),
            )?;
            let mut m = encoder.encode_descriptor(
                "fleet_limiter_limiter_info",
                "Each configured limiter: its mode, budget and window (a calendar window: its period and time zone, window_seconds the longest such period).",
                None,
                MetricType::Gauge,
            )?;
            for l in &s.limiters {
                let mut labels = vec![
                    ("limiter", l.name.as_str()),
                    ("mode", l.mode),
                    ("limit", l.limit.as_str()),
                    ("window_seconds", l.window_seconds.as_str()),
                ];
                // Only a calendar window carries the label: the other series stay as they were.
                if !l.calendar.is_empty() {
                    labels.push(("calendar", l.calendar.as_str()));
                }
                ConstGauge::new(1).encode(m.encode_family(&labels)?)?;
            }
        }
        labelled(
            &mut encoder,
            "fleet_limiter_build_info",
            "The running version.",
            ("version", env!("CARGO_PKG_VERSION")),
            &ConstGauge::new(1),
        )
    }
}

/// Responses by status code 100..=599: one atomic each, so counting is one add; shown only for
/// the statuses seen.
#[derive(Clone, Debug)]
pub(super) struct StatusCounts(Arc<[AtomicU64]>);

/// Statuses counted, 100 to 599: the length of one stripe of [`StatusCounts`].
const STATUSES: usize = 500;

impl Default for StatusCounts {
    /// One run of [`STATUSES`] counts per stripe (4 000 bytes: stripes share no line but at
    /// their ends, the statuses 599 and 100 nobody answers).
    fn default() -> Self {
        Self(
            (0..STATUSES * super::striped::stripes())
                .map(|_| AtomicU64::new(0))
                .collect(),
        )
    }
}

impl StatusCounts {
    /// Count one response, on this thread's stripe; a status outside 100..=599 is ignored.
    pub(super) fn count(&self, status: u16) {
        let Some(i) = status
            .checked_sub(100)
            .map(usize::from)
            .filter(|&i| i < STATUSES)
        else {
            return;
        };
        let stripe = super::striped::stripe(self.0.len() / STATUSES);
        if let Some(c) = self.0.get(stripe * STATUSES + i) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Responses counted with status `100 + i`, over every stripe.
    fn total(&self, i: usize) -> u64 {
        self.0
            .iter()
            .skip(i)
            .step_by(STATUSES)
            .fold(0u64, |sum, c| sum.wrapping_add(c.load(Ordering::Relaxed)))
    }
}

impl TypedMetric for StatusCounts {
    const TYPE: MetricType = MetricType::Counter;
}

impl EncodeMetric for StatusCounts {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        for i in 0..STATUSES {
            let n = self.total(i);
            if n > 0 {
                let status = (i + 100).to_string();
                ConstCounter::new(n)
                    .encode(encoder.encode_family(&[("status", status.as_str())])?)?;
            }
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}
