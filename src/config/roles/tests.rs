use super::*;
use crate::config::{defaults, Config, Loader};

fn load(toml: &str) -> Result<Config, String> {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("c.toml");
    std::fs::write(&path, toml).expect("write");
    Loader::new().file(&path).load().map_err(|e| e.to_string())
}

fn routes_of(cfg: &Config, name: &str) -> (Vec<String>, Vec<String>) {
    let l = cfg
        .limiters
        .iter()
        .find(|l| &*l.name == name)
        .expect("limiter");
    let s = |v: &[RoutePattern]| v.iter().map(|r| r.to_string()).collect();
    (s(&l.routes), s(&l.except))
}

#[test]
fn every_built_in_limiter_serves_one_role() {
    for b in defaults::LIMITERS {
        assert!(role_of(b.name).is_some(), "{} has no role", b.name);
    }
    assert_eq!(role_of("agent-ip").map(|r| r.name), Some("agent"));
    assert_eq!(role_of("ui").map(|r| r.name), Some("dashboard"));
    assert!(role_of("my-limiter").is_none());
    for r in ROLES {
        for l in r.limiters {
            assert!(defaults::LIMITERS.iter().any(|b| b.name == *l), "{l}");
        }
    }
}

#[test]
fn the_exceptions_standing_for_roles_are_the_built_in_ones() {
    for b in defaults::LIMITERS {
        let listed: Vec<&str> = EXCEPT_ROLES
            .iter()
            .filter(|(l, _, _)| *l == b.name)
            .map(|(_, p, _)| *p)
            .collect();
        if b.name != "agent-ip" {
            assert_eq!(listed, b.except, "{}", b.name);
        }
    }
    // No roles: the tables are left exactly as given.
    let given = apply(BTreeMap::new(), &RoleMap::default());
    assert!(given.is_empty());
    assert_eq!(
        Config::default().limiters,
        load("").expect("empty file").limiters
    );
}

#[test]
fn a_role_moves_its_limiters_and_the_exceptions_that_stand_for_it() {
    let cfg = load("[roles]\nagent = [\"/v1/agents/**\"]\n").expect("loads");
    assert_eq!(routes_of(&cfg, "agent-device").0, ["/v1/agents/**"]);
    // The ceiling follows agent-device.
    assert_eq!(routes_of(&cfg, "agent-ip").0, ["/v1/agents/**"]);
    // The dashboard leaves the agents' new routes, and keeps leaving the old lifecycle ones
    // (their roles are not mapped).
    assert_eq!(
        routes_of(&cfg, "ui").1,
        [
            "/api/agent/**",
            "/v1/agents/**",
            "/api/cron/**",
            "/api/cli/auth/**"
        ]
    );
    assert_eq!(
        routes_of(&cfg, "api-key").1,
        ["/api/agent/**", "/v1/agents/**", "/api/cron/**"]
    );
    // Every agent-facing role mapped: the old subtree is no exception any more.
    let all = load(
        "[roles]\nagent = [\"/v1/agents/**\"]\nenrollment = [\"POST /v1/enroll\"]\ndownload = [\"GET /v1/dl/**\"]\nkey-rotation = [\"POST /v1/rotate\"]\n",
    )
    .expect("loads");
    assert_eq!(
        routes_of(&all, "cli-bearer").1,
        [
            "/v1/agents/**",
            "POST /v1/enroll",
            "GET /v1/dl/**",
            "POST /v1/rotate",
            "/api/cron/**"
        ]
    );
    // The ceiling leaves the lifecycle routes to their own limiters.
    assert_eq!(
        routes_of(&all, "agent-ip").1,
        ["POST /v1/enroll", "GET /v1/dl/**", "POST /v1/rotate"]
    );
}

#[test]
fn a_limiters_own_routes_and_exceptions_win_over_its_role() {
    let cfg = load(
        "[roles]\nagent = [\"/v1/agents/**\"]\ndashboard = [\"/v1/**\"]\n[limiters.agent-device]\nroutes = [\"/v2/agents/**\"]\n[limiters.ui]\nexcept = [\"/v1/agents/**\"]\n",
    )
    .expect("loads");
    assert_eq!(routes_of(&cfg, "agent-device").0, ["/v2/agents/**"]);
    assert_eq!(
        routes_of(&cfg, "ui"),
        (vec!["/v1/**".to_owned()], vec!["/v1/agents/**".to_owned()])
    );
}

#[test]
fn near_names_are_suggested_and_far_ones_are_not() {
    assert_eq!(nearest("agnet"), Some("agent"));
    assert_eq!(nearest("Dashboard"), Some("dashboard"));
    assert_eq!(nearest("key_rotation"), Some("key-rotation"));
    assert_eq!(nearest("ui"), Some("dashboard"));
    assert_eq!(nearest("cli-device-poll"), Some("device-poll"));
    assert_eq!(nearest("heartbeat"), None);
}

#[test]
fn the_route_map_and_its_warnings_follow_the_roles() {
    use crate::config::check::routes::{route_map, route_warnings};
    assert!(route_warnings(&Config::default()).is_empty());
    let cfg = load("[roles]\nagent = [\"/v1/agents/**\"]\n").expect("loads");
    let map = route_map(&cfg);
    let hb = map
        .requests
        .iter()
        .find(|r| r.request == "heartbeat")
        .expect("the heartbeat");
    assert_eq!(
        (hb.method.as_str(), hb.path.as_str()),
        ("POST", "/v1/agents/x")
    );
    let names: Vec<&str> = hb.limiters.iter().map(|m| m.limiter.as_str()).collect();
    assert_eq!(names, ["agent-device", "agent-ip"]);
    let line = map
        .routes
        .iter()
        .find(|r| r.route == "/v1/agents/**")
        .expect("the agents' route");
    assert_eq!(line.roles, ["agent"]);
    let shadowed = load("[roles]\ndashboard = [\"/api/agent/**\"]\n").expect("loads");
    let w = route_warnings(&shadowed);
    assert_eq!(w.len(), 2, "{w:?}");
    assert!(w.iter().all(|l| l.contains(": roles.dashboard: ")), "{w:?}");
}
