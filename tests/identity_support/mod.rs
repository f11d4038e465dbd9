//! A small harness for the identity tests: the real `fleet-limiter` binary on a free port in
//! front of a wiremock upstream, test-key token minting, and a JWKS endpoint.

#![allow(dead_code)]

use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::{json, Value};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

pub const BIN: &str = env!("CARGO_BIN_EXE_fleet-limiter");

macro_rules! fixture {
    ($name:literal) => {
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/keys/",
            $name
        ))
    };
}

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

/// An upstream that answers 200 to everything.
pub async fn upstream() -> MockServer {
    let s = MockServer::start().await;
    Mock::given(wiremock::matchers::any())
        .respond_with(ResponseTemplate::new(200).set_body_string("ok"))
        .mount(&s)
        .await;
    s
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

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// The running binary; killed when dropped.
pub struct Gateway {
    child: Child,
    pub addr: SocketAddr,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

fn command(env: &[(&str, &str)], args: &[&str], log: &std::path::Path) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("FLEET_LIMITER_") {
            cmd.env_remove(k);
        }
    }
    cmd.env("FLEET_LIMITER_LOG", "info");
    // These tests pin budgets (tiny or stretched) that the start-up calibration check refuses;
    // that check has its own tests in tests/calibration.rs.
    cmd.env("FLEET_LIMITER_ALLOW_UNSAFE_CALIBRATION", "true");
    // Many gateways run at once: each admin listener takes a free port.
    cmd.env("FLEET_LIMITER_ADMIN_LISTEN", "127.0.0.1:0");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let file = std::fs::File::create(log).expect("log file");
    cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(file);
    cmd
}

impl Gateway {
    /// Start the gateway on a free port and wait until it has bound it (a port taken in the
    /// meantime by another process is retried on a new one).
    pub fn spawn(upstream: &str, env: &[(&str, &str)]) -> Self {
        for _ in 0..5 {
            if let Some(gw) = Self::try_spawn(upstream, env) {
                return gw;
            }
        }
        panic!("fleet-limiter could not bind a free port in 5 attempts");
    }

    fn try_spawn(upstream: &str, env: &[(&str, &str)]) -> Option<Self> {
        let dir = tempfile::tempdir().expect("temp dir");
        let log = dir.path().join("stderr.log");
        let addr: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let listen = addr.to_string();
        let child = command(
            env,
            &["serve", "--listen", &listen, "--upstream", upstream],
            &log,
        )
        .spawn()
        .expect("spawn fleet-limiter");
        let mut gw = Self {
            child,
            addr,
            log,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        // The start-up line is logged only once the listener is bound.
        while !(gw.stderr().contains("fleet-limiter gateway started")
            && TcpStream::connect(addr).is_ok())
        {
            if let Ok(Some(status)) = gw.child.try_wait() {
                let log = gw.stderr();
                if log.contains("cannot listen") {
                    return None;
                }
                panic!("fleet-limiter exited with {status}: {log}");
            }
            assert!(
                Instant::now() < deadline,
                "fleet-limiter did not start: {}",
                gw.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(gw)
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Run the binary to completion (it is expected to refuse to start): exit code and stderr.
pub fn run_to_exit(env: &[(&str, &str)]) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("stderr.log");
    let listen = format!("127.0.0.1:{}", free_port());
    let mut child = command(
        env,
        &[
            "serve",
            "--listen",
            &listen,
            "--upstream",
            "http://127.0.0.1:9",
        ],
        &log,
    )
    .spawn()
    .expect("spawn fleet-limiter");
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "fleet-limiter kept running: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (
        status.code(),
        std::fs::read_to_string(&log).unwrap_or_default(),
    )
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
