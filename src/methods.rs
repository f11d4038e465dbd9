//! Which methods a request may use, and which other methods it names by override.
//!
//! Many frameworks let a request say it is "really" another method, and route it as that one:
//!
//! | framework | header | query parameter | form body |
//! |---|---|---|---|
//! | Express `method-override` | `X-HTTP-Method-Override` (or any header it is given) | the name it is given | the name it is given |
//! | Rails (`Rack::MethodOverride`) | `X-HTTP-Method-Override` | | `_method` |
//! | Laravel, Symfony (`Request::getMethod`) | `X-HTTP-Method-Override` | `_method` | `_method` |
//! | Spring (`HiddenHttpMethodFilter`), Go gorilla/handlers | gorilla: `X-HTTP-Method-Override` | `_method` | `_method` |
//! | ASP.NET Core (`UseHttpMethodOverride`) | `X-HTTP-Method-Override` | | a form field it is given |
//! | Google APIs | `X-HTTP-Method-Override` | | |
//! | OData, SharePoint | `X-HTTP-Method` | | |
//! | others (ArangoDB, Restlet) | `X-HTTP-Method`, `X-Method-Override` | | |
//!
//! A limiter that reads only the request line meters such a request as a method the upstream
//! never routes it as. [`MethodRules::judge`] reads the override headers and query parameters
//! the way the most permissive of these frameworks would:
//!
//! - header names without regard to case, `_` read as `-` (CGI-style servers, PHP and WSGI
//!   among them, map `X_HTTP_Method_Override` to the same variable as `X-HTTP-Method-Override`);
//!   every header line, and every comma-separated element of each (`method-override` takes the
//!   first element of what Node joined; ASP.NET Core and Rack take the whole value), trimmed and
//!   upper-cased;
//! - query parameters split on `&` and `;`, names and values percent-decoded (`+` is a space),
//!   names without regard to case, leading spaces dropped, ` ` and `.` read as `_` and anything
//!   from `[` or a NUL on ignored (PHP's rules), every repetition (Express takes the first, PHP
//!   the last).
//!
//! Each value named must be a method in `methods.allowed`: a value that is not an HTTP method
//! token, names a method outside the list, or comes with more than a handful of others is
//! refused rather than guessed. A form body's `_method` is not read: the gateway never buffers
//! a body (docs/security.md says what to do about it).
//!
//! `methods.allowed` itself: a request whose own method is not in it (CONNECT, TRACE, WebDAV
//! methods, made-up tokens, lower-case spellings) is answered by the gateway and never forwarded.

use smallvec::SmallVec;

/// What the gateway does with a request that names a method override (`methods.override`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OverrideMode {
    /// Meter it by every limiter its own method picks and every limiter each named method
    /// picks, and forward it unchanged.
    #[default]
    Meter,
    /// Remove the override headers and parameters before the upstream sees them, and meter its
    /// own method. (The decision endpoint cannot remove anything: there it is refused.)
    Strip,
    /// Refuse it with 400.
    Refuse,
}

impl OverrideMode {
    pub const ALL: [OverrideMode; 3] = [
        OverrideMode::Meter,
        OverrideMode::Strip,
        OverrideMode::Refuse,
    ];

    /// The name configuration uses: `meter`, `strip`, `refuse`.
    pub fn as_str(self) -> &'static str {
        match self {
            OverrideMode::Meter => "meter",
            OverrideMode::Strip => "strip",
            OverrideMode::Refuse => "refuse",
        }
    }
}

/// The override headers read by default.
pub const DEFAULT_OVERRIDE_HEADERS: [&str; 3] = [
    "X-HTTP-Method-Override",
    "X-HTTP-Method",
    "X-Method-Override",
];
/// The override query parameters read by default.
pub const DEFAULT_OVERRIDE_PARAMS: [&str; 1] = ["_method"];
/// The methods forwarded by default.
pub const DEFAULT_ALLOWED: [&str; 7] = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"];
/// Methods `methods.allowed` may not list: the gateway opens no tunnels (CONNECT), and TRACE
/// echoes a request's credentials back.
pub const NEVER_ALLOWED: [&str; 2] = ["CONNECT", "TRACE"];
/// Most methods `methods.allowed` may list (the methods named by one request are a bit set).
pub const MAX_ALLOWED: usize = 32;
/// Longest method `methods.allowed` may list, and longest override value read as one.
pub const MAX_METHOD_LEN: usize = 32;
/// Most names `override_headers` and `override_params` may each list.
pub const MAX_NAMES: usize = 16;
/// Longest name `override_headers` and `override_params` may list.
pub const MAX_NAME_LEN: usize = 64;
/// Most override values (comma-separated elements, over every header and parameter) one request
/// may carry.
pub const MAX_OVERRIDE_VALUES: usize = 16;
/// Most different methods one request may name by override.
pub const MAX_OVERRIDE_METHODS: usize = 4;

/// `methods`, validated: the override mode, the names read, the methods forwarded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MethodRules {
    mode: OverrideMode,
    /// Override header names, lower-case, `_` written `-`.
    headers: Box<[Box<str>]>,
    /// Bit `n` set: some override header name is `n` bytes long (a header of another length is
    /// passed over with one test).
    header_lengths: u128,
    /// Override parameter names, read by [`param_name`] (lower-case, `_` for ` ` and `.`).
    params: Box<[Box<str>]>,
    /// The methods forwarded, upper-case, in configuration order.
    allowed: Box<[Box<str>]>,
    /// The `Allow` value: the allowed methods, comma-separated.
    allow: Box<str>,
}

impl Default for MethodRules {
    fn default() -> Self {
        Self::new(
            OverrideMode::default(),
            &DEFAULT_OVERRIDE_HEADERS,
            &DEFAULT_OVERRIDE_PARAMS,
            &DEFAULT_ALLOWED,
        )
    }
}

/// Where a request names an override.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A header, by the name the request used (lower-case).
    Header(Box<str>),
    /// A query parameter, by the configured name it was read as.
    Param(Box<str>),
}

impl Source {
    /// `the `x-http-method-override` header`, `The …` at the start of a sentence.
    fn describe(&self, capital: bool) -> String {
        let the = if capital { "The" } else { "the" };
        match self {
            Source::Header(h) => format!("{the} `{h}` header"),
            Source::Param(p) => format!("{the} `{p}` query parameter"),
        }
    }
}

/// Why a request was refused for its method: the `reason` label of
/// `fleet_limiter_method_refusals_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalReason {
    /// Its own method is not in `methods.allowed` (501).
    Method,
    /// It names an override and `methods.override = "refuse"`.
    Override,
    /// It names an override, `methods.override = "strip"`, and it came to the decision
    /// endpoint, which cannot remove it.
    OverrideUnstrippable,
    /// An override value that is not an HTTP method.
    OverrideNotAMethod,
    /// An override naming a method outside `methods.allowed`.
    OverrideNotAllowed,
    /// More override values, or different methods, than one request may name.
    OverrideTooMany,
}

impl RefusalReason {
    pub const ALL: [RefusalReason; 6] = [
        RefusalReason::Method,
        RefusalReason::Override,
        RefusalReason::OverrideUnstrippable,
        RefusalReason::OverrideNotAMethod,
        RefusalReason::OverrideNotAllowed,
        RefusalReason::OverrideTooMany,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RefusalReason::Method => "method_not_allowed",
            RefusalReason::Override => "override_refused",
            RefusalReason::OverrideUnstrippable => "override_unstrippable",
            RefusalReason::OverrideNotAMethod => "override_not_a_method",
            RefusalReason::OverrideNotAllowed => "override_not_allowed",
            RefusalReason::OverrideTooMany => "override_too_many",
        }
    }
}

/// Why a request's method override was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// `methods.override = "refuse"`, and the request names one.
    Refused(Source),
    /// `methods.override = "strip"` at the decision endpoint, which cannot remove it.
    Unstrippable(Source),
    /// A value that is not an HTTP method token.
    NotAMethod(Source),
    /// A method outside `methods.allowed` (upper-case, at most [`MAX_METHOD_LEN`] bytes).
    NotAllowed(Source, Box<str>),
    /// More than [`MAX_OVERRIDE_VALUES`] values or [`MAX_OVERRIDE_METHODS`] methods.
    TooMany,
}

impl Refusal {
    pub fn reason(&self) -> RefusalReason {
        match self {
            Refusal::Refused(_) => RefusalReason::Override,
            Refusal::Unstrippable(_) => RefusalReason::OverrideUnstrippable,
            Refusal::NotAMethod(_) => RefusalReason::OverrideNotAMethod,
            Refusal::NotAllowed(..) => RefusalReason::OverrideNotAllowed,
            Refusal::TooMany => RefusalReason::OverrideTooMany,
        }
    }

    /// What the client is told (a problem document's `detail`).
    pub fn detail(&self, rules: &MethodRules) -> String {
        match self {
            Refusal::Refused(s) => format!(
                "This gateway refuses method overrides (methods.override = \"refuse\"), and the request names one in {}. Send the request with the method it means in its request line.",
                s.describe(false)
            ),
            Refusal::Unstrippable(s) => format!(
                "Method overrides are removed before the upstream sees them (methods.override = \"strip\"), but {} cannot be removed here (a proxy that asks the decision endpoint forwards the request as it is), so the request is refused. Send the request with the method it means in its request line.",
                s.describe(false)
            ),
            Refusal::NotAMethod(s) => format!(
                "{} does not name an HTTP method; a method override is refused rather than guessed.",
                s.describe(true)
            ),
            Refusal::NotAllowed(s, m) => format!(
                "{} names `{m}`, which this gateway does not forward (it forwards {}).",
                s.describe(true),
                rules.allow()
            ),
            Refusal::TooMany => format!(
                "The request names more than {MAX_OVERRIDE_VALUES} method overrides, or more than {MAX_OVERRIDE_METHODS} different methods; name one."
            ),
        }
    }
}

/// The methods a request names by override: a set over `methods.allowed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Named(u32);

impl Named {
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn len(self) -> usize {
        self.0.count_ones() as usize
    }

    /// The methods, in `methods.allowed` order.
    pub fn methods(self, rules: &MethodRules) -> SmallVec<[&str; 4]> {
        if self.0 == 0 {
            return SmallVec::new();
        }
        rules
            .allowed
            .iter()
            .enumerate()
            .filter(|(i, _)| self.0 & (1 << i) != 0)
            .map(|(_, m)| &**m)
            .collect()
    }
}

/// Where the request is being judged: only the gateway (or the middleware) can remove an
/// override from what the upstream sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum At {
    Gateway,
    DecisionEndpoint,
}

/// What to do about a request's method overrides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Overrides {
    /// It names none.
    None,
    /// Meter it as these methods too (empty when every override it carries is empty).
    Meter(Named),
    /// Remove every override header and parameter, then meter its own method.
    Strip,
    /// Refuse it (400).
    Refuse(Refusal),
}

impl MethodRules {
    /// Rules from names already validated by the configuration (`config::methods`). Lists
    /// longer than their bounds are cut to them.
    pub(crate) fn new(
        mode: OverrideMode,
        headers: &[impl AsRef<str>],
        params: &[impl AsRef<str>],
        allowed: &[impl AsRef<str>],
    ) -> Self {
        let mut hs: Vec<Box<str>> = Vec::new();
        for h in headers.iter().take(MAX_NAMES) {
            let h: String = h
                .as_ref()
                .trim()
                .bytes()
                .map(fold_header)
                .map(char::from)
                .collect();
            if !h.is_empty() && h.len() < 128 && !hs.iter().any(|x| **x == *h) {
                hs.push(h.into());
            }
        }
        let header_lengths = hs.iter().fold(0u128, |m, h| m | (1u128 << h.len()));
        let mut ps: Vec<Box<str>> = Vec::new();
        for p in params.iter().take(MAX_NAMES) {
            let p = param_name(p.as_ref().trim().as_bytes());
            if let Ok(p) = String::from_utf8(p) {
                if !p.is_empty() && !ps.iter().any(|x| **x == *p) {
                    ps.push(p.into());
                }
            }
        }
        let mut ms: Vec<Box<str>> = Vec::new();
        for m in allowed.iter().take(MAX_ALLOWED) {
            let m = m.as_ref().trim().to_ascii_uppercase();
            if !m.is_empty() && !ms.iter().any(|x| **x == *m) {
                ms.push(m.into());
            }
        }
        let allow = ms.iter().map(|m| &**m).collect::<Vec<_>>().join(", ");
        Self {
            mode,
            headers: hs.into(),
            header_lengths,
            params: ps.into(),
            allowed: ms.into(),
            allow: allow.into(),
        }
    }

    pub fn mode(&self) -> OverrideMode {
        self.mode
    }

    /// Whether a request of this method is forwarded. Methods are case-sensitive: `get` is not
    /// `GET`.
    pub fn allows(&self, method: &str) -> bool {
        self.allowed.iter().any(|m| **m == *method)
    }

    /// The methods forwarded, as an `Allow` header value (`GET, HEAD, POST`).
    pub fn allow(&self) -> &str {
        &self.allow
    }

    /// The allowed methods, upper-case, in configuration order.
    pub fn allowed(&self) -> impl Iterator<Item = &str> {
        self.allowed.iter().map(|m| &**m)
    }

    /// The override query parameters, as they are compared (lower-case).
    pub fn params(&self) -> impl Iterator<Item = &str> {
        self.params.iter().map(|p| &**p)
    }

    /// Whether a header of this (lower-case) name names a method override.
    pub fn is_override_header(&self, name: &str) -> bool {
        let n = name.len();
        if n >= 128 || self.header_lengths & (1u128 << n) == 0 {
            return false;
        }
        self.headers.iter().any(|h| {
            h.len() == n
                && h.bytes()
                    .zip(name.bytes())
                    .all(|(want, got)| want == fold_header(got))
        })
    }

    /// The configured parameter a raw query parameter name is read as, if any.
    fn param(&self, raw_name: &[u8]) -> Option<&str> {
        self.params
            .iter()
            .find(|p| normalised_param(raw_name).eq(p.bytes()))
            .map(|p| &**p)
    }

    /// What to do about the method overrides in these headers (lower-case names, every line)
    /// and this raw query (after `?`, without a fragment). A request naming none costs one
    /// length test per header and, with a query, one pass over it.
    pub fn judge<'h>(
        &self,
        headers: impl IntoIterator<Item = (&'h str, &'h [u8])>,
        query: Option<&str>,
        at: At,
    ) -> Overrides {
        let metering = self.mode == OverrideMode::Meter;
        let mut carried = false;
        let mut named = Named::default();
        let mut values = 0usize;
        for (name, value) in headers {
            if !self.is_override_header(name) {
                continue;
            }
            if !metering {
                return self.unmetered(Source::Header(name.into()), at);
            }
            carried = true;
            let source = || Source::Header(name.into());
            if let Err(r) = self.add_value(value, source, &mut named, &mut values) {
                return Overrides::Refuse(r);
            }
        }
        if let (Some(q), false) = (query, self.params.is_empty()) {
            for pair in q.split(['&', ';']) {
                let (raw_name, raw_value) = pair.split_once('=').unwrap_or((pair, ""));
                let Some(param) = self.param(raw_name.as_bytes()) else {
                    continue;
                };
                if !metering {
                    return self.unmetered(Source::Param(param.into()), at);
                }
                carried = true;
                let value: Vec<u8> = Decoded::new(raw_value.as_bytes()).collect();
                let source = || Source::Param(param.into());
                if let Err(r) = self.add_value(&value, source, &mut named, &mut values) {
                    return Overrides::Refuse(r);
                }
            }
        }
        if carried {
            Overrides::Meter(named)
        } else {
            Overrides::None
        }
    }

    /// A request that names an override (first in `source`) when the mode is not `meter`.
    fn unmetered(&self, source: Source, at: At) -> Overrides {
        match (self.mode, at) {
            (OverrideMode::Strip, At::Gateway) => Overrides::Strip,
            (OverrideMode::Strip, At::DecisionEndpoint) => {
                Overrides::Refuse(Refusal::Unstrippable(source))
            }
            _ => Overrides::Refuse(Refusal::Refused(source)),
        }
    }

    /// Read one override value: each comma-separated element, trimmed, must be a method in
    /// `allowed` (compared upper-cased).
    fn add_value(
        &self,
        value: &[u8],
        source: impl Fn() -> Source,
        named: &mut Named,
        values: &mut usize,
    ) -> Result<(), Refusal> {
        for element in value.split(|b| *b == b',') {
            let e = trim_ows(element);
            if e.is_empty() {
                continue;
            }
            *values += 1;
            if *values > MAX_OVERRIDE_VALUES {
                return Err(Refusal::TooMany);
            }
            if e.len() > MAX_METHOD_LEN || !e.iter().all(|b| is_tchar(*b)) {
                return Err(Refusal::NotAMethod(source()));
            }
            let found = self.allowed.iter().position(|m| {
                m.len() == e.len()
                    && m.bytes()
                        .zip(e.iter())
                        .all(|(want, got)| want == got.to_ascii_uppercase())
            });
            match found {
                Some(i) => named.0 |= 1 << i,
                None => {
                    let upper = String::from_utf8_lossy(e).to_ascii_uppercase();
                    return Err(Refusal::NotAllowed(source(), upper.into()));
                }
            }
            if named.len() > MAX_OVERRIDE_METHODS {
                return Err(Refusal::TooMany);
            }
        }
        Ok(())
    }

    /// The query without its override parameters, or `None` when it has none. The other
    /// parameters keep their bytes, their order and the separators before them.
    pub fn strip_query(&self, query: &str) -> Option<String> {
        if self.params.is_empty() {
            return None;
        }
        let mut out = String::with_capacity(query.len());
        let mut removed = false;
        let mut rest = query;
        let mut sep: Option<char> = None;
        loop {
            let (pair, next) = match rest.find(['&', ';']) {
                Some(i) => (&rest[..i], Some((rest[i..].chars().next(), &rest[i + 1..]))),
                None => (rest, None),
            };
            let name = pair.split_once('=').map_or(pair, |(n, _)| n);
            if self.param(name.as_bytes()).is_some() {
                removed = true;
            } else {
                if let (Some(s), false) = (sep, out.is_empty()) {
                    out.push(s);
                }
                out.push_str(pair);
            }
            match next {
                Some((s, tail)) => {
                    sep = s;
                    rest = tail;
                }
                None => break,
            }
        }
        removed.then_some(out)
    }
}

/// `value` without the spaces and tabs around it (HTTP's optional whitespace; any other
/// control character stays, and makes the value no method).
fn trim_ows(value: &[u8]) -> &[u8] {
    let ows = |b: &u8| *b == b' ' || *b == b'\t';
    let start = value.iter().position(|b| !ows(b)).unwrap_or(value.len());
    let end = value.iter().rposition(|b| !ows(b)).map_or(start, |i| i + 1);
    &value[start..end]
}

/// A header name byte as override header names are compared: lower-case, `_` as `-`.
fn fold_header(b: u8) -> u8 {
    match b {
        b'_' => b'-',
        b => b.to_ascii_lowercase(),
    }
}

/// RFC 9110 `tchar`: the characters of a method token.
pub fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Whether `s` is an HTTP method token.
pub fn is_token(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(is_tchar)
}

/// A query parameter name as override parameters are compared (see [`normalised_param`]).
pub fn param_name(raw: &[u8]) -> Vec<u8> {
    normalised_param(raw).collect()
}

/// A raw query parameter name read the most permissive way the frameworks read one: `+` a
/// space and `%XX` a byte (an escape that is not one stays as it is), leading spaces dropped
/// (PHP), ` ` and `.` as `_` (PHP), nothing from `[` or a NUL on (PHP arrays and C strings),
/// and lower-case, so that every spelling any of them reads as `_method` reads as `_method`.
fn normalised_param(raw: &[u8]) -> impl Iterator<Item = u8> + '_ {
    Decoded::new(raw)
        .skip_while(|b| *b == b' ')
        .take_while(|b| *b != b'[' && *b != 0)
        .map(|b| match b {
            b' ' | b'.' => b'_',
            b => b.to_ascii_lowercase(),
        })
}

/// The bytes of a query component with `+` read as a space and `%XX` as the byte it encodes.
struct Decoded<'a> {
    raw: &'a [u8],
    at: usize,
}

impl<'a> Decoded<'a> {
    fn new(raw: &'a [u8]) -> Self {
        Self { raw, at: 0 }
    }
}

impl Iterator for Decoded<'_> {
    type Item = u8;

    fn next(&mut self) -> Option<u8> {
        let b = *self.raw.get(self.at)?;
        self.at += 1;
        match b {
            b'+' => Some(b' '),
            b'%' => {
                let hex = |i: usize| self.raw.get(i).and_then(|c| (*c as char).to_digit(16));
                match (hex(self.at), hex(self.at + 1)) {
                    (Some(hi), Some(lo)) => {
                        self.at += 2;
                        Some((hi * 16 + lo) as u8)
                    }
                    _ => Some(b'%'),
                }
            }
            b => Some(b),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(mode: OverrideMode) -> MethodRules {
        MethodRules::new(
            mode,
            &DEFAULT_OVERRIDE_HEADERS,
            &DEFAULT_OVERRIDE_PARAMS,
            &DEFAULT_ALLOWED,
        )
    }

    /// `judge` at the gateway over `(name, value)` headers and a query.
    fn judge(r: &MethodRules, headers: &[(&str, &str)], query: Option<&str>) -> Overrides {
        r.judge(
            headers.iter().map(|(n, v)| (*n, v.as_bytes())),
            query,
            At::Gateway,
        )
    }

    /// The methods a request names, or the refusal's reason.
    fn metered(headers: &[(&str, &str)], query: Option<&str>) -> Result<Vec<String>, String> {
        let r = rules(OverrideMode::Meter);
        match judge(&r, headers, query) {
            Overrides::None => Ok(vec!["-".to_owned()]),
            Overrides::Meter(n) => Ok(n.methods(&r).iter().map(|m| m.to_string()).collect()),
            Overrides::Refuse(why) => Err(why.reason().as_str().to_owned()),
            Overrides::Strip => Err("strip".to_owned()),
        }
    }

    fn ok(methods: &[&str]) -> Result<Vec<String>, String> {
        Ok(methods.iter().map(|m| m.to_string()).collect())
    }

    fn refused(reason: RefusalReason) -> Result<Vec<String>, String> {
        Err(reason.as_str().to_owned())
    }

    #[test]
    fn header_spellings_are_read_as_every_framework_reads_them() {
        let h = "x-http-method-override";
        for (headers, want) in [
            (vec![], ok(&["-"])),
            (vec![("x-agent-id", "GET")], ok(&["-"])),
            (vec![(h, "GET")], ok(&["GET"])),
            (vec![(h, "get")], ok(&["GET"])),
            (vec![(h, "gEt")], ok(&["GET"])),
            (vec![(h, " GET\t")], ok(&["GET"])),
            // method-override takes the first element, ASP.NET Core the whole: meter both.
            (vec![(h, "GET, PUT")], ok(&["GET", "PUT"])),
            (vec![(h, "GET,,PUT,")], ok(&["GET", "PUT"])),
            // Two lines (Node joins them; Rack and ASP.NET Core read one or the other).
            (vec![(h, "PUT"), (h, "GET")], ok(&["GET", "PUT"])),
            (vec![(h, "GET"), (h, "GET")], ok(&["GET"])),
            // Every configured name, and the CGI spellings of each.
            (vec![("x-http-method", "DELETE")], ok(&["DELETE"])),
            (vec![("x-method-override", "PATCH")], ok(&["PATCH"])),
            (vec![("x_http_method_override", "GET")], ok(&["GET"])),
            (vec![("x-http_method-override", "GET")], ok(&["GET"])),
            (
                vec![("x-http-method", "PUT"), ("x-method-override", "GET")],
                ok(&["GET", "PUT"]),
            ),
            // Empty: carried, names nothing.
            (vec![(h, "")], ok(&[])),
            (vec![(h, " , ")], ok(&[])),
            // Not a method, not an allowed one, too many.
            (
                vec![(h, "G ET")],
                refused(RefusalReason::OverrideNotAMethod),
            ),
            (
                vec![(h, "GET;")],
                refused(RefusalReason::OverrideNotAMethod),
            ),
            (
                vec![(h, "G\u{c9}T")],
                refused(RefusalReason::OverrideNotAMethod),
            ),
            (
                vec![(h, "PROPFIND")],
                refused(RefusalReason::OverrideNotAllowed),
            ),
            (
                vec![(h, "connect")],
                refused(RefusalReason::OverrideNotAllowed),
            ),
            (
                vec![(h, "TRACE")],
                refused(RefusalReason::OverrideNotAllowed),
            ),
            (
                vec![(h, "GET, PROPFIND")],
                refused(RefusalReason::OverrideNotAllowed),
            ),
            (
                vec![(h, &"A".repeat(33))],
                refused(RefusalReason::OverrideNotAMethod),
            ),
            (
                vec![(h, "GET,PUT,POST,PATCH,DELETE")],
                refused(RefusalReason::OverrideTooMany),
            ),
        ] {
            assert_eq!(metered(&headers, None), want, "{headers:?}");
        }
        let flood: Vec<(&str, &str)> = (0..17).map(|_| (h, "GET")).collect();
        assert_eq!(
            metered(&flood, None),
            refused(RefusalReason::OverrideTooMany)
        );
        let sixteen: Vec<(&str, &str)> = (0..16).map(|_| (h, "GET")).collect();
        assert_eq!(metered(&sixteen, None), ok(&["GET"]));
    }

    #[test]
    fn query_spellings_are_read_as_every_framework_reads_them() {
        for (query, want) in [
            ("", ok(&["-"])),
            ("method=GET", ok(&["-"])),
            ("x_method=GET", ok(&["-"])),
            ("_methods=GET", ok(&["-"])),
            ("_method=GET", ok(&["GET"])),
            ("_method=get", ok(&["GET"])),
            ("a=1&_method=PUT", ok(&["PUT"])),
            ("a=1;_method=PUT", ok(&["PUT"])),
            // Express takes the first, PHP the last: meter both.
            ("_method=PUT&_method=GET", ok(&["GET", "PUT"])),
            // Percent-encoding and `+` in the name and the value (querystring, PHP, servlets).
            ("%5Fmethod=GET", ok(&["GET"])),
            ("%5fMETHOD=GET", ok(&["GET"])),
            ("_method=G%45T", ok(&["GET"])),
            ("_method=%47%45%54", ok(&["GET"])),
            ("_method=+GET+", ok(&["GET"])),
            ("_method=GET%2CPUT", ok(&["GET", "PUT"])),
            // Case of the name; PHP's ` `/`.` as `_`, leading spaces, arrays, NUL.
            ("_METHOD=GET", ok(&["GET"])),
            (".method=GET", ok(&["GET"])),
            ("%2Emethod=GET", ok(&["GET"])),
            ("+method=GET", ok(&["-"])),
            ("+_method=GET", ok(&["GET"])),
            ("++_method=GET", ok(&["GET"])),
            ("_method[]=GET", ok(&["GET"])),
            ("_method%00x=GET", ok(&["GET"])),
            // Carried but empty.
            ("_method", ok(&[])),
            ("_method=", ok(&[])),
            // Refused.
            ("_method=G%20ET", refused(RefusalReason::OverrideNotAMethod)),
            ("_method=GET%00", refused(RefusalReason::OverrideNotAMethod)),
            ("_method=%0AGET", refused(RefusalReason::OverrideNotAMethod)),
            // The Kelvin sign, which JavaScript lower-cases to `k`: not a token.
            (
                "_method=LOC%E2%84%AA",
                refused(RefusalReason::OverrideNotAMethod),
            ),
            ("_method=%FF", refused(RefusalReason::OverrideNotAMethod)),
            (
                "_method=CONNECT",
                refused(RefusalReason::OverrideNotAllowed),
            ),
            (
                "_method=PROPFIND",
                refused(RefusalReason::OverrideNotAllowed),
            ),
        ] {
            assert_eq!(metered(&[], Some(query)), want, "{query:?}");
        }
        let flood = "_method=GET&".repeat(17);
        assert_eq!(
            metered(&[], Some(&flood)),
            refused(RefusalReason::OverrideTooMany)
        );
        // Headers and parameters count together.
        assert_eq!(
            metered(&[("x-http-method-override", "PUT")], Some("_method=DELETE")),
            ok(&["PUT", "DELETE"])
        );
    }

    #[test]
    fn strip_and_refuse_need_only_presence() {
        let h = [("x-http-method-override", "NOT A METHOD")];
        let strip = rules(OverrideMode::Strip);
        assert_eq!(judge(&strip, &h, None), Overrides::Strip);
        assert_eq!(judge(&strip, &[], Some("_method=x y")), Overrides::Strip);
        assert_eq!(judge(&strip, &[], Some("a=1")), Overrides::None);
        assert_eq!(
            strip.judge(
                h.iter().map(|(n, v)| (*n, v.as_bytes())),
                None,
                At::DecisionEndpoint
            ),
            Overrides::Refuse(Refusal::Unstrippable(Source::Header(
                "x-http-method-override".into()
            )))
        );
        let refuse = rules(OverrideMode::Refuse);
        assert_eq!(
            judge(&refuse, &[], Some("a=1&%5Fmethod=")),
            Overrides::Refuse(Refusal::Refused(Source::Param("_method".into())))
        );
        assert_eq!(
            judge(&refuse, &[("x-agent-id", "a")], None),
            Overrides::None
        );
    }

    #[test]
    fn stripping_keeps_every_other_parameter_as_sent() {
        let r = rules(OverrideMode::Strip);
        for (query, want) in [
            ("a=1", None),
            ("", None),
            ("_method=GET", Some("")),
            ("a=1&_method=GET&b=%20", Some("a=1&b=%20")),
            ("_method=GET&a=1", Some("a=1")),
            ("a=1;%5Fmethod=GET;b=2", Some("a=1;b=2")),
            ("a=1&_method&_METHOD=x&.method=y", Some("a=1")),
            ("a=1&&b=2&_method=GET", Some("a=1&&b=2")),
        ] {
            assert_eq!(r.strip_query(query).as_deref(), want, "{query:?}");
        }
    }

    #[test]
    fn allowed_methods_are_case_sensitive_and_listed_for_allow() {
        let r = rules(OverrideMode::Meter);
        for m in DEFAULT_ALLOWED {
            assert!(r.allows(m), "{m}");
        }
        for m in ["CONNECT", "TRACE", "PROPFIND", "get", "Post", "FOO", ""] {
            assert!(!r.allows(m), "{m}");
        }
        assert_eq!(r.allow(), "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS");
    }

    #[test]
    fn names_are_normalised_once_when_built() {
        let r = MethodRules::new(
            OverrideMode::Meter,
            &["X_Verb", "x-verb"],
            &["Do.It"],
            &["get", "GET", "propfind"],
        );
        assert!(r.is_override_header("x-verb"));
        assert!(r.is_override_header("x_verb"));
        assert!(!r.is_override_header("x-http-method-override"));
        assert_eq!(r.allow(), "GET, PROPFIND");
        assert_eq!(
            metered_with(&r, &[], Some("do_it=propfind")),
            vec!["PROPFIND"]
        );
        let none = MethodRules::new(
            OverrideMode::Refuse,
            &[] as &[&str],
            &[] as &[&str],
            &["GET"],
        );
        assert_eq!(
            judge(
                &none,
                &[("x-http-method-override", "GET")],
                Some("_method=GET")
            ),
            Overrides::None
        );
    }

    fn metered_with(r: &MethodRules, h: &[(&str, &str)], q: Option<&str>) -> Vec<String> {
        match judge(r, h, q) {
            Overrides::Meter(n) => n.methods(r).iter().map(|m| m.to_string()).collect(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn refusals_say_where_and_why() {
        let r = rules(OverrideMode::Meter);
        let d = Refusal::NotAllowed(Source::Param("_method".into()), "PROPFIND".into()).detail(&r);
        assert_eq!(
            d,
            "The `_method` query parameter names `PROPFIND`, which this gateway does not forward (it forwards GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS)."
        );
        let d = Refusal::NotAMethod(Source::Header("x-http-method".into())).detail(&r);
        assert!(
            d.starts_with("The `x-http-method` header does not name"),
            "{d}"
        );
    }
}
