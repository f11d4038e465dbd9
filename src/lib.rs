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
//! | admission | `admission` | caps allowed requests in flight to the upstream; a short queue, then 503 |
//! | proxy | [`http::proxy`] | streams allowed requests to the upstream and back |
//!
//! Around them: [`metrics`] and the decision's observer count and log each decision;
//! [`http::admin`] serves `/metrics`, health and reload, and handles signals; [`http::cors`] lets
//! browsers read refusals.
//!
//! [`config`] turns TOML, environment and flags into a validated [`config::Config`];
//! [`clock`] injects time so every limiter can run in virtual time. `tls` builds the TLS
//! client and listener configurations every outgoing connection (JWKS, Redis, upstream) and the
//! listener use. [`calibration`] checks a configuration against the fleet it must carry,
//! simulates it and replays access logs through it.

//!
//! # The public API
//!
//! What an embedder needs is listed here and is the supported API. The other modules are
//! public too, because the integration tests, benches and the binary reach into them, but they
//! are not a stable API. The binary (`src/main.rs`) is argument parsing over [`serve::run`] and
//! [`calibration`] (the `check`, `simulate` and `replay` commands).
//!
//! - [`http::middleware::FleetLimiter`]: the actix-web middleware, built from a configuration.
//! - [`Error`]: what [`build_decider`], [`FleetLimiter::from_config`](http::middleware::FleetLimiter::from_config)
//!   and [`http::serve_gateway`] return when they cannot build or run, with its exit code.
//! - [`config::Loader`] and [`config::Config`]: defaults, TOML, `FLEET_LIMITER_*`, flags.
//! - [`decision::Decider`]: the limiter with no HTTP in it, fed [`decision::RequestFacts`].
//! - [`store::Store`]: the store trait, with [`store::memory::MemoryStore`] and
//!   [`store::redis::RedisStore`]; [`limiter::Quota`] and [`limiter::Verdict`] are its terms.
//! - [`keys`]: how a principal becomes a bucket name ([`keys::normalize_ip`],
//!   [`keys::principal_key`], [`keys::digest`]).
//! - [`metrics::Metrics`]: one decider's metrics, rendered for `/metrics`.
//! - [`clock`]: the injected clock, so everything can run in virtual time.
//!
//! The middleware in an app of your own (see `examples/embedded.rs` for a full one):
//!
//! ```no_run
//! use actix_web::{web, App, HttpResponse, HttpServer};
//! use fleet_limiter::config::Loader;
//! use fleet_limiter::http::middleware::FleetLimiter;
//!
//! # async fn run() -> anyhow::Result<()> {
//! let cfg = Loader::new().process_env().load()?;
//! let limiter = FleetLimiter::from_config(&cfg)?;
//! HttpServer::new(move || {
//!     App::new()
//!         .wrap(limiter.clone())
//!         .route("/api/agent/heartbeat", web::post().to(HttpResponse::Ok))
//! })
//! .bind(("127.0.0.1", 8080))?
//! .run()
//! .await?;
//! # Ok(())
//! # }
//! ```
//!
//! The decider on its own, in virtual time: an enrolled agent's heartbeats against the built-in
//! `agent-device` budget of 30 a minute.
//!
//! ```
//! use fleet_limiter::clock::ManualClock;
//! use fleet_limiter::config::Config;
//! use fleet_limiter::decision::{Decider, RequestFacts};
//! use fleet_limiter::identity::NoVerifier;
//! use fleet_limiter::path::CanonicalPath;
//! use fleet_limiter::store::memory::MemoryStore;
//! use std::sync::Arc;
//!
//! # actix_rt::System::new().block_on(async {
//! let clock = Arc::new(ManualClock::new(1));
//! let store = Arc::new(MemoryStore::new(10_000, clock.clone()));
//! let decider = Decider::new(&Config::default(), store, Arc::new(NoVerifier));
//! let heartbeat = RequestFacts {
//!     peer: "203.0.113.7".parse().unwrap(),
//!     method: "POST",
//!     path: CanonicalPath::of_static("/api/agent/heartbeat"),
//!     forwarded: &[],
//!     agent_id: Some(b"agent-1"),
//!     authorization: None,
//!     session_token: None,
//!     key_headers: fleet_limiter::decision::KeyHeaders::default(),
//! };
//! for _ in 0..30 {
//!     assert!(!decider.decide(&heartbeat).await.refused());
//! }
//! let refused = decider.decide(&heartbeat).await;
//! assert!(refused.refused());
//! assert_eq!(refused.retry_after_secs(), Some(2), "one request's worth of refill");
//! clock.advance(std::time::Duration::from_secs(2));
//! assert!(!decider.decide(&heartbeat).await.refused());
//! # });
//! ```
//!
//! A bucket's name: the limiter and the principal, digested so that no raw agent id, token or
//! key is ever stored.
//!
//! ```
//! use fleet_limiter::keys::{digest, normalize_ip, principal_key, KeyKind};
//!
//! let ip = normalize_ip("::ffff:198.51.100.9".parse().unwrap(), 56);
//! assert_eq!(ip, "198.51.100.9");
//! let v6 = normalize_ip("2001:db8:abcd:12ff::1".parse().unwrap(), 56);
//! assert_eq!(v6, "2001:db8:abcd:1200::/56");
//! let principal = principal_key(KeyKind::IpAgent, &ip, Some("agent-1"), None);
//! assert_eq!(principal, "198.51.100.9:agent-1");
//! assert_eq!(digest("agent-device", &principal).len(), 16);
//! ```
//!
//! A store of your own implements [`store::Store`]; the memory store shows the contract:
//! every check of one request is decided together, all-or-nothing.
//!
//! ```
//! use fleet_limiter::clock::ManualClock;
//! use fleet_limiter::keys::BucketKey;
//! use fleet_limiter::limiter::{nonzero, Quota};
//! use fleet_limiter::store::{memory::MemoryStore, Check};
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! let store = MemoryStore::new(100, Arc::new(ManualClock::new(1)));
//! let check = |limiter: &str, n: u32| Check {
//!     key: BucketKey::new(Arc::from(limiter), "198.51.100.9"),
//!     quota: Quota::gcra(nonzero(n), Duration::from_secs(60)),
//!     shadow: false,
//!     units: std::num::NonZeroU32::MIN,
//! };
//! let both = [check("wide", 100), check("tight", 1)];
//! assert!(store.decide_now(&both).iter().all(|v| v.allowed));
//! let again = store.decide_now(&both);
//! assert!(!again[1].allowed, "the tight bucket is empty");
//! let wide = store.decide_now(&both[..1]);
//! assert_eq!(wide[0].remaining, 98, "the refused request charged the wide one nothing");
//! ```

#[cfg(test)]
#[macro_use]
#[path = "../tests/support/macros.rs"]
mod test_macros;

pub(crate) mod admission;
pub mod calibration;
pub mod client_ip;
pub(crate) mod client_share;
pub mod clock;
pub mod config;
pub mod decision;
pub(crate) mod descriptors;
mod error;
pub mod http;
pub mod identity;
pub mod keys;
pub(crate) mod known_agents;
pub mod limiter;
pub(crate) mod log_sink;
pub mod methods;
pub mod metrics;
pub mod path;
pub mod policy;
pub(crate) mod redact;
pub mod serve;
pub mod store;
pub(crate) mod tls;

pub use error::Error;
use std::sync::Arc;

/// The decider a configuration describes: its store, the system clock, its token verifier.
pub fn build_decider(cfg: &config::Config) -> Result<decision::Decider, Error> {
    decider_of(cfg).map_err(Error::building)
}

fn decider_of(cfg: &config::Config) -> anyhow::Result<decision::Decider> {
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
    Ok(decision::Decider::new(cfg, store, verifier_of(cfg)?))
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
pub fn build_verifier(cfg: &config::Config) -> Result<Arc<dyn identity::TokenVerifier>, Error> {
    verifier_of(cfg).map_err(Error::building)
}

fn verifier_of(cfg: &config::Config) -> anyhow::Result<Arc<dyn identity::TokenVerifier>> {
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
