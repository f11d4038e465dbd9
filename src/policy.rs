//! Which limiters meter a request: a pure function of method, path and credential kind.
//!
//! The guarded set is an allow-list: a request no route names passes unmetered. Limiters in one
//! `group` are alternatives (the most specific matching route wins); limiters in different
//! groups stack (all must allow).

use crate::identity::Credential;
use crate::keys::KeyKind;
use crate::limiter::Quota;
use crate::path::{CanonicalPath, PathRules};
use parking_lot::RwLock;
use serde::{Deserialize, Serialize};
use smallvec::SmallVec;
use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};
use std::num::NonZeroU32;
use std::str::FromStr;
use std::sync::Arc;

/// Which credentials a limiter applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum CredentialMatch {
    #[default]
    Any,
    ApiKey,
    CliToken,
}

impl CredentialMatch {
    pub fn admits(self, c: Credential) -> bool {
        match self {
            CredentialMatch::Any => true,
            CredentialMatch::ApiKey => c == Credential::ApiKey,
            CredentialMatch::CliToken => c == Credential::CliToken,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            CredentialMatch::Any => "any",
            CredentialMatch::ApiKey => "api-key",
            CredentialMatch::CliToken => "cli-token",
        }
    }
}

/// What a limiter does with its decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Refuse over-budget requests with 429.
    #[default]
    Enforce,
    /// Decide, count and report, but forward the request anyway.
    Shadow,
    /// Not consulted at all.
    Off,
}

impl Mode {
    /// The name configuration, metrics and reports use: `enforce`, `shadow`, `off`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Enforce => "enforce",
            Mode::Shadow => "shadow",
            Mode::Off => "off",
        }
    }
}

/// What a limiter meters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Meter {
    /// Every request it applies to.
    #[default]
    Requests,
    /// Only requests from agent ids it has not admitted at that IP within `known_for`
    /// (see [`crate::known_agents`]); a known agent skips it. For `ip`-keyed ceilings.
    NewAgents,
}

impl Meter {
    pub fn as_str(self) -> &'static str {
        match self {
            Meter::Requests => "requests",
            Meter::NewAgents => "new-agents",
        }
    }
}

/// How long a `new-agents` limiter remembers an admitted agent id, and how many it remembers
/// per address (an IPv4 address or an IPv6 /56, see [`crate::known_agents`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Remember {
    pub known_for: std::time::Duration,
    pub max_known: u32,
}

/// The answer when the store cannot decide.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum OnStoreError {
    #[default]
    Allow,
    Deny,
}

/// Which answers a limiter counts. Every request is admitted against the bucket as usual; an
/// answer this says should not have counted is given back once its status is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Count {
    /// Every admitted request counts.
    #[default]
    All,
    /// Only answers whose status is in `failed_statuses` count (failed logins, bad keys).
    Failed,
    /// Only answers whose status is not in `failed_statuses` count.
    Succeeded,
}

impl Count {
    /// The name configuration and metrics use: `all`, `failed`, `succeeded`.
    pub fn as_str(self) -> &'static str {
        match self {
            Count::All => "all",
            Count::Failed => "failed",
            Count::Succeeded => "succeeded",
        }
    }
}

/// The statuses that make an answer failed: inclusive ranges of status codes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusRanges(pub Vec<(u16, u16)>);

impl Default for StatusRanges {
    /// 400 and above.
    fn default() -> Self {
        Self(vec![(400, 999)])
    }
}

impl StatusRanges {
    pub fn contains(&self, status: u16) -> bool {
        self.0.iter().any(|&(lo, hi)| lo <= status && status <= hi)
    }

    /// `400-499` or `503`: a status code from 100 to 999, or an inclusive range of them.
    pub fn parse_item(s: &str) -> Result<(u16, u16), String> {
        let code = |t: &str| -> Result<u16, String> {
            let t = t.trim();
            match t.parse::<u16>() {
                Ok(n) if (100..=999).contains(&n) && t.bytes().all(|b| b.is_ascii_digit()) => Ok(n),
                _ => Err(format!(
                    "`{s}` is not a status code; use a code from 100 to 999 (503) or a range (\"400-499\")"
                )),
            }
        };
        match s.split_once('-') {
            Some((a, b)) => {
                let (lo, hi) = (code(a)?, code(b)?);
                if lo > hi {
                    return Err(format!(
                        "`{s}` runs backwards; write the lower code first (\"{hi}-{lo}\")"
                    ));
                }
                Ok((lo, hi))
            }
            None => code(s).map(|c| (c, c)),
        }
    }
}

impl fmt::Display for StatusRanges {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (lo, hi)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            if lo == hi {
                write!(f, "{lo}")?;
            } else {
                write!(f, "{lo}-{hi}")?;
            }
        }
        Ok(())
    }
}

/// What one request costs a limiter's bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cost {
    /// Always this many units (`cost = N`; 1 by default).
    Fixed(NonZeroU32),
    /// What the request's header says (`cost_header`), capped at `max` (`cost_max`).
    Header { name: Arc<str>, max: NonZeroU32 },
}

impl Default for Cost {
    fn default() -> Self {
        Cost::Fixed(NonZeroU32::MIN)
    }
}

impl Cost {
    /// The units a request costs, given the value of the cost header (`None` when it was not
    /// sent). A header cost: absent, 1; a positive whole number (ASCII digits, surrounding
    /// spaces ignored), that number capped at `max`; anything else (empty, zero, negative, a
    /// sign, a fraction, non-ASCII, sent more than once), `max`: a client that says nothing
    /// sensible pays the most, never less than an honest one.
    pub fn of(&self, value: Option<&[u8]>) -> NonZeroU32 {
        match self {
            Cost::Fixed(n) => *n,
            Cost::Header { max, .. } => {
                let max = *max;
                let Some(v) = value else {
                    return NonZeroU32::MIN;
                };
                let v = v.trim_ascii();
                if v.is_empty() || !v.iter().all(u8::is_ascii_digit) {
                    return max;
                }
                let n = v.iter().fold(0u64, |n, d| {
                    n.saturating_mul(10).saturating_add(u64::from(d - b'0'))
                });
                let n = NonZeroU32::new(u32::try_from(n).unwrap_or(u32::MAX));
                n.map_or(max, |n| n.min(max))
            }
        }
    }

    /// The header a request's cost is read from, if any.
    pub fn header(&self) -> Option<&str> {
        match self {
            Cost::Fixed(_) => None,
            Cost::Header { name, .. } => Some(name),
        }
    }
}

/// One configured limiter, ready to match requests.
#[derive(Debug, Clone, PartialEq)]
pub struct LimiterSpec {
    pub name: Arc<str>,
    pub quota: Quota,
    pub key: KeyKind,
    pub routes: Vec<RoutePattern>,
    pub except: Vec<RoutePattern>,
    pub group: Arc<str>,
    pub credential: CredentialMatch,
    pub mode: Mode,
    pub on_store_error: OnStoreError,
    /// `Some` for a `meter = "new-agents"` limiter: known agents skip it.
    pub new_agents: Option<Remember>,
    /// What one request costs this limiter's bucket.
    pub cost: Cost,
    /// The header a `header:<name>` key reads (lower-case); `None` for other key kinds.
    pub key_header: Option<Arc<str>>,
    /// Which answers count; the others are given back.
    pub count: Count,
    /// The statuses `count` reads as failed.
    pub failed_statuses: StatusRanges,
}

impl LimiterSpec {
    /// Whether an admitted request answered with `status` is given back: it should not have
    /// counted.
    pub fn gives_back(&self, status: u16) -> bool {
        match self.count {
            Count::All => false,
            Count::Failed => !self.failed_statuses.contains(status),
            Count::Succeeded => self.failed_statuses.contains(status),
        }
    }

    /// The specificity of this limiter's best route for the request, or `None` if it does not apply.
    fn matches(&self, method: &str, segs: &[&str], cred: Credential) -> Option<Specificity> {
        if self.mode == Mode::Off || !self.credential.admits(cred) {
            return None;
        }
        if self.except.iter().any(|p| p.matches(method, segs)) {
            return None;
        }
        self.routes
            .iter()
            .filter(|p| p.matches(method, segs))
            .map(RoutePattern::specificity)
            .max()
    }
}

/// The configured limiters.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    limiters: Vec<Arc<LimiterSpec>>,
    memo: RouteMemo,
}

/// The limiters one request picked, by index into the policy (most requests pick one to three).
pub type Picked = SmallVec<[usize; 4]>;

impl Policy {
    pub fn new(limiters: Vec<LimiterSpec>) -> Self {
        Self {
            limiters: limiters.into_iter().map(Arc::new).collect(),
            memo: RouteMemo::default(),
        }
    }

    /// Every configured limiter, in configuration order.
    pub fn limiters(&self) -> &[Arc<LimiterSpec>] {
        &self.limiters
    }

    pub fn get(&self, name: &str) -> Option<&Arc<LimiterSpec>> {
        self.limiters.iter().find(|l| &*l.name == name)
    }

    /// The limiters that meter this request, in configuration order. The path is the one
    /// canonical path (see [`crate::path`]): the gateway forwards exactly this path, so there is
    /// no other reading of it to meter.
    pub fn applicable(
        &self,
        method: &str,
        path: &CanonicalPath<'_>,
        cred: Credential,
    ) -> SmallVec<[Arc<LimiterSpec>; 4]> {
        self.picked(method, path, cred)
            .into_iter()
            .map(|i| self.limiters[i].clone())
            .collect()
    }

    /// [`Policy::applicable`] as indices into [`Policy::limiters`].
    pub fn picked(&self, method: &str, path: &CanonicalPath<'_>, cred: Credential) -> Picked {
        let path = path.as_str();
        self.memo.get_or_insert(method, path, cred, || {
            self.applicable_to(method, path, cred)
        })
    }

    /// The first request, if any, on which a limiter that `needs_ceiling` applies with no
    /// limiter beside it that `is_ceiling` for it: its index, and the request as `METHOD /path`
    /// with the credential kind. Asked of the real route picker (precedence, exceptions and
    /// credential kinds exactly as requests meet them) over sample requests: every route and
    /// exception of every limiter, its wildcards filled with a segment no route names (`*` with
    /// one, `**` with none, one and two), under every method and every credential kind. A
    /// start-up check, never on a request's path.
    pub(crate) fn first_unguarded(
        &self,
        needs_ceiling: impl Fn(&LimiterSpec) -> bool,
        is_ceiling: impl Fn(&LimiterSpec, &LimiterSpec) -> bool,
    ) -> Option<(usize, String, Credential)> {
        let patterns: Vec<&RoutePattern> = self
            .limiters
            .iter()
            .flat_map(|l| l.routes.iter().chain(&l.except))
            .collect();
        let fresh = fresh_segment(&patterns);
        let mut paths: Vec<String> = patterns
            .iter()
            .flat_map(|p| p.sample_paths(&fresh))
            .collect();
        paths.sort();
        paths.dedup();
        for path in &paths {
            for method in METHODS {
                for cred in Credential::ALL {
                    let picked = self.applicable_to(method, path, cred);
                    for &i in &picked {
                        let l = &self.limiters[i];
                        if !needs_ceiling(l) {
                            continue;
                        }
                        let guarded = picked
                            .iter()
                            .any(|&j| j != i && is_ceiling(&self.limiters[j], l));
                        if !guarded {
                            return Some((i, format!("{method} {path}"), cred));
                        }
                    }
                }
            }
        }
        None
    }

    /// The limiters that meter a request of `method` on `path` that names the methods in
    /// `also` by override: the union of what each method picks, each limiter once, in
    /// configuration order. Within a group each method still picks its most specific route, so
    /// a `POST` named `GET` is metered by the `POST` route's limiter and the `GET` route's.
    pub fn picked_any(
        &self,
        method: &str,
        also: &[&str],
        path: &CanonicalPath<'_>,
        cred: Credential,
    ) -> Picked {
        let mut all = self.picked(method, path, cred);
        for m in also {
            for i in self.picked(m, path, cred) {
                if !all.contains(&i) {
                    all.push(i);
                }
            }
        }
        all.sort_unstable();
        all
    }

    /// Indices of the limiters that meter `path`.
    fn applicable_to(&self, method: &str, path: &str, cred: Credential) -> Picked {
        let segs: SmallVec<[&str; 16]> = path.split('/').filter(|s| !s.is_empty()).collect();
        let mut best: SmallVec<[(usize, Specificity); 4]> = SmallVec::new();
        for (i, l) in self.limiters.iter().enumerate() {
            let Some(spec) = l.matches(method, &segs, cred) else {
                continue;
            };
            match best
                .iter_mut()
                .find(|(j, _)| self.limiters[*j].group == l.group)
            {
                Some(slot) if spec > slot.1 => *slot = (i, spec),
                Some(_) => {}
                None => best.push((i, spec)),
            }
        }
        best.into_iter().map(|(i, _)| i).collect()
    }
}

/// Most distinct (method, path, credential) answers the memo holds. Paths are chosen by
/// clients, so the memo is bounded: when it is full it starts again empty, and a client that
/// sends endless new paths only keeps its own requests on the slow path.
const ROUTE_MEMO_CAP: usize = 4096;

/// Remembered answers of [`Policy::applicable_to`]: matching every limiter's routes once per
/// distinct path instead of once per request. It lives inside
/// the policy, so a reload (a new policy) starts with an empty one.
#[derive(Default)]
struct RouteMemo {
    /// Seeded at random per process: clients cannot aim paths at one hash (and two paths that
    /// do share one only lose the memo, never each other's answer).
    hasher: foldhash::fast::RandomState,
    entries: RwLock<HashMap<u64, MemoEntry, BuildHasherDefault<PrehashedKey>>>,
}

struct MemoEntry {
    method: Box<str>,
    path: Box<str>,
    cred: Credential,
    picked: Picked,
}

impl RouteMemo {
    fn get_or_insert(
        &self,
        method: &str,
        path: &str,
        cred: Credential,
        compute: impl FnOnce() -> Picked,
    ) -> Picked {
        let hash = self.hasher.hash_one((method, path, cred as u8));
        if let Some(e) = self.entries.read().get(&hash) {
            if e.cred == cred && *e.method == *method && *e.path == *path {
                return e.picked.clone();
            }
            // A collision: answer without remembering.
            return compute();
        }
        let picked = compute();
        let mut entries = self.entries.write();
        if entries.len() >= ROUTE_MEMO_CAP {
            entries.clear();
        }
        entries.insert(
            hash,
            MemoEntry {
                method: method.into(),
                path: path.into(),
                cred,
                picked: picked.clone(),
            },
        );
        picked
    }
}

impl Clone for RouteMemo {
    /// A copy of a policy starts with an empty memo.
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl fmt::Debug for RouteMemo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RouteMemo({} paths)", self.entries.read().len())
    }
}

/// The memo's keys are already hashes: use them as they are.
#[derive(Default)]
struct PrehashedKey(u64);

impl Hasher for PrehashedKey {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// How specific a route is: literal segments first, then whether it names a method, then
/// fewer wildcards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Specificity {
    literals: usize,
    method: bool,
    fewer_wildcards: std::cmp::Reverse<usize>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Seg {
    Lit(String),
    Star,
    DoubleStar,
}

/// `[METHOD ]/path/with/*/and/**`: `*` is one segment, `**` any number (zero included), so
/// `/api/agent/download/**` also matches `/api/agent/download`. Matching ignores case and a
/// trailing slash, as Express routing does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutePattern {
    method: Option<String>,
    segs: Vec<Seg>,
    raw: String,
}

const METHODS: &[&str] = &[
    "GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "CONNECT", "TRACE",
];

impl FromStr for RoutePattern {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let raw = s.trim();
        let (method, path) = match raw.split_once(char::is_whitespace) {
            Some((m, p)) => {
                let m = m.to_ascii_uppercase();
                if !METHODS.contains(&m.as_str()) {
                    return Err(format!(
                        "`{raw}`: `{m}` is not an HTTP method (one of {})",
                        METHODS.join(", ")
                    ));
                }
                (Some(m), p.trim())
            }
            None => (None, raw),
        };
        if !path.starts_with('/') {
            return Err(format!(
                "`{raw}`: a route is `[METHOD ]/path`, and the path starts with `/` (e.g. \"POST /api/agent/enroll\" or \"/api/agent/**\")"
            ));
        }
        // Requests are matched in canonical form, so the route is read in it too: `%72otate-key`
        // is `rotate-key`, `caf\u{e9}` is `caf%C3%A9`, dot segments are resolved.
        let all = crate::path::Class::ALL
            .into_iter()
            .fold(PathRules::STRICT, PathRules::allowing);
        let canonical = CanonicalPath::parse(path, all).map_err(|e| format!("`{raw}`: {e}"))?;
        let mut segs = Vec::new();
        for seg in canonical.as_str().split('/').filter(|s| !s.is_empty()) {
            segs.push(match seg {
                "*" => Seg::Star,
                "**" => Seg::DoubleStar,
                s if s.contains('*') => {
                    return Err(format!(
                        "`{raw}`: `*` and `**` must stand alone as a whole path segment"
                    ))
                }
                s => Seg::Lit(s.to_ascii_lowercase()),
            });
        }
        Ok(Self {
            method,
            segs,
            raw: raw.to_owned(),
        })
    }
}

impl fmt::Display for RoutePattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.raw)
    }
}

impl Serialize for RoutePattern {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.raw)
    }
}

/// A path segment that no route names: sample requests fill wildcards with it.
fn fresh_segment(patterns: &[&RoutePattern]) -> String {
    let mut fresh = "x".to_owned();
    while patterns.iter().any(|p| {
        p.segs
            .iter()
            .any(|s| matches!(s, Seg::Lit(l) if *l == fresh))
    }) {
        fresh.push('x');
    }
    fresh
}

/// Most sample paths one route yields (a route with many `**` stops there).
const MAX_SAMPLES_PER_ROUTE: usize = 243;

impl RoutePattern {
    pub fn matches(&self, method: &str, segs: &[&str]) -> bool {
        if let Some(m) = &self.method {
            let same = m.eq_ignore_ascii_case(method)
                || (m == "GET" && method.eq_ignore_ascii_case("HEAD"));
            if !same {
                return false;
            }
        }
        match_segs(&self.segs, segs)
    }

    pub fn specificity(&self) -> Specificity {
        let literals = self
            .segs
            .iter()
            .filter(|s| matches!(s, Seg::Lit(_)))
            .count();
        Specificity {
            literals,
            method: self.method.is_some(),
            fewer_wildcards: std::cmp::Reverse(self.segs.len() - literals),
        }
    }

    /// Whether some request could match both patterns.
    pub fn overlaps(&self, other: &RoutePattern) -> bool {
        let methods = match (&self.method, &other.method) {
            (Some(a), Some(b)) => a == b,
            _ => true,
        };
        methods && segs_overlap(&self.segs, &other.segs)
    }

    pub fn as_str(&self) -> &str {
        &self.raw
    }

    /// Requests paths this route matches, its wildcards filled with `fresh`: `*` with one
    /// segment, `**` with none, one and two.
    fn sample_paths(&self, fresh: &str) -> Vec<String> {
        let two = format!("{fresh}/{fresh}");
        let mut out = vec![String::new()];
        for seg in &self.segs {
            let fills: Vec<&str> = match seg {
                Seg::Lit(l) => vec![l.as_str()],
                Seg::Star => vec![fresh],
                Seg::DoubleStar => vec!["", fresh, &two],
            };
            out = out
                .iter()
                .flat_map(|p| {
                    fills
                        .iter()
                        .map(move |f| match (p.is_empty(), f.is_empty()) {
                            (_, true) => p.clone(),
                            (true, false) => format!("/{f}"),
                            (false, false) => format!("{p}/{f}"),
                        })
                })
                .take(MAX_SAMPLES_PER_ROUTE)
                .collect();
        }
        for p in &mut out {
            if p.is_empty() {
                p.push('/');
            }
        }
        out
    }

    /// Whether every request `other` matches, this matches too.
    pub fn covers(&self, other: &RoutePattern) -> bool {
        let methods = match (&self.method, &other.method) {
            (None, _) => true,
            (Some(a), Some(b)) => a == b,
            (Some(_), None) => false,
        };
        methods && segs_cover(&self.segs, &other.segs)
    }
}

fn segs_cover(outer: &[Seg], inner: &[Seg]) -> bool {
    match (outer.split_first(), inner.split_first()) {
        (None, None) => true,
        (Some((Seg::DoubleStar, or)), _) => {
            segs_cover(or, inner) || (!inner.is_empty() && segs_cover(outer, &inner[1..]))
        }
        (None, Some(_)) | (Some(_), None) => false,
        (Some((_, _)), Some((Seg::DoubleStar, _))) => false,
        (Some((Seg::Star, or)), Some((_, ir))) => segs_cover(or, ir),
        (Some((Seg::Lit(a), or)), Some((Seg::Lit(b), ir))) => a == b && segs_cover(or, ir),
        (Some((Seg::Lit(_), _)), Some((Seg::Star, _))) => false,
    }
}

fn match_segs(pat: &[Seg], path: &[&str]) -> bool {
    match pat.split_first() {
        None => path.is_empty(),
        Some((Seg::DoubleStar, rest)) => {
            (0..=path.len()).any(|skip| match_segs(rest, &path[skip..]))
        }
        Some((seg, rest)) => match path.split_first() {
            None => false,
            Some((first, path_rest)) => {
                let ok = match seg {
                    Seg::Lit(l) => l.eq_ignore_ascii_case(first),
                    Seg::Star | Seg::DoubleStar => true,
                };
                ok && match_segs(rest, path_rest)
            }
        },
    }
}

fn segs_overlap(a: &[Seg], b: &[Seg]) -> bool {
    match (a.split_first(), b.split_first()) {
        (None, None) => true,
        (Some((Seg::DoubleStar, ar)), _) => {
            segs_overlap(ar, b) || (!b.is_empty() && segs_overlap(a, &b[1..]))
        }
        (_, Some((Seg::DoubleStar, br))) => {
            segs_overlap(a, br) || (!a.is_empty() && segs_overlap(&a[1..], b))
        }
        (None, _) | (_, None) => false,
        (Some((x, ar)), Some((y, br))) => {
            let ok = match (x, y) {
                (Seg::Lit(p), Seg::Lit(q)) => p == q,
                _ => true,
            };
            ok && segs_overlap(ar, br)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> RoutePattern {
        s.parse().unwrap()
    }

    fn m(pat: &str, method: &str, path: &str) -> bool {
        let n = CanonicalPath::parse(path, PathRules::STRICT).unwrap();
        let segs: Vec<&str> = n.as_str().split('/').filter(|s| !s.is_empty()).collect();
        p(pat).matches(method, &segs)
    }

    #[test]
    fn patterns_match() {
        assert!(m("/api/agent/**", "GET", "/api/agent/heartbeat"));
        assert!(m("/api/agent/**", "GET", "/api/agent"));
        assert!(!m("/api/agent/**", "GET", "/api/agents"));
        assert!(m(
            "GET /api/agent/download/**",
            "GET",
            "/api/agent/download"
        ));
        assert!(m(
            "GET /api/agent/download/**",
            "HEAD",
            "/api/agent/download/linux/x64"
        ));
        assert!(!m(
            "GET /api/agent/download/**",
            "POST",
            "/api/agent/download"
        ));
        assert!(m("POST /api/agent/enroll", "post", "/API/Agent/Enroll/"));
        assert!(m("/api/*/x", "GET", "/api/anything/x"));
        assert!(!m("/api/*/x", "GET", "/api/x"));
        assert!(m("/a/**/z", "GET", "/a/b/c/z"));
        assert!(m("/a/**/z", "GET", "/a/z"));
    }

    #[test]
    fn path_tricks_do_not_dodge_routes() {
        assert!(m("POST /api/agent/enroll", "POST", "/api//agent/./enroll"));
        assert!(m("POST /api/agent/enroll", "POST", "/api/agent/%65nroll"));
        assert!(m(
            "POST /api/agent/enroll",
            "POST",
            "/api/x/../agent/enroll"
        ));
        assert!(m("POST /api/agent/enroll", "POST", "/API/Agent/Enroll/"));
    }

    fn names(p: &Policy, method: &str, path: &str) -> Vec<String> {
        let path = CanonicalPath::parse(path, PathRules::STRICT).unwrap();
        p.applicable(method, &path, Credential::None)
            .iter()
            .map(|l| l.name.to_string())
            .collect()
    }

    #[test]
    fn every_spelling_of_a_route_is_metered_by_its_limiter() {
        let p = Policy::new(crate::config::Config::default().limiters);
        for path in [
            "/api/agent/rotate-key",
            "/API/Agent/Rotate-Key/",
            "/api/agent/%72otate-key",
            "/api/agent/x/%2e%2e/rotate-key",
            "/api/x/../agent/rotate-key",
            "//api//agent//rotate-key",
            "/../api/agent/./rotate-key",
        ] {
            assert_eq!(names(&p, "POST", path), ["key-rotation"], "{path}");
        }
        // Dot segments move the request to the route they resolve to, as they do upstream.
        assert_eq!(
            names(&p, "GET", "/api/agent/../cron/x"),
            Vec::<String>::new()
        );
        assert_eq!(names(&p, "GET", "/api/agent/../tasks"), ["ui"]);
        assert_eq!(names(&p, "GET", "/healthz"), Vec::<String>::new());
    }

    #[test]
    fn an_override_is_metered_as_every_method_it_could_be_routed_as() {
        let p = Policy::new(crate::config::Config::default().limiters);
        let any = |method: &str, also: &[&str], path: &str| -> Vec<String> {
            let path = CanonicalPath::parse(path, PathRules::STRICT).unwrap();
            p.picked_any(method, also, &path, Credential::None)
                .into_iter()
                .map(|i| p.limiters()[i].name.to_string())
                .collect()
        };
        // A POST that an Express app routes as GET: the download budget, and the agent one.
        assert_eq!(
            any("POST", &["GET"], "/api/agent/download/linux"),
            ["agent-device", "agent-ip", "download"]
        );
        assert_eq!(
            names(&p, "POST", "/api/agent/download/linux"),
            ["agent-device", "agent-ip"]
        );
        // A GET named POST on key rotation: key rotation's budget applies.
        assert_eq!(
            any("GET", &["POST"], "/api/agent/rotate-key"),
            ["agent-device", "agent-ip", "key-rotation"]
        );
        // Each limiter once, whatever the order and repetition of the methods named.
        assert_eq!(
            any("POST", &["GET", "HEAD", "GET"], "/api/agent/download/x"),
            any("POST", &["GET"], "/api/agent/download/x")
        );
        // Nothing named: exactly the request's own method.
        assert_eq!(
            any("POST", &[], "/api/agent/enroll"),
            names(&p, "POST", "/api/agent/enroll")
        );
    }

    #[test]
    fn routes_are_read_in_canonical_form() {
        assert_eq!(
            p("POST /api/agent/%72otate-key").segs,
            p("POST /api/agent/rotate-key").segs
        );
        assert!(m("/caf\u{e9}/**", "GET", "/caf%C3%A9/x"));
        assert!(m("/caf\u{e9}/**", "GET", "/CAF%c3%a9/x"));
        assert!("/a%zz"
            .parse::<RoutePattern>()
            .is_ok_and(|r| r.segs == [Seg::Lit("a%25zz".into())]));
    }

    #[test]
    fn bad_patterns_say_why() {
        assert!("api/x"
            .parse::<RoutePattern>()
            .unwrap_err()
            .contains("starts with `/`"));
        assert!("FETCH /x"
            .parse::<RoutePattern>()
            .unwrap_err()
            .contains("not an HTTP method"));
        assert!("/a/b*"
            .parse::<RoutePattern>()
            .unwrap_err()
            .contains("stand alone"));
    }

    #[test]
    fn overlap_detection() {
        assert!(p("/api/agent/**").overlaps(&p("POST /api/agent/enroll")));
        assert!(p("/api/*/enroll").overlaps(&p("/api/agent/*")));
        assert!(!p("POST /x").overlaps(&p("GET /x")));
        assert!(!p("/api/agent/**").overlaps(&p("/api/cron/**")));
        assert!(p("/a/**/z").overlaps(&p("/a/b/**")));
        assert!(!p("/a/b").overlaps(&p("/a/b/c")));
    }

    #[test]
    fn a_header_cost_is_honest_or_the_most() {
        let c = Cost::Header {
            name: Arc::from("x-batch-size"),
            max: crate::limiter::nonzero(50),
        };
        for (v, want) in [
            (None, 1),
            (Some(&b"7"[..]), 7),
            (Some(b" 12 "), 12),
            (Some(b"50"), 50),
            (Some(b"51"), 50),
            (Some(b"99999999999999999999999999999"), 50),
            (Some(b"0"), 50),
            (Some(b"-3"), 50),
            (Some(b"+3"), 50),
            (Some(b"3.5"), 50),
            (Some(b"0x10"), 50),
            (Some(b""), 50),
            (Some("\u{663}".as_bytes()), 50),
        ] {
            assert_eq!(c.of(v).get(), want, "{v:?}");
        }
        assert_eq!(
            Cost::Fixed(crate::limiter::nonzero(4)).of(Some(b"1")).get(),
            4
        );
        assert_eq!(Cost::default().of(None).get(), 1);
    }

    #[test]
    fn coverage() {
        assert!(p("/api/**").covers(&p("GET /api/tasks")));
        assert!(p("/api/**").covers(&p("/api/*/x/**")));
        assert!(p("/api/*").covers(&p("/api/x")));
        assert!(!p("/api/*").covers(&p("/api/**")));
        assert!(!p("/api/x").covers(&p("/api/*")));
        assert!(!p("GET /api/**").covers(&p("/api/x")));
        assert!(!p("/api/agent/**").covers(&p("/api/**")));
        assert!(p("/**").covers(&p("/a/b/**")));
    }

    #[test]
    fn specificity_orders_exact_over_wildcards() {
        assert!(p("POST /api/agent/enroll").specificity() > p("/api/agent/**").specificity());
        assert!(p("GET /api/agent/download/**").specificity() > p("/api/agent/**").specificity());
        assert!(p("GET /a/b").specificity() > p("/a/b").specificity());
    }
}
