//! One decision on the memory store: a hot key, and keys spread over 100 000 and 1 000 000
//! distinct buckets (each bucket already exists, so the map lookup misses the CPU caches).

use criterion::{black_box, criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use fleet_limiter::nonzero;
use fleet_limiter::BucketKey;
use fleet_limiter::Check;
use fleet_limiter::MemoryStore;
use fleet_limiter::Quota;
use fleet_limiter::SystemClock;
use std::sync::Arc;
use std::time::Duration;

/// A budget no benchmark can exhaust: every decision takes the allowed path.
fn huge() -> Quota {
    Quota::gcra(nonzero(u32::MAX), Duration::from_secs(1))
}

fn check(principal: &str, quota: Quota) -> Check {
    Check {
        key: BucketKey::new(Arc::from("agent-device"), principal),
        quota,
        shadow: false,
        units: std::num::NonZeroU32::MIN,
    }
}

fn store(max_keys: usize) -> MemoryStore {
    MemoryStore::new(max_keys, Arc::new(SystemClock::new()))
}

fn hot_key(c: &mut Criterion) {
    let mut g = c.benchmark_group("memory_store");
    g.throughput(Throughput::Elements(1));
    let s = store(1_000);
    let one = [check("127.0.0.1:agent-0", huge())];
    g.bench_function("hot_key_allowed", |b| {
        b.iter(|| s.decide_now(black_box(&one)))
    });

    // A bucket that is empty and stays empty: the refusal path writes nothing back.
    let s = store(1_000);
    let tight = [check(
        "127.0.0.1:agent-0",
        Quota::gcra(nonzero(1), Duration::from_secs(3600)),
    )];
    s.decide_now(&tight);
    g.bench_function("hot_key_refused", |b| {
        b.iter(|| s.decide_now(black_box(&tight)))
    });

    // Two limiters on one request (two shard locks, all-or-nothing).
    let s = store(1_000);
    let two = [
        check("127.0.0.1:agent-0", huge()),
        check("127.0.0.1", huge()),
    ];
    g.bench_function("hot_key_two_limiters", |b| {
        b.iter(|| s.decide_now(black_box(&two)))
    });
    g.finish();
}

fn many_keys(c: &mut Criterion) {
    let mut g = c.benchmark_group("memory_store");
    g.throughput(Throughput::Elements(1));
    for n in [100_000usize, 1_000_000] {
        let s = store(n * 2);
        let checks: Vec<[Check; 1]> = (0..n)
            .map(|i| {
                [check(
                    &format!("10.0.{}.{}:agent-{i}", i >> 8 & 255, i & 255),
                    huge(),
                )]
            })
            .collect();
        for c in &checks {
            s.decide_now(c);
        }
        // Visit the buckets in a scattered order, as a fleet's requests arrive.
        let mut i = 0usize;
        g.bench_function(format!("{n}_keys_allowed"), |b| {
            b.iter_batched(
                || {
                    i = (i + 7_919) % n;
                    i
                },
                |i| s.decide_now(black_box(&checks[i])),
                BatchSize::SmallInput,
            )
        });
    }
    g.finish();
}

criterion_group!(benches, hot_key, many_keys);
criterion_main!(benches);
