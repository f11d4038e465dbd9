//! The table of settings: every scalar setting once, with its TOML path, its environment
//! variable, its `serve` flag, the kind of value it takes, its default, whether a reload applies
//! it, and one line of help.
//!
//! Everything else is read from it: the flags of `serve` (`flags.rs`), the environment layer
//! and the unknown-variable warnings (`layers.rs`), the words of a type error (`errors.rs`), the
//! settings a reload reports under `restart_required` ([`restart_required`]), and the test that
//! docs/configuration.md lists every row. A new setting is a row here and the code that reads
//! its value (its field in the section's raw form and what `build` makes of it).

use super::Config;

/// One setting.
#[derive(Debug, Clone, Copy)]
pub struct Setting {
    /// Its TOML path (`server.listen`). `store` is the shorthand that sets `store.backend` and
    /// `store.url` together.
    pub path: &'static str,
    /// Its environment variable.
    pub variable: &'static str,
    /// Its flag of `serve`, if it has one.
    pub flag: Option<Flag>,
    /// What it takes.
    pub kind: Kind,
    /// Its value when no layer sets it.
    pub default: DefaultValue,
    /// Whether a reload applies it.
    pub reload: Reload,
    /// One line of help (the flag's help, before its default).
    pub help: &'static str,
}

/// A command-line flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flag {
    /// The name after `--`.
    pub name: &'static str,
    /// What `--help` calls its value; empty for a switch that takes none.
    pub value_name: &'static str,
    /// Each use adds to the list (`--trust-proxy A --trust-proxy B`) instead of being refused.
    pub repeatable: bool,
}

/// The kind of value a setting takes: how a variable or a flag is read into the document, and
/// what a type error says is expected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A string.
    Str,
    /// A whole number.
    Int,
    /// `true` or `false` (a variable or flag also takes `1`/`0`, `yes`/`no`, `on`/`off`).
    Bool,
    /// A list of strings; comma-separated in a variable or a flag.
    List,
    /// A list of strings, or one string of comma-separated values (in the file too).
    StrOrList,
    /// `"500ms"`, `"30s"`, `"15m"`, `"1h"`, `"1d"`, or a whole number of seconds.
    Duration,
    /// Bytes per second: `240`, `"1KiB"`, `"2 MB/s"`, `0` or `"off"`.
    Rate,
    /// One of these words.
    Choice(&'static [&'static str]),
    /// A list of status codes (`503`) and ranges in quotes (`"400-499"`).
    Statuses,
    /// `memory`, or a `redis://` or `rediss://` URL: the store shorthand.
    Store,
}

/// A setting's value when no layer sets it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DefaultValue {
    /// Unset: off, empty or absent until a layer sets it.
    None,
    /// This value, written as a variable would take it: setting it changes nothing.
    Is(&'static str),
    /// Worked out at start, as described (from other settings, or from the machine).
    Derived(&'static str),
}

/// Whether a reload applies a setting.
#[derive(Debug, Clone, Copy)]
pub enum Reload {
    /// Read again on every reload (SIGHUP, `POST /reload`).
    Live,
    /// Taken at start only: a reload whose configuration differs here (the function says
    /// whether it does) keeps the old value and reports the setting under `restart_required`.
    Restart(fn(&Config, &Config) -> bool),
}

/// Restart-only, compared on the validated value at this field path of [`Config`].
macro_rules! restart {
    ($($field:ident).+) => {
        Reload::Restart(|a: &Config, b: &Config| a.$($field).+ != b.$($field).+)
    };
}

const fn row(
    path: &'static str,
    variable: &'static str,
    kind: Kind,
    default: DefaultValue,
    reload: Reload,
    help: &'static str,
) -> Setting {
    Setting {
        path,
        variable,
        flag: None,
        kind,
        default,
        reload,
        help,
    }
}

impl Setting {
    /// This setting, with a flag of `serve` named `--{name} <{value_name}>`.
    const fn flag(mut self, name: &'static str, value_name: &'static str) -> Self {
        self.flag = Some(Flag {
            name,
            value_name,
            repeatable: false,
        });
        self
    }

    /// This setting, with a repeatable flag: each use adds to the list.
    const fn flags(mut self, name: &'static str, value_name: &'static str) -> Self {
        self.flag = Some(Flag {
            name,
            value_name,
            repeatable: true,
        });
        self
    }

    /// The section it belongs to: the first part of its path.
    pub fn section(&self) -> &'static str {
        self.path.split('.').next().unwrap_or(self.path)
    }

    /// The flag's help: the help line and the default.
    pub fn flag_help(&self) -> String {
        match self.default {
            DefaultValue::None => self.help.to_owned(),
            DefaultValue::Is(v) | DefaultValue::Derived(v) => {
                format!("{} [default: {v}]", self.help)
            }
        }
    }

    /// The name a reload reports when this restart-only setting changed: its section when
    /// every setting of the section is restart-only (`store`, `identity`), else its path.
    pub fn restart_name(&self) -> &'static str {
        let section = self.section();
        let whole = SETTINGS
            .iter()
            .filter(|s| s.section() == section)
            .all(|s| matches!(s.reload, Reload::Restart(_)));
        if whole {
            section
        } else {
            self.path
        }
    }
}

use DefaultValue::{Derived, Is, None as Unset};
use Kind::*;
use Reload::Live;

const PATH_ACTION: Kind = Choice(&["reject", "allow"]);

/// Every setting, in the order of docs/configuration.md.
#[rustfmt::skip]
pub const SETTINGS: &[Setting] = &[
    row("enabled", "FLEET_LIMITER_ENABLED", Bool, Is("true"), Live,
        "`false` forwards every request unmetered, with no limit headers"),
    row("calibration", "FLEET_LIMITER_CALIBRATION", Choice(&["agent-fleet", "none"]), Is("agent-fleet"), Live,
        "The limiters to start from: `agent-fleet` (the built-in ones, adjusted by [limiters]) or `none` (only those [limiters] defines)"),
    row("server.listen", "FLEET_LIMITER_LISTEN", Str, Is("127.0.0.1:8080"), restart!(server.listen),
        "Address to listen on").flag("listen", "ADDR"),
    row("server.upstream", "FLEET_LIMITER_UPSTREAM", Str, Unset, restart!(server.upstream),
        "The upstream API, e.g. http://127.0.0.1:3000 or https://api.internal").flag("upstream", "URL"),
    row("server.connect_timeout", "FLEET_LIMITER_CONNECT_TIMEOUT", Duration, Is("2s"), restart!(server.connect_timeout),
        "Upstream connect timeout").flag("connect-timeout", "DURATION"),
    row("server.read_timeout", "FLEET_LIMITER_READ_TIMEOUT", Duration, Is("30s"), restart!(server.read_timeout),
        "Upstream response timeout").flag("read-timeout", "DURATION"),
    row("server.body_timeout", "FLEET_LIMITER_BODY_TIMEOUT", Duration, Is("30s"), restart!(server.body_timeout),
        "Longest wait for the next chunk of a client's request body").flag("body-timeout", "DURATION"),
    row("server.body_min_rate", "FLEET_LIMITER_BODY_MIN_RATE", Rate, Is("240"), restart!(server.body_min_rate),
        "Least average bytes per second of a request body after 5 s; 0 for none").flag("body-min-rate", "RATE"),
    row("server.body_key_max_bytes", "FLEET_LIMITER_BODY_KEY_MAX_BYTES", Int, Is("16384"), Live,
        "Largest request body read for a body:<field> key (64 to 1048576); a larger one keys on the address").flag("body-key-max-bytes", "BYTES"),
    row("server.upstream_ca_file", "FLEET_LIMITER_UPSTREAM_CA_FILE", Str, Unset, restart!(server.upstream_ca_file),
        "A PEM file of CA certificates trusted for an https:// upstream, besides the system's roots"),
    row("server.upstream_insecure_skip_verify", "FLEET_LIMITER_UPSTREAM_INSECURE_SKIP_VERIFY", Bool, Is("false"),
        restart!(server.upstream_insecure_skip_verify),
        "Accept any certificate from an https:// upstream (testing only; warned at every start)"),
    // A new pair of files is read on every reload; turning TLS on or off changes the listener.
    row("server.tls_cert_file", "FLEET_LIMITER_TLS_CERT_FILE", Str, Unset,
        Reload::Restart(|a, b| a.server.tls_cert_file.is_some() != b.server.tls_cert_file.is_some()),
        "Serve the traffic listener over TLS with this PEM certificate chain (with server.tls_key_file)"),
    row("server.tls_key_file", "FLEET_LIMITER_TLS_KEY_FILE", Str, Unset, Live,
        "The private key (PEM) of server.tls_cert_file"),
    row("server.reuse_port", "FLEET_LIMITER_REUSE_PORT", Bool, Is("false"), restart!(server.reuse_port),
        "Bind every listener with SO_REUSEPORT, so that a new process can listen beside a draining one"),
    row("client_ip.trust_proxy", "FLEET_LIMITER_TRUST_PROXY", List, Unset, Live,
        "A proxy range whose forwarding headers are trusted (repeatable; none by default)").flags("trust-proxy", "CIDR"),
    row("client_ip.header", "FLEET_LIMITER_FORWARDED_HEADER", Choice(&["x-forwarded-for", "forwarded"]), Is("x-forwarded-for"), Live,
        "The header trusted proxies write: x-forwarded-for or forwarded").flag("forwarded-header", "NAME"),
    row("client_ip.ipv6_prefix", "FLEET_LIMITER_IPV6_PREFIX", Int, Is("56"), Live,
        "IPv6 prefix length that counts as one client (32-64)").flag("ipv6-prefix", "BITS"),
    row("client_ip.trust_all_addresses", "FLEET_LIMITER_TRUST_ALL_ADDRESSES", Bool, Is("false"), Live,
        "Accept a trust_proxy list that covers every IPv4 or IPv6 address (only behind a proxy that overwrites the header)"),
    row("store", "FLEET_LIMITER_STORE", Store, Is("memory"), restart!(store),
        "Where buckets live: `memory`, or a redis://, rediss:// (TLS) or redis+sentinel:// URL").flag("store", "STORE"),
    row("store.backend", "FLEET_LIMITER_STORE_BACKEND", Choice(&["memory", "redis"]),
        Derived("redis when store.url or store.cluster is set, else memory"), restart!(store),
        "Where buckets live: `memory` or `redis`"),
    row("store.url", "FLEET_LIMITER_STORE_URL", Str, Unset, restart!(store),
        "The Redis primary, redis://[user:password@]host:port[/db] (rediss:// for TLS), or the Sentinels that name it, redis+sentinel://[user:password@]host:port[,host:port...]/<master-name>[/db] (rediss+sentinel:// for TLS)"),
    row("store.cluster", "FLEET_LIMITER_STORE_CLUSTER", List, Unset, restart!(store),
        "Some node URLs of a Redis Cluster, all redis:// or all rediss://"),
    row("store.ca_file", "FLEET_LIMITER_STORE_CA_FILE", Str, Unset, restart!(store),
        "rediss:// and rediss+sentinel:// only: a PEM bundle of CA certificates trusted in addition to the system roots"),
    row("store.insecure_skip_verify", "FLEET_LIMITER_STORE_INSECURE_SKIP_VERIFY", Bool, Is("false"), restart!(store),
        "rediss:// and rediss+sentinel:// only: accept any server certificate (development only; warned at every start)"),
    row("store.require", "FLEET_LIMITER_STORE_REQUIRE", Bool, Is("false"), restart!(store),
        "Redis only: refuse to start (exit code 2) when the store cannot be reached, and answer /readyz 503 while it does not answer"),
    row("store.timeout", "FLEET_LIMITER_STORE_TIMEOUT", Duration, Is("50ms"), restart!(store),
        "The longest a decision waits for Redis before each limiter's on_store_error answers"),
    row("store.calls_in_flight", "FLEET_LIMITER_STORE_CALLS_IN_FLIGHT", Int, Is("1"), restart!(store),
        "Redis standalone: script calls out at once, 1 to 16"),
    row("store.max_keys", "FLEET_LIMITER_MAX_KEYS", Int, Is("100000"), restart!(store),
        "Most buckets the memory store tracks").flag("max-keys", "N"),
    row("store.state_file", "FLEET_LIMITER_STORE_STATE_FILE", Str, Unset, restart!(store),
        "Memory store: write the buckets here on stop and read them back at start"),
    row("fleet.heartbeat_interval_seconds", "FLEET_LIMITER_HEARTBEAT_INTERVAL_SECONDS", Int, Is("60"), Live,
        "How often a healthy agent sends a heartbeat"),
    row("fleet.poll_interval_seconds", "FLEET_LIMITER_POLL_INTERVAL_SECONDS", Int, Is("30"), Live,
        "How often a healthy agent polls for tasks"),
    row("fleet.heartbeat_timeout_seconds", "FLEET_LIMITER_HEARTBEAT_TIMEOUT_SECONDS", Int, Is("180"), Live,
        "After this long without a heartbeat the API marks an agent offline"),
    row("fleet.max_site_endpoints", "FLEET_LIMITER_MAX_SITE_ENDPOINTS", Int, Is("250"), Live,
        "The largest fleet behind one NAT address"),
    row("fleet.dashboard_poll_seconds", "FLEET_LIMITER_DASHBOARD_POLL_SECONDS", Int, Is("10"), Live,
        "The dashboard's fastest polling interval"),
    row("fleet.analysts_per_nat", "FLEET_LIMITER_ANALYSTS_PER_NAT", Int, Is("20"), Live,
        "Dashboard users behind one NAT address"),
    row("fleet.max_agents", "FLEET_LIMITER_MAX_AGENTS", Int, Is("10000"), Live,
        "The enrolled agents one instance must remember at once"),
    row("identity.jwks_url", "FLEET_LIMITER_JWKS_URL", Str, Unset, restart!(identity),
        "https:// URL of the issuer's JSON Web Key Set (http:// only to a loopback address)"),
    row("identity.jwks_ca_file", "FLEET_LIMITER_JWKS_CA_FILE", Str, Unset, restart!(identity),
        "https:// only: a PEM bundle of CA certificates trusted in addition to the system roots"),
    row("identity.jwks_insecure_skip_verify", "FLEET_LIMITER_JWKS_INSECURE_SKIP_VERIFY", Bool, Is("false"), restart!(identity),
        "https:// only: accept any certificate from the key-set endpoint (development only)"),
    row("identity.jwks_allow_http", "FLEET_LIMITER_JWKS_ALLOW_HTTP", Bool, Is("false"), restart!(identity),
        "Fetch the key set over plain http:// from a host that is not a loopback address"),
    row("identity.jwt_public_key_pem", "FLEET_LIMITER_JWT_PUBLIC_KEY_PEM", Str, Unset, restart!(identity),
        "PEM public key (RSA, EC P-256/P-384, Ed25519), inline or a file path"),
    row("identity.jwt_hs256_secret", "FLEET_LIMITER_JWT_HS256_SECRET", Str, Unset, restart!(identity),
        "Shared HS256 secret (openssl rand -base64 48)"),
    row("identity.jwt_issuer", "FLEET_LIMITER_JWT_ISSUER", StrOrList, Unset, restart!(identity),
        "Accepted iss values"),
    row("identity.jwt_audience", "FLEET_LIMITER_JWT_AUDIENCE", StrOrList, Unset, restart!(identity),
        "Accepted aud values; when set, aud is required"),
    row("identity.authorized_parties", "FLEET_LIMITER_AUTHORIZED_PARTIES", StrOrList, Unset, restart!(identity),
        "Accepted azp values; when set, azp is required"),
    row("identity.session_cookie", "FLEET_LIMITER_SESSION_COOKIE", Str, Is("__session"), restart!(identity),
        "Cookie carrying the session token when the request has no Bearer token"),
    row("identity.allow_weak_secret", "FLEET_LIMITER_ALLOW_WEAK_SECRET", Bool, Is("false"), restart!(identity),
        "Start with a weak HS256 secret anyway (development only; warned at every start)"),
    row("identity.leeway", "FLEET_LIMITER_JWT_LEEWAY", Duration, Is("5s"), restart!(identity),
        "Clock skew tolerated on exp and nbf, at most 5 minutes"),
    row("identity.jwks_refresh_interval", "FLEET_LIMITER_JWKS_REFRESH_INTERVAL", Duration, Is("30s"), restart!(identity),
        "Least time between two JWKS fetches"),
    row("identity.jwks_max_age", "FLEET_LIMITER_JWKS_MAX_AGE", Duration, Is("10m"), restart!(identity),
        "Age after which keys are refreshed in the background"),
    row("identity.jwks_timeout", "FLEET_LIMITER_JWKS_TIMEOUT", Duration, Is("2s"), restart!(identity),
        "Longest a JWKS fetch may take"),
    row("identity.cache_max_entries", "FLEET_LIMITER_JWT_CACHE_MAX_ENTRIES", Int, Is("10000"), restart!(identity),
        "Most verified tokens remembered (by digest)"),
    row("ops.admin_listen", "FLEET_LIMITER_ADMIN_LISTEN", Str, Is("127.0.0.1:7391"), restart!(ops.admin_listen),
        "Address of the admin listener (/metrics, /healthz, /readyz, /reload)").flag("admin-listen", "ADDR"),
    row("ops.shutdown_grace", "FLEET_LIMITER_SHUTDOWN_GRACE", Duration, Is("30s"), restart!(ops.shutdown_grace),
        "How long in-flight requests may finish once the listeners close after SIGTERM/SIGINT")
        .flag("shutdown-grace", "DURATION"),
    row("ops.drain_delay", "FLEET_LIMITER_DRAIN_DELAY", Duration, Is("5s"), Live,
        "After SIGTERM, how long the listeners keep accepting while /readyz answers 503, before in-flight requests get --shutdown-grace to finish")
        .flag("drain-delay", "DURATION"),
    row("ops.near_limit_percent", "FLEET_LIMITER_NEAR_LIMIT_PERCENT", Int, Is("20"), Live,
        "An allowed decision is near the limit when less than this percentage of the budget remains"),
    row("ops.admin_token", "FLEET_LIMITER_ADMIN_TOKEN", Str, Unset, Live,
        "Bearer token the admin listener's levers (/overrides, /reset, /explain, /reload) require; without one they answer on a loopback admin listener only"),
    row("ops.admin_hosts", "FLEET_LIMITER_ADMIN_HOSTS", List, Unset, Live,
        "Host names the admin listener answers to besides IP addresses and localhost (a request with another Host is refused: DNS rebinding)"),
    row("ops.top_talkers", "FLEET_LIMITER_TOP_TALKERS", Bool, Is("true"), Live,
        "Count each decision into the top-talker lists the admin listener serves at /top"),
    row("ops.log_format", "FLEET_LIMITER_LOG_FORMAT", Choice(&["text", "json"]), Is("text"), restart!(ops.log_format),
        "Log lines as `text` or `json`").flag("log-format", "FORMAT"),
    row("cors.allowed_origins", "FLEET_LIMITER_CORS_ALLOWED_ORIGINS", List, Unset, Live,
        "Origins (scheme://host[:port]) whose scripts may read the gateway's own responses, or *"),
    row("cors.allow_credentials", "FLEET_LIMITER_CORS_ALLOW_CREDENTIALS", Bool, Is("false"), Live,
        "Send Access-Control-Allow-Credentials: true"),
    row("path.invalid_escape", "FLEET_LIMITER_PATH_INVALID_ESCAPE", PATH_ACTION, Is("reject"), Live,
        "A `%` not followed by two hex digits: reject or allow"),
    row("path.invalid_utf8", "FLEET_LIMITER_PATH_INVALID_UTF8", PATH_ACTION, Is("reject"), Live,
        "Escapes that do not decode to UTF-8: reject or allow"),
    row("path.encoded_slash", "FLEET_LIMITER_PATH_ENCODED_SLASH", PATH_ACTION, Is("reject"), Live,
        "%2F and %5C: reject or allow"),
    row("path.backslash", "FLEET_LIMITER_PATH_BACKSLASH", PATH_ACTION, Is("reject"), Live,
        "A raw backslash: reject or allow"),
    row("path.semicolon", "FLEET_LIMITER_PATH_SEMICOLON", PATH_ACTION, Is("reject"), Live,
        "; and %3B: reject or allow"),
    row("path.control", "FLEET_LIMITER_PATH_CONTROL", PATH_ACTION, Is("reject"), Live,
        "NUL and control characters: reject or allow"),
    row("path.segment_edge", "FLEET_LIMITER_PATH_SEGMENT_EDGE", PATH_ACTION, Is("reject"), Live,
        "A segment ending in `.`, or starting or ending with whitespace: reject or allow"),
    row("decision.listen", "FLEET_LIMITER_DECISION_LISTEN", Str, Is("off"), restart!(decision),
        "Address of the forward-auth decision listener for nginx, Caddy, Traefik and Envoy (needs decision.allow_from)")
        .flag("decision-listen", "ADDR"),
    row("decision.allow_from", "FLEET_LIMITER_DECISION_ALLOW_FROM", List, Unset, restart!(decision),
        "The proxies that may ask the decision endpoint (addresses or CIDR ranges)"),
    row("rls.listen", "FLEET_LIMITER_RLS_LISTEN", Str, Is("off"), restart!(rls.listen),
        "Address of the gRPC listener for Envoy's rate-limit service (envoy.service.ratelimit.v3; needs rls.config and rls.allow_from)")
        .flag("rls-listen", "ADDR"),
    row("rls.config", "FLEET_LIMITER_RLS_CONFIG", Str, Unset, Live,
        "envoyproxy/ratelimit YAML configuration: one file, or a directory of *.yaml files, one domain each")
        .flag("rls-config", "FILE"),
    row("rls.allow_from", "FLEET_LIMITER_RLS_ALLOW_FROM", List, Unset, Live,
        "The Envoy proxies that may ask the rate-limit service (addresses or CIDR ranges)"),
    row("rls.descriptor_limit", "FLEET_LIMITER_RLS_DESCRIPTOR_LIMIT", Bool, Is("false"), Live,
        "Honour a descriptor's own `limit` (the client then chooses its budget); off: the YAML's limit applies"),
    row("admission.max_in_flight", "FLEET_LIMITER_ADMISSION_MAX_IN_FLIGHT", Int, Is("0"), restart!(admission),
        "Most requests forwarded to the upstream at once; 0 for no cap").flag("admission-max-in-flight", "N"),
    row("admission.queue", "FLEET_LIMITER_ADMISSION_QUEUE", Int, Is("16"), restart!(admission),
        "How many requests may wait for a slot when every one is taken").flag("admission-queue", "N"),
    row("admission.queue_timeout", "FLEET_LIMITER_ADMISSION_QUEUE_TIMEOUT", Duration, Is("1s"), restart!(admission),
        "How long one request may wait for a slot before it gets 503").flag("admission-queue-timeout", "DURATION"),
    row("admission.client_share_percent", "FLEET_LIMITER_ADMISSION_CLIENT_SHARE_PERCENT", Int, Is("25"), restart!(admission),
        "The most of a group's admission slots one client address may hold or wait for, in percent; past it, 429")
        .flag("admission-client-share-percent", "PERCENT"),
    row("admission.body_hold", "FLEET_LIMITER_ADMISSION_BODY_HOLD", Duration, Is("60s"), restart!(admission),
        "How long a request holding an admission slot may keep the gateway waiting for its body in all; past it, 408 and the slot given back")
        .flag("admission-body-hold", "DURATION"),
    row("methods.override", "FLEET_LIMITER_METHOD_OVERRIDE", Choice(&["meter", "strip", "refuse"]), Is("meter"), Live,
        "A request naming another method (X-HTTP-Method-Override, `_method`): `meter` it as both, `strip` the override, or `refuse` it")
        .flag("method-override", "MODE"),
    row("methods.override_headers", "FLEET_LIMITER_METHOD_OVERRIDE_HEADERS", List,
        Is("X-HTTP-Method-Override,X-HTTP-Method,X-Method-Override"), Live,
        "The method-override headers read"),
    row("methods.override_params", "FLEET_LIMITER_METHOD_OVERRIDE_PARAMS", List, Is("_method"), Live,
        "The method-override query parameters read"),
    row("methods.allowed", "FLEET_LIMITER_ALLOWED_METHODS", List, Is("GET,HEAD,POST,PUT,PATCH,DELETE,OPTIONS"), Live,
        "The methods forwarded, comma-separated; any other is answered 501").flag("allowed-methods", "METHODS"),
    row("websocket.max_open", "FLEET_LIMITER_WEBSOCKET_MAX_OPEN", Int,
        Derived("an eighth of the open-file limit, at most 8192"), restart!(websocket),
        "The most WebSockets open at once").flag("websocket-max-open", "N"),
    row("websocket.max_per_client", "FLEET_LIMITER_WEBSOCKET_MAX_PER_CLIENT", Int, Derived("an eighth of the cap"),
        restart!(websocket),
        "The most WebSockets one client address holds at once").flag("websocket-max-per-client", "N"),
    row("websocket.idle_timeout", "FLEET_LIMITER_WEBSOCKET_IDLE_TIMEOUT", Duration, Is("5m"), restart!(websocket),
        "A WebSocket with no byte either way for this long is closed on both sides").flag("websocket-idle-timeout", "DURATION"),
    row("headers.standard", "FLEET_LIMITER_HEADERS_STANDARD", Choice(&["draft-6", "draft-7", "draft-8", "draft-10", "off"]), Is("draft-6"), Live,
        "The IETF `RateLimit*` headers: draft-6, draft-7, draft-8, draft-10 or off").flag("headers-standard", "STANDARD"),
    row("headers.legacy", "FLEET_LIMITER_HEADERS_LEGACY", Bool, Is("true"), Live,
        "Send `X-RateLimit-Limit`, `-Remaining` and `-Reset` too: true or false").flag("headers-legacy", "BOOL"),
    row("headers.legacy_reset", "FLEET_LIMITER_HEADERS_LEGACY_RESET", Choice(&["unix", "delta"]), Is("unix"), Live,
        "`X-RateLimit-Reset` as `unix` (a Unix time) or `delta` (seconds)").flag("headers-legacy-reset", "FORM"),
];

/// Fields of a limiter table, with their type for environment overrides
/// (`FLEET_LIMITER_LIMITER_<NAME>_<FIELD>`, e.g. `FLEET_LIMITER_LIMITER_AGENT_DEVICE_LIMIT=60`).
pub(crate) const LIMITER_FIELDS: &[(&str, Kind)] = &[
    ("on_store_error", Choice(&["allow", "deny", "local"])),
    ("algorithm", Choice(&["gcra", "fixed-window"])),
    ("credential", Choice(&["any", "api-key", "cli-token"])),
    ("routes", List),
    ("except", List),
    ("window", Duration),
    ("limit", Int),
    ("group", Str),
    ("mode", Choice(&["enforce", "shadow", "off"])),
    ("key", Str),
    ("meter", Choice(&["requests", "new-agents"])),
    ("known_for", Duration),
    ("max_known", Int),
    ("count", Choice(&["all", "failed", "succeeded"])),
    ("failed_statuses", Statuses),
    ("cost", Int),
    ("cost_header", Str),
    ("cost_max", Int),
    ("lockout", Duration),
    ("disclose", Bool),
];

/// Fields of an `[admission.groups.<name>]` table, set in the file only.
pub(crate) const GROUP_FIELDS: &[(&str, Kind)] = &[
    ("routes", List),
    ("max_in_flight", Int),
    ("queue", Int),
    ("body_hold", Duration),
];

/// A variable (and flag) read by the command itself, not by the configuration.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CommandSetting {
    pub variable: &'static str,
    /// Its flag, and the commands that take it.
    pub flag: Option<Flag>,
    pub help: &'static str,
}

/// `--config FILE`, every command.
pub(crate) const CONFIG_FILE: CommandSetting = CommandSetting {
    variable: "FLEET_LIMITER_CONFIG",
    flag: Some(Flag {
        name: "config",
        value_name: "FILE",
        repeatable: false,
    }),
    help: "TOML configuration file (every key optional; defaults are the built-in calibration)",
};

/// `--allow-unsafe-calibration`, `serve`.
pub(crate) const ALLOW_UNSAFE_CALIBRATION: CommandSetting = CommandSetting {
    variable: "FLEET_LIMITER_ALLOW_UNSAFE_CALIBRATION",
    flag: Some(Flag {
        name: "allow-unsafe-calibration",
        value_name: "",
        repeatable: false,
    }),
    help: "Start even when `fleet-limiter check` finds the calibration unsafe",
};

/// The log filter (`tracing` syntax).
pub(crate) const LOG_FILTER: CommandSetting = CommandSetting {
    variable: "FLEET_LIMITER_LOG",
    flag: None,
    help: "Which log lines are written, in `tracing` filter syntax (default: info)",
};

/// `--admin URL`, the levers (`override`, `reset`, `explain`, `top`): a running instance's
/// admin listener. Known here so that `serve` and `check` do not call it unknown.
pub(crate) const ADMIN_URL: CommandSetting = CommandSetting {
    variable: "FLEET_LIMITER_ADMIN_URL",
    flag: Some(Flag {
        name: "admin",
        value_name: "URL",
        repeatable: false,
    }),
    help: "The running instance's admin listener the levers ask (default http://127.0.0.1:7391)",
};

/// What the commands read themselves.
pub(crate) const COMMAND_SETTINGS: &[CommandSetting] =
    &[CONFIG_FILE, LOG_FILTER, ALLOW_UNSAFE_CALIBRATION, ADMIN_URL];

/// The setting at this TOML path.
pub(crate) fn setting(path: &str) -> Option<&'static Setting> {
    SETTINGS.iter().find(|s| s.path == path)
}

/// The setting read from this environment variable.
pub(crate) fn by_variable(var: &str) -> Option<&'static Setting> {
    SETTINGS.iter().find(|s| s.variable == var)
}

/// What a reload from `old` to `new` cannot apply: each restart-only setting that differs, by
/// [`Setting::restart_name`], once, in table order.
pub(crate) fn restart_required(old: &Config, new: &Config) -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for s in SETTINGS {
        if let Reload::Restart(changed) = s.reload {
            let name = s.restart_name();
            if !out.contains(&name) && changed(old, new) {
                out.push(name);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Loader;

    const DOC: &str = include_str!("../../docs/configuration.md");

    /// The rows of the documentation's tables.
    fn doc_rows() -> Vec<&'static str> {
        DOC.lines().filter(|l| l.starts_with('|')).collect()
    }

    #[test]
    fn docs_configuration_lists_every_setting_with_its_variable_and_flag() {
        let rows = doc_rows();
        for s in SETTINGS {
            let path = if s.kind == Kind::Store {
                "(shorthand)".to_owned()
            } else {
                format!("`{}`", s.path)
            };
            let var = format!("`{}`", s.variable);
            let found = rows.iter().find(|r| r.contains(&path) && r.contains(&var));
            let Some(found) = found else {
                panic!("docs/configuration.md has no table row naming {path} and {var}");
            };
            if let Some(f) = s.flag {
                let spelled = format!("`--{} {}`", f.name, f.value_name);
                assert!(
                    found.contains(&spelled) || found.contains(&format!("`--{} {}` (repeatable)", f.name, f.value_name)),
                    "docs/configuration.md: the row of {path} does not give its flag {spelled}: {found}"
                );
            }
        }
        for c in COMMAND_SETTINGS {
            let var = format!("`{}`", c.variable);
            let Some(found) = rows.iter().find(|r| r.contains(&var)) else {
                panic!("docs/configuration.md has no table row naming {var}");
            };
            if let Some(f) = c.flag {
                assert!(
                    found.contains(&format!("`--{}", f.name)),
                    "docs/configuration.md: the row of {var} does not give --{}: {found}",
                    f.name
                );
            }
        }
        for (field, _) in GROUP_FIELDS {
            let cell = format!("| `admission.groups.<name>.{field}` |");
            assert!(
                rows.iter().any(|r| r.starts_with(&cell)),
                "docs/configuration.md has no row for `admission.groups.<name>.{field}`"
            );
        }
        for (field, _) in LIMITER_FIELDS {
            let cell = format!("| `{field}` |");
            assert!(
                rows.iter().any(|r| r.starts_with(&cell)),
                "docs/configuration.md has no row for the limiter field `{field}`"
            );
        }
    }

    #[test]
    fn every_variable_and_flag_docs_configuration_lists_is_in_the_table() {
        for r in doc_rows() {
            for (i, _) in r.match_indices("`FLEET_LIMITER_") {
                let var: String = r[i + 1..]
                    .chars()
                    .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                    .collect();
                if var.starts_with("FLEET_LIMITER_LIMITER_") {
                    continue;
                }
                assert!(
                    by_variable(&var).is_some()
                        || COMMAND_SETTINGS.iter().any(|c| c.variable == var),
                    "docs/configuration.md names {var}, which is no setting: {r}"
                );
            }
            for (i, _) in r.match_indices("`--") {
                let flag: String = r[i + 3..]
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-')
                    .collect();
                let known = SETTINGS
                    .iter()
                    .filter_map(|s| s.flag)
                    .chain(COMMAND_SETTINGS.iter().filter_map(|c| c.flag))
                    .any(|f| f.name == flag);
                assert!(
                    known,
                    "docs/configuration.md names --{flag}, which is no flag: {r}"
                );
            }
        }
    }

    #[test]
    fn names_are_unique_and_spelled_alike() {
        for (i, s) in SETTINGS.iter().enumerate() {
            for t in &SETTINGS[i + 1..] {
                assert_ne!(s.path, t.path);
                assert_ne!(s.variable, t.variable);
                if let (Some(a), Some(b)) = (s.flag, t.flag) {
                    assert_ne!(a.name, b.name);
                }
            }
            assert!(s.variable.starts_with("FLEET_LIMITER_"), "{}", s.variable);
            assert!(
                !s.variable.starts_with("FLEET_LIMITER_LIMITER_"),
                "{} would read as a limiter field",
                s.variable
            );
            assert!(
                !s.help.ends_with('.'),
                "{}: help is one line with no full stop",
                s.path
            );
            if let Some(f) = s.flag {
                assert!(
                    f.name
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'),
                    "{}",
                    f.name
                );
                assert!(f.repeatable == (s.kind == Kind::List && f.name == "trust-proxy"));
            }
        }
    }

    /// The configuration, with where each value came from set aside.
    fn shown(l: Loader) -> String {
        let mut c = l.load().unwrap_or_else(|e| panic!("{e}"));
        c.origins.clear();
        format!("{c:?}")
    }

    #[test]
    fn each_stated_default_is_the_value_used_when_nothing_sets_it() {
        let defaults = shown(Loader::new());
        for s in SETTINGS {
            let DefaultValue::Is(v) = s.default else {
                continue;
            };
            let set = shown(Loader::new().env([(s.variable.to_owned(), v.to_owned())]));
            assert_eq!(set, defaults, "{} = {v} is not its default", s.variable);
            if let Some(f) = s.flag {
                let flagged = shown(Loader::new().flag(s.path, v, &format!("--{}", f.name)));
                assert_eq!(flagged, defaults, "--{} {v} is not its default", f.name);
            }
        }
    }

    /// The example envoyproxy/ratelimit configuration.
    const RLS_YAML: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/envoy-rls/ratelimit.yaml");

    #[test]
    fn a_reload_names_each_restart_only_setting_that_changed_and_no_live_one() {
        let old = Config::default();
        for s in SETTINGS {
            // A value other than the default, valid with the settings it needs.
            let (other, with): (&str, &[(&str, &str)]) = match (s.path, s.kind) {
                // Files that must exist, and a key source: left to their own tests.
                ("server.tls_cert_file" | "server.tls_key_file", _) => continue,
                ("server.upstream_ca_file" | "store.ca_file" | "identity.jwks_ca_file", _) => {
                    continue
                }
                ("identity.jwt_public_key_pem" | "identity.jwt_hs256_secret", _) => continue,
                ("server.listen", _) => ("127.0.0.1:1", &[]),
                ("ops.admin_listen", _) => ("127.0.0.1:2", &[]),
                ("ops.admin_token", _) => ("3f9a1c0b7e22d4c8a16b5e0f92c7d3ab", &[]),
                ("server.upstream", _) => ("http://127.0.0.1:9", &[]),
                ("store" | "store.url", _) => ("redis://127.0.0.1:6379", &[]),
                ("store.backend", _) => ("redis", &[("FLEET_LIMITER_STORE_URL", "redis://a:1")]),
                ("store.cluster", _) => ("redis://127.0.0.1:7000,redis://127.0.0.1:7001", &[]),
                ("store.require", _) => ("true", &[("FLEET_LIMITER_STORE_URL", "redis://a:1")]),
                ("identity.jwks_url", _) => ("https://idp.example/jwks.json", &[]),
                ("client_ip.trust_proxy", _) => ("10.0.0.0/8", &[]),
                ("client_ip.trust_all_addresses", _) => ("true", &[]),
                ("decision.listen", _) => (
                    "127.0.0.1:3",
                    &[
                        ("FLEET_LIMITER_DECISION_ALLOW_FROM", "10.0.0.5"),
                        ("FLEET_LIMITER_TRUST_PROXY", "10.0.0.5"),
                    ],
                ),
                ("decision.allow_from", _) => {
                    ("10.0.0.5", &[("FLEET_LIMITER_TRUST_PROXY", "10.0.0.5")])
                }
                ("rls.listen", _) => (
                    "127.0.0.1:4",
                    &[
                        ("FLEET_LIMITER_RLS_CONFIG", RLS_YAML),
                        ("FLEET_LIMITER_RLS_ALLOW_FROM", "10.0.0.5"),
                    ],
                ),
                ("rls.config", _) => (RLS_YAML, &[]),
                ("rls.allow_from", _) => ("10.0.0.5", &[]),
                ("cors.allowed_origins", _) => ("https://dash.example", &[]),
                ("ops.admin_hosts", _) => ("admin.example", &[]),
                ("methods.allowed", _) => ("GET,POST", &[]),
                ("methods.override_headers", _) => ("X-Verb", &[]),
                ("methods.override_params", _) => ("verb", &[]),
                ("store.calls_in_flight", _) => ("2", &[]),
                ("server.body_key_max_bytes", _) => ("4096", &[]),
                ("client_ip.ipv6_prefix", _) => ("48", &[]),
                ("fleet.max_agents", _) => ("300", &[]),
                ("websocket.max_per_client", _) => ("3", &[]),
                ("admission.max_in_flight", _) => ("8", &[]),
                (p, _) if p.starts_with("admission.") => match s.kind {
                    Kind::Duration => ("3s", &[("FLEET_LIMITER_ADMISSION_MAX_IN_FLIGHT", "8")]),
                    _ => ("7", &[("FLEET_LIMITER_ADMISSION_MAX_IN_FLIGHT", "8")]),
                },
                (_, Kind::Bool) => ("true", &[]),
                (_, Kind::Int) => ("7", &[]),
                (_, Kind::Duration) => ("3s", &[]),
                (_, Kind::Rate) => ("1KiB", &[]),
                (_, Kind::Choice(words)) => (words[1], &[]),
                (_, Kind::StrOrList) => ("somebody", &[]),
                (_, Kind::Str) => ("other", &[]),
                (_, kind) => panic!("{}: no other value of {kind:?} to try", s.path),
            };
            let this = [(s.variable, other)];
            let env = with
                .iter()
                .chain(&this)
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()));
            let new = Loader::new()
                .env(env)
                .load()
                .unwrap_or_else(|e| panic!("{} = {other}: {e}", s.variable));
            let got = restart_required(&old, &new);
            match s.reload {
                Reload::Live => assert!(got.is_empty(), "{} is live: {got:?}", s.path),
                Reload::Restart(_) => {
                    assert_eq!(got, vec![s.restart_name()], "{} = {other}", s.variable)
                }
            }
        }
    }

    #[test]
    fn restart_names_are_the_sections_read_only_at_start() {
        let names: Vec<&str> = SETTINGS
            .iter()
            .filter(|s| matches!(s.reload, Reload::Restart(_)))
            .map(Setting::restart_name)
            .fold(Vec::new(), |mut v, n| {
                if !v.contains(&n) {
                    v.push(n);
                }
                v
            });
        assert_eq!(
            names,
            [
                "server.listen",
                "server.upstream",
                "server.connect_timeout",
                "server.read_timeout",
                "server.body_timeout",
                "server.body_min_rate",
                "server.upstream_ca_file",
                "server.upstream_insecure_skip_verify",
                "server.tls_cert_file",
                "server.reuse_port",
                "store",
                "identity",
                "ops.admin_listen",
                "ops.shutdown_grace",
                "ops.log_format",
                "decision",
                "rls.listen",
                "admission",
                "websocket",
            ]
        );
    }
}
