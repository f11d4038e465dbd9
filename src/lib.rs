//! fleet-limiter: a principal-keyed rate limiter for agent-fleet HTTP APIs.
//!
//! One request flows one way through one module per step:
//!
//! | step | module | what it does |
//! |---|---|---|
//! | client IP | [`client_ip`] | peer address, or the rightmost untrusted hop behind trusted proxies |
//! | identity | [`identity`] | agent id, verified dashboard user, credential kind |
//! | policy | [`policy`] | which limiters meter the request (routes, groups, credentials) |
//! | keys | [`keys`] | principal keys, IP normalisation, digests |
//! | store | [`store`] | one decision per key, memory or Redis, same math from [`limiter`] |
//! | decision | [`decision`] | runs the steps above; all limiters must allow |
//! | response | [`http::response`] | `RateLimit*` headers, or 429 problem+json with `Retry-After` |
//! | proxy | [`http::proxy`] | streams allowed requests to the upstream and back |
//!
//! Around them: [`metrics`] and [`observe`] count and log each decision; [`http::admin`] serves
//! `/metrics`, health and reload, and handles signals; [`http::cors`] lets browsers read refusals.
//!
//! [`config`] turns TOML, environment and flags into a validated [`config::Config`];
//! [`clock`] injects time so every limiter can run in virtual time. [`tls`] builds the TLS
//! client and listener configurations.
//! [`calibration`] checks a configuration against the fleet it must carry and simulates it.
//! [`tls`] builds the TLS client configuration every outgoing connection (JWKS, Redis) uses.

#[cfg(test)]
#[macro_use]
#[path = "../tests/support/macros.rs"]
mod test_macros;

pub mod calibration;
pub mod client_ip;
pub mod clock;
pub mod config;
pub mod decision;
pub mod http;
pub mod identity;
pub mod keys;
pub mod limiter;
pub mod log_sink;
pub mod metrics;
pub(crate) mod observe;
pub mod path;
pub mod policy;
pub mod redact;
pub mod store;
pub(crate) mod tls;

use std::sync::Arc;

/// The decider a configuration describes: its store, the system clock, its token verifier.
pub fn build_decider(cfg: &config::Config) -> anyhow::Result<decision::Decider> {
    if let Some(what) = config::covers_everything(&cfg.client_ip.trusted.ranges) {
        // Only reachable with client_ip.trust_all_addresses; the configuration refuses it otherwise.
        tracing::warn!(
            "client_ip.trust_proxy covers {what} and client_ip.trust_all_addresses is set: every client IP is read from X-Forwarded-For (or Forwarded) as it reaches the gateway, so this is safe only while every request comes through a proxy that overwrites that header"
        );
    }
    let store: Arc<dyn store::Store> = match cfg.store.backend {
        config::StoreBackend::Memory => Arc::new(store::memory::MemoryStore::new(
            cfg.store.max_keys,
            Arc::new(clock::SystemClock::new()),
        )),
        config::StoreBackend::Redis => {
            let (target, opts) = redis_settings(&cfg.store)?;
            Arc::new(store::redis::RedisStore::start(target, opts)?)
        }
    };
    Ok(decision::Decider::new(cfg, store, build_verifier(cfg)?))
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
pub fn build_verifier(cfg: &config::Config) -> anyhow::Result<Arc<dyn identity::TokenVerifier>> {
    if let Some(why) = cfg.identity.weak_secret() {
        // Only reachable with identity.allow_weak_secret; the configuration refuses it otherwise.
        tracing::warn!(
            "identity.jwt_hs256_secret is weak ({why}) and identity.allow_weak_secret is set: anyone who can guess the secret can mint dashboard users; never run this in production"
        );
    }
    let clock = Arc::new(clock::SystemClock::new());
    let wall = Arc::new(identity::jwt::SystemWallClock);
    Ok(
        match identity::jwt::JwtVerifier::from_config(&cfg.identity, clock, wall)? {
            Some(v) => {
                // An https:// key set is fetched once at start: a certificate that does not
                // verify is a configuration error, found now rather than at the first token.
                if let Some(jwks) = v.jwks().filter(|j| j.is_https()) {
                    jwks.check_at_start()?;
                }
                Arc::new(v)
            }
            None => Arc::new(identity::NoVerifier),
        },
    )
}
