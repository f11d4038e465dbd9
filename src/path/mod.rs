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
mod bytes;
mod canonical;
#[cfg(test)]
mod tests;

use bytes::is_canonical;
use canonical::{canonicalize, Rewrites};

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

    /// The allowed classes, in `Class::CONFIGURABLE` order.
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
    /// (`Class::DotSegment`, `Class::EmptySegment`, `Class::EscapeSpelling`,
    /// `Class::Unescaped`, a raw `#` as `Class::Fragment`, an allowed class whose bytes are
    /// rewritten under its own class), or `Class::NotOriginForm` when it does not start with
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

    /// `/`.
    pub(crate) fn root() -> CanonicalPath<'static> {
        CanonicalPath(Cow::Borrowed("/"))
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

/// Headers with which some frameworks let a request name another path than its target
/// (`X-Original-URL`, `X-Rewrite-URL`: IIS URL Rewrite, and the PHP frameworks that once read
/// them). A request carrying one could be routed to a path no limiter decided on, so the gateway
/// and the middleware remove them and the decision endpoint, which cannot, refuses the request.
pub(crate) const PATH_OVERRIDE_HEADERS: [&str; 2] = ["x-original-url", "x-rewrite-url"];

/// Whether `name` is one of [`PATH_OVERRIDE_HEADERS`], in any case and with `_` for `-` (CGI
/// servers, PHP's among them, give `X_Original_URL` the same variable).
pub(crate) fn is_path_override_header(name: &str) -> bool {
    PATH_OVERRIDE_HEADERS.iter().any(|h| {
        h.len() == name.len()
            && h.bytes().zip(name.bytes()).all(|(want, got)| {
                want == if got == b'_' {
                    b'-'
                } else {
                    got.to_ascii_lowercase()
                }
            })
    })
}

/// The one-pass check [`CanonicalPath::parse`] takes first (see `crate::fuzzing`).
#[cfg(feature = "fuzzing")]
pub(crate) fn passes_fast_check(path: &str) -> bool {
    is_canonical(path.as_bytes())
}

/// The full parse, without the one-pass check in front of it (see `crate::fuzzing`).
#[cfg(feature = "fuzzing")]
pub(crate) fn full_parse(path: &str, rules: PathRules) -> Result<String, Rejected> {
    canonicalize(path.as_bytes(), rules, &mut Rewrites::default())
}

/// Whether a byte stands for itself in a canonical segment (see `crate::fuzzing`).
#[cfg(feature = "fuzzing")]
pub(crate) fn stands_for_itself(b: u8) -> bool {
    bytes::is_literal(b)
}
