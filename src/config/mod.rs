//! Configuration: built-in defaults, then an optional TOML file, then `FLEET_LIMITER_*`
//! environment variables, then command-line flags; each layer overrides only what it names.
//!
//! Every error names where the value came from (the file, the variable or the flag), the field,
//! and what is allowed.

mod ceiling;
pub mod decision;
pub mod defaults;
mod duration;
pub mod identity;
pub mod ops;
mod path;
mod rate;
mod syntax;
mod trust;
mod upstream;

pub use duration::parse_duration;
pub use rate::parse_rate;
pub use trust::covers_everything;

use crate::client_ip::{ForwardedHeader, TrustedProxies};
use crate::keys::KeyKind;
use crate::limiter::{Algorithm, Quota};
use crate::policy::{CredentialMatch, LimiterSpec, Mode, OnStoreError, RoutePattern};
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
    pub upstream: Option<String>,
    pub connect_timeout: Duration,
    pub read_timeout: Duration,
    /// The longest wait for the next chunk of a client's request body.
    pub body_timeout: Duration,
    /// The least average bytes per second of a request body after the grace period; 0: none.
    pub body_min_rate: u64,
    /// PEM certificates trusted for an `https://` upstream, besides the system's roots.
    pub upstream_ca_file: Option<PathBuf>,
    /// Accept any certificate from an `https://` upstream (testing only; warned at every start).
    pub upstream_insecure_skip_verify: bool,
    /// The traffic listener's certificate chain and private key (PEM): both or neither.
    pub tls_cert_file: Option<PathBuf>,
    pub tls_key_file: Option<PathBuf>,
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

/// What a healthy fleet looks like; the calibration is checked against it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FleetConfig {
    pub heartbeat_interval_seconds: u64,
    pub poll_interval_seconds: u64,
    pub heartbeat_timeout_seconds: u64,
    pub max_site_endpoints: u64,
    pub dashboard_poll_seconds: u64,
    pub analysts_per_nat: u64,
}

impl Default for FleetConfig {
    fn default() -> Self {
        Self {
            heartbeat_interval_seconds: 60,
            poll_interval_seconds: 30,
            heartbeat_timeout_seconds: 180,
            max_site_endpoints: 250,
            dashboard_poll_seconds: 10,
            analysts_per_nat: 20,
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
    /// Where each setting's value came from (the file, a variable, a flag), by TOML path.
    pub(crate) origins: HashMap<String, String>,
}

impl Config {
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
pub fn variable_of(path: &str) -> Option<&'static str> {
    SETTINGS
        .iter()
        .find(|(p, _, _)| *p == path)
        .map(|(_, v, _)| *v)
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

/// A setting's value type, for parsing it from an environment variable or a flag.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Str,
    Int,
    Bool,
    List,
}

/// Every scalar setting: its TOML path, its environment variable, its type.
const SETTINGS: &[(&str, &str, Kind)] = &[
    ("enabled", "FLEET_LIMITER_ENABLED", Kind::Bool),
    ("server.listen", "FLEET_LIMITER_LISTEN", Kind::Str),
    ("server.upstream", "FLEET_LIMITER_UPSTREAM", Kind::Str),
    (
        "server.connect_timeout",
        "FLEET_LIMITER_CONNECT_TIMEOUT",
        Kind::Str,
    ),
    (
        "server.read_timeout",
        "FLEET_LIMITER_READ_TIMEOUT",
        Kind::Str,
    ),
    (
        "server.body_timeout",
        "FLEET_LIMITER_BODY_TIMEOUT",
        Kind::Str,
    ),
    (
        "server.body_min_rate",
        "FLEET_LIMITER_BODY_MIN_RATE",
        Kind::Str,
    ),
    (
        "server.upstream_ca_file",
        "FLEET_LIMITER_UPSTREAM_CA_FILE",
        Kind::Str,
    ),
    (
        "server.upstream_insecure_skip_verify",
        "FLEET_LIMITER_UPSTREAM_INSECURE_SKIP_VERIFY",
        Kind::Bool,
    ),
    (
        "server.tls_cert_file",
        "FLEET_LIMITER_TLS_CERT_FILE",
        Kind::Str,
    ),
    (
        "server.tls_key_file",
        "FLEET_LIMITER_TLS_KEY_FILE",
        Kind::Str,
    ),
    (
        "client_ip.trust_proxy",
        "FLEET_LIMITER_TRUST_PROXY",
        Kind::List,
    ),
    (
        "client_ip.header",
        "FLEET_LIMITER_FORWARDED_HEADER",
        Kind::Str,
    ),
    (
        "client_ip.ipv6_prefix",
        "FLEET_LIMITER_IPV6_PREFIX",
        Kind::Int,
    ),
    (
        "client_ip.trust_all_addresses",
        "FLEET_LIMITER_TRUST_ALL_ADDRESSES",
        Kind::Bool,
    ),
    ("store.backend", "FLEET_LIMITER_STORE_BACKEND", Kind::Str),
    ("store.url", "FLEET_LIMITER_STORE_URL", Kind::Str),
    ("store.cluster", "FLEET_LIMITER_STORE_CLUSTER", Kind::List),
    ("store.max_keys", "FLEET_LIMITER_MAX_KEYS", Kind::Int),
    ("store.timeout", "FLEET_LIMITER_STORE_TIMEOUT", Kind::Str),
    (
        "store.calls_in_flight",
        "FLEET_LIMITER_STORE_CALLS_IN_FLIGHT",
        Kind::Int,
    ),
    ("store.ca_file", "FLEET_LIMITER_STORE_CA_FILE", Kind::Str),
    (
        "store.insecure_skip_verify",
        "FLEET_LIMITER_STORE_INSECURE_SKIP_VERIFY",
        Kind::Bool,
    ),
    (
        "fleet.heartbeat_interval_seconds",
        "FLEET_LIMITER_HEARTBEAT_INTERVAL_SECONDS",
        Kind::Int,
    ),
    (
        "fleet.poll_interval_seconds",
        "FLEET_LIMITER_POLL_INTERVAL_SECONDS",
        Kind::Int,
    ),
    (
        "fleet.heartbeat_timeout_seconds",
        "FLEET_LIMITER_HEARTBEAT_TIMEOUT_SECONDS",
        Kind::Int,
    ),
    (
        "fleet.max_site_endpoints",
        "FLEET_LIMITER_MAX_SITE_ENDPOINTS",
        Kind::Int,
    ),
    (
        "fleet.dashboard_poll_seconds",
        "FLEET_LIMITER_DASHBOARD_POLL_SECONDS",
        Kind::Int,
    ),
    (
        "fleet.analysts_per_nat",
        "FLEET_LIMITER_ANALYSTS_PER_NAT",
        Kind::Int,
    ),
    ("identity.jwks_url", "FLEET_LIMITER_JWKS_URL", Kind::Str),
    (
        "identity.jwks_ca_file",
        "FLEET_LIMITER_JWKS_CA_FILE",
        Kind::Str,
    ),
    (
        "identity.jwks_insecure_skip_verify",
        "FLEET_LIMITER_JWKS_INSECURE_SKIP_VERIFY",
        Kind::Bool,
    ),
    (
        "identity.jwt_public_key_pem",
        "FLEET_LIMITER_JWT_PUBLIC_KEY_PEM",
        Kind::Str,
    ),
    (
        "identity.jwt_hs256_secret",
        "FLEET_LIMITER_JWT_HS256_SECRET",
        Kind::Str,
    ),
    (
        "identity.jwt_issuer",
        "FLEET_LIMITER_JWT_ISSUER",
        Kind::List,
    ),
    (
        "identity.jwt_audience",
        "FLEET_LIMITER_JWT_AUDIENCE",
        Kind::List,
    ),
    (
        "identity.authorized_parties",
        "FLEET_LIMITER_AUTHORIZED_PARTIES",
        Kind::List,
    ),
    (
        "identity.session_cookie",
        "FLEET_LIMITER_SESSION_COOKIE",
        Kind::Str,
    ),
    (
        "identity.allow_weak_secret",
        "FLEET_LIMITER_ALLOW_WEAK_SECRET",
        Kind::Bool,
    ),
    ("identity.leeway", "FLEET_LIMITER_JWT_LEEWAY", Kind::Str),
    (
        "identity.jwks_refresh_interval",
        "FLEET_LIMITER_JWKS_REFRESH_INTERVAL",
        Kind::Str,
    ),
    (
        "identity.jwks_max_age",
        "FLEET_LIMITER_JWKS_MAX_AGE",
        Kind::Str,
    ),
    (
        "identity.jwks_timeout",
        "FLEET_LIMITER_JWKS_TIMEOUT",
        Kind::Str,
    ),
    (
        "identity.cache_max_entries",
        "FLEET_LIMITER_JWT_CACHE_MAX_ENTRIES",
        Kind::Int,
    ),
    ("ops.admin_listen", "FLEET_LIMITER_ADMIN_LISTEN", Kind::Str),
    (
        "decision.listen",
        "FLEET_LIMITER_DECISION_LISTEN",
        Kind::Str,
    ),
    (
        "decision.allow_from",
        "FLEET_LIMITER_DECISION_ALLOW_FROM",
        Kind::List,
    ),
    (
        "ops.shutdown_grace",
        "FLEET_LIMITER_SHUTDOWN_GRACE",
        Kind::Str,
    ),
    (
        "ops.near_limit_percent",
        "FLEET_LIMITER_NEAR_LIMIT_PERCENT",
        Kind::Int,
    ),
    ("ops.log_format", "FLEET_LIMITER_LOG_FORMAT", Kind::Str),
    (
        "cors.allowed_origins",
        "FLEET_LIMITER_CORS_ALLOWED_ORIGINS",
        Kind::List,
    ),
    (
        "cors.allow_credentials",
        "FLEET_LIMITER_CORS_ALLOW_CREDENTIALS",
        Kind::Bool,
    ),
    (
        "path.invalid_escape",
        "FLEET_LIMITER_PATH_INVALID_ESCAPE",
        Kind::Str,
    ),
    (
        "path.invalid_utf8",
        "FLEET_LIMITER_PATH_INVALID_UTF8",
        Kind::Str,
    ),
    (
        "path.encoded_slash",
        "FLEET_LIMITER_PATH_ENCODED_SLASH",
        Kind::Str,
    ),
    ("path.backslash", "FLEET_LIMITER_PATH_BACKSLASH", Kind::Str),
    ("path.semicolon", "FLEET_LIMITER_PATH_SEMICOLON", Kind::Str),
    ("path.control", "FLEET_LIMITER_PATH_CONTROL", Kind::Str),
    (
        "path.segment_edge",
        "FLEET_LIMITER_PATH_SEGMENT_EDGE",
        Kind::Str,
    ),
];

/// Fields of a limiter table, with their type for environment overrides
/// (`FLEET_LIMITER_LIMITER_<NAME>_<FIELD>`, e.g. `FLEET_LIMITER_LIMITER_AGENT_DEVICE_LIMIT=60`).
const LIMITER_FIELDS: &[(&str, Kind)] = &[
    ("on_store_error", Kind::Str),
    ("algorithm", Kind::Str),
    ("credential", Kind::Str),
    ("routes", Kind::List),
    ("except", Kind::List),
    ("window", Kind::Str),
    ("limit", Kind::Int),
    ("group", Kind::Str),
    ("mode", Kind::Str),
    ("key", Kind::Str),
];

/// Builds a [`Config`] from its layers.
#[derive(Debug, Clone, Default)]
pub struct Loader {
    file: Option<PathBuf>,
    env: Vec<(String, String)>,
    /// `(toml path, value, flag name)`
    flags: Vec<(String, String, String)>,
}

impl Loader {
    pub fn new() -> Self {
        Self::default()
    }

    /// Read this TOML file (the `--config` flag).
    pub fn file(mut self, path: impl Into<PathBuf>) -> Self {
        self.file = Some(path.into());
        self
    }

    /// Take `FLEET_LIMITER_*` variables from this process's environment.
    pub fn process_env(self) -> Self {
        self.env(std::env::vars())
    }

    /// Take `FLEET_LIMITER_*` variables from these pairs.
    pub fn env(mut self, vars: impl IntoIterator<Item = (String, String)>) -> Self {
        self.env.extend(
            vars.into_iter()
                .filter(|(k, _)| k.starts_with("FLEET_LIMITER_")),
        );
        self
    }

    /// A command-line flag's value for the setting at `path`.
    pub fn flag(mut self, path: &str, value: impl Into<String>, flag: &str) -> Self {
        self.flags
            .push((path.to_owned(), value.into(), flag.to_owned()));
        self
    }

    /// One line per `FLEET_LIMITER_*` variable that names no setting (it is ignored), with the
    /// nearest known name when one is close. Names only: a value may be a secret.
    pub fn warnings(&self) -> Vec<String> {
        self.env
            .iter()
            .map(|(var, _)| var.as_str())
            .filter(|var| !is_known_variable(var))
            .map(|var| match nearest_variable(var) {
                Some(near) => format!(
                    "environment variable {var} is not a setting and is ignored; did you mean {near}?"
                ),
                None => format!(
                    "environment variable {var} is not a setting and is ignored (docs/configuration.md lists them)"
                ),
            })
            .collect()
    }

    pub fn load(&self) -> Result<Config, ConfigError> {
        let mut origins: HashMap<String, String> = HashMap::new();
        let file_name = self.file.as_ref().map(|p| p.display().to_string());
        let mut doc = match &self.file {
            Some(path) => read_file(path)?,
            None => toml::Table::new(),
        };
        if let Some(name) = &file_name {
            record_origins(&doc, "", name, &mut origins);
        }
        for (var, raw) in &self.env {
            apply_env(&mut doc, var, raw, &mut origins)?;
        }
        for (path, raw, flag) in &self.flags {
            apply_flag(&mut doc, path, raw, flag, &mut origins)?;
        }
        let ctx = Ctx {
            origins,
            file: file_name,
        };
        let raw: RawConfig = match Value::Table(doc.clone()).try_into() {
            Ok(raw) => raw,
            Err(e) => return Err(type_error(&doc, &e, &ctx)),
        };
        build(raw, &ctx, self.file.clone())
    }
}

/// Name the field a deserialisation error is about: each entry is tried on its own until one
/// fails, section by section, so the message carries the full path and the value's origin.
fn type_error(doc: &toml::Table, e: &toml::de::Error, ctx: &Ctx) -> ConfigError {
    fn culprit<T: serde::de::DeserializeOwned>(t: &toml::Table) -> Option<(String, String)> {
        t.iter().find_map(|(k, v)| {
            let one = toml::Table::from_iter([(k.clone(), v.clone())]);
            Value::Table(one)
                .try_into::<T>()
                .err()
                .map(|e| (k.clone(), e.message().trim().to_owned()))
        })
    }
    let found = culprit::<RawConfig>(doc).map(|(section, msg)| {
        let inner = doc.get(&section).and_then(Value::as_table);
        let deeper = match (section.as_str(), inner) {
            ("server", Some(t)) => culprit::<RawServer>(t),
            ("client_ip", Some(t)) => culprit::<RawClientIp>(t),
            ("store", Some(t)) => culprit::<RawStore>(t),
            ("fleet", Some(t)) => culprit::<FleetConfig>(t),
            ("path", Some(t)) => culprit::<path::RawPath>(t),
            ("decision", Some(t)) => culprit::<decision::RawDecision>(t),
            ("ops", Some(t)) => culprit::<ops::RawOps>(t),
            ("cors", Some(t)) => culprit::<ops::RawCors>(t),
            ("identity", Some(t)) => culprit::<identity::RawIdentity>(t),
            ("limiters", Some(t)) => t.iter().find_map(|(name, v)| match v.as_table() {
                Some(lt) => culprit::<RawLimiter>(lt).map(|(f, m)| (format!("{name}.{f}"), m)),
                None => Some((name.clone(), "must be a table of limiter fields".to_owned())),
            }),
            _ => None,
        };
        match deeper {
            Some((field, m)) => (format!("{section}.{field}"), m),
            None => (section, msg),
        }
    });
    let found = found.map(|(path, msg)| (path, operator_words(&msg)));
    match found {
        Some((path, msg)) if syntax::is_secret_path(&path) => {
            let expected = msg.split_once(", expected ").map(|(_, e)| e);
            let msg = match expected {
                Some(e) => format!("has the wrong type (expected {e}); the value is not shown"),
                None => "has the wrong type; the value is not shown".to_owned(),
            };
            ctx.err(&path, msg)
        }
        Some((path, msg)) => ctx.err(&path, msg),
        None => {
            let where_ = ctx.file.as_deref().unwrap_or("the configuration");
            ConfigError(format!("{where_}: {}", e.message().trim()))
        }
    }
}

/// A deserialiser's message in an operator's words: what was found, and what the field takes,
/// without Rust's type names (`invalid type: string "lots", expected i64` reads
/// `got the string "lots"; expected a whole number`).
fn operator_words(msg: &str) -> String {
    let msg = msg.trim();
    if let Some((_, kind)) = msg.split_once("did not match any variant of untagged enum ") {
        return match kind.trim() {
            "DurationValue" => {
                "is not a duration; write one such as \"30s\", \"15m\" or a whole number of seconds"
                    .to_owned()
            }
            "OneOrMany" => "is not a string or a list of strings".to_owned(),
            "RateValue" => {
                "is not a rate; write bytes per second such as 240, \"1KiB\" or \"off\"".to_owned()
            }
            _ => "has a value of a kind this field does not take".to_owned(),
        };
    }
    let (found, expected) = match msg.split_once(", expected ") {
        Some((f, e)) => (f, Some(e)),
        None => (msg, None),
    };
    let found = match found.strip_prefix("invalid type: ") {
        Some("unit variant") => "got a value of the wrong kind".to_owned(),
        Some(what) => format!("got {}", what.trim()),
        None => match found.strip_prefix("invalid value: ") {
            Some(what) => format!("got {}", what.trim()),
            None => found.to_owned(),
        },
    };
    let Some(expected) = expected else {
        return found;
    };
    let e = expected.trim();
    let words = match e {
        "i8" | "i16" | "i32" | "i64" | "i128" | "isize" | "u8" | "u16" | "u32" | "u64" | "u128"
        | "usize" => "a whole number (no quotes)",
        "f32" | "f64" => "a number (no quotes)",
        "a boolean" => "true or false (no quotes)",
        "a string" | "string only" => "a string in quotes",
        "a sequence" => "a list, e.g. [\"a\", \"b\"]",
        "a map" => "a table",
        _ if e.starts_with("struct ") => "a table",
        _ => e,
    };
    format!("{found}; expected {words}")
}

fn read_file(path: &Path) -> Result<toml::Table, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        ConfigError(format!(
            "{}: cannot read the configuration file: {e}; check the --config path",
            path.display()
        ))
    })?;
    text.parse::<toml::Table>()
        .map_err(|e| syntax::parse_error(path, &text, &e))
}

fn record_origins(t: &toml::Table, prefix: &str, origin: &str, out: &mut HashMap<String, String>) {
    for (k, v) in t {
        let path = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        if let Value::Table(inner) = v {
            record_origins(inner, &path, origin, out);
        }
        out.insert(path, origin.to_owned());
    }
}

fn parse_kind(raw: &str, kind: Kind, origin: &str, path: &str) -> Result<Value, ConfigError> {
    Ok(match kind {
        Kind::Str => Value::String(raw.to_owned()),
        Kind::Int => Value::Integer(raw.trim().parse::<i64>().map_err(|_| {
            ConfigError(format!("{origin}: {path}: `{raw}` is not a whole number"))
        })?),
        Kind::Bool => match raw.trim().to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" | "on" => Value::Boolean(true),
            "false" | "0" | "no" | "off" => Value::Boolean(false),
            _ => {
                return Err(ConfigError(format!(
                    "{origin}: {path}: `{raw}` is not a boolean; use true or false"
                )))
            }
        },
        Kind::List => Value::Array(
            raw.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| Value::String(s.to_owned()))
                .collect(),
        ),
    })
}

fn set_path(doc: &mut toml::Table, path: &str, v: Value) {
    let mut parts: Vec<&str> = path.split('.').collect();
    let Some(last) = parts.pop() else { return };
    let mut t = doc;
    for p in parts {
        let entry = t
            .entry(p.to_owned())
            .or_insert_with(|| Value::Table(toml::Table::new()));
        if !entry.is_table() {
            *entry = Value::Table(toml::Table::new());
        }
        match entry {
            Value::Table(inner) => t = inner,
            _ => return,
        }
    }
    t.insert(last.to_owned(), v);
}

fn apply_env(
    doc: &mut toml::Table,
    var: &str,
    raw: &str,
    origins: &mut HashMap<String, String>,
) -> Result<(), ConfigError> {
    let origin = format!("environment variable {var}");
    if var == "FLEET_LIMITER_STORE" {
        return apply_store_shorthand(doc, raw, &origin, origins);
    }
    if let Some((path, _, kind)) = SETTINGS.iter().find(|(_, v, _)| *v == var) {
        let v = parse_kind(raw, *kind, &origin, path)?;
        set_path(doc, path, v);
        origins.insert((*path).to_owned(), origin);
        return Ok(());
    }
    if let Some(rest) = var.strip_prefix("FLEET_LIMITER_LIMITER_") {
        for (field, kind) in LIMITER_FIELDS {
            let suffix = format!("_{}", field.to_ascii_uppercase());
            if let Some(name) = rest.strip_suffix(&suffix) {
                let name = name.to_ascii_lowercase().replace('_', "-");
                let path = format!("limiters.{name}.{field}");
                let v = parse_kind(raw, *kind, &origin, &path)?;
                set_path(doc, &path, v);
                origins.insert(path, origin);
                return Ok(());
            }
        }
        let fields: Vec<String> = LIMITER_FIELDS
            .iter()
            .map(|(f, _)| f.to_ascii_uppercase())
            .collect();
        return Err(ConfigError(format!(
            "{origin}: not a limiter setting; use FLEET_LIMITER_LIMITER_<NAME>_<FIELD> with FIELD one of {}",
            fields.join(", ")
        )));
    }
    // Variables the configuration does not own (FLEET_LIMITER_CONFIG names the file;
    // others belong to other parts of the program) are left alone.
    Ok(())
}

/// Variables other parts of the program read (the configuration file, the log filter, the
/// calibration override) and the store shorthand.
const OTHER_VARIABLES: &[&str] = &[
    "FLEET_LIMITER_CONFIG",
    "FLEET_LIMITER_LOG",
    "FLEET_LIMITER_ALLOW_UNSAFE_CALIBRATION",
    "FLEET_LIMITER_STORE",
];

/// Whether some part of the program reads this variable. `FLEET_LIMITER_LIMITER_*` counts as
/// known: a wrong field there is already a configuration error.
fn is_known_variable(var: &str) -> bool {
    var.starts_with("FLEET_LIMITER_LIMITER_")
        || OTHER_VARIABLES.contains(&var)
        || SETTINGS.iter().any(|(_, v, _)| *v == var)
}

/// The known variable nearest to `var` by edit distance, when it is close (at most a third of
/// the name after the prefix, and at most 3 edits).
fn nearest_variable(var: &str) -> Option<&'static str> {
    let tail = var.strip_prefix("FLEET_LIMITER_").unwrap_or(var);
    let known = SETTINGS
        .iter()
        .map(|(_, v, _)| *v)
        .chain(OTHER_VARIABLES.iter().copied());
    let (distance, best) = known
        .map(|k| {
            let k_tail = k.strip_prefix("FLEET_LIMITER_").unwrap_or(k);
            (edit_distance(tail, k_tail), k)
        })
        .min_by_key(|(d, _)| *d)?;
    (distance <= 3 && distance * 3 <= tail.len().max(1)).then_some(best)
}

/// Levenshtein distance (insertions, deletions, substitutions) between two ASCII names.
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let substitute = prev[j] + usize::from(ca != cb);
            cur[j + 1] = substitute.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// `--store memory` or `--store redis://host:6379`.
fn apply_store_shorthand(
    doc: &mut toml::Table,
    raw: &str,
    origin: &str,
    origins: &mut HashMap<String, String>,
) -> Result<(), ConfigError> {
    let raw = raw.trim();
    if raw.eq_ignore_ascii_case("memory") {
        // The shorthand chooses the store whole: a URL or cluster from a lower layer is set aside.
        set_path(doc, "store.backend", Value::String("memory".into()));
        if let Some(Value::Table(t)) = doc.get_mut("store") {
            t.remove("url");
            t.remove("cluster");
        }
        origins.remove("store.url");
        origins.remove("store.cluster");
    } else if raw.starts_with("redis://") || raw.starts_with("rediss://") {
        set_path(doc, "store.backend", Value::String("redis".into()));
        set_path(doc, "store.url", Value::String(raw.to_owned()));
        origins.insert("store.url".into(), origin.to_owned());
    } else {
        return Err(ConfigError(format!(
            "{origin}: store: `{}` is neither `memory` nor a redis:// or rediss:// URL",
            crate::redact::url(raw)
        )));
    }
    origins.insert("store.backend".into(), origin.to_owned());
    Ok(())
}

fn apply_flag(
    doc: &mut toml::Table,
    path: &str,
    raw: &str,
    flag: &str,
    origins: &mut HashMap<String, String>,
) -> Result<(), ConfigError> {
    let origin = format!("flag {flag}");
    if path == "store" {
        return apply_store_shorthand(doc, raw, &origin, origins);
    }
    let kind = SETTINGS
        .iter()
        .find(|(p, _, _)| *p == path)
        .map(|(_, _, k)| *k)
        .ok_or_else(|| ConfigError(format!("{origin}: `{path}` is not a setting")))?;
    let v = match (kind, doc_get(doc, path)) {
        // A repeatable flag adds to what the flag already gave.
        (Kind::List, Some(Value::Array(prev))) if origins.get(path) == Some(&origin) => {
            let mut prev = prev.clone();
            if let Value::Array(more) = parse_kind(raw, kind, &origin, path)? {
                prev.extend(more);
            }
            Value::Array(prev)
        }
        _ => parse_kind(raw, kind, &origin, path)?,
    };
    set_path(doc, path, v);
    origins.insert(path.to_owned(), origin);
    Ok(())
}

fn doc_get<'a>(doc: &'a toml::Table, path: &str) -> Option<&'a Value> {
    let mut parts = path.split('.');
    let mut v = doc.get(parts.next()?)?;
    for p in parts {
        v = v.as_table()?.get(p)?;
    }
    Some(v)
}

/// A duration as `"15m"`, `"30s"`, `"500ms"`, `"1h"`, `"1d"`, or a whole number of seconds.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum DurationValue {
    Secs(u64),
    Text(String),
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    enabled: Option<bool>,
    #[serde(default)]
    server: RawServer,
    #[serde(default)]
    client_ip: RawClientIp,
    #[serde(default)]
    store: RawStore,
    #[serde(default)]
    fleet: FleetConfig,
    #[serde(default)]
    limiters: BTreeMap<String, RawLimiter>,
    #[serde(default)]
    identity: identity::RawIdentity,
    #[serde(default)]
    ops: ops::RawOps,
    #[serde(default)]
    cors: ops::RawCors,
    #[serde(default)]
    path: path::RawPath,
    #[serde(default)]
    decision: decision::RawDecision,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    listen: Option<String>,
    upstream: Option<String>,
    connect_timeout: Option<DurationValue>,
    read_timeout: Option<DurationValue>,
    body_timeout: Option<DurationValue>,
    body_min_rate: Option<rate::RateValue>,
    upstream_ca_file: Option<String>,
    upstream_insecure_skip_verify: Option<bool>,
    tls_cert_file: Option<String>,
    tls_key_file: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawClientIp {
    trust_proxy: Option<Vec<String>>,
    header: Option<ForwardedHeader>,
    ipv6_prefix: Option<i64>,
    trust_all_addresses: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStore {
    backend: Option<StoreBackend>,
    url: Option<String>,
    cluster: Option<Vec<String>>,
    max_keys: Option<i64>,
    timeout: Option<DurationValue>,
    calls_in_flight: Option<i64>,
    ca_file: Option<String>,
    insecure_skip_verify: Option<bool>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimiter {
    limit: Option<i64>,
    window: Option<DurationValue>,
    key: Option<KeyKind>,
    routes: Option<Vec<String>>,
    except: Option<Vec<String>>,
    group: Option<String>,
    credential: Option<CredentialMatch>,
    algorithm: Option<Algorithm>,
    mode: Option<Mode>,
    on_store_error: Option<OnStoreError>,
}

struct Ctx {
    pub(crate) origins: HashMap<String, String>,
    file: Option<String>,
}

impl Ctx {
    /// Where the value at `path` came from.
    fn origin(&self, path: &str) -> String {
        self.origins
            .get(path)
            .cloned()
            .or_else(|| self.file.clone().filter(|_| path.starts_with("limiters.")))
            .unwrap_or_else(|| "built-in default".to_owned())
    }

    /// An error about the value at `path`; a URL in it is printed without its password.
    fn err(&self, path: &str, msg: impl fmt::Display) -> ConfigError {
        let msg = msg.to_string();
        ConfigError(format!(
            "{}: {path}: {}",
            self.origin(path),
            crate::redact::urls_in(&msg)
        ))
    }
}

fn duration(
    ctx: &Ctx,
    path: &str,
    v: Option<DurationValue>,
    default: &str,
) -> Result<Duration, ConfigError> {
    let d = match v {
        None => parse_duration(default).map_err(|e| ctx.err(path, e))?,
        Some(DurationValue::Secs(s)) => Duration::from_secs(s),
        Some(DurationValue::Text(t)) => parse_duration(&t).map_err(|e| ctx.err(path, e))?,
    };
    if d.is_zero() {
        return Err(ctx.err(path, "must be longer than zero"));
    }
    Ok(d)
}

fn build(raw: RawConfig, ctx: &Ctx, source: Option<PathBuf>) -> Result<Config, ConfigError> {
    let listen_raw = raw
        .server
        .listen
        .unwrap_or_else(|| defaults::LISTEN.to_owned());
    let listen = listen_raw.parse::<SocketAddr>().map_err(|_| {
        ctx.err(
            "server.listen",
            format!(
                "`{listen_raw}` is not an address:port (e.g. \"127.0.0.1:8080\" or \"[::]:8080\")"
            ),
        )
    })?;
    let upstream = match raw.server.upstream {
        Some(u) => Some(validate_upstream(ctx, &u)?),
        None => None,
    };
    let path_of = |v: Option<String>| v.filter(|p| !p.trim().is_empty()).map(PathBuf::from);
    let tls_cert_file = path_of(raw.server.tls_cert_file);
    let tls_key_file = path_of(raw.server.tls_key_file);
    match (&tls_cert_file, &tls_key_file) {
        (Some(_), None) => {
            return Err(ctx.err(
                "server.tls_cert_file",
                "is set but server.tls_key_file is not: TLS on the listener needs both, the certificate chain and its private key (PEM); set server.tls_key_file (FLEET_LIMITER_TLS_KEY_FILE), or drop server.tls_cert_file to serve plain HTTP",
            ))
        }
        (None, Some(_)) => {
            return Err(ctx.err(
                "server.tls_key_file",
                "is set but server.tls_cert_file is not: TLS on the listener needs both, the certificate chain and its private key (PEM); set server.tls_cert_file (FLEET_LIMITER_TLS_CERT_FILE), or drop server.tls_key_file to serve plain HTTP",
            ))
        }
        _ => {}
    }
    let server = ServerConfig {
        listen,
        upstream,
        connect_timeout: duration(
            ctx,
            "server.connect_timeout",
            raw.server.connect_timeout,
            defaults::CONNECT_TIMEOUT,
        )?,
        read_timeout: duration(
            ctx,
            "server.read_timeout",
            raw.server.read_timeout,
            defaults::READ_TIMEOUT,
        )?,
        body_timeout: duration(
            ctx,
            "server.body_timeout",
            raw.server.body_timeout,
            defaults::BODY_TIMEOUT,
        )?,
        body_min_rate: rate::rate(
            ctx,
            "server.body_min_rate",
            raw.server.body_min_rate,
            defaults::BODY_MIN_RATE,
        )?,
        upstream_ca_file: path_of(raw.server.upstream_ca_file),
        upstream_insecure_skip_verify: raw.server.upstream_insecure_skip_verify.unwrap_or(false),
        tls_cert_file,
        tls_key_file,
    };

    let mut ranges = Vec::new();
    for r in raw.client_ip.trust_proxy.unwrap_or_default() {
        let net = r
            .parse::<ipnet::IpNet>()
            .or_else(|_| r.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
            .map_err(|_| {
                ctx.err(
                    "client_ip.trust_proxy",
                    format!("`{r}` is not an address or CIDR range (e.g. \"10.0.0.0/8\", \"::1\")"),
                )
            })?;
        ranges.push(net);
    }
    let trust_all_addresses = raw.client_ip.trust_all_addresses.unwrap_or(false);
    trust::check(ctx, &ranges, trust_all_addresses)?;
    let prefix = raw
        .client_ip
        .ipv6_prefix
        .unwrap_or(defaults::IPV6_PREFIX as i64);
    if !(32..=64).contains(&prefix) {
        return Err(ctx.err(
            "client_ip.ipv6_prefix",
            format!("{prefix} is out of range; use a prefix length from 32 to 64 (default 56)"),
        ));
    }
    let client_ip = ClientIpConfig {
        trusted: TrustedProxies::new(ranges, raw.client_ip.header.unwrap_or_default()),
        ipv6_prefix: prefix as u8,
        trust_all_addresses,
    };

    let max_keys = raw.store.max_keys.unwrap_or(defaults::MAX_KEYS as i64);
    if max_keys < 1 {
        return Err(ctx.err("store.max_keys", "must be at least 1 (default 100000)"));
    }
    let calls = raw
        .store
        .calls_in_flight
        .unwrap_or(defaults::STORE_CALLS_IN_FLIGHT as i64);
    if !(1..=16).contains(&calls) {
        return Err(ctx.err(
            "store.calls_in_flight",
            format!("{calls} is out of range; use 1 to 16 (default 1)"),
        ));
    }
    // A URL or a cluster list means Redis; saying `memory` as well is a contradiction, not a
    // choice to make silently (each instance would count on its own).
    let redis_given = if raw.store.url.is_some() {
        Some("store.url")
    } else if raw.store.cluster.as_ref().is_some_and(|c| !c.is_empty()) {
        Some("store.cluster")
    } else {
        None
    };
    let backend = match (raw.store.backend, redis_given) {
        (Some(StoreBackend::Memory), Some(given)) => {
            return Err(ctx.err(
                "store.backend",
                format!(
                    "`memory` keeps every bucket in this process, but {given} is set ({}), so instances would not share one budget; drop {given} for the memory store, or set backend = \"redis\" (FLEET_LIMITER_STORE_BACKEND=redis, or leave backend unset: a URL alone selects Redis)",
                    ctx.origin(given)
                ),
            ))
        }
        (Some(b), _) => b,
        (None, Some(_)) => StoreBackend::Redis,
        (None, None) => StoreBackend::Memory,
    };
    let store = StoreConfig {
        backend,
        url: raw.store.url,
        cluster: raw.store.cluster.unwrap_or_default(),
        max_keys: max_keys as usize,
        timeout: duration(
            ctx,
            "store.timeout",
            raw.store.timeout,
            defaults::STORE_TIMEOUT,
        )?,
        calls_in_flight: calls as usize,
        ca_file: match raw.store.ca_file.filter(|p| !p.trim().is_empty()) {
            Some(p) => Some(ca_file(ctx, "store.ca_file", &p)?),
            None => None,
        },
        insecure_skip_verify: raw.store.insecure_skip_verify.unwrap_or(false),
    };
    let path_of = |u: &String| {
        if store.url.as_ref() == Some(u) {
            "store.url"
        } else {
            "store.cluster"
        }
    };
    if let Some(u) = store
        .url
        .iter()
        .chain(&store.cluster)
        .find(|u| !(u.starts_with("redis://") || u.starts_with("rediss://")))
    {
        return Err(ctx.err(
            path_of(u),
            format!("`{u}` is not a redis:// or rediss:// (TLS) URL"),
        ));
    }
    // One client speaks to every node: TLS for all of them or for none.
    let tls_urls = store
        .url
        .iter()
        .chain(&store.cluster)
        .filter(|u| u.starts_with("rediss://"))
        .count();
    if !store.cluster.is_empty() && tls_urls != 0 && tls_urls != store.cluster.len() {
        return Err(ctx.err(
            "store.cluster",
            "mixes redis:// and rediss:// node URLs; a Cluster is reached over TLS on every node or on none",
        ));
    }
    if store.backend == StoreBackend::Redis && store.url.is_none() && store.cluster.is_empty() {
        return Err(ctx.err(
            "store.backend",
            "the redis backend needs `store.url` (redis://host:6379) or a `store.cluster` list of node URLs",
        ));
    }

    let explicit = ceiling::Explicit::of(raw.limiters.get(ceiling::AGENT_IP));
    let mut limiters = build_limiters(raw.limiters, ctx)?;
    ceiling::derive_agent_ip(&mut limiters, explicit, &raw.fleet, ctx)?;
    let identity = identity::build(raw.identity, ctx)?;
    let decision = decision::build_decision(raw.decision, &client_ip.trusted, ctx)?;
    Ok(Config {
        source,
        enabled: raw.enabled.unwrap_or(true),
        server,
        client_ip,
        store,
        fleet: raw.fleet,
        limiters,
        identity,
        ops: ops::build_ops(raw.ops, ctx)?,
        cors: ops::build_cors(raw.cors, ctx)?,
        path: path::build_path(raw.path, ctx)?,
        decision,
        origins: ctx.origins.clone(),
    })
}

/// A CA bundle setting: the path of a readable file (its certificates are read when the client
/// is built).
fn ca_file(ctx: &Ctx, path: &str, value: &str) -> Result<PathBuf, ConfigError> {
    let p = PathBuf::from(value.trim());
    match std::fs::metadata(&p) {
        Ok(m) if m.is_file() => Ok(p),
        Ok(_) => Err(ctx.err(
            path,
            format!(
                "`{}` is not a file; name a PEM bundle of CA certificates",
                p.display()
            ),
        )),
        Err(e) => Err(ctx.err(
            path,
            format!(
                "`{}` cannot be read ({e}); name a PEM bundle of CA certificates",
                p.display()
            ),
        )),
    }
}

fn validate_upstream(ctx: &Ctx, u: &str) -> Result<String, ConfigError> {
    let trimmed = u.trim().trim_end_matches('/');
    let rest = trimmed
        .strip_prefix("http://")
        .or_else(|| trimmed.strip_prefix("https://"))
        .ok_or_else(|| {
            ctx.err(
                "server.upstream",
                format!(
                    "`{u}` must be an http:// or https:// URL of the upstream API (e.g. \"http://127.0.0.1:3000\" or \"https://api.internal\")"
                ),
            )
        })?;
    if rest.is_empty() || rest.contains(['?', '#']) {
        return Err(ctx.err(
            "server.upstream",
            format!("`{u}` must be scheme, host, port and optionally a path prefix"),
        ));
    }
    if let Some(why) = upstream::problem(rest) {
        return Err(ctx.err("server.upstream", format!("`{u}` {why}")));
    }
    Ok(trimmed.to_owned())
}

fn builtin_raw(b: &defaults::BuiltIn) -> RawLimiter {
    let owned = |xs: &[&str]| xs.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    RawLimiter {
        limit: Some(b.limit as i64),
        window: Some(DurationValue::Text(b.window.to_owned())),
        key: Some(b.key),
        routes: Some(owned(b.routes)),
        except: Some(owned(b.except)),
        group: b.group.map(str::to_owned),
        credential: Some(b.credential),
        algorithm: None,
        mode: None,
        on_store_error: None,
    }
}

fn overlay(base: RawLimiter, over: RawLimiter) -> RawLimiter {
    RawLimiter {
        limit: over.limit.or(base.limit),
        window: over.window.or(base.window),
        key: over.key.or(base.key),
        routes: over.routes.or(base.routes),
        except: over.except.or(base.except),
        group: over.group.or(base.group),
        credential: over.credential.or(base.credential),
        algorithm: over.algorithm.or(base.algorithm),
        mode: over.mode.or(base.mode),
        on_store_error: over.on_store_error.or(base.on_store_error),
    }
}

fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 64
        && n.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

fn build_limiters(
    mut given: BTreeMap<String, RawLimiter>,
    ctx: &Ctx,
) -> Result<Vec<LimiterSpec>, ConfigError> {
    let builtin_names: Vec<&str> = defaults::LIMITERS.iter().map(|b| b.name).collect();
    let mut merged: Vec<(String, RawLimiter, bool)> = defaults::LIMITERS
        .iter()
        .map(|b| {
            let base = builtin_raw(b);
            let r = match given.remove(b.name) {
                Some(over) => overlay(base, over),
                None => base,
            };
            (b.name.to_owned(), r, true)
        })
        .collect();
    merged.extend(given.into_iter().map(|(n, r)| (n, r, false)));

    let mut out = Vec::with_capacity(merged.len());
    for (name, r, builtin) in merged {
        let at = |f: &str| format!("limiters.{name}.{f}");
        if !valid_name(&name) {
            return Err(ctx.err(
                &format!("limiters.{name}"),
                "a limiter name is 1-64 characters of a-z, 0-9, `-` and `_`",
            ));
        }
        if !builtin {
            let missing: Vec<&str> = [
                ("limit", r.limit.is_none()),
                ("window", r.window.is_none()),
                ("key", r.key.is_none()),
                ("routes", r.routes.is_none()),
            ]
            .iter()
            .filter(|(_, m)| *m)
            .map(|(f, _)| *f)
            .collect();
            if !missing.is_empty() {
                return Err(ctx.err(
                    &format!("limiters.{name}"),
                    format!(
                        "`{name}` is not a built-in limiter ({}), so it defines a new one and needs {}",
                        builtin_names.join(", "),
                        missing.join(", ")
                    ),
                ));
            }
        }
        let limit = r.limit.unwrap_or(0);
        if limit < 1 || limit > u32::MAX as i64 {
            return Err(ctx.err(
                &at("limit"),
                format!("{limit} is not a budget; use a whole number of requests, at least 1"),
            ));
        }
        let window = duration(ctx, &at("window"), r.window, "1m")?;
        if window > Duration::from_secs(7 * 86_400) {
            return Err(ctx.err(
                &at("window"),
                "is longer than 7 days; use a window from 1s to 7d",
            ));
        }
        let parse_routes =
            |field: &str, list: Option<Vec<String>>| -> Result<Vec<RoutePattern>, ConfigError> {
                list.unwrap_or_default()
                    .iter()
                    .map(|s| {
                        s.parse::<RoutePattern>()
                            .map_err(|e| ctx.err(&at(field), e))
                    })
                    .collect()
            };
        let routes = parse_routes("routes", r.routes)?;
        if routes.is_empty() {
            return Err(ctx.err(
                &at("routes"),
                "is empty; name at least one route, e.g. [\"/api/agent/**\"]",
            ));
        }
        let except = parse_routes("except", r.except)?;
        let group = r.group.unwrap_or_else(|| name.clone());
        out.push(LimiterSpec {
            name: Arc::from(name.as_str()),
            quota: Quota::new(limit as u32, window, r.algorithm.unwrap_or_default()),
            key: r.key.unwrap_or(KeyKind::Ip),
            routes,
            except,
            group: Arc::from(group.as_str()),
            credential: r.credential.unwrap_or_default(),
            mode: r.mode.unwrap_or_default(),
            on_store_error: r.on_store_error.unwrap_or_default(),
        });
    }
    check_precedence(&out, ctx)?;
    Ok(out)
}

/// Within one group the most specific route wins; two routes of equal specificity that can
/// match the same request leave no winner, which is an error.
fn check_precedence(limiters: &[LimiterSpec], ctx: &Ctx) -> Result<(), ConfigError> {
    for (i, a) in limiters.iter().enumerate() {
        for b in &limiters[i + 1..] {
            if a.group != b.group {
                continue;
            }
            for ra in &a.routes {
                for rb in &b.routes {
                    if ra.overlaps(rb) && ra.specificity() == rb.specificity() {
                        return Err(ctx.err(
                            &format!("limiters.{}.routes", b.name),
                            format!(
                                "route `{rb}` overlaps `{ra}` of limiter `{}` in group `{}` with the same specificity, so neither takes precedence; make one route more specific, or put the limiters in different groups (they then both apply)",
                                a.name, a.group
                            ),
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
