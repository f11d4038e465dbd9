//! Header values the gateway reads: `X-Agent-ID` (`valid_agent_id`), a `header:<name>` key's
//! value (`valid_key_header`), `Authorization: Bearer` (`bearer_token`), a `cost_header`
//! value, the session cookie, and the client address behind trusted proxies from
//! `X-Forwarded-For` or RFC 7239 `Forwarded` (`client_ip`). The input is one value; for the
//! forwarding headers and cookies, its lines are the header's instances.
//!
//! Held: an agent id or key value counts exactly when it is 1-128 bytes of its charset, and is
//! the value itself; a bearer token is a non-empty, trimmed part of the value after a
//! `Bearer` scheme; a cost is the number sent capped at `cost_max`, and `cost_max` for anything
//! that is not a positive whole number; the client behind a trusted proxy that appended an
//! untrusted address is that address whatever came before; a peer that is not trusted is the
//! client whatever it sends.
#![no_main]

use fleet_limiter::fuzzing::{header_cost, key_header, session_cookie};
use fleet_limiter::{bearer_token, client_ip, valid_agent_id, ForwardedHeader, TrustedProxies};
use libfuzzer_sys::fuzz_target;
use std::net::IpAddr;
use std::num::NonZeroU32;

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || hay.windows(needle.len()).any(|w| w == needle)
}

fuzz_target!(|v: &[u8]| {
    // X-Agent-ID.
    let agent_ok = (1..=128).contains(&v.len())
        && v.iter()
            .all(|b| b.is_ascii_alphanumeric() || b".-_:".contains(b));
    assert_eq!(valid_agent_id(v).map(str::as_bytes), agent_ok.then_some(v));

    // A `header:<name>` key's value.
    let key_ok = (1..=128).contains(&v.len()) && v.iter().all(|b| (0x21..=0x7e).contains(b));
    assert_eq!(key_header(v).map(str::as_bytes), key_ok.then_some(v));

    // Authorization.
    if let Some(t) = bearer_token(v) {
        assert!(!t.is_empty() && t.trim() == t);
        assert!(contains(v, t.as_bytes()));
        let s = std::str::from_utf8(v).expect("a token is read only from UTF-8");
        let (scheme, _) = s
            .trim()
            .split_once(char::is_whitespace)
            .expect("a scheme and a token");
        assert!(scheme.eq_ignore_ascii_case("bearer"));
    }

    // cost_header.
    for max in [1, 7, 1000, u32::MAX] {
        let max = NonZeroU32::new(max).expect("not zero");
        let got = header_cost(Some(v), max);
        let t = v.trim_ascii();
        let want = if !t.is_empty() && t.iter().all(u8::is_ascii_digit) {
            // The number, saturating, capped; zero pays the most.
            let n = t.iter().fold(0u128, |n, d| {
                (n * 10 + u128::from(d - b'0')).min(u128::from(u64::MAX))
            });
            match n {
                0 => max.get(),
                n => n.min(u128::from(max.get())) as u32,
            }
        } else {
            max.get()
        };
        assert_eq!(
            got.get(),
            want,
            "cost of {:?} with cost_max {max}",
            String::from_utf8_lossy(v)
        );
        assert_eq!(header_cost(None, max).get(), 1);
    }

    // The session cookie: a value found is part of what was sent.
    let lines: Vec<&[u8]> = v.split(|&b| b == b'\n').collect();
    if let Some(c) = session_cookie(&lines, "__session") {
        assert!(contains(v, c.as_bytes()));
    }

    // The client address.
    let peer: IpAddr = "10.0.0.1".parse().expect("an address");
    let outsider: IpAddr = "198.51.100.7".parse().expect("an address");
    for (header, appended) in [
        (ForwardedHeader::XForwardedFor, ", 192.0.2.9".to_owned()),
        (
            ForwardedHeader::XForwardedFor,
            ",[2001:db8::9]:443".to_owned(),
        ),
        (
            ForwardedHeader::Forwarded,
            ", for=192.0.2.9;proto=https".to_owned(),
        ),
        (
            ForwardedHeader::Forwarded,
            ",For=\"[2001:db8::9]:443\"".to_owned(),
        ),
    ] {
        let trusted = TrustedProxies::new(
            vec![
                "10.0.0.0/8".parse().expect("a range"),
                "fd00::/8".parse().expect("a range"),
            ],
            header,
        );
        let got = client_ip(peer, lines.iter().copied(), &trusted);
        assert_eq!(
            got,
            client_ip(peer, lines.iter().copied(), &trusted),
            "not deterministic"
        );
        assert_eq!(
            client_ip(outsider, lines.iter().copied(), &trusted),
            outsider,
            "an untrusted peer chose its client"
        );
        // What our proxy appended to whatever came before.
        let mut last = lines.last().copied().unwrap_or_default().to_vec();
        last.extend_from_slice(appended.as_bytes());
        let mut with = lines.clone();
        with.pop();
        with.push(&last);
        let want: IpAddr = if appended.contains("2001") {
            "2001:db8::9"
        } else {
            "192.0.2.9"
        }
        .parse()
        .expect("an address");
        assert_eq!(
            client_ip(peer, with.iter().copied(), &trusted),
            want,
            "the appended client was not found after {:?}",
            String::from_utf8_lossy(v)
        );
    }
});
