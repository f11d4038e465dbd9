//! Redis failover with real processes: a primary demoted behind one address (`READONLY`), the
//! `on_store_error = "local"` answer while Redis is down, and Sentinel (a primary, a replica and
//! three Sentinels) followed through forced and crash failovers by two gateways sharing one
//! budget. Skipped without redis-server, failed instead when `CI` is set.

mod common;
mod redis_support;

use common::Gateway;
use redis_support::{cli, gateway, wait_for};
use std::time::{Duration, Instant};

/// A name no other test (or earlier run) uses.
fn unique(prefix: &str) -> String {
    format!("{prefix}-{:08x}", rand::random::<u32>())
}

/// One answer of the gateway, as the tests read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    /// Redis (or the local buckets) decided: allowed, with what was left.
    Allowed(u32),
    /// Decided and refused (a 429 with limit headers).
    Refused,
    /// The store did not answer and `on_store_error` did: no limit headers.
    Fallback(u16),
}

async fn ask(client: &reqwest::Client, url: &str) -> Answer {
    let r = client.get(url).send().await.expect("the gateway answers");
    let status = r.status().as_u16();
    assert!(status == 200 || status == 429, "never a {status}");
    let remaining = r
        .headers()
        .get("x-ratelimit-remaining")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    match (status, remaining) {
        (200, Some(n)) => Answer::Allowed(n),
        (429, Some(_)) => Answer::Refused,
        (s, None) => Answer::Fallback(s),
        (s, Some(_)) => panic!("unexpected status {s}"),
    }
}

/// One limiter of `limit` requests an hour per client IP on `/<name>/**`, answering
/// `on_store_error` when the store does not, on the given `[store]` table.
fn config(store: &str, name: &str, limit: u32, on_store_error: &str) -> String {
    format!(
        r#"
{store}

[limiters.{name}]
limit = {limit}
window = "1h"
key = "ip"
routes = ["/{name}/**"]
on_store_error = "{on_store_error}"
"#
    )
}

/// Ask until an answer is decided (not `Fallback`); return it and the fallbacks before it.
async fn until_decided(
    client: &reqwest::Client,
    gw: &Gateway,
    url: &str,
    what: &str,
) -> (Answer, u32) {
    let deadline = Instant::now() + common::PATIENCE;
    let mut fallbacks = 0;
    loop {
        match ask(client, url).await {
            Answer::Fallback(_) => fallbacks += 1,
            a => return (a, fallbacks),
        }
        assert!(Instant::now() < deadline, "{what}; log:\n{}", gw.stderr());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_demoted_behind_its_address_is_left_without_a_restart() {
    let Some(a) = redis_support::own_server() else {
        return;
    };
    let b = redis_support::replica_of(&a);
    // The gateway knows one address (a DNS name, a proxy); it leads to A.
    let address = redis_support::Forwarder::to(a.port);
    let name = unique("ro");
    let store = format!(
        "[store]\nurl = \"redis://127.0.0.1:{}\"\ntimeout = \"200ms\"",
        address.port
    );
    let gw = gateway(
        &config(&store, &name, 6, "deny"),
        &redis_support::upstream(),
        &[],
        &[],
    );
    let client = reqwest::Client::new();
    let url = gw.url(&format!("/{name}/x"));
    for left in [5, 4, 3] {
        assert_eq!(
            ask(&client, &url).await,
            Answer::Allowed(left),
            "{}",
            gw.stderr()
        );
    }

    // A failover by hand: B has A's writes, B is promoted, the address leads to B, A is
    // demoted. The gateway's pooled connection still reaches A, which now answers READONLY.
    assert_eq!(cli(a.port, &["WAIT", "1", "5000"]), "1");
    assert_eq!(cli(b.port, &["REPLICAOF", "NO", "ONE"]), "OK");
    address.point_at(b.port);
    assert_eq!(
        cli(a.port, &["REPLICAOF", "127.0.0.1", &b.port.to_string()]),
        "OK"
    );
    wait_for(
        || cli(a.port, &["INFO", "replication"]).contains("master_link_status:up"),
        "A to replicate B",
    );

    // Without a restart, decisions reach B and go on from where A left the bucket.
    let (first, fallbacks) = until_decided(
        &client,
        &gw,
        &url,
        "the gateway never left the demoted primary",
    )
    .await;
    assert_eq!(first, Answer::Allowed(2), "B holds A's count");
    assert_eq!(ask(&client, &url).await, Answer::Allowed(1));
    assert_eq!(ask(&client, &url).await, Answer::Allowed(0));
    assert_eq!(
        ask(&client, &url).await,
        Answer::Refused,
        "exactly the budget"
    );
    eprintln!("answered by on_store_error while leaving the demoted primary: {fallbacks}");

    let log = gw.stderr();
    assert_eq!(
        log.matches("answered READONLY").count(),
        1,
        "said once, for the one demotion:\n{log}"
    );
    // The demoted primary was never written: its copy is B's.
    let key_count = cli(a.port, &["DBSIZE"]);
    assert_eq!(key_count, cli(b.port, &["DBSIZE"]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_buckets_refuse_a_client_while_redis_is_down_and_the_shared_budget_returns() {
    // Kept on disk at every write, so the shared budget outlives the kill.
    let persist = ["--appendonly", "yes", "--appendfsync", "always"];
    let Some(mut redis) = redis_support::own_server_with(&persist) else {
        return;
    };
    let name = unique("local");
    let store = format!("[store]\nurl = \"{}\"\ntimeout = \"100ms\"", redis.url());
    let config = config(&store, &name, 3, "local");
    let up = redis_support::upstream();
    let (g1, g2) = (
        gateway(&config, &up, &[], &[]),
        gateway(&config, &up, &[], &[]),
    );
    let client = reqwest::Client::new();
    let (u1, u2) = (g1.url(&format!("/{name}/x")), g2.url(&format!("/{name}/x")));
    assert_eq!(ask(&client, &u1).await, Answer::Allowed(2), "Redis counts");

    redis.stop();
    // Each instance decides alone, on a bucket of its own (full: nothing came over from Redis),
    // refusing the client once that budget is spent: the overshoot is one budget per instance.
    for u in [&u1, &u2] {
        let seen = [
            ask(&client, u).await,
            ask(&client, u).await,
            ask(&client, u).await,
            ask(&client, u).await,
        ];
        assert_eq!(
            seen,
            [
                Answer::Allowed(2),
                Answer::Allowed(1),
                Answer::Allowed(0),
                Answer::Refused
            ],
            "{}",
            g1.stderr()
        );
    }
    let ready: serde_json::Value = client
        .get(g1.admin("/readyz"))
        .send()
        .await
        .expect("/readyz")
        .json()
        .await
        .expect("/readyz JSON");
    assert_eq!(ready["store_up"], false);
    assert_eq!(ready["on_store_error"]["local"], serde_json::json!([name]));
    for (fate, n) in [("local_allowed", 3.0), ("local_refused", 1.0)] {
        let sample =
            format!(r#"fleet_limiter_decisions_total{{limiter="{name}",outcome="{fate}"}}"#);
        assert_eq!(g1.metric(&sample).await, Some(n), "{sample}");
    }

    // Redis is back: the shared budget, as Redis kept it (two left), is used again.
    redis.start();
    let deadline = Instant::now() + common::PATIENCE;
    loop {
        match ask(&client, &u1).await {
            Answer::Refused => {}
            a => {
                assert_eq!(
                    a,
                    Answer::Allowed(1),
                    "the shared bucket, not the local one"
                );
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "never back on Redis:\n{}",
            g1.stderr()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let g2_back = async {
        loop {
            match ask(&client, &u2).await {
                Answer::Refused => tokio::time::sleep(Duration::from_millis(20)).await,
                a => return a,
            }
        }
    };
    let g2_first = tokio::time::timeout(common::PATIENCE, g2_back)
        .await
        .expect("the second instance back on Redis");
    assert_eq!(g2_first, Answer::Allowed(0), "one budget across both again");
    assert_eq!(ask(&client, &u1).await, Answer::Refused);
    assert_eq!(ask(&client, &u2).await, Answer::Refused);

    let log = g1.stderr();
    assert_eq!(
        log.matches("decide on this instance's own buckets").count(),
        1,
        "{log}"
    );
    assert_eq!(
        log.matches("decide on the shared buckets again").count(),
        1,
        "{log}"
    );
}
