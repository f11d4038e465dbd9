//! A request judged against the rules: its override headers and query parameters read as the
//! most permissive framework would, each value named checked, and the query stripped of them.

use super::spelling::{fold_header, is_tchar, normalised_param, param_name, trim_ows, Decoded};
use super::{
    At, MethodRules, Named, OverrideMode, Overrides, Refusal, Source, MAX_ALLOWED, MAX_METHOD_LEN,
    MAX_NAMES, MAX_OVERRIDE_METHODS, MAX_OVERRIDE_VALUES,
};

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
