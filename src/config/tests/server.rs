//! `[server]` and `[client_ip]`: listen address, trusted proxies, IPv6 prefix, the upstream and
//! its TLS, and the pace a client's body must keep.

use super::*;

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
