//! `fleet-limiter replay`: access logs through the real decision path, in the logs' own time.
//!
//! Each line becomes the request the gateway would have seen (client address and
//! `X-Forwarded-For` under the configured trusted-proxy rules, method, path, `X-Agent-Id` when
//! the format logs it) and goes through [`Decider::decide`] on a [`MemoryStore`] whose
//! [`ManualClock`] is set from the line's timestamp. Logs are streamed: what stays in memory is
//! the limiter's key state, one entry per principal refused, and the reorder buffer, never the
//! log.
//!
//! Lines reach the decision path through two stages:
//!
//! - **the look-ahead** holds the last [`LOOK_AHEAD`] dated lines. A line that would move the
//!   log's clock (more than the reorder window past the newest line accepted so far) while more
//!   than half of the lines after it are dated more than the window before it is an *outlier*:
//!   accepted, it would make those lines late. It is set aside, counted and named (file, line,
//!   date). A log in order, or out of order by less than the window, never has one.
//! - **the reorder buffer** holds each accepted line until the log's clock is a reorder window
//!   past it, then decides it, so lines out of order by less than the window are replayed in
//!   order. Consecutive identical requests at one instant are one entry with a count, and the
//!   buffer's bytes are bounded ([`REORDER_BUDGET`]): when a log's clock stalls (every line at
//!   the same second, say) the earliest lines are decided before their window closes, and
//!   counted, instead of accumulating the log.
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
use std::collections::{BTreeMap, HashMap, VecDeque};
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
/// Outliers named in the report and on stderr, first come first shown.
pub const SHOWN_OUTLIERS: usize = 5;
/// How many of the lines after a line judge whether it is an outlier.
pub const LOOK_AHEAD: usize = 32;
/// The most the reorder buffer holds, in bytes (requests, their text, and the buffer's own
/// bookkeeping, estimated); past it the earliest lines are decided at once.
pub const REORDER_BUDGET: usize = 16 << 20;
/// What one buffered run costs beside its text: its key and value in the buffer's tree,
/// twice over, because a tree filled in order keeps its nodes about half full.
const RUN_BYTES: usize = 2 * std::mem::size_of::<((UnixNanos, u64), Run)>();
/// The most bins a limiter's plot series keeps; past it, bins are merged into wider ones.
const MAX_PLOT_BINS: usize = 10_080;

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

/// One request as a line gives it.
#[derive(Debug, PartialEq, Eq)]
struct Pending {
    peer: IpAddr,
    method: Box<str>,
    target: Box<str>,
    forwarded: Option<Box<[u8]>>,
    agent_id: Option<Box<str>>,
    user: Option<Box<str>>,
}

impl Pending {
    /// The bytes its text takes on the heap, each allocation rounded up to 16 bytes as an
    /// allocator's size classes do.
    fn text_bytes(&self) -> usize {
        let alloc = |n: usize| n.div_ceil(16) * 16;
        alloc(self.method.len())
            + alloc(self.target.len())
            + self.forwarded.as_ref().map_or(0, |f| alloc(f.len()))
            + self.agent_id.as_ref().map_or(0, |a| alloc(a.len()))
            + self.user.as_ref().map_or(0, |u| alloc(u.len()))
    }
}

/// Consecutive identical requests at one instant of the reorder buffer.
#[derive(Debug)]
struct Run {
    request: Pending,
    count: u64,
}

/// A dated line in the look-ahead, waiting for the lines after it.
#[derive(Debug)]
struct Ahead {
    at: UnixNanos,
    /// Its file, as an index into the report's `files`, and its line number there.
    file: usize,
    line: u64,
    request: Pending,
}

/// A line set aside because the lines after it are dated well before it.
#[derive(Debug, Clone, Serialize)]
pub struct Outlier {
    pub file: String,
    pub line: u64,
    /// Its timestamp, RFC 3339 in UTC.
    pub dated: String,
    /// How far it is ahead of the median of the lines after it.
    pub ahead_seconds: f64,
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
    /// Lines dated well ahead of the lines after them (see the module's documentation); not
    /// replayed.
    pub outliers: u64,
    pub first_outliers: Vec<Outlier>,
    /// Lines decided before their reorder window closed because the reorder buffer was full.
    pub decided_early: u64,
    pub reorder_budget_bytes: usize,
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
    ahead: VecDeque<Ahead>,
    /// Runs by time, then by arrival.
    buffer: BTreeMap<(UnixNanos, u64), Run>,
    seq: u64,
    buffered_bytes: usize,
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
            ahead: VecDeque::with_capacity(LOOK_AHEAD + 1),
            buffer: BTreeMap::new(),
            seq: 0,
            buffered_bytes: 0,
            window: secs(opts.reorder_seconds),
            timeout: secs(cfg.fleet.heartbeat_timeout_seconds.get()),
            limiters: BTreeMap::new(),
            agents: HashMap::new(),
            offline: BTreeMap::new(),
            report: ReplayReport {
                config: cfg.source.clone(),
                reorder_seconds: opts.reorder_seconds,
                reorder_budget_bytes: REORDER_BUDGET,
                identity: if opts.format.logs_agent_ids() {
                    "client address (and X-Agent-Id where logged); verified identity is not in access logs"
                } else {
                    "client address only: this log format has no X-Agent-Id, so agent-keyed limiters see every agent behind an address as one; verified identity is not in access logs"
                },
                offline_threshold_seconds: cfg.fleet.heartbeat_timeout_seconds.get(),
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

    /// Take one parsed line into the look-ahead; the line it pushes out is judged.
    async fn push(&mut self, f: &Fields<'_>, file: usize, line: u64) -> Result<(), Malformed> {
        let at = f.time.ok_or(Malformed::Time)?;
        fn text(b: &[u8]) -> Result<&str, Malformed> {
            std::str::from_utf8(b).map_err(|_| Malformed::Bytes)
        }
        let peer: IpAddr = text(f.addr)?.parse().map_err(|_| Malformed::Address)?;
        let request = Pending {
            peer,
            method: text(f.method)?.into(),
            target: text(f.target)?.into(),
            forwarded: f.forwarded.map(Into::into),
            agent_id: f.agent_id.map(text).transpose()?.map(Into::into),
            user: f.user.map(text).transpose()?.map(Into::into),
        };
        self.ahead.push_back(Ahead {
            at,
            file,
            line,
            request,
        });
        if self.ahead.len() > LOOK_AHEAD {
            if let Some(next) = self.ahead.pop_front() {
                self.judge(next).await;
            }
        }
        Ok(())
    }

    /// Set `x` aside when it would move the clock while most lines after it are dated more
    /// than the reorder window before it; otherwise accept it.
    async fn judge(&mut self, x: Ahead) {
        let moves_clock = self.newest == i64::MIN || x.at > self.newest.saturating_add(self.window);
        let cutoff = x.at.saturating_sub(self.window);
        let after = self.ahead.len();
        let behind = self.ahead.iter().filter(|a| a.at < cutoff).count();
        if moves_clock && behind * 2 > after {
            self.outlier(&x);
        } else {
            self.accept(x.at, x.request).await;
        }
    }

    fn outlier(&mut self, x: &Ahead) {
        self.report.outliers += 1;
        if self.report.first_outliers.len() >= SHOWN_OUTLIERS {
            return;
        }
        let mut after: Vec<UnixNanos> = self.ahead.iter().map(|a| a.at).collect();
        after.sort_unstable();
        let median = after.get(after.len() / 2).copied().unwrap_or(x.at);
        self.report.first_outliers.push(Outlier {
            file: self.report.files.get(x.file).cloned().unwrap_or_default(),
            line: x.line,
            dated: emit::rfc3339(x.at),
            ahead_seconds: secs(x.at.saturating_sub(median)),
        });
    }

    /// Put an accepted line in the reorder buffer and decide what has left its window (or,
    /// with the buffer full, the earliest lines).
    async fn accept(&mut self, at: UnixNanos, request: Pending) {
        if at < self.last_decided || at < self.newest.saturating_sub(self.window) {
            self.report.late += 1;
            return;
        }
        let last_at_this_instant = self
            .buffer
            .range_mut((at, 0)..=(at, u64::MAX))
            .next_back()
            .map(|(_, run)| run);
        match last_at_this_instant {
            Some(run) if run.request == request => run.count += 1,
            _ => {
                self.buffered_bytes += RUN_BYTES + request.text_bytes();
                self.seq += 1;
                self.buffer
                    .insert((at, self.seq), Run { request, count: 1 });
            }
        }
        self.newest = self.newest.max(at);
        let horizon = self.newest.saturating_sub(self.window);
        while let Some(entry) = self.buffer.first_entry() {
            let early = entry.key().0 > horizon;
            if early && self.buffered_bytes <= REORDER_BUDGET {
                break;
            }
            let ((at, _), run) = entry.remove_entry();
            if early {
                self.report.decided_early += run.count;
            }
            self.decide_run(at, run).await;
        }
    }

    async fn decide_run(&mut self, at: UnixNanos, run: Run) {
        self.buffered_bytes = self
            .buffered_bytes
            .saturating_sub(RUN_BYTES + run.request.text_bytes());
        for _ in 0..run.count {
            self.decide(at, &run.request).await;
        }
    }

    async fn decide(&mut self, at: UnixNanos, p: &Pending) {
        let first = *self.first.get_or_insert(at);
        self.last_decided = at;
        self.clock.set(ORIGIN + (at - first).max(0) as Nanos);
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
            let series = t.series.get_or_insert_with(|| Series {
                bin_seconds: PLOT_BIN_SECONDS,
                admitted: Vec::new(),
                refused: Vec::new(),
            });
            record_bounded(series, (at - first).max(0) as Nanos, r.verdict.allowed);
            let who = principal(outcome.client_ip.unwrap_or(p.peer), p, r.spec.key);
            if r.verdict.allowed {
                if let Some(start) = t.open_runs.remove(&who) {
                    let run = at - start;
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
            t.open_runs.entry(who).or_insert(at);
        }
        let is_heartbeat = (&*p.method, path_only) == (traffic::HEARTBEAT.0, traffic::HEARTBEAT.1);
        if let (true, Some(agent)) = (is_heartbeat, &p.agent_id) {
            let hb = self.agents.entry(agent.clone()).or_insert(Heartbeats {
                last_admitted: at,
                refused_since: false,
                worst_gap: 0,
            });
            if refused {
                hb.refused_since = true;
            } else {
                let gap = at - hb.last_admitted;
                if hb.refused_since && gap >= self.timeout {
                    let worst = self.offline.entry(agent.clone()).or_default();
                    *worst = (*worst).max(gap);
                }
                hb.worst_gap = hb.worst_gap.max(gap);
                hb.last_admitted = at;
                hb.refused_since = false;
            }
        }
    }

    /// Decide everything still buffered and close the open runs at the last instant.
    async fn finish(mut self) -> ReplayReport {
        while let Some(next) = self.ahead.pop_front() {
            self.judge(next).await;
        }
        while let Some(((at, _), run)) = self.buffer.pop_first() {
            self.decide_run(at, run).await;
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

/// The bin widths a series widens through, in seconds: each a multiple of the one before.
const WIDER_BINS: [u64; 9] = [60, 300, 600, 1_800, 3_600, 7_200, 21_600, 43_200, 86_400];

/// Count one decision in `series`, merging its bins into wider ones first if `at` lies past
/// [`MAX_PLOT_BINS`] of them, so logs spanning years keep a bounded series.
fn record_bounded(series: &mut Series, at: Nanos, admitted: bool) {
    let ns = NS as Nanos;
    while (at / (series.bin_seconds.max(1) * ns)) as usize >= MAX_PLOT_BINS {
        let now = series.bin_seconds.max(1);
        let wider = WIDER_BINS
            .iter()
            .copied()
            .find(|w| *w > now && w % now == 0)
            .unwrap_or(now * 2);
        let k = (wider / now) as usize;
        let merge = |v: &[u64]| v.chunks(k).map(|c| c.iter().sum()).collect::<Vec<u64>>();
        series.admitted = merge(&series.admitted);
        series.refused = merge(&series.refused);
        series.bin_seconds = wider;
    }
    series.record(at, admitted);
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
    let file = rp.report.files.len().saturating_sub(1);
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
                    Ok(f) => rp.push(&f, file, n).await,
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
/// print the report. Exit 0 when every file was read to its end and most dated lines were
/// replayed, 1 when a file was not read to its end or most dated lines were late or outliers, 2
/// when a configuration or the log format cannot be used.
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
    // Every calibration reads the same lines: what they were is said once.
    if let Some(r) = reports.first().filter(|r| r.outliers > 0) {
        crate::log_sink::eprint_line(format!(
            "fleet-limiter: {} {} set aside as {}, not replayed: dated more than the reorder window past most of the {LOOK_AHEAD} lines after {}",
            r.outliers,
            if r.outliers == 1 { "line" } else { "lines" },
            if r.outliers == 1 { "an outlier" } else { "outliers" },
            if r.outliers == 1 { "it" } else { "each" },
        ));
        for o in &r.first_outliers {
            crate::log_sink::eprint_line(format!("fleet-limiter: {}", report::outlier(o)));
        }
        let more = r.outliers.saturating_sub(r.first_outliers.len() as u64);
        if more > 0 {
            crate::log_sink::eprint_line(format!("fleet-limiter: and {more} more"));
        }
    }
    let mut code = ExitCode::SUCCESS;
    if let Some(r) = reports.first().filter(|r| r.late + r.outliers > r.replayed) {
        crate::log_sink::eprint_line(format!(
            "fleet-limiter: most dated lines were not replayed ({} late, {} outliers, {} replayed): the figures do not describe these logs; put the lines in time order or raise --reorder-seconds",
            r.late, r.outliers, r.replayed
        ));
        code = ExitCode::FAILURE;
    }
    if reports.iter().any(|r| !r.read_errors.is_empty()) {
        for e in reports.iter().take(1).flat_map(|r| &r.read_errors) {
            crate::log_sink::eprint_line(format!("fleet-limiter: {e}"));
        }
        return ExitCode::FAILURE;
    }
    code
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const T0: UnixNanos = emit::START;

    fn replayer(reorder_seconds: u64) -> Replayer {
        let opts = Options {
            format: LineFormat::Alb,
            reorder_seconds,
        };
        let mut rp = Replayer::new(&Config::default(), &opts);
        rp.report.files.push("t.log".into());
        rp
    }

    fn fields(at: UnixNanos, target: &str) -> Fields<'_> {
        Fields {
            addr: b"192.0.2.1",
            time: Some(at),
            method: b"GET",
            target: target.as_bytes(),
            ..Fields::default()
        }
    }

    /// Replay lines dated `at` (seconds after T0), with distinct targets unless `same`.
    fn replay(reorder_seconds: u64, at: &[i64], same: bool) -> ReplayReport {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let mut rp = replayer(reorder_seconds);
            for (i, s) in at.iter().enumerate() {
                let target = if same {
                    "/api/tasks".to_owned()
                } else {
                    format!("/api/tasks?n={i}")
                };
                let f = fields(T0 + s * NS, &target);
                rp.push(&f, 0, i as u64 + 1).await.expect("a good line");
            }
            rp.finish().await
        })
    }

    #[test]
    fn identical_lines_at_one_instant_take_one_entry() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let mut rp = replayer(5);
            for i in 0..20_000u64 {
                rp.push(&fields(T0, "/api/tasks"), 0, i + 1)
                    .await
                    .expect("a good line");
                assert!(rp.buffer.len() <= 1, "{} entries", rp.buffer.len());
            }
            assert!(rp.buffered_bytes < 1024, "{}", rp.buffered_bytes);
            let r = rp.finish().await;
            assert_eq!((r.replayed, r.late, r.decided_early), (20_000, 0, 0));
        });
    }

    #[test]
    fn distinct_lines_at_one_instant_stay_within_the_budget() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let mut rp = replayer(5);
            let one = RUN_BYTES + 64;
            let n = (REORDER_BUDGET / RUN_BYTES) as u64 * 2;
            for i in 0..n {
                let target = format!("/api/tasks?n={i}");
                rp.push(&fields(T0, &target), 0, i + 1)
                    .await
                    .expect("a good line");
                assert!(rp.buffered_bytes <= REORDER_BUDGET + one);
            }
            let r = rp.finish().await;
            assert_eq!(r.replayed, n);
            assert_eq!(r.late, 0);
            assert!(r.decided_early > 0 && r.decided_early < n, "{r:?}");
        });
    }

    #[test]
    fn a_line_far_ahead_is_set_aside_and_named() {
        let far = 74 * 365 * 86_400;
        let mut at = vec![far];
        at.extend(0..100);
        let r = replay(5, &at, false);
        assert_eq!((r.outliers, r.late, r.replayed), (1, 0, 100), "{r:?}");
        let o = &r.first_outliers[0];
        assert_eq!((o.file.as_str(), o.line), ("t.log", 1));
        assert!(o.dated.starts_with("2099-"), "{o:?}");
        assert!(o.ahead_seconds > (far - 100) as f64, "{o:?}");

        // In the middle, a minute ahead, and in a cluster.
        let mut at: Vec<i64> = (0..50).collect();
        at.push(50 + 60);
        at.extend(50..100);
        let r = replay(5, &at, false);
        assert_eq!((r.outliers, r.late, r.replayed), (1, 0, 100), "{r:?}");
        assert_eq!(r.first_outliers[0].line, 51);
        // Ahead by a little more than the window: only the line after it would be late, so it
        // is not set aside and that line is.
        let mut at: Vec<i64> = (0..50).collect();
        at.push(50 + 6);
        at.extend(50..100);
        let r = replay(5, &at, false);
        assert_eq!((r.outliers, r.late, r.replayed), (0, 1, 100), "{r:?}");
        let mut at: Vec<i64> = (0..50).collect();
        at.extend([far; 16]);
        at.extend(50..100);
        let r = replay(5, &at, false);
        assert_eq!((r.outliers, r.late, r.replayed), (16, 0, 100), "{r:?}");
        assert_eq!(r.first_outliers.len(), SHOWN_OUTLIERS);
        // Past half the look-ahead, a run of lines is the log's own time: the rest is late.
        let mut at: Vec<i64> = (0..50).collect();
        at.extend([far; LOOK_AHEAD / 2 + 1]);
        at.extend(50..100);
        let r = replay(5, &at, false);
        assert!(r.late > 0, "{r:?}");
    }

    #[test]
    fn lines_before_the_clock_are_late_not_outliers() {
        let mut at: Vec<i64> = (100..200).collect();
        at.insert(50, 0);
        let r = replay(5, &at, false);
        assert_eq!((r.outliers, r.late, r.replayed), (0, 1, 100), "{r:?}");
    }

    proptest! {
        /// A log in order, or out of order by less than the window, whatever its gaps, replays
        /// every line: no outlier, nothing late.
        #[test]
        fn a_log_within_its_window_loses_no_line(
            steps in prop::collection::vec(
                prop_oneof![Just(0i64), 0i64..3, 0i64..120, 3_600i64..200_000],
                1..200,
            ),
            jitter in prop::collection::vec(0i64..=5, 200),
        ) {
            let mut t = 0;
            let at: Vec<i64> = steps
                .iter()
                .zip(&jitter)
                .map(|(s, j)| {
                    t += s;
                    t - j
                })
                .collect();
            let n = at.len() as u64;
            for same in [false, true] {
                let r = replay(5, &at, same);
                prop_assert_eq!((r.outliers, r.late, r.replayed), (0, 0, n), "{:?}", at);
            }
        }
    }

    #[test]
    fn a_series_over_decades_stays_bounded_and_keeps_its_counts() {
        let mut s = Series {
            bin_seconds: PLOT_BIN_SECONDS,
            admitted: Vec::new(),
            refused: Vec::new(),
        };
        let year = 365 * 86_400 * NS as Nanos;
        for (i, at) in [0, 59, 3_600, 86_400 * 30, 0].iter().enumerate() {
            record_bounded(&mut s, *at * NS as Nanos, i % 2 == 0);
        }
        record_bounded(&mut s, 200 * year, false);
        assert!(s.admitted.len() <= MAX_PLOT_BINS, "{}", s.admitted.len());
        assert_eq!(s.admitted.len(), s.refused.len());
        assert_eq!(s.admitted.iter().sum::<u64>(), 3);
        assert_eq!(s.refused.iter().sum::<u64>(), 3);
        assert_eq!(s.bin_seconds % 86_400, 0, "{}", s.bin_seconds);
    }
}
