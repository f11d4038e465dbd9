//! The crate's one error at its boundary: what stopped a gateway from being built or from
//! running, and the exit code `fleet-limiter serve` gives it.

use crate::config::admit::Refusal;
use crate::config::Config;

/// What stopped [`build_decider`](crate::wiring::build_decider), the middleware's
/// [`from_config`](crate::http::middleware::FleetLimiter::from_config) or
/// [`serve_gateway`](crate::gateway::serve_gateway). Every message names the setting and the
/// fix; none carries a secret.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A configuration that cannot be used: a store, a key set, a certificate, a missing
    /// upstream.
    #[error("{0}")]
    Config(String),
    /// The calibration could lock healthy agents out of the declared fleet, and nobody allowed
    /// it.
    #[error("{0}")]
    UnsafeCalibration(#[from] Refusal),
    /// A listener's address cannot be taken.
    #[error("{0}")]
    Listen(#[from] ListenError),
    /// TLS cannot be set up: a CA bundle or certificate that cannot be read, or an upstream
    /// whose certificate does not verify.
    #[error("{0}")]
    Tls(#[from] TlsSetupError),
    /// Something failed while the gateway was serving.
    #[error("{0}")]
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

    /// A configuration that cannot be used, said by `why` (any URL in it without its password).
    pub(crate) fn config(why: impl std::fmt::Display) -> Self {
        Error::Config(crate::redact::urls_in(&why.to_string()).into_owned())
    }

    /// A failure while serving, said by `why` (any URL in it without its password).
    pub(crate) fn serve(why: impl std::fmt::Display) -> Self {
        Error::Serve(crate::redact::urls_in(&why.to_string()).into_owned())
    }
}

impl From<crate::store::StoreError> for Error {
    fn from(e: crate::store::StoreError) -> Self {
        Error::config(e)
    }
}

impl From<crate::identity::IdentityError> for Error {
    fn from(e: crate::identity::IdentityError) -> Self {
        Error::config(e)
    }
}

/// A listener whose address cannot be taken (in use, not an address of this host, not
/// permitted): a configuration error, naming the setting, where its value came from and how
/// to choose another. `serve` exits with code 2 on it, as on any configuration error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ListenError(pub String);

impl ListenError {
    /// `setting` (`server.listen` or `ops.admin_listen`), set with `flag`, could not listen on
    /// `addr`.
    pub fn new(
        cfg: &Config,
        setting: &str,
        flag: &str,
        addr: std::net::SocketAddr,
        e: &std::io::Error,
    ) -> Self {
        let why = match e.kind() {
            std::io::ErrorKind::AddrInUse => "another process listens there; stop it, or ",
            std::io::ErrorKind::AddrNotAvailable => "this host has no such address; ",
            _ => "",
        };
        let variable = crate::config::variable_of(setting).unwrap_or("its variable");
        Self(format!(
            "{}: {setting}: cannot listen on {addr}: {e}; {why}choose another address with {flag}, {variable} or {setting} in the config file (port 0 picks a free one and logs it)",
            cfg.origin(setting)
        ))
    }
}

/// TLS that cannot be set up at start: a CA bundle or listener certificate that cannot be read,
/// or an upstream whose certificate does not verify. A configuration error (exit code 2); the
/// message names the origin, the setting and the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TlsSetupError(pub String);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_has_its_exit_code_and_a_url_never_carries_its_password() {
        let listen = Error::from(ListenError("in use".into()));
        assert!(matches!(listen, Error::Listen(_)));
        assert_eq!(
            (listen.exit_code(), listen.to_string().as_str()),
            (2, "in use")
        );
        let tls = Error::from(TlsSetupError("no CA".into()));
        assert!(matches!(tls, Error::Tls(_)) && tls.is_config());
        let refused = Error::from(Refusal {
            problems: vec!["agent-device: too small".into()],
            warnings: Vec::new(),
        });
        assert!(matches!(refused, Error::UnsafeCalibration(_)) && refused.is_config());
        let running =
            Error::serve("the store: redis://default:hunter2hunter2@10.0.0.1:6379 went away");
        assert_eq!(running.exit_code(), 1);
        let text = running.to_string();
        assert!(text.starts_with("the store: "), "{text}");
        assert!(!text.contains("hunter2"), "{text}");
        let building = Error::config("store.url: not a URL");
        assert!(matches!(building, Error::Config(_)) && building.is_config());
        assert!(std::error::Error::source(&listen).is_some());
    }
}
