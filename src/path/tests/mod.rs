//! Canonicalisation and the exact form, example by example.

use super::bytes::{is_literal, literal_by_definition};
use super::*;

#[cfg(test)]
mod properties;

#[test]
fn path_override_headers_are_read_in_every_spelling() {
    for name in [
        "x-original-url",
        "X-Original-URL",
        "x_original_url",
        "X-REWRITE-URL",
        "x-rewrite_url",
    ] {
        assert!(is_path_override_header(name), "{name}");
    }
    for name in [
        "x-original-uri",
        "x-original-urls",
        "x-rewrite",
        "",
        "original-url",
    ] {
        assert!(!is_path_override_header(name), "{name}");
    }
}

fn canon(p: &str) -> Result<String, Class> {
    CanonicalPath::parse(p, PathRules::STRICT)
        .map(|c| c.as_str().to_owned())
        .map_err(|r| r.class)
}

fn all_allowed() -> PathRules {
    Class::ALL
        .into_iter()
        .fold(PathRules::STRICT, PathRules::allowing)
}

#[test]
fn the_literal_table_is_the_definition() {
    for b in 0..=255u8 {
        assert_eq!(is_literal(b), literal_by_definition(b), "byte {b}");
    }
    assert!(is_literal(b'a') && is_literal(b'@') && is_literal(b'~'));
    assert!(!is_literal(b'/') && !is_literal(b';') && !is_literal(b'%') && !is_literal(0x80));
}

#[test]
fn ordinary_paths_are_already_canonical_and_borrowed() {
    for p in [
        "/",
        "/api/agent/heartbeat",
        "/api/agent/heartbeat/",
        "/API/Agent/Enroll",
        "/a.b/c..d/.hidden",
        "/v1/items/abc-123_x~y",
        "/x/a:b@c!$&'()*+,=",
    ] {
        let c = CanonicalPath::parse(p, PathRules::STRICT).unwrap();
        assert_eq!(c.as_str(), p);
        assert!(!c.is_rewritten(), "{p}");
    }
}

#[test]
fn spellings_resolve_to_one_path() {
    for (sent, canonical) in [
        ("/api/agent/%72otate-key", "/api/agent/rotate-key"),
        (
            "/api/agent/%2e%2e/agent/rotate-key",
            "/api/agent/rotate-key",
        ),
        ("/api/agent/.%2E/agent/rotate-key", "/api/agent/rotate-key"),
        ("/api/x/../agent/rotate-key", "/api/agent/rotate-key"),
        ("/api//agent///rotate-key", "/api/agent/rotate-key"),
        ("//x/api/agent/rotate-key", "/x/api/agent/rotate-key"),
        ("/api/./agent/./rotate-key", "/api/agent/rotate-key"),
        ("/../../api/tasks", "/api/tasks"),
        ("/api/tasks/..", "/api/"),
        ("/api/tasks/.", "/api/tasks/"),
        ("/api/tasks//", "/api/tasks/"),
        ("", "/"),
        ("//", "/"),
        ("/%41pi", "/Api"),
        ("/a%2a", "/a%2A"),
        ("/a%3f", "/a%3F"),
        ("/a%25", "/a%25"),
        ("/a%252e%252e", "/a%252e%252e"),
        ("/caf\u{e9}", "/caf%C3%A9"),
        ("/caf%c3%a9", "/caf%C3%A9"),
        ("/a%20b", "/a%20b"),
        ("/a%21", "/a%21"),
        ("/a!", "/a!"),
        ("/a|b", "/a%7Cb"),
    ] {
        assert_eq!(canon(sent).as_deref(), Ok(canonical), "{sent:?}");
    }
}

#[test]
fn ambiguous_spellings_are_refused_by_class() {
    for (sent, class) in [
        ("/api/agent/%FF/%2e%2e/rotate-key", Class::InvalidUtf8),
        ("/%FF/%2e%2e/api/tasks", Class::InvalidUtf8),
        ("/api/agent/%c0%ae%c0%ae/rotate-key", Class::InvalidUtf8),
        ("/api/%e2%82", Class::InvalidUtf8),
        ("/api/%zz", Class::InvalidEscape),
        ("/api/%2", Class::InvalidEscape),
        ("/api/%", Class::InvalidEscape),
        ("/api%2fagent/rotate-key", Class::EncodedSlash),
        ("/api%5Cagent/rotate-key", Class::EncodedSlash),
        ("/api\\agent\\rotate-key", Class::Backslash),
        ("/api/agent/rotate-key;x=1", Class::Semicolon),
        ("/api/agent/rotate-key%3B", Class::Semicolon),
        ("/api/cli/auth/refresh;x", Class::Semicolon),
        ("/api/agent/rotate-key%00", Class::Control),
        ("/api/agent/rotate-key%0a", Class::Control),
        ("/api/agent/rotate-key%7F", Class::Control),
        ("/api/agent/rotate-key.", Class::SegmentEdge),
        ("/api/agent/rotate-key%2e", Class::SegmentEdge),
        ("/api/agent/rotate-key%20", Class::SegmentEdge),
        ("/api/agent/%20rotate-key", Class::SegmentEdge),
        ("/api/agent/rotate-key%C2%A0", Class::SegmentEdge),
        ("/api/agent/.../rotate-key", Class::SegmentEdge),
    ] {
        assert_eq!(canon(sent), Err(class), "{sent:?}");
    }
}

#[test]
fn the_offset_points_at_the_culprit() {
    let r = CanonicalPath::parse("/api/x%2Fy", PathRules::STRICT).unwrap_err();
    assert_eq!(r.at, 6);
    let r = CanonicalPath::parse("/api/agent/rotate-key.", PathRules::STRICT).unwrap_err();
    assert_eq!(r.at, 11);
}

#[test]
fn allowed_classes_keep_the_bytes_as_sent_and_still_resolve_dots() {
    let all = all_allowed();
    let c = |p: &str| CanonicalPath::parse(p, all).unwrap().as_str().to_owned();
    // The escape that was refused stays; the dot segments next to it are still resolved.
    assert_eq!(
        c("/api/agent/%FF/%2e%2e/rotate-key"),
        "/api/agent/rotate-key"
    );
    assert_eq!(c("/api/%ff/x"), "/api/%FF/x");
    assert_eq!(c("/a%2fb"), "/a%2Fb");
    assert_eq!(c("/a\\b"), "/a\\b");
    assert_eq!(c("/a;b"), "/a;b");
    assert_eq!(c("/a%3bb"), "/a%3Bb");
    assert_eq!(c("/a%00"), "/a%00");
    assert_eq!(c("/a%zz"), "/a%25zz");
    assert_eq!(c("/a."), "/a.");
    // Each class alone allows only itself.
    let only_semicolon = PathRules::STRICT.allowing(Class::Semicolon);
    assert!(CanonicalPath::parse("/a;b", only_semicolon).is_ok());
    assert_eq!(
        CanonicalPath::parse("/a%2Fb;c", only_semicolon)
            .unwrap_err()
            .class,
        Class::EncodedSlash
    );
}

#[test]
fn canonical_paths_are_fixed_points() {
    let samples = [
        "/api/agent/%FF/%2e%2e/rotate-key",
        "/a%zz/%2F/\\/;/%00/x./%C0%AE/caf\u{e9}/%7e/..",
        "//x/../y/./%2e%2E/z/",
    ];
    for rules in [PathRules::STRICT, all_allowed()] {
        for s in samples {
            if let Ok(once) = CanonicalPath::parse(s, rules) {
                let twice = CanonicalPath::parse(once.as_str(), rules).unwrap();
                assert_eq!(once.as_str(), twice.as_str());
                assert!(!twice.is_rewritten(), "{s:?} -> {once}");
            }
        }
    }
}

#[test]
fn non_paths_pass_unchanged() {
    assert_eq!(canon("*").as_deref(), Ok("*"));
}

fn exact(p: &str, rules: PathRules) -> Result<String, (Class, usize)> {
    CanonicalPath::exact(p, rules)
        .map(|c| c.as_str().to_owned())
        .map_err(|r| (r.class, r.at))
}

#[test]
fn exact_takes_a_canonical_path_as_it_is() {
    for p in [
        "/",
        "/api/agent/rotate-key",
        "/api/agent/rotate-key/",
        "/API/Agent/Enroll",
        "/a.b/c..d/.hidden",
        "/x/a:b@c!$&'()*+,=",
        "/caf%C3%A9",
        "/a%2A%21%3F%23%25",
        "/a%20b",
    ] {
        let c = CanonicalPath::exact(p, PathRules::STRICT).unwrap();
        assert_eq!(c.as_str(), p);
        assert!(!c.is_rewritten(), "{p}");
    }
}

#[test]
fn exact_refuses_every_spelling_the_gateway_would_rewrite_naming_it() {
    use Class::*;
    for (sent, class, at) in [
        // The issue's own examples.
        ("//x/api/agent/rotate-key", EmptySegment, 1),
        ("/api/agent/download/../../cron", DotSegment, 20),
        ("/api//agent", EmptySegment, 5),
        ("/api/tasks//", EmptySegment, 11),
        ("//", EmptySegment, 1),
        ("/api/./tasks", DotSegment, 5),
        ("/api/tasks/.", DotSegment, 11),
        ("/api/tasks/..", DotSegment, 11),
        ("/..", DotSegment, 1),
        // An escaped dot segment is a dot segment, not an escape.
        ("/api/%2e%2e/agent", DotSegment, 5),
        ("/api/.%2E/agent", DotSegment, 5),
        ("/api/agent/%72otate-key", EscapeSpelling, 11),
        ("/api/agent/rotate%2Dkey", EscapeSpelling, 17),
        ("/%41pi", EscapeSpelling, 1),
        ("/a%2a", EscapeSpelling, 2),
        ("/caf%c3%a9", EscapeSpelling, 4),
        ("/caf%C3%a9", EscapeSpelling, 7),
        ("/a%3f", EscapeSpelling, 2),
        ("/caf\u{e9}", Unescaped, 4),
        ("/a|b", Unescaped, 2),
        ("/a b", Unescaped, 2),
        ("/a\"b", Unescaped, 2),
        ("/a{b}", Unescaped, 2),
        ("/a#b", Fragment, 2),
        ("/a/b#/../c", Fragment, 4),
        ("http://x/api/agent/rotate-key", NotOriginForm, 0),
        ("*", NotOriginForm, 0),
        ("", NotOriginForm, 0),
        ("api/agent", NotOriginForm, 0),
        // The first rewrite is named.
        ("/api/%72/../x", EscapeSpelling, 5),
        ("/a/../%72", DotSegment, 3),
    ] {
        assert_eq!(exact(sent, PathRules::STRICT), Err((class, at)), "{sent:?}");
        assert!(class.decision_only(), "{class}");
    }
}

#[test]
fn exact_refuses_what_parse_refuses_by_the_same_class() {
    for sent in [
        "/api/agent/%FF/%2e%2e/rotate-key",
        "/api/%zz",
        "/api%2fagent",
        "/api\\agent",
        "/api/agent/rotate-key;x=1",
        "/api/agent/rotate-key%00",
        "/api/agent/rotate-key.",
        "/api/./agent/rotate-key%3B",
    ] {
        let parsed = CanonicalPath::parse(sent, PathRules::STRICT).unwrap_err();
        let exact = CanonicalPath::exact(sent, PathRules::STRICT).unwrap_err();
        assert_eq!(parsed, exact, "{sent:?}");
    }
}

#[test]
fn an_allowed_class_passes_exact_only_when_its_bytes_are_kept() {
    let all = all_allowed();
    // Kept as sent by the gateway: taken as they are.
    for p in ["/a\\b", "/a;b", "/a%3Bb", "/a%2Fb", "/a%00", "/a.", "/a%FF"] {
        assert_eq!(exact(p, all).as_deref(), Ok(p), "{p:?}");
    }
    // Rewritten by the gateway: refused under the class that was allowed.
    assert_eq!(exact("/a%zz", all), Err((Class::InvalidEscape, 2)));
    assert_eq!(exact("/a%2fb", all), Err((Class::EscapeSpelling, 2)));
    assert_eq!(exact("/a\u{1}b", all), Err((Class::Control, 2)));
    // The decision-only classes cannot be allowed.
    for class in Class::ALL.into_iter().filter(|c| c.decision_only()) {
        assert!(!PathRules::STRICT.allowing(class).allows(class), "{class}");
        assert_eq!(class.setting(), None);
    }
    assert_eq!(exact("/a/./b", all), Err((Class::DotSegment, 3)));
}

#[test]
fn every_class_has_a_distinct_name_and_the_configurable_ones_a_setting() {
    let names: std::collections::BTreeSet<&str> = Class::ALL.iter().map(|c| c.as_str()).collect();
    assert_eq!(names.len(), Class::ALL.len());
    for class in Class::CONFIGURABLE {
        assert!(
            class.setting().is_some() && !class.decision_only(),
            "{class}"
        );
    }
    assert_eq!(
        Class::ALL.iter().filter(|c| !c.decision_only()).count(),
        Class::CONFIGURABLE.len()
    );
}
