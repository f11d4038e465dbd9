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
    /// The store did not answer and `on_store_error` did: `allow`'s 200 without limit headers,
    /// or `deny`'s 503 (the server's failure, never a 429).
    Fallback(u16),
}

async fn ask(client: &reqwest::Client, url: &str) -> Answer {
    let r = client.get(url).send().await.expect("the gateway answers");
    let status = r.status().as_u16();
    assert!(matches!(status, 200 | 429 | 503), "never a {status}");
    let remaining = r
        .headers()
        .get("x-ratelimit-remaining")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    match (status, remaining) {
        (503, _) => Answer::Fallback(503),
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

/// A primary, its replica and three Sentinels (quorum 2) watching them under a fresh master
/// name, once every Sentinel knows the replica and the two others (a failover can be agreed).
struct Watched {
    primary: redis_support::RedisServer,
    replica: redis_support::RedisServer,
    sentinels: Vec<redis_support::Sentinel>,
    master: String,
}

fn watched() -> Option<Watched> {
    let primary = redis_support::own_server()?;
    let replica = redis_support::replica_of(&primary);
    let master = unique("fl");
    let sentinels: Vec<redis_support::Sentinel> = (0..3)
        .map(|_| redis_support::Sentinel::start(&master, primary.port, 2))
        .collect();
    for s in &sentinels {
        wait_for(
            || {
                let out = cli(s.port, &["SENTINEL", "master", &master]);
                let lines: Vec<&str> = out.lines().collect();
                let field = |name: &str| {
                    lines
                        .iter()
                        .position(|l| *l == name)
                        .and_then(|i| lines.get(i + 1))
                        .copied()
                };
                field("num-slaves") == Some("1") && field("num-other-sentinels") == Some("2")
            },
            "each Sentinel to know the replica and the other Sentinels",
        );
    }
    Some(Watched {
        primary,
        replica,
        sentinels,
        master,
    })
}

impl Watched {
    fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect();
        format!("redis+sentinel://{}/{}", hosts.join(","), self.master)
    }
}

/// How a failover is brought about.
#[derive(Debug, Clone, Copy)]
enum Failover {
    /// `SENTINEL failover <name>`: the primary is healthy and demoted on the Sentinels' order.
    Forced,
    /// The primary is killed; the Sentinels agree it is down and promote the replica.
    Crash,
}

/// Two gateways on one Sentinel URL: a budget of 20 spent 8 before the failover and the rest
/// after it adds up to exactly 20 across both; probe traffic on another limiter during the
/// switch measures how many decisions fell back to `on_store_error`, for how long, and how many
/// decisions the old primary took that the new one never saw.
async fn two_gateways_follow_a_failover(how: Failover) {
    let Some(mut w) = watched() else {
        return;
    };
    let name = unique("budget");
    let probe = format!("{name}-probe");
    let store = format!("[store]\nurl = \"{}\"\ntimeout = \"100ms\"", w.url());
    let toml = format!(
        // A fixed window opens at the first hit and refills nothing before it closes: what
        // is left after the switch says exactly how many decisions the new primary holds.
        "{}\n[limiters.{probe}]\nlimit = 100000\nwindow = \"1h\"\nalgorithm = \"fixed-window\"\nkey = \"ip\"\nroutes = [\"/{probe}/**\"]\non_store_error = \"deny\"\n",
        config(&store, &name, 20, "deny")
    );
    let up = redis_support::upstream();
    let gws = [gateway(&toml, &up, &[], &[]), gateway(&toml, &up, &[], &[])];
    let client = reqwest::Client::new();
    let budget: Vec<String> = gws.iter().map(|g| g.url(&format!("/{name}/x"))).collect();
    let probes: Vec<String> = gws.iter().map(|g| g.url(&format!("/{probe}/x"))).collect();
    let logs = || {
        gws.iter()
            .map(Gateway::stderr)
            .collect::<Vec<_>>()
            .join("\n")
    };

    // Before: 8 of the 20, alternating between the instances.
    for (i, left) in (12..20).rev().enumerate() {
        assert_eq!(
            ask(&client, &budget[i % 2]).await,
            Answer::Allowed(left),
            "{}",
            logs()
        );
    }
    assert_eq!(
        cli(w.primary.port, &["WAIT", "1", "5000"]),
        "1",
        "the replica has them"
    );

    let (old, new) = (w.primary.addr(), w.replica.addr());
    let started = Instant::now();
    match how {
        Failover::Forced => assert_eq!(
            cli(w.sentinels[0].port, &["SENTINEL", "failover", &w.master]),
            "OK"
        ),
        Failover::Crash => w.primary.stop(),
    }

    // During: probe traffic from both instances until both have switched.
    let failovers = r#"fleet_limiter_store_failovers_total{store="redis"}"#;
    let mut during: Vec<(Duration, Answer)> = Vec::new();
    let mut i = 0;
    loop {
        during.push((started.elapsed(), ask(&client, &probes[i % 2]).await));
        i += 1;
        if i % 10 == 0 {
            let mut switched = 0;
            for g in &gws {
                if g.metric(failovers).await == Some(1.0) {
                    switched += 1;
                }
            }
            if switched == 2 {
                break;
            }
        }
        assert!(
            started.elapsed() < common::PATIENCE,
            "the gateways never followed the failover:\n{}",
            logs()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let switched_after = started.elapsed();
    assert_eq!(
        w.sentinels[0].primary(&w.master),
        new,
        "the replica was promoted"
    );

    // After: the rest of the budget, and not one more, across both instances.
    let mut after = Vec::new();
    let mut fallbacks_after = 0;
    let mut j = 0;
    loop {
        match ask(&client, &budget[j % 2]).await {
            Answer::Allowed(left) => after.push(left),
            Answer::Refused => break,
            Answer::Fallback(_) => fallbacks_after += 1,
        }
        j += 1;
        assert!(j < 1000, "the budget never ran out:\n{}", logs());
    }
    assert_eq!(
        after,
        (0..12).rev().collect::<Vec<u32>>(),
        "8 before + 12 after = the limit of 20, across both instances:\n{}",
        logs()
    );

    // What the switch cost, measured.
    let fell_back: Vec<Duration> = during
        .iter()
        .filter(|(_, a)| matches!(a, Answer::Fallback(_)))
        .map(|(t, _)| *t)
        .collect();
    let decided = during
        .iter()
        .filter(|(_, a)| matches!(a, Answer::Allowed(_)))
        .count() as u32;
    let window = match (fell_back.first(), fell_back.last()) {
        (Some(a), Some(b)) => *b - *a,
        _ => Duration::ZERO,
    };
    let Answer::Allowed(left) = ask(&client, &probes[0]).await else {
        panic!("the probe is decided after the switch:\n{}", logs());
    };
    let kept = 100_000 - 1 - left;
    eprintln!(
        "{how:?} failover: {} probe requests in {:?} until both gateways switched; {} answered by on_store_error over {:?} (first at {:?}); {decided} decided by Redis, {kept} of them kept by the new primary, {} lost with the old one; {fallbacks_after} fallbacks after the switch",
        during.len(),
        switched_after,
        fell_back.len(),
        window,
        fell_back.first().copied().unwrap_or_default(),
        decided.saturating_sub(kept),
    );
    for g in &gws {
        let log = g.stderr();
        assert_eq!(
            log.matches("redis primary switched").count(),
            1,
            "one line per switch:\n{log}"
        );
        assert!(log.contains(&format!("{old} -> {new}")), "{log}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_on_sentinel_keep_one_budget_across_a_forced_failover() {
    two_gateways_follow_a_failover(Failover::Forced).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_on_sentinel_keep_one_budget_when_the_primary_dies() {
    two_gateways_follow_a_failover(Failover::Crash).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_password_reaches_the_primary_and_a_sentinel_that_asks_for_it_and_is_never_shown() {
    const PASSWORD: &str = "Sent1nelS3cretXYZ";
    let auth = ["--requirepass", PASSWORD, "--masterauth", PASSWORD];
    let Some(primary) = redis_support::own_server_with(&auth) else {
        return;
    };
    let _replica = redis_support::replica_with_password(&primary, Some(PASSWORD));
    let master = unique("fl");
    // The Sentinel wants the same password: asked without it, it answers NOAUTH.
    let sentinel = redis_support::Sentinel::start_with(
        &master,
        primary.port,
        1,
        &format!("sentinel auth-pass {master} {PASSWORD}\nrequirepass {PASSWORD}"),
    );
    let url = format!(
        "redis+sentinel://default:{PASSWORD}@127.0.0.1:{}/{master}/3",
        sentinel.port
    );
    let name = unique("auth");
    let store = format!("[store]\nurl = \"{url}\"\ntimeout = \"500ms\"");
    let gw = gateway(
        &config(&store, &name, 3, "deny"),
        &redis_support::upstream(),
        &[],
        &[],
    );
    let client = reqwest::Client::new();
    let u = gw.url(&format!("/{name}/x"));
    let (first, _) = until_decided(&client, &gw, &u, "never reached the primary").await;
    assert_eq!(first, Answer::Allowed(2));
    assert_eq!(ask(&client, &u).await, Answer::Allowed(1));
    // The bucket is in database 3 of the primary (beside the shared tables, `fl:{levers}:…`).
    let keys = cli(
        primary.port,
        &["--no-auth-warning", "-a", PASSWORD, "-n", "3", "KEYS", "*"],
    );
    let buckets: Vec<&str> = keys.lines().filter(|k| !k.contains("{levers}")).collect();
    assert_eq!(buckets.len(), 1, "{keys}");

    let ready = client
        .get(gw.admin("/readyz"))
        .send()
        .await
        .expect("/readyz")
        .text()
        .await
        .expect("/readyz body");
    assert!(ready.contains("\"store_up\":true"), "{ready}");
    let log = gw.stderr();
    assert!(
        log.contains(&format!(
            "redis+sentinel://default:***@127.0.0.1:{}",
            sentinel.port
        )),
        "{log}"
    );
    assert!(
        log.contains(&format!(
            "the Sentinels name 127.0.0.1:{} as primary",
            primary.port
        )),
        "{log}"
    );
    for (what, text) in [
        ("/readyz", ready),
        ("the log", log),
        ("stdout", gw.stdout()),
    ] {
        assert!(!text.contains(PASSWORD), "{what}:\n{text}");
    }
}
