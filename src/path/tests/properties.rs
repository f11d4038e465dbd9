//! Properties of the canonical form over hostile paths.

use crate::identity::Credential;
use crate::path::*;
use crate::policy::Policy;
use proptest::prelude::*;

fn all_allowed() -> PathRules {
    Class::ALL
        .into_iter()
        .fold(PathRules::STRICT, PathRules::allowing)
}

/// Paths made of the characters that matter to a path parser, and anything else.
fn hostile_path() -> impl Strategy<Value = String> {
    prop_oneof![
        "/[/.%a-fA-F0-9;\\\\ \\x00-\\x1f\\x7f~!:@+*?éＡ\u{a0}-]{0,40}",
        "(/(\\.|\\.\\.|%2[eE]|%2[eE]%2[eE]|%2[fF]|%5[cC]|%[cC]0%[aA][eE]|%[fF][fF]|api|agent|rotate-key|[A-Z]+|%7[2A]|;x|%3[bB]|%00|%20)){0,8}/?",
        any::<String>(),
    ]
}

/// A route a limiter names, and the segments of a request to it.
const ROUTES: &[(&str, &[&str])] = &[
    ("POST", &["api", "agent", "rotate-key"]),
    ("POST", &["api", "agent", "enroll"]),
    ("GET", &["api", "agent", "download", "linux"]),
    ("POST", &["api", "agent", "heartbeat"]),
    ("POST", &["api", "cli", "auth", "refresh"]),
    ("POST", &["api", "cli", "auth", "device", "code"]),
    ("GET", &["api", "tasks"]),
    ("GET", &["api", "cron", "sweep"]),
    ("GET", &["healthz"]),
];

/// One way to spell a segment: each unreserved character sent as itself or escaped, in
/// either hex case.
fn respell_segment(seg: &str, picks: &[u8]) -> String {
    let mut out = String::new();
    for (i, c) in seg.chars().enumerate() {
        match picks.get(i).copied().unwrap_or(0) % 4 {
            0 | 1 => out.push(c),
            2 => out.push_str(&format!("%{:02X}", c as u32)),
            _ => out.push_str(&format!("%{:02x}", c as u32)),
        }
    }
    out
}

/// One way to spell a whole path: respelled segments, with `//`, `./` and `x/../` detours
/// and a trailing slash here and there.
fn respell(segs: &[&str], picks: &[u8]) -> String {
    let mut out = String::new();
    let pick = |i: usize| picks.get(i).copied().unwrap_or(0);
    for (i, seg) in segs.iter().enumerate() {
        match pick(i) % 5 {
            1 => out.push_str("//"),
            2 => out.push_str("/./"),
            3 => out.push_str("/zz/%2e%2E/"),
            4 => out.push_str("/zz/.%2e/./"),
            _ => out.push('/'),
        }
        let from = (i * 7) % picks.len().max(1);
        out.push_str(&respell_segment(seg, &picks[from..]));
    }
    if pick(segs.len()) % 3 == 0 {
        out.push('/');
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    /// The canonical form of a canonical form is itself, and the one-pass check never
    /// passes a path that the full parse would change.
    #[test]
    fn canonical_form_is_idempotent(path in hostile_path()) {
        for rules in [PathRules::STRICT, all_allowed()] {
            if let Ok(once) = CanonicalPath::parse(&path, rules) {
                let twice = CanonicalPath::parse(once.as_str(), rules);
                prop_assert_eq!(twice.as_ref().map(CanonicalPath::as_str), Ok(once.as_str()));
                prop_assert!(!twice.map(|t| t.is_rewritten()).unwrap_or(true));
            }
            if is_canonical(path.as_bytes()) {
                prop_assert_eq!(canonicalize(path.as_bytes(), rules, &mut Rewrites::default()), Ok(path.clone()));
            }
        }
    }

    /// Every spelling of a route's path is the same canonical path, and so is metered by
    /// the same limiters.
    #[test]
    fn spellings_of_a_route_are_metered_alike(
        route in 0..ROUTES.len(),
        picks in proptest::collection::vec(any::<u8>(), 1..64),
    ) {
        let policy = Policy::new(crate::config::Config::default().limiters);
        let (method, segs) = ROUTES[route];
        let plain = format!("/{}", segs.join("/"));
        let spelled = respell(segs, &picks);
        let a = CanonicalPath::parse(&plain, PathRules::STRICT).unwrap();
        let b = CanonicalPath::parse(&spelled, PathRules::STRICT);
        prop_assert!(b.is_ok(), "{} refused: {:?}", spelled, b);
        let b = b.unwrap();
        prop_assert_eq!(a.as_str().trim_end_matches('/'), b.as_str().trim_end_matches('/'));
        let names = |p: &CanonicalPath<'_>| -> Vec<String> {
            policy.applicable(method, p, Credential::None).iter().map(|l| l.name.to_string()).collect()
        };
        prop_assert_eq!(names(&a), names(&b), "{}", spelled);
    }

    /// `exact` takes a path exactly when it is its own canonical form, and a refusal of a
    /// path that has one always names a spelling: no rewrite goes unnoted.
    #[test]
    fn exact_takes_only_fixed_points(path in hostile_path()) {
        for rules in [PathRules::STRICT, all_allowed()] {
            let parsed = CanonicalPath::parse(&path, rules);
            let exact = CanonicalPath::exact(&path, rules);
            let fixed = path.starts_with('/')
                && parsed.as_ref().is_ok_and(|p| p.as_str() == path);
            prop_assert_eq!(exact.is_ok(), fixed, "{:?}: {:?}", path, exact);
            if let Ok(e) = &exact {
                prop_assert_eq!(e.as_str(), path.as_str());
                prop_assert!(!e.is_rewritten());
            }
            if path.starts_with('/') {
                let mut rw = Rewrites::default();
                if let Ok(c) = canonicalize(path.as_bytes(), rules, &mut rw) {
                    prop_assert_eq!(rw.first.is_some(), c != path, "{:?} -> {:?}: {:?}", path, c, rw.first);
                }
            }
            if let (Ok(_), Err(r)) = (&parsed, &exact) {
                prop_assert!(r.class.decision_only() || rules.allows(r.class), "{:?}: {:?}", path, r);
                prop_assert!(r.at <= path.len());
            }
        }
    }

    /// Two arbitrary paths with one canonical form are metered alike.
    #[test]
    fn paths_that_canonicalise_alike_are_metered_alike(
        a in hostile_path(),
        b in hostile_path(),
    ) {
        let policy = Policy::new(crate::config::Config::default().limiters);
        if let (Ok(ca), Ok(cb)) = (
            CanonicalPath::parse(&a, PathRules::STRICT),
            CanonicalPath::parse(&b, PathRules::STRICT),
        ) {
            if ca.as_str() == cb.as_str() {
                let names = |p: &CanonicalPath<'_>| -> Vec<String> {
                    policy.applicable("POST", p, Credential::None).iter().map(|l| l.name.to_string()).collect()
                };
                prop_assert_eq!(names(&ca), names(&cb));
            }
        }
    }
}
