//! The access-log parser of `replay`: one nginx `combined` line, and one in a format that also
//! logs the forwarding and agent-id headers.

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use fleet_limiter::calibration::LogFormat as Format;

fn parse(c: &mut Criterion) {
    let mut g = c.benchmark_group("replay_parse");
    g.throughput(Throughput::Elements(1));
    let combined = Format::combined();
    let line = br#"203.0.113.10 - - [24/Nov/2026:12:00:07 +0000] "POST /api/agent/heartbeat HTTP/1.1" 200 2 "-" "fleet-agent/2.4 (linux; amd64)""#;
    g.bench_function("combined", |b| {
        b.iter(|| combined.parse(black_box(line)).is_ok())
    });
    let custom = Format::compile(
        r#"$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent "$http_referer" "$http_user_agent" "$http_x_forwarded_for" "$http_x_agent_id""#,
    );
    if let Ok(custom) = custom {
        let line = br#"10.0.0.2 - - [24/Nov/2026:12:00:07 +0000] "GET /api/agent/tasks HTTP/1.1" 200 2 "-" "fleet-agent/2.4" "198.51.100.7" "agent-0042""#;
        g.bench_function("with_agent_headers", |b| {
            b.iter(|| custom.parse(black_box(line)).is_ok())
        });
    }
    g.finish();
}

criterion_group!(benches, parse);
criterion_main!(benches);
