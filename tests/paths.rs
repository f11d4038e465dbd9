//! No spelling of a path escapes its limiters: a differential test of every door of the
//! limiter (the gateway, nginx and Caddy asking the decision endpoint, the Express client)
//! against three real routers.
//!
//! The limiter picks the limiters that meter a request from its path, and the request goes on to
//! an upstream that routes it by its own rules. A spelling that the limiter reads as one route
//! and the upstream serves as another (`/api/agent/%FF/%2e%2e/rotate-key`, metered as an
//! ordinary agent call, served as key rotation) moves the request to a looser budget, or to
//! none. This test sends every line of `tests/paths/corpus.txt` (hostile spellings from WHATWG
//! URL, Express 5 / path-to-regexp, nginx and RFC 3986), byte for byte over raw TCP, through
//! each front:
//!
//! - the real binary as the gateway, which forwards its own canonical path;
//! - the real nginx with `docs/forward-auth/nginx.conf` as written (addresses changed), asking
//!   the binary's decision endpoint (`auth_request`) and forwarding the target as sent;
//! - the real Caddy with `docs/forward-auth/Caddyfile` as written, likewise (`forward_auth`);
//!
//! in front of each of three real upstreams:
//!
//! - nginx, routing on its normalised `$uri` (`tests/paths/nginx.conf`);
//! - Express 5 with its default routing (`tests/paths/node/upstream.js express`);
//! - a WHATWG URL router on `new URL(req.url, base).pathname` (`upstream.js whatwg`);
//!
//! and through the Express 5 app with fleet-limiter's Express client (`clients/express`) in
//! front of its routes (`upstream.js express-client`), asking the binary's decision endpoint.
//!
//! Each upstream serves the routes of `tests/paths/routes.json` (every route the built-in
//! limiters name) and says which in `X-Route`. For every line, front and upstream, one of these
//! must hold:
//!
//! - the limiter refused the spelling with 400 `urn:fleet-limiter:problem:non-canonical-path`
//!   (problem+json) and the upstream saw nothing;
//! - the upstream served a route, and the limiters in the answer's `RateLimit-Policy` are
//!   exactly those the crate's own `Policy` gives the route's plain example path (so the request
//!   was metered as what it reached, no more and no less);
//! - the upstream served no route (404, or a refusal of its own): any metering is accepted;
//! - the front's own HTTP parser refused it with a 400 of its own (or closed the connection),
//!   unseen by the upstream: for the gateway only a target holding raw bytes the HTTP/1.1
//!   grammar forbids (control characters, non-ASCII); for nginx, Caddy and Node (in front of the
//!   Express client) any line but a plain spelling, since each refuses some spellings itself
//!   (nginx a `..` above the root, Go and nginx a malformed escape).
//!
//! The plain spellings (`=> route` lines) must be served as their route through every front by
//! every upstream, so refusing everything cannot pass. Spellings the canonical-path rules refuse
//! outright (`=> refused` lines: malformed or non-UTF-8 escapes, `%2F`/`%5C`, backslashes,
//! `;`/`%3B`, control characters, a segment ending in `.` or encoded whitespace) must be refused
//! whatever the three routers make of them, since other servers strip `;…` or trim trailing
//! dots. Budgets are raised far above the corpus (and the start-up calibration check accepts
//! them), so no answer is a 429. Every failure is collected and printed together, with what the
//! upstream saw.
//!
//! The second test proves the harness without the limiter: each upstream serves every route's
//! plain spellings with the right `X-Route`, answers 404 elsewhere, and logs each request once.
//! The third proves what the decision endpoint rests on: nginx and Caddy, configured as
//! documented, forward exactly the target they asked the endpoint about, byte for byte, for
//! every line of the corpus they forward.
//!
//! nginx and Caddy come from Debian, Express from `npm ci` in `tests/paths/node` (and the
//! Express client's own dependency from `npm ci` in `clients/express`). A missing one is skipped
//! with the reason printed, unless `CI` is set: then the test fails.

mod common;
#[path = "support/proxies.rs"]
mod proxies;
#[path = "paths/upstreams.rs"]
mod upstreams;

use fleet_limiter::Credential;
use fleet_limiter::Loader;
use fleet_limiter::Policy;
use fleet_limiter::{CanonicalPath, PathRules};
use proxies::{Proxy, ProxyKind};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;
use std::sync::{Arc, Mutex};
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

use common::unavailable;

/// What a line is sent to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Front {
    /// The binary as the gateway.
    Gateway,
    /// nginx or Caddy with its documented configuration, asking the decision endpoint.
    Proxy(ProxyKind),
    /// Node's HTTP server running Express with fleet-limiter's Express client in front of the
    /// routes (the upstream itself).
    ExpressClient,
}

impl Front {
    fn name(self) -> &'static str {
        match self {
            Front::Gateway => "gateway",
            Front::Proxy(p) => p.name(),
            Front::ExpressClient => "express-client",
        }
    }
}

/// The proxies this machine can run in front (the others skipped with the reason, or failing).
fn available_proxies() -> Vec<ProxyKind> {
    ProxyKind::ALL
        .into_iter()
        .filter(|&p| match proxies::missing(p) {
            Some(why) => {
                unavailable(&why);
                false
            }
            None => true,
        })
        .collect()
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
fn raised_config() -> (tempfile::NamedTempFile, fleet_limiter::Config) {
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

/// How a line fared through one front on one upstream: `Ok(outcome)` when it is acceptable,
/// `Err(why)` otherwise.
fn judge(
    front: Front,
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
    // The front's own HTTP parser may refuse a spelling before the limiter could answer with a
    // problem document: nothing is metered or forwarded. The gateway's only for raw bytes
    // HTTP/1.1 forbids in a target; nginx, Go and Node refuse more (a `..` above the root, a
    // malformed escape), each by its own rules.
    let parser_may_refuse =
        plain.is_none() && (front != Front::Gateway || line.has_forbidden_bytes());
    let answer = match &seen.answer {
        Ok(a) => a,
        Err(_) if seen.upstream.is_empty() && parser_may_refuse => {
            return Ok("closed by the front's HTTP parser");
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
        if answer.status == 400
            && line.method == "HEAD"
            && answer
                .header("content-type")
                .is_some_and(|t| t.starts_with("application/problem+json"))
        {
            // The answer to a HEAD has no body to read the problem's type from.
            return Ok("refused with a problem document (HEAD: no body)");
        }
        if answer.status == 400 && problem.is_none() && parser_may_refuse {
            return Ok("refused by the front's HTTP parser");
        }
        // A method outside methods.allowed (`post`: methods are case-sensitive) is answered by
        // the gateway and never forwarded, whatever its path.
        if answer.status == 501
            && problem.as_deref() == Some(UNSUPPORTED_METHOD)
            && !fleet_limiter::Config::default()
                .methods
                .allowed()
                .any(|m| m == line.method)
        {
            return Ok("refused for its method");
        }
        return Err(format!(
            "the front answered {} ({}) without the upstream seeing it; a refusal must be 400 {NON_CANONICAL}",
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
                "served {served} (metered like {} {}: {}), but the limiter metered it {}: {how}",
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

/// The binary in front of `upstream` (when given) with its decision endpoint too, on the raised
/// budgets; the proxies' address (127.0.0.1) may ask and is trusted for the client address.
fn limiter(config: &Path, upstream: Option<std::net::SocketAddr>) -> common::Gateway {
    let launch = common::Launch::serve()
        .config_toml(std::fs::read_to_string(config).expect("config"))
        .env("FLEET_LIMITER_TRUST_PROXY", "127.0.0.1")
        .env("FLEET_LIMITER_DECISION_ALLOW_FROM", "127.0.0.1")
        // The raised budgets must pass the start-up calibration check as they are.
        .unset("FLEET_LIMITER_ALLOW_UNSAFE_CALIBRATION");
    match upstream {
        Some(up) => launch.upstream(&format!("http://{up}")).decision().spawn(),
        None => launch.decision_only().spawn(),
    }
}

/// Every line through one front to one upstream, judged; what it found is added to `run`.
struct Run<'a> {
    lines: &'a [Line],
    policy: &'a Policy,
    examples: &'a BTreeMap<String, Route>,
    failures: Vec<String>,
    report: String,
    /// Line number -> (front/upstream, the route it served), for the disagreements.
    routes_served: BTreeMap<usize, Vec<(String, String)>>,
    /// Plain spellings served as their route, by front.
    served_plain: BTreeMap<&'static str, usize>,
}

impl Run<'_> {
    fn through(&mut self, front: Front, addr: std::net::SocketAddr, up: &mut Upstream) {
        let label = if front == Front::ExpressClient {
            front.name().to_owned()
        } else {
            format!("{}/{}", front.name(), up.kind.name())
        };
        // Whatever the upstream logged before is not a corpus line's.
        up.hits_since_mark();
        for line in self.lines {
            let seen = drive(addr, line, up);
            let verdict = judge(front, line, &seen, self.policy, self.examples);
            let _ = writeln!(
                self.report,
                "{:<26} {:<70} {} => {}",
                label,
                line.label(),
                seen.summary(),
                match &verdict {
                    Ok(v) => format!("ok: {v}"),
                    Err(_) => "FAIL".to_owned(),
                }
            );
            if matches!(line.expect, Some(Expect::Serves(_))) && verdict.is_ok() {
                *self.served_plain.entry(front.name()).or_default() += 1;
            }
            self.routes_served.entry(line.no).or_default().push((
                label.clone(),
                seen.served()
                    .unwrap_or_else(|| "(not forwarded)".to_owned()),
            ));
            if let Err(why) = verdict {
                self.failures.push(format!(
                    "{} [{label}]: {why}\n    got: {}",
                    line.label(),
                    seen.summary()
                ));
            }
        }
    }
}

#[test]
fn no_spelling_of_a_path_escapes_its_limiters() {
    let kinds = available();
    let proxies = available_proxies();
    let client = match missing(Kind::ExpressClient) {
        Some(why) => {
            unavailable(&format!("the Express client: {why}"));
            false
        }
        None => true,
    };
    if kinds.is_empty() && !client {
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

    let mut run = Run {
        lines: &lines,
        policy: &policy,
        examples: &examples,
        failures: Vec::new(),
        report: String::new(),
        routes_served: BTreeMap::new(),
        served_plain: BTreeMap::new(),
    };
    let mut fronts = Vec::new();
    for &kind in &kinds {
        let mut up = Upstream::start(kind);
        let gw = limiter(config_file.path(), Some(up.addr));
        let decision = gw.decision_addr.expect("decision listener");
        run.through(Front::Gateway, gw.addr, &mut up);
        fronts.push(Front::Gateway);
        for &p in &proxies {
            let proxy = Proxy::start(p, decision, &up.addr.to_string());
            run.through(Front::Proxy(p), proxy.addr, &mut up);
            fronts.push(Front::Proxy(p));
        }
    }
    if client {
        let gw = limiter(config_file.path(), None);
        let mut app = Upstream::express_client(gw.decision_addr.expect("decision listener"));
        let addr = app.addr;
        run.through(Front::ExpressClient, addr, &mut app);
        fronts.push(Front::ExpressClient);
    }

    println!(
        "every line through every front on every upstream:\n{}",
        run.report
    );
    let mut disagree = String::new();
    for line in &lines {
        let served = &run.routes_served[&line.no];
        let distinct: BTreeSet<&str> = served.iter().map(|(_, r)| r.as_str()).collect();
        if distinct.len() > 1 {
            let each: Vec<String> = served.iter().map(|(k, r)| format!("{k} {r}")).collect();
            let _ = writeln!(disagree, "  {}: {}", line.label(), each.join(", "));
        }
    }
    println!("lines served differently:\n{disagree}");
    for front in fronts {
        assert!(
            run.served_plain.get(front.name()).copied().unwrap_or(0) > 0,
            "no plain spelling was served through {}: the test proves nothing there",
            front.name()
        );
    }
    assert!(
        run.failures.is_empty(),
        "{} of {} requests escaped or were mishandled:\n{}",
        run.failures.len(),
        run.report.lines().count(),
        run.failures.join("\n")
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

/// One request a [`Recorder`] received: its target and the value of the header it looks for,
/// as raw bytes.
type Recorded = (Vec<u8>, Option<Vec<u8>>);
type Records = Arc<Mutex<Vec<Recorded>>>;

/// A server that answers every request `200` with an empty body and records it (keep-alive
/// connections included). Standing in for the decision endpoint, it allows every request, so
/// every spelling a proxy accepts is forwarded; standing in for the upstream, it keeps the
/// target exactly as the proxy sent it.
struct Recorder {
    addr: std::net::SocketAddr,
    records: Records,
}

impl Recorder {
    /// Records the targets and, when given, the value of `header` (lower-case).
    fn start(header: Option<&'static str>) -> Recorder {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind recorder");
        let addr = listener.local_addr().expect("addr");
        let records = Records::default();
        let keep = records.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let keep = keep.clone();
                std::thread::spawn(move || record(conn, header, &keep));
            }
        });
        Recorder { addr, records }
    }

    /// What was recorded since the last call.
    fn take(&self) -> Vec<Recorded> {
        self.records
            .lock()
            .map(|mut r| std::mem::take(&mut *r))
            .unwrap_or_default()
    }
}

fn record(mut conn: std::net::TcpStream, header: Option<&str>, records: &Mutex<Vec<Recorded>>) {
    use std::io::{Read, Write};
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        // One request head (bodies are not expected, and skipped by Content-Length if sent).
        let end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i;
            }
            match conn.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head: Vec<u8> = buf.drain(..end + 4).collect();
        let mut lines = head[..end]
            .split(|&b| b == b'\n')
            .map(|l| l.strip_suffix(b"\r").unwrap_or(l));
        let request_line = lines.next().unwrap_or_default();
        let target = request_line
            .split(|&b| b == b' ')
            .nth(1)
            .unwrap_or_default()
            .to_vec();
        let mut value = None;
        let mut length = 0usize;
        for l in lines {
            let Some(colon) = l.iter().position(|&b| b == b':') else {
                continue;
            };
            let name = String::from_utf8_lossy(&l[..colon])
                .trim()
                .to_ascii_lowercase();
            let v = l[colon + 1..].trim_ascii();
            if Some(name.as_str()) == header {
                value = Some(v.to_vec());
            }
            if name == "content-length" {
                length = String::from_utf8_lossy(v).trim().parse().unwrap_or(0);
            }
        }
        while buf.len() < length {
            match conn.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        buf.drain(..length);
        if let Ok(mut r) = records.lock() {
            r.push((target, value));
        }
        if conn
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            .is_err()
        {
            return;
        }
    }
}

/// What the decision endpoint rests on: nginx and Caddy, configured as documented, forward
/// exactly the target they asked about. Behind each, a decision stand-in that allows everything
/// records the `X-Original-URI` (nginx) or `X-Forwarded-Uri` (Caddy) it is asked with, and an
/// upstream records the target it gets; for every corpus line the proxy forwards, the two are
/// the same bytes, so a target the endpoint takes only in its canonical form is forwarded in
/// that form.
#[test]
fn each_proxy_forwards_the_very_target_it_asked_about() {
    let proxies = available_proxies();
    let lines = corpus();
    for kind in proxies {
        let header = match kind {
            ProxyKind::Nginx => "x-original-uri",
            ProxyKind::Caddy => "x-forwarded-uri",
        };
        let decision = Recorder::start(Some(header));
        let upstream = Recorder::start(None);
        let proxy = Proxy::start(kind, decision.addr, &upstream.addr.to_string());
        let mut mismatches = Vec::new();
        let mut forwarded = 0;
        for line in &lines {
            let answer = exchange(proxy.addr, &line.method, &line.target);
            let asked = decision.take();
            let got = upstream.take();
            let shown = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
            match (asked.as_slice(), got.as_slice()) {
                (_, []) => {}
                ([(_, Some(uri))], [(target, _)]) if uri == target => forwarded += 1,
                _ => mismatches.push(format!(
                    "{}: asked about {:?}, forwarded {:?} ({:?})",
                    line.label(),
                    asked
                        .iter()
                        .map(|(_, u)| u.as_deref().map(shown))
                        .collect::<Vec<_>>(),
                    got.iter().map(|(t, _)| shown(t)).collect::<Vec<_>>(),
                    answer.as_ref().map(|a| a.status)
                )),
            }
        }
        assert!(
            mismatches.is_empty(),
            "{} forwarded other than it asked:\n{}",
            kind.name(),
            mismatches.join("\n")
        );
        // Most of the corpus is forwarded when everything is allowed: the test proves something.
        assert!(
            forwarded > lines.len() / 2,
            "{} forwarded only {forwarded} of {} lines",
            kind.name(),
            lines.len()
        );
        println!(
            "{}: {forwarded} of {} lines forwarded exactly as asked",
            kind.name(),
            lines.len()
        );
    }
}
