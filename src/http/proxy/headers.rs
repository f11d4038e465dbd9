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

/// The headers that describe one connection whatever the `Connection` header says: those
/// [`skip_header`] names (a test holds the two lists together).
const HOP_BY_HOP: [&str; 10] = [
    "content-length",
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// The header names a `Connection` header lists (its values, comma-separated) beyond those
/// [`skip_header`] drops anyway, in lower case: for the common `Connection: keep-alive` or
/// `close`, none (and nothing allocated).
pub(super) fn connection_named<'a>(values: impl Iterator<Item = &'a [u8]>) -> Vec<String> {
    connection_tokens(values)
        .filter(|t| !HOP_BY_HOP.iter().any(|h| h.eq_ignore_ascii_case(t)))
        .map(str::to_ascii_lowercase)
        .collect()
}

/// The tokens of `Connection` header values, trimmed, empty ones left out, as they came.
pub(super) fn connection_tokens<'a>(
    values: impl Iterator<Item = &'a [u8]>,
) -> impl Iterator<Item = &'a str> {
    values
        .filter_map(|v| std::str::from_utf8(v).ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|s| !s.is_empty())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hop_by_hop_list_is_what_skip_header_drops() {
        for name in HOP_BY_HOP {
            assert!(skip_header(name, &[]), "{name}");
        }
        for name in [
            "content-type",
            "x-connection",
            "keep-alive-x",
            "tes",
            "date",
        ] {
            assert!(!skip_header(name, &[]), "{name}");
        }
    }

    #[test]
    fn connection_names_beyond_the_hop_by_hop_ones_are_kept_in_lower_case() {
        let named = |v: &[&str]| connection_named(v.iter().map(|s| s.as_bytes()));
        assert!(named(&["keep-alive"]).is_empty());
        assert!(named(&["Keep-Alive", " Upgrade , TE"]).is_empty());
        // `close` is a token, but a header of that name would be the connection's too.
        assert_eq!(named(&["Close"]), ["close"]);
        assert_eq!(
            named(&["keep-alive, X-Secret", "x-other,,"]),
            ["x-secret", "x-other"]
        );
        // What the filter leaves out is dropped anyway; what it keeps is dropped through it.
        let kept = named(&["Keep-Alive, X-Secret"]);
        for name in ["keep-alive", "x-secret"] {
            assert!(skip_header(name, &kept), "{name}");
        }
        assert!(!skip_header("x-public", &kept));
        let tokens: Vec<_> =
            connection_tokens([b"Upgrade, ,keep-alive".as_slice()].into_iter()).collect();
        assert_eq!(tokens, ["Upgrade", "keep-alive"]);
    }
}
