//! Key derivation: IP normalisation, agent-id validation, principal key and digest.

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use fleet_limiter::{digest, normalize_ip, principal_key, valid_agent_id, BucketKey, KeyKind};
use std::net::IpAddr;
use std::sync::Arc;

fn keys(c: &mut Criterion) {
    let mut g = c.benchmark_group("keys");
    let v4: IpAddr = "203.0.113.77".parse().unwrap_or(IpAddr::from([0, 0, 0, 0]));
    let mapped: IpAddr = "::ffff:203.0.113.77".parse().unwrap_or(v4);
    let v6: IpAddr = "2001:db8:abcd:12ff:1:2:3:4".parse().unwrap_or(v4);
    g.bench_function("normalize_ip_v4", |b| {
        b.iter(|| normalize_ip(black_box(v4), 56))
    });
    g.bench_function("normalize_ip_v4_mapped", |b| {
        b.iter(|| normalize_ip(black_box(mapped), 56))
    });
    g.bench_function("normalize_ip_v6_56", |b| {
        b.iter(|| normalize_ip(black_box(v6), 56))
    });
    let agent = b"agent-0042.site-berlin_7";
    g.bench_function("valid_agent_id", |b| {
        b.iter(|| valid_agent_id(black_box(agent)))
    });
    g.bench_function("valid_agent_id_128", |b| {
        b.iter(|| valid_agent_id(black_box(&[b'a'; 128])))
    });
    g.bench_function("valid_agent_id_rejected", |b| {
        b.iter(|| valid_agent_id(black_box(b"agent 42")))
    });
    g.bench_function("principal_key_ip_agent", |b| {
        b.iter(|| {
            principal_key(
                KeyKind::IpAgent,
                black_box("203.0.113.77"),
                Some("agent-0042"),
                None,
            )
        })
    });
    g.bench_function("digest", |b| {
        b.iter(|| {
            digest(
                black_box("agent-device"),
                black_box("203.0.113.77:agent-0042"),
            )
        })
    });
    let name: Arc<str> = Arc::from("agent-device");
    g.bench_function("bucket_key_from_request", |b| {
        b.iter(|| {
            let ip = normalize_ip(black_box(v4), 56);
            let id = valid_agent_id(black_box(agent));
            let p = principal_key(KeyKind::IpAgent, &ip, id, None);
            BucketKey::new(name.clone(), &p)
        })
    });
    g.finish();
}

criterion_group!(benches, keys);
criterion_main!(benches);
