//! The `check` report as a table: the calibration's header lines (store, fleet, known agents,
//! shaping), the limiters table, the findings and the verdict.

use super::findings::{findings_lines, fixes_lines, rls_lines, verdict_lines};
use super::format::source;
use super::limiters::{limiter_rows, table_row, HEAD};
use crate::calibration::check::{fmt_rate, CheckReport};
use crate::calibration::fmt_secs;
use std::fmt::Write;

/// The check as a table, its findings, and a one-line verdict.
pub(crate) fn check_table(r: &CheckReport) -> String {
    let mut o = String::new();
    store_lines(&mut o, r);
    fleet_lines(&mut o, r);
    known_agents_lines(&mut o, r);
    shaping_lines(&mut o, r);
    if !r.enabled {
        let _ = writeln!(
            o,
            "Limiting is switched off (enabled = false): nothing is enforced; the figures show what enforcing would do."
        );
    }
    let _ = writeln!(o);
    o.push_str(&table_row(HEAD));
    for l in &r.limiters {
        o.push_str(&limiter_rows(l));
    }
    findings_lines(&mut o, r);
    fixes_lines(&mut o, r);
    rls_lines(&mut o, r);
    verdict_lines(&mut o, r);
    o
}

/// The header: where the calibration comes from, the store, and what each limiter answers
/// while Redis does not.
fn store_lines(o: &mut String, r: &CheckReport) {
    let _ = writeln!(o, "Calibration check: {}", source(&r.config));
    let shared = if r.store == "memory" {
        " (each instance counts on its own)"
    } else {
        " (instances share one budget)"
    };
    let _ = writeln!(o, "Store: {}{shared}", r.store);
    let down = &r.store_down;
    let answers = [
        ("allow (unmetered)", &down.allow),
        ("deny (refused)", &down.deny),
        (
            "local (each instance counts alone: up to one budget per instance)",
            &down.local,
        ),
    ];
    let said: Vec<String> = answers
        .iter()
        .filter(|(_, names)| !names.is_empty())
        .map(|(what, names)| format!("{what}: {}", names.join(", ")))
        .collect();
    if !said.is_empty() {
        let _ = writeln!(o, "While Redis does not answer: {}.", said.join("; "));
    }
}

/// The fleet's cadences and what the dashboards send, and how their analysts are keyed.
fn fleet_lines(o: &mut String, r: &CheckReport) {
    let f = &r.fleet;
    let _ = writeln!(
        o,
        "Fleet: heartbeat every {}s (offline after {}s without one), task poll every {}s, {} endpoints per site,",
        f.heartbeat_interval_seconds, f.heartbeat_timeout_seconds, f.poll_interval_seconds, f.max_site_endpoints
    );
    let _ = writeln!(
        o,
        "       {} analysts per NAT polling every {}s, CLI device-flow polling every {}s.",
        f.analysts_per_nat,
        f.dashboard_poll_seconds,
        crate::calibration::traffic::DEVICE_POLL_SECONDS
    );
    let d = &r.dashboards;
    let _ = writeln!(
        o,
        "Dashboards: {} requests per poll ({} widgets and the notification bell), {} per analyst;",
        d.requests_per_poll,
        crate::calibration::traffic::DASHBOARD_WIDGETS_PER_PAGE,
        fmt_rate(d.per_analyst_per_minute)
    );
    if d.verified_users {
        let _ = writeln!(
            o,
            "            verified users ([identity] is configured): each analyst has a budget of their own."
        );
    } else {
        let _ = writeln!(
            o,
            "            keyed on the IP (no [identity] token verifier): the {} analysts behind one NAT share one bucket.",
            f.analysts_per_nat
        );
    }
}

/// The known-agents table's split and the flood it holds against, when it is in use.
fn known_agents_lines(o: &mut String, r: &CheckReport) {
    let Some(k) = &r.known_agents else {
        return;
    };
    let _ = writeln!(
        o,
        "Known agents: {} ids (store.max_keys): {} for agents seen twice (fleet.max_agents = {}), {} for first sightings;",
        k.capacity, k.protected, k.max_agents, k.probation
    );
    let grace = fmt_secs(k.grace_seconds as f64);
    let _ = writeln!(
        o,
        "              a new site of {} keeps all its first sightings while other addresses hold at most {} minted within {grace}",
        k.site, k.others_first_sightings
    );
    let _ = writeln!(
        o,
        "              (each counted up to {}: a flood from up to {} addresses at any rate); an id unseen for {grace} gives way first.",
        k.site, k.flooding_addresses
    );
}

/// `[shaping]`: each entry, the heartbeat's longest hint against half the heartbeat timeout,
/// and the upstream's target.
fn shaping_lines(o: &mut String, r: &CheckReport) {
    let Some(s) = &r.shaping else {
        return;
    };
    let entries: Vec<String> = s
        .routes
        .iter()
        .map(|e| {
            let mut parts = Vec::new();
            if let (Some(i), Some(l)) = (e.interval_seconds, e.longest_hint_seconds) {
                parts.push(format!("every {i}s, hints at most {l}s"));
            }
            parts.push(e.priority.to_owned());
            if let Some(n) = e.max_in_flight {
                parts.push(format!("{n} in flight per {}", e.in_flight_per));
            }
            format!("{} ({})", e.name, parts.join(", "))
        })
        .collect();
    let _ = writeln!(o, "Shaping: {}.", entries.join("; "));
    match (&s.heartbeat_route, s.longest_heartbeat_hint_seconds) {
        (Some(name), Some(longest)) => {
            let _ = writeln!(
                o,
                "         POST /api/agent/heartbeat (entry `{name}`): hints at most {longest}s, within {}s (half of fleet.heartbeat_timeout_seconds): an agent that follows them and loses one heartbeat is still heard from in time.",
                s.heartbeat_hint_bound_seconds
            );
        }
        _ => {
            let _ = writeln!(
                o,
                "         no entry gives the heartbeat (POST /api/agent/heartbeat) an interval: agents keep their own cadence."
            );
        }
    }
    match (s.latency_target_ms, s.errors_percent, s.recover_ms) {
        (Some(t), Some(e), Some(rec)) => {
            let _ = writeln!(
                o,
                "         upstream target {t} ms (or 5xx over {e} %): intervals stretch up to each entry's longest hint; low is shed first, critical never; one priority back every {}.",
                fmt_secs(rec as f64 / 1000.0)
            );
        }
        _ => {
            let _ = writeln!(
                o,
                "         no [shaping.upstream]: intervals never stretch and nothing is shed by priority."
            );
        }
    }
}
