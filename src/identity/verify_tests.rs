//! The JWT verifier and the JWKS cache against a real HTTP key-set endpoint (wiremock), in
//! virtual time: the refresh interval and key age run on a `ManualClock`, token time on a
//! settable wall clock.

use super::jwt::{JwtVerifier, WallClock};
use super::TokenVerifier;
use crate::clock::ManualClock;
use crate::identity::config::IdentityConfig;
use crate::identity::secret::Secret;
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

const NOW: u64 = 1_800_000_000;

const RSA_A: &str = fixture!("rsa_a.pem");
const RSA_B: &str = fixture!("rsa_b.pem");
const FORGER: &str = fixture!("rsa_forger.pem");
const EC_A: &str = fixture!("ec_a.pem");

fn jwk(name: &str) -> Value {
    let text = match name {
        "a" => fixture!("rsa_a.jwk.json"),
        "b" => fixture!("rsa_b.jwk.json"),
        _ => fixture!("ec_a.jwk.json"),
    };
    serde_json::from_str(text).unwrap()
}

#[derive(Default)]
struct Wall(AtomicU64);

impl WallClock for Wall {
    fn unix_now(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

fn claims(sub: &str) -> Value {
    json!({"sub": sub, "iss": "https://issuer.test", "aud": "dashboard", "azp": "https://app.test",
           "exp": NOW + 600, "nbf": NOW - 10, "iat": NOW - 10})
}

fn sign(alg: Algorithm, kid: Option<&str>, pem: &str, claims: &Value) -> String {
    let mut h = Header::new(alg);
    h.kid = kid.map(str::to_owned);
    let key = match alg {
        Algorithm::ES256 => EncodingKey::from_ec_pem(pem.as_bytes()).unwrap(),
        _ => EncodingKey::from_rsa_pem(pem.as_bytes()).unwrap(),
    };
    encode(&h, claims, &key).unwrap()
}

fn rs(kid: &str, pem: &str, sub: &str) -> String {
    sign(Algorithm::RS256, Some(kid), pem, &claims(sub))
}

/// These claims signed with key-a.
fn rs_a(claims: &Value) -> String {
    sign(Algorithm::RS256, Some("key-a"), RSA_A, claims)
}

/// Mallory's claims with `field` set to `value`, signed with key-a.
fn mallory_with(field: &str, value: Value) -> String {
    let mut c = claims("mallory");
    c[field] = value;
    rs_a(&c)
}

/// Mallory's claims without `field`, signed with key-a.
fn mallory_without(field: &str) -> String {
    let mut c = claims("mallory");
    c.as_object_mut().unwrap().remove(field);
    rs_a(&c)
}

/// A verifier for `cfg` on a fixed clock, at wall time `NOW`.
fn at_now(cfg: &IdentityConfig) -> JwtVerifier {
    JwtVerifier::from_config(
        cfg,
        Arc::new(ManualClock::new(1)),
        Arc::new(Wall(AtomicU64::new(NOW))),
    )
    .unwrap()
    .unwrap()
}

struct Rig {
    server: MockServer,
    clock: ManualClock,
    wall: Arc<Wall>,
    verifier: JwtVerifier,
}

impl Rig {
    async fn new(keys: &[&str], tweak: impl FnOnce(&mut IdentityConfig)) -> Self {
        let server = MockServer::start().await;
        serve(&server, keys).await;
        let mut cfg = IdentityConfig {
            jwks_url: Some(format!("{}/jwks.json", server.uri())),
            jwt_issuer: vec!["https://issuer.test".into()],
            jwt_audience: vec!["dashboard".into()],
            authorized_parties: vec!["https://app.test".into()],
            ..IdentityConfig::default()
        };
        tweak(&mut cfg);
        let clock = ManualClock::new(1_000_000_000);
        let wall = Arc::new(Wall(AtomicU64::new(NOW)));
        let verifier = JwtVerifier::from_config(&cfg, Arc::new(clock.clone()), wall.clone())
            .unwrap()
            .unwrap();
        Self {
            server,
            clock,
            wall,
            verifier,
        }
    }

    async fn fetches(&self) -> usize {
        self.server
            .received_requests()
            .await
            .map(|r| r.len())
            .unwrap_or(0)
    }

    async fn verify(&self, token: &str) -> Option<String> {
        self.verifier.verify(token).await
    }
}

async fn serve(server: &MockServer, keys: &[&str]) {
    let doc = json!({"keys": keys.iter().map(|k| jwk(k)).collect::<Vec<_>>()});
    Mock::given(method("GET"))
        .and(path("/jwks.json"))
        .respond_with(ResponseTemplate::new(200).set_body_json(doc))
        .mount(server)
        .await;
}

async fn fail(server: &MockServer) {
    server.reset().await;
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(503))
        .mount(server)
        .await;
}

#[tokio::test]
async fn valid_tokens_verify_and_are_cached_by_digest() {
    let rig = Rig::new(&["a", "ec"], |_| {}).await;
    let t = rs("key-a", RSA_A, "user_1");
    assert_eq!(rig.verify(&t).await.as_deref(), Some("user_1"));
    assert_eq!(rig.fetches().await, 1);
    assert_eq!(rig.verifier.cache().len(), 1);
    // Served from the cache: the key-set endpoint going away changes nothing.
    fail(&rig.server).await;
    assert_eq!(rig.verify(&t).await.as_deref(), Some("user_1"));
    let ec = sign(Algorithm::ES256, Some("key-ec"), EC_A, &claims("user_ec"));
    assert_eq!(rig.verify(&ec).await.as_deref(), Some("user_ec"));
    assert_eq!(rig.verifier.cache().len(), 2);
}

#[tokio::test]
async fn bad_tokens_do_not_verify() {
    let rig = Rig::new(&["a"], |_| {}).await;
    let cases: Vec<(&str, String)> = vec![
        ("forged signature", rs("key-a", FORGER, "mallory")),
        ("expired", mallory_with("exp", json!(NOW - 6))),
        ("not yet valid", mallory_with("nbf", json!(NOW + 60))),
        ("other audience", mallory_with("aud", json!("billing"))),
        ("no audience", mallory_without("aud")),
        (
            "other issuer",
            mallory_with("iss", json!("https://evil.test")),
        ),
        (
            "unauthorized party",
            mallory_with("azp", json!("https://evil.test")),
        ),
        ("no authorized party", mallory_without("azp")),
        ("no exp", mallory_without("exp")),
        ("empty sub", rs("key-a", RSA_A, "")),
        ("alg none", unsigned("none")),
        ("alg None", unsigned("None")),
        ("HS256 signed with the public key", {
            let mut h = Header::new(Algorithm::HS256);
            h.kid = Some("key-a".into());
            let secret = fixture!("rsa_a.pub.pem").as_bytes();
            encode(&h, &claims("mallory"), &EncodingKey::from_secret(secret)).unwrap()
        }),
        ("garbage", "not-a-jwt".into()),
        ("three dots of garbage", "a.b.c".into()),
        ("oversized", "x".repeat(20_000)),
    ];
    for (what, token) in cases {
        assert_eq!(rig.verify(&token).await, None, "{what} must not verify");
    }
    assert!(rig.verifier.cache().is_empty());
}

fn unsigned(alg: &str) -> String {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let h = b64.encode(format!(r#"{{"alg":"{alg}","typ":"JWT","kid":"key-a"}}"#));
    let p = b64.encode(claims("mallory").to_string());
    format!("{h}.{p}.")
}

#[tokio::test]
async fn leeway_covers_small_clock_skew_only() {
    let rig = Rig::new(&["a"], |c| c.leeway = Duration::from_secs(5)).await;
    let mut c = claims("u");
    c["exp"] = json!(NOW - 4);
    assert!(rig.verify(&rs_a(&c)).await.is_some());
    c["exp"] = json!(NOW + 600);
    c["nbf"] = json!(NOW + 4);
    assert!(rig.verify(&rs_a(&c)).await.is_some());
    c["nbf"] = json!(NOW + 6);
    assert!(rig.verify(&rs_a(&c)).await.is_none());
}

#[tokio::test]
async fn a_cached_token_expires_with_its_exp() {
    let rig = Rig::new(&["a"], |_| {}).await;
    let t = rs("key-a", RSA_A, "u");
    assert!(rig.verify(&t).await.is_some());
    rig.wall.0.store(NOW + 600 + 5, Ordering::Relaxed);
    assert!(rig.verify(&t).await.is_some(), "inside the leeway");
    rig.wall.0.store(NOW + 600 + 6, Ordering::Relaxed);
    assert!(rig.verify(&t).await.is_none());
    assert!(rig.verifier.cache().is_empty());
}

#[tokio::test]
async fn the_cache_is_bounded() {
    let rig = Rig::new(&["a"], |c| c.cache_max_entries = 3).await;
    for i in 0..10 {
        assert!(rig
            .verify(&rs("key-a", RSA_A, &format!("u{i}")))
            .await
            .is_some());
    }
    assert_eq!(rig.verifier.cache().len(), 3);
}

#[tokio::test]
async fn key_rotation_is_picked_up_after_the_refresh_interval() {
    let rig = Rig::new(&["a"], |c| {
        c.jwks_refresh_interval = Duration::from_secs(30)
    })
    .await;
    assert!(rig.verify(&rs("key-a", RSA_A, "u")).await.is_some());
    assert_eq!(rig.fetches().await, 1);
    // The issuer rotates to key-b.
    rig.server.reset().await;
    serve(&rig.server, &["b"]).await;
    let tb = rs("key-b", RSA_B, "u");
    // Inside the refresh interval an unknown kid fails without a fetch.
    rig.clock.advance(Duration::from_secs(29));
    assert_eq!(rig.verify(&tb).await, None);
    assert_eq!(rig.fetches().await, 0);
    rig.clock.advance(Duration::from_secs(1));
    assert_eq!(rig.verify(&tb).await.as_deref(), Some("u"));
    assert_eq!(rig.fetches().await, 1);
    // key-a is gone from the new set.
    assert_eq!(rig.verify(&rs("key-a", RSA_A, "v")).await, None);
}

#[tokio::test]
async fn an_outage_keeps_the_last_good_keys() {
    let rig = Rig::new(&["a"], |c| {
        c.jwks_refresh_interval = Duration::from_secs(30);
        c.jwks_max_age = Duration::from_secs(600);
    })
    .await;
    assert!(rig.verify(&rs("key-a", RSA_A, "u1")).await.is_some());
    fail(&rig.server).await;
    // An unknown kid tries a refresh, which fails; the known key still verifies.
    rig.clock.advance(Duration::from_secs(31));
    assert_eq!(rig.verify(&rs("key-zz", RSA_A, "u2")).await, None);
    assert_eq!(rig.fetches().await, 1);
    assert!(rig.verify(&rs("key-a", RSA_A, "u3")).await.is_some());
    // Keys past their maximum age are refreshed in the background; the refresh fails and
    // verification goes on with what is held.
    rig.clock.advance(Duration::from_secs(700));
    assert!(rig.verify(&rs("key-a", RSA_A, "u4")).await.is_some());
    for _ in 0..50 {
        if rig.verifier.jwks().unwrap().stats().failures >= 2 {
            break;
        }
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stats = rig.verifier.jwks().unwrap().stats();
    assert_eq!((stats.failures, stats.keys), (2, 1));
    assert!(rig.verify(&rs("key-a", RSA_A, "u5")).await.is_some());
}

#[tokio::test]
async fn random_kids_do_not_multiply_fetches() {
    let rig = Rig::new(&["a"], |c| {
        c.jwks_refresh_interval = Duration::from_secs(30)
    })
    .await;
    assert!(rig.verify(&rs("key-a", RSA_A, "u")).await.is_some());
    let forged: Vec<String> = (0..200)
        .map(|i| rs(&format!("kid-{i}"), FORGER, "m"))
        .collect();
    for t in &forged {
        assert_eq!(rig.verify(t).await, None);
    }
    assert_eq!(
        rig.fetches().await,
        1,
        "inside the interval no kid causes a fetch"
    );
    // After the interval, a burst of concurrent unknown kids causes exactly one fetch.
    rig.clock.advance(Duration::from_secs(30));
    let all = futures_util::future::join_all(forged.iter().map(|t| rig.verify(t))).await;
    assert!(all.iter().all(Option::is_none));
    assert_eq!(rig.fetches().await, 2);
}

#[tokio::test]
async fn concurrent_first_requests_share_one_fetch() {
    let rig = Rig::new(&["a"], |_| {}).await;
    let tokens: Vec<String> = (0..40)
        .map(|i| rs("key-a", RSA_A, &format!("u{i}")))
        .collect();
    let all = futures_util::future::join_all(tokens.iter().map(|t| rig.verify(t))).await;
    assert!(all.iter().all(Option::is_some));
    assert_eq!(rig.fetches().await, 1);
}

#[tokio::test]
async fn a_slow_key_set_endpoint_is_bounded_by_the_timeout() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(200).set_delay(Duration::from_secs(3600)))
        .mount(&server)
        .await;
    let cfg = IdentityConfig {
        jwks_url: Some(format!("{}/jwks.json", server.uri())),
        jwks_timeout: Duration::from_millis(200),
        ..IdentityConfig::default()
    };
    let v = at_now(&cfg);
    // The endpoint would answer after an hour; the fetch gives up at its timeout instead.
    let token = rs("key-a", RSA_A, "u");
    let verdict = tokio::time::timeout(Duration::from_secs(600), v.verify(&token)).await;
    assert_eq!(verdict, Ok(None));
    assert_eq!(v.jwks().unwrap().stats().failures, 1);
}

#[tokio::test]
async fn pem_key_and_hs256_secret() {
    let secret = "k3Jx9v2mQp7LwZ4tR8nB1cY6hF0sD5gA";
    let cfg = IdentityConfig {
        jwt_public_key_pem: Some(fixture!("rsa_a.pub.pem").to_owned()),
        jwt_hs256_secret: Some(Secret::new(secret)),
        ..IdentityConfig::default()
    };
    let v = at_now(&cfg);
    // No kid needed with a single PEM key; audience not configured, so a token's aud is fine.
    let t = sign(Algorithm::RS256, None, RSA_A, &claims("pem_user"));
    assert_eq!(v.verify(&t).await.as_deref(), Some("pem_user"));
    assert_eq!(
        v.verify(&sign(Algorithm::RS256, None, FORGER, &claims("m")))
            .await,
        None
    );
    let hs = |alg, key: &str| {
        encode(
            &Header::new(alg),
            &claims("hs_user"),
            &EncodingKey::from_secret(key.as_bytes()),
        )
        .unwrap()
    };
    assert_eq!(
        v.verify(&hs(Algorithm::HS256, secret)).await.as_deref(),
        Some("hs_user")
    );
    assert_eq!(
        v.verify(&hs(Algorithm::HS256, "another-secret-of-enough-length-xx"))
            .await,
        None
    );
    assert_eq!(v.verify(&hs(Algorithm::HS512, secret)).await, None);
}

#[tokio::test]
async fn ec_pem_key() {
    let cfg = IdentityConfig {
        jwt_public_key_pem: Some(fixture!("ec_a.pub.pem").to_owned()),
        ..IdentityConfig::default()
    };
    let v = at_now(&cfg);
    let t = sign(Algorithm::ES256, None, EC_A, &claims("ec_user"));
    assert_eq!(v.verify(&t).await.as_deref(), Some("ec_user"));
    // An RS256 token cannot use an EC key.
    assert_eq!(
        v.verify(&sign(Algorithm::RS256, None, RSA_A, &claims("m")))
            .await,
        None
    );
}

#[test]
fn nothing_configured_builds_no_verifier() {
    let v = JwtVerifier::from_config(
        &IdentityConfig::default(),
        Arc::new(ManualClock::new(1)),
        Arc::new(Wall::default()),
    )
    .unwrap();
    assert!(v.is_none());
}
