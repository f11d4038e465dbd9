//! No spelling of a path escapes its limiters: a differential test of the gateway against three
//! real routers.
//!
//! The gateway picks the limiters that meter a request from its path, and forwards the request
//! to an upstream that routes it by its own rules. A spelling that the gateway reads as one
//! route and the upstream serves as another (`/api/agent/%FF/%2e%2e/rotate-key`, metered as an
//! ordinary agent call, served as key rotation) moves the request to a looser budget, or to
//! none. This test sends every line of `tests/paths/corpus.txt` (hostile spellings from WHATWG
//! URL, Express 5 / path-to-regexp, nginx and RFC 3986), byte for byte over raw TCP, through
//! the real binary in front of each of three real upstreams:
//!
//! - nginx, routing on its normalised `$uri` (`tests/paths/nginx.conf`);
//! - Express 5 with its default routing (`tests/paths/node/upstream.js express`);
//! - a WHATWG URL router on `new URL(req.url, base).pathname` (`upstream.js whatwg`).
//!
//! Each serves the routes of `tests/paths/routes.json` (every route the built-in limiters name)
//! and says which in `X-Route`. For every line and every upstream, one of these must hold:
//!
//! - the gateway refused the spelling with 400 `urn:fleet-limiter:problem:non-canonical-path`
//!   (problem+json) and the upstream saw nothing;
//! - the upstream served a route, and the limiters in the answer's `RateLimit-Policy` are
//!   exactly those the crate's own `Policy` gives the route's plain example path (so the request
//!   was metered as what it reached, no more and no less);
//! - the upstream served no route (404, or a refusal of its own): any metering is accepted;
//! - the target holds raw bytes the HTTP/1.1 grammar forbids (control characters, non-ASCII)
//!   and the gateway's HTTP parser refused it with a 400 of its own, unseen by the upstream.
//!
//! The plain spellings (`=> route` lines) must be served as their route by every upstream, so
//! refusing everything cannot pass. Spellings the canonical-path rules refuse outright
//! (`=> refused` lines: malformed or non-UTF-8 escapes, `%2F`/`%5C`, backslashes, `;`/`%3B`,
//! control characters, a segment ending in `.` or encoded whitespace) must be refused whatever
//! the three routers make of them, since other servers strip `;…` or trim trailing dots. Budgets are raised far above the corpus (and the start-up
//! calibration check accepts them), so no answer is a 429. Every failure is collected and
//! printed together, with what the upstream saw.
//!
//! The second test proves the harness without the gateway: each upstream serves every route's
//! plain spellings with the right `X-Route`, answers 404 elsewhere, and logs each request once.
//!
//! nginx comes from Debian, Express from `npm ci` in `tests/paths/node`. A missing one is
//! skipped with the reason printed, unless `CI` is set: then the test fails.

mod common;
#[path = "paths/upstreams.rs"]
mod upstreams;

use fleet_limiter::config::Loader;
use fleet_limiter::identity::Credential;
use fleet_limiter::path::{CanonicalPath, PathRules};
use fleet_limiter::policy::Policy;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::Duration;
use upstreams::{exchange, missing, paths_dir, routes, Answer, Kind, Route, Upstream};

/// The problem type of a path the gateway will not make canonical.
const NON_CANONICAL: &str = "urn:fleet-limiter:problem:non-canonical-path";
/// The problem type of a method the gateway does not forward.
const UNSUPPORTED_METHOD: &str = "urn:fleet-limiter:problem:unsupported-method";

/// Every built-in limiter with its budget raised far above what the corpus sends, and the
/// windows unchanged. `agent-ip` follows `agent-device` (x `fleet.max_site_endpoints`).
const RAISED: &str = r#"
[limiters.agent-device]
limit = 1000000
[limiters.enrollment]
limit = 1000000
[limiters.download]
limit = 1000000
[limiters.key-rotation]
limit = 1000000
[limiters.ui]
limit = 1000000
[limiters.cli-bearer]
limit = 1000000
[limiters.api-key]
limit = 1000000
[limiters.cli-device-code]
limit = 1000000
[limiters.cli-device-poll]
limit = 1000000
[limiters.cli-refresh]
limit = 1000000
"#;

/// One request of the corpus.
#[derive(Debug, Clone)]
struct Line {
    /// Line number in corpus.txt.
    no: usize,
    method: String,
    /// As written in the corpus (escapes not expanded), for messages.
    written: String,
    /// The bytes sent.
    target: Vec<u8>,
    /// What the corpus demands beyond the differential rule, if anything.
    expect: Option<Expect>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Expect {
    /// A plain spelling: every upstream must serve it as this route.
    Serves(String),
    /// The canonical-path rules refuse this spelling, whatever an upstream would make of it.
    Refused,
}

impl Line {
    fn label(&self) -> String {
        format!("corpus.txt:{} {} {}", self.no, self.method, self.written)
    }

    /// Whether the target holds bytes the HTTP/1.1 grammar forbids in a request target.
    fn has_forbidden_bytes(&self) -> bool {
        self.target.iter().any(|&b| b <= 0x20 || b >= 0x7f)
    }
}

/// `\xHH` is the byte 0xHH; any other backslash is itself.
fn unescape(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && b.get(i + 1) == Some(&b'x') {
            let hex = b
                .get(i + 2..i + 4)
                .and_then(|h| std::str::from_utf8(h).ok());
            if let Some(v) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

fn corpus() -> Vec<Line> {
    let text = std::fs::read_to_string(paths_dir().join("corpus.txt")).expect("corpus.txt");
    let mut lines = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let l = raw.trim_end();
        if l.trim_start().is_empty() || l.trim_start().starts_with('#') {
            continue;
        }
        let (request, expect) = match l.split_once(" => ") {
            Some((r, "refused")) => (r, Some(Expect::Refused)),
            Some((r, route)) => (r, Some(Expect::Serves(route.trim().to_owned()))),
            None => (l, None),
        };
        let (method, target) = request
            .split_once(' ')
            .unwrap_or_else(|| panic!("corpus.txt:{}: `METHOD TARGET` expected", i + 1));
        lines.push(Line {
            no: i + 1,
            method: method.to_owned(),
            written: target.to_owned(),
            target: unescape(target),
            expect,
        });
    }
    lines
}

/// Skip (printing why), or fail under `CI`.
fn unavailable(why: &str) {
    if std::env::var_os("CI").is_some() {
        panic!("required when CI is set: {why}");
    }
    eprintln!("skipping: {why}");
}

/// The upstreams this machine can run (the others skipped with the reason, or failing).
fn available() -> Vec<Kind> {
    Kind::ALL
        .into_iter()
        .filter(|&k| match missing(k) {
            Some(why) => {
                unavailable(&format!("the {} upstream: {why}", k.name()));
                false
            }
            None => true,
        })
        .collect()
}

/// The raised-budget configuration as a file (for the crate's own `Loader` and for `check`).
fn raised_config() -> (tempfile::NamedTempFile, fleet_limiter::config::Config) {
    let file = tempfile::Builder::new()
        .suffix(".toml")
        .tempfile()
        .expect("temp file");
    std::fs::write(file.path(), RAISED).expect("write config");
    let cfg = Loader::new()
        .file(file.path())
        .load()
        .expect("the raised configuration loads");
    (file, cfg)
}

/// The limiter names the policy gives `method example` without credentials.
fn names(policy: &Policy, method: &str, path: &str) -> BTreeSet<String> {
    policy
        .applicable(
            method,
            &CanonicalPath::parse(path, PathRules::STRICT).expect("a route's example path"),
            Credential::None,
        )
        .iter()
        .map(|l| l.name.to_string())
        .collect()
}

/// The limiter names in an answer's `RateLimit-Policy` (none without the header).
fn metered(a: &Answer) -> BTreeSet<String> {
    a.headers
        .iter()
        .filter(|(k, _)| k == "ratelimit-policy")
        .flat_map(|(_, v)| common::parse_policy(v))
        .map(|(name, _, _)| name)
        .collect()
}

fn problem_type(a: &Answer) -> Option<String> {
    let json = a
        .header("content-type")
        .is_some_and(|t| t.starts_with("application/problem+json"));
    if !json {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(&a.body).ok()?;
    v.get("type")?.as_str().map(str::to_owned)
}

fn set(s: &BTreeSet<String>) -> String {
    if s.is_empty() {
        "{}".to_owned()
    } else {
        format!(
            "{{{}}}",
            s.iter().map(String::as_str).collect::<Vec<_>>().join(", ")
        )
    }
}

/// What happened to one line on one upstream.
struct Seen {
    /// The answer, or why there was none.
    answer: Result<Answer, String>,
    /// The hits-file lines the request left on the upstream.
    upstream: Vec<String>,
}

impl Seen {
    /// The route the upstream served: `Some("none")` for a 404 or a refusal of its own, `None`
    /// when the upstream saw nothing.
    fn served(&self) -> Option<String> {
        if self.upstream.is_empty() {
            return None;
        }
        match self.answer.as_ref().ok().and_then(|a| a.header("x-route")) {
            Some(r) => Some(r.to_owned()),
            None => Some("none".to_owned()),
        }
    }

    fn summary(&self) -> String {
        let saw = if self.upstream.is_empty() {
            "upstream saw nothing".to_owned()
        } else {
            format!("upstream saw {}", self.upstream.join(" | "))
        };
        match &self.answer {
            Err(e) => format!("no answer ({e}); {saw}"),
            Ok(a) => {
                let mut s = format!("{}", a.status);
                if let Some(r) = a.header("x-route") {
                    let _ = write!(s, " X-Route {r}");
                }
                if let Some(t) = problem_type(a) {
                    let _ = write!(s, " {t}");
                }
                let _ = write!(s, ", metered {}; {saw}", set(&metered(a)));
                s
            }
        }
    }
}

/// How a line fared on one upstream: `Ok(outcome)` when it is acceptable, `Err(why)` otherwise.
fn judge(
    line: &Line,
    seen: &Seen,
    policy: &Policy,
    examples: &BTreeMap<String, Route>,
) -> Result<&'static str, String> {
    let plain = match &line.expect {
        Some(Expect::Serves(route)) => Some(route.as_str()),
        _ => None,
    };
    let must_refuse = line.expect == Some(Expect::Refused);
    // Raw bytes HTTP/1.1 forbids in a target may be refused by the gateway's HTTP parser, before
    // the gateway itself could answer with a problem document: nothing is metered or forwarded.
    let parser_may_refuse = line.has_forbidden_bytes() && plain.is_none();
    let answer = match &seen.answer {
        Ok(a) => a,
        Err(_) if seen.upstream.is_empty() && parser_may_refuse => {
            return Ok("closed by the HTTP parser");
        }
        Err(e) => return Err(format!("no answer: {e}")),
    };
    if answer.status == 429 {
        return Err("refused for budget: the raised budgets should never run out".to_owned());
    }
    let problem = problem_type(answer);
    let refused_here = answer.status == 400 && problem.as_deref() == Some(NON_CANONICAL);
    if seen.upstream.is_empty() {
        if let Some(route) = plain {
            return Err(format!(
                "a plain spelling, to be served as {route}, was refused"
            ));
        }
        if refused_here {
            return Ok("refused as non-canonical");
        }
        if answer.status == 400 && problem.is_none() && parser_may_refuse {
            return Ok("refused by the HTTP parser");
        }
        // A method outside methods.allowed (`post`: methods are case-sensitive) is answered by
        // the gateway and never forwarded, whatever its path.
        if answer.status == 501
            && problem.as_deref() == Some(UNSUPPORTED_METHOD)
            && !fleet_limiter::methods::DEFAULT_ALLOWED.contains(&line.method.as_str())
        {
            return Ok("refused for its method");
        }
        return Err(format!(
            "the gateway answered {} ({}) without the upstream seeing it; a refusal must be 400 {NON_CANONICAL}",
            answer.status,
            problem.as_deref().unwrap_or("not a problem document")
        ));
    }
    if refused_here {
        return Err("refused as non-canonical, yet the upstream saw it".to_owned());
    }
    if seen.upstream.len() > 1 {
        return Err("the upstream saw more than one request".to_owned());
    }
    let served = seen.served().unwrap_or_default();
    // Whether the metering matches the route served, and if not, how.
    let metering = if served == "none" {
        Ok("served no route")
    } else {
        let Some(route) = examples.get(&served) else {
            return Err(format!("served an unknown route {served:?}"));
        };
        let expected = names(policy, &line.method, &route.example);
        let got = metered(answer);
        if got == expected {
            Ok("metered as the route served")
        } else {
            let missing: BTreeSet<String> = expected.difference(&got).cloned().collect();
            let extra: BTreeSet<String> = got.difference(&expected).cloned().collect();
            let how = if missing.is_empty() {
                format!("also metered by {}", set(&extra))
            } else if extra.is_empty() {
                format!("ESCAPED {}", set(&missing))
            } else {
                format!(
                    "ESCAPED {}, metered by {} instead",
                    set(&missing),
                    set(&extra)
                )
            };
            Err(format!(
                "served {served} (metered like {} {}: {}), but the gateway metered it {}: {how}",
                line.method,
                route.example,
                set(&expected),
                set(&got)
            ))
        }
    };
    if must_refuse {
        return Err(format!(
            "the canonical-path rules refuse this spelling (400 {NON_CANONICAL}), but it was forwarded and {}",
            match &metering {
                Ok(v) => v.to_string(),
                Err(e) => e.clone(),
            }
        ));
    }
    if let Some(route) = plain {
        if served != route {
            return Err(format!(
                "a plain spelling, to be served as {route}, was served as {served}"
            ));
        }
    }
    metering
}

/// Send one line through `addr` and collect what the upstream saw of it.
fn drive(addr: std::net::SocketAddr, line: &Line, up: &mut Upstream) -> Seen {
    let answer = exchange(addr, &line.method, &line.target);
    Seen {
        answer,
        upstream: up.hits_since_mark(),
    }
}

#[test]
fn no_spelling_of_a_path_escapes_its_limiters() {
    let kinds = available();
    if kinds.is_empty() {
        return;
    }
    let (config_file, cfg) = raised_config();
    let policy = Policy::new(cfg.limiters.clone());
    let examples: BTreeMap<String, Route> =
        routes().into_iter().map(|r| (r.id.clone(), r)).collect();
    let lines = corpus();
    assert!(
        lines
            .iter()
            .any(|l| matches!(l.expect, Some(Expect::Serves(_)))),
        "the corpus has plain spellings"
    );

    let mut failures = Vec::new();
    let mut report = String::new();
    // Line number -> upstream -> the route it served (for the disagreements among upstreams).
    let mut routes_served: BTreeMap<usize, Vec<(Kind, String)>> = BTreeMap::new();
    let mut served_plain = 0;
    for kind in kinds {
        let mut up = Upstream::start(kind);
        let gw = common::Launch::serve()
            .upstream(&format!("http://{}", up.addr))
            .config_toml(std::fs::read_to_string(config_file.path()).expect("config"))
            // The raised budgets must pass the start-up calibration check as they are.
            .unset("FLEET_LIMITER_ALLOW_UNSAFE_CALIBRATION")
            .spawn();
        // Whatever the upstream logged while starting is not a corpus line's.
        up.hits_since_mark();
        for line in &lines {
            let seen = drive(gw.addr, line, &mut up);
            let verdict = judge(line, &seen, &policy, &examples);
            let _ = writeln!(
                report,
                "{:<11} {:<70} {} => {}",
                kind.name(),
                line.label(),
                seen.summary(),
                match &verdict {
                    Ok(v) => format!("ok: {v}"),
                    Err(_) => "FAIL".to_owned(),
                }
            );
            if matches!(line.expect, Some(Expect::Serves(_))) && verdict.is_ok() {
                served_plain += 1;
            }
            routes_served.entry(line.no).or_default().push((
                kind,
                seen.served()
                    .unwrap_or_else(|| "(not forwarded)".to_owned()),
            ));
            if let Err(why) = verdict {
                failures.push(format!(
                    "{} [{}]: {why}\n    got: {}",
                    line.label(),
                    kind.name(),
                    seen.summary()
                ));
            }
        }
        drop(gw);
    }

    println!("every line on every upstream:\n{report}");
    let mut disagree = String::new();
    for line in &lines {
        let served = &routes_served[&line.no];
        let distinct: BTreeSet<&str> = served.iter().map(|(_, r)| r.as_str()).collect();
        if distinct.len() > 1 {
            let each: Vec<String> = served
                .iter()
                .map(|(k, r)| format!("{} {r}", k.name()))
                .collect();
            let _ = writeln!(disagree, "  {}: {}", line.label(), each.join(", "));
        }
    }
    println!("lines the upstreams route differently:\n{disagree}");
    assert!(
        served_plain > 0,
        "no plain spelling was served: the test proves nothing"
    );
    assert!(
        failures.is_empty(),
        "{} of {} requests escaped or were mishandled:\n{}",
        failures.len(),
        report.lines().count(),
        failures.join("\n")
    );
}

#[test]
fn each_upstream_serves_every_route_by_its_plain_spelling() {
    let kinds = available();
    if kinds.is_empty() {
        return;
    }
    let (config_file, _) = raised_config();
    // The raised budgets pass the calibration check `serve` runs at start-up.
    let check = common::Launch::command(["check", "--config"])
        .arg(config_file.path().display().to_string())
        .run(Duration::from_secs(60));
    assert_eq!(
        check.code,
        Some(0),
        "check refused the raised budgets:\n{}",
        check.stdout
    );

    let routes = routes();
    let mut failures = Vec::new();
    for kind in kinds {
        let mut up = Upstream::start(kind);
        up.hits_since_mark();
        let mut expect = |method: &str, path: &str, route: &str, status: u16| {
            let a = exchange(up.addr, method, path.as_bytes());
            let seen = up.hits_since_mark();
            let got = match &a {
                Ok(a) => format!("{} X-Route {:?}", a.status, a.header("x-route")),
                Err(e) => format!("no answer: {e}"),
            };
            let ok = a
                .as_ref()
                .is_ok_and(|a| a.status == status && a.header("x-route") == Some(route));
            if !ok || seen.len() != 1 {
                failures.push(format!(
                    "{} {method} {path}: expected {status} X-Route {route}, got {got}; logged {seen:?}",
                    kind.name()
                ));
            }
        };
        for r in &routes {
            let methods: &[&str] = match &r.method {
                Some(m) => &[m.as_str()],
                None => &["GET", "POST", "DELETE"],
            };
            let upper = r.example.to_ascii_uppercase();
            let slash = format!("{}/", r.example);
            let query = format!("{}?q=1", r.example);
            // A prefix route serves everything below its path too.
            let below = if r.prefix {
                format!("{}/a/b", r.path)
            } else {
                r.example.clone()
            };
            for m in methods {
                for p in [&r.example, &r.path, &upper, &slash, &query, &below] {
                    // A non-prefix route's example is its path: the same requests twice do no harm.
                    expect(m, p, &r.id, 200);
                }
            }
        }
        // Below a fixed route, a method a route does not take, and outside every route.
        expect("POST", "/api/agent/rotate-key/x", "agent", 200);
        expect("GET", "/api/agent/rotate-key", "agent", 200);
        expect("GET", "/api/agent/enroll", "agent", 200);
        expect("POST", "/api/agent/download/linux", "agent", 200);
        expect("GET", "/api/cli/auth/refresh", "cli-auth", 200);
        expect("GET", "/api/agents", "ui", 200);
        expect("GET", "/", "none", 404);
        expect("GET", "/healthzx", "none", 404);
        expect("GET", "/apix/tasks", "none", 404);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
