//! `[identity]`: how dashboard session tokens are verified.
//!
//! Three key sources, any combination: a JWKS URL (RS/PS/ES/EdDSA keys by `kid`), one PEM public
//! key, an HS256 shared secret. With none configured no token verifies and `ui` keys on the IP.

use super::{duration, ConfigError, Ctx, DurationValue};
use serde::Deserialize;
use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

/// The cookie a Clerk-style dashboard carries its session token in.
pub const DEFAULT_SESSION_COOKIE: &str = "__session";
/// The shortest HS256 secret accepted without `allow_weak_secret`: 256 bits, the size of the MAC.
pub const MIN_SECRET_BYTES: usize = 32;

/// Secrets that ship in samples, tutorials and `.env.example` files: anyone can sign with them.
const PLACEHOLDER_SECRETS: &[&str] = &[
    "secret",
    "changeme",
    "change-me",
    "change_me",
    "changethis",
    "change-this-secret",
    "your-256-bit-secret",
    "your-secret-key",
    "your_secret_key",
    "your-jwt-secret",
    "jwt-secret",
    "jwt_secret",
    "jwtsecret",
    "supersecret",
    "super-secret",
    "mysecret",
    "my-secret",
    "secretkey",
    "secret-key",
    "password",
    "placeholder",
    "development",
    "dev-secret",
    "test-secret",
    "testsecret",
    "example",
    "default",
    "replace-me",
    "replaceme",
    "xxx",
];

/// A value that must not reach a log line: `Debug` prints only its length.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Self {
        Self(s.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret({} bytes)", self.0.len())
    }
}

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

    /// Why the HS256 secret is weak, if it is.
    pub fn weak_secret(&self) -> Option<&'static str> {
        self.jwt_hs256_secret
            .as_ref()
            .and_then(|s| weakness(s.expose()))
    }
}

/// Words that make up placeholder secrets (`my-super-secret-jwt-key`, `changeme-in-production`):
/// a secret made mostly of them is guessable, however long.
const PLACEHOLDER_WORDS: &[&str] = &[
    "your-256-bit-secret",
    "qwertyuiop",
    "asdfghjkl",
    "zxcvbnm",
    "development",
    "production",
    "placeholder",
    "localhost",
    "changeme",
    "changethis",
    "password",
    "insecure",
    "example",
    "default",
    "replace",
    "staging",
    "letmein",
    "signing",
    "session",
    "secrets",
    "testing",
    "sample",
    "secret",
    "change",
    "passwd",
    "random",
    "string",
    "tokens",
    "admin",
    "hs256",
    "value",
    "token",
    "super",
    "local",
    "your",
    "demo",
    "test",
    "pass",
    "this",
    "with",
    "long",
    "very",
    "keys",
    "bits",
    "here",
    "sign",
    "auth",
    "jwt",
    "key",
    "bit",
    "dev",
    "prod",
    "app",
    "api",
    "for",
    "and",
    "not",
    "use",
    "the",
    "our",
    "xxx",
    "abc",
    "256",
    "me",
    "my",
];

/// Fewer characters than this outside placeholder words, and the secret is made of them.
const MIN_OWN_CHARS: usize = 16;
/// Fewer distinct characters than this is too small an alphabet to be random.
const MIN_DISTINCT_CHARS: usize = 8;
/// Less estimated randomness than this (Shannon entropy of the characters, times the length).
const MIN_ESTIMATED_BITS: f64 = 80.0;

/// Why a shared secret is unfit to sign tokens, or `None` when it is fit.
///
/// Surrounding whitespace does not count. Refused: blank; a well-known placeholder; one
/// character repeated; shorter
/// than 32 bytes; a run of consecutive characters (`1234567890…`, `abcdef…`); a short pattern
/// repeated (`changemechangeme…`); mostly placeholder words (`your-256-bit-secret-your-…`);
/// fewer than 8 distinct characters; too little randomness for its length. A random secret of
/// 32 bytes or more, hex or base64, passes.
pub fn weakness(secret: &str) -> Option<&'static str> {
    let trimmed = secret.trim();
    if trimmed.is_empty() {
        return Some("it is blank");
    }
    let lower = trimmed.to_ascii_lowercase();
    let first = lower.chars().next();
    if PLACEHOLDER_SECRETS.contains(&lower.as_str()) {
        return Some("it is a well-known placeholder, so anyone can sign tokens with it");
    }
    if lower.chars().all(|c| Some(c) == first) {
        return Some("it is one character repeated, so anyone can guess it");
    }
    if trimmed.len() < MIN_SECRET_BYTES {
        return Some("it is shorter than 32 bytes");
    }
    let chars: Vec<char> = lower.chars().collect();
    if consecutive(&chars) {
        return Some(
            "it is a run of consecutive characters (like 1234567890 or abcdef), so it is guessable",
        );
    }
    if repeated(&chars) {
        return Some("it repeats a short pattern, so it holds no more randomness than the pattern");
    }
    if own_chars(&lower) < MIN_OWN_CHARS {
        return Some("it is made of well-known placeholder words (secret, changeme, your-256-bit-secret, ...), so it is guessable");
    }
    let mut distinct = chars.clone();
    distinct.sort_unstable();
    distinct.dedup();
    if distinct.len() < MIN_DISTINCT_CHARS {
        return Some("it uses too few distinct characters to be random");
    }
    if estimated_bits(&chars) < MIN_ESTIMATED_BITS {
        return Some("it holds too little randomness for its length");
    }
    None
}

/// Most steps between neighbours go up by one (or most go down by one): `0123456789012…`,
/// `abcdef…`, `987654…`.
fn consecutive(chars: &[char]) -> bool {
    let step = |a: char, b: char| -> i64 {
        match (a.to_digit(10), b.to_digit(10)) {
            // Digits wrap: 9 then 0 is a step up.
            (Some(x), Some(y)) if (x + 1) % 10 == y => 1,
            (Some(x), Some(y)) if (y + 1) % 10 == x => -1,
            _ => b as i64 - a as i64,
        }
    };
    let steps = chars.len().saturating_sub(1);
    let up = chars.windows(2).filter(|w| step(w[0], w[1]) == 1).count();
    let down = chars.windows(2).filter(|w| step(w[0], w[1]) == -1).count();
    steps > 0 && (up * 10 >= steps * 6 || down * 10 >= steps * 6)
}

/// The whole secret is a pattern of at most half its length, repeated.
fn repeated(chars: &[char]) -> bool {
    (1..=chars.len() / 2).any(|p| (p..chars.len()).all(|i| chars[i] == chars[i - p]))
}

/// How many characters are left once placeholder words and separators are taken out.
fn own_chars(lower: &str) -> usize {
    let mut rest = lower.to_owned();
    for w in PLACEHOLDER_WORDS {
        rest = rest.replace(w, " ");
    }
    rest.chars()
        .filter(|c| !(c.is_whitespace() || matches!(c, '-' | '_' | '.')))
        .count()
}

/// Shannon entropy of the character frequencies, times the length: an upper bound on the
/// randomness a secret with this character make-up can hold.
fn estimated_bits(chars: &[char]) -> f64 {
    let mut counts: HashMap<char, usize> = HashMap::new();
    for c in chars {
        *counts.entry(*c).or_default() += 1;
    }
    let n = chars.len() as f64;
    let per_char: f64 = counts
        .values()
        .map(|&k| {
            let p = k as f64 / n;
            -p * p.log2()
        })
        .sum();
    per_char * n
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawIdentity {
    jwks_url: Option<String>,
    jwks_ca_file: Option<String>,
    jwks_insecure_skip_verify: Option<bool>,
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
    let jwks_url = match raw
        .jwks_url
        .map(|u| u.trim().to_owned())
        .filter(|u| !u.is_empty())
    {
        Some(u) => Some(validate_jwks_url(ctx, &u)?),
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
            super::parse_duration(&t).map_err(|e| ctx.err("identity.leeway", e))?
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

fn validate_jwks_url(ctx: &Ctx, u: &str) -> Result<String, ConfigError> {
    match u.strip_prefix("https://").or_else(|| u.strip_prefix("http://")) {
        Some(rest) if !rest.is_empty() && !rest.starts_with('/') => Ok(u.to_owned()),
        _ => Err(ctx.err(
            "identity.jwks_url",
            format!("`{}` is not an http:// or https:// URL of a JSON Web Key Set (e.g. \"https://issuer.example/.well-known/jwks.json\")", crate::redact::url(u)),
        )),
    }
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

    #[test]
    fn weak_secrets_are_named() {
        assert_eq!(weakness(""), Some("it is blank"));
        assert_eq!(weakness("   "), Some("it is blank"));
        assert!(weakness("changeme").unwrap().contains("placeholder"));
        assert!(weakness("Your-256-Bit-Secret")
            .unwrap()
            .contains("placeholder"));
        assert_eq!(
            weakness(&"a".repeat(64)),
            Some("it is one character repeated, so anyone can guess it")
        );
        assert_eq!(
            weakness("0123456789abcdef0123456789abcde"),
            Some("it is shorter than 32 bytes")
        );
        assert_eq!(
            weakness("0f3a9c1e7b2d4a6c8e0b1d3f5a7c9e2b"),
            None,
            "32 random hex characters"
        );
    }

    #[test]
    fn guessable_secrets_of_any_length_are_named() {
        for (secret, why) in [
            (
                "changemechangemechangemechangeme",
                "repeats a short pattern",
            ),
            (
                "abababababababababababababababab",
                "repeats a short pattern",
            ),
            (
                "Passw0rd!Passw0rd!Passw0rd!Passw0rd!",
                "repeats a short pattern",
            ),
            ("0123456789abcdef0123456789abcdef", "consecutive characters"),
            (
                "your-256-bit-secret-your-256-bit-secret",
                "placeholder words",
            ),
            (
                "my-super-secret-jwt-key-for-production",
                "placeholder words",
            ),
            ("changeme1changeme2changeme3changeme4", "placeholder words"),
            ("qwertyuiopasdfghjklzxcvbnm123456", "placeholder words"),
            ("12345678901234567890123456789012", "consecutive characters"),
            (
                "abcdefghijklmnopqrstuvwxyz0123456789",
                "consecutive characters",
            ),
            ("98765432109876543210987654321098", "consecutive characters"),
            ("secret                              ", "placeholder"),
            (
                "hello                               ",
                "shorter than 32 bytes",
            ),
            ("aaaabbbbaaaabbbbccccaaaabbbbccccaaaabbbb", "few distinct"),
            (
                "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaab1c2d3e4f5g",
                "too little randomness",
            ),
        ] {
            let got = weakness(secret).unwrap_or_else(|| panic!("{secret:?} must be weak"));
            assert!(got.contains(why), "{secret:?}: {got}");
        }
    }

    #[test]
    fn random_secrets_pass() {
        use base64::Engine;
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x5ec7e7);
        let engines = [
            &base64::engine::general_purpose::STANDARD,
            &base64::engine::general_purpose::URL_SAFE_NO_PAD,
        ];
        for _ in 0..3000 {
            let mut bytes = [0u8; 48];
            rng.fill(&mut bytes[..]);
            let candidates = [
                hex::encode(&bytes[..16]),       // 32 hex characters
                hex::encode(&bytes[..32]),       // 64 hex characters
                engines[1].encode(&bytes[..32]), // 43 base64url characters
                engines[0].encode(&bytes[..24]), // 32 base64 characters
                engines[0].encode(&bytes[..48]), // `openssl rand -base64 48`
                (0..40)
                    .map(|_| char::from(b'0' + rng.gen_range(0..10u8)))
                    .collect(),
            ];
            for c in &candidates {
                assert_eq!(weakness(c), None, "{c}");
            }
        }
    }

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

    #[test]
    fn secret_debug_hides_the_value() {
        let s = Secret::new("hunter2-hunter2");
        assert_eq!(format!("{s:?}"), "Secret(15 bytes)");
    }
}
