//! In-flight caps per principal (`max_in_flight`, `in_flight_key`): at most N
//! requests of one principal at the upstream at once on a shaped route.
//!
//! The principal is the client address (normalised as keys are), or with `in_flight_key =
//! "user"` the verified token's subject, falling back to the address for a request with no
//! verified token. A subject is kept as a digest, never as the raw value. An entry lives only
//! while its principal has a request in flight, so the table never holds more entries than
//! there are requests in flight.

use crate::client_share::{ClientHold, ClientShares};
use sha2::{Digest, Sha256};
use std::net::IpAddr;

/// Who a cap counts: a tag (0: an address, 1: a verified user) and 16 bytes (the address as
/// IPv6, or the first bytes of the subject's SHA-256).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Principal([u8; 17]);

impl Principal {
    /// A client address, normalised.
    pub(crate) fn address(ip: IpAddr) -> Self {
        let v6 = match ip {
            IpAddr::V4(v4) => v4.to_ipv6_mapped(),
            IpAddr::V6(v6) => v6,
        };
        let mut k = [0u8; 17];
        k[1..].copy_from_slice(&v6.octets());
        Self(k)
    }

    /// What it is, as an answer names it: `address` or `user`.
    pub(crate) fn describe(&self) -> &'static str {
        if self.0[0] == 1 {
            "user"
        } else {
            "address"
        }
    }

    /// A verified token's subject (digested).
    pub(crate) fn user(sub: &str) -> Self {
        let mut h = Sha256::new();
        h.update(b"fleet-limiter in-flight user\0");
        h.update(sub.as_bytes());
        let d = h.finalize();
        let mut k = [0u8; 17];
        k[0] = 1;
        k[1..].copy_from_slice(&d[..16]);
        Self(k)
    }
}

/// What each principal has in flight on one route, each at most its limit: the client shares
/// admission control and WebSockets count addresses with, here keyed by principal.
pub(crate) type InFlight = ClientShares<Principal>;

/// One request's place; given back when dropped.
pub(crate) type Place = ClientHold<Principal>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_principal_holds_at_most_its_limit_and_nothing_stays_behind() {
        let t = InFlight::new(2);
        let a = Principal::address("198.51.100.7".parse().unwrap());
        let u = Principal::user("analyst-1");
        let v = Principal::user("analyst-2");
        let (a1, a2) = (t.take(a), t.take(a));
        assert!(a1.is_some() && a2.is_some());
        assert!(t.take(a).is_none(), "a third from the address");
        assert!(
            t.take(u).is_some() && t.take(v).is_some(),
            "users count apart"
        );
        drop(a1);
        assert!(t.take(a).is_some(), "a place given back is taken again");
        drop(a2);
        assert_eq!(t.holders(), 0, "every place given back leaves nothing");
        // An IPv4 address and its IPv4-mapped IPv6 spelling are one principal; a user whose
        // subject spells an address is not that address.
        assert_eq!(
            Principal::address("192.0.2.1".parse().unwrap()),
            Principal::address("::ffff:192.0.2.1".parse().unwrap())
        );
        assert_ne!(
            Principal::user("192.0.2.1"),
            Principal::address("192.0.2.1".parse().unwrap())
        );
    }
}
