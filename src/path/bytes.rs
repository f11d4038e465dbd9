//! The bytes of a path: which stand for themselves (a table made at compile time), escapes and
//! their hex digits, and the one-pass check that a path is already canonical.

pub(super) const fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// Characters that stand for themselves in a canonical segment, sent raw: unreserved, the
/// sub-delimiters but `;`, `:` and `@` (RFC 3986 `pchar`).
#[inline]
pub(super) fn is_literal(b: u8) -> bool {
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
pub(super) const fn literal_by_definition(b: u8) -> bool {
    is_unreserved(b)
        || matches!(
            b,
            b'!' | b'$' | b'&' | b'\'' | b'(' | b')' | b'*' | b'+' | b',' | b'=' | b':' | b'@'
        )
}

/// Whether [`canonicalize`](super::canonical::canonicalize) would return `path` unchanged; one pass over the bytes, since this
/// runs on every request. Conservative: `false` only sends a path to the full parser.
pub(super) fn is_canonical(b: &[u8]) -> bool {
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

pub(super) fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

pub(super) fn push_escaped(out: &mut String, b: u8) {
    out.push('%');
    out.push(HEX[usize::from(b >> 4)] as char);
    out.push(HEX[usize::from(b & 15)] as char);
}
