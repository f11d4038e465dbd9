//! Golden vectors, built from the real functions and kept under `snapshots/`: IP normalisation,
//! agent-id validation, principal keys and bucket digests for every key kind, client-IP
//! derivation, and the exact 429 and allowed responses for a decision taken in virtual time, in
//! every `[headers]` profile.
//! Another implementation can check byte equality against these files.

use crate::client_ip::{client_ip, ForwardedHeader, TrustedProxies};
use crate::clock::ManualClock;
use crate::config::headers::{HeaderProfile, LegacyReset, Standard};
use crate::config::Config;
use crate::decision::{Decider, Outcome, RequestFacts};
use crate::http::response;
use crate::identity::NoVerifier;
use crate::keys::{self, BucketKey, KeyKind};
use crate::path::{CanonicalPath, PathRules};
use crate::store::memory::MemoryStore;
use std::fmt::Write;
use std::net::IpAddr;
use std::sync::Arc;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// Bytes shown as text, with anything outside printable ASCII as `\xNN`.
fn shown(raw: &[u8]) -> String {
    raw.iter()
        .map(|&b| {
            if (0x20..0x7f).contains(&b) && b != b'\\' {
                (b as char).to_string()
            } else {
                format!("\\x{b:02x}")
            }
        })
        .collect()
}

#[test]
fn ip_normalisation_vectors() {
    let cases = [
        ("203.0.113.5", 56),
        ("::ffff:203.0.113.5", 56),
        ("::ffff:10.1.2.3", 48),
        ("0.0.0.0", 56),
        ("2001:db8:abcd:12ff:1:2:3:4", 56),
        ("2001:db8:abcd:1200::1", 56),
        ("2001:db8:abcd:1300::1", 56),
        ("2001:db8:abcd:12ff:1:2:3:4", 32),
        ("2001:db8:abcd:12ff:1:2:3:4", 48),
        ("2001:db8:abcd:12ff:1:2:3:4", 60),
        ("2001:db8:abcd:12ff:1:2:3:4", 64),
        ("::1", 56),
        ("fe80::1:2:3:4", 56),
        ("64:ff9b::203.0.113.5", 56),
    ];
    let mut out = String::from("input | ipv6_prefix | normalised\n");
    for (input, prefix) in cases {
        writeln!(
            out,
            "{input} | {prefix} | {}",
            keys::normalize_ip(ip(input), prefix)
        )
        .unwrap();
    }
    snap!("vectors_ip_normalisation", out);
}

#[test]
fn agent_id_vectors() {
    let long_ok = "a".repeat(128);
    let long_bad = "a".repeat(129);
    let cases: Vec<&[u8]> = vec![
        b"agent-01.site_a:x",
        b"A",
        b"0f8e2c1a-5b7d-4e3f-9a2b-1c4d5e6f7a8b",
        long_ok.as_bytes(),
        b"",
        b"has space",
        b"slash/no",
        b"semi;colon",
        b"caf\xc3\xa9",
        b"\xff\xfe",
        long_bad.as_bytes(),
    ];
    let mut out = String::from("x-agent-id bytes | counts as\n");
    for raw in cases {
        let shown_raw = if raw.len() > 40 {
            format!("a x {}", raw.len())
        } else {
            shown(raw)
        };
        let as_ = keys::valid_agent_id(raw).map(|s| {
            if s.len() > 40 {
                format!("a x {}", s.len())
            } else {
                s.to_owned()
            }
        });
        writeln!(
            out,
            "{shown_raw:?} | {}",
            as_.unwrap_or_else(|| "none".to_owned())
        )
        .unwrap();
    }
    snap!("vectors_agent_id", out);
}

#[test]
fn principal_key_and_digest_vectors() {
    let ips = [
        "203.0.113.5",
        "::ffff:203.0.113.5",
        "2001:db8:abcd:12ff:1:2:3:4",
    ];
    // The inputs each key kind reads: ip+agent reads the agent id, user-or-ip the verified user.
    let agents: [Option<&[u8]>; 3] = [Some(b"agent-01"), Some(b"bad id"), None];
    let users = [None, Some("user_2abc")];
    let mut out = String::from(
        "limiter | key kind | client ip | x-agent-id | verified user | principal key | bucket key = limiter:hex(sha256(limiter NUL principal)[..16])\n",
    );
    for cfg in Config::default().limiters {
        let (agent_inputs, user_inputs): (&[Option<&[u8]>], &[Option<&str>]) = match cfg.key {
            KeyKind::Ip => (&[None], &[None]),
            KeyKind::IpAgent => (&agents, &[None]),
            KeyKind::UserOrIp => (&[None], &users),
            other => panic!("the built-in calibration keys no limiter on {other:?}"),
        };
        for raw_ip in ips {
            let normalised = keys::normalize_ip(ip(raw_ip), 56);
            for agent in agent_inputs {
                for user in user_inputs {
                    let agent_id = agent.and_then(keys::valid_agent_id);
                    let principal =
                        keys::principal_key(cfg.key.clone(), &normalised, agent_id, *user);
                    let bucket = BucketKey::new(cfg.name.clone(), &principal);
                    assert_eq!(bucket.digest, keys::digest(&cfg.name, &principal));
                    assert_eq!(
                        bucket.to_string(),
                        format!("{}:{}", cfg.name, bucket.digest_hex())
                    );
                    writeln!(
                        out,
                        "{} | {} | {raw_ip} | {} | {} | {principal} | {bucket}",
                        cfg.name,
                        cfg.key.as_str(),
                        agent
                            .map(|a| format!("{:?}", shown(a)))
                            .unwrap_or_else(|| "-".into()),
                        user.unwrap_or("-"),
                    )
                    .unwrap();
                }
            }
        }
    }
    snap!("vectors_principal_keys", out);
}

#[test]
fn credential_header_and_global_key_vectors() {
    let ip_key = keys::normalize_ip(ip("203.0.113.5"), 56);
    let mut out = String::from(
        "limiter | key kind | input | principal key | bucket key = limiter:hex(sha256(limiter NUL principal)[..16])\n",
    );
    let long = "x".repeat(keys::MAX_KEY_HEADER_LEN + 1);
    let max = "y".repeat(keys::MAX_KEY_HEADER_LEN);
    let mut row = |limiter: &str, kind: KeyKind, input: String, p: keys::Principal<'_>| {
        let principal = keys::principal_key_of(&kind, &p);
        let bucket = BucketKey::new(limiter.into(), &principal);
        let via_parts = keys::KeyDigest::Shared.bucket_of(limiter.into(), &kind, &p);
        assert_eq!(bucket, via_parts, "{input}");
        writeln!(
            out,
            "{limiter} | {} | {input} | {principal} | {bucket}",
            kind.as_str()
        )
        .unwrap();
    };
    // credential: the bearer token's SHA-256, never the token; no token keys on the IP.
    for auth in [
        Some(&b"Bearer pa_live_0123456789"[..]),
        Some(b"bearer   pa_live_0123456789  "),
        Some(b"Bearer cli-token-abc"),
        Some(b"Basic dXNlcjpwYXNz"),
        Some(b"Bearer "),
        Some("Bearer t\u{eb}st".as_bytes()),
        None,
    ] {
        let digest = auth
            .and_then(crate::identity::bearer_token)
            .map(keys::credential_digest);
        let p = keys::Principal {
            ip: &ip_key,
            credential: digest.as_deref(),
            ..Default::default()
        };
        let input = auth.map_or_else(|| "-".to_owned(), |a| format!("{:?}", shown(a)));
        if let Some(a) = auth.and_then(crate::identity::bearer_token) {
            assert!(!keys::principal_key_of(&KeyKind::Credential, &p).contains(a));
        }
        row("api-by-key", KeyKind::Credential, input, p);
    }
    // header: a valid value from a trusted proxy; anything else keys on the IP.
    for value in [
        Some(&b"tenant-42"[..]),
        Some(b"runner:eu/7"),
        Some(max.as_bytes()),
        Some(long.as_bytes()),
        Some(b""),
        Some(b"two words"),
        Some(b"tab\there"),
        Some("t\u{eb}nant".as_bytes()),
        None,
    ] {
        let p = keys::Principal {
            ip: &ip_key,
            header: value.and_then(keys::valid_key_header),
            ..Default::default()
        };
        let input = value.map_or_else(|| "-".to_owned(), |v| format!("{:?}", shown(v)));
        row(
            "per-tenant",
            KeyKind::Header("x-tenant-id".into()),
            input,
            p,
        );
    }
    // global: one bucket whoever asks.
    for other_ip in ["203.0.113.5", "198.51.100.1"] {
        let k = keys::normalize_ip(ip(other_ip), 56);
        let p = keys::Principal {
            ip: &k,
            ..Default::default()
        };
        row("whole-route", KeyKind::Global, other_ip.to_owned(), p);
    }
    snap!("vectors_new_key_kinds", out);
}

#[test]
fn client_ip_vectors() {
    let nets = |v: &[&str]| v.iter().map(|r| r.parse().unwrap()).collect::<Vec<_>>();
    let xff = |v: &[&str]| TrustedProxies::new(nets(v), ForwardedHeader::XForwardedFor);
    let fwd = |v: &[&str]| TrustedProxies::new(nets(v), ForwardedHeader::Forwarded);
    let cases: Vec<(&str, TrustedProxies, Vec<&[u8]>)> = vec![
        ("198.51.100.7", xff(&[]), vec![b"1.1.1.1"]),
        ("198.51.100.7", xff(&["10.0.0.0/8"]), vec![b"1.1.1.1"]),
        (
            "10.0.0.2",
            xff(&["10.0.0.0/8"]),
            vec![b"6.6.6.6, 203.0.113.9, 10.0.0.1"],
        ),
        (
            "10.0.0.2",
            xff(&["10.0.0.0/8"]),
            vec![b"6.6.6.6", b"203.0.113.9"],
        ),
        ("10.0.0.2", xff(&["10.0.0.0/8"]), vec![b"203.0.113.9:4711"]),
        (
            "10.0.0.2",
            xff(&["10.0.0.0/8"]),
            vec![b"[2001:db8:abcd:12ff::1]:443"],
        ),
        ("10.0.0.2", xff(&["10.0.0.0/8"]), vec![b"fe80::1%eth0"]),
        (
            "10.0.0.2",
            xff(&["10.0.0.0/8"]),
            vec![b"::ffff:203.0.113.5"],
        ),
        (
            "::ffff:10.0.0.2",
            xff(&["10.0.0.0/8"]),
            vec![b"203.0.113.9"],
        ),
        ("10.0.0.2", xff(&["10.0.0.0/8"]), vec![b"unknown"]),
        ("10.0.0.2", xff(&["10.0.0.0/8"]), vec![b"garbage, 10.0.0.1"]),
        (
            "10.0.0.2",
            xff(&["10.0.0.0/8"]),
            vec![b"203.0.113.9, garbage, 10.0.0.1"],
        ),
        ("10.0.0.2", xff(&["10.0.0.0/8"]), vec![b""]),
        ("10.0.0.2", xff(&["10.0.0.0/8"]), vec![]),
        (
            "10.0.0.2",
            xff(&["10.0.0.0/8"]),
            vec![b"10.9.9.9, 10.0.0.1"],
        ),
        ("10.0.0.2", xff(&["10.0.0.0/8"]), vec![b"\xff\xfe, 1"]),
        (
            "10.0.0.2",
            fwd(&["10.0.0.0/8"]),
            vec![b"for=6.6.6.6, for=203.0.113.9;proto=https, for=10.0.0.1"],
        ),
        (
            "10.0.0.2",
            fwd(&["10.0.0.0/8"]),
            vec![b"for=\"[2001:db8:cafe::17]:4711\""],
        ),
        ("10.0.0.2", fwd(&["10.0.0.0/8"]), vec![b"for=unknown"]),
        (
            "10.0.0.2",
            fwd(&["10.0.0.0/8"]),
            vec![b"for=_hidden, for=10.0.0.1"],
        ),
        ("10.0.0.2", fwd(&["10.0.0.0/8"]), vec![b"proto=https"]),
    ];
    let mut out = String::from("peer | trusted | header | values | client | key (/56)\n");
    for (peer, trusted, values) in cases {
        let client = client_ip(ip(peer), values.iter().copied(), &trusted);
        let ranges: Vec<String> = trusted.ranges.iter().map(|r| r.to_string()).collect();
        let values: Vec<String> = values.iter().map(|v| shown(v)).collect();
        writeln!(
            out,
            "{peer} | {ranges:?} | {} | {values:?} | {client} | {}",
            trusted.header.header_name(),
            keys::normalize_ip(client, 56)
        )
        .unwrap();
    }
    snap!("vectors_client_ip", out);
}

/// A decider on a memory store that names its buckets as Redis does (SHA-256), so that the
/// partition keys in the headers read the same in every run.
fn decider(clock: &ManualClock) -> Decider {
    let cfg = Config::default();
    let store = Arc::new(
        MemoryStore::new(1000, Arc::new(clock.clone())).with_key_digest(keys::KeyDigest::Shared),
    );
    Decider::new(&cfg, store, Arc::new(NoVerifier))
}

/// Every profile: each standard alone, and with the legacy headers in both reset forms.
fn profiles() -> Vec<HeaderProfile> {
    let mut all = Vec::new();
    for standard in Standard::ALL {
        for (legacy, legacy_reset) in [
            (false, LegacyReset::Unix),
            (true, LegacyReset::Unix),
            (true, LegacyReset::Delta),
        ] {
            all.push(HeaderProfile {
                standard,
                legacy,
                legacy_reset,
            });
        }
    }
    all
}

/// The wall clock at the decision: 2026-01-01T00:00:00.5Z (a Unix-time reset counts from it).
fn decided_at() -> std::time::SystemTime {
    std::time::UNIX_EPOCH + std::time::Duration::from_millis(1_767_225_600_500)
}

/// The response each profile makes of `o` (`refused`: the 429, else an upstream's 200), its
/// headers only, one block per profile; then the body, the same for all.
async fn every_profile(o: &Outcome) -> String {
    let mut out = String::new();
    let mut body = String::new();
    for p in profiles() {
        let mut res = if o.refused() {
            response::too_many_requests(o, &p, Some(decided_at()))
        } else {
            let mut res = actix_web::HttpResponse::Ok().finish();
            response::apply_headers(res.headers_mut(), o, &p, Some(decided_at()));
            res
        };
        res.headers_mut().remove("date");
        let text = render(res).await;
        let (head, rest) = text.split_once("\n\n").unwrap_or((&text, ""));
        writeln!(out, "## {}\n{}\n", p.describe(), head.trim_end()).unwrap();
        body = rest.to_owned();
    }
    if !body.is_empty() {
        writeln!(out, "## body\n{body}").unwrap();
    }
    out
}

async fn decide(
    d: &Decider,
    method: &str,
    path: &str,
    agent: Option<&[u8]>,
    auth: Option<&[u8]>,
) -> Outcome {
    let facts = RequestFacts {
        peer: ip("203.0.113.5"),
        method,
        path: CanonicalPath::parse(path, PathRules::STRICT).unwrap(),
        forwarded: &[],
        agent_id: agent,
        authorization: auth,
        session_token: None,
        key_headers: crate::decision::KeyHeaders::default(),
    };
    d.decide(&facts).await
}

async fn render(res: actix_web::HttpResponse) -> String {
    let mut out = format!("status: {}\n", res.status().as_u16());
    let mut headers: Vec<(String, String)> = res
        .headers()
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_owned()))
        .collect();
    headers.sort();
    for (k, v) in headers {
        writeln!(out, "{k}: {v}").unwrap();
    }
    let body = actix_web::body::to_bytes(res.into_body()).await.unwrap();
    if !body.is_empty() {
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        writeln!(out, "\n{}", serde_json::to_string_pretty(&json).unwrap()).unwrap();
    }
    out
}

#[actix_rt::test]
async fn the_429_response() {
    let clock = ManualClock::new(3_600_000_000_000);
    let d = decider(&clock);
    for _ in 0..30 {
        let o = decide(&d, "POST", "/api/agent/heartbeat", Some(b"agent-01"), None).await;
        assert!(!o.refused());
    }
    // Half a second later the 31st is refused: the next token is 1.5 s away, so Retry-After is 2.
    clock.advance(std::time::Duration::from_millis(500));
    let o = decide(&d, "POST", "/api/agent/heartbeat", Some(b"agent-01"), None).await;
    assert!(o.refused());
    let text = every_profile(&o).await;
    snap!("response_429_agent_device", text);
}

#[actix_rt::test]
async fn the_429_of_stacked_limiters_reports_the_longest_wait() {
    let clock = ManualClock::new(3_600_000_000_000);
    let d = decider(&clock);
    // api-key (60 / 1 min) and ui (1000 / 15 min) both meter this request.
    for _ in 0..60 {
        assert!(!decide(&d, "GET", "/api/tasks", None, Some(b"Bearer pa_x"))
            .await
            .refused());
    }
    let o = decide(&d, "GET", "/api/tasks", None, Some(b"Bearer pa_x")).await;
    assert!(o.refused());
    let text = every_profile(&o).await;
    snap!("response_429_api_key_and_ui", text);
}

#[actix_rt::test]
async fn the_headers_of_an_allowed_request() {
    let clock = ManualClock::new(3_600_000_000_000);
    let d = decider(&clock);
    let o = decide(&d, "GET", "/api/tasks", None, Some(b"Bearer sometoken")).await;
    assert!(!o.refused());
    let text = every_profile(&o).await;
    snap!("response_allowed_ui_and_cli_bearer", text);
}
