use super::*;
use crate::clock::ManualClock;
use crate::config::Loader;
use crate::identity::NoVerifier;
use crate::store::memory::MemoryStore;

fn facts<'a>(auth: &'a [u8]) -> RequestFacts<'a> {
    RequestFacts {
        peer: "203.0.113.7".parse().unwrap(),
        method: "GET",
        path: CanonicalPath::of_static("/api/reports"),
        forwarded: &[],
        agent_id: None,
        authorization: Some(auth),
        session_token: None,
        key_headers: KeyHeaders::default(),
    }
}

/// In virtual time: an override lifts a refused principal on its next request, and stops
/// applying the second its expiry passes on the decider's wall clock.
#[actix_rt::test]
async fn an_override_applies_at_once_and_expires_in_virtual_time() {
    struct Wall(ManualClock);
    impl crate::overrides::WallClock for Wall {
        fn unix_now(&self) -> u64 {
            use crate::clock::Clock;
            1_796_126_400 + self.0.now() / 1_000_000_000
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("fleet-limiter.toml");
    std::fs::write(
        &file,
        r#"
[limiters.dev]
limit = 2
window = "1h"
key = "ip"
routes = ["/dev/**"]

[[overrides]]
limiter = "dev"
match = "ip:203.0.113.0/24"
limit = 5
window = "1h"
expires = "2026-12-01T12:10:00Z"
"#,
    )
    .unwrap();
    let cfg = Loader::new().file(&file).load().unwrap();
    let clock = ManualClock::new(0);
    let store = Arc::new(MemoryStore::new(1000, Arc::new(clock.clone())));
    let decider = Decider::new(&cfg, store, Arc::new(NoVerifier))
        .with_wall_clock(Arc::new(Wall(clock.clone())));
    let req = |peer: &'static str| RequestFacts {
        peer: peer.parse().unwrap(),
        method: "GET",
        path: CanonicalPath::of_static("/dev/x"),
        forwarded: &[],
        agent_id: None,
        authorization: None,
        session_token: None,
        key_headers: KeyHeaders::default(),
    };
    let limit_of = |o: &Outcome| {
        o.results
            .iter()
            .find(|r| &*r.spec.name == "dev")
            .map(|r| (r.verdict.allowed, r.quota.limit()))
    };
    // Matched: five, from a bucket of its own; unmatched: the limiter's two.
    for _ in 0..5 {
        assert_eq!(
            limit_of(&decider.decide(&req("203.0.113.9")).await),
            Some((true, 5))
        );
    }
    assert_eq!(
        limit_of(&decider.decide(&req("203.0.113.9")).await),
        Some((false, 5))
    );
    for _ in 0..2 {
        assert_eq!(
            limit_of(&decider.decide(&req("198.51.100.1")).await),
            Some((true, 2))
        );
    }
    // Ten virtual minutes on, the override has expired: the address's own bucket, unspent.
    clock.advance(std::time::Duration::from_secs(599));
    assert_eq!(
        limit_of(&decider.decide(&req("203.0.113.9")).await),
        Some((false, 5))
    );
    clock.advance(std::time::Duration::from_secs(1));
    assert_eq!(
        limit_of(&decider.decide(&req("203.0.113.9")).await),
        Some((true, 2))
    );
}

/// Explaining any requests, in any order, leaves every bucket and the known agents as they
/// were, while the same requests decided change them.
#[test]
fn explain_changes_no_bucket() {
    use proptest::prelude::*;
    let routes = [
        ("GET", "/api/agent/tasks"),
        ("POST", "/api/agent/heartbeat"),
        ("POST", "/api/agent/enroll"),
        ("GET", "/api/reports"),
        ("POST", "/api/auth/cli/token"),
    ];
    let runner = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    proptest!(ProptestConfig::with_cases(48), |(
        seq in proptest::collection::vec((0usize..5, 0u8..4, 0u8..3, 0u8..3, 0u64..90), 1..30)
    )| {
        runner.block_on(async {
            let clock = ManualClock::new(3_600_000_000_000);
            let store = Arc::new(MemoryStore::new(10_000, Arc::new(clock.clone())));
            let decider = Decider::new(&Config::default(), store.clone(), Arc::new(NoVerifier));
            let settings = decider.settings();
            let agents = [None, Some("agent-a"), Some("agent-b"), Some("agent-c")];
            let peers = ["203.0.113.7", "198.51.100.9", "2001:db8::1"];
            let auths: [Option<&[u8]>; 3] = [None, Some(b"Bearer pa_key-1"), Some(b"Bearer cli-token")];
            let fact = |r: usize, a: u8, p: u8, c: u8| RequestFacts {
                peer: peers[p as usize].parse().unwrap(),
                method: routes[r].0,
                path: CanonicalPath::of_static(routes[r].1),
                forwarded: &[],
                agent_id: agents[a as usize].map(str::as_bytes),
                authorization: auths[c as usize],
                session_token: None,
                key_headers: KeyHeaders::default(),
            };
            let state = || {
                let mut b = store.kept_buckets().map(|(_, v)| v).unwrap_or_default();
                b.sort_by_key(|e| e.digest);
                (format!("{b:?}"), decider.known_agents().counts())
            };
            // Some real traffic first, so there are buckets to leave alone.
            for &(r, a, p, c, dt) in seq.iter().take(seq.len() / 2) {
                clock.advance(std::time::Duration::from_secs(dt));
                let _ = decider.decide_with(&settings, &fact(r, a, p, c)).await;
            }
            let before = state();
            for &(r, a, p, c, dt) in &seq {
                clock.advance(std::time::Duration::from_millis(dt));
                let (outcome, explained) = decider.explain(&settings, &fact(r, a, p, c)).await;
                assert_eq!(outcome.results.len(), explained.len());
            }
            let after = state();
            assert_eq!(before.0, after.0, "explain changed a bucket");
            assert_eq!(format!("{:?}", before.1), format!("{:?}", after.1));
        });
    });
}

#[actix_rt::test]
async fn give_backs_beyond_the_cap_are_dropped_and_counted() {
    let cfg = Loader::new()
        .env([(
            "FLEET_LIMITER_LIMITER_API_KEY_COUNT".to_owned(),
            "failed".to_owned(),
        )])
        .load()
        .unwrap();
    let store = Arc::new(MemoryStore::new(1000, Arc::new(ManualClock::new(1))));
    let d = Decider::new(&cfg, store, Arc::new(NoVerifier));
    let settings = d.settings();
    let outcome = d.decide(&facts(b"Bearer pa_valid")).await;
    assert!(!outcome.refused());
    let since = std::time::Duration::ZERO;
    assert!(
        d.give_back(&settings, &outcome, 401, || since).is_none(),
        "a failure counts"
    );
    // Work handed out but not yet run holds its place.
    let held: Vec<_> = (0..MAX_GIVE_BACKS_IN_FLIGHT)
        .map(|_| {
            d.give_back(&settings, &outcome, 200, || since)
                .expect("under the cap")
        })
        .collect();
    assert!(
        d.give_back(&settings, &outcome, 200, || since).is_none(),
        "over the cap"
    );
    let page = d.metrics().render();
    assert!(
        page.contains(r#"fleet_limiter_give_backs_total{limiter="api-key",result="dropped"} 1"#),
        "{page}"
    );
    // Dropped unfinished, the work frees its place; run to the end, it is counted done.
    drop(held);
    let work = d
        .give_back(&settings, &outcome, 200, || since)
        .expect("room again");
    work.await;
    let page = d.metrics().render();
    assert!(
        page.contains(r#"fleet_limiter_give_backs_total{limiter="api-key",result="done"} 1"#),
        "{page}"
    );
}

/// A store that never answers, with local buckets for `on_store_error = "local"`.
struct Down {
    local: MemoryStore,
}

impl Store for Down {
    fn decide<'a>(
        &'a self,
        _: &'a [Check],
    ) -> futures_util::future::BoxFuture<'a, Result<Vec<Verdict>, StoreError>> {
        Box::pin(async {
            Err(StoreError::new(
                crate::store::StoreErrorKind::Connection,
                "down",
            ))
        })
    }
    fn give_back<'a>(
        &'a self,
        _: &'a [GiveBack],
    ) -> futures_util::future::BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async { panic!("nothing the shared store counted is given back") })
    }
    fn kind(&self) -> &'static str {
        "down"
    }
    fn tracked_keys(&self) -> u64 {
        0
    }
    fn decide_locally<'a>(
        &'a self,
        checks: &'a [Check],
    ) -> Option<futures_util::future::BoxFuture<'a, Result<Vec<Verdict>, StoreError>>> {
        Some(self.local.decide(checks))
    }
    fn give_back_locally<'a>(
        &'a self,
        items: &'a [GiveBack],
    ) -> futures_util::future::BoxFuture<'a, Result<(), StoreError>> {
        self.local.give_back(items)
    }
}

fn down_decider(env: &[(&str, &str)]) -> (Decider, ManualClock) {
    let cfg = Loader::new()
        .env(env.iter().map(|(k, v)| (k.to_string(), v.to_string())))
        .load()
        .unwrap();
    let clock = ManualClock::new(1);
    let local = MemoryStore::new(1000, Arc::new(clock.clone()));
    (
        Decider::new(&cfg, Arc::new(Down { local }), Arc::new(NoVerifier)),
        clock,
    )
}

fn result<'o>(o: &'o Outcome, name: &str) -> &'o LimitResult {
    o.results.iter().find(|r| &*r.spec.name == name).unwrap()
}

#[actix_rt::test]
async fn a_local_limiter_counts_on_the_instance_while_the_store_is_down() {
    let (d, clock) = down_decider(&[
        ("FLEET_LIMITER_LIMITER_CLI_BEARER_LIMIT", "3"),
        ("FLEET_LIMITER_LIMITER_CLI_BEARER_ON_STORE_ERROR", "local"),
    ]);
    let observed = |o: &Outcome| d.observe(&d.settings(), o, std::time::Duration::ZERO);
    for left in [2, 1, 0] {
        let o = d.decide(&facts(b"Bearer cli-token")).await;
        observed(&o);
        let r = result(&o, "cli-bearer");
        assert!(r.local && !r.store_error && r.verdict.allowed, "{r:?}");
        assert_eq!(r.verdict.remaining, left);
        // Its neighbour keeps its own answer (allow), counting nothing.
        let ui = result(&o, "ui");
        assert!(ui.store_error && !ui.local && ui.verdict.allowed);
        assert!(
            o.store_error.is_some(),
            "the store's failure is still reported"
        );
    }
    let o = d.decide(&facts(b"Bearer cli-token")).await;
    observed(&o);
    assert!(o.refused(), "the instance's own budget is spent");
    let r = result(&o, "cli-bearer");
    assert!(r.local && !r.verdict.allowed);
    assert_eq!(
        o.retry_after_secs(),
        Some(20),
        "one token every 20 s, from the bucket"
    );
    let page = d.metrics().render();
    for (fate, n) in [("local_allowed", 3), ("local_refused", 1)] {
        let line = format!(
            r#"fleet_limiter_decisions_total{{limiter="cli-bearer",outcome="{fate}"}} {n}"#
        );
        assert!(page.contains(&line), "{line}\n{page}");
    }
    // The bucket refills on the local clock.
    clock.advance(std::time::Duration::from_secs(20));
    let o = d.decide(&facts(b"Bearer cli-token")).await;
    assert!(!o.refused());
}

#[actix_rt::test]
async fn a_deny_limiter_refusing_too_leaves_the_local_buckets_untouched() {
    let (d, _) = down_decider(&[
        ("FLEET_LIMITER_LIMITER_CLI_BEARER_LIMIT", "2"),
        ("FLEET_LIMITER_LIMITER_CLI_BEARER_ON_STORE_ERROR", "local"),
        ("FLEET_LIMITER_LIMITER_UI_ON_STORE_ERROR", "deny"),
    ]);
    for _ in 0..5 {
        let o = d.decide(&facts(b"Bearer cli-token")).await;
        assert!(o.refused(), "ui denies while the store is down");
        let r = result(&o, "cli-bearer");
        assert!(!r.local && r.store_error, "{r:?}");
    }
    // Nothing was counted locally: with ui allowing, the whole local budget is there.
    let (d, _) = down_decider(&[
        ("FLEET_LIMITER_LIMITER_CLI_BEARER_LIMIT", "2"),
        ("FLEET_LIMITER_LIMITER_CLI_BEARER_ON_STORE_ERROR", "local"),
    ]);
    let o = d.decide(&facts(b"Bearer cli-token")).await;
    assert_eq!(result(&o, "cli-bearer").verdict.remaining, 1);
}

#[actix_rt::test]
async fn a_local_count_is_given_back_on_the_local_bucket() {
    let (d, _) = down_decider(&[
        ("FLEET_LIMITER_LIMITER_API_KEY_COUNT", "failed"),
        ("FLEET_LIMITER_LIMITER_API_KEY_LIMIT", "2"),
        ("FLEET_LIMITER_LIMITER_API_KEY_ON_STORE_ERROR", "local"),
    ]);
    let settings = d.settings();
    for _ in 0..4 {
        let o = d.decide(&facts(b"Bearer pa_valid")).await;
        let r = result(&o, "api-key");
        assert!(
            r.local && r.verdict.allowed,
            "a success is given back: {r:?}"
        );
        d.give_back(&settings, &o, 200, || std::time::Duration::ZERO)
            .expect("a give-back")
            .await;
    }
    let page = d.metrics().render();
    assert!(
        page.contains(r#"fleet_limiter_give_backs_total{limiter="api-key",result="done"} 4"#),
        "{page}"
    );
}

#[actix_rt::test]
async fn a_refused_request_reports_the_other_buckets_as_they_stand() {
    let cfg = Loader::new()
        .env([(
            "FLEET_LIMITER_LIMITER_CLI_BEARER_LIMIT".to_owned(),
            "1".to_owned(),
        )])
        .load()
        .unwrap();
    let store = Arc::new(MemoryStore::new(1000, Arc::new(ManualClock::new(1))));
    let d = Decider::new(&cfg, store, Arc::new(NoVerifier));
    let first = d.decide(&facts(b"Bearer cli-token")).await;
    assert!(!first.refused());
    let ui = |o: &Outcome| {
        o.results
            .iter()
            .find(|r| &*r.spec.name == "ui")
            .map(|r| r.verdict)
            .unwrap()
    };
    assert_eq!(ui(&first).remaining, 999);
    let second = d.decide(&facts(b"Bearer cli-token")).await;
    assert!(second.refused(), "cli-bearer allows one a minute");
    assert_eq!(
        ui(&second).remaining,
        999,
        "the refused request charged ui nothing"
    );
    assert_eq!(ui(&second).reset_after_ns, 900_000_000);
    let third = d.decide(&facts(b"Basic x")).await;
    assert_eq!(
        ui(&third).remaining,
        998,
        "the store agrees: only one was charged"
    );
}
