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
    /// Further arguments of every start (a replica's `--replicaof`).
    extra: Vec<String>,
}

impl RedisServer {
    fn spawn(port: u16, cluster: bool, dir: tempfile::TempDir) -> RedisServer {
        Self::spawn_with(port, cluster, dir, Vec::new())
    }

    fn spawn_with(
        port: u16,
        cluster: bool,
        dir: tempfile::TempDir,
        extra: Vec<String>,
    ) -> RedisServer {
        let mut s = RedisServer {
            port,
            dir,
            child: None,
            cluster,
            extra,
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
            .args(&self.extra)
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

/// `redis-cli -p <port> <args...>`: its output, trimmed (errors included, as redis-cli prints
/// them).
pub fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .expect("run redis-cli");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
    .trim()
    .to_owned()
}

/// A replica of `primary` on a free port, once its link to the primary is up.
pub fn replica_of(primary: &RedisServer) -> RedisServer {
    replica_with_password(primary, None)
}

/// A replica of `primary`, both behind `password` when one is given (`requirepass` and
/// `masterauth`).
pub fn replica_with_password(primary: &RedisServer, password: Option<&str>) -> RedisServer {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut extra = vec![
        "--replicaof".to_owned(),
        "127.0.0.1".to_owned(),
        primary.port.to_string(),
    ];
    let mut auth = Vec::new();
    if let Some(pw) = password {
        for flag in ["--requirepass", "--masterauth"] {
            extra.extend([flag.to_owned(), pw.to_owned()]);
        }
        auth = vec!["--no-auth-warning", "-a", pw];
    }
    let replica = RedisServer::spawn_with(free_cluster_port(), false, dir, extra);
    wait_for(
        || {
            let mut args = auth.clone();
            args.extend(["INFO", "replication"]);
            cli(replica.port, &args).contains("master_link_status:up")
        },
        "the replica's link to its primary",
    );
    replica
}

/// Poll `done` every 50 ms; panic naming `what` after a minute.
pub fn wait_for(mut done: impl FnMut() -> bool, what: &str) {
    let deadline = Instant::now() + crate::common::PATIENCE;
    while !done() {
        assert!(Instant::now() < deadline, "waited too long for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Redis Sentinel (`redis-server <conf> --sentinel`) on a free port, watching `master` at
/// `primary_port` with this quorum; killed on drop.
pub struct Sentinel {
    pub port: u16,
    _dir: tempfile::TempDir,
    child: Child,
}

impl Sentinel {
    pub fn start(master: &str, primary_port: u16, quorum: u32) -> Sentinel {
        Self::start_with(master, primary_port, quorum, "")
    }

    /// [`Sentinel::start`] with more lines in its configuration file.
    pub fn start_with(master: &str, primary_port: u16, quorum: u32, more: &str) -> Sentinel {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = free_cluster_port();
        let conf = dir.path().join("sentinel.conf");
        // Quick to notice a dead primary and to retry a failover: tests wait on it.
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {dir}\n\
                 sentinel monitor {master} 127.0.0.1 {primary_port} {quorum}\n\
                 sentinel down-after-milliseconds {master} 1000\n\
                 sentinel failover-timeout {master} 4000\n\
                 sentinel parallel-syncs {master} 1\n{more}\n",
                dir = dir.path().display()
            ),
        )
        .expect("write sentinel.conf");
        let child = Command::new("redis-server")
            .arg(&conf)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server --sentinel");
        let s = Sentinel {
            port,
            _dir: dir,
            child,
        };
        // Listening is enough: a Sentinel with `requirepass` answers PING with NOAUTH.
        wait_for(
            || TcpStream::connect(("127.0.0.1", port)).is_ok(),
            "Sentinel to listen",
        );
        s
    }

    /// The primary this Sentinel names for `master`, as `host:port`.
    pub fn primary(&self, master: &str) -> String {
        let out = cli(self.port, &["SENTINEL", "get-master-addr-by-name", master]);
        out.lines().collect::<Vec<_>>().join(":")
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A TCP forwarder on a free loopback port, standing for a DNS name or a proxy in front of a
/// primary: each new connection goes to the port it is pointed at then; connections already
/// made keep their server. Stops on drop.
pub struct Forwarder {
    pub port: u16,
    to: std::sync::Arc<std::sync::atomic::AtomicU16>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Forwarder {
    pub fn to(port: u16) -> Forwarder {
        use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
        use std::sync::Arc;
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the forwarder");
        let own = listener.local_addr().expect("local addr").port();
        let to = Arc::new(AtomicU16::new(port));
        let stop = Arc::new(AtomicBool::new(false));
        let (target, stopped) = (to.clone(), stop.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if stopped.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(("127.0.0.1", target.load(Ordering::Relaxed)))
                else {
                    continue;
                };
                let pipe = |mut from: TcpStream, mut to: TcpStream| {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                };
                let (c2, s2) = match (client.try_clone(), server.try_clone()) {
                    (Ok(c), Ok(s)) => (c, s),
                    _ => continue,
                };
                pipe(client, server);
                pipe(s2, c2);
            }
        });
        Forwarder {
            port: own,
            to,
            stop,
        }
    }

    /// New connections go to `port` from now on.
    pub fn point_at(&self, port: u16) {
        self.to.store(port, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// Whether something answers PING on the port (or asks for a password).
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
    // A server behind a password is up too: it answers NOAUTH.
    matches!(s.read(&mut buf), Ok(n) if buf[..n].starts_with(b"+PONG") || buf[..n].starts_with(b"-NOAUTH"))
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

/// Our own standalone server started with these further arguments; `None` when skipped.
pub fn own_server_with(extra: &[&str]) -> Option<RedisServer> {
    if !has_redis_server() {
        unavailable("redis-server is not on PATH");
        return None;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let extra = extra.iter().map(|a| a.to_string()).collect();
    Some(RedisServer::spawn_with(
        free_cluster_port(),
        false,
        dir,
        extra,
    ))
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
