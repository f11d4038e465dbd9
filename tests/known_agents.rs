//! The known-agents table end to end: the real binary behind a trusted proxy on loopback, its
//! clients named by `X-Forwarded-For` (many IPv6 /56s for the floods, one IPv4 NAT per site).
//!
//! What must hold: a site that fits the declared fleet loses no heartbeat however the table was
//! filled from other addresses — by ids seen once, long ago, from hundreds of /56s, or by a flood
//! that is still minting ids from addresses heavier than the site — and an IPv6 /56 is one
//! address to the table whatever prefix the limiters key on. The table's counts are read from
//! `/metrics`. No assertion depends on how fast the machine is: where a test needs ids to have
//! aged past the table's grace, it waits for that and asserts only on what the table did.

mod common;

use common::{client, upstream, Gateway, Launch};
use futures_util::stream::{self, StreamExt};
use std::time::Duration;

/// Requests in flight at once while a test floods.
const CONCURRENCY: usize = 16;

const SITE: usize = 250;

fn trusting_loopback(l: Launch) -> Launch {
    l.args(["--trust-proxy", "127.0.0.1/32"]).admin()
}

/// `POST /api/agent/heartbeat` as `agent` from `ip` (through the trusted proxy); the status.
async fn beat(gw: &Gateway, ip: &str, agent: &str) -> u16 {
    client()
        .post(gw.url("/api/agent/heartbeat"))
        .header("x-forwarded-for", ip)
        .header("x-agent-id", agent)
        .send()
        .await
        .unwrap_or_else(|e| panic!("heartbeat of {agent} at {ip}: {e}"))
        .status()
        .as_u16()
}

/// Send every `(ip, agent)` heartbeat, [`CONCURRENCY`] at a time; the statuses, in order.
async fn beats(gw: &Gateway, reqs: Vec<(String, String)>) -> Vec<u16> {
    stream::iter(reqs)
        .map(|(ip, agent)| async move { beat(gw, &ip, &agent).await })
        .buffered(CONCURRENCY)
        .collect()
        .await
}

/// One round of a site: every agent's heartbeat once; how many were refused.
async fn site_round(gw: &Gateway, nat: &str, site: &str) -> usize {
    let reqs = (0..SITE)
        .map(|i| (nat.to_owned(), format!("{site}-agent-{i:03}")))
        .collect();
    let statuses = beats(gw, reqs).await;
    for s in &statuses {
        assert!(*s == 200 || *s == 429, "a site heartbeat answered {s}");
    }
    statuses.iter().filter(|s| **s != 200).count()
}

/// An address in the `n`th IPv6 /56 under 2001:db8::/32, with low bits that vary with `host`
/// (every address of one /56 is one client).
fn v6_56(n: usize, host: usize) -> String {
    format!(
        "2001:db8:{:x}:{:x}{:02x}:{:x}::{:x}",
        n >> 8,
        n & 0xff,
        host & 0xff,
        host,
        host + 1
    )
}

async fn metric(gw: &Gateway, sample: &str) -> f64 {
    gw.metric(sample)
        .await
        .unwrap_or_else(|| panic!("{sample} is not in /metrics"))
}

const HELD_PROBATION: &str = "fleet_limiter_known_agents{segment=\"probation\"}";
const HELD_PROTECTED: &str = "fleet_limiter_known_agents{segment=\"protected\"}";
const NOT_REMEMBERED_TABLE: &str =
    "fleet_limiter_known_agents_not_remembered_total{reason=\"table\"}";
const NOT_REMEMBERED_ADDRESS: &str =
    "fleet_limiter_known_agents_not_remembered_total{reason=\"address\"}";
const EVICTED_STALE: &str =
    "fleet_limiter_known_agents_evicted_total{segment=\"probation\",reason=\"stale\"}";
const EVICTED_SHARE: &str =
    "fleet_limiter_known_agents_evicted_total{segment=\"probation\",reason=\"share\"}";

#[tokio::test]
async fn a_site_loses_no_heartbeat_after_many_56s_filled_the_table() {
    let up = upstream().await;
    // 2 000 ids in all. Agents beat every 2 s, so an id not seen again within 4 s is past the
    // grace a healthy agent needs. agent-device carries that cadence (60 a minute).
    let gw = trusting_loopback(Gateway::serve().upstream(&up.uri()))
        .config_toml(
            "[store]\nmax_keys = 2000\n\n\
             [fleet]\nheartbeat_interval_seconds = 2\npoll_interval_seconds = 2\nmax_agents = 600\n\n\
             [limiters.agent-device]\nlimit = 120\n",
        )
        .spawn();
    // 160 /56s mint 30 ids each, every id seen once: 4 800 ids for a table of 2 000.
    let flood: Vec<(String, String)> = (0..160)
        .flat_map(|n| (0..30).map(move |i| (v6_56(n, i), format!("flood-{n}-{i}"))))
        .collect();
    let statuses = beats(&gw, flood).await;
    assert!(
        statuses.iter().all(|s| *s == 200),
        "each /56 stays under its ceiling"
    );
    assert_eq!(
        metric(&gw, HELD_PROBATION).await,
        2000.0,
        "the table is full"
    );
    assert_eq!(metric(&gw, HELD_PROTECTED).await, 0.0);
    let dropped = metric(&gw, NOT_REMEMBERED_TABLE).await
        + metric(&gw, EVICTED_STALE).await
        + metric(&gw, EVICTED_SHARE).await;
    assert_eq!(dropped, 2800.0, "every id past the first 2 000 cost one");
    // The flood's ids are now older than any healthy agent's gap between two requests.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let mut refused = 0;
    for round in 0..3 {
        refused += site_round(&gw, "198.51.100.20", "new").await;
        // The flood keeps the table full between rounds: fresh ids from its /56s.
        let more: Vec<(String, String)> = (0..100)
            .map(|i| (v6_56(i, 40 + round), format!("more-{round}-{i}")))
            .collect();
        assert!(beats(&gw, more).await.iter().all(|s| *s == 200));
    }
    assert_eq!(refused, 0, "heartbeats of the new site refused");
    assert_eq!(
        metric(&gw, HELD_PROTECTED).await,
        SITE as f64,
        "the site's agents, seen twice"
    );
    assert_eq!(
        metric(&gw, HELD_PROBATION).await + metric(&gw, HELD_PROTECTED).await,
        2000.0,
        "still full, and never past its bound"
    );
}

#[tokio::test]
async fn a_flood_from_heavier_addresses_gives_way_to_a_new_site() {
    let up = upstream().await;
    // 2 000 ids; the ceiling lets each address mint 500 at once and remember 500.
    let gw = trusting_loopback(Gateway::serve().upstream(&up.uri()))
        .config_toml(
            "[store]\nmax_keys = 2000\n\n[fleet]\nmax_agents = 600\n\n\
             [limiters.agent-ip]\nlimit = 500\n",
        )
        .spawn();
    // Five /56s mint 400 ids each: the table is full of ids still within their grace.
    let first: Vec<(String, String)> = (0..5)
        .flat_map(|n| (0..400).map(move |i| (v6_56(n, i), format!("heavy-{n}-{i}"))))
        .collect();
    assert!(beats(&gw, first).await.iter().all(|s| *s == 200));
    assert_eq!(
        metric(&gw, HELD_PROBATION).await,
        2000.0,
        "the table is full"
    );
    // The site arrives while the flood goes on minting (100 more ids per /56).
    let more: Vec<(String, String)> = (0..5)
        .flat_map(|n| (400..500).map(move |i| (v6_56(n, i), format!("heavy-{n}-{i}"))))
        .collect();
    let (refused_first, flood_statuses) = tokio::join!(
        site_round(&gw, "198.51.100.30", "arriving"),
        beats(&gw, more)
    );
    assert!(flood_statuses.iter().all(|s| *s == 200));
    let mut refused = refused_first;
    for _ in 0..2 {
        refused += site_round(&gw, "198.51.100.30", "arriving").await;
    }
    assert_eq!(refused, 0, "heartbeats of the new site refused");
    assert_eq!(metric(&gw, HELD_PROTECTED).await, SITE as f64);
    // The site's first sightings took the flood's places, heaviest address first.
    assert!(metric(&gw, EVICTED_SHARE).await >= SITE as f64);
    assert!(metric(&gw, NOT_REMEMBERED_TABLE).await > 0.0);
    assert_eq!(metric(&gw, EVICTED_STALE).await, 0.0, "nothing aged out");
}

#[tokio::test]
async fn an_unattacked_site_fits_a_table_of_6400() {
    let up = upstream().await;
    let gw = trusting_loopback(Gateway::serve().upstream(&up.uri()))
        .config_toml("[store]\nmax_keys = 6400\n\n[fleet]\nmax_agents = 1000\n")
        .spawn();
    let mut refused = 0;
    for _ in 0..3 {
        refused += site_round(&gw, "198.51.100.40", "quiet").await;
    }
    assert_eq!(refused, 0, "heartbeats refused");
    assert_eq!(metric(&gw, HELD_PROTECTED).await, SITE as f64);
    assert_eq!(metric(&gw, NOT_REMEMBERED_TABLE).await, 0.0);
}

#[tokio::test]
async fn a_56_is_one_address_to_the_table_when_limiters_key_on_64s() {
    let up = upstream().await;
    let gw = trusting_loopback(Gateway::serve().upstream(&up.uri()))
        .config_toml(
            "[store]\nmax_keys = 2000\n\n[fleet]\nmax_agents = 600\n\n\
             [client_ip]\nipv6_prefix = 64\n",
        )
        .spawn();
    // Eight /64s of one /56, each under its own ceiling (250 new ids), mint 200 ids each.
    let flood: Vec<(String, String)> = (0..8)
        .flat_map(|sub| {
            (0..200).map(move |i| {
                (
                    format!("2001:db8:77:ab{sub:02x}::{i:x}"),
                    format!("sub-{sub}-{i}"),
                )
            })
        })
        .collect();
    assert!(beats(&gw, flood).await.iter().all(|s| *s == 200));
    // The /56 is one address: it keeps at most max_known = 500 ids.
    assert_eq!(metric(&gw, HELD_PROBATION).await, 500.0);
    assert_eq!(metric(&gw, NOT_REMEMBERED_ADDRESS).await, 1100.0);
    let mut refused = 0;
    for _ in 0..3 {
        refused += site_round(&gw, "198.51.100.50", "beside").await;
    }
    assert_eq!(refused, 0, "heartbeats refused");
}

#[tokio::test]
async fn every_spelling_of_one_56_is_one_address_to_the_table() {
    let up = upstream().await;
    // The ceiling lets the /56 mint 1 000 ids at once: only the table's own bound can stop it.
    let gw = trusting_loopback(Gateway::serve().upstream(&up.uri()))
        .config_toml(
            "[store]\nmax_keys = 2000\n\n[fleet]\nmax_agents = 600\n\n\
             [limiters.agent-ip]\nlimit = 1000\n",
        )
        .spawn();
    // 600 ids, each from its own spelling of an address in 2001:db8:0:1200::/56: upper and lower
    // case, leading zeros, compressed and written out, low bits anywhere in the /56.
    let spelling = |i: usize| match i % 4 {
        0 => format!("2001:db8:0:12{:02x}::{:x}", i % 256, i),
        1 => format!("2001:0DB8:0000:12{:02X}:0000:0000:0000:{:04X}", i % 256, i),
        2 => format!("2001:db8::12{:02x}:{:x}:0:0:1", i % 256, i),
        _ => format!("2001:DB8:0:12FF:FFFF:FFFF:FFFF:{:X}", i),
    };
    let reqs: Vec<(String, String)> = (0..600).map(|i| (spelling(i), format!("s-{i}"))).collect();
    assert!(beats(&gw, reqs).await.iter().all(|s| *s == 200));
    assert_eq!(
        metric(&gw, HELD_PROBATION).await,
        500.0,
        "max_known for the /56"
    );
    assert_eq!(metric(&gw, NOT_REMEMBERED_ADDRESS).await, 100.0);
    // The first 100 again, each from another spelling: known ids, seen twice, not new ones.
    let again: Vec<(String, String)> = (0..100)
        .map(|i| (spelling(i + 1), format!("s-{i}")))
        .collect();
    assert!(beats(&gw, again).await.iter().all(|s| *s == 200));
    assert_eq!(metric(&gw, HELD_PROTECTED).await, 100.0);
    assert_eq!(metric(&gw, HELD_PROBATION).await, 400.0);
    assert_eq!(metric(&gw, NOT_REMEMBERED_ADDRESS).await, 100.0);
}

#[test]
fn check_judges_the_table_against_the_declared_fleet() {
    let ok = Launch::command(["check"]).run(Duration::from_secs(60));
    assert_eq!(ok.code, Some(0), "{}{}", ok.stdout, ok.stderr);
    assert!(
        ok.stdout.contains(
            "Known agents: 100000 ids (store.max_keys): 50000 for agents seen twice (fleet.max_agents = 10000), 50000 for first sightings"
        ) && ok.stdout.contains("while other addresses hold at most 49750 minted within 2m")
            && ok.stdout.contains("a flood from up to 199 addresses at any rate"),
        "{}",
        ok.stdout
    );
    let small = Launch::command(["check"])
        .env("FLEET_LIMITER_MAX_KEYS", "6400")
        .run(Duration::from_secs(60));
    assert_eq!(small.code, Some(1), "{}{}", small.stdout, small.stderr);
    assert!(
        small.stdout.contains("fewer than fleet.max_agents = 10000")
            && small
                .stdout
                .contains("set store.max_keys to at least 20000"),
        "{}",
        small.stdout
    );
    let tiny = Launch::command(["check"])
        .env("FLEET_LIMITER_MAX_KEYS", "900")
        .env("FLEET_LIMITER_MAX_AGENTS", "300")
        .run(Duration::from_secs(60));
    assert_eq!(tiny.code, Some(1), "{}{}", tiny.stdout, tiny.stderr);
    assert!(
        tiny.stdout.contains("set store.max_keys to at least 1000"),
        "{}",
        tiny.stdout
    );
}
