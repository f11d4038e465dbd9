//! A fixed-bucket histogram kept in atomics: observing is two atomic adds, never a lock (the
//! official client's histogram takes a mutex per observation), on the recording thread's own
//! stripe (`striped.rs`). Encoded by `prometheus-client` like any of its own metrics.

use super::striped::{stripe, stripes, Line};
use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::family::MetricConstructor;
use prometheus_client::metrics::{MetricType, TypedMetric};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Upper bounds, in nanoseconds, of the in-process latency buckets (10 µs to 250 ms).
pub(crate) const FAST_NS: &[u64] = &[
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
pub(crate) const UPSTREAM_NS: &[u64] = &[
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

/// Upper bounds, in seconds, of the `Retry-After` buckets (1 s to a day).
pub(crate) const RETRY_AFTER_S: &[u64] = &[1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 86_400];

/// A stripe's slots: one count per bound, one for `+Inf`, and the sum (16 slots, 128 bytes).
const SLOTS: usize = 16;
/// Most bounds a histogram can have.
const MAX_BOUNDS: usize = SLOTS - 2;
const _: () = assert!(FAST_NS.len() <= MAX_BOUNDS);
const _: () = assert!(UPSTREAM_NS.len() <= MAX_BOUNDS);
const _: () = assert!(RETRY_AFTER_S.len() <= MAX_BOUNDS);
const SUM: usize = SLOTS - 1;

/// Makes each limiter's `Retry-After` histogram, on [`RETRY_AFTER_S`].
#[derive(Clone)]
pub(super) struct RetryAfterBuckets;

impl MetricConstructor<Histogram> for RetryAfterBuckets {
    fn new_metric(&self) -> Histogram {
        Histogram::seconds(RETRY_AFTER_S)
    }
}

/// A cumulative histogram over integer observations (nanoseconds or seconds), exported in
/// seconds. Clones share their counts.
#[derive(Clone, Debug)]
pub(crate) struct Histogram(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    bounds: &'static [u64],
    /// Observations per second: 1e9 for nanoseconds, 1 for seconds.
    per_second: f64,
    /// Per stripe: one count per bound (non-cumulative), one for `+Inf`, and at [`SUM`] the
    /// sum of the observations.
    stripes: Box<[Line<[AtomicU64; SLOTS]>]>,
}

impl Histogram {
    /// Durations, bucketed by these nanosecond bounds.
    pub(crate) fn nanos(bounds: &'static [u64]) -> Self {
        Self::new(bounds, 1e9)
    }

    /// Whole seconds, bucketed by these bounds.
    pub(crate) fn seconds(bounds: &'static [u64]) -> Self {
        Self::new(bounds, 1.0)
    }

    /// `bounds` beyond the first [`MAX_BOUNDS`] are not kept (the constants above have fewer).
    fn new(bounds: &'static [u64], per_second: f64) -> Self {
        Self(Arc::new(Inner {
            bounds: &bounds[..bounds.len().min(MAX_BOUNDS)],
            per_second,
            stripes: (0..stripes()).map(|_| Line::default()).collect(),
        }))
    }

    /// Count one observation, in the histogram's own unit.
    pub(crate) fn observe(&self, v: u64) {
        let inner = &self.0;
        let Some(line) = inner.stripes.get(stripe(inner.stripes.len())) else {
            return;
        };
        let i = inner.bounds.partition_point(|&b| b < v);
        if let Some(c) = line.0.get(i) {
            c.fetch_add(1, Ordering::Relaxed);
        }
        line.0[SUM].fetch_add(v, Ordering::Relaxed);
    }

    /// Slot `i` summed over the stripes.
    fn total(&self, i: usize) -> u64 {
        self.0.stripes.iter().fold(0u64, |sum, line| {
            sum.wrapping_add(line.0.get(i).map_or(0, |c| c.load(Ordering::Relaxed)))
        })
    }

    /// Count one duration (for a histogram in nanoseconds).
    pub(crate) fn observe_duration(&self, d: std::time::Duration) {
        self.observe(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    }

    /// Observations so far.
    #[cfg(test)]
    pub(crate) fn count(&self) -> u64 {
        (0..=self.0.bounds.len()).map(|i| self.total(i)).sum()
    }
}

impl TypedMetric for Histogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for Histogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let inner = &self.0;
        let mut buckets: Vec<(f64, u64)> = inner
            .bounds
            .iter()
            .enumerate()
            .map(|(i, b)| (*b as f64 / inner.per_second, self.total(i)))
            .collect();
        buckets.push((f64::INFINITY, self.total(inner.bounds.len())));
        let count = buckets.iter().map(|(_, n)| n).sum();
        let sum = self.total(SUM) as f64 / inner.per_second;
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::prometheus_text::encode;
    use prometheus_client::registry::Registry;

    #[test]
    fn buckets_are_cumulative_and_edges_inclusive() {
        static BOUNDS: &[u64] = &[10, 20];
        let h = Histogram::nanos(BOUNDS);
        h.observe(10);
        h.observe(11);
        h.observe(1000);
        let mut r = Registry::default();
        r.register("x", "X", h.clone());
        let mut s = String::new();
        encode(&mut s, &r).unwrap();
        assert!(s.contains("x_bucket{le=\"1e-08\"} 1\n"), "{s}");
        assert!(s.contains("x_bucket{le=\"2e-08\"} 2\n"), "{s}");
        assert!(s.contains("x_bucket{le=\"+Inf\"} 3\n"), "{s}");
        assert!(s.contains("x_count 3\n"), "{s}");
        assert_eq!(h.count(), 3);
    }
}
