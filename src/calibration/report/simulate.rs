//! The `simulate` report as a table: its heading, one block per scenario, and the blocks of
//! `fleet`, `nat-rollout`, `rollout`, `analysts` and `auth-ceilings`.

use super::format::{pad, source};
use super::guards::{abuse_block, failed_only_block, rotation_block, table_flood_block};
use super::herd::herd_block;
use crate::calibration::check::fmt_rate;
use crate::calibration::fmt_secs;
use crate::calibration::simulate::auth_ceilings::AuthCeilingsReport;
use crate::calibration::simulate::{
    fleet as fleet_consts, rollout as rollout_consts, AnalystsReport, FleetReport,
    NatRolloutReport, RolloutReport, ScenarioReport, SimulationReport,
};
use std::fmt::Write;

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
        fmt_rate(crate::calibration::traffic::dashboard_per_minute(a.poll_seconds)),
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
