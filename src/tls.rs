//! TLS for the gateway's connections: outgoing (the JWKS endpoint, Redis, the upstream) and the
//! traffic listener's own.
//!
//! One builder, [`client_config`], so every client trusts the same way:
//!
//! - **Roots.** The system's certificate store (`/etc/ssl/certs` and the like, read with
//!   `rustls-native-certs`). With a `ca_file`, the certificates of that PEM bundle are trusted
//!   *in addition* (a private CA for a managed Redis or an internal identity provider); the
//!   system roots stay trusted. No root at all (an empty system store and no CA file) is a
//!   start-up error naming the service.
//! - **Verification.** The server's chain must lead to one of those roots, and its certificate
//!   must name the host of the URL (the same host is sent as SNI). There is no insecure default.
//! - **`insecure_skip_verify`** accepts any certificate (development only): a warning naming the
//!   service is logged every time such a configuration is built, i.e. on every start.
//! - **The traffic listener.** [`CertStore`] holds its certificate and key, read from PEM files;
//!   every new connection gets the pair current at its handshake, and a reload replaces it.
//! - **Crypto.** rustls with the `ring` provider, installed as the process default once
//!   ([`install_provider`]).

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use std::path::Path;
use std::sync::Arc;

/// Why TLS could not be set up: a client configuration (the message names the service), or a
/// listener's certificate and key (the message names the file).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct TlsError(pub String);

/// Install rustls's `ring` provider as the process default (once; later calls, and a provider
/// installed by the embedding application, are left alone).
pub(crate) fn install_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The TLS client configuration for `service` (a setting's name, e.g. `identity.jwks_url`, used
/// in every message): system roots, plus the PEM certificates of `ca_file` when given; or, with
/// `insecure_skip_verify`, no verification at all (and a warning naming the service).
pub(crate) fn client_config(
    service: &str,
    ca_file: Option<&Path>,
    insecure_skip_verify: bool,
) -> Result<Arc<ClientConfig>, TlsError> {
    install_provider();
    let crypto = provider();
    let builder = ClientConfig::builder_with_provider(crypto.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError(format!("{service}: cannot set up TLS: {e}")))?;
    if insecure_skip_verify {
        tracing::warn!(
            service,
            "{service}: TLS certificate verification is OFF (insecure_skip_verify): anyone on the network path can impersonate this server; development only"
        );
        let verifier = Arc::new(NoVerification(crypto));
        return Ok(Arc::new(
            builder
                .dangerous()
                .with_custom_certificate_verifier(verifier)
                .with_no_client_auth(),
        ));
    }
    let mut roots = RootCertStore::empty();
    roots.add_parsable_certificates(trusted_certificates(service, ca_file)?);
    Ok(Arc::new(
        builder.with_root_certificates(roots).with_no_client_auth(),
    ))
}

/// The certificates [`client_config`] trusts: the system's, then those of `ca_file`. Only
/// certificates usable as trust anchors are returned. An unreadable or empty CA file, or no
/// certificate at all, is an error naming the service.
pub(crate) fn trusted_certificates(
    service: &str,
    ca_file: Option<&Path>,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let usable = |c: &CertificateDer<'static>| RootCertStore::empty().add(c.clone()).is_ok();
    let native = rustls_native_certs::load_native_certs();
    let mut certs: Vec<CertificateDer<'static>> =
        native.certs.into_iter().filter(|c| usable(c)).collect();
    if let Some(path) = ca_file {
        let own = read_ca_file(service, path)?;
        if let Some(bad) = own.iter().position(|c| !usable(c)) {
            return Err(TlsError(format!(
                "{service}: certificate {} of the CA file `{}` is not a usable CA certificate",
                bad + 1,
                path.display()
            )));
        }
        certs.extend(own);
    }
    if certs.is_empty() {
        let why: Vec<String> = native.errors.iter().map(|e| e.to_string()).collect();
        return Err(TlsError(format!(
            "{service}: no trusted root certificate: the system certificate store is empty or unreadable{}; install the system CA certificates (Debian: ca-certificates) or name a PEM bundle in the service's ca_file setting",
            if why.is_empty() {
                String::new()
            } else {
                format!(" ({})", why.join("; "))
            }
        )));
    }
    Ok(certs)
}

/// The certificates of a PEM bundle; none, or a file that cannot be read, is an error.
fn read_ca_file(service: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    pem_certificates(path).map_err(|e| {
        TlsError(match e {
            PemError::Read(e) => format!(
                "{service}: cannot read the CA file `{}`: {e}",
                path.display()
            ),
            PemError::Parse(e) => format!(
                "{service}: the CA file `{}` is not a PEM bundle: {e}",
                path.display()
            ),
            PemError::Empty => format!(
                "{service}: the CA file `{}` holds no certificate (-----BEGIN CERTIFICATE-----)",
                path.display()
            ),
        })
    })
}

/// Why a PEM file gave no certificates.
enum PemError {
    Read(std::io::Error),
    Parse(std::io::Error),
    Empty,
}

/// Every certificate of a PEM file, for the CA bundles and the listener's chain alike.
fn pem_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, PemError> {
    let bytes = std::fs::read(path).map_err(PemError::Read)?;
    let certs = rustls_pemfile::certs(&mut bytes.as_slice())
        .collect::<Result<Vec<_>, _>>()
        .map_err(PemError::Parse)?;
    if certs.is_empty() {
        return Err(PemError::Empty);
    }
    Ok(certs)
}

/// Whether an error (or any error it wraps) says the server's certificate did not verify;
/// the reason rustls gave when it did.
pub(crate) fn certificate_problem(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = next {
        if let Some(r) = err.downcast_ref::<rustls::Error>() {
            if let Some(why) = describe(r) {
                return Some(why);
            }
        }
        // `io::Error::source` skips the error it wraps: look inside it too.
        if let Some(inner) = err
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            if let Some(why) = certificate_problem(inner) {
                return Some(why);
            }
        }
        next = err.source();
    }
    certificate_problem_in(&e.to_string())
}

/// The same, from an error's text (for clients that keep only a message).
pub(crate) fn certificate_problem_in(message: &str) -> Option<String> {
    const MARK: &str = "invalid peer certificate: ";
    let at = message.find(MARK)?;
    let rest = &message[at + MARK.len()..];
    let reason = rest
        .split([',', ';', ')', '\n'])
        .next()
        .unwrap_or(rest)
        .trim();
    Some(explain(reason))
}

fn describe(e: &rustls::Error) -> Option<String> {
    match e {
        rustls::Error::InvalidCertificate(c) => Some(explain(&format!("{c:?}"))),
        _ => None,
    }
}

/// A rustls certificate error in words an operator can act on.
fn explain(reason: &str) -> String {
    let what = if reason.starts_with("UnknownIssuer") {
        "the server's certificate is not trusted: it is not signed by a system root certificate nor by the CA file"
    } else if reason.starts_with("NotValidForName") {
        "the server's certificate does not name the host of the URL"
    } else if reason.starts_with("Expired") {
        "the server's certificate has expired"
    } else if reason.starts_with("NotValidYet") {
        "the server's certificate is not valid yet"
    } else if reason.starts_with("Revoked") {
        "the server's certificate is revoked"
    } else {
        "the server's certificate does not verify"
    };
    format!("{what} ({reason})")
}

/// Accepts every certificate: only behind `insecure_skip_verify`. Signatures are still checked,
/// so the handshake is with whoever holds the presented key.
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

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Every certificate in a PEM file; none is an error.
fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    pem_certificates(path).map_err(|e| {
        TlsError(match e {
            PemError::Read(e) => format!("{}: cannot read: {e}", path.display()),
            PemError::Parse(e) => format!("{}: not a PEM file: {e}", path.display()),
            PemError::Empty => format!("{}: holds no PEM CERTIFICATE block", path.display()),
        })
    })
}

// ------------------------------------------------------------------ the traffic listener

/// The listener's certificate chain and key, replaced in place on reload.
#[derive(Debug)]
pub(crate) struct CertStore {
    current: parking_lot::RwLock<Arc<CertifiedKey>>,
}

impl CertStore {
    /// Read `cert_file` (the chain, leaf first) and `key_file` (its private key), both PEM.
    pub(crate) fn load(cert_file: &Path, key_file: &Path) -> Result<Arc<Self>, TlsError> {
        let key = read_certified_key(cert_file, key_file)?;
        Ok(Arc::new(Self {
            current: parking_lot::RwLock::new(key),
        }))
    }

    /// Serve `key` to every connection from now on (those already open keep theirs).
    pub(crate) fn set(&self, key: Arc<CertifiedKey>) {
        *self.current.write() = key;
    }

    /// The pair served now.
    pub(crate) fn current(&self) -> Arc<CertifiedKey> {
        self.current.read().clone()
    }
}

impl ResolvesServerCert for CertStore {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// A certificate chain and its private key from PEM files, checked to belong together.
pub(crate) fn read_certified_key(
    cert_file: &Path,
    key_file: &Path,
) -> Result<Arc<CertifiedKey>, TlsError> {
    install_provider();
    let certs = read_certs(cert_file)?;
    let pem = std::fs::read(key_file)
        .map_err(|e| TlsError(format!("{}: cannot read: {e}", key_file.display())))?;
    let key = rustls_pemfile::private_key(&mut pem.as_slice())
        .map_err(|e| TlsError(format!("{}: not a PEM file: {e}", key_file.display())))?
        .ok_or_else(|| {
            TlsError(format!(
                "{}: holds no PEM private key (PKCS#8, PKCS#1 or SEC1)",
                key_file.display()
            ))
        })?;
    let signing = provider().key_provider.load_private_key(key).map_err(|e| {
        TlsError(format!(
            "{}: the private key cannot be used: {e}",
            key_file.display()
        ))
    })?;
    let pair = CertifiedKey::new(certs, signing);
    pair.keys_match().map_err(|e| {
        TlsError(format!(
            "{} does not belong to the certificate in {} ({e})",
            key_file.display(),
            cert_file.display()
        ))
    })?;
    Ok(Arc::new(pair))
}

/// The listener's TLS configuration: certificates from `certs`, ALPN `http/1.1`.
pub(crate) fn server_config(certs: Arc<CertStore>) -> Result<rustls::ServerConfig, TlsError> {
    install_provider();
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError(format!("the TLS provider offers no protocol version: {e}")))?
        .with_no_client_auth()
        .with_cert_resolver(certs);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_ca_file_names_the_service_and_the_file() {
        let e = client_config("store.url", Some(Path::new("/nonexistent/ca.pem")), false)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("store.url: cannot read the CA file `/nonexistent/ca.pem`"),
            "{e}"
        );
    }

    #[test]
    fn a_ca_file_without_certificates_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.pem");
        std::fs::write(&path, "not a certificate\n").unwrap();
        let e = client_config("identity.jwks_url", Some(&path), false)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("identity.jwks_url: the CA file") && e.contains("holds no certificate"),
            "{e}"
        );
    }

    #[test]
    fn a_ca_file_is_trusted_in_addition_to_the_system_roots() {
        let ca = rcgen::generate_simple_self_signed(vec!["ca.test".to_owned()]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.pem");
        std::fs::write(&path, ca.cert.pem()).unwrap();
        let system = trusted_certificates("store.url", None).map(|c| c.len());
        let with_file = trusted_certificates("store.url", Some(&path)).unwrap();
        assert!(with_file.contains(&CertificateDer::from(ca.cert.der().to_vec())));
        // Without system roots the file alone is the store; with them, both are.
        assert_eq!(with_file.len(), system.unwrap_or(0) + 1);
    }

    #[test]
    fn certificate_errors_are_explained() {
        let e = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, e);
        let why = certificate_problem(&io).unwrap();
        assert!(
            why.starts_with("the server's certificate is not trusted"),
            "{why}"
        );
        let why = certificate_problem_in(
            "Connection refused - invalid peer certificate: NotValidForName",
        )
        .unwrap();
        assert!(why.contains("does not name the host"), "{why}");
        assert_eq!(
            certificate_problem_in("Connection refused (os error 111)"),
            None
        );
        let plain = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert_eq!(certificate_problem(&plain), None);
    }

    #[test]
    fn skip_verify_builds_without_roots() {
        assert!(client_config("identity.jwks_url", None, true).is_ok());
    }
}
