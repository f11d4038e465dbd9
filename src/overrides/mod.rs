//! Overrides: another limit for one limiter and one principal (an address or range, an agent
//! id, a user, a claim value, exact or by prefix), from the configuration (`[[overrides]]`) and
//! from the admin listener at run time, optionally until an instant.
//!
//! An override gives each principal it matches a bucket of its own under the override's budget
//! (the limiter's name and the override's id name it), so it applies at once: a raised limit
//! admits a refused client now, a lowered one holds it to the new budget from now on. When the
//! override ends, the principal's own bucket, refilled meanwhile, applies again.
//! Exact agent ids, users and claim values are held as digests, never as written; a prefix
//! (`org-*`) is held as written, since it names no one principal.

pub(crate) mod expiry;
pub(crate) mod shared;

use crate::identity::TokenClaims;
use crate::limiter::Quota;
use parking_lot::RwLock;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

/// Most overrides held at once (configuration and run time together); adding past it is refused.
pub(crate) const MAX_OVERRIDES: usize = 10_000;

/// Longest value an override's `match` may name.
const MAX_MATCH_LEN: usize = 200;

/// Wall-clock time in whole seconds since the Unix epoch: when an override expires.
pub(crate) trait WallClock: Send + Sync + 'static {
    fn unix_now(&self) -> u64;
}

/// The system's wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct SystemWall;

impl WallClock for SystemWall {
    fn unix_now(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0)
    }
}

/// A value an override matches: exactly (held as a digest), or every value with a prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Pattern {
    Exact([u8; 16]),
    Prefix(Box<str>),
}

/// Whom an override applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Match {
    /// The client's address within a range (a single address is a /32 or /128).
    Ip(ipnet::IpNet),
    Agent(Pattern),
    User(Pattern),
    Claim(Box<str>, Pattern),
    /// A `body:<field>` value, exactly, normalised as the limiter keys it (held as a digest).
    Body(Box<str>, Pattern),
}

/// The digest an exact value is held under: SHA-256 (first 16 bytes) of `kind NUL value`.
fn value_digest(kind: &str, value: &str) -> [u8; 16] {
    let mut h = Sha256::new();
    h.update(kind.as_bytes());
    h.update([0u8]);
    h.update(value.as_bytes());
    let mut out = [0u8; 16];
    out.copy_from_slice(&h.finalize()[..16]);
    out
}

impl Pattern {
    /// `value`, `prefix*`, or a digest as [`Match`]'s display writes it (`sha256:<32 hex>`).
    fn parse(kind: &str, value: &str) -> Result<Self, String> {
        if let Some(hexed) = value.strip_prefix("sha256:") {
            let mut d = [0u8; 16];
            return match hex::decode_to_slice(hexed, &mut d) {
                Ok(()) => Ok(Pattern::Exact(d)),
                Err(_) => Err(format!(
                    "`{value}`: a digest is `sha256:` and 32 hexadecimal digits, as GET /overrides lists it"
                )),
            };
        }
        let (body, prefix) = match value.strip_suffix('*') {
            Some(p) => (p, true),
            None => (value, false),
        };
        if body.contains('*') {
            return Err(format!(
                "`{value}`: `*` may only end a value (\"org-*\"), matching every value that starts with what precedes it"
            ));
        }
        if !prefix && body.is_empty() {
            return Err("the value is empty; name one, or end a prefix with `*`".to_owned());
        }
        if !body.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
            return Err(format!(
                "`{value}`: a value is visible ASCII without spaces (as a key reads it)"
            ));
        }
        Ok(if prefix {
            Pattern::Prefix(Box::from(body))
        } else {
            Pattern::Exact(value_digest(kind, body))
        })
    }

    fn matches(&self, kind: &str, value: &str, digest: &mut Option<[u8; 16]>) -> bool {
        match self {
            Pattern::Prefix(p) => value.starts_with(&**p),
            Pattern::Exact(d) => *digest.get_or_insert_with(|| value_digest(kind, value)) == *d,
        }
    }

    fn specificity(&self) -> (u8, usize) {
        match self {
            Pattern::Exact(_) => (3, 0),
            Pattern::Prefix(p) => (2, p.len()),
        }
    }

    fn write(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Pattern::Exact(d) => write!(f, "sha256:{}", hex::encode(d)),
            Pattern::Prefix(p) => write!(f, "{p}*"),
        }
    }
}

impl std::str::FromStr for Match {
    type Err = String;

    /// `ip:<addr or CIDR>`, `agent:<id>`, `user:<subject>`, `claim:<name>=<value>`; a value may
    /// end in `*`.
    fn from_str(s: &str) -> Result<Self, String> {
        let kinds = "use ip:<address or CIDR>, agent:<id>, user:<subject>, claim:<name>=<value> (a value may end in `*`) or body:<field>=<value> (exact)";
        if s.len() > MAX_MATCH_LEN {
            return Err(format!(
                "is {} bytes long; a match is at most {MAX_MATCH_LEN}",
                s.len()
            ));
        }
        let Some((kind, value)) = s.split_once(':') else {
            return Err(format!("`{s}` names no kind; {kinds}"));
        };
        let value = value.trim();
        match kind.trim() {
            "ip" => {
                let net = match value.parse::<ipnet::IpNet>() {
                    Ok(n) => n.trunc(),
                    Err(_) => match value.parse::<IpAddr>() {
                        Ok(a) => ipnet::IpNet::from(a.to_canonical()),
                        Err(_) => {
                            return Err(format!(
                                "`{value}` is not an address or a CIDR range (\"203.0.113.7\", \"198.51.100.0/24\", \"2001:db8::/48\")"
                            ))
                        }
                    },
                };
                Ok(Match::Ip(net))
            }
            "agent" => {
                let p = Pattern::parse("agent", value)?;
                if let Pattern::Exact(_) = p {
                    if !value.starts_with("sha256:")
                        && crate::keys::valid_agent_id(value.as_bytes()).is_none()
                    {
                        return Err(format!(
                            "`{value}` is not an agent id (1-128 characters of A-Z, a-z, 0-9, `.`, `_`, `:` and `-`)"
                        ));
                    }
                }
                Ok(Match::Agent(p))
            }
            "user" => Ok(Match::User(Pattern::parse("user", value)?)),
            "claim" => {
                let Some((name, v)) = value.split_once('=') else {
                    return Err(format!(
                        "`{value}` names no value; write claim:<name>=<value>, e.g. \"claim:org_id=org-42\""
                    ));
                };
                let name = name.trim();
                if !crate::identity::valid_claim_name(name) {
                    return Err(format!(
                        "`{name}` is not a claim name (1-64 characters of A-Z, a-z, 0-9, `.`, `_`, `:` and `-`)"
                    ));
                }
                let kind = format!("claim:{name}");
                Ok(Match::Claim(
                    Box::from(name),
                    Pattern::parse(&kind, v.trim())?,
                ))
            }
            "body" => {
                let Some((field, v)) = value.split_once('=') else {
                    return Err(format!(
                        "`{}` names no value; write body:<field>=<value>, e.g. \"body:email=victim@example.com\"",
                        crate::redact::printable(value, 64)
                    ));
                };
                let field = field.trim();
                if !crate::keys::body::valid_field(field) {
                    return Err(format!(
                        "`{}` is not a body field (1-64 characters of A-Z, a-z, 0-9, `_`, `.` and `-`)",
                        crate::redact::printable(field, 64)
                    ));
                }
                let kind = format!("body:{field}");
                let v = v.trim();
                let pattern = if let Some(hexed) = v.strip_prefix("sha256:") {
                    Pattern::parse(&kind, &format!("sha256:{hexed}"))?
                } else {
                    if v.ends_with('*') {
                        return Err(
                            "a body value is matched exactly; name the whole value, no `*`"
                                .to_owned(),
                        );
                    }
                    let Some(key) = crate::keys::body::normalize(v) else {
                        return Err("the limiter refuses this value (empty, too long, a control character, or a list of addresses); name one".to_owned());
                    };
                    Pattern::Exact(value_digest(&kind, &key))
                };
                Ok(Match::Body(Box::from(field), pattern))
            }
            other => Err(format!(
                "`{}` is not a kind of match; {kinds}",
                crate::redact::printable(other, 32)
            )),
        }
    }
}

impl std::fmt::Display for Match {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Match::Ip(n) if n.prefix_len() == n.max_prefix_len() => write!(f, "ip:{}", n.addr()),
            Match::Ip(n) => write!(f, "ip:{n}"),
            Match::Agent(p) => {
                f.write_str("agent:")?;
                p.write(f)
            }
            Match::User(p) => {
                f.write_str("user:")?;
                p.write(f)
            }
            Match::Claim(name, p) => {
                write!(f, "claim:{name}=")?;
                p.write(f)
            }
            Match::Body(field, p) => {
                write!(f, "body:{field}=")?;
                p.write(f)
            }
        }
    }
}

impl Match {
    /// How specific the match is: the most specific of those that match a request wins.
    fn specificity(&self) -> (u8, u8, usize) {
        match self {
            Match::Agent(p) => (p.specificity().0, 4, p.specificity().1),
            Match::User(p) => (p.specificity().0, 3, p.specificity().1),
            Match::Claim(_, p) => (p.specificity().0, 2, p.specificity().1),
            Match::Ip(n) => (1, 1, usize::from(n.prefix_len())),
            Match::Body(_, p) => (p.specificity().0, 5, p.specificity().1),
        }
    }
}

/// Where an override came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Source {
    /// `[[overrides]]` in the configuration: replaced on every reload.
    Config,
    /// `POST /overrides` on the admin listener (shared through Redis on the Redis store).
    Admin,
}

/// One override.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Override {
    pub(crate) id: String,
    pub(crate) limiter: Arc<str>,
    /// The name its buckets are kept under: `<limiter>~<id>`.
    pub(crate) bucket: Arc<str>,
    pub(crate) matcher: Match,
    pub(crate) limit: NonZeroU32,
    pub(crate) window: Duration,
    /// `Some`: the window is this calendar period (in the limiter's time zone; UTC when the
    /// limiter's own window is not a calendar one), `window` its longest length.
    pub(crate) calendar: Option<crate::limiter::calendar::CalendarUnit>,
    /// Unix seconds from which it no longer applies.
    pub(crate) expires: Option<u64>,
    pub(crate) source: Source,
    /// Who added it at run time (the admin request's `by`, else its peer address).
    pub(crate) by: Option<String>,
    /// Unix seconds when it was added.
    pub(crate) created: u64,
}

/// An override as the admin API and the shared table write it (JSON).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub(crate) struct Wire {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) id: Option<String>,
    pub(crate) limiter: String,
    #[serde(rename = "match")]
    pub(crate) matcher: String,
    pub(crate) limit: u64,
    /// `"15m"`, `"1h"`, whole seconds as a string, or a calendar period: `"day"`, `"week"`,
    /// `"month"`.
    pub(crate) window: String,
    /// RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) expires: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) source: Option<Source>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) created: Option<String>,
}

/// Longest `by` kept with an override.
const MAX_BY_LEN: usize = 128;

impl Override {
    /// An override from its wire form; errors name the field. `limiters` are the configured
    /// limiters' names and their quotas (an override keeps the algorithm and the lockout).
    pub(crate) fn from_wire(w: &Wire, source: Source, now: u64) -> Result<Self, (String, String)> {
        let err = |f: &str, e: String| (f.to_owned(), e);
        let matcher: Match = w.matcher.parse().map_err(|e| err("match", e))?;
        let limit = u32::try_from(w.limit)
            .ok()
            .and_then(NonZeroU32::new)
            .ok_or_else(|| {
                err(
                    "limit",
                    format!(
                        "{} is not a budget; use a whole number of requests, at least 1",
                        w.limit
                    ),
                )
            })?;
        let calendar = crate::limiter::calendar::CalendarUnit::parse(&w.window);
        let window = match calendar {
            Some(unit) => unit.longest(),
            None => crate::duration::parse_duration(&w.window).map_err(|e| err("window", e))?,
        };
        if calendar.is_none()
            && (window < Duration::from_secs(1) || window > Duration::from_secs(7 * 86_400))
        {
            return Err(err(
                "window",
                format!(
                    "`{}`: use a window from 1s to 7d, or a calendar period: day, week or month",
                    w.window
                ),
            ));
        }
        let expires = match &w.expires {
            None => None,
            Some(t) if expiry::is_relative(t) => return Err(err(
                "expires",
                format!("`{t}` is a time from now, which would move at every reload; write the instant (RFC 3339, e.g. \"2026-12-01T18:00:00Z\"), or add the override at run time: fleet-limiter override add --expires {t}"),
            )),
            Some(t) => Some(parse_rfc3339(t).map_err(|e| err("expires", e))?),
        };
        let created = match &w.created {
            Some(t) => parse_rfc3339(t).unwrap_or(now),
            None => now,
        };
        let by = w.by.as_ref().map(|b| {
            b.chars()
                .filter(|c| !c.is_control())
                .take(MAX_BY_LEN)
                .collect::<String>()
        });
        let id = match &w.id {
            Some(id) if valid_id(id) => id.clone(),
            Some(id) => {
                return Err(err(
                    "id",
                    format!("`{id}` is not an override id (1-64 characters of a-z, 0-9 and `-`)"),
                ))
            }
            None => new_id(),
        };
        Ok(Self {
            bucket: Arc::from(format!("{}~{id}", w.limiter).as_str()),
            id,
            limiter: Arc::from(w.limiter.as_str()),
            matcher,
            limit,
            window,
            calendar,
            expires,
            source,
            by,
            created,
        })
    }

    pub(crate) fn to_wire(&self) -> Wire {
        Wire {
            id: Some(self.id.clone()),
            limiter: self.limiter.to_string(),
            matcher: self.matcher.to_string(),
            limit: u64::from(self.limit.get()),
            window: match self.calendar {
                Some(unit) => unit.as_str().to_owned(),
                None => crate::duration::format_duration(self.window),
            },
            expires: self.expires.map(format_rfc3339),
            source: Some(self.source),
            by: self.by.clone(),
            created: Some(format_rfc3339(self.created)),
        }
    }

    /// The quota the override judges the limiter's bucket by: its limit and window, the
    /// limiter's algorithm and lockout.
    pub(crate) fn quota(&self, base: &Quota) -> Quota {
        use crate::limiter::calendar::{Calendar, Zone};
        match self.calendar {
            Some(unit) => {
                let zone = base.calendar_window().map_or(Zone::utc(), |c| c.zone);
                Quota::calendar(self.limit, Calendar::new(unit, zone))
            }
            // A duration over a calendar limiter counts as the fixed window it is.
            None => Quota::new(self.limit, self.window, base.algorithm),
        }
        .with_lockout(base.lockout())
    }

    pub(crate) fn live(&self, now: u64) -> bool {
        self.expires.is_none_or(|e| now < e)
    }
}

fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// A fresh id: 12 random hex digits.
pub(crate) fn new_id() -> String {
    use rand::RngCore;
    let mut b = [0u8; 6];
    rand::rngs::OsRng.fill_bytes(&mut b);
    hex::encode(b)
}

/// The facts of one request an override can match.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Who<'a> {
    pub(crate) ip: IpAddr,
    pub(crate) agent_id: Option<&'a str>,
    pub(crate) user: Option<&'a str>,
    pub(crate) claims: &'a TokenClaims,
    /// The body fields the request's body was read for, normalised.
    pub(crate) body: &'a [crate::keys::body::BodyValue],
}

/// The overrides of one limiter, most specific first.
#[derive(Debug, Default)]
struct ForLimiter(Vec<Arc<Override>>);

/// Every override in force, by limiter: rebuilt whole on every change, read without a lock
/// held across a decision.
#[derive(Debug, Default)]
pub(crate) struct Index {
    by_limiter: HashMap<Arc<str>, ForLimiter>,
}

impl Index {
    fn build(all: &[Arc<Override>]) -> Self {
        let mut by_limiter: HashMap<Arc<str>, ForLimiter> = HashMap::new();
        for o in all {
            by_limiter
                .entry(o.limiter.clone())
                .or_default()
                .0
                .push(o.clone());
        }
        for l in by_limiter.values_mut() {
            // Most specific first; among equals the newest, then the run-time one.
            l.0.sort_by(|a, b| {
                b.matcher
                    .specificity()
                    .cmp(&a.matcher.specificity())
                    .then(b.created.cmp(&a.created))
                    .then((b.source == Source::Admin).cmp(&(a.source == Source::Admin)))
            });
        }
        Self { by_limiter }
    }

    /// The override that applies to `who` on `limiter` at `now`, if any.
    pub(crate) fn find(&self, limiter: &str, who: &Who<'_>, now: u64) -> Option<&Arc<Override>> {
        let list = self.by_limiter.get(limiter)?;
        let (mut agent_d, mut user_d, mut claim_d) = (None, None, HashMap::new());
        list.0.iter().find(|o| {
            o.live(now)
                && match &o.matcher {
                    Match::Ip(net) => net.contains(&who.ip.to_canonical()),
                    Match::Agent(p) => who
                        .agent_id
                        .is_some_and(|a| p.matches("agent", a, &mut agent_d)),
                    Match::User(p) => who.user.is_some_and(|u| p.matches("user", u, &mut user_d)),
                    Match::Claim(name, p) => who.claims.get(name).is_some_and(|v| {
                        let d: &mut Option<[u8; 16]> = claim_d.entry(name.clone()).or_default();
                        p.matches(&format!("claim:{name}"), v, d)
                    }),
                    Match::Body(field, p) => who
                        .body
                        .iter()
                        .find(|b| *b.field == **field)
                        .is_some_and(|b| p.matches(&format!("body:{field}"), &b.value, &mut None)),
                }
        })
    }
}

/// The overrides of one decider: the configuration's and the run-time ones, and the index
/// decisions read.
pub(crate) struct Overrides {
    /// Whether any override is held: decisions skip the index entirely while none is.
    any: std::sync::atomic::AtomicBool,
    config: RwLock<Vec<Arc<Override>>>,
    runtime: RwLock<Vec<Arc<Override>>>,
    index: RwLock<Arc<Index>>,
    wall: Arc<dyn WallClock>,
}

impl std::fmt::Debug for Overrides {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Overrides")
            .field("config", &self.config.read().len())
            .field("runtime", &self.runtime.read().len())
            .finish()
    }
}

impl Overrides {
    pub(crate) fn new(config: Vec<Override>, wall: Arc<dyn WallClock>) -> Self {
        let o = Self {
            any: std::sync::atomic::AtomicBool::new(false),
            config: RwLock::new(config.into_iter().map(Arc::new).collect()),
            runtime: RwLock::default(),
            index: RwLock::default(),
            wall,
        };
        o.rebuild();
        o
    }

    /// The same overrides, expiring by `wall` instead.
    pub(crate) fn on_wall_clock(&self, wall: Arc<dyn WallClock>) -> Self {
        let o = Self {
            any: std::sync::atomic::AtomicBool::new(false),
            config: RwLock::new(self.config.read().clone()),
            runtime: RwLock::new(self.runtime.read().clone()),
            index: RwLock::default(),
            wall,
        };
        o.rebuild();
        o
    }

    pub(crate) fn unix_now(&self) -> u64 {
        self.wall.unix_now()
    }

    fn rebuild(&self) {
        let mut all: Vec<Arc<Override>> = self.config.read().clone();
        all.extend(self.runtime.read().iter().cloned());
        let any = !all.is_empty();
        *self.index.write() = Arc::new(Index::build(&all));
        self.any.store(any, std::sync::atomic::Ordering::Release);
    }

    /// The index decisions read now, when any override is held.
    pub(crate) fn index_if_any(&self) -> Option<Arc<Index>> {
        self.any
            .load(std::sync::atomic::Ordering::Acquire)
            .then(|| self.index.read().clone())
    }

    /// Replace the configuration's overrides (a reload).
    pub(crate) fn set_config(&self, list: Vec<Override>) {
        *self.config.write() = list.into_iter().map(Arc::new).collect();
        self.rebuild();
    }

    /// Replace the run-time overrides (what the shared table holds now).
    pub(crate) fn set_runtime(&self, list: Vec<Override>) {
        *self.runtime.write() = list.into_iter().map(Arc::new).collect();
        self.rebuild();
    }

    /// Add a run-time override; refused past [`MAX_OVERRIDES`].
    pub(crate) fn add(&self, o: Override) -> Result<(), String> {
        {
            let mut rt = self.runtime.write();
            let now = self.wall.unix_now();
            rt.retain(|x| x.live(now) && x.id != o.id);
            if rt.len() + self.config.read().len() >= MAX_OVERRIDES {
                return Err(format!(
                    "{MAX_OVERRIDES} overrides are in force already; remove some first"
                ));
            }
            rt.push(Arc::new(o));
        }
        self.rebuild();
        Ok(())
    }

    /// Remove a run-time override by id: whether it was there.
    pub(crate) fn remove(&self, id: &str) -> bool {
        let removed = {
            let mut rt = self.runtime.write();
            let before = rt.len();
            rt.retain(|x| x.id != id);
            rt.len() != before
        };
        if removed {
            self.rebuild();
        }
        removed
    }

    /// Every override in force now (expired ones left out), configuration first.
    pub(crate) fn list(&self) -> Vec<Arc<Override>> {
        let now = self.wall.unix_now();
        let mut all: Vec<Arc<Override>> = self.config.read().clone();
        all.extend(self.runtime.read().iter().cloned());
        all.retain(|o| o.live(now));
        all
    }

    /// Every run-time override held, expired ones included.
    pub(crate) fn list_all_runtime(&self) -> Vec<Arc<Override>> {
        self.runtime.read().clone()
    }

    /// Whether `id` names an override of the configuration (removed by editing it, not here).
    pub(crate) fn is_config(&self, id: &str) -> bool {
        self.config.read().iter().any(|o| o.id == id)
    }
}

/// Unix seconds of an RFC 3339 instant (`2026-12-01T18:00:00Z`, `...+02:00`; a fraction of a
/// second rounds up).
pub(crate) fn parse_rfc3339(s: &str) -> Result<u64, String> {
    let bad = || format!("`{s}` is not an RFC 3339 instant; write e.g. \"2026-12-01T18:00:00Z\"");
    let b = s.trim().as_bytes();
    if b.len() < 20 {
        return Err(bad());
    }
    let num = |r: std::ops::Range<usize>| -> Result<i64, String> {
        let part = b.get(r).ok_or_else(bad)?;
        if !part.iter().all(u8::is_ascii_digit) {
            return Err(bad());
        }
        std::str::from_utf8(part)
            .ok()
            .and_then(|t| t.parse().ok())
            .ok_or_else(bad)
    };
    if b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't' | b' ')
        || b[13] != b':'
        || b[16] != b':'
    {
        return Err(bad());
    }
    let (y, mo, d, h, mi, sec) = (
        num(0..4)?,
        num(5..7)?,
        num(8..10)?,
        num(11..13)?,
        num(14..16)?,
        num(17..19)?,
    );
    if !(1..=12).contains(&mo) || d < 1 || d > days_in_month(y, mo) || h > 23 || mi > 59 || sec > 60
    {
        return Err(bad());
    }
    let mut i = 19;
    let mut frac = false;
    if b.get(i) == Some(&b'.') {
        i += 1;
        let start = i;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            frac |= b[i] != b'0';
            i += 1;
        }
        if i == start {
            return Err(bad());
        }
    }
    let offset = match b.get(i) {
        Some(b'Z' | b'z') if i + 1 == b.len() => 0,
        Some(sign @ (b'+' | b'-')) if i + 6 == b.len() && b[i + 3] == b':' => {
            let (oh, om) = (num(i + 1..i + 3)?, num(i + 4..i + 6)?);
            if oh > 23 || om > 59 {
                return Err(bad());
            }
            let o = oh * 3600 + om * 60;
            if *sign == b'+' {
                o
            } else {
                -o
            }
        }
        _ => return Err(bad()),
    };
    let days = crate::calendar::days_from_civil(y, mo, d);
    let t = days * 86_400 + h * 3600 + mi * 60 + sec.min(59) - offset + i64::from(frac);
    u64::try_from(t).map_err(|_| bad())
}

fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        _ if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        _ => 28,
    }
}

/// `YYYY-MM-DDTHH:MM:SSZ` of unix seconds.
pub(crate) fn format_rfc3339(t: u64) -> String {
    let days = (t / 86_400) as i64;
    let rem = t % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests;
