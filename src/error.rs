//! The crate's one error at its boundary: what stopped a gateway from being built or from
//! running, and the exit code `fleet-limiter serve` gives it.

use crate::config::admit::Refusal;
use crate::http::{ListenError, TlsSetupError};

/// What stopped [`build_decider`](crate::wiring::build_decider), the middleware's
/// [`from_config`](crate::http::middleware::FleetLimiter::from_config) or
/// [`serve_gateway`](crate::serve_gateway). Every message names the setting and the fix;
/// none carries a secret.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// A configuration that cannot be used: a store, a key set, a certificate, a missing
    /// upstream.
    Config(String),
    /// The calibration could lock healthy agents out of the declared fleet, and nobody allowed
    /// it.
    UnsafeCalibration(Refusal),
    /// A listener's address cannot be taken.
    Listen(ListenError),
    /// TLS cannot be set up: a CA bundle or certificate that cannot be read, or an upstream
    /// whose certificate does not verify.
    Tls(TlsSetupError),
    /// Something failed while the gateway was serving.
    Serve(String),
}

impl Error {
    /// The exit code `fleet-limiter serve` ends with: 2 for a configuration that cannot be used
    /// (whatever part of it), 1 for a failure while serving.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Serve(_) => 1,
            Error::Config(_) | Error::UnsafeCalibration(_) | Error::Listen(_) | Error::Tls(_) => 2,
        }
    }

    /// Whether the configuration is at fault (exit code 2).
    pub fn is_config(&self) -> bool {
        self.exit_code() == 2
    }

    /// A failure while building the gateway: the configuration's, unless it is one of the
    /// kinds above.
    pub(crate) fn building(e: anyhow::Error) -> Self {
        Self::classify(e, Error::Config)
    }

    /// A failure while serving: a listener or TLS set-up, a refused calibration, or else the
    /// run's own.
    pub(crate) fn serving(e: anyhow::Error) -> Self {
        Self::classify(e, Error::Serve)
    }

    fn classify(e: anyhow::Error, otherwise: impl FnOnce(String) -> Self) -> Self {
        let e = match e.downcast::<Refusal>() {
            Ok(r) => return Error::UnsafeCalibration(r),
            Err(e) => e,
        };
        let e = match e.downcast::<ListenError>() {
            Ok(l) => return Error::Listen(l),
            Err(e) => e,
        };
        match e.downcast::<TlsSetupError>() {
            Ok(t) => Error::Tls(t),
            Err(e) => otherwise(crate::redact::urls_in(&format!("{e:#}")).into_owned()),
        }
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Config(m) | Error::Serve(m) => f.write_str(m),
            Error::UnsafeCalibration(r) => r.fmt(f),
            Error::Listen(l) => l.fmt(f),
            Error::Tls(t) => t.fmt(f),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::UnsafeCalibration(r) => Some(r),
            Error::Listen(l) => Some(l),
            Error::Tls(t) => Some(t),
            Error::Config(_) | Error::Serve(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_has_its_exit_code_and_a_url_never_carries_its_password() {
        let listen = Error::serving(anyhow::Error::new(ListenError("in use".into())));
        assert!(matches!(listen, Error::Listen(_)));
        assert_eq!(
            (listen.exit_code(), listen.to_string().as_str()),
            (2, "in use")
        );
        let tls = Error::serving(anyhow::Error::new(TlsSetupError("no CA".into())));
        assert!(matches!(tls, Error::Tls(_)) && tls.is_config());
        let refused = Error::serving(anyhow::Error::new(Refusal {
            problems: vec!["agent-device: too small".into()],
            warnings: Vec::new(),
        }));
        assert!(matches!(refused, Error::UnsafeCalibration(_)) && refused.is_config());
        let running = Error::serving(
            anyhow::anyhow!("redis://default:hunter2hunter2@10.0.0.1:6379 went away")
                .context("the store"),
        );
        assert_eq!(running.exit_code(), 1);
        let text = running.to_string();
        assert!(text.starts_with("the store: "), "{text}");
        assert!(!text.contains("hunter2"), "{text}");
        let building = Error::building(anyhow::anyhow!("store.url: not a URL"));
        assert!(matches!(building, Error::Config(_)) && building.is_config());
        assert!(std::error::Error::source(&listen).is_some());
    }
}
