//! Shared end-to-end harness: runs the real `fleet-limiter` binary on a free loopback port,
//! waits until it accepts connections, and kills it when dropped. Also a `wiremock` upstream,
//! a proxy-free HTTP client, and a raw-bytes HTTP/1.1 client for requests `reqwest` refuses
//! to build.
//!
//! ```ignore
//! mod common;
//! let upstream = common::upstream().await;
//! let gw = common::Gateway::serve().upstream(&upstream.uri()).arg("--trust-proxy").arg("127.0.0.1/32").spawn();
//! let res = common::client().get(gw.url("/api/agent/heartbeat")).send().await?;
//! ```
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_fleet-limiter");

/// How many times start-up is polled before giving up, and the pause between polls.
const READY_TRIES: u32 = 600;
const READY_PAUSE: Duration = Duration::from_millis(50);
/// How many times a start-up is retried on a fresh port when the chosen one was taken meanwhile.
const PORT_RETRIES: u32 = 5;

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("cannot find a free port: {e}"))
}

/// A loopback address where nothing listens (for "upstream down").
pub fn dead_addr() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let a = l.local_addr().expect("local addr");
    drop(l);
    a
}

/// Output of a stream collected by a background thread, so the child never blocks on a full pipe.
#[derive(Clone, Default)]
pub struct Captured(Arc<Mutex<String>>);

impl Captured {
    fn spawn(stream: impl Read + Send + 'static) -> (Self, JoinHandle<()>) {
        let me = Self::default();
        let sink = me.clone();
        let handle = std::thread::spawn(move || {
            let mut r = BufReader::new(stream);
            let mut line = Vec::new();
            loop {
                line.clear();
                match r.read_until(b'\n', &mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => sink
                        .0
                        .lock()
                        .unwrap()
                        .push_str(&String::from_utf8_lossy(&line)),
                }
            }
        });
        (me, handle)
    }

    pub fn text(&self) -> String {
        self.0.lock().unwrap().clone()
    }
}

/// How a run of the binary ended.
#[derive(Debug)]
pub struct Exited {
    /// The exit code (`None` when killed by a signal).
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// What to run: arguments, environment, an optional config file.
#[derive(Clone, Debug, Default)]
pub struct Launch {
    args: Vec<String>,
    env: Vec<(String, String)>,
    config: Option<String>,
    /// `serve` mode: add `--listen 127.0.0.1:<free port>` and wait for the port.
    serve: bool,
    upstream: Option<String>,
    keep_env: bool,
}

impl Launch {
    /// `fleet-limiter serve --listen 127.0.0.1:<free port> ...`.
    pub fn serve() -> Self {
        Self {
            args: vec!["serve".into()],
            serve: true,
            ..Self::default()
        }
    }

    /// Any command line (e.g. `["check"]`), without `--listen` and without waiting for a port.
    pub fn command<S: Into<String>>(args: impl IntoIterator<Item = S>) -> Self {
        Self {
            args: args.into_iter().map(Into::into).collect(),
            ..Self::default()
        }
    }

    pub fn arg(mut self, a: impl Into<String>) -> Self {
        self.args.push(a.into());
        self
    }

    pub fn args<S: Into<String>>(mut self, a: impl IntoIterator<Item = S>) -> Self {
        self.args.extend(a.into_iter().map(Into::into));
        self
    }

    /// `--upstream URL` (serve only).
    pub fn upstream(mut self, url: &str) -> Self {
        self.upstream = Some(url.to_owned());
        self
    }

    pub fn env(mut self, k: impl Into<String>, v: impl Into<String>) -> Self {
        self.env.push((k.into(), v.into()));
        self
    }

    /// Write this TOML to a temporary file and pass `--config <file>`.
    pub fn config_toml(mut self, toml: impl Into<String>) -> Self {
        self.config = Some(toml.into());
        self
    }

    /// Keep `FLEET_LIMITER_*` variables of the test process (they are removed by default so a
    /// developer's shell cannot change what a test sees).
    pub fn keep_env(mut self) -> Self {
        self.keep_env = true;
        self
    }

    fn command_for(&self, listen: Option<SocketAddr>) -> (Command, Option<tempfile::TempPath>) {
        let mut cmd = Command::new(BIN);
        cmd.args(&self.args);
        if let Some(addr) = listen {
            cmd.arg("--listen").arg(addr.to_string());
        }
        if let Some(u) = &self.upstream {
            cmd.arg("--upstream").arg(u);
        }
        let config = self.config.as_ref().map(|text| {
            let mut f = tempfile::Builder::new()
                .prefix("fleet-limiter-test-")
                .suffix(".toml")
                .tempfile()
                .expect("temp config file");
            f.write_all(text.as_bytes()).expect("write config");
            let path = f.into_temp_path();
            cmd.arg("--config").arg(&*path);
            path
        });
        if !self.keep_env {
            for (k, _) in std::env::vars() {
                if k.starts_with("FLEET_LIMITER_") {
                    cmd.env_remove(k);
                }
            }
        }
        cmd.env("FLEET_LIMITER_LOG", "warn");
        // These tests pin budgets (tiny or stretched) that the start-up calibration check refuses;
        // that check has its own tests in tests/calibration.rs.
        cmd.env("FLEET_LIMITER_ALLOW_UNSAFE_CALIBRATION", "true");
        // Many gateways run at once: each admin listener takes a free port.
        cmd.env("FLEET_LIMITER_ADMIN_LISTEN", "127.0.0.1:0");
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        (cmd, config)
    }

    /// Start a `serve` and wait until it accepts connections. Panics (with the binary's stderr)
    /// when it exits or never listens.
    pub fn spawn(self) -> Gateway {
        assert!(
            self.serve,
            "spawn() is for `serve`; use run() for commands that exit"
        );
        let mut last_err = String::new();
        for _ in 0..PORT_RETRIES {
            let addr: SocketAddr = ([127, 0, 0, 1], free_port()).into();
            let (mut cmd, config) = self.command_for(Some(addr));
            let mut child = cmd
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start {BIN}: {e}"));
            let (stdout, out_t) = Captured::spawn(child.stdout.take().expect("stdout"));
            let (stderr, err_t) = Captured::spawn(child.stderr.take().expect("stderr"));
            let mut gw = Gateway {
                child,
                addr,
                stdout,
                stderr,
                readers: vec![out_t, err_t],
                _config: config,
            };
            match gw.wait_ready() {
                Ok(()) => return gw,
                Err(e) => {
                    let port_taken = gw.stderr.text().contains("cannot listen");
                    last_err = e;
                    drop(gw);
                    if !port_taken {
                        break;
                    }
                }
            }
        }
        panic!("the gateway did not start: {last_err}");
    }

    /// Run a command that is expected to exit (e.g. a start-up failure), within `limit`.
    /// Panics if it is still running then.
    pub fn run(self, limit: Duration) -> Exited {
        let listen = self.serve.then(|| ([127, 0, 0, 1], free_port()).into());
        let (mut cmd, _config) = self.command_for(listen);
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {BIN}: {e}"));
        let (stdout, out_t) = Captured::spawn(child.stdout.take().expect("stdout"));
        let (stderr, err_t) = Captured::spawn(child.stderr.take().expect("stderr"));
        let tries = (limit.as_millis() / READY_PAUSE.as_millis()).max(1);
        let mut status: Option<ExitStatus> = None;
        for _ in 0..tries {
            if let Some(s) = child.try_wait().expect("try_wait") {
                status = Some(s);
                break;
            }
            std::thread::sleep(READY_PAUSE);
        }
        let Some(status) = status else {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{BIN} {:?} still running after {limit:?}; stderr:\n{}",
                self.args,
                stderr.text()
            );
        };
        let _ = out_t.join();
        let _ = err_t.join();
        Exited {
            code: status.code(),
            stdout: stdout.text(),
            stderr: stderr.text(),
        }
    }
}

/// A running `fleet-limiter serve`, killed on drop.
pub struct Gateway {
    child: Child,
    pub addr: SocketAddr,
    stdout: Captured,
    stderr: Captured,
    readers: Vec<JoinHandle<()>>,
    _config: Option<tempfile::TempPath>,
}

impl Gateway {
    /// `fleet-limiter serve --upstream URL` on the default calibration.
    pub fn serve() -> Launch {
        Launch::serve()
    }

    fn wait_ready(&mut self) -> Result<(), String> {
        for _ in 0..READY_TRIES {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!(
                    "exited with {status} before listening; stderr:\n{}",
                    self.stderr.text()
                ));
            }
            if TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)).is_ok() {
                return Ok(());
            }
            std::thread::sleep(READY_PAUSE);
        }
        Err(format!(
            "not listening on {} after {READY_TRIES} tries; stderr:\n{}",
            self.addr,
            self.stderr.text()
        ))
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `http://127.0.0.1:<port><path>`
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub fn stderr(&self) -> String {
        self.stderr.text()
    }

    pub fn stdout(&self) -> String {
        self.stdout.text()
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Resident memory of the process in KiB (Linux `/proc/PID/status` `VmRSS`).
    pub fn rss_kib(&self) -> u64 {
        rss_kib(self.pid())
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
    }
}

/// `VmRSS` of a process in KiB.
pub fn rss_kib(pid: u32) -> u64 {
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read /proc/PID/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/PID/status")
}

/// A `wiremock` upstream that answers `200 ok` to everything and records every request.
pub async fn upstream() -> wiremock::MockServer {
    let server = wiremock::MockServer::start().await;
    wiremock::Mock::given(wiremock::matchers::any())
        .respond_with(wiremock::ResponseTemplate::new(200).set_body_string("ok"))
        .mount(&server)
        .await;
    server
}

/// How many requests the upstream has received so far.
pub async fn received(upstream: &wiremock::MockServer) -> usize {
    upstream
        .received_requests()
        .await
        .map(|r| r.len())
        .unwrap_or(0)
}

/// An HTTP client that ignores proxy settings from the environment and never waits forever.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("reqwest client")
}

/// A response read by [`raw_request`].
#[derive(Debug)]
pub struct RawResponse {
    pub status: u16,
    /// Header names lower-cased, in order.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl RawResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Send raw bytes (one HTTP/1.1 request; add `Connection: close`) and read the whole response.
/// For requests a well-behaved client will not build: non-UTF-8 header bytes, bad framing.
pub fn raw_request(addr: SocketAddr, request: &[u8]) -> RawResponse {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    s.write_all(request).expect("write request");
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    parse_raw(&buf)
}

fn parse_raw(buf: &[u8]) -> RawResponse {
    let end = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| {
            panic!(
                "no complete response head in {:?}",
                String::from_utf8_lossy(buf)
            )
        });
    let head = String::from_utf8_lossy(&buf[..end]);
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    RawResponse {
        status,
        headers,
        body: buf[end + 4..].to_vec(),
    }
}

/// The workspace root (for paths to fixtures and snapshots).
pub fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Parse `RateLimit: "name";r=N;t=S, ...` into `(name, r, t)` triples.
pub fn parse_ratelimit(value: &str) -> Vec<(String, u64, u64)> {
    value
        .split(',')
        .filter_map(|item| {
            let mut parts = item.trim().split(';');
            let name = parts.next()?.trim().trim_matches('"').to_owned();
            let mut r = None;
            let mut t = None;
            for p in parts {
                match p.trim().split_once('=') {
                    Some(("r", v)) => r = v.parse().ok(),
                    Some(("t", v)) => t = v.parse().ok(),
                    _ => {}
                }
            }
            Some((name, r?, t?))
        })
        .collect()
}

/// Parse `RateLimit-Policy: "name";q=N;w=S, ...` into `(name, q, w)` triples.
pub fn parse_policy(value: &str) -> Vec<(String, u64, u64)> {
    value
        .split(',')
        .filter_map(|item| {
            let mut parts = item.trim().split(';');
            let name = parts.next()?.trim().trim_matches('"').to_owned();
            let mut q = None;
            let mut w = None;
            for p in parts {
                match p.trim().split_once('=') {
                    Some(("q", v)) => q = v.parse().ok(),
                    Some(("w", v)) => w = v.parse().ok(),
                    _ => {}
                }
            }
            Some((name, q?, w?))
        })
        .collect()
}
