//! How override headers, parameters and method tokens are spelled: whitespace, case, `_` for `-`,
//! percent-decoding and PHP's reading of parameter names.

/// `value` without the spaces and tabs around it (HTTP's optional whitespace; any other
/// control character stays, and makes the value no method).
pub(super) fn trim_ows(value: &[u8]) -> &[u8] {
    let ows = |b: &u8| *b == b' ' || *b == b'\t';
    let start = value.iter().position(|b| !ows(b)).unwrap_or(value.len());
    let end = value.iter().rposition(|b| !ows(b)).map_or(start, |i| i + 1);
    &value[start..end]
}

/// A header name byte as override header names are compared: lower-case, `_` as `-`.
pub(super) fn fold_header(b: u8) -> u8 {
    match b {
        b'_' => b'-',
        b => b.to_ascii_lowercase(),
    }
}

/// RFC 9110 `tchar`: the characters of a method token.
pub(crate) fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Whether `s` is an HTTP method token.
pub(crate) fn is_token(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(is_tchar)
}

/// A query parameter name as override parameters are compared (see `normalised_param`).
pub(crate) fn param_name(raw: &[u8]) -> Vec<u8> {
    normalised_param(raw).collect()
}

/// A raw query parameter name read the most permissive way the frameworks read one: `+` a
/// space and `%XX` a byte (an escape that is not one stays as it is), leading spaces dropped
/// (PHP), ` ` and `.` as `_` (PHP), nothing from `[` or a NUL on (PHP arrays and C strings),
/// and lower-case, so that every spelling any of them reads as `_method` reads as `_method`.
pub(super) fn normalised_param(raw: &[u8]) -> impl Iterator<Item = u8> + '_ {
    Decoded::new(raw)
        .skip_while(|b| *b == b' ')
        .take_while(|b| *b != b'[' && *b != 0)
        .map(|b| match b {
            b' ' | b'.' => b'_',
            b => b.to_ascii_lowercase(),
        })
}

/// The bytes of a query component with `+` read as a space and `%XX` as the byte it encodes.
pub(super) struct Decoded<'a> {
    raw: &'a [u8],
    at: usize,
}

impl<'a> Decoded<'a> {
    pub(super) fn new(raw: &'a [u8]) -> Self {
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
