//! The merged document read into a validated [`Config`]: every section's raw form, its checks,
//! and the errors that name the origin, the field and the fix.

use super::*;
use crate::duration::parse_duration;

/// A duration as `"15m"`, `"30s"`, `"500ms"`, `"1h"`, `"1d"`, or a whole number of seconds.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub(super) enum DurationValue {
    Secs(u64),
    Text(String),
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    pub(super) enabled: Option<bool>,
    pub(super) calibration: Option<String>,
    #[serde(default)]
    pub(super) server: RawServer,
    #[serde(default)]
    pub(super) client_ip: RawClientIp,
    #[serde(default)]
    pub(super) store: RawStore,
    #[serde(default)]
    pub(super) fleet: fleet::RawFleet,
    #[serde(default)]
    pub(super) limiters: BTreeMap<String, RawLimiter>,
    #[serde(default)]
    pub(super) identity: identity::RawIdentity,
    #[serde(default)]
    pub(super) ops: ops::RawOps,
    #[serde(default)]
    pub(super) cors: ops::RawCors,
    #[serde(default)]
    pub(super) path: path::RawPath,
    #[serde(default)]
    pub(super) decision: decision::RawDecision,
    #[serde(default)]
    pub(super) rls: super::rls::RawRls,
    #[serde(default)]
    pub(super) admission: admission::RawAdmission,
    #[serde(default)]
    pub(super) methods: methods::RawMethods,
    #[serde(default)]
    pub(super) websocket: websocket::RawWebsocket,
    #[serde(default)]
    pub(super) shaping: super::shaping::RawShaping,
    #[serde(default)]
    pub(super) headers: headers::RawHeaders,
    #[serde(default)]
    pub(super) overrides: Vec<RawOverride>,
    #[serde(default)]
    pub(super) roles: BTreeMap<String, Vec<String>>,
}

/// One `[[overrides]]` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawOverride {
    pub(super) id: Option<String>,
    pub(super) limiter: Option<String>,
    #[serde(rename = "match")]
    pub(super) matcher: Option<String>,
    pub(super) limit: Option<i64>,
    pub(super) window: Option<DurationValue>,
    pub(super) expires: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawServer {
    pub(super) listen: Option<String>,
    pub(super) upstream: Option<String>,
    pub(super) connect_timeout: Option<DurationValue>,
    pub(super) read_timeout: Option<DurationValue>,
    pub(super) body_timeout: Option<DurationValue>,
    pub(super) body_min_rate: Option<rate::RateValue>,
    pub(super) body_key_max_bytes: Option<i64>,
    pub(super) upstream_ca_file: Option<String>,
    pub(super) upstream_insecure_skip_verify: Option<bool>,
    pub(super) tls_cert_file: Option<String>,
    pub(super) tls_key_file: Option<String>,
    pub(super) reuse_port: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawClientIp {
    pub(super) trust_proxy: Option<Vec<String>>,
    pub(super) header: Option<ForwardedHeader>,
    pub(super) ipv6_prefix: Option<i64>,
    pub(super) trust_all_addresses: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStore {
    pub(super) backend: Option<StoreBackend>,
    pub(super) url: Option<String>,
    pub(super) cluster: Option<Vec<String>>,
    pub(super) max_keys: Option<i64>,
    pub(super) timeout: Option<DurationValue>,
    pub(super) calls_in_flight: Option<i64>,
    pub(super) ca_file: Option<String>,
    pub(super) insecure_skip_verify: Option<bool>,
    pub(super) state_file: Option<String>,
    pub(super) require: Option<bool>,
}

pub(super) struct Ctx {
    pub(crate) origins: HashMap<String, String>,
    pub(super) file: Option<String>,
}

impl Ctx {
    /// Where the value at `path` came from.
    pub(super) fn origin(&self, path: &str) -> String {
        self.origins
            .get(path)
            .cloned()
            .or_else(|| {
                // A table only the file can define: a field missing from it is the file's.
                self.file.clone().filter(|_| {
                    path.starts_with("limiters.")
                        || path.starts_with("admission.groups.")
                        || path.starts_with("shaping.routes.")
                        || path.starts_with("shaping.upstream.")
                })
            })
            .unwrap_or_else(|| "built-in default".to_owned())
    }

    /// An error about the value at `path`; a URL in it is printed without its password.
    pub(super) fn err(&self, path: &str, msg: impl fmt::Display) -> ConfigError {
        let msg = msg.to_string();
        ConfigError(format!(
            "{}: {path}: {}",
            self.origin(path),
            crate::redact::urls_in(&msg)
        ))
    }
}

pub(super) fn duration(
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

/// The merged document read into a [`Config`], section by section in the order their errors win.
pub(super) fn build(
    raw: RawConfig,
    ctx: &Ctx,
    source: Option<PathBuf>,
) -> Result<Config, ConfigError> {
    let server = build_server(raw.server, ctx)?;
    let client_ip = build_client_ip(raw.client_ip, ctx)?;
    let store = build_store(raw.store, ctx)?;
    let fleet = fleet::build_fleet(raw.fleet, ctx)?;
    let calibration = super::base::build_calibration(raw.calibration, ctx)?;
    let roles = super::roles::build_roles(raw.roles, ctx)?;
    if calibration == super::base::Calibration::None && !roles.mapped.is_empty() {
        return Err(ctx.err(
            "roles",
            "roles map routes onto the built-in calibration, and calibration = \"none\" has \
             none; with calibration = \"none\", give each limiter its own routes (or leave \
             calibration out to keep the built-in limiters)",
        ));
    }
    super::roles::check_role_precedence(&roles, ctx)?;
    let raw_limiters = super::roles::apply(raw.limiters, &roles);
    let limiters = build_limiter_set(raw_limiters, calibration, &fleet, &client_ip, ctx)?;
    let identity = identity::build(raw.identity, ctx)?;
    let decision = decision::build_decision(raw.decision, &client_ip.trusted, ctx)?;
    let rls = super::rls::build_rls(raw.rls, &limiters, ctx)?;
    let overrides = build_overrides(raw.overrides, &limiters, ctx)?;
    let (hb_method, hb_path) = super::roles::heartbeat(&roles, &limiters);
    let shaping = super::shaping::build_shaping(
        raw.shaping,
        &fleet,
        identity.verifies(),
        (&hb_method, &hb_path),
        ctx,
    )?;
    Ok(Config {
        overrides,
        source,
        enabled: raw.enabled.unwrap_or(true),
        server,
        client_ip,
        store,
        fleet,
        limiters,
        identity,
        ops: ops::build_ops(raw.ops, ctx)?,
        cors: ops::build_cors(raw.cors, ctx)?,
        path: path::build_path(raw.path, ctx)?,
        decision,
        rls,
        admission: admission::build_admission(raw.admission, ctx)?,
        methods: methods::build_methods(raw.methods, ctx)?,
        websocket: websocket::build_websocket(raw.websocket, ctx)?,
        shaping,
        headers: headers::build_headers(raw.headers, ctx)?,
        roles,
        origins: ctx.origins.clone(),
    })
}

/// `[server]`: the listen address, the upstream, the listener's TLS files, the timeouts and the
/// body's limits.
fn build_server(raw: RawServer, ctx: &Ctx) -> Result<ServerConfig, ConfigError> {
    let listen_raw = raw.listen.unwrap_or_else(|| defaults::LISTEN.to_owned());
    let listen = listen_raw.parse::<SocketAddr>().map_err(|_| {
        ctx.err(
            "server.listen",
            format!(
                "`{listen_raw}` is not an address:port (e.g. \"127.0.0.1:8080\" or \"[::]:8080\")"
            ),
        )
    })?;
    let upstream = match raw.upstream {
        Some(u) => Some(validate_upstream(ctx, &u)?),
        None => None,
    };
    let tls_cert_file = path_setting(raw.tls_cert_file);
    let tls_key_file = path_setting(raw.tls_key_file);
    check_tls_pair(&tls_cert_file, &tls_key_file, ctx)?;
    Ok(ServerConfig {
        listen,
        upstream,
        connect_timeout: duration(
            ctx,
            "server.connect_timeout",
            raw.connect_timeout,
            defaults::CONNECT_TIMEOUT,
        )?,
        read_timeout: duration(
            ctx,
            "server.read_timeout",
            raw.read_timeout,
            defaults::READ_TIMEOUT,
        )?,
        body_timeout: duration(
            ctx,
            "server.body_timeout",
            raw.body_timeout,
            defaults::BODY_TIMEOUT,
        )?,
        body_min_rate: rate::rate(
            ctx,
            "server.body_min_rate",
            raw.body_min_rate,
            defaults::BODY_MIN_RATE,
        )?,
        body_key_max_bytes: body_key_max_bytes(raw.body_key_max_bytes, ctx)?,
        upstream_ca_file: path_setting(raw.upstream_ca_file),
        upstream_insecure_skip_verify: raw.upstream_insecure_skip_verify.unwrap_or(false),
        tls_cert_file,
        tls_key_file,
        reuse_port: raw.reuse_port.unwrap_or(false),
    })
}

/// A file setting: `None` when unset or blank.
fn path_setting(v: Option<String>) -> Option<PathBuf> {
    v.filter(|p| !p.trim().is_empty()).map(PathBuf::from)
}

/// TLS on the listener needs both files, the certificate chain and its key, or neither.
fn check_tls_pair(
    cert: &Option<PathBuf>,
    key: &Option<PathBuf>,
    ctx: &Ctx,
) -> Result<(), ConfigError> {
    match (cert, key) {
        (Some(_), None) => Err(ctx.err(
            "server.tls_cert_file",
            "is set but server.tls_key_file is not: TLS on the listener needs both, the certificate chain and its private key (PEM); set server.tls_key_file (FLEET_LIMITER_TLS_KEY_FILE), or drop server.tls_cert_file to serve plain HTTP",
        )),
        (None, Some(_)) => Err(ctx.err(
            "server.tls_key_file",
            "is set but server.tls_cert_file is not: TLS on the listener needs both, the certificate chain and its private key (PEM); set server.tls_cert_file (FLEET_LIMITER_TLS_CERT_FILE), or drop server.tls_key_file to serve plain HTTP",
        )),
        _ => Ok(()),
    }
}

/// `server.body_key_max_bytes`: the largest body a body key reads, within its bounds.
fn body_key_max_bytes(v: Option<i64>, ctx: &Ctx) -> Result<usize, ConfigError> {
    use crate::keys::body::{DEFAULT_MAX_BYTES, MAX_MAX_BYTES, MIN_MAX_BYTES};
    let n = v.unwrap_or(DEFAULT_MAX_BYTES as i64);
    match usize::try_from(n) {
        Ok(n) if (MIN_MAX_BYTES..=MAX_MAX_BYTES).contains(&n) => Ok(n),
        _ => Err(ctx.err(
            "server.body_key_max_bytes",
            format!(
                "{n} is not a body size for body keys; use a whole number of bytes from {MIN_MAX_BYTES} to {MAX_MAX_BYTES} (default {DEFAULT_MAX_BYTES}): a body larger than it keys on the address"
            ),
        )),
    }
}

/// `[client_ip]`: the trusted proxies, the forwarding header and the IPv6 prefix.
fn build_client_ip(raw: RawClientIp, ctx: &Ctx) -> Result<ClientIpConfig, ConfigError> {
    let mut ranges = Vec::new();
    for r in raw.trust_proxy.unwrap_or_default() {
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
    let trust_all_addresses = raw.trust_all_addresses.unwrap_or(false);
    trust::check(ctx, &ranges, trust_all_addresses)?;
    let prefix = raw.ipv6_prefix.unwrap_or(defaults::IPV6_PREFIX as i64);
    if !(32..=64).contains(&prefix) {
        return Err(ctx.err(
            "client_ip.ipv6_prefix",
            format!("{prefix} is out of range; use a prefix length from 32 to 64 (default 56)"),
        ));
    }
    Ok(ClientIpConfig {
        trusted: TrustedProxies::new(ranges, raw.header.unwrap_or_default()),
        ipv6_prefix: prefix as u8,
        trust_all_addresses,
    })
}

/// `[store]`: its bounds, the backend, its files, then the Redis URLs it names.
fn build_store(raw: RawStore, ctx: &Ctx) -> Result<StoreConfig, ConfigError> {
    let max_keys = raw.max_keys.unwrap_or(defaults::MAX_KEYS as i64);
    if max_keys < 1 {
        return Err(ctx.err("store.max_keys", "must be at least 1 (default 100000)"));
    }
    let calls = raw
        .calls_in_flight
        .unwrap_or(defaults::STORE_CALLS_IN_FLIGHT as i64);
    if !(1..=16).contains(&calls) {
        return Err(ctx.err(
            "store.calls_in_flight",
            format!("{calls} is out of range; use 1 to 16 (default 1)"),
        ));
    }
    let backend = store_backend(&raw, ctx)?;
    let store = StoreConfig {
        backend,
        url: raw.url,
        cluster: raw.cluster.unwrap_or_default(),
        max_keys: max_keys as usize,
        timeout: duration(ctx, "store.timeout", raw.timeout, defaults::STORE_TIMEOUT)?,
        calls_in_flight: calls as usize,
        ca_file: match raw.ca_file.filter(|p| !p.trim().is_empty()) {
            Some(p) => Some(ca_file(ctx, "store.ca_file", &p)?),
            None => None,
        },
        insecure_skip_verify: raw.insecure_skip_verify.unwrap_or(false),
        state_file: match raw.state_file.filter(|p| !p.trim().is_empty()) {
            None => None,
            Some(_) if backend == StoreBackend::Redis => {
                return Err(ctx.err(
                    "store.state_file",
                    "keeps the memory store's buckets across restarts, and this store is Redis, whose buckets outlive the process anyway; remove store.state_file (FLEET_LIMITER_STORE_STATE_FILE)",
                ))
            }
            Some(p) => Some(PathBuf::from(p)),
        },
        require: raw.require.unwrap_or(false),
    };
    if store.require && backend == StoreBackend::Memory {
        return Err(ctx.err(
            "store.require",
            "asks for a Redis store that must answer before serving starts, but the store is memory (no store.url or store.cluster is set), which lives in this process and cannot be down; set store.url (redis://host:6379) or store.cluster, or remove store.require (FLEET_LIMITER_STORE_REQUIRE)",
        ));
    }
    check_redis_urls(&store, ctx)?;
    Ok(store)
}

/// The backend named, or the one a URL or cluster list selects (memory without either).
fn store_backend(raw: &RawStore, ctx: &Ctx) -> Result<StoreBackend, ConfigError> {
    // A URL or a cluster list means Redis; saying `memory` as well is a contradiction, not a
    // choice to make silently (each instance would count on its own).
    let redis_given = if raw.url.is_some() {
        Some("store.url")
    } else if raw.cluster.as_ref().is_some_and(|c| !c.is_empty()) {
        Some("store.cluster")
    } else {
        None
    };
    match (raw.backend, redis_given) {
        (Some(StoreBackend::Memory), Some(given)) => Err(ctx.err(
            "store.backend",
            format!(
                "`memory` keeps every bucket in this process, but {given} is set ({}), so instances would not share one budget; drop {given} for the memory store, or set backend = \"redis\" (FLEET_LIMITER_STORE_BACKEND=redis, or leave backend unset: a URL alone selects Redis)",
                ctx.origin(given)
            ),
        )),
        (Some(b), _) => Ok(b),
        (None, Some(_)) => Ok(StoreBackend::Redis),
        (None, None) => Ok(StoreBackend::Memory),
    }
}

/// The store's Redis URLs: Sentinel in `store.url` alone, every URL a Redis one, a cluster
/// over TLS on every node or none, and a Redis backend given somewhere to connect.
fn check_redis_urls(store: &StoreConfig, ctx: &Ctx) -> Result<(), ConfigError> {
    if let Some(u) = store
        .cluster
        .iter()
        .find(|u| crate::store::redis::is_sentinel_url(u))
    {
        return Err(ctx.err(
            "store.cluster",
            format!(
                "`{}` is a Sentinel URL; a Cluster lists its nodes (redis://host:port), and Sentinel goes in store.url alone",
                crate::redact::url(u)
            ),
        ));
    }
    if let Some(u) = store
        .url
        .as_ref()
        .filter(|u| crate::store::redis::is_sentinel_url(u))
    {
        if let Err(why) = crate::store::redis::parse_sentinel_url(u) {
            return Err(ctx.err("store.url", format!("`{}`: {why}", crate::redact::url(u))));
        }
    } else if let Some(u) = &store.url {
        crate::store::redis::parse_server_url(u, false)
            .map_err(|why| ctx.err("store.url", format!("`{}`: {why}", crate::redact::url(u))))?;
    }
    check_cluster_nodes(&store.cluster, ctx)?;
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
    Ok(())
}

/// Each `store.cluster` entry one node's URL, and no node listed twice.
fn check_cluster_nodes(nodes: &[String], ctx: &Ctx) -> Result<(), ConfigError> {
    let mut seen = std::collections::HashMap::new();
    for (i, u) in nodes.iter().enumerate() {
        let node = crate::store::redis::parse_server_url(u, true).map_err(|why| {
            ctx.err(
                "store.cluster",
                format!("entry {} `{}`: {why}", i + 1, crate::redact::url(u)),
            )
        })?;
        if let Some(first) = seen.insert((node.host, node.port), i + 1) {
            return Err(ctx.err(
                "store.cluster",
                format!(
                    "entries {first} and {} name the same node (`{}`); list each node once",
                    i + 1,
                    crate::redact::url(u)
                ),
            ));
        }
    }
    Ok(())
}

/// `[limiters.*]`: the limiters built (over the built-in calibration, or over none), the
/// `agent-ip` ceiling derived (the built-in one only), then the checks across them (header keys
/// need a trusted proxy, client-chosen keys an address ceiling, lockouts a per-account one).
fn build_limiter_set(
    raw: BTreeMap<String, RawLimiter>,
    calibration: super::base::Calibration,
    fleet: &FleetConfig,
    client_ip: &ClientIpConfig,
    ctx: &Ctx,
) -> Result<Vec<LimiterSpec>, ConfigError> {
    let explicit = ceiling::Explicit::of(raw.get(ceiling::AGENT_IP));
    let mut limiters = build_limiters(raw, calibration, fleet, ctx)?;
    // Without the built-in calibration, a limiter named agent-ip is the file's own, whole.
    if calibration == super::base::Calibration::AgentFleet {
        ceiling::derive_agent_ip(&mut limiters, explicit, fleet, ctx)?;
    }
    if client_ip.trusted.ranges.is_empty() {
        if let Some(l) = limiters.iter().find(|l| {
            l.key.header().is_some() && !l.key.header_from_any_client() && l.mode != Mode::Off
        }) {
            return Err(ctx.err(
                &format!("limiters.{}.key", l.name),
                format!(
                    "`{}` is read only from a trusted proxy, and client_ip.trust_proxy lists none, so every request would key on its IP; set client_ip.trust_proxy (--trust-proxy) to the proxy that sets the header, use key = \"client-header:<name>\" for a header clients send themselves (an API key), or key = \"ip\"",
                    l.key
                ),
            ));
        }
    }
    check_client_chosen_keys(&limiters, ctx)?;
    super::limiters::check_lockouts(&limiters, ctx)?;
    Ok(limiters)
}

/// `[[overrides]]`: each names a configured limiter, a match, a limit and a window; ids are
/// the given ones or made from the limiter and the match, so they stay the same across reloads.
fn build_overrides(
    raw: Vec<RawOverride>,
    limiters: &[LimiterSpec],
    ctx: &Ctx,
) -> Result<Vec<crate::overrides::Override>, ConfigError> {
    use crate::overrides::{Override, Source, Wire};
    if raw.len() > crate::overrides::MAX_OVERRIDES {
        return Err(ctx.err(
            "overrides",
            format!(
                "lists {} overrides; at most {} are held",
                raw.len(),
                crate::overrides::MAX_OVERRIDES
            ),
        ));
    }
    let mut out: Vec<Override> = Vec::with_capacity(raw.len());
    for (i, r) in raw.into_iter().enumerate() {
        let at = |f: &str| format!("overrides[{i}].{f}");
        let missing: Vec<&str> = [
            ("limiter", r.limiter.is_none()),
            ("match", r.matcher.is_none()),
            ("limit", r.limit.is_none()),
            ("window", r.window.is_none()),
        ]
        .iter()
        .filter(|(_, m)| *m)
        .map(|(f, _)| *f)
        .collect();
        if !missing.is_empty() {
            return Err(ctx.err(
                &format!("overrides[{i}]"),
                format!(
                    "an override needs limiter, match, limit and window; add {}",
                    missing.join(", ")
                ),
            ));
        }
        let limiter = r.limiter.unwrap_or_default();
        if !limiters.iter().any(|l| *l.name == *limiter) {
            let names: Vec<&str> = limiters.iter().map(|l| &*l.name).collect();
            return Err(ctx.err(
                &at("limiter"),
                format!(
                    "`{limiter}` is not a configured limiter; name one of {}",
                    names.join(", ")
                ),
            ));
        }
        let window = match r.window {
            Some(DurationValue::Secs(s)) => format!("{s}s"),
            Some(DurationValue::Text(t)) => t,
            None => String::new(),
        };
        let matcher = r.matcher.unwrap_or_default();
        let id = r.id.unwrap_or_else(|| {
            use sha2::Digest;
            let d = sha2::Sha256::digest(format!("{limiter}\0{matcher}").as_bytes());
            format!("cfg-{}", hex::encode(&d[..5]))
        });
        let wire = Wire {
            id: Some(id),
            limiter,
            matcher,
            limit: u64::try_from(r.limit.unwrap_or(0)).unwrap_or(0),
            window,
            expires: r.expires,
            source: None,
            by: None,
            created: None,
        };
        let o = Override::from_wire(&wire, Source::Config, 0)
            .map_err(|(field, e)| ctx.err(&at(&field), e))?;
        if out.iter().any(|x| x.id == o.id) {
            return Err(ctx.err(
                &at("id"),
                format!(
                    "`{}` names two overrides; give each its own id, or remove the repeated one",
                    o.id
                ),
            ));
        }
        out.push(o);
    }
    Ok(out)
}

/// A CA bundle setting: the path of a readable file (its certificates are read when the client
/// is built).
pub(super) fn ca_file(ctx: &Ctx, path: &str, value: &str) -> Result<PathBuf, ConfigError> {
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

pub(super) fn validate_upstream(ctx: &Ctx, u: &str) -> Result<UpstreamUrl, ConfigError> {
    u.parse::<UpstreamUrl>()
        .map_err(|why| ctx.err("server.upstream", why))
}
