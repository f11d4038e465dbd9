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
}

impl Class {
    pub const ALL: [Class; 7] = [
        Class::InvalidEscape,
        Class::InvalidUtf8,
        Class::EncodedSlash,
        Class::Backslash,
        Class::Semicolon,
        Class::Control,
        Class::SegmentEdge,
    ];

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
        }
    }

    /// The class's setting under `[path]`.
    pub fn setting(self) -> &'static str {
        match self {
            Class::InvalidEscape => "invalid_escape",
            Class::InvalidUtf8 => "invalid_utf8",
            Class::EncodedSlash => "encoded_slash",
            Class::Backslash => "backslash",
            Class::Semicolon => "semicolon",
            Class::Control => "control",
            Class::SegmentEdge => "segment_edge",
        }
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
        }
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
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
    allowed: u8,
}

impl PathRules {
    /// Refuse every class (the default).
    pub const STRICT: PathRules = PathRules { allowed: 0 };

    pub fn allowing(mut self, class: Class) -> Self {
        self.allowed |= class.bit();
        self
    }

    pub fn allows(self, class: Class) -> bool {
        self.allowed & class.bit() != 0
    }

    /// The allowed classes, in [`Class::ALL`] order.
    pub fn allowed(self) -> impl Iterator<Item = Class> {
        Class::ALL.into_iter().filter(move |c| self.allows(*c))
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
        let canonical = canonicalize(path.as_bytes(), rules)?;
        Ok(CanonicalPath(if canonical == path {
            Cow::Borrowed(path)
        } else {
            Cow::Owned(canonical)
        }))
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

fn canonical_segment(b: &[u8], start: usize, rules: PathRules) -> Result<Segment, Rejected> {
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
            let mut j = i;
            while j < b.len() {
                match unit_at(b, j) {
                    Ok(v) if v.byte >= 0x80 => {
                        run.push(v.byte);
                        j += v.len;
                    }
                    _ => break,
                }
            }
            match std::str::from_utf8(&run) {
                Ok(s) => {
                    for c in s.chars() {
                        note(&mut seg, c);
                    }
                }
                Err(_) if rules.allows(Class::InvalidUtf8) => {
                    note(&mut seg, char::REPLACEMENT_CHARACTER);
                }
                Err(_) => return Err(refuse(Class::InvalidUtf8, u.at)),
            }
            for byte in run {
                push_escaped(&mut seg.text, byte);
            }
            i = j;
            continue;
        }
        let c = u.byte;
        match c {
            _ if is_unreserved(c) => seg.text.push(c as char),
            b'/' => {
                if !rules.allows(Class::EncodedSlash) {
                    return Err(refuse(Class::EncodedSlash, u.at));
                }
                push_escaped(&mut seg.text, c);
            }
            b'\\' if u.escaped => {
                if !rules.allows(Class::EncodedSlash) {
                    return Err(refuse(Class::EncodedSlash, u.at));
                }
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
                    push_escaped(&mut seg.text, c);
                } else {
                    seg.text.push(';');
                }
            }
            0x00..=0x1f | 0x7f => {
                if !rules.allows(Class::Control) {
                    return Err(refuse(Class::Control, u.at));
                }
                push_escaped(&mut seg.text, c);
            }
            _ if is_literal(c) && !u.escaped => seg.text.push(c as char),
            _ => push_escaped(&mut seg.text, c),
        }
        note(&mut seg, c as char);
        i += u.len;
    }
    Ok(seg)
}

/// The full parse, for paths [`is_canonical`] did not pass.
fn canonicalize(b: &[u8], rules: PathRules) -> Result<String, Rejected> {
    if b.is_empty() {
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
        let seg = canonical_segment(raw, start, rules)?;
        start += raw.len() + 1;
        match seg.text.as_str() {
            "" | "." => trailing = true,
            ".." => {
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
                    prop_assert_eq!(canonicalize(path.as_bytes(), rules), Ok(path.clone()));
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
