//! Envoy's global rate-limit service (`envoy.service.ratelimit.v3.RateLimitService`) on
//! `rls.listen`: a drop-in for envoyproxy/ratelimit, answering `ShouldRateLimit` from the same
//! decider, store and buckets as the gateway and the decision endpoint.
//!
//! Each descriptor of a request is looked up in the domain's YAML tree ([`crate::rls_rules`]); those that
//! reach a rule are decided together in one all-or-nothing store call (a request one of them
//! refuses charges none), each bucket named by its limiter and a digest of the descriptor's
//! entries (or, for a `fleet_limiter` rule, of the key the gateway computes for that limiter).
//! What envoyproxy/ratelimit answers is matched where it is defined: an unknown domain or a
//! descriptor no rule matches is `OK` with no `current_limit`; an empty domain or no
//! descriptor is `INVALID_ARGUMENT`. See docs/envoy-rls.md.

mod answer;
pub(crate) mod proto;

use crate::config::Config;
use crate::decision::Decider;
use crate::keys::{self, KeyKind, Principal};
use crate::policy::LimiterSpec;
use crate::rls_rules::Unit;
use ipnet::IpNet;
use proto::{Code, DescriptorStatus, RateLimitRequest, RateLimitResponse};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

/// Most descriptors one request may carry; more is `INVALID_ARGUMENT`.
pub(crate) const MAX_DESCRIPTORS: usize = 64;
/// Most entries one descriptor may carry.
pub(crate) const MAX_ENTRIES: usize = 32;
/// Longest domain, entry key or entry value, in bytes.
pub(crate) const MAX_VALUE_LEN: usize = 1024;
/// The largest HTTP/2 header list read, in bytes.
const MAX_HEADER_LIST: u32 = 16 * 1024;
/// The most streams open at once on one connection.
const MAX_STREAMS: u32 = 1024;
/// The gRPC method's path.
const METHOD: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// The service's state: the shared decider, whose settings hold the YAML's domains, who may
/// ask and whether a descriptor's own limit counts (all read again on every reload).
pub(crate) struct Service {
    decider: Arc<Decider>,
}

impl Service {
    pub(crate) fn new(decider: Arc<Decider>) -> Self {
        Self { decider }
    }
}

fn allows(allow_from: &[IpNet], peer: Option<SocketAddr>) -> bool {
    let Some(peer) = peer else { return false };
    let ip = peer.ip().to_canonical();
    allow_from.iter().any(|n| n.contains(&ip))
}

/// A calibration limiter's budget as Envoy's `RateLimit` can say it: its limit per its window
/// when the window is one unit; else its refill rate per the longest unit not longer than the
/// window, rounded up (at least 1).
fn rate_of(quota: &crate::limiter::Quota) -> (u32, Unit) {
    if let Some(c) = quota.calendar_window() {
        return (quota.limit(), Unit::of_calendar(c.unit));
    }
    let window = quota.window();
    let unit = crate::rls_rules::unit_of_window(window);
    if window.as_secs() == unit.seconds() && window.subsec_nanos() == 0 {
        return (quota.limit(), unit);
    }
    let unit = [Unit::Week, Unit::Day, Unit::Hour, Unit::Minute]
        .into_iter()
        .find(|u| window.as_secs() >= u.seconds())
        .unwrap_or(Unit::Second);
    let rate = f64::from(quota.limit()) * unit.seconds() as f64 / window.as_secs_f64();
    (rate.ceil().clamp(1.0, f64::from(u32::MAX)) as u32, unit)
}

/// `OK` with no limit, as the reference answers a descriptor no rule matches (`remaining` 0)
/// or an `unlimited` one (`remaining` the largest number).
fn no_limit(remaining: u32) -> DescriptorStatus {
    DescriptorStatus {
        code: Code::Ok as i32,
        current_limit: None,
        limit_remaining: remaining,
        duration_until_reset: None,
    }
}

/// Every descriptor `OK` with no limit: an unknown domain, or limiting switched off.
fn unlimited_answer(n: usize) -> RateLimitResponse {
    RateLimitResponse {
        overall_code: Code::Ok as i32,
        statuses: (0..n).map(|_| no_limit(0)).collect(),
        response_headers_to_add: Vec::new(),
        request_headers_to_add: Vec::new(),
    }
}

/// An entry's value as a key part: a `remote_address` normalised as every address is
/// (IPv4-mapped to IPv4, IPv6 to its prefix); anything else as it is.
fn entry_value(key: &str, value: &str, v6_prefix: u8) -> String {
    if key == "remote_address" {
        if let Ok(ip) = value.trim().parse::<IpAddr>() {
            return keys::normalize_ip(ip, v6_prefix);
        }
    }
    value.to_owned()
}

/// A descriptor's entries as one unambiguous string (each part length-prefixed), which the
/// bucket's name digests: the raw values go no further.
/// A descriptor as the top-talker lists name it: its entries, each value but an address's as
/// the first digits of its SHA-256 (a descriptor value may be a key or a token).
fn descriptor_label(d: Option<&proto::RateLimitDescriptor>, v6_prefix: u8) -> keys::Seed {
    let mut who = String::new();
    let mut address = None;
    for e in d.map(|d| d.entries.as_slice()).unwrap_or_default() {
        if !who.is_empty() {
            who.push(' ');
        }
        let v = entry_value(&e.key, &e.value, v6_prefix);
        if e.key == "remote_address" {
            who.push_str(&format!("remote_address={v}"));
            address = Some(v);
        } else {
            let d = keys::credential_digest(&v);
            who.push_str(&format!(
                "{}=sha256:{}…",
                crate::redact::printable(&e.key, 32),
                d.get(..12).unwrap_or(&d)
            ));
        }
    }
    keys::Seed::Text(Arc::from(who), address.map(Arc::from))
}

fn joined_entries(d: &proto::RateLimitDescriptor, v6_prefix: u8) -> String {
    let mut s = String::new();
    for e in &d.entries {
        let v = entry_value(&e.key, &e.value, v6_prefix);
        s.push_str(itoa::Buffer::new().format(e.key.len()));
        s.push(':');
        s.push_str(&e.key);
        s.push_str(itoa::Buffer::new().format(v.len()));
        s.push(':');
        s.push_str(&v);
    }
    s
}

/// The bucket a `fleet_limiter` rule's limiter keeps for this descriptor: keyed exactly as the
/// gateway keys that limiter for a request from the descriptor's `remote_address` (its
/// `agent_id` entry as the agent id, an entry named as a `header:<name>` key's header as that
/// header).
fn mapped_key(
    digest: &keys::KeyDigest,
    spec: &LimiterSpec,
    d: &proto::RateLimitDescriptor,
    v6_prefix: u8,
) -> keys::BucketKey {
    let find = |k: &str| {
        d.entries
            .iter()
            .find(|e| e.key == k)
            .map(|e| e.value.as_str())
    };
    let ip = find("remote_address")
        .map(|v| entry_value("remote_address", v, v6_prefix))
        .unwrap_or_default();
    let agent_id = find("agent_id").and_then(|v| keys::valid_agent_id(v.as_bytes()));
    let header = match &spec.key {
        KeyKind::Header(name) => find(name).and_then(|v| keys::valid_key_header(v.as_bytes())),
        _ => None,
    };
    let p = Principal {
        ip: &ip,
        agent_id,
        header,
        ..Principal::default()
    };
    digest.bucket_of(spec.name.clone(), &spec.key, &p)
}

/// The gRPC service: `ShouldRateLimit`, and `UNIMPLEMENTED` for anything else.
#[derive(Clone)]
struct Grpc(Arc<Service>);

impl tonic::server::NamedService for Grpc {
    const NAME: &'static str = "envoy.service.ratelimit.v3.RateLimitService";
}

impl<B> tonic::codegen::Service<tonic::codegen::http::Request<B>> for Grpc
where
    B: tonic::codegen::Body + Send + 'static,
    B::Error: Into<tonic::codegen::StdError> + Send + 'static,
{
    type Response = tonic::codegen::http::Response<tonic::body::BoxBody>;
    type Error = std::convert::Infallible;
    type Future = tonic::codegen::BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: tonic::codegen::http::Request<B>) -> Self::Future {
        let service = self.0.clone();
        if req.uri().path() == METHOD {
            Box::pin(async move {
                let mut grpc = tonic::server::Grpc::new(Codec::default());
                Ok(grpc.unary(Unary(service), req).await)
            })
        } else {
            Box::pin(async move {
                Ok(tonic::Status::unimplemented(
                    "this listener answers envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit only",
                )
                .into_http())
            })
        }
    }
}

/// Prost's codec, with a message that does not decode answered `INVALID_ARGUMENT` (the
/// caller's fault), not `INTERNAL` as tonic's own says.
#[derive(Default)]
struct Codec(tonic::codec::ProstCodec<RateLimitResponse, RateLimitRequest>);

impl tonic::codec::Codec for Codec {
    type Encode = RateLimitResponse;
    type Decode = RateLimitRequest;
    type Encoder =
        <tonic::codec::ProstCodec<RateLimitResponse, RateLimitRequest> as tonic::codec::Codec>::Encoder;
    type Decoder = Decoder;

    fn encoder(&mut self) -> Self::Encoder {
        self.0.encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        Decoder
    }
}

/// Decodes a `RateLimitRequest`; bytes that are not one are `INVALID_ARGUMENT`.
struct Decoder;

impl tonic::codec::Decoder for Decoder {
    type Item = RateLimitRequest;
    type Error = tonic::Status;

    fn decode(
        &mut self,
        buf: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Self::Item>, Self::Error> {
        <RateLimitRequest as prost::Message>::decode(buf)
            .map(Some)
            .map_err(|e| {
                tonic::Status::invalid_argument(format!(
                    "not a RateLimitRequest (envoy.service.ratelimit.v3): {e}"
                ))
            })
    }
}

struct Unary(Arc<Service>);

impl tonic::server::UnaryService<RateLimitRequest> for Unary {
    type Response = RateLimitResponse;
    type Future = tonic::codegen::BoxFuture<tonic::Response<RateLimitResponse>, tonic::Status>;

    fn call(&mut self, request: tonic::Request<RateLimitRequest>) -> Self::Future {
        let service = self.0.clone();
        Box::pin(async move {
            let peer = request.remote_addr();
            let answer = service.answer(peer, request.into_inner()).await;
            answer.map(tonic::Response::new)
        })
    }
}

/// Start the gRPC listener on `rls.listen`, if set: bound here (an address that cannot be
/// bound is an error now), served on its own runtime threads. Returns the bound address.
pub(crate) fn start(
    cfg: &Config,
    decider: Arc<Decider>,
) -> Result<Option<Running>, crate::error::Error> {
    let Some(listen) = cfg.rls.listen else {
        return Ok(None);
    };
    let listener = std::net::TcpListener::bind(listen)
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
        .map_err(|e| {
            crate::error::ListenError::new(cfg, "rls.listen", "--rls-listen", listen, &e)
        })?;
    let cannot = |e: std::io::Error| crate::error::Error::serve(format!("rls.listen: {e}"));
    let addr = listener.local_addr().map_err(cannot)?;
    let service = Arc::new(Service::new(decider));
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .thread_name("rls")
        .enable_all()
        .build()
        .map_err(cannot)?;
    let (ended_tx, ended) = tokio::sync::oneshot::channel::<String>();
    std::thread::Builder::new()
        .name("rls-listener".to_owned())
        .spawn(move || {
            let why = runtime.block_on(async move {
                let incoming = tokio::net::TcpListener::from_std(listener)
                    .map_err(|e| e.to_string())
                    .and_then(|l| {
                        tonic::transport::server::TcpIncoming::from_listener(l, true, None)
                            .map_err(|e| e.to_string())
                    });
                let incoming = match incoming {
                    Ok(i) => i,
                    Err(e) => {
                        tracing::error!("rls.listen: cannot serve {addr}: {e}");
                        return format!("rls.listen: cannot serve {addr}: {e}");
                    }
                };
                // Bounds a client cannot raise: a header list past 16 KiB is refused before it
                // is decoded into a map (Envoy's gRPC metadata is a few hundred bytes), and at
                // most 1 024 streams are open per connection.
                if let Err(e) = tonic::transport::Server::builder()
                    .http2_max_header_list_size(MAX_HEADER_LIST)
                    .max_concurrent_streams(MAX_STREAMS)
                    .add_service(Grpc(service))
                    .serve_with_incoming(incoming)
                    .await
                {
                    tracing::error!("rls.listen: the gRPC server on {addr} stopped: {e}");
                    return format!("rls.listen: the gRPC server on {addr} stopped: {e}");
                }
                format!("rls.listen: the gRPC server on {addr} stopped")
            });
            // Nobody listening any more is a process already stopping.
            let _ = ended_tx.send(why);
        })
        .map_err(cannot)?;
    tracing::info!(rls_listen = %addr, "Envoy rate-limit service listener started: envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit");
    Ok(Some(Running { ended }))
}

/// The rate-limit service, serving on its own threads.
pub(crate) struct Running {
    /// Why it stopped, once it has (it serves until the process ends otherwise).
    pub(crate) ended: tokio::sync::oneshot::Receiver<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::Quota;
    use std::time::Duration;

    fn q(limit: u32, secs: u64) -> Quota {
        Quota::gcra(crate::limiter::nonzero(limit), Duration::from_secs(secs))
    }

    #[test]
    fn a_calibration_budget_is_said_per_unit() {
        assert_eq!(rate_of(&q(30, 60)), (30, Unit::Minute));
        assert_eq!(rate_of(&q(5, 3600)), (5, Unit::Hour));
        // 100 per 83 s refills 72.3 a minute.
        assert_eq!(rate_of(&q(100, 83)), (73, Unit::Minute));
        // 10 per 2 minutes refills 5 a minute.
        assert_eq!(rate_of(&q(10, 120)), (5, Unit::Minute));
        assert_eq!(rate_of(&q(1, 7)), (1, Unit::Second));
    }

    #[test]
    fn entries_join_unambiguously_and_addresses_are_normalised() {
        let d = |e: &[(&str, &str)]| proto::RateLimitDescriptor {
            entries: e
                .iter()
                .map(|(k, v)| proto::Entry {
                    key: (*k).into(),
                    value: (*v).into(),
                })
                .collect(),
            limit: None,
            hits_addend: None,
        };
        assert_ne!(
            joined_entries(&d(&[("a", "b=c")]), 56),
            joined_entries(&d(&[("a=b", "c")]), 56)
        );
        assert_ne!(
            joined_entries(&d(&[("a", "bc")]), 56),
            joined_entries(&d(&[("a", "b"), ("c", "")]), 56)
        );
        assert_eq!(
            joined_entries(&d(&[("remote_address", "::ffff:198.51.100.7")]), 56),
            joined_entries(&d(&[("remote_address", "198.51.100.7")]), 56)
        );
        assert_eq!(
            joined_entries(&d(&[("remote_address", "2001:db8:1:2::1")]), 56),
            joined_entries(&d(&[("remote_address", "2001:db8:1:2:ffff::9")]), 56)
        );
    }
}
