//! The three real upstreams of `tests/paths.rs`, each routing by its own rules: nginx (on its
//! normalised `$uri`), Express 5 (path-to-regexp on the raw pathname) and a WHATWG URL router
//! (`new URL(req.url, base).pathname`). Each serves the routes of `routes.json`, answers 200
//! with `X-Route: <route id>` (404 with `X-Route: none` when no route matches), and logs every
//! request it sees to a hits file, so a test can tell which requests reached it. Also the same
//! Express app with fleet-limiter's Express client in front of its routes
//! ([`Upstream::express_client`]), and the raw HTTP/1.1 exchange that sends a request target
//! byte for byte.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long an upstream may take to start, or to log a request it answered.
const PATIENCE: Duration = Duration::from_secs(30);

/// One route of `tests/paths/routes.json`.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Route {
    pub id: String,
    /// `None`: any method.
    pub method: Option<String>,
    pub path: String,
    /// Also serves everything below `path`.
    pub prefix: bool,
    /// A representative path the route serves, with nothing unusual in it.
    pub example: String,
}

pub fn paths_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/paths")
}

pub fn routes() -> Vec<Route> {
    let text = std::fs::read_to_string(paths_dir().join("routes.json")).expect("routes.json");
    serde_json::from_str(&text).expect("routes.json parses")
}

/// Where a program is: on `PATH`, or in the sbin directories (where Debian puts nginx).
pub fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/usr/local/sbin", "/sbin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Why an upstream cannot run here (its program or packages are missing).
pub fn missing(kind: Kind) -> Option<String> {
    match kind {
        Kind::Nginx => find_program("nginx")
            .is_none()
            .then(|| "nginx is not installed (apt-get install nginx-light)".to_owned()),
        Kind::Express | Kind::Whatwg => {
            if find_program("node").is_none() {
                Some("node is not installed (apt-get install nodejs npm)".to_owned())
            } else if kind == Kind::Express
                && !paths_dir().join("node/node_modules/express").is_dir()
            {
                Some("Express is not installed (run `npm ci` in tests/paths/node)".to_owned())
            } else {
                None
            }
        }
        Kind::ExpressClient => missing(Kind::Express).or_else(|| {
            let client = crate::common::manifest_dir().join("clients/express/node_modules");
            (!client.join("parseurl").is_dir()).then(|| {
                "the Express client's dependencies are not installed (run `npm ci` in clients/express)"
                    .to_owned()
            })
        }),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Nginx,
    Express,
    Whatwg,
    /// The Express app behind fleet-limiter's Express client: its own front.
    ExpressClient,
}

impl Kind {
    /// The upstreams a front forwards to.
    pub const ALL: [Kind; 3] = [Kind::Nginx, Kind::Express, Kind::Whatwg];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Nginx => "nginx",
            Kind::Express => "express",
            Kind::Whatwg => "whatwg-url",
            Kind::ExpressClient => "express-client",
        }
    }
}

/// A running upstream, stopped on drop.
pub struct Upstream {
    pub kind: Kind,
    pub addr: SocketAddr,
    child: Child,
    hits: PathBuf,
    /// How many lines of the hits file earlier calls of [`Upstream::hits_since_mark`] consumed.
    mark: usize,
    dir: tempfile::TempDir,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Upstream {
    /// One of [`Kind::ALL`].
    pub fn start(kind: Kind) -> Upstream {
        match kind {
            Kind::Nginx => Self::nginx(),
            Kind::Express | Kind::Whatwg => Self::node(kind, None),
            Kind::ExpressClient => panic!("the Express client needs a decision endpoint"),
        }
    }

    /// The Express app with fleet-limiter's Express client in front of its routes, asking the
    /// decision endpoint at `decision`.
    pub fn express_client(decision: SocketAddr) -> Upstream {
        Self::node(Kind::ExpressClient, Some(decision))
    }

    fn nginx() -> Upstream {
        let nginx = find_program("nginx").expect("nginx");
        let template = std::fs::read_to_string(paths_dir().join("nginx.conf")).expect("nginx.conf");
        let mut last = String::new();
        // The port is chosen before nginx binds it: try again when another process took it.
        for _ in 0..5 {
            let dir = temp_dir();
            let port = crate::common::free_port();
            let conf = template
                .replace("@DIR@", &dir.path().display().to_string())
                .replace("@PORT@", &port.to_string());
            let conf_path = dir.path().join("nginx.conf");
            std::fs::write(&conf_path, conf).expect("write nginx.conf");
            let hits = dir.path().join("hits.log");
            std::fs::write(&hits, "").expect("create hits.log");
            let stderr = std::fs::File::create(dir.path().join("stderr.log")).expect("stderr");
            let child = Command::new(&nginx)
                .arg("-p")
                .arg(dir.path())
                .arg("-c")
                .arg(&conf_path)
                .arg("-e")
                .arg("stderr")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(stderr)
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start {}: {e}", nginx.display()));
            let mut up = Upstream {
                kind: Kind::Nginx,
                addr: ([127, 0, 0, 1], port).into(),
                child,
                hits,
                mark: 0,
                dir,
            };
            match up.wait_listening() {
                Ok(()) => return up,
                Err(e) => last = e,
            }
        }
        panic!("nginx did not start: {last}");
    }

    fn node(kind: Kind, decision: Option<SocketAddr>) -> Upstream {
        let node = find_program("node").expect("node");
        let dir = temp_dir();
        let hits = dir.path().join("hits.log");
        let stderr = std::fs::File::create(dir.path().join("stderr.log")).expect("stderr");
        let mut child = Command::new(node)
            .arg(paths_dir().join("node/upstream.js"))
            .arg(match kind {
                Kind::Express => "express",
                Kind::ExpressClient => "express-client",
                _ => "whatwg",
            })
            .arg(&hits)
            .args(decision.map(|d| format!("http://{d}")))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("start node");
        // It prints `listening <port>` once it listens (or exits).
        let stdout = child.stdout.take().expect("node stdout");
        let mut first = String::new();
        let _ = BufReader::new(stdout).read_line(&mut first);
        let port: Option<u16> = first
            .trim()
            .strip_prefix("listening ")
            .and_then(|p| p.parse().ok());
        let mut up = Upstream {
            kind,
            addr: ([127, 0, 0, 1], port.unwrap_or(0)).into(),
            child,
            hits,
            mark: 0,
            dir,
        };
        if port.is_none() {
            let _ = up.child.wait();
            panic!(
                "the {} upstream did not start: {first:?}; stderr:\n{}",
                kind.name(),
                up.stderr()
            );
        }
        up
    }

    fn stderr(&self) -> String {
        let bytes = std::fs::read(self.dir.path().join("stderr.log")).unwrap_or_default();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    fn wait_listening(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("exited with {status}; stderr:\n{}", self.stderr()));
            }
            if TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)).is_ok() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!("not listening after {PATIENCE:?}"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn lines(&self) -> Vec<String> {
        let bytes = std::fs::read(&self.hits).unwrap_or_default();
        String::from_utf8_lossy(&bytes)
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// The requests the upstream logged since the last call: sends `GET /__barrier` to it
    /// directly and waits until that is logged too, so nothing an earlier request caused is
    /// still on its way to the log.
    pub fn hits_since_mark(&mut self) -> Vec<String> {
        let res = exchange(self.addr, "GET", b"/__barrier")
            .unwrap_or_else(|e| panic!("{}: barrier request failed: {e}", self.kind.name()));
        assert_eq!(
            res.header("x-route"),
            Some("barrier"),
            "{}: the barrier was not served as such",
            self.kind.name()
        );
        let deadline = Instant::now() + PATIENCE;
        loop {
            let lines = self.lines();
            let barrier = lines
                .iter()
                .enumerate()
                .skip(self.mark)
                .find(|(_, l)| l.starts_with("GET ") && l.ends_with(" barrier"))
                .map(|(i, _)| i);
            if let Some(i) = barrier {
                let seen = lines[self.mark..i].to_vec();
                self.mark = i + 1;
                return seen;
            }
            assert!(
                Instant::now() < deadline,
                "{}: the barrier request was never logged",
                self.kind.name()
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

fn temp_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("fleet-limiter-paths-")
        .tempdir()
        .expect("temp dir")
}

/// One answer, as read off the wire (its body de-chunked).
pub use crate::common::RawResponse as Answer;

/// `METHOD TARGET HTTP/1.1` with the target's bytes exactly as given, no body, then the whole
/// answer (the connection is closed after it). An error when nothing that parses comes back.
pub fn exchange(addr: SocketAddr, method: &str, target: &[u8]) -> Result<Answer, String> {
    let mut s = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(60)))
        .map_err(|e| e.to_string())?;
    let mut req = Vec::with_capacity(target.len() + 128);
    req.extend_from_slice(method.as_bytes());
    req.push(b' ');
    req.extend_from_slice(target);
    req.extend_from_slice(
        b" HTTP/1.1\r\nHost: upstream.test\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    );
    s.write_all(&req).map_err(|e| format!("write: {e}"))?;
    let mut buf = Vec::new();
    let read = s.read_to_end(&mut buf);
    if buf.is_empty() {
        return Err(match read {
            Ok(_) => "the connection closed without an answer".to_owned(),
            Err(e) => format!("no answer: {e}"),
        });
    }
    parse(&buf)
}

fn parse(buf: &[u8]) -> Result<Answer, String> {
    let end = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| format!("no complete head in {:?}", String::from_utf8_lossy(buf)))?;
    let head = String::from_utf8_lossy(&buf[..end]);
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad status line {status_line:?}"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let raw = &buf[end + 4..];
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.to_ascii_lowercase().contains("chunked"));
    let body = if chunked { dechunk(raw) } else { raw.to_vec() };
    Ok(Answer {
        status,
        headers,
        body,
    })
}

fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = raw.windows(2).position(|w| w == b"\r\n") {
        let size_text = String::from_utf8_lossy(&raw[..eol]);
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
            .unwrap_or(0);
        raw = &raw[eol + 2..];
        if size == 0 || raw.len() < size {
            break;
        }
        out.extend_from_slice(&raw[..size]);
        raw = raw.get(size + 2..).unwrap_or_default();
    }
    out
}
