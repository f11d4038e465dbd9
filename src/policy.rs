//! Which limiters meter a request: a pure function of method, path and credential kind.
//!
//! The guarded set is an allow-list: a request no route names passes unmetered. Limiters in one
//! `group` are alternatives (the most specific matching route wins); limiters in different
//! groups stack (all must allow).

use crate::keys::KeyKind;
use crate::limiter::Quota;
use parking_lot::RwLock;
use serde::{Deserialize, Serialize};
use smallvec::SmallVec;
use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};
use std::str::FromStr;
use std::sync::Arc;

/// What kind of credential a request carries, as far as limiting cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Credential {
    /// No `Authorization: Bearer`.
    None,
    /// `Bearer pa_…`.
    ApiKey,
    /// A Bearer token that is neither an API key nor a verified dashboard token.
    CliToken,
    /// A dashboard session token that verified.
    VerifiedUser,
}

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

/// The answer when the store cannot decide.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum OnStoreError {
    #[default]
    Allow,
    Deny,
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
}

impl LimiterSpec {
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
type Picked = SmallVec<[usize; 4]>;

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

    /// The limiters that meter this request, in configuration order.
    ///
    /// The path is read two ways: normalised (escapes decoded, dot segments resolved), as a
    /// normalising proxy or router sees it, and as sent (only case ignored), as Express routes
    /// it. When the two differ, the limiters of both apply, so a spelling that one router
    /// resolves differently from the other cannot move a request to a looser limiter.
    pub fn applicable(
        &self,
        method: &str,
        path: &str,
        cred: Credential,
    ) -> SmallVec<[Arc<LimiterSpec>; 4]> {
        let picked = if is_normalized(path) {
            // Most requests: the path reads the same raw and normalised, and was seen before.
            self.memo.get_or_insert(method, path, cred, || {
                self.applicable_to(method, path, cred)
            })
        } else {
            let normalized = normalize_path(path);
            let mut picked = self.applicable_to(method, &normalized, cred);
            let raw = raw_path(path);
            if raw != normalized {
                for i in self.applicable_to(method, &raw, cred) {
                    if !picked.contains(&i) {
                        picked.push(i);
                    }
                }
                picked.sort_unstable();
            }
            picked
        };
        picked
            .into_iter()
            .map(|i| self.limiters[i].clone())
            .collect()
    }

    /// Indices of the limiters that meter `path` (already normalised one way or the other).
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

/// Remembered answers of [`Policy::applicable_to`] for paths already in normal form: matching
/// every limiter's routes once per distinct path instead of once per request. It lives inside
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
        let mut segs = Vec::new();
        for seg in path.split('/').filter(|s| !s.is_empty()) {
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

/// The path as a router would see it: the query dropped, percent-escapes decoded, `.`, `..`
/// and empty segments resolved, lower-cased. A request cannot dodge a route by spelling its
/// path differently.
pub fn normalize_path(path: &str) -> String {
    let path = path.split(['?', '#']).next().unwrap_or("");
    let decoded = percent_decode(path);
    let mut out: Vec<&str> = Vec::new();
    for seg in decoded.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            s => out.push(s),
        }
    }
    let mut s = String::with_capacity(decoded.len() + 1);
    for seg in out {
        s.push('/');
        s.push_str(seg);
    }
    if s.is_empty() {
        s.push('/');
    }
    s.to_ascii_lowercase()
}

/// The path as sent, query dropped and lower-cased: how Express matches routes (it neither
/// decodes escapes nor resolves dot segments before matching).
pub fn raw_path(path: &str) -> String {
    let path = path.split(['?', '#']).next().unwrap_or("");
    let mut s = path.to_ascii_lowercase();
    if s.is_empty() {
        s.push('/');
    }
    s
}

/// Whether [`normalize_path`] (and [`raw_path`]) would return `path` unchanged (most requests'
/// paths): no query, escape, upper case, empty, `.` or `..` segment, and no trailing slash.
fn is_normalized(path: &str) -> bool {
    // One pass over the bytes: this runs on every request.
    let b = path.as_bytes();
    if b.first() != Some(&b'/') {
        return false;
    }
    if b.len() == 1 {
        return true;
    }
    let mut seg_start = 1;
    for i in 1..=b.len() {
        match b.get(i) {
            Some(b'?' | b'#' | b'%' | b'A'..=b'Z') => return false,
            Some(b'/') | None => {
                if matches!(&b[seg_start..i], b"" | b"." | b"..") {
                    return false;
                }
                seg_start = i + 1;
            }
            Some(_) => {}
        }
    }
    true
}

fn percent_decode(s: &str) -> String {
    if !s.contains('%') {
        return s.to_owned();
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hi = (bytes[i + 1] as char).to_digit(16);
            let lo = (bytes[i + 2] as char).to_digit(16);
            if let (Some(h), Some(l)) = (hi, lo) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8(out).unwrap_or_else(|_| s.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn already_normal_paths_are_recognised_exactly() {
        let paths = [
            "/",
            "/api/agent/heartbeat",
            "/api/agent/heartbeat/",
            "//api",
            "/api//x",
            "/api/./x",
            "/api/../x",
            "/API/x",
            "/api/x?y=1",
            "/api/x#f",
            "/api/%61gent",
            "api/x",
            "",
            "/a.b/c..d",
            "/.hidden",
            "/caf\u{e9}/x",
        ];
        for p in paths {
            if is_normalized(p) {
                assert_eq!(normalize_path(p), p, "{p:?} was taken as normal");
            }
        }
        assert!(is_normalized("/api/agent/heartbeat"));
        assert!(is_normalized("/"));
        assert!(!is_normalized("/api/agent/heartbeat/"));
        assert!(!is_normalized("/API/agent"));
    }

    /// The same question asked the obvious way, segment by segment.
    fn is_normalized_by_segments(path: &str) -> bool {
        let b = path.as_bytes();
        if b.first() != Some(&b'/') || (b.len() > 1 && b.ends_with(b"/")) {
            return false;
        }
        if b.iter()
            .any(|c| matches!(c, b'?' | b'#' | b'%' | b'A'..=b'Z'))
        {
            return false;
        }
        path == "/"
            || path[1..]
                .split('/')
                .all(|seg| !matches!(seg, "" | "." | ".."))
    }

    #[test]
    fn the_one_pass_check_agrees_with_the_segment_by_segment_one() {
        // Every string of up to 6 characters over an alphabet with each byte that matters.
        let alphabet = ['/', '.', 'a', 'A', '%', '?', '#', '\u{e9}'];
        let mut paths = vec![String::new()];
        let mut checked = 0;
        for _ in 0..6 {
            let mut next = Vec::with_capacity(paths.len() * alphabet.len());
            for p in &paths {
                for c in alphabet {
                    let mut q = p.clone();
                    q.push(c);
                    assert_eq!(is_normalized(&q), is_normalized_by_segments(&q), "{q:?}");
                    checked += 1;
                    next.push(q);
                }
            }
            paths = next;
        }
        assert_eq!(is_normalized(""), is_normalized_by_segments(""));
        assert!(checked > 290_000);
    }

    fn p(s: &str) -> RoutePattern {
        s.parse().unwrap()
    }

    fn m(pat: &str, method: &str, path: &str) -> bool {
        let n = normalize_path(path);
        let segs: Vec<&str> = n.split('/').filter(|s| !s.is_empty()).collect();
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
            "/api/x/../agent/enroll?y=1"
        ));
        assert_eq!(normalize_path("/%ff%fe"), "/%ff%fe");
        assert_eq!(normalize_path(""), "/");
        assert_eq!(normalize_path("/a%2"), "/a%2");
        assert_eq!(normalize_path("/../../etc"), "/etc");
    }

    fn names(p: &Policy, method: &str, path: &str) -> Vec<String> {
        p.applicable(method, path, Credential::None)
            .iter()
            .map(|l| l.name.to_string())
            .collect()
    }

    #[test]
    fn dot_segments_cannot_move_a_request_to_a_looser_limiter() {
        let p = Policy::new(crate::config::Config::default().limiters);
        // Express routes these by the raw prefix (the agent router); a normalising router
        // would see /api/cron/x. Both views are metered.
        assert_eq!(
            names(&p, "GET", "/api/agent/../cron/x"),
            ["agent-device", "agent-ip"]
        );
        assert_eq!(
            names(&p, "GET", "/api/agent/%2e%2e/cron/x"),
            ["agent-device", "agent-ip"]
        );
        assert_eq!(
            names(&p, "GET", "/api/agent/%2e%2e/%2e%2e/healthz"),
            ["agent-device", "agent-ip"]
        );
        // The other way round: the normalised view names enrollment, the raw one ui.
        assert_eq!(
            names(&p, "POST", "/api/x/../agent/enroll"),
            ["enrollment", "ui"]
        );
        // Ordinary spellings read the same both ways.
        assert_eq!(names(&p, "POST", "/API/Agent/Enroll/"), ["enrollment"]);
        assert_eq!(names(&p, "GET", "/api/cron/x"), Vec::<String>::new());
        assert_eq!(names(&p, "GET", "/healthz"), Vec::<String>::new());
        // Escapes alone: the normalised view names enrollment, Express sees agent-device.
        assert_eq!(
            names(&p, "POST", "/api/agent/%65nroll"),
            ["agent-device", "agent-ip", "enrollment"]
        );
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
    fn specificity_orders_exact_over_wildcards() {
        assert!(p("POST /api/agent/enroll").specificity() > p("/api/agent/**").specificity());
        assert!(p("GET /api/agent/download/**").specificity() > p("/api/agent/**").specificity());
        assert!(p("GET /a/b").specificity() > p("/a/b").specificity());
    }
}
