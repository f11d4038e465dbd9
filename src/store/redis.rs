//! The Redis store: every gateway instance shares each bucket, with the same decisions as
//! [`super::memory::MemoryStore`].
//!
//! - **One script call per request, or fewer.** The checks of a request are decided together in
//!   one `EVALSHA` (falling back to `EVAL` on `NOSCRIPT`, after a restart or a failover), with the
//!   math of [`crate::limiter`] (`gcra.lua`) and the all-or-nothing rule of
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

use super::{Check, Store, StoreError};
use crate::clock::{Clock, Nanos, SystemClock};
use crate::config::StoreConfig;
use crate::keys::BucketKey;
use crate::limiter::{Algorithm, Quota, Verdict};
use futures_util::future::{join_all, BoxFuture};
use parking_lot::{Mutex, RwLock};
use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ErrorKind, RedisError, RedisResult, Value};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Weak};
use std::time::Duration;
use tokio::sync::mpsc::error::TrySendError;

const SLOT_LUA: &str = concat!(
    include_str!("prelude.lua"),
    include_str!("gcra.lua"),
    include_str!("slot.lua")
);
const BATCH_LUA: &str = concat!(
    include_str!("prelude.lua"),
    include_str!("gcra.lua"),
    include_str!("batch.lua")
);
const REFUND_LUA: &str = concat!(include_str!("prelude.lua"), include_str!("refund.lua"));

/// The longest window the script computes exactly (2^53 ns, about 104 days): Lua numbers are doubles.
pub const MAX_WINDOW_NS: u64 = 1 << 53;

/// Consecutive failed decisions after which a fresh connection is built beside the current one.
const FAILURES_BEFORE_REBUILD: u64 = 3;
/// At most one such rebuild this often (a Cluster with one master down keeps failing some slots).
const REBUILD_EVERY: Duration = Duration::from_secs(2);
/// Cache shards; a power of two.
const CACHE_SHARDS: usize = 16;
/// How often the count of bucket keys is refreshed.
const KEY_COUNT_EVERY: Duration = Duration::from_secs(10);
/// Most checks one shared call carries (Redis runs nothing else while a script runs: about
/// 0.4 ms for this many on the machine of docs/benchmarks.md).
pub const MAX_CALL_CHECKS: usize = 64;
/// Most requests waiting for a call; beyond that a decision fails at once (each limiter's
/// `on_store_error` answers) instead of queueing without bound.
pub const MAX_WAITING: usize = 4096;

/// Where the Redis store connects. Its `Debug` and `Display` forms hide URL passwords.
#[derive(Clone, PartialEq, Eq)]
pub enum RedisTarget {
    /// One server (or a proxy in front of a primary): `redis://host:6379`.
    Standalone(String),
    /// A Redis Cluster, given by some of its nodes' URLs.
    Cluster(Vec<String>),
}

impl RedisTarget {
    /// The setting it comes from, as messages name it.
    pub fn setting(&self) -> &'static str {
        match self {
            RedisTarget::Standalone(_) => "store.url",
            RedisTarget::Cluster(_) => "store.cluster",
        }
    }

    fn urls(&self) -> Vec<&String> {
        match self {
            RedisTarget::Standalone(u) => vec![u],
            RedisTarget::Cluster(nodes) => nodes.iter().collect(),
        }
    }
}

impl std::fmt::Display for RedisTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RedisTarget::Standalone(u) => f.write_str(&crate::redact::url(u)),
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
}

/// How a `rediss://` server's certificate is verified.
#[derive(Clone)]
pub struct RedisTls {
    /// The trusted CA certificates (system roots and `store.ca_file`), PEM.
    roots_pem: Vec<u8>,
    /// Accept any certificate (`store.insecure_skip_verify`).
    insecure: bool,
}

impl RedisTls {
    /// The verification `store.ca_file` and `store.insecure_skip_verify` describe; `service`
    /// names the setting in errors and in the insecure warning.
    pub fn new(
        service: &str,
        ca_file: Option<&std::path::Path>,
        insecure_skip_verify: bool,
    ) -> Result<Self, StoreError> {
        crate::tls::install_provider();
        if insecure_skip_verify {
            tracing::warn!(
                service,
                "{service}: TLS certificate verification is OFF (store.insecure_skip_verify): anyone on the network path can impersonate Redis; development only"
            );
            return Ok(Self {
                roots_pem: Vec::new(),
                insecure: true,
            });
        }
        let certs = crate::tls::trusted_certificates(service, ca_file)
            .map_err(|e| StoreError(e.to_string()))?;
        Ok(Self {
            roots_pem: to_pem(&certs),
            insecure: false,
        })
    }

    fn certificates(&self) -> redis::TlsCertificates {
        redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(self.roots_pem.clone()),
        }
    }
}

/// Certificates as a PEM bundle (redis-rs takes its roots in that form).
fn to_pem(certs: &[rustls::pki_types::CertificateDer<'_>]) -> Vec<u8> {
    use base64::Engine;
    let mut out = String::new();
    for c in certs {
        out.push_str("-----BEGIN CERTIFICATE-----\n");
        let b64 = base64::engine::general_purpose::STANDARD.encode(c.as_ref());
        for line in b64.as_bytes().chunks(64) {
            out.push_str(&String::from_utf8_lossy(line));
            out.push('\n');
        }
        out.push_str("-----END CERTIFICATE-----\n");
    }
    out.into_bytes()
}

/// `url` with redis-rs's `#insecure` mark (no certificate verification).
fn insecure_url(url: &str) -> String {
    match url.split_once('#') {
        Some((base, _)) => format!("{base}#insecure"),
        None => format!("{url}#insecure"),
    }
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
            calls_in_flight: crate::config::defaults::STORE_CALLS_IN_FLIGHT,
            tls: None,
        }
    }
}

/// A connection that multiplexes every request of the process.
#[derive(Clone)]
enum Conn {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl Conn {
    async fn query(&self, cmd: &Cmd) -> RedisResult<Value> {
        match self.clone() {
            Conn::Single(mut c) => cmd.query_async(&mut c).await,
            Conn::Cluster(mut c) => cmd.query_async(&mut c).await,
        }
    }
}

struct Script {
    sha: String,
    src: &'static str,
}

impl Script {
    fn new(src: &'static str) -> Self {
        Self {
            sha: redis::Script::new(src).get_hash().to_owned(),
            src,
        }
    }

    /// `EVALSHA`, and `EVAL` (which also caches the script) when the server does not know it.
    /// `args` appends the keys and the arguments after the key count.
    async fn run(&self, conn: &Conn, nkeys: usize, args: impl Fn(&mut Cmd)) -> RedisResult<Value> {
        let build = |name: &str, body: &str| {
            let mut cmd = redis::cmd(name);
            cmd.arg(body).arg(nkeys);
            args(&mut cmd);
            cmd
        };
        match conn.query(&build("EVALSHA", &self.sha)).await {
            Err(e) if e.kind() == ErrorKind::NoScriptError => {
                conn.query(&build("EVAL", self.src)).await
            }
            other => other,
        }
    }
}

/// The Redis key of a bucket: the hash tag is the whole bucket name.
pub fn key_name(key: &BucketKey) -> String {
    format!("fl:{{{key}}}")
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
    /// Requests waiting for a shared call (standalone only).
    jobs: Option<tokio::sync::mpsc::Sender<Job>>,
    cache: OverLimitCache,
    errors: AtomicU64,
    failing: AtomicBool,
    errors_at_burst_start: AtomicU64,
    failures_in_row: AtomicU64,
    last_rebuild: Mutex<Option<std::time::Instant>>,
    round_trips: AtomicU64,
    refunds: AtomicU64,
    keys: AtomicU64,
    /// Why the last connection attempt failed, until one succeeds (for `/readyz` and logs).
    connect_error: Mutex<Option<String>>,
}

impl RedisStore {
    /// The store a configuration describes: `store.cluster` when given, else `store.url`.
    /// Waits up to two seconds for a first connection; without one the gateway still starts,
    /// answering with each limiter's `on_store_error` until Redis can be reached.
    pub fn from_config(cfg: &StoreConfig) -> Result<Self, StoreError> {
        let target = if !cfg.cluster.is_empty() {
            RedisTarget::Cluster(cfg.cluster.clone())
        } else {
            match &cfg.url {
                Some(u) => RedisTarget::Standalone(u.clone()),
                None => {
                    return Err(StoreError(
                        "the redis store needs store.url or store.cluster".into(),
                    ))
                }
            }
        };
        let mut opts = RedisOptions::new(cfg.timeout);
        opts.cache_capacity = cfg.max_keys;
        opts.calls_in_flight = cfg.calls_in_flight;
        let service = target.setting();
        if target.urls().iter().any(|u| u.starts_with("rediss://")) {
            opts.tls = Some(RedisTls::new(
                service,
                cfg.ca_file.as_deref(),
                cfg.insecure_skip_verify,
            )?);
        }
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
            RedisTarget::Standalone(u) => vec![u],
            RedisTarget::Cluster(nodes) if nodes.is_empty() => {
                return Err(StoreError("store.cluster lists no node".into()))
            }
            RedisTarget::Cluster(nodes) => nodes.iter().collect(),
        };
        for u in urls {
            redis::Client::open(u.as_str()).map_err(|e| {
                let e = e.to_string();
                StoreError(format!(
                    "redis URL `{}`: {}",
                    crate::redact::url(u),
                    crate::redact::urls_in(&e)
                ))
            })?;
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("fleet-limiter-redis")
            .enable_all()
            .build()
            .map_err(|e| StoreError(format!("cannot start the redis store's runtime: {e}")))?;
        let (tx, rx) = mpsc::channel();
        let cache = OverLimitCache::new(opts.cache_capacity);
        let (jobs, waiting) = match target {
            RedisTarget::Standalone(_) => {
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
            jobs,
            cache,
            errors: AtomicU64::new(0),
            failing: AtomicBool::new(false),
            errors_at_burst_start: AtomicU64::new(0),
            failures_in_row: AtomicU64::new(0),
            last_rebuild: Mutex::new(None),
            round_trips: AtomicU64::new(0),
            refunds: AtomicU64::new(0),
            keys: AtomicU64::new(0),
            connect_error: Mutex::new(None),
            opts,
        });
        inner.reconnect();
        let weak = Arc::downgrade(&inner);
        runtime.spawn(count_keys(weak.clone()));
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

    fn calls(&self) -> Option<u64> {
        Some(self.round_trips())
    }

    fn ping(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            let conn = self.inner.conn.read().clone();
            let Some(conn) = conn else {
                return Err(StoreError(
                    match self.inner.connect_error.lock().as_deref() {
                        Some(why) => format!("redis: not connected: {why}"),
                        None => "redis: not connected".into(),
                    },
                ));
            };
            match tokio::time::timeout(self.inner.opts.timeout, conn.query(&redis::cmd("PING")))
                .await
            {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(e)) => Err(StoreError(format!(
                    "redis: {}",
                    crate::redact::urls_in(&e.to_string())
                ))),
                Err(_) => Err(StoreError("redis: ping timed out".into())),
            }
        })
    }
}

/// One slot's share of a request, as the script answered it.
struct GroupAnswer {
    committed: bool,
    verdicts: Vec<Verdict>,
    before: Vec<String>,
    written: Vec<String>,
}

impl Inner {
    async fn decide(self: &Arc<Self>, checks: &[Check]) -> Result<Vec<Verdict>, StoreError> {
        if checks.is_empty() {
            return Ok(Vec::new());
        }
        if let Some(c) = checks.iter().find(|c| c.quota.window_ns() >= MAX_WINDOW_NS) {
            return Err(StoreError(format!(
                "limiter `{}`: the redis store computes windows up to 104 days",
                c.key.limiter
            )));
        }
        let local_now = self.opts.clock.now();
        if let Some(v) = self.cache.answer(checks, local_now) {
            return Ok(v);
        }
        let conn = self.conn.read().clone();
        let Some(conn) = conn else {
            self.reconnect();
            return Err(self.failed("not connected; reconnecting in the background".into()));
        };
        let verdicts = match &self.jobs {
            Some(jobs) => self.decide_shared(jobs, checks).await?,
            None => self.decide_by_slot(&conn, checks).await?,
        };
        self.succeeded();
        self.cache.remember(checks, &verdicts, local_now);
        Ok(verdicts)
    }

    /// Standalone: queue the request for the next shared call and wait for its answer.
    async fn decide_shared(
        self: &Arc<Self>,
        jobs: &tokio::sync::mpsc::Sender<Job>,
        checks: &[Check],
    ) -> Result<Vec<Verdict>, StoreError> {
        let deadline = tokio::time::Instant::now() + self.opts.timeout;
        let (reply, answer) = tokio::sync::oneshot::channel();
        let job = Job {
            keys: checks.iter().map(|c| key_name(&c.key)).collect(),
            checks: checks.iter().map(|c| (c.quota, c.advisory)).collect(),
            reply,
        };
        if let Err(e) = jobs.try_send(job) {
            let msg = match e {
                TrySendError::Full(_) => format!("{MAX_WAITING} decisions already wait for redis"),
                TrySendError::Closed(_) => "the store stopped".to_owned(),
            };
            return Err(self.failed(msg));
        }
        match tokio::time::timeout_at(deadline, answer).await {
            Ok(Ok(Ok(verdicts))) => Ok(verdicts),
            Ok(Ok(Err(msg))) => Err(self.failed(msg)),
            Ok(Err(_)) => Err(self.failed("the store stopped".into())),
            Err(_) => {
                self.failed_in_row();
                Err(self.failed(format!("no answer within {:?}", self.opts.timeout)))
            }
        }
    }

    /// Send one shared call for `jobs` and answer each of them.
    async fn run_jobs(self: Arc<Self>, jobs: Vec<Job>) {
        let conn = self.conn.read().clone();
        let Some(conn) = conn else {
            self.reconnect();
            for job in jobs {
                let _ = job
                    .reply
                    .send(Err("not connected; reconnecting in the background".into()));
            }
            return;
        };
        self.round_trips.fetch_add(1, Ordering::Relaxed);
        let now = self.now_args();
        let nkeys = jobs.iter().map(|j| j.keys.len()).sum();
        let args = |cmd: &mut Cmd| {
            for job in &jobs {
                cmd.arg(&job.keys);
            }
            self.push_clock(cmd, &now);
            for job in &jobs {
                cmd.arg(job.checks.len());
                for (quota, advisory) in &job.checks {
                    push_check(cmd, quota, *advisory);
                }
            }
        };
        let answer = self.batch.run(&conn, nkeys, args).await;
        match answer.and_then(|v| parse_shared(&v, &jobs)) {
            Ok(verdicts) => {
                for (job, v) in jobs.into_iter().zip(verdicts) {
                    let _ = job.reply.send(Ok(v));
                }
            }
            Err(e) => {
                if is_connection_error(&e) {
                    // Drop the broken connection (unless a fresh one already replaced it).
                    let mut slot = self.conn.write();
                    if slot.as_ref().is_some_and(|c| Arc::ptr_eq(c, &conn)) {
                        *slot = None;
                    }
                    drop(slot);
                    self.reconnect();
                } else {
                    self.failed_in_row();
                }
                let msg = e.to_string();
                for job in jobs {
                    let _ = job.reply.send(Err(msg.clone()));
                }
            }
        }
    }

    /// Cluster: one call per slot the request's keys sit on, sent at once; refunds when one
    /// slot refused while another consumed.
    async fn decide_by_slot(
        self: &Arc<Self>,
        conn: &Arc<Conn>,
        checks: &[Check],
    ) -> Result<Vec<Verdict>, StoreError> {
        self.round_trips.fetch_add(1, Ordering::Relaxed);
        let now = self.now_args();
        let keys: Vec<String> = checks.iter().map(|c| key_name(&c.key)).collect();
        let groups = self.groups(&keys);
        let calls = groups
            .iter()
            .map(|g| self.run_group(conn, checks, &keys, g, &now));
        let deadline = tokio::time::Instant::now() + self.opts.timeout;
        let answers = match tokio::time::timeout_at(deadline, join_all(calls)).await {
            Ok(a) => a,
            Err(_) => {
                self.failed_in_row();
                return Err(self.failed(format!("no answer within {:?}", self.opts.timeout)));
            }
        };
        let mut verdicts: Vec<Option<Verdict>> = vec![None; checks.len()];
        let mut done = Vec::with_capacity(groups.len());
        let mut error = None;
        for (g, a) in groups.iter().zip(answers) {
            match a {
                Ok(a) => {
                    for (&i, v) in g.iter().zip(&a.verdicts) {
                        verdicts[i] = Some(*v);
                    }
                    done.push((g, a));
                }
                Err(e) => error = Some(e),
            }
        }
        let blocked = error.is_some() || done.iter().any(|(_, a)| !a.committed);
        if blocked && groups.len() > 1 {
            let refund = self.give_back(conn, checks, &keys, &done, &now);
            if tokio::time::timeout_at(deadline, refund).await.is_err() {
                tracing::debug!("redis store: a refund did not finish within the timeout");
            }
        }
        if let Some(e) = error {
            self.failed_in_row();
            return Err(self.failed(e.to_string()));
        }
        match verdicts.into_iter().collect::<Option<Vec<_>>>() {
            Some(v) => Ok(v),
            None => Err(self.failed("the script left a check unanswered".into())),
        }
    }

    /// The checks' indices grouped by Cluster slot.
    fn groups(&self, keys: &[String]) -> Vec<Vec<usize>> {
        let mut by_slot: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
        for (i, k) in keys.iter().enumerate() {
            by_slot
                .entry(redis::cluster_routing::get_slot(k.as_bytes()))
                .or_default()
                .push(i);
        }
        by_slot.into_values().collect()
    }

    fn now_args(&self) -> [String; 2] {
        if self.opts.time_from_clock {
            let now = self.opts.clock.now();
            [
                (now / 1_000_000_000).to_string(),
                (now % 1_000_000_000).to_string(),
            ]
        } else {
            [String::new(), String::new()]
        }
    }

    /// The arguments every script starts with (`prelude.lua`'s ARGV[1..3]): now, and the
    /// padding added to every expiry.
    fn push_clock(&self, cmd: &mut Cmd, now: &[String; 2]) {
        cmd.arg(&now[0])
            .arg(&now[1])
            .arg(self.opts.ttl_pad.as_millis() as u64);
    }

    async fn run_group(
        &self,
        conn: &Conn,
        checks: &[Check],
        keys: &[String],
        group: &[usize],
        now: &[String; 2],
    ) -> RedisResult<GroupAnswer> {
        let args = |cmd: &mut Cmd| {
            for &i in group {
                cmd.arg(&keys[i]);
            }
            self.push_clock(cmd, now);
            for &i in group {
                push_check(cmd, &checks[i].quota, checks[i].advisory);
            }
        };
        let value = self.slot.run(conn, group.len(), args).await?;
        parse_answer(&value, group.iter().map(|&i| &checks[i].quota))
    }

    /// A different slot refused: give back what the committed groups consumed. Returns how
    /// many buckets were touched.
    async fn give_back(
        &self,
        conn: &Conn,
        checks: &[Check],
        keys: &[String],
        done: &[(&Vec<usize>, GroupAnswer)],
        now: &[String; 2],
    ) -> usize {
        let mut jobs = Vec::new();
        for (g, a) in done.iter().filter(|(_, a)| a.committed) {
            for (pos, &i) in g.iter().enumerate() {
                if a.written[pos].is_empty() {
                    continue;
                }
                let same: Vec<usize> = (0..g.len()).filter(|&p| keys[g[p]] == keys[i]).collect();
                let first = same.first().copied().unwrap_or(pos);
                let units = same.iter().filter(|&&p| a.verdicts[p].allowed).count();
                let q = &checks[i].quota;
                let algo = if q.algorithm == Algorithm::Gcra {
                    "g"
                } else {
                    "f"
                };
                let args = vec![
                    a.written[pos].clone(),
                    a.before[first].clone(),
                    algo.to_owned(),
                    q.emission_interval_ns().to_string(),
                    units.to_string(),
                ];
                jobs.push(([keys[i].clone()], args));
            }
        }
        if !jobs.is_empty() {
            self.refunds.fetch_add(1, Ordering::Relaxed);
            let calls = jobs.iter().map(|(k, args)| {
                self.refund.run(conn, 1, move |cmd: &mut Cmd| {
                    cmd.arg(k);
                    self.push_clock(cmd, now);
                    cmd.arg(args);
                })
            });
            for r in join_all(calls).await {
                if let Err(e) = r {
                    tracing::debug!(error = %e, "redis store: a refund failed");
                }
            }
        }
        jobs.len()
    }

    /// Build a connection in the background (once at a time), retrying until it works.
    fn reconnect(self: &Arc<Self>) {
        if self.reconnecting.swap(true, Ordering::AcqRel) {
            return;
        }
        let weak = Arc::downgrade(self);
        self.handle.spawn(async move {
            let mut delay = Duration::from_millis(25);
            loop {
                let Some(inner) = weak.upgrade() else { return };
                let attempt =
                    tokio::time::timeout(inner.opts.connect_timeout, inner.connect()).await;
                match attempt {
                    Ok(Ok(conn)) => {
                        *inner.conn.write() = Some(Arc::new(conn));
                        *inner.connect_error.lock() = None;
                        inner.failures_in_row.store(0, Ordering::Relaxed);
                        inner.reconnecting.store(false, Ordering::Release);
                        if let Some(tx) = inner.first_connect.lock().take() {
                            let _ = tx.send(());
                        }
                        tracing::debug!("redis store connected");
                        return;
                    }
                    Ok(Err(e)) => {
                        let e = crate::redact::urls_in(&e.to_string()).into_owned();
                        let service = inner.target.setting();
                        let why = match crate::tls::certificate_problem_in(&e) {
                            Some(why) => format!("{service}: TLS: {why}; trust the server's CA with store.ca_file (FLEET_LIMITER_STORE_CA_FILE)"),
                            None => format!("{service}: {e}"),
                        };
                        let mut last = inner.connect_error.lock();
                        // A certificate problem is a configuration error: say it once per
                        // distinct reason, at warning level (retrying will not fix it).
                        if why.contains(": TLS: ") && last.as_deref() != Some(why.as_str()) {
                            tracing::warn!(error = %why, "redis store: the TLS handshake failed");
                        } else {
                            tracing::debug!(error = %why, "redis store: connection attempt failed");
                        }
                        *last = Some(why);
                    }
                    Err(_) => {
                        tracing::debug!("redis store: connection attempt timed out");
                        *inner.connect_error.lock() = Some(format!(
                            "{}: connection attempt timed out",
                            inner.target.setting()
                        ));
                    }
                }
                drop(inner);
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(1));
            }
        });
    }

    async fn connect(&self) -> RedisResult<Conn> {
        let ct = self.opts.connect_timeout;
        match &self.target {
            RedisTarget::Standalone(url) => {
                let client = match &self.opts.tls {
                    Some(t) if url.starts_with("rediss://") && t.insecure => {
                        redis::Client::open(insecure_url(url).as_str())?
                    }
                    Some(t) if url.starts_with("rediss://") => {
                        redis::Client::build_with_tls(url.as_str(), t.certificates())?
                    }
                    _ => redis::Client::open(url.as_str())?,
                };
                let cfg = redis::AsyncConnectionConfig::new()
                    .set_connection_timeout(ct)
                    .set_response_timeout(ct);
                Ok(Conn::Single(
                    client
                        .get_multiplexed_async_connection_with_config(&cfg)
                        .await?,
                ))
            }
            RedisTarget::Cluster(nodes) => {
                let tls = self
                    .opts
                    .tls
                    .as_ref()
                    .filter(|_| nodes.iter().all(|u| u.starts_with("rediss://")));
                let nodes: Vec<String> = match tls {
                    Some(t) if t.insecure => nodes.iter().map(|u| insecure_url(u)).collect(),
                    _ => nodes.clone(),
                };
                let mut builder = redis::cluster::ClusterClientBuilder::new(nodes)
                    .connection_timeout(ct)
                    .response_timeout(ct)
                    .retries(2);
                if let Some(t) = tls.filter(|t| !t.insecure) {
                    builder = builder.certs(t.certificates());
                }
                let client = builder.build()?;
                Ok(Conn::Cluster(client.get_async_connection().await?))
            }
        }
    }

    /// Another failure in a row: after a few, build a fresh connection beside the current one
    /// (it replaces it once connected), at most once per [`REBUILD_EVERY`].
    fn failed_in_row(self: &Arc<Self>) {
        let n = self.failures_in_row.fetch_add(1, Ordering::Relaxed) + 1;
        if n < FAILURES_BEFORE_REBUILD {
            return;
        }
        {
            let mut last = self.last_rebuild.lock();
            if last.is_some_and(|t| t.elapsed() < REBUILD_EVERY) {
                return;
            }
            *last = Some(std::time::Instant::now());
        }
        self.reconnect();
    }

    /// Count an error; log only the first of a burst.
    fn failed(&self, msg: String) -> StoreError {
        let msg = crate::redact::urls_in(&msg).into_owned();
        let total = self.errors.fetch_add(1, Ordering::Relaxed) + 1;
        if !self.failing.swap(true, Ordering::AcqRel) {
            self.errors_at_burst_start
                .store(total - 1, Ordering::Relaxed);
            tracing::warn!(
                error = %msg,
                "redis store failing: limiters answer with their on_store_error until it recovers"
            );
        }
        StoreError(format!("redis: {msg}"))
    }

    fn succeeded(&self) {
        self.failures_in_row.store(0, Ordering::Relaxed);
        if self.failing.swap(false, Ordering::AcqRel) {
            let since = self.errors.load(Ordering::Relaxed)
                - self.errors_at_burst_start.load(Ordering::Relaxed);
            tracing::info!(failed_decisions = since, "redis store answering again");
        }
    }
}

/// A standalone request waiting for a shared call.
struct Job {
    keys: Vec<String>,
    checks: Vec<(Quota, bool)>,
    reply: tokio::sync::oneshot::Sender<Result<Vec<Verdict>, String>>,
}

/// The store's batching loop (standalone): while fewer than `calls_in_flight` calls are out,
/// send everything that waits (up to [`MAX_CALL_CHECKS`] checks) as one call, in arrival order.
/// Requests whose caller already gave up are dropped before they reach Redis.
async fn share_calls(
    weak: Weak<Inner>,
    mut waiting: tokio::sync::mpsc::Receiver<Job>,
    calls_in_flight: usize,
) {
    use futures_util::stream::{FuturesUnordered, StreamExt};
    let mut in_flight = FuturesUnordered::new();
    let mut next: Option<Job> = None;
    loop {
        let first = tokio::select! {
            biased;
            Some(()) = in_flight.next(), if !in_flight.is_empty() => continue,
            job = async {
                match next.take() {
                    Some(job) => Some(job),
                    None => waiting.recv().await,
                }
            }, if in_flight.len() < calls_in_flight => job,
        };
        let Some(first) = first else { return };
        let Some(inner) = weak.upgrade() else { return };
        let mut checks = first.checks.len();
        let mut jobs = vec![first];
        while let Ok(job) = waiting.try_recv() {
            if checks + job.checks.len() > MAX_CALL_CHECKS {
                next = Some(job);
                break;
            }
            checks += job.checks.len();
            jobs.push(job);
        }
        jobs.retain(|j| !j.reply.is_closed());
        if !jobs.is_empty() {
            in_flight.push(inner.run_jobs(jobs));
        }
    }
}

/// The five script arguments of one check (see `gcra.lua`).
fn push_check(cmd: &mut Cmd, q: &Quota, advisory: bool) {
    let limit = q.limit.max(1) as u64;
    let (algo, p, burst) = match q.algorithm {
        Algorithm::Gcra => {
            let t = q.emission_interval_ns();
            ("g", t, t.saturating_mul(limit))
        }
        Algorithm::FixedWindow => ("f", q.window_ns(), 0),
    };
    cmd.arg(algo)
        .arg(limit)
        .arg(p)
        .arg(burst)
        .arg(if advisory { "1" } else { "0" });
}

fn int(v: &Value) -> RedisResult<i64> {
    match v {
        Value::Int(i) => Ok(*i),
        other => redis::from_redis_value(other),
    }
}

/// A check's four integers from a script's answer: allowed, remaining, reset after, retry after.
fn verdict(q: &Quota, v: &[Value]) -> RedisResult<Verdict> {
    Ok(Verdict {
        allowed: int(&v[0])? == 1,
        limit: q.limit.max(1),
        remaining: int(&v[1])?.clamp(0, u32::MAX as i64) as u32,
        reset_after_ns: int(&v[2])?.max(0) as u64,
        retry_after_ns: int(&v[3])?.max(0) as u64,
    })
}

fn unexpected() -> RedisError {
    RedisError::from((
        ErrorKind::TypeError,
        "unexpected answer from the decision script",
    ))
}

/// `batch.lua`'s answer: per request, committed then four integers per check.
fn parse_shared(value: &Value, jobs: &[Job]) -> RedisResult<Vec<Vec<Verdict>>> {
    let Value::Array(items) = value else {
        return Err(unexpected());
    };
    let want: usize = jobs.iter().map(|j| 1 + 4 * j.checks.len()).sum();
    if items.len() != want {
        return Err(unexpected());
    }
    let mut at = 0;
    let mut out = Vec::with_capacity(jobs.len());
    for job in jobs {
        at += 1; // committed: the verdicts already say it
        let mut verdicts = Vec::with_capacity(job.checks.len());
        for (q, _) in &job.checks {
            verdicts.push(verdict(q, &items[at..at + 4])?);
            at += 4;
        }
        out.push(verdicts);
    }
    Ok(out)
}

fn is_connection_error(e: &RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() || e.is_timeout()
}

fn parse_answer<'q>(
    value: &Value,
    quotas: impl ExactSizeIterator<Item = &'q Quota>,
) -> RedisResult<GroupAnswer> {
    let n = quotas.len();
    let Value::Array(items) = value else {
        return Err(unexpected());
    };
    if items.len() != 1 + 6 * n {
        return Err(unexpected());
    }
    let text = |i: usize| -> RedisResult<String> { redis::from_redis_value(&items[i]) };
    let committed = int(&items[0])? == 1;
    let mut verdicts = Vec::with_capacity(n);
    for (k, q) in quotas.enumerate() {
        let b = 1 + 4 * k;
        verdicts.push(verdict(q, &items[b..b + 4])?);
    }
    let mut before = Vec::with_capacity(n);
    let mut written = Vec::with_capacity(n);
    for k in 0..n {
        let b = 1 + 4 * n + 2 * k;
        before.push(text(b)?);
        written.push(text(b + 1)?);
    }
    Ok(GroupAnswer {
        committed,
        verdicts,
        before,
        written,
    })
}

/// Keys of the limiter's buckets (`fl:{<limiter>:<hex digest>}`); nothing else matches.
const BUCKET_PATTERN: &str = "fl:{*";
/// Keys one SCAN step examines.
const SCAN_COUNT: usize = 1000;
/// Most SCAN steps one refresh takes per node (a million keys examined). Beyond that the count
/// is of the part examined: a lower bound.
const MAX_SCAN_STEPS: usize = 1000;

/// Refresh the count of bucket keys until the store is dropped: off the request path, one
/// bounded SCAN pass per node every [`KEY_COUNT_EVERY`], each step bounded by the connect timeout.
async fn count_keys(weak: Weak<Inner>) {
    loop {
        tokio::time::sleep(KEY_COUNT_EVERY).await;
        let Some(inner) = weak.upgrade() else { return };
        let conn = inner.conn.read().clone();
        if let Some(conn) = conn {
            if let Some(n) = count_buckets(&inner, &conn).await {
                inner.keys.store(n, Ordering::Relaxed);
            }
        }
    }
}

/// Bucket keys on a standalone server, or on every master of a Cluster.
async fn count_buckets(inner: &Inner, conn: &Conn) -> Option<u64> {
    match conn {
        Conn::Single(_) => scan_node(inner, conn, None).await,
        Conn::Cluster(_) => {
            let mut total = 0;
            for node in masters(inner, conn).await? {
                total += scan_node(inner, conn, Some(node)).await?;
            }
            Some(total)
        }
    }
}

/// `host:port` of each Cluster master that is not failing, from `CLUSTER NODES`.
async fn masters(inner: &Inner, conn: &Conn) -> Option<Vec<(String, u16)>> {
    let mut cmd = redis::cmd("CLUSTER");
    cmd.arg("NODES");
    let v = tokio::time::timeout(inner.opts.connect_timeout, conn.query(&cmd))
        .await
        .ok()?
        .ok()?;
    let text: String = redis::from_redis_value(&v).ok()?;
    let nodes = text
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let addr = fields.nth(1)?;
            let flags = fields.next()?;
            if !flags.split(',').any(|f| f == "master") || flags.contains("fail") {
                return None;
            }
            let hostport = addr.split('@').next()?;
            let (host, port) = hostport.rsplit_once(':')?;
            Some((host.to_owned(), port.parse().ok()?))
        })
        .collect();
    Some(nodes)
}

/// Bucket keys on one node (`None`: the standalone server), by `SCAN ... MATCH fl:{*`.
async fn scan_node(inner: &Inner, conn: &Conn, node: Option<(String, u16)>) -> Option<u64> {
    use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
    let mut cursor: u64 = 0;
    let mut found = 0u64;
    for _ in 0..MAX_SCAN_STEPS {
        let mut cmd = redis::cmd("SCAN");
        cmd.arg(cursor)
            .arg("MATCH")
            .arg(BUCKET_PATTERN)
            .arg("COUNT")
            .arg(SCAN_COUNT);
        let step = async {
            match (conn, &node) {
                (Conn::Cluster(c), Some((host, port))) => {
                    let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                        host: host.clone(),
                        port: *port,
                    });
                    c.clone().route_command(&cmd, routing).await
                }
                _ => conn.query(&cmd).await,
            }
        };
        let v = tokio::time::timeout(inner.opts.connect_timeout, step)
            .await
            .ok()?
            .ok()?;
        let (next, keys): (u64, Vec<Value>) = redis::from_redis_value(&v).ok()?;
        found += keys.len() as u64;
        cursor = next;
        if cursor == 0 {
            break;
        }
    }
    Some(found)
}

/// What a refused request looked like, so an identical one can be answered without Redis.
struct Snapshot {
    checks: Vec<(BucketKey, Quota, bool)>,
    verdicts: Vec<Verdict>,
    at: Nanos,
    /// The earliest instant one of its refusals ends.
    until: Nanos,
}

impl Snapshot {
    fn matches(&self, checks: &[Check]) -> bool {
        self.checks.len() == checks.len()
            && self
                .checks
                .iter()
                .zip(checks)
                .all(|((k, q, a), c)| *k == c.key && *q == c.quota && *a == c.advisory)
    }

    fn at_time(&self, now: Nanos) -> Vec<Verdict> {
        let elapsed = now.saturating_sub(self.at);
        self.verdicts
            .iter()
            .map(|v| Verdict {
                reset_after_ns: v.reset_after_ns.saturating_sub(elapsed),
                retry_after_ns: v.retry_after_ns.saturating_sub(elapsed),
                ..*v
            })
            .collect()
    }
}

#[derive(Default)]
struct CacheShard {
    map: HashMap<BucketKey, Arc<Snapshot>>,
    next_sweep: Nanos,
}

/// The local over-limit cache: refused buckets -> the refusal, until it ends. Bounded.
struct OverLimitCache {
    shards: Box<[Mutex<CacheShard>]>,
    per_shard: usize,
    hits: AtomicU64,
}

impl OverLimitCache {
    fn new(capacity: usize) -> Self {
        Self {
            shards: (0..CACHE_SHARDS)
                .map(|_| Mutex::new(CacheShard::default()))
                .collect(),
            per_shard: capacity.div_ceil(CACHE_SHARDS),
            hits: AtomicU64::new(0),
        }
    }

    fn shard(&self, key: &BucketKey) -> &Mutex<CacheShard> {
        &self.shards[key.digest[0] as usize % CACHE_SHARDS]
    }

    fn answer(&self, checks: &[Check], now: Nanos) -> Option<Vec<Verdict>> {
        if self.per_shard == 0 {
            return None;
        }
        for c in checks.iter().filter(|c| !c.advisory) {
            let snap = self.shard(&c.key).lock().map.get(&c.key).cloned();
            if let Some(s) = snap {
                if now < s.until && s.matches(checks) {
                    self.hits.fetch_add(1, Ordering::Relaxed);
                    return Some(s.at_time(now));
                }
            }
        }
        None
    }

    fn remember(&self, checks: &[Check], verdicts: &[Verdict], now: Nanos) {
        if self.per_shard == 0 {
            return;
        }
        let refusing = checks
            .iter()
            .zip(verdicts)
            .any(|(c, v)| !c.advisory && !v.allowed);
        if !refusing {
            return;
        }
        let wait = verdicts
            .iter()
            .filter(|v| !v.allowed)
            .map(|v| v.retry_after_ns)
            .min()
            .unwrap_or(0);
        if wait == 0 {
            return;
        }
        let snap = Arc::new(Snapshot {
            checks: checks
                .iter()
                .map(|c| (c.key.clone(), c.quota, c.advisory))
                .collect(),
            verdicts: verdicts.to_vec(),
            at: now,
            until: now.saturating_add(wait),
        });
        for (c, _) in checks
            .iter()
            .zip(verdicts)
            .filter(|(c, v)| !c.advisory && !v.allowed)
        {
            let mut shard = self.shard(&c.key).lock();
            if shard.map.len() >= self.per_shard && !shard.map.contains_key(&c.key) {
                if now >= shard.next_sweep {
                    shard.map.retain(|_, s| s.until > now);
                    shard.next_sweep = now.saturating_add(1_000_000_000);
                }
                if shard.map.len() >= self.per_shard {
                    continue;
                }
            }
            shard.map.insert(c.key.clone(), snap.clone());
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().map.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    fn check(limiter: &str, principal: &str, limit: u32, secs: u64, advisory: bool) -> Check {
        Check {
            key: BucketKey::new(Arc::from(limiter), principal),
            quota: Quota::gcra(limit, Duration::from_secs(secs)),
            advisory,
        }
    }

    fn refused(retry_s: u64) -> Verdict {
        Verdict {
            allowed: false,
            limit: 1,
            remaining: 0,
            reset_after_ns: retry_s * 2_000_000_000,
            retry_after_ns: retry_s * 1_000_000_000,
        }
    }

    fn allowed() -> Verdict {
        Verdict {
            allowed: true,
            limit: 10,
            remaining: 5,
            reset_after_ns: 3_000_000_000,
            retry_after_ns: 0,
        }
    }

    #[test]
    fn key_names_are_one_hash_tag_per_bucket() {
        let k = BucketKey::new(Arc::from("agent-device"), "1.2.3.4|a1");
        let name = key_name(&k);
        assert_eq!(name, format!("fl:{{agent-device:{}}}", k.digest_hex()));
        assert!(!name.contains("1.2.3.4"), "only digests reach Redis");
    }

    #[test]
    fn cache_answers_identical_requests_until_the_refusal_ends() {
        let clock = ManualClock::new(0);
        let cache = OverLimitCache::new(100);
        let checks = [
            check("a", "k", 1, 60, false),
            check("b", "k", 10, 60, false),
        ];
        cache.remember(&checks, &[refused(10), allowed()], clock.now());
        let v = cache.answer(&checks, 4_000_000_000).expect("cached");
        assert!(!v[0].allowed);
        assert_eq!(v[0].retry_after_ns, 6_000_000_000);
        assert_eq!(
            v[1],
            Verdict {
                reset_after_ns: 0,
                ..allowed()
            }
        );
        assert!(
            cache.answer(&checks, 10_000_000_000).is_none(),
            "the refusal has ended"
        );
        assert!(
            cache.answer(&checks[..1], 1).is_none(),
            "different buckets ask Redis"
        );
        assert_eq!(cache.hits.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn cache_ignores_advisory_refusals_and_stays_bounded() {
        let cache = OverLimitCache::new(CACHE_SHARDS * 2);
        let shadow = [check("s", "k", 1, 60, true)];
        cache.remember(&shadow, &[refused(5)], 0);
        assert_eq!(cache.len(), 0);
        for i in 0..1000 {
            let c = [check("a", &format!("k{i}"), 1, 60, false)];
            cache.remember(&c, &[refused(5)], 0);
        }
        assert!(cache.len() <= CACHE_SHARDS * 2);
        // Once they expire, new refusals take their place.
        let c = [check("a", "late", 1, 60, false)];
        for i in 0..200 {
            let c = [check("z", &format!("late{i}"), 1, 60, false)];
            cache.remember(&c, &[refused(5)], 6_000_000_000);
        }
        cache.remember(&c, &[refused(5)], 6_000_000_000);
        assert!(cache.len() <= CACHE_SHARDS * 2);
        assert!(cache.len() > 0);
    }

    #[test]
    fn disabled_cache_never_answers() {
        let cache = OverLimitCache::new(0);
        let c = [check("a", "k", 1, 60, false)];
        cache.remember(&c, &[refused(5)], 0);
        assert!(cache.answer(&c, 1).is_none());
    }
}
