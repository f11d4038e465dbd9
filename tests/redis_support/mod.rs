//! Real redis-server processes and real gateway processes for the Redis store's tests.
//!
//! A test that needs Redis calls [`standalone`] or [`cluster`]: they start `redis-server` on free
//! ports when it is on `PATH` (a plain Redis may also come from `REDIS_URL`). When neither is
//! available the test is skipped, unless `CI` is set: then it fails.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Skip the test, or fail it when `CI` is set.
pub fn unavailable(why: &str) {
    if std::env::var_os("CI").is_some() {
        panic!("Redis is required when CI is set: {why}");
    }
    eprintln!("skipped: {why}");
}

fn has_redis_server() -> bool {
    Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// A free port whose cluster-bus companion (port + 10000) is free too.
pub fn free_port() -> u16 {
    for _ in 0..200 {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
        let port = l.local_addr().expect("local addr").port();
        if port > 55_000 {
            continue;
        }
        if TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
    panic!("no free port pair found");
}

/// A `redis-server` process on 127.0.0.1, killed on drop.
pub struct RedisServer {
    pub port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
    cluster: bool,
}

impl RedisServer {
    fn spawn(port: u16, cluster: bool, dir: tempfile::TempDir) -> RedisServer {
        let mut s = RedisServer {
            port,
            dir,
            child: None,
            cluster,
        };
        s.start();
        s
    }

    /// Start (again) on the same port.
    pub fn start(&mut self) {
        assert!(self.child.is_none(), "already running");
        let mut cmd = Command::new("redis-server");
        cmd.args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if self.cluster {
            cmd.args([
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
            ])
            .args(["--cluster-node-timeout", "5000"]);
        }
        self.child = Some(cmd.spawn().expect("spawn redis-server"));
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if ping(self.port) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("redis-server on port {} did not answer PING", self.port);
    }

    /// Kill the process and wait until it is gone.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Freeze the process (SIGSTOP): connections stay open, nothing answers.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Let a paused process run again (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().expect("running").id().to_string();
        let ok = Command::new("kill")
            .args([sig, &pid])
            .status()
            .map(|s| s.success());
        assert!(matches!(ok, Ok(true)), "kill {sig} {pid}");
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Whether something answers PING on the port.
pub fn ping(port: u16) -> bool {
    let Ok(mut s) =
        TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(200))
    else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    if s.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 16];
    matches!(s.read(&mut buf), Ok(n) if buf[..n].starts_with(b"+PONG"))
}

/// A Redis to talk to: our own server, or `REDIS_URL`.
pub enum Standalone {
    Own(RedisServer),
    Given(String),
}

impl Standalone {
    pub fn url(&self) -> String {
        match self {
            Standalone::Own(s) => s.url(),
            Standalone::Given(u) => u.clone(),
        }
    }
}

/// A standalone Redis; `None` when the test must be skipped.
pub fn standalone() -> Option<Standalone> {
    if has_redis_server() {
        return Some(Standalone::Own(own_server()?));
    }
    if let Ok(url) = std::env::var("REDIS_URL") {
        return Some(Standalone::Given(url));
    }
    unavailable("redis-server is not on PATH and REDIS_URL is not set");
    None
}

/// Our own standalone server (the test stops and restarts it); `None` when skipped.
pub fn own_server() -> Option<RedisServer> {
    if !has_redis_server() {
        unavailable("redis-server is not on PATH");
        return None;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    Some(RedisServer::spawn(free_port(), false, dir))
}

/// A three-master Redis Cluster on free ports, no replicas; `None` when skipped.
pub struct Cluster {
    pub nodes: Vec<RedisServer>,
}

impl Cluster {
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }
}

pub fn cluster() -> Option<Cluster> {
    if !has_redis_server() {
        unavailable("redis-server is not on PATH (needed for a Redis Cluster)");
        return None;
    }
    let nodes: Vec<RedisServer> = (0..3)
        .map(|_| RedisServer::spawn(free_port(), true, tempfile::tempdir().expect("tempdir")))
        .collect();
    let addrs: Vec<String> = nodes.iter().map(RedisServer::addr).collect();
    let out = Command::new("redis-cli")
        .arg("--cluster")
        .arg("create")
        .args(&addrs)
        .args(["--cluster-replicas", "0", "--cluster-yes"])
        .output()
        .expect("run redis-cli --cluster create");
    assert!(
        out.status.success(),
        "redis-cli --cluster create failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let cluster = Cluster { nodes };
    cluster.wait_ok();
    Some(cluster)
}

impl Cluster {
    /// Wait until every node reports `cluster_state:ok`.
    pub fn wait_ok(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        'wait: while Instant::now() < deadline {
            for n in &self.nodes {
                let info = Command::new("redis-cli")
                    .args(["-p", &n.port.to_string(), "cluster", "info"])
                    .output()
                    .expect("redis-cli cluster info");
                if !String::from_utf8_lossy(&info.stdout).contains("cluster_state:ok") {
                    std::thread::sleep(Duration::from_millis(100));
                    continue 'wait;
                }
            }
            return;
        }
        panic!("the Redis Cluster never reached cluster_state:ok");
    }
}

/// A tiny upstream API on its own thread: 200 "ok" to everything.
pub fn upstream() -> u16 {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        actix_web::rt::System::new().block_on(async move {
            let server = actix_web::HttpServer::new(|| {
                actix_web::App::new().default_service(actix_web::web::to(|| async { "ok" }))
            })
            .workers(1)
            .bind(("127.0.0.1", 0))
            .expect("bind upstream");
            let port = server.addrs()[0].port();
            let _ = tx.send(port);
            let _ = server.run().await;
        });
    });
    rx.recv_timeout(Duration::from_secs(10))
        .expect("upstream started")
}

/// A gateway process (the real binary), killed on drop.
pub struct Gateway {
    pub port: u16,
    child: Child,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Gateway {
    /// Start `fleet-limiter serve` with this TOML configuration in front of `upstream_port`.
    pub fn spawn(config: &str, upstream_port: u16) -> Gateway {
        Self::spawn_with(config, upstream_port, &[], &[])
    }

    /// The same, with extra command-line flags and environment variables.
    pub fn spawn_with(
        config: &str,
        upstream_port: u16,
        args: &[&str],
        envs: &[(&str, &str)],
    ) -> Gateway {
        let dir = tempfile::tempdir().expect("tempdir");
        let cfg = dir.path().join("fleet-limiter.toml");
        std::fs::write(&cfg, config).expect("write config");
        let log = dir.path().join("gateway.log");
        let port = free_port();
        let child = Command::new(env!("CARGO_BIN_EXE_fleet-limiter"))
            .arg("serve")
            .arg("--config")
            .arg(&cfg)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--upstream", &format!("http://127.0.0.1:{upstream_port}")])
            .args(args)
            .env("FLEET_LIMITER_LOG", "info")
            // These tests pin tiny budgets that the start-up calibration check refuses;
            // that check has its own tests in tests/calibration.rs.
            .env("FLEET_LIMITER_ALLOW_UNSAFE_CALIBRATION", "true")
            // Many gateways run at once: each admin listener takes a free port.
            .env("FLEET_LIMITER_ADMIN_LISTEN", "127.0.0.1:0")
            .env_remove("FLEET_LIMITER_CONFIG")
            .envs(envs.iter().copied())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("spawn the gateway");
        let mut g = Gateway {
            port,
            child,
            log,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = g.child.try_wait() {
                panic!("the gateway exited ({status}): {}", g.log_text());
            }
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return g;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        let _ = g.child.kill();
        panic!("the gateway never listened: {}", g.log_text());
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
