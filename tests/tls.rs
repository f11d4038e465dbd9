//! TLS to the services the gateway calls, end to end through the real binary: a `redis-server`
//! listening with `--tls-port`, and an HTTPS JWKS endpoint, each with certificates made here by
//! a test CA. A server whose certificate comes from another CA must be refused, naming the
//! setting. Without a TLS-capable `redis-server` the Redis tests are skipped (failed under `CI`).

mod common;
mod identity_support;
mod redis_support;

use common::{Launch, PATIENCE};
use identity_support::{claims, jwk, sign, RSA_A};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
use redis_support::{gateway, unavailable, upstream};
use std::io::Read;
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const UI: &str = "/api/agents";

/// A test CA and a server certificate it signed for `localhost` and `127.0.0.1`, as files.
struct Pki {
    dir: tempfile::TempDir,
    ca_der: Vec<u8>,
    cert_der: Vec<u8>,
    key_der: Vec<u8>,
}

impl Pki {
    fn new(name: &str) -> Pki {
        let ca_key = KeyPair::generate().expect("CA key");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, format!("{name} test CA"));
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca.self_signed(&ca_key).expect("CA certificate");
        let key = KeyPair::generate().expect("server key");
        let mut leaf = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
            .expect("server params");
        leaf.distinguished_name
            .push(DnType::CommonName, "localhost");
        let cert = leaf
            .signed_by(&key, &ca_cert, &ca_key)
            .expect("server certificate");
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("ca.pem"), ca_cert.pem()).expect("write ca.pem");
        std::fs::write(dir.path().join("server.pem"), cert.pem()).expect("write server.pem");
        std::fs::write(dir.path().join("server.key"), key.serialize_pem()).expect("write key");
        Pki {
            dir,
            ca_der: ca_cert.der().to_vec(),
            cert_der: cert.der().to_vec(),
            key_der: key.serialize_der(),
        }
    }

    fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    fn ca_file(&self) -> String {
        self.path("ca.pem").display().to_string()
    }
}

/// A `redis-server` serving TLS only, killed on drop.
struct TlsRedis {
    port: u16,
    child: Child,
    _dir: tempfile::TempDir,
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `redis-server --port 0 --tls-port <free>` with the PKI's server certificate, or `None` (the
/// test is skipped, or fails under `CI`) when no TLS-capable `redis-server` can be started.
fn tls_redis(pki: &Pki) -> Option<TlsRedis> {
    tls_redis_node(pki, false)
}

/// The same; with `cluster`, a Cluster node whose bus speaks TLS too. A port taken between
/// choosing it and binding it (other tests start servers meanwhile) is retried on a fresh one.
fn tls_redis_node(pki: &Pki, cluster: bool) -> Option<TlsRedis> {
    const ATTEMPTS: u32 = 5;
    let mut why = String::new();
    for _ in 0..ATTEMPTS {
        match start_tls_redis(pki, cluster) {
            Ok(r) => return Some(r),
            Err(Start::Exited(e)) => why = e,
            Err(Start::Unavailable(e)) => {
                unavailable(&e);
                return None;
            }
        }
    }
    unavailable(&format!(
        "redis-server with --tls-port exited {ATTEMPTS} times; is it built with TLS? {why}"
    ));
    None
}

/// Why one start of a TLS `redis-server` gave nothing.
enum Start {
    /// It exited before listening (its port taken meanwhile, or no TLS in this build).
    Exited(String),
    /// It cannot run here at all.
    Unavailable(String),
}

fn start_tls_redis(pki: &Pki, cluster: bool) -> Result<TlsRedis, Start> {
    let port = redis_support::free_cluster_port();
    let dir = tempfile::tempdir().expect("temp dir");
    let mut cmd = Command::new("redis-server");
    if cluster {
        cmd.args(["--cluster-enabled", "yes", "--tls-cluster", "yes"])
            .args(["--cluster-config-file", "nodes.conf"])
            .args(["--cluster-node-timeout", "5000"]);
    }
    let spawned = cmd
        .args(["--port", "0", "--tls-port", &port.to_string()])
        .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .arg("--tls-cert-file")
        .arg(pki.path("server.pem"))
        .arg("--tls-key-file")
        .arg(pki.path("server.key"))
        .arg("--tls-ca-cert-file")
        .arg(pki.path("ca.pem"))
        .args(["--tls-auth-clients", "no"])
        .arg("--dir")
        .arg(dir.path())
        // The reason it stopped, if it does, is in its log.
        .arg("--logfile")
        .arg(dir.path().join("redis.log"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn();
    let mut child =
        spawned.map_err(|e| Start::Unavailable(format!("cannot start redis-server: {e}")))?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            let mut out = std::fs::read_to_string(dir.path().join("redis.log")).unwrap_or_default();
            if let Some(mut e) = child.stderr.take() {
                let _ = e.read_to_string(&mut out);
            }
            let last: Vec<&str> = out.lines().rev().take(3).collect();
            return Err(Start::Exited(format!(
                "({status}) {}",
                last.into_iter().rev().collect::<Vec<_>>().join(" | ")
            )));
        }
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(TlsRedis {
                port,
                child,
                _dir: dir,
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    Err(Start::Unavailable(
        "redis-server with --tls-port never listened".to_owned(),
    ))
}

/// `/readyz` of a gateway, as JSON, with its status code.
async fn readyz(gw: &common::Gateway) -> (u16, serde_json::Value) {
    let r = reqwest::get(gw.admin("/readyz"))
        .await
        .expect("GET /readyz");
    let status = r.status().as_u16();
    (status, r.json().await.expect("readyz JSON"))
}

async fn status(client: &reqwest::Client, url: &str, token: Option<&str>) -> u16 {
    let mut rb = client.get(url);
    if let Some(t) = token {
        rb = rb.header("authorization", format!("Bearer {t}"));
    }
    rb.send().await.expect("request").status().as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_with_a_ca_file_meters_requests_in_redis() {
    let pki = Pki::new("redis");
    let Some(redis) = tls_redis(&pki) else { return };
    let up = upstream();
    let store = format!("rediss://127.0.0.1:{}", redis.port);
    let ca = pki.ca_file();
    let gw = gateway(
        "",
        &up,
        &["--store", &store],
        &[
            ("FLEET_LIMITER_STORE_CA_FILE", ca.as_str()),
            ("FLEET_LIMITER_LIMITER_UI_LIMIT", "2"),
            ("FLEET_LIMITER_LIMITER_UI_ALGORITHM", "fixed-window"),
        ],
    );
    let (code, ready) = readyz(&gw).await;
    assert_eq!(code, 200, "{ready}");
    assert_eq!(ready["store"], "redis", "{ready}");
    let client = reqwest::Client::new();
    let url = gw.url(UI);
    assert_eq!(status(&client, &url, None).await, 200);
    assert_eq!(status(&client, &url, None).await, 200);
    assert_eq!(
        status(&client, &url, None).await,
        429,
        "the third request of 2"
    );
    // The bucket lives in that Redis, reached over TLS.
    let scan = Command::new("redis-cli")
        .args(["--tls", "--cacert", &ca, "-h", "127.0.0.1"])
        .args(["-p", &redis.port.to_string(), "--scan", "--pattern", "fl:*"])
        .output()
        .expect("redis-cli");
    let keys = String::from_utf8_lossy(&scan.stdout);
    assert!(keys.contains("fl:{ui:"), "keys over TLS: {keys:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_from_an_unknown_ca_is_reported_by_readyz_and_says_why() {
    let server = Pki::new("redis");
    let other = Pki::new("other");
    let Some(redis) = tls_redis(&server) else {
        return;
    };
    let up = upstream();
    let store = format!("rediss://127.0.0.1:{}", redis.port);
    let ca = other.ca_file();
    // Like an unreachable Redis: the gateway starts and answers with on_store_error; it stays
    // ready, and the log and /readyz's store fields name the setting and the reason.
    let gw = gateway(
        "",
        &up,
        &["--store", &store],
        &[("FLEET_LIMITER_STORE_CA_FILE", ca.as_str())],
    );
    let (code, ready) = readyz(&gw).await;
    assert_eq!(code, 200, "{ready}");
    assert_eq!(ready["store_up"], false, "{ready}");
    let error = ready["store_error"].as_str().unwrap_or_default();
    assert!(
        error.contains("store.url") && error.contains("not trusted"),
        "{ready}"
    );
    let log = gw.stderr();
    assert!(
        log.contains("store.url") && log.contains("certificate is not trusted"),
        "{log}"
    );
}

/// `redis-cli` over TLS, trusting the PKI's CA.
fn redis_cli(pki: &Pki) -> Command {
    let mut cmd = Command::new("redis-cli");
    cmd.args(["--tls", "--cacert", &pki.ca_file(), "-h", "127.0.0.1"]);
    cmd
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_cluster_over_tls_meters_requests() {
    let pki = Pki::new("cluster");
    let mut nodes = Vec::new();
    for _ in 0..3 {
        let Some(n) = tls_redis_node(&pki, true) else {
            return;
        };
        nodes.push(n);
    }
    let addrs: Vec<String> = nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port))
        .collect();
    let out = redis_cli(&pki)
        .args(["--cluster", "create"])
        .args(&addrs)
        .args(["--cluster-replicas", "0", "--cluster-yes"])
        .output()
        .expect("redis-cli --cluster create");
    assert!(
        out.status.success(),
        "redis-cli --cluster create over TLS failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    'wait: loop {
        assert!(Instant::now() < deadline, "the TLS Cluster never became ok");
        for n in &nodes {
            let info = redis_cli(&pki)
                .args(["-p", &n.port.to_string(), "cluster", "info"])
                .output()
                .expect("redis-cli cluster info");
            if !String::from_utf8_lossy(&info.stdout).contains("cluster_state:ok") {
                std::thread::sleep(Duration::from_millis(100));
                continue 'wait;
            }
        }
        break;
    }
    let urls: Vec<String> = nodes
        .iter()
        .map(|n| format!("\"rediss://127.0.0.1:{}\"", n.port))
        .collect();
    let config = format!(
        "[store]\ncluster = [{}]\ntimeout = \"2s\"\n",
        urls.join(", ")
    );
    let up = upstream();
    let ca = pki.ca_file();
    let gw = gateway(
        &config,
        &up,
        &[],
        &[
            ("FLEET_LIMITER_STORE_CA_FILE", ca.as_str()),
            ("FLEET_LIMITER_LIMITER_UI_LIMIT", "2"),
            ("FLEET_LIMITER_LIMITER_UI_ALGORITHM", "fixed-window"),
        ],
    );
    let (code, ready) = readyz(&gw).await;
    assert_eq!(code, 200, "{ready}\n{}", gw.stderr());
    let client = reqwest::Client::new();
    let url = gw.url(UI);
    assert_eq!(status(&client, &url, None).await, 200);
    assert_eq!(status(&client, &url, None).await, 200);
    assert_eq!(
        status(&client, &url, None).await,
        429,
        "the third request of 2"
    );
    let mut keys = String::new();
    for n in &nodes {
        let scan = redis_cli(&pki)
            .args(["-p", &n.port.to_string(), "--scan", "--pattern", "fl:*"])
            .output()
            .expect("redis-cli --scan");
        keys.push_str(&String::from_utf8_lossy(&scan.stdout));
    }
    assert!(keys.contains("fl:{ui:"), "keys over TLS: {keys:?}");
}

/// An HTTPS server publishing the fixture JWKS (key-a) at any path, on its own thread; counts
/// the requests it answers.
fn https_jwks(pki: &Pki) -> (String, Arc<AtomicUsize>) {
    use rustls::pki_types::{CertificateDer, PrivatePkcs8KeyDer};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_no_client_auth()
        .with_single_cert(
            vec![
                CertificateDer::from(pki.cert_der.clone()),
                CertificateDer::from(pki.ca_der.clone()),
            ],
            PrivatePkcs8KeyDer::from(pki.key_der.clone()).into(),
        )
        .expect("server TLS config");
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.set_nonblocking(true).expect("nonblocking");
    let port = listener.local_addr().expect("addr").port();
    let hits = Arc::new(AtomicUsize::new(0));
    let counted = hits.clone();
    let body = serde_json::json!({"keys": [jwk("a")]}).to_string();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let acceptor = acceptor.clone();
                let body = body.clone();
                let counted = counted.clone();
                tokio::spawn(async move {
                    use tokio::io::{AsyncReadExt, AsyncWriteExt};
                    // A handshake the client refuses ends here.
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let mut req = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                        match tls.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => req.extend_from_slice(&buf[..n]),
                        }
                    }
                    counted.fetch_add(1, Ordering::SeqCst);
                    let head = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = tls.write_all(head.as_bytes()).await;
                    let _ = tls.write_all(body.as_bytes()).await;
                    let _ = tls.shutdown().await;
                });
            }
        });
    });
    (format!("https://localhost:{port}/jwks.json"), hits)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_jwks_with_a_ca_file_verifies_tokens() {
    let pki = Pki::new("issuer");
    let (jwks, hits) = https_jwks(&pki);
    let up = upstream();
    let ca = pki.ca_file();
    let gw = Launch::serve()
        .upstream(&up)
        .log("info")
        .env("FLEET_LIMITER_JWKS_URL", &jwks)
        .env("FLEET_LIMITER_JWKS_CA_FILE", &ca)
        .env("FLEET_LIMITER_LIMITER_UI_LIMIT", "1")
        .env("FLEET_LIMITER_LIMITER_UI_ALGORITHM", "fixed-window")
        .spawn();
    // Fetched once at start.
    assert_eq!(hits.load(Ordering::SeqCst), 1, "{}", gw.stderr());
    let client = reqwest::Client::new();
    let url = gw.url(UI);
    // The IP's bucket (limit 1) is spent...
    assert_eq!(status(&client, &url, None).await, 200);
    assert_eq!(status(&client, &url, None).await, 429);
    // ...but a token signed by the published key is a user of its own.
    let token = sign(Some("key-a"), RSA_A, &claims("user_alice"));
    assert_eq!(status(&client, &url, Some(&token)).await, 200);
    let forged = sign(
        Some("key-a"),
        identity_support::FORGER,
        &claims("user_mallory"),
    );
    assert_eq!(status(&client, &url, Some(&forged)).await, 429);
}

#[test]
fn an_https_jwks_from_an_unknown_ca_stops_the_start() {
    let server = Pki::new("issuer");
    let other = Pki::new("other");
    let (jwks, hits) = https_jwks(&server);
    let up = "http://127.0.0.1:9";
    let exited = Launch::serve()
        .upstream(up)
        .env("FLEET_LIMITER_JWKS_URL", &jwks)
        .env("FLEET_LIMITER_JWKS_CA_FILE", other.ca_file())
        .run(PATIENCE);
    assert_eq!(exited.code, Some(2), "{}", exited.stderr);
    assert!(
        exited.stderr.contains("identity.jwks_url")
            && exited.stderr.contains("certificate is not trusted")
            && exited.stderr.contains("identity.jwks_ca_file"),
        "{}",
        exited.stderr
    );
    assert_eq!(
        hits.load(Ordering::SeqCst),
        0,
        "no request after the refused handshake"
    );

    // Without the CA file the system roots alone do not trust it either.
    let exited = Launch::serve()
        .upstream(up)
        .env("FLEET_LIMITER_JWKS_URL", &jwks)
        .run(PATIENCE);
    assert_eq!(exited.code, Some(2), "{}", exited.stderr);
    assert!(
        exited.stderr.contains("identity.jwks_url"),
        "{}",
        exited.stderr
    );
}

#[test]
fn skipping_verification_warns_naming_the_setting() {
    let server = Pki::new("issuer");
    let (jwks, hits) = https_jwks(&server);
    let gw = Launch::serve()
        .upstream("http://127.0.0.1:9")
        .log("info")
        .env("FLEET_LIMITER_JWKS_URL", &jwks)
        .env("FLEET_LIMITER_JWKS_INSECURE_SKIP_VERIFY", "true")
        .spawn();
    assert_eq!(hits.load(Ordering::SeqCst), 1);
    let log = gw.stderr();
    assert!(
        log.contains("identity.jwks_url") && log.contains("verification is OFF"),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_without_verification_connects_and_warns() {
    let server = Pki::new("redis");
    let Some(redis) = tls_redis(&server) else {
        return;
    };
    let up = upstream();
    let store = format!("rediss://127.0.0.1:{}", redis.port);
    let gw = gateway(
        "",
        &up,
        &["--store", &store],
        &[("FLEET_LIMITER_STORE_INSECURE_SKIP_VERIFY", "true")],
    );
    let (code, ready) = readyz(&gw).await;
    assert_eq!(code, 200, "{ready}");
    let log = gw.stderr();
    assert!(
        log.contains("store.url") && log.contains("verification is OFF"),
        "{log}"
    );
}
