use super::*;

fn wire(limiter: &str, m: &str, limit: u64, window: &str, expires: Option<&str>) -> Wire {
    Wire {
        id: None,
        limiter: limiter.to_owned(),
        matcher: m.to_owned(),
        limit,
        window: window.to_owned(),
        expires: expires.map(str::to_owned),
        source: None,
        by: None,
        created: None,
    }
}

fn who<'a>(
    ip: &str,
    agent: Option<&'a str>,
    user: Option<&'a str>,
    claims: &'a TokenClaims,
) -> Who<'a> {
    Who {
        ip: ip.parse().unwrap(),
        agent_id: agent,
        user,
        claims,
        body: &[],
    }
}

struct Wall(std::sync::atomic::AtomicU64);
impl WallClock for Wall {
    fn unix_now(&self) -> u64 {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

#[test]
fn matches_parse_and_print_back() {
    for (given, shown) in [
        ("ip:203.0.113.7", "ip:203.0.113.7"),
        ("ip:198.51.100.77/24", "ip:198.51.100.0/24"),
        ("ip:::ffff:203.0.113.7", "ip:203.0.113.7"),
        ("ip:2001:db8::/48", "ip:2001:db8::/48"),
        ("agent:host-*", "agent:host-*"),
        ("claim:org_id=org-*", "claim:org_id=org-*"),
        ("user:*", "user:*"),
    ] {
        let m: Match = given.parse().unwrap();
        assert_eq!(m.to_string(), shown);
        assert_eq!(m.to_string().parse::<Match>().unwrap(), m);
    }
    // Exact values are held as digests, never as written, and read back from the digest.
    let m: Match = "agent:host-17".parse().unwrap();
    let shown = m.to_string();
    assert!(
        shown.starts_with("agent:sha256:") && !shown.contains("host-17"),
        "{shown}"
    );
    assert_eq!(shown.parse::<Match>().unwrap(), m);
    let c: Match = "claim:org_id=org-42".parse().unwrap();
    assert!(!c.to_string().contains("org-42"));
}

#[test]
fn hostile_matches_are_refused_with_the_fix() {
    for bad in [
        "",
        "ip",
        "ip:",
        "ip:not-an-address",
        "ip:10.0.0.0/33",
        "agent:",
        "agent:bad id",
        "agent:a*b",
        "agent:**",
        "user:",
        "user:a b",
        "claim:org_id",
        "claim:=x",
        "claim:org id=x",
        "claim:org_id=",
        "host:foo",
        "agent:sha256:zz",
        "agent:\u{0}",
    ] {
        assert!(bad.parse::<Match>().is_err(), "{bad:?} was accepted");
    }
    let long = format!("user:{}", "a".repeat(300));
    assert!(long.parse::<Match>().unwrap_err().contains("at most"));
}

#[test]
fn the_most_specific_live_override_wins() {
    let wall = Arc::new(Wall(1_000.into()));
    let now = 1_000;
    let mk = |m: &str, limit: u64, expires: Option<&str>| {
        Override::from_wire(
            &wire("agent-device", m, limit, "1m", expires),
            Source::Admin,
            now,
        )
        .unwrap()
    };
    let o = Overrides::new(Vec::new(), wall.clone());
    assert!(o.index_if_any().is_none());
    o.add(mk("ip:203.0.113.0/24", 100, None)).unwrap();
    o.add(mk("ip:203.0.113.7", 200, None)).unwrap();
    o.add(mk("agent:host-*", 300, None)).unwrap();
    o.add(mk("agent:host-17", 400, None)).unwrap();
    o.add(mk("claim:org_id=org-4*", 500, Some("1970-01-01T00:20:00Z")))
        .unwrap();
    let claims = TokenClaims::from_pairs([("org_id", &serde_json::json!("org-42"))]);
    let none = TokenClaims::default();
    let ix = o.index_if_any().unwrap();
    let limit = |w: &Who<'_>| {
        ix.find("agent-device", w, wall.unix_now())
            .map(|o| o.limit.get())
    };
    assert_eq!(
        limit(&who("203.0.113.7", Some("host-17"), None, &none)),
        Some(400)
    );
    assert_eq!(
        limit(&who("203.0.113.7", Some("host-18"), None, &none)),
        Some(300)
    );
    assert_eq!(
        limit(&who("203.0.113.7", Some("other"), None, &none)),
        Some(200)
    );
    assert_eq!(limit(&who("203.0.113.9", None, None, &none)), Some(100));
    assert_eq!(
        limit(&who("203.0.113.9", None, Some("u"), &claims)),
        Some(500)
    );
    assert_eq!(limit(&who("198.51.100.1", None, None, &none)), None);
    assert!(ix
        .find("other-limiter", &who("203.0.113.7", None, None, &none), now)
        .is_none());
    // Past its expiry (1 200 s) the claim override stops applying.
    wall.0.store(1_200, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(
        limit(&who("203.0.113.9", None, Some("u"), &claims)),
        Some(100)
    );
    assert_eq!(o.list().len(), 4);
}

#[test]
fn instants_read_as_rfc_3339_says() {
    assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Ok(0));
    assert_eq!(parse_rfc3339("2026-12-01T18:00:00Z"), Ok(1_796_148_000));
    assert_eq!(
        parse_rfc3339("2026-12-01T20:00:00+02:00"),
        Ok(1_796_148_000)
    );
    assert_eq!(
        parse_rfc3339("2026-12-01T17:00:00-01:00"),
        Ok(1_796_148_000)
    );
    assert_eq!(parse_rfc3339("2026-12-01T18:00:00.25Z"), Ok(1_796_148_001));
    assert_eq!(parse_rfc3339("2024-02-29T00:00:00Z"), Ok(1_709_164_800));
    for bad in [
        "",
        "2026-12-01",
        "2026-12-01T18:00:00",
        "2026-13-01T18:00:00Z",
        "2023-02-29T00:00:00Z",
        "2026-12-01T24:00:00Z",
        "2026-12-01T18:00:00+2:00",
        "2026-12-01T18:00:00.Z",
        "２026-12-01T18:00:00Z",
        "1969-12-31T23:59:59Z",
    ] {
        assert!(parse_rfc3339(bad).is_err(), "{bad:?}");
    }
    for t in [0, 1_796_148_000, 1_709_164_800, 4_102_444_799] {
        assert_eq!(parse_rfc3339(&format_rfc3339(t)), Ok(t));
    }
}

#[test]
fn an_override_keeps_the_limiters_algorithm_and_lockout() {
    let o =
        Override::from_wire(&wire("l", "ip:192.0.2.1", 7, "2h", None), Source::Config, 0).unwrap();
    let base = Quota::new(
        crate::limiter::nonzero(3),
        Duration::from_secs(60),
        crate::limiter::Algorithm::FixedWindow,
    )
    .with_lockout(Some(Duration::from_secs(600)));
    let q = o.quota(&base);
    assert_eq!((q.limit(), q.window()), (7, Duration::from_secs(7200)));
    assert_eq!(q.algorithm, crate::limiter::Algorithm::FixedWindow);
    assert_eq!(q.lockout(), Some(Duration::from_secs(600)));
    for (limit, window) in [
        (0, "1m"),
        (5_000_000_000, "1m"),
        (1, "0s"),
        (1, "8d"),
        (1, "soon"),
    ] {
        assert!(Override::from_wire(
            &wire("l", "ip:192.0.2.1", limit, window, None),
            Source::Admin,
            0
        )
        .is_err());
    }
}
