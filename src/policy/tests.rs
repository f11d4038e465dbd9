//! Route matching, the picker over every spelling and override, and request costs.

use super::routes::Seg;
use super::*;
use crate::path::PathRules;

fn p(s: &str) -> RoutePattern {
    s.parse().unwrap()
}

fn m(pat: &str, method: &str, path: &str) -> bool {
    let n = CanonicalPath::parse(path, PathRules::STRICT).unwrap();
    let segs: Vec<&str> = n.as_str().split('/').filter(|s| !s.is_empty()).collect();
    p(pat).matches(method, &segs)
}

#[test]
fn patterns_match() {
    assert!(m("/api/agent/**", "GET", "/api/agent/heartbeat"));
    assert!(m("/api/agent/**", "GET", "/api/agent"));
    assert!(!m("/api/agent/**", "GET", "/api/agents"));
    assert!(m(
        "GET /api/agent/download/**",
        "GET",
        "/api/agent/download"
    ));
    assert!(m(
        "GET /api/agent/download/**",
        "HEAD",
        "/api/agent/download/linux/x64"
    ));
    assert!(!m(
        "GET /api/agent/download/**",
        "POST",
        "/api/agent/download"
    ));
    assert!(m("POST /api/agent/enroll", "post", "/API/Agent/Enroll/"));
    assert!(m("/api/*/x", "GET", "/api/anything/x"));
    assert!(!m("/api/*/x", "GET", "/api/x"));
    assert!(m("/a/**/z", "GET", "/a/b/c/z"));
    assert!(m("/a/**/z", "GET", "/a/z"));
}

#[test]
fn path_tricks_do_not_dodge_routes() {
    assert!(m("POST /api/agent/enroll", "POST", "/api//agent/./enroll"));
    assert!(m("POST /api/agent/enroll", "POST", "/api/agent/%65nroll"));
    assert!(m(
        "POST /api/agent/enroll",
        "POST",
        "/api/x/../agent/enroll"
    ));
    assert!(m("POST /api/agent/enroll", "POST", "/API/Agent/Enroll/"));
}

fn names(p: &Policy, method: &str, path: &str) -> Vec<String> {
    let path = CanonicalPath::parse(path, PathRules::STRICT).unwrap();
    p.applicable(method, &path, Credential::None)
        .iter()
        .map(|l| l.name.to_string())
        .collect()
}

#[test]
fn every_spelling_of_a_route_is_metered_by_its_limiter() {
    let p = Policy::new(crate::config::Config::default().limiters);
    for path in [
        "/api/agent/rotate-key",
        "/API/Agent/Rotate-Key/",
        "/api/agent/%72otate-key",
        "/api/agent/x/%2e%2e/rotate-key",
        "/api/x/../agent/rotate-key",
        "//api//agent//rotate-key",
        "/../api/agent/./rotate-key",
    ] {
        assert_eq!(names(&p, "POST", path), ["key-rotation"], "{path}");
    }
    // Dot segments move the request to the route they resolve to, as they do upstream.
    assert_eq!(
        names(&p, "GET", "/api/agent/../cron/x"),
        Vec::<String>::new()
    );
    assert_eq!(names(&p, "GET", "/api/agent/../tasks"), ["ui"]);
    assert_eq!(names(&p, "GET", "/healthz"), Vec::<String>::new());
}

#[test]
fn an_override_is_metered_as_every_method_it_could_be_routed_as() {
    let p = Policy::new(crate::config::Config::default().limiters);
    let any = |method: &str, also: &[&str], path: &str| -> Vec<String> {
        let path = CanonicalPath::parse(path, PathRules::STRICT).unwrap();
        p.picked_any(method, also, &path, Credential::None)
            .into_iter()
            .map(|i| p.limiters()[i].name.to_string())
            .collect()
    };
    // A POST that an Express app routes as GET: the download budget, and the agent one.
    assert_eq!(
        any("POST", &["GET"], "/api/agent/download/linux"),
        ["agent-device", "agent-ip", "download"]
    );
    assert_eq!(
        names(&p, "POST", "/api/agent/download/linux"),
        ["agent-device", "agent-ip"]
    );
    // A GET named POST on key rotation: key rotation's budget applies.
    assert_eq!(
        any("GET", &["POST"], "/api/agent/rotate-key"),
        ["agent-device", "agent-ip", "key-rotation"]
    );
    // Each limiter once, whatever the order and repetition of the methods named.
    assert_eq!(
        any("POST", &["GET", "HEAD", "GET"], "/api/agent/download/x"),
        any("POST", &["GET"], "/api/agent/download/x")
    );
    // Nothing named: exactly the request's own method.
    assert_eq!(
        any("POST", &[], "/api/agent/enroll"),
        names(&p, "POST", "/api/agent/enroll")
    );
}

#[test]
fn routes_are_read_in_canonical_form() {
    assert_eq!(
        p("POST /api/agent/%72otate-key").segs,
        p("POST /api/agent/rotate-key").segs
    );
    assert!(m("/caf\u{e9}/**", "GET", "/caf%C3%A9/x"));
    assert!(m("/caf\u{e9}/**", "GET", "/CAF%c3%a9/x"));
    assert!("/a%zz"
        .parse::<RoutePattern>()
        .is_ok_and(|r| r.segs == [Seg::Lit("a%25zz".into())]));
}

#[test]
fn bad_patterns_say_why() {
    assert!("api/x"
        .parse::<RoutePattern>()
        .unwrap_err()
        .contains("starts with `/`"));
    assert!("FETCH /x"
        .parse::<RoutePattern>()
        .unwrap_err()
        .contains("not an HTTP method"));
    assert!("/a/b*"
        .parse::<RoutePattern>()
        .unwrap_err()
        .contains("stand alone"));
}

#[test]
fn overlap_detection() {
    assert!(p("/api/agent/**").overlaps(&p("POST /api/agent/enroll")));
    assert!(p("/api/*/enroll").overlaps(&p("/api/agent/*")));
    assert!(!p("POST /x").overlaps(&p("GET /x")));
    assert!(!p("/api/agent/**").overlaps(&p("/api/cron/**")));
    assert!(p("/a/**/z").overlaps(&p("/a/b/**")));
    assert!(!p("/a/b").overlaps(&p("/a/b/c")));
}

#[test]
fn a_header_cost_is_honest_or_the_most() {
    let c = Cost::Header {
        name: Arc::from("x-batch-size"),
        max: crate::limiter::nonzero(50),
    };
    for (v, want) in [
        (None, 1),
        (Some(&b"7"[..]), 7),
        (Some(b" 12 "), 12),
        (Some(b"50"), 50),
        (Some(b"51"), 50),
        (Some(b"99999999999999999999999999999"), 50),
        (Some(b"0"), 50),
        (Some(b"-3"), 50),
        (Some(b"+3"), 50),
        (Some(b"3.5"), 50),
        (Some(b"0x10"), 50),
        (Some(b""), 50),
        (Some("\u{663}".as_bytes()), 50),
    ] {
        assert_eq!(c.of(v).get(), want, "{v:?}");
    }
    assert_eq!(
        Cost::Fixed(crate::limiter::nonzero(4)).of(Some(b"1")).get(),
        4
    );
    assert_eq!(Cost::default().of(None).get(), 1);
}

#[test]
fn coverage() {
    assert!(p("/api/**").covers(&p("GET /api/tasks")));
    assert!(p("/api/**").covers(&p("/api/*/x/**")));
    assert!(p("/api/*").covers(&p("/api/x")));
    assert!(!p("/api/*").covers(&p("/api/**")));
    assert!(!p("/api/x").covers(&p("/api/*")));
    assert!(!p("GET /api/**").covers(&p("/api/x")));
    assert!(!p("/api/agent/**").covers(&p("/api/**")));
    assert!(p("/**").covers(&p("/a/b/**")));
}

#[test]
fn specificity_orders_exact_over_wildcards() {
    assert!(p("POST /api/agent/enroll").specificity() > p("/api/agent/**").specificity());
    assert!(p("GET /api/agent/download/**").specificity() > p("/api/agent/**").specificity());
    assert!(p("GET /a/b").specificity() > p("/a/b").specificity());
}

#[test]
fn the_route_memo_is_bounded_and_never_answers_for_another_path() {
    let memo: RouteMemo<String> = RouteMemo::default();
    let computed = std::sync::atomic::AtomicUsize::new(0);
    let answer = |method: &str, path: &str, tag: u8| {
        memo.get_or_insert(method, path, tag, || {
            computed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            format!("{method} {path} {tag}")
        })
    };
    // A flood of fresh paths, each asked twice, from several workers at once: every answer is
    // its own, and the memo holds at most its slots.
    std::thread::scope(|s| {
        for w in 0..4u8 {
            let answer = &answer;
            s.spawn(move || {
                for i in 0..5_000 {
                    let path = format!("/api/agent/{w}/{i}");
                    for _ in 0..2 {
                        assert_eq!(answer("GET", &path, w % 2), format!("GET {path} {}", w % 2));
                    }
                }
            });
        }
    });
    assert!(memo.held() <= ROUTE_MEMO_CAP, "{}", memo.held());
    // One hot path is matched once, then read from the memo.
    let before = computed.load(std::sync::atomic::Ordering::Relaxed);
    for _ in 0..100 {
        assert_eq!(
            answer("POST", "/api/agent/heartbeat", 1),
            "POST /api/agent/heartbeat 1"
        );
    }
    assert_eq!(
        computed.load(std::sync::atomic::Ordering::Relaxed),
        before + 1
    );
    // The same path under another method or tag is another answer.
    assert_eq!(
        answer("GET", "/api/agent/heartbeat", 1),
        "GET /api/agent/heartbeat 1"
    );
    assert_eq!(
        answer("POST", "/api/agent/heartbeat", 0),
        "POST /api/agent/heartbeat 0"
    );
}

#[test]
fn body_fields_from_the_memo_are_the_fields_matched_now() {
    use crate::config::Loader;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("fleet-limiter.toml");
    std::fs::write(
        &file,
        r#"
[limiters.per-recipient]
limit = 5
window = "1h"
routes = ["POST /api/share/*"]
key = "body:recipient"

[limiters.invites]
limit = 5
window = "1h"
routes = ["POST /api/invite"]
key = "body:email+ip"

[limiters.writes-ip]
limit = 50
window = "1h"
routes = ["POST /api/share/*", "POST /api/invite"]
key = "ip"
group = "writes-ip"
"#,
    )
    .unwrap();
    let cfg = Loader::new().file(&file).load().unwrap();
    let p = Policy::new(cfg.limiters);
    let fields = |method: &str, also: &[&str], path: &str| -> Vec<String> {
        let path = CanonicalPath::parse(path, PathRules::STRICT).unwrap();
        let got = p.body_fields(method, also, &path);
        assert_eq!(got, p.fields_read(method, also, &path), "{method} {path}");
        got.iter().map(|f| f.to_string()).collect()
    };
    for _ in 0..2 {
        assert_eq!(fields("POST", &[], "/api/share/42"), ["recipient"]);
        assert_eq!(fields("POST", &[], "/api/invite"), ["email"]);
        assert_eq!(fields("GET", &[], "/api/share/42"), Vec::<String>::new());
        // A GET named POST by override reads what the POST route reads; the memo is not asked.
        assert_eq!(fields("GET", &["POST"], "/api/share/42"), ["recipient"]);
        assert_eq!(
            fields("POST", &[], "/api/agent/heartbeat"),
            Vec::<String>::new()
        );
    }
    // A flood of fresh paths never grows the memo past its slots, nor answers for another path.
    for i in 0..10_000 {
        let path = format!("/api/share/{i}");
        assert_eq!(fields("POST", &[], &path), ["recipient"]);
        assert_eq!(
            fields("POST", &[], &format!("/api/x/{i}")),
            Vec::<String>::new()
        );
    }
    assert!(p.fields.held() <= ROUTE_MEMO_CAP, "{}", p.fields.held());
    // No limiter keyed on the body: no field, and nothing remembered.
    let plain = Policy::new(crate::config::Config::default().limiters);
    let path = CanonicalPath::parse("/api/share/1", PathRules::STRICT).unwrap();
    assert!(plain.body_fields("POST", &[], &path).is_empty());
    assert_eq!(plain.fields.held(), 0);
}

#[test]
fn a_path_parameter_is_one_segment_whose_value_a_limiter_reads() {
    let r = p("POST /api/fleet/agents/{id}/checkin");
    assert_eq!(r.to_string(), "POST /api/fleet/agents/{id}/checkin");
    assert!(r.names_param("id") && !r.names_param("other"));
    let segs = ["api", "fleet", "agents", "Agent-7", "checkin"];
    assert!(r.matches("POST", &segs));
    assert_eq!(r.param("id", "POST", &segs), Some("Agent-7"), "as sent");
    assert_eq!(r.param("id", "GET", &segs), None, "another method");
    assert_eq!(
        r.param("id", "POST", &["api", "fleet", "agents", "checkin"]),
        None
    );
    // It ranks, overlaps and covers as `*` does.
    let star = p("POST /api/fleet/agents/*/checkin");
    assert_eq!(r.specificity(), star.specificity());
    assert!(r.overlaps(&star) && r.covers(&star) && star.covers(&r));
    assert!(p("/api/fleet/**").covers(&r));
    assert!(!r.covers(&p("POST /api/fleet/agents/enroll")));
    assert!(!r.overlaps(&p("POST /api/fleet/agents/enroll")));
}

#[test]
fn a_path_parameter_is_refused_where_its_place_or_name_is_unclear() {
    let e = |s: &str| s.parse::<RoutePattern>().unwrap_err();
    assert!(e("/a/**/{id}").contains("follows `**`"));
    assert!(e("/a/{id}/{id}").contains("named twice"));
    assert!(e("/a/{Id}").contains("is not a path parameter"));
    assert!(e("/a/{}").contains("is not a path parameter"));
    assert!(e("/a/{1d}").contains("is not a path parameter"));
    assert!(e(&format!("/a/{{{}}}", "x".repeat(33))).contains("is not a path parameter"));
    assert!(e("/a/x{id}").contains("stands alone"));
    assert!(e("/a/{id").contains("stands alone"));
    assert!("/a/{id}/b/{sha}".parse::<RoutePattern>().is_ok());
}

/// The policy of the built-in calibration, as configuration builds it.
fn built_in() -> Policy {
    Policy::new(crate::config::Config::default().limiters)
}

fn index(p: &Policy, name: &str) -> usize {
    p.limiters()
        .iter()
        .position(|l| &*l.name == name)
        .expect("limiter")
}

#[test]
fn a_routes_samples_fill_its_wildcards_under_the_forwarded_methods() {
    let pol = built_in();
    let fresh = pol.fresh_segment();
    assert!(!["api", "agent", "enroll", "download"].contains(&fresh.as_str()));
    let any = pol.samples(&p("/v1/**"), &["GET", "POST"]);
    let got: Vec<(&str, String)> = any.iter().map(|s| (s.method, s.path.clone())).collect();
    assert_eq!(
        got,
        [
            ("GET", "/v1".to_owned()),
            ("GET", format!("/v1/{fresh}")),
            ("GET", format!("/v1/{fresh}/{fresh}")),
            ("POST", "/v1".to_owned()),
            ("POST", format!("/v1/{fresh}")),
            ("POST", format!("/v1/{fresh}/{fresh}")),
        ]
    );
    // A route naming a method that is not forwarded has no sample.
    assert!(pol.samples(&p("TRACE /v1/**"), &["GET", "POST"]).is_empty());
    assert_eq!(pol.samples(&p("post /v1/x"), &["GET", "POST"]).len(), 1);
}

#[test]
fn the_first_request_a_limiter_meters_on_a_route_follows_precedence_and_exceptions() {
    let pol = built_in();
    let device = index(&pol, "agent-device");
    let ui = index(&pol, "ui");
    // The heartbeat's limiter meters its subtree, the method asked first, one segment filled.
    let s = pol
        .first_reached(device, &p("/api/agent/**"), &["POST", "GET"])
        .expect("reached");
    assert_eq!(s.method, "POST");
    assert_eq!(s.path, format!("/api/agent/{}", pol.fresh_segment()));
    // The enrolment route belongs to its own limiter in the agent group.
    assert!(pol
        .first_reached(device, &p("POST /api/agent/enroll"), &["POST"])
        .is_none());
    // The dashboard's limiter excepts the agents' subtree.
    assert!(pol
        .first_reached(ui, &p("/api/agent/**"), &["GET", "POST"])
        .is_none());
    assert!(pol.first_reached(ui, &p("/api/tasks"), &["GET"]).is_some());
    // Who meters one sample, and under which credentials: cli-bearer only with a CLI token.
    let on_tasks = pol.metering(&Sample {
        method: "GET",
        path: "/api/tasks".to_owned(),
    });
    let bearer = index(&pol, "cli-bearer");
    let (_, creds) = on_tasks
        .iter()
        .find(|(i, _)| *i == bearer)
        .expect("cli-bearer meters it");
    assert_eq!(creds, &[crate::identity::Credential::CliToken]);
    assert!(on_tasks.iter().any(|(i, c)| *i == ui && c.len() == 4));
}
