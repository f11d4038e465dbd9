//! The validated `[identity]` section: key sources, claim rules, session cookie, cache and
//! JWKS timing, with the warnings its acknowledged risks carry. `config` reads the TOML section
//! into it.

use super::secret::{weakness, Secret};
use std::time::Duration;

/// The cookie a Clerk-style dashboard carries its session token in.
pub(crate) const DEFAULT_SESSION_COOKIE: &str = "__session";

/// The validated `[identity]` section.
#[derive(Debug, Clone, PartialEq)]
pub struct IdentityConfig {
    /// `http://` or `https://` URL of a JSON Web Key Set.
    pub jwks_url: Option<String>,
    /// A PEM bundle of CA certificates trusted for an `https://` JWKS URL, in addition to the
    /// system roots.
    pub jwks_ca_file: Option<std::path::PathBuf>,
    /// Accept any certificate from an `https://` JWKS URL (development only; warns on every start).
    pub jwks_insecure_skip_verify: bool,
    /// Fetch the key set over plain `http://` from a host that is not a loopback address
    /// (anyone on the path can then publish keys); warns on every start and reload.
    pub jwks_allow_http: bool,
    /// A PEM public key (RSA, EC or Ed25519): the text itself, read from a file if a path was given.
    pub jwt_public_key_pem: Option<String>,
    pub jwt_hs256_secret: Option<Secret>,
    /// `iss` must equal one of these when set.
    pub jwt_issuer: Vec<String>,
    /// `aud` must contain one of these when set; when empty a token with `aud` is still accepted.
    pub jwt_audience: Vec<String>,
    /// `azp` must be present and one of these when set.
    pub authorized_parties: Vec<String>,
    pub session_cookie: String,
    /// Start with a weak HS256 secret anyway (development only); warns on every start.
    pub allow_weak_secret: bool,
    /// Clock skew tolerated on `exp` and `nbf`.
    pub leeway: Duration,
    /// Least time between two JWKS fetches: an unknown `kid` inside it fails without a fetch.
    pub jwks_refresh_interval: Duration,
    /// Keys older than this are refreshed in the background; they stay in use meanwhile.
    pub jwks_max_age: Duration,
    /// Longest a JWKS fetch may take (connect and body).
    pub jwks_timeout: Duration,
    /// Most verified tokens remembered (by digest) until they expire.
    pub cache_max_entries: usize,
}

impl Default for IdentityConfig {
    fn default() -> Self {
        Self {
            jwks_url: None,
            jwks_ca_file: None,
            jwks_insecure_skip_verify: false,
            jwks_allow_http: false,
            jwt_public_key_pem: None,
            jwt_hs256_secret: None,
            jwt_issuer: Vec::new(),
            jwt_audience: Vec::new(),
            authorized_parties: Vec::new(),
            session_cookie: DEFAULT_SESSION_COOKIE.to_owned(),
            allow_weak_secret: false,
            leeway: Duration::from_secs(5),
            jwks_refresh_interval: Duration::from_secs(30),
            jwks_max_age: Duration::from_secs(600),
            jwks_timeout: Duration::from_secs(2),
            cache_max_entries: 10_000,
        }
    }
}

impl IdentityConfig {
    /// Whether any key source is configured.
    pub fn verifies(&self) -> bool {
        self.jwks_url.is_some()
            || self.jwt_public_key_pem.is_some()
            || self.jwt_hs256_secret.is_some()
    }

    /// The warning an acknowledged plain-`http://` key set on a host that is not a loopback
    /// address gets at every start and reload, or `None` when the key set is fetched over TLS
    /// or from this host.
    pub fn plain_http_warning(&self) -> Option<String> {
        let url = self.jwks_url.as_deref()?;
        if !self.jwks_allow_http || !needs_tls(url) {
            return None;
        }
        Some(format!(
            "identity.jwks_url `{}` is fetched over plain http:// from a host that is not a loopback address, because identity.jwks_allow_http is set: anyone on the network path to it can publish keys and mint dashboard users; use https:// (a private CA goes in identity.jwks_ca_file) or a loopback mirror, and unset identity.jwks_allow_http (FLEET_LIMITER_JWKS_ALLOW_HTTP)",
            crate::redact::url(url)
        ))
    }

    /// Why the HS256 secret is weak, if it is.
    pub fn weak_secret(&self) -> Option<&'static str> {
        self.jwt_hs256_secret
            .as_ref()
            .and_then(|s| weakness(s.expose()))
    }
}

/// A URL that is plain `http://` to a host other than this one.
pub(crate) fn needs_tls(url: &str) -> bool {
    match reqwest::Url::parse(url) {
        Ok(u) => u.scheme() == "http" && !u.host_str().is_some_and(is_loopback),
        Err(_) => false,
    }
}

/// Whether a parsed URL's host (`Url::host_str`: an IPv4 address already in dotted-quad form,
/// an IPv6 one in brackets) is a loopback address of this host: `localhost` (exactly: not
/// `localhost.` nor a name under it, which a resolver may send to DNS), an address in
/// `127.0.0.0/8` however it was spelled, `::1`, or an IPv4-mapped `::ffff:127.x.y.z`. Not the
/// unspecified `0.0.0.0` or `::`, which name no peer (Linux happens to connect them to this
/// host; other systems do not).
pub(crate) fn is_loopback(host: &str) -> bool {
    if host == "localhost" {
        return true;
    }
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    match bare.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(a)) => a.is_loopback(),
        Ok(std::net::IpAddr::V6(a)) => {
            a.is_loopback() || a.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
        Err(_) => false,
    }
}
