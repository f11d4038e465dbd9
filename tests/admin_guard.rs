//! The admin listener against web pages, over real HTTP to the real binary: a rebound name
//! (`Host: rebind.evil.example`) reads nothing, a cross-site or non-JSON write changes nothing,
//! with and without `ops.admin_token`, while the operator's own `curl`, the command line and
//! the names in `ops.admin_hosts` are served. (tests/ops_browser.rs drives real Chromium at it.)

mod common;

use common::{Gateway, Launch};

/// The override the attack pass created from a browser: every address, no limit.
const OPEN_EVERYTHING: &str =
    r#"{"limiter":"agent-device","match":"ip:0.0.0.0/0","limit":4294967295,"window":"1m"}"#;

fn gateway(extra_env: &[(&str, &str)]) -> Gateway {
    let upstream = "http://127.0.0.1:9";
    let mut l = Launch::serve().upstream(upstream).admin();
    for (k, v) in extra_env {
        l = l.env(*k, *v);
    }
    l.spawn()
}

/// The admin listener's `host:port`.
fn admin_addr(gw: &Gateway) -> String {
    gw.admin("")
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned()
}

/// A raw HTTP/1.1 request to the admin listener: status and body.
fn raw(gw: &Gateway, request: &str) -> (u16, String) {
    let addr = admin_addr(gw).parse().expect("admin address");
    let r = common::raw_request(addr, request.as_bytes());
    (r.status, String::from_utf8_lossy(&r.body).into_owned())
}

async fn overrides(gw: &Gateway, token: Option<&str>) -> serde_json::Value {
    let mut req = common::client().get(gw.admin("/overrides"));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let res = req.send().await.expect("list");
    assert_eq!(res.status(), 200);
    res.json().await.expect("json")
}

fn write(gw: &Gateway, path: &str, headers: &str, body: &str) -> u16 {
    raw(
        gw,
        &format!(
            "POST {path} HTTP/1.1\r\nhost: {}\r\n{headers}content-length: {}\r\nconnection: close\r\n\r\n{body}",
            admin_addr(gw),
            body.len()
        ),
    )
    .0
}

#[tokio::test]
async fn a_rebound_name_reads_nothing_and_a_web_page_writes_nothing() {
    for token in [
        None,
        Some("9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"),
    ] {
        let env: Vec<(&str, &str)> = token
            .map(|t| vec![("FLEET_LIMITER_ADMIN_TOKEN", t)])
            .unwrap_or_default();
        let gw = gateway(&env);
        let auth = token
            .map(|t| format!("authorization: Bearer {t}\r\n"))
            .unwrap_or_default();
        // DNS rebinding: the page's own name, pointed at the listener.
        for path in ["/overrides", "/metrics", "/healthz", "/readyz"] {
            let (status, body) = raw(
                &gw,
                &format!("GET {path} HTTP/1.1\r\nhost: rebind.evil.example:7391\r\n{auth}connection: close\r\n\r\n"),
            );
            assert_eq!(status, 421, "{path}: {body}");
            assert!(body.contains("ops.admin_hosts"), "{body}");
            assert!(
                !body.contains("rebind.evil.example"),
                "the name is not echoed: {body}"
            );
        }
        for host in [
            "",
            "host: 127.0.0.1.nip.io\r\n",
            "host: 127.0.0.1\r\nhost: 127.0.0.1\r\n",
        ] {
            let (status, _) = raw(
                &gw,
                &format!("GET /overrides HTTP/1.1\r\n{host}{auth}connection: close\r\n\r\n"),
            );
            assert!(matches!(status, 400 | 421), "{host:?}: {status}");
        }
        // Simple cross-site writes a page can send without asking: text/plain, a form, none.
        for (headers, want) in [
            ("content-type: text/plain\r\n", 415),
            ("content-type: application/x-www-form-urlencoded\r\n", 415),
            ("content-type: multipart/form-data; boundary=x\r\n", 415),
            ("", 415),
            (
                "origin: http://evil.example\r\ncontent-type: application/json\r\n",
                403,
            ),
            ("origin: null\r\ncontent-type: application/json\r\n", 403),
            (
                "sec-fetch-site: cross-site\r\ncontent-type: application/json\r\n",
                403,
            ),
            (
                "sec-fetch-site: same-site\r\ncontent-type: application/json\r\n",
                403,
            ),
        ] {
            let status = write(
                &gw,
                "/overrides",
                &format!("{headers}{auth}"),
                OPEN_EVERYTHING,
            );
            assert_eq!(status, want, "{headers:?}");
        }
        assert_eq!(
            overrides(&gw, token).await["overrides"],
            serde_json::json!([]),
            "no web page created an override"
        );
        // The operator's own tools: curl, and the same JSON write from a same-origin caller.
        let Some(curl) = common::tool("curl", "apt-get install curl") else {
            return;
        };
        let curl = std::process::Command::new(curl)
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST"])
            .args(
                token
                    .map(|t| vec!["-H".to_owned(), format!("authorization: Bearer {t}")])
                    .unwrap_or_default(),
            )
            .arg(gw.admin("/reload"))
            .output();
        if let Ok(out) = curl {
            assert_eq!(
                String::from_utf8_lossy(&out.stdout),
                "200",
                "curl -X POST /reload"
            );
        }
        let status = write(
            &gw,
            "/overrides",
            &format!(
                "content-type: application/json\r\norigin: http://{}\r\n{auth}",
                admin_addr(&gw)
            ),
            r#"{"limiter":"agent-device","match":"ip:198.51.100.0/24","limit":120,"window":"1m"}"#,
        );
        assert_eq!(status, 201, "a same-origin JSON write");
        assert_eq!(
            overrides(&gw, token).await["overrides"]
                .as_array()
                .map(Vec::len),
            Some(1)
        );
    }
}

#[tokio::test]
async fn a_listed_name_is_served_and_the_command_line_still_works() {
    let gw = gateway(&[(
        "FLEET_LIMITER_ADMIN_HOSTS",
        "fleet-admin.ops.svc.cluster.local, Other.Example.",
    )]);
    for host in [
        "fleet-admin.ops.svc.cluster.local",
        "FLEET-ADMIN.ops.svc.cluster.local.:7391",
        "other.example",
        "localhost:1",
        "[::1]:7391",
    ] {
        let (status, body) = raw(
            &gw,
            &format!("GET /healthz HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n\r\n"),
        );
        assert_eq!(status, 200, "{host}: {body}");
    }
    let (status, _) = raw(
        &gw,
        "GET /healthz HTTP/1.1\r\nhost: fleet-admin.ops.svc.cluster.local.evil.example\r\nconnection: close\r\n\r\n",
    );
    assert_eq!(status, 421);
    // The command line sends JSON to the listener's address.
    let out = Launch::command([
        "override",
        "--admin",
        gw.admin("").trim_end_matches('/'),
        "add",
        "--limiter",
        "agent-device",
        "--match",
        "ip:203.0.113.0/24",
        "--limit",
        "100",
        "--window",
        "1m",
    ])
    .run(std::time::Duration::from_secs(60));
    assert_eq!(out.code, Some(0), "{}\n{}", out.stdout, out.stderr);
    assert_eq!(
        overrides(&gw, None).await["overrides"]
            .as_array()
            .map(Vec::len),
        Some(1)
    );
}

#[test]
fn junk_in_admin_hosts_is_refused_at_start_naming_the_setting() {
    for junk in [
        "*.example.com",
        "http://admin.example",
        "admin.example:7391",
        "10.0.0.1",
        "a b",
    ] {
        let out = Launch::command(["check"])
            .env("FLEET_LIMITER_ADMIN_HOSTS", junk)
            .run(std::time::Duration::from_secs(60));
        assert_ne!(out.code, Some(0), "{junk}");
        assert!(
            out.stderr.contains("ops.admin_hosts"),
            "{junk}: {}",
            out.stderr
        );
    }
}
