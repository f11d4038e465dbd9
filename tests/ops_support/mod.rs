//! Runs the real `fleet-limiter` binary for the operations tests: a config file in a temporary
//! directory, free loopback ports for traffic and the admin listener, stderr captured for log
//! assertions, signals sent with `kill`, and the process killed when dropped.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_fleet-limiter");

/// How long start-up, a reload or an exit may take before a test gives up (a deadline for
/// waiting, never a timing assertion).
pub const PATIENCE: Duration = Duration::from_secs(30);

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("no free port: {e}"))
}

/// An HTTP client that never pools connections (each request is its own connection, so a
/// gateway that stops accepting is seen as such).
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .timeout(PATIENCE)
        .build()
        .expect("client")
}

pub struct Gateway {
    child: Option<Child>,
    pub port: u16,
    pub admin_port: u16,
    pub config: PathBuf,
    _dir: tempfile::TempDir,
    logs: Arc<Mutex<String>>,
}

impl Gateway {
    /// Start the binary with this TOML configuration (the upstream goes in the file) and extra
    /// arguments, and wait until both listeners answer.
    pub async fn start(toml: &str, extra: &[&str]) -> Gateway {
        Self::start_env(toml, extra, &[]).await
    }

    pub async fn start_env(toml: &str, extra: &[&str], env: &[(&str, &str)]) -> Gateway {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = dir.path().join("fleet-limiter.toml");
        std::fs::write(&config, toml).expect("write config");
        let port = free_port();
        let admin_port = free_port();
        let mut cmd = Command::new(BIN);
        cmd.arg("serve")
            .arg("--config")
            .arg(&config)
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--admin-listen")
            .arg(format!("127.0.0.1:{admin_port}"))
            .args(extra)
            .env("FLEET_LIMITER_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn fleet-limiter");
        let logs = Arc::new(Mutex::new(String::new()));
        if let Some(err) = child.stderr.take() {
            let sink = logs.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(err).lines().map_while(Result::ok) {
                    let mut s = sink.lock().unwrap_or_else(|p| p.into_inner());
                    s.push_str(&line);
                    s.push('\n');
                }
            });
        }
        let gw = Gateway {
            child: Some(child),
            port,
            admin_port,
            config,
            _dir: dir,
            logs,
        };
        gw.wait_ready().await;
        gw
    }

    async fn wait_ready(&self) {
        let c = client();
        let deadline = Instant::now() + PATIENCE;
        loop {
            let admin = c
                .get(self.admin("/healthz"))
                .send()
                .await
                .is_ok_and(|r| r.status() == 200);
            let traffic = std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok();
            if admin && traffic {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "fleet-limiter did not start; its log:\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    pub fn admin(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.admin_port)
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).expect("running")
    }

    /// Send a signal by name (`HUP`, `TERM`, `INT`).
    pub fn signal(&self, name: &str) {
        let ok = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.pid().to_string())
            .status()
            .expect("run kill")
            .success();
        assert!(ok, "kill -{name} failed");
    }

    /// Everything the process wrote to stderr so far.
    pub fn logs(&self) -> String {
        self.logs.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The log lines that parse as JSON objects (with `--log-format json`).
    pub fn json_logs(&self) -> Vec<serde_json::Value> {
        self.logs()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .collect()
    }

    /// Replace the configuration file (for a reload).
    pub fn rewrite_config(&self, toml: &str) {
        std::fs::write(&self.config, toml).expect("rewrite config");
    }

    /// Wait for the process to exit by itself and return how it ended.
    pub async fn wait_exit(&mut self) -> ExitStatus {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Some(status) = child.try_wait().expect("try_wait") {
                    self.child = None;
                    return status;
                }
            }
            assert!(
                Instant::now() < deadline,
                "fleet-limiter did not exit; its log:\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The value of one sample line of `/metrics`, e.g.
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
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
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

impl Drop for Gateway {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
