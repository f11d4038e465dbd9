//! Who is really calling: the peer address, unless the peer is a trusted proxy.
//!
//! Behind trusted proxies the forwarding header is walked from the right (the entries the
//! proxies appended), skipping addresses inside trusted ranges; the first untrusted address is
//! the client. A peer outside every trusted range is the client, whatever headers it sends.
//!
//! Safe fallbacks, never a panic: an entry that is not an address (`unknown`, an obfuscated
//! identifier such as `_hidden`, garbage) stops the walk and the last trusted hop seen is used;
//! an empty or missing header means the peer itself is the client.

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use std::net::IpAddr;

/// Which header trusted proxies append the client to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2`
    #[default]
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=client, for="[2001:db8::1]:443"`
    Forwarded,
}

impl ForwardedHeader {
    pub fn header_name(self) -> &'static str {
        match self {
            ForwardedHeader::XForwardedFor => "x-forwarded-for",
            ForwardedHeader::Forwarded => "forwarded",
        }
    }
}

/// The ranges whose addresses are proxies of ours, and the header they write.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TrustedProxies {
    pub ranges: Vec<IpNet>,
    pub header: ForwardedHeader,
}

impl TrustedProxies {
    pub fn new(ranges: Vec<IpNet>, header: ForwardedHeader) -> Self {
        Self { ranges, header }
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.ranges.iter().any(|n| n.contains(&ip))
    }
}

/// The client address for a request from `peer` carrying `header_values` (every instance of the
/// configured forwarding header, in order).
pub fn client_ip<'a, I>(peer: IpAddr, header_values: I, trusted: &TrustedProxies) -> IpAddr
where
    I: IntoIterator<Item = &'a [u8]>,
{
    if !trusted.contains(peer) {
        return peer;
    }
    let mut entries: Vec<&[u8]> = Vec::new();
    for value in header_values {
        entries.extend(value.split(|b| *b == b','));
    }
    let mut client = peer;
    for raw in entries.iter().rev() {
        let parsed = match trusted.header {
            ForwardedHeader::XForwardedFor => parse_xff_entry(raw),
            ForwardedHeader::Forwarded => parse_forwarded_element(raw),
        };
        match parsed {
            Some(ip) => {
                client = ip;
                if !trusted.contains(ip) {
                    return ip;
                }
            }
            // Not an address: we cannot see past it. The last hop we could read stands.
            None => return client,
        }
    }
    client
}

fn trim(raw: &[u8]) -> &[u8] {
    raw.trim_ascii()
}

/// One `X-Forwarded-For` entry: `1.2.3.4`, `1.2.3.4:5678`, `2001:db8::1`, `[2001:db8::1]:443`.
fn parse_xff_entry(raw: &[u8]) -> Option<IpAddr> {
    let s = std::str::from_utf8(trim(raw)).ok()?;
    parse_node(s)
}

/// One RFC 7239 element (`for=...;proto=https;by=...`): the `for` parameter's node.
fn parse_forwarded_element(raw: &[u8]) -> Option<IpAddr> {
    let s = std::str::from_utf8(trim(raw)).ok()?;
    for pair in s.split(';') {
        let (k, v) = pair.split_once('=')?;
        if k.trim().eq_ignore_ascii_case("for") {
            let v = v.trim();
            let v = v
                .strip_prefix('"')
                .and_then(|x| x.strip_suffix('"'))
                .unwrap_or(v);
            return parse_node(v);
        }
    }
    None
}

/// A node: an address, optionally with a port, optionally bracketed, optionally with a zone.
fn parse_node(s: &str) -> Option<IpAddr> {
    let s = s.trim();
    if s.is_empty() || s.len() > 64 {
        return None;
    }
    if let Some(rest) = s.strip_prefix('[') {
        let (addr, _) = rest.split_once(']')?;
        return parse_addr(addr);
    }
    if let Some(ip) = parse_addr(s) {
        return Some(ip);
    }
    // `a.b.c.d:port`
    let (host, port) = s.rsplit_once(':')?;
    if port.chars().all(|c| c.is_ascii_digit()) && host.contains('.') {
        return host.parse::<std::net::Ipv4Addr>().ok().map(IpAddr::V4);
    }
    None
}

fn parse_addr(s: &str) -> Option<IpAddr> {
    let without_zone = s.split('%').next().unwrap_or(s);
    without_zone.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn xff(ranges: &[&str]) -> TrustedProxies {
        TrustedProxies::new(
            ranges.iter().map(|r| r.parse().unwrap()).collect(),
            ForwardedHeader::XForwardedFor,
        )
    }

    fn fwd(ranges: &[&str]) -> TrustedProxies {
        TrustedProxies::new(
            ranges.iter().map(|r| r.parse().unwrap()).collect(),
            ForwardedHeader::Forwarded,
        )
    }

    fn run(peer: &str, headers: &[&str], t: &TrustedProxies) -> IpAddr {
        client_ip(ip(peer), headers.iter().map(|h| h.as_bytes()), t)
    }

    #[test]
    fn untrusted_peer_cannot_spoof() {
        let t = xff(&[]);
        assert_eq!(run("198.51.100.7", &["1.1.1.1"], &t), ip("198.51.100.7"));
        let t = xff(&["10.0.0.0/8"]);
        assert_eq!(run("198.51.100.7", &["1.1.1.1"], &t), ip("198.51.100.7"));
    }

    #[test]
    fn rightmost_untrusted_wins() {
        let t = xff(&["10.0.0.0/8"]);
        // The client put a fake entry first; the proxy appended the real one.
        assert_eq!(
            run("10.0.0.2", &["6.6.6.6, 203.0.113.9, 10.0.0.1"], &t),
            ip("203.0.113.9")
        );
    }

    #[test]
    fn all_header_instances_in_order() {
        let t = xff(&["10.0.0.0/8"]);
        assert_eq!(
            run("10.0.0.2", &["6.6.6.6", "203.0.113.9"], &t),
            ip("203.0.113.9")
        );
        assert_eq!(
            run("10.0.0.2", &["203.0.113.9", "10.1.1.1"], &t),
            ip("203.0.113.9")
        );
    }

    #[test]
    fn ports_brackets_zones_and_mapped() {
        let t = xff(&["10.0.0.0/8"]);
        assert_eq!(
            run("10.0.0.2", &["203.0.113.9:4711"], &t),
            ip("203.0.113.9")
        );
        assert_eq!(
            run("10.0.0.2", &["[2001:db8::1]:443"], &t),
            ip("2001:db8::1")
        );
        assert_eq!(run("10.0.0.2", &["fe80::1%eth0"], &t), ip("fe80::1"));
        // A trusted peer seen as IPv4-mapped IPv6 is still trusted.
        assert_eq!(
            run("::ffff:10.0.0.2", &["203.0.113.9"], &t),
            ip("203.0.113.9")
        );
    }

    #[test]
    fn malformed_entries_fall_back_to_last_readable_hop() {
        let t = xff(&["10.0.0.0/8"]);
        assert_eq!(run("10.0.0.2", &["unknown"], &t), ip("10.0.0.2"));
        assert_eq!(run("10.0.0.2", &["garbage, 10.0.0.1"], &t), ip("10.0.0.1"));
        assert_eq!(run("10.0.0.2", &[""], &t), ip("10.0.0.2"));
        assert_eq!(run("10.0.0.2", &[], &t), ip("10.0.0.2"));
        assert_eq!(run("10.0.0.2", &[",,,"], &t), ip("10.0.0.2"));
        let long = "9".repeat(10_000);
        assert_eq!(run("10.0.0.2", &[long.as_str()], &t), ip("10.0.0.2"));
        // Non-UTF-8 bytes never panic.
        let bad: &[u8] = &[0xff, 0xfe, b',', b'1'];
        assert_eq!(client_ip(ip("10.0.0.2"), [bad], &t), ip("10.0.0.2"));
    }

    #[test]
    fn all_trusted_chain_yields_leftmost() {
        let t = xff(&["10.0.0.0/8"]);
        assert_eq!(run("10.0.0.2", &["10.9.9.9, 10.0.0.1"], &t), ip("10.9.9.9"));
    }

    #[test]
    fn rfc7239_forwarded() {
        let t = fwd(&["10.0.0.0/8"]);
        assert_eq!(
            run(
                "10.0.0.2",
                &["for=6.6.6.6, for=203.0.113.9;proto=https, for=10.0.0.1"],
                &t
            ),
            ip("203.0.113.9")
        );
        assert_eq!(
            run("10.0.0.2", &["for=\"[2001:db8:cafe::17]:4711\""], &t),
            ip("2001:db8:cafe::17")
        );
        assert_eq!(run("10.0.0.2", &["For=203.0.113.9"], &t), ip("203.0.113.9"));
        assert_eq!(run("10.0.0.2", &["for=unknown"], &t), ip("10.0.0.2"));
        assert_eq!(
            run("10.0.0.2", &["for=_hidden, for=10.0.0.1"], &t),
            ip("10.0.0.1")
        );
        assert_eq!(run("10.0.0.2", &["proto=https"], &t), ip("10.0.0.2"));
        // With Forwarded configured, a spoofed X-Forwarded-For is not read at all (the caller
        // passes only Forwarded values), so this is the untouched peer.
        assert_eq!(run("10.0.0.2", &[], &t), ip("10.0.0.2"));
    }
}
