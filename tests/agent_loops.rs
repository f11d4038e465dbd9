//! The agent loops of docs/shaping.md ("For agent authors"), run as written: the ```python and
//! ```go blocks of that section are written to a temporary directory, unchanged, and run as 100
//! agents (50 of each, one process per agent, their URL, id, cadence and backoff cap given by
//! the environment variables the loops read) behind one address, in front of the real
//! `fleet-limiter` binary with a `[shaping]` heartbeat route, in front of an upstream this test
//! holds. In the middle of the run the upstream stalls for 20 s: it hangs for 14 s (every
//! request held, none answered: an agent's own 10 s timeout fires, a failure with no hint), then
//! drops every connection at once for 6 s (the gateway answers 502, with the agent's hint).
//!
//! No agent goes the configured heartbeat timeout without a heartbeat the upstream answered
//! 200; an agent whose request timed out tries again after a fully jittered backoff (within the
//! 2 s of its first failure, spread across it), never after its cadence; after the stall every
//! agent is back within 1.5 s of its slot and the fleet stays spread across the interval; no
//! agent sends more than twice what its cadence alone would.
//! `cargo test --test agent_loops -- --nocapture` prints the numbers docs/shaping.md gives.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// The heartbeat route's interval (the agents' cadence too), its longest hint, and the
/// heartbeat timeout the gateway is told of (its longest hint must be at most half of it).
const INTERVAL: u64 = 8;
const MAX_INTERVAL: u64 = 12;
const HEARTBEAT_TIMEOUT: u64 = 60;
/// The agents' backoff cap: with their 10 s request timeout, under half the heartbeat timeout.
const BACKOFF_CAP: u64 = 15;
const AGENTS_PER_LOOP: usize = 50;
/// Seconds from the agents' start: the stall runs from `STALL_AT` for `STALL` s (the first
/// `HANG` s of it hung), and by `BACK_ON_SLOTS` every agent is back on its slot: the stretch
/// step comes down once the target has been met for `recover` (5 s, after the 2 s latency
/// window) and the step has been held one interval (the 5xx of the stall's last seconds are
/// read over 10 s), and a stretched agent (on a grid of half the interval) is back on its own
/// slot within the longest hint; the run ends three intervals later.
const STALL_AT: f64 = 30.0;
const HANG: f64 = 14.0;
/// The loops' request timeout (10 s in both).
const AGENT_TIMEOUT: f64 = 10.0;
const STALL: f64 = 20.0;
const BACK_ON_SLOTS: f64 =
    STALL_AT + STALL + 7.0 + 2.0 * INTERVAL as f64 + MAX_INTERVAL as f64 + 2.0;
const END: f64 = BACK_ON_SLOTS + 3.0 * INTERVAL as f64;

/// What the upstream does with a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// 200 at once.
    Serve,
    /// Hold it, unanswered, until the mode changes; then close the connection.
    Hang,
    /// Close the connection without an answer.
    Drop,
}

/// One heartbeat the upstream received: from whom, when (seconds since the agents' start, once
/// the log is read), and whether it was answered 200.
#[derive(Clone, Debug)]
struct Arrival<T = f64> {
    agent: String,
    at: T,
    admitted: bool,
}

type Log = Arc<Mutex<Vec<Arrival<Instant>>>>;

/// The ```<lang> block of docs/shaping.md's "## For agent authors" section (exactly one).
fn loop_block(lang: &str) -> String {
    let doc = std::fs::read_to_string(common::manifest_dir().join("docs/shaping.md"))
        .expect("docs/shaping.md");
    let start = doc
        .find("\n## For agent authors\n")
        .expect("docs/shaping.md has a \"## For agent authors\" section");
    let section = &doc[start + 1..];
    let section = &section[..section.find("\n## ").unwrap_or(section.len())];
    let fence = format!("\n```{lang}\n");
    let blocks: Vec<&str> = section
        .split(fence.as_str())
        .skip(1)
        .map(|b| b.split("\n```").next().expect("a closing fence"))
        .collect();
    assert_eq!(blocks.len(), 1, "one ```{lang} block in the section");
    format!("{}\n", blocks[0])
}

/// A request's head and body read from `conn` (`None` once the connection is closed).
async fn read_request(conn: &mut TcpStream, buf: &mut Vec<u8>) -> Option<String> {
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        match conn.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let header = |name: &str| {
        head.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':').map(str::trim))
    };
    let chunked = header("transfer-encoding").is_some_and(|v| v.contains("chunked"));
    let length: usize = header("content-length").map_or(0, |v| v.parse().unwrap_or(0));
    // The body: its length, or (chunked) up to the last chunk, which ends the request.
    loop {
        let body = &buf[head_end..];
        let complete = if chunked {
            body.ends_with(b"0\r\n\r\n")
        } else {
            body.len() >= length
        };
        if complete {
            break;
        }
        match conn.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let end = if chunked {
        buf.len()
    } else {
        head_end + length
    };
    buf.drain(..end);
    Some(head)
}

/// One connection from the gateway: each request recorded, then answered as the mode says.
async fn serve(mut conn: TcpStream, log: Log, mut mode: watch::Receiver<Mode>) {
    let mut buf = Vec::new();
    while let Some(head) = read_request(&mut conn, &mut buf).await {
        let agent = head
            .lines()
            .find_map(|l| l.strip_prefix("x-agent-id:").map(str::trim))
            .unwrap_or("")
            .to_owned();
        let now = *mode.borrow_and_update();
        let admitted = now == Mode::Serve;
        log.lock().expect("log").push(Arrival {
            agent,
            at: Instant::now(),
            admitted,
        });
        match now {
            Mode::Serve => {
                let answer = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{\"ok\":true}";
                if conn.write_all(answer).await.is_err() {
                    return;
                }
            }
            Mode::Hang => {
                let _ = mode.changed().await;
                return;
            }
            Mode::Drop => return,
        }
    }
}

/// The agent processes, killed when the test ends however it ends.
struct Agents(Vec<(String, Child)>);

impl Drop for Agents {
    fn drop(&mut self) {
        for (_, child) in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// One agent: `program args`, its id and the gateway's URL in its environment, its stderr in
/// `dir`.
fn agent(program: &Path, args: &[&Path], id: &str, url: &str, dir: &Path) -> Child {
    let stderr = std::fs::File::create(dir.join(format!("{id}.stderr"))).expect("stderr file");
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env("FLEET_URL", url)
        .env("FLEET_AGENT_ID", id)
        .env("FLEET_CADENCE", INTERVAL.to_string())
        .env("FLEET_BACKOFF_CAP", BACKOFF_CAP.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr);
    // Straight to the gateway, whatever proxy this machine is behind.
    for proxy in [
        "http_proxy",
        "HTTP_PROXY",
        "https_proxy",
        "HTTPS_PROXY",
        "all_proxy",
        "ALL_PROXY",
    ] {
        cmd.env_remove(proxy);
    }
    cmd.spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", program.display()))
}

/// The distance between two instants on a circle of one interval (s).
fn apart(a: f64, b: f64) -> f64 {
    let m = INTERVAL as f64;
    let d = (a - b).rem_euclid(m);
    d.min(m - d)
}

/// Arrivals per second of the interval (by the arrival's place in it), and the busiest second
/// over the mean.
fn spread(times: impl Iterator<Item = f64>) -> (Vec<u32>, f64) {
    let mut bins = vec![0u32; INTERVAL as usize];
    for t in times {
        bins[(t.rem_euclid(INTERVAL as f64) as usize).min(INTERVAL as usize - 1)] += 1;
    }
    let total: u32 = bins.iter().sum();
    let busiest = *bins.iter().max().expect("bins");
    let ratio = f64::from(busiest) * bins.len() as f64 / f64::from(total.max(1));
    (bins, ratio)
}

/// The loops of docs/shaping.md written into `dir` as they are: the Python one as a script, the
/// Go one formatted, vetted and built once for its 50 agents. The script's path and the Go
/// binary's.
fn write_the_loops(go: &Path, dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let (py, go_src, go_bin) = (
        dir.join("heartbeat.py"),
        dir.join("heartbeat.go"),
        dir.join("heartbeat-go"),
    );
    std::fs::write(&py, loop_block("python")).expect("write the Python loop");
    std::fs::write(&go_src, loop_block("go")).expect("write the Go loop");
    // The Go loop as written: formatted, vetted, built once for its 50 agents.
    if let Some(gofmt) = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join("gofmt"))
            .find(|p| p.is_file())
    }) {
        let out = Command::new(gofmt)
            .arg("-l")
            .arg(&go_src)
            .output()
            .expect("gofmt");
        assert!(
            out.status.success() && out.stdout.is_empty(),
            "the Go loop is not gofmt-formatted: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for args in [
        vec!["vet".as_ref(), go_src.as_os_str()],
        vec![
            "build".as_ref(),
            "-o".as_ref(),
            go_bin.as_os_str(),
            go_src.as_os_str(),
        ],
    ] {
        let mut cmd = Command::new(go);
        cmd.args(&args).current_dir(dir);
        if ["GOCACHE", "XDG_CACHE_HOME", "HOME"]
            .iter()
            .all(|v| std::env::var_os(v).is_none())
        {
            // Go keeps its build cache under $HOME: without one, in the temporary directory.
            cmd.env("GOCACHE", dir.join("go-cache"));
        }
        let out = cmd.output().expect("go");
        assert!(
            out.status.success(),
            "go {:?}: {}",
            args[0],
            String::from_utf8_lossy(&out.stderr)
        );
    }
    (py, go_bin)
}

/// The upstream: every request recorded in the log; what it answers set by the mode sent.
async fn start_upstream() -> (
    String,
    watch::Sender<Mode>,
    Log,
    tokio::task::JoinHandle<()>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let upstream = format!("http://{}", listener.local_addr().expect("addr"));
    let (mode, modes) = watch::channel(Mode::Serve);
    let log: Log = Arc::default();
    let accepting = {
        let log = log.clone();
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                tokio::spawn(serve(conn, log.clone(), modes.clone()));
            }
        })
    };
    (upstream, mode, log, accepting)
}

/// The real binary in front of `upstream`, with the `[shaping]` heartbeat route.
fn start_gateway(upstream: &str) -> common::Gateway {
    common::Launch::serve()
        .config_toml(format!(
            "[fleet]\nheartbeat_interval_seconds = {INTERVAL}\nheartbeat_timeout_seconds = {HEARTBEAT_TIMEOUT}\n\n\
             [shaping.upstream]\nlatency_target = \"250ms\"\nerrors_percent = 50\nrecover = \"5s\"\n\n\
             [shaping.routes.heartbeat]\nroutes = [\"POST /api/agent/heartbeat\"]\n\
             interval = \"{INTERVAL}s\"\nmax_interval = \"{MAX_INTERVAL}s\"\npriority = \"critical\"\n"
        ))
        .upstream(upstream)
        .admin()
        .spawn()
}

/// 100 agents, all at once, as a site comes back from an outage: 50 of the Python loop, 50 of
/// the Go one.
fn start_agents(python: &Path, py: &Path, go_bin: &Path, url: &str, dir: &Path) -> Agents {
    let mut agents = Agents(Vec::new());
    for i in 0..AGENTS_PER_LOOP {
        let id = format!("agent-py-{i:02}");
        let child = agent(python, &[py], &id, url, dir);
        agents.0.push((id, child));
        let id = format!("agent-go-{i:02}");
        let child = agent(go_bin, &[], &id, url, dir);
        agents.0.push((id, child));
    }
    agents
}

/// The upstream's stall, timed from the agents' start `t0`: it hangs, then drops every
/// connection, then serves again until the run ends.
async fn stall_the_upstream(t0: Instant, mode: &watch::Sender<Mode>) {
    let at = |s: f64| tokio::time::sleep_until((t0 + Duration::from_secs_f64(s)).into());
    at(STALL_AT).await;
    mode.send_replace(Mode::Hang);
    at(STALL_AT + HANG).await;
    mode.send_replace(Mode::Drop);
    at(STALL_AT + STALL).await;
    mode.send_replace(Mode::Serve);
    at(END).await;
}

/// Every agent still running at the end of the run.
fn assert_every_agent_runs(agents: &mut Agents, dir: &Path) {
    for (id, child) in &mut agents.0 {
        assert!(
            matches!(child.try_wait(), Ok(None)),
            "agent {id} exited: {}",
            std::fs::read_to_string(dir.join(format!("{id}.stderr"))).unwrap_or_default()
        );
    }
}

/// The upstream's log, each arrival timed in seconds since `t0`.
fn read_log(log: &Log, t0: Instant) -> Vec<Arrival> {
    log.lock()
        .expect("log")
        .iter()
        .map(|a| Arrival {
            agent: a.agent.clone(),
            at: a.at.saturating_duration_since(t0).as_secs_f64(),
            admitted: a.admitted,
        })
        .collect()
}

/// The arrivals within the run, by agent; every agent among them.
fn arrivals_by_agent(log: &[Arrival]) -> BTreeMap<String, Vec<Arrival>> {
    let mut by_agent: BTreeMap<String, Vec<Arrival>> = BTreeMap::new();
    for a in log.iter().filter(|a| a.at <= END) {
        by_agent.entry(a.agent.clone()).or_default().push(a.clone());
    }
    assert_eq!(
        by_agent.len(),
        2 * AGENTS_PER_LOOP,
        "every agent reached the upstream, with its id: {:?}",
        by_agent.keys().collect::<Vec<_>>()
    );
    by_agent
}

/// What the agents did, each measured over its own arrivals.
struct Walk {
    /// When the last agent's first heartbeat came.
    started: f64,
    /// The longest any agent went without an admitted heartbeat, and which agent when.
    longest_gap: (f64, String),
    /// The farthest any agent came from its slot outside the stall, and which agent when.
    off_slot: (f64, String),
    /// The fewest and most requests from one agent, and the most from one during the stall.
    fewest: usize,
    most: usize,
    most_in_stall: usize,
    /// Every arrival on a slot: all but each agent's first (the herd's, before it had a hint).
    on_slots: Vec<f64>,
    /// After each request held past an agent's timeout, how long after the timeout it sent
    /// the next (s).
    retries: Vec<f64>,
}

/// Each agent's arrivals walked: online throughout, on its slot, its backoff, its count.
fn walk_the_agents(by_agent: &BTreeMap<String, Vec<Arrival>>) -> Walk {
    let mut started = 0.0f64;
    let mut longest_gap = (0.0f64, String::new());
    let mut off_slot = (0.0f64, String::new());
    let (mut fewest, mut most, mut most_in_stall) = (usize::MAX, 0, 0);
    // Every arrival on a slot: all but each agent's first (the herd's, before it had a hint).
    let mut on_slots = Vec::new();
    let mut retries = Vec::new();
    for (id, arrivals) in by_agent {
        // Online throughout: from its first admitted heartbeat to the end of the run, no agent
        // goes the heartbeat timeout without one.
        let admitted: Vec<f64> = arrivals
            .iter()
            .filter(|a| a.admitted)
            .map(|a| a.at)
            .collect();
        let (first, last) = (admitted[0], admitted[admitted.len() - 1]);
        started = started.max(arrivals[0].at);
        for (from, to) in admitted
            .windows(2)
            .map(|w| (w[0], w[1]))
            .chain([(last, END)])
        {
            if to - from > longest_gap.0 {
                longest_gap = (to - from, format!("{id} from {from:.1} s"));
            }
        }
        assert!(first < STALL_AT, "{id}: first admitted at {first:.1} s");
        // On its slot: its place in the interval is where its second heartbeat came (the first
        // on the slot its first answer named); every later one outside the stall and the
        // longest hint after it falls within 1.5 s of that place.
        let later: Vec<f64> = arrivals[1..].iter().map(|a| a.at).collect();
        let slot = *later
            .first()
            .filter(|&&t| t < STALL_AT)
            .unwrap_or_else(|| panic!("{id}: no second heartbeat before the stall"));
        for &t in later
            .iter()
            .filter(|&&t| !(STALL_AT..BACK_ON_SLOTS).contains(&t))
        {
            let d = apart(t, slot);
            if d > off_slot.0 {
                let place = slot.rem_euclid(INTERVAL as f64);
                off_slot = (d, format!("{id} at {t:.1} s, its slot {place:.1} s"));
            }
        }
        on_slots.extend(later);
        // Backoff: a request the upstream held past the agent's timeout (a failure with no
        // hint, the first after a success) is followed by the next within 2^1 s of the timeout.
        for w in arrivals.windows(2) {
            if (STALL_AT..STALL_AT + HANG - AGENT_TIMEOUT - 0.5).contains(&w[0].at) {
                retries.push(w[1].at - w[0].at - AGENT_TIMEOUT);
            }
        }
        // No hammering.
        fewest = fewest.min(arrivals.len());
        most = most.max(arrivals.len());
        let in_stall = arrivals
            .iter()
            .filter(|a| (STALL_AT..STALL_AT + STALL).contains(&a.at))
            .count();
        most_in_stall = most_in_stall.max(in_stall);
    }
    Walk {
        started,
        longest_gap,
        off_slot,
        fewest,
        most,
        most_in_stall,
        on_slots,
        retries,
    }
}

/// The fleet as a whole: its spread over the interval two whole intervals before the stall and
/// three after (arrivals per second of the interval, the busiest over the mean), and the
/// requests per second right after the stall.
struct Fleet {
    before: (Vec<u32>, f64),
    after: (Vec<u32>, f64),
    recovery: Vec<u32>,
    /// Requests at the upstream during the stall.
    in_stall: usize,
}

fn measure_the_fleet(log: &[Arrival], on_slots: &[f64]) -> Fleet {
    // The fleet's spread over the interval: two whole intervals before the stall, three after.
    let window = |from: f64, to: f64| {
        spread(
            on_slots
                .iter()
                .copied()
                .filter(move |t| (from..to).contains(t)),
        )
    };
    let before = window(STALL_AT - 2.0 * INTERVAL as f64, STALL_AT);
    let after = window(BACK_ON_SLOTS, BACK_ON_SLOTS + 3.0 * INTERVAL as f64);
    // The seconds right after the stall: no herd.
    let stall_end = STALL_AT + STALL;
    let mut recovery = vec![0u32; MAX_INTERVAL as usize];
    for a in log
        .iter()
        .filter(|a| (stall_end..stall_end + MAX_INTERVAL as f64).contains(&a.at))
    {
        recovery[(a.at - stall_end) as usize] += 1;
    }
    let in_stall = log
        .iter()
        .filter(|a| (STALL_AT..stall_end).contains(&a.at))
        .count();
    Fleet {
        before,
        after,
        recovery,
        in_stall,
    }
}

/// The numbers docs/shaping.md gives, printed; the soonest and latest retry after a timeout.
fn print_the_numbers(agents: usize, walk: &Walk, fleet: &Fleet, refused: f64) -> (f64, f64) {
    let Walk {
        started,
        longest_gap,
        off_slot,
        fewest,
        most,
        most_in_stall,
        retries,
        ..
    } = walk;
    let Fleet {
        before: (before, before_ratio),
        after: (after, after_ratio),
        recovery,
        in_stall,
    } = fleet;
    eprintln!(
        "{} agents ({AGENTS_PER_LOOP} Python, {AGENTS_PER_LOOP} Go); interval {INTERVAL} s, max_interval {MAX_INTERVAL} s, heartbeat timeout {HEARTBEAT_TIMEOUT} s, backoff cap {BACKOFF_CAP} s",
        agents
    );
    eprintln!("the last agent's first heartbeat: {started:.1} s after they were started");
    eprintln!(
        "longest without an admitted heartbeat: {:.1} s ({})",
        longest_gap.0, longest_gap.1
    );
    eprintln!(
        "farthest from its slot outside the stall: {:.2} s ({})",
        off_slot.0, off_slot.1
    );
    let (soonest, latest) = retries
        .iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), &d| (lo.min(d), hi.max(d)));
    eprintln!(
        "after a request timed out in the hang, the next came {soonest:.2} to {latest:.2} s after the timeout ({} agents)",
        retries.len()
    );
    eprintln!("arrivals per second of the interval, before the stall: {before:?} (busiest {before_ratio:.2} x the mean)");
    eprintln!("arrivals per second of the interval, after the stall:  {after:?} (busiest {after_ratio:.2} x the mean)");
    eprintln!("requests per second in the {MAX_INTERVAL} s after the stall: {recovery:?}");
    eprintln!(
        "at the upstream during the {STALL} s stall: {in_stall} requests, at most {most_in_stall} from one agent"
    );
    eprintln!(
        "requests per agent in {END} s: {fewest} to {most}; refused by the gateway: {refused}"
    );
    (soonest, latest)
}

/// Online throughout, a jittered backoff after a timeout, on their slots, spread after the
/// stall, and no hammering.
fn assert_the_fleet_kept_its_loops(walk: &Walk, fleet: &Fleet, soonest: f64, latest: f64) {
    let Walk {
        longest_gap,
        off_slot,
        most,
        most_in_stall,
        retries,
        ..
    } = walk;
    let (most, most_in_stall) = (*most, *most_in_stall);
    let (after, after_ratio) = (&fleet.after.0, fleet.after.1);
    assert!(
        longest_gap.0 <= HEARTBEAT_TIMEOUT as f64,
        "an agent went {:.1} s without an admitted heartbeat ({}), past the {HEARTBEAT_TIMEOUT} s heartbeat timeout",
        longest_gap.0,
        longest_gap.1
    );
    assert!(
        retries.len() >= 10,
        "{} requests held past the agents' timeout: the hang did not test the backoff",
        retries.len()
    );
    assert!(
        soonest >= -0.5 && latest <= 3.0,
        "after a timeout with no hint, the next request within [0, 2] s (full jitter over 2^1 s), not {soonest:.2} to {latest:.2} s: {retries:?}"
    );
    assert!(
        latest - soonest >= 1.0,
        "the backoff after a timeout is jittered, spread across its [0, 2] s: {retries:?}"
    );
    assert!(
        off_slot.0 <= 1.5,
        "an agent came {:.2} s from its slot ({})",
        off_slot.0,
        off_slot.1
    );
    assert!(
        after_ratio <= 2.0,
        "after the stall the busiest second of the interval holds {after_ratio:.2} x the mean: {after:?}"
    );
    let cadence_alone = (END / INTERVAL as f64).ceil() as usize + 1;
    assert!(
        most <= 2 * cadence_alone,
        "an agent sent {most} requests in {END} s, more than twice the {cadence_alone} of its cadence"
    );
    assert!(
        most_in_stall <= 2 * (STALL / INTERVAL as f64).ceil() as usize + 2,
        "an agent sent {most_in_stall} requests during the {STALL} s stall"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_agent_loops_keep_100_agents_online_and_on_their_slots_through_a_stall() {
    let Some(python) = common::tool("python3", "apt-get install python3") else {
        return;
    };
    let Some(go) = common::tool("go", "apt-get install golang-go") else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let (py, go_bin) = write_the_loops(&go, dir.path());

    let (upstream, mode, log, accepting) = start_upstream().await;
    let gw = start_gateway(&upstream);
    let url = gw.url("/api/agent/heartbeat");

    // 100 agents, all at once, as a site comes back from an outage.
    let t0 = Instant::now();
    let mut agents = start_agents(&python, &py, &go_bin, &url, dir.path());
    stall_the_upstream(t0, &mode).await;
    let refused = gw
        .metric("fleet_limiter_requests_total{outcome=\"refused\"}")
        .await
        .unwrap_or(0.0);
    assert_every_agent_runs(&mut agents, dir.path());
    drop(agents);
    accepting.abort();
    let log = read_log(&log, t0);

    let by_agent = arrivals_by_agent(&log);
    let walk = walk_the_agents(&by_agent);
    let fleet = measure_the_fleet(&log, &walk.on_slots);
    let (soonest, latest) = print_the_numbers(by_agent.len(), &walk, &fleet, refused);
    assert_the_fleet_kept_its_loops(&walk, &fleet, soonest, latest);
}
