//! TLS through the real binary, with certificates made here by a test CA: an `https://`
//! upstream (a real TLS server that echoes the path and counts its handshakes), a certificate
//! the gateway must refuse at start and per request, and TLS on the traffic listener with its
//! certificate replaced on SIGHUP while an open connection keeps working.

mod common;

use common::{Gateway, Launch, PATIENCE};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose, SerialNumber,
};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

/// A certificate authority made for one test.
struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

/// A leaf certificate and its key, PEM and DER.
struct Leaf {
    cert_pem: String,
    key_pem: String,
    der: Vec<u8>,
}

impl Ca {
    fn new(name: &str) -> Self {
        let key = KeyPair::generate().expect("CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).expect("CA certificate");
        Self { cert, key }
    }

    fn pem(&self) -> String {
        self.cert.pem()
    }

    /// A server certificate for `localhost` and `127.0.0.1`.
    fn leaf(&self, common_name: &str, serial: u64) -> Leaf {
        let key = KeyPair::generate().expect("leaf key");
        let mut params =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
                .expect("leaf params");
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.serial_number = Some(SerialNumber::from(serial));
        let cert = params
            .signed_by(&key, &self.cert, &self.key)
            .expect("leaf certificate");
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().to_vec(),
        }
    }
}

/// Files in a temporary directory (CA bundles, certificates, keys).
struct Files(tempfile::TempDir);

impl Files {
    fn new() -> Self {
        Self(tempfile::tempdir().expect("temp dir"))
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.0.path().join(name);
        std::fs::write(&path, text).expect("write file");
        path
    }
}

/// An HTTPS/1.1 server on a loopback port: answers every request `200` with the request
/// target as body and the `Host` it got in `x-upstream-host`, keeps connections alive, and
/// counts completed TLS handshakes.
struct TlsUpstream {
    addr: SocketAddr,
    handshakes: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TlsUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TlsUpstream {
    async fn start(leaf: &Leaf) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        Self::on(listener, leaf)
    }

    fn on(listener: tokio::net::TcpListener, leaf: &Leaf) -> Self {
        let certs = rustls_pemfile::certs(&mut leaf.cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .expect("certificate PEM");
        let key = rustls_pemfile::private_key(&mut leaf.key_pem.as_bytes())
            .expect("key PEM")
            .expect("a private key");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .expect("server config");
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let addr = listener.local_addr().expect("local addr");
        let handshakes = Arc::new(AtomicUsize::new(0));
        let count = handshakes.clone();
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                let count = count.clone();
                tokio::spawn(async move {
                    if let Ok(tls) = acceptor.accept(tcp).await {
                        count.fetch_add(1, Ordering::SeqCst);
                        echo(tls).await;
                    }
                });
            }
        });
        Self {
            addr,
            handshakes,
            task,
        }
    }

    fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.addr.port())
    }

    fn handshakes(&self) -> usize {
        self.handshakes.load(Ordering::SeqCst)
    }
}

/// Answer HTTP/1.1 requests on one connection until the peer closes it.
async fn echo<S>(stream: S)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut s = BufReader::new(stream);
    loop {
        let mut target = None;
        let mut host = String::new();
        let mut length = 0usize;
        loop {
            let mut line = String::new();
            match s.read_line(&mut line).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            let line = line.trim_end();
            if target.is_none() {
                target = Some(line.split(' ').nth(1).unwrap_or("").to_owned());
                continue;
            }
            if line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                match name.trim().to_ascii_lowercase().as_str() {
                    "host" => host = value.trim().to_owned(),
                    "content-length" => length = value.trim().parse().unwrap_or(0),
                    _ => {}
                }
            }
        }
        if length > 0 {
            let mut body = vec![0; length];
            if s.read_exact(&mut body).await.is_err() {
                return;
            }
        }
        let target = target.unwrap_or_default();
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nx-upstream-host: {host}\r\n\r\n{target}",
            target.len()
        );
        let out = s.get_mut();
        if out.write_all(answer.as_bytes()).await.is_err() || out.flush().await.is_err() {
            return;
        }
    }
}

/// A heartbeat, metered by the built-in `agent-device` limiter.
async fn heartbeat(client: &reqwest::Client, url: &str) -> reqwest::Response {
    client
        .post(url)
        .header("x-agent-id", "agent-tls-1")
        .send()
        .await
        .expect("POST through the gateway")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_upstream_answers_through_a_kept_alive_connection() {
    let ca = Ca::new("upstream test CA");
    let files = Files::new();
    let ca_file = files.write("upstream-ca.pem", &ca.pem());
    let upstream = TlsUpstream::start(&ca.leaf("upstream", 1)).await;
    let gw = Gateway::serve()
        .upstream(&upstream.url())
        .env(
            "FLEET_LIMITER_UPSTREAM_CA_FILE",
            ca_file.display().to_string(),
        )
        .spawn();
    let client = common::client();
    let requests = 8;
    for _ in 0..requests {
        let res = heartbeat(&client, &gw.url("/api/agent/heartbeat")).await;
        assert_eq!(res.status(), 200, "{}", gw.stderr());
        assert!(
            res.headers().contains_key("ratelimit"),
            "limit headers on a proxied answer: {:?}",
            res.headers()
        );
        assert_eq!(res.text().await.expect("body"), "/api/agent/heartbeat");
    }
    // One handshake at start (the certificate check), then at most one connection per
    // gateway worker, reused by every request after it.
    let handshakes = upstream.handshakes();
    assert!(
        (1..requests / 2).contains(&handshakes),
        "{handshakes} TLS handshakes for {requests} requests"
    );
    // A request without Host gets the upstream URL's authority.
    let raw = tokio::task::spawn_blocking({
        let addr = gw.addr;
        move || common::raw_request(addr, b"GET /no-host HTTP/1.0\r\n\r\n")
    })
    .await
    .expect("raw request");
    assert_eq!(raw.status, 200, "{}", gw.stderr());
    assert_eq!(
        raw.header("x-upstream-host"),
        Some(format!("127.0.0.1:{}", upstream.addr.port()).as_str())
    );
    assert_eq!(raw.body, b"/no-host");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_certificate_from_an_unknown_ca_stops_start_up() {
    let ca = Ca::new("upstream test CA");
    let other = Ca::new("some other CA");
    let files = Files::new();
    let other_file = files.write("other-ca.pem", &other.pem());
    let upstream = TlsUpstream::start(&ca.leaf("upstream", 1)).await;
    let out = Launch::serve()
        .upstream(&upstream.url())
        .env(
            "FLEET_LIMITER_UPSTREAM_CA_FILE",
            other_file.display().to_string(),
        )
        .run(PATIENCE);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains("flag --upstream: server.upstream:")
            && out.stderr.contains("does not verify")
            && out.stderr.contains("UnknownIssuer")
            && out.stderr.contains("server.upstream_ca_file"),
        "{}",
        out.stderr
    );
    assert!(upstream.handshakes() == 0, "no handshake completes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_https_upstream_starts_and_a_bad_certificate_later_is_a_502() {
    let ca = Ca::new("upstream test CA");
    let other = Ca::new("some other CA");
    let files = Files::new();
    let ca_file = files.write("upstream-ca.pem", &ca.pem());
    // Nothing listens at start: the gateway starts, as with a plain upstream.
    let port = common::free_port();
    let gw = Gateway::serve()
        .upstream(&format!("https://127.0.0.1:{port}"))
        .env(
            "FLEET_LIMITER_UPSTREAM_CA_FILE",
            ca_file.display().to_string(),
        )
        .spawn();
    let client = common::client();
    let res = heartbeat(&client, &gw.url("/api/agent/heartbeat")).await;
    assert_eq!(res.status(), 502);
    // Then a server shows up there with a certificate of another CA.
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("bind the upstream's port");
    let _upstream = TlsUpstream::on(listener, &other.leaf("impostor", 7));
    let res = heartbeat(&client, &gw.url("/api/agent/heartbeat")).await;
    assert_eq!(res.status(), 502);
    assert_eq!(
        res.headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("application/problem+json")
    );
    let deadline = Instant::now() + PATIENCE;
    while !gw.stderr().contains("UnknownIssuer") && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let log = gw.stderr();
    assert!(
        log.lines().any(|l| l.contains("service=\"upstream\"")
            && l.contains("TLS handshake")
            && l.contains("UnknownIssuer")),
        "{log}"
    );
}

/// A client of the gateway's TLS listener that trusts `ca` only, and reports the certificate
/// each answer came over.
fn tls_client(ca: &Ca) -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(ca.pem().as_bytes()).expect("CA"))
        .tls_info(true)
        .timeout(PATIENCE)
        .build()
        .expect("TLS client")
}

/// The DER of the certificate the gateway showed for this answer's connection.
fn peer_certificate(res: &reqwest::Response) -> Vec<u8> {
    res.extensions()
        .get::<reqwest::tls::TlsInfo>()
        .and_then(|i| i.peer_certificate())
        .map(<[u8]>::to_vec)
        .expect("the answer came over TLS")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listener_serves_tls_and_takes_a_new_certificate_on_sighup() {
    let ca = Ca::new("gateway test CA");
    let files = Files::new();
    let first = ca.leaf("gateway-one", 1);
    let cert_file = files.write("cert.pem", &first.cert_pem);
    let key_file = files.write("key.pem", &first.key_pem);
    let upstream = common::upstream().await;
    let gw = Gateway::serve()
        .upstream(&upstream.uri())
        .env(
            "FLEET_LIMITER_TLS_CERT_FILE",
            cert_file.display().to_string(),
        )
        .env("FLEET_LIMITER_TLS_KEY_FILE", key_file.display().to_string())
        .admin()
        .log("info")
        .spawn();
    let url = format!("https://localhost:{}/api/agent/heartbeat", gw.addr.port());
    let kept = tls_client(&ca);
    let res = heartbeat(&kept, &url).await;
    assert_eq!(res.status(), 200, "{}", gw.stderr());
    assert!(
        res.headers().contains_key("ratelimit"),
        "{:?}",
        res.headers()
    );
    assert_eq!(peer_certificate(&res), first.der);
    assert_eq!(res.text().await.expect("body"), "ok");
    // Plain HTTP on the TLS port gets no answer.
    assert!(common::client()
        .get(gw.url("/api/agent/heartbeat"))
        .send()
        .await
        .is_err());

    // New files, then SIGHUP: new connections get the new certificate.
    let second = ca.leaf("gateway-two", 2);
    std::fs::write(&cert_file, &second.cert_pem).expect("rewrite certificate");
    std::fs::write(&key_file, &second.key_pem).expect("rewrite key");
    gw.signal("HUP");
    // Polled on a path no limiter meters, so that waiting never spends a budget.
    let unmetered = format!("https://localhost:{}/tls-poll", gw.addr.port());
    let deadline = Instant::now() + PATIENCE;
    loop {
        let res = tls_client(&ca)
            .get(&unmetered)
            .send()
            .await
            .expect("GET over TLS");
        assert_eq!(res.status(), 200);
        if peer_certificate(&res) == second.der {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "new connections never got the new certificate; log:\n{}",
            gw.stderr()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The connection opened before the reload is still served, with the certificate it was
    // made with (a new connection would have shown the second one).
    let res = heartbeat(&kept, &url).await;
    assert_eq!(res.status(), 200);
    assert_eq!(peer_certificate(&res), first.der);

    // A key that does not belong to the certificate: the reload is rejected and the second
    // certificate stays.
    let third = ca.leaf("gateway-three", 3);
    std::fs::write(&cert_file, &third.cert_pem).expect("rewrite certificate");
    let rejected = common::client()
        .post(gw.admin("/reload"))
        .send()
        .await
        .expect("POST /reload");
    assert_eq!(rejected.status(), 422);
    let body = rejected.text().await.expect("reload answer");
    assert!(
        body.contains("server.tls_cert_file") && body.contains("does not belong"),
        "{body}"
    );
    let res = tls_client(&ca)
        .get(&unmetered)
        .send()
        .await
        .expect("GET over TLS");
    assert_eq!(res.status(), 200);
    assert_eq!(peer_certificate(&res), second.der);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_files_that_cannot_be_used_stop_start_up_naming_the_setting() {
    let files = Files::new();
    let ca = Ca::new("gateway test CA");
    let leaf = ca.leaf("gateway-one", 1);
    let other = ca.leaf("gateway-other", 2);
    let cert = files.write("cert.pem", &leaf.cert_pem);
    let wrong_key = files.write("other-key.pem", &other.key_pem);
    let missing = files.0.path().join("missing-ca.pem");
    let cases = [
        (
            vec![(
                "FLEET_LIMITER_UPSTREAM_CA_FILE",
                missing.display().to_string(),
            )],
            "https://127.0.0.1:9",
            "environment variable FLEET_LIMITER_UPSTREAM_CA_FILE: server.upstream_ca_file:",
        ),
        (
            vec![("FLEET_LIMITER_TLS_CERT_FILE", cert.display().to_string())],
            "http://127.0.0.1:9",
            "environment variable FLEET_LIMITER_TLS_CERT_FILE: server.tls_cert_file: is set but server.tls_key_file is not",
        ),
        (
            vec![
                ("FLEET_LIMITER_TLS_CERT_FILE", cert.display().to_string()),
                ("FLEET_LIMITER_TLS_KEY_FILE", wrong_key.display().to_string()),
            ],
            "http://127.0.0.1:9",
            "does not belong to the certificate",
        ),
    ];
    for (env, upstream, expected) in cases {
        let out = Launch::serve().upstream(upstream).envs(env).run(PATIENCE);
        assert_eq!(out.code, Some(2), "{}", out.stderr);
        assert!(
            out.stderr.contains("configuration error") && out.stderr.contains(expected),
            "expected {expected:?} in:\n{}",
            out.stderr
        );
    }
}

/// A WebSocket upgrade reaches an `https://` upstream over TLS too (its connection is opened
/// like the pool's, then spliced), and messages echo both ways.
#[tokio::test]
async fn a_websocket_passes_through_to_an_https_upstream() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;

    let ca = Ca::new("websocket upstream test CA");
    let files = Files::new();
    let ca_file = files.write("ws-ca.pem", &ca.pem());
    let leaf = ca.leaf("ws-upstream", 7);
    let certs = rustls_pemfile::certs(&mut leaf.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .expect("certificate PEM");
    let key = rustls_pemfile::private_key(&mut leaf.key_pem.as_bytes())
        .expect("key PEM")
        .expect("a private key");
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("protocol versions")
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .expect("server config");
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let upgraded = Arc::new(AtomicUsize::new(0));
    let seen = upgraded.clone();
    let task = tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            let seen = seen.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                // The start-up certificate check connects and leaves: only a handshake that
                // asks for a WebSocket gets this far.
                let Ok(mut ws) = tokio_tungstenite::accept_async(tls).await else {
                    return;
                };
                seen.fetch_add(1, Ordering::SeqCst);
                while let Some(Ok(msg)) = ws.next().await {
                    if msg.is_close() || ws.send(msg).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    let gw = Gateway::serve()
        .upstream(&format!("https://127.0.0.1:{port}"))
        .env(
            "FLEET_LIMITER_UPSTREAM_CA_FILE",
            ca_file.display().to_string(),
        )
        .spawn();
    let url = format!("ws://127.0.0.1:{}/ws/live", gw.addr.port());
    let (mut ws, res) = tokio::time::timeout(PATIENCE, tokio_tungstenite::connect_async(url))
        .await
        .expect("handshake in time")
        .unwrap_or_else(|e| panic!("handshake through the gateway: {e}\n{}", gw.stderr()));
    assert_eq!(res.status().as_u16(), 101);
    for text in ["one", "two over TLS"] {
        ws.send(Message::text(text)).await.expect("send");
        let back = tokio::time::timeout(PATIENCE, ws.next())
            .await
            .expect("echo in time")
            .expect("a message")
            .expect("not an error");
        assert_eq!(back.into_text().expect("text").as_str(), text);
    }
    ws.send(Message::binary(vec![0u8, 1, 2, 255]))
        .await
        .expect("send binary");
    let back = tokio::time::timeout(PATIENCE, ws.next())
        .await
        .expect("echo in time")
        .expect("a message")
        .expect("not an error");
    assert_eq!(back.into_data().as_ref(), [0u8, 1, 2, 255]);
    assert_eq!(upgraded.load(Ordering::SeqCst), 1);
    let _ = ws.close(None).await;
    task.abort();
}
