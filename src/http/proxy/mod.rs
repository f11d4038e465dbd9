//! Streaming forwarding to the upstream API: method, query, headers and body go through
//! unchanged (less hop-by-hop headers, plus `X-Forwarded-For`), and the path is the canonical
//! one the limiter decided on (the middleware rewrote the request to it); the response streams
//! back.
//! Bodies are never buffered, so a large download passes with flat memory.
//!
//! The read timeout bounds silence, not size: the upstream must take a chunk of the request
//! body, send its answer's head after the body is complete, and send each next chunk of its
//! answer, within `read_timeout` of the last thing that moved. A long upload or download that
//! keeps moving is never cut off; one that stalls ends with a 504 (or a truncated answer, when
//! the stall comes after the head was sent), never a hang.
//!
//! The client's side is bounded the same way ([`pace`]): the gateway waits at most
//! `body_timeout` for each next chunk of the request body, and once it has waited the grace
//! period in all, the body must keep an average of `body_min_rate` bytes per second. A body that
//! breaks either rule is cut off: the upstream request is aborted (its connection closed, never
//! pooled) and the client gets a 408, or, when the upstream has already answered, the end of
//! that answer. Time spent waiting on the upstream to take the body never counts against the
//! client, and time spent waiting on the client never counts against the upstream.
//!
//! A WebSocket handshake (`Connection: upgrade`, `Upgrade: websocket`) goes its own way
//! (the [`upgrade`] module): a place among the open upgraded connections (in all and per client
//! address), a fresh upstream connection, and on `101` the two connections spliced.
//!
//! An answer's client side is bounded by the read timeout too ([`stall`]): a piece of the
//! answer the client has not taken within it ends the exchange, so a client that stops reading
//! holds no upstream connection, admission slot or in-flight place for longer.
//!
//! With admission control on, a request holding a slot may keep the gateway waiting for its
//! body for at most its group's `body_hold` in all (a third pace rule): a body trickled just
//! above the minimum rate is cut off then (408) and its slot given back.

mod answers;
mod body;
mod client;
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) mod differential;
mod headers;
pub(crate) mod pace;
mod stall;
pub(crate) mod upgrade;

use crate::admission::Admission;
use crate::config::UpstreamUrl;
use crate::decision::Decider;
use crate::metrics::Metrics;
use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use answers::{
    bad_request, bad_request_body, closing, forwarded, overloaded, request_timeout, upstream_error,
};
use body::{silent_for, BodyWatch, ClientFault, ProxyBody};
use client::{request_head, Pool, UpstreamError};
pub(crate) use client::{UpstreamClient, UpstreamTls};
use futures_util::future::{select, Either};
use headers::{parse_length, Framing};
use pace::BodyRules;
pub(crate) use stall::remember_client_socket;
use std::pin::pin;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where allowed requests go.
#[derive(Debug, Clone)]
pub(crate) struct Upstream {
    /// The upstream's URL: scheme, host, port and path prefix.
    pub base: UpstreamUrl,
    pub connect_timeout: Duration,
    pub read_timeout: Duration,
    /// The pace the client's request body must keep.
    pub body: BodyRules,
    /// For an `https://` base: how its certificate is checked.
    pub tls: Option<UpstreamTls>,
    /// Where the proxy counts upstream answers, failures, slow bodies and upgrades: the
    /// gateway's decider's metrics.
    pub metrics: Arc<Metrics>,
    /// Admission control (`[admission]`): the slots a request takes before it is forwarded;
    /// `None` forwards every allowed request at once.
    pub admission: Option<Arc<Admission>>,
    /// The places for upgraded (WebSocket) connections, shared by every worker.
    pub upgrades: Arc<upgrade::Upgrades>,
    /// Who a request's client is, for the caps per client address.
    pub clients: ClientAddresses,
}

/// Who a request's client is, for the caps per client address: the limiter's client IP (the
/// peer, or the rightmost untrusted hop behind the trusted proxies of the settings in force),
/// normalised as keys are (`client_share::client_address`).
#[derive(Clone)]
pub(crate) struct ClientAddresses(Option<Arc<Decider>>);

impl std::fmt::Debug for ClientAddresses {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.0 {
            Some(_) => "ClientAddresses(the decider's trusted proxies)",
            None => "ClientAddresses(the peer)",
        })
    }
}

impl ClientAddresses {
    /// Read through `decider`'s settings (trusted proxies and IPv6 prefix), reloads included.
    pub(crate) fn new(decider: Arc<Decider>) -> Self {
        Self(Some(decider))
    }

    /// The peer itself, with the default IPv6 prefix: for an app with no trusted proxies.
    #[cfg(test)]
    pub(crate) fn peer_only() -> Self {
        Self(None)
    }

    /// The client address of `req`.
    pub(crate) fn of(&self, req: &HttpRequest) -> std::net::IpAddr {
        match &self.0 {
            None => {
                let peer = req
                    .peer_addr()
                    .map_or(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), |a| {
                        a.ip()
                    });
                crate::client_share::client_address(peer, crate::config::defaults::IPV6_PREFIX)
            }
            Some(decider) => crate::http::request::client_address(
                req.peer_addr(),
                req.headers(),
                &decider.current(),
            ),
        }
    }

    /// Who `req` is, as a spread wait reads it (see [`crate::spread::caller`]).
    pub(crate) fn caller(&self, req: &HttpRequest) -> Vec<u8> {
        match &self.0 {
            None => crate::spread::caller_at(
                self.of(req),
                crate::config::defaults::IPV6_PREFIX,
                req.headers(),
            ),
            Some(decider) => {
                crate::spread::caller(req.peer_addr(), req.headers(), &decider.current())
            }
        }
    }
}

impl Upstream {
    /// The connection pool of one worker thread (connections are driven by that thread).
    pub(crate) fn client(&self) -> UpstreamClient {
        UpstreamClient {
            addr: self.base.address(),
            host: self.base.authority().to_owned(),
            prefix: self.base.path_prefix().to_owned(),
            connect_timeout: self.connect_timeout,
            tls: self.tls.clone(),
            idle: Rc::new(Pool::default()),
        }
    }
}

/// The gateway's default service: forward to the upstream and stream the answer back.
pub(crate) async fn forward(
    req: HttpRequest,
    payload: web::Payload,
    client: web::Data<UpstreamClient>,
    upstream: web::Data<Upstream>,
) -> HttpResponse {
    let path = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    if !path.starts_with('/') {
        // `OPTIONS *` and other non-origin forms name no upstream resource.
        return bad_request("The request target must be a path starting with `/`.");
    }
    let upgrading = upgrade::requested(&req);
    let by_client = upgrading
        || upstream
            .admission
            .as_ref()
            .is_some_and(|a| a.shares_by_client());
    let client_addr = if by_client {
        upstream.clients.of(&req)
    } else {
        std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)
    };
    // A handshake takes its place among the upgraded connections before anything else: a
    // refused one costs no admission slot and never reaches the upstream.
    let place = if upgrading {
        match upstream.upgrades.reserve(client_addr) {
            Ok(place) => Some(place),
            Err(reason) => return upgrade::refused(&upstream.upgrades, reason, &upstream.metrics),
        }
    } else {
        None
    };
    // The slot is taken after the limiter allowed the request (a refused one never gets here)
    // and held until the answer's body has been sent, or the client went away.
    let slot = match &upstream.admission {
        Some(admission) => match admission
            .enter(req.method().as_str(), req.path(), client_addr)
            .await
        {
            Ok(slot) => Some(slot),
            Err(shed) => {
                let who = upstream.clients.caller(&req);
                return overloaded(upgrading, payload, admission, &shed, &who).await;
            }
        },
        None => None,
    };
    if let Some(place) = place {
        // A handshake holds its slot until the upstream answers it; an open WebSocket holds none.
        let res = upgrade::forward(
            &req,
            path,
            payload,
            &client,
            upstream.read_timeout,
            &upstream.metrics,
            place,
        )
        .await;
        drop(slot);
        return res;
    }
    let chunked = req
        .headers()
        .get(header::TRANSFER_ENCODING)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
    let length = parse_length(
        req.headers()
            .get(header::CONTENT_LENGTH)
            .map(|v| v.as_bytes()),
    );
    let watch = Rc::new(BodyWatch::new(upstream.metrics.clone()));
    // Holding a slot, the body may keep the gateway waiting at most the slot's hold in all.
    let (rules, hold_meter) = match &slot {
        Some(s) => (
            upstream.body.with_hold(s.body_hold()),
            Some(s.meter().clone()),
        ),
        None => (upstream.body, None),
    };
    let body = match length {
        Some(len) if len > 0 => {
            ProxyBody::stream(payload, Some(len), &watch, &req, rules, hold_meter)
        }
        _ if chunked => ProxyBody::stream(payload, None, &watch, &req, rules, hold_meter),
        _ => ProxyBody::Empty,
    };
    let framing = Framing::of(req.method(), &body);
    let Some(head) = request_head(&req, path, &client, framing) else {
        return bad_request("The request method or target cannot be forwarded.");
    };
    let method_is_head = req.method() == actix_web::http::Method::HEAD;
    let started = Instant::now();
    let silence = silent_for(watch.clone(), upstream.read_timeout);
    let mut exchange = client.exchange(head, body, framing, method_is_head);
    let send = client.send(&mut exchange, &watch);
    let sent = match select(pin!(send), pin!(silence)).await {
        Either::Left((sent, _)) => sent,
        Either::Right(_) => Err(UpstreamError::Silent),
    };
    match (sent, watch.failed.get()) {
        (Ok((head, first)), _) => {
            upstream
                .metrics
                .upstream_response(head.res.status().as_u16(), started.elapsed());
            let client_socket = req.conn_data::<stall::ClientSocket>().copied();
            forwarded(
                head,
                exchange,
                first,
                slot,
                upstream.read_timeout,
                client_socket,
            )
        }
        // The upstream request failed because the client's body did: not the upstream's fault.
        (Err(_), Some(ClientFault::TooSlow(trip))) => closing(request_timeout(trip, &rules)),
        (Err(e), Some(ClientFault::Broken)) => {
            tracing::debug!(error = %e, "the client's request body failed; upstream request aborted");
            closing(bad_request_body())
        }
        (Err(e), None) => upstream_error(&upstream.metrics, &e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::ServerName;

    #[test]
    fn upstream_urls_give_address_host_header_and_tls_name() {
        let up = |base: &str| Upstream {
            base: base.parse().expect("an upstream URL"),
            connect_timeout: Duration::from_secs(1),
            read_timeout: Duration::from_secs(1),
            body: BodyRules::new(Duration::from_secs(1), 0),
            tls: None,
            metrics: Arc::new(Metrics::new()),
            admission: None,
            upgrades: upgrade::Upgrades::new(
                crate::config::websocket::WebsocketConfig {
                    max_open: None,
                    max_per_client: None,
                    idle_timeout: Duration::from_secs(60),
                }
                .caps(None),
                Duration::from_secs(60),
            ),
            clients: ClientAddresses::peer_only(),
        };
        for (base, addr, host, prefix) in [
            ("http://api.internal", "api.internal:80", "api.internal", ""),
            (
                "https://api.internal",
                "api.internal:443",
                "api.internal",
                "",
            ),
            (
                "https://127.0.0.1:8443/v1",
                "127.0.0.1:8443",
                "127.0.0.1:8443",
                "/v1",
            ),
            ("https://[::1]/p", "[::1]:443", "[::1]", "/p"),
        ] {
            let c = up(base).client();
            assert_eq!(
                (c.addr.as_str(), c.host.as_str(), c.prefix.as_str()),
                (addr, host, prefix),
                "{base}"
            );
        }
        let client = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
        let name = |base: &str| {
            UpstreamTls::new(&base.parse().expect("an upstream URL"), &client).map(|t| {
                (
                    t.name.to_str().into_owned(),
                    t.config.alpn_protocols.clone(),
                )
            })
        };
        assert_eq!(
            name("https://api.internal:8443/v1"),
            Ok(("api.internal".to_owned(), vec![b"http/1.1".to_vec()]))
        );
        // An IP address is checked against the certificate's IP addresses (no SNI is sent).
        let url = |u: &str| u.parse::<UpstreamUrl>().expect("an upstream URL");
        let ip = UpstreamTls::new(&url("https://[::1]:8443"), &client).expect("an IP host");
        assert!(matches!(ip.name, ServerName::IpAddress(_)), "{:?}", ip.name);
        let ip = UpstreamTls::new(&url("https://10.0.0.5"), &client).expect("an IP host");
        assert!(matches!(ip.name, ServerName::IpAddress(_)), "{:?}", ip.name);
    }
}
