//! `body:<field>` limiters against the real binary in front of a real Express 5 app with its
//! stock body parsers (`tests/paths/node/inbox.js`): every body, encoding and spelling that
//! once reached an inbox whose budget was spent, or an account locked for its source, is now
//! read as Express reads it or refused; and a stranger's wrong answers lock the stranger, not
//! the account's owner. Needs `node` and `npm ci` in `tests/paths/node` (skipped without them,
//! failing under `CI`).

mod common;

use common::{Gateway, Launch};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The Express app, killed when dropped.
struct Express {
    child: Child,
    port: u16,
}

impl Drop for Express {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Express {
    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Mails delivered to, and login attempts seen for, `inbox`.
    async fn count(&self, inbox: &str) -> (u64, u64) {
        let v: serde_json::Value = common::client()
            .get(format!("{}/__count", self.url()))
            .query(&[("inbox", inbox)])
            .send()
            .await
            .expect("count")
            .json()
            .await
            .expect("json");
        (
            v["mails"].as_u64().expect("mails"),
            v["attempts"].as_u64().expect("attempts"),
        )
    }
}

fn express() -> Option<Express> {
    let dir = common::manifest_dir().join("tests/paths/node");
    common::tool("node", "apt-get install nodejs npm")?;
    if !dir.join("node_modules/express").is_dir() {
        common::unavailable("Express is not installed (run `npm ci` in tests/paths/node)");
        return None;
    }
    let mut child = Command::new("node")
        .arg(dir.join("inbox.js"))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("node starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("listening line");
    let port = line
        .trim()
        .strip_prefix("listening ")
        .and_then(|p| p.parse().ok())
        .expect("a port");
    Some(Express { child, port })
}

/// The audit's email ceilings: 3 an hour per inbox (`body:email`), a generous per-address
/// ceiling beside it (required), clients behind a trusted proxy so each send can come from an
/// address of its own.
const EMAIL: &str = "[client_ip]\ntrust_proxy = [\"127.0.0.1/32\"]\n[server]\nbody_key_max_bytes = 1024\n\
[limiters.src]\nlimit = 1000\nwindow = \"1h\"\nkey = \"ip\"\nroutes = [\"POST /auth/forgot-password\"]\ndisclose = false\n\
[limiters.dst]\nlimit = 3\nwindow = \"1h\"\nkey = \"body:email\"\nroutes = [\"POST /auth/forgot-password\"]\ndisclose = false\n";

/// A POST of `body` with these headers, from `source`: the status.
async fn send(
    gw: &Gateway,
    path: &str,
    source: &str,
    headers: &[(&str, &str)],
    body: impl Into<reqwest::Body>,
) -> u16 {
    let mut req = common::client()
        .post(gw.url(path))
        .header("x-forwarded-for", source);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.body(body)
        .send()
        .await
        .expect("request")
        .status()
        .as_u16()
}

fn gzip(b: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(b).expect("gzip");
    e.finish().expect("gzip")
}

fn deflate(b: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(b).expect("deflate");
    e.finish().expect("deflate")
}

/// What a hostile body is, its headers, its bytes, and the status it must get.
type Hostile = (
    &'static str,
    Vec<(&'static str, &'static str)>,
    Vec<u8>,
    u16,
);

const JSON: (&str, &str) = ("content-type", "application/json");
const FORM: (&str, &str) = ("content-type", "application/x-www-form-urlencoded");

/// Hostile bodies read as Express reads them: the victim's, refused by its spent budget.
fn read_as_the_victims(v: &str) -> Vec<Hostile> {
    vec![
        (
            "duplicate key, last wins",
            vec![JSON],
            format!(r#"{{"email":"decoy@x.test","email":"{v}"}}"#).into_bytes(),
            429,
        ),
        (
            "byte-order mark",
            vec![JSON],
            [
                &b"\xef\xbb\xbf"[..],
                format!(r#"{{"email":"{v}"}}"#).as_bytes(),
            ]
            .concat(),
            429,
        ),
        (
            "zero-width space",
            vec![JSON],
            "{\"email\":\"vic\u{200b}tim@example.com\"}"
                .as_bytes()
                .to_vec(),
            429,
        ),
        (
            "fullwidth at sign",
            vec![JSON],
            "{\"email\":\"victim\u{ff20}example.com\"}"
                .as_bytes()
                .to_vec(),
            429,
        ),
        (
            "fullwidth letters",
            vec![JSON],
            "{\"email\":\"\u{ff56}\u{ff49}\u{ff43}\u{ff54}\u{ff49}\u{ff4d}@example.com\"}"
                .as_bytes()
                .to_vec(),
            429,
        ),
        (
            "quoted local part",
            vec![JSON],
            br#"{"email":"\"victim\"@example.com"}"#.to_vec(),
            429,
        ),
        (
            "form, upper case and a tag",
            vec![FORM],
            b"email=Victim%2Breset%40Example.COM".to_vec(),
            429,
        ),
    ]
}

/// Refused: bodies the limiter cannot read with certainty (too large, too deep, badly encoded,
/// compressed).
fn unreadable_bodies(v: &str) -> Vec<Hostile> {
    let pad = "x".repeat(2000);
    let deep = format!("{}1{}", "[".repeat(40), "]".repeat(40));
    vec![
        (
            "padded past the cap",
            vec![JSON],
            format!(r#"{{"email":"{v}","pad":"{pad}"}}"#).into_bytes(),
            413,
        ),
        (
            "nested 40 deep elsewhere",
            vec![JSON],
            format!(r#"{{"email":"{v}","d":{deep}}}"#).into_bytes(),
            400,
        ),
        (
            "bad UTF-8 elsewhere",
            vec![JSON],
            [
                format!(r#"{{"email":"{v}","n":""#).as_bytes(),
                &[0xff, 0xfe],
                b"\"}",
            ]
            .concat(),
            400,
        ),
        (
            "gzip",
            vec![JSON, ("content-encoding", "gzip")],
            gzip(format!(r#"{{"email":"{v}"}}"#).as_bytes()),
            415,
        ),
        (
            "deflate",
            vec![JSON, ("content-encoding", "deflate")],
            deflate(format!(r#"{{"email":"{v}"}}"#).as_bytes()),
            415,
        ),
    ]
}

/// Refused too: a value that is not one address, or a body of another media type.
fn unclear_bodies(v: &str) -> Vec<Hostile> {
    vec![
        (
            "array value",
            vec![JSON],
            format!(r#"{{"email":["{v}"]}}"#).into_bytes(),
            400,
        ),
        (
            "array value with a decoy",
            vec![JSON],
            format!(r#"{{"email":["decoy@x.test","{v}"]}}"#).into_bytes(),
            400,
        ),
        (
            "text/plain JSON",
            vec![("content-type", "text/plain")],
            format!(r#"{{"email":"{v}"}}"#).into_bytes(),
            415,
        ),
        (
            "no Content-Type",
            vec![],
            format!(r#"{{"email":"{v}"}}"#).into_bytes(),
            415,
        ),
        (
            "UTF-16 charset",
            vec![("content-type", "application/json; charset=utf-16")],
            format!(r#"{{"email":"{v}"}}"#).into_bytes(),
            415,
        ),
        (
            "bracketed form name",
            vec![FORM],
            b"email[]=victim%40example.com".to_vec(),
            400,
        ),
        (
            "duplicate form field",
            vec![FORM],
            b"email=decoy%40x.test&email=victim%40example.com".to_vec(),
            400,
        ),
        (
            "bad escape elsewhere",
            vec![FORM],
            b"email=victim%40example.com&n=%zz".to_vec(),
            400,
        ),
        (
            "a list",
            vec![JSON],
            format!(r#"{{"email":"{v},decoy@x.test"}}"#).into_bytes(),
            400,
        ),
        (
            "a list, fullwidth comma",
            vec![JSON],
            "{\"email\":\"victim@example.com\u{ff0c}decoy@x.test\"}"
                .as_bytes()
                .to_vec(),
            400,
        ),
        (
            "a display form",
            vec![JSON],
            format!(r#"{{"email":"Victim <{v}>"}}"#).into_bytes(),
            400,
        ),
    ]
}

/// The victim's budget, spent from three addresses.
async fn spend_the_victims_budget(gw: &Gateway, app: &Express, path: &str) {
    for i in 0..3 {
        let body = r#"{"email":"victim@example.com"}"#;
        assert_eq!(
            send(gw, path, &format!("192.0.2.{i}"), &[JSON], body).await,
            200
        );
    }
    assert_eq!(app.count("victim@example.com").await.0, 3);
}

/// Each hostile body, from an address of its own, gets the status it must.
async fn assert_each_gets_its_status(gw: &Gateway, path: &str, hostile: &mut [Hostile]) {
    for (i, (what, headers, body, want)) in hostile.iter_mut().enumerate() {
        let got = send(gw, path, &format!("198.51.100.{i}"), headers, body.clone()).await;
        assert_eq!(got, *want, "{what}");
    }
}

/// Chunked, with no length: found larger than the cap while reading.
async fn assert_chunked_past_the_cap_refused(gw: &Gateway, path: &str, v: &str) {
    let big = format!(r#"{{"email":"{v}","pad":"{}"}}"#, "y".repeat(5000)).into_bytes();
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        big.chunks(300).map(|c| Ok(c.to_vec())).collect();
    let streamed = reqwest::Body::wrap_stream(futures_util::stream::iter(chunks));
    assert_eq!(
        send(gw, path, "198.51.100.250", &[JSON], streamed).await,
        413
    );
}

/// The punycode and Unicode forms of one domain are one inbox.
async fn assert_punycode_and_unicode_one_inbox(gw: &Gateway, app: &Express, path: &str) {
    for i in 0..3 {
        let body = r#"{"email":"victim@xn--bcher-kva.example"}"#;
        assert_eq!(
            send(gw, path, &format!("192.0.2.{}", 10 + i), &[JSON], body).await,
            200
        );
    }
    let body = "{\"email\":\"victim@B\u{fc}cher.example\"}";
    assert_eq!(send(gw, path, "192.0.2.20", &[JSON], body).await, 429);
    assert_eq!(app.count("victim@xn--bcher-kva.example").await.0, 3);
}

/// Each refusal was counted by its reason.
async fn assert_refusals_counted_by_reason(gw: &Gateway) {
    for (reason, n) in [
        ("too-large", 2.0),
        ("encoding", 2.0),
        ("media-type", 2.0),
        ("ambiguous", 4.0),
    ] {
        let sample = format!("fleet_limiter_bodies_refused_total{{reason=\"{reason}\"}}");
        assert_eq!(gw.metric(&sample).await, Some(n), "{sample}");
    }
}

#[tokio::test]
async fn no_body_encoding_or_spelling_reaches_an_inbox_whose_budget_is_spent() {
    let Some(app) = express() else { return };
    let gw = Launch::serve()
        .config_toml(EMAIL)
        .upstream(&app.url())
        .admin()
        .spawn();
    let path = "/auth/forgot-password";
    // The victim's budget, spent from three addresses.
    spend_the_victims_budget(&gw, &app, path).await;
    let v = "victim@example.com";
    let mut hostile: Vec<Hostile> = read_as_the_victims(v);
    hostile.extend(unreadable_bodies(v));
    hostile.extend(unclear_bodies(v));
    assert_each_gets_its_status(&gw, path, &mut hostile).await;
    // Chunked, with no length: found larger than the cap while reading.
    assert_chunked_past_the_cap_refused(&gw, path, v).await;
    assert_eq!(
        app.count("victim@example.com").await.0,
        3,
        "nothing reached the spent inbox"
    );
    // The punycode and Unicode forms of one domain are one inbox.
    assert_punycode_and_unicode_one_inbox(&gw, &app, path).await;
    // Each refusal was counted by its reason.
    assert_refusals_counted_by_reason(&gw).await;
}

/// The audit's attempt ceiling as docs/examples/auth-ceilings.toml writes it: five wrong
/// answers per account and address, then a ten-minute lock of that address out of that
/// account; 50 wrong answers an hour per account from all addresses, without a lock.
const LOGIN: &str = "[client_ip]\ntrust_proxy = [\"127.0.0.1/32\"]\n[server]\nbody_key_max_bytes = 16384\n\
[limiters.credential-source]\nlimit = 300\nwindow = \"1h\"\nkey = \"ip\"\nroutes = [\"POST /auth/login\"]\ndisclose = false\n\
[limiters.login-account]\nlimit = 5\nwindow = \"10m\"\nkey = \"body:email+ip\"\nroutes = [\"POST /auth/login\"]\ncount = \"failed\"\nfailed_statuses = [\"400-499\"]\nlockout = \"10m\"\ndisclose = false\n\
[limiters.login-account-ceiling]\nlimit = 50\nwindow = \"1h\"\nkey = \"body:email\"\ngroup = \"login-account-ceiling\"\nroutes = [\"POST /auth/login\"]\ncount = \"failed\"\nfailed_statuses = [\"400-499\"]\ndisclose = false\n";

#[tokio::test]
async fn an_owner_signs_in_while_a_stranger_is_locked_out_and_padding_lifts_no_lock() {
    let Some(app) = express() else { return };
    let gw = Launch::serve()
        .config_toml(LOGIN)
        .upstream(&app.url())
        .admin()
        .spawn();
    let path = "/auth/login";
    let stranger = "203.0.113.66";
    let guess = r#"{"email":"ceo@example.com","password":"guess"}"#;
    for i in 0..5 {
        assert_eq!(
            send(&gw, path, stranger, &[JSON], guess).await,
            401,
            "guess {i}"
        );
    }
    // The sixth attempt locks the stranger's address out of the account.
    let res = common::client()
        .post(gw.url(path))
        .header("x-forwarded-for", stranger)
        .header("content-type", "application/json")
        .body(guess)
        .send()
        .await
        .expect("request");
    assert_eq!(res.status(), 429);
    assert_eq!(
        res.headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("600"),
        "the whole lock"
    );
    // The same guesses padded past 16 KiB, respelled, or compressed: none reaches the app.
    let padded = format!(
        r#"{{"email":"ceo@example.com","password":"guess","pad":"{}"}}"#,
        "p".repeat(17 * 1024)
    );
    let mut statuses = std::collections::BTreeMap::<u16, u32>::new();
    for _ in 0..100 {
        *statuses
            .entry(send(&gw, path, stranger, &[JSON], padded.clone()).await)
            .or_default() += 1;
    }
    assert_eq!(statuses, [(413, 100)].into_iter().collect());
    for respelled in [
        r#"{"email":" CEO@Example.com. ","password":"guess"}"#,
        r#"{"email":"ceo+x@example.com","password":"guess"}"#,
        r#"{"email":"decoy@x.test","email":"ceo@example.com","password":"guess"}"#,
        "{\"email\":\"ceo\u{200b}@example.com\",\"password\":\"guess\"}",
    ] {
        assert_eq!(
            send(&gw, path, stranger, &[JSON], respelled).await,
            429,
            "{respelled}"
        );
    }
    let form = "email=ceo%40example.com&password=guess&pad=".to_owned() + &"q".repeat(17 * 1024);
    assert_eq!(send(&gw, path, stranger, &[FORM], form).await, 413);
    assert_eq!(
        app.count("ceo@example.com").await.1,
        5,
        "only the five guesses before the lock reached the app"
    );
    // The owner, who never failed, signs in from an address of its own.
    let owner = r#"{"email":"ceo@example.com","password":"right"}"#;
    assert_eq!(send(&gw, path, "192.0.2.10", &[JSON], owner).await, 200);
    // A guesser with a fresh address per guess is locked nowhere, and meets the per-account
    // ceiling: 50 wrong answers in all (the stranger's five among them), then refusals.
    let mut admitted = 0;
    for i in 0..60 {
        let body = r#"{"email":"ceo@example.com","password":"guess"}"#;
        if send(&gw, path, &format!("198.18.0.{i}"), &[JSON], body).await == 401 {
            admitted += 1;
        }
    }
    // The owner's success is given back after its answer: at most one still counted.
    assert!(
        (44..=45).contains(&admitted),
        "the ceiling's 50, less the stranger's five: {admitted}"
    );
}

/// A body trickled to a `body:` route is cut off by the pace rules the proxy holds every body
/// to (here 100 bytes a second on average after 5 s), answered 408 and never forwarded.
#[tokio::test]
async fn a_body_trickled_to_a_body_route_is_cut_off_at_the_minimum_rate() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Some(app) = express() else { return };
    let gw = Launch::serve()
        .config_toml(EMAIL.replace("[server]\n", "[server]\nbody_min_rate = 100\n"))
        .upstream(&app.url())
        .admin()
        .spawn();
    let body = format!(
        r#"{{"email":"trickle@example.com","pad":"{}"}}"#,
        "t".repeat(900)
    );
    let addr = gw.url("").trim_start_matches("http://").to_owned();
    let mut conn = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    let head = format!(
        "POST /auth/forgot-password HTTP/1.1\r\nhost: x\r\nx-forwarded-for: 198.51.100.9\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).await.expect("head");
    // A byte every 200 ms: 5 bytes a second, for at most the whole body's 190 s; the gateway
    // answers long before.
    let mut answer = Vec::new();
    for b in body.as_bytes() {
        if conn.write_all(&[*b]).await.is_err() {
            break;
        }
        let mut buf = [0u8; 4096];
        match tokio::time::timeout(Duration::from_millis(200), conn.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => {
                answer.extend_from_slice(&buf[..n]);
                break;
            }
            Err(_) => {}
        }
    }
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert_eq!(app.count("trickle@example.com").await.0, 0);
    assert_eq!(
        gw.metric("fleet_limiter_bodies_refused_total{reason=\"too-slow\"}")
            .await,
        Some(1.0)
    );
}

/// The body fields a route's limiters read are remembered per path in bounded slots. A flood of
/// fresh paths from many connections at once evicts the body route's answer, again and again;
/// its next request is still read for the field, and metered by the recipient's budget (three),
/// whichever address it comes from. Any upstream will do: the gateway's reading is tested.
#[tokio::test]
async fn a_flood_of_fresh_paths_never_lets_a_body_route_skip_its_field() {
    let up = common::upstream().await;
    let gw = std::sync::Arc::new(
        Launch::serve()
            .config_toml(EMAIL)
            .upstream(&up.uri())
            .spawn(),
    );
    let body = r#"{"email":"victim@example.com"}"#;
    for wave in 0..6u32 {
        let mut tasks = Vec::new();
        for worker in 0..8u32 {
            let gw = gw.clone();
            tasks.push(tokio::spawn(async move {
                for i in 0..128u32 {
                    let p = format!("/auth/{wave}/{worker}/{i}");
                    let status = send(&gw, &p, "198.51.100.7", &[JSON], body).await;
                    assert_eq!(status, 200, "{p}");
                }
            }));
        }
        for t in tasks {
            t.await.expect("flood task");
        }
        let status = send(
            &gw,
            "/auth/forgot-password",
            &format!("203.0.113.{wave}"),
            &[JSON],
            body,
        )
        .await;
        let expected = if wave < 3 { 200 } else { 429 };
        assert_eq!(status, expected, "wave {wave}");
    }
}
