//! The decision endpoint's questions (src/http/forward_auth.rs): how it reads the original
//! method and URI from the headers each proxy sends, and the target it then meters.
//!
//! Input, as text: the first line is the path asked at (`0` `/nginx`, `1` `/caddy`, else
//! `/envoy`) and a character picking the `[path]` rules; the second line the check request's
//! own method and target (for `/envoy`); every further line a header, `name: value`.
//!
//! Held: a question is answered only when none of the four original-request headers is sent
//! twice, no path-override header (`X-Original-URL`, `X-Rewrite-URL`, any case, `_` for `-`)
//! is sent, and every original header present names exactly what the path reads; the method
//! and URI read are those headers' bytes; a metered path is the URI's path part, is its own
//! canonical form, and the URI holds no `#`; a `#` refusal points at a `#`.
#![no_main]

use fleet_limiter::fuzzing::{
    forward_auth, header_map, method_overrides, path_exact, path_parse, path_rules,
};
use fuzz_support::first_line;
use libfuzzer_sys::fuzz_target;

const ORIGINAL: [&str; 4] = [
    "x-original-method",
    "x-original-uri",
    "x-forwarded-method",
    "x-forwarded-uri",
];

fn is_override(name: &str) -> bool {
    let n = name.replace('_', "-").to_ascii_lowercase();
    n == "x-original-url" || n == "x-rewrite-url"
}

fuzz_target!(|data: &[u8]| {
    let (head, rest) = first_line(data);
    let (envoy_line, rest) = first_line(rest);
    let flavour = match head.first() {
        Some(b'0') => 0,
        Some(b'1') => 1,
        _ => 2,
    };
    let rules = path_rules(head.get(1).copied().unwrap_or(0) & 0x7f);
    let Ok(envoy_line) = std::str::from_utf8(envoy_line) else {
        return;
    };
    let (envoy_method, envoy_target) = envoy_line.split_once(' ').unwrap_or((envoy_line, "/"));
    let pairs: Vec<(&[u8], &[u8])> = rest
        .split(|&b| b == b'\n')
        .filter_map(|l| {
            let colon = l.iter().position(|&b| b == b':')?;
            let value = &l[colon + 1..];
            let value = value.strip_prefix(b" ").unwrap_or(value);
            Some((&l[..colon], value))
        })
        .collect();
    let (headers, kept) = header_map(&pairs);
    let got = forward_auth(&headers, flavour, (envoy_method, envoy_target), rules);
    assert_eq!(
        got,
        forward_auth(&headers, flavour, (envoy_method, envoy_target), rules),
        "not deterministic"
    );
    let Ok(q) = got else { return };
    if q.method.is_empty() && q.uri.is_empty() {
        // The URI was refused as it was read (not UTF-8).
        assert_eq!(q.path.map_err(|r| r.0), Err("invalid-utf8"));
        return;
    }
    let values = |name: &str| {
        kept.iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
            .collect::<Vec<_>>()
    };
    for name in ORIGINAL {
        assert!(values(name).len() <= 1, "{name} sent twice, yet answered");
    }
    assert!(
        !kept.iter().any(|(n, _)| is_override(n)),
        "a path-override header, yet answered"
    );
    // What the path reads.
    let (method, uri) = match flavour {
        0 => (values("x-original-method")[0], values("x-original-uri")[0]),
        1 => (
            values("x-forwarded-method")[0],
            values("x-forwarded-uri")[0],
        ),
        _ => (
            envoy_method.as_bytes(),
            envoy_target
                .strip_prefix("/envoy")
                .unwrap_or(envoy_target)
                .as_bytes(),
        ),
    };
    assert_eq!(q.method.as_bytes(), method);
    assert_eq!(q.uri.as_bytes(), uri);
    for (i, name) in ORIGINAL.iter().enumerate() {
        for v in values(name) {
            let read = if i % 2 == 0 { method } else { uri };
            assert_eq!(v, read, "{name} names something else than what was read");
        }
    }
    assert!(!q.method.is_empty() && q.method.bytes().all(|b| b.is_ascii_alphabetic()));
    assert!(q.uri.len() <= 8 * 1024);
    match &q.path {
        Ok(p) => {
            assert!(!q.uri.contains('#'));
            let path_part = q.uri.split('?').next().unwrap_or("");
            assert_eq!(p, path_part, "the metered path is not the URI's path");
            assert_eq!(
                path_parse(p, rules).as_deref(),
                Ok(p.as_str()),
                "a metered path that is not canonical"
            );
            assert_eq!(path_exact(p, rules).as_deref(), Ok(p.as_str()));
            let query = q.uri.split_once('?').map(|(_, q)| q);
            let _ = method_overrides(&headers, query, true);
        }
        Err(("fragment", at)) => assert_eq!(q.uri.as_bytes().get(*at), Some(&b'#')),
        Err((_, at)) => assert!(*at <= q.uri.len()),
    }
});
