//! For the identity tests: test-key token minting, a JWKS endpoint, and requests presenting a
//! token (the binary itself runs through `tests/common`).

#![allow(dead_code)]

#[macro_use]
#[path = "../support/macros.rs"]
mod macros;

use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::{json, Value};
use std::time::{SystemTime, UNIX_EPOCH};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

pub const RSA_A: &str = fixture!("rsa_a.pem");
pub const RSA_B: &str = fixture!("rsa_b.pem");
pub const FORGER: &str = fixture!("rsa_forger.pem");

pub fn jwk(name: &str) -> Value {
    let text = match name {
        "a" => fixture!("rsa_a.jwk.json"),
        _ => fixture!("rsa_b.jwk.json"),
    };
    serde_json::from_str(text).expect("fixture JWK")
}

pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs()
}

pub fn claims(sub: &str) -> Value {
    let now = now();
    json!({"sub": sub, "iss": "https://issuer.test", "aud": "dashboard",
           "exp": now + 3600, "nbf": now - 5, "iat": now - 5})
}

pub fn sign(kid: Option<&str>, pem: &str, claims: &Value) -> String {
    let mut h = Header::new(Algorithm::RS256);
    h.kid = kid.map(str::to_owned);
    encode(
        &h,
        claims,
        &EncodingKey::from_rsa_pem(pem.as_bytes()).expect("fixture key"),
    )
    .expect("sign")
}

pub fn hs256(secret: &str, claims: &Value) -> String {
    encode(
        &Header::new(Algorithm::HS256),
        claims,
        &EncodingKey::from_secret(secret.as_bytes()),
    )
    .expect("sign")
}

/// A token whose header says `alg: none`, with no signature.
pub fn alg_none(claims: &Value) -> String {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let h = b64.encode(r#"{"alg":"none","typ":"JWT","kid":"key-a"}"#);
    format!("{h}.{}.", b64.encode(claims.to_string()))
}

/// A JWKS endpoint at `/jwks.json` publishing these fixture keys.
pub async fn publish(server: &MockServer, keys: &[&str]) {
    server.reset().await;
    let doc = json!({"keys": keys.iter().map(|k| jwk(k)).collect::<Vec<_>>()});
    Mock::given(method("GET"))
        .and(path("/jwks.json"))
        .respond_with(ResponseTemplate::new(200).set_body_json(doc))
        .mount(server)
        .await;
}

/// The JWKS endpoint failing.
pub async fn outage(server: &MockServer) {
    server.reset().await;
    Mock::given(wiremock::matchers::any())
        .respond_with(ResponseTemplate::new(503))
        .mount(server)
        .await;
}

pub async fn jwks_hits(server: &MockServer) -> usize {
    server
        .received_requests()
        .await
        .map(|r| r.iter().filter(|r| r.url.path() == "/jwks.json").count())
        .unwrap_or(0)
}

/// How a request presents its session token.
#[derive(Clone, Copy, Debug)]
pub enum Via {
    Nothing,
    Bearer,
    Cookie(&'static str),
}

pub async fn get(client: &reqwest::Client, url: &str, token: &str, via: Via) -> u16 {
    let mut rb = client.get(url);
    match via {
        Via::Nothing => {}
        Via::Bearer => rb = rb.header("authorization", format!("Bearer {token}")),
        Via::Cookie(name) => rb = rb.header("cookie", format!("theme=dark; {name}={token}")),
    }
    rb.send()
        .await
        .expect("request to the gateway")
        .status()
        .as_u16()
}

/// Send `n` requests with up to 16 in flight; count the answers by status.
pub async fn burst(
    client: &reqwest::Client,
    url: &str,
    token: &str,
    via: Via,
    n: usize,
) -> (usize, usize) {
    use futures_util::stream::{self, StreamExt};
    let statuses: Vec<u16> = stream::iter(0..n)
        .map(|_| get(client, url, token, via))
        .buffer_unordered(16)
        .collect()
        .await;
    let ok = statuses.iter().filter(|s| **s == 200).count();
    let limited = statuses.iter().filter(|s| **s == 429).count();
    assert_eq!(ok + limited, n, "only 200 and 429 expected: {statuses:?}");
    (ok, limited)
}
