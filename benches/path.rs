//! The canonical path: the one-pass check most requests take, the full parse of a respelled
//! path, a refusal, and the route policy on the result.

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use fleet_limiter::Config;
use fleet_limiter::Credential;
use fleet_limiter::Policy;
use fleet_limiter::{CanonicalPath, PathRules};

fn path(c: &mut Criterion) {
    let mut g = c.benchmark_group("path");
    let rules = PathRules::STRICT;
    for (name, p) in [
        ("canonical_already", "/api/agent/heartbeat"),
        (
            "canonical_long",
            "/api/v2/tenants/acme-corp/agents/agent-0042/tasks/12345/result",
        ),
        ("respelled", "/api//agent/x/%2e%2e/%68eartbeat/"),
        ("escaped_utf8", "/api/files/caf%c3%a9/r%C3%A9sum%C3%A9.pdf"),
        ("refused", "/api/agent/%FF/%2e%2e/rotate-key"),
    ] {
        g.bench_function(name, |b| {
            b.iter(|| CanonicalPath::parse(black_box(p), rules).is_ok())
        });
    }
    let policy = Policy::new(Config::default().limiters);
    let heartbeat = CanonicalPath::parse("/api/agent/heartbeat", rules).ok();
    if let Some(hb) = heartbeat {
        g.bench_function("canonical_then_policy", |b| {
            b.iter(|| {
                let p = CanonicalPath::parse(black_box(hb.as_str()), rules);
                p.map(|p| policy.applicable("POST", &p, Credential::None).len())
            })
        });
    }
    g.finish();
}

criterion_group!(benches, path);
criterion_main!(benches);
