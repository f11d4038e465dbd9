//! Redis Sentinel: `redis+sentinel://[user:password@]host:port[,host:port...]/<master-name>[/db]`
//! (`rediss+sentinel://` for TLS to the Sentinels and the primaries).
//!
//! The store asks the Sentinels, in the order given, for the primary of `<master-name>`
//! (`SENTINEL get-master-addr-by-name`), connects to it and checks that it answers `ROLE` as a
//! primary. It asks again when a decision fails on the connection or answers `READONLY` (the
//! ordinary reconnection does it), and every [`CHECK_EVERY`] in the background: when the
//! Sentinels name another primary, a connection to it is built beside the current one and
//! replaces it. Each switch is logged once (`from` -> `to`) and counted.
//!
//! The URL's user and password are the primaries'. Sentinels are asked without them; a Sentinel
//! that wants a password (`NOAUTH`) is asked again with the same ones.

use super::conn::Conn;
use super::{Inner, RedisTarget};
use redis::{
    ConnectionAddr, ConnectionInfo, ErrorKind, RedisConnectionInfo, RedisError, RedisResult,
};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

/// How often the Sentinels are asked whether the primary changed.
pub(super) const CHECK_EVERY: Duration = Duration::from_secs(1);
/// The port of a Sentinel given without one.
pub(crate) const DEFAULT_PORT: u16 = 26379;
/// Most Sentinels one URL may list.
pub(crate) const MAX_SENTINELS: usize = 16;
/// Longest master name accepted.
pub(crate) const MAX_MASTER_NAME: usize = 128;
/// Longest URL accepted.
pub(crate) const MAX_URL: usize = 4096;

/// Whether `url` names Sentinels rather than one server.
pub(crate) fn is_sentinel_url(url: &str) -> bool {
    url.starts_with("redis+sentinel://") || url.starts_with("rediss+sentinel://")
}

/// A parsed Sentinel URL. Its `Debug` hides the password.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct SentinelUrl {
    /// `rediss+sentinel://`: TLS to the Sentinels and to the primaries.
    pub tls: bool,
    pub sentinels: Vec<(String, u16)>,
    pub master: String,
    pub db: i64,
    pub username: Option<String>,
    pub password: Option<String>,
}

impl std::fmt::Debug for SentinelUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelUrl")
            .field("tls", &self.tls)
            .field("sentinels", &self.sentinels)
            .field("master", &self.master)
            .field("db", &self.db)
            .field("username", &self.username)
            .field(
                "password",
                &self.password.as_ref().map(|_| crate::redact::MASK),
            )
            .finish()
    }
}

/// `%XX` decoded, as UTF-8; `None` for a malformed escape or bytes that are not UTF-8.
fn percent_decoded(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// `[v6]` or `[v6]:port`: the address and the port as written; `None` when `s` does not open
/// with `[`.
pub(super) fn bracketed(s: &str) -> Option<Result<(String, Option<&str>), String>> {
    let rest = s.strip_prefix('[')?;
    let Some((v6, after)) = rest.split_once(']') else {
        return Some(Err(format!("`{s}` opens `[` without closing it")));
    };
    if v6.parse::<std::net::Ipv6Addr>().is_err() {
        return Some(Err(format!("`{v6}` is not an IPv6 address")));
    }
    Some(match after.strip_prefix(':') {
        Some(p) => Ok((v6.to_owned(), Some(p))),
        None if after.is_empty() => Ok((v6.to_owned(), None)),
        None => Err(format!("`{s}`: expected `:port` after `]`")),
    })
}

/// One `host:port` (or `[v6]:port`, or a host alone for port 26379).
fn host_port(s: &str) -> Result<(String, u16), String> {
    let (host, port) = match bracketed(s) {
        Some(v6) => v6?,
        None => match s.rsplit_once(':') {
            Some((h, p)) => (h.to_owned(), Some(p)),
            None => (s.to_owned(), None),
        },
    };
    if host.is_empty() {
        return Err("a Sentinel address has no host".to_owned());
    }
    if !host
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':'))
    {
        return Err(format!("`{host}` is not a host name or address"));
    }
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n > 0 && p.bytes().all(|c| c.is_ascii_digit()) => n,
            _ => return Err(format!("`{p}` is not a port (1 to 65535)")),
        },
    };
    Ok((host, port))
}

/// Parse a Sentinel URL. The message of an error never holds the password.
pub(crate) fn parse(url: &str) -> Result<SentinelUrl, String> {
    const FORM: &str =
        "redis+sentinel://[user:password@]host:port[,host:port...]/<master-name>[/db]";
    if url.len() > MAX_URL {
        return Err(format!("longer than {MAX_URL} characters"));
    }
    let (tls, rest) = if let Some(r) = url.strip_prefix("redis+sentinel://") {
        (false, r)
    } else if let Some(r) = url.strip_prefix("rediss+sentinel://") {
        (true, r)
    } else {
        return Err(format!("not a Sentinel URL; write {FORM}"));
    };
    if rest.contains(['?', '#']) {
        return Err(format!(
            "a query or fragment is not read in a Sentinel URL (percent-encode `?` and `#` in a password as %3F and %23); write {FORM}"
        ));
    }
    if rest.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("holds white space or a control character".to_owned());
    }
    // The userinfo ends at the last `@` (a password may hold `/`, `@` or `,`).
    let (userinfo, rest) = match rest.rfind('@') {
        Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
        None => (None, rest),
    };
    let (username, password) = match userinfo {
        None => (None, None),
        Some(info) => {
            let (u, p) = match info.split_once(':') {
                Some((u, p)) => (u, Some(p)),
                None => (info, None),
            };
            let user =
                percent_decoded(u).ok_or("the user name holds a malformed %-escape".to_owned())?;
            let pass = match p {
                Some(p) => Some(
                    percent_decoded(p)
                        .ok_or("the password holds a malformed %-escape".to_owned())?,
                ),
                None => None,
            };
            (
                (!user.is_empty()).then_some(user),
                pass.filter(|p| !p.is_empty()),
            )
        }
    };
    let (hosts, path) = rest.split_once('/').unwrap_or((rest, ""));
    if hosts.is_empty() {
        return Err(format!("names no Sentinel; write {FORM}"));
    }
    let sentinels = hosts
        .split(',')
        .map(host_port)
        .collect::<Result<Vec<_>, _>>()?;
    if sentinels.len() > MAX_SENTINELS {
        return Err(format!("lists more than {MAX_SENTINELS} Sentinels"));
    }
    let mut parts = path.split('/');
    let master = parts.next().unwrap_or_default();
    let master =
        percent_decoded(master).ok_or("the master name holds a malformed %-escape".to_owned())?;
    if master.is_empty() {
        return Err(format!(
            "names no master; add the name the Sentinels monitor (`sentinel monitor <name> ...`) after the Sentinels: {FORM}"
        ));
    }
    if master.len() > MAX_MASTER_NAME || master.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(format!(
            "the master name must be 1 to {MAX_MASTER_NAME} characters without white space"
        ));
    }
    let db = match parts.next() {
        None | Some("") => 0,
        Some(d) => match d.parse::<i64>() {
            Ok(n) if (0..=1_000_000).contains(&n) && d.bytes().all(|c| c.is_ascii_digit()) => n,
            _ => return Err(format!("`{d}` is not a database number")),
        },
    };
    if parts.any(|p| !p.is_empty()) {
        return Err(format!("more path than /<master-name>/<db>; write {FORM}"));
    }
    Ok(SentinelUrl {
        tls,
        sentinels,
        master,
        db,
        username,
        password,
    })
}

impl Inner {
    /// How to reach `host:port`, plain or over TLS, as the URL's user (`auth`), and in its
    /// database when it is a primary (a Sentinel has none).
    fn client(
        &self,
        url: &SentinelUrl,
        (host, port): (&str, u16),
        auth: bool,
        primary: bool,
    ) -> RedisResult<redis::Client> {
        let insecure = self.opts.tls.as_ref().is_some_and(|t| t.insecure());
        let addr = if url.tls {
            ConnectionAddr::TcpTls {
                host: host.to_owned(),
                port,
                insecure,
                tls_params: None,
            }
        } else {
            ConnectionAddr::Tcp(host.to_owned(), port)
        };
        let redis = if auth {
            RedisConnectionInfo {
                db: if primary { url.db } else { 0 },
                username: url.username.clone(),
                password: url.password.clone(),
                ..Default::default()
            }
        } else {
            RedisConnectionInfo::default()
        };
        let info = ConnectionInfo { addr, redis };
        match &self.opts.tls {
            Some(t) if url.tls && !insecure => {
                redis::Client::build_with_tls(info, t.certificates())
            }
            _ => redis::Client::open(info),
        }
    }

    async fn open(&self, client: &redis::Client) -> RedisResult<redis::aio::MultiplexedConnection> {
        let ct = self.opts.connect_timeout;
        let cfg = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(ct)
            .set_response_timeout(ct);
        client
            .get_multiplexed_async_connection_with_config(&cfg)
            .await
    }

    /// `SENTINEL get-master-addr-by-name` on one Sentinel, again with the URL's credentials
    /// when it answers `NOAUTH`.
    async fn ask_one(
        &self,
        url: &SentinelUrl,
        host: &str,
        port: u16,
    ) -> RedisResult<(String, u16)> {
        let mut cmd = redis::cmd("SENTINEL");
        cmd.arg("get-master-addr-by-name").arg(&url.master);
        let mut auth = false;
        loop {
            let mut conn = self
                .open(&self.client(url, (host, port), auth, false)?)
                .await?;
            match cmd.query_async::<Option<(String, u16)>>(&mut conn).await {
                Ok(Some(addr)) => return Ok(addr),
                Ok(None) => {
                    return Err(RedisError::from((
                        ErrorKind::ResponseError,
                        "unknown master",
                        format!(
                            "Sentinel {host}:{port} monitors no master named `{}`",
                            url.master
                        ),
                    )))
                }
                Err(e) if !auth && e.code() == Some("NOAUTH") && url.password.is_some() => {
                    auth = true;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The primary the first Sentinel that answers names, as `(host, port)`.
    pub(super) async fn ask_sentinels(&self, url: &SentinelUrl) -> RedisResult<(String, u16)> {
        let mut errors = Vec::new();
        for (host, port) in &url.sentinels {
            let asked =
                tokio::time::timeout(self.opts.connect_timeout, self.ask_one(url, host, *port))
                    .await;
            match asked {
                Ok(Ok(addr)) => return Ok(addr),
                Ok(Err(e)) => errors.push(format!("{host}:{port}: {e}")),
                Err(_) => errors.push(format!("{host}:{port}: no answer")),
            }
        }
        Err(RedisError::from((
            ErrorKind::IoError,
            "no Sentinel named the primary",
            errors.join("; "),
        )))
    }

    /// Ask the Sentinels for the primary, connect to it and check that it is one. Returns the
    /// connection and the primary's `host:port`.
    pub(super) async fn connect_sentinel(&self, url: &SentinelUrl) -> RedisResult<(Conn, String)> {
        let (host, port) = self.ask_sentinels(url).await?;
        let conn = Conn::Single(
            self.open(&self.client(url, (&host, port), true, true)?)
                .await?,
        );
        let addr = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        super::conn::refuse_replica(&conn, &format!("the primary the Sentinels name ({addr})"))
            .await?;
        Ok((conn, addr))
    }
}

/// Every [`CHECK_EVERY`], ask the Sentinels for the primary; when they name another one than
/// the store is connected to, build a connection to it (it replaces the current one).
pub(super) async fn follow(weak: Weak<Inner>) {
    loop {
        tokio::time::sleep(CHECK_EVERY).await;
        let Some(inner) = weak.upgrade() else { return };
        let RedisTarget::Sentinel(url) = &inner.target else {
            return;
        };
        if inner.reconnecting.load(Ordering::Acquire) {
            continue;
        }
        let Ok(url) = parse(url) else { return };
        let current = inner.primary.lock().clone();
        let named = inner.ask_sentinels(&url).await;
        if let (Ok((host, port)), Some(current)) = (named, current) {
            let named = if host.contains(':') {
                format!("[{host}]:{port}")
            } else {
                format!("{host}:{port}")
            };
            if named != current {
                tracing::debug!(from = %current, to = %named, "the Sentinels name another primary; connecting to it");
                inner.reconnect();
            }
        }
    }
}

/// Shared by `follow` and the reconnection: record the primary a new connection reaches, and
/// log and count a switch.
pub(super) fn switched(inner: &Arc<Inner>, now: &str) {
    let before = inner.primary.lock().replace(now.to_owned());
    match before {
        Some(before) if before != now => {
            let n = inner.failovers.fetch_add(1, Ordering::Relaxed) + 1;
            tracing::warn!(
                from = %before,
                to = %now,
                failovers = n,
                "redis primary switched: {before} -> {now} (named by the Sentinels)"
            );
        }
        Some(_) => {}
        None => tracing::info!(primary = %now, "redis store: the Sentinels name {now} as primary"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(u: &str) -> SentinelUrl {
        parse(u).unwrap_or_else(|e| panic!("{u}: {e}"))
    }

    fn err(u: &str) -> String {
        match parse(u) {
            Ok(s) => panic!("{u} parsed as {s:?}"),
            Err(e) => e,
        }
    }

    #[test]
    fn sentinel_urls_name_sentinels_a_master_and_a_database() {
        let s = ok("redis+sentinel://10.0.0.1:26379,10.0.0.2:26380,sentinel-3/mymaster/2");
        assert!(!s.tls);
        assert_eq!(
            s.sentinels,
            [
                ("10.0.0.1".to_owned(), 26379),
                ("10.0.0.2".to_owned(), 26380),
                ("sentinel-3".to_owned(), DEFAULT_PORT)
            ]
        );
        assert_eq!((s.master.as_str(), s.db), ("mymaster", 2));
        assert_eq!((s.username, s.password), (None, None));

        let s = ok("rediss+sentinel://default:p%40ss%2Fw,rd@[::1]:26379/primary-1");
        assert!(s.tls);
        assert_eq!(s.sentinels, [("::1".to_owned(), 26379)]);
        assert_eq!(s.username.as_deref(), Some("default"));
        assert_eq!(s.password.as_deref(), Some("p@ss/w,rd"));
        assert_eq!(s.db, 0);
        // A password with a raw `@` and `/`: everything to the last `@` is userinfo.
        let s = ok("redis+sentinel://:a@b/c@h:1/m/");
        assert_eq!(s.password.as_deref(), Some("a@b/c"));
        assert_eq!(s.username, None);
        assert_eq!(s.master, "m");
    }

    #[test]
    fn hostile_sentinel_urls_are_refused_with_the_fix_and_no_password() {
        for (u, says) in [
            ("redis+sentinel://h:1", "names no master"),
            ("redis+sentinel://h:1/", "names no master"),
            ("redis+sentinel:///m", "names no Sentinel"),
            ("redis+sentinel://:pw@/m", "names no Sentinel"),
            ("redis+sentinel://h:1,,h:2/m", "has no host"),
            ("redis+sentinel://h:0/m", "not a port"),
            ("redis+sentinel://h:65536/m", "not a port"),
            ("redis+sentinel://h:+1/m", "not a port"),
            ("redis+sentinel://h:1x/m", "not a port"),
            ("redis+sentinel://[::1/m", "without closing"),
            ("redis+sentinel://[nothex]:1/m", "not an IPv6"),
            ("redis+sentinel://h\u{e9}:1/m", "not a host"),
            ("redis+sentinel://h:1/m/x", "not a database"),
            ("redis+sentinel://h:1/m/-1", "not a database"),
            ("redis+sentinel://h:1/m/1/2", "more path"),
            ("redis+sentinel://h:1/m%zz", "malformed"),
            ("redis+sentinel://h:1/a%20b", "without white space"),
            ("redis+sentinel://h:1/m?sentinelPassword=x", "query"),
            ("redis+sentinel://h:1/m n", "white space"),
            ("redis://h:1/m", "not a Sentinel URL"),
        ] {
            let e = err(u);
            assert!(e.contains(says), "{u}: {e}");
        }
        let long_name = format!("redis+sentinel://h:1/{}", "m".repeat(MAX_MASTER_NAME + 1));
        assert!(err(&long_name).contains("1 to 128"));
        let many: Vec<String> = (0..=MAX_SENTINELS).map(|i| format!("h{i}:1")).collect();
        assert!(err(&format!("redis+sentinel://{}/m", many.join(","))).contains("more than 16"));
        assert!(err(&format!("redis+sentinel://h:1/{}", "m".repeat(MAX_URL))).contains("longer"));
        // The password never appears in an error, nor in `Debug`.
        for u in [
            "redis+sentinel://u:hunter2@h:1",
            "redis+sentinel://u:hunter2@h:0/m",
            "redis+sentinel://u:hunter2%zz@h:1/m",
        ] {
            assert!(!err(u).contains("hunter2"), "{}", err(u));
        }
        let s = ok("redis+sentinel://u:hunter2@h:1/m");
        assert!(!format!("{s:?}").contains("hunter2"));
    }
}
