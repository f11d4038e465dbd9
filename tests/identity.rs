//! Verified principals end to end: the real binary, over HTTP, with a wiremock JWKS endpoint.
//!
//! The test client is one IP (127.0.0.1), so everything here happens "behind one NAT".

mod common;
mod identity_support;

use common::{upstream, Gateway, Launch};
use identity_support::*;
use serde_json::json;
use std::time::Duration;
use wiremock::MockServer;

const UI: &str = "/api/agents";
/// Exact counts over real time: a fixed window does not refill while a test runs.
const FIXED: (&str, &str) = ("FLEET_LIMITER_LIMITER_UI_ALGORITHM", "fixed-window");

/// The real binary in front of `up`, set up by these environment variables, logging at info.
fn gateway(up: &MockServer, env: &[(&str, &str)]) -> Gateway {
    Launch::serve()
        .upstream(&up.uri())
        .log("info")
        .envs(env.iter().copied())
        .spawn()
}

/// A JWKS endpoint publishing key-a, and a gateway (with these variables too) that fetches its
/// keys there, in front of `up`.
async fn with_jwks(up: &MockServer, env: &[(&str, &str)]) -> (MockServer, Gateway) {
    let jwks = MockServer::start().await;
    publish(&jwks, &["a"]).await;
    let url = format!("{}/jwks.json", jwks.uri());
    let gw = gateway(
        up,
        &[&[("FLEET_LIMITER_JWKS_URL", url.as_str())], env].concat(),
    );
    (jwks, gw)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_users_behind_one_ip_each_get_their_own_budget() {
    let up = upstream().await;
    let (jwks, gw) = with_jwks(&up, &[("FLEET_LIMITER_JWT_AUDIENCE", "dashboard"), FIXED]).await;
    let client = reqwest::Client::new();
    let alice = sign(Some("key-a"), RSA_A, &claims("user_alice"));
    let bob = sign(Some("key-a"), RSA_A, &claims("user_bob"));

    // Alice by Bearer, Bob by the default `__session` cookie: 1000 each in the 15-minute window,
    // and the verified Bearer is not metered by the 60/min `cli-bearer` limiter.
    assert_eq!(
        burst(&client, &gw.url(UI), &alice, Via::Bearer, 1000).await,
        (1000, 0)
    );
    assert_eq!(
        burst(&client, &gw.url(UI), &bob, Via::Cookie("__session"), 1000).await,
        (1000, 0)
    );
    assert_eq!(get(&client, &gw.url(UI), &alice, Via::Bearer).await, 429);
    assert_eq!(
        get(&client, &gw.url(UI), &bob, Via::Cookie("__session")).await,
        429
    );
    // The IP's own bucket was never touched by either of them.
    assert_eq!(get(&client, &gw.url(UI), "", Via::Nothing).await, 200);
    // One key-set fetch served all 2000 verifications.
    assert_eq!(jwks_hits(&jwks).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_that_do_not_verify_land_in_the_ip_bucket() {
    let up = upstream().await;
    let (_jwks, gw) = with_jwks(
        &up,
        &[
            ("FLEET_LIMITER_JWT_AUDIENCE", "dashboard"),
            ("FLEET_LIMITER_LIMITER_UI_LIMIT", "6"),
            FIXED,
        ],
    )
    .await;
    let client = reqwest::Client::new();
    let mut expired = claims("user_expired");
    expired["exp"] = json!(now() - 3600);
    let mut other_aud = claims("user_billing");
    other_aud["aud"] = json!("billing");
    let bad = [
        (
            "forged signature",
            sign(Some("key-a"), FORGER, &claims("user_forged")),
            Via::Bearer,
        ),
        ("expired", sign(Some("key-a"), RSA_A, &expired), Via::Bearer),
        ("alg none", alg_none(&claims("user_none")), Via::Bearer),
        (
            "another audience",
            sign(Some("key-a"), RSA_A, &other_aud),
            Via::Cookie("__session"),
        ),
        (
            "garbage cookie",
            "garbage.not.a-jwt".to_owned(),
            Via::Cookie("__session"),
        ),
        (
            "forged cookie",
            sign(Some("key-a"), FORGER, &claims("user_forged2")),
            Via::Cookie("__session"),
        ),
    ];
    // Six different unverified tokens, six different claimed subjects: all spend the one IP
    // bucket of six ...
    for (what, token, via) in &bad {
        assert_eq!(get(&client, &gw.url(UI), token, *via).await, 200, "{what}");
    }
    // ... which is now empty for an anonymous request too,
    assert_eq!(get(&client, &gw.url(UI), "", Via::Nothing).await, 429);
    // and each of them is refused from that same empty bucket.
    for (what, token, via) in &bad {
        assert_eq!(get(&client, &gw.url(UI), token, *via).await, 429, "{what}");
    }
    // A token that verifies has its own bucket.
    let good = sign(Some("key-a"), RSA_A, &claims("user_real"));
    assert_eq!(get(&client, &gw.url(UI), &good, Via::Bearer).await, 200);
    assert_eq!(
        get(&client, &gw.url(UI), &good, Via::Cookie("__session")).await,
        200
    );
}

/// With the IP bucket spent (ui limit 1), a request is allowed exactly when its token verifies
/// (each token here names a fresh user).
async fn verifies(client: &reqwest::Client, gw: &Gateway, token: &str) -> bool {
    match get(client, &gw.url(UI), token, Via::Bearer).await {
        200 => true,
        429 => false,
        s => panic!("unexpected status {s}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_rotation_is_picked_up_and_an_outage_keeps_the_cached_keys() {
    let up = upstream().await;
    let (jwks, gw) = with_jwks(
        &up,
        &[
            ("FLEET_LIMITER_LIMITER_UI_LIMIT", "1"),
            FIXED,
            ("FLEET_LIMITER_JWKS_REFRESH_INTERVAL", "1s"),
        ],
    )
    .await;
    let client = reqwest::Client::new();
    assert_eq!(get(&client, &gw.url(UI), "", Via::Nothing).await, 200);
    assert_eq!(get(&client, &gw.url(UI), "", Via::Nothing).await, 429);

    assert!(verifies(&client, &gw, &sign(Some("key-a"), RSA_A, &claims("u1"))).await);
    // The issuer rotates from key-a to key-b.
    publish(&jwks, &["b"]).await;
    tokio::time::sleep(Duration::from_millis(1100)).await; // past the 1 s refresh interval
    assert!(verifies(&client, &gw, &sign(Some("key-b"), RSA_B, &claims("u2"))).await);
    assert_eq!(jwks_hits(&jwks).await, 1, "one fetch for the unknown kid");
    assert!(
        !verifies(&client, &gw, &sign(Some("key-a"), RSA_A, &claims("u3"))).await,
        "key-a was withdrawn"
    );

    // The key-set endpoint goes down: key-b keeps verifying from the held keys.
    outage(&jwks).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert!(!verifies(&client, &gw, &sign(Some("key-zz"), RSA_B, &claims("u4"))).await);
    assert!(verifies(&client, &gw, &sign(Some("key-b"), RSA_B, &claims("u5"))).await);
    assert!(verifies(&client, &gw, &sign(Some("key-b"), RSA_B, &claims("u6"))).await);
    assert!(
        gw.stderr()
            .contains("JWKS fetch failed; keeping the keys already held"),
        "{}",
        gw.stderr()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_kids_do_not_multiply_fetches() {
    let up = upstream().await;
    let (jwks, gw) = with_jwks(
        &up,
        &[
            ("FLEET_LIMITER_LIMITER_UI_LIMIT", "1"),
            FIXED,
            ("FLEET_LIMITER_LIMITER_CLI_BEARER_LIMIT", "100000"),
            ("FLEET_LIMITER_JWKS_REFRESH_INTERVAL", "1h"),
        ],
    )
    .await;
    let client = reqwest::Client::new();
    assert!(verifies(&client, &gw, &sign(Some("key-a"), RSA_A, &claims("u1"))).await);
    assert_eq!(get(&client, &gw.url(UI), "", Via::Nothing).await, 200);
    use futures_util::stream::{self, StreamExt};
    let refused = stream::iter(0..300)
        .map(|i| {
            let token = sign(
                Some(&format!("random-{i}")),
                FORGER,
                &claims(&format!("m{i}")),
            );
            let client = client.clone();
            let url = gw.url(UI);
            async move { get(&client, &url, &token, Via::Bearer).await }
        })
        .buffer_unordered(16)
        .filter(|s| std::future::ready(*s == 429))
        .count()
        .await;
    assert_eq!(refused, 300);
    assert_eq!(
        jwks_hits(&jwks).await,
        1,
        "300 unknown kids, no further fetch"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hs256_secret_and_a_custom_cookie_name() {
    let up = upstream().await;
    let secret = "pZ3v8Qm1Lr6Tn0Ws4Yx7Bc2Dk9Hf5JaE";
    let gw = gateway(
        &up,
        &[
            ("FLEET_LIMITER_JWT_HS256_SECRET", secret),
            ("FLEET_LIMITER_SESSION_COOKIE", "sid"),
            ("FLEET_LIMITER_LIMITER_UI_LIMIT", "1"),
            FIXED,
        ],
    );
    let client = reqwest::Client::new();
    assert_eq!(get(&client, &gw.url(UI), "", Via::Nothing).await, 200);
    let t = |sub: &str| hs256(secret, &claims(sub));
    assert_eq!(
        get(&client, &gw.url(UI), &t("u1"), Via::Cookie("sid")).await,
        200
    );
    assert_eq!(
        get(&client, &gw.url(UI), &t("u2"), Via::Cookie("__session")).await,
        429,
        "not the configured cookie"
    );
    assert_eq!(
        get(
            &client,
            &gw.url(UI),
            &hs256("some-other-secret-of-32-bytes-or-more", &claims("u3")),
            Via::Cookie("sid")
        )
        .await,
        429
    );
    assert!(!gw.stderr().contains(secret));
}

/// `check` validates the secret as `serve` does, and says so without claiming to start anything.
#[test]
fn check_names_a_weak_hs256_secret_without_starting_anything() {
    let out = Launch::command(["check"])
        .env("FLEET_LIMITER_JWT_HS256_SECRET", "changeme")
        .run(common::PATIENCE);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(!out.stderr.contains("refusing to start"), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("identity.jwt_hs256_secret: the HS256 secret is weak"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("`serve` does not start with it"),
        "{}",
        out.stderr
    );
}

/// One character repeated is not a placeholder anyone ships: it has a reason of its own.
#[test]
fn a_repeated_character_secret_has_its_own_reason() {
    let secret = "x".repeat(48);
    let out = Launch::command(["check"])
        .env("FLEET_LIMITER_JWT_HS256_SECRET", &secret)
        .run(common::PATIENCE);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains("one character repeated"),
        "{}",
        out.stderr
    );
    assert!(!out.stderr.contains("placeholder"), "{}", out.stderr);
    assert!(!out.stderr.contains(&secret), "{}", out.stderr);
}

#[test]
fn a_weak_hs256_secret_stops_the_start() {
    for (secret, why) in [
        ("changeme", "well-known placeholder"),
        ("", "it is blank"),
        ("only-twenty-bytes-xx", "shorter than 32 bytes"),
    ] {
        let out = Launch::serve()
            .upstream("http://127.0.0.1:9")
            .log("info")
            .env("FLEET_LIMITER_JWT_HS256_SECRET", secret)
            .run(common::PATIENCE);
        let (code, stderr) = (out.code, out.stderr);
        assert_eq!(code, Some(2), "{stderr}");
        assert!(stderr.contains("configuration error"), "{stderr}");
        assert!(
            stderr.contains("environment variable FLEET_LIMITER_JWT_HS256_SECRET: identity.jwt_hs256_secret: the HS256 secret is weak"),
            "{stderr}"
        );
        assert!(stderr.contains(why), "{stderr}");
        assert!(
            stderr.contains("FLEET_LIMITER_ALLOW_WEAK_SECRET"),
            "{stderr}"
        );
        if !secret.is_empty() {
            assert!(
                !stderr.contains(secret),
                "the secret must not be echoed: {stderr}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_weak_secret_starts_with_a_warning_when_explicitly_allowed() {
    let up = upstream().await;
    for _ in 0..2 {
        let gw = gateway(
            &up,
            &[
                ("FLEET_LIMITER_JWT_HS256_SECRET", "changeme"),
                ("FLEET_LIMITER_ALLOW_WEAK_SECRET", "true"),
            ],
        );
        let client = reqwest::Client::new();
        assert_eq!(get(&client, &gw.url(UI), "", Via::Nothing).await, 200);
        let log = gw.stderr();
        assert!(
            log.contains("WARN") && log.contains("identity.jwt_hs256_secret is weak"),
            "{log}"
        );
        assert!(log.contains("never run this in production"), "{log}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_ip_ceiling_caps_rotating_agent_ids_but_not_a_full_site() {
    let up = upstream().await;
    // A site of 4 endpoints: the ceiling derives to 4 new agent ids a minute, and each agent,
    // once admitted, is known and skips it.
    let gw = gateway(
        &up,
        &[
            ("FLEET_LIMITER_MAX_SITE_ENDPOINTS", "4"),
            ("FLEET_LIMITER_LIMITER_AGENT_DEVICE_LIMIT", "3"),
            // agent-ip takes agent-device's algorithm: fixed windows keep the counts exact.
            (
                "FLEET_LIMITER_LIMITER_AGENT_DEVICE_ALGORITHM",
                "fixed-window",
            ),
        ],
    );
    let client = reqwest::Client::new();
    let post =
        |path: &str, agent: String| client.post(gw.url(path)).header("x-agent-id", agent).send();
    for agent in 0..4 {
        for _ in 0..3 {
            let r = post("/api/agent/heartbeat", format!("site-agent-{agent}"))
                .await
                .unwrap();
            assert_eq!(r.status().as_u16(), 200, "agent {agent}");
        }
    }
    // A fifth, rotated agent id from the same IP meets the ceiling.
    let r = post("/api/agent/heartbeat", "rotated-1".into())
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 429);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    assert_eq!(
        r.headers()["ratelimit-policy"],
        "\"agent-device\";q=3;w=60, \"agent-ip\";q=4;w=60"
    );
    // Without each item's partition key (its bucket's name, private to the process).
    let mut state = r.headers()["ratelimit"]
        .to_str()
        .unwrap_or_default()
        .to_owned();
    while let Some(at) = state.find(";pk=:") {
        let end = state[at + 5..]
            .find(':')
            .map_or(state.len(), |e| at + 5 + e + 1);
        state.replace_range(at..end, "");
    }
    // The fresh agent id's own bucket would allow it, and is not charged for the refused
    // request (all 3 left, its window never opened: no `t`, no more quota can come); the
    // ceiling refuses, and its `t` is the `Retry-After`.
    let retry = r.headers()["retry-after"].to_str().unwrap_or_default();
    assert!(
        state.starts_with("\"agent-device\";r=3, ")
            && state.ends_with(&format!("\"agent-ip\";r=0;t={retry}")),
        "{state} (Retry-After {retry})"
    );
    // Enrollment is a lifecycle endpoint with its own IP budget, outside the ceiling.
    let r = post("/api/agent/enroll", "rotated-2".into()).await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pem_public_key_file_needs_no_network() {
    let up = upstream().await;
    let pem = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/keys/rsa_a.pub.pem"
    );
    let gw = gateway(
        &up,
        &[
            ("FLEET_LIMITER_JWT_PUBLIC_KEY_PEM", pem),
            ("FLEET_LIMITER_JWT_ISSUER", "https://issuer.test"),
            ("FLEET_LIMITER_LIMITER_UI_LIMIT", "1"),
            FIXED,
        ],
    );
    let client = reqwest::Client::new();
    assert_eq!(get(&client, &gw.url(UI), "", Via::Nothing).await, 200);
    assert!(verifies(&client, &gw, &sign(None, RSA_A, &claims("pem_user"))).await);
    assert!(!verifies(&client, &gw, &sign(None, FORGER, &claims("pem_forged"))).await);
    let mut other = claims("pem_other_issuer");
    other["iss"] = json!("https://evil.test");
    assert!(!verifies(&client, &gw, &sign(None, RSA_A, &other)).await);
}

/// A key set's URL over plain http:// to a host that is not this one, spelled every way a
/// lenient URL parser reads as such: start-up stops with exit code 2 naming the setting that
/// would acknowledge it.
const PLAIN_HTTP_ELSEWHERE: &[&str] = &[
    "http://idp.example.com/jwks.json",
    "HTTP://IDP.EXAMPLE.COM/jwks.json",
    "Http://idp.example.com/jwks.json",
    "  http://idp.example.com/jwks.json  ",
    "http://127.0.0.1@idp.example.com/jwks.json",
    "http://127.0.0.1.@idp.example.com/jwks.json",
    "http://localhost:80@idp.example.com/jwks.json",
    "http://issuer:S3cretPw@idp.example.com/jwks.json",
    "http://localhost./jwks.json",
    "http://localhost.idp.example.com/jwks.json",
    "http://idp.localhost/jwks.json",
    "http://127.0.0.1.nip.io/jwks.json",
    "http://0.0.0.0/jwks.json",
    "http://0/jwks.json",
    "http://[::]/jwks.json",
    "http://[::ffff:10.0.0.1]/jwks.json",
    "http://[::127.0.0.1]/jwks.json",
    "http://167772161/jwks.json",
    "http://0x0a.0.0.1/jwks.json",
    "http://10.1/jwks.json",
    "http://128.0.0.1/jwks.json",
];

/// Not a URL as written (a lenient parser would have repaired each into some host): exit 2 too.
const NOT_A_URL: &[&str] = &[
    "http:///idp.example.com/jwks.json",
    "https:///idp.example.com/jwks.json",
    "http:\\\\idp.example.com\\jwks.json",
    "http:idp.example.com/jwks.json",
    "http://idp.example.com\t/jwks.json",
    "http://127.0.0.1\\@idp.example.com/jwks.json",
    "http://127.0.0.1 @idp.example.com/jwks.json",
    "http://[::1/jwks.json",
    "gopher://idp.example.com/jwks.json",
];

#[test]
fn a_plain_http_key_set_on_another_host_stops_the_start_however_it_is_spelled() {
    for url in PLAIN_HTTP_ELSEWHERE {
        let out = Launch::serve()
            .upstream("http://127.0.0.1:9")
            .env("FLEET_LIMITER_JWKS_URL", *url)
            .run(common::PATIENCE);
        assert_eq!(out.code, Some(2), "{url:?}: {}", out.stderr);
        let e = out.stderr.trim();
        assert!(
            e.starts_with(
                "fleet-limiter: configuration error: environment variable FLEET_LIMITER_JWKS_URL: identity.jwks_url: "
            ),
            "{url:?}: {e}"
        );
        assert!(
            e.contains("not a loopback address")
                && e.contains("identity.jwks_allow_http = true")
                && e.contains("FLEET_LIMITER_JWKS_ALLOW_HTTP=true"),
            "{url:?}: {e}"
        );
        assert!(!e.contains("S3cretPw"), "the password is never shown: {e}");
    }
    for url in NOT_A_URL {
        let out = Launch::serve()
            .upstream("http://127.0.0.1:9")
            .env("FLEET_LIMITER_JWKS_URL", *url)
            .run(common::PATIENCE);
        assert_eq!(out.code, Some(2), "{url:?}: {}", out.stderr);
        assert!(
            out.stderr.contains("identity.jwks_url: `")
                && out.stderr.contains("is not an http:// or https:// URL"),
            "{url:?}: {}",
            out.stderr
        );
    }
    // From a file, the message names the file; `check` refuses it the same way.
    let toml = "[identity]\njwks_url = \"http://idp.example.com/jwks.json\"\n";
    let out = Launch::command(["check"])
        .config_toml(toml)
        .run(common::PATIENCE);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("fleet-limiter.toml: identity.jwks_url: ")
            && out.stderr.contains("identity.jwks_allow_http"),
        "{}",
        out.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loopback_spellings_start_and_fetch_from_this_host() {
    let jwks = MockServer::start().await;
    publish(&jwks, &["a"]).await;
    let port = jwks.address().port();
    for host in [
        "127.1",
        "2130706433",
        "0x7f.0.0.1",
        "0177.0.0.1",
        "LOCALHOST",
        "idp.example.com@127.0.0.1",
        "[::ffff:127.0.0.1]",
    ] {
        let url = format!("HTTP://{host}:{port}/jwks.json");
        let gw = Launch::serve()
            .upstream("http://127.0.0.1:9")
            .log("info")
            .env("FLEET_LIMITER_JWKS_URL", &url)
            .spawn();
        let log = gw.stderr();
        assert!(log.contains("JWKS fetched at start"), "{url}: {log}");
        assert!(!log.contains("jwks_allow_http"), "{url}: no warning: {log}");
    }
    // Each spelling fetched from the one endpoint on this host.
    assert_eq!(jwks_hits(&jwks).await, 7);
    // Loopback names and addresses nothing listens on here: accepted all the same.
    for url in [
        "http://localhost:9/jwks.json",
        "http://[::1]:9/jwks.json",
        "http://[0:0:0:0:0:0:0:1]:9/jwks.json",
        "http://127.255.255.254:9/jwks.json",
    ] {
        let out = Launch::command(["check"])
            .env("FLEET_LIMITER_JWKS_URL", url)
            .run(common::PATIENCE);
        assert_eq!(out.code, Some(0), "{url}: {}", out.stderr);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acknowledged_plain_http_key_set_warns_at_every_start_and_reload() {
    // TEST-NET-1: never answers; the start-up fetch gives up after the timeout.
    let toml =
        "[identity]\njwks_url = \"http://192.0.2.1:9/jwks.json\"\njwks_timeout = \"200ms\"\n";
    let warning = "fetched over plain http:// from a host that is not a loopback address, because identity.jwks_allow_http is set";
    for start in 1..=2 {
        let gw = Launch::serve()
            .upstream("http://127.0.0.1:9")
            .config_toml(toml)
            .admin()
            .log("info")
            .env("FLEET_LIMITER_JWKS_ALLOW_HTTP", "true")
            .spawn();
        let log = gw.stderr();
        let line = log
            .lines()
            .find(|l| l.contains(warning))
            .unwrap_or_else(|| panic!("start {start}: no warning in:\n{log}"));
        assert!(line.contains("WARN"), "{line}");
        assert!(line.contains("http://192.0.2.1:9/jwks.json"), "{line}");
        if start == 2 {
            gw.signal("HUP");
            gw.wait_metric(r#"fleet_limiter_config_reloads_total{result="ok"}"#, |v| {
                v == 1.0
            })
            .await;
            let res = common::client()
                .post(gw.admin("/reload"))
                .send()
                .await
                .expect("POST /reload");
            assert_eq!(res.status(), 200);
            let log = gw.stderr();
            assert_eq!(
                log.matches(warning).count(),
                3,
                "at start, on SIGHUP and on POST /reload:\n{log}"
            );
        }
    }
}
