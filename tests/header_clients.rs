//! Client libraries the project did not write, against the real binary, in every `[headers]`
//! profile: the npm package `ratelimit-header-parser` (from express-rate-limit's authors) and
//! the PyPI package `ratelimit-headers` read the limit, what remains and the reset of allowed
//! and refused answers, the reset of a refusal agreeing with `Retry-After` (±1 s). Which
//! profiles each library reads is asserted whole: it is why the default is draft 6 with the
//! legacy headers (docs/configuration.md#headers). And `urllib3`'s
//! `Retry(respect_retry_after_header=True)` and `curl --retry` succeed after waiting
//! `Retry-After`.
//!
//! Needs `node` with `npm ci` run in `tests/header_clients/node`, `python3` with
//! `tests/header_clients/requirements.txt` installed (pip), and `curl`; each test is skipped
//! with the reason printed when its tool is missing, and fails when `CI` is set.

mod common;

use serde_json::Value;
use std::path::PathBuf;
use std::process::{Command, Output};

use common::unavailable;

fn dir() -> PathBuf {
    common::manifest_dir().join("tests/header_clients")
}

fn runs(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .current_dir(dir())
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Why the npm library cannot run here, if it cannot.
fn node_missing() -> Option<String> {
    if !runs("node", &["--version"]) {
        return Some("node is not installed".into());
    }
    let installed = dir().join("node/node_modules/ratelimit-header-parser/package.json");
    (!installed.is_file()).then(|| {
        "ratelimit-header-parser is not installed (npm ci in tests/header_clients/node)".into()
    })
}

/// Why the Python libraries cannot run here, if they cannot.
fn python_missing() -> Option<String> {
    (!runs("python3", &["-c", "import ratelimit_headers, urllib3"])).then(|| {
        "ratelimit-headers or urllib3 is not installed for python3 (pip install -r tests/header_clients/requirements.txt)"
            .into()
    })
}

fn output(program: &str, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .current_dir(dir())
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"))
}

/// One answer as a library saw it (one line of `read.mjs` or `read.py`).
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: Value,
    /// When the library read it, in milliseconds since the epoch.
    now: f64,
    limit: Option<f64>,
    remaining: Option<f64>,
    reset: Option<f64>,
}

fn answers(out: &Output, who: &str) -> Vec<Answer> {
    assert!(
        out.status.success(),
        "{who}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| {
            let v: Value =
                serde_json::from_str(line).unwrap_or_else(|e| panic!("{who}: {e}: {line}"));
            let parsed = &v["parsed"];
            Answer {
                status: v["status"].as_u64().expect("status") as u16,
                headers: v["headers"].clone(),
                now: v["now"].as_f64().expect("now"),
                limit: parsed["limit"].as_f64(),
                remaining: parsed["remaining"].as_f64(),
                reset: parsed["reset"].as_f64(),
            }
        })
        .collect()
}

/// The instant (ms since the epoch) the answer's own headers give for its reset: on a refusal
/// `Retry-After` from when it was read; else its single-limit reset (draft 6, draft 7, or the
/// legacy one). `None` when it sends no single-limit reset (draft 8 and 10 alone, or off).
fn reset_meant(a: &Answer) -> Option<f64> {
    let h = |n: &str| a.headers[n].as_str();
    let secs = |v: &str| v.trim().parse::<f64>().expect("a number");
    if a.status == 429 {
        return Some(a.now + 1000.0 * secs(h("retry-after").expect("Retry-After")));
    }
    if let Some(v) = h("ratelimit-reset") {
        return Some(a.now + 1000.0 * secs(v));
    }
    if let Some(v) = h("ratelimit").filter(|v| v.starts_with("limit=")) {
        let reset = v
            .split(',')
            .find_map(|p| p.trim().strip_prefix("reset="))
            .expect("reset=");
        return Some(a.now + 1000.0 * secs(reset));
    }
    let legacy = secs(h("x-ratelimit-reset")?);
    Some(if legacy > 1e9 {
        legacy * 1000.0
    } else {
        a.now + 1000.0 * legacy
    })
}

/// Whether the library read this answer right: the limit (30), what remains (counting down
/// from 29, 0 on the refusal) and the reset within a second of what the answer means.
fn read_right(a: &Answer, n: u32) -> bool {
    let remaining = if a.status == 429 { 0 } else { 30 - n };
    let reset_ok = match (a.reset, reset_meant(a)) {
        (Some(got), Some(meant)) => (got - meant).abs() <= 1000.0,
        _ => false,
    };
    a.limit == Some(30.0) && a.remaining == Some(f64::from(remaining)) && reset_ok
}

/// What each library read of each profile: `reads` (limit, remaining and reset right on every
/// answer), `nothing` (NaN in JavaScript, None in Python, on every answer), `Retry-After only`
/// (nothing on allowed answers; a refusal's reset from its Retry-After), `reset as a 1970
/// date` (a delta in seconds read as seconds since the epoch).
const READ_TABLE: &str = "profile | ratelimit-header-parser | ratelimit-headers
draft-10 | nothing | Retry-After only |
draft-10+legacy(unix) | nothing | Retry-After only |
draft-10+legacy(delta) | nothing | Retry-After only |
draft-8 | nothing | Retry-After only |
draft-8+legacy(unix) | nothing | Retry-After only |
draft-8+legacy(delta) | nothing | Retry-After only |
draft-7 | reads | Retry-After only |
draft-7+legacy(unix) | reads | Retry-After only |
draft-7+legacy(delta) | reads | Retry-After only |
draft-6 | reads | reads |
draft-6+legacy(unix) | reads | reads |
draft-6+legacy(delta) | reads | reads |
off | nothing | Retry-After only |
off+legacy(unix) | reads | reads |
off+legacy(delta) | reads | reset as a 1970 date |
";

/// How a library read a profile, as docs/configuration.md's table says it.
fn how_read(seen: &[Answer]) -> &'static str {
    let right = seen
        .iter()
        .zip(1..)
        .filter(|(a, n)| read_right(a, *n))
        .count();
    if right == seen.len() {
        return "reads";
    }
    if seen
        .iter()
        .all(|a| a.limit.is_none() && a.remaining.is_none() && a.reset.is_none())
    {
        // NaN in JavaScript (printed as null), None in Python: nothing read.
        return "nothing";
    }
    // A reset before 2001-09-09 (1e12 ms): delta seconds read as seconds since 1970.
    if seen
        .iter()
        .all(|a| a.limit == Some(30.0) && a.reset.is_some_and(|r| r < 1e12))
    {
        return "reset as a 1970 date";
    }
    // Nothing on the allowed answers; on the refusal only its reset (Retry-After's).
    let (allowed, refused) = seen.split_at(seen.len() - 1);
    if allowed
        .iter()
        .all(|a| a.limit.is_none() && a.remaining.is_none() && a.reset.is_none())
        && refused[0].limit.is_none()
        && refused[0].reset.is_some()
    {
        return "Retry-After only";
    }
    "wrong"
}

const PROFILES: [(&str, bool, &str); 15] = [
    ("draft-10", false, "unix"),
    ("draft-10", true, "unix"),
    ("draft-10", true, "delta"),
    ("draft-8", false, "unix"),
    ("draft-8", true, "unix"),
    ("draft-8", true, "delta"),
    ("draft-7", false, "unix"),
    ("draft-7", true, "unix"),
    ("draft-7", true, "delta"),
    ("draft-6", false, "unix"),
    ("draft-6", true, "unix"),
    ("draft-6", true, "delta"),
    ("off", false, "unix"),
    ("off", true, "unix"),
    ("off", true, "delta"),
];

fn gateway(standard: &str, legacy: bool, reset: &str, upstream: &str) -> common::Gateway {
    common::Gateway::serve()
        .upstream(upstream)
        .env("FLEET_LIMITER_HEADERS_STANDARD", standard)
        .env("FLEET_LIMITER_HEADERS_LEGACY", legacy.to_string())
        .env("FLEET_LIMITER_HEADERS_LEGACY_RESET", reset)
        .spawn()
}

/// Each library spends `agent-device` (30 a minute) and is refused, in every profile: the
/// profiles it reads right on all 31 answers are exactly those listed.
#[tokio::test]
async fn each_library_reads_the_profiles_it_supports_allowed_and_refused() {
    let node = node_missing();
    let python = python_missing();
    for why in node.iter().chain(python.iter()) {
        unavailable(why);
    }
    let up = common::upstream().await;
    let mut table = String::from("profile | ratelimit-header-parser | ratelimit-headers\n");
    let mut npm_reads = Vec::new();
    let mut pypi_reads = Vec::new();
    for (standard, legacy, reset) in PROFILES {
        let profile = if legacy {
            format!("{standard}+legacy({reset})")
        } else {
            standard.to_owned()
        };
        let gw = gateway(standard, legacy, reset, &up.uri());
        let url = gw.url("/api/agent/heartbeat");
        let mut row = format!("{profile} |");
        for (lib, missing) in [("npm", &node), ("pypi", &python)] {
            if missing.is_some() {
                row.push_str(" skipped |");
                continue;
            }
            let agent = format!("{lib}-agent");
            let out = match lib {
                "npm" => output("node", &["node/read.mjs", &url, &agent, "31"]),
                _ => output("python3", &["read.py", &url, &agent, "31"]),
            };
            let seen = answers(&out, &format!("{lib} {profile}"));
            assert_eq!(seen.len(), 31, "{lib} {profile}");
            assert_eq!(seen[29].status, 200, "{lib} {profile}");
            assert_eq!(seen[30].status, 429, "{lib} {profile}");
            let right = seen
                .iter()
                .zip(1..)
                .filter(|(a, n)| read_right(a, *n))
                .count();
            // All or nothing: a library that reads a profile reads every answer of it.
            assert!(
                right == 0 || right == 31,
                "{lib} {profile}: {right} of 31 read right: {seen:#?}"
            );
            if right == 31 {
                match lib {
                    "npm" => npm_reads.push(profile.clone()),
                    _ => pypi_reads.push(profile.clone()),
                }
            }
            // Every refusal carries Retry-After, whatever the profile: what urllib3 and curl
            // read.
            assert!(
                seen[30].headers["retry-after"]
                    .as_str()
                    .and_then(|v| v.parse::<u64>().ok())
                    .is_some_and(|v| v >= 1),
                "{lib} {profile}: Retry-After on the refusal: {:?}",
                seen[30].headers
            );
            let how = how_read(&seen);
            row.push_str(&format!(" {how} |"));
        }
        table.push_str(&row);
        table.push('\n');
    }
    eprintln!("{table}");
    // The table docs/configuration.md#headers gives, row for row.
    if node.is_none() && python.is_none() {
        assert_eq!(
            table, READ_TABLE,
            "docs/configuration.md's table no longer holds"
        );
    }
    if node.is_none() {
        assert_eq!(
            npm_reads,
            [
                "draft-7",
                "draft-7+legacy(unix)",
                "draft-7+legacy(delta)",
                "draft-6",
                "draft-6+legacy(unix)",
                "draft-6+legacy(delta)",
                "off+legacy(unix)",
                "off+legacy(delta)",
            ],
            "{table}"
        );
    }
    if python.is_none() {
        assert_eq!(
            pypi_reads,
            [
                "draft-6",
                "draft-6+legacy(unix)",
                "draft-6+legacy(delta)",
                "off+legacy(unix)",
            ],
            "{table}"
        );
    }
    // So the default profile, draft-6+legacy(unix), is one both read; draft 6 is the only
    // standard form both read.
}

/// Spend `agent-device` for `agent` (30 allowed), so that its next request is refused with a
/// `Retry-After` of 1 or 2 seconds.
async fn spend(gw: &common::Gateway, agent: &str) {
    for n in 1..=30 {
        let res = common::client()
            .get(gw.url("/api/agent/heartbeat"))
            .header("x-agent-id", agent)
            .send()
            .await
            .expect("request");
        assert_eq!(res.status(), 200, "request {n}");
    }
    let res = common::client()
        .get(gw.url("/api/agent/heartbeat"))
        .header("x-agent-id", agent)
        .send()
        .await
        .expect("request");
    assert_eq!(res.status(), 429);
}

/// urllib3 waits what `Retry-After` says and its one retry is served: a `Retry-After` too short
/// would be refused again and fail the request.
#[tokio::test]
async fn urllib3_retry_succeeds_after_waiting_retry_after() {
    if let Some(why) = python_missing() {
        return unavailable(&why);
    }
    let up = common::upstream().await;
    for profile in RETRY_PROFILES {
        let gw = retry_gateway(profile, &up.uri());
        spend(&gw, "urllib3-agent").await;
        let url = gw.url("/api/agent/heartbeat");
        let out = tokio::task::spawn_blocking(move || {
            output("python3", &["retry.py", &url, "urllib3-agent"])
        })
        .await
        .expect("python3");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{profile:?}: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_str(stdout.trim()).expect("json");
        assert_eq!(v["status"], 200, "{profile:?}: {v}");
        assert_eq!(
            v["retried_on"],
            serde_json::json!([429]),
            "{profile:?}: {v}"
        );
    }
}

/// Retry-After is on every refusal whatever the limit headers: the default profile, the
/// newest draft alone, and no limit headers at all.
const RETRY_PROFILES: [Option<&str>; 3] = [None, Some("draft-10"), Some("off")];

fn retry_gateway(profile: Option<&str>, upstream: &str) -> common::Gateway {
    let launch = common::Gateway::serve().upstream(upstream);
    match profile {
        None => launch.unset("FLEET_LIMITER_HEADERS_STANDARD"),
        Some(p) => launch
            .env("FLEET_LIMITER_HEADERS_STANDARD", p)
            .env("FLEET_LIMITER_HEADERS_LEGACY", "false"),
    }
    .spawn()
}

/// `curl --retry 1` waits what `Retry-After` says (it says so on stderr) and its one retry is
/// served.
#[tokio::test]
async fn curl_retry_succeeds_after_waiting_retry_after() {
    if !Command::new("curl")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        return unavailable("curl is not installed");
    }
    let up = common::upstream().await;
    for profile in RETRY_PROFILES {
        let gw = retry_gateway(profile, &up.uri());
        spend(&gw, "curl-agent").await;
        let url = gw.url("/api/agent/heartbeat");
        // A file, not /dev/null: before its retry curl truncates what the refusal wrote.
        let body = tempfile::NamedTempFile::new().expect("temp file");
        let path = body.path().to_owned();
        let out = tokio::task::spawn_blocking(move || {
            Command::new("curl")
                .args([
                    "--no-progress-meter",
                    "--noproxy",
                    "*",
                    "--retry",
                    "1",
                    "-H",
                    "X-Agent-ID: curl-agent",
                    "-w",
                    "%{http_code}",
                    &url,
                ])
                .arg("-o")
                .arg(&path)
                .output()
                .expect("curl")
        })
        .await
        .expect("curl");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{profile:?}: {stderr}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "200",
            "{profile:?}: {stderr}"
        );
        // "Warning: Problem : HTTP error. Will retry in 2 seconds. 1 retries left."
        assert!(
            stderr.contains("Will retry in 1 second") || stderr.contains("Will retry in 2 seconds"),
            "{profile:?}: {stderr}"
        );
    }
}
