//! What is read of a request before it is decided on or refused: the header facts a decision
//! reads (forwarding headers from a trusted proxy, the agent id, the credentials), a header's
//! value when it was sent once, and a refused request's small body, drained so its connection
//! can stay open. Shared by the middleware, the body reading, the decision endpoint, the levers,
//! shaping and the proxy.

use crate::client_ip::{ForwardedHeader, TrustedProxies};
use actix_web::http::header::{HeaderMap, HeaderName, AUTHORIZATION, COOKIE, FORWARDED};
use futures_util::StreamExt;
use smallvec::SmallVec;
use std::net::IpAddr;
use std::time::Duration;

const X_AGENT_ID: HeaderName = HeaderName::from_static("x-agent-id");
const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// The client address of a request from `peer` with `headers`, as the limiter's keys read it:
/// the peer, or the rightmost untrusted hop behind `settings`' trusted proxies, normalised
/// (`client_share::client_address`: IPv4-mapped IPv6 as IPv4, IPv6 masked to the prefix).
pub(crate) fn client_address(
    peer: Option<std::net::SocketAddr>,
    headers: &HeaderMap,
    settings: &crate::decision::Settings,
) -> std::net::IpAddr {
    crate::client_share::request_address(peer, headers, &settings.trusted, settings.ipv6_prefix)
}

/// The value of header `name` when it was sent once, empty when sent more than once (see
/// [`crate::decision::KeyHeaders`]).
pub(crate) fn only_value<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a [u8]> {
    let mut all = headers.get_all(name);
    let first = all.next();
    match all.next() {
        Some(_) => Some(b""),
        None => first.map(|v| v.as_bytes()),
    }
}

/// Most body bytes read from a refused request so that its connection can stay open.
const REFUSED_BODY_DRAIN_BYTES: usize = 64 * 1024;
/// Longest wait for the rest of a refused request's body.
const REFUSED_BODY_DRAIN_TIME: Duration = Duration::from_secs(1);

/// Read and discard a refused request's body when it is small and already arriving, as a
/// client that is told 429 sends the next request on the same connection: actix-web closes
/// any connection whose request body was left unread. A larger or slower body is left
/// unread and the connection closes, as before.
pub(crate) async fn drain_small_body<S, E>(payload: &mut S)
where
    S: futures_util::Stream<Item = Result<bytes::Bytes, E>> + Unpin,
{
    let read = async {
        let mut seen = 0usize;
        while let Some(Ok(chunk)) = payload.next().await {
            seen += chunk.len();
            if seen > REFUSED_BODY_DRAIN_BYTES {
                break;
            }
        }
    };
    let _ = actix_web::rt::time::timeout(REFUSED_BODY_DRAIN_TIME, read).await;
}

/// What a decision reads from a request's headers, borrowed from them.
pub(crate) struct HeaderFacts<'a> {
    /// Every value of the configured forwarding header, only when the peer is a trusted proxy.
    pub forwarded: SmallVec<[&'a [u8]; 2]>,
    pub agent_id: Option<&'a [u8]>,
    pub authorization: Option<&'a [u8]>,
    /// The dashboard session token from the `session_cookie` cookie, when one was sent.
    pub session_token: Option<&'a str>,
}

/// The header facts of a request from `peer`: the same reading for the middleware and for the
/// decision endpoint (where the headers are the original request's, passed on by the proxy).
pub(crate) fn header_facts<'a>(
    headers: &'a HeaderMap,
    peer: IpAddr,
    trusted: &TrustedProxies,
    session_cookie: Option<&str>,
) -> HeaderFacts<'a> {
    // Forwarding headers count only from a trusted proxy: from anyone else they are not read.
    let forwarded = if trusted.contains(peer) {
        headers
            .get_all(forwarded_header(trusted.header))
            .map(|v| v.as_bytes())
            .collect()
    } else {
        SmallVec::new()
    };
    HeaderFacts {
        forwarded,
        agent_id: headers.get(X_AGENT_ID).map(|v| v.as_bytes()),
        authorization: headers.get(AUTHORIZATION).map(|v| v.as_bytes()),
        session_token: session_cookie
            .and_then(|name| cookie_value(headers.get_all(COOKIE).map(|v| v.as_bytes()), name)),
    }
}

fn forwarded_header(h: ForwardedHeader) -> HeaderName {
    match h {
        ForwardedHeader::XForwardedFor => X_FORWARDED_FOR,
        ForwardedHeader::Forwarded => FORWARDED,
    }
}

/// The value of cookie `name` among `Cookie` header values; malformed pairs are skipped.
pub(crate) fn cookie_value<'a>(
    values: impl Iterator<Item = &'a [u8]>,
    name: &str,
) -> Option<&'a str> {
    for v in values {
        let Ok(s) = std::str::from_utf8(v) else {
            continue;
        };
        for pair in s.split(';') {
            if let Some((k, val)) = pair.split_once('=') {
                if k.trim() == name {
                    let val = val.trim().trim_matches('"');
                    if !val.is_empty() {
                        return Some(val);
                    }
                }
            }
        }
    }
    None
}
