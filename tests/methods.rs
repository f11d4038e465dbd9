//! Method overrides and methods no upstream route serves, against the real binary in front of a
//! real Express 5 app that honours overrides with the stock `method-override` middleware
//! (`tests/paths/node/override.js`: `X-HTTP-Method-Override`, `X-HTTP-Method`,
//! `X-Method-Override` and the `_method` query parameter, for requests of any method), and
//! through the decision endpoint behind the real nginx and Caddy configured with the files in
//! `docs/forward-auth/` as written.
//!
//! The property, for every hostile spelling: the gateway refuses the request before the app
//! sees it, or the app serves a route that the gateway metered with every limiter of that route
//! and the method the app routed it as (never fewer). Requests are sent byte for byte over raw
//! TCP, and the app logs everything it saw (the method it routed on, the override headers that
//! reached it, the query), so a test also sees what was stripped.
//!
//! Node and `npm ci` in `tests/paths/node` are needed (nginx and caddy for the decision endpoint
//! tests): a missing one is skipped with the reason printed, unless `CI` is set: then the test
//! fails.

mod common;

use common::{free_port, Gateway, RawResponse, PATIENCE};
use fleet_limiter::Credential;
use fleet_limiter::Loader;
use fleet_limiter::Policy;
use fleet_limiter::{CanonicalPath, PathRules};
use serde_json::Value;
use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const DOWNLOAD: &str = "/api/agent/download/linux";
const ROTATE: &str = "/api/agent/rotate-key";
const OVERRIDE_PROBLEM: &str = "urn:fleet-limiter:problem:method-override";
const METHOD_PROBLEM: &str = "urn:fleet-limiter:problem:unsupported-method";
const ALLOW: &str = "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS";

/// Every built-in limiter with its budget raised far above what these tests send.
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

use common::unavailable;

fn node_dir() -> PathBuf {
    common::manifest_dir().join("tests/paths/node")
}

fn program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/usr/local/sbin", "/sbin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// One request the app saw.
#[derive(Debug, Clone, serde::Deserialize)]
struct Hit {
    /// The method Express routed on.
    method: String,
    /// The method in the request line.
    original: String,
    url: String,
    route: String,
    /// Every header whose name contains "method".
    headers: serde_json::Map<String, Value>,
}

/// The Express app with `method-override`, stopped on drop.
struct App {
    addr: SocketAddr,
    child: Child,
    hits: PathBuf,
    mark: usize,
    _dir: tempfile::TempDir,
}

impl Drop for App {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl App {
    /// `None` (skipped, or failing under `CI`) when node or the packages are missing.
    fn start() -> Option<App> {
        let Some(node) = program("node") else {
            unavailable("node is not installed (apt-get install nodejs npm)");
            return None;
        };
        if !node_dir().join("node_modules/method-override").is_dir() {
            unavailable("method-override is not installed (run `npm ci` in tests/paths/node)");
            return None;
        }
        let dir = tempfile::tempdir().expect("temp dir");
        let hits = dir.path().join("hits.log");
        let stderr = std::fs::File::create(dir.path().join("stderr.log")).expect("stderr");
        let mut child = Command::new(node)
            .arg(node_dir().join("override.js"))
            .arg(&hits)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("start node");
        let stdout = child.stdout.take().expect("stdout");
        let mut first = String::new();
        let _ = BufReader::new(stdout).read_line(&mut first);
        let port: u16 = first
            .trim()
            .strip_prefix("listening ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| {
                panic!(
                    "the Express app did not start: {first:?} {}",
                    std::fs::read_to_string(dir.path().join("stderr.log")).unwrap_or_default()
                )
            });
        Some(App {
            addr: ([127, 0, 0, 1], port).into(),
            child,
            hits,
            mark: 0,
            _dir: dir,
        })
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn lines(&self) -> Vec<Hit> {
        let text = std::fs::read_to_string(&self.hits).unwrap_or_default();
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("hit {l:?}: {e}")))
            .collect()
    }

    /// What the app saw since the last call: `GET /__barrier` straight to the app, then every
    /// line logged before it.
    fn hits_since_mark(&mut self) -> Vec<Hit> {
        let res = raw(self.addr, &request("GET", "/__barrier", &[]));
        assert_eq!(res.header("x-route"), Some("barrier"));
        let deadline = Instant::now() + PATIENCE;
        loop {
            let lines = self.lines();
            if let Some(i) = (self.mark..lines.len()).find(|&i| lines[i].route == "barrier") {
                let seen = lines[self.mark..i].to_vec();
                self.mark = i + 1;
                return seen;
            }
            assert!(Instant::now() < deadline, "the barrier was never logged");
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// `METHOD TARGET HTTP/1.1`, the headers as given (any bytes, any repetition), an empty body,
/// `Connection: close`.
fn request(method: &str, target: &str, headers: &[(&str, &str)]) -> Vec<u8> {
    let mut r = format!("{method} {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n");
    for (k, v) in headers {
        r.push_str(&format!("{k}: {v}\r\n"));
    }
    r.push_str("Content-Length: 0\r\nConnection: close\r\n\r\n");
    r.into_bytes()
}

fn raw(addr: SocketAddr, bytes: &[u8]) -> RawResponse {
    common::raw_request(addr, bytes)
}

fn problem_type(a: &RawResponse) -> Option<String> {
    let body = String::from_utf8_lossy(&a.body);
    let start = body.find('{')?;
    let v: Value = serde_json::from_str(body[start..].trim_end()).ok()?;
    v.get("type")?.as_str().map(str::to_owned)
}

/// The limiter names of an answer's `RateLimit-Policy`.
fn metered(a: &RawResponse) -> BTreeSet<String> {
    a.headers
        .iter()
        .filter(|(k, _)| k == "ratelimit-policy")
        .flat_map(|(_, v)| common::parse_policy(v))
        .map(|(name, _, _)| name)
        .collect()
}

/// The limiters the crate's own policy gives `method` on `path`.
fn names(policy: &Policy, method: &str, path: &str) -> BTreeSet<String> {
    policy
        .applicable(
            method,
            &CanonicalPath::parse(path, PathRules::STRICT).expect("path"),
            Credential::None,
        )
        .iter()
        .map(|l| l.name.to_string())
        .collect()
}

/// A route's plain example path (tests/paths/routes.json).
fn example(route: &str) -> String {
    let text = std::fs::read_to_string(common::manifest_dir().join("tests/paths/routes.json"))
        .expect("routes.json");
    let routes: Vec<Value> = serde_json::from_str(&text).expect("routes.json");
    routes
        .iter()
        .find(|r| r["id"] == route)
        .and_then(|r| r["example"].as_str())
        .unwrap_or_else(|| panic!("no route {route}"))
        .to_owned()
}

/// What one hostile request must come to.
#[derive(Debug, Clone, Copy)]
enum Expect {
    /// Served by the app as this route, routed as this method.
    Served(&'static str, &'static str),
    /// Refused by the gateway with this status and problem type; the app saw nothing.
    Refused(u16, &'static str),
}

struct Case {
    method: &'static str,
    target: String,
    headers: Vec<(&'static str, &'static str)>,
    expect: Expect,
}

fn case(
    method: &'static str,
    target: &str,
    headers: &[(&'static str, &'static str)],
    expect: Expect,
) -> Case {
    Case {
        method,
        target: target.to_owned(),
        headers: headers.to_vec(),
        expect,
    }
}

const XHMO: &str = "X-HTTP-Method-Override";

/// The hostile spellings, each with what the app does with it (checked without the gateway
/// too) and what the gateway must make of it in the default `meter` mode.
fn spellings() -> Vec<Case> {
    let mut cases = header_spellings();
    cases.extend(parameter_spellings());
    cases.extend(refused_spellings());
    cases
}

/// Plain requests, and the override header spelled every way the app reads it and some it
/// does not.
fn header_spellings() -> Vec<Case> {
    use Expect::*;
    let d = DOWNLOAD;
    vec![
        // Plain requests: served as themselves (refusing everything cannot pass).
        case("POST", d, &[], Served("agent", "POST")),
        case("GET", d, &[], Served("download", "GET")),
        case("POST", ROTATE, &[], Served("key-rotation", "POST")),
        // The header, spelled every way the app reads it.
        case("POST", d, &[(XHMO, "GET")], Served("download", "GET")),
        case(
            "POST",
            d,
            &[("x-http-method-override", "GET")],
            Served("download", "GET"),
        ),
        case(
            "POST",
            d,
            &[("X-HTTP-METHOD-OVERRIDE", "get")],
            Served("download", "GET"),
        ),
        case("POST", d, &[(XHMO, "  GeT  ")], Served("download", "GET")),
        case("POST", d, &[(XHMO, "GET, POST")], Served("download", "GET")),
        case("POST", d, &[(XHMO, "GET,PUT")], Served("download", "GET")),
        case("POST", d, &[(XHMO, ",GET")], Served("agent", "POST")),
        case(
            "POST",
            d,
            &[(XHMO, "GET"), (XHMO, "PUT")],
            Served("download", "GET"),
        ),
        case(
            "POST",
            d,
            &[(XHMO, "PUT"), (XHMO, "GET")],
            Served("agent", "PUT"),
        ),
        case(
            "POST",
            d,
            &[("X-HTTP-Method", "GET")],
            Served("download", "GET"),
        ),
        case(
            "POST",
            d,
            &[("X-Method-Override", "get")],
            Served("download", "GET"),
        ),
        case(
            "POST",
            d,
            &[("X-Method-Override", "PUT"), ("X-HTTP-Method", "GET")],
            Served("agent", "PUT"),
        ),
        // The app ignores these spellings; the gateway meters them anyway (other servers map
        // `_` to `-`), which only costs the client more.
        case(
            "POST",
            d,
            &[("X_HTTP_Method_Override", "GET")],
            Served("agent", "POST"),
        ),
        case("POST", d, &[(XHMO, "")], Served("agent", "POST")),
    ]
}

/// The query parameter, alone and with the header, and overrides of methods other than POST.
fn parameter_spellings() -> Vec<Case> {
    use Expect::*;
    let d = DOWNLOAD;
    let q = |s: &str| format!("{d}?{s}");
    vec![
        // The query parameter.
        case("POST", &q("_method=GET"), &[], Served("download", "GET")),
        case("POST", &q("_method=get"), &[], Served("download", "GET")),
        case("POST", &q("%5Fmethod=GET"), &[], Served("download", "GET")),
        case(
            "POST",
            &q("%5fmethod=G%45T"),
            &[],
            Served("download", "GET"),
        ),
        case(
            "POST",
            &q("a=1&_method=GET&b=2"),
            &[],
            Served("download", "GET"),
        ),
        case(
            "POST",
            &q("_method=PUT&_method=GET"),
            &[],
            Served("agent", "PUT"),
        ),
        case(
            "POST",
            &q("_method=GET&_method=PUT"),
            &[],
            Served("download", "GET"),
        ),
        case("POST", &q("_METHOD=GET"), &[], Served("agent", "POST")),
        case("POST", &q("_method=+GET"), &[], Served("agent", "POST")),
        case("POST", &q("a=1;_method=GET"), &[], Served("agent", "POST")),
        // Header and parameter together: the parameter's middleware runs last.
        case(
            "POST",
            &q("_method=GET"),
            &[(XHMO, "PUT")],
            Served("download", "GET"),
        ),
        // Any method can be overridden in this app, not only POST.
        case(
            "GET",
            ROTATE,
            &[(XHMO, "POST")],
            Served("key-rotation", "POST"),
        ),
        case(
            "GET",
            &format!("{ROTATE}?_method=post"),
            &[],
            Served("key-rotation", "POST"),
        ),
        case(
            "DELETE",
            ROTATE,
            &[("X-HTTP-Method", "POST")],
            Served("key-rotation", "POST"),
        ),
    ]
}

/// What the gateway refuses: values it will not guess at, methods it does not forward, and
/// the header sent too many times.
fn refused_spellings() -> Vec<Case> {
    use Expect::*;
    let d = DOWNLOAD;
    let q = |s: &str| format!("{d}?{s}");
    let refused = Refused(400, OVERRIDE_PROBLEM);
    let mut cases = vec![
        // Values the gateway will not guess at: the app would route some (PROPFIND, the
        // Kelvin sign that JavaScript lower-cases to `k`), so they are refused.
        case("POST", d, &[(XHMO, "PROPFIND")], refused),
        case("POST", d, &[(XHMO, "CONNECT")], refused),
        case("POST", d, &[(XHMO, "TRACE")], refused),
        case("POST", d, &[(XHMO, "G ET")], refused),
        case("POST", d, &[(XHMO, "GET;")], refused),
        case("POST", &q("_method=PROPFIND"), &[], refused),
        case("POST", &q("_method=LOC%E2%84%AA"), &[], refused),
        case("POST", &q("_method=GET%00"), &[], refused),
        case("POST", &q("_method=%0AGET"), &[], refused),
        case(
            "POST",
            &q("_method=GET,PUT,PATCH,DELETE,HEAD"),
            &[],
            refused,
        ),
        // Methods the gateway does not forward at all.
        case("PROPFIND", d, &[], Refused(501, METHOD_PROBLEM)),
        case("TRACE", d, &[], Refused(501, METHOD_PROBLEM)),
        case("FOO", d, &[], Refused(501, METHOD_PROBLEM)),
        case("get", d, &[], Refused(501, METHOD_PROBLEM)),
    ];
    let flood: Vec<(&'static str, &'static str)> = (0..17).map(|_| (XHMO, "GET")).collect();
    cases.push(case("POST", d, &flood, refused));
    cases
}

fn gateway(app: &App, env: &[(&str, &str)]) -> Gateway {
    Gateway::serve()
        .upstream(&app.url())
        .config_toml(RAISED)
        .admin()
        .envs(env.iter().map(|(k, v)| (k.to_string(), v.to_string())))
        .spawn()
}

fn raised_policy() -> Policy {
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("raised.toml");
    std::fs::write(&file, RAISED).expect("write");
    let cfg = Loader::new().file(&file).load().expect("raised config");
    Policy::new(cfg.limiters)
}

#[test]
fn the_app_routes_overrides_as_the_cases_say() {
    // Without the gateway: the app really serves these spellings as the routes the cases name,
    // so the gateway tests below can fail.
    let Some(mut app) = App::start() else { return };
    let mut wrong = Vec::new();
    for c in spellings() {
        let Expect::Served(route, method) = c.expect else {
            continue;
        };
        let res = raw(app.addr, &request(c.method, &c.target, &c.headers));
        let seen = app.hits_since_mark();
        let got = (res.header("x-route"), res.header("x-method"));
        if got != (Some(route), Some(method)) || seen.len() != 1 {
            wrong.push(format!(
                "{} {} {:?}: {got:?} {seen:?}",
                c.method, c.target, c.headers
            ));
        }
    }
    // And the ones the gateway refuses for their values are routed by the app, or not, as a
    // framework would: PROPFIND is a method to method-override.
    let res = raw(app.addr, &request("POST", DOWNLOAD, &[(XHMO, "PROPFIND")]));
    assert_eq!(res.header("x-method"), Some("PROPFIND"));
    app.hits_since_mark();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn every_override_spelling_is_refused_or_metered_as_the_route_served() {
    let Some(mut app) = App::start() else { return };
    let gw = gateway(&app, &[]);
    let policy = raised_policy();
    let mut failures = Vec::new();
    for c in spellings() {
        let res = raw(gw.addr, &request(c.method, &c.target, &c.headers));
        let seen = app.hits_since_mark();
        let label = format!("{} {} {:?}", c.method, c.target, c.headers);
        match c.expect {
            Expect::Refused(status, kind) => {
                if res.status != status
                    || problem_type(&res).as_deref() != Some(kind)
                    || !seen.is_empty()
                {
                    failures.push(format!(
                        "{label}: want {status} {kind} unseen, got {} {:?}, app saw {seen:?}",
                        res.status,
                        problem_type(&res)
                    ));
                }
                if status == 501 && res.header("allow") != Some(ALLOW) {
                    failures.push(format!("{label}: Allow {:?}", res.header("allow")));
                }
            }
            Expect::Served(route, method) => {
                let [hit] = seen.as_slice() else {
                    failures.push(format!(
                        "{label}: the app saw {seen:?} ({} {:?})",
                        res.status,
                        problem_type(&res)
                    ));
                    continue;
                };
                if (hit.route.as_str(), hit.method.as_str()) != (route, method)
                    || hit.original != c.method
                {
                    failures.push(format!(
                        "{label}: served {} as {} (from {})",
                        hit.route, hit.method, hit.original
                    ));
                }
                // Metered by every limiter of the route as the app routed it, and of the
                // request's own method: never fewer.
                let got = metered(&res);
                let want: BTreeSet<String> = names(&policy, &hit.method, &example(&hit.route))
                    .union(&names(&policy, c.method, &example(&hit.route)))
                    .cloned()
                    .collect();
                if !want.is_subset(&got) {
                    failures.push(format!(
                        "{label}: served {route} as {method}, metered {got:?}, ESCAPED {:?}",
                        want.difference(&got).collect::<Vec<_>>()
                    ));
                }
                // Forwarded unchanged: the override still reaches the app.
                if hit.url != c.target {
                    failures.push(format!("{label}: the app saw {}", hit.url));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} failed:\n{}",
        failures.len(),
        spellings().len(),
        failures.join("\n")
    );
}

#[tokio::test]
async fn a_post_named_get_is_charged_the_download_budget() {
    // An Express app with method-override serves POST /api/agent/download/linux +
    // X-HTTP-Method-Override: GET as the download route: once the download budget is spent,
    // every such request is refused, in every spelling, and the app sees none of them.
    let Some(mut app) = App::start() else { return };
    let gw = Gateway::serve()
        .upstream(&app.url())
        .admin()
        .env("FLEET_LIMITER_LIMITER_DOWNLOAD_LIMIT", "3")
        .spawn();
    for _ in 0..3 {
        let res = raw(gw.addr, &request("GET", DOWNLOAD, &[]));
        assert_eq!(res.status, 200, "{res:?}");
    }
    assert_eq!(app.hits_since_mark().len(), 3);
    let q = |s: &str| format!("{DOWNLOAD}?{s}");
    let spellings: Vec<(String, Vec<(&str, &str)>)> = vec![
        (DOWNLOAD.to_owned(), vec![(XHMO, "GET")]),
        (DOWNLOAD.to_owned(), vec![("x-http-method-override", "get")]),
        (DOWNLOAD.to_owned(), vec![("X-HTTP-Method", "GET")]),
        (DOWNLOAD.to_owned(), vec![("X-Method-Override", "GET")]),
        (DOWNLOAD.to_owned(), vec![(XHMO, "GET, POST")]),
        (q("_method=GET"), vec![]),
        (q("%5Fmethod=get"), vec![]),
    ];
    for round in 0..20 {
        for (target, headers) in &spellings {
            let res = raw(gw.addr, &request("POST", target, headers));
            assert_eq!(
                res.status, 429,
                "round {round}: POST {target} {headers:?}: {res:?}"
            );
            assert!(metered(&res).contains("download"), "{res:?}");
        }
    }
    assert_eq!(
        app.hits_since_mark().len(),
        0,
        "the app served none of them"
    );
    // A POST with no override is the agent route's, on its own budget.
    let plain = raw(gw.addr, &request("POST", DOWNLOAD, &[]));
    assert_eq!(plain.status, 200);
    assert_eq!(plain.header("x-route"), Some("agent"));
    let metered = gw
        .metric(r#"fleet_limiter_method_overrides_total{action="metered"}"#)
        .await;
    assert_eq!(metered, Some(140.0));
}

#[tokio::test]
async fn strip_removes_every_override_before_the_app_sees_it() {
    let Some(mut app) = App::start() else { return };
    let gw = gateway(&app, &[("FLEET_LIMITER_METHOD_OVERRIDE", "strip")]);
    let policy = raised_policy();
    let own = names(&policy, "POST", DOWNLOAD);
    for (target, headers, url) in [
        (DOWNLOAD, vec![(XHMO, "GET")], DOWNLOAD),
        (
            DOWNLOAD,
            vec![("x-http-method", "GET"), ("X-Method-Override", "GET")],
            DOWNLOAD,
        ),
        (DOWNLOAD, vec![("X_HTTP_Method_Override", "GET")], DOWNLOAD),
        (DOWNLOAD, vec![(XHMO, "not a method at all")], DOWNLOAD),
        (DOWNLOAD, vec![(XHMO, "GET"), (XHMO, "PROPFIND")], DOWNLOAD),
        ("/api/agent/download/linux?_method=GET", vec![], DOWNLOAD),
        (
            "/api/agent/download/linux?a=1&_method=GET&%5Fmethod=GET;_METHOD=x&b=%20",
            vec![],
            "/api/agent/download/linux?a=1&b=%20",
        ),
        (
            "/api/agent/download/linux?_method=GET&a=1",
            vec![(XHMO, "GET")],
            "/api/agent/download/linux?a=1",
        ),
    ] {
        let res = raw(gw.addr, &request("POST", target, &headers));
        let seen = app.hits_since_mark();
        let [hit] = seen.as_slice() else {
            panic!("{target} {headers:?}: {res:?}, app saw {seen:?}");
        };
        assert_eq!(
            (hit.route.as_str(), hit.method.as_str(), hit.url.as_str()),
            ("agent", "POST", url),
            "{target} {headers:?}"
        );
        assert!(
            hit.headers.is_empty(),
            "{target} {headers:?}: the app saw {:?}",
            hit.headers
        );
        assert_eq!(
            metered(&res),
            own,
            "{target} {headers:?}: metered as a POST"
        );
    }
    // A request naming none is forwarded untouched.
    let res = raw(
        gw.addr,
        &request("GET", "/api/agent/download/linux?a=1", &[]),
    );
    assert_eq!(res.header("x-route"), Some("download"));
    assert_eq!(
        app.hits_since_mark()[0].url,
        "/api/agent/download/linux?a=1"
    );
    assert_eq!(
        gw.metric(r#"fleet_limiter_method_overrides_total{action="stripped"}"#)
            .await,
        Some(8.0)
    );
}

#[tokio::test]
async fn refuse_answers_400_and_forwards_nothing() {
    let Some(mut app) = App::start() else { return };
    let gw = gateway(&app, &[("FLEET_LIMITER_METHOD_OVERRIDE", "refuse")]);
    let mut refused = 0;
    for c in spellings() {
        let res = raw(gw.addr, &request(c.method, &c.target, &c.headers));
        let seen = app.hits_since_mark();
        let names_one = c.headers.iter().any(|(k, _)| {
            let k = k.to_ascii_lowercase().replace('_', "-");
            [
                "x-http-method-override",
                "x-http-method",
                "x-method-override",
            ]
            .contains(&k.as_str())
        }) || c.target.to_ascii_lowercase().contains("method=");
        match c.expect {
            Expect::Refused(501, _) => assert_eq!(res.status, 501, "{} {}", c.method, c.target),
            _ if names_one => {
                refused += 1;
                assert_eq!(
                    res.status, 400,
                    "{} {} {:?}: {res:?}",
                    c.method, c.target, c.headers
                );
                assert_eq!(problem_type(&res).as_deref(), Some(OVERRIDE_PROBLEM));
                assert!(seen.is_empty(), "{} {}: {seen:?}", c.method, c.target);
            }
            _ => {
                assert_eq!(res.status, 200, "{} {} {:?}", c.method, c.target, c.headers);
                assert_eq!(seen.len(), 1);
            }
        }
    }
    assert!(refused > 30, "{refused}");
    assert_eq!(
        gw.metric(r#"fleet_limiter_method_refusals_total{reason="override_refused"}"#)
            .await,
        Some(f64::from(refused))
    );
}

/// A request whose connection the gateway must answer and then close (no `Connection: close`
/// from the client): the answer, or why there was none.
fn answered_and_closed(addr: SocketAddr, bytes: &[u8]) -> Result<RawResponse, String> {
    let mut s = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(PATIENCE))
        .map_err(|e| e.to_string())?;
    s.write_all(bytes).map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    match s.read_to_end(&mut buf) {
        Ok(_) if buf.is_empty() => Err("closed without an answer".to_owned()),
        Ok(_) => Ok(parse(&buf)),
        Err(e) => Err(format!(
            "the connection stayed open ({e}) after {:?}",
            String::from_utf8_lossy(&buf)
        )),
    }
}

fn parse(buf: &[u8]) -> RawResponse {
    let end = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no head in {:?}", String::from_utf8_lossy(buf)));
    let head = String::from_utf8_lossy(&buf[..end]);
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .expect("status");
    RawResponse {
        status,
        headers: lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
            .collect(),
        body: buf[end + 4..].to_vec(),
    }
}

#[tokio::test]
async fn connect_trace_and_unknown_methods_are_answered_never_forwarded() {
    let Some(mut app) = App::start() else { return };
    let gw = gateway(&app, &[]);
    // CONNECT, as the issue sent it and as a proxy client sends it, with tunnel bytes after it:
    // answered 501 and the connection closed, never a hang.
    for head in [
        "CONNECT /api/agent/rotate-key HTTP/1.1\r\nHost: api.test\r\n\r\n",
        "CONNECT api.test:443 HTTP/1.1\r\nHost: api.test:443\r\n\r\n\x16\x03\x01\x00\x05hello",
        "CONNECT /api/agent/rotate-key HTTP/1.1\r\nHost: api.test\r\nContent-Length: 5\r\n\r\nhello",
    ] {
        let res = answered_and_closed(gw.addr, head.as_bytes())
            .unwrap_or_else(|e| panic!("{head:?}: {e}"));
        assert_eq!(res.status, 501, "{head:?}");
        assert_eq!(res.header("allow"), Some(ALLOW));
        assert_eq!(problem_type(&res).as_deref(), Some(METHOD_PROBLEM));
    }
    assert!(app.hits_since_mark().is_empty(), "the app saw a CONNECT");
    // TRACE, WebDAV, made-up and lower-case methods: 501 with Allow, and the connection stays
    // usable (the next request on it is answered).
    for method in [
        "TRACE", "PROPFIND", "MKCOL", "FOO", "get", "Post", "M-SEARCH",
    ] {
        let mut s = TcpStream::connect(gw.addr).expect("connect");
        s.set_read_timeout(Some(PATIENCE)).expect("timeout");
        let two = format!(
            "{method} {ROTATE} HTTP/1.1\r\nHost: api.test\r\nContent-Length: 3\r\n\r\nabcGET {DOWNLOAD} HTTP/1.1\r\nHost: api.test\r\nConnection: close\r\n\r\n"
        );
        s.write_all(two.as_bytes()).expect("write");
        let mut buf = Vec::new();
        let _ = s.read_to_end(&mut buf);
        let text = String::from_utf8_lossy(&buf);
        assert!(text.starts_with("HTTP/1.1 501"), "{method}: {text}");
        assert!(text.contains(METHOD_PROBLEM), "{method}: {text}");
        assert!(
            text.contains(&format!("allow: {ALLOW}")),
            "{method}: {text}"
        );
        assert_eq!(
            text.matches("HTTP/1.1 200").count(),
            1,
            "{method}: the next request on the connection is served: {text}"
        );
        let seen = app.hits_since_mark();
        assert_eq!(
            seen.len(),
            1,
            "{method}: only the GET reached the app: {seen:?}"
        );
        assert_eq!(seen[0].method, "GET");
    }
    assert_eq!(
        gw.metric(r#"fleet_limiter_method_refusals_total{reason="method_not_allowed"}"#)
            .await,
        Some(10.0)
    );
}

#[test]
fn an_allowed_list_forwards_what_it_names_and_refuses_overrides_to_the_rest() {
    let Some(mut app) = App::start() else { return };
    let gw = gateway(
        &app,
        &[("FLEET_LIMITER_ALLOWED_METHODS", "GET,POST,PROPFIND")],
    );
    let res = raw(gw.addr, &request("PROPFIND", "/api/agent/heartbeat", &[]));
    assert_eq!(res.header("x-route"), Some("agent"), "{res:?}");
    assert_eq!(app.hits_since_mark()[0].method, "PROPFIND");
    // An override naming PROPFIND is now metered as one; PUT is no longer forwarded, by its
    // own method or by override.
    let res = raw(gw.addr, &request("POST", DOWNLOAD, &[(XHMO, "propfind")]));
    assert_eq!(res.header("x-method"), Some("PROPFIND"), "{res:?}");
    app.hits_since_mark();
    let res = raw(gw.addr, &request("PUT", DOWNLOAD, &[]));
    assert_eq!(
        (res.status, res.header("allow")),
        (501, Some("GET, POST, PROPFIND"))
    );
    let res = raw(gw.addr, &request("POST", DOWNLOAD, &[(XHMO, "PUT")]));
    assert_eq!(res.status, 400);
    let body = String::from_utf8_lossy(&res.body);
    assert!(
        body.contains(
            "names `PUT`, which this gateway does not forward (it forwards GET, POST, PROPFIND)"
        ),
        "{body}"
    );
    assert!(app.hits_since_mark().is_empty());
}

#[test]
fn connect_and_trace_cannot_be_allowed() {
    for (list, word) in [
        ("GET,CONNECT", "`CONNECT` cannot be allowed"),
        ("get,trace", "`trace` cannot be allowed"),
    ] {
        let out = common::Launch::serve()
            .upstream("http://127.0.0.1:9")
            .env("FLEET_LIMITER_ALLOWED_METHODS", list)
            .run(Duration::from_secs(30));
        assert_eq!(out.code, Some(2), "{}", out.stderr);
        assert!(
            out.stderr
                .contains("environment variable FLEET_LIMITER_ALLOWED_METHODS: methods.allowed")
                && out.stderr.contains(word)
                && out.stderr.contains("remove it from methods.allowed"),
            "{}",
            out.stderr
        );
    }
    let out = common::Launch::serve()
        .upstream("http://127.0.0.1:9")
        .args(["--method-override", "ignore"])
        .run(Duration::from_secs(30));
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("flag --method-override: methods.override: `ignore` is not a mode"),
        "{}",
        out.stderr
    );
}

// ---------------------------------------------------------------------------------------------
// The decision endpoint behind nginx and Caddy, in front of the same app.
// ---------------------------------------------------------------------------------------------

/// A proxy process, stopped on drop.
struct Proxy {
    child: Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Start a proxy on a free port: `launch(port, dir)` starts it and names its log. The port is
/// chosen before the proxy binds it, so a proxy that exits (another process took the port) is
/// started again on another, up to five times.
fn start_proxy(what: &str, launch: impl Fn(u16, &Path) -> (Child, PathBuf)) -> Proxy {
    let mut last = String::new();
    for _ in 0..5 {
        let dir = tempfile::tempdir().expect("temp dir");
        let port = free_port();
        let (mut child, log) = launch(port, dir.path());
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                last = format!(
                    "{what} exited with {status}: {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
                break;
            }
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return Proxy {
                    child,
                    addr,
                    _dir: dir,
                };
            }
            assert!(Instant::now() < deadline, "{what} never listened");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    panic!("{last}");
}

fn forward_auth_doc(name: &str) -> String {
    std::fs::read_to_string(common::manifest_dir().join("docs/forward-auth").join(name))
        .unwrap_or_else(|e| panic!("docs/forward-auth/{name}: {e}"))
}

/// nginx with `docs/forward-auth/nginx.conf`, its three addresses replaced.
fn nginx(decision: SocketAddr, upstream: SocketAddr) -> Option<Proxy> {
    let Some(bin) = program("nginx") else {
        unavailable("nginx is not installed (apt-get install nginx-light)");
        return None;
    };
    Some(start_proxy("nginx", |port, dir| {
        let site = forward_auth_doc("nginx.conf")
            .replace("127.0.0.1:7392", &decision.to_string())
            .replace("listen 80;", &format!("listen 127.0.0.1:{port};"))
            .replace("http://127.0.0.1:3000", &format!("http://{upstream}"));
        let d = dir.display();
        std::fs::write(dir.join("site.conf"), site).expect("site");
        let main = format!(
            "worker_processes 1;\ndaemon off;\nerror_log {d}/error.log warn;\npid {d}/nginx.pid;\nevents {{}}\nhttp {{\n  access_log off;\n  client_body_temp_path {d}/t1;\n  proxy_temp_path {d}/t2;\n  fastcgi_temp_path {d}/t3;\n  uwsgi_temp_path {d}/t4;\n  scgi_temp_path {d}/t5;\n  include {d}/site.conf;\n}}\n"
        );
        std::fs::write(dir.join("nginx.conf"), main).expect("nginx.conf");
        let log = dir.join("error.log");
        let child = Command::new(&bin)
            .arg("-c")
            .arg(dir.join("nginx.conf"))
            .arg("-e")
            .arg(&log)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nginx");
        (child, log)
    }))
}

/// Caddy with `docs/forward-auth/Caddyfile`, its three addresses replaced.
fn caddy(decision: SocketAddr, upstream: SocketAddr) -> Option<Proxy> {
    let Some(bin) = program("caddy") else {
        unavailable("caddy is not installed (apt-get install caddy)");
        return None;
    };
    Some(start_proxy("caddy", |port, dir| {
        let d = dir.display();
        let site = forward_auth_doc("Caddyfile")
            .replace(":80 {", &format!("http://127.0.0.1:{port} {{"))
            .replace("127.0.0.1:7392", &decision.to_string())
            .replace("127.0.0.1:3000", &upstream.to_string());
        let file = format!(
            "{{\n\tadmin off\n\tauto_https off\n\tstorage file_system {d}/data\n}}\n{site}"
        );
        std::fs::write(dir.join("Caddyfile"), file).expect("Caddyfile");
        let log = dir.join("caddy.log");
        let out = std::fs::File::create(&log).expect("log");
        let child = Command::new(&bin)
            .args(["run", "--adapter", "caddyfile", "--config"])
            .arg(dir.join("Caddyfile"))
            .env("HOME", dir)
            .env("XDG_DATA_HOME", dir)
            .env("XDG_CONFIG_HOME", dir)
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()
            .expect("start caddy");
        (child, log)
    }))
}

/// The decision endpoint alone, answering the proxies on 127.0.0.1.
fn decider(env: &[(&str, &str)]) -> Gateway {
    Gateway::serve()
        .decision_only()
        .env("FLEET_LIMITER_TRUST_PROXY", "127.0.0.1")
        .env("FLEET_LIMITER_DECISION_ALLOW_FROM", "127.0.0.1")
        .envs(env.iter().map(|(k, v)| (k.to_string(), v.to_string())))
        .spawn()
}

/// The issue's example, the query spelling, a method outside the list and the non-meter modes,
/// through one proxy. `nginx` answers what the limiter refuses with its configuration's 400,
/// Caddy passes the limiter's answer on as it is.
fn through_the_proxy(start: fn(SocketAddr, SocketAddr) -> Option<Proxy>, via: &str) {
    let Some(mut app) = App::start() else { return };
    let fl = decider(&[("FLEET_LIMITER_LIMITER_DOWNLOAD_LIMIT", "3")]);
    let Some(proxy) = start(fl.decision_addr.expect("decision"), app.addr) else {
        return;
    };
    for _ in 0..3 {
        let res = raw(proxy.addr, &request("GET", DOWNLOAD, &[]));
        assert_eq!(
            (res.status, res.header("x-route")),
            (200, Some("download")),
            "{via}: {res:?}"
        );
    }
    app.hits_since_mark();
    for (target, headers) in [
        (DOWNLOAD.to_owned(), vec![(XHMO, "GET")]),
        (DOWNLOAD.to_owned(), vec![("x-http-method", "get")]),
        (format!("{DOWNLOAD}?_method=GET"), vec![]),
        (format!("{DOWNLOAD}?%5Fmethod=get"), vec![]),
    ] {
        for _ in 0..5 {
            let res = raw(proxy.addr, &request("POST", &target, &headers));
            assert_eq!(res.status, 429, "{via}: POST {target} {headers:?}: {res:?}");
        }
    }
    let plain = raw(proxy.addr, &request("POST", DOWNLOAD, &[]));
    assert_eq!(
        (plain.status, plain.header("x-route")),
        (200, Some("agent")),
        "{via}"
    );
    assert_eq!(
        app.hits_since_mark().len(),
        1,
        "{via}: only the plain POST reached the app"
    );

    // A method the limiter does not let through, and an override it will not guess at.
    let res = raw(proxy.addr, &request("PROPFIND", DOWNLOAD, &[]));
    assert_eq!(
        problem_type(&res).as_deref(),
        Some(METHOD_PROBLEM),
        "{via}: {res:?}"
    );
    if via == "caddy" {
        assert_eq!(
            (res.status, res.header("allow")),
            (501, Some(ALLOW)),
            "{via}"
        );
    } else {
        assert_eq!(res.status, 400, "{via}: nginx passes on only its own 400");
    }
    let res = raw(
        proxy.addr,
        &request("POST", DOWNLOAD, &[(XHMO, "PROPFIND")]),
    );
    assert_eq!(
        (res.status, problem_type(&res).as_deref()),
        (400, Some(OVERRIDE_PROBLEM)),
        "{via}"
    );
    // CONNECT and TRACE: answered (by the proxy or the limiter), never a hang, never forwarded.
    let res = answered_and_closed(
        proxy.addr,
        b"CONNECT /api/agent/rotate-key HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
    )
    .unwrap_or_else(|e| panic!("{via}: CONNECT: {e}"));
    // nginx answers both itself (405) and never asks; Caddy asks, and passes the 501 on.
    let own = if via == "nginx" { 405 } else { 501 };
    assert_eq!(res.status, own, "{via}: CONNECT {res:?}");
    let res = raw(proxy.addr, &request("TRACE", ROTATE, &[]));
    assert_eq!(res.status, own, "{via}: TRACE {res:?}");
    assert!(
        app.hits_since_mark().is_empty(),
        "{via}: the app saw a refused request"
    );

    // `strip` cannot strip through a proxy, and `refuse` refuses: both answer 400.
    for mode in ["strip", "refuse"] {
        let fl = decider(&[("FLEET_LIMITER_METHOD_OVERRIDE", mode)]);
        let Some(proxy) = start(fl.decision_addr.expect("decision"), app.addr) else {
            return;
        };
        for (target, headers) in [
            (DOWNLOAD.to_owned(), vec![(XHMO, "GET")]),
            (format!("{DOWNLOAD}?a=1&_method=GET"), vec![]),
        ] {
            let res = raw(proxy.addr, &request("POST", &target, &headers));
            assert_eq!(
                (res.status, problem_type(&res).as_deref()),
                (400, Some(OVERRIDE_PROBLEM)),
                "{via} {mode}: {target} {headers:?}: {res:?}"
            );
        }
        let plain = raw(proxy.addr, &request("GET", DOWNLOAD, &[]));
        assert_eq!(plain.status, 200, "{via} {mode}");
        assert_eq!(
            app.hits_since_mark().len(),
            1,
            "{via} {mode}: only the plain GET reached the app"
        );
    }
}

#[test]
fn through_nginx_an_override_is_metered_or_refused_like_the_gateway() {
    through_the_proxy(nginx, "nginx");
}

#[test]
fn through_caddy_an_override_is_metered_or_refused_like_the_gateway() {
    through_the_proxy(caddy, "caddy");
}

#[tokio::test]
async fn methods_change_on_a_reload() {
    let Some(mut app) = App::start() else { return };
    let gw = Gateway::serve()
        .upstream(&app.url())
        .config_toml(RAISED)
        .admin()
        .spawn();
    let named = request("POST", DOWNLOAD, &[(XHMO, "GET")]);
    assert_eq!(raw(gw.addr, &named).header("x-route"), Some("download"));
    assert_eq!(
        raw(gw.addr, &request("PROPFIND", DOWNLOAD, &[])).status,
        501
    );
    app.hits_since_mark();
    gw.rewrite_config(&format!(
        "{RAISED}\n[methods]\noverride = \"refuse\"\nallowed = [\"GET\", \"POST\", \"PROPFIND\"]\n"
    ));
    gw.signal("HUP");
    gw.wait_metric(r#"fleet_limiter_config_reloads_total{result="ok"}"#, |v| {
        v == 1.0
    })
    .await;
    assert_eq!(raw(gw.addr, &named).status, 400);
    let res = raw(gw.addr, &request("PROPFIND", DOWNLOAD, &[]));
    assert_eq!(res.header("x-route"), Some("agent"), "{res:?}");
    assert_eq!(
        app.hits_since_mark().len(),
        1,
        "only the PROPFIND reached the app"
    );
}
