//! The full parse: a path resolved unit by unit and segment by segment into its canonical form,
//! noting each spelling it rewrites.

use super::bytes::{hex_value, is_literal, is_unreserved, push_escaped};
use super::{Class, PathRules, Rejected};

/// The first spelling the canonical form rewrites, by position in the path as sent: what
/// [`CanonicalPath::exact`](super::CanonicalPath::exact) refuses.
#[derive(Default)]
pub(super) struct Rewrites {
    pub(super) first: Option<Rejected>,
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

impl Segment {
    /// A character the segment decodes to, after those before it.
    #[inline]
    fn note(&mut self, c: char) {
        if self.first.is_none() {
            self.first = Some(c);
        }
        self.last = Some(c);
    }
}

/// The refusal of the bytes at `at` in a segment that starts at `start` in the path.
#[inline]
fn refuse(class: Class, start: usize, at: usize) -> Rejected {
    Rejected {
        class,
        at: start + at,
    }
}

/// Refuses the unit `u` (of a segment that starts at `start`) as `class` unless the rules allow it.
#[inline]
fn require(rules: PathRules, class: Class, start: usize, u: Unit) -> Result<(), Rejected> {
    if rules.allows(class) {
        Ok(())
    } else {
        Err(refuse(class, start, u.at))
    }
}

/// The segment `b` (starting at `start` in the path) in canonical form, unit by unit; the
/// spellings it rewrites are noted in `rw`.
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
    let mut i = 0;
    while i < b.len() {
        let u = match unit_at(b, i) {
            Ok(u) => u,
            Err(_) if rules.allows(Class::InvalidEscape) => {
                // The lone `%` itself becomes data.
                rw.note(Class::InvalidEscape, start + i);
                seg.text.push_str("%25");
                seg.note('%');
                i += 1;
                continue;
            }
            Err(r) => return Err(refuse(r.class, start, r.at)),
        };
        if u.byte >= 0x80 {
            i = push_non_ascii_run(b, u, start, rules, rw, &mut seg)?;
            continue;
        }
        push_ascii_unit(b, u, start, rules, rw, &mut seg)?;
        i += u.len;
    }
    Ok(seg)
}

/// The run of non-ASCII bytes, raw or escaped, that starts with the unit `u` of the segment `b`,
/// pushed escaped onto `seg`: valid UTF-8 on its own or not at all (every byte of a multi-byte
/// sequence is >= 0x80). Returns where the run ends in `b`.
#[inline]
fn push_non_ascii_run(
    b: &[u8],
    u: Unit,
    start: usize,
    rules: PathRules,
    rw: &mut Rewrites,
    seg: &mut Segment,
) -> Result<usize, Rejected> {
    let mut run: Vec<u8> = Vec::with_capacity(8);
    let mut units: Vec<Unit> = Vec::with_capacity(8);
    let mut j = u.at;
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
                seg.note(c);
            }
            Class::Unescaped
        }
        Err(_) if rules.allows(Class::InvalidUtf8) => {
            seg.note(char::REPLACEMENT_CHARACTER);
            Class::InvalidUtf8
        }
        Err(_) => return Err(refuse(Class::InvalidUtf8, start, u.at)),
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
    Ok(j)
}

/// The ASCII unit `u` of the segment `b` pushed onto `seg` in canonical form: decoded when
/// unreserved, kept as sent or escaped otherwise, or refused by its class.
#[inline]
fn push_ascii_unit(
    b: &[u8],
    u: Unit,
    start: usize,
    rules: PathRules,
    rw: &mut Rewrites,
    seg: &mut Segment,
) -> Result<(), Rejected> {
    let c = u.byte;
    match c {
        _ if is_unreserved(c) => {
            if u.escaped {
                rw.note(Class::EscapeSpelling, start + u.at);
            }
            seg.text.push(c as char)
        }
        b'/' => {
            require(rules, Class::EncodedSlash, start, u)?;
            rw.note_hex_case(b, u, start);
            push_escaped(&mut seg.text, c);
        }
        b'\\' if u.escaped => {
            require(rules, Class::EncodedSlash, start, u)?;
            rw.note_hex_case(b, u, start);
            push_escaped(&mut seg.text, c);
        }
        b'\\' => {
            require(rules, Class::Backslash, start, u)?;
            // Kept as sent: the limiter matches the bytes the upstream gets.
            seg.text.push('\\');
        }
        b';' => {
            require(rules, Class::Semicolon, start, u)?;
            if u.escaped {
                rw.note_hex_case(b, u, start);
                push_escaped(&mut seg.text, c);
            } else {
                seg.text.push(';');
            }
        }
        0x00..=0x1f | 0x7f => {
            require(rules, Class::Control, start, u)?;
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
    seg.note(c as char);
    Ok(())
}

/// The full parse, for paths [`is_canonical`](super::bytes::is_canonical) did not pass; the spellings it rewrites are
/// noted in `rw`.
pub(super) fn canonicalize(
    b: &[u8],
    rules: PathRules,
    rw: &mut Rewrites,
) -> Result<String, Rejected> {
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
