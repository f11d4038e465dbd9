//! The one end-to-end harness: runs the real `fleet-limiter` binary on a free loopback port
//! (and, when asked, its admin listener on another), waits until it accepts connections, and
//! kills it when dropped. Its stdout and stderr go to files in a temporary directory, next to
//! the configuration file. Also a `wiremock` upstream, proxy-free HTTP clients, a raw-bytes
//! HTTP/1.1 client for requests `reqwest` refuses to build, `/metrics` readers and header
//! parsers.
//!
//! ```ignore
//! mod common;
//! let upstream = common::upstream().await;
//! let gw = common::Gateway::serve().upstream(&upstream.uri()).arg("--trust-proxy").arg("127.0.0.1/32").spawn();
//! let res = common::client().get(gw.url("/api/agent/heartbeat")).send().await?;
//! // The admin listener, a configuration file, logs at info level and signals:
//! let gw = common::Launch::serve().config_toml(toml).admin().log("info").spawn();
//! gw.rewrite_config(other_toml);
//! gw.signal("HUP");
//! ```
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_fleet-limiter");

/// How long start-up, a reload or an exit may take before a test gives up (a deadline for
/// waiting, never a timing assertion).
pub const PATIENCE: Duration = Duration::from_secs(60);
/// The pause between two polls of something a test waits for.
const POLL: Duration = Duration::from_millis(50);
/// How many times a start-up is retried on fresh ports when a chosen one was taken meanwhile.
const PORT_RETRIES: u32 = 5;

/// A test that cannot run here: skip it, printing why, or fail it when `CI` is set (CI has
/// everything a test needs, so a missing piece there is a broken machine, not a skip).
pub fn unavailable(why: &str) {
    assert!(
        std::env::var_os("CI").is_none(),
        "required when CI is set: {why}"
    );
    eprintln!("skipping: {why}");
}

/// A program on `PATH`, or `None` after [`unavailable`] said how to install it.
pub fn tool(name: &str, install: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        unavailable(&format!("`{name}` is not on PATH; install it: {install}"));
    }
    found
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("cannot find a free port: {e}"))
}

fn free_addr() -> SocketAddr {
    ([127, 0, 0, 1], free_port()).into()
}

/// A loopback address where nothing listens (for "upstream down").
pub fn dead_addr() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let a = l.local_addr().expect("local addr");
    drop(l);
    a
}

/// How a run of the binary ended.
#[derive(Debug)]
pub struct Exited {
    /// The exit code (`None` when killed by a signal).
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// What to run: arguments, environment, an optional config file, an optional admin listener.
#[derive(Clone, Debug, Default)]
pub struct Launch {
    args: Vec<String>,
    env: Vec<(String, String)>,
    config: Option<String>,
    /// `serve` mode: add `--listen 127.0.0.1:<free port>` and wait for the port.
    serve: bool,
    upstream: Option<String>,
    keep_env: bool,
    /// Defaults removed (variables given with `env` are still set).
    unset: Vec<String>,
    current_dir: Option<PathBuf>,
    /// Add `--admin-listen 127.0.0.1:<free port>` and wait until its `/healthz` answers 200.
    admin: bool,
    /// Where stdout and stderr go: files (the default) or pipes.
    output: Output,
    /// Add `--decision-listen 127.0.0.1:<free port>` and wait for that port too; with
    /// `Some(true)`, that is the only traffic listener (no `--listen`, no upstream).
    decision: Option<bool>,
    /// Start the process with this open-file-descriptor limit, `(soft, hard)` (through
    /// `prlimit`, which then runs the binary in its own place: same process id).
    nofile: Option<(u64, u64)>,
    /// `--listen` on this address instead of a free port (a second process beside a first).
    listen_at: Option<SocketAddr>,
    /// `serve` as written, with no `--listen` added: wait for this address instead (a listener
    /// the arguments name, e.g. `--rls-listen`).
    wait_on: Option<SocketAddr>,
}

/// Where the process's stdout and stderr go.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Output {
    /// Files in the run's temporary directory ([`Gateway::stderr`] reads them).
    #[default]
    Files,
    /// Pipes the test holds until [`Gateway::close_output`] closes their read ends.
    Pipes,
    /// Pipes whose read ends are closed as soon as the process is started: every write to
    /// stdout or stderr fails (EPIPE), as behind `| head -c 1` once `head` has exited.
    Closed,
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

    /// `fleet-limiter serve` with no `--listen` added (a gateway with no upstream binds none):
    /// [`Launch::spawn`] waits until `addr`, a listener the arguments name (`--rls-listen`,
    /// `--decision-listen`), accepts connections.
    pub fn serve_waiting_on(addr: SocketAddr) -> Self {
        Self {
            args: vec!["serve".into()],
            serve: true,
            wait_on: Some(addr),
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

    pub fn envs<K: Into<String>, V: Into<String>>(
        mut self,
        vars: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        self.env
            .extend(vars.into_iter().map(|(k, v)| (k.into(), v.into())));
        self
    }

    /// Run without this variable although the harness sets it by default (e.g.
    /// `FLEET_LIMITER_ALLOW_UNSAFE_CALIBRATION`, to see the start-up calibration check refuse);
    /// [`Launch::env`] still sets it.
    pub fn unset(mut self, k: impl Into<String>) -> Self {
        self.unset.push(k.into());
        self
    }

    /// `FLEET_LIMITER_LOG` (the harness default is `warn`).
    pub fn log(self, level: &str) -> Self {
        self.env("FLEET_LIMITER_LOG", level)
    }

    /// Write this TOML to a file in the run's temporary directory and pass `--config <file>`.
    pub fn config_toml(mut self, toml: impl Into<String>) -> Self {
        self.config = Some(toml.into());
        self
    }

    /// Also serve the forward-auth decision endpoint ([`Gateway::decision_addr`] is its address).
    pub fn decision(mut self) -> Self {
        self.decision = Some(false);
        self
    }

    /// Serve only the decision endpoint: no traffic listener and no upstream.
    pub fn decision_only(mut self) -> Self {
        self.decision = Some(true);
        self
    }

    /// Run the admin listener on its own free port (`--admin-listen`) and wait for its
    /// `/healthz`; without this it takes any free port (`127.0.0.1:0`) and nobody asks it.
    pub fn admin(mut self) -> Self {
        self.admin = true;
        self
    }

    /// Send stdout and stderr into pipes that the test holds open until
    /// [`Gateway::close_output`] closes them (a log reader that goes away while the gateway runs).
    pub fn piped_output(mut self) -> Self {
        self.output = Output::Pipes;
        self
    }

    /// Send stdout and stderr into pipes whose readers are gone from the start.
    pub fn closed_output(mut self) -> Self {
        self.output = Output::Closed;
        self
    }

    /// Start with the open-file-descriptor limit `soft` (and `hard`), as a stock machine's
    /// 1024 would be; needs [`prlimit`].
    /// Listen on `addr` (already taken by another process with `server.reuse_port`) instead
    /// of a free port.
    pub fn listen_at(mut self, addr: SocketAddr) -> Self {
        self.listen_at = Some(addr);
        self
    }

    pub fn nofile(mut self, soft: u64, hard: u64) -> Self {
        self.nofile = Some((soft, hard));
        self
    }

    /// Run in this directory (relative paths in arguments are resolved from it).
    pub fn current_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.current_dir = Some(dir.into());
        self
    }

    /// Keep `FLEET_LIMITER_*` variables of the test process (they are removed by default so a
    /// developer's shell cannot change what a test sees).
    pub fn keep_env(mut self) -> Self {
        self.keep_env = true;
        self
    }

    /// The command, with its stdout and stderr going to files in `dir`.
    fn command_for(
        &self,
        dir: &Path,
        listen: Option<SocketAddr>,
        admin: Option<SocketAddr>,
        decision: Option<SocketAddr>,
    ) -> (Command, Option<PathBuf>) {
        let mut cmd = match self.nofile {
            Some((soft, hard)) => {
                let mut c = Command::new("prlimit");
                c.arg(format!("--nofile={soft}:{hard}")).arg("--").arg(BIN);
                c
            }
            None => Command::new(BIN),
        };
        cmd.args(&self.args);
        if let Some(d) = &self.current_dir {
            cmd.current_dir(d);
        }
        if let Some(addr) = listen {
            cmd.arg("--listen").arg(addr.to_string());
        }
        if let Some(addr) = decision {
            cmd.arg("--decision-listen").arg(addr.to_string());
        }
        if let Some(addr) = admin {
            cmd.arg("--admin-listen").arg(addr.to_string());
        }
        if let Some(u) = &self.upstream {
            cmd.arg("--upstream").arg(u);
        }
        let config = self.config.as_ref().map(|text| {
            let path = dir.join("fleet-limiter.toml");
            std::fs::write(&path, text).expect("write config");
            cmd.arg("--config").arg(&path);
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
        // No load balancer watches these gateways: SIGTERM closes their listeners at once.
        // The drain delay has its own tests in tests/readiness.rs.
        cmd.env("FLEET_LIMITER_DRAIN_DELAY", "0s");
        // Most suites tell which limiters metered a request by the names in `RateLimit-Policy`
        // and `RateLimit`, which only the named items of draft 8 and 10 carry; the tests of the
        // header profiles themselves (tests/limit_headers.rs, tests/header_clients.rs) unset it.
        cmd.env("FLEET_LIMITER_HEADERS_STANDARD", "draft-10");
        for k in &self.unset {
            cmd.env_remove(k);
        }
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd.stdin(Stdio::null());
        if self.output == Output::Files {
            let out = std::fs::File::create(dir.join("stdout.log")).expect("stdout file");
            let err = std::fs::File::create(dir.join("stderr.log")).expect("stderr file");
            cmd.stdout(out).stderr(err);
        } else {
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        }
        (cmd, config)
    }

    /// Start the `serve` once on free addresses, without waiting for it.
    fn start_once(&self) -> Gateway {
        let dir = temp_dir();
        let addr = self.listen_at.unwrap_or_else(free_addr);
        let admin = self.admin.then(free_addr);
        let decision = self.decision.map(|_| free_addr());
        let listen = (self.decision != Some(true) && self.wait_on.is_none()).then_some(addr);
        let (mut cmd, config) = self.command_for(dir.path(), listen, admin, decision);
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {BIN}: {e}"));
        Gateway {
            child,
            addr: self.wait_on.or(listen).or(decision).unwrap_or(addr),
            decision_addr: decision,
            admin_addr: admin,
            config,
            dir,
        }
    }

    /// Start a `serve` and wait until it accepts connections (and its admin listener answers,
    /// with [`Launch::admin`]). Panics (with the binary's stderr) when it exits or never
    /// listens.
    pub fn spawn(self) -> Gateway {
        assert!(
            self.serve,
            "spawn() is for `serve`; use run() for commands that exit"
        );
        let mut last_err = String::new();
        for _ in 0..PORT_RETRIES {
            let mut gw = self.start_once();
            if self.output == Output::Closed {
                gw.close_output();
            }
            match gw.wait_ready() {
                Ok(()) => return gw,
                Err(e) => {
                    let port_taken = gw.stderr().contains("cannot listen");
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

    /// Start a `serve` that may serve or may refuse to start: the running gateway once it
    /// listens, or how it exited before it did (one attempt, no retry on a taken port).
    /// Panics when it neither listens nor exits within [`PATIENCE`].
    pub fn try_spawn(self) -> Result<Gateway, Exited> {
        assert!(self.serve, "try_spawn() is for `serve`");
        let mut gw = self.start_once();
        match gw.wait_ready() {
            Ok(()) => Ok(gw),
            Err(e) => match gw.child.try_wait() {
                Ok(Some(status)) => Err(Exited {
                    code: status.code(),
                    stdout: gw.stdout(),
                    stderr: gw.stderr(),
                }),
                _ => panic!("the gateway neither started nor exited: {e}"),
            },
        }
    }

    /// Run a command that is expected to exit (e.g. a start-up failure), within `limit`.
    /// Panics if it is still running then.
    pub fn run(self, limit: Duration) -> Exited {
        let dir = temp_dir();
        let listen = (self.serve && self.wait_on.is_none())
            .then(|| self.listen_at.unwrap_or_else(free_addr));
        let (mut cmd, _config) = self.command_for(dir.path(), listen, None, None);
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {BIN}: {e}"));
        // Piped output is never read here: close it, as `closed_output` asks.
        drop(child.stdout.take());
        drop(child.stderr.take());
        let read = |name: &str| read_lossy(&dir.path().join(name));
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Some(s) = child.try_wait().expect("try_wait") {
                break s;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "{BIN} {:?} still running after {limit:?}; stderr:\n{}",
                    self.args,
                    read("stderr.log")
                );
            }
            std::thread::sleep(POLL);
        };
        Exited {
            code: status.code(),
            stdout: read("stdout.log"),
            stderr: read("stderr.log"),
        }
    }
}

/// Whether `prlimit` (util-linux) can start a process with the given limits. Without it a test
/// that needs it is skipped with the reason printed, and fails when `CI` is set.
pub fn prlimit() -> bool {
    let works = Command::new("prlimit")
        .args(["--nofile=64:64", "--", "true"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !works {
        unavailable("prlimit (util-linux) cannot set a descriptor limit here");
    }
    works
}

/// What the process wrote to an output file so far (invalid UTF-8 replaced).
fn read_lossy(path: &Path) -> String {
    String::from_utf8_lossy(&std::fs::read(path).unwrap_or_default()).into_owned()
}

fn temp_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("fleet-limiter-test-")
        .tempdir()
        .expect("temp dir")
}

/// Whether `GET path` on `addr` answers `200` (a plain HTTP/1.1 exchange, no client needed).
fn answers_ok(addr: SocketAddr, path: &str) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    if s.write_all(req.as_bytes()).is_err() {
        return false;
    }
    let mut head = [0u8; 12];
    s.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.1 200")
}

/// A running `fleet-limiter serve`, killed on drop.
pub struct Gateway {
    child: Child,
    /// The traffic listener (the decision listener when it is the only one).
    pub addr: SocketAddr,
    /// The decision listener, with [`Launch::decision`] or [`Launch::decision_only`].
    pub decision_addr: Option<SocketAddr>,
    admin_addr: Option<SocketAddr>,
    config: Option<PathBuf>,
    /// Holds the configuration file and the output files.
    dir: tempfile::TempDir,
}

impl Gateway {
    /// `fleet-limiter serve --upstream URL` on the default calibration.
    pub fn serve() -> Launch {
        Launch::serve()
    }

    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!(
                    "exited with {status} before listening; stderr:\n{}",
                    self.stderr()
                ));
            }
            let up =
                |a: &SocketAddr| TcpStream::connect_timeout(a, Duration::from_millis(200)).is_ok();
            let traffic = up(&self.addr) && self.decision_addr.is_none_or(|a| up(&a));
            if traffic && self.admin_addr.is_none_or(|a| answers_ok(a, "/healthz")) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "not listening on {} (admin {:?}) after {PATIENCE:?}; stderr:\n{}",
                    self.addr,
                    self.admin_addr,
                    self.stderr()
                ));
            }
            std::thread::sleep(POLL);
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `http://127.0.0.1:<port><path>`
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// `http://127.0.0.1:<admin port><path>` (needs [`Launch::admin`]).
    pub fn admin(&self, path: &str) -> String {
        let addr = self
            .admin_addr
            .expect("the admin listener's address: start with Launch::admin()");
        format!("http://{addr}{path}")
    }

    /// Close the read ends of the pipes stdout and stderr go to (with
    /// [`Launch::piped_output`]): from now on every write to either fails with EPIPE.
    pub fn close_output(&mut self) {
        drop(self.child.stdout.take());
        drop(self.child.stderr.take());
    }

    /// Everything the process wrote to stderr so far (its log; empty when it goes to a pipe).
    pub fn stderr(&self) -> String {
        read_lossy(&self.stderr_path())
    }

    pub fn stdout(&self) -> String {
        read_lossy(&self.dir.path().join("stdout.log"))
    }

    /// The file the process's stderr (its log) goes to.
    pub fn stderr_path(&self) -> PathBuf {
        self.dir.path().join("stderr.log")
    }

    /// The log lines that parse as JSON objects (with `--log-format json`).
    pub fn json_logs(&self) -> Vec<serde_json::Value> {
        self.stderr()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .collect()
    }

    /// Replace the configuration file (for a reload; needs [`Launch::config_toml`]).
    pub fn rewrite_config(&self, toml: &str) {
        let path = self.config.as_ref().expect("started with config_toml()");
        std::fs::write(path, toml).expect("rewrite config");
    }

    /// Send a signal by name (`HUP`, `TERM`, `INT`) with `kill`.
    pub fn signal(&self, name: &str) {
        let ok = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.pid().to_string())
            .status()
            .expect("run kill")
            .success();
        assert!(ok, "kill -{name} failed");
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Wait for the process to exit by itself (after a signal) and return how it ended.
    pub async fn wait_exit(&mut self) -> ExitStatus {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "fleet-limiter did not exit; its log:\n{}",
                self.stderr()
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// Resident memory of the process in KiB (Linux `/proc/PID/status` `VmRSS`).
    pub fn rss_kib(&self) -> u64 {
        rss_kib(self.pid())
    }

    /// The value of one sample line of the admin listener's `/metrics`, e.g.
    /// `fleet_limiter_decisions_total{limiter="a",outcome="allowed"}`.
    pub async fn metric(&self, sample: &str) -> Option<f64> {
        let text = client()
            .get(self.admin("/metrics"))
            .send()
            .await
            .expect("GET /metrics")
            .text()
            .await
            .expect("metrics body");
        sample_value(&text, sample)
    }

    /// Poll a metric until `pred` holds (a reload or a signal is handled asynchronously).
    pub async fn wait_metric(&self, sample: &str, pred: impl Fn(f64) -> bool) -> f64 {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let v = self.metric(sample).await.unwrap_or(f64::NAN);
            if pred(v) {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "{sample} stayed at {v}; log:\n{}",
                self.stderr()
            );
            tokio::time::sleep(POLL).await;
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The value of the sample named exactly `sample` in a Prometheus text page.
pub fn sample_value(text: &str, sample: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| {
            l.strip_prefix(sample)
                .and_then(|rest| rest.strip_prefix(' '))
        })
        .and_then(|v| v.trim().parse().ok())
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

/// A client that never pools connections (each request is its own connection, so a gateway
/// that stops accepting is seen as such).
pub fn unpooled_client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .timeout(PATIENCE)
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

/// A whole response read off the wire (its head and whatever came after it).
pub fn parse_raw(buf: &[u8]) -> RawResponse {
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
    parse_items(value, "r", "t")
}

/// Parse `RateLimit-Policy: "name";q=N;w=S, ...` into `(name, q, w)` triples.
pub fn parse_policy(value: &str) -> Vec<(String, u64, u64)> {
    parse_items(value, "q", "w")
}

/// Parse a list of `"name";<first>=N;<second>=M` items into `(name, N, M)` triples; an item
/// without both parameters is left out.
fn parse_items(value: &str, first: &str, second: &str) -> Vec<(String, u64, u64)> {
    value
        .split(',')
        .filter_map(|item| {
            let mut parts = item.trim().split(';');
            let name = parts.next()?.trim().trim_matches('"').to_owned();
            let mut a = None;
            let mut b = None;
            for p in parts {
                match p.trim().split_once('=') {
                    Some((k, v)) if k == first => a = v.parse().ok(),
                    Some((k, v)) if k == second => b = v.parse().ok(),
                    _ => {}
                }
            }
            Some((name, a?, b?))
        })
        .collect()
}

/// A headless Chromium on `PATH` (Debian's `chromium`; `.ci/run` installs it), or `None`.
#[allow(dead_code)]
pub fn chromium() -> Option<&'static str> {
    ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|b| {
            std::process::Command::new(b)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
}

/// The flags every browser test starts Chromium with: headless, in a container, and quiet.
#[allow(dead_code)]
pub const CHROMIUM_FLAGS: [&str; 8] = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
];
