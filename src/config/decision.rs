//! `[decision]`: the forward-auth decision listener that nginx `auth_request`, Caddy
//! `forward_auth`, Traefik `ForwardAuth` and Envoy `ext_authz` ask before they forward a
//! request. Off unless `listen` is set; then `allow_from` must name the proxies that may ask,
//! and each of them must be a trusted proxy (`client_ip.trust_proxy`), or every client would be
//! keyed on the proxy's own address.

use super::{ConfigError, Ctx};
use crate::client_ip::TrustedProxies;
use ipnet::IpNet;
use serde::Deserialize;
use std::net::SocketAddr;

/// `[decision]`, validated.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DecisionConfig {
    /// Where the decision endpoint listens; `None`: no decision listener.
    pub listen: Option<SocketAddr>,
    /// The proxies that may ask (their peer address); anyone else gets 403.
    pub allow_from: Vec<IpNet>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDecision {
    listen: Option<String>,
    allow_from: Option<Vec<String>>,
}

pub(super) fn build_decision(
    raw: RawDecision,
    trusted: &TrustedProxies,
    ctx: &Ctx,
) -> Result<DecisionConfig, ConfigError> {
    let listen = match raw.listen.as_deref().map(str::trim) {
        None | Some("") | Some("off") => None,
        Some(s) => Some(s.parse::<SocketAddr>().map_err(|_| {
            ctx.err(
                "decision.listen",
                format!("`{s}` is not an address:port (e.g. \"127.0.0.1:7392\"), or \"off\""),
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
                    "decision.allow_from",
                    format!("`{r}` is not an address or CIDR range (e.g. \"10.0.0.5\", \"10.0.0.0/24\")"),
                )
            })?;
        allow_from.push(net.trunc());
    }
    if listen.is_none() {
        return Ok(DecisionConfig { listen, allow_from });
    }
    if allow_from.is_empty() {
        return Err(ctx.err(
            "decision.allow_from",
            "is empty while decision.listen is set; list the addresses of the proxies that ask for decisions (FLEET_LIMITER_DECISION_ALLOW_FROM=10.0.0.5,10.0.0.6): anyone else who could reach the endpoint could spend other clients' budgets",
        ));
    }
    if let Some(what) = super::covers_everything(&allow_from) {
        return Err(ctx.err(
            "decision.allow_from",
            format!("covers {what}; list the proxies that ask for decisions, not every address"),
        ));
    }
    for net in &allow_from {
        let covered = [net.network(), net.broadcast()]
            .into_iter()
            .all(|ip| trusted.contains(ip));
        if !covered {
            return Err(ctx.err(
                "decision.allow_from",
                format!("`{net}` is not in client_ip.trust_proxy, so the client address it forwards would not be read and every request it asks about would be keyed on the proxy's own address; add `{net}` to client_ip.trust_proxy (FLEET_LIMITER_TRUST_PROXY)"),
            ));
        }
    }
    Ok(DecisionConfig { listen, allow_from })
}

#[cfg(test)]
mod tests {
    use crate::config::Loader;

    fn load(env: &[(&str, &str)]) -> Result<crate::config::Config, String> {
        Loader::new()
            .env(env.iter().map(|(k, v)| (k.to_string(), v.to_string())))
            .load()
            .map_err(|e| e.to_string())
    }

    #[test]
    fn off_by_default() {
        let cfg = load(&[]).unwrap();
        assert_eq!(cfg.decision.listen, None);
    }

    #[test]
    fn needs_proxies_that_are_trusted() {
        let e = load(&[("FLEET_LIMITER_DECISION_LISTEN", "127.0.0.1:7392")]).unwrap_err();
        assert!(e.contains("decision.allow_from: is empty"), "{e}");
        let e = load(&[
            ("FLEET_LIMITER_DECISION_LISTEN", "127.0.0.1:7392"),
            ("FLEET_LIMITER_DECISION_ALLOW_FROM", "10.0.0.5"),
        ])
        .unwrap_err();
        assert!(e.contains("not in client_ip.trust_proxy"), "{e}");
        let e = load(&[
            ("FLEET_LIMITER_DECISION_LISTEN", "127.0.0.1:7392"),
            ("FLEET_LIMITER_DECISION_ALLOW_FROM", "0.0.0.0/0"),
            ("FLEET_LIMITER_TRUST_PROXY", "0.0.0.0/0"),
            ("FLEET_LIMITER_TRUST_ALL_ADDRESSES", "true"),
        ])
        .unwrap_err();
        assert!(e.contains("decision.allow_from: covers"), "{e}");
        let e = load(&[("FLEET_LIMITER_DECISION_LISTEN", "localhost")]).unwrap_err();
        assert!(
            e.contains("decision.listen: `localhost` is not an address:port"),
            "{e}"
        );
        let cfg = load(&[
            ("FLEET_LIMITER_DECISION_LISTEN", "127.0.0.1:7392"),
            ("FLEET_LIMITER_DECISION_ALLOW_FROM", "10.0.0.0/30, 10.0.0.9"),
            ("FLEET_LIMITER_TRUST_PROXY", "10.0.0.0/24"),
        ])
        .unwrap();
        assert_eq!(cfg.decision.listen.map(|a| a.port()), Some(7392));
        assert_eq!(cfg.decision.allow_from.len(), 2);
    }
}
