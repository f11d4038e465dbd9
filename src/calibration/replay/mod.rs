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
//! The window defaults to [`DEFAULT_REORDER_SECONDS`], enough for logs written as requests
//! complete. Whatever was not replayed is summarised ([`summary`]): each reason with its count,
//! its share and the option that fixes it, measured from the log's own disorder.
//!
//! Verified identity is not in access logs: a token's owner cannot be recovered from a line, so
//! the `Authorization` header is never replayed and requests a verified user would have been
//! metered for are metered by client address instead. `$remote_user`, when logged, is shown
//! beside the address but does not key a bucket.

pub(crate) mod alb;
mod cli;
mod decide;
pub(crate) mod emit;
pub(crate) mod input;
pub(crate) mod json;
pub(crate) mod line;
pub(crate) mod nginx;
mod reorder;
pub(crate) mod report;
pub(crate) mod summary;
#[cfg(test)]
mod tests;
pub(crate) mod time;

use crate::calibration::simulate::{Series, SimVerifier};
use crate::calibration::traffic;
use crate::clock::{ManualClock, Nanos};
use crate::config::Config;
use crate::decision::{Decider, RequestFacts};
use crate::keys::KeyKind;
use crate::path::CanonicalPath;
use crate::policy::Mode;
use crate::store::memory::MemoryStore;
pub use cli::run_replay;
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
const PLOT_BIN_SECONDS: std::num::NonZeroU64 = std::num::NonZeroU64::new(60).unwrap();
/// Virtual time before the first line: an hour after the clock's zero. From the first line on
/// it is the lines' own time (ns since the Unix epoch), so calendar windows fall on the days
/// the log was written.
const ORIGIN: Nanos = 3_600 * NS as Nanos;
/// Malformed lines shown in the report, first come first shown.
pub(crate) const SHOWN_MALFORMED: usize = 5;
/// Principals listed per limiter, most refused first.
pub(crate) const SHOWN_PRINCIPALS: usize = 10;
/// Outliers named in the report and on stderr, first come first shown.
pub(crate) const SHOWN_OUTLIERS: usize = 5;
/// How many of the lines after a line judge whether it is an outlier.
pub(crate) const LOOK_AHEAD: usize = 32;
/// The reorder window when `--reorder-seconds` is not given: twice the 60 s request timeout
/// most servers and proxies default to (Apache `Timeout`, nginx `proxy_read_timeout`, an ALB's
/// idle timeout). A server that logs a request when it completes, stamped with the time it
/// arrived (Apache `%t`), writes it up to its timeout after the requests that arrived later;
/// twice that covers a request that waited out one timeout sending its body and another for
/// the upstream's answer.
pub const DEFAULT_REORDER_SECONDS: u64 = 120;
/// The most the reorder buffer holds, in bytes (requests, their text, and the buffer's own
/// bookkeeping, estimated); past it the earliest lines are decided at once. 64 MiB holds the
/// default window's 120 s at about 1 600 distinct requests a second.
pub(crate) const REORDER_BUDGET: usize = 64 << 20;
/// Lines out of order by more than this are not a reorder window's business: a clock set
/// wrong, or files given out of order. No `--reorder-seconds` is suggested for them.
pub(crate) const FAR_SECONDS: i64 = 3_600;
/// Malformed lines kept to try the other built-in formats on, and the longest one kept.
const SAMPLED_MALFORMED: usize = 64;
const SAMPLED_LINE_BYTES: usize = 8 * 1024;
/// What one buffered run costs beside its text: its key and value in the buffer's tree,
/// twice over, because a tree filled in order keeps its nodes about half full.
const RUN_BYTES: usize = 2 * std::mem::size_of::<((UnixNanos, u64), Run)>();
/// The most bins a limiter's plot series keeps; past it, bins are merged into wider ones.
const MAX_PLOT_BINS: usize = 10_080;

/// The layout of a log's lines.
#[derive(Debug, Clone)]
pub(crate) enum LineFormat {
    /// nginx `combined` (and Express `morgan` combined), or any nginx `log_format` string.
    Nginx(nginx::Format),
    /// AWS Application Load Balancer access logs.
    Alb,
    /// One JSON object per line, its fields named by a mapping.
    Json(json::Mapping),
}

impl LineFormat {
    /// `combined`, `alb`, `json`, `json:key=field,...`, or an nginx `log_format` string.
    pub(crate) fn parse(spec: &str) -> Result<Self, String> {
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
    pub(crate) fn logs_agent_ids(&self) -> bool {
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
pub(crate) struct Options {
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
pub(crate) struct Outlier {
    pub file: String,
    pub line: u64,
    /// Its timestamp, RFC 3339 in UTC.
    pub dated: String,
    /// How far it is ahead of the median of the lines after it.
    pub ahead_seconds: f64,
}

/// A line that was not replayed.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct BadLine {
    pub file: String,
    pub line: u64,
    pub reason: &'static str,
}

/// What one limiter did over the logs.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct LimiterReport {
    pub name: String,
    pub mode: &'static str,
    pub metered: u64,
    pub refused: u64,
    pub shadow_refused: u64,
    /// Principals refused most (enforced or shadow), as the logs name them.
    pub top_refused: Vec<(String, u64)>,
    /// The longest lockout: the time one principal went from a refusal to its next admitted
    /// request, when that request came within the limiter's window (or the last refusal's
    /// Retry-After, when longer) of the run's last refusal: the principal was still asking.
    /// Runs no admitted request ended, or ended only when the principal came back later, are in
    /// `unfinished_refusal_runs`, not here.
    pub longest_refusal_run_seconds: f64,
    pub longest_refusal_run_principal: Option<String>,
    /// Refusal runs still open when the logs end: the principal's last request was refused.
    pub unfinished_refusal_runs: UnfinishedRuns,
    /// Admitted and refused per minute since the first line (drawn by `--plot`, not printed).
    #[serde(skip)]
    pub series: Series,
}

/// Refusal runs no admitted request ended.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct UnfinishedRuns {
    /// Last refused within the limiter's window of the logs' end: still refused when they end.
    pub still_refused_at_end: u64,
    /// Last refused longer than the limiter's window before the logs' end: the client never
    /// came back, so whether it would have been locked out is unknown.
    pub never_seen_again: u64,
    /// Left while refused and admitted on its return, more than the limiter's window (or the
    /// last refusal's Retry-After) after its last refusal: nothing shows it was kept out.
    pub returned_later: u64,
    /// The one refused longest, from its first refusal to its last refused request.
    pub longest: Option<UnfinishedRun>,
}

impl UnfinishedRuns {
    /// How many runs, of every kind.
    pub(crate) fn total(&self) -> u64 {
        self.still_refused_at_end + self.never_seen_again + self.returned_later
    }
}

/// One refusal run no admitted request ended.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct UnfinishedRun {
    pub principal: String,
    /// From the run's first refusal to its last refused request.
    pub refused_for_seconds: f64,
    /// `still refused at the end of the log` or `last request refused, never seen again`.
    pub ends: &'static str,
}

pub(crate) const STILL_REFUSED: &str = "still refused at the end of the log";
pub(crate) const NEVER_SEEN_AGAIN: &str = "last request refused, never seen again";
pub(crate) const RETURNED_LATER: &str = "left refused, admitted when it came back after the window";

/// An agent whose heartbeats would have gone unanswered past the offline threshold.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct OfflineAgent {
    pub agent_id: String,
    pub longest_gap_seconds: f64,
}

/// Everything `replay` reports for one calibration.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct ReplayReport {
    pub config: Option<PathBuf>,
    pub files: Vec<String>,
    pub lines: u64,
    pub replayed: u64,
    /// Lines read but not replayed (late, outliers, malformed), and their share of the lines.
    pub not_replayed: u64,
    pub not_replayed_percent: f64,
    /// The share of lines `--max-skipped` lets go unreplayed before the exit status is 1.
    pub max_skipped_percent: f64,
    /// Every reason lines were skipped or decided early: count, share, why, and the fix.
    pub skipped: Vec<summary::Skipped>,
    pub refused: u64,
    /// Replayed requests at least one limiter metered, those none did, and the latter's share.
    pub matched: u64,
    pub unmetered: u64,
    pub unmetered_percent: f64,
    /// Said when no replayed request matched any limiter of the calibration.
    pub no_limiter_matched: Option<String>,
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
    /// Agents whose last heartbeat in the logs was refused: offline only when their refused
    /// heartbeats alone spanned the threshold, since nothing shows whether they came back.
    pub agents_last_heartbeat_refused: u64,
    pub limiters: Vec<LimiterReport>,
    /// What the summary's fixes are computed from.
    #[serde(skip)]
    pub seen: summary::Seen,
}

#[derive(Default)]
struct LimiterTally {
    mode: &'static str,
    metered: u64,
    refused: u64,
    shadow_refused: u64,
    by_principal: HashMap<Box<str>, u64>,
    /// Principals refused since their last admitted request.
    open_runs: HashMap<Box<str>, OpenRun>,
    /// Runs an admitted request ended only after the principal stayed away (not lockouts):
    /// their principal and length, first refusal to last.
    returned_later: Vec<(Box<str>, i64)>,
    /// The limiter's window: a run last refused within it of the logs' end is still refused.
    window: i64,
    longest: (i64, Option<Box<str>>),
    /// Admitted and refused (enforced or shadow) per minute of the logs, for `--plot`.
    series: Option<Series>,
}

/// A principal's refusals since its last admitted request.
#[derive(Clone, Copy)]
struct OpenRun {
    /// The run's first refusal.
    start: UnixNanos,
    /// Its last refusal.
    last: UnixNanos,
    /// The wait the last refusal announced (nanoseconds).
    retry_after: i64,
}

impl OpenRun {
    /// Whether an admitted request at `at` ends this run as a lockout: it came within the
    /// limiter's `window`, or the last refusal's Retry-After when longer, of the last refusal,
    /// so the principal was still asking. Later, it had stopped asking and came back.
    fn ended_by(&self, at: UnixNanos, window: i64) -> bool {
        at - self.last <= window.max(self.retry_after)
    }
}

#[derive(Clone, Copy)]
struct Heartbeats {
    last_admitted: UnixNanos,
    last_seen: UnixNanos,
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
    /// Malformed lines kept to try the other built-in formats on.
    malformed_sample: Vec<Box<[u8]>>,
    report: ReplayReport,
}

fn secs(ns: i64) -> f64 {
    (ns as f64 / NS as f64 * 10.0).round() / 10.0
}
