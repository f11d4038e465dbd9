//! Entry points for the fuzz targets under `fuzz/` (cargo feature `fuzzing`): thin wrappers
//! that reach the crate's private parsers, with what they return made owned and comparable.
//! Not an API: nothing here is stable, and the feature is off in every build that ships.

use crate::calibration::replay::line::{Fields, Malformed};
use crate::calibration::replay::{alb, json};
use crate::calibration::LogFormat;
use crate::path::{Class, PathRules, Rejected};
use actix_web::http::header::{HeaderMap, HeaderName, HeaderValue};
use std::num::NonZeroU32;

/// A refused path: its class's name and the byte offset in the path as sent.
pub type Refused = (&'static str, usize);

fn refused(r: Rejected) -> Refused {
    (r.class.as_str(), r.at)
}

// ------------------------------------------------------------------------------------------
// Paths (src/path)
// ------------------------------------------------------------------------------------------

/// The rules allowing each configurable class whose bit is set (bit `i`:
/// `Class::CONFIGURABLE[i]`, in the order of the `[path]` settings); 0 is the default.
pub fn path_rules(bits: u8) -> PathRules {
    Class::CONFIGURABLE
        .into_iter()
        .enumerate()
        .filter(|(i, _)| bits & (1 << i) != 0)
        .fold(PathRules::STRICT, |r, (_, c)| r.allowing(c))
}

/// Whether the one-pass check in front of the full parse passes `path` as canonical.
pub fn path_fast_check(path: &str) -> bool {
    crate::path::passes_fast_check(path)
}

/// The full parse of `path`, without the one-pass check in front of it.
pub fn path_full(path: &str, rules: PathRules) -> Result<String, Refused> {
    crate::path::full_parse(path, rules).map_err(refused)
}

/// [`crate::path::CanonicalPath::parse`], owned.
pub fn path_parse(path: &str, rules: PathRules) -> Result<String, Refused> {
    crate::path::CanonicalPath::parse(path, rules)
        .map(|p| p.as_str().to_owned())
        .map_err(refused)
}

/// [`crate::path::CanonicalPath::exact`], owned.
pub fn path_exact(path: &str, rules: PathRules) -> Result<String, Refused> {
    crate::path::CanonicalPath::exact(path, rules)
        .map(|p| p.as_str().to_owned())
        .map_err(refused)
}

/// Whether byte `b` stands for itself in a canonical segment (RFC 3986 `pchar` but `;`).
pub fn path_literal(b: u8) -> bool {
    crate::path::stands_for_itself(b)
}

// ------------------------------------------------------------------------------------------
// The decision endpoint's questions (src/http/forward_auth.rs)
// ------------------------------------------------------------------------------------------

/// What the decision endpoint read from a question.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Question {
    /// The original method and URI (empty when the URI was refused as it was read).
    pub method: String,
    pub uri: String,
    /// The path metered, or why the target was refused.
    pub path: Result<String, Refused>,
}

/// The headers an HTTP parser would pass on, as a header map: pairs whose name or value is not
/// valid in HTTP are left out. Returns the map and the pairs kept (names lower-cased).
pub fn header_map(pairs: &[(&[u8], &[u8])]) -> (HeaderMap, Vec<(String, Vec<u8>)>) {
    let mut map = HeaderMap::new();
    let mut kept = Vec::new();
    for (name, value) in pairs {
        let (Ok(n), Ok(v)) = (HeaderName::from_bytes(name), HeaderValue::from_bytes(value)) else {
            continue;
        };
        kept.push((n.as_str().to_owned(), value.to_vec()));
        map.append(n, v);
    }
    (map, kept)
}

/// The endpoint's reading of a question with these headers on path `flavour` (0 `/nginx`, 1
/// `/caddy`, else `/envoy` with the check request's own method and target, `/envoy/...`):
/// `Err` with the detail of a 400 answered before the target is looked at.
pub fn forward_auth(
    headers: &HeaderMap,
    flavour: u8,
    envoy: (&str, &str),
    rules: PathRules,
) -> Result<Question, String> {
    let (method, uri, path) =
        crate::http::forward_auth::read_question(headers, flavour, envoy, rules)?;
    Ok(Question {
        method: method.to_owned(),
        uri: uri.to_owned(),
        path: path.map(|p| p.as_str().to_owned()).map_err(refused),
    })
}

/// The method overrides a request names under the default `[methods]` rules, as the decision
/// endpoint (`decision`) or the gateway judges them, in words.
pub fn method_overrides(headers: &HeaderMap, query: Option<&str>, decision: bool) -> String {
    let at = if decision {
        crate::methods::At::DecisionEndpoint
    } else {
        crate::methods::At::Gateway
    };
    let pairs = headers
        .iter()
        .map(|(name, value)| (name.as_str(), value.as_bytes()));
    format!(
        "{:?}",
        crate::methods::MethodRules::default().judge(pairs, query, at)
    )
}

// ------------------------------------------------------------------------------------------
// Header values (keys, identity, costs)
// ------------------------------------------------------------------------------------------

/// A `header:<name>` key's value, when it counts.
pub fn key_header(raw: &[u8]) -> Option<&str> {
    crate::keys::valid_key_header(raw)
}

/// The units a request costs a limiter with `cost_header` and `cost_max = max`, given the
/// header's value (`None`: not sent).
pub fn header_cost(value: Option<&[u8]>, max: NonZeroU32) -> NonZeroU32 {
    crate::policy::Cost::Header {
        name: "x-cost".into(),
        max,
    }
    .of(value)
}

/// The value of cookie `name` among these `Cookie` header values.
pub fn session_cookie<'a>(values: &[&'a [u8]], name: &str) -> Option<&'a str> {
    crate::http::request::cookie_value(values.iter().copied(), name)
}

// ------------------------------------------------------------------------------------------
// Access-log lines (src/calibration/replay)
// ------------------------------------------------------------------------------------------

/// What a replay reads from one line, owned.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Line {
    pub addr: Vec<u8>,
    /// Unix nanoseconds.
    pub time: i64,
    pub method: Vec<u8>,
    pub target: Vec<u8>,
    pub forwarded: Option<Vec<u8>>,
    pub agent_id: Option<Vec<u8>>,
    pub user: Option<Vec<u8>>,
    pub authorization: bool,
}

fn owned(f: &Fields<'_>) -> Line {
    Line {
        addr: f.addr.to_vec(),
        time: f.time.unwrap_or(i64::MIN),
        method: f.method.to_vec(),
        target: f.target.to_vec(),
        forwarded: f.forwarded.map(<[u8]>::to_vec),
        agent_id: f.agent_id.map(<[u8]>::to_vec),
        user: f.user.map(<[u8]>::to_vec),
        authorization: f.authorization,
    }
}

/// Every slice of a line's fields lies inside `line` (but a target read as `/`, which an ALB
/// line's absolute URL without a path stands for).
fn within(f: &Fields<'_>, line: &[u8]) -> bool {
    let range = line.as_ptr_range();
    [
        Some(f.addr),
        Some(f.method),
        (f.target != b"/").then_some(f.target),
        f.forwarded,
        f.agent_id,
        f.user,
    ]
    .into_iter()
    .flatten()
    .all(|s| s.is_empty() || range.start <= s.as_ptr() && s.as_ptr_range().end <= range.end)
}

/// One line read in an nginx format; `Err` with the reason it is malformed. Panics if a field
/// read from the line is not a part of it.
pub fn nginx(format: &LogFormat, line: &[u8]) -> Result<Line, &'static str> {
    let f = format.parse(line).map_err(Malformed::describe)?;
    assert!(within(&f, line), "a field is not part of the line");
    Ok(owned(&f))
}

/// The pieces of a compiled nginx format in order: a literal as `Ok`, a variable as `Err`
/// with the name of what a replay reads from it (`other` for the variables it ignores).
pub fn nginx_pieces(format: &LogFormat) -> Vec<Result<&[u8], &'static str>> {
    format.pieces()
}

/// Each variable's value in `line`, in the format's order, named as in [`nginx_pieces`].
pub fn nginx_values<'a>(
    format: &LogFormat,
    line: &'a [u8],
) -> Result<Vec<(&'static str, &'a [u8])>, &'static str> {
    format.values(line).map_err(Malformed::describe)
}

/// One ALB line; `Err` with the reason it is malformed. Panics if a field read from the line is
/// not a part of it.
pub fn alb(line: &[u8]) -> Result<Line, &'static str> {
    let f = alb::parse(line).map_err(Malformed::describe)?;
    assert!(within(&f, line), "a field is not part of the line");
    Ok(owned(&f))
}

/// One JSON line read with the mapping `spec` (`json` or `json:key=field,...`): `Err` when the
/// mapping is refused, else the line or the reason it is malformed.
pub fn json(spec: &str, line: &[u8]) -> Result<Result<Line, &'static str>, String> {
    let mapping = json::Mapping::parse(spec)?;
    let mut scratch = serde_json::Map::new();
    Ok(mapping
        .read(line, &mut scratch)
        .map(|f| owned(&f))
        .map_err(Malformed::describe))
}

// ------------------------------------------------------------------------------------------
// Body keys (src/keys/body.rs)
// ------------------------------------------------------------------------------------------

/// The key a `body:email` limiter reads from `body` as JSON (`json`) or a form: `Ok(None)` for
/// a body that names no `email`, `Err` with the reason's name for one it refuses.
pub fn body_email(json: bool, body: &[u8]) -> Result<Option<String>, &'static str> {
    use crate::keys::body::{values, Format};
    let format = if json { Format::Json } else { Format::Form };
    values(format, body, &["email"])
        .map(|mut v| v.pop().flatten())
        .map_err(|r| r.as_str())
}

/// A value as its key ([`crate::keys::body::normalize`]).
pub fn body_normalize(raw: &str) -> Option<String> {
    crate::keys::body::normalize(raw)
}

// ------------------------------------------------------------------------------------------
// The proxy's HTTP/1.1 client against hyper's (src/http/proxy/differential.rs)
// ------------------------------------------------------------------------------------------

/// `None` when the proxy's client reads `bytes` (all the upstream sent, to a GET, or to a HEAD
/// with `head`) as hyper's client does, or refuses it; else what differs.
pub fn proxy_answer_differs(bytes: &[u8], head: bool) -> Option<String> {
    crate::http::proxy::differential::differs(bytes, head)
}

/// The raw answers the fuzz target's corpus is seeded with.
pub fn proxy_answer_seeds() -> &'static [&'static [u8]] {
    crate::http::proxy::differential::SEEDS
}
