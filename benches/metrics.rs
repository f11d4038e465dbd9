//! Recording metrics from several workers at once: the upstream's answer (its status counted,
//! its latency observed: three atomic adds) through `Metrics`, whose counts are striped per
//! thread, against the same three adds on counts every worker shares (one status table, one
//! histogram: the layout a plain atomic counter has). One thread per core records `iters`
//! answers each; the time is the slowest thread's. With one core the two are alike; with
//! more, the shared counts' cache lines move between the cores on every add.

use criterion::{criterion_group, criterion_main, Criterion};
use fleet_limiter::Metrics;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// The shared layout: a status table and a histogram's counts and sum, each one array.
struct Shared {
    statuses: Box<[AtomicU64]>,
    counts: Box<[AtomicU64]>,
    sum: AtomicU64,
}

impl Shared {
    fn new() -> Self {
        Self {
            statuses: (100..600).map(|_| AtomicU64::new(0)).collect(),
            counts: (0..13).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0),
        }
    }

    fn record(&self, status: u16, ns: u64) {
        if let Some(c) = self.statuses.get(usize::from(status - 100)) {
            c.fetch_add(1, Ordering::Relaxed);
        }
        let i = [5_000_000u64, 10_000_000, 25_000_000].partition_point(|&b| b < ns);
        if let Some(c) = self.counts.get(i) {
            c.fetch_add(1, Ordering::Relaxed);
        }
        self.sum.fetch_add(ns, Ordering::Relaxed);
    }
}

/// `threads` threads each call `record` `iters` times, started together; the elapsed time of
/// the whole.
fn on_threads(threads: usize, iters: u64, record: Arc<dyn Fn(u64) + Send + Sync>) -> Duration {
    let start = Arc::new(Barrier::new(threads + 1));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let start = start.clone();
            let record = record.clone();
            std::thread::spawn(move || {
                start.wait();
                for i in 0..iters {
                    record(i);
                }
            })
        })
        .collect();
    start.wait();
    let t = Instant::now();
    for h in handles {
        let _ = h.join();
    }
    t.elapsed()
}

fn recording(c: &mut Criterion) {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut g = c.benchmark_group(format!("metrics/{threads}-threads"));
    let metrics = Arc::new(Metrics::new());
    g.bench_function("striped (Metrics::upstream_response)", |b| {
        let m = metrics.clone();
        let record: Arc<dyn Fn(u64) + Send + Sync> =
            Arc::new(move |i| m.upstream_response(200, Duration::from_nanos(1_000_000 + i % 7)));
        b.iter_custom(|iters| on_threads(threads, iters, record.clone()))
    });
    let shared = Arc::new(Shared::new());
    g.bench_function("shared counts", |b| {
        let s = shared.clone();
        let record: Arc<dyn Fn(u64) + Send + Sync> =
            Arc::new(move |i| s.record(200, 1_000_000 + i % 7));
        b.iter_custom(|iters| on_threads(threads, iters, record.clone()))
    });
    g.finish();
}

criterion_group!(benches, recording);
criterion_main!(benches);
