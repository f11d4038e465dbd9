//! Configuration: built-in defaults, then an optional TOML file, then `FLEET_LIMITER_*`
//! environment variables, then command-line flags; each layer overrides only what it names.
//!
//! Every error names where the value came from (the file, the variable or the flag), the field,
//! and what is allowed.
//!
//! This file holds the validated types; `layers` merges the layers, `build` reads the merged
//! document into a [`Config`], `limiters` builds the limiter tables, and each other section
//! has its own file (`identity`, `ops`, `decision`, `path`, `upstream`, `trust`, `admission`,
//! `methods`, `websocket`, `headers`).

pub(crate) mod admission;
pub(crate) mod admit;
pub(crate) mod base;
mod build;
mod ceiling;
pub(crate) mod check;
pub(crate) mod decision;
pub(crate) mod defaults;
mod flags;
mod fleet;
pub(crate) mod headers;
pub(crate) mod identity;
mod layers;
mod limiters;
pub(crate) mod rls;
pub(crate) mod roles;
#[cfg(test)]
pub(crate) use limiters::parse_key;
pub(crate) use limiters::unguarded_client_chosen_key;
mod methods;
pub(crate) mod ops;
mod path;
mod rate;
pub(crate) mod settings;
pub(crate) mod shaping;
mod syntax;
mod trust;
mod type_error;
mod upstream;
pub(crate) mod websocket;

use build::*;
use limiters::*;
use settings::{Kind, SETTINGS};

pub(crate) use ceiling::AGENT_IP;
pub use flags::{AllowUnsafeCalibration, ConfigFile, SettingFlags};
pub(crate) use fleet::FleetConfig;
pub use layers::Loader;
pub(crate) use trust::covers_everything;
pub(crate) use upstream::UpstreamUrl;

use crate::client_ip::{ForwardedHeader, TrustedProxies};
use crate::keys::KeyKind;
use crate::limiter::{Algorithm, Quota};
use crate::policy::{
    Cost, Count, CredentialMatch, LimiterSpec, Meter, Mode, OnStoreError, Plans, Remember,
    RoutePattern, StatusRanges,
};
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use toml::Value;

/// A configuration that cannot be used, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

/// Where the buckets live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum StoreBackend {
    #[default]
    Memory,
    Redis,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    pub upstream: Option<UpstreamUrl>,
    pub connect_timeout: Duration,
    pub read_timeout: Duration,
    /// The longest wait for the next chunk of a client's request body.
    pub body_timeout: Duration,
    /// The least average bytes per second of a request body after the grace period; 0: none.
    pub body_min_rate: u64,
    /// The largest request body read for a `body:<field>` key; a larger one keys on the
    /// address and streams as every body does.
    pub body_key_max_bytes: usize,
    /// PEM certificates trusted for an `https://` upstream, besides the system's roots.
    pub upstream_ca_file: Option<PathBuf>,
    /// Accept any certificate from an `https://` upstream (testing only; warned at every start).
    pub upstream_insecure_skip_verify: bool,
    /// The traffic listener's certificate chain and private key (PEM): both or neither.
    pub tls_cert_file: Option<PathBuf>,
    pub tls_key_file: Option<PathBuf>,
    /// Bind every listener with `SO_REUSEPORT`: a new process listens beside a draining one.
    pub reuse_port: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ClientIpConfig {
    pub trusted: TrustedProxies,
    pub ipv6_prefix: u8,
    /// `trust_proxy` may cover a whole address family (the proxy in front overwrites the header).
    pub trust_all_addresses: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct StoreConfig {
    pub backend: StoreBackend,
    pub url: Option<String>,
    pub cluster: Vec<String>,
    pub max_keys: usize,
    pub timeout: Duration,
    /// Redis standalone: script calls out at once; requests arriving meanwhile share the next.
    pub calls_in_flight: usize,
    /// `rediss://`: a PEM bundle of CA certificates trusted in addition to the system roots.
    pub ca_file: Option<PathBuf>,
    /// `rediss://`: accept any certificate (development only; warns on every start).
    pub insecure_skip_verify: bool,
    /// The memory store's buckets are written here on stop and read back at start.
    pub state_file: Option<PathBuf>,
    /// Redis: refuse to start when the store cannot be reached, and answer `/readyz` 503
    /// while it does not answer.
    pub require: bool,
}

impl StoreConfig {
    /// The store in use, for logs and reports, with any password hidden: `memory`,
    /// `redis redis://host:6379`, or `redis cluster redis://a:6379,redis://b:6379`.
    pub fn describe(&self) -> String {
        match self.backend {
            StoreBackend::Memory => "memory".to_owned(),
            StoreBackend::Redis if !self.cluster.is_empty() => {
                let nodes: Vec<String> = self
                    .cluster
                    .iter()
                    .map(|u| crate::redact::url(u).into_owned())
                    .collect();
                format!("redis cluster {}", nodes.join(","))
            }
            StoreBackend::Redis => format!(
                "redis {}",
                crate::redact::url(self.url.as_deref().unwrap_or_default())
            ),
        }
    }
}

/// The whole, validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The TOML file it was read from, if any.
    pub source: Option<PathBuf>,
    /// `false` forwards every request unmetered (`FLEET_LIMITER_ENABLED=false`).
    pub enabled: bool,
    pub server: ServerConfig,
    pub client_ip: ClientIpConfig,
    pub store: StoreConfig,
    pub fleet: FleetConfig,
    pub limiters: Vec<LimiterSpec>,
    pub identity: identity::IdentityConfig,
    pub ops: ops::OpsConfig,
    pub cors: ops::CorsConfig,
    /// Which spellings of a path are refused (`[path]`; all of them by default).
    pub path: crate::path::PathRules,
    /// The forward-auth decision listener (`[decision]`; off by default).
    pub decision: decision::DecisionConfig,
    /// Envoy's rate-limit service over gRPC (`[rls]`; off by default).
    pub rls: rls::RlsConfig,
    /// Admission control in front of the upstream (`[admission]`; off by default).
    pub admission: Option<admission::AdmissionConfig>,
    /// The methods forwarded, and what a method override costs (`[methods]`).
    pub methods: crate::methods::MethodRules,
    /// Bounds on upgraded (WebSocket) connections (`[websocket]`).
    pub websocket: websocket::WebsocketConfig,
    /// Poll slots: the routes whose callers are told when to come next (`[shaping]`).
    pub shaping: shaping::ShapingConfig,
    /// The limit headers a metered answer carries (`[headers]`).
    pub headers: headers::HeaderProfile,
    /// Other limits for chosen principals (`[[overrides]]`), reloaded with the rest.
    pub(crate) overrides: Vec<crate::overrides::Override>,
    /// The operator's routes for the built-in calibration's roles (`[roles]`).
    pub(crate) roles: roles::RoleMap,
    /// Where each setting's value came from (the file, a variable, a flag), by TOML path.
    pub(crate) origins: HashMap<String, String>,
}

impl Config {
    /// One line per limiter that counts only failed (or only succeeded) answers while the
    /// gateway only answers a proxy's questions (`decision.listen` with no `server.upstream`):
    /// the decision endpoint never sees the answer, so there every admitted request counts.
    pub fn count_warnings(&self) -> Vec<String> {
        if self.server.upstream.is_some() || self.decision.listen.is_none() {
            return Vec::new();
        }
        self.limiters
            .iter()
            .filter(|l| l.count != Count::All && l.mode != Mode::Off)
            .map(|l| {
                format!(
                    "limiters.{}.count: `{}` has no effect on the decision endpoint, which never sees the answer: every admitted request counts; put the gateway in front (server.upstream) to count only {} answers",
                    l.name,
                    l.count.as_str(),
                    l.count.as_str()
                )
            })
            .collect()
    }

    /// Where the value of the setting at `path` came from, as configuration errors name it: the
    /// file's path, `environment variable FLEET_LIMITER_…`, `flag --…`, or `built-in default`.
    pub fn origin(&self, path: &str) -> String {
        self.origins
            .get(path)
            .cloned()
            .unwrap_or_else(|| "built-in default".to_owned())
    }
}

/// The environment variable of the scalar setting at `path` (e.g. `FLEET_LIMITER_LISTEN` for
/// `server.listen`).
pub(crate) fn variable_of(path: &str) -> Option<&'static str> {
    settings::setting(path).map(|s| s.variable)
}

impl Default for Config {
    /// The built-in calibration on the in-memory store.
    fn default() -> Self {
        match Loader::default().load() {
            Ok(c) => c,
            Err(e) => panic!("the built-in configuration must be valid: {e}"),
        }
    }
}

#[cfg(test)]
mod tests;
