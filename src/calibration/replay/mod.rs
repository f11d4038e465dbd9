//! `fleet-limiter replay`: access logs through the real decision path, in the logs' own time.
//!
//! Each line becomes the request the gateway would have seen (client address and
//! `X-Forwarded-For` under the configured trusted-proxy rules, method, path, `X-Agent-Id` when
//! the format logs it) and goes through [`Decider::decide`] on a [`MemoryStore`] whose
//! [`ManualClock`] is set from the line's timestamp. Logs are streamed: what stays in memory is
//! the limiter's key state and one entry per principal refused, never the log.
//!
//! Verified identity is not in access logs: a token's owner cannot be recovered from a line, so
//! the `Authorization` header is never replayed and requests a verified user would have been
//! metered for are metered by client address instead. `$remote_user`, when logged, is shown
//! beside the address but does not key a bucket.

pub mod alb;
pub mod emit;
pub mod input;
pub mod json;
pub mod line;
pub mod nginx;
pub mod report;
pub mod time;

use crate::calibration::simulate::{Series, SimVerifier};
use crate::calibration::traffic;
use crate::clock::{ManualClock, Nanos};
use crate::config::Config;
use crate::decision::{Decider, RequestFacts};
use crate::keys::KeyKind;
use crate::path::CanonicalPath;
use crate::policy::Mode;
use crate::store::memory::MemoryStore;
use line::{Fields, Malformed};
use serde::Serialize;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::io::IsTerminal;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use time::UnixNanos;

const NS: i64 = 1_000_000_000;
/// The bins `--plot` counts requests in, before it merges them to fit the page.
const PLOT_BIN_SECONDS: u64 = 60;
/// Virtual time starts an hour after the clock's zero, as in `simulate`.
const ORIGIN: Nanos = 3_600 * NS as Nanos;
/// Malformed lines shown in the report, first come first shown.
pub const SHOWN_MALFORMED: usize = 5;
/// Principals listed per limiter, most refused first.
pub const SHOWN_PRINCIPALS: usize = 10;

/// The layout of a log's lines.
#[derive(Debug, Clone)]
pub enum LineFormat {
    /// nginx `combined` (and Express `morgan` combined), or any nginx `log_format` string.
    Nginx(nginx::Format),
    /// AWS Application Load Balancer access logs.
    Alb,
    /// One JSON object per line, its fields named by a mapping.
    Json(json::Mapping),
}

impl LineFormat {
    /// `combined`, `alb`, `json`, `json:key=field,...`, or an nginx `log_format` string.
    pub fn parse(spec: &str) -> Result<Self, String> {
        let s = spec.trim();
        if s.eq_ignore_ascii_case("combined") || s.eq_ignore_ascii_case("morgan") {
            nginx::Format::compile(nginx::COMBINED).map(LineFormat::Nginx)
        } else if s.eq_ignore_ascii_case("alb") {
            Ok(LineFormat::Alb)
        } else if s == "json" || s.starts_with("json:") {
            json::Mapping::parse(s).map(LineFormat::Json)
        } else {
            nginx::Format::compile(s).map(LineFormat::Nginx)
        }
    }

    /// Whether lines in this format can name the agent (`X-Agent-ID`).
    pub fn logs_agent_ids(&self) -> bool {
        match self {
            LineFormat::Nginx(f) => f.logs_agent_ids(),
            LineFormat::Alb => false,
            LineFormat::Json(_) => true,
        }
    }

    fn read<'a>(
        &self,
        line: &'a [u8],
        scratch: &'a mut serde_json::Map<String, serde_json::Value>,
    ) -> Result<Fields<'a>, Malformed> {
        match self {
            LineFormat::Nginx(f) => f.parse(line),
            LineFormat::Alb => alb::parse(line),
            LineFormat::Json(m) => m.read(line, scratch),
        }
    }
}

/// How to read the logs.
#[derive(Debug, Clone)]
pub struct Options {
    pub format: LineFormat,
    /// How far out of order timestamps may arrive, in seconds.
    pub reorder_seconds: u64,
}

/// One request waiting in the reorder buffer.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Pending {
    at: UnixNanos,
    seq: u64,
    peer: IpAddr,
    method: Box<str>,
    target: Box<str>,
    forwarded: Option<Box<[u8]>>,
    agent_id: Option<Box<str>>,
    user: Option<Box<str>>,
}

/// A line that was not replayed.
#[derive(Debug, Clone, Serialize)]
pub struct BadLine {
    pub file: String,
    pub line: u64,
    pub reason: &'static str,
}

/// What one limiter did over the logs.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LimiterReport {
    pub name: String,
    pub mode: &'static str,
    pub metered: u64,
    pub refused: u64,
    pub shadow_refused: u64,
    /// Principals refused most (enforced or shadow), as the logs name them.
    pub top_refused: Vec<(String, u64)>,
    /// The longest time one principal went from a refusal to its next admitted request.
    pub longest_refusal_run_seconds: f64,
    pub longest_refusal_run_principal: Option<String>,
    /// Admitted and refused per minute since the first line (drawn by `--plot`, not printed).
    #[serde(skip)]
    pub series: Series,
}

/// An agent whose heartbeats would have gone unanswered past the offline threshold.
#[derive(Debug, Clone, Serialize)]
pub struct OfflineAgent {
    pub agent_id: String,
    pub longest_gap_seconds: f64,
}

/// Everything `replay` reports for one calibration.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ReplayReport {
    pub config: Option<PathBuf>,
    pub files: Vec<String>,
    pub lines: u64,
    pub replayed: u64,
    pub refused: u64,
    pub malformed: u64,
    pub malformed_by_reason: BTreeMap<&'static str, u64>,
    pub first_malformed: Vec<BadLine>,
    /// Lines whose timestamp was older than the reorder window allowed; not replayed.
    pub late: u64,
    pub reorder_seconds: u64,
    /// Files that could not be read to their end (unreadable, truncated or corrupt gzip).
    pub read_errors: Vec<String>,
    pub span_seconds: f64,
    /// Requests keyed by client address because the logs cannot show a verified identity.
    pub identity: &'static str,
    pub offline_threshold_seconds: u64,
    pub agents_seen: u64,
    pub agents_offline: Vec<OfflineAgent>,
    pub limiters: Vec<LimiterReport>,
}

#[derive(Default)]
struct LimiterTally {
    mode: &'static str,
    metered: u64,
    refused: u64,
    shadow_refused: u64,
    by_principal: HashMap<Box<str>, u64>,
    /// Principals refused since their last admitted request: when the run started.
    open_runs: HashMap<Box<str>, UnixNanos>,
    longest: (i64, Option<Box<str>>),
    /// Admitted and refused (enforced or shadow) per minute of the logs, for `--plot`.
    series: Option<Series>,
}

#[derive(Clone, Copy)]
struct Heartbeats {
    last_admitted: UnixNanos,
    refused_since: bool,
    worst_gap: i64,
}

/// The replay's state: the decision path, the reorder buffer, and the tallies.
struct Replayer {
    clock: ManualClock,
    decider: Decider,
    first: Option<UnixNanos>,
    last_decided: UnixNanos,
    newest: UnixNanos,
    buffer: BinaryHeap<Reverse<Pending>>,
    seq: u64,
    window: i64,
    timeout: i64,
    limiters: BTreeMap<Arc<str>, LimiterTally>,
    agents: HashMap<Box<str>, Heartbeats>,
    offline: BTreeMap<Box<str>, i64>,
    report: ReplayReport,
}

/// A principal as the logs name it: the client address, with the agent id for `ip+agent`
/// limiters and the logged user where there is one.
fn principal(ip: IpAddr, p: &Pending, kind: KeyKind) -> Box<str> {
    match (kind, &p.agent_id, &p.user) {
        (KeyKind::IpAgent, Some(a), _) => format!("{ip} agent {a}").into(),
        (KeyKind::IpAgent, None, _) => format!("{ip} no agent id").into(),
        (_, _, Some(u)) => format!("{ip} user {u}").into(),
        _ => ip.to_string().into(),
    }
}

impl Replayer {
    fn new(cfg: &Config, opts: &Options) -> Self {
        let clock = ManualClock::new(ORIGIN);
        let store = MemoryStore::new(cfg.store.max_keys.max(100_000), Arc::new(clock.clone()));
        let secs = |s: u64| (s.min(10 * 365 * 86_400) as i64) * NS;
        Self {
            decider: Decider::new(cfg, Arc::new(store), Arc::new(SimVerifier)),
            clock,
            first: None,
            last_decided: i64::MIN,
            newest: i64::MIN,
            buffer: BinaryHeap::new(),
            seq: 0,
            window: secs(opts.reorder_seconds),
            timeout: secs(cfg.fleet.heartbeat_timeout_seconds),
            limiters: BTreeMap::new(),
            agents: HashMap::new(),
            offline: BTreeMap::new(),
            report: ReplayReport {
                config: cfg.source.clone(),
                reorder_seconds: opts.reorder_seconds,
                identity: if opts.format.logs_agent_ids() {
                    "client address (and X-Agent-Id where logged); verified identity is not in access logs"
                } else {
                    "client address only: this log format has no X-Agent-Id, so agent-keyed limiters see every agent behind an address as one; verified identity is not in access logs"
                },
                offline_threshold_seconds: cfg.fleet.heartbeat_timeout_seconds,
                ..ReplayReport::default()
            },
        }
    }

    fn malformed(&mut self, file: &str, line: u64, why: Malformed) {
        self.report.malformed += 1;
        *self
            .report
            .malformed_by_reason
            .entry(why.describe())
            .or_default() += 1;
        if self.report.first_malformed.len() < SHOWN_MALFORMED {
            self.report.first_malformed.push(BadLine {
                file: file.to_owned(),
                line,
                reason: why.describe(),
            });
        }
    }

    /// Take one parsed line into the reorder buffer, deciding what has left its window.
    async fn push(&mut self, f: &Fields<'_>) -> Result<(), Malformed> {
        let at = f.time.ok_or(Malformed::Time)?;
        fn text(b: &[u8]) -> Result<&str, Malformed> {
            std::str::from_utf8(b).map_err(|_| Malformed::Bytes)
        }
        let peer: IpAddr = text(f.addr)?.parse().map_err(|_| Malformed::Address)?;
        if at < self.last_decided || at < self.newest.saturating_sub(self.window) {
            self.report.late += 1;
            return Ok(());
        }
        self.seq += 1;
        self.buffer.push(Reverse(Pending {
            at,
            seq: self.seq,
            peer,
            method: text(f.method)?.into(),
            target: text(f.target)?.into(),
            forwarded: f.forwarded.map(Into::into),
            agent_id: f.agent_id.map(text).transpose()?.map(Into::into),
            user: f.user.map(text).transpose()?.map(Into::into),
        }));
        self.newest = self.newest.max(at);
        while let Some(Reverse(p)) = self.buffer.peek() {
            if p.at > self.newest - self.window {
                break;
            }
            if let Some(Reverse(p)) = self.buffer.pop() {
                self.decide(p).await;
            }
        }
        Ok(())
    }

    async fn decide(&mut self, p: Pending) {
        let first = *self.first.get_or_insert(p.at);
        self.last_decided = p.at;
        self.clock.set(ORIGIN + (p.at - first).max(0) as Nanos);
        let path_only = p.target.split(['?', '#']).next().unwrap_or("/");
        let rules = self.decider.settings().paths;
        let Ok(path) = CanonicalPath::parse(path_only, rules) else {
            // The gateway refuses such a path before any limiter; nothing is metered.
            self.report.replayed += 1;
            return;
        };
        let forwarded: Vec<&[u8]> = p.forwarded.as_deref().into_iter().collect();
        let facts = RequestFacts {
            peer: p.peer,
            method: &p.method,
            path,
            forwarded: &forwarded,
            agent_id: p.agent_id.as_deref().map(str::as_bytes),
            authorization: None,
            session_token: None,
            key_headers: crate::decision::KeyHeaders::default(),
        };
        let outcome = self.decider.decide(&facts).await;
        self.report.replayed += 1;
        let refused = outcome.refused();
        if refused {
            self.report.refused += 1;
        }
        for r in &outcome.results {
            let t = self.limiters.entry(r.spec.name.clone()).or_default();
            t.mode = match r.spec.mode {
                Mode::Enforce => "enforce",
                Mode::Shadow => "shadow",
                Mode::Off => "off",
            };
            t.metered += 1;
            t.series
                .get_or_insert_with(|| Series {
                    bin_seconds: PLOT_BIN_SECONDS,
                    admitted: Vec::new(),
                    refused: Vec::new(),
                })
                .record((p.at - first).max(0) as Nanos, r.verdict.allowed);
            let who = principal(outcome.client_ip.unwrap_or(p.peer), &p, r.spec.key);
            if r.verdict.allowed {
                if let Some(start) = t.open_runs.remove(&who) {
                    let run = p.at - start;
                    if run > t.longest.0 {
                        t.longest = (run, Some(who));
                    }
                }
                continue;
            }
            if r.spec.mode == Mode::Enforce {
                t.refused += 1;
            } else {
                t.shadow_refused += 1;
            }
            *t.by_principal.entry(who.clone()).or_default() += 1;
            t.open_runs.entry(who).or_insert(p.at);
        }
        let is_heartbeat = (&*p.method, path_only) == (traffic::HEARTBEAT.0, traffic::HEARTBEAT.1);
        if let (true, Some(agent)) = (is_heartbeat, &p.agent_id) {
            let hb = self.agents.entry(agent.clone()).or_insert(Heartbeats {
                last_admitted: p.at,
                refused_since: false,
                worst_gap: 0,
            });
            if refused {
                hb.refused_since = true;
            } else {
                let gap = p.at - hb.last_admitted;
                if hb.refused_since && gap >= self.timeout {
                    let worst = self.offline.entry(agent.clone()).or_default();
                    *worst = (*worst).max(gap);
                }
                hb.worst_gap = hb.worst_gap.max(gap);
                hb.last_admitted = p.at;
                hb.refused_since = false;
            }
        }
    }

    /// Decide everything still buffered and close the open runs at the last instant.
    async fn finish(mut self) -> ReplayReport {
        while let Some(Reverse(p)) = self.buffer.pop() {
            self.decide(p).await;
        }
        let end = self.last_decided;
        for (agent, hb) in &self.agents {
            let gap = end - hb.last_admitted;
            if hb.refused_since && gap >= self.timeout {
                let worst = self.offline.entry(agent.clone()).or_default();
                *worst = (*worst).max(gap);
            }
        }
        let mut r = self.report;
        r.span_seconds = self.first.map_or(0.0, |f| secs(end - f));
        r.agents_seen = self.agents.len() as u64;
        r.agents_offline = self
            .offline
            .into_iter()
            .map(|(agent_id, gap)| OfflineAgent {
                agent_id: agent_id.into(),
                longest_gap_seconds: secs(gap),
            })
            .collect();
        for (name, mut t) in self.limiters {
            for (who, start) in t.open_runs.drain() {
                let run = end - start;
                if run > t.longest.0 || (run == t.longest.0 && t.longest.1.is_none()) {
                    t.longest = (run, Some(who));
                }
            }
            let mut top: Vec<(String, u64)> = t
                .by_principal
                .into_iter()
                .map(|(k, n)| (k.into(), n))
                .collect();
            top.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            top.truncate(SHOWN_PRINCIPALS);
            r.limiters.push(LimiterReport {
                name: name.to_string(),
                mode: t.mode,
                metered: t.metered,
                refused: t.refused,
                shadow_refused: t.shadow_refused,
                top_refused: top,
                longest_refusal_run_seconds: secs(t.longest.0),
                longest_refusal_run_principal: t.longest.1.map(Into::into),
                series: t.series.unwrap_or_default(),
            });
        }
        r
    }
}

fn secs(ns: i64) -> f64 {
    (ns as f64 / NS as f64 * 10.0).round() / 10.0
}

/// Shows lines per second and how much of the file is left, on a terminal only.
struct Progress {
    on: bool,
    started: std::time::Instant,
}

impl Progress {
    fn show(&self, lines: u64, log: &input::Log, name: &str) {
        if !self.on {
            return;
        }
        let elapsed = self.started.elapsed().as_secs_f64().max(1e-3);
        let read = log.read.load(Ordering::Relaxed);
        let rate = read as f64 / elapsed;
        let left = if log.size > read && rate > 0.0 {
            format!(", about {:.0} s left", (log.size - read) as f64 / rate)
        } else {
            String::new()
        };
        eprint!(
            "\rfleet-limiter replay: {name}: {lines} lines, {:.0} lines/s{left}   ",
            lines as f64 / elapsed
        );
    }
}

/// Replay `logs` through `cfg`.
pub fn run(cfg: &Config, opts: &Options, logs: &[PathBuf]) -> anyhow::Result<ReplayReport> {
    let rt = tokio::runtime::Builder::new_current_thread().build()?;
    rt.block_on(async {
        let mut rp = Replayer::new(cfg, opts);
        let progress = Progress {
            on: std::io::stderr().is_terminal(),
            started: std::time::Instant::now(),
        };
        let mut buf = Vec::with_capacity(4096);
        for path in logs {
            let name = path.display().to_string();
            rp.report.files.push(name.clone());
            if let Err(e) = replay_file(&mut rp, opts, path, &name, &mut buf, &progress).await {
                rp.report.read_errors.push(format!("{name}: {e}"));
            }
        }
        if progress.on {
            eprintln!();
        }
        Ok(rp.finish().await)
    })
}

async fn replay_file(
    rp: &mut Replayer,
    opts: &Options,
    path: &Path,
    name: &str,
    buf: &mut Vec<u8>,
    progress: &Progress,
) -> std::io::Result<()> {
    let mut log = input::open(path)?;
    let mut n = 0u64;
    let mut scratch = serde_json::Map::new();
    loop {
        let got = input::next_line(&mut *log.reader, buf).map_err(|e| {
            let what = if log.gzip { "gzip stream" } else { "file" };
            std::io::Error::new(e.kind(), format!("{what} unreadable after line {n}: {e}"))
        })?;
        n += 1;
        match got {
            input::Line::End => return Ok(()),
            input::Line::TooLong => {
                rp.report.lines += 1;
                rp.malformed(name, n, Malformed::TooLong);
            }
            input::Line::Text => {
                rp.report.lines += 1;
                let res = match opts.format.read(buf, &mut scratch) {
                    Ok(f) => rp.push(&f).await,
                    Err(e) => Err(e),
                };
                if let Err(why) = res {
                    rp.malformed(name, n, why);
                }
            }
        }
        if n.is_multiple_of(1 << 18) {
            progress.show(rp.report.lines, &log, name);
        }
    }
}

/// `fleet-limiter replay`: replay the logs through one calibration, or two with `against`, and
/// print the report. Exit 0 when every file was read to its end, 1 when one was not, 2 when a
/// configuration or the log format cannot be used.
pub fn run_replay(
    loader: crate::config::Loader,
    against: Option<crate::config::Loader>,
    log_format: Option<&str>,
    reorder_seconds: u64,
    logs: &[PathBuf],
    format: crate::calibration::report::Format,
    plot: Option<&Path>,
) -> std::process::ExitCode {
    use crate::calibration::report::Format as Out;
    use std::process::ExitCode;
    let fail = |msg: String| {
        crate::log_sink::eprint_line(format!("fleet-limiter: {msg}"));
        ExitCode::from(2)
    };
    let opts = match LineFormat::parse(log_format.unwrap_or("combined")) {
        Ok(f) => Options {
            format: f,
            reorder_seconds,
        },
        Err(e) => return fail(format!("--log-format: {e}")),
    };
    // The plot's file is checked before the run, so a typo costs nothing.
    let created = match plot.map(crate::calibration::plot_target).transpose() {
        Ok(c) => c.unwrap_or(false),
        Err(e) => return fail(format!("--plot: {e}")),
    };
    let drop_plot = || {
        if let (Some(path), true) = (plot, created) {
            let _ = std::fs::remove_file(path);
        }
    };
    let mut reports = Vec::new();
    for l in std::iter::once(loader).chain(against) {
        let cfg = match l.load() {
            Ok(c) => c,
            Err(e) => {
                drop_plot();
                return fail(format!("configuration error: {e}"));
            }
        };
        match run(&cfg, &opts, logs) {
            Ok(r) => reports.push(r),
            Err(e) => {
                drop_plot();
                crate::log_sink::eprint_line(format!("fleet-limiter: {e}"));
                return ExitCode::FAILURE;
            }
        }
    }
    let text = match (format, reports.as_slice()) {
        (Out::Json, [one]) => crate::calibration::report::json(one),
        (Out::Json, many) => crate::calibration::report::json(&many),
        (Out::Table, [a, b]) => report::side_by_side(a, b),
        (Out::Table, _) => reports
            .iter()
            .map(report::table)
            .collect::<Vec<_>>()
            .join("\n"),
    };
    crate::log_sink::print(&text);
    if let Some(path) = plot {
        let refs: Vec<&ReplayReport> = reports.iter().collect();
        if let Err(e) = std::fs::write(path, crate::calibration::plot::replay_svg(&refs)) {
            crate::log_sink::eprint_line(format!(
                "fleet-limiter: cannot write the plot to {}: {e}",
                path.display()
            ));
            return ExitCode::FAILURE;
        }
        crate::log_sink::eprint_line(format!("fleet-limiter: plot written to {}", path.display()));
    }
    if reports.iter().any(|r| !r.read_errors.is_empty()) {
        for e in reports.iter().take(1).flat_map(|r| &r.read_errors) {
            crate::log_sink::eprint_line(format!("fleet-limiter: {e}"));
        }
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
