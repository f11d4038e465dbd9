//! HTTP/2 on the TLS listener, against the real binary: the gateway speaks HTTP/1.1 only, so a
//! header block built to flood an HTTP/2 header decoder (25 KB of fields, or 25 000 distinct
//! names: past what `http::HeaderMap` holds, which panics the connection task of an HTTP/2
//! server that decodes it) never reaches one. A client offering only `h2` is refused in the TLS
//! handshake, one offering both gets HTTP/1.1, and one that speaks HTTP/2 without asking gets
//! an HTTP/1.1 400; no attempt panics, and memory stays flat over many.

mod common;

use common::{Gateway, PATIENCE};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A test CA and a leaf for `localhost`, written as PEM files.
struct Certs {
    ca_pem: String,
    cert_file: PathBuf,
    key_file: PathBuf,
    _dir: tempfile::TempDir,
}

fn certs() -> Certs {
    let ca_key = KeyPair::generate().expect("CA key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, "http2 test CA");
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca = params.self_signed(&ca_key).expect("CA certificate");
    let key = KeyPair::generate().expect("leaf key");
    let leaf = CertificateParams::new(vec!["localhost".to_owned()])
        .expect("leaf params")
        .signed_by(&key, &ca, &ca_key)
        .expect("leaf certificate");
    let dir = tempfile::tempdir().expect("temp dir");
    let cert_file = dir.path().join("cert.pem");
    let key_file = dir.path().join("key.pem");
    std::fs::write(&cert_file, leaf.pem()).expect("write certificate");
    std::fs::write(&key_file, key.serialize_pem()).expect("write key");
    Certs {
        ca_pem: ca.pem(),
        cert_file,
        key_file,
        _dir: dir,
    }
}

fn tls_gateway(certs: &Certs, upstream: &str) -> Gateway {
    Gateway::serve()
        .upstream(upstream)
        .env(
            "FLEET_LIMITER_TLS_CERT_FILE",
            certs.cert_file.display().to_string(),
        )
        .env(
            "FLEET_LIMITER_TLS_KEY_FILE",
            certs.key_file.display().to_string(),
        )
        .admin()
        .spawn()
}

/// A TLS connection to the gateway offering the ALPN protocols `alpn` (none: no ALPN).
async fn connect(
    addr: SocketAddr,
    ca_pem: &str,
    alpn: &[&[u8]],
) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, std::io::Error> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut ca_pem.as_bytes()) {
        roots.add(cert.expect("CA PEM")).expect("CA certificate");
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("protocol versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("server name");
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
}

/// An HPACK header block for `GET /` with `fields` literal fields of distinct names (`x0`,
/// `x1`, …, not indexed, not Huffman-coded), each with the value `v`.
fn header_block(fields: usize) -> Vec<u8> {
    // :method GET, :scheme https, :path / (static table), :authority localhost (literal).
    let mut b = vec![0x82, 0x87, 0x84, 0x01, 9];
    b.extend_from_slice(b"localhost");
    for i in 0..fields {
        let name = format!("x{i:x}");
        b.push(0x00);
        b.push(name.len() as u8);
        b.extend_from_slice(name.as_bytes());
        b.extend_from_slice(&[1, b'v']);
    }
    b
}

/// The HTTP/2 client preface, an empty SETTINGS frame, and `block` as one request's HEADERS
/// frame and as many CONTINUATION frames as 16 KiB frames take.
fn h2_request(block: &[u8]) -> Vec<u8> {
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
    let frames: Vec<&[u8]> = block.chunks(16_384).collect();
    for (i, payload) in frames.iter().enumerate() {
        let len = payload.len();
        // HEADERS (END_STREAM) first, then CONTINUATION; END_HEADERS on the last.
        let (kind, mut flags) = if i == 0 { (0x1, 0x1) } else { (0x9, 0x0) };
        if i + 1 == frames.len() {
            flags |= 0x4;
        }
        out.extend_from_slice(&[
            (len >> 16) as u8,
            (len >> 8) as u8,
            len as u8,
            kind,
            flags,
            0,
            0,
            0,
            1,
        ]);
        out.extend_from_slice(payload);
    }
    out
}

/// Send `bytes` on a TLS connection that negotiated no protocol and read what comes back until
/// the gateway closes it.
async fn send_raw(addr: SocketAddr, ca_pem: &str, bytes: &[u8]) -> Vec<u8> {
    let mut tls = connect(addr, ca_pem, &[]).await.expect("TLS without ALPN");
    assert_eq!(tls.get_ref().1.alpn_protocol(), None);
    // The gateway may close before it has read everything: a failed write is fine.
    let _ = tls.write_all(bytes).await;
    let mut got = Vec::new();
    let read = tokio::time::timeout(PATIENCE, async {
        let mut buf = [0u8; 4096];
        loop {
            match tls.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(read.is_ok(), "the gateway never closed the connection");
    got
}

/// The h2 client's request with `headers`, over a connection offering ALPN `alpn`.
async fn h2_client_request(
    addr: SocketAddr,
    ca_pem: &str,
    alpn: &[&[u8]],
    headers: &[(String, String)],
) -> Result<http::StatusCode, String> {
    let tls = connect(addr, ca_pem, alpn)
        .await
        .map_err(|e| format!("TLS: {e}"))?;
    let (send, conn) = h2::client::handshake(tls)
        .await
        .map_err(|e| format!("h2 handshake: {e}"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut req = http::Request::builder().uri(format!("https://localhost:{}/h2", addr.port()));
    for (name, value) in headers {
        req = req.header(name, value);
    }
    let req = req.body(()).map_err(|e| e.to_string())?;
    let mut send = send.ready().await.map_err(|e| format!("h2 ready: {e}"))?;
    let (answer, _) = send
        .send_request(req, true)
        .map_err(|e| format!("h2 send: {e}"))?;
    match tokio::time::timeout(PATIENCE, answer).await {
        Ok(Ok(res)) => Ok(res.status()),
        Ok(Err(e)) => Err(format!("h2 answer: {e}")),
        Err(_) => Err("no h2 answer in time".to_owned()),
    }
}

/// A header list of about 25 KB: 1 000 fields of 20-byte values.
fn header_list_25kb() -> Vec<(String, String)> {
    (0..1000)
        .map(|i| (format!("x-flood-{i}"), "abcdefghijklmnopqrst".to_owned()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_is_never_spoken_so_a_header_flood_reaches_no_decoder() {
    let certs = certs();
    let upstream = common::upstream().await;
    let gw = tls_gateway(&certs, &upstream.uri());
    let ca = certs.ca_pem.as_str();

    // Offering only h2: refused in the TLS handshake, before any HTTP is read.
    let only_h2 = connect(gw.addr, ca, &[b"h2"]).await;
    let e = only_h2
        .expect_err("an h2-only client is refused")
        .to_string();
    assert!(e.contains("NoApplicationProtocol"), "{e}");
    // The h2 client with the 25 KB header list, offering h2: refused the same way.
    let refused = h2_client_request(gw.addr, ca, &[b"h2"], &header_list_25kb()).await;
    assert!(
        refused
            .as_ref()
            .is_err_and(|e| e.contains("NoApplicationProtocol")),
        "{refused:?}"
    );
    // Offering both: HTTP/1.1.
    let both = connect(gw.addr, ca, &[b"h2", b"http/1.1"])
        .await
        .expect("TLS offering h2 and http/1.1");
    assert_eq!(both.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    drop(both);

    // Speaking HTTP/2 without asking (prior knowledge): the preface is not HTTP/1.1, so the
    // answer is a 400 and the connection closes, whatever the header block holds.
    for fields in [3_000, 25_000] {
        let block = header_block(fields);
        let answer = send_raw(gw.addr, ca, &h2_request(&block)).await;
        let head = String::from_utf8_lossy(&answer[..answer.len().min(64)]).into_owned();
        assert!(
            head.starts_with("HTTP/1.1 400"),
            "{fields} fields ({} bytes of header block): {head:?}",
            block.len()
        );
    }
    // The h2 client with the 25 KB header list, offering nothing: no HTTP/2 answer.
    let prior = h2_client_request(gw.addr, ca, &[], &header_list_25kb()).await;
    assert!(prior.is_err(), "{prior:?}");

    // Still serving, over HTTP/1.1, with 25 KB of headers (in fewer, longer fields: an
    // HTTP/1.1 head holds at most 96).
    let client = tls_client(ca);
    let url = format!("https://localhost:{}/after", gw.addr.port());
    let mut req = client.get(&url);
    for i in 0..25 {
        req = req.header(format!("x-long-{i}"), "v".repeat(1000));
    }
    let res = req.send().await.expect("HTTPS/1.1 request");
    assert_eq!(res.status(), 200);
    assert_eq!(res.version(), reqwest::Version::HTTP_11);
    assert!(!gw.stderr().contains("panicked"), "{}", gw.stderr());
    assert_eq!(
        common::received(&upstream).await,
        1,
        "only the HTTP/1.1 request got through"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_header_floods_leave_memory_flat_and_log_no_panic() {
    let certs = certs();
    let upstream = common::upstream().await;
    let gw = tls_gateway(&certs, &upstream.uri());
    let ca = certs.ca_pem.as_str();
    let flood = h2_request(&header_block(25_000));
    let small = h2_request(&header_block(3_000));
    let attempt = |bytes: Vec<u8>| {
        let ca = ca.to_owned();
        let addr = gw.addr;
        async move {
            let answer = send_raw(addr, &ca, &bytes).await;
            assert!(answer.starts_with(b"HTTP/1.1 400"), "{answer:?}");
            let refused = connect(addr, &ca, &[b"h2"]).await;
            assert!(refused.is_err());
        }
    };
    // Warm up: the workers' buffers and TLS state reach their working size.
    for _ in 0..20 {
        attempt(flood.clone()).await;
    }
    let before = gw.rss_kib();
    for i in 0..200 {
        attempt(if i % 2 == 0 {
            flood.clone()
        } else {
            small.clone()
        })
        .await;
    }
    // Give closed connections a moment to be released.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let after = gw.rss_kib();
    // One flood decoded by an HTTP/2 server here grew it by about 225 MB.
    assert!(
        after < before + 16 * 1024,
        "resident memory grew from {before} KiB to {after} KiB over 200 attempts"
    );
    let log = gw.stderr();
    assert!(!log.contains("panicked"), "{log}");
    assert_eq!(common::received(&upstream).await, 0);
}

/// An HTTPS/1.1 client of the gateway's TLS listener that trusts the test CA.
fn tls_client(ca_pem: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(ca_pem.as_bytes()).expect("CA"))
        .timeout(PATIENCE)
        .build()
        .expect("TLS client")
}
