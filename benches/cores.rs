//! The decision across cores: what the writes every worker shares cost when two workers decide
//! at once. A heartbeat decision (the built-in calibration with budgets nothing exhausts, so
//! `agent-device`, the `agent-ip` ceiling's known-agents table and the memory store's shard
//! locks all run) from one thread, from two threads on one decider (the gateway's workers:
//! one known-agents table, one store, one set of metrics), and from two threads on two
//! deciders (nothing shared: what the machine gives two cores with no contention at all).
//!
//! Each twice: with the top-talker lists (the default) and without (`ops.top_talkers = false`).
//!
//! Each iteration is one decision per thread, so criterion's `elem/s` is decisions per second
//! in all. `one_decider/2` against `two_deciders/2` is the cost of sharing; against
//! `one_thread` it is how far a second core helps. Read the ratios, not the times: the machine
//! is shared (docs/benchmarks.md, "Across cores").
//!
//!     cargo bench --bench cores

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use fleet_limiter::{build_decider, CanonicalPath, Decider, KeyHeaders, Loader, RequestFacts};
use futures_util::FutureExt;
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

/// Agents per thread, each thread its own (a fleet's agents, not one agent twice).
const AGENTS: usize = 1_000;
/// Agents behind one address: a site of the built-in calibration's size, so every agent is
/// known to the ceiling (it remembers 500 per address) and only `agent-device` meters it.
const SITE: usize = 250;

/// A decider of the built-in calibration with budgets nothing exhausts, the top-talker lists
/// on or off (`ops.top_talkers`).
fn decider(top_talkers: bool) -> Decider {
    let mut vars: Vec<(String, String)> = [
        ("AGENT_DEVICE_LIMIT", "1000000000"),
        ("AGENT_DEVICE_WINDOW", "1m"),
        ("AGENT_IP_LIMIT", "1000000000"),
        ("AGENT_IP_WINDOW", "1m"),
    ]
    .map(|(k, v)| (format!("FLEET_LIMITER_LIMITER_{k}"), v.to_owned()))
    .to_vec();
    vars.push((
        "FLEET_LIMITER_TOP_TALKERS".to_owned(),
        top_talkers.to_string(),
    ));
    let cfg = match Loader::new().env(vars).load() {
        Ok(c) => c,
        Err(e) => panic!("benchmark configuration: {e}"),
    };
    match build_decider(&cfg) {
        Ok(d) => d,
        Err(e) => panic!("decider: {e}"),
    }
}

/// `n` heartbeats of thread `thread`'s agents (four sites, each behind its own address) on `d`.
fn heartbeats(d: &Decider, thread: usize, n: u64) {
    let ids: Vec<String> = (0..AGENTS)
        .map(|i| format!("agent-{thread}-{i:04}"))
        .collect();
    let path = match CanonicalPath::parse("/api/agent/heartbeat", Default::default()) {
        Ok(p) => p,
        Err(e) => panic!("path: {e:?}"),
    };
    let sites: Vec<IpAddr> = (0..AGENTS / SITE)
        .map(|k| IpAddr::V4(Ipv4Addr::new(203, 0, 113, (thread * 8 + k) as u8)))
        .collect();
    for i in 0..n {
        let agent = i as usize % AGENTS;
        let facts = RequestFacts {
            peer: sites[agent / SITE],
            method: "POST",
            path: path.clone(),
            forwarded: &[],
            agent_id: Some(ids[agent].as_bytes()),
            authorization: None,
            session_token: None,
            key_headers: KeyHeaders::default(),
        };
        match d.decide(&facts).now_or_never() {
            Some(outcome) => {
                black_box(outcome);
            }
            None => panic!("a decision on the memory store waited"),
        }
    }
}

/// Wall time for `n` decisions on each of `deciders.len()` threads at once (thread `t` on
/// `deciders[t]`).
fn at_once(deciders: &[&Decider], n: u64) -> Duration {
    let start = Instant::now();
    std::thread::scope(|s| {
        for (t, d) in deciders.iter().enumerate() {
            s.spawn(move || heartbeats(d, t, n));
        }
    });
    start.elapsed()
}

fn cores(c: &mut Criterion) {
    let mut g = c.benchmark_group("decision_across_cores");
    for (top, suffix) in [(true, ""), (false, "_no_top")] {
        let shared = decider(top);
        let (a, b) = (decider(top), decider(top));
        // Every agent known and every bucket made before anything is measured.
        at_once(&[&shared, &shared], 2 * AGENTS as u64);
        at_once(&[&a, &b], 2 * AGENTS as u64);

        g.throughput(Throughput::Elements(1));
        g.bench_function(format!("one_thread{suffix}"), |bench| {
            bench.iter_custom(|n| at_once(&[&shared], n))
        });
        g.throughput(Throughput::Elements(2));
        g.bench_function(format!("one_decider{suffix}/2"), |bench| {
            bench.iter_custom(|n| at_once(&[&shared, &shared], n))
        });
        g.bench_function(format!("two_deciders{suffix}/2"), |bench| {
            bench.iter_custom(|n| at_once(&[&a, &b], n))
        });
    }
    g.finish();
}

criterion_group!(benches, cores);
criterion_main!(benches);
