use super::*;

fn refused(url: &str, node: bool) -> String {
    match parse(url, node) {
        Ok(u) => panic!("`{url}` was accepted as {u:?}"),
        Err(e) => e,
    }
}

#[test]
fn a_database_written_as_a_name_is_refused_with_the_number_to_write() {
    let e = refused("redis://127.0.0.1:6379/db0", false);
    assert!(
        e.contains("the database is a number: redis://127.0.0.1:6379/0"),
        "{e}"
    );
    let e = refused("rediss://cache.internal:6380/db3", false);
    assert!(e.contains("rediss://cache.internal:6380/0 (or /3)"), "{e}");
    for db in [
        "-1",
        "+1",
        "0x1",
        "1.0",
        "١",
        "%30",
        "9999999999999999999999",
    ] {
        let e = refused(&format!("redis://h:6379/{db}"), false);
        assert!(e.contains("redis://h:6379/0"), "{db}: {e}");
    }
    let e = refused("redis://h:6379/0/1", false);
    assert!(e.contains("more path than a database number"), "{e}");
}

#[test]
fn schemes_other_than_redis_and_rediss_are_refused_with_the_form() {
    for (url, says) in [
        ("http://127.0.0.1:6379", "`http://` is not a Redis scheme"),
        ("tcp://127.0.0.1:6379", "`tcp://` is not a Redis scheme"),
        ("redis-cluster://a:7000", "not a Redis scheme"),
        ("unix:///run/redis.sock", "Unix socket is not supported"),
        (
            "redis+unix:///run/redis.sock",
            "Unix socket is not supported",
        ),
        ("127.0.0.1:6379", "has no scheme"),
        ("127.0.0.1:6379/0", "has no scheme"),
        ("localhost", "e.g. redis://localhost:6379"),
        ("redis:/127.0.0.1:6379", "must be followed by `//`"),
        ("redis:127.0.0.1:6379", "write redis://127.0.0.1:6379"),
        ("REDIS://127.0.0.1:6379", "lower case: redis://"),
        ("Rediss://127.0.0.1:6379", "lower case: rediss://"),
    ] {
        let e = refused(url, false);
        assert!(e.contains(says), "{url}: {e}");
        assert!(
            e.contains("redis://") || e.contains("rediss://"),
            "{url}: the fix is shown: {e}"
        );
    }
    let e = refused("redis+sentinel://a:26379/m", true);
    assert!(e.contains("store.url alone"), "{e}");
}

#[test]
fn ports_and_hosts_that_are_not_are_refused() {
    for (url, says) in [
        ("redis://h:port", "`port` is not a port"),
        ("redis://h:0", "`0` is not a port"),
        ("redis://h:65536", "`65536` is not a port"),
        ("redis://h:-1", "`-1` is not a port"),
        ("redis://h:+6379", "`+6379` is not a port"),
        ("redis://h:", "no port after it"),
        ("redis://:6379", "names no host"),
        ("redis://", "names no host"),
        ("redis:///0", "names no host"),
        ("redis://user:pw@/0", "names no host"),
        ("redis://[::1", "without closing it"),
        ("redis://[nothost]:6379", "not an IPv6 address"),
        ("redis://::1:6379", "IPv6 address in brackets"),
        ("redis://a,b:6379", "lists several hosts"),
        ("redis://h%41:6379", "not a host name"),
        ("redis://-h:6379", "not a host name"),
        ("", "is empty"),
        ("   ", "is empty"),
        ("redis://h:6379 ", "white space"),
        ("redis://h:63\n79", "white space or a control character"),
        ("redis://h\t:6379", "white space"),
    ] {
        let e = refused(url, false);
        assert!(e.contains(says), "{url:?}: {e}");
    }
    assert!(refused(&format!("redis://{}", "a".repeat(5000)), false).contains("longer than"));
}

#[test]
fn options_and_fragments_are_refused_naming_the_settings_that_do_their_work() {
    let e = refused("redis://h:6379/0?protocol=resp3", false);
    assert!(e.contains("not read") && e.contains("store.timeout"), "{e}");
    let e = refused("rediss://h:6380/#insecure", false);
    assert!(e.contains("store.insecure_skip_verify"), "{e}");
    let e = refused("redis://:p?ss@h:6379", false);
    assert!(e.contains("%3F"), "{e}");
    let e = refused("redis://:50%@h:6379", false);
    assert!(e.contains("%25"), "{e}");
}

#[test]
fn a_cluster_node_has_database_0_and_one_host() {
    let e = refused("redis://a:7000/2", true);
    assert!(
        e.contains("database 0 only; drop `/2`: redis://a:7000"),
        "{e}"
    );
    let e = refused("redis://a:7000,b:7001", true);
    assert!(e.contains("store.cluster = ["), "{e}");
    assert!(parse("redis://a:7000/0", true).is_ok());
}

#[test]
fn errors_never_repeat_the_password() {
    for url in [
        "redis://u:s3cret@h:6379/db0",
        "redis://u:s3cret@h:port",
        "redis://u:s3cret@h:6379/0?x=1",
        "redis://u:s3cret@:6379",
        "redis://u:s3/cret@h:6379",
    ] {
        let e = refused(url, false);
        assert!(!e.contains("s3cret"), "{url}: {e}");
    }
}

#[test]
fn what_is_accepted_is_read_as_the_redis_client_reads_it() {
    for (url, host, port, db, tls) in [
        ("redis://127.0.0.1:6379", "127.0.0.1", 6379, 0, false),
        ("redis://127.0.0.1", "127.0.0.1", 6379, 0, false),
        ("redis://127.0.0.1:6379/", "127.0.0.1", 6379, 0, false),
        ("redis://cache:6380/15", "cache", 6380, 15, false),
        (
            "rediss://cache.internal:6380/0",
            "cache.internal",
            6380,
            0,
            true,
        ),
        ("redis://:p%40ss@h:1/2", "h", 1, 2, false),
        ("redis://user:p%2Fss%40word@h:6379", "h", 6379, 0, false),
        ("redis://user:p@ss@h:6379", "h", 6379, 0, false),
        ("redis://[::1]:6379/3", "::1", 6379, 3, false),
        ("redis://[::1]", "::1", 6379, 0, false),
        (
            "redis://redis_primary-1.svc:6379",
            "redis_primary-1.svc",
            6379,
            0,
            false,
        ),
    ] {
        let got = parse(url, false).unwrap_or_else(|e| panic!("{url}: {e}"));
        assert_eq!(
            got,
            ServerUrl {
                tls,
                host: host.to_owned(),
                port,
                db,
            },
            "{url}"
        );
        let info = redis::IntoConnectionInfo::into_connection_info(url)
            .unwrap_or_else(|e| panic!("the Redis client refuses {url}: {e}"));
        assert_eq!(info.redis.db, db as i64, "{url}");
        let (h, p) = match info.addr {
            redis::ConnectionAddr::Tcp(h, p) => (h, p),
            redis::ConnectionAddr::TcpTls { host, port, .. } => (host, port),
            other => panic!("{url}: {other:?}"),
        };
        assert_eq!(p, port, "{url}");
        assert_eq!(h.trim_matches(['[', ']']), host, "{url}");
    }
}

#[test]
fn what_the_redis_client_refuses_is_refused_here_too() {
    for url in [
        "redis://h:6379/db0",
        "redis://u:p/w@h:6379",
        "redis://h:6379/x",
        "redis://h:port",
        "http://h:6379",
        "redis://h:99999",
    ] {
        assert!(
            redis::IntoConnectionInfo::into_connection_info(url).is_err(),
            "the client reads {url}"
        );
        assert!(parse(url, false).is_err(), "{url}");
    }
}
