//! Per-request cost, end to end: the real binary in front of a real upstream, on the memory
//! store and on Redis, with hostile cost headers.

mod common;
mod redis_support;

use common::{Gateway, Launch};

struct Answer {
    status: u16,
    remaining: Option<u64>,
    retry_after: Option<u64>,
}

async fn get(gw: &Gateway, headers: &[(&str, &str)]) -> Answer {
    let mut req = common::client().get(gw.url("/batch/items"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let res = req.send().await.expect("request");
    let h = |n: &str| {
        res.headers()
            .get(n)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    Answer {
        status: res.status().as_u16(),
        remaining: h("ratelimit")
            .and_then(|v| common::parse_ratelimit(&v).first().map(|(_, r, _)| *r)),
        retry_after: h("retry-after").and_then(|v| v.parse().ok()),
    }
}

fn limiter(name: &str, store: &str) -> String {
    // 10 a minute: one unit every 6 s.
    format!(
        "{store}\n[limiters.{name}]\nlimit = 10\nwindow = \"1m\"\nkey = \"ip\"\nroutes = [\"/batch/**\"]\ncost_header = \"X-Batch-Size\"\ncost_max = 8\n"
    )
}

async fn a_batch_costs_its_size(store: &str) {
    let upstream = common::upstream().await;
    let name = format!("batch-{:08x}", rand::random::<u32>());
    let gw = Launch::serve()
        .config_toml(limiter(&name, store))
        .upstream(&upstream.uri())
        .spawn();
    let b = |n: &'static str| [("x-batch-size", n)];
    let a = get(&gw, &b("4")).await;
    assert_eq!(
        (a.status, a.remaining),
        (200, Some(6)),
        "remaining after the cost"
    );
    // Seven do not fit in six: refused whole, charging nothing, and told to wait for 7 units.
    let a = get(&gw, &b("7")).await;
    assert_eq!(a.status, 429);
    assert_eq!(a.retry_after, Some(6), "one more unit, 6 s away");
    let a = get(&gw, &b("6")).await;
    assert_eq!(
        (a.status, a.remaining),
        (200, Some(0)),
        "the refusal charged nothing"
    );
    assert_eq!(common::received(&upstream).await, 2);
}

#[tokio::test]
async fn memory_a_batch_costs_its_size() {
    a_batch_costs_its_size("").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_batch_costs_its_size() {
    let Some(redis) = redis_support::standalone() else {
        return;
    };
    a_batch_costs_its_size(&format!(
        "[store]\nurl = \"{}\"\ntimeout = \"2s\"",
        redis.url()
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_a_batch_costs_its_size() {
    let Some(cluster) = redis_support::cluster() else {
        return;
    };
    let nodes: Vec<String> = cluster.urls().iter().map(|u| format!("\"{u}\"")).collect();
    a_batch_costs_its_size(&format!(
        "[store]\nbackend = \"redis\"\ncluster = [{}]\ntimeout = \"2s\"",
        nodes.join(", ")
    ))
    .await;
}

/// Hostile values never cost less than an honest batch: absent costs 1, a huge one the cap, and
/// anything that is not a plain positive number (or a repeated header) the cap as well.
#[tokio::test]
async fn hostile_cost_headers_pay_the_cap() {
    let upstream = common::upstream().await;
    let gw = Launch::serve()
        .config_toml(limiter("batch", ""))
        .upstream(&upstream.uri())
        .env("FLEET_LIMITER_TRUST_PROXY", "127.0.0.1")
        .spawn();
    let huge = "9".repeat(400);
    let cases: Vec<(Vec<(&str, &str)>, u64)> = vec![
        (vec![], 1),
        (vec![("x-batch-size", "-5")], 8),
        (vec![("x-batch-size", "0")], 8),
        (vec![("x-batch-size", "abc")], 8),
        (vec![("x-batch-size", huge.as_str())], 8),
        (vec![("x-batch-size", "1"), ("x-batch-size", "1")], 8),
    ];
    for (i, (headers, cost)) in cases.iter().enumerate() {
        // Each case from its own address, so each starts with a full bucket of 10.
        let ip = format!("198.51.100.{}", i + 1);
        let mut h = headers.clone();
        h.push(("x-forwarded-for", ip.as_str()));
        let a = get(&gw, &h).await;
        assert_eq!(a.status, 200, "case {i}");
        assert_eq!(a.remaining, Some(10 - cost), "case {i}: {headers:?}");
    }
    // Non-ASCII bytes in the header: actix reads them as a value, not a number.
    let res = common::raw_request(
        gw.addr,
        b"GET /batch/items HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: 198.51.100.99\r\nX-Batch-Size: \xd9\xa3\r\nConnection: close\r\n\r\n",
    );
    let remaining = res
        .header("ratelimit")
        .and_then(|v| common::parse_ratelimit(v).first().map(|(_, r, _)| *r));
    assert_eq!(remaining, Some(2), "{res:?}");
}
