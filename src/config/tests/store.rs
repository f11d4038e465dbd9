//! `[store]`: the shorthand, the backend a URL or cluster selects, calls in flight, and the
//! store described without its password.

use super::*;

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
        err.starts_with("environment variable FLEET_LIMITER_STORE_URL: store.url: `http://cache:6380`: `http://` is not a Redis scheme; write redis://host:port (rediss:// for TLS)"),
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

/// The error `[store]` written as `toml` gives.
fn store_error(toml: &str) -> String {
    file_error(toml, &[])
}

#[test]
fn every_bad_redis_url_names_the_field_what_is_wrong_and_the_fix() {
    let e = store_error("[store]\nurl = \"redis://127.0.0.1:6379/db0\"\n");
    assert!(
        e.contains("store.url: `redis://127.0.0.1:6379/db0`: `/db0`: the database is a number: redis://127.0.0.1:6379/0"),
        "{e}"
    );
    assert!(e.starts_with("<dir>/"), "the file is named: {e}");
    let e = store_error("[store]\nurl = \"redis://:s3cret@cache:port\"\n");
    assert!(
        e.contains("store.url: `redis://:***@cache:port`: `port` is not a port"),
        "{e}"
    );
    assert!(!e.contains("s3cret"), "{e}");
    let e = store_error("[store]\nurl = \"\"\n");
    assert!(e.contains("store.url: ``: is empty"), "{e}");
    let e = store_error("[store]\ncluster = [\"redis://a:7000\", \"\", \"redis://c:7002\"]\n");
    assert!(e.contains("store.cluster: entry 2 ``: is empty"), "{e}");
    let e = store_error("[store]\ncluster = [\"redis://a:7000\", \"redis://a:7000/0\"]\n");
    assert!(
        e.contains("store.cluster: entries 1 and 2 name the same node"),
        "{e}"
    );
    let e = store_error("[store]\ncluster = [\"redis://a:7000/1\"]\n");
    assert!(e.contains("store.cluster: entry 1 `redis://a:7000/1`: names database 1, and a Redis Cluster has database 0 only"), "{e}");
    let e = store_error("[store]\ncluster = [\"a:7000\"]\n");
    assert!(
        e.contains(
            "store.cluster: entry 1 `a:7000`: has no scheme; a Cluster node is redis://host:port"
        ),
        "{e}"
    );
    let err = Loader::new()
        .env([(
            "FLEET_LIMITER_STORE_URL".to_owned(),
            "redis://cache:6379/0?protocol=resp3".to_owned(),
        )])
        .load()
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("environment variable FLEET_LIMITER_STORE_URL: store.url: `redis://cache:6379/0?***`: has options"),
        "{err}"
    );
}

#[test]
fn store_require_is_for_redis_and_off_by_default() {
    assert!(!Config::default().store.require);
    let cfg = Loader::new()
        .env([
            (
                "FLEET_LIMITER_STORE_URL".to_owned(),
                "redis://cache:6379".to_owned(),
            ),
            ("FLEET_LIMITER_STORE_REQUIRE".to_owned(), "true".to_owned()),
        ])
        .load()
        .expect("valid");
    assert!(cfg.store.require);
    let e = store_error("[store]\nrequire = true\n");
    assert!(
        e.starts_with("<dir>/fleet-limiter.toml: store.require: asks for a Redis store")
            && e.contains(
                "set store.url (redis://host:6379) or store.cluster, or remove store.require"
            ),
        "{e}"
    );
    let e = store_error("[store]\nrequire = \"yes\"\n");
    assert!(e.contains("store.require"), "{e}");
}
