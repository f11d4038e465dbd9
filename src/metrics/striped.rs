//! Counts kept apart per thread. Each thread that records adds to its own stripe, on cache
//! lines of its own, so workers on different cores never write the same line (a shared
//! counter's line moves between the cores' caches on every add); reading sums the stripes.
//! Every request-path count is one of these: [`Counter`], the histograms
//! ([`super::Histogram`]) and the upstream statuses.

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::{MetricType, TypedMetric};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

/// Most stripes a count keeps, whatever the number of cores.
const MAX_STRIPES: usize = 64;

/// One cache line (two, for CPUs that fetch lines in adjacent pairs) to itself.
#[derive(Debug, Default)]
#[repr(align(128))]
pub(super) struct Line<T>(pub(super) T);

/// How many stripes each count keeps: twice the machine's parallelism (threads that are not
/// workers record too, and take stripes of their own), rounded up to a power of two, at most
/// [`MAX_STRIPES`].
pub(super) fn stripes() -> usize {
    static N: OnceLock<usize> = OnceLock::new();
    *N.get_or_init(|| {
        std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .saturating_mul(2)
            .next_power_of_two()
            .min(MAX_STRIPES)
    })
}

/// This thread's stripe among `n` (a power of two): threads are numbered in the order they
/// first record, so each worker of a server with as many workers as cores has its own.
pub(super) fn stripe(n: usize) -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static MINE: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    let mine = MINE.with(|m| {
        let v = m.get();
        if v != usize::MAX {
            return v;
        }
        let v = NEXT.fetch_add(1, Ordering::Relaxed) & (MAX_STRIPES - 1);
        m.set(v);
        v
    });
    mine & n.wrapping_sub(1)
}

/// A monotonic counter in stripes, exported as a Prometheus counter. Clones share their count.
#[derive(Clone, Debug)]
pub(crate) struct Counter(Arc<[Line<AtomicU64>]>);

impl Default for Counter {
    fn default() -> Self {
        Self((0..stripes()).map(|_| Line::default()).collect())
    }
}

impl Counter {
    /// Add one.
    pub(crate) fn inc(&self) {
        self.inc_by(1);
    }

    /// Add `n`.
    pub(crate) fn inc_by(&self, n: u64) {
        if let Some(line) = self.0.get(stripe(self.0.len())) {
            line.0.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// The count: the sum of the stripes.
    pub(crate) fn get(&self) -> u64 {
        self.0.iter().fold(0u64, |sum, line| {
            sum.wrapping_add(line.0.load(Ordering::Relaxed))
        })
    }
}

impl TypedMetric for Counter {
    const TYPE: MetricType = MetricType::Counter;
}

impl EncodeMetric for Counter {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_counter::<NoLabelSet, _, u64>(&self.get(), None)
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
    fn threads_add_to_their_own_stripes_and_reading_sums_them() {
        let c = Counter::default();
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let c = c.clone();
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        c.inc();
                    }
                    c.inc_by(5);
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(c.get(), 8 * 1005);
        let mut r = Registry::default();
        r.register("x", "X", c.clone());
        let mut s = String::new();
        encode(&mut s, &r).unwrap();
        assert!(s.contains("x_total 8040\n"), "{s}");
    }

    #[test]
    fn each_stripe_sits_on_lines_of_its_own() {
        assert_eq!(std::mem::align_of::<Line<AtomicU64>>(), 128);
        assert!(stripes().is_power_of_two() && stripes() <= MAX_STRIPES);
        // A thread keeps its stripe, and it is within the count's stripes.
        let first = stripe(stripes());
        assert_eq!(stripe(stripes()), first);
        assert!(first < stripes());
        assert_eq!(stripe(1), 0);
    }

    /// Two threads take two stripes (when there are two), so their adds touch different lines.
    #[test]
    fn two_threads_take_two_stripes() {
        let a = std::thread::spawn(|| stripe(MAX_STRIPES)).join().unwrap();
        let b = std::thread::spawn(|| stripe(MAX_STRIPES)).join().unwrap();
        assert_ne!(a, b);
    }
}
