//! `[roles]` and `fleet-limiter routes`, against the real binary: the built-in route map, an
//! API of another shape mapped onto the calibration's roles (`routes`, `explain`, and a
//! heartbeat flood on the mapped route meeting its limiter while other agents pass), `check`'s
//! warnings about routes that reach nothing, and hostile `[roles]` tables refused by name.

mod common;

#[macro_use]
#[path = "support/macros.rs"]
mod macros;

use common::{client, Exited, Launch};
use serde_json::Value;
use std::time::Duration;

/// How long a command may run before the test gives up on it (a deadline, not a measurement).
const LIMIT: Duration = Duration::from_secs(120);

/// An agent API whose agents live under `/v1/agents/`.
const V1: &str = r#"
[roles]
agent = ["/v1/agents/**"]
enrollment = ["POST /v1/agents/enroll"]
"#;

fn cli(args: &[&str]) -> Launch {
    Launch::command(args.iter().copied())
        .current_dir(common::manifest_dir())
        .unset("FLEET_LIMITER_ALLOW_UNSAFE_CALIBRATION")
        .unset("FLEET_LIMITER_LOG")
}

fn run(args: &[&str]) -> Exited {
    cli(args).run(LIMIT)
}

/// `args` with `--config <file>` holding `toml`.
fn run_with(toml: &str, args: &[&str]) -> Exited {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("fleet-limiter.toml");
    std::fs::write(&path, toml).expect("write config");
    let mut argv: Vec<String> = args.iter().map(|s| (*s).to_owned()).collect();
    argv.push("--config".to_owned());
    argv.push(path.display().to_string());
    let out = cli(&argv.iter().map(String::as_str).collect::<Vec<_>>()).run(LIMIT);
    drop(dir);
    out
}

/// The line of `table` that starts with `start`.
fn line<'a>(table: &'a str, start: &str) -> &'a str {
    table
        .lines()
        .find(|l| l.starts_with(start))
        .unwrap_or_else(|| panic!("no line starts with {start:?}:\n{table}"))
}

#[test]
fn routes_prints_the_built_in_map_with_the_heartbeat_on_agent_device() {
    let out = run(&["routes"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let agents = line(&out.stdout, "/api/agent/**");
    assert!(agents.contains("agent-device (ip+agent)"), "{agents}");
    assert!(agents.contains("agent-ip (ip, new agent ids)"), "{agents}");
    let heartbeat = line(&out.stdout, "heartbeat");
    assert!(
        heartbeat.contains("POST /api/agent/heartbeat"),
        "{heartbeat}"
    );
    assert!(heartbeat.contains("agent-device (ip+agent)"), "{heartbeat}");
    // The enrolment route is the enrolment limiter's, and the agent-ip ceiling leaves it.
    let enroll = line(&out.stdout, "POST /api/agent/enroll");
    assert!(enroll.contains("enrollment (ip)"), "{enroll}");
    assert!(!enroll.contains("agent-ip"), "{enroll}");
    snap!("routes_default_table", out.stdout);

    let json = run(&["routes", "--format", "json"]);
    assert_eq!(json.code, Some(0), "{}", json.stderr);
    let v: Value = serde_json::from_str(&json.stdout).expect("JSON");
    let hb = v["requests"]
        .as_array()
        .and_then(|a| a.iter().find(|r| r["request"] == "heartbeat"))
        .expect("the heartbeat request");
    assert_eq!(hb["path"], "/api/agent/heartbeat");
    assert_eq!(hb["limiters"][0]["limiter"], "agent-device");
    assert_eq!(hb["limiters"][0]["key"], "ip+agent");
    assert_eq!(hb["limiters"][0]["role"], "agent");

    // check --format json carries the same map.
    let check = run(&["check", "--format", "json"]);
    let c: Value = serde_json::from_str(&check.stdout).expect("JSON");
    assert_eq!(c["routes"], v);
    assert_eq!(c["route_warnings"], Value::Array(vec![]));
}

#[test]
fn a_roles_table_moves_the_agent_limiters_onto_the_apis_own_routes() {
    let out = run_with(V1, &["routes"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let agents = line(&out.stdout, "/v1/agents/**");
    assert!(agents.contains("agent-device (ip+agent)"), "{agents}");
    assert!(agents.contains("agent-ip (ip, new agent ids)"), "{agents}");
    let enroll = line(&out.stdout, "POST /v1/agents/enroll");
    assert!(enroll.contains("enrollment (ip)"), "{enroll}");
    assert!(!enroll.contains("agent-ip"), "{enroll}");
    let heartbeat = line(&out.stdout, "heartbeat");
    assert!(heartbeat.contains("POST /v1/agents/"), "{heartbeat}");
    assert!(heartbeat.contains("agent-device"), "{heartbeat}");
    assert!(!out.stdout.contains("/api/agent/**"), "{}", out.stdout);
    // The check judges the heartbeat on the mapped route: a budget that cannot carry it is unsafe.
    let unsafe_budget = format!("{V1}\n[limiters.agent-device]\nlimit = 1\nwindow = \"15m\"\n");
    let judged = run_with(&unsafe_budget, &["check"]);
    assert_eq!(judged.code, Some(1), "{}", judged.stdout);
    assert!(judged.stdout.contains("agent-device"), "{}", judged.stdout);
}

#[actix_rt::test]
async fn a_heartbeat_flood_on_the_mapped_route_meets_its_limiter_and_other_agents_pass() {
    let up = common::upstream().await;
    let gw = Launch::serve()
        .config_toml(V1)
        .upstream(&up.uri())
        .admin()
        .spawn();
    let explained = run(&[
        "explain",
        "--admin",
        &gw.admin(""),
        "--method",
        "POST",
        "--path",
        "/v1/agents/checkin",
        "--ip",
        "203.0.113.9",
        "-H",
        "X-Agent-ID: host-1",
    ]);
    assert_eq!(explained.code, Some(0), "{}", explained.stderr);
    let v: Value = serde_json::from_str(&explained.stdout).expect("JSON");
    let names: Vec<&str> = v["limiters"]
        .as_array()
        .expect("limiters")
        .iter()
        .filter_map(|l| l["name"].as_str().or(l["limiter"].as_str()))
        .collect();
    assert!(names.contains(&"agent-device"), "{}", explained.stdout);
    assert!(names.contains(&"agent-ip"), "{}", explained.stdout);
    assert!(!names.contains(&"ui"), "{}", explained.stdout);

    let http = client();
    let send = |agent: &'static str| {
        http.post(gw.url("/v1/agents/checkin"))
            .header("X-Agent-ID", agent)
            .send()
    };
    // agent-device: 30 a minute per agent.
    for i in 0..30 {
        let r = send("host-1").await.expect("request");
        assert_eq!(r.status(), 200, "request {i}");
    }
    let refused = send("host-1").await.expect("request");
    assert_eq!(refused.status(), 429);
    let retry: u64 = refused
        .headers()
        .get("retry-after")
        .and_then(|h| h.to_str().ok())
        .and_then(|s| s.parse().ok())
        .expect("Retry-After in seconds");
    assert!((1..=60).contains(&retry), "{retry}");
    let body: Value = refused.json().await.expect("problem+json");
    assert_eq!(body["status"], 429, "{body}");
    for agent in ["host-2", "host-3"] {
        assert_eq!(send(agent).await.expect("request").status(), 200, "{agent}");
    }
    // The old path is no agent route any more: it meets the dashboard's limiter only.
    let old = run(&[
        "explain",
        "--admin",
        &gw.admin(""),
        "--method",
        "POST",
        "--path",
        "/api/agent/heartbeat",
        "--ip",
        "203.0.113.9",
        "-H",
        "X-Agent-ID: host-1",
    ]);
    assert!(!old.stdout.contains("agent-device"), "{}", old.stdout);
}

#[test]
fn check_warns_on_a_role_left_with_no_route_and_a_route_that_matches_nothing() {
    // The dashboard role mapped onto the agents' routes, which its limiter excepts.
    let shadowed = run_with("[roles]\ndashboard = [\"/api/agent/**\"]\n", &["check"]);
    assert_eq!(shadowed.code, Some(0), "{}", shadowed.stderr);
    assert!(
        shadowed
            .stderr
            .contains("roles.dashboard: role `dashboard`")
            && shadowed.stderr.contains("is left with no route"),
        "{}",
        shadowed.stderr
    );
    assert!(
        shadowed
            .stderr
            .contains("its own exception `/api/agent/**` covers it"),
        "{}",
        shadowed.stderr
    );
    assert!(shadowed
        .stderr
        .contains("fleet-limiter.toml: roles.dashboard"));

    // Every limiter of a role off.
    let off = run_with("[limiters.ui]\nmode = \"off\"\n", &["check"]);
    assert_eq!(off.code, Some(0), "{}", off.stderr);
    assert!(
        off.stderr
            .contains("limiters.ui.mode: is \"off\", so role `dashboard`"),
        "{}",
        off.stderr
    );

    // A method the gateway never forwards, and paths in shapes no request has.
    let slips = run_with(
        "[roles]\ndownload = [\"TRACE /dl/**\"]\nagent = [\"/v1//agents/**\", \"/v1/agents?id=1\"]\n",
        &["check", "--format", "json"],
    );
    assert_eq!(slips.code, Some(0), "{}", slips.stderr);
    let v: Value = serde_json::from_str(&slips.stdout).expect("JSON");
    let warnings: Vec<&str> = v["route_warnings"]
        .as_array()
        .expect("route_warnings")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let has = |s: &str| warnings.iter().any(|w| w.contains(s));
    assert!(
        has("roles.download: route `TRACE /dl/**` can match no request"),
        "{warnings:?}"
    );
    assert!(
        has("roles.agent: route `/v1//agents/**` is written with an empty segment"),
        "{warnings:?}"
    );
    assert!(
        has("roles.agent: route `/v1/agents?id=1` is written with a `?`"),
        "{warnings:?}"
    );
    assert!(slips.stderr.contains("warning: "), "{}", slips.stderr);

    // The built-in calibration warns about nothing.
    let clean = run(&["check"]);
    assert!(!clean.stderr.contains("warning"), "{}", clean.stderr);
}

#[actix_rt::test]
async fn serve_starts_with_the_route_warnings_logged() {
    let up = common::upstream().await;
    let gw = Launch::serve()
        .config_toml("[roles]\nagent = [\"/v1//agents/**\"]\n")
        .upstream(&up.uri())
        .spawn();
    let r = client()
        .post(gw.url("/v1/agents/checkin"))
        .header("X-Agent-ID", "host-1")
        .send()
        .await
        .expect("request");
    assert_eq!(r.status(), 200);
    assert!(
        gw.stderr()
            .contains("route `/v1//agents/**` is written with an empty segment"),
        "{}",
        gw.stderr()
    );
}

#[test]
fn hostile_roles_tables_are_refused_naming_the_field() {
    let long = format!("[roles]\nagent = [\"/{}\"]\n", "a".repeat(2000));
    let many = format!(
        "[roles]\nagent = [{}]\n",
        (0..65)
            .map(|i| format!("\"/v1/a{i}/**\""))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let cases: Vec<(String, &str)> = vec![
        ("[roles]\nagnet = [\"/v1/**\"]\n".into(), "roles.agnet: `agnet` is not a role (did you mean `agent`?)"),
        ("[roles]\nagent-device = [\"/v1/**\"]\n".into(), "roles.agent-device: `agent-device` is not a role (did you mean `agent`?)"),
        ("[roles]\nheartbeat = [\"/v1/**\"]\n".into(), "roles.heartbeat: `heartbeat` is not a role; the roles are agent, enrollment"),
        ("[roles]\nagent = []\n".into(), "roles.agent: is empty"),
        ("[roles]\nagent = \"/v1/**\"\n".into(), "roles.agent: got string \"/v1/**\"; expected a list"),
        ("[roles]\nagent = [1]\n".into(), "roles.agent: got integer `1` in the list"),
        ("roles = [\"agent\"]\n".into(), "roles: must be a table of roles"),
        ("[roles]\nagent = [\"v1/agents\"]\n".into(), "roles.agent: `v1/agents`: a route is `[METHOD ]/path`"),
        ("[roles]\nagent = [\"FETCH /v1\"]\n".into(), "roles.agent: `FETCH /v1`: `FETCH` is not an HTTP method"),
        ("[roles]\nagent = [\"/v1/agents*\"]\n".into(), "roles.agent: `/v1/agents*`: `*` and `**` must stand alone"),
        ("[roles]\nagent = [\"/v1/a\", \"/V1/%61\"]\n".into(), "roles.agent: lists `/V1/%61` twice"),
        ("[roles]\nagent = [\"/v1/./a/\", \"/v1/a\"]\n".into(), "roles.agent: lists `/v1/a` twice"),
        ("[roles]\nagent = [\"/v1/**\"]\ndownload = [\"/v1/**\"]\n".into(), "roles.download: route `/v1/**` overlaps `/v1/**` of role `agent`"),
        (long, "roles.agent: a route of 2001 bytes is longer than 1024"),
        (many, "roles.agent: lists 65 routes; list at most 64"),
        // The safety checks hold on the mapped routes: agent-device keyed on the agent id with
        // no address ceiling beside it on /v1 is refused.
        ("[roles]\nagent = [\"/v1/agents/**\"]\n[limiters.agent-ip]\nroutes = [\"/api/agent/**\"]\n".into(), "limiters.agent-device.key: `ip+agent` keys on the agent id"),
        // So does the shaping check: hints on the mapped heartbeat route must keep a heartbeat
        // inside the timeout.
        ("[roles]\nagent = [\"/v1/agents/**\"]\n[shaping.routes.hb]\nroutes = [\"/v1/agents/**\"]\ninterval = \"80s\"\n".into(), "shaping.routes.hb.interval: hints of up to 120s on the heartbeat route"),
    ];
    for (toml, want) in &cases {
        for cmd in ["check", "routes"] {
            let out = run_with(toml, &[cmd]);
            assert_eq!(out.code, Some(2), "{cmd} {toml}: {}", out.stderr);
            assert!(out.stderr.contains(want), "{cmd} {toml}:\n{}", out.stderr);
            assert!(
                out.stderr.contains("fleet-limiter.toml: "),
                "{}",
                out.stderr
            );
        }
    }
    let served = Launch::serve()
        .config_toml("[roles]\nagnet = [\"/v1/**\"]\n")
        .run(LIMIT);
    assert_eq!(served.code, Some(2), "{}", served.stderr);
    assert!(served.stderr.contains("roles.agnet"), "{}", served.stderr);
}
