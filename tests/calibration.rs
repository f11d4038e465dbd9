//! `check` and `simulate`, end to end: the real binary's output and exit codes, `serve` refusing
//! an unsafe calibration, and the simulator's figures for the built-in and the replaced calibration.

mod common;

#[macro_use]
#[path = "support/macros.rs"]
mod macros;
#[path = "support/svg.rs"]
mod svg;

use common::{Exited, Launch};
use fleet_limiter::calibration::{self, Scenario, ScenarioReport, SimulationReport};
use fleet_limiter::{Config, Loader};
use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;
use svg::{attr, texts};

const REPLACED: &str = "docs/examples/replaced-calibration.toml";
/// How long a command may run before the test gives up on it (a deadline, not a measurement).
const LIMIT: Duration = Duration::from_secs(300);

/// The binary run from the crate root as it runs by default: without the harness's calibration
/// override and at the default log level.
fn as_by_default(launch: Launch) -> Launch {
    launch
        .current_dir(common::manifest_dir())
        .unset("FLEET_LIMITER_ALLOW_UNSAFE_CALIBRATION")
        .unset("FLEET_LIMITER_LOG")
}

fn cli(args: &[&str]) -> Launch {
    as_by_default(Launch::command(args.iter().copied()))
}

fn run(args: &[&str]) -> Exited {
    cli(args).run(LIMIT)
}

fn replaced_config() -> Config {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(REPLACED);
    let mut cfg = Loader::new()
        .file(path)
        .load()
        .expect("the replaced calibration loads");
    cfg.source = Some(REPLACED.into());
    cfg
}

/// Every scenario on each calibration, run once for all the tests of this file.
fn default_run() -> &'static SimulationReport {
    static R: OnceLock<SimulationReport> = OnceLock::new();
    R.get_or_init(|| {
        calibration::simulate(&Config::default(), &Scenario::ALL, 1).expect("simulate")
    })
}

fn replaced_run() -> &'static SimulationReport {
    static R: OnceLock<SimulationReport> = OnceLock::new();
    R.get_or_init(|| {
        calibration::simulate(&replaced_config(), &Scenario::ALL, 1).expect("simulate")
    })
}

fn scenario<'a>(r: &'a SimulationReport, name: &str) -> &'a ScenarioReport {
    r.scenarios
        .iter()
        .find(|s| s.name() == name)
        .expect("scenario ran")
}

#[test]
fn check_default_calibration_passes() {
    let table = run(&["check"]);
    assert_eq!(table.code, Some(0), "{}", table.stderr);
    // Safe, but with no [identity] the analysts' dashboards share one IP bucket.
    assert!(table
        .stdout
        .contains("at risk: 0 unsafe, 1 at risk, 0 warning(s)"));
    snap!("check_default_table", table.stdout);
    let json = run(&["check", "--format", "json"]);
    assert_eq!(json.code, Some(0));
    let v: serde_json::Value = serde_json::from_str(&json.stdout).expect("json");
    assert_eq!(v["unsafe_limiters"], 0);
    assert_eq!(v["at_risk"], 1);
    snap!("check_default_json", json.stdout);
}

/// The `[identity]` block of docs/identity/oidc.md, its key set moved to `jwks_url`.
fn oidc_identity(jwks_url: &str) -> String {
    let md = std::fs::read_to_string(common::manifest_dir().join("docs/identity/oidc.md"))
        .expect("docs/identity/oidc.md");
    let mut lines = md.lines().skip_while(|l| l.trim() != "```toml");
    lines.next().expect("a ```toml block");
    let block: Vec<String> = lines
        .take_while(|l| l.trim() != "```")
        .map(|l| {
            if l.starts_with("jwks_url") {
                format!("jwks_url = \"{jwks_url}\"")
            } else {
                l.to_owned()
            }
        })
        .collect();
    let block = block.join("\n") + "\n";
    assert!(
        block.starts_with("[identity]") && block.contains("jwt_issuer"),
        "{block}"
    );
    block
}

/// A local key-set address nobody answers at: a listener that records whether anything
/// connected to it.
struct KeySet(std::net::TcpListener);

impl KeySet {
    fn new() -> Self {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.set_nonblocking(true).expect("nonblocking");
        Self(l)
    }

    fn url(&self) -> String {
        format!("http://{}/jwks.json", self.0.local_addr().expect("addr"))
    }

    fn was_asked(&self) -> bool {
        self.0.accept().is_ok()
    }
}

#[test]
fn check_reports_ip_keyed_dashboards_at_risk_until_identity_is_configured() {
    // Without [identity] the 20 declared analysts share one IP bucket: at risk, exit 0.
    let o = run(&["check"]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    let out = &o.stdout;
    for needle in [
        "Dashboards: 6 requests per poll (5 widgets and the notification bell), 36/min per analyst;",
        "keyed on the IP (no [identity] token verifier): the 20 analysts behind one NAT share one bucket.",
        "dashboards: 720/min, 20 analysts on one IP",
        "AT RISK",
        "at risk: ui: keyed on the IP: no token verifier is configured, so the 20 analysts behind one NAT share one bucket and ask 720/min of its refill of 66.7/min (36/min each)",
        "FLEET_LIMITER_JWKS_URL",
        "docs/identity/",
    ] {
        assert!(out.contains(needle), "{needle}:\n{out}");
    }
    let strict = run(&["check", "--fail-on-risk"]);
    assert_eq!(strict.code, Some(1), "{}", strict.stdout);
    let json = run(&["check", "--format", "json"]);
    assert_eq!(json.code, Some(0));
    let v: serde_json::Value = serde_json::from_str(&json.stdout).expect("json");
    assert_eq!(v["dashboards"]["verified_users"], false);
    assert!(
        json.stderr.contains("at risk: ui: keyed on the IP"),
        "{}",
        json.stderr
    );

    // With the OIDC recipe's [identity] block each analyst is a verified user; check reads
    // the block without fetching the key set.
    let keys = KeySet::new();
    let o = cli(&["check"])
        .config_toml(oidc_identity(&keys.url()))
        .run(LIMIT);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    let out = &o.stdout;
    for needle in [
        "verified users ([identity] is configured): each analyst has a budget of their own.",
        "dashboards: 36/min per verified analyst",
        "safe: 0 unsafe, 0 at risk, 0 warning(s).",
    ] {
        assert!(out.contains(needle), "{needle}:\n{out}");
    }
    assert!(!out.contains("keyed on the IP"), "{out}");
    let strict = cli(&["check", "--fail-on-risk"])
        .config_toml(oidc_identity(&keys.url()))
        .run(LIMIT);
    assert_eq!(strict.code, Some(0), "{}", strict.stdout);
    assert!(!keys.was_asked(), "check fetched the key set");
}

#[test]
fn the_default_start_logs_no_warning_and_names_the_calibration_finding_once() {
    // The default configuration starts quietly: no WARN line at all. The calibration finding
    // (dashboards keyed on the IP for want of [identity]) is one INFO line that names it and
    // sends the operator to `check`, which has the detail.
    let gw = as_by_default(Launch::serve())
        .upstream("http://127.0.0.1:9")
        .spawn();
    let err = gw.stderr();
    let warnings: Vec<&str> = err.lines().filter(|l| l.contains(" WARN ")).collect();
    assert!(warnings.is_empty(), "WARN lines on a default start:\n{err}");
    let named: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("keyed on the IP"))
        .collect();
    assert_eq!(named.len(), 1, "one line names the finding:\n{err}");
    let line = named[0];
    assert!(line.contains(" INFO "), "{line}");
    for needle in [
        "calibration: at risk",
        "ui: keyed on the IP: no token verifier is configured",
        "run `fleet-limiter check`",
    ] {
        assert!(line.contains(needle), "{needle}: {line}");
    }
    // `check` has the detail and the fix.
    let check = run(&["check"]);
    assert_eq!(check.code, Some(0), "{}", check.stdout);
    for needle in [
        "AT RISK",
        "[identity]",
        "FLEET_LIMITER_JWKS_URL",
        "docs/identity/",
    ] {
        assert!(check.stdout.contains(needle), "{needle}: {}", check.stdout);
    }
    assert!(!err.contains("refusing to start"), "{err}");
    drop(gw);

    // With an [identity] block, no such warning.
    let keys = KeySet::new();
    let gw = as_by_default(Launch::serve())
        .upstream("http://127.0.0.1:9")
        .config_toml(oidc_identity(&keys.url()))
        .spawn();
    let err = gw.stderr();
    assert!(!err.contains("keyed on the IP"), "{err}");
    assert!(!err.contains("calibration:"), "{err}");
}

#[test]
fn a_thin_budget_the_operator_set_still_warns_at_start() {
    // agent-device at 12 a minute: thin headroom over the agents' idle cadence, a problem in
    // the operator's own limiter, said at WARN.
    let gw = as_by_default(Launch::serve())
        .upstream("http://127.0.0.1:9")
        .env("FLEET_LIMITER_LIMITER_AGENT_DEVICE_LIMIT", "12")
        .spawn();
    let err = gw.stderr();
    let line = err
        .lines()
        .find(|l| l.contains("calibration: agent-device:"))
        .unwrap_or_else(|| panic!("no warning about agent-device:\n{err}"));
    assert!(line.contains(" WARN "), "{line}");
}

#[test]
fn check_replaced_calibration_fails_naming_limiter_and_reason() {
    let table = run(&["check", "--config", REPLACED]);
    assert_eq!(table.code, Some(1));
    let err = table.stdout.clone();
    assert!(
        err.contains("unsafe: agent-device: refills 6.7/min per bucket, slower than the agents' idle cadence of 750/min"),
        "{err}"
    );
    assert!(
        err.contains("unsafe: enrollment: cannot admit max_site_endpoints = 250 in one burst"),
        "{err}"
    );
    assert!(
        err.contains("unsafe: download: cannot admit max_site_endpoints = 250 in one burst"),
        "{err}"
    );
    snap!("check_replaced_table", table.stdout);
    let json = run(&["check", "--config", REPLACED, "--format", "json"]);
    assert_eq!(json.code, Some(1));
    let v: serde_json::Value = serde_json::from_str(&json.stdout).expect("json");
    assert_eq!(v["unsafe_limiters"], 3);
    snap!("check_replaced_json", json.stdout);
}

#[test]
fn check_flags_a_lockout_longer_than_the_heartbeat_timeout() {
    // Per-agent keys fix the NAT collision, but a 15-minute fixed window still locks an agent
    // out far past the 180 s heartbeat timeout.
    let o = cli(&["check"])
        .env("FLEET_LIMITER_LIMITER_AGENT_DEVICE_LIMIT", "100")
        .env("FLEET_LIMITER_LIMITER_AGENT_DEVICE_WINDOW", "15m")
        .env(
            "FLEET_LIMITER_LIMITER_AGENT_DEVICE_ALGORITHM",
            "fixed-window",
        )
        .run(LIMIT);
    assert_eq!(o.code, Some(1));
    let err = o.stdout;
    assert!(
        err.contains("agent-device: a refused agent can wait 15m for its heartbeat, so 16m can pass between heartbeats, not under heartbeat_timeout_seconds = 180"),
        "{err}"
    );
}

#[test]
fn check_warns_but_passes_under_ten_times_idle_headroom() {
    let o = cli(&["check"])
        .env("FLEET_LIMITER_LIMITER_AGENT_DEVICE_LIMIT", "15")
        .run(LIMIT);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    assert!(o
        .stdout
        .contains("warning: agent-device: headroom over the agents' idle cadence is 5.0x"));
}

#[test]
fn check_reads_the_fleet_settings() {
    // A smaller site fits the old enrollment budget; a faster dashboard does not fit a small ui budget.
    let o = cli(&["check"])
        .env("FLEET_LIMITER_MAX_SITE_ENDPOINTS", "5")
        .env("FLEET_LIMITER_LIMITER_ENROLLMENT_LIMIT", "5")
        .env("FLEET_LIMITER_DASHBOARD_POLL_SECONDS", "1")
        .env("FLEET_LIMITER_LIMITER_UI_LIMIT", "600")
        .run(LIMIT);
    assert_eq!(o.code, Some(1));
    let err = o.stdout;
    assert!(!err.contains("unsafe: enrollment"), "{err}");
    // 6 requests a second per analyst, 20 analysts on one IP: even one analyst alone (360/min)
    // would not fit, so it is unsafe, not merely at risk.
    assert!(
        err.contains(
            "unsafe: ui: refills 40/min per bucket, slower than the declared cadence of 7200/min"
        ),
        "{err}"
    );
}

#[test]
fn each_fleet_setting_out_of_range_stops_check_and_serve_naming_the_field_and_the_range() {
    for (var, path) in [
        (
            "FLEET_LIMITER_HEARTBEAT_INTERVAL_SECONDS",
            "fleet.heartbeat_interval_seconds",
        ),
        (
            "FLEET_LIMITER_POLL_INTERVAL_SECONDS",
            "fleet.poll_interval_seconds",
        ),
        (
            "FLEET_LIMITER_HEARTBEAT_TIMEOUT_SECONDS",
            "fleet.heartbeat_timeout_seconds",
        ),
        (
            "FLEET_LIMITER_MAX_SITE_ENDPOINTS",
            "fleet.max_site_endpoints",
        ),
        (
            "FLEET_LIMITER_DASHBOARD_POLL_SECONDS",
            "fleet.dashboard_poll_seconds",
        ),
        ("FLEET_LIMITER_ANALYSTS_PER_NAT", "fleet.analysts_per_nat"),
        ("FLEET_LIMITER_MAX_AGENTS", "fleet.max_agents"),
    ] {
        for bad in ["0", "-5", "9999999999999"] {
            let o = cli(&["check"]).env(var, bad).run(LIMIT);
            assert_eq!(o.code, Some(2), "{var}={bad}: {}", o.stderr);
            let said = format!("environment variable {var}: {path}: {bad} is out of range; use ");
            assert!(o.stderr.contains(&said), "{var}={bad}: {}", o.stderr);
            assert!(o.stderr.contains("(default "), "{}", o.stderr);
        }
    }
    let o = as_by_default(Launch::serve())
        .upstream("http://127.0.0.1:9")
        .config_toml("[fleet]\npoll_interval_seconds = 0\n")
        .run(LIMIT);
    assert_eq!(o.code, Some(2), "{}", o.stderr);
    assert!(
        o.stderr.contains(".toml: fleet.poll_interval_seconds: 0 is out of range; use the seconds between two task polls of a healthy agent, 1 to 86400 (default 30)"),
        "{}",
        o.stderr
    );
    let o = as_by_default(Launch::serve())
        .upstream("http://127.0.0.1:9")
        .config_toml("[fleet]\nheartbeat_interval_seconds = \"60\"\n")
        .run(LIMIT);
    assert_eq!(o.code, Some(2), "{}", o.stderr);
    assert!(
        o.stderr.contains(".toml: fleet.heartbeat_interval_seconds: got string \"60\"; expected a whole number (no quotes)"),
        "{}",
        o.stderr
    );
}

/// `serve` on the replaced calibration, as the binary runs by default.
fn serve_replaced() -> Launch {
    as_by_default(Launch::serve())
        .args(["--config", REPLACED])
        .upstream("http://127.0.0.1:9")
}

#[test]
fn serve_refuses_an_unsafe_calibration() {
    let o = serve_replaced().run(LIMIT);
    assert_eq!(o.code, Some(2));
    let err = o.stderr;
    assert!(
        err.contains("refusing to start: the calibration is unsafe"),
        "{err}"
    );
    assert!(
        err.contains("unsafe: agent-device: refills 6.7/min per bucket"),
        "{err}"
    );
    assert!(
        err.contains("unsafe: enrollment: cannot admit max_site_endpoints = 250"),
        "{err}"
    );
    assert!(err.contains("--allow-unsafe-calibration"), "{err}");
}

#[test]
fn the_library_gateway_refuses_an_unsafe_calibration_before_it_listens() {
    let mut cfg = replaced_config();
    cfg.server.upstream = Some("http://127.0.0.1:9".parse().expect("an upstream URL"));
    let decider = std::sync::Arc::new(fleet_limiter::build_decider(&cfg).expect("decider"));
    let run = actix_web::rt::System::new().block_on(fleet_limiter::serve_gateway(&cfg, decider));
    let err = run.expect_err("serve_gateway refuses the replaced calibration");
    assert_eq!(err.exit_code(), 2, "{err}");
    let fleet_limiter::Error::UnsafeCalibration(refusal) = &err else {
        panic!("not a calibration refusal: {err}");
    };
    assert!(
        refusal
            .problems
            .iter()
            .any(|p| p.starts_with("enrollment: cannot admit max_site_endpoints = 250")),
        "{refusal:?}"
    );
    assert!(
        err.to_string()
            .starts_with("the calibration is unsafe for the declared fleet: "),
        "{err}"
    );
}

#[test]
fn serve_starts_an_unsafe_calibration_only_when_told_to() {
    // `spawn` fails the test when the gateway exits instead of listening.
    let gw = serve_replaced().arg("--allow-unsafe-calibration").spawn();
    let err = gw.stderr();
    assert!(err.contains("unsafe calibration, starting anyway"), "{err}");
    drop(gw);
    // Started with the environment variable.
    drop(
        serve_replaced()
            .env("FLEET_LIMITER_ALLOW_UNSAFE_CALIBRATION", "true")
            .spawn(),
    );
    let o = serve_replaced()
        .env("FLEET_LIMITER_ALLOW_UNSAFE_CALIBRATION", "false")
        .run(LIMIT);
    assert_eq!(o.code, Some(2), "false does not override: {}", o.stderr);
}

#[test]
fn default_calibration_keeps_the_fleet_online_and_the_rollout_unthrottled() {
    let r = default_run();
    let ScenarioReport::Fleet(f) = scenario(r, "fleet") else {
        unreachable!()
    };
    assert_eq!(f.agents, 250);
    assert_eq!(f.agents_marked_offline, 0);
    assert!(
        f.result_posts_refused > 0,
        "the result bursts do meet the agent budget"
    );
    assert!(f.longest_heartbeat_gap_seconds < 180.0);
    assert_eq!(f.results_backlog, 0, "every result got through");
    let ScenarioReport::Rollout(ro) = scenario(r, "rollout") else {
        unreachable!()
    };
    assert_eq!(ro.refused, 0);
    assert_eq!(ro.enrolled, 250);
    assert!(ro.last_enrolled_after_seconds.is_some_and(|s| s < 600.0));
    let ScenarioReport::Analysts(a) = scenario(r, "analysts") else {
        unreachable!()
    };
    assert_eq!(
        a.max_refused_per_analyst, 0,
        "verified analysts each have their own budget"
    );
    assert!(
        a.without_verified_tokens.max_refused_per_analyst > 0,
        "20 analysts on one IP bucket collide"
    );
    let ScenarioReport::Abuse(ab) = scenario(r, "abuse") else {
        unreachable!()
    };
    assert!(ab.admitted_per_minute["api-key-spray"] < 70.0);
    assert!(ab.admitted_per_minute["cli-token-stuffing"] < 70.0);
}

#[test]
fn replaced_calibration_marks_agents_offline_and_takes_hours_to_roll_out() {
    let r = replaced_run();
    let ScenarioReport::Fleet(f) = scenario(r, "fleet") else {
        unreachable!()
    };
    assert!(f.agents_marked_offline > 200, "{}", f.agents_marked_offline);
    let ScenarioReport::Rollout(ro) = scenario(r, "rollout") else {
        unreachable!()
    };
    let last = ro
        .last_enrolled_after_seconds
        .expect("all enrolled within the cap");
    assert!(last > 10.0 * 3600.0, "{last}");
}

#[test]
fn simulate_snapshots() {
    let d = default_run();
    snap!("simulate_default_table", calibration::simulate_table(d));
    snap!("simulate_default_json", calibration::json(d));
    let r = replaced_run();
    snap!("simulate_replaced_table", calibration::simulate_table(r));
    snap!("simulate_replaced_json", calibration::json(r));
}

#[test]
fn same_seed_same_run_other_seed_other_run() {
    let cfg = Config::default();
    let a = calibration::simulate(&cfg, &[Scenario::Rollout], 1).expect("run");
    let b = calibration::simulate(&cfg, &[Scenario::Rollout], 1).expect("run");
    let c = calibration::simulate(&cfg, &[Scenario::Rollout], 2).expect("run");
    assert_eq!(calibration::json(&a), calibration::json(&b));
    assert_ne!(calibration::json(&a), calibration::json(&c));
    // A scenario alone gives the figures it gives within `all`.
    let alone = calibration::json(&a.scenarios[0]);
    assert_eq!(alone, calibration::json(scenario(default_run(), "rollout")));
}

#[test]
fn simulate_cli_prints_json_and_draws_the_plot() {
    let dir = tempfile::tempdir().expect("tempdir");
    let svg = dir.path().join("rollout.svg");
    let svg_arg = svg.to_string_lossy().into_owned();
    let o = run(&[
        "simulate",
        "--scenario",
        "rollout",
        "--config",
        REPLACED,
        "--format",
        "json",
        "--seed",
        "1",
        "--plot",
        &svg_arg,
    ]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    let v: serde_json::Value = serde_json::from_str(&o.stdout).expect("json");
    let ro = &v["scenarios"][0];
    assert_eq!(ro["scenario"], "rollout");
    assert!(ro["refused"].as_u64().is_some_and(|n| n > 0));
    assert!(ro["last_enrolled_after_seconds"]
        .as_f64()
        .is_some_and(|s| s > 36_000.0));
    // The binary gives the figures the library gives.
    let lib = calibration::simulate(&replaced_config(), &[Scenario::Rollout], 1).expect("run");
    assert_eq!(o.stdout, calibration::json(&lib));
    let drawn = std::fs::read_to_string(&svg).expect("plot written");
    assert_eq!(drawn, calibration::svg(&lib));
    assert!(
        drawn.contains("rollout: requests per 5m"),
        "12 h of rollout in 5-minute bins"
    );
    assert!(
        o.stderr.contains(&format!("plot written to {svg_arg}")),
        "says where it wrote: {}",
        o.stderr
    );

    let bad = run(&["simulate", "--scenario", "stampede"]);
    assert_eq!(bad.code, Some(2));
    assert!(bad.stderr.contains("unknown scenario `stampede`"));
}

/// A series the plot draws, read back from the attributes it carries.
#[derive(Debug)]
struct Drawn {
    series: String,
    client: Option<String>,
    bin_seconds: u64,
    values: Vec<f64>,
}

/// Every element of the SVG that carries `data-series`.
fn drawn(svg: &str) -> Vec<Drawn> {
    svg.split('<')
        .filter_map(|tag| {
            let series = attr(tag, "data-series")?.to_owned();
            Some(Drawn {
                series,
                client: attr(tag, "data-client").map(str::to_owned),
                bin_seconds: attr(tag, "data-bin-seconds")
                    .and_then(|b| b.parse().ok())
                    .expect("every series says its bin"),
                values: attr(tag, "data-values")
                    .expect("every series carries its values")
                    .split_whitespace()
                    .map(|v| v.parse().expect("a number"))
                    .collect(),
            })
        })
        .collect()
}

fn one<'a>(d: &'a [Drawn], series: &str) -> &'a Drawn {
    let found: Vec<&Drawn> = d.iter().filter(|s| s.series == series).collect();
    assert_eq!(found.len(), 1, "one `{series}` series in {d:?}");
    found[0]
}

fn max(xs: &[f64]) -> f64 {
    xs.iter().copied().fold(f64::NEG_INFINITY, f64::max)
}

#[test]
fn default_plot_shows_no_agent_offline_and_every_gap_under_the_timeout() {
    let svg = calibration::svg(default_run());
    let d = drawn(&svg);
    let offline = one(&d, "agents-offline");
    assert_eq!(offline.values.len() as u64 * offline.bin_seconds, 1800);
    assert_eq!(max(&offline.values), 0.0, "no agent offline at any time");
    let worst = one(&d, "heartbeat-age-worst");
    let longest = max(&worst.values);
    assert!(longest > 60.0 && longest < 180.0, "{longest}");
    let ScenarioReport::Fleet(f) = scenario(default_run(), "fleet") else {
        unreachable!()
    };
    assert!(
        (longest - f.longest_heartbeat_gap_seconds).abs() < 0.1,
        "the plot's worst gap is the reported one: {longest} vs {}",
        f.longest_heartbeat_gap_seconds
    );
    assert!(
        svg.contains(r#"data-threshold-seconds="180""#),
        "the offline line is drawn"
    );
    assert!(svg.contains("offline after 3m without a heartbeat"));
}

#[test]
fn replaced_plot_shows_every_agent_offline() {
    let d = drawn(&calibration::svg(replaced_run()));
    let offline = one(&d, "agents-offline");
    assert_eq!(
        max(&offline.values),
        250.0,
        "all 250 agents offline at some point"
    );
    assert_eq!(offline.values[0], 0.0, "online at the start");
    let worst = one(&d, "heartbeat-age-worst");
    assert!(max(&worst.values) >= 1790.0, "{:?}", worst.values);
}

#[test]
fn abuse_plot_draws_each_client_s_admitted_rate() {
    for (r, rotator) in [(default_run(), 274.9), (replaced_run(), 10.0)] {
        let d = drawn(&calibration::svg(r));
        let ScenarioReport::Abuse(ab) = scenario(r, "abuse") else {
            unreachable!()
        };
        let all_rates = d
            .iter()
            .filter(|s| s.series == "admitted-per-minute")
            .count();
        let rates: Vec<&Drawn> = d
            .iter()
            .filter(|s| {
                s.series == "admitted-per-minute"
                    && ab
                        .attackers
                        .iter()
                        .any(|a| s.client.as_deref() == Some(a.name))
            })
            .collect();
        assert_eq!(rates.len(), ab.attackers.len(), "a series per client");
        // The rotation scenario draws two more: the site's heartbeats and the rotating client;
        // failed-only two: its API clients; table-flood three: each site's heartbeats;
        // auth-ceilings four: the sprayer, the two guessers and the owner.
        assert_eq!(all_rates, ab.attackers.len() + 2 + 2 + 3 + 4);
        for at in &ab.attackers {
            let s = rates
                .iter()
                .find(|s| s.client.as_deref() == Some(at.name))
                .unwrap_or_else(|| panic!("no series for {}", at.name));
            let mean = s.values.iter().sum::<f64>() / s.values.len() as f64;
            assert!(
                (mean - at.admitted_per_minute).abs() < 1.0,
                "{}: drawn {mean}/min, reported {}/min",
                at.name,
                at.admitted_per_minute
            );
        }
        let rot = rates
            .iter()
            .find(|s| s.client.as_deref() == Some("agent-id-rotation"))
            .expect("rotator drawn");
        let mean = rot.values.iter().sum::<f64>() / rot.values.len() as f64;
        assert!((mean - rotator).abs() < 1.0, "{mean}");
    }
}

/// Every number in a JSON document.
fn numbers(v: &serde_json::Value, out: &mut Vec<f64>) {
    match v {
        serde_json::Value::Number(n) => out.extend(n.as_f64()),
        serde_json::Value::Array(a) => a.iter().for_each(|x| numbers(x, out)),
        serde_json::Value::Object(o) => o.values().for_each(|x| numbers(x, out)),
        _ => {}
    }
}

/// The bare numbers of a line of text: digits not glued to a unit (`10s`, `1m18s`, `/56s`).
fn bare_numbers(text: &str) -> Vec<f64> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if !b[i].is_ascii_digit() {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len()
            && (b[i].is_ascii_digit()
                || (b[i] == b'.' && i + 1 < b.len() && b[i + 1].is_ascii_digit()))
        {
            i += 1;
        }
        let glued_before = start > 0
            && (b[start - 1].is_ascii_alphanumeric()
                || b[start - 1] == b'/'
                || b[start - 1] == b'.');
        let glued_after = i < b.len() && b[i].is_ascii_alphabetic();
        if !glued_before && !glued_after {
            out.extend(text[start..i].parse::<f64>().ok());
        }
    }
    out
}

#[test]
fn every_scenario_has_its_panel_and_every_number_on_it_is_the_report_s() {
    let panels = |name: &str| -> &'static [&'static str] {
        match name {
            "fleet" => &["fleet-heartbeat-age", "fleet-offline", "fleet-requests"],
            "rollout" => &["rollout-enrolled", "rollout-requests"],
            "analysts" => &["analysts-verified", "analysts-unverified"],
            "abuse" => &["abuse"],
            "rotation" => &["rotation"],
            "failed-only" => &["failed-only"],
            "table-flood" => &["table-flood"],
            "auth-ceilings" => &["auth-ceilings"],
            "herd" => &["herd-own-cadence", "herd-poll-slots", "herd-backend-aware"],
            other => panic!("a scenario the test does not know: {other}"),
        }
    };
    for r in [default_run(), replaced_run()] {
        let svg = calibration::svg(r);
        let json: serde_json::Value = serde_json::from_str(&calibration::json(r)).expect("json");
        assert_eq!(r.scenarios.len(), Scenario::ALL.len());
        for s in &r.scenarios {
            for p in panels(s.name()) {
                assert!(
                    svg.contains(&format!(r#"data-panel="{p}""#)),
                    "{}: no `{p}` panel",
                    s.name()
                );
            }
        }
        // Every bare number written on the figure, outside its axes' tick labels, is one of the
        // report's (or, for the line of what a client sends, one of its rates a second times 60).
        let mut reported = Vec::new();
        numbers(&json, &mut reported);
        let per_minute: Vec<f64> = reported.iter().map(|n| n * 60.0).collect();
        let known = |n: f64| {
            reported
                .iter()
                .chain(&per_minute)
                .any(|r| (r - n).abs() < 1e-9)
        };
        let mut checked = 0;
        for (attrs, text) in texts(&svg) {
            let tick = attrs.contains(r#"text-anchor="middle""#)
                || (attrs.contains(r#"text-anchor="end""#) && !attrs.contains("font-weight"));
            if tick {
                continue;
            }
            for n in bare_numbers(&text) {
                checked += 1;
                assert!(known(n), "{n} in `{text}` is not in the report");
            }
        }
        assert!(checked > 40, "only {checked} numbers read");
        // Each client's legend says the report's rate, and its line averages to it over the time
        // the client was sending.
        for (scenario, clients) in [
            ("abuse", &json_clients(&json, "abuse")),
            ("rotation", &json_clients(&json, "rotation")),
            ("failed-only", &json_clients(&json, "failed-only")),
            ("table-flood", &json_clients(&json, "table-flood")),
            ("auth-ceilings", &json_clients(&json, "auth-ceilings")),
        ] {
            let d = drawn(&svg);
            assert!(!clients.is_empty(), "{scenario}: clients in the report");
            for (name, rate, from) in clients {
                let legend = format!("{name}: {}/min admitted", fmt_rate(*rate));
                assert!(
                    texts(&svg).iter().any(|(_, t)| *t == legend),
                    "{scenario}: legend `{legend}` drawn"
                );
                let s = d
                    .iter()
                    .find(|s| {
                        s.series == "admitted-per-minute"
                            && s.client.as_deref() == Some(name.as_str())
                    })
                    .unwrap_or_else(|| panic!("{scenario}: no series for {name}"));
                let first = (*from / s.bin_seconds as f64) as usize;
                let sending = &s.values[first..];
                let mean = sending.iter().sum::<f64>() / sending.len() as f64;
                assert!(
                    (mean - rate).abs() <= 0.05 + 1e-9,
                    "{scenario}: {name} drawn at {mean}/min, legend {rate}/min"
                );
            }
        }
    }
}

/// A rate as the figures and the table write it: one decimal, none when whole.
fn fmt_rate(v: f64) -> String {
    let r = (v * 10.0).round() / 10.0;
    if r == r.trunc() {
        format!("{}", r as i64)
    } else {
        format!("{r:.1}")
    }
}

/// Each client a clients panel draws, from the report's JSON: name, admitted per minute, and
/// when it starts sending (seconds).
fn json_clients(json: &serde_json::Value, scenario: &str) -> Vec<(String, f64, f64)> {
    let s = json["scenarios"]
        .as_array()
        .and_then(|a| a.iter().find(|s| s["scenario"] == scenario))
        .unwrap_or_else(|| panic!("{scenario} in the report"));
    let f = |v: &serde_json::Value| v.as_f64().unwrap_or_else(|| panic!("{scenario}: {v}"));
    match scenario {
        "abuse" => s["admitted_per_minute"]
            .as_object()
            .expect("abuse rates")
            .iter()
            .map(|(k, v)| (k.clone(), f(v), 0.0))
            .collect(),
        "rotation" => vec![
            (
                "site heartbeats".to_owned(),
                f(&s["heartbeats_admitted_per_minute"]),
                0.0,
            ),
            (
                "rotating client".to_owned(),
                f(&s["rotating_admitted_per_minute"]),
                f(&s["flood_starts_seconds"]),
            ),
        ],
        "failed-only" | "auth-ceilings" => s["clients"]
            .as_array()
            .expect("clients")
            .iter()
            .map(|c| {
                (
                    c["name"].as_str().expect("name").to_owned(),
                    f(&c["admitted_per_minute"]),
                    0.0,
                )
            })
            .collect(),
        _ => s["sites"]
            .as_array()
            .expect("sites")
            .iter()
            .map(|c| {
                (
                    c["name"].as_str().expect("name").to_owned(),
                    f(&c["admitted_per_minute"]),
                    f(&c["arrives_seconds"]),
                )
            })
            .collect(),
    }
}

/// Estimated on the generous side of sans-serif's glyphs: 0.62 em bold, 0.56 em otherwise.
fn estimated_width(attrs: &str, text: &str) -> f64 {
    let size: f64 = attr(attrs, "font-size").map_or(12.0, |s| s.parse().expect("a size"));
    let em = if attrs.contains("font-weight=\"bold\"") {
        0.62
    } else {
        0.56
    };
    text.chars().count() as f64 * size * em
}

#[test]
fn no_text_on_a_figure_runs_off_the_page() {
    // A configuration path long enough to run off the title line.
    let long = "/etc/fleet-limiter/a-directory-name-that-goes-on/and-on-and-on/to-the-end-of-the-page/calibration.toml";
    let mut r = default_run().clone();
    r.config = Some(long.into());
    for r in [&r, replaced_run()] {
        let svg = calibration::svg(r);
        let width: f64 = attr(&svg, "width")
            .and_then(|w| w.parse().ok())
            .expect("width");
        for (attrs, text) in texts(&svg) {
            if attrs.contains("rotate(") {
                continue; // the y-axis titles, drawn upright beside short frames
            }
            let x: f64 = attr(&attrs, "x").and_then(|x| x.parse().ok()).expect("x");
            let w = estimated_width(&attrs, &text);
            let (left, right) = if attrs.contains(r#"text-anchor="end""#) {
                (x - w, x)
            } else if attrs.contains(r#"text-anchor="middle""#) {
                (x - w / 2.0, x + w / 2.0)
            } else {
                (x, x + w)
            };
            assert!(
                left >= 0.0 && right <= width,
                "`{text}` spans {left:.0}..{right:.0} of {width}"
            );
        }
    }
}

#[test]
fn plot_bins_are_round_and_analysts_runs_share_one_half_hour_axis() {
    const ROUND: [u64; 13] = [
        10, 30, 60, 300, 600, 900, 1800, 3600, 7200, 10_800, 21_600, 43_200, 86_400,
    ];
    for r in [default_run(), replaced_run()] {
        let d = drawn(&calibration::svg(r));
        assert!(!d.is_empty());
        for s in &d {
            assert!(
                ROUND.contains(&s.bin_seconds),
                "{}: {} s bins",
                s.series,
                s.bin_seconds
            );
        }
        for run in ["analysts-verified", "analysts-unverified"] {
            let refused = d
                .iter()
                .find(|s| s.series == format!("{run}-refused"))
                .unwrap_or_else(|| panic!("{run} drawn"));
            assert_eq!(
                refused.values.len() as u64 * refused.bin_seconds,
                1800,
                "{run}: its own 30-minute axis"
            );
        }
    }
}

#[test]
fn simulate_plot_to_an_unwritable_path_fails_before_simulating() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("no-such-dir").join("out.svg");
    let missing_arg = missing.to_string_lossy().into_owned();
    let dir_arg = dir.path().to_string_lossy().into_owned();
    for (target, why) in [
        (&missing_arg, "does not exist"),
        (&dir_arg, "is a directory"),
    ] {
        let o = run(&["simulate", "--scenario", "fleet", "--plot", target]);
        assert_eq!(o.code, Some(2), "{target}: {}", o.stderr);
        assert!(o.stdout.is_empty(), "nothing simulated: {}", o.stdout);
        assert!(o.stderr.contains(target.as_str()), "{}", o.stderr);
        assert!(o.stderr.contains(why), "{}", o.stderr);
    }
    assert!(!missing.exists());
}

#[test]
fn check_prints_each_unsafe_reason_once() {
    // What a terminal shows is stdout and stderr together.
    let out = run(&["check", "--config", REPLACED]);
    assert_eq!(out.code, Some(1));
    let shown = format!("{}{}", out.stdout, out.stderr);
    for reason in [
        "agent-device: refills 6.7/min per bucket",
        "enrollment: cannot admit max_site_endpoints = 250 in one burst",
        "download: cannot admit max_site_endpoints = 250 in one burst",
    ] {
        assert_eq!(shown.matches(reason).count(), 1, "{reason}:\n{shown}");
    }
}

#[test]
fn nat_rollout_shows_what_an_override_for_the_nat_buys() {
    let r =
        calibration::simulate(&Config::default(), &[Scenario::NatRollout], 1).expect("simulate");
    let json: serde_json::Value = serde_json::from_str(&calibration::json(&r)).expect("json");
    let s = &json["scenarios"][0];
    assert_eq!(s["scenario"], "nat-rollout");
    assert_eq!(s["endpoints"], 2000);
    let default = s["default_budget"]["last_enrolled_after_seconds"]
        .as_f64()
        .expect("the default budget enrolls them all within two days");
    let lifted = s["with_override"]["last_enrolled_after_seconds"]
        .as_f64()
        .expect("the override enrolls them all");
    // The default budget takes over an hour; the override, about the five minutes the
    // installers take to start.
    assert!(default > 3600.0, "{default}");
    assert!(lifted < 600.0, "{lifted}");
    assert_eq!(s["with_override"]["refused"], 0);
    assert!(s["default_budget"]["refused"].as_u64().unwrap_or(0) > 100_000);
    let overrides = s["overrides"].as_array().expect("the overrides added");
    assert!(!overrides.is_empty());
    for o in overrides {
        let o = o.as_str().unwrap_or_default();
        assert!(
            o.contains("ip:203.0.113.10") && o.contains("until 2026-12-01T16:00:00Z"),
            "{o}"
        );
    }
    let table = calibration::simulate_table(&r);
    assert!(
        table.contains("with an override for the NAT: all enrolled after"),
        "{table}"
    );
}
