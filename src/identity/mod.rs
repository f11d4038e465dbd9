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

/// The prefix that marks an API key in `Authorization: Bearer`.
pub(crate) const API_KEY_PREFIX: &str = "pa_";

/// Checks a dashboard session token and returns its subject (the user id) when it verifies.
pub trait TokenVerifier: Send + Sync + 'static {
    fn verify<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Option<String>>;

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
    pub credential: Credential,
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
    let (user, credential) = match bearer {
        Some(t) if t.starts_with(API_KEY_PREFIX) => (None, Credential::ApiKey),
        Some(t) => match verifier.verify(t).await {
            Some(sub) => (Some(sub), Credential::VerifiedUser),
            None => (None, Credential::CliToken),
        },
        None => {
            let user = match session_token {
                Some(t) => verifier.verify(t).await,
                None => None,
            };
            let cred = if user.is_some() {
                Credential::VerifiedUser
            } else {
                Credential::None
            };
            (user, cred)
        }
    };
    Identity {
        agent_id,
        user,
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
