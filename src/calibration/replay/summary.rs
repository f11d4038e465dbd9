//! The skipped-lines summary: for each reason lines were not replayed (or were decided before
//! their window closed), how many, their share of the lines, the reason in words and the option
//! that fixes it, computed from what the replay saw; and `--max-skipped`.

use super::line::Fields;
use super::{LineFormat, ReplayReport, FAR_SECONDS, NS};
use serde::Serialize;

/// What the fixes are computed from, gathered while the lines are read.
#[derive(Debug, Clone, Default)]
pub(crate) struct Seen {
    /// The newest line read so far, outliers included unless [`FAR_SECONDS`] ahead.
    pub newest: Option<i64>,
    /// The furthest a line was dated before that newest line (nanoseconds), among those at
    /// most [`FAR_SECONDS`] before it: the log's disorder, the window that replays it whole.
    pub disorder_max: i64,
    /// Late lines dated more than [`FAR_SECONDS`] before the newest line.
    pub late_far: u64,
    /// Lines late only because the full buffer had decided later lines early.
    pub late_after_early: u64,
    /// Outliers dated more than [`FAR_SECONDS`] after the earliest of the lines after them.
    pub outliers_far: u64,
    /// The built-in format that reads most of the malformed lines kept, how many of them.
    pub format_that_reads: Option<(&'static str, usize, usize)>,
}

/// One reason lines were not replayed, or were replayed out of order.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Skipped {
    /// `late`, `outliers`, `malformed`, `decided early` or `unreadable` (whose lines are
    /// unknown: 0 here).
    pub reason: &'static str,
    pub lines: u64,
    /// Its share of the lines read.
    pub percent: f64,
    /// Whether these lines were replayed anyway (lines decided early are).
    pub replayed: bool,
    pub why: String,
    /// What to do about it: an option with its value where one fixes it.
    pub fix: String,
}

/// The built-in formats tried on malformed lines.
const BUILT_IN: [&str; 3] = ["combined", "alb", "json"];

/// A share of `total`, in percent, to two decimals.
pub(crate) fn percent(n: u64, total: u64) -> f64 {
    if total == 0 {
        return 0.0;
    }
    (n as f64 * 10_000.0 / total as f64).round() / 100.0
}

/// `--reorder-seconds` that covers lines out of order by `ns`: a second more, rounded up to
/// 10 s (to a minute past ten minutes).
pub(crate) fn window_for(ns: i64) -> u64 {
    let s = (ns.max(0) as u64).div_ceil(NS as u64) + 1;
    let step = if s > 600 { 60 } else { 10 };
    s.div_ceil(step) * step
}

/// Whether `f` is a line replay can use: dated, from an IP address, in text.
fn usable(f: &Fields<'_>) -> bool {
    f.time.is_some()
        && f.check().is_ok()
        && std::str::from_utf8(f.addr).is_ok_and(|a| a.parse::<std::net::IpAddr>().is_ok())
        && std::str::from_utf8(f.method).is_ok()
}

/// The built-in format that reads more than half of `sample`, and how many it reads.
pub(crate) fn format_that_reads(sample: &[Box<[u8]>]) -> Option<(&'static str, usize, usize)> {
    let mut scratch = serde_json::Map::new();
    BUILT_IN
        .iter()
        .filter_map(|name| {
            let fmt = LineFormat::parse(name).ok()?;
            let n = sample
                .iter()
                .filter(|l| fmt.read(l, &mut scratch).is_ok_and(|f| usable(&f)))
                .count();
            Some((*name, n, sample.len()))
        })
        .filter(|(_, n, of)| *n * 2 > *of)
        .max_by_key(|(_, n, _)| *n)
}

/// `--max-skipped`: a share of lines from 0 to 100, with or without `%`.
pub fn parse_max_skipped(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let num = t.strip_suffix('%').unwrap_or(t).trim_end();
    let bad = || {
        format!(
            "{s:?} is not a share of lines: give a percentage from 0 to 100, such as 1 or 2.5% (100 never fails on skipped lines)"
        )
    };
    if num.is_empty() || !num.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return Err(bad());
    }
    let v: f64 = num.parse().map_err(|_| bad())?;
    if !(0.0..=100.0).contains(&v) {
        return Err(bad());
    }
    Ok(v)
}

fn lines(n: u64) -> String {
    format!("{n} {}", if n == 1 { "line" } else { "lines" })
}

/// The summary of `r`: fills `not_replayed`, its share and `skipped`.
pub(crate) fn summarise(r: &mut ReplayReport) {
    let out: Vec<Skipped> = [
        late(r),
        outliers(r),
        malformed(r),
        decided_early(r),
        unreadable(r),
    ]
    .into_iter()
    .flatten()
    .collect();
    r.not_replayed = r.late + r.outliers + r.malformed;
    r.not_replayed_percent = percent(r.not_replayed, r.lines);
    r.skipped = out;
}

/// The `--reorder-seconds` that would have replayed `what`, or nothing when the window in
/// use already covers the log's disorder.
fn raise_window(r: &ReplayReport, what: &str) -> String {
    let need = r.seen.disorder_max;
    if need > 0 && window_for(need) > r.reorder_seconds {
        format!(
            "--reorder-seconds {} (the {what} were out of order by up to {} s)",
            window_for(need),
            (need as u64).div_ceil(NS as u64)
        )
    } else {
        String::new()
    }
}

/// The fix for lines dated further apart than any reorder window covers.
fn far_fix() -> String {
    format!(
        "put the logs in time order (files oldest first: access.log.2.gz access.log.1 access.log), or correct or remove lines from a clock set wrong; no reorder window covers more than {} s",
        FAR_SECONDS
    )
}

/// Late lines: dated more than the window before a line already read.
fn late(r: &ReplayReport) -> Option<Skipped> {
    if r.late == 0 {
        return None;
    }
    let seen = &r.seen;
    let mut fixes = Vec::new();
    let near = r.late - seen.late_far - seen.late_after_early;
    if near > 0 {
        fixes.push(raise_window(r, "late lines"));
    }
    if seen.late_far > 0 {
        fixes.push(format!(
            "{} dated more than {FAR_SECONDS} s before the newest line: {}",
            lines(seen.late_far),
            far_fix()
        ));
    }
    if seen.late_after_early > 0 {
        fixes.push(format!(
            "{} came after the full reorder buffer had decided later lines: see `decided early`",
            lines(seen.late_after_early)
        ));
    }
    fixes.retain(|f| !f.is_empty());
    Some(Skipped {
        reason: "late",
        lines: r.late,
        percent: percent(r.late, r.lines),
        replayed: false,
        why: format!(
            "dated more than the reorder window ({} s) before a line already read",
            r.reorder_seconds
        ),
        fix: fixes.join("; "),
    })
}

/// Outliers: dated more than the window after most of the lines that follow each.
fn outliers(r: &ReplayReport) -> Option<Skipped> {
    if r.outliers == 0 {
        return None;
    }
    let seen = &r.seen;
    let mut fixes = Vec::new();
    if r.outliers > seen.outliers_far {
        fixes.push(raise_window(r, "outliers"));
    }
    if seen.outliers_far > 0 {
        fixes.push(format!(
            "{} dated more than {FAR_SECONDS} s after the lines that follow: {}",
            lines(seen.outliers_far),
            far_fix()
        ));
    }
    fixes.retain(|f| !f.is_empty());
    Some(Skipped {
        reason: "outliers",
        lines: r.outliers,
        percent: percent(r.outliers, r.lines),
        replayed: false,
        why: format!(
            "dated more than the reorder window ({} s) after most of the {} lines that follow each",
            r.reorder_seconds,
            super::LOOK_AHEAD
        ),
        fix: fixes.join("; "),
    })
}

/// Malformed lines, with the built-in format that reads them if one does.
fn malformed(r: &ReplayReport) -> Option<Skipped> {
    if r.malformed == 0 {
        return None;
    }
    let fix = match r.seen.format_that_reads {
        Some((name, n, of)) => format!(
            "--log-format {name} (it reads {n} of the first {of} malformed lines)"
        ),
        None if r.malformed * 2 > r.lines => format!(
            "none of the built-in formats ({}) reads these lines: give their nginx log_format string or a json:KEY=FIELD mapping to --log-format",
            BUILT_IN.join(", ")
        ),
        None => "the lines named above are damaged or of another layout: repair or remove them".to_owned(),
    };
    let reasons: Vec<String> = r
        .malformed_by_reason
        .iter()
        .map(|(why, n)| format!("{why} ({n})"))
        .collect();
    Some(Skipped {
        reason: "malformed",
        lines: r.malformed,
        percent: percent(r.malformed, r.lines),
        replayed: false,
        why: format!("not readable as the log format: {}", reasons.join(", ")),
        fix,
    })
}

/// Lines decided before their window closed because the reorder buffer was full.
fn decided_early(r: &ReplayReport) -> Option<Skipped> {
    if r.decided_early == 0 {
        return None;
    }
    let need = r.seen.disorder_max;
    let smaller = window_for(need);
    let fix = if smaller < r.reorder_seconds {
        format!(
            "--reorder-seconds {smaller} holds fewer lines (the log was out of order by at most {} s); lines stamped with one instant are replayed in their order either way",
            (need.max(0) as u64).div_ceil(NS as u64)
        )
    } else {
        "none: they were replayed, but perhaps out of order; the buffer's size is fixed".to_owned()
    };
    Some(Skipped {
        reason: "decided early",
        lines: r.decided_early,
        percent: percent(r.decided_early, r.lines),
        replayed: true,
        why: format!(
            "decided before their reorder window closed: the reorder buffer was full ({} MiB)",
            r.reorder_budget_bytes >> 20
        ),
        fix,
    })
}

/// Files not read to their end: their lines after the error are unknown.
fn unreadable(r: &ReplayReport) -> Option<Skipped> {
    if r.read_errors.is_empty() {
        return None;
    }
    Some(Skipped {
        reason: "unreadable",
        lines: 0,
        percent: 0.0,
        replayed: false,
        why: format!(
            "{} not read to its end, the lines after the error unknown: {}",
            if r.read_errors.len() == 1 {
                "a file was"
            } else {
                "files were"
            },
            r.read_errors.join("; ")
        ),
        fix: "replace the truncated or corrupt file, or leave it out".to_owned(),
    })
}

/// Whether more of the lines than `--max-skipped` allows were not replayed.
pub(crate) fn too_many_skipped(r: &ReplayReport) -> bool {
    r.not_replayed > 0 && r.not_replayed as f64 * 100.0 > r.max_skipped_percent * r.lines as f64
}

/// The summary as lines of text (without a prefix), for stderr and the table.
pub(crate) fn describe(r: &ReplayReport) -> Vec<String> {
    let mut out = Vec::new();
    if r.skipped.is_empty() {
        return out;
    }
    out.push(format!(
        "{} of {} lines ({} %) not replayed{}",
        r.not_replayed,
        r.lines,
        r.not_replayed_percent,
        if too_many_skipped(r) {
            format!(
                ", more than --max-skipped {} % allows",
                r.max_skipped_percent
            )
        } else {
            String::new()
        }
    ));
    for s in &r.skipped {
        if s.reason == "unreadable" {
            // Its lines are unknown: no count, no share.
            out.push(format!("  unreadable: {}", s.why));
            out.push(format!("    fix: {}", s.fix));
            continue;
        }
        out.push(format!(
            "  {}: {} ({} %){} {}",
            s.reason,
            lines(s.lines),
            s.percent,
            if s.replayed { ", replayed," } else { "" },
            s.why
        ));
        if !s.fix.is_empty() {
            out.push(format!("    fix: {}", s.fix));
        }
    }
    out
}
