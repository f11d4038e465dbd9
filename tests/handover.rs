//! Restarts and upgrades that refuse no connection, against the real binary under a bounded
//! load loop (each request on a connection of its own):
//!
//! - `server.reuse_port`: a new process binds the same address beside a draining one;
//! - socket activation: a socket held by another process (systemd's `.socket` unit; here the
//!   real `systemd-socket-activate`, and `tests/support/socket_holder.py`, which keeps the
//!   socket across processes exactly as systemd does) is handed to each new process;
//! - hostile hand-overs (a file where the socket should be, a socket for another process,
//!   names it does not know) are refused or ignored, never served wrongly.

mod common;

use common::{free_port, manifest_dir, tool, unpooled_client, upstream, Launch, BIN, PATIENCE};
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a load loop saw.
#[derive(Debug, Default)]
struct Tally {
    ok: u64,
    server_errors: Vec<u16>,
    failures: Vec<String>,
}

/// `clients` loops, each sending one request after another, each on a new connection, until
/// stopped.
struct Load {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<Tally>>,
}

impl Load {
    fn start(url: String, clients: usize) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = (0..clients)
            .map(|_| {
                let (url, stop) = (url.clone(), stop.clone());
                tokio::spawn(async move {
                    let client = unpooled_client();
                    let mut t = Tally::default();
                    while !stop.load(Ordering::Relaxed) {
                        match client.get(&url).send().await {
                            Ok(r) if r.status().is_server_error() => {
                                t.server_errors.push(r.status().as_u16())
                            }
                            Ok(r) => match r.bytes().await {
                                Ok(_) => t.ok += 1,
                                Err(e) => t.failures.push(format!("body: {e}")),
                            },
                            Err(e) => t.failures.push(format!("{e:?}")),
                        }
                    }
                    t
                })
            })
            .collect();
        Self { stop, tasks }
    }

    async fn finish(self) -> Tally {
        self.stop.store(true, Ordering::Relaxed);
        let mut all = Tally::default();
        for task in self.tasks {
            let t = task.await.expect("load task");
            all.ok += t.ok;
            all.server_errors.extend(t.server_errors);
            all.failures.extend(t.failures);
        }
        all
    }
}

fn assert_nothing_lost(what: &str, t: &Tally) {
    assert!(t.ok > 50, "{what}: only {} requests went through", t.ok);
    assert!(
        t.failures.is_empty(),
        "{what}: {} of {} requests failed, e.g. {:?}",
        t.failures.len(),
        t.ok as usize + t.failures.len(),
        &t.failures[..t.failures.len().min(3)]
    );
    assert!(
        t.server_errors.is_empty(),
        "{what}: 5xx answers {:?}",
        t.server_errors
    );
}

/// `net.ipv4.tcp_migrate_req`: without it the kernel resets the connections queued on a
/// closing `SO_REUSEPORT` listener (`.ci/run` sets it).
fn migrates_requests() -> bool {
    let on = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_migrate_req")
        .is_ok_and(|v| v.trim() == "1");
    if !on {
        common::unavailable(
            "net.ipv4.tcp_migrate_req is not 1: sysctl -w net.ipv4.tcp_migrate_req=1",
        );
    }
    on
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_reuse_port_a_new_process_takes_over_and_no_connection_is_refused() {
    if !migrates_requests() {
        return;
    }
    let up = upstream().await;
    let launch = || {
        Launch::serve()
            .upstream(&up.uri())
            .admin()
            .env("FLEET_LIMITER_REUSE_PORT", "true")
            .env("FLEET_LIMITER_DRAIN_DELAY", "1s")
            .log("info")
    };
    let mut old = launch().spawn();
    let load = Load::start(old.url("/handover"), 4);
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Without SO_REUSEPORT the address stays taken: the control for what follows.
    let refused = Launch::serve()
        .upstream(&up.uri())
        .listen_at(old.addr)
        .run(PATIENCE);
    assert_eq!(refused.code, Some(2), "{}", refused.stderr);
    assert!(
        refused.stderr.contains("cannot listen"),
        "{}",
        refused.stderr
    );

    let new = launch().listen_at(old.addr).spawn();
    tokio::time::sleep(Duration::from_millis(300)).await;
    old.signal("TERM");
    let status = old.wait_exit().await;
    assert!(status.success(), "{status}: {}", old.stderr());
    tokio::time::sleep(Duration::from_millis(500)).await;
    let tally = load.finish().await;
    assert_nothing_lost("reuse_port hand-over", &tally);

    // The new process serves alone now, and served during the overlap too.
    for _ in 0..20 {
        let res = unpooled_client()
            .get(new.url("/handover"))
            .send()
            .await
            .expect("the new process answers");
        assert_eq!(res.status(), 200);
    }
    let served = new
        .metric(r#"fleet_limiter_requests_total{outcome="unmetered"}"#)
        .await
        .unwrap_or_default();
    assert!(served > 20.0, "the new process served {served}");
    assert!(new.stderr().contains("reuse_port=true"), "{}", new.stderr());
}

/// `tests/support/socket_holder.py`, driven line by line.
struct Holder {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    addr: SocketAddr,
}

impl Holder {
    fn start(upstream: &str) -> Option<Self> {
        tool("python3", "apt-get install python3")?;
        let mut child = Command::new("python3")
            .arg(manifest_dir().join("tests/support/socket_holder.py"))
            .args(["127.0.0.1", "traffic"])
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("FLEET_LIMITER_UPSTREAM", upstream)
            .env("FLEET_LIMITER_DRAIN_DELAY", "1s")
            .env("FLEET_LIMITER_LOG", "info")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 socket_holder.py");
        let stdin = child.stdin.take().expect("stdin");
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("listening line");
        let addr = line
            .trim()
            .strip_prefix("listening ")
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("socket_holder said {line:?}"));
        Some(Self {
            child,
            stdin,
            stdout,
            addr,
        })
    }

    fn ask(&mut self, line: &str) -> String {
        writeln!(self.stdin, "{line}").expect("write to the holder");
        let mut answer = String::new();
        self.stdout.read_line(&mut answer).expect("holder answer");
        answer.trim().to_owned()
    }

    /// A gateway on the held socket, its admin listener on `admin`; returns its pid once
    /// `/healthz` answers.
    fn serve(&mut self, admin: SocketAddr, err: &std::path::Path) -> u32 {
        let answer = self.ask(&format!(
            "start traffic {} {BIN} serve --admin-listen {admin}",
            err.display()
        ));
        let pid: u32 = answer
            .strip_prefix("pid ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("holder said {answer:?}"));
        let deadline = Instant::now() + PATIENCE;
        while !healthy(admin) {
            assert!(
                Instant::now() < deadline,
                "the gateway on the handed-over socket never answered; stderr:\n{}",
                std::fs::read_to_string(err).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        pid
    }

    fn stop(&mut self, pid: u32) -> i32 {
        self.ask(&format!("term {pid}"));
        let answer = self.ask(&format!("wait {pid}"));
        answer
            .rsplit(' ')
            .next()
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("holder said {answer:?}"))
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn healthy(admin: SocketAddr) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(&admin, Duration::from_millis(200)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    // The admin listener answers a Host that is its address (never a name it was not given).
    let _ = s.write_all(
        format!("GET /healthz HTTP/1.1\r\nHost: {admin}\r\nConnection: close\r\n\r\n").as_bytes(),
    );
    let mut first = String::new();
    let _ = BufReader::new(s).read_line(&mut first);
    first.contains(" 200 ")
}

fn admin_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], free_port()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_socket_handed_over_outlives_each_process_and_no_connection_is_refused() {
    let up = upstream().await;
    let Some(mut holder) = Holder::start(&up.uri()) else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("http://{}/handover", holder.addr);
    let first_err = dir.path().join("first.err");
    let first = holder.serve(admin_addr(), &first_err);
    let load = Load::start(url.clone(), 4);
    tokio::time::sleep(Duration::from_millis(300)).await;

    // A new process beside the draining one, on the same socket: an upgrade.
    let second_err = dir.path().join("second.err");
    let second = holder.serve(admin_addr(), &second_err);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(holder.stop(first), 0);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let tally = load.finish().await;
    assert_nothing_lost("socket activation hand-over", &tally);
    let log = std::fs::read_to_string(&first_err).expect("first log");
    assert!(
        log.contains("traffic listener: the socket on") && log.contains("handed over"),
        "{log}"
    );

    // A plain restart: while no process serves, a connection waits in the socket's queue and
    // is answered by the next process.
    assert_eq!(holder.stop(second), 0);
    let waiting = tokio::spawn({
        let url = url.clone();
        async move { unpooled_client().get(&url).send().await.map(|r| r.status()) }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiting.is_finished(), "answered with no process serving");
    let third_err = dir.path().join("third.err");
    let third = holder.serve(admin_addr(), &third_err);
    let status = tokio::time::timeout(PATIENCE, waiting)
        .await
        .expect("answered once the next process serves")
        .expect("task")
        .expect("the waiting request");
    assert_eq!(status, 200);
    assert_eq!(holder.stop(third), 0);
}

/// systemd-socket-activate starts its program when the first connection arrives: connect
/// once it listens.
fn knock(port: u16, log: &dyn Fn() -> String) {
    let deadline = Instant::now() + PATIENCE;
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "never listened: {}", log());
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_real_systemd_socket_activate_hands_over_a_named_socket() {
    let Some(activate) = tool("systemd-socket-activate", "apt-get install systemd") else {
        return;
    };
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let up = rt.block_on(upstream());
    // Named sockets are matched by name; a name of ours beside one we do not know is refused.
    for (names, served) in [("traffic", true), ("traffic:bogus", false)] {
        let port = free_port();
        let admin = admin_addr();
        let dir = tempfile::tempdir().expect("tempdir");
        let err = std::fs::File::create(dir.path().join("err")).expect("err file");
        let mut child = Command::new(&activate)
            .args([
                "-l",
                &format!("127.0.0.1:{port}"),
                &format!("--fdname={names}"),
            ])
            .args(if served {
                vec![]
            } else {
                vec!["-l".to_owned(), format!("127.0.0.1:{}", free_port())]
            })
            .args(["-E", &format!("FLEET_LIMITER_UPSTREAM={}", up.uri())])
            .args(["-E", "FLEET_LIMITER_LOG=info"])
            .arg(BIN)
            .args(["serve", "--admin-listen", &admin.to_string()])
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .expect("systemd-socket-activate");
        let log = || std::fs::read_to_string(dir.path().join("err")).unwrap_or_default();
        if served {
            knock(port, &log);
            let deadline = Instant::now() + PATIENCE;
            while !healthy(admin) {
                assert!(Instant::now() < deadline, "never served: {}", log());
                std::thread::sleep(Duration::from_millis(50));
            }
            let status = rt.block_on(async {
                unpooled_client()
                    .get(format!("http://127.0.0.1:{port}/handover"))
                    .send()
                    .await
                    .map(|r| r.status().as_u16())
            });
            assert_eq!(status.ok(), Some(200), "{}", log());
            assert!(
                log().contains("handed over by the service manager"),
                "{}",
                log()
            );
            let _ = child.kill();
            let _ = child.wait();
        } else {
            knock(port, &log);
            let deadline = Instant::now() + PATIENCE;
            let status = loop {
                if let Some(s) = child.try_wait().expect("try_wait") {
                    break s;
                }
                assert!(Instant::now() < deadline, "still running: {}", log());
                std::thread::sleep(Duration::from_millis(50));
            };
            assert_eq!(status.code(), Some(2), "{}", log());
            assert!(
                log().contains("LISTEN_FDNAMES") && log().contains("\"bogus\""),
                "{}",
                log()
            );
        }
    }
}

#[test]
fn a_hand_over_that_is_not_a_listening_socket_stops_the_start() {
    // fd 3 is a file, as a misconfigured unit or a stray LISTEN_FDS could make it.
    let out = Command::new("sh")
        .args(["-c", "exec 3</dev/null; exec \"$0\" \"$@\""])
        .arg(BIN)
        .args(["serve", "--upstream", "http://127.0.0.1:9"])
        .env("LISTEN_FDS", "1")
        .env_remove("LISTEN_PID")
        .env("FLEET_LIMITER_ADMIN_LISTEN", "127.0.0.1:0")
        .output()
        .expect("sh");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("configuration error: LISTEN_FDS: the traffic socket")
            && stderr.contains("not a socket"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sockets_meant_for_another_process_or_misspelt_are_ignored() {
    let up = upstream().await;
    for (fds, pid) in [("1", "1"), ("many", ""), ("-1", "")] {
        let mut launch = Launch::serve()
            .upstream(&up.uri())
            .env("LISTEN_FDS", fds)
            .env("LISTEN_FDNAMES", "traffic");
        launch = if pid.is_empty() {
            launch.unset("LISTEN_PID")
        } else {
            launch.env("LISTEN_PID", pid)
        };
        let gw = launch.spawn();
        let res = unpooled_client()
            .get(gw.url("/handover"))
            .send()
            .await
            .expect("served on its own address");
        assert_eq!(res.status(), 200, "LISTEN_FDS={fds} LISTEN_PID={pid}");
    }
}
