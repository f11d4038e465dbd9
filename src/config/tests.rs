//! Configuration layers and the errors a bad configuration produces. Every error names where
//! the value came from (file, variable or flag), the field, and what is allowed; the messages
//! are kept as snapshots under `snapshots/`.

use super::*;
use std::io::Write;

/// A config file with a stable name inside a temporary directory.
struct File {
    dir: tempfile::TempDir,
    path: PathBuf,
}

fn file(toml: &str) -> File {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("fleet-limiter.toml");
    let mut f = std::fs::File::create(&path).expect("create");
    f.write_all(toml.as_bytes()).expect("write");
    File { dir, path }
}

/// The error loading this file (with these variables), its directory shown as `<dir>`.
fn file_error(toml: &str, env: &[(&str, &str)]) -> String {
    let f = file(toml);
    let vars = env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned()));
    let err = Loader::new()
        .file(&f.path)
        .env(vars)
        .load()
        .expect_err("this configuration must be refused");
    err.to_string()
        .replace(&f.dir.path().display().to_string(), "<dir>")
}

fn env_error(env: &[(&str, &str)]) -> String {
    let vars = env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned()));
    Loader::new()
        .env(vars)
        .load()
        .expect_err("this configuration must be refused")
        .to_string()
}

fn limiter<'a>(cfg: &'a Config, name: &str) -> &'a LimiterSpec {
    cfg.limiters
        .iter()
        .find(|l| &*l.name == name)
        .expect("limiter")
}

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
                l.quota.window.as_secs(),
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
        ad.quota.window,
        Duration::from_secs(60),
        "the window stays the built-in one"
    );
    assert_eq!(ad.key, KeyKind::IpAgent);
    let reports = limiter(&cfg, "reports");
    assert_eq!(
        (reports.quota.limit(), reports.quota.window),
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
        limiter(&cfg, "key-rotation").quota.window,
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
fn store_shorthand() {
    let cfg = Loader::new()
        .flag("store", "redis://127.0.0.1:6379", "--store")
        .load()
        .expect("valid");
    assert_eq!(cfg.store.backend, StoreBackend::Redis);
    assert_eq!(cfg.store.url.as_deref(), Some("redis://127.0.0.1:6379"));
    let err = Loader::new()
        .flag("store", "postgres://x", "--store")
        .load()
        .unwrap_err();
    snap!("config_error_store_shorthand", err.to_string());
    // TLS: `rediss://` selects Redis too.
    let cfg = Loader::new()
        .flag("store", "rediss://cache:6380", "--store")
        .load()
        .expect("valid");
    assert_eq!(cfg.store.url.as_deref(), Some("rediss://cache:6380"));
    assert_eq!(cfg.store.ca_file, None);
    assert!(!cfg.store.insecure_skip_verify);
    let err = Loader::new()
        .env([(
            "FLEET_LIMITER_STORE_URL".to_owned(),
            "http://cache:6380".to_owned(),
        )])
        .load()
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("environment variable FLEET_LIMITER_STORE_URL: store.url: `http://cache:6380` is not a redis:// or rediss:// (TLS) URL"),
        "{err}"
    );
    let err = Loader::new()
        .env([(
            "FLEET_LIMITER_STORE_CLUSTER".to_owned(),
            "rediss://a:1,redis://b:1".to_owned(),
        )])
        .load()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("store.cluster: mixes redis:// and rediss://"),
        "{err}"
    );
    let err = Loader::new()
        .flag("store", "rediss://cache:6380", "--store")
        .env([(
            "FLEET_LIMITER_STORE_CA_FILE".to_owned(),
            "/nonexistent/ca.pem".to_owned(),
        )])
        .load()
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("environment variable FLEET_LIMITER_STORE_CA_FILE: store.ca_file: `/nonexistent/ca.pem` cannot be read"),
        "{err}"
    );
}

#[test]
fn error_unknown_field() {
    snap!(
        "config_error_unknown_field",
        file_error("[server]\nlisten_addr = \"127.0.0.1:1\"\n", &[])
    );
    snap!(
        "config_error_unknown_limiter_field",
        file_error("[limiters.agent-device]\nburst = 5\n", &[])
    );
    snap!(
        "config_error_unknown_section",
        file_error("[serverr]\nlisten = \"127.0.0.1:1\"\n", &[])
    );
}

#[test]
fn error_wrong_type() {
    snap!(
        "config_error_wrong_type",
        file_error("[limiters.ui]\nlimit = \"lots\"\n", &[])
    );
    snap!(
        "config_error_limiter_not_table",
        file_error("[limiters]\nui = 5\n", &[])
    );
}

#[test]
fn every_section_names_the_field_of_a_wrong_type_in_operator_words() {
    let cases = [
        "[ops]\nnear_limit_percent = \"lots\"\n",
        "[ops]\nadmin_listen = 7391\n",
        "[identity]\nleeway = [1, 2]\n",
        "[identity]\naudiences = \"app\"\n",
        "[cors]\nallow_credentials = \"yes\"\n",
        "[cors]\nallowed_origins = \"https://dash.example.com\"\n",
        "[server]\nlisten = 8080\n",
        "[store]\nmax_keys = 1.5\n",
        "[path]\nbackslash = true\n",
        "[decision]\nallow_from = \"10.0.0.5\"\n",
        "enabled = \"yes\"\n",
    ];
    let shown: Vec<String> = cases
        .iter()
        .map(|toml| format!("{}=> {}", toml.replace('\n', " "), file_error(toml, &[])))
        .collect();
    for line in &shown {
        for rust in [
            " i64",
            " u64",
            " u8",
            " usize",
            " f64",
            "a sequence",
            "struct ",
        ] {
            assert!(!line.contains(rust), "a Rust type name in {line}");
        }
    }
    snap!("config_error_section_types", shown.join("\n"));
}

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
    assert_eq!(
        (t.key, t.key_header.as_deref()),
        (KeyKind::Header, Some("x-tenant-id"))
    );
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
fn error_bad_listen() {
    snap!(
        "config_error_listen",
        file_error("[server]\nlisten = \"localhost\"\n", &[])
    );
}

#[test]
fn error_bad_cidr() {
    snap!(
        "config_error_cidr",
        file_error("[client_ip]\ntrust_proxy = [\"10.0.0.0/33\"]\n", &[])
    );
}

#[test]
fn error_ipv6_prefix_out_of_range() {
    snap!(
        "config_error_ipv6_prefix",
        file_error("[client_ip]\nipv6_prefix = 80\n", &[])
    );
}

#[test]
fn store_calls_in_flight_from_the_environment_and_its_range() {
    let env = [("FLEET_LIMITER_STORE_CALLS_IN_FLIGHT", "4")];
    let cfg = Loader::new()
        .env(env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())))
        .load()
        .expect("valid");
    assert_eq!(cfg.store.calls_in_flight, 4);
    snap!(
        "config_error_calls_in_flight",
        file_error("[store]\ncalls_in_flight = 0\n", &[])
    );
}

#[test]
fn error_bad_upstream() {
    snap!(
        "config_error_upstream",
        file_error("[server]\nupstream = \"ftp://api.example\"\n", &[])
    );
}

#[test]
fn https_upstream_and_tls_settings() {
    let vars = [
        ("FLEET_LIMITER_UPSTREAM", "https://api.internal:8443/v1/"),
        ("FLEET_LIMITER_UPSTREAM_CA_FILE", "/etc/ssl/api-ca.pem"),
        ("FLEET_LIMITER_UPSTREAM_INSECURE_SKIP_VERIFY", "no"),
        ("FLEET_LIMITER_TLS_CERT_FILE", "/etc/fleet/cert.pem"),
        ("FLEET_LIMITER_TLS_KEY_FILE", "/etc/fleet/key.pem"),
    ];
    let cfg = Loader::new()
        .env(vars.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())))
        .load()
        .expect("valid");
    assert_eq!(
        cfg.server.upstream.as_ref().map(UpstreamUrl::as_str),
        Some("https://api.internal:8443/v1")
    );
    assert_eq!(
        cfg.server.upstream_ca_file.as_deref(),
        Some(Path::new("/etc/ssl/api-ca.pem"))
    );
    assert!(!cfg.server.upstream_insecure_skip_verify);
    assert_eq!(
        cfg.server.tls_key_file.as_deref(),
        Some(Path::new("/etc/fleet/key.pem"))
    );
    // Credentials are refused after https:// as after http://.
    let e = file_error(
        "[server]\nupstream = \"https://admin:S3cretPassw0rd@api.internal\"\n",
        &[],
    );
    assert!(
        e.contains("credentials") && !e.contains("S3cretPassw0rd"),
        "{e}"
    );
    // One of the listener's pair alone is an error naming the one that was set and its origin.
    let e = env_error(&[("FLEET_LIMITER_TLS_CERT_FILE", "/etc/fleet/cert.pem")]);
    assert!(
        e.starts_with("environment variable FLEET_LIMITER_TLS_CERT_FILE: server.tls_cert_file: is set but server.tls_key_file is not"),
        "{e}"
    );
    let e = file_error("[server]\ntls_key_file = \"key.pem\"\n", &[]);
    assert!(
        e.starts_with(
            "<dir>/fleet-limiter.toml: server.tls_key_file: is set but server.tls_cert_file is not"
        ),
        "{e}"
    );
}

#[test]
fn error_invalid_toml() {
    snap!(
        "config_error_toml_syntax",
        file_error("[server\nlisten = 1\n", &[])
    );
}

#[test]
fn error_missing_file() {
    let err = Loader::new()
        .file("/nonexistent/fleet-limiter.toml")
        .load()
        .unwrap_err();
    snap!("config_error_missing_file", err.to_string());
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
fn error_upstream_with_credentials() {
    let e = file_error(
        "[server]\nupstream = \"http://admin:S3cretPassw0rd@127.0.0.1:3000\"\n",
        &[],
    );
    assert!(!e.contains("S3cretPassw0rd"), "{e}");
    snap!("config_error_upstream_credentials", e);
}

#[test]
fn error_trust_proxy_everything() {
    snap!(
        "config_error_trust_everything",
        file_error(
            "[client_ip]\ntrust_proxy = [\"0.0.0.0/1\", \"128.0.0.0/1\"]\n",
            &[]
        )
    );
    let cfg = Loader::new()
        .flag("client_ip.trust_proxy", "::/0", "--trust-proxy")
        .env([(
            "FLEET_LIMITER_TRUST_ALL_ADDRESSES".to_owned(),
            "true".to_owned(),
        )])
        .load()
        .expect("acknowledged");
    assert!(cfg.client_ip.trust_all_addresses);
}

#[test]
fn error_toml_syntax_in_a_secret() {
    let e = file_error(
        "[identity]\njwt_hs256_secret = \"Zr8vQm2LwX4kT9pN\\qB6yHc3JfD1sGa7UeKo5RtW\"\n",
        &[],
    );
    assert!(!e.contains("Zr8vQm2L") && !e.contains("B6yHc3Jf"), "{e}");
    snap!("config_error_toml_syntax_secret", e);
}

#[test]
fn error_secret_of_the_wrong_type() {
    let e = file_error(
        "[store]\ncluster = \"redis://default:S3cretPassw0rd@127.0.0.1:1\"\n",
        &[],
    );
    assert!(!e.contains("S3cretPassw0rd"), "{e}");
    assert!(e.contains("store.cluster: has the wrong type"), "{e}");
}

#[test]
fn body_timeout_and_min_rate_from_each_layer() {
    let cfg = Config::default();
    assert_eq!(cfg.server.body_timeout, Duration::from_secs(30));
    assert_eq!(cfg.server.body_min_rate, 240);
    let f = file("[server]\nbody_timeout = \"45s\"\nbody_min_rate = 1000\n");
    let cfg = Loader::new().file(&f.path).load().expect("valid");
    assert_eq!(cfg.server.body_timeout, Duration::from_secs(45));
    assert_eq!(cfg.server.body_min_rate, 1000);
    let f = file("[server]\nbody_min_rate = \"1KiB/s\"\n");
    let cfg = Loader::new()
        .file(&f.path)
        .env([("FLEET_LIMITER_BODY_TIMEOUT".to_owned(), "10s".to_owned())])
        .load()
        .expect("valid");
    assert_eq!(cfg.server.body_timeout, Duration::from_secs(10));
    assert_eq!(cfg.server.body_min_rate, 1024);
    let cfg = Loader::new()
        .env([("FLEET_LIMITER_BODY_MIN_RATE".to_owned(), "2MB".to_owned())])
        .flag("server.body_min_rate", "0", "--body-min-rate")
        .flag("server.body_timeout", "500ms", "--body-timeout")
        .load()
        .expect("valid");
    assert_eq!(cfg.server.body_min_rate, 0, "0 turns the rate rule off");
    assert_eq!(cfg.server.body_timeout, Duration::from_millis(500));
}

#[test]
fn errors_in_body_timeout_and_min_rate() {
    snap!(
        "config_error_env_body_min_rate",
        env_error(&[("FLEET_LIMITER_BODY_MIN_RATE", "fast")])
    );
    snap!(
        "config_error_body_min_rate_negative",
        file_error("[server]\nbody_min_rate = -240\n", &[])
    );
    snap!(
        "config_error_body_min_rate_float",
        file_error("[server]\nbody_min_rate = 2.5\n", &[])
    );
    snap!(
        "config_error_env_body_timeout",
        env_error(&[("FLEET_LIMITER_BODY_TIMEOUT", "0s")])
    );
    let err = Loader::new()
        .flag("server.body_min_rate", "1GiB", "--body-min-rate")
        .load()
        .unwrap_err();
    snap!("config_error_flag_body_min_rate", err.to_string());
}

#[test]
fn a_redis_url_or_cluster_alone_selects_redis() {
    let cfg = Loader::new()
        .env([(
            "FLEET_LIMITER_STORE_URL".to_owned(),
            "redis://10.0.0.5:6379".to_owned(),
        )])
        .load()
        .expect("valid");
    assert_eq!(cfg.store.backend, StoreBackend::Redis);
    let f = file("[store]\ncluster = [\"redis://10.0.0.11:6379\"]\n");
    let cfg = Loader::new().file(&f.path).load().expect("valid");
    assert_eq!(cfg.store.backend, StoreBackend::Redis);
    assert_eq!(cfg.store.describe(), "redis cluster redis://10.0.0.11:6379");
    let cfg = Loader::new().load().expect("valid");
    assert_eq!(cfg.store.backend, StoreBackend::Memory);
    assert_eq!(cfg.store.describe(), "memory");
}

#[test]
fn the_memory_backend_with_a_redis_url_is_refused_with_the_fix() {
    snap!(
        "config_error_store_memory_with_url",
        file_error(
            "[store]\nbackend = \"memory\"\nurl = \"redis://default:S3cretPassw0rd@10.0.0.5:6379\"\n",
            &[]
        )
    );
    let e = env_error(&[
        ("FLEET_LIMITER_STORE_BACKEND", "memory"),
        ("FLEET_LIMITER_STORE_CLUSTER", "redis://10.0.0.11:6379"),
    ]);
    assert!(
        e.starts_with("environment variable FLEET_LIMITER_STORE_BACKEND: store.backend:")
            && e.contains("environment variable FLEET_LIMITER_STORE_CLUSTER"),
        "{e}"
    );
    // `--store memory` chooses the store whole: it sets aside a URL from a lower layer.
    let f = file("[store]\nurl = \"redis://10.0.0.5:6379\"\n");
    let cfg = Loader::new()
        .file(&f.path)
        .flag("store", "memory", "--store")
        .load()
        .expect("the flag picks the memory store");
    assert_eq!(cfg.store.backend, StoreBackend::Memory);
    assert_eq!(cfg.store.url, None);
}

#[test]
fn the_store_in_use_is_described_without_its_password() {
    let cfg = Loader::new()
        .flag(
            "store",
            "redis://default:S3cretPassw0rd@10.0.0.5:6379/2",
            "--store",
        )
        .load()
        .expect("valid");
    assert_eq!(
        cfg.store.describe(),
        "redis redis://default:***@10.0.0.5:6379/2"
    );
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
fn headers_profile_from_every_layer() {
    use super::headers::{HeaderProfile, LegacyReset, Standard};
    assert_eq!(
        Config::default().headers,
        HeaderProfile {
            standard: Standard::Draft6,
            legacy: true,
            legacy_reset: LegacyReset::Unix,
        }
    );
    let f = file("[headers]\nstandard = \"draft-10\"\nlegacy = false\n");
    let cfg = Loader::new().file(&f.path).load().expect("file");
    assert_eq!(cfg.headers.standard, Standard::Draft10);
    assert!(!cfg.headers.legacy);
    // The environment over the file, a flag over both; whitespace around a value is dropped.
    let cfg = Loader::new()
        .file(&f.path)
        .env([
            (
                "FLEET_LIMITER_HEADERS_STANDARD".to_owned(),
                "draft-7".to_owned(),
            ),
            ("FLEET_LIMITER_HEADERS_LEGACY".to_owned(), "yes".to_owned()),
            (
                "FLEET_LIMITER_HEADERS_LEGACY_RESET".to_owned(),
                " delta ".to_owned(),
            ),
        ])
        .flag("headers.standard", "off", "--headers-standard")
        .load()
        .expect("layers");
    assert_eq!(
        cfg.headers,
        HeaderProfile {
            standard: Standard::Off,
            legacy: true,
            legacy_reset: LegacyReset::Delta,
        }
    );
    assert_eq!(cfg.origin("headers.standard"), "flag --headers-standard");
    for s in Standard::ALL {
        let cfg = Loader::new()
            .env([(
                "FLEET_LIMITER_HEADERS_STANDARD".to_owned(),
                s.as_str().to_owned(),
            )])
            .load()
            .expect("every standard");
        assert_eq!(cfg.headers.standard, s);
    }
}

#[test]
fn error_headers() {
    let lines = [
        env_error(&[("FLEET_LIMITER_HEADERS_STANDARD", "Draft-7")]),
        env_error(&[("FLEET_LIMITER_HEADERS_STANDARD", "true")]),
        env_error(&[("FLEET_LIMITER_HEADERS_STANDARD", "false")]),
        env_error(&[("FLEET_LIMITER_HEADERS_STANDARD", &"draft-".repeat(50))]),
        env_error(&[("FLEET_LIMITER_HEADERS_LEGACY", "maybe")]),
        env_error(&[("FLEET_LIMITER_HEADERS_LEGACY_RESET", "epoch")]),
        file_error("[headers]\nstandard = true\n", &[]),
        file_error("[headers]\nstandard = 7\n", &[]),
        file_error("[headers]\nlegacy = \"true\"\n", &[]),
        file_error("[headers]\nlegacy_reset = 0\n", &[]),
        file_error("[headers]\nreset = \"unix\"\n", &[]),
    ];
    snap!("config_error_headers", lines.join("\n"));
}
