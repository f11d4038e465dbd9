//! The replay report as a table, one calibration or two side by side.

use super::{LimiterReport, ReplayReport};
use std::fmt::Write;

fn source(r: &ReplayReport) -> String {
    r.config.as_ref().map_or_else(
        || "built-in calibration".to_owned(),
        |p| p.display().to_string(),
    )
}

fn head(out: &mut String, r: &ReplayReport) {
    let _ = writeln!(out, "replay of {} ({})", r.files.join(", "), source(r));
    let _ = writeln!(
        out,
        "  lines {}  replayed {}  refused {}  malformed {}  late {} (reorder window {} s)  span {} s",
        r.lines, r.replayed, r.refused, r.malformed, r.late, r.reorder_seconds, r.span_seconds
    );
    let _ = writeln!(
        out,
        "  matched a limiter {}  unmetered {} ({} % of the replayed requests matched no limiter)",
        r.matched, r.unmetered, r.unmetered_percent
    );
    let _ = writeln!(out, "  identity: {}", r.identity);
    for (why, n) in &r.malformed_by_reason {
        let _ = writeln!(out, "  malformed: {n} {why}");
    }
    for b in &r.first_malformed {
        let _ = writeln!(out, "    {}:{}: {}", b.file, b.line, b.reason);
    }
    if r.outliers > 0 {
        let _ = writeln!(
            out,
            "  outliers: {} set aside, not replayed (each would have moved the clock more than the reorder window past most of the {} lines after it)",
            r.outliers,
            super::LOOK_AHEAD
        );
    }
    for o in &r.first_outliers {
        let _ = writeln!(out, "    {}", outlier(o));
    }
    if r.decided_early > 0 {
        let _ = writeln!(
            out,
            "  reorder buffer full: {} lines decided before their reorder window closed (the buffer holds {} MiB)",
            r.decided_early,
            r.reorder_budget_bytes >> 20
        );
    }
    for e in &r.read_errors {
        let _ = writeln!(out, "  read error: {e}");
    }
    for line in super::summary::describe(r) {
        let _ = writeln!(out, "  {line}");
    }
}

/// `access.log:1: dated 2099-01-01T00:00:00.000000000Z, 2303683200 s ahead of the lines after it`.
pub(crate) fn outlier(o: &super::Outlier) -> String {
    format!(
        "{}:{}: dated {}, {} s ahead of the lines after it",
        o.file, o.line, o.dated, o.ahead_seconds
    )
}

fn limiter(out: &mut String, l: &LimiterReport) {
    let _ = writeln!(
        out,
        "  {:<24} {:<7} metered {:>9}  refused {:>7}  shadow-refused {:>7}  longest lockout {} s{}",
        l.name,
        l.mode,
        l.metered,
        l.refused,
        l.shadow_refused,
        l.longest_refusal_run_seconds,
        l.longest_refusal_run_principal
            .as_ref()
            .map_or(String::new(), |p| format!(" ({p})"))
    );
    for (who, n) in &l.top_refused {
        let _ = writeln!(out, "      {n:>7}  {who}");
    }
    let u = &l.unfinished_refusal_runs;
    if let Some(longest) = &u.longest {
        let _ = writeln!(
            out,
            "      unfinished refusal runs (not lockouts): {} {}, {} {}, {} {}; longest refused for {} s ({}, {})",
            u.still_refused_at_end,
            super::STILL_REFUSED,
            u.never_seen_again,
            super::NEVER_SEEN_AGAIN,
            u.returned_later,
            super::RETURNED_LATER,
            longest.refused_for_seconds,
            longest.principal,
            longest.ends
        );
    }
}

fn offline(out: &mut String, r: &ReplayReport) {
    let _ = writeln!(
        out,
        "  agents seen {}  offline past {} s because of a refusal: {}",
        r.agents_seen,
        r.offline_threshold_seconds,
        r.agents_offline.len()
    );
    for a in r.agents_offline.iter().take(super::SHOWN_PRINCIPALS) {
        let _ = writeln!(
            out,
            "      {} (gap {} s)",
            a.agent_id, a.longest_gap_seconds
        );
    }
    if r.agents_last_heartbeat_refused > 0 {
        let _ = writeln!(
            out,
            "  agents whose last heartbeat was refused: {} (each offline above only if its refused heartbeats alone went past {} s)",
            r.agents_last_heartbeat_refused, r.offline_threshold_seconds
        );
    }
}

/// One replay as a table.
pub(crate) fn table(r: &ReplayReport) -> String {
    let mut out = String::new();
    head(&mut out, r);
    let _ = writeln!(out, "limiters");
    if let Some(none) = &r.no_limiter_matched {
        let _ = writeln!(out, "  {none}");
    }
    for l in &r.limiters {
        limiter(&mut out, l);
    }
    offline(&mut out, r);
    out
}

/// Two calibrations over the same logs: the first's report, the second's, and their refusals
/// limiter by limiter.
pub(crate) fn side_by_side(a: &ReplayReport, b: &ReplayReport) -> String {
    let mut out = table(a);
    out.push('\n');
    out.push_str(&table(b));
    let _ = writeln!(out, "\ncompared ({} | {})", source(a), source(b));
    let _ = writeln!(
        out,
        "  {:<24} {:>9} | {:>9}   {:>9} | {:>9}",
        "limiter", "refused", "refused", "shadow", "shadow"
    );
    let mut names: Vec<&str> = a
        .limiters
        .iter()
        .chain(&b.limiters)
        .map(|l| l.name.as_str())
        .collect();
    names.sort_unstable();
    names.dedup();
    let find = |r: &ReplayReport, n: &str| {
        r.limiters
            .iter()
            .find(|l| l.name == n)
            .map_or((0, 0), |l| (l.refused, l.shadow_refused))
    };
    for n in names {
        let (x, y) = (find(a, n), find(b, n));
        let _ = writeln!(
            out,
            "  {n:<24} {:>9} | {:>9}   {:>9} | {:>9}",
            x.0, y.0, x.1, y.1
        );
    }
    let _ = writeln!(
        out,
        "  {:<24} {:>9} | {:>9}",
        "agents offline",
        a.agents_offline.len(),
        b.agents_offline.len()
    );
    out
}
