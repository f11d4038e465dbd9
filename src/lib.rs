//! fleet-limiter: a principal-keyed rate limiter for agent-fleet HTTP APIs.
//!
//! One request flows one way through one module per step (the modules are private; what an
//! embedder uses is re-exported here, at the crate root):
//!
//! | step | file | what it does | API |
//! |---|---|---|---|
//! | client IP | `client_ip.rs` | peer address, or the rightmost untrusted hop behind trusted proxies | [`client_ip()`], [`TrustedProxies`] |
//! | identity | `identity/` | agent id, verified dashboard user, credential kind | [`TokenVerifier`], [`Credential`] |
//! | policy | `policy/` | which limiters meter the request (routes, groups, credentials) | [`Policy`], [`CanonicalPath`] |
//! | keys | `keys.rs` | principal keys, IP normalisation, digests | [`BucketKey`], [`normalize_ip`], [`digest`] |
//! | store | `store/` | one decision per key, memory or Redis, same math from `limiter/` | [`Store`], [`MemoryStore`], [`RedisStore`] |
//! | decision | `decision/` | runs the steps above; all limiters must allow | [`Decider`], [`Outcome`] |
//! | response | `http/response/` | `RateLimit*` headers, or 429 problem+json with `Retry-After` (503 when the store cannot answer) | [`limit_headers`], [`too_many_requests`], [`refusal`] |
//! | admission | `admission.rs` | caps allowed requests in flight to the upstream; a short queue, then 503 | |
//! | proxy | `http/proxy/` | streams allowed requests to the upstream and back | [`serve_gateway`] |
//!
//! Around them: `metrics/` and the decision's observer count and log each decision
//! ([`Metrics`]); `gateway.rs` starts the listeners and runs them; `http/admin.rs` serves
//! `/metrics`, health and reload, and handles signals;
//! `http/cors.rs` lets browsers read refusals ([`Cors`]). `config/` turns TOML, environment and
//! flags into a validated [`Config`] (every setting is a row of [`SETTINGS`]); `clock.rs`
//! injects time so every limiter can run in virtual time ([`ManualClock`]). [`calibration`]
//! checks a configuration against the fleet it must carry, simulates it and replays access logs
//! through it: the binary's `check`, `simulate` and `replay` commands.
//!
//! # The public API
//!
//! Everything public is listed here; nothing else is reachable from outside the crate.
//!
//! - [`FleetLimiter`]: the actix-web middleware, built from a configuration; [`Decided`] is
//!   what it leaves in a request's extensions.
//! - [`serve`] and [`serve_gateway`]: the gateway, as the binary runs it.
//! - [`Error`]: what [`build_decider`], [`FleetLimiter::from_config`] and [`serve_gateway`]
//!   return when they cannot build or run, with its exit code.
//! - [`Loader`] and [`Config`]: defaults, TOML, `FLEET_LIMITER_*`, flags; [`SETTINGS`] is the
//!   table of every setting (path, variable, flag, default, live or restart on reload).
//! - [`Decider`]: the limiter with no HTTP in it, fed [`RequestFacts`], answering an
//!   [`Outcome`] of one [`LimitResult`] per limiter; [`limit_headers`], [`apply_headers`] and
//!   [`too_many_requests`] render it as the gateway does ([`refusal`] picks `429` for a spent
//!   budget or `503` for a store that cannot answer, as the gateway does).
//! - [`Store`]: the store trait, with [`MemoryStore`] and [`RedisStore`]; [`Check`],
//!   [`Quota`] and [`Verdict`] are its terms.
//! - [`normalize_ip`], [`principal_key`], [`digest`], [`BucketKey`]: how a principal becomes a
//!   bucket name.
//! - [`Policy`], [`CanonicalPath`], [`PathRules`]: which limiters a request meets.
//! - [`Metrics`]: one decider's metrics, rendered for `/metrics`.
//! - [`Clock`], [`ManualClock`], [`SystemClock`]: the injected clock.
//! - With `--features actix-governor`: `AgentDeviceKey`, `VerifiedUserKey`, `MaskedIpKey` and
//!   `ClientAddress`, fleet-limiter's principals as `actix_governor::KeyExtractor`s.
//!
//! The middleware in an app of your own (see `examples/embedded.rs` for a full one):
//!
//! ```no_run
//! use actix_web::{web, App, HttpResponse, HttpServer};
//! use fleet_limiter::{FleetLimiter, Loader};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
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
//! `agent-device` budget of 30 a minute, and the answer the gateway gives once it runs dry.
//!
//! ```
//! use fleet_limiter::{
//!     limit_headers, CanonicalPath, Config, Decider, HeaderProfile, KeyHeaders, ManualClock,
//!     MemoryStore, NoVerifier, RequestFacts,
//! };
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
//!     key_headers: KeyHeaders::default(),
//! };
//! for _ in 0..30 {
//!     assert!(!decider.decide(&heartbeat).await.refused());
//! }
//! let refused = decider.decide(&heartbeat).await;
//! assert!(refused.refused());
//! assert_eq!(refused.retry_after_secs(), Some(2), "one request's worth of refill");
//! let headers = limit_headers(&refused, &HeaderProfile::default(), None);
//! let remaining = headers.iter().find(|(name, _)| name == "ratelimit-remaining");
//! assert_eq!(remaining.map(|(_, v)| v.as_str()), Some("0"), "{headers:?}");
//! clock.advance(std::time::Duration::from_secs(2));
//! assert!(!decider.decide(&heartbeat).await.refused());
//! # });
//! ```
//!
//! Which limiters a request meets, before any bucket is touched:
//!
//! ```
//! use fleet_limiter::{CanonicalPath, Config, Credential, Policy};
//!
//! let policy = Policy::new(Config::default().limiters);
//! let path = CanonicalPath::of_static("/api/agent/heartbeat");
//! let names: Vec<String> = policy
//!     .applicable("POST", &path, Credential::None)
//!     .iter()
//!     .map(|l| l.name.to_string())
//!     .collect();
//! assert!(names.iter().any(|n| n == "agent-device"), "{names:?}");
//! ```
//!
//! A bucket's name: the limiter and the principal, digested so that no raw agent id, token or
//! key is ever stored.
//!
//! ```
//! use fleet_limiter::{digest, normalize_ip, principal_key, KeyKind};
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
//! A store of your own implements [`Store`]; the memory store shows the contract: every check
//! of one request is decided together, all-or-nothing.
//!
//! ```
//! use fleet_limiter::{nonzero, BucketKey, Check, ManualClock, MemoryStore, Quota};
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

#![warn(unreachable_pub)]

#[cfg(test)]
#[macro_use]
#[path = "../tests/support/macros.rs"]
mod test_macros;

mod admission;
mod calendar;
pub mod calibration;
mod client_ip;
mod client_share;
mod clock;
mod config;
mod decision;
mod descriptors;
mod duration;
mod error;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod gateway;
mod http;
mod identity;
mod keys;
mod known_agents;
mod limiter;
mod log_sink;
mod methods;
mod metrics;
mod overrides;
mod path;
mod policy;
mod redact;
mod rls;
mod rls_rules;
mod serve;
mod shaping;
mod spread;
mod store;
mod tls;
mod top;
mod wiring;

#[cfg(test)]
#[path = "../tests/unit/vectors.rs"]
mod vectors;

pub use client_ip::{client_ip, ForwardedHeader, TrustedProxies};
pub use clock::{Clock, ManualClock, Nanos, SystemClock};
pub use config::headers::{HeaderProfile, LegacyReset, Standard};
pub use config::settings::{
    DefaultValue as SettingDefault, Flag as SettingFlag, Kind as SettingKind,
    Reload as SettingReload, Setting, SETTINGS,
};
pub use config::{
    AllowUnsafeCalibration, Config, ConfigFile, Loader, SettingFlags, StoreBackend, StoreConfig,
};
pub use decision::{Decider, KeyHeaders, LimitResult, Outcome, RequestFacts};
pub use error::Error;
pub use gateway::serve_gateway;
pub use http::admin_client::{
    run_explain, run_override, run_reset, run_top, AdminTarget, AskedRequest, OverrideCommand,
    TopArgs,
};
pub use http::cors::Cors;
pub use http::demo_upstream::{run_demo_upstream, DEMO_UPSTREAM_LISTEN};
#[cfg(feature = "actix-governor")]
pub use http::governor::{AgentDeviceKey, ClientAddress, MaskedIpKey, VerifiedUserKey};
pub use http::middleware::{Decided, FleetLimiter};
pub use http::response::{
    apply_headers, limit_header_names, limit_headers, refusal, too_many_requests,
};
pub use identity::{bearer_token, Credential, NoVerifier, TokenClaims, TokenVerifier, Verified};
pub use keys::{digest, normalize_ip, principal_key, valid_agent_id, BucketKey, KeyKind};
pub use limiter::calendar::{Calendar, CalendarUnit, Zone};
pub use limiter::{nonzero, Algorithm, Quota, Verdict};
pub use metrics::{LimiterFate, Metrics, CONTENT_TYPE as METRICS_CONTENT_TYPE};
pub use path::{CanonicalPath, PathRules};
pub use policy::{Mode, Policy};
pub use serve::run as serve;
pub use store::memory::MemoryStore;
pub use store::redis::{RedisOptions, RedisStore, RedisTarget, RedisTls};
pub use store::{Check, GiveBack, SharedTable, Store, StoreError, StoreErrorKind, TableRead};
pub use wiring::{build_decider, build_verifier, redis_settings};
