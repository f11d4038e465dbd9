//! A JSON Web Key Set fetched over HTTP: cached, refreshed on an unknown `kid` at most once per
//! refresh interval, refreshed in the background when old, and kept when the endpoint fails.
//!
//! A flood of tokens with random `kid`s costs at most one fetch per refresh interval: every
//! lookup inside the interval is answered from the keys already held. A fetch is bounded by its
//! timeout and runs once at a time; concurrent lookups wait for that one fetch, not their own.

use crate::clock::{Clock, Nanos};
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};
use parking_lot::RwLock;
use std::collections::HashMap;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Largest JWKS document accepted.
pub(crate) const MAX_JWKS_BYTES: usize = 1 << 20;

/// A public key and the algorithms it may verify.
pub(crate) struct VerifyKey {
    pub key: DecodingKey,
    pub algorithms: Vec<Algorithm>,
}

impl VerifyKey {
    /// The algorithms a key of this type can verify, narrowed to its `alg` when it names one.
    fn from_jwk(jwk: &Jwk) -> Option<Self> {
        if matches!(jwk.common.public_key_use, Some(ref u) if *u != PublicKeyUse::Signature) {
            return None;
        }
        let family: Vec<Algorithm> = match &jwk.algorithm {
            AlgorithmParameters::RSA(_) => RSA_ALGORITHMS.to_vec(),
            AlgorithmParameters::EllipticCurve(p) => match p.curve {
                EllipticCurve::P256 => vec![Algorithm::ES256],
                EllipticCurve::P384 => vec![Algorithm::ES384],
                _ => return None,
            },
            AlgorithmParameters::OctetKeyPair(p) if p.curve == EllipticCurve::Ed25519 => {
                vec![Algorithm::EdDSA]
            }
            // Symmetric keys have no place in a published key set.
            AlgorithmParameters::OctetKeyPair(_) | AlgorithmParameters::OctetKey(_) => return None,
        };
        let algorithms = match jwk.common.key_algorithm {
            Some(ka) => {
                let alg = Algorithm::from_str(&ka.to_string()).ok()?;
                if !family.contains(&alg) {
                    return None;
                }
                vec![alg]
            }
            None => family,
        };
        let key = DecodingKey::from_jwk(jwk).ok()?;
        Some(Self { key, algorithms })
    }

    /// A PEM public key: RSA, then EC, then Ed25519.
    pub(crate) fn from_pem(pem: &str) -> Option<Self> {
        let b = pem.as_bytes();
        if let Ok(key) = DecodingKey::from_rsa_pem(b) {
            return Some(Self {
                key,
                algorithms: RSA_ALGORITHMS.to_vec(),
            });
        }
        if let Ok(key) = DecodingKey::from_ec_pem(b) {
            return Some(Self {
                key,
                algorithms: vec![Algorithm::ES256, Algorithm::ES384],
            });
        }
        if let Ok(key) = DecodingKey::from_ed_pem(b) {
            return Some(Self {
                key,
                algorithms: vec![Algorithm::EdDSA],
            });
        }
        None
    }
}

pub(crate) const RSA_ALGORITHMS: &[Algorithm] = &[
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
];

/// The usable keys of one JWKS document.
#[derive(Default)]
pub(crate) struct KeySet {
    by_kid: HashMap<String, Arc<VerifyKey>>,
    /// Keys published without a `kid`: tried for tokens that carry none.
    unnamed: Vec<Arc<VerifyKey>>,
}

impl KeySet {
    /// Parse a JWKS document, skipping keys this verifier cannot use.
    pub(crate) fn parse(body: &[u8]) -> Result<Self, String> {
        #[derive(serde::Deserialize)]
        struct Doc {
            keys: Vec<serde_json::Value>,
        }
        let doc: Doc =
            serde_json::from_slice(body).map_err(|e| format!("not a JWKS document: {e}"))?;
        let mut set = KeySet::default();
        for v in doc.keys {
            let Ok(jwk) = serde_json::from_value::<Jwk>(v) else {
                continue;
            };
            let Some(key) = VerifyKey::from_jwk(&jwk) else {
                continue;
            };
            match jwk.common.key_id {
                Some(kid) => {
                    set.by_kid.insert(kid, Arc::new(key));
                }
                None => set.unnamed.push(Arc::new(key)),
            }
        }
        if set.is_empty() {
            return Err("the JWKS document holds no usable signing key".into());
        }
        Ok(set)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.by_kid.is_empty() && self.unnamed.is_empty()
    }

    pub(crate) fn len(&self) -> usize {
        self.by_kid.len() + self.unnamed.len()
    }

    /// The keys that could have signed a token with this `kid`.
    fn candidates(&self, kid: Option<&str>) -> Vec<Arc<VerifyKey>> {
        match kid {
            Some(k) => self.by_kid.get(k).cloned().into_iter().collect(),
            None => self.unnamed.clone(),
        }
    }
}

/// Counters for operators and tests.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[cfg(test)]
pub(crate) struct JwksStats {
    pub fetches: u64,
    pub failures: u64,
    pub keys: usize,
}

/// The remote key set.
pub(crate) struct Jwks {
    url: String,
    client: reqwest::Client,
    timeout: Duration,
    refresh_interval: Nanos,
    max_age: Nanos,
    clock: Arc<dyn Clock>,
    keys: RwLock<Arc<KeySet>>,
    /// Clock time of the last fetch attempt; 0 = never.
    last_attempt: AtomicU64,
    /// Clock time of the last successful fetch; 0 = never.
    fetched_at: AtomicU64,
    /// Fetch attempts so far; also tells a waiter that a fetch happened while it waited.
    attempts: AtomicU64,
    failures: AtomicU64,
    fetch_lock: tokio::sync::Mutex<()>,
    /// A background refresh is queued or running: old keys start at most one task.
    background: AtomicBool,
    /// Why the last fetch failed, until one succeeds (for `/readyz`).
    last_error: parking_lot::Mutex<Option<String>>,
}

/// The setting a JWKS problem is reported under.
pub(crate) const SERVICE: &str = "identity.jwks_url";

/// Why a fetch failed; `tls` when the server's certificate did not verify (a configuration
/// problem: the trusted roots or the URL's host are wrong, and retrying will not help).
struct FetchError {
    msg: String,
    tls: bool,
}

impl From<String> for FetchError {
    fn from(msg: String) -> Self {
        Self { msg, tls: false }
    }
}

impl Jwks {
    /// A key set fetched from `url`, with the TLS client configuration of an `https://` URL
    /// (see [`crate::tls`]); `None` trusts the system roots.
    pub(crate) fn new_with_tls(
        url: impl Into<String>,
        timeout: Duration,
        refresh_interval: Duration,
        max_age: Duration,
        clock: Arc<dyn Clock>,
        tls: Option<Arc<rustls::ClientConfig>>,
    ) -> Result<Self, super::IdentityError> {
        let url = url.into();
        let mut builder = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            // Fetches are rare and may come from any worker's runtime: no pooled connections.
            .pool_max_idle_per_host(0)
            .redirect(reqwest::redirect::Policy::none());
        if url.starts_with("https://") {
            let tls = match tls {
                Some(t) => t,
                None => crate::tls::client_config(SERVICE, None, false)?,
            };
            builder = builder.use_preconfigured_tls((*tls).clone());
        }
        let client = builder.build().map_err(|e| {
            super::IdentityError::Setting(format!("cannot build the JWKS HTTP client: {e}"))
        })?;
        Ok(Self {
            url,
            client,
            timeout,
            refresh_interval: refresh_interval.as_nanos() as Nanos,
            max_age: max_age.as_nanos() as Nanos,
            clock,
            keys: RwLock::new(Arc::new(KeySet::default())),
            last_attempt: AtomicU64::new(0),
            fetched_at: AtomicU64::new(0),
            attempts: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            fetch_lock: tokio::sync::Mutex::new(()),
            background: AtomicBool::new(false),
            last_error: parking_lot::Mutex::new(None),
        })
    }

    /// How many usable keys are held, and why the last fetch failed if it did (redacted).
    pub(crate) fn health(&self) -> (usize, Option<String>) {
        (self.keys.read().len(), self.last_error.lock().clone())
    }

    fn failed(&self, why: String) {
        self.failures.fetch_add(1, Ordering::Relaxed);
        *self.last_error.lock() = Some(why);
    }

    /// Fetch until keys are held, once per refresh interval (at least a second apart): a key set
    /// that could not be fetched at start comes back without waiting for a token to ask.
    pub(crate) async fn fetch_until_held(self: Arc<Self>) {
        let pause = Duration::from_nanos(self.refresh_interval).max(Duration::from_secs(1));
        while self.keys.read().is_empty() {
            tokio::time::sleep(pause).await;
            self.refresh().await;
        }
    }

    #[cfg(test)]
    pub(crate) fn stats(&self) -> JwksStats {
        JwksStats {
            fetches: self.attempts.load(Ordering::Relaxed),
            failures: self.failures.load(Ordering::Relaxed),
            keys: self.keys.read().len(),
        }
    }

    /// The keys that may have signed a token with this `kid`. An unknown `kid` (or no keys yet)
    /// triggers one fetch, unless one happened within the refresh interval.
    pub(crate) async fn candidates(self: &Arc<Self>, kid: Option<&str>) -> Vec<Arc<VerifyKey>> {
        let found = self.keys.read().candidates(kid);
        if !found.is_empty() {
            self.refresh_if_old();
            return found;
        }
        self.refresh().await;
        self.keys.read().candidates(kid)
    }

    /// Start a background refresh when the keys are older than the maximum age.
    fn refresh_if_old(self: &Arc<Self>) {
        let fetched = self.fetched_at.load(Ordering::Relaxed);
        let now = self.clock.now();
        if fetched == 0 || now.saturating_sub(fetched) < self.max_age || !self.may_fetch(now) {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.background.swap(true, Ordering::AcqRel) {
            return;
        }
        let me = self.clone();
        handle.spawn(async move {
            me.refresh().await;
            me.background.store(false, Ordering::Release);
        });
    }

    fn may_fetch(&self, now: Nanos) -> bool {
        let last = self.last_attempt.load(Ordering::Relaxed);
        last == 0 || now.saturating_sub(last) >= self.refresh_interval
    }

    /// Fetch the key set unless a fetch happened within the refresh interval. On any failure
    /// the keys already held stay in use.
    pub(crate) async fn refresh(&self) {
        let seen = self.attempts.load(Ordering::Acquire);
        let _one_at_a_time = self.fetch_lock.lock().await;
        if self.attempts.load(Ordering::Acquire) != seen {
            return; // a fetch finished while this caller waited
        }
        let now = self.clock.now();
        if !self.may_fetch(now) {
            return;
        }
        self.last_attempt.store(now.max(1), Ordering::Relaxed);
        let result = tokio::time::timeout(self.timeout, self.fetch()).await;
        self.attempts.fetch_add(1, Ordering::Release);
        let url = crate::redact::url(&self.url);
        match result {
            Ok(Ok(set)) => {
                let recovered = self.keys.read().is_empty() && self.last_error.lock().is_some();
                if recovered {
                    tracing::info!(keys = set.len(), url = %url, "{SERVICE}: JWKS fetched: verified identity is available again");
                } else {
                    tracing::debug!(keys = set.len(), url = %url, "JWKS fetched");
                }
                *self.keys.write() = Arc::new(set);
                *self.last_error.lock() = None;
                self.fetched_at
                    .store(self.clock.now().max(1), Ordering::Relaxed);
            }
            Ok(Err(e)) if e.tls => {
                let why = crate::redact::urls_in(&e.msg).into_owned();
                tracing::error!(url = %url, error = %why, "{SERVICE}: JWKS fetch failed: the TLS certificate does not verify; keeping the keys already held. Trust the issuer's CA with identity.jwks_ca_file");
                self.failed(why);
            }
            Ok(Err(e)) => {
                let why = crate::redact::urls_in(&e.msg).into_owned();
                tracing::warn!(url = %url, error = %why, "{SERVICE}: JWKS fetch failed; keeping the keys already held");
                self.failed(why);
            }
            Err(_) => {
                tracing::warn!(url = %url, timeout_ms = self.timeout.as_millis() as u64, "JWKS fetch timed out; keeping the keys already held");
                self.failed(format!("no answer within {:?}", self.timeout));
            }
        }
    }

    /// Fetch the key set once, now, on a thread of its own (callable with or without a
    /// runtime): the start-up fetch. A certificate that does not verify is an error naming the
    /// setting; any other failure is logged at error level (verified identity is unavailable
    /// until a fetch succeeds: [`Jwks::fetch_until_held`], or a token that needs the keys).
    pub(crate) fn check_at_start(&self) -> Result<(), super::IdentityError> {
        let result = std::thread::scope(|s| {
            s.spawn(|| {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| FetchError::from(format!("cannot start a runtime: {e}")))?;
                rt.block_on(async {
                    match tokio::time::timeout(self.timeout, self.fetch()).await {
                        Ok(r) => r,
                        Err(_) => Err(FetchError::from(format!(
                            "no answer within {:?}",
                            self.timeout
                        ))),
                    }
                })
            })
            .join()
            .unwrap_or_else(|_| Err(FetchError::from("the check stopped".to_owned())))
        });
        match result {
            Ok(set) => {
                tracing::info!(keys = set.len(), url = %crate::redact::url(&self.url), "JWKS fetched at start");
                *self.keys.write() = Arc::new(set);
                let now = self.clock.now().max(1);
                self.fetched_at.store(now, Ordering::Relaxed);
                // A fetch like any other: an unknown `kid` inside the refresh interval waits.
                self.last_attempt.store(now, Ordering::Relaxed);
                Ok(())
            }
            Err(e) if e.tls => Err(super::IdentityError::KeySet(format!(
                "{SERVICE}: `{}`: {}; trust the issuer's CA with identity.jwks_ca_file (FLEET_LIMITER_JWKS_CA_FILE), or fix the URL's host",
                crate::redact::url(&self.url),
                crate::redact::urls_in(&e.msg)
            ))),
            Err(e) => {
                let why = crate::redact::urls_in(&e.msg).into_owned();
                tracing::error!(url = %crate::redact::url(&self.url), error = %why, "{SERVICE}: the key set could not be fetched at start: verified identity is unavailable (no dashboard token verifies; their requests are keyed on the client IP) until a fetch succeeds (tried again when a token needs the keys and, under `serve`, every identity.jwks_refresh_interval); /readyz says \"identity\":\"unavailable\"");
                self.failed(why);
                Ok(())
            }
        }
    }

    async fn fetch(&self) -> Result<KeySet, FetchError> {
        let mut resp = self
            .client
            .get(&self.url)
            .header("accept", "application/json")
            .send()
            .await
            .map_err(|e| match crate::tls::certificate_problem(&e) {
                Some(why) => FetchError {
                    msg: format!("TLS: {why}"),
                    tls: true,
                },
                None => FetchError::from(format!("request failed: {e}")),
            })?;
        if !resp.status().is_success() {
            return Err(format!("answered HTTP {}", resp.status().as_u16()).into());
        }
        if resp
            .content_length()
            .is_some_and(|n| n > MAX_JWKS_BYTES as u64)
        {
            return Err(format!("document larger than {MAX_JWKS_BYTES} bytes").into());
        }
        let mut body = Vec::new();
        while let Some(chunk) = resp
            .chunk()
            .await
            .map_err(|e| format!("reading the body: {e}"))?
        {
            if body.len() + chunk.len() > MAX_JWKS_BYTES {
                return Err(format!("document larger than {MAX_JWKS_BYTES} bytes").into());
            }
            body.extend_from_slice(&chunk);
        }
        Ok(KeySet::parse(&body)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_skips_unusable_keys() {
        let doc = br#"{"keys":[
            {"kty":"oct","k":"c2VjcmV0","kid":"sym"},
            {"kty":"RSA","kid":"enc","use":"enc","n":"AQAB","e":"AQAB"},
            {"kty":"EC","crv":"P-256","kid":"ec","x":"f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU","y":"x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"},
            {"kty":"weird","kid":"w"}
        ]}"#;
        let set = KeySet::parse(doc).unwrap();
        assert_eq!(set.len(), 1);
        assert_eq!(set.candidates(Some("ec")).len(), 1);
        assert!(set.candidates(Some("sym")).is_empty());
        assert!(set.candidates(None).is_empty());
    }

    #[test]
    fn parse_refuses_empty_and_garbage() {
        assert!(KeySet::parse(br#"{"keys":[]}"#).is_err());
        assert!(KeySet::parse(b"<html>").is_err());
        assert!(KeySet::parse(br#"{"keys":[{"kty":"oct","k":"AA"}]}"#).is_err());
    }
}
