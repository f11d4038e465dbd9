//! The layers: built-in defaults, a file naming only some fields, variables over the file and
//! flags over both, and errors that name the variable or flag they came from.

use super::*;

#[test]
fn the_defaults_are_the_calibration() {
    let cfg = Config::default();
    let table: Vec<String> = cfg
        .limiters
        .iter()
        .map(|l| {
            let routes: Vec<&str> = l.routes.iter().map(RoutePattern::as_str).collect();
            let except: Vec<&str> = l.except.iter().map(RoutePattern::as_str).collect();
            let meter = match l.new_agents {
                None => String::new(),
                Some(r) => format!(
                    " | meter new-agents, known {}s, at most {} per ip",
                    r.known_for.as_secs(),
                    r.max_known
                ),
            };
            format!(
                "{} | {} / {}s | key {} | group {} | credential {} | {} | routes {:?} | except {:?}{meter}",
                l.name,
                l.quota.limit(),
                l.quota.window().as_secs(),
                l.key.as_str(),
                l.group,
                l.credential.as_str(),
                l.quota.algorithm.as_str(),
                routes,
                except
            )
        })
        .collect();
    snap!("config_default_limiters", table.join("\n"));
    assert_eq!(cfg.server.listen.to_string(), "127.0.0.1:8080");
    assert_eq!(cfg.server.connect_timeout, Duration::from_secs(2));
    assert_eq!(cfg.server.read_timeout, Duration::from_secs(30));
    assert_eq!(cfg.client_ip.ipv6_prefix, 56);
    assert!(cfg.client_ip.trusted.ranges.is_empty());
    assert_eq!(cfg.store.backend, StoreBackend::Memory);
    assert_eq!(cfg.store.max_keys, 100_000);
    assert_eq!(cfg.store.calls_in_flight, 1);
    assert!(cfg.enabled);
    assert_eq!(cfg.fleet, FleetConfig::default());
}

#[test]
fn a_file_overrides_only_the_fields_it_names_and_adds_limiters() {
    let f = file(
        r#"
[server]
upstream = "http://127.0.0.1:3000/"
read_timeout = 5

[limiters.agent-device]
limit = 60

[limiters.reports]
limit = 5
window = "1h"
key = "user-or-ip"
routes = ["POST /api/reports/**"]
"#,
    );
    let cfg = Loader::new().file(&f.path).load().expect("valid");
    assert_eq!(
        cfg.server.upstream.as_ref().map(UpstreamUrl::as_str),
        Some("http://127.0.0.1:3000")
    );
    assert_eq!(cfg.server.read_timeout, Duration::from_secs(5));
    let ad = limiter(&cfg, "agent-device");
    assert_eq!(ad.quota.limit(), 60);
    assert_eq!(
        ad.quota.window(),
        Duration::from_secs(60),
        "the window stays the built-in one"
    );
    assert_eq!(ad.key, KeyKind::IpAgent);
    let reports = limiter(&cfg, "reports");
    assert_eq!(
        (reports.quota.limit(), reports.quota.window()),
        (5, Duration::from_secs(3600))
    );
    assert_eq!(&*reports.group, "reports", "a new limiter is its own group");
    assert_eq!(cfg.limiters.len(), defaults::LIMITERS.len() + 1);
}

#[test]
fn environment_overrides_the_file_and_flags_override_both() {
    let f = file("[limiters.agent-device]\nlimit = 60\n[client_ip]\nipv6_prefix = 48\n");
    let env = [
        ("FLEET_LIMITER_LIMITER_AGENT_DEVICE_LIMIT", "90"),
        ("FLEET_LIMITER_LIMITER_KEY_ROTATION_WINDOW", "1h"),
        ("FLEET_LIMITER_IPV6_PREFIX", "60"),
        ("FLEET_LIMITER_TRUST_PROXY", "10.0.0.0/8, 192.168.0.1"),
        ("FLEET_LIMITER_ENABLED", "off"),
        ("FLEET_LIMITER_CONFIG", "ignored: names the file"),
        ("FLEET_LIMITER_LOG", "ignored: read by logging"),
    ];
    let cfg = Loader::new()
        .file(&f.path)
        .env(env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())))
        .flag("client_ip.ipv6_prefix", "64", "--ipv6-prefix")
        .flag("client_ip.trust_proxy", "::1", "--trust-proxy")
        .flag("client_ip.trust_proxy", "172.16.0.0/12", "--trust-proxy")
        .load()
        .expect("valid");
    assert_eq!(limiter(&cfg, "agent-device").quota.limit(), 90);
    assert_eq!(
        limiter(&cfg, "key-rotation").quota.window(),
        Duration::from_secs(3600)
    );
    assert_eq!(limiter(&cfg, "key-rotation").quota.limit(), 3);
    assert_eq!(cfg.client_ip.ipv6_prefix, 64);
    let ranges: Vec<String> = cfg
        .client_ip
        .trusted
        .ranges
        .iter()
        .map(|r| r.to_string())
        .collect();
    assert_eq!(
        ranges,
        ["::1/128", "172.16.0.0/12"],
        "repeated flags add up and replace the variable"
    );
    assert!(!cfg.enabled);
}

#[test]
fn errors_from_environment_variables_name_the_variable() {
    snap!(
        "config_error_env_limit",
        env_error(&[("FLEET_LIMITER_LIMITER_AGENT_DEVICE_LIMIT", "lots")])
    );
    snap!(
        "config_error_env_zero_limit",
        env_error(&[("FLEET_LIMITER_LIMITER_AGENT_DEVICE_LIMIT", "0")])
    );
    snap!(
        "config_error_env_prefix",
        env_error(&[("FLEET_LIMITER_IPV6_PREFIX", "99")])
    );
    snap!(
        "config_error_env_bool",
        env_error(&[("FLEET_LIMITER_ENABLED", "maybe")])
    );
    snap!(
        "config_error_env_limiter_field",
        env_error(&[("FLEET_LIMITER_LIMITER_AGENT_DEVICE_BURST", "5")])
    );
    snap!(
        "config_error_env_window",
        env_error(&[("FLEET_LIMITER_LIMITER_UI_WINDOW", "forever")])
    );
    snap!(
        "config_error_env_key_kind",
        env_error(&[("FLEET_LIMITER_LIMITER_UI_KEY", "ip+user")])
    );
    snap!(
        "config_error_env_forwarded_header",
        env_error(&[("FLEET_LIMITER_FORWARDED_HEADER", "x-real-ip")])
    );
    // A variable overriding the file is named, not the file.
    snap!(
        "config_error_env_over_file",
        file_error(
            "[client_ip]\nipv6_prefix = 48\n",
            &[("FLEET_LIMITER_IPV6_PREFIX", "65")]
        )
    );
}

#[test]
fn errors_from_flags_name_the_flag() {
    let err = Loader::new()
        .flag("server.listen", "nowhere", "--listen")
        .load()
        .unwrap_err();
    snap!("config_error_flag_listen", err.to_string());
    let err = Loader::new()
        .flag("client_ip.trust_proxy", "not-a-net", "--trust-proxy")
        .load()
        .unwrap_err();
    snap!("config_error_flag_trust_proxy", err.to_string());
}

#[test]
fn unknown_variables_are_named_with_the_nearest_setting_and_never_their_value() {
    let l = Loader::new().env([
        (
            "FLEET_LIMITER_UPSTREM".to_owned(),
            "hunter2-secret".to_owned(),
        ),
        ("FLEET_LIMITER_JWT_HS256_SECRT".to_owned(), "x".to_owned()),
        (
            "FLEET_LIMITER_SOMETHING_ELSE_ENTIRELY".to_owned(),
            "y".to_owned(),
        ),
        (
            "FLEET_LIMITER_UPSTREAM".to_owned(),
            "http://127.0.0.1:3000".to_owned(),
        ),
        ("FLEET_LIMITER_LOG".to_owned(), "info".to_owned()),
        ("FLEET_LIMITER_CONFIG".to_owned(), "x.toml".to_owned()),
        ("FLEET_LIMITER_STORE".to_owned(), "memory".to_owned()),
        (
            "FLEET_LIMITER_ALLOW_UNSAFE_CALIBRATION".to_owned(),
            "1".to_owned(),
        ),
    ]);
    assert!(l.load().is_ok(), "unknown variables do not fail the load");
    let w = l.warnings();
    assert_eq!(w.len(), 3, "{w:?}");
    assert!(
        w[0].contains("FLEET_LIMITER_UPSTREM")
            && w[0].contains("did you mean FLEET_LIMITER_UPSTREAM?"),
        "{w:?}"
    );
    assert!(
        w[1].contains("did you mean FLEET_LIMITER_JWT_HS256_SECRET?"),
        "{w:?}"
    );
    assert!(!w[2].contains("did you mean"), "{w:?}");
    assert!(w.iter().all(|l| !l.contains("hunter2")), "{w:?}");
}
