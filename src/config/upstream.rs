//! `server.upstream`: an `http://` or `https://host[:port][/prefix]` URL the gateway can forward
//! to as is.
//!
//! Credentials (`user:password@`) are refused: the gateway never sends them, and a URL holding
//! them would otherwise be printed in logs. So is any character a URL may not hold there (a
//! space, a quote, ...), which would otherwise start the gateway and fail every request.

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
    use super::problem;

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
