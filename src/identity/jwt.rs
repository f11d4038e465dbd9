//! Dashboard session tokens: signature, `exp`/`nbf` with leeway, `iss`, `aud`, `azp`; the user
//! is `sub`. A verified token is remembered by its SHA-256 digest (never the token) until it
//! expires, in a bounded cache, so a dashboard polling every few seconds pays for one signature
//! check per token rather than one per request.

use super::jwks::{Jwks, VerifyKey};
use super::{Availability, TokenClaims, TokenVerifier, Verified};
use crate::clock::Clock;
use crate::identity::config::IdentityConfig;
use futures_util::future::BoxFuture;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use parking_lot::Mutex;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::Arc;

/// Longest token looked at; anything longer is not a session token.
pub(crate) const MAX_TOKEN_LEN: usize = 16 * 1024;
/// Longest `sub` accepted as a user id.
pub(crate) const MAX_SUB_LEN: usize = 256;

/// Seconds since the Unix epoch, as token claims count time.
pub(crate) trait WallClock: Send + Sync + 'static {
    fn unix_now(&self) -> u64;
}

/// The system's wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct SystemWallClock;

impl WallClock for SystemWallClock {
    fn unix_now(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0)
    }
}

#[derive(Deserialize)]
struct Claims {
    sub: String,
    exp: f64,
    #[serde(default)]
    nbf: Option<f64>,
    #[serde(default)]
    azp: Option<String>,
    /// The other top-level claims, for `claim:<name>` keys (see `TokenClaims`).
    #[serde(flatten)]
    rest: serde_json::Map<String, serde_json::Value>,
}

#[derive(Clone)]
struct Cached {
    sub: Arc<str>,
    claims: Arc<TokenClaims>,
    exp: u64,
    nbf: u64,
}

/// Verified tokens by digest, each until its `exp`. Holds at most `max` entries: a full cache
/// first drops what has expired, then the entry closest to expiry.
pub(crate) struct VerifyCache {
    max: usize,
    map: Mutex<HashMap<[u8; 32], Cached>>,
}

impl VerifyCache {
    pub(crate) fn new(max: usize) -> Self {
        Self {
            max: max.max(1),
            map: Mutex::new(HashMap::new()),
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.lock().len()
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn get(&self, digest: &[u8; 32], now: u64, leeway: u64) -> Option<Verified> {
        let mut map = self.map.lock();
        let hit = map.get(digest)?.clone();
        if hit.exp.saturating_add(leeway) < now {
            map.remove(digest);
            return None;
        }
        (hit.nbf <= now.saturating_add(leeway)).then(|| Verified {
            sub: hit.sub.to_string(),
            claims: hit.claims,
        })
    }

    fn insert(&self, digest: [u8; 32], entry: Cached, now: u64) {
        let mut map = self.map.lock();
        if map.len() >= self.max && !map.contains_key(&digest) {
            map.retain(|_, c| c.exp >= now);
            if map.len() >= self.max {
                if let Some(k) = map.iter().min_by_key(|(_, c)| c.exp).map(|(k, _)| *k) {
                    map.remove(&k);
                }
            }
        }
        map.insert(digest, entry);
    }
}

/// The SHA-256 of a token: the only form in which a token is kept.
pub(crate) fn token_digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Verifies session tokens against the configured JWKS, PEM key and HS256 secret.
pub(crate) struct JwtVerifier {
    jwks: Option<Arc<Jwks>>,
    pem: Option<Arc<VerifyKey>>,
    hs256: Option<Arc<VerifyKey>>,
    issuer: Vec<String>,
    audience: Vec<String>,
    authorized_parties: Vec<String>,
    leeway: u64,
    wall: Arc<dyn WallClock>,
    cache: VerifyCache,
}

impl JwtVerifier {
    /// The verifier `[identity]` describes, or `None` when it names no key source.
    pub(crate) fn from_config(
        cfg: &IdentityConfig,
        clock: Arc<dyn Clock>,
        wall: Arc<dyn WallClock>,
    ) -> Result<Option<Self>, super::IdentityError> {
        if !cfg.verifies() {
            return Ok(None);
        }
        let jwks = match &cfg.jwks_url {
            Some(url) => {
                let tls = if url.starts_with("https://") {
                    Some(crate::tls::client_config(
                        super::jwks::SERVICE,
                        cfg.jwks_ca_file.as_deref(),
                        cfg.jwks_insecure_skip_verify,
                    )?)
                } else {
                    None
                };
                Some(Arc::new(Jwks::new_with_tls(
                    url.clone(),
                    cfg.jwks_timeout,
                    cfg.jwks_refresh_interval,
                    cfg.jwks_max_age,
                    clock,
                    tls,
                )?))
            }
            None => None,
        };
        let pem = match &cfg.jwt_public_key_pem {
            Some(p) => Some(Arc::new(VerifyKey::from_pem(p).ok_or_else(|| {
                super::IdentityError::Setting(
                    "identity.jwt_public_key_pem: not an RSA, EC (P-256/P-384) or Ed25519 public key in PEM form".to_owned()
                )
            })?)),
            None => None,
        };
        let hs256 = cfg.jwt_hs256_secret.as_ref().map(|s| {
            Arc::new(VerifyKey {
                key: DecodingKey::from_secret(s.expose().as_bytes()),
                algorithms: vec![Algorithm::HS256],
            })
        });
        Ok(Some(Self {
            jwks,
            pem,
            hs256,
            issuer: cfg.jwt_issuer.clone(),
            audience: cfg.jwt_audience.clone(),
            authorized_parties: cfg.authorized_parties.clone(),
            leeway: cfg.leeway.as_secs(),
            wall,
            cache: VerifyCache::new(cfg.cache_max_entries),
        }))
    }

    pub(crate) fn jwks(&self) -> Option<&Arc<Jwks>> {
        self.jwks.as_ref()
    }

    #[cfg(test)]
    pub(crate) fn cache(&self) -> &VerifyCache {
        &self.cache
    }

    /// The subject of a token that verifies, else `None`. Never panics on any input.
    pub(crate) async fn verify_token(&self, token: &str) -> Option<String> {
        self.verify_token_claims(token).await.map(|v| v.sub)
    }

    /// [`JwtVerifier::verify_token`] with the token's usable claims.
    pub(crate) async fn verify_token_claims(&self, token: &str) -> Option<Verified> {
        if token.is_empty() || token.len() > MAX_TOKEN_LEN {
            return None;
        }
        let digest = token_digest(token);
        let now = self.wall.unix_now();
        if let Some(v) = self.cache.get(&digest, now, self.leeway) {
            return Some(v);
        }
        // `alg: none` and unknown algorithms fail here: they are not `Algorithm`s.
        let header = jsonwebtoken::decode_header(token).ok()?;
        let alg = header.alg;
        let candidates: Vec<Arc<VerifyKey>> = match alg {
            Algorithm::HS256 => self.hs256.iter().cloned().collect(),
            Algorithm::HS384 | Algorithm::HS512 => Vec::new(),
            _ => {
                let mut keys = match &self.jwks {
                    Some(j) if header.kid.is_some() || self.pem.is_none() => {
                        j.candidates(header.kid.as_deref()).await
                    }
                    _ => Vec::new(),
                };
                keys.extend(self.pem.iter().cloned());
                keys
            }
        };
        for key in candidates.iter().filter(|k| k.algorithms.contains(&alg)) {
            if let Some(c) = self.check(token, alg, &key.key, now) {
                let verified = Verified {
                    sub: c.sub.to_string(),
                    claims: c.claims.clone(),
                };
                self.cache.insert(digest, c, now);
                return Some(verified);
            }
        }
        None
    }

    fn check(&self, token: &str, alg: Algorithm, key: &DecodingKey, now: u64) -> Option<Cached> {
        let mut v = Validation::new(alg);
        v.algorithms = vec![alg];
        v.validate_exp = false;
        v.validate_nbf = false;
        let mut required = vec!["exp", "sub"];
        if !self.issuer.is_empty() {
            v.set_issuer(&self.issuer);
            required.push("iss");
        }
        if self.audience.is_empty() {
            v.validate_aud = false;
        } else {
            v.set_audience(&self.audience);
            required.push("aud");
        }
        v.set_required_spec_claims(&required);
        let data = match jsonwebtoken::decode::<Claims>(token, key, &v) {
            Ok(d) => d,
            Err(e) => {
                tracing::debug!(error = %e, "session token rejected");
                return None;
            }
        };
        let c = data.claims;
        if !c.exp.is_finite() || c.exp < 0.0 {
            return None;
        }
        let exp = c.exp as u64;
        let nbf = c
            .nbf
            .filter(|n| n.is_finite() && *n > 0.0)
            .map(|n| n.ceil() as u64)
            .unwrap_or(0);
        if exp.saturating_add(self.leeway) < now || nbf > now.saturating_add(self.leeway) {
            tracing::debug!("session token outside its validity period");
            return None;
        }
        if !self.authorized_parties.is_empty() {
            let ok = c
                .azp
                .as_deref()
                .is_some_and(|a| self.authorized_parties.iter().any(|p| p == a));
            if !ok {
                tracing::debug!("session token from an unauthorized party");
                return None;
            }
        }
        if c.sub.is_empty() || c.sub.len() > MAX_SUB_LEN {
            return None;
        }
        let claims = Arc::new(TokenClaims::from_pairs(
            c.rest.iter().map(|(k, v)| (k.as_str(), v)),
        ));
        Some(Cached {
            sub: Arc::from(c.sub),
            claims,
            exp,
            nbf,
        })
    }
}

impl TokenVerifier for JwtVerifier {
    fn verify<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Option<String>> {
        Box::pin(self.verify_token(token))
    }

    fn verify_claims<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Option<Verified>> {
        Box::pin(self.verify_token_claims(token))
    }

    fn availability(&self) -> Availability {
        let Some(jwks) = &self.jwks else {
            return Availability::Available { last_error: None };
        };
        match jwks.health() {
            (0, error) => Availability::Unavailable {
                error: error.unwrap_or_else(|| "the key set has not been fetched yet".to_owned()),
            },
            (_, last_error) => Availability::Available { last_error },
        }
    }

    fn recover(&self) -> Option<BoxFuture<'static, ()>> {
        let jwks = self.jwks.as_ref()?;
        if jwks.health().0 > 0 {
            return None;
        }
        Some(Box::pin(jwks.clone().fetch_until_held()))
    }
}
