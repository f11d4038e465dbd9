//! `server.upstream`: an `http://` or `https://host[:port][/prefix]` URL the gateway can forward
//! to as is, parsed once at load into [`UpstreamUrl`] (scheme, host, port, path prefix).
//!
//! Credentials (`user:password@`) are refused: the gateway never sends them, and a URL holding
//! them would otherwise be printed in logs. So is any character a URL may not hold there (a
//! space, a quote, ...), which would otherwise start the gateway and fail every request.

use std::fmt;
use std::str::FromStr;

/// A usable `server.upstream`: where the gateway connects and what it puts in front of every
/// forwarded path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamUrl {
    /// As configured, trimmed and without a trailing `/`: how logs and errors show it.
    url: String,
    https: bool,
    /// `host`, `host:port`, `[v6]` or `[v6]:port`, as written.
    authority: String,
    /// The host without brackets: a DNS name, an IPv4 address or an IPv6 address.
    host: String,
    /// The port given, or the scheme's (80, 443).
    port: u16,
    /// The path put in front of every forwarded path: empty, or `/` and more.
    prefix: String,
}

impl UpstreamUrl {
    /// `https://`: the connection is made over TLS.
    pub fn is_https(&self) -> bool {
        self.https
    }

    /// The host, without the brackets of an IPv6 address: the name TLS verifies.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The port, given or the scheme's default.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `host[:port]` as written: the `Host` of a request that came without one.
    pub fn authority(&self) -> &str {
        &self.authority
    }

    /// `host:port` (`[v6]:port`) to connect to.
    pub fn address(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// The path prefix: empty, or starting with `/` (never ending with one).
    pub fn path_prefix(&self) -> &str {
        &self.prefix
    }

    /// The URL as configured, less a trailing `/`.
    pub fn as_str(&self) -> &str {
        &self.url
    }
}

impl fmt::Display for UpstreamUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.url)
    }
}

impl FromStr for UpstreamUrl {
    /// What is wrong with it, in an operator's words (any password shown as `***`).
    type Err = String;

    fn from_str(u: &str) -> Result<Self, String> {
        let url = u.trim().trim_end_matches('/');
        let (https, rest) = match (url.strip_prefix("http://"), url.strip_prefix("https://")) {
            (Some(rest), _) => (false, rest),
            (None, Some(rest)) => (true, rest),
            (None, None) => {
                return Err(format!(
                    "`{}` must be an http:// or https:// URL of the upstream API (e.g. \"http://127.0.0.1:3000\" or \"https://api.internal\")",
                    crate::redact::url(u)
                ))
            }
        };
        if rest.is_empty() || rest.contains(['?', '#']) {
            return Err(format!(
                "`{}` must be scheme, host, port and optionally a path prefix; a query or a fragment is not sent upstream",
                crate::redact::url(u)
            ));
        }
        if let Some(why) = problem(rest) {
            return Err(format!("`{}` {why}", crate::redact::url(u)));
        }
        let (authority, prefix) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        // `problem` has checked the host and that a port is 1-65535.
        let (host, port) = match authority.strip_prefix('[') {
            Some(v6) => match v6.split_once(']') {
                Some((host, after)) => (host, after.strip_prefix(':')),
                None => (v6, None),
            },
            None => match authority.rsplit_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (authority, None),
            },
        };
        let default = if https { 443 } else { 80 };
        let port = match port {
            Some(p) => p
                .parse::<u16>()
                .map_err(|_| format!("`{}` has a port outside 1-65535", crate::redact::url(u)))?,
            None => default,
        };
        Ok(Self {
            url: url.to_owned(),
            https,
            authority: authority.to_owned(),
            host: host.to_owned(),
            port,
            prefix: prefix.to_owned(),
        })
    }
}

/// What is wrong with the part of an upstream URL after `http://` or `https://`, if anything.
pub(super) fn problem(rest: &str) -> Option<String> {
    const CREDENTIALS: &str = "carries credentials (user:password@); the gateway does not send them upstream, and a password here would end up in logs: remove them (clients send their own Authorization header)";
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    if authority.contains('@') {
        return Some(CREDENTIALS.to_owned());
    }
    match authority_problem(authority) {
        // A password holding a `/` splits the authority early: still credentials.
        Some(_) if path.contains('@') => return Some(CREDENTIALS.to_owned()),
        Some(why) => return Some(why),
        None => {}
    }
    for (i, c) in path.char_indices() {
        if c == '%' {
            let hex = path.get(i + 1..i + 3).unwrap_or("");
            if hex.len() != 2 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Some(
                    "has a `%` that does not start a percent-escape (%20, %2F, ...)".to_owned(),
                );
            }
        } else if !(url_unreserved(c) || "!$&'()*+,;=:@/".contains(c)) {
            return Some(not_in_url(c));
        }
    }
    None
}

/// What is wrong with `host[:port]` or `[ipv6][:port]`, if anything.
fn authority_problem(authority: &str) -> Option<String> {
    let port = if let Some(v6) = authority.strip_prefix('[') {
        let ok = v6
            .split_once(']')
            .filter(|(a, _)| a.parse::<std::net::Ipv6Addr>().is_ok());
        let Some((_, after)) = ok else {
            return Some(
                "has a bracketed host that is not an IPv6 address (e.g. \"http://[::1]:3000\")"
                    .to_owned(),
            );
        };
        match after.strip_prefix(':') {
            Some(p) => Some(p),
            None => match after.chars().next() {
                Some(c) => return Some(not_in_url(c)),
                None => None,
            },
        }
    } else {
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        };
        if host.is_empty() {
            return Some("has no host (e.g. \"http://127.0.0.1:3000\")".to_owned());
        }
        if let Some(c) = host.chars().find(|c| !url_unreserved(*c)) {
            return Some(not_in_url(c));
        }
        port
    };
    match port {
        Some(p) if !matches!(p.parse::<u16>(), Ok(1..)) => {
            match p.chars().find(|c| !c.is_ascii_digit()) {
                Some(c) => Some(not_in_url(c)),
                None => Some("has a port outside 1-65535".to_owned()),
            }
        }
        _ => None,
    }
}

fn url_unreserved(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | '~')
}

fn not_in_url(c: char) -> String {
    let shown = match c {
        ' ' => "a space".to_owned(),
        c if c.is_control() => format!("the control character {c:?}"),
        c => format!("`{c}`"),
    };
    format!("contains {shown}, which is not allowed in a URL there; percent-encode it in the path (a space is %20), or correct the host and port")
}

#[cfg(test)]
mod tests {
    use super::{problem, UpstreamUrl};

    #[test]
    fn a_parsed_upstream_gives_its_scheme_host_port_and_prefix() {
        for (url, https, host, port, authority, address, prefix) in [
            (
                "http://api.internal",
                false,
                "api.internal",
                80,
                "api.internal",
                "api.internal:80",
                "",
            ),
            (
                "https://api.internal/",
                true,
                "api.internal",
                443,
                "api.internal",
                "api.internal:443",
                "",
            ),
            (
                " https://127.0.0.1:8443/v1/ ",
                true,
                "127.0.0.1",
                8443,
                "127.0.0.1:8443",
                "127.0.0.1:8443",
                "/v1",
            ),
            (
                "https://[::1]/p",
                true,
                "::1",
                443,
                "[::1]",
                "[::1]:443",
                "/p",
            ),
            (
                "http://[2001:db8::1]:3000/a%20b/c",
                false,
                "2001:db8::1",
                3000,
                "[2001:db8::1]:3000",
                "[2001:db8::1]:3000",
                "/a%20b/c",
            ),
        ] {
            let u: UpstreamUrl = url.parse().unwrap_or_else(|e| panic!("{url}: {e}"));
            assert_eq!(
                (
                    u.is_https(),
                    u.host(),
                    u.port(),
                    u.authority(),
                    u.address().as_str(),
                    u.path_prefix()
                ),
                (https, host, port, authority, address, prefix),
                "{url}"
            );
            assert_eq!(u.to_string(), url.trim().trim_end_matches('/'));
        }
    }

    #[test]
    fn an_unusable_upstream_says_why_without_its_password() {
        for (bad, why) in [
            ("ftp://api.example", "must be an http:// or https:// URL"),
            ("api.example:3000", "must be an http:// or https:// URL"),
            ("https://?", "must be scheme, host, port"),
            ("http://a.example/?x=1", "a query or a fragment"),
            ("http://a.example#top", "a query or a fragment"),
            ("http://admin:S3cret@127.0.0.1:3000", "carries credentials"),
            ("http://127.0.0.1:0", "outside 1-65535"),
            ("https://[::1:443", "not an IPv6 address"),
        ] {
            let e = bad.parse::<UpstreamUrl>().expect_err(bad);
            assert!(e.contains(why), "{bad}: {e}");
            assert!(!e.contains("S3cret"), "{bad}: {e}");
        }
    }

    #[test]
    fn usable_upstreams_pass() {
        for ok in [
            "127.0.0.1:3000",
            "api.internal",
            "api.internal:8080/v1/base",
            "[::1]:3000",
            "[2001:db8::1]",
            "127.0.0.1:3000/a%20b/@scope/x;y=1",
        ] {
            assert_eq!(problem(ok), None, "{ok}");
        }
    }

    #[test]
    fn credentials_and_stray_characters_are_named() {
        for (bad, why) in [
            ("admin:S3cret@127.0.0.1:3000", "credentials"),
            ("S3cret@127.0.0.1:3000", "credentials"),
            ("admin:S3/cret@127.0.0.1:3000", "credentials"),
            ("127.0.0.1:3000/api v1", "a space"),
            ("exa mple.test", "a space"),
            ("127.0.0.1:3000/a\"b", "`\"`"),
            ("127.0.0.1:3000/a\tb", "control character"),
            ("127.0.0.1:3000/caf\u{e9}", "`\u{e9}`"),
            ("127.0.0.1:3000/%zz", "percent-escape"),
            ("127.0.0.1:99999", "outside 1-65535"),
            ("127.0.0.1:0", "outside 1-65535"),
            ("127.0.0.1:80a", "`a`"),
            (":3000", "no host"),
            ("[not-v6]:3000", "not an IPv6 address"),
        ] {
            let got = problem(bad).unwrap_or_else(|| panic!("{bad} must be refused"));
            assert!(got.contains(why), "{bad}: {got}");
            assert!(!got.contains("S3"), "{bad}: {got}");
        }
    }
}
