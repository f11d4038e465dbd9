//! Real redis-server processes for the Redis store's tests, and a small upstream for the gateway
//! processes (which run through `tests/common`).
//!
//! A test that needs Redis calls [`standalone`] or [`cluster`]: they start `redis-server` on free
//! ports when it is on `PATH` (a plain Redis may also come from `REDIS_URL`). When neither is
//! available the test is skipped, unless `CI` is set: then it fails.

#![allow(dead_code)]

use crate::common::{Gateway, Launch};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Skip the test, or fail it when `CI` is set.
pub fn unavailable(why: &str) {
    super::common::unavailable(&format!("Redis: {why}"));
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
pub fn free_cluster_port() -> u16 {
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
    Some(RedisServer::spawn(free_cluster_port(), false, dir))
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
        .map(|_| {
            RedisServer::spawn(
                free_cluster_port(),
                true,
                tempfile::tempdir().expect("tempdir"),
            )
        })
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

/// A tiny upstream API on its own thread: 200 "ok" to everything. Returns its URL.
pub fn upstream() -> String {
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
    let port = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("upstream started");
    format!("http://127.0.0.1:{port}")
}

/// `fleet-limiter serve` with this TOML configuration in front of `upstream`, logging at info,
/// its admin listener on a free port, with extra command-line flags and environment variables.
pub fn gateway(config: &str, upstream: &str, args: &[&str], envs: &[(&str, &str)]) -> Gateway {
    Launch::serve()
        .config_toml(config)
        .upstream(upstream)
        .admin()
        .log("info")
        .args(args.iter().copied())
        .envs(envs.iter().copied())
        .spawn()
}
