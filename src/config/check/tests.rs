use super::types::{Fix, Workload};
use super::*;
use crate::config::FleetConfig;
use crate::config::Loader;

fn load(pairs: &[(&str, &str)]) -> Config {
    Loader::new()
        .env(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())))
        .load()
        .unwrap()
}

fn line<'a>(r: &'a CheckReport, name: &str) -> &'a LimiterCheck {
    r.limiters.iter().find(|l| l.name == name).unwrap()
}

/// A complete `[identity]` block as the OIDC recipe gives it (loading it fetches nothing).
const OIDC: &[(&str, &str)] = &[
    (
        "FLEET_LIMITER_JWKS_URL",
        "https://sso.example.com/realms/acme/protocol/openid-connect/certs",
    ),
    (
        "FLEET_LIMITER_JWT_ISSUER",
        "https://sso.example.com/realms/acme",
    ),
    ("FLEET_LIMITER_JWT_AUDIENCE", "dashboard-api"),
];

#[test]
fn a_cost_above_the_limit_is_unsafe_not_one_request() {
    // A limiter built in code may cost more than its limit (a file with one does not load).
    let cfg = with(&Config::default(), "agent-device", |l| {
        l.cost = crate::policy::Cost::Fixed(crate::limiter::nonzero(31));
    });
    let r = check(&cfg);
    let l = line(&r, "agent-device");
    assert_eq!(l.status, Status::Unsafe, "{:?}", l.reasons);
    assert_eq!(l.requests_per_window, 0);
    assert!(
        l.reasons
            .iter()
            .any(|s| s.contains("each request costs 31, more than limit = 30")),
        "{:?}",
        l.reasons
    );
    // The report still serialises.
    assert!(crate::calibration::report::json(&r).contains("agent-device"));
}

#[test]
fn a_fixed_cost_shrinks_what_a_bucket_carries() {
    let cfg = crate::config::Loader::new()
        .env([(
            "FLEET_LIMITER_LIMITER_AGENT_DEVICE_COST".to_owned(),
            "30".to_owned(),
        )])
        .load()
        .unwrap();
    let r = check(&cfg);
    assert!(
        !r.is_safe(),
        "30 units a request leave agent-device one request a minute"
    );
    assert!(
        r.problems().iter().any(|p| p.starts_with("agent-device")),
        "{:?}",
        r.problems()
    );
}

#[test]
fn default_calibration_is_safe_without_warnings() {
    let r = check(&Config::default());
    assert!(r.is_safe(), "{:?}", r.problems());
    assert_eq!(r.warnings, 0, "{:?}", r.warning_lines());
    let agent = line(&r, "agent-device");
    assert_eq!(agent.status, Status::Ok);
    assert_eq!(agent.headroom(), Some(10.0));
    assert_eq!(agent.worst_refused(), Some(Some(2.0)));
    assert_eq!(line(&r, "enrollment").loads[0].burst, Some(250));
    assert_eq!(line(&r, "key-rotation").status, Status::Unloaded);
}

#[test]
fn one_dashboard_load_six_requests_every_ten_seconds() {
    assert_eq!(traffic::DASHBOARD_REQUESTS_PER_POLL, 6);
    let every = |s| std::num::NonZeroU64::new(s).expect("positive");
    assert_eq!(traffic::dashboard_per_minute(every(10)), 36.0);
    assert_eq!(traffic::dashboard_per_minute(every(15)), 24.0);
    assert_eq!(traffic::dashboard_per_minute(every(1)), 360.0);
    let r = check(&Config::default());
    assert_eq!(r.dashboards.requests_per_poll, 6);
    assert_eq!(r.dashboards.per_analyst_per_minute, 36.0);
    let r = check(&load(OIDC));
    assert_eq!(line(&r, "ui").loads[0].per_minute, Some(36.0));
}

#[test]
fn without_a_verifier_the_analysts_share_one_ip_bucket_at_risk() {
    let cfg = Config::default();
    assert!(!cfg.identity.verifies());
    let r = check(&cfg);
    assert!(!r.dashboards.verified_users);
    let ui = line(&r, "ui");
    assert_eq!(ui.status, Status::AtRisk);
    let load = &ui.loads[0];
    assert_eq!(load.workload, Workload::Dashboards);
    assert_eq!((load.sharers, load.per_minute), (20, Some(720.0)));
    assert!(load.ip_fallback);
    assert_eq!(load.describe, "dashboards: 720/min, 20 analysts on one IP");
    // At risk, not unsafe: the report is safe, and `serve` admits it with a warning.
    assert!(r.is_safe() && r.is_at_risk());
    assert_eq!((r.unsafe_limiters, r.at_risk, r.warnings), (0, 1, 0));
    let risks = r.risk_lines();
    assert_eq!(risks.len(), 1, "{risks:?}");
    for needle in [
        "ui: keyed on the IP: no token verifier is configured",
        "the 20 analysts behind one NAT share one bucket and ask 720/min of its refill of 66.7/min (36/min each)",
        "[identity]",
        "FLEET_LIMITER_JWKS_URL",
        "docs/identity/",
    ] {
        assert!(risks[0].contains(needle), "{needle}: {}", risks[0]);
    }
    let admitted = admit(&cfg, false).unwrap();
    // A calibration finding, not a warning: a start names it in one INFO line.
    assert_eq!(admitted.risks, risks);
    assert!(admitted.warnings.is_empty(), "{:?}", admitted.warnings);
    assert!(admitted.overridden.is_empty());
    let summary = admitted.risk_summary().unwrap();
    assert!(
        summary.contains("ui: keyed on the IP: no token verifier is configured")
            && summary.contains("run `fleet-limiter check`")
            && !summary.contains("analysts"),
        "{summary}"
    );
    // JSON: the verdict and the flag are additions beside the existing fields.
    let v: serde_json::Value = serde_json::from_str(&crate::calibration::report::json(&r)).unwrap();
    assert_eq!(v["at_risk"], 1);
    assert_eq!(v["unsafe_limiters"], 0);
    assert_eq!(v["dashboards"]["verified_users"], false);
    let ui = v["limiters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["name"] == "ui")
        .unwrap();
    assert_eq!(ui["status"], "at-risk");
    assert_eq!(ui["loads"][0]["ip_fallback"], true);
}

#[test]
fn with_a_verifier_each_analyst_has_their_own_bucket() {
    let cfg = load(OIDC);
    assert!(cfg.identity.verifies());
    let r = check(&cfg);
    assert!(r.dashboards.verified_users);
    let ui = line(&r, "ui");
    assert_eq!(ui.status, Status::Ok);
    let load = &ui.loads[0];
    assert_eq!((load.sharers, load.per_minute), (1, Some(36.0)));
    assert!(!load.ip_fallback);
    assert_eq!(load.describe, "dashboards: 36/min per verified analyst");
    assert!(!r.is_at_risk() && r.is_safe());
    assert_eq!(r.warnings, 0, "{:?}", r.warning_lines());
    assert!(admit(&cfg, false).unwrap().warnings.is_empty());
}

#[test]
fn a_dashboard_its_own_bucket_cannot_carry_is_unsafe_either_way() {
    // One analyst alone asks 360/min of a refill of 40/min: a verifier would not help.
    let slow = [
        ("FLEET_LIMITER_DASHBOARD_POLL_SECONDS", "1"),
        ("FLEET_LIMITER_LIMITER_UI_LIMIT", "600"),
    ];
    let r = check(&load(&slow));
    assert_eq!(line(&r, "ui").status, Status::Unsafe);
    assert!(!r.is_at_risk());
    let with_oidc: Vec<_> = slow.iter().chain(OIDC).copied().collect();
    let r = check(&load(&with_oidc));
    assert_eq!(line(&r, "ui").status, Status::Unsafe);
    assert!(
        r.problems()[0].contains("slower than the declared cadence of 360/min"),
        "{:?}",
        r.problems()
    );
}

#[test]
fn ip_keyed_dashboards_that_fit_or_are_not_enforced_are_not_at_risk() {
    // One analyst per NAT shares with nobody.
    let r = check(&load(&[("FLEET_LIMITER_ANALYSTS_PER_NAT", "1")]));
    assert_eq!(line(&r, "ui").status, Status::Ok);
    // A budget the whole NAT fits in.
    let r = check(&load(&[("FLEET_LIMITER_LIMITER_UI_LIMIT", "11000")]));
    assert_eq!(line(&r, "ui").status, Status::Ok);
    assert!(line(&r, "ui").loads[0].ip_fallback);
    // Shadow mode only warns; off is never consulted.
    let r = check(&load(&[("FLEET_LIMITER_LIMITER_UI_MODE", "shadow")]));
    let ui = line(&r, "ui");
    assert_eq!(ui.status, Status::Warning);
    assert!(ui.reasons[0]
        .starts_with("in shadow mode, so not enforced; once enforced: keyed on the IP"));
    assert_eq!((r.at_risk, r.warnings), (0, 1));
    let r = check(&load(&[("FLEET_LIMITER_LIMITER_UI_MODE", "off")]));
    assert_eq!(line(&r, "ui").status, Status::Off);
    assert!(r.risk_lines().is_empty() && r.problems().is_empty());
}

#[test]
fn an_unsafe_limiter_keeps_its_at_risk_reason_apart() {
    // ui both at risk (shared IP) and unsafe (the CLI's device flow on the same limiter).
    let r = check(&load(&[
        ("FLEET_LIMITER_LIMITER_UI_ROUTES", "/api/**"),
        ("FLEET_LIMITER_LIMITER_UI_EXCEPT", "/api/agent/**"),
        ("FLEET_LIMITER_LIMITER_UI_KEY", "user-or-ip"),
        ("FLEET_LIMITER_LIMITER_UI_LIMIT", "10"),
        ("FLEET_LIMITER_LIMITER_UI_WINDOW", "1m"),
        ("FLEET_LIMITER_ANALYSTS_PER_NAT", "2"),
        ("FLEET_LIMITER_DASHBOARD_POLL_SECONDS", "60"),
    ]));
    let ui = line(&r, "ui");
    assert_eq!(ui.status, Status::Unsafe, "{:?}", ui.reasons);
    assert!(
        r.risk_lines().iter().all(|l| l.contains("keyed on the IP")),
        "{:?}",
        r.risk_lines()
    );
    assert!(
        r.problems().iter().all(|l| !l.contains("keyed on the IP")),
        "{:?}",
        r.problems()
    );
}

#[test]
fn long_window_lockout_is_unsafe() {
    let r = check(&load(&[
        ("FLEET_LIMITER_LIMITER_AGENT_DEVICE_LIMIT", "100"),
        ("FLEET_LIMITER_LIMITER_AGENT_DEVICE_WINDOW", "15m"),
        (
            "FLEET_LIMITER_LIMITER_AGENT_DEVICE_ALGORITHM",
            "fixed-window",
        ),
    ]));
    let agent = line(&r, "agent-device");
    assert_eq!(agent.status, Status::Unsafe);
    assert!(
        agent.reasons[0].contains("heartbeat_timeout_seconds = 180"),
        "{:?}",
        agent.reasons
    );
    assert!(!r.is_safe());
}

#[test]
fn a_lockout_on_the_agents_budget_is_a_wait_as_long_as_the_lock() {
    // The default agent-device budget is safe; a lockout longer than the heartbeat timeout
    // makes any refusal an agent marked offline.
    let safe = check(&load(&[]));
    assert_eq!(line(&safe, "agent-device").status, Status::Ok);
    let r = check(&load(&[(
        "FLEET_LIMITER_LIMITER_AGENT_DEVICE_LOCKOUT",
        "10m",
    )]));
    let agent = line(&r, "agent-device");
    assert_eq!(agent.status, Status::Unsafe, "{:?}", agent.reasons);
    assert!(
        agent.reasons[0].contains("heartbeat_timeout_seconds = 180"),
        "{:?}",
        agent.reasons
    );
}

#[test]
fn ip_keyed_agent_budget_refills_slower_than_the_fleet() {
    let r = check(&load(&[("FLEET_LIMITER_LIMITER_AGENT_DEVICE_KEY", "ip")]));
    let agent = line(&r, "agent-device");
    assert_eq!(agent.status, Status::Unsafe);
    assert!(agent.reasons[0].contains("slower than the agents' idle cadence"));
    assert_eq!(agent.loads[0].sharers, 250);
}

#[test]
fn small_enrollment_budget_cannot_take_a_rollout() {
    let r = check(&load(&[("FLEET_LIMITER_LIMITER_ENROLLMENT_LIMIT", "5")]));
    let e = line(&r, "enrollment");
    assert_eq!(e.status, Status::Unsafe);
    assert!(
        e.reasons[0].contains("cannot admit max_site_endpoints = 250"),
        "{:?}",
        e.reasons
    );
    // A smaller site fits.
    let r = check(&load(&[
        ("FLEET_LIMITER_LIMITER_ENROLLMENT_LIMIT", "5"),
        ("FLEET_LIMITER_MAX_SITE_ENDPOINTS", "5"),
    ]));
    assert_eq!(line(&r, "enrollment").status, Status::Ok);
}

#[test]
fn extreme_fleet_settings_do_not_panic() {
    for v in [std::num::NonZeroU64::MIN, std::num::NonZeroU64::MAX] {
        let cfg = Config {
            fleet: FleetConfig {
                heartbeat_interval_seconds: v,
                poll_interval_seconds: v,
                heartbeat_timeout_seconds: v,
                max_site_endpoints: v,
                dashboard_poll_seconds: v,
                analysts_per_nat: v,
                max_agents: v,
            },
            ..Config::default()
        };
        let r = check(&cfg);
        assert_eq!(r.limiters.len(), cfg.limiters.len());
        let _ = crate::calibration::report::check_table(&r);
        let _ = crate::calibration::report::json(&r);
    }
    // A heartbeat timeout of one second can never be met.
    let mut cfg = Config::default();
    cfg.fleet.heartbeat_timeout_seconds = std::num::NonZeroU64::MIN;
    assert!(!check(&cfg).is_safe());
}

#[test]
fn shadow_mode_demotes_to_a_warning_and_off_is_reported() {
    let r = check(&load(&[
        ("FLEET_LIMITER_LIMITER_ENROLLMENT_LIMIT", "5"),
        ("FLEET_LIMITER_LIMITER_ENROLLMENT_MODE", "shadow"),
        ("FLEET_LIMITER_LIMITER_KEY_ROTATION_MODE", "off"),
    ]));
    assert!(r.is_safe());
    let e = line(&r, "enrollment");
    assert_eq!((e.status, e.mode), (Status::Warning, "shadow"));
    assert!(
        e.reasons[0].starts_with("in shadow mode, so not enforced; once enforced: cannot admit")
    );
    assert_eq!(line(&r, "key-rotation").status, Status::Off);
}

#[test]
fn disabled_limiting_starts_whatever_the_calibration() {
    let cfg = load(&[
        ("FLEET_LIMITER_LIMITER_ENROLLMENT_LIMIT", "5"),
        ("FLEET_LIMITER_ENABLED", "false"),
    ]);
    assert!(!check(&cfg).enabled);
    assert!(admit(&cfg, false).is_ok());
    let cfg = load(&[("FLEET_LIMITER_LIMITER_ENROLLMENT_LIMIT", "5")]);
    let refusal = admit(&cfg, false).unwrap_err();
    assert_eq!(refusal.problems.len(), 1, "{refusal:?}");
    assert!(
        refusal.problems[0].starts_with("enrollment: "),
        "{refusal:?}"
    );
    let admitted = admit(&cfg, true).unwrap();
    assert_eq!(admitted.overridden, refusal.problems);
}

#[test]
fn thin_headroom_warns_but_passes() {
    let r = check(&load(&[("FLEET_LIMITER_LIMITER_AGENT_DEVICE_LIMIT", "12")]));
    assert!(r.is_safe());
    assert_eq!(line(&r, "agent-device").status, Status::Warning);
    // The agent-ip ceiling meters new agent ids: agent-device's budget does not thin it.
    assert_eq!(line(&r, "agent-ip").status, Status::Ok);
    assert_eq!(r.warnings, 1);
}

#[test]
fn dashboard_and_device_poll_cadences_must_fit() {
    let r = check(&load(&[
        ("FLEET_LIMITER_LIMITER_UI_LIMIT", "60"),
        ("FLEET_LIMITER_LIMITER_CLI_DEVICE_POLL_LIMIT", "6"),
    ]));
    assert_eq!(line(&r, "ui").status, Status::Unsafe);
    assert_eq!(line(&r, "cli-device-poll").status, Status::Unsafe);
    assert_eq!(r.unsafe_limiters, 2);
}

/// `cfg` with limiter `name` changed by `f`.
fn with(cfg: &Config, name: &str, f: impl Fn(&mut crate::policy::LimiterSpec)) -> Config {
    let mut c = cfg.clone();
    for l in &mut c.limiters {
        if &*l.name == name {
            f(l);
        }
    }
    c
}

/// `cfg` with a fix applied to limiter `name`, as the pasted TOML would set it.
fn applied(cfg: &Config, name: &str, fix: &Fix) -> Config {
    let window = crate::duration::parse_duration(&fix.window).unwrap();
    let key = crate::config::parse_key(&fix.key).unwrap();
    with(cfg, name, |l| {
        l.quota = crate::limiter::Quota::new(
            std::num::NonZeroU32::new(fix.limit).unwrap(),
            window,
            l.quota.algorithm,
        );
        l.key = key.clone();
    })
}

fn limit_of(cfg: &Config, name: &str, limit: u32) -> Config {
    with(cfg, name, |l| {
        l.quota = l
            .quota
            .with_limit(std::num::NonZeroU32::new(limit).unwrap());
    })
}

/// The two properties of every suggestion: applied, `check` accepts the limiter; one step
/// smaller (one unit of limit less, one second of window more), it does not.
fn assert_smallest(cfg: &Config, name: &str) -> Option<Fix> {
    let r = check(cfg);
    let l = line(&r, name);
    if l.status < Status::AtRisk {
        assert!(l.suggestion.is_none() && l.no_fix.is_none(), "{l:?}");
        return None;
    }
    assert!(l.suggestion.is_some() != l.no_fix.is_some(), "{l:?}");
    for fix in l.suggestion.iter().chain(&l.alternatives) {
        let after = check(&applied(cfg, name, fix));
        let now = line(&after, name);
        assert!(now.status < Status::AtRisk, "{fix:?} -> {:?}", now.reasons);
        assert_eq!(now.status, fix.status, "{fix:?}");
        match fix.change {
            "limit" => {
                assert!(fix.limit > l.limit, "{fix:?}");
                let below = check(&limit_of(cfg, name, fix.limit - 1));
                assert!(line(&below, name).status >= Status::AtRisk, "{fix:?}");
            }
            "window" => {
                let secs = crate::duration::parse_duration(&fix.window)
                    .unwrap()
                    .as_secs();
                let longer = with(cfg, name, |l| {
                    l.quota = l
                        .quota
                        .with_window(std::time::Duration::from_secs(secs + 1));
                });
                assert!(
                    line(&check(&longer), name).status >= Status::AtRisk,
                    "{fix:?}"
                );
            }
            _ => assert_ne!(fix.key, l.key, "{fix:?}"),
        }
    }
    if l.no_fix.is_some() {
        let most = check(&limit_of(cfg, name, u32::MAX));
        assert!(line(&most, name).status >= Status::AtRisk);
    }
    l.suggestion.clone()
}

#[test]
fn suggestions_are_accepted_and_the_smallest() {
    let base = Config::default();
    // Too small a budget for the agents' poll and heartbeat cadence: 2 a minute for 3.
    let fix = assert_smallest(&limit_of(&base, "agent-device", 2), "agent-device").unwrap();
    assert_eq!(
        (fix.change, fix.limit, fix.window.as_str()),
        ("limit", 3, "1m")
    );
    assert_eq!(fix.toml, "[limiters.agent-device]\nlimit = 3\n");
    assert_eq!(fix.status, Status::Warning);
    // A whole NAT on one IP bucket: a budget of 750 a minute, or a key per agent.
    let nat = load(&[("FLEET_LIMITER_LIMITER_AGENT_DEVICE_KEY", "ip")]);
    let fix = assert_smallest(&nat, "agent-device").unwrap();
    assert_eq!((fix.change, fix.limit), ("limit", 750));
    let r = check(&nat);
    let alts = &line(&r, "agent-device").alternatives;
    assert!(
        alts.iter()
            .any(|f| f.change == "key" && f.key == "ip+agent"),
        "{alts:?}"
    );
    // A fixed cost of 15 leaves 30 two requests a minute: 45 carries three.
    let costly = with(&base, "agent-device", |l| {
        l.cost = crate::policy::Cost::Fixed(crate::limiter::nonzero(15));
        l.count = crate::policy::Count::Failed;
    });
    let fix = assert_smallest(&costly, "agent-device").unwrap();
    assert_eq!(fix.limit, 45);
    // At risk: the dashboards' NAT needs 10800 per 15 minutes, or a window of 83 s.
    let fix = assert_smallest(&base, "ui").unwrap();
    assert_eq!((fix.limit, fix.window.as_str()), (10800, "15m"));
    // A 15-minute fixed window locks an agent out past the timeout whatever the limit.
    let long = load(&[
        ("FLEET_LIMITER_LIMITER_AGENT_DEVICE_LIMIT", "100"),
        ("FLEET_LIMITER_LIMITER_AGENT_DEVICE_WINDOW", "15m"),
        (
            "FLEET_LIMITER_LIMITER_AGENT_DEVICE_ALGORITHM",
            "fixed-window",
        ),
    ]);
    let fix = assert_smallest(&long, "agent-device").unwrap();
    assert_eq!((fix.change, fix.window.as_str()), ("window", "119s"));
}

#[test]
fn no_fix_says_why() {
    // The ceiling forgets an agent before its next heartbeat: no budget changes that.
    let cfg = with(&Config::default(), "agent-ip", |l| {
        if let Some(r) = &mut l.new_agents {
            r.known_for = std::time::Duration::from_secs(60);
        }
    });
    assert!(assert_smallest(&cfg, "agent-ip").is_none());
    let r = check(&cfg);
    let why = line(&r, "agent-ip").no_fix.clone().unwrap();
    for needle in [
        "no limit (from 1 to 4294967295)",
        "no window (from 1s to 7d)",
        "known_for = 1m",
    ] {
        assert!(why.contains(needle), "{needle}: {why}");
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

    #[test]
    fn random_unsafe_budgets_get_the_smallest_accepted_fix(
        limit in 1u32..400,
        window in 1u64..7200,
        fixed in proptest::bool::ANY,
        ip in proptest::bool::ANY,
        cost in 1u32..4,
        probe in 1u32..100_000,
    ) {
        let cfg = with(&Config::default(), "agent-device", |l| {
            let algorithm = if fixed {
                crate::limiter::Algorithm::FixedWindow
            } else {
                crate::limiter::Algorithm::Gcra
            };
            l.quota = crate::limiter::Quota::new(
                std::num::NonZeroU32::new(limit.max(cost)).unwrap(),
                std::time::Duration::from_secs(window),
                algorithm,
            );
            l.cost = crate::policy::Cost::Fixed(crate::limiter::nonzero(cost));
            if ip {
                l.key = crate::keys::KeyKind::Ip;
            }
        });
        assert_smallest(&cfg, "agent-device");
        // Monotone in the limit: a larger budget is never refused where a smaller one passes.
        let (a, b) = (limit.max(cost), limit.max(cost).saturating_add(probe));
        let small = line(&check(&limit_of(&cfg, "agent-device", a)), "agent-device").status;
        let large = line(&check(&limit_of(&cfg, "agent-device", b)), "agent-device").status;
        proptest::prop_assert!(small >= Status::AtRisk || large < Status::AtRisk);
    }
}

#[test]
fn a_limiter_keyed_on_a_target_that_names_itself_is_warned_about() {
    let pairs = |disclose: &'static str| {
        vec![
            ("FLEET_LIMITER_LIMITER_PER_TENANT_LIMIT", "10"),
            ("FLEET_LIMITER_LIMITER_PER_TENANT_WINDOW", "1h"),
            ("FLEET_LIMITER_LIMITER_PER_TENANT_KEY", "header:x-tenant-id"),
            (
                "FLEET_LIMITER_LIMITER_PER_TENANT_ROUTES",
                "POST /auth/email",
            ),
            ("FLEET_LIMITER_LIMITER_PER_TENANT_DISCLOSE", disclose),
            ("FLEET_LIMITER_LIMITER_PER_SOURCE_LIMIT", "20"),
            ("FLEET_LIMITER_LIMITER_PER_SOURCE_WINDOW", "1h"),
            ("FLEET_LIMITER_LIMITER_PER_SOURCE_KEY", "ip"),
            (
                "FLEET_LIMITER_LIMITER_PER_SOURCE_ROUTES",
                "POST /auth/email",
            ),
            ("FLEET_LIMITER_TRUST_PROXY", "10.0.0.0/8"),
        ]
    };
    let r = check(&load(&pairs("true")));
    let l = line(&r, "per-tenant");
    assert_eq!(l.status, Status::Warning, "{:?}", l.reasons);
    assert!(
        l.reasons[0].contains("keyed on `header:x-tenant-id`")
            && l.reasons[0].contains("set disclose = false"),
        "{:?}",
        l.reasons
    );
    assert_eq!(r.warnings, 1, "{:?}", r.warning_lines());
    // The address limiter may name itself: the client knows its own address.
    assert_eq!(line(&r, "per-source").status, Status::Unloaded);
    let r = check(&load(&pairs("false")));
    assert_eq!(line(&r, "per-tenant").status, Status::Unloaded);
    assert_eq!(r.warnings, 0, "{:?}", r.warning_lines());
}

#[test]
fn the_answers_while_redis_is_down_are_judged_with_local_among_them() {
    let cfg = load(&[
        ("FLEET_LIMITER_STORE_URL", "redis://u:hunter2@h:6379"),
        ("FLEET_LIMITER_LIMITER_AGENT_DEVICE_ON_STORE_ERROR", "local"),
        ("FLEET_LIMITER_LIMITER_ENROLLMENT_ON_STORE_ERROR", "deny"),
    ]);
    let r = check(&cfg);
    assert_eq!(r.store_down.local, ["agent-device"]);
    assert_eq!(r.store_down.deny, ["enrollment"]);
    assert!(r.store_down.allow.contains(&"agent-ip".to_owned()));
    // The limiters are judged as before: a local answer changes no calibration.
    assert_eq!(line(&r, "agent-device").status, Status::Ok);
    let table = crate::calibration::report::check_table(&r);
    assert!(
        table.contains(
            "local (each instance counts alone: up to one budget per instance): agent-device"
        ),
        "{table}"
    );
    assert!(table.contains("deny (refused): enrollment"), "{table}");
    assert!(!table.contains("hunter2"));
    let json = crate::calibration::report::json(&r);
    assert!(
        json.contains("\"local\": [\n      \"agent-device\""),
        "{json}"
    );
    // The memory store cannot fail: nothing to say.
    let r = check(&load(&[(
        "FLEET_LIMITER_LIMITER_AGENT_DEVICE_ON_STORE_ERROR",
        "local",
    )]));
    assert_eq!(r.store_down, super::types::StoreDown::default());
    assert!(!crate::calibration::report::check_table(&r).contains("While Redis"));
}
