//! `--plot FILE.svg`: what the simulation's headline figures are about, over virtual time.
//!
//! - `fleet`: how long each agent has gone without an admitted heartbeat, against the
//!   `heartbeat_timeout_seconds` line; how many agents are offline; the requests admitted and
//!   refused.
//! - `rollout`: endpoints enrolled; the requests admitted and refused.
//! - `analysts`: the run with verified tokens and the run without, side by side on the same
//!   30-minute axis and the same y-scale.
//! - `abuse`: each client's admitted requests per minute, against what it sent.
//!
//! Where a figure is meant to be compared between calibrations its y-scale is fixed by the fleet
//! settings, not by the data: heartbeat age (log scale, 10 s to the run's length), agents
//! offline and endpoints enrolled (0 to the site's endpoints), admitted per minute (0 to what the
//! clients send). Request counts are scaled to their data.
//!
//! Every drawn series carries its numbers: `data-series`, `data-bin-seconds` and `data-values`
//! (one value per bin), so the figure can be checked without reading pixels.

use super::fmt_secs;
use super::simulate::{
    abuse::Attacker, failed_only::FailedOnlyReport, AbuseReport, AnalystsReport, FleetReport,
    RolloutReport, RotationReport, ScenarioReport, SimulationReport, TableFloodReport,
};
use std::fmt::Write;

mod herd;
mod kit;
mod replay;
use kit::*;
pub(crate) use replay::replay_svg;

/// The SVG document for a simulation report.
pub fn svg(r: &SimulationReport) -> String {
    let mut body = String::new();
    let mut y = 64.0;
    for s in &r.scenarios {
        y = match s {
            ScenarioReport::Fleet(f) => fleet(&mut body, f, y),
            ScenarioReport::Rollout(ro) => rollout(&mut body, ro, y),
            ScenarioReport::NatRollout(nr) => {
                let y = rollout(&mut body, &nr.default_budget, y);
                rollout(&mut body, &nr.with_override, y)
            }
            ScenarioReport::Analysts(a) => analysts(&mut body, a, y),
            ScenarioReport::Abuse(a) => abuse(&mut body, a, y),
            ScenarioReport::Rotation(r) => rotation(&mut body, r, y),
            ScenarioReport::TableFlood(r) => table_flood(&mut body, r, y),
            ScenarioReport::FailedOnly(f) => failed_only(&mut body, f, y),
            ScenarioReport::AuthCeilings(a) => auth_ceilings(&mut body, a, y),
            ScenarioReport::Herd(h) => herd::herd(&mut body, h, y),
        };
    }
    let height = y.ceil();
    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(o, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let title = match &r.config {
        Some(p) => p.display().to_string(),
        None => "built-in calibration".to_owned(),
    };
    let avail = WIDTH - LEFT - RIGHT;
    let heading = format!("fleet-limiter simulate: {title}, seed {}", r.seed);
    let _ = writeln!(
        o,
        r#"<text x="{LEFT}" y="24" font-weight="bold"{}>{}</text>"#,
        fit(&heading, 16.0, true, avail),
        escape(&heading),
    );
    let note = "Virtual time. Heartbeat age, agents offline, endpoints enrolled and admitted per minute keep the same scales for every calibration.";
    let _ = writeln!(
        o,
        r##"<text x="{LEFT}" y="44" fill="{GREY}"{}>{note}</text>"##,
        fit(note, 12.0, false, avail)
    );
    o.push_str(&body);
    o.push_str("</svg>\n");
    o
}

/// The fleet scenario's three panels: heartbeat age, agents offline, requests.
fn fleet(o: &mut String, f: &FleetReport, y: f64) -> f64 {
    let a = &f.heartbeat_ages;
    let k = merge_factor(a.bin_seconds.get(), a.worst.len());
    let bin = a.bin_seconds.get() * k as u64;
    let worst = max_f(&a.worst, k);
    let total = (worst.len() as u64 * bin) as f64;
    let bins = FleetBins { k, bin, total };
    let y = heartbeat_age_panel(o, f, &bins, &worst, y);
    let y = offline_panel(o, f, &bins, y);
    fleet_requests_panel(o, f, total, y)
}

/// The fleet's heartbeat series merged to fit the page: the factor, the merged bin's seconds
/// and the time drawn.
struct FleetBins {
    k: usize,
    bin: u64,
    total: f64,
}

/// Heartbeat age of the worst and the median agent, log scale from 10 s to the run's length
/// (or past the timeout), the offline band shaded; returns the next `y`.
fn heartbeat_age_panel(
    o: &mut String,
    f: &FleetReport,
    b: &FleetBins,
    worst: &[f64],
    y: f64,
) -> f64 {
    let a = &f.heartbeat_ages;
    let duration = f.duration_seconds as f64;
    let timeout = a.timeout_seconds as f64;
    let median = max_f(&a.median, b.k);
    let n = f.agents;
    let hi = [1800.0, 3600.0, 7200.0, 21_600.0, 86_400.0]
        .into_iter()
        .find(|h| *h >= duration.max(timeout * 2.0))
        .unwrap_or(duration.max(timeout * 2.0));
    let (fr, y) = full_frame(y, TALL, b.total, Scale::LogSeconds { lo: 10.0, hi });
    let _ = writeln!(o, r#"<g data-panel="fleet-heartbeat-age">"#);
    let shade_top = fr.top;
    let shade_h = fr.py(timeout) - fr.top;
    if shade_h > 0.0 {
        let _ = writeln!(
            o,
            r##"<rect x="{:.1}" y="{shade_top:.1}" width="{:.1}" height="{shade_h:.1}" fill="#fde8e8"/>"##,
            fr.x, fr.w
        );
    }
    fr.draw(
        o,
        &format!(
            "fleet: time since each agent's last admitted heartbeat ({} agents)",
            n
        ),
        &format!(
            "{} of {} agents marked offline; longest heartbeat gap {}. The shaded band is offline.",
            f.agents_marked_offline,
            n,
            fmt_secs(f.longest_heartbeat_gap_seconds),
        ),
        "time without a heartbeat (log scale)",
        &[
            ("worst agent", BLUE, false),
            ("median agent", LIGHT_BLUE, true),
        ],
    );
    fr.hline(
        o,
        timeout,
        RED,
        &format!(
            "offline after {} without a heartbeat (heartbeat_timeout_seconds)",
            fmt_secs(timeout)
        ),
        &format!(r#" data-threshold-seconds="{}""#, a.timeout_seconds),
    );
    fr.series(
        o,
        "heartbeat-age-median",
        None,
        b.bin,
        &median,
        LIGHT_BLUE,
        false,
    );
    fr.series(o, "heartbeat-age-worst", None, b.bin, worst, BLUE, false);
    let _ = writeln!(o, "</g>");
    y
}

/// Agents offline, 0 to the whole site, said in words when none ever was; returns the next `y`.
fn offline_panel(o: &mut String, f: &FleetReport, b: &FleetBins, y: f64) -> f64 {
    let a = &f.heartbeat_ages;
    let offline = max_u(&a.offline, b.k);
    let n = f.agents;
    let most_offline = a.offline.iter().copied().max().unwrap_or(0);
    let (fr, y) = full_frame(y, SHORT, b.total, Scale::fixed(n as f64));
    let _ = writeln!(o, r#"<g data-panel="fleet-offline">"#);
    fr.draw(
        o,
        "fleet: agents offline (no admitted heartbeat for the timeout)",
        &format!(
            "At most {most_offline} of {n} offline at once; {} offline episodes in the run.",
            f.offline_episodes
        ),
        "agents offline",
        &[(&format!("agents offline (of {n})"), DARK_RED, false)],
    );
    if most_offline == 0 {
        // A line on the frame's edge is easy to miss: say it.
        let _ = writeln!(
            o,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="14" fill="{DARK_RED}">no agent offline at any time</text>"#,
            fr.x + fr.w / 2.0,
            fr.top + fr.h - 12.0
        );
    }
    fr.series(
        o,
        "agents-offline",
        None,
        b.bin,
        &floats(&offline),
        DARK_RED,
        false,
    );
    let _ = writeln!(o, "</g>");
    y
}

/// The agents' requests admitted and refused, and the heartbeats refused; returns the next `y`.
fn fleet_requests_panel(o: &mut String, f: &FleetReport, total: f64, y: f64) -> f64 {
    let (rbin, admitted, refused) = counts(&f.series);
    let (_, _, hb_refused) = counts(&f.heartbeat_series);
    let top = admitted.iter().chain(&refused).copied().max().unwrap_or(0) as f64;
    let (fr, y) = full_frame(y, SHORT, total, Scale::fit(top));
    let _ = writeln!(o, r#"<g data-panel="fleet-requests">"#);
    fr.draw(
        o,
        &format!("fleet: agent requests per {}", fmt_secs(rbin as f64)),
        &format!(
            "Refused requests wait for Retry-After and retry. {} of {} heartbeats refused; {} results posted, {} still queued at the end.",
            f.heartbeats_refused, f.heartbeats, f.results_posted, f.results_backlog
        ),
        &format!("requests per {}", fmt_secs(rbin as f64)),
        &[
            ("admitted", GREEN, false),
            ("refused", RED, false),
            ("heartbeats refused", DARK_RED, true),
        ],
    );
    fr.series(
        o,
        "fleet-admitted",
        None,
        rbin,
        &floats(&admitted),
        GREEN,
        false,
    );
    fr.series(
        o,
        "fleet-refused",
        None,
        rbin,
        &floats(&refused),
        RED,
        false,
    );
    fr.series(
        o,
        "fleet-heartbeats-refused",
        None,
        rbin,
        &floats(&hb_refused),
        DARK_RED,
        true,
    );
    let _ = writeln!(o, "</g>");
    y
}

fn rollout(o: &mut String, r: &RolloutReport, y: f64) -> f64 {
    let (bin, admitted, refused) = counts(&r.series);
    let k = (bin / r.series.bin_seconds.get()) as usize;
    let enrolled = last_u(&r.enrolled_by_bin, k.max(1));
    let total = (admitted.len().max(enrolled.len()) as u64 * bin) as f64;
    let n = r.endpoints;
    let (fr, y) = full_frame(y, SHORT, total, Scale::fixed(n as f64));
    let _ = writeln!(o, r#"<g data-panel="rollout-enrolled">"#);
    let headline = match r.last_enrolled_after_seconds {
        Some(s) => format!(
            "All {n} endpoints enrolled; the last after {}.",
            fmt_secs(s)
        ),
        None => format!(
            "{} of {n} endpoints enrolled when the run gave up.",
            r.enrolled
        ),
    };
    fr.draw(
        o,
        &format!("rollout: endpoints enrolled ({n} installers behind one NAT)"),
        &headline,
        "endpoints enrolled",
        &[(&format!("enrolled (of {n})"), BLUE, false)],
    );
    fr.series(
        o,
        "rollout-enrolled",
        None,
        bin,
        &floats(&enrolled),
        BLUE,
        false,
    );
    let _ = writeln!(o, "</g>");

    let top = admitted.iter().chain(&refused).copied().max().unwrap_or(0) as f64;
    let (fr, y) = full_frame(y, SHORT, total, Scale::fit(top));
    let _ = writeln!(o, r#"<g data-panel="rollout-requests">"#);
    fr.draw(
        o,
        &format!("rollout: requests per {}", fmt_secs(bin as f64)),
        &format!(
            "Downloads and enrollments: {} requests, {} refused.",
            r.requests, r.refused
        ),
        &format!("requests per {}", fmt_secs(bin as f64)),
        &[("admitted", GREEN, false), ("refused", RED, false)],
    );
    fr.series(
        o,
        "rollout-admitted",
        None,
        bin,
        &floats(&admitted),
        GREEN,
        false,
    );
    fr.series(
        o,
        "rollout-refused",
        None,
        bin,
        &floats(&refused),
        RED,
        false,
    );
    let _ = writeln!(o, "</g>");
    y
}

fn analysts(o: &mut String, a: &AnalystsReport, y: f64) -> f64 {
    let runs = [
        (
            "analysts-verified",
            "analysts, verified tokens (a budget per analyst)",
            &a.series,
            a.max_refused_per_analyst,
        ),
        (
            "analysts-unverified",
            "analysts, no verified tokens (one budget: the NAT's IP)",
            &a.series_without_verified_tokens,
            a.without_verified_tokens.max_refused_per_analyst,
        ),
    ];
    let merged: Vec<(u64, Vec<u64>, Vec<u64>)> = runs.iter().map(|r| counts(r.2)).collect();
    // Both runs share one y-scale, so their heights compare.
    let top = merged
        .iter()
        .flat_map(|(_, ad, re)| ad.iter().chain(re))
        .copied()
        .max()
        .unwrap_or(0) as f64;
    let scale = Scale::fit(top);
    let gap = 84.0;
    let w = (WIDTH - LEFT - RIGHT - gap) / 2.0;
    for (i, ((name, title, _, max_refused), (bin, admitted, refused))) in
        runs.iter().zip(&merged).enumerate()
    {
        let fr = Frame {
            x: LEFT + i as f64 * (w + gap),
            top: y + HEADER + 18.0,
            w,
            h: SHORT,
            total: (admitted.len() as u64 * bin) as f64,
            scale,
            time_label: "virtual time since the start of the run",
        };
        let _ = writeln!(o, r#"<g data-panel="{name}">"#);
        fr.draw(
            o,
            title,
            &format!("Max refused per analyst: {max_refused}."),
            &format!("polls per {}", fmt_secs(*bin as f64)),
            &[],
        );
        fr.series(
            o,
            &format!("{name}-admitted"),
            None,
            *bin,
            &floats(admitted),
            GREEN,
            false,
        );
        fr.series(
            o,
            &format!("{name}-refused"),
            None,
            *bin,
            &floats(refused),
            RED,
            false,
        );
        let _ = writeln!(o, "</g>");
    }
    let note = format!(
        "{} dashboards sending {} requests every {}s for {}, in two separate runs, each on its own axis from 0. Green admitted, red refused.",
        a.analysts,
        a.requests_per_poll,
        a.poll_seconds,
        fmt_secs(a.duration_seconds as f64)
    );
    let _ = writeln!(
        o,
        r##"<text x="{LEFT}" y="{:.1}" fill="{GREY}"{}>{}</text>"##,
        y + 18.0,
        fit(&note, 12.0, false, WIDTH - LEFT - RIGHT),
        escape(&note)
    );
    y + HEADER + 18.0 + SHORT + FOOTER
}

fn abuse(o: &mut String, a: &AbuseReport, y: f64) -> f64 {
    clients(
        o,
        ClientsPanel {
            panel: "abuse",
            title: "abuse: requests admitted per minute, per client",
            subtitle: format!(
                "{} clients on their own addresses, {}/s each, ignoring Retry-After.",
                a.attackers.len(),
                a.rate_per_second,
            ),
            sent: (a.rate_per_second * 60) as f64,
            sent_label: "per client".to_owned(),
        },
        &a.attackers,
        y,
    )
}

fn rotation(o: &mut String, r: &RotationReport, y: f64) -> f64 {
    clients(
        o,
        ClientsPanel {
            panel: "rotation",
            title: "rotation: the site's heartbeats and a rotating client at its NAT, admitted per minute",
            subtitle: format!(
                "{} agents; from {} one host sends {}/s with a fresh agent id each.",
                r.agents,
                fmt_secs(r.flood_starts_seconds as f64),
                r.flood_rate_per_second
            ),
            sent: (r.flood_rate_per_second * 60) as f64,
            sent_label: "by the rotating client".to_owned(),
        },
        &r.clients,
        y,
    )
}

fn table_flood(o: &mut String, r: &TableFloodReport, y: f64) -> f64 {
    let agents = r.sites.first().map_or(0, |s| s.agents);
    clients(
        o,
        ClientsPanel {
            panel: "table-flood",
            title: "table-flood: each site's heartbeats admitted per minute while others fill the known-agents table",
            subtitle: format!(
                "{agents} agents per site; from {} {} /56s mint {} ids each, then {}/s; from {} {} more /56s at their ceiling's rate.",
                fmt_secs(r.fill_starts_seconds as f64),
                r.fill_addresses,
                r.fill_ids_each,
                r.keep_full_per_second,
                fmt_secs(r.sustained_starts_seconds as f64),
                r.sustained_addresses
            ),
            sent: r.site_heartbeats_per_minute,
            sent_label: "by one site".to_owned(),
        },
        &r.clients,
        y,
    )
}

fn failed_only(o: &mut String, f: &FailedOnlyReport, y: f64) -> f64 {
    let busiest = f.clients.iter().max_by_key(|c| c.rate_per_second);
    let budget = match (f.api_key_count, f.api_key_budget) {
        (Some(count), Some(b)) => format!("api-key counts {count}, budget {b} over the run."),
        _ => "no api-key limiter.".to_owned(),
    };
    let rates: Vec<String> = f
        .clients
        .iter()
        .map(|c| format!("{} {}/s answered {}", c.name, c.rate_per_second, c.status))
        .collect();
    clients(
        o,
        ClientsPanel {
            panel: "failed-only",
            title: "failed-only: requests admitted per minute, per API client",
            subtitle: format!("{}; {budget}", rates.join(", ")),
            sent: busiest.map_or(0.0, |c| (c.rate_per_second * 60) as f64),
            sent_label: busiest.map_or(String::new(), |c| format!("by {}", c.name)),
        },
        &f.plot_clients,
        y,
    )
}

fn auth_ceilings(
    o: &mut String,
    a: &crate::calibration::simulate::auth_ceilings::AuthCeilingsReport,
    y: f64,
) -> f64 {
    let busiest = a.clients.iter().min_by_key(|c| c.every_seconds);
    let rates: Vec<String> = a
        .clients
        .iter()
        .map(|c| {
            format!(
                "{} every {}s from {} address(es)",
                c.name, c.every_seconds, c.addresses
            )
        })
        .collect();
    clients(
        o,
        ClientsPanel {
            panel: "auth-ceilings",
            title: "auth-ceilings: requests admitted per minute, per client",
            subtitle: rates.join(", "),
            sent: busiest.map_or(0.0, |c| 60.0 / c.every_seconds.max(1) as f64),
            sent_label: busiest.map_or(String::new(), |c| format!("by {}", c.name)),
        },
        &a.plot_clients,
        y,
    )
}

/// A panel of clients' admitted requests per minute against what the busiest one sends.
struct ClientsPanel {
    panel: &'static str,
    title: &'static str,
    subtitle: String,
    sent: f64,
    sent_label: String,
}

fn clients(o: &mut String, p: ClientsPanel, attackers: &[Attacker], y: f64) -> f64 {
    let sent = p.sent;
    let mut lines = Vec::new();
    for at in attackers {
        let (bin, admitted, _) = counts(&at.series);
        let per_minute: Vec<f64> = admitted
            .iter()
            .map(|&c| c as f64 * 60.0 / bin as f64)
            .collect();
        lines.push((at, bin, per_minute));
    }
    let bin = lines.first().map_or(10, |l| l.1);
    let points = lines.iter().map(|l| l.2.len()).max().unwrap_or(1);
    let total = (points as u64 * bin) as f64;
    // Fixed by what each client sends, so every calibration's figure reads the same; a little
    // above it, so a client admitted in full shows above the reference line's label.
    let (fr, y) = full_frame(y, TALL, total, Scale::fit(sent * 1.1));
    let legend: Vec<(String, &str, Option<&str>)> = lines
        .iter()
        .enumerate()
        .map(|(i, (at, _, _))| {
            (
                format!(
                    "{}: {}/min admitted",
                    at.name,
                    fmt_num(at.admitted_per_minute)
                ),
                CLIENT_COLOURS[i % CLIENT_COLOURS.len()],
                CLIENT_DASHES[i % CLIENT_DASHES.len()],
            )
        })
        .collect();
    let _ = writeln!(o, r#"<g data-panel="{}">"#, p.panel);
    fr.draw(
        o,
        p.title,
        &format!("{} Averaged per {}.", p.subtitle, fmt_secs(bin as f64)),
        "admitted per minute",
        &[],
    );
    fr.hline(
        o,
        sent,
        GREY,
        &format!("sent: {}/min {}", fmt_num(sent), p.sent_label),
        "",
    );
    for (i, (at, bin, per_minute)) in lines.iter().enumerate() {
        let colour = CLIENT_COLOURS[i % CLIENT_COLOURS.len()];
        fr.series_dashed(
            o,
            "admitted-per-minute",
            Some(at.name),
            *bin,
            per_minute,
            colour,
            CLIENT_DASHES[i % CLIENT_DASHES.len()],
        );
    }
    // The legend sits under the time axis, one client per entry, on as many lines as it needs.
    let mut x = fr.x;
    let mut ly = fr.top + fr.h + 52.0;
    for (label, colour, dash) in &legend {
        let entry = 28.0 + text_width(label, 12.0, false);
        if x > fr.x && x + entry > fr.x + fr.w {
            x = fr.x;
            ly += LEGEND_LINE;
        }
        let dash = dash
            .map(|d| format!(r#" stroke-dasharray="{d}""#))
            .unwrap_or_default();
        let _ = writeln!(
            o,
            r#"<line x1="{x:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="{colour}" stroke-width="3"{dash}/>"#,
            ly - 4.0,
            x + 22.0,
            ly - 4.0
        );
        let _ = writeln!(
            o,
            r#"<text x="{:.1}" y="{ly:.1}"{}>{}</text>"#,
            x + 28.0,
            fit(label, 12.0, false, fr.x + fr.w - x - 28.0),
            escape(label)
        );
        x += entry + 24.0;
    }
    let _ = writeln!(o, "</g>");
    y + 24.0 + (ly - (fr.top + fr.h + 52.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calibration::simulate::{abuse::Attacker, Series};
    use std::collections::BTreeMap;

    fn attacker(name: &'static str, admitted: u64) -> Attacker {
        Attacker {
            name,
            route: "GET /api/tasks".into(),
            requests: 1000 * 20,
            refused: 1000 * (20 - admitted),
            admitted_per_minute: admitted as f64 * 6.0,
            series: Series {
                bin_seconds: crate::calibration::simulate::BIN_SECONDS,
                admitted: vec![admitted; 1000],
                refused: vec![20 - admitted; 1000],
            },
        }
    }

    #[test]
    fn abuse_draws_a_rate_per_client_in_round_bins() {
        let r = SimulationReport {
            config: None,
            seed: 1,
            scenarios: vec![ScenarioReport::Abuse(AbuseReport {
                scenario: "abuse",
                duration_seconds: 10_000,
                rate_per_second: 2,
                requests: 60_000,
                refused: 0,
                admitted_per_minute: BTreeMap::new(),
                attackers: vec![attacker("rotator", 20), attacker("spray", 1)],
                series: Series {
                    bin_seconds: crate::calibration::simulate::BIN_SECONDS,
                    admitted: vec![21; 1000],
                    refused: vec![19; 1000],
                },
            })],
        };
        let s = svg(&r);
        assert!(s.starts_with("<svg"));
        assert_eq!(s.matches(r#"data-series="admitted-per-minute""#).count(), 2);
        // 1000 bins of 10 s: 30 s bins would still be 334, so they merge to 1 minute.
        assert_eq!(s.matches(r#"data-bin-seconds="60""#).count(), 2);
        assert!(s.contains(r#"data-client="rotator" data-bin-seconds="60" data-values="120 120"#));
        assert!(s.contains(r#"data-client="spray" data-bin-seconds="60" data-values="6 6"#));
        assert!(s.contains("sent: 120/min per client"));
    }

    #[test]
    fn bins_merge_to_round_widths() {
        assert_eq!(merge_factor(10, 180), 1);
        assert_eq!(merge_factor(10, 241), 3);
        assert_eq!(merge_factor(10, 1000), 6);
        // Twelve hours of 10 s bins: 5 minutes, not 3m10s.
        assert_eq!(merge_factor(10, 4440), 30);
        for n in [1, 100, 240, 500, 4440, 17_280] {
            let w = 10 * merge_factor(10, n) as u64;
            assert!(ROUND_BINS.contains(&w), "{n} bins: {w} s");
        }
    }

    #[test]
    fn scales_label_round_values() {
        let Scale::Linear { max, step } = Scale::fit(2484.0) else {
            unreachable!()
        };
        assert_eq!((max, step), (3000.0, 1000.0));
        let ticks = Scale::fixed(250.0).ticks();
        assert_eq!(ticks.first().map(|t| t.0), Some(0.0));
        assert_eq!(ticks.last().map(|t| t.0), Some(250.0));
        let log = Scale::LogSeconds {
            lo: 10.0,
            hi: 1800.0,
        }
        .ticks();
        let labels: Vec<&str> = log.iter().map(|t| t.1.as_str()).collect();
        assert_eq!(labels, ["10s", "30s", "1m", "2m", "5m", "10m", "30m"]);
    }
}
