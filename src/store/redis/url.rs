//! A plain Redis URL (`redis://[user:password@]host[:port][/db]`, `rediss://` for TLS) read the
//! way the store connects by, so that every spelling the Redis client would refuse, or read
//! otherwise than its writer meant, is refused at load with what is wrong and how to write it.
//! Sentinel URLs have their own reader (`sentinel::parse`).

use super::sentinel::{bracketed, MAX_URL};

/// The port a URL without one reaches.
pub(crate) const DEFAULT_PORT: u16 = 6379;
/// The largest database number accepted (Redis's `databases` is 16 by default).
const MAX_DB: u64 = 1_000_000;
/// How a URL is written, for the fixes.
const FORM: &str = "redis://[user:password@]host:port[/db], rediss:// for TLS";

/// One Redis server as a URL names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ServerUrl {
    pub(crate) tls: bool,
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) db: u64,
}

/// `url` read as one server's URL; `Err` says what is wrong and how to write it, without
/// repeating the user name or password. `node` is set for a `store.cluster` entry (database 0
/// only, no Sentinel).
pub(crate) fn parse(url: &str, node: bool) -> Result<ServerUrl, String> {
    if url.trim().is_empty() {
        return Err(format!(
            "is empty; write {FORM}, e.g. redis://127.0.0.1:6379"
        ));
    }
    if url.len() > MAX_URL {
        return Err(format!("is longer than {MAX_URL} characters"));
    }
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(
            "holds white space or a control character (a space, tab or line break copied in?); write the URL on one line without them, percent-encoding any in a password (%20 for a space)"
                .to_owned(),
        );
    }
    let (tls, rest) = scheme(url, node)?;
    if rest.contains('#') {
        return Err("has a fragment (`#...`), which is not read: for a certificate that does not verify set store.ca_file (or, in development only, store.insecure_skip_verify = true); in a password write `#` as %23".to_owned());
    }
    if rest.contains('?') {
        return Err("has options (`?...`), which are not read: the store speaks RESP2, TLS is set by rediss:// with store.ca_file and store.insecure_skip_verify, and the timeout by store.timeout; remove the options, and in a password write `?` as %3F".to_owned());
    }
    // As the Redis client reads a URL: the authority ends at the first `/`, and the user name
    // and password in it at its last `@`.
    let (authority, path) = match rest.split_once('/') {
        Some((a, p)) => (a, Some(p)),
        None => (rest, None),
    };
    if path.is_some_and(|p| p.contains('@')) {
        return Err("has an `@` after a `/`: a `/` in the user name or password ends the host part; write it as %2F (and `@` as %40)".to_owned());
    }
    let authority = match authority.rfind('@') {
        Some(at) => {
            userinfo(&authority[..at])?;
            &authority[at + 1..]
        }
        None => authority,
    };
    let (host, port) = host_port(authority, node)?;
    let db = database(path, tls, &host, port)?;
    if node && db != 0 {
        return Err(format!(
            "names database {db}, and a Redis Cluster has database 0 only; drop `/{db}`: {}://{}:{port}",
            if tls { "rediss" } else { "redis" },
            shown_host(&host)
        ));
    }
    Ok(ServerUrl {
        tls,
        host,
        port,
        db,
    })
}

/// The scheme: `redis://` (false) or `rediss://` (true), and what follows it.
fn scheme(url: &str, node: bool) -> Result<(bool, &str), String> {
    if let Some(rest) = url.strip_prefix("redis://") {
        return Ok((false, rest));
    }
    if let Some(rest) = url.strip_prefix("rediss://") {
        return Ok((true, rest));
    }
    let others = if node {
        "a Cluster node is redis://host:port (rediss:// for TLS)"
    } else {
        "write redis://host:port (rediss:// for TLS), or redis+sentinel://host:26379/<master-name> for Sentinel"
    };
    let Some((given, after)) = url.split_once(':') else {
        return Err(format!("has no scheme; {others}, e.g. redis://{url}:6379"));
    };
    let lower = given.to_ascii_lowercase();
    if (lower == "redis" || lower == "rediss") && !after.starts_with("//") {
        return Err(format!(
            "`{given}:` must be followed by `//`; write {lower}://{}",
            after.trim_start_matches('/')
        ));
    }
    if !after.starts_with("//") {
        // `host:6379`, `host:6379/0`: a host and port without a scheme.
        return Err(format!("has no scheme; {others}, e.g. redis://{url}"));
    }
    if lower != given && matches!(lower.as_str(), "redis" | "rediss") {
        return Err(format!(
            "the scheme `{given}://` is written in lower case: {lower}://"
        ));
    }
    Err(match lower.as_str() {
        "unix" | "redis+unix" | "rediss+unix" => {
            format!("`{given}://`: a Unix socket is not supported; reach Redis over TCP: {others}")
        }
        "redis+sentinel" | "rediss+sentinel" => {
            format!("`{given}://` names Sentinels, which go in store.url alone; {others}")
        }
        _ => format!("`{given}://` is not a Redis scheme; {others}"),
    })
}

/// The user name and password: %-escapes well formed.
fn userinfo(info: &str) -> Result<(), String> {
    let well_formed = |s: &str| {
        let b = s.as_bytes();
        b.iter().enumerate().all(|(i, &c)| {
            c != b'%'
                || (b.get(i + 1).is_some_and(u8::is_ascii_hexdigit)
                    && b.get(i + 2).is_some_and(u8::is_ascii_hexdigit))
        })
    };
    if !well_formed(info) {
        return Err("the user name or password holds a `%` that is not a %-escape; write `%` as %25 (and `@` as %40, `:` in a user name as %3A)".to_owned());
    }
    Ok(())
}

/// `host[:port]` or `[v6][:port]`.
fn host_port(s: &str, node: bool) -> Result<(String, u16), String> {
    if s.is_empty() {
        return Err(format!(
            "names no host; write {FORM}, e.g. redis://127.0.0.1:6379"
        ));
    }
    if s.contains(',') {
        return Err(if node {
            "lists several hosts in one entry; give each Cluster node its own URL: store.cluster = [\"redis://a:6379\", \"redis://b:6379\"]".to_owned()
        } else {
            "lists several hosts; one server is redis://host:6379, a Cluster's nodes go in store.cluster (one URL each), and Sentinels in one redis+sentinel://a:26379,b:26379/<master-name> URL".to_owned()
        });
    }
    let (host, port) = if let Some(v6) = bracketed(s) {
        v6?
    } else {
        match s.split_once(':') {
            Some((h, p)) if p.contains(':') => {
                return Err(format!(
                    "`{h}:{p}` has more than one `:`; write an IPv6 address in brackets: redis://[{h}:{p}]:6379"
                ))
            }
            Some((h, p)) => (h.to_owned(), Some(p)),
            None => (s.to_owned(), None),
        }
    };
    if host.is_empty() {
        return Err(format!(
            "names no host; write {FORM}, e.g. redis://127.0.0.1:6379"
        ));
    }
    let name_like = host
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':'));
    if !name_like || host.starts_with(['.', '-']) {
        return Err(format!(
            "`{host}` is not a host name or address (letters, digits, `.`, `-`, `_`, or an IPv6 address in brackets)"
        ));
    }
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n > 0 && p.bytes().all(|c| c.is_ascii_digit()) => n,
            _ if p.is_empty() => {
                return Err(format!(
                    "has `:` and no port after it; write redis://{}:6379 (or leave out the `:` for 6379)",
                    shown_host(&host)
                ))
            }
            _ => {
                return Err(format!(
                    "`{p}` is not a port: use a number from 1 to 65535, e.g. redis://{}:6379",
                    shown_host(&host)
                ))
            }
        },
    };
    Ok((host, port))
}

/// The database after the authority: none, `/` or `/<number>`.
fn database(path: Option<&str>, tls: bool, host: &str, port: u16) -> Result<u64, String> {
    let scheme = if tls { "rediss" } else { "redis" };
    let host = shown_host(host);
    let Some(path) = path.filter(|p| !p.is_empty()) else {
        return Ok(0);
    };
    let (first, more) = match path.split_once('/') {
        Some((d, more)) => (d, !more.is_empty()),
        None => (path, false),
    };
    if more {
        return Err(format!(
            "has more path than a database number (`/{path}`); the path is the database alone: {scheme}://{host}:{port}/0"
        ));
    }
    match first.parse::<u64>() {
        Ok(n) if n <= MAX_DB && first.bytes().all(|c| c.is_ascii_digit()) => Ok(n),
        Ok(_) => Err(format!(
            "`{first}` is past the largest database number ({MAX_DB}); Redis numbers its databases from 0 (16 of them unless `databases` says otherwise): {scheme}://{host}:{port}/0"
        )),
        Err(_) => Err(format!(
            "`/{first}`: the database is a number: {scheme}://{host}:{port}/0{}",
            digits_in(first)
                .map(|d| format!(" (or /{d})"))
                .unwrap_or_default()
        )),
    }
}

/// The number a database name like `db3` stands for.
fn digits_in(s: &str) -> Option<u64> {
    let d: String = s.chars().filter(char::is_ascii_digit).collect();
    d.parse().ok().filter(|&n| n > 0 && n <= MAX_DB)
}

/// A host as a URL writes it: IPv6 in brackets.
fn shown_host(host: &str) -> String {
    if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_owned()
    }
}

#[cfg(test)]
#[path = "url_tests.rs"]
mod tests;
