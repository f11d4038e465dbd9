//! The canonical path (src/path): `CanonicalPath::parse` under the default rules, with every
//! configurable class allowed, and with the classes the input's first byte picks.
//!
//! Held for every path `p` and its canonical form `c`:
//! - the one-pass check agrees with the full parse: when it passes `p`, the full parse gives
//!   `p` back; otherwise `parse` is the full parse;
//! - `c` is its own canonical form (idempotent), and the decision endpoint takes it as it is
//!   (`exact(c) == c`) when it is a path;
//! - `exact(p)` takes `p` only when `p` is its own canonical form;
//! - length: each byte of `p` that may be written as an escape (`%XX`) grows by at most two
//!   bytes and nothing else grows, so `len(c) <= max(1, len(p) + 2 * k)` with `k` the bytes of
//!   `p` that are neither `/` nor a character that stands for itself (`\` and `;` kept raw when
//!   allowed are not counted either);
//! - `c` holds only what a canonical path may: `/`, characters that stand for themselves,
//!   escapes `%XX` with upper-case hex digits, and `\` or `;` only when allowed; no empty, `.`
//!   or `..` segment, and no segment ending in `.` unless segment edges are allowed.
#![no_main]

use fleet_limiter::fuzzing::{
    path_exact, path_fast_check, path_full, path_literal, path_parse, path_rules,
};
use fleet_limiter::PathRules;
use libfuzzer_sys::fuzz_target;

/// Bits of `fuzzing::path_rules`, in `Class::CONFIGURABLE` order.
const BACKSLASH: u8 = 1 << 3;
const SEMICOLON: u8 = 1 << 4;
const SEGMENT_EDGE: u8 = 1 << 6;

fn check(p: &str, bits: u8) {
    let rules: PathRules = path_rules(bits);
    let parsed = path_parse(p, rules);
    let full = path_full(p, rules);
    if path_fast_check(p) {
        assert_eq!(
            full.as_deref(),
            Ok(p),
            "the one-pass check passed a path the full parse rewrites"
        );
        assert_eq!(parsed.as_deref(), Ok(p));
    } else {
        assert_eq!(parsed, full, "parse is not the full parse");
    }
    // The decision endpoint takes a path only as its own canonical form.
    if let Ok(e) = path_exact(p, rules) {
        assert_eq!(e, p, "exact returned another path");
        assert_eq!(parsed.as_deref(), Ok(p), "exact took a path parse rewrites");
    }
    let Ok(c) = parsed else { return };
    assert_eq!(
        path_parse(&c, rules).as_deref(),
        Ok(c.as_str()),
        "not idempotent: {p:?} -> {c:?}"
    );
    if p.is_empty() {
        assert_eq!(c, "/", "an empty path is the root");
        return;
    }
    if !p.starts_with('/') {
        assert_eq!(c, p, "a target that is not a path is returned as it is");
        return;
    }
    assert_eq!(
        path_exact(&c, rules).as_deref(),
        Ok(c.as_str()),
        "the decision endpoint refuses a canonical path {c:?}"
    );

    // The length bound.
    let kept_raw =
        |b: u8| (b == b'\\' && bits & BACKSLASH != 0) || (b == b';' && bits & SEMICOLON != 0);
    let k = p
        .bytes()
        .filter(|&b| b != b'/' && !path_literal(b) && !kept_raw(b))
        .count();
    let bound = (p.len() + 2 * k).max(1);
    assert!(
        c.len() <= bound,
        "{p:?} ({} bytes, {k} escapable) -> {c:?} ({} bytes) over {bound}",
        p.len(),
        c.len()
    );
    if k == 0 {
        assert!(
            c.len() <= p.len(),
            "nothing to escape, yet {p:?} -> {c:?} grew"
        );
    }

    // What a canonical path is made of.
    let b = c.as_bytes();
    assert_eq!(b.first(), Some(&b'/'));
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hex = |x: Option<&u8>| {
                    x.is_some_and(|d| d.is_ascii_digit() || (b'A'..=b'F').contains(d))
                };
                assert!(
                    hex(b.get(i + 1)) && hex(b.get(i + 2)),
                    "a bad escape in {c:?}"
                );
                i += 3;
                continue;
            }
            b'\\' => assert!(bits & BACKSLASH != 0, "a raw backslash in {c:?}"),
            b';' => assert!(bits & SEMICOLON != 0, "a raw semicolon in {c:?}"),
            b'/' => {}
            x => assert!(path_literal(x), "byte {x:#04x} raw in {c:?}"),
        }
        i += 1;
    }
    let segments: Vec<&str> = c[1..].split('/').collect();
    for (n, seg) in segments.iter().enumerate() {
        let last = n + 1 == segments.len();
        assert!(!seg.is_empty() || last, "an empty segment in {c:?}");
        assert!(*seg != "." && *seg != "..", "a dot segment in {c:?}");
        if bits & SEGMENT_EDGE == 0 {
            assert!(!seg.ends_with('.'), "a segment ending in `.` in {c:?}");
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(p) = std::str::from_utf8(data) else {
        return;
    };
    // The default rules refuse every class; then all allowed; then those the first byte picks.
    assert_eq!(path_rules(0), PathRules::default());
    check(p, 0);
    check(p, 0x7f);
    if let Some(&first) = data.first() {
        check(p, first & 0x7f);
    }
});
