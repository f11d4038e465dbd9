//! Settings for running the gateway in production: the admin listener, the shutdown grace
//! period, near-limit reporting, the log format (`[ops]`), and the CORS allow-list (`[cors]`).

use super::ConfigError;
use super::{Ctx, DurationValue};
use crate::duration::parse_duration;
use serde::Deserialize;
use std::net::SocketAddr;
use std::time::Duration;

/// The admin listener's default address. Not 9090 (Prometheus's own port: on a host that runs
/// Prometheus the gateway could not start) nor anything in 9091-9999 (Alertmanager, the
/// Pushgateway and the exporters' allocated range, 9100-9999), 9464 (OpenTelemetry's
/// Prometheus exporter), 4317/4318 (OTLP), 9901 (Envoy's admin), or the ports apps and dev
/// servers take by default (3000, 5000, 8000, 8080, 8081, 8443, 8888, 9000); loopback only.
pub(crate) const ADMIN_LISTEN: &str = "127.0.0.1:7391";
/// An allowed decision counts as near the limit when less than this share of the budget
/// remains, in percent, unless `ops.near_limit_percent` says otherwise.
pub(crate) const NEAR_LIMIT_PERCENT: u8 = 20;
/// How long the listeners keep accepting after SIGTERM while `/readyz` answers 503: longer than
/// Kubernetes takes to drop a terminating pod from its endpoints, and than two failed checks of a
/// load balancer polling every two seconds.
pub(crate) const DRAIN_DELAY: Duration = Duration::from_secs(5);

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum LogFormat {
    /// One human-readable line per event.
    #[default]
    Text,
    /// One JSON object per line, for log pipelines.
    Json,
}

/// `[ops]`: how the process is observed and stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpsConfig {
    /// Where `/metrics`, `/healthz`, `/readyz` and `POST /reload` are served; never the traffic port.
    pub admin_listen: SocketAddr,
    /// How long in-flight requests may take to finish once the listeners close.
    pub shutdown_grace: Duration,
    /// After SIGTERM, how long the listeners keep accepting (and `/readyz` answers 503) before
    /// they close: the time a load balancer needs to stop sending.
    pub drain_delay: Duration,
    /// An allowed decision counts as near the limit when less than this share of the budget
    /// remains, in percent (0 turns near-limit counting off).
    pub near_limit_percent: u8,
    pub log_format: LogFormat,
    /// The token the admin listener's levers (`/overrides`, `/reset`, `/explain`, `/reload`)
    /// require in `Authorization: Bearer`; without one they answer only on a loopback listener.
    pub admin_token: Option<crate::identity::secret::Secret>,
    /// Names besides IP literals and `localhost` that the admin listener answers to in `Host`
    /// (lower case, without a trailing dot): a Kubernetes Service's, a monitoring host's.
    pub admin_hosts: Vec<String>,
    /// Whether each decision feeds the top-talker lists (`GET /top`).
    pub top_talkers: bool,
}

/// The most names `ops.admin_hosts` may list.
pub(crate) const MAX_ADMIN_HOSTS: usize = 32;

/// The shortest admin token accepted.
pub(crate) const MIN_ADMIN_TOKEN: usize = 32;

/// `[cors]`: which browser origins may read the gateway's own responses.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CorsConfig {
    /// Exact origins (`https://dash.example.com`), or `*` for any origin.
    pub allowed_origins: Vec<String>,
    /// Send `Access-Control-Allow-Credentials: true` (never together with `*`).
    pub allow_credentials: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawOps {
    admin_listen: Option<String>,
    shutdown_grace: Option<DurationValue>,
    drain_delay: Option<DurationValue>,
    near_limit_percent: Option<i64>,
    log_format: Option<LogFormat>,
    admin_token: Option<String>,
    admin_hosts: Option<Vec<String>>,
    top_talkers: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCors {
    allowed_origins: Option<Vec<String>>,
    allow_credentials: Option<bool>,
}

pub(super) fn build_ops(raw: RawOps, ctx: &Ctx) -> Result<OpsConfig, ConfigError> {
    let listen_raw = raw.admin_listen.unwrap_or_else(|| ADMIN_LISTEN.to_owned());
    let admin_listen = listen_raw.parse::<SocketAddr>().map_err(|_| {
        ctx.err(
            "ops.admin_listen",
            format!("`{listen_raw}` is not an address:port (e.g. \"127.0.0.1:7391\")"),
        )
    })?;
    // Zero is allowed here: stop at once, dropping in-flight requests.
    let shutdown_grace = match raw.shutdown_grace {
        Some(DurationValue::Secs(s)) => Duration::from_secs(s),
        Some(DurationValue::Text(t)) => {
            parse_duration(&t).map_err(|e| ctx.err("ops.shutdown_grace", e))?
        }
        None => Duration::from_secs(30),
    };
    if shutdown_grace > Duration::from_secs(3600) {
        return Err(ctx.err(
            "ops.shutdown_grace",
            "is longer than 1h; use a grace period from 0s to 1h",
        ));
    }
    let drain_delay = match raw.drain_delay {
        Some(DurationValue::Secs(s)) => Duration::from_secs(s),
        Some(DurationValue::Text(t)) => {
            parse_duration(&t).map_err(|e| ctx.err("ops.drain_delay", e))?
        }
        None => DRAIN_DELAY,
    };
    if drain_delay > Duration::from_secs(600) {
        return Err(ctx.err(
            "ops.drain_delay",
            "is longer than 10m; a load balancer notices a failing /readyz in seconds (default 5s, 0s to close the listeners at once)",
        ));
    }
    let pct = raw.near_limit_percent.unwrap_or(NEAR_LIMIT_PERCENT as i64);
    if !(0..=100).contains(&pct) {
        return Err(ctx.err(
            "ops.near_limit_percent",
            format!("{pct} is not a percentage; use 0 to 100 (default {NEAR_LIMIT_PERCENT})"),
        ));
    }
    let admin_token = match raw.admin_token {
        None => None,
        Some(t) => {
            let t = t.trim().to_owned();
            let visible = t.bytes().all(|b| (0x21..=0x7e).contains(&b));
            if t.len() < MIN_ADMIN_TOKEN || t.len() > 512 || !visible {
                return Err(ctx.err(
                    "ops.admin_token",
                    format!("the admin token is {} bytes{}; use {MIN_ADMIN_TOKEN} to 512 visible ASCII characters without spaces, e.g. the output of `openssl rand -hex 32`", t.len(), if visible { "" } else { " with spaces or control characters" }),
                ));
            }
            if crate::identity::secret::weakness(&t).is_some() {
                return Err(ctx.err(
                    "ops.admin_token",
                    "the admin token is guessable (a placeholder, a pattern or too little randomness); use random bytes, e.g. `openssl rand -hex 32`",
                ));
            }
            Some(crate::identity::secret::Secret::new(t))
        }
    };
    let admin_hosts = admin_hosts(raw.admin_hosts.unwrap_or_default())
        .map_err(|e| ctx.err("ops.admin_hosts", e))?;
    Ok(OpsConfig {
        admin_listen,
        shutdown_grace,
        drain_delay,
        near_limit_percent: pct as u8,
        log_format: raw.log_format.unwrap_or_default(),
        admin_token,
        admin_hosts,
        top_talkers: raw.top_talkers.unwrap_or(true),
    })
}

pub(super) fn build_cors(raw: RawCors, ctx: &Ctx) -> Result<CorsConfig, ConfigError> {
    let mut allowed_origins = Vec::new();
    for o in raw.allowed_origins.unwrap_or_default() {
        let o = o.trim().trim_end_matches('/').to_owned();
        if o != "*" && !valid_origin(&o) {
            return Err(ctx.err(
                "cors.allowed_origins",
                format!("`{o}` is not an origin; write scheme://host[:port] (e.g. \"https://dash.example.com\") or \"*\""),
            ));
        }
        allowed_origins.push(o);
    }
    let allow_credentials = raw.allow_credentials.unwrap_or(false);
    if allow_credentials && allowed_origins.iter().any(|o| o == "*") {
        return Err(ctx.err(
            "cors.allowed_origins",
            "`*` cannot be combined with cors.allow_credentials = true (browsers reject it, and it would let any site read credentialed answers); list the dashboard origins instead",
        ));
    }
    Ok(CorsConfig {
        allowed_origins,
        allow_credentials,
    })
}

/// `scheme://host[:port]` with nothing after it.
/// `ops.admin_hosts`: DNS names, each 1-253 characters of letters, digits, `-` and `.` in
/// labels of 1-63 (no port, no wildcard, no IP: an IP literal is always answered), lower-cased,
/// a trailing dot dropped; at most [`MAX_ADMIN_HOSTS`].
fn admin_hosts(raw: Vec<String>) -> Result<Vec<String>, String> {
    if raw.len() > MAX_ADMIN_HOSTS {
        return Err(format!(
            "{} names; list at most {MAX_ADMIN_HOSTS} (the names the admin listener is reached by)",
            raw.len()
        ));
    }
    let mut out = Vec::with_capacity(raw.len());
    for name in raw {
        let n = name.trim().trim_end_matches('.').to_ascii_lowercase();
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        let shown = crate::redact::printable(&name, 64);
        if n.is_empty() || n.len() > 253 || !n.split('.').all(label_ok) {
            return Err(format!(
                "`{shown}` is not a host name; list the DNS names the admin listener is reached by, without scheme, port or wildcard, e.g. [\"fleet-limiter-admin.ops.svc.cluster.local\"] (IP addresses and localhost are always answered)"
            ));
        }
        if n.parse::<std::net::IpAddr>().is_ok()
            || n.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        {
            return Err(format!(
                "`{shown}` is an address: IP literals are always answered; list host names only"
            ));
        }
        if !out.contains(&n) {
            out.push(n);
        }
    }
    Ok(out)
}

fn valid_origin(o: &str) -> bool {
    let Some((scheme, rest)) = o.split_once("://") else {
        return false;
    };
    !scheme.is_empty()
        && scheme
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
        && !rest.is_empty()
        && !rest.contains(['/', '?', '#', ' ', '@'])
}

#[cfg(test)]
mod tests {
    use crate::config::Loader;

    fn load(toml: &str) -> Result<crate::config::Config, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let path = dir.path().join("c.toml");
        std::fs::write(&path, toml).map_err(|e| e.to_string())?;
        Loader::new().file(&path).load().map_err(|e| e.to_string())
    }

    #[test]
    fn defaults() {
        let c = Loader::new().load().expect("defaults load");
        assert_eq!(c.ops.admin_listen.to_string(), "127.0.0.1:7391");
        assert_eq!(c.ops.shutdown_grace.as_secs(), 30);
        assert_eq!(c.ops.near_limit_percent, 20);
        assert!(c.cors.allowed_origins.is_empty());
    }

    #[test]
    fn the_drain_delay_from_each_layer_and_its_bound() {
        let c = Loader::new().load().expect("defaults load");
        assert_eq!(c.ops.drain_delay, super::DRAIN_DELAY);
        assert_eq!(c.ops.drain_delay.as_secs(), 5);
        assert!(load("[ops]\ndrain_delay = 0\n")
            .expect("zero closes at once")
            .ops
            .drain_delay
            .is_zero());
        let c = Loader::new()
            .env([("FLEET_LIMITER_DRAIN_DELAY".to_owned(), "15s".to_owned())])
            .load()
            .expect("variable");
        assert_eq!(c.ops.drain_delay.as_secs(), 15);
        let c = Loader::new()
            .env([("FLEET_LIMITER_DRAIN_DELAY".to_owned(), "15s".to_owned())])
            .flag("ops.drain_delay", "2m", "--drain-delay")
            .load()
            .expect("flag");
        assert_eq!(c.ops.drain_delay.as_secs(), 120);
        let e = load("[ops]\ndrain_delay = \"11m\"\n").unwrap_err();
        assert!(e.contains("ops.drain_delay: is longer than 10m"), "{e}");
        let e = Loader::new()
            .flag("ops.drain_delay", "soon", "--drain-delay")
            .load()
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("flag --drain-delay: ops.drain_delay: "),
            "{e}"
        );
    }

    #[test]
    fn wildcard_with_credentials_is_rejected() {
        let e = load("[cors]\nallowed_origins = [\"*\"]\nallow_credentials = true\n").unwrap_err();
        assert!(e.contains("cors.allowed_origins"), "{e}");
        assert!(e.contains("allow_credentials"), "{e}");
        let ok =
            load("[cors]\nallowed_origins = [\"https://a.example\"]\nallow_credentials = true\n")
                .expect("listed origins with credentials are fine");
        assert!(ok.cors.allow_credentials);
    }

    #[test]
    fn origins_are_checked() {
        let e = load("[cors]\nallowed_origins = [\"https://a.example/path\"]\n").unwrap_err();
        assert!(e.contains("is not an origin"), "{e}");
        let ok = load("[cors]\nallowed_origins = [\"http://127.0.0.1:3000/\"]\n")
            .expect("trailing slash trimmed");
        assert_eq!(
            ok.cors.allowed_origins,
            vec!["http://127.0.0.1:3000".to_owned()]
        );
    }

    #[test]
    fn env_and_flag_layers() {
        let c = Loader::new()
            .env([
                (
                    "FLEET_LIMITER_NEAR_LIMIT_PERCENT".to_owned(),
                    "35".to_owned(),
                ),
                (
                    "FLEET_LIMITER_CORS_ALLOWED_ORIGINS".to_owned(),
                    "http://a.test, http://b.test".to_owned(),
                ),
            ])
            .flag("ops.admin_listen", "127.0.0.1:0", "--admin-listen")
            .flag("ops.shutdown_grace", "0s", "--shutdown-grace")
            .flag("ops.log_format", "json", "--log-format")
            .load()
            .expect("valid");
        assert_eq!(c.ops.near_limit_percent, 35);
        assert_eq!(c.cors.allowed_origins.len(), 2);
        assert_eq!(c.ops.admin_listen.port(), 0);
        assert!(c.ops.shutdown_grace.is_zero());
        assert_eq!(c.ops.log_format, super::LogFormat::Json);
        let e = Loader::new()
            .flag("ops.near_limit_percent", "140", "--near-limit-percent")
            .load()
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("flag --near-limit-percent: ops.near_limit_percent"),
            "{e}"
        );
        let e = Loader::new()
            .flag("ops.log_format", "xml", "--log-format")
            .load()
            .unwrap_err()
            .to_string();
        assert!(e.contains("xml"), "{e}");
    }
}
