//! fleet-limiter's principals as `actix_governor::KeyExtractor`s, for apps already on
//! actix-governor (built only with `--features actix-governor`; actix-governor is
//! GPL-3.0-or-later, so the feature is off by default).
//!
//! Each extractor finds the client IP the way the gateway does (trusted proxies, rightmost
//! untrusted hop), normalises it (IPv4-mapped to IPv4, IPv6 to its prefix, /56 by default), and
//! yields the 16-byte digest of the principal key: governor's map never holds a raw agent id,
//! user id or token.
//!
//! ```no_run
//! use actix_governor::{Governor, GovernorConfigBuilder};
//! use fleet_limiter::AgentDeviceKey;
//!
//! let conf = GovernorConfigBuilder::default()
//!     .seconds_per_request(2)
//!     .burst_size(30)
//!     .key_extractor(AgentDeviceKey::default())
//!     .finish()
//!     .expect("a valid quota");
//! let app = actix_web::App::new().wrap(Governor::new(&conf));
//! ```

use crate::client_ip::{client_ip, TrustedProxies};
use crate::config::defaults::IPV6_PREFIX;
use crate::http::request::cookie_value;
use crate::identity::{bearer_token, API_KEY_PREFIX};
use crate::keys::{self, KeyKind};
use actix_governor::{KeyExtractor, SimpleKeyExtractionError};
use actix_web::dev::ServiceRequest;
use actix_web::http::header::{AUTHORIZATION, COOKIE};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

/// Where an extractor finds the client address.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientAddress {
    pub trusted: TrustedProxies,
    pub ipv6_prefix: u8,
}

impl Default for ClientAddress {
    /// No trusted proxies (the peer address is the client), IPv6 /56.
    fn default() -> Self {
        Self {
            trusted: TrustedProxies::default(),
            ipv6_prefix: IPV6_PREFIX,
        }
    }
}

impl ClientAddress {
    /// The normalised client IP of a request, as its buckets are keyed.
    pub fn of(&self, req: &ServiceRequest) -> String {
        let peer = req
            .peer_addr()
            .map(|a| a.ip())
            .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
        let header = self.trusted.header.header_name();
        let values = req.headers().get_all(header).map(|v| v.as_bytes());
        keys::normalize_ip(client_ip(peer, values, &self.trusted), self.ipv6_prefix)
    }
}

/// The error type of these extractors; they never fail (a request without a peer address is
/// keyed on `0.0.0.0`).
pub(crate) type NeverFails = SimpleKeyExtractionError<&'static str>;

fn key(label: &str, kind: KeyKind, ip: &str, agent: Option<&str>, user: Option<&str>) -> [u8; 16] {
    keys::digest(label, &keys::principal_key(kind, ip, agent, user))
}

/// The masked client IP (the `ip` key).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MaskedIpKey {
    pub address: ClientAddress,
}

impl KeyExtractor for MaskedIpKey {
    type Key = [u8; 16];
    type KeyExtractionError = NeverFails;

    fn extract(&self, req: &ServiceRequest) -> Result<Self::Key, Self::KeyExtractionError> {
        Ok(key("ip", KeyKind::Ip, &self.address.of(req), None, None))
    }
}

/// One enrolled agent: client IP plus a valid `X-Agent-ID` (the `ip+agent` key), so every
/// agent behind one NAT has a bucket of its own.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AgentDeviceKey {
    pub address: ClientAddress,
}

impl KeyExtractor for AgentDeviceKey {
    type Key = [u8; 16];
    type KeyExtractionError = NeverFails;

    fn extract(&self, req: &ServiceRequest) -> Result<Self::Key, Self::KeyExtractionError> {
        let agent = req
            .headers()
            .get("x-agent-id")
            .and_then(|v| keys::valid_agent_id(v.as_bytes()));
        Ok(key(
            "ip+agent",
            KeyKind::IpAgent,
            &self.address.of(req),
            agent,
            None,
        ))
    }
}

/// Checks a dashboard session token and returns its subject; synchronous, as governor's key
/// extraction is (e.g. `jsonwebtoken::decode` against a known key).
pub(crate) type VerifyFn = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// The verified dashboard user, else the masked client IP (the `user-or-ip` key). Only a token
/// that verifies names a user, so an invented token cannot mint a fresh bucket.
#[derive(Clone)]
pub struct VerifiedUserKey {
    pub address: ClientAddress,
    verify: VerifyFn,
    cookie: Option<Arc<str>>,
}

impl VerifiedUserKey {
    /// Tokens come from `Authorization: Bearer` (API keys excluded) and verify with `verify`.
    pub fn new(verify: VerifyFn) -> Self {
        Self {
            address: ClientAddress::default(),
            verify,
            cookie: None,
        }
    }

    /// Also read the token from this cookie.
    pub fn with_cookie(mut self, name: impl Into<Arc<str>>) -> Self {
        self.cookie = Some(name.into());
        self
    }

    pub fn with_address(mut self, address: ClientAddress) -> Self {
        self.address = address;
        self
    }

    fn user(&self, req: &ServiceRequest) -> Option<String> {
        let headers = req.headers();
        let bearer = headers
            .get(AUTHORIZATION)
            .and_then(|v| bearer_token(v.as_bytes()))
            .filter(|t| !t.starts_with(API_KEY_PREFIX));
        let cookie = self
            .cookie
            .as_deref()
            .and_then(|name| cookie_value(headers.get_all(COOKIE).map(|v| v.as_bytes()), name));
        bearer
            .into_iter()
            .chain(cookie)
            .find_map(|t| (self.verify)(t))
    }
}

impl KeyExtractor for VerifiedUserKey {
    type Key = [u8; 16];
    type KeyExtractionError = NeverFails;

    fn extract(&self, req: &ServiceRequest) -> Result<Self::Key, Self::KeyExtractionError> {
        let user = self.user(req);
        Ok(key(
            "user-or-ip",
            KeyKind::UserOrIp,
            &self.address.of(req),
            None,
            user.as_deref(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::test::TestRequest;

    fn req(peer: &str, headers: &[(&str, &str)]) -> ServiceRequest {
        let mut r = TestRequest::default().peer_addr(peer.parse().expect("socket addr"));
        for (k, v) in headers {
            r = r.insert_header((*k, *v));
        }
        r.to_srv_request()
    }

    #[test]
    fn masked_ip_groups_an_ipv6_prefix_and_unmaps_ipv4() {
        let k = MaskedIpKey::default();
        let a = k.extract(&req("[2001:db8:1:100::1]:1", &[])).expect("key");
        let b = k.extract(&req("[2001:db8:1:1ff::2]:1", &[])).expect("key");
        let c = k.extract(&req("[2001:db8:1:200::1]:1", &[])).expect("key");
        assert_eq!(a, b, "same /56");
        assert_ne!(a, c, "another /56");
        let mapped = k.extract(&req("[::ffff:192.0.2.7]:1", &[])).expect("key");
        let plain = k.extract(&req("192.0.2.7:1", &[])).expect("key");
        assert_eq!(mapped, plain);
    }

    #[test]
    fn agents_behind_one_nat_get_their_own_keys() {
        let k = AgentDeviceKey::default();
        let a = k
            .extract(&req("192.0.2.7:1", &[("x-agent-id", "agent-a")]))
            .expect("key");
        let b = k
            .extract(&req("192.0.2.7:1", &[("x-agent-id", "agent-b")]))
            .expect("key");
        let none = k.extract(&req("192.0.2.7:1", &[])).expect("key");
        assert_ne!(a, b);
        assert_ne!(a, none);
        assert_eq!(
            a,
            keys::digest("ip+agent", "192.0.2.7:agent-a"),
            "the digest of the gateway's principal key"
        );
    }

    #[test]
    fn verified_user_or_ip_fallback() {
        let k = VerifiedUserKey::new(Arc::new(|t: &str| (t == "good").then(|| "u1".to_owned())))
            .with_cookie("__session");
        let by_header = k
            .extract(&req("192.0.2.7:1", &[("authorization", "Bearer good")]))
            .expect("key");
        let by_cookie = k
            .extract(&req("198.51.100.1:1", &[("cookie", "a=b; __session=good")]))
            .expect("key");
        assert_eq!(by_header, by_cookie, "the user, wherever they call from");
        let forged = k
            .extract(&req("192.0.2.7:1", &[("authorization", "Bearer forged")]))
            .expect("key");
        let anonymous = k.extract(&req("192.0.2.7:1", &[])).expect("key");
        assert_eq!(
            forged, anonymous,
            "a token that does not verify falls back to the IP"
        );
        assert_eq!(anonymous, keys::digest("user-or-ip", "ip:192.0.2.7"));
    }

    #[actix_web::test]
    async fn governor_meters_each_agent_separately() {
        use actix_governor::{Governor, GovernorConfigBuilder};
        use actix_web::{test, web, App, HttpResponse};
        let conf = GovernorConfigBuilder::default()
            .seconds_per_request(60)
            .burst_size(1)
            .key_extractor(AgentDeviceKey::default())
            .finish()
            .expect("quota");
        let app = test::init_service(
            App::new()
                .wrap(Governor::new(&conf))
                .route("/hb", web::post().to(HttpResponse::Ok)),
        )
        .await;
        let call = |agent: &'static str| {
            test::TestRequest::post()
                .uri("/hb")
                .peer_addr("192.0.2.7:5000".parse().expect("addr"))
                .insert_header(("x-agent-id", agent))
                .to_request()
        };
        assert_eq!(
            test::call_service(&app, call("agent-a")).await.status(),
            200
        );
        assert_eq!(
            test::call_service(&app, call("agent-a")).await.status(),
            429
        );
        assert_eq!(
            test::call_service(&app, call("agent-b")).await.status(),
            200,
            "same NAT, own bucket"
        );
    }

    #[test]
    fn trusted_proxy_forwarded_address_is_used() {
        let address = ClientAddress {
            trusted: TrustedProxies::new(
                vec!["10.0.0.0/8".parse().expect("net")],
                Default::default(),
            ),
            ipv6_prefix: 56,
        };
        let k = MaskedIpKey { address };
        let via_proxy = k
            .extract(&req("10.1.2.3:1", &[("x-forwarded-for", "203.0.113.9")]))
            .expect("key");
        assert_eq!(via_proxy, keys::digest("ip", "203.0.113.9"));
        let direct = k
            .extract(&req(
                "198.51.100.1:1",
                &[("x-forwarded-for", "203.0.113.9")],
            ))
            .expect("key");
        assert_eq!(
            direct,
            keys::digest("ip", "198.51.100.1"),
            "an untrusted peer's header is ignored"
        );
    }
}
