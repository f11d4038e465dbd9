//! `[rls]`: Envoy's global rate-limit service (`envoy.service.ratelimit.v3`) over gRPC. Off
//! unless `listen` is set; then `allow_from` names the proxies that may ask, and `config` the
//! envoyproxy/ratelimit YAML file (or directory of them) whose descriptors it meters
//! (docs/envoy-rls.md).

use super::{ConfigError, Ctx};
use crate::policy::LimiterSpec;
use crate::rls_rules::Domains;
use ipnet::IpNet;
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

/// `[rls]`, validated, its YAML read.
#[derive(Debug, Clone, Default)]
pub struct RlsConfig {
    /// Where the gRPC listener listens; `None`: no RLS listener.
    pub listen: Option<SocketAddr>,
    /// The proxies that may ask (their peer address); anyone else gets `PERMISSION_DENIED`.
    pub allow_from: Vec<IpNet>,
    /// The YAML file or directory (`rls.config`).
    pub config: Option<PathBuf>,
    /// Whether a descriptor's own `limit` replaces the configured one (off: a client must not
    /// choose its own budget).
    pub descriptor_limit: bool,
    /// The domains the YAML describes.
    pub domains: Arc<Domains>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRls {
    listen: Option<String>,
    allow_from: Option<Vec<String>>,
    config: Option<String>,
    descriptor_limit: Option<bool>,
}

pub(super) fn build_rls(
    raw: RawRls,
    limiters: &[LimiterSpec],
    ctx: &Ctx,
) -> Result<RlsConfig, ConfigError> {
    let listen = match raw.listen.as_deref().map(str::trim) {
        None | Some("") | Some("off") => None,
        Some(s) => Some(s.parse::<SocketAddr>().map_err(|_| {
            ctx.err(
                "rls.listen",
                format!("`{s}` is not an address:port (e.g. \"127.0.0.1:8081\"), or \"off\""),
            )
        })?),
    };
    let mut allow_from = Vec::new();
    for r in raw.allow_from.unwrap_or_default() {
        let r = r.trim();
        let net = r
            .parse::<IpNet>()
            .or_else(|_| r.parse::<std::net::IpAddr>().map(IpNet::from))
            .map_err(|_| {
                ctx.err(
                    "rls.allow_from",
                    format!("`{r}` is not an address or CIDR range (e.g. \"10.0.0.5\", \"10.0.0.0/24\")"),
                )
            })?;
        allow_from.push(net.trunc());
    }
    let config = raw
        .config
        .as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(PathBuf::from);
    let domains = match &config {
        Some(path) => {
            crate::rls_rules::load(path, limiters).map_err(|e| ctx.err("rls.config", e))?
        }
        None => Domains::default(),
    };
    let out = RlsConfig {
        listen,
        allow_from,
        config,
        descriptor_limit: raw.descriptor_limit.unwrap_or(false),
        domains: Arc::new(domains),
    };
    if out.listen.is_none() {
        return Ok(out);
    }
    if out.config.is_none() {
        return Err(ctx.err(
            "rls.config",
            "is not set while rls.listen is set; name the envoyproxy/ratelimit YAML file or directory (--rls-config /etc/fleet-limiter/ratelimit.yaml, FLEET_LIMITER_RLS_CONFIG)",
        ));
    }
    if out.allow_from.is_empty() {
        return Err(ctx.err(
            "rls.allow_from",
            "is empty while rls.listen is set; list the addresses of the Envoy proxies that ask (FLEET_LIMITER_RLS_ALLOW_FROM=10.0.0.5,10.0.0.6): anyone else who could reach the listener could spend other clients' budgets",
        ));
    }
    if let Some(what) = super::covers_everything(&out.allow_from) {
        return Err(ctx.err(
            "rls.allow_from",
            format!("covers {what}; list the proxies that ask for decisions, not every address"),
        ));
    }
    Ok(out)
}
