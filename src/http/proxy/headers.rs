//! The headers that cross the proxy and those that do not (hop-by-hop ones, and those the
//! `Connection` header names), the lengths read from a header, and the request body's framing.

use super::body::ProxyBody;
use actix_web::http::header::{self, HeaderValue};
use actix_web::http::Method;

/// Whether a header must not be copied across the proxy: one that describes one connection,
/// not the message (RFC 9110 section 7.6.1). `Content-Length` is set again from the body, and
/// any header the `Connection` header names is connection-specific too.
pub(super) fn skip_header(name: &str, connection_named: &[String]) -> bool {
    matches!(
        name,
        "content-length"
            | "connection"
            | "keep-alive"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "proxy-connection"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
    ) || connection_named
        .iter()
        .any(|c| c.eq_ignore_ascii_case(name))
}

/// The header names a `Connection` header lists (its values, comma-separated).
pub(super) fn connection_named<'a>(values: impl Iterator<Item = &'a [u8]>) -> Vec<String> {
    values
        .filter_map(|v| std::str::from_utf8(v).ok())
        .flat_map(|v| v.split(','))
        .map(|s| s.trim().to_ascii_lowercase())
        .filter(|s| !s.is_empty())
        .collect()
}

pub(super) fn parse_length(value: Option<&[u8]>) -> Option<u64> {
    std::str::from_utf8(value?).ok()?.trim().parse().ok()
}

/// How the request's body is framed on the way to the upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Framing {
    /// No body: no `Content-Length`, no `Transfer-Encoding`, and the client's body (a chunked
    /// one on `GET`, `HEAD` or `CONNECT`) is not sent.
    None,
    /// `Content-Length`: exactly this many bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
}

impl Framing {
    /// The framing of `body` for `method`: a chunked body on a method that almost never has
    /// one is not sent at all (as hyper's client does).
    pub(super) fn of(method: &Method, body: &ProxyBody) -> Self {
        match body.declared() {
            None => Framing::None,
            Some(Some(n)) => Framing::Length(n),
            Some(None) if matches!(*method, Method::GET | Method::HEAD | Method::CONNECT) => {
                Framing::None
            }
            Some(None) => Framing::Chunked,
        }
    }
}

/// Copy the upstream answer's end-to-end headers onto the client's answer: hop-by-hop ones and
/// those its `Connection` header names are dropped, and so is any the client's side cannot
/// carry.
pub(super) fn end_to_end_headers(
    upstream: &hyper::HeaderMap,
    back: &mut actix_web::HttpResponseBuilder,
) {
    let named = connection_named(
        upstream
            .get_all(hyper::header::CONNECTION)
            .iter()
            .map(|v| v.as_bytes()),
    );
    for (name, value) in upstream {
        if skip_header(name.as_str(), &named) {
            continue;
        }
        if let (Ok(n), Ok(v)) = (
            header::HeaderName::from_bytes(name.as_str().as_bytes()),
            HeaderValue::from_bytes(value.as_bytes()),
        ) {
            back.append_header((n, v));
        }
    }
}
