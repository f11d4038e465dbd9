//! The `check` report after its table: each limiter's findings and fixes, the Envoy rate-limit
//! service's rules, and the verdict.

use crate::calibration::check::{CheckReport, LimiterCheck, Status};
use std::fmt::Write;

/// Each limiter's reasons, tagged with how serious each is.
pub(super) fn findings_lines(o: &mut String, r: &CheckReport) {
    let findings: Vec<&LimiterCheck> = r
        .limiters
        .iter()
        .filter(|l| !l.reasons.is_empty())
        .collect();
    if findings.is_empty() {
        return;
    }
    let _ = writeln!(o);
    for l in findings {
        for (reason, status) in l.reasons.iter().zip(&l.reason_status) {
            let tag = match status {
                Status::Unsafe => "unsafe",
                Status::AtRisk => "at risk",
                _ => "warning",
            };
            let _ = writeln!(o, "{tag}: {}: {reason}", l.name);
        }
    }
}

/// The fixes of every limiter that has one, or why it has none.
pub(super) fn fixes_lines(o: &mut String, r: &CheckReport) {
    let fixes: Vec<&LimiterCheck> = r
        .limiters
        .iter()
        .filter(|l| l.suggestion.is_some() || l.no_fix.is_some())
        .collect();
    if fixes.is_empty() {
        return;
    }
    let _ = writeln!(o);
    for l in fixes {
        o.push_str(&fix_lines(l));
    }
}

/// The Envoy rate-limit service's rules, judged, when there are any.
pub(super) fn rls_lines(o: &mut String, r: &CheckReport) {
    if r.rls.is_empty() {
        return;
    }
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "Envoy rate-limit service (rls.config): {} rule(s)",
        r.rls.len()
    );
    for rule in &r.rls {
        let shadow = if rule.shadow { ", shadow_mode" } else { "" };
        let _ = writeln!(
            o,
            "  {}: {}, keyed on {}{shadow}: {}",
            rule.rule, rule.budget, rule.key, rule.judged
        );
    }
}

/// The one-line verdict with its counts, and what WORST RUN means.
pub(super) fn verdict_lines(o: &mut String, r: &CheckReport) {
    let verdict = if !r.is_safe() {
        "UNSAFE"
    } else if r.is_at_risk() {
        "at risk"
    } else {
        "safe"
    };
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "{verdict}: {} unsafe, {} at risk, {} warning(s).\nWORST RUN: the longest a client of that cadence is refused in a row once its bucket is empty.",
        r.unsafe_limiters,
        r.at_risk,
        r.warnings
    );
}

/// The fixes of one limiter: the preferred one, then each alternative, each with the lines to
/// set under its `[limiters.NAME]` table; or why there is none.
fn fix_lines(l: &LimiterCheck) -> String {
    let mut o = String::new();
    if let Some(why) = &l.no_fix {
        let _ = writeln!(o, "no fix: {}: {why}", l.name);
    }
    for (i, f) in l.suggestion.iter().chain(&l.alternatives).enumerate() {
        let what = match f.change {
            "limit" => format!("limit = {} (window {} kept)", f.limit, f.window),
            "window" => format!("window = \"{}\" (limit {} kept)", f.window, f.limit),
            _ => format!(
                "key = \"{}\" (budget {} / {} kept)",
                f.key, f.limit, f.window
            ),
        };
        let or = if i == 0 { "" } else { "or " };
        let warn = if f.status == Status::Warning {
            ", with a warning"
        } else {
            ""
        };
        let _ = writeln!(o, "fix: {}: {or}safe with {what}{warn}; set:", l.name);
        for line in f.toml.lines() {
            let _ = writeln!(o, "    {line}");
        }
    }
    o
}
