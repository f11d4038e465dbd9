//! Secrets are never echoed, and dangerous settings are refused: the real binary, every error
//! path run with a recognisable secret, which must appear nowhere in what the process prints
//! or answers (stdout, stderr, log lines, HTTP bodies).

mod common;

use common::{client, dead_addr, upstream, Exited, Gateway, Launch, PATIENCE};

/// A random-looking HS256 secret with a bad TOML escape (`\q`) in the middle.
const SECRET_WITH_BAD_ESCAPE: &str = r"Zr8vQm2LwX4kT9pN\qB6yHc3JfD1sGa7UeKo5RtW";
/// Pieces of that secret, each recognisable on its own.
const SECRET_PIECES: &[&str] = &["Zr8vQm2LwX4kT9pN", "B6yHc3JfD1sGa7UeKo5RtW"];
/// A Redis password.
const REDIS_PASSWORD: &str = "S3cretPassw0rdXYZ";
/// An upstream password.
const UPSTREAM_PASSWORD: &str = "UpStr3amPassw0rdQRS";

/// `text` holds none of `secrets`.
fn assert_hidden(what: &str, text: &str, secrets: &[&str]) {
    for s in secrets {
        assert!(
            !text.contains(s),
            "{what} must not contain the secret `{s}`:\n{text}"
        );
    }
}

fn assert_exit_hidden(out: &Exited, secrets: &[&str]) {
    assert_hidden("stdout", &out.stdout, secrets);
    assert_hidden("stderr", &out.stderr, secrets);
}

/// `serve` with this configuration file, in front of an upstream where nothing listens.
fn serve_with(toml: &str) -> Launch {
    Launch::serve()
        .upstream(&format!("http://{}", dead_addr()))
        .log("debug")
        .config_toml(toml)
}

#[test]
fn a_toml_syntax_error_in_the_hs256_secret_is_located_but_not_echoed() {
    let files = [
        // One line.
        format!("[identity]\njwt_hs256_secret = \"{SECRET_WITH_BAD_ESCAPE}\"\n"),
        // A dotted key, after other settings.
        format!("enabled = true\nidentity.jwt_hs256_secret = \"{SECRET_WITH_BAD_ESCAPE}\"\n"),
        // An inline table.
        format!("identity = {{ jwt_hs256_secret = \"{SECRET_WITH_BAD_ESCAPE}\" }}\n"),
        // A multi-line string: the bad escape is on a line of its own.
        format!(
            "[identity]\njwt_hs256_secret = \"\"\"\n{}\n{}\n\"\"\"\n",
            SECRET_PIECES[0],
            &SECRET_WITH_BAD_ESCAPE[SECRET_PIECES[0].len()..]
        ),
    ];
    for toml in &files {
        for launch in [
            serve_with(toml),
            Launch::command(["check"]).config_toml(toml.clone()),
        ] {
            refused(
                launch,
                &[
                    "fleet-limiter",
                    "TOML parse error at line",
                    "column",
                    "not shown",
                ],
                SECRET_PIECES,
            );
        }
    }
}

#[test]
fn a_toml_syntax_error_in_a_redis_url_does_not_echo_its_password() {
    for toml in [
        format!("[store]\nbackend = \"redis\"\nurl = \"redis://default:{REDIS_PASSWORD}\\q@127.0.0.1:1/\"\n"),
        format!(
            "[store]\nbackend = \"redis\"\ncluster = [\n  \"redis://127.0.0.1:1\",\n  \"redis://default:{REDIS_PASSWORD}\\q@127.0.0.1:2\",\n]\n"
        ),
    ] {
        refused(
            serve_with(&toml),
            &["TOML parse error at line"],
            &[REDIS_PASSWORD],
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_password_is_redacted_in_logs_readiness_errors_and_reload_reports() {
    let up = upstream().await;
    let url = format!("redis://default:{REDIS_PASSWORD}@127.0.0.1:1/");
    let toml = format!(
        "[server]\nupstream = \"{}\"\n[store]\nbackend = \"redis\"\nurl = \"{url}\"\n",
        up.uri()
    );
    let gw = Launch::serve()
        .config_toml(toml)
        .admin()
        .log("debug")
        .spawn();
    // A decision with Redis down: the store fails, the limiter answers with on_store_error.
    let res = client()
        .post(gw.url("/api/agent/heartbeat"))
        .header("x-agent-id", "agent-1")
        .send()
        .await
        .expect("request");
    let body = res.text().await.expect("body");
    assert_hidden("a gateway answer", &body, &[REDIS_PASSWORD]);
    let ready = client()
        .get(gw.admin("/readyz"))
        .send()
        .await
        .expect("readyz");
    assert_eq!(
        ready.status(),
        200,
        "a store that does not answer leaves the instance ready"
    );
    let ready = ready.text().await.expect("readyz body");
    assert!(ready.contains("\"store_up\":false"), "{ready}");
    assert_hidden("/readyz", &ready, &[REDIS_PASSWORD]);
    let store = client()
        .get(gw.admin("/healthz/store"))
        .send()
        .await
        .expect("/healthz/store");
    assert_eq!(store.status(), 503);
    let store = store.text().await.expect("/healthz/store body");
    assert_hidden("/healthz/store", &store, &[REDIS_PASSWORD]);

    // A reload that changes the store: the report names the setting, never the URL.
    gw.rewrite_config(&format!(
        "[server]\nupstream = \"{}\"\n[store]\nbackend = \"redis\"\nurl = \"redis://default:{REDIS_PASSWORD}@127.0.0.1:2/\"\n",
        up.uri()
    ));
    let res = client()
        .post(gw.admin("/reload"))
        .send()
        .await
        .expect("reload");
    assert_eq!(res.status(), 200);
    let report = res.text().await.expect("reload body");
    assert!(report.contains("\"store\""), "{report}");
    assert_hidden("the reload report", &report, &[REDIS_PASSWORD]);

    let log = gw.stderr();
    assert!(log.contains("redis store not reachable yet"), "{log}");
    assert!(log.contains("redis://default:***@127.0.0.1:1"), "{log}");
    assert_hidden("the log", &log, &[REDIS_PASSWORD]);
    assert_hidden("stdout", &gw.stdout(), &[REDIS_PASSWORD]);
}

/// Runs `launch`, which must stop at start-up (exit code 2) saying each of `says` and showing
/// none of `secrets` on stdout or stderr.
fn refused(launch: Launch, says: &[&str], secrets: &[&str]) -> Exited {
    let out = launch.run(PATIENCE);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    for s in says {
        assert!(out.stderr.contains(s), "`{s}` not in: {}", out.stderr);
    }
    assert_exit_hidden(&out, secrets);
    out
}

#[test]
fn sentinel_urls_in_configuration_errors_are_redacted_and_name_the_fix() {
    let url = format!("redis+sentinel://default:{REDIS_PASSWORD}@127.0.0.1:26379");
    let shown = "redis+sentinel://default:***@127.0.0.1:26379";
    refused(
        Launch::serve()
            .upstream("http://127.0.0.1:9")
            .arg("--store")
            .arg(&url),
        &["store.url", shown, "names no master", "<master-name>"],
        &[REDIS_PASSWORD],
    );
    refused(
        serve_with(&format!("[store]\nurl = \"{url}/mymaster/x\"\n")),
        &["store.url", "is not a database number"],
        &[REDIS_PASSWORD],
    );
    refused(
        serve_with(&format!("[store]\ncluster = [\"{url}/m\"]\n")),
        &["store.cluster", "Sentinel goes in store.url"],
        &[REDIS_PASSWORD],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_password_is_redacted_in_logs_and_readiness_while_no_sentinel_answers() {
    let up = upstream().await;
    let dead = dead_addr();
    let toml = format!(
        "[server]\nupstream = \"{}\"\n[store]\nurl = \"redis+sentinel://default:{REDIS_PASSWORD}@{dead},{dead}/mymaster\"\n",
        up.uri()
    );
    let gw = Launch::serve()
        .config_toml(toml)
        .admin()
        .log("debug")
        .spawn();
    let res = client()
        .post(gw.url("/api/agent/heartbeat"))
        .header("x-agent-id", "agent-1")
        .send()
        .await
        .expect("request");
    assert_eq!(res.status(), 200, "on_store_error = allow");
    let ready = client()
        .get(gw.admin("/readyz"))
        .send()
        .await
        .expect("readyz")
        .text()
        .await
        .expect("readyz body");
    assert!(ready.contains("\"store_up\":false"), "{ready}");
    assert!(ready.contains("no Sentinel named the primary"), "{ready}");
    assert_hidden("/readyz", &ready, &[REDIS_PASSWORD]);
    let log = gw.stderr();
    assert!(
        log.contains(&format!("redis+sentinel://default:***@{dead}")),
        "{log}"
    );
    assert_hidden("the log", &log, &[REDIS_PASSWORD]);
    assert_hidden("stdout", &gw.stdout(), &[REDIS_PASSWORD]);
}

#[test]
fn redis_urls_in_configuration_errors_are_redacted() {
    refused(
        Launch::serve()
            .upstream("http://127.0.0.1:9")
            .arg("--store")
            .arg(format!("redis+tcp://default:{REDIS_PASSWORD}@127.0.0.1:1/")),
        &["redis+tcp://default:***@127.0.0.1:1"],
        &[REDIS_PASSWORD],
    );
    for cluster in [
        format!("[\"http://default:{REDIS_PASSWORD}@127.0.0.1:1\"]"),
        // Not a list: the wrong type is named without the value.
        format!("\"redis://default:{REDIS_PASSWORD}@127.0.0.1:1\""),
    ] {
        refused(
            serve_with(&format!(
                "[store]\nbackend = \"redis\"\ncluster = {cluster}\n"
            )),
            &["store.cluster"],
            &[REDIS_PASSWORD],
        );
    }
    refused(
        Launch::serve().upstream("http://127.0.0.1:9").env(
            "FLEET_LIMITER_JWKS_URL",
            format!("ftp://issuer:{REDIS_PASSWORD}@127.0.0.1:1/jwks.json"),
        ),
        &["identity.jwks_url"],
        &[REDIS_PASSWORD],
    );
}

#[test]
fn an_upstream_url_with_credentials_or_a_space_is_refused() {
    for (upstream, why) in [
        (
            format!("http://admin:{UPSTREAM_PASSWORD}@127.0.0.1:3000"),
            "user:password@",
        ),
        (
            format!("http://{UPSTREAM_PASSWORD}@127.0.0.1:3000"),
            "user:password@",
        ),
        (
            "http://127.0.0.1:3000/api v1".to_owned(),
            "not allowed in a URL",
        ),
        (
            "http://127.0.0.1:3000/a\"b".to_owned(),
            "not allowed in a URL",
        ),
        (
            "http://exa mple.test:3000".to_owned(),
            "not allowed in a URL",
        ),
        ("http://127.0.0.1:99999".to_owned(), "port"),
    ] {
        refused(
            Launch::serve().upstream(&upstream),
            &["flag --upstream: server.upstream:", why],
            &[UPSTREAM_PASSWORD],
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_fails_on_a_secret_line_does_not_echo_it() {
    let up = upstream().await;
    let good = format!("[server]\nupstream = \"{}\"\n", up.uri());
    let gw = Launch::serve()
        .config_toml(good)
        .admin()
        .log("info")
        .spawn();
    gw.rewrite_config(&format!(
        "[server]\nupstream = \"{}\"\n[identity]\njwt_hs256_secret = \"{SECRET_WITH_BAD_ESCAPE}\"\n",
        up.uri()
    ));
    let res = client()
        .post(gw.admin("/reload"))
        .send()
        .await
        .expect("reload");
    assert_eq!(res.status(), 422);
    let body: serde_json::Value = res.json().await.expect("json");
    assert_eq!(body["reloaded"], false);
    let error = body["error"].as_str().unwrap_or_default();
    assert!(error.contains("line 4"), "{error}");
    assert_hidden("the reload answer", &body.to_string(), SECRET_PIECES);

    // The same by SIGHUP, with a weak secret this time: rejected, logged, not echoed.
    gw.rewrite_config(&format!(
        "[server]\nupstream = \"{}\"\n[identity]\njwt_hs256_secret = \"changemechangemechangemechangeme\"\n",
        up.uri()
    ));
    gw.signal("HUP");
    gw.wait_metric(
        r#"fleet_limiter_config_reloads_total{result="error"}"#,
        |v| v == 2.0,
    )
    .await;
    let log = gw.stderr();
    assert!(log.contains("configuration reload rejected"), "{log}");
    assert!(log.contains("the HS256 secret is weak"), "{log}");
    assert_hidden(
        "the log",
        &log,
        &[SECRET_PIECES[0], SECRET_PIECES[1], "changemechangeme"],
    );
}

#[test]
fn weak_secrets_stop_the_start_without_being_echoed() {
    for (secret, why) in [
        ("changemechangemechangemechangeme", "repeats"),
        ("your-256-bit-secret-your-256-bit-secret", "placeholder"),
        ("12345678901234567890123456789012", "run of consecutive"),
        ("secret                              ", "placeholder"),
        (
            "hello                               ",
            "shorter than 32 bytes",
        ),
        ("abababababababababababababababab", "repeats"),
        ("aaaabbbbaaaabbbbccccaaaabbbbccccaaaabbbb", "few distinct"),
        ("my-super-secret-jwt-key-for-production", "placeholder"),
    ] {
        let out = refused(
            Launch::serve()
                .upstream("http://127.0.0.1:9")
                .env("FLEET_LIMITER_JWT_HS256_SECRET", secret),
            &[
                "environment variable FLEET_LIMITER_JWT_HS256_SECRET: identity.jwt_hs256_secret: the HS256 secret is weak",
                why,
                "openssl rand -base64 48",
            ],
            &[secret],
        );
        // A short word (`secret`) may well appear in the message itself; longer ones may not.
        let trimmed = secret.trim();
        if trimmed.len() >= 16 {
            assert_exit_hidden(&out, &[trimmed]);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_random_secret_starts() {
    let up = upstream().await;
    // 48 random bytes, base64 (what `openssl rand -base64 48` prints), and 32 bytes as hex.
    for secret in [
        "q0Yb4m3nN1ZkV8cJr2WxT5uA9hLgE7sDfK6pQ0iRzX3vB1yC4oM8eH2jU5tS9wG",
        "9f2c4e1ab7d3058e6f4a2c9b1d7e3f5a0b8c6d2e4f1a3b5c7d9e0f2a4b6c8d0e",
    ] {
        let gw = Launch::serve()
            .upstream(&up.uri())
            .log("info")
            .env("FLEET_LIMITER_JWT_HS256_SECRET", secret)
            .spawn();
        let res = client()
            .get(gw.url("/api/agents"))
            .send()
            .await
            .expect("request");
        assert_eq!(res.status(), 200);
        assert!(!gw.stderr().contains("is weak"), "{}", gw.stderr());
        assert_hidden("the log", &gw.stderr(), &[secret]);
    }
}

#[test]
fn trusting_every_address_is_refused_unless_acknowledged() {
    let cases: Vec<(Launch, &str)> = vec![
        (
            Launch::serve().arg("--trust-proxy").arg("0.0.0.0/0"),
            "flag --trust-proxy: client_ip.trust_proxy:",
        ),
        (
            Launch::serve().arg("--trust-proxy").arg("::/0"),
            "flag --trust-proxy: client_ip.trust_proxy:",
        ),
        (
            Launch::serve().env(
                "FLEET_LIMITER_TRUST_PROXY",
                "10.0.0.1, 0.0.0.0/1, 128.0.0.0/1",
            ),
            "environment variable FLEET_LIMITER_TRUST_PROXY: client_ip.trust_proxy:",
        ),
        (
            Launch::serve().env("FLEET_LIMITER_TRUST_PROXY", "::ffff:0:0/96"),
            "environment variable FLEET_LIMITER_TRUST_PROXY: client_ip.trust_proxy:",
        ),
        (
            Launch::serve().config_toml("[client_ip]\ntrust_proxy = [\"::/1\", \"8000::/1\"]\n"),
            "fleet-limiter.toml: client_ip.trust_proxy:",
        ),
    ];
    for (launch, origin) in cases {
        let out = launch.upstream("http://127.0.0.1:9").run(PATIENCE);
        assert_eq!(out.code, Some(2), "{}", out.stderr);
        assert!(out.stderr.contains("configuration error"), "{}", out.stderr);
        assert!(out.stderr.contains(origin), "{}", out.stderr);
        assert!(out.stderr.contains("X-Forwarded-For"), "{}", out.stderr);
        assert!(out.stderr.contains("its own budget"), "{}", out.stderr);
        assert!(
            out.stderr.contains(
                "client_ip.trust_all_addresses = true (FLEET_LIMITER_TRUST_ALL_ADDRESSES=true)"
            ),
            "{}",
            out.stderr
        );
        assert!(out.stderr.contains("overwrites"), "{}", out.stderr);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trusting_every_address_starts_with_a_warning_when_acknowledged() {
    let up = upstream().await;
    for _ in 0..2 {
        let gw: Gateway = Launch::serve()
            .upstream(&up.uri())
            .log("info")
            .arg("--trust-proxy")
            .arg("0.0.0.0/0")
            .env("FLEET_LIMITER_TRUST_ALL_ADDRESSES", "true")
            .spawn();
        let res = client()
            .get(gw.url("/api/agents"))
            .header("x-forwarded-for", "203.0.113.9")
            .send()
            .await
            .expect("request");
        assert_eq!(res.status(), 200);
        let log = gw.stderr();
        assert!(
            log.contains("WARN") && log.contains("client_ip.trust_proxy covers every"),
            "{log}"
        );
        assert!(log.contains("X-Forwarded-For"), "{log}");
    }
    // Ranges that leave some addresses out are proxies, not the whole address space.
    let gw = Launch::serve()
        .upstream(&up.uri())
        .log("info")
        .env("FLEET_LIMITER_TRUST_PROXY", "0.0.0.0/1, 128.0.0.0/2, ::/1")
        .spawn();
    let res = client()
        .get(gw.url("/api/agents"))
        .send()
        .await
        .expect("request");
    assert_eq!(res.status(), 200);
    assert!(!gw.stderr().contains("covers every"), "{}", gw.stderr());
}

/// Secrets carried in query strings and fragments, one recognisable value per place.
const QUERY_SECRETS: &[&str] = &[
    "QryRedisPassw0rdAAA",
    "QryJwksT0kenBBB",
    "QryFragT0kenCCC",
    "QryReloadPassw0rdDDD",
    "QryUpstreamKeyEEE",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_string_secrets_stay_out_of_logs_answers_metrics_and_reload_reports() {
    let up = upstream().await;
    let jwks = dead_addr();
    let redis = dead_addr();
    let toml = |store_secret: &str| {
        format!(
            "[server]\nupstream = \"{}\"\n\
             [store]\nbackend = \"redis\"\nurl = \"redis://:{store_secret}@{redis}/0\"\n\
             [identity]\njwks_url = \"http://{jwks}/jwks.json?api_key={};sig=x#access_token={}\"\n",
            up.uri(),
            QUERY_SECRETS[1],
            QUERY_SECRETS[2],
        )
    };
    let gw = Launch::serve()
        .config_toml(toml(QUERY_SECRETS[0]))
        .admin()
        .log("debug")
        .spawn();
    // Redis is down: the decision answers with on_store_error; a token sends the verifier to
    // the key set, which cannot be fetched either.
    for auth in [
        None,
        Some("Bearer eyJhbGciOiJSUzI1NiIsImtpZCI6ImsxIn0.e30.c2ln"),
    ] {
        let mut req = client()
            .get(gw.url("/api/agents"))
            .header("x-agent-id", "agent-1");
        if let Some(a) = auth {
            req = req.header("authorization", a);
        }
        let res = req.send().await.expect("request");
        let body = res.text().await.expect("body");
        assert_hidden("a gateway answer", &body, QUERY_SECRETS);
    }
    for path in ["/readyz", "/metrics", "/healthz", "/healthz/store"] {
        let res = client().get(gw.admin(path)).send().await.expect(path);
        let body = res.text().await.expect("admin body");
        assert_hidden(path, &body, QUERY_SECRETS);
    }

    // A reload to another store URL: the report names the setting, never the URL.
    gw.rewrite_config(&toml(QUERY_SECRETS[3]));
    let res = client()
        .post(gw.admin("/reload"))
        .send()
        .await
        .expect("reload");
    assert_eq!(res.status(), 200);
    let report = res.text().await.expect("reload body");
    assert!(report.contains("\"store\""), "{report}");
    assert_hidden("the reload report", &report, QUERY_SECRETS);

    // A reload to an upstream with a query is rejected, by POST /reload and by SIGHUP.
    let bad = format!(
        "[server]\nupstream = \"{}/v1?key={}\"\n",
        up.uri(),
        QUERY_SECRETS[4]
    );
    gw.rewrite_config(&bad);
    let res = client()
        .post(gw.admin("/reload"))
        .send()
        .await
        .expect("reload");
    assert_eq!(res.status(), 422);
    let body = res.text().await.expect("reload body");
    assert!(body.contains("server.upstream"), "{body}");
    assert!(body.contains("/v1?***"), "{body}");
    assert_hidden("the rejected reload's answer", &body, QUERY_SECRETS);
    gw.signal("HUP");
    gw.wait_metric(
        r#"fleet_limiter_config_reloads_total{result="error"}"#,
        |v| v == 2.0,
    )
    .await;

    let log = gw.stderr();
    assert!(log.contains("redis store not reachable yet"), "{log}");
    assert!(log.contains("redis://:***@"), "{log}");
    assert!(log.contains("JWKS"), "{log}");
    assert!(log.contains("/jwks.json?***"), "{log}");
    assert!(log.contains("configuration reload rejected"), "{log}");
    assert_hidden("the log", &log, QUERY_SECRETS);
    assert_hidden("stdout", &gw.stdout(), QUERY_SECRETS);
}

#[test]
fn a_url_setting_with_a_query_secret_is_refused_without_echoing_it() {
    const S: &str = "QryHostileS3cretFFF";
    // Every spelling of a query or fragment a secret can hide in.
    let spellings = [
        format!("http://127.0.0.1:3000/api?key={S}"),
        format!("http://127.0.0.1:3000/api?a=1;token={S}"),
        format!("http://127.0.0.1:3000/api#access_token={S}"),
        format!("http://127.0.0.1:3000/api?%6Bey={S}"),
        format!("http://127.0.0.1:3000/api?{S}"),
        format!("http://127.0.0.1:3000/api?sig=1&sig={S}&sig"),
        format!("http://127.0.0.1:3000/api?email=a@{S}"),
        format!("http://127.0.0.1:3000?X-Amz-Signature={S}"),
        format!("127.0.0.1:3000/?key={S}"),
        format!("http://admin:{S}?@127.0.0.1:3000"),
    ];
    for u in &spellings {
        let launches = [
            (Launch::serve().upstream(u), "flag --upstream"),
            (
                Launch::serve().env("FLEET_LIMITER_UPSTREAM", u.as_str()),
                "environment variable FLEET_LIMITER_UPSTREAM",
            ),
            (
                Launch::serve().config_toml(format!("[server]\nupstream = \"{u}\"\n")),
                "fleet-limiter.toml",
            ),
            (
                Launch::command(["check"]).env("FLEET_LIMITER_UPSTREAM", u.as_str()),
                "environment variable FLEET_LIMITER_UPSTREAM",
            ),
        ];
        for (launch, origin) in launches {
            let out = launch.run(PATIENCE);
            assert_eq!(out.code, Some(2), "{u}: {}", out.stderr);
            assert!(
                out.stderr.contains(&format!("{origin}: server.upstream:")),
                "{u}: {}",
                out.stderr
            );
            assert_exit_hidden(&out, &[S]);
        }
    }
    // The store and the key set: a scheme they do not take, with a secret in the query.
    for (launch, field) in [
        (
            serve_with(&format!(
                "[store]\nbackend = \"redis\"\nurl = \"http://127.0.0.1:1/0?password={S}\"\n"
            )),
            "store.url",
        ),
        (
            serve_with(&format!(
                "[store]\nbackend = \"redis\"\ncluster = [\"redis://127.0.0.1:1\", \"tcp://127.0.0.1:2/?password={S}\"]\n"
            )),
            "store.cluster",
        ),
        (
            Launch::serve()
                .upstream("http://127.0.0.1:9")
                .arg("--store")
                .arg(format!("redis:127.0.0.1:1?password={S}")),
            "store",
        ),
        (
            Launch::serve()
                .upstream("http://127.0.0.1:9")
                .env("FLEET_LIMITER_JWKS_URL", format!("ftp://127.0.0.1:1/jwks?token={S}")),
            "identity.jwks_url",
        ),
        (
            Launch::command(["check"]).env(
                "FLEET_LIMITER_JWKS_URL",
                format!("https:///jwks?token={S}"),
            ),
            "identity.jwks_url",
        ),
    ] {
        let out = launch.run(PATIENCE);
        assert_eq!(out.code, Some(2), "{field}: {}", out.stderr);
        assert!(out.stderr.contains(field), "{}", out.stderr);
        assert_exit_hidden(&out, &[S]);
    }
    // A TOML syntax error on any line holding a URL with a query: located, not shown.
    let toml = format!("[server]\nnote = \"see https://h/p?api_key={S}\\q\"\n");
    for launch in [
        serve_with(&toml),
        Launch::command(["check"]).config_toml(toml.clone()),
    ] {
        let out = launch.run(PATIENCE);
        assert_eq!(out.code, Some(2), "{}", out.stderr);
        assert!(
            out.stderr.contains("TOML parse error at line 2"),
            "{}",
            out.stderr
        );
        assert!(out.stderr.contains("not shown"), "{}", out.stderr);
        assert_exit_hidden(&out, &[S]);
    }
}

#[test]
fn check_never_prints_a_query_secret() {
    const S: &str = "QryCheckS3cretGGG";
    for format in ["table", "json"] {
        let out = Launch::command(["check", "--format", format])
            .env(
                "FLEET_LIMITER_JWKS_URL",
                format!("https://127.0.0.1:1/jwks?token={S}"),
            )
            .run(PATIENCE);
        assert!(matches!(out.code, Some(0 | 1)), "{}", out.stderr);
        assert!(!out.stdout.is_empty(), "{}", out.stderr);
        assert_exit_hidden(&out, &[S]);
        // A store URL takes no options: refused at load, its query never repeated.
        let out = Launch::command(["check", "--format", format])
            .env(
                "FLEET_LIMITER_STORE_URL",
                format!("redis://127.0.0.1:1/0?password={S}"),
            )
            .run(PATIENCE);
        assert_eq!(out.code, Some(2), "{}", out.stderr);
        assert!(
            out.stderr.contains("store.url") && out.stderr.contains("has options"),
            "{}",
            out.stderr
        );
        assert_exit_hidden(&out, &[S]);
    }
}
