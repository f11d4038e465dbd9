//! The one path: the request target's path, made canonical once. Every limiter decides on the
//! canonical path, and the gateway forwards exactly that path to the upstream, so the path the
//! limiter metered is the path the upstream routes on, whatever the upstream's own parser does.
//!
//! Canonical form (RFC 3986 section 6.2.2, as Envoy's `normalize_path` + `merge_slashes`):
//! - percent-escapes of unreserved characters (`A-Z a-z 0-9 - . _ ~`) are decoded;
//! - every other escape is kept, its hex digits upper-cased; characters that may not stand
//!   literally in a path (space, `"`, `<`, `>`, `^`, `` ` ``, `{`, `|`, `}`, non-ASCII) are escaped;
//! - `.` and `..` segments are removed (`..` at the root stays at the root);
//! - runs of `/` become one `/`; a trailing `/` is kept.
//!
//! What cannot be made canonical without guessing how the next parser reads it is refused
//! before any limiter or upstream sees it, one [`Class`] at a time. Each class can be allowed
//! (for an API that really uses it): the request then passes with those bytes kept as sent, and
//! the limiter matches exactly the bytes that are forwarded.
//!
//! The decision endpoint cannot rewrite what the proxy in front forwards, so it takes only a
//! target that is its own canonical form ([`CanonicalPath::exact`]): every spelling the gateway
//! would have rewritten (a dot or empty segment, an escape written otherwise, a character that
//! must be escaped), a `#`, and a target that is not a path are refused there, each under a
//! class of its own.

use std::borrow::Cow;
use std::fmt;

/// A kind of spelling that parsers disagree on, refused unless allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    /// A `%` not followed by two hex digits (`%zz`, `%2`).
    InvalidEscape,
    /// Escaped (or raw) bytes that do not decode to UTF-8, overlong forms included (`%FF`,
    /// `%C0%AE`).
    InvalidUtf8,
    /// `%2F` or `%5C`: a slash inside a segment for one parser, a separator for another.
    EncodedSlash,
    /// A raw `\`: a separator for WHATWG URL parsers (Node's `new URL`), a character for others.
    Backslash,
    /// `;` or `%3B`: path parameters that Tomcat, Jetty and Spring strip before routing.
    Semicolon,
    /// NUL and other control characters, raw or escaped (`%00`, `%0A`, `%7F`).
    Control,
    /// A segment that ends in `.` or starts or ends with whitespace (`rotate-key.`,
    /// `rotate-key%20`): trimmed by some routers and file systems, kept by others.
    SegmentEdge,
    /// A `.` or `..` segment, escaped or not (`/x/../rotate-key`, `/%2e%2e/`): resolved by the
    /// gateway, served as sent by a router that resolves nothing. Refused by the decision
    /// endpoint only.
    DotSegment,
    /// An empty segment (`//x/…`, `/api//agent`): merged by the gateway, a host to WHATWG URL
    /// parsers, a segment of its own to others. Refused by the decision endpoint only.
    EmptySegment,
    /// A percent-escape that the canonical form writes otherwise: an escaped letter, digit or
    /// `-._~` (`%72otate-key`), or lower-case hex digits (`%c3%a9`). Refused by the decision
    /// endpoint only.
    EscapeSpelling,
    /// A character that must be escaped in a path, sent raw (non-ASCII, space, `"`, `<`, `>`,
    /// `^`, `` ` ``, `{`, `|`, `}`). Refused by the decision endpoint only.
    Unescaped,
    /// A `#`: a fragment, which a client never sends; one server forwards it, another strips
    /// it, a third escapes it. Refused by the decision endpoint only (the gateway's HTTP parser
    /// drops it).
    Fragment,
    /// A target that is not a path starting with `/` (absolute-form `http://host/…`, `*`, an
    /// empty one). Refused by the decision endpoint only (the gateway's HTTP parser reads the
    /// path out of an absolute-form target).
    NotOriginForm,
}

impl Class {
    /// Every class, in metrics order.
    pub const ALL: [Class; 13] = [
        Class::InvalidEscape,
        Class::InvalidUtf8,
        Class::EncodedSlash,
        Class::Backslash,
        Class::Semicolon,
        Class::Control,
        Class::SegmentEdge,
        Class::DotSegment,
        Class::EmptySegment,
        Class::EscapeSpelling,
        Class::Unescaped,
        Class::Fragment,
        Class::NotOriginForm,
    ];

    /// The classes the gateway refuses unless allowed, each a setting under `[path]`.
    pub const CONFIGURABLE: [Class; 7] = [
        Class::InvalidEscape,
        Class::InvalidUtf8,
        Class::EncodedSlash,
        Class::Backslash,
        Class::Semicolon,
        Class::Control,
        Class::SegmentEdge,
    ];

    /// Whether only the decision endpoint refuses this class (the gateway rewrites it, or its
    /// HTTP parser never passes it on); such a class has no setting and cannot be allowed.
    pub fn decision_only(self) -> bool {
        self.setting().is_none()
    }

    /// The class's name in metrics labels and problem bodies.
    pub fn as_str(self) -> &'static str {
        match self {
            Class::InvalidEscape => "invalid-escape",
            Class::InvalidUtf8 => "invalid-utf8",
            Class::EncodedSlash => "encoded-slash",
            Class::Backslash => "backslash",
            Class::Semicolon => "semicolon",
            Class::Control => "control",
            Class::SegmentEdge => "segment-edge",
            Class::DotSegment => "dot-segment",
            Class::EmptySegment => "empty-segment",
            Class::EscapeSpelling => "escape-spelling",
            Class::Unescaped => "unescaped",
            Class::Fragment => "fragment",
            Class::NotOriginForm => "not-origin-form",
        }
    }

    /// The class's setting under `[path]`; `None` for the classes only the decision endpoint
    /// refuses.
    pub fn setting(self) -> Option<&'static str> {
        Some(match self {
            Class::InvalidEscape => "invalid_escape",
            Class::InvalidUtf8 => "invalid_utf8",
            Class::EncodedSlash => "encoded_slash",
            Class::Backslash => "backslash",
            Class::Semicolon => "semicolon",
            Class::Control => "control",
            Class::SegmentEdge => "segment_edge",
            Class::DotSegment
            | Class::EmptySegment
            | Class::EscapeSpelling
            | Class::Unescaped
            | Class::Fragment
            | Class::NotOriginForm => return None,
        })
    }

    /// What a client is told.
    pub fn describe(self) -> &'static str {
        match self {
            Class::InvalidEscape => "a `%` that is not followed by two hex digits",
            Class::InvalidUtf8 => "percent-escapes that do not decode to UTF-8",
            Class::EncodedSlash => "an encoded slash or backslash (`%2F`, `%5C`)",
            Class::Backslash => "a backslash",
            Class::Semicolon => "a semicolon (`;` or `%3B`)",
            Class::Control => "a NUL or control character",
            Class::SegmentEdge => "a segment that ends in `.` or starts or ends with whitespace",
            Class::DotSegment => "a `.` or `..` segment (escaped or not)",
            Class::EmptySegment => "an empty segment (`//`)",
            Class::EscapeSpelling => {
                "a percent-escape written otherwise in canonical form (an escaped letter, digit or `-._~`, or lower-case hex digits)"
            }
            Class::Unescaped => {
                "a character that must be percent-escaped in a path (non-ASCII, space, `\"`, `<`, `>`, `^`, `` ` ``, `{`, `|`, `}`)"
            }
            Class::Fragment => "a `#` (a fragment)",
            Class::NotOriginForm => {
                "a target that is not a path starting with `/` (absolute-form `http://host/...`, `*`)"
            }
        }
    }

    fn bit(self) -> u16 {
        1 << (self as u16)
    }
}

impl fmt::Display for Class {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which classes pass instead of being refused. The default refuses all of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PathRules {
    allowed: u16,
}

impl PathRules {
    /// Refuse every class (the default).
    pub const STRICT: PathRules = PathRules { allowed: 0 };

    /// Allow `class` as well. A class only the decision endpoint refuses cannot be allowed:
    /// the rules stay as they are.
    pub fn allowing(mut self, class: Class) -> Self {
        if !class.decision_only() {
            self.allowed |= class.bit();
        }
        self
    }

    pub fn allows(self, class: Class) -> bool {
        self.allowed & class.bit() != 0
    }

    /// The allowed classes, in [`Class::CONFIGURABLE`] order.
    pub fn allowed(self) -> impl Iterator<Item = Class> {
        Class::CONFIGURABLE
            .into_iter()
            .filter(move |c| self.allows(*c))
    }
}

/// A path refused: which class, and where in the path as sent (a byte offset).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rejected {
    pub class: Class,
    pub at: usize,
}

impl fmt::Display for Rejected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the path contains {} (at byte {})",
            self.class.describe(),
            self.at
        )
    }
}

/// A path in canonical form. The only way to get one is [`CanonicalPath::parse`] (or
/// [`CanonicalPath::of_static`] for paths written in code), so a limiter can never be handed a
/// path that some other parser would read differently.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CanonicalPath<'a>(Cow<'a, str>);

impl<'a> CanonicalPath<'a> {
    /// The canonical form of `path` (the path of a request target, without its query), or why
    /// there is none under `rules`. Borrows `path` when it is already canonical (most requests).
    pub fn parse(path: &'a str, rules: PathRules) -> Result<Self, Rejected> {
        if is_canonical(path.as_bytes()) {
            return Ok(CanonicalPath(Cow::Borrowed(path)));
        }
        let canonical = canonicalize(path.as_bytes(), rules, &mut Rewrites::default())?;
        Ok(CanonicalPath(if canonical == path {
            Cow::Borrowed(path)
        } else {
            Cow::Owned(canonical)
        }))
    }

    /// `path` when it is its own canonical form under `rules`; otherwise why not: the class
    /// [`CanonicalPath::parse`] refuses, or the first spelling it would have rewritten
    /// ([`Class::DotSegment`], [`Class::EmptySegment`], [`Class::EscapeSpelling`],
    /// [`Class::Unescaped`], a raw `#` as [`Class::Fragment`], an allowed class whose bytes are
    /// rewritten under its own class), or [`Class::NotOriginForm`] when it does not start with
    /// `/`. For the decision endpoint, which meters a path it cannot rewrite before the proxy
    /// forwards it: what it takes is exactly what the upstream gets.
    pub fn exact(path: &'a str, rules: PathRules) -> Result<Self, Rejected> {
        let b = path.as_bytes();
        if b.first() != Some(&b'/') {
            return Err(Rejected {
                class: Class::NotOriginForm,
                at: 0,
            });
        }
        if is_canonical(b) {
            return Ok(CanonicalPath(Cow::Borrowed(path)));
        }
        let mut rewrites = Rewrites::default();
        let canonical = canonicalize(b, rules, &mut rewrites)?;
        match rewrites.first {
            Some(r) => Err(r),
            None if canonical == path => Ok(CanonicalPath(Cow::Borrowed(path))),
            // Every rewrite is noted (a property test holds it); were one missed, the path
            // would still be refused, at the first byte that differs.
            None => Err(Rejected {
                class: Class::Unescaped,
                at: b
                    .iter()
                    .zip(canonical.as_bytes())
                    .position(|(x, y)| x != y)
                    .unwrap_or(b.len().min(canonical.len())),
            }),
        }
    }

    /// A path [`CanonicalPath::parse`] has already returned (a request's path after the
    /// middleware rewrote it to its canonical form).
    pub(crate) fn checked(path: &'a str) -> Self {
        CanonicalPath(Cow::Borrowed(path))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether the canonical form differs from the path as sent.
    pub fn is_rewritten(&self) -> bool {
        matches!(self.0, Cow::Owned(_))
    }

    pub fn into_owned(self) -> CanonicalPath<'static> {
        CanonicalPath(Cow::Owned(self.0.into_owned()))
    }
}

impl CanonicalPath<'static> {
    /// A path written in code (a simulated request, a declared workload), made canonical under
    /// the strict rules; a path that would be refused is kept as written, and matches no route
    /// that a canonical request could not also match.
    pub fn of_static(path: &'static str) -> Self {
        match Self::parse(path, PathRules::STRICT) {
            Ok(p) => p,
            Err(_) => CanonicalPath(Cow::Borrowed(path)),
        }
    }
}

impl fmt::Display for CanonicalPath<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

const fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// Characters that stand for themselves in a canonical segment, sent raw: unreserved, the
/// sub-delimiters but `;`, `:` and `@` (RFC 3986 `pchar`).
#[inline]
fn is_literal(b: u8) -> bool {
    LITERAL[b as usize]
}

/// [`is_literal`] for every byte, made at compile time: one load per byte of every path.
static LITERAL: [bool; 256] = {
    let mut t = [false; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = literal_by_definition(i as u8);
        i += 1;
    }
    t
};

/// The definition [`LITERAL`] tabulates.
const fn literal_by_definition(b: u8) -> bool {
    is_unreserved(b)
        || matches!(
            b,
            b'!' | b'$' | b'&' | b'\'' | b'(' | b')' | b'*' | b'+' | b',' | b'=' | b':' | b'@'
        )
}

/// Whether [`canonicalize`] would return `path` unchanged; one pass over the bytes, since this
/// runs on every request. Conservative: `false` only sends a path to the full parser.
fn is_canonical(b: &[u8]) -> bool {
    if b.first() != Some(&b'/') {
        return false;
    }
    let mut seg_start = 1;
    for i in 1..=b.len() {
        match b.get(i) {
            Some(b'/') | None => {
                let seg = &b[seg_start..i];
                let last = i == b.len();
                if (seg.is_empty() && !last) || seg.last() == Some(&b'.') {
                    // Empty inside (`//`), `.`, `..`, or a trailing dot.
                    return false;
                }
                seg_start = i + 1;
            }
            Some(&c) if is_literal(c) => {}
            Some(_) => return false,
        }
    }
    true
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

fn push_escaped(out: &mut String, b: u8) {
    out.push('%');
    out.push(HEX[usize::from(b >> 4)] as char);
    out.push(HEX[usize::from(b & 15)] as char);
}

/// The first spelling the canonical form rewrites, by position in the path as sent: what
/// [`CanonicalPath::exact`] refuses.
#[derive(Default)]
struct Rewrites {
    first: Option<Rejected>,
}

impl Rewrites {
    /// A rewrite of the bytes at `at`.
    fn note(&mut self, class: Class, at: usize) {
        if self.first.is_none_or(|f| at < f.at) {
            self.first = Some(Rejected { class, at });
        }
    }

    /// A whole segment starting at `at` is rewritten (a dot or empty segment): it names the
    /// rewrite rather than any escape inside it.
    fn note_segment(&mut self, class: Class, at: usize) {
        if self.first.is_none_or(|f| at <= f.at) {
            self.first = Some(Rejected { class, at });
        }
    }

    /// An escape kept escaped: rewritten only when its hex digits are not upper case. `u` is a
    /// unit of the segment `seg`, which starts at `start` in the path.
    fn note_hex_case(&mut self, seg: &[u8], u: Unit, start: usize) {
        let digits = seg.get(u.at + 1..u.at + 3).unwrap_or_default();
        if u.escaped && digits.iter().any(u8::is_ascii_lowercase) {
            self.note(Class::EscapeSpelling, start + u.at);
        }
    }
}

/// One byte of the path as sent: its value, whether it came escaped, where it started and how
/// many bytes of the path it took.
#[derive(Clone, Copy)]
struct Unit {
    byte: u8,
    escaped: bool,
    at: usize,
    len: usize,
}

/// The next unit at `i`, or the invalid escape there.
fn unit_at(b: &[u8], i: usize) -> Result<Unit, Rejected> {
    if b[i] == b'%' {
        let hi = b.get(i + 1).copied().and_then(hex_value);
        let lo = b.get(i + 2).copied().and_then(hex_value);
        return match (hi, lo) {
            (Some(h), Some(l)) => Ok(Unit {
                byte: h << 4 | l,
                escaped: true,
                at: i,
                len: 3,
            }),
            _ => Err(Rejected {
                class: Class::InvalidEscape,
                at: i,
            }),
        };
    }
    Ok(Unit {
        byte: b[i],
        escaped: false,
        at: i,
        len: 1,
    })
}

/// One segment in canonical form, with the first and last characters it decodes to.
struct Segment {
    text: String,
    first: Option<char>,
    last: Option<char>,
}

fn canonical_segment(
    b: &[u8],
    start: usize,
    rules: PathRules,
    rw: &mut Rewrites,
) -> Result<Segment, Rejected> {
    let mut seg = Segment {
        text: String::with_capacity(b.len()),
        first: None,
        last: None,
    };
    fn note(seg: &mut Segment, c: char) {
        if seg.first.is_none() {
            seg.first = Some(c);
        }
        seg.last = Some(c);
    }
    let refuse = |class: Class, at: usize| Rejected {
        class,
        at: start + at,
    };
    let mut i = 0;
    while i < b.len() {
        let u = match unit_at(b, i) {
            Ok(u) => u,
            Err(_) if rules.allows(Class::InvalidEscape) => {
                // The lone `%` itself becomes data.
                rw.note(Class::InvalidEscape, start + i);
                seg.text.push_str("%25");
                note(&mut seg, '%');
                i += 1;
                continue;
            }
            Err(r) => return Err(refuse(r.class, r.at)),
        };
        if u.byte >= 0x80 {
            // A run of non-ASCII bytes, raw or escaped: valid UTF-8 on its own or not at all
            // (every byte of a multi-byte sequence is >= 0x80).
            let mut run: Vec<u8> = Vec::with_capacity(8);
            let mut units: Vec<Unit> = Vec::with_capacity(8);
            let mut j = i;
            while j < b.len() {
                match unit_at(b, j) {
                    Ok(v) if v.byte >= 0x80 => {
                        run.push(v.byte);
                        units.push(v);
                        j += v.len;
                    }
                    _ => break,
                }
            }
            let raw = match std::str::from_utf8(&run) {
                Ok(s) => {
                    for c in s.chars() {
                        note(&mut seg, c);
                    }
                    Class::Unescaped
                }
                Err(_) if rules.allows(Class::InvalidUtf8) => {
                    note(&mut seg, char::REPLACEMENT_CHARACTER);
                    Class::InvalidUtf8
                }
                Err(_) => return Err(refuse(Class::InvalidUtf8, u.at)),
            };
            for v in units {
                if v.escaped {
                    rw.note_hex_case(b, v, start);
                } else {
                    rw.note(raw, start + v.at);
                }
            }
            for byte in run {
                push_escaped(&mut seg.text, byte);
            }
            i = j;
            continue;
        }
        let c = u.byte;
        match c {
            _ if is_unreserved(c) => {
                if u.escaped {
                    rw.note(Class::EscapeSpelling, start + u.at);
                }
                seg.text.push(c as char)
            }
            b'/' => {
                if !rules.allows(Class::EncodedSlash) {
                    return Err(refuse(Class::EncodedSlash, u.at));
                }
                rw.note_hex_case(b, u, start);
                push_escaped(&mut seg.text, c);
            }
            b'\\' if u.escaped => {
                if !rules.allows(Class::EncodedSlash) {
                    return Err(refuse(Class::EncodedSlash, u.at));
                }
                rw.note_hex_case(b, u, start);
                push_escaped(&mut seg.text, c);
            }
            b'\\' => {
                if !rules.allows(Class::Backslash) {
                    return Err(refuse(Class::Backslash, u.at));
                }
                // Kept as sent: the limiter matches the bytes the upstream gets.
                seg.text.push('\\');
            }
            b';' => {
                if !rules.allows(Class::Semicolon) {
                    return Err(refuse(Class::Semicolon, u.at));
                }
                if u.escaped {
                    rw.note_hex_case(b, u, start);
                    push_escaped(&mut seg.text, c);
                } else {
                    seg.text.push(';');
                }
            }
            0x00..=0x1f | 0x7f => {
                if !rules.allows(Class::Control) {
                    return Err(refuse(Class::Control, u.at));
                }
                if u.escaped {
                    rw.note_hex_case(b, u, start);
                } else {
                    rw.note(Class::Control, start + u.at);
                }
                push_escaped(&mut seg.text, c);
            }
            _ if is_literal(c) && !u.escaped => seg.text.push(c as char),
            _ => {
                if u.escaped {
                    rw.note_hex_case(b, u, start);
                } else if c == b'#' {
                    rw.note(Class::Fragment, start + u.at);
                } else {
                    rw.note(Class::Unescaped, start + u.at);
                }
                push_escaped(&mut seg.text, c)
            }
        }
        note(&mut seg, c as char);
        i += u.len;
    }
    Ok(seg)
}

/// The full parse, for paths [`is_canonical`] did not pass; the spellings it rewrites are
/// noted in `rw`.
fn canonicalize(b: &[u8], rules: PathRules, rw: &mut Rewrites) -> Result<String, Rejected> {
    if b.is_empty() {
        rw.note(Class::NotOriginForm, 0);
        return Ok("/".to_owned());
    }
    if b.first() != Some(&b'/') {
        // `*` (OPTIONS) or an empty path: not a resource path; nothing to resolve. The gateway
        // refuses such targets itself; a limiter route (which starts with `/`) never matches.
        return match std::str::from_utf8(b) {
            Ok(s) => Ok(s.to_owned()),
            Err(e) => Err(Rejected {
                class: Class::InvalidUtf8,
                at: e.valid_up_to(),
            }),
        };
    }
    let mut out = String::with_capacity(b.len());
    let mut trailing = false;
    let mut start = 1;
    for raw in b[1..].split(|c| *c == b'/') {
        let seg_at = start;
        let seg = canonical_segment(raw, start, rules, rw)?;
        start += raw.len() + 1;
        match seg.text.as_str() {
            "" => {
                // Only a trailing `/` is kept as sent.
                if start <= b.len() {
                    rw.note_segment(Class::EmptySegment, seg_at);
                }
                trailing = true;
            }
            "." => {
                rw.note_segment(Class::DotSegment, seg_at);
                trailing = true;
            }
            ".." => {
                rw.note_segment(Class::DotSegment, seg_at);
                let cut = out.rfind('/').unwrap_or(0);
                out.truncate(cut);
                trailing = true;
            }
            text => {
                let edge = seg.last == Some('.')
                    || seg.first.is_some_and(char::is_whitespace)
                    || seg.last.is_some_and(char::is_whitespace);
                if edge && !rules.allows(Class::SegmentEdge) {
                    return Err(Rejected {
                        class: Class::SegmentEdge,
                        at: start - 1 - raw.len(),
                    });
                }
                out.push('/');
                out.push_str(text);
                trailing = false;
            }
        }
    }
    if out.is_empty() || trailing {
        out.push('/');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(p: &str) -> Result<String, Class> {
        CanonicalPath::parse(p, PathRules::STRICT)
            .map(|c| c.as_str().to_owned())
            .map_err(|r| r.class)
    }

    fn all_allowed() -> PathRules {
        Class::ALL
            .into_iter()
            .fold(PathRules::STRICT, PathRules::allowing)
    }

    #[test]
    fn the_literal_table_is_the_definition() {
        for b in 0..=255u8 {
            assert_eq!(is_literal(b), literal_by_definition(b), "byte {b}");
        }
        assert!(is_literal(b'a') && is_literal(b'@') && is_literal(b'~'));
        assert!(!is_literal(b'/') && !is_literal(b';') && !is_literal(b'%') && !is_literal(0x80));
    }

    #[test]
    fn ordinary_paths_are_already_canonical_and_borrowed() {
        for p in [
            "/",
            "/api/agent/heartbeat",
            "/api/agent/heartbeat/",
            "/API/Agent/Enroll",
            "/a.b/c..d/.hidden",
            "/v1/items/abc-123_x~y",
            "/x/a:b@c!$&'()*+,=",
        ] {
            let c = CanonicalPath::parse(p, PathRules::STRICT).unwrap();
            assert_eq!(c.as_str(), p);
            assert!(!c.is_rewritten(), "{p}");
        }
    }

    #[test]
    fn spellings_resolve_to_one_path() {
        for (sent, canonical) in [
            ("/api/agent/%72otate-key", "/api/agent/rotate-key"),
            (
                "/api/agent/%2e%2e/agent/rotate-key",
                "/api/agent/rotate-key",
            ),
            ("/api/agent/.%2E/agent/rotate-key", "/api/agent/rotate-key"),
            ("/api/x/../agent/rotate-key", "/api/agent/rotate-key"),
            ("/api//agent///rotate-key", "/api/agent/rotate-key"),
            ("//x/api/agent/rotate-key", "/x/api/agent/rotate-key"),
            ("/api/./agent/./rotate-key", "/api/agent/rotate-key"),
            ("/../../api/tasks", "/api/tasks"),
            ("/api/tasks/..", "/api/"),
            ("/api/tasks/.", "/api/tasks/"),
            ("/api/tasks//", "/api/tasks/"),
            ("", "/"),
            ("//", "/"),
            ("/%41pi", "/Api"),
            ("/a%2a", "/a%2A"),
            ("/a%3f", "/a%3F"),
            ("/a%25", "/a%25"),
            ("/a%252e%252e", "/a%252e%252e"),
            ("/caf\u{e9}", "/caf%C3%A9"),
            ("/caf%c3%a9", "/caf%C3%A9"),
            ("/a%20b", "/a%20b"),
            ("/a%21", "/a%21"),
            ("/a!", "/a!"),
            ("/a|b", "/a%7Cb"),
        ] {
            assert_eq!(canon(sent).as_deref(), Ok(canonical), "{sent:?}");
        }
    }

    #[test]
    fn ambiguous_spellings_are_refused_by_class() {
        for (sent, class) in [
            ("/api/agent/%FF/%2e%2e/rotate-key", Class::InvalidUtf8),
            ("/%FF/%2e%2e/api/tasks", Class::InvalidUtf8),
            ("/api/agent/%c0%ae%c0%ae/rotate-key", Class::InvalidUtf8),
            ("/api/%e2%82", Class::InvalidUtf8),
            ("/api/%zz", Class::InvalidEscape),
            ("/api/%2", Class::InvalidEscape),
            ("/api/%", Class::InvalidEscape),
            ("/api%2fagent/rotate-key", Class::EncodedSlash),
            ("/api%5Cagent/rotate-key", Class::EncodedSlash),
            ("/api\\agent\\rotate-key", Class::Backslash),
            ("/api/agent/rotate-key;x=1", Class::Semicolon),
            ("/api/agent/rotate-key%3B", Class::Semicolon),
            ("/api/cli/auth/refresh;x", Class::Semicolon),
            ("/api/agent/rotate-key%00", Class::Control),
            ("/api/agent/rotate-key%0a", Class::Control),
            ("/api/agent/rotate-key%7F", Class::Control),
            ("/api/agent/rotate-key.", Class::SegmentEdge),
            ("/api/agent/rotate-key%2e", Class::SegmentEdge),
            ("/api/agent/rotate-key%20", Class::SegmentEdge),
            ("/api/agent/%20rotate-key", Class::SegmentEdge),
            ("/api/agent/rotate-key%C2%A0", Class::SegmentEdge),
            ("/api/agent/.../rotate-key", Class::SegmentEdge),
        ] {
            assert_eq!(canon(sent), Err(class), "{sent:?}");
        }
    }

    #[test]
    fn the_offset_points_at_the_culprit() {
        let r = CanonicalPath::parse("/api/x%2Fy", PathRules::STRICT).unwrap_err();
        assert_eq!(r.at, 6);
        let r = CanonicalPath::parse("/api/agent/rotate-key.", PathRules::STRICT).unwrap_err();
        assert_eq!(r.at, 11);
    }

    #[test]
    fn allowed_classes_keep_the_bytes_as_sent_and_still_resolve_dots() {
        let all = all_allowed();
        let c = |p: &str| CanonicalPath::parse(p, all).unwrap().as_str().to_owned();
        // The escape that was refused stays; the dot segments next to it are still resolved.
        assert_eq!(
            c("/api/agent/%FF/%2e%2e/rotate-key"),
            "/api/agent/rotate-key"
        );
        assert_eq!(c("/api/%ff/x"), "/api/%FF/x");
        assert_eq!(c("/a%2fb"), "/a%2Fb");
        assert_eq!(c("/a\\b"), "/a\\b");
        assert_eq!(c("/a;b"), "/a;b");
        assert_eq!(c("/a%3bb"), "/a%3Bb");
        assert_eq!(c("/a%00"), "/a%00");
        assert_eq!(c("/a%zz"), "/a%25zz");
        assert_eq!(c("/a."), "/a.");
        // Each class alone allows only itself.
        let only_semicolon = PathRules::STRICT.allowing(Class::Semicolon);
        assert!(CanonicalPath::parse("/a;b", only_semicolon).is_ok());
        assert_eq!(
            CanonicalPath::parse("/a%2Fb;c", only_semicolon)
                .unwrap_err()
                .class,
            Class::EncodedSlash
        );
    }

    #[test]
    fn canonical_paths_are_fixed_points() {
        let samples = [
            "/api/agent/%FF/%2e%2e/rotate-key",
            "/a%zz/%2F/\\/;/%00/x./%C0%AE/caf\u{e9}/%7e/..",
            "//x/../y/./%2e%2E/z/",
        ];
        for rules in [PathRules::STRICT, all_allowed()] {
            for s in samples {
                if let Ok(once) = CanonicalPath::parse(s, rules) {
                    let twice = CanonicalPath::parse(once.as_str(), rules).unwrap();
                    assert_eq!(once.as_str(), twice.as_str());
                    assert!(!twice.is_rewritten(), "{s:?} -> {once}");
                }
            }
        }
    }

    #[test]
    fn non_paths_pass_unchanged() {
        assert_eq!(canon("*").as_deref(), Ok("*"));
    }

    fn exact(p: &str, rules: PathRules) -> Result<String, (Class, usize)> {
        CanonicalPath::exact(p, rules)
            .map(|c| c.as_str().to_owned())
            .map_err(|r| (r.class, r.at))
    }

    #[test]
    fn exact_takes_a_canonical_path_as_it_is() {
        for p in [
            "/",
            "/api/agent/rotate-key",
            "/api/agent/rotate-key/",
            "/API/Agent/Enroll",
            "/a.b/c..d/.hidden",
            "/x/a:b@c!$&'()*+,=",
            "/caf%C3%A9",
            "/a%2A%21%3F%23%25",
            "/a%20b",
        ] {
            let c = CanonicalPath::exact(p, PathRules::STRICT).unwrap();
            assert_eq!(c.as_str(), p);
            assert!(!c.is_rewritten(), "{p}");
        }
    }

    #[test]
    fn exact_refuses_every_spelling_the_gateway_would_rewrite_naming_it() {
        use Class::*;
        for (sent, class, at) in [
            // The issue's own examples.
            ("//x/api/agent/rotate-key", EmptySegment, 1),
            ("/api/agent/download/../../cron", DotSegment, 20),
            ("/api//agent", EmptySegment, 5),
            ("/api/tasks//", EmptySegment, 11),
            ("//", EmptySegment, 1),
            ("/api/./tasks", DotSegment, 5),
            ("/api/tasks/.", DotSegment, 11),
            ("/api/tasks/..", DotSegment, 11),
            ("/..", DotSegment, 1),
            // An escaped dot segment is a dot segment, not an escape.
            ("/api/%2e%2e/agent", DotSegment, 5),
            ("/api/.%2E/agent", DotSegment, 5),
            ("/api/agent/%72otate-key", EscapeSpelling, 11),
            ("/api/agent/rotate%2Dkey", EscapeSpelling, 17),
            ("/%41pi", EscapeSpelling, 1),
            ("/a%2a", EscapeSpelling, 2),
            ("/caf%c3%a9", EscapeSpelling, 4),
            ("/caf%C3%a9", EscapeSpelling, 7),
            ("/a%3f", EscapeSpelling, 2),
            ("/caf\u{e9}", Unescaped, 4),
            ("/a|b", Unescaped, 2),
            ("/a b", Unescaped, 2),
            ("/a\"b", Unescaped, 2),
            ("/a{b}", Unescaped, 2),
            ("/a#b", Fragment, 2),
            ("/a/b#/../c", Fragment, 4),
            ("http://x/api/agent/rotate-key", NotOriginForm, 0),
            ("*", NotOriginForm, 0),
            ("", NotOriginForm, 0),
            ("api/agent", NotOriginForm, 0),
            // The first rewrite is named.
            ("/api/%72/../x", EscapeSpelling, 5),
            ("/a/../%72", DotSegment, 3),
        ] {
            assert_eq!(exact(sent, PathRules::STRICT), Err((class, at)), "{sent:?}");
            assert!(class.decision_only(), "{class}");
        }
    }

    #[test]
    fn exact_refuses_what_parse_refuses_by_the_same_class() {
        for sent in [
            "/api/agent/%FF/%2e%2e/rotate-key",
            "/api/%zz",
            "/api%2fagent",
            "/api\\agent",
            "/api/agent/rotate-key;x=1",
            "/api/agent/rotate-key%00",
            "/api/agent/rotate-key.",
            "/api/./agent/rotate-key%3B",
        ] {
            let parsed = CanonicalPath::parse(sent, PathRules::STRICT).unwrap_err();
            let exact = CanonicalPath::exact(sent, PathRules::STRICT).unwrap_err();
            assert_eq!(parsed, exact, "{sent:?}");
        }
    }

    #[test]
    fn an_allowed_class_passes_exact_only_when_its_bytes_are_kept() {
        let all = all_allowed();
        // Kept as sent by the gateway: taken as they are.
        for p in ["/a\\b", "/a;b", "/a%3Bb", "/a%2Fb", "/a%00", "/a.", "/a%FF"] {
            assert_eq!(exact(p, all).as_deref(), Ok(p), "{p:?}");
        }
        // Rewritten by the gateway: refused under the class that was allowed.
        assert_eq!(exact("/a%zz", all), Err((Class::InvalidEscape, 2)));
        assert_eq!(exact("/a%2fb", all), Err((Class::EscapeSpelling, 2)));
        assert_eq!(exact("/a\u{1}b", all), Err((Class::Control, 2)));
        // The decision-only classes cannot be allowed.
        for class in Class::ALL.into_iter().filter(|c| c.decision_only()) {
            assert!(!PathRules::STRICT.allowing(class).allows(class), "{class}");
            assert_eq!(class.setting(), None);
        }
        assert_eq!(exact("/a/./b", all), Err((Class::DotSegment, 3)));
    }

    #[test]
    fn every_class_has_a_distinct_name_and_the_configurable_ones_a_setting() {
        let names: std::collections::BTreeSet<&str> =
            Class::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(names.len(), Class::ALL.len());
        for class in Class::CONFIGURABLE {
            assert!(
                class.setting().is_some() && !class.decision_only(),
                "{class}"
            );
        }
        assert_eq!(
            Class::ALL.iter().filter(|c| !c.decision_only()).count(),
            Class::CONFIGURABLE.len()
        );
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use crate::identity::Credential;
    use crate::policy::Policy;
    use proptest::prelude::*;

    fn all_allowed() -> PathRules {
        Class::ALL
            .into_iter()
            .fold(PathRules::STRICT, PathRules::allowing)
    }

    /// Paths made of the characters that matter to a path parser, and anything else.
    fn hostile_path() -> impl Strategy<Value = String> {
        prop_oneof![
            "/[/.%a-fA-F0-9;\\\\ \\x00-\\x1f\\x7f~!:@+*?éＡ\u{a0}-]{0,40}",
            "(/(\\.|\\.\\.|%2[eE]|%2[eE]%2[eE]|%2[fF]|%5[cC]|%[cC]0%[aA][eE]|%[fF][fF]|api|agent|rotate-key|[A-Z]+|%7[2A]|;x|%3[bB]|%00|%20)){0,8}/?",
            any::<String>(),
        ]
    }

    /// A route a limiter names, and the segments of a request to it.
    const ROUTES: &[(&str, &[&str])] = &[
        ("POST", &["api", "agent", "rotate-key"]),
        ("POST", &["api", "agent", "enroll"]),
        ("GET", &["api", "agent", "download", "linux"]),
        ("POST", &["api", "agent", "heartbeat"]),
        ("POST", &["api", "cli", "auth", "refresh"]),
        ("POST", &["api", "cli", "auth", "device", "code"]),
        ("GET", &["api", "tasks"]),
        ("GET", &["api", "cron", "sweep"]),
        ("GET", &["healthz"]),
    ];

    /// One way to spell a segment: each unreserved character sent as itself or escaped, in
    /// either hex case.
    fn respell_segment(seg: &str, picks: &[u8]) -> String {
        let mut out = String::new();
        for (i, c) in seg.chars().enumerate() {
            match picks.get(i).copied().unwrap_or(0) % 4 {
                0 | 1 => out.push(c),
                2 => out.push_str(&format!("%{:02X}", c as u32)),
                _ => out.push_str(&format!("%{:02x}", c as u32)),
            }
        }
        out
    }

    /// One way to spell a whole path: respelled segments, with `//`, `./` and `x/../` detours
    /// and a trailing slash here and there.
    fn respell(segs: &[&str], picks: &[u8]) -> String {
        let mut out = String::new();
        let pick = |i: usize| picks.get(i).copied().unwrap_or(0);
        for (i, seg) in segs.iter().enumerate() {
            match pick(i) % 5 {
                1 => out.push_str("//"),
                2 => out.push_str("/./"),
                3 => out.push_str("/zz/%2e%2E/"),
                4 => out.push_str("/zz/.%2e/./"),
                _ => out.push('/'),
            }
            let from = (i * 7) % picks.len().max(1);
            out.push_str(&respell_segment(seg, &picks[from..]));
        }
        if pick(segs.len()) % 3 == 0 {
            out.push('/');
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]

        /// The canonical form of a canonical form is itself, and the one-pass check never
        /// passes a path that the full parse would change.
        #[test]
        fn canonical_form_is_idempotent(path in hostile_path()) {
            for rules in [PathRules::STRICT, all_allowed()] {
                if let Ok(once) = CanonicalPath::parse(&path, rules) {
                    let twice = CanonicalPath::parse(once.as_str(), rules);
                    prop_assert_eq!(twice.as_ref().map(CanonicalPath::as_str), Ok(once.as_str()));
                    prop_assert!(!twice.map(|t| t.is_rewritten()).unwrap_or(true));
                }
                if is_canonical(path.as_bytes()) {
                    prop_assert_eq!(canonicalize(path.as_bytes(), rules, &mut Rewrites::default()), Ok(path.clone()));
                }
            }
        }

        /// Every spelling of a route's path is the same canonical path, and so is metered by
        /// the same limiters.
        #[test]
        fn spellings_of_a_route_are_metered_alike(
            route in 0..ROUTES.len(),
            picks in proptest::collection::vec(any::<u8>(), 1..64),
        ) {
            let policy = Policy::new(crate::config::Config::default().limiters);
            let (method, segs) = ROUTES[route];
            let plain = format!("/{}", segs.join("/"));
            let spelled = respell(segs, &picks);
            let a = CanonicalPath::parse(&plain, PathRules::STRICT).unwrap();
            let b = CanonicalPath::parse(&spelled, PathRules::STRICT);
            prop_assert!(b.is_ok(), "{} refused: {:?}", spelled, b);
            let b = b.unwrap();
            prop_assert_eq!(a.as_str().trim_end_matches('/'), b.as_str().trim_end_matches('/'));
            let names = |p: &CanonicalPath<'_>| -> Vec<String> {
                policy.applicable(method, p, Credential::None).iter().map(|l| l.name.to_string()).collect()
            };
            prop_assert_eq!(names(&a), names(&b), "{}", spelled);
        }

        /// `exact` takes a path exactly when it is its own canonical form, and a refusal of a
        /// path that has one always names a spelling: no rewrite goes unnoted.
        #[test]
        fn exact_takes_only_fixed_points(path in hostile_path()) {
            for rules in [PathRules::STRICT, all_allowed()] {
                let parsed = CanonicalPath::parse(&path, rules);
                let exact = CanonicalPath::exact(&path, rules);
                let fixed = path.starts_with('/')
                    && parsed.as_ref().is_ok_and(|p| p.as_str() == path);
                prop_assert_eq!(exact.is_ok(), fixed, "{:?}: {:?}", path, exact);
                if let Ok(e) = &exact {
                    prop_assert_eq!(e.as_str(), path.as_str());
                    prop_assert!(!e.is_rewritten());
                }
                if path.starts_with('/') {
                    let mut rw = Rewrites::default();
                    if let Ok(c) = canonicalize(path.as_bytes(), rules, &mut rw) {
                        prop_assert_eq!(rw.first.is_some(), c != path, "{:?} -> {:?}: {:?}", path, c, rw.first);
                    }
                }
                if let (Ok(_), Err(r)) = (&parsed, &exact) {
                    prop_assert!(r.class.decision_only() || rules.allows(r.class), "{:?}: {:?}", path, r);
                    prop_assert!(r.at <= path.len());
                }
            }
        }

        /// Two arbitrary paths with one canonical form are metered alike.
        #[test]
        fn paths_that_canonicalise_alike_are_metered_alike(
            a in hostile_path(),
            b in hostile_path(),
        ) {
            let policy = Policy::new(crate::config::Config::default().limiters);
            if let (Ok(ca), Ok(cb)) = (
                CanonicalPath::parse(&a, PathRules::STRICT),
                CanonicalPath::parse(&b, PathRules::STRICT),
            ) {
                if ca.as_str() == cb.as_str() {
                    let names = |p: &CanonicalPath<'_>| -> Vec<String> {
                        policy.applicable("POST", p, Credential::None).iter().map(|l| l.name.to_string()).collect()
                    };
                    prop_assert_eq!(names(&ca), names(&cb));
                }
            }
        }
    }
}
