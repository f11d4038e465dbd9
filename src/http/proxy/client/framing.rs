//! What an answer says of its own framing, read from its bytes: the framing and connection
//! headers of its head (`Declared`), the headers passed on to the client, and the rules its
//! head lines, chunk-size lines and trailer lines must keep.

use super::error::UpstreamError;
use crate::http::proxy::headers::{connection_named, parse_length, skip_header};
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::HttpResponse;

/// How what is left of the answer's body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reading {
    /// This many bytes more.
    Length(u64),
    /// Chunked, at this point of the chunk framing.
    Chunked(Chunk),
    /// Until the upstream closes the connection.
    Close,
    /// The body has ended.
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Chunk {
    /// A chunk-size line.
    Size,
    /// This many bytes of a chunk's data.
    Data(u64),
    /// The CRLF after a chunk's data.
    DataEnd,
    /// Trailer lines, this many bytes so far, until an empty line.
    Trailers(usize),
}

/// What an answer's head says of its body's framing and of its connection.
#[derive(Default)]
pub(super) struct Declared {
    /// A `Transfer-Encoding` came, and its last coding is `chunked`.
    te: bool,
    te_chunked: bool,
    /// The `Content-Length`, every value of it the same run of digits (else `length_bad`).
    length: Option<u64>,
    length_bad: bool,
    /// The first `Content-Length` value, read as the client's framing reads it.
    pub(super) first_length: Option<Option<u64>>,
    /// `Connection: close`, `Connection: keep-alive`, and whether a `Connection` came at all.
    close: bool,
    keep_alive: bool,
    pub(super) connection: bool,
}

impl Declared {
    /// The framing and connection headers of `headers`; a `Transfer-Encoding` that is not one
    /// list of codings read as text or as bytes is refused.
    pub(super) fn of(headers: &[httparse::Header<'_>]) -> Result<Self, UpstreamError> {
        let mut d = Declared::default();
        for h in headers {
            let name = h.name;
            if name.eq_ignore_ascii_case("transfer-encoding") {
                if !h
                    .value
                    .iter()
                    .all(|&b| b == b' ' || b == b'\t' || (0x21..=0x7e).contains(&b))
                {
                    // Read as text or as bytes, its codings are not one list.
                    return Err(UpstreamError::Protocol("an unreadable Transfer-Encoding"));
                }
                d.te = true;
                d.te_chunked = last_token_is(h.value, b"chunked");
            } else if name.eq_ignore_ascii_case("content-length") {
                if d.first_length.is_none() {
                    d.first_length = Some(parse_length(Some(h.value)));
                }
                for part in h.value.split(|&b| b == b',') {
                    match digits(trim(part)) {
                        Some(n) if d.length.is_none_or(|c| c == n) => d.length = Some(n),
                        _ => d.length_bad = true,
                    }
                }
            } else if name.eq_ignore_ascii_case("connection") {
                d.connection = true;
                for token in h.value.split(|&b| b == b',') {
                    let token = trim(token);
                    d.close |= token.eq_ignore_ascii_case(b"close");
                    d.keep_alive |= token.eq_ignore_ascii_case(b"keep-alive");
                }
            }
        }
        Ok(d)
    }

    /// How the body is delimited: none (`bodiless`), chunked, to the close, or by its length;
    /// an answer with both framings, `Transfer-Encoding` in HTTP/1.0 or a `Content-Length`
    /// that does not read as one length is refused.
    pub(super) fn reading(&self, bodiless: bool, http10: bool) -> Result<Reading, UpstreamError> {
        if self.te && self.first_length.is_some() {
            // Read as chunked, a length beside it would be the client's framing: it is the
            // answer that is wrong, so it goes no further (hyper reads the chunks and passes
            // the length on, cutting the body the client gets).
            return Err(UpstreamError::Protocol(
                "both Transfer-Encoding and Content-Length",
            ));
        }
        Ok(if bodiless {
            Reading::Done
        } else if self.te {
            if http10 {
                return Err(UpstreamError::Protocol("Transfer-Encoding in HTTP/1.0"));
            }
            if self.te_chunked {
                Reading::Chunked(Chunk::Size)
            } else {
                Reading::Close
            }
        } else if let (Some(n), false) = (self.length, self.length_bad) {
            Reading::Length(n)
        } else if self.first_length.is_some() {
            return Err(UpstreamError::Protocol("invalid Content-Length"));
        } else {
            Reading::Close
        })
    }

    /// Whether the upstream keeps the connection open after the answer: HTTP/1.0 only when
    /// it says `keep-alive`, HTTP/1.1 unless it says `close`.
    pub(super) fn keeps_open(&self, http10: bool) -> bool {
        if http10 {
            self.keep_alive
        } else {
            !self.close
        }
    }
}

/// The client's response head: `status`, and the end-to-end headers of `headers` (hop-by-hop
/// ones, those the `Connection` header names, and any the client's side cannot carry dropped).
pub(super) fn passed_on(
    status: StatusCode,
    headers: &[httparse::Header<'_>],
    connection: bool,
) -> HttpResponse {
    let named = if connection {
        connection_named(
            headers
                .iter()
                .filter(|h| h.name.eq_ignore_ascii_case("connection"))
                .map(|h| h.value),
        )
    } else {
        Vec::new()
    };
    let mut back = HttpResponse::new(status);
    let out = back.headers_mut();
    for h in headers {
        let Ok(name) = HeaderName::from_bytes(h.name.as_bytes()) else {
            continue;
        };
        if skip_header(name.as_str(), &named) {
            continue;
        }
        if let Ok(value) = HeaderValue::from_bytes(h.value) {
            out.append(name, value);
        }
    }
    back
}

/// A trailer line (without its CRLF) that is a field: a name of token characters, a colon,
/// and a value of visible bytes, spaces and tabs (obsolete text above 0x7f allowed, as in a
/// head).
pub(super) fn trailer_field(line: &[u8]) -> bool {
    let Some(colon) = line.iter().position(|&b| b == b':') else {
        return false;
    };
    let (name, value) = (&line[..colon], &line[colon + 1..]);
    !name.is_empty()
        && name
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
        && value
            .iter()
            .all(|&b| b == b'\t' || b == b' ' || (0x21..=0x7e).contains(&b) || b >= 0x80)
}

/// Whether every LF in `head` ends a CRLF and every CR begins one.
pub(super) fn crlf_only(head: &[u8]) -> bool {
    let mut prev = 0u8;
    for (i, &b) in head.iter().enumerate() {
        match b {
            b'\n' if prev != b'\r' => return false,
            b'\r' if head.get(i + 1) != Some(&b'\n') => return false,
            _ => {}
        }
        prev = b;
    }
    true
}

/// `value` without leading and trailing spaces and tabs.
fn trim(mut value: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = value {
        value = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = value {
        value = rest;
    }
    value
}

/// Decimal digits only (no sign, no space), as a `u64`.
fn digits(value: &[u8]) -> Option<u64> {
    if value.is_empty() {
        return None;
    }
    value.iter().try_fold(0u64, |n, &b| {
        if b.is_ascii_digit() {
            n.checked_mul(10)?.checked_add(u64::from(b - b'0'))
        } else {
            None
        }
    })
}

/// Whether the last comma-separated token of `value` is `token` (any case).
fn last_token_is(value: &[u8], token: &[u8]) -> bool {
    value
        .rsplit(|&b| b == b',')
        .next()
        .is_some_and(|t| trim(t).eq_ignore_ascii_case(token))
}

/// A chunk-size line up to its LF: hex digits, optional spaces or tabs, optional extensions
/// after `;` (no control character but a tab), then CR.
pub(super) fn chunk_size(line: &[u8]) -> Option<u64> {
    let line = line.strip_suffix(b"\r")?;
    let end = line
        .iter()
        .position(|b| !b.is_ascii_hexdigit())
        .unwrap_or(line.len());
    if end == 0 {
        return None;
    }
    let size = line[..end].iter().try_fold(0u64, |n, &b| {
        let d = (b as char).to_digit(16)?;
        n.checked_mul(16)?.checked_add(u64::from(d))
    })?;
    let rest = trim(&line[end..]);
    let ok = match rest {
        [] => true,
        [b';', ext @ ..] => ext.iter().all(|&b| b == b'\t' || (b >= b' ' && b != 0x7f)),
        _ => false,
    };
    ok.then_some(size)
}
