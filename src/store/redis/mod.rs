//! The Redis store: every gateway instance shares each bucket, with the same decisions as
//! [`super::memory::MemoryStore`].
//!
//! - **One script call per request, or fewer.** The checks of a request are decided together in
//!   one `EVALSHA` (falling back to `EVAL` on `NOSCRIPT`, after a restart or a failover), with the
//!   math of [`crate::limiter`] (`decide.lua`) and the all-or-nothing rule of
//!   [`super::Store::decide`]. The clock is Redis `TIME`, so instance clocks never matter. A
//!   bucket expires when it is full again.
//! - **Standalone: requests share calls.** At most `store.calls_in_flight` calls (one by
//!   default) are out at once; requests that arrive meanwhile wait (never longer than the
//!   timeout) and go together in the next call (`batch.lua`), each decided atomically and in
//!   arrival order, as if alone. Under load this divides Redis's per-call cost (command
//!   parsing, the script call, the reply, the socket reads and writes on both sides) among the
//!   requests of a call; an idle store sends each request at once.
//! - **Keys** are `fl:{<limiter>:<hex digest>}`: the whole name is the hash tag, so a bucket is
//!   one key on one Cluster slot, and nothing but digests ever reaches Redis.
//! - **Cluster.** Keys of one request usually sit on different slots. The checks are grouped by
//!   slot and every group's script (`slot.lua`) is sent at once (one round trip of latency). Each
//!   group is atomic. When one group refuses while another consumed, the consumed units are given
//!   back by `refund.lua` before the decision returns (within the same timeout): exactly when
//!   nothing touched the bucket in between, otherwise by moving it back by the units consumed.
//!   Between the two, a concurrent request of the same principal may see those units spent.
//! - **Failure.** Every decision is bounded by the configured timeout; an error or a timeout is
//!   returned at once (each limiter's `on_store_error` then answers), counted, and logged once
//!   per burst. A lost connection is rebuilt in the background while requests keep failing fast.
//! - **TLS.** `rediss://` URLs are reached over TLS (rustls): the server's certificate must chain
//!   to a system root or to `store.ca_file` and name the URL's host (sent as SNI), unless
//!   `store.insecure_skip_verify` is set. A certificate that does not verify is logged as such,
//!   naming the setting, and `/readyz` reports it, like any other unreachable Redis.
//! - **Local over-limit cache.** A request refused until T is answered in-process until T when
//!   it names exactly the same buckets, so hammering a refused key costs Redis nothing.

mod cache;
mod cluster;
mod conn;
mod connection;
mod keys_count;
mod levers;
mod scripts;
mod sentinel;
mod shared_calls;
mod url;

pub use connection::RedisTls;
pub(crate) use scripts::key_name;
pub(crate) use sentinel::{is_sentinel_url, parse as parse_sentinel_url};
pub(crate) use shared_calls::MAX_WAITING;
pub(crate) use url::parse as parse_server_url;

use self::cache::OverLimitCache;
use self::conn::Conn;
use self::keys_count::count_keys;
use self::scripts::{Script, BATCH_LUA, REFUND_LUA, SLOT_LUA};
use self::shared_calls::{share_calls, Job};
use super::memory::MemoryStore;
use super::{Check, GiveBack, Store, StoreError, StoreErrorKind};
use crate::clock::{Clock, SystemClock};
use crate::limiter::Verdict;
use futures_util::future::BoxFuture;
use parking_lot::{Mutex, RwLock};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

/// The longest window the script computes exactly (2^53 ns, about 104 days): Lua numbers are doubles.
pub(crate) const MAX_WINDOW_NS: u64 = 1 << 53;

/// Standalone script calls out at once unless [`RedisOptions::calls_in_flight`] says otherwise.
pub(crate) const DEFAULT_CALLS_IN_FLIGHT: usize = 1;

/// Where the Redis store connects. Its `Debug` and `Display` forms hide URL passwords.
#[derive(Clone, PartialEq, Eq)]
pub enum RedisTarget {
    /// One server (or a proxy in front of a primary): `redis://host:6379`.
    Standalone(String),
    /// A Redis Cluster, given by some of its nodes' URLs.
    Cluster(Vec<String>),
    /// The primary Redis Sentinel names:
    /// `redis+sentinel://[user:password@]host:port[,host:port...]/<master-name>[/db]`
    /// (`rediss+sentinel://` for TLS), followed through failovers.
    Sentinel(String),
}

impl RedisTarget {
    /// The setting it comes from, as messages name it.
    pub fn setting(&self) -> &'static str {
        match self {
            RedisTarget::Standalone(_) | RedisTarget::Sentinel(_) => "store.url",
            RedisTarget::Cluster(_) => "store.cluster",
        }
    }

    /// Whether any of its URLs is `rediss://` or `rediss+sentinel://` (reached over TLS).
    pub fn uses_tls(&self) -> bool {
        self.urls()
            .iter()
            .any(|u| u.starts_with("rediss://") || u.starts_with("rediss+sentinel://"))
    }

    fn urls(&self) -> Vec<&String> {
        match self {
            RedisTarget::Standalone(u) | RedisTarget::Sentinel(u) => vec![u],
            RedisTarget::Cluster(nodes) => nodes.iter().collect(),
        }
    }
}

impl std::fmt::Display for RedisTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RedisTarget::Standalone(u) | RedisTarget::Sentinel(u) => {
                f.write_str(&crate::redact::url(u))
            }
            RedisTarget::Cluster(nodes) => {
                let shown: Vec<_> = nodes.iter().map(|u| crate::redact::url(u)).collect();
                write!(f, "cluster {}", shown.join(", "))
            }
        }
    }
}

impl std::fmt::Debug for RedisTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RedisTarget::Standalone(u) => f
                .debug_tuple("Standalone")
                .field(&crate::redact::url(u))
                .finish(),
            RedisTarget::Sentinel(u) => f
                .debug_tuple("Sentinel")
                .field(&crate::redact::url(u))
                .finish(),
            RedisTarget::Cluster(nodes) => {
                let shown: Vec<_> = nodes.iter().map(|u| crate::redact::url(u)).collect();
                f.debug_tuple("Cluster").field(&shown).finish()
            }
        }
    }
}

/// How the Redis store behaves; [`RedisOptions::new`] gives the production settings.
#[derive(Clone)]
pub struct RedisOptions {
    /// Longest a decision waits for Redis.
    pub timeout: Duration,
    /// Longest a background connection attempt waits.
    pub connect_timeout: Duration,
    /// Most refused buckets the local over-limit cache remembers (0 turns it off).
    pub cache_capacity: usize,
    /// The local clock: the over-limit cache's time line, and the script's when `time_from_clock`.
    pub clock: Arc<dyn Clock>,
    /// Pass `clock` to the script instead of reading Redis `TIME` (tests and simulations).
    pub time_from_clock: bool,
    /// Added to every key's expiry (zero in production; virtual-time tests may outrun real time).
    pub ttl_pad: Duration,
    /// Standalone: script calls out at once (at least one); requests arriving meanwhile wait and
    /// share the next call.
    pub calls_in_flight: usize,
    /// How `rediss://` URLs are verified (`None`: system roots).
    pub tls: Option<RedisTls>,
    /// Most buckets of the local store that limiters with `on_store_error = "local"` decide on
    /// while Redis does not answer (`store.max_keys`).
    pub local_keys: usize,
}

impl RedisOptions {
    pub fn new(timeout: Duration) -> Self {
        Self {
            timeout,
            connect_timeout: Duration::from_secs(1),
            cache_capacity: 100_000,
            clock: Arc::new(SystemClock::new()),
            time_from_clock: false,
            ttl_pad: Duration::ZERO,
            calls_in_flight: DEFAULT_CALLS_IN_FLIGHT,
            tls: None,
            local_keys: 100_000,
        }
    }
}

/// The Redis store. Cheap to share; owns a small runtime for its background work.
pub struct RedisStore {
    inner: Arc<Inner>,
    runtime: Option<tokio::runtime::Runtime>,
}

struct Inner {
    target: RedisTarget,
    opts: RedisOptions,
    handle: tokio::runtime::Handle,
    conn: RwLock<Option<Arc<Conn>>>,
    reconnecting: AtomicBool,
    first_connect: Mutex<Option<mpsc::Sender<()>>>,
    first_wait: Mutex<Option<mpsc::Receiver<()>>>,
    slot: Script,
    batch: Script,
    refund: Script,
    peek_script: Script,
    table_script: Script,
    /// Requests waiting for a shared call (standalone only).
    jobs: Option<tokio::sync::mpsc::Sender<Job>>,
    cache: OverLimitCache,
    errors: AtomicU64,
    errors_by_kind: [AtomicU64; StoreErrorKind::ALL.len()],
    failing: AtomicBool,
    errors_at_burst_start: AtomicU64,
    failures_in_row: AtomicU64,
    last_rebuild: Mutex<Option<std::time::Instant>>,
    round_trips: AtomicU64,
    refunds: AtomicU64,
    keys: AtomicU64,
    /// Why the last connection attempt failed, until one succeeds (for `/readyz` and logs).
    connect_error: Mutex<Option<String>>,
    /// This instance's own buckets, for `on_store_error = "local"` while Redis does not answer.
    local: MemoryStore,
    /// Decisions made on `local` since start.
    local_decisions: AtomicU64,
    /// `local` has answered since Redis last did (logged once per outage).
    answering_locally: AtomicBool,
    local_decisions_at_outage_start: AtomicU64,
    /// Sentinel: the primary the current connection reaches (`host:port`).
    primary: Mutex<Option<String>>,
    /// Sentinel: switches from one primary to another since start.
    failovers: AtomicU64,
}

impl RedisStore {
    /// Most checks one shared call to Redis carries.
    pub const MAX_CALL_CHECKS: usize = shared_calls::MAX_CALL_CHECKS;
    /// Most requests waiting for a call; beyond that a decision fails at once, answered by each
    /// limiter's `on_store_error`, instead of queueing without bound.
    pub const MAX_WAITING: usize = shared_calls::MAX_WAITING;

    /// The Redis key that holds `key`'s bucket (its hash tag is the whole bucket name, so a
    /// bucket never spans two Cluster slots).
    pub fn key_name(key: &crate::keys::BucketKey) -> String {
        scripts::key_name(key)
    }

    /// A store on `target` that waits up to two seconds for a first connection; without one it
    /// still returns, and limiters answer with their `on_store_error` until Redis can be reached.
    pub fn start(target: RedisTarget, opts: RedisOptions) -> Result<Self, StoreError> {
        let service = target.setting();
        let store = Self::new(target.clone(), opts)?;
        if !store.wait_connected(Duration::from_secs(2)) {
            let why = store.inner.connect_error.lock().clone();
            tracing::warn!(
                target = %target,
                error = why.as_deref().unwrap_or("no answer yet"),
                "{service}: redis store not reachable yet; limiters answer with on_store_error until it is"
            );
        }
        Ok(store)
    }

    /// A store on `target`; connects in the background at once.
    pub fn new(target: RedisTarget, opts: RedisOptions) -> Result<Self, StoreError> {
        let urls: Vec<&String> = match &target {
            RedisTarget::Sentinel(u) => {
                sentinel::parse(u).map_err(|e| {
                    StoreError::new(
                        StoreErrorKind::Config,
                        format!("store.url `{}`: {e}", crate::redact::url(u)),
                    )
                })?;
                Vec::new()
            }
            RedisTarget::Standalone(u) => vec![u],
            RedisTarget::Cluster(nodes) if nodes.is_empty() => {
                return Err(StoreError::new(
                    StoreErrorKind::Config,
                    "store.cluster lists no node",
                ))
            }
            RedisTarget::Cluster(nodes) => nodes.iter().collect(),
        };
        for u in urls {
            redis::Client::open(u.as_str()).map_err(|e| {
                let e = e.to_string();
                StoreError::new(
                    StoreErrorKind::Config,
                    format!(
                        "redis URL `{}`: {}",
                        crate::redact::url(u),
                        crate::redact::urls_in(&e)
                    ),
                )
            })?;
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("fleet-limiter-redis")
            .enable_all()
            .build()
            .map_err(|e| {
                StoreError::new(
                    StoreErrorKind::Internal,
                    format!("cannot start the redis store's runtime: {e}"),
                )
            })?;
        let (tx, rx) = mpsc::channel();
        let cache = OverLimitCache::new(opts.cache_capacity);
        let (jobs, waiting) = match target {
            RedisTarget::Standalone(_) | RedisTarget::Sentinel(_) => {
                let (jobs, waiting) = tokio::sync::mpsc::channel(MAX_WAITING);
                (Some(jobs), Some(waiting))
            }
            RedisTarget::Cluster(_) => (None, None),
        };
        let inner = Arc::new(Inner {
            target,
            handle: runtime.handle().clone(),
            conn: RwLock::new(None),
            reconnecting: AtomicBool::new(false),
            first_connect: Mutex::new(Some(tx)),
            first_wait: Mutex::new(Some(rx)),
            slot: Script::new(SLOT_LUA),
            batch: Script::new(BATCH_LUA),
            refund: Script::new(REFUND_LUA),
            peek_script: Script::new(levers::PEEK_LUA),
            table_script: Script::new(levers::TABLE_LUA),
            jobs,
            cache,
            errors: AtomicU64::new(0),
            errors_by_kind: Default::default(),
            failing: AtomicBool::new(false),
            errors_at_burst_start: AtomicU64::new(0),
            failures_in_row: AtomicU64::new(0),
            last_rebuild: Mutex::new(None),
            round_trips: AtomicU64::new(0),
            refunds: AtomicU64::new(0),
            keys: AtomicU64::new(0),
            connect_error: Mutex::new(None),
            local: MemoryStore::new(opts.local_keys.max(1), opts.clock.clone()),
            local_decisions: AtomicU64::new(0),
            answering_locally: AtomicBool::new(false),
            local_decisions_at_outage_start: AtomicU64::new(0),
            primary: Mutex::new(None),
            failovers: AtomicU64::new(0),
            opts,
        });
        inner.reconnect();
        let weak = Arc::downgrade(&inner);
        runtime.spawn(count_keys(weak.clone()));
        if matches!(inner.target, RedisTarget::Sentinel(_)) {
            runtime.spawn(sentinel::follow(weak.clone()));
        }
        if let Some(waiting) = waiting {
            runtime.spawn(share_calls(
                weak,
                waiting,
                inner.opts.calls_in_flight.max(1),
            ));
        }
        Ok(Self {
            inner,
            runtime: Some(runtime),
        })
    }

    /// Block the calling thread until the first connection is up, at most `within`.
    pub fn wait_connected(&self, within: Duration) -> bool {
        if self.is_connected() {
            return true;
        }
        let rx = self.inner.first_wait.lock().take();
        match rx {
            Some(rx) => rx.recv_timeout(within).is_ok() || self.is_connected(),
            None => self.is_connected(),
        }
    }

    /// Why the last connection attempt failed, until one succeeds.
    pub fn connect_error(&self) -> Option<String> {
        self.inner.connect_error.lock().clone()
    }

    /// Whether a connection is up right now.
    pub fn is_connected(&self) -> bool {
        self.inner.conn.read().is_some()
    }

    /// Decisions that failed (error or timeout) since start.
    pub fn errors(&self) -> u64 {
        self.inner.errors.load(Ordering::Relaxed)
    }

    /// Requests answered by the local over-limit cache without asking Redis.
    pub fn cache_hits(&self) -> u64 {
        self.inner.cache.hits.load(Ordering::Relaxed)
    }

    /// Script calls sent to Redis to decide requests (one round trip each, whatever its number of
    /// keys; on a standalone server, concurrent requests share calls).
    pub fn round_trips(&self) -> u64 {
        self.inner.round_trips.load(Ordering::Relaxed)
    }

    /// Cluster requests whose consumption was given back because a different slot refused.
    pub fn refunds(&self) -> u64 {
        self.inner.refunds.load(Ordering::Relaxed)
    }

    /// Sentinel: switches from one primary to another since start.
    pub fn failovers(&self) -> u64 {
        self.inner.failovers.load(Ordering::Relaxed)
    }

    /// Sentinel: the primary the store is connected to now (`host:port`).
    pub fn primary(&self) -> Option<String> {
        self.inner.primary.lock().clone()
    }

    /// Decisions made on this instance's own buckets (`on_store_error = "local"`) since start.
    pub fn local_decisions(&self) -> u64 {
        self.inner.local_decisions.load(Ordering::Relaxed)
    }
}

impl Drop for RedisStore {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

impl Store for RedisStore {
    fn decide<'a>(
        &'a self,
        checks: &'a [Check],
    ) -> BoxFuture<'a, Result<Vec<Verdict>, StoreError>> {
        Box::pin(self.inner.decide(checks))
    }

    fn give_back<'a>(&'a self, items: &'a [GiveBack]) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(self.inner.give_back_answered(items))
    }

    fn peek<'a>(&'a self, checks: &'a [Check]) -> BoxFuture<'a, Result<Vec<Verdict>, StoreError>> {
        Box::pin(self.inner.peek(checks))
    }

    fn reset<'a>(
        &'a self,
        keys: &'a [crate::keys::BucketKey],
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(self.inner.reset(keys))
    }

    fn shared_table(&self) -> Option<&dyn super::SharedTable> {
        Some(self)
    }

    fn forget_cached(&self, key: &crate::keys::BucketKey) {
        self.inner.forget_cached(key);
    }

    fn kind(&self) -> &'static str {
        "redis"
    }

    /// Bucket keys (`fl:{...}`) in the Redis database (every master's, on Cluster), counted by a
    /// bounded SCAN every ten seconds; other keys the database holds are not counted.
    fn tracked_keys(&self) -> u64 {
        self.inner.keys.load(Ordering::Relaxed)
    }

    fn errors(&self) -> u64 {
        RedisStore::errors(self)
    }

    fn errors_by_kind(&self) -> [(StoreErrorKind, u64); StoreErrorKind::ALL.len()] {
        StoreErrorKind::ALL.map(|k| {
            (
                k,
                self.inner.errors_by_kind[k.index()].load(Ordering::Relaxed),
            )
        })
    }

    fn calls(&self) -> Option<u64> {
        Some(self.round_trips())
    }

    fn failovers(&self) -> Option<u64> {
        matches!(self.inner.target, RedisTarget::Sentinel(_)).then(|| self.failovers())
    }

    /// On the store's local buckets, bounded by `store.max_keys`: each instance alone, on the
    /// local clock. The first of an outage is logged; the log says when Redis answers again.
    fn decide_locally<'a>(
        &'a self,
        checks: &'a [Check],
    ) -> Option<BoxFuture<'a, Result<Vec<Verdict>, StoreError>>> {
        let inner = &self.inner;
        let total = inner.local_decisions.fetch_add(1, Ordering::Relaxed) + 1;
        if !inner.answering_locally.swap(true, Ordering::AcqRel) {
            inner
                .local_decisions_at_outage_start
                .store(total - 1, Ordering::Relaxed);
            tracing::warn!(
                "redis store not answering: limiters with on_store_error = \"local\" decide on this instance's own buckets until it answers (each instance grants their whole budget meanwhile)"
            );
        }
        Some(inner.local.decide(checks))
    }

    fn give_back_locally<'a>(
        &'a self,
        items: &'a [GiveBack],
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.inner.local.give_back(items)
    }

    fn ping(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            let conn = self.inner.conn.read().clone();
            let Some(conn) = conn else {
                return Err(StoreError::new(
                    StoreErrorKind::Connection,
                    match self.inner.connect_error.lock().as_deref() {
                        Some(why) => format!("redis: not connected: {why}"),
                        None => "redis: not connected".into(),
                    },
                ));
            };
            let answer =
                tokio::time::timeout(self.inner.opts.timeout, conn.query(&redis::cmd("PING")))
                    .await;
            if !matches!(answer, Ok(Ok(_))) {
                // A probe that finds the connection broken rebuilds it as a decision would: an
                // instance out of rotation (`store.require`) makes no decisions to do it.
                self.inner.failed_in_row();
            }
            match answer {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(e)) => Err(StoreError::new(
                    conn::classify(&e),
                    format!("redis: {}", crate::redact::urls_in(&e.to_string())),
                )),
                Err(_) => Err(StoreError::new(
                    StoreErrorKind::Timeout,
                    "redis: ping timed out",
                )),
            }
        })
    }
}

impl Inner {
    async fn decide(self: &Arc<Self>, checks: &[Check]) -> Result<Vec<Verdict>, StoreError> {
        if checks.is_empty() {
            return Ok(Vec::new());
        }
        if let Some(c) = checks.iter().find(|c| {
            c.quota.window_ns() >= MAX_WINDOW_NS
                || c.quota.lockout_ns().unwrap_or(0) >= MAX_WINDOW_NS
        }) {
            return Err(StoreError::new(
                StoreErrorKind::Config,
                format!(
                    "limiter `{}`: the redis store computes windows and lockouts up to 104 days",
                    c.key.limiter
                ),
            ));
        }
        let local_now = self.opts.clock.now();
        if let Some(v) = self.cache.answer(checks, local_now) {
            return Ok(v);
        }
        let conn = self.conn.read().clone();
        let Some(conn) = conn else {
            self.reconnect();
            return Err(self.failed(
                StoreErrorKind::Connection,
                "not connected; reconnecting in the background".into(),
            ));
        };
        let verdicts = match &self.jobs {
            Some(jobs) => self.decide_shared(jobs, checks).await?,
            None => self.decide_by_slot(&conn, checks).await?,
        };
        self.succeeded();
        self.cache.remember(checks, &verdicts, local_now);
        Ok(verdicts)
    }

    /// Give back answered requests: one `refund.lua` call (one per slot on a Cluster), bounded
    /// by the store's timeout. A failure is returned, not counted as a failed decision.
    async fn give_back_answered(&self, items: &[GiveBack]) -> Result<(), StoreError> {
        if items.is_empty() {
            return Ok(());
        }
        let Some(conn) = self.conn.read().clone() else {
            return Err(StoreError::new(
                StoreErrorKind::Connection,
                "redis: not connected; the give-back is dropped",
            ));
        };
        let now = self.now_args();
        let keys: Vec<String> = items.iter().map(|g| key_name(&g.key)).collect();
        let groups = match &self.jobs {
            Some(_) => vec![(0..items.len()).collect::<Vec<usize>>()],
            None => self.groups(&keys),
        };
        let calls = groups.iter().map(|g| {
            let (conn, keys, now) = (&conn, &keys, &now);
            self.refund.run(conn, g.len(), move |cmd: &mut redis::Cmd| {
                for &i in g {
                    cmd.arg(&keys[i]);
                }
                self.push_clock(cmd, now);
                cmd.arg("answer");
                for &i in g {
                    let q = &items[i].quota;
                    let (algo, p) = match q.algorithm {
                        crate::limiter::Algorithm::Gcra => ("g", q.emission_interval_ns()),
                        crate::limiter::Algorithm::FixedWindow => ("f", q.window_ns()),
                    };
                    cmd.arg(algo)
                        .arg(p)
                        .arg(items[i].units.get())
                        .arg(items[i].outstanding_ns.min(MAX_WINDOW_NS));
                }
            })
        });
        let answers =
            tokio::time::timeout(self.opts.timeout, futures_util::future::join_all(calls))
                .await
                .map_err(|_| {
                    StoreError::new(
                        StoreErrorKind::Timeout,
                        format!("redis: give-back unanswered within {:?}", self.opts.timeout),
                    )
                })?;
        for a in answers {
            if let Err(e) = a {
                return Err(StoreError::new(
                    conn::classify(&e),
                    format!(
                        "redis: give-back: {}",
                        crate::redact::urls_in(&e.to_string())
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Count an error; log only the first of a burst.
    fn failed(&self, kind: StoreErrorKind, msg: String) -> StoreError {
        let msg = crate::redact::urls_in(&msg).into_owned();
        self.errors_by_kind[kind.index()].fetch_add(1, Ordering::Relaxed);
        let total = self.errors.fetch_add(1, Ordering::Relaxed) + 1;
        if !self.failing.swap(true, Ordering::AcqRel) {
            self.errors_at_burst_start
                .store(total - 1, Ordering::Relaxed);
            tracing::warn!(
                error = %msg,
                "redis store failing: limiters answer with their on_store_error until it recovers"
            );
        }
        StoreError::new(kind, format!("redis: {msg}"))
    }

    fn succeeded(&self) {
        self.failures_in_row.store(0, Ordering::Relaxed);
        if self.failing.swap(false, Ordering::AcqRel) {
            let since = self.errors.load(Ordering::Relaxed)
                - self.errors_at_burst_start.load(Ordering::Relaxed);
            tracing::info!(failed_decisions = since, "redis store answering again");
        }
        if self.answering_locally.swap(false, Ordering::AcqRel) {
            let local = self.local_decisions.load(Ordering::Relaxed)
                - self.local_decisions_at_outage_start.load(Ordering::Relaxed);
            tracing::info!(
                local_decisions = local,
                "redis store answering again: limiters with on_store_error = \"local\" decide on the shared buckets again (what they counted locally is left behind)"
            );
        }
    }
}
