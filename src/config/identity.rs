//! `[identity]`: how dashboard session tokens are verified.
//!
//! Three key sources, any combination: a JWKS URL (RS/PS/ES/EdDSA keys by `kid`), one PEM public
//! key, an HS256 shared secret. With none configured no token verifies and `ui` keys on the IP.
//!
//! The section's types are identity's own (`crate::identity::config`); this reads the TOML
//! section into them and refuses what must not start.

pub(crate) use crate::identity::config::{needs_tls, IdentityConfig};
pub(crate) use crate::identity::secret::Secret;

use super::{duration, ConfigError, Ctx, DurationValue};
use serde::Deserialize;
use std::time::Duration;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawIdentity {
    jwks_url: Option<String>,
    jwks_ca_file: Option<String>,
    jwks_insecure_skip_verify: Option<bool>,
    jwks_allow_http: Option<bool>,
    jwt_public_key_pem: Option<String>,
    jwt_hs256_secret: Option<String>,
    jwt_issuer: Option<OneOrMany>,
    jwt_audience: Option<OneOrMany>,
    authorized_parties: Option<OneOrMany>,
    session_cookie: Option<String>,
    allow_weak_secret: Option<bool>,
    leeway: Option<DurationValue>,
    jwks_refresh_interval: Option<DurationValue>,
    jwks_max_age: Option<DurationValue>,
    jwks_timeout: Option<DurationValue>,
    cache_max_entries: Option<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    fn into_vec(self) -> Vec<String> {
        let v = match self {
            OneOrMany::One(s) => s.split(',').map(str::to_owned).collect(),
            OneOrMany::Many(v) => v,
        };
        v.into_iter()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .collect()
    }
}

pub(super) fn build(raw: RawIdentity, ctx: &Ctx) -> Result<IdentityConfig, ConfigError> {
    let d = IdentityConfig::default();
    let secs = |v: Duration| format!("{}s", v.as_secs());
    let jwks_allow_http = raw.jwks_allow_http.unwrap_or(false);
    let jwks_url = match raw
        .jwks_url
        .map(|u| u.trim().to_owned())
        .filter(|u| !u.is_empty())
    {
        Some(u) => Some(validate_jwks_url(ctx, &u, jwks_allow_http)?),
        None => None,
    };
    let jwks_ca_file = match raw.jwks_ca_file.filter(|p| !p.trim().is_empty()) {
        Some(p) => Some(super::ca_file(ctx, "identity.jwks_ca_file", &p)?),
        None => None,
    };
    let jwks_insecure_skip_verify = raw.jwks_insecure_skip_verify.unwrap_or(false);
    let jwt_public_key_pem = match raw.jwt_public_key_pem.filter(|p| !p.trim().is_empty()) {
        Some(p) => Some(read_pem(ctx, p)?),
        None => None,
    };
    let session_cookie = raw.session_cookie.unwrap_or(d.session_cookie);
    let cookie_ok = !session_cookie.is_empty()
        && session_cookie
            .bytes()
            .all(|b| b.is_ascii_graphic() && !b"()<>@,;:\\\"/[]?={}".contains(&b));
    if !cookie_ok {
        return Err(ctx.err(
            "identity.session_cookie",
            format!("`{session_cookie}` is not a cookie name; use letters, digits and `_-.` (default \"__session\")"),
        ));
    }
    let max_entries = raw.cache_max_entries.unwrap_or(d.cache_max_entries as i64);
    if max_entries < 1 {
        return Err(ctx.err(
            "identity.cache_max_entries",
            "must be at least 1 (default 10000)",
        ));
    }
    let leeway = match raw.leeway {
        None => d.leeway,
        Some(DurationValue::Secs(s)) => Duration::from_secs(s),
        Some(DurationValue::Text(t)) => {
            crate::duration::parse_duration(&t).map_err(|e| ctx.err("identity.leeway", e))?
        }
    };
    if leeway > Duration::from_secs(300) {
        return Err(ctx.err(
            "identity.leeway",
            "is longer than 5 minutes; clock skew needs seconds (default 5s)",
        ));
    }
    let cfg = IdentityConfig {
        jwks_url,
        jwks_ca_file,
        jwks_insecure_skip_verify,
        jwks_allow_http,
        jwt_public_key_pem,
        jwt_hs256_secret: raw.jwt_hs256_secret.map(Secret::new),
        jwt_issuer: raw.jwt_issuer.map(OneOrMany::into_vec).unwrap_or_default(),
        jwt_audience: raw
            .jwt_audience
            .map(OneOrMany::into_vec)
            .unwrap_or_default(),
        authorized_parties: raw
            .authorized_parties
            .map(OneOrMany::into_vec)
            .unwrap_or_default(),
        session_cookie,
        allow_weak_secret: raw.allow_weak_secret.unwrap_or(false),
        leeway,
        jwks_refresh_interval: duration(
            ctx,
            "identity.jwks_refresh_interval",
            raw.jwks_refresh_interval,
            &secs(d.jwks_refresh_interval),
        )?,
        jwks_max_age: duration(
            ctx,
            "identity.jwks_max_age",
            raw.jwks_max_age,
            &secs(d.jwks_max_age),
        )?,
        jwks_timeout: duration(
            ctx,
            "identity.jwks_timeout",
            raw.jwks_timeout,
            &secs(d.jwks_timeout),
        )?,
        cache_max_entries: max_entries as usize,
    };
    if let Some(why) = cfg.weak_secret() {
        if !cfg.allow_weak_secret {
            return Err(ctx.err(
                "identity.jwt_hs256_secret",
                format!(
                    "the HS256 secret is weak ({why}); a token signed with a guessable secret is forgeable by anyone, so `serve` does not start with it. Set a random secret of at least 32 bytes (e.g. `openssl rand -base64 48`), or for local development only set identity.allow_weak_secret = true (FLEET_LIMITER_ALLOW_WEAK_SECRET=true)"
                ),
            ));
        }
    }
    Ok(cfg)
}

/// The key set's URL as the HTTP client will read it (the WHATWG URL parser `reqwest` uses:
/// scheme and host lower-cased, whitespace and tabs dropped, `\\` read as `/`, `127.1` and
/// `2130706433` read as `127.0.0.1`, the host after any `user@`), so that the host judged here
/// is the host connected to. A plain `http://` URL whose host is not a loopback address is
/// refused unless `identity.jwks_allow_http` acknowledges it.
fn validate_jwks_url(ctx: &Ctx, u: &str, allow_http: bool) -> Result<String, ConfigError> {
    let example = "e.g. \"https://issuer.example/.well-known/jwks.json\"";
    let not_a_url = |why: &str| {
        ctx.err(
            "identity.jwks_url",
            format!(
                "`{}` is not an http:// or https:// URL of a JSON Web Key Set ({why}; {example})",
                crate::redact::url(u)
            ),
        )
    };
    // Spelled as written, not as a lenient parser would repair it: `https:///x` (read as the
    // host `x`), `http:host` and whitespace inside are typos or tricks, and a backslash is read
    // as `/` by some parsers and as data by others (`http://127.0.0.1\@host/`).
    if u.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(not_a_url("it holds whitespace or a control character"));
    }
    if u.contains('\\') {
        return Err(not_a_url("it holds a backslash; write `/`"));
    }
    let lower = u.to_ascii_lowercase();
    let rest = lower
        .strip_prefix("https://")
        .or_else(|| lower.strip_prefix("http://"));
    if !rest.is_some_and(|r| !r.is_empty() && !r.starts_with(['/', '\\'])) {
        return Err(not_a_url(
            "it does not start with http:// or https:// and a host",
        ));
    }
    let parsed = reqwest::Url::parse(u).map_err(|e| not_a_url(&e.to_string()))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(not_a_url(&format!("the scheme is `{}`", parsed.scheme())));
    }
    if parsed.host().is_none() {
        return Err(not_a_url("it names no host"));
    }
    let url = parsed.as_str().to_owned();
    if needs_tls(&url) && !allow_http {
        return Err(ctx.err(
            "identity.jwks_url",
            format!(
                "`{}` fetches the key set over plain http:// from {}, which is not a loopback address: anyone on the network path to it can publish keys and mint dashboard users, so `serve` does not start with it. Use https:// (trust a private CA with identity.jwks_ca_file), or an http:// mirror on this host (localhost, 127.0.0.1, [::1]); to accept the risk, set identity.jwks_allow_http = true (FLEET_LIMITER_JWKS_ALLOW_HTTP=true), which warns at every start",
                crate::redact::url(&url),
                host_shown(&parsed),
            ),
        ));
    }
    Ok(url)
}

/// The host of a parsed URL as it would be connected to (no port, no userinfo).
fn host_shown(url: &reqwest::Url) -> String {
    url.host_str()
        .map_or_else(|| "no host".to_owned(), |h| format!("`{h}`"))
}

/// The PEM text itself, or the contents of the file it names.
fn read_pem(ctx: &Ctx, value: String) -> Result<String, ConfigError> {
    if value.contains("-----BEGIN") {
        return Ok(value);
    }
    let path = value.trim();
    let text = std::fs::read_to_string(path).map_err(|e| {
        ctx.err(
            "identity.jwt_public_key_pem",
            format!("is neither PEM text (-----BEGIN PUBLIC KEY-----) nor a readable file: `{path}`: {e}"),
        )
    })?;
    if !text.contains("-----BEGIN") {
        return Err(ctx.err(
            "identity.jwt_public_key_pem",
            format!("`{path}` does not hold a PEM public key (-----BEGIN PUBLIC KEY-----)"),
        ));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    fn load(env: &[(&str, &str)]) -> Result<IdentityConfig, String> {
        crate::config::Loader::new()
            .env(env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())))
            .load()
            .map(|c| c.identity)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn environment_variables_fill_the_section() {
        let c = load(&[
            (
                "FLEET_LIMITER_JWKS_URL",
                "http://127.0.0.1:9/.well-known/jwks.json",
            ),
            (
                "FLEET_LIMITER_JWT_HS256_SECRET",
                "pZ3v8Qm1Lr6Tn0Ws4Yx7Bc2Dk9Hf5JaE",
            ),
            ("FLEET_LIMITER_JWT_ISSUER", "https://clerk.example.test"),
            ("FLEET_LIMITER_JWT_AUDIENCE", "dashboard, cli"),
            (
                "FLEET_LIMITER_AUTHORIZED_PARTIES",
                "https://app.example.test",
            ),
            ("FLEET_LIMITER_SESSION_COOKIE", "sid"),
            ("FLEET_LIMITER_JWKS_REFRESH_INTERVAL", "1m"),
            ("FLEET_LIMITER_JWT_LEEWAY", "0"),
            ("FLEET_LIMITER_JWT_CACHE_MAX_ENTRIES", "50"),
        ])
        .unwrap();
        assert_eq!(
            c.jwks_url.as_deref(),
            Some("http://127.0.0.1:9/.well-known/jwks.json")
        );
        assert_eq!(c.jwt_audience, ["dashboard", "cli"]);
        assert_eq!(c.jwt_issuer, ["https://clerk.example.test"]);
        assert_eq!(c.authorized_parties, ["https://app.example.test"]);
        assert_eq!(c.session_cookie, "sid");
        assert_eq!(c.jwks_refresh_interval, Duration::from_secs(60));
        assert_eq!(c.leeway, Duration::ZERO);
        assert_eq!(c.cache_max_entries, 50);
        assert!(c.verifies());
        let d = load(&[]).unwrap();
        assert_eq!(d, IdentityConfig::default());
        assert!(!d.verifies());
        assert_eq!(d.session_cookie, "__session");
    }

    #[test]
    fn weak_secret_refused_unless_allowed() {
        let e = load(&[("FLEET_LIMITER_JWT_HS256_SECRET", "changeme")]).unwrap_err();
        assert!(e.starts_with("environment variable FLEET_LIMITER_JWT_HS256_SECRET: identity.jwt_hs256_secret: the HS256 secret is weak"), "{e}");
        assert!(
            e.contains("placeholder") && e.contains("allow_weak_secret"),
            "{e}"
        );
        assert!(
            !e.contains("changeme"),
            "the message must not repeat the secret: {e}"
        );
        let e = load(&[("FLEET_LIMITER_JWT_HS256_SECRET", "")]).unwrap_err();
        assert!(e.contains("it is blank"), "{e}");
        let c = load(&[
            ("FLEET_LIMITER_JWT_HS256_SECRET", "short"),
            ("FLEET_LIMITER_ALLOW_WEAK_SECRET", "true"),
        ])
        .unwrap();
        assert_eq!(c.weak_secret(), Some("it is shorter than 32 bytes"));
    }

    #[test]
    fn bad_values_say_how_to_fix_them() {
        let c = load(&[("FLEET_LIMITER_JWKS_URL", "https://x.test/jwks")]).unwrap();
        assert_eq!(c.jwks_url.as_deref(), Some("https://x.test/jwks"));
        assert!(!c.jwks_insecure_skip_verify);
        let e = load(&[("FLEET_LIMITER_JWKS_URL", "ftp://x")]).unwrap_err();
        assert!(e.contains("not an http:// or https:// URL"), "{e}");
        let e = load(&[("FLEET_LIMITER_JWKS_URL", "https:///jwks")]).unwrap_err();
        assert!(e.contains("not an http:// or https:// URL"), "{e}");
        let e = load(&[("FLEET_LIMITER_JWKS_CA_FILE", "/nonexistent/ca.pem")]).unwrap_err();
        assert!(
            e.starts_with("environment variable FLEET_LIMITER_JWKS_CA_FILE: identity.jwks_ca_file: `/nonexistent/ca.pem` cannot be read"),
            "{e}"
        );
        let e = load(&[("FLEET_LIMITER_SESSION_COOKIE", "a;b")]).unwrap_err();
        assert!(e.contains("not a cookie name"), "{e}");
        let e = load(&[("FLEET_LIMITER_JWT_PUBLIC_KEY_PEM", "/nonexistent/key.pem")]).unwrap_err();
        assert!(e.contains("neither PEM text"), "{e}");
        let e = load(&[("FLEET_LIMITER_JWT_LEEWAY", "1h")]).unwrap_err();
        assert!(e.contains("longer than 5 minutes"), "{e}");
    }

    #[test]
    fn the_toml_section() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fleet.toml");
        std::fs::write(
            &path,
            "[identity]\njwks_url = \"http://127.0.0.1:9/jwks\"\njwt_audience = [\"a\", \"b\"]\nauthorized_parties = \"https://x.test\"\njwks_timeout = \"500ms\"\n",
        )
        .unwrap();
        let c = crate::config::Loader::new()
            .file(&path)
            .load()
            .unwrap()
            .identity;
        assert_eq!(c.jwt_audience, ["a", "b"]);
        assert_eq!(c.authorized_parties, ["https://x.test"]);
        assert_eq!(c.jwks_timeout, Duration::from_millis(500));
        std::fs::write(&path, "[identity]\njwks_uri = \"http://x\"\n").unwrap();
        let e = crate::config::Loader::new()
            .file(&path)
            .load()
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown field `jwks_uri`"), "{e}");
    }

    /// Spellings of a host that is not this one: refused over plain http:// unless acknowledged.
    const REMOTE: &[&str] = &[
        "http://idp.example.com/jwks.json",
        "HTTP://IDP.EXAMPLE.COM/jwks.json",
        "  http://idp.example.com/jwks.json  ",
        "http://127.0.0.1.@idp.example.com/jwks.json",
        "http://127.0.0.1@idp.example.com/jwks.json",
        "http://localhost:80@idp.example.com/jwks.json",
        "http://user:pw@idp.example.com/jwks.json",
        "http://localhost./jwks.json",
        "http://localhost.idp.example.com/jwks.json",
        "http://idp.localhost/jwks.json",
        "http://127.0.0.1.nip.io/jwks.json",
        "http://0.0.0.0/jwks.json",
        "http://0/jwks.json",
        "http://[::]/jwks.json",
        "http://[::ffff:10.0.0.1]/jwks.json",
        "http://[::127.0.0.1]/jwks.json",
        "http://[fe80::1]/jwks.json",
        "http://167772161/jwks.json",
        "http://0x0a.0.0.1/jwks.json",
        "http://10.1/jwks.json",
        "http://128.0.0.1/jwks.json",
        "http://126.255.255.255/jwks.json",
    ];

    /// Spellings of a loopback address: plain http:// stays on this host.
    const LOOPBACK: &[&str] = &[
        "http://localhost/jwks.json",
        "http://LOCALHOST:8080/jwks.json",
        "HTTP://localhost/jwks.json",
        "http://\u{24db}ocalhost/jwks.json",
        "http://127.0.0.1:9/jwks.json",
        "http://127.255.255.254/jwks.json",
        "http://127.1/jwks.json",
        "http://2130706433/jwks.json",
        "http://0x7f000001/jwks.json",
        "http://0177.0.0.1/jwks.json",
        "http://[::1]/jwks.json",
        "http://[0:0:0:0:0:0:0:1]:8080/jwks.json",
        "http://[::ffff:127.0.0.1]/jwks.json",
        "http://[::ffff:7f00:1]/jwks.json",
        "http://idp.example.com@127.0.0.1/jwks.json",
        "http://127.0.0.%31/jwks.json",
        "http://user:pw@localhost/jwks.json",
    ];

    #[test]
    fn plain_http_to_another_host_is_refused_however_it_is_spelled() {
        for url in REMOTE {
            let e = load(&[("FLEET_LIMITER_JWKS_URL", url)])
                .expect_err(&format!("{url:?} must be refused"));
            assert!(
                e.starts_with("environment variable FLEET_LIMITER_JWKS_URL: identity.jwks_url: "),
                "{url:?}: {e}"
            );
            assert!(
                e.contains("not a loopback address")
                    && e.contains("identity.jwks_allow_http = true")
                    && e.contains("FLEET_LIMITER_JWKS_ALLOW_HTTP=true"),
                "{url:?}: {e}"
            );
            assert!(!e.contains("pw@"), "no password shown: {e}");
            let c = load(&[
                ("FLEET_LIMITER_JWKS_URL", url),
                ("FLEET_LIMITER_JWKS_ALLOW_HTTP", "true"),
            ])
            .unwrap_or_else(|e| panic!("{url:?} acknowledged: {e}"));
            let kept = c.jwks_url.clone().unwrap_or_default();
            assert!(kept.starts_with("http://"), "{url:?} kept as {kept}");
            let w = c.plain_http_warning().expect("a warning at every start");
            assert!(w.contains("identity.jwks_allow_http"), "{w}");
            assert!(!w.contains("pw@"), "no password shown: {w}");
        }
    }

    #[test]
    fn plain_http_to_a_loopback_address_needs_no_acknowledgement() {
        for url in LOOPBACK {
            let c =
                load(&[("FLEET_LIMITER_JWKS_URL", url)]).unwrap_or_else(|e| panic!("{url:?}: {e}"));
            let kept = c.jwks_url.clone().unwrap_or_default();
            assert!(kept.starts_with("http://"), "{url:?} kept as {kept}");
            assert!(!needs_tls(&kept), "{url:?} read as {kept}");
            assert_eq!(c.plain_http_warning(), None, "{url:?}");
        }
        // What the client connects to is what was judged: the URL kept is the parsed one.
        for (given, kept) in [
            ("http://127.1/jwks.json", "http://127.0.0.1/jwks.json"),
            (
                "HTTP://LOCALHOST:8080/jwks.json",
                "http://localhost:8080/jwks.json",
            ),
            ("http://2130706433/jwks.json", "http://127.0.0.1/jwks.json"),
            ("http://[0:0:0:0:0:0:0:1]/k", "http://[::1]/k"),
            ("https://Issuer.Example/jwks", "https://issuer.example/jwks"),
        ] {
            let c = load(&[("FLEET_LIMITER_JWKS_URL", given)]).expect(given);
            assert_eq!(c.jwks_url.as_deref(), Some(kept), "{given}");
        }
    }

    #[test]
    fn https_and_acknowledged_loopback_never_warn() {
        for url in [
            "https://idp.example.com/jwks.json",
            "http://127.0.0.1/jwks.json",
        ] {
            let c = load(&[
                ("FLEET_LIMITER_JWKS_URL", url),
                ("FLEET_LIMITER_JWKS_ALLOW_HTTP", "true"),
            ])
            .expect(url);
            assert_eq!(c.plain_http_warning(), None, "{url}");
        }
        for url in [
            "http://",
            "http:///jwks",
            "https:///idp.example.com/jwks",
            "http:\\\\idp.example.com\\jwks.json",
            "http:/\\idp.example.com/jwks.json",
            "http://idp.example.com\\jwks.json",
            "http://127.0.0.1\\@idp.example.com/jwks.json",
            "http://127.0.0.1%40idp.example.com/jwks.json",
            "http:idp.example.com/jwks.json",
            "http://idp.example.com\t/jwks.json",
            "http://127.0.0.1\n.idp.example.com/jwks.json",
            "http://[::1/jwks",
            "http://a b/jwks",
            "file:///etc/jwks",
            "http://127.0.0.1:99999/",
        ] {
            let e = load(&[("FLEET_LIMITER_JWKS_URL", url)]).expect_err(url);
            assert!(
                e.contains("is not an http:// or https:// URL"),
                "{url}: {e}"
            );
        }
    }
}
