//! The `credential`, `header:<name>` and `global` key kinds, end to end: the real binary in front
//! of a real upstream, with hostile header values.

mod common;

use common::{Gateway, Launch};

fn gateway(toml: &str, upstream: &str) -> Gateway {
    Launch::serve().config_toml(toml).upstream(upstream).spawn()
}

async fn status(gw: &Gateway, p: &str, headers: &[(&str, &str)]) -> u16 {
    let mut req = common::client().get(gw.url(p));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send().await.expect("request").status().as_u16()
}

#[tokio::test]
async fn global_is_one_bucket_for_every_client() {
    let upstream = common::upstream().await;
    let gw = gateway(
        "[client_ip]\ntrust_proxy = [\"127.0.0.1\"]\n[limiters.exports]\nlimit = 2\nwindow = \"1h\"\nkey = \"global\"\nroutes = [\"/exports/**\"]\n",
        &upstream.uri(),
    );
    let from = |ip: &'static str| [("x-forwarded-for", ip)];
    assert_eq!(status(&gw, "/exports/a", &from("198.51.100.1")).await, 200);
    assert_eq!(status(&gw, "/exports/b", &from("198.51.100.2")).await, 200);
    assert_eq!(status(&gw, "/exports/c", &from("198.51.100.3")).await, 429);
    assert_eq!(status(&gw, "/exports/d", &[]).await, 429);
}

/// A limiter per tenant, and the address ceiling above it that start-up requires: nginx and
/// Caddy pass a client's own `X-Tenant-ID` on, so a client could otherwise vary it freely.
const TENANT: &str = "[limiters.per-tenant]\nlimit = 2\nwindow = \"1h\"\nkey = \"header:X-Tenant-ID\"\nroutes = [\"/t/**\"]\n[limiters.tenant-ip]\nlimit = 10\nwindow = \"1h\"\nkey = \"ip\"\ngroup = \"tenant-ip\"\nroutes = [\"/t/**\"]\n";

#[tokio::test]
async fn a_header_key_from_a_trusted_proxy_keys_each_tenant() {
    let upstream = common::upstream().await;
    let gw = gateway(
        &format!("[client_ip]\ntrust_proxy = [\"127.0.0.1\"]\n{TENANT}"),
        &upstream.uri(),
    );
    let t = |v: &'static str| [("x-tenant-id", v)];
    assert_eq!(status(&gw, "/t/1", &t("tenant-a")).await, 200);
    assert_eq!(status(&gw, "/t/2", &t("tenant-a")).await, 200);
    assert_eq!(status(&gw, "/t/3", &t("tenant-a")).await, 429);
    assert_eq!(
        status(&gw, "/t/4", &t("tenant-b")).await,
        200,
        "its own bucket"
    );
    // Hostile values key on the address (127.0.0.1), one shared bucket: they mint nothing.
    // Two values are refused (400) before any limiter: not one value, so no key of its own.
    let long = "x".repeat(129);
    let hostile: Vec<Vec<(&str, &str)>> = vec![
        vec![("x-tenant-id", long.as_str())],
        vec![("x-tenant-id", "two words")],
        vec![("x-tenant-id", "fresh-1"), ("x-tenant-id", "fresh-2")],
        vec![],
    ];
    let mut seen = Vec::new();
    for h in &hostile {
        seen.push(status(&gw, "/t/h", h).await);
    }
    assert_eq!(seen, [200, 200, 400, 429], "one bucket for all of them");
}

#[tokio::test]
async fn a_header_key_from_an_untrusted_peer_keys_on_the_address() {
    let upstream = common::upstream().await;
    // The loopback client is not the trusted proxy: its header is not read.
    let gw = gateway(
        &format!("[client_ip]\ntrust_proxy = [\"10.0.0.0/8\"]\n{TENANT}"),
        &upstream.uri(),
    );
    let t = |v: &'static str| [("x-tenant-id", v)];
    assert_eq!(status(&gw, "/t/1", &t("tenant-a")).await, 200);
    assert_eq!(status(&gw, "/t/2", &t("tenant-b")).await, 200);
    assert_eq!(status(&gw, "/t/3", &t("tenant-c")).await, 429);
}

#[tokio::test]
async fn random_credentials_spend_the_address_budget() {
    let upstream = common::upstream().await;
    let gw = gateway(
        "[limiters.by-key]\nlimit = 2\nwindow = \"1h\"\nkey = \"credential\"\nroutes = [\"/c/**\"]\n[limiters.by-address]\nlimit = 5\nwindow = \"1h\"\nkey = \"ip\"\nroutes = [\"/c/**\"]\n",
        &upstream.uri(),
    );
    let key = |k: &'static str| [("authorization", k)];
    assert_eq!(status(&gw, "/c/1", &key("Bearer k1")).await, 200);
    assert_eq!(status(&gw, "/c/2", &key("Bearer k1")).await, 200);
    assert_eq!(
        status(&gw, "/c/3", &key("Bearer k1")).await,
        429,
        "k1's own budget"
    );
    assert_eq!(status(&gw, "/c/4", &key("Bearer k2")).await, 200);
    assert_eq!(status(&gw, "/c/5", &key("Bearer k2")).await, 200);
    assert_eq!(status(&gw, "/c/6", &key("Bearer r1")).await, 200);
    // Five from this address: a fresh random key gets nothing more.
    assert_eq!(status(&gw, "/c/7", &key("Bearer r2")).await, 429);
    assert_eq!(status(&gw, "/c/8", &key("Bearer r3")).await, 429);
}

#[tokio::test]
async fn a_client_rotating_a_header_key_spends_its_address_budget() {
    let upstream = common::upstream().await;
    // The loopback peer is the trusted proxy; the clients are the addresses it forwards.
    let gw = gateway(
        &format!("[client_ip]\ntrust_proxy = [\"127.0.0.1\"]\n{TENANT}"),
        &upstream.uri(),
    );
    let mut allowed = 0;
    for i in 0..30 {
        let tenant = format!("fresh-{i}");
        let h = [
            ("x-forwarded-for", "198.51.100.9"),
            ("x-tenant-id", tenant.as_str()),
        ];
        if status(&gw, "/t/x", &h).await == 200 {
            allowed += 1;
        }
    }
    assert_eq!(
        allowed, 10,
        "a fresh tenant per request gets the address's 10, no more"
    );
    // Another address behind the same proxy keeps its own budget.
    let other = [
        ("x-forwarded-for", "198.51.100.10"),
        ("x-tenant-id", "tenant-a"),
    ];
    assert_eq!(status(&gw, "/t/x", &other).await, 200);
}

#[test]
fn a_client_chosen_key_without_an_address_ceiling_stops_start_up() {
    let cases = [
        (
            "header",
            "[client_ip]\ntrust_proxy = [\"127.0.0.1\"]\n[limiters.per-tenant]\nlimit = 2\nwindow = \"1h\"\nkey = \"header:X-Tenant-ID\"\nroutes = [\"/t/**\"]\n",
            "limiters.per-tenant.key: `header:x-tenant-id` keys on a header",
        ),
        (
            "credential",
            "[limiters.by-key]\nlimit = 2\nwindow = \"1h\"\nkey = \"credential\"\nroutes = [\"/c/**\"]\n",
            "limiters.by-key.key: `credential` keys on the Bearer token",
        ),
        (
            "agent id",
            "[limiters.agent-ip]\nmode = \"off\"\n",
            "limiters.agent-device.key: `ip+agent` keys on the agent id",
        ),
    ];
    for (what, toml, says) in cases {
        let out = Launch::serve()
            .config_toml(toml)
            .upstream("http://127.0.0.1:9")
            .run(std::time::Duration::from_secs(30));
        assert_eq!(out.code, Some(2), "{what}: {}", out.stderr);
        assert!(out.stderr.contains(says), "{what}: {}", out.stderr);
        assert!(
            out.stderr.contains("keyed on the client's address"),
            "{what}: the message says what is missing: {}",
            out.stderr
        );
    }
}
