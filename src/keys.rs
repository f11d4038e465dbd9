//! Principal keys, as pure functions: IP normalisation, agent-id validation, the key format
//! of each key kind, and the digest under which a bucket is stored.
//!
//! Raw agent ids, user ids and tokens never reach a store: a bucket is named by its limiter
//! and a 16-byte digest of `limiter NUL principal-key`. Which digest is a [`KeyDigest`]:
//! SHA-256 (first 16 bytes) wherever the name leaves the process (Redis, logs), so every
//! instance computes the same one; SipHash-1-3 (128-bit) under a per-process random key for
//! buckets that never leave it (the memory store), which a client cannot aim collisions at
//! either and which costs a fraction of SHA-256's rounds.

pub(crate) mod body;
mod label;

pub(crate) use label::Seed;

use sha2::{Digest, Sha256};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

/// Longest `X-Agent-ID` that counts as an agent id.
pub(crate) const MAX_AGENT_ID_LEN: usize = 128;

/// Which principal a limiter meters.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum KeyKind {
    /// The normalised client IP.
    Ip,
    /// `<ip>:<agent-id or none>`: each enrolled agent behind one NAT gets its own bucket.
    IpAgent,
    /// `user:<sub>` from a verified token, else `ip:<ip>`.
    UserOrIp,
    /// `cred:<hex SHA-256 of the bearer token>` for a request presenting an API key or bearer
    /// token, else `ip:<ip>`. The raw value is never part of any stored name.
    Credential,
    /// `hdr:<value>` of the named header, which a trusted proxy sets (`key = "header:<name>"`;
    /// the name lower-case), else `ip:<ip>`.
    Header(Arc<str>),
    /// `key:<value>` of the named header as any client sends it (`key = "client-header:<name>"`:
    /// an API key in `X-API-Key`), else `ip:<ip>`. Like every key it is stored only as a digest,
    /// and `explain` shows a digest of it, never the value.
    ClientHeader(Arc<str>),
    /// `body:<value>` of a top-level field of the request's JSON or form body, normalised
    /// (see `keys::body`), else `ip:<ip>` (`key = "body:<field>"`).
    Body(Arc<str>),
    /// `body:<value>+ip:<ip>`: the field's value and the client's address together, else
    /// `ip:<ip>` (`key = "body:<field>+ip"`). An attempt ceiling with a lockout keys so: a
    /// stranger's wrong answers lock the stranger's address out of the account, not its owner.
    BodyIp(Arc<str>),
    /// `claim:<value>` of the named claim of the request's verified token (`key =
    /// "claim:<name>"`: an organisation, a workspace), else `user:<sub>` for a verified token
    /// without it, else `ip:<ip>`, as `user-or-ip` falls back.
    Claim(Arc<str>),
    /// `<ip>+path:<id>`: the client's address and the segment of the request's path that
    /// stands where the route's `{name}` does (`key = "ip+path:<name>"`), for APIs that carry
    /// the agent's id in the path; the segment counts under the `X-Agent-ID` rules
    /// (`valid_path_id`), else `ip:<ip>`.
    IpPath(Arc<str>),
    /// `global`: one bucket for every client of the limiter's routes.
    Global,
}

/// Longest header value a `header:<name>` key reads; a longer one keys on the IP.
pub(crate) const MAX_KEY_HEADER_LEN: usize = 128;

/// A `header:<name>` key's value counts when it is 1–128 bytes of visible ASCII (no spaces or
/// control characters); anything else keys on the IP, so junk values cannot mint buckets.
pub(crate) fn valid_key_header(raw: &[u8]) -> Option<&str> {
    let ok = !raw.is_empty()
        && raw.len() <= MAX_KEY_HEADER_LEN
        && raw.iter().all(|b| (0x21..=0x7e).contains(b));
    if ok {
        std::str::from_utf8(raw).ok()
    } else {
        None
    }
}

/// The principal's part of a `credential` key: hex SHA-256 of the token (64 characters), so the
/// token itself never reaches a key, a log or a store.
pub(crate) fn credential_digest(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// Everything a principal key can be made of, for one request. `credential` is already
/// digested ([`credential_digest`]); `header` already validated ([`valid_key_header`]) and read
/// only from a trusted proxy.
#[derive(Debug, Clone, Copy, Default)]
pub struct Principal<'a> {
    pub ip: &'a str,
    pub agent_id: Option<&'a str>,
    pub user: Option<&'a str>,
    pub credential: Option<&'a str>,
    pub header: Option<&'a str>,
    /// The limiter's body field, already normalised ([`body::normalize`]).
    pub body: Option<&'a str>,
    /// The value of the limiter's claim in the verified token (`claim:<name>` keys).
    pub claim: Option<&'a str>,
    /// The id the request's path carries where the limiter's route names `{name}`
    /// (`ip+path:<name>` keys), already validated ([`valid_path_id`]).
    pub path: Option<&'a str>,
}

impl KeyKind {
    /// The kind's name (`header` for every header key; [`KeyKind::header`] names which).
    pub fn as_str(&self) -> &'static str {
        match self {
            KeyKind::Ip => "ip",
            KeyKind::IpAgent => "ip+agent",
            KeyKind::UserOrIp => "user-or-ip",
            KeyKind::Credential => "credential",
            KeyKind::Header(_) => "header",
            KeyKind::ClientHeader(_) => "client-header",
            KeyKind::Body(_) => "body",
            KeyKind::BodyIp(_) => "body+ip",
            KeyKind::Claim(_) => "claim",
            KeyKind::IpPath(_) => "ip+path",
            KeyKind::Global => "global",
        }
    }

    /// Whether the key names what a request targets (a header a proxy sets, a field of the
    /// body) rather than who sends it: a limiter keyed so should not name itself in its answers
    /// (`disclose = false`), or its refusals tell the client which targets exist.
    pub fn names_target(&self) -> bool {
        matches!(
            self,
            KeyKind::Header(_) | KeyKind::Body(_) | KeyKind::BodyIp(_)
        )
    }

    /// The body field a `body:<field>` key reads, if it is one.
    pub fn body_field(&self) -> Option<&str> {
        match self {
            KeyKind::Body(field) | KeyKind::BodyIp(field) => Some(field),
            _ => None,
        }
    }

    /// The path parameter an `ip+path:<name>` key reads, if it is one.
    pub fn path_param(&self) -> Option<&str> {
        match self {
            KeyKind::IpPath(name) => Some(name),
            _ => None,
        }
    }

    /// The claim a `claim:<name>` key reads, if it is one.
    pub fn claim(&self) -> Option<&str> {
        match self {
            KeyKind::Claim(name) => Some(name),
            _ => None,
        }
    }

    /// The header a `header:<name>` or `client-header:<name>` key reads (lower-case), if it is
    /// one.
    pub fn header(&self) -> Option<&str> {
        match self {
            KeyKind::Header(name) | KeyKind::ClientHeader(name) => Some(name),
            _ => None,
        }
    }

    /// Whether the key's header is read from any client (`client-header:<name>`), not only from a
    /// trusted proxy.
    pub fn header_from_any_client(&self) -> bool {
        matches!(self, KeyKind::ClientHeader(_))
    }
}

impl std::fmt::Display for KeyKind {
    /// As the configuration writes it: `ip`, `ip+agent`, ..., `header:<name>`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyKind::Header(name) => write!(f, "header:{name}"),
            KeyKind::ClientHeader(name) => write!(f, "client-header:{name}"),
            KeyKind::Body(field) => write!(f, "body:{field}"),
            KeyKind::BodyIp(field) => write!(f, "body:{field}+ip"),
            KeyKind::Claim(name) => write!(f, "claim:{name}"),
            KeyKind::IpPath(name) => write!(f, "ip+path:{name}"),
            other => f.write_str(other.as_str()),
        }
    }
}

/// Normalise a client address into the string its buckets are keyed on.
///
/// IPv4 is unchanged; IPv4-mapped IPv6 becomes the IPv4 address; any other IPv6 becomes its
/// network of `v6_prefix` bits (clamped to 32..=64) in CIDR form, e.g. `2001:db8:abcd:1200::/56`.
pub fn normalize_ip(ip: IpAddr, v6_prefix: u8) -> String {
    match ip.to_canonical() {
        IpAddr::V4(v4) => dotted_quad(v4),
        IpAddr::V6(v6) => {
            let prefix = v6_prefix.clamp(32, 64);
            let bits = u128::from(v6);
            let mask = u128::MAX << (128 - prefix as u32);
            format!("{}/{}", Ipv6Addr::from(bits & mask), prefix)
        }
    }
}

/// `a.b.c.d`, written without the formatting machinery: it is on every request's path.
fn dotted_quad(v4: Ipv4Addr) -> String {
    let mut s = String::with_capacity(15);
    for (i, o) in v4.octets().into_iter().enumerate() {
        if i > 0 {
            s.push('.');
        }
        if o >= 100 {
            s.push(char::from(b'0' + o / 100));
        }
        if o >= 10 {
            s.push(char::from(b'0' + o / 10 % 10));
        }
        s.push(char::from(b'0' + o % 10));
    }
    s
}

/// `X-Agent-ID` counts only when it is 1–128 characters of `[A-Za-z0-9._:-]`.
pub fn valid_agent_id(raw: &[u8]) -> Option<&str> {
    let ok = !raw.is_empty()
        && raw.len() <= MAX_AGENT_ID_LEN
        && raw
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'));
    if ok {
        std::str::from_utf8(raw).ok()
    } else {
        None
    }
}

/// An id read from a path segment (`ip+path:<name>` keys) counts under the `X-Agent-ID` rules:
/// 1–128 characters of `[A-Za-z0-9._:-]`, read from the canonical path, the very path the
/// upstream receives (escapes of unreserved characters already decoded there, so `ag%65nt-1`
/// is `agent-1` for the gateway and the upstream alike). Any escape left in the segment
/// (`%2F`, `%20`, a non-ASCII character), a `.` or `..` segment, and an empty or overlong one
/// is not an id: the request keys on its address (`ip:<ip>`), where every such request of the
/// address shares one bucket.
pub(crate) fn valid_path_id(segment: &str) -> Option<&str> {
    if segment == "." || segment == ".." {
        return None;
    }
    valid_agent_id(segment.as_bytes())
}

/// The principal key of one kind, before digesting. `ip` is already normalised.
pub fn principal_key(
    kind: KeyKind,
    ip: &str,
    agent_id: Option<&str>,
    user: Option<&str>,
) -> String {
    principal_key_of(
        &kind,
        &Principal {
            ip,
            agent_id,
            user,
            ..Principal::default()
        },
    )
}

/// [`principal_key`] for every key kind, from all of a request's principal facts.
pub(crate) fn principal_key_of(kind: &KeyKind, p: &Principal<'_>) -> String {
    let (parts, n) = principal_parts(kind, p);
    parts[..n].concat()
}

/// How a key was made, for an operator (`explain`): the address, the agent id and the claim as
/// they are (the operator sent them), a credential only as the first digits of its digest.
pub(crate) fn describe(kind: &KeyKind, p: &Principal<'_>) -> String {
    let ip = || format!("ip {}", p.ip);
    match kind {
        KeyKind::Ip => ip(),
        KeyKind::IpAgent => match p.agent_id {
            Some(a) => format!("ip {} + agent {a}", p.ip),
            None => format!("ip {} + no agent id", p.ip),
        },
        KeyKind::UserOrIp => match p.user {
            Some(u) => format!("user {u} (verified)"),
            None => format!("{} (no verified token)", ip()),
        },
        KeyKind::Credential => match p.credential {
            Some(c) => format!("credential sha256:{}…", c.get(..12).unwrap_or(c)),
            None => format!("{} (no bearer token)", ip()),
        },
        KeyKind::Header(name) => match p.header {
            Some(v) => format!("header {name}: {v}"),
            None => format!("{} (no {name} from a trusted proxy)", ip()),
        },
        KeyKind::ClientHeader(name) => match p.header {
            Some(v) => {
                let d = credential_digest(v);
                format!("{name} sha256:{}…", d.get(..12).unwrap_or(&d))
            }
            None => format!("{} (no {name})", ip()),
        },
        KeyKind::Body(field) => match p.body {
            Some(v) => format!("body {field}: {v}"),
            None => format!("{} (no body field {field})", ip()),
        },
        KeyKind::BodyIp(field) => match p.body {
            Some(v) => format!("body {field}: {v} + ip {}", p.ip),
            None => format!("{} (no body field {field})", ip()),
        },
        KeyKind::Claim(name) => match (p.claim, p.user) {
            (Some(v), _) => format!("claim {name}: {v} (verified)"),
            (None, Some(u)) => format!("user {u} (verified token without {name})"),
            (None, None) => format!("{} (no verified token)", ip()),
        },
        KeyKind::IpPath(name) => match p.path {
            Some(v) => format!("ip {} + path {name} {v}", p.ip),
            None => format!("{} (no {{{name}}} id in the path)", ip()),
        },
        KeyKind::Global => "global (one bucket for every client)".to_owned(),
    }
}

/// First 16 bytes of SHA-256 over `limiter NUL principal`.
pub fn digest(limiter: &str, principal: &str) -> [u8; 16] {
    digest_parts(limiter, &[principal])
}

/// [`digest`] of the principal made by concatenating `parts`, without building it.
fn digest_parts(limiter: &str, parts: &[&str]) -> [u8; 16] {
    let mut h = Sha256::new();
    h.update(limiter.as_bytes());
    h.update([0u8]);
    for p in parts {
        h.update(p.as_bytes());
    }
    let full = h.finalize();
    let mut out = [0u8; 16];
    out.copy_from_slice(&full[..16]);
    out
}

/// How bucket names are digested: the same on every instance, or private to this process.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum KeyDigest {
    /// SHA-256, first 16 bytes: the name every instance computes for the same principal.
    Shared,
    /// SipHash-1-3, 128-bit, under this process's random key: for buckets that never leave it.
    Local { k0: u64, k1: u64 },
}

impl fmt::Debug for KeyDigest {
    /// The key stays out of debug output.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyDigest::Shared => f.write_str("Shared"),
            KeyDigest::Local { .. } => f.write_str("Local"),
        }
    }
}

impl KeyDigest {
    /// A [`KeyDigest::Local`] under a key drawn from the operating system's randomness.
    pub fn local() -> Self {
        use rand::RngCore;
        let mut rng = rand::rngs::OsRng;
        KeyDigest::Local {
            k0: rng.next_u64(),
            k1: rng.next_u64(),
        }
    }

    /// The bucket one limiter keeps for the principal [`principal_key`] names, digested from
    /// its parts without building the string.
    pub fn bucket(
        &self,
        limiter: Arc<str>,
        kind: KeyKind,
        ip: &str,
        agent_id: Option<&str>,
        user: Option<&str>,
    ) -> BucketKey {
        self.bucket_of(
            limiter,
            &kind,
            &Principal {
                ip,
                agent_id,
                user,
                ..Principal::default()
            },
        )
    }

    /// [`KeyDigest::bucket`] for every key kind, from all of a request's principal facts.
    pub fn bucket_of(&self, limiter: Arc<str>, kind: &KeyKind, p: &Principal<'_>) -> BucketKey {
        let (parts, n) = principal_parts(kind, p);
        let digest = match *self {
            KeyDigest::Shared => digest_parts(&limiter, &parts[..n]),
            KeyDigest::Local { k0, k1 } => {
                use siphasher::sip128::{Hasher128, SipHasher13};
                use std::hash::Hasher;
                let mut h = SipHasher13::new_with_keys(k0, k1);
                h.write(limiter.as_bytes());
                h.write(&[0]);
                for p in &parts[..n] {
                    h.write(p.as_bytes());
                }
                h.finish128().as_bytes()
            }
        };
        BucketKey { limiter, digest }
    }
}

/// The pieces of [`principal_key`]'s string, in order (their concatenation is the key).
fn principal_parts<'a>(kind: &KeyKind, p: &Principal<'a>) -> ([&'a str; 4], usize) {
    let ip = p.ip;
    match kind {
        KeyKind::Ip => ([ip, "", "", ""], 1),
        KeyKind::IpAgent => ([ip, ":", p.agent_id.unwrap_or("none"), ""], 3),
        KeyKind::UserOrIp => match p.user {
            Some(sub) => (["user:", sub, "", ""], 2),
            None => (["ip:", ip, "", ""], 2),
        },
        KeyKind::Credential => match p.credential {
            Some(c) => (["cred:", c, "", ""], 2),
            None => (["ip:", ip, "", ""], 2),
        },
        KeyKind::Header(_) => match p.header {
            Some(h) => (["hdr:", h, "", ""], 2),
            None => (["ip:", ip, "", ""], 2),
        },
        KeyKind::ClientHeader(_) => match p.header {
            Some(h) => (["key:", h, "", ""], 2),
            None => (["ip:", ip, "", ""], 2),
        },
        KeyKind::Body(_) => match p.body {
            Some(v) => (["body:", v, "", ""], 2),
            None => (["ip:", ip, "", ""], 2),
        },
        KeyKind::BodyIp(_) => match p.body {
            Some(v) => (["body:", v, "+ip:", ip], 4),
            None => (["ip:", ip, "", ""], 2),
        },
        KeyKind::Claim(_) => match (p.claim, p.user) {
            (Some(v), _) => (["claim:", v, "", ""], 2),
            (None, Some(sub)) => (["user:", sub, "", ""], 2),
            (None, None) => (["ip:", ip, "", ""], 2),
        },
        KeyKind::IpPath(_) => match p.path {
            Some(v) => ([ip, "+path:", v, ""], 3),
            None => (["ip:", ip, "", ""], 2),
        },
        KeyKind::Global => (["global", "", "", ""], 1),
    }
}

/// Where one limiter keeps one principal's bucket.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BucketKey {
    pub limiter: Arc<str>,
    pub digest: [u8; 16],
}

impl BucketKey {
    pub fn new(limiter: Arc<str>, principal: &str) -> Self {
        let digest = digest(&limiter, principal);
        Self { limiter, digest }
    }

    /// The bucket of the principal [`principal_key`] names, digested from its parts: the same
    /// digest as `BucketKey::new(limiter, &principal_key(..))`, without the string.
    pub fn of_principal(
        limiter: Arc<str>,
        kind: KeyKind,
        ip: &str,
        agent_id: Option<&str>,
        user: Option<&str>,
    ) -> Self {
        KeyDigest::Shared.bucket(limiter, kind, ip, agent_id, user)
    }

    pub fn digest_hex(&self) -> String {
        hex::encode(self.digest)
    }
}

impl fmt::Display for BucketKey {
    /// `<limiter>:<hex digest>`: the stored name of the bucket.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.limiter, hex::encode(self.digest))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn ipv4_is_unchanged() {
        assert_eq!(normalize_ip(ip("203.0.113.5"), 56), "203.0.113.5");
    }

    #[test]
    fn ipv4_written_like_display() {
        for o in 0..=255u8 {
            let cases = [
                Ipv4Addr::new(o, 0, 10, 255),
                Ipv4Addr::new(1, o, o, 100),
                Ipv4Addr::new(99, 9, 0, o),
            ];
            for v4 in cases {
                assert_eq!(normalize_ip(IpAddr::V4(v4), 56), v4.to_string());
            }
        }
    }

    #[test]
    fn ipv4_mapped_becomes_ipv4() {
        assert_eq!(normalize_ip(ip("::ffff:203.0.113.5"), 56), "203.0.113.5");
    }

    #[test]
    fn ipv6_is_masked_to_prefix() {
        assert_eq!(
            normalize_ip(ip("2001:db8:abcd:12ff:1:2:3:4"), 56),
            "2001:db8:abcd:1200::/56"
        );
        assert_eq!(
            normalize_ip(ip("2001:db8:abcd:12ff:1:2:3:4"), 64),
            "2001:db8:abcd:12ff::/64"
        );
        assert_eq!(
            normalize_ip(ip("2001:db8:abcd:12ff::1"), 32),
            "2001:db8::/32"
        );
        // Out-of-range prefixes are clamped.
        assert_eq!(
            normalize_ip(ip("2001:db8:abcd:12ff::1"), 8),
            "2001:db8::/32"
        );
        assert_eq!(
            normalize_ip(ip("2001:db8:abcd:12ff:1::1"), 128),
            "2001:db8:abcd:12ff::/64"
        );
    }

    #[test]
    fn same_56_shares_next_56_does_not() {
        let a = normalize_ip(ip("2001:db8:abcd:1200::1"), 56);
        let b = normalize_ip(ip("2001:db8:abcd:12ff:ffff::9"), 56);
        let c = normalize_ip(ip("2001:db8:abcd:1300::1"), 56);
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn agent_id_rules() {
        assert_eq!(
            valid_agent_id(b"agent-01.site_a:x"),
            Some("agent-01.site_a:x")
        );
        assert_eq!(valid_agent_id(b""), None);
        assert_eq!(valid_agent_id(b"has space"), None);
        assert_eq!(valid_agent_id(b"slash/no"), None);
        assert_eq!(valid_agent_id("caf\u{e9}".as_bytes()), None);
        assert_eq!(valid_agent_id(&[b'a'; 128]).map(str::len), Some(128));
        assert_eq!(valid_agent_id(&[b'a'; 129]), None);
    }

    #[test]
    fn a_path_id_counts_under_the_agent_id_rules() {
        assert_eq!(
            valid_path_id("agent-01.site_a:x"),
            Some("agent-01.site_a:x")
        );
        for junk in ["", ".", "..", "a%2Fb", "a%20b", "caf%C3%A9", "a b", "a/b"] {
            assert_eq!(valid_path_id(junk), None, "{junk}");
        }
        assert_eq!(valid_path_id(&"a".repeat(128)).map(str::len), Some(128));
        assert_eq!(valid_path_id(&"a".repeat(129)), None);
        let kind = KeyKind::IpPath(Arc::from("id"));
        let at = |path: Option<&str>| {
            principal_key_of(
                &kind,
                &Principal {
                    ip: "192.0.2.7",
                    path,
                    agent_id: Some("header-id"),
                    ..Principal::default()
                },
            )
        };
        assert_eq!(at(Some("agent-1")), "192.0.2.7+path:agent-1");
        assert_eq!(at(None), "ip:192.0.2.7", "no id: the address alone");
        assert_ne!(at(Some("ip")), at(None));
        assert_eq!(kind.to_string(), "ip+path:id");
        assert_eq!(kind.path_param(), Some("id"));
        assert!(!kind.names_target());
    }

    #[test]
    fn principal_key_formats() {
        assert_eq!(
            principal_key(KeyKind::Ip, "1.2.3.4", Some("a"), Some("u")),
            "1.2.3.4"
        );
        assert_eq!(
            principal_key(KeyKind::IpAgent, "1.2.3.4", Some("a1"), None),
            "1.2.3.4:a1"
        );
        assert_eq!(
            principal_key(KeyKind::IpAgent, "1.2.3.4", None, None),
            "1.2.3.4:none"
        );
        assert_eq!(
            principal_key(KeyKind::UserOrIp, "1.2.3.4", None, Some("user_9")),
            "user:user_9"
        );
        assert_eq!(
            principal_key(KeyKind::UserOrIp, "1.2.3.4", None, None),
            "ip:1.2.3.4"
        );
    }

    #[test]
    fn an_account_and_address_key_is_both_and_neither_alone() {
        let field: Arc<str> = Arc::from("email");
        let at = |kind: &KeyKind, ip: &str, body: Option<&str>| {
            principal_key_of(
                kind,
                &Principal {
                    ip,
                    body,
                    ..Principal::default()
                },
            )
        };
        let both = KeyKind::BodyIp(field.clone());
        let account = KeyKind::Body(field);
        assert_eq!(
            at(&both, "198.51.100.7", Some("victim@example.com")),
            "body:victim@example.com+ip:198.51.100.7"
        );
        assert_eq!(at(&both, "198.51.100.7", None), "ip:198.51.100.7");
        assert_ne!(
            at(&both, "198.51.100.7", Some("victim@example.com")),
            at(&both, "203.0.113.9", Some("victim@example.com")),
            "each address its own lock"
        );
        assert_ne!(
            at(&both, "198.51.100.7", Some("victim@example.com")),
            at(&account, "198.51.100.7", Some("victim@example.com"))
        );
        assert_eq!(both.to_string(), "body:email+ip");
        assert_eq!(both.body_field(), Some("email"));
        assert!(both.names_target());
        let local = KeyDigest::local();
        let p = Principal {
            ip: "198.51.100.7",
            body: Some("victim@example.com"),
            ..Principal::default()
        };
        assert_eq!(
            KeyDigest::Shared
                .bucket_of(Arc::from("l"), &both, &p)
                .digest,
            digest("l", "body:victim@example.com+ip:198.51.100.7")
        );
        assert_ne!(
            local.bucket_of(Arc::from("l"), &both, &p),
            local.bucket_of(Arc::from("l"), &account, &p)
        );
    }

    #[test]
    fn digest_from_parts_is_the_digest_of_the_key() {
        for kind in [KeyKind::Ip, KeyKind::IpAgent, KeyKind::UserOrIp] {
            for (agent, user) in [
                (None, None),
                (Some("agent-7"), None),
                (None, Some("user_9")),
                (Some("a"), Some("u")),
            ] {
                let key = principal_key(kind.clone(), "2001:db8::/56", agent, user);
                assert_eq!(
                    BucketKey::of_principal(
                        Arc::from("agent-device"),
                        kind.clone(),
                        "2001:db8::/56",
                        agent,
                        user
                    ),
                    BucketKey::new(Arc::from("agent-device"), &key),
                    "{kind:?} {agent:?} {user:?}"
                );
            }
        }
    }

    #[test]
    fn a_local_digest_is_keyed_and_separates_what_the_shared_one_does() {
        let a = KeyDigest::local();
        let b = KeyDigest::local();
        let name: Arc<str> = Arc::from("agent-device");
        let key = |d: &KeyDigest, ip: &str, agent: Option<&str>| {
            d.bucket(name.clone(), KeyKind::IpAgent, ip, agent, None)
        };
        let one = key(&a, "192.0.2.7", Some("agent-1"));
        assert_eq!(
            one,
            key(&a, "192.0.2.7", Some("agent-1")),
            "stable in one process"
        );
        assert_ne!(
            one,
            key(&b, "192.0.2.7", Some("agent-1")),
            "keyed per process"
        );
        assert_ne!(one, key(&a, "192.0.2.7", Some("agent-2")));
        assert_ne!(one, key(&a, "192.0.2.8", Some("agent-1")));
        assert_ne!(
            one,
            key(&KeyDigest::Shared, "192.0.2.7", Some("agent-1")),
            "not the shared name"
        );
        assert_ne!(
            a.bucket(
                name.clone(),
                KeyKind::UserOrIp,
                "192.0.2.7",
                None,
                Some("u")
            ),
            a.bucket(
                Arc::from("ui"),
                KeyKind::UserOrIp,
                "192.0.2.7",
                None,
                Some("u")
            ),
            "the limiter is part of the name"
        );
        assert_eq!(format!("{a:?}"), "Local", "the key never prints");
    }

    #[test]
    fn digest_depends_on_limiter_and_principal() {
        let a = digest("enrollment", "1.2.3.4");
        assert_ne!(a, digest("download", "1.2.3.4"));
        assert_ne!(a, digest("enrollment", "1.2.3.5"));
        assert_eq!(a, digest("enrollment", "1.2.3.4"));
        // No ambiguity between the two fields.
        assert_ne!(digest("ab", "c"), digest("a", "bc"));
    }
}
