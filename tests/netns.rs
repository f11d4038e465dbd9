//! Faults on a real network. Each test builds its own hosts out of network namespaces joined by
//! veth pairs and two bridges: a front network (the test, the gateways, the upstream) on
//! 198.18.<n>.0/24 and a store network (the gateways and Redis) on 198.19.<n>.0/24, both in the
//! RFC 2544 benchmarking range. Redis (`redis-server`), the gateways (the real binary) and the
//! upstream (`tests/support/netns_hosts.py`) each run in their own namespace on their own
//! address; the test sends its requests from the host's namespace.
//!
//! The faults are real where the kernel allows: a cut is a bridge port set down (the host on
//! the other end loses carrier and its packets are dropped: no RST comes back), a Redis restart
//! is the process killed and started again on its address. This kernel has no `netem`, so
//! latency and loss come from a TCP relay in Redis's namespace (`netns_hosts.py relay`) that
//! holds data back: a loss is a piece held one retransmission time longer, as TCP would.
//!
//! Every test prints what it measured (`cargo test --test netns -- --nocapture`); the numbers
//! are reported, never asserted: the assertions are on outcomes (no 5xx from the limiter, the
//! fallback taken, recovery within a bounded wait). docs/faults.md has the table.
//!
//! Without root or `ip` the tests are skipped, saying why; with `CI` set they fail instead.

mod common;

use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The helper that plays the upstream and the relay.
const HOSTS_PY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/netns_hosts.py");
/// The one limiter of every configuration here: large enough never to refuse, so that an
/// answer is either decided (limit headers) or the `on_store_error = "allow"` fallback (none).
/// A fixed window (nothing refills within the test), so what is left counts exactly the
/// requests decided on the shared buckets.
const LIMITER: &str = "netns";
const LIMIT: u64 = 1_000_000;
/// `store.timeout` of the gateways on Redis.
const STORE_TIMEOUT: Duration = Duration::from_millis(100);
/// The longest the test waits for anything (a recovery, a start), never a timing assertion.
const PATIENCE: Duration = common::PATIENCE;

/// Host numbers on both networks.
const HOST_A: u8 = 11;
const HOST_B: u8 = 12;
const HOST_UPSTREAM: u8 = 20;
const HOST_REDIS: u8 = 30;
const GATEWAY_PORT: u16 = 8080;
const ADMIN_PORT: u16 = 9090;
const UPSTREAM_PORT: u16 = 8000;
const REDIS_PORT: u16 = 6379;
const RELAY_PORT: u16 = 6380;

// ---------------------------------------------------------------------------------------------
// The network

/// `ip ARGS`: its stderr on failure.
fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn must(args: &[&str]) {
    if let Err(e) = ip(args) {
        panic!("{e}");
    }
}

/// Which of a host's two links.
#[derive(Clone, Copy, Debug)]
enum Link {
    Front,
    Store,
}

impl Link {
    fn letter(self) -> char {
        match self {
            Link::Front => 'f',
            Link::Store => 's',
        }
    }
}

/// A test's own network: a hub namespace holding the two bridges, a host namespace per host,
/// and a veth from the test's namespace into the front bridge. Everything is deleted on drop,
/// a failed test included.
struct Net {
    /// The third octet of both networks, unique among the networks that exist now: the hub
    /// namespace `flnet<n>` is its claim (`ip netns add` fails when the name exists).
    n: u8,
    hub: String,
    hosts: Vec<String>,
    root_if: String,
}

impl Net {
    /// A fresh network, or `None` when this machine cannot make one (skipped, or failed under CI).
    fn new() -> Option<Net> {
        common::tool("ip", "apt-get install iproute2")?;
        let start = usize::from(rand::random::<u8>());
        for k in 0..256 {
            let n = ((start + k) % 256) as u8;
            let hub = format!("flnet{n}");
            match ip(&["netns", "add", &hub]) {
                Ok(()) => {}
                Err(e) if e.contains("File exists") => continue,
                Err(e) => {
                    common::unavailable(&format!(
                        "cannot create a network namespace (needs root and iproute2): {e}"
                    ));
                    return None;
                }
            }
            let mut net = Net {
                n,
                hub,
                hosts: Vec::new(),
                root_if: format!("fl{n}h"),
            };
            // An address of ours already on this machine (a namespace deleted by hand, its
            // link left behind): another number.
            let taken = Command::new("ip")
                .args([
                    "-4",
                    "-o",
                    "addr",
                    "show",
                    "to",
                    &format!("198.18.{n}.0/24"),
                ])
                .output()
                .map(|o| !o.stdout.is_empty())
                .unwrap_or(true);
            if taken {
                continue;
            }
            net.build_hub();
            return Some(net);
        }
        panic!("no free network number in 198.18.0.0/16");
    }

    fn build_hub(&mut self) {
        let hub = self.hub.clone();
        must(&["-n", &hub, "link", "set", "lo", "up"]);
        for br in ["brf", "brs"] {
            must(&["-n", &hub, "link", "add", br, "type", "bridge"]);
            must(&["-n", &hub, "link", "set", br, "up"]);
        }
        let root_if = self.root_if.clone();
        must(&[
            "link", "add", &root_if, "type", "veth", "peer", "name", "test", "netns", &hub,
        ]);
        must(&["-n", &hub, "link", "set", "test", "master", "brf", "up"]);
        must(&[
            "addr",
            "add",
            &format!("198.18.{}.1/24", self.n),
            "dev",
            &root_if,
        ]);
        must(&["link", "set", &root_if, "up"]);
    }

    /// A host namespace `flnet<n>-<name>` with host number `host` on the links asked for.
    fn host(&mut self, name: &str, host: u8, links: &[Link]) -> String {
        let ns = format!("{}-{name}", self.hub);
        must(&["netns", "add", &ns]);
        self.hosts.push(ns.clone());
        must(&["-n", &ns, "link", "set", "lo", "up"]);
        for &link in links {
            let (port, dev, bridge, addr) = match link {
                Link::Front => (
                    format!("f{name}"),
                    "front",
                    "brf",
                    format!("{}/24", self.front(host)),
                ),
                Link::Store => (
                    format!("s{name}"),
                    "store",
                    "brs",
                    format!("{}/24", self.store(host)),
                ),
            };
            must(&[
                "-n", &self.hub, "link", "add", &port, "type", "veth", "peer", "name", dev,
                "netns", &ns,
            ]);
            must(&[
                "-n", &self.hub, "link", "set", &port, "master", bridge, "up",
            ]);
            must(&["-n", &ns, "addr", "add", &addr, "dev", dev]);
            must(&["-n", &ns, "link", "set", dev, "up"]);
        }
        ns
    }

    fn front(&self, host: u8) -> Ipv4Addr {
        Ipv4Addr::new(198, 18, self.n, host)
    }

    fn store(&self, host: u8) -> Ipv4Addr {
        Ipv4Addr::new(198, 19, self.n, host)
    }

    /// Cut one link of host `name`: its bridge port goes down, the host's end loses carrier and
    /// whatever either side sends on it is dropped without an answer.
    fn cut(&self, name: &str, link: Link) {
        let port = format!("{}{name}", link.letter());
        must(&["-n", &self.hub, "link", "set", &port, "down"]);
    }

    fn mend(&self, name: &str, link: Link) {
        let port = format!("{}{name}", link.letter());
        must(&["-n", &self.hub, "link", "set", &port, "up"]);
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        let _ = ip(&["link", "del", &self.root_if]);
        for ns in self.hosts.iter().rev() {
            let _ = ip(&["netns", "del", ns]);
        }
        let _ = ip(&["netns", "del", &self.hub]);
    }
}

// ---------------------------------------------------------------------------------------------
// The processes

/// A process in a namespace, killed on drop; its stdout and stderr in files.
struct Proc {
    child: Child,
    log: PathBuf,
}

impl Proc {
    fn spawn(ns: &str, program: &str, args: &[String], log: &Path) -> Proc {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns, program]).args(args);
        Self::spawn_cmd(cmd, log)
    }

    fn spawn_cmd(mut cmd: Command, log: &Path) -> Proc {
        let out = std::fs::File::create(log).expect("log file");
        let err = out.try_clone().expect("log file");
        cmd.stdin(Stdio::null()).stdout(out).stderr(err);
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        Proc {
            child,
            log: log.to_owned(),
        }
    }

    fn log(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(&self.log).unwrap_or_default()).into_owned()
    }

    fn exited(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }

    /// Wait until `ready` holds, polling; panic with the log when the process exits first or
    /// it never does.
    fn wait(&mut self, what: &str, mut ready: impl FnMut() -> bool) {
        let deadline = Instant::now() + PATIENCE;
        while !ready() {
            assert!(!self.exited(), "{what} exited; its log:\n{}", self.log());
            assert!(
                Instant::now() < deadline,
                "{what} not ready; its log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `netns_hosts.py upstream` or `relay` in `ns`, once it has printed `ready`.
fn python_host(ns: &str, dir: &Path, args: &[String]) -> Proc {
    let log = dir.join(format!("{}.log", args[0]));
    let mut all = vec![HOSTS_PY.to_owned()];
    all.extend(args.iter().cloned());
    let mut p = Proc::spawn(ns, "python3", &all, &log);
    let what = format!("netns_hosts.py {}", args[0]);
    p.wait(&what, || {
        std::fs::read_to_string(&log).is_ok_and(|l| l.contains("ready"))
    });
    p
}

/// `redis-server` in its namespace on its store address, started again on the same address
/// by [`Redis::start`].
struct Redis {
    ns: String,
    addr: Ipv4Addr,
    dir: tempfile::TempDir,
    proc: Option<Proc>,
}

impl Redis {
    fn new(ns: &str, addr: Ipv4Addr) -> Redis {
        let mut r = Redis {
            ns: ns.to_owned(),
            addr,
            dir: tempfile::tempdir().expect("tempdir"),
            proc: None,
        };
        r.start();
        r
    }

    fn start(&mut self) {
        assert!(self.proc.is_none(), "already running");
        let args: Vec<String> = [
            "--bind",
            &self.addr.to_string(),
            "--port",
            &REDIS_PORT.to_string(),
            "--save",
            "",
            "--appendonly",
            "no",
            // Its namespace is private: let the gateways in without a password.
            "--protected-mode",
            "no",
            "--dir",
            &self.dir.path().display().to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let log = self.dir.path().join("redis.log");
        let mut p = Proc::spawn(&self.ns, "redis-server", &args, &log);
        let (ns, addr) = (self.ns.clone(), self.addr.to_string());
        p.wait("redis-server", || {
            Command::new("ip")
                .args(["netns", "exec", &ns, "redis-cli", "-h", &addr])
                .args(["-p", &REDIS_PORT.to_string(), "ping"])
                .output()
                .is_ok_and(|o| o.stdout.starts_with(b"PONG"))
        });
        self.proc = Some(p);
    }

    /// SIGKILL: the kernel closes its connections.
    fn kill(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.kill();
        }
    }
}

/// The real gateway in its namespace, listening on its front address.
struct Gateway {
    proc: Proc,
    addr: Ipv4Addr,
    _dir: tempfile::TempDir,
}

impl Gateway {
    fn start(ns: &str, addr: Ipv4Addr, config: &str, upstream: &str, args: &[&str]) -> Gateway {
        let dir = tempfile::tempdir().expect("tempdir");
        let config_path = dir.path().join("fleet-limiter.toml");
        std::fs::write(&config_path, config).expect("write config");
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns, common::BIN, "serve"])
            .arg("--config")
            .arg(&config_path)
            .args(["--listen", &format!("{addr}:{GATEWAY_PORT}")])
            .args(["--admin-listen", &format!("{addr}:{ADMIN_PORT}")])
            .args(["--upstream", upstream])
            .args(args);
        for (k, _) in std::env::vars() {
            if k.starts_with("FLEET_LIMITER_") {
                cmd.env_remove(k);
            }
        }
        cmd.env("FLEET_LIMITER_LOG", "info")
            .env("FLEET_LIMITER_ALLOW_UNSAFE_CALIBRATION", "true")
            .env("FLEET_LIMITER_DRAIN_DELAY", "0s");
        let mut proc = Proc::spawn_cmd(cmd, &dir.path().join("gateway.log"));
        let admin = SocketAddr::from((addr, ADMIN_PORT));
        proc.wait("the gateway", || healthz(admin));
        Gateway {
            proc,
            addr,
            _dir: dir,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}:{GATEWAY_PORT}{path}", self.addr)
    }

    /// One sample of the admin listener's `/metrics` (0 when absent).
    async fn metric(&self, client: &reqwest::Client, sample: &str) -> f64 {
        let url = format!("http://{}:{ADMIN_PORT}/metrics", self.addr);
        let text = client
            .get(url)
            .send()
            .await
            .expect("GET /metrics")
            .text()
            .await
            .expect("metrics body");
        common::sample_value(&text, sample).unwrap_or(0.0)
    }

    /// The status of `GET <path>` on the admin listener.
    async fn admin_status(&self, client: &reqwest::Client, path: &str) -> u16 {
        let url = format!("http://{}:{ADMIN_PORT}{path}", self.addr);
        client
            .get(url)
            .send()
            .await
            .map_or(0, |r| r.status().as_u16())
    }

    /// The counters each fault is measured by.
    async fn counters(&self, client: &reqwest::Client) -> Counters {
        let m = |s: String| async move { self.metric(client, &s).await };
        Counters {
            fallbacks: m(format!(
                r#"fleet_limiter_decisions_total{{limiter="{LIMITER}",outcome="store_error_allowed"}}"#
            ))
            .await,
            timeouts: m(r#"fleet_limiter_store_errors_total{store="redis",kind="timeout"}"#.into())
                .await,
            connection: m(
                r#"fleet_limiter_store_errors_total{store="redis",kind="connection"}"#.into(),
            )
            .await,
            upstream_timeouts: m(r#"fleet_limiter_upstream_errors_total{kind="timeout"}"#.into())
                .await,
            upstream_unreachable: m(
                r#"fleet_limiter_upstream_errors_total{kind="unreachable"}"#.into(),
            )
            .await,
        }
    }
}

fn healthz(admin: SocketAddr) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = TcpStream::connect_timeout(&admin, Duration::from_millis(200)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let req = format!("GET /healthz HTTP/1.1\r\nHost: {admin}\r\nConnection: close\r\n\r\n");
    let mut head = [0u8; 12];
    s.write_all(req.as_bytes()).is_ok()
        && s.read_exact(&mut head).is_ok()
        && head.starts_with(b"HTTP/1.1 200")
}

/// The `/metrics` counters a fault moves.
#[derive(Clone, Copy, Debug, Default)]
struct Counters {
    fallbacks: f64,
    timeouts: f64,
    connection: f64,
    upstream_timeouts: f64,
    upstream_unreachable: f64,
}

impl Counters {
    fn since(self, before: Counters) -> String {
        format!(
            "store_error_allowed+{} store_errors{{timeout}}+{} store_errors{{connection}}+{}",
            self.fallbacks - before.fallbacks,
            self.timeouts - before.timeouts,
            self.connection - before.connection
        )
    }
}

// ---------------------------------------------------------------------------------------------
// Requests

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("reqwest client")
}

/// One answer, as these tests read it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Seen {
    /// Decided on the store: allowed, with what was left.
    Decided(u64),
    /// Refused with a 429 (never expected here: the budget is far away).
    Refused,
    /// Allowed with no limit headers: `on_store_error = "allow"` answered.
    Fallback,
    /// Any other status.
    Status(u16),
    /// No answer at all (the connection failed or the client gave up).
    Broken,
}

async fn ask(client: &reqwest::Client, url: &str) -> (Seen, Duration) {
    let t = Instant::now();
    let seen = match client.get(url).send().await {
        Ok(r) => {
            let status = r.status().as_u16();
            let remaining = r
                .headers()
                .get("x-ratelimit-remaining")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok());
            let body_ok = r.bytes().await.is_ok();
            match (status, remaining) {
                _ if !body_ok => Seen::Broken,
                (200, Some(n)) => Seen::Decided(n),
                (200, None) => Seen::Fallback,
                (429, _) => Seen::Refused,
                (s, _) => Seen::Status(s),
            }
        }
        Err(_) => Seen::Broken,
    };
    (seen, t.elapsed())
}

/// What a run of requests saw.
#[derive(Clone, Debug, Default)]
struct Tally {
    decided: u32,
    fallback: u32,
    refused: u32,
    statuses: Vec<u16>,
    broken: u32,
    slowest: Duration,
    /// The last `x-ratelimit-remaining` decided.
    remaining: Option<u64>,
}

impl Tally {
    fn add(&mut self, (seen, took): (Seen, Duration)) {
        self.slowest = self.slowest.max(took);
        match seen {
            Seen::Decided(n) => {
                self.decided += 1;
                self.remaining = Some(n);
            }
            Seen::Fallback => self.fallback += 1,
            Seen::Refused => self.refused += 1,
            Seen::Status(s) => self.statuses.push(s),
            Seen::Broken => self.broken += 1,
        }
    }

    fn total(&self) -> u32 {
        self.decided + self.fallback + self.refused + self.broken + self.statuses.len() as u32
    }

    /// Every request answered 200, decided or by the fallback: no 5xx (nor anything else)
    /// from the limiter, no broken connection.
    fn assert_all_answered(&self, what: &str, log: &str) {
        assert!(
            self.statuses.is_empty() && self.broken == 0 && self.refused == 0,
            "{what}: every request answered 200 by the limiter, saw {self:?}; gateway log:\n{log}"
        );
    }

    /// At least nine answers in ten decided on Redis: the rest may have missed the store
    /// timeout on a busy machine, which the callers check is all they did.
    fn mostly_decided(&self) -> bool {
        self.decided * 10 >= self.total() * 9
    }

    fn line(&self) -> String {
        format!(
            "requests={} decided={} fallback={} refused={} other_status={:?} broken={} slowest={:?}",
            self.total(),
            self.decided,
            self.fallback,
            self.refused,
            self.statuses,
            self.broken,
            self.slowest
        )
    }
}

/// `n` requests, one after another, 20 ms apart, to each URL in turn; one tally per URL.
async fn drive(client: &reqwest::Client, urls: &[String], n: usize) -> Vec<Tally> {
    let mut tallies = vec![Tally::default(); urls.len()];
    for _ in 0..n {
        for (url, tally) in urls.iter().zip(tallies.iter_mut()) {
            tally.add(ask(client, url).await);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tallies
}

/// Ask every 25 ms until an answer is decided on the store: how long that took from `since`,
/// and what the answers before it were. Panics (with the log) after [`PATIENCE`].
async fn until_decided(
    client: &reqwest::Client,
    gw: &Gateway,
    since: Instant,
    what: &str,
) -> (Duration, Tally) {
    let url = gw.url("/netns/recover");
    let mut before = Tally::default();
    loop {
        let answer = ask(client, &url).await;
        if matches!(answer.0, Seen::Decided(_)) {
            return (since.elapsed(), before);
        }
        before.add(answer);
        assert!(
            since.elapsed() < PATIENCE,
            "{what}: not decided on Redis again after {PATIENCE:?} ({}); gateway log:\n{}",
            before.line(),
            gw.proc.log()
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

fn report(fault: &str, phase: &str, gateway: &str, detail: &str) {
    println!("netns fault={fault} phase={phase} gateway={gateway} {detail}");
}

// ---------------------------------------------------------------------------------------------
// The set-up shared by the Redis faults

fn redis_config(redis: Ipv4Addr, port: u16) -> String {
    format!(
        r#"
[store]
url = "redis://{redis}:{port}"
timeout = "{timeout}ms"

[limiters.{LIMITER}]
limit = {LIMIT}
window = "1h"
algorithm = "fixed-window"
key = "ip"
routes = ["/netns/**"]
on_store_error = "allow"
"#,
        timeout = STORE_TIMEOUT.as_millis()
    )
}

/// Redis, an upstream and two gateways on it (through the relay when `relay` is given).
struct Site {
    // Declared in drop order: processes first, the network last.
    a: Gateway,
    b: Gateway,
    _upstream: Proc,
    relay: Option<(Proc, PathBuf)>,
    redis: Redis,
    dir: tempfile::TempDir,
    net: Net,
}

impl Site {
    fn new(with_relay: bool) -> Option<Site> {
        common::tool("redis-server", "apt-get install redis-server")?;
        common::tool("python3", "apt-get install python3")?;
        let mut net = Net::new()?;
        let dir = tempfile::tempdir().expect("tempdir");
        let redis_ns = net.host("r", HOST_REDIS, &[Link::Store]);
        let up_ns = net.host("up", HOST_UPSTREAM, &[Link::Front]);
        let a_ns = net.host("a", HOST_A, &[Link::Front, Link::Store]);
        let b_ns = net.host("b", HOST_B, &[Link::Front, Link::Store]);
        let redis_addr = net.store(HOST_REDIS);
        let redis = Redis::new(&redis_ns, redis_addr);
        let relay = with_relay.then(|| {
            let control = dir.path().join("relay.json");
            let args = [
                "relay".to_owned(),
                redis_addr.to_string(),
                RELAY_PORT.to_string(),
                redis_addr.to_string(),
                REDIS_PORT.to_string(),
                control.display().to_string(),
            ];
            (python_host(&redis_ns, dir.path(), &args), control)
        });
        let upstream = python_host(
            &up_ns,
            dir.path(),
            &[
                "upstream".to_owned(),
                net.front(HOST_UPSTREAM).to_string(),
                UPSTREAM_PORT.to_string(),
            ],
        );
        let port = if with_relay { RELAY_PORT } else { REDIS_PORT };
        let config = redis_config(redis_addr, port);
        let upstream_url = format!("http://{}:{UPSTREAM_PORT}", net.front(HOST_UPSTREAM));
        let a = Gateway::start(&a_ns, net.front(HOST_A), &config, &upstream_url, &[]);
        let b = Gateway::start(&b_ns, net.front(HOST_B), &config, &upstream_url, &[]);
        Some(Site {
            a,
            b,
            _upstream: upstream,
            relay,
            redis,
            dir,
            net,
        })
    }

    /// Set the relay's delay (one way, each direction) and loss.
    fn relay(&self, delay_ms: u64, loss: f64, loss_ms: u64) {
        let (_, control) = self.relay.as_ref().expect("started with the relay");
        let tmp = self.dir.path().join("relay.json.tmp");
        std::fs::write(
            &tmp,
            format!(r#"{{"delay_ms": {delay_ms}, "loss": {loss}, "loss_ms": {loss_ms}}}"#),
        )
        .expect("write the relay's settings");
        std::fs::rename(&tmp, control).expect("replace the relay's settings");
    }

    fn logs(&self) -> String {
        format!(
            "gateway a:\n{}\ngateway b:\n{}",
            self.a.proc.log(),
            self.b.proc.log()
        )
    }

    fn urls(&self) -> Vec<String> {
        vec![self.a.url("/netns/x"), self.b.url("/netns/x")]
    }
}

/// Both gateways decide on Redis before a fault.
async fn baseline(client: &reqwest::Client, site: &Site, fault: &str) {
    for (name, gw) in [("a", &site.a), ("b", &site.b)] {
        let (took, before) = until_decided(client, gw, Instant::now(), "at start").await;
        report(fault, "first-decision", name, &format!("after={took:?}"));
        before.assert_all_answered("at start", &site.logs());
    }
    let t = drive(client, &site.urls(), 20).await;
    for (name, tally) in ["a", "b"].iter().zip(&t) {
        report(fault, "baseline", name, &tally.line());
        tally.assert_all_answered("before the fault", &site.logs());
        assert!(
            tally.mostly_decided(),
            "before the fault answers are decided on Redis: {}\n{}",
            tally.line(),
            site.logs()
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The faults

/// Redis slow (beyond the timeout, then within it), then lossy, behind the relay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_slow_then_lossy() {
    let Some(site) = Site::new(true) else { return };
    let client = client();
    let fault = "redis-slow-lossy";
    baseline(&client, &site, fault).await;

    // 150 ms each way: every answer takes 300 ms, three times the store timeout.
    let before = (
        site.a.counters(&client).await,
        site.b.counters(&client).await,
    );
    site.relay(150, 0.0, 0);
    let slow = drive(&client, &site.urls(), 30).await;
    let after = (
        site.a.counters(&client).await,
        site.b.counters(&client).await,
    );
    for ((name, tally), (b, a)) in ["a", "b"]
        .iter()
        .zip(&slow)
        .zip([(before.0, after.0), (before.1, after.1)])
    {
        report(
            fault,
            "rtt-300ms",
            name,
            &format!("{} {}", tally.line(), a.since(b)),
        );
        tally.assert_all_answered("Redis slower than the timeout", &site.logs());
        assert!(
            tally.fallback > tally.decided,
            "with Redis three timeouts away most answers are the fallback: {}",
            tally.line()
        );
        assert!(
            a.fallbacks > b.fallbacks && a.timeouts + a.connection > b.timeouts + b.connection,
            "the fallbacks and store errors are counted: {a:?} after {b:?}"
        );
    }

    // 20 ms each way: within the timeout again.
    site.relay(20, 0.0, 0);
    let mended = Instant::now();
    for (name, gw) in [("a", &site.a), ("b", &site.b)] {
        let (took, before) = until_decided(&client, gw, mended, "Redis fast again").await;
        report(
            fault,
            "rtt-40ms-recovery",
            name,
            &format!("recovered_after={took:?} meanwhile: {}", before.line()),
        );
        before.assert_all_answered("Redis fast again", &site.logs());
    }
    let fast = drive(&client, &site.urls(), 30).await;
    for (name, tally) in ["a", "b"].iter().zip(&fast) {
        report(fault, "rtt-40ms", name, &tally.line());
        tally.assert_all_answered("Redis within the timeout", &site.logs());
        assert!(
            tally.decided > tally.fallback,
            "within the timeout most answers are decided: {}",
            tally.line()
        );
    }

    // Lossy: 2 ms each way, and one piece in ten held 400 ms (a retransmission) more.
    let before = (
        site.a.counters(&client).await,
        site.b.counters(&client).await,
    );
    site.relay(2, 0.1, 400);
    let lossy = drive(&client, &site.urls(), 60).await;
    let after = (
        site.a.counters(&client).await,
        site.b.counters(&client).await,
    );
    let mut both = Tally::default();
    for ((name, tally), (b, a)) in ["a", "b"]
        .iter()
        .zip(&lossy)
        .zip([(before.0, after.0), (before.1, after.1)])
    {
        report(
            fault,
            "loss-10pct",
            name,
            &format!("{} {}", tally.line(), a.since(b)),
        );
        tally.assert_all_answered("Redis lossy", &site.logs());
        both.decided += tally.decided;
        both.fallback += tally.fallback;
    }
    assert!(
        both.decided > 0 && both.fallback > 0,
        "a lossy Redis decides some requests and misses the timeout on others: {}",
        both.line()
    );

    site.relay(0, 0.0, 0);
    let clear = Instant::now();
    for (name, gw) in [("a", &site.a), ("b", &site.b)] {
        let (took, before) = until_decided(&client, gw, clear, "Redis clean again").await;
        report(
            fault,
            "clean-recovery",
            name,
            &format!("recovered_after={took:?} meanwhile: {}", before.line()),
        );
        before.assert_all_answered("Redis clean again", &site.logs());
    }
}

/// Redis cut off from gateway A only: A falls back, B keeps deciding on the shared buckets,
/// and A is back on them once the link is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cut_off_from_one_gateway() {
    let Some(site) = Site::new(false) else { return };
    let client = client();
    let fault = "redis-cut-from-a";
    baseline(&client, &site, fault).await;
    let before_a = site.a.counters(&client).await;
    let before_b = site.b.counters(&client).await;

    site.net.cut("a", Link::Store);
    let cut_at = Instant::now();
    let during = drive(&client, &site.urls(), 60).await;
    let cut_for = cut_at.elapsed();
    let (a, b) = (&during[0], &during[1]);
    let after_a = site.a.counters(&client).await;
    let after_b = site.b.counters(&client).await;
    // What tells the cut-off instance apart: its store check fails, its readiness does not.
    let checks = [
        site.a.admin_status(&client, "/healthz/store").await,
        site.b.admin_status(&client, "/healthz/store").await,
        site.a.admin_status(&client, "/readyz").await,
    ];
    report(
        fault,
        "cut-admin",
        "a",
        &format!(
            "a_healthz_store={} b_healthz_store={} a_readyz={}",
            checks[0], checks[1], checks[2]
        ),
    );
    assert_eq!(
        checks,
        [503, 200, 200],
        "during the cut: /healthz/store fails on A alone, A stays ready"
    );
    report(
        fault,
        "cut",
        "a",
        &format!(
            "{} {} cut_for={cut_for:?}",
            a.line(),
            after_a.since(before_a)
        ),
    );
    report(
        fault,
        "cut",
        "b",
        &format!("{} {}", b.line(), after_b.since(before_b)),
    );
    a.assert_all_answered("A cut off from Redis", &site.logs());
    b.assert_all_answered("B beside the cut", &site.logs());
    assert_eq!(
        a.fallback,
        a.total(),
        "A cannot reach Redis: every answer is the fallback: {}",
        a.line()
    );
    // B keeps its connection: whatever it did not decide missed the timeout on a busy
    // machine, and nothing failed to connect.
    assert!(
        b.mostly_decided()
            && after_b.connection == before_b.connection
            && after_b.fallbacks - before_b.fallbacks == after_b.timeouts - before_b.timeouts,
        "B still reaches Redis and decides: {} {}",
        b.line(),
        after_b.since(before_b)
    );

    site.net.mend("a", Link::Store);
    let mended = Instant::now();
    let (took, meanwhile) = until_decided(&client, &site.a, mended, "link mended").await;
    report(
        fault,
        "recovery",
        "a",
        &format!("recovered_after={took:?} meanwhile: {}", meanwhile.line()),
    );
    meanwhile.assert_all_answered("after the link is back", &site.logs());

    // Back on the shared bucket: A's answer counts what B decided during the cut and A's two
    // decided requests since (the first above, this one). A call that timed out during the cut
    // had been sent: TCP may still deliver it once the link is back (or, from B, late), and
    // Redis counts it then, though its request was answered by the fallback. Nothing else
    // counts.
    let after = drive(&client, &site.urls()[..1], 1).await;
    let b_left = b.remaining.expect("B decided during the cut");
    let a_left = after[0].remaining.expect("A decides again");
    let timed_out =
        (after_a.timeouts - before_a.timeouts + after_b.timeouts - before_b.timeouts) as u64;
    let late = (b_left - 2).checked_sub(a_left);
    report(
        fault,
        "shared-budget",
        "a",
        &format!(
            "b_left_during_cut={b_left} a_left_after={a_left} timed_out_calls={timed_out} counted_late={late:?}"
        ),
    );
    assert!(
        late.is_some_and(|late| late <= timed_out),
        "A is on the shared budget again: A sees {a_left} left, B saw {b_left} during the cut, \
         A's two decisions since and at most the {timed_out} timed-out calls explain the rest"
    );
}

/// Redis killed and started again on the same address (empty: no persistence here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restarted() {
    let Some(mut site) = Site::new(false) else {
        return;
    };
    let client = client();
    let fault = "redis-restart";
    baseline(&client, &site, fault).await;
    let left_before = drive(&client, &site.urls()[..1], 1).await[0]
        .remaining
        .expect("decided before the restart");
    let before = (
        site.a.counters(&client).await,
        site.b.counters(&client).await,
    );

    site.redis.kill();
    let down = drive(&client, &site.urls(), 30).await;
    for (name, tally) in ["a", "b"].iter().zip(&down) {
        report(fault, "down", name, &tally.line());
        tally.assert_all_answered("Redis down", &site.logs());
        assert_eq!(
            tally.fallback,
            tally.total(),
            "no Redis: every answer is the fallback: {}",
            tally.line()
        );
    }

    site.redis.start();
    let restarted = Instant::now();
    let (ra, rb) = tokio::join!(
        until_decided(&client, &site.a, restarted, "Redis restarted"),
        until_decided(&client, &site.b, restarted, "Redis restarted")
    );
    let after = (
        site.a.counters(&client).await,
        site.b.counters(&client).await,
    );
    for ((name, (took, meanwhile)), (b, a)) in ["a", "b"]
        .iter()
        .zip([ra, rb])
        .zip([(before.0, after.0), (before.1, after.1)])
    {
        report(
            fault,
            "recovery",
            name,
            &format!(
                "recovered_after={took:?} meanwhile: {} over the whole outage: {}",
                meanwhile.line(),
                a.since(b)
            ),
        );
        meanwhile.assert_all_answered("Redis restarted", &site.logs());
    }
    // The new Redis holds nothing: the budget started over.
    let left_after = drive(&client, &site.urls()[..1], 1).await[0]
        .remaining
        .expect("decided after the restart");
    report(
        fault,
        "budget",
        "a",
        &format!("remaining_before={left_before} remaining_after={left_after}"),
    );
    assert!(
        left_after > left_before,
        "an empty Redis starts every bucket full ({left_before} left before, {left_after} after)"
    );
}

/// The upstream cut off in the middle of a large streaming answer, and a request sent while it
/// is cut off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_cut_mid_stream() {
    if common::tool("python3", "apt-get install python3").is_none() {
        return;
    }
    let Some(mut net) = Net::new() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let up_ns = net.host("up", HOST_UPSTREAM, &[Link::Front]);
    let a_ns = net.host("a", HOST_A, &[Link::Front]);
    let upstream = python_host(
        &up_ns,
        dir.path(),
        &[
            "upstream".to_owned(),
            net.front(HOST_UPSTREAM).to_string(),
            UPSTREAM_PORT.to_string(),
        ],
    );
    let (connect_timeout, read_timeout) = (Duration::from_secs(2), Duration::from_secs(3));
    let config = format!(
        "[limiters.{LIMITER}]\nlimit = {LIMIT}\nwindow = \"1h\"\nkey = \"ip\"\nroutes = [\"/**\"]\n"
    );
    let upstream_url = format!("http://{}:{UPSTREAM_PORT}", net.front(HOST_UPSTREAM));
    let gw = Gateway::start(
        &a_ns,
        net.front(HOST_A),
        &config,
        &upstream_url,
        &[
            "--connect-timeout",
            &format!("{}s", connect_timeout.as_secs()),
            "--read-timeout",
            &format!("{}s", read_timeout.as_secs()),
        ],
    );
    let client = client();
    let fault = "upstream-cut";
    let before = gw.counters(&client).await;

    // 400 pieces of 32 KiB, one every 10 ms: 12.5 MiB over 4 s or more.
    let (pieces, size) = (400u64, 32 * 1024u64);
    let url = gw.url(&format!("/stream?chunks={pieces}&size={size}&every_ms=10"));
    let mut res = client.get(&url).send().await.expect("the stream starts");
    assert_eq!(res.status(), 200, "the stream starts");
    let length = res.content_length();
    let mut got = 0u64;
    while got < 1024 * 1024 {
        match res.chunk().await {
            Ok(Some(c)) => got += c.len() as u64,
            other => panic!("the stream ended before the cut: {other:?}"),
        }
    }
    net.cut("up", Link::Front);
    let cut_at = Instant::now();
    let at_cut = got;
    // Bounded: the answer must end (cut off by the read timeout), not hang.
    let bound = connect_timeout + read_timeout * 5 + Duration::from_secs(10);
    let end = loop {
        match tokio::time::timeout(bound.saturating_sub(cut_at.elapsed()), res.chunk()).await {
            Ok(Ok(Some(c))) => got += c.len() as u64,
            Ok(Ok(None)) => break "end of body".to_owned(),
            Ok(Err(e)) => break format!("error: {e:?}"),
            Err(_) => panic!(
                "the answer hung {bound:?} after the cut ({got} bytes); log:\n{}",
                gw.proc.log()
            ),
        }
    };
    let ended_after = cut_at.elapsed();
    let said: Vec<String> = gw
        .proc
        .log()
        .lines()
        .filter(|l| l.contains("WARN") || l.contains("ERROR"))
        .map(str::to_owned)
        .collect();
    report(fault, "mid-stream-log", "a", &format!("{said:?}"));
    report(
        fault,
        "mid-stream",
        "a",
        &format!(
            "content_length={length:?} bytes_at_cut={at_cut} bytes_received={got} ended_after_cut={ended_after:?} how={end}"
        ),
    );
    assert!(
        length.is_some_and(|l| got < l),
        "the client sees a short answer ({got} of {length:?} bytes, {end})"
    );

    // A request while the upstream is cut off: the gateway answers, with a 502 or 504.
    let (seen, took) = ask(&client, &gw.url("/during-cut")).await;
    report(
        fault,
        "new-request",
        "a",
        &format!("answer={seen:?} took={took:?}"),
    );
    assert!(
        matches!(seen, Seen::Status(502 | 504)),
        "a request to a cut-off upstream is answered 502 or 504, saw {seen:?}; log:\n{}",
        gw.proc.log()
    );

    net.mend("up", Link::Front);
    let mended = Instant::now();
    let mut meanwhile = Tally::default();
    loop {
        let answer = ask(&client, &gw.url("/after-cut")).await;
        if matches!(answer.0, Seen::Decided(_)) {
            break;
        }
        meanwhile.add(answer);
        assert!(
            mended.elapsed() < PATIENCE,
            "the upstream never answered again: {}; log:\n{}",
            meanwhile.line(),
            gw.proc.log()
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let after = gw.counters(&client).await;
    report(
        fault,
        "recovery",
        "a",
        &format!(
            "recovered_after={:?} meanwhile: {} upstream_errors{{timeout}}+{} upstream_errors{{unreachable}}+{}",
            mended.elapsed(),
            meanwhile.line(),
            after.upstream_timeouts - before.upstream_timeouts,
            after.upstream_unreachable - before.upstream_unreachable
        ),
    );
    assert!(
        after.upstream_timeouts + after.upstream_unreachable
            > before.upstream_timeouts + before.upstream_unreachable,
        "the failed forwards are counted: {after:?} after {before:?}"
    );
    drop(gw);
    drop(upstream);
}
