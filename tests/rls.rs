//! Envoy's rate-limit service (`rls.listen`) driven by envoy's own generated client: the PyPI
//! package `xds-protos` (envoy's data-plane API compiled by protoc) with `grpcio`, through
//! `tests/rls/client.py`, against the real binary; the Envoy example parsed by the same package. Without them the tests are skipped, unless
//! `CI` is set: then they fail (`.ci/run` installs both).

mod common;
mod redis_support;

use common::{Gateway, Launch, PATIENCE};
use serde_json::{json, Value};
use std::io::Write;
use std::net::SocketAddr;
use std::process::{Command, Stdio};

/// The YAML every test but the last reads (envoyproxy/ratelimit's format).
const YAML: &str = r#"
domain: api
descriptors:
  - key: path
    value: /slow
    rate_limit: { unit: minute, requests_per_unit: 2 }
  - key: path
    value: /cost
    rate_limit: { unit: minute, requests_per_unit: 5 }
  - key: path
    value: "/free/*"
    rate_limit: { unlimited: true }
  - key: path
    value: /shadow
    shadow_mode: true
    rate_limit: { unit: hour, requests_per_unit: 1 }
  - key: path
    value: /closed
    rate_limit: { unit: second, requests_per_unit: 0 }
  - key: remote_address
    fleet_limiter: shared
  - key: client
    descriptors:
      - key: path
        value: /slow
        rate_limit: { unit: minute, requests_per_unit: 3 }
"#;

/// The calibration: `shared`, 3 a minute per address, on the gateway's `/api/**`.
const TOML: &str = "[client_ip]\ntrust_proxy = [\"127.0.0.1\"]\n[limiters.shared]\nlimit = 3\nwindow = \"1m\"\nkey = \"ip\"\nroutes = [\"/api/**\"]\n";

/// Whether envoy's generated Python client can be imported here (else skipped, or failed in CI).
fn client_available() -> bool {
    let ok = Command::new("python3")
        .args([
            "-c",
            "import grpc, yaml; from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        common::unavailable(
            "python3 with xds-protos, grpcio and PyYAML: pip install xds-protos grpcio pyyaml",
        );
    }
    ok
}

struct Rls {
    gw: Gateway,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

/// `serve` with the RLS listener on a free port, reading `yaml`, `extra` flags added.
fn start(yaml: &str, extra: &[&str], envs: &[(&str, &str)]) -> Rls {
    start_with(TOML, yaml, extra, envs)
}

/// [`start`] with another calibration.
fn start_with(toml: &str, yaml: &str, extra: &[&str], envs: &[(&str, &str)]) -> Rls {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("ratelimit.yaml");
    std::fs::write(&file, yaml).expect("write yaml");
    let addr: SocketAddr = ([127, 0, 0, 1], common::free_port()).into();
    let mut launch = Launch::serve()
        .config_toml(toml)
        .upstream(&redis_support::upstream())
        .admin()
        .arg("--allow-unsafe-calibration")
        .arg("--rls-listen")
        .arg(addr.to_string())
        .arg("--rls-config")
        .arg(file.display().to_string())
        .env("FLEET_LIMITER_RLS_ALLOW_FROM", "127.0.0.1");
    for a in extra {
        launch = launch.arg(*a);
    }
    for (k, v) in envs {
        launch = launch.env(*k, *v);
    }
    Rls {
        gw: launch.spawn(),
        addr,
        _dir: dir,
    }
}

/// Ask `requests` in order through envoy's generated client; one answer per request:
/// `{"ok": RateLimitResponse}` or `{"error": "<status code>", "detail": ...}`.
fn ask(rls: &Rls, requests: &[Value]) -> Vec<Value> {
    let script = common::manifest_dir().join("tests/rls/client.py");
    let mut child = Command::new("python3")
        .arg(&script)
        .arg(rls.addr.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3");
    let body = serde_json::to_vec(requests).expect("json");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(&body)
        .expect("write requests");
    let out = child.wait_with_output().expect("client output");
    assert!(
        out.status.success(),
        "client failed: {}\nserver log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        rls.gw.stderr()
    );
    let v: Vec<Value> = serde_json::from_slice(&out.stdout).expect("client JSON");
    assert_eq!(v.len(), requests.len());
    v
}

fn ask1(rls: &Rls, request: Value) -> Value {
    ask(rls, &[request]).remove(0)
}

fn req(domain: &str, descriptors: &[&[(&str, &str)]]) -> Value {
    let descriptors: Vec<Value> = descriptors
        .iter()
        .map(|d| {
            json!({"entries": d.iter().map(|(k, v)| json!({"key": k, "value": v})).collect::<Vec<_>>()})
        })
        .collect();
    json!({"domain": domain, "descriptors": descriptors})
}

fn ok(answer: &Value) -> &Value {
    answer
        .get("ok")
        .unwrap_or_else(|| panic!("an error, not an answer: {answer}"))
}

fn status(answer: &Value, i: usize) -> &Value {
    &ok(answer)["statuses"][i]
}

/// A `google.protobuf.Duration` in JSON (`"29.5s"`) in seconds.
fn seconds(v: &Value) -> f64 {
    v.as_str()
        .and_then(|s| s.strip_suffix('s'))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not a duration: {v}"))
}

fn header<'a>(answer: &'a Value, name: &str) -> Option<&'a str> {
    ok(answer)["response_headers_to_add"]
        .as_array()?
        .iter()
        .find(|h| h["key"] == name)
        .and_then(|h| h["value"].as_str())
}

#[test]
fn a_descriptor_is_allowed_then_over_limit_with_the_wait_until_it_fits() {
    if !client_available() {
        return;
    }
    let rls = start(YAML, &[], &[]);
    let slow = req("api", &[&[("path", "/slow")]]);
    let answers = ask(&rls, &[slow.clone(), slow.clone(), slow]);
    let [first, second, third] = [&answers[0], &answers[1], &answers[2]];
    assert_eq!(ok(first)["overall_code"], "OK", "{first}");
    let s = status(first, 0);
    assert_eq!(s["code"], "OK");
    assert_eq!(s["current_limit"]["requests_per_unit"], 2);
    assert_eq!(s["current_limit"]["unit"], "MINUTE");
    assert_eq!(s["limit_remaining"], 1);
    // A bucket of 2 a minute holding one request is whole again after 30 s.
    let reset = seconds(&s["duration_until_reset"]);
    assert!(reset > 0.0 && reset <= 30.0, "{s}");
    // The limit headers the gateway sends (here draft-10 and the legacy ones), from the bucket.
    assert_eq!(header(first, "x-ratelimit-remaining"), Some("1"), "{first}");
    assert_eq!(
        header(first, "ratelimit-policy"),
        Some("\"rls:api:path=/slow\";q=2;w=60"),
        "{first}"
    );
    assert_eq!(status(second, 0)["limit_remaining"], 0);
    assert_eq!(ok(third)["overall_code"], "OVER_LIMIT", "{third}");
    let s = status(third, 0);
    assert_eq!(s["code"], "OVER_LIMIT");
    assert_eq!(s["limit_remaining"], 0);
    // The next request fits when one request's worth has come back: at most 30 s, never 0.
    let wait = seconds(&s["duration_until_reset"]);
    assert!(wait > 0.0 && wait <= 30.0, "{s}");
    let retry: u64 = header(third, "ratelimit")
        .and_then(|v| v.split(';').find_map(|p| p.strip_prefix("t=")))
        .and_then(|t| t.parse().ok())
        .expect("RateLimit t=");
    assert!((1..=30).contains(&retry), "{third}");
    assert_eq!(header(third, "x-ratelimit-remaining"), Some("0"), "{third}");
    // Nested: `client` then `path` is its own rule, its own bucket.
    let nested = ask1(&rls, req("api", &[&[("client", "c1"), ("path", "/slow")]]));
    assert_eq!(status(&nested, 0)["current_limit"]["requests_per_unit"], 3);
    assert_eq!(status(&nested, 0)["limit_remaining"], 2);
    let metric = r#"fleet_limiter_rls_decisions_total{domain="api",rule="rls:api:path=/slow",outcome="over_limit"}"#;
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    assert_eq!(rt.block_on(rls.gw.metric(metric)), Some(1.0));
}

#[test]
fn hits_addend_is_the_cost_and_zero_counts_one_but_a_descriptors_zero_only_checks() {
    if !client_available() {
        return;
    }
    let rls = start(YAML, &[], &[]);
    let with = |n: u32| {
        let mut r = req("api", &[&[("path", "/cost")]]);
        r["hits_addend"] = json!(n);
        r
    };
    let answers = ask(&rls, &[with(3), with(0), with(2), with(1)]);
    assert_eq!(
        status(&answers[0], 0)["limit_remaining"],
        2,
        "{}",
        answers[0]
    );
    assert_eq!(
        status(&answers[1], 0)["limit_remaining"],
        1,
        "{}",
        answers[1]
    );
    // 2 more do not fit in the 1 left: refused whole, nothing charged.
    assert_eq!(
        status(&answers[2], 0)["code"],
        "OVER_LIMIT",
        "{}",
        answers[2]
    );
    assert_eq!(status(&answers[3], 0)["code"], "OK", "{}", answers[3]);
    assert_eq!(status(&answers[3], 0)["limit_remaining"], 0);
    // A descriptor's own hits_addend (a UInt64Value) overrides the request's.
    let mut own = req("api", &[&[("client", "c7"), ("path", "/slow")]]);
    own["hits_addend"] = json!(1);
    own["descriptors"][0]["hits_addend"] = json!(3);
    let a = ask1(&rls, own);
    assert_eq!(status(&a, 0)["limit_remaining"], 0, "3 of 3: {a}");
    // Two descriptors naming one bucket in one request add their costs.
    let two = ask1(
        &rls,
        req(
            "api",
            &[
                &[("client", "c9"), ("path", "/slow")],
                &[("client", "c9"), ("path", "/slow")],
            ],
        ),
    );
    assert_eq!(status(&two, 0)["limit_remaining"], 1, "{two}");
    assert_eq!(status(&two, 1)["limit_remaining"], 1, "{two}");
    // A descriptor's own hits_addend of 0 checks without charging, as the reference does:
    // answered as one more request would be, and nothing is counted.
    let check_only = |client: &str| {
        let mut r = req("api", &[&[("client", client), ("path", "/slow")]]);
        r["descriptors"][0]["hits_addend"] = json!(0);
        r
    };
    let charge = |client: &str| req("api", &[&[("client", client), ("path", "/slow")]]);
    let answers = ask(
        &rls,
        &[
            check_only("c11"),
            check_only("c11"),
            charge("c11"),
            charge("c11"),
            charge("c11"),
            check_only("c11"),
        ],
    );
    let codes: Vec<&serde_json::Value> = answers.iter().map(|a| &status(a, 0)["code"]).collect();
    assert_eq!(
        codes,
        ["OK", "OK", "OK", "OK", "OK", "OVER_LIMIT"],
        "two checks charged nothing, three requests spent the 3: {answers:?}"
    );
    // A check-only descriptor over its limit refuses the request, and its other descriptor is
    // charged nothing.
    let mut both = req(
        "api",
        &[
            &[("client", "c11"), ("path", "/slow")],
            &[("client", "c12"), ("path", "/slow")],
        ],
    );
    both["descriptors"][0]["hits_addend"] = json!(0);
    let a = ask1(&rls, both);
    assert_eq!(ok(&a)["overall_code"], "OVER_LIMIT", "{a}");
    let fresh = ask1(&rls, charge("c12"));
    assert_eq!(
        status(&fresh, 0)["limit_remaining"],
        2,
        "c12 was not charged: {fresh}"
    );
}

#[test]
fn a_message_that_is_not_a_rate_limit_request_is_invalid_argument() {
    if !client_available() {
        return;
    }
    let rls = start(YAML, &[], &[]);
    let answers = ask(
        &rls,
        &[
            json!({"raw_hex": "ffffffffffffffffff"}),
            json!({"raw_hex": "0a"}),
            json!({"raw_hex": "12ff01"}),
        ],
    );
    for a in &answers {
        assert_eq!(a["error"], "INVALID_ARGUMENT", "{answers:?}");
    }
    // And the service still answers.
    let after = ask1(&rls, req("api", &[&[("path", "/cost")]]));
    assert_eq!(ok(&after)["overall_code"], "OK", "{after}");
}

#[test]
fn unknown_domains_and_descriptors_are_answered_as_the_reference_answers() {
    if !client_available() {
        return;
    }
    let rls = start(YAML, &[], &[]);
    let answers = ask(
        &rls,
        &[
            req("elsewhere", &[&[("path", "/slow")], &[("a", "b")]]),
            req(
                "api",
                &[
                    &[("nope", "x")],
                    &[("path", "/free/a")],
                    &[("path", "/slow"), ("deeper", "x")],
                ],
            ),
            req("api", &[&[("path", "/shadow")]]),
            req("api", &[&[("path", "/shadow")]]),
            req("api", &[&[("path", "/closed")]]),
            req("", &[&[("path", "/slow")]]),
            req("api", &[]),
        ],
    );
    // Unknown domain: OK, one status per descriptor, none limited.
    let unknown = ok(&answers[0]);
    assert_eq!(unknown["overall_code"], "OK");
    assert_eq!(unknown["statuses"].as_array().map(Vec::len), Some(2));
    for s in unknown["statuses"].as_array().unwrap() {
        assert_eq!(s["code"], "OK");
        assert!(s.get("current_limit").is_none_or(Value::is_null), "{s}");
        assert_eq!(s["limit_remaining"], 0);
    }
    // Unknown descriptor, unlimited, deeper than the tree.
    let mixed = &answers[1];
    assert_eq!(ok(mixed)["overall_code"], "OK");
    assert!(status(mixed, 0)
        .get("current_limit")
        .is_none_or(Value::is_null));
    assert_eq!(
        status(mixed, 1)["limit_remaining"],
        u64::from(u32::MAX),
        "{mixed}"
    );
    assert!(status(mixed, 2)
        .get("current_limit")
        .is_none_or(Value::is_null));
    // Shadow mode: over the limit, answered OK.
    assert_eq!(status(&answers[3], 0)["code"], "OK", "{}", answers[3]);
    assert_eq!(status(&answers[3], 0)["limit_remaining"], 0);
    // requests_per_unit 0: always over the limit.
    assert_eq!(ok(&answers[4])["overall_code"], "OVER_LIMIT");
    assert_eq!(
        seconds(&status(&answers[4], 0)["duration_until_reset"]),
        1.0
    );
    // Empty domain, no descriptor: the reference's errors.
    assert_eq!(answers[5]["error"], "INVALID_ARGUMENT", "{}", answers[5]);
    assert_eq!(answers[6]["error"], "INVALID_ARGUMENT", "{}", answers[6]);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let metric =
        r#"fleet_limiter_rls_decisions_total{domain="unknown",rule="none",outcome="no_rule"}"#;
    assert_eq!(rt.block_on(rls.gw.metric(metric)), Some(2.0));
}

#[tokio::test]
async fn a_mapped_descriptor_and_the_gateway_spend_one_budget() {
    if !client_available() {
        return;
    }
    let rls = start(YAML, &[], &[]);
    one_budget(&rls).await;
}

#[tokio::test]
async fn on_redis_the_gateway_and_the_descriptor_spend_one_budget() {
    if !client_available() {
        return;
    }
    let Some(redis) = redis_support::standalone() else {
        return;
    };
    let rls = start(YAML, &["--store", &redis.url()], &[]);
    one_budget(&rls).await;
}

/// `shared` allows 3 a minute per address: 2 through the gateway, 1 through Envoy (its
/// address IPv4-mapped, normalised as every address is), then both refuse.
async fn one_budget(rls: &Rls) {
    // One address per run: a Redis store may be shared with other tests.
    let ip = format!(
        "198.51.{}.{}",
        std::process::id() % 250,
        rls.addr.port() % 250
    );
    let through_gateway = || async {
        common::client()
            .get(rls.gw.url("/api/x"))
            .header("x-forwarded-for", &ip)
            .send()
            .await
            .expect("gateway")
            .status()
            .as_u16()
    };
    assert_eq!(through_gateway().await, 200);
    assert_eq!(through_gateway().await, 200);
    let mapped = format!("::ffff:{ip}");
    let d = req("api", &[&[("remote_address", mapped.as_str())]]);
    let answers = ask(rls, &[d.clone(), d]);
    let s = status(&answers[0], 0);
    assert_eq!(s["code"], "OK", "{}", answers[0]);
    assert_eq!(s["limit_remaining"], 0);
    assert_eq!(s["current_limit"]["requests_per_unit"], 3);
    assert_eq!(
        status(&answers[1], 0)["code"],
        "OVER_LIMIT",
        "{}",
        answers[1]
    );
    assert_eq!(through_gateway().await, 429);
}

#[test]
fn hostile_requests_are_answered_without_a_panic() {
    if !client_available() {
        return;
    }
    let rls = start(YAML, &[], &[]);
    let many: Vec<&[(&str, &str)]> = vec![&[("path", "/slow")]; 10_000];
    let long = "v".repeat(100_000);
    let deep: Vec<(&str, &str)> = vec![("k", "v"); 1000];
    let answers = ask(
        &rls,
        &[
            req("api", &many),
            req("api", &[&[("path", long.as_str())]]),
            req(&"d".repeat(100_000), &[&[("path", "/slow")]]),
            req("api", &[&deep]),
            req("api", &[&[("", "")]]),
            req("api", &[&[]]),
            req("api", &[&[("remote_address", "not an address")]]),
            req("api", &[&[("path", "/\u{0}\u{ffff}é")]]),
        ],
    );
    for a in &answers[..4] {
        assert_eq!(a["error"], "INVALID_ARGUMENT", "{a}");
    }
    for a in &answers[4..] {
        assert_eq!(ok(a)["overall_code"], "OK", "{a}");
    }
    // 64 descriptors (the most) on one bucket: charged 64, so refused whole.
    let at_most: Vec<&[(&str, &str)]> = vec![&[("client", "flood"), ("path", "/slow")]; 64];
    let flood = ask1(&rls, req("api", &at_most));
    assert_eq!(ok(&flood)["overall_code"], "OVER_LIMIT", "{flood}");
    // Still answering.
    let after = ask1(
        &rls,
        req("api", &[&[("client", "flood"), ("path", "/slow")]]),
    );
    assert_eq!(status(&after, 0)["limit_remaining"], 2, "{after}");
}

#[test]
fn a_peer_outside_allow_from_is_refused() {
    if !client_available() {
        return;
    }
    let rls = start(YAML, &[], &[("FLEET_LIMITER_RLS_ALLOW_FROM", "10.0.0.5")]);
    let a = ask1(&rls, req("api", &[&[("path", "/slow")]]));
    assert_eq!(a["error"], "PERMISSION_DENIED", "{a}");
}

#[test]
fn a_configuration_error_names_the_file_the_field_and_the_fix() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("bad.yaml");
    std::fs::write(
        &file,
        "domain: api\ndescriptors:\n  - key: path\n    rate_limit: { unit: fortnight, requests_per_unit: 1 }\n",
    )
    .expect("write");
    let out = Launch::serve()
        .arg("--rls-listen")
        .arg("127.0.0.1:1")
        .arg("--rls-config")
        .arg(file.display().to_string())
        .env("FLEET_LIMITER_RLS_ALLOW_FROM", "127.0.0.1")
        .upstream("http://127.0.0.1:9")
        .run(PATIENCE);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("bad.yaml: descriptors[0].rate_limit.unit: `fortnight`")
            && out
                .stderr
                .contains("use second, minute, hour, day, week or month"),
        "{}",
        out.stderr
    );
}

#[test]
fn check_lists_the_rls_rules_and_how_each_is_judged() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("ratelimit.yaml");
    std::fs::write(&file, YAML).expect("write yaml");
    let out = Launch::command(["check"])
        .config_toml(TOML)
        .env("FLEET_LIMITER_RLS_CONFIG", file.display().to_string())
        .run(PATIENCE);
    assert!(
        out.stdout
            .contains("Envoy rate-limit service (rls.config): 7 rule(s)"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout
            .contains("rls:api:path=/slow: 2 / 1m gcra, keyed on descriptor"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains(
            "rls:api:remote_address: 3 / 1m gcra, keyed on ip: as limiter shared above (one budget)"
        ),
        "{}",
        out.stdout
    );
    let json = Launch::command(["check", "--format", "json"])
        .config_toml(TOML)
        .env("FLEET_LIMITER_RLS_CONFIG", file.display().to_string())
        .run(PATIENCE);
    let v: Value = serde_json::from_str(&json.stdout).expect("check --format json");
    let rules = v["rls"].as_array().expect("rls rules");
    assert_eq!(rules.len(), 7, "{}", json.stdout);
    assert!(rules
        .iter()
        .any(|r| r["rule"] == "rls:api:path=/shadow" && r["shadow"] == true));
}

#[test]
fn a_descriptors_own_limit_counts_only_where_configured() {
    if !client_available() {
        return;
    }
    // limit: 1 a minute on a descriptor the YAML allows 2 a minute.
    let own = || {
        let mut r = req("api", &[&[("path", "/slow")]]);
        r["descriptors"][0]["limit"] = json!({"requests_per_unit": 1, "unit": "MINUTE"});
        r
    };
    let off = start(YAML, &[], &[]);
    let a = ask(&off, &[own(), own()]);
    assert_eq!(
        status(&a[0], 0)["current_limit"]["requests_per_unit"],
        2,
        "{}",
        a[0]
    );
    assert_eq!(status(&a[1], 0)["code"], "OK", "ignored: {}", a[1]);
    let on = start(YAML, &[], &[("FLEET_LIMITER_RLS_DESCRIPTOR_LIMIT", "true")]);
    let a = ask(&on, &[own(), own()]);
    assert_eq!(
        status(&a[0], 0)["current_limit"]["requests_per_unit"],
        1,
        "{}",
        a[0]
    );
    assert_eq!(status(&a[1], 0)["code"], "OVER_LIMIT", "honoured: {}", a[1]);
}

#[test]
fn the_envoy_example_is_a_valid_envoy_bootstrap() {
    if !client_available() {
        return;
    }
    let root = common::manifest_dir();
    let out = Command::new("python3")
        .arg(root.join("tests/rls/parse_envoy_config.py"))
        .arg(root.join("docs/envoy-rls/envoy.yaml"))
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // And the YAML beside it is one fleet-limiter reads.
    let yaml = root.join("docs/envoy-rls/ratelimit.yaml");
    let check = Launch::command(["check"])
        .env("FLEET_LIMITER_RLS_CONFIG", yaml.display().to_string())
        .run(PATIENCE);
    assert!(
        check
            .stdout
            .contains("Envoy rate-limit service (rls.config): 5 rule(s)"),
        "{}{}",
        check.stdout,
        check.stderr
    );
}

/// A request's header block: `:method POST`, `:scheme http`, `:path` the RLS method, then
/// `fields` distinct names (`x0`, `x1`, ...), each valued `v`.
fn header_block(fields: usize) -> Vec<u8> {
    let path = b"/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
    let mut b = vec![0x83, 0x86, 0x04, path.len() as u8];
    b.extend_from_slice(path);
    for i in 0..fields {
        let name = format!("x{i:x}");
        b.push(0x00);
        b.push(name.len() as u8);
        b.extend_from_slice(name.as_bytes());
        b.extend_from_slice(&[1, b'v']);
    }
    b
}

/// The HTTP/2 preface, an empty SETTINGS frame, and `block` as one HEADERS frame and as many
/// CONTINUATION frames as 16 KiB frames take (plaintext, prior knowledge, as gRPC speaks it).
fn h2_request(block: &[u8]) -> Vec<u8> {
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
    let frames: Vec<&[u8]> = block.chunks(16_384).collect();
    for (i, payload) in frames.iter().enumerate() {
        let len = payload.len();
        let (kind, mut flags) = if i == 0 { (0x1, 0x1) } else { (0x9, 0x0) };
        if i + 1 == frames.len() {
            flags |= 0x4;
        }
        out.extend_from_slice(&[
            (len >> 16) as u8,
            (len >> 8) as u8,
            len as u8,
            kind,
            flags,
            0,
            0,
            0,
            1,
        ]);
        out.extend_from_slice(payload);
    }
    out
}

#[test]
fn a_header_flood_on_the_grpc_listener_panics_nothing() {
    if !client_available() {
        return;
    }
    let rls = start(YAML, &[], &[]);
    for fields in [3_000, 25_000, 25_000] {
        let mut s = std::net::TcpStream::connect(rls.addr).expect("connect");
        s.set_read_timeout(Some(PATIENCE)).expect("timeout");
        // The server may close before reading it all; what it answers is not the point.
        let _ = s.write_all(&h2_request(&header_block(fields)));
        let mut sink = Vec::new();
        let _ = std::io::Read::read_to_end(&mut s, &mut sink);
    }
    // Refused (the header list is past 16 KiB), and the listener still answers.
    let after = ask1(&rls, req("api", &[&[("path", "/slow")]]));
    assert_eq!(ok(&after)["overall_code"], "OK", "{after}");
    assert!(!rls.gw.stderr().contains("panicked"), "{}", rls.gw.stderr());
}

#[test]
fn a_store_that_cannot_answer_answers_each_limiters_on_store_error() {
    if !client_available() {
        return;
    }
    let dead = common::dead_addr();
    let toml = format!("{TOML}on_store_error = \"deny\"\n");
    let rls = start_with(&toml, YAML, &["--store", &format!("redis://{dead}")], &[]);
    let a = ask1(
        &rls,
        req(
            "api",
            &[&[("path", "/slow")], &[("remote_address", "198.51.100.9")]],
        ),
    );
    // The YAML's own rule allows (on_store_error = "allow"); `shared` denies, as configured.
    assert_eq!(status(&a, 0)["code"], "OK", "{a}");
    assert_eq!(status(&a, 1)["code"], "OVER_LIMIT", "{a}");
    // The protocol's refusal, unspread (docs/envoy-rls.md): one emission interval (3 a minute),
    // and the limit headers describe the limiter that refused for the store, reset alike.
    assert_eq!(seconds(&status(&a, 1)["duration_until_reset"]), 20.0, "{a}");
    assert_eq!(ok(&a)["overall_code"], "OVER_LIMIT");
    let ratelimit = header(&a, "ratelimit").unwrap_or_default();
    assert!(
        ratelimit.starts_with("\"shared\";r=0;t=20;"),
        "{ratelimit}: {a}"
    );
}

#[tokio::test]
async fn a_reload_reads_the_yaml_again() {
    if !client_available() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("ratelimit.yaml");
    std::fs::write(&file, YAML).expect("write yaml");
    let addr: SocketAddr = ([127, 0, 0, 1], common::free_port()).into();
    let gw = Launch::serve()
        .config_toml(TOML)
        .upstream(&redis_support::upstream())
        .admin()
        .arg("--allow-unsafe-calibration")
        .args(["--rls-listen", &addr.to_string()])
        .args(["--rls-config", &file.display().to_string()])
        .env("FLEET_LIMITER_RLS_ALLOW_FROM", "127.0.0.1")
        .spawn();
    let rls = Rls {
        gw,
        addr,
        _dir: tempfile::tempdir().expect("tempdir"),
    };
    let before = ask1(&rls, req("api", &[&[("path", "/new")]]));
    assert!(
        status(&before, 0)
            .get("current_limit")
            .is_none_or(Value::is_null),
        "{before}"
    );
    std::fs::write(
        &file,
        format!("{YAML}  - key: path\n    value: /new\n    rate_limit: {{ unit: hour, requests_per_unit: 7 }}\n"),
    )
    .expect("rewrite yaml");
    rls.gw.signal("HUP");
    rls.gw
        .wait_metric(r#"fleet_limiter_config_reloads_total{result="ok"}"#, |v| {
            v >= 1.0
        })
        .await;
    let after = ask1(&rls, req("api", &[&[("path", "/new")]]));
    assert_eq!(
        status(&after, 0)["current_limit"]["requests_per_unit"],
        7,
        "{after}"
    );
    assert_eq!(status(&after, 0)["limit_remaining"], 6, "{after}");
    // A YAML that cannot be used refuses the reload; the rules in use stay.
    std::fs::write(&file, "domain: api\ndescriptors: 7\n").expect("rewrite yaml");
    rls.gw.signal("HUP");
    rls.gw
        .wait_metric(
            r#"fleet_limiter_config_reloads_total{result="error"}"#,
            |v| v >= 1.0,
        )
        .await;
    let kept = ask1(&rls, req("api", &[&[("path", "/new")]]));
    assert_eq!(status(&kept, 0)["limit_remaining"], 5, "{kept}");
}

/// Started as docs/envoy-rls.md's first step does: no upstream and no traffic listener, the
/// shipped docs/envoy-rls/ratelimit.yaml, the Envoy hosts in `FLEET_LIMITER_RLS_ALLOW_FROM`.
/// It answers (the per-user export budget of 5 an hour, then over the limit) and stops cleanly.
#[test]
fn with_no_upstream_it_serves_the_rate_limit_service_as_documented() {
    if !client_available() {
        return;
    }
    let addr: SocketAddr = ([127, 0, 0, 1], common::free_port()).into();
    let yaml = common::manifest_dir().join("docs/envoy-rls/ratelimit.yaml");
    let gw = Launch::serve_waiting_on(addr)
        .unset("FLEET_LIMITER_ALLOW_UNSAFE_CALIBRATION")
        .env("FLEET_LIMITER_RLS_ALLOW_FROM", "127.0.0.1")
        .args(["--rls-listen", &addr.to_string()])
        .args(["--rls-config", &yaml.display().to_string()])
        .spawn();
    let mut rls = Rls {
        gw,
        addr,
        _dir: tempfile::tempdir().expect("tempdir"),
    };
    let export = req("api", &[&[("path", "/v1/export"), ("user", "u1")]]);
    let answers = ask(&rls, &vec![export; 6]);
    for a in &answers[..5] {
        assert_eq!(ok(a)["overall_code"], "OK", "{a}");
    }
    assert_eq!(
        ok(&answers[5])["overall_code"],
        "OVER_LIMIT",
        "{}",
        answers[5]
    );
    rls.gw.signal("TERM");
    let code = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(rls.gw.wait_exit())
        .code();
    assert_eq!(code, Some(0), "{}", rls.gw.stderr());
    assert!(!rls.gw.stderr().contains("panicked"), "{}", rls.gw.stderr());
}

/// `unit: month` is a calendar month and `calendar: true` makes a day one: over the limit, the
/// wait runs to the next UTC midnight (or the 1st's), and the policy states the period.
#[test]
fn calendar_units_wait_for_the_calendars_boundary() {
    if !client_available() {
        return;
    }
    let yaml = r#"
domain: quota
descriptors:
  - key: report
    value: daily
    rate_limit: { unit: day, requests_per_unit: 1, calendar: true }
  - key: report
    value: monthly
    rate_limit: { unit: month, requests_per_unit: 1 }
  - key: report
    value: rolling
    rate_limit: { unit: day, requests_per_unit: 1 }
"#;
    let rls = start(yaml, &[], &[]);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    let to_midnight = 86_400 - now % 86_400;
    if to_midnight < 30 {
        std::thread::sleep(std::time::Duration::from_secs(to_midnight + 2));
    }
    let day = req("quota", &[&[("report", "daily")]]);
    let answers = ask(&rls, &[day.clone(), day]);
    assert_eq!(status(&answers[0], 0)["code"], "OK", "{}", answers[0]);
    assert_eq!(status(&answers[0], 0)["current_limit"]["unit"], "DAY");
    let s = status(&answers[1], 0);
    assert_eq!(s["code"], "OVER_LIMIT", "{s}");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    let to_midnight = (86_400 - now % 86_400) as f64;
    let wait = seconds(&s["duration_until_reset"]);
    assert!(
        (wait - to_midnight).abs() <= 2.0,
        "waits {wait} s for midnight, {to_midnight} s away"
    );

    let month = req("quota", &[&[("report", "monthly")]]);
    let answers = ask(&rls, &[month.clone(), month]);
    assert_eq!(
        status(&answers[0], 0)["current_limit"]["unit"],
        "MONTH",
        "{}",
        answers[0]
    );
    let s = status(&answers[1], 0);
    assert_eq!(s["code"], "OVER_LIMIT", "{s}");
    let wait = seconds(&s["duration_until_reset"]);
    assert!(wait > to_midnight - 2.0 && wait <= 31.0 * 86_400.0, "{s}");
    let off = (wait - to_midnight).rem_euclid(86_400.0);
    assert!(
        off.min(86_400.0 - off) <= 2.0,
        "a month ends at a midnight: {wait}"
    );

    // Without `calendar`, a day is a continuous bucket: one request's worth back in a day.
    let rolling = req("quota", &[&[("report", "rolling")]]);
    let answers = ask(&rls, &[rolling.clone(), rolling]);
    let wait = seconds(&status(&answers[1], 0)["duration_until_reset"]);
    assert!((wait - 86_400.0).abs() <= 2.0, "{wait}");
}
