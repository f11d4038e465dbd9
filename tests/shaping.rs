//! Poll slots: `docs/examples/shaping.toml` in front of a real upstream. A herd of agents is told
//! slots spread across the interval, each agent keeps its slot (across requests and across
//! instances), a refusal's slot is never sooner than its `Retry-After`, and exports from one
//! address are held to their share at the upstream.

mod common;
mod identity_support;
mod redis_support;

use common::{Gateway, Launch};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const EXAMPLE: &str = include_str!("../docs/examples/shaping.toml");

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64
}

/// One heartbeat of `agent`: its status, the hint, `Retry-After`, and the instant the answer
/// came (ms since the epoch).
async fn heartbeat(gw: &Gateway, agent: &str) -> (u16, Option<u64>, Option<u64>, u64) {
    let r = common::client()
        .post(gw.url("/api/agent/heartbeat"))
        .header("x-agent-id", agent)
        .send()
        .await
        .expect("request");
    let at = now_ms();
    let num = |name: &str| {
        r.headers()
            .get(name)
            .map(|v| v.to_str().expect("ascii").parse::<u64>().expect("a number"))
    };
    (
        r.status().as_u16(),
        num("x-poll-interval"),
        num("retry-after"),
        at,
    )
}

/// Where in the interval the slot a hint names falls (ms).
fn slot_ms(at_ms: u64, hint_s: u64, interval_s: u64) -> u64 {
    (at_ms + hint_s * 1000) % (interval_s * 1000)
}

/// The distance between two phases on a circle of `interval_s` seconds (ms).
fn apart(a: u64, b: u64, interval_s: u64) -> u64 {
    let m = interval_s * 1000;
    let d = a.abs_diff(b) % m;
    d.min(m - d)
}

fn gateway(upstream: &str) -> Gateway {
    Launch::serve()
        .config_toml(EXAMPLE)
        .upstream(upstream)
        .spawn()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_herd_is_told_slots_spread_across_the_interval_and_each_agent_keeps_its_own() {
    let upstream = common::upstream().await;
    let gw = gateway(&upstream.uri());
    let other = gateway(&upstream.uri());
    // 240 agents behind one address, all at once.
    let agents: Vec<String> = (0..240)
        .map(|i| format!("agent-{i:04}-{:08x}", rand::random::<u32>()))
        .collect();
    // As a site's agents come back after an outage: all in the same second or two, a few dozen
    // in flight at once (each answered in milliseconds).
    use futures_util::StreamExt;
    let first: Vec<_> = futures_util::stream::iter(agents.iter().map(|a| heartbeat(&gw, a)))
        .buffered(24)
        .collect()
        .await;
    let mut sixths = [0u32; 6];
    let mut slots = Vec::new();
    for (agent, (status, hint, _, at)) in agents.iter().zip(&first) {
        assert_eq!(*status, 200, "{agent}: a healthy agent's heartbeat");
        let hint = hint.unwrap_or_else(|| panic!("{agent}: no X-Poll-Interval"));
        assert!((30..=90).contains(&hint), "{agent}: {hint} s");
        let slot = slot_ms(*at, hint, 60);
        sixths[(slot / 10_000) as usize] += 1;
        slots.push(slot);
    }
    eprintln!("arrivals per sixth of the minute: {sixths:?}");
    let share = 240 / 6;
    assert!(
        sixths.iter().all(|&n| n * 10 <= share * 16),
        "no sixth of the minute holds more than 1.6 x its share ({share}): {sixths:?}"
    );
    // Each agent keeps its slot: asked again (here, and at another instance), it is told the
    // same phase, to the rounding of a whole second.
    for (i, agent) in agents.iter().enumerate().step_by(12) {
        for g in [&gw, &other] {
            let (status, hint, _, at) = heartbeat(g, agent).await;
            assert_eq!(status, 200, "{agent}");
            let again = slot_ms(at, hint.expect("hint"), 60);
            assert!(
                apart(again, slots[i], 60) <= 1_500,
                "{agent}: slot {again} ms, first {} ms",
                slots[i]
            );
        }
    }
    // A route no [shaping] route names carries no hint; the poll route has its own interval.
    let r = common::client()
        .get(gw.url("/api/dashboard/summary"))
        .send()
        .await
        .expect("request");
    assert!(
        r.headers().get("x-poll-interval").is_none(),
        "{:?}",
        r.headers()
    );
    let r = common::client()
        .get(gw.url("/api/agent/poll"))
        .header("x-agent-id", &agents[0])
        .send()
        .await
        .expect("request");
    let hint: u64 = r.headers()["x-poll-interval"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (15..=45).contains(&hint),
        "the poll route's 30 s interval: {hint}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_agent_is_never_told_to_come_before_its_retry_after() {
    let upstream = common::upstream().await;
    let gw = gateway(&upstream.uri());
    let agent = format!("agent-eager-{:08x}", rand::random::<u32>());
    let mut refused = None;
    for _ in 0..200 {
        let (status, hint, retry, _) = heartbeat(&gw, &agent).await;
        assert!(hint.is_some(), "every answer carries the hint");
        if status == 429 {
            refused = Some((hint.unwrap_or(0), retry.expect("Retry-After")));
            break;
        }
    }
    let (hint, retry) = refused.expect("an agent ignoring its hints meets the budgets as today");
    assert!(
        hint >= retry,
        "X-Poll-Interval {hint} s, Retry-After {retry} s"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_exports_at_once_from_one_address_put_at_most_four_at_the_upstream() {
    let upstream = wiremock::MockServer::start().await;
    wiremock::Mock::given(wiremock::matchers::any())
        .respond_with(
            wiremock::ResponseTemplate::new(200)
                .set_body_string("ok")
                .set_delay(Duration::from_secs(1)),
        )
        .mount(&upstream)
        .await;
    let gw = gateway(&upstream.uri());
    let client = common::client();
    let answers = futures_util::future::join_all((0..20).map(|i| {
        // Each with its own forged X-Forwarded-For: from a peer that is not a trusted proxy it
        // is not read, so all twenty count as one address.
        client
            .get(gw.url(&format!("/api/export/devices-{i}.csv")))
            .header("x-forwarded-for", format!("203.0.113.{}", i + 1))
            .send()
    }))
    .await;
    let statuses: Vec<u16> = answers
        .iter()
        .map(|r| r.as_ref().expect("answered").status().as_u16())
        .collect();
    let served = statuses.iter().filter(|&&s| s == 200).count();
    assert_eq!(served, 4, "{statuses:?}");
    assert!(
        statuses.iter().all(|&s| s == 200 || s == 429),
        "{statuses:?}"
    );
    assert_eq!(
        common::received(&upstream).await,
        4,
        "the upstream saw four"
    );
}

#[test]
fn a_bad_shaped_route_is_refused_at_start_naming_the_file_and_the_field() {
    let out = Launch::command(["check"])
        .config_toml("[shaping.routes.heartbeat]\nroutes = [\"POST /api/agent/heartbeat\"]\ninterval = \"90500ms\"\n")
        .run(Duration::from_secs(30));
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains("shaping.routes.heartbeat.interval")
            && out.stderr.contains("whole number of seconds"),
        "{}",
        out.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_one_redis_tell_an_agent_the_same_slot() {
    let Some(redis) = redis_support::standalone() else {
        return;
    };
    let upstream = common::upstream().await;
    let url = redis.url();
    let launch = || {
        Launch::serve()
            .config_toml(EXAMPLE)
            .upstream(&upstream.uri())
            .args(["--store", url.as_str()])
            .spawn()
    };
    let (a, b) = (launch(), launch());
    for i in 0..20 {
        let agent = format!("agent-shared-{i}-{:08x}", rand::random::<u32>());
        let (sa, ha, _, at_a) = heartbeat(&a, &agent).await;
        let (sb, hb, _, at_b) = heartbeat(&b, &agent).await;
        assert_eq!((sa, sb), (200, 200), "{agent}");
        let (slot_a, slot_b) = (
            slot_ms(at_a, ha.expect("hint"), 60),
            slot_ms(at_b, hb.expect("hint"), 60),
        );
        assert!(
            apart(slot_a, slot_b, 60) <= 1_500,
            "{agent}: {slot_a} ms and {slot_b} ms: slots need no shared state, every instance derives the same"
        );
    }
}

#[tokio::test]
async fn the_decision_endpoint_tells_a_proxys_agent_its_slot_too() {
    let gw = Launch::serve()
        .config_toml(
            "[shaping.routes.heartbeat]\nroutes = [\"POST /api/agent/heartbeat\"]\ninterval = \"60s\"\n",
        )
        .decision_only()
        .env("FLEET_LIMITER_TRUST_PROXY", "127.0.0.1")
        .env("FLEET_LIMITER_DECISION_ALLOW_FROM", "127.0.0.1")
        .spawn();
    let d = gw.decision_addr.expect("decision listener");
    let ask = |uri: &'static str| {
        common::client()
            .get(format!("http://{d}/forward"))
            .header("x-forwarded-method", "POST")
            .header("x-forwarded-uri", uri)
            .header("x-forwarded-for", "192.0.2.71")
            .header("x-agent-id", "agent-behind-nginx")
            .send()
    };
    let r = ask("/api/agent/heartbeat").await.expect("answered");
    assert_eq!(r.status(), 200);
    let hint: u64 = r.headers()["x-poll-interval"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((30..=90).contains(&hint), "{hint}");
    let r = ask("/api/agent/enroll").await.expect("answered");
    assert!(
        r.headers().get("x-poll-interval").is_none(),
        "not a shaped route"
    );
}

/// The upstream answers everything after `delay`.
async fn answer_after(upstream: &wiremock::MockServer, delay: Duration) -> Delay {
    let d = Delay(std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0)));
    d.set(delay);
    wiremock::Mock::given(wiremock::matchers::any())
        .respond_with(d.clone())
        .mount(upstream)
        .await;
    d
}

/// How long the upstream waits before each answer, changed while requests are in flight: one
/// responder reads it per request, so no request ever meets an upstream between two mocks
/// (a `reset` and a new `mount` would answer 404 to whatever arrives in between).
#[derive(Clone)]
struct Delay(std::sync::Arc<std::sync::atomic::AtomicU64>);

impl Delay {
    fn set(&self, delay: Duration) {
        self.0.store(
            delay.as_millis() as u64,
            std::sync::atomic::Ordering::SeqCst,
        );
    }
}

impl wiremock::Respond for Delay {
    fn respond(&self, _: &wiremock::Request) -> wiremock::ResponseTemplate {
        let ms = self.0.load(std::sync::atomic::Ordering::SeqCst);
        wiremock::ResponseTemplate::new(200)
            .set_body_string("ok")
            .set_delay(Duration::from_millis(ms))
    }
}

#[test]
fn check_proves_the_heartbeats_longest_hint_and_refuses_one_past_half_the_timeout() {
    let out = Launch::command(["check"])
        .config_toml(EXAMPLE)
        .run(Duration::from_secs(30));
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(
        out.stdout.contains("POST /api/agent/heartbeat (entry `heartbeat`): hints at most 90s, within 90s (half of fleet.heartbeat_timeout_seconds)")
            && out.stdout.contains("upstream target 250 ms")
            && out.stdout.contains("exports (low, 4 in flight per address)"),
        "{}",
        out.stdout
    );
    let longer = EXAMPLE.replace("max_interval = \"90s\"", "max_interval = \"100s\"");
    let out = Launch::command(["check"])
        .config_toml(&longer)
        .run(Duration::from_secs(30));
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains(
            "shaping.routes.heartbeat.max_interval: hints of up to 100s on the heartbeat route"
        ) && out.stderr.contains("keep the longest hint at most 90s"),
        "{}",
        out.stderr
    );
    // A serve with it is refused at start, naming the same field.
    let out = Launch::serve()
        .config_toml(&longer)
        .upstream("http://127.0.0.1:9")
        .run(Duration::from_secs(30));
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains("shaping.routes.heartbeat.max_interval"),
        "{}",
        out.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cap_per_user_gives_each_analyst_behind_one_address_places_of_their_own() {
    const SECRET: &str = "Vq7Lm2Xp9Rt4Kw8Zc1Nb6Hd3Jf5Gs0Ya-shaping";
    let upstream = wiremock::MockServer::start().await;
    answer_after(&upstream, Duration::from_secs(1)).await;
    let gw = Launch::serve()
        .config_toml(format!(
            "[identity]\njwt_hs256_secret = \"{SECRET}\"\n[shaping.routes.exports]\nroutes = [\"GET /api/export/**\"]\npriority = \"low\"\nmax_in_flight = 2\nin_flight_per = \"user\"\n"
        ))
        .upstream(&upstream.uri())
        .spawn();
    let token = |sub: &str| identity_support::hs256(SECRET, &identity_support::claims(sub));
    let client = common::client();
    // Three analysts behind one address send three exports each, and two requests with no
    // token (and one with a token that does not verify) come from the same address.
    let mut asks = Vec::new();
    for who in ["analyst-a", "analyst-b", "analyst-c"] {
        for i in 0..3 {
            asks.push((
                who.to_owned(),
                client
                    .get(gw.url(&format!("/api/export/{who}-{i}.csv")))
                    .bearer_auth(token(who)),
            ));
        }
    }
    for i in 0..2 {
        asks.push((
            "none".to_owned(),
            client.get(gw.url(&format!("/api/export/anon-{i}.csv"))),
        ));
    }
    asks.push((
        "none".to_owned(),
        client
            .get(gw.url("/api/export/forged.csv"))
            .bearer_auth(format!("{}x", token("analyst-a"))),
    ));
    let answers = futures_util::future::join_all(asks.into_iter().map(|(who, rb)| async move {
        let r = rb.send().await.expect("answered");
        (who, r.status().as_u16())
    }))
    .await;
    let served = |who: &str| {
        answers
            .iter()
            .filter(|(w, s)| w == who && *s == 200)
            .count()
    };
    for who in ["analyst-a", "analyst-b", "analyst-c"] {
        assert_eq!(served(who), 2, "{who}: {answers:?}");
    }
    // Without a token that verifies, the cap counts the address: two places for all three.
    assert_eq!(served("none"), 2, "{answers:?}");
    assert!(
        answers.iter().all(|(_, s)| *s == 200 || *s == 429),
        "{answers:?}"
    );
    assert_eq!(
        common::received(&upstream).await,
        8,
        "the upstream saw eight"
    );
}
