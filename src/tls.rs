//! TLS for the gateway's own connections, on the ring crypto provider only.
//!
//! - [`client_config`]: how an outbound connection (the upstream, and any other service the
//!   gateway calls over TLS) checks the server: the system's trusted roots plus an optional CA
//!   bundle; or, only when asked, not at all, with a warning each time it is built (every start).
//! - [`CertStore`]: the traffic listener's certificate and key, read from PEM files. Every new
//!   connection is served the pair current at its handshake; [`CertStore::set`] replaces it
//!   (a reload), and connections already open keep the one they were made with.

use anyhow::{anyhow, bail, Context as _};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, SignatureScheme};
use std::path::Path;
use std::sync::{Arc, Once};

/// Install ring as the process's default crypto provider, once. One installed before (by
/// another part of the process) is kept: `install_default` then answers `Err`, which is fine.
fn install_provider() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _already_installed = rustls::crypto::ring::default_provider().install_default();
    });
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The TLS client configuration for connections to `service` (named in the warning and in
/// errors): the system's trusted roots plus every certificate in `ca_file` (PEM), if given.
/// With `insecure_skip_verify` no certificate is checked at all, and a warning says so each
/// time this is called.
pub fn client_config(
    service: &str,
    ca_file: Option<&Path>,
    insecure_skip_verify: bool,
) -> Result<Arc<rustls::ClientConfig>, anyhow::Error> {
    install_provider();
    let provider = provider();
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .context("the TLS provider offers no protocol version")?;
    if insecure_skip_verify {
        tracing::warn!(
            service,
            "TLS certificate verification is OFF for {service}: any server on the way can pose as it and read or change the traffic; for testing only, never in production"
        );
        let config = builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerification(provider)))
            .with_no_client_auth();
        return Ok(Arc::new(config));
    }
    let mut roots = rustls::RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    for e in &native.errors {
        tracing::debug!(service, error = %e, "a system root certificate could not be read");
    }
    let _ = roots.add_parsable_certificates(native.certs);
    if let Some(path) = ca_file {
        for cert in read_certs(path)? {
            roots.add(cert).map_err(|e| {
                anyhow!(
                    "{}: a certificate cannot be used as a trust anchor: {e}",
                    path.display()
                )
            })?;
        }
    }
    if roots.is_empty() {
        bail!("no trusted root certificate for {service}: the system has none and no CA file is given");
    }
    Ok(Arc::new(
        builder.with_root_certificates(roots).with_no_client_auth(),
    ))
}

/// Every certificate in a PEM file; none is an error.
fn read_certs(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let pem = std::fs::read(path).with_context(|| format!("{}: cannot read", path.display()))?;
    let certs = rustls_pemfile::certs(&mut pem.as_slice())
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("{}: not a PEM file", path.display()))?;
    if certs.is_empty() {
        bail!("{}: holds no PEM CERTIFICATE block", path.display());
    }
    Ok(certs)
}

/// Accepts any certificate (`insecure_skip_verify`); handshake signatures are still checked, so
/// the peer holds the key of the certificate it showed, whatever that certificate is.
#[derive(Debug)]
struct NoVerification(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

// ------------------------------------------------------------------ the traffic listener

/// The listener's certificate chain and key, replaced in place on reload.
#[derive(Debug)]
pub struct CertStore {
    current: parking_lot::RwLock<Arc<CertifiedKey>>,
}

impl CertStore {
    /// Read `cert_file` (the chain, leaf first) and `key_file` (its private key), both PEM.
    pub fn load(cert_file: &Path, key_file: &Path) -> anyhow::Result<Arc<Self>> {
        let key = read_certified_key(cert_file, key_file)?;
        Ok(Arc::new(Self {
            current: parking_lot::RwLock::new(key),
        }))
    }

    /// Serve `key` to every connection from now on (those already open keep theirs).
    pub fn set(&self, key: Arc<CertifiedKey>) {
        *self.current.write() = key;
    }

    /// The pair served now.
    pub fn current(&self) -> Arc<CertifiedKey> {
        self.current.read().clone()
    }
}

impl ResolvesServerCert for CertStore {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// A certificate chain and its private key from PEM files, checked to belong together.
pub fn read_certified_key(cert_file: &Path, key_file: &Path) -> anyhow::Result<Arc<CertifiedKey>> {
    install_provider();
    let certs = read_certs(cert_file)?;
    let pem =
        std::fs::read(key_file).with_context(|| format!("{}: cannot read", key_file.display()))?;
    let key = rustls_pemfile::private_key(&mut pem.as_slice())
        .with_context(|| format!("{}: not a PEM file", key_file.display()))?
        .ok_or_else(|| {
            anyhow!(
                "{}: holds no PEM private key (PKCS#8, PKCS#1 or SEC1)",
                key_file.display()
            )
        })?;
    let signing = provider().key_provider.load_private_key(key).map_err(|e| {
        anyhow!(
            "{}: the private key cannot be used: {e}",
            key_file.display()
        )
    })?;
    let pair = CertifiedKey::new(certs, signing);
    pair.keys_match().map_err(|e| {
        anyhow!(
            "{} does not belong to the certificate in {} ({e})",
            key_file.display(),
            cert_file.display()
        )
    })?;
    Ok(Arc::new(pair))
}

/// The listener's TLS configuration: certificates from `certs`, ALPN `http/1.1`.
pub fn server_config(certs: Arc<CertStore>) -> anyhow::Result<rustls::ServerConfig> {
    install_provider();
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .context("the TLS provider offers no protocol version")?
        .with_no_client_auth()
        .with_cert_resolver(certs);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}
