//! Keys that once let a spent budget through, against the real binary: Gmail's dot spellings
//! and `googlemail.com` reach the spent inbox's 429; a second `X-API-Key` beside a spent one
//! is refused (400), never served on the address's bucket; and a verified token's `sub`
//! holding a right-to-left override or a zero-width space is shown escaped by `top` and the
//! `/top` endpoint, never printed raw.

mod common;
mod identity_support;

use common::Launch;
use std::time::Duration;

/// Three mails an hour per inbox on `POST /auth/forgot-password`, many per address (the test
/// is the trusted proxy); five requests an hour per API key on `/api/export`.
const CONFIG: &str = "[client_ip]\ntrust_proxy = [\"127.0.0.1/32\"]\n\
[limiters.src]\nlimit = 1000\nwindow = \"1h\"\nkey = \"ip\"\nroutes = [\"POST /auth/forgot-password\"]\ndisclose = false\n\
[limiters.dst]\nlimit = 3\nwindow = \"1h\"\nkey = \"body:email\"\nroutes = [\"POST /auth/forgot-password\"]\ndisclose = false\n\
[limiters.keys]\nlimit = 2\nwindow = \"1h\"\nkey = \"client-header:x-api-key\"\nroutes = [\"GET /api/export\"]\n\
[limiters.keys-ip]\nlimit = 1000\nwindow = \"1h\"\nkey = \"ip\"\nroutes = [\"GET /api/export\"]\ngroup = \"keys-ip\"\n";

#[tokio::test]
async fn gmail_spellings_meet_the_spent_inboxs_429() {
    let upstream = common::upstream().await;
    let gw = Launch::serve()
        .config_toml(CONFIG)
        .upstream(&upstream.uri())
        .spawn();
    let client = common::client();
    let send = |email: &str, from: &str| {
        client
            .post(gw.url("/auth/forgot-password"))
            .header("x-forwarded-for", from)
            .header("content-type", "application/json")
            .body(format!(r#"{{"email":"{email}"}}"#))
            .send()
    };
    for i in 0..3 {
        let r = send("victim@gmail.com", &format!("192.0.2.{i}"))
            .await
            .expect("sent");
        assert_eq!(r.status(), 200);
    }
    let mut served = Vec::new();
    for (i, spelling) in [
        "v.i.c.t.i.m@gmail.com",
        "vic.tim@gmail.com",
        "V.ICTIM+reset@GMAIL.com",
        "victim@googlemail.com",
        "v.i.c.t.i.m@googlemail.com",
        "Victim+x@GoogleMail.com.",
    ]
    .iter()
    .enumerate()
    {
        let status = send(spelling, &format!("198.51.100.{i}"))
            .await
            .expect("sent")
            .status()
            .as_u16();
        if status != 429 {
            served.push((*spelling, status));
        }
    }
    assert!(served.is_empty(), "served past the spent inbox: {served:?}");
    assert_eq!(common::received(&upstream).await, 3, "only the first three");
    // Another inbox still has its budget.
    let r = send("other.person@gmail.com", "192.0.2.9")
        .await
        .expect("sent");
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn a_second_api_key_beside_a_spent_one_is_refused_not_served() {
    let upstream = common::upstream().await;
    let gw = Launch::serve()
        .config_toml(CONFIG)
        .upstream(&upstream.uri())
        .spawn();
    let addr = gw
        .url("")
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .parse()
        .expect("address");
    let once =
        b"GET /api/export HTTP/1.1\r\nHost: x\r\nX-API-Key: spent-key\r\nConnection: close\r\n\r\n";
    let statuses: Vec<u16> = (0..3)
        .map(|_| common::raw_request(addr, once).status)
        .collect();
    assert_eq!(statuses, [200, 200, 429], "the key's budget spent");
    let before = common::received(&upstream).await;
    for request in [
        &b"GET /api/export HTTP/1.1\r\nHost: x\r\nX-API-Key: spent-key\r\nX-API-Key: fresh\r\nConnection: close\r\n\r\n"[..],
        b"GET /api/export HTTP/1.1\r\nHost: x\r\nX-API-Key: fresh\r\nX-API-Key: spent-key\r\nConnection: close\r\n\r\n",
        b"GET /api/export HTTP/1.1\r\nHost: x\r\nx-api-key: spent-key\r\nX-Api-Key: spent-key\r\nConnection: close\r\n\r\n",
    ] {
        let r = common::raw_request(addr, request);
        assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.body));
        assert!(
            String::from_utf8_lossy(&r.body).contains("x-api-key"),
            "{}",
            String::from_utf8_lossy(&r.body)
        );
    }
    assert_eq!(
        common::received(&upstream).await,
        before,
        "none reached the upstream"
    );
    // One fresh key, sent once, is served.
    let fresh =
        b"GET /api/export HTTP/1.1\r\nHost: x\r\nX-API-Key: fresh\r\nConnection: close\r\n\r\n";
    assert_eq!(common::raw_request(addr, fresh).status, 200);
}

#[tokio::test]
async fn top_shows_direction_controls_and_zero_width_characters_in_a_sub_escaped() {
    let upstream = common::upstream().await;
    let secret = "pZ3v8Qm1Lr6Tn0Ws4Yx7Bc2Dk9Hf5JaE";
    let gw = Launch::serve()
        .config_toml(
            "[limiters.users]\nlimit = 1\nwindow = \"1h\"\nkey = \"user-or-ip\"\nroutes = [\"GET /api/me\"]\n",
        )
        .env("FLEET_LIMITER_JWT_HS256_SECRET", secret)
        .upstream(&upstream.uri())
        .admin()
        .spawn();
    let sub = "evil\u{202e}nimda\u{200b}\u{2066}x";
    let token = identity_support::hs256(secret, &identity_support::claims(sub));
    let client = common::client();
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let r = client
            .get(gw.url("/api/me"))
            .bearer_auth(&token)
            .send()
            .await
            .expect("sent");
        statuses.push(r.status().as_u16());
    }
    assert_eq!(statuses, [200, 429, 429]);
    let escaped = "evil\\u{202e}nimda\\u{200b}\\u{2066}x";
    let v: serde_json::Value = client
        .get(gw.admin("/top?limiter=users"))
        .send()
        .await
        .expect("top")
        .json()
        .await
        .expect("json");
    let principal = v["limiters"][0]["refused"][0]["principal"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(principal.contains(escaped), "{v}");
    let admin = gw.admin("");
    let out = Launch::command([
        "top",
        "--admin",
        admin.trim_end_matches('/'),
        "--once",
        "--limiter",
        "users",
    ])
    .run(Duration::from_secs(60));
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(out.stdout.contains(escaped), "{}", out.stdout);
    for c in ['\u{202e}', '\u{200b}', '\u{2066}'] {
        assert!(!out.stdout.contains(c), "{c:?} printed raw: {}", out.stdout);
        assert!(!principal.contains(c), "{c:?} in /top: {principal}");
    }
}
