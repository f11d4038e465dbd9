//! The `check` report's limiters table: one row per limiter, then one per load it must carry.

use super::format::pad;
use crate::calibration::check::{LimiterCheck, Status};
use crate::calibration::fmt_secs;

/// The limiters table's column widths.
const COLS: [usize; 11] = [16, 24, 11, 10, 9, 5, 7, 42, 9, 10, 6];

/// The limiters table's header.
pub(super) const HEAD: [&str; 11] = [
    "LIMITER",
    "BUDGET",
    "KEY",
    "METER",
    "COUNT",
    "COST",
    "REFILL",
    "MUST CARRY",
    "HEADROOM",
    "WORST RUN",
    "STATUS",
];

/// One line of the limiters table: each cell padded to its column, trailing blanks trimmed.
pub(super) fn table_row(cells: [&str; 11]) -> String {
    let mut line = String::new();
    for (c, w) in cells.iter().zip(COLS) {
        line.push_str(&pad(c, w));
        line.push(' ');
    }
    line.trim_end().to_owned() + "\n"
}

/// One limiter's rows: its own cells on the first, then one row per load it must carry.
pub(super) fn limiter_rows(l: &LimiterCheck) -> String {
    let (budget, refill) = match &l.calendar {
        Some(c) => (format!("{} / {c}", l.limit), "boundary".to_owned()),
        None => (
            format!(
                "{} / {} {}",
                l.limit,
                fmt_secs(l.window_seconds),
                l.algorithm
            ),
            fmt_secs(l.refill_interval_seconds),
        ),
    };
    let status = l.status.as_str();
    let count = match &l.failed_statuses {
        Some(s) if s != DEFAULT_FAILED => format!("{} {s}", l.count),
        _ => l.count.to_owned(),
    };
    let cost = l.cost.to_string();
    let first = [
        l.name.as_str(),
        &budget,
        &l.key,
        l.meter,
        &count,
        &cost,
        &refill,
    ];
    if l.loads.is_empty() {
        let carries = if l.status == Status::Off {
            "mode = off: never consulted"
        } else {
            "no declared cadence (abuse guard)"
        };
        return table_row(cells(first, [carries, "-", "-", status]));
    }
    let mut o = String::new();
    for (i, load) in l.loads.iter().enumerate() {
        let headroom = fmt_headroom(load.headroom);
        let worst = fmt_secs(load.worst_refused_seconds.unwrap_or(f64::INFINITY));
        let lead = if i == 0 { first } else { [""; 7] };
        let status = if i == 0 { status } else { "" };
        o.push_str(&table_row(cells(
            lead,
            [&load.describe, &headroom, &worst, status],
        )));
    }
    o
}

/// A table row: the limiter's own cells, then one load's.
fn cells<'a>(lead: [&'a str; 7], tail: [&'a str; 4]) -> [&'a str; 11] {
    [
        lead[0], lead[1], lead[2], lead[3], lead[4], lead[5], lead[6], tail[0], tail[1], tail[2],
        tail[3],
    ]
}

/// `failed_statuses` when it is not set: 400 and above.
const DEFAULT_FAILED: &str = "400-999";

fn fmt_headroom(h: f64) -> String {
    if h >= 0.1 {
        format!("{h:.1}x")
    } else {
        format!("{h:.3}x")
    }
}
