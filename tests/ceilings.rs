//! The audit's second ceilings against the real binary over HTTP: a lockout that refuses a key
//! for its whole length (memory and Redis, across a gateway restart), refusals that do not say
//! which limiter fired (`disclose = false`), and keys read from the request body
//! (`key = "body:<field>"`) with the body forwarded byte for byte.

mod common;
mod redis_support;

use common::{Gateway, Launch};
use std::time::Duration;
use wiremock::matchers::path;
use wiremock::{Mock, MockServer, ResponseTemplate};

/// `/auth/login` answers 401 (a wrong password) unless told otherwise; anything else 200.
async fn login_upstream() -> MockServer {
    let upstream = common::upstream().await;
    Mock::given(path("/auth/login"))
        .respond_with(ResponseTemplate::new(401))
        .with_priority(1)
        .mount(&upstream)
        .await;
    upstream
}

/// A limiter name no earlier run on a shared Redis used.
fn unique(prefix: &str) -> String {
    format!("{prefix}-{:08x}", rand::random::<u32>())
}

fn gateway(toml: &str, upstream: &str) -> Gateway {
    Launch::serve()
        .config_toml(toml)
        .upstream(upstream)
        .admin()
        .spawn()
}

/// Status and `Retry-After` (in seconds) of a POST of `body` to `p`.
async fn post(gw: &Gateway, p: &str, body: &str) -> (u16, Option<u64>) {
    let res = common::client()
        .post(gw.url(p))
        .header("content-type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .expect("request");
    let retry = res
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    (res.status().as_u16(), retry)
}

/// The audit's attempt ceiling keyed on the address: five wrong answers, then a lock.
fn attempts(name: &str, lockout: &str, store: &str) -> String {
    format!(
        "{store}\n[limiters.{name}]\nlimit = 5\nwindow = \"10m\"\nkey = \"ip\"\nroutes = [\"POST /auth/login\"]\ncount = \"failed\"\nlockout = \"{lockout}\"\n"
    )
}

/// Five failed answers pass; the sixth request is refused with the whole lockout as its wait,
/// and every request after it is refused, its wait counting down, never reset by the refusals.
async fn five_failures_then_a_lock(gw: &Gateway, upstream: &MockServer) {
    for i in 0..5 {
        assert_eq!(
            post(gw, "/auth/login", "{}").await,
            (401, None),
            "attempt {i}"
        );
    }
    let started = std::time::Instant::now();
    assert_eq!(
        post(gw, "/auth/login", "{}").await,
        (429, Some(600)),
        "the sixth locks for the whole lockout"
    );
    let mut last = 600;
    for i in 0..3 {
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let (status, retry) = post(gw, "/auth/login", "{}").await;
        let retry = retry.expect("a refusal carries Retry-After");
        let elapsed = started.elapsed().as_secs();
        assert_eq!(status, 429, "still locked ({i})");
        assert!(
            retry < last && retry <= 600 - elapsed && retry >= 599 - elapsed,
            "Retry-After counts the lock down: {retry} after {elapsed} s (before: {last})"
        );
        last = retry;
    }
    assert_eq!(
        common::received(upstream).await,
        5,
        "no refused attempt reaches the upstream"
    );
}

#[tokio::test]
async fn memory_five_failed_answers_lock_the_key_for_the_lockout() {
    let upstream = login_upstream().await;
    let gw = gateway(&attempts(&unique("login"), "10m", ""), &upstream.uri());
    five_failures_then_a_lock(&gw, &upstream).await;
}

#[tokio::test]
async fn a_lock_ends_with_a_full_bucket() {
    let upstream = login_upstream().await;
    let gw = gateway(&attempts(&unique("login"), "2s", ""), &upstream.uri());
    for i in 0..5 {
        assert_eq!(post(&gw, "/auth/login", "{}").await.0, 401, "attempt {i}");
    }
    let (status, retry) = post(&gw, "/auth/login", "{}").await;
    assert_eq!((status, retry), (429, Some(2)));
    // A GCRA budget of 5 per 10 minutes would give one attempt back after two minutes; the
    // lock ends after two seconds, and then the key has its whole budget.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    for i in 0..5 {
        assert_eq!(post(&gw, "/auth/login", "{}").await.0, 401, "again {i}");
    }
    assert_eq!(post(&gw, "/auth/login", "{}").await, (429, Some(2)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_lock_outlives_the_gateway_that_set_it() {
    let Some(redis) = redis_support::standalone() else {
        return;
    };
    let upstream = login_upstream().await;
    let store = format!("[store]\nurl = \"{}\"\ntimeout = \"2s\"", redis.url());
    let toml = attempts(&unique("login"), "10m", &store);
    let gw = gateway(&toml, &upstream.uri());
    five_failures_then_a_lock(&gw, &upstream).await;
    let locked_at = std::time::Instant::now();
    drop(gw);
    // A new gateway on the same Redis: the lock is there, counting down from where it was.
    let gw = gateway(&toml, &upstream.uri());
    let (status, retry) = post(&gw, "/auth/login", "{}").await;
    let retry = retry.expect("Retry-After");
    assert_eq!(status, 429);
    assert!(
        retry <= 597 && retry + locked_at.elapsed().as_secs() >= 590,
        "the lock outlived the gateway: Retry-After {retry}"
    );
    assert_eq!(common::received(&upstream).await, 5);
}

/// A refusal as the client sees it: status, every header but `date` (name and value, the
/// number of seconds in `retry-after` apart), and the body with its numbers blanked.
#[derive(Debug, PartialEq)]
struct Refusal {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
    retry_after: u64,
}

async fn refusal(res: reqwest::Response) -> Refusal {
    let status = res.status().as_u16();
    let mut retry_after = 0;
    let mut headers: Vec<(String, String)> = res
        .headers()
        .iter()
        .filter(|(n, _)| n.as_str() != "date")
        .map(|(n, v)| {
            let v = v.to_str().unwrap_or("?").to_owned();
            if n.as_str() == "retry-after" {
                retry_after = v.parse().unwrap_or(0);
                (n.to_string(), "N".to_owned())
            } else {
                (n.to_string(), v)
            }
        })
        .collect();
    headers.sort();
    let body = res.text().await.expect("body");
    let body: String = body
        .split(|c: char| c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join("N");
    Refusal {
        status,
        headers,
        body,
        retry_after,
    }
}

/// Source and target ceilings of one route, both anonymous, with the same budget: `src` keyed
/// on the address, `dst` on `key`.
fn two_ceilings(key: &str, disclose: bool) -> String {
    format!(
        "[client_ip]\ntrust_proxy = [\"127.0.0.1/32\"]\n[headers]\nstandard = \"draft-10\"\n\
         [limiters.src]\nlimit = 2\nwindow = \"1h\"\nkey = \"ip\"\nroutes = [\"POST /auth/email\"]\ndisclose = {disclose}\n\
         [limiters.dst]\nlimit = 2\nwindow = \"1h\"\nkey = \"{key}\"\nroutes = [\"POST /auth/email\"]\ndisclose = {disclose}\n"
    )
}

/// A POST to `/auth/email` from `source` (named by the trusted proxy) for `recipient` (in the
/// `X-Recipient` header the proxy sets, and as the JSON body's `email`).
async fn send(gw: &Gateway, source: &str, recipient: &str) -> reqwest::Response {
    common::client()
        .post(gw.url("/auth/email"))
        .header("x-forwarded-for", source)
        .header("x-recipient", recipient)
        .header("content-type", "application/json")
        .body(format!(r#"{{"email":"{recipient}"}}"#))
        .send()
        .await
        .expect("request")
}

/// The refusal when the source's ceiling fires (one source, fresh recipients), and when the
/// recipient's does (fresh sources, one recipient).
async fn refusals_of_each(gw: &Gateway) -> (Refusal, Refusal) {
    for i in 0..2 {
        let r = send(gw, "198.51.100.1", &format!("r{i}@example.com")).await;
        assert_eq!(r.status(), 200);
    }
    let by_source = refusal(send(gw, "198.51.100.1", "r9@example.com").await).await;
    for i in 0..2 {
        let r = send(gw, &format!("203.0.113.{i}"), "victim@example.com").await;
        assert_eq!(r.status(), 200);
    }
    let by_target = refusal(send(gw, "203.0.113.9", "victim@example.com").await).await;
    (by_source, by_target)
}

#[tokio::test]
async fn a_refusal_by_either_anonymous_ceiling_is_the_same_answer() {
    let upstream = common::upstream().await;
    let gw = gateway(&two_ceilings("header:x-recipient", false), &upstream.uri());
    let (by_source, by_target) = refusals_of_each(&gw).await;
    assert_eq!(by_source.status, 429);
    assert!(
        (1799..=1800).contains(&by_source.retry_after)
            && (1799..=1800).contains(&by_target.retry_after),
        "Retry-After from the buckets: {} and {}",
        by_source.retry_after,
        by_target.retry_after
    );
    let names: Vec<&str> = by_source.headers.iter().map(|(n, _)| n.as_str()).collect();
    assert!(
        !names.iter().any(|n| n.contains("ratelimit")),
        "no limit header: {names:?}"
    );
    assert!(!by_source.body.contains("src") && !by_source.body.contains("dst"));
    assert_eq!(
        Refusal {
            retry_after: 0,
            ..by_source
        },
        Refusal {
            retry_after: 0,
            ..by_target
        },
        "the same answer whichever ceiling refused"
    );
    // Allowed answers name neither.
    let ok = send(&gw, "192.0.2.1", "other@example.com").await;
    assert_eq!(ok.status(), 200);
    assert!(ok
        .headers()
        .keys()
        .all(|n| !n.as_str().contains("ratelimit")));
}

#[tokio::test]
async fn disclosing_ceilings_tell_which_refused() {
    // The control: with disclose on (the default), the two refusals differ by name.
    let upstream = common::upstream().await;
    let gw = gateway(&two_ceilings("header:x-recipient", true), &upstream.uri());
    let (by_source, by_target) = refusals_of_each(&gw).await;
    let limits = |r: &Refusal| {
        r.headers
            .iter()
            .find(|(n, _)| n == "ratelimit")
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    assert!(limits(&by_source).contains("\"src\";r=0"), "{by_source:?}");
    assert!(limits(&by_target).contains("\"dst\";r=0"), "{by_target:?}");
    assert_ne!(
        Refusal {
            retry_after: 0,
            ..by_source
        },
        Refusal {
            retry_after: 0,
            ..by_target
        }
    );
}

/// The audit's EMAIL ceilings: `src` (the address) 5 an hour, `dst` (the recipient, from the
/// JSON or form body's `email`) 3 an hour, both anonymous; clients behind a trusted proxy.
fn email_ceilings(extra: &str) -> String {
    format!(
        "[client_ip]\ntrust_proxy = [\"127.0.0.1/32\"]\n[server]\n{extra}\n\
         [limiters.src]\nlimit = 5\nwindow = \"1h\"\nkey = \"ip\"\nroutes = [\"POST /auth/email\"]\ndisclose = false\n\
         [limiters.dst]\nlimit = 3\nwindow = \"1h\"\nkey = \"body:email\"\nroutes = [\"POST /auth/email\"]\ndisclose = false\n"
    )
}

/// A POST to `/auth/email` from `source` with `body` of `content_type`.
async fn post_from(
    gw: &Gateway,
    source: &str,
    content_type: &str,
    body: impl Into<reqwest::Body>,
) -> u16 {
    common::client()
        .post(gw.url("/auth/email"))
        .header("x-forwarded-for", source)
        .header("content-type", content_type)
        .body(body)
        .send()
        .await
        .expect("request")
        .status()
        .as_u16()
}

const JSON: &str = "application/json";
const FORM: &str = "application/x-www-form-urlencoded";

#[tokio::test]
async fn a_recipients_budget_holds_across_sources_and_a_sources_across_recipients() {
    let upstream = common::upstream().await;
    let gw = gateway(&email_ceilings(""), &upstream.uri());
    // Ten sources, one inbox, spelled as a client pleases: three reach it.
    let spellings = [
        r#"{"email":"victim@example.com"}"#,
        r#"{"email":" Victim@Example.COM "}"#,
        r#"{"password":"x","email":"victim+1@example.com."}"#,
        r#"{"email":"VICTIM@example.com"}"#,
        r#"{"email":"victim+2@EXAMPLE.com"}"#,
    ];
    let mut statuses = Vec::new();
    for i in 0..10 {
        let body = spellings[i % spellings.len()];
        statuses.push(post_from(&gw, &format!("198.51.100.{i}"), JSON, body).await);
    }
    // The same inbox through a form body.
    statuses.push(post_from(&gw, "198.51.100.77", FORM, "email=victim%40example.com").await);
    assert_eq!(
        statuses,
        [200, 200, 200, 429, 429, 429, 429, 429, 429, 429, 429]
    );
    // One source, many inboxes: five, then its own ceiling.
    let mut statuses = Vec::new();
    for i in 0..8 {
        let body = format!(r#"{{"email":"user{i}@example.com"}}"#);
        statuses.push(post_from(&gw, "203.0.113.50", JSON, body).await);
    }
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429, 429]);
    assert_eq!(common::received(&upstream).await, 8);
}

#[tokio::test]
async fn a_refusal_by_either_body_keyed_ceiling_is_the_same_answer() {
    let upstream = common::upstream().await;
    let gw = gateway(&two_ceilings("body:email", false), &upstream.uri());
    let (by_source, by_target) = refusals_of_each(&gw).await;
    assert_eq!(by_source.status, 429);
    assert_eq!(
        Refusal {
            retry_after: 0,
            ..by_source
        },
        Refusal {
            retry_after: 0,
            ..by_target
        }
    );
}

/// Each hostile body, from a fresh source, naming the victim's address in a way the limiter
/// cannot read with certainty: each refused with a 4xx of its own (never a 5xx), none
/// forwarded, and the victim's budget whole afterwards. (tests/body_keys.rs sends the same
/// bodies to a real Express app and counts what reaches the inbox.)
#[tokio::test]
async fn hostile_bodies_are_refused_and_never_forwarded() {
    let upstream = common::upstream().await;
    let gw = gateway(
        &email_ceilings("body_key_max_bytes = 1024"),
        &upstream.uri(),
    );
    let victim = r#""victim@example.com""#;
    let mut hostile: Vec<(&str, Vec<u8>)> = vec![
        // Too large for server.body_key_max_bytes (declared, and chunked below).
        (JSON, format!(r#"{{"email":{victim},"pad":"{}"}}"#, "x".repeat(2000)).into_bytes()),
        // Nested past the parser's limit.
        (JSON, format!(r#"{{"email":{victim},"d":{}0{}}}"#, "[".repeat(300), "]".repeat(300)).into_bytes()),
        // A form field twice (Node's parsers make it a list).
        (FORM, b"email=victim%40example.com&email=other%40example.com".to_vec()),
        // Wrong types.
        (JSON, format!(r#"{{"email":[{victim}]}}"#).into_bytes()),
        (JSON, format!(r#"{{"email":{{"$ne":{victim}}}}}"#).into_bytes()),
        (JSON, format!(r#"[{{"email":{victim}}}]"#).into_bytes()),
        ("text/plain", format!(r#"{{"email":{victim}}}"#).into_bytes()),
        ("multipart/form-data; boundary=x", b"--x\r\ncontent-disposition: form-data; name=\"email\"\r\n\r\nvictim@example.com\r\n--x--\r\n".to_vec()),
        // Bad UTF-8, bad percent encoding, broken JSON.
        (JSON, [&br#"{"email":"victim@example.com","n":""#[..], &[0xff, 0xfe], &br#""}"#[..]].concat()),
        (FORM, b"email=victim%40example.com&n=%ff".to_vec()),
        (FORM, b"email=victim%4".to_vec()),
        (FORM, b"email=victim%40example.com&n=%".to_vec()),
        (JSON, br#"{"email":"victim@example.com""#.to_vec()),
        (JSON, br#"{"email":"victim@example.com"}garbage"#.to_vec()),
    ];
    hostile.push((JSON, vec![b'{'; 5000]));
    let want = [
        413, 400, 400, 400, 400, 400, 415, 415, 400, 400, 400, 400, 400, 400, 413,
    ];
    assert_eq!(want.len(), hostile.len());
    for (i, ((ct, body), want)) in hostile.iter().zip(want).enumerate() {
        let status = post_from(&gw, &format!("198.51.100.{i}"), ct, body.clone()).await;
        assert_eq!(status, want, "hostile body {i} ({ct})");
    }
    // Chunked, with no length: found larger than the cap while it is read.
    let big = format!(r#"{{"email":{victim},"pad":"{}"}}"#, "y".repeat(5000)).into_bytes();
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        big.chunks(300).map(|c| Ok(c.to_vec())).collect();
    let streamed = reqwest::Body::wrap_stream(futures_util::stream::iter(chunks));
    assert_eq!(post_from(&gw, "198.51.100.200", JSON, streamed).await, 413);
    // An empty body names no recipient: forwarded, keyed on its source.
    assert_eq!(
        post_from(&gw, "198.51.100.201", JSON, Vec::new()).await,
        200
    );
    let received = upstream.received_requests().await.expect("recorded");
    assert_eq!(received.len(), 1, "only the empty body was forwarded");
    assert!(received[0].body.is_empty());
    // None of them counted against the victim's inbox: its three are all there.
    let mut statuses = Vec::new();
    for i in 0..4 {
        let body = r#"{"email":"victim@example.com"}"#;
        statuses.push(post_from(&gw, &format!("192.0.2.{i}"), JSON, body).await);
    }
    assert_eq!(statuses, [200, 200, 200, 429]);
    // A body that names no recipient keys the recipient ceiling on its source: from one
    // source, the fourth such body is refused (dst's 3, on the address), however it varies.
    let mut statuses = Vec::new();
    for i in 0..5 {
        let body = format!(r#"{{"other":"x{i}"}}"#);
        statuses.push(post_from(&gw, "192.0.2.99", JSON, body).await);
    }
    assert_eq!(statuses, [200, 200, 200, 429, 429]);
}

#[tokio::test]
async fn the_forwarded_body_is_what_the_client_sent() {
    let upstream = common::upstream().await;
    let gw = gateway(&email_ceilings(""), &upstream.uri());
    // A read body, in odd spellings, chunked in small pieces.
    let odd =
        " {\"em\\u0061il\" : \"Victim@Example.com\" ,\n\t\"n\":1e3, \"s\":\"\\ud83d\\ude00 é\"}  "
            .as_bytes()
            .to_vec();
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        odd.chunks(7).map(|c| Ok(c.to_vec())).collect();
    let body = reqwest::Body::wrap_stream(futures_util::stream::iter(chunks));
    assert_eq!(post_from(&gw, "198.51.100.1", JSON, body).await, 200);
    // 1 MiB on a route no body-keyed limiter meters: streamed as before.
    let mib: Vec<u8> = (0..1024 * 1024).map(|i| (i * 7 % 251) as u8).collect();
    let res = common::client()
        .put(gw.url("/api/files/blob"))
        .header("content-type", JSON)
        .body(mib.clone())
        .send()
        .await
        .expect("request");
    assert_eq!(res.status(), 200);
    // 1 MiB of JSON on the read route: too large to read, refused and never forwarded.
    let big = format!(r#"{{"email":"a@b.c","pad":"{}"}}"#, "z".repeat(1024 * 1024)).into_bytes();
    assert_eq!(post_from(&gw, "198.51.100.2", JSON, big.clone()).await, 413);
    let received = upstream.received_requests().await.expect("recorded");
    assert_eq!(received.len(), 2);
    assert!(received[0].body == odd, "the read body, byte for byte");
    assert!(received[1].body == mib, "the streamed body, byte for byte");
    // The read body's spelling counted for the address it names.
    for i in 0..2 {
        let body = r#"{"email":"victim@example.com"}"#;
        assert_eq!(
            post_from(&gw, &format!("198.51.100.{}", 10 + i), JSON, body).await,
            200
        );
    }
    assert_eq!(
        post_from(
            &gw,
            "198.51.100.20",
            JSON,
            r#"{"email":"victim@example.com"}"#
        )
        .await,
        429
    );
}

/// A body that trickles past server.body_timeout is answered 408 and never forwarded.
#[tokio::test]
async fn a_slow_body_is_answered_408_and_never_forwarded() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let upstream = common::upstream().await;
    let gw = gateway(&email_ceilings("body_timeout = \"1s\""), &upstream.uri());
    let body = br#"{"email":"victim@example.com"}"#;
    let addr = gw.url("").trim_start_matches("http://").to_owned();
    let mut conn = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    let head = format!(
        "POST /auth/email HTTP/1.1\r\nhost: x\r\nx-forwarded-for: 198.51.100.9\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).await.expect("head");
    conn.write_all(&body[..10]).await.expect("first part");
    // Past the time the limiter waits for the body, within the proxy's silence rule after it.
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let _ = conn.write_all(&body[10..]).await;
    let mut answer = Vec::new();
    let _ = conn.read_to_end(&mut answer).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert_eq!(common::received(&upstream).await, 0);
    // It was not charged to the victim's inbox.
    for i in 0..3 {
        assert_eq!(
            post_from(&gw, &format!("192.0.2.{i}"), JSON, &body[..]).await,
            200
        );
    }
}

#[tokio::test]
async fn the_decision_endpoint_has_no_body_and_keys_body_limiters_on_the_address() {
    let upstream = common::upstream().await;
    let gw = Launch::serve()
        .config_toml(email_ceilings(""))
        .upstream(&upstream.uri())
        .decision()
        .env("FLEET_LIMITER_DECISION_ALLOW_FROM", "127.0.0.1")
        .spawn();
    let d = gw.decision_addr.expect("decision listener");
    let ask = |uri: &'static str| async move {
        let res = common::client()
            .get(format!("http://{d}/nginx"))
            .header("x-original-method", "POST")
            .header("x-original-uri", uri)
            .send()
            .await
            .expect("ask");
        let status = res
            .headers()
            .get("x-fleetlimiter-status")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        (res.status().as_u16(), status)
    };
    // dst keys on the address (3), before src (5) would.
    for i in 0..3 {
        assert_eq!(ask("/auth/email").await.0, 200, "ask {i}");
    }
    let (status, real) = ask("/auth/email").await;
    assert_eq!((status, real.as_deref()), (403, Some("429")));
}

const EXAMPLE: &str = "docs/examples/auth-ceilings.toml";

/// `fleet-limiter <args>` from the crate root, as an operator runs it.
fn cli(args: &[&str]) -> common::Exited {
    Launch::command(args.iter().copied())
        .current_dir(common::manifest_dir())
        .unset("FLEET_LIMITER_ALLOW_UNSAFE_CALIBRATION")
        .unset("FLEET_LIMITER_LOG")
        .run(Duration::from_secs(300))
}

#[test]
fn check_judges_the_auth_example() {
    let out = cli(&["check", "--config", EXAMPLE, "--format", "json"]);
    assert_eq!(out.code, Some(0), "{}\n{}", out.stdout, out.stderr);
    let report: serde_json::Value = serde_json::from_str(&out.stdout).expect("json");
    let line = |name: &str| {
        report["limiters"]
            .as_array()
            .and_then(|ls| ls.iter().find(|l| l["name"] == name))
            .cloned()
            .unwrap_or_else(|| panic!("no line for {name}: {report}"))
    };
    for (name, key, count) in [
        ("email-source", "ip", "all"),
        ("email-recipient", "body:email", "all"),
        ("credential-source", "ip", "all"),
        ("login-account", "body:email+ip", "failed"),
        ("login-account-ceiling", "body:email", "failed"),
        ("otp-code", "body:code_id+ip", "failed"),
        ("otp-code-ceiling", "body:code_id", "failed"),
    ] {
        let l = line(name);
        assert_eq!(
            (l["key"].as_str(), l["count"].as_str()),
            (Some(key), Some(count)),
            "{l}"
        );
        assert_eq!(l["status"], "unloaded", "an abuse guard: {l}");
    }
    // Every target-keyed ceiling is anonymous, so check has nothing to warn about them.
    assert_eq!(report["warnings"], 0, "{report}");
    // Named, the per-recipient ceiling is a warning.
    let dir = tempfile::tempdir().expect("dir");
    let named = dir.path().join("named.toml");
    let text = std::fs::read_to_string(common::manifest_dir().join(EXAMPLE)).expect("example");
    let text = text.replacen(
        "disclose = false\n\n[limiters.credential-source]",
        "disclose = true\n\n[limiters.credential-source]",
        1,
    );
    std::fs::write(&named, text).expect("write");
    let out = cli(&["check", "--config", named.to_str().expect("utf-8")]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(
        out.stdout
            .contains("warning: email-recipient: keyed on `body:email`"),
        "{}",
        out.stdout
    );
}
