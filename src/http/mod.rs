//! HTTP glue: the middleware, the responses it renders, and the streaming proxy.

pub(crate) mod admin;
pub(crate) mod admin_client;
mod admin_guard;
mod body_keys;
pub(crate) mod control;
pub(crate) mod cors;
pub(crate) mod demo_upstream;
pub(crate) mod forward_auth;
#[cfg(feature = "actix-governor")]
pub(crate) mod governor;
pub(crate) mod levers;
pub(crate) mod listeners;
pub(crate) mod middleware;
pub(crate) mod proxy;
pub(crate) mod request;
pub(crate) mod response;
mod top;

use crate::config::Config;

/// A listener whose address cannot be taken (in use, not an address of this host, not
/// permitted): a configuration error, naming the setting, where its value came from and how
/// to choose another. `serve` exits with code 2 on it, as on any configuration error.
#[derive(Debug, Clone, PartialEq, Eq)]
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

impl std::fmt::Display for ListenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ListenError {}

/// TLS that cannot be set up at start: a CA bundle or listener certificate that cannot be read,
/// or an upstream whose certificate does not verify. A configuration error (exit code 2); the
/// message names the origin, the setting and the fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSetupError(pub String);

impl std::fmt::Display for TlsSetupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TlsSetupError {}
