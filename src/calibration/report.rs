//! Rendering `check` and `simulate` reports: a table for a terminal, or JSON.

use super::check::{fmt_rate, CheckReport, LimiterCheck, Status};
use super::fmt_secs;
use super::simulate::auth_ceilings::AuthCeilingsReport;
use super::simulate::herd::{HerdReport, HerdRun};
use super::simulate::{
    fleet as fleet_consts, rollout as rollout_consts, AbuseReport, AnalystsReport,
    FailedOnlyReport, FleetReport, NatRolloutReport, RolloutReport, RotationReport, ScenarioReport,
    SimulationReport, TableFloodReport,
};
use std::fmt::Write;
use std::path::PathBuf;

/// How a report is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Table,
    Json,
}

fn source(p: &Option<PathBuf>) -> String {
    match p {
        Some(p) => p.display().to_string(),
        None => "built-in calibration".to_owned(),
    }
}

/// JSON, pretty-printed, with a trailing newline.
pub fn json<T: serde::Serialize>(report: &T) -> String {
    match serde_json::to_string_pretty(report) {
        Ok(s) => s + "\n",
        Err(e) => format!("{{\"error\": \"{e}\"}}\n"),
    }
}

fn pad(s: &str, w: usize) -> String {
    format!("{s:<w$}")
}

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
        super::traffic::DEVICE_POLL_SECONDS
    );
    let d = &r.dashboards;
    let _ = writeln!(
        o,
        "Dashboards: {} requests per poll ({} widgets and the notification bell), {} per analyst;",
        d.requests_per_poll,
        super::traffic::DASHBOARD_WIDGETS_PER_PAGE,
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

/// The limiters table's column widths.
const COLS: [usize; 11] = [16, 24, 11, 10, 9, 5, 7, 42, 9, 10, 6];

/// The limiters table's header.
const HEAD: [&str; 11] = [
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
fn table_row(cells: [&str; 11]) -> String {
    let mut line = String::new();
    for (c, w) in cells.iter().zip(COLS) {
        line.push_str(&pad(c, w));
        line.push(' ');
    }
    line.trim_end().to_owned() + "\n"
}

/// One limiter's rows: its own cells on the first, then one row per load it must carry.
fn limiter_rows(l: &LimiterCheck) -> String {
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

/// Each limiter's reasons, tagged with how serious each is.
fn findings_lines(o: &mut String, r: &CheckReport) {
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
fn fixes_lines(o: &mut String, r: &CheckReport) {
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
fn rls_lines(o: &mut String, r: &CheckReport) {
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
fn verdict_lines(o: &mut String, r: &CheckReport) {
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

/// A table row: the limiter's own cells, then one load's.
fn cells<'a>(lead: [&'a str; 7], tail: [&'a str; 4]) -> [&'a str; 11] {
    [
        lead[0], lead[1], lead[2], lead[3], lead[4], lead[5], lead[6], tail[0], tail[1], tail[2],
        tail[3],
    ]
}

/// `failed_statuses` when it is not set: 400 and above.
const DEFAULT_FAILED: &str = "400-999";

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

fn fmt_headroom(h: f64) -> String {
    if h >= 0.1 {
        format!("{h:.1}x")
    } else {
        format!("{h:.3}x")
    }
}

fn pct(part: u64, whole: u64) -> String {
    if whole == 0 {
        "0%".to_owned()
    } else {
        format!("{:.1}%", part as f64 * 100.0 / whole as f64)
    }
}

/// The simulation as a table: one block per scenario.
pub fn simulate_table(r: &SimulationReport) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "Simulation: {}, seed {}", source(&r.config), r.seed);
    let _ = writeln!(
        o,
        "Virtual time through the real policy, keys and memory store; clients honour Retry-After with jitter unless noted."
    );
    for s in &r.scenarios {
        let _ = writeln!(o);
        match s {
            ScenarioReport::Fleet(f) => fleet_block(&mut o, f),
            ScenarioReport::NatRollout(nr) => nat_rollout_block(&mut o, nr),
            ScenarioReport::Rollout(ro) => rollout_block(&mut o, ro),
            ScenarioReport::Analysts(a) => analysts_block(&mut o, a),
            ScenarioReport::AuthCeilings(a) => auth_ceilings_block(&mut o, a),
            ScenarioReport::FailedOnly(f) => failed_only_block(&mut o, f),
            ScenarioReport::Abuse(a) => abuse_block(&mut o, a),
            ScenarioReport::TableFlood(r) => table_flood_block(&mut o, r),
            ScenarioReport::Rotation(r) => rotation_block(&mut o, r),
            ScenarioReport::Herd(h) => herd_block(&mut o, h),
        }
    }
    o
}

/// The `fleet` scenario's block of the table.
fn fleet_block(o: &mut String, f: &FleetReport) {
    let (lo, hi) = fleet_consts::RESULTS_PER_TASK;
    let _ = writeln!(
        o,
        "fleet     {} agents behind one NAT for {}; {} fleet-wide tasks, {lo}-{hi} results per agent each",
        f.agents,
        fmt_secs(f.duration_seconds as f64),
        fleet_consts::TASK_WAVES_SECONDS.len()
    );
    let _ = writeln!(
        o,
        "          requests {}  refused {} ({})",
        f.requests,
        f.refused,
        pct(f.refused, f.requests)
    );
    let _ = writeln!(
        o,
        "          agents marked offline {}  (offline episodes {}, longest heartbeat gap {})",
        f.agents_marked_offline,
        f.offline_episodes,
        fmt_secs(f.longest_heartbeat_gap_seconds)
    );
    let _ = writeln!(
        o,
        "          heartbeats {} (refused {})  results posted {} (refused {}, still queued {})",
        f.heartbeats,
        f.heartbeats_refused,
        f.results_posted,
        f.result_posts_refused,
        f.results_backlog
    );
}

/// The `nat-rollout` scenario's block of the table.
fn nat_rollout_block(o: &mut String, nr: &NatRolloutReport) {
    let _ = writeln!(
        o,
        "nat-rollout {} endpoints downloading and enrolling through one NAT, starting within 5m",
        nr.endpoints
    );
    for (label, ro) in [
        ("on the configured budget", &nr.default_budget),
        ("with an override for the NAT", &nr.with_override),
    ] {
        let done = match ro.last_enrolled_after_seconds {
            Some(s) => format!("all enrolled after {}", fmt_secs(s)),
            None => format!(
                "{} of {} enrolled when the run gave up after {}",
                ro.enrolled,
                ro.endpoints,
                fmt_secs(rollout_consts::CAP_SECONDS as f64)
            ),
        };
        let _ = writeln!(
            o,
            "          {label}: {done}  (requests {}, refused {})",
            ro.requests, ro.refused
        );
    }
    for line in &nr.overrides {
        let _ = writeln!(o, "          override: {line}");
    }
}

/// The `rollout` scenario's block of the table.
fn rollout_block(o: &mut String, ro: &RolloutReport) {
    let _ = writeln!(
        o,
        "rollout   {} endpoints downloading and enrolling through one NAT, starting within 5m",
        ro.endpoints
    );
    let _ = writeln!(
        o,
        "          requests {}  refused {} ({})",
        ro.requests,
        ro.refused,
        pct(ro.refused, ro.requests)
    );
    match ro.last_enrolled_after_seconds {
        Some(s) => {
            let _ = writeln!(
                o,
                "          last enrolled after {}  (all {} enrolled)",
                fmt_secs(s),
                ro.endpoints
            );
        }
        None => {
            let _ = writeln!(
                o,
                "          {} of {} enrolled when the run gave up after {}",
                ro.enrolled,
                ro.endpoints,
                fmt_secs(rollout_consts::CAP_SECONDS as f64)
            );
        }
    }
}

/// The `analysts` scenario's block of the table.
fn analysts_block(o: &mut String, a: &AnalystsReport) {
    let _ = writeln!(
        o,
        "analysts  {} dashboards behind one NAT, each sending {} requests every {}s ({}) for {}, ignoring Retry-After",
        a.analysts,
        a.requests_per_poll,
        a.poll_seconds,
        fmt_rate(super::traffic::dashboard_per_minute(a.poll_seconds)),
        fmt_secs(a.duration_seconds as f64)
    );
    let _ = writeln!(
        o,
        "          verified tokens*:   requests {}  refused {} ({})  max refused per analyst {}",
        a.requests,
        a.refused,
        pct(a.refused, a.requests),
        a.max_refused_per_analyst
    );
    let w = &a.without_verified_tokens;
    let after =
        "          * verified by a simulator verifier that accepts the tokens the scenario issues";
    let _ = writeln!(
        o,
        "          no verified tokens: requests {}  refused {} ({})  max refused per analyst {}",
        w.requests,
        w.refused,
        pct(w.refused, w.requests),
        w.max_refused_per_analyst
    );
    let _ = writeln!(o, "{after}");
}

/// The `auth-ceilings` scenario's block of the table.
fn auth_ceilings_block(o: &mut String, a: &AuthCeilingsReport) {
    let _ = writeln!(
        o,
        "auth-ceilings  {} clients for {}, ignoring Retry-After",
        a.clients.len(),
        fmt_secs(a.duration_seconds as f64)
    );
    for c in &a.clients {
        let _ = writeln!(
            o,
            "          {} {} every {}s from {} address(es), answered {}  admitted {}  refused {} of {}  longest refused {}",
            pad(c.name, 16),
            pad(&c.route, 26),
            c.every_seconds,
            c.addresses,
            c.status,
            c.admitted,
            c.refused,
            c.requests,
            fmt_secs(c.longest_refused_seconds as f64)
        );
    }
}

/// The `failed-only` scenario's block of the table.
fn failed_only_block(o: &mut String, f: &FailedOnlyReport) {
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
fn abuse_block(o: &mut String, a: &AbuseReport) {
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
fn table_flood_block(o: &mut String, r: &TableFloodReport) {
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
fn rotation_block(o: &mut String, r: &RotationReport) {
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

/// The `herd` scenario's block of the table: one row per run.
fn herd_block(o: &mut String, h: &HerdReport) {
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
