//! What is read of a request before it is decided on or refused: a header's value when it was
//! sent once, and a refused request's small body, drained so its connection can stay open.
//! Shared by the middleware, the body reading, the decision endpoint, the levers and the proxy.

use actix_web::http::header::HeaderMap;
use futures_util::StreamExt;
use std::time::Duration;

/// The client address of a request from `peer` with `headers`, as the limiter's keys read it:
/// the peer, or the rightmost untrusted hop behind `settings`' trusted proxies, normalised
/// (`client_share::client_address`: IPv4-mapped IPv6 as IPv4, IPv6 masked to the prefix).
pub(crate) fn client_address(
    peer: Option<std::net::SocketAddr>,
    headers: &HeaderMap,
    settings: &crate::decision::Settings,
) -> std::net::IpAddr {
    let peer = peer.map_or(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), |a| {
        a.ip()
    });
    let forwarded = headers
        .get_all(settings.trusted.header.header_name())
        .map(actix_web::http::header::HeaderValue::as_bytes);
    let ip = crate::client_ip::client_ip(peer, forwarded, &settings.trusted);
    crate::client_share::client_address(ip, settings.ipv6_prefix)
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
