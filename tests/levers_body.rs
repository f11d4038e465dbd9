//! The levers name `body:` keys, against the real binary: a lock a stranger's wrong answers set
//! on an account (`key = "body:email+ip"`) is shown by `explain` and lifted by `reset` with the
//! account's address in `"body"` (`--body email=…` on the command line), spelled as the client
//! spelled it; an override matches a body value exactly; and the levers' hostile inputs (bad
//! body values, a 10 KB override id, a missing token) are refused saying how to pass.

mod common;

use common::{Gateway, Launch};
use std::time::Duration;
use wiremock::matchers::path;
use wiremock::{Mock, MockServer, ResponseTemplate};

const TOKEN: &str = "5d41402abc4b2a76b9719d911017c592a8f3c9e1b2d4f6a8c0e2b4d6f8a0c2e4";

/// Five wrong answers per account and address, then a ten-minute lock; a ceiling per account.
const LOGIN: &str = "[client_ip]\ntrust_proxy = [\"127.0.0.1/32\"]\n\
[limiters.credential-source]\nlimit = 300\nwindow = \"1h\"\nkey = \"ip\"\nroutes = [\"POST /auth/login\"]\n\
[limiters.login-account]\nlimit = 5\nwindow = \"10m\"\nkey = \"body:email+ip\"\nroutes = [\"POST /auth/login\"]\ncount = \"failed\"\nfailed_statuses = [\"400-499\"]\nlockout = \"10m\"\n\
[limiters.login-account-ceiling]\nlimit = 50\nwindow = \"1h\"\nkey = \"body:email\"\ngroup = \"login-account-ceiling\"\nroutes = [\"POST /auth/login\"]\ncount = \"failed\"\nfailed_statuses = [\"400-499\"]\n";

async fn login_upstream() -> MockServer {
    let upstream = common::upstream().await;
    Mock::given(path("/auth/login"))
        .respond_with(ResponseTemplate::new(401))
        .with_priority(1)
        .mount(&upstream)
        .await;
    upstream
}

/// The gateway in front of `upstream` with the login ceilings and the admin token.
fn login_gateway(upstream: &MockServer) -> Gateway {
    Launch::serve()
        .config_toml(LOGIN)
        .upstream(&upstream.uri())
        .env("FLEET_LIMITER_ADMIN_TOKEN", TOKEN)
        .admin()
        .spawn()
}

async fn guess(gw: &Gateway, from: &str, email: &str) -> u16 {
    common::client()
        .post(gw.url("/auth/login"))
        .header("x-forwarded-for", from)
        .header("content-type", "application/json")
        .body(format!(r#"{{"email":"{email}","password":"guess"}}"#))
        .send()
        .await
        .expect("request")
        .status()
        .as_u16()
}

fn cli(gw: &Gateway, args: &[&str]) -> common::Exited {
    let admin = gw.admin("");
    let mut all = vec![args[0], "--admin", admin.trim_end_matches('/')];
    all.extend_from_slice(&args[1..]);
    Launch::command(all)
        .env("FLEET_LIMITER_ADMIN_TOKEN", TOKEN)
        .run(Duration::from_secs(60))
}

async fn lever(gw: &Gateway, p: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
    let res = common::client()
        .post(gw.admin(p))
        .bearer_auth(TOKEN)
        .json(&body)
        .send()
        .await
        .expect("lever");
    let status = res.status().as_u16();
    (status, res.json().await.unwrap_or_default())
}

#[tokio::test]
async fn explain_shows_and_reset_lifts_a_lock_on_an_account_for_one_address() {
    let upstream = login_upstream().await;
    let gw = login_gateway(&upstream);
    let stranger = "203.0.113.66";
    for _ in 0..5 {
        assert_eq!(guess(&gw, stranger, "ceo@example.com").await, 401);
    }
    assert_eq!(guess(&gw, stranger, "ceo@example.com").await, 429, "locked");
    // explain: the lock, on the account and this address.
    let (status, seen) = lever(
        &gw,
        "/explain",
        serde_json::json!({"method": "POST", "path": "/auth/login", "ip": stranger, "body": {"email": " CEO@Example.com "}}),
    )
    .await;
    assert_eq!(status, 200, "{seen}");
    let lock = seen["limiters"]
        .as_array()
        .and_then(|ls| ls.iter().find(|l| l["limiter"] == "login-account"))
        .cloned()
        .unwrap_or_else(|| panic!("{seen}"));
    assert_eq!(lock["allowed"], false, "{lock}");
    assert_eq!(
        lock["key"],
        format!("body email: ceo@example.com + ip {stranger}"),
        "{lock}"
    );
    assert!(
        lock["retry_after_seconds"]
            .as_u64()
            .is_some_and(|s| s > 500),
        "{lock}"
    );
    // Without the body the lever names another bucket: the address's own.
    let (_, bare) = lever(
        &gw,
        "/explain",
        serde_json::json!({"method": "POST", "path": "/auth/login", "ip": stranger}),
    )
    .await;
    assert!(
        bare["limiters"].to_string().contains("no body field email"),
        "{bare}"
    );
    // reset from the command line, the account spelled another way.
    let out = cli(
        &gw,
        &[
            "reset",
            "--limiter",
            "login-account",
            "--ip",
            stranger,
            "--body",
            "email=ceo+x@EXAMPLE.com",
        ],
    );
    assert_eq!(out.code, Some(0), "{}\n{}", out.stdout, out.stderr);
    let answer: serde_json::Value = serde_json::from_str(&out.stdout).expect("json");
    assert_eq!(answer["reset"], true, "{answer}");
    assert_eq!(
        guess(&gw, stranger, "ceo@example.com").await,
        401,
        "the lock is lifted"
    );
    // Hostile body values: refused naming the field.
    for body in [
        serde_json::json!({"email": ["ceo@example.com"]}),
        serde_json::json!({"email": null}),
        serde_json::json!({"email": 1.5}),
        serde_json::json!({"email": "a@x.test,b@y.test"}),
        serde_json::json!({"email": ""}),
        serde_json::json!({"e mail": "ceo@example.com"}),
        serde_json::json!({"email": "x".repeat(300)}),
        serde_json::Value::Object((0..9).map(|i| (format!("f{i}"), "v".into())).collect()),
    ] {
        let (status, problem) = lever(
            &gw,
            "/reset",
            serde_json::json!({"limiter": "login-account", "ip": stranger, "body": body}),
        )
        .await;
        assert_eq!(status, 400, "{body}: {problem}");
        assert_eq!(problem["field"], "body", "{problem}");
    }
}

#[tokio::test]
async fn an_override_matches_a_body_value_exactly_and_ids_are_not_echoed() {
    let upstream = login_upstream().await;
    let gw = login_gateway(&upstream);
    // One account gets a larger lock budget: 8 wrong answers, from any one address.
    let out = cli(
        &gw,
        &[
            "override",
            "add",
            "--limiter",
            "login-account",
            "--match",
            "body:email=QA-Bot@Example.com",
            "--limit",
            "8",
            "--window",
            "10m",
        ],
    );
    assert_eq!(out.code, Some(0), "{}\n{}", out.stdout, out.stderr);
    let added: serde_json::Value = serde_json::from_str(&out.stdout).expect("json");
    let shown = added["match"].as_str().unwrap_or_default().to_owned();
    assert!(
        shown.starts_with("body:email=sha256:"),
        "held as a digest: {added}"
    );
    assert!(
        !out.stdout.to_lowercase().contains("qa-bot"),
        "{}",
        out.stdout
    );
    let mut statuses = Vec::new();
    for _ in 0..9 {
        statuses.push(guess(&gw, "198.51.100.9", "qa-bot@example.com").await);
    }
    assert_eq!(statuses, [401, 401, 401, 401, 401, 401, 401, 401, 429]);
    // Another account keeps the limiter's own five.
    let mut statuses = Vec::new();
    for _ in 0..6 {
        statuses.push(guess(&gw, "198.51.100.9", "other@example.com").await);
    }
    assert_eq!(statuses, [401, 401, 401, 401, 401, 429]);
    for bad in [
        "body:email=qa*",
        "body:email=a@x,b@y",
        "body:e mail=x",
        "body:email",
    ] {
        let out = cli(
            &gw,
            &[
                "override",
                "add",
                "--limiter",
                "login-account",
                "--match",
                bad,
                "--limit",
                "8",
                "--window",
                "10m",
            ],
        );
        assert_eq!(out.code, Some(1), "{bad}: {}", out.stdout);
    }
    // A 10 KB id is refused without being echoed.
    let id = "a".repeat(10 * 1024);
    let res = common::client()
        .delete(gw.admin(&format!("/overrides/{id}")))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("delete");
    let status = res.status().as_u16();
    let text = res.text().await.unwrap_or_default();
    assert!(matches!(status, 400 | 404 | 414 | 431), "{status}");
    assert!(
        text.len() < 1024,
        "the id is not echoed: {} bytes",
        text.len()
    );
}

#[test]
fn a_refused_lever_says_how_to_pass_the_token() {
    let gw = Launch::serve()
        .upstream("http://127.0.0.1:9")
        .env("FLEET_LIMITER_ADMIN_TOKEN", TOKEN)
        .admin()
        .spawn();
    let admin = gw.admin("");
    let out = Launch::command(["override", "--admin", admin.trim_end_matches('/'), "list"])
        .unset("FLEET_LIMITER_ADMIN_TOKEN")
        .run(Duration::from_secs(60));
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("401"), "{}", out.stderr);
    assert!(out.stderr.contains("--token"), "{}", out.stderr);
    assert!(
        out.stderr.contains("FLEET_LIMITER_ADMIN_TOKEN"),
        "{}",
        out.stderr
    );
    let out = Launch::command([
        "override",
        "--admin",
        admin.trim_end_matches('/'),
        "--token",
        "wrong-token-wrong-token-wrong-token-0",
        "list",
    ])
    .unset("FLEET_LIMITER_ADMIN_TOKEN")
    .run(Duration::from_secs(60));
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains("not this instance's ops.admin_token"),
        "{}",
        out.stderr
    );
}
