//! The controller that follows the upstream (`[shaping.upstream]`), measured from outside:
//! `docs/examples/shaping.toml` in front of a real upstream, the real binary. One caller cannot
//! drive it (a body trickled at 240 B/s, a report the upstream takes 20 s over); a pilot's
//! failures are seen and quiet is recovery; under a stall the fleet is told to come less often,
//! in a step, each agent keeping its slot; every wait it says is spread per caller.
//!
//! `cargo test --test shaping_controller -- --nocapture` prints what each run measured.

mod common;

use common::{Gateway, Launch};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const EXAMPLE: &str = include_str!("../docs/examples/shaping.toml");

/// The upstream's behaviour, changed while requests are in flight: every answer waits `delay`
/// and has `status`; a report (`/api/reports/**`) waits 20 s.
#[derive(Clone, Default)]
struct Behaviour {
    delay_ms: Arc<AtomicU64>,
    status: Arc<AtomicU16>,
}

impl Behaviour {
    fn set(&self, delay: Duration, status: u16) {
        self.delay_ms
            .store(delay.as_millis() as u64, Ordering::SeqCst);
        self.status.store(status, Ordering::SeqCst);
    }
}

impl wiremock::Respond for Behaviour {
    fn respond(&self, req: &wiremock::Request) -> wiremock::ResponseTemplate {
        let mut ms = self.delay_ms.load(Ordering::SeqCst);
        if req.url.path().starts_with("/api/reports/") {
            ms = 20_000;
        }
        let status = match self.status.load(Ordering::SeqCst) {
            0 => 200,
            s => s,
        };
        wiremock::ResponseTemplate::new(status)
            .set_body_string("ok")
            .set_delay(Duration::from_millis(ms))
    }
}

async fn upstream() -> (wiremock::MockServer, Behaviour) {
    let server = wiremock::MockServer::start().await;
    let b = Behaviour::default();
    wiremock::Mock::given(wiremock::matchers::any())
        .respond_with(b.clone())
        .mount(&server)
        .await;
    (server, b)
}

fn gateway(upstream: &str) -> Gateway {
    Launch::serve()
        .config_toml(EXAMPLE)
        .upstream(upstream)
        .env("FLEET_LIMITER_TRUST_PROXY", "127.0.0.1")
        .admin()
        .spawn()
}

/// One answer as a client sees it.
#[derive(Debug, Clone)]
struct Seen {
    /// When it was asked and answered (ms since the test's start).
    asked_ms: u64,
    at_ms: u64,
    status: u16,
    kind: String,
    hint: Option<u64>,
    retry_after: Option<u64>,
}

async fn ask(rb: reqwest::RequestBuilder, start: Instant) -> Seen {
    let asked_ms = start.elapsed().as_millis() as u64;
    let r = rb.send().await.expect("answered");
    let at_ms = start.elapsed().as_millis() as u64;
    let num = |name: &str| {
        r.headers()
            .get(name)
            .map(|v| v.to_str().expect("ascii").parse::<u64>().expect("a number"))
    };
    let (hint, retry_after) = (num("x-poll-interval"), num("retry-after"));
    let status = r.status().as_u16();
    let body = r.text().await.unwrap_or_default();
    let kind = serde_json::from_str::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v["type"].as_str().map(str::to_owned))
        .unwrap_or_default();
    Seen {
        asked_ms,
        at_ms,
        status,
        kind,
        hint,
        retry_after,
    }
}

async fn metric(gw: &Gateway, sample: &str) -> f64 {
    let text = common::client()
        .get(gw.admin("/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text");
    common::sample_value(&text, sample).unwrap_or_else(|| panic!("no {sample}"))
}

/// Traffic from many callers, every `every`, on `path` (`heartbeat`: a fresh agent each time),
/// until `stop`; what each met.
fn traffic(
    gw: &Gateway,
    path: &'static str,
    every: Duration,
    stop: Arc<AtomicBool>,
    start: Instant,
) -> tokio::task::JoinHandle<Vec<Seen>> {
    let (client, url) = (common::client(), gw.url(path));
    tokio::spawn(async move {
        let mut sent = Vec::new();
        let mut n = 0u32;
        while !stop.load(Ordering::Relaxed) {
            n += 1;
            let rb = if path.ends_with("heartbeat") {
                client
                    .post(&url)
                    .header("x-forwarded-for", format!("198.51.100.{}", n % 40 + 1))
                    .header(
                        "x-agent-id",
                        format!("agent-{n:05}-{:08x}", rand::random::<u32>()),
                    )
            } else {
                client.get(&url).header(
                    "x-forwarded-for",
                    format!("203.0.{}.{}", n / 250 % 250, n % 250 + 1),
                )
            };
            sent.push(tokio::spawn(ask(rb, start)));
            tokio::time::sleep(every).await;
        }
        let mut met = Vec::new();
        for s in sent {
            met.push(s.await.expect("a request task"));
        }
        met
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_trickled_body_and_one_slow_report_shed_nobody_and_stay_under_the_target() {
    let (upstream, _) = upstream().await;
    let gw = gateway(&upstream.uri());
    let start = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    // One client declares 100 000 bytes, sends 24 000, then 240 bytes a second.
    let addr = gw
        .url("/")
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let trickle = tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        let mut s = tokio::net::TcpStream::connect(&addr)
            .await
            .expect("connect");
        let head = format!(
            "POST /api/agent/upload HTTP/1.1\r\nhost: {addr}\r\nx-forwarded-for: 192.0.2.66\r\ncontent-length: 100000\r\n\r\n"
        );
        s.write_all(head.as_bytes()).await.expect("head");
        s.write_all(&[b'a'; 24_000]).await.expect("first part");
        for _ in 0..18 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            if s.write_all(&[b'a'; 240]).await.is_err() {
                break;
            }
        }
    });
    // And, separately, one report the upstream takes 20 s to build.
    let report = tokio::spawn(ask(
        common::client()
            .get(gw.url("/api/reports/yearly"))
            .header("x-forwarded-for", "192.0.2.77"),
        start,
    ));
    // Everyone else: heartbeats, polls, exports and an unnamed route from many addresses.
    let others = [
        traffic(
            &gw,
            "/api/agent/heartbeat",
            Duration::from_millis(100),
            stop.clone(),
            start,
        ),
        traffic(
            &gw,
            "/api/agent/poll",
            Duration::from_millis(100),
            stop.clone(),
            start,
        ),
        traffic(
            &gw,
            "/api/export/devices.csv",
            Duration::from_millis(100),
            stop.clone(),
            start,
        ),
        traffic(
            &gw,
            "/api/devices",
            Duration::from_millis(100),
            stop.clone(),
            start,
        ),
    ];
    let mut pressure = Vec::new();
    for _ in 0..18 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        pressure.push(metric(&gw, "fleet_limiter_upstream_pressure_seconds").await);
    }
    stop.store(true, Ordering::Relaxed);
    let mut met = Vec::new();
    for t in others {
        met.extend(t.await.expect("traffic"));
    }
    let _ = trickle.await;
    let report = report.await.expect("the report");
    let shed: Vec<&Seen> = met.iter().filter(|m| m.status == 503).collect();
    assert!(met.len() > 400, "{} requests", met.len());
    assert!(shed.is_empty(), "shed while one caller was slow: {shed:?}");
    assert!(
        pressure.iter().all(|&p| p < 0.25),
        "upstream_pressure_seconds {pressure:?}"
    );
    assert_eq!(report.status, 200, "{report:?}");
    eprintln!(
        "{} requests from others during a trickled body and a 20 s report: none shed; upstream_pressure_seconds at most {:.3} s",
        met.len(),
        pressure.iter().cloned().fold(0.0, f64::max)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pilots_failures_are_seen_and_quiet_is_recovery() {
    let (upstream, behaviour) = upstream().await;
    behaviour.set(Duration::ZERO, 500);
    let gw = gateway(&upstream.uri());
    let client = common::client();
    let start = Instant::now();
    // 30 agents, one request a second in all, every answer a 500; an export probe beside.
    let mut reacted = None;
    for n in 0..40u32 {
        let i = n % 30;
        let hb = client
            .post(gw.url("/api/agent/heartbeat"))
            .header("x-forwarded-for", format!("198.51.100.{}", i + 1))
            .header("x-agent-id", format!("pilot-{i:02}"));
        let seen = ask(hb, start).await;
        assert_ne!(seen.status, 503, "a heartbeat shed: {seen:?}");
        let probe = ask(
            client
                .get(gw.url("/api/export/probe.csv"))
                .header("x-forwarded-for", "192.0.2.9"),
            start,
        )
        .await;
        if probe.status == 503 {
            reacted = Some(probe.asked_ms);
            break;
        }
        tokio::time::sleep(Duration::from_millis(1000)).await;
    }
    let reacted = reacted.expect("the controller reacts to a pilot's failures");
    assert!(reacted <= 20_000, "reacted after {reacted} ms");
    // The upstream is healthy again; 45 s of quiet, then every priority is served.
    behaviour.set(Duration::ZERO, 200);
    tokio::time::sleep(Duration::from_secs(45)).await;
    let back = start.elapsed().as_millis() as u64;
    let mut after = Vec::new();
    for (i, path) in ["/api/export/a.csv", "/api/devices", "/api/agent/poll"]
        .iter()
        .enumerate()
    {
        after.push(
            ask(
                client
                    .get(gw.url(path))
                    .header("x-forwarded-for", format!("192.0.2.{}", 20 + i)),
                start,
            )
            .await,
        );
    }
    assert!(
        after.iter().all(|m| m.status == 200),
        "shed after 45 s of quiet: {after:?}"
    );
    assert_eq!(metric(&gw, "fleet_limiter_shaping_shed_level").await, 0.0);
    eprintln!(
        "30 agents at one request a second, every answer 500: exports shed {reacted} ms in; after 45 s of quiet ({back} ms) nothing shed"
    );
}

/// An agent that follows its hints on the heartbeat, from `from_ms` (ms since `start`) until
/// `stop`: every answer it met.
fn follower(
    gw: &Gateway,
    i: usize,
    start: Instant,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Vec<Seen>> {
    let (client, url) = (common::client(), gw.url("/api/agent/heartbeat"));
    tokio::spawn(async move {
        // Spread the first asks over a few seconds, as a fleet's would be.
        tokio::time::sleep(Duration::from_millis((i as u64 * 37) % 5_000)).await;
        let mut met = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            let rb = client
                .post(&url)
                .header(
                    "x-forwarded-for",
                    format!("198.18.{}.{}", i / 200, i % 200 + 1),
                )
                .header("x-agent-id", format!("follower-{i:04}"));
            let seen = ask(rb, start).await;
            let wait = seen.hint.unwrap_or(60);
            met.push(seen);
            let deadline = Instant::now() + Duration::from_secs(wait);
            while Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        met
    })
}

/// Twenty agents asking the heartbeat all at once: the slot each is told (s since the start).
async fn ask_twenty(
    client: &reqwest::Client,
    gw: &Gateway,
    start: Instant,
    tag: &'static str,
) -> Vec<u64> {
    let (client, url) = (client.clone(), gw.url("/api/agent/heartbeat"));
    // All twenty at once: during the stall each answer takes a second.
    futures_util::future::join_all((0..20).map(|i| {
        let rb = client
            .post(&url)
            .header("x-forwarded-for", format!("192.0.2.{}", i + 100))
            .header("x-agent-id", format!("{tag}-{i:02}"));
        async move {
            let s = ask(rb, start).await;
            // The slot it names, from when it was asked (s since the start).
            (s.asked_ms + 500) / 1000 + s.hint.expect("a hint")
        }
    }))
    .await
}

/// A sleep until `ms` into the stall (which began `stalled` ms after `start`).
fn into_the_stall(start: Instant, stalled: u64, ms: u64) -> tokio::time::Sleep {
    let now = start.elapsed().as_millis() as u64;
    tokio::time::sleep(Duration::from_millis((stalled + ms).saturating_sub(now)))
}

/// Twenty agents asked four times over the stall's first 12 s (as absolute slots, s); twenty
/// more asked 12 s in and again 3 s later.
async fn ask_over_the_stall(
    client: &reqwest::Client,
    gw: &Gateway,
    start: Instant,
    stalled: u64,
) -> (Vec<Vec<u64>>, Vec<u64>, Vec<u64>) {
    let mut four: Vec<Vec<u64>> = vec![Vec::new(); 20];
    for k in 0..4u64 {
        into_the_stall(start, stalled, k * 4_000).await;
        for (i, slot) in ask_twenty(client, gw, start, "asked-four")
            .await
            .into_iter()
            .enumerate()
        {
            four[i].push(slot);
        }
    }
    let at_12 = ask_twenty(client, gw, start, "asked-twice").await;
    into_the_stall(start, stalled, 15_000).await;
    let at_15 = ask_twenty(client, gw, start, "asked-twice").await;
    (four, at_12, at_15)
}

/// Once exports are shed, 300 of them within one second, from 300 callers.
async fn burst_of_exports(client: &reqwest::Client, gw: &Gateway, start: Instant) -> Vec<Seen> {
    let probe = || {
        ask(
            client
                .get(gw.url("/api/export/probe.csv"))
                .header("x-forwarded-for", "192.0.2.250"),
            start,
        )
    };
    while probe().await.status != 503 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    futures_util::future::join_all((0..300u32).map(|i| {
        let rb = client
            .get(gw.url("/api/export/devices.csv"))
            .header("x-forwarded-for", format!("203.0.113.{}", i % 250 + 1))
            .header("x-agent-id", format!("dashboard-{i:03}"));
        async move {
            tokio::time::sleep(Duration::from_millis(u64::from(i) * 2)).await;
            ask(rb, start).await
        }
    }))
    .await
}

/// Polls from ten callers, shed or not, during the rest of the stall.
async fn polls_through_the_stall(
    client: &reqwest::Client,
    gw: &Gateway,
    start: Instant,
    stalled: u64,
) -> Vec<Seen> {
    let mut polls = Vec::new();
    while start.elapsed().as_millis() as u64 - stalled < 29_000 {
        polls.extend(
            futures_util::future::join_all((0..10u32).map(|i| {
                ask(
                    client
                        .get(gw.url("/api/agent/poll"))
                        .header("x-forwarded-for", format!("192.0.2.{}", 150 + i))
                        .header("x-agent-id", format!("poller-{i}")),
                    start,
                )
            }))
            .await,
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    polls
}

/// No heartbeat refused or shed; every hint within 30 s and 90 s; the hints during the stall
/// longer than while healthy. The mean hints healthy and during, and how many of each.
fn assert_heartbeats_told_to_come_less_often(
    met: &[Seen],
    stalled: u64,
    recovered: u64,
) -> (f64, f64, usize, usize) {
    // No heartbeat refused or shed; every hint within 30 s and 90 s.
    let bad: Vec<&Seen> = met.iter().filter(|m| m.status != 200).collect();
    assert!(bad.is_empty(), "heartbeats not served: {bad:?}");
    let hint = |m: &Seen| m.hint.expect("every heartbeat carries a hint");
    assert!(met.iter().all(|m| (30..=90).contains(&hint(m))), "{met:?}");
    // The fleet's hints while healthy (after every agent's first) and during the stall.
    let healthy: Vec<u64> = met
        .iter()
        .filter(|m| m.asked_ms > 70_000 && m.asked_ms < stalled)
        .map(hint)
        .collect();
    let during: Vec<u64> = met
        .iter()
        .filter(|m| m.asked_ms >= stalled && m.asked_ms < recovered)
        .map(hint)
        .collect();
    let mean = |v: &[u64]| v.iter().sum::<u64>() as f64 / v.len().max(1) as f64;
    let (h, d) = (mean(&healthy), mean(&during));
    assert!(
        healthy.len() > 40 && during.len() > 60,
        "{} {}",
        healthy.len(),
        during.len()
    );
    assert!(
        d >= 1.15 * h,
        "mean hint {d:.1} during the stall, {h:.1} healthy"
    );
    (h, d, healthy.len(), during.len())
}

/// A slot moves at most once per step; asked again 3 s later, the same slot. How many of the
/// twenty kept to each.
fn assert_slots_kept(four: &[Vec<u64>], at_12: &[u64], at_15: &[u64]) -> (usize, usize) {
    // A slot moves at most once per step; asked again 3 s later, the same slot.
    let steady = four
        .iter()
        .filter(|slots| {
            let mut s: Vec<u64> = slots.to_vec();
            s.sort_unstable();
            s.dedup_by(|a, b| a.abs_diff(*b) <= 2);
            s.len() <= 2
        })
        .count();
    assert!(steady >= 18, "{four:?}");
    let same = at_12
        .iter()
        .zip(at_15)
        .filter(|(a, b)| a.abs_diff(**b) <= 2)
        .count();
    assert!(same >= 18, "{at_12:?} {at_15:?}");
    (steady, same)
}

/// Shed exports are told to come back over a spread of times, no second busier than 1.5x: how
/// many were shed, over how many seconds, the busiest second and the mean.
fn assert_shed_exports_spread(exports: &[Seen]) -> (usize, u64, u32, f64) {
    // Shed exports are told to come back over a spread of times, no second busier than 1.5x.
    let shed: Vec<&Seen> = exports.iter().filter(|m| m.status == 503).collect();
    assert!(shed.len() >= 250, "{} of 300 exports shed", shed.len());
    assert!(shed
        .iter()
        .all(|m| m.kind == "urn:fleet-limiter:problem:shed"));
    let back: Vec<u64> = shed
        .iter()
        .map(|m| (m.at_ms + 1000 * m.retry_after.expect("Retry-After")) / 1000)
        .collect();
    let (lo, hi) = (
        *back.iter().min().expect("some"),
        *back.iter().max().expect("some"),
    );
    let mut per: HashMap<u64, u32> = HashMap::new();
    for b in &back {
        *per.entry(*b).or_default() += 1;
    }
    let busiest = *per.values().max().expect("some");
    let mean_per_second = back.len() as f64 / (hi - lo + 1) as f64;
    assert!(hi - lo >= 4, "told to come back over {} s", hi - lo);
    assert!(
        f64::from(busiest) <= 1.5 * mean_per_second,
        "busiest second {busiest}, mean {mean_per_second:.1}: {per:?}"
    );
    (shed.len(), hi - lo, busiest, mean_per_second)
}

/// Every shed poll is told its slot: at least half its 30 s interval, and its Retry-After no
/// shorter. How many were shed.
fn assert_shed_polls_told_their_slot(polls: &[Seen]) -> usize {
    // Every shed poll is told its slot: at least half its 30 s interval, and its Retry-After
    // no shorter.
    let shed_polls: Vec<&Seen> = polls.iter().filter(|m| m.status == 503).collect();
    assert!(!shed_polls.is_empty(), "polls are shed in a long stall");
    for m in &shed_polls {
        let h = m.hint.expect("a shed poll carries X-Poll-Interval");
        assert!(h >= 15, "{m:?}");
        assert!(m.retry_after.expect("Retry-After") >= h, "{m:?}");
    }
    shed_polls.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn under_a_stall_the_fleet_comes_less_often_in_a_step_each_agent_keeping_its_slot() {
    let (upstream, behaviour) = upstream().await;
    let gw = gateway(&upstream.uri());
    let client = common::client();
    let start = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    // 240 agents follow their hints; after 100 s every one is on its slot.
    let fleet: Vec<_> = (0..240)
        .map(|i| follower(&gw, i, start, stop.clone()))
        .collect();
    tokio::time::sleep(Duration::from_secs(100)).await;
    // The upstream stalls: a second for every answer, for 30 s.
    behaviour.set(Duration::from_secs(1), 200);
    let stalled = start.elapsed().as_millis() as u64;
    // Twenty agents asked four times over the stall's first 12 s, twenty more asked twice;
    // meanwhile, once exports are shed, 300 of them within one second.
    let ((four, at_12, at_15), exports) = tokio::join!(
        ask_over_the_stall(&client, &gw, start, stalled),
        burst_of_exports(&client, &gw, start)
    );
    // Polls from ten callers, shed or not, during the rest of the stall.
    let polls = polls_through_the_stall(&client, &gw, start, stalled).await;
    let stretch = metric(&gw, "fleet_limiter_shaping_stretch").await;
    behaviour.set(Duration::ZERO, 200);
    let recovered = start.elapsed().as_millis() as u64;
    stop.store(true, Ordering::Relaxed);
    let mut met = Vec::new();
    for f in fleet {
        met.extend(f.await.expect("an agent"));
    }

    let (h, d, healthy, during) =
        assert_heartbeats_told_to_come_less_often(&met, stalled, recovered);
    let (steady, same) = assert_slots_kept(&four, &at_12, &at_15);
    let (shed, over, busiest, mean_per_second) = assert_shed_exports_spread(&exports);
    let shed_polls = assert_shed_polls_told_their_slot(&polls);
    eprintln!(
        "stall: mean heartbeat hint {d:.1} s ({during} hints) against {h:.1} s healthy ({healthy}): {:.2}x; stretch {stretch}; {steady}/20 told at most two slots over 12 s; {same}/20 told one slot 3 s apart; {shed} exports shed, told to come back over {over} s, busiest second {busiest} (mean {mean_per_second:.1}); {shed_polls} polls shed, each told its slot",
        d / h,
    );
}

/// Five callers each waiting on a report the upstream takes 20 s over, and an export probe
/// every 250 ms for 6 s: whether the probe was ever shed.
async fn reports_shed_exports(extra: &str) -> bool {
    let (upstream, _) = upstream().await;
    let gw = Launch::serve()
        .config_toml(format!("{EXAMPLE}\n{extra}"))
        .upstream(&upstream.uri())
        .env("FLEET_LIMITER_TRUST_PROXY", "127.0.0.1")
        .spawn();
    let start = Instant::now();
    let client = common::client();
    let reports: Vec<_> = (0..5)
        .map(|i| {
            tokio::spawn(ask(
                client
                    .get(gw.url("/api/reports/yearly"))
                    .header("x-forwarded-for", format!("192.0.2.{}", 30 + i)),
                start,
            ))
        })
        .collect();
    let mut shed = false;
    while start.elapsed() < Duration::from_secs(6) {
        let probe = ask(
            client
                .get(gw.url("/api/export/probe.csv"))
                .header("x-forwarded-for", "192.0.2.99"),
            start,
        )
        .await;
        shed |= probe.status == 503;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    for r in reports {
        r.abort();
    }
    shed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_route_slow_by_nature_left_out_of_the_signal_sheds_nothing() {
    let unwatched =
        "[shaping.routes.reports]\nroutes = [\"GET /api/reports/**\"]\nwatched = false\n";
    assert!(
        !reports_shed_exports(unwatched).await,
        "slow reports on an unwatched route shed exports"
    );
    // Watched, five callers' slow reports are the upstream missing its target.
    let watched = "[shaping.routes.reports]\nroutes = [\"GET /api/reports/**\"]\n";
    assert!(
        reports_shed_exports(&format!("{watched}priority = \"normal\"\n")).await,
        "five callers' slow reports on a watched route are a miss"
    );
}
