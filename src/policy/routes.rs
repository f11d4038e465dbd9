//! The route table's patterns: `METHOD /path/*` read in canonical form, matched segment by
//! segment, ordered by specificity, and compared for overlap and coverage.

use crate::path::{CanonicalPath, PathRules};
use serde::Serialize;
use std::fmt;
use std::str::FromStr;

/// How specific a route is: literal segments first, then whether it names a method, then
/// fewer wildcards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Specificity {
    literals: usize,
    method: bool,
    fewer_wildcards: std::cmp::Reverse<usize>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Seg {
    Lit(String),
    Star,
    DoubleStar,
    /// `{name}`: one segment, as `*`, whose value a limiter may key on (`ip+path:<name>`).
    Param(Box<str>),
}

/// Longest name of a path parameter (`{name}`).
const MAX_PARAM_NAME: usize = 32;

/// The name inside a `{name}` segment, as the canonical form writes the braces (`%7B…%7D`), or
/// `None` when the segment is not one.
fn param_name(seg: &str) -> Option<&str> {
    seg.strip_prefix("%7B")?.strip_suffix("%7D")
}

/// A parameter's name: 1-32 characters of a-z, 0-9 and `_`, starting with a letter.
pub(crate) fn valid_param_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_PARAM_NAME
        && name.bytes().next().is_some_and(|b| b.is_ascii_lowercase())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// `[METHOD ]/path/with/*/and/**`: `*` is one segment, `**` any number (zero included), so
/// `/api/agent/download/**` also matches `/api/agent/download`; `{name}` is one segment, as
/// `*`, that a limiter keyed `ip+path:<name>` reads. Matching ignores case and a trailing
/// slash, as Express routing does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutePattern {
    method: Option<String>,
    pub(super) segs: Vec<Seg>,
    raw: String,
}

pub(super) const METHODS: &[&str] = &[
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
            if let Some(name) = param_name(seg) {
                segs.push(param_seg(raw, name, &segs)?);
                continue;
            }
            segs.push(match seg {
                "*" => Seg::Star,
                "**" => Seg::DoubleStar,
                s if s.contains('*') => {
                    return Err(format!(
                        "`{raw}`: `*` and `**` must stand alone as a whole path segment"
                    ))
                }
                s if s.contains("%7B") || s.contains("%7D") => {
                    return Err(format!(
                        "`{raw}`: a path parameter stands alone as a whole segment, `{{name}}` (e.g. \"POST /api/fleet/agents/{{id}}/checkin\")"
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

/// A `{name}` segment of route `raw`, after the segments `before` it: a valid name, once per
/// route, and before any `**` (so its position in a request's path is fixed).
fn param_seg(raw: &str, name: &str, before: &[Seg]) -> Result<Seg, String> {
    if !valid_param_name(name) {
        return Err(format!(
            "`{raw}`: `{{{name}}}` is not a path parameter; name it with 1-{MAX_PARAM_NAME} characters of a-z, 0-9 and `_`, starting with a letter, e.g. `{{id}}`"
        ));
    }
    if before.contains(&Seg::DoubleStar) {
        return Err(format!(
            "`{raw}`: `{{{name}}}` follows `**`, so its place in a path is not fixed; put `{{{name}}}` before any `**`"
        ));
    }
    if before
        .iter()
        .any(|s| matches!(s, Seg::Param(n) if **n == *name))
    {
        return Err(format!(
            "`{raw}`: `{{{name}}}` is named twice; give each parameter its own name"
        ));
    }
    Ok(Seg::Param(Box::from(name)))
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
/// Of named route sets, the first two patterns of different sets that one request could match
/// with the same specificity (so neither set wins): `(set, pattern, other set, other pattern)`,
/// the later set first. Admission groups and shaped routes refuse such a pair at start.
pub(crate) fn ambiguous_pair<'a>(
    sets: &[(&'a str, &'a [RoutePattern])],
) -> Option<(&'a str, &'a RoutePattern, &'a str, &'a RoutePattern)> {
    for (i, (a_name, a)) in sets.iter().enumerate() {
        for (b_name, b) in &sets[i + 1..] {
            for ra in a.iter() {
                for rb in b.iter() {
                    if ra.overlaps(rb) && ra.specificity() == rb.specificity() {
                        return Some((b_name, rb, a_name, ra));
                    }
                }
            }
        }
    }
    None
}

/// Of route sets each with a value, the value of the set whose pattern matches `method` on the
/// path's segments `segs` most specifically.
pub(crate) fn most_specific<'a, T: Copy + 'a>(
    sets: impl IntoIterator<Item = (&'a [RoutePattern], T)>,
    method: &str,
    segs: &[&str],
) -> Option<T> {
    let mut best: Option<(Specificity, T)> = None;
    for (patterns, value) in sets {
        let spec = patterns
            .iter()
            .filter(|r| r.matches(method, segs))
            .map(RoutePattern::specificity)
            .max();
        if let Some(spec) = spec {
            if best.as_ref().is_none_or(|(b, _)| spec > *b) {
                best = Some((spec, value));
            }
        }
    }
    best.map(|(_, v)| v)
}

pub(super) fn fresh_segment(patterns: &[&RoutePattern]) -> String {
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
pub(super) const MAX_SAMPLES_PER_ROUTE: usize = 243;

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

    /// Whether the route names the path parameter `{name}`.
    pub fn names_param(&self, name: &str) -> bool {
        self.param_index(name).is_some()
    }

    /// Where `{name}` stands among the route's segments (before any `**`, so it is the same
    /// index in every path the route matches).
    fn param_index(&self, name: &str) -> Option<usize> {
        self.segs
            .iter()
            .position(|s| matches!(s, Seg::Param(n) if **n == *name))
    }

    /// The segment of a request's path `segs` that stands where `{name}` does, when this route
    /// matches the request and names `{name}`: as the canonical path spells it (the spelling
    /// the upstream receives), not yet checked as a key.
    pub fn param<'p>(&self, name: &str, method: &str, segs: &[&'p str]) -> Option<&'p str> {
        let i = self.param_index(name)?;
        if !self.matches(method, segs) {
            return None;
        }
        segs.get(i).copied()
    }

    /// The method the route names, if any.
    pub fn method(&self) -> Option<&str> {
        self.method.as_deref()
    }

    /// The path part as written, without the method.
    pub fn path_str(&self) -> &str {
        match &self.method {
            Some(m) => self.raw[m.len()..].trim_start(),
            None => &self.raw,
        }
    }

    /// Requests paths this route matches, its wildcards filled with `fresh`: `*` with one
    /// segment, `**` with none, one and two.
    pub(super) fn sample_paths(&self, fresh: &str) -> Vec<String> {
        let two = format!("{fresh}/{fresh}");
        let mut out = vec![String::new()];
        for seg in &self.segs {
            let fills: Vec<&str> = match seg {
                Seg::Lit(l) => vec![l.as_str()],
                Seg::Star | Seg::Param(_) => vec![fresh],
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
        (Some((Seg::Star | Seg::Param(_), or)), Some((_, ir))) => segs_cover(or, ir),
        (Some((Seg::Lit(a), or)), Some((Seg::Lit(b), ir))) => a == b && segs_cover(or, ir),
        (Some((Seg::Lit(_), _)), Some((Seg::Star | Seg::Param(_), _))) => false,
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
                    Seg::Star | Seg::DoubleStar | Seg::Param(_) => true,
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
