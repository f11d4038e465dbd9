//! The `simulate` report's `herd` block: a fleet back from an outage, one row per run.

use super::format::pad;
use crate::calibration::fmt_secs;
use crate::calibration::simulate::herd::{HerdReport, HerdRun};
use std::fmt::Write;

/// The `herd` scenario's block of the table: one row per run.
pub(super) fn herd_block(o: &mut String, h: &HerdReport) {
    let slots = if h.slots_configured {
        "the configured [shaping]"
    } else {
        "the heartbeat shaped for the comparison"
    };
    let _ = writeln!(
        o,
        "herd      {} agents behind {} NATs back from an outage within one second, heartbeating every {}s for {}; poll slots every {}s ({slots})",
        h.agents,
        h.sites,
        h.heartbeat_interval_seconds,
        fmt_secs(h.duration_seconds as f64),
        h.slot_interval_seconds
    );
    let head = [
        "",
        "peak/mean after 1m",
        "peak/mean first 2m",
        "heartbeats refused",
        "marked offline",
        "steady after",
    ];
    o.push_str(&herd_row(head.map(str::to_owned)));
    for (label, run) in [
        ("own cadence", &h.own_cadence),
        ("poll slots", &h.poll_slots),
        ("backend-aware", &h.backend_aware),
    ] {
        o.push_str(&herd_row(herd_cells(label, run)));
    }
    let _ = writeln!(
        o,
        "          backend: {}/s, {} ms idle, target {} ms; low priority {}/s",
        h.backend_capacity_per_second,
        h.backend_base_latency_ms,
        h.latency_target_ms,
        h.low_per_second
    );
    for (label, r) in [
        ("own cadence", &h.own_cadence),
        ("poll slots", &h.poll_slots),
        ("backend-aware", &h.backend_aware),
    ] {
        let _ = writeln!(
            o,
            "          {label}: worst latency {:.0} ms ({:.0} ms after 1m), settled after {}; low shed {} of {}, heartbeats shed {}; longest hint {}",
            r.backend_worst_latency_ms,
            r.backend_worst_latency_after_first_minute_ms,
            r.backend_steady_after_seconds
                .map_or_else(|| "never".to_owned(), |s| fmt_secs(s as f64)),
            r.low_shed,
            r.low_requests,
            r.heartbeats_shed,
            r.longest_heartbeat_hint_seconds
                .map_or_else(|| "none".to_owned(), |s| format!("{s}s"))
        );
    }
}

/// One run's cells of the `herd` table.
fn herd_cells(label: &str, r: &HerdRun) -> [String; 6] {
    [
        label.to_owned(),
        format!(
            "{:.2} ({}/s at most, {}/s mean)",
            r.peak_to_mean_after_first_minute,
            r.busiest_second_after_first_minute,
            r.mean_per_second_after_first_minute
        ),
        format!("{:.2}", r.peak_to_mean_first_two_minutes),
        format!("{} of {}", r.heartbeats_refused, r.heartbeats),
        r.agents_marked_offline.to_string(),
        r.steady_after_seconds
            .map_or_else(|| "never".to_owned(), |s| fmt_secs(s as f64)),
    ]
}

/// A row of the `herd` table, indented under its heading, trailing blanks trimmed.
fn herd_row(cells: [String; 6]) -> String {
    let mut line = " ".repeat(10);
    for (c, w) in cells.iter().zip([13, 38, 20, 20, 16, 12]) {
        line.push_str(&pad(c, w));
        line.push(' ');
    }
    line.trim_end().to_owned() + "\n"
}
