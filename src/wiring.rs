//! The process assembled from a configuration: the store it names (memory, with the buckets of
//! `store.state_file` restored, or Redis), the token verifier of `[identity]`, and the decider
//! over both. The entry points (`serve`, the middleware, the library's users) call this; it
//! calls down into the modules and nothing calls back up into it.

use crate::error::Error;
use crate::{clock, config, decision, identity, known_agents, store};
use std::sync::Arc;

/// The decider a configuration describes: its store, the system clock, its token verifier.
pub fn build_decider(cfg: &config::Config) -> Result<decision::Decider, Error> {
    if let Some(what) = config::covers_everything(&cfg.client_ip.trusted.ranges) {
        // Only reachable with client_ip.trust_all_addresses; the configuration refuses it otherwise.
        tracing::warn!(
            "client_ip.trust_proxy covers {what} and client_ip.trust_all_addresses is set: every client IP is read from X-Forwarded-For (or Forwarded) as it reaches the gateway, so this is safe only while every request comes through a proxy that overwrites that header"
        );
    }
    let store: Arc<dyn store::Store> = match cfg.store.backend {
        config::StoreBackend::Memory => {
            let mut memory = store::memory::MemoryStore::new(
                cfg.store.max_keys,
                Arc::new(clock::SystemClock::new()),
            );
            let known = match &cfg.store.state_file {
                Some(path) => restore_state(&mut memory, path, cfg)?,
                None => None,
            };
            let memory = Arc::new(memory);
            let decider = decision::Decider::new(cfg, memory.clone(), build_verifier(cfg)?);
            if let Some((key, kept)) = known {
                let now = store::Store::clock(&*memory)
                    .map(|c| c.now())
                    .unwrap_or_default();
                decider.known_agents().restore(key, &kept, now);
            }
            return Ok(decider);
        }
        config::StoreBackend::Redis => {
            let (target, opts) = redis_settings(&cfg.store)?;
            let redis = store::redis::RedisStore::start(target.clone(), opts)?;
            if cfg.store.require && !redis.is_connected() {
                return Err(unreachable_required(cfg, &target, redis.connect_error()));
            }
            Arc::new(redis)
        }
    };
    Ok(decision::Decider::new(cfg, store, build_verifier(cfg)?))
}

/// `store.require = true` and the store did not answer within the start's wait: the setting
/// that names the store, where it was set, why it cannot be reached, and the two ways on.
fn unreachable_required(
    cfg: &config::Config,
    target: &store::redis::RedisTarget,
    why: Option<String>,
) -> Error {
    let setting = target.setting();
    Error::config(format!(
        "{}: {setting}: the Redis store {target} cannot be reached ({}), and store.require = true (set in {}) refuses to start without it; start Redis or correct {setting}, or remove store.require to start anyway, each limiter answering with its on_store_error until Redis answers",
        cfg.origin(setting),
        why.as_deref().unwrap_or("no answer within 2 s"),
        cfg.origin("store.require"),
    ))
}

/// The buckets `store.state_file` kept, if it can be used, taken by `memory`; the known agents
/// it kept are returned, for the decider built on `memory`. What was done is logged either way.
/// The known agents a state file kept: their table's digest key, and the ids.
type KeptAgents = ((u64, u64), Vec<known_agents::Kept>);

/// Start-up stops when another instance holds the file, or when the path is not a regular file
/// (a symbolic link, a FIFO, a device, a directory): writing there at the end would harm it.
fn restore_state(
    memory: &mut store::memory::MemoryStore,
    path: &std::path::Path,
    cfg: &config::Config,
) -> Result<Option<KeptAgents>, Error> {
    use store::state_file::{read, Bounds, Read};
    store::state_file::lock(path).map_err(|why| {
        Error::config(format!(
            "store.state_file: {} cannot be used: {why}",
            path.display()
        ))
    })?;
    use store::Store;
    let bounds = Bounds {
        buckets: memory.capacity(),
        known: cfg.store.max_keys,
        // No limiter's state reaches further ahead than its window plus its lockout.
        horizon: cfg
            .limiters
            .iter()
            .map(|l| l.quota.window() + l.quota.lockout().unwrap_or_default())
            .max()
            .unwrap_or_default(),
        known_for: cfg
            .limiters
            .iter()
            .filter_map(|l| l.new_agents.map(|r| r.known_for))
            .max()
            .unwrap_or_default(),
    };
    let now = memory.clock().map(|c| c.now()).unwrap_or_default();
    let shown = path.display();
    let started = std::time::Instant::now();
    match read(path, now, bounds) {
        Read::Missing => {
            tracing::info!(
                "store.state_file: {shown} does not exist yet; starting with no bucket (it is written when the gateway stops)"
            );
            Ok(None)
        }
        Read::Ignored(why) => {
            tracing::warn!("store.state_file: {shown} is not used: {why}; starting with no bucket");
            Ok(None)
        }
        Read::Refused(what) => Err(Error::config(format!(
            "store.state_file: {shown} is {what}, not a regular file; point store.state_file (FLEET_LIMITER_STORE_STATE_FILE) at a regular file, or at a path that does not exist yet, in a directory only this user can write"
        ))),
        Read::Restored(r) => {
            tracing::info!(
                buckets = r.snapshot.buckets.len(),
                known_agents = r.snapshot.known.len(),
                expired = r.expired,
                out_of_range = r.out_of_range,
                stopped_seconds = r.elapsed.as_secs_f64(),
                "store.state_file: buckets restored from {shown}, the time since they were written counted"
            );
            if r.out_of_range > 0 {
                tracing::warn!(
                    out_of_range = r.out_of_range,
                    "store.state_file: {shown} holds states further ahead than any limiter's window, lockout or known_for; they were not restored"
                );
            }
            let snapshot = r.snapshot;
            memory.restore(snapshot.buckets_key, snapshot.buckets);
            tracing::info!(
                milliseconds = started.elapsed().as_secs_f64() * 1e3,
                "store.state_file: read and restored"
            );
            Ok(Some((snapshot.known_key, snapshot.known)))
        }
    }
}

/// Where and how the Redis store connects, from `[store]`: `store.cluster` when given, else
/// `store.url`; TLS for `rediss://` with `store.ca_file` and `store.insecure_skip_verify`.
pub fn redis_settings(
    cfg: &config::StoreConfig,
) -> Result<(store::redis::RedisTarget, store::redis::RedisOptions), store::StoreError> {
    use store::redis::{RedisOptions, RedisTarget, RedisTls};
    let target = if !cfg.cluster.is_empty() {
        RedisTarget::Cluster(cfg.cluster.clone())
    } else {
        match &cfg.url {
            Some(u) if store::redis::is_sentinel_url(u) => RedisTarget::Sentinel(u.clone()),
            Some(u) => RedisTarget::Standalone(u.clone()),
            None => {
                return Err(store::StoreError::new(
                    store::StoreErrorKind::Config,
                    "the redis store needs store.url or store.cluster",
                ))
            }
        }
    };
    let mut opts = RedisOptions::new(cfg.timeout);
    opts.cache_capacity = cfg.max_keys;
    opts.local_keys = cfg.max_keys;
    opts.calls_in_flight = cfg.calls_in_flight;
    if target.uses_tls() {
        opts.tls = Some(RedisTls::new(
            target.setting(),
            cfg.ca_file.as_deref(),
            cfg.insecure_skip_verify,
        )?);
    }
    Ok((target, opts))
}

/// The token verifier `[identity]` describes; with no key source no token verifies.
pub fn build_verifier(cfg: &config::Config) -> Result<Arc<dyn identity::TokenVerifier>, Error> {
    if let Some(why) = cfg.identity.weak_secret() {
        // Only reachable with identity.allow_weak_secret; the configuration refuses it otherwise.
        tracing::warn!(
            "identity.jwt_hs256_secret is weak ({why}) and identity.allow_weak_secret is set: anyone who can guess the secret can mint dashboard users; never run this in production"
        );
    }
    if let Some(w) = cfg.identity.plain_http_warning() {
        // Only reachable with identity.jwks_allow_http; the configuration refuses it otherwise.
        tracing::warn!("{w}");
    }
    let clock = Arc::new(clock::SystemClock::new());
    let wall = Arc::new(identity::jwt::SystemWallClock);
    Ok(
        match identity::jwt::JwtVerifier::from_config(&cfg.identity, clock, wall)? {
            Some(v) => {
                // The key set is fetched once at start: a certificate that does not verify is a
                // configuration error, found now rather than at the first token; any other
                // failure is logged at error level and verified identity is unavailable until
                // a fetch succeeds.
                if let Some(jwks) = v.jwks() {
                    jwks.check_at_start()?;
                }
                Arc::new(v)
            }
            None => Arc::new(identity::NoVerifier),
        },
    )
}
