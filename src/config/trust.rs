//! `client_ip.trust_proxy` must name proxies, not the whole address space.
//!
//! A trusted peer's forwarding header decides the client IP. When every address is trusted,
//! every client can send `X-Forwarded-For` and pick the IP it is metered as, and with it a
//! fresh budget per request. That is refused unless `client_ip.trust_all_addresses` says the
//! gateway is reachable only through a proxy that overwrites the header.

use super::{ConfigError, Ctx};
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use std::net::Ipv4Addr;

/// Which whole address family the trusted ranges cover: `"every IPv4 address"`,
/// `"every IPv6 address"`, `"every IPv4 and IPv6 address"`, or `None`.
///
/// A range of prefix length 0 covers its family; so does a union of ranges (`0.0.0.0/1` and
/// `128.0.0.0/1`). IPv4-mapped IPv6 ranges (`::ffff:0:0/96`) count as the IPv4 addresses they
/// map.
pub(crate) fn covers_everything(ranges: &[IpNet]) -> Option<&'static str> {
    let mut v4: Vec<Ipv4Net> = Vec::new();
    let mut v6: Vec<Ipv6Net> = Vec::new();
    for r in ranges {
        match r {
            IpNet::V4(n) => v4.push(*n),
            IpNet::V6(n) => {
                v6.push(*n);
                if let Some(mapped) = as_ipv4(n) {
                    v4.push(mapped);
                }
            }
        }
    }
    let all4 = Ipv4Net::aggregate(&v4).iter().any(|n| n.prefix_len() == 0);
    let all6 = Ipv6Net::aggregate(&v6).iter().any(|n| n.prefix_len() == 0);
    match (all4, all6) {
        (true, true) => Some("every IPv4 and IPv6 address"),
        (true, false) => Some("every IPv4 address"),
        (false, true) => Some("every IPv6 address"),
        (false, false) => None,
    }
}

/// The IPv4 range an IPv4-mapped IPv6 range (`::ffff:a.b.c.d/96+n`) stands for.
fn as_ipv4(n: &Ipv6Net) -> Option<Ipv4Net> {
    let mapped = Ipv6Net::new(Ipv4Addr::UNSPECIFIED.to_ipv6_mapped(), 96).ok()?;
    if !mapped.contains(n) {
        return None;
    }
    let v4 = n.network().to_ipv4_mapped()?;
    Ipv4Net::new(v4, n.prefix_len() - 96).ok()
}

/// Refuse trusted ranges that cover a whole address family unless `acknowledged`.
pub(super) fn check(ctx: &Ctx, ranges: &[IpNet], acknowledged: bool) -> Result<(), ConfigError> {
    let Some(what) = covers_everything(ranges) else {
        return Ok(());
    };
    if acknowledged {
        return Ok(());
    }
    let listed: Vec<String> = ranges.iter().map(|r| format!("`{r}`")).collect();
    Err(ctx.err(
        "client_ip.trust_proxy",
        format!(
            "the trusted ranges {} cover {what}, so every client could send X-Forwarded-For (or Forwarded) and choose its own client IP, and with it its own budget; list only the addresses of your proxies (e.g. \"10.0.0.0/8\"). Only if the gateway is reachable solely through a proxy that overwrites the header, acknowledge it with client_ip.trust_all_addresses = true (FLEET_LIMITER_TRUST_ALL_ADDRESSES=true)",
            listed.join(", ")
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|s| s.parse().expect("net")).collect()
    }

    #[test]
    fn whole_families_are_recognised() {
        for (list, expected) in [
            (&["0.0.0.0/0"][..], Some("every IPv4 address")),
            (&["::/0"], Some("every IPv6 address")),
            (&["0.0.0.0/0", "::/0"], Some("every IPv4 and IPv6 address")),
            (
                &["10.0.0.1/32", "0.0.0.0/1", "128.0.0.0/1"],
                Some("every IPv4 address"),
            ),
            (
                &["0.0.0.0/2", "64.0.0.0/2", "128.0.0.0/2", "192.0.0.0/2"],
                Some("every IPv4 address"),
            ),
            (&["::/1", "8000::/1"], Some("every IPv6 address")),
            (&["::ffff:0:0/96"], Some("every IPv4 address")),
            (
                &["::ffff:0:0/97", "128.0.0.0/1"],
                Some("every IPv4 address"),
            ),
        ] {
            assert_eq!(covers_everything(&nets(list)), expected, "{list:?}");
        }
        for list in [
            &[][..],
            &["10.0.0.0/8", "::1/128"],
            &["0.0.0.0/1", "128.0.0.0/2"],
            &["::/1"],
            &["::ffff:0:0/97"],
            &["2001:db8::/32", "fd00::/8"],
            &["0.0.0.0/1", "::/1"],
            &["::/64"],
        ] {
            assert_eq!(covers_everything(&nets(list)), None, "{list:?}");
        }
    }
}
