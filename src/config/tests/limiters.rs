//! The limiter tables: fields, key kinds, costs, counted statuses, windows, routes and their
//! precedence, and the declared fleet they must carry.

use super::*;

#[test]
fn error_unknown_limiter_with_missing_fields() {
    snap!(
        "config_error_unknown_limiter",
        file_error("[limiters.agent-devise]\nlimit = 60\n", &[])
    );
}

#[test]
fn error_zero_limit() {
    snap!(
        "config_error_zero_limit",
        file_error("[limiters.enrollment]\nlimit = 0\n", &[])
    );
    snap!(
        "config_error_negative_limit",
        file_error("[limiters.enrollment]\nlimit = -3\n", &[])
    );
}

#[test]
fn counting_failed_answers_is_opt_in_and_its_statuses_are_checked() {
    let cfg = Config::default();
    assert!(cfg.limiters.iter().all(|l| l.count == Count::All));
    let f = file("[limiters.api-key]\ncount = \"failed\"\nfailed_statuses = [\"400-499\", 503]\n");
    let cfg = Loader::new().file(&f.path).load().expect("valid");
    let l = limiter(&cfg, "api-key");
    assert_eq!(l.count, Count::Failed);
    assert_eq!(
        l.failed_statuses,
        StatusRanges(vec![(400, 499), (503, 503)])
    );
    assert!(l.gives_back(200) && l.gives_back(500) && !l.gives_back(401) && !l.gives_back(503));
    let cfg = Loader::new()
        .env([
            (
                "FLEET_LIMITER_LIMITER_CLI_BEARER_COUNT".to_owned(),
                "succeeded".to_owned(),
            ),
            (
                "FLEET_LIMITER_LIMITER_CLI_BEARER_FAILED_STATUSES".to_owned(),
                "401-403, 429".to_owned(),
            ),
        ])
        .load()
        .expect("valid");
    let l = limiter(&cfg, "cli-bearer");
    assert_eq!(l.count, Count::Succeeded);
    assert_eq!(l.failed_statuses.to_string(), "401-403, 429");
    assert!(l.gives_back(401) && !l.gives_back(200));
    assert_eq!(limiter(&cfg, "ui").failed_statuses.to_string(), "400-999");
}

const CREDENTIAL_LIMITER: &str = "[limiters.api-by-key]\nlimit = 600\nwindow = \"1m\"\nkey = \"credential\"\ncredential = \"api-key\"\nroutes = [\"/api/**\"]\nexcept = [\"/api/agent/**\", \"/api/cron/**\"]\n";

#[test]
fn the_new_key_kinds_load() {
    let f = file(&format!(
        "{CREDENTIAL_LIMITER}[limiters.per-tenant]\nlimit = 100\nwindow = \"1m\"\nkey = \"header:X-Tenant-ID\"\nroutes = [\"/tenant/**\"]\n[limiters.tenant-ip]\nlimit = 1000\nwindow = \"1m\"\nkey = \"ip\"\nroutes = [\"/tenant/**\"]\ngroup = \"tenant-ip\"\n[limiters.whole-route]\nlimit = 5\nwindow = \"1m\"\nkey = \"global\"\nroutes = [\"POST /api/exports\"]\n[client_ip]\ntrust_proxy = [\"10.0.0.0/8\"]\n"
    ));
    let cfg = Loader::new().file(&f.path).load().expect("valid");
    assert_eq!(limiter(&cfg, "api-by-key").key, KeyKind::Credential);
    let t = limiter(&cfg, "per-tenant");
    assert_eq!(t.key, KeyKind::Header(Arc::from("x-tenant-id")));
    assert_eq!(t.key.header(), Some("x-tenant-id"));
    assert_eq!(t.key.to_string(), "header:x-tenant-id");
    assert_eq!(limiter(&cfg, "whole-route").key, KeyKind::Global);
}

#[test]
fn error_new_key_kinds() {
    // Without an address-keyed limiter on every route it meters, random tokens mint buckets.
    snap!(
        "config_error_credential_unguarded",
        file_error(
            "[limiters.by-key]\nlimit = 5\nwindow = \"1m\"\nkey = \"credential\"\nroutes = [\"/reports/**\"]\n",
            &[]
        )
    );
    // The built-in api-key limiter skips /api/agent/**: so must a credential limiter it guards.
    snap!(
        "config_error_credential_partly_guarded",
        file_error(
            &CREDENTIAL_LIMITER.replace("except = [\"/api/agent/**\", \"/api/cron/**\"]\n", ""),
            &[]
        )
    );
    // A header a client behind nginx or Caddy can send itself: the same rule.
    snap!(
        "config_error_header_unguarded",
        file_error(
            "[limiters.per-tenant]\nlimit = 5\nwindow = \"1m\"\nkey = \"header:x-tenant-id\"\nroutes = [\"/t/**\"]\n[client_ip]\ntrust_proxy = [\"10.0.0.0/8\"]\n",
            &[]
        )
    );
    // A ceiling that meters only new agent ids does not bound a header: a known agent skips it.
    snap!(
        "config_error_header_behind_new_agents_ceiling",
        file_error(
            "[limiters.per-tenant]\nlimit = 5\nwindow = \"1m\"\nkey = \"header:x-tenant-id\"\nroutes = [\"/api/agent/**\"]\ngroup = \"tenant\"\n[client_ip]\ntrust_proxy = [\"10.0.0.0/8\"]\n",
            &[]
        )
    );
    // An address limiter that a more specific route of its own group displaces on part of the
    // routes does not meter that part.
    snap!(
        "config_error_credential_guard_displaced",
        file_error(
            "[limiters.by-key]\nlimit = 5\nwindow = \"1m\"\nkey = \"credential\"\nroutes = [\"/r/**\"]\n[limiters.by-ip]\nlimit = 50\nwindow = \"1m\"\nkey = \"ip\"\nroutes = [\"/r/**\"]\ngroup = \"guard\"\n[limiters.exports]\nlimit = 50\nwindow = \"1m\"\nkey = \"global\"\nroutes = [\"POST /r/exports\"]\ngroup = \"guard\"\n",
            &[]
        )
    );
    // The agent id is a client's choice too: agent-device without its ceiling, and an
    // `ip+agent` limiter of the operator's on routes no ceiling meters.
    snap!(
        "config_error_agent_device_without_ceiling",
        file_error("[limiters.agent-ip]\nmode = \"off\"\n", &[])
    );
    snap!(
        "config_error_ip_agent_unguarded",
        file_error(
            "[limiters.per-agent-reports]\nlimit = 5\nwindow = \"1m\"\nkey = \"ip+agent\"\nroutes = [\"/reports/**\"]\n",
            &[]
        )
    );
    snap!(
        "config_error_header_untrusted",
        file_error(
            "[limiters.per-tenant]\nlimit = 5\nwindow = \"1m\"\nkey = \"header:x-tenant-id\"\nroutes = [\"/t/**\"]\n",
            &[]
        )
    );
    snap!(
        "config_error_header_name",
        file_error("[limiters.ui]\nkey = \"header:x tenant\"\n", &[])
    );
    snap!(
        "config_error_header_reserved",
        file_error("[limiters.ui]\nkey = \"header:Authorization\"\n", &[])
    );
    snap!(
        "config_error_header_no_name",
        file_error("[limiters.ui]\nkey = \"header\"\n", &[])
    );
}

#[test]
fn a_cost_is_opt_in_and_never_above_the_limit() {
    assert!(Config::default()
        .limiters
        .iter()
        .all(|l| l.cost == Cost::Fixed(crate::limiter::nonzero(1))));
    let f = file("[limiters.ui]\ncost = 5\n[limiters.api-key]\ncost_header = \"X-Batch-Size\"\ncost_max = 20\n[limiters.cli-bearer]\ncost_header = \"x-items\"\n");
    let cfg = Loader::new().file(&f.path).load().expect("valid");
    assert_eq!(
        limiter(&cfg, "ui").cost,
        Cost::Fixed(crate::limiter::nonzero(5))
    );
    assert_eq!(
        limiter(&cfg, "api-key").cost,
        Cost::Header {
            name: Arc::from("x-batch-size"),
            max: crate::limiter::nonzero(20)
        }
    );
    assert_eq!(
        limiter(&cfg, "cli-bearer").cost,
        Cost::Header {
            name: Arc::from("x-items"),
            max: crate::limiter::nonzero(60)
        },
        "cost_max defaults to the limit"
    );
}

#[test]
fn error_cost() {
    snap!(
        "config_error_cost_above_limit",
        file_error("[limiters.api-key]\ncost = 61\n", &[])
    );
    snap!(
        "config_error_cost_zero",
        file_error("[limiters.api-key]\ncost = 0\n", &[])
    );
    snap!(
        "config_error_cost_max_above_limit",
        file_error(
            "[limiters.api-key]\ncost_header = \"X-Batch-Size\"\ncost_max = 1000\n",
            &[]
        )
    );
    snap!(
        "config_error_cost_both",
        file_error(
            "[limiters.api-key]\ncost = 2\ncost_header = \"X-Batch-Size\"\n",
            &[]
        )
    );
    snap!(
        "config_error_cost_max_alone",
        file_error("[limiters.api-key]\ncost_max = 5\n", &[])
    );
    snap!(
        "config_error_cost_header_name",
        file_error("[limiters.api-key]\ncost_header = \"Authorization\"\n", &[])
    );
    snap!(
        "config_error_env_cost",
        env_error(&[("FLEET_LIMITER_LIMITER_API_KEY_COST", "-4")])
    );
}

#[test]
fn error_failed_statuses() {
    snap!(
        "config_error_failed_statuses_backwards",
        file_error(
            "[limiters.api-key]\ncount = \"failed\"\nfailed_statuses = [\"499-400\"]\n",
            &[]
        )
    );
    snap!(
        "config_error_failed_statuses_code",
        file_error("[limiters.api-key]\nfailed_statuses = [42]\n", &[])
    );
    snap!(
        "config_error_failed_statuses_text",
        file_error("[limiters.api-key]\nfailed_statuses = [\"4xx\"]\n", &[])
    );
    snap!(
        "config_error_failed_statuses_empty",
        file_error("[limiters.api-key]\nfailed_statuses = []\n", &[])
    );
    snap!(
        "config_error_count",
        file_error("[limiters.api-key]\ncount = \"errors\"\n", &[])
    );
    snap!(
        "config_error_env_failed_statuses",
        env_error(&[("FLEET_LIMITER_LIMITER_API_KEY_FAILED_STATUSES", "400-4999")])
    );
}

#[test]
fn error_unparsable_window() {
    snap!(
        "config_error_window",
        file_error("[limiters.download]\nwindow = \"5 parsecs\"\n", &[])
    );
    snap!(
        "config_error_zero_window",
        file_error("[limiters.download]\nwindow = \"0s\"\n", &[])
    );
    snap!(
        "config_error_long_window",
        file_error("[limiters.download]\nwindow = \"8d\"\n", &[])
    );
}

#[test]
fn error_bad_key_kind() {
    snap!(
        "config_error_key_kind",
        file_error("[limiters.ui]\nkey = \"ip+user\"\n", &[])
    );
}

#[test]
fn error_bad_route() {
    snap!(
        "config_error_route",
        file_error("[limiters.ui]\nroutes = [\"api/**\"]\n", &[])
    );
    snap!(
        "config_error_route_method",
        file_error("[limiters.ui]\nroutes = [\"FETCH /api/**\"]\n", &[])
    );
}

#[test]
fn error_overlapping_routes_of_equal_specificity_in_one_group() {
    let toml = r#"
[limiters.agent-bulk]
limit = 100
window = "1m"
key = "ip"
group = "agent"
routes = ["/api/agent/**"]
"#;
    snap!("config_error_overlap", file_error(toml, &[]));
    // In a group of its own the same routes stack instead, which is allowed.
    let f = file(&toml.replace("group = \"agent\"\n", ""));
    assert!(Loader::new().file(&f.path).load().is_ok());
    // A more specific route in the same group takes precedence, which is allowed too.
    let f = file(&toml.replace("/api/agent/**", "POST /api/agent/bulk"));
    assert!(Loader::new().file(&f.path).load().is_ok());
}

#[test]
fn the_declared_fleet_holds_at_least_its_largest_site() {
    assert_eq!(Config::default().fleet.max_agents.get(), 10_000);
    let e = file_error("[fleet]\nmax_agents = 100\n", &[]);
    assert_eq!(
        e,
        "<dir>/fleet-limiter.toml: fleet.max_agents: 100 is fewer than fleet.max_site_endpoints = 250: a fleet holds at least its largest site; raise fleet.max_agents (default 10000)"
    );
    for bad in ["0", "-1", "1e9", "ten", ""] {
        let e = env_error(&[("FLEET_LIMITER_MAX_AGENTS", bad)]);
        assert!(
            e.starts_with("environment variable FLEET_LIMITER_MAX_AGENTS: fleet.max_agents: "),
            "{bad}: {e}"
        );
    }
    // A larger site needs the fleet declared with it.
    let e = env_error(&[("FLEET_LIMITER_MAX_SITE_ENDPOINTS", "20000")]);
    assert!(
        e.contains("fleet.max_agents: 10000 is fewer than fleet.max_site_endpoints = 20000"),
        "{e}"
    );
    let cfg = Loader::new()
        .env([
            (
                "FLEET_LIMITER_MAX_SITE_ENDPOINTS".to_owned(),
                "20000".to_owned(),
            ),
            ("FLEET_LIMITER_MAX_AGENTS".to_owned(), "50000".to_owned()),
        ])
        .load()
        .unwrap();
    assert_eq!(cfg.fleet.max_agents.get(), 50_000);
}

#[test]
fn a_lockout_is_read_into_the_quota_and_held_to_its_range() {
    let cfg = Config::default();
    assert!(cfg.limiters.iter().all(|l| l.quota.lockout().is_none()));
    let f = file("[limiters.api-key]\ncount = \"failed\"\nlockout = \"10m\"\n");
    let cfg = Loader::new().file(&f.path).load().expect("valid");
    assert_eq!(
        limiter(&cfg, "api-key").quota.lockout(),
        Some(std::time::Duration::from_secs(600))
    );
    let cfg = Loader::new()
        .env([(
            "FLEET_LIMITER_LIMITER_CLI_BEARER_LOCKOUT".to_owned(),
            "90".to_owned(),
        )])
        .load()
        .expect("valid");
    assert_eq!(
        limiter(&cfg, "cli-bearer").quota.lockout(),
        Some(std::time::Duration::from_secs(90))
    );
    snap!(
        "config_error_lockout_too_long",
        file_error("[limiters.api-key]\nlockout = \"2d\"\n", &[])
    );
    snap!(
        "config_error_lockout_too_short",
        file_error("[limiters.api-key]\nlockout = \"500ms\"\n", &[])
    );
    snap!(
        "config_error_lockout_zero",
        env_error(&[("FLEET_LIMITER_LIMITER_API_KEY_LOCKOUT", "0")])
    );
}

const BODY_LIMITER: &str = "[limiters.email-recipient]\nlimit = 10\nwindow = \"1h\"\nkey = \"body:email\"\nroutes = [\"POST /auth/signup\"]\n";

#[test]
fn a_body_key_names_its_field_and_needs_an_address_ceiling() {
    let with_ceiling = format!(
        "{BODY_LIMITER}[limiters.email-source]\nlimit = 20\nwindow = \"1h\"\nkey = \"ip\"\nroutes = [\"POST /auth/**\"]\n"
    );
    let f = file(&with_ceiling);
    let cfg = Loader::new().file(&f.path).load().expect("valid");
    let l = limiter(&cfg, "email-recipient");
    assert_eq!(l.key, KeyKind::Body(Arc::from("email")));
    assert_eq!(l.key.to_string(), "body:email");
    assert_eq!(cfg.server.body_key_max_bytes, 16 * 1024);
    // A body key needs no trusted proxy: the body is the client's, which is why it needs the
    // address ceiling beside it.
    assert!(!cfg
        .client_ip
        .trusted
        .contains("203.0.113.7".parse().expect("ip")));
    snap!(
        "config_error_body_key_without_address_ceiling",
        file_error(BODY_LIMITER, &[])
    );
    snap!(
        "config_error_body_key_bad_field",
        file_error(&BODY_LIMITER.replace("body:email", "body:e mail"), &[])
    );
    snap!(
        "config_error_body_key_no_field",
        file_error(&BODY_LIMITER.replace("body:email", "body"), &[])
    );
    snap!(
        "config_error_body_key_max_bytes",
        file_error(
            &format!("[server]\nbody_key_max_bytes = 10\n{with_ceiling}"),
            &[]
        )
    );
}

const LOCK_SOURCE: &str = "[limiters.credential-source]\nlimit = 300\nwindow = \"1h\"\nkey = \"ip\"\nroutes = [\"POST /auth/login\"]\n";
const LOCK: &str = "[limiters.login-account]\nlimit = 5\nwindow = \"10m\"\nkey = \"body:email+ip\"\nroutes = [\"POST /auth/login\"]\ncount = \"failed\"\nlockout = \"10m\"\n";
const LOCK_CEILING: &str = "[limiters.login-account-ceiling]\nlimit = 50\nwindow = \"1h\"\nkey = \"body:email\"\ngroup = \"login-account-ceiling\"\nroutes = [\"POST /auth/login\"]\ncount = \"failed\"\n";

#[test]
fn a_lockout_on_a_body_key_locks_the_address_out_of_the_account_under_a_per_account_ceiling() {
    let good = format!("{LOCK_SOURCE}{LOCK}{LOCK_CEILING}");
    let f = file(&good);
    let cfg = Loader::new().file(&f.path).load().expect("valid");
    let l = limiter(&cfg, "login-account");
    assert_eq!(l.key, KeyKind::BodyIp(Arc::from("email")));
    assert_eq!(l.key.to_string(), "body:email+ip");
    // A lock keyed on the account alone: a stranger would lock the owner out.
    snap!(
        "config_error_lockout_on_the_account_alone",
        file_error(
            &format!(
                "{LOCK_SOURCE}{}{LOCK_CEILING}",
                LOCK.replace("body:email+ip", "body:email")
            ),
            &[]
        )
    );
    // A lock per address with nothing per account: a guesser with many addresses is unheld.
    snap!(
        "config_error_lockout_without_a_per_account_ceiling",
        file_error(&format!("{LOCK_SOURCE}{LOCK}"), &[])
    );
    // A ceiling with its own lockout is a lock on the account again, not a ceiling.
    let locked_ceiling = format!("{LOCK_CEILING}lockout = \"1m\"\n");
    assert!(!file_error(&format!("{LOCK_SOURCE}{LOCK}{locked_ceiling}"), &[]).is_empty());
    // A ceiling on another field holds nothing for this one.
    let other_field = LOCK_CEILING.replace("body:email", "body:username");
    assert!(
        file_error(&format!("{LOCK_SOURCE}{LOCK}{other_field}"), &[])
            .contains("per-account ceiling")
    );
    // Without a lockout, `body:<field>+ip` needs only the address ceiling.
    let no_lock = LOCK.replace("lockout = \"10m\"\n", "");
    let f = file(&format!("{LOCK_SOURCE}{no_lock}"));
    assert!(Loader::new().file(&f.path).load().is_ok());
    snap!(
        "config_error_body_ip_key_bad_field",
        file_error(&LOCK.replace("body:email+ip", "body:e mail+ip"), &[])
    );
}

#[test]
fn with_no_calibration_the_file_is_the_whole_truth() {
    let load = |toml: &str| {
        let f = file(toml);
        Loader::new().file(&f.path).load()
    };
    let cfg = load("calibration = \"none\"\n").expect("no limiter at all");
    assert!(cfg.limiters.is_empty());
    let cfg = load("calibration = \"agent-fleet\"\n").expect("the built-ins");
    assert_eq!(cfg.limiters.len(), Config::default().limiters.len());
    // A built-in's name defines a new limiter, whole: nothing derived or overlaid.
    let cfg = load("calibration = \"none\"\n[limiters.agent-device]\nlimit = 5\nwindow = \"1m\"\nkey = \"ip\"\nroutes = [\"/api/agent/**\"]\n[limiters.agent-ip]\nlimit = 7\nwindow = \"1h\"\nkey = \"ip\"\nroutes = [\"/x/**\"]\n").expect("valid");
    let names: Vec<&str> = cfg.limiters.iter().map(|l| &*l.name).collect();
    assert_eq!(names, ["agent-device", "agent-ip"]);
    let ip = limiter(&cfg, "agent-ip");
    assert_eq!(ip.quota.limit(), 7);
    assert_eq!(ip.routes.len(), 1);
    assert!(ip.except.is_empty() && ip.new_agents.is_none());
    assert_eq!(limiter(&cfg, "agent-device").group.as_ref(), "agent-device");
    // The environment chooses it too.
    let cfg = Loader::new()
        .env([("FLEET_LIMITER_CALIBRATION".to_owned(), "none".to_owned())])
        .load()
        .expect("valid");
    assert!(cfg.limiters.is_empty());
    let e = load("calibration = \"None\"\n").unwrap_err().to_string();
    assert!(
        e.contains("calibration: `None` is not a calibration; did you mean \"none\"?"),
        "{e}"
    );
    let e = load("calibration = 0\n").unwrap_err().to_string();
    assert!(e.contains("calibration:"), "{e}");
    // Roles map onto the built-in limiters: with none, a [roles] table maps nothing.
    let e = load("calibration = \"none\"\n[roles]\nagent = [\"/v1/agents/**\"]\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("roles:") && e.contains("give each limiter its own routes"),
        "{e}"
    );
    load("[roles]\nagent = [\"/v1/agents/**\"]\n").expect("roles over the built-ins");
}

#[test]
fn a_path_key_reads_the_segment_of_its_route() {
    let f = file("calibration = \"none\"\n[limiters.checkin]\nlimit = 5\nwindow = \"1m\"\nkey = \"ip+path:id\"\nroutes = [\"POST /agents/{id}/checkin\", \"POST /v2/{id}/agents/{id2}\"]\n[limiters.agents-ip]\nlimit = 50\nwindow = \"1m\"\nkey = \"ip\"\nroutes = [\"POST /agents/**\", \"POST /v2/**\"]\n");
    let cfg = Loader::new().file(&f.path).load().expect("valid");
    let l = limiter(&cfg, "checkin");
    assert_eq!(l.key.to_string(), "ip+path:id");
    assert_eq!(l.path_id("POST", "/agents/a-1/checkin"), Some("a-1"));
    assert_eq!(l.path_id("POST", "/v2/b-2/agents/c-3"), Some("b-2"));
    assert_eq!(l.path_id("GET", "/agents/a-1/checkin"), None);
    assert_eq!(l.path_id("POST", "/agents/a%2Fb/checkin"), None);
    assert_eq!(
        limiter(&cfg, "agents-ip").path_id("POST", "/agents/a-1/checkin"),
        None
    );
}
