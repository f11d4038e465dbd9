//! The Redis store against real redis-server processes (standalone and a three-master Cluster)
//! and real gateway processes. Skipped without redis-server, failed instead when `CI` is set.

mod common;
mod redis_support;

use common::{Gateway, Launch};
use fleet_limiter::nonzero;
use fleet_limiter::BucketKey;
use fleet_limiter::ManualClock;
use fleet_limiter::MemoryStore;
use fleet_limiter::{Algorithm, Quota, Verdict};
use fleet_limiter::{Check, GiveBack, Store, StoreErrorKind};
use fleet_limiter::{RedisOptions, RedisStore, RedisTarget};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redis_support::gateway;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A name no other test (or earlier run on a shared Redis) uses.
fn unique(prefix: &str) -> String {
    format!("{prefix}-{:08x}", rand::random::<u32>())
}

/// A store on virtual time: the script takes the clock's time as an argument.
fn virtual_store(
    target: RedisTarget,
    clock: &ManualClock,
    cache: usize,
    calls_in_flight: usize,
) -> RedisStore {
    let mut o = RedisOptions::new(Duration::from_secs(5));
    o.calls_in_flight = calls_in_flight;
    o.clock = Arc::new(clock.clone());
    o.time_from_clock = true;
    o.cache_capacity = cache;
    // Virtual time runs ahead of real time; keep keys long enough that expiry never decides.
    o.ttl_pad = Duration::from_secs(3600);
    connected(target, o)
}

/// A store on `target`, once it has connected.
fn connected(target: RedisTarget, options: RedisOptions) -> RedisStore {
    let s = RedisStore::new(target, options).expect("store");
    assert!(
        s.wait_connected(Duration::from_secs(10)),
        "connect to Redis"
    );
    s
}

/// A plain connection to the Redis at `url`, for looking at what the store wrote.
async fn connection(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .expect("client")
        .get_multiplexed_async_connection()
        .await
        .expect("connect")
}

/// The milliseconds `key` has left to live (`PTTL`).
async fn ttl_ms(con: &mut redis::aio::MultiplexedConnection, key: &str) -> i64 {
    redis::cmd("PTTL")
        .arg(key)
        .query_async(con)
        .await
        .expect("PTTL")
}

/// A limiter of the parity run: its name, its quota, whether it is a shadow.
type ParityLimiter = (Arc<str>, Quota, bool);

/// The parity run's limiters, named after `run`: GCRA, fixed windows, shadows and lockouts.
fn parity_quotas(run: &str) -> Vec<ParityLimiter> {
    let lim = |n: &str| -> Arc<str> { Arc::from(format!("{run}-{n}")) };
    vec![
        (
            lim("g1"),
            Quota::gcra(nonzero(3), Duration::from_secs(10)),
            false,
        ),
        (
            lim("g2"),
            Quota::gcra(nonzero(5), Duration::from_secs(60)),
            false,
        ),
        (
            lim("g3"),
            Quota::gcra(nonzero(7), Duration::from_secs(60)),
            false,
        ),
        (
            lim("f1"),
            Quota::new(nonzero(3), Duration::from_secs(10), Algorithm::FixedWindow),
            false,
        ),
        (
            lim("f2"),
            Quota::new(nonzero(4), Duration::from_secs(30), Algorithm::FixedWindow),
            false,
        ),
        (
            lim("s1"),
            Quota::gcra(nonzero(2), Duration::from_secs(20)),
            true,
        ),
        (
            lim("s2"),
            Quota::new(nonzero(1), Duration::from_secs(15), Algorithm::FixedWindow),
            true,
        ),
        // Lockouts: the first refusal locks the key, whichever algorithm counts.
        (
            lim("l1"),
            Quota::gcra(nonzero(3), Duration::from_secs(10))
                .with_lockout(Some(Duration::from_secs(20))),
            false,
        ),
        (
            lim("l2"),
            Quota::new(nonzero(2), Duration::from_secs(10), Algorithm::FixedWindow)
                .with_lockout(Some(Duration::from_millis(15_500))),
            false,
        ),
        (
            lim("l3"),
            Quota::gcra(nonzero(2), Duration::from_secs(10))
                .with_lockout(Some(Duration::from_secs(5))),
            true,
        ),
    ]
}

/// What the parity run's requests were, counted as they are decided.
#[derive(Default)]
struct Tally {
    refused: usize,
    shadow_refused: usize,
    multi: usize,
    twice: usize,
    costly: usize,
    given_back: usize,
    /// Refusals by a limiter with a lockout: the one that locks (its wait the whole lockout),
    /// and those while locked.
    locking: usize,
    while_locked: usize,
}

/// One step's requests, between 1 and `together` of them, each 1 to 3 random checks (one in ten
/// with its first key twice).
fn random_group(
    rng: &mut StdRng,
    quotas: &[ParityLimiter],
    principals: &[&str],
    together: usize,
    tally: &mut Tally,
) -> Vec<Vec<Check>> {
    let mut group = Vec::new();
    for _ in 0..rng.gen_range(1..=together) {
        let n = rng.gen_range(1..=3);
        let mut checks: Vec<Check> = (0..n)
            .map(|_| {
                let (name, quota, shadow) = &quotas[rng.gen_range(0..quotas.len())];
                Check {
                    key: BucketKey::new(
                        name.clone(),
                        principals[rng.gen_range(0..principals.len())],
                    ),
                    quota: *quota,
                    shadow: *shadow,
                    units: if rng.gen_bool(0.3) {
                        fleet_limiter::nonzero(rng.gen_range(1..=quota.limit()))
                    } else {
                        std::num::NonZeroU32::MIN
                    },
                }
            })
            .collect();
        if rng.gen_bool(0.1) {
            checks.push(checks[0].clone());
            tally.twice += 1;
        }
        group.push(checks);
    }
    group
}

impl Tally {
    /// One request's verdicts counted; some admitted ones chosen to be given back (into
    /// `backs`).
    fn count(
        &mut self,
        checks: &[Check],
        want: &[Verdict],
        rng: &mut StdRng,
        backs: &mut Vec<Vec<GiveBack>>,
    ) {
        self.multi += usize::from(checks.len() > 1);
        self.costly += checks.iter().filter(|c| c.units.get() > 1).count();
        // Some admitted requests are given back, as an answer that should not count would
        // be, a random part of the way into their charge (after the whole group is decided,
        // as Redis decided it): both stores must agree after.
        if want.iter().zip(checks).all(|(v, c)| v.allowed || c.shadow) && rng.gen_bool(0.2) {
            let back: Vec<GiveBack> = checks
                .iter()
                .zip(want)
                .filter(|(_, v)| v.allowed)
                .map(|(c, v)| GiveBack {
                    key: c.key.clone(),
                    quota: c.quota,
                    units: c.units,
                    outstanding_ns: v.reset_after_ns - v.reset_after_ns / rng.gen_range(1..=4),
                })
                .collect();
            self.given_back += back.len();
            backs.push(back);
        }
        for (c, v) in checks.iter().zip(want) {
            if let (false, Some(l)) = (v.allowed, c.quota.lockout_ns()) {
                if v.retry_after_ns == l {
                    self.locking += 1;
                } else {
                    self.while_locked += 1;
                }
            }
            if !v.allowed {
                if c.shadow {
                    self.shadow_refused += 1;
                } else {
                    self.refused += 1;
                }
            }
        }
    }

    /// The sequence tried every kind of request enough.
    fn assert_enough(&self) {
        let Tally {
            refused,
            shadow_refused,
            multi,
            twice,
            costly,
            given_back,
            locking,
            while_locked,
        } = *self;
        assert!(refused > 150, "the sequence refused enough ({refused})");
        assert!(
            costly > 500 && given_back > 300,
            "costs ({costly}), give-backs ({given_back})"
        );
        assert!(shadow_refused > 50, "shadow refusals ({shadow_refused})");
        assert!(
            locking > 30 && while_locked > 100,
            "locks started ({locking}) and held ({while_locked})"
        );
        assert!(
            multi > 1000 && twice > 100,
            "multi-key requests ({multi}, same key twice {twice})"
        );
    }
}

/// Feed the memory store and the Redis store one random sequence; compare every verdict.
/// Up to `together` requests at a time go to Redis concurrently (their order is the order they
/// are polled in), to the memory store one after the other. Returns how many requests needed a
/// cross-slot refund, and how many script calls were sent.
async fn parity(target: RedisTarget, together: usize) -> (u64, u64) {
    let run = unique("p");
    let quotas = parity_quotas(&run);
    let principals = ["a", "b"];
    let clock = ManualClock::new(1_700_000_000_123_456_789);
    let memory = MemoryStore::new(100_000, Arc::new(clock.clone()));
    // Several calls out at once must keep the order too.
    let redis = virtual_store(target, &clock, 0, together.min(3));
    let steps_ns = [
        0,
        0,
        0,
        0,
        0,
        1_000_000,
        50_000_000,
        333_333_333,
        1_000_000_000,
        2_500_000_000,
        7_000_000_000,
        31_000_000_000,
    ];
    let mut rng = StdRng::seed_from_u64(7);
    let mut tally = Tally::default();
    let mut step = 0;
    while step < 3000 {
        clock.advance(Duration::from_nanos(
            steps_ns[rng.gen_range(0..steps_ns.len())],
        ));
        let group = random_group(&mut rng, &quotas, &principals, together, &mut tally);
        let got = futures_util::future::join_all(group.iter().map(|c| redis.decide(c))).await;
        let mut backs: Vec<Vec<GiveBack>> = Vec::new();
        for (checks, got) in group.iter().zip(got) {
            let want = memory.decide(checks).await.expect("memory decides");
            assert_eq!(got.expect("redis decides"), want, "step {step}: {checks:?}");
            tally.count(checks, &want, &mut rng, &mut backs);
            step += 1;
        }
        for back in &backs {
            memory.give_back(back).await.expect("memory gives back");
            redis.give_back(back).await.expect("redis gives back");
        }
    }
    let Tally {
        refused,
        shadow_refused,
        multi,
        twice,
        costly,
        given_back,
        locking,
        while_locked,
    } = tally;
    eprintln!(
        "refused {refused}, shadow refused {shadow_refused}, multi-key {multi}, same key twice {twice}, costly {costly}, given back {given_back}, locks {locking} (refused while locked {while_locked}), {} calls",
        redis.round_trips()
    );
    tally.assert_enough();
    assert_eq!(redis.errors(), 0);
    (redis.refunds(), redis.round_trips())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lua_and_memory_agree_decision_by_decision() {
    let Some(redis) = redis_support::standalone() else {
        return;
    };
    let (refunds, calls) = parity(RedisTarget::Standalone(redis.url()), 1).await;
    assert_eq!(refunds, 0, "one script, no refunds");
    assert_eq!(calls, 3000, "one call per request");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_sharing_calls_are_decided_in_arrival_order() {
    let Some(redis) = redis_support::standalone() else {
        return;
    };
    let (refunds, calls) = parity(RedisTarget::Standalone(redis.url()), 8).await;
    assert_eq!(refunds, 0);
    assert!(calls < 3000, "requests shared calls ({calls} for 3000)");
}

/// Every request of `requests` sent at once (in order) while `server` is frozen; Redis answers
/// again 300 ms later. Returns each request's answer.
async fn decide_while_frozen(
    server: &redis_support::RedisServer,
    store: &RedisStore,
    requests: &[&[Check]],
) -> Vec<Result<Vec<fleet_limiter::Verdict>, fleet_limiter::StoreError>> {
    server.pause();
    let all = futures_util::future::join_all(requests.iter().map(|c| store.decide(c)));
    let resume = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        server.resume();
    };
    tokio::join!(all, resume).0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_beyond_the_waiting_cap_fail_at_once() {
    let Some(server) = redis_support::own_server() else {
        return;
    };
    let store = connected(
        RedisTarget::Standalone(server.url()),
        RedisOptions::new(Duration::from_secs(10)),
    );
    let lim = unique("cap");
    let n = RedisStore::MAX_WAITING + 200;
    let checks: Vec<[Check; 1]> = (0..n)
        .map(|i| {
            [check(
                &lim,
                &format!("p{i}"),
                Quota::gcra(nonzero(10), Duration::from_secs(60)),
            )]
        })
        .collect();
    let requests: Vec<&[Check]> = checks.iter().map(|c| c.as_slice()).collect();
    let answers = decide_while_frozen(&server, &store, &requests).await;
    let refused: Vec<String> = answers
        .iter()
        .filter_map(|a| a.as_ref().err().map(|e| e.to_string()))
        .collect();
    // One call took the first requests out of the queue before Redis froze (and, when that
    // call was full, the batching loop holds the next request aside for the following call);
    // the queue then filled up, and everything after it was turned away at once.
    assert!(
        (200 - RedisStore::MAX_CALL_CHECKS - 1..=200).contains(&refused.len()),
        "{} refused",
        refused.len()
    );
    assert!(
        refused.iter().all(|e| e.contains("already wait")),
        "{:?}",
        refused.first()
    );
    assert!(answers
        .iter()
        .filter_map(|a| a.as_ref().err())
        .all(|e| e.kind() == StoreErrorKind::Overload));
    assert_eq!(store.errors(), refused.len() as u64);
    assert_eq!(
        errors_of(&store, StoreErrorKind::Overload),
        refused.len() as u64
    );
    assert!(answers.iter().filter(|a| a.is_ok()).count() >= RedisStore::MAX_WAITING);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_waiting_for_redis_share_one_call() {
    let Some(server) = redis_support::own_server() else {
        return;
    };
    let options = RedisOptions::new(Duration::from_secs(5));
    let in_flight = options.calls_in_flight as u64;
    assert_eq!(in_flight, 1, "the default");
    let store = connected(RedisTarget::Standalone(server.url()), options);
    let c = [check(
        &unique("share"),
        "x",
        Quota::gcra(nonzero(10), Duration::from_secs(3600)),
    )];
    // Redis stops answering: the first call waits, every later request queues behind it.
    let answers = decide_while_frozen(&server, &store, &[&c[..]; 40]).await;
    let remaining: Vec<Option<u32>> = answers
        .into_iter()
        .map(|a| {
            let v = a.expect("decided once Redis answers");
            v[0].allowed.then_some(v[0].remaining)
        })
        .collect();
    let want: Vec<Option<u32>> = (0..40).map(|i| (i < 10).then(|| 9 - i)).collect();
    assert_eq!(remaining, want, "exactly the budget, in arrival order");
    assert!(
        store.round_trips() <= in_flight + 1,
        "40 requests took {} calls",
        store.round_trips()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lua_and_memory_agree_on_a_cluster_across_slots() {
    let Some(cluster) = redis_support::cluster() else {
        return;
    };
    let (refunds, _) = parity(RedisTarget::Cluster(cluster.urls()), 1).await;
    assert!(
        refunds > 20,
        "refusals on one slot gave back other slots' units ({refunds})"
    );
}

fn check(limiter: &str, principal: &str, quota: Quota) -> Check {
    Check {
        key: BucketKey::new(Arc::from(limiter), principal),
        quota,
        shadow: false,
        units: std::num::NonZeroU32::MIN,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_is_stored_under_the_bucket_with_an_expiry_at_its_end() {
    let Some(server) = redis_support::standalone() else {
        return;
    };
    let store = connected(
        RedisTarget::Standalone(server.url()),
        RedisOptions::new(Duration::from_secs(5)),
    );
    let lim = unique("lock");
    let c = check(
        &lim,
        "user@example.com",
        Quota::gcra(nonzero(2), Duration::from_secs(600))
            .with_lockout(Some(Duration::from_secs(90))),
    );
    let one = std::slice::from_ref(&c);
    for _ in 0..2 {
        assert!(store.decide(one).await.expect("decide")[0].allowed);
    }
    let v = store.decide(one).await.expect("decide");
    assert!(!v[0].allowed);
    assert_eq!(v[0].retry_after_ns, 90_000_000_000, "the whole lockout");
    let mut con = connection(&server.url()).await;
    let name = RedisStore::key_name(&c.key);
    assert!(!name.contains("example"), "only digests reach Redis");
    let value: String = redis::cmd("GET")
        .arg(&name)
        .query_async(&mut con)
        .await
        .expect("GET");
    assert!(value.ends_with(" L"), "{value}");
    let ttl = ttl_ms(&mut con, &name).await;
    assert!(
        (85_000..=91_000).contains(&ttl),
        "expires at the lock's end: {ttl} ms"
    );
    // A second store (another gateway, or this one restarted) reads the same lock.
    let other = connected(
        RedisTarget::Standalone(server.url()),
        RedisOptions::new(Duration::from_secs(5)),
    );
    let v = other.decide(one).await.expect("decide");
    assert!(!v[0].allowed);
    assert!(
        v[0].retry_after_ns <= 90_000_000_000 && v[0].retry_after_ns > 80_000_000_000,
        "{:?}",
        v[0]
    );
    // A give-back never loosens a lock.
    other
        .give_back(&[GiveBack {
            key: c.key.clone(),
            quota: c.quota,
            units: std::num::NonZeroU32::MIN,
            outstanding_ns: 600_000_000_000,
        }])
        .await
        .expect("give back");
    let after: String = redis::cmd("GET")
        .arg(&name)
        .query_async(&mut con)
        .await
        .expect("GET");
    assert_eq!(after, value);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_hold_digests_and_expire_when_full_again_and_scripts_reload() {
    let Some(server) = redis_support::standalone() else {
        return;
    };
    let store = connected(
        RedisTarget::Standalone(server.url()),
        RedisOptions::new(Duration::from_secs(5)),
    );
    let lim = unique("ttl");
    let gcra = check(
        &lim,
        "10.0.0.1",
        Quota::gcra(nonzero(10), Duration::from_secs(10)),
    );
    let fixed = check(
        &format!("{lim}-fw"),
        "10.0.0.1",
        Quota::new(nonzero(3), Duration::from_secs(5), Algorithm::FixedWindow),
    );
    let v = store
        .decide(&[gcra.clone(), fixed.clone()])
        .await
        .expect("decide");
    assert!(v.iter().all(|v| v.allowed));

    let mut con = connection(&server.url()).await;
    let name = RedisStore::key_name(&gcra.key);
    assert_eq!(name, format!("fl:{{{lim}:{}}}", gcra.key.digest_hex()));
    let value: String = redis::cmd("GET")
        .arg(&name)
        .query_async(&mut con)
        .await
        .expect("GET");
    assert!(!value.contains("10.0.0.1"));
    let pttl = ttl_ms(&mut con, &name).await;
    assert!(
        pttl > 0 && pttl <= 1_001,
        "GCRA key lives until one token is back: {pttl} ms"
    );
    let pttl = ttl_ms(&mut con, &RedisStore::key_name(&fixed.key)).await;
    assert!(
        pttl > 0 && pttl <= 5_001,
        "fixed-window key lives until the window ends: {pttl} ms"
    );

    // The server forgets its scripts (a restart, a failover): the store loads them again.
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut con)
        .await
        .expect("flush");
    let v = store
        .decide(std::slice::from_ref(&gcra))
        .await
        .expect("decide after NOSCRIPT");
    assert_eq!(v[0].remaining, 8);
    assert_eq!(store.round_trips(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_requests_are_answered_locally_until_the_refusal_ends() {
    let Some(server) = redis_support::standalone() else {
        return;
    };
    let clock = ManualClock::new(5_000_000_000_000);
    let cached = virtual_store(RedisTarget::Standalone(server.url()), &clock, 1000, 1);
    let clock2 = clock.clone();
    let memory = MemoryStore::new(1000, Arc::new(clock2));
    let lim = unique("hot");
    let c = [
        check(&lim, "x", Quota::gcra(nonzero(2), Duration::from_secs(60))),
        check(
            &format!("{lim}-wide"),
            "x",
            Quota::gcra(nonzero(100), Duration::from_secs(60)),
        ),
    ];
    // Two pass, the third is refused by Redis and remembered.
    for _ in 0..3 {
        assert_eq!(
            cached.decide(&c).await.expect("decide"),
            memory.decide(&c).await.expect("memory")
        );
    }
    let trips = cached.round_trips();
    assert_eq!(trips, 3);
    for i in 0..50 {
        clock.advance(Duration::from_millis(100));
        let got = cached.decide(&c).await.expect("decide");
        let want = memory.decide(&c).await.expect("memory");
        assert!(!got[0].allowed);
        assert_eq!(
            got[0], want[0],
            "request {i}: the refusal and its wait are exact"
        );
        // The other limiter is reported as it stood at the refusal (it refills meanwhile).
        assert_eq!(got[1].remaining, 97);
        assert!(want[1].remaining >= 97);
    }
    assert_eq!(
        cached.round_trips(),
        trips,
        "hammering a refused key costs Redis nothing"
    );
    assert_eq!(cached.cache_hits(), 50);
    // The wait ends: Redis decides again, and allows.
    clock.advance(Duration::from_secs(30));
    let got = cached.decide(&c).await.expect("decide");
    assert_eq!(got, memory.decide(&c).await.expect("memory"));
    assert!(got[0].allowed);
    assert_eq!(cached.round_trips(), trips + 1);
}

/// docs/redis.md: while Redis is down, a refusal the instance remembers still answers `429`
/// with its exact wait, without asking Redis, until that wait ends; then the store fails and
/// `on_store_error` answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remembered_refusals_still_answer_while_redis_is_down() {
    let Some(mut server) = redis_support::own_server() else {
        return;
    };
    let clock = ManualClock::new(5_000_000_000_000);
    let cached = virtual_store(RedisTarget::Standalone(server.url()), &clock, 1000, 1);
    let memory = MemoryStore::new(1000, Arc::new(clock.clone()));
    let lim = unique("down");
    let c = [check(
        &lim,
        "x",
        Quota::gcra(nonzero(2), Duration::from_secs(60)),
    )];
    for _ in 0..3 {
        assert_eq!(
            cached.decide(&c).await.expect("decide"),
            memory.decide(&c).await.expect("memory")
        );
    }
    server.stop();
    for i in 0..5 {
        clock.advance(Duration::from_secs(5));
        let got = cached
            .decide(&c)
            .await
            .unwrap_or_else(|e| panic!("request {i}: the remembered refusal answers: {e}"));
        let want = memory.decide(&c).await.expect("memory");
        assert!(!got[0].allowed, "request {i}");
        assert_eq!(
            got[0], want[0],
            "request {i}: the refusal and its wait are exact"
        );
    }
    // The wait ends: the store is asked, and fails.
    clock.advance(Duration::from_secs(30));
    assert!(cached.decide(&c).await.is_err(), "Redis is down");
}

fn probe_config(store: &str, a: &str, b: &str) -> String {
    format!(
        r#"
{store}

[limiters.{a}]
limit = 5
window = "1h"
key = "ip"
routes = ["/probe/**"]

[limiters.{b}]
limit = 8
window = "1h"
key = "ip+agent"
algorithm = "fixed-window"
routes = ["/probe/**"]
"#
    )
}

struct Answer {
    status: u16,
    retry_after: Option<u64>,
    remaining: Option<u32>,
    ratelimit: String,
}

async fn get(client: &reqwest::Client, url: &str, agent: &str) -> Answer {
    let r = client
        .get(url)
        .header("x-agent-id", agent)
        .send()
        .await
        .expect("the gateway answers");
    let h = |n: &str| {
        r.headers()
            .get(n)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    Answer {
        status: r.status().as_u16(),
        retry_after: h("retry-after").and_then(|v| v.parse().ok()),
        remaining: h("x-ratelimit-remaining").and_then(|v| v.parse().ok()),
        ratelimit: h("ratelimit").unwrap_or_default(),
    }
}

/// The statuses of `n` requests in a row from one agent.
async fn statuses(client: &reqwest::Client, url: &str, agent: &str, n: usize) -> Vec<u16> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(get(client, url, agent).await.status);
    }
    out
}

/// Send `GET url` as agent `agent(n)` on the n-th try (from 1), every 50 ms, until `done` holds
/// for its status; fail with `what` and the gateway's log after 15 s.
async fn poll_until(
    client: &reqwest::Client,
    gw: &Gateway,
    url: &str,
    agent: impl Fn(u32) -> String,
    done: impl Fn(u16) -> bool,
    what: &str,
) {
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut n = 0;
    loop {
        n += 1;
        if done(get(client, url, &agent(n)).await.status) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}:\n{}", gw.stderr());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Three gateways on one store: exactly `limit` requests pass in total, and they agree on Retry-After.
async fn three_gateways_share_one_budget(
    store_toml: &str,
    args: &[&str],
    envs: &[(&str, &str)],
    concurrent: bool,
) {
    let (a, b) = (unique("probe-a"), unique("probe-b"));
    let config = probe_config(store_toml, &a, &b);
    let up = redis_support::upstream();
    let gateways: Vec<Gateway> = (0..3).map(|_| gateway(&config, &up, args, envs)).collect();
    let client = reqwest::Client::new();
    let urls: Vec<String> = (0..30)
        .map(|i| gateways[i % 3].url(&format!("/probe/{i}")))
        .collect();
    let answers: Vec<Answer> = if concurrent {
        futures_util::future::join_all(urls.iter().map(|u| get(&client, u, "agent-1"))).await
    } else {
        let mut out = Vec::new();
        for u in &urls {
            out.push(get(&client, u, "agent-1").await);
        }
        out
    };
    let logs = || {
        gateways
            .iter()
            .map(Gateway::stderr)
            .collect::<Vec<_>>()
            .join("\n")
    };
    let ok: Vec<&Answer> = answers.iter().filter(|x| x.status == 200).collect();
    let refused: Vec<&Answer> = answers.iter().filter(|x| x.status == 429).collect();
    assert_eq!(
        ok.len(),
        5,
        "exactly the limit passes across instances; logs:\n{}",
        logs()
    );
    assert_eq!(
        refused.len(),
        25,
        "everything else is refused; logs:\n{}",
        logs()
    );
    let mut remaining: Vec<u32> = ok.iter().filter_map(|x| x.remaining).collect();
    remaining.sort_unstable();
    assert_eq!(
        remaining,
        vec![0, 1, 2, 3, 4],
        "each instance saw the shared count"
    );
    let waits: Vec<u64> = refused.iter().filter_map(|x| x.retry_after).collect();
    assert_eq!(waits.len(), 25);
    let (lo, hi) = (waits.iter().min().copied(), waits.iter().max().copied());
    assert!(
        hi.zip(lo)
            .is_some_and(|(h, l)| h - l <= 1 && l >= 700 && h <= 720),
        "instances agree on Retry-After (one token every 720 s): {waits:?}"
    );
    // A refused request consumed nothing of the other limiter, and says so: 8 - 5 passed = 3.
    for r in &refused {
        assert!(
            r.ratelimit.contains(&format!("\"{b}\";r=3;")),
            "{}",
            r.ratelimit
        );
    }
    // Every instance asked Redis, and never more than once per request.
    let mut calls = 0.0;
    for gw in &gateways {
        let c = gw
            .metric(r#"fleet_limiter_store_calls_total{store="redis"}"#)
            .await
            .expect("the Redis store counts its calls");
        assert!(c >= 1.0, "{c}");
        calls += c;
    }
    assert!(calls <= 30.0, "{calls} calls for 30 requests");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_gateways_on_one_redis_allow_exactly_the_limit() {
    let Some(redis) = redis_support::standalone() else {
        return;
    };
    // The command-line shorthand: `--store redis://...`.
    let url = redis.url();
    let envs = [("FLEET_LIMITER_STORE_TIMEOUT", "2s")];
    three_gateways_share_one_budget("", &["--store", &url], &envs, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_gateways_on_a_redis_cluster_allow_exactly_the_limit() {
    let Some(cluster) = redis_support::cluster() else {
        return;
    };
    let nodes: Vec<String> = cluster.urls().iter().map(|u| format!("\"{u}\"")).collect();
    let store = format!(
        "[store]\nbackend = \"redis\"\ncluster = [{}]\ntimeout = \"2s\"",
        nodes.join(", ")
    );
    // One request at a time: each spans two slots, and a refusal on one gives back the other.
    three_gateways_share_one_budget(&store, &[], &[], false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stopped_under_load_applies_the_configured_answer_and_recovers() {
    let Some(mut server) = redis_support::own_server() else {
        return;
    };
    let timeout = Duration::from_millis(100);
    let (gw, open_url, closed_url) = outage_gateway(&server.url(), timeout);
    let client = reqwest::Client::new();

    // Limiting works while Redis is up.
    assert_eq!(
        statuses(&client, &closed_url, "before", 4).await,
        vec![200, 200, 200, 429]
    );

    // Load from four clients, each request as a fresh agent so no budget runs out.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut load = Vec::new();
    for w in 0..4 {
        let (client, stop) = (client.clone(), stop.clone());
        let urls = [open_url.clone(), closed_url.clone()];
        load.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let url = &urls[(i % 2) as usize];
                let t = Instant::now();
                let a = get(&client, url, &format!("load-{w}-{i}")).await;
                seen.push((i % 2 == 1, a.status, t.elapsed()));
                i += 1;
            }
            seen
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.stop();

    // Redis is gone: each limiter gives its configured answer.
    for i in 0..10 {
        let o = get(&client, &open_url, &format!("down-{i}")).await;
        let c = get(&client, &closed_url, &format!("down-{i}")).await;
        // `deny` is the server's failure, not the client's budget: 503, never 429.
        assert_eq!(
            (o.status, c.status),
            (200, 503),
            "during the outage, request {i}"
        );
        assert!(c.retry_after.is_some_and(|s| s > 0));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Redis comes back on the same port: limiting resumes without a restart.
    server.start();
    let probe = |n| format!("probe-{n}");
    poll_until(
        &client,
        &gw,
        &closed_url,
        probe,
        |s| s == 200,
        "the gateway never reached Redis again",
    )
    .await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(
        statuses(&client, &closed_url, "after", 4).await,
        vec![200, 200, 200, 429],
        "limiting resumed"
    );

    let mut seen = Vec::new();
    for h in load {
        seen.extend(h.await.expect("load task"));
    }
    assert!(seen.len() > 20, "the load ran ({} requests)", seen.len());
    // No budget runs out (a fresh agent each time): the `allow` limiter's routes are always
    // served, and the `deny` limiter's answer the store's failure with 503 (never 429).
    assert!(
        seen.iter()
            .all(|(closed, s, _)| *s == 200 || (*closed && *s == 503)),
        "200, or the deny limiter's 503: {:?}",
        seen.iter()
            .filter(|(closed, s, _)| !(*s == 200 || (*closed && *s == 503)))
            .map(|(closed, s, _)| (*closed, *s))
            .collect::<Vec<_>>()
    );
    assert!(
        seen.iter().any(|(_, s, _)| *s == 503),
        "the outage was seen under load"
    );
    let slowest = seen.iter().map(|(_, _, d)| *d).max().unwrap_or_default();
    assert!(
        slowest < timeout * 20,
        "no request waited far beyond the {timeout:?} timeout (slowest {slowest:?})"
    );
    // Logged once per burst, not per request: the outage is one burst of many failed decisions
    // (a timeout under a loaded machine before the outage would add a short burst of its own).
    let log = strip_ansi(&gw.stderr());
    let bursts = log.matches("redis store failing").count();
    let failed: u64 = log
        .lines()
        .filter(|l| l.contains("redis store answering again"))
        .filter_map(|l| l.split("failed_decisions=").nth(1))
        .filter_map(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    assert!((1..=3).contains(&bursts), "{bursts} bursts logged:\n{log}");
    assert_eq!(
        log.matches("redis store answering again").count(),
        bursts,
        "{log}"
    );
    assert!(
        failed >= 20 * bursts as u64,
        "{failed} failed decisions counted in {bursts} log lines:\n{log}"
    );
}

/// A gateway on the Redis at `url` with the two limiters of [`outage_config`] (fresh names),
/// and the URLs of its `/open/x` and `/closed/x`.
fn outage_gateway(url: &str, timeout: Duration) -> (Gateway, String, String) {
    let (open, closed) = (unique("open"), unique("closed"));
    let config = outage_config(url, timeout, &open, &closed);
    let gw = gateway(&config, &redis_support::upstream(), &[], &[]);
    let (open_url, closed_url) = (gw.url("/open/x"), gw.url("/closed/x"));
    (gw, open_url, closed_url)
}

fn outage_config(url: &str, timeout: Duration, open: &str, closed: &str) -> String {
    format!(
        r#"
[store]
backend = "redis"
url = "{url}"
timeout = "{ms}ms"

[limiters.{open}]
limit = 3
window = "1h"
key = "ip+agent"
routes = ["/open/**"]
on_store_error = "allow"

[limiters.{closed}]
limit = 3
window = "1h"
key = "ip+agent"
routes = ["/closed/**"]
on_store_error = "deny"

# The address ceiling an agent-id key needs, far above what the tests send.
[limiters.{open}-ip]
limit = 1000000
window = "1h"
key = "ip"
routes = ["/open/**", "/closed/**"]
"#,
        ms = timeout.as_millis()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_redis_costs_each_request_at_most_the_timeout() {
    let Some(server) = redis_support::own_server() else {
        return;
    };
    let timeout = Duration::from_millis(100);
    let (gw, open_url, closed_url) = outage_gateway(&server.url(), timeout);
    let client = reqwest::Client::new();
    assert_eq!(get(&client, &closed_url, "warm").await.status, 200);

    // The process is frozen: connections stay open and nothing answers, so only the timeout helps.
    server.pause();
    let mut slowest = Duration::ZERO;
    for i in 0..10 {
        let t = Instant::now();
        let o = get(&client, &open_url, &format!("frozen-{i}")).await;
        let c = get(&client, &closed_url, &format!("frozen-{i}")).await;
        slowest = slowest.max(t.elapsed() / 2);
        assert_eq!(
            (o.status, c.status),
            (200, 503),
            "request {i} while Redis is frozen"
        );
    }
    assert!(
        slowest < timeout * 20,
        "no request waited far beyond the {timeout:?} timeout (slowest {slowest:?})"
    );
    server.resume();
    let thawed = |n| format!("thawed-{n}");
    poll_until(
        &client,
        &gw,
        &closed_url,
        thawed,
        |s| s == 200,
        "limiting never resumed",
    )
    .await;
    assert_eq!(
        statuses(&client, &closed_url, "thawed", 4).await,
        vec![200, 200, 200, 429],
        "limiting resumed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_started_before_redis_limits_once_it_appears() {
    let Some(mut server) = redis_support::own_server() else {
        return;
    };
    server.stop();
    let (gw, open_url, closed_url) = outage_gateway(&server.url(), Duration::from_millis(100));
    let client = reqwest::Client::new();
    for i in 0..5 {
        assert_eq!(
            get(&client, &open_url, "early").await.status,
            200,
            "request {i}: allow on error"
        );
        assert_eq!(
            get(&client, &closed_url, "early").await.status,
            503,
            "request {i}: deny on error, the server's failure"
        );
    }
    server.start();
    let late = |_| "late".to_owned();
    poll_until(
        &client,
        &gw,
        &open_url,
        late,
        |s| s != 200,
        "limiting never started",
    )
    .await;
    // The agent "late" has now spent its 3 requests: Redis counts.
    assert_eq!(get(&client, &open_url, "late").await.status, 429);
}

/// The log without terminal colour codes.
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Memory per active key, measured: `cargo test --test redis -- --ignored --nocapture memory_per_active_key`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: 100 000 requests"]
async fn memory_per_active_key() {
    let Some(server) = redis_support::own_server() else {
        return;
    };
    let store = connected(
        RedisTarget::Standalone(server.url()),
        RedisOptions::new(Duration::from_secs(5)),
    );
    let mut con = connection(&server.url()).await;
    async fn used(con: &mut redis::aio::MultiplexedConnection) -> i64 {
        let info: String = redis::cmd("INFO")
            .arg("memory")
            .query_async(con)
            .await
            .expect("INFO");
        info.lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("used_memory")
    }
    const N: usize = 100_000;
    let before = used(&mut con).await;
    // The calibration's enrollment shape: 3 per 15 minutes, so every key lives 5 minutes.
    let quota = Quota::gcra(nonzero(3), Duration::from_secs(900));
    let limiter: Arc<str> = Arc::from("agent-enroll");
    for batch in 0..N / 500 {
        let checks: Vec<[Check; 1]> = (0..500)
            .map(|i| {
                [Check {
                    key: BucketKey::new(limiter.clone(), &format!("203.0.113.7:agent-{batch}-{i}")),
                    quota,
                    shadow: false,
                    units: std::num::NonZeroU32::MIN,
                }]
            })
            .collect();
        let verdicts = futures_util::future::join_all(checks.iter().map(|c| store.decide(c))).await;
        assert!(verdicts
            .iter()
            .all(|v| v.as_ref().is_ok_and(|v| v[0].allowed)));
    }
    let after = used(&mut con).await;
    let keys: i64 = redis::cmd("DBSIZE")
        .query_async(&mut con)
        .await
        .expect("DBSIZE");
    assert_eq!(keys, N as i64);
    let per_key = (after - before) as f64 / N as f64;
    println!("redis used_memory: {before} -> {after} bytes for {N} active keys = {per_key:.1} bytes per key");
    assert!((40.0..400.0).contains(&per_key), "{per_key} bytes per key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_cluster_is_used_again_without_a_restart() {
    let Some(mut cluster) = redis_support::cluster() else {
        return;
    };
    let mut o = RedisOptions::new(Duration::from_millis(200));
    o.cache_capacity = 0;
    let store = connected(RedisTarget::Cluster(cluster.urls()), o);
    let lim = unique("restart");
    let checks: Vec<Check> = ["a", "b", "c", "d"]
        .iter()
        .map(|p| check(&lim, p, Quota::gcra(nonzero(1000), Duration::from_secs(60))))
        .collect();
    assert!(store.decide(&checks).await.is_ok());
    for n in &mut cluster.nodes {
        n.stop();
    }
    assert!(store.decide(&checks).await.is_err());
    let errors = store.errors();
    assert!(errors >= 1);
    for n in &mut cluster.nodes {
        n.start();
    }
    cluster.wait_ok();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut failed = 0;
    while store.decide(&checks).await.is_err() {
        failed += 1;
        assert!(
            Instant::now() < deadline,
            "the store never used the cluster again"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Every failed decision was counted once, and as the cluster being away or slow.
    assert_eq!(store.errors(), errors + failed);
    let away =
        errors_of(&store, StoreErrorKind::Connection) + errors_of(&store, StoreErrorKind::Timeout);
    assert_eq!(away, store.errors(), "{:?}", store.errors_by_kind());
}

/// Failed decisions of `kind` the store counted.
fn errors_of(store: &RedisStore, kind: StoreErrorKind) -> u64 {
    store
        .errors_by_kind()
        .iter()
        .find(|(k, _)| *k == kind)
        .map_or(0, |(_, n)| *n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_server_fails_decisions_as_connection_errors() {
    let Some(mut server) = redis_support::own_server() else {
        return;
    };
    let mut o = RedisOptions::new(Duration::from_secs(2));
    o.cache_capacity = 0;
    let store = connected(RedisTarget::Standalone(server.url()), o);
    let checks = [check(
        &unique("stopped"),
        "p",
        Quota::gcra(nonzero(1000), Duration::from_secs(60)),
    )];
    assert!(store.decide(&checks).await.is_ok());
    server.stop();
    for _ in 0..3 {
        let e = store.decide(&checks).await.expect_err("the server is gone");
        assert_eq!(e.kind(), StoreErrorKind::Connection, "{e}");
    }
    assert_eq!(store.errors(), 3);
    assert_eq!(errors_of(&store, StoreErrorKind::Connection), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_server_fails_decisions_as_timeouts() {
    let Some(server) = redis_support::own_server() else {
        return;
    };
    let mut o = RedisOptions::new(Duration::from_millis(200));
    o.cache_capacity = 0;
    let store = connected(RedisTarget::Standalone(server.url()), o);
    let checks = [check(
        &unique("frozen"),
        "p",
        Quota::gcra(nonzero(1000), Duration::from_secs(60)),
    )];
    assert!(store.decide(&checks).await.is_ok());
    server.pause();
    let answer = store.decide(&checks).await;
    server.resume();
    let e = answer.expect_err("a frozen server does not answer");
    assert_eq!(e.kind(), StoreErrorKind::Timeout, "{e}");
    assert_eq!(store.errors(), 1);
    assert_eq!(errors_of(&store, StoreErrorKind::Timeout), 1);
}

/// `/readyz` of a gateway: which store it runs on, and whether that store answers.
async fn readyz(gw: &Gateway) -> serde_json::Value {
    reqwest::Client::new()
        .get(gw.admin("/readyz"))
        .send()
        .await
        .expect("GET /readyz")
        .json()
        .await
        .expect("readyz JSON")
}

/// The start-up line of a gateway's log.
fn started_line(gw: &Gateway) -> String {
    let log = strip_ansi(&gw.stderr());
    log.lines()
        .find(|l| l.contains("fleet-limiter gateway started"))
        .unwrap_or_else(|| panic!("no start-up line in:\n{log}"))
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_url_alone_selects_the_redis_store() {
    let Some(redis) = redis_support::standalone() else {
        return;
    };
    let url = redis.url();
    let up = redis_support::upstream();

    let gw = Launch::serve()
        .upstream(&up)
        .admin()
        .log("info")
        .env("FLEET_LIMITER_STORE_URL", &url)
        .spawn();
    let ready = readyz(&gw).await;
    assert_eq!(ready["store"], "redis", "{ready}");
    assert_eq!(ready["ready"], true, "{ready}");
    let line = started_line(&gw);
    assert!(line.contains(&format!("store=redis {url}")), "{line}");
    drop(gw);

    let gw = gateway(&format!("[store]\nurl = \"{url}\"\n"), &up, &[], &[]);
    assert_eq!(readyz(&gw).await["store"], "redis");
    drop(gw);

    let out = Launch::command(["check"])
        .env("FLEET_LIMITER_STORE_URL", &url)
        .run(Duration::from_secs(30));
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(
        out.stdout.contains(&format!("Store: redis {url}")),
        "check names the store:\n{}",
        out.stdout
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_start_up_line_names_the_memory_store_and_hides_a_redis_password() {
    let up = redis_support::upstream();
    let gw = Launch::serve().upstream(&up).admin().log("info").spawn();
    assert!(
        started_line(&gw).contains("store=memory"),
        "{}",
        started_line(&gw)
    );
    drop(gw);
    // Redis need not answer for the line to be written; its password never is.
    let dead = common::dead_addr();
    let gw = Launch::serve()
        .upstream(&up)
        .admin()
        .log("info")
        .env(
            "FLEET_LIMITER_STORE_URL",
            format!("redis://default:S3cretPassw0rd@{dead}"),
        )
        .spawn();
    let line = started_line(&gw);
    assert!(
        line.contains(&format!("store=redis redis://default:***@{dead}")),
        "{line}"
    );
    assert!(!gw.stderr().contains("S3cretPassw0rd"), "{}", gw.stderr());
}

#[test]
fn the_memory_backend_with_a_redis_url_stops_start_up_with_the_fix() {
    let out = Launch::serve()
        .upstream("http://127.0.0.1:9")
        .log("info")
        .env("FLEET_LIMITER_STORE_BACKEND", "memory")
        .env("FLEET_LIMITER_STORE_URL", "redis://127.0.0.1:6379")
        .run(Duration::from_secs(30));
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains(
            "configuration error: environment variable FLEET_LIMITER_STORE_BACKEND: store.backend:"
        ) && out.stderr.contains("FLEET_LIMITER_STORE_URL")
            && out.stderr.contains("backend = \"redis\""),
        "{}",
        out.stderr
    );
    assert!(!out.stderr.contains("gateway started"), "{}", out.stderr);
}

/// `tracked_keys{store="redis"}` counts the limiter's buckets, not whatever else the database
/// holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tracked_keys_counts_only_the_limiters_buckets() {
    let Some(server) = redis_support::own_server() else {
        return;
    };
    let mut con = connection(&server.url()).await;
    for i in 0..50 {
        let _: () = redis::cmd("SET")
            .arg(format!("someone-else:{i}"))
            .arg("x")
            .query_async(&mut con)
            .await
            .expect("SET");
    }
    let _: () = redis::cmd("SET")
        .arg("fl:not-a-bucket")
        .arg("x")
        .query_async(&mut con)
        .await
        .expect("SET");
    // One limiter whose buckets live an hour (the built-in ones on /api/agent/heartbeat empty
    // within seconds, before a count could see them).
    let config = format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\n\n[limiters.long-lived]\nlimit = 2\nwindow = \"1h\"\nkey = \"ip+agent\"\nroutes = [\"/t/**\"]\n\n[limiters.long-lived-ip]\nlimit = 100\nwindow = \"1h\"\nkey = \"ip\"\nmeter = \"new-agents\"\nroutes = [\"/t/**\"]\n",
        server.url()
    );
    let gw = gateway(&config, &redis_support::upstream(), &[], &[]);
    for agent in ["agent-1", "agent-2", "agent-3"] {
        let res = common::client()
            .get(gw.url("/t/x"))
            .header("x-agent-id", agent)
            .send()
            .await
            .expect("request");
        assert_eq!(res.status(), 200);
    }
    // Three agents' buckets and their address's (the ceiling an agent-id key needs), beside 51
    // keys of others.
    let n = gw
        .wait_metric(r#"fleet_limiter_tracked_keys{store="redis"}"#, |v| v > 0.0)
        .await;
    assert_eq!(n, 4.0);
}

/// A Redis URL the store could not use stops `check` and `serve` with exit code 2, naming
/// `store.url` (or the `store.cluster` entry), where it was set, what is wrong and how to write
/// it, and never the password. No Redis is needed: nothing is reached.
#[test]
fn a_bad_redis_url_stops_check_and_serve_naming_store_url() {
    for (url, says) in [
        (
            "redis://127.0.0.1:6379/db0",
            "store.url: `redis://127.0.0.1:6379/db0`: `/db0`: the database is a number: redis://127.0.0.1:6379/0",
        ),
        ("redis://:s3cret@cache:port", "`port` is not a port"),
        ("http://127.0.0.1:6379", "`http://` is not a Redis scheme"),
        ("redis://cache:6379/0?protocol=resp3", "has options"),
        ("127.0.0.1:6379", "has no scheme"),
    ] {
        for cmd in ["check", "serve"] {
            let mut launch = Launch::command([cmd])
                .config_toml(format!("[store]\nurl = \"{url}\"\n"));
            if cmd == "serve" {
                launch = launch.args(["--upstream", "http://127.0.0.1:9"]);
            }
            let out = launch.run(Duration::from_secs(30));
            assert_eq!(out.code, Some(2), "{cmd} {url}: {}", out.stderr);
            assert!(
                out.stderr.contains("fleet-limiter.toml: ") && out.stderr.contains(says),
                "{cmd} {url}: {}",
                out.stderr
            );
            assert!(!out.stderr.contains("s3cret"), "{}", out.stderr);
        }
    }
    let out = Launch::command(["check"])
        .env(
            "FLEET_LIMITER_STORE_CLUSTER",
            "redis://a:7000,redis://a:7000/0",
        )
        .run(Duration::from_secs(30));
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains(
            "environment variable FLEET_LIMITER_STORE_CLUSTER: store.cluster: entries 1 and 2 name the same node"
        ),
        "{}",
        out.stderr
    );
}
