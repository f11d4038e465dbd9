//! Which principal is calling: the agent id, the verified dashboard user, the credential kind.
//!
//! Only what verifies counts as identity. A token that does not verify leaves the request keyed
//! on its IP, so an unverified claim can never mint a fresh bucket.

pub(crate) mod config;
pub(crate) mod jwks;
pub(crate) mod jwt;
pub(crate) mod secret;
#[cfg(test)]
mod verify_tests;

use crate::keys;
use futures_util::future::BoxFuture;
use std::sync::Arc;

/// Why `[identity]` cannot give a token verifier: each message names the setting and the fix.
#[derive(Debug, thiserror::Error)]
pub(crate) enum IdentityError {
    /// TLS toward the key set's host cannot be set up (a CA file that cannot be read).
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
    /// A setting that cannot be used as it is (a key that is not a public key in PEM form).
    #[error("{0}")]
    Setting(String),
    /// The key set's host answered with a certificate that does not verify.
    #[error("{0}")]
    KeySet(String),
}

/// A token that verified: its subject and the claims a limiter may key on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    pub sub: String,
    pub claims: Arc<TokenClaims>,
}

/// Most claims kept from one verified token.
pub(crate) const MAX_CLAIMS: usize = 16;

/// The top-level claims of a verified token that `claim:<name>` keys, plans and overrides can
/// read: string and whole-number values of 1-128 visible ASCII characters, under names of 1-64
/// characters of `A-Za-z0-9._:-`, at most 16 of them, registered claims (`sub`,
/// `exp`, `iss`, ...) left out. Anything else in the token is dropped, so a token cannot make
/// a key of junk. Only a verified token has any.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenClaims(Vec<(Box<str>, Box<str>)>);

/// Claims every token carries for the verifier's own use: never a key.
pub(crate) const REGISTERED_CLAIMS: &[&str] =
    &["sub", "exp", "nbf", "iat", "iss", "aud", "azp", "jti"];

/// Whether `name` can name a claim (`claim:<name>`): 1-64 characters of `A-Za-z0-9._:-`.
pub(crate) fn valid_claim_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
}

impl TokenClaims {
    /// The usable claims among a token's top-level `(name, value)` pairs (see [`TokenClaims`]).
    pub fn from_pairs<'a>(
        pairs: impl IntoIterator<Item = (&'a str, &'a serde_json::Value)>,
    ) -> Self {
        let mut out = Vec::new();
        for (name, value) in pairs {
            if out.len() >= MAX_CLAIMS {
                break;
            }
            if REGISTERED_CLAIMS.contains(&name) || !valid_claim_name(name) {
                continue;
            }
            let text = match value {
                serde_json::Value::String(s) => s.clone(),
                serde_json::Value::Number(n) if n.is_i64() || n.is_u64() => n.to_string(),
                _ => continue,
            };
            if keys::valid_key_header(text.as_bytes()).is_some() {
                out.push((Box::from(name), text.into_boxed_str()));
            }
        }
        Self(out)
    }

    /// The value of claim `name`, if the token carried a usable one.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.iter().find(|(n, _)| &**n == name).map(|(_, v)| &**v)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The prefix that marks an API key in `Authorization: Bearer`.
pub(crate) const API_KEY_PREFIX: &str = "pa_";

/// Checks a dashboard session token and returns its subject (the user id) when it verifies.
pub trait TokenVerifier: Send + Sync + 'static {
    fn verify<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Option<String>>;

    /// [`TokenVerifier::verify`] with the token's claims that limiters may key on
    /// ([`TokenClaims`]): by default the subject alone, with no claims.
    fn verify_claims<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Option<Verified>> {
        Box::pin(async move {
            self.verify(token).await.map(|sub| Verified {
                sub,
                claims: Arc::default(),
            })
        })
    }

    /// Whether tokens can be verified now (reported by `/readyz`).
    fn availability(&self) -> Availability {
        Availability::Off
    }

    /// Work that makes verification available again when it is not (a key set not fetched at
    /// start, fetched until it is), for the server to run in the background; `None` when
    /// nothing is missing.
    fn recover(&self) -> Option<BoxFuture<'static, ()>> {
        None
    }
}

/// Whether verified identity works right now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Availability {
    /// No key source is configured: no token verifies, by configuration.
    Off,
    /// Tokens signed by a configured key verify. `last_error` is why the last key-set fetch
    /// failed, when it did (the keys held before it are still in use).
    Available { last_error: Option<String> },
    /// A key set is configured but none of its keys is held: tokens it signs do not verify and
    /// their requests are keyed on the client IP until a fetch succeeds.
    Unavailable { error: String },
}

impl Availability {
    /// `off`, `available` or `unavailable`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Availability::Off => "off",
            Availability::Available { .. } => "available",
            Availability::Unavailable { .. } => "unavailable",
        }
    }

    /// Why the key set could not be fetched, if it could not.
    pub fn error(&self) -> Option<&str> {
        match self {
            Availability::Off => None,
            Availability::Available { last_error } => last_error.as_deref(),
            Availability::Unavailable { error } => Some(error),
        }
    }
}

/// No verification configured: no token ever verifies, so `ui` keys on the IP.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoVerifier;

impl TokenVerifier for NoVerifier {
    fn verify<'a>(&'a self, _token: &'a str) -> BoxFuture<'a, Option<String>> {
        Box::pin(async { None })
    }

    fn verify_claims<'a>(&'a self, _token: &'a str) -> BoxFuture<'a, Option<Verified>> {
        Box::pin(async { None })
    }
}

/// What kind of credential a request carries, as far as limiting cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Credential {
    /// No `Authorization: Bearer`.
    None,
    /// `Bearer pa_…`.
    ApiKey,
    /// A Bearer token that is neither an API key nor a verified dashboard token.
    CliToken,
    /// A dashboard session token that verified.
    VerifiedUser,
}

impl Credential {
    /// Every kind, for checks that must hold whichever a request has.
    pub const ALL: [Credential; 4] = [
        Credential::None,
        Credential::ApiKey,
        Credential::CliToken,
        Credential::VerifiedUser,
    ];
}

/// The request's principal facts, borrowed from the request where they can be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Identity<'a> {
    /// A valid `X-Agent-ID`, else `None`.
    pub agent_id: Option<&'a str>,
    /// The verified subject of a dashboard token.
    pub user: Option<String>,
    /// The verified token's claims; `None` without one (see [`Identity::claims`]).
    claims: Option<Arc<TokenClaims>>,
    pub credential: Credential,
}

/// No claims: what a request without a verified token carries.
static NO_CLAIMS: TokenClaims = TokenClaims(Vec::new());

impl Identity<'_> {
    /// The verified token's claims, empty without one.
    pub(crate) fn claims(&self) -> &TokenClaims {
        self.claims.as_deref().unwrap_or(&NO_CLAIMS)
    }
}

/// The token of an `Authorization: Bearer <token>` header (scheme case-insensitive).
pub fn bearer_token(authorization: &[u8]) -> Option<&str> {
    let s = std::str::from_utf8(authorization).ok()?.trim();
    let (scheme, token) = s.split_once(char::is_whitespace)?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let token = token.trim();
    (!token.is_empty()).then_some(token)
}

/// Work out the identity from the raw header values.
///
/// `session_token` is a dashboard token found outside the Authorization header (a cookie).
pub(crate) async fn identify<'a>(
    verifier: &dyn TokenVerifier,
    agent_id: Option<&'a [u8]>,
    authorization: Option<&[u8]>,
    session_token: Option<&str>,
) -> Identity<'a> {
    let agent_id = agent_id.and_then(keys::valid_agent_id);
    let bearer = authorization.and_then(bearer_token);
    let (verified, credential) = match bearer {
        Some(t) if t.starts_with(API_KEY_PREFIX) => (None, Credential::ApiKey),
        Some(t) => match verifier.verify_claims(t).await {
            Some(v) => (Some(v), Credential::VerifiedUser),
            None => (None, Credential::CliToken),
        },
        None => {
            let verified = match session_token {
                Some(t) => verifier.verify_claims(t).await,
                None => None,
            };
            let cred = if verified.is_some() {
                Credential::VerifiedUser
            } else {
                Credential::None
            };
            (verified, cred)
        }
    };
    // No allocation for the usual request, which carries no verified token.
    let (user, claims) = match verified {
        Some(v) => (Some(v.sub), Some(v.claims)),
        None => (None, None),
    };
    Identity {
        agent_id,
        user,
        claims,
        credential,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Only(&'static str);
    impl TokenVerifier for Only {
        fn verify<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Option<String>> {
            let ok = token == self.0;
            Box::pin(async move { ok.then(|| "user_1".to_owned()) })
        }
    }

    #[test]
    fn bearer_parsing() {
        assert_eq!(bearer_token(b"Bearer abc"), Some("abc"));
        assert_eq!(bearer_token(b"bearer   abc "), Some("abc"));
        assert_eq!(bearer_token(b"Basic abc"), None);
        assert_eq!(bearer_token(b"Bearer"), None);
        assert_eq!(bearer_token(b"Bearer  "), None);
        assert_eq!(bearer_token(&[0xff, 0x20, 0x41]), None);
    }

    #[actix_rt::test]
    async fn credential_kinds() {
        let v = Only("good");
        let id = identify(&v, Some(b"agent-1"), Some(b"Bearer pa_123"), None).await;
        assert_eq!(id.credential, Credential::ApiKey);
        assert_eq!(id.agent_id, Some("agent-1"));
        let id = identify(&v, None, Some(b"Bearer good"), None).await;
        assert_eq!(
            (id.credential, id.user.as_deref()),
            (Credential::VerifiedUser, Some("user_1"))
        );
        let id = identify(&v, None, Some(b"Bearer forged"), None).await;
        assert_eq!((id.credential, id.user), (Credential::CliToken, None));
        let id = identify(&v, Some(b"bad id!"), None, Some("good")).await;
        assert_eq!(
            (id.credential, id.agent_id),
            (Credential::VerifiedUser, None)
        );
        let id = identify(&NoVerifier, None, None, Some("good")).await;
        assert_eq!((id.credential, id.user), (Credential::None, None));
    }
}
