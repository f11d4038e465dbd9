//! Per-client shares of a bounded resource: how many of something (open WebSockets, admission
//! slots) one client address holds at once, each address bounded by the same limit.
//!
//! A client address is the limiter's client IP ([`crate::client_ip`]: the peer, or the
//! rightmost untrusted hop behind trusted proxies), normalised as keys are
//! ([`crate::keys::normalize_ip`]): an IPv4-mapped IPv6 address is its IPv4 address, and an
//! IPv6 address counts as its prefix (a /56 by default), so one host cannot spread itself over
//! the addresses of its own network.
//!
//! [`ClientShares`] keeps one count per address that holds something now, and nothing for
//! the others: its size is bounded by what is held in all, never by how many addresses asked.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::hash::Hash;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Arc;

/// The client address of a request from `peer` with `headers`, as the limiter's keys read it:
/// the peer, or the rightmost untrusted hop behind the `trusted` proxies, normalised
/// ([`client_address`]: IPv4-mapped IPv6 as IPv4, IPv6 masked to `prefix`).
pub(crate) fn request_address(
    peer: Option<std::net::SocketAddr>,
    headers: &actix_web::http::header::HeaderMap,
    trusted: &crate::client_ip::TrustedProxies,
    prefix: u8,
) -> IpAddr {
    let peer = peer.map_or(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), |a| a.ip());
    let forwarded = headers
        .get_all(trusted.header.header_name())
        .map(actix_web::http::header::HeaderValue::as_bytes);
    client_address(
        crate::client_ip::client_ip(peer, forwarded, trusted),
        prefix,
    )
}

/// `ip` as the per-client counts key it: IPv4 (an IPv4-mapped address as its IPv4 address), or
/// the IPv6 prefix of `v6_prefix` bits (clamped to 32..=64, as keys are) with the rest zero.
pub(crate) fn client_address(ip: IpAddr, v6_prefix: u8) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => {
            let prefix = u32::from(v6_prefix.clamp(32, 64));
            let mask = u128::MAX << (128 - prefix);
            IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask))
        }
    }
}

/// How many of a resource each client holds now, each at most `limit`: a client address by
/// default, or any other key (`crate::shaping::in_flight` counts principals). An entry lives
/// only while its client holds a unit, so the table never holds more entries than units out.
#[derive(Debug)]
pub(crate) struct ClientShares<K = IpAddr> {
    limit: usize,
    held: Mutex<HashMap<K, usize>>,
}

/// One unit of a client's share; given back when dropped.
#[derive(Debug)]
pub(crate) struct ClientHold<K: Copy + Eq + Hash = IpAddr> {
    shares: Arc<ClientShares<K>>,
    addr: K,
    /// Whether the client held nothing before this unit.
    first: bool,
}

impl<K: Copy + Eq + Hash> ClientHold<K> {
    /// Whether this is the only unit its address holds (it held none before).
    pub(crate) fn is_first(&self) -> bool {
        self.first
    }
}

impl<K: Copy + Eq + Hash> ClientShares<K> {
    /// Shares of at most `limit` per client (at least 1).
    pub(crate) fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            limit: limit.max(1),
            held: Mutex::new(HashMap::new()),
        })
    }

    /// The most one address may hold.
    pub(crate) fn limit(&self) -> usize {
        self.limit
    }

    /// One more unit for `addr`, or `None` when it already holds `limit`.
    pub(crate) fn take(self: &Arc<Self>, addr: K) -> Option<ClientHold<K>> {
        let mut held = self.held.lock();
        let n = held.entry(addr).or_insert(0);
        if *n >= self.limit {
            return None;
        }
        let first = *n == 0;
        *n += 1;
        Some(ClientHold {
            shares: self.clone(),
            addr,
            first,
        })
    }

    /// How many units `addr` holds now.
    #[cfg(test)]
    pub(crate) fn held_by(&self, addr: K) -> usize {
        self.held.lock().get(&addr).copied().unwrap_or(0)
    }

    /// How many addresses hold at least one unit now.
    #[cfg(test)]
    pub(crate) fn holders(&self) -> usize {
        self.held.lock().len()
    }
}

impl<K: Copy + Eq + Hash> ClientHold<K> {
    /// The client this unit is counted against.
    pub(crate) fn addr(&self) -> K {
        self.addr
    }
}

impl<K: Copy + Eq + Hash> Drop for ClientHold<K> {
    fn drop(&mut self) {
        let mut held = self.shares.held.lock();
        if let Some(n) = held.get_mut(&self.addr) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                held.remove(&self.addr);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("an address")
    }

    #[test]
    fn addresses_are_normalised_as_keys_are() {
        for (raw, prefix) in [
            ("203.0.113.7", 56),
            ("::ffff:203.0.113.7", 56),
            ("2001:db8:aa:bbcc:1:2:3:4", 56),
            ("2001:db8:aa:bbcc:1:2:3:4", 48),
            ("2001:db8:aa:bbcc:1:2:3:4", 64),
            ("2001:db8:aa:bbcc:1:2:3:4", 8),
            ("2001:db8:aa:bbcc:1:2:3:4", 128),
            ("::1", 56),
        ] {
            let a = client_address(ip(raw), prefix);
            let key = crate::keys::normalize_ip(ip(raw), prefix);
            let shown = match a {
                IpAddr::V4(v4) => v4.to_string(),
                IpAddr::V6(v6) => format!("{v6}/{}", prefix.clamp(32, 64)),
            };
            assert_eq!(shown, key, "{raw} /{prefix}");
        }
        // One /56: every host in it is one client; the next /56 is another.
        assert_eq!(
            client_address(ip("2001:db8:0:ff::1"), 56),
            client_address(ip("2001:db8:0:1::9"), 56)
        );
        assert_ne!(
            client_address(ip("2001:db8:0:100::1"), 56),
            client_address(ip("2001:db8:0:ff::1"), 56)
        );
        assert_eq!(
            client_address(ip("::ffff:10.1.2.3"), 56),
            ip("10.1.2.3"),
            "IPv4-mapped is the IPv4 client"
        );
    }

    #[test]
    fn each_address_holds_at_most_its_limit_and_gives_back_on_drop() {
        let shares = ClientShares::new(2);
        let (a, b) = (ip("192.0.2.1"), ip("192.0.2.2"));
        let a1 = shares.take(a).expect("first");
        let a2 = shares.take(a).expect("second");
        assert!(shares.take(a).is_none(), "a third is over the limit");
        let b1 = shares.take(b).expect("another address has its own share");
        assert_eq!((shares.held_by(a), shares.held_by(b)), (2, 1));
        assert_eq!(shares.holders(), 2);
        drop(a1);
        assert_eq!(shares.held_by(a), 1);
        let _a3 = shares.take(a).expect("one came back");
        drop(a2);
        drop(b1);
        assert_eq!(shares.held_by(b), 0);
        assert_eq!(
            shares.holders(),
            1,
            "an address holding nothing is forgotten"
        );
    }

    #[test]
    fn many_addresses_asking_leave_nothing_behind() {
        let shares = ClientShares::new(1);
        for i in 0..10_000u32 {
            let addr = IpAddr::V4(std::net::Ipv4Addr::from(i));
            let held = shares.take(addr).expect("each has a share");
            assert!(shares.take(addr).is_none());
            drop(held);
        }
        assert_eq!(shares.holders(), 0);
        assert_eq!(
            ClientShares::<IpAddr>::new(0).limit(),
            1,
            "a share is never zero"
        );
    }

    #[test]
    fn shares_are_exact_across_threads() {
        let shares = ClientShares::new(3);
        let addr = ip("198.51.100.1");
        let taken: usize = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| {
                    let shares = shares.clone();
                    s.spawn(move || shares.take(addr))
                })
                .collect();
            let holds: Vec<_> = handles
                .into_iter()
                .filter_map(|h| h.join().expect("joined"))
                .collect();
            assert_eq!(shares.held_by(addr), holds.len());
            holds.len()
        });
        assert_eq!(taken, 3);
        assert_eq!(shares.held_by(addr), 0);
    }
}
