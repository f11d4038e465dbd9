//! The `simulate` report's blocks for the guards against misbehaving clients: `failed-only`,
//! `abuse`, `table-flood` and `rotation`.

use super::format::pad;
use crate::calibration::fmt_secs;
use crate::calibration::simulate::{
    AbuseReport, FailedOnlyReport, RotationReport, TableFloodReport,
};
use std::fmt::Write;

/// The `failed-only` scenario's block of the table.
pub(super) fn failed_only_block(o: &mut String, f: &FailedOnlyReport) {
    let _ = writeln!(
        o,
        "failed-only  2 API clients for {}; api-key counts {}, budget {} over the run",
        fmt_secs(f.duration_seconds as f64),
        f.api_key_count.unwrap_or("(no api-key limiter)"),
        f.api_key_budget
            .map_or_else(|| "-".to_owned(), |b| b.to_string())
    );
    for c in &f.clients {
        let _ = writeln!(
            o,
            "          {} {}/s answered {}  admitted {} ({}/min)  refused {} of {}",
            pad(c.name, 17),
            c.rate_per_second,
            c.status,
            c.admitted,
            c.admitted_per_minute,
            c.refused,
            c.requests
        );
    }
}

/// The `abuse` scenario's block of the table.
pub(super) fn abuse_block(o: &mut String, a: &AbuseReport) {
    let _ = writeln!(
        o,
        "abuse     {} clients at {} requests/s each for {}, ignoring Retry-After",
        a.attackers.len(),
        a.rate_per_second,
        fmt_secs(a.duration_seconds as f64)
    );
    for at in &a.attackers {
        let _ = writeln!(
            o,
            "          {} {} admitted {}/min  (refused {} of {})",
            pad(at.name, 19),
            pad(&at.route, 26),
            at.admitted_per_minute,
            at.refused,
            at.requests
        );
    }
}

/// The `table-flood` scenario's block of the table.
pub(super) fn table_flood_block(o: &mut String, r: &TableFloodReport) {
    let t = &r.table;
    if r.ceiling_remembers {
        let _ = writeln!(
            o,
            "table-flood  the known-agents table ({} ids; a new site keeps its first sightings while others hold at most {} minted within {}) filled from other addresses:",
            t.capacity,
            t.others_first_sightings,
            fmt_secs(t.grace_seconds as f64)
        );
    } else {
        let _ = writeln!(
            o,
            "table-flood  no new-agents ceiling is on, so nothing remembers agent ids; the same floods from other addresses:"
        );
    }
    let _ = writeln!(
        o,
        "          from {} {} IPv6 /56s mint {} ids each in {} ({} ids, each seen once), then {} fresh ids a second to the end;",
        fmt_secs(r.fill_starts_seconds as f64),
        r.fill_addresses,
        r.fill_ids_each,
        fmt_secs(r.fill_seconds as f64),
        r.fill_addresses * r.fill_ids_each,
        r.keep_full_per_second
    );
    let _ = writeln!(
        o,
        "          from {} {} more /56s (what the bound leaves beside that stream) mint at their ceiling's full rate{}",
        fmt_secs(r.sustained_starts_seconds as f64),
        r.sustained_addresses,
        match (r.ceiling_remembers, r.table_full_at_seconds) {
            (false, _) => String::new(),
            (true, None) => "; the table never fills".to_owned(),
            (true, Some(s)) => format!("; the table is full from {}", fmt_secs(s)),
        }
    );
    for s in &r.sites {
        let _ = writeln!(
            o,
            "          site {} ({} agents from {}): heartbeats refused {} of {} (admitted {}/min)  polls refused {}  marked offline {}",
            pad(s.name, 20),
            s.agents,
            fmt_secs(s.arrives_seconds as f64),
            s.heartbeats_refused,
            s.heartbeats,
            s.admitted_per_minute,
            s.polls_refused,
            s.agents_marked_offline
        );
    }
    let k = &r.known;
    let _ = writeln!(
        o,
        "          flood admitted {} of {}; table at the end: {} first sightings, {} protected; not remembered {} (address full), {} (table full); evicted {} stale, {} for a share",
        r.flood_admitted,
        r.flood_requests,
        k.probation,
        k.protected,
        k.not_remembered_address,
        k.not_remembered_table,
        k.evicted_stale_probation + k.evicted_stale_protected,
        k.evicted_share_probation + k.evicted_share_protected
    );
}

/// The `rotation` scenario's block of the table.
pub(super) fn rotation_block(o: &mut String, r: &RotationReport) {
    let _ = writeln!(
        o,
        "rotation  {} agents behind one NAT; from {} one host there sends {} requests/s, each with a fresh agent id, for {}",
        r.agents,
        fmt_secs(r.flood_starts_seconds as f64),
        r.flood_rate_per_second,
        fmt_secs((r.duration_seconds - r.flood_starts_seconds) as f64)
    );
    let _ = writeln!(
        o,
        "          healthy agents marked offline {}  heartbeats refused {} of {} (admitted {}/min)  polls refused {}  longest heartbeat gap {}",
        r.agents_marked_offline,
        r.heartbeats_refused,
        r.heartbeats,
        r.heartbeats_admitted_per_minute,
        r.polls_refused,
        fmt_secs(r.longest_heartbeat_gap_seconds)
    );
    let allows = r
        .ceiling_allows
        .map_or("no new-agents ceiling".to_owned(), |n| {
            format!("the ceiling allows at most {n}")
        });
    let _ = writeln!(
        o,
        "          rotating client admitted {} of {} ({}/min; {allows})",
        r.rotating_admitted, r.rotating_requests, r.rotating_admitted_per_minute
    );
}
